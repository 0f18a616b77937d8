"""The paths a U-Net's stride-1 3x3 Convs take: strips in both modes where M is small against kw*C;
elsewhere (strips off here: `no_strips`) shifted windows or im2col depending on whether the run
splits its products over onnx_mini's pool (blas.splitting: a busy machine), im2col's bands, and the
fallback of Winograd for non-finite values in either mode. Values against a direct sum written here
from Conv's definition: y[m, i, j] = b[m] + sum over c and taps (t0, t1) of
x[c, i + t0 - pad, j + t1 - pad] * w[m, c, t0, t1], positions outside X counting as absent."""
from __future__ import annotations

import numpy as np
import pytest

from onnx_mini import blas
from onnx_mini.ops.nn import conv
from onnx_mini.ops.nn.conv import thresholds

RNG = np.random.default_rng(22)


def ints(shape, lo=-2, hi=2):
    """Small integers: every float32 sum here is exact, so the algorithms must agree bit for bit."""
    return RNG.integers(lo, hi + 1, size=shape).astype(np.float32)


def direct(x, w, b=None, pad=1):
    """The definition above, stride 1, the same padding on every side, in float64."""
    n, c, h, wd = x.shape
    m, _, kh, kw = w.shape
    xp = np.zeros((n, c, h + 2 * pad, wd + 2 * pad))
    xp[:, :, pad:pad + h, pad:pad + wd] = x
    oh, ow = h + 2 * pad - kh + 1, wd + 2 * pad - kw + 1
    y = np.zeros((n, m, oh, ow))
    for t0 in range(kh):
        for t1 in range(kw):
            window = xp[:, :, t0:t0 + oh, t1:t1 + ow]
            y += np.einsum("nchw,mc->nmhw", window, w[:, :, t0, t1].astype(np.float64))
    if b is not None:
        y += b.reshape(1, m, 1, 1)
    return y


def select_3x3(c, m, side, **kw):
    return conv.select((1, c, side, side), (m, c, 3, 3), np.float32, group=1, kernel=[3, 3], strides=[1, 1],
                       dilations=[1, 1], begin=[1, 1], end=[1, 1], out=[side, side], **kw)


@pytest.fixture
def mode(monkeypatch):
    """set(True/False): the runs split their products (as blas.splitting() says on a busy machine)."""
    state = {"split": False}
    monkeypatch.setattr(blas, "splitting", lambda: state["split"])
    return lambda split: state.__setitem__("split", split)


@pytest.fixture
def no_strips(monkeypatch):
    """Strips taken for no Conv of their own choice (the choices that remain are under test)."""
    monkeypatch.setattr(thresholds, "STRIPS_MIN_PIXELS", 1 << 62)


@pytest.mark.parametrize("c,m,side", [(32, 16, 128), (64, 32, 64), (128, 64, 32), (64, 64, 224)])
def test_select_takes_strips_in_both_modes(c, m, side):
    """The U-Net's decoder Convs (fewer outputs than inputs) and a VGG-sized one go strips whether the
    run splits its products or not (thresholds.STRIPS_*)."""
    assert select_3x3(c, m, side) == select_3x3(c, m, side, splitting=True) == "strips"


@pytest.mark.parametrize("c,m,side", [(32, 16, 128), (64, 32, 64), (128, 64, 32), (64, 64, 224)])
def test_select_leaves_shifted_to_runs_that_do_not_split(monkeypatch, no_strips, c, m, side):
    """The U-Net's decoder Convs (fewer outputs than inputs) and a VGG-sized one go shifted in a run
    that leaves its products whole, im2col in one that splits them (thresholds.SHIFT_WHEN_SPLITTING);
    a forced shifted stays shifted."""
    assert select_3x3(c, m, side) == "shifted"
    assert select_3x3(c, m, side, splitting=True) == "im2col"
    assert select_3x3(c, m, side, splitting=True, forced="shifted") == "shifted"
    monkeypatch.setattr(thresholds, "SHIFT_WHEN_SPLITTING", True)
    assert select_3x3(c, m, side, splitting=True) == "shifted"


def test_select_splitting_changes_nothing_else():
    """Pointwise, Winograd-sized and small Convs choose alike in both modes."""
    for c, m, side in ((16, 16, 128), (256, 256, 14), (4, 4, 8)):
        assert select_3x3(c, m, side, splitting=True) == select_3x3(c, m, side)
    args = dict(group=1, kernel=[1, 1], strides=[1, 1], dilations=[1, 1], begin=[0, 0], end=[0, 0], out=[64, 64])
    assert conv.select((1, 32, 64, 64), (16, 32, 1, 1), np.float32, splitting=True, **args) == "pointwise"


@pytest.mark.parametrize("bands", [False, True])
def test_one_convolution_follows_the_mode_of_each_run(mode, monkeypatch, no_strips, bands):
    """One Conv (its shape's plan kept) called in runs of either mode takes shifted or im2col (in bands
    when its columns are large: forced here by small thresholds), with its bias and a ReLU epilogue,
    and gives the same exact values each time."""
    if bands:
        monkeypatch.setattr(thresholds, "IM2COL_BANDS_MIN_BYTES", 1)
        monkeypatch.setattr(thresholds, "IM2COL_BAND_BYTES", 4096)
    x, w, b = ints((1, 8, 30, 30)), ints((4, 8, 3, 3)), ints((4,))
    given = x.copy()
    want = np.maximum(direct(x, w, b), 0).astype(np.float32)
    convolution = conv.Convolution(pads=[1, 1, 1, 1], constants={1: w, 2: b})
    relu = lambda y, i0, i1: np.maximum(y, np.float32(0), out=y)      # noqa: E731
    for split, name in ((False, "shifted"), (True, "im2col"), (False, "shifted"), (True, "im2col")):
        mode(split)
        got = convolution(x, w, b, epilogue=relu)
        assert convolution.algorithms[x.shape] == name
        assert got.dtype == np.float32 and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(x, given)         # the caller's X untouched


@pytest.mark.parametrize("split,fallback", [(False, "shifted"), (True, "im2col")])
def test_winograd_falls_back_by_mode_for_infinities(mode, monkeypatch, split, fallback):
    """A Conv Winograd would take (its thresholds lowered here) whose X holds an infinity goes to the
    direct form of the run's mode, which gives the definition's +inf (all values positive: no NaN; 9
    outputs per channel read it)."""
    monkeypatch.setattr(thresholds, "WINOGRAD_MIN_CHANNELS", 1)
    monkeypatch.setattr(thresholds, "WINOGRAD_MIN_PIXELS", 1)
    monkeypatch.setattr(thresholds, "SHIFT_MIN_PIXELS", 1)
    mode(split)
    x, w = ints((1, 6, 12, 12), lo=1, hi=2), ints((3, 6, 3, 3), lo=1, hi=2)
    convolution = conv.Convolution(pads=[1, 1, 1, 1], constants={1: w})
    np.testing.assert_array_equal(convolution(x, w), direct(x, w).astype(np.float32))
    assert convolution.algorithms[x.shape] == "winograd"
    x[0, 2, 5, 7] = np.inf
    want = direct(x, w).astype(np.float32)
    assert np.isinf(want).sum() == 9 * 3 and not np.isnan(want).any()
    np.testing.assert_array_equal(convolution(x, w), want)
    assert convolution.algorithms[x.shape] == fallback
