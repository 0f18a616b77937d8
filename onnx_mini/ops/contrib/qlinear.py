"""com.microsoft QLinear operators and the contrib QuantizeLinear/DequantizeLinear (all since 1):
QLinearAdd, QLinearMul, QLinearSigmoid, QLinearLeakyRelu, QLinearConcat, QLinearAveragePool,
QLinearGlobalAveragePool, QLinearConv, QuantizeLinear, DequantizeLinear, QEmbedLayerNormalization.

Spec: onnxruntime's ContribOperators documentation. Every op is "dequantize the 8-bit inputs
((x - zero_point) * scale, in float32), compute in float32, quantize the result" with
quantization.py's `quantize_array`: round half to even, add the output zero point, saturate to the
output type. Scales and zero points are per tensor (scalars); an omitted zero point is 0. The unary
ops (Sigmoid, LeakyRelu) build the 256-entry table of the op for the given scales and look every
element up in it. QEmbedLayerNormalization is EmbedLayerNormalization (transformer.py) on the
dequantized tables.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from ...errors import InvalidValueError
from ...registry import kernel
from .._common import as_array, normalize_axis, prepack
from ..nn.conv_quantized import qlinear_conv_10
from ..nn.pool import _average_pool
from ..quantization import layout, quantize_array
from .layer_norm import embed_layer_normalization_1

MS = "com.microsoft"
_F32 = np.dtype(np.float32)
_U8 = np.dtype(np.uint8)
_INT8S = frozenset(np.dtype(t) for t in (np.int8, np.uint8))


def _check_8bit(x: np.ndarray, what: str) -> None:
    if x.dtype not in _INT8S:
        raise InvalidValueError(f"{what} must be int8 or uint8, got {x.dtype}")


def _scale(s: np.ndarray, what: str) -> np.float32:
    if s.size != 1 or s.dtype != _F32:
        raise InvalidValueError(f"{what} must be a float scalar (per-tensor), got {s.dtype} {list(s.shape)}")
    return s.reshape(()).astype(_F32)[()]


def _zero_point(zp, dtype: np.dtype, what: str):
    """A per-tensor zero point of the given type as a 0-d array (None when omitted)."""
    if zp is None:
        return None
    if zp.size != 1 or zp.dtype != dtype:
        raise InvalidValueError(f"{what} must be a {dtype} scalar, got {zp.dtype} {list(zp.shape)}")
    return zp.reshape(())


def dequantize(x: np.ndarray, scale, zp) -> np.ndarray:
    """(x - zp) * scale as float32 (scale a float32 scalar, zp a 0-d array or None)."""
    y = x.astype(_F32)
    if zp is not None:
        y -= zp.astype(_F32)
    y *= scale
    return y


def quantize(y: np.ndarray, scale, zp, dtype: np.dtype) -> np.ndarray:
    """saturate(round_half_even(y / scale) + zp) in dtype."""
    return quantize_array(y / scale, dtype, zp, scratch=True)


def _unary_input(x, x_scale, x_zero_point, y_scale, y_zero_point):
    _check_8bit(x, "X")
    return (_scale(x_scale, "X_scale"), _zero_point(x_zero_point, x.dtype, "X_zero_point"),
            _scale(y_scale, "Y_scale"), _zero_point(y_zero_point, x.dtype, "Y_zero_point"))


def _table_op(fn):
    """A QLinear unary op: y = quantize(fn(dequantize(x))) through a table of the 256 values of x's type."""
    def run(x, x_scale, x_zero_point=None, y_scale=None, y_zero_point=None):
        if y_scale is None:
            raise InvalidValueError("Y_scale is required")
        xs, xz, ys, yz = _unary_input(x, x_scale, x_zero_point, y_scale, y_zero_point)
        every = np.arange(256, dtype=np.uint8).view(x.dtype)        # indexed by the byte of each value
        table = quantize(fn(dequantize(every, xs, xz)), ys, yz, x.dtype)
        return as_array(table[x.view(np.uint8)])
    return run


def _binary(combine):
    def run(a, a_scale, a_zero_point, b, b_scale, b_zero_point, c_scale, c_zero_point=None):
        _check_8bit(a, "A")
        if b.dtype != a.dtype:
            raise InvalidValueError(f"A ({a.dtype}) and B ({b.dtype}) must have the same type")
        fa = dequantize(a, _scale(a_scale, "A_scale"), _zero_point(a_zero_point, a.dtype, "A_zero_point"))
        fb = dequantize(b, _scale(b_scale, "B_scale"), _zero_point(b_zero_point, a.dtype, "B_zero_point"))
        try:
            y = combine(fa, fb)
        except ValueError:
            raise InvalidValueError(f"A {list(a.shape)} and B {list(b.shape)} do not broadcast") from None
        return quantize(y, _scale(c_scale, "C_scale"), _zero_point(c_zero_point, a.dtype, "C_zero_point"), a.dtype)
    return run


@kernel("QLinearAdd", since=1, domain=MS)
def qlinear_add_1():
    return _binary(np.add)


@kernel("QLinearMul", since=1, domain=MS)
def qlinear_mul_1():
    return _binary(np.multiply)


@kernel("QLinearSigmoid", since=1, domain=MS)
def qlinear_sigmoid_1():
    def sigmoid(x):
        with np.errstate(over="ignore"):
            return np.float32(1) / (np.float32(1) + np.exp(-x))
    return _table_op(sigmoid)


@kernel("QLinearLeakyRelu", since=1, domain=MS)
def qlinear_leaky_relu_1(*, alpha=0.01):
    alpha = np.float32(alpha)
    return _table_op(lambda x: np.where(x < 0, x * alpha, x))


# -- QLinearConcat --------------------------------------------------------------------------------

@kernel("QLinearConcat", since=1, domain=MS)
def qlinear_concat_1(*, axis):
    def run(y_scale, y_zero_point, *inputs):
        if not inputs or len(inputs) % 3:
            raise InvalidValueError(f"inputs must be (tensor, scale, zero point) triples, got {len(inputs)} inputs")
        ys = _scale(y_scale, "Y_scale")
        if y_zero_point is None:
            raise InvalidValueError("Y_zero_point is required")
        _check_8bit(y_zero_point, "Y_zero_point")
        yz = _zero_point(y_zero_point, y_zero_point.dtype, "Y_zero_point")
        parts = []
        for k in range(0, len(inputs), 3):
            x, s, z = inputs[k:k + 3]
            if x is None or s is None or z is None:
                raise InvalidValueError(f"input triple {k // 3} is incomplete")
            _check_8bit(x, f"input {k // 3}")
            parts.append(dequantize(x, _scale(s, f"scale of input {k // 3}"),
                                    _zero_point(z, x.dtype, f"zero point of input {k // 3}")))
        rank = parts[0].ndim
        ax = normalize_axis(axis, rank)
        if any(p.ndim != rank or p.shape[:ax] + p.shape[ax + 1:] != parts[0].shape[:ax] + parts[0].shape[ax + 1:]
               for p in parts):
            raise InvalidValueError(f"inputs of shapes {[list(p.shape) for p in parts]} cannot be concatenated "
                                    f"on axis {axis}")
        return quantize(np.concatenate(parts, axis=ax), ys, yz, y_zero_point.dtype)
    return run


# -- QLinearAveragePool, QLinearGlobalAveragePool --------------------------------------------------

def _to_channels_first(x: np.ndarray) -> np.ndarray:
    return np.moveaxis(x, -1, 1)


def _to_channels_last(x: np.ndarray) -> np.ndarray:
    return np.moveaxis(x, 1, -1)


@kernel("QLinearAveragePool", since=1, domain=MS)
def qlinear_average_pool_1(*, kernel_shape, auto_pad="NOTSET", ceil_mode=0, channels_last=0, count_include_pad=0,
                           pads=None, strides=None):
    pool = _average_pool(kernel_shape, strides, pads, None, auto_pad, ceil_mode, count_include_pad)

    def run(x, x_scale, x_zero_point=None, y_scale=None, y_zero_point=None):
        if y_scale is None:
            raise InvalidValueError("y_scale is required")
        xs, xz, ys, yz = _unary_input(x, x_scale, x_zero_point, y_scale, y_zero_point)
        if x.ndim < 3:
            raise InvalidValueError(f"X of shape {list(x.shape)} must have rank >= 3")
        xf = dequantize(_to_channels_first(x) if channels_last else x, xs, xz)
        y = quantize(pool(xf), ys, yz, x.dtype)
        return _to_channels_last(y) if channels_last else y
    return run


@kernel("QLinearGlobalAveragePool", since=1, domain=MS)
def qlinear_global_average_pool_1(*, channels_last=0):
    def run(x, x_scale, x_zero_point, y_scale, y_zero_point):
        xs, xz, ys, yz = _unary_input(x, x_scale, x_zero_point, y_scale, y_zero_point)
        if x.ndim < 3:
            raise InvalidValueError(f"X of shape {list(x.shape)} must have rank >= 3")
        axes = tuple(range(1, x.ndim - 1)) if channels_last else tuple(range(2, x.ndim))
        return quantize(dequantize(x, xs, xz).mean(axis=axes, keepdims=True), ys, yz, x.dtype)
    return run


@kernel("QLinearConv", since=1, domain=MS, heavy=True)
def qlinear_conv_ms_1(*, auto_pad="NOTSET", channels_last=0, dilations=None, group=1, kernel_shape=None, pads=None,
                      strides=None, _constants=None):
    """ai.onnx QLinearConv (conv_quantized.py), on NHWC data when channels_last=1 (the weights keep their
    layout, so the constant ones are prepared the same way)."""
    conv = qlinear_conv_10(auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape, pads=pads,
                           strides=strides, _constants=_constants)
    if not channels_last:
        return conv

    def run(x, *rest):
        if x.ndim < 3:
            raise InvalidValueError(f"x of shape {list(x.shape)} must have rank >= 3")
        return np.ascontiguousarray(_to_channels_last(conv(_to_channels_first(x), *rest)))
    return run


# -- QuantizeLinear, DequantizeLinear (contrib) ----------------------------------------------------

_Q_TYPES = frozenset(np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16, ml_dtypes.int4, ml_dtypes.uint4))
_DQ_TYPES = _Q_TYPES | {np.dtype(np.int32)}
_SCALE_TYPES = frozenset(np.dtype(t) for t in (np.float32, np.float16))


def _axis_layout(x_shape, scale, zp, axis):
    """Per tensor (scalar scale) or, with 1-D parameters, per `axis` (1 when the attribute is absent)."""
    if scale.ndim > 1:
        raise InvalidValueError(f"the scale must be a scalar or 1-D, got shape {list(scale.shape)}")
    _, s, z = layout(x_shape, scale, zp, 1 if axis is None else axis, 0)
    return s, z


@kernel("QuantizeLinear", since=1, domain=MS)
def quantize_linear_1(*, axis=None):
    def run(x, y_scale, y_zero_point=None):
        if x.dtype not in _SCALE_TYPES or y_scale.dtype != x.dtype:
            raise InvalidValueError(f"x and y_scale must both be float or float16, got {x.dtype} and {y_scale.dtype}")
        out = _U8 if y_zero_point is None else y_zero_point.dtype
        if out not in _Q_TYPES:
            raise InvalidValueError(f"y_zero_point has type {out}; allowed: int8, uint8, int16, uint16, int4, uint4")
        s, z = _axis_layout(x.shape, y_scale, y_zero_point, axis)
        return quantize_array(x.astype(_F32) / s.astype(_F32), out, z, scratch=True)
    return run


@kernel("DequantizeLinear", since=1, domain=MS)
def dequantize_linear_1(*, axis=None):
    def run(x, x_scale, x_zero_point=None):
        if x.dtype not in _DQ_TYPES:
            raise InvalidValueError(f"x has type {x.dtype}; allowed: int8, uint8, int16, uint16, int32, int4, uint4")
        if x_scale.dtype not in _SCALE_TYPES:
            raise InvalidValueError(f"x_scale must be float or float16, got {x_scale.dtype}")
        if x_zero_point is not None and x_zero_point.dtype != x.dtype:
            raise InvalidValueError(f"x_zero_point ({x_zero_point.dtype}) must have x's type ({x.dtype})")
        s, z = _axis_layout(x.shape, x_scale, x_zero_point, axis)
        y = x.astype(_F32)
        if z is not None:
            y -= z.astype(_F32)
        y *= s.astype(_F32)
        return y.astype(x_scale.dtype, copy=False)
    return run


# -- QEmbedLayerNormalization ----------------------------------------------------------------------

@kernel("QEmbedLayerNormalization", since=1, domain=MS, multi_output=True)
def qembed_layer_normalization_1(*, epsilon=1e-12, _n_outputs=2, _constants=None):
    """EmbedLayerNormalization on the dequantized tables (per-tensor scale and zero point each). The
    tables are initializers: each is dequantized once at prepare when it and its scale (and zero point,
    if given) are constants."""
    embed = embed_layer_normalization_1(epsilon=epsilon, _n_outputs=2)

    def table(q, s, zp, what):
        _check_8bit(q, what)
        return dequantize(q, _scale(s, f"{what}_scale"), _zero_point(zp, q.dtype, f"{what}_zero_point"))

    # table k is input 2 + k, its scale 8 + k, its zero point 13 + k
    tables = [prepack(lambda q, s, zp, w=what: table(q, s, zp, w), _constants, (2 + k, 8 + k, 13 + k), required=2)
              for k, what in enumerate(("word_embedding", "position_embedding", "segment_embedding", "gamma", "beta"))]

    def run(input_ids, segment_ids, word_q, position_q, segment_q, gamma_q, beta_q, mask=None, word_scale=None,
            position_scale=None, segment_scale=None, gamma_scale=None, beta_scale=None, word_zp=None,
            position_zp=None, segment_zp=None, gamma_zp=None, beta_zp=None):
        quantized = (word_q, position_q, segment_q, gamma_q, beta_q)
        scales = (word_scale, position_scale, segment_scale, gamma_scale, beta_scale)
        zps = (word_zp, position_zp, segment_zp, gamma_zp, beta_zp)
        segment = (segment_ids, segment_q, segment_scale, segment_zp)
        if any(x is None for x in segment) and any(x is not None for x in segment):
            raise InvalidValueError("segment_ids, segment_embedding, its scale and zero point must be given "
                                    "together or not at all")
        for k, (q, s, z) in enumerate(zip(quantized, scales, zps)):
            if k != 2 and (s is None or z is None):
                raise InvalidValueError("every scale and zero point but the segment embedding's is required")
        if input_ids.dtype != np.int32:
            raise InvalidValueError(f"input_ids must be int32, got {input_ids.dtype}")
        floats = [None if q is None else get(q, s, z) for get, q, s, z in zip(tables, quantized, scales, zps)]
        out, mask_index = embed(input_ids, segment_ids, floats[0], floats[1], floats[2], floats[3], floats[4], mask)
        return out, mask_index
    return run
