"""The small-tensor paths: the executor's step layout (one per arity), and the kernels' shortcuts for
tiny tensors (binary and unary wrappers, Shape, Reshape, GatherElements on constant indices, the
in-place wrapper below its size) compute exactly what the general paths do and fail the same way."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_mini
from onnx_mini import executor, inplace
from onnx_mini.errors import KernelError
from onnx_mini.inputs import bind_inputs
from onnx_mini.ops._common import float32_compute
from onnx_mini.ops.math.activations import hard_sigmoid_6, hard_swish_14
from onnx_mini.ops.math.elementwise import add_7
from onnx_mini.ops.tensor.gather import gather_elements_11
from onnx_mini.ops.tensor.reshape import reshape_14, shape_15

from helpers import F, I64, model


# -- the executor's layout -------------------------------------------------------------------------

def every_arity():
    """A graph whose steps take 0, 1, 2 and 3 inputs (one omitted), and one with two outputs."""
    nodes = [helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.float32(2.0))),
             helper.make_node("Neg", ["x"], ["n"], name="neg"),
             helper.make_node("Mul", ["n", "c"], ["m"], name="mul"),
             helper.make_node("Clip", ["m", "", "hi"], ["clipped"], name="clip"),
             helper.make_node("TopK", ["clipped", "k"], ["top", "where"], name="topk"),
             helper.make_node("Sum", ["top", "top", "top"], ["y"], name="sum")]
    return model(nodes, [("x", F, [5]), ("hi", F, [])], [("y", F, None), ("where", I64, None)],
                 [numpy_helper.from_array(np.array([2], np.int64), "k")])


@pytest.mark.parametrize("optimize", [True, False])
def test_steps_of_every_arity(optimize):
    x = np.array([3.0, -1.0, 0.5, -4.0, 2.0], np.float32)
    y, where = onnx_mini.prepare(every_arity(), optimize=optimize).run({"x": x, "hi": np.float32(5.0)})
    # -2x = [-6, 2, -1, 8, -4], clipped above at 5: [-6, 2, -1, 5, -4]; top 2: 5 (at 3), 2 (at 1); times 3
    np.testing.assert_array_equal(y, np.array([15.0, 6.0], np.float32))
    np.testing.assert_array_equal(where, np.array([3, 1], np.int64))


def test_intermediates_freed_after_their_last_reader():
    prepared = onnx_mini.prepare(every_arity(), optimize=False)
    plan = prepared.plan
    slots = bind_inputs(plan, {"x": np.ones(5, np.float32), "hi": np.float32(1.0)})
    executor.execute(plan, slots)
    kept = set(plan.output_slots) | {i for i, v in enumerate(plan.template) if v is not None}
    assert [plan.slot_names[i] for i, v in enumerate(slots) if v is not None and i not in kept] == []


def test_layout_follows_replaced_steps():
    """A stage replacing plan.steps after a run (inplace.donate does before any) is seen by the next run."""
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    prepared = onnx_mini.prepare(model(nodes, [("x", F, [2])], [("y", F, None)]), optimize=False)
    x = np.array([-1.0, 2.0], np.float32)
    np.testing.assert_array_equal(prepared.run([x])[0], [0.0, 2.0])
    plan = prepared.plan
    plan.steps = [(lambda v: v * 3, *plan.steps[0][1:])]
    np.testing.assert_array_equal(prepared.run([x])[0], [-3.0, 6.0])


@pytest.mark.parametrize("node, feeds, fragment", [
    (helper.make_node("Relu", ["a"], ["y"], name="bad"), {"a": np.array(["s"], object)}, "string"),
    (helper.make_node("Add", ["a", "b"], ["y"], name="bad"),
     {"a": np.ones(3, np.float32), "b": np.ones(2, np.float32)}, r"\[3\] and \[2\] do not broadcast"),
    (helper.make_node("Where", ["c", "a", "b"], ["y"], name="bad"),
     {"c": np.ones(3, bool), "a": np.ones(3, np.float32), "b": np.ones(2, np.float32)}, "shape"),
])
def test_failing_step_of_each_arity_is_named(node, feeds, fragment):
    types = {"a": F, "b": F, "c": TensorProto.BOOL}
    if feeds["a"].dtype == object:
        types["a"] = TensorProto.STRING
    m = model([node], [(n, types[n], None) for n in node.input], [("y", F, None)])
    for optimize in (True, False):
        with pytest.raises(KernelError, match=f"(?s)bad.*{fragment}") as info:
            onnx_mini.prepare(m, optimize=optimize).run(feeds)
        assert "[inputs: " in str(info.value)


# -- kernels' shortcuts ----------------------------------------------------------------------------

def test_binary_kernel():
    add = add_7()
    out = add(np.float32(1.5) * np.ones((), np.float32), np.array(2.0, np.float32))
    assert out.__class__ is np.ndarray and out.shape == () and out.dtype == np.float32 and out == 3.5
    np.testing.assert_array_equal(add(np.ones((2, 1), np.int64), np.arange(3)), [[1, 2, 3], [1, 2, 3]])
    with pytest.raises(onnx_mini.errors.InvalidValueError, match="same element type"):
        add(np.ones(2, np.float32), np.ones(2, np.float64))


def test_unary_compute_wrapper():
    neg = float32_compute(np.negative)
    out = neg(np.array(2.0, np.float32))
    assert out.__class__ is np.ndarray and out.shape == () and out == -2.0
    half = neg(np.array([1.5, -0.25], np.float16))
    assert half.dtype == np.float16 and half.tolist() == [-1.5, 0.25]
    with pytest.raises(onnx_mini.errors.InvalidValueError, match="string tensor of shape \\[1\\]"):
        neg(np.array(["a"], object))
    two = float32_compute(lambda x, y: x + y)          # more than one input: the general wrapper
    assert two(np.array([1.0], np.float16), np.array([2.0], np.float16)).dtype == np.float16


def test_shape_results_are_fresh_arrays():
    shape = shape_15(start=-1)
    a = shape(np.ones((2, 3), np.float32))
    a[0] = 99                                            # the caller's array: theirs to write
    np.testing.assert_array_equal(shape(np.ones((2, 3), np.float32)), [3])
    np.testing.assert_array_equal(shape(np.ones((4, 5, 6), np.float32)), [6])
    assert shape(np.ones((), np.float32)).dtype == np.int64 and shape(np.ones(())).shape == (0,)


def test_reshape_checks():
    reshape = reshape_14()
    x = np.arange(6, dtype=np.float32)
    assert reshape(x, np.array([2, -1], np.int64)).shape == (2, 3)
    assert reshape(x.reshape(1, 6), np.array([0, -1], np.int64)).shape == (1, 6)     # 0 copies the dim
    assert reshape(np.ones(1, np.float32), np.array([], np.int64)).shape == ()
    with pytest.raises(onnx_mini.errors.InvalidValueError, match="int64"):
        reshape(x, np.array([2, 3], np.int32))
    with pytest.raises(onnx_mini.errors.InvalidValueError, match="invalid dimension"):
        reshape(x, np.array([-2, -3], np.int64))     # numpy would take -2 as the unknown dim


@pytest.mark.parametrize("shape, ishape, axis", [((2, 3), (2, 3), 0), ((4, 5, 6), (3, 5, 2), 1),
                                                 ((4, 5, 6), (4, 2, 6), -1), ((7,), (3,), 0)])
def test_gather_elements_on_constant_indices(shape, ishape, axis):
    rng = np.random.default_rng(len(shape) + axis)
    data = rng.standard_normal(shape).astype(np.float32)
    n = shape[axis]
    indices = rng.integers(-n, n, ishape)
    fixed = gather_elements_11(axis=axis, _constants={1: indices})
    # out[i][j][k] = data[i][idx][k] on the axis, negative indices counted from the end
    want = np.empty(ishape, np.float32)
    a = axis % len(shape)
    for pos in np.ndindex(*ishape):
        src = list(pos)
        src[a] = indices[pos] % n
        want[pos] = data[tuple(src)]
    np.testing.assert_array_equal(fixed(data, indices), want)
    np.testing.assert_array_equal(fixed(np.asfortranarray(data), indices), want)   # not contiguous
    np.testing.assert_array_equal(fixed(data, indices.copy()), want)               # a fed index array


def test_gather_elements_on_constant_indices_of_large_strided_data():
    # data above the small size and not contiguous: the general path (no copy of the whole of it)
    data = np.arange(3 * 5000, dtype=np.float32).reshape(5000, 3).T          # [3, 5000], data[r, c] = 3c + r
    indices = np.array([[2, 0, -1], [1, 1, 0]], np.int64)
    fixed = gather_elements_11(axis=0, _constants={1: indices})
    want = [[2.0, 3.0, 8.0], [1.0, 4.0, 6.0]]                               # data[idx[i, j] % 3, j]
    for d in (data, np.ascontiguousarray(data), data):
        np.testing.assert_array_equal(fixed(d, indices), want)


def test_gather_elements_on_constant_indices_reports_bad_values():
    indices = np.array([[0, 2], [1, -3]], np.int64)
    fixed = gather_elements_11(axis=0, _constants={1: indices})
    with pytest.raises(onnx_mini.errors.InvalidValueError, match=r"index -3 is out of bounds .*\[-2, 1\]"):
        fixed(np.ones((2, 2), np.float32), indices)
    np.testing.assert_array_equal(fixed(np.arange(6.0).reshape(3, 2), indices), [[0.0, 5.0], [2.0, 1.0]])
    with pytest.raises(onnx_mini.errors.InvalidValueError, match="rank"):
        fixed(np.ones(4, np.float32), indices)


def test_in_place_wrapper_passes_tiny_tensors_to_the_kernel():
    calls = []

    def in_place(a, b, out):
        calls.append(1)
        return np.add(a, b, out=out)
    add = inplace.wrap(in_place, add_7(), (0,), 2)
    out = add(np.ones((2, 3), np.float32), np.full((2, 3), 0.5, np.float32))
    np.testing.assert_array_equal(out, np.full((2, 3), 1.5, np.float32))
    assert calls == []
    with pytest.raises(onnx_mini.errors.InvalidValueError, match="same element type"):
        add(np.ones(inplace.MIN_SIZE, np.float32), np.ones(inplace.MIN_SIZE, np.float64))
    assert calls == []


# -- HardSigmoid, HardSwish ------------------------------------------------------------------------

def test_hard_sigmoid_and_hard_swish_values():
    x = np.array([-4.0, -2.5, -0.5, 0.0, 1.0, 2.5, 3.0, np.inf, -np.inf, np.nan], np.float32)
    alpha = np.float32(0.2)
    # max(0, min(1, alpha x + beta)), alpha x and + beta each rounded to float32
    want = np.array([0.0, 0.0, np.float32(0.5) - alpha / 2, 0.5,
                     np.float32(alpha + np.float32(0.5)), 1.0, 1.0, 1.0, 0.0, np.nan], np.float32)
    np.testing.assert_array_equal(hard_sigmoid_6()(x), want)
    # x * max(0, min(1, x / 6 + 0.5)): 0 below -3, x above 3
    with np.errstate(invalid="ignore"):
        sw = hard_swish_14()(x)
        half = hard_swish_14()(x.astype(np.float16))     # computed in float32, rounded once
    np.testing.assert_array_equal(sw[[0, 6, 7, 9]], np.array([0.0, 3.0, np.inf, np.nan], np.float32))
    assert sw[4] == np.float32(np.float32(np.float32(1 / 6) + np.float32(0.5)))
    assert np.isnan(sw[8])                               # -inf * 0
    assert half.dtype == np.float16
    np.testing.assert_array_equal(half, sw.astype(np.float16))
    big = np.random.default_rng(0).standard_normal((1, 8, 16, 16)).astype(np.float32) * 4
    np.testing.assert_array_equal(hard_swish_14()(big), big * np.clip(big * np.float32(1 / 6) + np.float32(0.5), 0, 1))
