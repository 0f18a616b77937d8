"""im2col: the windows of the padded input copied once into columns (C*k, out pixels), then one
matmul per group. Applies to every Conv.

The geometry (the padded buffer, where X goes in it, the window view's shape and strides) depends on
the input shape only: `Columns` computes it once per shape (run.py keeps it with the shape's plan), so
a small Conv's call is a zeroed buffer, one copy of X into it, one copy of the windows, the product
(measured under load, one call: the VAD's [1,128,3] -> [1,64,2] 41 -> 26 us, [1,64,1] -> [1,128,1]
27 -> 13 us; a [1,16,48,16] 3x3 Conv 527 -> 419 us, its 6-D transposing copy gone)."""
from __future__ import annotations

import math

import numpy as np

from .... import blas
from ..._common import UPCAST
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
