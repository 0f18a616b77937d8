"""Spec tests for ConstantOfShape, EyeLike and Range, every version and every type of each version's
type constraints. Expected values are written by hand or computed by the spec's formulas."""
from __future__ import annotations

import math
import re

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto

from helpers import NODE, assert_same, i64, np_type, run_node, sample, type_params
from onnx_mini.errors import InvalidNodeError, KernelError


# -- ConstantOfShape -------------------------------------------------------------------------------

COS_VERSIONS = [9, 20, 21, 23, 24, 25]


@pytest.mark.parametrize("version,tname", type_params("ConstantOfShape", COS_VERSIONS, "T2"))
def test_constant_of_shape_every_type(version, tname):
    value = sample(tname, (3,))[2:3]  # a non-zero value of the type
    got = run_node("ConstantOfShape", version, [i64([2, 3])], value=value)
    exp = np.empty((2, 3), dtype=value.dtype)
    exp[...] = value[0]
    assert_same(got, exp)


@pytest.mark.parametrize("version", COS_VERSIONS)
def test_constant_of_shape_forms(version):
    # no value: float32 zeros
    assert_same(run_node("ConstantOfShape", version, [i64([3, 1, 2])]), np.zeros((3, 1, 2), np.float32))
    # an empty shape gives a scalar; a zero dimension an empty tensor
    assert_same(run_node("ConstantOfShape", version, [i64([])], value=np.array([7], np.int32)),
                np.array(7, dtype=np.int32))
    assert_same(run_node("ConstantOfShape", version, [i64([0, 4])], value=np.array([1.5], np.float64)),
                np.zeros((0, 4), np.float64))
    assert_same(run_node("ConstantOfShape", version, [i64([2])], value=np.array([True])), np.array([True, True]))
    # a 1-element value of any rank
    assert_same(run_node("ConstantOfShape", version, [i64([2])], value=np.array([[-2]], np.int8)),
                np.array([-2, -2], np.int8))


@pytest.mark.parametrize("version", COS_VERSIONS)
def test_constant_of_shape_errors(version):
    with pytest.raises(KernelError, match=re.compile(f"{NODE}.*negative", re.S)):
        run_node("ConstantOfShape", version, [i64([2, -1])])
    with pytest.raises(KernelError, match=re.compile(f"{NODE}.*int64", re.S)):
        run_node("ConstantOfShape", version, [np.array([2], np.int32)])
    with pytest.raises(InvalidNodeError, match=re.compile(f"{NODE}.*one-element", re.S)):
        run_node("ConstantOfShape", version, [i64([2])], value=np.array([1.0, 2.0], np.float32))


def test_constant_of_shape_type_per_version():
    bf = np.array([1.5], dtype=ml_dtypes.bfloat16)
    with pytest.raises(InvalidNodeError, match=NODE):  # bfloat16 comes with version 20
        run_node("ConstantOfShape", 9, [i64([2])], value=bf)
    assert_same(run_node("ConstantOfShape", 20, [i64([2])], value=bf), np.array([1.5, 1.5], ml_dtypes.bfloat16))
    i4 = np.array([-3], dtype=ml_dtypes.int4)
    with pytest.raises(InvalidNodeError, match=NODE):  # int4 comes with version 21
        run_node("ConstantOfShape", 20, [i64([2])], value=i4)
    assert_same(run_node("ConstantOfShape", 21, [i64([2])], value=i4), np.array([-3, -3], ml_dtypes.int4))


# -- EyeLike ---------------------------------------------------------------------------------------

def eye_ref(rows, cols, k, dtype):
    """T2[i, i + k] = 1, zeros elsewhere, element by element."""
    out = np.zeros((rows, cols), dtype=dtype)
    for i in range(rows):
        if 0 <= i + k < cols:
            out[i, i + k] = 1
    return out


@pytest.mark.parametrize("version,tname", type_params("EyeLike", [9, 22], "T1"))
def test_eye_like_every_input_type(version, tname):
    x = sample(tname, (3, 4))
    assert_same(run_node("EyeLike", version, [x]), eye_ref(3, 4, 0, x.dtype))
    assert_same(run_node("EyeLike", version, [x], k=1), eye_ref(3, 4, 1, x.dtype))


@pytest.mark.parametrize("version,tname", type_params("EyeLike", [9, 22], "T2"))
def test_eye_like_every_dtype(version, tname):
    x = np.zeros((4, 2), np.int32)
    dtype = getattr(TensorProto, tname.upper())
    assert_same(run_node("EyeLike", version, [x], dtype=dtype, k=-1), eye_ref(4, 2, -1, np_type(tname)))


@pytest.mark.parametrize("version", [9, 22])
@pytest.mark.parametrize("shape", [(3, 3), (2, 5), (5, 2), (1, 1), (0, 3), (3, 0)])
@pytest.mark.parametrize("k", [0, 1, 2, -1, -2, 4, -5, 10])
def test_eye_like_offsets_and_shapes(version, shape, k):
    x = np.ones(shape, np.float32)
    assert_same(run_node("EyeLike", version, [x], k=k), eye_ref(*shape, k, np.float32))


def test_eye_like_hand_example():
    got = run_node("EyeLike", 22, [np.zeros((3, 4), np.float32)], k=1, dtype=TensorProto.INT64)
    assert_same(got, i64([[0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]))


@pytest.mark.parametrize("version", [9, 22])
def test_eye_like_errors(version):
    with pytest.raises(KernelError, match=re.compile(f"{NODE}.*2-D", re.S)):
        run_node("EyeLike", version, [np.zeros((2, 2, 2), np.float32)])
    with pytest.raises(InvalidNodeError, match=re.compile(f"{NODE}.*dtype", re.S)):
        run_node("EyeLike", version, [np.zeros((2, 2), np.float32)], dtype=TensorProto.STRING)
    if version == 9:  # bfloat16 comes with version 22
        with pytest.raises(InvalidNodeError, match=NODE):
            run_node("EyeLike", version, [np.zeros((2, 2), np.float32)], dtype=TensorProto.BFLOAT16)


# -- Range -----------------------------------------------------------------------------------------

def range_ref(start, limit, delta, dtype, compute=None):
    """number_of_elements = max(ceil((limit - start) / delta), 0); output[i] = start + i * delta,
    each operation in the compute type (the input type unless given), one rounding to the type."""
    ct = np.dtype(compute or dtype)
    s, lim, d = (np.array(v).astype(dtype).astype(ct) for v in (start, limit, delta))
    if ct.kind in "iu":
        n = max(math.ceil(int(lim - s) / int(d)), 0) if abs(int(lim - s)) < 2**50 else None
        return np.array([int(s) + i * int(d) for i in range(n)], dtype=np.int64).astype(dtype)
    n = max(int(np.ceil(ct.type((lim - s) / d))), 0)
    return np.array([ct.type(s + ct.type(i) * d) for i in range(n)], dtype=ct).astype(dtype)


RANGE_CASES = [  # (start, limit, delta)
    (3, 9, 3), (10, 4, -2), (0, 5, 1), (5, 1, 2), (1, 1, 1), (1, 5, -1), (-3, 3, 4), (2, -7, -3), (0, 1, 5),
]
FLOAT_RANGE_CASES = [(0.5, 2.25, 0.25), (1.0, -1.0, -0.375), (0.1, 1.0, 0.1), (0.0, 1.0, 0.3)]


@pytest.mark.parametrize("version,tname", type_params("Range", [11, 27], "T"))
def test_range_every_type(version, tname):
    dt = np_type(tname)
    cases = RANGE_CASES + (FLOAT_RANGE_CASES if dt.kind not in "iu" else [])
    compute = np.float32 if dt.itemsize == 2 and dt.kind not in "iu" else None
    for start, limit, delta in cases:
        inputs = [np.array(v).astype(dt) for v in (start, limit, delta)]
        assert_same(run_node("Range", version, inputs), range_ref(start, limit, delta, dt, compute))


def scalars(dtype, *vals) -> list:
    return [np.array(v, dtype) for v in vals]


def test_range_hand_examples():
    assert_same(run_node("Range", 11, scalars(np.int32, 3, 9, 3)), np.array([3, 6], np.int32))
    assert_same(run_node("Range", 11, scalars(np.int64, 10, 4, -2)), i64([10, 8, 6]))
    assert_same(run_node("Range", 27, scalars(np.float32, 5, 1, 1)), np.zeros(0, np.float32))
    # start + i * delta, not a running sum: the 10th value of 0.1 steps is float32(0.1) * 9 + 0
    got = run_node("Range", 11, scalars(np.float32, 0, 1, 0.1))
    assert got.shape == (10,) and got[9] == np.float32(9) * np.float32(0.1)
    # int16 with a span beyond int16 itself
    assert_same(run_node("Range", 11, scalars(np.int16, -30000, 30000, 20000)),
                np.array([-30000, -10000, 10000], np.int16))


def test_range_float16_stash_type():
    # 2048..2051 computed in float32 and rounded once to float16 (spacing 2 there)
    args = scalars(np.float16, 2048, 2052, 1)
    exp = np.array([2048, 2049, 2050, 2051], np.float32).astype(np.float16)
    assert_same(run_node("Range", 27, args), exp)
    assert_same(run_node("Range", 27, args, stash_type=TensorProto.FLOAT), exp)


@pytest.mark.parametrize("version", [11, 27])
def test_range_errors(version):
    with pytest.raises(KernelError, match=re.compile(f"{NODE}.*delta", re.S)):
        run_node("Range", version, scalars(np.int32, 1, 5, 0))
    with pytest.raises(KernelError, match=re.compile(f"{NODE}.*finite", re.S)):
        run_node("Range", version, scalars(np.float32, 1, 5, 0))
    with pytest.raises(KernelError, match=re.compile(f"{NODE}.*one type", re.S)):
        run_node("Range", version, [np.array(1, np.int32), np.array(5, np.int64), np.array(1, np.int32)])
    with pytest.raises(KernelError, match=re.compile(f"{NODE}.*scalar", re.S)):
        run_node("Range", version, [np.array([1, 2], np.int64), np.array(5, np.int64), np.array(1, np.int64)])

