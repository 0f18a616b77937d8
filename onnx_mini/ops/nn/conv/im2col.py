"""im2col: the windows of the padded input copied once into columns (C*k, out pixels), then one
matmul per group. Applies to every Conv.

The geometry (the padded buffer, where X goes in it, the window view's shape and strides) depends on
the input shape only: `Columns` computes it once per shape (run.py keeps it with the shape's plan), so
a small Conv's call is a zeroed buffer, one copy of X into it, one copy of the windows, the product
(measured under load, one call: the VAD's [1,128,3] -> [1,64,2] 41 -> 26 us, [1,64,1] -> [1,128,1]
27 -> 13 us; a [1,16,48,16] 3x3 Conv 527 -> 419 us, its 6-D transposing copy gone).

A 1-D Conv of one group with few output positions (`Rows`) takes its columns as rows of the
channels-last padded input instead: with W's taps ordered (M, k, C) (made once for a constant W),
each window of k*C values is a contiguous run of that input, so there is no column copy (only X's
into the padded buffer), and each output position is one matrix-vector product (OpenBLAS's sgemm
packs the whole W on every call, which a product with 1-3 columns cannot repay:
thresholds.ROWS_MAX_OUTPUTS)."""
from __future__ import annotations

import math

import numpy as np

from .... import blas
from ..._common import UPCAST
from . import thresholds
from .grouped import grouped_matmul


class Columns:
    """The im2col geometry of one image (1, C, *spatial) of X's shape and type: the window view is made
    directly in the columns' order (group, Cg, *kernel, *out) over the C-contiguous padded image, so
    its reshape to (1, G, Cg*k, pixels) is the one copy."""
    __slots__ = ("padded", "inner", "pads", "view_shape", "view_strides", "cols_shape", "dtype")

    def __init__(self, x_shape, dtype, group, kernel, strides, dil, begin, end, out):
        c = x_shape[1]
        sizes = [s + b + e for s, b, e in zip(x_shape[2:], begin, end)]
        self.dtype = np.dtype(np.float32) if np.dtype(dtype) in UPCAST else np.dtype(dtype)
        self.padded = (1, c, *sizes)
        self.pads = any(begin) or any(end)
        self.inner = (slice(None), slice(None), *(slice(b, b + s) for b, s in zip(begin, x_shape[2:])))
        spatial = [math.prod(sizes[d + 1:]) for d in range(len(sizes))]    # element strides of the axes
        channel = math.prod(sizes)
        cg = c // group
        self.view_shape = (group, cg, *kernel, *out)
        item = self.dtype.itemsize
        self.view_strides = tuple(item * s for s in (cg * channel, channel, *(s * d for s, d in zip(spatial, dil)),
                                                     *(s * t for s, t in zip(spatial, strides))))
        self.cols_shape = (1, group, cg * math.prod(kernel), math.prod(out))

    def columns(self, x):
        """x (1, C, *spatial) in the compute type -> its columns (1, G, Cg*k, pixels)."""
        if self.pads:
            xp = np.zeros(self.padded, dtype=self.dtype)
            xp[self.inner] = x
        else:
            xp = x if x.flags.c_contiguous else np.ascontiguousarray(x)
        view = np.ndarray(self.view_shape, self.dtype, xp, 0, self.view_strides)
        return view.reshape(self.cols_shape)      # a copy (a view only when the windows are X itself)


def conv(x, w, group, columns: Columns, out):
    """One image x (1, C, *spatial) convolved with W (M, Cg, *kernel) -> (1, M, *out)."""
    m = w.shape[0]
    if group == 1:     # the one product grouped_matmul would make, without its bookkeeping
        return blas.matmul(w.reshape(m, -1), columns.columns(x)[0, 0]).reshape(1, m, *out)
    return grouped_matmul(w.reshape(group, m // group, -1), columns.columns(x)).reshape(1, m, *out)


class Rows:
    """The geometry of a 1-D Conv's one image computed by rows (module doc): the channels-last padded
    input (L + pads, C), where X goes in it, and each output position's window as a run of it."""
    __slots__ = ("padded", "inner", "pads", "step", "width", "n", "dtype")

    def __init__(self, x_shape, dtype, kernel, strides, begin, end, out):
        c, length = x_shape[1], x_shape[2]
        self.dtype = np.dtype(np.float32) if np.dtype(dtype) in UPCAST else np.dtype(dtype)
        self.padded = (length + begin[0] + end[0], c)
        self.inner = slice(begin[0], begin[0] + length)
        self.pads = bool(begin[0] or end[0])
        self.step, self.width, self.n = strides[0] * c, kernel[0] * c, out[0]

    @staticmethod
    def applies(x_shape, group, kernel, dilations, out) -> bool:
        return (len(x_shape) == 3 and x_shape[0] == 1 and group == 1 and dilations[0] == 1
                and 0 < out[0] <= thresholds.ROWS_MAX_OUTPUTS and kernel[0] > 0)


def rows_weights(w):
    """W (M, C, k) -> (M, k*C): the taps in the order of a channels-last window."""
    return np.ascontiguousarray(w.transpose(0, 2, 1)).reshape(w.shape[0], -1)


def conv_rows(x, wr, rows: Rows, b=None):
    """One image x (1, C, L) in the compute type, wr = rows_weights(W), B or None -> (1, M, out), a
    transposed view of the (out, M) products (channels-last: the next Conv by rows copies no transpose).
    The padding is multiplied as written (skipping its taps slices W: slower matrix-vector calls,
    measured 16 -> 22 us on the VAD's 129 -> 128 channel layer, and inf * 0 must stay NaN)."""
    if rows.pads:
        xp = np.zeros(rows.padded, dtype=rows.dtype)
        xp[rows.inner] = x[0].T
    else:
        xp = np.ascontiguousarray(x[0].T)       # a view when X is such a transposed output
    flat = xp.reshape(-1)
    step, width = rows.step, rows.width
    y = np.empty((rows.n, wr.shape[0]), dtype=rows.dtype)
    for j in range(rows.n):     # one BLAS matrix-vector call per output position (at most a few)
        np.dot(wr, flat[j * step:j * step + width], out=y[j])
    if b is not None:
        y += b
    return y.T[None]
