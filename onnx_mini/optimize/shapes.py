"""Shape -> Gather -> Concat -> Reshape chains folded when the shapes are static; Reshape to the
shape its input already has bypassed (identities.py).

Shapes known before any run are those of constants and of graph inputs whose declared dims are all
fixed (a top-level graph only: the run checks every fed input against its declared shape). They are
carried forward through the ops below; a Shape node (or Size) of a value whose shape is known becomes
a constant, and the constant folding of the plan then computes the Gather / Concat / Unsqueeze /
... after it once, leaving Reshape a constant shape. Anything unknown stays as written.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import GraphError
from ..graph import topo_sort
from ..ops.nn._common import geometry
from ._context import Context
from .identities import eliminate_identities

_SAME = frozenset({"Relu", "Sigmoid", "Tanh", "Erf", "Sqrt", "Exp", "Log", "Neg", "Abs", "Cast", "Identity",
                   "Softmax", "LogSoftmax", "LeakyRelu", "Gelu", "HardSigmoid", "HardSwish", "Elu", "Selu",
                   "Clip", "Not", "Reciprocal", "Floor", "Ceil", "Round", "Sign", "Softplus", "IsNaN",
                   "Dropout", "LayerNormalization", "InstanceNormalization", "BatchNormalization", "Mish",
                   "Swish", "PRelu"})
_BROADCAST = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Equal", "Less", "Greater", "LessOrEqual",
                        "GreaterOrEqual", "And", "Or", "Xor", "Where", "Max", "Min", "Sum", "Mean"})
_SHAPE_VERSIONS = (1, 13, 15, 19, 21, 23, 24, 25)


def fold_static_shapes(ctx: Context) -> bool:
    if not any(n.op_type in ("Shape", "Size", "Reshape") for n in ctx.nodes):
        return False
    available = {v.name for v in ctx.graph.inputs} | set(ctx.initializers) | ctx.outer_scope
    try:
        order = topo_sort(ctx.nodes, available)
    except GraphError:
        return False          # build_plan reports it
    shapes: dict[str, tuple] = {}

    def shape(name: str):
        if name in shapes:
            return shapes[name]
        return ctx.static_shape(name) if name else None

    folded = []
    reshapes = []             # Reshape nodes whose target is their input's shape: no-ops
    for node in order:
        if node.domain not in ("", "ai.onnx") or not node.outputs:
            continue
        ins = [shape(x) for x in node.inputs]
        if (node.op_type in ("Shape", "Size") and ins and ins[0] is not None and len(node.outputs) == 1
                and ctx.valid(node)):
            v = ctx.version(node)
            if node.op_type == "Shape" and v in _SHAPE_VERSIONS:
                s = ins[0][slice(node.attrs.get("start", 0), node.attrs.get("end"))]
                value = np.array(s, dtype=np.int64)
            elif node.op_type == "Size" and v in (1, 13, 19, 21, 23, 24, 25):
                value = np.array(math.prod(ins[0]), dtype=np.int64)
            else:
                continue
            value.flags.writeable = False
            ctx.initializers[node.outputs[0]] = value
            ctx._values[node.outputs[0]] = value
            shapes[node.outputs[0]] = value.shape
            folded.append(node)
            continue
        try:
            out = _infer(ctx, node, ins)
        except Exception:
            out = None
        if out is not None:
            shapes[node.outputs[0]] = tuple(int(d) for d in out)
            if node.op_type == "Reshape" and shapes[node.outputs[0]] == tuple(ins[0]):
                reshapes.append(node)
    if folded:
        ids = {id(n) for n in folded}
        ctx.nodes = [n for n in ctx.nodes if id(n) not in ids]
        ctx.refresh()
    if reshapes:
        eliminate_identities(ctx, also=reshapes)
    return bool(folded or reshapes)


def _infer(ctx: Context, node, ins):
    """The first output's shape from the inputs' shapes (None when unknown or not handled)."""
    op, a = node.op_type, node.attrs
    if not ins or ins[0] is None:
        return None
    x = ins[0]
    if op in _SAME:
        return x if not (op == "BatchNormalization" and len(node.outputs) > 1) else None
    if op in _BROADCAST:
        if any(s is None for s, n in zip(ins, node.inputs) if n) or (ctx.version(node) or 0) < 7:
            return None
        return np.broadcast_shapes(*[s for s in ins if s is not None])
    if op == "MatMul" and ins[1] is not None:
        return _matmul_shape(x, ins[1])
    if op == "Transpose":
        perm = a.get("perm") or list(range(len(x)))[::-1]
        return tuple(x[p] for p in perm)
    if op == "Reshape" and ctx.version(node) in (5, 13, 14, 19, 21, 23, 24, 25) and len(ins) > 1:
        target = ctx.value(node.inputs[1])
        if target is None:
            return None
        target = [int(d) for d in target]
        if not a.get("allowzero", 0):
            target = [x[i] if d == 0 else d for i, d in enumerate(target)]
        if -1 in target:
            known = math.prod(d for d in target if d != -1)
            target[target.index(-1)] = math.prod(x) // known if known else 0
        return tuple(target) if math.prod(target) == math.prod(x) else None
    if op == "GatherElements" and len(ins) > 1 and ins[1] is not None and len(ins[1]) == len(x):
        return ins[1]
    if op == "Expand" and len(node.inputs) > 1 and (ctx.version(node) or 0) >= 8:
        target = ctx.value(node.inputs[1])
        return None if target is None else np.broadcast_shapes(x, tuple(int(d) for d in np.ravel(target)))
    if op in ("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"):
        return (*x[:2], *[1] * (len(x) - 2)) if len(x) >= 2 else None
    if op in ("Conv", "MaxPool", "AveragePool") and len(x) >= 3 and len(node.outputs) >= 1:
        return _window_shape(ctx, node, x, ins)
    if op == "Flatten":
        axis = a.get("axis", 1) % (len(x) + 1) if len(x) else 0
        return (math.prod(x[:axis]), math.prod(x[axis:]))
    if op == "Gather" and ins[1] is not None:
        axis = a.get("axis", 0) % len(x)
        return (*x[:axis], *ins[1], *x[axis + 1:])
    if op == "Concat":
        if any(s is None for s in ins) or any(len(s) != len(x) for s in ins):
            return None
        axis = a["axis"] % len(x)
        return (*x[:axis], sum(s[axis] for s in ins), *x[axis + 1:])
    if op in ("Unsqueeze", "Squeeze"):
        if (ctx.version(node) or 0) >= 13:
            axes = ctx.value(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] else None
            if axes is None and len(node.inputs) > 1 and node.inputs[1]:
                return None
        else:
            axes = a.get("axes")
        axes = None if axes is None else [int(v) for v in np.asarray(axes).ravel()]
        if op == "Squeeze":
            if axes is None:
                return tuple(d for d in x if d != 1)
            axes = {v % len(x) for v in axes}
            return tuple(d for i, d in enumerate(x) if i not in axes)
        if axes is None:
            return None
        rank = len(x) + len(axes)
        axes = {v % rank for v in axes}
        it = iter(x)
        return tuple(1 if i in axes else next(it) for i in range(rank))
    return None


def _window_shape(ctx: Context, node, x, ins):
    """Conv / MaxPool / AveragePool output shape from the spec's geometry (ops/nn/_common.py)."""
    a = node.attrs
    auto_pad = a.get("auto_pad", "NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if node.op_type == "Conv":
        if len(ins) < 2 or ins[1] is None or len(ins[1]) != len(x):
            return None
        channels, kernel = ins[1][0], a.get("kernel_shape") or ins[1][2:]
    else:
        channels, kernel = x[1], a.get("kernel_shape")
        if not kernel:
            return None
    ceil = bool(a.get("ceil_mode", 0)) and node.op_type != "Conv"
    _, _, out = geometry(x[2:], list(kernel), a.get("strides"), a.get("dilations"), a.get("pads"), auto_pad, ceil)
    return (x[0], channels, *out)


def _matmul_shape(a, b):
    if len(a) == 0 or len(b) == 0:
        return None
    a2 = (1, *a) if len(a) == 1 else a
    b2 = (*b, 1) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        return None
    out = (*np.broadcast_shapes(a2[:-2], b2[:-2]), a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out
