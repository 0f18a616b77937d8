"""Shape-only tensor operators: Identity, Shape, Reshape (views, never copies)."""
from __future__ import annotations

import math

import numpy as np

from ...errors import InvalidValueError
from ...registry import kernel


def _identity(x):
    return x


@kernel("Identity", since=(1, 13, 14, 16, 19, 21, 23, 24, 25))
def identity_1():
    # Tensors, sequences (14+) and optionals (16+) pass through unchanged: no copy.
    return _identity


# -- Shape ---------------------------------------------------------------------------------------

@kernel("Shape", since=(1, 13))
def shape_1():
    return lambda data: np.array(data.shape, dtype=np.int64)


@kernel("Shape", since=(15, 19, 21, 23, 24, 25))
def shape_15(*, start=0, end=None):
    # Python slicing clamps negative/out-of-range bounds to [0, rank] exactly as the spec asks,
    # and start > end gives an empty shape.
    span = slice(start, end)
    return lambda data: np.array(data.shape[span], dtype=np.int64)


# -- Reshape -------------------------------------------------------------------------------------

def target_shape(in_shape: tuple, requested, allowzero: bool) -> tuple:
    """The output shape of Reshape: 0 copies the input dim (unless allowzero), one -1 is inferred."""
    shape = [int(d) for d in requested]
    inferred = [i for i, d in enumerate(shape) if d == -1]
    if len(inferred) > 1:
        raise InvalidValueError(f"shape {shape} has more than one -1")
    bad = [d for d in shape if d < -1]
    if bad:
        raise InvalidValueError(f"shape {shape} has invalid dimension(s) {bad} (only -1 may be negative)")
    if allowzero:
        if inferred and 0 in shape:
            raise InvalidValueError(f"shape {shape} has both 0 and -1, which allowzero=1 forbids")
    else:
        for i, d in enumerate(shape):
            if d == 0:
                if i >= len(in_shape):
                    raise InvalidValueError(f"shape {shape}: 0 at index {i} copies an input dimension, but "
                                            f"the input {list(in_shape)} has rank {len(in_shape)}")
                shape[i] = in_shape[i]
    total = math.prod(in_shape)
    if inferred:
        known = math.prod(d for i, d in enumerate(shape) if i != inferred[0])
        if known == 0:
            raise InvalidValueError(f"cannot infer the -1 of shape {shape} for input {list(in_shape)}: "
                                    "the other dimensions multiply to 0")
        if total % known:
            raise InvalidValueError(f"cannot reshape input {list(in_shape)} ({total} elements) to {shape}")
        shape[inferred[0]] = total // known
    elif math.prod(shape) != total:
        raise InvalidValueError(f"cannot reshape input {list(in_shape)} ({total} elements) to {shape} "
                                f"({math.prod(shape)} elements)")
    return tuple(shape)


@kernel("Reshape", since=1)
def reshape_1(*, shape=None, consumed_inputs=None):
    if shape is None:
        raise ValueError("Reshape-1 needs the attribute 'shape'")
    requested = tuple(shape)
    return lambda data: data.reshape(target_shape(data.shape, requested, False))


@kernel("Reshape", since=(5, 13))
def reshape_5():
    return reshape_14(allowzero=0)


@kernel("Reshape", since=(14, 19, 21, 23, 24, 25))
def reshape_14(*, allowzero=0):
    allow = bool(allowzero)

    def reshape(data, shape):
        if shape.dtype != np.int64:
            raise InvalidValueError(f"the shape input must be int64, got {shape.dtype}")
        if shape.ndim != 1:
            raise InvalidValueError(f"the shape input must be 1-D, got shape {list(shape.shape)}")
        requested = shape.tolist()
        # ndarray.reshape returns a view whenever the layout allows it (always for contiguous data).
        # Without 0 entries (or with allowzero) numpy's own rules are the spec's, so try it first;
        # target_shape() gives the spec's answer or a precise error otherwise.
        if (allow or 0 not in requested) and min(requested, default=0) >= -1:
            try:
                return data.reshape(requested)
            except ValueError:
                pass
        return data.reshape(target_shape(data.shape, requested, allow))

    return reshape
