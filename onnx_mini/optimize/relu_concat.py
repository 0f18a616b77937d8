"""A Relu after a Concat applied to the Concat's inputs instead, only to those that can be negative.

Relu(Concat(a, b, ...)) = Concat(Relu(a), Relu(b), ...): Relu is elementwise and Concat only places
values. An input that cannot hold a negative value needs no Relu (Relu(v) is v for v >= 0 and for
NaN, which Relu keeps): the output of a Relu, and a MaxPool, AveragePool, GlobalMaxPool,
GlobalAveragePool or Concat of such values (maxima and means of values >= 0; a MaxPool only when no
padding reaches a whole window, so that every window reads an input cell). The other inputs get a
Relu each, which fuse.py then folds into the convolution producing them (this pass runs before it).
ShuffleNet's stride-2 units concatenate a pooled branch (it pools the unit's input, a Relu's output)
with a convolution's: the Relu then runs on the convolution's part alone, inside that convolution,
and the Concat's result is final (one pass over the concatenated tensor less per unit).
"""
from __future__ import annotations

from dataclasses import replace

from ._context import Context

_RELU = (1, 6, 13, 14)
_CONCAT = (1, 4, 11, 13)
_POOLS = frozenset({"AveragePool", "GlobalAveragePool", "GlobalMaxPool"})     # any padding: means, maxima
_DEPTH = 16


def push_relu_into_concat(ctx: Context) -> bool:
    changed = False
    for relu in list(ctx.nodes):
        if not ctx.alive(relu) or not ctx.is_op(relu, "Relu", _RELU) or len(relu.outputs) != 1:
            continue
        concat = ctx.producer.get(relu.inputs[0])
        if (concat is None or not ctx.is_op(concat, "Concat", _CONCAT) or len(concat.outputs) != 1
                or not ctx.only_consumer(concat.outputs[0], relu) or any(not x for x in concat.inputs)):
            continue
        signs = [non_negative(ctx, x) for x in concat.inputs]
        if not any(signs):
            continue
        new_inputs, relus, made = [], [], {}
        for x, ok in zip(concat.inputs, signs):
            if not ok and x not in made:
                made[x] = ctx.new_name(x + "_relu")
                relus.append(replace(relu, name=f"{relu.name or 'Relu'}/{len(relus)}", inputs=(x,),
                                     outputs=(made[x],)))
            new_inputs.append(x if ok else made[x])
        ctx.replace([concat, relu], relus + [replace(concat, inputs=tuple(new_inputs), outputs=relu.outputs)])
        changed = True
    return changed


def non_negative(ctx: Context, name: str, depth: int = 0) -> bool:
    """Whether every value of `name` is >= 0 or NaN, by the nodes that make it (see the module doc)."""
    node = ctx.producer.get(name)
    if node is None or depth > _DEPTH or node.outputs[0] != name:
        return False
    if ctx.is_op(node, "Relu", _RELU):
        return True
    if ctx.is_op(node, "Concat", _CONCAT):
        return all(x and non_negative(ctx, x, depth + 1) for x in node.inputs)
    if node.op_type in _POOLS or (node.op_type == "MaxPool" and _windows_read_input(node.attrs)):
        return ctx.is_op(node, node.op_type) and non_negative(ctx, node.inputs[0], depth + 1)
    return False


def _windows_read_input(attrs) -> bool:
    """No pad of a MaxPool reaches a whole window extent ((k - 1) * d + 1): every window holds an
    input cell (auto_pad SAME pads at most extent - 1 in all; VALID none)."""
    kernel = attrs.get("kernel_shape")
    if not kernel:
        return False
    dil = attrs.get("dilations") or [1] * len(kernel)
    pads = attrs.get("pads")
    if str(attrs.get("auto_pad", "NOTSET")) != "NOTSET" or not pads:
        return True
    r = len(kernel)
    return len(pads) == 2 * r and len(dil) == r and all(p <= (kernel[i % r] - 1) * dil[i % r]
                                                        for i, p in enumerate(pads))
