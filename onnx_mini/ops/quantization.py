"""Linear quantization: QuantizeLinear and DequantizeLinear (10-28), DynamicQuantizeLinear (11).

Granularity is read from the scale's shape: per-tensor (a scalar, or any size-1 tensor of rank <= 1),
per-axis (13+: a 1-D scale along `axis`), blocked (21+: `block_size` > 0, the scale has the input's
rank with the blocked axis of length ceil(D / block_size)). Arithmetic runs in float32 (the official
data does); a float16/bfloat16 `precision` (23+, default: the scale's type) makes the division one in
that type (x, the scale and the quotient rounded to it) before the zero point is added. Likewise
DequantizeLinear-23+ multiplies in its output type ("the output type also determines the precision of
the multiplication"); before 23 it computes in float32 and rounds once.

Public helper: quantize_array(q, dtype, zero_point, saturate) rounds/saturates real values to any
quantized type (integers: round half to even + clip; float8/float4/float6: Cast's saturate rules).

Speed (beside the formulas, not instead of them): the 8- and 16-bit integer results are rounded,
offset and saturated by `_round_saturate_into` in four passes over the quotient's buffer, in place
(see there); NaN quantizes to the zero point (the spec leaves it undefined). DequantizeLinear
subtracts and multiplies in place on its one float32 copy of x (three passes: numpy's floor; a
256-entry table lookup measured 4x slower). With a constant per-tensor scale and zero point (a QDQ
model's), both check them once at prepare and run only that arithmetic (`_constant_params`).
A QuantizeLinear read back by its DequantizeLinear runs as one step without the codes
(`quantize_dequantize`, for optimize/qdq_pair.py).
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from .. import memory
from ..errors import InvalidValueError
from ..registry import kernel
from ._common import as_array, clip_ufunc as _clip, normalize_axis, round_f32 as _f32
from .tensor.cast import (E8M0, FLOAT8_MAX, SUBBYTE_INTS, check_input, schema_dtypes, target_dtype,
                          to_float8)

_F32 = np.dtype(np.float32)
_U8 = np.dtype(np.uint8)
_LOW_PRECISION = frozenset([np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)])
_INF = math.inf
_U8_CODES = [np.uint8(i) for i in range(256)]     # (np.uint8(i) costs ~0.6 us, a list item ~0.03)
_MIN, _MAX = np.minimum.reduce, np.maximum.reduce  # (x.min() and x.max() without their Python layer)


def _int_range(dtype: np.dtype, ftype: np.dtype):
    """The integer type's bounds as `ftype` floats inside the range (float32(2**31 - 1) is 2**31)."""
    info = ml_dtypes.iinfo(dtype)
    lo, hi = ftype.type(info.min), ftype.type(info.max)
    if int(hi) > int(info.max):
        hi = np.nextafter(hi, ftype.type(0))
    return lo, hi


def quantize_array(q: np.ndarray, dtype, zero_point=None, saturate: bool = True, *,
                   scratch: bool = False, finite: bool = False) -> np.ndarray:
    """Real values q (float32, or float64) -> quantized `dtype`, i.e. saturate(round(q) + zero_point).

    Integer types (int8/uint8/int16/uint16/int32/int4/uint4/int2/uint2): round half to even, add the
    zero point, clip to the type's range. float8 types: q + zero_point converted with Cast's rules
    (saturate clamps to the largest finite value). float4e2m1/float6: round to nearest even, always
    saturating. zero_point: None or an array broadcastable to q, of any type. scratch: q is a
    temporary of the caller's that may be overwritten. finite: the caller knows q holds no NaN (then an
    even scalar zero point is added by the rounding itself: one pass less, see _round_into).
    """
    dtype = np.dtype(dtype)
    if dtype in _FAST_INTS and q.dtype in _ROUNDER and (zero_point is None or zero_point.dtype == dtype):
        out = memory.empty(q.shape, dtype)
        _round_saturate_into(q if scratch and type(q) is np.ndarray else np.array(q), out, zero_point, finite)
        return out
    if dtype.kind in "iu" or dtype in SUBBYTE_INTS:
        y = as_array(np.rint(q))          # a fresh array (0-d inputs give numpy scalars)
        if zero_point is not None:
            y += zero_point.astype(_F32)
        lo, hi = _int_range(dtype, y.dtype)
        np.clip(y, lo, hi, out=y)
        with np.errstate(invalid="ignore"):
            return y.astype(dtype)
    if zero_point is not None:
        q = q + zero_point.astype(_F32)
    if dtype in FLOAT8_MAX:
        return to_float8(q, dtype, saturate)
    with np.errstate(invalid="ignore", over="ignore"):
        return np.asarray(q.astype(dtype))


# saturate(round_half_even(q) + zp) for 8/16-bit integer outputs, in place on a float32 q:
# 1. clip q to [lo - zp, hi - zp] (integer bounds: clipping before rounding is clipping after it);
# 2. q += 1.5 * 2^23: for |q| <= 2^22 the float32 sum lies in [2^23, 2^24), where float32 holds the
#    integers only, so the addition rounds q half to even (1.5 * 2^23 is even) and the sum's bit pattern
#    is 0x4B400000 + round(q);
# 3. that pattern cast to the output type keeps its low 8/16 bits (integer casts wrap), round(q)
#    modulo 2^8/2^16 (0x4B400000 ends in 16 zero bits);
# 4. out += zp, wrapping in the same modulus, gives round(q) + zp, which lies in the type's range.
# Measured on 1M float32 here, the division included: ~0.5 ms against ~0.85 for divide, rint, add, clip,
# astype (~0.15 ms a float pass; the int32 cast and the 8-bit add cost half of one). NaN gives the zero point.
# (in float64 alike: 1.5 * 2^52, the pattern 0x4338000000000000 + round(q) for |q| <= 2^51)
_FAST_INTS = frozenset(np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16))
_ROUNDER = {np.dtype(np.float32): (np.float32(1.5 * 2 ** 23), np.int32),
            np.dtype(np.float64): (np.float64(1.5 * 2 ** 52), np.int64)}

_BOUNDS = {t: (float(np.iinfo(t).min), float(np.iinfo(t).max)) for t in _FAST_INTS}


def _round_saturate_into(q: np.ndarray, out: np.ndarray, zp, finite: bool = False) -> None:
    """out[...] = saturate(round_half_even(q) + zp) for out of a _FAST_INTS type (zp: None or of out's
    type, broadcasting like q); q, float32 or float64 of out's shape, is overwritten. finite: q holds
    no NaN (see _round_into)."""
    lo, hi = _BOUNDS[out.dtype]
    if zp is not None:
        z = float(zp) if zp.ndim == 0 else zp.astype(q.dtype)
        lo, hi = lo - z, hi - z
    _clip(q, lo, hi, out=q)
    _round_into(q, out, zp, finite)


def _round_into(q: np.ndarray, out: np.ndarray, zp, finite: bool) -> None:
    """Steps 2-4 above on a q already within [lo - zp, hi - zp] (overwritten). With finite (no NaN in q)
    and an even scalar zero point, step 4 joins step 2: rounder + zp is even too, so the sum rounds
    q + zp half to even, which is round(q) + zp, and its pattern's low bits are the code: one pass less
    (~6 us of ~80-100 requantizing a 16x112x112 output, measured under load). A NaN would give 0 there,
    not the zero point, hence `finite`."""
    rounder, bits = _ROUNDER[q.dtype]
    fold = finite and zp is not None and zp.ndim == 0 and int(zp) % 2 == 0
    q += rounder + q.dtype.type(int(zp)) if fold else rounder       # exact: integers below 2^24
    np.copyto(out, q.view(bits), casting="unsafe")
    if zp is not None and not fold:
        out += zp


# -- granularity ---------------------------------------------------------------------------------

def layout(shape: tuple, scale: np.ndarray, zero_point, axis: int, block_size: int, per_axis: bool = True):
    """How a scale (and zero point of the same shape) applies to an input of `shape`.

    Returns (work_shape, scale, zero_point): the input is reshaped to work_shape (a view) and the two
    parameters broadcast against it. Blocked quantization with D % block_size == 0 splits the blocked
    axis into (D / block_size, block_size) instead of repeating the parameters to the input's size.
    """
    if zero_point is not None and zero_point.shape != scale.shape and not (
            zero_point.size == 1 and scale.size == 1 and zero_point.ndim <= 1 and scale.ndim <= 1):
        raise InvalidValueError(f"zero point of shape {list(zero_point.shape)} must have the scale's shape "
                                f"{list(scale.shape)}")
    if scale.ndim <= 1 and scale.size == 1:     # per tensor
        return shape, scale.reshape(()), None if zero_point is None else zero_point.reshape(())
    if not per_axis:
        raise InvalidValueError(f"the scale must be a scalar (per-tensor quantization only in this version), "
                                f"got shape {list(scale.shape)}")
    rank = len(shape)
    if block_size <= 0:
        if scale.ndim != 1:
            raise InvalidValueError(f"scale of shape {list(scale.shape)} must be a scalar or a 1-D tensor "
                                    f"(blocked quantization needs block_size > 0)")
        ax = normalize_axis(axis, rank)
        if scale.shape[0] != shape[ax]:
            raise InvalidValueError(f"scale has {scale.shape[0]} values but the input {list(shape)} has "
                                    f"{shape[ax]} along axis {axis} (per-axis quantization)")
        pshape = (-1,) + (1,) * (rank - ax - 1)
        return shape, scale.reshape(pshape), None if zero_point is None else zero_point.reshape(pshape)
    if scale.ndim != rank:
        raise InvalidValueError(f"scale of shape {list(scale.shape)} must have the input's rank {rank} "
                                f"for blocked quantization")
    ax = normalize_axis(axis, rank)
    d = shape[ax]
    expected = tuple(-(-n // block_size) if i == ax else n for i, n in enumerate(shape))
    if scale.shape != expected:
        raise InvalidValueError(f"scale of shape {list(scale.shape)} does not match the input {list(shape)} "
                                f"with block_size={block_size} on axis {axis} (expected {list(expected)})")
    if d % block_size == 0:
        work = shape[:ax] + (d // block_size, block_size) + shape[ax + 1:]
        pshape = shape[:ax] + (d // block_size, 1) + shape[ax + 1:]
        return work, scale.reshape(pshape), None if zero_point is None else zero_point.reshape(pshape)
    crop = (slice(None),) * ax + (slice(0, d),)

    def full(p):
        return None if p is None else np.repeat(p, block_size, axis=ax)[crop]
    return shape, full(scale), full(zero_point)


def _positive_block_size(block_size: int) -> int:
    if block_size < 0:
        raise ValueError(f"block_size must be >= 0, got {block_size}")
    return block_size


# -- QuantizeLinear ------------------------------------------------------------------------------

def _quantize_fn(version: int, *, axis=1, saturate=1, output_dtype=0, block_size=0, precision=0, constants=None):
    out_param = "T3" if version >= 23 else "T2"
    allowed_out = schema_dtypes("QuantizeLinear", version, out_param)
    allowed_x = schema_dtypes("QuantizeLinear", version, "T1")
    allowed_scale = schema_dtypes("QuantizeLinear", version, "T2") if version >= 23 else \
        (allowed_x if version >= 19 else {_F32: 1})
    fixed_out = target_dtype(output_dtype, allowed_out, "output_dtype") if output_dtype else None
    prec = target_dtype(precision, schema_dtypes("QuantizeLinear", version, "T2"), "precision") \
        if precision else None
    block_size = _positive_block_size(block_size)
    per_axis = version >= 13
    saturate = bool(saturate)

    def run(x, y_scale, y_zero_point=None):
        check_input(x, allowed_x, "x")
        check_input(y_scale, allowed_scale, "y_scale")
        if version < 23 and version >= 19 and y_scale.dtype != x.dtype:
            raise InvalidValueError(f"x ({x.dtype}) and y_scale ({y_scale.dtype}) must have the same type")
        if y_zero_point is not None:
            out = y_zero_point.dtype
            check_input(y_zero_point, allowed_out, "y_zero_point")
            if fixed_out is not None and out != fixed_out:
                raise InvalidValueError(f"output_dtype {fixed_out} differs from the zero point's type {out}")
        else:
            out = fixed_out if fixed_out is not None else _U8
        work, scale, zp = layout(x.shape, y_scale, y_zero_point, axis, block_size, per_axis)
        p = prec if prec is not None else y_scale.dtype
        if p in _LOW_PRECISION:   # the division in float16/bfloat16: both operands and the quotient
            xf = (x if x.dtype == p else x.astype(p)).astype(_F32)
            sf = scale.astype(p).astype(_F32)
            q = (xf.reshape(work) / sf).astype(p).astype(_F32)
        else:
            q = (x if x.dtype == _F32 else x.astype(_F32)).reshape(work) / scale.astype(_F32)
        return quantize_array(q, out, zp, saturate, scratch=True).reshape(x.shape)
    # (a float16/bfloat16 precision divides in that type: not the shortcut's float32 division)
    return _constant_params(run, constants if prec in (None, _F32) else None, _quantize_per_tensor)


@kernel("QuantizeLinear", since=10)
def quantize_linear_10(*, _version, _constants=None):
    return _quantize_fn(_version, constants=_constants)


@kernel("QuantizeLinear", since=13)
def quantize_linear_13(*, axis=1, _version, _constants=None):
    return _quantize_fn(_version, axis=axis, constants=_constants)


@kernel("QuantizeLinear", since=19)
def quantize_linear_19(*, axis=1, saturate=1, _version, _constants=None):
    return _quantize_fn(_version, axis=axis, saturate=saturate, constants=_constants)


@kernel("QuantizeLinear", since=21)
def quantize_linear_21(*, axis=1, saturate=1, output_dtype=0, block_size=0, _version, _constants=None):
    return _quantize_fn(_version, axis=axis, saturate=saturate, output_dtype=output_dtype, block_size=block_size,
                        constants=_constants)


@kernel("QuantizeLinear", since=(23, 24, 25, 28))
def quantize_linear_23(*, axis=1, saturate=1, output_dtype=0, block_size=0, precision=0, _version, _constants=None):
    return _quantize_fn(_version, axis=axis, saturate=saturate, output_dtype=output_dtype,
                        block_size=block_size, precision=precision, constants=_constants)


# -- DequantizeLinear ----------------------------------------------------------------------------

def _dequantize_fn(version: int, *, axis=1, block_size=0, output_dtype=0, constants=None):
    if version >= 19:
        allowed_x = schema_dtypes("DequantizeLinear", version, "T1")
        allowed_scale = schema_dtypes("DequantizeLinear", version, "T2")
    else:
        allowed_x = schema_dtypes("DequantizeLinear", version, "T")
        allowed_scale = {_F32: 1}
    fixed_out = target_dtype(output_dtype, schema_dtypes("DequantizeLinear", version, "T3"), "output_dtype") \
        if output_dtype else None
    block_size = _positive_block_size(block_size)
    per_axis = version >= 13
    out_precision = version >= 23

    def run(x, x_scale, x_zero_point=None):
        check_input(x, allowed_x, "x")
        check_input(x_scale, allowed_scale, "x_scale")
        if x_zero_point is not None and x_zero_point.dtype != x.dtype:
            raise InvalidValueError(f"x ({x.dtype}) and x_zero_point ({x_zero_point.dtype}) must have the same type")
        if fixed_out is not None:
            out = fixed_out
        else:  # the scale's type; a float8e8m0 scale (24+) without output_dtype gives float32
            out = _F32 if x_scale.dtype == E8M0 else x_scale.dtype
        work, scale, zp = layout(x.shape, x_scale, x_zero_point, axis, block_size, per_axis)
        y = x.reshape(work).astype(_F32)
        if zp is not None:
            y -= zp.astype(_F32)
        if out_precision and out in _LOW_PRECISION:   # 23+: the multiplication in the output type
            y = y.astype(out).astype(_F32)
            scale = scale.astype(out)
        y *= scale.astype(_F32)
        return (y if out == _F32 else y.astype(out)).reshape(x.shape)
    return _constant_params(run, constants, _dequantize_per_tensor)


@kernel("DequantizeLinear", since=10)
def dequantize_linear_10(*, _version, _constants=None):
    return _dequantize_fn(_version, constants=_constants)


@kernel("DequantizeLinear", since=(13, 19))
def dequantize_linear_13(*, axis=1, _version, _constants=None):
    return _dequantize_fn(_version, axis=axis, constants=_constants)


@kernel("DequantizeLinear", since=21)
def dequantize_linear_21(*, axis=1, block_size=0, _version, _constants=None):
    return _dequantize_fn(_version, axis=axis, block_size=block_size, constants=_constants)


@kernel("DequantizeLinear", since=(23, 24, 25, 28))
def dequantize_linear_23(*, axis=1, block_size=0, output_dtype=0, _version, _constants=None):
    return _dequantize_fn(_version, axis=axis, block_size=block_size, output_dtype=output_dtype,
                          constants=_constants)


# -- constant scale and zero point (speed) ---------------------------------------------------------
# A QDQ model's Quantize/DequantizeLinear have constant per-tensor parameters: their checks and
# layout are made once (a few us a call, a third of a small tensor's time), the run then does only
# the arithmetic of `run` itself, for the one input type it was checked with.

def _constant_params(run, constants, make):
    """run, or a function taking make(run, scale, zero_point)'s shortcut when the scale and zero point
    are the constants it was made from (make returns None where it does not apply)."""
    constants = constants or {}
    if 1 not in constants or 2 not in constants:
        return run
    scale, zp = constants[1], constants[2]
    try:
        fast = make(run, scale, zp)
    except (InvalidValueError, ValueError):
        fast = None                 # run raises it, as for fed parameters
    if fast is None:
        return run
    x_type, compute = fast

    def run_constant(x, scale_, zp_=None):
        if scale_ is scale and zp_ is zp and x.dtype == x_type and x.ndim:
            return compute(x)
        return run(x, scale_, zp_)
    return run_constant


def _quantize_per_tensor(run, scale, zp):
    """float32 x, a float32 per-tensor scale and an 8/16-bit zero point: (float32, x -> run(x, scale, zp))."""
    if scale.dtype != _F32 or scale.size != 1 or scale.ndim > 1 or zp.size != 1 or zp.ndim > 1 \
            or zp.dtype not in _FAST_INTS:
        return None
    probe = np.zeros(1, _F32)
    if run(probe, scale, zp).dtype != zp.dtype:      # the attributes' checks against these parameters
        return None
    s, z = scale.reshape(()).astype(_F32), zp.reshape(())

    def compute(x):
        out = memory.empty(x.shape, z.dtype)
        _round_saturate_into(x / s, out, z)
        return out
    return _F32, compute


def _dequantize_per_tensor(run, scale, zp):
    """x of the zero point's (8/16-bit) type, a float32 per-tensor scale, float32 out: (x's type, x -> run(x, ...))."""
    if scale.dtype != _F32 or scale.size != 1 or scale.ndim > 1 or zp.size != 1 or zp.ndim > 1 \
            or zp.dtype not in _FAST_INTS:
        return None
    if run(np.zeros(1, zp.dtype), scale, zp).dtype != _F32:     # output_dtype or the version's rules
        return None
    s, z = scale.reshape(()).astype(_F32), zp.reshape(()).astype(_F32)

    def compute(x):
        y = x.astype(_F32)
        if z:               # x - 0 is x
            y -= z
        y *= s
        return y
    return zp.dtype, compute


# -- QuantizeLinear -> DequantizeLinear (optimize/qdq_pair.py) ------------------------------------

def quantize_dequantize(q_version: int, dq_version: int, constants=None):
    """run(x, scale, zero_point) = DequantizeLinear(QuantizeLinear(x, scale, zero_point), scale,
    zero_point) of those versions, per-tensor; with float32 x and the constant float32 scale and
    8/16-bit zero point the optimiser checked, computed in float32 without the codes:
    (clip(x / s, lo - zp, hi - zp) rounded half to even) * s, the rounding by the magic constant
    (+ then - 1.5 * 2^23: exact, and +0 where the codes give zp - zp = +0), which is the pair's
    float32(code) - float32(zp) times s bit for bit. NaN, which the pair maps to the zero point
    (see _round_saturate_into), is found by one max reduction (NaN propagates; ~14 us at 200k
    values against ~30 for np.isnan(...).any()) and set to 0 then. Five float passes over one
    buffer against the pair's seven over three: 109 against 152 us on [1, 16, 112, 112], 8.9
    against 10.8 on [1, 96, 7, 7] (the kernels alone, alternating, under load). `run.into(y)` does
    the same steps in place on a Conv's output (optimize/requantize.py): no pass saved, the step's
    node, buffer and checks are (the QDQ MobileNet 0.96-0.97x a run, both BLAS modes, under load;
    in chunks of 16-64 KB: slower, each chunk pays the ~10 calls again)."""
    quantize = _quantize_fn(q_version)
    dequantize = _dequantize_fn(dq_version)

    def run(x, scale, zero_point):
        return dequantize(quantize(x, scale, zero_point), scale, zero_point)
    constants = constants or {}
    scale, zp = constants.get(1), constants.get(2)
    if scale is None or zp is None or scale.dtype != _F32 or scale.size != 1 or zp.dtype not in _FAST_INTS \
            or zp.size != 1:
        return run
    s = scale.reshape(()).astype(_F32)
    z = float(zp.reshape(()))
    lo, hi = _BOUNDS[zp.dtype]
    lo, hi = lo - z, hi - z
    rounder = _ROUNDER[_F32][0]

    def finish(y):                      # y = x / s, a float32 buffer of our own
        _clip(y, lo, hi, out=y)
        top = np.maximum.reduce(y, axis=None)
        if top != top:                  # NaN somewhere (np.isnan on the scalar costs ~1 us more)
            y[np.isnan(y)] = 0
        y += rounder
        y -= rounder
        y *= s

    def run_constant(x, scale_, zp_):
        if scale_ is not scale or zp_ is not zp or x.dtype != _F32 or not x.size:
            return run(x, scale_, zp_)
        y = as_array(np.divide(x, s))     # a fresh buffer (0-d: numpy gives a scalar)
        finish(y)
        return y

    def into(y):
        """The same steps in place on a non-empty float32 buffer y (a Conv's output, ops/fused.py)."""
        np.divide(y, s, out=y)
        finish(y)
    run_constant.into = into
    return run_constant


# -- QuantizeLinear -> table -> DequantizeLinear (optimize/qdq_lut.py) -----------------------------

def quantized_lookup(lookup, q_version: int, dq_version: int, codes, constants=None):
    """run(x, table, x_scale, x_zero_point, y_scale, y_zero_point) = DequantizeLinear(lookup(
    QuantizeLinear(x, x_scale, x_zero_point), table), y_scale, y_zero_point), each end present when
    its version is nonzero (else x are the codes, of type `codes`; else the result is the looked-up
    codes). With the constant per-tensor parameters of a QDQ model (float32 scales, 8-bit zero
    points) and float32 x it runs as one pass chain without the codes (_quantized_lookup_constant);
    with both ends present, `run.into(y)` writes that chain's result into y (a Conv's output,
    optimize/requantize.py). Other chains measured slower on [1, 16, 112, 112] under load: np.take
    from a float32 table of the 256 results (out=, any mode: 215-380 us against ~205 for
    bytes.translate, its float conversion and scaling), fancy indexing (490), an intp index copy
    (+59), the low bytes copied through a stride-4 view (92 against 29 for the int32 cast)."""
    quantize = _quantize_fn(q_version) if q_version else None
    dequantize = _dequantize_fn(dq_version) if dq_version else None

    def run(x, table, x_scale=None, x_zero_point=None, y_scale=None, y_zero_point=None):
        y = lookup(quantize(x, x_scale, x_zero_point) if quantize is not None else x, table)
        return dequantize(y, y_scale, y_zero_point) if dequantize is not None else y
    try:
        fast = _quantized_lookup_constant(quantize, dequantize, np.dtype(codes), constants or {})
    except (InvalidValueError, ValueError):
        fast = None                     # run raises it, as for fed parameters
    if fast is None:
        return run
    given, x_type, compute = fast

    def run_constant(x, *params):
        if x.dtype != x_type or not x.ndim or len(params) != len(given) or any(
                a is not b for a, b in zip(params, given)):
            return run(x, *params)
        return compute(x)
    if hasattr(compute, "into"):        # floats in and out: the steps in place (ops/fused.py's Conv epilogues)
        run_constant.into = compute.into
    return run_constant


def _quantized_lookup_constant(quantize, dequantize, codes_in, constants):
    """(the inputs 1.. as the constants they are, x's type, compute(x)) for quantized_lookup, or None.

    The input codes: x / s clipped to [lo - zp, hi - zp], plus 1.5 * 2^23, is the float whose bit
    pattern ends in round(x / s) modulo 256 (_round_saturate_into's steps 1-3, NaN included); that
    byte, not the code (it lacks + zp), indexes the table turned by zp: entry b is the table's entry
    for the code (b + zp) modulo 256. The byte is written straight into the buffer bytes.translate
    reads. The output: the looked-up codes c as float32, minus y's zero point, times y's scale, as
    _dequantize_per_tensor; where every c - zp of the table lies in -128..127, the table holds that
    difference as int8 and the subtraction is skipped (an exact integer either way). Checked at
    prepare against the written kernels on every code, the ties, both bounds, NaN and infinities."""
    given = tuple(constants.get(i) for i in range(1, 6))
    table, s, z, ys, yz = given
    if not isinstance(table, np.ndarray) or table.shape != (256,) or table.dtype not in (np.dtype(np.int8), _U8):
        return None
    x_type = codes_in
    turned = np.arange(256, dtype=np.uint8)          # the table's index for each byte of the codes
    if quantize is not None:
        if s is None or z is None or z.dtype != codes_in or _quantize_per_tensor(quantize, s, z) is None:
            return None
        x_type = _F32
        xs = s.reshape(()).astype(_F32)
        lo, hi = _BOUNDS[z.dtype]
        lo, hi = lo - float(z.reshape(())), hi - float(z.reshape(()))
        turned += z.reshape(()).view(np.uint8)          # modulo 256
    codes = table.view(np.uint8)[turned]                 # the output code for each byte
    out_type = table.dtype
    subtract = shifted = False
    if dequantize is not None:
        if ys is None or yz is None or yz.dtype != table.dtype or _dequantize_per_tensor(dequantize, ys, yz) is None:
            return None
        ys32, yz32 = ys.reshape(()).astype(_F32), yz.reshape(()).astype(_F32)
        diff = codes.view(out_type).astype(np.int64) - int(yz.reshape(()))
        shifted = bool(diff.min() >= -128 and diff.max() <= 127)
        if shifted:
            codes, out_type = diff.astype(np.int8).view(np.uint8), np.dtype(np.int8)
        subtract = not shifted and bool(yz32)
    elif quantize is None:
        return None                                     # the plain lookup: nothing to save
    translation = codes.tobytes()
    rounder = _ROUNDER[_F32][0]

    def looked_up(q):
        """The output codes of q = x / s (overwritten)."""
        _clip(q, lo, hi, out=q)
        q += rounder
        buf = bytearray(q.size)
        np.copyto(np.frombuffer(buf, np.uint8).reshape(q.shape), q.view(np.int32), casting="unsafe")
        return np.frombuffer(buf.translate(translation), out_type).reshape(q.shape)

    def dequantized(c, y):
        """y[...] = (c - y's zero point) * y's scale (y: float32 of c's shape)."""
        np.copyto(y, c, casting="unsafe")       # c.astype(float32): exact
        if subtract:
            y -= yz32
        y *= ys32
        return y

    def compute(x):
        if quantize is not None:
            c = looked_up(np.divide(x, xs))
        else:
            c = np.frombuffer(bytearray(np.ascontiguousarray(x).data).translate(translation),
                              out_type).reshape(x.shape)
        return c if dequantize is None else dequantized(c, memory.empty(x.shape, _F32))

    def into(y):
        """compute(y) written into y, a non-empty float32 buffer (a Conv's output, ops/fused.py)."""
        dequantized(looked_up(np.divide(y, xs, out=y)), y)

    # the proof: every code, the ties either side of each, past both bounds, NaN, infinities, zeros
    if quantize is not None:
        r = np.arange(lo - 3, hi + 4, dtype=np.float64)
        probe = np.concatenate([(r[:, None] + [0, 0.5, -0.5, 0.25, 0.75]).reshape(-1) * float(xs),
                                [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 3e38, -3e38]]).astype(_F32)
    else:
        probe = np.arange(256, dtype=np.uint8).view(codes_in)
    with np.errstate(over="ignore", invalid="ignore"):     # the probe's own huge values and NaN
        made = quantize(probe, s, z) if quantize is not None else probe
        looked = table.view(np.uint8)[made.view(np.uint8)].view(table.dtype)
        want = dequantize(looked, ys, yz) if dequantize is not None else looked
        got = compute(probe)
    if got.dtype != want.dtype or not np.array_equal(got.view(np.uint8), want.view(np.uint8)):
        return None
    n = 5 if dequantize is not None else 3
    if quantize is not None and dequantize is not None:
        inplace = probe.copy()
        with np.errstate(over="ignore", invalid="ignore"):
            into(inplace)
        if np.array_equal(inplace.view(np.uint8), want.view(np.uint8)):
            compute.into = into
    return given[:n], x_type, compute


# -- DynamicQuantizeLinear -----------------------------------------------------------------------

@kernel("DynamicQuantizeLinear", since=11)
def dynamic_quantize_linear_11():
    def run(x):
        if x.dtype != _F32:
            raise InvalidValueError(f"x must be float32, got {x.dtype}")
        lo, hi, scale, zp = _dynamic_parameters(x)
        if scale == 0:      # x is all zeros (or empty): every value quantizes to 0 with zero point 0
            y = np.zeros(x.shape, _U8)
        else:
            y = _dynamic_quantize(x, scale, zp, lo, hi)
        return y, np.asarray(scale, _F32), np.asarray(zp, _U8)
    return run


def _dynamic_parameters(x: np.ndarray):
    """DynamicQuantizeLinear's (lo, hi, scale, zero point) of float32 x: the range widened to hold 0, the
    scale (hi - lo) / 255, the zero point saturate(round(-lo / scale)) (0 where the scale is 0); lo, hi
    and the scale as Python floats (the scale a float32 value), the zero point a uint8.

    The scalar steps run on Python floats, each result rounded to float32 once (_f32 = round_f32: see
    there why that is exactly float32 arithmetic); round() is half to even, as np.rint. A NaN minimum or
    maximum widens to 0, as min(0, NaN) did. test_ops_quantization.py checks the bits against numpy's
    float32 scalar steps on random and extreme ranges. ~4.6 against ~7.4 us per call, ~3 us of them the
    two reductions (measured under load)."""
    if not x.size:
        return 0.0, 0.0, 0.0, _U8_CODES[0]
    lo = float(_MIN(x, None))
    hi = float(_MAX(x, None))
    lo = lo if lo < 0.0 else 0.0
    hi = hi if hi > 0.0 else 0.0
    scale = _f32(_f32(hi - lo) / 255.0)
    if scale == 0:
        zp = _U8_CODES[0]
    elif scale != _INF:      # lo is finite then (an infinite lo makes the scale infinite)
        zp = _U8_CODES[min(max(round(_f32(-lo / scale)), 0), 255)]
    else:                    # as the numpy scalar steps give it (-lo / inf: 0; inf / inf: NaN, cast as numpy casts)
        zp = np.uint8(min(max(np.rint(np.float32(-lo) / np.float32(scale)), 0), 255))
    return lo, hi, scale, zp


def _clip_free(lo, hi, scale, zp) -> bool:
    """Whether round(x / scale) + zp lands in [0, 255] for every x in [lo, hi] (x / scale is monotone in
    x: the usual case, zp being -round(lo / scale); only ties at both ends reach 256); NaN or infinite
    bounds fail it. The float32 quotients as _dynamic_parameters computes them (exact, see there)."""
    scale = float(scale)
    if scale == 0:           # (x / 0: NaN or infinite)
        return False
    a, b = _f32(float(lo) / scale), _f32(float(hi) / scale)
    if not (-_INF < a < _INF and -_INF < b < _INF):     # infinite or NaN quotients
        return False
    return round(a) + int(zp) >= 0 and round(b) + int(zp) <= 255


def dynamic_quantize_centred(x: np.ndarray):
    """DynamicQuantizeLinear(x)'s codes less their zero point, as float32, with its scale and zero point:
    (round_half_even(x / scale), scale, zp) where no code needs the clip (round(x / scale) + zp is then
    the code, so this is exactly code - zp; the rounding by the magic constant gives +0, as the integer
    difference does, where np.rint would give -0); None otherwise (zeros, NaN, infinities, ties at both
    ends: the caller runs the op). For products that would convert the codes back to float32 and centre
    them (ops/contrib/quantized_matmul.py's DynamicQuantizeCentred)."""
    lo, hi, scale, zp = _dynamic_parameters(x)
    if scale == 0 or scale == _INF or not _clip_free(lo, hi, scale, zp):     # (the scale is never NaN)
        return None
    q = as_array(np.divide(x, scale))     # 0-d: numpy gives a scalar
    rounder = _ROUNDER[_F32][0]
    q += rounder                          # |x / scale| <= 255.5: exact round half to even
    q -= rounder
    return q, scale, zp


def _dynamic_quantize(x: np.ndarray, scale: float, zp: np.uint8, lo: float, hi: float):
    """saturate(round(x / scale) + zp) as uint8, without the clip where _clip_free proves it (NaN or
    infinite bounds take the full path). Skipping the clip: 80 against 110 us on [1, 128, 1024] (a pass of 24 us; measured under load)."""
    q = as_array(np.divide(x, scale))     # 0-d: numpy gives a scalar
    y = memory.empty(x.shape, _U8)
    if _clip_free(lo, hi, scale, zp):
        _round_into(q, y, np.asarray(zp), finite=True)      # the bounds are finite: no NaN in q
    else:
        _round_saturate_into(q, y, np.asarray(zp))
    return y
