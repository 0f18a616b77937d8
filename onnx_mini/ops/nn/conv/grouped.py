"""Grouped products: W (G, Mg, K) times X (N, G, K, P), the core of pointwise and im2col (and of
ConvTranspose and DeformConv, which import it as conv.grouped_matmul)."""
from __future__ import annotations

import numpy as np

from .... import blas, memory
from . import thresholds


def grouped_matmul(w, x, out=None):
    """w (G, Mg, K) times x (N, G, K, P) -> (N, G, Mg, P) (into `out` when given): one stacked matmul
    for small groups, else one 2-D BLAS call per (image, group) (see thresholds.STACKED_MAX_MACS)."""
    n, g = x.shape[:2]
    if g > 1 and w.shape[1] * w.shape[2] * x.shape[3] <= thresholds.STACKED_MAX_MACS:
        return np.matmul(w, x, out=out)
    y = memory.empty((n, g, w.shape[1], x.shape[3]), dtype=np.result_type(w, x)) if out is None else out
    for i in range(n):
        for j in range(g):
            blas.matmul(w[j], x[i, j], out=y[i, j])
    return y

