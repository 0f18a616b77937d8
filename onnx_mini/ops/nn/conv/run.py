"""Convolution: one Conv's computation. The spec's checks (spec.py) run once per input shape, the
algorithm is chosen once per shape (select.py; one for runs that split their products over the pool,
one for the others), and the transforms of a constant W (and B) are made once and kept here, with
the model (never in a process-wide cache):
- the pointwise bias column (pointwise.bias_column): when the Convolution is made;
- Winograd's G g G': on the first run that takes Winograd (it depends on the shape of X whether
  any will: a 7x7 layer never does, and keeping it would cost 16/9 of W);
- the banded matrices and the depthwise einsum's tiled weights: once per input shape (they depend
  on its output width);
- W's taps in a channels-last window's order (im2col.rows_weights): on the first run by rows, and
  with one output position those reading X with B as a column (im2col.one_weights), once per shape;
- W as one image's im2col multiplies it, B as one more column (`_biased`): its taps in a channels-last
  window's order (im2col.last_weights) on the first run with channels-last columns, as they are on
  the first with the bias row;
- W's kernel rows stacked with B in a column (strips.weights): on the first run by strips;
- whether W is a windowed real DFT basis (an STFT as a Conv1d), and its window (dft.basis): when the
  Convolution is made.
A W fed at run time is transformed on every call, as are a constant W's transforms when another W
comes instead (identity decides: a constant arrives as that same array). W's finiteness (for the
transforms that need it) is checked once for a constant W, per call otherwise; X's on every call.
"""
from __future__ import annotations

import numpy as np

from .... import blas, memory
from .._common import finite, per_image, read_extent
from ..._common import UPCAST
from . import banded, checks, depthwise, dft, im2col, pointwise, shifted, strips, thresholds, winograd
from .select import EMPTY, NEEDS_FINITE, check_name, select


class Convolution:
    """A Conv node's convolution, called as convolution(x, w, b=None, *, epilogue=None, shuffle=False).

    constants: {input index: array} known at prepare time (1: W, 2: B); algorithm: a name of
    select.ALGORITHMS to take where it applies (ValueError for another name); shuffle: the calls
    will ask for shuffle (B is then in shuffle order: the bias column is prepared for it); exact: X and W hold
    integers whose float32 sums must stay exact (select's `exact`). `algorithms` maps each
    X shape seen to the algorithm that last ran on it."""

    def __init__(self, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None,
                 constants=None, algorithm=None, shuffle=False, exact=False):
        self.attrs = (checks.check_attributes(auto_pad, group), dilations, group, kernel_shape, pads, strides)
        self.group = group
        self.forced = check_name(algorithm)
        self.exact = exact
        constants = constants or {}
        self.w, self.b = constants.get(1), constants.get(2)
        self.w_finite = self.w is None or not _transformable(self.w, group) or _weights_finite(self.w, group)
        self.kept = {}                  # transforms of the constant W (and B) that no shape changes
        self.layouts = {}               # (X, W, B shapes, X type, shuffle) -> _Layout
        self.algorithms = {}
        w, b = self.w, self.b
        if (w is not None and b is not None and w.ndim >= 3 and w.dtype not in UPCAST and b.shape == w.shape[:1]
                and w.shape[0] % group == 0 and all(k == 1 for k in w.shape[2:])
                and all(s == 1 for s in strides or ()) and not any(pads or ())
                and pointwise.sums_bias(w.shape[1] * group, w.shape[0], group)):
            self.kept["bias column", shuffle] = pointwise.bias_column(w, b, group, shuffle)
        self.dft = dft.basis(w) if w is not None and group == 1 and not exact else None

    def __call__(self, x, w, b=None, *, epilogue=None, shuffle=False):
        """Y = Conv(X, W, B), the output's float32/float64 images finished by epilogue(y_part, i0, i1)
        in place (images i0..i1-1, while they are still in the caches: ops/fused.py's residual add and
        activation) after the bias. shuffle: a pointwise Conv writes its output channels in
        channel-shuffle order, group a's j-th channel to channel j*group + a (optimize/
        channel_shuffle.py), b given in that order; ValueError for a Conv that is not pointwise."""
        key = (x.shape, x.dtype, w.shape, None if b is None else b.shape, shuffle)
        layout = self.layouts.get(key)
        if layout is None:
            layout = self._plan(key, x, w, b, shuffle)
        elif layout.rows_w is not None and w is self.w:     # a shape seen: by rows with the constant W
            self.algorithms[key[0]] = "im2col"
            if layout.one_w is not None and b is self.b:     # (and B: one product over X's taps)
                y = im2col.conv_one(x, layout.one_w, layout.memo["columns"])
            else:
                y = im2col.conv_rows(x, layout.rows_w, layout.memo["columns"], b)
            if epilogue is not None:
                epilogue(y, 0, 1)
            return y
        kernel, strides, dil, begin, end, out = layout.geometry
        name, fallback = layout.split if blas.splitting() else layout.whole
        n, c = x.shape[:2]
        m, cg = w.shape[:2]
        group = self.group
        r = x.ndim - 2
        constant = w is self.w
        dtype = x.dtype
        given_w, given_b = w, b
        if dtype in UPCAST:
            x, w = x.astype(np.float32), w.astype(np.float32)
            b = None if b is None else b.astype(np.float32)
        if name in NEEDS_FINITE and not (finite(x) and (self.w_finite if constant
                                                        else _weights_finite(given_w, group))):
            name = fallback
        self.algorithms[key[0]] = name
        if name == "im2col" and n == 1:     # one image: finished here, a small Conv's fixed cost counts
            columns = _columns(layout, x, group)
            if columns.__class__ is im2col.Rows:       # (B added to the products' rows, contiguous)
                # W's taps reordered: once for the constant W
                wr = _kept(self.kept, constant, ("rows", x.dtype), lambda: im2col.rows_weights(w))
                y = im2col.conv_rows(x, wr, columns, b)
                if constant and dtype not in UPCAST:      # later calls of this shape go straight here
                    layout.rows_w = wr
                    if columns.read is not None and given_b is self.b and _skipped_finite(w, columns.read):
                        layout.one_w = im2col.one_weights(w, b, columns.read)
            elif columns.__class__ is im2col.LastColumns:  # (B summed by the product)
                y = im2col.conv_last(x, self._biased("last", given_w, given_b, x.dtype, constant), columns, out)
            elif b is not None and columns.bias_row and (columns.band is None or not blas.splitting()):
                # B summed by the product
                y = im2col.conv_biased(x, self._biased("nchw", given_w, given_b, x.dtype, constant), columns, out)
            else:
                y = im2col.conv(x, w, group, columns, out)
                if epilogue is not None and getattr(epilogue, "elementwise", False):
                    return _finish_planes(y, b, epilogue).astype(dtype, copy=False)
                if b is not None:
                    y += b.reshape((1, m) + (1,) * r)
            if epilogue is not None:
                epilogue(y, 0, 1)
            return y.astype(dtype, copy=False)
        bias = None if b is None else b.reshape((1, m) + (1,) * r)

        if name == "pointwise":
            wg = w.reshape(group, m // group, cg)
            if b is not None and w is given_w and pointwise.sums_bias(c, m, group):
                wg, x = self._bias_column(w, b, shuffle, constant), pointwise.with_ones_row(x, group)
                bias = None                                 # summed by the product
        elif name == "depthwise-banded":
            def make():
                return banded.weights(given_w, x.dtype, read_extent(out[1], strides[1], kernel[1], dil[1]), out[1],
                                      strides[1], dil[1])
            y = banded.conv(x, layout.keep(constant, "banded", make), kernel, strides, dil, begin, out)
            if b is not None:
                y += b.reshape(m, 1, 1)
            bias = None
        elif name == "dft":
            y = dft.conv(x, self.dft, strides[0], begin[0], end[0], out[0])
        elif name in depthwise.LAYOUTS:
            y = depthwise.conv(x, w, b, group, kernel, strides, dil, begin, out, name, layout.memo,
                               lambda k, make: layout.keep(constant, k, make))
            bias = None                                             # added by the layout

        def finish(y_part, i0, i1):      # bias, then the caller's epilogue, on a run of images
            if bias is not None:
                y_part += bias
            if epilogue is not None:
                epilogue(y_part, i0, i1)

        if name == EMPTY:                # nothing to sum: the output is the bias alone
            y = memory.zeros((n, m, *out), dtype=x.dtype)
        elif name == "pointwise":
            if n == 1:                   # one image: finished directly (a small Conv's fixed cost counts)
                y = pointwise.conv(x, wg, out, shuffle)
                finish(y, 0, 1)
                return y.astype(dtype, copy=False)
            return _per_image(pointwise.conv, x, m, out, finish, wg, out, shuffle).astype(dtype, copy=False)
        elif name == "winograd":
            u = _kept(self.kept, constant, ("winograd", x.dtype), lambda: winograd.weights(given_w, x.dtype))
            return _per_image(winograd.conv, x, m, out, finish, u, begin, out).astype(dtype, copy=False)
        elif name == "strips":          # B summed by the product
            ws = _kept(self.kept, constant and given_b is self.b, ("strips", x.dtype),
                       lambda: strips.weights(given_w, given_b, x.dtype))
            geometry = layout.keep(True, "strips", lambda: strips.Strips(x.shape, x.dtype, kernel, dil, begin, out))
            bias = None
            return _per_image(strips.conv, x, m, out, finish, ws, geometry).astype(dtype, copy=False)
        elif name == "shifted":
            return _per_image(shifted.conv, x, m, out, finish, w, kernel, dil, begin, end,
                              out).astype(dtype, copy=False)
        elif name == "im2col":
            columns = _columns(layout, x, group)
            if columns.__class__ is im2col.LastColumns:     # (B summed by the product)
                bias = None
                return _per_image(im2col.conv_last, x, m, out, finish,
                                  self._biased("last", given_w, given_b, x.dtype, constant), columns, out,
                                  into=True).astype(dtype, copy=False)
            return _per_image(im2col.conv, x, m, out, finish, w, group, columns, out).astype(dtype, copy=False)
        finish(y, 0, n)
        return y.astype(dtype, copy=False)

    def _plan(self, key, x, w, b, shuffle):
        """The checked geometry of one input shape and its algorithm (the checks and geometry cost ~4 us
        a call, a third of a small pointwise Conv's overhead; a depthwise layout's plan ~8 us)."""
        geometry = checks.shape_geometry(x, w, b, *self.attrs)
        kernel, strides, dil, begin, end, out = geometry

        def choose(splitting, finite_values):
            return select(x.shape, w.shape, x.dtype, group=self.group, kernel=kernel, strides=strides,
                          dilations=dil, begin=begin, end=end, out=out, finite=finite_values, forced=self.forced,
                          shuffle=shuffle, exact=self.exact, splitting=splitting,
                          dft=self.dft is not None and w is self.w)

        def pair(splitting):        # (the algorithm, the one taken when X or W turn out not finite)
            name = choose(splitting, self.w_finite if w is self.w else True)
            return name, choose(splitting, False) if name in NEEDS_FINITE else name
        layout = _Layout(geometry, pair(False), pair(True))
        if len(self.layouts) >= thresholds.LAYOUTS:
            self.layouts.clear()
            self.algorithms.clear()
        self.layouts[key] = layout
        return layout

    def _bias_column(self, w, b, shuffle, constant):
        return _kept(self.kept, constant and b is self.b, ("bias column", shuffle),
                     lambda: pointwise.bias_column(w, b, self.group, shuffle))

    def _biased(self, kind, w, b, dtype, constant):
        """W in the compute type as (M, columns' rows) in the order of `kind`'s columns ("last":
        im2col.last_weights, "nchw": W's own), with B as one more column (pointwise.bias_column) when
        given: once for the constant W and B."""
        def make():
            wk = w.astype(dtype, copy=False)
            wk = im2col.last_weights(wk) if kind == "last" else wk.reshape(wk.shape[0], -1)
            return (np.ascontiguousarray(wk) if b is None
                    else pointwise.bias_column(wk, b.astype(dtype, copy=False), 1, False)[0])
        return _kept(self.kept, constant and b is self.b, (kind, dtype), make)


class _Layout:
    """One input shape's geometry, algorithm (and the one taken when X or W turn out not finite) in a
    run that leaves its products whole (`whole`) and in one that splits them (`split`: select's
    `splitting`), and the algorithm's own per-shape state (memo), which holds the constant W's
    per-shape transforms."""
    __slots__ = ("geometry", "whole", "split", "memo", "rows_w", "one_w")

    def __init__(self, geometry, whole, split):
        self.geometry, self.whole, self.split, self.memo = geometry, whole, split, {}
        self.rows_w = None      # the constant W's taps once a call went by rows (no check left to make)
        self.one_w = None       # ... and with one output position, the taps reading X with the constant B

    def keep(self, constant: bool, key, make):
        """make(), kept in memo under key when it transforms the Conv's constant W."""
        return _kept(self.memo, constant, key, make)


def _kept(store: dict, constant: bool, key, make):
    """make(), kept in store under key when it transforms the Conv's constant W (and B): the model's
    transforms (Convolution.kept) and one shape's (_Layout.memo) alike."""
    if not constant:
        return make()
    value = store.get(key)
    if value is None:
        value = store[key] = make()
    return value


def _columns(layout, x, group):
    """The im2col geometry of the layout's shape (x: in the compute type), made on its first im2col run:
    im2col.LastColumns, image by image, where X's memory is channels-last and Rows does not apply (kept
    apart: the same shape may come in either order); else im2col.Rows where a 1-D image's columns are
    better read as rows, im2col.LastColumns where one small image's are better gathered channels-last
    (only the one-image path takes either), else im2col.Columns."""
    kernel, strides, dil, begin, end, out = layout.geometry
    last_memory = (im2col.channels_last_memory(x)
                   and im2col.LastColumns.applies_channels_last(x.shape, group, kernel, dil)
                   and not im2col.Rows.applies(x.shape, group, kernel, dil, out))
    key = "columns, channels-last memory" if last_memory else "columns"
    columns = layout.memo.get(key)
    if columns is None:
        if last_memory:
            columns = im2col.LastColumns(x.shape, x.dtype, kernel, strides, dil, begin, end, out)
        elif im2col.Rows.applies(x.shape, group, kernel, dil, out):
            columns = im2col.Rows(x.shape, x.dtype, kernel, strides, begin, end, out)
        elif im2col.LastColumns.applies(x.shape, group, kernel, strides, dil, out):
            columns = im2col.LastColumns(x.shape, x.dtype, kernel, strides, dil, begin, end, out)
        else:
            columns = im2col.Columns(x.shape, x.dtype, group, kernel, strides, dil, begin, end, out)
        layout.memo[key] = columns
    return columns


def _finish_planes(y, b, epilogue):
    """One image's output y (1, M, *out) + B, then an elementwise epilogue (its `elementwise` attribute:
    it may finish any part, as the activation alone), by runs of channel planes of about
    thresholds.FINISH_BLOCK_BYTES, each finished while in cache (a stem's 16 x 400x304 output + B +
    ClipSwish: six passes from memory otherwise)."""
    planes = y.reshape(y.shape[1], -1)
    step = max(1, thresholds.FINISH_BLOCK_BYTES // max(1, planes.shape[1] * y.itemsize))
    for m0 in range(0, planes.shape[0], step):
        part = planes[m0:m0 + step]
        if b is not None:
            part += b[m0:m0 + step, None]
        epilogue(part, 0, 1)
    return y


def _skipped_finite(w, read) -> bool:
    """Whether W's taps outside read[:2] (those multiplying only padding: 0 * W there must add nothing,
    not an inf * 0 = NaN) are finite."""
    t0, t1 = read[:2]
    return finite(w[:, :, :t0]) and finite(w[:, :, t1:])


def _transformable(w, group) -> bool:
    """Whether W's shape lets it reach an algorithm that needs finite values (select.NEEDS_FINITE)."""
    return w.ndim == 4 and ((group == 1 and w.shape[2:] == (3, 3)) or (group > 1 and w.shape[1] == 1))


def _weights_finite(w, group) -> bool:
    """W's finiteness as the transform that may take it checks: in float64 for Winograd (one group),
    in W's type for the banded depthwise matrices (an overflowing sum says no: only the faster path
    is lost)."""
    return finite(w.astype(np.float64)) if group == 1 else finite(w)


def _per_image(formulation, x, m, out, finish, *args, into=False):
    """formulation(x[i:i+1], *args) image by image (per_image), each finished (finish(y_i, i, i+1):
    bias, fused epilogue) while it is in the caches; into: the formulation writes image i's result into
    its `into=` argument (no copy)."""
    n = x.shape[0]
    if n == 1:
        y = formulation(x, *args)
        finish(y, 0, 1)
        return y

    def compute(i, y_i):
        if into:
            formulation(x[i:i + 1], *args, into=y_i)
        else:
            y_i[...] = formulation(x[i:i + 1], *args)
        finish(y_i, i, i + 1)
    return per_image(compute, (n, m, *out), x.dtype)


def convolve(x, w, b=None, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None,
             *, epilogue=None, shuffle=False):
    """Conv(X, W, B) once, for kernels that convolve as one step of their own (ConvInteger,
    QLinearConv, com.microsoft FusedConv / NhwcConv): no constants, the normal choice of algorithm.
    epilogue, shuffle: as Convolution.__call__."""
    return Convolution(auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape, pads=pads,
                       strides=strides)(x, w, b, epilogue=epilogue, shuffle=shuffle)
