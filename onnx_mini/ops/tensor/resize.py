"""Resize (10, 11, 13, 18, 19) and Upsample (1, 7, 9, 10): separable, vectorised interpolation.

Each resized axis is handled on its own: for every output coordinate the spec's
coordinate_transformation_mode gives x_original, and from it a small table of input indices and
weights (`_taps`): one tap for nearest, two for linear, four for cubic, more when antialiasing
stretches the filter. The axis is then resized by K `take`s weighted and summed, never by a Python
loop over output pixels. Indices outside the input are clamped (edge values); exclude_outside gives
them weight 0 and renormalises; tf_crop_and_resize puts extrapolation_value wherever any coordinate
falls outside the input.
"""
from __future__ import annotations

import itertools
import math

import numpy as np

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
    cfg = _Config(mode, "asymmetric", "floor", -0.75, 0, 0.0, 0, None, "stretch", {"asymmetric"},
                  legacy_nearest=True)
    return lambda x, scales: _resize(cfg, x, None, scales, None)


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
    cfg = _Config(*args)

    def resize(x, roi=None, scales=None, sizes=None):
        return _resize(cfg, x, roi, scales, sizes)
    return resize


@kernel("Upsample", since=1)
def upsample_1(*, height_scale, width_scale, mode="nearest"):
    cfg = _Config(mode, "asymmetric", "floor", -0.75, 0, 0.0, 0, None, "stretch", {"asymmetric"},
                  legacy_nearest=True)
    scales = np.array([1.0, 1.0, height_scale, width_scale])

    def upsample(x):
        if x.ndim != 4:
            raise InvalidValueError(f"Upsample-1 takes a 4-D (N, C, H, W) input, got shape {list(x.shape)}")
        return _resize(cfg, x, None, scales, None)
    return upsample


@kernel("Upsample", since=7)
def upsample_7(*, scales, mode="nearest"):
    cfg = _Config(mode, "asymmetric", "floor", -0.75, 0, 0.0, 0, None, "stretch", {"asymmetric"},
                  legacy_nearest=True)
    fixed = np.array(scales, dtype=np.float64)
    return lambda x: _resize(cfg, x, None, fixed, None)


@kernel("Upsample", since=(9, 10))
def upsample_9(*, mode="nearest"):
    cfg = _Config(mode, "asymmetric", "floor", -0.75, 0, 0.0, 0, None, "stretch", {"asymmetric"},
                  legacy_nearest=True)
    return lambda x, scales: _resize(cfg, x, None, scales, None)


# -- the computation ------------------------------------------------------------------------------

def _resize(cfg: _Config, x: np.ndarray, roi, scales, sizes) -> np.ndarray:
    r = x.ndim
    axes = list(range(r)) if cfg.axes is None else [normalize_axis(a, r, "axes entry") for a in cfg.axes]
    if len(set(axes)) != len(axes):
        raise InvalidValueError(f"axes {list(cfg.axes)} has duplicates")
    n = len(axes)
    have_scales = scales is not None and scales.size > 0
    have_sizes = sizes is not None and sizes.size > 0
    if have_scales == have_sizes:
        raise InvalidValueError("exactly one of 'scales' and 'sizes' must be given"
                                + (" (both are)" if have_scales else " (neither is)"))
    in_shape = [x.shape[a] for a in axes]
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
    check_shape([int(out[axes.index(a)]) if a in axes else d for a, d in enumerate(x.shape)],
                np.float64 if cfg.mode != "nearest" else x.dtype)

    interpolate = cfg.mode != "nearest"
    if interpolate and (x.dtype == object or x.dtype == np.bool_):
        raise InvalidValueError(f"mode {cfg.mode!r} needs a numeric input, got {x.dtype}")
    dtype = x.dtype
    work = x
    if interpolate:
        work = x.astype(np.float32) if dtype in UPCAST else x.astype(np.float64) if dtype.kind in "iub" else x
    outside_masks = []
    resized = [k for k, a in enumerate(axes)
               if not (out[k] == in_shape[k] and scale[k] == 1 and cfg.coord not in ("tf_crop_and_resize",
                                                                                    "tf_half_pixel_for_nn"))]
    for k in _cheapest_order(x.shape, axes, resized, out):     # the others are the identity in every mode
        a = axes[k]
        xo = _original_coords(cfg, int(out[k]), in_shape[k], scale[k], out_f[k], starts[k], ends[k])
        outside = None
        if cfg.coord == "tf_crop_and_resize":
            outside = (xo < 0) | (xo > in_shape[k] - 1)
            if outside.any():
                shape = [1] * r
                shape[a] = out[k]
                outside_masks.append(outside.reshape(shape))
        if in_shape[k] == 0:
            if out[k]:
                raise InvalidValueError(f"cannot resize an empty axis {a} to size {out[k]}")
            continue
        idx, w = _taps(cfg, xo, in_shape[k], scale[k])
        work = _apply_axis(work, a, idx, w)
    if outside_masks:
        mask = outside_masks[0]
        for m in outside_masks[1:]:
            mask = mask | m
        work = np.where(mask, np.asarray(cfg.extrapolation, dtype=work.dtype if interpolate else dtype), work)
    if work is x:
        return x
    if interpolate and dtype != work.dtype:
        if dtype.kind in "iu":
            info = np.iinfo(dtype)
            work = np.clip(np.rint(work), info.min, info.max)
        return work.astype(dtype)
    return work


def _cheapest_order(shape, axes, resized, out) -> list[int]:
    """The order in which to resize the axes `resized` (indices into axes): separable interpolation
    gives the same values in any order (up to rounding), but the cost of an axis is the size of the
    array it produces, and a gather along the last axis costs ~4x one along an outer axis (whole rows
    move). Resizing the last axis of a 2x upsample first, while the array is small: 32x64x64 -> 128x128
    linear 1.5 -> 0.8 ms. Up to 4 resized axes try every order; more keep the given one."""
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


def _apply_axis(x: np.ndarray, axis: int, idx: np.ndarray, w: np.ndarray | None) -> np.ndarray:
    wt = None if w is None else w.astype(x.dtype if x.dtype.kind in "fc" else np.float64)
    period = _periodic_taps(idx, wt, x.shape[axis]) if axis == x.ndim - 1 else None
    if period is not None:
        return _apply_periodic(x, axis, *period)
    if w is None:
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
        out = np.zeros(shape_out, dtype=x.dtype)
    return out


# -- integer-factor upsampling --------------------------------------------------------------------
# With out = f * n and taps that repeat with period f (every integer factor in the modes whose
# x_original is an affine function with slope 1/f: half_pixel, asymmetric, pytorch_half_pixel, ...;
# not align_corners, whose slope is (n - 1) / (f n - 1)), output m * f + r reads the inputs m + d[r, k]
# (clamped) with the weights w[r, k] for every m. Each phase r is then K products of shifted slices of
# the edge-padded input (each distinct weight's product computed once), added into a strided view of
# the output: the same products summed in the same order as the gathers of _apply_axis, so the same
# bits. Only for the last axis, where a gather moves single values: Resize 32x64x64 -> 32x128x128
# linear 2.2 -> 1.4 ms, cubic 4.5 -> 3.3, nearest 0.47 -> 0.38; on the next axis out too: a tie for
# linear and cubic (1.39, 3.35 ms), nearest 2x slower there (a gather of whole rows is one copy)
# (loaded machine, tuned malloc).

def _periodic_taps(idx: np.ndarray, w: np.ndarray | None, n: int):
    """(f, offsets d (f, K), weights (f, K) or None) when the taps repeat with period f; else None."""
    out, k = idx.shape
    if n == 0 or out % n or (w is not None and not w.any()):
        return None
    f = out // n
    mid = n // 2
    d = idx[mid * f:(mid + 1) * f] - mid
    expected = np.clip(np.arange(n)[:, None, None] + d, 0, n - 1)
    if not np.array_equal(idx.reshape(n, f, k), expected):
        return None
    if w is not None:
        w0 = w[mid * f:(mid + 1) * f]
        if not np.array_equal(w.reshape(n, f, k), np.broadcast_to(w0, (n, f, k))):
            return None
        used = w0.any(axis=0)            # _apply_axis skips a tap only where it weighs 0 in every output
        return f, d[:, used], w0[:, used]
    return f, d, None


def _apply_periodic(x: np.ndarray, axis: int, f: int, d: np.ndarray, w: np.ndarray | None) -> np.ndarray:
    n = x.shape[axis]
    pad = int(max(0, -d.min(), d.max()))
    if pad:
        lead, tail = (np.take(x, [i], axis=axis) for i in (0, n - 1))
        x = np.concatenate([lead] * pad + [x] + [tail] * pad, axis=axis)
    before = (slice(None),) * axis
    out = np.empty(x.shape[:axis] + (n, f) + x.shape[axis + 1:], dtype=x.dtype)
    products = {}       # x * weight, once per distinct weight: phases share them (0.25 and 0.75 for linear 2x)
    for r in range(f):
        dest = out[before + (slice(None), r)]
        for k in range(d.shape[1]):
            src = before + (slice(pad + d[r, k], pad + d[r, k] + n),)
            if w is None:
                dest[...] = x[src]
                continue
            wk = w[r, k]
            if wk.tobytes() not in products:
                products[wk.tobytes()] = x * wk
            term = products[wk.tobytes()][src]
            if k == 0:
                first = term
                if d.shape[1] == 1:
                    dest[...] = term
            elif k == 1:
                np.add(first, term, out=dest)     # one pass for the first two terms
            else:
                dest += term
    return out.reshape(x.shape[:axis] + (n * f,) + x.shape[axis + 1:])
