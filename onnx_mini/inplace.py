"""In-place elementwise steps: a result written into an input's buffer (numpy's out=) instead of a
new array, when that input dies at this step and nothing else can see its memory.

Two checks, one per moment:
- plan time (`donations`): the input's slot is freed after this step (its last reader) and is read
  once by it; graph outputs are never freed, so never candidates;
- run time (`_free`): the array is referenced by the executor alone (its reference count is the one
  `_calibrate` measures for an array held only by a slot and the call's arguments: a caller's array,
  an initializer, a constant or a live view of it all hold one more), it is writeable and owns its
  memory (or is the sole view of a buffer nothing else holds, as the reshaped result of a matmul).
Anything else, and any dtype or shape mismatch, runs the regular kernel, whose results are equal.

Only float32/float64 tensors of the ops whose kernel declares an in-place form (@kernel's
`in_place`: Add, Sub, Mul, Div, Relu, Neg, Tanh, Exp, Abs, Sqrt at the versions with numpy
broadcasting) are done in place: that form computes exactly what the regular kernel does.
This is a stage after planning: `donate(plan, execute)` rewrites a planned Plan's steps.

A plan whose values have the same sizes at every run (specialize.py's: its inputs' shapes fixed) need
not check them at every call: `probe(plan)` has its in-place steps note their inputs' sizes during its
next run, then gives the regular kernel back to the steps whose inputs were all below MIN_SIZE, where
nothing is ever done in place (the wrapper's checks: ~0.15 us a call on a tiny Add).
"""
from __future__ import annotations

import sys
from typing import Callable

import numpy as np

from . import memory
from .plan import Plan

# Below this many elements a new array costs no more than the checks (numpy reuses small blocks).
MIN_SIZE = 16384
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def donate(plan: Plan, execute: Callable) -> None:
    """Give each step whose kernel has an in-place form, and one of whose inputs dies there (read once
    by it), the wrapper that writes into that input when the run-time checks allow. execute: the
    executor's loop, whose call pattern the reference counts are calibrated on (once)."""
    if not _limits:
        _limits.append(_calibrate(execute))
    steps = []
    for step, info in zip(plan.steps, plan.infos):
        fn, ins, o, frees = step
        if info.in_place is not None:
            donated = tuple(p for p, s in enumerate(ins) if s in frees and ins.count(s) == 1)
            if donated:
                step = (wrap(info.in_place, fn, donated, len(ins)), ins, o, frees)
        steps.append(step)
    plan.steps = steps


def _refs(a) -> tuple[int, int]:
    """(references to a, to a.base) as _free sees them; called one frame below a kernel."""
    base = a.base
    return sys.getrefcount(a), (sys.getrefcount(base) if base is not None else 0)


def _calibrate(execute: Callable) -> tuple[int, int]:
    """What _refs reports, one frame below a kernel the executor calls, for an input only its slot
    holds, and for the buffer of such an input that is the sole view of it: measured by running a
    two-step plan through the executor's `execute` itself, so the count follows its call pattern."""
    seen = []

    def free(a):              # stands for _free: one frame between the kernel and _refs
        return _refs(a)

    def kernel(a):
        seen.append(free(a))
    steps = [(lambda: np.empty(4).reshape(2, 2), (), 2, ()), (kernel, (2,), 3, (2,))]
    execute(Plan(steps, [], [None] * 4, [], ["y"], [3]), [None, None, None, None])
    return seen[0]


_limits: list[tuple[int, int]] = []      # _calibrate()'s result, measured by the first donate()


def _free(a) -> bool:
    """a is a float ndarray only the executor holds, whose memory nothing else can see."""
    if a.__class__ is not np.ndarray or a.dtype not in _FLOATS or not a.flags.writeable:
        return False
    held, base_held = _refs(a)
    max_held, max_base_held = _limits[0]
    if held > max_held:
        return False
    if a.flags.owndata:
        return True
    base = a.base
    return (base.__class__ is np.ndarray and base.flags.owndata
            and (base.nbytes == a.nbytes and base_held <= max_base_held
                 # a recycled buffer (memory.py), perhaps larger than a: its pool's one reference more
                 or base_held == max_base_held + 1 and memory.recycled(base)))


def wrap(in_place: Callable, regular: Callable, donated: tuple[int, ...], n_inputs: int) -> Callable:
    """The step function for a kernel (`regular`) with the in-place form `in_place(*inputs, out=)`,
    whose inputs at positions `donated` die at this step."""
    if n_inputs == 2:
        first, second = 0 in donated, 1 in donated

        def binary(a, b):
            # the size test first, without max(): tiny tensors pass through at ~0.1 us (~0.4 before)
            if (a.__class__ is np.ndarray and b.__class__ is np.ndarray
                    and (a.size >= MIN_SIZE or b.size >= MIN_SIZE) and a.dtype == b.dtype):
                if first and _free(a) and _fits(b.shape, a.shape):
                    return in_place(a, b, out=a)
                if second and _free(b) and _fits(a.shape, b.shape):
                    return in_place(a, b, out=b)
            return regular(a, b)
        binary.regular = regular      # schedule.py goes back to it where another branch still reads
        return binary
    if n_inputs == 1 and 0 in donated:
        def unary(x):
            return in_place(x, out=x) if x.__class__ is np.ndarray and x.size >= MIN_SIZE and _free(x) else regular(x)
        unary.regular = regular
        return unary
    return regular


def probe(plan: Plan) -> None:
    """Let plan's in-place steps note the largest input they receive in its next run; when the last
    of them has (the run is then past every other), their wrappers go where no input reached MIN_SIZE.
    For a plan whose inputs' shapes are fixed (specialize.py): a size that still varies from run to
    run comes after a data-dependent shape (NonZero, a Loop's trip count, ...), and a step that saw
    only small inputs then runs its regular kernel at any size, whose results are the same (only the
    buffer reuse is missed). Steps in independent branches (plan.blocks: they may run from the blocks'
    own copies of the steps) keep their wrappers. The noting frame holds the step's inputs: that run
    writes nothing in place."""
    original = plan.steps
    in_blocks = {i for b in plan.blocks for i in range(b.start, b.stop)}
    probed = [k for k, (fn, *_) in enumerate(original)
              if getattr(fn, "regular", None) is not None and k not in in_blocks]
    if not probed:
        return
    largest: dict[int, int] = {}
    last = probed[-1]

    def settle() -> None:
        if plan.steps is steps:           # (two threads' first runs may both get here: equal lists)
            plan.steps = [(fn.regular if k in largest and largest[k] < MIN_SIZE else fn, ins, out, frees)
                          for k, (fn, ins, out, frees) in enumerate(original)]

    def noting(fn: Callable, k: int) -> Callable:
        def step(*args):
            size = max([a.size if a.__class__ is np.ndarray else MIN_SIZE for a in args], default=MIN_SIZE)
            largest[k] = max(size, largest.get(k, 0))
            if k == last:
                settle()                  # the current run goes on with the steps it started with
            return fn(*args)
        step.regular = fn.regular
        return step

    steps = list(original)
    for k in probed:
        fn, ins, out, frees = original[k]
        steps[k] = (noting(fn, k), ins, out, frees)
    plan.steps = steps


def _fits(small: tuple, big: tuple) -> bool:
    """`small` broadcasts to exactly `big` (so the result has big's shape)."""
    if len(small) > len(big):
        return False
    return all(s in (1, b) for s, b in zip(small[::-1], big[::-1]))
