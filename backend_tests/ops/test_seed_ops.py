"""Spec tests for the seed operators: Shape, Reshape, GatherElements, Constant, Identity, Add.

Every expected value is written by hand or computed by a plain formula transcribed from the ONNX
spec text; the type matrices come from the onnx schemas (type_constraints) of each version.
"""
from __future__ import annotations

import copy
import math
import re

import ml_dtypes
import numpy as np
import onnx.defs
import pytest
from onnx import AttributeProto, TensorProto, helper, numpy_helper

import onnx_mini
from onnx_mini.errors import KernelError, OnnxMiniError

from helpers import FP4, assert_same, elem_type, np_type, run_op as run, sample, type_matrix

def i64(values) -> np.ndarray:
    return np.array(values, dtype=np.int64)


# -- Shape ---------------------------------------------------------------------------------------

SHAPE_VERSIONS = [1, 13, 15, 19, 21, 23, 24, 25]


@pytest.mark.parametrize("version,tname", type_matrix("Shape", SHAPE_VERSIONS))
def test_shape_every_type(version, tname):
    assert_same(run("Shape", version, [sample(tname, (2, 3, 4))]), i64([2, 3, 4]))


SHAPE_CASES = [  # (input shape, start/end attributes (15+), expected)
    ((2, 3, 4), {}, [2, 3, 4]), ((), {}, []), ((0,), {}, [0]), ((2, 0, 3), {}, [2, 0, 3]), ((7,), {}, [7]),
    ((2, 3, 4), {"start": -1}, [4]), ((2, 3, 4), {"end": -1}, [2, 3]), ((2, 3, 4), {"start": 1, "end": 2}, [3]),
    ((2, 3, 4), {"start": -2, "end": -1}, [3]), ((2, 3, 4), {"start": 0, "end": 3}, [2, 3, 4]),
    # out-of-range axes are clamped to [0, r]; start > end gives an empty shape
    ((2, 3, 4), {"start": -10}, [2, 3, 4]), ((2, 3, 4), {"end": 10}, [2, 3, 4]),
    ((2, 3, 4), {"start": -10, "end": 10}, [2, 3, 4]), ((2, 3, 4), {"start": -3, "end": -10}, []),
    ((2, 3, 4), {"start": 5}, []), ((2, 3, 4), {"start": 3}, []), ((2, 3, 4), {"end": 0}, []),
    ((2, 3, 4), {"start": 2, "end": 1}, []), ((2, 3, 4), {"start": -1, "end": -2}, []),
    ((2, 3, 4), {"start": 1, "end": 1}, []), ((), {"start": 0}, []), ((), {"start": -1, "end": 1}, []),
    ((0, 3), {"start": 1}, [3]), ((0, 3), {"end": -1}, [0]), ((4, 0, 2), {"start": -2}, [0, 2]),
]


@pytest.mark.parametrize("version,shape,attrs,expected",
                         [(v, *c) for v in SHAPE_VERSIONS for c in SHAPE_CASES if v >= 15 or not c[1]])
def test_shape_cases(version, shape, attrs, expected):
    assert_same(run("Shape", version, [np.zeros(shape, np.float32)], **attrs), i64(expected))


# -- Reshape -------------------------------------------------------------------------------------

RESHAPE_VERSIONS = [1, 5, 13, 14, 19, 21, 23, 24, 25]


def reshape(version, data, shape, allowzero=None):
    if version == 1:
        return run("Reshape", 1, [data], shape=list(shape))
    return run("Reshape", version, [data, i64(shape)], **({} if allowzero is None else {"allowzero": allowzero}))


def with_versions(cases):
    """(version, *case) for every Reshape version that has the case's allowzero (14+ when given)."""
    return [(v, *c) for v in RESHAPE_VERSIONS for c in cases if c[2] is None or v >= 14]


@pytest.mark.parametrize("version,tname", type_matrix("Reshape", RESHAPE_VERSIONS))
def test_reshape_every_type(version, tname):
    data = sample(tname, (2, 3, 4))
    # 0 copies dim 1 (3), -1 is inferred as 24 / (4 * 3) = 2; element order is row-major like numpy.
    assert_same(reshape(version, data, [4, 0, -1]), np.reshape(data, (4, 3, 2)))


RESHAPE_CASES = [  # (input shape, requested shape, allowzero, expected output shape)
    ((2, 3, 4), [4, 0, -1], None, (4, 3, 2)), ((2, 3, 4), [-1], None, (24,)), ((2, 3, 4), [0, -1], None, (2, 12)),
    ((2, 3, 4), [6, -1], None, (6, 4)), ((2, 3, 4), [-1, 2, 0], None, (3, 2, 4)),
    ((2, 3, 4), [0, 0, 0], None, (2, 3, 4)), ((2, 3, 4), [2, 3, 2, 2], None, (2, 3, 2, 2)),
    ((1, 1, 1), [], None, ()), ((1,), [], None, ()), ((), [1, 1], None, (1, 1)), ((), [-1], None, (1,)),
    ((0, 3), [-1, 3], None, (0, 3)), ((0, 3), [3, -1], None, (3, 0)), ((4, 0), [0, 0], None, (4, 0)),
    ((2, 0, 3), [0, -1], None, (2, 0)), ((0, 3), [0, 3], None, (0, 3)), ((2, 3), [0, 3], 0, (2, 3)),
    # allowzero=1: a 0 is a real zero-size dim
    ((0, 3), [3, 0], 1, (3, 0)), ((2, 0), [0, 5, 0], 1, (0, 5, 0)), ((2, 3, 4), [4, -1], 1, (4, 6)),
    ((2, 3, 4), [2, 3, 4], 1, (2, 3, 4)), ((3, 0), [0, 4], 1, (0, 4)),
]


@pytest.mark.parametrize("version,in_shape,shape,allowzero,out_shape", with_versions(RESHAPE_CASES))
def test_reshape_cases(version, in_shape, shape, allowzero, out_shape):
    data = (np.arange(math.prod(in_shape), dtype=np.float32) * 0.5 - 3).reshape(in_shape)
    assert_same(reshape(version, data, shape, allowzero), data.reshape(out_shape))


RESHAPE_ERRORS = [  # (input shape, requested shape, allowzero, message pattern)
    ((2, 3, 4), [-1, -1], None, r"more than one|two|multiple|at most one"),
    ((2, 3, 4), [-1, 2, -1], None, r"more than one|two|multiple|at most one"),
    ((2, 3, 4), [5, 5], None, r"element|size|24"), ((2, 3, 4), [5, -1], None, r"element|size|24|divis"),
    ((2, 3, 4), [2, -2, 6], None, r"invalid|negative|-2"),
    ((3, 0), [0, 4], 0, r"element|size|12"),  # 0 copies the 3: (3, 4) has 12 elements, not 0
    ((2, 3), [0, -1], 1, r"allowzero"), ((0, 3), [0, -1], 1, r"allowzero"),
    ((2, 3), [0, 3], 1, r"element|size|6"), ((2, 3), [2, 0], 1, r"element|size|6"),
]


@pytest.mark.parametrize("version,in_shape,shape,allowzero,pattern", with_versions(RESHAPE_ERRORS))
def test_reshape_errors(version, in_shape, shape, allowzero, pattern):
    # Reshape-1's shape is an attribute, so it may equally be rejected at prepare time.
    with pytest.raises(KernelError if version > 1 else OnnxMiniError, match=re.compile(pattern, re.I)):
        reshape(version, np.zeros(in_shape, np.float32), shape, allowzero)


@pytest.mark.parametrize("version", RESHAPE_VERSIONS[1:])
def test_reshape_shape_must_be_int64(version):
    with pytest.raises(KernelError, match=re.compile("int64", re.I)):
        run("Reshape", version, [np.zeros((2, 3), np.float32), np.array([3, 2], dtype=np.int32)])


@pytest.mark.parametrize("version", RESHAPE_VERSIONS)
def test_reshape_is_zero_copy(version):
    data = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    out = reshape(version, data, [6, -1])
    assert out.shape == (6, 4) and np.shares_memory(out, data)


# -- GatherElements ------------------------------------------------------------------------------


def gather_ref(data: np.ndarray, idx: np.ndarray, axis: int) -> np.ndarray:
    """out[i][j][k] = data[i][idx[i][j][k]][k] (for axis 1, etc.), idx + n for a negative idx."""
    axis %= data.ndim
    n = data.shape[axis]
    out = np.empty(idx.shape, dtype=data.dtype)
    for pos in np.ndindex(*idx.shape):
        k = int(idx[pos])
        assert -n <= k < n
        out[pos] = data[pos[:axis] + (k + n if k < 0 else k,) + pos[axis + 1:]]
    return out


@pytest.mark.parametrize("version,tname", type_matrix("GatherElements", [11, 13]))
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements_every_type(version, tname, axis):
    data = sample(tname, (3, 4))
    idx = i64([[2, 0, -1, 1], [-3, 1, 0, 2]]) if axis == 0 else i64([[3, -4, 0], [1, 2, -1]])
    out = run("GatherElements", version, [data, idx], axis=axis)
    assert_same(out, gather_ref(data, idx, axis))


@pytest.mark.parametrize("version", [11, 13])
@pytest.mark.parametrize("ind_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("rank,axis", [(r, a) for r in (1, 2, 3, 4) for a in range(-r, r)])
def test_gather_elements_ranks_and_axes(version, ind_dtype, rank, axis):
    rng = np.random.default_rng(100 * rank + axis)
    dshape = (3, 4, 2, 5)[:rank]
    a = axis % rank
    n = dshape[a]
    # Longer than data on the axis, shorter on every other dim (which the spec allows).
    ishape = tuple(d + 2 if k == a else max(1, d - 1) for k, d in enumerate(dshape))
    data = rng.integers(-1000, 1000, size=dshape).astype(np.int64)
    idx = rng.integers(-n, n, size=ishape).astype(ind_dtype)
    assert_same(run("GatherElements", version, [data, idx], axis=axis), gather_ref(data, idx, axis))


@pytest.mark.parametrize("version", [11, 13])
@pytest.mark.parametrize("data,idx,axis,expected", [
    ([[1, 2], [3, 4]], [[0, 0], [1, 0]], 1, [[1, 1], [4, 3]]),                       # spec example 1
    ([[1, 2, 3], [4, 5, 6], [7, 8, 9]], [[1, 2, 0], [2, 0, 0]], 0, [[4, 8, 3], [7, 2, 3]]),  # example 2
    ([[1, 2, 3], [4, 5, 6], [7, 8, 9]], [[-1, -2, 0], [-2, 0, 0]], 0, [[7, 5, 3], [4, 2, 3]]),
    ([[1, 2, 3], [4, 5, 6]], [[-3, 2, 0], [2, -3, -1]], 1, [[1, 3, 1], [6, 4, 6]]),  # bounds -n, n-1
    ([[1, 2, 3], [4, 5, 6]], [[1], [0]], -1, [[2], [4]]),
    ([5, 6, 7], [2, -1, 0, -3, 1], 0, [7, 7, 5, 5, 6]),
])
def test_gather_elements_hand_examples(version, data, idx, axis, expected):
    out = run("GatherElements", version, [np.array(data, np.float32), np.array(idx, np.int32)], axis=axis)
    assert_same(out, np.array(expected, np.float32))


@pytest.mark.parametrize("version", [11, 13])
@pytest.mark.parametrize("tname", ["float", "string", "int64", "bool"])
@pytest.mark.parametrize("ishape,axis", [((0, 3), 0), ((2, 0), 1), ((0, 0), -1), ((0, 1), 1)])
def test_gather_elements_empty_indices(version, tname, ishape, axis):
    out = run("GatherElements", version, [sample(tname, (2, 3)), np.zeros(ishape, np.int64)], axis=axis)
    assert type(out) is np.ndarray and out.dtype == np_type(tname) and out.shape == ishape


@pytest.mark.parametrize("version", [11, 13])
@pytest.mark.parametrize("ind_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("axis,bad", [(0, 2), (0, -3), (1, 3), (1, -4), (-1, 100), (-1, -100)])
@pytest.mark.parametrize("reps", [1, 3000])  # small and large index tensors
def test_gather_elements_out_of_bounds(version, ind_dtype, axis, bad, reps):
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    idx = np.array([[0, 1, bad], [1, 0, 0]], dtype=ind_dtype) if axis else np.array([[0, bad, 1]], ind_dtype)
    idx = np.tile(idx, (1, reps)) if axis else np.tile(idx, (reps, 1))
    with pytest.raises(KernelError, match="out of bounds"):
        run("GatherElements", version, [data, idx], axis=axis)


@pytest.mark.parametrize("version", [11, 13])
@pytest.mark.parametrize("axis", [2, -3])
def test_gather_elements_axis_out_of_range(version, axis):  # accepted range is [-r, r-1]
    with pytest.raises(OnnxMiniError, match="axis"):
        run("GatherElements", version, [np.zeros((2, 3), np.float32), np.zeros((2, 3), np.int64)], axis=axis)


@pytest.mark.parametrize("version", [11, 13])
@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
def test_gather_elements_large_random(version, axis):
    rng = np.random.default_rng(7 + axis)
    data = rng.standard_normal((5, 70, 64)).astype(np.float32).T  # (64, 70, 5), not C-contiguous
    n = data.shape[axis]
    ishape = list(data.shape)
    ishape[axis] = 33
    ishape[(axis + 1) % 3] -= 1
    idx = rng.integers(-n, n, size=ishape)
    assert_same(run("GatherElements", version, [data, idx], axis=axis), gather_ref(data, idx, axis))


# -- Constant ------------------------------------------------------------------------------------

CONSTANT_VERSIONS = [1, 9, 11, 12, 13, 19, 21, 23, 24, 25]


@pytest.mark.parametrize("version,tname", type_matrix("Constant", CONSTANT_VERSIONS))
@pytest.mark.parametrize("shape", [(2, 3), ()])
def test_constant_value_tensor(version, tname, shape):
    expected = sample(tname, shape)
    assert_same(run("Constant", version, [], value=numpy_helper.from_array(expected, "c")), expected)


@pytest.mark.parametrize("version", CONSTANT_VERSIONS[3:])
@pytest.mark.parametrize("attr,value,expected", [
    ("value_float", 2.5, np.array(2.5, np.float32)),
    ("value_floats", [1.5, -2.0, 0.25], np.array([1.5, -2.0, 0.25], np.float32)),
    ("value_floats", [7.0], np.array([7.0], np.float32)),
    ("value_int", -7, np.array(-7, np.int64)),
    ("value_ints", [1, -2, 2**40], np.array([1, -2, 2**40], np.int64)),
    ("value_string", "héllo", np.array("héllo", dtype=object)),
    ("value_strings", ["a", "bc", ""], np.array(["a", "bc", ""], dtype=object)),
])
def test_constant_value_attributes(version, attr, value, expected):
    assert_same(run("Constant", version, [], **{attr: value}), expected)


@pytest.mark.parametrize("version", CONSTANT_VERSIONS[2:])
def test_constant_sparse_value(version):
    values = helper.make_tensor("v", TensorProto.FLOAT, [3], [1.5, -2.0, 3.0])
    linear = helper.make_sparse_tensor(values, helper.make_tensor("i", TensorProto.INT64, [3], [1, 4, 8]), [3, 3])
    expected = np.array([[0, 1.5, 0], [0, -2, 0], [0, 0, 3]], np.float32)
    assert_same(run("Constant", version, [], sparse_value=linear), expected)
    values = helper.make_tensor("v", TensorProto.INT64, [2], [7, 9])
    coords = helper.make_tensor("i", TensorProto.INT64, [2, 2], [0, 2, 1, 0])  # (0, 2) and (1, 0)
    coo = helper.make_sparse_tensor(values, coords, [2, 3])
    assert_same(run("Constant", version, [], sparse_value=coo), np.array([[0, 0, 7], [9, 0, 0]], np.int64))


@pytest.mark.parametrize("version", CONSTANT_VERSIONS)
def test_constant_needs_exactly_one_value(version):
    tensor = numpy_helper.from_array(np.array([1.0], np.float32), "c")
    sparse = helper.make_sparse_tensor(helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0]),
                                       helper.make_tensor("i", TensorProto.INT64, [1], [0]), [2])
    cases = [{}] + ([dict(value=tensor, sparse_value=sparse)] if version >= 11 else []) + (
        [dict(value=tensor, value_float=1.0), dict(value_int=1, value_ints=[1, 2])] if version >= 12 else [])
    for attrs in cases:
        with pytest.raises(OnnxMiniError) as info:
            run("Constant", version, [], **attrs)
        assert all(name in str(info.value) for name in attrs or ["value"]), str(info.value)


# -- Identity ------------------------------------------------------------------------------------

IDENTITY_VERSIONS = [1, 13, 14, 16, 19, 21, 23, 24, 25]


@pytest.mark.parametrize("version,tname", type_matrix("Identity", IDENTITY_VERSIONS))
@pytest.mark.parametrize("shape", [(2, 3), (), (0, 4)])
def test_identity_tensor(version, tname, shape):
    data = sample(tname, shape)
    assert_same(run("Identity", version, [data]), sample(tname, shape))


@pytest.mark.parametrize("version", IDENTITY_VERSIONS[2:])
@pytest.mark.parametrize("tname", ["float", "int64", "string"])
def test_identity_sequence(version, tname):
    shapes = [(2,), (1, 3), ()]
    assert_same(run("Identity", version, [[sample(tname, s) for s in shapes]]), [sample(tname, s) for s in shapes])


# -- Add -----------------------------------------------------------------------------------------

ADD_VERSIONS = [1, 6, 7, 13, 14]


@pytest.mark.parametrize("version,tname", type_matrix("Add", ADD_VERSIONS))
def test_add_every_type(version, tname):
    dt = np_type(tname)
    if "float" in tname or tname == "double":
        a, b = [[1.5, -2, 0.25], [100, 3, -1]], [[2.25, 0.5, -0.25], [28, 0.5, -1]]
        s = [[3.75, -1.5, 0], [128, 3.5, -2]]
    else:
        a, b, s = [[1, 2, 3], [40, 50, 60]], [[5, 6, 7], [8, 9, 10]], [[6, 8, 10], [48, 59, 70]]
    a, b, s = (np.array(x).astype(dt) for x in (a, b, s))
    assert_same(run("Add", version, [a, b]), s)
    # 0-d inputs give a 0-d ndarray of the same type.
    assert_same(run("Add", version, [np.array(3).astype(dt), np.array(4).astype(dt)]), np.array(7).astype(dt))


@pytest.mark.parametrize("version,tname", type_matrix("Add", ADD_VERSIONS[2:]))
def test_add_broadcast_every_type(version, tname):
    a, b, s = (np.array(x).astype(np_type(tname)) for x in ([[1], [2]], [10, 20, 30], [[11, 21, 31], [12, 22, 32]]))
    assert_same(run("Add", version, [a, b]), s)
    assert_same(run("Add", version, [b, a]), s)


@pytest.mark.parametrize("shape", [(), (3,)])
@pytest.mark.parametrize("version,dtype,a,b,expected", [
    (14, np.uint8, 250, 10, 4), (14, np.int8, 127, 1, -128), (14, np.uint16, 65535, 2, 1),
    (14, np.int16, -32768, -1, 32767), (7, np.uint32, 2**32 - 1, 2, 1), (13, np.int32, 2**31 - 1, 1, -2**31),
    (14, np.uint64, 2**64 - 1, 1, 0), (6, np.int64, 2**63 - 1, 2, -2**63 + 1), (6, np.int32, -2**31, -1, 2**31 - 1)])
def test_add_integer_wraps_around(shape, version, dtype, a, b, expected):
    out = run("Add", version, [np.full(shape, a, dtype), np.full(shape, b, dtype)])
    assert_same(out, np.full(shape, expected, dtype))


def broadcast_ref(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Multidirectional broadcasting: right-align shapes, each dim pair equal or one of them 1."""
    r = max(a.ndim, b.ndim)
    sa, sb = (1,) * (r - a.ndim) + a.shape, (1,) * (r - b.ndim) + b.shape
    assert all(x == y or 1 in (x, y) for x, y in zip(sa, sb))
    shape = tuple(y if x == 1 else x for x, y in zip(sa, sb))
    a2, b2 = a.reshape(sa), b.reshape(sb)
    out = np.empty(shape, dtype=a.dtype)
    for pos in np.ndindex(*shape):
        out[pos] = a2[tuple(0 if d == 1 else p for p, d in zip(pos, sa))] + \
            b2[tuple(0 if d == 1 else p for p, d in zip(pos, sb))]
    return out


@pytest.mark.parametrize("version", ADD_VERSIONS[2:])
@pytest.mark.parametrize("sa,sb", [((2, 3, 4, 5), (5,)), ((3, 1, 5), (4, 1)), ((1,), (2, 3)), ((), (2, 2)),
                                   ((2, 0, 3), (1, 3)), ((2, 1, 4), (1, 3, 1)), ((4, 5), (2, 3, 4, 5))])
def test_add_numpy_broadcasting(version, sa, sb):
    a = (np.arange(math.prod(sa), dtype=np.float32) * 0.5).reshape(sa)
    b = (np.arange(math.prod(sb), dtype=np.float32) * 2 - 7).reshape(sb)
    assert_same(run("Add", version, [a, b]), broadcast_ref(a, b))


def legacy_ref(a: np.ndarray, b: np.ndarray, axis) -> np.ndarray:
    """Add-1/6 broadcast=1: B matches A's dims from `axis` (default: suffix), or has one element."""
    start = a.ndim - b.ndim if axis is None else axis
    out = np.empty_like(a)
    for pos in np.ndindex(*a.shape):
        out[pos] = a[pos] + b[tuple(0 if d == 1 else pos[start + k] for k, d in enumerate(b.shape))]
    return out


@pytest.mark.parametrize("version,dtype", [(1, np.float16), (1, np.float32), (1, np.float64)] + [
    (6, t) for t in (np.float16, np.float32, np.float64, np.int32, np.int64, np.uint32, np.uint64)])
@pytest.mark.parametrize("sb,axis", [((5,), None), ((4, 5), None), ((3, 4), 1), ((2,), 0), ((), None),
                                     ((1, 1), None), ((1,), None), ((2, 3, 4, 5), None), ((4,), 2)])
def test_add_legacy_broadcast(version, dtype, sb, axis):
    # The spec's examples for A (2, 3, 4, 5): B scalar or of one element, a suffix, or a run from `axis`.
    a = np.arange(120).reshape(2, 3, 4, 5).astype(dtype)
    b = (np.arange(math.prod(sb)) * 10 + 3).astype(dtype).reshape(sb)
    attrs = {"broadcast": 1} if axis is None else {"broadcast": 1, "axis": axis}
    assert_same(run("Add", version, [a, b], **attrs), legacy_ref(a, b, axis))


@pytest.mark.parametrize("version,sb", [(v, sb) for v in (1, 6) for sb in [(5,), (2, 3, 4, 1), (1,)]]  # broadcast=0
                         + [(v, sb) for v in (7, 13, 14) for sb in [(4,), (4, 1, 1), (2, 3, 4, 2)]])
def test_add_shape_mismatch_is_an_error(version, sb):
    with pytest.raises(KernelError, match=re.compile("broadcast|shape", re.I)):
        run("Add", version, [np.zeros((2, 3, 4, 5), np.float32), np.zeros(sb, np.float32)])


# -- run_node ------------------------------------------------------------------------------------

@pytest.mark.parametrize("op,version,inputs,attrs,expected", [
    ("Shape", 15, [np.zeros((2, 3, 4), np.int8)], {"start": 1}, i64([3, 4])),
    ("Reshape", 14, [np.arange(6, dtype=np.int64), i64([3, -1])], {}, i64([[0, 1], [2, 3], [4, 5]])),
    ("GatherElements", 13, [np.array([[1, 2], [3, 4]]), np.array([[0, 0], [1, 0]])], {"axis": 1},
     np.array([[1, 1], [4, 3]])),
    ("Add", 14, [np.array(250, np.uint8), np.array(10, np.uint8)], {}, np.array(4, np.uint8)),
    ("Identity", 25, [np.array([1.5, 2.5], ml_dtypes.bfloat16)], {}, np.array([1.5, 2.5], ml_dtypes.bfloat16)),
])
def test_run_node(op, version, inputs, attrs, expected):
    node = helper.make_node(op, [f"x{k}" for k in range(len(inputs))], ["y"], **attrs)
    before = copy.deepcopy(inputs)
    assert_same(onnx_mini.run_node(node, inputs, opset_version=version)[0], expected)
    assert_same(inputs, before)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements_large_blocked_and_threaded(axis):
    """Large enough for the blocked path split over threads (> 8 blocks of 64K elements)."""
    rng = np.random.default_rng(axis + 5)
    data = rng.standard_normal((1100, 620)).astype(np.float32)
    n = data.shape[axis]
    indices = rng.integers(-n, n, size=data.shape)
    out = run("GatherElements", 13, [data, indices], axis=axis)
    # spec: out[i][j] = data[idx][j] (axis 0) / data[i][idx] (axis 1), idx + n when negative
    expected = np.take_along_axis(data, np.where(indices < 0, indices + n, indices), axis=axis)
    np.testing.assert_array_equal(out, expected)


def test_parallel_split_covers_every_item_once():
    from onnx_mini import parallel
    seen = []
    parallel.split(lambda a, b: seen.extend(range(a, b)), 103, min_items=4)
    assert sorted(seen) == list(range(103))
    seen.clear()
    parallel.split(lambda a, b: seen.append((a, b)), 3, min_items=4)
    assert seen == [(0, 3)]
