"""The model as plain Python objects (no protobuf past the loader), and the topological sort."""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import GraphError


@dataclass(frozen=True)
class TypeInfo:
    """A value's declared type. kind is 'tensor', 'sparse_tensor', 'sequence', 'optional', 'map'."""
    kind: str
    elem_type: int = 0                      # tensor / sparse_tensor element type (0 = unknown)
    shape: tuple | None = None              # dims: int, str (symbolic) or None; None = unknown rank
    inner: "TypeInfo | None" = None         # element type of sequence / optional, value of map
    key_type: int = 0                       # map key element type


@dataclass(frozen=True)
class ValueInfo:
    name: str
    type: TypeInfo | None


@dataclass(frozen=True)
class AttrRef:
    """An attribute inside a function body that refers to the calling node's attribute."""
    name: str


@dataclass
class Node:
    name: str
    op_type: str
    domain: str                 # "" for the default ai.onnx domain
    inputs: tuple[str, ...]     # "" marks an omitted optional input
    outputs: tuple[str, ...]
    attrs: dict[str, Any]
    index: int = 0              # position in the file, for a stable sort and messages
    captures: tuple[str, ...] = ()  # outer-scope values its subgraph attributes read
    opsets: dict[str, int] | None = None  # set on nodes inlined from a function body (or a pass pinning a version)
    fused_from: tuple[str, ...] = ()  # the written nodes an optimiser rewrite merged into this one (profile)


@dataclass
class Graph:
    name: str
    nodes: list[Node]
    inputs: list[ValueInfo]
    outputs: list[ValueInfo]
    initializers: dict[str, np.ndarray]
    value_info: dict[str, ValueInfo] = field(default_factory=dict)


@dataclass
class Function:
    """A model-local function (FunctionProto) or a schema's function body."""
    name: str
    domain: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attributes: dict[str, Any]            # name -> default (None when the caller must give it)
    nodes: list[Node]
    opsets: dict[str, int]


@dataclass(frozen=True)
class ModelMetadata:
    """The model's descriptive fields (ModelProto's producer, domain, doc strings, metadata_props)."""
    producer_name: str = ""
    producer_version: str = ""
    domain: str = ""
    description: str = ""                   # ModelProto.doc_string
    graph_name: str = ""
    graph_description: str = ""             # GraphProto.doc_string
    version: int = 0                        # ModelProto.model_version
    custom_metadata_map: dict[str, str] = field(default_factory=dict)   # metadata_props


@dataclass
class Model:
    graph: Graph
    opsets: dict[str, int]
    ir_version: int
    functions: dict[tuple[str, str], Function] = field(default_factory=dict)
    metadata: ModelMetadata = field(default_factory=ModelMetadata)


def normalize_domain(domain: str) -> str:
    return "" if domain == "ai.onnx" else domain


def topo_sort(nodes: list[Node], available: set[str]) -> list[Node]:
    """Stable Kahn sort: among ready nodes the one earliest in the file runs first.

    available: names defined before any node runs (graph inputs, initializers, outer scope).
    Raises GraphError naming the values nothing produces, or the nodes caught in a cycle.
    """
    producer: dict[str, Node] = {}
    for n in nodes:
        for o in n.outputs:
            if o:
                if o in producer or o in available:
                    raise GraphError(f"value {o!r} is produced twice (by node {n.name!r} and "
                                     f"{'a graph input or initializer' if o in available else repr(producer[o].name)})")
                producer[o] = n
    missing = {}
    waiting_on: list[int] = []
    consumers: dict[str, list[int]] = {}
    for i, n in enumerate(nodes):
        deps = {x for x in (*n.inputs, *n.captures) if x and x not in available}
        for x in deps:
            if x not in producer:
                missing.setdefault(x, []).append(n.name or n.op_type)
            consumers.setdefault(x, []).append(i)
        waiting_on.append(len(deps))
    if missing:
        desc = "; ".join(f"{v!r} (used by {', '.join(map(repr, users))})" for v, users in missing.items())
        raise GraphError(f"values used but never produced: {desc}")
    ready = [i for i, c in enumerate(waiting_on) if c == 0]
    heapq.heapify(ready)
    order: list[Node] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(nodes[i])
        for o in set(nodes[i].outputs):
            for j in consumers.get(o, ()):
                waiting_on[j] -= 1
                if waiting_on[j] == 0:
                    heapq.heappush(ready, j)
    if len(order) != len(nodes):
        stuck = [n.name or f"#{n.index} {n.op_type}" for n, c in zip(nodes, waiting_on) if c > 0]
        raise GraphError(f"the graph has a cycle through nodes: {', '.join(map(repr, stuck))}")
    return order


def free_names(g: Graph) -> tuple[str, ...]:
    """Names a (sub)graph reads from its enclosing scope: used, but not defined inside it."""
    defined = {v.name for v in g.inputs} | set(g.initializers)
    for n in g.nodes:
        defined.update(n.outputs)
    used: dict[str, None] = {}
    for n in g.nodes:
        for x in (*n.inputs, *n.captures):
            if x and x not in defined:
                used[x] = None
    for v in g.outputs:
        if v.name not in defined:
            used[v.name] = None
    return tuple(used)
