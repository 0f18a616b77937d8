"""A drop-in for onnxruntime.InferenceSession over a prepared model.

    import onnx_mini as ort            # instead of: import onnxruntime as ort
    sess = ort.InferenceSession("model.onnx", providers=["CPUExecutionProvider"])
    outputs = sess.run(None, {sess.get_inputs()[0].name: x})

Any value of the main graph may be requested as an output, not only the declared outputs: a plan
with those outputs is built once per distinct request and cached. A session keeps no state between
runs, so `run` may be called from many threads at once. SessionOptions / RunOptions take
onnxruntime's fields; the ones onnx_mini acts on are honoured (graph_optimization_level ->
optimize, log_severity_level 0 -> the per-node trace), every other field set to a non-default value
is reported once per process by an IgnoredOptionWarning, never dropped silently.

Beyond run(): OrtValue and IOBinding (ort_api.py) with run_with_ort_values / io_binding /
run_with_iobinding, profiling (SessionOptions.enable_profiling: end_profiling() writes onnxruntime's
JSON trace of per-node times), the module's logger severity. A name of onnxruntime's API that onnx_mini
lacks raises an AttributeError saying what to use instead (ort_api.UNSUPPORTED).
"""
from __future__ import annotations

import enum
import json
import operator
import os
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from . import dtypes
from .engine import PreparedModel, StepClock, load_laid_out, trace_hook
from .errors import ArgumentError, InputError
from .executor import Hook
from .graph import ModelMetadata, TypeInfo, ValueInfo
from .inputs import export_outputs, type_string
from .ort_api import IOBinding, OrtValue, missing_attribute
from .plan import StepInfo

CPU = "CPUExecutionProvider"


class IgnoredOptionWarning(UserWarning):
    """An onnxruntime option, provider or argument that onnx_mini accepts but does not act on."""


_warned: set[str] = set()
_warned_lock = threading.Lock()


# onnxruntime's default logger: severity 0 verbose, 1 info, 2 warning (its default), 3 error, 4 fatal.
_logger = {"severity": 2, "verbosity": 0}


def set_default_logger_severity(severity: int) -> None:
    """As onnxruntime's (0 verbose .. 4 fatal; else an ArgumentError). In onnx_mini, 0 turns on the
    per-node trace (stderr) of the sessions created afterwards whose SessionOptions.log_severity_level
    is left at -1, and 3 or 4 (errors only) silence IgnoredOptionWarning."""
    _logger["severity"] = _int_arg(severity, "set_default_logger_severity", 0, 4,
                                   "0: verbose, 1: info, 2: warning, 3: error, 4: fatal")


def set_default_logger_verbosity(verbosity: int) -> None:
    """As onnxruntime's: any int is accepted. It has no effect, as in onnxruntime's release builds
    (verbosity only applies to their debug-build VLOG messages)."""
    _logger["verbosity"] = _int_arg(verbosity, "set_default_logger_verbosity")


def _int_arg(value: Any, where: str, low: int | None = None, high: int | None = None, meaning: str = "") -> int:
    try:
        value = operator.index(value)
    except TypeError:
        raise ArgumentError(f"{where} expects an int, got {type(value).__name__} {value!r}") from None
    if low is not None and not low <= value <= high:
        raise ArgumentError(f"{where}: {value} is not in {low}..{high} ({meaning})")
    return value


def warn_once(key: str, message: str) -> None:
    """Warn with `message` the first time `key` is seen in this process (none while the default logger
    severity is error or fatal)."""
    if _logger["severity"] >= 3:
        return
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(message, IgnoredOptionWarning, stacklevel=_caller_level())


def _caller_level() -> int:
    """The stacklevel of the first frame outside onnx_mini (the user's line)."""
    here = os.path.dirname(os.path.abspath(__file__))
    frame, level = sys._getframe(2), 2       # 1: warn_once's caller... counted from warnings.warn
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(here + os.sep):
        frame, level = frame.f_back, level + 1
    return level


class GraphOptimizationLevel(enum.IntEnum):
    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_LAYOUT = 3
    ORT_ENABLE_ALL = 99


class ExecutionMode(enum.IntEnum):
    ORT_SEQUENTIAL = 0
    ORT_PARALLEL = 1


class ExecutionOrder(enum.IntEnum):
    DEFAULT = 0
    PRIORITY_BASED = 1
    MEMORY_EFFICIENT = 2


class _Options:
    """Attribute-style options with onnxruntime's names and defaults; remembers which were set."""
    _DEFAULTS: dict[str, Any] = {}
    _WHY: dict[str, str] = {}        # field -> why it has no effect (fields absent here are honoured)

    def __init__(self, **fields: Any):
        object.__setattr__(self, "_values", {})
        object.__setattr__(self, "_entries", {})
        for k, v in fields.items():
            setattr(self, k, v)

    def __getattr__(self, name: str) -> Any:
        defaults = type(self)._DEFAULTS
        if name in defaults:
            return self._values.get(name, defaults[name])
        if name.startswith("_"):
            raise AttributeError(name)
        kind = type(self).__name__
        raise missing_attribute(kind, name, missing=f"{kind} has no field {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in type(self)._DEFAULTS:
            raise AttributeError(f"{type(self).__name__} has no field {name!r}; known fields: "
                                 f"{', '.join(sorted(type(self)._DEFAULTS))}")
        self._values[name] = value

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self._values.items())})"

    def __getstate__(self) -> dict:
        return {"_values": dict(self._values), "_entries": dict(self._entries)}

    def __setstate__(self, state: dict) -> None:
        object.__setattr__(self, "_values", state["_values"])
        object.__setattr__(self, "_entries", state["_entries"])

    def _config_entry(self, key: str, value: str) -> None:
        self._entries[str(key)] = str(value)

    def _warn_ignored(self) -> None:
        """One warning per ignored field (set to a non-default value) and per config entry."""
        kind = type(self).__name__
        for name, value in self._values.items():
            why = self._WHY.get(name)
            if why is not None and value != self._DEFAULTS[name]:
                warn_once(f"{kind}.{name}", f"onnx_mini ignores {kind}.{name} (set to {value!r}): {why}")
        for key in self._entries:
            warn_once(f"{kind}.entry.{key}", f"onnx_mini ignores the {kind} config entry {key!r}: "
                                               "config entries are specific to onnxruntime")


class SessionOptions(_Options):
    """onnxruntime.SessionOptions' fields. Honoured: graph_optimization_level (ORT_DISABLE_ALL runs the
    graph as written: optimize=False), intra_op_num_threads (caps the threads onnx_mini's own kernels
    split work over during this session's runs; numpy's BLAS keeps its own), log_severity_level
    (0 = verbose: a per-node trace on stderr; -1: set_default_logger_severity's), enable_profiling and
    profile_file_prefix (InferenceSession.end_profiling writes the trace),
    execution_mode ORT_SEQUENTIAL and use_deterministic_compute (onnx_mini is both). Every other field
    set to a non-default value warns once that it has no effect."""
    _DEFAULTS = {
        "graph_optimization_level": GraphOptimizationLevel.ORT_ENABLE_ALL,
        "log_severity_level": -1, "log_verbosity_level": 0, "logid": "",
        "intra_op_num_threads": 0, "inter_op_num_threads": 0,
        "execution_mode": ExecutionMode.ORT_SEQUENTIAL, "execution_order": ExecutionOrder.DEFAULT,
        "enable_profiling": False, "profile_file_prefix": "onnxruntime_profile_",
        "optimized_model_filepath": "", "enable_cpu_mem_arena": True, "enable_mem_pattern": True,
        "enable_mem_reuse": True, "use_deterministic_compute": False, "use_per_session_threads": True,
    }
    _WHY = {
        "log_verbosity_level": "onnx_mini has one verbose level (log_severity_level=0 traces every node)",
        "logid": "onnx_mini's trace has no logger id",
        "inter_op_num_threads": "onnx_mini runs nodes one after the other",
        "execution_mode": "onnx_mini runs nodes one after the other (ORT_SEQUENTIAL)",
        "execution_order": "onnx_mini runs nodes in a stable topological order",
        "optimized_model_filepath": "onnx_mini does not write optimised models",
        "enable_cpu_mem_arena": "onnx_mini allocates through numpy and frees values at their last use",
        "enable_mem_pattern": "onnx_mini allocates through numpy and frees values at their last use",
        "enable_mem_reuse": "onnx_mini allocates through numpy and frees values at their last use",
        "use_per_session_threads": "onnx_mini's thread pool is process-wide (ONNX_MINI_THREADS)",
    }

    @property
    def optimize(self) -> bool:
        return int(self.graph_optimization_level) != GraphOptimizationLevel.ORT_DISABLE_ALL

    def add_session_config_entry(self, key: str, value: str) -> None:
        self._config_entry(key, value)

    def get_session_config_entry(self, key: str) -> str:
        return self._entries[key]

    def add_free_dimension_override_by_name(self, name: str, value: int) -> None:
        warn_once("SessionOptions.free_dimension_override", "onnx_mini ignores free dimension overrides: "
                  "symbolic dimensions take the size of the values fed")

    add_free_dimension_override_by_denotation = add_free_dimension_override_by_name


class RunOptions(_Options):
    """onnxruntime.RunOptions' fields. Honoured: log_severity_level (0 = trace this run's nodes on
    stderr), only_execute_path_to_fetches (onnx_mini's results are the same either way). Other
    fields set to a non-default value warn once."""
    _DEFAULTS = {"log_severity_level": -1, "log_verbosity_level": 0, "logid": "",
                 "only_execute_path_to_fetches": False, "terminate": False}
    _WHY = {
        "log_verbosity_level": "onnx_mini has one verbose level (log_severity_level=0 traces every node)",
        "logid": "onnx_mini's trace has no logger id",
        "terminate": "a run of onnx_mini cannot be interrupted",
    }

    def add_run_config_entry(self, key: str, value: str) -> None:
        self._config_entry(key, value)

    def get_run_config_entry(self, key: str) -> str:
        return self._entries[key]


def get_available_providers() -> list[str]:
    return [CPU]


def get_all_providers() -> list[str]:
    return [CPU]


def get_device() -> str:
    return "CPU"


@dataclass(frozen=True)
class NodeArg:
    """Like onnxruntime.NodeArg: name, type string ('tensor(float)'), shape (ints, str for symbolic
    dimensions, None for unknown ones; [] for non-tensors and tensors of unknown rank, as onnxruntime)."""
    name: str
    type: str
    shape: list


def node_arg(v: ValueInfo) -> NodeArg:
    t: TypeInfo | None = v.type
    shape = list(t.shape) if t is not None and t.kind == "tensor" and t.shape is not None else []
    return NodeArg(v.name, type_string(t) if t is not None else "tensor(undefined)", shape)


class InferenceSession:
    """InferenceSession(path_or_bytes_or_proto, sess_options=None, providers=None, **kwargs).

    The model is a path, bytes, binary file object or ModelProto. onnx_mini's own keyword arguments:
    optimize (bool; default from sess_options), verbose (True or a text stream: a per-node trace of
    every run), base_dir (the folder of external data when the model is given as bytes), custom_ops
    (a CustomOps, or a list of them: user kernels this session resolves first).
    onnxruntime's provider_options, disabled_optimizers and any other keyword are accepted with a
    warning. A session pickles (the parsed model, external data included, is re-planned on load).
    """

    def __init__(self, path_or_bytes, sess_options: SessionOptions | None = None, providers=None,
                 provider_options=None, *, optimize: bool | None = None, verbose: Any = False,
                 base_dir: str | None = None, custom_ops=None, max_tensor_bytes: int | None = None, **kwargs: Any):
        opts = sess_options if sess_options is not None else SessionOptions()
        if not isinstance(opts, SessionOptions):
            opts = _foreign_options(opts, SessionOptions)
        opts._warn_ignored()
        _check_providers(providers, provider_options)
        for k in kwargs:
            warn_once(f"InferenceSession.{k}", f"onnx_mini ignores InferenceSession argument {k!r}")
        self._options = opts
        self._start_profiling()
        if optimize is None:
            optimize = opts.optimize
        if not verbose and _severity(opts.log_severity_level) == 0:
            verbose = True
        start = time.perf_counter()
        loaded = load_laid_out(path_or_bytes, base_dir, max_tensor_bytes)
        loaded_at = time.perf_counter()
        self._prepared = PreparedModel(loaded, optimize=optimize, verbose=verbose, custom_ops=custom_ops,
                                       max_tensor_bytes=max_tensor_bytes)
        if self._profiler is not None:
            source = "uri" if isinstance(path_or_bytes, (str, os.PathLike)) else "array"
            self._profiler.session_event(f"model_loading_{source}", start, loaded_at - start)
            self._profiler.session_event("session_initialization", loaded_at, time.perf_counter() - loaded_at)
        self._init_names()

    def _init_names(self) -> None:
        g = self._prepared.model.graph
        known = {v.name for v in g.inputs} | set(g.initializers)
        for n in g.nodes:
            known.update(o for o in n.outputs if o)
        self._known = frozenset(known)
        self._all_outputs = tuple(v.name for v in g.outputs)
        self._declared = {v.name: v.type for v in (*g.inputs, *g.outputs)}
        self._parameters = frozenset(g.initializers)

    def _start_profiling(self) -> None:
        self._profiler = _Profiler(self._options.profile_file_prefix) if self._options.enable_profiling else None
        self._profiling_start_ns = self._profiler.start_ns if self._profiler is not None else 0

    @classmethod
    def from_prepared(cls, prepared: PreparedModel) -> "InferenceSession":
        """A session over an already prepared model (no re-planning)."""
        self = cls.__new__(cls)
        self._options = SessionOptions()
        self._prepared = prepared
        self._start_profiling()
        self._init_names()
        return self

    # -- pickling: the prepared model pickles itself (model kept, plans rebuilt on load) -----------
    def __getstate__(self) -> dict:
        return {"prepared": self._prepared, "options": self._options}

    def __setstate__(self, state: dict) -> None:
        self._prepared = state["prepared"]
        self._options = state["options"]
        self._start_profiling()          # a copy profiles its own runs, into its own file
        self._init_names()

    def __getattr__(self, name: str):
        # only for names the class lacks: onnxruntime's that onnx_mini does not provide say what to use
        if name.startswith("_"):
            raise AttributeError(name)
        raise missing_attribute("InferenceSession", name)

    # -- description --------------------------------------------------------------------------
    @property
    def prepared(self) -> PreparedModel:
        return self._prepared

    def get_inputs(self) -> list[NodeArg]:
        g = self._prepared.model.graph
        return [node_arg(v) for v in g.inputs if v.name not in g.initializers]

    def get_outputs(self) -> list[NodeArg]:
        return [node_arg(v) for v in self._prepared.model.graph.outputs]

    def get_overridable_initializers(self) -> list[NodeArg]:
        """Graph inputs backed by an initializer (a default a run may override)."""
        g = self._prepared.model.graph
        return [node_arg(v) for v in g.inputs if v.name in g.initializers]

    def get_modelmeta(self) -> ModelMetadata:
        """producer_name, producer_version, graph_name, graph_description, domain, description, version,
        custom_metadata_map, as onnxruntime's ModelMetadata."""
        return self._prepared.model.metadata

    def get_providers(self) -> list[str]:
        return [CPU]

    def get_provider_options(self) -> dict:
        return {CPU: {}}

    def set_providers(self, providers=None, provider_options=None) -> None:
        _check_providers(providers, provider_options)

    def enable_fallback(self) -> None:
        """Nothing to fall back from: every node runs on CPUExecutionProvider."""

    def disable_fallback(self) -> None:
        """Nothing to fall back from: every node runs on CPUExecutionProvider."""

    def get_session_options(self) -> SessionOptions:
        return self._options

    # -- profiling ------------------------------------------------------------------------------
    def end_profiling(self) -> str:
        """With SessionOptions.enable_profiling: stop profiling and write onnxruntime's profile (a JSON
        list of Chrome-trace events: the session's loading and initialisation, each run, each node of
        each run, times in microseconds) to '<profile_file_prefix>_<date>_<time>.json' in the current
        folder (the prefix may hold a folder); returns that file name. Otherwise (or again) ''."""
        profiler, self._profiler = self._profiler, None
        return profiler.write() if profiler is not None else ""

    def get_profiling_start_time_ns(self) -> int:
        """When profiling started (ns since the epoch, as time.time_ns()); 0 without profiling."""
        return self._profiling_start_ns

    # -- running ------------------------------------------------------------------------------
    def run(self, output_names: Sequence[str] | None, input_feed, run_options: RunOptions | None = None) -> list:
        """The values named by output_names (None or []: the graph's outputs; any intermediate value
        of the main graph may be named) for input_feed (dict name -> numpy array, OrtValue, Python
        scalar or nested list; declared element types convert Python values)."""
        return export_outputs(self._run(self._output_names(output_names), input_feed, run_options))

    def run_with_ort_values(self, output_names: Sequence[str] | None, input_dict_ort_values,
                            run_options: RunOptions | None = None) -> list[OrtValue]:
        """run() with OrtValues in (numpy arrays are accepted too) and OrtValues out."""
        names = self._output_names(output_names)
        values = export_outputs(self._run(names, input_dict_ort_values, run_options))
        return [OrtValue.from_output(v, self._declared.get(n)) for n, v in zip(names, values)]

    def io_binding(self) -> IOBinding:
        """An IOBinding for run_with_iobinding: inputs are the graph's (overridable initializers
        included), outputs any value of the graph."""
        return IOBinding(self, frozenset(v.name for v in self._prepared.model.graph.inputs), self._known)

    def run_with_iobinding(self, iobinding: IOBinding, run_options: RunOptions | None = None) -> None:
        """Run the binding's inputs; its outputs (get_outputs, copy_outputs_to_cpu) are this run's."""
        if not isinstance(iobinding, IOBinding) or iobinding._session is not self:
            raise ArgumentError("run_with_iobinding expects an IOBinding from this session's io_binding()")
        names = tuple(iobinding._outputs)
        if not names:
            raise InputError("no output is bound: call bind_output(name) (or bind_ortvalue_output) first")
        values = export_outputs(self._run(names, dict(iobinding._inputs), run_options))
        iobinding._store(names, values, self._declared)

    def _output_names(self, output_names: Sequence[str] | None) -> tuple[str, ...]:
        names = tuple(output_names) if output_names else self._all_outputs
        if names != self._all_outputs:
            unknown = [n for n in names if n not in self._known]
            if unknown:
                raise InputError(f"unknown output name(s) {', '.join(map(repr, unknown))}: not a value of the "
                                 f"graph (its outputs are {', '.join(map(repr, self._all_outputs))})")
        return names

    def _run(self, names: tuple[str, ...], input_feed, run_options: RunOptions | None) -> list:
        """The values `names` for these feeds, in the plan's form (export_outputs makes them the caller's)."""
        if isinstance(input_feed, dict):
            for v in input_feed.values():       # a plain loop: ~0.4 us less than any() over a generator
                if isinstance(v, OrtValue):
                    input_feed = {k: v._value if isinstance(v, OrtValue) else v for k, v in input_feed.items()}
                    break
        hook = None
        if run_options is not None:
            if not isinstance(run_options, RunOptions):
                run_options = _foreign_options(run_options, RunOptions)
            run_options._warn_ignored()
            if run_options.log_severity_level == 0:
                hook = trace_hook(self._prepared.verbose or True)
        if hook is None and self._prepared.verbose:
            hook = trace_hook(self._prepared.verbose)
        # the field read past _Options.__getattr__ (~0.3 us per run); unset is 0 there, None here: both no cap
        threads = self._options._values.get("intra_op_num_threads")
        profiler = self._profiler
        if profiler is None:
            prepared = self._prepared
            # the graph's outputs, no initializer to override: the main plan without plan_for's key (~0.3 us)
            plan = (prepared.plan if names is self._all_outputs and not prepared.defaults
                    else prepared.plan_for(names, input_feed))
            return prepared.execute(plan, input_feed, hook, threads)
        recorder = _RunRecorder(profiler, hook, self._parameters)
        try:
            plan = self._prepared.plan_for(names, input_feed)
            recorder.start()
            return self._prepared.execute(plan, input_feed, recorder, threads)
        finally:
            recorder.finish()


class _Profiler:
    """One session's profile in onnxruntime's format: a list of Chrome-trace complete events ("ph": "X",
    "ts" and "dur" in microseconds from the start of profiling), "Session" ones for loading,
    initialisation and each run ("model_run"), a "Node" one per node run, named '<node>_kernel_time'
    (unnamed nodes '<op>_<index>'), its args holding op_name, provider, node_index (the step's place
    in its graph's run) and the inputs' and outputs' element types and shapes, with sizes in bytes.
    Nodes are timed by engine.StepClock: "ts" when the node began, "dur" its time without the
    profiler's bookkeeping. The nodes of control-flow bodies are events of their own (args: path, e.g.
    'Loop_0/body/Add_1'; node_index counts on over a Loop's iterations), reported before their parent,
    whose time includes theirs (as onnxruntime's If/Loop/Scan kernel times include their subgraphs)."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.start_ns = time.time_ns()
        self.origin = time.perf_counter()
        self.pid = os.getpid()
        self.events: list[dict] = []
        self.lock = threading.Lock()

    def _event(self, cat: str, name: str, start: float, dur: float, args: dict) -> dict:
        """start: time.perf_counter() seconds; dur: seconds."""
        return {"cat": cat, "pid": self.pid, "tid": threading.get_native_id(), "dur": int(dur * 1e6),
                "ts": int((start - self.origin) * 1e6), "ph": "X", "name": name, "args": args}

    def session_event(self, name: str, start: float, dur: float) -> None:
        event = self._event("Session", name, start, dur, {})
        with self.lock:
            self.events.append(event)

    def add_run(self, steps: list[tuple], start: float, dur: float) -> None:
        """File one run's events: steps as _RunRecorder collects them."""
        events = []
        for info, index, begin, took, ins, outs, acts, params, size in steps:
            args = {"op_name": info.op_type, "provider": CPU, "node_index": str(index), "input_type_shape": ins,
                    "output_type_shape": outs, "activation_size": str(acts), "parameter_size": str(params),
                    "output_size": str(size)}
            if info.depth:
                args["path"] = info.path
            label = info.scope[-1] if info.scope else info.name or f"{info.op_type}_{index}"
            events.append(self._event("Node", f"{label}_kernel_time", begin, took, args))
        events.append(self._event("Session", "model_run", start, dur, {}))
        with self.lock:
            self.events.extend(events)

    def write(self) -> str:
        when = time.localtime(self.start_ns // 10**9)
        name = f"{self.prefix}_{time.strftime('%Y-%m-%d_%H-%M-%S', when)}_{self.start_ns // 10**6 % 1000:03d}.json"
        with self.lock:
            events = list(self.events)
        with open(name, "w", encoding="utf-8") as f:
            json.dump(events, f)
        return name


class _RunRecorder:
    """The executor hook of one profiled run (calling `inner`, the trace, too). Inputs that are
    initializers (`parameters`) count as parameter_size, the others as activation_size."""

    def __init__(self, profiler: _Profiler, inner: Hook | None, parameters: frozenset):
        self.profiler = profiler
        self.inner = inner
        self.parameters = parameters
        self.steps: list[tuple] = []
        self.run_start = time.perf_counter()
        self.clock = StepClock()
        self.counts: dict[tuple, int] = {}       # scope of a graph being run -> its steps seen so far

    def start(self) -> None:
        """The executor is entered now (planning and input checks are not the first node's)."""
        self.clock.start()

    def __call__(self, info: StepInfo, inputs: tuple, outputs: tuple) -> None:
        now, start, took = self.clock.step(info.depth)
        index = self.counts.get(info.scope[:-1], 0)
        self.counts[info.scope[:-1]] = index + 1
        if len(self.counts) > 1:                         # the bodies this step ran count afresh next time
            for k in [k for k in self.counts if len(k) > len(info.scope) and k[:len(info.scope)] == info.scope]:
                del self.counts[k]
        params = acts = 0
        for n, v in zip(info.inputs, inputs):
            if isinstance(v, np.ndarray):
                if n in self.parameters:
                    params += v.nbytes
                else:
                    acts += v.nbytes
        self.steps.append((info, index, start, took, _type_shapes(inputs), _type_shapes(outputs), acts, params,
                           sum(v.nbytes for v in outputs if isinstance(v, np.ndarray))))
        if self.inner is not None:
            self.inner(info, inputs, outputs)
        self.clock.done(info.depth, now)

    def finish(self) -> None:
        self.profiler.add_run(self.steps, self.run_start, time.perf_counter() - self.run_start)


def _type_shapes(values) -> list[dict]:
    """[{'float': [2, 3]}, ...] for the tensors among `values`, as onnxruntime's profile lists them."""
    return [{dtypes.type_name(dtypes.ELEM_TYPE.get(v.dtype, 0)): list(v.shape)}
            for v in values if isinstance(v, np.ndarray)]


def _severity(level: int) -> int:
    """A session's or run's log_severity_level, -1 meaning the default logger's."""
    return _logger["severity"] if level == -1 else level


def _check_providers(providers, provider_options) -> None:
    for p in providers or ():
        name = p[0] if isinstance(p, (tuple, list)) else p
        if name != CPU:
            warn_once(f"provider.{name}", f"onnx_mini has no {name}: the session runs on {CPU}")
        elif isinstance(p, (tuple, list)) and len(p) > 1 and p[1]:
            warn_once(f"provider_options.{name}", f"onnx_mini ignores the options of {CPU}: {p[1]!r}")
    if provider_options and any(provider_options):
        warn_once("provider_options", "onnx_mini ignores provider_options")


def _foreign_options(opts: Any, cls: type) -> _Options:
    """onnxruntime's own SessionOptions / RunOptions object: copy the fields we know."""
    mine = cls()
    for name, default in cls._DEFAULTS.items():
        value = getattr(opts, name, default)
        if not isinstance(value, (bool, int, float, str)) and hasattr(value, "__int__"):
            value = int(value)                 # onnxruntime's enums
        if value != default:
            setattr(mine, name, value)
    return mine


__all__ = ["InferenceSession", "SessionOptions", "RunOptions", "NodeArg", "GraphOptimizationLevel",
           "ExecutionMode", "ExecutionOrder", "IgnoredOptionWarning", "get_available_providers",
           "get_all_providers", "get_device", "set_default_logger_severity", "set_default_logger_verbosity",
           "OrtValue", "IOBinding"]
