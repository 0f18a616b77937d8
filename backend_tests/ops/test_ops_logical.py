"""Spec tests for the logical family: And, Or, Xor, Not, Equal, Greater, Less, GreaterOrEqual,
LessOrEqual, BitShift, BitwiseAnd/Or/Xor/Not, every version and every type of each version.

Expected values are hand-written truth tables or plain formulas transcribed from the spec text.
"""
from __future__ import annotations

import math
import re

import ml_dtypes
import numpy as np
import pytest

from onnx_mini.errors import KernelError, OnnxMiniError

from helpers import (arr, assert_same, legacy_ref, np_type, op_type_matrix, run_node, run_op as run, type_matrix,
                     versions)

T, F = True, False


def bools(values) -> np.ndarray:
    return np.array(values, dtype=bool)


def broadcast_ref(fn, a, b, dtype=bool):
    """Multidirectional broadcasting: right-align, each dim pair equal or one of them 1."""
    r = max(a.ndim, b.ndim)
    sa, sb = (1,) * (r - a.ndim) + a.shape, (1,) * (r - b.ndim) + b.shape
    shape = tuple(y if x == 1 else x for x, y in zip(sa, sb))
    a2, b2 = a.reshape(sa), b.reshape(sb)
    out = np.empty(shape, dtype=dtype)
    for pos in np.ndindex(*shape):
        out[pos] = fn(a2[tuple(0 if d == 1 else p for p, d in zip(pos, sa))].item(),
                      b2[tuple(0 if d == 1 else p for p, d in zip(pos, sb))].item())
    return out


# -- And, Or, Xor, Not ---------------------------------------------------------------------------

LOGIC = {"And": (lambda x, y: x and y, [T, F, F, F]),
         "Or": (lambda x, y: x or y, [T, T, T, F]),
         "Xor": (lambda x, y: x != y, [F, T, T, F])}
TA, TB = bools([T, T, F, F]), bools([T, F, T, F])


@pytest.mark.parametrize("op", LOGIC)
def test_logic_versions_are_listed(op):
    assert versions(op) == [1, 7]


@pytest.mark.parametrize("op", LOGIC)
@pytest.mark.parametrize("version,tname", type_matrix("And", [1, 7]))
def test_logic_truth_tables(op, version, tname):
    assert tname == "bool"
    assert_same(run(op, version, [TA, TB]), bools(LOGIC[op][1]))
    assert_same(run(op, version, [bools(T), bools(F)]), bools(LOGIC[op][0](T, F)))   # 0-d


@pytest.mark.parametrize("op", LOGIC)
@pytest.mark.parametrize("sa,sb", [((3, 4), (4,)), ((2, 1, 4), (3, 1)), ((1,), (2, 2)), ((), (3,)),
                                   ((2, 0, 3), (1, 3)), ((3, 4, 5), (3, 4, 5))])
def test_logic_broadcast(op, sa, sb):
    a = bools(np.arange(math.prod(sa)) % 3 == 0).reshape(sa)
    b = bools(np.arange(math.prod(sb)) % 2 == 0).reshape(sb)
    assert_same(run(op, 7, [a, b]), broadcast_ref(LOGIC[op][0], a, b))


LEGACY_SHAPES = [((5,), None), ((4, 5), None), ((3, 4), 1), ((2,), 0), ((), None), ((1, 1), None),
                 ((2, 3, 4, 5), None), ((4,), 2), ((3, 1), 1)]


@pytest.mark.parametrize("op", LOGIC)
@pytest.mark.parametrize("sb,axis", LEGACY_SHAPES)
def test_logic_legacy_broadcast(op, sb, axis):
    a = bools(np.arange(120).reshape(2, 3, 4, 5) % 3 == 0)
    b = bools(np.arange(math.prod(sb)) % 2 == 0).reshape(sb)
    attrs = {"broadcast": 1} if axis is None else {"broadcast": 1, "axis": axis}
    assert_same(run(op, 1, [a, b], **attrs), legacy_ref(LOGIC[op][0], a, b, axis, bool))


@pytest.mark.parametrize("op", LOGIC)
def test_logic_legacy_without_broadcast_needs_same_shape(op):
    with pytest.raises(KernelError, match=re.compile("the_node.*broadcast", re.I)):
        run_node(op, 1, [bools([[T, F], [F, T]]), bools([T, F])])


@pytest.mark.parametrize("op", list(LOGIC) + ["BitwiseAnd", "Equal", "Greater", "LessOrEqual", "BitShift"])
def test_shapes_that_do_not_broadcast(op):
    attrs = {"direction": "LEFT"} if op == "BitShift" else {}
    dt = bool if op in LOGIC or op == "Equal" else np.uint8
    with pytest.raises(KernelError, match=re.compile(rf"the_node.*{op}.*(broadcast|shape)", re.I)):
        run_node(op, versions(op)[-1], [np.ones((2, 3), dt), np.ones((2,), dt)], **attrs)


@pytest.mark.parametrize("version,tname", type_matrix("Not", [1]))
@pytest.mark.parametrize("shape", [(4,), (2, 2), (), (0, 3)])
def test_not(version, tname, shape):
    x = bools(np.arange(math.prod(shape)) % 3 == 0).reshape(shape)
    assert_same(run("Not", version, [x]), bools([not v for v in x.ravel().tolist()]).reshape(shape))


# -- comparisons ---------------------------------------------------------------------------------

CMP = {  # op: (versions, python comparison)
    "Equal": ([1, 7, 11, 13, 19], lambda x, y: x == y),
    "Greater": ([1, 7, 9, 13], lambda x, y: x > y),
    "Less": ([1, 7, 9, 13], lambda x, y: x < y),
    "GreaterOrEqual": ([12, 16], lambda x, y: x >= y),
    "LessOrEqual": ([12, 16], lambda x, y: x <= y),
}


@pytest.mark.parametrize("op", CMP)
def test_comparison_versions_are_listed(op):
    assert versions(op) == CMP[op][0]


@pytest.mark.parametrize("op,version,tname", op_type_matrix(CMP))
def test_comparison_every_type(op, version, tname):
    dt = np_type(tname)
    if tname == "bool":
        a, b = [T, T, F, F], [T, F, T, F]
    elif tname == "string":
        a, b = ["a", "b", "abc", ""], ["a", "c", "ab", ""]
    else:
        a, b = [1, 2, 3, 0], [3, 2, 1, 0]
    fn = CMP[op][1]
    expected = bools([fn(x, y) for x, y in zip(a, b)])
    assert_same(run(op, version, [arr(a, dt), arr(b, dt)]), expected)
    assert_same(run(op, version, [arr(a[0], dt), arr(b[0], dt)]), bools(expected[0]))   # 0-d


@pytest.mark.parametrize("op", CMP)
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, ml_dtypes.bfloat16])
def test_comparison_nan(op, dtype):
    version = CMP[op][0][-1]
    a = arr([np.nan, np.nan, 1, np.inf, -np.inf], dtype)
    b = arr([np.nan, 1, np.nan, np.inf, np.inf], dtype)
    # every comparison with NaN is false; inf == inf
    expected = {"Equal": [F, F, F, T, F], "Greater": [F, F, F, F, F], "Less": [F, F, F, F, T],
                "GreaterOrEqual": [F, F, F, T, F], "LessOrEqual": [F, F, F, T, T]}[op]
    assert_same(run(op, version, [a, b]), bools(expected))


@pytest.mark.parametrize("op", CMP)
@pytest.mark.parametrize("dtype", [np.int64, np.uint64])
def test_comparison_large_integers_exact(op, dtype):
    big = np.iinfo(dtype).max
    a, b = np.array([big, big - 1], dtype), np.array([big - 1, big], dtype)   # not separable as float64
    fn = CMP[op][1]
    assert_same(run(op, CMP[op][0][-1], [a, b]), bools([fn(big, big - 1), fn(big - 1, big)]))


@pytest.mark.parametrize("op", CMP)
@pytest.mark.parametrize("sa,sb", [((3, 4), (4,)), ((2, 1, 4), (3, 1)), ((), (3,)), ((2, 0), (1, 1))])
def test_comparison_broadcast(op, sa, sb):
    a = (np.arange(math.prod(sa)) % 5).astype(np.int32).reshape(sa)
    b = (np.arange(math.prod(sb)) % 3 + 1).astype(np.int32).reshape(sb)
    assert_same(run(op, CMP[op][0][-1], [a, b]), broadcast_ref(CMP[op][1], a, b))
    assert_same(run(op, CMP[op][0][-1], [b, a]), broadcast_ref(CMP[op][1], b, a))


@pytest.mark.parametrize("op", ["Equal", "Greater", "Less"])
@pytest.mark.parametrize("sb,axis", LEGACY_SHAPES)
def test_comparison_legacy_broadcast(op, sb, axis):
    dt = np.int32 if op == "Equal" else np.float32
    a = (np.arange(120).reshape(2, 3, 4, 5) % 4).astype(dt)
    b = (np.arange(math.prod(sb)) % 3 + 1).astype(dt).reshape(sb)
    attrs = {"broadcast": 1} if axis is None else {"broadcast": 1, "axis": axis}
    assert_same(run(op, 1, [a, b], **attrs), legacy_ref(CMP[op][1], a, b, axis, bool))


def test_equal_strings_broadcast():
    a = np.array([["a", "b"], ["b", "c"]], dtype=object)
    assert_same(run("Equal", 19, [a, np.array(["b"], dtype=object)]), bools([[F, T], [T, F]]))


@pytest.mark.parametrize("op", CMP)
def test_comparison_mixed_types_are_an_error(op):
    with pytest.raises(KernelError, match=re.compile("the_node.*type", re.I)):
        run_node(op, CMP[op][0][-1], [np.ones(2, np.int32), np.ones(2, np.int64)])


# -- BitShift ------------------------------------------------------------------------------------

def test_bitshift_versions_are_listed():
    assert versions("BitShift") == [11, 28]


@pytest.mark.parametrize("version,tname", type_matrix("BitShift", [11, 28]))
def test_bitshift_every_type(version, tname):
    dt = np_type(tname)
    x, s = arr([16, 4, 1, 7], dt), arr([1, 2, 3, 0], dt)
    assert_same(run("BitShift", version, [x, s], direction="RIGHT"), arr([8, 1, 0, 7], dt))
    assert_same(run("BitShift", version, [x, s], direction="LEFT"), arr([32, 16, 8, 7], dt))
    # bits pushed out of the top are lost: the top bit moved one more place left
    bits = dt.itemsize * 8
    top = arr([1 << (bits - 1) if dt.kind == "u" else -(1 << (bits - 1))], dt)
    assert_same(run("BitShift", version, [top, arr([1], dt)], direction="LEFT"), arr([0], dt))


@pytest.mark.parametrize("version", [11, 28])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64])
def test_bitshift_unsigned_wide_shift(version, dtype):
    bits = np.dtype(dtype).itemsize * 8
    x = np.array([1, 255, np.iinfo(dtype).max], dtype)
    s = np.array([bits, bits - 1, bits + 3], dtype)
    right = [0, 0 if bits > 8 else 1, 0]
    left = [0, (255 << (bits - 1)) % 2**bits, 0]
    assert_same(run("BitShift", version, [x, s], direction="RIGHT"), np.array(right, dtype))
    assert_same(run("BitShift", version, [x, s], direction="LEFT"), np.array(left, dtype))


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64])
def test_bitshift_28_signed(dtype):
    bits = np.dtype(dtype).itemsize * 8
    x = np.array([-8, -8, -1, 5, -5, 64, -7, 7, 3], dtype)
    s = np.array([1, bits, 3, bits + 1, -1, 1, -2, bits - 1, bits - 2], dtype)
    # right: arithmetic (sign-filling); shift >= width or < 0 gives -1 for negative x, else 0
    right = [-4, -1, -1, 0, -1, 32, -1, 0, 0]
    # left: bits past the top are lost; shift >= width or < 0 gives 0
    wrap = lambda v: ((v + 2 ** (bits - 1)) % 2**bits) - 2 ** (bits - 1)
    left = [-16, 0, -8, 0, 0, wrap(128), 0, wrap(7 << (bits - 1)), wrap(3 << (bits - 2))]
    assert_same(run("BitShift", 28, [x, s], direction="RIGHT"), np.array(right, dtype))
    assert_same(run("BitShift", 28, [x, s], direction="LEFT"), np.array(left, dtype))


def test_bitshift_broadcast():
    x = np.array([[1], [6]], np.uint32)
    s = np.array([0, 1, 2], np.uint32)
    assert_same(run("BitShift", 11, [x, s], direction="LEFT"), np.array([[1, 2, 4], [6, 12, 24]], np.uint32))
    assert_same(run("BitShift", 11, [x, s], direction="RIGHT"), np.array([[1, 0, 0], [6, 3, 1]], np.uint32))


@pytest.mark.parametrize("version", [11, 28])
@pytest.mark.parametrize("attrs", [{"direction": "UP"}, {"direction": "left"}, {}])
def test_bitshift_bad_direction(version, attrs):
    with pytest.raises(OnnxMiniError, match=re.compile("the_node.*direction", re.I)):
        run_node("BitShift", version, [np.ones(2, np.uint8), np.ones(2, np.uint8)], **attrs)


def test_bitshift_mixed_types_are_an_error():
    with pytest.raises(KernelError, match=re.compile("the_node.*type", re.I)):
        run_node("BitShift", 28, [np.ones(2, np.uint8), np.ones(2, np.int8)], direction="LEFT")


# -- BitwiseAnd, BitwiseOr, BitwiseXor, BitwiseNot ----------------------------------------------

BITWISE = {"BitwiseAnd": (lambda x, y: x & y), "BitwiseOr": (lambda x, y: x | y),
           "BitwiseXor": (lambda x, y: x ^ y)}


@pytest.mark.parametrize("op", list(BITWISE) + ["BitwiseNot"])
def test_bitwise_versions_are_listed(op):
    assert versions(op) == [18]


@pytest.mark.parametrize("op", BITWISE)
@pytest.mark.parametrize("version,tname", type_matrix("BitwiseAnd", [18]))
def test_bitwise_every_type(op, version, tname):
    dt = np_type(tname)
    a, b = [12, 10, 0, 7, 127], [10, 6, 5, 7, 64]
    expected = {"BitwiseAnd": [8, 2, 0, 7, 64], "BitwiseOr": [14, 14, 5, 7, 127],
                "BitwiseXor": [6, 12, 5, 0, 63]}[op]
    assert_same(run(op, version, [arr(a, dt), arr(b, dt)]), arr(expected, dt))
    if dt.kind == "i":   # two's complement: -1 has every bit set, -128 only the top bits
        a, b = [-1, -1, -128, -6], [5, -3, 127, -3]
        fn = BITWISE[op]
        assert_same(run(op, version, [arr(a, dt), arr(b, dt)]), arr([fn(x, y) for x, y in zip(a, b)], dt))


@pytest.mark.parametrize("op", BITWISE)
def test_bitwise_broadcast(op):
    a = np.array([[1], [6], [255]], np.uint16)
    b = np.array([3, 4], np.uint16)
    assert_same(run(op, 18, [a, b]), broadcast_ref(BITWISE[op], a, b, np.uint16))


@pytest.mark.parametrize("version,tname", type_matrix("BitwiseNot", [18]))
def test_bitwise_not_every_type(version, tname):
    dt = np_type(tname)
    bits = dt.itemsize * 8
    x = [0, 1, 12, 100]
    # every bit flipped: 2**bits - 1 - x unsigned, -x - 1 signed
    expected = [(2**bits - 1 - v) if dt.kind == "u" else -v - 1 for v in x]
    assert_same(run("BitwiseNot", version, [arr(x, dt)]), arr(expected, dt))
    assert_same(run("BitwiseNot", version, [arr(x[2], dt)]), arr(expected[2], dt))   # 0-d


@pytest.mark.parametrize("op", BITWISE)
def test_bitwise_mixed_types_are_an_error(op):
    with pytest.raises(KernelError, match=re.compile("the_node.*type", re.I)):
        run_node(op, 18, [np.ones(2, np.int32), np.ones(2, np.uint32)])
