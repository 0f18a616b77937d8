"""Element-wise arithmetic: Add, Sub, Mul, Div, Mod, Pow, Clip, Expand (every version).

Opsets 1-6 of Add/Sub/Mul/Div (and Pow-1) use the legacy `broadcast`/`axis` form; from 7 on,
numpy multidirectional broadcasting. float16/bfloat16 +, -, *, / use numpy's (and ml_dtypes')
own loops: they compute each element in float32 and round once, the same result as upcasting the
whole tensor, and faster. The variadic Max/Min/Sum/Mean live in variadic.py.
"""
from __future__ import annotations

import numpy as np

from ...errors import InvalidValueError, OnnxMiniError
from ...registry import kernel
from .._common import (UPCAST, as_array, check_shape, clip_ufunc, fp_errors_ignored, legacy_broadcast, same_type,
                       upcast, with_scalar)


def _not_broadcastable(error: ValueError, a, b):
    """The error to raise for numpy's ValueError from a binary op: our own errors unchanged, numpy's
    (shapes that do not broadcast) as an InvalidValueError naming both shapes."""
    if isinstance(error, OnnxMiniError):
        return error
    try:
        np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        return InvalidValueError(f"shapes {list(a.shape)} and {list(b.shape)} do not broadcast together")
    return InvalidValueError(f"inputs of shapes {list(a.shape)} and {list(b.shape)}: {error}")


def binary(ufunc):
    """The kernel function of a numpy-broadcasting binary op whose two inputs share one type
    (`ufunc` is a numpy ufunc or any function of two arrays that broadcasts like one)."""
    # same_type and as_array inlined: on tiny tensors their two calls were a third of the kernel
    def run(a, b):
        if a.dtype is not b.dtype and a.dtype != b.dtype:     # numpy's dtypes are mostly singletons
            same_type(a, b)
        x, y = a, b
        if a.ndim != b.ndim and a.size == b.size:
            # a batch-1 bias ([1, 128] + [128]): the leading 1 that broadcasting would add, added as a
            # view, takes numpy's plain loop; its broadcasting set-up cost more than the add itself
            # (binary(np.add) here: 1.3 us, 0.9 with the view; same-rank calls pay 0.05 for the test)
            if a.ndim == b.ndim + 1:
                y = b[None]
            elif b.ndim == a.ndim + 1:
                x = a[None]
        try:
            r = ufunc(x, y)
        except ValueError as e:                 # only on the failure path: no cost when shapes broadcast
            raise _not_broadcastable(e, a, b) from None
        return r if r.__class__ is np.ndarray else np.asarray(r)
    return run


def with_constant_second(ufunc, run, constants):
    """run (binary(ufunc)'s function) with a shortcut for a constant second input that has a dimension
    (a bias): an input of its type and rank needs none of run's checks, and the result of a numpy ufunc
    with an input of rank >= 1 is an ndarray (a [2, 3] Add: ~0.55 against ~0.65 us at best, alternating,
    under load)."""
    fixed = (constants or {}).get(1)
    if not isinstance(fixed, np.ndarray) or fixed.ndim == 0 or not isinstance(ufunc, np.ufunc):
        return run
    dtype, ndim = fixed.dtype, fixed.ndim

    def with_bias(a, b):
        if b is fixed and a.dtype is dtype and a.ndim == ndim:   # a constant arrives as that very array
            try:
                return ufunc(a, b)
            except ValueError:
                pass                  # shapes that do not broadcast: run reports them
        return run(a, b)
    return with_bias


def legacy_binary(ufunc, broadcast, axis):
    """Opsets 1-6: B broadcast onto A by the `broadcast`/`axis` attributes (see legacy_broadcast)."""
    def run(a, b):
        same_type(a, b)
        b = legacy_broadcast(a, b, broadcast, axis)
        try:
            return as_array(ufunc(a, b))
        except ValueError as e:
            raise _not_broadcastable(e, a, b) from None
    return run


# -- Add, Sub, Mul -------------------------------------------------------------------------------

def _legacy_versions(op: str, ufunc) -> None:
    """Register versions 1 (with the ignored consumed_inputs) and 6 of a legacy-broadcast binary op."""
    @kernel(op, since=1, rank="broadcast")
    def v1(*, broadcast=0, axis=None, consumed_inputs=None):
        return legacy_binary(ufunc, broadcast, axis)

    @kernel(op, since=6, rank="broadcast")
    def v6(*, broadcast=0, axis=None):
        return legacy_binary(ufunc, broadcast, axis)


_legacy_versions("Add", np.add)
_legacy_versions("Sub", np.subtract)
_legacy_versions("Mul", np.multiply)


@kernel("Add", since=(7, 13, 14), in_place=np.add, rank="broadcast")
def add_7(*, _constants=None):
    return with_constant_second(np.add, binary(np.add), _constants)


@kernel("Sub", since=(7, 13, 14), in_place=np.subtract, rank="broadcast")
def sub_7():
    return binary(np.subtract)


@kernel("Mul", since=(7, 13, 14), in_place=np.multiply, rank="broadcast")
def mul_7():
    return binary(np.multiply)


# -- Div -----------------------------------------------------------------------------------------

def _nonzero_divisor(b: np.ndarray) -> None:
    if not b.all():
        raise InvalidValueError("integer division by zero")


def _divide(a, b):
    """Float division (IEEE: x/0 is +-inf or NaN); integer division truncates toward zero like C,
    INT_MIN / -1 wraps to INT_MIN, and an integer division by zero is an error."""
    if a.dtype.kind not in "iu":
        return as_array(np.divide(a, b))
    _nonzero_divisor(b)
    with np.errstate(over="ignore"):
        q = as_array(np.floor_divide(a, b))
        if a.dtype.kind == "i":
            # floor and truncation differ when the quotient is negative and inexact
            q += (q < 0) & (q * b != a)
    return q


_legacy_versions("Div", _divide)


@kernel("Div", since=(7, 13, 14), in_place=np.divide, rank="broadcast")
def div_7():
    return binary(_divide)


# -- Mod -----------------------------------------------------------------------------------------

def _mod(fmod: int, float_floor_mod: bool):
    """fmod=0: A - floor(A/B)*B (sign of B, np.mod); fmod=1: A - trunc(A/B)*B (sign of A, np.fmod).
    float_floor_mod: whether fmod=0 is allowed for float inputs (28+; before, the spec requires 1)."""
    if fmod not in (0, 1):
        raise ValueError(f"fmod must be 0 or 1, got {fmod}")
    ufunc = np.fmod if fmod else np.mod

    def run(a, b):
        same_type(a, b)
        if a.dtype.kind in "iu":
            _nonzero_divisor(b)
            return as_array(ufunc(a, b))
        if not fmod and not float_floor_mod:
            raise InvalidValueError(f"Mod with floating-point inputs ({a.dtype}) needs fmod=1 before opset 28")
        with np.errstate(divide="ignore", invalid="ignore"):   # x mod 0 and inf mod y are NaN
            return as_array(ufunc(a, b))
    return run


@kernel("Mod", since=(10, 13, 28))
def mod_10(*, fmod=0, _version):
    return _mod(fmod, _version >= 28)


# -- Pow -----------------------------------------------------------------------------------------

def _int_power(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Integer base (int32/int64), integer exponent: computed in int64, wrapping like C; x**-n is
    1/x**n truncated toward zero: 1 for x == 1, +-1 for x == -1, 0 otherwise (an error for x == 0)."""
    y64 = y.astype(np.int64, copy=False)
    x64 = x.astype(np.int64, copy=False)
    with np.errstate(over="ignore"):
        neg = y64 < 0
        if not neg.any():
            return as_array(np.power(x64, y64)).astype(x.dtype, copy=False)
        if (neg & (x64 == 0)).any():
            raise InvalidValueError("integer 0 raised to a negative power")
        out = np.power(x64, np.where(neg, 0, y64))
        inv = np.where(x64 == 1, 1, np.where(x64 == -1, 1 - 2 * (y64 & 1), 0))
        return as_array(np.where(neg, inv, out)).astype(x.dtype, copy=False)


def _power(x, y):
    """Z has X's type; float16/bfloat16 (and mixed float types) computed wider, rounded back once."""
    try:
        dt = x.dtype
        if dt.kind in "iu":
            if y.dtype.kind in "iu":
                return _int_power(x, y)
            # float exponent: compute in float64, convert back truncating toward zero (C cast)
            with np.errstate(all="ignore"):
                return as_array(np.power(x.astype(np.float64), upcast(y))).astype(dt)
        return _float_power(x, y, dt)
    except ValueError as e:        # only on the failure path
        raise _not_broadcastable(e, x, y) from None


# (fp_errors_ignored: a [1, 64] float32 Pow 3.3 -> 2.4 us a call, np.power alone 0.9; under load)
@fp_errors_ignored(all="ignore")
def _float_power(x, y, dt):
    if dt == y.dtype and dt not in UPCAST:
        return as_array(np.power(x, y))
    return as_array(np.power(upcast(x), upcast(y))).astype(dt, copy=False)


@kernel("Pow", since=1)
def pow_1(*, broadcast=0, axis=None):
    return legacy_binary(_power, broadcast, axis)


@kernel("Pow", since=7)
def pow_7():
    return binary(_power)          # 7: one type T for base and exponent; 12+: exponent of type T1


@kernel("Pow", since=(12, 13, 15))
def pow_12():
    return _power


# -- Clip ----------------------------------------------------------------------------------------

# numpy's clip ufunc has loops for these: both bounds in one pass, the values of a maximum and a minimum
# pass (a zero equal to a bound keeps its own sign): [1, 240, 240, 32] float32 1.35 -> 0.69 ms, [64] 5.6 -> 1.6 us
_ONE_PASS = frozenset(np.dtype(t) for t in (np.float16, np.float32, np.float64, np.int8, np.uint8, np.int16,
                                            np.uint16, np.int32, np.uint32, np.int64, np.uint64))


def _clip(x, lo, hi):
    """Min(hi, Max(x, lo)): NaN propagates, and lo > hi gives hi everywhere."""
    if lo is not None and hi is not None and x.dtype in _ONE_PASS:
        return as_array(clip_ufunc(x, lo, hi))
    if lo is not None:
        x = with_scalar(np.maximum, x, lo)
    if hi is not None:
        x = with_scalar(np.minimum, x, hi)
    return as_array(x)


def _clip_attrs(lo, hi):
    # Absent bounds are numeric_limits<T>::lowest()/max(), i.e. no clipping.
    def run(x):
        dt = x.dtype
        with np.errstate(over="ignore"):   # float16: a bound beyond its range becomes +-inf
            return _clip(x, None if lo is None else dt.type(lo), None if hi is None else dt.type(hi))
    return run


@kernel("Clip", since=1, views=True, rank="first")
def clip_1(*, min=None, max=None, consumed_inputs=None):
    return _clip_attrs(min, max)


@kernel("Clip", since=6, views=True, rank="first")
def clip_6(*, min=None, max=None):
    return _clip_attrs(min, max)


def _bound(x, v, name):
    if v is None:
        return None
    same_type(x, v)
    if v.size != 1:
        raise InvalidValueError(f"Clip's {name} must be a scalar, got shape {list(v.shape)}")
    return v.reshape(())


@kernel("Clip", since=(11, 12, 13), views=True, rank="first")
def clip_11():
    def run(x, min=None, max=None):
        return _clip(x, _bound(x, min, "min"), _bound(x, max, "max"))
    return run


# -- Expand --------------------------------------------------------------------------------------

@kernel("Expand", since=(8, 13), views=True)
def expand_8():
    def run(x, shape):
        if shape.dtype != np.int64 or shape.ndim != 1:
            raise InvalidValueError(f"Expand's shape must be a 1-D int64 tensor, got {shape.dtype} "
                                    f"of shape {list(shape.shape)}")
        dims = tuple(shape.tolist())
        if any(d < 0 for d in dims):
            raise InvalidValueError(f"Expand's shape {list(dims)} has negative dimensions")
        try:
            out = np.broadcast_shapes(x.shape, dims)
        except ValueError:
            raise InvalidValueError(f"input of shape {list(x.shape)} cannot be broadcast to "
                                    f"shape {list(dims)}") from None
        return np.broadcast_to(x, check_shape(out, x.dtype))      # a read-only view, no copy
    return run
