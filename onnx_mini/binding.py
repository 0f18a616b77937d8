"""Binding: a resolved node's kernel factory called once, with the node's attributes, the facts the
factory asks for, and its constant inputs -> the function a step runs. Shared by the planner (every
step) and the optimiser (to check that a node binds, and to compute a constant node's value now).
"""
from __future__ import annotations

from typing import Any, Callable

from .errors import InvalidNodeError, NodeError
from .graph import Graph, Node, normalize_domain
from .registry import KernelSpec
from .resolve import arity_problem, attribute_problem, resolve


def bind(node: Node, spec: KernelSpec, opset: int | None, *, attrs: dict[str, Any] | None = None,
         opsets: dict[str, int] | None = None, graph: Graph | None = None, constants: dict[int, Any] | None = None,
         options: dict[str, Any] | None = None, plan: Callable | None = None) -> Callable:
    """Check the node's attributes against the kernel and call its factory once.
    attrs: the node's attributes with any GRAPH value already planned into a SubPlan (the planner's
    job; default: node.attrs). graph: the graph holding the node; plan: Graph -> SubPlan (both for
    kernels about their own graph: Gradient). constants: {input index: value} known at prepare.
    options: the model's kernel options."""
    def fail(msg: str) -> InvalidNodeError:
        return InvalidNodeError(msg, node=node.name, op_type=node.op_type, domain=node.domain,
                                version=spec.since, opset=opset)

    unknown = sorted(set(node.attrs) - spec.attributes)
    if unknown:
        raise fail(f"attribute(s) {', '.join(map(repr, unknown))} not defined for this operator version "
                   f"(known: {', '.join(sorted(spec.attributes)) or 'none'})")
    missing = sorted(spec.required - set(node.attrs))
    if missing:
        raise fail(f"required attribute(s) {', '.join(map(repr, missing))} missing")
    problem = arity_problem(node, spec) or attribute_problem(node, spec)
    if problem:
        raise fail(problem)
    kwargs = dict(node.attrs if attrs is None else attrs)
    facts = {"_n_inputs": len(node.inputs), "_n_outputs": len(node.outputs), "_graph": graph,
             "_opsets": opsets or {}, "_plan": plan, "_version": spec.since, "_constants": constants or {},
             "_options": dict(options or {})}
    if "_input_producers" in spec.injected:     # a walk of the graph: only for the kernels asking
        facts["_input_producers"] = input_producers(node, graph)
    kwargs.update((name, facts[name]) for name in spec.injected)
    try:
        return spec.factory(**kwargs)
    except NodeError:
        raise
    except Exception as e:
        raise fail(str(e) or type(e).__name__) from e


def input_producers(node: Node, graph: Graph | None) -> tuple:
    """Per input of `node`, (op_type, attrs) of the default-domain node of `graph` (the graph as
    written) computing it, or None. The node is found in `graph` by its first output, so a node the
    optimiser rewired still sees what the model wrote before it."""
    if graph is None:
        return (None,) * len(node.inputs)
    made = {o: n for n in graph.nodes for o in n.outputs if o}
    written = made.get(node.outputs[0]) if node.outputs and node.outputs[0] else None
    inputs = written.inputs if written is not None else node.inputs
    return tuple((p.op_type, p.attrs) if (p := made.get(x)) is not None and p.domain == "" else None
                 for x in inputs)


def resolved_kernel(node: Node, opsets: dict[str, int], functions) -> tuple[KernelSpec | None, int | None]:
    """(the kernel running the node directly, the opset of its domain); None for a function call."""
    opset = opsets.get(normalize_domain(node.domain))
    if (node.domain, node.op_type) in functions:
        return None, opset
    return resolve(node.domain, node.op_type, opset).kernel, opset


def evaluate(node: Node, args: list, opsets: dict[str, int], functions) -> list | None:
    """The node's outputs computed now from the values `args` (its constant inputs), through its
    kernel; None when it has none (a function body: left to the planner's folding) or fails (the
    error is reported at run time, with its node)."""
    try:
        spec, opset = resolved_kernel(node, opsets, functions)
        if spec is None or not spec.foldable:
            return None
        fn = bind(node, spec, opset, opsets=opsets)
        result = fn(*args)
        values = list(result) if spec.multi_output else [result]
        return [v if o else None for o, v in zip(node.outputs, values)]
    except Exception:
        return None
