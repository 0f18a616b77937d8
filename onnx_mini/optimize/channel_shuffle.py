"""ShuffleNet's channel shuffle folded into the grouped 1x1 Conv that produces it.

Exporters write the shuffle of C = g*k channels as Reshape (N, C, H, W) -> (N, g, k, H, W), Transpose
(0, 2, 1, 3, 4), Reshape -> (N, C, H, W): output channel b*g + a is input channel a*k + b, one copy of
the whole tensor. When the tensor comes from a Conv with g groups, 1x1 kernel, stride 1 and no padding
(activation fused or not, no residual), group a's k output channels are exactly the channels that
land at a, a + g, a + 2g, ...: the fused Conv (attribute `shuffle` = g, kernels.fused_conv) writes each
group's product straight to those rows (a row stride of g rows, which BLAS takes as is) and adds the
bias in the same order, so the three nodes and their copy go (ShuffleNet: 16 shuffles, ~0.3 ms of
~10). The target shapes must be constants with every dimension given (no 0 or -1); the kernel checks
the product's shape against them at run and otherwise computes the three ops as written.
"""
from __future__ import annotations

import numpy as np

from ._context import FUSED_DOMAIN, Context, unpadded

_RESHAPE = (5, 13, 14, 19, 21, 23, 24, 25)
_TRANSPOSE = (1, 13, 21, 23, 24, 25)
_CONV = (1, 11, 22)


def fold_channel_shuffle(ctx: Context) -> bool:
    changed = False
    for tr in list(ctx.nodes):
        if not ctx.alive(tr) or not ctx.is_op(tr, "Transpose", _TRANSPOSE):
            continue
        if list(tr.attrs.get("perm", ())) != [0, 2, 1, 3, 4] or len(tr.outputs) != 1:
            continue
        split, join = ctx.producer.get(tr.inputs[0]), ctx.single_user(tr.outputs[0])
        if not (_reshape(ctx, split) and _reshape(ctx, join) and ctx.only_consumer(tr.inputs[0], tr)
                and ctx.only_consumer(tr.outputs[0], join)):
            continue
        conv = ctx.producer.get(split.inputs[0])
        if conv is None or not ctx.only_consumer(split.inputs[0], split) or len(conv.outputs) != 1:
            continue
        s5, s4 = ctx.value(split.inputs[1]), ctx.value(join.inputs[1])
        if not (_dims(s5, 5) and _dims(s4, 4)):
            continue
        n, g, k, h, w = (int(v) for v in s5)
        if [int(v) for v in s4] != [n, g * k, h, w] or not _pointwise_groups(ctx, conv, g, g * k):
            continue
        attrs = dict(conv.attrs, shuffle=g, shuffle_dims=(n, g * k, h, w))
        fused = ctx.fused_node(conv, "Conv", conv.inputs, join.outputs, attrs)
        ctx.replace([conv, split, tr, join], [fused])
        changed = True
    return changed


def _reshape(ctx: Context, node) -> bool:
    return (node is not None and ctx.is_op(node, "Reshape", _RESHAPE) and len(node.inputs) == 2
            and len(node.outputs) == 1 and ctx.is_constant(node.inputs[1]))


def _dims(shape, rank: int) -> bool:
    return (isinstance(shape, np.ndarray) and shape.dtype == np.int64 and shape.shape == (rank,)
            and bool((shape > 0).all()))


def _pointwise_groups(ctx: Context, conv, groups: int, channels: int) -> bool:
    """A Conv (or fused Conv without a residual) with `groups` groups, `channels` outputs of a constant
    1x1 weight, stride 1 and no padding."""
    if not (ctx.is_op(conv, "Conv", _CONV)
            or (conv.domain == FUSED_DOMAIN and conv.op_type == "Conv" and not conv.attrs.get("shuffle"))):
        return False
    if len(conv.inputs) > 3 and conv.inputs[3]:
        return False                     # a residual: it would have to be shuffled too
    a = conv.attrs
    w = ctx.value(conv.inputs[1]) if len(conv.inputs) > 1 and conv.inputs[1] else None
    if not isinstance(w, np.ndarray) or w.ndim != 4 or w.shape[0] != channels or w.shape[2:] != (1, 1):
        return False
    return (int(a.get("group", 1)) == groups and all(int(s) == 1 for s in a.get("strides", ()) or ())
            and unpadded(a))             # a kernel_shape attribute must equal W's: the kernel checks it
