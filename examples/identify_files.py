"""Identify the files of this repository with a real pre-trained model: Google's Magika.

    python examples/identify_files.py [FILE ...]     # or: make demo (a selection of the repo's files)

Magika (https://github.com/google/magika) is a small deep-learning model (one Conv, two MatMul
layers, 3 MB) that tells a file's content type (python, json, markdown, png, ...) from its first and
last bytes. Its wheel on PyPI carries the ONNX model and its configuration: this script downloads
that wheel once with pip (a pinned version whose sha256 is checked, cached in .venv/demo-cache) and
reads the model out of it with zipfile. magika itself is not installed (it depends on onnxruntime);
the model input is built as magika 1.0.3 builds it, re-implemented here:
  - the first block (4096 bytes) with its leading whitespace stripped gives the first 1024 values,
    padded at the end with the token 256; the last block with its trailing whitespace stripped gives
    the last 1024, padded at the front: one row of 2048 int32 per file, every file in one batch;
  - an empty file is "empty"; a file shorter than 8 bytes, or with fewer than 8 left once stripped,
    is not given to the model: "txt" if it decodes as UTF-8, else "unknown";
  - the model's best label goes through the config's overwrite map, and a score below the label's
    threshold (0.5 unless the config names one) gives the generic "txt" or "unknown" instead.
It prints per file the content type, the score and whether it agrees with the file's extension, then
onnx_mini's latency, and onnxruntime's predictions and latency beside them when it is installed.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import onnx_mini

MAGIKA = "1.0.3"
PLATFORM = "manylinux_2_28_x86_64"     # the model is the same in every wheel: always fetch this one
WHEEL = f"magika-{MAGIKA}-py3-none-{PLATFORM}.whl"
WHEEL_SHA256 = "3e9b49134e8116ee40b431664dcbed9e199413efddcce1a173c734b4e0521529"
MODEL_DIR = "magika/models/standard_v3_3/"
REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".venv" / "demo-cache"
SAMPLES = ["README.md", "docs/ARCHITECTURE.md", "Makefile", "pyproject.toml", ".gitignore", ".ci/run",
           "onnx_mini/engine.py", "examples/identify_files.py", "backend_tests/expected_failures.txt",
           "benchmarks/results/bench_suite.json", "benchmarks/results/bench_suite.png"]
# What a file's name says when its extension is not in magika's table of content types.
NAMED = {"makefile": "makefile", ".gitignore": "ignorefile", ".whl": "zip"}
CALLS_PER_BLOCK = 3


class DemoError(Exception):
    """The wheel could not be fetched, or is not the one pinned."""


@dataclass(frozen=True)
class Magika:
    model: bytes              # model.onnx: int32 [N, 2048] "bytes" -> float32 [N, 214] "target_label"
    config: dict              # config.min.json: window sizes, labels, thresholds, overwrite map
    types: dict               # content_types_kb.min.json: label -> description, extensions, is_text


@dataclass(frozen=True)
class Result:
    name: str
    label: str                # what magika answers
    model_label: str | None   # the model's own best label (None: decided without the model)
    score: float
    expected: frozenset       # labels the file name suggests (empty: it suggests none)


def fetch_wheel(cache: Path = CACHE) -> Path:
    """The pinned magika wheel, downloaded by pip into `cache` the first time; its sha256 checked."""
    path = cache / WHEEL
    if not path.exists():
        print(f"downloading magika=={MAGIKA} with pip (the model's wheel, 16 MB, once) into {cache}",
              file=sys.stderr)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "--only-binary=:all:",
               "--platform", PLATFORM, f"magika=={MAGIKA}", "-d", str(cache)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode or not path.exists():
            why = (done.stderr.strip().splitlines() or ["no error message"])[-1]
            raise DemoError(f"pip could not download magika=={MAGIKA} ({why})")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != WHEEL_SHA256:
        raise DemoError(f"{path} has sha256 {digest}, not the pinned {WHEEL_SHA256}: "
                        "the upload changed or the file is damaged (delete it to download it again)")
    return path


def load_magika(wheel: Path) -> Magika:
    with zipfile.ZipFile(wheel) as z:
        magika = Magika(z.read(MODEL_DIR + "model.onnx"), json.loads(z.read(MODEL_DIR + "config.min.json")),
                        json.loads(z.read("magika/config/content_types_kb.min.json")))
    c = magika.config
    # The only input layout magika 1.0.3 builds (and so the only one written here).
    if c["mid_size"] or c["use_inputs_at_offsets"] or max(c["beg_size"], c["end_size"]) >= c["block_size"]:
        raise DemoError("this magika model wants an input layout the demo does not build")
    return magika


def blocks(data: bytes, block_size: int) -> tuple[bytes, bytes]:
    """The first and the last block of a file's bytes (both the whole file when it is shorter)."""
    return data[:block_size], data[-block_size:]


def read_blocks(path: Path, block_size: int) -> tuple[int, bytes, bytes]:
    """A file's size and its first and last block, without reading the middle."""
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        f.seek(0)
        head = f.read(block_size)
        f.seek(max(size - block_size, 0))
        return size, head, f.read(block_size)


def features(head: bytes, tail: bytes, config: dict) -> np.ndarray:
    """The model's input row: stripped beginning and end, padded to their fixed sizes."""
    beg, end, pad = config["beg_size"], config["end_size"], config["padding_token"]
    row = np.full(beg + end, pad, np.int32)
    first = head.lstrip()[:beg]           # bytes.strip: ASCII whitespace only, as magika
    last = tail.rstrip()[-end:]
    row[:len(first)] = np.frombuffer(first, np.uint8)
    row[beg + end - len(last):] = np.frombuffer(last, np.uint8)
    return row


def label_without_model(size: int, head: bytes, config: dict) -> str | None:
    """The label of a file too small for the model to say anything; None when the model decides."""
    if size == 0:
        return "empty"
    least = config["min_file_size_for_dl"]
    if size >= least and len(head.lstrip()) >= least:
        return None
    try:
        head.decode("utf-8")
        return "txt"
    except UnicodeDecodeError:
        return "unknown"


def decide(scores: np.ndarray, magika: Magika) -> list[tuple[str, str, float]]:
    """(label, the model's label, score) per row of the model's output."""
    c = magika.config
    out = []
    for row in scores:
        best = int(np.argmax(row))
        model_label, score = c["target_labels_space"][best], float(row[best])
        label = c["overwrite_map"].get(model_label, model_label)
        if score < c["thresholds"].get(model_label, c["medium_confidence_threshold"]):
            label = "txt" if magika.types[label]["is_text"] else "unknown"   # unsure: text or binary only
        out.append((label, model_label, score))
    return out


def expected_labels(name: str, magika: Magika) -> frozenset:
    base = name.rsplit("/", 1)[-1].lower()
    ext = base.rsplit(".", 1)[-1] if "." in base.lstrip(".") else ""
    found = {label for label, info in magika.types.items() if ext and ext in info["extensions"]}
    named = NAMED.get(base) or NAMED.get("." + ext)
    return frozenset(found | ({named} if named else set()))


def prepare_inputs(samples: list[tuple[str, int, bytes, bytes]], magika: Magika):
    """Per sample its label when the model is not needed, and the batch of rows for the others."""
    c = magika.config
    fixed = [label_without_model(size, head, c) for _, size, head, _ in samples]
    rows = [features(head, tail, c) for (_, _, head, tail), f in zip(samples, fixed) if f is None]
    batch = np.stack(rows) if rows else np.zeros((0, c["beg_size"] + c["end_size"]), np.int32)
    return fixed, batch


def results(samples, fixed, scores: np.ndarray, magika: Magika) -> list[Result]:
    decided = iter(decide(scores, magika))
    out = []
    for (name, *_), label in zip(samples, fixed):
        label, model_label, score = (label, None, 1.0) if label else next(decided)
        out.append(Result(name, label, model_label, score, expected_labels(name, magika)))
    return out


def identify(samples, magika: Magika, run) -> list[Result]:
    """`samples`: (name, size, first block, last block); `run`: int32 [N, 2048] -> scores [N, 214]."""
    fixed, batch = prepare_inputs(samples, magika)
    return results(samples, fixed, run(batch) if len(batch) else batch, magika)


def default_samples(wheel: Path, magika: Magika) -> list[tuple[str, int, bytes, bytes]]:
    """A selection of the repository's files, plus the model itself and the wheel it came in."""
    block = magika.config["block_size"]
    samples = [(name, *read_blocks(REPO / name, block)) for name in SAMPLES if (REPO / name).is_file()]
    samples.append(("(in the wheel) model.onnx", len(magika.model), *blocks(magika.model, block)))
    samples.append((wheel.name, *read_blocks(wheel, block)))
    return samples


def timed_blocks(runners: dict, n_blocks: int, per_block: int) -> dict:
    """Per-call median seconds of each runner: blocks of back-to-back calls, runtimes alternating,
    each block after a 0.5 s pause and one untimed call (so no runtime inherits the other's caches
    or a busy neighbour's burst more than the other)."""
    times = {name: [] for name in runners}
    for _ in range(n_blocks):
        for name, call in runners.items():
            time.sleep(0.5)
            call()
            for _ in range(per_block):
                t0 = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) for name, t in times.items()}


def show(rows: list[Result], ort_rows: list[Result] | None) -> None:
    width = max(len(r.name) for r in rows)
    head = f"{'file':<{width}}  {'content type':<13} {'score':>5}  {'model says':<12} {'by its name':<12} agrees"
    print(head + ("  onnxruntime" if ort_rows else ""))
    for i, r in enumerate(rows):
        says = "-" if r.model_label is None else r.model_label if r.model_label != r.label else ""
        ext = r.name.rsplit(".", 1)[-1]      # "txt" says txt, txtascii, txtutf8...: show the first
        named = ext if ext in r.expected else "/".join(sorted(r.expected)) or "?"
        agrees = "-" if not r.expected else "yes" if r.label in r.expected else "NO"
        line = f"{r.name:<{width}}  {r.label:<13} {r.score:5.3f}  {says:<12} {named:<12} {agrees:<6}"
        if ort_rows:
            o = ort_rows[i]
            line += f"  {o.label} {o.score:.3f}"
        print(line)
    checked = [r for r in rows if r.expected]
    print(f"{sum(r.label in r.expected for r in checked)} of {len(checked)} files whose name tells a type are "
          "identified as that type.\n'model says': the model's own label when its score is under the label's "
          "threshold\n(magika then answers txt or unknown); '-': the file is too small for the model.")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", type=Path, help="files to identify (default: a selection of the repo)")
    parser.add_argument("--cache", type=Path, default=CACHE, help="where the magika wheel is kept")
    parser.add_argument("--blocks", type=int, default=3, help="timed blocks per runtime")
    args = parser.parse_args(argv)
    if args.blocks < 1:
        parser.error("--blocks must be at least 1")
    missing = [str(p) for p in args.files if not p.is_file()]
    if missing:
        parser.error(f"not a readable file: {', '.join(missing)}")
    try:
        wheel = fetch_wheel(args.cache)
    except DemoError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    magika = load_magika(wheel)
    block = magika.config["block_size"]
    samples = ([(str(p), *read_blocks(p, block)) for p in args.files] if args.files
               else default_samples(wheel, magika))

    t0 = time.perf_counter()
    model = onnx_mini.prepare(magika.model)
    prepared = time.perf_counter() - t0
    fixed, batch = prepare_inputs(samples, magika)
    t0 = time.perf_counter()
    scores = model.run({"bytes": batch})[0]
    first = time.perf_counter() - t0
    rows = results(samples, fixed, scores, magika)

    try:
        import onnxruntime as ort
    except ImportError:
        ort = None
    runners = {"onnx_mini": lambda: model.run({"bytes": batch})}
    ort_rows = None
    if ort is not None:
        sess = ort.InferenceSession(magika.model, providers=["CPUExecutionProvider"])
        ort_scores = sess.run(None, {"bytes": batch})[0]
        ort_rows = results(samples, fixed, ort_scores, magika)
        runners["onnxruntime"] = lambda: sess.run(None, {"bytes": batch})

    print(f"magika {MAGIKA}'s content-type model ({len(magika.model) / 1e6:.1f} MB, "
          f"{len(magika.config['target_labels_space'])} labels, from {wheel.name}, sha256 checked)\n"
          f"run by onnx_mini on {len(samples)} files\n")
    show(rows, ort_rows)
    n = len(batch)
    print(f"\nlatency, the {n} files the model reads in one batch int32 {list(batch.shape)}:")
    print(f"  onnx_mini: prepare {prepared * 1e3:.0f} ms, first run {first * 1e3:.0f} ms")
    if n:
        model.settle({"bytes": batch})       # the steady state: the BLAS mode its runs keep here
        medians = timed_blocks(runners, args.blocks, CALLS_PER_BLOCK)
        for name, s in medians.items():
            print(f"  {name:<11} steady {s * 1e3:6.1f} ms per batch, {s / n * 1e3:5.1f} ms per file "
                  f"(median of {args.blocks} blocks x {CALLS_PER_BLOCK} calls)")
        if ort_rows:
            print(f"  onnx_mini / onnxruntime = {medians['onnx_mini'] / medians['onnxruntime']:.2f}x")
    if ort_rows:
        same = sum(a.label == b.label for a, b in zip(rows, ort_rows))
        diff = float(np.abs(scores - ort_scores).max()) if n else 0.0
        print(f"onnxruntime {ort.__version__}: same content type for {same} of {len(rows)} files; "
              f"max |score difference| {diff:.1e}")
    else:
        print("onnxruntime is not installed: no comparison (pip install onnxruntime)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
