"""Spec tests for Trilu, Compress, Where, IsInf and IsNaN.

Expected values are hand-written or computed element by element from the spec's definitions.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from onnx_mini.errors import KernelError

from helpers import arange, assert_same, i64, np_type, raises_naming_node, run_node, sample, type_matrix, type_params

INT64_MAX, INT64_MIN = 2 ** 63 - 1, -2 ** 63


def zero(dtype):
    return np.array("", dtype=object) if dtype == object else np.zeros((), dtype)


# -- Trilu ---------------------------------------------------------------------------------------

def trilu_reference(x, k, upper):
    """Keep element (i, j) of each matrix when j - i >= k (upper) or j - i <= k (lower), else zero."""
    out = np.empty_like(x)
    for idx in np.ndindex(*x.shape):
        i, j = idx[-2:]
        out[idx] = x[idx] if ((j - i >= k) if upper else (j - i <= k)) else zero(x.dtype)
    return out


@pytest.mark.parametrize("version,tname", type_matrix("Trilu", [14]))
@pytest.mark.parametrize("upper", [0, 1])
def test_trilu_every_type(version, tname, upper):
    x = sample(tname, (2, 3, 4))
    assert_same(run_node("Trilu", version, [x], upper=upper), trilu_reference(x, 0, upper))
    assert_same(run_node("Trilu", version, [x, i64(1)], upper=upper), trilu_reference(x, 1, upper))


def test_trilu_hand_example():
    x = np.array([[4, 7, 3], [1, 2, 8], [9, 5, 6]], np.int64)
    assert_same(run_node("Trilu", 14, [x]), np.array([[4, 7, 3], [0, 2, 8], [0, 0, 6]], np.int64))
    assert_same(run_node("Trilu", 14, [x, i64(-1)], upper=0), np.array([[0, 0, 0], [1, 0, 0], [9, 5, 0]], np.int64))


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [-7, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, INT64_MAX, INT64_MIN])
@pytest.mark.parametrize("shape", [(3, 5), (5, 3), (4, 4), (1, 5), (2, 1, 3, 2), (0, 3), (3, 0), (0, 2, 2)])
def test_trilu_cases(upper, k, shape):
    x = arange(shape) + 1
    assert_same(run_node("Trilu", 14, [x, i64(k)], upper=upper), trilu_reference(x, k, upper))


def test_trilu_errors():
    with raises_naming_node(KernelError, "rank"):
        run_node("Trilu", 14, [arange((3,))])
    with raises_naming_node(KernelError, "single integer"):
        run_node("Trilu", 14, [arange((3, 3)), i64([1, 2])])


# -- Compress ------------------------------------------------------------------------------------

def compress_reference(x, condition, axis):
    """Keep index i along the axis (of the flattened input without axis) where condition[i]."""
    if axis is None:
        flat = x.reshape(-1)
        return np.array([flat[i] for i in range(flat.size) if i < len(condition) and condition[i]],
                        dtype=x.dtype).reshape(-1)
    a = axis % x.ndim
    keep = [i for i in range(x.shape[a]) if i < len(condition) and condition[i]]
    out_shape = list(x.shape)
    out_shape[a] = len(keep)
    out = np.empty(out_shape, dtype=x.dtype)
    for idx in np.ndindex(*out_shape):
        out[idx] = x[idx[:a] + (keep[idx[a]],) + idx[a + 1:]]
    return out


@pytest.mark.parametrize("version,tname", type_matrix("Compress", [9, 11, 28]))
def test_compress_every_type(version, tname):
    x = sample(tname, (3, 2))
    cond = np.array([False, True, True])
    assert_same(run_node("Compress", version, [x, cond], axis=0), compress_reference(x, cond, 0))
    cond = np.array([True, False, False, True])
    assert_same(run_node("Compress", version, [x, cond]), compress_reference(x, cond, None))


@pytest.mark.parametrize("version", [9, 11, 28])
@pytest.mark.parametrize("shape,cond,axis", [
    ((3, 2), [0, 1, 1], 0), ((3, 2), [0, 1], 0), ((3, 2), [1], 1), ((3, 2), [0, 1], 1), ((3, 2), [], 0),
    ((3, 2), [1, 0, 1, 0, 1, 1], None), ((3, 2), [1, 1, 1], None), ((3, 2), [1, 1, 0, 0], -1),
    ((3, 2), [0, 1, 1, 0], -2), ((2, 3, 2), [1, 0, 1], 1), ((0, 3), [1, 1], 1), ((0, 3), [], None),
    ((3, 2), [1, 0, 1, 0], 0),   # longer than the axis: allowed when the extra entries are False
])
def test_compress_cases(version, shape, cond, axis):
    if axis is not None and axis < 0 and version < 11:
        pytest.skip("negative axes from version 11")
    x = arange(shape) - 2
    cond = np.array(cond, dtype=bool)
    out = run_node("Compress", version, [x, cond], **({} if axis is None else {"axis": axis}))
    assert_same(out, compress_reference(x, cond, axis))


def test_compress_hand_example():
    x = np.array([[1, 2], [3, 4], [5, 6]], np.float32)
    assert_same(run_node("Compress", 11, [x, np.array([False, True, True])], axis=0),
                np.array([[3, 4], [5, 6]], np.float32))
    assert_same(run_node("Compress", 11, [x, np.array([False, True, False, False, True])]),
                np.array([2, 5], np.float32))


@pytest.mark.parametrize("cond,axis,pattern", [
    (np.array([1, 0, 1, 1], bool), 0, "index 3"), (np.array([0, 0, 1], bool), 1, "index 2"),
    (np.array([1, 0], np.int64), 0, "bool"), (np.zeros((2, 2), bool), 0, "1-D"),
    (np.zeros(7, bool), 2, "out of range"), (np.ones(7, bool), None, "index 6"),
])
def test_compress_errors(cond, axis, pattern):
    with raises_naming_node(KernelError, pattern):
        run_node("Compress", 11, [arange((3, 2)), cond], **({} if axis is None else {"axis": axis}))


# -- Where ---------------------------------------------------------------------------------------

def where_reference(c, x, y):
    shape = np.broadcast_shapes(c.shape, x.shape, y.shape)
    c, x, y = (np.broadcast_to(a, shape) for a in (c, x, y))
    out = np.empty(shape, dtype=x.dtype)
    for idx in np.ndindex(*shape):
        out[idx] = x[idx] if c[idx] else y[idx]
    return out


@pytest.mark.parametrize("version,tname", type_params("Where", [9, 16], "T"))
def test_where_every_type(version, tname):
    c = np.array([[True, False, True], [False, False, True]])
    x, y = sample(tname, (2, 3)), sample(tname, (3,))[::-1].copy()
    assert_same(run_node("Where", version, [c, x, y]), where_reference(c, x, y))


def test_where_hand_example():
    c = np.array([[True, False], [True, True]])
    x = np.array([[1, 2], [3, 4]], np.int64)
    y = np.array([[9, 8], [7, 6]], np.int64)
    assert_same(run_node("Where", 16, [c, x, y]), np.array([[1, 8], [3, 4]], np.int64))


@pytest.mark.parametrize("version", [9, 16])
@pytest.mark.parametrize("cs,xs,ys", [
    ((), (), ()), ((2, 3), (), ()), ((), (2, 3), (3,)), ((2, 1), (1, 3), (2, 3)), ((3,), (2, 1), ()),
    ((1, 2, 1), (3, 1, 1), (2, 4)), ((0, 3), (3,), ()), ((2, 0), (1,), (2, 1)),
])
def test_where_broadcasting(version, cs, xs, ys):
    c = np.asarray(arange(cs, np.int64) % 3 == 1)
    x, y = np.asarray(arange(xs) + 1), np.asarray(-arange(ys) - 1)
    assert_same(run_node("Where", version, [c, x, y]), where_reference(c, x, y))


@pytest.mark.parametrize("c,x,y,pattern", [
    (np.ones(3, bool), np.zeros(2, np.float32), np.zeros(3, np.float32), "broadcast"),
    (np.ones(3, bool), np.zeros(3, np.float32), np.zeros(3, np.float64), "same element type"),
    (np.ones(3, np.int64), np.zeros(3, np.float32), np.zeros(3, np.float32), "bool"),
])
def test_where_errors(c, x, y, pattern):
    with raises_naming_node(KernelError, pattern):
        run_node("Where", 16, [c, x, y])


# -- IsInf / IsNaN -------------------------------------------------------------------------------

SPECIALS = [np.inf, -np.inf, np.nan, 0.0, -0.5, 1.5, 448.0, -2.0]


def special_values(tname):
    """The SPECIALS in type tname (as float32 for comparisons): types without inf turn +-inf into
    NaN (fnuz, e4m3fn) or saturate; whatever the conversion gives is what the op must classify."""
    x = np.array(SPECIALS, np.float32).astype(np_type(tname))
    return x, x.astype(np.float32)


@pytest.mark.parametrize("version,tname", type_matrix("IsInf", [10, 20]))
@pytest.mark.parametrize("neg,pos", [(1, 1), (1, 0), (0, 1), (0, 0)])
def test_isinf_every_type(version, tname, neg, pos):
    x, f = special_values(tname)
    expected = np.array([(v == np.inf and pos) or (v == -np.inf and neg) for v in f.tolist()], bool)
    out = run_node("IsInf", version, [x], detect_negative=neg, detect_positive=pos)
    assert_same(out, expected)


def test_isinf_hand_values():
    x = np.array([-1.2, np.nan, np.inf, 2.8, -np.inf, np.inf], np.float32)
    assert_same(run_node("IsInf", 20, [x]), np.array([False, False, True, False, True, True]))
    assert_same(run_node("IsInf", 10, [x], detect_negative=0), np.array([False, False, True, False, False, True]))
    assert_same(run_node("IsInf", 10, [x], detect_positive=0), np.array([False, False, False, False, True, False]))
    # float8e5m2 has infinities; float8e4m3fn has none (inf converts to NaN)
    assert_same(run_node("IsInf", 20, [x.astype(ml_dtypes.float8_e5m2)]), np.array([0, 0, 1, 0, 1, 1], bool))
    assert_same(run_node("IsInf", 20, [x.astype(ml_dtypes.float8_e4m3fn)]), np.zeros(6, bool))


@pytest.mark.parametrize("version,tname", type_matrix("IsNaN", [9, 13, 20]))
def test_isnan_every_type(version, tname):
    x, f = special_values(tname)
    expected = np.array([v != v for v in f.tolist()], bool)
    assert_same(run_node("IsNaN", version, [x]), expected)


@pytest.mark.parametrize("op", ["IsInf", "IsNaN"])
@pytest.mark.parametrize("shape", [(), (0,), (2, 0, 3), (2, 3)])
def test_isinf_isnan_shapes(op, shape):
    x = np.full(shape, np.nan if op == "IsNaN" else -np.inf, np.float64)
    assert_same(run_node(op, 20, [x]), np.ones(shape, bool))
    assert_same(run_node(op, 20, [np.zeros(shape, np.float16)]), np.zeros(shape, bool))


def test_isnan_hand_values():
    x = np.array([-1.2, np.nan, np.inf, 2.8, -np.inf, np.nan], np.float16)
    assert_same(run_node("IsNaN", 13, [x.astype(ml_dtypes.bfloat16)]), np.array([0, 1, 0, 0, 0, 1], bool))
    assert_same(run_node("IsNaN", 9, [x]), np.array([0, 1, 0, 0, 0, 1], bool))
