"""DeformConv (19, 22): N-D deformable convolution (offsets, optional mask, group and offset_group).

For output pixel o and kernel tap t the input is sampled at o*stride - pad_begin + t*dilation + offset (the
offset channels are laid out (offset_group, tap, axis)), by N-linear interpolation between the 2^r
neighbouring grid points, a point outside the input counting as zero. The samples, times the mask, form
im2col-style columns (C*k, out pixels) and one matmul per (image, group) with W finishes the convolution.
Vectorised over images, channels and output pixels; loops over kernel taps and the 2^r corners only.
float16/bfloat16 compute in float32 and round back once.
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from ...errors import InvalidValueError
from ...registry import kernel
from .._common import UPCAST
from ._common import check_bias, check_groups, conv_kernel, geometry
from .conv import grouped_matmul


@kernel("DeformConv", since=(19, 22), heavy=True)
def deform_conv_19(*, dilations=None, group=1, kernel_shape=None, offset_group=1, pads=None, strides=None):
    if group < 1 or offset_group < 1:
        raise ValueError(f"group ({group}) and offset_group ({offset_group}) must be >= 1")

    def deform_conv(x, w, offset, b=None, mask=None):
        return _deform_conv(x, w, offset, b, mask, dilations, group, kernel_shape, offset_group, pads, strides)
    return deform_conv


def _deform_conv(x, w, offset, b, mask, dilations, group, kernel_shape, offset_group, pads, strides):
    kernel = conv_kernel(x, w, kernel_shape)
    n, c = x.shape[:2]
    m, cg = w.shape[:2]
    r = x.ndim - 2
    check_groups(c, w, group)
    if c % offset_group:
        raise InvalidValueError(f"X's {c} channels are not divisible by offset_group={offset_group}")
    check_bias(b, m)
    st = list(strides) if strides else [1] * r
    dil = list(dilations) if dilations else [1] * r
    begin, _, out = geometry(x.shape[2:], kernel, st, dil, pads, "NOTSET")
    taps = math.prod(kernel)
    pixels = math.prod(out)
    og = offset_group
    if offset.shape != (n, og * taps * r, *out):
        raise InvalidValueError(f"offset must have shape {[n, og * taps * r, *out]}, got {list(offset.shape)}")
    if mask is not None and mask.shape != (n, og * taps, *out):
        raise InvalidValueError(f"mask must have shape {[n, og * taps, *out]}, got {list(mask.shape)}")

    dtype = x.dtype
    if dtype in UPCAST:
        x, w, offset = x.astype(np.float32), w.astype(np.float32), offset.astype(np.float32)
        b = None if b is None else b.astype(np.float32)
        mask = None if mask is None else mask.astype(np.float32)
    ct = np.result_type(x, w, offset)
    if n == 0 or m == 0 or pixels == 0:
        return np.zeros((n, m, *out), dtype=ct).astype(dtype, copy=False)

    in_sizes = x.shape[2:]
    size = math.prod(in_sizes)
    cog = c // og
    rows = n * og
    # the input as rows of channels per (image, offset group, input pixel), plus one zero row per batch
    # item (index `size`) that out-of-range corners read
    xt = np.zeros((rows, size + 1, cog), dtype=ct)
    xt[:, :size] = x.reshape(rows, cog, size).transpose(0, 2, 1)
    xt = xt.reshape(rows * (size + 1), cog)
    row_base = (np.arange(rows) * (size + 1))[:, None]                          # (rows, 1)
    flat_steps = [math.prod(in_sizes[d + 1:]) for d in range(r)]
    # output pixel origins o*stride - pad_begin per axis, flattened row-major: (r, pixels)
    grids = np.meshgrid(*[np.arange(o) * s - p for o, s, p in zip(out, st, begin)], indexing="ij")
    origin = np.stack([g.reshape(-1) for g in grids]).astype(ct)
    off = offset.reshape(rows, taps, r, pixels)
    msk = None if mask is None else mask.reshape(rows, taps, pixels)

    cols = np.empty((rows, cog, taps, pixels), dtype=ct)
    for ti, tap in enumerate(np.ndindex(*kernel)):
        pos = origin + (np.array(tap) * dil).astype(ct)[:, None] + off[:, ti]    # (rows, r, pixels)
        low = np.floor(pos)
        frac = pos - low
        low = low.astype(np.int64)
        acc = np.zeros((rows, pixels, cog), dtype=ct)
        for corner in itertools.product((0, 1), repeat=r):
            weight = np.ones((rows, pixels), dtype=ct)
            flat = np.zeros((rows, pixels), dtype=np.int64)
            valid = np.ones((rows, pixels), dtype=bool)
            for d, bit in enumerate(corner):
                cd = low[:, d] + bit
                weight *= frac[:, d] if bit else 1 - frac[:, d]
                valid &= (cd >= 0) & (cd < in_sizes[d])
                flat += cd * flat_steps[d]
            index = np.where(valid, flat, size) + row_base
            acc += weight[:, :, None] * xt.take(index.reshape(-1), axis=0).reshape(rows, pixels, cog)
        if msk is not None:
            acc *= msk[:, ti, :, None]
        cols[:, :, ti] = acc.transpose(0, 2, 1)
    y = grouped_matmul(w.reshape(group, m // group, cg * taps), cols.reshape(n, group, cg * taps, pixels))
    y = y.reshape(n, m, *out)
    if b is not None:
        y += b.reshape((1, m) + (1,) * r)
    return y.astype(dtype, copy=False)
