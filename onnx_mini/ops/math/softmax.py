"""Softmax family: Softmax, LogSoftmax, Hardmax (every version).

Versions 1 and 11 coerce the input to 2-D at `axis` ([a0*...*a(k-1), ak*...*a(n-1)]) and normalise each
row of that matrix; version 13 normalises along the one axis. Numerically stable (the max is
subtracted first). The low-precision floats (float16, bfloat16, ...) are computed in float32 and
rounded back once, as onnxruntime does (bit for bit on float16), for Softmax and LogSoftmax alike:
step by step in float16, as the function body reads, is up to ~8 ulp off. The exception: a float16
Softmax whose input the model casts to float16 itself runs step by step (see _computed_in_float32:
the official test_attention_4d_causal_fp16_expanded holds such data).
"""
from __future__ import annotations

import math

import numpy as np

from ...registry import kernel
from .._common import UPCAST, normalize_axis, upcast


def softmax(x: np.ndarray, axis: int) -> np.ndarray:
    """exp(x - max) / sum(exp(x - max)) along axis (x a float32/float64 array, axis >= 0)."""
    if x.size == 0:
        return np.empty_like(x)
    e = np.subtract(x, x.max(axis=axis, keepdims=True))
    np.exp(e, out=e)
    e /= e.sum(axis=axis, keepdims=True)
    return e


def log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    """x - max - log(sum(exp(x - max))) along axis."""
    if x.size == 0:
        return np.empty_like(x)
    shifted = np.subtract(x, x.max(axis=axis, keepdims=True))
    total = np.exp(shifted).sum(axis=axis, keepdims=True)
    shifted -= np.log(total, out=total)
    return shifted


def hardmax(x: np.ndarray, axis: int) -> np.ndarray:
    """1 at the first maximum along axis, 0 elsewhere (same type as x)."""
    y = np.zeros_like(x)
    if x.size:
        np.put_along_axis(y, np.argmax(upcast(x), axis=axis, keepdims=True), 1, axis=axis)
    return y


def _coerced(fn, axis: int, via_f32: frozenset):
    """Versions 1/11: fn over the flattened trailing part [a_axis, ..., a_(n-1)] of each leading index."""
    def run(x):
        k = normalize_axis(axis, x.ndim)
        dt = x.dtype
        x2 = x.reshape(math.prod(x.shape[:k]), math.prod(x.shape[k:]))
        if dt in via_f32:
            return fn(x2.astype(np.float32), 1).astype(dt).reshape(x.shape)
        return fn(x2, 1).reshape(x.shape)
    return run


def along_axis(fn, axis: int, via_f32: frozenset):
    """Version 13: fn along one axis."""
    def run(x):
        k = normalize_axis(axis, x.ndim)
        dt = x.dtype
        if dt in via_f32:
            return fn(x.astype(np.float32), k).astype(dt)
        return fn(x, k)
    return run


def _register(op: str, fn, via_f32: frozenset, rank=None) -> None:
    """op-1/11 (2-D coercion, axis default 1) and op-13 (one axis, default -1) of one of the family."""
    @kernel(op, since=(1, 11), rank=rank)
    def coerced(*, axis=1, _input_producers=()):
        return _coerced(fn, axis, _computed_in_float32(via_f32, _input_producers))

    @kernel(op, since=13, rank=rank)
    def per_axis(*, axis=-1, _input_producers=()):
        return along_axis(fn, axis, _computed_in_float32(via_f32, _input_producers))


_FLOAT16 = 10     # TensorProto.FLOAT16


def _computed_in_float32(via_f32: frozenset, producers: tuple) -> frozenset:
    """The types computed in float32 and rounded once: `via_f32`, except float16 when the model casts
    the input to float16 itself right before (Cast to=FLOAT16). That explicit cast is how Attention's
    function body states its softmax_precision; there the function body's form, each step in
    float16, is what the official data hold (test_attention_4d_causal_fp16_expanded: 2 of 192
    outputs 2 ulp off the other way)."""
    first = producers[0] if producers else None
    if first is not None and first[0] == "Cast" and first[1].get("to") == _FLOAT16:
        return via_f32 - {np.dtype(np.float16)}
    return via_f32


SOFTMAX_VIA_F32 = UPCAST      # the types Softmax computes in float32 (ops/fused.py's attention too)
_register("Softmax", softmax, SOFTMAX_VIA_F32, "first")
_register("LogSoftmax", log_softmax, UPCAST)
_register("Hardmax", hardmax, frozenset())  # argmax needs no float32 copy of the result (see hardmax)
