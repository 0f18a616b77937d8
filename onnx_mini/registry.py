"""Kernels by (domain, op_type, since_version), and resolution of a node's version at prepare time.

A kernel is a factory: it takes the node's attributes as keyword-only arguments carrying the spec's
defaults and returns the function that runs on numpy values. One factory lists every schema version
it implements:

    @kernel("Shape", since=(1, 13))
    def shape_1():
        return lambda data: np.array(data.shape, dtype=np.int64)

Factory parameters whose names start with "_" are not attributes but facts the planner injects:
- `_version`: the schema version this binding serves (one of `since`);
- `_constants`: {input index: value} for the node's inputs known when the model is prepared
  (initializers that no feed can replace, folded constants). The factory may return a function
  specialised to them (weights transformed once, as onnxruntime's PrePack); the function still
  receives every input at run time, and a constant input arrives as that same value;
- `_options`: the model's kernel options, as given to prepare (e.g. {"conv_algorithm": "im2col"});
- `_n_inputs`/`_n_outputs`: how many the node has, counting omitted optional ones;
- `_graph`/`_opsets`/`_plan`: the graph holding the node, its opset imports, and a function that
  plans a Graph into a SubPlan (for ops about their own graph: Gradient).

Facts about an operator that the planner reads are arguments of @kernel, never name lists elsewhere:
- `foldable` (default True): computed once at prepare time when every input is constant (False for
  the random generators);
- `heavy`: a step worth a thread hand-off when independent branches run at the same time;
- `in_place`: f(*inputs, out=array) computing exactly the kernel's result for float32/float64
  arrays with numpy broadcasting, which the planner may point at an input's buffer when that input
  dies at the step;
- `views`: the result may be a view of the first input (Reshape, Squeeze, Identity, ...).
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import inspect
import pkgutil
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np
import onnx
import onnx.defs

from . import dtypes
from .graph import AttrRef, Function, Graph, Node, TypeInfo, normalize_domain
from .loader import parse_attribute, parse_function

INJECTED = ("_n_inputs", "_n_outputs", "_graph", "_opsets", "_plan", "_version", "_constants", "_options")


@dataclass(frozen=True)
class KernelSpec:
    factory: Callable
    op_type: str
    domain: str
    since: int
    attributes: frozenset[str]     # attribute names the factory accepts
    required: frozenset[str]       # attributes without a default
    injected: frozenset[str]       # names from INJECTED the factory asks for
    multi_output: bool             # the kernel's function returns a tuple (one item per output)
    foldable: bool = True          # computed at prepare time when every input is constant
    heavy: bool = False            # worth a thread hand-off (schedule.py)
    in_place: Callable | None = None   # f(*inputs, out=) for float32/64 (inplace.py)
    views: bool = False            # the result may be a view of the first input


_KERNELS: dict[tuple[str, str, int], KernelSpec] = {}


def _specs(factory: Callable, op_type: str, domain: str, versions: tuple[int, ...],
           multi_output: bool | None, **facts) -> list[KernelSpec]:
    """The KernelSpec of a factory for each version (TypeError if its parameters are not keyword-only)."""
    if not callable(factory):
        raise TypeError(f"kernel {op_type}: the decorated object must be a factory function")
    params = inspect.signature(factory).parameters.values()
    bad = [p.name for p in params if p.kind is not p.KEYWORD_ONLY]
    if bad:
        raise TypeError(f"kernel factory {factory.__name__}: parameters {bad} must be keyword-only")
    attrs = frozenset(p.name for p in params if p.name not in INJECTED)
    required = frozenset(p.name for p in params if p.default is p.empty and p.name not in INJECTED)
    injected = frozenset(p.name for p in params if p.name in INJECTED)
    out = []
    for v in versions:
        multi = multi_output
        if multi is None:
            schema = _schema(op_type, domain, v)
            multi = schema is not None and schema.max_output > 1
        out.append(KernelSpec(factory, op_type, domain, v, attrs, required, injected, multi, **facts))
    return out


def _versions(since) -> tuple[int, ...]:
    versions = (since,) if isinstance(since, (int, np.integer)) else tuple(since)
    if not versions or not all(isinstance(v, (int, np.integer)) and v >= 1 for v in versions):
        raise ValueError(f"since must be a version (int >= 1) or a sequence of them, got {since!r}")
    return tuple(int(v) for v in versions)


def kernel(op_type: str, since, domain: str = "", multi_output: bool | None = None, *, foldable: bool = True,
           heavy: bool = False, in_place: Callable | None = None, views: bool = False):
    """Register a built-in kernel factory for each listed schema version of (domain, op_type).

    multi_output defaults to what the schema says (more than one output possible); a kernel
    whose op can have several outputs returns a tuple, otherwise the single value. foldable, heavy,
    in_place and views are the operator's facts (see the module's doc).
    (Users register theirs with onnx_mini.kernel or a CustomOps set: see CustomOps.)
    """
    versions = _versions(since)
    domain = normalize_domain(domain)
    facts = dict(foldable=foldable, heavy=heavy, in_place=in_place, views=views)

    def register(factory: Callable) -> Callable:
        for spec in _specs(factory, op_type, domain, versions, multi_output, **facts):
            key = (domain, op_type, spec.since)
            if key in _KERNELS:
                raise ValueError(f"kernel {key} registered twice")
            _KERNELS[key] = spec
        return factory

    return register


# -- user kernels ---------------------------------------------------------------------------------

STANDARD_DOMAINS = ("", "ai.onnx.ml", "ai.onnx.preview.training")


class CustomOps:
    """A set of user kernels, registered with the same factory decorator as the built-in ones:

        ops = onnx_mini.CustomOps()

        @ops.kernel("MyOp", since=1, domain="my.domain")
        def my_op(*, alpha=1.0):
            return lambda x: (x * alpha).astype(x.dtype)

        onnx_mini.prepare(model, custom_ops=ops)      # or InferenceSession(model, custom_ops=ops)

    A node resolves to the newest version registered here not above the model's opset for its
    domain; the set is consulted before the global user kernels (onnx_mini.kernel) and the built-in
    ones. A kernel for an operator onnx_mini already runs (ai.onnx, ai.onnx.ml, com.microsoft, ...)
    replaces it only with override=True (ValueError otherwise). A kernel whose operator has several
    outputs returns a tuple and is registered with multi_output=True (for a standard operator the
    default follows its schema).
    """

    def __init__(self, *sets: "CustomOps"):
        self._specs: dict[tuple[str, str, int], KernelSpec] = {}
        for other in sets:
            self._specs.update(other._specs)

    def kernel(self, op_type: str, since, domain: str = "", *, multi_output: bool | None = None,
               override: bool = False):
        versions = _versions(since)
        domain = normalize_domain(domain)

        def register(factory: Callable) -> Callable:
            specs = _specs(factory, op_type, domain, versions, multi_output)
            if not override:
                builtin = _builtin(domain, op_type)
                if builtin:
                    raise ValueError(f"{domain or 'ai.onnx'} {op_type} is {builtin}: a user kernel replaces it "
                                     f"only when registered with override=True")
                twice = [s.since for s in specs if (domain, op_type, s.since) in self._specs]
                if twice:
                    raise ValueError(f"a kernel for {domain or 'ai.onnx'} {op_type} version(s) {twice} is already "
                                     "registered here (override=True replaces it)")
            for spec in specs:
                self._specs[(domain, op_type, spec.since)] = spec
            return factory

        return register

    def find(self, domain: str, op_type: str, opset: int | None) -> KernelSpec | None:
        """The newest kernel registered here for (domain, op_type) not above opset, or None."""
        if opset is None or not self._specs:
            return None
        versions = [v for (d, o, v) in self._specs if d == domain and o == op_type and v <= opset]
        return self._specs[(domain, op_type, max(versions))] if versions else None

    def ops(self) -> list[tuple[str, str, int]]:
        """Every registered (domain, op_type, version), sorted."""
        return sorted(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    def __repr__(self) -> str:
        shown = ", ".join(f"{d or 'ai.onnx'}:{o}-{v}" for d, o, v in self.ops())
        return f"CustomOps({shown})"


def _builtin(domain: str, op_type: str) -> str:
    """What already runs (domain, op_type) ('' if nothing): onnx's schema or a built-in kernel."""
    load_all_ops()
    if domain in STANDARD_DOMAINS and onnx.defs.has(op_type, domain):
        return "a standard operator"
    if any(d == domain and o == op_type for (d, o, _) in _KERNELS):
        return "a built-in operator"
    return ""


_USER = CustomOps()                      # global user kernels (onnx_mini.kernel)


def user_kernel(op_type: str, since, domain: str = "", *, multi_output: bool | None = None,
                override: bool = False):
    """onnx_mini.kernel: register a user kernel factory globally (every model prepared afterwards sees
    it). Same rules as CustomOps.kernel; the built-in kernels themselves are never modified."""
    return _USER.kernel(op_type, since, domain, multi_output=multi_output, override=override)


def global_custom_ops() -> CustomOps:
    return _USER


def overrides_builtin(custom_ops: CustomOps | None) -> bool:
    """Whether a user kernel in force (custom_ops or the global ones) replaces a built-in operator
    (the graph optimiser rewrites built-in operators by their known semantics, so it must not run)."""
    return any(_builtin(d, o) for user in (custom_ops, _USER) if user is not None for d, o, _ in user.ops())


def as_custom_ops(custom_ops) -> CustomOps | None:
    """custom_ops as given to prepare/InferenceSession (None, a CustomOps, or a list of them) -> one set."""
    if custom_ops is None:
        return None
    if isinstance(custom_ops, CustomOps):
        return custom_ops
    if isinstance(custom_ops, (list, tuple)) and all(isinstance(c, CustomOps) for c in custom_ops):
        return CustomOps(*custom_ops)
    raise TypeError(f"custom_ops must be a CustomOps or a list of them, got {type(custom_ops).__name__}")


_active: contextvars.ContextVar[CustomOps | None] = contextvars.ContextVar("onnx_mini_custom_ops", default=None)


def active_custom_ops() -> CustomOps | None:
    """The per-model kernel set planning runs with (None outside a custom_ops model)."""
    return _active.get()


@contextlib.contextmanager
def using_custom_ops(custom_ops: CustomOps | None):
    """Resolution inside the block consults custom_ops first (per-model kernels while planning)."""
    token = _active.set(custom_ops)
    try:
        yield
    finally:
        _active.reset(token)


_loaded = False


def load_all_ops() -> None:
    """Import every module of onnx_mini.ops so that their @kernel decorators run."""
    global _loaded
    if _loaded:
        return
    from . import ops
    for info in pkgutil.walk_packages(ops.__path__, ops.__name__ + "."):
        importlib.import_module(info.name)
    _loaded = True


def registered() -> dict[tuple[str, str, int], KernelSpec]:
    load_all_ops()
    return dict(_KERNELS)


@dataclass(frozen=True)
class Resolution:
    """What runs a node: a kernel, or a function body to inline. version is the schema's since_version."""
    version: int | None
    kernel: KernelSpec | None = None
    function: Function | None = None
    problem: str = ""              # why neither exists (empty when resolved)
    typed_function: bool = False   # no kernel, but the schema builds a body for given input types
                                   # (typed_function_body); `problem` says so for when they are unknown


def _schema(op_type: str, domain: str, opset: int):
    try:
        return onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return None


@functools.lru_cache(maxsize=None)
def _arity(op_type: str, domain: str, version: int):
    """(min inputs, max inputs, indices of required inputs (a trailing variadic one stands for all the
    positions from there on), min outputs, max outputs, formal input names), or None."""
    schema = _schema(op_type, domain, version)
    if schema is None or schema.since_version != version:
        return None
    option = onnx.defs.OpSchema.FormalParameterOption
    required = tuple(i for i, p in enumerate(schema.inputs) if p.option == option.Single)
    if schema.inputs and schema.inputs[-1].option == option.Variadic:   # every variadic input is required
        required += (len(schema.inputs) - 1,)
    names = tuple(p.name for p in schema.inputs)
    return schema.min_input, schema.max_input, required, schema.min_output, schema.max_output, names


def _attribute_kinds():
    A = onnx.defs.OpSchema.AttrType
    number, text = (int, float, np.integer, np.floating), (str, bytes)
    return {A.INT: (False, (int, np.integer)), A.FLOAT: (False, number), A.STRING: (False, text),
            A.TENSOR: (False, (np.ndarray,)), A.SPARSE_TENSOR: (False, (np.ndarray,)), A.GRAPH: (False, (Graph,)),
            A.TYPE_PROTO: (False, (TypeInfo, type(None))), A.INTS: (True, (int, np.integer)), A.FLOATS: (True, number),
            A.STRINGS: (True, text), A.TENSORS: (True, (np.ndarray,)), A.SPARSE_TENSORS: (True, (np.ndarray,)),
            A.GRAPHS: (True, (Graph,)), A.TYPE_PROTOS: (True, (TypeInfo, type(None)))}


@functools.lru_cache(maxsize=None)
def _attribute_types(op_type: str, domain: str, version: int) -> dict:
    schema = _schema(op_type, domain, version)
    if schema is None or schema.since_version != version:
        return {}
    kinds = _attribute_kinds()
    return {name: (a.type.name, *kinds[a.type]) for name, a in schema.attributes.items() if a.type in kinds}


def attribute_problem(node: Node, spec: KernelSpec) -> str:
    """Which of the node's attributes has a value of another type than its schema says, or ''."""
    types = _attribute_types(spec.op_type, spec.domain, spec.since)
    for name, value in node.attrs.items():
        if name not in types or isinstance(value, AttrRef):
            continue
        type_name, is_list, kinds = types[name]
        ok = (isinstance(value, list) and all(isinstance(v, kinds) and not isinstance(v, list) for v in value)
              if is_list else not isinstance(value, list) and isinstance(value, kinds))
        if not ok:
            shown = repr(value) if len(repr(value)) < 60 else type(value).__name__
            return f"attribute {name!r} must be of type {type_name}, got {shown}"
    return ""


def arity_problem(node: Node, spec: KernelSpec) -> str:
    """Why the node's inputs/outputs do not fit its schema (counts, a required input left empty), or ''."""
    arity = _arity(spec.op_type, spec.domain, spec.since)
    if arity is None:
        return ""
    lo, hi, required, out_lo, out_hi, names = arity
    n_in, n_out = len(node.inputs), len(node.outputs)
    if not lo <= n_in <= hi:
        absent = names[n_in:lo]
        return (f"{n_in} input(s) given, the operator takes {lo}" + (f" to {hi}" if hi != lo else "")
                + (f": it requires the input{'s' if len(absent) > 1 else ''} {', '.join(absent)}" if absent else ""))
    last = len(names) - 1
    missing = [i for i in range(n_in) if not node.inputs[i] and min(i, last) in required]
    if missing:
        return (f"required input(s) #{', #'.join(map(str, missing))} left empty "
                f"({', '.join(names[min(i, last)] for i in missing)})")
    if not out_lo <= n_out <= out_hi:
        return f"{n_out} output(s) given, the operator has {out_lo}" + (f" to {out_hi}" if out_hi != out_lo else "")
    return ""


def resolve(domain: str, op_type: str, opset: int | None) -> Resolution:
    """Resolve (domain, op_type) at the model's opset for that domain."""
    load_all_ops()
    domain = normalize_domain(domain)
    for user in (_active.get(), _USER):      # per-model kernels, then global user kernels
        spec = user.find(domain, op_type, opset) if user is not None else None
        if spec is not None:
            return Resolution(spec.since, kernel=spec)
    return _resolve(domain, op_type, opset)


@functools.lru_cache(maxsize=None)
def _resolve(domain: str, op_type: str, opset: int | None) -> Resolution:
    if opset is None:
        return Resolution(None, problem=f"the model imports no opset for domain {domain or 'ai.onnx'!r}")
    if onnx.defs.has(op_type, domain):
        schema = _schema(op_type, domain, opset)
        if schema is None:
            # onnxruntime's contrib schemas in the ai.onnx domain (LayerNormalization below opset 17):
            # a kernel registered for a version before onnx's first one
            older = [v for (d, o, v) in _KERNELS if d == domain and o == op_type and v <= opset]
            if older:
                return Resolution(max(older), kernel=_KERNELS[(domain, op_type, max(older))])
            return Resolution(None, problem=f"{op_type} does not exist in opset {opset} of domain "
                                            f"{domain or 'ai.onnx'!r}")
        version = schema.since_version
        spec = _KERNELS.get((domain, op_type, version))
        if spec is not None:
            return Resolution(version, kernel=spec)
        if schema.has_function:
            body = schema.get_function_with_opset_version(opset)
            if body:
                return Resolution(version, function=_parsed_body(schema, body))
        if schema.has_context_dependent_function and _typed_body_opset(schema, opset) is not None:
            return Resolution(version, problem=f"no kernel for {op_type}-{version} (its function body depends on "
                                               "input types, which are not known here)", typed_function=True)
        return Resolution(version, problem=f"no kernel for {op_type}-{version}")
    # A domain onnx does not know (custom ops): the newest registered version not above the opset.
    versions = [v for (d, o, v) in _KERNELS if d == domain and o == op_type and v <= opset]
    if versions:
        return Resolution(max(versions), kernel=_KERNELS[(domain, op_type, max(versions))])
    return Resolution(None, problem=f"unknown operator {op_type} in domain {domain or 'ai.onnx'!r}")


def _parsed_body(schema, body: bytes) -> Function:
    fn = parse_function(onnx.FunctionProto.FromString(body))
    # A caller that leaves an attribute out gets the schema's default, which the body's
    # FunctionProto does not carry (e.g. MeanVarianceNormalization's axes [0, 2, 3]).
    defaults = {name: parse_attribute(a.default_value) for name, a in schema.attributes.items()
                if a.default_value.type}
    return replace(fn, attributes={**fn.attributes, **{k: v for k, v in defaults.items()
                                                       if fn.attributes.get(k) is None}})


def _typed_body_opset(schema, opset: int) -> int | None:
    """The newest opset (not above the model's) for which the schema builds a type-dependent body."""
    versions = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
    return max(versions) if versions else None


def typed_function_body(node: Node, opset: int, input_types: list[TypeInfo | None]) -> Function:
    """The schema function body onnx builds for this node and these input types (None for an omitted
    input), as a Function. Only for a Resolution with typed_function=True. ValueError if onnx cannot
    build one (e.g. an input type it does not accept)."""
    domain = normalize_domain(node.domain)
    schema = _schema(node.op_type, domain, opset)
    proto = onnx.NodeProto(name=node.name, op_type=node.op_type, domain=node.domain, input=node.inputs,
                           output=node.outputs)
    proto.attribute.extend(_attribute_proto(k, v) for k, v in node.attrs.items())
    types = [(_type_proto(t) if t is not None else onnx.TypeProto()).SerializeToString() for t in input_types]
    body = schema.get_context_dependent_function_with_opset_version(_typed_body_opset(schema, opset),
                                                                      proto.SerializeToString(), types)
    if not body or not onnx.FunctionProto.FromString(body).node:
        shown = ", ".join(_type_text(t) for t in input_types)
        raise ValueError(f"onnx builds no function body of {node.op_type} for input types ({shown})")
    return _parsed_body(schema, body)


# -- back to protobuf, only to ask onnx for a type-dependent function body -------------------------

def _type_text(t: TypeInfo | None) -> str:
    if t is None:
        return "omitted"
    if t.kind in ("tensor", "sparse_tensor"):
        return f"{t.kind}({dtypes.type_name(t.elem_type) if t.elem_type else '?'})"
    return f"{t.kind}({_type_text(t.inner)})"


def _type_proto(t: TypeInfo) -> onnx.TypeProto:
    h = onnx.helper
    if t.kind in ("tensor", "sparse_tensor"):
        make = h.make_tensor_type_proto if t.kind == "tensor" else h.make_sparse_tensor_type_proto
        return make(t.elem_type, None if t.shape is None else list(t.shape))
    inner = _type_proto(t.inner) if t.inner is not None else onnx.TypeProto()
    if t.kind == "sequence":
        return h.make_sequence_type_proto(inner)
    if t.kind == "optional":
        return h.make_optional_type_proto(inner)
    return h.make_map_type_proto(t.key_type, inner)


def _attribute_proto(name: str, v) -> onnx.AttributeProto:
    A, h = onnx.AttributeProto, onnx.helper
    if isinstance(v, AttrRef):
        raise ValueError(f"attribute {name!r} still refers to the calling function's {v.name!r}")
    if isinstance(v, Graph):
        return h.make_attribute(name, _graph_proto(v))
    if isinstance(v, TypeInfo):
        return h.make_attribute(name, _type_proto(v))
    if isinstance(v, np.ndarray):
        return h.make_attribute(name, dtypes.array_to_tensor(v))
    if isinstance(v, list):
        if not v:
            return h.make_attribute(name, [], attr_type=A.INTS)
        if isinstance(v[0], Graph):
            return h.make_attribute(name, [_graph_proto(g) for g in v])
        if isinstance(v[0], TypeInfo):
            return h.make_attribute(name, [_type_proto(t) for t in v])
        if isinstance(v[0], np.ndarray):
            return h.make_attribute(name, [dtypes.array_to_tensor(x) for x in v])
    return h.make_attribute(name, v)


def _graph_proto(g: Graph) -> onnx.GraphProto:
    def vi(v):
        p = onnx.ValueInfoProto(name=v.name)
        if v.type is not None:
            p.type.CopyFrom(_type_proto(v.type))
        return p

    nodes = []
    for n in g.nodes:
        p = onnx.NodeProto(name=n.name, op_type=n.op_type, domain=n.domain, input=n.inputs, output=n.outputs)
        p.attribute.extend(_attribute_proto(k, v) for k, v in n.attrs.items())
        nodes.append(p)
    return onnx.GraphProto(name=g.name, node=nodes, input=[vi(v) for v in g.inputs],
                           output=[vi(v) for v in g.outputs], value_info=[vi(v) for v in g.value_info.values()],
                           initializer=[dtypes.array_to_tensor(a, k) for k, a in g.initializers.items()])


def supported_ops() -> list[tuple[str, str, int]]:
    """Every registered (domain, op_type, since_version), sorted."""
    return sorted(registered())


def uncovered() -> list[tuple[str, str, int, str]]:
    """Every (domain, op, since_version) onnx defines that cannot run: no kernel, and no function body
    whose every node resolves (recursively) to a kernel. -> [(domain, op, version, reason)], sorted."""
    load_all_ops()
    out = []
    for s in onnx.defs.get_all_schemas_with_history():
        domain = normalize_domain(s.domain)
        if (domain, s.name, s.since_version) in _KERNELS:
            continue
        reason = _body_problem(domain, s.name, s.since_version, 0)
        if reason:
            out.append((domain, s.name, s.since_version, reason))
    return sorted(out)


def _body_problem(domain: str, op_type: str, version: int, depth: int) -> str:
    """Why (domain, op_type) at opset `version` cannot run ("" when it can)."""
    r = _resolve(domain, op_type, version)
    if r.kernel is not None:
        return ""
    if r.function is None:
        return "no kernel" + (", and its function body depends on input types"
                              if "depends on input types" in r.problem else "")
    if depth > 8:
        return "function body nests too deeply"
    for node in r.function.nodes:
        inner = _body_problem(node.domain, node.op_type, r.function.opsets.get(node.domain, version), depth + 1)
        if inner:
            return f"function body needs {node.op_type}: {inner}" if depth == 0 else inner
    return ""
