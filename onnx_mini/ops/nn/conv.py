"""Conv (1, 11, 22): N-D convolution with groups, dilations, strides and every auto_pad.

Formulations, picked per call from the shapes (cheap: a few integer comparisons):
- pointwise (1x1 kernel, stride 1, no padding): one matmul of W (M, C) with X viewed as (N, C, H*W);
- depthwise (one input channel per group): narrow 2-D outputs as stacked products with banded
  matrices of the taps (banded.py); otherwise a multiply-add per kernel tap into reused buffers, over
  flat padded planes (large images: each tap one contiguous run) or channels-last (small images:
  the weights along the contiguous axis; or one einsum over the windows), in blocks spread over
  threads (see _depthwise);
- shifted windows (stride 1, fewer output than input channels and not a tiny image, or as many and
  large im2col columns): the padded input is flattened row-major once, and each kernel tap is one
  matmul of the tap's weights with a contiguous run of that flat image starting at the tap's
  offset; the padded columns are cropped at the end (no per-tap copies);
- Winograd F(2x2, 3x3) for wide 3x3 layers (C and M >= 256, stride 1; winograd.py): 16 products
  instead of 9 per tile position, on 4x fewer positions;
- im2col otherwise: a strided window view copied once into (C*k, out pixels), then one matmul.
float16/bfloat16 compute in float32 and round back once.
"""
from __future__ import annotations

import math

import numpy as np

from ... import blas, parallel
from ...registry import kernel
from .._common import UPCAST
from . import banded, winograd
from ._common import (cached_transform, check_auto_pad, check_bias, check_groups, conv_kernel, finite, geometry,
                      pad_spatial, per_image, read_extent, read_region, strided_view, windows)

# Shifted windows do 9 (per 3x3 tap) products (M, C) x (C, pixels) and 8 sums of (M, pixels) where
# im2col copies (9C, pixels) once and does one product: they win when the output has fewer channels
# than the input (less to sum than to copy) and the image is not tiny. Measured here (3x3, pad 1,
# batch 1, im2col vs shifted, interleaved; OpenBLAS on 2 threads / 1 thread): 56x56 128->64 6.2 vs
# 5.5 ms, 28x28 128->32 2.0 vs 1.2, 112x112 64->32 9.2 vs 8.4; but 56x56 16->64 1.07 vs 2.66,
# 64x64 16->32 1.14 vs 1.73, 7x7 512->128 0.83 vs 0.97. With as many outputs as inputs they win
# once im2col's columns leave the caches for memory (VGG's 224x224x64 42 vs 34 ms, columns of 110 MB;
# 112x112x128 29 vs 25, 112x112x64 8.1 vs 6.9, 112x112x32 2.7 vs 2.3 at 14 MB) and lose or draw below
# (56x56x64 3.6 vs 3.9 ms at 7 MB, 7x7x512 3.2 vs 5.7). In VGG-19 as a whole this is a draw (282
# vs 281 ms interleaved: the layers' gains go to the steps after them, which read the cropped rows
# of a shifted output), but its peak memory drops from 714 to 623 MB (no 110 MB of columns).
_SHIFT_MIN_PIXELS = 700
_SHIFT_SAME_MIN_COLUMN_BYTES = 12 << 20
# Depthwise (see _depthwise): channels-last up to this many output pixels, flat above; blocks of at
# most this many bytes of scratch buffers, which bounds the scratch memory of large batches (blocks
# sized for the caches measured no faster: the nine MobileNet layers at batch 8 took 61 ms in blocks
# of 1 MB, 59 of 2 MB, 56-57 of 4 and 8 MB); a thread per part of at least this many multiply-adds
# (700k: 64x112x112 stride 2 splits, 512x14x14 does not).
_DW_LAST_MAX_PIXELS = 1024
_DW_BLOCK_BYTES = 8 * 1024 * 1024
_DW_MIN_PART_MACS = 700_000
# Small images with one output channel per input channel go to one einsum over the channels-last
# windows (_dw_einsum; 3x3, batch 1, against channels-last, interleaved: 112x56x56 /2 0.68 -> 0.52 ms,
# 272x14x14 /2 0.136 -> 0.063, 256x28x28 /2 0.36 -> 0.26, 272x14x14 0.22 -> 0.15, 544x7x7 0.15 ->
# 0.08, 384x14x14 0.29 -> 0.22; with its tiled weights made once per constant W, 192x32x32 2.49 ->
# 0.98, 1024x14x14 0.77 -> 0.62). The banded products take over where they fit and measure faster:
# strided with few channels (banded.FEW_CHANNELS; 32x56x56 /2 0.23 -> 0.17 ms, 24x28x28 /2 0.064 ->
# 0.039), and at stride 1 once the einsum's tiled weights (taps x out_w x C) pass this many bytes
# (768x14x14, 387 kB: 0.41 -> 0.39 ms; 1024x14x14 0.62 -> 0.50); below, the einsum is faster
# (136x28x28 0.326 -> 0.283 ms, 256x28x28 0.58 -> 0.51, 512x14x14 0.267 -> 0.247, 64x28x28 0.165
# -> 0.137, 16x28x28 0.054 -> 0.051).
_DW_EINSUM_MAX_WEIGHT_BYTES = 300 << 10
# The channels-last result of a large image goes back to NCHW in blocks of about this many pixels:
# each element read from a channels-last line is one of C // 16 in it, which stay in the caches
# through a block but not through a whole plane (transpose alone, interleaved: 136x28x28 66 -> 38 us,
# 112x28x28 54 -> 31, 240x28x28 120 -> 66; 20x20 and smaller lose, 136x20x20 17 -> 19).
_TRANSPOSE_BLOCK_PIXELS = 196
_TRANSPOSE_MIN_PIXELS = 576
# Large NCHW planes go to channels-last this many channels at a time: the lines read, one per
# channel plane, then fit the cache sets (planes of 56x56 float32 lie 196 lines apart, so 16 sets
# take them all): 112x56x56 174 -> 130 us, 128x56x56 197 -> 148, 136x28x28 46 -> 41; 14x14 loses.
_TRANSPOSE_CHANNELS = 64
# Gap (elements) after each row of a channels-last result whose C values span a multiple of
# _CACHE_SET_BYTES (see _dw_einsum).
_CACHE_GAP = 16
_CACHE_SET_BYTES = 512
# Groups whose products are at most this many multiply-adds each go to one stacked matmul (numpy
# calls BLAS per group without a Python round trip: ShuffleNet's 4 x 34x34x784 75 -> 69 us, a
# ResNeXt-like 32 x 8x72x784 331 -> 278 us, batch 8 601 -> 545); larger ones one blas.matmul each,
# which can split them over threads.
_STACKED_MAX_MACS = blas.MIN_PART_MACS
# Input shapes a Conv kernel keeps the geometry of (see _conv's layouts).
_LAYOUTS = 16


@kernel("Conv", since=(1, 11, 22))
def conv_1(*, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    auto_pad = check_auto_pad(auto_pad)
    if group < 1:
        raise ValueError(f"group must be >= 1, got {group}")

    layouts = {}

    def conv(x, w, b=None):
        return _conv(x, w, b, auto_pad, dilations, group, kernel_shape, pads, strides, layouts=layouts)
    return conv


def _conv(x, w, b, auto_pad, dilations, group, kernel_shape, pads, strides, epilogue=None, shuffle=False,
          layouts=None):
    """epilogue(y_part, i0, i1), when given, finishes images i0..i1-1 of the float32/float64 result in
    place (ops/fused.py: residual add, activation), while they are still in the caches.
    shuffle: a pointwise Conv writes its output channels in channel-shuffle order, group a's j-th
    channel to channel j*group + a (optimize/channel_shuffle.py; b given in that order).
    layouts: a dict the calling kernel keeps, where the checked geometry of each (X, W, B) shape
    stays, with what the formulations plan from it (the checks and geometry cost ~4 us a call, a third
    of a small pointwise Conv's overhead; a depthwise layout's plan ~8 us)."""
    n, c = x.shape[:2]
    m, cg = w.shape[:2]
    r = x.ndim - 2
    key = (x.shape, w.shape, None if b is None else b.shape)
    layout = None if layouts is None else layouts.get(key)
    if layout is None:
        kernel = conv_kernel(x, w, kernel_shape)
        check_groups(c, w, group)
        check_bias(b, m)
        strides_ = list(strides) if strides else [1] * r
        dil = list(dilations) if dilations else [1] * r
        begin, end, out = geometry(x.shape[2:], kernel, strides_, dil, pads, auto_pad)
        pointwise = (all(k == 1 for k in kernel) and all(s == 1 for s in strides_) and not any(begin)
                     and not any(end))
        layout = (kernel, strides_, dil, begin, end, out, pointwise, {})
        if layouts is not None:
            if len(layouts) >= _LAYOUTS:
                layouts.clear()
            layouts[key] = layout
    kernel, strides_, dil, begin, end, out, pointwise, memo = layout

    dtype = x.dtype
    given_w = w                          # Winograd caches its transform of the (constant) W given
    if dtype in UPCAST:
        x, w = x.astype(np.float32), w.astype(np.float32)
        b = None if b is None else b.astype(np.float32)
    bias = None if b is None else b.reshape((1, m) + (1,) * r)

    def finish(y_part, i0, i1):      # bias, then the caller's epilogue, on a run of images
        if bias is not None:
            y_part += bias
        if epilogue is not None:
            epilogue(y_part, i0, i1)
    if n == 0 or m == 0 or cg == 0:    # nothing to sum: the output is the bias alone
        y = np.zeros((n, m, *out), dtype=x.dtype)
    elif pointwise:
        wg = w.reshape(group, m // group, cg)
        if b is not None and w is given_w and (c + group) * 2 <= m:     # see _bias_column
            wg, x = _bias_column(w, b, group, shuffle), _with_ones_row(x, group)
            bias = None                                 # summed by the product (finish reads it late)
        if n == 1:                     # one image: finished directly (a small Conv's fixed cost counts)
            y = _pointwise(x, wg, out, shuffle)
            finish(y, 0, 1)
            return y.astype(dtype, copy=False)
        return _per_image(_pointwise, x, m, out, finish, wg, out, shuffle).astype(dtype, copy=False)
    elif shuffle:
        raise ValueError("a channel shuffle is folded only into pointwise Conv")
    elif cg == 1 and group > 1:
        y = _depthwise(x, w, b, group, kernel, strides_, dil, begin, out, given_w, memo)
        bias = None                                             # added by _depthwise
    elif (winograd.fits(x, m, kernel, strides_, dil, group, out) and finite(x)
          and (u := winograd.weights(given_w, x.dtype)) is not None):
        return _per_image(winograd.conv, x, m, out, finish, u, begin, out).astype(dtype, copy=False)
    elif all(s == 1 for s in strides_) and group == 1 and (
            (m < c and math.prod(out) >= _SHIFT_MIN_PIXELS)
            or (m == c and c * math.prod(kernel) * math.prod(out) * x.itemsize >= _SHIFT_SAME_MIN_COLUMN_BYTES)):
        return _per_image(_shifted, x, m, out, finish, w, kernel, dil, begin, end, out).astype(dtype, copy=False)
    else:
        return _per_image(_im2col, x, m, out, finish, w, group, kernel, strides_, dil, begin, end,
                          out).astype(dtype, copy=False)
    finish(y, 0, n)
    return y.astype(dtype, copy=False)


def _per_image(formulation, x, m, out, finish, *args):
    """formulation(x[i:i+1], *args) image by image (per_image), each finished (finish(y_i, i, i+1):
    bias, fused epilogue) while it is in the caches."""
    n = x.shape[0]
    if n == 1:
        y = formulation(x, *args)
        finish(y, 0, 1)
        return y

    def compute(i, y_i):
        y_i[...] = formulation(x[i:i + 1], *args)
        finish(y_i, i, i + 1)
    return per_image(compute, (n, m, *out), x.dtype)


def _pointwise(x, wg, out, shuffle=False):
    """1x1, stride 1, no padding: W (G, Mg, Cg) times X viewed as (N, G, Cg, pixels); with shuffle,
    group a's rows go to channels a, a + G, ... (BLAS writes rows G rows apart as fast as adjacent ones)."""
    n = x.shape[0]
    g, mg, cg = wg.shape
    if not shuffle:
        return _grouped_matmul(wg, x.reshape(n, g, cg, -1)).reshape(n, g * mg, *out)
    y = np.empty((n, g * mg, *out), dtype=np.result_type(wg, x))
    _grouped_matmul(wg, x.reshape(n, g, cg, -1), out=y.reshape(n, mg, g, -1).transpose(0, 2, 1, 3))
    return y


def _bias_column(w, b, group, shuffle):
    """W (M, Cg, 1, ...) with the bias as one more input column per group -> (G, Mg, Cg + 1), for X with
    a row of ones after each group (_with_ones_row): the product then adds the bias itself, where a
    pass over the output would cost more than the copy of X (an expanding 1x1 Conv: ShuffleNet's
    first grouped one, 24 -> 112 channels at 56x56, 167 -> 128 us, its bias pass alone 63 us; in
    whole models, interleaved: ResNet-50 -2..-3.7%, squeezenet -0.7..-2%). b is in output order
    (shuffled when `shuffle`), the column in each group's row order. Kept per constant W while the
    same constant B comes with it."""
    m, cg = w.shape[:2]
    mg = m // group

    def make():
        column = b.reshape(mg, group).T.reshape(-1) if shuffle else b
        wb = np.empty((group, mg, cg + 1), dtype=np.result_type(w, b))
        wb[:, :, :cg] = w.reshape(group, mg, cg)
        wb[:, :, cg] = column.reshape(group, mg)
        return b, wb
    if b.flags.writeable:
        return make()[1]
    kept, wb = cached_transform(w, ("bias column", group, shuffle, id(b)), make)
    return wb if kept is b else make()[1]


def _with_ones_row(x, group):
    """x (N, C, *spatial) -> (N, C + G, *spatial): each group's channels followed by a channel of ones."""
    n, c = x.shape[:2]
    xo = np.empty((n, group, c // group + 1, *x.shape[2:]), dtype=x.dtype)
    np.copyto(xo[:, :, :-1], x.reshape(n, group, c // group, *x.shape[2:]))
    xo[:, :, -1] = 1
    return xo.reshape(n, c + group, *x.shape[2:])


def _im2col(x, w, group, kernel, strides, dil, begin, end, out):
    n, c = x.shape[:2]
    m, cg = w.shape[:2]
    r = len(kernel)
    view = windows(pad_spatial(x, begin, end), kernel, strides, dil, out)      # (N, C, *out, *k)
    # -> (N, G, Cg, *k, *out): the reduction axes (Cg, *k) before the pixels, then one matmul
    order = (0, 1, *range(2 + r, 2 + 2 * r), *range(2, 2 + r))
    cols = np.ascontiguousarray(view.transpose(order)).reshape(n, group, cg * math.prod(kernel), -1)
    return _grouped_matmul(w.reshape(group, m // group, -1), cols).reshape(n, m, *out)


def _grouped_matmul(w, x, out=None):
    """w (G, Mg, K) times x (N, G, K, P) -> (N, G, Mg, P) (into `out` when given): one stacked matmul
    for small groups, else one 2-D BLAS call per (image, group) (see _STACKED_MAX_MACS)."""
    n, g = x.shape[:2]
    if g > 1 and w.shape[1] * w.shape[2] * x.shape[3] <= _STACKED_MAX_MACS:
        return np.matmul(w, x, out=out)
    y = np.empty((n, g, w.shape[1], x.shape[3]), dtype=np.result_type(w, x)) if out is None else out
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


def _depthwise(x, w, b, group, kernel, strides, dil, begin, out, given_w, memo=None):
    """One input channel per group (depthwise, possibly with a channel multiplier), bias included.

    Narrow 2-D outputs with one output channel per input channel and finite values, where the
    layout below would not be the einsum, or would be with large tiled weights or (strided) few
    channels (see _DW_EINSUM_MAX_WEIGHT_BYTES): stacked products with banded matrices of the taps,
    cached per constant W (banded.py). Otherwise:
    A multiply per kernel tap into a reused buffer (out=) and an in-place add: no per-tap temporaries,
    the first tap assigned rather than added to zeros. numpy's cost here is mostly per inner loop, so
    the layout is the one giving long inner loops:
    - flat (large images): each input plane (each stride phase of it) padded and flattened once, so
      that every tap reads one contiguous run at its own offset and Y accumulates in place (_dw_flat);
    - channels-last (small images, many channels): the input transposed once to (N, *spatial, C), so
      that the per-tap weights lie along the contiguous axis; the last tap's add writes Y transposed
      back (_dw_channels_last); with one output channel per input channel, one einsum over the
      windows of that layout instead (_dw_einsum).
    Measured here (3x3, pad 1, float32, batch 1, one thread, median of 40; before: strided windows of
    the padded input, y += window * w per tap): 32x112x112 1.32 -> 0.87 ms, 64x112x112 /2 1.77 -> 0.92,
    128x56x56 2.12 -> 1.00, 128x56x56 /2 0.95 -> 0.77 (channels-last from here on), 256x28x28 1.31 ->
    0.73, 256x28x28 /2 0.60 -> 0.38, 512x14x14 0.92 -> 0.40, 512x14x14 /2 0.44 -> 0.21, 1024x7x7 0.78
    -> 0.27; the nine at batch 8: 161 -> 59 ms. Flat against channels-last: 128x56x56 1.00 vs 1.35 ms,
    128x56x56 /2 0.70 vs 0.73 (a tie), 256x28x28 0.96 vs 0.71, 512x14x14 0.55 vs 0.39, 1024x7x7 0.40 vs 0.26.
    Two threads, when the second core is idle: 32x112x112 0.87 -> 0.71-0.77 ms, 128x56x56 1.00 -> 0.74,
    64x112x112 /2 0.90 -> 0.71 (or no gain), the nine at batch 8 59 -> 38 ms; with the other core busy
    elsewhere they gain nothing and can lose (32x112x112: 0.90 -> 1.23 once).
    """
    memo = {} if memo is None else memo
    n = x.shape[0]
    m = w.shape[0]
    mult = m // group
    choice = memo.get("choice")     # the formulation (by shape and dtype), then its plan: made once
    if choice is None or choice[0] != x.dtype:
        memo.clear()
        choice = memo["choice"] = (x.dtype, *_depthwise_choice(x, kernel, strides, out, group, mult))
    _, make, use_banded = choice
    if use_banded and finite(x):
        t = banded.weights(given_w, x.dtype, read_extent(out[1], strides[1], kernel[1], dil[1]), out[1],
                           strides[1], dil[1])
        if t is not None:
            y = banded.conv(x, t, kernel, strides, dil, begin, out)
            if b is not None:
                y += b.reshape(m, 1, 1)
            return y
    y = np.empty((n, m, *out), dtype=x.dtype)
    made = memo.get("made")
    if made is None:
        taps = list(np.ndindex(*kernel))
        step, plane = make(x.shape[2:], kernel, strides, dil, begin, out, mult, taps)
        # the layout's own arrangement of W (the einsum's: every channel, one block per image), cached
        # per constant W under this key
        key = ("depthwise", make.__name__, getattr(step, "arrangement", None), np.dtype(x.dtype), tuple(out),
               tuple(strides))
        made = memo["made"] = (taps, step, plane, getattr(step, "weights", None), key)
    taps, step, plane, arranged, weights_key = made
    wk = w.reshape(group, mult, len(taps))
    if arranged is not None:
        wk = cached_transform(given_w, weights_key, lambda: arranged(wk))
    threads = parallel.threads()
    blocks, want = memo.get(("blocks", threads, x.itemsize)) or memo.setdefault(
        ("blocks", threads, x.itemsize), _depthwise_blocks(n, m, group, len(taps), plane * x.itemsize,
                                                           math.prod(out), make is _dw_flat, threads))
    if len(blocks) == 1 and arranged is not None:     # the einsum on the whole input (a small Conv's cost counts)
        step(x, wk, None if b is None else b.reshape(m, 1), y.reshape(n, m, 1, *out), {})
        return y

    def work(lo, hi):
        buffers = {}
        for i0, i1, c0, c1 in blocks[lo:hi]:
            step(x[i0:i1, c0:c1], wk if arranged is not None else wk[c0:c1],
                 None if b is None else b[c0 * mult:c1 * mult].reshape(c1 - c0, mult),
                 y[i0:i1, c0 * mult:c1 * mult].reshape(i1 - i0, c1 - c0, mult, *out), buffers)
    if want > 1 and len(blocks) > 1:
        parallel.split(work, len(blocks), len(blocks) // want)
    else:
        work(0, len(blocks))
    return y


def _depthwise_choice(x, kernel, strides, out, group, mult):
    """-> (layout maker, whether the banded products go first) for one shape."""
    if math.prod(out) > _DW_LAST_MAX_PIXELS:
        make = _dw_flat
    elif mult == 1:
        make = _dw_einsum
    else:
        make = _dw_channels_last
    if make is _dw_einsum:
        tile = out[-1] if strides[-1] == 1 else 1
        banded_first = (group <= banded.FEW_CHANNELS if max(strides) > 1 else
                        math.prod(kernel) * tile * group * x.itemsize > _DW_EINSUM_MAX_WEIGHT_BYTES)
    else:
        banded_first = True
    return make, banded_first and banded.fits(x, kernel, mult, out)


def _depthwise_blocks(n, m, group, taps, per_channel_bytes, pixels, flat, threads):
    """-> (blocks (i0, i1, c0, c1), want): blocks of whole images, or of channels of one image, of at
    most _DW_BLOCK_BYTES of scratch (flat), at least `want` of them for the threads. One image in
    channels-last stays one block: splitting its channels shortens the inner loops (512x14x14 on two
    threads: 0.39 -> 0.66 ms)."""
    per_image = group * per_channel_bytes
    want = max(1, min(threads, n * m * pixels * taps // _DW_MIN_PART_MACS))
    if n > 1 and (per_image <= _DW_BLOCK_BYTES or not flat):
        per = max(1, min(_DW_BLOCK_BYTES // per_image, n // want))
        blocks = [(i, min(n, i + per), 0, group) for i in range(0, n, per)]
    elif flat:
        parts = -(-per_image // _DW_BLOCK_BYTES)
        if n == 1:
            parts = -(-parts // want) * want
        per = -(-group // parts)
        blocks = [(i, i + 1, c, min(group, c + per)) for i in range(n) for c in range(0, group, per)]
    else:
        blocks = [(0, 1, 0, group)]
    return blocks, want


def _buffer(buffers, name, shape, dtype, zeros=False):
    """A (shape) view of a buffer kept across the blocks of one call (reallocated for a larger block);
    a zeroed buffer keeps its zeros where the blocks never write (the padding)."""
    buf = buffers.get(name)
    if buf is None or buf.dtype != dtype or any(h < s for h, s in zip(buf.shape, shape)):
        buf = buffers[name] = (np.zeros if zeros else np.empty)(shape, dtype=dtype)
        return buf
    return buf if buf.shape == shape else buf[tuple(slice(0, s) for s in shape)]


def _dw_flat(in_sizes, kernel, strides, dil, begin, out, mult, taps):
    """-> (step, buffer elements per image and channel) of the flat layout.

    Along an axis with stride s, tap t reads padded position o*s + t*d = (o + q)*s + p with p = t*d % s,
    q = t*d // s: output o of the tap is element o + q of phase p (the padded input's positions i*s + p).
    Each used phase is stored flat, so that each tap reads one contiguous run. Outer axes keep rows of
    lph = out + max q elements (zeros where padding). The last axis keeps only the columns holding
    input values, out[-1] of them with the usual "same" padding: the run is then laid out exactly like
    Y (no crop; Y itself accumulates), and the columns where a tap's read wraps into the next row
    (padding in the real image) have their products set to 0 * weight."""
    r = len(kernel)
    pq = [[((t * d) % s, (t * d) // s) for t, d, s in zip(tap, dil, strides)] for tap in taps]
    lph = [o + max(v[a][1] for v in pq) for a, o in enumerate(out)]

    def data(a, p):   # phase elements i holding input values: x index i*s + p - begin in [0, size)
        s, bg = strides[a], begin[a]
        return max(0, -((p - bg) // s)), (in_sizes[a] - 1 + bg - p) // s + 1

    first, width = {}, {}           # last axis, per phase: first stored element, stored columns
    for p in {v[-1][0] for v in pq}:
        qs = [v[-1][1] for v in pq if v[-1][0] == p]
        lo, hi = data(r - 1, p)
        lo, hi = max(lo, min(qs)), min(hi, out[-1] + max(qs))     # only what some tap reads
        first[p], width[p] = lo, max(0, hi - lo)
    cols = max(out[-1], max(width.values()))
    shape = lph[:-1] + [cols]                                      # a phase image
    steps = [math.prod(shape[a + 1:]) for a in range(r)]
    run = out[0] * steps[0]
    size = math.prod(shape)
    phases = sorted({tuple(pa for pa, _ in v) for v in pq})
    offs = [sum(qa * st for (_, qa), st in zip(v[:-1], steps)) + v[-1][1] - first[v[-1][0]] for v in pq]
    guard = max(0, -min(offs))                                     # zeros before the first row
    reads = [(phases.index(tuple(pa for pa, _ in v)), off + guard) for v, off in zip(pq, offs)]
    length = max(guard + size, max(off for _, off in reads) + run)
    wraps = []                      # per tap: output columns whose read wrapped into another row
    for v in pq:
        p, q = v[-1]
        lo, hi = first[p] - q, cols + first[p] - q                 # columns o reading a stored column
        wraps.append([c for c in (slice(0, min(lo, out[-1])), slice(max(0, hi), out[-1]))
                      if r > 1 and c.stop > c.start])
    copies = []                     # (phase, destination slices in the phase image, source slices in x)
    for k, p in enumerate(phases):
        dst, src = [], []
        for a in range(r):
            s, bg = strides[a], begin[a]
            if a < r - 1:
                lo, hi = data(a, p[a])
                hi = min(hi, lph[a])
                dst.append(slice(lo, hi))
            else:
                lo, hi = first[p[a]], first[p[a]] + width[p[a]]
                dst.append(slice(0, hi - lo))
            src.append(slice(lo * s + p[a] - bg, (hi - 1) * s + p[a] - bg + 1, s))
        if all(d.stop > d.start for d in dst):
            copies.append((k, tuple(dst), tuple(src)))
    crop = tuple(slice(0, o) for o in out[1:])
    cropped = shape[1:] != list(out[1:])

    def step(x, wk, b, y, buffers):
        n, c = x.shape[:2]
        flat = _buffer(buffers, "flat", (n, c, len(phases), length), x.dtype, zeros=True)
        for k, dst, src in copies:
            flat[:, :, k, guard:guard + size].reshape(n, c, *shape)[(slice(None), slice(None)) + dst] = \
                x[(slice(None), slice(None)) + src]

        def rows(a):    # (n, c, mult, run) -> (n, c, mult, out[0], *shape[1:])
            return a.reshape(n, c, mult, out[0], *shape[1:])

        direct = not cropped and y.flags.c_contiguous     # Y accumulates itself
        acc = y.reshape(n, c, mult, run) if direct else _buffer(buffers, "acc", (n, c, mult, run), x.dtype)
        tmp = _buffer(buffers, "tmp", (n, c, mult, run), x.dtype) if len(taps) > 1 else None
        zero = wk * 0 if any(wraps) else None
        for i, (k, off) in enumerate(reads):
            dest = acc if i == 0 else tmp
            np.multiply(flat[:, :, None, k, off:off + run], wk[:, :, i:i + 1], out=dest)
            for w in wraps[i]:      # padding times the weight: 0, or NaN for a non-finite weight
                rows(dest)[..., w] = zero[:, :, i].reshape(c, mult, *(1,) * r)
            if i == 0:
                if b is not None:
                    acc += b[:, :, None]
            elif i < len(taps) - 1 or direct:
                acc += tmp
            else:                       # the last tap's sum goes straight to Y, cropped
                np.add(rows(acc)[(Ellipsis,) + crop], rows(tmp)[(Ellipsis,) + crop], out=y)
        if len(taps) == 1 and not direct:
            np.copyto(y, rows(acc)[(Ellipsis,) + crop])
    return step, len(phases) * length + 2 * mult * run


def _channels_last_input(in_sizes, kernel, strides, dil, begin, out):
    """-> (need, padded(x, buffers)): the padded input positions the windows read along each axis, and
    a function giving the block x (n, c, *in_sizes) padded and transposed to (n, *need, c), in a
    buffer kept across blocks (its padding stays zero)."""
    need = [read_extent(o, s, k, d) for o, s, k, d in zip(out, strides, kernel, dil)]
    dst, src = read_region(in_sizes, begin, need)
    regions = [] if any(d.stop <= d.start for d in dst) else [((slice(None), *dst), tuple(src))]
    large = math.prod(in_sizes) >= _TRANSPOSE_MIN_PIXELS

    def padded(x, buffers):
        xp = _buffer(buffers, "xp", (x.shape[0], *need, x.shape[1]), x.dtype, zeros=True)
        _copy_channels_last(xp, x, regions, large)
        return xp
    return need, padded


def _copy_channels_last(xp, x, regions, large):
    """xp[dst + (channels,)] = x[(:, channels) + src] moved to channels-last, for each (dst, src) region;
    large planes _TRANSPOSE_CHANNELS channels at a time (see there)."""
    c = x.shape[1]
    to_last = (0, *range(2, x.ndim), 1)
    step = _TRANSPOSE_CHANNELS if large else c
    for dst, src in regions:
        for c0 in range(0, c, step):
            channels = slice(c0, c0 + step)
            np.copyto(xp[(*dst, channels)], x[(slice(None), channels, *src)].transpose(to_last))


def _dw_einsum(in_sizes, kernel, strides, dil, begin, out, mult, taps):
    """-> (step, buffer elements per image and channel) of the window-sum layout (one output channel
    per input channel): the channels-last padded input seen as windows (n, *out, *kernel, C), summed
    against the weights (*kernel, C) by one einsum; Y is written back from the channels-last result.

    With stride 1 along the last axis a window row is one contiguous run of out[-1]*C values, so the
    last output axis and C merge into einsum's inner loop, against the weights tiled out[-1] times
    (3x3, batch 1, bias included, interleaved: 136x28x28 0.43 -> 0.33 ms, 272x14x14 0.176 -> 0.161).
    A large image with a stride s along the last axis gets the same long inner loop from its column
    phases (_column_phases_input: phase p holding the padded columns j*s + p): a tap t*d = q*s + p
    reads phase p from column q on, so the window sum runs over (p, q) slots, those without a tap
    weighted 0 (3x3 stride 2: 12 slots for 9 taps; 112x56x56 /2 451 -> 379 us, 128x56x56 /2 509 ->
    465; small ones lose: 272x14x14 /2 63 -> 71, 512x14x14 /2 103 -> 159).
    The channels-last result keeps a gap after each row (merged) or pixel (C of them otherwise) when
    C values span a multiple of 512 bytes: reading it back with such a power-of-two stride thrashes
    the cache sets (512x14x14: the copy back 227 -> 53 us; 1024x7x7 132 -> 16)."""
    r = len(kernel)
    phased = strides[-1] > 1 and math.prod(out) >= _TRANSPOSE_MIN_PIXELS
    if phased:
        need, padded = _column_phases_input(in_sizes, kernel, strides, dil, begin, out)
        slots = (strides[-1], (kernel[-1] - 1) * dil[-1] // strides[-1] + 1)     # (p, q) along the last axis
        window = (*kernel[:-1], *slots)
    else:
        need, padded = _channels_last_input(in_sizes, kernel, strides, dil, begin, out)
        window = tuple(kernel)
    letters = "abcdefghijklmnopqrstuvwxyz"
    tile = out[-1] if strides[-1] == 1 or phased else 1
    outer = out[:-1] if tile > 1 else out
    o_ax, k_ax = letters[:len(outer)], letters[r:r + len(window)]
    subscripts = f"N{o_ax}{k_ax}C,{k_ax}C->N{o_ax}C"
    back = (0, r + 1, *range(1, r + 1))
    inner = math.prod(out[1:])
    rows = max(1, _TRANSPOSE_BLOCK_PIXELS // inner) if math.prod(out) >= _TRANSPOSE_MIN_PIXELS else out[0]

    def weights(wk):       # W (C, 1, taps) -> (*window, tile * C): each tap's C weights tiled along the row
        c = wk.shape[0]
        taps_c = wk[:, 0, :].T.reshape(*kernel, 1, c)
        if not phased:
            wl = np.empty((*kernel, tile, c), dtype=wk.dtype)
            np.copyto(wl, taps_c)
        else:
            wl = np.zeros((*window, tile, c), dtype=wk.dtype)
            for t in range(kernel[-1]):
                q, p = divmod(t * dil[-1], strides[-1])
                np.copyto(wl[..., p, q, :, :], taps_c[..., t, :, :])
        return wl.reshape(*window, tile * c)

    shapes = {}         # padded input's (shape, strides) -> (window view shape, its strides, scratch shape)

    def geometry(xp):
        n, c = xp.shape[0], xp.shape[-1]
        st = xp.strides
        gap = _CACHE_GAP if c * xp.itemsize % _CACHE_SET_BYTES == 0 else 0
        if phased:      # xp (n, *need[:-1], s, columns, C): rows as usual, then (p, q) slots
            window_strides = (*(st[1 + a] * dil[a] for a in range(r - 1)), st[r], st[r + 1])
        else:
            window_strides = tuple(st[1 + a] * dil[a] for a in range(r))
        return ((n, *outer, *window, tile * c),
                (st[0], *(st[1 + a] * strides[a] for a in range(len(outer))), *window_strides, st[-1]),
                (n, *outer, tile * c + gap))

    def step(x, wl, b, y, buffers):
        n, c = x.shape[:2]
        xp = padded(x, buffers)
        key = (xp.shape, xp.strides)
        view_shape, view_strides, acc_shape = shapes.get(key) or shapes.setdefault(key, geometry(xp))
        acc = _buffer(buffers, "acc", acc_shape, x.dtype)[..., :tile * c]
        np.einsum(subscripts, strided_view(xp, view_shape, view_strides), wl, out=acc)
        acc = acc.reshape(n, *out, c) if tile > 1 else acc
        if b is not None:
            acc += b[:, 0]
        _to_channels_first(y[:, :, 0], acc.transpose(back), rows)
    step.weights = weights
    step.arrangement = (phased, window, tile)
    return step, math.prod(need) + math.prod(out) + _CACHE_GAP * math.prod(outer)


def _column_phases_input(in_sizes, kernel, strides, dil, begin, out):
    """Like _channels_last_input, with the last axis (stride s) stored as s column phases: the block x
    (n, c, *in_sizes) goes to (n, *need[:-1], s, columns, c), phase p's column j holding padded
    column j*s + p (zeros where padding). -> (buffer shape per image and channel, padded)."""
    s, o, i, b = strides[-1], out[-1], in_sizes[-1], begin[-1]
    columns = o + (kernel[-1] - 1) * dil[-1] // s
    need = [read_extent(o_, s_, k, d) for o_, s_, k, d in zip(out[:-1], strides[:-1], kernel[:-1], dil[:-1])]
    dst, src = read_region(in_sizes[:-1], begin[:-1], need)
    regions = []         # per phase p: (destination, source): input column j*s + p - b
    for p in range(s):
        lo = max(0, -((p - b) // s))
        hi = min(columns, (i - 1 + b - p) // s + 1)
        if hi > lo and all(d.stop > d.start for d in dst):
            first = lo * s + p - b
            regions.append(((slice(None), *dst, p, slice(lo, hi)),
                            (*src, slice(first, first + (hi - lo - 1) * s + 1, s))))
    large = math.prod(in_sizes) >= _TRANSPOSE_MIN_PIXELS

    def padded(x, buffers):
        xp = _buffer(buffers, "xp", (x.shape[0], *need, s, columns, x.shape[1]), x.dtype, zeros=True)
        _copy_channels_last(xp, x, regions, large)
        return xp
    return [*need, s * columns], padded


def _to_channels_first(dst, src, rows):
    """dst[...] = src (channels-last data seen as (n, c, *out)), in blocks of `rows` along the first
    spatial axis (see _TRANSPOSE_BLOCK_PIXELS)."""
    size = dst.shape[2]
    if rows >= size:
        np.copyto(dst, src)
        return
    for r0 in range(0, size, rows):
        np.copyto(dst[:, :, r0:r0 + rows], src[:, :, r0:r0 + rows])


def _dw_channels_last(in_sizes, kernel, strides, dil, begin, out, mult, taps):
    """-> (step, buffer elements per image and channel) of the channels-last layout."""
    r = len(kernel)
    need, padded = _channels_last_input(in_sizes, kernel, strides, dil, begin, out)
    views = [(slice(None),) + tuple(slice(t * d, t * d + (o - 1) * s + 1, s)
                                    for t, d, o, s in zip(tap, dil, out, strides)) for tap in taps]
    back = (0, *range(3, 3 + r), 2, 1)       # Y block (n, c, mult, *out) seen as (n, *out, mult, c)

    # With one output channel per input channel and stride 1 along the last axis, a tap's window rows
    # are contiguous runs of out[-1]*C values: the weights tiled out[-1] times make each multiply one
    # inner loop per row instead of one per pixel (512x14x14: 20 -> 10 us per tap).
    tile = out[-1] if mult == 1 and strides[-1] == 1 else 1

    def step(x, wk, b, y, buffers):
        n, c = x.shape[:2]
        xp = padded(x, buffers)
        wt = _buffer(buffers, "w", (len(taps), tile, mult, c), x.dtype)
        np.copyto(wt[:, 0], wk.transpose(2, 1, 0))          # transposed once, then tiled contiguously
        np.copyto(wt[:, 1:], wt[:, :1])
        acc = _buffer(buffers, "acc", (n, *out, mult, c), x.dtype)
        tmp = _buffer(buffers, "tmp", (n, *out, mult, c), x.dtype) if len(taps) > 1 else None
        yt = y.transpose(back)
        for i, view in enumerate(views):
            xs = xp[view][..., None, :]
            if i == 0:
                np.multiply(xs, wt[0], out=acc if len(taps) > 1 else yt)
                if len(taps) > 1 and b is not None:
                    bt = _buffer(buffers, "b", (tile, mult, c), x.dtype)
                    np.copyto(bt, b.T)
                    acc += bt
            else:
                np.multiply(xs, wt[i], out=tmp)
                np.add(acc, tmp, out=acc if i < len(taps) - 1 else yt)
        if len(taps) == 1 and b is not None:
            y += b.reshape(c, mult, *(1,) * r)
    return step, math.prod(need) + 2 * mult * math.prod(out)
