"""Function inlining, the second half of resolution: a node that calls a model-local function or an
operator defined by a schema function body is replaced by the body's nodes, renamed into the
caller's scope, subgraphs of those nodes included (the names a subgraph reads from the function's
scope are renamed with the body's). A type-dependent schema body is built from the declared input
types; when those are known only at run time the node stays, marked TypedBody, for the planner.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np

from . import dtypes
from .errors import InvalidNodeError, UnsupportedOperatorError
from .graph import AttrRef, Function, Graph, Node, TypeInfo, free_names
from .resolve import resolve
from .schema_bodies import typed_function_body

MAX_INLINE_DEPTH = 64


@dataclass(frozen=True)
class TypedBody:
    """A node whose schema function body depends on input types not known before run time."""
    version: int
    opsets: dict


def expand(nodes: list[Node], opsets: dict[str, int], functions, depth: int = 0,
           known: dict[str, TypeInfo] | None = None) -> list[tuple]:
    """Resolve each node; replace function calls by their (renamed) bodies. -> [(node, spec, opset)],
    spec a KernelSpec, or a TypedBody for a node whose schema body needs types known only at run time.
    known: declared types of values, to build type-dependent schema function bodies at prepare time."""
    known = known or {}
    out = []
    for node in nodes:
        node_opsets = node.opsets or opsets
        opset = node_opsets.get(node.domain)
        local = functions.get((node.domain, node.op_type))
        if local is not None:
            body, fn_opsets, version = local, {**opsets, **local.opsets}, opset or 1
        else:
            r = resolve(node.domain, node.op_type, opset)
            if r.kernel is not None:
                out.append((node, r.kernel, opset))
                continue
            if r.typed_function:
                types = [known.get(x) if x else None for x in node.inputs]
                if not all(_complete(t) for x, t in zip(node.inputs, types) if x):
                    # types known only at run time: the body is built for each new input signature
                    out.append((node, TypedBody(r.version, node_opsets), opset))
                    continue
                body = typed_body(node, opset, types, r.version)
            elif r.function is None:
                raise UnsupportedOperatorError(r.problem, node=node.name, op_type=node.op_type,
                                               domain=node.domain, opset=opset)
            else:
                body = r.function
            fn_opsets, version = {**opsets, **body.opsets}, r.version
        if depth >= MAX_INLINE_DEPTH:
            raise InvalidNodeError("function calls nest too deeply (recursive function?)", node=node.name,
                                   op_type=node.op_type, domain=node.domain, opset=opset)
        inlined = inline(node, body, fn_opsets, version)
        out.extend(expand(inlined, fn_opsets, functions, depth + 1, known))
    return out


# -- type-dependent schema function bodies ---------------------------------------------------------



# -- type-dependent schema function bodies ---------------------------------------------------------

def declared_types(graph: Graph) -> dict[str, TypeInfo]:
    """What the graph declares about its values' types: inputs, outputs, value_info, initializers."""
    known = {v.name: v.type for v in (*graph.outputs, *graph.value_info.values(), *graph.inputs) if v.type}
    for name, arr in graph.initializers.items():
        if isinstance(arr, np.ndarray):
            known[name] = TypeInfo("tensor", dtypes.elem_type(arr.dtype), arr.shape)
    return known


def _complete(t: TypeInfo | None) -> bool:
    """Enough of a type for onnx to build a body from: element types known all the way down."""
    if t is None:
        return False
    if t.kind in ("tensor", "sparse_tensor"):
        return bool(t.elem_type)
    return t.kind in ("sequence", "optional") and _complete(t.inner)


def typed_body(node: Node, opset: int, types: list, version: int) -> Function:
    try:
        return typed_function_body(node, opset, types)
    except Exception as e:  # onnx raises its own errors for types its builder rejects
        raise UnsupportedOperatorError(f"no kernel, and no type-dependent function body: {e}", node=node.name,
                                       op_type=node.op_type, domain=node.domain, version=version,
                                       opset=opset) from e


def value_type(v) -> TypeInfo | None:
    """The type of a run-time value, as much as a type-dependent body may need (element type, rank)."""
    if isinstance(v, np.ndarray):
        return TypeInfo("tensor", dtypes.elem_type(v.dtype), (None,) * v.ndim)
    if isinstance(v, list):
        inner = value_type(v[0]) if v else TypeInfo("tensor", dtypes.elem_type(np.float32))
        return TypeInfo("sequence", inner=replace(inner, shape=None))
    return None


_inline_ids = itertools.count()


def inline(node: Node, fn: Function, fn_opsets: dict[str, int], version: int) -> list[Node]:
    """The function body's nodes, renamed into the caller's scope: formal inputs/outputs become the
    node's actual names, every other body name gets a unique prefix, attribute references take the
    caller's values. Subgraphs of body nodes keep their inner names; the names they read from the
    function's scope are renamed like the body's (recursively, for subgraphs of subgraphs)."""
    prefix = f"{node.name or node.op_type}/{fn.name}#{next(_inline_ids)}/"
    rename = {formal: "" for formal in fn.inputs}
    rename.update(zip(fn.inputs, node.inputs))
    rename.update((f, a) for f, a in zip(fn.outputs, node.outputs) if a)

    def name(x: str) -> str:
        return "" if not x else rename.get(x, prefix + x)

    def bound(attrs: dict[str, Any], outer: Callable[[str], str]) -> tuple[dict[str, Any], tuple[str, ...]]:
        """Attributes with references resolved and the body's own subgraphs renamed; and the names the
        subgraphs read from the enclosing scope (the node's captures)."""
        out: dict[str, Any] = {}
        captures: dict[str, None] = {}
        for k, v in attrs.items():
            if isinstance(v, AttrRef):  # the caller's value lives in the caller's scope: left as is
                if v.name in node.attrs:
                    out[k] = node.attrs[v.name]
                elif fn.attributes.get(v.name) is not None:
                    out[k] = fn.attributes[v.name]
                # else: the caller left it out, so the body node uses its own default
                v = out.get(k)
            elif isinstance(v, Graph):
                v = out[k] = _renamed_graph(v, outer, bound)
            elif isinstance(v, list) and v and isinstance(v[0], Graph):
                v = out[k] = [_renamed_graph(g, outer, bound) for g in v]
            else:
                out[k] = v
            for g in (v if isinstance(v, list) else [v]):
                if isinstance(g, Graph):
                    captures.update(dict.fromkeys(free_names(g)))
        return out, tuple(captures)

    result = []
    for bn in fn.nodes:
        attrs, captures = bound(bn.attrs, name)
        result.append(replace(bn, name=prefix + (bn.name or bn.op_type), inputs=tuple(map(name, bn.inputs)),
                              outputs=tuple(map(name, bn.outputs)), attrs=attrs, index=node.index,
                              opsets=fn_opsets, captures=captures))
    return result


def _renamed_graph(g: Graph, outer: Callable[[str], str], bound) -> Graph:
    """Subgraph `g` of a function body node with the names it reads from the enclosing scope mapped
    through `outer`; names defined inside `g` stay, unless one equals a name an outer read now maps
    to (the caller's actual argument), which it would shadow: those get a unique suffix."""
    local = {v.name for v in g.inputs} | set(g.initializers) | {o for n in g.nodes for o in n.outputs if o}
    targets = {outer(x) for x in free_names(g)}
    own = {x: f"{x}~{next(_inline_ids)}" for x in local & targets}

    def name(x: str) -> str:
        if not x:
            return x
        return own.get(x, x) if x in local else outer(x)

    nodes = []
    for n in g.nodes:
        attrs, captures = bound(n.attrs, name)
        nodes.append(replace(n, inputs=tuple(map(name, n.inputs)), outputs=tuple(map(name, n.outputs)),
                             attrs=attrs, captures=captures))
    outputs = [replace(v, name=name(v.name)) for v in g.outputs]
    if not own:
        return replace(g, nodes=nodes, outputs=outputs)
    return replace(g, nodes=nodes, outputs=outputs, inputs=[replace(v, name=name(v.name)) for v in g.inputs],
                   initializers={name(k): v for k, v in g.initializers.items()},
                   value_info={name(k): replace(v, name=name(v.name)) for k, v in g.value_info.items()})
