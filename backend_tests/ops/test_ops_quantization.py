"""Spec tests for QuantizeLinear / DequantizeLinear (10-28) and DynamicQuantizeLinear (11).

Expected values are hand-computed or written with the spec's formulas:
  QuantizeLinear:   y = saturate(round_half_even(x / scale) + zero_point)
  DequantizeLinear: y = (x - zero_point) * scale
"""
from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_mini
from onnx_mini.errors import InvalidNodeError, KernelError
from onnx_mini.ops.quantization import quantize_array

from helpers import NODE, assert_same, np_type, run_node, type_names

T = TensorProto
Q_VERSIONS = [10, 13, 19, 21, 23, 24, 25, 28]
F32 = np.float32


def quantize(version, x, scale, zp=None, **attrs):
    return run_node("QuantizeLinear", version, [x, scale] + ([zp] if zp is not None else []), **attrs)


def dequantize(version, x, scale, zp=None, **attrs):
    return run_node("DequantizeLinear", version, [x, scale] + ([zp] if zp is not None else []), **attrs)


def out_param(version):
    return "T3" if version >= 23 else "T2"


# -- QuantizeLinear: every type ------------------------------------------------------------------

def quantize_type_cases():
    cases = []
    for v in Q_VERSIONS:
        xs = type_names("QuantizeLinear", v, "T1")
        scales = type_names("QuantizeLinear", v, "T2") if v >= 23 else [None]
        for out in type_names("QuantizeLinear", v, out_param(v)):
            for x in xs:
                for s in scales:
                    cases.append(pytest.param(v, x, s, out, id=f"v{v}-{x}-{s or 'same'}-{out}"))
    return cases


INT_X = [0, 2, 3, 5, -2, -3, 7, 100, -100, 1000, -1000, 6]


@pytest.mark.parametrize("version,xt,st,out", quantize_type_cases())
def test_quantize_every_type(version, xt, st, out):
    st = st or ("float" if version < 19 else xt)
    x = np.array(INT_X, np.float64)
    xs = x.astype(np_type(xt)) if xt == "int32" else x.astype(F32).astype(np_type(xt))
    scale = np.array(2 if st != "float8e8m0" else 2.0, F32).astype(np_type(st))
    q = x / 2          # exact; halves round to even
    if out.startswith(("int", "uint")):
        info = ml_dtypes.iinfo(np_type(out))
        zp_value = 1 if info.max >= 1 else 0
        exp = np.clip(np.rint(q) + zp_value, int(info.min), int(info.max))
    else:  # float targets: zero point 0, the quotient converted with saturation
        zp_value = 0
        top = float(ml_dtypes.finfo(np_type(out)).max)
        exp = np.clip(q, -top, top)
        exp = exp.astype(F32).astype(np_type(out)).astype(np.float64)
    zp = np.array(zp_value, F32).astype(np_type(out))
    got = quantize(version, xs, scale, zp)
    assert_same(got, exp.astype(F32).astype(np_type(out)) if not out.startswith(("int", "uint"))
                else exp.astype(np.int64).astype(np_type(out)))


@pytest.mark.parametrize("version", Q_VERSIONS)
def test_quantize_default_is_uint8(version):
    x = np.array([0, 2, 3, 1000, -254, -1000, 509, 511], F32)
    # 3/2 = 1.5 -> 2 (even); 509/2 = 254.5 -> 254 (even); 511/2 = 255.5 -> 256 -> saturated to 255
    assert_same(quantize(version, x, np.array(2, F32)), np.array([0, 1, 2, 255, 0, 0, 254, 255], np.uint8))


@pytest.mark.parametrize("version", Q_VERSIONS)
def test_quantize_rounds_half_to_even(version):
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, -3.5, 2.4999, 2.5001], F32)
    exp = np.array([0, 2, 2, 0, -2, -2, 4, -4, 2, 3], np.int8)
    assert_same(quantize(version, x, np.array(1, F32), np.array(0, np.int8)), exp)
    # with a zero point: round(x / s) + zp, not round(x / s + zp) in float (the same here, exactly)
    assert_same(quantize(version, x, np.array(1, F32), np.array(10, np.int8)), exp + np.int8(10))


@pytest.mark.parametrize("version", Q_VERSIONS)
def test_quantize_saturates(version):
    x = np.array([300, -300, 127.5, -128.5, 128.5], F32)
    assert_same(quantize(version, x, np.array(1, F32), np.array(0, np.int8)),
                np.array([127, -128, 127, -128, 127], np.int8))
    assert_same(quantize(version, x, np.array(1, F32), np.array(10, np.uint8)),
                np.array([255, 0, 138, 0, 138], np.uint8))


@pytest.mark.parametrize("version", Q_VERSIONS)
def test_quantize_int32_input(version):
    x = np.array([7, -7, 100], np.int32)
    scale = np.array(2, np.int32 if version in (19, 21) else F32)   # 19-21: x and y_scale share T1
    assert_same(quantize(version, x, scale, np.array(0, np.int8)), np.array([4, -4, 50], np.int8))


# -- granularity ---------------------------------------------------------------------------------

@pytest.mark.parametrize("version", Q_VERSIONS[1:])
def test_quantize_per_axis(version):
    x = np.array([[[-162, 10], [-100, 232], [-20, -50]],
                  [[-76, 0], [0, 252], [32, -44]],
                  [[245, -485], [-960, -270], [-375, -470]]], F32).reshape(1, 3, 3, 2)
    scale = np.array([2, 4, 5], F32)
    zp = np.array([84, 24, 196], np.uint8)
    exp = np.array([[[3, 89], [34, 200], [74, 59]],
                    [[5, 24], [24, 87], [32, 13]],
                    [[245, 99], [4, 142], [121, 102]]], np.uint8).reshape(1, 3, 3, 2)
    assert_same(quantize(version, x, scale, zp), exp)             # axis defaults to 1
    assert_same(quantize(version, x, scale, zp, axis=-3), exp)
    # axis 3 (length 2): the scale applies to the last dimension
    x2 = np.array([[10, 10], [-10, 7]], F32)
    assert_same(quantize(version, x2, np.array([2, 4], F32), np.array([0, 1], np.int8), axis=1),
                np.array([[5, 3], [-5, 3]], np.int8))      # 10/4 = 2.5 -> 2, 7/4 = 1.75 -> 2; +1
    assert_same(quantize(version, x2, np.array([2, 4], F32), np.array([0, 1], np.int8), axis=0),
                np.array([[5, 5], [-1, 3]], np.int8))      # row 1: -10/4 = -2.5 -> -2, +1


@pytest.mark.parametrize("version", Q_VERSIONS[3:])
def test_quantize_blocked(version):
    x = np.array([[6.0, 12.0, 50.0, 5.0, 9.0],
                  [1.0, 8.0, 4.0, 5.0, -9.0]], F32)
    scale = np.array([[1.5, 2.5, 3.0], [3.0, 4.9, 2.0]], F32)     # block_size 2 along axis 1: ceil(5/2) = 3
    zp = np.array([[0, 1, 2], [1, 0, 3]], np.uint8)
    # 6/1.5=4, 12/1.5=8 | 50/2.5=20+1, 5/2.5=2+1 | 9/3=3+2
    # 1/3=0.33->0+1, 8/3=2.67->3+1 | 4/4.9=0.82->1, 5/4.9=1.02->1 | -9/2=-4.5->-4+3=-1->0
    exp = np.array([[4, 8, 21, 3, 5], [1, 4, 1, 1, 0]], np.uint8)
    assert_same(quantize(version, x, scale, zp, axis=1, block_size=2), exp)
    assert_same(quantize(version, x, scale, zp, axis=-1, block_size=2), exp)
    # block_size 3 on axis 0 of a (2, 5) input: one block of 2 rows
    s0 = np.array([[2, 2, 2, 4, 4]], F32)
    assert_same(quantize(version, x, s0, np.zeros((1, 5), np.int8), axis=0, block_size=3),
                np.array([[3, 6, 25, 1, 2], [0, 4, 2, 1, -2]], np.int8))


@pytest.mark.parametrize("version", Q_VERSIONS[3:])
def test_quantize_blocked_symmetric_int16(version):
    x = np.array([[6.0, -8, -10, 5.0], [1.0, 8.0, 4.0, 5.0]], F32)
    scale = np.array([[1.5, 2.5], [3.0, 4.9]], F32)
    exp = np.array([[4, -5, -4, 2], [0, 3, 1, 1]], np.int16)      # -8/1.5=-5.33, -10/2.5=-4, 5/2.5=2
    assert_same(quantize(version, x, scale, axis=1, block_size=2, output_dtype=T.INT16), exp)


SCALE_ERRORS = [  # (version, x shape, scale shape, attrs, message)
    (13, (2, 3), (2,), {}, "3 along axis 1"),
    (13, (2, 3), (3,), {"axis": 0}, "2 along axis 0"),
    (10, (2, 3), (3,), {}, "scalar"),
    (19, (2, 3), (2, 3), {}, "1-D|blocked"),
    (21, (2, 5), (2, 2), {"block_size": 2, "axis": 1}, r"expected \[2, 3\]"),
    (21, (2, 5), (3, 3), {"block_size": 2, "axis": 1}, r"expected \[2, 3\]"),
    (21, (2, 5), (3,), {"block_size": 2}, "rank"),
    (25, (2, 3), (3,), {"axis": 2}, "axis"),
]


@pytest.mark.parametrize("version,xshape,sshape,attrs,msg", SCALE_ERRORS)
def test_scale_shape_errors(version, xshape, sshape, attrs, msg):
    x = np.ones(xshape, F32)
    scale = np.ones(sshape, F32)
    with pytest.raises(KernelError, match=re.compile(f"{NODE}.*({msg})", re.S)):
        quantize(version, x, scale, np.zeros(sshape, np.uint8), **attrs)
    with pytest.raises(KernelError, match=re.compile(f"{NODE}.*({msg})", re.S)):
        dequantize(version, x.astype(np.uint8), scale, np.zeros(sshape, np.uint8), **attrs)


@pytest.mark.parametrize("version", Q_VERSIONS[1:])
def test_zero_point_shape_must_match_scale(version):
    with pytest.raises(KernelError, match="zero point"):
        quantize(version, np.ones((2, 3), F32), np.ones(3, F32), np.zeros(2, np.uint8))


# -- float8 / 4-bit / 2-bit targets --------------------------------------------------------------

@pytest.mark.parametrize("version", Q_VERSIONS[2:])
@pytest.mark.parametrize("out,sat,nosat", [
    ("float8e4m3fn", [0, 0.5, 1, 448, 96, -448, 448], [0, 0.5, 1, np.nan, 96, np.nan, np.nan]),
    ("float8e4m3fnuz", [0, 0.5, 1, 240, 96, -240, 240], [0, 0.5, 1, np.nan, 96, np.nan, np.nan]),
    ("float8e5m2", [0, 0.5, 1, 49152, 96, -57344, 57344], [0, 0.5, 1, 49152, 96, -np.inf, np.inf]),
    ("float8e5m2fnuz", [0, 0.5, 1, 49152, 96, -57344, 57344], [0, 0.5, 1, 49152, 96, np.nan, np.nan]),
])
def test_quantize_float8(version, out, sat, nosat):
    x = np.array([0, 1, 2, 100000, 200, -1e6, np.inf], F32)
    dt = np_type(out)
    zp = np.zeros(1, dt)
    assert_same(quantize(version, x, np.array(2, F32), zp), np.array(sat, F32).astype(dt))
    assert_same(quantize(version, x, np.array(2, F32), zp, saturate=0), np.array(nosat, F32).astype(dt))


@pytest.mark.parametrize("version", Q_VERSIONS[3:])
def test_quantize_4_bit(version):
    x = np.array([[0.0, 2.5, 4.8, 8.6], [-30, -20, 6, 9], [12, 15, 16, 40]], F32)
    scale = np.array([2.0, 3.0, 4.0], F32)
    one = np.ones(3, F32)
    assert_same(quantize(version, x, scale, one.astype(ml_dtypes.uint4), axis=0),
                np.array([[1, 2, 3, 5], [0, 0, 3, 4], [4, 5, 5, 11]], ml_dtypes.uint4))
    assert_same(quantize(version, x, scale, one.astype(ml_dtypes.int4), axis=0),
                np.array([[1, 2, 3, 5], [-8, -6, 3, 4], [4, 5, 5, 7]], ml_dtypes.int4))


@pytest.mark.parametrize("version", Q_VERSIONS[4:])
def test_quantize_float4e2m1(version):
    x = np.array([[0.0, 2.5, 4.8, 8.6], [-30, -20, 6, 9], [-0.0, -2.5, -4.8, -8.6]], F32)
    scale = np.array([2.0, 3.0, 4.0], F32)
    exp = np.array([[0, 1, 2, 4], [-6, -6, 2, 3], [0, -0.5, -1, -2]], F32)   # 2.4 -> 2, -10 -> -6 (saturated)
    assert_same(quantize(version, x, scale, np.zeros(3, ml_dtypes.float4_e2m1fn), axis=0),
                exp.astype(ml_dtypes.float4_e2m1fn))


@pytest.mark.parametrize("version", Q_VERSIONS[6:])
def test_quantize_2_bit(version):
    x = np.array([[0.0, 2.5, 4.8, 8.6], [-4.0, -3.0, 1.0, 2.0], [-0.0, -2.5, -4.8, -8.6]], F32)
    scale = np.array([2.0, 3.0, 4.0], F32)
    assert_same(quantize(version, x, scale, np.zeros(3, ml_dtypes.int2), axis=0),
                np.array([[0, 1, 1, 1], [-1, -1, 0, 1], [0, -1, -1, -2]], ml_dtypes.int2))
    assert_same(quantize(version, x, scale, np.zeros(3, ml_dtypes.uint2), axis=0),
                np.array([[0, 1, 2, 3], [0, 0, 0, 1], [0, 0, 0, 0]], ml_dtypes.uint2))


# -- attributes of 21+ ---------------------------------------------------------------------------

@pytest.mark.parametrize("version", Q_VERSIONS[3:])
def test_quantize_output_dtype(version):
    x = np.array([3.0, -3.0, 70000.0], F32)
    assert_same(quantize(version, x, np.array(2, F32), output_dtype=T.INT8), np.array([2, -2, 127], np.int8))
    assert_same(quantize(version, x, np.array(2, F32), output_dtype=T.UINT16), np.array([2, 0, 35000], np.uint16))
    assert_same(quantize(version, x, np.array(2, F32), np.array(1, np.int8), output_dtype=T.INT8),
                np.array([3, -1, 127], np.int8))
    with pytest.raises(KernelError, match=f"{NODE}.*output_dtype"):
        quantize(version, x, np.array(2, F32), np.array(1, np.uint8), output_dtype=T.INT8)


@pytest.mark.parametrize("version,out", [(21, T.FLOAT4E2M1), (21, T.INT2), (23, T.UINT2), (24, T.FLOAT),
                                         (28, T.INT32)])
def test_quantize_output_dtype_must_be_allowed(version, out):
    with pytest.raises(InvalidNodeError, match=f"{NODE}.*output_dtype"):
        quantize(version, np.ones(2, F32), np.array(2, F32), output_dtype=out)


@pytest.mark.parametrize("version", Q_VERSIONS[4:])
def test_quantize_precision(version):
    # 2049 is not a float16: with float16 precision the quotient rounds to 2048 (nearest even)
    x = np.array([2049.0, 4097.0], F32)
    assert_same(quantize(version, x, np.array(1, F32), np.array(0, np.int16)), np.array([2049, 4097], np.int16))
    assert_same(quantize(version, x, np.array(1, F32), np.array(0, np.int16), precision=T.FLOAT16),
                np.array([2048, 4096], np.int16))
    # the default precision is the scale's type
    assert_same(quantize(version, x, np.array(1, np.float16), np.array(0, np.int16)),
                np.array([2048, 4096], np.int16))
    assert_same(quantize(version, x, np.array(1, np.float16), np.array(0, np.int16), precision=T.FLOAT),
                np.array([2049, 4097], np.int16))
    # x itself is rounded to the precision type first: float16(8.050479) = 8.046875, / float16(0.7) =
    # 11.492 -> 11 (rounding only the float32 quotient 11.4975 to float16 would give the tie 11.5 -> 12)
    assert_same(quantize(version, np.array([8.050479], F32), np.array(0.7, np.float16), np.array(0, np.int8)),
                np.array([11], np.int8))
    # bfloat16 keeps 8 significant bits: 257 -> 256
    assert_same(quantize(version, np.array([257.0], F32), np.array(1, F32), np.array(0, np.int16),
                         precision=T.BFLOAT16),
                np.array([256], np.int16))


@pytest.mark.parametrize("version", Q_VERSIONS[5:])
def test_float8e8m0_scale(version):
    scale = np.array([0.25, 4.0], F32).astype(ml_dtypes.float8_e8m0fnu)
    x = np.array([[1.0, 8.0], [-1.0, 10.0]], F32)
    assert_same(quantize(version, x, scale, np.zeros(2, np.int8), axis=1), np.array([[4, 2], [-4, 2]], np.int8))
    q = np.array([[4, 2], [-4, 3]], np.int8)
    assert_same(dequantize(version, q, scale, axis=1, output_dtype=T.FLOAT), np.array([[1, 8], [-1, 12]], F32))
    assert_same(dequantize(version, q, scale, axis=1, output_dtype=T.FLOAT16),
                np.array([[1, 8], [-1, 12]], np.float16))


@pytest.mark.parametrize("version", [19, 21])
def test_quantize_19_needs_x_and_scale_of_one_type(version):
    with pytest.raises(KernelError, match="same type"):
        quantize(version, np.ones(2, F32), np.array(2, np.float16))


@pytest.mark.parametrize("version", Q_VERSIONS[2:])
def test_quantize_float16_input(version):
    x = np.array([3.0, -5.0, 1000.0], np.float16)
    assert_same(quantize(version, x, np.array(2, np.float16), np.array(0, np.int8)), np.array([2, -2, 127], np.int8))


def test_quantize_array_helper():
    q = np.array([0.5, 1.5, -2.5, 300.0, np.inf], F32)
    assert_same(quantize_array(q, np.int8), np.array([0, 2, -2, 127, 127], np.int8))
    assert_same(quantize_array(q[:4], np.uint8, np.array(1, np.uint8)), np.array([1, 3, 0, 255], np.uint8))
    assert_same(quantize_array(q, ml_dtypes.int4), np.array([0, 2, -2, 7, 7], ml_dtypes.int4))
    f8 = ml_dtypes.float8_e4m3fn
    assert_same(quantize_array(np.array([1000.0], F32), f8), np.array([448], F32).astype(f8))
    assert np.isnan(quantize_array(np.array([1000.0], F32), f8, saturate=False).astype(F32)[0])
    assert_same(q, np.array([0.5, 1.5, -2.5, 300.0, np.inf], F32))      # the input is left alone
    # int32 saturates inside its range: the largest float32 below 2**31 is 2**31 - 128
    assert_same(quantize_array(np.array([3e9, -3e9], F32), np.int32), np.array([2**31 - 128, -2**31], np.int32))
    assert_same(quantize_array(np.array([3e9, -3e9]), np.int32), np.array([2**31 - 1, -2**31], np.int32))


# -- DequantizeLinear ----------------------------------------------------------------------------

def dequantize_type_cases():
    cases = []
    for v in Q_VERSIONS:
        xs = type_names("DequantizeLinear", v, "T1" if v >= 19 else "T")
        scales = type_names("DequantizeLinear", v, "T2") if v >= 19 else ["float"]
        for x in xs:
            for s in scales:
                cases.append(pytest.param(v, x, s, id=f"v{v}-{x}-{s}"))
    return cases


@pytest.mark.parametrize("version,xt,st", dequantize_type_cases())
def test_dequantize_every_type(version, xt, st):
    if xt.startswith(("int", "uint")):
        info = ml_dtypes.iinfo(np_type(xt))
        vals = np.array([v for v in (0, 1, 3, -2, 7, -8, 100, -100, 255) if info.min <= v <= info.max], np.float64)
        zp_val = 0 if xt == "int32" else (1 if info.max >= 1 else 0)
    else:
        vals = np.array([0, 0.5, 1, -1.5, 4, -6], np.float64)
        zp_val = 0
    x = vals.astype(np_type(xt)) if xt.startswith(("int", "uint")) else vals.astype(F32).astype(np_type(xt))
    scale = np.array(2.0 if st != "float8e8m0" else 2.0, F32).astype(np_type(st))
    out = F32 if st == "float8e8m0" else np_type(st)
    exp = ((vals - zp_val) * 2.0).astype(F32).astype(out)
    zp = None if xt == "int32" else np.array(zp_val, F32).astype(np_type(xt)) if not xt.startswith(("int", "uint")) \
        else np.array(zp_val).astype(np_type(xt))
    attrs = {"output_dtype": T.FLOAT} if st == "float8e8m0" else {}
    assert_same(dequantize(version, x, scale, zp, **attrs), exp)


@pytest.mark.parametrize("version", Q_VERSIONS)
def test_dequantize_per_tensor(version):
    x = np.array([0, 3, 128, 255], np.uint8)
    assert_same(dequantize(version, x, np.array(2, F32), np.array(128, np.uint8)),
                np.array([-256, -250, 0, 254], F32))
    assert_same(dequantize(version, x, np.array(2, F32)), np.array([0, 6, 256, 510], F32))
    assert_same(dequantize(version, np.array([-2**31, 2**20], np.int32), np.array(0.5, F32)),
                np.array([-2**30, 2**19], F32))


@pytest.mark.parametrize("version", Q_VERSIONS[1:])
def test_dequantize_per_axis(version):
    x = np.array([[1, 2, 3], [4, 5, 6]], np.int8)
    assert_same(dequantize(version, x, np.array([1, 2, 4], F32), np.array([0, 1, 2], np.int8)),
                np.array([[1, 2, 4], [4, 8, 16]], F32))
    assert_same(dequantize(version, x, np.array([1, 0.5], F32), np.array([1, -1], np.int8), axis=0),
                np.array([[0, 1, 2], [2.5, 3, 3.5]], F32))
    assert_same(dequantize(version, x, np.array([1, 0.5], F32), axis=-2), np.array([[1, 2, 3], [2, 2.5, 3]], F32))


@pytest.mark.parametrize("version", Q_VERSIONS[3:])
def test_dequantize_blocked(version):
    x = np.array([[3, 89, 34, 200, 74], [5, 24, 24, 87, 32]], np.uint8)
    scale = np.array([[3.0, 2.0, 4.0], [5.0, 2.0, 1.0]], F32)
    zp = np.array([[1, 0, 2], [3, 2, 4]], np.uint8)
    exp = np.array([[(3 - 1) * 3, (89 - 1) * 3, (34 - 0) * 2, (200 - 0) * 2, (74 - 2) * 4],
                    [(5 - 3) * 5, (24 - 3) * 5, (24 - 2) * 2, (87 - 2) * 2, (32 - 4) * 1]], F32)
    assert_same(dequantize(version, x, scale, zp, axis=1, block_size=2), exp)


@pytest.mark.parametrize("version", Q_VERSIONS[2:])
def test_dequantize_float8_and_float16_scale(version):
    x = np.array([0, 0.5, 1, 448, -104], F32).astype(ml_dtypes.float8_e4m3fn)
    assert_same(dequantize(version, x, np.array(2, F32)), np.array([0, 1, 2, 896, -208], F32))
    assert_same(dequantize(version, x, np.array(2, np.float16)), np.array([0, 1, 2, 896, -208], np.float16))
    assert_same(dequantize(version, x, np.array(2, F32), np.zeros(1, ml_dtypes.float8_e4m3fn)),
                np.array([0, 1, 2, 896, -208], F32))
    y = dequantize(version, np.array([100], np.int8), np.array(3, ml_dtypes.bfloat16))
    assert_same(y, np.array([300], F32).astype(ml_dtypes.bfloat16))


@pytest.mark.parametrize("version", Q_VERSIONS[4:])
def test_dequantize_output_dtype(version):
    x = np.array([1, 2, 3], np.int8)
    assert_same(dequantize(version, x, np.array(0.5, F32), output_dtype=T.FLOAT16),
                np.array([0.5, 1, 1.5], np.float16))
    assert_same(dequantize(version, x, np.array(0.5, np.float16), output_dtype=T.FLOAT), np.array([0.5, 1, 1.5], F32))
    with pytest.raises(InvalidNodeError, match=f"{NODE}.*output_dtype"):
        dequantize(version, x, np.array(0.5, F32), output_dtype=T.INT8)


@pytest.mark.parametrize("version", Q_VERSIONS)
def test_dequantize_zero_point_type_must_match(version):
    with pytest.raises(KernelError, match=f"{NODE}.*same type"):
        dequantize(version, np.ones(2, np.uint8), np.array(1, F32), np.array(0, np.int8))


@pytest.mark.parametrize("version", Q_VERSIONS)
def test_round_trip_and_empty(version):
    x = np.array([-1.0, 0.0, 0.25, 1.0], F32)
    scale, zp = np.array(1 / 64, F32), np.array(100, np.uint8)
    q = quantize(version, x, scale, zp)
    assert_same(q, np.array([36, 100, 116, 164], np.uint8))
    assert_same(dequantize(version, q, scale, zp), x)
    assert_same(quantize(version, np.zeros((0, 3), F32), scale, zp), np.zeros((0, 3), np.uint8))
    assert_same(dequantize(version, np.zeros((0, 3), np.uint8), scale, zp), np.zeros((0, 3), F32))


# -- DynamicQuantizeLinear -----------------------------------------------------------------------

def dynamic_ref(x):
    """The spec's formulas in float32."""
    lo, hi = min(F32(0), x.min()), max(F32(0), x.max())
    scale = F32((hi - lo) / F32(255))
    zp = np.uint8(np.clip(np.rint(-lo / scale), 0, 255))
    y = np.clip(np.rint(x / scale) + zp, 0, 255).astype(np.uint8)
    return y, np.array(scale, F32), np.array(zp, np.uint8)


@pytest.mark.parametrize("x", [
    [0, 2, -3, -2.5, 1.34, 0.5], [-1.0, -2.1, -1.3, -2.5, -3.34, -4.0], [[1, 2.1, 1.3, 2.5], [3.34, 4.0, 1.5, 2.6]],
    [1000.0, -1e-3, 3.14159], [5.0],
])
def test_dynamic_quantize_linear(x):
    x = np.array(x, F32)
    got = run_node("DynamicQuantizeLinear", 11, [x], n_outputs=3)
    for g, e in zip(got, dynamic_ref(x)):
        assert_same(g, e)


def test_dynamic_quantize_linear_hand_values():
    # min -3, max 2: scale 5/255, zero point round(3 / (5/255)) = 153; 2 -> 102 + 153 = 255
    y, scale, zp = run_node("DynamicQuantizeLinear", 11, [np.array([0, 2, -3], F32)], n_outputs=3)
    assert_same(scale, np.array(F32(5) / F32(255), F32))
    assert_same(zp, np.array(153, np.uint8))
    assert_same(y, np.array([153, 255, 0], np.uint8))


@pytest.mark.parametrize("shape", [(3,), (0,), (2, 0)])
def test_dynamic_quantize_linear_zeros_and_empty(shape):
    y, scale, zp = run_node("DynamicQuantizeLinear", 11, [np.zeros(shape, F32)], n_outputs=3)
    assert_same(y, np.zeros(shape, np.uint8))
    assert_same(scale, np.array(0, F32))
    assert_same(zp, np.array(0, np.uint8))


@pytest.mark.parametrize("version", Q_VERSIONS)
def test_scalar_inputs(version):
    assert_same(quantize(version, np.array(5.0, F32), np.array(2, F32), np.array(1, np.uint8)), np.array(3, np.uint8))
    assert_same(dequantize(version, np.array(5, np.uint8), np.array(2, F32), np.array(1, np.uint8)), np.array(8, F32))
    if version >= 19:
        f8 = ml_dtypes.float8_e4m3fn
        assert_same(quantize(version, np.array(5.0, F32), np.array(2, F32), np.array(0, f8)),
                    np.array(2.5, F32).astype(f8))


@pytest.mark.parametrize("version", Q_VERSIONS[3:])
def test_blocked_divisible_3d(version):
    # x (2, 4, 2), blocks of 2 along axis 1: scale (2, 2, 2)
    x = np.arange(16, dtype=np.int8).reshape(2, 4, 2)
    scale = np.array([[[1, 2], [3, 4]], [[5, 6], [7, 8]]], F32)
    zp = np.array([[[0, 1], [2, 3]], [[4, 5], [6, 7]]], np.int8)
    full_s = np.repeat(scale, 2, axis=1)          # the spec: each scale replicated block_size times
    full_z = np.repeat(zp, 2, axis=1).astype(F32)
    exp = (x.astype(F32) - full_z) * full_s
    assert_same(dequantize(version, x, scale, zp, axis=1, block_size=2), exp)
    assert_same(dequantize(version, x, scale, zp, axis=-2, block_size=2), exp)
    assert_same(quantize(version, exp, scale, zp, axis=1, block_size=2), x)
    # block_size 4 on the same axis: one block
    assert_same(dequantize(version, x, scale[:, :1], zp[:, :1], axis=1, block_size=4),
                (x.astype(F32) - np.repeat(zp[:, :1], 4, axis=1)) * np.repeat(scale[:, :1], 4, axis=1))


@pytest.mark.parametrize("version", Q_VERSIONS[3:])
def test_dequantize_float16_precision(version):
    # float16(0.1) = 0.0999755859375. From 23 the product is taken in the output type: float16(2049) = 2048,
    # 2048 * 0.0999755859375 = 204.75 exactly. Before, float32 then one rounding: 204.84998 -> 204.875.
    exp = 204.75 if version >= 23 else 204.875
    assert_same(dequantize(version, np.array([2049], np.int16), np.array(0.1, np.float16)), np.array([exp], np.float16))


# -- the fused integer rounding ---------------------------------------------------------------------
# 8/16-bit results are rounded, offset and saturated in place with the 1.5 * 2^23 rounder
# (quantization.py). These hold it to the spec's formula, written in float32.

def spec_quantize(x, scale, zp, dtype):
    info = np.iinfo(dtype)
    return np.clip(np.rint(x / scale) + F32(zp), info.min, info.max).astype(dtype)


def ties_and_extremes(n, scale, seed=0):
    """n float32 values: exact ties (k + 0.5) * scale of both parities, values past both bounds, the rest random."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * 200 * scale).astype(F32)
    x[: n // 4] = ((rng.integers(-300, 300, n // 4) + 0.5) * scale).astype(F32)
    x[n // 4: n // 4 + 6] = [1e10, -1e10, np.inf, -np.inf, 0.0, -0.0]
    return x


@pytest.mark.parametrize("dtype,zp", [(np.uint8, 0), (np.uint8, 131), (np.uint8, 255), (np.int8, -128), (np.int8, 3),
                                      (np.int8, 127), (np.uint16, 40000), (np.int16, -7)])
@pytest.mark.parametrize("n", [1000, 600_000])
def test_quantize_fused_rounding_matches_the_formula(dtype, zp, n):
    scale = F32(0.25)      # exact ties: x / 0.25 is exact
    x = ties_and_extremes(n, scale, seed=n)
    got = quantize(21, x, np.array(scale), np.array(zp, dtype))
    assert_same(got, spec_quantize(x, scale, zp, dtype))
    assert_same(got, quantize_array(x / scale, dtype, np.array(zp, dtype)))     # the helper alike


def test_quantize_half_to_even_at_both_parities_with_an_odd_zero_point():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 124.5, 125.5, -128.5, -127.5], F32)
    exp = np.array([0, 2, 2, 0, -2, -2, 124, 126, -128, -128], np.int64) + 3
    assert_same(quantize(21, x, np.array(1, F32), np.array(3, np.int8)), np.clip(exp, -128, 127).astype(np.int8))


def test_quantize_nan_gives_the_zero_point():
    """The spec leaves NaN undefined; the fused rounding gives the zero point (onnxruntime: the type's minimum)."""
    x = np.array([np.nan, -np.nan, 1.0], F32)
    assert_same(quantize(21, x, np.array(1, F32), np.array(100, np.uint8)), np.array([100, 100, 101], np.uint8))


def test_quantize_array_float64_and_scratch():
    """float64 values go through the same rounding (QLinearConv's rescale); without scratch the input stays."""
    q = np.array([0.5, 1.5, 2.5, -0.5, 126.5, 1e300, -np.inf, 2.0 ** 60 + 1], np.float64)
    before = q.copy()
    assert_same(quantize_array(q, np.uint8, np.array(1, np.uint8)), np.array([1, 3, 3, 1, 127, 255, 0, 255], np.uint8))
    assert_same(q, before)
    assert_same(quantize_array(q.copy(), np.int16, None, scratch=True),
                np.array([0, 2, 2, 0, 126, 32767, -32768, 32767], np.int16))


@pytest.mark.parametrize("n", [1000, 600_000])
def test_dequantize_matches_the_formula(n):
    rng = np.random.default_rng(n)
    for dtype, zp in ((np.uint8, 77), (np.int8, -5), (np.int16, 1234), (np.uint16, None)):
        info = np.iinfo(dtype)
        x = rng.integers(info.min, info.max + 1, n).astype(dtype)
        scale = F32(0.0173)
        z = None if zp is None else np.array(zp, dtype)
        exp = (x.astype(F32) - F32(zp or 0)) * scale
        assert_same(dequantize(21, x, np.array(scale), z), exp)


def test_dynamic_quantize_linear_large():
    x = np.random.default_rng(8).standard_normal(700_000).astype(F32)
    x[:1000] = np.linspace(-3, 3, 1000, dtype=F32)
    got = run_node("DynamicQuantizeLinear", 11, [x], n_outputs=3)
    for g, e in zip(got, dynamic_ref(x)):
        assert_same(g, e)

def _numpy_scalar_parameters(x):
    """_dynamic_parameters as numpy float32 scalar steps (the helper's earlier form): the reference."""
    lo = min(F32(0), x.min()) if x.size else F32(0)
    hi = max(F32(0), x.max()) if x.size else F32(0)
    scale = F32((hi - lo) / F32(255))
    zp = np.uint8(0) if scale == 0 else np.uint8(min(max(np.rint(-lo / scale), 0), 255))
    return lo, hi, scale, zp


def _numpy_scalar_clip_free(lo, hi, scale, zp):
    return bool(np.rint(lo / scale) + int(zp) >= 0 and np.rint(hi / scale) + int(zp) <= 255)


def _extreme_and_random_ranges():
    tiny, big, least = np.finfo(F32).tiny, np.finfo(F32).max, F32(2.0 ** -149)
    special = [0.0, -0.0, least, -least, tiny, -tiny, big, -big, np.nextafter(big, F32(0)), 1.0, -1.0, 255.0,
               -255.0, 127.5, -127.5, 0.5, 1e-38, -1e-38, 3e38, -3e38, np.inf, -np.inf, np.nan]
    pairs = [(a, b) for a in special for b in special]
    rng = np.random.default_rng(22)
    bits = rng.integers(0, 2 ** 32, (20_000, 2), dtype=np.uint64).astype(np.uint32).view(F32)   # any float32
    pairs += [tuple(p) for p in bits]
    pairs += [tuple(p) for p in (rng.standard_normal((20_000, 2)) * 10.0 ** rng.integers(-40, 39, (20_000, 1)))]
    # ranges whose zero point -lo / scale sits on or next to a tie (lo = -(k + 1/2) * scale)
    for k in range(0, 256, 5):
        s = F32(rng.uniform(0.001, 10))
        pairs += [(-(k + 0.5) * s, (254.5 - k) * s), (-(k + 0.5) * s, 1.0), (-k * s, (255 - k) * s)]
    return [np.array(p, F32) for p in pairs]


def test_dynamic_parameters_on_python_floats_are_float32_bits():
    """_dynamic_parameters and _clip_free compute on Python floats rounded to float32 once per step
    (see there): every result has the bits of the float32 numpy scalar steps, on every kind of range
    (random bit patterns, subnormals, the largest floats whose difference overflows, infinities, NaN,
    zero points on ties)."""
    from onnx_mini.ops.quantization import _clip_free, _dynamic_parameters
    checked = clip_free = 0
    with np.errstate(all="ignore"):
        for x in _extreme_and_random_ranges() + [np.zeros(0, F32)]:
            lo, hi, scale, zp = _dynamic_parameters(x)
            want = _numpy_scalar_parameters(x)
            got = (F32(lo), F32(hi), F32(scale), zp)
            assert float(F32(scale)) == scale or np.isnan(scale)       # a float32 value
            assert zp.dtype == np.uint8
            for g, w in zip(got, want):
                assert np.asarray(g).tobytes() == np.asarray(w).tobytes(), (x, got, want)
            if scale != 0:
                free = _clip_free(lo, hi, scale, zp)
                assert free == _numpy_scalar_clip_free(*want), (x, got)
                clip_free += free
            checked += 1
    assert checked > 40_000 and clip_free > 10_000     # most random ranges are clip-free



# -- constant weights dequantized once ------------------------------------------------------------

def test_dequantize_of_constant_weights_folds_at_prepare():
    """DequantizeLinear of an initializer (a QDQ model's weights) runs once, at prepare (constant folding,
    on by default): the plan holds only the Conv, fed the dequantized weights."""
    w = np.arange(-36, 36, dtype=np.int8).reshape(2, 4, 3, 3)
    ws, wz = np.array([0.5, 0.25], F32), np.array([1, -2], np.int8)
    nodes = [helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wf"], axis=0),
             helper.make_node("Conv", ["x", "wf"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [1, 4, 3, 3])],
                              [helper.make_tensor_value_info("y", T.FLOAT, None)],
                              [numpy_helper.from_array(a, n) for a, n in ((w, "w"), (ws, "ws"), (wz, "wz"))])
    rep = onnx_mini.prepare(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10))
    assert [i.op_type for i in rep.plan.infos] == ["Conv"]
    x = np.ones((1, 4, 3, 3), F32)
    wf = (w.astype(F32) - wz.astype(F32).reshape(2, 1, 1, 1)) * ws.reshape(2, 1, 1, 1)
    np.testing.assert_allclose(rep.run([x])[0].reshape(2), wf.reshape(2, -1).sum(axis=1), rtol=1e-6)


# -- constant scale and zero point: checked once, the same arithmetic ---------------------------------

def run_with_constant_params(op, version, x, scale, zp, shortcut=True, **attrs):
    """op on x with scale and zero point as initializers (a QDQ model's form); shortcut: whether the factory
    made its function for constant parameters."""
    node = helper.make_node(op, ["x", "s", "z"], ["y"], name=NODE, **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", helper.np_dtype_to_tensor_dtype(x.dtype),
                                                                          None)],
                              [helper.make_empty_tensor_value_info("y")],
                              [numpy_helper.from_array(scale, "s"), numpy_helper.from_array(zp, "z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", version)], ir_version=10)
    rep = onnx_mini.prepare(model)
    assert (rep.plan.infos[0].kernel.__name__ == "run_constant") == shortcut
    return rep.run([x])[0]


@pytest.mark.parametrize("version", [10, 13, 19, 21, 23])
@pytest.mark.parametrize("dtype,zp", [(np.uint8, 131), (np.uint8, 0), (np.int8, -3), (np.int16, 1000), (np.uint16, 7)])
def test_quantize_with_constant_params_matches_the_formula(version, dtype, zp):
    if version < 21 and dtype in (np.int16, np.uint16):
        pytest.skip("16-bit outputs from version 21")
    scale = F32(0.25)
    x = np.concatenate([ties_and_extremes(4000, scale, seed=version), np.array([np.nan], F32)]).reshape(1, 4001)
    got = run_with_constant_params("QuantizeLinear", version, x, np.array(scale), np.array(zp, dtype))
    exp = np.append(spec_quantize(x[:, :-1], scale, zp, dtype), dtype(zp)).reshape(1, -1)   # NaN: the zero point
    assert_same(got, exp)
    assert_same(got, quantize(version, x, np.array(scale), np.array(zp, dtype)))


@pytest.mark.parametrize("version", [10, 13, 21, 23])
@pytest.mark.parametrize("dtype,zp", [(np.uint8, 131), (np.uint8, 0), (np.int8, -3)])
def test_dequantize_with_constant_params_matches_the_formula(version, dtype, zp):
    info = np.iinfo(dtype)
    x = np.arange(info.min, info.max + 1).astype(dtype).reshape(1, 2, -1)
    scale = F32(0.0173)
    got = run_with_constant_params("DequantizeLinear", version, x, np.array(scale), np.array(zp, dtype))
    assert_same(got, (x.astype(F32) - F32(zp)) * scale)


def test_constant_params_keep_the_checks():
    """Parameters the version rejects fail at run as when fed (here: float16 x against a float32 scale,
    19+), and a float16 precision (23+) still divides in float16."""
    x = np.array([1.0, 2.0], np.float16)
    with pytest.raises(KernelError, match="same type"):
        run_with_constant_params("QuantizeLinear", 19, x, np.array(1, F32), np.array(0, np.uint8))
    x = np.array([1000.7], F32)       # 1000.7 / 3 in float16: 333.5 (a tie, to 334 even), 333.57 in float32
    got = run_with_constant_params("QuantizeLinear", 23, x, np.array(3, F32), np.array(0, np.uint16),
                                   shortcut=False, precision=T.FLOAT16)
    assert_same(got, np.array([334], np.uint16))
