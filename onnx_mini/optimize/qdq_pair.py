"""QuantizeLinear -> DequantizeLinear with the same constant per-tensor parameters becomes one
QuantizeDequantize step (a QDQ model's activations: every Conv output is quantized and read back).

The pair's float result is (saturate(round(x / s) + zp) - zp) * s; the fused kernel computes it on
float32 without making the integer codes (ops/fused.py: five passes over one buffer instead of the
pair's seven over three), bit for bit what the written nodes give. Conditions: the QuantizeLinear's
output is read by the DequantizeLinear alone (no graph output, no other reader, no subgraph capture);
both scales are the same float32 number and both zero points the same 8/16-bit integer, all constants
holding one number; no block_size, output_dtype (other than the zero point's / float32) or precision
(other than float32) attribute; and the two nodes' own kernels, run now on a probe, accept these
parameters (the fused kernel falls back to those kernels for anything but a float32 x).
Runs after qdq_lut.py, whose DequantizeLinear -> ops -> QuantizeLinear chains take their pairs first.
"""
from __future__ import annotations

import numpy as np

from ..graph import Node
from ._context import Context

_F32 = np.dtype(np.float32)
_ZERO_POINTS = frozenset(np.dtype(t) for t in (np.uint8, np.int8, np.uint16, np.int16))


def fuse_qdq_pairs(ctx: Context) -> bool:
    changed = False
    for q in list(ctx.nodes):
        if not ctx.alive(q) or not ctx.is_op(q, "QuantizeLinear") or len(q.outputs) != 1:
            continue
        dq = ctx.single_user(q.outputs[0])
        if not ctx.is_op(dq, "DequantizeLinear") or dq.inputs[0] != q.outputs[0] or len(dq.outputs) != 1:
            continue
        params = _params(ctx, q, dq)
        if params is None:
            continue
        node = ctx.fused_node(q, "QuantizeDequantize", (q.inputs[0], q.inputs[1], q.inputs[2]), dq.outputs,
                              {"q_version": ctx.version(q), "dq_version": ctx.version(dq)})
        ctx.replace([q, dq], [node])
        changed = True
    return changed


def _params(ctx: Context, q: Node, dq: Node):
    """(scale, zero point) when the pair qualifies (see the module's docstring), else None."""
    if len(q.inputs) < 3 or len(dq.inputs) < 3 or not all(q.inputs[:3]) or not all(dq.inputs[:3]):
        return None
    if q.attrs.get("block_size", 0) or dq.attrs.get("block_size", 0) or q.attrs.get("precision", 0) not in (0, 1) \
            or dq.attrs.get("output_dtype", 0) not in (0, 1):
        return None
    values = [ctx.value(n) for n in (*q.inputs[1:3], *dq.inputs[1:3])]
    if not all(isinstance(v, np.ndarray) and v.size == 1 and v.ndim <= 1 for v in values):
        return None
    s, z, s2, z2 = values
    if s.dtype != _F32 or s2.dtype != _F32 or z.dtype not in _ZERO_POINTS or z2.dtype != z.dtype:
        return None
    if s.reshape(()).view(np.uint32) != s2.reshape(()).view(np.uint32) or z.reshape(()) != z2.reshape(()):
        return None
    # the written kernels accept these parameters and give the types the fused step gives
    probe = np.zeros(1, _F32)
    codes = ctx._evaluate(q, [probe, s, z])
    if not codes or not isinstance(codes[0], np.ndarray) or codes[0].dtype != z.dtype:
        return None
    back = ctx._evaluate(dq, [codes[0], s2, z2])
    if not back or not isinstance(back[0], np.ndarray) or back[0].dtype != _F32:
        return None
    return s, z
