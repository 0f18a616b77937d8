"""Depthwise layouts on channels-last data (small images): the input transposed once to
(N, *spatial, C), so that the per-tap weights lie along the contiguous axis.
- "channels-last" (layout): a multiply-add per tap; the last tap's add writes Y transposed back;
- "einsum" (einsum_layout, one output channel per input channel): one einsum over the windows.
"""
from __future__ import annotations

import math

import numpy as np

from .... import memory
from .._common import finite, read_extent, read_region, strided_view
from . import thresholds
from .scratch import buffer


def channels_last_input(in_sizes, kernel, strides, dil, begin, out):
    """-> (need, padded(x, buffers)): the padded input positions the windows read along each axis, and
    a function giving the block x (n, c, *in_sizes) padded and transposed to (n, *need, c), in a
    buffer kept across blocks (its padding stays zero)."""
    need = [read_extent(o, s, k, d) for o, s, k, d in zip(out, strides, kernel, dil)]
    dst, src = read_region(in_sizes, begin, need)
    regions = [] if any(d.stop <= d.start for d in dst) else [((slice(None), *dst), tuple(src))]
    large = math.prod(in_sizes) >= thresholds.TRANSPOSE_MIN_PIXELS

    def padded(x, buffers):
        xp = buffer(buffers, "xp", (x.shape[0], *need, x.shape[1]), x.dtype, zeros=True)
        copy_channels_last(xp, x, regions, large)
        return xp
    return need, padded


def copy_channels_last(xp, x, regions, large):
    """xp[dst + (channels,)] = x[(:, channels) + src] moved to channels-last, for each (dst, src) region;
    large planes thresholds.TRANSPOSE_CHANNELS channels at a time (see there)."""
    c = x.shape[1]
    to_last = (0, *range(2, x.ndim), 1)
    step = thresholds.TRANSPOSE_CHANNELS if large else c
    for dst, src in regions:
        for c0 in range(0, c, step):
            channels = slice(c0, c0 + step)
            np.copyto(xp[(*dst, channels)], x[(slice(None), channels, *src)].transpose(to_last))


def einsum_layout(in_sizes, kernel, strides, dil, begin, out, mult, taps):
    """-> (step, buffer elements per image and channel) of the window-sum layout (one output channel
    per input channel): the channels-last padded input seen as windows (n, *out, *kernel, C), summed
    against the weights (*kernel, C) by one einsum; Y is written back from the channels-last result.

    With stride 1 along the last axis a window row is one contiguous run of out[-1]*C values, so the
    last output axis and C merge into einsum's inner loop, against the weights tiled out[-1] times
    (3x3, batch 1, bias included, interleaved: 136x28x28 0.43 -> 0.33 ms, 272x14x14 0.176 -> 0.161).
    A large image with a stride s along the last axis gets the same long inner loop from its column
    phases (column_phases_input: phase p holding the padded columns j*s + p): a tap t*d = q*s + p
    reads phase p from column q on, so the window sum runs over (p, q) slots, those without a tap
    weighted 0 (3x3 stride 2: 12 slots for 9 taps; 112x56x56 /2 451 -> 379 us, 128x56x56 /2 509 ->
    465; small ones lose: 272x14x14 /2 63 -> 71, 512x14x14 /2 103 -> 159). A slot without a tap
    still reads an input value, and 0 * inf is NaN: when the sums are not all finite (some slot read
    an infinity or a NaN; checking costs a pass over the output, a quarter of X at stride 2), they
    are made again from the taps' slots alone, a multiply-add each.
    The channels-last result keeps a gap after each row (merged) or pixel (C of them otherwise) when
    C values span a multiple of 512 bytes: reading it back with such a power-of-two stride thrashes
    the cache sets (512x14x14: the copy back 227 -> 53 us; 1024x7x7 132 -> 16)."""
    r = len(kernel)
    phased = strides[-1] > 1 and math.prod(out) >= thresholds.TRANSPOSE_MIN_PIXELS
    if phased:
        need, padded = column_phases_input(in_sizes, kernel, strides, dil, begin, out)
        slots = (strides[-1], (kernel[-1] - 1) * dil[-1] // strides[-1] + 1)     # (p, q) along the last axis
        window = (*kernel[:-1], *slots)
        last = [divmod(t * dil[-1], strides[-1])[::-1] for t in range(kernel[-1])]     # the taps' (p, q)
        slot_taps = [(*k, *pq) for k in np.ndindex(*kernel[:-1]) for pq in last]
    else:
        need, padded = channels_last_input(in_sizes, kernel, strides, dil, begin, out)
        window = tuple(kernel)
    letters = "abcdefghijklmnopqrstuvwxyz"
    tile = out[-1] if strides[-1] == 1 or phased else 1
    outer = out[:-1] if tile > 1 else out
    o_ax, k_ax = letters[:len(outer)], letters[r:r + len(window)]
    subscripts = f"N{o_ax}{k_ax}C,{k_ax}C->N{o_ax}C"
    back = (0, r + 1, *range(1, r + 1))
    inner = math.prod(out[1:])
    large = math.prod(out) >= thresholds.TRANSPOSE_MIN_PIXELS
    rows = max(1, thresholds.TRANSPOSE_BLOCK_PIXELS // inner) if large else out[0]

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
        gap = thresholds.CACHE_GAP if c * xp.itemsize % thresholds.CACHE_SET_BYTES == 0 else 0
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
        acc = buffer(buffers, "acc", acc_shape, x.dtype)[..., :tile * c]
        windows = strided_view(xp, view_shape, view_strides)
        np.einsum(subscripts, windows, wl, out=acc)
        # a slot without a tap may have read inf or NaN: then the taps alone (the sums checked by their
        # column sums, vector adds of the rows: 128x28x28 55 -> 13 us against summing the gapped rows whole)
        if phased and not finite(np.add.reduce(acc.reshape(-1, acc.shape[-1]), axis=0)):
            sum_taps(windows, wl, slot_taps, acc)
        acc = acc.reshape(n, *out, c) if tile > 1 else acc
        if b is not None:
            acc += b[:, 0]
        to_channels_first(y[:, :, 0], acc.transpose(back), rows)
    step.weights = weights
    step.arrangement = (phased, window, tile)
    return step, math.prod(need) + math.prod(out) + thresholds.CACHE_GAP * math.prod(outer)


def sum_taps(windows, wl, taps, acc):
    """acc = the sum over `taps` (window indices) of windows[..., tap, :] * wl[tap] (one product each)."""
    lead = (slice(None),) * (windows.ndim - wl.ndim)
    tmp = memory.empty_like(acc)
    for i, tap in enumerate(taps):
        np.multiply(windows[lead + tap], wl[tap], out=acc if i == 0 else tmp)
        if i:
            acc += tmp


def column_phases_input(in_sizes, kernel, strides, dil, begin, out):
    """Like channels_last_input, with the last axis (stride s) stored as s column phases: the block x
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
    large = math.prod(in_sizes) >= thresholds.TRANSPOSE_MIN_PIXELS

    def padded(x, buffers):
        xp = buffer(buffers, "xp", (x.shape[0], *need, s, columns, x.shape[1]), x.dtype, zeros=True)
        copy_channels_last(xp, x, regions, large)
        return xp
    return [*need, s * columns], padded


def to_channels_first(dst, src, rows):
    """dst[...] = src (channels-last data seen as (n, c, *out)), in blocks of `rows` along the first
    spatial axis (see thresholds.TRANSPOSE_BLOCK_PIXELS)."""
    size = dst.shape[2]
    if rows >= size:
        np.copyto(dst, src)
        return
    for r0 in range(0, size, rows):
        np.copyto(dst[:, :, r0:r0 + rows], src[:, :, r0:r0 + rows])


def layout(in_sizes, kernel, strides, dil, begin, out, mult, taps):
    """-> (step, buffer elements per image and channel) of the channels-last layout."""
    r = len(kernel)
    need, padded = channels_last_input(in_sizes, kernel, strides, dil, begin, out)
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
        wt = buffer(buffers, "w", (len(taps), tile, mult, c), x.dtype)
        np.copyto(wt[:, 0], wk.transpose(2, 1, 0))          # transposed once, then tiled contiguously
        np.copyto(wt[:, 1:], wt[:, :1])
        acc = buffer(buffers, "acc", (n, *out, mult, c), x.dtype)
        tmp = buffer(buffers, "tmp", (n, *out, mult, c), x.dtype) if len(taps) > 1 else None
        yt = y.transpose(back)
        for i, view in enumerate(views):
            xs = xp[view][..., None, :]
            if i == 0:
                np.multiply(xs, wt[0], out=acc if len(taps) > 1 else yt)
                if len(taps) > 1 and b is not None:
                    bt = buffer(buffers, "b", (tile, mult, c), x.dtype)
                    np.copyto(bt, b.T)
                    acc += bt
            else:
                np.multiply(xs, wt[i], out=tmp)
                np.add(acc, tmp, out=acc if i < len(taps) - 1 else yt)
        if len(taps) == 1 and b is not None:
            y += b.reshape(c, mult, *(1,) * r)
    return step, math.prod(need) + 2 * mult * math.prod(out)
