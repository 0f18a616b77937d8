"""Independent branches of a plan, found once at plan time, run on the thread pool at run time.

The steps of a plan are in one topological order. A *narrow cut* is a point of that order where at
most one value made by the steps is alive (a chain of modules: ResNet blocks, Inception modules). The
steps between two narrow cuts, but for the last (the join: Concat, the residual Add fused into the
last convolution), split into weakly connected components; two or more components holding heavy
work (a step whose kernel is declared heavy: a convolution, a matrix product, a pool, a recurrence;
worth a thread hand-off of ~70 us here) are *branches*: each reads only values
from before the segment and its own values, so they can run at the same time.

At run time (executor.execute, when parallel.threads() > 1 and numpy's BLAS is managed by
onnx_mini.blas) a block's branches are taken in turn by the calling thread and the pool's threads,
each branch running its steps in order; the join waits for all of them. A branch writes only its own
slots, kernels are pure and nothing inside a branch splits further (parallel.threads() is 1 there),
so the results are the same as a sequential run's. Frees of values read by several branches wait
for the end of the block.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .plan import DISCARD_SLOT, Plan

# A block runs its branches at the same time only when the second-longest branch took at least this
# long in the first run (the gain is at most that branch's time; a hand-off costs ~0.1 ms here).
# Measured: squeezenet's fire modules (two ~0.3 ms branches) ran 14.6 ms in parallel against 12.3 ms
# in turn; inception_v1's modules 31 against 36 ms.
MIN_BRANCH_SECONDS = 0.0005


@dataclass(frozen=True)
class Block:
    """Steps start..stop-1 of the plan as branches (lists of (index, fn, ins, out, frees)) followed by
    `after`, the slots to free once every branch is done. `worth` is filled by the first run that
    could run the block in parallel: [True] if it should, [False] if its branches are too short."""
    start: int
    stop: int
    branches: tuple[tuple[tuple, ...], ...]
    after: tuple[int, ...]
    worth: list = field(default_factory=list, compare=False)


def find_blocks(plan: Plan) -> tuple[Block, ...]:
    steps = plan.steps
    n = len(steps)
    if n < 3:
        return ()
    producer: dict[int, int] = {}
    last_read: dict[int, int] = {}
    for i, (_, ins, out, _) in enumerate(steps):
        for s in ins:
            last_read[s] = i
        for s in (out if isinstance(out, tuple) else (out,)):
            if s > DISCARD_SLOT:
                producer[s] = i
    # live[p]: values made by steps before p (or fed as graph inputs) and read at or after p
    delta = [0] * (n + 1)
    made = dict(producer)
    made.update((spec.slot, -1) for spec in plan.inputs if spec.slot not in producer)
    for s, i in made.items():
        r = last_read.get(s, i)
        if r > i:
            delta[i + 1] += 1
            delta[r + 1] -= 1
    cuts, live = [0], delta[0]
    for p in range(1, n + 1):
        live += delta[p]
        if live <= 1:
            cuts.append(p)
    blocks = []
    for a, b in zip(cuts, cuts[1:]):
        if b - a >= 3:
            block = _block(plan, a, b - 1, producer)
            if block is not None:
                blocks.append(block)
    return tuple(blocks)


def _block(plan: Plan, a: int, join: int, producer: dict[int, int]) -> Block | None:
    """Steps a..join-1 as branches, if they form at least two components with heavy work."""
    steps = plan.steps
    parent = list(range(a, join))

    def root(i: int) -> int:
        while parent[i - a] != i:
            parent[i - a] = parent[parent[i - a] - a]
            i = parent[i - a]
        return i
    for i in range(a, join):
        for s in steps[i][1]:
            p = producer.get(s)
            if p is not None and a <= p < i:
                ri, rp = root(i), root(p)
                if ri != rp:
                    parent[max(ri, rp) - a] = min(ri, rp)
    groups: dict[int, list[int]] = {}
    for i in range(a, join):
        groups.setdefault(root(i), []).append(i)
    heavy = [g for g in groups.values() if any(plan.infos[i].heavy for i in g)]
    if len(groups) < 2 or len(heavy) < 2:
        return None
    branch_of = {i: k for k, g in enumerate(groups.values()) for i in g}
    branches, after = [], []
    for g in groups.values():
        branch = []
        for i in g:
            fn, ins, out, frees = steps[i]
            own = tuple(s for s in frees if branch_of.get(producer.get(s)) == branch_of[i])
            after.extend(s for s in frees if s not in own)
            if len(own) != len(frees):       # a value other branches may still read: never in place
                fn = getattr(fn, "regular", fn)
            branch.append((i, fn, ins, out, own))
        branches.append(tuple(branch))
    # heaviest first: the branch started last should be the one that ends soonest
    branches.sort(key=lambda br: -sum(plan.infos[i].heavy for i, *_ in br))
    return Block(a, join, tuple(branches), tuple(after))
