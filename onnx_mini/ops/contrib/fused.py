"""com.microsoft fused element-wise and linear operators (version 1 each): Gelu, BiasGelu, FastGelu,
QuickGelu, BiasAdd, BiasSplitGelu, FusedMatMul, FusedGemm, FusedConv, NhwcConv.

The math is the standard kernels' (imported, not repeated): Gelu's erf and tanh forms and Swish from
math/activations.py, Gemm from math/matmul.py, Conv from nn/conv.py; these kernels only add the
fused bias / skip / activation around them. float16 / bfloat16 are computed in float32 and rounded
back once.
"""
from __future__ import annotations

import numpy as np

from ...errors import InvalidValueError
from ...registry import kernel
from .._common import as_array, float32_compute, same_type, upcast
from ..math.activations import (_gelu_erf, _gelu_tanh, _swish, elu_6, hard_sigmoid_6, leaky_relu_6, relu_6,
                                selu_6, sigmoid_6, softplus_1, softsign_1, thresholded_relu_10)
from ..math.matmul import _gemm, _unidirectional, matmul
from ..nn._common import check_auto_pad, text
from ..nn.conv import convolve

MS = "com.microsoft"


def _bias_last(x: np.ndarray, bias: np.ndarray, what: str = "bias") -> None:
    """bias must be 1-D with the size of x's last dimension."""
    if bias.ndim != 1 or x.ndim == 0 or bias.shape[0] != x.shape[-1]:
        raise InvalidValueError(f"{what} must be 1-D of the input's last dimension "
                                f"({x.shape[-1] if x.ndim else '?'}), got shape {list(bias.shape)}")


# -- the Gelu family -----------------------------------------------------------------------------

_gelu = float32_compute(_gelu_erf)


@kernel("Gelu", since=1, domain=MS)
def gelu_ms_1():
    return _gelu


def _biased(fn):
    """fn(x + bias) with bias of x's last dimension (computed once in the compute type)."""
    def add_then(x, bias):
        t = as_array(np.add(x, bias))
        return fn(t)
    compute = float32_compute(add_then)

    def run(x, bias):
        same_type(x, bias)
        _bias_last(x, bias)
        return compute(x, bias)
    return run


@kernel("BiasGelu", since=1, domain=MS)
def bias_gelu_1():
    return _biased(_gelu_erf)


_fast_gelu = float32_compute(_gelu_tanh)
_fast_gelu_bias = _biased(_gelu_tanh)


@kernel("FastGelu", since=1, domain=MS)
def fast_gelu_1():
    """Y = 0.5 X (1 + tanh(0.797885 X + 0.035677 X^3)), the tanh form of Gelu (sqrt(2/pi) = 0.797885,
    0.044715 sqrt(2/pi) = 0.035677), with an optional bias added to X first."""
    def run(x, bias=None):
        return _fast_gelu(x) if bias is None else _fast_gelu_bias(x, bias)
    return run


@kernel("QuickGelu", since=1, domain=MS)
def quick_gelu_1(*, alpha=float(np.float32(1.702))):
    """Y = X * sigmoid(alpha * X) (Swish with alpha)."""
    return float32_compute(_swish(float(alpha)))


@kernel("BiasAdd", since=1, domain=MS)
def bias_add_1():
    """Y = X + bias + skip; X and skip (N, S, C), bias (C)."""
    def add(x, bias, skip):
        y = as_array(np.add(x, bias))
        y += skip
        return y
    compute = float32_compute(add)

    def run(x, bias, skip):
        same_type(x, bias)
        same_type(x, skip)
        if x.ndim != 3 or skip.shape != x.shape:
            raise InvalidValueError(f"X and skip must be 3-D (N, S, C) of one shape, got {list(x.shape)} "
                                    f"and {list(skip.shape)}")
        _bias_last(x, bias)
        return compute(x, bias, skip)
    return run


@kernel("BiasSplitGelu", since=1, domain=MS)
def bias_split_gelu_1():
    """t = X + bias split in two halves on the last axis: Y = left * Gelu(right), shape (N, S, D/2)."""
    def split(x, bias):
        t = as_array(np.add(x, bias))
        half = t.shape[-1] // 2
        y = _gelu_erf(t[..., half:])
        y *= t[..., :half]
        return y
    compute = float32_compute(split)

    def run(x, bias):
        same_type(x, bias)
        if x.ndim != 3 or x.shape[-1] % 2:
            raise InvalidValueError(f"X must be 3-D (N, S, D) with an even D, got shape {list(x.shape)}")
        _bias_last(x, bias)
        return compute(x, bias)
    return run


# -- FusedMatMul ---------------------------------------------------------------------------------

def _batch_transposed(x: np.ndarray) -> np.ndarray:
    """transBatch: x is stored as (d0, batch..., last); the logical operand is (batch..., d0, last)."""
    if x.ndim < 3:
        return x
    return x.transpose(*range(1, x.ndim - 1), 0, x.ndim - 1)


@kernel("FusedMatMul", since=1, domain=MS, heavy=True)
def fused_matmul_1(*, alpha=1.0, transA=0, transB=0, transBatchA=0, transBatchB=0):
    """Y = alpha * A' @ B' (numpy matmul rules), where X' is X with its first axis moved behind the batch
    axes (transBatchX) and then its last two axes swapped (transX); 1-D operands are never transposed."""
    alpha = float(alpha)

    def operand(x, batch, trans):
        if batch:
            x = _batch_transposed(x)
        if trans and x.ndim >= 2:
            x = x.swapaxes(-1, -2)
        return x

    def product(a, b):
        y = as_array(matmul(operand(a, transBatchA, transA), operand(b, transBatchB, transB), "FusedMatMul"))
        if alpha != 1.0:
            y *= y.dtype.type(alpha)
        return y
    compute = float32_compute(product)

    def run(a, b):
        same_type(a, b)
        return compute(a, b)
    return run


# -- activations of FusedGemm / FusedConv ----------------------------------------------------------

def _clip(lo: float, hi: float):
    return float32_compute(lambda x: as_array(np.clip(x, x.dtype.type(lo), x.dtype.type(hi))))


def _scaled_tanh(alpha: float, beta: float):
    return float32_compute(lambda x: as_array(np.tanh(x * x.dtype.type(beta)) * x.dtype.type(alpha)))


def _affine(alpha: float, beta: float):
    return float32_compute(lambda x: as_array(x * x.dtype.type(alpha) + x.dtype.type(beta)))


def _parametric_softplus(alpha: float, beta: float):
    soft = softplus_1()
    return float32_compute(lambda x: as_array(soft(x * x.dtype.type(beta)) * x.dtype.type(alpha)))


_tanh = float32_compute(np.tanh)

# name -> (factory of the function from a parameter list, number of parameters, their defaults)
_ACTIVATIONS = {
    "Relu": (lambda: relu_6(), ()),
    "Tanh": (lambda: _tanh, ()),
    "Sigmoid": (lambda: sigmoid_6(), ()),
    "LeakyRelu": (lambda a: leaky_relu_6(alpha=a), (0.01,)),
    "Clip": (_clip, (float("-inf"), float("inf"))),
    "HardSigmoid": (lambda a, b: hard_sigmoid_6(alpha=a, beta=b), (0.2, 0.5)),
    "Elu": (lambda a: elu_6(alpha=a), (1.0,)),
    "Selu": (lambda a, g: selu_6(alpha=a, gamma=g), (1.67326319217681884765625, 1.05070102214813232421875)),
    "Softplus": (lambda: softplus_1(), ()),
    "Softsign": (lambda: softsign_1(), ()),
    "ThresholdedRelu": (lambda a: thresholded_relu_10(alpha=a), (1.0,)),
    "ScaledTanh": (_scaled_tanh, (1.0, 1.0)),
    "ParametricSoftplus": (_parametric_softplus, (1.0, 1.0)),
    "Affine": (_affine, (1.0, 0.0)),
}


def _activation(name, params):
    """The element-wise function of a fused activation (None for none); params fill the activation's
    parameters in order, the rest keep their defaults. ValueError for an unknown name."""
    name = text(name or "")
    if not name:
        return None
    if name not in _ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r} (known: {', '.join(_ACTIVATIONS)})")
    make, defaults = _ACTIVATIONS[name]
    values = [float(p) for p in params[:len(defaults)]] + list(defaults[len(params):])
    return make(*values)


@kernel("FusedGemm", since=1, domain=MS)
def fused_gemm_1(*, activation=None, activation_alpha=None, activation_beta=None, activation_gamma=None,
                 alpha=1.0, beta=1.0, transA=0, transB=0):
    """Y = activation(alpha * A' @ B' + beta * C); activation_alpha/beta/gamma are the activation's
    parameters in order (LeakyRelu alpha, HardSigmoid alpha and beta, ...)."""
    given = [activation_alpha, activation_beta, activation_gamma]
    while given and given[-1] is None:
        given.pop()
    if None in given:
        raise ValueError("activation_alpha / activation_beta / activation_gamma must be given in order")
    act = _activation(activation, given)
    gemm = _gemm(alpha, beta, transA, transB, _unidirectional)
    if act is None:
        return gemm

    def run(a, b, c=None):
        y = gemm(a, b, c)
        if y.dtype.kind in "iu":
            return act(y.astype(np.float64)).astype(y.dtype)
        return act(y)
    return run


# -- FusedConv, NhwcConv -------------------------------------------------------------------------

def _conv_attrs(auto_pad, group):
    auto_pad = check_auto_pad(auto_pad)
    if group < 1:
        raise ValueError(f"group must be >= 1, got {group}")
    return auto_pad


@kernel("FusedConv", since=1, domain=MS, heavy=True)
def fused_conv_1(*, activation=None, activation_params=None, auto_pad="NOTSET", dilations=None, group=1,
                 kernel_shape=None, pads=None, strides=None):
    """Y = activation(Conv(X, W, B) + Z): Conv's attributes, an optional sum Z of the output's shape
    added before the activation, activation_params the activation's parameters (Clip: min, max)."""
    auto_pad = _conv_attrs(auto_pad, group)
    act = _activation(activation, list(activation_params or []))

    def run(x, w, b=None, z=None):
        same_type(x, w)
        y = convolve(x, w, b, auto_pad, dilations, group, kernel_shape, pads, strides)
        if z is None and act is None:
            return y
        dt = y.dtype
        y = upcast(y)
        if z is not None:
            same_type(x, z)
            if z.shape != y.shape:
                raise InvalidValueError(f"Z must have the output's shape {list(y.shape)}, got {list(z.shape)}")
            y = y + upcast(z) if y.dtype != dt else np.add(y, z, out=y)
        if act is not None:
            y = act(y)
        return y.astype(dt, copy=False)
    return run


@kernel("NhwcConv", since=1, domain=MS, heavy=True)
def nhwc_conv_1(*, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """Conv on channels-last data: X (N, D1..Dn, C) -> Y (N, O1..On, M); W and B as for Conv."""
    auto_pad = _conv_attrs(auto_pad, group)

    def run(x, w, b=None):
        same_type(x, w)
        if x.ndim < 3:
            raise InvalidValueError(f"X must have rank >= 3 (N, spatial..., C), got shape {list(x.shape)}")
        first = x.transpose(0, x.ndim - 1, *range(1, x.ndim - 1))
        y = convolve(first, w, b, auto_pad, dilations, group, kernel_shape, pads, strides)
        return np.ascontiguousarray(y.transpose(0, *range(2, y.ndim), 1))
    return run

