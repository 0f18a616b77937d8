"""The channels-last Conv's epilogue (ops/fused.py's ConvNHWC: the bias, a residual Z and the activation
applied to each depthwise part's rows right after its einsum, on that part's thread) and the fused
Clip's one-pass form: the same operations on the same values as the unfused steps, so the results
are equal value for value; batches, thread parts, every path, NaN and infinities."""
from __future__ import annotations

import numpy as np
import pytest

from onnx_mini.errors import OnnxMiniError
from onnx_mini.ops import fused
from onnx_mini.ops.fused import _activation, fused_conv_nhwc
from onnx_mini.ops.nn.conv import channels_last, thresholds

from helpers import conv2d_direct

PATHS = [   # (C, M, group, k, strides, pads, H, W)
    (8, 12, 1, 1, (1, 1), (0, 0, 0, 0), 9, 10),         # pointwise
    (16, 8, 1, 3, (2, 2), (1, 1, 1, 1), 11, 13),        # im2col
    (6, 6, 6, 3, (1, 1), (1, 1, 1, 1), 17, 9),          # depthwise stride 1
    (5, 5, 5, 3, (2, 2), (1, 1, 1, 1), 19, 11),         # depthwise strided, narrow
    (4, 4, 4, 3, (2, 2), (1, 1, 1, 1), 21, 40),         # depthwise strided, wide: column phases
    (4, 6, 2, 3, (1, 1), (1, 1, 1, 1), 7, 7),           # grouped: NCHW fallback
]


def nhwc(a):
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1))


def data(shape, seed, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def two_pass_clip(y, lo, hi):
    """Clip's definition: min(max(y, lo), hi)."""
    return np.minimum(np.maximum(y, lo), hi)


@pytest.fixture
def small_parts(monkeypatch):
    # every depthwise layer split into row parts (on the pool's threads where there are two)
    monkeypatch.setattr(thresholds, "DW_MIN_PART_MACS", 1)


@pytest.mark.parametrize("case", range(len(PATHS)))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fused_equals_the_unfused_steps(case, dtype, small_parts):
    c, m, group, k, strides, pads, h, wd = PATHS[case]
    attrs = dict(group=group, kernel_shape=[k, k], strides=list(strides), pads=list(pads))
    x = nhwc(data((3, c, h, wd), 1, dtype) * 4)
    w, b = data((m, c // group, k, k), 2, dtype), data((m,), 3, dtype)
    x[0, 1, 2, 0] = np.nan
    x[2, 3, 1, -1] = np.inf
    plain = fused_conv_nhwc(_constants={1: w, 2: b}, **attrs)
    y0 = plain(x, w, b)
    z = data(y0.shape, 4, dtype)
    z[1, 0, 0, 0] = -np.inf
    for constant in (True, False):
        consts = {1: w, 2: b} if constant else {}
        clip = fused_conv_nhwc(_constants=consts, activation="Clip", activation_params=(0.0, 6.0), **attrs)
        np.testing.assert_array_equal(clip(x, w, b), two_pass_clip(y0, 0, 6))
        np.testing.assert_array_equal(clip(x, w, b, z), two_pass_clip(y0 + z, 0, 6))
        relu = fused_conv_nhwc(_constants=consts, activation="Relu", **attrs)
        np.testing.assert_array_equal(relu(x, w, b, z), np.maximum(y0 + z, 0))
        add = fused_conv_nhwc(_constants=consts, **attrs)
        np.testing.assert_array_equal(add(x, w, b, z), y0 + z)
    # against the definition too (the unfused result is the existing path's)
    exp = conv2d_direct(x.transpose(0, 3, 1, 2), w, b, strides, pads, group).transpose(0, 2, 3, 1)
    fin = np.isfinite(exp)
    np.testing.assert_array_equal(np.isnan(y0), np.isnan(exp))
    np.testing.assert_allclose(y0[fin], exp[fin], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("case", [0, 2, 4])
def test_broadcast_residual_takes_the_general_path(case):
    c, m, group, k, strides, pads, h, wd = PATHS[case]
    attrs = dict(group=group, kernel_shape=[k, k], strides=list(strides), pads=list(pads))
    x = nhwc(data((2, c, h, wd), 5))
    w, b = data((m, c // group, k, k), 6), data((m,), 7)
    y0 = fused_conv_nhwc(_constants={1: w, 2: b}, **attrs)(x, w, b)
    fn = fused_conv_nhwc(_constants={1: w, 2: b}, activation="Clip", activation_params=(-1.0, 1.0), **attrs)
    for z in (data((m,), 8), data((1, 1, 1, m), 9), data((1,) + y0.shape[1:], 10)):
        np.testing.assert_array_equal(fn(x, w, b, z), two_pass_clip(y0 + z, -1, 1))
    with pytest.raises(OnnxMiniError):
        fn(x, w, b, data(y0.shape, 11, np.float64))         # Z of another type: the fused Add's error
    z = data(y0.shape, 12)
    z_copy = z.copy()
    fn(x, w, b, z)
    np.testing.assert_array_equal(z, z_copy)                # the residual is read, never written


def test_output_shape_names_the_channels_last_paths_only():
    w = data((6, 2, 3, 3), 13)
    conv = channels_last.ConvNHWC(group=2, kernel_shape=[3, 3], pads=[1, 1, 1, 1], constants={1: w})
    assert conv.output_shape(data((1, 5, 5, 4), 14), w) is None             # grouped: NCHW fallback
    w = data((6, 6, 3, 3), 15)
    conv = channels_last.ConvNHWC(kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2], constants={1: w})
    assert conv.output_shape(data((2, 9, 7, 6), 16), w) == (2, 5, 4, 6)
    assert conv.output_shape(data((2, 9, 7, 6), 16).astype(np.float16), w.astype(np.float16)) is None


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("lo, hi", [(0.0, 6.0), (6.0, 0.0), (-np.inf, np.inf), (np.nan, 1.0), (0.0, np.nan),
                                    (-1e300, 1e300)])
def test_one_pass_clip_is_clips_definition(dtype, lo, hi):
    n = fused.CLIP_ONE_PASS_MIN + 3
    y = data((n,), 17, dtype) * 8
    y[:6] = [np.nan, np.inf, -np.inf, -0.0, 0.0, 6.0]
    with np.errstate(over="ignore"):
        exp = two_pass_clip(y, dtype(lo), dtype(hi))
    got = y.copy()
    _activation("Clip", (lo, hi))(got)
    np.testing.assert_array_equal(got, exp)              # NaN where the definition has NaN, values equal
    small = y[:64].copy()                                # below the threshold: the two passes
    with np.errstate(over="ignore"):                     # (they cast a bound past float32's range)
        _activation("Clip", (lo, hi))(small)
    np.testing.assert_array_equal(small, exp[:64])


def test_clip_of_integers_and_one_bound():
    y = np.arange(-20000, 20000, dtype=np.int32)
    got = y.copy()
    _activation("Clip", (-5, 7))(got)
    np.testing.assert_array_equal(got, np.minimum(np.maximum(y, -5), 7))
    f = data((40000,), 18)
    got = f.copy()
    _activation("Clip", (None, 0.5))(got)
    np.testing.assert_array_equal(got, np.minimum(f, np.float32(0.5)))
