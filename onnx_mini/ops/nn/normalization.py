"""Normalization operators: BatchNormalization, InstanceNormalization, LayerNormalization,
GroupNormalization, RMSNormalization, LRN, LpNormalization, MeanVarianceNormalization (every version).

Statistics are population moments computed in two passes (mean, then the mean of the squared
deviations). float16/bfloat16 inputs are computed in float32 and rounded back once. The ops with a
`stash_type` (LayerNormalization, GroupNormalization-21, RMSNormalization) compute their first stage
in the stash type as their function bodies do: in float32 or float64 directly, and for a low-precision
stash type in float32 with each step rounded to that type; the second stage (scale, bias) is computed
in the output's type (float32 for low-precision types, rounded once).
"""
from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ...dtypes import np_dtype
from ...errors import InvalidValueError
from ...registry import kernel
from .._common import UPCAST, broadcasts_to, normalize_axis, upcast


# -- shared helpers ------------------------------------------------------------------------------

def _same(a):
    return a


def _compute_type(*arrays) -> np.dtype:
    """The float type wide enough for every array: float32 for low-precision types, else the widest."""
    return np.result_type(*(np.float32 if a.dtype in UPCAST else a.dtype for a in arrays))


def _moments(xf: np.ndarray, axes: tuple, rnd=_same):
    """-> (mean, xf - mean, population variance) over `axes`, mean and variance keeping those axes as 1.
    rnd rounds each intermediate result (to a low-precision stash type; identity otherwise)."""
    n = max(math.prod(xf.shape[a] for a in axes), 1)     # sum / n: no warning on empty slices
    mean = rnd(xf.sum(axis=axes, keepdims=True) / n)
    d = rnd(xf - mean)
    var = rnd(rnd(d * d).sum(axis=axes, keepdims=True) / n)
    return mean, d, var


_STASH_NAMES = {1: "float", 10: "float16", 11: "double", 16: "bfloat16"}


def _stash(stash_type: int, allowed):
    """-> (compute dtype, rounding function, stash dtype) for a stash_type attribute (ValueError if not allowed)."""
    if stash_type not in allowed:
        names = ", ".join(f"{k} ({_STASH_NAMES[k]})" for k in sorted(allowed))
        raise ValueError(f"stash_type must be one of {names}, got {stash_type}")
    stash = np_dtype(stash_type)
    if stash in UPCAST:
        return np.dtype(np.float32), (lambda a: a.astype(stash).astype(np.float32)), stash
    return stash, _same, stash


def _broadcastable(name: str, p: np.ndarray, shape: tuple) -> None:
    """p must broadcast to `shape` without changing it (unidirectional broadcasting)."""
    # X's trailing dimensions (the usual scale and bias) answered first: broadcasts_to's
    # np.broadcast_shapes costs ~3.4 us a call here
    if p.shape != shape[len(shape) - p.ndim:] and not broadcasts_to(p.shape, shape):
        raise InvalidValueError(f"{name} of shape {list(p.shape)} is not unidirectionally broadcastable "
                                f"to X of shape {list(shape)}")


def _stage_two(normalized: np.ndarray, dtype: np.dtype, scale: np.ndarray, bias=None) -> np.ndarray:
    """normalized cast to `dtype` (the output type), times scale, plus bias (all broadcast), computed
    in float32 for low-precision types and rounded back once."""
    n = normalized.astype(dtype, copy=False)
    y = upcast(n) * upcast(scale)
    if bias is not None:
        y = y + upcast(bias)
    return y.astype(dtype, copy=False)


def _channel_param(name: str, p: np.ndarray, x: np.ndarray, per_activation: bool) -> np.ndarray:
    """A per-channel parameter of shape (C) (or (C, D1, ..., Dn) when per_activation), reshaped to
    broadcast against X (N, C, D1, ..., Dn) from axis 1."""
    shape = x.shape[1:2]
    if p.shape != shape and not (per_activation and p.shape == x.shape[1:]):
        want = f"{list(shape)}" + (f" or {list(x.shape[1:])}" if per_activation and x.ndim > 2 else "")
        raise InvalidValueError(f"{name} has shape {list(p.shape)}, expected {want} for X of shape "
                                f"{list(x.shape)}")
    return p.reshape(p.shape + (1,) * (x.ndim - 1 - p.ndim))


def _need_channels(x: np.ndarray, op: str) -> None:
    if x.ndim < 2:
        raise InvalidValueError(f"{op} needs an input of rank >= 2 (N x C x ...), got shape {list(x.shape)}")


# -- BatchNormalization --------------------------------------------------------------------------

def _batch_norm(epsilon: float, momentum: float, training: bool, spatial: bool, n_outputs: int, legacy: bool):
    """Inference: Y = (X - mean) / sqrt(var + epsilon) * scale + B, on axis 1.
    Training: the batch's mean and population variance replace mean/var for Y; the outputs are
    Y, running mean, running var (input * momentum + batch * (1 - momentum)) and, before opset 14
    (legacy), the batch's mean and variance (saved_mean, saved_var). Statistics are over every axis
    but 1 (spatial), or over axis 0 only (spatial=0, per activation)."""
    axes_of = (lambda nd: (0,)) if not spatial else (lambda nd: (0, *range(2, nd)))

    def run(x, scale, b, mean, var):
        _need_channels(x, "BatchNormalization")
        s, bb, m, v = (_channel_param(name, p, x, not spatial)
                       for name, p in (("scale", scale), ("B", b), ("mean", mean), ("var", var)))
        ct = _compute_type(x, scale, b, mean, var)
        xf = x.astype(ct, copy=False)
        if training:
            if not spatial and not mean.shape == var.shape == x.shape[1:]:
                raise InvalidValueError(f"with spatial=0, training needs mean and var of shape {list(x.shape[1:])}, "
                                        f"got {list(mean.shape)} and {list(var.shape)}")
            cur_mean, d, cur_var = _moments(xf, axes_of(x.ndim))
            d *= s.astype(ct, copy=False) / np.sqrt(cur_var + epsilon)     # d is a fresh array
            d += bb.astype(ct, copy=False)
            y = d.astype(x.dtype, copy=False)
            if n_outputs == 1:
                return (y,)
            cur_mean, cur_var = cur_mean.reshape(mean.shape), cur_var.reshape(var.shape)
            run_mean = mean.astype(ct, copy=False) * momentum + cur_mean * (1 - momentum)
            run_var = var.astype(ct, copy=False) * momentum + cur_var * (1 - momentum)
            outs = (y, run_mean.astype(mean.dtype, copy=False), run_var.astype(var.dtype, copy=False))
            if legacy:
                outs += (cur_mean.astype(mean.dtype, copy=False), cur_var.astype(var.dtype, copy=False))
            return outs[:n_outputs]
        # (x - mean) * a + B with a = scale / sqrt(var + eps), as x * a + (B - mean * a): the per-channel
        # vectors are folded first so the tensor itself is read once and written once.
        a = s.astype(ct, copy=False) / np.sqrt(v.astype(ct, copy=False) + epsilon)
        y = np.multiply(xf, a)
        y += bb.astype(ct, copy=False) - m.astype(ct, copy=False) * a
        return (y.astype(x.dtype, copy=False),)

    return run


@kernel("BatchNormalization", since=1, rank="first")
def batch_normalization_1(*, consumed_inputs=None, epsilon=1e-5, is_test=0, momentum=0.9, spatial=1,
                          _n_outputs=1):
    return batch_normalization_6(epsilon=epsilon, is_test=is_test, momentum=momentum, spatial=spatial,
                                 _n_outputs=_n_outputs)


@kernel("BatchNormalization", since=6, rank="first")
def batch_normalization_6(*, epsilon=1e-5, is_test=0, momentum=0.9, spatial=1, _n_outputs=1):
    # is_test=0 is training mode: Y uses the batch statistics.
    return _batch_norm(epsilon, momentum, not is_test, bool(spatial), _n_outputs, legacy=True)


@kernel("BatchNormalization", since=7, rank="first")
def batch_normalization_7(*, epsilon=1e-5, momentum=0.9, spatial=1, _n_outputs=1):
    # Training mode is told by the outputs: Y alone is test mode.
    return _batch_norm(epsilon, momentum, _n_outputs > 1, bool(spatial), _n_outputs, legacy=True)


@kernel("BatchNormalization", since=9, rank="first")
def batch_normalization_9(*, epsilon=1e-5, momentum=0.9, _n_outputs=1):
    return _batch_norm(epsilon, momentum, _n_outputs > 1, True, _n_outputs, legacy=True)


@kernel("BatchNormalization", since=(14, 15), rank="first")
def batch_normalization_14(*, epsilon=1e-5, momentum=0.9, training_mode=0, _n_outputs=1):
    if not training_mode and _n_outputs > 1:
        raise ValueError(f"with training_mode=0 BatchNormalization has one output (Y), got {_n_outputs}")
    return _batch_norm(epsilon, momentum, bool(training_mode), True, _n_outputs, legacy=False)


# -- InstanceNormalization -----------------------------------------------------------------------

def _instance_norm(epsilon: float):
    def run(x, scale, b):
        _need_channels(x, "InstanceNormalization")
        s, bb = _channel_param("scale", scale, x, False), _channel_param("B", b, x, False)
        ct = _compute_type(x, scale, b)
        _, d, var = _moments(x.astype(ct, copy=False), tuple(range(2, x.ndim)))
        d *= s.astype(ct, copy=False) / np.sqrt(var + epsilon)      # (N, C, 1, ...); d is a fresh array
        d += bb.astype(ct, copy=False)
        return d.astype(x.dtype, copy=False)
    return run


@kernel("InstanceNormalization", since=1, rank="first")
def instance_normalization_1(*, epsilon=1e-5, consumed_inputs=None):
    return _instance_norm(epsilon)


@kernel("InstanceNormalization", since=(6, 22), rank="first")
def instance_normalization_6(*, epsilon=1e-5):
    return _instance_norm(epsilon)


# -- LayerNormalization, RMSNormalization --------------------------------------------------------

@kernel("LayerNormalization", since=17, rank="first")
def layer_normalization_17(*, axis=-1, epsilon=1e-5, stash_type=1, _n_outputs=1):
    cd, rnd, stash = _stash(stash_type, (1, 16))

    def run(x, scale, b=None):
        ax = normalize_axis(axis, x.ndim)
        _broadcastable("Scale", scale, x.shape)
        if b is not None:
            _broadcastable("B", b, x.shape)
        same = x.dtype == cd == scale.dtype and rnd is _same and (b is None or b.dtype == cd)
        if same and ax == x.ndim - 1 and x.size:
            mean, d, var = _last_axis_moments(x)
        else:
            mean, d, var = _moments(rnd(x.astype(cd, copy=False)), tuple(range(ax, x.ndim)), rnd)
        inv_std = rnd(1 / rnd(np.sqrt(rnd(var + epsilon))))      # the spec's Reciprocal, then Mul
        if same:
            # everything in X's type: the same operations in place on d, our own buffer (three
            # fewer allocations; float32 [1, 128, 256]: 66 against 82 us, [1, 1, 896]: 22 against
            # 32 us, with the _broadcastable fast path; measured under load)
            np.multiply(d, inv_std, out=d)
            np.multiply(d, scale, out=d)
            if b is not None:
                np.add(d, b, out=d)
            y = d
        else:
            y = _stage_two(rnd(d * inv_std), x.dtype, scale, b)
        if _n_outputs == 1:
            return (y,)
        return (y, mean.astype(stash), inv_std.astype(stash))[:_n_outputs]

    return run


# from 16 rows: one row of 896 took ~15.2 us by the product against ~13.8 by x.sum; 128 rows of 256
# ~49 against ~55 us (the whole LayerNormalization kernel), attention's scores [1, 4, 128, 128] ~6.6
# against ~25 us (measured under load)
_SUMS_BY_PRODUCT = 16
_BLAS_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def last_axis_sums(x: np.ndarray) -> np.ndarray:
    """x summed over its last axis, kept as an axis of 1: float32/float64 from 16 rows on as one
    product with a vector of ones (BLAS's matrix-vector product, ~4x faster than numpy's row sums),
    numpy's sums otherwise; each sum accumulates in x's type either way."""
    n = x.shape[-1]
    if x.size >= _SUMS_BY_PRODUCT * n and n and x.dtype in _BLAS_FLOATS:
        return np.matmul(x, np.ones(n, x.dtype))[..., None]
    return np.add.reduce(x, axis=-1, keepdims=True)


def _last_axis_moments(x: np.ndarray):
    """_moments over the last axis alone: the row sums by last_axis_sums, the squared deviations
    summed by one dot product a row (no d * d temporary; float32 [1, 128, 256]: ~5.6 against ~19 us
    for the square and the sum, measured under load)."""
    n = x.shape[-1]
    mean = last_axis_sums(x)
    mean /= n
    d = np.subtract(x, mean)
    return mean, d, (_vecdot(d, d) / n)[..., None]


def _vecdot_einsum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.einsum("...i,...i->...", a, b)


_vecdot = getattr(np, "vecdot", _vecdot_einsum)         # numpy >= 2.0


@kernel("RMSNormalization", since=23)
def rms_normalization_23(*, axis=-1, epsilon=1e-5, stash_type=1):
    cd, rnd, _ = _stash(stash_type, (1, 10, 11, 16))

    def run(x, scale):
        ax = normalize_axis(axis, x.ndim)
        _broadcastable("scale", scale, x.shape)
        axes = tuple(range(ax, x.ndim))
        xu = rnd(x.astype(cd, copy=False))
        n = max(math.prod(x.shape[ax:]), 1)
        rms = rnd(np.sqrt(rnd(rnd(rnd(xu * xu).sum(axis=axes, keepdims=True) / n) + epsilon)))
        return _stage_two(rnd(xu / rms), scale.dtype, scale)     # Y has scale's type (V)

    return run


# -- GroupNormalization --------------------------------------------------------------------------

def _group_norm(num_groups: int, epsilon: float, stash_type, per_channel: bool):
    """Mean and variance per (instance, group of C / num_groups channels). Opset 18: scale/bias per
    group, computed in X's type; 21: per channel, stage one in the stash type."""
    if num_groups < 1:
        raise ValueError(f"num_groups must be positive, got {num_groups}")
    stash = _stash(stash_type, (1, 10, 11, 16)) if per_channel else None

    def run(x, scale, bias):
        _need_channels(x, "GroupNormalization")
        n, c = x.shape[:2]
        if c % num_groups:
            raise InvalidValueError(f"the number of channels {c} is not divisible by num_groups={num_groups}")
        want = (c,) if per_channel else (num_groups,)
        for name, p in (("scale", scale), ("bias", bias)):
            if p.shape != want:
                raise InvalidValueError(f"{name} has shape {list(p.shape)}, expected {list(want)} "
                                        f"({'channels' if per_channel else 'num_groups'})")
        grouped = x.reshape(n, num_groups, math.prod(x.shape[1:]) // num_groups)
        if per_channel:
            cd, rnd, _ = stash
            _, d, var = _moments(rnd(grouped.astype(cd, copy=False)), (2,), rnd)
            normalized = rnd(d / rnd(np.sqrt(rnd(var + epsilon)))).reshape(n, c, math.prod(x.shape[2:]))
            y = _stage_two(normalized, x.dtype, scale.reshape(c, 1), bias.reshape(c, 1))
        else:
            ct = _compute_type(x, scale, bias)
            _, d, var = _moments(grouped.astype(ct, copy=False), (2,))
            a = scale.astype(ct).reshape(num_groups, 1) / np.sqrt(var + epsilon)
            y = (d * a + bias.astype(ct).reshape(num_groups, 1)).astype(x.dtype, copy=False)
        return y.reshape(x.shape)

    return run


@kernel("GroupNormalization", since=18)
def group_normalization_18(*, num_groups, epsilon=1e-5):
    return _group_norm(num_groups, epsilon, None, per_channel=False)


@kernel("GroupNormalization", since=21)
def group_normalization_21(*, num_groups, epsilon=1e-5, stash_type=1):
    return _group_norm(num_groups, epsilon, stash_type, per_channel=True)


# -- LRN -----------------------------------------------------------------------------------------

@kernel("LRN", since=(1, 13), rank="first")
def lrn_1(*, size, alpha=1e-4, beta=0.75, bias=1.0):
    """Y = X / (bias + alpha / size * square_sum) ** beta, square_sum over the channel window
    [c - floor((size - 1) / 2), c + ceil((size - 1) / 2)] clipped to [0, C - 1]."""
    if size < 1:
        raise ValueError(f"size must be positive, got {size}")
    before = (size - 1) // 2
    after = size - 1 - before
    k = alpha / size

    def run(x):
        _need_channels(x, "LRN")
        xf = upcast(x)
        pads = [(0, 0)] * x.ndim
        pads[1] = (before, after)
        windows = sliding_window_view(np.pad(xf * xf, pads), size, axis=1)   # (N, C, ..., size)
        square_sum = windows.sum(axis=-1)
        return (xf / (bias + k * square_sum) ** beta).astype(x.dtype, copy=False)

    return run


# -- LpNormalization -----------------------------------------------------------------------------

@kernel("LpNormalization", since=(1, 22))
def lp_normalization_1(*, axis=-1, p=2):
    if p not in (1, 2):
        raise ValueError(f"p must be 1 or 2, got {p}")

    def run(x):
        ax = normalize_axis(axis, x.ndim)
        xf = upcast(x)
        norm = np.abs(xf).sum(axis=ax, keepdims=True) if p == 1 else np.sqrt((xf * xf).sum(axis=ax, keepdims=True))
        with np.errstate(invalid="ignore", divide="ignore"):
            y = xf / norm
        return np.where(norm == 0, 0, y).astype(x.dtype, copy=False)    # a zero norm gives 0

    return run


# -- MeanVarianceNormalization -------------------------------------------------------------------

@kernel("MeanVarianceNormalization", since=(9, 13))
def mean_variance_normalization_9(*, axes=(0, 2, 3)):
    """Y = (X - E[X]) / (sqrt(E[(X - E[X])^2]) + 1e-9) over `axes` (an empty list: every axis); the
    1e-9 is the function body's."""
    requested = [int(a) for a in axes]

    def run(x):
        picked = {normalize_axis(a, x.ndim, "axes") for a in requested} if requested else set(range(x.ndim))
        if len(picked) != len(requested) and requested:
            raise InvalidValueError(f"axes {requested} repeat an axis of the rank-{x.ndim} input")
        xf = upcast(x)
        _, d, var = _moments(xf, tuple(sorted(picked)))
        with np.errstate(invalid="ignore", divide="ignore"):
            y = d / (np.sqrt(var) + 1e-9)
        return y.astype(x.dtype, copy=False)

    return run
