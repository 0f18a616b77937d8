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
"""
from __future__ import annotations

import enum
import sys
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Sequence

from . import dtypes, loader
from .engine import PreparedModel, trace_hook
from .errors import InputError
from .graph import ModelMetadata, TypeInfo, ValueInfo
from .inputs import export_outputs, type_string

CPU = "CPUExecutionProvider"


class IgnoredOptionWarning(UserWarning):
    """An onnxruntime option, provider or argument that onnx_mini accepts but does not act on."""


_warned: set[str] = set()
_warned_lock = threading.Lock()


def warn_once(key: str, message: str) -> None:
    """Warn with `message` the first time `key` is seen in this process."""
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(message, IgnoredOptionWarning, stacklevel=_caller_level())


def _caller_level() -> int:
    """The stacklevel of the first frame outside onnx_mini (the user's line)."""
    import os
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
        raise AttributeError(f"{type(self).__name__} has no field {name!r}")

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
    (0 = verbose: a per-node trace on stderr),
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
        "enable_profiling": "profiling is not available through SessionOptions",
        "profile_file_prefix": "profiling is not available through SessionOptions",
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
        if optimize is None:
            optimize = opts.optimize
        if not verbose and opts.log_severity_level == 0:
            verbose = True
        with dtypes.model_limits(max_tensor_bytes):
            loaded = loader.load(path_or_bytes, base_dir)
        self._prepared = PreparedModel(loaded, optimize=optimize, verbose=verbose, custom_ops=custom_ops,
                                       max_tensor_bytes=max_tensor_bytes)
        self._init_names()

    def _init_names(self) -> None:
        g = self._prepared.model.graph
        known = {v.name for v in g.inputs} | set(g.initializers)
        for n in g.nodes:
            known.update(o for o in n.outputs if o)
        self._known = frozenset(known)
        self._all_outputs = tuple(v.name for v in g.outputs)

    @classmethod
    def from_prepared(cls, prepared: PreparedModel) -> "InferenceSession":
        """A session over an already prepared model (no re-planning)."""
        self = cls.__new__(cls)
        self._options = SessionOptions()
        self._prepared = prepared
        self._init_names()
        return self

    # -- pickling: the prepared model pickles itself (model kept, plans rebuilt on load) -----------
    def __getstate__(self) -> dict:
        return {"prepared": self._prepared, "options": self._options}

    def __setstate__(self, state: dict) -> None:
        self._prepared = state["prepared"]
        self._options = state["options"]
        self._init_names()

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

    def get_session_options(self) -> SessionOptions:
        return self._options

    def end_profiling(self) -> str:
        """onnxruntime's profile file name; onnx_mini writes none through a session (returns '')."""
        return ""

    # -- running ------------------------------------------------------------------------------
    def run(self, output_names: Sequence[str] | None, input_feed, run_options: RunOptions | None = None) -> list:
        """The values named by output_names (None or []: the graph's outputs; any intermediate value
        of the main graph may be named) for input_feed (dict name -> numpy array, Python scalar or
        nested list; declared element types convert Python values)."""
        names = tuple(output_names) if output_names else self._all_outputs
        if names != self._all_outputs:
            unknown = [n for n in names if n not in self._known]
            if unknown:
                raise InputError(f"unknown output name(s) {', '.join(map(repr, unknown))}: not a value of the "
                                 f"graph (its outputs are {', '.join(map(repr, self._all_outputs))})")
        hook = None
        if run_options is not None:
            if not isinstance(run_options, RunOptions):
                run_options = _foreign_options(run_options, RunOptions)
            run_options._warn_ignored()
            if run_options.log_severity_level == 0:
                hook = trace_hook(self._prepared.verbose or True)
        if hook is None and self._prepared.verbose:
            hook = trace_hook(self._prepared.verbose)
        plan = self._prepared.plan_for(names, input_feed)
        return export_outputs(self._prepared.execute(plan, input_feed, hook, self._options.intra_op_num_threads))


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
           "get_all_providers", "get_device"]
