"""The memory order of a model's constant matrices, chosen for the products that read them (the same
values and shape; a graph stage, before optimisation).

A MatMul's or Gemm's constant right operand B' [K, N] (B, or B^T with transB) meets one row of A at a
time in a decoder's step or a batch-1 dense layer, where BLAS's matrix-vector product streams it from
memory once: stored as N rows of K (B' Fortran-ordered) it runs as dot products, 1.1-2.4x faster than
over K rows of N, unless N is over twice K (blas.reads_as_rows has the measurements; GPT-2-small's
products on one token, bench_core's case 5: 9.2 -> 7.6 ms). numpy hands either order to BLAS without a
copy (as a transposed operand), and products of many rows measured no slower (128 rows, 4864 -> 896:
7.1 against 8.7 ms). So an initializer of 1 MB or more (blas.LAYOUT_MIN_BYTES) that only such products
read (in the graph or inside its If / Loop / Scan bodies), as their B and agreeing on the order, is
stored in the order they read faster. It is the model's one copy (PreparedModel keeps the laid-out
graph, every plan reads it, with optimize=False too), so results do not depend on the optimiser; they
may differ in the last bits from the other order's (another summation order inside BLAS, as between
BLAS builds). Memory-mapped external data keeps its layout (a copy would load it).
"""
from __future__ import annotations

import mmap
from dataclasses import replace

import numpy as np

from . import blas
from .graph import Graph, Node

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def lay_out_weights(graph: Graph, in_place: bool = False) -> Graph:
    """The graph with each such initializer in the order its products read faster: itself when none
    changes; a new graph (the input one unchanged), or with in_place (a graph the caller owns) the same
    graph, each matrix replaced as soon as its copy is made (one matrix at a time held twice)."""
    readers = _readers(graph)
    fixed = {v.name for v in graph.inputs} | {v.name for v in graph.outputs}
    laid = {}
    for name in list(graph.initializers):
        value = graph.initializers[name]
        if (name in fixed or not isinstance(value, np.ndarray) or value.ndim != 2 or value.dtype not in _FLOATS
                or value.nbytes < blas.LAYOUT_MIN_BYTES or _mapped(value)):
            continue
        wanted = {_fortran_wanted(node, name, value.shape) for node in readers.get(name, ())}
        if len(wanted) != 1 or None in wanted:
            continue
        fortran = wanted.pop()
        if value.flags.f_contiguous if fortran else value.flags.c_contiguous:
            continue
        copy = np.asfortranarray(value) if fortran else np.ascontiguousarray(value)
        copy.flags.writeable = False
        if in_place:
            graph.initializers[name] = copy
        else:
            laid[name] = copy
    return replace(graph, initializers={**graph.initializers, **laid}) if laid else graph


def _readers(graph: Graph) -> dict[str, list]:
    """The nodes reading each of the graph's initializers, those inside If / Loop / Scan bodies too (an
    exporter's merged decoder: both branches of an If multiply by the outer weights), where a body does
    not shadow the name; a body handing the value on as its output counts as a reader of another kind
    (None)."""
    readers: dict[str, list] = {}
    names = set(graph.initializers)

    def walk(g: Graph, visible: set) -> None:
        for node in g.nodes:
            for x in set(node.inputs):
                if x in visible:
                    readers.setdefault(x, []).append(node)
            for body in _bodies(node):
                inner = visible - {v.name for v in body.inputs} - set(body.initializers) - {
                    o for n in body.nodes for o in n.outputs}
                for v in body.outputs:
                    if v.name in inner:
                        readers.setdefault(v.name, []).append(None)
                walk(body, inner)
    walk(graph, names)
    return readers


def _bodies(node: Node):
    for value in node.attrs.values():
        for sub in value if isinstance(value, list) else (value,):
            if isinstance(sub, Graph):
                yield sub


def _fortran_wanted(node: Node | None, name: str, shape) -> bool | None:
    """Whether `node`'s product reads its B = `name` (of `shape`) faster Fortran-ordered (True) or
    C-ordered (False); None when the node is not a MatMul / Gemm reading it once, as B."""
    if (node is None or node.domain not in ("", "ai.onnx") or node.op_type not in ("MatMul", "Gemm")
            or len(node.inputs) < 2 or node.inputs[1] != name or node.inputs.count(name) != 1):
        return None
    if node.op_type == "Gemm" and int(node.attrs.get("transB", 0)):
        n, k = shape
        return not blas.reads_as_rows(k, n)     # B' = B^T Fortran-ordered is B C-ordered
    k, n = shape
    return blas.reads_as_rows(k, n)


def _mapped(value: np.ndarray) -> bool:
    """Whether the array's memory is a file mapping (the loader's external data)."""
    base = value
    while base is not None:
        if isinstance(base, mmap.mmap):
            return True
        base = getattr(base, "base", None) if isinstance(base, np.ndarray) else getattr(base, "obj", None)
    return False
