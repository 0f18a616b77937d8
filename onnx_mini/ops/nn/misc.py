"""Dropout, Flatten and Shrink (every version).

Dropout in inference mode returns its input itself (no copy) and an all-kept mask. In training mode
an element is kept when a uniform draw in [0, 1) is >= ratio, and kept values are scaled by
1 / (1 - ratio). The draws come from numpy's RandomState seeded with the `seed` attribute (its low 32
bits) when given, which reproduces the official test data, else from a freshly seeded Generator;
the generator lives with the node, so successive runs draw new masks.
Flatten returns a 2-D view.
"""
from __future__ import annotations

import math

import numpy as np

from ...errors import InvalidValueError
from ...registry import kernel
from .._common import UPCAST, upcast


# -- Dropout -------------------------------------------------------------------------------------

def _keep_all(x: np.ndarray, n_outputs: int, mask_type):
    """Inference: (X itself, all-kept mask of mask_type (X's type when None))."""
    if n_outputs < 2:
        return (x,)
    return x, np.ones(x.shape, x.dtype if mask_type is None else mask_type)


def _random_dropout(x: np.ndarray, ratio: float, rng, n_outputs: int, mask_type):
    if not 0 <= ratio < 1:
        raise InvalidValueError(f"ratio must be in [0, 1), got {ratio}")
    if ratio == 0:
        return _keep_all(x, n_outputs, mask_type)
    keep = rng.uniform(0.0, 1.0, x.shape) >= ratio
    xf = upcast(x)
    one = xf.dtype.type(1)
    y = xf * (one / (one - xf.dtype.type(ratio)))       # output = scale * data * mask
    y *= keep
    y = y.astype(x.dtype, copy=False)
    if n_outputs < 2:
        return (y,)
    return y, keep if mask_type is np.bool_ else keep.astype(x.dtype if mask_type is None else mask_type)


def _generator(seed):
    return np.random.default_rng() if seed is None else np.random.RandomState(int(seed) & 0xFFFFFFFF)


def _dropout_attr(ratio: float, training: bool, n_outputs: int, mask_type):
    """Opsets 1-10: ratio is an attribute; training only for opsets 1/6 with is_test=0."""
    if not training:
        return lambda x: _keep_all(x, n_outputs, mask_type)
    if not 0 <= ratio < 1:
        raise ValueError(f"ratio must be in [0, 1), got {ratio}")
    rng = _generator(None)
    return lambda x: _random_dropout(x, ratio, rng, n_outputs, mask_type)


@kernel("Dropout", since=1, foldable=False, views=True, rank="first")
def dropout_1(*, is_test=0, ratio=0.5, consumed_inputs=None, _n_outputs=1):
    return _dropout_attr(ratio, not is_test, _n_outputs, None)


@kernel("Dropout", since=6, foldable=False, views=True, rank="first")
def dropout_6(*, is_test=0, ratio=0.5, _n_outputs=1):
    return _dropout_attr(ratio, not is_test, _n_outputs, None)


@kernel("Dropout", since=(7, 10), foldable=False, views=True, rank="first")
def dropout_7(*, ratio=0.5, _n_outputs=1, _version):
    # no training mode: Y = X; the mask is of X's type in 7, bool from 10
    return _dropout_attr(ratio, False, _n_outputs, np.bool_ if _version >= 10 else None)


def _scalar(v: np.ndarray, name: str):
    if v.size != 1:
        raise InvalidValueError(f"{name} must be a scalar, got shape {list(v.shape)}")
    return v.reshape(()).astype(np.float64).item() if v.dtype in UPCAST else v.reshape(()).item()


@kernel("Dropout", since=(12, 13, 22), foldable=False, views=True, rank="first")
def dropout_12(*, seed=None, _n_outputs=1):
    rng = _generator(seed)

    def run(data, ratio=None, training_mode=None):
        if training_mode is None or not _scalar(training_mode, "training_mode"):
            return _keep_all(data, _n_outputs, np.bool_)        # ratio is ignored
        r = 0.5 if ratio is None else float(_scalar(ratio, "ratio"))
        return _random_dropout(data, r, rng, _n_outputs, np.bool_)

    return run


# -- Flatten -------------------------------------------------------------------------------------

def _flatten(axis: int):
    def run(x):
        r = x.ndim
        if not -r <= axis <= r:
            raise InvalidValueError(f"axis {axis} is out of range for a tensor of rank {r} "
                                    f"(accepted: [{-r}, {r}])")
        a = axis + r if axis < 0 else axis
        return x.reshape(math.prod(x.shape[:a]), math.prod(x.shape[a:]))    # a view
    return run


@kernel("Flatten", since=(1, 9), views=True)
def flatten_1(*, axis=1):
    if axis < 0:
        raise ValueError(f"axis must be >= 0 before opset 11, got {axis}")
    return _flatten(axis)


@kernel("Flatten", since=(11, 13, 21, 23, 24, 25), views=True)
def flatten_11(*, axis=1):
    return _flatten(axis)


# -- Shrink --------------------------------------------------------------------------------------

@kernel("Shrink", since=9)
def shrink_9(*, bias=0.0, lambd=0.5):
    """y = x + bias if x < -lambd, x - bias if x > lambd, else 0. As in the function body, lambd and
    bias are first cast to X's type (integers: truncated toward zero, arithmetic wraps)."""
    int_lambd, int_bias = math.trunc(lambd), math.trunc(bias)

    def run(x):
        if x.dtype.kind in "iu":
            b = np.array(int_bias).astype(x.dtype)
            lo, hi = x < -int_lambd, x > int_lambd     # exact comparisons with Python ints
            return np.where(lo, x + b, np.where(hi, x - b, x.dtype.type(0)))
        dt = x.dtype
        xf = upcast(x)
        lam = np.array(lambd, dtype=dt).astype(xf.dtype)
        b = np.array(bias, dtype=dt).astype(xf.dtype)
        y = np.where(xf < -lam, xf + b, np.where(xf > lam, xf - b, xf.dtype.type(0)))
        return y.astype(dt, copy=False)

    return run
