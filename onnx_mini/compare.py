"""Find where onnx_mini and another runtime part ways: compare every intermediate value of a model.

    result = onnx_mini.compare("model.onnx", {"x": x}, against="onnxruntime")
    print(result)              # "all 42 compared values agree ..." or the first diverging node
    if not result.ok:
        d = result.divergence  # node, op, inputs' shapes, max abs/rel error
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from . import loader, run_scope
from .engine import PreparedModel
from .errors import OnnxMiniError, describe_node
from .executor import execute
from .inputs import bind_inputs
from .plan import StepInfo, describe_value

AGAINST = ("onnxruntime", "reference")


@dataclass(frozen=True)
class Divergence:
    """The first node (in onnx_mini's execution order) with an output beyond the tolerance."""
    index: int                          # position of the node in execution order (0-based)
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

    def __str__(self) -> str:
        ins = ", ".join(f"{n or '<omitted>'}: {d}" for n, d in self.inputs) or "none"
        where = describe_node(self.node, self.op_type, self.domain, self.version)
        return (f"first divergence at step {self.index}: {where}, output {self.output!r}: {self.reason}; "
                f"max abs error {self.max_abs_error:.3g}, max rel error {self.max_rel_error:.3g}\n  inputs: {ins}\n"
                f"  onnx_mini: {self.ours}\n  {self.against}: {self.theirs}")


@dataclass(frozen=True)
class CompareResult:
    """What compare() found. `str(result)` is the human report (the CLI prints it)."""
    against: str                        # 'onnxruntime' or 'reference'
    rtol: float
    atol: float
    compared: int                       # number of values compared (node outputs both runtimes gave)
    steps: int                          # number of nodes onnx_mini ran
    divergence: Divergence | None       # None when every compared value agrees
    not_compared: tuple[str, ...] = field(default=())  # node outputs the other runtime did not return

    @property
    def ok(self) -> bool:
        return self.divergence is None

    def __str__(self) -> str:
        head = (f"onnx_mini vs {self.against} (rtol={self.rtol:g}, atol={self.atol:g}): "
                f"{self.compared} value(s) of {self.steps} node(s) compared")
        if self.not_compared:
            head += f", {len(self.not_compared)} not available from {self.against}"
        if self.divergence is None:
            return head + "; all agree"
        return f"{head}\n{self.divergence}"


def compare(model, feeds, against: str = "onnxruntime", rtol: float = 1e-4, atol: float = 1e-5) -> CompareResult:
    """Run `model` with onnx_mini and with `against`, compare every intermediate value, and return the
    first node (in onnx_mini's execution order) whose outputs differ beyond the tolerance.

    model: a path, bytes, file object or ModelProto (external data is read from the model's folder).
    feeds: dict input name -> value (numpy arrays, Python scalars or lists), as for InferenceSession.run.
    against: "onnxruntime" (every node output is added as a graph output of a copy of the model, graph
        optimisations disabled) or "reference" (onnx.reference.ReferenceEvaluator with intermediate
        results).
    rtol, atol: a value agrees when |ours - theirs| <= atol + rtol * |theirs| everywhere (NaN matches NaN;
        integers, booleans and strings must be equal; shapes, dtypes and kinds must match).

    Returns a CompareResult: `.ok`, `.divergence` (a Divergence: node name, op_type, domain, version,
    output name, the node's inputs' shapes, descriptions of both values, max_abs_error, max_rel_error,
    reason) or None, `.compared` (number of values compared), `.not_compared`; `str(result)` is a
    readable report. onnx_mini runs with optimize=False so that every node runs and can be compared.

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
        steps.append((info, tuple(describe_value(v) for v in inputs)))
        for name, v in zip(info.outputs, outputs):
            if name:
                ours[name] = _snapshot(v)

    given = {spec.name: slots[spec.slot] for spec in plan.inputs    # checked and converted feeds
             if (spec.name in feeds if isinstance(feeds, dict) else not spec.has_default)}
    with run_scope.running():
        execute(plan, slots, record)
    producers = {o: n for n in model_.graph.nodes for o in n.outputs if o}
    node_outputs = list(producers)
    theirs = other(_with_external_data(proto, base_dir), node_outputs, given)

    compared = 0
    for index, (info, ins) in enumerate(steps):
        for name in info.outputs:
            if not name or name not in theirs:
                continue
            compared += 1
            diff = _difference(ours[name], theirs[name], rtol, atol)
            if diff is not None:
                reason, max_abs, max_rel = diff
                outer = producers.get(name)
                if outer is not None and (outer.op_type, outer.domain) != (info.op_type, info.domain):
                    # a step of an inlined function body (or a fused kernel) computed this output
                    reason += f" (computed for the model's {describe_node(outer.name, outer.op_type, outer.domain)})"
                d = Divergence(index, info.name, info.op_type, info.domain, info.version, name,
                               tuple(zip(info.inputs, ins)), describe_value(ours[name]),
                               describe_value(theirs[name]), max_abs, max_rel, reason, against)
                return CompareResult(against, rtol, atol, compared, len(steps), d,
                                     tuple(o for o in node_outputs if o not in theirs))
    return CompareResult(against, rtol, atol, compared, len(steps), None,
                         tuple(o for o in node_outputs if o not in theirs))


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


def _difference(a: Any, b: Any, rtol: float, atol: float) -> tuple[str, float, float] | None:
    """None when a (ours) and b (theirs) agree, else (reason, max abs error, max rel error)."""
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
    if a.dtype == object or a.dtype.kind in "USVbiu":             # exact: strings, booleans, integers
        bad = a != b
        if not bad.any():
            return None
        i = np.unravel_index(int(np.argmax(bad)), a.shape)
        shown = f"{a[i]!r} vs {b[i]!r}" if a.dtype == object else f"{a[i]!s} vs {b[i]!s}"
        first = f"{int(bad.sum())} of {a.size} value(s) differ, first at {list(map(int, i))}: {shown}"
        if a.dtype == object or a.dtype.kind in "USV":
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
    bad = err > atol + rtol * np.where(np.isinf(scale), 0.0, scale)
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
