"""Scatter operators: Scatter (deprecated alias), ScatterElements, ScatterND, TensorScatter.

Every kernel copies `data` first and writes into the copy through flat linear positions; the
reductions apply every update, duplicates included (ufunc.at), in float32 for low-precision floats.
"""
from __future__ import annotations

import math

import numpy as np

from ...errors import InvalidValueError
from ...registry import kernel
from .._common import UPCAST, normalize_axis
from .gather import elements_axis, nd_linear_indices, normalize_indices

_REDUCTIONS = {"none": None, "add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _reduction(reduction, allowed: tuple) -> np.ufunc | None:
    name = reduction.decode() if isinstance(reduction, bytes) else str(reduction)
    if name not in allowed:
        raise ValueError(f"reduction must be one of {', '.join(allowed)}, got {name!r}")
    return _REDUCTIONS[name]


def _apply(data: np.ndarray, positions: np.ndarray, updates: np.ndarray, ufunc) -> np.ndarray:
    """A copy of data (viewed as (N, *rest)) with rows `positions` (int64, any shape) replaced by,
    or reduced with, `updates` (positions.shape + rest)."""
    rest = data.shape[1:]
    pos = positions.reshape(-1)
    upd = updates.reshape((pos.size,) + rest)
    if ufunc is None:
        out = data.copy()
        out[pos] = upd
        return out
    if data.dtype == object:
        raise InvalidValueError("reductions are not defined for string tensors")
    dt = data.dtype
    low = dt in UPCAST
    out = data.astype(np.float32) if low else data.copy()
    upd = upd.astype(np.float32) if low else upd
    if math.prod(rest) >= 8 and not _has_duplicates(pos):
        # Whole rows at distinct positions: one vectorised update (ufunc.at loops row by row).
        out[pos] = ufunc(out[pos], upd)
    else:
        ufunc.at(out, pos, upd)   # every update in order, duplicates included
    return out.astype(dt) if low else out


def _has_duplicates(pos: np.ndarray) -> bool:
    s = np.sort(pos)
    return bool((s[1:] == s[:-1]).any())


# -- Scatter / ScatterElements -------------------------------------------------------------------

def _scatter_elements(data, indices, updates, axis: int, ufunc) -> np.ndarray:
    if indices.shape != updates.shape:
        raise InvalidValueError(f"indices {list(indices.shape)} and updates {list(updates.shape)} must have "
                                "the same shape")
    if updates.dtype != data.dtype:
        raise InvalidValueError(f"updates ({updates.dtype}) must have the type of data ({data.dtype})")
    a = elements_axis(data, indices, axis)
    r = data.ndim
    if indices.size == 0:
        return data.copy()
    idx = normalize_indices(indices, data.shape[a], f"axis {a}")
    # Row-major linear position of each target element: idx on the axis, its own position elsewhere.
    strides = [math.prod(data.shape[d + 1:]) for d in range(r)]
    lin = idx * strides[a]
    for d in range(r):
        if d != a:
            shape = [1] * r
            shape[d] = indices.shape[d]
            lin = lin + (np.arange(indices.shape[d], dtype=np.int64) * strides[d]).reshape(shape)
    return _apply(data.reshape(-1), lin, updates, ufunc).reshape(data.shape)


def _reductions(version: int) -> tuple:
    """The reduction attribute's values at a version of ScatterElements / ScatterND (16+)."""
    return ("none", "add", "mul", "max", "min") if version >= 18 else ("none", "add", "mul")


@kernel("Scatter", since=(9, 11))
def scatter_9(*, axis=0):
    return scatter_elements_16(axis=axis, reduction="none", _version=16)


@kernel("ScatterElements", since=(11, 13))
def scatter_elements_11(*, axis=0):
    return scatter_elements_16(axis=axis, reduction="none", _version=16)


@kernel("ScatterElements", since=(16, 18))
def scatter_elements_16(*, axis=0, reduction="none", _version):
    ufunc = _reduction(reduction, _reductions(_version))
    return lambda data, indices, updates: _scatter_elements(data, indices, updates, axis, ufunc)


# -- ScatterND -----------------------------------------------------------------------------------

def _scatter_nd(data, indices, updates, ufunc) -> np.ndarray:
    r, q = data.ndim, indices.ndim
    if r < 1 or q < 1:
        raise InvalidValueError(f"data and indices must have rank >= 1, got ranks {r} and {q}")
    if updates.dtype != data.dtype:
        raise InvalidValueError(f"updates ({updates.dtype}) must have the type of data ({data.dtype})")
    k = indices.shape[-1]
    if k > r:
        raise InvalidValueError(f"indices.shape[-1] = {k} exceeds the rank of data ({r})")
    expected = indices.shape[:-1] + data.shape[k:]
    if updates.shape != expected:
        raise InvalidValueError(f"updates must have shape indices.shape[:-1] + data.shape[{k}:] = "
                                f"{list(expected)}, got {list(updates.shape)}")
    lin = nd_linear_indices(indices, data.shape[:k])
    rows = data.reshape((math.prod(data.shape[:k]),) + data.shape[k:])
    return _apply(rows, lin, updates, ufunc).reshape(data.shape)


@kernel("ScatterND", since=(11, 13))
def scatter_nd_11():
    return scatter_nd_16(reduction="none", _version=16)


@kernel("ScatterND", since=(16, 18))
def scatter_nd_16(*, reduction="none", _version):
    ufunc = _reduction(reduction, _reductions(_version))
    return lambda data, indices, updates: _scatter_nd(data, indices, updates, ufunc)


# -- TensorScatter -------------------------------------------------------------------------------

@kernel("TensorScatter", since=24)
def tensor_scatter_24(*, axis=-2, mode="linear"):
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if mode not in ("linear", "circular"):
        raise ValueError(f"mode must be 'linear' or 'circular', got {mode!r}")
    circular = mode == "circular"

    def tensor_scatter(past_cache, update, write_indices=None):
        r = past_cache.ndim
        if r < 2:
            raise InvalidValueError(f"past_cache must have rank >= 2, got rank {r}")
        a = normalize_axis(axis, r)
        if a == 0:
            raise InvalidValueError("axis cannot be 0 (the batch dimension)")
        if update.dtype != past_cache.dtype:
            raise InvalidValueError(f"update ({update.dtype}) must have the type of past_cache "
                                    f"({past_cache.dtype})")
        shape, ushape = past_cache.shape, update.shape
        if len(ushape) != r or any(u != p for d, (u, p) in enumerate(zip(ushape, shape)) if d != a):
            raise InvalidValueError(f"update {list(ushape)} must match past_cache {list(shape)} except on "
                                    f"axis {a}")
        batch, max_len, seq_len = shape[0], shape[a], ushape[a]
        if seq_len > max_len:
            raise InvalidValueError(f"update's sequence length {seq_len} exceeds the cache's {max_len}")
        if write_indices is None:
            starts = np.zeros(batch, dtype=np.int64)
        else:
            if write_indices.shape != (batch,):
                raise InvalidValueError(f"write_indices must have shape [{batch}], got "
                                        f"{list(write_indices.shape)}")
            starts = write_indices.astype(np.int64, copy=False)
        out = past_cache.copy()
        if seq_len == 0 or batch == 0:
            return out
        if not circular:
            bad = (starts < 0) | (starts + seq_len > max_len)
            if bad.any():
                b = int(np.argmax(bad))
                raise InvalidValueError(f"write index {int(starts[b])} of batch {b} with {seq_len} new entries "
                                        f"does not fit the cache's {max_len} (linear mode)")
        pos = starts[:, None] + np.arange(seq_len, dtype=np.int64)       # (batch, seq_len)
        if circular:
            pos %= max_len
        # With the batch and sequence axes first, out[b, pos[b, j]] = update[b, j] for every b, j.
        view = np.moveaxis(out, a, 1)
        view[np.arange(batch)[:, None], pos] = np.moveaxis(update, a, 1)
        return out

    return tensor_scatter
