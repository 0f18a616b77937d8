"""Spec tests for TopK (1, 10, 11, 24), CumSum (11, 14) and CumProd (26).

Expected values are hand-written or computed by plain loops transcribed from the spec text.
"""
from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

from onnx_mini.errors import InvalidNodeError, KernelError, OnnxMiniError

from helpers import NODE, assert_same, i64, np_type, run_node, small, type_matrix


# -- TopK ----------------------------------------------------------------------------------------

def topk_ref(x: np.ndarray, k: int, axis: int, largest: bool):
    """Per row along axis: sort the (value, index) pairs by value (desc for largest), ties by index."""
    xm = np.moveaxis(x, axis, -1)
    vals = np.empty(xm.shape[:-1] + (k,), x.dtype)
    idx = np.empty(xm.shape[:-1] + (k,), np.int64)
    for pos in np.ndindex(*xm.shape[:-1]):
        row = [float(v) for v in xm[pos]]
        order = sorted(range(len(row)), key=lambda i: ((-row[i] if largest else row[i]), i))[:k]
        idx[pos] = order
        vals[pos] = xm[pos][order]
    return np.moveaxis(vals, -1, axis), np.moveaxis(idx, -1, axis)


def topk(version, x, k, **attrs):
    if version == 1:
        return run_node("TopK", 1, [x], 2, k=k, **attrs)
    return run_node("TopK", version, [x, i64([k])], 2, **attrs)


TOPK_VERSIONS = [1, 10, 11, 24]


@pytest.mark.parametrize("version,tname", type_matrix("TopK", TOPK_VERSIONS))
def test_top_k_every_type(version, tname):
    x = small(tname, (3, 5), seed=1)
    values, indices = topk(version, x, 3)
    ev, ei = topk_ref(x, 3, 1, True)
    assert_same(values, ev)
    assert_same(indices, ei)


@pytest.mark.parametrize("version", [11, 24])
@pytest.mark.parametrize("tname", ["float", "int32", "uint8", "float16"])
@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("axis", [0, 1, -1, -3])
def test_top_k_axes_and_smallest(version, tname, largest, axis):
    x = small(tname, (4, 5, 6), seed=2)  # many ties: values in 7 levels
    values, indices = topk(version, x, 2, axis=axis, largest=largest)
    ev, ei = topk_ref(x, 2, axis % 3, bool(largest))
    assert_same(values, ev)
    assert_same(indices, ei)


def test_top_k_ties_keep_the_lower_index_first():
    x = np.array([[3, 1, 3, 2, 3, 1]], dtype=np.float32)
    v, i = topk(11, x, 4)
    assert_same(v, np.array([[3, 3, 3, 2]], np.float32))
    assert_same(i, i64([[0, 2, 4, 3]]))
    v, i = topk(11, x, 3, largest=0)
    assert_same(v, np.array([[1, 1, 2]], np.float32))
    assert_same(i, i64([[1, 5, 3]]))


@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("k", [1, 5, 40])
def test_top_k_long_rows_with_ties(largest, k):
    """Rows long enough for the partition path: few distinct values, so the k-th value is tied."""
    x = (np.random.default_rng(3).integers(0, 9, size=(3, 400)) * 0.5).astype(np.float32)
    for sorted_ in (1, 0):
        v, i = topk(11, x, k, largest=largest, sorted=sorted_)
        ev, ei = topk_ref(x, k, 1, bool(largest))
        if not sorted_:  # order unspecified: same set of (index, value) pairs
            order = np.argsort(i, axis=1)
            v, i = np.take_along_axis(v, order, 1), np.take_along_axis(i, order, 1)
            order = np.argsort(ei, axis=1)
            ev, ei = np.take_along_axis(ev, order, 1), np.take_along_axis(ei, order, 1)
        assert_same(v, ev)
        assert_same(i, ei)


def test_top_k_bfloat16_and_uint64():
    x = np.array([[1.5, -2, 4, 4, 0.5]], dtype=ml_dtypes.bfloat16)
    v, i = topk(24, x, 3)
    assert_same(v, np.array([[4, 4, 1.5]], dtype=ml_dtypes.bfloat16))
    assert_same(i, i64([[2, 3, 0]]))
    big = np.array([2**64 - 1, 0, 2**63, 5], dtype=np.uint64)
    v, i = topk(11, big, 2)
    assert_same(v, np.array([2**64 - 1, 2**63], np.uint64))
    assert_same(i, i64([0, 2]))


def test_top_k_nan_counts_as_largest():
    x = np.array([1.0, np.nan, 3.0, -1.0], dtype=np.float32)
    v, i = topk(11, x, 2)
    assert np.isnan(v[0]) and v[1] == 3 and i.tolist() == [1, 2]
    v, i = topk(11, x, 2, largest=0)
    assert_same(v, np.array([-1, 1], np.float32))
    assert_same(i, i64([3, 0]))


@pytest.mark.parametrize("version", TOPK_VERSIONS)
def test_top_k_zero_and_full(version):
    x = np.array([[2, 7, 1]], dtype=np.float32)
    v, i = topk(version, x, 0)
    assert_same(v, np.zeros((1, 0), np.float32))
    assert_same(i, np.zeros((1, 0), np.int64))
    v, i = topk(version, x, 3)
    assert_same(v, np.array([[7, 2, 1]], np.float32))
    assert_same(i, i64([[1, 0, 2]]))
    v, i = topk(version, np.zeros((0, 3), np.float32), 2)
    assert_same(v, np.zeros((0, 2), np.float32))
    assert_same(i, np.zeros((0, 2), np.int64))


@pytest.mark.parametrize("version", [10, 11, 24])
def test_top_k_k_larger_than_axis_is_an_error(version):
    with pytest.raises(KernelError, match=re.compile(rf"'{NODE}'.*k = 4 .*size 3", re.S)):
        run_node("TopK", version, [np.zeros((2, 3), np.float32), i64([4])], 2)


def test_top_k_bad_k_and_axis():
    with pytest.raises(KernelError, match="k = -1"):
        run_node("TopK", 11, [np.zeros((2, 3), np.float32), i64([-1])], 2)
    with pytest.raises(KernelError, match="one value"):
        run_node("TopK", 11, [np.zeros((2, 3), np.float32), i64([1, 2])], 2)
    with pytest.raises(KernelError, match="axis 2"):
        run_node("TopK", 11, [np.zeros((2, 3), np.float32), i64([1])], 2, axis=2)
    with pytest.raises(OnnxMiniError, match=re.compile("k = 5|size 3", re.I)):
        run_node("TopK", 1, [np.zeros((2, 3), np.float32)], 2, k=5)
    with pytest.raises(InvalidNodeError, match="k"):
        run_node("TopK", 1, [np.zeros((2, 3), np.float32)], 2)  # k attribute is required


# -- CumSum, CumProd -----------------------------------------------------------------------------

def cumulative_ref(x: np.ndarray, axis: int, exclusive: bool, reverse: bool, prod: bool) -> np.ndarray:
    """y[j] = op of x[i] over i <= j (i < j if exclusive), or i >= j (i > j) if reverse, as float64."""
    xm = np.moveaxis(x.astype(np.float64), axis, -1)
    y = np.empty_like(xm)
    n = xm.shape[-1]
    for j in range(n):
        lo, hi = (j + 1 if exclusive else j, n) if reverse else (0, j if exclusive else j + 1)
        part = xm[..., lo:hi]
        y[..., j] = part.prod(-1) if prod else part.sum(-1)
    return np.moveaxis(y, -1, axis)


CUM_CASES = [(op, v, t) for op, vs in (("CumSum", [11, 14]), ("CumProd", [26]))
             for v, t in ((p.values[0], p.values[1]) for p in type_matrix(op, vs))]


@pytest.mark.parametrize("op,version,tname", CUM_CASES)
@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumulative_every_type(op, version, tname, exclusive, reverse):
    x = small(tname, (2, 4), seed=4)
    if tname.startswith("uint") or op == "CumProd":
        x = (np.abs(small("int32", (2, 4), seed=4)) + (1 if op == "CumProd" else 0)).astype(np_type(tname))
    for axis_dtype in (np.int32, np.int64):
        got = run_node(op, version, [x, np.array(1, dtype=axis_dtype)], exclusive=exclusive,
                       reverse=reverse)
        exp = cumulative_ref(x, 1, exclusive, reverse, op == "CumProd").astype(x.dtype)
        assert_same(got, exp)


def test_cumsum_spec_example():
    x = np.array([1, 2, 3], dtype=np.float32)
    for (ex, rev), exp in {(0, 0): [1, 3, 6], (1, 0): [0, 1, 3], (0, 1): [6, 5, 3], (1, 1): [5, 3, 0]}.items():
        got = run_node("CumSum", 14, [x, np.array(0, np.int32)], exclusive=ex, reverse=rev)
        assert_same(got, np.array(exp, np.float32))


def test_cumprod_spec_example():
    x = np.array([1, 2, 3], dtype=np.int64)
    for (ex, rev), exp in {(0, 0): [1, 2, 6], (1, 0): [1, 1, 2], (0, 1): [6, 6, 3], (1, 1): [6, 3, 1]}.items():
        got = run_node("CumProd", 26, [x, np.array(0, np.int64)], exclusive=ex, reverse=rev)
        assert_same(got, i64(exp))


@pytest.mark.parametrize("op,version", [("CumSum", 11), ("CumSum", 14), ("CumProd", 26)])
@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
def test_cumulative_axes_3d(op, version, axis):
    x = (np.arange(24, dtype=np.float64).reshape(2, 3, 4) % 5) * 0.5 + 0.5
    for ex, rev in [(0, 0), (1, 1)]:
        got = run_node(op, version, [x, np.array(axis, np.int64)], exclusive=ex, reverse=rev)
        np.testing.assert_allclose(got, cumulative_ref(x, axis % 3, ex, rev, op == "CumProd"), rtol=1e-12)
        assert got.dtype == np.float64 and got.shape == x.shape


def test_cumulative_integers_keep_their_type_and_wrap():
    x = np.array([2**31 - 1, 1, 1], dtype=np.int32)
    assert_same(run_node("CumSum", 14, [x, np.array(0, np.int32)]),
                np.array([2**31 - 1, -2**31, -2**31 + 1], np.int32))
    u = np.array([2**32 - 1, 2], dtype=np.uint32)
    assert_same(run_node("CumProd", 26, [u, np.array(0, np.int32)]),
                np.array([2**32 - 1, 2**32 - 2], np.uint32))


def test_cumulative_low_precision_rounds_once():
    # float16: 2048 + 1 + 1 is 2050 in float32, but 2048 after each float16 rounding (2049 ties to 2048)
    x = np.array([2048, 1, 1], dtype=np.float16)
    assert_same(run_node("CumSum", 14, [x, np.array(0, np.int32)]), np.array([2048, 2048, 2050], np.float16))
    b = np.array([1.5, 2, -1], dtype=ml_dtypes.bfloat16)
    assert_same(run_node("CumProd", 26, [b, np.array(0, np.int32)], reverse=1),
                np.array([-3, -2, -1], dtype=ml_dtypes.bfloat16))


@pytest.mark.parametrize("op,version", [("CumSum", 14), ("CumProd", 26)])
def test_cumulative_empty(op, version):
    for shape, axis in [((0, 3), 0), ((0, 3), 1), ((2, 0), 1)]:
        x = np.zeros(shape, np.float32)
        for ex in (0, 1):
            assert_same(run_node(op, version, [x, np.array(axis, np.int32)], exclusive=ex), x)


@pytest.mark.parametrize("op,version", [("CumSum", 11), ("CumProd", 26)])
def test_cumulative_bad_axis(op, version):
    x = np.ones((2, 3), np.float32)
    with pytest.raises(KernelError, match=re.compile(rf"'{NODE}'.*axis 2 is out of range", re.S)):
        run_node(op, version, [x, np.array(2, np.int64)])
    with pytest.raises(KernelError, match="0-D"):
        run_node(op, version, [x, np.array([0, 1], np.int64)])
