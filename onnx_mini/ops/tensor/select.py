"""Element selection and tests: Trilu, Compress, Where, IsInf, IsNaN."""
from __future__ import annotations

import numpy as np

from ...errors import InvalidValueError
from ...registry import kernel
from .._common import as_array, check_shape, int_list, normalize_axis, same_type, zero_of

# -- Trilu ---------------------------------------------------------------------------------------


def _scalar(value, what: str) -> int:
    values = int_list(value, what)
    if len(values) != 1:
        raise InvalidValueError(f"{what} must be a single integer, got {values}")
    return values[0]


@kernel("Trilu", since=14)
def trilu_14(*, upper=1):
    def trilu(x, k=None):
        if x.ndim < 2:
            raise InvalidValueError(f"the input must have rank >= 2, got shape {list(x.shape)}")
        n, m = x.shape[-2:]
        # clipped so that huge k (e.g. INT64_MAX) cannot overflow np.tri's arange
        kk = min(max(0 if k is None else _scalar(k, "k"), -n - 1), m + 1)
        # np.tri(n, m, d)[i, j] is True where j - i <= d: the lower part keeps j - i <= k,
        # the upper part keeps j - i >= k, the complement of j - i <= k - 1.
        keep = ~np.tri(n, m, kk - 1, dtype=bool) if upper else np.tri(n, m, kk, dtype=bool)
        return np.where(keep, x, zero_of(x.dtype))
    return trilu


# -- Compress ------------------------------------------------------------------------------------

@kernel("Compress", since=(9, 11, 28))
def compress_9(*, axis=None):
    def compress(x, condition):
        if condition.dtype != np.bool_:
            raise InvalidValueError(f"condition must be bool, got {condition.dtype}")
        if condition.ndim != 1:
            raise InvalidValueError(f"condition must be 1-D, got shape {list(condition.shape)}")
        picked = np.flatnonzero(condition)
        if axis is None:
            x = x.reshape(-1)
            a = 0
        else:
            a = normalize_axis(axis, x.ndim)
        n = x.shape[a]
        # A condition longer than the axis is fine as long as its extra entries are False (numpy's rule).
        if picked.size and picked[-1] >= n:
            raise InvalidValueError(f"condition selects index {picked[-1]} of an axis of size {n}")
        return x.take(picked, axis=a)
    return compress


# -- Where ---------------------------------------------------------------------------------------

@kernel("Where", since=(9, 16))
def where_9():
    def where(condition, x, y):
        if condition.dtype != np.bool_:
            raise InvalidValueError(f"condition must be bool, got {condition.dtype}")
        same_type(x, y)
        if not condition.shape == x.shape == y.shape:   # equal shapes (the common case) need no check
            try:
                shape = np.broadcast_shapes(condition.shape, x.shape, y.shape)
            except ValueError:
                raise InvalidValueError(f"shapes {list(condition.shape)}, {list(x.shape)} and {list(y.shape)} "
                                        "do not broadcast together") from None
            check_shape(shape, x.dtype, "Where output")  # broadcasting can multiply sizes: (n,1,1)...(1,1,n)
        return as_array(np.where(condition, x, y))
    return where


# -- IsInf / IsNaN -------------------------------------------------------------------------------

_NATIVE = frozenset(map(np.dtype, (np.float16, np.float32, np.float64)))


def _native(x: np.ndarray) -> np.ndarray:
    """x itself for numpy float types; ml_dtypes floats (bfloat16, float8*) as float32, exactly."""
    return x if x.dtype in _NATIVE else x.astype(np.float32)


@kernel("IsInf", since=(10, 20))
def isinf_10(*, detect_negative=1, detect_positive=1):
    if detect_negative and detect_positive:
        return lambda x: as_array(np.isinf(_native(x)))
    if detect_positive:
        return lambda x: as_array(_native(x) == np.inf)
    if detect_negative:
        return lambda x: as_array(_native(x) == -np.inf)
    return lambda x: np.zeros(x.shape, dtype=np.bool_)


@kernel("IsNaN", since=(9, 13, 20))
def isnan_9():
    return lambda x: as_array(np.isnan(_native(x)))
