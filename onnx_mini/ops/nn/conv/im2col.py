"""im2col: the windows of the padded input copied once into columns (C*k, out pixels), then one
matmul per group. Applies to every Conv.

The geometry (the padded buffer, where X goes in it, the window view's shape and strides) depends on
the input shape only: `Columns` computes it once per shape (run.py keeps it with the shape's plan), so
a small Conv's call is a zeroed buffer, one copy of X into it, one copy of the windows, the product
(measured under load, one call: the VAD's [1,128,3] -> [1,64,2] 41 -> 26 us, [1,64,1] -> [1,128,1]
27 -> 13 us; a [1,16,48,16] 3x3 Conv 527 -> 419 us, its 6-D transposing copy gone).

Two gathers for large images: a strided Conv takes its columns from the stride phases of the input
(`Phases`: each tap a plain slice, thresholds.PHASES_MIN_COLUMN_BYTES), and one group's columns too
large for the caches are gathered and multiplied in bands of output rows when the run splits its
products (`conv_bands`, thresholds.IM2COL_BANDS_MIN_BYTES).

One image of one group whose columns come from the window view (no phases, no bands): B is summed
by the product, W given B as one more column against a row of ones after the columns
(`Columns.biased`, thresholds.IM2COL_BIAS_ROW; no pass over the output for it).
One small image of many channels (`LastColumns`, thresholds.LAST_COLUMNS_*) has its columns gathered
channels-last instead, as (pixels, k*C): each window row is then one contiguous run of kw*C values of
the padded channels-last copy of X, where the NCHW window view copies runs of the output's width (8
values for a 24x8 output: the copy cost half the product); W's taps are ordered alike (made once for
a constant W), and BLAS reads the columns transposed, so Y comes out NCHW, contiguous. So does one
image of one channel strided along the last axis with long windows (an STFT front end: 512 taps every
160 samples), where the window view copies single values; unpadded, X is its own channels-last copy.

A 1-D Conv of one group with few output positions (`Rows`) takes its columns as rows of the
channels-last padded input instead: with W's taps ordered (M, k, C) (made once for a constant W),
each window of k*C values is a contiguous run of that input, so there is no column copy (only X's
into the padded buffer), and each output position is one matrix-vector product (OpenBLAS's sgemm
packs the whole W on every call, which a product with 1-3 columns cannot repay:
thresholds.ROWS_MAX_OUTPUTS). With one output position, the constant W and B (`conv_one`), that
product runs over the taps reading X alone, B as one more column against a 1: no padded copy, no pass
for B (the VAD's [1,64,2] -> [1,64,1] and [1,64,1] -> [1,128,1] layers, alternating per call, loaded:
12-16 -> 10 us and 13-22 -> 12-16 us)."""
from __future__ import annotations

import math

import numpy as np

from .... import blas, memory, parallel
from ..._common import UPCAST
from . import thresholds
from .grouped import grouped_matmul


class Columns:
    """The im2col geometry of one image (1, C, *spatial) of X's shape and type: the window view is made
    directly in the columns' order (group, Cg, *kernel, *out) over the C-contiguous padded image, so
    its reshape to (1, G, Cg*k, pixels) is the one copy. A strided Conv with large columns gathers
    from the input's stride phases instead (`Phases`), and one group's columns too large for the
    caches are made band by band in a run that splits its products (`band`: output rows a band). A
    narrow 2-D output at stride 1 has them copied by way of the kernel's column shifts (`strips`), in
    runs of Ho*Wo values rather than of the output's width."""
    __slots__ = ("padded", "inner", "pads", "view_shape", "view_strides", "cols_shape", "dtype", "phases", "band",
                 "bias_row", "strips")

    def __init__(self, x_shape, dtype, group, kernel, strides, dil, begin, end, out):
        c = x_shape[1]
        sizes = [s + b + e for s, b, e in zip(x_shape[2:], begin, end)]
        self.dtype = np.dtype(np.float32) if np.dtype(dtype) in UPCAST else np.dtype(dtype)
        self.padded = (1, c, *sizes)
        self.pads = any(begin) or any(end)
        self.inner = (slice(None), slice(None), *(slice(b, b + s) for b, s in zip(begin, x_shape[2:])))
        spatial = [math.prod(sizes[d + 1:]) for d in range(len(sizes))]    # element strides of the axes
        channel = math.prod(sizes)
        cg = c // group
        self.view_shape = (group, cg, *kernel, *out)
        item = self.dtype.itemsize
        self.view_strides = tuple(item * s for s in (cg * channel, channel, *(s * d for s, d in zip(spatial, dil)),
                                                     *(s * t for s, t in zip(spatial, strides))))
        self.cols_shape = (1, group, cg * math.prod(kernel), math.prod(out))
        column_bytes = c * math.prod(kernel) * math.prod(out) * item
        self.phases = (Phases(x_shape, self.dtype, kernel, strides, dil, begin, out)
                       if Phases.applies(kernel, strides, column_bytes) else None)
        # one group's columns too large for the caches: gathered and multiplied in bands of output rows
        self.band = (max(1, thresholds.IM2COL_BAND_BYTES * out[0] // column_bytes)
                     if group == 1 and self.phases is None and column_bytes >= thresholds.IM2COL_BANDS_MIN_BYTES
                     else None)
        # one group's columns from the window view: a row of ones may follow them for the bias (`biased`)
        self.bias_row = group == 1 and self.phases is None and thresholds.IM2COL_BIAS_ROW
        # a narrow 2-D output at stride 1: the columns by way of the kernel's column shifts (`_by_strips`)
        self.strips = None
        if (len(out) == 2 and all(s == 1 for s in strides) and kernel[0] > 1 and self.band is None
                and out[1] <= thresholds.IM2COL_STRIPS_MAX_WIDTH):
            hp = out[0] + (kernel[0] - 1) * dil[0]          # the padded rows the windows read
            self.strips = ((c, kernel[1], hp, out[1]), (channel * item, dil[1] * item, sizes[1] * item, item),
                           (c, kernel[0], kernel[1], out[0] * out[1]),
                           tuple(item * v for v in (kernel[1] * hp * out[1], dil[0] * out[1], hp * out[1], 1)))

    def _padded(self, x):
        """x (1, C, *spatial) in the compute type -> its zero-padded C-contiguous copy (X itself if unpadded)."""
        if self.pads:
            xp = memory.zeros(self.padded, dtype=self.dtype)
            xp[self.inner] = x
            return xp
        return x if x.flags.c_contiguous else np.ascontiguousarray(x)

    def windows(self, x):
        """x (1, C, *spatial) in the compute type -> the window view (G, Cg, *kernel, *out) of its padded copy."""
        return np.ndarray(self.view_shape, self.dtype, self._padded(x), 0, self.view_strides)

    def _by_strips(self, x, cols):
        """cols (C*k, pixels) <- the columns of a narrow output: the window view would copy them in runs
        of the output's width; instead each column shift dj of the padded image, cut to the output's
        width, is copied once (C, Hp, Wo), where window rows (c, di, dj) are runs of Ho*Wo values
        (thresholds.IM2COL_STRIPS_MAX_WIDTH). The same values in the same order."""
        shape, strides, cols_shape, cols_strides = self.strips
        s = memory.empty(shape, dtype=self.dtype)
        s[...] = np.ndarray(shape, self.dtype, self._padded(x), 0, strides)
        cols.reshape(cols_shape)[...] = np.ndarray(cols_shape, self.dtype, s, 0, cols_strides)

    def biased(self, x):
        """x (1, C, *spatial) in the compute type -> one group's columns (C*k + 1, pixels), a row of ones
        last (the window view's copy lands in the first C*k rows, one contiguous block)."""
        k, pixels = self.cols_shape[2:]
        cols = memory.empty((k + 1, pixels), dtype=self.dtype)
        if self.strips is not None:
            self._by_strips(x, cols[:-1])
        else:
            cols[:-1].reshape(self.view_shape)[...] = self.windows(x)
        cols[-1] = 1
        return cols

    def columns(self, x):
        """x (1, C, *spatial) in the compute type -> its columns (1, G, Cg*k, pixels)."""
        if self.phases is not None:
            return self.phases.columns(x).reshape(self.cols_shape)
        if self.strips is not None:
            cols = memory.empty(self.cols_shape, dtype=self.dtype)
            self._by_strips(x, cols.reshape(-1, self.cols_shape[-1]))
            return cols
        return self.windows(x).reshape(self.cols_shape)      # a copy (a view only when the windows are X itself)


class Phases:
    """Columns of a strided Conv from the stride phases of its padded input: along the last axis (and
    along any other strided axis whose taps skip some positions), phase a (0 <= a < stride) holds the
    padded positions a, a + stride, ...; the tap at offset t*dilation reads phase (t*dilation) % stride
    from (t*dilation) // stride on, a plain slice. The other axes keep every padded position, their
    taps read it at the stride: those copies still run along whole output rows, and filling half as many
    phases was faster (3x3 /2: 3x224x224 166 -> 149 us, 16x112x112 171 -> 156, 16x56x56 101 -> 89).
    The phases are filled from X directly (each X element copied once, the padding left zero, no padded
    copy; a phase no tap reads is left out), then each tap's slice is copied into its rows of the columns
    in runs of the output's last axis, where the window view reads every element with the stride's gap.
    Stride 2 along the last axis of 4-byte values (little-endian): X's pairs read as 8-byte integers and
    cast to 4 bytes keep the first of each pair, bit for bit, in one contiguous pass (numpy's gapped
    copy is half as fast: 26 -> 13 us for a 3x112x112 phase). The columns are the same values in the
    same order: the product is unchanged."""
    __slots__ = ("shape", "zeros", "fills", "taps", "cols", "dtype", "pairs")

    def __init__(self, x_shape, dtype, kernel, strides, dil, begin, out):
        c, sizes = x_shape[1], x_shape[2:]
        self.dtype = dtype
        self.pairs = dtype.itemsize == 4 and np.little_endian
        last = len(sizes) - 1
        # the phase count per axis: the stride along the last axis and where the taps skip positions
        # (e.g. 1x1 /2), else 1 (every position read: 3x3 /2)
        qs = [s if d == last or len({t * e % s for t in range(k)}) < s else 1
              for d, (k, s, e) in enumerate(zip(kernel, strides, dil))]
        # each phase as long as the furthest tap reads (the rest of the padded input is never read)
        lengths = [(k - 1) * e // q + (n - 1) * (s // q) + 1 for k, e, s, q, n in zip(kernel, dil, strides, qs, out)]
        self.shape = (*qs, c, *lengths)
        # the taps reading one phase: on each axis every u-th tap from the first, u = q / gcd(q, d), each
        # d / gcd(q, d) phase positions after the previous: one strided view of the phase for all of them
        steps = [math.prod(lengths[d + 1:]) for d in range(len(lengths))]   # the phases' element strides
        size = math.prod(lengths)                                           # ... and one channel's
        item = dtype.itemsize
        self.taps = []           # (those taps' rows of the columns, their view's offset, shape, strides)
        read = set()
        for phase in np.ndindex(*qs):
            firsts = [next((t for t in range(k) if t * e % q == a), None)
                      for a, k, e, q in zip(phase, kernel, dil, qs)]
            if None in firsts:
                continue
            read.add(phase)
            us = [q // math.gcd(q, e) for q, e in zip(qs, dil)]             # tap steps ...
            gaps = [e // math.gcd(q, e) for q, e in zip(qs, dil)]           # ... and phase positions between
            counts = [len(range(t0, k, u)) for t0, k, u in zip(firsts, kernel, us)]
            start = sum(t0 * e // q * st for t0, e, q, st in zip(firsts, dil, qs, steps))
            offset = (int(np.ravel_multi_index(phase, qs)) * c * size + start) * item
            self.taps.append(((slice(None), *(slice(t0, None, u) for t0, u in zip(firsts, us))), offset,
                              (c, *counts, *out),
                              tuple(item * v for v in (size, *(g * st for g, st in zip(gaps, steps)),
                                                        *(s // q * st for s, q, st in zip(strides, qs, steps))))))
        self.zeros = False
        self.fills = []          # (a phase's region receiving X, X's strided slices), phases read that X reaches
        for phase in sorted(read):
            dst, src = [], []
            for a, q, b, size_, length in zip(phase, qs, begin, sizes, lengths):
                i0 = max(0, -(-(b - a) // q))                      # its first position inside X ...
                i1 = max(i0, min(length, (size_ - 1 + b - a) // q + 1))   # ... and past its last
                self.zeros |= i0 > 0 or i1 < length                # padding lands in this phase
                dst.append(slice(i0, i1))
                src.append(slice(a + q * i0 - b, a + q * (i1 - 1) - b + 1, q))
            if all(d.stop > d.start for d in dst):
                self.fills.append(self._fill(phase + (slice(None), *dst[:-1]), (0, slice(None), *src[:-1]),
                                             dst[-1], src[-1], sizes[-1]))
            else:
                self.zeros = True                                  # a phase read but all padding
        self.cols = (c, *kernel, *out)

    def _fill(self, dst, src, last_dst, last_src, width):
        """One phase's fill: (destination, source) index tuples, and their pair_split (or None)."""
        whole = (dst + (last_dst,), src + (last_src,))
        return whole, (pair_split(*whole, width) if self.pairs else None)

    @staticmethod
    def applies(kernel, strides, column_bytes) -> bool:
        """Whether the columns come from the phases: strided, large enough, and (unless
        thresholds.PHASES_SINGLE_TAP) more than one tap along a strided axis (else the window view
        is one gapped copy of the values the columns hold, no value read twice)."""
        return (any(s > 1 for s in strides) and column_bytes >= thresholds.PHASES_MIN_COLUMN_BYTES
                and (thresholds.PHASES_SINGLE_TAP or any(k > 1 and s > 1 for k, s in zip(kernel, strides))))

    def columns(self, x):
        """x (1, C, *spatial) in the compute type -> the columns as (C, *kernel, *out)."""
        phases = (memory.zeros if self.zeros else memory.empty)(self.shape, dtype=self.dtype)
        by_pairs = self.pairs and x.strides[-1] == x.itemsize     # (a contiguous last axis to pair up)
        for (dst, src), split in self.fills:
            copy_strided(phases, x, dst, src, split if by_pairs else None)
        cols = memory.empty(self.cols, dtype=self.dtype)
        for dst, offset, shape, strides in self.taps:
            cols[dst] = np.ndarray(shape, self.dtype, phases, offset, strides)
        return cols



def pair_split(dst: tuple, src: tuple, width: int):
    """A copy target[dst] = x[src] whose last axis reads X with stride 2, split for 4-byte values: X's
    pairs read as 8-byte integers and cast down to 4 bytes keep the first of each pair bit for bit
    (little-endian), one contiguous pass where numpy's gapped copy is ~2x slower (26 -> 13 us per
    3x112x112 phase). -> ((pairs' dst, src), the single last value's (dst, src) or None when its pair
    would end past X's row of `width`), or None when the last axis is not read with stride 2."""
    last_dst, last_src = dst[-1], src[-1]
    if last_src.step != 2:
        return None
    start, n = last_src.start, last_dst.stop - last_dst.start
    k = min(n, (width - start) // 2)                  # pairs lying wholly inside the row
    if k <= 0:
        return None
    pairs = (dst[:-1] + (slice(last_dst.start, last_dst.start + k),), src[:-1] + (slice(start, start + 2 * k),))
    rest = None if k == n else (dst[:-1] + (slice(last_dst.start + k, last_dst.stop),),
                                src[:-1] + (slice(start + 2 * k, last_src.stop, 2),))
    return pairs, rest


def copy_strided(target: np.ndarray, x: np.ndarray, dst: tuple, src: tuple, split) -> None:
    """target[dst] = x[src], by pair_split's `split` when given (the caller checks that x holds 4-byte
    values with a contiguous last axis on a little-endian machine)."""
    if split is None:
        target[dst] = x[src]
        return
    (pair_dst, pair_src), rest = split
    np.copyto(target[pair_dst].view(np.uint32), x[pair_src].view(np.uint64), casting="unsafe")
    if rest is not None:
        target[rest[0]] = x[rest[1]]


def conv_biased(x, wb, columns: Columns, out):
    """One image x (1, C, *spatial) of one group, wb (M, C*k + 1): W with B as its last column
    (pointwise.bias_column) -> (1, M, *out), the bias summed by the product against a row of ones after
    the columns (no pass over the output for it; Columns without phases or bands)."""
    return _product(wb, columns.biased(x)).reshape(1, wb.shape[0], *out)


def conv(x, w, group, columns: Columns, out):
    """One image x (1, C, *spatial) convolved with W (M, Cg, *kernel) -> (1, M, *out)."""
    m = w.shape[0]
    if columns.band is not None and blas.splitting():
        return conv_bands(x, w.reshape(m, -1), columns, out)
    if group == 1:     # the one product grouped_matmul would make, without its bookkeeping
        return _product(w.reshape(m, -1), columns.columns(x)[0, 0]).reshape(1, m, *out)
    return grouped_matmul(w.reshape(group, m // group, -1), columns.columns(x)).reshape(1, m, *out)


def _product(w2, cols):
    """w2 @ cols, into a recycled buffer (memory.py) when their types agree."""
    if w2.dtype != cols.dtype:
        return blas.matmul(w2, cols)
    return blas.matmul(w2, cols, out=memory.empty((w2.shape[0], cols.shape[1]), cols.dtype))


def conv_bands(x, w2, columns: Columns, out):
    """One group's conv with columns too large for the caches (Columns.band) while the run splits its
    products (blas.splitting: a busy machine, OpenBLAS on one thread): each band of output rows gets
    its columns gathered and multiplied while they are in the caches, the bands shared among the
    pool's threads, gathers included (16x128x128 3x3 -> 16, 9.4 MB of columns: 3.5 -> 2.7 ms). With
    OpenBLAS's own threads ("native" mode) the whole product stays faster (2.05 vs 2.19 ms; 32x64x64
    -> 32 1.18 vs 1.74). Each band is its own product: an output's sum may round differently than in
    the whole product (float results within the tests' tolerances, integer sums exact); the band
    sizes never depend on the threads."""
    m, k = w2.shape
    view = columns.windows(x)[0]                  # (C, *kernel, *out)
    inner = math.prod(out[1:])
    rows = columns.band
    lead = (slice(None),) * (view.ndim - len(out))     # the channel and kernel axes, whole
    y = memory.empty((m, math.prod(out)), dtype=columns.dtype)

    def work(b0, b1):
        buf = memory.empty((k, rows * inner), dtype=columns.dtype)
        for r0 in range(b0 * rows, min(out[0], b1 * rows), rows):
            r1 = min(out[0], r0 + rows)
            block = buf if r1 - r0 == rows else memory.empty((k, (r1 - r0) * inner), dtype=columns.dtype)
            block.reshape(view.shape[:-len(out)] + (r1 - r0, *out[1:]))[...] = view[lead + (slice(r0, r1),)]
            np.matmul(w2, block, out=y[:, r0 * inner:r1 * inner])
    parallel.split(work, -(-out[0] // rows), 1)
    return y.reshape(1, m, *out)


class Rows:
    """The geometry of a 1-D Conv's one image computed by rows (module doc): the channels-last padded
    input (L + pads, C), where X goes in it, and each output position's window as a run of it."""
    __slots__ = ("padded", "inner", "pads", "step", "width", "n", "dtype", "read")

    def __init__(self, x_shape, dtype, kernel, strides, begin, end, out):
        c, length = x_shape[1], x_shape[2]
        self.dtype = np.dtype(np.float32) if np.dtype(dtype) in UPCAST else np.dtype(dtype)
        self.padded = (length + begin[0] + end[0], c)
        self.inner = slice(begin[0], begin[0] + length)
        self.pads = bool(begin[0] or end[0])
        self.step, self.width, self.n = strides[0] * c, kernel[0] * c, out[0]
        # one output position: its taps t0..t1-1 read X's positions t0-begin..t1-begin-1, the others padding
        t0 = min(kernel[0], begin[0])
        self.read = (t0, max(t0, min(kernel[0], begin[0] + length)), begin[0]) if out[0] == 1 else None

    @staticmethod
    def applies(x_shape, group, kernel, dilations, out) -> bool:
        return (len(x_shape) == 3 and x_shape[0] == 1 and group == 1 and dilations[0] == 1
                and 0 < out[0] <= thresholds.ROWS_MAX_OUTPUTS and kernel[0] > 0)


def rows_weights(w):
    """W (M, C, k) -> (M, k*C): the taps in the order of a channels-last window."""
    return np.ascontiguousarray(w.transpose(0, 2, 1)).reshape(w.shape[0], -1)


def one_weights(w, b, read):
    """W (M, C, k) and B (M,) or None -> (M, (t1-t0)*C [+ 1]): the taps t0..t1-1 that read X at
    Rows.read's one output position, channels-last, B as the last column."""
    t0, t1 = read[:2]
    wr = w[:, :, t0:t1].transpose(0, 2, 1).reshape(w.shape[0], -1)
    return np.ascontiguousarray(wr if b is None else np.concatenate([wr, b.reshape(-1, 1).astype(wr.dtype)], axis=1))


def conv_one(x, w1, rows: Rows):
    """One image x (1, C, L) in the compute type with one output position, w1 = one_weights(W, B,
    rows.read) -> (1, M, 1): one matrix-vector product over the taps that read X, B summed by it
    against a 1 after them (no padded copy, no pass for B; the caller checked the taps left out are
    finite: 0 * W there adds nothing)."""
    t0, t1, begin = rows.read
    n = (t1 - t0) * x.shape[1]
    v = np.empty(w1.shape[1], dtype=rows.dtype)
    v[:n].reshape(t1 - t0, x.shape[1])[...] = x[0, :, t0 - begin:t1 - begin].T
    if w1.shape[1] > n:
        v[n] = 1
    return np.dot(w1, v).reshape(1, -1, 1)


def conv_rows(x, wr, rows: Rows, b=None):
    """One image x (1, C, L) in the compute type, wr = rows_weights(W), B or None -> (1, M, out), a
    transposed view of the (out, M) products (channels-last: the next Conv by rows copies no transpose).
    The padding is multiplied as written (skipping its taps slices W: slower matrix-vector calls,
    measured 16 -> 22 us on the VAD's 129 -> 128 channel layer, and inf * 0 must stay NaN)."""
    if rows.pads:
        xp = np.zeros(rows.padded, dtype=rows.dtype)      # (a few output positions: always small)
        xp[rows.inner] = x[0].T
    else:
        xp = np.ascontiguousarray(x[0].T)       # a view when X is such a transposed output
    flat = xp.reshape(-1)
    step, width = rows.step, rows.width
    y = np.empty((rows.n, wr.shape[0]), dtype=rows.dtype)
    for j in range(rows.n):     # one BLAS matrix-vector call per output position (at most a few)
        np.dot(wr, flat[j * step:j * step + width], out=y[j])
    if b is not None:
        y += b
    return y.T[None]


class LastColumns:
    """The geometry of one image's columns gathered channels-last (module doc): the zero-padded
    channels-last copy of X (*padded, C), and its window view (*out, *kernel[:-1], kw*C), each window
    row one contiguous run of kw*C values (dilation 1 along the last axis), copied into the columns
    (pixels, k*C [+ 1 for the bias's ones])."""
    __slots__ = ("padded", "inner", "view_shape", "view_strides", "k", "pixels", "dtype", "as_is", "to_last")

    def __init__(self, x_shape, dtype, kernel, strides, dil, begin, end, out):
        c = x_shape[1]
        sizes = [s + b + e for s, b, e in zip(x_shape[2:], begin, end)]
        self.dtype = np.dtype(np.float32) if np.dtype(dtype) in UPCAST else np.dtype(dtype)
        self.padded = (*sizes, c)
        # no padding: X's channels-last view is the copy (no copy at all where X's memory is channels-last:
        # one channel, an STFT front end's samples; a transposed NHWC tensor)
        self.as_is = not any(begin) and not any(end)
        self.inner = (*(slice(b, b + s) for b, s in zip(begin, x_shape[2:])), slice(None))
        steps = [c * math.prod(sizes[d + 1:]) for d in range(len(sizes))]   # element strides of the axes
        item = self.dtype.itemsize
        self.view_shape = (*out, *kernel[:-1], kernel[-1] * c)
        self.view_strides = tuple(item * v for v in (*(st * s for st, s in zip(steps, strides)),
                                                      *(st * d for st, d in zip(steps[:-1], dil[:-1])), 1))
        self.k = c * math.prod(kernel)
        self.pixels = math.prod(out)
        # an image (C, *spatial) -> (*spatial, C): a transpose by these axes (np.moveaxis costs ~6 us a call)
        self.to_last = (*range(1, len(sizes) + 1), 0)

    @staticmethod
    def applies_channels_last(x_shape, group, kernel, dil) -> bool:
        """Whether an X whose memory is channels-last (a transposed NHWC tensor: channels_last_memory)
        takes these columns, image by image: its window rows are then runs of kw*C values read straight
        from X, where the NCHW columns would first copy each image to NCHW (thresholds.LAST_MEMORY_*)."""
        return (group == 1 and len(x_shape) >= 3 and dil[-1] == 1
                and kernel[-1] * x_shape[1] >= thresholds.LAST_MEMORY_MIN_RUN)

    @staticmethod
    def applies(x_shape, group, kernel, strides, dil, out) -> bool:
        """One image, one group, more than one tap along the last axis at dilation 1 (a window row of
        one tap is one strided copy in the window view too), and either enough channels for the window
        rows' runs and few enough output pixels, or one channel strided along the last axis (where the
        window view copies single values) with enough taps along it (thresholds.LAST_COLUMNS_*)."""
        return (x_shape[0] == 1 and group == 1 and len(x_shape) >= 3 and kernel[-1] > 1 and dil[-1] == 1
                and ((x_shape[1] >= thresholds.LAST_COLUMNS_MIN_CHANNELS
                      and math.prod(out) <= thresholds.LAST_COLUMNS_MAX_PIXELS)
                     or (x_shape[1] == 1 and strides[-1] > 1
                         and kernel[-1] >= thresholds.LAST_COLUMNS_ONE_CHANNEL_MIN_TAPS)))


def channels_last_memory(x) -> bool:
    """Whether x (N, C, *spatial), C > 1, has its channels innermost in memory (an NHWC tensor seen
    through a Transpose to NCHW, as TensorFlow and JAX exports feed their convolutions), and is not
    also C-contiguous (one pixel: the NCHW paths then read it as it is)."""
    return (x.ndim >= 3 and x.strides[1] == x.itemsize and x.shape[1] > 1 and not x.flags.c_contiguous
            and x.transpose(0, *range(2, x.ndim), 1).flags.c_contiguous)


def last_weights(w):
    """W (M, C, *kernel) -> (M, k*C): the taps in a channels-last window's order."""
    return np.moveaxis(w, 1, -1).reshape(w.shape[0], -1)


def conv_last(x, wl, last: LastColumns, out, into=None):
    """One image x (1, C, *spatial) in the compute type, wl = last_weights(W) (M, k*C) or with B as one
    more column (pointwise.bias_column) -> (1, M, *out), contiguous (written into `into` when given):
    Wl @ columns^T, the bias summed by the product against a column of ones when wl holds it (BLAS reads
    the columns transposed, no copy)."""
    if last.as_is:
        xp = np.ascontiguousarray(x[0].transpose(last.to_last)).reshape(last.padded)
    else:
        xp = memory.zeros(last.padded, dtype=last.dtype)
        xp[last.inner] = x[0].transpose(last.to_last)
    cols = memory.empty((last.pixels, wl.shape[1]), dtype=last.dtype)
    view = np.ndarray(last.view_shape, last.dtype, xp, 0, last.view_strides)
    if wl.shape[1] == last.k:
        cols.reshape(last.view_shape)[...] = view
    else:
        cols[:, :last.k].reshape(last.view_shape)[...] = view
        cols[:, last.k] = 1
    if into is not None:
        blas.matmul(wl, cols.T, out=into.reshape(wl.shape[0], -1))
        return into
    return blas.matmul(wl, cols.T).reshape(1, wl.shape[0], *out)
