"""Losses: NegativeLogLikelihoodLoss (12, 13, 22) and SoftmaxCrossEntropyLoss (12, 13).

Both have function bodies that depend on the input types, so they run as kernels. Shapes: input
(N, C, d1, ..., dk), target (N, d1, ..., dk). A target equal to ignore_index contributes 0 and has
weight 0, so 'mean' divides by the summed weight (or count) of the targets that are not ignored.
"""
from __future__ import annotations

import math

import numpy as np

from ...errors import InvalidValueError
from ...registry import kernel
from .._common import UPCAST, as_array
from .softmax import log_softmax

REDUCTIONS = ("none", "sum", "mean")


def _check_reduction(reduction: str) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")


def nll_loss(logp: np.ndarray, target: np.ndarray, weight, reduction: str, ignore_index) -> np.ndarray:
    """-logp[n, target[n, d...], d...] (times weight[target]), reduced. logp is float32/float64."""
    if logp.ndim < 2:
        raise InvalidValueError(f"input must have shape (N, C, d1, ...), got {list(logp.shape)}")
    n, c = logp.shape[:2]
    if target.shape != (n,) + logp.shape[2:]:
        raise InvalidValueError(f"target of shape {list(target.shape)} does not match input of shape "
                                f"{list(logp.shape)} (expected {[n, *logp.shape[2:]]})")
    if target.dtype.kind not in "iu":
        raise InvalidValueError(f"target must be int32 or int64, got {target.dtype}")
    if weight is not None and weight.shape != (c,):
        raise InvalidValueError(f"weight must have shape [{c}], got {list(weight.shape)}")
    valid = None if ignore_index is None else target != ignore_index
    t = target if valid is None else np.where(valid, target, 0)
    if t.size and (t.min() < 0 or t.max() >= c):
        bad = t[(t < 0) | (t >= c)].flat[0]
        raise InvalidValueError(f"target value {bad} is out of range [0, {c})"
                                + ("" if ignore_index is None else f" and is not ignore_index {ignore_index}"))
    d = math.prod(logp.shape[2:])
    flat = (np.arange(n).reshape(n, 1) * c + t.reshape(n, d).astype(np.int64)) * d + np.arange(d)
    loss = np.negative(np.ravel(logp).take(flat.reshape(target.shape)))
    if weight is not None:
        w = weight.take(t)
        if valid is not None:
            w[~valid] = 0
    elif valid is not None:
        w = valid.astype(logp.dtype)
    else:
        w = None
    if valid is not None:
        loss[~valid] = 0          # not a product: an ignored entry stays 0 whatever its input
    if weight is not None:
        loss *= w
    if reduction == "none":
        return loss
    if reduction == "sum":
        return as_array(loss.sum())
    return as_array(loss.mean() if w is None else loss.sum() / w.sum())


def _low_precision(x, *others):
    """(float32 copies of x and the same-typed others, or the arrays themselves; the dtype to return)."""
    dt = x.dtype
    for o in others:
        if o is not None and o.dtype != dt:
            raise InvalidValueError(f"weights must have the input's type {dt}, got {o.dtype}")
    if dt in UPCAST:
        return x.astype(np.float32), [o if o is None else o.astype(np.float32) for o in others], dt
    return x, list(others), dt


@kernel("NegativeLogLikelihoodLoss", since=(12, 13, 22))
def nll_loss_12(*, reduction="mean", ignore_index=None):
    _check_reduction(reduction)

    def run(input, target, weight=None):
        x, (w,), dt = _low_precision(input, weight)
        return nll_loss(x, target, w, reduction, ignore_index).astype(dt, copy=False)

    return run


@kernel("SoftmaxCrossEntropyLoss", since=(12, 13))
def softmax_cross_entropy_loss_12(*, reduction="mean", ignore_index=None):
    _check_reduction(reduction)

    def run(scores, labels, weights=None):
        if scores.ndim < 2:
            raise InvalidValueError(f"scores must have shape (N, C, d1, ...), got {list(scores.shape)}")
        x, (w,), dt = _low_precision(scores, weights)
        logp = log_softmax(x, 1)
        loss = nll_loss(logp, labels, w, reduction, ignore_index)
        return loss.astype(dt, copy=False), logp.astype(dt, copy=False)

    return run
