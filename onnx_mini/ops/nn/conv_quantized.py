"""ConvInteger (10) and QLinearConv (10): convolutions of 8-bit integers, through Conv's float kernel.

x - x_zero_point and w - w_zero_point are integers (|v| <= 255), so every product and partial sum of
the convolution is an integer of at most C/group * prod(kernel) * max|x - x_zp| * max|w - w_zp| in
magnitude: float32 holds it exactly up to 2^24, float64 up to 2^53 (math.matmul's exact integer
products). The convolution runs as Conv's float formulation (`Convolution`, one per node and float
type) in float32 when that bound, plus max |B| for QLinearConv's bias (the convolution adds it), stays
within 2^24, Winograd left out there (its transforms do not keep float32 sums exact); else in float64.
The result is converted back to integers exactly. Padding is zero after the zero-point shift (the
input is padded with its zero point). QLinearConv rescales in float64, then rounds and saturates with
quantization.py's `quantize_array`.

Speed: a QLinearConv whose inputs but X are constants (a quantize_static model) gets its checks, W's
shift and the choice of arithmetic made once (`_constant_qlinear_conv`), and rescales in float32
where `_float32_scale` proves, for its scales, that every accumulator gives the float64 rescale's
integer with the scale rounded to float32 or, per channel, with one of the two float32 next to it
(a layer where none of the three does keeps float64). That float32 rescale saturates on the rounder's
bit pattern (`_bits_plan`: scale, add the rounder with y's zero point, clip the pattern's integers,
keep its low byte) where no product can leave the rounder's exponent.
Such a node also skips X's zero-point pass where `_ZeroPointFold` proves it exact: conv(x - x_zp, W) + B is
conv(x, W) + (B - x_zp * [W summed over the taps that fall inside X]), the bracket a per-channel bias
where no tap reaches the padding, else a per-output-position map made once per input shape.

Made once at prepare from constants (`ops._common.prepack`): w - w_zero_point with the range of its
values (a tighter bound than the type's), B as floats with its range, and QLinearConv's rescale
x_scale * w_scale / y_scale.
"""
from __future__ import annotations

import functools
import math
from operator import is_not

import numpy as np

from ... import memory
from ...errors import InvalidValueError
from ...registry import kernel
from .._common import by_shape, prepack
from ..math.matmul import F32_EXACT, centered, integer_range
from ..quantization import _clip, quantize_array
from ._common import check_auto_pad, taps_inside
from .conv import Convolution
from .conv.checks import shape_geometry
from .conv.channels_last import ConvNHWC

_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)


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


def _shifted_weight(w, w_zero_point, measured=False) -> tuple[np.ndarray, int]:
    """(w - w_zero_point as float32 holding exact integers, a bound on its magnitude): from the types, or
    measured from the values (a constant W, made once)."""
    _check_8bit(w, "w")
    if w.ndim < 3:
        raise InvalidValueError(f"w must have rank >= 3 (M, C/group, spatial...), got shape {list(w.shape)}")
    m = w.shape[0]
    if w_zero_point is not None and w_zero_point.size != 1 and w_zero_point.shape != (m,):
        _per_tensor_or_channel(w_zero_point, _F32, "w_zero_point", per_channel=m)   # raises, naming the shapes
    zp = None if w_zero_point is None else w_zero_point.reshape((-1,) + (1,) * (w.ndim - 1))
    ws = centered(w, zp)
    if measured:
        ws.setflags(write=False)
        return ws, int(max(-float(ws.min()), float(ws.max()))) if ws.size else 0
    return ws, integer_range(w.dtype, w_zero_point)


def _attrs(auto_pad, dilations, group, kernel_shape, pads, strides):
    auto_pad = check_auto_pad(auto_pad)
    if group < 1:
        raise ValueError(f"group must be >= 1, got {group}")
    return dict(auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape, pads=pads,
                strides=strides)


def _int_bias(b) -> tuple[np.ndarray, int]:
    """QLinearConv's int32 B as float32 (exact while |B| <= 2^24; checked against that) and max |B|."""
    bf = b.astype(_F32)
    bf.setflags(write=False)
    return bf, int(np.abs(b.astype(np.int64)).max()) if b.size else 0


class _IntegerConv:
    """conv(x - x_zero_point, w - w_zero_point) (+ B) as float values holding the exact integers, for
    one node: w's shift (and B as floats) made once when constant, and one Convolution per float type,
    which keeps the constant W's per-shape transforms."""

    def __init__(self, attrs, constants, w_index, zp_index, b_index=None):
        constants = constants or {}
        self.attrs = attrs
        self.weight = prepack(lambda w, zp: _shifted_weight(w, zp, measured=True), constants, (w_index, zp_index)) \
            if w_index in constants else _shifted_weight
        self.bias = prepack(_int_bias, constants, (b_index,)) if b_index in constants else _int_bias
        self.prepared = None              # the constant W's shift (float32), once seen
        self.w64 = None                   # ... and in float64, made on first need
        self.convs = {}

    def __call__(self, x, w, x_zero_point, w_zero_point, b=None):
        _check_8bit(x, "x")
        ws, rw = self.weight(w, w_zero_point)
        constant = not ws.flags.writeable          # prepared ones are read-only, per-call ones are not
        xzp = None if x_zero_point is None else \
            _per_tensor_or_channel(x_zero_point, x_zero_point.dtype, "x_zero_point")
        bf, rb = (None, 0) if b is None else self.bias(b)
        # every partial sum, and the bias added to it, within 2^24: float32 holds them exactly
        exact32 = math.prod(w.shape[1:]) * integer_range(x.dtype, xzp) * rw + rb <= F32_EXACT
        ft = _F32 if exact32 else _F64
        if not exact32:
            if constant:
                if self.w64 is None or self.prepared is not ws:
                    w64 = ws.astype(_F64)
                    w64.setflags(write=False)
                    self.prepared, self.w64 = ws, w64
                ws = self.w64
            else:
                ws = ws.astype(_F64)
            bf = None if b is None else b.astype(_F64)
        conv = self.convs.get(ft)
        if conv is None:
            known = {1: ws} if constant else {}
            if bf is not None and not bf.flags.writeable and exact32:
                known[2] = bf
            conv = self.convs[ft] = Convolution(**self.attrs, constants=known, exact=exact32)
        return conv(centered(x, xzp, ft), ws, bf)


@kernel("ConvInteger", since=10, heavy=True)
def conv_integer_10(*, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None,
                    _constants=None):
    conv = _IntegerConv(_attrs(auto_pad, dilations, group, kernel_shape, pads, strides), _constants, 1, 3)

    def conv_integer(x, w, x_zero_point=None, w_zero_point=None):
        y = conv(x, w, x_zero_point, w_zero_point)
        if y.dtype == _F64:   # exact integers; beyond int32 the accumulation wraps (allowed only in 32 bits)
            return y.astype(np.int64).astype(np.int32)
        return y.astype(np.int32)
    return conv_integer


def _rescale(x_scale, w_scale, y_scale):
    """x_scale * w_scale / y_scale in float64 from the float32 scales: a scalar or one per output channel."""
    xs = _per_tensor_or_channel(x_scale, _F64, "x_scale")
    ws = _per_tensor_or_channel(w_scale, _F64, "w_scale", per_channel=w_scale.size)
    ys = _per_tensor_or_channel(y_scale, _F64, "y_scale")
    return xs * ws / ys


@kernel("QLinearConv", since=10, heavy=True)
def qlinear_conv_10(*, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None,
                    _constants=None):
    conv = _IntegerConv(_attrs(auto_pad, dilations, group, kernel_shape, pads, strides), _constants, 3, 5, 8)
    rescale = prepack(_rescale, _constants, (1, 4, 6), required=3)

    def qlinear_conv(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B=None):
        _check_8bit(y_zero_point, "y_zero_point")
        m = w.shape[0] if w.ndim else 0
        if B is not None:
            if B.shape != (m,) or B.dtype != np.int32:
                raise InvalidValueError(f"B must be an int32 tensor of shape [{m}], got {B.dtype} {list(B.shape)}")
        if w_scale.size != 1 and w_scale.shape != (m,):
            _per_tensor_or_channel(w_scale, _F64, "w_scale", per_channel=m)   # raises, naming the shapes
        acc = conv(x, w, x_zero_point, w_zero_point, B)          # (x - x_zp) * (w - w_zp) + B, exact
        scale = rescale(x_scale, w_scale, y_scale)
        if scale.ndim:
            scale = scale.reshape((1, -1) + (1,) * (acc.ndim - 2))
        zp = _per_tensor_or_channel(y_zero_point, y_zero_point.dtype, "y_zero_point")
        return _requantize64(acc, scale, zp)

    fast = _constant_qlinear_conv(conv, _constants)
    if fast is None:
        return qlinear_conv
    given, x_type, xzp, ws, bf, requantize, zp = fast
    convolution = conv.convs[_F32]
    fold = None if xzp is None else _ZeroPointFold.make(conv.attrs, ws, given[7], xzp, x_type)
    if fold is not None:
        convolution = fold

    def qlinear_conv_constant(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B=None):
        """Every input but X the prepared constants, X of their type: no per-call checks or lookups."""
        if x.dtype != x_type or x.ndim != ws.ndim or any(map(is_not, (  # (map: 0.6 us, a generator's 2)
                x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B), given)):
            return qlinear_conv(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B)
        acc = convolution(x.astype(_F32), ws, bf) if fold is not None else convolution(centered(x, xzp), ws, bf)
        return requantize(acc, zp=zp)
    return qlinear_conv_constant


class _ZeroPointFold:
    """conv(x - x_zp, W) + B for a constant W and B, from X merely cast to float32: conv(x, W) + C, where
    C = B - x_zp * conv(1, W) (an integer map: the padding is zero after the shift, so a tap on it adds
    no x_zp * w). C is B - x_zp * sum(W) per channel where no tap reaches the padding (then added as
    the convolution's bias), else a map per output position, made once per input shape. Called as the
    Convolution it replaces: fold(x, w, b) with x cast from X and w, b the prepared W and B (ignored).

    Exact in float32 when every partial sum is: those of conv(x, W) are at most max|x| * sum|W_m| for
    channel m, C's at most |B_m| + |x_zp| * sum|W_m|, and the final sum is the unfolded accumulator
    (within the node's bound). Saves the pass subtracting x_zp from X: the kernel took 0.73-0.92x its time
    on the folded layers of the quantize_static MobileNet (kernel alone, under load); inside whole runs
    the gain was within the noise."""

    def __init__(self, attrs, ws, b, z):
        m = ws.shape[0]
        self.attrs, self.ws, self.z = attrs, ws, z
        self.bias = np.zeros(m, np.int64) if b is None else b.astype(np.int64)
        self.channel_sum = ws.reshape(m, -1).astype(np.int64).sum(axis=1)
        folded = (self.bias - z * self.channel_sum).astype(_F32)
        folded.setflags(write=False)
        self.folded = folded
        self.with_bias = Convolution(**attrs, constants={1: ws, 2: folded}, exact=True)
        self.plain = Convolution(**attrs, constants={1: ws}, exact=True)
        self.correction = by_shape(self._correction)

    @classmethod
    def make(cls, attrs, ws, b, xzp, x_type):
        """The fold for X's zero point xzp (nonzero), or None where a partial sum could pass 2^24."""
        info = np.iinfo(x_type)
        z = int(xzp)
        m = ws.shape[0]
        l1 = np.abs(ws.reshape(m, -1).astype(np.int64)).sum(axis=1)
        bias = 0 if b is None else np.abs(b.astype(np.int64))
        if int((max(-info.min, info.max) * l1 + bias + abs(z) * l1).max(initial=0)) > F32_EXACT:
            return None
        return cls(attrs, ws, b, z)

    def _correction(self, shape):
        """C for inputs of shape (N, *shape): None where it is the per-channel folded bias, else the map
        (1, M, *output) in float32 (exact integers). (Adding the folded bias, then C's difference on the
        border slabs only, measured slower on every MobileNet layer: a slab add costs ~3.5 us.)"""
        covered = self._covered(shape)
        per_channel = (1, -1) + (1,) * (covered.ndim - 2)
        if (covered == self.channel_sum.reshape(per_channel)).all():      # no tap on the padding
            return None
        c = (self.bias.reshape(per_channel) - self.z * covered).astype(_F32)
        c.setflags(write=False)
        return c

    def _covered(self, shape):
        """(1, M, *output) float64: W summed over the taps that read inside an X of shape (N, *shape), per
        output position (the convolution of ones), from each spatial axis' mask of those taps: the sum over
        W's input channels contracted with one mask after the other. Integers far below 2^53, summed
        exactly in any order: float64 takes BLAS (an int64 product is numpy's plain loop). The stem of
        mobilenet_qop (16x3x3x3 on 3x224x224): 0.25 ms against 1.4 for the convolution of ones."""
        x = np.broadcast_to(_F32.type(0), (1,) + tuple(shape))         # X's shape, for the checks
        kernel, strides, dilations, begin, _, out = shape_geometry(x, self.ws, None, **self.attrs)
        covered = self.ws.astype(_F64).sum(axis=1)                      # (M, *kernel)
        for inside in taps_inside(shape[1:], kernel, strides, dilations, begin, out):
            # the next kernel axis (always axis 1) summed into its output axis, appended last
            covered = np.tensordot(covered, inside.astype(_F64), axes=([1], [1]))
        return covered[None]

    def __call__(self, xf, w, b):
        c = self.correction(xf.shape[1:])
        if c is None:
            return self.with_bias(xf, self.ws, self.folded)
        acc = self.plain(xf, self.ws)
        acc += c
        return acc


def _requantize64(acc, scale, zp):
    """The real-valued rescale in float64: acc * scale with its one rounding, then rounded half to even,
    the zero point added, saturated (quantize_array). (A cast then an in-place product: a ufunc mixing
    float32 and float64 casts in buffers, 2-3x slower.)"""
    y = acc.astype(_F64)
    y *= scale
    return quantize_array(y, zp.dtype, zp, scratch=True)


def _requantize32(acc, scale, zp, bits=None):
    """_requantize64's integers from float32 arithmetic with the scale in float32 (acc is overwritten),
    where _float32_rescale_is_exact proved them equal (half the bytes per pass: 16x112x112 276 -> 133 us).
    bits: _bits_plan's (rounder, low, high, zero point added after) for this scale, or None."""
    acc *= scale
    if bits is None:
        return quantize_array(acc, zp.dtype, zp, scratch=True, finite=True)   # exact integers times a finite scale
    rounder, low, high, zp_after = bits
    acc += rounder                      # its bit pattern: _PATTERN + round(acc * scale) (+ zp when folded)
    pattern = acc.view(np.int32)
    _clip(pattern, low, high, out=pattern)          # saturation, on the integers
    out = memory.empty(acc.shape, zp.dtype)
    np.copyto(out, pattern, casting="unsafe")       # the low 8 bits: the code
    if zp_after:
        out += zp
    return out


# float32's bit pattern of 1.5 * 2^23 (whose low 16 bits are zero) and the magnitude below which q + 1.5 *
# 2^23 + zp keeps that exponent (the sum in [2^23, 2^24), where float32 holds the integers only)
_PATTERN = int(np.array(1.5 * 2 ** 23, _F32).view(np.int32))
_BITS_MAX_PRODUCT = 2 ** 21


def _bits_plan(s32, zp, bound: int):
    """_requantize32's `bits` for the float32 scale s32 ((), or one per channel broadcasting as the
    accumulator) and every integer accumulator |acc| <= bound, or None. Clipping the product, then adding
    the rounder (quantization.py's _round_into) costs a float clip; here the rounder is added first and
    the integers of its bit pattern are clipped, which is the same saturation where no product can leave
    the rounder's exponent (|acc * s32| < 2^21: checked), and an integer clip costs 0.77x a float one
    (22 against 28.6 us over 16x112x112). y's zero point joins the rounder where that rounds as the spec
    does (an even zero point, or no product a tie: _meets_ties), saving the 8-bit add. Measured on the
    quantize_static MobileNet's 19 QLinearConvs (requantization alone, CPU time, under load): 333 ->
    297 us a run, 0.71-0.91x on the small layers, ~1.0x on the 16x112x112 one."""
    s = np.asarray(s32, _F32).reshape(-1)
    if not s.size or not (np.all(np.isfinite(s)) and np.all(s > 0)):
        return None
    if float(bound) * float(s.max()) * 1.001 >= _BITS_MAX_PRODUCT:
        return None
    info = np.iinfo(zp.dtype)
    z = int(zp)
    fold = z % 2 == 0 or _meets_ties(s, zp, bound) is False
    shift = z if fold else 0            # the zero point in the rounder: the pattern holds round(q) + zp
    rounder = _F32.type(1.5 * 2 ** 23 + shift)
    low, high = _PATTERN + info.min - z + shift, _PATTERN + info.max - z + shift
    return rounder, np.int32(low), np.int32(high), not fold


# Candidate accumulators per tie at most (all channels): beyond, the proof is skipped and float64 kept
# (typical 8-bit layers need a few per tie: a scale of 1e-3..1e-2 puts ties 100-1000 apart).
_PROOF_MAX_CANDIDATES = 1 << 21


def _float32_rescale_is_exact(scale, zp, bound: int) -> bool:
    """Whether _requantize32 with the scale rounded to float32 gives _requantize64's result for every
    integer accumulator |acc| <= bound (exact in float32: bound <= 2^24), scale (float64, () or (M,))
    and y's zero point zp (a scalar). See _rescale_mismatches."""
    s = np.asarray(scale, _F64).reshape(-1)
    bad = _rescale_mismatches(s, s.astype(_F32), zp, bound)
    return bad is not None and not bad.any()


def _float32_scale(scale, zp, bound: int) -> np.ndarray | None:
    """A float32 scale (scale's shape) with which _requantize32 gives _requantize64's integers for every
    accumulator |acc| <= bound, or None: per channel the scale rounded to float32, else the float32 just
    above or below it, whichever the proof passes first (the rounded one misses by a near tie in about
    one layer in five of a quantize_static MobileNet; a neighbour passed in each of them)."""
    s = np.asarray(scale, _F64).reshape(-1)
    nearest = s.astype(_F32)
    chosen = nearest.copy()
    todo = np.ones(s.size, bool)
    for candidate in (nearest, np.nextafter(nearest, np.float32(np.inf)), np.nextafter(nearest, np.float32(0))):
        bad = _rescale_mismatches(s, candidate, zp, bound)
        if bad is None:
            return None
        take = todo & ~bad
        chosen[take] = candidate[take]
        todo &= bad
        if not todo.any():
            return chosen.reshape(np.shape(scale))
    return None


def _rescale_mismatches(s, s32, zp, bound: int) -> np.ndarray | None:
    """Per channel, whether _requantize32 with scale s32 (float32, (M,)) gives another integer than
    _requantize64 with s (float64, (M,)) for some integer accumulator |acc| <= bound; None where the
    proof does not apply (a scale not finite and positive, or too many candidates).

    Both round acc * scale half to even after clipping it to the integers [lo - zp, hi - zp], so they
    differ only where a half-integer h inside that range lies between their products. s32 is within
    1.5 float32 ulps of s (rounded to nearest: half an ulp, its neighbours: 1.5), 3 * 2^-24 relative,
    and the float32 product adds one 2^-24 rounding (float64's own error is 2^-53): float32's product is
    within |acc * s| * 2^-22 of the float64 one, so only integers acc with |acc - h / s| <= (|h| + 1) *
    2^-22 / s can differ: those, ~255 ties per channel (4x that reach, + 2), are computed both ways
    here and compared."""
    if not (np.all(np.isfinite(s)) and np.all(s > 0) and np.all(np.isfinite(s32))
            and np.all(s32 >= np.finfo(_F32).tiny)):
        return None
    near = _near_ties(s, zp, bound)
    if near is None:
        return None
    acc = near[1].reshape(1, s.size, -1)
    shape = (1, s.size, 1)
    want = _requantize64(acc.astype(_F32), s.reshape(shape), zp)
    got = _requantize32(acc.astype(_F32), s32.reshape(shape), zp)
    return (want != got)[0].any(axis=1)


def _near_ties(s, zp, bound: int):
    """(the half-integers h within y's clip range [lo - zp, hi - zp] and one spare either side, (T,);
    the integer accumulators |acc| <= bound whose product by s, or by a float32 within 1.5 float32 ulps
    of it, can round to the other side of some h or onto it, as float64 (M, T, width)) for the
    positive finite scales s ((M,), float64 or float32), or None where there would be too many."""
    info = np.iinfo(zp.dtype)
    z = int(zp)
    s = np.asarray(s, _F64)
    ties = np.arange(info.min - z - 1, info.max - z + 1, dtype=_F64) + 0.5      # one spare either side
    reach = (np.abs(ties)[None, :] + 1) * 2.0 ** -20 / s[:, None] + 2             # 4x the error bound, + 2
    width = int(np.ceil(2 * reach.max())) + 1
    if s.size * ties.size * width > _PROOF_MAX_CANDIDATES:
        return None
    first = np.floor(ties[None, :] / s[:, None] - reach)                        # (M, ties)
    acc = first[..., None] + np.arange(width)                                     # (M, ties, width)
    return ties, np.clip(acc, -bound, bound)                                      # past the bound: never met


def _meets_ties(s32, zp, bound: int) -> bool | None:
    """Whether some integer accumulator |acc| <= bound has a float32 product float32(acc * s32) (s32:
    float32, (M,), positive and finite) exactly halfway between two integers inside y's clip range
    (where rounding half to even is not rounding the product plus an odd zero point): the products
    that can are those within float32's rounding (2^-24 relative) of a half-integer, all among
    _near_ties' candidates; None where there are too many to try."""
    near = _near_ties(s32, zp, bound)
    if near is None:
        return None
    acc = near[1]
    product = (acc.astype(_F32) * s32.reshape(-1, 1, 1)).astype(_F64)          # float32's product, exactly
    info = np.iinfo(zp.dtype)
    inside = (product > info.min - int(zp)) & (product < info.max - int(zp))
    return bool((inside & (product - np.floor(product) == 0.5)).any())


def _constant_qlinear_conv(conv, constants, channels_last=False):
    """The constant-input plan of a QLinearConv whose inputs but X are all constants and valid, and whose
    float32 accumulation is exact: (those constants in input order 1..8, X's type, its zero point, W - w_zp,
    B as float32, requantize(acc, zp=...) in float32 where proven exact, else float64, y's zero point),
    else None. channels_last: for an accumulator (N, H, W, M) (ops/fused.py's QLinearConvNHWC), which
    makes its own convolution (none is made here)."""
    constants = constants or {}
    if any(i not in constants for i in (1, 2, 3, 4, 5, 6, 7)):
        return None
    xs, xz, w, wsc, wz, ys, yz = (constants[i] for i in (1, 2, 3, 4, 5, 6, 7))
    b = constants.get(8)
    try:
        for a, what in ((xz, "x_zero_point"), (w, "w"), (yz, "y_zero_point")):
            _check_8bit(a, what)
        m = w.shape[0]
        if (w.ndim < 3 or xz.size != 1 or yz.size != 1 or (b is not None and (b.shape != (m,) or b.dtype != np.int32))
                or (wsc.size != 1 and wsc.shape != (m,))):
            return None
        ws, rw = conv.weight(w, wz)
        bf, rb = (None, 0) if b is None else conv.bias(b)
        xzp = xz.reshape(())
        bound = math.prod(w.shape[1:]) * integer_range(xz.dtype, xzp) * rw + rb     # max |acc|
        if bound > F32_EXACT:
            return None
        zp = yz.reshape(())
        # the proof once per model and bound: the optimiser's checks, the kernel and the channels-last
        # kernel each plan the node (mobilenet_qop: 67 plans of 19 nodes, ~0.3 ms each)
        scale, s32, bits = prepack(lambda *params: _scale_plan(*params, bound), constants, (1, 4, 6, 7),
                                   required=4)(xs, wsc, ys, yz)
    except (InvalidValueError, ValueError):
        return None                     # the general path raises it at run time, as for fed inputs
    if not channels_last:
        known = {1: ws} if bf is None else {1: ws, 2: bf}
        conv.convs[_F32] = Convolution(**conv.attrs, constants=known, exact=True)
        if scale.ndim:
            scale = scale.reshape((1, -1) + (1,) * (w.ndim - 2))
    requantize = functools.partial(_requantize64, scale=scale) if s32 is None else \
        functools.partial(_requantize32, scale=s32.reshape(scale.shape), bits=bits)
    given = (xs, xz, w, wsc, wz, ys, yz, b)
    return given, xz.dtype, (xzp if xzp.any() else None), ws, bf, requantize, zp


def _scale_plan(x_scale, w_scale, y_scale, y_zero_point, bound: int):
    """(the float64 rescale, its proven float32 form or None (_float32_scale), _bits_plan's bits for it or
    None) of a constant QLinearConv whose accumulators are at most `bound` in magnitude."""
    scale = _rescale(x_scale, w_scale, y_scale)
    zp = y_zero_point.reshape(())
    s32 = _float32_scale(scale, zp, bound)
    for v in (scale, s32):          # shared by the node's plans
        if v is not None:
            v.setflags(write=False)
    return scale, s32, (None if s32 is None else _bits_plan(s32, zp, bound))


def constant_plan_applies(constants, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None,
                          strides=None) -> bool:
    """Whether a QLinearConv with these attributes and constant inputs {index: value} has the constant
    plan (every input but X a valid constant, the float32 sums proven exact): what optimize/channels_last.py
    asks before running it channels-last."""
    try:
        conv = _IntegerConv(_attrs(auto_pad, dilations, group, kernel_shape, pads, strides), constants, 3, 5, 8)
    except ValueError:
        return False
    return _constant_qlinear_conv(conv, constants, channels_last=True) is not None


def qlinear_conv_channels_last(geometry: dict, constants):
    """QLinearConv on channels-last codes (optimize/channels_last.py): X (N, H, W, C) and Y (N, Ho, Wo, M),
    the other inputs as QLinearConv has them. With every input but X constant and the float32 sums
    proven exact (the constant plan of _constant_qlinear_conv, X's zero point folded where it proves that
    exact), the integer sums run in ConvNHWC's algorithms, exact in any summation order as every partial
    sum is an integer within 2^24, then the NCHW kernel's requantization, per channel along the last
    axis: the very integers QLinearConv gives. Otherwise QLinearConv itself on X transposed.
    geometry: the Conv attributes by name; constants: {input index: value} (a factory's _constants)."""
    nchw = qlinear_conv_10(**geometry, _constants=constants)

    def transposed(x, *rest):
        if x.ndim != 4:
            raise InvalidValueError(f"the channels-last QLinearConv takes a 4-D X, got {list(x.shape)}")
        return np.ascontiguousarray(nchw(x.transpose(0, 3, 1, 2), *rest).transpose(0, 2, 3, 1))
    integer = _IntegerConv(_attrs(**geometry), constants, 3, 5, 8)
    fast = _constant_qlinear_conv(integer, constants, channels_last=True)
    if fast is None or fast[3].ndim != 4:
        return transposed
    given, x_type, xzp, ws, bf, requantize, zp = fast
    fold = None if xzp is None else _ZeroPointFold.make(integer.attrs, ws, given[7], xzp, x_type)
    if fold is None:
        conv = ConvNHWC(**geometry, constants={1: ws} if bf is None else {1: ws, 2: bf}, exact=True)
    else:                       # X's zero point folded: only these two run (each prepares W once)
        folded = ConvNHWC(**geometry, constants={1: ws, 2: fold.folded}, exact=True)
        plain = ConvNHWC(**geometry, constants={1: ws}, exact=True)

        def nhwc_correction(shape):         # (H, W, C) -> the fold's map channels-last, or None
            c = fold.correction((shape[2], shape[0], shape[1]))
            if c is None:
                return None
            c = np.ascontiguousarray(c.transpose(0, 2, 3, 1))
            c.setflags(write=False)
            return c
        correction = by_shape(nhwc_correction)
    scale = requantize.keywords["scale"]
    if scale.ndim:          # per channel: the scale tiled along an output row (ConvNHWC.along_row's why)
        def row_requantize(ow):
            tiled = np.tile(scale, ow)
            tiled.setflags(write=False)
            return functools.partial(requantize, scale=tiled)
        by_width = by_shape(row_requantize)

    def qlinear_conv_nhwc(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B=None):
        if x.dtype != x_type or x.ndim != 4 or any(map(is_not, (
                x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B), given)):
            return transposed(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B)
        if fold is None:
            acc = conv(centered(x, xzp), ws, bf)
        else:
            c = correction(x.shape[1:])
            if c is None:
                acc = folded(x.astype(_F32), ws, fold.folded)
            else:
                acc = plain(x.astype(_F32), ws)
                acc += c
        if not scale.ndim:
            return requantize(acc, zp=zp)
        n, oh, ow, m = acc.shape
        return by_width(ow)(acc.reshape(n * oh, ow * m), zp=zp).reshape(n, oh, ow, m)
    return qlinear_conv_nhwc
