"""Depthwise 2-D convolution of narrow images as products with banded (Toeplitz) matrices.

With one output channel per input channel there is no channel sum for BLAS, and the per-tap layouts
of depthwise.py make ~2 numpy passes over the image per tap. Here each kernel row di is one stacked
product per channel: the padded rows that kernel row reads, (out_h, Wp) with a stride of sh rows,
times a (Wp, out_w) matrix holding that row's taps on its bands, T[di, c][j*sw + dj*dw, j] =
W[c, 0, di, dj]; the kh products are summed. It does Wp/kw times the multiply-adds of the direct
sum, all of them in numpy's matmul loops, and writes Y in its own layout (no transposes): measured
here (3x3, pad 1, batch 1, interleaved, bias included, against the per-tap layout picked for the
shape): where that is channels-last, 512x14x14 0.39 -> 0.29 ms, 136x28x28 0.41 -> 0.34, 256x28x28
0.71 -> 0.62; with few channels, 32x28x28 0.22 -> 0.09, 32x56x56 /2 0.26 -> 0.17, 64x56x56 /2 0.35
-> 0.32; but where it is the einsum over the windows, 544x7x7 0.10 -> 0.15, 272x14x14 /2 0.09 ->
0.11 (1024x7x7 0.29 -> 0.25, 136x28x28 /2 0.17 -> 0.15); and wide outputs lose: 128x56x56 0.72 ->
1.67, so at most thresholds.BANDED_MAX_WIDTH output columns. Since the einsum's tiled weights are
made once per constant W it is the faster one at stride 1 until those weights grow large
(thresholds.DW_EINSUM_MAX_WEIGHT_BYTES), and banded stays for strided layers with few channels and
stride-1 layers with many (768x14x14 and up). The matrices take Wp/kw times W's memory per kernel row. A zero of T times an infinity is NaN,
so X and W must be finite (the caller checks: run.py).
"""
from __future__ import annotations

import numpy as np

from .... import memory
from .._common import read_extent, read_region


def applies(dtype, kernel, mult: int) -> bool:
    """Whether the banded products can compute a depthwise Conv (one input channel per group) with
    `mult` outputs per channel, in compute type `dtype`."""
    return len(kernel) == 2 and mult == 1 and dtype in (np.float32, np.float64)


def weights(w: np.ndarray, dtype, width: int, out_w: int, stride: int, dil: int) -> np.ndarray:
    """The banded matrices (kh, C, width, out_w) of a finite W (C, 1, kh, kw) in `dtype`, for padded
    rows of `width` columns (_common.read_extent)."""
    c, _, kh, kw = w.shape
    t = np.zeros((kh, c, width, out_w), dtype=dtype)
    j = np.arange(out_w)
    taps = w[:, 0].transpose(1, 0, 2).astype(dtype)          # (kh, C, kw)
    for dj in range(kw):
        t[:, :, j * stride + dj * dil, j] = taps[:, :, dj, None]
    return t


def conv(x: np.ndarray, t: np.ndarray, kernel, strides, dil, begin, out) -> np.ndarray:
    """x (N, C, H, W), banded matrices t from weights() -> Y (N, C, out_h, out_w), no bias."""
    n, c = x.shape[:2]
    kh = kernel[0]
    need = [read_extent(out[0], strides[0], kh, dil[0]), t.shape[2]]
    xp = memory.zeros((n, c, *need), dtype=x.dtype)
    dst, src = read_region(x.shape[2:], begin, need)
    if all(d.stop > d.start for d in dst):
        xp[(slice(None), slice(None), *dst)] = x[(slice(None), slice(None), *src)]
    span = (out[0] - 1) * strides[0] + 1
    y = tmp = None
    for di in range(kh):
        rows = xp[:, :, di * dil[0]:di * dil[0] + span:strides[0]]            # (N, C, out_h, width)
        if y is None:
            y = np.matmul(rows, t[di])
        else:
            tmp = np.matmul(rows, t[di], out=tmp)
            y += tmp
    return y
