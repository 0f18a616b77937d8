"""Pooling: AveragePool, MaxPool, LpPool, their Global* forms, MaxUnpool, MaxRoiPool (every version).

Sliding-window pools reduce a box of kernel taps, which is separable: the spatial axes are reduced
one after the other (first spatial axis first), each as a loop over that axis's few taps with
np.maximum / np.add on the once-padded input. An axis of stride 1, and the last axis, are reduced
over the whole buffer seen flat (each tap one contiguous run at its offset; the positions whose
window runs into the next row are cropped at the end, the last axis's stride with them); a strided
inner axis by strided views of whole rows (see _box). Measured here against strided views for every
axis (interleaved, float32, batch 1): 3x3 stride 1 AveragePool 256x28x28 0.40 -> 0.22 ms, MaxPool
1024x7x7 0.22 -> 0.10; 3x3 stride 2 MaxPool 64x112x112 0.68 -> 0.54 ms. A loop over the 9 taps took
~1.15 ms and np.max over a strided window view ~21 ms on the last. Padded pools whose every stride
is at least 2 (the downsampling 3x3 stride 2 pad 1 of ResNet and ShuffleNet) skip the padded copy:
each axis is reduced straight from the unpadded input, a tap that every output reads inside the input
first, then each other tap on the outputs it reads inside it (_box_direct), into a contiguous result
(in whole models, interleaved: ShuffleNet -3.5%, ResNet-50 -1.8%). MaxPool windows that tile the
input (kernel == strides, no padding: the 2x2 stride 2 pools of small CNNs) are reduced from a view
splitting each spatial axis into (outputs, taps), with no padded copy nor the per-call bookkeeping of
_box (_tiles: the same taps in the same order, so the same bits).

Geometry (pads, auto_pad, output sizes, ceil_mode) comes from nn/_common.geometry. With ceil_mode
the last window may run past the padded input: those cells are extra padding that never counts
(-inf for max, not counted by AveragePool even with count_include_pad=1, zero for LpPool).
AveragePool's divisor is the product over axes of the per-axis number of counted cells in each
window (the counted region is a box), computed once per input shape.
MaxPool's Indices come from a loop over all kernel taps keeping the first strict maximum.
MaxRoiPool: per roi, two np.maximum.reduceat calls (bins along W, then along H) over the roi's rows,
4x faster than masked maxima; float16/bfloat16 everywhere compute in float32 and round back once.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from ... import memory
from ...errors import InvalidValueError
from ...registry import kernel
from .._common import UPCAST, as_array
from ._common import check_auto_pad, geometry, pad_spatial, per_image, read_extent, taps_inside

# A batch at least this large is pooled image by image (ResNet-50's first MaxPool at batch 32: 2.1 ms
# per image over the whole batch, 1 ms for one image alone).
_PER_IMAGE_SIZE = 1 << 20


# -- shared window machinery ----------------------------------------------------------------------

def _check_attrs(kernel_shape, strides, pads, dilations, auto_pad, what=("strides", "dilations")):
    """Factory-time checks of the window attributes -> (auto_pad, kernel, strides, pads, dilations)
    as tuples (None for an absent attribute)."""
    auto_pad = check_auto_pad(auto_pad)
    kernel = tuple(int(k) for k in kernel_shape)
    r = len(kernel)
    if r == 0 or min(kernel) < 1:
        raise ValueError(f"kernel_shape {list(kernel)} must hold one positive size per spatial axis")
    for name, v in zip(what, (strides, dilations)):
        if v is not None and (len(v) != r or min(v, default=1) < 1):
            raise ValueError(f"{name} {list(v)} must hold {r} positive values (one per spatial axis)")
    if pads is not None and (len(pads) != 2 * r or min(pads, default=0) < 0):
        raise ValueError(f"pads {list(pads)} must hold {2 * r} values >= 0 (begin and end per spatial axis)")
    tup = (lambda v: None if v is None else tuple(int(a) for a in v))
    return auto_pad, kernel, tup(strides) or (1,) * r, tup(pads), tup(dilations) or (1,) * r


@functools.lru_cache(maxsize=512)
def _layout(in_sizes, kernel, strides, dilations, pads, auto_pad, ceil_mode):
    """-> (begin, end, extra, out): explicit/auto pads, the extra end cells ceil_mode's last windows
    read past the padded input, and the output spatial sizes."""
    begin, end, out = geometry(in_sizes, kernel, strides, dilations, pads, auto_pad, ceil_mode)
    extra = tuple(max(0, read_extent(o, s, k, d) - (i + b + e))
                  for o, s, k, d, i, b, e in zip(out, strides, kernel, dilations, in_sizes, begin, end))
    return tuple(begin), tuple(end), extra, tuple(out)


def _one_window(in_sizes, kernel, dilations, begin, end, extra) -> bool:
    """The kernel covers the whole unpadded input (the global pool written as a sliding one, as
    ShuffleNet's last AveragePool 7x7 over 7x7): one reduction over the spatial axes, ~5x faster than
    the tap by tap sums (544x7x7: 56 -> 21 us)."""
    return (tuple(kernel) == tuple(in_sizes) and not any(begin) and not any(end) and not any(extra)
            and all(d == 1 for d in dilations))


def _spatial(x, kernel):
    if x.ndim != len(kernel) + 2:
        raise InvalidValueError(f"X of shape {list(x.shape)} must have rank {len(kernel) + 2} "
                                f"(N, C and one axis per kernel_shape value {list(kernel)})")
    return x.shape[2:]


def _padded(x, begin, end, extra, value):
    return pad_spatial(x, begin, tuple(e + a for e, a in zip(end, extra)), value)


def _box(xp, ufunc, kernel, strides, dilations, out):
    """Reduce every window of the padded xp (N, C, *spatial) with a binary ufunc, one spatial axis at
    a time -> (buffer, crop): buffer[crop] is the (N, C, *out) result, a view (of xp itself for
    1-sized kernels).

    numpy's cost here is per inner loop, and it is long only over contiguous runs, so (_flat_taps):
    an axis of stride 1, and the last axis whatever its stride, is reduced over the whole buffer seen
    flat, each tap a contiguous run at its offset (the positions whose window runs into the next row
    are computed too and cropped away; the last axis's stride is taken by the crop); an inner axis
    with a stride is reduced by strided views of whole rows, which shrinks the buffer by the stride.
    Taps are combined in the same order either way: the sums are those of the per-tap loop."""
    r = len(kernel)
    y = xp
    crop = [slice(None), slice(None)]
    with np.errstate(invalid="ignore", over="ignore"):     # inf - inf or overflow in a cropped position
        for d, (k, s, dl, o) in enumerate(zip(kernel, strides, dilations, out)):
            if s == 1 or d == r - 1:
                if k > 1:
                    y = _flat_taps(y, ufunc, k, dl * math.prod(y.shape[2 + d + 1:]))
                crop.append(slice(0, (o - 1) * s + 1, s))
                continue
            head = (slice(None),) * (2 + d)
            views = [y[head + (slice(t * dl, t * dl + (o - 1) * s + 1, s),)] for t in range(k)]
            if k == 1:
                y = views[0]
            else:
                y = ufunc(views[0], views[1])
                for v in views[2:]:
                    ufunc(y, v, out=y)
            crop.append(slice(None))
    return y, tuple(crop)


# _box_direct for pools with padding whose every stride is at least this (see _direct_plan).
_DIRECT_MIN_STRIDE = 2
_DIRECT_PADDED_ONLY = True


@functools.lru_cache(maxsize=512)
def _direct_plan(in_sizes, kernel, strides, dilations, begin, extra, out, min_stride, padded_only):
    """How _box_direct reduces the windows from the unpadded input, or None where _box is faster or
    needed. Per spatial axis: (stride, offset of a tap every output position reads inside the input,
    ((offset, lo, hi) of each other tap: the outputs lo..hi-1 it reads inside the input)), offsets
    being the input position output 0's tap reads. By default only for padded pools with every stride
    at least 2 (_DIRECT_MIN_STRIDE, _DIRECT_PADDED_ONLY; the tests force it everywhere): there
    it skips _box's padded copy and its strided crop (3x3 stride 2 pad 1, interleaved, with the copy
    a consumer makes of the crop: MaxPool 24x112x112 238 -> 210 us, 64x112x112 607 -> 522,
    AveragePool 136x28x28 141 -> 114, 272x14x14 114 -> 88); unpadded or at stride 1 it loses
    (MaxPool 96x109x109 stride 2 613 -> 713 us, 192x28x28 stride 1 175 -> 362)."""
    if padded_only and not (any(begin) or any(extra) or any(read_extent(o, s, k, d) > i + b for o, s, k, d, i, b
                                                            in zip(out, strides, kernel, dilations, in_sizes, begin))):
        return None
    if min(strides) < min_stride:
        return None
    plan = []
    for i, k, s, d, b, o in zip(in_sizes, kernel, strides, dilations, begin, out):
        full, rest = None, []
        for t in range(k):
            off = t * d - b
            lo = (-off + s - 1) // s if off < 0 else 0
            hi = min(o, (i - 1 - off) // s + 1) if off <= i - 1 else 0
            if hi <= lo:
                continue                        # a tap reading only padding
            if full is None and lo == 0 and hi == o:
                full = off
            else:
                rest.append((off, lo, hi))
        if full is None:
            return None
        plan.append((s, full, tuple(rest)))
    return tuple(plan)


def _box_direct(x, ufunc, plan, out):
    """Every window of x (N, C, *spatial) reduced with a binary ufunc, straight from the unpadded x,
    one spatial axis at a time (_direct_plan): each axis starts from a tap that every output reads
    inside x, and each other tap combines into the outputs it reads inside x (strided views: the
    padding is never materialised). -> (N, C, *out), a view of x for 1-sized kernels."""
    with np.errstate(invalid="ignore", over="ignore"):      # inf - inf or overflow: NaN / inf, as the sums say
        return _reduce_direct(x, ufunc, plan, out)


def _reduce_direct(x, ufunc, plan, out):
    y = x
    for d, (s, full, rest) in enumerate(plan):
        head = (slice(None),) * (2 + d)
        o = out[d]

        def view(off, lo, hi):
            a = off + lo * s
            return y[head + (slice(a, a + (hi - lo - 1) * s + 1, s),)]
        first = view(full, 0, o)
        if not rest:
            y = first
            continue
        z = memory.empty(y.shape[:2 + d] + (o,) + y.shape[3 + d:], dtype=y.dtype)
        off, lo, hi = rest[0]
        ufunc(first[head + (slice(lo, hi),)], view(off, lo, hi), out=z[head + (slice(lo, hi),)])
        if lo:
            z[head + (slice(0, lo),)] = first[head + (slice(0, lo),)]
        if hi < o:
            z[head + (slice(hi, o),)] = first[head + (slice(hi, o),)]
        for off, lo, hi in rest[1:]:
            part = z[head + (slice(lo, hi),)]
            ufunc(part, view(off, lo, hi), out=part)
        y = z
    return y


def _flat_taps(y, ufunc, k, step):
    """-> a new buffer of y's shape whose flat position i combines y's flat positions i + t*step,
    t < k (positions past the last full window set to zero)."""
    src = np.ascontiguousarray(y).reshape(-1)
    m = src.size - (k - 1) * step
    out = memory.empty_like(y)
    flat = out.reshape(-1)
    if m > 0:
        acc = flat[:m]
        ufunc(src[:m], src[step:step + m], out=acc)
        for t in range(2, k):
            ufunc(acc, src[t * step:t * step + m], out=acc)
    flat[max(m, 0):] = 0
    return out


@functools.lru_cache(maxsize=512)
def _tiles_plan(kernel, strides, dilations, begin, end, extra, out):
    """Windows that tile the input (kernel == strides, no dilation, no padding: each input cell in at
    most one window, the cells past the last window unread) -> (the crop of X the windows cover, the
    shape splitting each of its spatial axes into (outputs, taps), per spatial axis the index of each
    of its taps in the view as _tiles reduces it), or None for other windows."""
    if (kernel != strides or any(d != 1 for d in dilations) or any(begin) or any(end) or any(extra)
            or min(out) < 1):
        return None
    crop = (slice(None), slice(None)) + tuple(slice(0, o * k) for o, k in zip(out, kernel))
    split = tuple(a for o, k in zip(out, kernel) for a in (o, k))
    # axis d's taps sit at 3 + d once the axes before it are reduced: (N, C, o0..o[d-1], o[d], k[d], ...)
    taps = tuple(tuple((slice(None),) * (3 + d) + (t,) for t in range(k)) for d, k in enumerate(kernel))
    return crop, split, taps


def _tiles(x, ufunc, plan):
    """Every window of x (N, C, *spatial) reduced with a binary ufunc where the windows tile it
    (_tiles_plan): x's covered crop seen as (N, C, o0, k0, o1, k1, ...) (a view: axes only split), each
    spatial axis but the last reduced by its taps' views, the last over the contiguous result seen flat
    (_flat_taps), its windows' first positions a view; taps in _box's order, so the same values bit for
    bit. _box's steps without its padding, crop bookkeeping and error-state context (MaxPool with a
    consumer's copy of the result, interleaved medians under load, 2x2 stride 2: a wake-word model's
    [1,16,97,32] 51 -> 43 us, [1,32,48,16] 45 -> 35, [1,64,24,8] 36 -> 29, and [1,128,112,112] 1.28 ->
    1.20 ms; 3x3 stride 3 [1,64,56,56] 155 -> 129 us). Reducing the last axis by strided views instead
    returns a contiguous result but loses from ~1 MB on, even counting the consumer's copy of the view
    ([1,128,112,112] 0.95 -> 1.20 ms, [1,256,56,56] 0.45 -> 0.55)."""
    crop, split, taps = plan
    y = x[crop].reshape(x.shape[:2] + split)
    for axis in taps[:-1]:
        first = y[axis[0]]
        if len(axis) == 1:
            y = first
            continue
        z = ufunc(first, y[axis[1]])
        for t in axis[2:]:
            ufunc(z, y[t], out=z)
        y = z
    last = taps[-1]
    return y[last[0]] if len(last) == 1 else _flat_taps(y, ufunc, len(last), 1)[last[0]]


def _lowest(dtype):
    return -np.inf if dtype.kind == "f" else np.iinfo(dtype).min


# -- MaxPool --------------------------------------------------------------------------------------

def _max_pool(kernel_shape, strides, pads, dilations, auto_pad, ceil_mode, storage_order, indices):
    auto_pad, kernel, strides, pads, dilations = _check_attrs(kernel_shape, strides, pads, dilations, auto_pad)
    if storage_order not in (0, 1):
        raise ValueError(f"storage_order must be 0 (row major) or 1 (column major), got {storage_order}")
    ceil_mode = bool(ceil_mode)

    def run(x):
        in_sizes = _spatial(x, kernel)
        begin, end, extra, out = _layout(in_sizes, kernel, strides, dilations, pads, auto_pad, ceil_mode)
        dtype = x.dtype
        xc = x.astype(np.float32) if dtype in UPCAST else x
        if not indices:
            if _one_window(in_sizes, kernel, dilations, begin, end, extra):
                return np.maximum.reduce(xc, axis=tuple(range(2, xc.ndim)), keepdims=True).astype(dtype, copy=False)
            tiles = _tiles_plan(kernel, strides, dilations, begin, end, extra, out)
            direct = None if tiles is not None else _direct_plan(in_sizes, kernel, strides, dilations, begin, extra,
                                                                 out, _DIRECT_MIN_STRIDE, _DIRECT_PADDED_ONLY)

            def pooled(xs):
                if tiles is not None:
                    return _tiles(xs, np.maximum, tiles)
                if direct is not None:
                    return _box_direct(xs, np.maximum, direct, out)
                buf, crop = _box(_padded(xs, begin, end, extra, _lowest(xs.dtype)), np.maximum, kernel, strides,
                                 dilations, out)
                return buf[crop]
            if xc.shape[0] > 1 and xc.size >= _PER_IMAGE_SIZE:     # image by image, cache-hot
                def compute(i, y_i):
                    y_i[...] = pooled(xc[i:i + 1])
                y = per_image(compute, (*xc.shape[:2], *out), xc.dtype)
            else:
                y = pooled(xc)
            return y.astype(dtype, copy=False)
        xp = _padded(xc, begin, end, extra, _lowest(xc.dtype))
        y, arg = _argmax_taps(xp, kernel, strides, dilations, out)
        return y.astype(dtype, copy=False), _flat_indices(arg, x.shape, kernel, strides, dilations, begin,
                                                          out, storage_order)
    return run


def _argmax_taps(xp, kernel, strides, dilations, out):
    """Max of each window and the row-major number of its first maximal tap. The taps come in
    increasing order, so "a later tap is strictly greater" is arg = max(arg, better * t)."""
    best = arg = better = None
    tap_type = np.min_scalar_type(math.prod(kernel) - 1)
    for t, tap in enumerate(np.ndindex(*kernel)):
        v = xp[(slice(None), slice(None)) + tuple(slice(a * dl, a * dl + (o - 1) * s + 1, s)
                                                  for a, dl, o, s in zip(tap, dilations, out, strides))]
        if best is None:
            best = v.copy()
            arg = memory.zeros(v.shape, dtype=tap_type)
            better = memory.empty(v.shape, dtype=bool)
            continue
        np.greater(v, best, out=better)
        np.maximum(best, v, out=best)
        np.maximum(arg, better * tap_type.type(t), out=arg)
    return best, arg


def _flat_indices(arg, x_shape, kernel, strides, dilations, begin, out, storage_order):
    """Input coordinates of the chosen taps -> flat indices into X (N, C, *spatial), the spatial part
    row major (storage_order 0) or column major (1): the window's start plus a per-tap offset."""
    n, c, *sizes = x_shape
    r = len(kernel)
    steps = [math.prod(sizes[:d]) if storage_order else math.prod(sizes[d + 1:]) for d in range(r)]
    offsets = np.zeros(kernel, dtype=np.int64)
    for d in range(r):
        shape = (1,) * d + (-1,) + (1,) * (r - 1 - d)
        offsets = offsets + (np.arange(kernel[d], dtype=np.int64) * dilations[d] * steps[d]).reshape(shape)
    flat = offsets.reshape(-1)[arg]
    flat += (np.arange(n * c, dtype=np.int64) * math.prod(sizes)).reshape((n, c) + (1,) * r)
    for d in range(r):
        start = (np.arange(out[d], dtype=np.int64) * strides[d] - begin[d]) * steps[d]
        flat += start.reshape((-1,) + (1,) * (r - 1 - d))
    # a window whose maximum is -inf may have picked a padding cell: keep every index inside X
    return np.clip(flat, 0, max(n * c * math.prod(sizes) - 1, 0), out=flat)


@kernel("MaxPool", since=1, heavy=True, views=True, rank="first")
def max_pool_1(*, kernel_shape, auto_pad="NOTSET", pads=None, strides=None):
    return _max_pool(kernel_shape, strides, pads, None, auto_pad, 0, 0, False)


@kernel("MaxPool", since=8, heavy=True, views=True, rank="first")
def max_pool_8(*, kernel_shape, auto_pad="NOTSET", pads=None, strides=None, storage_order=0, _n_outputs=1):
    run = _max_pool(kernel_shape, strides, pads, None, auto_pad, 0, storage_order, _n_outputs > 1)
    return run if _n_outputs > 1 else (lambda x: (run(x),))


@kernel("MaxPool", since=(10, 11, 12, 22), heavy=True, views=True, rank="first")
def max_pool_10(*, kernel_shape, auto_pad="NOTSET", pads=None, strides=None, storage_order=0, dilations=None,
                ceil_mode=0, _n_outputs=1):
    run = _max_pool(kernel_shape, strides, pads, dilations, auto_pad, ceil_mode, storage_order, _n_outputs > 1)
    return run if _n_outputs > 1 else (lambda x: (run(x),))


def max_pool_function(*, kernel_shape, strides=None, pads=None, dilations=None, auto_pad="NOTSET", ceil_mode=0):
    """run(x) -> MaxPool's Y (no indices) for these attributes (ops/fused.py's channels-last pool)."""
    return _max_pool(kernel_shape, strides, pads, dilations, auto_pad, ceil_mode, 0, False)


# -- AveragePool ----------------------------------------------------------------------------------

@functools.lru_cache(maxsize=512)
def _divisor(in_sizes, kernel, strides, dilations, begin, end, out, include_pad, dtype):
    """Number of counted cells per window, shape out (a 0-d array when every window counts the same),
    of the given dtype: the input's cells, plus the explicit/auto padding with count_include_pad."""
    per_axis = [inside.sum(axis=1).astype(np.float64) for inside in
                taps_inside(in_sizes, kernel, strides, dilations, begin, out, end if include_pad else None)]
    if all(np.all(a == a[0]) for a in per_axis):
        total = np.asarray(math.prod(a[0] for a in per_axis))
    else:
        total = per_axis[0]
        for a in per_axis[1:]:
            total = np.multiply.outer(total, a)
    total = total.astype(dtype)
    total.flags.writeable = False       # cached: shared by every call
    return total


@functools.lru_cache(maxsize=512)
def _divisor_laid_out(in_sizes, kernel, strides, dilations, begin, end, out, include_pad, dtype, shape, steps):
    """_divisor placed where _box's buffer of spatial shape `shape` holds the windows (every
    steps[d]-th position from 0 along axis d), ones elsewhere; 0-d when every window counts the same."""
    div = _divisor(in_sizes, kernel, strides, dilations, begin, end, out, include_pad, dtype)
    if div.ndim == 0:
        return div
    full = np.ones(shape, dtype=dtype)
    full[tuple(slice(0, (o - 1) * st + 1, st) for o, st in zip(out, steps))] = div
    full.flags.writeable = False
    return full


def _average_pool(kernel_shape, strides, pads, dilations, auto_pad, ceil_mode, count_include_pad):
    auto_pad, kernel, strides, pads, dilations = _check_attrs(kernel_shape, strides, pads, dilations, auto_pad)
    ceil_mode, include_pad = bool(ceil_mode), bool(count_include_pad)

    def run(x):
        in_sizes = _spatial(x, kernel)
        begin, end, extra, out = _layout(in_sizes, kernel, strides, dilations, pads, auto_pad, ceil_mode)
        dtype = x.dtype
        xc = x.astype(np.float32) if dtype in UPCAST else x
        if _one_window(in_sizes, kernel, dilations, begin, end, extra):
            y = np.add.reduce(xc, axis=tuple(range(2, xc.ndim)), keepdims=True)
            y /= math.prod(kernel)
            return y.astype(dtype, copy=False)
        key = (in_sizes, kernel, strides, dilations, begin, end, out, include_pad, xc.dtype)
        direct = _direct_plan(in_sizes, kernel, strides, dilations, begin, extra, out, _DIRECT_MIN_STRIDE,
                              _DIRECT_PADDED_ONLY)
        if direct is not None:
            total = _box_direct(xc, np.add, direct, out)
            with np.errstate(invalid="ignore", divide="ignore"):
                if np.may_share_memory(total, xc):              # 1-sized kernels: a view of X
                    y = as_array(total / _divisor(*key))
                else:
                    y = np.divide(total, _divisor(*key), out=total)
            return y.astype(dtype, copy=False)
        total, crop = _box(_padded(xc, begin, end, extra, 0), np.add, kernel, strides, dilations, out)
        with np.errstate(invalid="ignore", divide="ignore"):   # a window of padding only: NaN
            if np.may_share_memory(total, xc):                  # 1-sized kernels: a view of X
                y = as_array(total[crop] / _divisor(*key))
            else:       # divided in place over the whole buffer (long inner loops), then cropped
                np.divide(total, _divisor_laid_out(*key, total.shape[2:], tuple(c.step or 1 for c in crop[2:])),
                          out=total)
                y = total[crop]
        return y.astype(dtype, copy=False)
    return run


def average_pool_function(*, kernel_shape, strides=None, pads=None, dilations=None, auto_pad="NOTSET", ceil_mode=0,
                          count_include_pad=0):
    """run(x) -> AveragePool's Y for these attributes (ops/fused.py's channels-last pool)."""
    return _average_pool(kernel_shape, strides, pads, dilations, auto_pad, ceil_mode, count_include_pad)


@kernel("AveragePool", since=1, heavy=True, rank="first")
def average_pool_1(*, kernel_shape, auto_pad="NOTSET", pads=None, strides=None):
    return _average_pool(kernel_shape, strides, pads, None, auto_pad, 0, 0)


@kernel("AveragePool", since=7, heavy=True, rank="first")
def average_pool_7(*, kernel_shape, auto_pad="NOTSET", pads=None, strides=None, count_include_pad=0):
    return _average_pool(kernel_shape, strides, pads, None, auto_pad, 0, count_include_pad)


@kernel("AveragePool", since=(10, 11), heavy=True, rank="first")
def average_pool_10(*, kernel_shape, auto_pad="NOTSET", pads=None, strides=None, count_include_pad=0,
                    ceil_mode=0):
    return _average_pool(kernel_shape, strides, pads, None, auto_pad, ceil_mode, count_include_pad)


@kernel("AveragePool", since=(19, 22), heavy=True, rank="first")
def average_pool_19(*, kernel_shape, auto_pad="NOTSET", pads=None, strides=None, count_include_pad=0,
                    ceil_mode=0, dilations=None):
    return _average_pool(kernel_shape, strides, pads, dilations, auto_pad, ceil_mode, count_include_pad)


# -- LpPool ---------------------------------------------------------------------------------------

def _powered(p):
    """(|x|^p, root) for the Lp norm: exact shortcuts for p = 1 and 2."""
    if p == 1:
        return np.abs, (lambda s: s)
    if p == 2:
        return (lambda x: x * x), np.sqrt
    return (lambda x: np.power(np.abs(x), x.dtype.type(p))), (lambda s: np.power(s, s.dtype.type(1 / p)))


def _lp_pool(kernel_shape, strides, pads, dilations, auto_pad, ceil_mode, p):
    auto_pad, kernel, strides, pads, dilations = _check_attrs(kernel_shape, strides, pads, dilations, auto_pad)
    ceil_mode = bool(ceil_mode)
    power, root = _powered(p)

    def run(x):
        in_sizes = _spatial(x, kernel)
        begin, end, extra, out = _layout(in_sizes, kernel, strides, dilations, pads, auto_pad, ceil_mode)
        dtype = x.dtype
        xc = x.astype(np.float32) if dtype in UPCAST else x
        total, crop = _box(_padded(power(xc), begin, end, extra, 0), np.add, kernel, strides, dilations, out)
        return as_array(root(total[crop])).astype(dtype, copy=False)
    return run


@kernel("LpPool", since=(1, 2, 11), heavy=True, rank="first")
def lp_pool_1(*, kernel_shape, auto_pad="NOTSET", pads=None, strides=None, p=2):
    return _lp_pool(kernel_shape, strides, pads, None, auto_pad, 0, p)


@kernel("LpPool", since=(18, 22), heavy=True, rank="first")
def lp_pool_18(*, kernel_shape, auto_pad="NOTSET", pads=None, strides=None, p=2, ceil_mode=0, dilations=None):
    return _lp_pool(kernel_shape, strides, pads, dilations, auto_pad, ceil_mode, p)


# -- GlobalAveragePool, GlobalMaxPool, GlobalLpPool ---------------------------------------------

def _global(reduce):
    """Reduce over every spatial axis (2..), keeping them as 1s; float16/bfloat16 via float32."""
    def run(x):
        if x.ndim < 2:
            raise InvalidValueError(f"X of shape {list(x.shape)} must have rank >= 2 (N, C, spatial...)")
        axes = tuple(range(2, x.ndim))
        dtype = x.dtype
        xc = x.astype(np.float32) if dtype in UPCAST else x
        return np.asarray(reduce(xc, axes)).astype(dtype, copy=False)
    return run


@kernel("GlobalAveragePool", since=(1, 22), rank="first")
def global_average_pool_1():
    return _global(lambda x, axes: np.mean(x, axis=axes, keepdims=True))


@kernel("GlobalMaxPool", since=(1, 22), rank="first")
def global_max_pool_1():
    return _global(lambda x, axes: np.max(x, axis=axes, keepdims=True))


@kernel("GlobalLpPool", since=(1, 2, 22))
def global_lp_pool_1(*, p=2):
    power, root = _powered(p)
    return _global(lambda x, axes: root(np.sum(power(x), axis=axes, keepdims=True)))


# -- MaxUnpool ------------------------------------------------------------------------------------

@kernel("MaxUnpool", since=(9, 11, 22))
def max_unpool_9(*, kernel_shape, pads=None, strides=None):
    _, kernel, strides, pads, _ = _check_attrs(kernel_shape, strides, pads, None, "NOTSET", ("strides",))
    r = len(kernel)
    pads = pads or (0,) * (2 * r)

    def run(x, i, output_shape=None):
        _spatial(x, kernel)
        if i.shape != x.shape:
            raise InvalidValueError(f"I of shape {list(i.shape)} must have X's shape {list(x.shape)}")
        if i.dtype != np.int64:
            raise InvalidValueError(f"I must be int64, got {i.dtype}")
        inferred = x.shape[:2] + tuple((n - 1) * s - pads[d] - pads[r + d] + k
                                       for d, (n, s, k) in enumerate(zip(x.shape[2:], strides, kernel)))
        if min(inferred) < 0:
            raise InvalidValueError(f"the unpooled shape {list(inferred)} is negative")
        shape = inferred
        if output_shape is not None:
            shape = tuple(int(v) for v in output_shape.reshape(-1))
            if len(shape) != x.ndim or shape[:2] != x.shape[:2] or min(shape) < 0:
                raise InvalidValueError(f"output_shape {list(shape)} must be (N, C, spatial...) with X's N, C "
                                        f"{list(x.shape[:2])}")
        flat = i.reshape(-1)
        size = math.prod(inferred)
        if flat.size and (flat.min() < 0 or flat.max() >= size):
            # indices of a MaxPool over an input of shape output_shape (what PyTorch exports)
            if shape == inferred or flat.min() < 0 or flat.max() >= math.prod(shape):
                raise InvalidValueError(f"indices must be in [0, {max(size, math.prod(shape)) - 1}], "
                                        f"got values in [{flat.min()}, {flat.max()}]")
            y = np.zeros(math.prod(shape), dtype=x.dtype)
            y[flat] = x.reshape(-1)
            return y.reshape(shape)
        # indices into the inferred shape; its cells keep their coordinates inside output_shape
        y = np.zeros(size, dtype=x.dtype)
        y[flat] = x.reshape(-1)
        y = y.reshape(inferred)
        if shape == inferred:
            return y
        res = np.zeros(shape, dtype=x.dtype)
        common = tuple(slice(0, min(a, b)) for a, b in zip(shape, inferred))
        res[common] = y[common]
        return res
    return run


# -- MaxRoiPool -----------------------------------------------------------------------------------

@kernel("MaxRoiPool", since=(1, 22))
def max_roi_pool_1(*, pooled_shape, spatial_scale=1.0):
    if len(pooled_shape) != 2 or min(pooled_shape) < 1:
        raise ValueError(f"pooled_shape must be 2 positive sizes (height, width), got {list(pooled_shape)}")
    ph, pw = (int(v) for v in pooled_shape)
    scale = float(spatial_scale)

    def run(x, rois):
        if x.ndim != 4:
            raise InvalidValueError(f"X of shape {list(x.shape)} must be 4-D (N, C, H, W)")
        if rois.ndim != 2 or rois.shape[1] != 5:
            raise InvalidValueError(f"rois of shape {list(rois.shape)} must be (num_rois, 5)")
        n, c, h, w = x.shape
        dtype = x.dtype
        xc = x.astype(np.float32) if dtype in UPCAST else x
        r = rois.astype(np.float64)
        batch = r[:, 0].astype(np.int64)
        if rois.shape[0] and (batch.min() < 0 or batch.max() >= n):
            raise InvalidValueError(f"roi batch indices must be in [0, {n - 1}], got {sorted(set(batch.tolist()))}")
        # Fast R-CNN RoI pooling: corners scaled to feature-map cells and rounded half away from zero
        x1, y1, x2, y2 = (np.sign(v) * np.floor(np.abs(v) * scale + 0.5) for v in r[:, 1:].T)
        y = np.zeros((rois.shape[0], c, ph, pw), dtype=xc.dtype)
        # one cell of -inf after each axis: every bin [start, end) is then a reduceat segment
        xp = pad_spatial(xc, (0, 0), (1, 1), _lowest(xc.dtype))
        for k in range(rois.shape[0]):
            hs, he = _bins(y1[k], y2[k], ph, h)
            ws, we = _bins(x1[k], x2[k], pw, w)
            if he.max() <= hs.min() or we.max() <= ws.min():
                continue
            lo, hi = hs.min(), he.max()
            rows = xp[batch[k], :, lo:hi + 1]                                              # (C, h', W + 1)
            t = np.maximum.reduceat(rows, np.stack([ws, we], 1).reshape(-1), axis=2)[:, :, ::2]
            m = np.maximum.reduceat(t, np.stack([hs, he], 1).reshape(-1) - lo, axis=1)[:, ::2]
            empty = (he <= hs)[:, None] | (we <= ws)[None, :]
            y[k] = np.where(empty, 0, m)
        return y.astype(dtype, copy=False)
    return run


def _bins(start, end, pooled, size):
    """[start, end) cells of each of the `pooled` bins dividing the roi [start, end] (inclusive)
    of an axis of `size` cells, clipped to the axis."""
    length = max(end - start + 1, 1)
    step = length / pooled
    p = np.arange(pooled)
    lo = np.clip(np.floor(p * step) + start, 0, size).astype(np.int64)
    hi = np.clip(np.ceil((p + 1) * step) + start, 0, size).astype(np.int64)
    return lo, hi
