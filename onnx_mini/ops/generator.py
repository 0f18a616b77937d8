"""Generator operators: Constant, ConstantOfShape, EyeLike, Range (every version)."""
from __future__ import annotations

import numpy as np
import onnx

from ..errors import InvalidValueError
from ..registry import kernel
from ._common import UPCAST, allowed_dtypes, as_array, check_shape, dtype_attribute


def _constant(value: np.ndarray):
    value = np.asarray(value)
    value.flags.writeable = False  # the same array is handed out on every run
    return lambda: value


@kernel("Constant", since=(1, 9))
def constant_1(*, value):
    return _constant(value)


@kernel("Constant", since=11)
def constant_11(*, value=None, sparse_value=None):
    return constant_12(value=value, sparse_value=sparse_value)


@kernel("Constant", since=(12, 13, 19, 21, 23, 24, 25))
def constant_12(*, value=None, sparse_value=None, value_float=None, value_floats=None, value_int=None,
                value_ints=None, value_string=None, value_strings=None):
    # sparse_value arrives densified by the loader; the other forms become the tensor they describe.
    given = {
        "value": value, "sparse_value": sparse_value,
        "value_float": None if value_float is None else np.array(value_float, dtype=np.float32),
        "value_floats": None if value_floats is None else np.array(value_floats, dtype=np.float32),
        "value_int": None if value_int is None else np.array(value_int, dtype=np.int64),
        "value_ints": None if value_ints is None else np.array(value_ints, dtype=np.int64),
        "value_string": None if value_string is None else np.array(value_string, dtype=object),
        "value_strings": None if value_strings is None else _strings(value_strings),
    }
    set_ = {k: v for k, v in given.items() if v is not None}
    if len(set_) != 1:
        raise ValueError(f"Constant needs exactly one value attribute, got {sorted(set_) or 'none'}")
    return _constant(next(iter(set_.values())))


def _strings(values) -> np.ndarray:
    arr = np.empty(len(values), dtype=object)
    arr[:] = list(values)
    return arr


# -- ConstantOfShape -------------------------------------------------------------------------------

def shape_input(shape: np.ndarray) -> tuple:
    """A 1-D int64 shape input whose values must all be >= 0 (empty: a scalar)."""
    if shape.ndim != 1:
        raise InvalidValueError(f"the shape input must be 1-D, got shape {list(shape.shape)}")
    if shape.dtype != np.int64:
        raise InvalidValueError(f"the shape input must be int64, got {shape.dtype}")
    dims = tuple(shape.tolist())
    if any(d < 0 for d in dims):
        raise InvalidValueError(f"shape {list(dims)} has a negative dimension")
    return dims


@kernel("ConstantOfShape", since=(9, 20, 21, 23, 24, 25))
def constant_of_shape_9(*, value=None, _version):
    if value is None:
        fill = np.zeros((), np.float32)
    else:
        value = np.asarray(value)
        if value.size != 1:
            raise ValueError(f"value must be a one-element tensor, got shape {list(value.shape)}")
        if value.dtype not in allowed_dtypes("ConstantOfShape", _version, "T2"):
            raise ValueError(f"value of type {value.dtype} is not allowed by ConstantOfShape-{_version}")
        fill = value.reshape(())
    return lambda shape: np.full(check_shape(shape_input(shape), fill.dtype), fill, dtype=fill.dtype)


# -- EyeLike ---------------------------------------------------------------------------------------

def eye(rows: int, cols: int, k: int, dtype) -> np.ndarray:
    """out[i, i + k] = 1, zeros elsewhere (k > 0: an upper diagonal, k < 0: a lower one)."""
    out = np.zeros(check_shape((rows, cols), dtype), dtype=dtype)
    count = min(rows, cols - k) if k >= 0 else min(rows + k, cols)
    if count > 0:
        start = k if k >= 0 else -k * cols
        out.reshape(-1)[start:start + count * (cols + 1):cols + 1] = 1
    return out


@kernel("EyeLike", since=(9, 22))
def eye_like_9(*, dtype=None, k=0, _version):
    out = None if dtype is None else dtype_attribute(dtype, "EyeLike", _version, "T2", "dtype")
    k = int(k)

    def run(x):
        if x.ndim != 2:
            raise InvalidValueError(f"EyeLike needs a 2-D input, got shape {list(x.shape)}")
        return eye(x.shape[0], x.shape[1], k, x.dtype if out is None else out)
    return run


# -- Range -----------------------------------------------------------------------------------------

def _scalar(x: np.ndarray, name: str):
    if x.size != 1 or x.ndim > 1:
        raise InvalidValueError(f"{name} must be a scalar, got shape {list(x.shape)}")
    return x.reshape(())


def arange(start: np.ndarray, limit: np.ndarray, delta: np.ndarray, compute=None) -> np.ndarray:
    """Range: max(ceil((limit - start) / delta), 0) elements, output[i] = start + i * delta computed in
    the input type (or in `compute` for float16/bfloat16 when given), returned in the input type."""
    start, limit, delta = _scalar(start, "start"), _scalar(limit, "limit"), _scalar(delta, "delta")
    dt = start.dtype
    if limit.dtype != dt or delta.dtype != dt:
        raise InvalidValueError(f"start, limit and delta must have one type, got {dt}, {limit.dtype}, "
                                f"{delta.dtype}")
    if dt.kind in "iu":
        s, lim, d = int(start), int(limit), int(delta)
        if d == 0:
            raise InvalidValueError("delta must not be 0")
        n = check_shape((max(-((s - lim) // d), 0),), dt)[0]   # exact integer ceil((limit - start) / delta)
        return (np.arange(n, dtype=np.int64) * d + s).astype(dt)
    ct = compute if compute is not None and dt in UPCAST else dt
    s, lim, d = start.astype(ct), limit.astype(ct), delta.astype(ct)
    with np.errstate(divide="ignore", invalid="ignore"):
        count = np.ceil((lim - s) / d)
    if not np.isfinite(count):
        raise InvalidValueError(f"range({start}, {limit}, {delta}) has no finite number of elements")
    n = check_shape((max(int(count), 0),), dt)[0]
    return as_array(s + np.arange(n, dtype=ct) * d).astype(dt, copy=False)


@kernel("Range", since=11)
def range_11():
    return arange


@kernel("Range", since=27)
def range_27(*, stash_type=1):
    compute = None if int(stash_type) != onnx.TensorProto.FLOAT else np.dtype(np.float32)
    return lambda start, limit, delta: arange(start, limit, delta, compute)
