"""Turn a Graph into a Plan: everything per-model happens here, once, so that run() only walks steps.

- function bodies (model-local functions, schema function bodies) are inlined, subgraphs of their nodes
  included (the names a subgraph reads from the function's scope are renamed with the body's);
  a type-dependent schema body is built from the declared input types, or, when those are unknown
  before run time, once per input signature at run time (`_typed_function_kernel`);
- nodes are sorted (stable Kahn), resolved to a kernel version, and their attributes bound;
- value names become integer slots; the template slot list holds initializers and folded constants;
- each step lists the slots that die after it, so intermediates are freed at their last use.

Planning is re-entrant: a subgraph is planned like a graph, with its outer-scope names as extra inputs.
Each GRAPH attribute of a node (SequenceMap's body, If's branches, Loop/Scan bodies) becomes a SubPlan
before the node's factory is called; the outer values the node's subgraphs read (`node.captures`) are
appended to the step's inputs, after the node's own, and the kernel hands them to SubPlan.run.
"""
from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np

from . import dtypes, inplace
from .errors import (GraphError, InvalidNodeError, InvalidValueError, KernelError, NodeError, OnnxMiniError,
                     UnsupportedOperatorError)
from .graph import AttrRef, Function, Graph, Node, TypeInfo, ValueInfo, free_names, normalize_domain, topo_sort
from .registry import (KernelSpec, active_custom_ops, arity_problem, attribute_problem, resolve, typed_function_body,
                       using_custom_ops)

# Ops whose result must not be computed once at prepare time even when all inputs are constant.
NOT_FOLDABLE = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                          "Multinomial", "Bernoulli", "Dropout"})
MAX_INLINE_DEPTH = 64
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
    required_inputs: list[InputSpec] = field(init=False)   # inputs without an initializer default

    def __post_init__(self):
        self.required_inputs = [i for i in self.inputs if not i.has_default]

    def kernel_error(self, index: int, values: list, exc: BaseException) -> KernelError:
        info = self.infos[index]
        shapes = ", ".join(f"{n or '<omitted>'}: {describe_value(v)}" for n, v in zip(info.inputs, values))
        reason = str(exc) or type(exc).__name__
        if not isinstance(exc, OnnxMiniError):
            reason = f"{type(exc).__name__}: {reason}"
        return KernelError(f"{reason} [inputs: {shapes or 'none'}]", node=info.name, op_type=info.op_type,
                           domain=info.domain, version=info.version, opset=info.opset)


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
    """
    __slots__ = ("plan", "name", "n_captures", "_picks", "_input_slots", "_execute")

    def __init__(self, plan: "Plan", name: str, captures: tuple[str, ...], node_captures: tuple[str, ...]):
        from .executor import execute  # executor imports this module
        self.plan = plan
        self.name = name
        self.n_captures = len(node_captures)
        where = {n: i for i, n in enumerate(node_captures)}
        slot_of = {n: i for i, n in enumerate(plan.slot_names)}
        # (slot in the body, position in the step's captured tail) for each outer name the body reads
        self._picks = tuple((slot_of[n], where[n]) for n in captures)
        self._input_slots = tuple(i.slot for i in plan.inputs)
        self._execute = execute

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

    def run(self, inputs, captured=()) -> list:
        """Run the body once: `inputs` in the body's input order, `captured` the step's captured tail."""
        if len(inputs) != len(self._input_slots):
            raise InvalidValueError(f"subgraph {self.name!r} takes {len(self._input_slots)} input(s), "
                                    f"{len(inputs)} given")
        slots = self.plan.template.copy()
        for s, v in zip(self._input_slots, inputs):
            slots[s] = v
        for s, p in self._picks:
            slots[s] = captured[p]
        return self._execute(self.plan, slots)

    def __repr__(self) -> str:
        return (f"SubPlan({self.name!r}, inputs={self.input_names}, outputs={self.output_names}, "
                f"steps={len(self.plan.steps)})")


# ---------------------------------------------------------------------------------------------

def build_plan(graph: Graph, opsets: dict[str, int], functions: dict[tuple[str, str], Function] | None = None,
               *, outer_scope: tuple[str, ...] = (), optimize: bool = True,
               constants: dict[str, Any] | None = None, options: dict[str, Any] | None = None) -> Plan:
    """constants: values already folded by an earlier plan of the same graph, by name (reused, not
    recomputed: specialize.py re-plans a graph whose weights were folded once).
    options: the model's kernel options (e.g. conv_algorithm), given to factories asking for _options."""
    options = options or {}
    functions = functions or {}
    written = graph      # the graph as written, for kernels about their own graph (Gradient)
    if optimize and graph.nodes:
        from .optimize import optimize_graph, with_fused_domain   # it imports kernels, which import this
        graph = optimize_graph(graph, opsets, functions, outer_scope=outer_scope,
                               static_inputs=getattr(_nesting, "depth", 0) == 0)
        opsets = with_fused_domain(opsets)
    resolved = _expand(graph.nodes, opsets, functions, known=_declared_types(graph), optimize=optimize,
                       options=options)
    available = {v.name for v in graph.inputs} | set(graph.initializers) | set(outer_scope)
    by_id = {id(n): (n, r, o) for n, r, o in resolved}
    order = [by_id[id(n)] for n in topo_sort([n for n, _, _ in resolved], available)]

    slots: dict[str, int] = {}
    template: list[Any] = [None, None]
    names = ["<none>", "<discard>"]

    def slot(name: str) -> int:
        if not name:
            return NONE_SLOT
        if name not in slots:
            slots[name] = len(template)
            template.append(None)
            names.append(name)
        return slots[name]

    inputs = []
    for v in graph.inputs:
        s = slot(v.name)
        inputs.append(InputSpec(v.name, s, v.type, v.name in graph.initializers))
    for name in outer_scope:
        slot(name)
    overridable = {v.name for v in graph.inputs}
    constant: set[int] = set()
    for name, arr in graph.initializers.items():
        s = slot(name)
        template[s] = arr
        if name not in overridable:
            constant.add(s)

    steps: list[tuple] = []
    infos: list[StepInfo] = []
    for node, spec, opset in order:
        ins = tuple(slot(x) for x in (*node.inputs, *node.captures))
        fixed = {i: template[s] for i, s in enumerate(ins[:len(node.inputs)]) if s != NONE_SLOT and s in constant}
        fn = _bind(node, spec, opset, node.opsets or opsets, functions, optimize, written, fixed, options)
        outs = tuple(slot(x) if x else DISCARD_SLOT for x in node.outputs)
        out = outs if spec.multi_output else (outs[0] if outs else DISCARD_SLOT)
        info = StepInfo(node.name, node.op_type, node.domain, spec.since, opset, (*node.inputs, *node.captures),
                        node.outputs, fn)
        if optimize and _foldable(node, ins, constant):
            known = constants and [constants.get(x) if x else None for x in node.outputs]
            if known and all(v is not None for v in known):
                values = tuple(known) if spec.multi_output else known[0]
            else:
                values = _fold(fn, ins, template)
            if values is not None:
                for s, v in zip(outs, values if spec.multi_output else (values,)):
                    if isinstance(v, np.ndarray):
                        v.flags.writeable = False  # shared by all runs
                    template[s] = v
                    constant.add(s)
                continue
        steps.append((fn, ins, out, ()))
        infos.append(info)

    missing = [v.name for v in graph.outputs if v.name not in slots]
    if missing:
        raise GraphError(f"graph outputs never produced: {', '.join(map(repr, missing))}")
    output_slots = [slots[v.name] for v in graph.outputs]
    steps = _with_frees(steps, keep=set(output_slots) | constant)
    if optimize:
        steps = _with_donations(steps, infos)
    plan = Plan(steps, infos, template, inputs, [v.name for v in graph.outputs], output_slots, names,
                [v.type for v in graph.outputs], graph)
    if getattr(_nesting, "depth", 0) == 0:
        from .schedule import find_blocks        # schedule imports this module
        plan.blocks = find_blocks(plan)
    return plan


def _with_donations(steps: list[tuple], infos: list[StepInfo]) -> list[tuple]:
    """Elementwise steps whose input dies there get inplace.py's kernel, which writes into it when
    the run-time checks allow."""
    out = []
    for step, info in zip(steps, infos):
        fn, ins, o, frees = step
        if inplace.supported(info.op_type, info.domain):
            donated = tuple(p for p, s in enumerate(ins) if s in frees and ins.count(s) == 1)
            if donated:
                step = (inplace.wrap(info.op_type, info.version, fn, donated), ins, o, frees)
        out.append(step)
    return out


def _foldable(node: Node, ins: tuple[int, ...], constant: set[int]) -> bool:
    return (node.op_type not in NOT_FOLDABLE and not node.captures
            and all(s == NONE_SLOT or s in constant for s in ins))


def _fold(fn: Callable, ins: tuple[int, ...], template: list) -> Any:
    try:
        return fn(*[template[s] for s in ins])
    except Exception:
        return None  # leave it to run time, where the error is reported with its node


def _with_frees(steps: list[tuple], keep: set[int]) -> list[tuple]:
    """Attach to each step the slots whose last reader (or, if unread, whose producer) it is."""
    last: dict[int, int] = {}
    for i, (_, ins, out, _) in enumerate(steps):
        for s in (out if isinstance(out, tuple) else (out,)):
            last[s] = i
        for s in ins:
            last[s] = i
    frees: list[list[int]] = [[] for _ in steps]
    for s, i in last.items():
        if s > DISCARD_SLOT and s not in keep:
            frees[i].append(s)
    return [(fn, ins, out, tuple(f)) for (fn, ins, out, _), f in zip(steps, frees)]


# -- resolution and function inlining ------------------------------------------------------------

def _expand(nodes: list[Node], opsets: dict[str, int], functions, depth: int = 0,
            known: dict[str, TypeInfo] | None = None, optimize: bool = True, options=None) -> list[tuple]:
    """Resolve each node; replace function calls by their (renamed) bodies. -> [(node, spec, opset)]
    known: declared types of values, to build type-dependent schema function bodies at prepare time."""
    known = known or {}
    out = []
    for node in nodes:
        node_opsets = node.opsets or opsets
        opset = node_opsets.get(node.domain)
        local = functions.get((node.domain, node.op_type))
        if local is not None:
            body, fn_opsets, version = local, {**opsets, **local.opsets}, opset or 1
        else:
            r = resolve(node.domain, node.op_type, opset)
            if r.kernel is not None:
                out.append((node, r.kernel, opset))
                continue
            if r.typed_function:
                types = [known.get(x) if x else None for x in node.inputs]
                if not all(_complete(t) for x, t in zip(node.inputs, types) if x):
                    # types known only at run time: the body is built for each new input signature
                    out.append((node, _typed_function_kernel(node, r.version, opset, node_opsets, functions,
                                                             optimize, options), opset))
                    continue
                body = _typed_body(node, opset, types, r.version)
            elif r.function is None:
                raise UnsupportedOperatorError(r.problem, node=node.name, op_type=node.op_type,
                                               domain=node.domain, opset=opset)
            else:
                body = r.function
            fn_opsets, version = {**opsets, **body.opsets}, r.version
        if depth >= MAX_INLINE_DEPTH:
            raise InvalidNodeError("function calls nest too deeply (recursive function?)", node=node.name,
                                   op_type=node.op_type, domain=node.domain, opset=opset)
        inlined = _inline(node, body, fn_opsets, version)
        out.extend(_expand(inlined, fn_opsets, functions, depth + 1, known, optimize, options))
    return out


# -- type-dependent schema function bodies ---------------------------------------------------------

def _declared_types(graph: Graph) -> dict[str, TypeInfo]:
    """What the graph declares about its values' types: inputs, outputs, value_info, initializers."""
    known = {v.name: v.type for v in (*graph.outputs, *graph.value_info.values(), *graph.inputs) if v.type}
    for name, arr in graph.initializers.items():
        if isinstance(arr, np.ndarray):
            known[name] = TypeInfo("tensor", dtypes.elem_type(arr.dtype), arr.shape)
    return known


def _complete(t: TypeInfo | None) -> bool:
    """Enough of a type for onnx to build a body from: element types known all the way down."""
    if t is None:
        return False
    if t.kind in ("tensor", "sparse_tensor"):
        return bool(t.elem_type)
    return t.kind in ("sequence", "optional") and _complete(t.inner)


def _typed_body(node: Node, opset: int, types: list, version: int) -> Function:
    try:
        return typed_function_body(node, opset, types)
    except Exception as e:  # onnx raises its own errors for types its builder rejects
        raise UnsupportedOperatorError(f"no kernel, and no type-dependent function body: {e}", node=node.name,
                                       op_type=node.op_type, domain=node.domain, version=version,
                                       opset=opset) from e


def _value_type(v) -> TypeInfo | None:
    """The type of a run-time value, as much as a type-dependent body may need (element type, rank)."""
    if isinstance(v, np.ndarray):
        return TypeInfo("tensor", dtypes.elem_type(v.dtype), (None,) * v.ndim)
    if isinstance(v, list):
        inner = _value_type(v[0]) if v else TypeInfo("tensor", dtypes.elem_type(np.float32))
        return TypeInfo("sequence", inner=replace(inner, shape=None))
    return None


def _typed_function_kernel(node: Node, version: int, opset: int, opsets: dict[str, int], functions,
                           optimize: bool, options=None) -> KernelSpec:
    """A kernel for a node whose type-dependent body needs input types known only at run time: the
    body is built and planned once per input signature (element types and ranks), then reused."""
    n_in = len(node.inputs)
    present = [i for i, x in enumerate(node.inputs) if x]
    wanted = [x for x in node.outputs if x]

    def factory(**_attrs):   # the node's attributes are read from the node itself (graphs unplanned)
        plans: dict[tuple, SubPlan] = {}
        custom = active_custom_ops()   # the model's own kernels, for bodies planned at run time

        def build(types: list) -> SubPlan:
            body = _typed_body(node, opset, types, version)
            fn_opsets = {**opsets, **body.opsets}
            g = Graph(f"{node.op_type} body", _inline(node, body, fn_opsets, version),
                      [ValueInfo(node.inputs[i], types[i]) for i in present],
                      [ValueInfo(x, None) for x in wanted], {})
            with using_custom_ops(custom):
                plan = build_plan(g, fn_opsets, functions, outer_scope=node.captures, optimize=optimize,
                                  options=options)
            return SubPlan(plan, g.name, node.captures, node.captures)

        def run(*args):
            own, captured = args[:n_in], args[n_in:]
            types = [_value_type(v) for v in own]
            key = tuple(types)
            sub = plans.get(key)
            if sub is None:
                if any(types[i] is None for i in present):
                    raise InvalidValueError("cannot build the type-dependent function body: an input is "
                                            "neither a tensor nor a sequence")
                sub = plans[key] = build(types)
            results = iter(sub.run([own[i] for i in present], captured))
            return tuple(next(results) if x else None for x in node.outputs)
        return run

    return KernelSpec(factory, node.op_type, normalize_domain(node.domain), version, frozenset(node.attrs),
                      frozenset(), frozenset(), True)


_inline_ids = itertools.count()


def _inline(node: Node, fn: Function, fn_opsets: dict[str, int], version: int) -> list[Node]:
    """The function body's nodes, renamed into the caller's scope: formal inputs/outputs become the
    node's actual names, every other body name gets a unique prefix, attribute references take the
    caller's values. Subgraphs of body nodes keep their inner names; the names they read from the
    function's scope are renamed like the body's (recursively, for subgraphs of subgraphs)."""
    prefix = f"{node.name or node.op_type}/{fn.name}#{next(_inline_ids)}/"
    rename = {formal: "" for formal in fn.inputs}
    rename.update(zip(fn.inputs, node.inputs))
    rename.update((f, a) for f, a in zip(fn.outputs, node.outputs) if a)

    def name(x: str) -> str:
        return "" if not x else rename.get(x, prefix + x)

    def bound(attrs: dict[str, Any], outer: Callable[[str], str]) -> tuple[dict[str, Any], tuple[str, ...]]:
        """Attributes with references resolved and the body's own subgraphs renamed; and the names the
        subgraphs read from the enclosing scope (the node's captures)."""
        out: dict[str, Any] = {}
        captures: dict[str, None] = {}
        for k, v in attrs.items():
            if isinstance(v, AttrRef):  # the caller's value lives in the caller's scope: left as is
                if v.name in node.attrs:
                    out[k] = node.attrs[v.name]
                elif fn.attributes.get(v.name) is not None:
                    out[k] = fn.attributes[v.name]
                # else: the caller left it out, so the body node uses its own default
                v = out.get(k)
            elif isinstance(v, Graph):
                v = out[k] = _renamed_graph(v, outer, bound)
            elif isinstance(v, list) and v and isinstance(v[0], Graph):
                v = out[k] = [_renamed_graph(g, outer, bound) for g in v]
            else:
                out[k] = v
            for g in (v if isinstance(v, list) else [v]):
                if isinstance(g, Graph):
                    captures.update(dict.fromkeys(free_names(g)))
        return out, tuple(captures)

    result = []
    for bn in fn.nodes:
        attrs, captures = bound(bn.attrs, name)
        result.append(replace(bn, name=prefix + (bn.name or bn.op_type), inputs=tuple(map(name, bn.inputs)),
                              outputs=tuple(map(name, bn.outputs)), attrs=attrs, index=node.index,
                              opsets=fn_opsets, captures=captures))
    return result


def _renamed_graph(g: Graph, outer: Callable[[str], str], bound) -> Graph:
    """Subgraph `g` of a function body node with the names it reads from the enclosing scope mapped
    through `outer`; names defined inside `g` stay, unless one equals a name an outer read now maps
    to (the caller's actual argument), which it would shadow: those get a unique suffix."""
    local = {v.name for v in g.inputs} | set(g.initializers) | {o for n in g.nodes for o in n.outputs if o}
    targets = {outer(x) for x in free_names(g)}
    own = {x: f"{x}~{next(_inline_ids)}" for x in local & targets}

    def name(x: str) -> str:
        if not x:
            return x
        return own.get(x, x) if x in local else outer(x)

    nodes = []
    for n in g.nodes:
        attrs, captures = bound(n.attrs, name)
        nodes.append(replace(n, inputs=tuple(map(name, n.inputs)), outputs=tuple(map(name, n.outputs)),
                             attrs=attrs, captures=captures))
    outputs = [replace(v, name=name(v.name)) for v in g.outputs]
    if not own:
        return replace(g, nodes=nodes, outputs=outputs)
    return replace(g, nodes=nodes, outputs=outputs, inputs=[replace(v, name=name(v.name)) for v in g.inputs],
                   initializers={name(k): v for k, v in g.initializers.items()},
                   value_info={name(k): replace(v, name=name(v.name)) for k, v in g.value_info.items()})


_nesting = threading.local()   # how deep in subgraph planning this thread is


def _subplans(node: Node, opsets: dict[str, int], functions, optimize: bool, options=None) -> dict[str, Any]:
    """The node's attributes with each GRAPH (or GRAPHS) value planned into a SubPlan."""
    if not node.captures and not any(isinstance(v, Graph) or (isinstance(v, list) and v and isinstance(v[0], Graph))
                                     for v in node.attrs.values()):
        return node.attrs

    def sub(key: str, g: Graph) -> SubPlan:
        outer = free_names(g)
        depth = getattr(_nesting, "depth", 0)
        if depth >= MAX_INLINE_DEPTH:  # a function whose body's subgraph calls it again never ends
            err = InvalidNodeError(f"subgraphs nest more than {MAX_INLINE_DEPTH} deep (a recursive function "
                                   "called from a subgraph?)", node=node.name, op_type=node.op_type,
                                   domain=node.domain)
            err.too_deep = True   # passed up unwrapped by the enclosing levels
            raise err
        _nesting.depth = depth + 1
        try:
            plan = build_plan(g, opsets, functions, outer_scope=outer, optimize=optimize, options=options)
        except NodeError as e:  # say which subgraph of which node
            if getattr(e, "too_deep", False):
                raise
            raise type(e)(f"in subgraph {key!r} of node {node.name or node.op_type!r}: {e.reason}", node=e.node,
                          op_type=e.op_type, domain=e.domain, version=e.version, opset=e.opset) from e
        except GraphError as e:
            raise GraphError(f"subgraph {key!r} of node {node.name or node.op_type!r} ({node.op_type}): {e}") from e
        finally:
            _nesting.depth = depth
        return SubPlan(plan, g.name or key, outer, node.captures)

    attrs = dict(node.attrs)
    for k, v in node.attrs.items():
        if isinstance(v, Graph):
            attrs[k] = sub(k, v)
        elif isinstance(v, list) and v and isinstance(v[0], Graph):
            attrs[k] = [sub(f"{k}[{i}]", g) for i, g in enumerate(v)]
    return attrs


def _bind(node: Node, spec: KernelSpec, opset: int | None, opsets: dict[str, int] | None = None,
          functions=None, optimize: bool = True, graph: Graph | None = None,
          constants: dict[int, Any] | None = None, options: dict[str, Any] | None = None) -> Callable:
    """Check the node's attributes against the kernel, plan its subgraphs, and call its factory once."""
    def fail(msg: str) -> InvalidNodeError:
        return InvalidNodeError(msg, node=node.name, op_type=node.op_type, domain=node.domain,
                                version=spec.since, opset=opset)

    unknown = sorted(set(node.attrs) - spec.attributes)
    if unknown:
        raise fail(f"attribute(s) {', '.join(map(repr, unknown))} not defined for this operator version "
                   f"(known: {', '.join(sorted(spec.attributes)) or 'none'})")
    missing = sorted(spec.required - set(node.attrs))
    if missing:
        raise fail(f"required attribute(s) {', '.join(map(repr, missing))} missing")
    problem = arity_problem(node, spec) or attribute_problem(node, spec)
    if problem:
        raise fail(problem)
    kwargs = dict(_subplans(node, opsets or {}, functions or {}, optimize, options))
    if "_n_inputs" in spec.injected:
        kwargs["_n_inputs"] = len(node.inputs)
    if "_n_outputs" in spec.injected:
        kwargs["_n_outputs"] = len(node.outputs)
    if "_graph" in spec.injected:      # Gradient: the graph holding the node, to differentiate
        kwargs["_graph"] = graph
    if "_opsets" in spec.injected:
        kwargs["_opsets"] = opsets or {}
    if "_version" in spec.injected:
        kwargs["_version"] = spec.since
    if "_constants" in spec.injected:
        kwargs["_constants"] = dict(constants or {})
    if "_options" in spec.injected:
        kwargs["_options"] = dict(options or {})
    try:
        return spec.factory(**kwargs)
    except NodeError:
        raise
    except Exception as e:
        raise fail(str(e) or type(e).__name__) from e
