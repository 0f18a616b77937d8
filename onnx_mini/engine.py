"""The engine: a model prepared once (PreparedModel) and run any number of times; prepare(),
run_model() and run_node() as the library's entry points. Plain Python: onnx's backend interface is
an adapter over this (backend.py), onnxruntime's is another (session.py)."""
from __future__ import annotations

import collections
import contextlib
import functools
import keyword
import sys
import threading
import time
from dataclasses import replace
from typing import Any

import onnx
import onnx.defs

from . import blas, dtypes, loader, run_scope
from .custom_ops import as_custom_ops, overrides_builtin, using_custom_ops
from .errors import OnnxMiniError
from .executor import Hook, execute
from .graph import Graph, Model, Node, ValueInfo
from .inputs import bind_inputs, export_outputs
from .ops._common import prepacking
from .plan import TRACING, Plan, StepInfo, describe_value
from .prepare import prepare_plan
from .specialize import Specializer
from .weight_layout import lay_out_weights


class PreparedModel:
    """A model planned once; run() may be called any number of times (it keeps no state between runs).

    Graph inputs backed by an initializer (every initializer is one in IR < 4 models) are defaults:
    with optimize=True the main plan folds them as constants (the light models build their weights
    from such inputs), and a run that feeds one of them uses a plan of the graph as written, made
    on first need.

    verbose: True (stderr) or a text stream: every run prints a per-node trace (trace_hook); off, the
    plain executor loop runs and the trace costs nothing.

    threads: at most this many threads per run for the kernels that split their work (None: the
    ONNX_MINI_THREADS default, the CPU count; 1: every run fully sequential, numpy's BLAS included).

    A PreparedModel pickles: the parsed model (plain Python objects and numpy arrays, external data
    included) travels, and the plans are rebuilt when it is unpickled; no file is read again.
    """

    def __init__(self, model: Model, *, optimize: bool = True, verbose: Any = False, custom_ops=None,
                 max_tensor_bytes: int | None = None, threads: int | None = None, conv_algorithm: str | None = None):
        if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool) or threads < 0):
            raise OnnxMiniError(f"threads must be a non-negative int (0 or None: the default), got {threads!r}")
        # its constant matrices in the memory order their products read faster (weight_layout.py): the
        # model's one copy of them, which every plan reads
        laid = lay_out_weights(model.graph)
        self.model = model if laid is model.graph else replace(model, graph=laid)
        self.threads = threads or None
        self.max_tensor_bytes = max_tensor_bytes       # this model's own size limit (None: process-wide only)
        self.custom_ops = as_custom_ops(custom_ops)   # per-model user kernels, resolved first
        # a user kernel replacing a built-in operator: no graph rewrites (they assume the built-in's meaning)
        self.optimize = optimize and not overrides_builtin(self.custom_ops)
        self.verbose = verbose
        self.conv_algorithm = conv_algorithm
        self.options = {} if conv_algorithm is None else {"conv_algorithm": conv_algorithm}   # kernels' _options
        g = model.graph
        self.defaults = (frozenset(v.name for v in g.inputs if v.name in g.initializers) if self.optimize
                         else frozenset())
        self._plans: dict[tuple, Plan] = {}
        self._prepacked: dict = {}      # the constant inputs' transforms its plans share (ops/_common.prepack)
        self._specializers: dict[int, Specializer] = {}    # id(plan) -> its shape-specialised plans
        self._lock = threading.Lock()
        # the BLAS mode of its runs on an idle machine, tried on its first runs there (blas.ModeChoice)
        self.blas_modes = blas.ModeChoice()
        self.plan: Plan = self.plan_for(tuple(v.name for v in g.outputs))
        self._outputs_type = outputs_type(tuple(self.plan.output_names))
        # run()'s short path applies: one plan serves every run (no default to override, no specialisation)
        self._plain = not self.defaults and id(self.plan) not in self._specializers

    def settle(self, inputs: Any, timeout: float = 5.0) -> str | None:
        """Run the model on `inputs` until the BLAS mode its runs keep on this machine is known, for at
        most `timeout` seconds: a new process's first runs wait for the machine's load to be read, and
        a model's first runs on an idle machine try both modes (blas.ModeChoice). For tools that time
        runs (the CLI's bench, profile and run's steady state). Returns "native", "split", or None when
        not decided within the timeout (or no mode applies: a plan without heavy steps, one thread)."""
        run_scope.settle(self.threads, self.plan.uses_blas)
        if not self.plan.uses_blas or self.threads == 1 or not blas.tries_modes():
            return None
        end = time.perf_counter() + timeout
        while self.blas_modes.split is None and time.perf_counter() < end:
            self.run(inputs)
        return None if self.blas_modes.split is None else "split" if self.blas_modes.split else "native"

    def plan_for(self, outputs: tuple[str, ...], feeds: Any = None) -> Plan:
        """The plan computing `outputs` (any values of the graph) for these feeds."""
        overrides = self._overrides(feeds) if self.defaults else False
        key = (outputs, overrides)
        plan = self._plans.get(key)
        if plan is None:
            with self._lock:
                plan = self._plans.get(key)
                if plan is None:
                    g = self.model.graph
                    if outputs != tuple(v.name for v in g.outputs):
                        g = replace(g, outputs=[ValueInfo(n, None) for n in outputs])
                    if self.defaults and not overrides:
                        g = replace(g, inputs=[v for v in g.inputs if v.name not in self.defaults])
                    with self._planning():
                        plan = prepare_plan(g, self.model.opsets, self.model.functions, optimize=self.optimize,
                                            options=self.options)
                    if self.optimize and Specializer.wanted(plan):
                        self._specializers[id(plan)] = Specializer(plan, self._replan, self._planning)
                    self._plans[key] = plan
        return plan

    def _replan(self, graph: Graph, constants: dict) -> Plan:
        """A plan of `graph` (this model's optimised graph, inputs' shapes now declared) for specialize.py."""
        return prepare_plan(graph, self.model.opsets, self.model.functions, optimize=True, options=self.options,
                            constants=constants)

    def _planning(self):
        """The context plans of this model are built in: its custom ops, its size limit."""
        stack = contextlib.ExitStack()
        stack.enter_context(using_custom_ops(self.custom_ops))
        stack.enter_context(dtypes.model_limits(self.max_tensor_bytes))
        stack.enter_context(prepacking(self._prepacked))
        return stack

    def plan_to_run(self, plan: Plan, feeds: Any) -> Plan:
        """The plan a run of `feeds` executes: `plan` (one of plan_for's) or, when it reads shapes at
        run time, its specialisation for the shapes of `feeds` (built now if new)."""
        specializer = self._specializers.get(id(plan))
        if specializer is None:
            return plan
        with dtypes.model_limits(self.max_tensor_bytes):
            return specializer.choose(bind_inputs(plan, feeds))[0]

    def execute(self, plan: Plan, feeds: Any, hook: Hook | None = None, threads: int | None = None) -> list:
        """Run `plan` (one of plan_for's) on `feeds`, on the plan specialised for their shapes when
        there is one; returns the output values in plan order. threads: None = the model's own."""
        slots = bind_inputs(plan, feeds)
        specializer = self._specializers.get(id(plan))
        scope = run_scope.enter(threads or self.threads, plan.uses_blas, self.max_tensor_bytes, self.blas_modes,
                                hook is None)
        try:
            if specializer is not None:
                plan, slots = specializer.choose(slots)
            if hook is None and TRACING.get() is not None:
                # a run inside a hooked one's kernel (a user kernel running a model): that hook is
                # not this run's, its bodies must not report to it
                token = TRACING.set(None)
                try:
                    return execute(plan, slots)
                finally:
                    TRACING.reset(token)
            return execute(plan, slots, hook)
        finally:
            run_scope.leave(scope)

    def __getstate__(self) -> dict:
        # plans hold closures (not picklable) and are cheap to rebuild; a text stream cannot travel
        verbose = self.verbose if isinstance(self.verbose, bool) else bool(self.verbose)
        return {"model": self.model, "optimize": self.optimize, "verbose": verbose, "custom_ops": self.custom_ops,
                "max_tensor_bytes": self.max_tensor_bytes, "threads": self.threads,
                "conv_algorithm": self.conv_algorithm}

    def __setstate__(self, state: dict) -> None:
        model = state["model"]
        _freeze_initializers(model.graph)
        for f in model.functions.values():
            _freeze_initializers(None, f.nodes)
        self.__init__(model, optimize=state["optimize"], verbose=state["verbose"],
                      custom_ops=state.get("custom_ops"), max_tensor_bytes=state.get("max_tensor_bytes"),
                      threads=state.get("threads"), conv_algorithm=state.get("conv_algorithm"))

    def _overrides(self, feeds: Any) -> bool:
        """Whether the feeds give a value to an initializer-backed input."""
        if not self.defaults or feeds is None:
            return False
        if isinstance(feeds, dict):
            return any(k in self.defaults for k in feeds)
        if isinstance(feeds, (list, tuple)):   # positional: one value per graph input overrides them
            return len(feeds) > len(self.model.graph.inputs) - len(self.defaults)
        return False

    @property
    def input_names(self) -> list[str]:
        """Names of the inputs a caller must give (those without an initializer default)."""
        return [i.name for i in self.plan.required_inputs]

    @property
    def output_names(self) -> list[str]:
        return list(self.plan.output_names)

    def run(self, inputs: Any, hook: Hook | None = None, **kwargs: Any):
        """inputs: a list (positional, graph order), a dict name -> value, or a single array.
        A sequence is a list of arrays, an optional None or its value (inputs and outputs alike)."""
        if self._plain and hook is None and not self.verbose and TRACING.get() is None:
            # the usual run (the graph's outputs, no default overridden, no shape specialisation, no
            # trace): execute() inlined, ~0.5 us less (a one-node model, same process)
            plan = self.plan
            slots = bind_inputs(plan, inputs)
            scope = run_scope.enter(self.threads, plan.uses_blas, self.max_tensor_bytes, self.blas_modes)
            try:
                values = execute(plan, slots)
            finally:
                run_scope.leave(scope)
        else:
            plan = self.plan if not self.defaults else self.plan_for(tuple(self.plan.output_names), inputs)
            if self.verbose:
                hook = _chain(trace_hook(self.verbose), hook)
            values = self.execute(plan, inputs, hook)
        # tuple.__new__ straight: the namedtuple's own __new__ is a Python call more (~0.15 us)
        return tuple.__new__(self._outputs_type, export_outputs(values))


@functools.lru_cache(maxsize=256)
def outputs_type(names: tuple[str, ...]) -> type:
    """The type of run()'s result: a tuple of the outputs in graph order, whose items are also read by
    output name (`outs["y"]`) or attribute where the name is an identifier (as onnx.backend's results);
    its values pickle (for results sent back by workers)."""
    fields = [n if n.isidentifier() and not keyword.iskeyword(n) else f"_{i}" for i, n in enumerate(names)]
    base = collections.namedtuple("Outputs", fields, rename=True)
    index = {n: i for i, n in enumerate(names)}

    def getitem(self, key):
        if isinstance(key, str):
            return tuple.__getitem__(self, index[key])
        return tuple.__getitem__(self, key)
    return type("Outputs", (base,), {"__slots__": (), "__getitem__": getitem,
                                     "__reduce__": lambda self: (_rebuild_outputs, (names, tuple(self)))})


def _rebuild_outputs(names: tuple[str, ...], values: tuple):
    return outputs_type(names)(*values)


class StepClock:
    """Times a hooked run's steps, bodies' steps included, for hooks (trace_hook, profile).

    A step runs from the end of the previous hook call at its depth (the sibling before it) or,
    for a body's first step, of the latest hook call, to its own hook call; a control-flow step's
    time therefore includes its body's (the body's first step also carries the work its parent did
    before it, e.g. a Loop's per-iteration bookkeeping). Time spent inside hook calls, between
    step() and done(), is charged to no step."""

    def __init__(self):
        self.start()

    def start(self) -> None:
        """A run begins now."""
        self.began = self.last = time.perf_counter()
        self.overhead = 0.0             # seconds spent between step() and done() so far
        self.marks: list[tuple[float, float]] = []   # per depth: (time, overhead) the next step starts at

    def step(self, depth: int) -> tuple[float, float, float]:
        """At a hook call for a step at `depth`: (now, the step's start, its time without hook calls)."""
        now = time.perf_counter()
        marks = self.marks
        if len(marks) > depth:
            start, overhead = marks[depth]
        else:                           # the first step of a body, so far as this clock knows
            start, overhead = self.last, self.overhead
            while len(marks) < depth:   # its parents began no later
                marks.append((start, overhead))
        return now, start, now - start - (self.overhead - overhead)

    def done(self, depth: int, now: float) -> None:
        """The hook call that step() began (at `now`) ends: the next step at this depth starts here,
        and the bodies below it are over."""
        end = time.perf_counter()
        self.overhead += end - now
        del self.marks[depth:]
        self.marks.append((end, self.overhead))
        self.last = end

    def elapsed(self) -> float:
        """The run's time so far without hook calls."""
        return time.perf_counter() - self.began - self.overhead


def trace_hook(out: Any = True) -> Hook:
    """A fresh executor hook printing one line per node to `out` (True: sys.stderr):

        [  12] conv1 Conv-11  X: float32[1, 3, 224, 224], W: float32[64, 3, 7, 7] -> y: float32[1, 64, 112, 112]  0.9 ms

    A body's steps (If, Loop, Scan, ...) come before their parent's line, indented two spaces per
    level and named by their path (`loop/body/Add_1`); an unnamed node is `<OpType>_<step index>`.
    Times are StepClock's (printing excluded): a control-flow node's includes its body."""
    stream = sys.stderr if out is True else out
    clock = StepClock()
    count = [0]

    def hook(info: StepInfo, inputs: tuple, outputs: tuple) -> None:
        now, _, elapsed = clock.step(info.depth)
        ins = ", ".join(f"{n or '<omitted>'}: {describe_value(v)}" for n, v in zip(info.inputs, inputs))
        outs = ", ".join(f"{n or '<unused>'}: {describe_value(v)}" for n, v in zip(info.outputs, outputs))
        op = f"{info.domain}::{info.op_type}" if info.domain else info.op_type
        print(f"[{count[0]:4d}] {'  ' * info.depth}{info.path} {op}-{info.version}  {ins} -> {outs}  "
              f"{elapsed * 1e3:.3f} ms", file=stream)
        count[0] += 1
        clock.done(info.depth, now)

    return hook


def _chain(first: Hook, second: Hook | None) -> Hook:
    if second is None:
        return first

    def hook(info: StepInfo, inputs: tuple, outputs: tuple) -> None:
        first(info, inputs, outputs)
        second(info, inputs, outputs)
    return hook


def _freeze_initializers(g: Graph | None, nodes: list[Node] = ()) -> None:
    """After unpickling: initializers are read-only again (as the loader left them), subgraphs too."""
    if g is not None:
        for arr in g.initializers.values():
            arr.flags.writeable = False
        nodes = g.nodes
    for n in nodes:
        for v in n.attrs.values():
            for sub in (v if isinstance(v, list) else (v,)):
                if isinstance(sub, Graph):
                    _freeze_initializers(sub)


def supports_device(device: str) -> bool:
    return str(device).upper().split(":")[0] == "CPU"


def is_compatible(model, device: str = "CPU", **kwargs: Any) -> bool:
    ir = getattr(model, "ir_version", loader.MIN_IR_VERSION)
    return supports_device(device) and loader.MIN_IR_VERSION <= ir <= loader.MAX_IR_VERSION


def prepare(model, device: str = "CPU", *, optimize: bool = True, base_dir: str | None = None,
            verbose: Any = False, custom_ops=None, max_tensor_bytes: int | None = None,
            threads: int | None = None, conv_algorithm: str | None = None, **kwargs: Any) -> PreparedModel:
    """model: ModelProto, path, bytes or binary file. verbose: True (stderr) or a text stream to
    print a per-node trace of every run. custom_ops: a CustomOps (or a list of them) whose kernels
    this model resolves first (see onnx_mini.CustomOps). max_tensor_bytes: this model's own cap on
    one tensor's size while loading, planning and running (below the process-wide set_limits).
    threads: at most this many threads per run (1: fully sequential; None: the CPU count).
    conv_algorithm: the algorithm every Conv uses where it applies (ops/nn/conv: e.g. "im2col");
    None lets each Conv choose by its shapes."""
    _check_device(device)
    return PreparedModel(load_laid_out(model, base_dir, max_tensor_bytes), optimize=optimize, verbose=verbose, custom_ops=custom_ops,
                         max_tensor_bytes=max_tensor_bytes, threads=threads, conv_algorithm=conv_algorithm)


def load_laid_out(model, base_dir: str | None, max_tensor_bytes: int | None) -> Model:
    """The model loaded within its size limit, its matrices laid out in place (weight_layout.py): the graph
    is the caller's own, so no matrix is held twice at once (PreparedModel then finds them laid out)."""
    with dtypes.model_limits(max_tensor_bytes):
        loaded = loader.load(model, base_dir)
    lay_out_weights(loaded.graph, in_place=True)
    return loaded


def run_model(model, inputs: Any, device: str = "CPU", **kwargs: Any):
    return prepare(model, device, **kwargs).run(inputs)


def run_node(node: onnx.NodeProto, inputs: Any, device: str = "CPU", outputs_info=None,
             *, opset_version: int | None = None, custom_ops=None, **kwargs: Any):
    """Run one NodeProto on numpy inputs (list in node input order, or dict by name).
    custom_ops: user kernels the node may resolve to (see onnx_mini.CustomOps)."""
    _check_device(device)
    n: Node = loader.parse_node(node)
    names = [x for x in n.inputs if x]
    if not isinstance(inputs, dict):
        inputs = dict(zip(names, inputs))
    graph = Graph(name="run_node", nodes=[n], inputs=[ValueInfo(x, None) for x in names],
                  outputs=[ValueInfo(x, None) for x in n.outputs if x], initializers={})
    opsets = dict.fromkeys(("", "ai.onnx.ml", "ai.onnx.preview.training"), None)
    for d in opsets:
        opsets[d] = onnx.defs.onnx_opset_version() if d == "" else _max_version(d)
    ops = as_custom_ops(custom_ops)
    for domain, _, version in ops.ops() if ops is not None else ():   # a user domain: its newest version
        if domain not in ("", "ai.onnx.ml", "ai.onnx.preview.training"):
            opsets[domain] = max(version, opsets.get(domain, 0))
    if opset_version is not None:
        opsets[n.domain] = opset_version
    model = Model(graph=graph, opsets=opsets, ir_version=onnx.IR_VERSION)
    return PreparedModel(model, custom_ops=ops).run(inputs)


@functools.lru_cache(maxsize=None)
def _max_version(domain: str) -> int:
    return max((s.since_version for s in onnx.defs.get_all_schemas_with_history() if s.domain == domain),
               default=1)


def _check_device(device: str) -> None:
    if not supports_device(device):
        raise OnnxMiniError(f"device {device!r} is not supported: onnx_mini runs on CPU only")
