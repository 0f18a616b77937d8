"""Nodes that pass their input through unchanged are bypassed: their readers read the input.

- Identity (any version);
- Dropout 7 and 10 (no training mode: Y = X) and 12+ without a training_mode input or with a
  constant false one, when the mask output is not read;
- Reshape whose target shape equals its input's static shape (shapes.py finds them; common once a
  plan is specialised to its input shapes, where Shape -> Reshape round trips become no-ops).

A node is left alone when its output is a graph output or is read by a subgraph (renaming inside
bodies is not worth it), or when the node is not valid (its error must stay).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ._context import Context


def eliminate_identities(ctx: Context, also=()) -> bool:
    """Bypass the pass-through nodes of ctx, and the nodes in `also` (known pass-throughs)."""
    bypass = [n for n in ctx.nodes if _passes_through(ctx, n)]
    bypass += [n for n in also if ctx.alive(n)]
    done = False
    renamed: dict[int, object] = {}          # id(node) -> the node that replaced it (inputs renamed)
    for node in bypass:
        while id(node) in renamed:
            node = renamed[id(node)]
        x, y = node.inputs[0], node.outputs[0]
        if not x or not y or y in ctx.outputs or not ctx.alive(node):
            continue
        readers = list(ctx.consumers.get(y, []))
        if any(y in r.captures for r in readers):
            continue
        ctx.replace([node], [])
        for r in readers:
            if ctx.alive(r):
                new = replace(r, inputs=tuple(x if i == y else i for i in r.inputs))
                ctx.replace([r], [new])
                renamed[id(r)] = new
        done = True
    if done:
        ctx.refresh()
    return done


def _passes_through(ctx: Context, n) -> bool:
    if not n.inputs or not n.outputs:
        return False
    if ctx.is_op(n, "Identity"):
        return len(n.outputs) == 1
    if ctx.is_op(n, "Dropout"):
        v = ctx.version(n)
        if v < 7 or any(o and ctx.consumers.get(o) or o in ctx.outputs for o in n.outputs[1:]):
            return False
        if v >= 12 and len(n.inputs) > 2 and n.inputs[2]:
            mode = ctx.value(n.inputs[2])
            return mode is not None and np.size(mode) == 1 and not bool(np.asarray(mode).ravel()[0])
        return True
    return False
