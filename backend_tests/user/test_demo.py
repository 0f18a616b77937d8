"""`make demo`: examples/identify_files.py, magika's content-type model run by onnx_mini.

The input building and magika's rules are checked on hand-made bytes with every value written out;
the end-to-end tests fetch the pinned magika wheel with pip (cached in .venv/demo-cache, as the demo
does) and skip when the package registry cannot be reached."""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

import numpy as np
import pytest

import onnx_mini

from helpers import REPO

_spec = importlib.util.spec_from_file_location("identify_files", REPO / "examples" / "identify_files.py")
demo = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = demo            # dataclasses look their module up while the class is built
_spec.loader.exec_module(demo)

# magika 1.0.3's numbers (config.min.json of standard_v3_3)
CONFIG = {"beg_size": 1024, "end_size": 1024, "mid_size": 0, "use_inputs_at_offsets": False, "block_size": 4096,
          "padding_token": 256, "min_file_size_for_dl": 8}
PAD = 256


def row_of(data: bytes) -> np.ndarray:
    return demo.features(*demo.blocks(data, CONFIG["block_size"]), CONFIG)


# -- the model input, by hand -------------------------------------------------------------------------------

def test_short_file_is_stripped_and_padded_on_the_outer_sides():
    row = row_of(b" \t\nab c\r\n ")
    assert row.dtype == np.int32 and row.shape == (2048,)
    # beginning: leading whitespace gone, the rest (with its trailing whitespace) then padding after it
    assert row[:7].tolist() == [ord("a"), ord("b"), ord(" "), ord("c"), ord("\r"), ord("\n"), ord(" ")]
    assert (row[7:1024] == PAD).all()
    # end: trailing whitespace gone, padding before what is left (leading whitespace kept)
    assert row[-7:].tolist() == [ord(" "), ord("\t"), ord("\n"), ord("a"), ord("b"), ord(" "), ord("c")]
    assert (row[1024:2048 - 7] == PAD).all()


def test_empty_file():
    assert (row_of(b"") == PAD).all()
    assert demo.label_without_model(0, b"", CONFIG) == "empty"


def test_long_file_takes_1024_bytes_from_each_end_of_its_first_and_last_blocks():
    data = b"\n\t " + b"A" * 3000 + b"M" * 5000 + b"Z" * 3000 + b" \r\n"
    row = row_of(data)
    assert (row[:1024] == ord("A")).all() and (row[1024:] == ord("Z")).all()     # the middle is never read
    # every byte value, the whitespace ones too when they are not at the ends, in order
    values = b"\x00" + bytes(range(1, 256)) * 20 + b"\xff"
    row = row_of(b"  " + values + b"\n")
    assert row[:1024].tolist() == [0] + list(range(1, 256)) * 4 + [1, 2, 3]
    assert row[1024:].tolist() == list(range(253, 256)) + list(range(1, 256)) * 4 + [255]


def test_read_blocks_matches_blocks_of_the_whole_file(tmp_path):
    data = bytes(range(256)) * 40 + b"tail"                      # 10244 bytes: three blocks of 4096
    (tmp_path / "f").write_bytes(data)
    size, head, tail = demo.read_blocks(tmp_path / "f", 4096)
    assert (size, head, tail) == (10244, data[:4096], data[-4096:])
    assert demo.read_blocks(tmp_path / "f", 20000) == (10244, data, data)


def test_stripping_is_ascii_whitespace_only():
    # \v and \f are whitespace for bytes.strip (magika uses it); NUL, \x1c-\x1f, NEL and NBSP are not
    row = row_of(b"\x0b\x0c\x1cx\x00\x85\xa0")
    assert row[:5].tolist() == [0x1C, ord("x"), 0, 0x85, 0xA0] and row[5] == PAD
    # the end keeps its leading whitespace: only trailing whitespace is stripped there
    assert row[-7:].tolist() == [0x0B, 0x0C, 0x1C, ord("x"), 0, 0x85, 0xA0] and row[-8] == PAD


def test_whitespace_is_only_stripped_within_the_first_block():
    data = b" " * 5000 + b"print('hello world')\n"
    assert (row_of(data)[:1024] == PAD).all()                 # the first 4096 bytes are all spaces
    assert demo.label_without_model(len(data), data[:4096], CONFIG) == "txt"


@pytest.mark.parametrize("data, label", [
    (b"abcdefg", "txt"),                      # 7 bytes: too short for the model, valid UTF-8
    (b"\xff\xfe\x00\x01", "unknown"),         # not UTF-8
    (("é" * 3).encode(), "txt"),
    (b"\n" * 50 + b"abcdefg", "txt"),         # 57 bytes, 7 once stripped
    (b"\n" * 50 + b"\xffbcdefg", "unknown"),
    (b"abcdefgh", None),                      # 8 bytes: the model decides
    (b"\n" * 50 + b"abcdefgh", None),
])
def test_files_too_small_for_the_model(data, label):
    assert demo.label_without_model(len(data), data[:4096], CONFIG) == label


def test_decisions_after_the_model():
    types = {"markdown": {"is_text": True, "extensions": ["md", "markdown"]},
             "png": {"is_text": False, "extensions": ["png"]}, "python": {"is_text": True, "extensions": ["py"]},
             "randombytes": {"is_text": False, "extensions": []}, "unknown": {"is_text": False, "extensions": []},
             "txt": {"is_text": True, "extensions": ["txt"]}}
    config = {"target_labels_space": ["markdown", "png", "python", "randombytes"], "thresholds": {"markdown": 0.75},
              "overwrite_map": {"randombytes": "unknown"}, "medium_confidence_threshold": 0.5}
    magika = demo.Magika(b"", config, types)
    scores = np.array([[0.8, 0.1, 0.05, 0.05],     # markdown over its own threshold 0.75
                       [0.7, 0.1, 0.1, 0.1],       # markdown under it: generic text
                       [0.1, 0.1, 0.6, 0.2],       # python over the default 0.5
                       [0.1, 0.4, 0.3, 0.2],       # png under 0.5: generic binary
                       [0.0, 0.0, 0.1, 0.9]],      # randombytes is renamed unknown
                      np.float32)
    got = [(label, model_label, round(score, 6)) for label, model_label, score in demo.decide(scores, magika)]
    assert got == [("markdown", "markdown", 0.8), ("txt", "markdown", 0.7), ("python", "python", 0.6),
                   ("unknown", "png", 0.4), ("unknown", "randombytes", 0.9)]
    assert demo.expected_labels("docs/NOTES.MD", magika) == {"markdown"}
    assert demo.expected_labels("a/Makefile", magika) == {"makefile"}       # the demo's table of names
    assert demo.expected_labels(".ci/run", magika) == set()
    assert demo.expected_labels("x.whl", magika) == {"zip"}


def test_a_changed_wheel_fails_clearly(tmp_path):
    (tmp_path / demo.WHEEL).write_bytes(b"not the pinned upload")
    with pytest.raises(demo.DemoError, match="sha256 .* not the pinned 3e9b4913"):
        demo.fetch_wheel(tmp_path)


# -- end to end, with the real model ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def magika():
    try:
        wheel = demo.fetch_wheel()
    except demo.DemoError as e:
        if (demo.CACHE / demo.WHEEL).exists():
            raise                                # there, but not the pinned one: a failure, not a skip
        pytest.skip(f"the magika wheel could not be fetched: {e}")
    return demo.load_magika(wheel)


def test_identifies_repository_files(magika, tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "short").write_bytes(b"hi!\n")
    names = ["README.md", "pyproject.toml", "Makefile", "backend_tests/helpers.py",
             "benchmarks/results/bench_suite.json", "benchmarks/results/bench_suite.png"]
    paths = [REPO / n for n in names] + [tmp_path / "empty.txt", tmp_path / "short"]
    samples = [(p.name, *demo.read_blocks(p, 4096)) for p in paths]
    samples.append(("model.onnx", len(magika.model), *demo.blocks(magika.model, 4096)))
    model = onnx_mini.prepare(magika.model)
    batches = []

    def run(batch):
        batches.append(batch.shape)
        return model.run({"bytes": batch})[0]

    got = {r.name: r for r in demo.identify(samples, magika, run)}
    assert {n: r.label for n, r in got.items()} == {
        "README.md": "markdown", "pyproject.toml": "toml", "Makefile": "makefile", "helpers.py": "python",
        "bench_suite.json": "json", "bench_suite.png": "png", "empty.txt": "empty", "short": "txt",
        "model.onnx": "onnx"}
    assert batches == [(7, 2048)]                   # one batch; the empty and short files skip the model
    assert got["empty.txt"].model_label is None and got["empty.txt"].score == 1.0
    assert got["README.md"].model_label == "markdown" and got["README.md"].score > 0.75
    assert all(r.label in r.expected for n, r in got.items() if n not in ("empty.txt", "short"))


def test_same_scores_as_onnxruntime(magika):
    ort = pytest.importorskip("onnxruntime")
    rows = np.stack([row_of((REPO / n).read_bytes()) for n in ("README.md", "Makefile", "backend_tests/helpers.py")])
    ours = onnx_mini.prepare(magika.model).run({"bytes": rows})[0]
    theirs = ort.InferenceSession(magika.model, providers=["CPUExecutionProvider"]).run(None, {"bytes": rows})[0]
    np.testing.assert_allclose(ours, theirs, atol=1e-4)
    np.testing.assert_allclose(ours.sum(axis=1), 1, rtol=1e-5)     # softmax probabilities


def test_make_demo_prints_types_and_latency(magika):
    out = subprocess.run([sys.executable, str(REPO / "examples" / "identify_files.py"), "--blocks", "1"],
                         capture_output=True, text=True, check=True, cwd=REPO, timeout=300).stdout
    assert re.search(r"^README\.md\s+markdown\s+[01]\.\d{3}\s+markdown\s+yes", out, re.M)
    assert re.search(r"^Makefile\s+makefile\s", out, re.M) and re.search(r"^\(in the wheel\) model\.onnx\s+onnx\s", out, re.M)
    assert re.search(r"onnx_mini: prepare \d+ ms, first run \d+ ms", out)
    assert re.search(r"onnx_mini\s+steady\s+\d+\.\d ms per batch", out)
    assert (re.search(r"same content type for (\d+) of \1 files", out)
            or "onnxruntime is not installed" in out)


def test_a_missing_file_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as stop:
        demo.main(["no/such/file.md"])
    assert stop.value.code == 2 and "not a readable file: no/such/file.md" in capsys.readouterr().err
