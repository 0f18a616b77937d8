"""Helpers shared by the ai.onnx.ml model operators (trees, SVMs, linear models).

- post_transform: the names (string attribute of the older ops, int enumeration of TreeEnsemble-5)
  checked once in a factory (transform_name), and the transforms of [N, E] scores (post_transform):
  NONE, SOFTMAX, LOGISTIC, SOFTMAX_ZERO, PROBIT
- one score per sample expanded to the two columns of a binary classifier: binary_scores
- class labels (classlabels_int64s / classlabels_ints / classlabels_strings): class_labels, and
  the labels of argmax indices: label_picker
- the input as a [N, F] matrix in the type the math runs in: features_2d
- one row's top class and SOFTMAX on Python floats (batch 1): row_top_softmax
- a sum or max over each row of few columns, column by column: row_reduce
"""
from __future__ import annotations

import math

import numpy as np

from ...errors import InvalidValueError

_F32 = np.dtype(np.float32)
TRANSFORMS = ("NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT")  # TreeEnsemble-5 numbers them 0..4


def transform_name(value) -> str:
    """post_transform given as a name ('NONE', ...) or as TreeEnsemble-5's number; ValueError otherwise."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        if not 0 <= value < len(TRANSFORMS):
            raise ValueError(f"post_transform must be in [0, {len(TRANSFORMS) - 1}], got {value}")
        return TRANSFORMS[value]
    if value not in TRANSFORMS:
        raise ValueError(f"post_transform must be one of {', '.join(TRANSFORMS)}, got {value!r}")
    return value


def logistic(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)) without overflow warnings for large |x|."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


# Acklam's rational approximation of the standard normal quantile (relative error < 1.2e-9).
_A = (-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02, 1.383577518672690e+02,
      -3.066479806614716e+01, 2.506628277459239e+00)
_B = (-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02, 6.680131188771972e+01,
      -1.328068155288572e+01, 1.0)
_C = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00, -2.549671029745264e+00,
      4.374664141464968e+00, 2.938163982698783e+00)
_D = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00, 3.754408661907416e+00, 1.0)


def _poly(coefs, x):
    out = np.zeros_like(x)
    for c in coefs:
        out = out * x + c
    return out


def probit(p: np.ndarray) -> np.ndarray:
    """The standard normal quantile sqrt(2) * erfinv(2p - 1): -inf at 0, +inf at 1, NaN outside [0, 1]."""
    p = np.asarray(p, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = p - 0.5
        r = q * q
        central = q * _poly(_A, r) / _poly(_B, r)
        t = np.sqrt(-2 * np.log(np.minimum(p, 1 - p)))
        tail = _poly(_C, t) / _poly(_D, t)
        out = np.where(np.abs(q) <= 0.5 - 0.02425, central, np.where(q < 0, tail, -tail))
    out = np.where(p == 0, -np.inf, np.where(p == 1, np.inf, out))
    return np.where((p < 0) | (p > 1) | np.isnan(p), np.nan, out)


def _softmax(s: np.ndarray) -> np.ndarray:
    if s.shape[0] == 1:
        # one row (batch 1): whole-array reductions over the same contiguous elements, the same
        # result; ~2 us less than two keepdims reductions on a [1, 3] row (measured under load). Up to
        # 16 scores, the shift is Python's max of the row (exact, as numpy's; a NaN makes every output
        # NaN either way): 3 scores 0.5 vs 1.5 us, 16 0.9 vs 1.5, even at 32 (under load)
        e = s - (max(*s.tolist()) if s.size <= 16 else s.max())
        np.exp(e, out=e)
        e /= e.sum()
        return e
    e = s - row_reduce(np.maximum, s)
    np.exp(e, out=e)
    e /= row_reduce(np.add, e)
    return e


# Rows of fewer than this many values are reduced column by column (row_reduce): numpy adds fewer than
# 8 values of a row left to right (its pairwise-sum block), as the columns are added here, the same bits
# (tested), and a max is exact in any order. [1000, 3] float32: max 44 -> 3.3 us, sum 21 -> 2.7 us
# (fastest calls, under load)
_NARROW = 8


def row_reduce(ufunc, s: np.ndarray) -> np.ndarray:
    """ufunc (np.add, np.maximum) reduced over the last axis of s [..., K] (K kept as 1), as
    ufunc.reduce(s, axis=-1, keepdims=True) computes it, except that a sum of zeros may be -0.0 where
    numpy's is 0.0 (sums of non-negative values only, then)."""
    k = s.shape[-1] if s.ndim else 0
    if not 2 <= k < _NARROW or s.size < 2 * k:
        return ufunc.reduce(s, axis=-1, keepdims=True)
    out = ufunc(s[..., 0:1], s[..., 1:2])
    for j in range(2, k):                          # (the columns: fewer than _NARROW)
        ufunc(out, s[..., j:j + 1], out=out)
    return out


def _softmax_zero(s: np.ndarray) -> np.ndarray:
    """Softmax over the non-zero scores of each row; zero scores stay zero (a row of zeros stays zeros)."""
    nonzero = s != 0
    top = np.where(nonzero, s, -np.inf).max(axis=1, keepdims=True)
    e = np.where(nonzero, np.exp(s - np.where(np.isfinite(top), top, 0)), 0)
    total = e.sum(axis=1, keepdims=True)
    return e / np.where(total == 0, 1, total)


# One row of at most this many scores: its top class and SOFTMAX on Python floats (row_top_softmax),
# not numpy calls: argmax, softmax and float32 result of 3 scores 4.2 vs 8.5 us, 16 7.3 vs 8.4, 32 6.8
# vs 5.5 (CPU time per call, under load)
ROW_SCORES = 16
_exp, _isfinite = math.exp, math.isfinite


def row_top_softmax(v: list) -> tuple[int, np.ndarray] | None:
    """One row's scores v (Python floats, at most ROW_SCORES): (the index of its first largest score,
    as argmax; its SOFTMAX, computed in float64 and rounded once, as float32 [1, K]), or None when a
    score is NaN or the largest is infinite (then numpy's path decides)."""
    top = max(v)
    e = [_exp(a - top) for a in v]
    total = sum(e)                   # NaN when a score is NaN or top is infinite (inf - inf)
    if not _isfinite(total):
        return None
    # (the nested list given the dtype object: ~0.1 us less than a flat one and a reshape, ~0.3 less
    # than np.float32 as the type; math's functions bound once: ~0.1 us; under load)
    return v.index(top), np.array([[a / total for a in e]], _F32)


def post_transform(name: str, scores: np.ndarray) -> np.ndarray:
    """scores [N, E] transformed row by row (same float type; SOFTMAX over each row)."""
    if name == "NONE" or scores.size == 0:
        return scores
    if name == "LOGISTIC":
        return logistic(scores)
    if name == "SOFTMAX":
        return _softmax(scores)
    if name == "SOFTMAX_ZERO":
        return _softmax_zero(scores)
    return probit(scores).astype(scores.dtype)


def binary_scores(s: np.ndarray, name: str, probability_like: bool) -> np.ndarray:
    """A binary classifier that computes one score s [N] for the second class: both columns [N, 2].

    LOGISTIC: [logistic(-s), logistic(s)]; PROBIT: [-probit(s), probit(s)] (= probit of [1-s, s]);
    otherwise [1 - s, s] when s is a probability-like score (all weights non-negative), else [-s, s],
    SOFTMAX / SOFTMAX_ZERO applied to that pair."""
    if name == "LOGISTIC":
        return np.stack([logistic(-s), logistic(s)], axis=1)
    if name == "PROBIT":
        p = probit(s).astype(s.dtype)
        return np.stack([-p, p], axis=1)
    pair = np.stack([1 - s if probability_like else -s, s], axis=1)
    return post_transform(name, pair)


def class_labels(ints, strings, what_ints: str) -> np.ndarray:
    """The class labels of a classifier: an int64 array, or an object array of str. ValueError unless
    exactly one of the two attributes is given (and non-empty)."""
    if (ints is None or len(ints) == 0) == (strings is None or len(strings) == 0):
        raise ValueError(f"exactly one of {what_ints} and classlabels_strings must be given")
    if strings:
        return np.array(list(strings), dtype=object)
    return np.array(ints, dtype=np.int64)


def label_picker(labels: np.ndarray):
    """fn(indices) -> the labels at those class indices (argmax results): the indices themselves when
    the labels are the int64 0..K-1 and the indices int64 already (a take less per call: ~0.6 us)."""
    if labels.dtype == np.int64 and np.dtype(np.intp) == np.int64 and \
            np.array_equal(labels, np.arange(labels.size)):
        return lambda indices: indices
    return labels.take


_DIRECT = (_F32, np.dtype(np.float64))


def features_2d(x: np.ndarray, compute: np.dtype | None = None) -> np.ndarray:
    """X [N, F] (a 1-D X is one sample; higher ranks flatten after the first axis), converted to the
    float type the math runs in: float64 for double input, else float32 (unless `compute` is given)."""
    if x.ndim == 2 and compute is None and x.dtype in _DIRECT:     # the usual case, at no cost
        return x
    if x.ndim == 0:
        raise InvalidValueError("X must have at least one dimension, got a scalar")
    x2 = x.reshape(1, -1) if x.ndim == 1 else x.reshape(x.shape[0], math.prod(x.shape[1:]))
    dt = compute or (np.dtype(np.float64) if x.dtype == np.float64 else np.dtype(np.float32))
    return x2.astype(dt, copy=False)
