"""QLinearConv's requantization on the rounder's bit pattern (conv_quantized._bits_plan): the rounder
added first, the pattern's integers clipped, y's zero point in the rounder wherever no product is a tie
(_meets_ties), bit for bit the definition: saturate(round_half_even(float32(acc * scale)) + zp) on every
accumulator, and, through the kernels (NCHW and channels-last), QLinearConv's integer definition (int64
sums by the taps, rescale in float64) on random and extreme codes at the float32 bound's largest K."""
from __future__ import annotations

import numpy as np
import pytest

from onnx_mini.ops.fused import fused_qlinear_conv_nhwc
from onnx_mini.ops.nn import conv_quantized
from onnx_mini.ops.nn.conv_quantized import qlinear_conv_10

from helpers import conv2d_direct

F32, U8, I8 = np.float32, np.uint8, np.int8


def formula(acc, s32, zp):
    """saturate(round_half_even(float32(acc * s32)) + zp), written from the definition in float64."""
    info = np.iinfo(zp.dtype)
    product = (acc.astype(F32) * s32).astype(np.float64)         # the one float32 rounding
    return np.clip(np.rint(product) + int(zp), info.min, info.max).astype(zp.dtype)


def tie_met(s32, zp, bound):
    """Whether some |acc| <= bound has float32(acc * s32) a half-integer strictly inside y's clip range:
    by trying them all."""
    info = np.iinfo(zp.dtype)
    product = (np.arange(-bound, bound + 1).astype(F32) * s32).astype(np.float64)
    inside = (product > info.min - int(zp)) & (product < info.max - int(zp))
    return bool((inside & (product - np.floor(product) == 0.5)).any())


@pytest.mark.parametrize("dtype, zp", [(U8, 0), (U8, 127), (U8, 128), (U8, 255), (U8, 3), (I8, 0), (I8, -128),
                                       (I8, 127), (I8, -3)])
@pytest.mark.parametrize("scale", [0.5, 1 / 3, 2.0 ** -12, 1.3e-3, 0.0173])
def test_bits_requantize_matches_the_formula_on_every_accumulator(dtype, zp, scale):
    zp = np.array(zp, dtype)
    s32 = F32(scale)
    bound = 1 << 20 if scale < 0.1 else 1 << 18
    bits = conv_quantized._bits_plan(np.array([s32]), zp, bound)
    assert bits is not None
    # the zero point is folded into the rounder exactly where it is even or no product is a tie
    assert bits[3] == (int(zp) % 2 == 1 and tie_met(s32, zp, bound))
    acc = np.arange(-bound, bound + 1).astype(F32)
    got = conv_quantized._requantize32(acc.reshape(1, 1, -1).copy(), s32, zp, bits=bits)
    assert got.dtype == dtype
    want = formula(acc, s32, zp)
    np.testing.assert_array_equal(got.reshape(-1), want)
    assert want.min() == np.iinfo(dtype).min and want.max() == np.iinfo(dtype).max      # both ends saturate
    np.testing.assert_array_equal(got, conv_quantized._requantize32(acc.reshape(1, 1, -1).copy(), s32, zp))


def test_ties_found_as_trying_every_accumulator_does():
    rng = np.random.default_rng(5)
    zp = np.array(127, U8)
    bound = 1 << 17
    scales = [F32(0.5), F32(0.25), F32(0.1), F32(3 * 2.0 ** -12)] + list(rng.uniform(1e-4, 2e-2, 12).astype(F32))
    seen = set()
    for s in scales:
        met = conv_quantized._meets_ties(np.array([s]), zp, bound)
        assert met == tie_met(s, zp, bound), s
        seen.add(met)
    assert seen == {True, False}
    # per channel: one channel with a tie is enough
    assert conv_quantized._meets_ties(np.array([scales[4], F32(0.5)]), zp, bound)
    # 0.5 meets its ties only past acc = 1: below, none
    assert conv_quantized._meets_ties(np.array([F32(0.5)]), zp, 0) is False


def test_bits_plan_refused_where_a_product_could_leave_the_rounder_exponent():
    zp = np.array(0, U8)
    assert conv_quantized._bits_plan(np.array([F32(1.0)]), zp, 1 << 21) is None
    assert conv_quantized._bits_plan(np.array([F32(1.0)]), zp, 1 << 20) is not None
    assert conv_quantized._bits_plan(np.array([F32(0.01), F32(1.0)]), zp, 1 << 21) is None   # the largest counts
    assert conv_quantized._bits_plan(np.array([F32(np.inf)]), zp, 10) is None


def _plans(monkeypatch):
    made = []
    real = conv_quantized._bits_plan

    def spy(*a, **k):
        made.append(real(*a, **k))
        return made[-1]
    monkeypatch.setattr(conv_quantized, "_bits_plan", spy)
    return made


# (x shape NCHW, W shape, strides, pads, group): the float32 bound's largest 1x1 K at the extremes, a
# padded strided 3x3 (X's zero point folded with its per-position map), a padded depthwise
GEOMETRIES = [((1, 258, 3, 5), (4, 258, 1, 1), (1, 1), (0, 0, 0, 0), 1),
              ((1, 16, 9, 8), (8, 16, 3, 3), (2, 2), (1, 1, 1, 1), 1),
              ((1, 24, 7, 9), (24, 1, 3, 3), (1, 1), (1, 1, 1, 1), 24)]


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=["pointwise_k258", "3x3_strided", "depthwise"])
@pytest.mark.parametrize("x_type, x_zp, y_zp", [(U8, 0, 127), (U8, 255, 3), (U8, 128, 0), (I8, -128, -3),
                                               (I8, 0, 127)])
@pytest.mark.parametrize("extreme", [False, True])
@pytest.mark.parametrize("scales", [(0.0386, 0.0123, 0.0443), (0.5, 2.0 ** -6, 1.0)], ids=["tie_free", "ties"])
def test_kernels_match_the_integer_definition(monkeypatch, geometry, x_type, x_zp, y_zp, extreme, scales):
    made = _plans(monkeypatch)
    rng = np.random.default_rng(abs(x_zp) + y_zp + extreme)
    xshape, wshape, strides, pads, group = geometry
    info = np.iinfo(x_type)
    if extreme:         # X at the end far from its zero point, W at -128/127: |x - x_zp| * |w| at its largest
        x = rng.choice(np.array([info.min, info.max], x_type), size=xshape)
        w = rng.choice(np.array([-128, 127], I8), size=wshape)
        w[0] = -128
    else:
        x = rng.integers(info.min, info.max + 1, xshape).astype(x_type)
        w = rng.integers(-128, 128, wshape).astype(I8)
    m = wshape[0]
    b = rng.integers(-3000, 3000, m).astype(np.int32)
    xs, wsc, ys = (np.array(v, F32) for v in scales)     # 2^-7: acc = 64 mod 128 are ties
    ins = [x, xs, np.array(x_zp, x_type), w, wsc, np.array(0, I8), ys, np.array(y_zp, x_type), b]
    constants = {k: v for k, v in enumerate(ins) if k}
    attrs = dict(strides=list(strides), pads=list(pads), group=group)
    acc = conv2d_direct(x.astype(np.int64) - x_zp, w.astype(np.int64), b, strides, pads, group, dtype=np.int64)
    scale = np.float64(xs) * np.float64(wsc) / np.float64(ys)
    want = np.clip(np.rint(acc * scale) + y_zp, info.min, info.max).astype(x_type)
    nchw = qlinear_conv_10(**attrs, _constants=constants)
    assert nchw.__name__ == "qlinear_conv_constant"
    got = nchw(*ins)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    fused = fused_qlinear_conv_nhwc(**attrs, _constants=constants)
    assert fused.__name__ == "qlinear_conv_nhwc"
    got = fused(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), *ins[1:])
    np.testing.assert_array_equal(got, want.transpose(0, 2, 3, 1))
    assert made and all(p is not None for p in made)            # the bit-pattern requantization ran
    assert all(p[3] == (y_zp % 2 == 1 and scales[0] == 0.5) for p in made)    # zero point after: odd, ties
    if extreme:
        assert want.min() == info.min and want.max() == info.max
