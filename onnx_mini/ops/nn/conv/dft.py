"""A Conv whose constant W is a windowed real DFT basis, by numpy's real FFT: an STFT written as a Conv1d
(silero-vad, openWakeWord, torchlibrosa and nnAudio front ends store their spectrogram so).

W [M, 1, N] (one input channel, 1-D) is such a basis when its rows are one or two blocks of K rows
(2 <= K <= N/2 + 1), row k of a block (k = 0..K-1) being s * win[n] * cos(2 pi k n / N) (a cosine block)
or s * win[n] * sin(2 pi k n / N) (a sine block), one window for both blocks, a sign s per block. Each
output column (one frame of X: N samples from t * stride) is then the real or the imaginary part of the
real DFT of the windowed frame, for all rows at once: ~N log N operations a frame instead of M * N.

Exactness: `basis` recognises W only where each weight is within two float32 ulps of the basis it
derives (its window read off W; the basis computed in float64), or, where the basis is 0 (sin 0, a
zero of the window), within 2^-40 of W's largest weight (exporters store such zeros as ~1e-17). The
FFT computes in float64, rounded once to float32, and the rows the basis has as all 0 (the sines of
k = 0 and N/2, which W holds as tiny values) are summed directly in float64. The result then differs
from the exact sum over the given weights by at most 2^-22 * sum |x * w| + 2^-40 * max |W| * sum |x|,
inside the bound of any float32 sum of N >= 4 products (N * 2^-24 * sum |x * w|): measured, it is closer
to the float64 sum than the float32 product is (the wakeword's STFT, 512 taps, 514 rows: 5.8e-8 against
7.5e-7 of the largest output). An infinity in X would turn into NaN over its frame's every row, where
the sum gives +-inf on most, so X must be finite (select.NEEDS_FINITE).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._common import pad_spatial
from . import thresholds

_ULPS = 2.0 ** -22       # two float32 ulps, relative: how far a weight may be from the derived basis
_FLOOR = 2.0 ** -40      # ... plus this much of W's largest weight (a basis zero W holds as ~1e-17)
_ZERO_ROW = 2.0 ** -20   # a block whose first row is below this (relative to W's largest) is a sine block


class Basis(NamedTuple):
    """What `conv` needs: the window (float64 [N]); per block, (first row, K, part, sign): rows
    first..first+K-1 of Y are sign * (the real part if part == 0, else the imaginary part) of the
    windowed frames' DFT at k = 0..K-1; the rows the basis has as all 0 (their indices, and W's rows
    there as float64 [N, count]), summed directly: from the windowed frames the FFT reads, by those rows
    over the window (windowed_zero_weights; None where a weight sits on a zero of the window), else
    from the frames."""

    window: np.ndarray
    blocks: tuple
    zero_rows: tuple
    zero_weights: np.ndarray
    windowed_zero_weights: np.ndarray | None


def basis(w: np.ndarray) -> Basis | None:
    """The Basis of a constant W [M, 1, N] (float32), or None when W is not a windowed real DFT basis as
    the module's docstring says (made once per model; a W that is no basis fails on its first rows: 512
    taps, 514 rows 4 ms for a basis, 0.3 for random weights; 2048 taps 60 / 6 ms)."""
    if w.ndim != 3 or w.shape[1] != 1 or w.dtype != np.float32:
        return None
    m, n = w.shape[0], w.shape[2]
    half = n // 2 + 1
    if n < 4 or m < 2 or m > 2 * half:
        return None
    rows = w[:, 0, :]
    with np.errstate(over="ignore", invalid="ignore"):
        top = float(np.abs(rows).max())
    if not 0 < top < np.inf:            # (NaN fails too)
        return None
    for k in (m, m // 2):
        if 2 <= k <= half and m % k == 0:
            found = _blocks(rows, k, n, top)
            if found is not None:
                return found
    return None


def _blocks(rows: np.ndarray, k: int, n: int, top: float) -> Basis | None:
    """The Basis of W's rows (float32) as len(rows) / k blocks of k rows, or None. The blocks are checked
    on their first rows before all of them, each block in float64."""
    blocks = [rows[i:i + k] for i in range(0, len(rows), k)]
    sine = [float(np.abs(b[0]).max()) <= _ZERO_ROW * top for b in blocks]
    if len(blocks) == 2 and sine[0] == sine[1]:
        return None                    # two cosine or two sine blocks: not one spectrum
    if not all(sine):
        window = blocks[sine.index(False)][0].astype(np.float64)   # a cosine block's first row: s * win (cos 0 = 1)
    else:
        # win by least squares over the sine block's first rows (each within 2^-24 of win * sin: so is
        # the estimate); where every sine of the block is 0 (n = 0, N/2) win is never read
        few = min(k, 8)
        s = _table(n, True).take(_phases(few, n))
        weight = (s * s).sum(axis=0)
        window = np.divide((blocks[0][:few] * s).sum(axis=0), weight, out=np.zeros(n), where=weight > 0)
    tables = {False: _table(n, False), True: _table(n, True)}
    for count in sorted({min(k, 4), k}):
        phases = _phases(count, n)
        signs = [_sign(b[:count], np.multiply(tables[is_sine].take(phases), window), top)
                 for b, is_sine in zip(blocks, sine)]
        if None in signs:
            return None
    # sum x win sin = -Im(rfft(x win)): a sine block is the imaginary part, negated
    parts = tuple((i * k, k, 1 if is_sine else 0, -sign if is_sine else sign)
                  for i, (is_sine, sign) in enumerate(zip(sine, signs)))
    zero = [i * k + j for i, is_sine in enumerate(sine) if is_sine for j in range(k) if (2 * j) % n == 0]
    zero_weights = np.ascontiguousarray(rows[zero].T, dtype=np.float64)
    return Basis(window, parts, tuple(zero), zero_weights, _over_window(zero_weights, window))


def _over_window(zero_weights: np.ndarray, window: np.ndarray) -> np.ndarray | None:
    """The zero rows' weights [N, count] divided by the window, so that the windowed frames (float64, the
    FFT's input) times them give the rows' sums: each term x * win * (w / win) within a few float64
    roundings (2^-53 each) of x * w, nothing next to the float32 result's own rounding. None when a
    nonzero weight sits where the window is 0 (then the sums read the frames: a float64 copy of their
    float32 samples, ~50 us of the wakeword's ~350 us STFT)."""
    inside = window != 0
    if not (zero_weights[~inside] == 0).all():
        return None
    return np.divide(zero_weights, window[:, None], out=np.zeros_like(zero_weights), where=inside[:, None])


def _sign(b: np.ndarray, model: np.ndarray, top: float) -> float | None:
    """+1 or -1: the sign s with b (float32 rows) within _ULPS * |model| + _FLOOR * top of s * model
    everywhere, else None. Computed in place on model's float64 buffer."""
    sign = 1.0 if float(np.einsum("ij,ij->", b, model)) >= 0 else -1.0
    limit = np.abs(model)
    limit *= _ULPS
    limit += _FLOOR * top
    if sign < 0:
        np.negative(model, out=model)
    model -= b
    np.abs(model, out=model)
    return sign if bool((model <= limit).all()) else None


def _phases(k: int, n: int) -> np.ndarray:
    """j i mod N for j < k, i < N (exact integers): where row j's angle 2 pi j i / N sits in _table."""
    p = np.arange(n, dtype=np.int32 if k * n < 2 ** 31 else np.int64)
    return np.multiply.outer(p[:k], p) % n


def _table(n: int, sine: bool) -> np.ndarray:
    """cos or sin(2 pi p / N) for p < N (float64), exactly 0 where the angle is a multiple of pi (sine)
    or an odd multiple of pi / 2 (cosine)."""
    p = np.arange(n)
    if sine:
        table = np.sin(p * (2 * np.pi / n))
        table[(2 * p) % n == 0] = 0.0
    else:
        table = np.cos(p * (2 * np.pi / n))
        table[((4 * p) % n == 0) & (((4 * p) // n) % 2 == 1)] = 0.0
    return table


def conv(x: np.ndarray, spec: Basis, stride: int, begin: int, end: int, frames: int) -> np.ndarray:
    """Y [B, M, frames] (float32) of X [B, 1, S] (float32, finite) and the Conv's stride and pads
    (dilation 1), frame blocks of thresholds.DFT_BLOCK_BYTES of windowed float64 samples at a time."""
    window = spec.window
    n = window.shape[0]
    batch, _, size = x.shape
    # X as one contiguous buffer of rows (zero padded when the Conv pads), its frames a strided view
    xp = np.ascontiguousarray(pad_spatial(x, (begin,), (end,))).reshape(batch, begin + size + end)
    m = sum(k for _, k, _, _ in spec.blocks)
    y = np.empty((batch, m, frames), np.float32)
    row, item = xp.strides
    block = max(1, thresholds.DFT_BLOCK_BYTES // (8 * n))
    for i in range(batch):
        for t0 in range(0, frames, block):
            t1 = min(frames, t0 + block)
            framed = np.ndarray((t1 - t0, n), xp.dtype, xp, i * row + t0 * stride * item, (stride * item, item))
            windowed = np.multiply(framed, window)
            # [frames, N/2 + 1] complex as (re, im) pairs of float64
            pairs = np.fft.rfft(windowed, axis=1).view(np.float64)
            for first, k, part, sign in spec.blocks:
                src = pairs[:, part:2 * k:2].T
                dst = y[i, first:first + k, t0:t1]
                if sign > 0:
                    np.copyto(dst, src, casting="same_kind")
                else:
                    np.negative(src, out=dst, casting="same_kind")
            if spec.zero_rows and spec.windowed_zero_weights is not None:
                y[i, spec.zero_rows, t0:t1] = np.dot(windowed, spec.windowed_zero_weights).T
            elif spec.zero_rows:
                y[i, spec.zero_rows, t0:t1] = np.dot(framed, spec.zero_weights).T
    return y
