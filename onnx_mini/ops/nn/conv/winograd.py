"""Winograd F(2x2, 3x3) for the wide 3x3 convolutions (stride 1, no dilation, one group).

Each 2x2 tile of the output comes from a 4x4 tile of the padded input (tiles overlap by 2):
Y = A' [ (G g G') * (B' d B) ] A with the classic matrices of Lavin & Gray (2016):

    B' = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1],  G = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1],
    A' = [1 1 1 0; 0 1 -1 -1].

Summed over the input channels, the element-wise product of the 16 transformed positions becomes 16
matrix products (M, C) x (C, tiles): 16 * M * C * tiles = 4 M C pixels multiply-adds instead of im2col's
9 M C pixels. The transforms are additions of strided views (B' on the rows of the whole padded
image, then on the columns straight into the 16 product operands; A' likewise into the output), so
for a layer with C, M >= 256 they cost far less than the products they save. Measured here (batch 1,
against im2col; 2 threads; thresholds.WINOGRAD_*): 256->256 at 56x56 20.9 -> 16.3 ms, 512->512 at 28x28 19.7 -> 13.9,
512->512 at 14x14 5.9 -> 4.7, 256->256 at 14x14 1.7 -> 1.5; narrower or smaller layers lose (64->64
at 56x56 1.7 -> 2.3 ms, 512->512 at 7x7 2.0 -> 2.3). The transformed weights G g G' (16, M, C) are
computed in float64, once per constant W (run.Convolution keeps them with the model, made on the
first run that takes Winograd): 16/9 of those weights' size stays resident between runs (VGG-19:
~100 MB). Rounding: the transforms add up to 4 terms with factors 1 and 1/2 (exact on small
integers); results differ from im2col's by a few float32 ulps of the layer's magnitude.
A zero times an infinity is NaN and the transforms mix values of both signs, so X and W must be
finite (the caller checks: run.py).
"""
from __future__ import annotations

import numpy as np

from .... import blas, memory

_G = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])


def applies(dtype, group: int, kernel, strides, dil) -> bool:
    """Whether Winograd F(2x2, 3x3) can compute this Conv (compute type float32/float64)."""
    return (len(kernel) == 2 and kernel[0] == 3 and kernel[1] == 3 and group == 1
            and all(s == 1 for s in strides) and all(d == 1 for d in dil)
            and dtype in (np.float32, np.float64))


def weights(w: np.ndarray, dtype) -> np.ndarray:
    """G g G' for a finite W (M, C, 3, 3) -> (16, M, C) in `dtype` (the compute type: float32 for a
    float16 W), computed in float64."""
    w64 = w.astype(np.float64)
    u = np.einsum("ka,mcab,lb->klmc", _G, w64, _G, optimize=True)
    return np.ascontiguousarray(u.reshape(16, *w.shape[:2]), dtype=dtype)


def conv(x: np.ndarray, u: np.ndarray, begin, out) -> np.ndarray:
    """One image x (1, C, H, W), transformed weights u (16, M, C), the padding before each axis and
    the output size (oh, ow) -> (1, M, oh, ow) (a view, cropped when oh or ow is odd)."""
    c, h, w = x.shape[1:]
    m = u.shape[1]
    oh, ow = out
    th, tw = -(-oh // 2), -(-ow // 2)
    dt = x.dtype
    xp = memory.zeros((c, 2 * th + 2, 2 * tw + 2), dt)
    rows, cols = min(h, 2 * th + 2 - begin[0]), min(w, 2 * tw + 2 - begin[1])
    xp[:, begin[0]:begin[0] + rows, begin[1]:begin[1] + cols] = x[0, :, :rows, :cols]
    # B' on the rows (tile row i reads padded rows 2i .. 2i+3), then on the columns into V
    r = [xp[:, a:a + 2 * th - 1:2] for a in range(4)]                       # (C, th, wp)
    t = memory.empty((4, c, th, xp.shape[2]), dt)
    np.subtract(r[0], r[2], out=t[0])
    np.add(r[1], r[2], out=t[1])
    np.subtract(r[2], r[1], out=t[2])
    np.subtract(r[1], r[3], out=t[3])
    v = memory.empty((16, c, th, tw), dt)
    for k in range(4):
        s = [t[k][:, :, b:b + 2 * tw - 1:2] for b in range(4)]               # (C, th, tw)
        np.subtract(s[0], s[2], out=v[4 * k])
        np.add(s[1], s[2], out=v[4 * k + 1])
        np.subtract(s[2], s[1], out=v[4 * k + 2])
        np.subtract(s[1], s[3], out=v[4 * k + 3])
    v = v.reshape(16, c, th * tw)
    p = memory.empty((16, m, th * tw), dt)
    for k in range(16):
        blas.matmul(u[k], v[k], out=p[k])
    # A' on the rows (in place: row 0 <- p0 + p1 + p2, row 3 <- p1 - p2 - p3), then on the columns
    p = p.reshape(4, 4, m, th, tw)
    p[0] += p[1]
    p[0] += p[2]
    np.subtract(p[1], p[3], out=p[3])
    p[3] -= p[2]
    y = memory.empty((m, th, 2, tw, 2), dt)
    for a, z in ((0, p[0]), (1, p[3])):
        y0, y1 = y[:, :, a, :, 0], y[:, :, a, :, 1]
        np.add(z[0], z[1], out=y0)
        y0 += z[2]
        np.subtract(z[1], z[2], out=y1)
        y1 -= z[3]
    return y.reshape(1, m, 2 * th, 2 * tw)[:, :, :oh, :ow]
