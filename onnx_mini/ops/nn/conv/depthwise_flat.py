"""Depthwise layout "flat" (large images): each input plane (each stride phase of it) padded and
flattened once, so that every tap reads one contiguous run at its own offset and Y accumulates in place.
A stride-2 phase of 4-byte values is copied by pairs (im2col.pair_split: MobileNet's 16x112x112 /2 layer 0.90-0.93
of the time, measured under load; multiplying straight from X's strided view instead lost, 57 vs
23 + 13 us a phase and tap, and so did one de-interleaving copy of all four phases, 110 vs 92 us)."""
from __future__ import annotations

import math

import numpy as np

from .im2col import copy_strided, pair_split
from .scratch import buffer


def layout(in_sizes, kernel, strides, dil, begin, out, mult, taps):
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
            whole = (slice(None), slice(None))     # batch and channels
            copies.append((k, whole + tuple(dst), whole + tuple(src),
                           pair_split(whole + tuple(dst), whole + tuple(src), in_sizes[-1])))
    crop = tuple(slice(0, o) for o in out[1:])
    cropped = shape[1:] != list(out[1:])

    def step(x, wk, b, y, buffers):
        n, c = x.shape[:2]
        flat = buffer(buffers, "flat", (n, c, len(phases), length), x.dtype, zeros=True)
        by_pairs = x.itemsize == 4 and np.little_endian and x.strides[-1] == 4
        for k, dst, src, split in copies:
            image = flat[:, :, k, guard:guard + size].reshape(n, c, *shape)
            copy_strided(image, x, dst, src, split if by_pairs else None)

        def rows(a):    # (n, c, mult, run) -> (n, c, mult, out[0], *shape[1:])
            return a.reshape(n, c, mult, out[0], *shape[1:])

        direct = not cropped and y.flags.c_contiguous     # Y accumulates itself
        acc = y.reshape(n, c, mult, run) if direct else buffer(buffers, "acc", (n, c, mult, run), x.dtype)
        tmp = buffer(buffers, "tmp", (n, c, mult, run), x.dtype) if len(taps) > 1 else None
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
