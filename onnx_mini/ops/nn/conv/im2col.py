"""im2col: a strided window view of the padded input copied once into (C*k, out pixels), then one
matmul per group. Applies to every Conv."""
from __future__ import annotations

import math

import numpy as np

from .._common import pad_spatial, windows
from .grouped import grouped_matmul


def conv(x, w, group, kernel, strides, dil, begin, end, out):
    n, c = x.shape[:2]
    m, cg = w.shape[:2]
    r = len(kernel)
    view = windows(pad_spatial(x, begin, end), kernel, strides, dil, out)      # (N, C, *out, *k)
    # -> (N, G, Cg, *k, *out): the reduction axes (Cg, *k) before the pixels, then one matmul
    order = (0, 1, *range(2 + r, 2 + 2 * r), *range(2, 2 + r))
    cols = np.ascontiguousarray(view.transpose(order)).reshape(n, group, cg * math.prod(kernel), -1)
    return grouped_matmul(w.reshape(group, m // group, -1), cols).reshape(n, m, *out)

