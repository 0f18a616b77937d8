"""Threads and memory: one prepared model (and one InferenceSession) shared by 8 threads x 200 runs gives
exactly the single-threaded results; 1000 consecutive runs do not grow the process's memory.

The leak check runs in a fresh subprocess (this file run as a script) so that the test process's own
allocations do not blur the measure."""
import os
import subprocess
import sys
import threading

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import onnx_mini
from onnx_mini.session import InferenceSession

from helpers import F, I64, TESTS, model

THREADS, RUNS = 8, 200


def cnn_model():
    """Conv 3x3 -> Relu -> MaxPool 2x2 -> Flatten -> Gemm -> Softmax, with a Loop adding the logits to an
    accumulator 3 times (a subgraph run on every call), on a (2, 1, 8, 8) image batch."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 1, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")
    fc = numpy_helper.from_array(rng.standard_normal((36, 10)).astype(np.float32), "fc")
    fcb = numpy_helper.from_array(rng.standard_normal(10).astype(np.float32), "fcb")
    trips = numpy_helper.from_array(np.array(3, np.int64), "trips")
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Add", ["acc_in", "probs"], ["acc_out"]),
         helper.make_node("Mul", ["acc_out", "acc_out"], ["sq"])],
        "body",
        [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", F, None)],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", F, None), helper.make_tensor_value_info("sq", F, None)])
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[0, 0, 0, 0]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "fc", "fcb"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
        helper.make_node("Loop", ["trips", "", "logits"], ["acc", "squares"], body=body),
    ]
    return model(nodes, [("x", F, [2, 1, 8, 8])], [("probs", F, None), ("acc", F, None), ("squares", F, None)],
                 [w, b, fc, fcb, trips], opset=17)


def _feed(k: int) -> np.ndarray:
    return np.random.default_rng(1000 + k).standard_normal((2, 1, 8, 8)).astype(np.float32)


def _hammer(run_one) -> None:
    """run_one(x) -> list of arrays; every thread's results must equal the single-threaded ones."""
    feeds = [_feed(k) for k in range(THREADS * RUNS)]
    expected = [run_one(x) for x in feeds]
    failures: list[str] = []
    barrier = threading.Barrier(THREADS)

    def worker(t: int) -> None:
        barrier.wait()
        try:
            for r in range(RUNS):
                k = (t * RUNS + r * 7) % len(feeds)   # threads interleave over different inputs
                got = run_one(feeds[k])
                for g, e in zip(got, expected[k], strict=True):
                    if g.dtype != e.dtype or g.shape != e.shape or g.tobytes() != e.tobytes():
                        failures.append(f"thread {t} run {r} input {k}: results differ")
                        return
        except Exception as exc:   # reported below: a failing thread must fail the test
            failures.append(f"thread {t}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not failures, failures[:5]


def test_prepared_model_from_8_threads_matches_single_thread():
    rep = onnx_mini.prepare(cnn_model())
    _hammer(lambda x: list(rep.run([x])))


def test_inference_session_from_8_threads_matches_single_thread():
    sess = InferenceSession(cnn_model().SerializeToString())
    _hammer(lambda x: sess.run(None, {"x": x}))


def tree_model():
    """Flatten the CNN's input to 64 features, then a 20-tree TreeEnsembleRegressor of depth 3."""
    rng = np.random.default_rng(7)
    attrs = {k: [] for k in ("nodes_treeids", "nodes_nodeids", "nodes_featureids", "nodes_values", "nodes_modes",
                             "nodes_truenodeids", "nodes_falsenodeids", "target_treeids", "target_nodeids",
                             "target_ids", "target_weights")}
    for t in range(20):
        for n in range(15):                       # complete binary tree: 0..6 internal, 7..14 leaves
            leaf = n >= 7
            attrs["nodes_treeids"].append(t)
            attrs["nodes_nodeids"].append(n)
            attrs["nodes_featureids"].append(0 if leaf else int(rng.integers(0, 64)))
            attrs["nodes_values"].append(0.0 if leaf else float(rng.standard_normal()))
            attrs["nodes_modes"].append("LEAF" if leaf else "BRANCH_LEQ")
            attrs["nodes_truenodeids"].append(0 if leaf else 2 * n + 1)
            attrs["nodes_falsenodeids"].append(0 if leaf else 2 * n + 2)
            if leaf:
                attrs["target_treeids"].append(t)
                attrs["target_nodeids"].append(n)
                attrs["target_ids"].append(0)
                attrs["target_weights"].append(float(rng.standard_normal()))
    nodes = [helper.make_node("Flatten", ["x"], ["f"]),
             helper.make_node("TreeEnsembleRegressor", ["f"], ["y"], domain="ai.onnx.ml", n_targets=1, **attrs)]
    return model(nodes, [("x", F, [2, 1, 8, 8])], [("y", F, None)],
                 opset=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])


def test_tree_ensemble_from_8_threads_matches_single_thread():
    rep = onnx_mini.prepare(tree_model())
    a, b = rep.run([_feed(1)])[0], rep.run([_feed(2)])[0]
    assert a.shape == (2, 1) and not np.array_equal(a, b)
    _hammer(lambda x: list(rep.run([x])))


def test_threads_see_different_results_for_different_inputs():
    # the hammer above would pass trivially if every input gave the same output
    rep = onnx_mini.prepare(cnn_model())
    a, b = rep.run([_feed(1)]), rep.run([_feed(2)])
    assert not np.array_equal(a[0], b[0]) and not np.array_equal(a[1], b[1])
    np.testing.assert_allclose(a[0].sum(axis=1), 1, rtol=1e-5)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _rss_growth(runs: int = 1000, warmup: int = 100) -> int:
    """Bytes of resident memory gained over `runs` runs, after `warmup` runs (prints it as a script)."""
    rep = onnx_mini.prepare(cnn_model())
    sess = InferenceSession(cnn_model().SerializeToString())
    for k in range(warmup):
        rep.run([_feed(k)])
        sess.run(None, {"x": _feed(k)})
    before = _rss_bytes()
    for k in range(runs):
        rep.run([_feed(k)])
        sess.run(None, {"x": _feed(k)})
    return _rss_bytes() - before


def test_1000_runs_do_not_grow_memory():
    if not os.path.exists("/proc/self/statm"):
        import pytest
        pytest.skip("RSS is read from /proc (Linux)")
    out = subprocess.run([sys.executable, __file__, "rss"], capture_output=True, text=True, timeout=120,
                         cwd=str(TESTS), env={**os.environ, "PYTHONPATH": str(TESTS)})
    assert out.returncode == 0, out.stderr[-2000:]
    growth = int(out.stdout.split()[-1])
    assert growth < 20 << 20, f"RSS grew by {growth / 2**20:.1f} MiB over 1000 runs"


if __name__ == "__main__" and sys.argv[1:] == ["rss"]:
    print(_rss_growth())


def test_recycled_buffers_from_4_threads_match_single_thread():
    """Conv (its columns and product), Relu in place, a Concat and a MaxPool of 0.5-1 MB arrays, all in
    onnx_mini.memory's recycled buffers: 4 threads x 30 runs over 8 inputs give the serial results (a
    buffer is never handed to two arrays alive at once), and the pool holds a few buffers, not one per run."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((32, 16, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Concat", ["r", "x"], ["y"], axis=1),
             helper.make_node("MaxPool", ["y"], ["z"], kernel_shape=[2, 2], strides=[2, 2])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 64, 64])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w, "w")])
    prepared = onnx_mini.prepare(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]))
    xs = [rng.standard_normal((1, 16, 64, 64)).astype(np.float32) for _ in range(8)]
    want = [prepared.run([x])[0].copy() for x in xs]
    assert onnx_mini.memory.recycled(prepared.run([xs[0]])[0].base)
    bad = []

    def work(t):
        for r in range(30):
            k = (t * 3 + r) % 8
            if not np.array_equal(prepared.run([xs[k]])[0], want[k]):
                bad.append((t, r))
    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert bad == []
    assert onnx_mini.memory.held_bytes() < 64 << 20
