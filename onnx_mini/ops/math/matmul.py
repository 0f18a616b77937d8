"""Linear algebra: Gemm, MatMul, MatMulInteger, QLinearMatMul, Einsum, Det (every version).

The products go straight to BLAS through np.matmul; float16/bfloat16 are computed in float32 and
rounded back once. The integer (quantized) products accumulate in float32/float64, which is exact
for the int8/uint8 operand ranges (see _exact_float), so they also run on BLAS.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from ... import blas
from ...errors import InvalidValueError
from ...registry import kernel
from .._common import UPCAST, as_array, same_type


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
    same_type(a, b)
    dt = a.dtype
    if dt in UPCAST:
        return as_array(matmul(a.astype(np.float32), b.astype(np.float32))).astype(dt)
    return as_array(matmul(a, b))


@kernel("MatMul", since=(1, 9, 13), heavy=True)
def matmul_1():
    return _matmul_run


# -- Gemm ----------------------------------------------------------------------------------------

def _gemm(alpha: float, beta: float, trans_a: int, trans_b: int, c_check):
    """Y = alpha * A' @ B' + beta * C. c_check(C, (M, N)) validates C's shape for the version's rules
    (C may be None from 11 on). One matmul plus at most one scaled operand and one in-place add."""
    alpha, beta = float(alpha), float(beta)

    def run(a, b, c=None):
        same_type(a, b)
        if c is not None:
            same_type(a, c)
        if a.ndim != 2 or b.ndim != 2:
            raise InvalidValueError(f"A and B must be 2-D, got shapes {list(a.shape)} and {list(b.shape)}")
        dt = a.dtype
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
        if c is not None:
            c_check(c, shape)
        is_float = a.dtype.kind == "f"
        if alpha != 1.0 and is_float:  # scale the smaller operand: alpha is folded in before the product
            if a.size <= b.size:        # (in place on the float32 copies of low-precision inputs)
                a = np.multiply(a, alpha, out=a if low else None, dtype=a.dtype)
            else:
                b = np.multiply(b, alpha, out=b if low else None, dtype=b.dtype)
        y = blas.matmul(a, b)
        if alpha != 1.0 and not is_float:  # integer types: scale the exact product, back to the type
            y = (y * alpha).astype(dt)
        if c is not None and beta != 0.0:
            if not is_float:
                y = (y + c * beta).astype(dt) if beta != 1.0 else np.add(y, c, out=y)
            else:
                y += c if beta == 1.0 else c * np.asarray(beta, c.dtype)
        return y.astype(dt) if low else y

    return run


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
def gemm_7(*, alpha=1.0, beta=1.0, transA=0, transB=0, _n_inputs):
    _c_required(_n_inputs)
    return _gemm(alpha, beta, transA, transB, _unidirectional)


@kernel("Gemm", since=(11, 13), heavy=True)
def gemm_11(*, alpha=1.0, beta=1.0, transA=0, transB=0):
    return _gemm(alpha, beta, transA, transB, _unidirectional)


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


def _exact_float(k: int) -> type:
    """A float type whose matmul accumulation of k products of 9-bit integers (|v| <= 255 after the
    zero point, so |product| <= 65025 < 2**16) is exact: float32 while k * 2**16 <= 2**24."""
    return np.float32 if k <= 256 else np.float64


def _centered(x: np.ndarray, zp, ft) -> np.ndarray:
    """x - zero_point as float type ft (exact for 8-bit integers and float8 values)."""
    xf = x.astype(ft)
    if zp is None:
        return xf
    zp = zp.astype(ft)
    if not zp.any():
        return xf
    xf -= zp
    return xf


def _int_product(a, b, a_zp, b_zp, what):
    """(a - a_zp) @ (b - b_zp) in a float type that holds the exact integer result."""
    k = a.shape[-1] if a.ndim else 0
    ft = _exact_float(k) if a.dtype.kind in "iu" and b.dtype.kind in "iu" else np.float32
    return matmul(_centered(a, a_zp, ft), _centered(b, b_zp, ft), what)


@kernel("MatMulInteger", since=10, heavy=True)
def matmul_integer_10():
    def run(a, b, a_zero_point=None, b_zero_point=None):
        a_zp = None if a_zero_point is None else _per_row(a_zero_point, a, "a_zero_point")
        b_zp = None if b_zero_point is None else _per_col(b_zero_point, b, "b_zero_point")
        if a_zp is not None and a_zp.dtype != a.dtype or b_zp is not None and b_zp.dtype != b.dtype:
            raise InvalidValueError("a zero point must have the type of its operand")
        if a.ndim == 1 and a_zp is not None and a_zp.ndim:
            raise InvalidValueError("a 1-D A takes a scalar a_zero_point")
        return as_array(_int_product(a, b, a_zp, b_zp, "MatMulInteger")).astype(np.int32)
    return run


_INT_RANGE = {np.dtype(t): (np.iinfo(t).min, np.iinfo(t).max) for t in (np.int8, np.uint8)}


def _saturate_float8(y: np.ndarray, dt: np.dtype) -> np.ndarray:
    """Round float32 values to a float8 type, clipping out-of-range values (and infinities) to its
    largest finite value (the saturate=1 rule of QuantizeLinear)."""
    top = float(ml_dtypes.finfo(dt).max)
    return np.clip(y, -top, top, out=y).astype(dt)


def _qlinear_matmul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point):
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
    acc = as_array(_int_product(a, b, a_zp, b_zp, "QLinearMatMul"))
    y = acc.astype(np.float32, copy=False)
    y *= (row * col) / y_scale.astype(np.float32).reshape(())
    dt = y_zero_point.dtype
    if dt in _INT_RANGE:
        lo, hi = _INT_RANGE[dt]
        np.rint(y, out=y)
        y += y_zero_point.astype(np.float32).reshape(())
        return np.clip(y, lo, hi, out=y).astype(dt)
    y += y_zero_point.astype(np.float32).reshape(())
    return _saturate_float8(y, dt)


@kernel("QLinearMatMul", since=(10, 21), heavy=True)
def qlinear_matmul_10():
    return _qlinear_matmul


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
