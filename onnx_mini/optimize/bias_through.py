"""A Conv's bias carried into the pointwise Conv that alone reads its output.

Conv A (bias b) feeding a 1x1 Conv B (weights V, bias c, no padding) with nothing in between:
B(A(x) + b) = B(A(x)) + V b at every output position (a 1x1 window without padding reads one
position, which holds its bias), so A drops its bias and B's becomes c + V b (per group, computed
in float64 once). ShuffleNet's depthwise layers, each followed by a grouped 1x1 one once the
BatchNormalizations are folded, then skip 16 bias passes (~7 us each of ~9 ms). The sums round
differently (within the official tolerances, like the BatchNormalization folding).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ._context import Context, unpadded
from .fold_batchnorm import _bias, _weights

_CONV = (1, 11, 22)


def fold_bias_through(ctx: Context) -> bool:
    changed = False
    for first in list(ctx.nodes):
        if (not ctx.alive(first) or not ctx.is_op(first, "Conv", _CONV) or len(first.inputs) < 3
                or not first.inputs[2] or len(first.outputs) != 1):
            continue
        second = ctx.single_user(first.outputs[0])
        if second is None or not _pointwise(ctx, second) or second.inputs[0] != first.outputs[0]:
            continue
        v = _weights(ctx, second.inputs[1])
        b = ctx.value(first.inputs[2])
        if (v is None or v.ndim < 3 or any(k != 1 for k in v.shape[2:]) or not isinstance(b, np.ndarray)
                or b.dtype != v.dtype or b.ndim != 1):
            continue
        m, cg = v.shape[:2]
        groups = int(second.attrs.get("group", 1))
        c = _bias(ctx, second, 2, m)
        if c is None or groups < 1 or m % groups or len(b) != cg * groups:
            continue
        carried = np.einsum("gmc,gc->gm", v.reshape(groups, m // groups, cg).astype(np.float64),
                            b.reshape(groups, cg).astype(np.float64)).reshape(m)
        new_bias = ctx.add_initializer(second.inputs[1] + "_bias", (c + carried).astype(v.dtype))
        ctx.replace([first, second], [replace(first, inputs=first.inputs[:2]),
                                      replace(second, inputs=(second.inputs[0], second.inputs[1], new_bias))])
        changed = True
    return changed


def _pointwise(ctx: Context, node) -> bool:
    """A Conv without padding (its weights, checked by the caller, 1x1; any strides: every position
    holds the bias)."""
    return ctx.is_op(node, "Conv", _CONV) and len(node.inputs) >= 2 and unpadded(node.attrs)
