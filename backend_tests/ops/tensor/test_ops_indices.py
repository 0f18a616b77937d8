"""Spec tests for NonZero (9, 13), OneHot (9, 11, 28), Unique (11, 28) and ReverseSequence (10, 28).

Expected values come from plain loops transcribed from the spec text, or are written by hand.
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import onnx.defs
import pytest

from onnx_mini.errors import InvalidNodeError

from helpers import NODE, assert_same, expect_kernel_error, i64, np_type, run_node, run_op as run, sample, type_matrix


def constraint_types(op: str, versions, param: str) -> list:
    """(version, type name) for every tensor type of the named type constraint."""
    out = []
    for v in versions:
        tc = next(t for t in onnx.defs.get_schema(op, v).type_constraints if t.type_param_str == param)
        out += [pytest.param(v, t[len("tensor("):-1], id=f"v{v}-{t[7:-1]}") for t in tc.allowed_type_strs]
    return out


# -- NonZero -------------------------------------------------------------------------------------

NONZERO_VERSIONS = [9, 13]


def nonzero_ref(x: np.ndarray) -> np.ndarray:
    """Coordinates (rank, nnz) of the elements that are not zero (not False, not ""), row-major order."""
    coords = [pos for pos in np.ndindex(*x.shape) if bool(x[pos])]
    return np.array(coords, dtype=np.int64).reshape(len(coords), x.ndim).T.copy()


@pytest.mark.parametrize("version,tname", type_matrix("NonZero", NONZERO_VERSIONS))
@pytest.mark.parametrize("shape", [(3, 4), (2, 3, 2), (7,)])
def test_nonzero_every_type(version, tname, shape):
    x = sample(tname, shape)
    x.reshape(-1)[::3] = "" if tname == "string" else np.zeros(1, x.dtype)[0]  # every third is zero
    expected = nonzero_ref(x)
    assert 0 < expected.shape[1] < x.size
    assert_same(run("NonZero", version, [x]), expected)


@pytest.mark.parametrize("version", NONZERO_VERSIONS)
def test_nonzero_hand_examples(version):
    x = np.array([[1, 0], [1, 1]], np.int32)
    assert_same(run("NonZero", version, [x]), i64([[0, 1, 1], [0, 0, 1]]))
    x = np.array([np.nan, 0.0, -0.0, 2.0, np.inf], np.float32)  # NaN is not zero, -0 is
    assert_same(run("NonZero", version, [x]), i64([[0, 3, 4]]))
    x = np.array(["", "a", "", "0"], dtype=object)
    assert_same(run("NonZero", version, [x]), i64([[1, 3]]))


@pytest.mark.parametrize("version", NONZERO_VERSIONS)
@pytest.mark.parametrize("value,n", [(3.0, 1), (0.0, 0)])
def test_nonzero_scalar(version, value, n):
    # the spec: a scalar gives shape (0, N), not numpy's (1, N)
    assert_same(run("NonZero", version, [np.array(value, np.float32)]), np.zeros((0, n), np.int64))


@pytest.mark.parametrize("version", NONZERO_VERSIONS)
@pytest.mark.parametrize("shape", [(0,), (2, 0, 3), (3, 4)])
def test_nonzero_empty_results(version, shape):
    assert_same(run("NonZero", version, [np.zeros(shape, np.int64)]), np.zeros((len(shape), 0), np.int64))


# -- OneHot --------------------------------------------------------------------------------------

ONEHOT_VERSIONS = [9, 11, 28]


def one_hot_ref(indices, depth: int, values, axis: int, negative: bool = True) -> np.ndarray:
    """output[.., j (at axis), ..] = on if int(indices[..]) (+depth if negative, 11+) == j, else off."""
    r = indices.ndim
    a = axis + r + 1 if axis < 0 else axis
    shape = indices.shape[:a] + (depth,) + indices.shape[a:]
    out = np.empty(shape, dtype=values.dtype)
    for pos in np.ndindex(*shape):
        k = int(indices[pos[:a] + pos[a + 1:]])
        if negative and -depth <= k < 0:
            k += depth
        out[pos] = values[1] if k == pos[a] else values[0]
    return out


def onehot_values(tname: str) -> np.ndarray:
    if tname == "string":
        return np.array(["off", "on"], dtype=object)
    if tname == "bool":
        return np.array([False, True])
    return np.array([2, 5]).astype(np_type(tname))


@pytest.mark.parametrize("version,tname", constraint_types("OneHot", ONEHOT_VERSIONS, "T3"))
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot_every_value_type(version, tname, axis):
    values = onehot_values(tname)
    indices = i64([[0, 3], [2, 1], [4, 3]])
    out = run("OneHot", version, [indices, np.array(4, np.int64), values], axis=axis)
    assert_same(out, one_hot_ref(indices, 4, values, axis))


@pytest.mark.parametrize("version,tname", constraint_types("OneHot", ONEHOT_VERSIONS, "T1"))
def test_one_hot_every_index_type(version, tname):
    indices = np.array([[1, 0, 3], [2, 2, 0]]).astype(np_type(tname))
    values = np.array([0, 1], np.float32)
    out = run("OneHot", version, [indices, np.array(3, np.int32), values])
    assert_same(out, one_hot_ref(indices.astype(np.int64), 3, values, -1))  # index 3 is out of range


@pytest.mark.parametrize("version,tname", constraint_types("OneHot", ONEHOT_VERSIONS, "T2"))
@pytest.mark.parametrize("shape", [(), (1,)])
def test_one_hot_every_depth_type(version, tname, shape):
    indices = i64([0, 2, 3, 1])
    values = np.array([-1, 7], np.int32)
    depth = np.full(shape, 3).astype(np_type(tname))
    assert_same(run("OneHot", version, [indices, depth, values]), one_hot_ref(indices, 3, values, -1))


@pytest.mark.parametrize("version", ONEHOT_VERSIONS)
@pytest.mark.parametrize("depth", [np.float32(3.7), np.float64(3.2), np.float16(3.9)])
def test_one_hot_non_integer_depth_is_truncated(version, depth):
    values = np.array([0, 1], np.int64)
    out = run("OneHot", version, [i64([2, 0, 3]), np.array(depth), values])
    assert_same(out, i64([[0, 0, 1], [1, 0, 0], [0, 0, 0]]))


@pytest.mark.parametrize("version", ONEHOT_VERSIONS)
def test_one_hot_non_integer_indices_are_truncated(version):
    indices = np.array([1.7, 0.2, 2.9, np.nan, -0.5], np.float32)
    out = run("OneHot", version, [indices, np.array(3, np.int64), np.array([0, 1], np.int8)])
    assert_same(out, np.array([[0, 1, 0], [1, 0, 0], [0, 0, 1], [0, 0, 0], [1, 0, 0]], np.int8))


@pytest.mark.parametrize("version", ONEHOT_VERSIONS)
def test_one_hot_negative_and_out_of_range_indices(version):
    indices = i64([0, -1, -5, -6, 5, 7])
    values = np.array([1, 3], np.float32)
    out = run("OneHot", version, [indices, np.array(5.0, np.float32), values], axis=1)
    if version >= 11:  # [-depth, -1] counts from the end; the rest of [-depth, depth-1] is all-off
        expected = [[3, 1, 1, 1, 1], [1, 1, 1, 1, 3], [3, 1, 1, 1, 1]] + [[1] * 5] * 3
    else:              # 9: only [0, depth) is on
        expected = [[3, 1, 1, 1, 1]] + [[1] * 5] * 5
    assert_same(out, np.array(expected, np.float32))
    assert_same(out, one_hot_ref(indices, 5, values, 1, negative=version >= 11))


@pytest.mark.parametrize("version", ONEHOT_VERSIONS)
@pytest.mark.parametrize("ishape,axis", [((), 0), ((), -1)] +
                         [((2, 3, 4), a) for a in range(-4, 4)] + [((0, 3), 1), ((3,), -2)])
def test_one_hot_axes(version, ishape, axis):
    rng = np.random.default_rng(len(ishape) + axis + 10)
    indices = np.asarray(rng.integers(-2, 6, size=ishape)).astype(np.int32)
    values = np.array([0.5, -1.5], np.float64)
    out = run("OneHot", version, [indices, np.array(5, np.uint8), values], axis=axis)
    assert_same(out, one_hot_ref(indices, 5, values, axis, negative=version >= 11))


@pytest.mark.parametrize("version", ONEHOT_VERSIONS)
def test_one_hot_errors(version):
    values = np.array([0, 1], np.float32)
    expect_kernel_error("OneHot", version, [i64([0]), np.array(3), values], "axis", axis=2)
    expect_kernel_error("OneHot", version, [i64([0]), np.array(3), values], "axis", axis=-3)
    expect_kernel_error("OneHot", version, [i64([0]), i64([3, 4]), values], "depth")
    expect_kernel_error("OneHot", version, [i64([0]), np.array(-2), values], "depth")
    expect_kernel_error("OneHot", version, [i64([0]), np.array(3), np.ones(3, np.float32)], "values")


def test_one_hot_bfloat16_values():  # bfloat16 values appear in OneHot-28
    version = 28
    values = np.array([1, 3], ml_dtypes.bfloat16)
    out = run("OneHot", version, [i64([0, 2]), np.array(4, np.float32), values], axis=1)
    assert_same(out, np.array([[3, 1, 1, 1], [1, 1, 3, 1]], ml_dtypes.bfloat16))


# -- Unique --------------------------------------------------------------------------------------

UNIQUE_VERSIONS = [11, 28]


def _key(v):
    """Sort key for one element: NaN after every number and equal to itself."""
    if isinstance(v, (float, np.floating)) and math.isnan(v):
        return (1, 0)
    if isinstance(v, (complex, np.complexfloating)):
        return (0, (v.real, v.imag))
    return (0, v)


def unique_ref(x: np.ndarray, axis, is_sorted: bool):
    """Plain loops: slices along axis (or elements) in order of first occurrence, then sorted
    lexicographically if asked; -> (Y, indices, inverse_indices, counts)."""
    if axis is None:
        slices = [x.reshape(-1)[i] for i in range(x.size)]
        keyf = lambda s: (_key(s),)  # noqa: E731
    else:
        slices = [np.take(x, i, axis=axis) for i in range(x.shape[axis])]
        keyf = lambda s: tuple(_key(v) for v in s.reshape(-1).tolist())  # noqa: E731
    firsts, inverse, keys = [], [], []
    for i, s in enumerate(slices):
        k = keyf(s)
        if k not in keys:
            keys.append(k)
            firsts.append(i)
        inverse.append(keys.index(k))
    counts = [inverse.count(g) for g in range(len(keys))]
    order = sorted(range(len(keys)), key=lambda g: keys[g]) if is_sorted else list(range(len(keys)))
    rank = {g: r for r, g in enumerate(order)}
    first = [firsts[g] for g in order]
    y = x.reshape(-1)[first] if axis is None else np.take(x, first, axis=axis)
    return y, i64(first), i64([rank[g] for g in inverse]), i64([counts[g] for g in order])


def unique_sample(tname: str) -> np.ndarray:
    """Values with repeats, not in order, of the given type."""
    base = sample(tname, (6,))
    return base[[3, 1, 1, 5, 0, 3, 2, 5, 4]].copy()


@pytest.mark.parametrize("version,tname", type_matrix("Unique", UNIQUE_VERSIONS))
@pytest.mark.parametrize("is_sorted", [0, 1])
def test_unique_every_type(version, tname, is_sorted):
    x = unique_sample(tname).reshape(3, 3)
    outs = run_node("Unique", version, [x], n_outputs=4, sorted=is_sorted)
    for got, exp in zip(outs, unique_ref(x, None, bool(is_sorted))):
        assert_same(got, exp)


@pytest.mark.parametrize("version,tname", type_matrix("Unique", UNIQUE_VERSIONS))
@pytest.mark.parametrize("is_sorted", [0, 1])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_unique_axis_every_type(version, tname, is_sorted, axis):
    x = sample(tname, (4, 3))[[2, 0, 2, 1]].copy()        # row 2 twice
    x = x if axis == 0 else x.T.copy()
    outs = run_node("Unique", version, [x], n_outputs=4, sorted=is_sorted, axis=axis)
    for got, exp in zip(outs, unique_ref(x, axis % 2, bool(is_sorted))):
        assert_same(got, exp)


@pytest.mark.parametrize("version", UNIQUE_VERSIONS)
def test_unique_spec_examples(version):
    x = np.array([2, 1, 1, 3, 4, 3], np.float32)
    outs = run_node("Unique", version, [x], n_outputs=4, sorted=0)
    for got, exp in zip(outs, [np.array([2, 1, 3, 4], np.float32), i64([0, 1, 3, 4]), i64([0, 1, 1, 2, 3, 2]),
                               i64([1, 2, 2, 1])]):
        assert_same(got, exp)
    outs = run_node("Unique", version, [np.array([[1, 3], [2, 3]], np.float32)], n_outputs=4)
    for got, exp in zip(outs, [np.array([1, 2, 3], np.float32), i64([0, 2, 1]), i64([0, 2, 1, 2]), i64([1, 1, 2])]):
        assert_same(got, exp)
    x = np.array([[1, 0, 0], [1, 0, 0], [2, 3, 4]], np.int64)
    outs = run_node("Unique", version, [x], n_outputs=4, sorted=1, axis=0)
    for got, exp in zip(outs, [i64([[1, 0, 0], [2, 3, 4]]), i64([0, 2]), i64([0, 0, 1]), i64([2, 1])]):
        assert_same(got, exp)
    x = np.array([[[1, 1], [0, 1], [2, 1], [0, 1]], [[1, 1], [0, 1], [2, 1], [0, 1]]], np.float32)
    outs = run_node("Unique", version, [x], n_outputs=4, sorted=1, axis=1)
    for got, exp in zip(outs, [np.array([[[0, 1], [1, 1], [2, 1]], [[0, 1], [1, 1], [2, 1]]], np.float32),
                               i64([1, 0, 2]), i64([1, 0, 2, 0]), i64([2, 1, 1])]):
        assert_same(got, exp)


@pytest.mark.parametrize("version", UNIQUE_VERSIONS)
@pytest.mark.parametrize("is_sorted", [0, 1])
@pytest.mark.parametrize("axis", [None, 0, 1, 2, -2])
def test_unique_random_3d(version, is_sorted, axis):
    rng = np.random.default_rng(3 if axis is None else axis + 10)
    x = rng.integers(0, 2, size=(2, 5, 3)).astype(np.int16)
    x = np.concatenate([x, x[:, :2]], axis=1)              # repeated slices along axis 1
    attrs = {} if axis is None else {"axis": axis}
    outs = run_node("Unique", version, [x], n_outputs=4, sorted=is_sorted, **attrs)
    for got, exp in zip(outs, unique_ref(x, None if axis is None else axis % 3, bool(is_sorted))):
        assert_same(got, exp)


@pytest.mark.parametrize("version", UNIQUE_VERSIONS)
@pytest.mark.parametrize("is_sorted", [0, 1])
def test_unique_nan_and_strings(version, is_sorted):
    x = np.array([np.nan, 1.0, np.nan, -0.0, 0.0, 1.0], np.float64)  # NaNs are one value; -0 == 0
    outs = run_node("Unique", version, [x], n_outputs=4, sorted=is_sorted)
    expected = ([np.array([0.0, 1.0, np.nan]), i64([3, 1, 0]), i64([2, 1, 2, 0, 0, 1]), i64([2, 2, 2])]
                if is_sorted else
                [np.array([np.nan, 1.0, 0.0]), i64([0, 1, 3]), i64([0, 1, 0, 2, 2, 1]), i64([2, 2, 2])])
    for got, exp in zip(outs, expected):
        assert_same(got, exp)  # assert_array_equal: NaN equals NaN, -0 equals 0
    x = np.array(["b", "", "a", "b", "ab"], dtype=object)
    outs = run_node("Unique", version, [x], n_outputs=4, sorted=is_sorted)
    expected = ([np.array(["", "a", "ab", "b"], dtype=object), i64([1, 2, 4, 0]), i64([3, 0, 1, 3, 2]),
                 i64([1, 1, 1, 2])] if is_sorted else
                [np.array(["b", "", "a", "ab"], dtype=object), i64([0, 1, 2, 4]), i64([0, 1, 2, 0, 3]),
                 i64([2, 1, 1, 1])])
    for got, exp in zip(outs, expected):
        assert_same(got, exp)


@pytest.mark.parametrize("version", UNIQUE_VERSIONS)
@pytest.mark.parametrize("n_outputs", [1, 2, 3])
def test_unique_fewer_outputs(version, n_outputs):
    x = np.array([3, 1, 3, 2], np.uint8)
    outs = run_node("Unique", version, [x], n_outputs=n_outputs)
    outs = outs if n_outputs > 1 else (outs,)
    expected = [np.array([1, 2, 3], np.uint8), i64([1, 3, 0]), i64([2, 0, 2, 1])]
    assert len(outs) == n_outputs
    for got, exp in zip(outs, expected):
        assert_same(got, exp)


@pytest.mark.parametrize("version", UNIQUE_VERSIONS)
@pytest.mark.parametrize("shape,axis,yshape", [((0,), None, (0,)), ((2, 0), None, (0,)), ((0, 3), 0, (0, 3)),
                                               ((3, 0), 0, (1, 0)), ((), None, (1,))])
def test_unique_empty_and_scalar(version, shape, axis, yshape):
    x = np.full(shape, 4.5, np.float32)
    attrs = {} if axis is None else {"axis": axis}
    y, idx, inv, counts = run_node("Unique", version, [x], n_outputs=4, **attrs)
    assert_same(y, np.full(yshape, 4.5, np.float32))
    n = x.size if axis is None else x.shape[axis]
    assert_same(inv, np.zeros(n, np.int64))
    assert_same(idx, np.zeros(min(n, 1), np.int64))
    assert_same(counts, np.full(min(n, 1), n, np.int64))


@pytest.mark.parametrize("version", UNIQUE_VERSIONS)
def test_unique_errors(version):
    expect_kernel_error("Unique", version, [np.zeros((2, 3), np.float32)], "axis", axis=2)
    with pytest.raises(InvalidNodeError, match=NODE):
        run_node("Unique", version, [np.zeros(3, np.float32)], sorted=2)


# -- ReverseSequence -----------------------------------------------------------------------------

REVSEQ_VERSIONS = [10, 28]


def reverse_sequence_ref(x, lens, batch_axis, time_axis):
    """Slice i along batch_axis: its first lens[i] steps along time_axis reversed, the rest copied."""
    out = x.copy()
    for pos in np.ndindex(*x.shape):
        b, t = pos[batch_axis], pos[time_axis]
        if t < lens[b]:
            src = list(pos)
            src[time_axis] = lens[b] - 1 - t
            out[pos] = x[tuple(src)]
    return out


@pytest.mark.parametrize("version,tname", type_matrix("ReverseSequence", REVSEQ_VERSIONS))
@pytest.mark.parametrize("batch_axis,time_axis", [(1, 0), (0, 1)])
def test_reverse_sequence_every_type(version, tname, batch_axis, time_axis):
    x = sample(tname, (4, 3, 2) if batch_axis == 1 else (3, 4, 2))
    lens = i64([4, 1, 2])
    out = run("ReverseSequence", version, [x, lens], batch_axis=batch_axis, time_axis=time_axis)
    assert_same(out, reverse_sequence_ref(x, lens, batch_axis, time_axis))


@pytest.mark.parametrize("version", REVSEQ_VERSIONS)
def test_reverse_sequence_spec_examples(version):
    x = np.array([[0.0, 4.0, 8.0, 12.0], [1.0, 5.0, 9.0, 13.0], [2.0, 6.0, 10.0, 14.0], [3.0, 7.0, 11.0, 15.0]],
                 np.float32)
    out = run("ReverseSequence", version, [x, i64([4, 3, 2, 1])], time_axis=0, batch_axis=1)
    assert_same(out, np.array([[3.0, 6.0, 9.0, 12.0], [2.0, 5.0, 8.0, 13.0], [1.0, 4.0, 10.0, 14.0],
                               [0.0, 7.0, 11.0, 15.0]], np.float32))
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    out = run("ReverseSequence", version, [x, i64([1, 2, 3, 4])], time_axis=1, batch_axis=0)
    assert_same(out, np.array([[0, 1, 2, 3], [5, 4, 6, 7], [10, 9, 8, 11], [15, 14, 13, 12]], np.float32))


@pytest.mark.parametrize("version", REVSEQ_VERSIONS)
@pytest.mark.parametrize("batch_axis,time_axis", [(1, 0), (0, 1)])
@pytest.mark.parametrize("shape", [(5, 3), (5, 3, 2, 2), (0, 3), (5, 0, 2), (1, 1)])
def test_reverse_sequence_shapes(version, batch_axis, time_axis, shape):
    shape = shape if time_axis == 0 else (shape[1], shape[0]) + shape[2:]
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal(shape).astype(np.float32)
    lens = rng.integers(0, shape[time_axis] + 1, size=shape[batch_axis])
    out = run("ReverseSequence", version, [x, lens], batch_axis=batch_axis, time_axis=time_axis)
    assert_same(out, reverse_sequence_ref(x, lens, batch_axis, time_axis))


@pytest.mark.parametrize("version", REVSEQ_VERSIONS)
def test_reverse_sequence_errors(version):
    x = np.zeros((4, 3), np.float32)
    expect_kernel_error("ReverseSequence", version, [x, i64([1, 5, 2])], r"\b5\b")
    expect_kernel_error("ReverseSequence", version, [x, i64([1, -1, 2])], r"-1\b")
    expect_kernel_error("ReverseSequence", version, [x, i64([1, 2])], "sequence_lens")
    expect_kernel_error("ReverseSequence", version, [np.zeros(3, np.float32), i64([1])], "rank")
    for attrs in ({"batch_axis": 0, "time_axis": 0}, {"batch_axis": 2}, {"time_axis": -1, "batch_axis": 0}):
        with pytest.raises(InvalidNodeError, match=NODE):
            run_node("ReverseSequence", version, [x, i64([1, 1, 1])], **attrs)
