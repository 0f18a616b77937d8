"""In-place elementwise steps (onnx_mini/inplace.py): a dying intermediate's buffer is reused, and
nothing anyone can still see is ever written: graph outputs, live views, callers' arrays, constants."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_mini
from onnx_mini import inplace

N = 256     # 65536 elements: above inplace.MIN_SIZE


def make(nodes, outputs, inits=(), inputs=("x",)):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(i, TensorProto.FLOAT, [N, N]) for i in inputs],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs], list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


@pytest.fixture
def writes(monkeypatch):
    """How many times the in-place path was taken: the kernels' in-place forms, counted (models
    prepared after this fixture get counted ones; wrapping _free instead would add a frame to the
    counts it reads)."""
    taken = []

    def counted(f):
        def run(*args, **kwargs):
            taken.append(1)
            return f(*args, **kwargs)
        return run
    real = inplace.wrap
    monkeypatch.setattr(inplace, "wrap", lambda in_place, *rest: real(counted(in_place), *rest))
    return taken


def const(name, value):
    return numpy_helper.from_array(np.asarray(value, np.float32), name)


def x_value(seed=0):
    return np.random.default_rng(seed).standard_normal((N, N)).astype(np.float32)


def test_chain_of_elementwise_steps_reuses_buffers(writes):
    nodes = [helper.make_node("Mul", ["x", "two"], ["a"]), helper.make_node("Add", ["a", "c"], ["b"]),
             helper.make_node("Relu", ["b"], ["r"]), helper.make_node("Neg", ["r"], ["n"]),
             helper.make_node("Sub", ["half", "n"], ["y"])]       # the dying operand second
    model = make(nodes, ["y"], [const("two", 2.0), const("c", np.linspace(-1, 1, N)), const("half", 0.5)])
    x = x_value()
    x_before = x.copy()
    y = onnx_mini.prepare(model).run([x])[0]
    want = 0.5 + np.maximum(x * 2 + np.linspace(-1, 1, N).astype(np.float32), 0)
    np.testing.assert_array_equal(y, want)
    np.testing.assert_array_equal(x, x_before)        # the caller's array: read, never written
    assert len(writes) == 4                           # Add, Relu, Neg, Sub wrote into their input
    np.testing.assert_array_equal(onnx_mini.prepare(model, optimize=False).run([x])[0], want)


def test_graph_output_is_not_overwritten(writes):
    nodes = [helper.make_node("Mul", ["x", "two"], ["a"]), helper.make_node("Relu", ["a"], ["r"])]
    model = make(nodes, ["a", "r"], [const("two", -2.0)])
    x = x_value(1)
    a, r = onnx_mini.prepare(model).run([x])
    np.testing.assert_array_equal(a, x * -2)
    np.testing.assert_array_equal(r, np.maximum(x * -2, 0))
    assert writes == []


def test_live_view_blocks_the_write(writes):
    """Reshape's output is a view of `a` and stays alive (a graph output) after Add reads `a` last."""
    nodes = [helper.make_node("Mul", ["x", "two"], ["a"]), helper.make_node("Reshape", ["a", "flat"], ["v"]),
             helper.make_node("Add", ["a", "one"], ["y"])]
    model = make(nodes, ["v", "y"], [const("two", 2.0), const("one", 1.0),
                                      numpy_helper.from_array(np.array([-1], np.int64), "flat")])
    x = x_value(2)
    v, y = onnx_mini.prepare(model).run([x])
    np.testing.assert_array_equal(v, (x * 2).ravel())
    np.testing.assert_array_equal(y, x * 2 + 1)
    assert writes == []


def test_callers_arrays_and_constants_are_never_targets(writes):
    nodes = [helper.make_node("Add", ["x", "w"], ["s"]), helper.make_node("Relu", ["x2"], ["t"]),
             helper.make_node("Mul", ["s", "t"], ["y"])]
    w = np.full((N, N), 0.25, np.float32)
    model = make(nodes, ["y"], [numpy_helper.from_array(w, "w")], inputs=("x", "x2"))
    prepared = onnx_mini.prepare(model)
    x, x2 = x_value(3), x_value(4)
    copies = x.copy(), x2.copy()
    y = prepared.run({"x": x, "x2": x2})[0]
    np.testing.assert_array_equal(y, (x + 0.25) * np.maximum(x2, 0))
    np.testing.assert_array_equal(x, copies[0])
    np.testing.assert_array_equal(x2, copies[1])
    # temporaries handed straight to run(): still the caller's, still not written
    y2 = prepared.run([x_value(3), x_value(4)])[0]
    np.testing.assert_array_equal(y2, y)
    assert len(writes) == 2                  # per run, Mul wrote into s (x + w, made by the plan), nothing else
    np.testing.assert_array_equal(prepared.run({"x": x, "x2": x2})[0], y)  # the initializer is intact


def test_small_tensors_and_other_types_take_the_regular_kernel(writes):
    nodes = [helper.make_node("Mul", ["x", "x"], ["a"]), helper.make_node("Add", ["a", "a"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.INT32, [N, N])],
                          [helper.make_tensor_value_info("y", TensorProto.INT32, None)])
    x = np.arange(N * N, dtype=np.int32).reshape(N, N) % 7
    y = onnx_mini.prepare(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])).run([x])[0]
    np.testing.assert_array_equal(y, 2 * x * x)
    assert writes == []


def test_same_results_as_written_with_broadcasting_both_ways():
    nodes = [helper.make_node("Exp", ["x"], ["e"]), helper.make_node("Div", ["row", "e"], ["d"]),
             helper.make_node("Tanh", ["d"], ["t"]), helper.make_node("Sub", ["t", "col"], ["y"])]
    model = make(nodes, ["y"], [const("row", np.linspace(1, 2, N)), const("col", np.linspace(0, 1, N)[:, None])])
    x = x_value(5)
    fast, plain = onnx_mini.prepare(model), onnx_mini.prepare(model, optimize=False)
    np.testing.assert_array_equal(fast.run([x])[0], plain.run([x])[0])
