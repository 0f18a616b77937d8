"""The channels-last QLinearConv (ops/fused.py's QLinearConvNHWC) bit for bit against QLinearConv's
definition written here (the integer sums in int64 by a loop over the taps, then round(acc * x_scale *
w_scale / y_scale) half to even + y_zero_point, saturated) and against the NCHW kernel: every path of
ConvNHWC (pointwise, im2col, depthwise stride 1 / strided narrow / strided wide), pads, X's zero point
folded or not, per-channel weight scales, extreme codes and zero points, and the NCHW fallback."""
from __future__ import annotations

import numpy as np
import pytest

from onnx_mini.ops.fused import fused_qlinear_conv_nhwc
from onnx_mini.ops.nn.conv_quantized import qlinear_conv_10

from helpers import conv2d_direct

RNG = np.random.default_rng(22)


def integer_conv(x, xz, w, wz, b, strides, pads, group):
    """sum over taps of (x - xz) * (w - wz) (+ B) in int64, on NCHW codes, zero padding after the shift."""
    xs = x.astype(np.int64) - int(xz)
    ws = w.astype(np.int64) - np.asarray(wz, np.int64).reshape(-1, 1, 1, 1)
    return conv2d_direct(xs, ws, b, strides, pads, group, dtype=np.int64)


def requantized(acc, xs, wsc, ys, yz):
    scale = np.float64(xs) * np.asarray(wsc, np.float64).reshape(1, -1, 1, 1) / np.float64(ys)
    info = np.iinfo(yz.dtype)
    return np.clip(np.rint(acc * scale) + int(yz), info.min, info.max).astype(yz.dtype)


def nhwc(a):
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1))


def codes(dtype, shape, extreme=False):
    info = np.iinfo(dtype)
    if extreme:
        return RNG.choice(np.array([info.min, info.max], dtype), size=shape)
    return RNG.integers(info.min, info.max + 1, size=shape).astype(dtype)


# (name, x shape NCHW, W shape, strides, pads, group): one per ConvNHWC path
GEOMETRIES = [
    ("pointwise", (2, 16, 5, 7), (24, 16, 1, 1), (1, 1), (0, 0, 0, 0), 1),
    ("im2col", (1, 16, 9, 8), (8, 16, 3, 3), (1, 1), (1, 1, 1, 1), 1),
    ("im2col_strided", (1, 16, 9, 8), (8, 16, 3, 3), (2, 2), (1, 0, 1, 1), 1),
    ("depthwise", (2, 12, 9, 10), (12, 1, 3, 3), (1, 1), (1, 1, 1, 1), 12),
    ("depthwise_unpadded", (1, 12, 9, 10), (12, 1, 3, 3), (1, 1), (0, 0, 0, 0), 12),
    ("depthwise_strided_narrow", (1, 40, 13, 11), (40, 1, 3, 3), (2, 2), (1, 1, 1, 1), 40),
    ("depthwise_strided_wide", (1, 40, 9, 40), (40, 1, 3, 3), (2, 2), (1, 1, 1, 1), 40),
    ("depthwise_5x5_asymmetric", (1, 8, 11, 9), (8, 1, 5, 5), (1, 1), (2, 1, 2, 3), 8),
]


def run_both(geometry, x_type, w_type, extreme=False, x_zp=None, w_zp=None, per_channel=False, bias=True):
    _, xshape, wshape, strides, pads, group = geometry
    m = wshape[0]
    x = codes(x_type, xshape, extreme)
    w = codes(w_type, wshape, extreme)
    xz = np.array(x_zp if x_zp is not None else RNG.integers(np.iinfo(x_type).min, np.iinfo(x_type).max), x_type)
    wz = np.array(0 if w_zp is None else w_zp, w_type)
    xs, ys = np.array(0.02, np.float32), np.array(0.37, np.float32)
    wsc = (RNG.uniform(0.001, 0.05, m) if per_channel else np.array(0.013)).astype(np.float32)
    yz = np.array(np.iinfo(x_type).min + 100, x_type)
    b = RNG.integers(-5000, 5000, m).astype(np.int32) if bias else None
    inputs = [x, xs, xz, w, wsc, wz, ys, yz] + ([b] if bias else [])
    constants = {k: v for k, v in enumerate(inputs) if k}
    attrs = dict(strides=list(strides), pads=list(pads), group=group)
    fused = fused_qlinear_conv_nhwc(**attrs, _constants=constants)
    assert fused.__name__ == "qlinear_conv_nhwc"          # the channels-last plan, not the fallback
    got = fused(nhwc(x), *inputs[1:])
    want = requantized(integer_conv(x, xz, w, wz, b, strides, pads, group), xs, wsc, ys, yz)
    assert got.dtype == want.dtype and got.flags.c_contiguous
    np.testing.assert_array_equal(got, nhwc(want))
    nchw = qlinear_conv_10(**attrs, _constants=constants)(*inputs)
    np.testing.assert_array_equal(got, nhwc(nchw))
    return got


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=[g[0] for g in GEOMETRIES])
@pytest.mark.parametrize("types", [(np.uint8, np.int8), (np.int8, np.int8), (np.uint8, np.uint8)])
def test_random_codes_match_the_definition(geometry, types):
    run_both(geometry, *types)


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=[g[0] for g in GEOMETRIES])
def test_extreme_codes_and_zero_points(geometry):
    # 0/255 inputs, -128/127 weights, X's zero point at either end (folded into the bias: pads need its map)
    for x_zp in (0, 255):
        y = run_both(geometry, np.uint8, np.int8, extreme=True, x_zp=x_zp, per_channel=True)
        assert y.min() == 0 and y.max() == 255          # saturation reached at both ends
    run_both(geometry, np.int8, np.int8, extreme=True, x_zp=-128, w_zp=127)
    run_both(geometry, np.uint8, np.uint8, extreme=True, x_zp=255, w_zp=0, bias=False)


@pytest.mark.parametrize("geometry", GEOMETRIES[::3], ids=[g[0] for g in GEOMETRIES[::3]])
def test_per_channel_scales_without_bias(geometry):
    run_both(geometry, np.uint8, np.int8, per_channel=True, bias=False)
    run_both(geometry, np.int8, np.int8, x_zp=0, per_channel=True)


def test_hand_computed_pointwise():
    # one pixel, 2 channels -> 1: acc = (10-2)*(3) + (4-2)*(-1) + 100 = 122; 122 * 0.5 * 0.25 / 1 = 15.25 -> 15 + 7
    x = np.array([10, 4], np.uint8).reshape(1, 1, 1, 2)            # NHWC
    w = np.array([3, -1], np.int8).reshape(1, 2, 1, 1)
    ins = [np.array(0.5, np.float32), np.array(2, np.uint8), w, np.array(0.25, np.float32), np.array(0, np.int8),
           np.array(1, np.float32), np.array(7, np.uint8), np.array([100], np.int32)]
    f = fused_qlinear_conv_nhwc(_constants=dict(enumerate(ins, 1)))
    assert f(x, *ins).tolist() == [[[[22]]]]


def test_fed_weights_and_other_types_take_the_nchw_kernel():
    g = GEOMETRIES[3]
    _, xshape, wshape, strides, pads, group = g
    x, w = codes(np.uint8, xshape), codes(np.int8, wshape)
    ins = [x, np.array(0.02, np.float32), np.array(3, np.uint8), w, np.array(0.01, np.float32),
           np.array(0, np.int8), np.array(0.3, np.float32), np.array(128, np.uint8)]
    attrs = dict(strides=list(strides), pads=list(pads), group=group)
    fed = fused_qlinear_conv_nhwc(**attrs, _constants={k: v for k, v in enumerate(ins) if k not in (0, 3)})
    assert fed.__name__ != "qlinear_conv_nhwc"
    want = nhwc(qlinear_conv_10(**attrs)(*ins))
    np.testing.assert_array_equal(fed(nhwc(x), *ins[1:]), want)
    const = fused_qlinear_conv_nhwc(**attrs, _constants={k: v for k, v in enumerate(ins) if k})
    np.testing.assert_array_equal(const(nhwc(x), *ins[1:]), want)
    w2 = w.copy()           # another W than the prepared one at run time: the general path
    w2[0, 0, 0, 0] ^= 1
    ins2 = ins[:3] + [w2] + ins[4:]
    np.testing.assert_array_equal(const(nhwc(x), *ins2[1:]), nhwc(qlinear_conv_10(**attrs)(*ins2)))


def test_accumulator_beyond_float32_keeps_the_nchw_kernel():
    # 520 channels of 0..255 against weights at -128: |acc| may pass 2^24, no constant float32 plan
    x, w = codes(np.uint8, (1, 520, 2, 2)), np.full((2, 520, 1, 1), -128, np.int8)
    ins = [x, np.array(0.02, np.float32), np.array(0, np.uint8), w, np.array(0.01, np.float32),
           np.array(0, np.int8), np.array(900.0, np.float32), np.array(128, np.uint8)]
    f = fused_qlinear_conv_nhwc(_constants={k: v for k, v in enumerate(ins) if k})
    assert f.__name__ != "qlinear_conv_nhwc"
    want = requantized(integer_conv(x, 0, w, 0, None, (1, 1), (0, 0, 0, 0), 1), 0.02, 0.01, 900.0, ins[7])
    np.testing.assert_array_equal(f(nhwc(x), *ins[1:]), nhwc(want))
