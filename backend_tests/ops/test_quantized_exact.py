"""Integer products through float BLAS are bit-identical to the integer definition.

Every quantized product (MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv, and com.microsoft's
DynamicQuantizeMatMul, MatMulIntegerToFloat, QGemm, QAttention) sums (a - a_zp) * (b - b_zp) in float:
float32 holds every integer up to 2^24, so K * max|a - a_zp| * max|b - b_zp| <= 2^24 may run in one
float32 product, and beyond that K is split (or the convolution runs in float64). The references here
are np.int64 products written in the test; the operands sit at the extremes (0 against a zero point of
255, -128 against 127: |a - a_zp| = |b - b_zp| = 255, every product 65025, odd) at the largest K of the
float32 path (2^24 // 65025 = 258) and just past it, where a float32 sum cannot hold the result.
"""
from __future__ import annotations

import numpy as np
import pytest

import onnx_mini
from onnx_mini.ops.contrib import quantized_matmul as qm
from onnx_mini.ops.math.matmul import F32_EXACT, int_matmul, integer_range, matmul
from onnx_mini.ops.nn import conv_quantized

from helpers import assert_same, one_node_model

MS = "com.microsoft"
F32, U8, I8 = np.float32, np.uint8, np.int8
K_F32 = F32_EXACT // (255 * 255)      # 258: the largest K summed in one float32 product at the extremes


def run(op, inputs, const=(), n_outputs=1, domain="", version=None, **attrs):
    """One node; inputs[k] an initializer for k in const (the prepared path), fed otherwise (None: omitted)."""
    model, fed = one_node_model(op, inputs, const, n_outputs, domain, version, **attrs)
    out = onnx_mini.prepare(model).run([inputs[k] for k in fed])
    return tuple(out) if n_outputs > 1 else out[0]


def both(op, inputs, const, **kw):
    """The node's result with every input fed and with `const` as initializers: the same bits."""
    fed = run(op, inputs, (), **kw)
    prepared = run(op, inputs, const, **kw)
    as_tuple = (lambda v: v if isinstance(v, tuple) else (v,))
    for f, p in zip(as_tuple(fed), as_tuple(prepared)):
        assert_same(p, f)
    return fed


def ref_product(a, b, a_zp=0, b_zp=0):
    """(a - a_zp) @ (b - b_zp) in np.int64 (the integer definition)."""
    return np.matmul(a.astype(np.int64) - np.asarray(a_zp, np.int64), b.astype(np.int64) - np.asarray(b_zp, np.int64))


def ref_conv(x, w, x_zp=0, w_zp=0, pad=0, group=1, stride=1, dilation=1):
    """conv(x - x_zp, w - w_zp), 2-D, in np.int64 (padding: zero after the shift). pad: an int or ONNX's
    (top, left, bottom, right); a stride keeps every stride-th output of stride 1, a dilation spreads W's
    taps with zeros between them."""
    xs = x.astype(np.int64) - np.asarray(x_zp, np.int64)
    ws = w.astype(np.int64) - np.asarray(w_zp, np.int64).reshape(-1, 1, 1, 1)
    t, left, b, r = (pad,) * 4 if np.isscalar(pad) else pad
    xs = np.pad(xs, ((0, 0), (0, 0), (t, b), (left, r)))
    if dilation > 1:
        m, cg, kh, kw = ws.shape
        spread = np.zeros((m, cg, (kh - 1) * dilation + 1, (kw - 1) * dilation + 1), np.int64)
        spread[:, :, ::dilation, ::dilation] = ws
        ws = spread
    m, cg, kh, kw = ws.shape
    win = np.lib.stride_tricks.sliding_window_view(xs, (kh, kw), axis=(2, 3))   # n, c, oh, ow, kh, kw
    n, _, oh, ow = win.shape[:4]
    out = np.empty((n, m, oh, ow), np.int64)
    mg = m // group
    for g in range(group):
        out[:, g * mg:(g + 1) * mg] = np.einsum("nchwij,mcij->nmhw", win[:, g * cg:(g + 1) * cg],
                                                ws[g * mg:(g + 1) * mg])
    return out[:, :, ::stride, ::stride]


def extremes(shape, low, high, rng):
    """An array of `shape` holding only `low` and `high`, mostly `low` (so sums reach K * 65025)."""
    return np.where(rng.random(shape) < 0.9, low, high)


# -- the helper ------------------------------------------------------------------------------------

def test_integer_range_from_type_and_zero_point():
    assert integer_range(np.dtype(U8)) == 255
    assert integer_range(np.dtype(I8)) == 128
    assert integer_range(np.dtype(U8), np.array(255, U8)) == 255          # 0 - 255
    assert integer_range(np.dtype(U8), np.array(128, U8)) == 128          # 0 - 128 (255 - 128 = 127)
    assert integer_range(np.dtype(I8), np.array(127, I8)) == 255          # -128 - 127
    assert integer_range(np.dtype(I8), np.array([-3, 5], I8)) == 133      # -128 - 5 and 127 + 3


@pytest.mark.parametrize("k", [K_F32, K_F32 + 1, 3 * K_F32 + 7])
def test_int_matmul_float32_up_to_the_bound_then_split(k):
    """At the bound one float32 product holds the sum; past it the result is float64 (K split), exact."""
    a = np.full((3, k), -255, F32)
    b = np.full((k, 2), -255, F32)
    y = int_matmul(a, b, 255 * 255)
    assert y.dtype == (np.float32 if k <= K_F32 else np.float64)
    assert (y == 65025 * k).all()
    assert 65025 * k > F32_EXACT or k == K_F32           # past the bound float32 cannot even hold the result


def test_int_matmul_random_batched_against_int64():
    rng = np.random.default_rng(0)
    a = rng.integers(-255, 256, (2, 3, 1000)).astype(F32)
    b = rng.integers(-255, 256, (1000, 5)).astype(F32)
    y = int_matmul(a, b, 255 * 255)
    assert y.dtype == np.float64
    np.testing.assert_array_equal(y.astype(np.int64), np.matmul(a.astype(np.int64), b.astype(np.int64)))
    v = rng.integers(-255, 256, 700).astype(F32)                          # 1-D operands
    assert int_matmul(v, v, 255 * 255) == float(np.dot(v.astype(np.int64), v.astype(np.int64)))


# -- MatMulInteger ---------------------------------------------------------------------------------

@pytest.mark.parametrize("k", [K_F32, K_F32 + 1, 1000])
def test_matmul_integer_extremes(k):
    rng = np.random.default_rng(k)
    a = extremes((4, k), 0, 255, rng).astype(U8)
    b = extremes((k, 3), -128, 127, rng).astype(I8)
    a_zp, b_zp = np.array(255, U8), np.array(127, I8)
    y = both("MatMulInteger", [a, b, a_zp, b_zp], {1, 3}, version=10)
    assert_same(y, ref_product(a, b, 255, 127).astype(np.int32))


def test_matmul_integer_largest_sum_at_the_float32_bound_and_past_it():
    """Every product 65025: the sum 65025 * K at K = 258 (float32 path) and 259 (split), exactly."""
    for k in (K_F32, K_F32 + 1):
        a = np.zeros((2, k), U8)
        b = np.full((k, 2), -128, I8)
        y = both("MatMulInteger", [a, b, np.array(255, U8), np.array(127, I8)], {1, 3}, version=10)
        assert_same(y, np.full((2, 2), 65025 * k, np.int32))


@pytest.mark.parametrize("ta,tb", [(U8, I8), (U8, U8), (I8, I8), (I8, U8)])
def test_matmul_integer_random_against_int64(ta, tb):
    rng = np.random.default_rng(1)
    info_a, info_b = np.iinfo(ta), np.iinfo(tb)
    a = rng.integers(info_a.min, info_a.max + 1, (2, 5, 1500)).astype(ta)
    b = rng.integers(info_b.min, info_b.max + 1, (1500, 7)).astype(tb)
    a_zp = rng.integers(info_a.min, info_a.max + 1, (5, 1)).astype(ta)      # per row
    b_zp = rng.integers(info_b.min, info_b.max + 1, 7).astype(tb)           # per column
    y = both("MatMulInteger", [a, b, a_zp, b_zp], {1, 3}, version=10)
    assert_same(y, ref_product(a, b, a_zp, b_zp).astype(np.int32))


def test_matmul_integer_constant_weight_of_narrow_range():
    """A constant B of small values: its measured range (not its type's) bounds the float32 path, exactly."""
    rng = np.random.default_rng(2)
    a = rng.integers(0, 256, (3, 4000)).astype(U8)
    b = rng.integers(-2, 3, (4000, 6)).astype(I8)
    y = both("MatMulInteger", [a, b, np.array(255, U8)], {1}, version=10)
    assert_same(y, ref_product(a, b, 255).astype(np.int32))


# -- QLinearMatMul ---------------------------------------------------------------------------------

def ref_qlinear_matmul(acc, a_scale, b_scale, y_scale, y_zp, dtype):
    """QLinearMatMul's rescale as the spec writes it, in float32: saturate(round(acc * as * bs / ys) + y_zp)."""
    y = acc.astype(F32) * ((a_scale * b_scale) / y_scale)
    info = np.iinfo(dtype)
    return np.clip(np.rint(y) + F32(y_zp), info.min, info.max).astype(dtype)


@pytest.mark.parametrize("k", [K_F32, K_F32 + 1, 2000])
def test_qlinear_matmul_extremes_and_random(k):
    rng = np.random.default_rng(k)
    a = extremes((3, k), 0, 255, rng).astype(U8)
    b = rng.integers(-128, 128, (k, 4)).astype(I8)
    b[:, 0] = -128                                                        # one column of extremes
    sa, sb, sy = F32(0.002), F32(0.003), F32(0.5)
    inputs = [a, np.array(sa), np.array(255, U8), b, np.array(sb), np.array(127, I8), np.array(sy),
              np.array(7, U8)]
    y = both("QLinearMatMul", inputs, {3, 4, 5, 6, 7}, version=10)
    assert_same(y, ref_qlinear_matmul(ref_product(a, b, 255, 127), sa, sb, sy, 7, U8))


# -- ConvInteger, QLinearConv ----------------------------------------------------------------------

@pytest.mark.parametrize("c", [K_F32, K_F32 + 1])
def test_conv_integer_extremes_at_the_float32_bound(c):
    """Reduction C * 1 * 1 = 258 runs in float32, 259 in float64; both exact at |x - zp| = |w - zp| = 255."""
    rng = np.random.default_rng(c)
    x = extremes((1, c, 3, 4), 0, 255, rng).astype(U8)
    w = extremes((2, c, 1, 1), -128, 127, rng).astype(I8)
    x[0, :, 0, 0] = 0
    w[0] = -128                                                           # output (0, 0, 0, 0) = 65025 * c
    y = both("ConvInteger", [x, w, np.array(255, U8), np.array(127, I8)], {1, 3}, version=10)
    assert_same(y, ref_conv(x, w, 255, 127).astype(np.int32))
    assert y[0, 0, 0, 0] == 65025 * c


def test_conv_integer_random_3x3_grouped_and_depthwise():
    rng = np.random.default_rng(3)
    x = rng.integers(0, 256, (2, 8, 9, 7)).astype(U8)
    for group, m in ((1, 6), (2, 4), (8, 8)):
        w = rng.integers(-128, 128, (m, 8 // group, 3, 3)).astype(I8)
        w_zp = rng.integers(-128, 128, m).astype(I8)
        y = both("ConvInteger", [x, w, np.array(3, U8), w_zp], {1, 3}, version=10, pads=[1, 1, 1, 1], group=group)
        assert_same(y, ref_conv(x, w, 3, w_zp, pad=1, group=group).astype(np.int32))


def test_conv_integer_wide_3x3_in_float32_is_exact():
    """256 -> 256 channels, 3x3 at 14x14: a float Conv of this shape takes Winograd, whose transforms are
    not exact in float32 (quarters, and sums growing past 2^24 before its output transform). A constant W
    within [-27, 28] keeps the integer convolution in float32 (2304 * 255 * 28 < 2^24): it must take an
    exact algorithm there. Mostly-extreme values make the sums large (Winograd is wrong on ~40% of them)."""
    rng = np.random.default_rng(4)
    x = extremes((1, 256, 14, 14), 255, 0, rng).astype(U8)
    w = extremes((256, 256, 3, 3), 28, -27, rng).astype(I8)
    y = run("ConvInteger", [x, w], {1}, version=10, pads=[1, 1, 1, 1])
    assert_same(y, ref_conv(x, w, pad=1).astype(np.int32))


def test_conv_integer_wide_3x3_in_float64_is_exact():
    """The same shape with full-range values: float64 (Winograd is exact there: quarters of integers
    far below 2^53)."""
    rng = np.random.default_rng(5)
    x = rng.integers(0, 256, (1, 256, 14, 14)).astype(U8)
    w = rng.integers(-128, 128, (256, 256, 3, 3)).astype(I8)
    y = both("ConvInteger", [x, w, np.array(255, U8), np.array(127, I8)], {1, 3}, version=10, pads=[1, 1, 1, 1])
    assert_same(y, ref_conv(x, w, 255, 127, pad=1).astype(np.int32))


def ref_qlinear_conv(acc, bias, xs, ws, ys, yz, dtype):
    """QLinearConv's rescale in float64: saturate(round((acc + B) * xs * ws / ys) + y_zp)."""
    scale = (np.float64(xs) * ws.astype(np.float64) / np.float64(ys)).reshape(1, -1, 1, 1)
    y = np.rint((acc + bias.astype(np.int64).reshape(1, -1, 1, 1)) * scale) + yz
    info = np.iinfo(dtype)
    return np.clip(y, info.min, info.max).astype(dtype)


@pytest.mark.parametrize("c,k", [(K_F32, 1), (K_F32 + 1, 1), (32, 3)])
def test_qlinear_conv_extremes_and_random(c, k):
    rng = np.random.default_rng(c + k)
    x = extremes((1, c, 5, 5), 0, 255, rng).astype(U8)
    w = rng.integers(-128, 128, (3, c, k, k)).astype(I8)
    w[0] = -128
    ws = np.array([1e-5, 2e-4, 3e-3], F32)
    bias = np.array([1000, -70000, 5], np.int32)
    inputs = [x, np.array(F32(0.02)), np.array(255, U8), w, ws, np.array([127, 0, -128], I8), np.array(F32(0.1)),
              np.array(100, U8), bias]
    y = both("QLinearConv", inputs, {1, 2, 3, 4, 5, 6, 7, 8}, version=10, pads=[k // 2] * 4)
    acc = ref_conv(x, w, 255, np.array([127, 0, -128]), pad=k // 2)
    assert_same(y, ref_qlinear_conv(acc, bias, F32(0.02), ws, F32(0.1), 100, U8))


# -- QLinearConv with X's zero point folded into the bias (every input but X a constant) ----------------

def folds(monkeypatch):
    """Count the calls of the zero-point fold (conv_quantized._ZeroPointFold)."""
    calls = []
    real = conv_quantized._ZeroPointFold.__call__
    monkeypatch.setattr(conv_quantized._ZeroPointFold, "__call__",
                        lambda self, *a: calls.append(1) or real(self, *a))
    return calls


FOLD_CASES = [  # (x type, x_zp, W shape, group, attributes)
    pytest.param(U8, 128, (16, 1, 3, 3), 16, dict(pads=[1, 1, 1, 1], strides=[2, 2]), id="depthwise-stride2"),
    pytest.param(U8, 37, (6, 2, 3, 3), 2, dict(pads=[0, 1, 2, 1]), id="grouped-asymmetric-pads-odd-zp"),
    pytest.param(U8, 255, (5, 8, 1, 1), 1, {}, id="pointwise-no-pad-bias-folded"),
    pytest.param(U8, 200, (5, 8, 1, 1), 1, dict(pads=[1, 0, 0, 2]), id="pointwise-padded"),
    pytest.param(I8, -128, (4, 8, 3, 3), 1, dict(pads=[2, 2, 2, 2], dilations=[2, 2]), id="int8-dilated"),
    pytest.param(I8, 127, (8, 1, 3, 3), 8, dict(pads=[1, 1, 1, 1], strides=[1, 2]), id="int8-depthwise-strides"),
    pytest.param(I8, 3, (4, 8, 3, 3), 1, dict(auto_pad="SAME_UPPER", strides=[2, 2]), id="int8-same-upper"),
]


@pytest.mark.parametrize("xt,x_zp,w_shape,group,attrs", FOLD_CASES)
def test_qlinear_conv_zero_point_fold_against_int64(monkeypatch, xt, x_zp, w_shape, group, attrs):
    """conv(x, W) + (B - x_zp * W summed over the taps inside X) is conv(x - x_zp, W) + B bit for bit: random X,
    X at the type's extremes (|x - x_zp| at its largest on one side), two images, per-channel scales and W
    zero points; the fold runs (counted) wherever x_zp is not 0."""
    calls = folds(monkeypatch)
    rng = np.random.default_rng(abs(x_zp) + w_shape[0])
    info = np.iinfo(xt)
    m, cg = w_shape[:2]
    w = rng.integers(-128, 128, w_shape).astype(I8)
    w[0] = -128
    w_zp = rng.integers(-5, 6, m).astype(I8)
    ws = (rng.random(m) * 2e-3 + 1e-4).astype(F32)
    bias = rng.integers(-3000, 3000, m).astype(np.int32)
    xs, ys, yz = F32(0.02), F32(0.05), np.array(120, U8)
    for x in (rng.integers(info.min, info.max + 1, (2, cg * group, 9, 8)).astype(xt),
              extremes((1, cg * group, 7, 7), info.min, info.max, rng).astype(xt),
              np.full((1, cg * group, 6, 5), info.min if x_zp > 0 else info.max, xt)):
        inputs = [x, np.array(xs), np.array(x_zp, xt), w, ws, w_zp, np.array(ys), yz, bias]
        y = both("QLinearConv", inputs, {1, 2, 3, 4, 5, 6, 7, 8}, version=10, group=group, **attrs)
        a = dict(attrs)
        if a.pop("auto_pad", None) == "SAME_UPPER":     # odd sizes padded at the end: total k - 1 - (n - 1) % s
            hp = max(0, (x.shape[2] - 1) // 2 * 2 + 3 - x.shape[2])
            wp = max(0, (x.shape[3] - 1) // 2 * 2 + 3 - x.shape[3])
            a["pads"] = [hp // 2, wp // 2, hp - hp // 2, wp - wp // 2]
        st = a.get("strides", [1, 1])
        acc = ref_conv(x, w, x_zp, w_zp, pad=tuple(a.get("pads", [0] * 4)), group=group, stride=1,
                       dilation=a.get("dilations", [1])[0])[:, :, ::st[0], ::st[1]]
        assert_same(y, ref_qlinear_conv(acc, bias, xs, ws, ys, 120, U8))
    assert calls


@pytest.mark.parametrize("x_shape,w_shape,group,attrs", [
    ((2, 5, 11), (3, 5, 4), 1, dict(pads=[3, 1], strides=[2], dilations=[2])),
    ((1, 4, 7, 6), (4, 1, 3, 3), 4, dict(pads=[1, 0, 2, 1], strides=[2, 1])),
    ((1, 4, 7, 6), (6, 2, 3, 2), 2, dict(auto_pad="SAME_LOWER", strides=[3, 2], dilations=[1, 2])),
    ((1, 3, 5, 5), (2, 3, 3, 3), 1, dict(auto_pad="VALID")),
    ((1, 2, 4, 5, 6), (3, 2, 2, 3, 3), 1, dict(pads=[1, 0, 2, 0, 1, 1], strides=[1, 2, 2])),
])
def test_zero_point_fold_sums_w_over_the_taps_inside_x(x_shape, w_shape, group, attrs):
    """The fold's map of W summed over the taps inside X, per output position, against the sum written out:
    for each output position, each tap whose input position (o * stride - begin + t * dilation) lies in X
    (1-D, 2-D, 3-D; pads, auto_pad, strides, dilations, groups)."""
    rng = np.random.default_rng(sum(w_shape))
    ws = rng.integers(-255, 256, w_shape).astype(F32)
    a = conv_quantized._attrs(**{"auto_pad": "NOTSET", "dilations": None, "group": group, "kernel_shape": None,
                                 "pads": None, "strides": None, **attrs})
    fold = conv_quantized._ZeroPointFold(a, ws, None, 7)
    got = fold._covered(x_shape[1:])
    r = len(x_shape) - 2
    sizes, kernel = x_shape[2:], w_shape[2:]
    strides, dil = attrs.get("strides", [1] * r), attrs.get("dilations", [1] * r)
    extent = [(k - 1) * d + 1 for k, d in zip(kernel, dil)]
    if attrs.get("auto_pad") == "SAME_LOWER":
        out = [-(-n // s) for n, s in zip(sizes, strides)]
        total = [max(0, (o - 1) * s + e - n) for o, s, e, n in zip(out, strides, extent, sizes)]
        begin = [t - t // 2 for t in total]
    else:
        pads = attrs.get("pads", [0] * 2 * r)
        begin = pads[:r]
        out = [(n + pads[a] + pads[r + a] - e) // s + 1 for a, (n, e, s) in enumerate(zip(sizes, extent, strides))]
    want = np.zeros((1, w_shape[0], *out), np.int64)
    for m in range(w_shape[0]):
        for o in np.ndindex(*out):
            for t in np.ndindex(*kernel):
                pos = [oi * s - b + ti * d for oi, s, b, ti, d in zip(o, strides, begin, t, dil)]
                if all(0 <= p < n for p, n in zip(pos, sizes)):
                    want[(0, m) + o] += int(ws[(m, slice(None)) + t].sum())
    assert got.shape == want.shape and np.array_equal(got, want)        # exact integers


def test_qlinear_conv_zero_point_fold_without_bias(monkeypatch):
    """No B: the fold's bias is -x_zp * sum(W) alone, and its map at the padded borders (x_zp = 1, odd)."""
    calls = folds(monkeypatch)
    rng = np.random.default_rng(12)
    x = rng.integers(0, 256, (1, 6, 6, 7)).astype(U8)
    w = rng.integers(-128, 128, (6, 1, 3, 3)).astype(I8)
    inputs = [x, np.array(F32(0.01)), np.array(1, U8), w, np.array(F32(0.004)), np.array(0, I8), np.array(F32(0.2)),
              np.array(128, U8)]
    y = both("QLinearConv", inputs, {1, 2, 3, 4, 5, 6, 7}, version=10, pads=[1, 1, 1, 1], group=6)
    assert_same(y, ref_qlinear_conv(ref_conv(x, w, 1, pad=1, group=6), np.zeros(6, np.int32), F32(0.01),
                                    np.full(6, 0.004, F32), F32(0.2), 128, U8))
    assert calls


def test_qlinear_conv_zero_point_fold_refused_past_its_bound(monkeypatch):
    """The fold's partial sums reach max|x| * sum|W_m| (x not shifted), beyond the node's own bound: 400 taps
    of -128 with x_zp = 128 sum to 400 * 128 * 128 (< 2^24) shifted, but up to 400 * 128 * 255 unshifted
    (> 2^24): no fold there, and the result stays exact."""
    calls = folds(monkeypatch)
    w = np.full((1, 400, 1, 1), -128, I8)
    assert conv_quantized._ZeroPointFold.make({}, w.astype(F32), None, np.array(128, U8), np.dtype(U8)) is None
    x = np.full((1, 400, 2, 2), 0, U8)
    x[0, :, 1, 1] = 255
    inputs = [x, np.array(F32(1)), np.array(128, U8), w, np.array([2.0 ** -16], F32), np.array([0], I8),
              np.array(F32(1)), np.array(128, U8)]
    y = both("QLinearConv", inputs, {1, 2, 3, 4, 5, 6, 7}, version=10)
    acc = ref_conv(x, w, 128)
    assert_same(y, ref_qlinear_conv(acc, np.zeros(1, np.int32), F32(1), np.array([2.0 ** -16], F32), F32(1), 128, U8))
    assert acc[0, 0, 0, 0] == 400 * 128 * 128 and not calls


def test_qlinear_conv_zero_point_zero_takes_no_fold(monkeypatch):
    """x_zp = 0: nothing to fold (X is only cast)."""
    calls = folds(monkeypatch)
    rng = np.random.default_rng(11)
    x = rng.integers(0, 256, (1, 4, 5, 5)).astype(U8)
    w = rng.integers(-128, 128, (3, 4, 3, 3)).astype(I8)
    inputs = [x, np.array(F32(0.01)), np.array(0, U8), w, np.array(F32(0.01)), np.array(0, I8), np.array(F32(0.2)),
              np.array(3, U8)]
    y = both("QLinearConv", inputs, {1, 2, 3, 4, 5, 6, 7}, version=10, pads=[1, 1, 1, 1])
    assert_same(y, ref_qlinear_conv(ref_conv(x, w, pad=1), np.zeros(3, np.int32), F32(0.01), np.full(3, 0.01, F32),
                                    F32(0.2), 3, U8))
    assert not calls


# -- com.microsoft: MatMulIntegerToFloat, DynamicQuantizeMatMul, QGemm, QAttention ------------------

@pytest.mark.parametrize("k", [K_F32, K_F32 + 1, 1200])
def test_matmul_integer_to_float_extremes(k):
    rng = np.random.default_rng(k)
    a = extremes((2, 3, k), 0, 255, rng).astype(U8)
    b = extremes((k, 4), -128, 127, rng).astype(I8)
    sa, sb, bias = F32(0.01), np.array([0.5, 0.25, 1, 2], F32), np.array([1, -2, 3, -4], F32)
    y = both("MatMulIntegerToFloat", [a, b, np.array(sa), sb, np.array(255, U8), np.array(127, I8), bias],
             {1, 3, 5, 6}, domain=MS)
    exp = ref_product(a, b, 255, 127).astype(F32) * (sa * sb)
    exp += bias
    assert_same(y, exp)


@pytest.mark.parametrize("k", [K_F32, K_F32 + 1])
def test_dynamic_quantize_matmul_extremes(k):
    """A = q / 2 with q spanning 0..255 quantizes to exactly q (scale 127.5 / 255 = 0.5, zero point 0)."""
    rng = np.random.default_rng(k)
    q = extremes((3, k), 255, 0, rng).astype(U8)
    q[0, 0], q[0, 1] = 0, 255
    a = q.astype(F32) / 2
    b = extremes((k, 2), -128, 127, rng).astype(I8)
    sb = np.array([0.125, 0.5], F32)
    y = both("DynamicQuantizeMatMul", [a, b, sb, np.array(-128, I8)], {1, 2, 3}, domain=MS)
    assert_same(y, ref_product(q, b, 0, -128).astype(F32) * (F32(0.5) * sb))


@pytest.mark.parametrize("k", [K_F32, K_F32 + 1])
def test_qgemm_extremes(k):
    rng = np.random.default_rng(k)
    a = extremes((3, k), 0, 255, rng).astype(U8)
    b = extremes((k, 2), -128, 127, rng).astype(I8)
    sa, sb = F32(0.01), F32(0.02)
    y = both("QGemm", [a, np.array(sa), np.array(255, U8), b.T.copy(), np.array(sb), np.array(127, I8)],
             {3, 4, 5}, domain=MS, transB=1, alpha=2.0)
    exp = ref_product(a, b, 255, 127).astype(F32) * (sa * sb)
    exp *= F32(2)
    assert_same(y, exp)


def ref_qgemm(a, b, a_zp, b_zp, sa, sb, c, alpha, ys, yz, dtype):
    """QGemm's float32 steps on the int64 product: acc * (sa * sb) + c * (sa * sb), times alpha, / ys, then
    rounded half to even, shifted by yz and saturated (y_scale None: the float32 values)."""
    scale = F32(sa) * np.asarray(sb, F32)
    y = ref_product(a, b, a_zp, b_zp).astype(F32) * scale
    if c is not None:
        y += c.astype(F32) * scale
    y *= F32(alpha)
    if ys is None:
        return y
    info = np.iinfo(dtype)
    return np.clip(np.rint(y / F32(ys)) + yz, info.min, info.max).astype(dtype)


@pytest.mark.parametrize("a_zp,k,trans_a,c_shape,y_out", [
    (134, 1024, 0, (2,), (U8, 131)),       # the MobileNet classifier's shape of sums: one float32 product
    (255, K_F32 + 1, 1, (1, 2), (I8, -7)),
    (0, 300, 0, None, None),
    (7, 64, 0, (), (U8, None)),
])
def test_qgemm_constant_weights_against_int64(monkeypatch, a_zp, k, trans_a, c_shape, y_out):
    """Every input but A constant (a quantize_static model): the product in one float32 product where
    max|a - a_zp| * sum_k |B[k, n] - b_zp| stays within 2^24 (else split as before); extremes and random A,
    one row and several. The constant path (its one product counted) runs."""
    calls = []
    monkeypatch.setattr(qm, "matmul", lambda *a: calls.append(1) or matmul(*a))
    rng = np.random.default_rng(k + a_zp)
    b = rng.integers(-128, 128, (k, 2)).astype(I8)
    b_zp = np.array([0, 3], I8)
    sa, sb = F32(0.004), np.array([0.01, 0.03], F32)
    c = None if c_shape is None else rng.integers(-20000, 20000, c_shape).astype(np.int32)
    dt, yz = y_out if y_out else (None, None)
    for a in (rng.integers(0, 256, (1, k)).astype(U8), extremes((3, k), 0, 255, rng).astype(U8)):
        inputs = [a.T.copy() if trans_a else a, np.array(sa), np.array(a_zp, U8), b.T.copy(), sb, b_zp, c,
                  None if y_out is None else np.array(F32(0.5)), None if yz is None else np.array(yz, dt)]
        y = both("QGemm", inputs, {1, 2, 3, 4, 5, 6, 7, 8}, domain=MS, transA=trans_a, transB=1, alpha=1.5)
        assert_same(y, ref_qgemm(a, b, a_zp, b_zp, sa, sb, c, 1.5, None if y_out is None else 0.5,
                                 0 if yz is None else yz, dt or U8))
    assert len(calls) == 2


@pytest.mark.parametrize("fed", [6, 7, 8])
def test_qgemm_input_fed_at_run_time_takes_the_general_path(monkeypatch, fed):
    """C, y_scale or y_zero_point fed while the rest are constants: the per-call path (the constant one's
    product never called), the same bits as with every input fed."""
    calls = []
    monkeypatch.setattr(qm, "matmul", lambda *a: calls.append(1) or matmul(*a))
    rng = np.random.default_rng(fed)
    a, b = rng.integers(0, 256, (2, 40)).astype(U8), rng.integers(-128, 128, (40, 3)).astype(I8)
    c = rng.integers(-900, 900, 3).astype(np.int32)
    inputs = [a, np.array(F32(0.01)), np.array(9, U8), b, np.array(F32(0.02)), np.array(1, I8), c,
              np.array(F32(0.3)), np.array(-4, I8)]
    y = both("QGemm", inputs, {1, 2, 3, 4, 5, 6, 7, 8} - {fed}, domain=MS)
    assert_same(y, ref_qgemm(a, b, 9, 1, F32(0.01), F32(0.02), c, 1.0, 0.3, -4, I8))
    assert not calls


def test_qgemm_constant_weights_split_past_the_column_bound(monkeypatch):
    """Columns of 259 taps at |b - b_zp| = 255 against |a - a_zp| = 255: the measured bound passes 2^24, so the
    one-product path is refused (its product never called) and K is split as int_matmul does; the sum
    259 * 65025 comes out exact, then rounded once to float32."""
    calls = []
    monkeypatch.setattr(qm, "matmul", lambda *a: calls.append(1) or matmul(*a))
    b = np.full((K_F32 + 1, 1), -128, I8)
    a = np.zeros((1, K_F32 + 1), U8)
    inputs = [a, np.array(F32(1)), np.array(255, U8), b, np.array(F32(1)), np.array(127, I8)]
    y = both("QGemm", inputs, {1, 2, 3, 4, 5}, domain=MS)
    assert y[0, 0] == F32(65025 * (K_F32 + 1)) and not calls


@pytest.mark.parametrize("hidden_in", [K_F32, K_F32 + 1])
def test_qattention_extremes(hidden_in):
    """One token, one head: the softmax over one key is 1, so the output is V itself, the exact product."""
    rng = np.random.default_rng(hidden_in)
    x = extremes((2, 1, hidden_in), 0, 255, rng).astype(U8)
    w = extremes((hidden_in, 6), -128, 127, rng).astype(I8)
    bias = np.array([0, 0, 0, 0, 1.5, -2], F32)
    sx, sw = F32(0.001), F32(0.002)
    y = both("QAttention", [x, w, bias, np.array(sx), np.array(sw), None, np.array(255, U8), np.array(127, I8)],
             {1, 2, 4, 7}, domain=MS, num_heads=1)
    v = ref_product(x, w, 255, 127)[..., 4:].astype(F32) * (sx * sw)
    v += bias[4:]
    assert_same(y, v)


@pytest.mark.parametrize("bias,expected", [(766, 126), (767, 127)])
def test_qlinear_conv_bias_counts_in_the_float32_bound(bias, expected):
    """B is summed with the product: 258 * 65025 + 766 = 2^24 still fits float32, + 767 = 2^24 + 1 does not
    (float32 would round it to 2^24). The rescale 126.5 / 2^24 puts 2^24 on a tie (126.5 -> 126) and
    2^24 + 1 just past it (-> 127)."""
    x = np.zeros((1, K_F32, 1, 1), U8)
    w = np.full((1, K_F32, 1, 1), -128, I8)
    ws = np.array([126.5 / 2 ** 24], F32)
    inputs = [x, np.array(F32(1)), np.array(255, U8), w, ws, np.array([127], I8), np.array(F32(1)),
              np.array(0, U8), np.array([bias], np.int32)]
    y = both("QLinearConv", inputs, {1, 2, 3, 4, 5, 6, 7, 8}, version=10)
    assert_same(y, np.full((1, 1, 1, 1), expected, U8))


# -- QLinearConv's rescale in float32 where it is proven to give the float64 integers ----------------

def near_tie_scale():
    """(acc, w_scale): the first integer acc >= 10000 with w_scale = float32(100.5 / acc) putting acc * w_scale
    just above the tie 100.5 (the exact product rounds to 101), where float32's product is 100.5 itself
    (which rounds half to even to 100)."""
    from fractions import Fraction
    for acc in range(10_000, 40_000):
        ws = F32(100.5 / acc)
        if Fraction(acc) * Fraction(float(ws)) > Fraction(201, 2) and F32(acc) * ws == F32(100.5):
            return acc, ws
    raise AssertionError("no such scale")


def one_by_one_conv_summing_to(acc):
    """x (1, C, 1, 1) of uint8 values summing to acc, W of ones (1x1): the accumulator is acc."""
    c = -(-acc // 255)
    x = np.full((1, c, 1, 1), 255, U8)
    x[0, -1] = acc - 255 * (c - 1)
    return x, np.ones((1, c, 1, 1), I8)


def test_qlinear_conv_float32_rescale_refused_where_it_would_round_otherwise():
    acc, ws = near_tie_scale()
    assert F32(acc) * ws == F32(100.5)                       # what a float32 rescale would round (to 100)
    assert not conv_quantized._float32_rescale_is_exact(np.float64(ws), np.array(0, U8), acc)
    x, w = one_by_one_conv_summing_to(acc)
    inputs = [x, np.array(F32(1)), np.array(0, U8), w, np.array(ws), np.array(0, I8), np.array(F32(1)),
              np.array(0, U8)]
    y = both("QLinearConv", inputs, {1, 2, 3, 4, 5, 6, 7}, version=10)
    assert_same(y, np.full((1, 1, 1, 1), 101, U8))            # round(acc * ws) of the real product


@pytest.mark.parametrize("per_channel", [False, True])
def test_qlinear_conv_float32_rescale_where_proven(monkeypatch, per_channel):
    """Scales of a quantize_static layer for which the proof holds (one channel of a near tie would send
    the whole layer to float64): the float32 rescale runs, and the result is the integer definition's
    (int64 sums, float64 rescale) bit for bit."""
    calls = []
    real = conv_quantized._requantize32
    monkeypatch.setattr(conv_quantized, "_requantize32", lambda *a, **k: calls.append(1) or real(*a, **k))
    rng = np.random.default_rng(7)
    c, m = 24, 3
    x = rng.integers(0, 256, (1, c, 9, 9)).astype(U8)
    w = rng.integers(-127, 128, (m, c, 3, 3)).astype(I8)
    ws = np.array([0.0051, 0.0077, 0.0123], F32) if per_channel else np.array(F32(0.0123))
    xs, ys, yz = F32(0.0386), F32(0.0443), 127
    bias = rng.integers(-20000, 20000, m).astype(np.int32)
    scale = np.float64(xs) * ws.astype(np.float64) / np.float64(ys)
    assert conv_quantized._float32_rescale_is_exact(scale, np.array(yz, U8), 1 << 24)
    inputs = [x, np.array(xs), np.array(128, U8), w, ws, np.array(0, I8), np.array(ys), np.array(yz, U8), bias]
    y = run("QLinearConv", inputs, {1, 2, 3, 4, 5, 6, 7, 8}, version=10, pads=[1] * 4)
    assert calls                                              # the float32 rescale ran
    acc = ref_conv(x, w, 128, np.zeros(m, np.int64), pad=1)
    assert_same(y, ref_qlinear_conv(acc, bias, xs, np.broadcast_to(ws, (m,)), ys, yz, U8))


@pytest.mark.parametrize("dtype, zp", [(U8, 0), (U8, 126), (U8, 127), (U8, 254), (I8, 0), (I8, -128), (I8, 126),
                                       (I8, -3)])
def test_requantize32_against_the_formula_at_ties_and_extremes(dtype, zp):
    """_requantize32 (an even zero point folded into the rounder, an odd one added after) is saturate(
    round_half_even(float32(acc * scale)) + zp) on every accumulator: ties of both parities, the clip
    bounds either side, and the float32 bound 2^24 at both signs."""
    info = np.iinfo(dtype)
    span = np.arange(-600, 601)
    acc = np.concatenate([span, [-(1 << 24), 1 - (1 << 24), (1 << 24) - 1, 1 << 24]]).astype(F32)
    for scale in (F32(0.5), F32(1.5), F32(1 / 3), F32(2.0 ** -16)):
        product = (acc * scale).astype(np.float64)                            # the one float32 rounding
        want = np.clip(np.rint(product) + zp, info.min, info.max).astype(dtype)
        got = conv_quantized._requantize32(acc.reshape(1, 1, -1).copy(), scale, np.array(zp, dtype))
        assert got.dtype == dtype
        assert_same(got.reshape(-1), want)
    ties = conv_quantized._requantize32(np.array([1, 3, 5, -1, -3], F32), F32(0.5), np.array(zp, dtype))
    assert ties.astype(int).tolist() == [max(info.min, min(info.max, v + zp)) for v in (0, 2, 2, 0, -2)]


def test_qlinear_conv_float32_rescale_with_an_even_zero_point():
    """The float32 rescale with y's zero point even (folded into the rounder) against the integer
    definition (int64 sums, float64 rescale), codes saturating at both ends."""
    rng = np.random.default_rng(11)
    c, m = 24, 3
    x = rng.integers(0, 256, (1, c, 9, 9)).astype(U8)
    w = rng.integers(-127, 128, (m, c, 3, 3)).astype(I8)
    ws = np.array([0.0051, 0.0077, 0.0123], F32)
    xs, ys, yz = F32(0.0386), F32(0.0443), 126
    bias = rng.integers(-20000, 20000, m).astype(np.int32)
    scale = np.float64(xs) * ws.astype(np.float64) / np.float64(ys)
    assert conv_quantized._float32_scale(scale, np.array(yz, U8), 1 << 24) is not None
    inputs = [x, np.array(xs), np.array(128, U8), w, ws, np.array(0, I8), np.array(ys), np.array(yz, U8), bias]
    y = run("QLinearConv", inputs, {1, 2, 3, 4, 5, 6, 7, 8}, version=10, pads=[1] * 4)
    acc = ref_conv(x, w, 128, np.zeros(m, np.int64), pad=1)
    want = ref_qlinear_conv(acc, bias, xs, ws, ys, yz, U8)
    assert (want == 0).any() and (want == 255).any()
    assert_same(y, want)


@pytest.mark.parametrize("dtype,zp", [(np.uint8, 0), (np.uint8, 126), (np.uint8, 127), (np.int8, -128),
                                      (np.int8, -3), (np.uint16, 32768), (np.int16, -32767)])
@pytest.mark.parametrize("ftype", [np.float32, np.float64])
def test_quantize_array_finite_fold_matches_the_formula(dtype, zp, ftype):
    """quantize_array(..., finite=True) folds an even scalar zero point into its rounding: the codes are
    saturate(round_half_even(q) + zp) all the same, at ties of both parities and past both bounds;
    without `finite` a NaN still gives the zero point."""
    from onnx_mini.ops.quantization import quantize_array
    info = np.iinfo(dtype)
    ties = np.arange(-300, 300) + 0.5
    q = np.concatenate([ties, ties - 0.25, ties + 0.25, [info.min - zp - 10.0, info.max - zp + 10.0,
                                                         -0.5, 0.5, 1.5, -1.5]]).astype(ftype)
    want = np.clip(np.rint(q.astype(np.float64)) + zp, info.min, info.max).astype(dtype)
    z = np.array(zp, dtype)
    assert_same(quantize_array(q.copy(), dtype, z, scratch=True, finite=True), want)
    assert_same(quantize_array(q.copy(), dtype, z, scratch=True), want)
    assert quantize_array(np.array([np.nan], ftype), dtype, z)[0] == zp
