"""onnx_mini.memory: glibc's malloc tuned once per process, large layer outputs in recycled buffers."""
from __future__ import annotations

import os
import subprocess
import sys
import types

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_mini
from onnx_mini import memory, parallel


def test_malloc_is_tuned_once_and_only_with_glibc(monkeypatch):
    calls = []
    fake = types.SimpleNamespace(mallopt=lambda *a: calls.append(a) or 1)
    monkeypatch.setattr(memory, "_done", [False])
    monkeypatch.setattr(memory.ctypes, "CDLL", lambda name: fake)
    with parallel.running():
        pass
    with parallel.running():
        pass
    assert calls == [(-3, memory.MMAP_THRESHOLD), (-1, memory.TRIM_THRESHOLD)]

    def no_libc(name):
        raise OSError("no libc here")
    monkeypatch.setattr(memory, "_done", [False])
    monkeypatch.setattr(memory.ctypes, "CDLL", no_libc)
    memory.tune_once()                     # nothing to tune, no error
    assert memory._done == [True]


def test_malloc_default_leaves_it_alone():
    code = "import onnx_mini.memory as m\nprint(m._done[0] and not m.RECYCLE)\n"
    env = dict(os.environ, ONNX_MINI_MALLOC="default")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "True"


@pytest.fixture
def recycling(monkeypatch):
    """Recycling on, for anything of 1 KB or more, starting from an empty list."""
    monkeypatch.setattr(memory, "RECYCLE", True)
    monkeypatch.setattr(memory, "RECYCLE_MIN_BYTES", 1024)
    monkeypatch.setattr(memory, "_buffers", [])


def test_a_freed_buffer_is_handed_out_again(recycling):
    a = memory.empty((16, 32), np.float32)
    assert a.shape == (16, 32) and a.dtype == np.float32 and a.flags.c_contiguous and a.flags.writeable
    b = memory.empty((16, 32), np.float32)
    assert not np.shares_memory(a, b)                  # a is alive: b gets its own
    where = a.ctypes.data
    del a
    c = memory.empty((8, 64), np.float32)              # same size, another shape: a's buffer
    assert c.ctypes.data == where and not np.shares_memory(b, c)
    assert memory.empty((4,), np.float32).base is None          # small: plain np.empty
    assert memory.empty((1024,), object).base is None           # references: never from raw bytes


def test_a_live_view_keeps_its_buffer(recycling):
    a = memory.empty((1024,), np.float64)
    view = a[4:].reshape(-1, 4)[1:]
    del a
    b = memory.empty((1024,), np.float64)
    assert not np.shares_memory(view, b)
    del view
    c = memory.empty((1024,), np.float64)
    assert not np.shares_memory(b, c) and memory.held_bytes() == 2 * 8192


def test_sizes_and_release(recycling):
    a = memory.empty((4096,), np.uint8)
    del a
    big = memory.empty((3 * 4096,), np.uint8)   # more than the free one holds: a miss, the free one goes back
    assert memory.held_bytes() == 3 * 4096
    del big
    small = memory.empty((4096,), np.uint8)     # a third of the free one: too wasteful, a new buffer
    assert memory.held_bytes() == 4096 and small.base.size == 4096
    half = memory.empty((2048,), np.uint8)      # half of a free one would do, but small is alive
    assert not np.shares_memory(small, half)
    del small
    memory.release()
    assert memory.held_bytes() == 2048          # half's buffer is in use and stays


def test_recycling_off_is_np_empty(monkeypatch):
    monkeypatch.setattr(memory, "RECYCLE", False)
    monkeypatch.setattr(memory, "RECYCLE_MIN_BYTES", 1024)
    monkeypatch.setattr(memory, "_buffers", [])
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
