"""pointwise: 1x1 kernel, stride 1, no padding: one matmul of W (M, C) with X viewed as (N, C, H*W)
per group; an expanding one sums its bias in the product (bias_column)."""
from __future__ import annotations

import numpy as np

from .... import memory
from . import thresholds
from .grouped import grouped_matmul


def conv(x, wg, out, shuffle=False):
    """1x1, stride 1, no padding: W (G, Mg, Cg) times X viewed as (N, G, Cg, pixels); with shuffle,
    group a's rows go to channels a, a + G, ... (BLAS writes rows G rows apart as fast as adjacent ones)."""
    n = x.shape[0]
    g, mg, cg = wg.shape
    if not shuffle:
        return grouped_matmul(wg, x.reshape(n, g, cg, -1)).reshape(n, g * mg, *out)
    y = memory.empty((n, g * mg, *out), dtype=np.result_type(wg, x))
    grouped_matmul(wg, x.reshape(n, g, cg, -1), out=y.reshape(n, mg, g, -1).transpose(0, 2, 1, 3))
    return y


def shuffled(v: np.ndarray, g: int) -> np.ndarray:
    """v's last axis (M = g*k entries) in channel-shuffle order: entry b*g + a is entry a*k + b, as the
    Reshape (g, k) -> Transpose -> Reshape after a g-group Conv orders its channels (a new array)."""
    *lead, m = v.shape
    return np.ascontiguousarray(v.reshape(*lead, g, m // g).swapaxes(-1, -2)).reshape(v.shape)


def bias_column(w, b, group, shuffle):
    """W (M, Cg, 1, ...) with the bias as one more input column per group -> (G, Mg, Cg + 1), for X with
    a row of ones after each group (with_ones_row): the product then adds the bias itself, where a
    pass over the output would cost more than the copy of X (an expanding 1x1 Conv, see
    thresholds.BIAS_COLUMN_MIN_EXPANSION). b is in output order (shuffled when `shuffle`), the column
    in each group's row order. Made once for a constant W and B (run.Convolution), else per call."""
    m, cg = w.shape[:2]
    mg = m // group
    column = shuffled(b, mg) if shuffle else b      # back in group order: shuffling by M/G undoes it by G
    wb = np.empty((group, mg, cg + 1), dtype=np.result_type(w, b))
    wb[:, :, :cg] = w.reshape(group, mg, cg)
    wb[:, :, cg] = column.reshape(group, mg)
    return wb


def sums_bias(c: int, m: int, group: int) -> bool:
    """Whether a pointwise Conv of C -> M channels adds its bias through bias_column."""
    return (c + group) * thresholds.BIAS_COLUMN_MIN_EXPANSION <= m


def with_ones_row(x, group):
    """x (N, C, *spatial) -> (N, C + G, *spatial): each group's channels followed by a channel of ones."""
    n, c = x.shape[:2]
    xo = memory.empty((n, group, c // group + 1, *x.shape[2:]), dtype=x.dtype)
    np.copyto(xo[:, :, :-1], x.reshape(n, group, c // group, *x.shape[2:]))
    xo[:, :, -1] = 1
    return xo.reshape(n, c + group, *x.shape[2:])

