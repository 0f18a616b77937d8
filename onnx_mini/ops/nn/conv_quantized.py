"""ConvInteger (10) and QLinearConv (10): convolutions of 8-bit integers, through Conv's float kernel.

x - x_zero_point and w - w_zero_point are small integers (|v| <= 255), so their products and every partial
sum are integers of at most 65025 * (C/group * prod(kernel)) in magnitude: float32 holds them exactly below
2^24, float64 below 2^53. The convolution runs as Conv's (BLAS) float formulation in the narrowest exact
type, and the result is converted back to integers exactly. Padding is zero after the zero-point shift
(the input is padded with its zero point). w - w_zero_point is made once at prepare when both are
constants (`ops._common.prepack`), and on every call only when they are fed at run time.
"""
from __future__ import annotations

import math

import numpy as np

from ...errors import InvalidValueError
from ...registry import kernel
from .._common import prepack
from ._common import check_auto_pad
from .conv import convolve

_EXACT_F32 = 2 ** 24


def _per_tensor_or_channel(zp, dtype, what: str, per_channel: int | None = None) -> np.ndarray:
    """A zero point or scale as a float array of shape () (from one element), or (per_channel,) when allowed."""
    if zp is None:
        return np.zeros((), dtype=dtype)
    if zp.size == 1:
        return zp.reshape(()).astype(dtype)
    if per_channel is not None and zp.shape == (per_channel,):
        return zp.astype(dtype)
    allowed = "a scalar" if per_channel is None else \
        f"a scalar or a 1-D tensor of {per_channel} (one per output channel)"
    raise InvalidValueError(f"{what} must be {allowed}, got shape {list(zp.shape)}")


def _check_8bit(a, what: str) -> None:
    if a.dtype not in (np.dtype(np.uint8), np.dtype(np.int8)):
        raise InvalidValueError(f"{what} must be uint8 or int8, got {a.dtype}")


def _shifted_weight(w, w_zero_point) -> np.ndarray:
    """w - w_zero_point as float values holding exact integers, in the narrowest type keeping the conv exact."""
    _check_8bit(w, "w")
    if w.ndim < 3:
        raise InvalidValueError(f"w must have rank >= 3 (M, C/group, spatial...), got shape {list(w.shape)}")
    m = w.shape[0]
    reduction = math.prod(w.shape[1:])
    ft = np.float32 if 255 * 255 * reduction < _EXACT_F32 else np.float64
    wzp = _per_tensor_or_channel(w_zero_point, ft, "w_zero_point", per_channel=m)
    return w.astype(ft) - wzp.reshape(wzp.shape + (1,) * (w.ndim - 1))


def _integer_conv(x, w, x_zero_point, w_zero_point, attrs, weight=_shifted_weight) -> np.ndarray:
    """conv(x - x_zero_point, w - w_zero_point) as float values holding exact integers (weight: how
    w - w_zero_point is obtained, `_prepared_weight`'s get)."""
    _check_8bit(x, "x")
    ws = weight(w, w_zero_point)
    xs = x.astype(ws.dtype) - _per_tensor_or_channel(x_zero_point, ws.dtype, "x_zero_point")
    return convolve(xs, ws, None, *attrs)


def _attrs(auto_pad, dilations, group, kernel_shape, pads, strides):
    auto_pad = check_auto_pad(auto_pad)
    if group < 1:
        raise ValueError(f"group must be >= 1, got {group}")
    return auto_pad, dilations, group, kernel_shape, pads, strides


@kernel("ConvInteger", since=10, heavy=True)
def conv_integer_10(*, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None,
                    _constants=None):
    attrs = _attrs(auto_pad, dilations, group, kernel_shape, pads, strides)
    weight = prepack(_shifted_weight, _constants, (1, 3))

    def conv_integer(x, w, x_zero_point=None, w_zero_point=None):
        y = _integer_conv(x, w, x_zero_point, w_zero_point, attrs, weight)
        # exact integers; beyond int32 the accumulation wraps (the spec allows overflow only in 32 bits)
        return y.astype(np.int64).astype(np.int32)
    return conv_integer


@kernel("QLinearConv", since=10, heavy=True)
def qlinear_conv_10(*, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None,
                    _constants=None):
    attrs = _attrs(auto_pad, dilations, group, kernel_shape, pads, strides)
    weight = prepack(_shifted_weight, _constants, (3, 5))

    def qlinear_conv(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B=None):
        _check_8bit(y_zero_point, "y_zero_point")
        m = w.shape[0] if w.ndim else 0
        if B is not None:
            if B.shape != (m,) or B.dtype != np.int32:
                raise InvalidValueError(f"B must be an int32 tensor of shape [{m}], got {B.dtype} {list(B.shape)}")
        acc = _integer_conv(x, w, x_zero_point, w_zero_point, attrs, weight).astype(np.float64, copy=False)
        r = acc.ndim - 2
        if B is not None:     # exact: |acc| < 2^53, |B| < 2^31
            acc = acc + B.astype(np.float64).reshape((1, m) + (1,) * r)
        # the real-valued rescale, in float64 from the float32 scales
        xs = _per_tensor_or_channel(x_scale, np.float64, "x_scale")
        ws = _per_tensor_or_channel(w_scale, np.float64, "w_scale", per_channel=m)
        ys = _per_tensor_or_channel(y_scale, np.float64, "y_scale")
        scale = (xs * ws / ys).reshape((1, -1) + (1,) * r) if ws.ndim else xs * ws / ys
        y = np.rint(acc * scale) + _per_tensor_or_channel(y_zero_point, np.float64, "y_zero_point")
        info = np.iinfo(y_zero_point.dtype)
        return np.clip(y, info.min, info.max).astype(y_zero_point.dtype)
    return qlinear_conv
