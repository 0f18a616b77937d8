"""Activations: Celu, Elu, Gelu, HardSigmoid, HardSwish, LeakyRelu, Mish, PRelu, Relu, Selu, Sigmoid,
Softplus, Softsign, Swish, SwiGLU, ThresholdedRelu (every version).

Many of these have schema function bodies; kernels replace them (a body is several nodes, each a
full pass and a fresh array). The math is arranged for speed on large tensors:
- every kernel allocates one or two arrays and works in place on them (a fresh array costs far more
  than a pass over one), never on an input;
- selections are min/max formulas, not np.where (slow on a random mask);
- exp only ever sees non-positive arguments (Sigmoid, Elu, Selu, Celu) or is clamped (Mish), so nothing
  overflows; Swish / SwiGLU let it overflow to inf where that gives the limit (see _swish).
float16/bfloat16 are computed in float32 and rounded back once. Attributes are float32 in ONNX, so the
defaults are the float32 values of the spec's numbers. Version 1 of several ops carries the legacy
`consumed_inputs` attribute, accepted and ignored.
"""
from __future__ import annotations

import math

import numpy as np

from ...errors import InvalidValueError
from ...registry import kernel
from .._common import (as_array, broadcasts_to, by_blocks, float32_compute, fp_errors_ignored, same_type,
                       scalar_array, with_scalar)
from .normal_cdf import gelu_float32
from .unary import erfc


def _f32(v: float) -> float:
    """The value an ONNX float attribute holding v has."""
    return float(np.float32(v))


# -- helpers shared by several ops ---------------------------------------------------------------

def _exp_linear(alpha: float, scale: float = 1.0, divisor: float | None = None):
    """x -> scale * (max(x, 0) + alpha * expm1(min(x, 0) / divisor)): Elu (scale 1, no divisor),
    Selu (scale gamma), Celu (divisor alpha)."""
    neg_scale = alpha * scale

    def run(x):
        t = with_scalar(np.minimum, x, 0)
        if divisor is not None:
            np.divide(t, divisor, out=t)
        np.expm1(t, out=t)
        t *= neg_scale
        p = with_scalar(np.maximum, x, 0)
        if scale != 1.0:
            p *= scale
        t += p
        return t
    return float32_compute(run)


def sigmoid(x: np.ndarray, alpha: float = 1.0) -> np.ndarray:
    """sigmoid(alpha * x) as a new array: (1 if z >= 0 else e) / (1 + e), e = exp(-|z|) <= 1."""
    # 0 and 1 as 0-d arrays of the type: the same comparisons and sums, ~0.7 us a call less each
    if alpha == 1.0:
        e = as_array(np.abs(x))
        pos = x >= scalar_array(x.dtype, 0)
    else:
        e = as_array(np.multiply(x, alpha))
        pos = e >= scalar_array(e.dtype, 0)
        np.abs(e, out=e)
    np.negative(e, out=e)
    np.exp(e, out=e)
    num = as_array(np.maximum(e, pos))   # 1 where z >= 0 (e <= 1 there), e elsewhere; NaN stays
    e += scalar_array(e.dtype, 1)
    num /= e
    return num


def sigmoid_of_negated(t: np.ndarray) -> None:
    """t = -x becomes sigmoid(x) = 1 / (1 + exp(t)), in place (float32 / float64 t): three SIMD passes.
    exp(t) is inf for t > 88.7 (float32) and 1 / (1 + inf) = 0 is the value: callers run it with the
    overflow warning off (the fused activations, the recurrent steps). The 1 a 0-d array of t's type:
    ~0.6 us less a call than a Python 1."""
    np.exp(t, out=t)
    np.add(t, ONES[t.dtype], out=t)
    np.reciprocal(t, out=t)


ONES = {np.dtype(t): scalar_array(np.dtype(t), 1) for t in (np.float32, np.float64)}   # 1 as a kept 0-d array


def _unidirectional(x: np.ndarray, slope: np.ndarray) -> None:
    """slope must broadcast to x's shape (ONNX unidirectional broadcasting)."""
    if not broadcasts_to(slope.shape, x.shape):
        raise InvalidValueError(f"slope of shape {list(slope.shape)} does not broadcast to X of shape "
                                f"{list(x.shape)} (unidirectional broadcasting)")


def _prelu_math(x, slope):
    t = with_scalar(np.minimum, x, 0)
    t *= slope
    t += with_scalar(np.maximum, x, 0)
    return t


_prelu = float32_compute(_prelu_math)


# -- Celu, Elu, Selu -------------------------------------------------------------------------------

@kernel("Celu", since=(12, 28))
def celu_12(*, alpha=1.0):
    if alpha == 0:
        raise ValueError("Celu: alpha must not be 0 (the formula divides by it)")
    return _exp_linear(alpha, divisor=alpha)


@kernel("Elu", since=1, rank="first")
def elu_1(*, alpha=1.0, consumed_inputs=None):
    return _exp_linear(alpha)


@kernel("Elu", since=(6, 22), rank="first")
def elu_6(*, alpha=1.0):
    return _exp_linear(alpha)


@kernel("Selu", since=1, rank="first")
def selu_1(*, alpha=_f32(1.6732), gamma=_f32(1.0507), consumed_inputs=None):
    return _exp_linear(alpha, gamma)


@kernel("Selu", since=(6, 22), rank="first")
def selu_6(*, alpha=_f32(1.67326319217681884765625), gamma=_f32(1.05070102214813232421875)):
    return _exp_linear(alpha, gamma)


# -- Gelu ------------------------------------------------------------------------------------------

def _gelu_erf(x):
    """0.5 * x * (1 + erf(x / sqrt(2))), written with erfc to keep precision for negative x (float32:
    normal_cdf.gelu_float32: a table of Phi and a short series, to 3 ulp, the left tail included; 4
    for |x| < 2^-122)."""
    if x.dtype == np.float32:
        return gelu_float32(x)
    t = erfc(np.multiply(x, -1.0 / math.sqrt(2.0)))
    if t.dtype != x.dtype:       # erfc computes in float64 for anything but float32
        t = t.astype(x.dtype)
    t *= x
    t *= 0.5
    return t


@fp_errors_ignored(over="ignore")
def _gelu_tanh(x):
    """0.5 * x * (1 + tanh(u)), u = sqrt(2 / pi) * (x + 0.044715 * x^3), computed as x / (1 + exp(-2u)):
    the same function (0.5 (1 + tanh(u)) = sigmoid(2u)), through numpy's SIMD exp rather than its
    scalar tanh (131072 float32: 0.43 against 0.78 ms), and without 1 + tanh(u)'s cancellation, which
    leaves nothing of the result below x ~ -5 (1 + tanh(u) is a multiple of 2^-24 there). exp(-2u)
    overflows to inf below x ~ -11 (its warning off): x / inf = -0, as the tanh form's 0.5 x * 0; at
    x = -inf both give NaN."""
    t = as_array(np.multiply(x, x))
    t *= 0.044715
    t += 1
    t *= x
    t *= -2.0 * math.sqrt(2.0 / math.pi)        # -2u (the factor 2 exact)
    np.exp(t, out=t)
    t += 1
    np.divide(x, t, out=t)
    return t


@kernel("Gelu", since=20, rank="first")
def gelu_20(*, approximate="none"):
    if approximate not in ("none", "tanh"):
        raise ValueError(f"Gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return float32_compute(by_blocks(_gelu_erf if approximate == "none" else _gelu_tanh))


# -- HardSigmoid, HardSwish ------------------------------------------------------------------------

def _hard_sigmoid(alpha: float, beta: float, times_x: bool = False):
    """max(0, min(1, alpha * x + beta)), times x for HardSwish: alpha * x rounded, plus beta rounded,
    then clipped, all in one new buffer."""
    def run(x):
        t = as_array(np.multiply(x, alpha))
        t += beta
        # one pass where min then max were two; NaN propagates alike. [1, 96, 56, 56] float32 here:
        # HardSigmoid ~100 against ~155 us, HardSwish ~130 against ~195 us
        np.clip(t, 0, 1, out=t)
        if times_x:
            t *= x
        return t
    return float32_compute(run)


@kernel("HardSigmoid", since=1, rank="first")
def hard_sigmoid_1(*, alpha=_f32(0.2), beta=0.5, consumed_inputs=None):
    return _hard_sigmoid(alpha, beta)


@kernel("HardSigmoid", since=(6, 22), rank="first")
def hard_sigmoid_6(*, alpha=_f32(0.2), beta=0.5):
    return _hard_sigmoid(alpha, beta)


@kernel("HardSwish", since=(14, 22), rank="first")
def hard_swish_14():
    return _hard_sigmoid(1.0 / 6.0, 0.5, times_x=True)


# -- LeakyRelu, PRelu, Relu, ThresholdedRelu -------------------------------------------------------

def _leaky_relu(alpha: float):
    """x if x >= 0 else alpha * x: max(x, alpha*x) when alpha <= 1, min(x, alpha*x) when alpha > 1."""
    pick = np.maximum if alpha <= 1 else np.minimum

    def run(x):
        t = as_array(np.multiply(x, alpha))
        pick(t, x, out=t)
        return t
    return float32_compute(run)


@kernel("LeakyRelu", since=1, rank="first")
def leaky_relu_1(*, alpha=_f32(0.01), consumed_inputs=None):
    return _leaky_relu(alpha)


@kernel("LeakyRelu", since=(6, 16), rank="first")
def leaky_relu_6(*, alpha=_f32(0.01)):
    return _leaky_relu(alpha)


def _legacy_slope(x: np.ndarray, slope: np.ndarray) -> np.ndarray:
    """PRelu-1/6: a one-element slope is shared; a 1-D slope as long as X's dim 1 is one slope per
    channel (axis 1); anything else must broadcast to X (numpy rules, unidirectional)."""
    if slope.size == 1:
        return slope.reshape(())
    if slope.ndim == 1 and x.ndim >= 2 and slope.shape[0] == x.shape[1]:
        return slope.reshape((-1,) + (1,) * (x.ndim - 2))
    _unidirectional(x, slope)
    return slope


def _prelu_legacy(x, slope):
    same_type(x, slope)
    return _prelu(x, _legacy_slope(x, slope))


@kernel("PRelu", since=1, rank="first")
def prelu_1(*, consumed_inputs=None):
    return _prelu_legacy


@kernel("PRelu", since=6, rank="first")
def prelu_6():
    return _prelu_legacy


def _prelu_7(x, slope):
    same_type(x, slope)
    _unidirectional(x, slope)
    return _prelu(x, slope)


@kernel("PRelu", since=(7, 9, 16), rank="first")
def prelu_7():
    return _prelu_7


def _relu(x):
    return with_scalar(np.maximum, x, 0)


_relu_run = float32_compute(_relu)


@kernel("Relu", since=1, rank="first")
def relu_1(*, consumed_inputs=None):
    return _relu_run


@kernel("Relu", since=(6, 13, 14), in_place=lambda x, out: with_scalar(np.maximum, x, 0, out=out), rank="first")
def relu_6():
    return _relu_run


@kernel("ThresholdedRelu", since=(10, 22))
def thresholded_relu_10(*, alpha=1.0):
    """x if x > alpha else 0 (NaN gives 0, as the function body's Where(Less(alpha, x), x, 0))."""
    if not math.isfinite(alpha):
        return float32_compute(lambda x: np.where(x > alpha, x, 0))
    floor = min(alpha, 0.0)

    def run(x):
        # fmax(x, floor) is x above alpha, finite (NaN -> floor) below; times the 0/1 mask.
        t = as_array(np.fmax(x, floor))
        t *= x > alpha
        if floor != 0:      # alpha < 0: floor * 0 is -0.0 there; make it +0
            t += 0.0
        return t
    return float32_compute(run)


# -- Mish, Sigmoid, Softplus, Softsign, Swish, SwiGLU ----------------------------------------------

def _mish(x):
    """x * tanh(softplus(x)) = x * n(n+2) / (n(n+2) + 2), n = e^x (e^x clamped at e^20, where the
    ratio is 1 in float64 already)."""
    n = with_scalar(np.minimum, x, 20)
    np.exp(n, out=n)
    p = n + 2
    p *= n
    np.add(p, 2, out=n)
    p /= n
    p *= x
    return p


@kernel("Mish", since=(18, 22))
def mish_18():
    return float32_compute(_mish)


_sigmoid_run = float32_compute(sigmoid)


@kernel("Sigmoid", since=1, rank="first")
def sigmoid_1(*, consumed_inputs=None):
    return _sigmoid_run


@kernel("Sigmoid", since=(6, 13), rank="first")
def sigmoid_6():
    return _sigmoid_run


def _softplus(x):
    """log(exp(x) + 1) = max(x, 0) + log1p(exp(-|x|)): exp never overflows. (np.logaddexp(x, 0) is the
    same formula but much slower, and warns on NaN.)"""
    t = as_array(np.abs(x))
    np.negative(t, out=t)
    np.exp(t, out=t)
    np.log1p(t, out=t)
    t += with_scalar(np.maximum, x, 0)
    return t


@kernel("Softplus", since=(1, 22))
def softplus_1():
    return float32_compute(_softplus)


def _softsign(x):
    """x / (1 + |x|)."""
    t = as_array(np.abs(x))
    t += 1
    np.divide(x, t, out=t)
    return t


@kernel("Softsign", since=(1, 22))
def softsign_1():
    return float32_compute(_softsign)


def _swish(alpha: float):
    """x / (1 + exp(-alpha * x)): 4 passes against sigmoid-then-multiply's 8 (4864 values: ~19 against
    ~25 us; 2^18: ~500-640 against ~680, measured under load), one rounding fewer. exp overflows to inf
    where the result is below ~3e-37 in magnitude: x / inf is then 0 (-inf / inf: NaN, as x * sigmoid(x)
    gives)."""
    neg = -alpha

    # the ignored overflow set by fp_errors_ignored: ~0.4 us a call, np.errstate's decorator ~1.4
    @fp_errors_ignored(over="ignore")
    def exp_scaled(x):
        t = as_array(np.multiply(x, neg) if neg != -1.0 else np.negative(x))
        np.exp(t, out=t)
        return t

    def run(x):
        t = exp_scaled(x)
        t += 1
        return np.divide(x, t, out=t)
    return run


@kernel("Swish", since=24, rank="first")
def swish_24(*, alpha=1.0):
    return float32_compute(_swish(alpha))


@kernel("SwiGLU", since=28)
def swiglu_28(*, alpha=1.0):
    """Y = Swish_alpha(A) * B; A and B of one shape (no broadcasting)."""
    swish = _swish(alpha)

    def gated(a, b):
        t = swish(a)
        t *= b
        return t
    compute = float32_compute(gated)

    def run(a, b):
        same_type(a, b)
        if a.shape != b.shape:
            raise InvalidValueError(f"SwiGLU: A of shape {list(a.shape)} and B of shape {list(b.shape)} "
                                    f"must have the same shape (no broadcasting)")
        return compute(a, b)
    return run
