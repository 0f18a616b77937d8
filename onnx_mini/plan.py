"""The plan's data types: what prepare produces and the executor walks. A leaf module: it imports
nothing of onnx_mini but errors and graph, so that every stage can name these types.

A Plan is a list of steps over integer slots: (fn, input slots, output slot | output slots, slots
freed after), with a StepInfo per step saying what it is (for messages, tracing, profiling), the
template slot list (None, initializers, folded constants), and the graph inputs and outputs.
A SubPlan is a body graph's plan (If branches, Loop/Scan bodies, SequenceMap, Gradient's forward
graph) as the kernel owning it receives it: it runs the body once per call, with no planning.

Hooks reach body steps through TRACING, a context variable the executor's hooked loop sets (the
hook, and the scope of the step running): SubPlan.run reads it and runs the body hooked, its steps
scoped below that step. A context variable is per thread and per task, so concurrent runs of one
plan each see their own hook; with none set, a body runs the plain loop (one `get` per body run).
"""
from __future__ import annotations

import contextvars
import operator
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np

from .errors import InvalidValueError, KernelError, OnnxMiniError
from .graph import Graph, TypeInfo

NONE_SLOT, DISCARD_SLOT = 0, 1   # slot 0 is always None (omitted inputs); slot 1 swallows unused outputs


@dataclass(frozen=True)
class StepInfo:
    """What a step is, for messages, tracing and profiling (never read by the hot loop)."""
    name: str
    op_type: str
    domain: str
    version: int
    opset: int
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    kernel: Callable | None = field(default=None, compare=False)  # the factory's function (profile: its algorithm)
    heavy: bool = False                    # the kernel's fact: worth a thread hand-off (schedule.py)
    in_place: Callable | None = field(default=None, compare=False)   # the kernel's in-place form (inplace.py)
    fused_from: tuple[str, ...] = ()       # the written nodes the optimiser merged into this one (Node.fused_from)
    # Where the step sits, as a hook sees it: (label,) for a step of the model's graph, and for a
    # body's step its parent's scope, the attribute holding the body, then its own label, e.g.
    # ("Loop_0", "body", "If_2", "then_branch", "Add_1"). Empty in plan.infos (Plan.scoped_infos).
    scope: tuple[str, ...] = ()

    @property
    def path(self) -> str:
        return scope_path(self.scope, self.name)

    @property
    def depth(self) -> int:
        return scope_depth(self.scope)


def scope_path(scope: tuple[str, ...], name: str) -> str:
    """'Loop_0/body/Add_1': the scope joined by '/' (node names may hold '/' too: scope is exact)."""
    return "/".join(scope) if scope else name


def scope_depth(scope: tuple[str, ...]) -> int:
    """0 for a step of the model's graph, 1 inside a body, 2 inside a body's body, ..."""
    return max(len(scope) - 1, 0) // 2


def step_labels(infos: list[StepInfo]) -> list[str]:
    """Each step's label in its plan: its node name, or `<OpType>_<step index>` when the name is empty
    or shared with another step of the plan (inlined function bodies may repeat one)."""
    seen: dict[str, int] = {}
    for info in infos:
        seen[info.name] = seen.get(info.name, 0) + 1
    return [info.name if info.name and seen[info.name] == 1 else f"{info.name or info.op_type}_{i}"
            for i, info in enumerate(infos)]


class Tracing:
    """The hook of a hooked run in progress and the scope of the step it is running (executor.py
    sets it in TRACING; SubPlan.run reads it)."""
    __slots__ = ("hook", "scope")

    def __init__(self, hook: Callable, scope: tuple[str, ...] = ()):
        self.hook = hook
        self.scope = scope


TRACING: contextvars.ContextVar[Tracing | None] = contextvars.ContextVar("onnx_mini_tracing", default=None)


@dataclass(frozen=True)
class InputSpec:
    name: str
    slot: int
    type: TypeInfo | None
    has_default: bool        # an initializer backs it (IR < 4 style): the input may be omitted


@dataclass
class Plan:
    steps: list[tuple]                 # (fn, input slots, output slot | output slots, slots freed after)
    infos: list[StepInfo]
    template: list[Any]                # initial slot values: None, initializers, folded constants
    inputs: list[InputSpec]            # every graph input, in graph order
    output_names: list[str]
    output_slots: list[int]
    slot_names: list[str] = field(default_factory=list)
    output_types: list[TypeInfo | None] = field(default_factory=list)  # declared, for empty Loop/Scan outputs
    source: Graph | None = None        # the (optimised) graph the steps come from, for specialize.py
    blocks: tuple = ()                 # independent branches (schedule.Block), top-level plans only
    uses_blas: bool = True             # a heavy step (MatMul, Conv, ...) here or in a body: runs manage BLAS
    required_inputs: list[InputSpec] = field(init=False)   # inputs without an initializer default
    input_by_name: dict[str, InputSpec] = field(init=False, repr=False, compare=False)
    _scoped: dict = field(init=False, repr=False, compare=False)   # scope prefix -> scoped_infos
    layout: Any = field(default=None, init=False, repr=False, compare=False)   # the executor's, made at the first run
    binder: Any = field(default=None, init=False, repr=False, compare=False)   # inputs.bind_inputs's, made at the first run

    def __post_init__(self):
        self.required_inputs = [i for i in self.inputs if not i.has_default]
        self.input_by_name = {i.name: i for i in self.inputs}
        self._scoped = {}

    def scoped_infos(self, prefix: tuple[str, ...] = ()) -> list[StepInfo]:
        """The step infos a hook receives when this plan runs under `prefix` (() for the model's
        graph): each with its scope set. Made once per prefix (a body has one: its parent's place)."""
        infos = self._scoped.get(prefix)
        if infos is None:      # two threads may both build it: equal lists, either one kept
            infos = [replace(info, scope=(*prefix, label))
                     for info, label in zip(self.infos, step_labels(self.infos))]
            self._scoped[prefix] = infos
        return infos

    def kernel_error(self, index: int, values: list, exc: BaseException) -> KernelError:
        info = self.infos[index]
        shapes = ", ".join(f"{n or '<omitted>'}: {describe_value(v)}" for n, v in zip(info.inputs, values))
        reason = str(exc) or type(exc).__name__
        if not isinstance(exc, OnnxMiniError):
            reason = f"{type(exc).__name__}: {reason}"
        return KernelError(f"{reason} [inputs: {shapes or 'none'}]", node=info.name, op_type=info.op_type,
                           domain=info.domain, version=info.version, opset=info.opset)


def slot_getter(indices) -> Callable[[list], list]:
    """f(slots) -> [slots[i] for i in indices], without the comprehension's own call (for two
    outputs 0.14 us against 0.19: a body's outputs are gathered once per iteration)."""
    if not indices:
        return lambda slots: []
    if len(indices) == 1:
        (i,) = indices
        return lambda slots: [slots[i]]
    get = operator.itemgetter(*indices)
    return lambda slots: list(get(slots))


def describe_value(v) -> str:
    if isinstance(v, np.ndarray):
        return f"{v.dtype}{list(v.shape)}"
    if v is None:
        return "None"
    if isinstance(v, list):
        kinds = sorted({describe_value(x).split("[")[0] for x in v})
        return f"sequence[{len(v)}]" + (f" of {'/'.join(kinds)}" if kinds else "")
    return type(v).__name__


class SubPlan:
    """A body graph planned once, at prepare time, for the kernel that owns it (SequenceMap, If, Loop,
    Scan): the factory receives it in place of the GRAPH attribute (a list of them for GRAPHS).

    The kernel's step receives the node's own inputs followed by the `n_captures` outer-scope values
    that the node's subgraphs read (node.captures order, shared by all subgraphs of the node; each
    SubPlan picks the ones it reads). `run(inputs, captured)` executes the body once:

        @kernel("SequenceMap", since=17)
        def sequence_map_17(*, body, _n_inputs, _n_outputs):
            def run(seq, *rest):
                extra, captured = rest[:_n_inputs - 1], rest[_n_inputs - 1:]
                ... body.run([seq[i], *extra], captured) ...

    A kernel running its body many times in one call (Loop, Scan) takes `runner(captured)` once and
    calls what it returns per iteration: the captured values and the hook are looked up once, so an
    iteration costs a copy of the slot list, its inputs written in, and the executor's walk (for a body
    of one step, that step's call alone). A body of no step returning constants (an If branch giving a
    flag) returns them without a walk.
    """
    __slots__ = ("plan", "name", "key", "n_captures", "_picks", "_input_slots", "_inputs_at", "_read", "_execute",
                 "_fixed")

    def __init__(self, plan: "Plan", name: str, captures: tuple[str, ...], node_captures: tuple[str, ...],
                 execute: Callable[..., list], key: str = "body"):
        """execute: the executor's loop, execute(plan, slots, hook=None, scope=()) (prepare.py hands it
        down: this module knows no later stage). key: the attribute holding the graph ('then_branch',
        'body', 'graphs[1]'), the body's part of its steps' scope."""
        self.plan = plan
        self.name = name
        self.key = key
        self.n_captures = len(node_captures)
        where = {n: i for i, n in enumerate(node_captures)}
        slot_of = {n: i for i, n in enumerate(plan.slot_names)}
        # (slot in the body, position in the step's captured tail) for each outer name the body reads
        self._picks = tuple((slot_of[n], where[n]) for n in captures)
        self._input_slots = tuple(i.slot for i in plan.inputs)
        # the planner numbers a graph's inputs first, one after the other: then one slice assignment
        # writes them all (else None: one by one)
        first = self._input_slots[0] if self._input_slots else 0
        contiguous = self._input_slots == tuple(range(first, first + len(self._input_slots)))
        self._inputs_at = slice(first, first + len(self._input_slots)) if contiguous else None
        read = {s for _, ins, _, _ in plan.steps for s in ins} | set(plan.output_slots)
        self._read = tuple(s in read for s in self._input_slots)
        self._execute = execute
        # a body of no step whose outputs are all constants (an If branch returning a flag): its
        # outputs, as the executor would read them from the template (an If call: 0.86 against 2.0 us)
        filled = {*self._input_slots, *(s for s, _ in self._picks)}
        self._fixed = (tuple(plan.template[s] for s in plan.output_slots)
                       if not plan.steps and not filled & set(plan.output_slots) else None)

    @property
    def input_names(self) -> list[str]:
        return [i.name for i in self.plan.inputs]

    @property
    def output_names(self) -> list[str]:
        return list(self.plan.output_names)

    @property
    def output_types(self) -> list[TypeInfo | None]:
        """The body's declared output types (None where undeclared)."""
        return list(self.plan.output_types) or [None] * len(self.plan.output_names)

    def reads(self, k: int) -> bool:
        """Whether the body reads its k-th input (a step takes it, or it is an output): a kernel need
        not make a value nobody reads (a Loop's iteration number, often)."""
        return self._read[k]

    def _slots(self, captured) -> list:
        """A fresh slot list of the body: its constants, and the captured outer values in their slots
        (the body's inputs, never among those, are left for the caller)."""
        slots = self.plan.template.copy()
        for s, p in self._picks:
            slots[s] = captured[p]
        return slots

    def run(self, inputs, captured=()) -> list:
        """Run the body once: `inputs` in the body's input order, `captured` the step's captured tail."""
        if len(inputs) != len(self._input_slots):
            raise InvalidValueError(f"subgraph {self.name!r} takes {len(self._input_slots)} input(s), "
                                    f"{len(inputs)} given")
        if self._fixed is not None:
            return list(self._fixed)
        slots = self._slots(captured)
        for s, v in zip(self._input_slots, inputs):
            slots[s] = v
        tracing = TRACING.get()
        if tracing is None:
            return self._execute(self.plan, slots)
        return self._execute(self.plan, slots, tracing.hook, (*tracing.scope, self.key))

    def runner(self, captured=()) -> Callable[[list], list]:
        """The body as a function of its inputs, for one call of the kernel owning it (the captured
        values, and the hook of a hooked run, are those of that call): f(inputs) runs the body once on
        `inputs` (a list in the body's input order) and returns its outputs' list.

        f empties `inputs`: the body's slots then hold the only references to values its caller keeps
        no more (a Loop's carried values, handed back from the previous iteration), and the body's
        in-place steps (inplace.py) may write the next values into their buffers."""
        base = self._slots(captured)
        plan, execute, n, at = self.plan, self._execute, len(self._input_slots), self._inputs_at
        tracing = TRACING.get()
        input_slots = self._input_slots
        if tracing is not None or at is None:
            # a hooked run (the scope of the step running this body is fixed for the call), or inputs
            # in slots apart
            hooked = () if tracing is None else (tracing.hook, (*tracing.scope, self.key))

            def call(inputs: list) -> list:
                if len(inputs) != n:       # a slice assignment would resize the slot list
                    raise InvalidValueError(f"subgraph {self.name!r} takes {n} input(s), {len(inputs)} given")
                slots = base.copy()
                if at is not None:
                    slots[at] = inputs
                else:
                    for s, v in zip(input_slots, inputs):
                        slots[s] = v
                inputs.clear()
                return execute(plan, slots, *hooked)
            return call

        if len(plan.steps) == 1 and plan.steps[0][2].__class__ is int:
            return self._one_step(base, n, at)

        def plain(inputs: list) -> list:   # the usual case, per iteration: the least work
            if len(inputs) != n:
                raise InvalidValueError(f"subgraph {self.name!r} takes {n} input(s), {len(inputs)} given")
            slots = base.copy()
            slots[at] = inputs
            inputs.clear()
            return execute(plan, slots)
        return plain

    def single_step(self, captured=()) -> tuple[Callable, list, tuple, Callable] | None:
        """For a body of one step with one output that every body output names (a Scan RNN cell the
        optimiser fused into one MatMul: the new state and the scan output are that step's result),
        outside a hooked run: (fn, args, at, error). fn(*args) runs that step; args holds the body's
        constants and captured values in place, its caller writes the body's inputs in, at[j] being
        the positions in args of body input j; error(args, exc) is the KernelError to raise from a
        failed call, naming the step as the executor's loop does. None for any other body (a kernel
        then takes `runner`). A kernel iterating so keeps its own references to the values (no slot
        list): an in-place step (inplace.py) sees one more than it was calibrated for and allocates."""
        plan = self.plan
        if len(plan.steps) != 1 or not plan.output_slots or TRACING.get() is not None:
            return None
        fn, ins, out, _ = plan.steps[0]
        if out.__class__ is not int or any(s != out for s in plan.output_slots):
            return None
        base = self._slots(captured)
        at = tuple(tuple(p for p, s in enumerate(ins) if s == slot) for slot in self._input_slots)

        def error(args: list, exc: BaseException):
            return plan.kernel_error(0, list(args), exc)
        return fn, [base[s] for s in ins], at, error

    def _one_step(self, base: list, n: int, at: slice) -> Callable[[list], list]:
        """runner's function for a body of one step with one output (a Scan RNN cell the optimiser
        fused into one MatMul): that step called as the executor's loop calls it (arguments passed one
        by one, so an input only its slot holds has the reference count inplace.py calibrated),
        without the loop around it (scan_rnn's body call: 8.0 against 9.3 us, under load). A failure
        names the step as the loop's does."""
        plan = self.plan
        fn, ins, out, _ = plan.steps[0]
        outputs = slot_getter(plan.output_slots)
        name, k = self.name, len(ins)
        a, b, c, d = (ins[0], ins[1 % k], ins[2 % k], ins[-1]) if k else (None,) * 4

        def one(inputs: list) -> list:
            if len(inputs) != n:
                raise InvalidValueError(f"subgraph {name!r} takes {n} input(s), {len(inputs)} given")
            slots = base.copy()
            slots[at] = inputs
            inputs.clear()
            try:
                if k == 2:
                    slots[out] = fn(slots[a], slots[b])
                elif k == 1:
                    slots[out] = fn(slots[a])
                elif k == 3:
                    slots[out] = fn(slots[a], slots[b], slots[c])
                elif k == 4:            # (a fused MatMul with its two addends: 0.1 against 0.3 us for the list)
                    slots[out] = fn(slots[a], slots[b], slots[c], slots[d])
                else:
                    slots[out] = fn(*[slots[i] for i in ins])
            except Exception as e:
                raise plan.kernel_error(0, [slots[i] for i in ins], e) from e
            return outputs(slots)
        return one

    def __repr__(self) -> str:
        return (f"SubPlan({self.name!r}, inputs={self.input_names}, outputs={self.output_names}, "
                f"steps={len(self.plan.steps)})")
