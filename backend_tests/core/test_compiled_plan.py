"""A plan run often is compiled into one Python function (executor.COMPILE_AFTER): the same calls in the
same order, the same results, in-place steps and error messages as the loop's."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_mini
from onnx_mini import executor, inplace
from onnx_mini.errors import KernelError


@pytest.fixture
def compile_soon(monkeypatch):
    monkeypatch.setattr(executor, "COMPILE_AFTER", 3)


def model(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, None) for n, t in inputs],
                          [helper.make_tensor_value_info(n, TensorProto.UNDEFINED, None) for n in outputs],
                          list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


F, I = TensorProto.FLOAT, TensorProto.INT64


def mixed_model():
    """Steps of every layout: 1, 2 and 4 inputs, two outputs (TopK), a freed slot, a Constant."""
    nodes = [helper.make_node("Neg", ["x"], ["n"]),
             helper.make_node("Add", ["n", "x"], ["a"]),
             helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.array([2], np.int64))),
             helper.make_node("TopK", ["a", "k"], ["v", "i"]),
             helper.make_node("Concat", ["v", "v", "n", "x"], ["c"], axis=1),
             helper.make_node("Reshape", ["c", "s"], ["y"])]
    return model(nodes, [("x", F), ("s", I)], ["y", "i"])


def test_compiled_runs_give_the_loops_results(compile_soon):
    prepared = onnx_mini.prepare(mixed_model(), optimize=False)
    x = np.array([[3.0, -1.0, 2.5], [0.5, 4.0, -2.0]], np.float32)
    s = np.array([-1], np.int64)
    first = prepared.run([x, s])
    assert prepared.plan.layout.compiled is None              # two runs by the loop
    for _ in range(4):
        again = prepared.run([x, s])
    assert prepared.plan.layout.compiled is not None
    np.testing.assert_array_equal(again.y, first.y)
    np.testing.assert_array_equal(again.i, first.i)
    # by hand: Neg + x is zeros, TopK of zeros keeps the first two positions
    np.testing.assert_array_equal(again.i, [[0, 1], [0, 1]])
    np.testing.assert_array_equal(again.y, np.concatenate([np.zeros((2, 4)), -x, x], axis=1).ravel())


def test_a_failing_step_of_a_compiled_plan_is_named(compile_soon):
    nodes = [helper.make_node("Add", ["a", "b"], ["c"], name="first"),
             helper.make_node("Reshape", ["c", "s"], ["d"], name="second"),
             helper.make_node("Neg", ["d"], ["y"], name="third")]
    prepared = onnx_mini.prepare(model(nodes, [("a", F), ("b", F), ("s", I)], ["y"]), optimize=False)
    a = np.ones((2, 3), np.float32)
    for _ in range(5):
        prepared.run([a, a, np.array([3, 2], np.int64)])
    assert prepared.plan.layout.compiled is not None
    with pytest.raises(KernelError, match=r"node 'second' \(Reshape.*cannot reshape input \[2, 3\].*\[4, 2\]"):
        prepared.run([a, a, np.array([4, 2], np.int64)])
    with pytest.raises(KernelError, match=r"node 'first' \(Add.*\[2, 3\] and \[3, 3\] do not broadcast"):
        prepared.run([a, np.ones((3, 3), np.float32), np.array([3, 2], np.int64)])
    np.testing.assert_array_equal(prepared.run([a, a, np.array([6], np.int64)])[0], np.full(6, -2.0))


def test_compiled_plans_still_write_in_place(compile_soon, monkeypatch):
    taken = []
    real = inplace.wrap

    def counted(in_place, *rest):
        def run(*args, **kwargs):
            taken.append(1)
            return in_place(*args, **kwargs)
        return real(run, *rest)
    monkeypatch.setattr(inplace, "wrap", counted)
    nodes = [helper.make_node("Mul", ["x", "x"], ["a"]), helper.make_node("Neg", ["a"], ["b"]),
             helper.make_node("Add", ["b", "x"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [256, 256])],
                          [helper.make_tensor_value_info("y", F, None)])
    prepared = onnx_mini.prepare(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]))
    x = np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)
    before = x.copy()
    for _ in range(4):
        prepared.run([x])
    assert prepared.plan.layout.compiled is not None
    taken.clear()
    y = prepared.run([x])[0]
    assert len(taken) == 2                            # Neg and Add wrote into the dying a and b
    np.testing.assert_array_equal(y, -(before * before) + before)
    np.testing.assert_array_equal(x, before)          # the caller's array is never written


def test_plans_above_the_limit_keep_the_loop(compile_soon, monkeypatch):
    monkeypatch.setattr(executor, "COMPILE_MAX", 2)
    prepared = onnx_mini.prepare(mixed_model(), optimize=False)
    x = np.ones((2, 3), np.float32)
    for _ in range(6):
        y = prepared.run([x, np.array([-1], np.int64)]).y
    assert prepared.plan.layout.compiled is None
    np.testing.assert_array_equal(y, np.concatenate([np.zeros((2, 4)), -x, x], axis=1).ravel())
