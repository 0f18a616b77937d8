"""Spec tests for element-wise arithmetic: Add, Sub, Mul, Div, Mod, Pow, Max, Min, Sum, Mean, Clip,
Expand, every version and every type of each version's type constraints.

Expected values are written by hand or computed by a plain formula transcribed from the spec text.
"""
from __future__ import annotations

import math
import re

import ml_dtypes
import numpy as np
import onnx.defs
import pytest

from onnx_mini.errors import KernelError, OnnxMiniError

from helpers import (arr, assert_same, i64, legacy_ref, np_type, op_type_matrix, run_node, run_op as run, sample,
                     type_matrix, versions)

BF16 = np.dtype(ml_dtypes.bfloat16)
FLOATS = [np.float16, np.float32, np.float64, BF16]


# -- Add, Sub, Mul, Div: every version, every type ---------------------------------------------

A = [[6, 9, 12], [10, 7, 3]]
B = [[3, 2, 4], [5, 7, 2]]
BASIC = {  # op: (expected for integer types, expected for float types), all exact in every type
    "Add": ([[9, 11, 16], [15, 14, 5]],) * 2,
    "Sub": ([[3, 7, 8], [5, 0, 1]],) * 2,
    "Mul": ([[18, 18, 48], [50, 49, 6]],) * 2,
    "Div": ([[2, 4, 3], [2, 1, 1]], [[2, 4.5, 3], [2, 1, 1.5]]),
}
ARITH = list(BASIC)


@pytest.mark.parametrize("op", ARITH)
def test_arith_versions_are_listed(op):
    assert versions(op) == [1, 6, 7, 13, 14]


@pytest.mark.parametrize("op", ARITH)
@pytest.mark.parametrize("version,tname", type_matrix("Add", [1, 6, 7, 13, 14]))
def test_arith_every_type(op, version, tname):
    dt = np_type(tname)
    expected = BASIC[op][0 if dt.kind in "iu" else 1]
    assert_same(run(op, version, [arr(A, dt), arr(B, dt)]), arr(expected, dt))
    # 0-d inputs give a 0-d ndarray
    assert_same(run(op, version, [arr(A[0][2], dt), arr(B[0][2], dt)]), arr(expected[0][2], dt))


@pytest.mark.parametrize("op", ARITH)
@pytest.mark.parametrize("version,tname", type_matrix("Add", [7, 13, 14]))
def test_arith_numpy_broadcast_every_type(op, version, tname):
    dt = np_type(tname)
    a, b = arr([[12], [6]], dt), arr([1, 2, 3], dt)          # (2, 1) with (3,) -> (2, 3)
    fn = {"Add": lambda x, y: x + y, "Sub": lambda x, y: x - y, "Mul": lambda x, y: x * y,
          "Div": (lambda x, y: int(x / y)) if dt.kind in "iu" else (lambda x, y: x / y)}[op]
    expected = [[fn(x, y) for y in (1, 2, 3)] for x in (12, 6)]
    assert_same(run(op, version, [a, b]), arr(expected, dt))


LEGACY_SHAPES = [((5,), None), ((4, 5), None), ((3, 4), 1), ((2,), 0), ((), None), ((1, 1), None), ((1,), None),
                 ((2, 3, 4, 5), None), ((4,), 2), ((3, 1), 1), ((1, 5), -2)]
PY = {"Add": lambda x, y: x + y, "Sub": lambda x, y: x - y, "Mul": lambda x, y: x * y,
      "Div": lambda x, y: x / y, "Pow": lambda x, y: x ** y}


@pytest.mark.parametrize("op", ARITH)
@pytest.mark.parametrize("version,tname", type_matrix("Add", [1, 6]))
@pytest.mark.parametrize("sb,axis", LEGACY_SHAPES)
def test_arith_legacy_broadcast(op, version, tname, sb, axis):
    dt = np_type(tname)
    a = arr(np.arange(120).reshape(2, 3, 4, 5) % 7 * 2 + 6, dt)      # 6..18, even
    b = arr((np.arange(math.prod(sb)) % 2 + 1).reshape(sb) * 2, dt)    # 2 or 4: exact quotients
    attrs = {"broadcast": 1} if axis is None else {"broadcast": 1, "axis": axis}
    ref_axis = None if axis is None else axis % 4
    assert_same(run(op, version, [a, b], **attrs), legacy_ref(PY[op], a, b, ref_axis))


@pytest.mark.parametrize("op", ARITH)
@pytest.mark.parametrize("version", [1, 6])
def test_arith_legacy_same_shape_without_broadcast(op, version):
    a, b = arr(A, np.float32), arr(B, np.float32)
    assert_same(run(op, version, [a, b]), arr(BASIC[op][1], np.float32))
    with pytest.raises(KernelError, match=re.compile("the_node.*broadcast", re.I)):
        run_node(op, version, [a, arr([1, 2, 3], np.float32)])        # broadcast=0: shapes must match


@pytest.mark.parametrize("op", ARITH)
@pytest.mark.parametrize("version,sb,axis", [(1, (4,), None), (6, (2, 3), 1), (6, (4, 5, 6), None),
                                             (1, (5,), 1), (6, (3,), 3)])
def test_arith_legacy_bad_broadcast(op, version, sb, axis):
    attrs = {"broadcast": 1} if axis is None else {"broadcast": 1, "axis": axis}
    with pytest.raises(KernelError, match="the_node"):
        run_node(op, version, [np.ones((2, 3, 4, 5), np.float32), np.ones(sb, np.float32)], **attrs)


# Operands of one size and ranks one apart (a batch-1 bias) take a fast path in the kernel (a leading 1
# added as a view): the result must be broadcasting's, shape included, in either operand order.
@pytest.mark.parametrize("op", ARITH + ["Pow"])
@pytest.mark.parametrize("sa,sb", [((1, 3), (3,)), ((3,), (1, 3)), ((1, 1, 3), (1, 3)), ((3, 1), (3,)),
                                   ((3,), (3, 1)), ((1,), ()), ((), (1,)), ((1, 0), (0,))])
def test_arith_same_size_ranks_one_apart(op, sa, sb):
    a = arr((np.arange(math.prod(sa)) + 2.0).reshape(sa), np.float32)            # 2, 3, 4
    b = arr((np.arange(math.prod(sb)) % 2 + 1.0).reshape(sb), np.float32)        # 1, 2, 1: exact results
    out = run(op, versions(op)[-1], [a, b])
    fa, fb = np.broadcast_arrays(a.astype(np.float64), b.astype(np.float64))      # the spec's broadcasting
    expected = np.array([PY[op](x, y) for x, y in zip(fa.ravel().tolist(), fb.ravel().tolist())],
                        np.float32).reshape(fa.shape)
    assert_same(out, expected)


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
def test_same_size_shapes_that_do_not_broadcast_are_named_as_given(op):
    # [2, 3] and [6]: one size, ranks one apart, but no broadcast: the message names the shapes given
    with pytest.raises(KernelError, match=re.compile(r"the_node.*\[2, 3\] and \[6\] do not broadcast", re.S)):
        run_node(op, versions(op)[-1], [np.ones((2, 3), np.float32), np.ones(6, np.float32)])


@pytest.mark.parametrize("op", ARITH + ["Mod", "Pow", "Max", "Min", "Sum", "Mean"])
@pytest.mark.parametrize("sb", [(4,), (2, 1, 3), (2, 3, 4, 2)])
def test_shapes_that_do_not_broadcast(op, sb):
    version = versions(op)[-1]
    with pytest.raises(KernelError, match=re.compile(rf"the_node.*{op}.*(broadcast|shape)", re.I)):
        run_node(op, version, [np.ones((2, 3, 4, 5), np.float32), np.ones(sb, np.float32)],
                  **({"fmod": 1} if op == "Mod" else {}))


@pytest.mark.parametrize("op", ARITH + ["Mod", "Max", "Sum"])
def test_mixed_types_are_an_error(op):
    with pytest.raises(KernelError, match=re.compile("the_node.*type", re.I)):
        run_node(op, versions(op)[-1], [np.ones(3, np.float32), np.ones(3, np.float64)],
                  **({"fmod": 1} if op == "Mod" else {}))


@pytest.mark.parametrize("op,dtype,a,b,expected", [
    ("Sub", np.uint8, 3, 5, 254), ("Sub", np.int8, -128, 1, 127), ("Mul", np.int8, 100, 2, -56),
    ("Mul", np.uint16, 300, 300, 90000 % 65536), ("Mul", np.int32, 2**30, 4, 0),
    ("Mul", np.int64, 2**62, 3, 3 * 2**62), ("Mul", np.int64, -2**62, 3, -3 * 2**62),
    ("Sub", np.uint64, 0, 1, 2**64 - 1), ("Div", np.int32, -2**31, -1, -2**31), ("Div", np.int8, -128, -1, -128)])
def test_integer_overflow_wraps(op, dtype, a, b, expected):
    exp = ((expected + 2**63) % 2**64 - 2**63) if dtype == np.int64 else expected
    out = run(op, 14, [np.array([a, a], dtype), np.array([b, b], dtype)])
    assert_same(out, np.array([exp, exp], dtype))


# -- Div -----------------------------------------------------------------------------------------

def int_div_params(dtypes):
    """(version, dtype) for the integer types each Div version allows (int8/16, uint8/16 from 14)."""
    return [(v, t) for v in (6, 7, 13, 14) for t in dtypes if v == 14 or np.dtype(t).itemsize >= 4]


@pytest.mark.parametrize("version,dtype", int_div_params([np.int8, np.int16, np.int32, np.int64]))
def test_integer_div_truncates_toward_zero(version, dtype):
    a = np.array([7, -7, 7, -7, -8, 0, 1, -1, 9, -9, 6, -6], dtype)
    b = np.array([2, 2, -2, -2, 3, 5, 3, 3, -10, 10, 3, -3], dtype)
    expected = np.array([3, -3, -3, 3, -2, 0, 0, 0, 0, 0, 2, 2], dtype)   # C: trunc(a / b)
    assert_same(run("Div", version, [a, b]), expected)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64])
def test_unsigned_div(dtype):
    a = np.array([7, 200, 0, np.iinfo(dtype).max], dtype)
    b = np.array([2, 3, 9, 2], dtype)
    assert_same(run("Div", 14, [a, b]), np.array([3, 66, 0, np.iinfo(dtype).max // 2], dtype))


@pytest.mark.parametrize("version,dtype", int_div_params([np.int32, np.int64, np.uint32, np.int8, np.uint16]))
def test_integer_division_by_zero_is_an_error(version, dtype):
    with pytest.raises(KernelError, match=re.compile("the_node.*division by zero", re.I)):
        run_node("Div", version, [np.array([1, 2, 3], dtype), np.array([1, 0, 1], dtype)])


@pytest.mark.parametrize("dtype", FLOATS)
def test_float_division_by_zero_is_ieee(dtype):
    with np.errstate(all="ignore"):
        out = run("Div", 14 if dtype != np.float16 else 7, [arr([1, -1, 0, 3], dtype), arr([0, 0, 0, -0.0], dtype)])
    assert_same(out, arr([np.inf, -np.inf, np.nan, -np.inf], dtype))


@pytest.mark.parametrize("dtype", [np.float16, BF16])
def test_low_precision_div_rounds_once(dtype):
    # 1/3 computed in float32 and rounded once to the target type
    out = run("Div", 14, [arr([1, 2, 10], dtype), arr([3, 3, 7], dtype)])
    assert_same(out, (np.array([1, 2, 10], np.float32) / np.array([3, 3, 7], np.float32)).astype(dtype))


# -- Mod -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("version,tname", type_matrix("Mod", [10, 13, 28]))
@pytest.mark.parametrize("fmod", [0, 1])
def test_mod_every_type(version, tname, fmod):
    dt = np_type(tname)
    x, y = arr([4, 7, 5, 9, 0], dt), arr([2, 3, 8, 4, 3], dt)
    if dt.kind == "f" or dt == BF16:
        if fmod == 0 and version < 28:
            with pytest.raises(KernelError, match="fmod"):
                run("Mod", version, [x, y], fmod=fmod)
            return
    assert_same(run("Mod", version, [x, y], fmod=fmod), arr([0, 1, 5, 1, 0], dt))


@pytest.mark.parametrize("version", [10, 13, 28])
@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64])
def test_mod_integer_signs(version, dtype):
    x = np.array([-4, 7, 5, 4, -7, 8, -7, 7], dtype)
    y = np.array([2, -3, 8, -2, 3, 5, -3, 3], dtype)
    # fmod=0: sign of the divisor (floor); fmod=1: sign of the dividend (C %)
    assert_same(run("Mod", version, [x, y]), np.array([0, -2, 5, 0, 2, 3, -1, 1], dtype))
    assert_same(run("Mod", version, [x, y], fmod=1), np.array([0, 1, 5, 0, -1, 3, -1, 1], dtype))


@pytest.mark.parametrize("version,dtype", [(v, t) for v in (10, 13, 28) for t in FLOATS if v > 10 or t != BF16])
def test_mod_float_fmod_1_sign_of_dividend(version, dtype):
    x, y = arr([-4.5, 7.5, 5, 4.5, -7.5, 8], dtype), arr([2, -3, 8, -2, 3, 5], dtype)
    assert_same(run("Mod", version, [x, y], fmod=1), arr([-0.5, 1.5, 5, 0.5, -1.5, 3], dtype))


@pytest.mark.parametrize("dtype", FLOATS)
def test_mod_28_float_fmod_0_sign_of_divisor(dtype):
    x, y = arr([-4.5, 7.5, 5, 4.5, -7.5, 8], dtype), arr([2, -3, 8, -2, 3, 5], dtype)
    assert_same(run("Mod", 28, [x, y]), arr([1.5, -1.5, 5, -1.5, 1.5, 3], dtype))


@pytest.mark.parametrize("dtype", FLOATS)
def test_mod_28_float_special_cases(dtype):
    inf, nan = np.inf, np.nan
    x = arr([0.0, -0.0, 0.0, -0.0, -3, 3, -1, 1, inf, -inf, 1, 1, nan, 1], dtype)
    y = arr([-2, 2, 2, -2, inf, inf, -inf, -inf, 2, 2, 0, -0.0, 2, nan], dtype)
    out = run("Mod", 28, [x, y])
    # fmod=0: zero takes y's sign; x and y of different signs with y infinite give y; else x
    assert_same(out, arr([-0.0, 0.0, 0.0, -0.0, inf, 3, -1, -inf, nan, nan, nan, nan, nan, nan], dtype))
    assert np.signbit(out[:4].astype(np.float32)).tolist() == [True, False, False, True]
    out1 = run("Mod", 28, [x, y], fmod=1)
    # fmod=1: y infinite and x finite give x; x infinite or y zero give NaN
    np.testing.assert_array_equal(out1[4:].astype(np.float64), [-3, 3, -1, 1] + [nan] * 6)


@pytest.mark.parametrize("version", [10, 13, 28])
@pytest.mark.parametrize("fmod", [0, 1])
def test_mod_integer_by_zero_is_an_error(version, fmod):
    with pytest.raises(KernelError, match=re.compile("the_node.*zero", re.I)):
        run_node("Mod", version, [np.array([5, 6], np.int32), np.array([0, 2], np.int32)], fmod=fmod)


@pytest.mark.parametrize("version", [10, 28])
def test_mod_bad_fmod_attribute(version):
    with pytest.raises(OnnxMiniError, match="the_node"):
        run_node("Mod", version, [np.array([5], np.int32), np.array([2], np.int32)], fmod=2)


def test_mod_broadcast():
    x = np.arange(12, dtype=np.int32).reshape(3, 2, 2) - 6
    y = np.array([4, -3], np.int32)
    expected = np.array([[[v % d for v, d in zip(row, [4, -3])] for row in blk] for blk in x.tolist()], np.int32)
    assert_same(run("Mod", 13, [x, y]), expected)    # Python's % takes the divisor's sign


# -- Pow -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("version,tname", type_matrix("Pow", [1, 7, 12, 13, 15]))
def test_pow_every_base_type(version, tname):
    dt = np_type(tname)
    x, y = arr([1, 2, 3, -2, 0.5 if dt.kind != "i" else 0], dt), arr([4, 5, 2, 3, 2], dt)
    expected = [1, 32, 9, -8, 0.25 if dt.kind != "i" else 0]
    assert_same(run("Pow", version, [x, y]), arr(expected, dt))


def pow_exponent_types():
    params = []
    for v in (12, 13, 15):
        schema = onnx.defs.get_schema("Pow", v)
        t1 = [t[7:-1] for t in schema.type_constraints[1].allowed_type_strs]
        params += [pytest.param(v, t, id=f"v{v}-{t}") for t in t1]
    return params


@pytest.mark.parametrize("version,t1", pow_exponent_types())
@pytest.mark.parametrize("base", ["float", "int32", "int64", "float16", "double"])
def test_pow_mixed_exponent_types(version, t1, base):
    dt = np_type(base)
    x, y = arr([1, 2, 3, -2], dt), arr([4, 5, 2, 3], np_type(t1))
    assert_same(run("Pow", version, [x, y]), arr([1, 32, 9, -8], dt))    # Z has X's type


@pytest.mark.parametrize("version", [13, 15])
def test_pow_bfloat16_base(version):
    x = arr([1.5, 2, -3, 4], BF16)
    assert_same(run("Pow", version, [x, arr([2, 3, 3, 0.5], BF16 if version == 15 else np.float32)]),
                arr([2.25, 8, -27, 2], BF16))
    assert_same(run("Pow", version, [x, np.array([2, 3, 3, -1], np.int64)]), arr([2.25, 8, -27, 0.25], BF16))


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_pow_integer_base_float_exponent_truncates(dtype):
    x = np.array([2, 3, -2, 9, 10, 4], dtype)
    y = np.array([0.5, 2, 3, 0.5, -1, -0.5], np.float32)
    # 2**0.5 = 1.41 -> 1; 10**-1 = 0.1 -> 0; 4**-0.5 = 0.5 -> 0 (C cast truncates)
    assert_same(run("Pow", 15, [x, y]), np.array([1, 9, -8, 3, 0, 0], dtype))


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("edtype", [np.int32, np.int64, np.int8])
def test_pow_integer_negative_exponent(dtype, edtype):
    x = np.array([2, 1, -1, -1, 5, 7, -3], dtype)
    y = np.array([-1, -3, -3, -2, 0, 1, -2], edtype)
    assert_same(run("Pow", 15, [x, y]), np.array([0, 1, -1, 1, 1, 7, 0], dtype))
    with pytest.raises(KernelError, match=re.compile("the_node.*negative", re.I)):
        run_node("Pow", 15, [np.array([0, 2], dtype), np.array([-1, 1], edtype)])


def test_pow_integer_overflow_wraps():
    out = run("Pow", 15, [np.array([2, 3, -2], np.int32), np.array([31, 21, 33], np.int64)])
    wrap = [((b ** e + 2**31) % 2**32) - 2**31 for b, e in [(2, 31), (3, 21), (-2, 33)]]
    assert_same(out, np.array(wrap, np.int32))
    out = run("Pow", 15, [np.array([3], np.int64), np.array([41], np.int64)])
    assert_same(out, np.array([((3**41 + 2**63) % 2**64) - 2**63], np.int64))


@pytest.mark.parametrize("version", [7, 12, 13, 15])
def test_pow_float_special_values(version):
    x = np.array([0, 0, -8, np.inf, np.nan, 1, 4], np.float32)
    y = np.array([0, -1, 1 / 3, -1, 0, np.nan, 0.5], np.float32)
    with np.errstate(all="ignore"):
        expected = np.array([1, np.inf, np.nan, 0, 1, 1, 2], np.float32)   # C pow
    assert_same(run("Pow", version, [x, y]), expected)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("sb,axis", [((3,), None), ((2,), 0), ((), None), ((2, 3), None), ((1,), None)])
def test_pow_legacy_broadcast(dtype, sb, axis):
    a = arr([[1, 2, 3], [-2, 0.5, 4]], dtype)
    b = arr((np.arange(math.prod(sb)) % 3 + 1).reshape(sb), dtype)
    attrs = {"broadcast": 1} if axis is None else {"broadcast": 1, "axis": axis}
    assert_same(run("Pow", 1, [a, b], **attrs), legacy_ref(PY["Pow"], a, b, axis))


def test_pow_7_needs_same_types():
    with pytest.raises(KernelError, match="the_node"):
        run_node("Pow", 7, [np.ones(2, np.float32), np.ones(2, np.float64)])


def test_pow_broadcast():
    x = arr([[1, 2, 3], [4, 5, 6]], np.float32)
    assert_same(run("Pow", 15, [x, np.array(2, np.int64)]), arr([[1, 4, 9], [16, 25, 36]], np.float32))
    assert_same(run("Pow", 15, [x, arr([[1], [0]], np.float32)]), arr([[1, 2, 3], [1, 1, 1]], np.float32))


# -- Max, Min, Sum, Mean -------------------------------------------------------------------------

VARIADIC = {  # op: (versions, expected of X1..X3 below)
    "Max": ([1, 6, 8, 12, 13], [4, 8, 3]),
    "Min": ([1, 6, 8, 12, 13], [1, 2, 0]),
    "Sum": ([1, 6, 8, 13], [6, 15, 6]),
    "Mean": ([1, 6, 8, 13], [2, 5, 2]),
}
X1, X2, X3 = [1, 5, 3], [4, 2, 3], [1, 8, 0]


@pytest.mark.parametrize("op", VARIADIC)
def test_variadic_versions_are_listed(op):
    assert versions(op) == VARIADIC[op][0]


@pytest.mark.parametrize("op,version,tname", op_type_matrix(VARIADIC))
def test_variadic_every_type(op, version, tname):
    dt = np_type(tname)
    xs = [arr(x, dt) for x in (X1, X2, X3)]
    assert_same(run(op, version, xs), arr(VARIADIC[op][1], dt))
    # one input: the input itself; two inputs
    assert_same(run(op, version, xs[:1]), arr(X1, dt))
    two = {"Max": [4, 5, 3], "Min": [1, 2, 3], "Sum": [5, 7, 6], "Mean": [2.5, 3.5, 3]}[op]
    if op == "Mean" and dt.kind in "iu":
        return
    assert_same(run(op, version, xs[:2]), arr(two, dt))


@pytest.mark.parametrize("op", VARIADIC)
@pytest.mark.parametrize("version", [8, 13])
def test_variadic_broadcast(op, version):
    a = np.arange(6, dtype=np.float32).reshape(2, 1, 3)
    b = np.array([4, -1, 2], np.float32)
    c = np.array([[1], [3], [5], [0]], np.float32)             # -> (2, 4, 3)
    fn = {"Max": max, "Min": min, "Sum": lambda *v: sum(v), "Mean": lambda *v: sum(v) / 3}[op]
    expected = np.empty((2, 4, 3), np.float32)
    for i, j, k in np.ndindex(2, 4, 3):
        expected[i, j, k] = fn(a[i, 0, k], b[k], c[j, 0])
    out = run(op, version, [a, b, c])
    if op == "Mean":
        np.testing.assert_allclose(out, expected, rtol=1e-6)
        assert out.dtype == np.float32 and out.shape == (2, 4, 3)
    else:
        assert_same(out, expected)


@pytest.mark.parametrize("op", VARIADIC)
@pytest.mark.parametrize("version", [1, 6])
def test_variadic_legacy_needs_same_shapes(op, version):
    with pytest.raises(KernelError, match=re.compile("the_node.*shape", re.I)):
        run_node(op, version, [np.ones((2, 3), np.float32), np.ones((3,), np.float32)])


@pytest.mark.parametrize("op", ["Max", "Min"])
@pytest.mark.parametrize("dtype", FLOATS)
def test_max_min_propagate_nan(op, dtype):
    version = 13 if dtype == BF16 else 8
    out = run(op, version, [arr([np.nan, 1, 2, -np.inf], dtype), arr([1, np.nan, 3, 5], dtype)])
    best = 3 if op == "Max" else 2
    other = 5 if op == "Max" else -np.inf
    assert_same(out, arr([np.nan, np.nan, best, other], dtype))


@pytest.mark.parametrize("op", ["Max", "Min"])
@pytest.mark.parametrize("dtype", [np.int8, np.int64, np.uint64])
def test_max_min_integer_extremes(op, dtype):
    info = np.iinfo(dtype)
    a = np.array([info.min, info.max, 0], dtype)
    b = np.array([info.max, 1, info.min], dtype)
    expected = [info.max, info.max, 0] if op == "Max" else [info.min, 1, info.min]
    assert_same(run(op, 13, [a, b]), np.array(expected, dtype))


@pytest.mark.parametrize("dtype,big", [(np.float16, 2048), (BF16, 256)])
def test_sum_mean_low_precision_round_once(dtype, big):
    # big + 1 + 1: one float16/bfloat16 rounding per step would give big; float32 gives big + 2
    xs = [arr([big], dtype), arr([1], dtype), arr([1], dtype)]
    assert_same(run("Sum", 13, xs), arr([big + 2], dtype))
    assert_same(run("Mean", 13, xs), arr([(big + 2) / 3], dtype))


@pytest.mark.parametrize("op", VARIADIC)
def test_variadic_empty_and_scalar(op):
    assert_same(run(op, 13, [np.zeros((0, 3), np.float32), np.ones((1, 3), np.float32)]),
                np.zeros((0, 3), np.float32))
    out = run(op, 13, [np.array(2, np.float32), np.array(4, np.float32)])
    assert_same(out, np.array({"Max": 4, "Min": 2, "Sum": 6, "Mean": 3}[op], np.float32))


# -- Clip ----------------------------------------------------------------------------------------

CLIP_X = [-3, -1, 0, 0.5, 2, 7]


@pytest.mark.parametrize("version", [1, 6])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("attrs,expected", [
    ({"min": -1.0, "max": 1.0}, [-1, -1, 0, 0.5, 1, 1]),
    ({"min": 0.0}, [0, 0, 0, 0.5, 2, 7]),
    ({"max": 0.25}, [-3, -1, 0, 0.25, 0.25, 0.25]),
    ({}, CLIP_X),
    ({"min": -1e6, "max": 1e6}, CLIP_X),       # out of float16's range: no clipping
])
def test_clip_attributes(version, dtype, attrs, expected):
    assert_same(run("Clip", version, [arr(CLIP_X, dtype)], **attrs), arr(expected, dtype))


@pytest.mark.parametrize("version,tname", type_matrix("Clip", [11, 12, 13]))
def test_clip_inputs_every_type(version, tname):
    dt = np_type(tname)
    if dt.kind == "u":
        x, lo, hi, exp = [0, 3, 5, 9, 200], 3, 9, [3, 3, 5, 9, 9]
    else:
        x, lo, hi, exp = [-5, -2, 0, 3, 100], -2, 3, [-2, -2, 0, 3, 3]
    x = arr(x, dt)
    assert_same(run_node("Clip", version, [x, arr(lo, dt), arr(hi, dt)]), arr(exp, dt))
    # omitted min (empty name in the middle), omitted max (trailing), both omitted
    assert_same(run_node("Clip", version, [x, None, arr(hi, dt)]), arr(np.minimum(x.astype(float), hi), dt))
    assert_same(run_node("Clip", version, [x, arr(lo, dt)]), arr(np.maximum(x.astype(float), lo), dt))
    assert_same(run_node("Clip", version, [x]), x)


@pytest.mark.parametrize("version,dtype", [(v, t) for v in (11, 12, 13) for t in FLOATS if v == 13 or t != BF16])
def test_clip_nan_propagates(version, dtype):
    out = run("Clip", version, [arr([np.nan, -5, 5], dtype), arr(-1, dtype), arr(1, dtype)])
    assert_same(out, arr([np.nan, -1, 1], dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.uint8])
def test_clip_13_min_greater_than_max_gives_max(dtype):
    x = arr([0, 2, 5, 9, 12], dtype)
    assert_same(run("Clip", 13, [x, arr(8, dtype), arr(3, dtype)]), arr([3, 3, 3, 3, 3], dtype))


@pytest.mark.parametrize("version", [1, 6])
def test_clip_attributes_min_greater_than_max(version):
    out = run("Clip", version, [arr([0, 2, 9], np.float32)], min=8.0, max=3.0)
    assert_same(out, arr([3, 3, 3], np.float32))


@pytest.mark.parametrize("version", [11, 12, 13])
def test_clip_bounds_of_one_element(version):
    x = arr([[-3, 0], [2, 9]], np.float32)
    out = run("Clip", version, [x, arr([-1], np.float32), arr([[4]], np.float32)])
    assert_same(out, arr([[-1, 0], [2, 4]], np.float32))
    assert_same(run("Clip", version, [arr(7, np.float32), arr([1], np.float32), arr([2], np.float32)]),
                arr(2, np.float32))             # 0-d stays 0-d


@pytest.mark.parametrize("version", [11, 12, 13])
def test_clip_bad_bounds(version):
    x = arr([1, 2], np.float32)
    with pytest.raises(KernelError, match=re.compile("the_node.*scalar", re.I)):
        run_node("Clip", version, [x, arr([0, 1], np.float32)])
    with pytest.raises(KernelError, match=re.compile("the_node.*type", re.I)):
        run_node("Clip", version, [x, None, arr(1, np.float64)])


def test_clip_empty():
    assert_same(run("Clip", 13, [np.zeros((0, 2), np.float32), arr(0, np.float32)]), np.zeros((0, 2), np.float32))


# -- Expand --------------------------------------------------------------------------------------

@pytest.mark.parametrize("version,tname", type_matrix("Expand", [8, 13]))
def test_expand_every_type(version, tname):
    x = sample(tname, (3, 1))
    out = run("Expand", version, [x, i64([2, 1, 4])])
    expected = np.empty((2, 3, 4), dtype=x.dtype)
    for i, j, k in np.ndindex(2, 3, 4):
        expected[i, j, k] = x[j, 0]
    assert_same(out, expected)


@pytest.mark.parametrize("version", [8, 13])
@pytest.mark.parametrize("in_shape,shape,out_shape", [
    ((3, 1), [3, 4], (3, 4)), ((3, 1), [4], (3, 4)), ((3, 1), [1, 1], (3, 1)), ((3, 1), [], (3, 1)),
    ((3, 1), [2, 1, 6], (2, 3, 6)), ((1,), [2, 3], (2, 3)), ((), [2], (2,)), ((2, 3), [1, 1, 1], (1, 2, 3)),
    ((3, 1), [0], (3, 0)), ((1, 3), [0, 1], (0, 3)), ((0, 2), [3, 1, 1], (3, 0, 2)),
])
def test_expand_shapes(version, in_shape, shape, out_shape):
    x = np.asarray(np.arange(math.prod(in_shape), dtype=np.float32).reshape(in_shape) * 1.5)
    out = run("Expand", version, [x, i64(shape)])
    assert out.shape == out_shape and out.dtype == np.float32
    # out[idx] = x[idx right-aligned, 0 where x's dim is 1]
    for pos in np.ndindex(*out_shape):
        src = tuple(0 if d == 1 else p for p, d in zip(pos[len(pos) - len(in_shape):], in_shape))
        assert out[pos] == x[src]


@pytest.mark.parametrize("version", [8, 13])
@pytest.mark.parametrize("in_shape,shape,pattern", [
    ((3, 2), [4], "broadcast"), ((3, 2), [3, 3], "broadcast"), ((2,), [2, -1], "negative"),
])
def test_expand_errors(version, in_shape, shape, pattern):
    with pytest.raises(KernelError, match=re.compile(f"the_node.*{pattern}", re.I)):
        run_node("Expand", version, [np.zeros(in_shape, np.float32), i64(shape)])


def test_expand_shape_must_be_int64():
    with pytest.raises(KernelError, match="int64"):
        run_node("Expand", 13, [np.zeros(3, np.float32), np.array([2, 3], np.int32)])


def test_expand_leaves_input_alone():
    x = np.array([[1], [2]], np.int32)
    out = run("Expand", 13, [x, i64([2, 3])])
    assert_same(out, np.array([[1, 1, 1], [2, 2, 2]], np.int32))
    assert_same(x, np.array([[1], [2]], np.int32))
