"""Element-wise unary math: Abs, Acos, Acosh, Asin, Asinh, Atan, Atanh, Ceil, Cos, Cosh, Erf, Exp, Floor,
Log, Neg, Reciprocal, Round, Sign, Sin, Sinh, Sqrt, Tan, Tanh (every version), and the vectorised
`erf`/`erfc` that Gelu shares.

Each op but Erf is one numpy ufunc; float16/bfloat16 go through float32 and are rounded back once,
integer types (Abs, Neg, Sign, Erf-9) keep their type. Version 1 of several ops carries the legacy
`consumed_inputs` attribute, accepted and ignored. numpy has no erf: `erf`/`erfc` below evaluate
W. J. Cody's rational approximations (a few ulp in float32 and float64) with whole-array passes.
"""
from __future__ import annotations

import numpy as np

from ...registry import kernel
from .._common import float32_compute


# -- erf / erfc -----------------------------------------------------------------------------------
# W. J. Cody, "Rational Chebyshev approximations for the error function", Math. Comp. 23 (1969),
# as in his CALERF routine: three rational approximations, each accurate to ~1e-16 in float64.

_A = (3.16112374387056560e00, 1.13864154151050156e02, 3.77485237685302021e02, 3.20937758913846947e03,
      1.85777706184603153e-1)
_B = (2.36012909523441209e01, 2.44024637934444173e02, 1.28261652607737228e03, 2.84423683343917062e03)
_C = (5.64188496988670089e-1, 8.88314979438837594e00, 6.61191906371416295e01, 2.98635138197400131e02,
      8.81952221241769090e02, 1.71204761263407058e03, 2.05107837782607147e03, 1.23033935479799725e03,
      2.15311535474403846e-8)
_D = (1.57449261107098347e01, 1.17693950891312499e02, 5.37181101862009858e02, 1.62138957456669019e03,
      3.29079923573345963e03, 4.36261909014324716e03, 3.43936767414372164e03, 1.23033935480374942e03)
_P = (3.05326634961232344e-1, 3.60344899949804439e-1, 1.25781726111229246e-1, 1.60837851487422766e-2,
      6.58749161529837803e-4, 1.63153871373020978e-2)
_Q = (2.56852019228982242e00, 1.87295284992346725e00, 5.27905102951428412e-1, 6.05183413124413191e-2,
      2.33520497626869185e-3)
_INV_SQRT_PI = 5.6418958354775628695e-1
_SMALL = 0.46875      # |x| up to here: erf(x) = x * R(x^2); beyond: erfc(|x|) = exp(-x^2) * R'(|x|)


def _working(x) -> np.ndarray:
    """float32 stays float32 (Cody's forms have positive coefficients: a few ulp there too), all
    else is computed in float64."""
    x = np.asarray(x)
    return x if x.dtype == np.float32 or x.dtype == np.float64 else x.astype(np.float64)


def _ratio(z: np.ndarray, p, q) -> np.ndarray:
    """Cody's rational form in z, k = len(q) - 1:
    (((p[-1] z + p[0]) z + p[1]) z ... + p[k]) / (((z + q[0]) z + q[1]) z ... + q[k])."""
    k = len(q) - 1
    num = p[-1] * z
    den = z.copy()
    for a, b in zip(p[:k], q[:k]):
        num += a
        num *= z
        den += b
        den *= z
    num += p[k]
    den += q[k]
    num /= den
    return num


def _erf_small(x: np.ndarray) -> np.ndarray:
    """erf(x) for |x| <= 0.46875."""
    r = _ratio(x * x, _A, _B)
    r *= x
    return r


def _erfc_pos(y: np.ndarray) -> np.ndarray:
    """erfc(y) for y >= 0.46875; y is a fresh array this overwrites (NaN stays NaN, inf gives 0)."""
    np.minimum(y, 40.0, out=y)          # erfc underflows to 0 long before; keeps inf out of the algebra
    far = y > 4.0
    r = _erfc_mid(np.minimum(y, 4.0))
    if far.any():
        r[far] = _erfc_tail(y[far])
    # exp(-y^2) as exp(-s^2) * exp(-(y-s)(y+s)), s = y rounded down to 1/16: s^2 is exact.
    s = np.trunc(y * 16.0)
    s *= 1.0 / 16.0
    d = y + s
    d *= np.subtract(y, s, out=y)
    s *= s
    np.negative(s, out=s)
    np.exp(s, out=s)
    np.negative(d, out=d)
    np.exp(d, out=d)
    r *= s
    r *= d
    return r


def _erfc_mid(y: np.ndarray) -> np.ndarray:
    """erfc(y) * exp(y^2) for 0.46875 <= y <= 4."""
    return _ratio(y, _C, _D)


def _erfc_tail(y: np.ndarray) -> np.ndarray:
    """erfc(y) * exp(y^2) for y > 4: (1/sqrt(pi) - z R(z)) / y, z = 1/y^2."""
    z = 1.0 / (y * y)
    r = _ratio(z, _P, _Q)
    r *= z
    np.subtract(_INV_SQRT_PI, r, out=r)
    r /= y
    return r


def _parts(x: np.ndarray):
    """x -> (mask of |x| <= 0.46875, or None when every element is there; erf(x) there; erfc(|x|)
    elsewhere). Each rational form runs on the whole clamped array: cheaper than gather/scatter."""
    ax = np.abs(x)
    small = ax <= _SMALL                # NaN falls outside, where it stays NaN
    if small.all():
        return None, _erf_small(x), None
    e_small = _erf_small(np.clip(x, -_SMALL, _SMALL)) if small.any() else None
    return small, e_small, _erfc_pos(np.maximum(ax, _SMALL, out=ax))


_CHUNK = 65536    # elements per block: the ~40 passes then run on cache-resident temporaries


def _blocked(core, x) -> np.ndarray:
    """core over x's elements: on a 1-D copy for 0-d x, block by block for large x."""
    x = _working(x)
    if x.ndim == 0:
        return core(x.reshape(1)).reshape(())
    if x.size <= _CHUNK:
        return core(x)
    flat = x.reshape(-1)
    out = np.empty(flat.shape, x.dtype)
    for i in range(0, flat.size, _CHUNK):
        out[i:i + _CHUNK] = core(flat[i:i + _CHUNK])
    return out.reshape(x.shape)


def _erf_core(x: np.ndarray) -> np.ndarray:
    small, e_small, c_big = _parts(x)
    if small is None:
        return e_small
    e_big = np.subtract(1.0, c_big, out=c_big)
    np.copysign(e_big, x, out=e_big)
    return e_big if e_small is None else _blend(small, e_small, e_big)


def _erfc_core(x: np.ndarray) -> np.ndarray:
    small, e_small, c_big = _parts(x)
    if small is None:
        return np.subtract(1.0, e_small, out=e_small)
    # 2 - erfc(|x|) for x < 0, erfc(x) for x >= 0, each rounded once
    np.copysign(c_big, x, out=c_big)
    c_big += (x < 0) * x.dtype.type(2)
    return c_big if e_small is None else _blend(small, np.subtract(1.0, e_small, out=e_small), c_big)


def erf(x) -> np.ndarray:
    """The error function, element-wise, in float32 for float32 input, else in float64 (a few ulp)."""
    return _blocked(_erf_core, x)


def erfc(x) -> np.ndarray:
    """1 - erf(x), element-wise (float32 for float32 input, else float64), accurate also where it is
    tiny (large x)."""
    return _blocked(_erfc_core, x)


def _blend(mask: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """where(mask, a, b) for finite-or-NaN a, b that are NaN together; overwrites a and b. Multiplying by
    the mask is much cheaper than np.where on a random mask, and exact (v*1 + 0 = v)."""
    a *= mask
    b *= ~mask
    a += b
    return a


def _erf_typed(x: np.ndarray) -> np.ndarray:
    """Erf's kernel function: erf rounded once to x's type (integers: truncated toward 0)."""
    y = erf(x)
    return y if x.dtype == y.dtype else y.astype(x.dtype)


# -- the ops ---------------------------------------------------------------------------------------

def _register(op: str, fn, since, legacy: bool = False, in_place=None, rank=None) -> None:
    """Kernels of a one-input op computing fn: version 1 with `consumed_inputs` when legacy, then
    `since` (versions without attributes, with the in_place fact when given); rank: @kernel's fact."""
    run = float32_compute(fn) if isinstance(fn, np.ufunc) else fn

    if legacy:
        def factory_1(*, consumed_inputs=None):
            return run
        factory_1.__name__ = f"{op.lower()}_1"
        kernel(op, since=1, rank=rank)(factory_1)

    def factory():
        return run
    factory.__name__ = f"{op.lower()}_{since[0]}"
    kernel(op, since=since, in_place=in_place, rank=rank)(factory)


for _op, _fn, _since, _legacy in (
    ("Abs", np.abs, (6, 13), True),
    ("Acos", np.arccos, (7, 22), False),
    ("Acosh", np.arccosh, (9, 22), False),
    ("Asin", np.arcsin, (7, 22), False),
    ("Asinh", np.arcsinh, (9, 22), False),
    ("Atan", np.arctan, (7, 22), False),
    ("Atanh", np.arctanh, (9, 22), False),
    ("Ceil", np.ceil, (6, 13), True),
    ("Cos", np.cos, (7, 22), False),
    ("Cosh", np.cosh, (9, 22), False),
    ("Erf", float32_compute(_erf_typed), (9, 13), False),
    ("Exp", np.exp, (6, 13), True),
    ("Floor", np.floor, (6, 13), True),
    ("Log", np.log, (6, 13), True),
    ("Neg", np.negative, (6, 13), True),
    ("Reciprocal", np.reciprocal, (6, 13), True),
    ("Round", np.rint, (11, 22), False),          # rint: halves to even, as the spec asks
    ("Sign", np.sign, (9, 13), False),
    ("Sin", np.sin, (7, 22), False),
    ("Sinh", np.sinh, (9, 22), False),
    ("Sqrt", np.sqrt, (6, 13), True),
    ("Tan", np.tan, (7, 22), False),
    ("Tanh", np.tanh, (6, 13), True),
):
    # the ufunc itself writes the same result into out= for float32/float64
    _register(_op, _fn, _since, _legacy, _fn if _op in ("Abs", "Exp", "Neg", "Sqrt", "Tanh") else None,
              "first" if _op in ("Abs", "Erf", "Exp", "Neg", "Sqrt", "Tanh") else None)
