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
    if plan.blocks and blas.splitting() and parallel.threads() > 1:
        return _execute_blocks(plan, slots)
    # No local keeps a result past its step: inplace.py counts the references to an input to know
    # that only its slot holds it, so every loop here stores results straight into the slots.
    for step in plan.steps:
        fn, ins, out, frees = step
        try:
            if out.__class__ is int:
                slots[out] = fn(*[slots[i] for i in ins])
            else:
                _store(out, fn(*[slots[i] for i in ins]), slots)
        except Exception as e:
            raise _failure(plan, step, slots, e) from e
        for f in frees:
            slots[f] = None
    return [slots[i] for i in plan.output_slots]


def _store(out: tuple, results, slots: list[Any]) -> None:
    for o, v in zip(out, results):
        slots[o] = v


def _execute_hooked(plan: Plan, slots: list[Any], hook: Hook, scope: tuple[str, ...]) -> list[Any]:
    """Same walk with a call-out per step; kept apart so the plain loop pays nothing for it. The
    hook and the running step's scope sit in TRACING, so that the bodies a step runs run hooked."""
    tracing = Tracing(hook)
    token = TRACING.set(tracing)
    try:
        for step, info in zip(plan.steps, plan.scoped_infos(scope)):
            fn, ins, out, frees = step
            args = [slots[i] for i in ins]
            tracing.scope = info.scope
            try:
                result = fn(*args)
            except Exception as e:
                if getattr(e, "_from_hook", False):    # a body's hook failed: the caller's error, as is
                    raise
                raise _failure(plan, step, slots, e) from e
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


def _execute_blocks(plan: Plan, slots: list[Any]) -> list[Any]:
    """The plan with its independent branches (schedule.py) run at the same time."""
    steps, pos = plan.steps, 0
    for block in plan.blocks:
        _run_steps(plan, [(i, *steps[i]) for i in range(pos, block.start)], slots)
        _run_block(plan, block, slots)
        pos = block.stop
    _run_steps(plan, [(i, *steps[i]) for i in range(pos, len(steps))], slots)
    return [slots[i] for i in plan.output_slots]


def _run_steps(plan: Plan, steps, slots: list[Any]) -> None:
    """Run (index in the plan, fn, ins, out, frees) steps in order: a stretch of the plan or a branch."""
    for i, fn, ins, out, frees in steps:
        try:
            if out.__class__ is int:
                slots[out] = fn(*[slots[k] for k in ins])
            else:
                _store(out, fn(*[slots[k] for k in ins]), slots)
        except Exception as e:
            raise plan.kernel_error(i, [slots[k] for k in ins], e) from e
        for f in frees:
            slots[f] = None


def _run_block(plan: Plan, block, slots: list[Any]) -> None:
    branches = block.branches
    taken = itertools.count()

    def run_branch(k: int) -> None:
        _run_steps(plan, branches[k], slots)

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


def _failure(plan: Plan, step: tuple, slots: list[Any], exc: Exception) -> OnnxMiniError:
    index = next(i for i, s in enumerate(plan.steps) if s is step)
    return plan.kernel_error(index, [slots[i] for i in step[1]], exc)
