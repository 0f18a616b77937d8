"""Conv / Gemm / MatMul (+ Add bias) + activation fused into one step of the private domain.

- Conv followed by an Add / Sum of a residual (its output read by that node alone) becomes a fused
  Conv adding the residual in place;
- MatMul followed by an Add of its product (the product read by that Add alone) becomes a fused
  MatMul with a bias (added in place); a second Add of that sum (read by it alone) becomes the fused
  MatMul's second addend, added after the bias as the graph associates them ((x W + bias) + addend:
  a Scan RNN cell's x W + h R + b in one step with its Tanh);
- an activation (Relu, Clip with constant bounds, LeakyRelu, Sigmoid, HardSigmoid, HardSwish, Tanh,
  and the SiLU and the written-out HardSwish (ClipSwish) the pattern pass found) whose input is the
  output of a Conv, a Gemm (opset 7+), a MatMul or a fused one without an activation yet, read by that
  activation alone, is applied in place on the product's buffer;
- an inference BatchNormalization with constant parameters followed by an activation becomes one
  per-channel x * factor + shift step (factor and shift computed once) with the activation in place;
- a Mul by and / or an Add of a one-element constant after a fused Conv's activation join it
  (fuse_affine_after_activation).
"""
from __future__ import annotations

import numpy as np

from ._context import FUSED_DOMAIN, Context, post_order_value
from .fold_batchnorm import affine_after, channel_operand, inference_bn

_ACT_VERSIONS = {"Relu": (1, 6, 13, 14), "LeakyRelu": (1, 6, 16), "Sigmoid": (1, 6, 13), "Tanh": (1, 6, 13),
                 "HardSigmoid": (1, 6, 22), "HardSwish": (14, 22), "Clip": (1, 6, 11, 12, 13)}


def _activation(ctx: Context, node):
    """(name, params) if `node` is an activation the fused kernels apply, else None."""
    if node.domain == FUSED_DOMAIN and node.op_type == "Swish" and len(node.inputs) == 1:
        return "Swish", ()
    if node.domain == FUSED_DOMAIN and node.op_type == "ClipSwish" and len(node.inputs) == 1:
        return "ClipSwish", (float(node.attrs.get("scale_op", "Div") == "Div"), float(node.attrs.get("scale", 6.0)))
    for op, versions in _ACT_VERSIONS.items():
        if ctx.is_op(node, op, versions):
            break
    else:
        return None
    a = node.attrs
    if op == "LeakyRelu":
        return op, (float(a.get("alpha", _f32(0.01))),)
    if op == "HardSigmoid":
        return op, (float(a.get("alpha", _f32(0.2))), float(a.get("beta", 0.5)))
    if op == "Clip":
        if ctx.version(node) < 11:
            return op, (a.get("min"), a.get("max"))
        bounds = []
        for i in (1, 2):
            name = node.inputs[i] if len(node.inputs) > i else ""
            if not name:
                bounds.append(None)
                continue
            v = ctx.scalar(name)
            if v is None:
                return None
            bounds.append(v)
        return op, tuple(bounds)
    return op, ()


def _f32(v: float) -> float:
    """The value an ONNX float attribute holding v has (the kernels' defaults)."""
    return float(np.float32(v))


def fuse_matmul_add(ctx: Context) -> bool:
    changed = False
    for add in list(ctx.nodes):
        if not ctx.alive(add):
            continue
        if not ctx.is_op(add, "Add", (7, 13, 14)) or len(add.inputs) != 2:
            continue
        for i in (0, 1):
            mm = ctx.producer.get(add.inputs[i])
            bias = add.inputs[1 - i]
            if (mm is not None and bias and bias != add.inputs[i] and ctx.only_consumer(add.inputs[i], add)
                    and ((ctx.is_op(mm, "MatMul", (1, 9, 13)) and len(mm.inputs) == 2) or _takes_addend(mm))):
                # Add(a, b) is Add(b, a) bit for bit: only the association matters, and the fused
                # kernel keeps the graph's: the product, + the first Add's operand, + this one's
                ctx.replace([mm, add], [ctx.fused_node(mm, "MatMul", (*mm.inputs, bias), add.outputs, {})])
                changed = True
                break
    return changed


def _takes_addend(node) -> bool:
    """A fused MatMul with its bias and neither a second addend nor an activation yet."""
    return (node.domain == FUSED_DOMAIN and node.op_type == "MatMul" and len(node.inputs) == 3
            and all(node.inputs) and not node.attrs)


def fuse_conv_add(ctx: Context) -> bool:
    """Conv + Add / Sum of a residual (the Conv's output read by that node alone) -> fused Conv with Z."""
    changed = False
    depth: dict[str, int] = {}
    for add in list(ctx.nodes):
        if not ctx.alive(add) or len(add.inputs) != 2 or not all(add.inputs) or add.inputs[0] == add.inputs[1]:
            continue
        if not (ctx.is_op(add, "Add", (7, 13, 14)) or ctx.is_op(add, "Sum", (6, 8, 13))):
            continue
        # Into the deeper operand's Conv (the main path of a residual block, not its projection
        # shortcut): the shortcut Conv then stays a branch of its own, which schedule.py can run
        # beside the main path. Equal depths: the later operand, as the other is computed before.
        d0, d1 = (_depth(ctx, x, depth) for x in add.inputs)
        for i in ((0, 1) if d0 > d1 else (1, 0)):
            conv = ctx.producer.get(add.inputs[i])
            if (conv is not None and ctx.is_op(conv, "Conv", (1, 11, 22)) and len(conv.outputs) == 1
                    and ctx.only_consumer(add.inputs[i], add)):
                inputs = (*conv.inputs, *("",) * (3 - len(conv.inputs)), add.inputs[1 - i])
                ctx.replace([conv, add], [ctx.fused_node(conv, "Conv", inputs, add.outputs, dict(conv.attrs))])
                changed = True
                break
    return changed


def _depth(ctx: Context, name: str, memo: dict[str, int]) -> int:
    """Length of the longest chain of nodes producing `name` (0 for inputs and constants; a cycle,
    which build_plan reports later, counts as 0 where it closes)."""
    def expand(x):
        node = ctx.producer.get(x)
        if node is None:
            return 0, None
        return None, ([i for i in node.inputs if i], lambda ds: 1 + max((d or 0 for d in ds), default=0))
    return post_order_value(name, memo, expand)


def fuse_activations(ctx: Context) -> bool:
    changed = False
    for act in list(ctx.nodes):
        if not ctx.alive(act):
            continue
        if not act.inputs or not act.inputs[0] or len([o for o in act.outputs if o]) != 1:
            continue
        spec = _activation(ctx, act)
        if spec is None:
            continue
        x = act.inputs[0]
        p = ctx.producer.get(x)
        if p is None or not ctx.only_consumer(x, act) or len(p.outputs) != 1:
            continue
        if ctx.is_op(p, "Conv", (1, 11, 22)):
            op, attrs = "Conv", dict(p.attrs)
        elif ctx.is_op(p, "Gemm", (7, 9, 11, 13)):
            op, attrs = "Gemm", dict(p.attrs)
        elif ctx.is_op(p, "MatMul", (1, 9, 13)):
            op, attrs = "MatMul", {}
        elif p.domain == FUSED_DOMAIN and p.op_type in ("Conv", "Gemm", "MatMul") and not p.attrs.get("activation"):
            op, attrs = p.op_type, dict(p.attrs)
        elif ctx.is_op(p, "BatchNormalization") and _channel_affine(ctx, p) is not None:
            a, b = _channel_affine(ctx, p)
            inputs = (p.inputs[0], ctx.add_initializer(p.inputs[1] + "_factor", a),
                      ctx.add_initializer(p.inputs[2] + "_shift", b))
            attrs = {"activation": spec[0], "activation_params": tuple(spec[1])}
            ctx.replace([p, act], [ctx.fused_node(p, "ChannelAffine", inputs, act.outputs, attrs)])
            changed = True
            continue
        else:
            continue
        attrs.update(activation=spec[0], activation_params=tuple(spec[1]))
        ctx.replace([p, act], [ctx.fused_node(p, op, p.inputs, act.outputs, attrs)])
        changed = True
    return changed


def fuse_affine_after_activation(ctx: Context) -> bool:
    """A fused Conv with an activation whose output is read only by a Mul by a one-element constant, then
    (or only) an Add of one (PP-LCNetV3's learnable affine after each HardSwish): both join the Conv as
    its `affine` attribute, applied in place after the activation in the same order (ops/fused.py's
    _activation: the same float operations). float32 / float64 constants of W's type only."""
    changed = False
    for conv in list(ctx.nodes):
        if (not ctx.alive(conv) or conv.domain != FUSED_DOMAIN or conv.op_type != "Conv"
                or not conv.attrs.get("activation") or conv.attrs.get("affine") or conv.attrs.get("shuffle")
                or len(conv.outputs) != 1 or len(conv.inputs) < 2 or not ctx.is_constant(conv.inputs[1])):
            continue
        w = ctx.value(conv.inputs[1])
        if not isinstance(w, np.ndarray) or w.dtype not in (np.float32, np.float64):
            continue
        # fold_batchnorm's walk, one element (channels 1); the constants kept apart, in their order, as the
        # steps apply them (c and d combined in float64 would lose a shift of -0.0)
        _, _, absorbed, last = affine_after(ctx, conv, w.ndim, 1, w.dtype)
        steps, x = {}, conv.outputs[0]
        for node in absorbed:
            steps[node.op_type] = float(channel_operand(ctx, node, x, w.ndim, 1, w.dtype)[0])
            x = node.outputs[0]
        if not absorbed:
            continue
        attrs = {**conv.attrs, "affine": (steps.get("Mul"), steps.get("Add"))}
        ctx.replace([conv, *absorbed], [ctx.fused_node(conv, "Conv", conv.inputs, last.outputs, attrs)])
        changed = True
    return changed


def _channel_affine(ctx: Context, bn):
    """(factor, shift) of an inference BatchNormalization with constant parameters, computed in float64
    and rounded to float32 (float64 if a parameter is float64); None for any other BN."""
    eps = inference_bn(ctx, bn)
    if eps is None or not bn.inputs[0]:
        return None
    params = [ctx.value(x) for x in bn.inputs[1:]]
    if any(not isinstance(p, np.ndarray) or p.ndim != 1 or p.dtype.kind != "f" or len(p) != len(params[0])
           for p in params):
        return None
    dt = np.float64 if any(p.dtype == np.float64 for p in params) else np.float32
    scale, bias, mean, var = (p.astype(np.float64) for p in params)
    a = scale / np.sqrt(var + eps)
    return a.astype(dt), (bias - mean * a).astype(dt)
