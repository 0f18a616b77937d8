"""examples/dask_batch.py: scoring in chunks on Dask equals one run in one process.

Skips when Dask is not installed (pip install onnx-mini[dask]); the message the example gives then is
checked with Dask hidden from a subprocess."""
import importlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import onnx_mini
from helpers import REPO

ROOT = REPO
EXAMPLE = ROOT / "examples" / "dask_batch.py"
ROWS = 20_000


@pytest.fixture
def example(monkeypatch):
    """The example as an importable module `dask_batch`: the worker processes (spawned with this
    process' sys.path) import it to unpickle the function of its tasks."""
    monkeypatch.syspath_prepend(str(EXAMPLE.parent))
    monkeypatch.delitem(sys.modules, "dask_batch", raising=False)
    return importlib.import_module("dask_batch")


def single_process(example) -> np.ndarray:
    """The same rows, one run of the prepared model, no Dask."""
    return onnx_mini.prepare(example.build_model()).run({"x": example.make_data(ROWS)})["probabilities"]


def numpy_mlp(example) -> np.ndarray:
    """The model written with numpy from its weights: softmax(relu(x W1 + b1) W2 + b2)."""
    x = example.make_data(ROWS).astype(np.float64)
    z = np.maximum(x @ example.W1 + example.B1, 0) @ example.W2 + example.B2
    p = np.exp(z - z.max(axis=1, keepdims=True))
    return p / p.sum(axis=1, keepdims=True)


def check(result, example, out: str, chunks: int) -> None:
    assert result.rows == ROWS and result.scores.shape == (ROWS, example.CLASSES)
    assert result.scores.dtype == np.float32
    np.testing.assert_allclose(result.scores, single_process(example), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(result.scores, numpy_mlp(example), rtol=1e-4, atol=1e-6)
    assert result.same and result.seconds > 0
    assert f"scored {ROWS:,} rows in {chunks} chunks of up to 3,000 rows" in out
    assert "same scores as the single-process run: True" in out


def test_dask_example_local_scheduler(example, capsys):
    pytest.importorskip("dask.array", reason="Dask is not installed: pip install onnx-mini[dask]")
    result = example.main(["--rows", str(ROWS), "--chunk", "3000", "--scheduler", "local"])
    out = capsys.readouterr().out
    check(result, example, out, chunks=7)
    assert "local threaded scheduler" in out


def test_dask_example_one_command():
    # The LocalCluster (worker processes receiving the pickled model) runs in a subprocess with a
    # timeout: a worker that cannot unpickle a task makes the cluster wait forever, and CI must fail
    # instead of hanging.
    pytest.importorskip("dask.distributed", reason="Dask is not installed: pip install onnx-mini[dask]")
    r = subprocess.run([sys.executable, str(EXAMPLE), "--rows", "5000", "--chunk", "1000"], capture_output=True,
                       text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "scored 5,000 rows in 5 chunks of up to 1,000 rows with a LocalCluster of 2 processes" in r.stdout
    assert "same scores as the single-process run: True" in r.stdout
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("hidden", ["dask", "distributed"])
def test_dask_example_without_dask_says_how_to_install(hidden):
    # Dask hidden from the interpreter (sys.modules[name] = None makes `import name` fail)
    code = (f"import sys, runpy; sys.modules[{hidden!r}] = None; sys.argv = [{str(EXAMPLE)!r}, '--rows', '10']; "
            f"runpy.run_path({str(EXAMPLE)!r}, run_name='__main__')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 1
    assert "examples/dask_batch.py needs Dask" in r.stderr and "pip install onnx-mini[dask]" in r.stderr
    assert "Traceback" not in r.stderr
