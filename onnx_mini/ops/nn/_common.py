"""Geometry shared by convolutions and pools: kernel extents, auto_pad, output sizes, padding; per_image,
how both go through a batch; and what the convolutions' weight transforms need (finite)."""
from __future__ import annotations

import math

import numpy as np

from ... import blas, memory, parallel
from ...errors import InvalidValueError

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


def text(v) -> str:
    return v.decode() if isinstance(v, bytes) else v


def check_auto_pad(auto_pad) -> str:
    auto_pad = text(auto_pad)
    if auto_pad not in AUTO_PADS:
        raise ValueError(f"auto_pad must be one of {', '.join(AUTO_PADS)}, got {auto_pad!r}")
    return auto_pad


def geometry(in_sizes, kernel, strides, dilations, pads, auto_pad: str, ceil_mode: bool = False):
    """-> (pads_begin, pads_end, out_sizes) for the spatial axes, per the spec of Conv and the pools.

    pads: the explicit `pads` attribute ([begin..., end...]) or None; used with NOTSET only."""
    r = len(in_sizes)
    strides = list(strides) if strides else [1] * r
    dilations = list(dilations) if dilations else [1] * r
    if len(kernel) != r or len(strides) != r or len(dilations) != r:
        raise InvalidValueError(f"kernel_shape {list(kernel)}, strides {strides} and dilations {dilations} "
                                f"must each have one value per spatial axis ({r})")
    if min(strides, default=1) < 1 or min(dilations, default=1) < 1 or min(kernel, default=1) < 1:
        raise InvalidValueError(f"kernel_shape {list(kernel)}, strides {strides} and dilations {dilations} "
                                "must be positive")
    extent = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = [math.ceil(i / s) for i, s in zip(in_sizes, strides)]
        total = [max(0, (o - 1) * s + e - i) for o, s, e, i in zip(out, strides, extent, in_sizes)]
        small = [t // 2 for t in total]
        big = [t - t // 2 for t in total]
        begin, end = (small, big) if auto_pad == "SAME_UPPER" else (big, small)
        return begin, end, out
    if auto_pad == "VALID":   # ceil((i - extent + 1) / s) with or without ceil_mode: the floor formula
        begin = end = [0] * r
        ceil_mode = False
    else:
        p = list(pads) if pads else [0] * (2 * r)
        if len(p) != 2 * r:
            raise InvalidValueError(f"pads {p} must have 2 values per spatial axis ({2 * r})")
        if min(p, default=0) < 0:
            raise InvalidValueError(f"pads {p} must be >= 0")
        begin, end = p[:r], p[r:]
    rnd = math.ceil if ceil_mode else math.floor
    out = [rnd((i + b + e - x) / s) + 1 for i, b, e, x, s in zip(in_sizes, begin, end, extent, strides)]
    if ceil_mode:   # the last window must start inside the input or its left padding
        out = [o - 1 if (o - 1) * s >= i + b else o for o, s, i, b in zip(out, strides, in_sizes, begin)]
    if min(out, default=1) < 1:
        raise InvalidValueError(f"the kernel (extent {extent}) does not fit the padded input "
                                f"{[i + b + e for i, b, e in zip(in_sizes, begin, end)]}")
    return begin, end, out


def taps_inside(in_sizes, kernel, strides, dilations, begin, out, end=None) -> list[np.ndarray]:
    """Per spatial axis, a bool (output size, kernel size) mask: whether output o's tap t reads a cell
    of the input (position o * stride - begin + t * dilation in [0, size)), or with `end` given a cell
    of the input or of its explicit padding ([-begin, size + end)). A window's cells are the product
    of its axes' masks: AveragePool counts them, QLinearConv's zero-point fold sums W over them."""
    masks = []
    for a, (i, k, s, dl, b, o) in enumerate(zip(in_sizes, kernel, strides, dilations, begin, out)):
        pos = np.arange(o)[:, None] * s - b + np.arange(k)[None, :] * dl
        lo, hi = (0, i) if end is None else (-b, i + end[a])
        masks.append((pos >= lo) & (pos < hi))
    return masks


def pad_spatial(x: np.ndarray, begin, end, value=0) -> np.ndarray:
    """x with its trailing len(begin) axes padded by `value` (x itself when there is no padding)."""
    if not any(begin) and not any(end):
        return x
    lead = x.ndim - len(begin)
    out = np.full(x.shape[:lead] + tuple(s + b + e for s, b, e in zip(x.shape[lead:], begin, end)), value,
                  dtype=x.dtype)
    out[(slice(None),) * lead + tuple(slice(b, b + s) for b, s in zip(begin, x.shape[lead:]))] = x
    return out


def read_extent(out: int, stride: int, kernel: int, dilation: int) -> int:
    """Padded positions the windows of one axis read, first to last: (out-1)*stride + (kernel-1)*dilation + 1."""
    return (out - 1) * stride + (kernel - 1) * dilation + 1


def read_region(in_sizes, begin, need) -> tuple[list[slice], list[slice]]:
    """Where the input goes in a zero-padded buffer holding the `need` positions per axis that the
    windows read (padding `begin` first): (destination slices in the buffer, source slices in the
    input), per spatial axis; input beyond the last window is left out."""
    dst, src = [], []
    for size, bg, nd in zip(in_sizes, begin, need):
        lo = min(bg, nd)
        hi = max(lo, min(bg + size, nd))
        dst.append(slice(lo, hi))
        src.append(slice(lo - bg, hi - bg))
    return dst, src


def windows(xp: np.ndarray, kernel, strides, dilations, out_sizes) -> np.ndarray:
    """A strided view (…, *out_sizes, *kernel) of the padded input xp: window values, no copy."""
    r = len(kernel)
    lead = xp.ndim - r
    st = xp.strides
    shape = xp.shape[:lead] + tuple(out_sizes) + tuple(kernel)
    strides_ = st[:lead] + tuple(st[lead + d] * strides[d] for d in range(r)) + \
        tuple(st[lead + d] * dilations[d] for d in range(r))
    return strided_view(xp, shape, strides_)


def strided_view(a: np.ndarray, shape, strides) -> np.ndarray:
    """A read-only view of a's memory with the given shape and strides (as numpy's as_strided, which
    costs ~3 us a call in Python against ~0.4 us for the ndarray constructor used on a C-contiguous
    a; the constructor also checks that the view stays within a's memory)."""
    if a.flags.c_contiguous:
        v = np.ndarray(shape, a.dtype, a, 0, strides)
        v.flags.writeable = False
        return v
    return np.lib.stride_tricks.as_strided(a, shape, strides, writeable=False)


def conv_kernel(x: np.ndarray, w: np.ndarray, kernel_shape) -> list[int]:
    """The checks every convolution (Conv, ConvTranspose, DeformConv) makes of X and W: same rank, at
    least 3, and a kernel_shape attribute (when given) equal to W's spatial shape; returns the kernel."""
    if x.ndim < 3 or w.ndim != x.ndim:
        raise InvalidValueError(f"X (shape {list(x.shape)}) and W (shape {list(w.shape)}) must have the same "
                                "rank, at least 3 (N, C, spatial...)")
    kernel = list(w.shape[2:])
    if kernel_shape and list(kernel_shape) != kernel:
        raise InvalidValueError(f"kernel_shape {list(kernel_shape)} differs from W's spatial shape {kernel}")
    return kernel


def check_groups(c: int, w: np.ndarray, group: int) -> None:
    """W (M, C/group, ...) of a forward convolution against X's C channels."""
    m, cg = w.shape[:2]
    if c != cg * group or m % group:
        raise InvalidValueError(f"X has {c} channels and W has shape {list(w.shape)}: with group={group} W must "
                                f"be ({group}k, {c // group if c % group == 0 else '?'}, ...)")


def check_bias(b, m: int) -> None:
    if b is not None and b.shape != (m,):
        raise InvalidValueError(f"B must have shape [{m}], got {list(b.shape)}")


def per_image(compute, shape, dtype) -> np.ndarray:
    """The (N, ...) result `shape` of compute(i, out) for each image i (out: its (1, ...) slice), the
    images shared among parallel.split's threads with OpenBLAS on one thread meanwhile
    (blas.own_threads): each image's temporaries (padded copies, im2col columns, window maxima) stay
    small and in the caches. ResNet-50 per image: batch 1 ~68 ms; batch 32 96 ms with whole-batch
    temporaries, 87 ms image by image with OpenBLAS's threads, 66-70 ms with the images on two threads.
    Images left over by whole rounds (13 on two threads: the 13th) run after them on this thread, their
    products shared as the run shares them (blas.matmul), where one thread would do them alone while
    the others wait."""
    y = memory.empty(shape, dtype)

    def work(i0, i1):
        for i in range(i0, i1):
            compute(i, y[i:i + 1])
    n, threads = shape[0], parallel.threads()
    rest = n % threads if n > threads else 0
    with blas.own_threads():
        parallel.split(work, n - rest, 1)
    work(n - rest, n)
    return y


# -- what the convolutions' weight transforms need (Winograd, banded depthwise) ---------------------

def finite(x: np.ndarray) -> bool:
    """Whether x holds only finite values (its sum is finite; an overflowing sum says no, which only
    costs the faster path). Transformed convolutions multiply values by zeros or mix them with both
    signs, so an infinity or a NaN would reach outputs the convolution keeps it out of."""
    with np.errstate(over="ignore", invalid="ignore"):
        return bool(np.isfinite(x.sum()))
