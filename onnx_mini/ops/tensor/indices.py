"""Index-producing and index-driven operators: NonZero, OneHot, Unique, ReverseSequence."""
from __future__ import annotations

import numpy as np

from ...errors import InvalidValueError
from ...registry import kernel
from .._common import UPCAST, check_shape, normalize_axis


# -- NonZero -------------------------------------------------------------------------------------

@kernel("NonZero", since=(9, 13))
def nonzero_9():
    def nonzero(x):
        if x.ndim == 0:  # the spec's shape for a scalar: (0, N), N = 1 when it is non-zero
            return np.zeros((0, int(bool(x.reshape(-1)[0]))), dtype=np.int64)
        if x.dtype in UPCAST:
            x = x.astype(np.float32)
        flat = np.flatnonzero(x)
        out = np.empty(check_shape((x.ndim, flat.size), np.int64, "NonZero output"), dtype=np.int64)
        out[0] = flat
        # Row-major coordinates from the flat positions, last dimension first.
        for d in range(x.ndim - 1, 0, -1):
            np.divmod(out[0], x.shape[d], out=(out[0], out[d]))
        return out
    return nonzero


# -- OneHot --------------------------------------------------------------------------------------

def _one_hot(indices, depth, values, axis: int, negative: bool) -> np.ndarray:
    if depth.size != 1:
        raise InvalidValueError(f"depth must hold exactly one value, got shape {list(depth.shape)}")
    if values.size != 2:
        raise InvalidValueError(f"values must hold exactly two elements [off, on], got shape "
                                f"{list(values.shape)}")
    d = depth.reshape(-1)[0]
    if d.dtype.kind not in "iub":
        d = float(d)
        if not np.isfinite(d):
            raise InvalidValueError(f"depth must be finite, got {d}")
    d = int(d)  # non-integer depths are cast to int64 (truncation)
    if d < 0:
        raise InvalidValueError(f"depth must be >= 0, got {d}")
    r = indices.ndim
    if not -r - 1 <= axis <= r:
        raise InvalidValueError(f"axis {axis} is out of range for indices of rank {r} "
                                f"(accepted: [{-r - 1}, {r}])")
    a = axis + r + 1 if axis < 0 else axis
    idx = indices
    if idx.dtype.kind == "i":
        idx = idx.astype(np.int64, copy=False)
    elif idx.dtype.kind != "u":  # non-integer indices are cast to int64 (truncation toward zero);
        # NaN, inf and huge values land outside [-depth, depth) (all-off rows), never wrap around
        f = idx.astype(np.float64)
        idx = np.clip(np.where(np.isfinite(f), np.trunc(f), d), -d - 1, d).astype(np.int64)
    if negative:  # 11+: [-depth, -1] counts from the end; anything else outside [0, depth) is all-off
        idx = np.where(idx < 0, idx + d, idx)
    shape = indices.shape[:a] + (1,) + indices.shape[a:]
    check_shape(indices.shape[:a] + (d,) + indices.shape[a:], values.dtype)
    positions = np.arange(d).reshape((d,) + (1,) * (r - a))
    hot = idx.reshape(shape) == positions                # bool, the output's shape
    return values.reshape(-1).take(hot.view(np.uint8))


@kernel("OneHot", since=(9, 11, 28))
def one_hot_9(*, axis=-1, _version):
    negative = _version >= 11       # negative indices count from the end from 11 on
    return lambda indices, depth, values: _one_hot(indices, depth, values, axis, negative=negative)


# -- Unique --------------------------------------------------------------------------------------

def _group_starts(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Stable sort order of the rows of keys (n, m) (lexicographic; NaN equal to NaN and last),
    and a bool per sorted row: True where it starts a new group of equal rows."""
    n, m = keys.shape
    if m == 0:
        order = np.arange(n)
        new = np.zeros(n, dtype=bool)
    else:
        order = np.argsort(keys[:, 0], kind="stable") if m == 1 else np.lexsort(keys.T[::-1])
        s = keys[order]
        diff = s[1:] != s[:-1]
        if s.dtype.kind in "fc":
            diff &= ~(np.isnan(s[1:]) & np.isnan(s[:-1]))
        new = np.empty(n, dtype=bool)
        new[1:] = diff.any(axis=1)
    if n:
        new[0] = True
    return order, new


def _unique(x: np.ndarray, axis, is_sorted: bool, n_outputs: int):
    if axis is None:
        rows, a = x.reshape(-1, 1), None
    else:
        a = normalize_axis(axis, x.ndim)
        rows = np.moveaxis(x, a, 0).reshape(x.shape[a], x.size // x.shape[a] if x.shape[a] else 0)
    # sort order, inverse indices... are int64 per row, up to 8x the bytes of a small-typed input
    check_shape((rows.shape[0],), np.int64, "Unique index outputs")
    keys = rows.astype(np.float32) if rows.dtype in UPCAST else rows
    order, new = _group_starts(keys)
    n = len(order)
    starts = np.flatnonzero(new)
    first = order[starts]                                # first occurrence of each group (stable sort)
    group = np.cumsum(new) - 1                           # group of each sorted row
    counts = np.diff(np.append(starts, n))
    if not is_sorted:                                    # renumber groups by first occurrence
        perm = np.argsort(first, kind="stable")
        rank = np.empty_like(perm)
        rank[perm] = np.arange(len(perm))
        first, counts, group = first[perm], counts[perm], rank[group]
    y = x.reshape(-1).take(first) if a is None else x.take(first, axis=a)
    outs = [y, first.astype(np.int64)]
    if n_outputs > 2:
        inverse = np.empty(n, dtype=np.int64)
        inverse[order] = group
        outs.append(inverse)
    if n_outputs > 3:
        outs.append(counts.astype(np.int64))
    return tuple(outs[:max(1, n_outputs)])


@kernel("Unique", since=(11, 28))
def unique_11(*, axis=None, sorted=1, _n_outputs=4):
    if sorted not in (0, 1):
        raise ValueError(f"sorted must be 0 or 1, got {sorted}")
    return lambda x: _unique(x, axis, bool(sorted), _n_outputs)


# -- ReverseSequence -----------------------------------------------------------------------------

@kernel("ReverseSequence", since=(10, 28))
def reverse_sequence_10(*, batch_axis=1, time_axis=0):
    if {batch_axis, time_axis} != {0, 1}:
        raise ValueError(f"batch_axis and time_axis must be 0 and 1 in some order, got {batch_axis} "
                         f"and {time_axis}")

    def reverse_sequence(x, sequence_lens):
        if x.ndim < 2:
            raise InvalidValueError(f"input must have rank >= 2, got rank {x.ndim}")
        batch, steps = x.shape[batch_axis], x.shape[time_axis]
        if sequence_lens.shape != (batch,):
            raise InvalidValueError(f"sequence_lens must have shape [{batch}], got {list(sequence_lens.shape)}")
        lens = sequence_lens.astype(np.int64, copy=False)
        bad = (lens < 0) | (lens > steps)
        if bad.any():
            b = int(np.argmax(bad))
            raise InvalidValueError(f"sequence_lens[{b}] = {int(lens[b])} is outside [0, {steps}]")
        t = np.arange(steps, dtype=np.int64)
        src = np.where(t < lens[:, None], lens[:, None] - 1 - t, t)   # (batch, time): source step
        b = np.arange(batch)[:, None]
        # Two adjacent advanced indices on axes 0 and 1 keep their place: the result has x's layout.
        return x[b, src] if batch_axis == 0 else x[src.T, b.T]

    return reverse_sequence
