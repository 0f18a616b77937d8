"""Helpers shared by kernels of several families (one place each).

- axis normalisation: normalize_axis
- ndarray results from ufuncs: as_array
- the opset 1-6 `broadcast`/`axis` form of binary ops: legacy_broadcast
- same element type of two inputs: same_type
- low-precision floats computed in float32 and rounded back once: UPCAST, upcast, float32_compute
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from ..errors import InvalidValueError


def normalize_axis(axis: int, rank: int, what: str = "axis") -> int:
    """Map an axis in [-rank, rank-1] to [0, rank-1]; InvalidValueError outside that range."""
    if not -rank <= axis < rank:
        raise InvalidValueError(f"{what} {axis} is out of range for a tensor of rank {rank} "
                                f"(accepted: [{-rank}, {rank - 1}])")
    return axis + rank if axis < 0 else axis


def as_array(x):
    """numpy ufuncs return scalars for 0-d inputs; kernels always hand back ndarrays."""
    return x if x.__class__ is np.ndarray else np.asarray(x)


def legacy_broadcast(a: np.ndarray, b: np.ndarray, broadcast: int, axis) -> np.ndarray:
    """Opsets 1-6: B must equal A's shape, or with broadcast=1 be a contiguous run of A's dimensions
    starting at `axis` (default: aligned to the end); size-1 dims of B broadcast. Returns B reshaped."""
    if not broadcast:
        if a.shape != b.shape:
            raise InvalidValueError(f"shapes {list(a.shape)} and {list(b.shape)} differ and broadcast=0")
        return b
    if b.ndim > a.ndim:
        raise InvalidValueError(f"B of shape {list(b.shape)} has higher rank than A {list(a.shape)}")
    start = a.ndim - b.ndim if axis is None else (axis + a.ndim if axis < 0 else axis)
    if not 0 <= start <= a.ndim - b.ndim:
        raise InvalidValueError(f"axis {axis} does not fit B of shape {list(b.shape)} into A {list(a.shape)}")
    for i, d in enumerate(b.shape):
        if d not in (1, a.shape[start + i]):
            raise InvalidValueError(f"B of shape {list(b.shape)} does not match A {list(a.shape)} "
                                    f"from axis {start}")
    return b.reshape((1,) * start + b.shape + (1,) * (a.ndim - start - b.ndim))


def same_type(a: np.ndarray, b: np.ndarray) -> None:
    if a.dtype != b.dtype:
        raise InvalidValueError(f"inputs must have the same element type, got {a.dtype} and {b.dtype}")


#: float types numpy has no (fast or any) arithmetic for: compute in float32, round back once.
UPCAST = frozenset(np.dtype(t) for t in (
    np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fnuz,
    ml_dtypes.float8_e5m2, ml_dtypes.float8_e5m2fnuz, ml_dtypes.float8_e8m0fnu, ml_dtypes.float4_e2m1fn))


def upcast(x: np.ndarray) -> np.ndarray:
    """x as float32 when its type is in UPCAST, else x itself."""
    return x.astype(np.float32) if x.dtype in UPCAST else x


def float32_compute(fn):
    """Wrap fn(x, *rest) so that an UPCAST-typed x (and any array in rest of the same type) is
    computed in float32 and the result rounded back once to x's type; other types pass through."""
    def run(x, *rest):
        dt = x.dtype
        if dt in UPCAST:
            rest = [r.astype(np.float32) if isinstance(r, np.ndarray) and r.dtype == dt else r for r in rest]
            return as_array(fn(x.astype(np.float32), *rest)).astype(dt)
        return as_array(fn(x, *rest))
    return run
