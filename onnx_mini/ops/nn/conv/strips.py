"""strips: a 2-D Conv of stride 1 and one group as one product, from the kernel's column shifts of
the input alone.

The kw column shifts of the padded input, each cut to the output's width, are laid one after the
other as "strips" S (C*kw + 1, Hp*Wo), Hp the padded rows read: S[c*kw + dj, y*Wo + x] =
Xp[c, y, x + dj*dw], the last row ones. Output row i of kernel row di reads padded row i + di*dh, so
kernel row di's taps over all output rows read one contiguous run of S, di*dh*Wo columns in. W's
kernel rows are stacked as Ws (kh*M, C*kw + 1): one product Z = Ws @ S gives every kernel row's
partial sums, and Y = sum over di of Z[di*M:(di+1)*M, di*dh*Wo:di*dh*Wo + Ho*Wo] (kh-1 additions
over the output). The bias is summed by the product itself: B is kernel row 0's last column (no
pass over the output for it).

Against im2col it copies the input kw rather than kh*kw times (and makes no padded copy: the strips
are filled from X, their borders zeroed; small strips are kept per thread with their borders and
ones, so that a call copies X's values alone), and against shifted it makes one product where shifted
makes kh*kw, with kh-1 additions where shifted makes kh*kw-1, its output contiguous and uncropped.
But Z is kh times the output, and each kernel row's product runs over all Hp rows (Hp/Ho times
the multiply-adds: 1.12 at 16x16, 1.02 at 128x128): where M is large against kw*C (a first layer's
3 -> 64 channels) the columns im2col copies are the smaller cost (thresholds.STRIPS_MAX_OUTPUT_SHARE),
and on small images the fixed cost of the fill is (thresholds.STRIPS_MIN_PIXELS). Rounding: each
output sums its kernel rows' partial sums after the product, in another order than im2col's one
sum (float results within the tests' tolerances; integer sums exact below 2**24, as im2col's).
"""
from __future__ import annotations

import threading

import numpy as np

from .... import blas, memory
from . import thresholds


def pays(pixels: int, m: int, kw: int, c: int, splitting: bool) -> bool:
    """Whether strips beat the other forms for this one-group stride-1 Conv (select's choice, and the
    channels-last kernel's): enough output pixels, and M small against kw*C (Z is kh times Y; lower in
    a run that splits its products). thresholds.STRIPS_*."""
    share = thresholds.STRIPS_MAX_OUTPUT_SHARE_SPLITTING if splitting else thresholds.STRIPS_MAX_OUTPUT_SHARE
    return pixels >= thresholds.STRIPS_MIN_PIXELS and m <= share * kw * c


def applies(group: int, kernel, strides) -> bool:
    """Whether strips can compute this Conv: 2-D, one group, stride 1."""
    return len(kernel) == 2 and group == 1 and all(s == 1 for s in strides)


def weights(w: np.ndarray, b, dtype) -> np.ndarray:
    """W (M, C, kh, kw) and B (M,) or None -> Ws (kh*M, C*kw + 1) in `dtype`: kernel row di's taps in
    rows di*M.., the last column B for kernel row 0 (zeros for the others, and all zeros without B)."""
    m, c, kh, kw = w.shape
    ws = np.zeros((kh, m, c * kw + 1), dtype=dtype)
    ws[:, :, :-1] = w.transpose(2, 0, 1, 3).reshape(kh, m, c * kw)
    if b is not None:
        ws[0, :, -1] = b
    return ws.reshape(kh * m, c * kw + 1)


class Strips:
    """The strips geometry of one image shape (1, C, H, W): which rows and columns of X each strip reads."""
    __slots__ = ("c", "kw", "kh", "dh", "ho", "wo", "top", "h", "cols", "dtype", "kept")

    def __init__(self, x_shape, dtype, kernel, dil, begin, out):
        c, h, w = x_shape[1:]
        self.c, self.h = c, h
        self.kh, self.kw = kernel
        self.dh = dil[0]
        self.ho, self.wo = out
        self.top = begin[0]
        self.dtype = dtype
        self.cols = []      # per column shift dj: output columns [lo, hi) read X's columns from lo + shift
        for dj in range(self.kw):
            shift = dj * dil[1] - begin[1]
            lo = min(self.wo, max(0, -shift))
            hi = max(lo, min(self.wo, w - shift))
            self.cols.append((lo, hi, shift))
        # small strips are kept per thread, their zeros and ones written once (thresholds.STRIPS_KEPT_MAX_BYTES)
        size = (self.c * self.kw + 1) * (self.ho + (self.kh - 1) * self.dh) * self.wo * dtype.itemsize
        self.kept = threading.local() if size <= thresholds.STRIPS_KEPT_MAX_BYTES else None

    def _rows(self):
        """(padded rows read, the first and past the last holding X's rows 0..e-a-1)."""
        hp = self.ho + (self.kh - 1) * self.dh
        a = min(hp, self.top)
        return hp, a, max(a, min(hp, self.top + self.h))

    def strips(self, x):
        """The strips S (C*kw + 1, Hp*Wo) of x (1, C, H, W) in the compute type, the last row ones: this
        thread's kept S with X's values copied in (its padding and ones from when it was made), or a
        recycled buffer filled whole."""
        hp, a, e = self._rows()
        shape = (self.c * self.kw + 1, hp * self.wo)
        if self.kept is None:
            s = memory.empty(shape, dtype=self.dtype)
            self._padding(s, hp, a, e)
        else:
            s = getattr(self.kept, "s", None)
            if s is None:                       # its own memory (not a recycled buffer's), for good
                s = self.kept.s = np.empty(shape, dtype=self.dtype)
                self._padding(s, hp, a, e)
        v = s[:-1].reshape(self.c, self.kw, hp, self.wo)
        rows = x[0, :, :e - a]
        for dj, (lo, hi, shift) in enumerate(self.cols):
            if hi > lo:
                v[:, dj, a:e, lo:hi] = rows[:, :, lo + shift:hi + shift]
        return s

    def _padding(self, s, hp, a, e):
        """The parts of S that X's values never reach: zeros, and the row of ones."""
        v = s[:-1].reshape(self.c, self.kw, hp, self.wo)
        v[:, :, :a] = 0
        v[:, :, e:] = 0
        for dj, (lo, hi, _) in enumerate(self.cols):
            v[:, dj, a:e, :lo] = 0
            v[:, dj, a:e, hi:] = 0
        s[-1] = 1


def conv(x, ws, geometry: Strips):
    """One image x (1, C, H, W) in the compute type, Ws from weights() -> Y (1, M, Ho, Wo), the bias
    included. One product for the image, which blas.matmul splits over the pool in a run that splits
    its products (a band of output rows per thread, each with its own strips, product and sums,
    measured 1.08x slower on the U-Net's layers under load)."""
    g = geometry
    m = ws.shape[0] // g.kh
    n, step = g.ho * g.wo, g.dh * g.wo          # output pixels; Z's columns between two kernel rows
    z = blas.matmul(ws, g.strips(x))
    if g.kh == 1:
        return z.reshape(1, m, g.ho, g.wo)
    y = np.add(z[:m, :n], z[m:2 * m, step:step + n])
    for di in range(2, g.kh):
        y += z[di * m:(di + 1) * m, di * step:di * step + n]
    return y.reshape(1, m, g.ho, g.wo)
