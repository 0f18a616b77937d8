"""Scripts written for onnxruntime (ort_scripts/: `import onnxruntime as ort`, sessions, OrtValue,
IOBinding, profiling, errors and logging) run unchanged on onnx_mini: each runs with `onnxruntime`
bound to onnx_mini, its RESULTS checked against values computed here from the formulas; when
onnxruntime is installed, it also runs on onnxruntime and both runtimes' RESULTS must agree."""
from __future__ import annotations

import importlib.util
import runpy
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import onnx_mini
import onnx_mini.session

SCRIPTS = Path(__file__).with_name("ort_scripts")
NAMES = sorted(p.stem for p in SCRIPTS.glob("*.py"))
HAS_ORT = importlib.util.find_spec("onnxruntime") is not None


def run_script(name: str, runtime: str) -> dict:
    """The script's globals after running it with `onnxruntime` meaning `runtime`."""
    path = str(SCRIPTS / f"{name}.py")
    if runtime == "onnxruntime":
        import onnxruntime
        try:
            return runpy.run_path(path)
        finally:
            onnxruntime.set_default_logger_severity(2)          # its default: warnings
    saved = sys.modules.get("onnxruntime")
    sys.modules["onnxruntime"] = onnx_mini
    onnx_mini.session._warned.clear()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", onnx_mini.IgnoredOptionWarning)    # every option used is honoured
            return runpy.run_path(path)
    finally:
        onnx_mini.set_default_logger_severity(2)
        onnx_mini.session._warned.clear()
        if saved is None:
            del sys.modules["onnxruntime"]
        else:
            sys.modules["onnxruntime"] = saved


@pytest.fixture(scope="module")
def ran():
    done: dict[tuple[str, str], dict] = {}

    def get(name: str, runtime: str = "onnx_mini") -> dict:
        if (name, runtime) not in done:
            done[name, runtime] = run_script(name, runtime)
        return done[name, runtime]
    return get


def same(got, exp, where: str = "RESULTS", rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """Equal structure and values (arrays: same dtype and shape, values within rtol/atol)."""
    if isinstance(exp, np.ndarray) or isinstance(got, np.ndarray):
        got, exp = np.asarray(got), np.asarray(exp)
        assert got.dtype == exp.dtype and got.shape == exp.shape, \
            f"{where}: {got.dtype}{got.shape} != {exp.dtype}{exp.shape}"
        np.testing.assert_allclose(got, exp, rtol=rtol, atol=atol, err_msg=where)
    elif isinstance(exp, dict):
        assert isinstance(got, dict) and sorted(got) == sorted(exp), f"{where}: keys {sorted(got)} != {sorted(exp)}"
        for k in exp:
            same(got[k], exp[k], f"{where}[{k!r}]", rtol, atol)
    elif isinstance(exp, (list, tuple)):
        assert type(got) is type(exp) and len(got) == len(exp), f"{where}: {got!r} != {exp!r}"
        for i, (g, e) in enumerate(zip(got, exp)):
            same(g, e, f"{where}[{i}]", rtol, atol)
    else:
        assert got == exp, f"{where}: {got!r} != {exp!r}"


def softmax(z):
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def sigmoid(z):
    return 1 / (1 + np.exp(-z))


# -- each script on onnx_mini, against the formulas ----------------------------------------------------

def test_session_basics(ran):
    g = ran("session_basics")
    x, w, b = g["x"], g["W"], g["B"]
    logits = x @ w + b
    scores, label = softmax(logits).astype(np.float32), logits.argmax(axis=1)
    same(g["RESULTS"], {
        "device": "CPU", "cpu_available": True, "providers": ["CPUExecutionProvider"],
        "inputs": [("features", "tensor(float)", ["batch", 4])],
        "outputs": [("scores", "tensor(float)", ["batch", 3]), ("label", "tensor(int64)", ["batch"])],
        "all": [scores, label], "scores_only": [scores], "label_with_run_options": [label]})


def test_ort_values(ran):
    g = ran("ort_values")
    w = g["W"]
    x0 = np.arange(8, dtype=np.float32).reshape(2, 4) - 3
    x0[0, 0] = 42
    scores = np.maximum(x0 @ w, 0)
    ones = np.maximum(np.ones((2, 4), np.float32) @ w, 0)
    same(g["RESULTS"], {
        "describe": ([2, 4], "tensor(float)", "cpu", True, 1, True, 32),
        "shared": x0,
        "int64": ("tensor(int64)", 7, np.array([1, 2, 3], np.int64)),
        "blank": ([3, 2], "tensor(float)", 1, "float32"),
        "typed": ([2], "tensor(int64)", "int64"),
        "are_ortvalues": True,
        "outputs": [("tensor(float)", [2, 3], scores), ("tensor(float)", [], scores.sum(dtype=np.float32))],
        "after_update": ones,
        "run_takes_ortvalue": ones.sum(dtype=np.float32)})
    np.testing.assert_array_equal(g["x"], np.ones((2, 4)))     # update_inplace wrote into the array fed


def test_io_binding(ran):
    g = ran("io_binding")
    x, w = g["x"], g["W"]

    def outputs(v):
        return [sigmoid(v @ w).astype(np.float32), (v @ w).argmax(axis=1)]
    later = outputs(x + 1)
    same(g["RESULTS"], {
        "copied": outputs(x),
        "views": [("tensor(float)", [2, 3], later[0]), ("tensor(int64)", [2], later[1])],
        "preallocated": outputs(x)[0], "preallocated_returned": outputs(x)[0],
        "into_pointer": outputs(2 * x)[0],
        "rebound": later, "one_output": [later[1]]})
    assert np.shares_memory(g["scores"].numpy(), g["preallocated"].get_outputs()[0].numpy())


def test_profiling(ran):
    g = ran("profiling")
    x, bias = g["x"], np.array([1, -2, 0.5], np.float32)
    r = g["RESULTS"]
    for got, batch in zip(r["y"], (x, x[:1], x)):
        np.testing.assert_array_equal(got, np.maximum((batch + bias) * batch, 0))
    names = ["add_bias_kernel_time", "scale_kernel_time", "Relu_2_kernel_time"]

    def args(n):   # float32 [n, 3] activations: 12 bytes a row; the bias initializer: 12 bytes
        t = [{"float": [n, 3]}]
        return [("Add", "CPUExecutionProvider", "0", t + [{"float": [3]}], t, str(12 * n), "12", str(12 * n)),
                ("Mul", "CPUExecutionProvider", "1", t + t, t, str(24 * n), "0", str(12 * n)),
                ("Relu", "CPUExecutionProvider", "2", t, t, str(12 * n), "0", str(12 * n))]
    same({k: v for k, v in r.items() if k != "y"}, {
        "start_ns_set": True, "file_name": True, "ended_twice": "",
        "event_keys": ["args", "cat", "dur", "name", "ph", "pid", "tid", "ts"], "phases": ["X"],
        "categories": ["Node", "Session"], "integer_times": True, "one_pid": True, "runs": 3,
        "set_up": ["model_loading_uri", "session_initialization"], "node_names": names * 3,
        "node_args": args(2) + args(1) + args(2), "nodes_inside_runs": True})


def test_errors_and_logging(ran):
    r = dict(ran("errors_and_logging")["RESULTS"])        # a copy: the onnxruntime comparison reads it too
    still = r.pop("still_runs")
    np.testing.assert_array_equal(still, np.array([-1.5, 2], np.float32))
    assert r and all(v is True for v in r.values()), r


def test_every_script_is_checked():
    assert NAMES == ["errors_and_logging", "io_binding", "ort_values", "profiling", "session_basics"]


# -- the same scripts on onnxruntime ---------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_same_results_as_onnxruntime(ran, name):
    if not HAS_ORT:
        pytest.skip("onnxruntime is not installed")
    theirs = ran(name, "onnxruntime")["RESULTS"]
    ours = ran(name)["RESULTS"]
    same(ours, theirs)
