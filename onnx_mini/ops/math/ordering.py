"""Sorting and cumulative operators: TopK (1, 10, 11, 24), CumSum (11, 14), CumProd (26).

TopK orders equal values by their index (the lower one first) and treats NaN as larger than every
number (numpy's sort order): NaN comes first with largest=1 and last with largest=0.
"""
from __future__ import annotations

import math

import numpy as np

from ...errors import InvalidValueError
from ...registry import kernel
from .._common import UPCAST, normalize_axis, upcast


def _stable_order(keys: np.ndarray, largest: bool) -> np.ndarray:
    """Permutation of the last axis that sorts keys ascending (largest=False) or descending
    (largest=True), equal keys keeping their index order either way."""
    if not largest:
        return np.argsort(keys, axis=-1, kind="stable")
    n = keys.shape[-1]
    # stable ascending sort of the reversed row, read backwards: descending, ties by increasing index
    order = np.argsort(keys[..., ::-1], axis=-1, kind="stable")[..., ::-1]
    return (n - 1) - order


def _select_small_k(keys: np.ndarray, k: int, largest: bool) -> np.ndarray:
    """Column indices (rows, k), in increasing index order, of each row's k best keys (no NaN): an
    O(n) partition finds the k-th best value, and of the values equal to it the lowest indices win."""
    n = keys.shape[-1]
    if largest:
        kth = np.partition(keys, n - k, axis=-1)[:, n - k:n - k + 1]
        sel = keys > kth
    else:
        kth = np.partition(keys, k - 1, axis=-1)[:, k - 1:k]
        sel = keys < kth
    eq = keys == kth
    need = k - sel.sum(axis=-1, keepdims=True)
    sel |= eq & (np.cumsum(eq, axis=-1) <= need)
    return np.nonzero(sel)[1].reshape(keys.shape[0], k)


def top_k(x: np.ndarray, k: int, axis: int, largest: bool, sorted_: bool):
    if x.ndim == 0:
        raise InvalidValueError("TopK needs an input of rank >= 1")
    a = normalize_axis(axis, x.ndim)
    n = x.shape[a]
    if not 0 <= k <= n:
        raise InvalidValueError(f"k = {k} is out of range for axis {axis} of size {n} (accepted: [0, {n}])")
    moved = np.moveaxis(x, a, -1)
    rows = moved.reshape(math.prod(moved.shape[:-1]), n)  # a view when the axis is already the last one
    m = rows.shape[0]
    keys = upcast(rows)
    if k == 0 or m == 0:
        idx = np.zeros((m, k), dtype=np.int64)
    elif n >= 256 and k * 8 <= n and not (keys.dtype.kind == "f" and np.isnan(keys).any()):
        idx = _select_small_k(keys, k, largest)
        if sorted_:
            idx = np.take_along_axis(idx, _stable_order(np.take_along_axis(keys, idx, -1), largest), -1)
    else:
        idx = _stable_order(keys, largest)[:, :k]
    flat = idx + (np.arange(m, dtype=np.int64) * n)[:, None]
    values = rows.ravel().take(flat)                 # ravel copies only a non-contiguous view
    shape = moved.shape[:-1] + (k,)
    return (np.moveaxis(values.reshape(shape), -1, a),
            np.moveaxis(idx.astype(np.int64, copy=False).reshape(shape), -1, a))


def _k_value(k: np.ndarray) -> int:
    if k.size != 1 or k.dtype.kind not in "iu":
        raise InvalidValueError(f"K must be a 1-D int64 tensor holding one value, got {k.dtype} of shape "
                                f"{list(k.shape)}")
    return int(k.reshape(()))


@kernel("TopK", since=1)
def top_k_1(*, k, axis=-1):
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    return lambda x: top_k(x, k, axis, True, True)


@kernel("TopK", since=10)
def top_k_10(*, axis=-1):
    return lambda x, k: top_k(x, _k_value(k), axis, True, True)


@kernel("TopK", since=(11, 24))
def top_k_11(*, axis=-1, largest=1, sorted=1):
    largest, sorted_ = bool(largest), bool(sorted)
    return lambda x, k: top_k(x, _k_value(k), axis, largest, sorted_)


# -- CumSum, CumProd -----------------------------------------------------------------------------

def _cumulative(fn, identity: int, exclusive: int, reverse: int):
    """The kernel of fn (np.cumsum / np.cumprod) with the exclusive/reverse attributes."""
    def run(x, axis):
        if axis.size != 1 or axis.dtype.kind not in "iu":
            raise InvalidValueError(f"axis must be a 0-D int32/int64 tensor, got {axis.dtype} of shape "
                                    f"{list(axis.shape)}")
        if x.ndim == 0:
            raise InvalidValueError("the input must have rank >= 1")
        a = normalize_axis(int(axis.reshape(())), x.ndim)
        dt = x.dtype
        src = x.astype(np.float32) if dt in UPCAST else x
        if reverse:
            src = np.flip(src, a)
        if exclusive:
            y = np.empty(src.shape, dtype=src.dtype)
            head = (slice(None),) * a
            y[head + (slice(0, 1),)] = identity
            fn(src[head + (slice(0, -1),)], axis=a, dtype=src.dtype, out=y[head + (slice(1, None),)])
        else:
            y = fn(src, axis=a, dtype=src.dtype)
        if reverse:
            y = np.flip(y, a)
        return y.astype(dt) if dt in UPCAST else y
    return run


@kernel("CumSum", since=(11, 14))
def cumsum_11(*, exclusive=0, reverse=0):
    return _cumulative(np.cumsum, 0, exclusive, reverse)


@kernel("CumProd", since=26)
def cumprod_26(*, exclusive=0, reverse=0):
    return _cumulative(np.cumprod, 1, exclusive, reverse)
