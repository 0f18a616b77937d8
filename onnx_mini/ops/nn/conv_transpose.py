"""ConvTranspose (1, 11, 22): N-D transposed convolution with groups, dilations, strides, pads, auto_pad,
output_padding and output_shape.

Formulation: per (image, group) one matmul of W^T (Mg*k, Cg) with X (Cg, pixels) gives every input pixel's
contribution to each output channel and kernel tap; Col2Im's scatter-add (one strided-slice addition per
kernel tap) then places them at pixel*stride + tap*dilation - pad_begin, dropping what falls outside.
Positions of the output that nothing reaches (output_padding, an output_shape larger than the full result)
hold zero plus the bias. float16/bfloat16 compute in float32 and round back once.
"""
from __future__ import annotations

import math

import numpy as np

from ...errors import InvalidValueError
from ...registry import kernel
from .._common import UPCAST
from ._common import check_auto_pad, check_bias, conv_kernel
from .col2im import scatter_blocks
from .conv import grouped_matmul


def _factory(auto_pad, dilations, group, kernel_shape, output_padding, output_shape, pads, strides, upper_first):
    auto_pad = check_auto_pad(auto_pad)
    if group < 1:
        raise ValueError(f"group must be >= 1, got {group}")
    for name, v in (("strides", strides), ("dilations", dilations), ("kernel_shape", kernel_shape)):
        if v is not None and min(v, default=1) < 1:
            raise ValueError(f"{name} must be positive, got {list(v)}")
    for name, v in (("pads", pads), ("output_padding", output_padding)):
        if v is not None and min(v, default=0) < 0:
            raise ValueError(f"{name} must be >= 0, got {list(v)}")

    def conv_transpose(x, w, b=None):
        return _conv_transpose(x, w, b, auto_pad, dilations, group, kernel_shape, output_padding, output_shape,
                               pads, strides, upper_first)
    return conv_transpose


@kernel("ConvTranspose", since=(1, 11, 22), heavy=True)
def conv_transpose_1(*, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, output_padding=None,
                     output_shape=None, pads=None, strides=None, _version):
    # Pads derived from output_shape: in version 1 the larger half goes at the start only for SAME_UPPER,
    # else at the end; from 11, SAME_UPPER puts it at the end, anything else at the start.
    return _factory(auto_pad, dilations, group, kernel_shape, output_padding, output_shape, pads, strides,
                    upper_first=_version < 11)


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
                    strides, upper_first):
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
    if dtype in UPCAST:
        x, w = x.astype(np.float32), w.astype(np.float32)
        b = None if b is None else b.astype(np.float32)
    cg = c // group
    taps = math.prod(kernel)
    # W (C, Mg, *k) -> per group W^T (Mg*k, Cg); X -> (N, G, Cg, pixels)
    wt = w.reshape(group, cg, mg * taps).transpose(0, 2, 1)
    cols = grouped_matmul(wt, x.reshape(n, group, cg, math.prod(x.shape[2:])))   # (N, G, Mg*k, pixels)
    y = scatter_blocks(cols.reshape(n, m, *kernel, *x.shape[2:]), out, begin, st, dil)
    if b is not None:
        y += b.reshape((1, m) + (1,) * r)
    return y.astype(dtype, copy=False)
