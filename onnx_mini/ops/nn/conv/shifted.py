"""shifted windows (stride 1, one group): the padded input is flattened row-major once, and each
kernel tap is one matmul of the tap's weights with a contiguous run of that flat image starting at
the tap's offset; the padded columns are cropped at the end (no per-tap copies, no im2col columns)."""
from __future__ import annotations

import math

import numpy as np

from .... import blas, memory
from .._common import pad_spatial


def conv(x, w, kernel, dil, begin, end, out):
    """Stride 1, group 1: sum over taps of W[:, :, tap] @ (a contiguous run of the flat padded input)."""
    n, c = x.shape[:2]
    m = w.shape[0]
    r = len(kernel)
    xp = pad_spatial(x, begin, end)
    padded = xp.shape[2:]
    inner = math.prod(padded[1:])                     # one step along the first spatial axis
    run = out[0] * inner                              # flat length of the output rows (uncropped)
    steps = [math.prod(padded[d + 1:]) for d in range(r)]
    offsets = [sum(t * dl * s for t, dl, s in zip(tap, dil, steps)) for tap in np.ndindex(*kernel)]
    flat = xp.reshape(n, c, -1)
    need = max(offsets) + run
    if need > flat.shape[2]:   # the last taps read past the end: append zeros (they land in cropped columns)
        flat = np.concatenate([flat, np.zeros((n, c, need - flat.shape[2]), dtype=flat.dtype)], axis=2)
    wt = np.ascontiguousarray(w.reshape(m, c, -1).transpose(2, 0, 1))      # (taps, M, C)
    acc = memory.empty((n, m, run), dtype=np.result_type(w, x))
    tmp = memory.empty((m, run), dtype=acc.dtype)
    for i in range(n):       # 2-D BLAS calls on (C, run) views with a leading dimension: no copies
        blas.matmul(wt[0], flat[i, :, offsets[0]:offsets[0] + run], out=acc[i])
        for t in range(1, len(offsets)):
            blas.matmul(wt[t], flat[i, :, offsets[t]:offsets[t] + run], out=tmp)
            acc[i] += tmp
    acc = acc.reshape(n, m, out[0], *padded[1:])
    return acc[(slice(None), slice(None), slice(None)) + tuple(slice(0, o) for o in out[1:])]
