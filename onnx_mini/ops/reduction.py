"""Reductions: ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceProd, ReduceL1, ReduceL2, ReduceSumSquare,
ReduceLogSum, ReduceLogSumExp (every version, axes as attribute or as input), ArgMax, ArgMin.

One helper (reduce_axes) turns the axes attribute/input and noop_with_empty_axes into the numpy axis
argument; one (_Reduction.__call__) handles the type rules shared by every reduction: float16/bfloat16
computed in float32 and rounded back once, reductions over an empty set filled with the op's identity
value, integer results of float math converted without undefined casts.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import InvalidValueError
from ..registry import kernel
from ._common import UPCAST, as_array, float_to, int_list, normalize_axes, normalize_axis, upcast

# -- axes ------------------------------------------------------------------------------------------


def check_axes_attribute(axes) -> tuple | None:
    """The axes attribute of opsets 1-17 (None or empty: every axis). Literal duplicates are rejected
    here, at prepare time; the others (such as -1 and 2 for rank 3) when the rank is known."""
    if not axes:
        return None
    axes = tuple(int(a) for a in axes)
    if len(set(axes)) != len(axes):
        raise ValueError(f"axes {list(axes)} has duplicates")
    return axes


def reduce_axes(axes, rank: int, noop_with_empty_axes: bool = False) -> tuple | None:
    """The numpy `axis` of a reduction: None (every axis), () (no axis: a no-op reduction), or the
    normalised axes. `axes` is a sequence of ints or a 1-D integer tensor, None or empty when omitted."""
    axes = int_list(axes, "axes") if axes is not None else ()
    if not axes:
        return () if noop_with_empty_axes else None
    return tuple(normalize_axes(axes, rank))


def _out_shape(shape: tuple, axes: tuple | None, keepdims: bool) -> tuple:
    if axes is None:
        axes = range(len(shape))
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


# -- type helpers ----------------------------------------------------------------------------------


def _lowest(dtype: np.dtype):
    if dtype == np.bool_:
        return False
    if dtype.kind in "iu":
        return np.iinfo(dtype).min
    return -np.inf


def _highest(dtype: np.dtype):
    if dtype == np.bool_:
        return True
    if dtype.kind in "iu":
        return np.iinfo(dtype).max
    return np.inf


# -- the reductions --------------------------------------------------------------------------------
# Each function below reduces x (never a float16/bfloat16: those arrive as float32) over `axes`
# (None or a tuple; never empty-set reductions: those are filled with `identity`), keeping x's type.


# (the ufuncs' reduce: what np.sum / np.prod / np.max / np.min call, without their Python layer, ~1.5 us)
def _sum(x, axes, keepdims):
    return np.add.reduce(x, axis=axes, keepdims=keepdims, dtype=x.dtype)


def _prod(x, axes, keepdims):
    return np.multiply.reduce(x, axis=axes, keepdims=keepdims, dtype=x.dtype)


def _max(x, axes, keepdims):
    return np.maximum.reduce(x, axis=axes, keepdims=keepdims)


def _min(x, axes, keepdims):
    return np.minimum.reduce(x, axis=axes, keepdims=keepdims)


def _count(shape, axes) -> int:
    return math.prod(shape if axes is None else (shape[a] for a in axes))


def _mean(x, axes, keepdims):
    if x.dtype.kind == "f":
        # np.mean's two steps (the pairwise sum in x's type, one division by the count) without its
        # Python layer: the same values, ~2.5 us a call less here ([1, 1]: 5.9 -> 3.4 us, [16, 256] 8.2 -> 4.9)
        s = as_array(_sum(x, axes, keepdims))
        return np.true_divide(s, _count(x.shape, axes), out=s)
    # integers: the sum in the type, divided by the count truncating toward zero (as C++ does)
    s, n = _sum(x, axes, keepdims), _count(x.shape, axes)
    if x.dtype.kind == "u":
        return s // x.dtype.type(n)
    q = np.abs(s) // n
    return as_array(np.where(s < 0, -q, q)).astype(x.dtype, copy=False)


def _l1(x, axes, keepdims):
    return _sum(np.abs(x), axes, keepdims)


def _sum_square(x, axes, keepdims):
    return _sum(x * x, axes, keepdims)


def _in_float(fn):
    """fn on float data; integer data goes through float64 and is converted back with float_to."""
    def run(x, axes, keepdims):
        if x.dtype.kind == "f":
            return fn(x, axes, keepdims)
        return float_to(as_array(fn(x.astype(np.float64), axes, keepdims)), x.dtype)
    return run


@_in_float
def _l2(x, axes, keepdims):
    return np.sqrt(_sum(x * x, axes, keepdims))


@_in_float
def _log_sum(x, axes, keepdims):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(_sum(x, axes, keepdims))


@_in_float
def _log_sum_exp(x, axes, keepdims):
    # log(sum(exp(x - m))) + m with m the max: no overflow. An infinite max (all -inf, or some +inf)
    # is replaced by 0 so that x - m stays defined; the plain formula gives the right -inf / +inf then.
    m = np.max(x, axis=axes, keepdims=True)
    m = np.where(np.isfinite(m), m, x.dtype.type(0))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        s = np.log(_sum(np.exp(x - m), axes, True)) + m
    return s if keepdims else s.reshape(_out_shape(x.shape, axes, False))


class _Reduction:
    """A reduction kernel's math: `fn` plus its value over an empty set (`identity(dtype)`)."""

    def __init__(self, fn, identity, pure: bool):
        self.fn = fn
        self.identity = identity
        self.pure = pure          # no elementwise step: a no-op reduction returns the input itself

    def __call__(self, data: np.ndarray, axes: tuple | None, keepdims: bool) -> np.ndarray:
        if axes == () and self.pure:
            return data
        dtype = data.dtype
        if data.size == 0:  # every output element (if any) reduces an empty set
            if axes == ():
                return data.copy()
            return np.full(_out_shape(data.shape, axes, keepdims), self.identity(dtype), dtype=dtype)
        if dtype in UPCAST:
            return as_array(self.fn(data.astype(np.float32), axes, keepdims)).astype(dtype)
        return as_array(self.fn(data, axes, keepdims))


def _const(value):
    return lambda dtype: value


REDUCTIONS = {  # op: (math, attribute-axes versions, input-axes versions)
    "ReduceSum": (_Reduction(_sum, _const(0), True), (1, 11), (13,)),
    "ReduceProd": (_Reduction(_prod, _const(1), True), (1, 11, 13), (18,)),
    "ReduceMax": (_Reduction(_max, _lowest, True), (1, 11, 12, 13), (18, 20)),
    "ReduceMin": (_Reduction(_min, _highest, True), (1, 11, 12, 13), (18, 20)),
    "ReduceMean": (_Reduction(_mean, lambda dt: np.nan if dt.kind == "f" else 0, True), (1, 11, 13), (18,)),
    "ReduceL1": (_Reduction(_l1, _const(0), False), (1, 11, 13), (18,)),
    "ReduceL2": (_Reduction(_l2, _const(0), False), (1, 11, 13), (18,)),
    "ReduceSumSquare": (_Reduction(_sum_square, _const(0), False), (1, 11, 13), (18,)),
    "ReduceLogSum": (_Reduction(_log_sum, _lowest, False), (1, 11, 13), (18, 28)),
    "ReduceLogSumExp": (_Reduction(_log_sum_exp, _lowest, False), (1, 11, 13), (18, 28)),
}


def _register(op: str, reduce: _Reduction, attribute_versions: tuple, input_versions: tuple) -> None:
    def axes_attribute(*, axes=None, keepdims=1):
        fixed = check_axes_attribute(axes)
        keep = bool(keepdims)
        if fixed is None:
            return lambda data: reduce(data, None, keep)
        return lambda data: reduce(data, reduce_axes(fixed, data.ndim), keep)

    def axes_input(*, keepdims=1, noop_with_empty_axes=0, _constants=None):
        keep, noop = bool(keepdims), bool(noop_with_empty_axes)

        def run(data, axes=None):
            return reduce(data, reduce_axes(axes, data.ndim, noop), keep)
        if (_constants or {}).get(1) is None:
            return run
        # constant axes (the usual case): read once per rank, not per call (a decoder's ReduceSum of 257
        # values: ~5 against ~3 us here)
        fixed, by_rank = _constants[1], {}

        def run_fixed(data, axes=None):
            if axes is not fixed:
                return run(data, axes)
            ax = by_rank.get(data.ndim, by_rank)
            if ax is by_rank:
                ax = by_rank[data.ndim] = reduce_axes(fixed, data.ndim, noop)
            return reduce(data, ax, keep)
        return run_fixed

    axes_attribute.__name__ = f"{op}_{attribute_versions[0]}"
    axes_input.__name__ = f"{op}_{input_versions[0]}"
    kernel(op, since=attribute_versions)(axes_attribute)
    # noop_with_empty_axes with empty axes returns the input itself (pure reductions)
    kernel(op, since=input_versions, views=reduce.pure)(axes_input)


for _op, (_reduce, _attr_versions, _input_versions) in REDUCTIONS.items():
    _register(_op, _reduce, _attr_versions, _input_versions)


# -- ArgMax / ArgMin -------------------------------------------------------------------------------


def _arg(find, axis: int, keepdims: int, select_last_index: int):
    """find is np.argmax or np.argmin: first occurrence, and a NaN counts as the extreme (first NaN
    wins, as in numpy); select_last_index searches the reversed axis."""
    keep, last = bool(keepdims), bool(select_last_index)
    # the method, not numpy's function: ~0.4 us less a call; the axis checked once per input rank
    # (ArgMax of [1, 1000] float32 logits, a greedy decoder's: ~2.4 -> ~1.1 us, measured under load)
    find = {np.argmax: np.ndarray.argmax, np.argmin: np.ndarray.argmin}[find]
    axes: dict = {}

    def run(data):
        ax = axes.get(data.ndim)
        if ax is None:
            ax = axes[data.ndim] = normalize_axis(axis, data.ndim)
        n = data.shape[ax]
        if n == 0:
            raise InvalidValueError(f"cannot take the arg of an empty axis {axis} (shape {list(data.shape)})")
        x = upcast(data)
        if last:
            idx = (n - 1) - find(np.flip(x, ax), axis=ax, keepdims=keep)
        else:
            idx = find(x, axis=ax, keepdims=keep)
        return as_array(idx).astype(np.int64, copy=False)
    return run


@kernel("ArgMax", since=(1, 11))
def argmax_1(*, axis=0, keepdims=1):
    return _arg(np.argmax, axis, keepdims, 0)


@kernel("ArgMax", since=(12, 13))
def argmax_12(*, axis=0, keepdims=1, select_last_index=0):
    return _arg(np.argmax, axis, keepdims, select_last_index)


@kernel("ArgMin", since=(1, 11))
def argmin_1(*, axis=0, keepdims=1):
    return _arg(np.argmin, axis, keepdims, 0)


@kernel("ArgMin", since=(12, 13))
def argmin_12(*, axis=0, keepdims=1, select_last_index=0):
    return _arg(np.argmin, axis, keepdims, select_last_index)
