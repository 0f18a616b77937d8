"""Element-wise arithmetic: Add (every version, incl. the legacy broadcast=1/axis form of 1 and 6)."""
from __future__ import annotations

import numpy as np

from ..errors import InvalidValueError
from ._common import as_array
from ..registry import kernel


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


def _same_type(a, b):
    if a.dtype != b.dtype:
        raise InvalidValueError(f"inputs must have the same element type, got {a.dtype} and {b.dtype}")


def binary(ufunc):
    """The kernel function of a numpy-broadcasting binary op that keeps the (shared) input type."""
    def run(a, b):
        _same_type(a, b)
        return as_array(ufunc(a, b))
    return run


def legacy_binary(ufunc, broadcast, axis):
    def run(a, b):
        _same_type(a, b)
        return as_array(ufunc(a, legacy_broadcast(a, b, broadcast, axis)))
    return run


@kernel("Add", since=1)
def add_1(*, broadcast=0, axis=None, consumed_inputs=None):
    return legacy_binary(np.add, broadcast, axis)


@kernel("Add", since=6)
def add_6(*, broadcast=0, axis=None):
    return legacy_binary(np.add, broadcast, axis)


@kernel("Add", since=(7, 13, 14))
def add_7():
    return binary(np.add)
