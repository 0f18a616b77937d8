"""Spec tests for the reductions (ReduceSum/Mean/Max/Min/Prod/L1/L2/SumSquare/LogSum/LogSumExp) and
ArgMax/ArgMin, every version and every type of each version's type constraint.

Expected values come from plain formulas transcribed from the spec, evaluated in float64 (or with
Python integers) and converted to the input type once.
"""
from __future__ import annotations

import math
import re

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_mini
from onnx_mini.errors import InvalidNodeError, KernelError

from helpers import NODE, assert_same, i64, np_type, one_node_model, run_node, type_matrix, versions

def values(tname: str, shape, positive: bool = False) -> np.ndarray:
    """Small exact values of the type: halves in [-1.5, 1.5] for floats, [-3, 3] for signed
    integers, [1, 5] for unsigned integers or when positive."""
    i = np.arange(math.prod(shape)).reshape(shape)
    dt = np_type(tname)
    if tname == "bool":
        return (i % 3 == 1).astype(dt)
    k = i % 5 + 1 if positive or tname.startswith("uint") else i % 7 - 3
    return (k * 0.5 if dt.kind not in "iu" else k).astype(dt)


# -- reference formulas --------------------------------------------------------------------------

def _tuple(axes, rank):
    return tuple(range(rank)) if axes is None else tuple(a % rank for a in axes)


def ref_reduce(op: str, x: np.ndarray, axes, keepdims: bool) -> np.ndarray:
    """The spec's definitions, in float64 (exact for the small values used), cast once to x's type;
    integer results of non-integer math are truncated toward zero."""
    ax = _tuple(axes, x.ndim)
    f = x.astype(np.float64)
    with np.errstate(divide="ignore"):
        r = {
            "ReduceSum": lambda: f.sum(axis=ax, keepdims=True),
            "ReduceProd": lambda: f.prod(axis=ax, keepdims=True),
            "ReduceMax": lambda: f.max(axis=ax, keepdims=True),
            "ReduceMin": lambda: f.min(axis=ax, keepdims=True),
            "ReduceMean": lambda: f.sum(axis=ax, keepdims=True) / math.prod(x.shape[a] for a in ax),
            "ReduceL1": lambda: np.abs(f).sum(axis=ax, keepdims=True),
            "ReduceL2": lambda: np.sqrt((f * f).sum(axis=ax, keepdims=True)),
            "ReduceSumSquare": lambda: (f * f).sum(axis=ax, keepdims=True),
            "ReduceLogSum": lambda: np.log(f.sum(axis=ax, keepdims=True)),
            "ReduceLogSumExp": lambda: np.log(np.exp(f).sum(axis=ax, keepdims=True)),
        }[op]()
    if not keepdims:
        r = r.reshape([d for i, d in enumerate(r.shape) if i not in ax])
    if x.dtype.kind in "iu":
        r = np.trunc(r)
    return r.astype(x.dtype)


REDUCE_OPS = ["ReduceSum", "ReduceProd", "ReduceMax", "ReduceMin", "ReduceMean", "ReduceL1", "ReduceL2",
              "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"]
INEXACT = {"ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMean"}  # rounding of log/exp/sqrt/division


def axes_input_since(op: str) -> int:
    return 13 if op == "ReduceSum" else 18


def reduce(op: str, version: int, x: np.ndarray, axes=None, **attrs):
    """Run op with axes in the form of the version: attribute before 13/18, input after."""
    if version >= axes_input_since(op):
        return run_node(op, version, [x] if axes is None else [x, i64(axes)], **attrs)
    return run_node(op, version, [x], **attrs, **({} if axes is None else {"axes": list(axes)}))


def check_close(got, exp, op):
    if op in INEXACT and exp.dtype.kind not in "iub":
        assert got.dtype == exp.dtype and got.shape == exp.shape
        tol = {np.dtype(np.float64): 1e-12, np.dtype(np.float32): 1e-6}.get(exp.dtype, 1e-2)
        np.testing.assert_allclose(got.astype(np.float64), exp.astype(np.float64), rtol=tol, atol=tol)
    else:
        assert_same(got, exp)


REDUCE_MATRIX = [pytest.param(op, *p.values, id=f"{op}-{p.id}") for op in REDUCE_OPS
                 for p in type_matrix(op, versions(op))]


@pytest.mark.parametrize("op,version,tname", REDUCE_MATRIX)
def test_reduce_every_type(op, version, tname):
    positive = op in ("ReduceLogSum",)
    shape = (2, 3, 4)
    x = values(tname, shape, positive)
    if tname == "bool":  # ReduceMax/Min 20: False < True
        exp_any, exp_all = x.any(axis=(0, 2), keepdims=True), x.all(axis=(0, 2), keepdims=True)
        got = reduce(op, version, x, [0, 2])
        assert_same(got, exp_any if op == "ReduceMax" else exp_all)
        return
    if op == "ReduceProd":  # 1s and 2s: the product of all 24 is at most 2**12, exact in every type
        x = (np.arange(24) % 2 + 1).reshape(shape).astype(np_type(tname))
    for axes, keepdims in (([0, 2], 1), ([1], 0), ([-1], 1), (None, 0), (None, 1)):
        got = reduce(op, version, x, axes, keepdims=keepdims)
        check_close(got, ref_reduce(op, x, axes, bool(keepdims)), op)


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_keepdims_default_and_rank0(op):
    for version in versions(op):
        x = values("float", (2, 3), positive=True)
        got = reduce(op, version, x, [1])
        check_close(got, ref_reduce(op, x, [1], True), op)          # keepdims defaults to 1
        s = np.array(2.0, dtype=np.float32)                        # a rank-0 input reduces to itself
        check_close(reduce(op, version, s), ref_reduce(op, s, None, True), op)


NOOP_ELEMENTWISE = {  # what noop_with_empty_axes=1 leaves: the non-reduction steps only
    "ReduceSum": lambda f: f, "ReduceProd": lambda f: f, "ReduceMax": lambda f: f, "ReduceMin": lambda f: f,
    "ReduceMean": lambda f: f, "ReduceL1": np.abs, "ReduceL2": np.abs, "ReduceSumSquare": lambda f: f * f,
    "ReduceLogSum": np.log, "ReduceLogSumExp": lambda f: f,
}


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("axes", [None, []], ids=["omitted", "empty"])
def test_noop_with_empty_axes(op, axes):
    x = values("float", (2, 3), positive=op == "ReduceLogSum") * np.float32(-1 if op == "ReduceL1" else 1)
    for version in versions(op):
        if version < axes_input_since(op):
            continue
        inputs = [x] if axes is None else [x, i64(axes)]
        got = run_node(op, version, inputs, noop_with_empty_axes=1)
        check_close(got, NOOP_ELEMENTWISE[op](x.astype(np.float64)).astype(np.float32), op)
        # noop_with_empty_axes=0 (default): reduce over every axis
        check_close(run_node(op, version, inputs), ref_reduce(op, x, None, True), op)
        check_close(run_node(op, version, inputs, keepdims=0), ref_reduce(op, x, None, False), op)


def test_reduce_axes_input_forms():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    exp = x.sum(axis=1, keepdims=True)
    for axes in (i64([1]), i64([-2]), np.array([1], np.int32), i64(1)):  # a 0-d axes tensor is accepted
        assert_same(run_node("ReduceSum", 13, [x, axes]), exp)
    # the axes of an attribute in any order
    assert_same(run_node("ReduceSum", 11, [x], axes=[2, 0], keepdims=0), x.sum(axis=(0, 2)))


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceL2"])
def test_reduce_constant_axes_input(op):
    """axes as an initializer (read once per input rank): the same prepared model on inputs of rank 2
    and 3, an out-of-range constant axis failing at run time naming the node."""
    node = helper.make_node(op, ["x", "axes"], ["y"], name=NODE, keepdims=0)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.INT64, None)],
                              [helper.make_tensor_value_info("y", TensorProto.INT64, None)],
                              [numpy_helper.from_array(i64([-1]), "axes")])
    model = onnx_mini.prepare(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9))
    for shape in ((1, 257), (2, 3, 4), (1, 257)):
        x = (np.arange(math.prod(shape)) % 7 - 3).reshape(shape).astype(np.int64)
        exp = ref_reduce(op, x, [-1], False)
        (got,) = model.run({"x": x})
        assert_same(got, exp)
    bad = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.INT64, None)],
                            [helper.make_tensor_value_info("y", TensorProto.INT64, None)],
                            [numpy_helper.from_array(i64([1]), "axes")])
    bad_model = onnx_mini.prepare(helper.make_model(bad, opset_imports=[helper.make_opsetid("", 18)], ir_version=9))
    ones = np.ones((2, 3), np.int64)
    assert_same(bad_model.run({"x": ones})[0], ref_reduce(op, ones, [1], False))
    with pytest.raises(KernelError, match=re.compile(f"{NODE}.*out of range", re.S)):
        bad_model.run({"x": np.ones(3, np.int64)})


def test_noop_sum_returns_input_values():
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    assert_same(run_node("ReduceSum", 13, [x, i64([])], noop_with_empty_axes=1), x)


IDENTITY = {  # the value of a reduction over an empty set, per the spec
    "ReduceSum": 0, "ReduceProd": 1, "ReduceL1": 0, "ReduceL2": 0, "ReduceSumSquare": 0,
    "ReduceMax": -np.inf, "ReduceMin": np.inf, "ReduceLogSum": -np.inf, "ReduceLogSumExp": -np.inf,
    "ReduceMean": np.nan,
}


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.int32, np.uint64])
def test_reduce_empty_set_identity(op, dtype):
    dt = np.dtype(dtype)
    x = np.zeros((2, 0, 4), dtype=dt)
    value = IDENTITY[op]
    if dt.kind in "iu":
        if op == "ReduceMean":
            value = 0                      # undefined by the spec; we return 0
        elif value == -np.inf:
            value = np.iinfo(dt).min       # "the minimum value of the data type"
        elif value == np.inf:
            value = np.iinfo(dt).max
    for version in versions(op):
        if dt == np.dtype(np.int32) and op in ("ReduceLogSum", "ReduceLogSumExp") and version >= 28:
            continue  # 28 keeps float types only
        got = reduce(op, version, x, [1], keepdims=1)
        assert_same(got, np.full((2, 1, 4), value, dtype=dt))
        got = reduce(op, version, x, [1, 2], keepdims=0)
        assert_same(got, np.full((2,), value, dtype=dt))
        # a zero-size non-reduced axis: the output is empty
        assert_same(reduce(op, version, x, [2], keepdims=1), np.zeros((2, 0, 1), dtype=dt))


@pytest.mark.parametrize("op,expected", [("ReduceMax", False), ("ReduceMin", True)])
def test_reduce_bool_empty_set(op, expected):
    x = np.zeros((2, 0), dtype=bool)
    assert_same(run_node(op, 20, [x, i64([1])]), np.full((2, 1), expected))


def test_reduce_mean_integer_truncates_toward_zero():
    x = np.array([[-3, -4], [3, 4], [-1, 0]], dtype=np.int32)
    for version in versions("ReduceMean"):
        assert_same(reduce("ReduceMean", version, x, [1], keepdims=0), np.array([-3, 3, 0], dtype=np.int32))
    x = np.array([[7, 8]], dtype=np.uint32)
    assert_same(reduce("ReduceMean", 18, x, [1], keepdims=0), np.array([7], dtype=np.uint32))


def test_reduce_integer_float_math_truncates():
    x = np.array([[3, 4], [1, 1]], dtype=np.int64)
    assert_same(reduce("ReduceL2", 18, x, [1], keepdims=0), i64([5, 1]))   # sqrt(2) -> 1
    assert_same(reduce("ReduceLogSum", 18, x, [1], keepdims=0), i64([1, 0]))  # log 7, log 2
    assert_same(reduce("ReduceLogSumExp", 13, x, [1], keepdims=0), i64([4, 1]))


def test_reduce_log_sum_exp_is_stable():
    x = np.array([[1000.0, 1000.0], [-1000.0, -1000.0], [-np.inf, -np.inf], [np.inf, 0.0]], dtype=np.float32)
    exp = np.array([1000 + math.log(2), -1000 + math.log(2), -np.inf, np.inf], dtype=np.float32)
    for version in versions("ReduceLogSumExp"):
        got = reduce("ReduceLogSumExp", version, x, [1], keepdims=0)
        np.testing.assert_allclose(got, exp, rtol=1e-6)
        assert got.dtype == np.float32


def test_reduce_float16_computes_in_float32():
    # 2048 + 1 is not a float16: summing in float16 would stay at 2048; rounded once it is 2050
    x = np.array([2048, 1, 1], dtype=np.float16)
    assert_same(run_node("ReduceSum", 13, [x]), np.array([2050], dtype=np.float16))
    assert_same(run_node("ReduceMean", 18, [x], keepdims=0), np.array(np.float16(2050 / 3)))


def test_reduce_integer_sum_wraps_in_type():
    x = np.array([2**31 - 1, 1], dtype=np.int32)
    assert_same(run_node("ReduceSum", 13, [x], keepdims=0), np.array(-2**31, dtype=np.int32))
    x = np.array([200, 100], dtype=np.uint8)
    assert_same(run_node("ReduceMax", 18, [x], keepdims=0), np.array(200, dtype=np.uint8))


def test_reduce_max_min_nan_propagates():
    x = np.array([[1.0, np.nan, 3.0], [1.0, 2.0, 0.5]], dtype=np.float32)
    assert_same(run_node("ReduceMax", 20, [x, i64([1])], keepdims=0), np.array([np.nan, 2.0], np.float32))
    assert_same(run_node("ReduceMin", 20, [x, i64([1])], keepdims=0), np.array([np.nan, 0.5], np.float32))


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_axes_errors(op):
    x = np.ones((2, 3), np.float32)
    for version in versions(op):
        for axes in ([2], [-3], [0, -2]):  # out of range; the same axis twice
            with pytest.raises(KernelError, match=re.compile(f"{NODE}.*(out of range|twice)", re.S)):
                reduce(op, version, x, axes)
        if version < axes_input_since(op):  # literal duplicates are seen at prepare time
            with pytest.raises(InvalidNodeError, match=re.compile(f"{NODE}.*duplicate", re.S)):
                reduce(op, version, x, [1, 1])
        else:
            with pytest.raises(KernelError, match=re.compile(f"{NODE}.*integer", re.S)):
                run_node(op, version, [x, np.array([1.0], np.float32)])


# -- ArgMax / ArgMin -------------------------------------------------------------------------------

def ref_arg(x: np.ndarray, axis: int, keepdims: bool, last: bool, op: str) -> np.ndarray:
    """Index of the first (or last) max/min along axis, walking the elements one by one; a NaN
    beats every number (the first NaN wins)."""
    ax = axis % x.ndim
    moved = np.moveaxis(x.astype(np.float64), ax, -1)
    out = np.empty(moved.shape[:-1], dtype=np.int64)
    for pos in np.ndindex(*moved.shape[:-1]):
        row = moved[pos]
        best = 0
        for i in range(1, len(row)):
            if np.isnan(row[best]):
                if last and np.isnan(row[i]):
                    best = i
                continue
            better = row[i] > row[best] if op == "ArgMax" else row[i] < row[best]
            if np.isnan(row[i]) or better or (last and row[i] == row[best]):
                best = i
        out[pos] = best
    return np.expand_dims(out, ax) if keepdims else out


ARG_MATRIX = [pytest.param(op, *p.values, id=f"{op}-{p.id}") for op in ("ArgMax", "ArgMin")
              for p in type_matrix(op, [1, 11, 12, 13])]


@pytest.mark.parametrize("op,version,tname", ARG_MATRIX)
def test_arg_every_type(op, version, tname):
    x = values(tname, (3, 4, 5))  # values repeat: ties everywhere
    for axis, keepdims in ((0, 1), (1, 0), (-1, 1), (2, 0)):
        got = run_node(op, version, [x], axis=axis, keepdims=keepdims)
        assert_same(got, ref_arg(x, axis, bool(keepdims), False, op))
        if version >= 12:
            got = run_node(op, version, [x], axis=axis, keepdims=keepdims, select_last_index=1)
            assert_same(got, ref_arg(x, axis, bool(keepdims), True, op))


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_arg_defaults_and_ties(op):
    x = np.array([[2, 1, 2, 1], [0, 0, 0, 0]], dtype=np.float32)
    for version in (1, 11, 12, 13):
        exp = [[0, 0, 0, 0]] if op == "ArgMax" else [[1, 1, 1, 1]]  # axis 0, keepdims 1
        assert_same(run_node(op, version, [x]), i64(exp))
        exp = [0, 0] if op == "ArgMax" else [1, 0]
        assert_same(run_node(op, version, [x], axis=1, keepdims=0), i64(exp))
    exp = [2, 3] if op == "ArgMax" else [3, 3]
    assert_same(run_node(op, 13, [x], axis=1, keepdims=0, select_last_index=1), i64(exp))


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_arg_nan_first_wins(op):
    x = np.array([[1.0, np.nan, 5.0, np.nan], [np.nan, 0.0, 0.0, 1.0]], dtype=np.float32)
    assert_same(run_node(op, 13, [x], axis=1, keepdims=0), i64([1, 0]))
    assert_same(ref_arg(x, 1, False, False, op), i64([1, 0]))
    assert_same(run_node(op, 13, [x], axis=1, keepdims=0, select_last_index=1), i64([3, 0]))


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_arg_errors(op):
    with pytest.raises(KernelError, match=re.compile(f"{NODE}.*out of range", re.S)):
        run_node(op, 13, [np.ones((2, 3), np.float32)], axis=2)
    with pytest.raises(KernelError, match=re.compile(f"{NODE}.*empty", re.S)):
        run_node(op, 13, [np.ones((2, 0), np.float32)], axis=1)
    # an empty non-reduced axis is fine
    assert_same(run_node(op, 13, [np.ones((0, 3), np.float32)], axis=1), np.zeros((0, 1), np.int64))


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_arg_one_node_several_ranks(op):
    """The axis is checked once per input rank: one prepared node fed ranks 2, 3, 1 (axis -2 out of
    range there), then rank 2 again, answers each by its own rank."""
    m, _ = one_node_model(op, [np.zeros((2, 3), np.float32)], version=13, axis=-2, keepdims=0)
    p = onnx_mini.prepare(m)
    x2 = np.array([[0.0, 5.0, 1.0], [2.0, 4.0, 1.0]], np.float32)       # along axis 0: per column
    x3 = np.array([[[1.0, 0.0]], [[0.0, 1.0]], [[3.0, -1.0]]], np.float32).reshape(1, 3, 2)
    big = [1, 0, 0] if op == "ArgMax" else [0, 1, 0]
    assert_same(p.run({"in0": x2})[0], i64(big))
    assert_same(p.run({"in0": x3})[0], i64([[2, 1]] if op == "ArgMax" else [[1, 2]]))
    with pytest.raises(KernelError, match=re.compile(f"{NODE}.*out of range", re.S)):
        p.run({"in0": np.ones(4, np.float32)})
    assert_same(p.run({"in0": x2})[0], i64(big))
