"""Linear algebra: Gemm, MatMul, MatMulInteger, QLinearMatMul, Einsum, Det (every version).

The products go straight to BLAS through np.matmul; float16/bfloat16 are computed in float32 and
rounded back once. The integer (quantized) products also run on BLAS, in float32, exactly: K is split
where the sums could pass 2^24 (`int_matmul`, shared with the convolutions and com.microsoft's
quantized products). A constant B is shifted by its zero point once, at prepare.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from ... import blas
from ...errors import InvalidValueError
from ...registry import kernel
from .._common import UPCAST, as_array, prepack, same_type
from ..quantization import quantize_array


def _shapes_error(a: np.ndarray, b: np.ndarray, what: str = "matrix product") -> InvalidValueError:
    return InvalidValueError(f"{what}: shapes {list(a.shape)} and {list(b.shape)} cannot be multiplied "
                             f"(numpy matmul rules: A[..., M, K] @ B[..., K, N], batch dims broadcast)")


def matmul(a: np.ndarray, b: np.ndarray, what: str = "matrix product") -> np.ndarray:
    """np.matmul with a clear error when the shapes do not multiply (0-d operands included)."""
    if a.ndim == 0 or b.ndim == 0:
        raise InvalidValueError(f"{what}: operands must have rank >= 1, got shapes {list(a.shape)} "
                                f"and {list(b.shape)}")
    try:
        return blas.matmul(a, b)
    except ValueError:
        raise _shapes_error(a, b, what) from None


# -- MatMul --------------------------------------------------------------------------------------

def _matmul_run(a, b):
    dt = a.dtype
    if dt is not b.dtype and dt != b.dtype:      # (the loader's weights have an equal dtype object: '<f4')
        same_type(a, b)
    if dt in UPCAST:
        return as_array(matmul(a.astype(np.float32), b.astype(np.float32))).astype(dt)
    if a.ndim == 2 and b.ndim == 2:
        # matmul()'s rank checks and as_array are for 0-d and 1-D operands, blas.matmul's for products
        # it may split: a product below its split size goes to numpy at once (~0.5 us of a 1x128x128
        # product's 2.9 here; a Scan RNN step has two)
        try:
            if a.shape[0] * a.shape[1] * b.shape[1] < 2 * blas.MIN_PART_MACS:
                return np.matmul(a, b)
            return blas.matmul(a, b)
        except ValueError:
            raise _shapes_error(a, b) from None
    if (b.ndim == 2 and a.ndim > 2 and dt in _FOLDED and a.flags.c_contiguous and a.shape[-1] == b.shape[0]
            and FOLD_MIN_MACS <= a.size * b.shape[1] < 2 * blas.MIN_PART_MACS):
        # a stack of rows times one matrix as one 2-D product (np.matmul runs one small product per matrix
        # of the stack), as blas.matmul does with the products it splits
        return np.matmul(a.reshape(-1, b.shape[0]), b).reshape(*a.shape[:-1], b.shape[1])
    return as_array(matmul(a, b))


_FOLDED = frozenset({np.dtype(np.float32), np.dtype(np.float64)})
# From this many multiply-adds the folded product wins (float32, under load: [100, 1, 64] x [64, 128]
# 52 -> 28 us (a Scan RNN's inputs projected at once), [8, 16, 64] x [64, 128] 35 -> 26, [12, 1, 768] x
# [768, 768] 353 -> 245, [4, 4, 64] x [64, 64] 8.1 -> 7.1; below it numpy's own loop is cheaper:
# [2, 8, 32] x [32, 32] 3.4 -> 4.6, [10, 1, 32] x [32, 32] 3.7 -> 4.9)
FOLD_MIN_MACS = 1 << 16


@kernel("MatMul", since=(1, 9, 13), heavy=True)
def matmul_1():
    return _matmul_run


# -- Gemm ----------------------------------------------------------------------------------------

def _gemm(alpha: float, beta: float, trans_a: int, trans_b: int, c_check, c_const=None):
    """Y = alpha * A' @ B' + beta * C. c_check(C, (M, N)) validates C's shape for the version's rules
    (C may be None from 11 on). One matmul plus at most one scaled operand and one in-place add.
    c_const: a constant C; 1-D, it is added as a [1, N] row (the same sums, without numpy's
    broadcasting set-up: [1, 1000] + [1000] ~0.5 us more a call than + [1, 1000], under load)."""
    alpha, beta = float(alpha), float(beta)
    c_fits = set()      # (C shape, product shape) pairs c_check accepted: a run checks a new pair only
    row = c_const.reshape(1, -1) if isinstance(c_const, np.ndarray) and c_const.ndim == 1 else None

    def run(a, b, c=None):
        dt = a.dtype
        if dt is not b.dtype:            # (equal dtypes are nearly always one object: no call)
            same_type(a, b)
        if c is not None and c.dtype is not dt:
            same_type(a, c)
        if a.ndim != 2 or b.ndim != 2:
            raise InvalidValueError(f"A and B must be 2-D, got shapes {list(a.shape)} and {list(b.shape)}")
        low = dt in UPCAST
        if low:
            a, b = a.astype(np.float32), b.astype(np.float32)
            c = None if c is None else c.astype(np.float32)
        if trans_a:
            a = a.T
        if trans_b:
            b = b.T
        if a.shape[1] != b.shape[0]:
            raise InvalidValueError(f"A' of shape {list(a.shape)} and B' of shape {list(b.shape)} cannot be "
                                    f"multiplied (transA={trans_a}, transB={trans_b})")
        shape = (a.shape[0], b.shape[1])
        if c is not None and (c.shape, shape) not in c_fits:
            c_check(c, shape)
            if len(c_fits) < 16:
                c_fits.add((c.shape, shape))
        is_float = a.dtype.kind == "f"
        if alpha != 1.0 and is_float:  # scale the smaller operand: alpha is folded in before the product
            if a.size <= b.size:        # (in place on the float32 copies of low-precision inputs)
                a = np.multiply(a, alpha, out=a if low else None, dtype=a.dtype)
            else:
                b = np.multiply(b, alpha, out=b if low else None, dtype=b.dtype)
        # np.dot below blas.matmul's split size: ~1 us less a call than its checks (a [1,64] x [64,1] Gemm)
        y = np.dot(a, b) if shape[0] * shape[1] * a.shape[1] < 2 * blas.MIN_PART_MACS else blas.matmul(a, b)
        if alpha != 1.0 and not is_float:  # integer types: scale the exact product, back to the type
            y = (y * alpha).astype(dt)
        if c is not None and beta != 0.0:
            if not is_float:
                y = (y + c * beta).astype(dt) if beta != 1.0 else np.add(y, c, out=y)
            else:
                if c is c_const and row is not None:    # (C checked as given above)
                    c = row
                cb = c if beta == 1.0 else c * np.asarray(beta, c.dtype)
                # one element: a new array, as numpy's in-place ufunc costs ~0.9 us more there (its
                # overlap handling; [1, 1] + [1, 1]: 1.7 against 2.7 us with the product, under load)
                y = np.add(y, cb) if y.size == 1 else np.add(y, cb, out=y)
        return y.astype(dt) if low else y

    if alpha != 1.0 or beta != 1.0 or trans_a or row is None:
        return run
    n = row.shape[1]
    split = 2 * blas.MIN_PART_MACS

    def dense(a, b, c=None):
        # A @ B' + the constant 1-D C in float32/float64 (a dense layer) below blas.matmul's split size: the
        # steps run takes for it, without the checks of the other cases (old and new called in turn, medians
        # under load, caches warm / flushed before each call: a greedy decoder's [1, 256] x [256, 1000]
        # 25.1 -> 23.6 / 29.1 -> 26.7 us, [1, 512] x [512, 256] then Tanh 15.5 -> 14.5 / 24.4 -> 22.4, a VAD's
        # [1, 64] x [64, 1] then Sigmoid 8.7 -> 7.9 / 18.9 -> 16.0)
        dt = a.dtype
        bt = b.T if trans_b else b
        if (c is c_const and dt is b.dtype and dt is c.dtype and dt in _FOLDED and a.ndim == 2 and b.ndim == 2
                and a.shape[1] == bt.shape[0] and bt.shape[1] == n and a.shape[0] * n * a.shape[1] < split):
            y = np.dot(a, bt)
            return np.add(y, row) if y.size == 1 else np.add(y, row, out=y)
        return run(a, b, c)
    return dense


def _unidirectional(c: np.ndarray, shape: tuple) -> None:
    if c.ndim > 2 or any(d not in (1, s) for d, s in zip(c.shape[::-1], shape[::-1])):
        raise InvalidValueError(f"C of shape {list(c.shape)} is not unidirectionally broadcastable to "
                                f"the product's shape {list(shape)}")


def _legacy_c(broadcast: int):
    def check(c, shape):
        if broadcast:
            _unidirectional(c, shape)
        elif c.shape != shape:
            raise InvalidValueError(f"C of shape {list(c.shape)} must have the product's shape {list(shape)} "
                                    f"when broadcast=0")
    return check


def _c_required(n_inputs: int) -> None:
    if n_inputs < 3:
        raise ValueError("Gemm before opset 11 requires the input C")


@kernel("Gemm", since=(1, 6), heavy=True)
def gemm_1(*, alpha=1.0, beta=1.0, transA=0, transB=0, broadcast=0, _n_inputs):
    _c_required(_n_inputs)
    return _gemm(alpha, beta, transA, transB, _legacy_c(broadcast))


@kernel("Gemm", since=(7, 9), heavy=True)
def gemm_7(*, alpha=1.0, beta=1.0, transA=0, transB=0, _n_inputs, _constants=None):
    _c_required(_n_inputs)
    return _gemm(alpha, beta, transA, transB, _unidirectional, (_constants or {}).get(2))


@kernel("Gemm", since=(11, 13), heavy=True)
def gemm_11(*, alpha=1.0, beta=1.0, transA=0, transB=0, _constants=None):
    return _gemm(alpha, beta, transA, transB, _unidirectional, (_constants or {}).get(2))


# -- MatMulInteger, QLinearMatMul ----------------------------------------------------------------

def _per_row(p: np.ndarray, x: np.ndarray, what: str) -> np.ndarray:
    """A scale/zero point of the left operand x[..., M, K]: a scalar (any size-1 tensor), an M-vector
    (per row, applied as [M, 1]) or an N-D tensor [..., M, 1] that broadcasts against x."""
    if p.size == 1:
        return p.reshape(())
    if x.ndim >= 2 and p.ndim == 1 and p.shape[0] == x.shape[-2]:
        return p.reshape(-1, 1)
    if 2 <= p.ndim <= x.ndim and p.shape[-1] == 1 and p.shape[-2] == x.shape[-2]:
        return p
    raise InvalidValueError(f"{what} of shape {list(p.shape)} is neither a scalar nor per row for an "
                            f"operand of shape {list(x.shape)}")


def _per_col(p: np.ndarray, x: np.ndarray, what: str) -> np.ndarray:
    """A scale/zero point of the right operand x[..., K, N]: a scalar, an N-vector (per column) or an
    N-D tensor [..., 1, N]."""
    if p.size == 1:
        return p.reshape(())
    if x.ndim >= 2 and p.ndim == 1 and p.shape[0] == x.shape[-1]:
        return p
    if 2 <= p.ndim <= x.ndim and p.shape[-2] == 1 and p.shape[-1] == x.shape[-1]:
        return p
    raise InvalidValueError(f"{what} of shape {list(p.shape)} is neither a scalar nor per column for an "
                            f"operand of shape {list(x.shape)}")


# -- exact integer products --------------------------------------------------------------------------
# The integer products run on BLAS in float32. Every product and partial sum of integers is exact while
# its magnitude stays within 2^24 (float32 holds every integer up to there): with |a - a_zp| <= ra and
# |b - b_zp| <= rb, any partial sum over k terms is at most k * ra * rb. So K splits into chunks of at
# most 2^24 // (ra * rb) terms (>= 258 for 8-bit operands: |x - zp| <= 255), each an exact float32
# product, added in float64 (exact below 2^53). ra and rb come from the operand's type and zero point
# (`integer_range`), or from a constant operand's values, measured once (`int_operand`).
F32_EXACT = 1 << 24


_LIMITS: dict = {}      # integer dtype -> (min, max): ml_dtypes.iinfo costs ~12 us a call, once per product


def integer_range(dtype: np.dtype, zero_point=None) -> int:
    """max |x - zero_point| over every x of the integer type (zero_point None, a scalar or an array)."""
    limits = _LIMITS.get(dtype)
    if limits is None:
        info = ml_dtypes.iinfo(dtype)
        limits = _LIMITS[dtype] = (int(info.min), int(info.max))
    if zero_point is None or zero_point.size == 0:
        lo = hi = 0
    elif zero_point.size == 1:
        lo = hi = int(zero_point.reshape(-1)[0])
    else:
        lo, hi = int(zero_point.min()), int(zero_point.max())
    return max(hi - limits[0], limits[1] - lo)


def centered(x: np.ndarray, zp, ft=np.float32) -> np.ndarray:
    """x - zero_point as a new array of float type ft (exact for 8-bit integers and float8 values;
    astype then an in-place subtract: 1.4x faster than one mixed-type ufunc, which casts in buffers)."""
    xf = x.astype(ft)
    if zp is not None:
        zp = zp.astype(ft)
        if zp.any():
            xf -= zp
    return xf


def int_operand(x: np.ndarray, zp, measured: bool = False) -> tuple[np.ndarray, int]:
    """(x - zp as float32, a bound on its magnitude): from x's type and zero point, or, measured, from
    its values (for a constant operand, made once at prepare: its true range is often narrower)."""
    xf = centered(x, zp)
    if measured:
        bound = max(-float(xf.min()), float(xf.max())) if xf.size else 0
        return xf, int(bound)
    return xf, integer_range(x.dtype, zp)


def int_matmul(a: np.ndarray, b: np.ndarray, bound: int, what: str = "matrix product") -> np.ndarray:
    """a @ b, exactly, for float32 arrays holding integers whose products are at most `bound` in
    magnitude: one float32 product when every partial sum stays within 2^24, else K in chunks that
    do, their float32 products added in float64. The result holds the exact integers (float32 or
    float64)."""
    k = a.shape[-1] if a.ndim else 0
    step = F32_EXACT // bound if bound else k
    if k <= step or b.ndim == 0 or k != b.shape[-2 if b.ndim >= 2 else 0]:
        return as_array(matmul(a, b, what))
    parts = -(-k // step)
    step = -(-k // parts)                   # chunks of even size
    acc = None
    for k0 in range(0, k, step):
        part = as_array(matmul(a[..., k0:k0 + step], b[..., k0:k0 + step, :] if b.ndim >= 2 else b[k0:k0 + step],
                               what))
        if acc is None:
            acc = part.astype(np.float64)
        else:
            acc += part
    return acc


def to_int32(acc: np.ndarray, k: int, bound: int) -> np.ndarray:
    """int_matmul's exact integers as int32, wrapping beyond its range as 32-bit accumulation does
    (the spec allows overflow only there)."""
    if k * bound >= 1 << 31:
        return acc.astype(np.int64).astype(np.int32)
    return acc.astype(np.int32)


def _int_product(a, b, a_zp, b_zp, what, b_prepared=None):
    """(a - a_zp) @ (b - b_zp), exact for integer operands (float8 ones: summed in float32);
    b_prepared: int_operand(b, b_zp) made already (a constant B), or None. -> (product, k, bound)."""
    k = a.shape[-1] if a.ndim else 0
    for x, name in ((a, "A"), (b, "B")):
        if x.dtype.kind in "iu" and x.dtype.itemsize != 1:
            raise InvalidValueError(f"{what}: {name} must be int8 or uint8, got {x.dtype}")
    if a.dtype.kind not in "iu" or b.dtype.kind not in "iu":
        return as_array(matmul(centered(a, a_zp), centered(b, b_zp), what)), k, 0
    bc, rb = b_prepared if b_prepared is not None else int_operand(b, b_zp)
    bound = integer_range(a.dtype, a_zp) * rb
    return int_matmul(centered(a, a_zp), bc, bound, what), k, bound


def _int_weight(b, b_zp, what):
    """int_operand(b, b_zero_point) of a constant B, made once (prepack), with the checks of the run; a
    matrix in the order one-row products read faster (blas.laid_out: the integer sums are exact in any)."""
    b_zp = None if b_zp is None else _per_col(b_zp, b, what)
    bc, rb = int_operand(b, b_zp, measured=b.dtype.kind in "iu")
    bc = blas.laid_out(bc)
    bc.setflags(write=False)
    return bc, rb


def _weight_of(constants, b_index: int, zp_index: int):
    """get(b, b_zero_point) -> int_operand of B with its measured range, made once at prepare when B is a
    constant (None when B is fed: then B's type gives the range, without a pass over it)."""
    if b_index not in (constants or {}):
        return None
    return prepack(lambda b, zp: _int_weight(b, zp, "b_zero_point"), constants, (b_index, zp_index))


def _zero_points(a, b, a_zero_point, b_zero_point):
    a_zp = None if a_zero_point is None else _per_row(a_zero_point, a, "a_zero_point")
    b_zp = None if b_zero_point is None else _per_col(b_zero_point, b, "b_zero_point")
    if a_zp is not None and a_zp.dtype != a.dtype or b_zp is not None and b_zp.dtype != b.dtype:
        raise InvalidValueError("a zero point must have the type of its operand")
    return a_zp, b_zp


@kernel("MatMulInteger", since=10, heavy=True)
def matmul_integer_10(*, _constants=None):
    weight = _weight_of(_constants, 1, 3)

    def run(a, b, a_zero_point=None, b_zero_point=None):
        a_zp, b_zp = _zero_points(a, b, a_zero_point, b_zero_point)
        if a.ndim == 1 and a_zp is not None and a_zp.ndim:
            raise InvalidValueError("a 1-D A takes a scalar a_zero_point")
        prepared = weight(b, b_zero_point) if weight is not None and b.dtype.kind in "iu" else None
        acc, k, bound = _int_product(a, b, a_zp, b_zp, "MatMulInteger", prepared)
        return to_int32(acc, k, bound)
    return run


def _saturate_float8(y: np.ndarray, dt: np.dtype) -> np.ndarray:
    """Round float32 values to a float8 type, clipping out-of-range values (and infinities) to its
    largest finite value (the saturate=1 rule of QuantizeLinear)."""
    top = float(ml_dtypes.finfo(dt).max)
    return np.clip(y, -top, top, out=y).astype(dt)


def _qlinear_matmul(weight):
    """QLinearMatMul's function; weight(b, b_zero_point): int_operand of B made once (a constant B), or None."""
    def run(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point):
        if a_zero_point.dtype != a.dtype or b_zero_point.dtype != b.dtype:
            raise InvalidValueError("a zero point must have the type of its operand")
        if y_scale.size != 1 or y_zero_point.size != 1:
            raise InvalidValueError(f"y_scale and y_zero_point must be scalars, got shapes {list(y_scale.shape)} "
                                    f"and {list(y_zero_point.shape)}")
        a_zp = _per_row(a_zero_point, a, "a_zero_point")
        b_zp = _per_col(b_zero_point, b, "b_zero_point")
        row = _per_row(a_scale, a, "a_scale").astype(np.float32)
        col = _per_col(b_scale, b, "b_scale").astype(np.float32)
        if a.ndim == 1 and (row.ndim or a_zp.ndim):
            raise InvalidValueError("a 1-D a takes a scalar a_scale and a_zero_point")
        if b.ndim == 1 and (col.ndim or b_zp.ndim):
            raise InvalidValueError("a 1-D b takes a scalar b_scale and b_zero_point")
        if b.ndim == 1 and row.ndim:  # the product drops N: a per-row [..., M, 1] becomes [..., M]
            row = row[..., 0]
        prepared = weight(b, b_zero_point) if weight is not None and b.dtype.kind in "iu" else None
        acc, _, _ = _int_product(a, b, a_zp, b_zp, "QLinearMatMul", prepared)
        y = acc.astype(np.float32, copy=False)
        y *= (row * col) / y_scale.astype(np.float32).reshape(())
        dt = y_zero_point.dtype
        if dt.kind in "iu":     # saturate(round(y) + zero point)
            return quantize_array(y, dt, y_zero_point.reshape(()), scratch=True)
        y += y_zero_point.astype(np.float32).reshape(())
        return _saturate_float8(y, dt)
    return run


@kernel("QLinearMatMul", since=(10, 21), heavy=True)
def qlinear_matmul_10(*, _constants=None):
    return _qlinear_matmul(_weight_of(_constants, 3, 5))


# -- Einsum --------------------------------------------------------------------------------------

def _parse_equation(equation: str) -> tuple[list[str], str, bool]:
    """-> (input terms, output term, has ellipsis), the output made explicit; terms keep '...'.
    ValueError with a clear message when the equation is malformed."""
    eq = equation.replace(" ", "")
    if eq.count("->") > 1:
        raise ValueError(f"Einsum equation {equation!r} has more than one '->'")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    for t in terms + ([rhs] if arrow else []):
        letters = t.replace("...", "", 1)
        if not all(ch.isascii() and ch.isalpha() for ch in letters):
            raise ValueError(f"Einsum equation {equation!r}: term {t!r} may hold only letters and one '...'")
    ellipsis = any("..." in t for t in terms)
    if arrow:
        if "..." in rhs and not ellipsis:
            raise ValueError(f"Einsum equation {equation!r}: the output has '...' but no input has")
        out_letters = rhs.replace("...", "")
        if len(set(out_letters)) != len(out_letters):
            raise ValueError(f"Einsum equation {equation!r}: an output letter is repeated")
        known = set("".join(terms))
        missing = [ch for ch in out_letters if ch not in known]
        if missing:
            raise ValueError(f"Einsum equation {equation!r}: output letters {missing} appear in no input")
    else:  # implicit: letters seen exactly once, in ASCII order, after the ellipsis dims
        counts = {}
        for ch in "".join(terms).replace(".", ""):
            counts[ch] = counts.get(ch, 0) + 1
        rhs = ("..." if ellipsis else "") + "".join(sorted(ch for ch, n in counts.items() if n == 1))
    return terms, rhs, ellipsis


def _check_operands(terms: list[str], ops: tuple) -> None:
    """Operand count and ranks against the terms (letter sizes are checked by np.einsum)."""
    if len(ops) != len(terms):
        raise InvalidValueError(f"the equation has {len(terms)} input terms but the node has {len(ops)} inputs")
    for t, x in zip(terms, ops):
        n = len(t.replace("...", ""))
        if x.ndim < n if "..." in t else x.ndim != n:
            raise InvalidValueError(f"term {t!r} does not fit an operand of shape {list(x.shape)}")


@kernel("Einsum", since=(12, 28), heavy=True, views=True)
def einsum_12(*, equation):
    terms, rhs, _ = _parse_equation(equation)
    subscripts = ",".join(terms) + "->" + rhs
    many = len(terms) > 2

    def run(*ops):
        _check_operands(terms, ops)
        dt = ops[0].dtype
        for x in ops[1:]:
            same_type(ops[0], x)
        low = dt in UPCAST
        if low:
            ops = [x.astype(np.float32) for x in ops]
        # the contraction-path search costs ~50 us: worth it for 3+ operands or BLAS-sized pairs
        optimize = many or (len(ops) == 2 and ops[0].size * ops[1].size > 4096)
        try:
            y = np.einsum(subscripts, *ops, optimize=optimize)
        except ValueError as e:
            raise InvalidValueError(f"einsum {subscripts!r} on shapes {[list(x.shape) for x in ops]}: {e}") from None
        y = as_array(y)
        return y.astype(dt) if low or y.dtype != dt else y

    return run


# -- Det -----------------------------------------------------------------------------------------

@kernel("Det", since=(11, 22))
def det_11():
    def run(x):
        if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
            raise InvalidValueError(f"Det needs square matrices in the last two dims, got shape {list(x.shape)}")
        dt = x.dtype
        y = as_array(np.linalg.det(x.astype(np.float32) if dt in UPCAST else x))
        return y.astype(dt, copy=False)
    return run
