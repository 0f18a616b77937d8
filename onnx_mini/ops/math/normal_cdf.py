"""x * Phi(x) (exact Gelu, Phi the standard normal CDF) in float32, to 3 ulp (4 for |x| < 2^-122), in
~12 numpy passes.

Phi is read from a table on a grid s of step h = 1/2048 over [-15, 6] and carried to x = s + d
(|d| <= h/2) by its logarithm's Taylor series:

    Phi(x) = Phi(s) exp(lam(s) d + c d^2 / 2 + ...),   lam = phi / Phi = (log Phi)',  c = (log Phi)''

- Both tables (Phi(s) and lam(s)) are computed once at import in float64 (unary.erfc, a few float64
  ulp) and rounded once to float32; nothing is fitted.
- c lies in (-1, 0), so dropping it costs at most d^2 / 2 <= 2^-25 relative; |lam d| <= 15.1 h / 2,
  so exp(w) = 1 + w + w^2 / 2 leaves w^3 / 6 < 1e-8. The rest is float32 rounding: max error
  measured on a dense grid over [-16, 16] is 2.9 ulp where the result is normal, 1.5 steps of 2^-149
  where it is subnormal; for |x| < 2^-122 (x / 2 and below), where x p ~ x / 16 is rounded to a
  subnormal, 4 ulp or 4 steps (backend_tests/ops/math/test_ops_activations.py checks all three).
- s and the table index come from one addition: x + 6144 lies in [4096, 8192), where float32 holds
  multiples of h only, so the sum rounds x to the grid and the low 16 bits of its bit pattern are
  the index into tables of 2^16 entries laid out from where 6144 - 15 falls, wrapping around (no
  subtraction, and any bit pattern, NaN's too, indexes inside the table); d = x - s is exact. Both
  tables are the rows of one array, read by one take: the index is converted to numpy's intp once.
- The Phi table is stored times 16 (exact) and the polynomial divided by 16, multiplied in the order
  (x * p) * Phi: where Phi(s) * 16 is subnormal, |x p / 16| < 1 keeps its rounding below half a
  subnormal step (stored unscaled, x up to 15 would multiply it). Above 6, Phi is 1 in float32; below
  -15 the result underflows, and the Phi entry of s = -15 is 0 so that -inf gives NaN (-inf * 0) as
  x Phi(x) does. NaN's bits index some entry, and it comes back NaN through x.
Elements go in blocks that keep the temporaries and the tables' used parts (2 x 168 KiB) in the caches.
"""
from __future__ import annotations

import math

import numpy as np

from .._common import clip_ufunc as _clip
from .unary import erfc


_LO, _HI = np.float32(-15.0), np.float32(6.0)
_PER_UNIT = 2048                                   # h = 1 / 2048
_R = np.float32(6144.0)                            # 1.5 * 2^12: [4096, 8192) holds multiples of 2^-11
_SIZE = 1 << 16                                    # indexes are 16-bit: every one is inside
_FIRST = int(np.float32(6144.0 - 15.0).view(np.uint32)) & 0xFFFF    # the index of s = -15
_C1, _C2 = np.float32(1 / 16), np.float32(1 / 32)  # (1 + w + w^2 / 2) / 16
# 32768 elements a block: 4.3 ns an element against 4.9 for 16384 and 5.2 for 65536 ([1, 128, 1024],
# measured under load, with the 2^-11 grid's index computed by an int subtraction)
_BLOCK = 32768


def _tables() -> np.ndarray:
    s = np.arange(int(_HI - _LO) * _PER_UNIT + 1) / _PER_UNIT + float(_LO)
    phi = 0.5 * erfc(s * -math.sqrt(0.5))
    density = np.exp(-0.5 * s * s) / math.sqrt(2 * math.pi)
    scaled = (phi * 16).astype(np.float32)
    scaled[0] = 0
    lam = (density / phi).astype(np.float32)
    at = (_FIRST + np.arange(s.size)) % _SIZE       # grid point j's index
    tables = np.zeros((2, _SIZE), np.float32)
    tables[0, at], tables[1, at] = scaled, lam
    tables.setflags(write=False)
    return tables


_TABLES = _tables()                                # rows: Phi * 16, lam
_PHI16, _LAM = _TABLES


def gelu_float32(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """x * Phi(x) for a float32 array (a new float32 array of x's shape); out: a contiguous float32 array
    of x's shape to write it into instead, x itself allowed (each element is read before it is written)."""
    flat = np.ascontiguousarray(x).reshape(-1)
    result = np.empty(x.shape, np.float32) if out is None else out
    out = result.reshape(-1)
    n = min(flat.size, _BLOCK)
    # the temporaries, made once a call and reused by every block
    d, g, k = np.empty(n, np.float32), np.empty(2 * n, np.float32), np.empty(n, np.int32)
    for i in range(0, flat.size, _BLOCK):
        xb = flat[i:i + _BLOCK]
        m = xb.size
        _gelu_block(xb, out[i:i + _BLOCK], d[:m], g[:2 * m].reshape(2, m), k[:m])
    return result


# [1, 128, 1024]: ~0.42 against ~0.44 ms (medians of alternating blocks, under load) with the index
# made by subtracting the first one's bits (mode="wrap" then looped ~2^15 times for a NaN's index:
# ~16 us a NaN) and temporaries made per block. One take of both tables with an int32 index made by
# a mask, against two takes of an intp index copied from the bits' low halves: [1, 128, 1024] ~0.96x
# (medians of 12 alternating runs, 9 faster, under load; bit for bit the same values).
def _gelu_block(x: np.ndarray, out: np.ndarray, d: np.ndarray, g: np.ndarray, k: np.ndarray) -> None:
    """out = x Phi(x); temporaries: d float32 [n], g float32 [2, n] (contiguous), k int32 [n]."""
    _clip(x, _LO, _HI, out=d)
    s = np.add(d, _R, out=g[1])
    np.bitwise_and(s.view(np.int32), 0xFFFF, out=k)    # the low 16 bits: the index
    s -= _R                                     # the grid point
    d -= s                                      # x - s, exact
    np.take(_TABLES, k, axis=1, mode="wrap", out=g)     # in range: "wrap" is take's fastest checked mode
    w = g[1]                                    # lam
    w *= d
    p = np.multiply(w, _C2, out=d)
    p += _C1
    p *= w
    p += _C1                                    # exp(w) / 16
    np.multiply(x, p, out=out)
    out *= g[0]                                 # Phi(s) * 16
