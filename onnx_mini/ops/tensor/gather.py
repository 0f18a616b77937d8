"""Indexing operators: Gather, GatherND, GatherElements, and the index checks Scatter* share."""
from __future__ import annotations

import math

import numpy as np

from ... import parallel
from ...errors import InvalidValueError
from ...registry import kernel
from .._common import SHAPES_KEPT, normalize_axis


# -- GatherElements ------------------------------------------------------------------------------

# Elements per block: temporaries of this size stay in cache, which beats whole-array passes.
_BLOCK = 65536
_SMALL = 4096


@kernel("GatherElements", since=(11, 13))
def gather_elements_11(*, axis=0, _constants=None):
    # Small inputs: one fancy-indexing call with the other axes' index grids, built (and the shapes
    # checked) once per shape pair; numpy counts negatives from the end and raises outside [-n, n-1].
    grids: dict[tuple, tuple] = {}

    def gather_elements(data, indices):
        if 0 < indices.size <= _SMALL:
            key = (data.shape, indices.shape, indices.dtype)
            grid = grids.get(key)
            if grid is None and len(grids) < 64:
                grid = grids[key] = _index_grids(data, indices, axis)
            if grid is not None:
                try:
                    return data[grid[0] + (indices,) + grid[1]]
                except IndexError:
                    pass      # reported by the general path with the offending value
        return _gather_elements(data, indices, axis)

    fixed = (_constants or {}).get(1)
    if fixed is None or not 0 < fixed.size <= _SMALL:
        return gather_elements
    # Constant indices: their flat positions in a contiguous data of each shape, checked and made
    # once, so that a run is one take (a [2, 3] gather: ~0.6 against ~1.9 us here).
    positions: dict[tuple, np.ndarray | None] = {}
    small: dict[tuple, np.ndarray] = {}   # the valid positions of data shapes up to _SMALL elements

    def gather_fixed(data, indices):
        if indices is fixed:
            # ravel() is data's elements in C order whatever its layout (a copy when not contiguous):
            # the layout is read only for data large enough that such a copy would cost more than
            # the general path; small shapes take one lookup (~0.05-0.15 us a call less on a [2, 3] gather)
            flat = small.get(data.shape)
            if flat is not None:
                return data.ravel()[flat]
            flat = positions.get(data.shape)
            if flat is None and data.shape not in positions and len(positions) < SHAPES_KEPT:
                flat = positions[data.shape] = _flat_positions(data, fixed, axis)
                if flat is not None and data.size <= _SMALL:
                    small[data.shape] = flat
            if flat is not None and (data.size <= _SMALL or data.flags.c_contiguous):
                return data.ravel()[flat]
        return gather_elements(data, indices)
    return gather_fixed


def _flat_positions(data: np.ndarray, indices: np.ndarray, axis: int) -> np.ndarray | None:
    """Where each output element sits in data.ravel() (C order, whatever the layout), or None when the shapes
    or an index are invalid (the general path reports it, naming the offending value)."""
    try:
        a = elements_axis(data, indices, axis)
    except InvalidValueError:
        return None
    n = data.shape[a]
    if indices.min() < -n or indices.max() >= n:
        return None
    coords = list(np.indices(indices.shape, sparse=True))
    coords[a] = np.where(indices < 0, indices + n, indices)
    flat = np.ravel_multi_index(tuple(np.broadcast_arrays(*coords)), data.shape)
    flat.flags.writeable = False
    return flat


def _index_grids(data: np.ndarray, indices: np.ndarray, axis: int) -> tuple[tuple, tuple]:
    """(grids before the axis, grids after it): aranges over indices' extent on the other axes."""
    a = elements_axis(data, indices, axis)
    r = indices.ndim
    grids = [np.arange(indices.shape[d]).reshape([-1 if k == d else 1 for k in range(r)]) for d in range(r)]
    return tuple(grids[:a]), tuple(grids[a + 1:])


def elements_axis(data: np.ndarray, indices: np.ndarray, axis: int) -> int:
    """The checks GatherElements and ScatterElements share (ranks, index type, indices no larger than
    data off the axis); returns the normalised axis."""
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
    return a


def _gather_elements(data: np.ndarray, indices: np.ndarray, axis: int) -> np.ndarray:
    r = data.ndim
    a = elements_axis(data, indices, axis)
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


# -- index checks shared by Gather, GatherND, Scatter* -------------------------------------------

def out_of_bounds(indices: np.ndarray, size: int, where: str) -> InvalidValueError:
    """The error for indices holding a value outside [-size, size-1], naming the first such value."""
    flat = indices.reshape(-1)
    bad = flat[(flat < -size) | (flat >= size)]
    value = int(bad[0]) if bad.size else int(flat[0])
    return InvalidValueError(f"index {value} is out of bounds for {where} of size {size} "
                             f"(accepted: [{-size}, {size - 1}])")


def check_index_type(indices: np.ndarray, allowed=(np.int32, np.int64)) -> None:
    if indices.dtype not in allowed:
        names = " or ".join(np.dtype(t).name for t in allowed)
        raise InvalidValueError(f"indices must be {names}, got {indices.dtype}")


def normalize_indices(indices: np.ndarray, size: int, where: str) -> np.ndarray:
    """int64 indices in [0, size-1]: negatives count from the end; anything outside [-size, size-1]
    is an InvalidValueError naming the value."""
    idx = indices.astype(np.int64, copy=False)
    if idx.size:
        lo, hi = int(idx.min()), int(idx.max())
        if lo < -size or hi >= size:
            raise out_of_bounds(idx, size, where)
        if lo < 0:
            idx = np.where(idx < 0, idx + size, idx)
    return idx


def nd_linear_indices(indices: np.ndarray, dims: tuple) -> np.ndarray:
    """indices (..., k) of k-tuples into a block of shape dims (len k) -> int64 row-major linear
    positions (...), negatives counted from the end of their dimension, bounds checked."""
    check_index_type(indices, (np.int64,))
    k = len(dims)
    if indices.size == 0:
        return np.zeros(indices.shape[:-1], dtype=np.int64)
    size = np.array(dims, dtype=np.int64)
    bad = (indices < -size) | (indices >= size)
    if bad.any():
        pos = np.argwhere(bad)[0]
        j = int(pos[-1])
        raise InvalidValueError(f"index {int(indices[tuple(pos)])} at position {pos[:-1].tolist()} is out of "
                                f"bounds for dimension {j} of size {dims[j]} "
                                f"(accepted: [{-dims[j]}, {dims[j] - 1}])")
    idx = np.where(indices < 0, indices + size, indices) if indices.min() < 0 else indices
    if k == 1:
        return idx[..., 0].astype(np.int64, copy=False)
    strides = np.ones(k, dtype=np.int64)
    for j in range(k - 2, -1, -1):
        strides[j] = strides[j + 1] * dims[j + 1]
    return idx @ strides


_INDEX_DTYPES = frozenset({np.dtype(np.int32), np.dtype(np.int64)})


# -- Gather --------------------------------------------------------------------------------------

@kernel("Gather", since=(1, 11, 13))
def gather_1(*, axis=0):
    def gather(data, indices):
        r = data.ndim
        if r < 1:
            raise InvalidValueError("data must have rank >= 1")
        if indices.dtype not in _INDEX_DTYPES:      # a set of dtypes: ~0.7 us less than the general check
            check_index_type(indices)
        a = axis if 0 <= axis < r else normalize_axis(axis, r)
        try:
            # take() counts negatives from the end and raises on anything outside [-n, n-1].
            out = data.take(indices, axis=a)
        except IndexError:
            raise out_of_bounds(indices, data.shape[a], f"axis {a}") from None
        return out if out.__class__ is np.ndarray else np.asarray(out, dtype=data.dtype)
    return gather


# -- GatherND ------------------------------------------------------------------------------------

@kernel("GatherND", since=11)
def gather_nd_11():
    return gather_nd_12(batch_dims=0)


@kernel("GatherND", since=(12, 13))
def gather_nd_12(*, batch_dims=0):
    b = int(batch_dims)
    if b < 0:
        raise ValueError(f"batch_dims must be >= 0, got {b}")

    def gather_nd(data, indices):
        r, q = data.ndim, indices.ndim
        if r < 1 or q < 1:
            raise InvalidValueError(f"data and indices must have rank >= 1, got ranks {r} and {q}")
        if b >= min(q, r):
            raise InvalidValueError(f"batch_dims {b} must be smaller than the ranks of data ({r}) and "
                                    f"indices ({q})")
        if indices.shape[:b] != data.shape[:b]:
            raise InvalidValueError(f"the first {b} (batch) dimensions of indices {list(indices.shape)} and "
                                    f"data {list(data.shape)} differ")
        k = indices.shape[-1]
        if k > r - b:
            raise InvalidValueError(f"indices.shape[-1] = {k} exceeds the rank of data minus batch_dims "
                                    f"({r} - {b})")
        dims, rest = data.shape[b:b + k], data.shape[b + k:]
        lin = nd_linear_indices(indices, dims)               # shape batch + middle
        if b:
            n_batch, block = math.prod(data.shape[:b]), math.prod(dims)
            offsets = np.arange(n_batch, dtype=np.int64).reshape(data.shape[:b] + (1,) * (q - 1 - b))
            lin = lin + offsets * block
        out = data.reshape((math.prod(data.shape[:b + k]),) + rest).take(lin, axis=0)
        return out if out.__class__ is np.ndarray else np.asarray(out, dtype=data.dtype)
    return gather_nd
