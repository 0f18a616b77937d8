"""The hot loop: walk the plan's steps over a list of slots. No parsing, no lookups, no checks. A plan
run often (COMPILE_AFTER runs) runs its steps as one compiled Python function instead of the loop."""
from __future__ import annotations

import itertools
import time
from typing import Any, Callable

from . import blas, parallel
from .errors import OnnxMiniError
from .plan import NONE_SLOT, TRACING, Plan, StepInfo, Tracing, slot_getter
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
    layout = plan.layout                 # (_layout's test inlined: a body runs once per iteration)
    if layout is None or layout.source is not plan.steps or layout.blocks is not plan.blocks:
        layout = _layout(plan)
    if layout.blocks and blas.splitting() and parallel.threads() > 1:
        return _execute_blocks(plan, layout, slots)
    run = layout.compiled
    if run is None:
        layout.runs += 1
        if layout.runs < COMPILE_AFTER or (run := layout.compile()) is None:
            _walk(plan, layout.steps, slots)
            return layout.outputs(slots)
    try:
        run(slots)
    except Exception as e:
        raise _failure(plan, _failed_step(e, run.__code__), slots, e) from e
    return layout.outputs(slots)


# The loop's own step layout, made from plan.steps once per plan (at its first run): (arity, fn, first
# input slot, second, third, output slot, first freed slot, the other freed slots, step index). Arity 1
# to 3 (nearly every step: a bias or a fused product takes three) call fn(slots[a], slots[b], slots[c])
# with no argument list built; 0 stands for every other step (no input, four or more, several
# outputs), where `a` holds the input slots. On the 1000-node chain of bench_core this cut the loop's
# own cost per step from ~0.38 to ~0.13 us (no-op kernels, same process); a 3-input step, ~0.3 us of
# its ~0.45 (the same way). A step frees one slot unconditionally (NONE_SLOT, always None, when it
# frees none) and loops over the rest only if any: ~0.03 us a step.
_GENERAL = 0


def _fast(index: int, fn, ins: tuple, out, frees: tuple) -> tuple:
    n = len(ins)
    free, more = (frees[0], frees[1:]) if frees else (NONE_SLOT, ())
    if out.__class__ is int and 1 <= n <= 3:
        return (n, fn, ins[0], ins[1 % n], ins[-1], out, free, more, index)
    return (_GENERAL, fn, ins, None, None, out, free, more, index)


# A plan run often is compiled: its steps become the lines of one Python function,
#     s[5] = f0(s[2], s[3]); s[2] = None
# with the kernels as its globals, so that a step costs its call and two stores (the 1000-node chain
# with no-op kernels: ~0.08 against ~0.15 us a step; with its kernels, ~0.12 us a step less). It runs
# exactly the loop's calls (the same argument references: inplace.py's counts hold), in the same order;
# a failing step is found from the traceback's line. Compiling costs ~35-45 us a step here (Python's
# compiler), what ~400 runs save: a plan is compiled at its COMPILE_AFTER-th run, when it is likely to
# run many more times (a server's model, a Loop's body), and never above COMPILE_MAX steps (the one
# run paying for the compile must stay short: 4096 steps, ~0.2 s).
COMPILE_AFTER = 256
COMPILE_MAX = 4096


class _Layout:
    """plan.steps in the loop's layout, the stretches and branches of plan.blocks in it, and
    outputs(slots): the list of the graph outputs' values; runs and compiled: see COMPILE_AFTER."""
    __slots__ = ("source", "blocks", "steps", "stretches", "branches", "outputs", "runs", "compiled")

    def __init__(self, plan: Plan):
        self.runs, self.compiled = 0, None
        self.source, self.blocks = plan.steps, plan.blocks
        self.steps = [_fast(i, *step) for i, step in enumerate(plan.steps)]
        self.outputs = slot_getter(plan.output_slots)
        self.stretches, self.branches = [], []
        pos = 0
        for block in plan.blocks:
            self.stretches.append(self.steps[pos:block.start])
            self.branches.append([[_fast(*s) for s in branch] for branch in block.branches])
            pos = block.stop
        self.stretches.append(self.steps[pos:])

    def compile(self):
        """The steps as one compiled function run(slots) (kept in self.compiled), or None (and the
        loop kept: runs stops counting) for a plan above COMPILE_MAX steps."""
        steps = self.source
        if len(steps) > COMPILE_MAX:
            self.runs = -(1 << 62)
            return None
        # the source holds nothing but slot numbers (`:d` takes ints only) and the names f0, f1, ...
        names = {"_store": _store}
        lines = ["def run(s):"]            # step k on line k + 2 (_failed_step)
        for k, (fn, ins, out, frees) in enumerate(steps):
            names[f"f{k}"] = fn
            call = f"f{k}({', '.join(f's[{i:d}]' for i in ins)})"
            line = (f"s[{out:d}] = {call}" if out.__class__ is int
                    else f"_store(({''.join(f'{o:d}, ' for o in out)}), {call}, s)")
            lines.append("    " + "; ".join([line] + [f"s[{f:d}] = None" for f in frees]))
        if not steps:
            lines.append("    pass")
        exec(compile("\n".join(lines), "<onnx_mini plan>", "exec"), names)
        self.compiled = names["run"]
        return self.compiled


def _failed_step(error: BaseException, code) -> int:
    """The index of the step of a compiled plan (its function's `code`) that raised `error`."""
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code is not code:
        tb = tb.tb_next
    return tb.tb_lineno - 2


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
        n, fn, a, b, c, out, free, more, _ = step
        try:
            if n == 2:
                slots[out] = fn(slots[a], slots[b])
            elif n == 1:
                slots[out] = fn(slots[a])
            elif n == 3:
                slots[out] = fn(slots[a], slots[b], slots[c])
            elif out.__class__ is int:
                slots[out] = fn(*[slots[i] for i in a])
            else:
                _store(out, fn(*[slots[i] for i in a]), slots)
        except Exception as e:
            raise _failure(plan, step[-1], slots, e) from e
        slots[free] = None
        if more:
            for f in more:
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
