"""The prepare pipeline, in order, for a model's graph and for every body graph in it:

    optimise (optimize/)  ->  resolve, inline and plan (planner.py: binding.py, inline.py)
    ->  in-place steps (inplace.py)  ->  independent branches (schedule.py, top-level plans)

Each stage is a module that imports only earlier ones; this module wires them together and hands
the later ones (the executor, the pipeline itself for bodies) down to the planner as plain functions.
"""
from __future__ import annotations

from typing import Any

from . import inplace
from .executor import execute
from .graph import Function, Graph
from .optimize import optimize_graph, with_fused_domain
from .plan import Plan
from .planner import PlanContext, build_plan
from .schedule import find_blocks


def prepare_plan(graph: Graph, opsets: dict[str, int], functions: dict[tuple[str, str], Function] | None = None,
                 *, optimize: bool = True, options: dict[str, Any] | None = None,
                 constants: dict[str, Any] | None = None, outer_scope: tuple[str, ...] = ()) -> Plan:
    """The plan of a model's (top-level) graph. optimize: run the graph rewrites and fold constants.
    options: the model's kernel options. constants: values an earlier plan of the same graph folded,
    by name (specialize.py), reused rather than recomputed. outer_scope: names the graph reads from
    an enclosing one (a body planned on its own)."""
    ctx = PlanContext(optimize, dict(options or {}), execute, _pipeline)
    return _pipeline(ctx, graph, opsets, functions or {}, tuple(outer_scope), 0, constants)


def _pipeline(ctx: PlanContext, graph: Graph, opsets, functions, outer_scope, depth: int,
              constants: dict[str, Any] | None = None) -> Plan:
    """Every stage for one graph; depth 0 is the model's graph, bodies are deeper (planner.py calls
    back here through ctx.plan_body for each)."""
    written = graph
    if ctx.optimize and graph.nodes:
        graph = optimize_graph(graph, opsets, functions, outer_scope=outer_scope, static_inputs=depth == 0)
        opsets = with_fused_domain(opsets)
    plan = build_plan(graph, opsets, functions, ctx, outer_scope=outer_scope, depth=depth, constants=constants,
                      written=written)
    if ctx.optimize:
        inplace.donate(plan, execute)
    if depth == 0:
        plan.blocks = find_blocks(plan)
    return plan
