"""The hot loop: walk the plan's steps over a list of slots. No parsing, no lookups, no checks."""
from __future__ import annotations

import itertools
import time
from typing import Any, Callable

from . import blas, parallel
from .errors import OnnxMiniError
from .plan import TRACING, Plan, StepInfo, Tracing
from .schedule import MIN_BRANCH_SECONDS

#: hook(info, inputs, outputs) called after each step when tracing, the steps of bodies (If, Loop,
#: Scan, SequenceMap, ...) included, each right after it ran (so before its parent's call);
#: info.scope / info.path / info.depth say where the step is; outputs is a tuple.
Hook = Callable[[StepInfo, tuple, tuple], None]


def execute(plan: Plan, slots: list[Any], hook: Hook | None = None, scope: tuple[str, ...] = ()) -> list[Any]:
    """Run every step on `slots` (from inputs.bind_inputs) and return the graph outputs.
    scope: where the plan runs (a body: its parent step's scope and the body's key; SubPlan.run)."""
    if hook is not None:
        return _execute_hooked(plan, slots, hook, scope)
    layout = _layout(plan)
    if plan.blocks and blas.splitting() and parallel.threads() > 1:
        return _execute_blocks(plan, layout, slots)
    _walk(plan, layout.steps, slots)
    return [slots[i] for i in plan.output_slots]


# The loop's own step layout, made from plan.steps once per plan (at its first run): (arity, fn, first
# input slot, second input slot, output slot, frees, step index). Arity 1 and 2 (nearly every step)
# call fn(slots[a], slots[b]) with no argument list built; 0 stands for every other step (no input,
# three or more, several outputs), where `a` holds the input slots. On the 1000-node chain of bench_core
# this cut the loop's own cost per step from ~0.38 to ~0.13 us (no-op kernels, same process).
_GENERAL = 0


def _fast(index: int, fn, ins: tuple, out, frees: tuple) -> tuple:
    n = len(ins)
    if out.__class__ is int and n in (1, 2):
        return (n, fn, ins[0], ins[-1], out, frees, index)
    return (_GENERAL, fn, ins, None, out, frees, index)


class _Layout:
    """plan.steps in the loop's layout, and the stretches and branches of plan.blocks in it."""
    __slots__ = ("source", "blocks", "steps", "stretches", "branches")

    def __init__(self, plan: Plan):
        self.source, self.blocks = plan.steps, plan.blocks
        self.steps = [_fast(i, *step) for i, step in enumerate(plan.steps)]
        self.stretches, self.branches = [], []
        pos = 0
        for block in plan.blocks:
            self.stretches.append(self.steps[pos:block.start])
            self.branches.append([[_fast(*s) for s in branch] for branch in block.branches])
            pos = block.stop
        self.stretches.append(self.steps[pos:])


def _layout(plan: Plan) -> _Layout:
    layout = plan.layout
    if layout is None or layout.source is not plan.steps or layout.blocks is not plan.blocks:
        # made again if a stage replaced the steps or the blocks
        layout = plan.layout = _Layout(plan)     # two threads may both make it: equal, either kept
    return layout


def _walk(plan: Plan, steps: list[tuple], slots: list[Any]) -> None:
    """Run steps in the loop's layout, in order: a whole plan, a stretch of it or a branch.
    No local keeps a result past its step: inplace.py counts the references to an input to know that
    only its slot holds it (its calibration runs through here), so results go straight into the slots."""
    for step in steps:
        n, fn, a, b, out, frees, _ = step
        try:
            if n == 2:
                slots[out] = fn(slots[a], slots[b])
            elif n == 1:
                slots[out] = fn(slots[a])
            elif out.__class__ is int:
                slots[out] = fn(*[slots[i] for i in a])
            else:
                _store(out, fn(*[slots[i] for i in a]), slots)
        except Exception as e:
            raise _failure(plan, step[-1], slots, e) from e
        if frees:
            for f in frees:
                slots[f] = None


def _store(out: tuple, results, slots: list[Any]) -> None:
    for o, v in zip(out, results):
        slots[o] = v


def _execute_hooked(plan: Plan, slots: list[Any], hook: Hook, scope: tuple[str, ...]) -> list[Any]:
    """Same walk with a call-out per step; kept apart so the plain loop pays nothing for it. The
    hook and the running step's scope sit in TRACING, so that the bodies a step runs run hooked."""
    tracing = Tracing(hook)
    token = TRACING.set(tracing)
    try:
        for index, (step, info) in enumerate(zip(plan.steps, plan.scoped_infos(scope))):
            fn, ins, out, frees = step
            args = [slots[i] for i in ins]
            tracing.scope = info.scope
            try:
                result = fn(*args)
            except Exception as e:
                if getattr(e, "_from_hook", False):    # a body's hook failed: the caller's error, as is
                    raise
                raise _failure(plan, index, slots, e) from e
            results = (result,) if out.__class__ is int else tuple(result)
            for o, v in zip((out,) if out.__class__ is int else out, results):
                slots[o] = v
            try:
                hook(info, tuple(args), results)
            except Exception as e:
                e._from_hook = True
                raise
            for f in frees:
                slots[f] = None
    finally:
        TRACING.reset(token)
    return [slots[i] for i in plan.output_slots]


def _execute_blocks(plan: Plan, layout: _Layout, slots: list[Any]) -> list[Any]:
    """The plan with its independent branches (schedule.py) run at the same time."""
    for stretch, block, branches in zip(layout.stretches, plan.blocks, layout.branches):
        _walk(plan, stretch, slots)
        _run_block(plan, block, slots, branches)
    _walk(plan, layout.stretches[-1], slots)
    return [slots[i] for i in plan.output_slots]


def _run_block(plan: Plan, block, slots: list[Any], branches: list) -> None:
    """block's branches (given in the loop's layout) in turn or at the same time."""
    taken = itertools.count()

    def run_branch(k: int) -> None:
        _walk(plan, branches[k], slots)

    def take() -> None:       # each thread runs whole branches, the next one not yet taken
        while (k := next(taken)) < len(branches):
            run_branch(k)

    if not block.worth or not block.worth[0]:
        # in turn: the first time, timing each branch to decide whether parallel pays for this block
        times = []
        for k in range(len(branches)):
            t0 = time.perf_counter()
            run_branch(k)
            times.append(time.perf_counter() - t0)
        if not block.worth:
            block.worth.append(sorted(times)[-2] >= MIN_BRANCH_SECONDS)
        for s in block.after:
            slots[s] = None
        return
    futures = parallel.spawn(take, min(parallel.threads(), len(branches)) - 1)
    error = None
    try:
        with parallel.limited(1):      # this thread's branch steps must not wait for the busy pool
            take()
    except BaseException as e:
        error = e
    for f in futures:                  # every branch has ended before anything else touches slots
        e = f.exception()
        error = error or e
    if error is not None:
        raise error
    for s in block.after:
        slots[s] = None


def _failure(plan: Plan, index: int, slots: list[Any], exc: Exception) -> OnnxMiniError:
    return plan.kernel_error(index, [slots[i] for i in plan.steps[index][1]], exc)
