"""DequantizeLinear -> elementwise float ops -> QuantizeLinear on 8-bit integer codes becomes one
lookup table (onnxruntime does the same for QDQ activations).

With per-tensor (one-number) constant scales and zero points, each of the 256 input codes maps to one
output code, whatever the ops between do element by element. The table is made now by running the
nodes' own kernels on the 256 codes (Context's constant evaluation), so the fused step gives bit for
bit what the written nodes give. Conditions: the DequantizeLinear's zero point is a constant uint8 /
int8 (it fixes the codes' type; without one the input type is not known before run), the ops between
are elementwise with one input from the chain and any other a constant of one element that cannot
widen the rank, every value of the chain after the codes is read by the next node alone (no graph
output, no other reader, no subgraph capture), and the QuantizeLinear yields uint8 / int8.

A QDQ model quantizes a float tensor just before such a chain and reads the result back just after
it (Conv -> QuantizeLinear -> [chain] -> DequantizeLinear -> Conv): that QuantizeLinear and that
DequantizeLinear join the step when each is the chain's only neighbour on its value, with a float32
scale and a zero point of the codes' type, constants holding one number, and no attribute changing
the arithmetic (`_quantizer`, `_dequantizer`). The kernel then goes from floats to floats without the
intermediate arrays (ops/quantization.py's quantized_lookup, proven equal to the written kernels at
prepare, else running them).
"""
from __future__ import annotations

import numpy as np

from ..graph import Node
from ._context import Context

# elementwise ops of one data input (their attributes apply element by element)
_UNARY = {"Relu", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Elu", "Selu", "Celu",
          "Softplus", "Softsign", "ThresholdedRelu", "Gelu", "Mish", "Neg", "Abs", "Exp", "Erf", "Floor",
          "Ceil", "Round", "Sign", "Sin", "Cos", "Atan"}
# elementwise ops of two operands (opset 7+: numpy broadcasting, no legacy `broadcast` attribute)
_BINARY = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "PRelu"}
_CODES = (np.dtype(np.uint8), np.dtype(np.int8))


def fuse_qdq_lookup(ctx: Context) -> bool:
    changed = False
    for q in list(ctx.nodes):
        if not ctx.alive(q) or not ctx.is_op(q, "QuantizeLinear") or len(q.outputs) != 1:
            continue
        found = _chain(ctx, q)
        if found is None:
            continue
        dq, ops = found
        codes = ctx.value(dq.inputs[2]).dtype
        table = _table(ctx, dq, ops, q, codes)
        if table is None:
            continue
        name = ctx.add_initializer(q.outputs[0] + "_table", table)
        first, last = _quantizer(ctx, dq, codes), _dequantizer(ctx, q, table.dtype)
        inputs = [first.inputs[0] if first else dq.inputs[0], name]
        if first or last:
            inputs += first.inputs[1:3] if first else ["", ""]
        if last:
            inputs += last.inputs[1:3]
        attrs = {"codes": codes.name, "q_version": ctx.version(first) if first else 0,
                 "dq_version": ctx.version(last) if last else 0}
        node = ctx.fused_node(q, "LookupTable", tuple(inputs), (last or q).outputs, attrs)
        ctx.replace([*([first] if first else []), dq, *ops, q, *([last] if last else [])], [node])
        changed = True
    return changed


# QuantizeLinear's output_dtype naming the zero point's type (TensorProto.UINT8, INT8)
_OUTPUT_DTYPE = {np.dtype(np.uint8): 2, np.dtype(np.int8): 3}


def _quantizer(ctx: Context, dq: Node, codes: np.dtype) -> Node | None:
    """The QuantizeLinear making the chain's codes, when the step can take it in: its output read by
    the chain alone, its scale a float32 and its zero point a `codes` constant holding one number, and
    no attribute changing the arithmetic (block_size, precision other than float32, output_dtype other
    than the zero point's type)."""
    q = ctx.producer.get(dq.inputs[0])
    if (not ctx.is_op(q, "QuantizeLinear") or len(q.outputs) != 1 or not ctx.only_consumer(dq.inputs[0], dq)
            or not _per_tensor(ctx, q, zero_point_needed=True) or q.attrs.get("block_size", 0)
            or q.attrs.get("precision", 0) not in (0, 1)
            or q.attrs.get("output_dtype", 0) not in (0, _OUTPUT_DTYPE[codes])):
        return None
    s, z = ctx.value(q.inputs[1]), ctx.value(q.inputs[2])
    return q if s.dtype == np.float32 and z.dtype == codes else None


def _dequantizer(ctx: Context, q: Node, codes: np.dtype) -> Node | None:
    """The DequantizeLinear alone reading the chain's codes, when the step can take it in: a float32
    scale and a `codes` zero point, constants holding one number, float32 out, no block_size."""
    dq = ctx.single_user(q.outputs[0])
    if (not ctx.is_op(dq, "DequantizeLinear") or dq.inputs[0] != q.outputs[0] or len(dq.outputs) != 1
            or not _per_tensor(ctx, dq, zero_point_needed=True) or dq.attrs.get("block_size", 0)
            or dq.attrs.get("output_dtype", 0) not in (0, 1)):
        return None
    s, z = ctx.value(dq.inputs[1]), ctx.value(dq.inputs[2])
    return dq if s.dtype == np.float32 and z.dtype == codes else None


def _chain(ctx: Context, q: Node):
    """(dq, [ops from dq to q]) when q's input is such a chain, else None."""
    if not _per_tensor(ctx, q, zero_point_needed=False):
        return None
    ops: list[Node] = []
    x, widest = q.inputs[0], 0
    while x:
        node = ctx.producer.get(x)
        if node is None or len(node.outputs) != 1 or not ctx.only_consumer(x, _next(ops, q)):
            return None
        if ctx.is_op(node, "DequantizeLinear"):
            ok = (_per_tensor(ctx, node, zero_point_needed=True) and not node.attrs.get("block_size")
                  and ctx.value(node.inputs[2]).dtype in _CODES
                  and (widest == 0 or (ctx.rank(node.inputs[0]) or 0) >= widest))   # the shape stays
            return (node, ops[::-1]) if ok else None
        found = _operand(ctx, node)
        if found is None or len(ops) > 32:
            return None
        x, widest = found[0], max(widest, found[1])
        ops.append(node)
    return None


def _next(ops: list[Node], q: Node) -> Node:
    return ops[-1] if ops else q


def _per_tensor(ctx: Context, node: Node, zero_point_needed: bool) -> bool:
    """Scale (and zero point, when given) are constants holding one number."""
    ins = node.inputs
    if len(ins) < 2 or not ins[0] or not ins[1] or (zero_point_needed and (len(ins) < 3 or not ins[2])):
        return False
    for name in ins[1:3]:
        v = ctx.value(name) if name else np.zeros(())
        if not isinstance(v, np.ndarray) or v.size != 1:
            return False
    return True


def _operand(ctx: Context, node: Node) -> tuple[str, int] | None:
    """(the input of `node` coming down the chain, the largest rank of its other inputs) when `node` is
    an elementwise op whose other inputs are constants of one element; else None."""
    if node.op_type in _UNARY and len(node.inputs) == 1 and node.inputs[0] and ctx.is_op(node, node.op_type):
        return node.inputs[0], 0
    if node.op_type == "Clip" and node.inputs and node.inputs[0] and ctx.is_op(node, "Clip"):
        ranks = [_one_number_rank(ctx, c) for c in node.inputs[1:]]
        return None if None in ranks else (node.inputs[0], max(ranks, default=0))
    if (node.op_type in _BINARY and len(node.inputs) == 2 and ctx.is_op(node, node.op_type)
            and ctx.version(node) >= 7):
        a, b = node.inputs
        if a and b and ctx.is_constant(a) != ctx.is_constant(b):
            x, c = (b, a) if ctx.is_constant(a) else (a, b)
            rank = _one_number_rank(ctx, c)
            if rank is None or (node.op_type == "PRelu" and x != a):
                return None
            return x, rank
    return None


def _one_number_rank(ctx: Context, name: str) -> int | None:
    """The rank of a constant holding one number (0 for an omitted input), else None."""
    if not name:
        return 0
    v = ctx.value(name) if ctx.is_constant(name) else None
    return v.ndim if isinstance(v, np.ndarray) and v.size == 1 else None


def _table(ctx: Context, dq: Node, ops: list[Node], q: Node, codes: np.dtype) -> np.ndarray | None:
    """The output code of each input code, indexed by the code's bits read as uint8 (int8's -1 at 255)."""
    value = np.arange(256, dtype=np.uint8).view(codes)
    with np.errstate(all="ignore"):      # a code the run never sees may overflow: the table keeps what it gives
        for node in (dq, *ops, q):
            x = dq.inputs[0] if node is dq else (q.inputs[0] if node is q else _operand(ctx, node)[0])
            # the chain's operand takes the codes' image so far; the other inputs are constants
            args = [value if name == x else (ctx.value(name) if name else None) for name in node.inputs]
            out = ctx._evaluate(node, args)
            if not out or not isinstance(out[0], np.ndarray) or out[0].size != 256:
                return None
            value = out[0].reshape(256)
    return value.copy() if value.dtype in _CODES else None
