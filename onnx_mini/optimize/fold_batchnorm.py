"""BatchNormalization in inference form folded into the Conv / ConvTranspose / Gemm / MatMul before it (and a
per-channel Mul / Add after a BatchNormalization or a Conv folded into it).

    y = (p(x) - mean) * a + bias,  a = scale / sqrt(var + epsilon)   (per output channel, axis 1)

becomes p'(x) with the weights' output channels scaled by `a` and the bias (B, C, or a new one)
replaced by (B - mean) * a + bias. Only when the producer's output feeds the BN alone (no graph output,
no other reader), its weights and bias and every BN parameter are constants, and the weights are
float32/float64 (folding computes in float64 and rounds once). MatMul folds only when its output is
known to be 2-D (BN's channel axis is then MatMul's last one); it becomes a fused MatMul with a bias.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..errors import InvalidValueError
from ..ops._common import normalize_axes
from ._context import Context

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def inference_bn(ctx: Context, bn) -> float | None:
    """epsilon if `bn` is a BatchNormalization in inference form (one output, per-channel), else None."""
    v = ctx.version(bn) if ctx.is_op(bn, "BatchNormalization") else None
    if v is None or len([o for o in bn.outputs if o]) != 1 or bn.outputs[0] == "" or len(bn.inputs) != 5:
        return None
    a = bn.attrs
    if v in (1, 6) and (not a.get("is_test", 0) or a.get("spatial", 1) != 1):
        return None
    if v == 7 and a.get("spatial", 1) != 1:
        return None
    if v >= 14 and a.get("training_mode", 0):
        return None
    if v not in (1, 6, 7, 9, 14, 15):
        return None
    return float(a.get("epsilon", 1e-5))


def _batchnorms(ctx: Context):
    """(node, epsilon) for each live inference BatchNormalization (the list may change meanwhile)."""
    for bn in list(ctx.nodes):
        if ctx.alive(bn) and bn.inputs and bn.inputs[0]:
            eps = inference_bn(ctx, bn)
            if eps is not None:
                yield bn, eps


def fold_batchnorm(ctx: Context) -> bool:
    changed = False
    for bn, eps in _batchnorms(ctx):
        prod = ctx.producer.get(bn.inputs[0])
        if (prod is None or not ctx.only_consumer(bn.inputs[0], bn)
                or not any(ctx.is_op(prod, op) for op in ("Conv", "ConvTranspose", "Gemm", "MatMul"))):
            continue
        params = [ctx.value(x) for x in bn.inputs[1:]]
        if any(not isinstance(p, np.ndarray) or p.ndim != 1 or p.dtype.kind != "f" for p in params):
            continue
        scale, bias, mean, var = (p.astype(np.float64) for p in params)
        if not len(scale) == len(bias) == len(mean) == len(var):
            continue
        a = scale / np.sqrt(var + eps)
        shift = bias - mean * a
        for fold in (_conv, _conv_transpose, _gemm, _matmul):
            new = fold(ctx, prod, a, mean, bias, shift)
            if new is not None:
                ctx.replace([prod, bn], [replace(new, outputs=bn.outputs)])
                changed = True
                break
    return changed


def _weights(ctx: Context, name: str, dims: int | None = None):
    w = ctx.value(name) if name else None
    if not isinstance(w, np.ndarray) or w.dtype not in _FLOATS or (dims is not None and w.ndim != dims):
        return None
    return w


def _bias(ctx: Context, node, index: int, m: int):
    """The node's bias input as a float64 (m,) vector (zeros when omitted); None if not a constant of that shape."""
    if len(node.inputs) <= index or not node.inputs[index]:
        return np.zeros(m)
    b = ctx.value(node.inputs[index])
    if not isinstance(b, np.ndarray) or b.shape != (m,) or b.dtype.kind != "f":
        return None
    return b.astype(np.float64)


def _scaled(w: np.ndarray, a: np.ndarray) -> np.ndarray:
    """w * a (a float64, broadcasting) in float64, rounded once into W's type: the ufunc casts its
    float64 products block by block into the result, with no float64 copy of W (ResNet-50's 25M
    weights: 200 MB of temporary; the fold took ~2/3 of its prepare, measured)."""
    return np.multiply(w, a, out=np.empty(w.shape, w.dtype), casting="unsafe")


def _conv(ctx, node, a, mean, bias, shift):
    if not ctx.is_op(node, "Conv", (1, 11, 22)) or len(node.inputs) < 2:
        return None
    w = _weights(ctx, node.inputs[1])
    if w is None or w.ndim < 3 or w.shape[0] != len(a):
        return None
    b = _bias(ctx, node, 2, len(a))
    if b is None:
        return None
    w2 = _scaled(w, a.reshape((-1,) + (1,) * (w.ndim - 1)))
    b2 = (b * a + shift).astype(w.dtype)
    return replace(node, inputs=(node.inputs[0], ctx.add_initializer(node.inputs[1], w2),
                                 ctx.add_initializer(node.inputs[1] + "_bias", b2)))


def _conv_transpose(ctx, node, a, mean, bias, shift):
    if not ctx.is_op(node, "ConvTranspose", (1, 11, 22)) or len(node.inputs) < 2:
        return None
    w = _weights(ctx, node.inputs[1])
    g = int(node.attrs.get("group", 1))
    if w is None or w.ndim < 3 or g < 1 or w.shape[0] % g or w.shape[1] * g != len(a):
        return None
    b = _bias(ctx, node, 2, len(a))
    if b is None:
        return None
    k = w.shape[2:]
    w2 = _scaled(w.reshape(g, w.shape[0] // g, w.shape[1], *k), a.reshape(g, 1, w.shape[1], *(1,) * len(k)))
    w2 = w2.reshape(w.shape)
    b2 = (b * a + shift).astype(w.dtype)
    return replace(node, inputs=(node.inputs[0], ctx.add_initializer(node.inputs[1], w2),
                                 ctx.add_initializer(node.inputs[1] + "_bias", b2)))


def _gemm(ctx, node, a, mean, bias, shift):
    if not ctx.is_op(node, "Gemm", (7, 9, 11, 13)) or len(node.inputs) < 2:
        return None
    w = _weights(ctx, node.inputs[1], 2)
    n = len(a)
    trans_b = int(node.attrs.get("transB", 0))
    if w is None or (w.shape[0] if trans_b else w.shape[1]) != n:
        return None
    beta = float(node.attrs.get("beta", 1.0))
    if len(node.inputs) > 2 and node.inputs[2]:
        c = ctx.value(node.inputs[2])
        if not isinstance(c, np.ndarray) or c.dtype.kind != "f" or c.ndim > 2 or (c.ndim and c.shape[-1] not in (1, n)):
            return None
        c2 = (c.astype(np.float64) * beta) * a + shift        # broadcasts to (n,) or (M, n)
    else:
        c2 = shift
    w2 = _scaled(w, a[:, None] if trans_b else a[None, :])
    return replace(node, inputs=(node.inputs[0], ctx.add_initializer(node.inputs[1], w2),
                                 ctx.add_initializer(node.inputs[1] + "_bias", c2.astype(w.dtype))),
                   attrs={**node.attrs, "beta": 1.0})


def _matmul(ctx, node, a, mean, bias, shift):
    if not ctx.is_op(node, "MatMul", (1, 9, 13)) or ctx.rank(node.inputs[0]) != 2:
        return None
    w = _weights(ctx, node.inputs[1], 2)
    if w is None or w.shape[1] != len(a):
        return None
    w2 = _scaled(w, a[None, :])
    return ctx.fused_node(node, "MatMul", (node.inputs[0], ctx.add_initializer(node.inputs[1], w2),
                                           ctx.add_initializer(node.inputs[1] + "_bias", shift.astype(w.dtype))),
                          node.outputs, {})


def fold_affine_into_batchnorm(ctx: Context) -> bool:
    """BatchNormalization followed by a Mul and/or an Add of per-channel constants (what some exporters
    emit for a scale-and-shift after the normalisation): the constants fold into scale and bias,
    scale' = scale * c and bias' = bias * c + d. Needs the BN input's rank, to be sure the constants
    line up with axis 1."""
    changed = False
    for bn, _ in _batchnorms(ctx):
        params = [ctx.value(x) for x in bn.inputs[1:3]]
        if any(not isinstance(p, np.ndarray) or p.ndim != 1 or p.dtype.kind != "f" for p in params):
            continue
        rank = ctx.rank(bn.inputs[0])
        if rank is None or rank < 2:
            continue
        scale, bias = (p.astype(np.float64) for p in params)
        c, d, after, last = affine_after(ctx, bn, rank, len(scale))
        if not after:
            continue
        s_name = ctx.add_initializer(bn.inputs[1], (scale * c).astype(params[0].dtype))
        b_name = ctx.add_initializer(bn.inputs[2], (bias * c + d).astype(params[1].dtype))
        new = replace(bn, inputs=(bn.inputs[0], s_name, b_name, *bn.inputs[3:]), outputs=last.outputs)
        ctx.replace([bn, *after], [new])
        changed = True
    return changed


def fold_affine_into_conv(ctx: Context) -> bool:
    """A Conv or ConvTranspose followed by a Mul and / or an Add of per-channel (or one-element) constants
    of W's type: the constants fold into W and B as a BatchNormalization does, W' = W * c and B' = B * c + d
    (PP-LCNetV3's learnable affine after each Conv, as PaddleOCR's det model has: 2 x 0.4-1.4 ms over a
    240x240x32 map; its head's ConvTranspose bias written as an Add before a BatchNormalization, which then
    folds too). The Conv's output (and the Mul's) must be read by the next node alone. Layout steps that
    keep each channel's values on axis 1 may stand between them (_keeps_channels: jax2tf's Conv output
    sliced and squeezed before its bias Add, as Google's Magika has: an Add over 13x512x508 values, ~2.7
    ms of ~90); they then read the folded Conv's output."""
    changed = False
    for conv in list(ctx.nodes):
        if not ctx.alive(conv) or len(conv.inputs) < 2 or len(conv.outputs) != 1 or not conv.outputs[0]:
            continue
        if ctx.is_op(conv, "Conv", (1, 11, 22)):
            fold, out_axis = _conv, 0
        elif ctx.is_op(conv, "ConvTranspose", (1, 11, 22)):
            fold, out_axis = _conv_transpose, 1
        else:
            continue
        w = _weights(ctx, conv.inputs[1])
        if w is None or w.ndim < 3:
            continue
        channels = w.shape[out_axis] * (int(conv.attrs.get("group", 1)) if out_axis else 1)
        chain, rank, start = [], w.ndim, conv
        while True:
            step = ctx.single_user(start.outputs[0])
            kept = _keeps_channels(ctx, step, start.outputs[0], rank, channels)
            if kept is None:
                break
            chain.append(step)
            rank, start = kept, step
        c, d, after, last = affine_after(ctx, start, rank, channels, w.dtype)
        new = fold(ctx, conv, c, None, None, d) if after else None
        if new is not None:
            if chain:       # the layout steps read the folded Conv; the last one writes the affine's output
                ctx.replace([conv, *chain, *after], [new, *chain[:-1], replace(chain[-1], outputs=last.outputs)])
            else:
                ctx.replace([conv, *after], [replace(new, outputs=last.outputs)])
            changed = True
    return changed


def _keeps_channels(ctx: Context, node, x: str, rank: int, channels: int) -> int | None:
    """The rank of `node`'s output when `node` reads x (rank `rank`, its channels on axis 1) as a layout step
    that leaves axis 1 and each channel's values on it alone: an Identity, a Squeeze / Unsqueeze of axes past
    1, a Slice taking every channel in order (any slice of the other axes); else None. A per-channel
    constant added (or multiplied) after such a step may be before it: same values, same positions."""
    if node is None or not node.inputs or node.inputs[0] != x or len(node.outputs) != 1 or not node.outputs[0]:
        return None
    if ctx.is_op(node, "Identity"):
        return rank
    if ctx.is_op(node, "Squeeze") or ctx.is_op(node, "Unsqueeze"):
        axes = ctx.axes(node)
        if not axes:                    # Squeeze without axes: which axes go is not known here
            return None
        out = rank - len(axes) if node.op_type == "Squeeze" else rank + len(axes)
        within = _axes_within(axes, rank if node.op_type == "Squeeze" else out)   # the rank they count in
        return out if within is not None and min(within) >= 2 else None
    if ctx.is_op(node, "Slice", (10, 11, 13)) and len(node.inputs) >= 3:
        starts, ends = ctx.value(node.inputs[1]), ctx.value(node.inputs[2])
        if not isinstance(starts, np.ndarray) or not isinstance(ends, np.ndarray):
            return None
        axes = ctx.value(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] else np.arange(starts.size)
        steps = ctx.value(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] else np.ones(starts.size)
        if not isinstance(axes, np.ndarray) or not isinstance(steps, np.ndarray) \
                or not starts.size == ends.size == axes.size == steps.size:
            return None
        within = _axes_within([int(a) for a in axes.reshape(-1)], rank)
        if within is None:
            return None
        for a, s, e, t in zip(within, starts.reshape(-1), ends.reshape(-1), steps.reshape(-1)):
            if a == 1 and not (int(s) == 0 and int(t) == 1 and int(e) >= channels):
                return None
        return rank
    return None


def _axes_within(axes: list[int], rank: int) -> list[int] | None:
    """axes mapped into [0, rank) (ops/_common.normalize_axes), or None where the node would raise."""
    try:
        return normalize_axes(axes, rank)
    except InvalidValueError:
        return None


def affine_after(ctx: Context, node, rank: int, channels: int, dtype=None):
    """The Mul and / or Add of per-channel constants (of `dtype` when given) that read `node`'s output, in
    that order, each value read by the next node alone -> (c, d, those nodes, the last node): their
    y * c + d, c and d float64 (channels,) vectors (ones and zeros without them)."""
    c, d, after, last = np.ones(channels), np.zeros(channels), [], node
    for op in ("Mul", "Add"):
        user = ctx.single_user(last.outputs[0]) if last.outputs[0] else None
        if not ctx.is_op(user, op, (7, 13, 14)):
            continue
        v = channel_operand(ctx, user, last.outputs[0], rank, channels, dtype)
        if v is None:
            break
        c, d = (c * v, d * v) if op == "Mul" else (c, d + v)
        after.append(user)
        last = user
    return c, d, after, last


def channel_operand(ctx: Context, node, x: str, rank: int, channels: int, dtype=None):
    """The other operand of the binary `node` reading x, when it is a constant along axis 1 only of a
    rank-`rank` value (_per_channel: a (channels,) float64 vector, one element with channels 1), else None."""
    return _per_channel(ctx, _other_input(node, x), rank, channels, dtype)


def _other_input(node, name: str) -> str:
    if len(node.inputs) != 2 or name not in node.inputs or node.inputs[0] == node.inputs[1]:
        return ""
    return node.inputs[1] if node.inputs[0] == name else node.inputs[0]


def _per_channel(ctx: Context, name: str, rank: int, channels: int, dtype=None):
    """A float constant (of `dtype` when given) that broadcasts along axis 1 only of a rank-`rank` tensor, as
    a (channels,) float64 vector; None otherwise."""
    v = ctx.value(name) if name else None
    if (not isinstance(v, np.ndarray) or v.dtype.kind != "f" or v.ndim > rank
            or (dtype is not None and v.dtype != dtype)):
        return None
    shape = (1,) * (rank - v.ndim) + v.shape
    if any(d != 1 for i, d in enumerate(shape) if i != 1) or shape[1] not in (1, channels):
        return None
    return np.broadcast_to(v.reshape(-1).astype(np.float64), (channels,)) if v.size > 1 else \
        np.full(channels, float(v.reshape(-1)[0]) if v.size else 0.0)
