"""Operators that cut, join or extend tensors: Concat, Split, Slice, Tile, Pad, CenterCropPad.

Split and Slice (and Pad/CenterCropPad when they only crop) return views of their input.
"""
from __future__ import annotations

import numpy as np

from ... import memory
from ...errors import InvalidValueError
from ...registry import kernel
from .._common import (MISSING, SHAPES_KEPT, by_shape, check_shape, constant_lists, int_list, normalize_axes,
                       normalize_axis, zero_of)


# -- Concat --------------------------------------------------------------------------------------

def concat(inputs: tuple, axis: int) -> np.ndarray:
    if not inputs:
        raise InvalidValueError("Concat needs at least one input")
    first = inputs[0]
    r = first.ndim
    a = axis if 0 <= axis < r else normalize_axis(axis, r)
    if len(inputs) == 1:
        return first
    dt = first.dtype
    for x in inputs:
        if x.dtype is not dt and x.dtype != dt:     # numpy would promote: the spec asks for one type
            raise _concat_error(inputs, a)
    try:        # the shapes checked by numpy, ours only on failure: 2 x [1, 1, 64] ~2.7 against ~4 us
        if first.nbytes * len(inputs) < memory.RECYCLE_MIN_BYTES:
            return np.concatenate(inputs, axis=a)
        shape = list(first.shape)       # large: into a recycled buffer (memory.py)
        shape[a] = sum(x.shape[a] for x in inputs)
        return np.concatenate(inputs, axis=a, out=memory.empty(shape, dt))
    except (ValueError, IndexError):                # (IndexError: an input of lower rank than the first)
        raise _concat_error(inputs, a) from None    # numpy refuses exactly the shapes the spec does


def _concat_error(inputs: tuple, a: int) -> InvalidValueError:
    """The error naming the first input that differs from input 0 in type or in shape outside axis a."""
    first = inputs[0]
    for k, x in enumerate(inputs[1:], 1):
        if x.dtype != first.dtype:
            return InvalidValueError(f"input {k} has type {x.dtype}, input 0 has {first.dtype}")
        if x.ndim != first.ndim or x.shape[:a] != first.shape[:a] or x.shape[a + 1:] != first.shape[a + 1:]:
            return InvalidValueError(f"input {k} of shape {list(x.shape)} does not match input 0 of shape "
                                     f"{list(first.shape)} outside axis {a}")
    return InvalidValueError(f"cannot concatenate inputs of shapes {[list(x.shape) for x in inputs]} on axis {a}")


@kernel("Concat", since=1, rank="first")
def concat_1(*, axis=1):
    return lambda *inputs: concat(inputs, axis)


@kernel("Concat", since=(4, 11, 13), rank="first")
def concat_4(*, axis):
    return lambda *inputs: concat(inputs, axis)


# -- Split ---------------------------------------------------------------------------------------

def split(x: np.ndarray, axis: int, sizes: list[int]) -> tuple:
    """Views of x cut along axis into consecutive parts of the given sizes."""
    return tuple(map(x.__getitem__, split_index(x.shape, axis, sizes)))


def split_index(shape: tuple, axis: int, sizes: list[int]) -> tuple:
    """The index of each part of an array of `shape` cut along axis into parts of the given sizes."""
    a = normalize_axis(axis, len(shape))
    lead = (slice(None),) * a
    out, start = [], 0
    for s in sizes:
        out.append(lead + (slice(start, start + s),))
        start += s
    return tuple(out)


def check_split(split_sizes: list[int], n: int, n_out: int) -> list[int]:
    if len(split_sizes) != n_out:
        raise InvalidValueError(f"split {split_sizes} has {len(split_sizes)} entries for {n_out} outputs")
    if min(split_sizes, default=0) < 0:
        raise InvalidValueError(f"split {split_sizes} has negative sizes")
    if sum(split_sizes) != n:
        raise InvalidValueError(f"split {split_sizes} sums to {sum(split_sizes)}, the split axis has size {n}")
    return split_sizes


def equal_split(n: int, n_out: int) -> list[int]:
    if n % n_out:
        raise InvalidValueError(f"the split axis of size {n} cannot be cut into {n_out} equal parts")
    return [n // n_out] * n_out


def _split_axis(shape: tuple, axis: int) -> int:
    if not shape:
        raise InvalidValueError("cannot split a 0-d tensor")
    return shape[normalize_axis(axis, len(shape))]


def _run_split(axis: int, n_out: int, fixed=None, constants=None):
    """Split with sizes from the `split` input (when given and not empty), else `fixed`, else equal."""
    def sizes_of(n, given):
        if given:
            return check_split(given, n, n_out)
        return equal_split(n, n_out) if fixed is None else check_split(fixed, n, n_out)

    def run(x, split_input=None):
        n = _split_axis(x.shape, axis)      # the axis is checked before the split input
        given = int_list(split_input, "split") if split_input is not None and split_input.size else None
        return split(x, axis, sizes_of(n, given))

    known = constant_lists(constants, (), (1,), {1: "split"})
    if known is None:
        return run
    (s0,), (given,) = known
    # A constant (or omitted) split input: the parts' indexes made once per input shape ([1, 192] in
    # three: ~1.1 against ~5.3 us a call, measured under load).
    parts = by_shape(lambda shape: split_index(shape, axis, sizes_of(_split_axis(shape, axis), given)))

    def run_fixed(x, split_input=None):
        if split_input is s0:       # a constant arrives as the very array the factory saw
            return tuple(map(x.__getitem__, parts(x.shape)))
        return run(x, split_input)
    return run_fixed


@kernel("Split", since=(1, 2, 11), views=True)
def split_1(*, axis=0, split=None, _n_outputs, _constants=None):
    return _run_split(axis, _n_outputs, None if split is None else list(split), _constants)


@kernel("Split", since=13, views=True)
def split_13(*, axis=0, _n_outputs, _constants=None):
    return _run_split(axis, _n_outputs, constants=_constants)


@kernel("Split", since=18, views=True)
def split_18(*, axis=0, num_outputs=None, _n_outputs, _constants=None):
    if num_outputs is None:
        return _run_split(axis, _n_outputs, constants=_constants)
    if num_outputs < 1:
        raise ValueError(f"num_outputs must be >= 1, got {num_outputs}")
    if num_outputs != _n_outputs:
        raise ValueError(f"num_outputs is {num_outputs} but the node has {_n_outputs} outputs")

    def sizes_of(shape):
        n = _split_axis(shape, axis)
        chunk = -(-n // num_outputs)      # ceil: every part but the last has this size
        last = n - chunk * (num_outputs - 1)
        if last < 0:
            raise InvalidValueError(f"an axis of size {n} cannot be split into {num_outputs} parts of size "
                                    f"{chunk} and a smaller last one")
        return [chunk] * (num_outputs - 1) + [last]

    parts = by_shape(lambda shape: split_index(shape, axis, sizes_of(shape)))

    def run(x, split_input=None):
        if split_input is not None:
            raise InvalidValueError("give either the 'split' input or the 'num_outputs' attribute, not both")
        return tuple(map(x.__getitem__, parts(x.shape)))
    return run


# -- Slice ---------------------------------------------------------------------------------------

def slice_of(dim: int, start: int, end: int, step: int) -> slice:
    """The spec's effective range: negatives count from the end, then clamp to [0, dim] (step > 0) or
    start to [0, dim-1] and end to [-1, dim-1] (step < 0); -1 as an end means "before index 0"."""
    if start < 0:
        start = max(start + dim, 0)
    if end < 0:
        end = max(end + dim, -1)
    if step > 0:
        return slice(start if start < dim else dim, (end if end < dim else dim) if end > 0 else 0, step)
    if start >= dim:
        start = dim - 1
    return slice(start, None if end < 0 else (end if end < dim else dim - 1), step)


def slice_index(shape: tuple, starts: list, ends: list, axes, steps) -> tuple | None:
    """The checked index of Slice on data of `shape` (None: the data itself, nothing is sliced)."""
    n = len(starts)
    if axes is None:
        axes = list(range(n))
    if steps is None:
        steps = [1] * n
    if not len(ends) == len(axes) == len(steps) == n:
        raise InvalidValueError(f"starts, ends, axes and steps must have the same length, got {len(starts)}, "
                                f"{len(ends)}, {len(axes)} and {len(steps)}")
    if not n:
        return None
    axes = normalize_axes(axes, len(shape))
    if 0 in steps:
        raise InvalidValueError(f"steps {steps} contain 0")
    index = [slice(None)] * len(shape)
    for a, s, e, st in zip(axes, starts, ends, steps):
        index[a] = slice_of(shape[a], s, e, st)
    return tuple(index)


def slice_tensor(data: np.ndarray, starts: list, ends: list, axes, steps) -> np.ndarray:
    index = slice_index(data.shape, starts, ends, axes, steps)
    return data if index is None else data[index]


@kernel("Slice", since=1, views=True, rank="first")
def slice_1(*, starts, ends, axes=None):
    starts, ends = list(starts), list(ends)
    axes = None if axes is None else list(axes)
    index = by_shape(lambda shape: slice_index(shape, starts, ends, axes, None))

    def run(data):
        i = index(data.shape)
        return data if i is None else data[i]
    return run


@kernel("Slice", since=(10, 11, 13), views=True, rank="first")
def slice_10(*, _constants=None):
    def run(data, starts, ends, axes=None, steps=None):
        return slice_tensor(data, int_list(starts, "starts"), int_list(ends, "ends"),
                            None if axes is None else int_list(axes, "axes"),
                            None if steps is None else int_list(steps, "steps"))

    # Constant starts/ends/axes/steps (as exporters write them): read once, the index made once per
    # input shape (the VAD's Slices: ~0.9 against ~6 us a call, measured under load).
    fixed = constant_lists(_constants, (1, 2), (3, 4), {1: "starts", 2: "ends", 3: "axes", 4: "steps"})
    if fixed is None:
        return run
    (s0, e0, a0, t0), lists = fixed
    index = by_shape(lambda shape: slice_index(shape, *lists))

    def run_fixed(data, starts, ends, axes=None, steps=None):
        # constant inputs arrive as the very arrays the factory saw (an omitted one as None)
        if starts is s0 and ends is e0 and axes is a0 and steps is t0:
            i = index(data.shape)
            return data if i is None else data[i]
        return run(data, starts, ends, axes, steps)
    return run_fixed


# -- Tile ----------------------------------------------------------------------------------------

def tile(x: np.ndarray, repeats: list[int]) -> np.ndarray:
    if len(repeats) != x.ndim:
        raise InvalidValueError(f"repeats {repeats} must have one entry per input dimension ({x.ndim})")
    if min(repeats, default=0) < 0:
        raise InvalidValueError(f"repeats {repeats} must be >= 0")
    # One copy: broadcast a (1, d0, 1, d1, ...) view to (r0, d0, r1, d1, ...) and merge the pairs.
    pairs = [v for d in x.shape for v in (1, d)]
    full = check_shape([v for r, d in zip(repeats, x.shape) for v in (r, d)], x.dtype)
    out = np.broadcast_to(x.reshape(pairs), full)
    return out.reshape([r * d for r, d in zip(repeats, x.shape)])


@kernel("Tile", since=1, views=True)
def tile_1():
    def run(x, tiles, axis):
        (t,) = int_list(tiles, "tiles")
        (a,) = int_list(axis, "axis")
        repeats = [1] * x.ndim
        repeats[normalize_axis(a, x.ndim)] = t
        return tile(x, repeats)
    return run


@kernel("Tile", since=(6, 13), views=True)
def tile_6():
    return lambda x, repeats: tile(x, int_list(repeats, "repeats"))


# -- Pad -----------------------------------------------------------------------------------------

def _check_mode(mode: str, modes: tuple) -> None:
    if mode not in modes:
        raise ValueError(f"mode {mode!r} is not supported (accepted: {', '.join(modes)})")


def pad(data: np.ndarray, pads: list[int], mode: str, value=None, axes=None, plans=None) -> np.ndarray:
    """Pad (positive pads) or crop (negative pads) each axis at both ends. Negative pads are applied
    first, as a crop; the modes then pad the cropped tensor (like onnxruntime). plans: a dict the
    calling kernel keeps, where the checked geometry of each (shape, pads, axes) seen is reused."""
    key = (data.shape, tuple(pads), mode, None if axes is None else tuple(axes))
    plan = None if plans is None else plans.get(key)
    if plan is None:
        plan = _pad_plan(data.shape, pads, mode, axes)
        if plans is not None:
            if len(plans) >= _PAD_PLANS:
                plans.clear()
            plans[key] = plan
    return apply_pad(data, plan, mode, value)


def apply_pad(data: np.ndarray, plan: tuple, mode: str, value) -> np.ndarray:
    """Pad's result from the geometry _pad_plan checked for data's shape."""
    crop, out_shape, inner, fills = plan
    if out_shape is None:                   # a view (of the kept part) either way
        return data[crop if crop is not None else ...]
    x = data[crop] if crop is not None else data
    check_shape(out_shape, x.dtype)
    if mode == "constant":
        out = np.full(out_shape, zero_of(x.dtype) if value is None else value, dtype=x.dtype)
        out[inner] = x
        return out
    if fills is None:
        # The spec's modes are numpy.pad's (its reflect example pads 2 on an axis of 2: numpy's
        # repeated mirroring when pads are not smaller than the axis).
        return np.pad(x, [(i.start, o - i.stop) for i, o in zip(inner, out_shape)], mode=mode)
    out = np.empty(out_shape, dtype=x.dtype)
    out[inner] = x
    for dst, src in fills:
        out[dst] = out[src]
    return out


_PAD_PLANS = 16     # input shapes / pads one Pad node keeps the plan of (bookkeeping, not a measurement)


def _pad_plan(shape, pads, mode, axes):
    """The checked geometry of Pad on `shape`: (the crop's index or None, the output shape or None
    when nothing is added, where the cropped data goes in it, the fills or None for np.pad).
    The fills are (destination, source) index pairs within the output, for reflect / edge / wrap
    pads within one copy of each axis: each axis's ends copied from the output itself, axis by axis
    (so the corners extend the ends already filled, as np.pad's do). Measured (kernel call, 2 cores
    under load): the VAD's reflect of [1, 1, 512] by 32 took 47 us through np.pad, 7 us so; a
    [1, 3, 224, 224] reflect by 3 149 -> 71 us."""
    r = len(shape)
    axes = list(range(r)) if axes is None else normalize_axes(axes, r)
    if len(pads) != 2 * len(axes):
        raise InvalidValueError(f"pads {list(pads)} must have 2 * {len(axes)} entries (begin and end of each axis)")
    begin, end = [0] * r, [0] * r
    for i, a in enumerate(axes):
        begin[a], end[a] = pads[i], pads[i + len(axes)]
    crop, sizes = [], []
    for a, (b, e, d) in enumerate(zip(begin, end, shape)):
        lo, hi = max(-b, 0), d - max(-e, 0)
        if hi < lo:
            raise InvalidValueError(f"pads {list(pads)} remove more than the {d} elements of axis {a}")
        crop.append(slice(lo, hi))
        sizes.append(hi - lo)
    crop = tuple(crop) if r and any(c.start or c.stop != d for c, d in zip(crop, shape)) else None
    widths = [(max(b, 0), max(e, 0)) for b, e in zip(begin, end)]
    if not any(b or e for b, e in widths):
        return crop, None, None, None
    out_shape = tuple(d + b + e for d, (b, e) in zip(sizes, widths))
    inner = tuple(slice(b, b + d) for d, (b, _) in zip(sizes, widths))
    if mode == "constant":
        return crop, out_shape, inner, None
    for a, ((b, e), d) in enumerate(zip(widths, sizes)):
        if (b or e) and d == 0:
            raise InvalidValueError(f"{mode} mode cannot pad axis {a}, which has no elements")
    reach = {"reflect": -1, "edge": None, "wrap": 0}[mode]     # the pad one copy covers: d + reach
    if reach is not None and any(max(b, e) > d + reach for (b, e), d in zip(widths, sizes)):
        return crop, out_shape, inner, None             # beyond one copy: np.pad repeats it
    fills = []
    for a, ((b, e), d) in enumerate(zip(widths, sizes)):
        lo, hi = b, b + d                               # the axis's data in the output
        def at(sl, a=a):       # axes before a already padded, axes after it only their data so far
            return (slice(None),) * a + (sl,) + inner[a + 1:]
        if mode == "reflect":  # mirrored about the first / last element, which is not repeated
            src_b = slice(lo + b, lo, -1)
            src_e = slice(hi - 2, hi - 2 - e if hi - 2 - e >= 0 else None, -1)
        elif mode == "edge":
            src_b, src_e = slice(lo, lo + 1), slice(hi - 1, hi)
        else:                  # wrap
            src_b, src_e = slice(hi - b, hi), slice(lo, lo + e)
        if b:
            fills.append((at(slice(0, lo)), at(src_b)))
        if e:
            fills.append((at(slice(hi, hi + e)), at(src_e)))
    return crop, out_shape, inner, tuple(fills)


def _constant_value(value, dtype: np.dtype):
    if value is None:
        return None
    if value.size != 1:
        raise InvalidValueError(f"constant_value must be a scalar, got shape {list(value.shape)}")
    if value.dtype != dtype:
        raise InvalidValueError(f"constant_value has type {value.dtype}, data has {dtype}")
    return value.reshape(())


@kernel("Pad", since=1, views=True)
def pad_1(*, paddings, mode="constant", value=0.0):
    # `paddings` is laid out like Pad-2's `pads`, [x1_begin, x2_begin, ..., x1_end, x2_end, ...], as the
    # attribute's text says (onnx PR #268); the doc example [0, 0, 2, 0] predates that layout.
    _check_mode(mode, ("constant", "reflect", "edge"))
    paddings = list(paddings)
    plan = by_shape(lambda shape: _pad_plan(shape, paddings, mode, None))
    return lambda data: apply_pad(data, plan(data.shape), mode, value)


@kernel("Pad", since=2, views=True)
def pad_2(*, pads, mode="constant", value=0.0):
    return pad_1(paddings=pads, mode=mode, value=value)


@kernel("Pad", since=(11, 13), views=True)
def pad_11(*, mode="constant", _constants=None):
    return _pad_axes(mode, ("constant", "reflect", "edge"), _constants)     # Pad-11 has no axes input


@kernel("Pad", since=(18, 19, 21, 23, 24, 25), views=True)
def pad_18(*, mode="constant", _version, _constants=None):
    modes = ("constant", "reflect", "edge") + (("wrap",) if _version >= 19 else ())
    return _pad_axes(mode, modes, _constants)


def _pad_axes(mode: str, modes: tuple, constants=None):
    _check_mode(mode, modes)
    plans = {}

    def run(data, pads, constant_value=None, axes=None):
        return pad(data, int_list(pads, "pads"), mode, _constant_value(constant_value, data.dtype),
                   None if axes is None else int_list(axes, "axes"), plans=plans)

    # Constant pads/axes (and constant_value): the geometry made once per input shape (the VAD's
    # reflect of [1, 1, 512] by 64: ~4.3 against ~5.8 us a call, measured under load).
    fixed = constant_lists(constants, (1,), (3,), {1: "pads", 3: "axes"})
    if fixed is None:
        return run
    (p0, a0), (pads, axes) = fixed
    v0 = (constants or {}).get(2)       # None: omitted or fed
    plan = by_shape(lambda shape: _pad_plan(shape, pads, mode, axes))
    values: dict = {}                   # constant_value checked for each data type seen

    def run_fixed(data, pads, constant_value=None, axes=None):
        # constant inputs arrive as the very arrays the factory saw (an omitted one as None)
        if pads is p0 and axes is a0 and constant_value is v0:
            dt = data.dtype
            value = values.get(dt, MISSING)
            if value is MISSING:
                value = _constant_value(v0, dt)
                if len(values) < SHAPES_KEPT:
                    values[dt] = value
            return apply_pad(data, plan(data.shape), mode, value)
        return run(data, pads, constant_value, axes)
    return run_fixed


# -- CenterCropPad -------------------------------------------------------------------------------

def center_crop_pad(x: np.ndarray, shape: list[int], axes) -> np.ndarray:
    """Crop each listed axis to a centred window (start rounded down) or zero-pad it to the target
    size (the odd extra element on the right). A view when nothing is padded."""
    axes = list(range(x.ndim)) if axes is None else normalize_axes(axes, x.ndim)
    if len(shape) != len(axes):
        raise InvalidValueError(f"shape {shape} must have one entry per axis {axes}")
    src, dst = [slice(None)] * x.ndim, [slice(None)] * x.ndim
    out_shape = list(x.shape)
    padded = False
    for a, t in zip(axes, shape):
        if t < 0:
            raise InvalidValueError(f"shape {shape} has a negative size")
        d = x.shape[a]
        if d >= t:
            s = (d - t) // 2
            src[a] = slice(s, s + t)
        else:
            s = (t - d) // 2
            dst[a] = slice(s, s + d)
            padded = True
        out_shape[a] = t
    y = x[tuple(src)] if x.ndim else x
    if not padded:
        return y
    out = np.full(check_shape(out_shape, x.dtype), zero_of(x.dtype), dtype=x.dtype)
    out[tuple(dst)] = y
    return out


@kernel("CenterCropPad", since=18, views=True)
def center_crop_pad_18(*, axes=None):
    axes = None if axes is None else list(axes)
    return lambda x, shape: center_crop_pad(x, int_list(shape, "shape"), axes)
