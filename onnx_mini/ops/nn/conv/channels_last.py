"""Convolution on channels-last data: X (N, H, W, C) in, Y (N, Ho, Wo, M) out, W and B as the ONNX
Conv has them (optimize/channels_last.py runs whole regions of a depthwise-separable network so, with
no transposes between its layers; the kernel is ops/fused.py's ConvNHWC).

The sums are the Conv's (the spec's: spec.py); only their order changes. Per input shape one plan:
- pointwise (1x1, stride 1, no padding, group 1): Y = X[N*H*W, C] @ W^T[C, M], no copy at all;
- grouped (1x1, stride 1, no padding, G groups, not depthwise): one stacked product of X's group column
  blocks (views) by each group's W^T into Y's; a fused channel shuffle writes Y's columns in shuffle
  order (every G-th column), or with few input channels one dense product of the block-diagonal W
  whose columns are shuffled (_grouped);
- depthwise (group = C = M): a zero-padded channels-last copy (a large one written by the parts that
  read it, no zero pass: _read_rows; a small one-part call's kept per thread, its border zeroed once:
  _depthwise_small) and one einsum over its windows against
  the taps [kh, kw, C]; at stride 1 along the width a window row is one contiguous run of Wo*C values,
  summed against the taps tiled Wo times (one long inner loop per row, as depthwise_channels_last.py);
  strided along the width, narrow outputs sum the 6-d windows directly, wide ones read the padded
  input stored as column phases (_depthwise_phased);
- group 1 at stride 1 with kw*C channels enough against M (select's strips rule, the NCHW strips.py
  made channels-last): each padded row's window rows of kw*C values (contiguous in the padded copy)
  copied once as strips S (N, Hp*Wo, kw*C), one product Z = S @ Ws with W's kernel rows side by side
  (kw*C, kh*M), and Y's rows i the sum over di of Z's rows i + di, block di; B added with the epilogue.
  A third of im2col's copy and columns (PP-OCR det's 96 -> 24 3x3 layers on 120x120: 50 MB of columns;
  alone 14.3 -> 8.0 ms); S by one strided copy of the padded input rather than a copy per tap column
  into rows with a column of ones (the fill 2.7-4.0 -> 1.5-1.8 ms there, the product the same);
- the rest of group 1 (the stem 3x3/2, strided or padded 1x1): im2col on the channels-last input (the
  window view copied to [N*Ho*Wo, kh*kw*C]) and one product with W as [kh*kw*C, M].
Anything else (another type, group or rank, shapes that do not fit) runs the NCHW Convolution on the
transposed input, which also raises the Conv's errors.
An epilogue (the fused residual and activation) runs on the depthwise parts' rows right after their
einsum, on each part's thread; the other paths finish Y whole (a pointwise product by row blocks finished
in cache measured slower: see __call__).
"""
from __future__ import annotations

import threading

import numpy as np

from .... import blas, memory, parallel
from ..._common import by_shape, prepack
from .._common import finite, geometry, read_extent, read_region, strided_view
from . import strips, thresholds
from .pointwise import shuffled
from .run import Convolution

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))

# group 1 with a kernel larger than 1x1: channels-last im2col from this many input channels; below, the
# window rows are runs of kw*C values too short to copy fast (the stem 3x224x224 -> 16/32 3x3 /2: NCHW Conv
# + its output transposed 1.04-1.12 ms against 1.39-1.70 for the input transposed + this im2col, under load)
IM2COL_MIN_CHANNELS = 16
# strided depthwise: one einsum over the 6-d windows (inner loop C) up to this output width, the
# column phases above (3x3 /2, under load: 48x14x14 25 against 38 us, 512x14x14 99/156, 128x28x28
# 131/137, 24x28x28 75/77 (outputs 14 wide); 64x56x56 353/191, 16x56x56 315/115 (28 wide))
DW_WINDOWS_MAX_WIDTH = 14


def im2col_weights(w: np.ndarray) -> np.ndarray:
    """W (M, C, kh, kw) -> (kh*kw*C, M): the rows in a channels-last window's order."""
    m = w.shape[0]
    return np.ascontiguousarray(w.transpose(2, 3, 1, 0).reshape(-1, m))


def depthwise_taps(w: np.ndarray) -> np.ndarray:
    """W (C, 1, kh, kw) -> (kh, kw, C)."""
    return np.ascontiguousarray(w[:, 0].transpose(1, 2, 0))


def grouped_weights(w: np.ndarray, group: int, shuffle: int = 0) -> np.ndarray:
    """W (M, C/G, 1, 1) of a grouped 1x1 Conv -> (G, C/G, M/G): each group's W^T (ConvNHWC._grouped); with
    shuffle and few input channels (thresholds.SHUFFLED_DENSE_MAX_CHANNELS), the dense (C, M) product
    matrix instead: each group's W^T on the diagonal, zeros elsewhere, its columns in shuffle order."""
    m, cg = w.shape[:2]
    mg = m // group
    per_group = w.reshape(group, mg, cg).transpose(0, 2, 1)
    if not shuffle or cg * group > thresholds.SHUFFLED_DENSE_MAX_CHANNELS:
        return np.ascontiguousarray(per_group)
    dense = np.zeros((group, cg, group, mg), w.dtype)
    g = np.arange(group)
    dense[g, :, g, :] = per_group
    return shuffled(dense.reshape(group * cg, m), shuffle)


def grouped_pointwise(shape, group: int) -> bool:
    """Whether a W of this shape (M, C/G, kh, kw) with `group` groups is a grouped 1x1 Conv's, not a
    depthwise one's."""
    m, cg, *kernel = shape
    return group > 1 and tuple(kernel) == (1, 1) and m % group == 0 and not (cg == 1 and m == group)


def worthwhile(w: np.ndarray, group: int, strides) -> bool:
    """Whether a Conv with this constant W (group, strides) runs faster channels-last than NCHW (the pass
    asks). A strided depthwise Conv of few channels stays NCHW, where its im2col is the fastest
    (thresholds.DW_IM2COL_MAX_CHANNELS; mobilenet_qdq's 3x3 /2 layers, profiled under load, NHWC against
    NCHW: 16x112x112 398 / 338 us, 16x56x56 155 / 107). A grouped 1x1 Conv at stride 1 joins
    (ConvNHWC._grouped: as fast as NCHW's stacked product, or faster)."""
    if grouped_pointwise(w.shape, group):
        return all(int(s) == 1 for s in strides or ())
    if group != 1:
        return w.shape[0] > thresholds.DW_IM2COL_MAX_CHANNELS or all(int(s) == 1 for s in strides or ())
    return w.shape[2:] == (1, 1) or w.shape[1] >= IM2COL_MIN_CHANNELS


def _layout_weights(group: int, shuffle: int):
    """The function laying out a W for this Conv's channels-last paths (by W's shape: the depthwise taps, a
    grouped 1x1 Conv's per-group W^T, else im2col's)."""
    def layout(w: np.ndarray) -> np.ndarray:
        if group == 1:
            return im2col_weights(w)
        if grouped_pointwise(w.shape, group):
            return grouped_weights(w, group, shuffle)
        return depthwise_taps(w)
    return layout


class ConvNHWC:
    """conv(x, w, b=None) -> Y channels-last, for a Conv with these attributes; constants: {1: W, 2: B}.
    exact: X, W and B hold integers whose float32 sums must stay exact (QLinearConvNHWC): the algorithms
    here are (a product, sums in any order), the NCHW fallback is told to leave Winograd out."""

    def __init__(self, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None,
                 constants=None, exact=False, algorithm=None, shuffle=0):
        constants = constants or {}
        # shuffle = G: Y's channels in channel-shuffle order (a grouped 1x1 Conv's product writes them so;
        # any other plan is None: the caller runs the shuffle as written)
        self.shuffle = shuffle
        self.nchw = Convolution(auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape,
                                pads=pads, strides=strides, constants=constants, exact=exact, algorithm=algorithm)
        # prepare(model, conv_algorithm=...) forces an NCHW algorithm for every Conv: honoured on X transposed
        self.forced = algorithm is not None
        # X's shape -> the path taken, for the profiler (the NCHW Convolution's own when forced)
        self.algorithms = self.nchw.algorithms if self.forced else {}
        self.auto_pad, self.dilations, self.group = auto_pad, dilations, group
        self.kernel_shape, self.pads, self.strides = kernel_shape, pads, strides
        # a constant W's one layout, made once (1x1: im2col's [C, M] is W^T, the pointwise product's)
        self.weights = prepack(_layout_weights(group, shuffle), constants, (1,))
        self.tiled = {}         # Wo -> the constant taps tiled along a window row
        self.w_const = constants.get(1)
        self.b_const = constants.get(2)
        self.rows = {}          # Wo -> the constant B tiled along an output row
        self.strip_weights = prepack(strip_weights, constants, (1,))
        # a constant W without infinities or NaN: its taps over padding alone may be skipped (0 * W adds 0)
        self.taps_finite = self.w_const is not None and group != 1 and finite(self.w_const)
        # per thread: plan key -> (zero-padded input buffer, where X goes in it, its windows): a small
        # single-part depthwise call copies X's interior only (see _depthwise_small)
        self.scratch = threading.local()
        self.plan = by_shape(self._plan)

    def _plan(self, key):
        """(x shape, w shape) -> (kind, geometry) or None when the NCHW path must run."""
        xs, ws = key
        if len(xs) != 4 or len(ws) != 4:
            return None
        n, h, wd, c = xs
        m, cw, kh, kw = ws
        if self.kernel_shape is not None and list(self.kernel_shape) != [kh, kw]:
            return None
        if any(int(d) != 1 for d in self.dilations or ()):
            return None
        if self.group == 1 and cw == c:
            kind = "im2col"
        elif self.group == c and m == c and cw == 1:
            kind = "depthwise"
        elif self.group > 1 and cw * self.group == c and grouped_pointwise(ws, self.group):
            kind = "grouped"
        else:
            return None
        strides = [int(s) for s in self.strides] if self.strides else [1, 1]
        try:
            begin, end, out = geometry((h, wd), (kh, kw), strides, [1, 1], self.pads, self.auto_pad)
        except Exception:
            return None
        pointwise = kh == kw == 1 and strides == [1, 1] and not any(begin) and not any(end)
        if kind == "im2col" and pointwise:
            kind = "pointwise"
        elif kind == "grouped" and not pointwise:
            return None
        elif kind == "im2col" and strides == [1, 1] and strips.pays(out[0] * out[1], m, kw, c, False):
            kind = "strips"     # (in a run that splits its products, checked again per call)
        if self.shuffle and (kind != "grouped" or self.shuffle != self.group):
            return None
        need = [read_extent(o, s, k, 1) for o, s, k in zip(out, strides, (kh, kw))]
        dst, src = read_region((h, wd), begin, need)
        phases = _column_phases(wd, begin[1], strides[1], kw, out[1]) if kind == "depthwise" else None
        phased = kind == "depthwise" and strides[1] > 1 and out[1] > DW_WINDOWS_MAX_WIDTH
        pieces = None
        if kind == "depthwise":
            pieces = _row_pieces(phases, strides[1]) if phased else _row_pieces(None, 1, need[1], dst[1], src[1])
        if len(self.algorithms) < thresholds.LAYOUTS:
            self.algorithms[tuple(xs)] = f"nhwc-{kind}" + ("-phases" if phased else "")
        # a short map (a text line's 2-3 rows under a 5x5 kernel): each output row's einsum over the kernel
        # rows that read X only, the others reading padding alone (constant finite W: _einsum_rows)
        valid = (_valid_rows(dst[0], strides[0], kh, out[0])
                 if kind == "depthwise" and strides[1] == 1 and self.taps_finite else None)
        return kind, strides, out, need, dst, src, phases, pieces, valid

    def output_shape(self, x, w):
        """Y's shape for these inputs when the channels-last algorithms run (None: the NCHW path)."""
        if (self.forced or x.dtype not in _FLOATS or w.dtype != x.dtype):
            return None
        plan = self.plan((x.shape, w.shape))
        return None if plan is None else (x.shape[0], *plan[2], w.shape[0])

    def __call__(self, x, w, b=None, epilogue=None):
        """Y channels-last; epilogue(rows, i, j) then finishes Y viewed as (N*Ho*Wo, M), its rows i:j at a
        time (rows = that view's rows i:j, B already added): per part in the depthwise paths, else once."""
        if (self.forced or x.dtype not in _FLOATS or w.dtype != x.dtype or (b is not None and (b.dtype != x.dtype or b.ndim != 1
                                                                                 or b.shape[0] != w.shape[0]))):
            return _finished(self._nchw(x, w, b), epilogue)
        plan = self.plan((x.shape, w.shape))
        if plan is None:
            return _finished(self._nchw(x, w, b), epilogue)
        kind, strides, out, need, dst, src, _, pieces, _ = plan
        n, c, m = x.shape[0], x.shape[3], w.shape[0]
        if kind == "pointwise":
            # by row blocks of 256 KB-1 MB each finished in cache: slower (each product pays its own
            # set-up: 112x112 32 -> 64 + Clip, split mode, under load, 1.60 ms whole against 1.70-2.25)
            y = blas.matmul(x.reshape(-1, c), self.weights(w)).reshape(n, *out, m)
        elif kind == "depthwise" and strides[1] > 1 and out[1] > DW_WINDOWS_MAX_WIDTH:
            return self._depthwise_phased(x, w, b, strides, out, plan, epilogue)
        elif kind == "depthwise":
            return self._depthwise(x, w, b, strides, out, plan, epilogue)
        elif kind == "grouped":
            y = self._grouped(x, w, out)
        elif kind == "strips" and strips.pays(out[0] * out[1], m, w.shape[3], c, blas.splitting()):
            self.algorithms[x.shape] = "nhwc-strips"
            y = self._strips(x, w, out, plan)
        else:
            if kind == "strips":
                self.algorithms[x.shape] = "nhwc-im2col"
            y = self._im2col(self._padded(x, need, dst, src), w, strides, out)
        if epilogue is None:
            if b is not None:
                rows = y.reshape(-1, out[1] * m)
                rows += self.along_row(b, out[1])
            return y
        return self._finish_blocks(y, b, epilogue)

    def _grouped(self, x, w, out):
        """Y of a grouped 1x1 Conv: one stacked product of X's group column blocks (views of X) by the
        groups' W^T into Y's (with shuffle: group a's outputs in columns a, a + G, ..., the channel shuffle's
        order), or the one product of X by grouped_weights' dense matrix. Alone, 4 groups, under load:
        136x28x28 71 us against 88 for the NCHW stacked product, 544x7x7 64 / 80; with the shuffle, strided
        columns against the dense product (thresholds.SHUFFLED_DENSE_MAX_CHANNELS)."""
        wl = self.weights(w)
        n, c = x.shape[0], x.shape[3]
        p = n * out[0] * out[1]
        if wl.ndim == 2:
            return blas.matmul(x.reshape(p, c), wl).reshape(n, *out, wl.shape[1])
        g, cg, mg = wl.shape
        y = memory.empty((n, *out, g * mg), x.dtype)
        blocks = y.reshape(p, mg, g).transpose(2, 0, 1) if self.shuffle else y.reshape(p, g, mg).transpose(1, 0, 2)
        np.matmul(x.reshape(p, g, cg).transpose(1, 0, 2), wl, out=blocks)
        return y

    def _finish_blocks(self, y, b, epilogue):
        """B and the epilogue on a product's output (N, Ho, Wo, M) by blocks of output rows of about
        thresholds.FINISH_BLOCK_BYTES, each finished while in cache (a large output's passes from memory
        cost more than its product: layout's 400x304 16 -> 32 pointwise Conv with ClipSwish)."""
        oh, ow, m = y.shape[1:]
        step = max(1, thresholds.FINISH_BLOCK_BYTES // max(1, ow * m * y.itemsize))
        for r0 in range(0, oh, step):
            self._finish_rows(y, b, epilogue, r0, min(oh, r0 + step))
        return y

    def _finish_rows(self, y, b, epilogue, r0, r1):
        """B and the epilogue on output rows r0:r1 of every image of y (N, Ho, Wo, M), right after a part's
        einsum, on that part's thread (Conv+Clip, under load: 112x112x32 0.98x, 112x112x64 /2 0.94x,
        28x28x256 0.95x of B and the Clip after the parts; finer chunks, an einsum each, in cache: slower,
        128 KB 1.19-1.21x, 256 KB 1.02-1.09x)."""
        n, oh, ow, m = y.shape
        if not y.size or (b is None and epilogue is None):
            return
        flat = y.reshape(-1, m)
        for k in range(n):
            i, j = (k * oh + r0) * ow, (k * oh + r1) * ow
            if b is not None:
                rows = flat[i:j].reshape(-1, ow * m)
                rows += self.along_row(b, ow)
            if epilogue is not None:
                epilogue(flat[i:j], i, j)

    def along_row(self, v, ow):
        """A per-channel vector v (M,) tiled along an output row (Wo*M,), kept for the constant B: adding it
        to the rows costs a third of broadcasting (M,) over the last axis (16 channels at 56x56, under load:
        11 against 33 us; QLinearConvNHWC scales its accumulator so too)."""
        if v is not self.b_const:
            return np.tile(v, ow)
        t = self.rows.get(ow)
        if t is None:
            t = np.tile(v, ow)
            t.flags.writeable = False
            if len(self.rows) < 16:
                self.rows[ow] = t
        return t

    def _nchw(self, x, w, b):
        return through_nchw(self.nchw, x, w, b)

    @staticmethod
    def _padded(x, need, dst, src):
        """x in a zero buffer (n, *need, c): the padded positions the windows read (x itself when the
        windows read exactly x)."""
        if list(x.shape[1:3]) == need and all(d.start == 0 for d in dst) and x.flags.c_contiguous:
            return x
        # only the border zeroed: X's copy fills the rest (120x120x96 pad 1, alone: 0.52 -> 0.22-0.27 ms)
        xp = memory.empty((x.shape[0], *need, x.shape[3]), x.dtype)
        rows, cols = dst
        xp[:, :rows.start] = 0
        xp[:, rows.stop:] = 0
        xp[:, rows, :cols.start] = 0
        xp[:, rows, cols.stop:] = 0
        xp[:, rows, cols] = x[:, src[0], src[1]]
        return xp

    def _im2col(self, xp, w, strides, out):
        n, c = xp.shape[0], xp.shape[3]
        kh, kw = w.shape[2:]
        s0, s1, s2, s3 = xp.strides
        view = strided_view(xp, (n, *out, kh, kw, c), (s0, s1 * strides[0], s2 * strides[1], s1, s2, s3))
        cols = memory.empty((n, *out, kh, kw, c), xp.dtype)
        np.copyto(cols, view)
        y = blas.matmul(cols.reshape(-1, kh * kw * c), self.weights(w))
        return y.reshape(n, *out, w.shape[0])

    def _strips(self, x, w, out, plan):
        """Y (N, Ho, Wo, M) of a stride-1 Conv by strips (module doc), B left to the caller."""
        n, c = x.shape[0], x.shape[3]
        m, _, kh, kw = w.shape
        oh, ow = out
        _, _, _, need, dst, src, _, _, _ = plan
        k = kw * c
        xp = self._padded(x, need, dst, src)
        s = memory.empty((n, need[0], ow, k), x.dtype)
        np.copyto(s, strided_view(xp, s.shape, xp.strides))     # window rows: kw*C values from each column
        z = blas.matmul(s.reshape(-1, k), self.strip_weights(w)).reshape(n, need[0] * ow, kh * m)
        pixels = oh * ow
        y = memory.empty((n, pixels, m), x.dtype)
        blocks = [z[:, di * ow:di * ow + pixels, di * m:(di + 1) * m] for di in range(kh)]   # kernel row di's sums
        if kh == 1:
            np.copyto(y, blocks[0])
        else:
            np.add(blocks[0], blocks[1], out=y)
        for block in blocks[2:]:
            y += block
        return y.reshape(n, oh, ow, m)

    def _depthwise(self, x, w, b, strides, out, plan, epilogue):
        """Y by row parts, each an einsum then B and the epilogue on its rows; a large padded input is
        written part by part too, each part's rows right before its einsum, on its thread (_read_rows)."""
        n, c = x.shape[0], x.shape[3]
        kh, kw = w.shape[2:]
        oh, ow = out
        _, _, _, need, dst, src, _, pieces, valid = plan
        taps = self.weights(w)
        macs = n * ow * c * kh * kw
        min_rows = max(1, thresholds.DW_MIN_PART_MACS // max(1, macs))
        bare = list(x.shape[1:3]) == need and all(d.start == 0 for d in dst) and x.flags.c_contiguous
        if oh // min_rows <= 1 and not bare and not _by_rows(x, need, c):
            return self._depthwise_small(x, w, b, taps, strides, out, plan, epilogue)
        by_rows = _by_rows(x, need, c) and not bare
        # by rows: every element the windows read is written by _read_rows
        xp = memory.empty((n, *need, c), x.dtype) if by_rows else self._padded(x, need, dst, src)
        y = memory.empty((n, oh, ow, c), xp.dtype)
        windows, subscripts, tiled = _depthwise_windows(xp, strides, (kh, kw), out)
        wt = self._tiled(taps, w, ow) if tiled else taps
        rows = y.reshape(n, oh, ow * c) if tiled else y

        def part(r0, r1):
            if by_rows:
                _read_rows(xp, x, dst[0], src[0], r0 * strides[0], (r1 - 1) * strides[0] + kh, pieces)
            if valid is not None and w is self.w_const:
                _einsum_rows(windows, wt, rows, valid, r0, r1)
            else:
                np.einsum(subscripts, windows[:, r0:r1], wt, out=rows[:, r0:r1])
            self._finish_rows(y, b, epilogue, r0, r1)
        parallel.split(part, oh, min_rows)
        return y

    def _depthwise_small(self, x, w, b, taps, strides, out, plan, epilogue):
        """_depthwise's sums in one part, on a padded input kept per thread and input shape (under
        DW_READ_ROWS_MIN_BYTES, at most 4 shapes): its border zeroed once, only X's interior copied per
        call, its window view made once. The same einsum over the same values as _depthwise: Y bit for
        bit the same. (mobilenet_qdq's small layers with their requantization, fastest of 15 blocks
        alternating, under load: 24x28x28 84.6 -> 79.5 us, 40x14x14 59.2 -> 51.6, 48x14x14 /2 53.4 ->
        41.4, 96x7x7 45.2 -> 40.6.)"""
        n, c = x.shape[0], x.shape[3]
        kh, kw = w.shape[2:]
        oh, ow = out
        _, _, _, need, dst, src, _, _, valid = plan
        def make():
            xp = np.zeros((n, *need, c), x.dtype)
            return (xp[:, dst[0], dst[1]], (slice(None), src[0], src[1]),
                    *_depthwise_windows(xp, strides, (kh, kw), out))
        inside, source, windows, subscripts, tiled = self._kept((x.shape, x.dtype, w.shape), make)
        np.copyto(inside, x[source])
        y = memory.empty((n, oh, ow, c), x.dtype)
        if valid is not None and w is self.w_const:
            _einsum_rows(windows, self._tiled(taps, w, ow), y.reshape(n, oh, ow * c), valid, 0, oh)
        else:
            np.einsum(subscripts, windows, self._tiled(taps, w, ow) if tiled else taps,
                      out=y.reshape(n, oh, ow * c) if tiled else y)
        self._finish_rows(y, b, epilogue, 0, oh)
        return y

    def _depthwise_phased(self, x, w, b, strides, out, plan, epilogue):
        """Stride s > 1 along the width: the padded input stored as its s column phases (phase p's
        column j holding padded column j*s + p), so that kernel column t reads a contiguous run of
        Wo*C values from phase t % s, column t // s on. One einsum per phase over its taps (3x3 /2:
        6 and 3), the later ones added: every slot holds a tap, so no product of a padding slot's
        weight 0 with an infinity makes a NaN. (Under load, 3x3 /2, against one einsum over 12
        (row, phase, column) slots, 3 of them weighted 0: 16x112x112 408 -> 368 us, 64x112x112
        1211 -> 1129, 128x56x56 500 -> 481, 32x56x56 206 -> 192; the 6-d windows einsum 1160 / 315
        at 16x112x112 / 16x56x56.) Below DW_READ_ROWS_MIN_BYTES the phases and their views are kept per
        thread and shape, their zeros written once, as _depthwise_small's padded input (mobilenet_qdq's
        16x56x56 /2 with its requantization, alone, alternating: 247 -> 193 and 196 -> 156 us)."""
        n, c = x.shape[0], x.shape[3]
        kh, kw = w.shape[2:]
        oh, ow = out
        sh, sw = strides
        _, _, _, need, dst, src, (cols, regions), pieces, _ = plan
        by_rows = _by_rows(x, need, c)
        wt = self._tiled(self.weights(w), w, ow)          # (kh, kw, Wo*C)
        if by_rows:     # every element the windows read is written by _read_rows
            xp = memory.empty((n, need[0], sw, cols, c), x.dtype)
            views = _phase_views(xp, strides, (kh, kw), out)
        else:           # the phases kept per thread and shape (DW_READ_ROWS_MIN_BYTES), zeros written once
            def make():
                xp = np.zeros((n, need[0], sw, cols, c), x.dtype)
                return xp, _phase_views(xp, strides, (kh, kw), out)
            xp, views = self._kept(("phases", x.shape, x.dtype, w.shape), make)
            for p, (lo, hi), cs in regions:
                xp[:, dst[0], p, lo:hi] = x[:, src[0], cs]
        y = memory.empty((n, oh, ow, c), x.dtype)
        rows = y.reshape(n, oh, ow * c)
        phases = [(view, wt[:, p::sw]) for p, view in enumerate(views)]

        def part(r0, r1):
            if by_rows:
                _read_rows(xp, x, dst[0], src[0], r0 * sh, (r1 - 1) * sh + kh, pieces)
            tmp = memory.empty_like(rows[:, r0:r1]) if len(phases) > 1 else None
            for k, (view, taps) in enumerate(phases):
                np.einsum("nhaqr,aqr->nhr", view[:, r0:r1], taps, out=tmp if k else rows[:, r0:r1])
                if k:
                    rows[:, r0:r1] += tmp
            self._finish_rows(y, b, epilogue, r0, r1)
        macs = n * ow * c * kh * kw
        parallel.split(part, oh, max(1, thresholds.DW_MIN_PART_MACS // max(1, macs)))
        return y

    def _kept(self, key, make):
        """This thread's scratch for `key` (an input shape's padded input and its views, zeros written once):
        made by make() the first time, kept for at most 4 keys per thread."""
        kept = self.scratch.__dict__
        entry = kept.get(key)
        if entry is None:
            entry = make()
            if len(kept) < 4:
                kept[key] = entry
        return entry

    def _tiled(self, taps, w, ow):
        if w is not self.w_const:
            return np.tile(taps, (1, 1, ow))
        key = ow
        t = self.tiled.get(key)
        if t is None:
            t = np.tile(taps, (1, 1, ow))
            t.flags.writeable = False
            if len(self.tiled) < 16:
                self.tiled[key] = t
        return t


def through_nchw(conv, x, w, b):
    """An NCHW Conv `conv(x, w, b)` on channels-last x (N, H, W, C): x transposed in, Y transposed back."""
    if x.ndim != 4:
        raise ValueError(f"the channels-last Conv takes a 4-D X, got {list(x.shape)}")
    return np.ascontiguousarray(conv(x.transpose(0, 3, 1, 2), w, b).transpose(0, 2, 3, 1))


def _finished(y, epilogue):
    """y after epilogue(rows, 0, N*Ho*Wo) on it viewed as (N*Ho*Wo, M): the paths that finish it whole."""
    if epilogue is not None and y.size:
        epilogue(y.reshape(-1, y.shape[-1]), 0, y.size // max(1, y.shape[-1]))
    return y


def _depthwise_windows(xp, strides, kernel, out):
    """(the windows of the padded input xp (N, Hp, Wp, C) the depthwise einsum reads, its subscripts,
    whether the taps are tiled along an output row): at stride 1 along the width a window row is one
    contiguous run of Wo*C values against the taps tiled Wo times; strided, the 6-d windows."""
    n, c = xp.shape[0], xp.shape[3]
    (kh, kw), (oh, ow) = kernel, out
    s0, s1, s2, s3 = xp.strides
    if strides[1] == 1:
        return strided_view(xp, (n, oh, kh, kw, ow * c), (s0, s1 * strides[0], s1, s2, s3)), "nhabr,abr->nhr", True
    windows = strided_view(xp, (n, oh, ow, kh, kw, c), (s0, s1 * strides[0], s2 * strides[1], s1, s2, s3))
    return windows, "nhwabc,abc->nhwc", False


def _phase_views(xp, strides, kernel, out):
    """Per column phase p of xp (N, rows, s, columns, C) (_depthwise_phased), the read-only view
    (N, Ho, kh, taps, Wo*C) its kernel columns p, p + s, ... read, the q-th of them from column q on."""
    n, c = xp.shape[0], xp.shape[4]
    (sh, sw), (kh, kw), (oh, ow) = strides, kernel, out
    s0, s1, s2, s3, s4 = xp.strides
    views = [np.ndarray((n, oh, kh, len(range(p, kw, sw)), ow * c), xp.dtype, xp, p * s2, (s0, s1 * sh, s1, s3, s4))
             for p in range(min(sw, kw))]
    for v in views:
        v.flags.writeable = False
    return views


def _row_pieces(phases, s, width=None, dst=None, src=None):
    """[(index of a padded row's part after the row axis, X's columns there or None: zeros)] covering the
    depthwise paths' padded row whole: (width, C) at stride 1 (X's columns src at dst), (s, columns, C) as
    column phases (phases: _column_phases's)."""
    if phases is None:
        spans = [((), 0, width, dst.start, dst.stop, src)]
    else:
        cols, regions = phases
        found = {p: (lo, hi, cs) for p, (lo, hi), cs in regions}
        spans = [((p,), 0, cols, *found.get(p, (0, 0, None))) for p in range(s)]
    pieces = []
    for index, first, last, lo, hi, cs in spans:
        if hi <= lo:
            pieces.append(((*index, slice(first, last)), None))
            continue
        if lo > first:
            pieces.append(((*index, slice(first, lo)), None))
        pieces.append(((*index, slice(lo, hi)), cs))
        if hi < last:
            pieces.append(((*index, slice(hi, last)), None))
    return pieces


def _by_rows(x, need, c) -> bool:
    """Whether a depthwise path pads its input part by part (_read_rows): a padded input this large."""
    return x.shape[0] * need[0] * need[1] * c * x.itemsize >= thresholds.DW_READ_ROWS_MIN_BYTES


def _read_rows(xp, x, dst, src, p0, p1, pieces):
    """Padded rows p0:p1 (cut to xp's) of xp (N, rows, ..., C): X's rows where dst lays them (from its rows
    src), zeros elsewhere, as _row_pieces lays a row out. The parts of one call each write the rows their
    windows read: a row two parts read gets the same values twice (no part reads a row before writing it).
    Instead of zeroing the whole buffer and copying X into it (one thread, alternating per call, under
    load: the phases of 64x112x112 /2 202 -> 168 us, 128x56x56 /2 93 -> 79; 32x112x112 75 -> 61)."""
    p1 = min(p1, xp.shape[1])
    a, b = max(p0, dst.start), min(p1, dst.stop)
    if a >= b:
        xp[:, p0:p1] = 0
        return
    if p0 < a:
        xp[:, p0:a] = 0
    if b < p1:
        xp[:, b:p1] = 0
    rows, x_rows = slice(a, b), slice(src.start + a - dst.start, src.start + b - dst.start)
    for index, cols in pieces:
        if cols is None:
            xp[(slice(None), rows, *index)] = 0
        else:
            xp[(slice(None), rows, *index)] = x[:, x_rows, cols]


def _column_phases(size, begin, s, k, out):
    """(columns per phase, [(phase p, (lo, hi) its columns holding input, the input columns' slice)]) of
    a width `size` padded by `begin`, read at stride s by k taps for `out` outputs."""
    cols = out + (k - 1) // s
    regions = []
    for p in range(s):
        lo = max(0, -((p - begin) // s))
        hi = min(cols, (size - 1 + begin - p) // s + 1)
        if hi > lo:
            first = lo * s + p - begin
            regions.append((p, (lo, hi), slice(first, first + (hi - lo - 1) * s + 1, s)))
    return cols, regions


def strip_weights(w: np.ndarray) -> np.ndarray:
    """W (M, C, kh, kw) -> Ws (kw*C, kh*M): kernel row di's taps in columns di*M.., a window row's order
    (dj, c) down the rows (ConvNHWC._strips)."""
    m, c, kh, kw = w.shape
    return np.ascontiguousarray(w.transpose(3, 1, 2, 0)).reshape(kw * c, kh * m)


def _valid_rows(rows_in, stride, kh, oh):
    """Per output row i, the kernel rows [lo, hi) reading X (padded rows rows_in.start..stop-1 hold it;
    row i reads padded rows i*stride + di), or None when they are more than
    thresholds.DW_VALID_ROWS_MAX_SHARE of all (one einsum over every row is then the faster)."""
    spans = [(max(0, rows_in.start - i * stride), min(kh, rows_in.stop - i * stride)) for i in range(oh)]
    spans = [(lo, max(lo, hi)) for lo, hi in spans]
    used = sum(hi - lo for lo, hi in spans)
    return spans if used <= thresholds.DW_VALID_ROWS_MAX_SHARE * oh * kh else None


def _einsum_rows(windows, wt, rows, valid, r0, r1):
    """Output rows r0..r1-1 of the tiled depthwise einsum, each over its valid kernel rows only (the
    others multiply padding: zeros, and W is finite); a row reading no X at all is zero."""
    for i in range(r0, r1):
        lo, hi = valid[i]
        if hi > lo:
            np.einsum("nabr,abr->nr", windows[:, i, lo:hi], wt[lo:hi], out=rows[:, i])
        else:
            rows[:, i] = 0
