"""A QDQ model's requantization step fused into the Conv before it.

qdq_pair.py's QuantizeDequantize and qdq_lut.py's LookupTable taking floats in and giving floats out
(q_version and dq_version set) follow nearly every Conv of a QDQ model. Where such a step alone reads
the output of a Conv (the default domain's, or a fused Conv / ConvNHWC without a channel shuffle),
that output being no graph output nor captured, the two become one fused Conv / ConvNHWC whose
`requantize` attribute names the step: its kernel runs the step's own operations in place in the
Conv's epilogue (ops/fused.py's _requantized), on each part a channels-last depthwise Conv finishes
on its thread, bit for bit what the two nodes give. The step's inputs follow X, W, B, Z. Runs last,
after channels_last.py, which takes the Conv and step nodes as they are. No pass is saved (the step
does its passes on the Conv's buffer instead of a new one); a step, its buffer and its dispatch are:
the QDQ MobileNet takes 0.94-0.97x the CPU time a run (one thread, 300 runs alternating, under load),
0.94-0.99x the wall time with two threads.
"""
from __future__ import annotations

from ._context import FUSED_DOMAIN, Context

_STEPS = {"QuantizeDequantize": ("q_version", "dq_version"), "LookupTable": ("codes", "q_version", "dq_version")}


def fuse_requantize(ctx: Context) -> bool:
    changed = False
    for step in list(ctx.nodes):
        if (not ctx.alive(step) or step.domain != FUSED_DOMAIN or step.op_type not in _STEPS
                or len(step.outputs) != 1 or not step.inputs or not step.inputs[0]
                or not step.attrs.get("q_version") or not step.attrs.get("dq_version")):
            continue
        x = step.inputs[0]
        conv = ctx.producer.get(x)
        if conv is None or len(conv.outputs) != 1 or not ctx.only_consumer(x, step) or len(conv.inputs) > 4:
            continue
        if ctx.is_op(conv, "Conv", (1, 11, 22)):
            attrs = dict(conv.attrs)
        elif (conv.domain == FUSED_DOMAIN and conv.op_type in ("Conv", "ConvNHWC")
              and not conv.attrs.get("shuffle") and not conv.attrs.get("requantize")):
            attrs = dict(conv.attrs)
        else:
            continue
        attrs["requantize"] = step.op_type
        attrs.update((k, step.attrs[k]) for k in _STEPS[step.op_type] if k in step.attrs)
        inputs = (*conv.inputs, *("",) * (4 - len(conv.inputs)), *step.inputs[1:])
        op = "ConvNHWC" if conv.op_type == "ConvNHWC" else "Conv"
        ctx.replace([conv, step], [ctx.fused_node(conv, op, inputs, step.outputs, attrs)])
        changed = True
    return changed
