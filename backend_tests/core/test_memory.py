"""onnx_mini.memory: the kernels' large arrays in recycled buffers; glibc's malloc tuned only when asked."""
from __future__ import annotations

import os
import subprocess
import sys
import types

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_mini
from onnx_mini import memory, run_scope

# Run in a fresh interpreter with mallopt replaced by a recorder: prepares and runs a model, then
# prints the mallopt calls, whether memory says malloc is tuned, and whether it recycles.
_RUN_AND_REPORT = """
import ctypes, types
calls = []
real = ctypes.CDLL
ctypes.CDLL = lambda name, *a, **k: types.SimpleNamespace(mallopt=lambda *a: calls.append(a) or 1) \\
    if name is None else real(name, *a, **k)
import numpy as np
from onnx import TensorProto, helper
import onnx_mini
from onnx_mini import memory
g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
m = onnx_mini.prepare(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]))
m.run([np.ones(2, np.float32)]); m.run([np.ones(2, np.float32)])
if EXPLICIT:
    print(onnx_mini.tune_malloc(), onnx_mini.tune_malloc())
print(calls, memory.tuned(), memory.RECYCLE)
"""


def _run_and_report(malloc: str | None, explicit: bool = False) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "ONNX_MINI_MALLOC"}
    if malloc is not None:
        env["ONNX_MINI_MALLOC"] = malloc
    out = subprocess.run([sys.executable, "-c", _RUN_AND_REPORT.replace("EXPLICIT", str(explicit))],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()


TUNED_CALLS = f"[({-3}, {32 << 20}), ({-1}, {256 << 20})]"


def test_running_a_model_leaves_malloc_alone_by_default():
    assert _run_and_report(None) == ["[] False True"]           # recycled buffers on, malloc untouched
    assert _run_and_report("recycle") == ["[] False True"]


def test_opting_in_tunes_malloc():
    assert _run_and_report("tuned") == [f"{TUNED_CALLS} True True"]            # at the first run, once
    assert _run_and_report(None, explicit=True) == ["True True", f"{TUNED_CALLS} True True"]


def test_malloc_is_tuned_once_and_only_with_glibc(monkeypatch):
    calls = []
    fake = types.SimpleNamespace(mallopt=lambda *a: calls.append(a) or 1)
    monkeypatch.setattr(memory, "_done", [False])              # opted in (ONNX_MINI_MALLOC=tuned)
    monkeypatch.setattr(memory, "_tuned", [False])
    monkeypatch.setattr(memory.ctypes, "CDLL", lambda name: fake)
    with run_scope.running():
        pass
    with run_scope.running():
        pass
    assert calls == [(-3, memory.MMAP_THRESHOLD), (-1, memory.TRIM_THRESHOLD)]
    assert memory.tuned() and onnx_mini.tune_malloc() and len(calls) == 2

    def no_libc(name):
        raise OSError("no libc here")
    monkeypatch.setattr(memory, "_done", [False])
    monkeypatch.setattr(memory, "_tuned", [False])
    monkeypatch.setattr(memory.ctypes, "CDLL", no_libc)
    memory.begin_run()                     # nothing to tune, no error
    assert memory._done == [True]
    assert not memory.tuned() and onnx_mini.tune_malloc() is False


def test_not_opted_in_runs_never_call_mallopt(monkeypatch):
    def fail(name):
        raise AssertionError("mallopt looked up without opting in")
    monkeypatch.setattr(memory, "_done", [True])               # the default: nothing to do at a run
    monkeypatch.setattr(memory.ctypes, "CDLL", fail)
    with run_scope.running():
        pass


def test_malloc_default_leaves_it_alone():
    for value in ("default", "off"):
        code = "import onnx_mini.memory as m\nprint(m._done[0] and not m.RECYCLE and not m.tuned())\n"
        env = dict(os.environ, ONNX_MINI_MALLOC=value)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and out.stdout.strip() == "True"
    assert _run_and_report("off") == ["[] False False"]


@pytest.fixture
def recycling(monkeypatch):
    """Recycling on, for anything of 1 KB or more, starting from an empty pool."""
    monkeypatch.setattr(memory, "RECYCLE", True)
    monkeypatch.setattr(memory, "RECYCLE_MIN_BYTES", 1024)
    monkeypatch.setattr(memory, "_by_size", {})


def test_a_freed_buffer_is_handed_out_again(recycling):
    a = memory.empty((16, 32), np.float32)
    assert a.shape == (16, 32) and a.dtype == np.float32 and a.flags.c_contiguous and a.flags.writeable
    b = memory.empty((16, 32), np.float32)
    assert not np.shares_memory(a, b)                  # a is alive: b gets its own
    where = a.ctypes.data
    del a
    c = memory.empty((8, 64), np.float32)              # same size, another shape: a's buffer
    assert c.ctypes.data == where and not np.shares_memory(b, c)
    assert memory.recycled(c.base) and not memory.recycled(np.empty(2048, np.uint8))
    assert memory.empty((4,), np.float32).base is None          # small: plain np.empty
    assert memory.empty((1024,), object).base is None           # references: never from raw bytes
    assert memory.empty(2048, np.uint8).shape == (2048,)        # an int shape, as np.empty takes


def test_a_live_view_keeps_its_buffer(recycling):
    a = memory.empty((1024,), np.float64)
    view = a[4:].reshape(-1, 4)[1:]
    del a
    b = memory.empty((1024,), np.float64)
    assert not np.shares_memory(view, b)
    del view
    c = memory.empty((1024,), np.float64)
    assert not np.shares_memory(b, c) and memory.held_bytes() == 2 * 8192


def test_the_same_size_first_then_the_smallest_that_holds_it(recycling):
    big, exact, mid = (memory.empty((n,), np.uint8) for n in (8000, 4096, 6000))
    where = {id(a.base): a.base.size for a in (big, exact, mid)}
    del big, exact, mid
    a = memory.empty((4096,), np.uint8)
    assert a.base.size == 4096                  # the very size, though bigger ones are free
    b = memory.empty((4000,), np.uint8)
    assert b.base.size == 6000                  # the smallest free one holding it (not 8000)
    c = memory.empty((3000,), np.uint8)
    assert c.base.size == 3000                  # 8000 is more than twice 3000: a new buffer
    assert set(where.values()) <= {8000, 4096, 6000} and memory.held_bytes() == 8000 + 4096 + 6000 + 3000


def test_buffers_no_recent_run_used_go_back_at_a_miss(recycling, monkeypatch):
    monkeypatch.setattr(memory, "_generation", [0])
    memory.begin_run()
    old = memory.empty((4096,), np.uint8)       # used in run 1 only
    del old
    memory.begin_run()
    kept = memory.empty((1024,), np.uint8)      # used in run 2 (the last before run 3); a miss too
    del kept
    memory.begin_run()
    assert memory.held_bytes() == 4096 + 1024   # nothing goes back without a miss
    live = memory.empty((5000,), np.uint8)      # a miss: run 1's buffer goes back, run 2's stays
    assert memory.held_bytes() == 1024 + 5000
    memory.release()
    assert memory.held_bytes() == 5000          # live's buffer is in use and stays
    del live


def test_zeros_from_a_used_buffer(recycling):
    a = memory.empty((512,), np.float32)
    a.fill(7)
    where = a.ctypes.data
    del a
    z = memory.zeros((16, 32), np.float32)
    assert z.ctypes.data == where and not z.any()
    assert not memory.zeros((3,), np.int64).any()


def test_recycling_off_is_np_empty(monkeypatch):
    monkeypatch.setattr(memory, "RECYCLE", False)
    monkeypatch.setattr(memory, "RECYCLE_MIN_BYTES", 1024)
    monkeypatch.setattr(memory, "_by_size", {})
    a = memory.empty((4096,), np.float32)
    assert a.base is None and memory.held_bytes() == 0


def test_runs_keep_their_outputs_apart(recycling):
    """Batched convolutions (image by image into a recycled buffer): each run's outputs are right, and
    an output the caller keeps is never written by the next run."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 3, 3, 3)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    prepared = onnx_mini.prepare(model)
    xs = [rng.standard_normal((3, 3, 10, 9)).astype(np.float32) for _ in range(3)]
    outs = [prepared.run({"x": x})[0] for x in xs]
    assert memory.held_bytes() > 0
    xp = [np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1))) for x in xs]
    for x, y in zip(xp, outs):                   # a direct sum over the taps, in float64
        want = sum(np.einsum("nchw,mc->nmhw", x[:, :, i:i + 10, j:j + 9], w[:, :, i, j].astype(np.float64))
                   for i in range(3) for j in range(3))
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
    assert not any(np.shares_memory(a, b) for k, a in enumerate(outs) for b in outs[k + 1:])


_FAULTS_PER_RUN = """
import resource
import numpy as np
from onnx import TensorProto, helper, numpy_helper
import onnx_mini
rng = np.random.default_rng(0)
w = rng.standard_normal((64, 64, 3, 3)).astype(np.float32)
nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Concat", ["c", "x"], ["y1"], axis=1),
         helper.make_node("Concat", ["y1", "x"], ["y2"], axis=1),
         helper.make_node("Concat", ["y2", "y1"], ["y3"], axis=1),
         helper.make_node("ReduceMax", ["y3"], ["y"], keepdims=0)]
g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 64, 64])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [numpy_helper.from_array(w, "w")])
m = onnx_mini.prepare(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]))
x = rng.standard_normal((1, 64, 64, 64)).astype(np.float32)
for _ in range(3):
    m.run([x])
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    m.run([x])
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / 10)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="page-fault counts of glibc's malloc")
def test_repeated_runs_fault_in_no_fresh_pages():
    """A Conv (its columns, its product) and Concats of 1-5 MB: with malloc left alone, a run that
    repeats the last one's sizes reuses its buffers, where plain np.empty faults ~2000 pages a run
    (freed heap tops given back to the system, blocks over the mmap threshold mapped afresh)."""
    faults = {}
    for mode in ("recycle", "off"):
        env = dict(os.environ, ONNX_MINI_MALLOC=mode, ONNX_MINI_THREADS="1")
        out = subprocess.run([sys.executable, "-c", _FAULTS_PER_RUN], env=env, capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr
        faults[mode] = float(out.stdout.strip())
    assert faults["recycle"] < 50 and faults["off"] > 500, faults


def _prepared(nodes, inputs, inits=()):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in inputs],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], list(inits))
    return onnx_mini.prepare(helper.make_model(g, opset_imports=[helper.make_opsetid("", 15)]))


@pytest.mark.parametrize("axis", [0, 1, 3, -1])
def test_large_concat_into_a_recycled_buffer(axis):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((2, 16, 48, 64)).astype(np.float32)
    shape_b = list(a.shape)
    shape_b[axis] = 8
    b = rng.standard_normal(shape_b).astype(np.float32)
    prepared = _prepared([helper.make_node("Concat", ["a", "b"], ["y"], axis=axis)], ["a", "b"])
    y = prepared.run({"a": a, "b": b})[0]
    assert y.base is not None and memory.recycled(y.base)
    k = a.shape[axis]
    np.testing.assert_array_equal(np.take(y, range(k), axis=axis), a)
    np.testing.assert_array_equal(np.take(y, range(k, k + 8), axis=axis), b)
    for wrong in (np.zeros((2, 16, 47, 64), np.float32), np.zeros((2, 16), np.float32)):   # shape, rank
        with pytest.raises(onnx_mini.errors.OnnxMiniError, match="input 1"):
            prepared.run({"a": a, "b": wrong})


def test_large_batch_normalization_and_relu_into_a_recycled_buffer():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 32, 64, 64)).astype(np.float32)
    scale, bias, mean = (rng.standard_normal(32).astype(np.float32) for _ in range(3))
    var = rng.uniform(0.5, 2, 32).astype(np.float32)
    inits = [numpy_helper.from_array(v, n) for v, n in ((scale, "s"), (bias, "b"), (mean, "m"), (var, "v"))]
    nodes = [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["n"]),
             helper.make_node("Relu", ["n"], ["y"])]
    prepared = _prepared(nodes, ["x"], inits)
    assert [info.op_type for info in prepared.plan.infos] == ["ChannelAffine"]
    y = prepared.run({"x": x})[0]
    assert y.base is not None and memory.recycled(y.base)
    c = (slice(None), None, None)
    want = (x.astype(np.float64) - mean[c]) / np.sqrt(var[c].astype(np.float64) + 1e-5) * scale[c] + bias[c]
    np.testing.assert_allclose(y, np.maximum(want, 0), rtol=1e-5, atol=1e-5)


def test_large_tfidf_counts_and_l2_rows_into_recycled_buffers():
    """TfIdfVectorizer's counts at a batch (200 rows x 400 slots: 320 KB) and Normalizer's L2 rows."""
    rng = np.random.default_rng(3)
    x = rng.integers(0, 500, (200, 30)).astype(np.int64)
    pool = list(range(0, 800, 2))                     # 400 1-grams: the even tokens, slot = token / 2
    node = helper.make_node("TfIdfVectorizer", ["x"], ["y"], mode="TF", min_gram_length=1, max_gram_length=1,
                            max_skip_count=0, ngram_counts=[0], ngram_indexes=list(range(400)), pool_int64s=pool)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.INT64, None)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    y = onnx_mini.prepare(helper.make_model(g, opset_imports=[helper.make_opsetid("", 15)])).run({"x": x})[0]
    assert y.base is not None and memory.recycled(y.base)
    want = np.zeros((200, 400), np.float32)
    for r, row in enumerate(x.tolist()):
        for t in row:
            if t % 2 == 0:
                want[r, t // 2] += 1
    np.testing.assert_array_equal(y, want)

    v = rng.standard_normal((200, 400)).astype(np.float32)
    v[7] = 0                                          # a zero row stays as it is
    node = helper.make_node("Normalizer", ["v"], ["y"], norm="L2", domain="ai.onnx.ml")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("v", TensorProto.FLOAT, None)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 15), helper.make_opsetid("ai.onnx.ml", 1)])
    n = onnx_mini.prepare(model).run({"v": v})[0]
    assert n.base is not None and memory.recycled(n.base)
    norms = np.sqrt((v.astype(np.float64) ** 2).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(n, v / np.where(norms == 0, 1, norms), rtol=1e-6, atol=1e-7)
