"""com.microsoft quantized products: MatMulNBits, GatherBlockQuantized, MatMulIntegerToFloat,
DynamicQuantizeMatMul, QGemm, DynamicQuantizeLSTM, QAttention (all since 1); the fused MatMulInteger tail.

Spec: onnxruntime's ContribOperators documentation; where it is silent, onnxruntime's CPU behaviour.

- MatMulNBits: B holds N rows of K weights quantized in blocks of `block_size` along K, bit-packed
  low bits first (for 4 bits: first value in the low nibble); W[n, k] = (q[n, k] - zp[n, k // bs]) *
  scale[n, k // bs] with the default zero point 2^(bits-1); Y = A @ W^T (+ bias). Weights are
  initializers: W^T is dequantized once at prepare (`prepack`) when B, scales and the zero points / g_idx
  given are constants, and on every call only when some are fed at run time.
- GatherBlockQuantized: a Gather on a block-quantized table, dequantized after the gather (only the
  gathered rows are ever unpacked); an out-of-range index gives a slice of zeros. Packed zero points
  (and a packed rank-1 table) are unpacked once at prepare when constant.
- MatMulIntegerToFloat / DynamicQuantizeMatMul / QGemm / QAttention: the exact integer product
  (math.matmul's `int_matmul`: float32 BLAS, K split where the sums could pass 2^24), scaled in
  float32; B - b_zero_point and the range of its values are made once at prepare when B and its zero
  point are constants.
- MatMulIntegerScaled (the optimiser's private domain): MatMulInteger -> Cast(to=FLOAT) -> Mul(scale)
  [-> Add(bias)] as one step, bit for bit the chain (optimize/patterns.py writes it); with centred=1 its A
  comes from DynamicQuantizeCentred: DynamicQuantizeLinear's codes less their zero point, in float32.
  MatMulIntegerScaledGroup: such steps sharing A (Q, K, V) as one product by their Bs side by side.
- DynamicQuantizeLSTM: LSTM (ops/rnn) on the dequantized W and R, dequantized at prepare like MatMulNBits.
  onnxruntime also quantizes X and the hidden state to uint8 at every step; the documentation does not
  ask for it, so this runtime keeps them in float32 (results agree to about one quantization step).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from ... import blas, parallel
from ...errors import InvalidValueError
from ...registry import kernel
from .._common import as_array, broadcasts_to, normalize_axis, prepack, same_type
from ..fused import FUSED_DOMAIN
from ..math.activations import gelu_20
from ..math.elementwise import binary
from ..math.matmul import (F32_EXACT, _int_product, _int_weight, _per_col, _weight_of, _zero_points, centered,
                           int_matmul, int_operand, integer_range, matmul, to_int32)
from ..math.normal_cdf import gelu_float32
from ..quantization import dynamic_quantize_centred, dynamic_quantize_linear_11, quantize_array
from ..rnn import lstm_14
from ..tensor.cast import FLOAT8_MAX

MS = "com.microsoft"
_F32 = np.dtype(np.float32)
_U8 = np.dtype(np.uint8)
_FLOATS = frozenset(np.dtype(t) for t in (np.float32, np.float16, ml_dtypes.bfloat16))
_INT8S = frozenset(np.dtype(t) for t in (np.int8, np.uint8))


def unpack_bits(packed: np.ndarray, bits: int) -> np.ndarray:
    """uint8 values packed along the last axis, low-order bits first -> one uint8 per value (that axis
    grows 8 / bits times). bits is 2, 4 or 8. One shift and mask per position within a byte, written
    with a stride (one broadcast over a trailing axis of 8 / bits shifts runs inner loops that short:
    the int4 decoder's [4864, 448] bytes 38 ms against ~3)."""
    if bits == 8:
        return packed
    per_byte = 8 // bits
    values = np.empty((*packed.shape, per_byte), np.uint8)
    for i in range(per_byte):
        np.bitwise_and(packed >> np.uint8(i * bits), np.uint8((1 << bits) - 1), out=values[..., i])
    return values.reshape(*packed.shape[:-1], packed.shape[-1] * per_byte)


def _check_bits(bits: int) -> int:
    if bits not in (2, 4, 8):
        raise ValueError(f"bits must be 2, 4 or 8, got {bits}")
    return bits


def _check_block_size(block_size: int, allow_zero: bool = False) -> int:
    if allow_zero and block_size == 0:
        return 0
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of 2 and >= 16, got {block_size}")
    return block_size


def _float_input(x: np.ndarray, what: str) -> None:
    if x.dtype not in _FLOATS:
        raise InvalidValueError(f"{what} must be float, float16 or bfloat16, got {x.dtype}")


# -- MatMulNBits ----------------------------------------------------------------------------------

@kernel("MatMulNBits", since=1, domain=MS, heavy=True)
def matmul_nbits_1(*, K, N, block_size, bits=4, accuracy_level=0, weight_prepacked=0, _constants=None):
    """accuracy_level only allows onnxruntime to compute with less precision; this runtime always
    multiplies in float32 (float16/bfloat16 A: rounded back once), which every level accepts."""
    bits, bs = _check_bits(bits), _check_block_size(block_size)
    if K <= 0 or N <= 0:
        raise ValueError(f"K and N must be positive, got K={K}, N={N}")
    if weight_prepacked:
        raise ValueError(f"weight_prepacked={weight_prepacked} (an execution-provider layout) is not supported")
    if accuracy_level not in range(5):
        raise ValueError(f"accuracy_level must be 0..4, got {accuracy_level}")
    n_blocks = -(-K // bs)
    blob = bs * bits // 8
    zp_bytes = -(-n_blocks * bits // 8)

    def dequantize(b, scales, zero_points, g_idx):
        """W^T [K, N] for the product: (code - zero point) * scale per weight, in float32, stored as
        N contiguous rows of K (a transposed view) or as K rows of N, whichever a one-token product reads
        faster (blas.laid_out); a larger A takes either as BLAS's operand without a copy."""
        if b.dtype != _U8 or b.size != N * n_blocks * blob:
            raise InvalidValueError(f"B must be uint8 of shape [N={N}, k_blocks={n_blocks}, blob_size={blob}], "
                                    f"got {b.dtype} {list(b.shape)}")
        if scales.size != N * n_blocks:
            raise InvalidValueError(f"scales must have shape [N={N}, k_blocks={n_blocks}], got {list(scales.shape)}")
        block = None
        if g_idx is not None:
            if g_idx.size != K or g_idx.dtype.kind not in "iu":
                raise InvalidValueError(f"g_idx must hold K={K} integers, got {g_idx.dtype} {list(g_idx.shape)}")
            block = g_idx.reshape(-1).astype(np.int64)
            if K and (block.min() < 0 or block.max() >= n_blocks):
                raise InvalidValueError(f"g_idx values must lie in [0, {n_blocks - 1}]")
        if zero_points is None:
            zp = np.float32(1 << (bits - 1))
        elif zero_points.dtype == _U8:
            if zero_points.size != N * zp_bytes:
                raise InvalidValueError(f"packed uint8 zero_points must have shape [N={N}, {zp_bytes}], "
                                        f"got {list(zero_points.shape)}")
            zp = unpack_bits(zero_points.reshape(N, zp_bytes), bits)[:, :n_blocks].astype(_F32)
        else:
            if zero_points.size != N * n_blocks or zero_points.dtype not in _FLOATS:
                raise InvalidValueError(f"float zero_points must have shape [N={N}, k_blocks={n_blocks}], got "
                                        f"{zero_points.dtype} {list(zero_points.shape)}")
            zp = zero_points.reshape(N, n_blocks).astype(_F32)
        s = scales.reshape(N, n_blocks).astype(_F32)
        q = unpack_bits(b.reshape(N, n_blocks * blob), bits).astype(_F32)
        if block is None:
            # blocks in K's order: the zero point and scale broadcast over each block's codes (the same
            # float32 operations as the gathered form below, per weight)
            blocks = q.reshape(N, n_blocks, bs)
            blocks -= zp if zp.ndim == 0 else zp[:, :, None]
            blocks *= s[:, :, None]
        w = q[:, :K]                            # (a last block's padding cut)
        if block is not None:
            w -= zp if zp.ndim == 0 else zp[:, block]
            w *= s[:, block]
        return blas.laid_out(w.T)

    weights = prepack(dequantize, _constants, (1, 2, 3, 4), required=2)

    def run(a, b, scales, zero_points=None, g_idx=None, bias=None):
        _float_input(a, "A")
        if a.ndim == 0 or a.shape[-1] != K:
            raise InvalidValueError(f"A of shape {list(a.shape)} must end with K={K}")
        w = weights(b, scales, zero_points, g_idx)
        y = as_array(np.matmul(a.astype(_F32, copy=False), w))
        if bias is not None:
            if bias.size != N:
                raise InvalidValueError(f"bias must have N={N} values, got shape {list(bias.shape)}")
            y += bias.reshape(N).astype(_F32)
        return y.astype(a.dtype, copy=False)
    return run


# -- GatherBlockQuantized -------------------------------------------------------------------------

_GBQ_INTS = frozenset(np.dtype(t) for t in (ml_dtypes.int4, ml_dtypes.uint4, np.uint8))
_GBQ_FLOATS = frozenset(FLOAT8_MAX) - {np.dtype(ml_dtypes.float8_e8m0fnu)}


@kernel("GatherBlockQuantized", since=1, domain=MS)
def gather_block_quantized_1(*, bits=4, block_size=128, gather_axis=0, quantize_axis=1, _constants=None):
    bits, block_size = _check_bits(bits), _check_block_size(block_size, allow_zero=True)
    # packed uint8 values, one per byte: the constant zero points (and a rank-1 table) once, at prepare
    unpacked_zp = prepack(lambda zp: unpack_bits(zp, bits) if zp.dtype == _U8 else zp, _constants, (3,))
    unpacked_data = prepack(lambda d: unpack_bits(d, bits) if d.dtype == _U8 and d.ndim == 1 else d, _constants, (0,))

    def run(data, indices, scales, zero_points=None):
        dt = data.dtype
        is_float = dt in _GBQ_FLOATS
        if not is_float and dt not in _GBQ_INTS:
            raise InvalidValueError(f"data has type {dt}; GatherBlockQuantized takes int4, uint4, uint8, "
                                    f"float8 or float4e2m1")
        _float_input(scales, "scales")
        if indices.dtype not in (np.int32, np.int64):
            raise InvalidValueError(f"indices must be int32 or int64, got {indices.dtype}")
        r = data.ndim
        if r < 1:
            raise InvalidValueError("data must have rank >= 1")
        packed = dt == _U8 and bits < 8
        per_byte = 8 // bits if packed else 1
        shape = data.shape[:-1] + (data.shape[-1] * per_byte,)
        g = normalize_axis(gather_axis, r, "gather_axis")
        qa = normalize_axis(quantize_axis, r, "quantize_axis")
        if dt == _U8 and g != 0:
            raise InvalidValueError(f"uint8 data can only be gathered on axis 0, got gather_axis={gather_axis}")
        if is_float and zero_points is not None:
            raise InvalidValueError("zero_points must not be given for float8/float4 data")
        if block_size == 0 and not is_float:
            raise InvalidValueError("block_size=0 is only valid for float8/float4 data")
        d = shape[qa]
        bs = block_size or max(d, 1)
        expected = tuple(-(-n // bs) if i == qa else n for i, n in enumerate(shape))
        if scales.ndim != r or any(s != e and not (is_float and s == 1 and i != qa)
                                   for i, (s, e) in enumerate(zip(scales.shape, expected))):
            raise InvalidValueError(f"scales of shape {list(scales.shape)} do not match data of shape {list(shape)} "
                                    f"with block_size={bs} on axis {qa} (expected {list(expected)})")
        zp = zero_points
        if zp is not None:
            if zp.dtype != dt:
                raise InvalidValueError(f"zero_points ({zp.dtype}) must have the type of data ({dt})")
            zshape = zp.shape[:-1] + (zp.shape[-1] * per_byte,) if zp.ndim else zp.shape
            if zp.ndim != r or zshape[:-1] != scales.shape[:-1] or not \
                    scales.shape[-1] <= zshape[-1] < scales.shape[-1] + per_byte:
                raise InvalidValueError(f"zero_points of shape {list(zp.shape)} do not match scales "
                                        f"{list(scales.shape)}" + (f" ({per_byte} values per byte)" if packed else ""))
        if packed and zp is not None:          # the zero points are small: unpack them whole
            zp = unpacked_zp(zp)[..., :scales.shape[-1]]
        if packed and g == r - 1:              # gathering along the packed axis (rank 1): unpack first
            data, packed = unpacked_data(data), False
        s = shape[g]
        idx = indices.reshape(-1).astype(np.int64)
        valid = (idx >= -s) & (idx < s)
        idx = np.where(valid, np.where(idx < 0, idx + s, idx), 0)
        out_shape = shape[:g] + indices.shape + shape[g + 1:]
        if s == 0:
            return np.zeros(out_shape, scales.dtype)
        rows = np.take(data, idx, axis=g)
        if packed:
            rows = unpack_bits(rows, bits)
        if qa == g:                            # one block per gathered index
            sc = np.take(scales, idx // bs, axis=g)
            z = None if zp is None else np.take(zp, idx // bs, axis=g)
        else:                                  # the gathered rows' blocks, repeated along quantize_axis
            crop = (slice(None),) * qa + (slice(0, d),)
            sc = np.take(scales, idx, axis=g) if scales.shape[g] != 1 else scales
            if sc.shape[qa] != 1 or d == 1:
                sc = np.repeat(sc, bs, axis=qa)[crop]
            z = None if zp is None else np.repeat(np.take(zp, idx, axis=g), bs, axis=qa)[crop]
        y = rows.astype(_F32)
        if not is_float:
            y -= z.astype(_F32) if z is not None else np.float32(1 << (bits - 1) if dt == _U8 else 0)
        y *= sc.astype(_F32)
        if not valid.all():
            y[(slice(None),) * g + (~valid,)] = 0
        return y.astype(scales.dtype, copy=False).reshape(out_shape)
    return run


# -- MatMulIntegerToFloat, DynamicQuantizeMatMul --------------------------------------------------

def _scalar(p: np.ndarray, what: str) -> np.ndarray:
    if p.size != 1:
        raise InvalidValueError(f"{what} must be a scalar (per-tensor), got shape {list(p.shape)}")
    return p.reshape(())


def _centered_b(b, b_zp, measured=False):
    """(b - b_zp as float32, a bound of its magnitude): int_operand with B's checks; b_zp per tensor or per
    column; measured: the bound from B's values (a constant B, prepared once)."""
    if b.dtype not in _INT8S:
        raise InvalidValueError(f"B must be int8 or uint8, got {b.dtype}")
    if b_zp is not None and b_zp.dtype != b.dtype:
        raise InvalidValueError(f"b_zero_point ({b_zp.dtype}) must have the type of its operand ({b.dtype})")
    bc, rb = int_operand(b, None if b_zp is None else _per_col(b_zp, b, "b_zero_point"), measured)
    if measured:            # a constant B, made once: in the order one-row products read faster
        bc = blas.laid_out(bc)
        bc.setflags(write=False)
    return bc, rb


def _prepared_b(constants, b_index, zp_index, transform=lambda b: b):
    """get(b, b_zero_point) -> _centered_b of transform(b): measured once at prepare when B is a constant,
    else computed per call from B's type."""
    if b_index in (constants or {}):
        return prepack(lambda b, zp: _centered_b(transform(b), zp, measured=True), constants, (b_index, zp_index))
    return lambda b, zp: _centered_b(transform(b), zp)


def _integer_to_float(a, b, bc, a_scale, b_scale, a_zp, bias, out_dtype):
    """(a - a_zp) @ (b - b_zp) * a_scale * b_scale (+ bias): a per tensor, b per tensor or per column;
    bc(): (b - b_zp, its bound) from `_centered_b` (prepared or computed now), called after a's checks.
    The integer product is exact (int_matmul), then scaled in float32."""
    if a.dtype not in _INT8S:
        raise InvalidValueError(f"A must be int8 or uint8, got {a.dtype}")
    b_centered, rb = bc()
    if a_zp is not None and a_zp.dtype != a.dtype:
        raise InvalidValueError(f"a_zero_point ({a_zp.dtype}) must have the type of its operand ({a.dtype})")
    a_zp = None if a_zp is None else _scalar(a_zp, "a_zero_point")
    scale = _scalar(a_scale, "a_scale").astype(_F32) * _per_col(b_scale, b, "b_scale").astype(_F32)
    acc = int_matmul(centered(a, a_zp), b_centered, integer_range(a.dtype, a_zp) * rb, "matrix product")
    y = acc.astype(_F32, copy=False)
    y *= scale
    if bias is not None:
        if bias.ndim != 1 or bias.shape[0] != y.shape[-1]:
            raise InvalidValueError(f"bias of shape {list(bias.shape)} must be 1-D of B's last dimension "
                                    f"{y.shape[-1]}")
        y += bias.astype(_F32)
    return y.astype(out_dtype, copy=False)


@kernel("MatMulIntegerToFloat", since=1, domain=MS, heavy=True)
def matmul_integer_to_float_1(*, _constants=None):
    weight_of = _prepared_b(_constants, 1, 5)

    def run(a, b, a_scale, b_scale, a_zero_point=None, b_zero_point=None, bias=None):
        if a_scale.dtype not in (np.float32, np.float16) or b_scale.dtype != a_scale.dtype:
            raise InvalidValueError(f"a_scale and b_scale must both be float or float16, got {a_scale.dtype} "
                                    f"and {b_scale.dtype}")
        return _integer_to_float(a, b, lambda: weight_of(b, b_zero_point), a_scale, b_scale, a_zero_point, bias,
                                 a_scale.dtype)
    return run


@kernel("DynamicQuantizeMatMul", since=1, domain=MS, heavy=True)
def dynamic_quantize_matmul_1(*, _constants=None):
    quantize = dynamic_quantize_linear_11()   # A -> uint8, its scale and zero point (DynamicQuantizeLinear)
    weight_of = _prepared_b(_constants, 1, 3)

    def run(a, b, b_scale, b_zero_point=None, bias=None):
        if a.dtype != _F32 or b_scale.dtype != _F32:
            raise InvalidValueError(f"A and b_scale must be float, got {a.dtype} and {b_scale.dtype}")
        aq, a_scale, a_zp = quantize(a)
        return _integer_to_float(aq, b, lambda: weight_of(b, b_zero_point), a_scale, b_scale, a_zp, bias, _F32)
    return run


# -- QGemm ----------------------------------------------------------------------------------------

@kernel("QGemm", since=1, domain=MS, heavy=True)
def qgemm_1(*, alpha=1.0, transA=0, transB=0, _constants=None):
    alpha = np.float32(alpha)
    weight_of = _prepared_b(_constants, 3, 5, (lambda b: b.T) if transB else (lambda b: b))

    def run(a, a_scale, a_zero_point, b, b_scale, b_zero_point, c=None, y_scale=None, y_zero_point=None):
        if a.ndim != 2 or b.ndim != 2:
            raise InvalidValueError(f"A and B must be 2-D, got shapes {list(a.shape)} and {list(b.shape)}")
        a2 = a.T if transA else a
        b2 = b.T if transB else b
        if a2.shape[1] != b2.shape[0]:
            raise InvalidValueError(f"A {list(a.shape)} (transA={transA}) and B {list(b.shape)} (transB={transB}) "
                                    f"do not multiply")
        y = _integer_to_float(a2, b2, lambda: weight_of(b, b_zero_point), a_scale, b_scale, a_zero_point, None,
                              _F32)
        if c is not None:   # int32, quantized with scale alpha * a_scale * b_scale and zero point 0
            if c.dtype != np.int32:
                raise InvalidValueError(f"C must be int32, got {c.dtype}")
            if c.ndim > 2 or any(n not in (1, m) for n, m in zip(c.shape[::-1], y.shape[::-1])):
                raise InvalidValueError(f"C of shape {list(c.shape)} does not broadcast to {list(y.shape)}")
            y += c.astype(_F32) * (_scalar(a_scale, "a_scale").astype(_F32)
                                   * _per_col(b_scale, b2, "b_scale").astype(_F32))
        if alpha != 1:
            y *= alpha
        if y_scale is None:
            if y_zero_point is not None:
                raise InvalidValueError("y_zero_point is given without y_scale")
            return y
        dt = _U8 if y_zero_point is None else y_zero_point.dtype
        if dt not in _INT8S:
            raise InvalidValueError(f"y_zero_point must be int8 or uint8, got {dt}")
        zp = None if y_zero_point is None else _scalar(y_zero_point, "y_zero_point")
        return quantize_array(y / _scalar(y_scale, "y_scale").astype(_F32), dt, zp, scratch=True)

    fast = _constant_qgemm(_constants, weight_of, transB)
    if fast is None:
        return run
    given, a_type, k, a_zp, bc, scale, c_term, ys, dt, zp = fast

    def run_constant(a, a_scale, a_zero_point, b, b_scale, b_zero_point, c=None, y_scale=None, y_zero_point=None):
        """Every input but A the prepared constants (or absent), A 2-D of their type: run's steps, bit for
        bit, with the constant parts made once."""
        if a.dtype != a_type or a.ndim != 2 or a.shape[0 if transA else 1] != k or any(
                v is not g for v, g in zip((a_scale, a_zero_point, b, b_scale, b_zero_point, c, y_scale, y_zero_point),
                                           given)):
            return run(a, a_scale, a_zero_point, b, b_scale, b_zero_point, c, y_scale, y_zero_point)
        y = matmul(centered(a.T if transA else a, a_zp), bc, "matrix product")    # exact: see _constant_qgemm
        y *= scale
        if c_term is not None:
            y += c_term
        if alpha != 1:
            y *= alpha
        if ys is None:
            return y
        return quantize_array(y / ys, dt, zp, scratch=True)
    return run_constant


def _constant_qgemm(constants, weight_of, trans_b):
    """QGemm's plan when every input but A is a constant or absent (a quantize_static model) and valid:
    (those inputs in order 1..8, A's type, K, A's zero point, B - b_zero_point as float32, the float32 scale
    a_scale * b_scale, C's float32 term, y_scale as float32, y's type and zero point), else None.
    weight_of: the node's prepared B (_prepared_b).

    The product then runs as one float32 product where every partial sum of column n is within 2^24: at
    most max|a - a_zp| * sum_k |B[k, n] - b_zp| (measured once; tighter than int_matmul's K * max * max,
    which splits K at 1024 x 576 with a zero point of 134); elsewhere (None) run keeps int_matmul."""
    constants = constants or {}
    if any(i not in constants for i in (1, 2, 3, 4)):
        return None
    a_scale, a_zero_point, b, b_scale = (constants[i] for i in (1, 2, 3, 4))
    b_zero_point, c, y_scale, y_zero_point = (constants.get(i) for i in (5, 6, 7, 8))   # None: absent (or fed)
    try:
        if b.ndim != 2 or a_zero_point.dtype not in _INT8S or a_zero_point.size != 1:
            return None
        b2 = b.T if trans_b else b
        bc, _ = weight_of(b, b_zero_point)              # prepared: B - b_zero_point as float32 (K, N)
        ra = integer_range(a_zero_point.dtype, a_zero_point)
        if ra * _column_sums(bc) > F32_EXACT:
            return None
        scale = _scalar(a_scale, "a_scale").astype(_F32) * _per_col(b_scale, b2, "b_scale").astype(_F32)
        c_term = None
        if c is not None:
            # C broadcasting to every A's rows (one row, or a scalar); another shape: run's checks per call
            if c.dtype != np.int32 or c.ndim > 2 or (c.ndim and (c.size != c.shape[-1] or c.size not in (1, b2.shape[1]))):
                return None
            c_term = c.astype(_F32) * scale
        ys = dt = zp = None
        if y_scale is not None:
            dt = _U8 if y_zero_point is None else y_zero_point.dtype
            if dt not in _INT8S:
                return None
            zp = None if y_zero_point is None else _scalar(y_zero_point, "y_zero_point")
            ys = _scalar(y_scale, "y_scale").astype(_F32)
        elif y_zero_point is not None:
            return None
    except InvalidValueError:
        return None                     # run raises it, naming the node
    given = (a_scale, a_zero_point, b, b_scale, b_zero_point, c, y_scale, y_zero_point)
    a_zp = a_zero_point.reshape(())
    return given, a_zero_point.dtype, b2.shape[0], (a_zp if a_zp.any() else None), bc, scale, c_term, ys, dt, zp


# -- DynamicQuantizeLSTM --------------------------------------------------------------------------

def _dequantize_gates(w, scale, zp, what: str) -> np.ndarray:
    """[D, rows, 4H] int8/uint8 with a scale/zero point per direction ([D]) or per gate column ([D, 4H])
    -> float32 [D, 4H, rows] (the ONNX LSTM layout)."""
    if w.dtype not in _INT8S or w.ndim != 3:
        raise InvalidValueError(f"{what} must be a 3-D int8/uint8 tensor, got {w.dtype} {list(w.shape)}")
    if zp.dtype != w.dtype:
        raise InvalidValueError(f"{what}_zero_point ({zp.dtype}) must have {what}'s type ({w.dtype})")
    d, g = w.shape[0], w.shape[2]
    if scale.shape not in ((d,), (d, g)) or zp.shape != scale.shape:
        raise InvalidValueError(f"{what}_scale {list(scale.shape)} and {what}_zero_point {list(zp.shape)} must "
                                f"both be [{d}] or [{d}, {g}]")
    shape = (d, 1, 1) if scale.ndim == 1 else (d, 1, g)
    wf = w.astype(_F32) - zp.reshape(shape).astype(_F32)
    wf *= scale.reshape(shape).astype(_F32)
    return np.ascontiguousarray(wf.transpose(0, 2, 1))


@kernel("DynamicQuantizeLSTM", since=1, domain=MS, multi_output=True)
def dynamic_quantize_lstm_1(*, activation_alpha=None, activation_beta=None, activations=None, clip=None,
                            direction="forward", hidden_size=None, input_forget=0, _n_outputs=3, _constants=None):
    constants = _constants or {}
    w_gates = prepack(lambda *a: _dequantize_gates(*a, "W"), constants, (1, 8, 9), required=3)
    r_gates = prepack(lambda *a: _dequantize_gates(*a, "R"), constants, (2, 10, 11), required=3)
    # the LSTM's own constants: B .. P as given, W and R as dequantized once here (the arrays `run` hands
    # it), so that it packs them once too (a bidirectional H=512 LSTM: 37 ms a call repacking 16 MB)
    inner = {i: v for i, v in constants.items() if 3 <= i <= 7}
    for i, gates, at in ((1, w_gates, (1, 8, 9)), (2, r_gates, (2, 10, 11))):
        if all(j in constants for j in at):
            try:
                inner[i] = gates(*(constants[j] for j in at))
            except Exception:       # reported by run, with the values fed
                pass
    lstm = lstm_14(activation_alpha=activation_alpha, activation_beta=activation_beta, activations=activations,
                   clip=clip, direction=direction, hidden_size=hidden_size, input_forget=input_forget,
                   _n_outputs=_n_outputs, _constants=inner)

    def run(x, w, r, b=None, sequence_lens=None, initial_h=None, initial_c=None, p=None, w_scale=None,
            w_zero_point=None, r_scale=None, r_zero_point=None):
        if any(v is None for v in (w_scale, w_zero_point, r_scale, r_zero_point)):
            raise InvalidValueError("W_scale, W_zero_point, R_scale and R_zero_point are required")
        if x.dtype != _F32:
            raise InvalidValueError(f"X must be float, got {x.dtype}")
        if w.dtype != r.dtype:
            raise InvalidValueError(f"W ({w.dtype}) and R ({r.dtype}) must have the same type")
        return lstm(x, w_gates(w, w_scale, w_zero_point), r_gates(r, r_scale, r_zero_point), b, sequence_lens,
                    initial_h, initial_c, p)
    return run


# -- QAttention -----------------------------------------------------------------------------------

def _attention_mask(mask_index, batch: int, total: int) -> np.ndarray | None:
    """True where a key position is masked out: [B, 1, 1|S, total]. mask_index is (batch_size) valid
    lengths (right padding), (2 * batch_size) end/start positions (left padding), or a raw 0/1 mask
    (batch_size, total) / (batch_size, S, total)."""
    if mask_index is None:
        return None
    if mask_index.dtype != np.int32:
        raise InvalidValueError(f"mask_index must be int32, got {mask_index.dtype}")
    pos = np.arange(total)
    if mask_index.shape == (batch,):
        return (pos[None, :] >= mask_index[:, None])[:, None, None, :]
    if mask_index.shape == (2 * batch,):
        end, start = mask_index[:batch, None], mask_index[batch:, None]
        return ((pos[None, :] >= end) | (pos[None, :] < start))[:, None, None, :]
    if mask_index.ndim == 2 and mask_index.shape == (batch, total):
        return (mask_index == 0)[:, None, None, :]
    if mask_index.ndim == 3 and mask_index.shape[0] == batch and mask_index.shape[2] == total:
        return (mask_index == 0)[:, None, :, :]
    raise InvalidValueError(f"mask_index of shape {list(mask_index.shape)} is none of (batch_size), "
                            f"(2 * batch_size), (batch_size, {total}), (batch_size, sequence_length, {total})")


@kernel("QAttention", since=1, domain=MS, multi_output=True, heavy=True)
def qattention_1(*, num_heads, do_rotary=0, mask_filter_value=-10000.0, past_present_share_buffer=0, scale=None,
                 unidirectional=0, _n_outputs=1, _constants=None):
    if num_heads <= 0:
        raise ValueError(f"num_heads must be positive, got {num_heads}")
    if do_rotary or past_present_share_buffer:
        raise ValueError("do_rotary and past_present_share_buffer are not supported")
    filler = np.float32(mask_filter_value)
    weight_of = _prepared_b(_constants, 1, 7)

    def run(x, weight, bias, input_scale, weight_scale, mask_index=None, input_zero_point=None,
            weight_zero_point=None, past=None):
        if x.ndim != 3 or weight.ndim != 2 or weight.shape[0] != x.shape[2] or weight.shape[1] % 3:
            raise InvalidValueError(f"input {list(x.shape)} must be (batch, sequence, input_hidden) and weight "
                                    f"{list(weight.shape)} (input_hidden, 3 * hidden)")
        hidden = weight.shape[1] // 3
        if hidden % num_heads:
            raise InvalidValueError(f"hidden size {hidden} is not a multiple of num_heads={num_heads}")
        out_dtype = input_scale.dtype
        if out_dtype not in (np.float32, np.float16) or bias.dtype != out_dtype:
            raise InvalidValueError(f"bias ({bias.dtype}) and input_scale ({out_dtype}) must be float or float16")
        qkv = _integer_to_float(x, weight, lambda: weight_of(weight, weight_zero_point), input_scale, weight_scale,
                                input_zero_point, bias, _F32)
        b, s, hs = x.shape[0], x.shape[1], hidden // num_heads
        q, k, v = (qkv[..., i * hidden:(i + 1) * hidden].reshape(b, s, num_heads, hs).transpose(0, 2, 1, 3)
                   for i in range(3))
        if past is not None:
            if past.ndim != 5 or past.shape[:3] != (2, b, num_heads) or past.shape[4] != hs:
                raise InvalidValueError(f"past of shape {list(past.shape)} must be (2, {b}, {num_heads}, "
                                        f"past_sequence_length, {hs})")
            k = np.concatenate([past[0].astype(_F32), k], axis=2)
            v = np.concatenate([past[1].astype(_F32), v], axis=2)
        total = k.shape[2]
        scores = np.matmul(q, k.transpose(0, 1, 3, 2)) * np.float32(scale if scale is not None else 1 / np.sqrt(hs))
        masked = _attention_mask(mask_index, b, total)
        if unidirectional:
            causal = np.arange(total)[None, :] > (np.arange(s) + total - s)[:, None]
            masked = causal if masked is None else masked | causal
        if masked is not None:
            scores = np.where(masked, filler, scores)
        scores -= scores.max(axis=-1, keepdims=True)
        p = np.exp(scores)
        p /= p.sum(axis=-1, keepdims=True)
        out = np.matmul(p, v).transpose(0, 2, 1, 3).reshape(b, s, hidden).astype(out_dtype)
        if _n_outputs < 2:
            return (out,)
        return out, np.stack([k, v]).astype(out_dtype)
    return run


# -- the optimiser's fused dynamic-int8 product tail ------------------------------------------------

@kernel("MatMulIntegerScaled", since=1, domain=FUSED_DOMAIN, multi_output=False, heavy=True)
def matmul_integer_scaled_1(*, centred=0, activation="", approximate="none", _constants=None):
    """MatMulInteger(A, B, a_zero_point, b_zero_point) -> Cast(to=FLOAT) -> Mul(., scale [* scale2])
    [-> Add(., bias)], written as one step by optimize/patterns.py (onnxruntime's quantize_dynamic emits
    this chain, the scale being Mul(x_scale, w_scale)). The exact integer sums that MatMulInteger's
    product holds (float32 or float64) become float32 at once: the same value as the Cast of their int32
    while they fit it (else through to_int32, wrapping as MatMulInteger does); then the scale and the
    bias as Mul and Add compute them (IEEE products and sums commute), in place on that buffer.
    MatMulInteger's checks are the same (math.matmul's helpers).
    centred=1: A is DynamicQuantizeCentred's float32 A - a_zero_point already (a_zero_point, its uint8
    zero point, still gives the bound on |A - a_zero_point|); with a constant B, one float32 product where
    its column sums prove it exact (`_centred_weight`), K split otherwise.
    activation="Gelu" (with Gelu's `approximate`): the Gelu that alone reads the result, applied last (the
    Gelu kernel's own float32 function, element by element, so the same bits).
    In blas's "split" mode a centred product large enough to split goes by row blocks over the pool, each
    thread taking its block's scale, bias and Gelu at once (`_split_rows`)."""
    weight = _centred_weight(_constants) if centred else _weight_of(_constants, 1, 3)
    scales = binary(np.multiply)                 # the Mul kernel's own function
    act = _epilogue_activation(activation, approximate)

    def run(a, b, a_zero_point, b_zero_point, scale, scale2=None, bias=None):
        if scale2 is not None:
            scale = scales(scale, scale2)
        if centred:
            bc, bound = _centred_operands(a, b, a_zero_point, b_zero_point, weight)
            if blas.splitting():
                y = _split_rows(a, bc, bound, scale, bias, act)
                if y is not None:
                    return y
            acc, k = int_matmul(a, bc, bound, "MatMulInteger"), (a.shape[-1] if a.ndim else 0)
        else:
            a_zp, b_zp = _zero_points(a, b, a_zero_point, b_zero_point)
            if a.ndim == 1 and a_zp is not None and a_zp.ndim:
                raise InvalidValueError("a 1-D A takes a scalar a_zero_point")
            prepared = weight(b, b_zero_point) if weight is not None and b.dtype.kind in "iu" else None
            acc, k, bound = _int_product(a, b, a_zp, b_zp, "MatMulInteger", prepared)
        if (centred or a.dtype.kind in "iu") and b.dtype.kind in "iu" and k * bound < 1 << 31:
            y = acc.astype(_F32, copy=False)       # exact integers: float32 of them rounds as Cast's does
        else:
            y = to_int32(acc, k, bound).astype(_F32)
        y = _elementwise(np.multiply, y, scale, "Mul")
        y = y if bias is None else _elementwise(np.add, y, bias, "Add")
        return y if act is None else act(y)
    return run


def _epilogue_activation(activation: str, approximate: str):
    """act(y) -> the fused Gelu of y, our own float32 buffer (written in place when contiguous), or None
    without an activation."""
    if not activation:
        return None
    if activation != "Gelu":
        raise ValueError(f"activation must be '' or 'Gelu', got {activation!r}")
    gelu = gelu_20(approximate=approximate)          # the Gelu kernel's function (checks approximate)
    if approximate == "none":
        return lambda y: gelu_float32(y, out=y) if y.flags.c_contiguous else gelu(y)
    return gelu


def _per_column(c, n: int) -> bool:
    """c is None or float32 of one value or one per column: it scales or shifts a float32 [..., n] product
    as the Mul / Add kernels would, without their checks."""
    return c is None or (c.dtype == _F32 and c.ndim <= 1 and c.size in (1, n))


def _finish(block, scale, bias, act) -> None:
    """block (rows of our own float32 product) times scale, plus bias, then act, in place: Mul and Add
    as their kernels compute them (two roundings), the activation element by element."""
    np.multiply(block, scale, out=block)
    if bias is not None:
        np.add(block, bias, out=block)
    if act is not None:
        r = act(block)
        if r is not block:
            block[...] = r


# Row blocks of a product lose BLAS efficiency below ~64 rows ([128, 256] x [256, 1024] on one thread: 64 rows
# at a time 1.05x the whole product's time, 32 rows 1.2x, 16 rows 1.4x; measured under load)
_MIN_ROWS = 64
# ... and lose to blas.matmul's column blocks once B is large: every row block's product reads all of B (two
# threads: twice), a column block only its half. Alternating, medians, under load (two threads, float32 B):
# [128, 768] x [768, 3072] + Gelu 1.07x blas.matmul's path, [128, 3072] x [3072, 768] 1.04-1.06x, [768, 768]
# 1.02x, bert_dynint8's [1024, 256] 0.95x and [256, 1024] 1.0x (load ~5): rows while B is at most 4 MiB
_MAX_B_BYTES = 4 << 20


def _split_rows(a, bc, bound, scale, bias, act):
    """The centred product, scale, bias and activation of MatMulIntegerScaled by row blocks over the pool, each
    thread doing its block's every step (the epilogue while the rows are in its cache, and on two cores), or
    None when that does not apply: a product that blas.matmul would not split, K split for exactness, an A
    not C-contiguous, a scale / bias other than float32 of one value or one per column, or a B over
    _MAX_B_BYTES. Every sum is an exact integer, so a block's product gives the very numbers of the whole
    one; the rest is elementwise.
    Measured with both cores busy with other processes (where "auto" picks split mode; alternating, medians):
    BERT's [128, 256] x [256, 1024] + Gelu 0.94-1.07x the whole path's time (blas's split product, then the
    epilogue on one thread), [128, 1024] x [1024, 256] 0.88-1.08x, [128, 256] x [256, 256] 0.91-0.97x:
    neutral there, where the second core is rarely free; it gains where one is (a hand-off: ~65-100 us)."""
    if a.ndim < 2 or bc.ndim != 2 or not a.flags.c_contiguous or parallel.threads() < 2:
        return None
    k, n = bc.shape
    if a.shape[-1] != k or (bound and k > F32_EXACT // bound):
        return None
    m = a.size // k if k else 0
    if m * k * n < 2 * blas.MIN_PART_MACS:
        return None
    if not (_per_column(scale, n) and _per_column(bias, n)) or bc.nbytes > _MAX_B_BYTES:
        return None
    a2 = a.reshape(m, k)
    y = np.empty((m, n), _F32)
    rows = max(_MIN_ROWS, -(-blas.MIN_PART_MACS // (k * n)))

    def part(t):
        block = y[t * rows:(t + 1) * rows]
        np.matmul(a2[t * rows:(t + 1) * rows], bc, out=block)
        _finish(block, scale, bias, act)
    parallel.shared(part, -(-m // rows))
    return y.reshape(*a.shape[:-1], n)


@kernel("MatMulIntegerScaledGroup", since=1, domain=FUSED_DOMAIN, multi_output=True, heavy=True)
def matmul_integer_scaled_group_1(*, centred=0, _n_outputs=1, _constants=None):
    """Sibling MatMulIntegerScaled steps reading the same A and a_zero_point (a BERT layer's Q, K and V),
    written as one by optimize/patterns.py: inputs A, a_zero_point, then per output B, b_zero_point, scale,
    scale2, bias ("" when absent). A is multiplied once by the B - b_zero_point blocks side by side (made
    at prepare); every sum is an exact integer, so each column is the very number its own product gives,
    and each output then takes its block's scale and bias steps as MatMulIntegerScaled does (into its own
    contiguous array). A, a zero point or B it does not expect: each step's own kernel, as written.
    Measured (under load): A [1, 128, 256] by three [256, 256] Bs in 0.86-0.95 of the three steps' time."""
    constants = _constants or {}
    n = _n_outputs
    firsts = [2 + 5 * i for i in range(n)]
    singles = []
    for f in firsts:               # each output's own MatMulIntegerScaled: the fallback, with its checks
        own = {0: 0, 1: f, 2: 1, 3: f + 1, 4: f + 2, 5: f + 3, 6: f + 4}
        singles.append(matmul_integer_scaled_1(
            centred=centred, _constants={j: constants[g] for j, g in own.items() if g in constants}))
    scales = binary(np.multiply)
    joined = _joined_weights(constants, firsts)

    def each(a, a_zero_point, rest):
        return tuple(s(a, rest[f - 2], a_zero_point, *rest[f - 1:f + 3]) for s, f in zip(singles, firsts))

    def run(a, a_zero_point, *rest):
        rest = (*rest, *(None,) * (5 * n - len(rest)))
        ra = None if joined is None else _codes_range(a, a_zero_point, centred, joined[0].shape[0])
        if ra is None:
            return each(a, a_zero_point, rest)
        bc, rbs, edges, sums = joined
        k = a.shape[-1]
        ac = a if centred else centered(a, None if a_zero_point is None else a_zero_point.reshape(()))
        exact = ra * sums <= F32_EXACT           # one float32 product, every sum within 2^24
        acc = int_matmul(ac, bc, 0 if exact else ra * max(rbs), "MatMulInteger")
        outs = []
        for f, rb, c0, c1 in zip(firsts, rbs, edges, edges[1:]):
            scale, scale2, bias = rest[f:f + 3]
            if scale2 is not None:
                scale = scales(scale, scale2)
            block = acc[..., c0:c1]
            if not exact and k * ra * rb >= 1 << 31:
                y = _elementwise(np.multiply, to_int32(block, k, ra * rb).astype(_F32), scale, "Mul")
            elif block.dtype != _F32:
                y = _elementwise(np.multiply, block.astype(_F32), scale, "Mul")
            else:                  # a view of the joint product: the Mul writes the output's own array
                y = _elementwise(np.multiply, block, scale, "Mul", fresh=True)
            outs.append(y if bias is None else _elementwise(np.add, y, bias, "Add"))
        return tuple(outs)
    return run


def _column_sums(bc: np.ndarray) -> int:
    """The largest sum of |B - b_zero_point| over a column of B (B - b_zero_point: float32 [..., K, N] of
    integers, or [K]): with |A - a_zero_point| <= ra, every partial sum of a product's column is at most ra
    times it, so one float32 product is exact while that stays within 2^24. Tighter than K * ra * rb, which
    splits K from 1028 terms for 8-bit operands (BERT-base's 768 and 3072 with int8 weights up to 127: two
    and six products, a float64 sum and its conversion, where weights of a usual spread allow one). One
    thread, [128, 3072] x [3072, 768] after a Gelu (a_zero_point 4) 6 products -> 1: 9.9 -> 8.9 ms CPU
    time, [768, 768] (a_zero_point 0) 2 -> 1: 2.47 -> 2.27 ms (interleaved calls, medians, under load)."""
    if bc.size == 0:
        return 0
    return int(np.abs(bc, dtype=np.float64).sum(axis=-2 if bc.ndim >= 2 else 0).max())


def _centred_weight(constants):
    """get(b, b_zero_point) -> (B - b_zero_point as float32, its measured bound, `_column_sums`) of a constant
    B, made once at prepare (math.matmul's _int_weight, with its checks), or None when B is fed."""
    if 1 not in (constants or {}):
        return None

    def make(b, zp):
        bc, rb = _int_weight(b, zp, "b_zero_point")
        return bc, rb, _column_sums(bc)
    return prepack(make, constants, (1, 3))


def _joined_weights(constants, firsts):
    """(the constant Bs less their zero points side by side as float32 [K, sum N], each one's measured
    bound, the column edges, their `_column_sums`), or None when some B or b_zero_point is fed, or not one
    a 2-D int8/uint8 B with a valid zero point of its type takes (the steps' own kernels then raise as
    written)."""
    blocks, bounds = [], []
    for f in firsts:
        b, zp = constants.get(f), constants.get(f + 1)
        if b is None or (f + 1 in constants) != (zp is not None) or b.dtype not in _INT8S or b.ndim != 2:
            return None
        if zp is not None and (zp.dtype != b.dtype or not (zp.size == 1 or zp.shape == (b.shape[1],))):
            return None
        if blocks and b.shape[0] != blocks[0].shape[0]:
            return None
        bc, rb = int_operand(b, None if zp is None else zp.reshape(-1) if zp.size > 1 else zp.reshape(()), True)
        blocks.append(bc)
        bounds.append(rb)
    joined = np.ascontiguousarray(np.concatenate(blocks, axis=1))
    joined.setflags(write=False)
    return joined, bounds, np.cumsum([0] + [x.shape[1] for x in blocks]).tolist(), _column_sums(joined)


def _codes_range(a, a_zero_point, centred, k):
    """max |A - a_zero_point| for an A the joint product takes (float32 centred codes with their uint8
    scalar zero point, or int8/uint8 codes with none or a scalar one of their type, ending with K), else None."""
    if a.ndim == 0 or a.shape[-1] != k:
        return None
    if centred:
        return integer_range(_U8, a_zero_point) if _centred_codes(a, a_zero_point) else None
    if a.dtype not in _INT8S or (a_zero_point is not None
                                 and (a_zero_point.dtype != a.dtype or a_zero_point.size != 1)):
        return None
    return integer_range(a.dtype, a_zero_point)


def _centred_codes(a, a_zero_point) -> bool:
    """Whether A is what DynamicQuantizeCentred gives: float32 codes less their uint8 scalar zero point."""
    return a.dtype == _F32 and a_zero_point is not None and a_zero_point.dtype == _U8 and a_zero_point.size == 1


def _centred_operands(a, b, a_zero_point, b_zero_point, weight):
    """(B - b_zero_point, the bound of each term, or 0 when B's column sums prove one float32 product exact)
    for a product of A given as float32 codes less their uint8 scalar zero point (a_zero_point), with
    _int_product's checks. weight: `_centred_weight`'s get, or None (B fed: the bound from its type)."""
    if not _centred_codes(a, a_zero_point):
        raise InvalidValueError("centred A must be float32 codes with their uint8 scalar zero point")
    if b.dtype.kind not in "iu" or b.dtype.itemsize != 1:
        raise InvalidValueError(f"MatMulInteger: B must be int8 or uint8, got {b.dtype}")
    b_zp = None if b_zero_point is None else _per_col(b_zero_point, b, "b_zero_point")
    if b_zp is not None and b_zp.dtype != b.dtype:
        raise InvalidValueError("a zero point must have the type of its operand")
    ra = integer_range(_U8, a_zero_point)
    if weight is None:
        bc, rb = int_operand(b, b_zp)
        return bc, ra * rb
    bc, rb, sums = weight(b, b_zero_point)
    return bc, (0 if ra * sums <= F32_EXACT else ra * rb)


@kernel("DynamicQuantizeCentred", since=1, domain=FUSED_DOMAIN, multi_output=True)
def dynamic_quantize_centred_1():
    """DynamicQuantizeLinear(x) -> (y, y_scale, y_zero_point) whose codes y only MatMulIntegerScaled(centred=1)
    steps read (optimize/patterns.py writes it): y - y_zero_point in float32 instead of y, i.e.
    round_half_even(x / y_scale) clipped to [-zp, 255 - zp], exact; y_scale and y_zero_point as the op's.
    Without the uint8 codes and each product's conversion back: [1, 128, 1024] read by one product 70
    against 133 us, [1, 128, 256] read by three (Q, K, V) 32 against 84 (medians, measured under load)."""
    quantize = dynamic_quantize_linear_11()

    def run(x):
        if x.dtype != _F32:
            raise InvalidValueError(f"x must be float32, got {x.dtype}")
        made = dynamic_quantize_centred(x)
        if made is not None:
            q, scale, zp = made
            return q, np.asarray(scale, _F32), np.asarray(zp, _U8)
        y, scale, zp = quantize(x)            # zeros, NaN or infinities, ties at both ends: the op itself
        return centered(y, zp), scale, zp
    return run


def _elementwise(ufunc, y: np.ndarray, c: np.ndarray, op: str, fresh: bool = False) -> np.ndarray:
    """ufunc(y, c) as the op's kernel computes it (same element type, numpy broadcasting), into y (our own
    float32 buffer) when c does not enlarge it; fresh: into a new contiguous array instead."""
    same_type(y, c)
    if broadcasts_to(c.shape, y.shape):
        return ufunc(y, c, out=np.empty(y.shape, y.dtype) if fresh else y)
    try:
        return as_array(ufunc(y, c))
    except ValueError:
        raise InvalidValueError(f"{op}: shapes {list(y.shape)} and {list(c.shape)} do not broadcast") from None
