"""Turn a Graph into a Plan: everything per-model happens here, once, so that run() only walks steps.

- function bodies (model-local functions, schema function bodies) are inlined;
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
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np

from .errors import (GraphError, InvalidNodeError, InvalidValueError, KernelError, NodeError, OnnxMiniError,
                     UnsupportedOperatorError)
from .graph import AttrRef, Function, Graph, Node, TypeInfo, free_names, topo_sort
from .registry import KernelSpec, resolve

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
               *, outer_scope: tuple[str, ...] = (), optimize: bool = True) -> Plan:
    functions = functions or {}
    resolved = _expand(graph.nodes, opsets, functions)
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
        fn = _bind(node, spec, opset, node.opsets or opsets, functions, optimize)
        ins = tuple(slot(x) for x in (*node.inputs, *node.captures))
        outs = tuple(slot(x) if x else DISCARD_SLOT for x in node.outputs)
        out = outs if spec.multi_output else (outs[0] if outs else DISCARD_SLOT)
        info = StepInfo(node.name, node.op_type, node.domain, spec.since, opset, (*node.inputs, *node.captures),
                        node.outputs)
        if optimize and _foldable(node, ins, constant):
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
    return Plan(steps, infos, template, inputs, [v.name for v in graph.outputs], output_slots, names)


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

def _expand(nodes: list[Node], opsets: dict[str, int], functions, depth: int = 0) -> list[tuple]:
    """Resolve each node; replace function calls by their (renamed) bodies. -> [(node, spec, opset)]"""
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
            if r.function is None:
                raise UnsupportedOperatorError(r.problem, node=node.name, op_type=node.op_type,
                                               domain=node.domain, opset=opset)
            body, fn_opsets, version = r.function, {**opsets, **r.function.opsets}, r.version
        if depth >= MAX_INLINE_DEPTH:
            raise InvalidNodeError("function calls nest too deeply (recursive function?)", node=node.name,
                                   op_type=node.op_type, domain=node.domain, opset=opset)
        inlined = _inline(node, body, fn_opsets, version)
        out.extend(_expand(inlined, fn_opsets, functions, depth + 1))
    return out


_inline_ids = itertools.count()


def _inline(node: Node, fn: Function, fn_opsets: dict[str, int], version: int) -> list[Node]:
    prefix = f"{node.name or node.op_type}/{fn.name}#{next(_inline_ids)}/"
    rename = {formal: "" for formal in fn.inputs}
    rename.update(zip(fn.inputs, node.inputs))
    rename.update((f, a) for f, a in zip(fn.outputs, node.outputs) if a)

    def name(x: str) -> str:
        return "" if not x else rename.get(x, prefix + x)

    result = []
    for bn in fn.nodes:
        if bn.captures:
            raise UnsupportedOperatorError(
                "inlining a function body whose nodes hold subgraphs is not supported yet",
                node=node.name, op_type=node.op_type, domain=node.domain, version=version)
        attrs = {}
        for k, v in bn.attrs.items():
            if isinstance(v, AttrRef):
                if v.name in node.attrs:
                    attrs[k] = node.attrs[v.name]
                elif fn.attributes.get(v.name) is not None:
                    attrs[k] = fn.attributes[v.name]
                # else: the caller left it out, so the body node uses its own default
            else:
                attrs[k] = v
        result.append(replace(bn, name=prefix + (bn.name or bn.op_type), inputs=tuple(map(name, bn.inputs)),
                              outputs=tuple(map(name, bn.outputs)), attrs=attrs, index=node.index,
                              opsets=fn_opsets))
    return result


def _subplans(node: Node, opsets: dict[str, int], functions, optimize: bool) -> dict[str, Any]:
    """The node's attributes with each GRAPH (or GRAPHS) value planned into a SubPlan."""
    if not node.captures and not any(isinstance(v, Graph) or (isinstance(v, list) and v and isinstance(v[0], Graph))
                                     for v in node.attrs.values()):
        return node.attrs

    def sub(key: str, g: Graph) -> SubPlan:
        outer = free_names(g)
        try:
            plan = build_plan(g, opsets, functions, outer_scope=outer, optimize=optimize)
        except NodeError as e:  # say which subgraph of which node
            raise type(e)(f"in subgraph {key!r} of node {node.name or node.op_type!r}: {e.reason}", node=e.node,
                          op_type=e.op_type, domain=e.domain, version=e.version, opset=e.opset) from e
        except GraphError as e:
            raise GraphError(f"subgraph {key!r} of node {node.name or node.op_type!r} ({node.op_type}): {e}") from e
        return SubPlan(plan, g.name or key, outer, node.captures)

    attrs = dict(node.attrs)
    for k, v in node.attrs.items():
        if isinstance(v, Graph):
            attrs[k] = sub(k, v)
        elif isinstance(v, list) and v and isinstance(v[0], Graph):
            attrs[k] = [sub(f"{k}[{i}]", g) for i, g in enumerate(v)]
    return attrs


def _bind(node: Node, spec: KernelSpec, opset: int | None, opsets: dict[str, int] | None = None,
          functions=None, optimize: bool = True) -> Callable:
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
    kwargs = dict(_subplans(node, opsets or {}, functions or {}, optimize))
    if "_n_inputs" in spec.injected:
        kwargs["_n_inputs"] = len(node.inputs)
    if "_n_outputs" in spec.injected:
        kwargs["_n_outputs"] = len(node.outputs)
    try:
        return spec.factory(**kwargs)
    except NodeError:
        raise
    except Exception as e:
        raise fail(str(e) or type(e).__name__) from e
