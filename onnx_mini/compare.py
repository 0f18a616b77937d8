"""Do onnx_mini and another runtime agree on a model? Compare the outputs, then every intermediate value.

    result = onnx_mini.compare("model.onnx", {"x": x}, against="onnxruntime")
    print(result)              # first line: whether the outputs agree; then the first diverging node
    if not result.outputs_agree:
        d = result.divergence  # where it starts: node, op, inputs' shapes, max abs/rel error
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import ml_dtypes
import numpy as np
import onnx

from . import loader, run_scope
from .engine import PreparedModel
from .dtypes import elem_type
from .errors import OnnxMiniError, describe_node
from .executor import execute
from .inputs import bind_inputs
from .plan import StepInfo, describe_value

AGAINST = ("onnxruntime", "reference")


# Default tolerances by element type. A value agrees when |ours - theirs| <= atol + rtol * |theirs|,
# and atol is a fraction of the largest finite |theirs| of the same tensor, not a constant: a sum of K
# terms of magnitude s computed in another order (a convolution, a matmul, a reduction) errs by about
# sqrt(K) * eps * s whatever the sum is, so an output that nearly cancels to 0 next to outputs of ~10
# is off by 1e-5 in float32 (4 of 259,584 values of a real convolution) while no relative tolerance on
# that value can tell. The largest |value| stands in for s * sqrt(K): on the nine light CNNs of the
# onnx package, the float noise beyond rtol stays below 1e-6 of it. An error hitting the large values
# still counts. float32's rtol (~800 ulps) absorbs different libm functions and fused steps; float64 is
# 1000x tighter; float16/bfloat16 (onnx_mini computes in float32 and rounds once; onnxruntime's float16
# MatMul and Conv stay within an ulp of that) get 8 ulps, and 1 ulp of the largest value; 8-bit and
# smaller floats 1 ulp. Integers, booleans and strings must be equal.
def default_tolerance(dtype) -> tuple[float, float] | None:
    """(rtol, atol as a fraction of the tensor's largest |value|) for a float or complex dtype;
    None for the types compared exactly."""
    dtype = np.dtype(dtype)
    if dtype.kind == "c":
        dtype = np.dtype(f"f{dtype.itemsize // 2}")
    try:
        info = ml_dtypes.finfo(dtype)        # numpy's floats and ml_dtypes' alike; integers raise
    except ValueError:
        return None
    eps = float(info.eps)
    if info.bits >= 64:
        return 1e-7, 1e-8
    if info.bits == 32:
        return 1e-4, 1e-5
    if info.bits == 16:
        return 8 * eps, eps
    return eps, eps


@dataclass(frozen=True)
class Divergence:
    """A value beyond the tolerance and the node (a step of onnx_mini's execution order) computing it."""
    index: int                          # position of the node in execution order (0-based; -1: no node)
    node: str                           # node name ('' when unnamed)
    op_type: str
    domain: str
    version: int                        # the operator's schema version (since_version)
    output: str                         # the first diverging output of that node
    inputs: tuple[tuple[str, str], ...]  # (input name, 'float32[1, 3, 224, 224]') in node order
    ours: str                           # onnx_mini's value, described ('float32[1, 1000]')
    theirs: str                         # the other runtime's value, described
    max_abs_error: float                # inf when shapes, dtypes or kinds differ
    max_rel_error: float                # |ours - theirs| / |theirs| (inf where theirs is 0 and ours not)
    reason: str                         # 'values differ', 'shape differs', ...
    against: str = "other"              # the other runtime's name
    scope: tuple[str, ...] = ()         # the node's path through the graph (StepInfo.scope), for a body's node
    # For an If/Loop/Scan node: what comparing its body call by call found (see _descend):
    inside: Divergence | None = None    # the first divergence inside the body's first diverging call
    call: int = -1                      # that call (0-based) and how many calls the body made
    calls: int = 0
    body_note: str = ""                 # why the body was not searched, or that every call agreed

    @property
    def path(self) -> str:
        """Where the difference starts: 'Loop_0/body/Add_1' when it is inside a body."""
        if self.inside is not None:
            return self.inside.path
        return "/".join(self.scope) if self.scope else self.node

    def __str__(self) -> str:
        ins = ", ".join(f"{n or '<omitted>'}: {d}" for n, d in self.inputs) or "none"
        node = describe_node("/".join(self.scope) if self.scope else self.node, self.op_type, self.domain,
                             self.version)
        where = (f"step {self.index}: {node}, output {self.output!r}" if self.index >= 0 else
                 f"graph output {self.output!r} (a graph input or a constant, computed by no node)")
        text = (f"{where}: {self.summary()}\n  inputs: {ins}\n"
                f"  onnx_mini: {self.ours}\n  {self.against}: {self.theirs}")
        if self.inside is not None:
            inner = str(self.inside).replace("\n", "\n  ")
            text += f"\n  inside it, call {self.call + 1} of {self.calls} of its body: {inner}"
        elif self.body_note:
            text += f"\n  {self.body_note}"
        return text

    def summary(self) -> str:
        return (f"{self.reason}; max abs error {self.max_abs_error:.3g}, "
                f"max rel error {self.max_rel_error:.3g}")


@dataclass(frozen=True)
class CompareResult:
    """What compare() found. `str(result)` is the human report (the CLI prints it): its first line
    says whether the graph outputs agree; then where the values start to differ, if they do."""
    against: str                        # 'onnxruntime' or 'reference'
    rtol: float | None                  # None: each element type's default (default_tolerance)
    atol: float | None                  # None: each type's default fraction of the tensor's largest |value|
    compared: int                       # number of node outputs compared (both runtimes gave them)
    steps: int                          # number of nodes onnx_mini ran
    divergence: Divergence | None       # the first value beyond tolerance in execution order, or None
    not_compared: tuple[str, ...] = field(default=())  # node outputs the other runtime did not return
    outputs: tuple[str, ...] = field(default=())       # the graph outputs compared
    output_divergences: tuple[Divergence, ...] = field(default=())  # the graph outputs beyond tolerance
    diverging: int = 0                  # how many compared node outputs are beyond tolerance
    float_types: tuple[str, ...] = field(default=())   # element types compared with a tolerance

    @property
    def outputs_agree(self) -> bool:
        """The verdict: every graph output agrees within tolerance (an intermediate value may not)."""
        return not self.output_divergences

    @property
    def ok(self) -> bool:
        """Every compared value agrees, the outputs and every intermediate value."""
        return self.divergence is None and self.outputs_agree

    def tolerance(self) -> str:
        """The tolerances used, as the report states them."""
        parts = []
        for name in self.float_types:
            rtol, frac = default_tolerance(_dtype_named(name))
            rtol = rtol if self.rtol is None else self.rtol
            atol = f"{frac:g}*max|value|" if self.atol is None else f"{self.atol:g}"
            parts.append(f"{name} rtol={rtol:g} atol={atol}")
        if not parts and self.rtol is not None and self.atol is not None:
            parts.append(f"rtol={self.rtol:g} atol={self.atol:g}")
        return "; ".join(parts + ["integers, booleans, strings exact"])

    def __str__(self) -> str:
        n = len(self.outputs)
        bad = self.output_divergences
        head = (f"onnx_mini vs {self.against}: the outputs agree ({n} output(s) within tolerance)" if not bad else
                f"onnx_mini vs {self.against}: the outputs DIFFER ({len(bad)} of {n} output(s) beyond tolerance)")
        lines = [head]
        lines += [f"  output {d.output!r}: {d.summary()}" for d in bad]
        d = self.divergence
        if d is not None and not bad:
            lines.append(f"note: {self.diverging} intermediate value(s) differ beyond tolerance without changing "
                         f"the outputs; the first, at {d}")
        elif d is not None:
            lines.append(f"first divergence at {d}")
        tail = (f"{self.compared} value(s) of {self.steps} node(s) compared"
                + (f", {len(self.not_compared)} not available from {self.against}" if self.not_compared else "")
                + (f"; {self.diverging} beyond tolerance" if self.diverging else "; all agree"))
        lines.append(f"{tail}\ntolerance: {self.tolerance()}")
        return "\n".join(lines)


def compare(model, feeds, against: str = "onnxruntime", rtol: float | None = None,
            atol: float | None = None, *, scope: tuple[str, ...] = ()) -> CompareResult:
    """Run `model` with onnx_mini and with `against`; compare the graph outputs (the verdict:
    `.outputs_agree`), then every intermediate value, and find the first node (in onnx_mini's
    execution order) whose outputs differ beyond the tolerance.

    model: a path, bytes, file object or ModelProto (external data is read from the model's folder).
    feeds: dict input name -> value (numpy arrays, Python scalars or lists), as for InferenceSession.run.
    against: "onnxruntime" (every node output is added as a graph output of a copy of the model, graph
        optimisations disabled) or "reference" (onnx.reference.ReferenceEvaluator with intermediate
        results).
    rtol, atol: a value agrees when |ours - theirs| <= atol + rtol * |theirs| everywhere (NaN matches NaN;
        integers, booleans and strings must be equal; shapes, dtypes and kinds must match). None (the
        default): by element type, atol a fraction of the tensor's largest |value| (default_tolerance);
        a number given applies to every float type, atol then absolute.

    Returns a CompareResult: `.outputs_agree`, `.output_divergences` (one Divergence per graph output
    beyond tolerance), `.divergence` (the first value beyond tolerance: node name, op_type, domain,
    version, output name, the node's inputs' shapes, descriptions of both values, max_abs_error,
    max_rel_error, reason) or None, `.ok` (every value agrees), `.compared`, `.diverging`,
    `.not_compared`; `str(result)` is a readable report. onnx_mini runs with optimize=False so that
    every node runs and can be compared.

    When the first divergence is an If, Loop or Scan node whose inputs agree, its body is compared call
    by call (`Divergence.inside`, `.path`: 'Loop_0/body/Add_1'). `scope` is that body's path (internal).

    Raises OnnxMiniError when the other runtime is not installed or cannot run the model, and the usual
    onnx_mini errors (ModelLoadError, InputError, KernelError) when onnx_mini cannot.
    """
    if against not in AGAINST:
        raise OnnxMiniError(f"compare(against={against!r}): choose one of {', '.join(map(repr, AGAINST))}")
    other = _import_other(against)
    proto, base_dir = loader.read_proto(model)
    model_ = loader.from_proto(proto, base_dir)
    prepared = PreparedModel(model_, optimize=False)
    plan = prepared.plan_for(tuple(prepared.plan.output_names), feeds)
    slots = bind_inputs(plan, feeds)

    steps: list[tuple[StepInfo, tuple[str, ...]]] = []
    ours: dict[str, Any] = {}

    def record(info: StepInfo, inputs: tuple, outputs: tuple) -> None:
        if info.depth:                  # a step of an If/Loop/Scan body: its values are not the model's
            return
        steps.append((info, tuple(describe_value(v) for v in inputs)))
        for name, v in zip(info.outputs, outputs):
            if name:
                ours[name] = _snapshot(v)

    given = {spec.name: slots[spec.slot] for spec in plan.inputs    # checked and converted feeds
             if (spec.name in feeds if isinstance(feeds, dict) else not spec.has_default)}
    with run_scope.running():
        finals = execute(plan, slots, record)
    producers = {o: n for n in model_.graph.nodes for o in n.outputs if o}
    node_outputs = list(producers)
    theirs = other(_with_external_data(proto, base_dir), node_outputs, given)

    float_types: dict[str, None] = {}

    def check(index: int, name: str, mine: Any) -> Divergence | None:
        for v in (mine if isinstance(mine, list) else [mine]):
            if isinstance(v, np.ndarray) and default_tolerance(v.dtype) is not None:
                float_types[v.dtype.name] = None
        diff = _difference(mine, theirs[name], rtol, atol)
        if diff is None:
            return None
        reason, max_abs, max_rel = diff
        if index < 0:
            return Divergence(-1, "", "", "", 0, name, (), describe_value(mine), describe_value(theirs[name]),
                              max_abs, max_rel, reason, against)
        info, ins = steps[index]
        outer = producers.get(name)
        if outer is not None and (outer.op_type, outer.domain) != (info.op_type, info.domain):
            # a step of an inlined function body (or a fused kernel) computed this output
            reason += f" (computed for the model's {describe_node(outer.name, outer.op_type, outer.domain)})"
        return Divergence(index, info.name, info.op_type, info.domain, info.version, name,
                          tuple(zip(info.inputs, ins)), describe_value(mine), describe_value(theirs[name]),
                          max_abs, max_rel, reason, against, scope + info.scope if scope else ())

    compared = diverging = 0
    first: Divergence | None = None
    computed_by: dict[str, int] = {}
    for index, (info, _) in enumerate(steps):
        for name in info.outputs:
            if not name or name not in theirs:
                continue
            computed_by[name] = index
            compared += 1
            d = check(index, name, ours[name])
            if d is not None:
                diverging += 1
                first = first or d
    if first is not None:
        first = _descend(first, steps[first.index][0], proto, plan, feeds, against, rtol, atol, scope)
    outputs = [(name, value) for name, value in zip(plan.output_names, finals) if name in theirs]
    output_divergences = tuple(d for d in (check(computed_by.get(name, -1), name, value) for name, value in outputs)
                               if d is not None)
    return CompareResult(against, rtol, atol, compared, len(steps), first,
                         tuple(o for o in node_outputs if o not in theirs), tuple(name for name, _ in outputs),
                         output_divergences, diverging, tuple(float_types))


# -- into the bodies of If, Loop and Scan ------------------------------------------------------------

#: a body diverging only after this many calls is not searched further (each call is one more model)
MAX_BODY_CALLS = 100


def _descend(first: Divergence, info: StepInfo, proto: onnx.ModelProto, plan, feeds, against: str,
             rtol, atol, scope: tuple[str, ...]) -> Divergence:
    """`first` is the first divergence; when its node has bodies (If, Loop, Scan), find where inside.

    Its inputs agree, so the body went wrong in some call. onnx_mini runs again with a hook keeping,
    for each call of the node's bodies, the values the call reads from outside it; each call's body
    becomes a model of its own, fed those values, and compare() runs on it (descending further)
    until one call differs."""
    node = next((n for n in proto.graph.node if list(n.output) == list(info.outputs)), None)
    bodies = {a.name: a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH} if node else {}
    if not bodies:
        return first
    label = info.scope[0] if info.scope else info.name
    calls: list[tuple[str, dict, set, set]] = []       # (attribute, values read from outside, made, steps seen)

    def capture(i: StepInfo, inputs: tuple, outputs: tuple) -> None:
        if len(i.scope) != 3 or i.scope[0] != label:    # only the steps of this node's bodies
            return
        if not calls or calls[-1][0] != i.scope[1] or i.scope in calls[-1][3]:
            calls.append((i.scope[1], {}, set(), set()))      # a step seen again: the next call
        _, read, made, seen = calls[-1]
        seen.add(i.scope)
        for n, v in zip(i.inputs, inputs):
            if n and n not in made and n not in read:
                read[n] = _snapshot(v)
        made.update(o for o in i.outputs if o)

    with run_scope.running():
        execute(plan, bind_inputs(plan, feeds), capture)
    for k, (attr, read, _, _) in enumerate(calls[:MAX_BODY_CALLS]):
        try:
            body, body_feeds = _body_model(proto, bodies[attr], read)
            inner = compare(body, body_feeds, against, rtol, atol, scope=scope + (label, attr))
        except (OnnxMiniError, ValueError, KeyError) as e:
            return replace(first, body_note=f"its body's call {k + 1} could not be compared on its own: {e}")
        found = inner.divergence or (inner.output_divergences[0] if inner.output_divergences else None)
        if found is not None:
            return replace(first, inside=found, call=k, calls=len(calls))
    searched = min(len(calls), MAX_BODY_CALLS)
    return replace(first, body_note=(
        f"its body agrees on the {searched} call(s) compared (of {len(calls)}): the difference is in what "
        f"the {info.op_type} itself does with them" if calls else "its body ran no step"))


def _body_model(proto: onnx.ModelProto, body: onnx.GraphProto, read: dict) -> tuple[onnx.ModelProto, dict]:
    """The body as a model of its own and its feeds: its inputs are the values one call read from
    outside (formal inputs, outer-scope values; not its own initializers), its outputs the body
    outputs some node computes."""
    graph = onnx.GraphProto()
    graph.CopyFrom(body)
    initialized = {t.name for t in body.initializer}
    made = {o for n in body.node for o in n.output if o}
    feeds = {name: value for name, value in read.items() if name not in initialized}
    del graph.input[:]
    graph.input.extend(_value_info(name, value) for name, value in feeds.items())
    kept = [o for o in body.output if o.name in made]
    del graph.output[:]
    graph.output.extend(kept)
    m = onnx.helper.make_model(graph, opset_imports=proto.opset_import, ir_version=proto.ir_version)
    m.functions.extend(proto.functions)
    return m, feeds


def _value_info(name: str, value: Any) -> onnx.ValueInfoProto:
    """The declared type of a fed value: a tensor, or a sequence of tensors (its first element's type)."""
    if isinstance(value, np.ndarray):
        return onnx.helper.make_tensor_value_info(name, elem_type(value.dtype), value.shape)
    if isinstance(value, list) and value and isinstance(value[0], np.ndarray):
        return onnx.helper.make_tensor_sequence_value_info(name, elem_type(value[0].dtype), None)
    raise ValueError(f"cannot declare body value {name!r} ({describe_value(value)}) as a model input")


# -- the other runtimes -----------------------------------------------------------------------------

def _import_other(against: str):
    try:
        if against == "onnxruntime":
            import onnxruntime  # noqa: F401
            return _run_onnxruntime
        import onnx.reference  # noqa: F401
        return _run_reference
    except ImportError as e:
        what = "onnxruntime (pip install onnxruntime)" if against == "onnxruntime" else "onnx.reference (part of onnx)"
        raise OnnxMiniError(f"compare(against={against!r}) needs {what}, which cannot be imported here: {e}; "
                            f"try against={'reference' if against == 'onnxruntime' else 'onnxruntime'!r}") from None


def _with_external_data(proto: onnx.ModelProto, base_dir: str | None) -> onnx.ModelProto:
    """A copy of the model (never the caller's) with any external data read in. The loader has already
    read every external file through its folder rule, so the locations are known to be safe."""
    from onnx.external_data_helper import load_external_data_for_model
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    if base_dir is not None:
        load_external_data_for_model(copy, base_dir)
    return copy


def _run_onnxruntime(proto: onnx.ModelProto, node_outputs: list[str], feeds: dict) -> dict[str, Any]:
    import onnxruntime as ort
    declared = {o.name for o in proto.graph.output}
    for name in dict.fromkeys(node_outputs):
        if name not in declared:
            proto.graph.output.append(onnx.ValueInfoProto(name=name))
    names = [o.name for o in proto.graph.output]
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    try:
        sess = ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        values = sess.run(names, feeds)
    except Exception as e:  # onnxruntime's own exception types
        raise OnnxMiniError(f"onnxruntime cannot run the model: {e}") from e
    return dict(zip(names, values))


def _run_reference(proto: onnx.ModelProto, node_outputs: list[str], feeds: dict) -> dict[str, Any]:
    from onnx.reference import ReferenceEvaluator
    try:
        ref = ReferenceEvaluator(proto)
        values = ref.run(None, feeds, intermediate=True)
    except Exception as e:
        raise OnnxMiniError(f"onnx.reference cannot run the model: {type(e).__name__}: {e}") from e
    return dict(values)


# -- comparing values -------------------------------------------------------------------------------

def _snapshot(v: Any) -> Any:
    """A private copy of a value (an intermediate buffer may be reused after its last consumer)."""
    if isinstance(v, np.ndarray):
        return v.copy()
    if isinstance(v, list):
        return [_snapshot(x) for x in v]
    if isinstance(v, dict):
        return {k: _snapshot(x) for k, x in v.items()}
    return v


def _difference(a: Any, b: Any, rtol: float | None = None, atol: float | None = None
                ) -> tuple[str, float, float] | None:
    """None when a (ours) and b (theirs) agree, else (reason, max abs error, max rel error).
    rtol/atol None: the element type's default (default_tolerance)."""
    inf = float("inf")
    if a is None or b is None:
        return None if a is None and b is None else (f"one value is None (onnx_mini: {describe_value(a)}, "
                                                     f"other: {describe_value(b)})", inf, inf)
    if isinstance(a, list) or isinstance(b, list):
        if not (isinstance(a, list) and isinstance(b, list)):
            return "kinds differ (sequence vs other)", inf, inf
        if len(a) != len(b):
            return f"sequence lengths differ ({len(a)} vs {len(b)})", inf, inf
        for i, (x, y) in enumerate(zip(a, b)):
            d = _difference(x, y, rtol, atol)
            if d is not None:
                return (f"sequence item {i}: {d[0]}", d[1], d[2])
        return None
    if isinstance(a, dict) or isinstance(b, dict):
        if not (isinstance(a, dict) and isinstance(b, dict)):
            return "kinds differ (map vs other)", inf, inf
        if set(a) != set(b):
            return "map keys differ", inf, inf
        for k in a:
            d = _difference(np.asarray(a[k]), np.asarray(b[k]), rtol, atol)
            if d is not None:
                return (f"map value of key {k!r}: {d[0]}", d[1], d[2])
        return None
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return f"shapes differ ({list(a.shape)} vs {list(b.shape)})", inf, inf
    if a.dtype != b.dtype:
        return f"element types differ ({a.dtype} vs {b.dtype})", inf, inf
    if a.size == 0:
        return None
    tolerance = default_tolerance(a.dtype) if a.dtype != object else None
    if tolerance is None:                                    # exact: strings, booleans, integers
        bad = a != b
        if not bad.any():
            return None
        i = np.unravel_index(int(np.argmax(bad)), a.shape)
        shown = f"{a[i]!r} vs {b[i]!r}" if a.dtype == object else f"{a[i]!s} vs {b[i]!s}"
        first = f"{int(bad.sum())} of {a.size} value(s) differ, first at {list(map(int, i))}: {shown}"
        if a.dtype == object or a.dtype.kind in "US":
            return first, inf, inf
        x, y = a.astype(np.float64), b.astype(np.float64)
        err = np.abs(x - y)
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = np.where(err == 0, 0.0, err / np.abs(y))
        return first, float(err.max()), float(np.where(np.isnan(rel), inf, rel).max())
    x, y = _as_number(a), _as_number(b)
    with np.errstate(invalid="ignore", over="ignore"):     # inf - inf: equal infinities, handled below
        err = np.abs(x - y)
    same = (x == y) | (np.isnan(x) & np.isnan(y))    # equal infinities and NaN against NaN agree
    err = np.where(same, 0.0, err)
    err = np.where(np.isnan(err), inf, err)
    scale = np.abs(y)
    finite = np.where(np.isinf(scale) | np.isnan(scale), 0.0, scale)
    rtol = tolerance[0] if rtol is None else rtol
    atol = tolerance[1] * float(finite.max()) if atol is None else atol
    bad = err > atol + rtol * finite
    if not bad.any():
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(err == 0, 0.0, err / scale)
    rel = np.where(np.isnan(rel), inf, rel)
    i = np.unravel_index(int(np.argmax(np.where(bad, err, -1.0))), a.shape)
    return (f"{int(bad.sum())} of {a.size} value(s) beyond tolerance, largest at {list(map(int, i))}: "
            f"{a[i]!s} vs {b[i]!s}", float(err.max()), float(rel.max()))


def _as_number(a: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "c":
        return a.astype(np.complex128)
    if a.dtype.kind in "biu":
        return a.astype(np.float64)
    return a.astype(np.float32).astype(np.float64) if a.dtype.itemsize < 4 else a.astype(np.float64)


def _dtype_named(name: str) -> np.dtype:
    return np.dtype(getattr(ml_dtypes, name, name))
