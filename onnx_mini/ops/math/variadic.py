"""Variadic element-wise ops: Max, Min, Sum, Mean (1..N inputs of one type).

Versions 1 and 6 require every input to have the same shape; from 8 on, inputs broadcast
(numpy multidirectional broadcasting). Max/Min propagate NaN (np.maximum/np.minimum do), and are
exact in every type, so they run in the inputs' own type. Sum/Mean of float16/bfloat16 accumulate
in float32 and round back once.
"""
from __future__ import annotations

import numpy as np

from ...errors import InvalidValueError
from ...registry import kernel
from .._common import UPCAST, as_array


def _check(xs, same_shape: bool) -> None:
    if not xs:
        raise InvalidValueError("needs at least one input")
    first = xs[0]
    for x in xs[1:]:
        if x.dtype != first.dtype:
            raise InvalidValueError(f"inputs must have the same element type, got {first.dtype} and {x.dtype}")
        if same_shape and x.shape != first.shape:
            raise InvalidValueError(f"inputs must have the same shape before opset 8, got "
                                    f"{list(first.shape)} and {list(x.shape)}")


def _fold(ufunc, same_shape: bool):
    """ufunc(...ufunc(ufunc(x0, x1), x2)..., xn); a single input is returned unchanged."""
    def run(*xs):
        _check(xs, same_shape)
        acc = xs[0]
        for x in xs[1:]:
            acc = ufunc(acc, x)
        return as_array(acc)
    return run


def _sum(xs):
    acc = xs[0]
    if len(xs) == 1:
        return acc
    for x in xs[1:]:
        acc = np.add(acc, x)
    return acc


def _mean(same_shape: bool, mean: bool):
    def run(*xs):
        _check(xs, same_shape)
        dt = xs[0].dtype
        if dt in UPCAST:
            acc = _sum([x.astype(np.float32) for x in xs])
            if mean:
                acc = acc / np.float32(len(xs))
            return as_array(acc).astype(dt)
        acc = _sum(xs)
        if mean and len(xs) > 1:
            acc = acc / dt.type(len(xs))
        return as_array(acc)
    return run


def _register(op: str, make, rank=None) -> None:
    """make(same_shape) builds the kernel function; 1 and 6 need equal shapes, 8+ broadcast. A single
    input is returned itself (views). rank: @kernel's fact."""
    @kernel(op, since=1, views=True, rank=rank)
    def v1(*, consumed_inputs=None):
        return make(True)

    @kernel(op, since=6, views=True, rank=rank)
    def v6():
        return make(True)

    @kernel(op, since=(8, 12, 13) if op in ("Max", "Min") else (8, 13), views=True, rank=rank)
    def v8():
        return make(False)


_register("Max", lambda same_shape: _fold(np.maximum, same_shape), "broadcast")
_register("Min", lambda same_shape: _fold(np.minimum, same_shape), "broadcast")
_register("Sum", lambda same_shape: _mean(same_shape, False), "broadcast")
_register("Mean", lambda same_shape: _mean(same_shape, True))
