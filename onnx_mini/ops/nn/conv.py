"""Conv (1, 11, 22): N-D convolution with groups, dilations, strides and every auto_pad.

Three formulations, picked per call from the shapes (cheap: a few integer comparisons):
- pointwise (1x1 kernel, stride 1, no padding): one matmul of W (M, C) with X viewed as (N, C, H*W);
- depthwise (one input channel per group): a multiply-add per kernel tap over strided views of the
  padded input, channels and pixels vectorised;
- shifted windows (stride 1, large spatial size): the padded input is flattened row-major once, and
  each kernel tap is one matmul of the tap's weights with a contiguous run of that flat image
  starting at the tap's offset; the padded columns are cropped at the end (no per-tap copies);
- im2col otherwise: a strided window view copied once into (C*k, out pixels), then one matmul.
float16/bfloat16 compute in float32 and round back once.
"""
from __future__ import annotations

import math

import numpy as np

from ... import blas
from ...errors import InvalidValueError
from ...registry import kernel
from .._common import UPCAST
from ._common import check_auto_pad, geometry, pad_spatial, windows

# Measured here (3x3, pad 1, batch 1, best of 7): shifted windows beat im2col only on large images
# with few output channels (56x56x64: 1.9 vs 2.0 ms; 112x112x32: 2.4 vs 2.7 ms) and lose elsewhere
# (28x28x128: 1.9 vs 1.6 ms; 56x56 with 192 outputs: 4.6 vs 3.9 ms; 7x7x512: 3.8 vs 1.9 ms).
_SHIFT_MIN_PIXELS = 2500
_SHIFT_MAX_OUT_CHANNELS = 128


@kernel("Conv", since=(1, 11, 22))
def conv_1(*, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    auto_pad = check_auto_pad(auto_pad)
    if group < 1:
        raise ValueError(f"group must be >= 1, got {group}")

    def conv(x, w, b=None):
        return _conv(x, w, b, auto_pad, dilations, group, kernel_shape, pads, strides)
    return conv


def _conv(x, w, b, auto_pad, dilations, group, kernel_shape, pads, strides):
    if x.ndim < 3 or w.ndim != x.ndim:
        raise InvalidValueError(f"X (shape {list(x.shape)}) and W (shape {list(w.shape)}) must have the same "
                                "rank, at least 3 (N, C, spatial...)")
    n, c = x.shape[:2]
    m, cg = w.shape[:2]
    r = x.ndim - 2
    kernel = list(kernel_shape) if kernel_shape else list(w.shape[2:])
    if kernel != list(w.shape[2:]):
        raise InvalidValueError(f"kernel_shape {kernel} differs from W's spatial shape {list(w.shape[2:])}")
    if c != cg * group or m % group:
        raise InvalidValueError(f"X has {c} channels and W has shape {list(w.shape)}: with group={group} W must "
                                f"be ({group}k, {c // group if c % group == 0 else '?'}, ...)")
    if b is not None and b.shape != (m,):
        raise InvalidValueError(f"B must have shape [{m}], got {list(b.shape)}")
    strides_ = list(strides) if strides else [1] * r
    dil = list(dilations) if dilations else [1] * r
    begin, end, out = geometry(x.shape[2:], kernel, strides_, dil, pads, auto_pad)

    dtype = x.dtype
    if dtype in UPCAST:
        x, w = x.astype(np.float32), w.astype(np.float32)
        b = None if b is None else b.astype(np.float32)
    if n == 0 or m == 0 or cg == 0:    # nothing to sum: the output is the bias alone
        y = np.zeros((n, m, *out), dtype=x.dtype)
    elif all(k == 1 for k in kernel) and all(s == 1 for s in strides_) and not any(begin) and not any(end):
        y = _grouped_matmul(w.reshape(group, m // group, cg), x.reshape(n, group, cg, -1)).reshape(n, m, *out)
    elif cg == 1 and group > 1:
        y = _depthwise(x, w, group, kernel, strides_, dil, begin, end, out)
    elif (all(s == 1 for s in strides_) and math.prod(out) >= _SHIFT_MIN_PIXELS and group == 1
          and m <= _SHIFT_MAX_OUT_CHANNELS):
        y = _shifted(x, w, kernel, dil, begin, end, out)
    else:
        y = _im2col(x, w, group, kernel, strides_, dil, begin, end, out)
    if b is not None:
        y += b.reshape((1, m) + (1,) * r)
    return y.astype(dtype, copy=False)


def _im2col(x, w, group, kernel, strides, dil, begin, end, out):
    n, c = x.shape[:2]
    m, cg = w.shape[:2]
    r = len(kernel)
    view = windows(pad_spatial(x, begin, end), kernel, strides, dil, out)      # (N, C, *out, *k)
    # -> (N, G, Cg, *k, *out): the reduction axes (Cg, *k) before the pixels, then one matmul
    order = (0, 1, *range(2 + r, 2 + 2 * r), *range(2, 2 + r))
    cols = np.ascontiguousarray(view.transpose(order)).reshape(n, group, cg * math.prod(kernel), -1)
    return _grouped_matmul(w.reshape(group, m // group, -1), cols).reshape(n, m, *out)


def _grouped_matmul(w, x):
    """w (G, Mg, K) times x (N, G, K, P) -> (N, G, Mg, P), as one 2-D BLAS call per (image, group):
    numpy's stacked matmul runs several times slower than the same 2-D calls here."""
    n, g = x.shape[:2]
    y = np.empty((n, g, w.shape[1], x.shape[3]), dtype=np.result_type(w, x))
    for i in range(n):
        for j in range(g):
            blas.matmul(w[j], x[i, j], out=y[i, j])
    return y


def _shifted(x, w, kernel, dil, begin, end, out):
    """Stride 1, group 1: sum over taps of W[:, :, tap] @ (a contiguous run of the flat padded input)."""
    n, c = x.shape[:2]
    m = w.shape[0]
    r = len(kernel)
    xp = pad_spatial(x, begin, end)
    padded = xp.shape[2:]
    inner = math.prod(padded[1:])                     # one step along the first spatial axis
    run = out[0] * inner                              # flat length of the output rows (uncropped)
    steps = [math.prod(padded[d + 1:]) for d in range(r)]
    offsets = [sum(t * dl * s for t, dl, s in zip(tap, dil, steps)) for tap in np.ndindex(*kernel)]
    flat = xp.reshape(n, c, -1)
    need = max(offsets) + run
    if need > flat.shape[2]:   # the last taps read past the end: append zeros (they land in cropped columns)
        flat = np.concatenate([flat, np.zeros((n, c, need - flat.shape[2]), dtype=flat.dtype)], axis=2)
    wt = np.ascontiguousarray(w.reshape(m, c, -1).transpose(2, 0, 1))      # (taps, M, C)
    acc = np.empty((n, m, run), dtype=np.result_type(w, x))
    tmp = np.empty((m, run), dtype=acc.dtype)
    for i in range(n):       # 2-D BLAS calls on (C, run) views with a leading dimension: no copies
        blas.matmul(wt[0], flat[i, :, offsets[0]:offsets[0] + run], out=acc[i])
        for t in range(1, len(offsets)):
            blas.matmul(wt[t], flat[i, :, offsets[t]:offsets[t] + run], out=tmp)
            acc[i] += tmp
    acc = acc.reshape(n, m, out[0], *padded[1:])
    return acc[(slice(None), slice(None), slice(None)) + tuple(slice(0, o) for o in out[1:])]


def _depthwise(x, w, group, kernel, strides, dil, begin, end, out):
    """One input channel per group (depthwise, possibly with a channel multiplier)."""
    n = x.shape[0]
    m = w.shape[0]
    mult = m // group
    r = len(kernel)
    view = windows(pad_spatial(x, begin, end), kernel, strides, dil, out)      # (N, C, *out, *k)
    wk = w.reshape(group, mult, *kernel)
    y = np.zeros((n, group, mult, *out), dtype=x.dtype)
    for tap in np.ndindex(*kernel):
        xs = view[(Ellipsis,) + tap]                                            # (N, C, *out)
        y += xs[:, :, None] * wk[(slice(None), slice(None)) + tap].reshape((1, group, mult) + (1,) * r)
    return y.reshape(n, m, *out)
