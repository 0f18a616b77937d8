"""ConvNHWC's depthwise paths padding their input part by part (ops/nn/conv/channels_last.py's
_read_rows, from thresholds.DW_READ_ROWS_MIN_BYTES): the padded buffer _read_rows writes equals X
zero-padded (and split into column phases) by hand; a depthwise Conv run in many one-row parts, in
reverse order, on scratch that starts as NaN, gives the very sums of the zero-then-copy path and the
Conv's definition (helpers.conv2d_direct)."""
from __future__ import annotations

import numpy as np
import pytest

from onnx_mini import parallel
from onnx_mini.ops.fused import fused_conv_nhwc
from onnx_mini.ops.nn.conv import channels_last, thresholds

from helpers import conv2d_direct

CASES = [   # (C, k, strides, pads (top, left, bottom, right), H, W)
    (6, 3, (1, 1), (1, 1, 1, 1), 9, 7),          # stride 1, "same" padding
    (5, 3, (1, 1), (0, 2, 2, 0), 6, 8),          # stride 1, asymmetric pads
    (4, 3, (1, 1), (0, 0, 0, 0), 7, 7),          # no padding (the windows read X's own rows: no copy)
    (5, 3, (2, 2), (1, 1, 1, 1), 9, 11),         # strided, narrow output: the 6-d windows
    (4, 3, (2, 2), (1, 1, 1, 1), 11, 40),        # strided, wide: column phases
    (4, 3, (2, 2), (0, 0, 1, 1), 12, 40),        # ... padding at the end only (MobileNet's TF-style /2)
    (3, 5, (2, 3), (2, 0, 1, 2), 12, 50),        # 5x5, strides 2/3: three phases
    (4, 2, (1, 3), (0, 1, 0, 1), 6, 50),         # 2x2 /3: phase 2 holds no kernel column
    (3, 1, (3, 2), (0, 0, 0, 0), 10, 40),        # 1x1 /3 rows: rows between the windows never read
]


def nhwc(a):
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1))


def data(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def run(x, w, b, strides, pads):
    fn = fused_conv_nhwc(kernel_shape=list(w.shape[2:]), group=w.shape[0], strides=list(strides),
                         pads=[pads[0], pads[1], pads[2], pads[3]], _constants={1: w, 2: b})
    return fn(nhwc(x), w, b).transpose(0, 3, 1, 2)


@pytest.fixture
def one_row_parts(monkeypatch):
    """Every part one output row, run last to first on this thread, and np.empty giving NaN: a part
    reading a row it has not written itself reads NaN."""
    def split(work, n_items, min_items):
        for r in reversed(range(n_items)):
            work(r, r + 1)
    real_empty = np.empty

    def nan_empty(shape, dtype=float, *args, **kwargs):
        a = real_empty(shape, dtype, *args, **kwargs)
        if np.dtype(dtype).kind == "f":
            a.fill(np.nan)
        return a
    monkeypatch.setattr(channels_last.parallel, "split", split)
    monkeypatch.setattr(np, "empty", nan_empty)


@pytest.mark.parametrize("c, k, strides, pads, h, wd", CASES)
def test_parts_padding_their_rows_give_the_same_sums(monkeypatch, one_row_parts, c, k, strides, pads, h, wd):
    x = data((2, c, h, wd), 1)
    x[0, 0, 0, 0] = np.inf          # a border value: its windows are inf or NaN as the sums make them
    w, b = data((c, 1, k, k), 2), data((c,), 3)
    monkeypatch.setattr(thresholds, "DW_READ_ROWS_MIN_BYTES", 0)
    by_rows = run(x, w, b, strides, pads)
    monkeypatch.setattr(thresholds, "DW_READ_ROWS_MIN_BYTES", 1 << 40)
    whole = run(x, w, b, strides, pads)
    np.testing.assert_array_equal(by_rows, whole)
    expected = conv2d_direct(x, w, b, strides, pads, group=c)
    assert np.array_equal(np.isfinite(by_rows), np.isfinite(expected))
    finite = np.isfinite(expected)
    np.testing.assert_allclose(by_rows[finite], expected[finite], rtol=1e-5, atol=1e-5)
    assert not finite[0, 0].all() and finite[1].all()


def padded_by_hand(x, k, strides, pads, out):
    """X (N, H, W, C) zero-padded, the rows and columns the windows read; split into column phases
    (N, rows, s, columns, C) when the plan stores them so (phase p, column j: padded column j*s + p)."""
    n, h, wd, c = x.shape
    xp = np.zeros((n, h + pads[0] + pads[2], wd + pads[1] + pads[3] + 2 * strides[1] + k, c), np.float32)
    xp[:, pads[0]:pads[0] + h, pads[1]:pads[1] + wd] = x
    rows = (out[0] - 1) * strides[0] + k
    return xp[:, :rows], [xp[:, :rows, p::strides[1]] for p in range(strides[1])]


@pytest.mark.parametrize("c, k, strides, pads, h, wd", CASES)
def test_read_rows_writes_x_zero_padded(c, k, strides, pads, h, wd):
    x = nhwc(data((1, c, h, wd), 4))
    conv = channels_last.ConvNHWC(group=c, kernel_shape=[k, k], strides=list(strides), pads=list(pads))
    kind, _, out, need, dst, src, phases, pieces, _ = conv.plan((x.shape, (c, 1, k, k)))
    assert kind == "depthwise"
    whole, by_phase = padded_by_hand(x, k, strides, pads, out)
    phased = strides[1] > 1 and out[1] > channels_last.DW_WINDOWS_MAX_WIDTH
    if phased:
        cols = phases[0]
        xp = np.full((1, need[0], strides[1], cols, c), np.nan, np.float32)
        expected = np.stack([p[:, :, :cols] for p in by_phase], axis=2)
    else:
        xp = np.full((1, *need, c), np.nan, np.float32)
        expected = whole[:, :, :need[1]]
    # in two overlapping calls, as two parts write them
    half = need[0] // 2
    channels_last._read_rows(xp, x, dst[0], src[0], half, need[0] + 3, pieces)
    channels_last._read_rows(xp, x, dst[0], src[0], 0, half + 1, pieces)
    np.testing.assert_array_equal(xp, expected)
