"""Shape specialisation: a plan rebuilt for the input shapes a run actually has, cached per signature.

A graph whose inputs have symbolic dims keeps its Shape / Size nodes at prepare time, and with them
the Shape -> Gather -> Concat -> Reshape chains exporters write. Once a run's inputs are known their
shapes are too: the first run with a new input signature (shape and dtype of every input) re-plans
the already optimised graph with those shapes declared, so that optimize/shapes.py turns the Shape
nodes into constants and constant folding computes the chains after them once. Later runs with the
same signature go straight to that plan (one dict lookup); they do no planning work at all.
Its in-place steps are probed in its first run (inplace.probe): those whose inputs were all too small
to be written in place run their regular kernel after it, without the wrapper's checks at every call.

Only top-level plans built with optimize=True and still holding a Shape or Size step are specialised
(for any other plan the shapes would change nothing). Constants the general plan already folded are
reused by name, not recomputed or copied. At most MAX_SIGNATURES signatures are kept per plan;
inputs beyond that run on the general plan, which is always correct, so a model fed ever-changing
shapes (a text model's sequence length) costs at most that many extra plannings.
"""
from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any, Callable, ContextManager

import numpy as np

from .errors import OnnxMiniError
from .graph import Graph, TypeInfo, ValueInfo
from .inplace import probe
from .plan import Plan

MAX_SIGNATURES = 8
_SHAPE_OPS = frozenset({"Shape", "Size"})


class Specializer:
    """The specialised plans of one general plan, by input signature."""

    def __init__(self, plan: Plan, replan: Callable[[Graph, dict], Plan], planning: Callable[[], ContextManager]):
        self.plan = plan
        self._source = plan.source     # the optimised graph `plan` was built from
        self._replan = replan          # (graph, constants by name) -> its plan, as the model prepares one
        self._planning = planning      # the model's planning context (its custom ops and size limit)
        self._input_slots = [i.slot for i in plan.inputs]
        # signature -> (its plan, (slot in `plan`, slot in its plan) per input) or None (general plan)
        self._plans: dict[tuple, tuple[Plan, tuple[tuple[int, int], ...]] | None] = {}
        self._lock = threading.Lock()

    @staticmethod
    def wanted(plan: Plan) -> bool:
        """Whether specialising `plan` can fold anything: some step reads a shape at run time."""
        return any(info.op_type in _SHAPE_OPS and info.domain in ("", "ai.onnx") for info in plan.infos)

    def choose(self, slots: list[Any]) -> tuple[Plan, list[Any]]:
        """The plan for these bound slots of the general plan, and the slots to run it on."""
        # a list comprehension, not tuple(generator): ~0.5 us less per run (measured, one input)
        key = tuple([(v.shape, v.dtype) if isinstance(v, np.ndarray) else type(v) for v in
                     [slots[i] for i in self._input_slots]])
        entry = self._plans.get(key, False)
        if entry is False:
            entry = self._build(key)
        if entry is None:
            return self.plan, slots
        plan, moves = entry
        new = plan.template.copy()
        for old, s in moves:
            new[s] = slots[old]
        return plan, new

    def _build(self, key: tuple):
        with self._lock:
            if key in self._plans:
                return self._plans[key]
            if len(self._plans) >= MAX_SIGNATURES:
                return None
            entry = None
            if all(isinstance(k, tuple) for k in key):      # tensors only: sequences/maps keep the general plan
                graph = replace(self._source, inputs=[_with_shape(v, k[0]) for v, k in
                                                      zip(self._source.inputs, key)])
                try:
                    with self._planning():
                        plan = self._replan(graph, _named_constants(self.plan))
                except OnnxMiniError:
                    plan = None        # the general plan runs it (and reports any error with its node)
                if plan is not None:
                    probe(plan)
                    by_name = {i.name: i.slot for i in plan.inputs}
                    entry = (plan, tuple((i.slot, by_name[i.name]) for i in self.plan.inputs))
            self._plans[key] = entry
            return entry


def _with_shape(v: ValueInfo, shape: tuple) -> ValueInfo:
    t = v.type
    if t is None:
        return ValueInfo(v.name, TypeInfo("tensor", 0, tuple(shape)))
    return ValueInfo(v.name, replace(t, shape=tuple(shape)))


def _named_constants(plan: Plan) -> dict[str, Any]:
    """Values the plan computed at prepare time (folded constants), by value name."""
    inputs = {i.slot for i in plan.inputs}
    return {plan.slot_names[s]: v for s, v in enumerate(plan.template)
            if v is not None and s > 1 and s not in inputs}
