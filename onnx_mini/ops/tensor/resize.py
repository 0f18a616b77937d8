"""Resize (10, 11, 13, 18, 19) and Upsample (1, 7, 9, 10): separable, vectorised interpolation.

Each resized axis is handled on its own: for every output coordinate the spec's
coordinate_transformation_mode gives x_original, and from it a small table of input indices and
weights (`_taps`): one tap for nearest, two for linear, four for cubic, more when antialiasing
stretches the filter. The axis is then resized by K `take`s weighted and summed, never by a Python
loop over output pixels. Indices outside the input are clamped (edge values); exclude_outside gives
them weight 0 and renormalises; tf_crop_and_resize puts extrapolation_value wherever any coordinate
falls outside the input.

All of that depends on the input's shape and type and on roi/scales/sizes, not on X's values: each
node works it out once per such key (`_Geometry`, kept in the node's own small memo) and then only
moves data. Integer-factor upsampling, whose taps repeat with the factor, takes faster paths giving
the same bits as the gathers (the section at the end); FAST = False forces the gathers.
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from ... import memory
from ...errors import InvalidValueError
from ...registry import kernel
from .._common import UPCAST, check_shape, normalize_axis

_COORD_MODES = {"half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
                "tf_half_pixel_for_nn", "tf_crop_and_resize"}
_NEAREST_MODES = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"}


class _Config:
    """The attributes of one Resize node, checked once at prepare time."""

    def __init__(self, mode, coord, nearest, cubic_a, exclude_outside, extrapolation, antialias, axes, policy,
                 coord_modes, legacy_nearest=False):
        mode, coord, nearest, policy = (_text(v) for v in (mode, coord, nearest, policy))
        if mode == "bilinear":          # Upsample-1's name for it
            mode = "linear"
        if mode not in ("nearest", "linear", "cubic"):
            raise ValueError(f"unknown mode {mode!r}")
        if coord not in coord_modes:
            raise ValueError(f"coordinate_transformation_mode {coord!r} is not defined for this version "
                             f"(known: {', '.join(sorted(coord_modes))})")
        if nearest not in _NEAREST_MODES:
            raise ValueError(f"unknown nearest_mode {nearest!r}")
        if policy not in ("stretch", "not_larger", "not_smaller"):
            raise ValueError(f"unknown keep_aspect_ratio_policy {policy!r}")
        self.mode, self.coord, self.nearest = mode, coord, nearest
        self.cubic_a, self.exclude_outside = float(cubic_a), bool(exclude_outside)
        self.extrapolation, self.antialias = float(extrapolation), bool(antialias)
        self.axes = None if axes is None else tuple(int(a) for a in axes)
        self.policy = policy
        self.legacy_nearest = legacy_nearest   # Resize-10 / Upsample: asymmetric, rounded down


def _text(v):
    return v.decode() if isinstance(v, bytes) else v


# -- kernels --------------------------------------------------------------------------------------

@kernel("Resize", since=10, heavy=True, views=True)
def resize_10(*, mode="nearest"):
    resizer = _Resizer(_Config(mode, "asymmetric", "floor", -0.75, 0, 0.0, 0, None, "stretch", {"asymmetric"},
                               legacy_nearest=True))
    return lambda x, scales: resizer(x, None, scales, None)


@kernel("Resize", since=(11, 13), heavy=True, views=True)
def resize_11(*, mode="nearest", coordinate_transformation_mode="half_pixel", nearest_mode="round_prefer_floor",
              cubic_coeff_a=-0.75, exclude_outside=0, extrapolation_value=0.0):
    return _resize_fn(mode, coordinate_transformation_mode, nearest_mode, cubic_coeff_a, exclude_outside,
                      extrapolation_value, 0, None, "stretch", _COORD_MODES - {"half_pixel_symmetric"})


@kernel("Resize", since=(18, 19), heavy=True, views=True)
def resize_18(*, mode="nearest", coordinate_transformation_mode="half_pixel", nearest_mode="round_prefer_floor",
              cubic_coeff_a=-0.75, exclude_outside=0, extrapolation_value=0.0, antialias=0, axes=None,
              keep_aspect_ratio_policy="stretch"):
    return _resize_fn(mode, coordinate_transformation_mode, nearest_mode, cubic_coeff_a, exclude_outside,
                      extrapolation_value, antialias, axes, keep_aspect_ratio_policy,
                      _COORD_MODES - {"tf_half_pixel_for_nn"})


def _resize_fn(*args):
    resizer = _Resizer(_Config(*args))

    def resize(x, roi=None, scales=None, sizes=None):
        return resizer(x, roi, scales, sizes)
    return resize


@kernel("Upsample", since=1)
def upsample_1(*, height_scale, width_scale, mode="nearest"):
    resizer = _Resizer(_Config(mode, "asymmetric", "floor", -0.75, 0, 0.0, 0, None, "stretch", {"asymmetric"},
                               legacy_nearest=True))
    scales = np.array([1.0, 1.0, height_scale, width_scale])

    def upsample(x):
        if x.ndim != 4:
            raise InvalidValueError(f"Upsample-1 takes a 4-D (N, C, H, W) input, got shape {list(x.shape)}")
        return resizer(x, None, scales, None)
    return upsample


@kernel("Upsample", since=7)
def upsample_7(*, scales, mode="nearest"):
    resizer = _Resizer(_Config(mode, "asymmetric", "floor", -0.75, 0, 0.0, 0, None, "stretch", {"asymmetric"},
                               legacy_nearest=True))
    fixed = np.array(scales, dtype=np.float64)
    return lambda x: resizer(x, None, fixed, None)


@kernel("Upsample", since=(9, 10))
def upsample_9(*, mode="nearest"):
    resizer = _Resizer(_Config(mode, "asymmetric", "floor", -0.75, 0, 0.0, 0, None, "stretch", {"asymmetric"},
                               legacy_nearest=True))
    return lambda x, scales: resizer(x, None, scales, None)


# -- the computation ------------------------------------------------------------------------------

FAST = True             # False: every axis by the plain gathers (tests compare the fast paths with them)
GEOMETRIES = 16         # input keys (shape, type, roi/scales/sizes) one node keeps the geometry of (bookkeeping)
# Where the integer-factor paths (section at the end) beat the gathers, by the values in the step's input
# (2x, single calls interleaved, loaded machine):
FAST_MIN_LAST = 4096    # the last axis: at 8192 they took 0.48 (nearest), 0.71 (linear), 0.89 (cubic) of the
                        # gathers' time, 0.2-0.4 from 65536 on; at 1024 1.8, 1.25, 1.35 (numpy calls' overhead)
FAST_MIN_OUTER = 65536  # an outer axis, linear only: 0.95 at 65536, 0.2-0.85 at 262144 and more, 1.13 at 16384
                        # (nearest: np.repeat took 1.1-2x a gather of whole rows; cubic's 4 products a tie)


class _Resizer:
    """One node's resize: its attributes and its own memo of geometries by input key."""

    def __init__(self, cfg: _Config):
        self.cfg = cfg
        self.memo: dict = {}

    def __call__(self, x, roi, scales, sizes):
        key = (x.shape, x.dtype, _key(roi), _key(scales), _key(sizes))
        geo = self.memo.get(key)
        if geo is None:
            geo = _geometry(self.cfg, x.shape, x.dtype, roi, scales, sizes)
            if len(self.memo) >= GEOMETRIES:
                self.memo.clear()
            self.memo[key] = geo
        return _run(geo, x, FAST)


def _key(v):
    """A small input's value as a dict key (roi, scales, sizes: a few numbers)."""
    if v is None:
        return None
    v = np.asarray(v)
    return v.dtype.str, v.shape, v.tobytes()


class _Step:
    """How one axis is resized: the taps (idx (out, K), weights in the work type or None) and the
    fast path they allow: "repeat" or "periodic" by `period` (a _Periodic), or None."""
    __slots__ = ("axis", "idx", "w", "fast", "period")

    def __init__(self, axis, idx, w, fast, period):
        self.axis, self.idx, self.w, self.fast, self.period = axis, idx, w, fast, period


class _Geometry:
    """Everything of one input key but X's values: the steps in order, the type computed in, and
    the tf_crop_and_resize mask with the value put there (or None)."""
    __slots__ = ("steps", "mask", "work_dtype", "extrapolation")

    def __init__(self, steps, mask, work_dtype, extrapolation):
        self.steps, self.mask, self.work_dtype, self.extrapolation = steps, mask, work_dtype, extrapolation


def _geometry(cfg: _Config, shape: tuple, dtype: np.dtype, roi, scales, sizes) -> _Geometry:
    r = len(shape)
    axes = list(range(r)) if cfg.axes is None else [normalize_axis(a, r, "axes entry") for a in cfg.axes]
    if len(set(axes)) != len(axes):
        raise InvalidValueError(f"axes {list(cfg.axes)} has duplicates")
    n = len(axes)
    have_scales = scales is not None and scales.size > 0
    have_sizes = sizes is not None and sizes.size > 0
    if have_scales == have_sizes:
        raise InvalidValueError("exactly one of 'scales' and 'sizes' must be given"
                                + (" (both are)" if have_scales else " (neither is)"))
    in_shape = [shape[a] for a in axes]
    if have_scales:
        sc = np.asarray(scales, dtype=np.float64).reshape(-1)
        if sc.size != n:
            raise InvalidValueError(f"scales has {sc.size} values, {n} expected (one per resized axis)")
        if (sc <= 0).any() or not np.isfinite(sc).all():
            raise InvalidValueError(f"scales must be finite and > 0, got {sc.tolist()}")
    else:
        sz = np.asarray(sizes).reshape(-1)
        if sz.size != n:
            raise InvalidValueError(f"sizes has {sz.size} values, {n} expected (one per resized axis)")
        if (sz < 0).any():
            raise InvalidValueError(f"sizes must be >= 0, got {sz.tolist()}")
        sz = sz.astype(np.int64)

    starts, ends = np.zeros(n), np.ones(n)
    if cfg.coord == "tf_crop_and_resize":
        if roi is None or roi.size == 0:
            raise InvalidValueError("coordinate_transformation_mode 'tf_crop_and_resize' needs the 'roi' input")
        rv = np.asarray(roi, dtype=np.float64).reshape(-1)
        if rv.size != 2 * n:
            raise InvalidValueError(f"roi has {rv.size} values, {2 * n} expected ([starts..., ends...])")
        starts, ends = rv[:n], rv[n:]

    if have_scales:
        scale = sc
        out_f = np.array(in_shape, dtype=np.float64) * (ends - starts) * sc   # fractional output widths
        out = np.floor(out_f).astype(np.int64)
    else:
        if cfg.policy == "stretch":
            out = sz
            scale = np.array([o / i if i else 1.0 for o, i in zip(sz, in_shape)])
        else:
            ratios = [o / i for o, i in zip(sz, in_shape) if i]
            s = (min if cfg.policy == "not_larger" else max)(ratios) if ratios else 1.0
            scale = np.full(n, s)
            out = np.array([math.floor(s * i + 0.5) for i in in_shape], dtype=np.int64)   # round half up
        out_f = out.astype(np.float64)
    check_shape([int(out[axes.index(a)]) if a in axes else d for a, d in enumerate(shape)],
                np.float64 if cfg.mode != "nearest" else dtype)

    interpolate = cfg.mode != "nearest"
    if interpolate and (dtype == object or dtype == np.bool_):
        raise InvalidValueError(f"mode {cfg.mode!r} needs a numeric input, got {dtype}")
    work_dtype = dtype
    if interpolate and dtype in UPCAST:
        work_dtype = np.dtype(np.float32)
    elif interpolate and dtype.kind in "iub":
        work_dtype = np.dtype(np.float64)
    outside_masks, steps = [], []
    resized = [k for k, a in enumerate(axes)
               if not (out[k] == in_shape[k] and scale[k] == 1 and cfg.coord not in ("tf_crop_and_resize",
                                                                                    "tf_half_pixel_for_nn"))]
    size = list(shape)          # the array's shape as the steps go
    for k in _cheapest_order(shape, axes, resized, out):     # the others are the identity in every mode
        a = axes[k]
        xo = _original_coords(cfg, int(out[k]), in_shape[k], scale[k], out_f[k], starts[k], ends[k])
        if cfg.coord == "tf_crop_and_resize":
            outside = (xo < 0) | (xo > in_shape[k] - 1)
            if outside.any():
                mask_shape = [1] * r
                mask_shape[a] = out[k]
                outside_masks.append(outside.reshape(mask_shape))
        if in_shape[k] == 0:
            if out[k]:
                raise InvalidValueError(f"cannot resize an empty axis {a} to size {out[k]}")
            continue
        idx, w = _taps(cfg, xo, in_shape[k], scale[k])
        wt = None if w is None else w.astype(work_dtype if work_dtype.kind in "fc" else np.float64)
        steps.append(_fast_step(a, r, idx, wt, in_shape[k], math.prod(size)))
        size[a] = int(out[k])
    mask = extrapolation = None
    if outside_masks:
        mask = outside_masks[0]
        for m in outside_masks[1:]:
            mask = mask | m
        extrapolation = np.asarray(cfg.extrapolation, dtype=work_dtype)
    return _Geometry(steps, mask, work_dtype, extrapolation)


def _run(geo: _Geometry, x: np.ndarray, fast: bool) -> np.ndarray:
    work = x if x.dtype == geo.work_dtype else x.astype(geo.work_dtype)
    for step in geo.steps:
        if fast and step.fast == "repeat":
            work = _repeat(work, step.axis, step.period.f)
        elif fast and step.fast == "periodic":
            work = _apply_periodic(work, step.axis, step.period)
        else:
            work = _apply_axis(work, step.axis, step.idx, step.w)
    if geo.mask is not None:
        work = np.where(geo.mask, geo.extrapolation, work)
    if work is x:
        return x
    if x.dtype != work.dtype:
        if x.dtype.kind in "iu":
            info = np.iinfo(x.dtype)
            work = np.clip(np.rint(work), info.min, info.max)
        return work.astype(x.dtype)
    return work


def _cheapest_order(shape, axes, resized, out) -> list[int]:
    """The order in which to resize the axes `resized` (indices into axes): separable interpolation
    gives the same values in any order (up to rounding), but the cost of an axis is the size of the
    array it produces, and a gather along the last axis costs ~4x one along an outer axis (whole rows
    move). Resizing the last axis of a 2x upsample first, while the array is small: 32x64x64 -> 128x128
    linear 1.5 -> 0.8 ms. Up to 4 resized axes try every order; more keep the given one. The fast
    paths keep this order too, so that they give the bits of the gathers (the last axis first is
    also their cheaper order: its strided writes then touch the smaller array)."""
    if len(resized) < 2 or len(resized) > 4:
        return resized
    last = len(shape) - 1

    def cost(order):
        size, total = list(shape), 0
        for k in order:
            size[axes[k]] = int(out[k])
            total += math.prod(size) * (4 if axes[k] == last else 1)
        return total
    return min(itertools.permutations(resized), key=cost)


def _original_coords(cfg, out_len, in_len, scale, out_width, start, end) -> np.ndarray:
    """x_original for every output coordinate of one axis (float64), per coordinate_transformation_mode.

    length_resized in the spec's formulas is the output width before flooring (in * scale) when
    scales are given, as the official data has it; with sizes it is the size."""
    xr = np.arange(out_len, dtype=np.float64)
    mode = cfg.coord
    if mode == "half_pixel":
        return (xr + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        adjustment = out_len / out_width if out_width else 1.0
        offset = in_len / 2 * (1 - adjustment)
        return offset + (xr + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (xr + 0.5) / scale - 0.5 if out_width > 1 else np.zeros(out_len)
    if mode == "align_corners":
        return xr * (in_len - 1) / (out_width - 1) if out_width > 1 else np.zeros(out_len)
    if mode == "asymmetric":
        return xr / scale
    if mode == "tf_half_pixel_for_nn":
        return (xr + 0.5) / scale
    # tf_crop_and_resize
    if out_width > 1:
        return start * (in_len - 1) + xr * (end - start) * (in_len - 1) / (out_width - 1)
    return np.full(out_len, 0.5 * (start + end) * (in_len - 1))


def _taps(cfg: _Config, xo: np.ndarray, n: int, scale: float) -> tuple[np.ndarray, np.ndarray | None]:
    """Input indices (out, K) and weights (out, K) for one axis; weights None for nearest."""
    if cfg.mode == "nearest":
        if cfg.nearest == "round_prefer_floor":
            i = np.ceil(xo - 0.5)
        elif cfg.nearest == "round_prefer_ceil":
            i = np.floor(xo + 0.5)
        elif cfg.nearest == "floor":
            i = np.floor(xo)
        else:
            i = np.ceil(xo)
        return np.clip(i, 0, n - 1).astype(np.intp)[:, None], None
    stretch = max(1.0, 1.0 / scale) if cfg.antialias else 1.0
    support = (1.0 if cfg.mode == "linear" else 2.0) * stretch
    half = math.ceil(support)
    base = np.floor(xo)
    j = base[:, None] + np.arange(1 - half, half + 1, dtype=np.float64)    # every candidate tap
    dist = np.abs(j - xo[:, None]) / stretch
    if cfg.mode == "linear":
        w = np.maximum(0.0, 1.0 - dist)
    else:
        w = _cubic(dist, cfg.cubic_a)
    if cfg.exclude_outside:
        w[(j < 0) | (j > n - 1)] = 0.0
    total = w.sum(axis=1, keepdims=True)
    w = np.divide(w, total, out=np.zeros_like(w), where=total != 0)
    return np.clip(j, 0, n - 1).astype(np.intp), w


def _cubic(d: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic convolution kernel at distances d >= 0 (0 beyond 2)."""
    d2, d3 = d * d, d * d * d
    near = (a + 2) * d3 - (a + 3) * d2 + 1
    far = a * d3 - 5 * a * d2 + 8 * a * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


def _apply_axis(x: np.ndarray, axis: int, idx: np.ndarray, wt: np.ndarray | None) -> np.ndarray:
    """The general path: one gather per tap, weighted (weights already in x's type) and summed in tap
    order; a tap weighing 0 in every output is skipped."""
    if wt is None:
        return x.take(idx[:, 0], axis=axis)
    shape = [1] * x.ndim
    shape[axis] = idx.shape[0]
    out = None
    for k in range(idx.shape[1]):
        col = wt[:, k]
        if not col.any():
            continue
        term = x.take(idx[:, k], axis=axis)
        term *= col.reshape(shape)
        if out is None:
            out = term
        else:
            out += term
    if out is None:
        shape_out = list(x.shape)
        shape_out[axis] = idx.shape[0]
        out = memory.zeros(shape_out, dtype=x.dtype)
    return out


# -- integer-factor upsampling --------------------------------------------------------------------
# With out = f * n and taps that repeat with period f (every integer factor in the modes whose
# x_original is an affine function with slope 1/f: half_pixel, asymmetric, pytorch_half_pixel, ...;
# not align_corners, whose slope is (n - 1) / (f n - 1)), output m * f + r reads the inputs m + d[r, k]
# (clamped) with the weights w[r, k] for every m. The geometry detects this from the tap table itself.
# - nearest with d = 0 ("repeat": output i reads input i // f) only copies, so the same bits: one
#   integer multiply writing f copies of each value's bits side by side (when they fit in 8 bytes),
#   else np.repeat. On the last axis only: an outer one's gather moves whole rows.
# - otherwise ("periodic"): phase r is K products of shifted slices of the input (each distinct
#   weight's product computed once), summed into a strided view of the output; the few outputs whose
#   taps clamp at an edge take the gathers, restricted to them. The same float operations in the
#   same order as _apply_axis, so the same bits (a NaN from inf - inf or 0 * inf may come out with
#   the other sign: numpy's loops order a commutative add's operands differently).
# U-Net's nodes, old and new alternating in one process (loaded 2-core machine, tuned malloc): nearest
# 1x64x32x32 -> 64x64 0.46 -> 0.11 ms (the last axis by one multiply: np.repeat there took 0.18 ms
# for that step alone, the multiply 0.05; one broadcast copy of a view with new axes for both axes
# at once took 1.0 ms, its innermost loop running over the factor); linear half_pixel 1x32x64x64 ->
# 128x128 1.56 -> 0.90 ms. Thresholds: FAST_MIN_LAST and FAST_MIN_OUTER.

def _fast_step(axis: int, ndim: int, idx: np.ndarray, w: np.ndarray | None, n: int, size: int) -> _Step:
    """The step of one axis whose input has `size` values: which path (thresholds above)."""
    period = _periodic_taps(idx, w, n, axis, ndim)
    fast = None
    if period is not None and axis == ndim - 1 and size >= FAST_MIN_LAST:
        fast = "repeat" if w is None and not period.d.any() else "periodic"
    elif period is not None and w is not None and period.d.shape[1] <= 2 and size >= FAST_MIN_OUTER:
        fast = "periodic"
    return _Step(axis, idx, w, fast, period)


class _Periodic:
    """Taps repeating with period f along one axis, as slicing plans: `products` the distinct weights
    (None for nearest: x itself), `phases` per phase r (the output view [lo, hi) of phase r, [(product
    index or None, input slice of tap k)]), and the outputs whose taps clamp at an edge (`edge_at`,
    positions along the resized axis) with their taps' input indices (K, E) and weights (K, E, 1...)."""
    __slots__ = ("f", "d", "products", "phases", "edge_at", "edge_idx", "edge_w", "runs")


def _periodic_taps(idx: np.ndarray, w: np.ndarray | None, n: int, axis: int = 0, ndim: int = 1):
    """The _Periodic plan of an axis whose taps (idx, w) repeat with the period f, else None."""
    out, k = idx.shape
    if n == 0 or out % n or (w is not None and not w.any()):
        return None
    f = out // n
    mid = n // 2
    d = idx[mid * f:(mid + 1) * f] - mid
    expected = np.clip(np.arange(n)[:, None, None] + d, 0, n - 1)
    if not np.array_equal(idx.reshape(n, f, k), expected):
        return None
    used = np.ones(k, dtype=bool)
    if w is not None:
        w0 = w[mid * f:(mid + 1) * f]
        if not np.array_equal(w.reshape(n, f, k), np.broadcast_to(w0, (n, f, k))):
            return None
        used = w0.any(axis=0)            # _apply_axis skips a tap only where it weighs 0 in every output
    p = _Periodic()
    p.f, p.d = f, d[:, used]
    distinct = {} if w is not None else None
    lead = (slice(None),) * axis
    p.phases, edges, runs = [], [], []
    p.runs = runs           # per phase with inner outputs: (r, [(product index or None, tap offset)])
    for r in range(f):
        dr = p.d[r].tolist()
        lo, hi = max(0, -min(dr)), min(n, n - max(dr))
        if lo >= hi:
            lo = hi = 0
        edges += [m * f + r for m in range(lo)] + [m * f + r for m in range(hi, n)]
        if lo < hi:
            taps = []
            for kk, dk in zip(np.flatnonzero(used), dr):
                j = None if w is None else distinct.setdefault(w0[r, kk].tobytes(), (len(distinct), w0[r, kk]))[0]
                taps.append((j, lead + (slice(lo + dk, hi + dk),)))
            p.phases.append((lead + (slice(lo, hi), r), taps))
            runs.append((r, [(j, sl[-1].start - lo) for j, sl in taps]))
    p.products = None if w is None else [v for _, v in sorted(distinct.values(), key=lambda t: t[0])]
    p.edge_at = lead + (np.array(sorted(edges), dtype=np.intp),)
    at = p.edge_at[-1]
    p.edge_idx = idx[at][:, used].T.copy()
    p.edge_w = None if w is None else w[at][:, used].T.reshape(p.edge_idx.shape + (1,) * (ndim - 1 - axis)).copy()
    return p


def _apply_periodic(x: np.ndarray, axis: int, p: _Periodic) -> np.ndarray:
    """Resize one axis by its _Periodic plan: the float operations of _apply_axis, in its order."""
    n = x.shape[axis]
    out = memory.empty(x.shape[:axis] + (n, p.f) + x.shape[axis + 1:], dtype=x.dtype)
    products = None if p.products is None else [x * v for v in p.products]   # 0.25 x and 0.75 x for linear 2x
    if axis == x.ndim - 1 and x.ndim > 1 and x.flags.c_contiguous:
        _last_axis_runs(x, out, products, p)
        return out.reshape(x.shape[:axis] + (n * p.f,))
    for dest, taps in p.phases:
        if products is None:
            out[dest] = x[taps[0][1]]
        elif len(taps) == 1:
            out[dest] = products[taps[0][0]][taps[0][1]]
        else:
            view = out[dest]
            np.add(products[taps[0][0]][taps[0][1]], products[taps[1][0]][taps[1][1]], out=view)
            for j, src in taps[2:]:
                view += products[j][src]
    flat = out.reshape(x.shape[:axis] + (n * p.f,) + x.shape[axis + 1:])
    if p.edge_at[-1].size:       # the general path on the few outputs whose taps clamp
        acc = x.take(p.edge_idx[0], axis=axis)
        if p.edge_w is not None:
            acc *= p.edge_w[0]
            for i, wk in zip(p.edge_idx[1:], p.edge_w[1:]):
                term = x.take(i, axis=axis)
                term *= wk
                acc += term
        flat[p.edge_at] = acc
    return flat


def _last_axis_runs(x: np.ndarray, out: np.ndarray, products, p: _Periodic) -> None:
    """_apply_periodic's phases along the last axis of a contiguous x, each as one run over all rows at
    once: phase r's inner outputs read the flattened sources shifted by their taps' offsets (a row's
    first and last outputs then read a neighbouring row: those are the edge outputs, written after from
    views of x's columns, in the gathers' order). One long loop a phase, not one per row (U-Net's
    32x64x64 -> 64x128 linear half_pixel: 4096 loops of 63 values; the whole 2x Resize, old and new
    alternating: 795 -> 622 us, bit for bit)."""
    n, f = x.shape[-1], p.f
    total = x.size
    outs = out.reshape(total, f)
    sources = [x.reshape(-1)] if products is None else [v.reshape(-1) for v in products]
    for r, taps in p.runs:
        lo = max(0, -min(d for _, d in taps))
        hi = total - max(0, max(d for _, d in taps))
        dest = outs[lo:hi, r]
        (j0, d0), rest = taps[0], taps[1:]
        first = sources[j0 or 0][lo + d0:hi + d0]
        if not rest:
            dest[...] = first
            continue
        (j1, d1), rest = rest[0], rest[1:]
        np.add(first, sources[j1][lo + d1:hi + d1], out=dest)
        for j, d in rest:
            dest += sources[j][lo + d:hi + d]
    rows = out.reshape(-1, n * f)
    at = p.edge_at[-1]
    for e in range(at.size):        # the edge outputs, each a column of every row
        col = rows[:, at[e]]
        if p.edge_w is None:
            col[...] = x[..., p.edge_idx[0, e]].reshape(-1)
            continue
        np.multiply(x[..., p.edge_idx[0, e]].reshape(-1), p.edge_w[0, e], out=col)
        for k in range(1, p.edge_idx.shape[0]):
            col += x[..., p.edge_idx[k, e]].reshape(-1) * p.edge_w[k, e]


_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _repeat(x: np.ndarray, axis: int, f: int) -> np.ndarray:
    """np.repeat(x, f, axis), exactly (bit copies)."""
    size = x.dtype.itemsize
    if axis == x.ndim - 1 and size < 8 and size * f in (2, 4, 8) and not x.dtype.hasobject:
        # value v in the low lane of a wider unsigned integer times 1 + 2^b + 2^2b + ... (b bits a lane)
        # is f copies of v's bits, one a lane: no carry, v < 2^b
        wide = _UINT[size * f]
        lanes = memory.empty(x.shape, dtype=wide)
        lanes[...] = x.view(_UINT[size])
        lanes *= wide(sum(1 << (8 * size * i) for i in range(f)))
        return lanes.view(x.dtype)
    return np.repeat(x, f, axis=axis)
