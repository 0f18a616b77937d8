"""The hot loop: walk the plan's steps over a list of slots. No parsing, no lookups, no checks."""
from __future__ import annotations

from typing import Any, Callable

from .errors import OnnxMiniError
from .plan import Plan, StepInfo

#: hook(info, inputs, outputs) called after each step when tracing; outputs is a tuple.
Hook = Callable[[StepInfo, tuple, tuple], None]


def execute(plan: Plan, slots: list[Any], hook: Hook | None = None) -> list[Any]:
    """Run every step on `slots` (from inputs.bind_inputs) and return the graph outputs."""
    if hook is not None:
        return _execute_hooked(plan, slots, hook)
    for step in plan.steps:
        fn, ins, out, frees = step
        try:
            result = fn(*[slots[i] for i in ins])
        except Exception as e:
            raise _failure(plan, step, slots, e) from e
        if out.__class__ is int:
            slots[out] = result
        else:
            for o, v in zip(out, result):
                slots[o] = v
        for f in frees:
            slots[f] = None
    return [slots[i] for i in plan.output_slots]


def _execute_hooked(plan: Plan, slots: list[Any], hook: Hook) -> list[Any]:
    """Same walk with a call-out per step; kept apart so the plain loop pays nothing for it."""
    for step, info in zip(plan.steps, plan.infos):
        fn, ins, out, frees = step
        args = [slots[i] for i in ins]
        try:
            result = fn(*args)
        except Exception as e:
            raise _failure(plan, step, slots, e) from e
        results = (result,) if out.__class__ is int else tuple(result)
        for o, v in zip((out,) if out.__class__ is int else out, results):
            slots[o] = v
        hook(info, tuple(args), results)
        for f in frees:
            slots[f] = None
    return [slots[i] for i in plan.output_slots]


def _failure(plan: Plan, step: tuple, slots: list[Any], exc: Exception) -> OnnxMiniError:
    index = next(i for i, s in enumerate(plan.steps) if s is step)
    return plan.kernel_error(index, [slots[i] for i in step[1]], exc)
