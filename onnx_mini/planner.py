"""Turn a Graph into a Plan: everything per-model happens here, once, so that run() only walks steps.

- function bodies (model-local functions, schema function bodies) are inlined (inline.py);
- nodes are sorted (stable Kahn), resolved to a kernel version, and bound (binding.py) with their
  attributes, the facts their factory asks for, and their constant inputs;
- value names become integer slots; the template slot list holds initializers and folded constants;
- each step lists the slots that die after it, so intermediates are freed at their last use.

Planning is re-entrant: a subgraph is planned like a graph, with its outer-scope names as extra inputs.
Each GRAPH attribute of a node (SequenceMap's body, If's branches, Loop/Scan bodies) becomes a SubPlan
before the node's factory is called; the outer values the node's subgraphs read (`node.captures`) are
appended to the step's inputs, after the node's own, and the kernel hands them to SubPlan.run.
Bodies go through the whole prepare pipeline (PlanContext.plan_body, given by prepare.py), so this
module knows nothing of the stages after it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np

from .binding import bind
from .custom_ops import active_custom_ops, using_custom_ops
from .errors import GraphError, InvalidNodeError, InvalidValueError, NodeError
from .graph import Function, Graph, Node, ValueInfo, free_names, normalize_domain, topo_sort
from .inline import MAX_INLINE_DEPTH, TypedBody, declared_types, expand, inline, typed_body, value_type
from .plan import DISCARD_SLOT, NONE_SLOT, InputSpec, Plan, StepInfo, SubPlan
from .registry import KernelSpec


@dataclass(frozen=True)
class PlanContext:
    """What planning a model needs beyond its graph: its options, and the stages after planning
    (prepare.py wires them in, so that this module imports none of them)."""
    optimize: bool                      # fold constants (the optimiser ran before planning)
    options: dict                       # the model's kernel options (factories' _options)
    execute: Callable                   # executor.execute, for SubPlans
    plan_body: Callable                 # (ctx, graph, opsets, functions, outer_scope, depth) -> Plan


def build_plan(graph: Graph, opsets: dict[str, int], functions: dict[tuple[str, str], Function] | None,
               ctx: PlanContext, *, outer_scope: tuple[str, ...] = (), depth: int = 0,
               constants: dict[str, Any] | None = None, written: Graph | None = None) -> Plan:
    """constants: values already folded by an earlier plan of the same graph, by name (reused, not
    recomputed: specialize.py re-plans a graph whose weights were folded once). depth: how deep in
    subgraphs this graph is. written: the graph as written, before optimisation (Gradient's _graph)."""
    functions = functions or {}
    written = written or graph
    resolved = expand(graph.nodes, opsets, functions, known=declared_types(graph))
    available = {v.name for v in graph.inputs} | set(graph.initializers) | set(outer_scope)
    by_id = {id(n): (n, r, o) for n, r, o in resolved}
    order = [by_id[id(n)] for n in topo_sort([n for n, _, _ in resolved], available)]

    slots: dict[str, int] = {}
    template: list[Any] = [None, None]
    names = ["<none>", "<discard>"]

    def slot(name: str) -> int:
        if not name:
            return NONE_SLOT
        if name not in slots:
            slots[name] = len(template)
            template.append(None)
            names.append(name)
        return slots[name]

    inputs = []
    for v in graph.inputs:
        s = slot(v.name)
        inputs.append(InputSpec(v.name, s, v.type, v.name in graph.initializers))
    for name in outer_scope:
        slot(name)
    overridable = {v.name for v in graph.inputs}
    constant: set[int] = set()
    for name, arr in graph.initializers.items():
        s = slot(name)
        template[s] = arr
        if name not in overridable:
            constant.add(s)

    steps: list[tuple] = []
    infos: list[StepInfo] = []
    uses_blas = False
    for node, spec, opset in order:
        node_opsets = node.opsets or opsets
        typed = isinstance(spec, TypedBody)      # its body is planned at run time: assume BLAS
        if typed:
            spec = _typed_function_kernel(node, spec.version, opset, spec.opsets, functions, ctx, depth)
        ins = tuple(slot(x) for x in (*node.inputs, *node.captures))
        fixed = {i: template[s] for i, s in enumerate(ins[:len(node.inputs)]) if s != NONE_SLOT and s in constant}
        attrs = _subplans(node, node_opsets, functions, ctx, depth,
                          {x: template[slots[x]] for x in node.captures if slots[x] in constant})
        uses_blas = uses_blas or typed or spec.heavy or _bodies_use_blas(attrs)
        fn = bind(node, spec, opset, attrs=attrs, opsets=node_opsets,
                  graph=written, constants=fixed, options=ctx.options, plan=_body_planner(ctx, node_opsets, depth))
        outs = tuple(slot(x) if x else DISCARD_SLOT for x in node.outputs)
        out = outs if spec.multi_output else (outs[0] if outs else DISCARD_SLOT)
        if ctx.optimize and spec.foldable and _foldable(node, ins, constant):
            known = constants and [constants.get(x) if x else None for x in node.outputs]
            if known and all(v is not None for v in known):
                values = tuple(known) if spec.multi_output else known[0]
            else:
                values = _fold(fn, ins, template)
            if values is not None:
                for s, v in zip(outs, values if spec.multi_output else (values,)):
                    if isinstance(v, np.ndarray):
                        v.flags.writeable = False  # shared by all runs
                    template[s] = v
                    constant.add(s)
                continue
        steps.append((fn, ins, out, ()))
        infos.append(StepInfo(node.name, node.op_type, node.domain, spec.since, opset,
                              (*node.inputs, *node.captures), node.outputs, fn, spec.heavy, spec.in_place,
                              node.fused_from))

    missing = [v.name for v in graph.outputs if v.name not in slots]
    if missing:
        raise GraphError(f"graph outputs never produced: {', '.join(map(repr, missing))}")
    output_slots = [slots[v.name] for v in graph.outputs]
    # outer-scope values are held by the body's caller for the whole call: freeing their slots after
    # each body run would gain nothing and cost a store per iteration
    steps = _with_frees(steps, keep=set(output_slots) | constant | {slots[name] for name in outer_scope})
    return Plan(steps, infos, template, inputs, [v.name for v in graph.outputs], output_slots, names,
                [v.type for v in graph.outputs], graph, uses_blas=uses_blas)


def _bodies_use_blas(attrs: dict[str, Any]) -> bool:
    """Whether a SubPlan among the attributes (a GRAPH, or a GRAPHS list) uses BLAS. A list attribute
    holds one type (_subplans' test): a list of numbers or strings is skipped whole, not walked (a
    tree ensemble's node lists, a TF-IDF vocabulary: 11-16 ms of skl_gbc's / skl_tfidf's ~26-34 ms
    prepare went to walking them)."""
    for v in attrs.values():
        if isinstance(v, SubPlan):
            if v.plan.uses_blas:
                return True
        elif isinstance(v, list) and v and isinstance(v[0], SubPlan):
            if any(sub.plan.uses_blas for sub in v):
                return True
    return False


def _body_planner(ctx: PlanContext, opsets: dict[str, int], depth: int) -> Callable[[Graph], SubPlan]:
    """Graph -> SubPlan through the whole pipeline, for a kernel about its own graph (Gradient's
    forward graph): the graph reads nothing from outer scopes."""
    def plan(g: Graph) -> SubPlan:
        return SubPlan(ctx.plan_body(ctx, g, dict(opsets), {}, (), depth + 1), g.name, (), (), ctx.execute)
    return plan


def _foldable(node: Node, ins: tuple[int, ...], constant: set[int]) -> bool:
    return not node.captures and all(s == NONE_SLOT or s in constant for s in ins)


def _fold(fn: Callable, ins: tuple[int, ...], template: list) -> Any:
    try:
        return fn(*[template[s] for s in ins])
    except Exception:
        return None  # leave it to run time, where the error is reported with its node


def _with_frees(steps: list[tuple], keep: set[int]) -> list[tuple]:
    """Attach to each step the slots whose last reader (or, if unread, whose producer) it is."""
    last: dict[int, int] = {}
    for i, (_, ins, out, _) in enumerate(steps):
        for s in (out if isinstance(out, tuple) else (out,)):
            last[s] = i
        for s in ins:
            last[s] = i
    frees: list[list[int]] = [[] for _ in steps]
    for s, i in last.items():
        if s > DISCARD_SLOT and s not in keep:
            frees[i].append(s)
    return [(fn, ins, out, tuple(f)) for (fn, ins, out, _), f in zip(steps, frees)]


def _typed_function_kernel(node: Node, version: int, opset: int, opsets: dict[str, int], functions,
                           ctx: PlanContext, depth: int) -> KernelSpec:
    """A kernel for a node whose type-dependent body needs input types known only at run time: the
    body is built and planned once per input signature (element types and ranks), then reused."""
    n_in = len(node.inputs)
    present = [i for i, x in enumerate(node.inputs) if x]
    wanted = [x for x in node.outputs if x]

    def factory(**_attrs):   # the node's attributes are read from the node itself (graphs unplanned)
        plans: dict[tuple, SubPlan] = {}
        custom = active_custom_ops()   # the model's own kernels, for bodies planned at run time

        def build(types: list) -> SubPlan:
            body = typed_body(node, opset, types, version)
            fn_opsets = {**opsets, **body.opsets}
            g = Graph(f"{node.op_type} body", inline(node, body, fn_opsets, version),
                      [ValueInfo(node.inputs[i], types[i]) for i in present],
                      [ValueInfo(x, None) for x in wanted], {})
            with using_custom_ops(custom):
                plan = ctx.plan_body(ctx, g, fn_opsets, functions, node.captures, depth + 1)
            return SubPlan(plan, g.name, node.captures, node.captures, ctx.execute)

        def run(*args):
            own, captured = args[:n_in], args[n_in:]
            types = [value_type(v) for v in own]
            key = tuple(types)
            sub = plans.get(key)
            if sub is None:
                if any(types[i] is None for i in present):
                    raise InvalidValueError("cannot build the type-dependent function body: an input is "
                                            "neither a tensor nor a sequence")
                sub = plans[key] = build(types)
            results = iter(sub.run([own[i] for i in present], captured))
            return tuple(next(results) if x else None for x in node.outputs)
        return run

    return KernelSpec(factory, node.op_type, normalize_domain(node.domain), version, frozenset(node.attrs),
                      frozenset(), frozenset(), True)


def _subplans(node: Node, opsets: dict[str, int], functions, ctx: PlanContext, depth: int,
              known: dict[str, Any]) -> dict[str, Any]:
    """The node's attributes with each GRAPH (or GRAPHS) value planned into a SubPlan. known: the
    outer-scope values the node captures that are constants here (initializers, folded values): each
    body takes them as initializers of its own, so that its kernels see them as constant inputs
    (prepacked weights, folding: an LSTM whose weights an If branch slices and concatenates from
    the enclosing graph's constants) and its runs need not be handed them."""
    if not node.captures and not any(isinstance(v, Graph) or (isinstance(v, list) and v and isinstance(v[0], Graph))
                                     for v in node.attrs.values()):
        return node.attrs

    def sub(key: str, g: Graph) -> SubPlan:
        outer = free_names(g)
        given = {x: known[x] for x in outer if x in known}
        if given:
            g = replace(g, initializers={**g.initializers, **given})
            outer = tuple(x for x in outer if x not in given)
        if depth >= MAX_INLINE_DEPTH:  # a function whose body's subgraph calls it again never ends
            err = InvalidNodeError(f"subgraphs nest more than {MAX_INLINE_DEPTH} deep (a recursive function "
                                   "called from a subgraph?)", node=node.name, op_type=node.op_type,
                                   domain=node.domain)
            err.too_deep = True   # passed up unwrapped by the enclosing levels
            raise err
        try:
            plan = ctx.plan_body(ctx, g, opsets, functions, outer, depth + 1)
        except NodeError as e:  # say which subgraph of which node
            if getattr(e, "too_deep", False):
                raise
            raise type(e)(f"in subgraph {key!r} of node {node.name or node.op_type!r}: {e.reason}", node=e.node,
                          op_type=e.op_type, domain=e.domain, version=e.version, opset=e.opset) from e
        except GraphError as e:
            raise GraphError(f"subgraph {key!r} of node {node.name or node.op_type!r} ({node.op_type}): {e}") from e
        return SubPlan(plan, g.name or key, outer, node.captures, ctx.execute, key)

    attrs = dict(node.attrs)
    for k, v in node.attrs.items():
        if isinstance(v, Graph):
            attrs[k] = sub(k, v)
        elif isinstance(v, list) and v and isinstance(v[0], Graph):
            attrs[k] = [sub(f"{k}[{i}]", g) for i, g in enumerate(v)]
    return attrs
