"""What every pass needs to look at a graph: producers, consumers, the values that must stay visible,
constant values (initializers and constant-only subgraphs, evaluated on demand), opset versions."""
from __future__ import annotations

import functools
import itertools
import math
from dataclasses import replace
from typing import Any

import numpy as np
import onnx.defs

from ..binding import bind, evaluate, resolved_kernel
from ..graph import Graph, Node, ValueInfo, normalize_domain
from ..ops.fused import FUSED_DOMAIN

_names = itertools.count()
@functools.lru_cache(maxsize=None)
def _since(domain: str, op_type: str, opset: int) -> int | None:
    try:
        return onnx.defs.get_schema(op_type, opset, domain).since_version
    except onnx.defs.SchemaError:
        return None


def has_subgraph(node: Node) -> bool:
    return any(isinstance(v, Graph) or (isinstance(v, list) and v and isinstance(v[0], Graph))
               for v in node.attrs.values())


def _declared_rank(vi: ValueInfo) -> int | None:
    t = vi.type
    return len(t.shape) if t is not None and t.kind == "tensor" and t.shape is not None else None



def unpadded(attrs: dict) -> bool:
    """A Conv's (or pool's) attributes add no padding: no pads, auto_pad NOTSET or VALID (for the 1x1
    kernels the passes check, SAME would not pad either, but its output size rule differs)."""
    return (not any(int(p) for p in attrs.get("pads", ()) or ())
            and attrs.get("auto_pad", "NOTSET") in ("NOTSET", "VALID"))


def written_nodes(nodes: list[Node]) -> tuple[str, ...]:
    """The nodes of the graph as written that `nodes` stand for: their own fused_from, or their name
    (`<OpType>@<position in the graph>` when unnamed)."""
    labels = (n.fused_from or (n.name or f"{n.op_type}@{n.index}",) for n in nodes)
    return tuple(dict.fromkeys(x for group in labels for x in group))


class Context:
    """One graph under optimisation. Passes read it through these helpers and rewrite `nodes` via
    `replace`; `refresh()` rebuilds the producer/consumer maps after a pass."""

    def __init__(self, graph: Graph, opsets: dict[str, int], functions=None, outer_scope=(),
                 static_inputs: bool = False):
        self.graph = graph
        self.opsets = opsets
        self.functions = functions or {}
        self.outer_scope = set(outer_scope)
        self.nodes = list(graph.nodes)
        self.initializers: dict[str, Any] = dict(graph.initializers)
        self.overridable = {v.name for v in graph.inputs}
        self.static_inputs = static_inputs
        self._values: dict[str, Any] = {}
        self._constant: dict[str, bool] = {}
        self._valid: dict[int, tuple[Node, bool]] = {}
        self._ranks: dict[str, int | None] = {}
        self.refresh()

    # -- structure ------------------------------------------------------------------------------
    def refresh(self) -> None:
        self._ranks = {}
        self.producer: dict[str, Node] = {}
        self.consumers: dict[str, list[Node]] = {}
        for n in self.nodes:
            self._index(n)
        self.outputs = {v.name for v in self.graph.outputs}

    def _index(self, n: Node) -> None:
        for o in n.outputs:
            if o:
                self.producer[o] = n
        for x in (*n.inputs, *n.captures):
            if x:
                self.consumers.setdefault(x, []).append(n)

    def only_consumer(self, name: str, node: Node) -> bool:
        """`node` is the one reader of `name` (reading it once), and nothing else sees it."""
        users = self.consumers.get(name, [])
        return (name not in self.outputs and len(users) == 1 and users[0] is node
                and sum(1 for x in (*node.inputs, *node.captures) if x == name) == 1)

    def single_user(self, name: str) -> Node | None:
        """The node that alone reads `name` (once), or None (several readers, a graph output, none)."""
        users = self.consumers.get(name, [])
        if len(users) == 1 and self.only_consumer(name, users[0]):
            return users[0]
        return None

    def version(self, node: Node) -> int | None:
        """The schema version (since_version) in force for the node; None for unknown or local ops."""
        domain = normalize_domain(node.domain)
        if (node.domain, node.op_type) in self.functions or (domain, node.op_type) in self.functions:
            return None
        opset = (node.opsets or self.opsets).get(domain, (node.opsets or self.opsets).get(node.domain))
        if opset is None or not onnx.defs.has(node.op_type, domain):
            return None
        return _since(domain, node.op_type, opset)

    def is_op(self, node: Node | None, op_type: str, versions=None) -> bool:
        """node is op_type of the default domain at a version in `versions` (None: any known), and a
        valid node (a pass never rewrites away a node whose binding would fail: its error must stay)."""
        if node is None or node.op_type != op_type or normalize_domain(node.domain) != "":
            return False
        v = self.version(node)
        return v is not None and (versions is None or v in versions) and self.valid(node)

    def valid(self, node: Node) -> bool:
        """The node's kernel binds: known attributes, required ones given, the factory accepts them."""
        seen = self._valid.get(id(node))
        if seen is not None and seen[0] is node:
            return seen[1]
        opsets = node.opsets or self.opsets
        ok = False
        try:
            spec, opset = resolved_kernel(node, opsets, self.functions)
            if spec is not None and not has_subgraph(node):
                bind(node, spec, opset, opsets=opsets)
                ok = True
        except Exception:
            ok = False
        self._valid[id(node)] = (node, ok)
        return ok

    def new_name(self, hint: str) -> str:
        """A value name no input, initializer, node output or outer-scope value uses."""
        while True:
            name = f"{hint}__opt{next(_names)}"
            if not (name in self.initializers or name in self.producer or name in self.overridable
                    or name in self.outer_scope):
                return name

    def add_initializer(self, hint: str, value: np.ndarray) -> str:
        name = self.new_name(hint)
        value.flags.writeable = False
        self.initializers[name] = value
        self._values[name] = value
        return name

    @property
    def nodes(self) -> list[Node]:
        """The live nodes in file order (a rewrite's nodes take the place of the last node they replace)."""
        if self._list is None:
            self._list = sorted(self._live.values(), key=lambda n: self._key[id(n)])
        return self._list

    @nodes.setter
    def nodes(self, nodes: list[Node]) -> None:
        self._live = {id(n): n for n in nodes}
        self._key = {id(n): float(i) for i, n in enumerate(nodes)}
        self._list = list(nodes)

    def alive(self, node: Node) -> bool:
        return self._live.get(id(node)) is node

    def replace(self, old: list[Node], new: list[Node]) -> None:
        """Remove the `old` nodes; the `new` ones take the place of the last of them.
        The producer/consumer maps are updated for just these nodes. Several nodes becoming one (a
        fusion, a fold) leave their names on it (Node.fused_from), for the profile to show."""
        if len(old) > 1 and len(new) == 1:
            new = [replace(new[0], fused_from=written_nodes(old))]
        ids = {id(n) for n in old}
        key = max(self._key[i] for i in ids)
        for i in ids:
            del self._live[i]
        for j, n in enumerate(new):
            self._live[id(n)] = n
            self._key[id(n)] = key + (j + 1) * 1e-6
        self._list = None
        self._ranks = {}
        for n in old:
            for o in n.outputs:
                if o and self.producer.get(o) is n:
                    del self.producer[o]
            for x in (*n.inputs, *n.captures):
                if x:
                    users = self.consumers.get(x, [])
                    users[:] = [u for u in users if id(u) not in ids]
        for n in new:
            self._index(n)

    def fused_node(self, anchor: Node, op_type: str, inputs, outputs, attrs: dict) -> Node:
        # named after the anchor ('conv1/Conv', kept when fused again); unnamed if it is: the profile
        # then calls it `<OpType>_<step>` and lists the nodes it replaced (fused_from)
        name = anchor.name if anchor.domain == FUSED_DOMAIN else f"{anchor.name}/{op_type}" if anchor.name else ""
        return Node(name=name, op_type=op_type, domain=FUSED_DOMAIN,
                    inputs=tuple(inputs), outputs=tuple(outputs), attrs=attrs, index=anchor.index)

    # -- constants ------------------------------------------------------------------------------
    def is_constant(self, name: str, _depth: int = 0) -> bool:
        if not name:
            return True
        if name in self._values:
            return self._values[name] is not None
        if name in self.initializers:
            return name not in self.overridable
        known = self._constant.get(name)
        if known is not None:
            return known
        node = self.producer.get(name)
        if node is None or _depth > 200 or not self._evaluable(node):
            return False
        result = self._constant[name] = all(self.is_constant(x, _depth + 1) for x in node.inputs)
        return result

    def _evaluable(self, node: Node) -> bool:
        return not node.captures and not has_subgraph(node) and node.domain != FUSED_DOMAIN

    def value(self, name: str) -> Any:
        """The constant value of `name` (evaluating the constant-only nodes that make it), or None."""
        if name in self._values:
            return self._values[name]
        if not self.is_constant(name):
            return None
        if name in self.initializers:
            return self.initializers[name]
        node = self.producer[name]
        args = [self.value(x) if x else None for x in node.inputs]
        if any(a is None for a, x in zip(args, node.inputs) if x):
            return None
        results = self._evaluate(node, args)
        if results is None:
            for o in node.outputs:
                if o:
                    self._values[o] = None
            return None
        for o, v in zip(node.outputs, results):
            if o:
                self._values[o] = v
        return self._values.get(name)

    def _evaluate(self, node: Node, args: list) -> list | None:
        """Run one constant node now through its kernel (binding.evaluate; None for function bodies and
        kernels that must not be folded, left to the planner)."""
        return evaluate(node, args, node.opsets or self.opsets, self.functions)

    def scalar(self, name: str) -> float | None:
        """The value of a constant holding one number (any shape of size 1), as a float."""
        v = self.value(name) if name else None
        if not isinstance(v, np.ndarray) or v.size != 1 or v.dtype.kind not in "fiu":
            return None
        return float(v.reshape(()))

    def close(self, name: str, target: float, rtol: float = 1e-4) -> bool:
        v = self.scalar(name)
        return v is not None and math.isclose(v, target, rel_tol=rtol, abs_tol=1e-12)

    # -- declared types ---------------------------------------------------------------------------
    def static_shape(self, name: str) -> tuple[int, ...] | None:
        """The shape of `name` when it is certain before run: constants, and the graph inputs whose
        declared dims are all fixed (the run checks fed values against them)."""
        v = self._values.get(name) if name in self._values else (
            self.initializers.get(name) if name in self.initializers and name not in self.overridable else None)
        if v is None and name in self.producer and self.producer[name].op_type == "Constant" \
                and self.producer[name].domain in ("", "ai.onnx") and self.is_constant(name):
            v = self.value(name)    # a Constant node's value (its attribute: cheap), e.g. a scale's (1,)
        if isinstance(v, np.ndarray):
            return v.shape
        if self.static_inputs:
            for vi in self.graph.inputs:
                if vi.name == name and name not in self.initializers:
                    t = vi.type
                    if (t is not None and t.kind == "tensor" and t.shape is not None
                            and all(isinstance(d, int) and d >= 0 for d in t.shape)):
                        return tuple(t.shape)
        return None

    def rank(self, name: str) -> int | None:
        """The rank of `name` when known: a static shape, a declared shape (inputs, value_info), or
        carried through the ops that keep their first input's rank (Conv: its constant weights').
        Kept per name until the graph changes: through a broadcasting op the walk visits both inputs, and
        a network of residual Adds made it exponential (PP-OCRv4 rec: minutes). The walk keeps its own
        stack: recursing, a chain of ~400 elementwise ops ran out of Python's and the whole optimisation
        was dropped."""
        return post_order_value(name, self._ranks, self._rank_rule)

    def _rank_rule(self, name: str):
        """post_order_value's expand for ranks: (the rank or None, None) when known without other values'
        ranks, else (None, (inputs, combine)): the first input's rank, or the largest of the inputs'
        (the kernel's fact)."""
        shape = self.static_shape(name)
        if shape is not None:
            return len(shape), None
        for vi in self.graph.inputs:
            if vi.name == name and name not in self.initializers:
                return _declared_rank(vi), None
        for vi in self.graph.outputs:       # an output declared without a shape: its producer may tell
            if vi.name == name and _declared_rank(vi) is not None:
                return _declared_rank(vi), None
        vi = self.graph.value_info.get(name)
        if vi is not None and _declared_rank(vi) is not None:
            return _declared_rank(vi), None
        node = self.producer.get(name)
        if node is None or not node.inputs or node.outputs[0] != name:
            return None, None
        op = node.op_type if node.domain in ("", "ai.onnx", FUSED_DOMAIN) else ""
        if op in ("Conv", "ConvTranspose") and len(node.inputs) > 1:
            w = node.inputs[1]
            maker = self.producer.get(w)
            if self.is_constant(w) and maker is not None and maker.op_type == "ConstantOfShape":
                shape = self.value(maker.inputs[0])       # the weights' rank without making them
                if isinstance(shape, np.ndarray):
                    return shape.size, None
            w = self.value(w) if self.is_constant(w) else None
            if isinstance(w, np.ndarray):
                return w.ndim, None
            return None, ([node.inputs[0]], _first)
        opsets = {**(node.opsets or self.opsets), FUSED_DOMAIN: 1}
        spec = resolved_kernel(node, opsets, self.functions)[0] if op else None
        rule = None if spec is None else spec.rank          # the kernel's fact (@kernel(rank=...))
        if rule == "first":
            return None, ([node.inputs[0]], _first)
        if rule == "broadcast":      # legacy broadcasting (opset < 7) also keeps the larger rank
            return None, ([x for x in node.inputs if x], _largest)
        if rule in ("squeeze", "unsqueeze"):
            axes = self.axes(node)
            if axes is None:            # Squeeze without axes drops every axis of size 1: not known here
                return None, None
            n = len(axes) * (1 if rule == "unsqueeze" else -1)
            return None, ([node.inputs[0]], lambda ranks: None if ranks[0] is None else ranks[0] + n)
        return None, None

    def axes(self, node) -> list[int] | None:
        """A node's `axes` as written: its attribute (older opsets) or its constant second input (newer
        ones: Squeeze / Unsqueeze 13, ReduceMean 18); None when it has neither or the input is not constant."""
        axes = node.attrs.get("axes")
        if axes is None and len(node.inputs) > 1 and node.inputs[1]:
            axes = self.value(node.inputs[1])
        return None if axes is None else [int(a) for a in np.asarray(axes).reshape(-1)]

    def graph_result(self) -> Graph:
        return replace(self.graph, nodes=self.nodes, initializers=self.initializers)


def _first(ranks):
    return ranks[0]


def _largest(ranks):
    return None if None in ranks or not ranks else max(ranks)


def post_order_value(start: str, memo: dict, expand):
    """memo[start] for a value computed from its inputs' values, inputs first, with an explicit stack (a
    recursion ran out of Python's on chains of a few hundred nodes). expand(x) -> (x's value, None) when
    known alone, else (None, (inputs, combine)): combine(their values) is x's. Every value met is kept in
    memo; an input met again while its own inputs are pending (a cycle) counts as None."""
    stack, entered = [start], {}        # entered: x -> its rule, while its inputs are walked
    while stack:
        x = stack[-1]
        if x in memo:
            stack.pop()
            continue
        value, rule = (None, entered[x]) if x in entered else expand(x)
        if rule is None:
            memo[x] = value
            stack.pop()
            continue
        inputs, combine = rule
        pending = [i for i in inputs if i not in memo]
        if pending and x not in entered:
            entered[x] = rule
            stack.extend(i for i in pending if i not in entered)
            continue
        memo[x] = combine([memo.get(i) for i in inputs])
        stack.pop()
    return memo[start]
