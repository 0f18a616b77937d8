"""Indexing operators: GatherElements."""
from __future__ import annotations

import math

import numpy as np

from ... import parallel
from ...errors import InvalidValueError
from ...registry import kernel
from .._common import normalize_axis


# -- GatherElements ------------------------------------------------------------------------------

# Elements per block: temporaries of this size stay in cache, which beats whole-array passes.
_BLOCK = 65536
_SMALL = 4096


@kernel("GatherElements", since=(11, 13))
def gather_elements_11(*, axis=0):
    def gather_elements(data, indices):
        return _gather_elements(data, indices, axis)
    return gather_elements


def _gather_elements(data: np.ndarray, indices: np.ndarray, axis: int) -> np.ndarray:
    r = data.ndim
    if r < 1:
        raise InvalidValueError("data must have rank >= 1")
    if indices.ndim != r:
        raise InvalidValueError(f"indices must have the rank of data ({r}), got rank {indices.ndim}")
    if indices.dtype not in (np.int32, np.int64):
        raise InvalidValueError(f"indices must be int32 or int64, got {indices.dtype}")
    a = normalize_axis(axis, r)
    for d in range(r):
        if d != a and indices.shape[d] > data.shape[d]:
            raise InvalidValueError(f"indices dimension {d} is {indices.shape[d]}, larger than data's "
                                    f"{data.shape[d]} (shapes {list(indices.shape)} and {list(data.shape)})")
    if indices.size == 0:
        return np.empty(indices.shape, dtype=data.dtype)
    n = data.shape[a]
    # Where indices cover less than data on the other axes, gather from that part only.
    if any(indices.shape[d] != data.shape[d] for d in range(r) if d != a):
        data = data[tuple(slice(None) if d == a else slice(indices.shape[d]) for d in range(r))]
    if indices.size <= _SMALL:
        # Few elements: numpy's fancy indexing already counts negatives from the end and raises
        # on anything outside [-n, n-1], at a fraction of the fixed cost of the blocked path.
        try:
            return np.take_along_axis(data, indices, axis=a)
        except IndexError:
            pass  # reported below with the offending value
    lo, hi = int(indices.min()), int(indices.max())
    if lo < -n or hi >= n:
        bad = lo if lo < -n else hi
        raise InvalidValueError(f"index {bad} is out of bounds for axis {a} of size {n} "
                                f"(accepted: [{-n}, {n - 1}])")
    data = np.ascontiguousarray(data)
    # View data as (P, n, Q) and indices as (P, m, Q). The flat position of out[p, j, q] is
    # p*n*Q + idx'*Q + q with idx' = idx + n for negative idx. Work goes in blocks of about
    # _BLOCK elements so that the index temporaries stay in cache.
    m = indices.shape[a]
    P, Q = math.prod(data.shape[:a]), math.prod(data.shape[a + 1:])
    nq = n * Q
    idx = np.ascontiguousarray(indices, dtype=np.int64).reshape(P, m, Q)
    flat = data.reshape(-1)
    out = np.empty((P, m, Q), dtype=data.dtype)
    if m * Q <= _BLOCK:
        bp, bj = _BLOCK // (m * Q), m
    else:
        bp, bj = 1, max(1, _BLOCK // Q)
    bp = min(bp, P)
    base = (np.arange(bp, dtype=np.int64) * nq)[:, None, None] + np.arange(Q, dtype=np.int64)
    blocks = [(p0, j0) for p0 in range(0, P, bp) for j0 in range(0, m, bj)]

    def gather_blocks(first: int, stop: int) -> None:
        lin = np.empty((bp, min(bj, m), Q), dtype=np.int64)
        neg = np.empty_like(lin)
        for p0, j0 in blocks[first:stop]:
            p1, j1 = min(P, p0 + bp), min(m, j0 + bj)
            src = flat[p0 * nq: p1 * nq]            # the data rows of this block
            block, ln, ng = idx[p0:p1, j0:j1], lin[: p1 - p0, : j1 - j0], neg[: p1 - p0, : j1 - j0]
            np.right_shift(block, 63, out=ng)       # -1 where the index is negative, else 0
            np.bitwise_and(ng, nq, out=ng)          # ... becomes the +n*Q correction
            if Q == 1:
                np.add(block, ng, out=ln)
            else:
                np.multiply(block, Q, out=ln)
                np.add(ln, ng, out=ln)
            np.add(ln, base[: p1 - p0], out=ln)
            np.take(src, ln, out=out[p0:p1, j0:j1])

    parallel.split(gather_blocks, len(blocks), min_items=4)
    return out.reshape(indices.shape)
