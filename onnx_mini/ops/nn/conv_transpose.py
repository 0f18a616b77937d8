"""ConvTranspose (1, 11, 22): N-D transposed convolution with groups, dilations, strides, pads, auto_pad,
output_padding and output_shape.

Formulation: per (image, group) one matmul of W^T (Mg*k, Cg) with X (Cg, pixels) gives every input pixel's
contribution to each output channel and kernel tap; Col2Im's scatter-add (one strided-slice addition per
kernel tap) then places them at pixel*stride + tap*dilation - pad_begin, dropping what falls outside.
Positions of the output that nothing reaches (output_padding, an output_shape larger than the full result)
hold zero plus the bias. float16/bfloat16 compute in float32 and round back once.
Strides equal to the kernel (a U-Net's 2x2/2 upsampling) with dilation 1 and nothing cropped or added:
no tap overlaps another, so each tap's block is copied to its positions (`_tiled`) instead of scattered
into zeros. A constant W is transposed once, at prepare.
"""
from __future__ import annotations

import math

import numpy as np

from ... import memory
from ...errors import InvalidValueError
from ...registry import kernel
from .._common import UPCAST, prepack
from ._common import check_auto_pad, check_bias, conv_kernel
from .col2im import scatter_blocks
from .conv import grouped_matmul


def _factory(auto_pad, dilations, group, kernel_shape, output_padding, output_shape, pads, strides, upper_first,
             constants):
    auto_pad = check_auto_pad(auto_pad)
    if group < 1:
        raise ValueError(f"group must be >= 1, got {group}")
    for name, v in (("strides", strides), ("dilations", dilations), ("kernel_shape", kernel_shape)):
        if v is not None and min(v, default=1) < 1:
            raise ValueError(f"{name} must be positive, got {list(v)}")
    for name, v in (("pads", pads), ("output_padding", output_padding)):
        if v is not None and min(v, default=0) < 0:
            raise ValueError(f"{name} must be >= 0, got {list(v)}")

    # a constant W: its per-group transpose made contiguous once (BLAS reads a transposed operand slower)
    w_t = prepack(lambda w: _w_t(w, group), constants, (1,))

    def conv_transpose(x, w, b=None):
        return _conv_transpose(x, w, b, auto_pad, dilations, group, kernel_shape, output_padding, output_shape,
                               pads, strides, upper_first, w_t)
    return conv_transpose


def _w_t(w, group):
    """W (C, Mg, *k) -> per group W^T (G, Mg*k, Cg), contiguous, in the compute type; None when W's
    shape does not split into the groups (the kernel's checks then report it)."""
    if w.ndim < 2 or w.shape[0] % group:
        return None
    w = w.astype(np.float32) if w.dtype in UPCAST else w
    return np.ascontiguousarray(w.reshape(group, w.shape[0] // group, -1).transpose(0, 2, 1))


@kernel("ConvTranspose", since=(1, 11, 22), heavy=True)
def conv_transpose_1(*, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, output_padding=None,
                     output_shape=None, pads=None, strides=None, _version, _constants=None):
    # Pads derived from output_shape: in version 1 the larger half goes at the start only for SAME_UPPER,
    # else at the end; from 11, SAME_UPPER puts it at the end, anything else at the start.
    return _factory(auto_pad, dilations, group, kernel_shape, output_padding, output_shape, pads, strides,
                    upper_first=_version < 11, constants=_constants)


def transpose_geometry(in_sizes, kernel, strides, dilations, pads, output_padding, output_shape, auto_pad,
                       upper_first=False):
    """-> (pads_begin, out_sizes) of a transposed convolution, per the ConvTranspose spec.

    The full result has stride*(in-1) + extent positions; output position o is full position o + pads_begin.
    upper_first: ConvTranspose-1's split of a padding computed from output_shape."""
    r = len(in_sizes)
    if len(kernel) != r or len(strides) != r or len(dilations) != r or len(output_padding) != r:
        raise InvalidValueError(f"kernel_shape {list(kernel)}, strides {strides}, dilations {dilations} and "
                                f"output_padding {output_padding} must each have one value per spatial axis ({r})")
    full = [s * (i - 1) + (k - 1) * d + 1 + a
            for i, k, s, d, a in zip(in_sizes, kernel, strides, dilations, output_padding)]
    if output_shape or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        if output_shape:
            out = list(output_shape)[-r:] if len(output_shape) in (r, r + 2) else None
            if out is None or min(out) < 0:
                raise InvalidValueError(f"output_shape {list(output_shape)} must have one non-negative value per "
                                        f"spatial axis ({r})")
            larger_first = (auto_pad == "SAME_UPPER") if upper_first else (auto_pad != "SAME_UPPER")
        else:
            out = [i * s for i, s in zip(in_sizes, strides)]
            larger_first = auto_pad == "SAME_LOWER"
        # a negative total padding (output larger than the full result) extends the end with zeros
        total = [max(0, f - o) for f, o in zip(full, out)]
        begin = [t - t // 2 if larger_first else t // 2 for t in total]
        return begin, out
    if auto_pad == "VALID":
        return [0] * r, full
    p = list(pads) if pads else [0] * (2 * r)
    if len(p) != 2 * r:
        raise InvalidValueError(f"pads {p} must have 2 values per spatial axis ({2 * r})")
    out = [f - b - e for f, b, e in zip(full, p[:r], p[r:])]
    if min(out, default=1) < 0:
        raise InvalidValueError(f"pads {p} remove more than the whole output (full size {full})")
    return p[:r], out


def _conv_transpose(x, w, b, auto_pad, dilations, group, kernel_shape, output_padding, output_shape, pads,
                    strides, upper_first, w_t):
    kernel = conv_kernel(x, w, kernel_shape)
    n, c = x.shape[:2]
    r = x.ndim - 2
    if w.shape[0] != c or c % group:
        raise InvalidValueError(f"X has {c} channels and W has shape {list(w.shape)}: W must be (C, M/group, ...) "
                                f"with C = {c} divisible by group = {group}")
    mg = w.shape[1]
    m = mg * group
    check_bias(b, m)
    st = list(strides) if strides else [1] * r
    dil = list(dilations) if dilations else [1] * r
    adj = list(output_padding) if output_padding else [0] * r
    begin, out = transpose_geometry(x.shape[2:], kernel, st, dil, pads, adj, output_shape, auto_pad, upper_first)

    dtype = x.dtype
    wt = w_t(w)              # per group W^T (Mg*k, Cg); X -> (N, G, Cg, pixels)
    if dtype in UPCAST:
        x = x.astype(np.float32)
        b = None if b is None else b.astype(np.float32)
    cg = c // group
    cols = grouped_matmul(wt, x.reshape(n, group, cg, math.prod(x.shape[2:])))   # (N, G, Mg*k, pixels)
    cols = cols.reshape(n, m, *kernel, *x.shape[2:])
    if st == list(kernel) and all(d == 1 for d in dil) and not any(begin) and out == [
            s * i for s, i in zip(st, x.shape[2:])]:
        y = _tiled(cols, b, kernel, x.shape[2:], out)
    else:
        y = scatter_blocks(cols, out, begin, st, dil)
        if b is not None:
            y += b.reshape((1, m) + (1,) * r)
    return y.astype(dtype, copy=False)


def _tiled(cols, b, kernel, in_sizes, out):
    """The output when strides equal the kernel (dilation 1, no padding): the taps of neighbouring input
    pixels never overlap, so output position i*k + t is the one term (pixel i, tap t) of the sum: each
    tap's (N, M, *in) block of the product is copied to its positions (stride k), the bias added on the
    way. One copy per tap in place of a zeroed output and an addition per tap (numpy's transposing copy
    of the whole product is slower still: its inner axis would be a tap axis of 2).
    """
    n, m, r = cols.shape[0], cols.shape[1], len(kernel)
    y = memory.empty((n, m, *out), dtype=cols.dtype)
    tiles = y.reshape(n, m, *[v for i, k in zip(in_sizes, kernel) for v in (i, k)])
    bias = None if b is None else b.reshape((1, m) + (1,) * r)
    for tap in np.ndindex(*kernel):
        dst = tiles[(slice(None), slice(None)) + tuple(v for t in tap for v in (slice(None), t))]
        if bias is None:
            np.copyto(dst, cols[(slice(None), slice(None)) + tap])
        else:
            np.add(cols[(slice(None), slice(None)) + tap], bias, out=dst)
    return y
