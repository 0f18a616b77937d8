"""Reshape of a fed shape: the output shape is worked out once per (input shape, requested values) and
kept; every rule of the spec still holds at every call, errors included, and a Reshape to the input's
own shape gives the input itself (as Identity does), which the in-place stage must never write into
while the input is alive. GatherElements' lookup for small data on constant indices; Add's shortcut
for a constant second input (bench_core's 1000-node chain runs these four kernels)."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import onnx_mini
from onnx_mini import inplace
from onnx_mini.errors import InvalidValueError
from onnx_mini.executor import execute
from onnx_mini.inputs import bind_inputs
from onnx_mini.ops.math.elementwise import add_7
from onnx_mini.ops.tensor.gather import gather_elements_11
from onnx_mini.ops.tensor.reshape import reshape_5, reshape_14

from helpers import F, I64, init, model


def i64(*values):
    return np.array(values, np.int64)


def test_kept_shapes_follow_the_requested_values():
    reshape = reshape_14()
    x = np.arange(6, dtype=np.float32)
    for _ in range(2):                                  # the second round reads the kept shapes
        assert reshape(x, i64(2, 3)).shape == (2, 3)
        assert reshape(x, i64(3, 2)).shape == (3, 2)    # same bytes count, other values
        assert reshape(x, i64(3, -1)).shape == (3, 2)
        assert reshape(x, i64(-1)).shape == (6,)
        assert reshape(x.reshape(2, 3), i64(0, 3)).shape == (2, 3)     # 0 copies the input's dim
        assert reshape(x.reshape(3, 2), i64(0, -1)).shape == (3, 2)    # the same values, another input
        assert reshape(np.ones(1, np.float32), i64()).shape == ()
    np.testing.assert_array_equal(reshape(x, i64(3, 2)), [[0, 1], [2, 3], [4, 5]])


def test_allowzero_keeps_its_own_shapes():
    zero = reshape_14(allowzero=1)
    empty = np.ones((0, 3), np.float32)
    for _ in range(2):
        assert zero(empty, i64(3, 0)).shape == (3, 0)   # 0 is a dimension of size 0
        with pytest.raises(InvalidValueError, match=r"to \[3, 3\]"):
            reshape_14()(empty, i64(3, 0))               # without allowzero, 0 copies the input's 3
        with pytest.raises(InvalidValueError, match="both 0 and -1"):
            zero(empty, i64(0, -1))
    x = np.ones((2, 3), np.float32)
    with pytest.raises(InvalidValueError, match="6 elements"):
        zero(x, i64(0, 6))                              # not a copied dim: 0 * 6 != 6


@pytest.mark.parametrize("requested, message", [((2, -1, -1), "more than one -1"),
                                                 ((-2, -3), "invalid dimension"),
                                                 ((4, 2), "6 elements"),
                                                 ((0, 0, 0), "has rank 2"),
                                                 ((0, -1, 0), "has rank 2"),
                                                 ((4, -1), "cannot reshape")])
def test_errors_are_raised_at_every_call(requested, message):
    reshape = reshape_14()
    x = np.ones((2, 3), np.float32)
    for _ in range(3):                                  # nothing kept for a failing pair
        with pytest.raises(InvalidValueError, match=message):
            reshape(x, np.array(requested, np.int64))
    assert reshape(x, i64(6)).shape == (6,)


def test_the_shape_input_is_checked_after_a_kept_shape():
    reshape = reshape_14()
    x = np.ones((2, 3), np.float32)
    assert reshape(x, i64(3, 2)).shape == (3, 2)
    with pytest.raises(InvalidValueError, match="int64"):
        reshape(x, np.array([3, 2], np.int32))          # the same values in another type
    with pytest.raises(InvalidValueError, match="1-D"):
        reshape(x, i64(3, 2).reshape(1, 2))              # the same bytes, another rank


def test_same_shape_gives_the_input_and_other_shapes_views():
    reshape = reshape_14()
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert reshape(x, i64(2, 3)) is x
    assert reshape(x, i64(0, -1)) is x
    t = x.T                                             # not contiguous: still the input itself
    assert reshape(t, i64(3, 2)) is t
    flat = reshape(x, i64(-1))
    assert np.shares_memory(flat, x) and flat.tolist() == [0, 1, 2, 3, 4, 5]
    x[0, 0] = 7                                         # a view: it sees the input's values
    assert flat[0] == 7


def _same_shape_model():
    # a = x + c; r = Reshape(a, Shape(a)) (the input itself); y = r + c where r dies (an in-place
    # candidate); z = a * 2 after it, so a must still hold x + c
    nodes = [helper.make_node("Add", ["x", "c"], ["a"]),
             helper.make_node("Shape", ["a"], ["s"]),
             helper.make_node("Reshape", ["a", "s"], ["r"]),
             helper.make_node("Add", ["r", "c"], ["y"]),
             helper.make_node("Mul", ["a", "two"], ["z"])]
    return model(nodes, [("x", F, ["N"])], [("y", F, None), ("z", F, None)],
                 [init("c", np.float32(0.5)), init("two", np.float32(2.0))])


def test_in_place_never_writes_a_live_input_returned_by_reshape():
    n = inplace.MIN_SIZE * 2                            # large enough for the in-place form
    x = np.arange(n, dtype=np.float32) / 8
    plan = onnx_mini.prepare(_same_shape_model()).plan
    # the general plan (a run would take the one specialised to x's shape, where the Reshape is gone),
    # whose second Add may write into its first input
    assert [i.op_type for i in plan.infos] == ["Add", "Shape", "Reshape", "Add", "Mul"]
    assert hasattr(plan.steps[3][0], "regular")
    for _ in range(3):
        y, z = execute(plan, bind_inputs(plan, {"x": x}))
        np.testing.assert_array_equal(y, x + np.float32(1.0))      # x + 0.5 + 0.5, exact in float32
        np.testing.assert_array_equal(z, (x + np.float32(0.5)) * 2)
    np.testing.assert_array_equal(x, np.arange(n, dtype=np.float32) / 8)   # the caller's array untouched


def test_reshape_of_the_callers_array_to_its_own_shape_leaves_it_alone():
    # y = Reshape(x, Shape(x)) + 1 with x the caller's array: the result is a new array
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Reshape", ["x", "s"], ["r"]),
             helper.make_node("Add", ["r", "one"], ["y"])]
    m = model(nodes, [("x", F, ["N"])], [("y", F, None)], [init("one", np.float32(1.0))])
    x = np.zeros(inplace.MIN_SIZE * 2, np.float32)
    (y,) = onnx_mini.prepare(m, optimize=False).run({"x": x})
    assert not np.shares_memory(x, y) and (y == 1).all() and (x == 0).all()


def test_gather_elements_small_lookup_per_shape():
    indices = np.array([[1, -1, 0], [0, 0, -2]], np.int64)
    fixed = gather_elements_11(axis=0, _constants={1: indices})
    small = np.arange(6, dtype=np.float32).reshape(2, 3)
    tall = np.arange(12, dtype=np.float32).reshape(4, 3)
    for _ in range(2):
        # out[i, j] = data[idx[i, j] mod rows, j]
        np.testing.assert_array_equal(fixed(small, indices), [[3, 4, 2], [0, 1, 2]])
        np.testing.assert_array_equal(fixed(tall, indices), [[3, 10, 2], [0, 1, 8]])
        np.testing.assert_array_equal(fixed(np.asfortranarray(tall), indices), [[3, 10, 2], [0, 1, 8]])
        with pytest.raises(InvalidValueError, match=r"index -2 is out of bounds .*\[-1, 0\]"):
            fixed(np.ones((1, 3), np.float32), indices)
    out = fixed(small, indices)
    out[0, 0] = 99                                      # a new array: the next call is unaffected
    assert fixed(small, indices)[0, 0] == 3


def test_add_with_a_constant_second_input():
    c = np.array([[0.5, -1.0, 2.0], [4.0, 0.25, -8.0]], np.float32)
    add = add_7(_constants={1: c})
    x = np.array([[1.0, 2.0, 3.0], [-4.0, 5.0, 6.0]], np.float32)
    want = [[1.5, 1.0, 5.0], [0.0, 5.25, -2.0]]
    for _ in range(2):
        out = add(x, c)
        assert out.__class__ is np.ndarray and out.dtype == np.float32
        np.testing.assert_array_equal(out, want)
        assert not np.shares_memory(out, x) and not np.shares_memory(out, c)
    np.testing.assert_array_equal(add(np.ones((1, 3), np.float32), c), c + 1)         # broadcast, same rank
    np.testing.assert_array_equal(add(np.ones(3, np.float32), c), c + 1)              # lower rank
    np.testing.assert_array_equal(add(x, c.copy()), want)                             # a fed second input
    with pytest.raises(InvalidValueError, match="same element type"):
        add(x.astype(np.float64), c)
    with pytest.raises(InvalidValueError, match=r"shapes \[3, 3\] and \[2, 3\] do not broadcast"):
        add(np.ones((3, 3), np.float32), c)
    k = np.array([2**31 - 1, -5], np.int32)
    ints = add_7(_constants={1: k})
    np.testing.assert_array_equal(ints(np.array([1, 5], np.int32), k), [-(2**31), 0])   # wraps as int32
    scalar = add_7(_constants={1: np.array(1.5, np.float32)})                         # 0-d: the general path
    out = scalar(np.array(1.0, np.float32), np.array(1.5, np.float32))
    assert out.__class__ is np.ndarray and out.shape == () and out == 2.5


def test_add_with_a_constant_names_the_node_on_bad_shapes():
    nodes = [helper.make_node("Add", ["x", "c"], ["y"], name="bias_add")]
    m = model(nodes, [("x", F, ["N", 3])], [("y", F, None)], [init("c", np.ones((2, 3), np.float32))])
    sess = onnx_mini.prepare(m, optimize=False)
    np.testing.assert_array_equal(sess.run({"x": np.zeros((2, 3), np.float32)})[0], np.ones((2, 3)))
    with pytest.raises(onnx_mini.errors.KernelError, match=r"bias_add.*\[4, 3\] and \[2, 3\] do not broadcast"):
        sess.run({"x": np.zeros((4, 3), np.float32)})


def test_reshape_5_and_13_take_the_constant_shape_shortcut():
    fixed = i64(0, -1, 2)
    reshape = reshape_5(_constants={1: fixed})
    assert reshape.__name__ == "reshape_fixed"          # the output shape made once per input shape
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    for _ in range(2):
        np.testing.assert_array_equal(reshape(x, fixed), np.arange(12, dtype=np.float32).reshape(3, 2, 2))
        with pytest.raises(InvalidValueError, match="cannot reshape"):
            reshape(np.ones((3, 5), np.float32), fixed)   # 3 * ? * 2 = 15 has no integer answer
    assert reshape(np.ones((2, 0), np.float32), fixed).shape == (2, 0, 2)   # 0 copies the input's dim
    assert reshape(x, i64(4, 3)).shape == (4, 3)         # a fed shape: the general path
