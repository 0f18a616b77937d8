"""Dead-node elimination: nodes none of whose outputs is read (by a node, a subgraph capture or as a
graph output) go, transitively; so do initializers nothing reads any more (those backing a graph
input stay: they are the input's default). ONNX ops have no side effects, so nothing else is kept;
a random op nobody reads goes too."""
from __future__ import annotations

from ._context import Context


def eliminate_dead_nodes(ctx: Context) -> bool:
    uses: dict[str, int] = {}
    for n in ctx.nodes:
        for x in (*n.inputs, *n.captures):
            if x:
                uses[x] = uses.get(x, 0) + 1
    for name in ctx.outputs:
        uses[name] = uses.get(name, 0) + 1

    def dead(n) -> bool:
        return not any(o and uses.get(o, 0) for o in n.outputs)

    removed: set[int] = set()
    stack = [n for n in ctx.nodes if dead(n)]
    while stack:
        n = stack.pop()
        if id(n) in removed:
            continue
        removed.add(id(n))
        for x in (*n.inputs, *n.captures):
            if x:
                uses[x] -= 1
                p = ctx.producer.get(x)
                if uses[x] == 0 and p is not None and id(p) not in removed and dead(p):
                    stack.append(p)
    unused = [k for k in ctx.initializers if not uses.get(k) and k not in ctx.overridable]
    for k in unused:
        del ctx.initializers[k]
    if removed:
        ctx.nodes = [n for n in ctx.nodes if id(n) not in removed]
        ctx.refresh()
    return bool(removed or unused)
