"""Conv's spec checks: the attributes, and X, W, B against each other, with the output geometry."""
from __future__ import annotations

from .._common import check_auto_pad, check_bias, check_groups, conv_kernel, geometry


def check_attributes(auto_pad, group) -> str:
    """The attribute checks independent of the inputs; -> auto_pad as a str."""
    auto_pad = check_auto_pad(auto_pad)
    if group < 1:
        raise ValueError(f"group must be >= 1, got {group}")
    return auto_pad


def shape_geometry(x, w, b, auto_pad, dilations, group, kernel_shape, pads, strides):
    """The checks of X, W and B against each other and the attributes; -> (kernel, strides,
    dilations, pads_begin, pads_end, output sizes) of the spatial axes."""
    r = x.ndim - 2
    kernel = conv_kernel(x, w, kernel_shape)
    check_groups(x.shape[1], w, group)
    check_bias(b, w.shape[0])
    strides = list(strides) if strides else [1] * r
    dilations = list(dilations) if dilations else [1] * r
    begin, end, out = geometry(x.shape[2:], kernel, strides, dilations, pads, auto_pad)
    return kernel, strides, dilations, begin, end, out
