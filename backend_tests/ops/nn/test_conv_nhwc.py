"""The channels-last Conv (ops/fused.py's ConvNHWC, ops/nn/conv/channels_last.py) against a direct loop
over the taps written here from Conv's spec: every path (pointwise, depthwise stride 1 / strided narrow /
strided wide, im2col, grouped 1x1 and its channel shuffle, the NCHW fallback), strips, short maps' valid kernel rows, strides, pads (asymmetric too), bias or none, activations,
a residual, infinities and NaN, float64, fed weights."""
from __future__ import annotations

import numpy as np
import pytest

from onnx_mini.errors import OnnxMiniError
from onnx_mini.ops.fused import fused_conv_nhwc
from onnx_mini.ops.nn.conv import channels_last

from helpers import conv2d_direct


def direct(x, w, b, strides=(1, 1), pads=(0, 0, 0, 0), group=1):
    """Conv by its definition on NCHW data, in float64 (helpers.conv2d_direct)."""
    return conv2d_direct(x, w, b, strides, pads, group)


def nhwc(a):
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1))


def run(x, w, b=None, z=None, constant=True, **attrs):
    """The kernel on x (NCHW, given channels-last), W/B constants (or fed); -> Y back in NCHW."""
    consts = {1: w} if constant else {}
    if constant and b is not None:
        consts[2] = b
    fn = fused_conv_nhwc(kernel_shape=list(w.shape[2:]), _constants=consts, **attrs)
    args = [nhwc(x), w] + ([b] if b is not None or z is not None else [])
    if z is not None:
        args.append(nhwc(z))
    y = fn(*args)
    assert y.dtype == x.dtype and y.flags.c_contiguous
    return y.transpose(0, 3, 1, 2)


def data(shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


CASES = [   # (C, M, group, k, strides, pads, H, W): the path each one takes
    (8, 12, 1, 1, (1, 1), (0, 0, 0, 0), 5, 6),          # pointwise: one product
    (16, 8, 1, 1, (2, 2), (0, 0, 0, 0), 7, 9),          # strided 1x1: im2col
    (16, 8, 1, 1, (1, 1), (1, 0, 0, 1), 4, 5),          # padded 1x1: im2col
    (16, 24, 1, 3, (2, 2), (1, 1, 1, 1), 11, 13),       # im2col 3x3 /2
    (16, 4, 1, 3, (1, 2), (0, 1, 2, 0), 6, 7),          # im2col, asymmetric pads and strides
    (6, 6, 6, 3, (1, 1), (1, 1, 1, 1), 5, 7),           # depthwise, stride 1: tiled rows
    (5, 5, 5, 3, (2, 2), (1, 1, 1, 1), 9, 11),          # depthwise, strided, narrow: windows einsum
    (4, 4, 4, 3, (2, 2), (1, 1, 1, 1), 9, 40),          # depthwise, strided, wide (20 > 14): column phases
    (3, 3, 3, 5, (2, 3), (2, 0, 1, 2), 12, 50),         # depthwise 5x5, strides 2/3, asymmetric pads, phases
    (3, 3, 3, 2, (1, 1), (0, 0, 1, 1), 4, 4),           # depthwise 2x2, end padding only
    (4, 6, 2, 3, (1, 1), (1, 1, 1, 1), 5, 5),           # grouped 3x3 (neither 1 nor depthwise): NCHW fallback
    (3, 8, 1, 3, (2, 2), (1, 1, 1, 1), 8, 8),           # few channels: im2col still computes it
    (4, 4, 4, 2, (1, 3), (0, 1, 0, 1), 6, 50),          # depthwise 2x2 /3, wide: phase 2 holds no kernel column
    (3, 3, 3, 1, (2, 2), (0, 0, 0, 0), 5, 40),          # depthwise 1x1 /2, wide: phase 0 alone
    (16, 8, 1, 3, (1, 1), (1, 1, 1, 1), 16, 17),        # strips: 3x3, 272 output pixels, M <= kw*C / 2
    (8, 4, 1, 5, (1, 1), (2, 0, 1, 3), 19, 20),         # strips 5x5, asymmetric pads (tap columns cut both sides)
    (6, 2, 1, 3, (1, 1), (0, 4, 0, 0), 18, 15),         # strips, a left pad wider than the kernel
    (8, 8, 8, 5, (1, 1), (2, 2, 2, 2), 2, 30),          # depthwise 5x5 on 2 rows: the valid kernel rows only
    (6, 6, 6, 5, (1, 1), (2, 2, 2, 2), 3, 20),          # ... 3 rows (two thirds of the kernel rows valid)
    (3, 3, 3, 3, (1, 1), (0, 1, 3, 1), 2, 9),           # ... padding below only: the last row reads none
    (12, 8, 4, 1, (1, 1), (0, 0, 0, 0), 5, 6),          # grouped 1x1: one stacked product over group blocks
    (12, 8, 4, 1, (2, 2), (0, 0, 0, 0), 5, 6),          # grouped 1x1 strided: NCHW fallback
    (6, 9, 3, 1, (1, 1), (0, 1, 0, 0), 4, 4),           # grouped 1x1 padded: NCHW fallback
]
STRIPS = (14, 15, 16)
VALID_ROWS = (17, 18, 19)


@pytest.mark.parametrize("c, m, group, k, strides, pads, h, wd", CASES)
@pytest.mark.parametrize("bias", [True, False])
def test_paths_match_direct_loop(c, m, group, k, strides, pads, h, wd, bias):
    x = data((2, c, h, wd), 1)
    w = data((m, c // group, k, k), 2)
    b = data((m,), 3) if bias else None
    got = run(x, w, b, group=group, strides=list(strides), pads=list(pads))
    np.testing.assert_allclose(got, direct(x, w, b, strides, pads, group), rtol=1e-5, atol=1e-5)


def shuffle_as_written(y, g):
    """ShuffleNet's channel shuffle as exporters write it: Reshape (N, g, C/g, H, W), Transpose (0, 2, 1,
    3, 4), Reshape (N, C, H, W)."""
    n, c, h, w = y.shape
    return y.reshape(n, g, c // g, h, w).transpose(0, 2, 1, 3, 4).reshape(n, c, h, w)


@pytest.mark.parametrize("c, m, g", [(8, 12, 4), (24, 112, 4), (136, 136, 4), (150, 60, 3)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("constant", [True, False])
def test_grouped_pointwise_writes_the_channel_shuffle(c, m, g, bias, constant):
    # C <= 128: one dense product, its columns in shuffle order; above: group blocks into strided columns
    x = data((2, c, 3, 4), 1)
    w = data((m, c // g, 1, 1), 2)
    b = data((m,), 3) if bias else None
    got = run(x, w, b, constant=constant, group=g, shuffle=g, shuffle_dims=[2, m, 3, 4], activation="Relu")
    want = shuffle_as_written(np.maximum(direct(x, w, b, group=g), 0), g)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_channel_shuffle_of_other_shapes_runs_as_written():
    # shuffle_dims that do not describe this product: the NCHW fused Conv's three ops as written, which
    # reshape to the dims when the sizes agree (batch 2 as dims (1, 2M, H, W))...
    x, w, b = data((2, 8, 3, 4), 1), data((12, 2, 1, 1), 2), data((12,), 3)
    got = run(x, w, b, group=4, shuffle=4, shuffle_dims=[1, 24, 3, 4])
    want = direct(x, w, b, group=4).reshape(1, 4, 6, 3, 4).transpose(0, 2, 1, 3, 4).reshape(1, 24, 3, 4)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # ... and raise the Reshape's error when they do not
    with pytest.raises(OnnxMiniError, match="channel shuffle"):
        run(x, w, b, group=4, shuffle=4, shuffle_dims=[1, 12, 3, 4])


@pytest.mark.parametrize("case", STRIPS)
def test_stride_one_conv_of_enough_channels_takes_strips(case):
    c, m, group, k, strides, pads, h, wd = CASES[case]
    w = data((m, c, k, k), 2)
    conv = channels_last.ConvNHWC(kernel_shape=[k, k], pads=list(pads), constants={1: w})
    y = conv(nhwc(data((1, c, h, wd), 1)), w)
    assert conv.algorithms == {(1, h, wd, c): "nhwc-strips"} and y.shape[3] == m


@pytest.mark.parametrize("case", VALID_ROWS)
def test_short_maps_sum_the_kernel_rows_reading_x_only(case):
    # each output row's einsum over the kernel rows that read X (the others read padding alone), with a
    # constant finite W; an infinite W (test_infinities_...) sums every row, its 0 * inf = NaN kept
    c, m, group, k, strides, pads, h, wd = CASES[case]
    w = data((m, 1, k, k), 2)
    conv = channels_last.ConvNHWC(kernel_shape=[k, k], pads=list(pads), group=group, constants={1: w})
    assert conv.plan(((1, h, wd, c), w.shape))[8] is not None
    w_inf = w.copy()
    w_inf[0, 0, 0, 0] = np.inf
    assert channels_last.ConvNHWC(kernel_shape=[k, k], pads=list(pads), group=group,
                                  constants={1: w_inf}).plan(((1, h, wd, c), w.shape))[8] is None


def test_wide_strided_depthwise_takes_phases_and_narrow_takes_windows():
    # the two strided depthwise algorithms split at DW_WINDOWS_MAX_WIDTH output columns
    assert channels_last.DW_WINDOWS_MAX_WIDTH < 20 and channels_last.DW_WINDOWS_MAX_WIDTH >= 6


@pytest.mark.parametrize("c, m, group, k, strides, pads", [c[:6] for c in CASES[:10:3] + CASES[14:16] + CASES[20:21]])
def test_float64_and_fed_weights(c, m, group, k, strides, pads):
    x = data((1, c, 9, 10), 4, np.float64)
    w = data((m, c // group, k, k), 5, np.float64)
    b = data((m,), 6, np.float64)
    exp = direct(x, w, b, strides, pads, group)
    for constant in (True, False):
        got = run(x, w, b, constant=constant, group=group, strides=list(strides), pads=list(pads))
        np.testing.assert_allclose(got, exp, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("activation, params, f", [
    ("Relu", (), lambda y: np.maximum(y, 0)),
    ("Clip", (0.0, 6.0), lambda y: np.clip(y, 0, 6)),
    ("HardSwish", (), lambda y: y * np.clip(y / 6 + 0.5, 0, 1)),
    ("LeakyRelu", (0.1,), lambda y: np.where(y < 0, 0.1 * y, y)),
])
@pytest.mark.parametrize("case", [0, 3, 5, 7, 14, 20])
def test_activation_and_residual(activation, params, f, case):
    c, m, group, k, strides, pads, h, wd = CASES[case]
    x = data((1, c, h, wd), 7) * 4
    w = data((m, c // group, k, k), 8)
    b = data((m,), 9)
    y0 = direct(x, w, b, strides, pads, group)
    z = data(y0.shape, 10)
    got = run(x, w, b, activation=activation, activation_params=params, group=group, strides=list(strides),
              pads=list(pads))
    np.testing.assert_allclose(got, f(y0), rtol=1e-5, atol=2e-4)     # sums up to ~100: float32 rounding
    got = run(x, w, b, z=z, activation=activation, activation_params=params, group=group,
              strides=list(strides), pads=list(pads))
    np.testing.assert_allclose(got, f(y0 + z), rtol=1e-5, atol=2e-4)


@pytest.mark.parametrize("case", [0, 1, 3, 14])
def test_products_finish_by_blocks_of_rows_as_whole(monkeypatch, case):
    # the products' B, residual and activation by blocks of output rows (thresholds.FINISH_BLOCK_BYTES):
    # one row a block gives the values of one block for the whole output, bit for bit
    from onnx_mini.ops.nn.conv import thresholds
    c, m, group, k, strides, pads, h, wd = CASES[case]
    x, w, b = data((2, c, h, wd), 21), data((m, c, k, k), 22), data((m,), 23)
    y0 = direct(x, w, b, strides, pads)
    z = data(y0.shape, 24)
    attrs = dict(activation="HardSwish", strides=list(strides), pads=list(pads))
    whole = run(x, w, b, z=z, **attrs)
    monkeypatch.setattr(thresholds, "FINISH_BLOCK_BYTES", 1)
    np.testing.assert_array_equal(run(x, w, b, z=z, **attrs), whole)
    y = y0 + z
    np.testing.assert_allclose(whole, y * np.clip(y / 6 + 0.5, 0, 1), rtol=1e-5, atol=2e-4)


@pytest.mark.parametrize("case", [0, 3, 5, 6, 7, 8, 12, 13, *STRIPS, *VALID_ROWS])
def test_infinities_and_nan_propagate_as_the_sums_do(case):
    c, m, group, k, strides, pads, h, wd = CASES[case]
    x = data((1, c, h, wd), 11)
    x[0, 0, 1, 1] = np.inf
    x[0, c - 1, h - 2, wd - 1] = np.nan
    x[0, 0, h - 1, 0] = -np.inf
    w = data((m, c // group, k, k), 12)
    got = run(x, w, None, group=group, strides=list(strides), pads=list(pads))
    exp = direct(x, w, None, strides, pads, group)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(exp))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(exp))
    fin = np.isfinite(exp)
    np.testing.assert_allclose(got[fin], exp[fin], rtol=1e-5, atol=1e-5)
    # an infinite weight times the zero padding is NaN, as the spec's zero-padded sum says
    w[0, 0, 0, 0] = np.inf
    x = data((1, c, h, wd), 13)
    got = run(x, w, None, group=group, strides=list(strides), pads=list(pads))
    exp = direct(x, w, None, strides, pads, group)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(exp))


def test_inputs_untouched_and_result_owned():
    c, m, group, k, strides, pads, h, wd = CASES[5]
    x, w, b = data((1, c, h, wd), 14), data((m, 1, k, k), 15), data((m,), 16)
    xl = nhwc(x)
    copies = [a.copy() for a in (xl, w, b)]
    for a in (xl, w, b):
        a.flags.writeable = False
    fn = fused_conv_nhwc(group=group, kernel_shape=[k, k], pads=list(pads), activation="Relu", _constants={1: w, 2: b})
    y = fn(xl, w, b)
    for a, c0 in zip((xl, w, b), copies):
        np.testing.assert_array_equal(a, c0)
    assert y.flags.writeable and not np.may_share_memory(y, xl)


def test_other_types_run_the_nchw_conv():
    c, m, group, k, strides, pads, h, wd = CASES[3]
    x = data((1, c, h, wd), 17).astype(np.float16)
    w = data((m, c, k, k), 18).astype(np.float16)
    got = run(x, w, None, strides=list(strides), pads=list(pads))
    exp = direct(x.astype(np.float32), w.astype(np.float32), None, strides, pads)
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), exp, rtol=2e-2, atol=5e-2)


def test_bad_shapes_raise_the_conv_errors():
    w = data((8, 4, 3, 3), 19)
    fn = fused_conv_nhwc(kernel_shape=[3, 3], _constants={1: w})
    with pytest.raises(OnnxMiniError):
        fn(data((1, 5, 5, 3), 20), w)             # 3 channels, W wants 4
    with pytest.raises((OnnxMiniError, ValueError)):
        fn(data((1, 5, 4), 21), w)                # not 4-D
