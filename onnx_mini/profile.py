"""Profiling: where a model spends its time and memory, node by node and by operator type.

    prof = onnx_mini.profile("model.onnx", {"x": x}, runs=10)
    print(prof.table())
    prof.to_json("p.json"); prof.to_chrome_trace("p.trace.json"); prof.to_html("p.html")

It runs the model through the executor's per-node hook (the plain loop pays nothing when no profile
is taken) and records, for every step of the plan, the time its kernel took and the bytes of the
values alive once it has run: graph inputs and intermediate results, each buffer counted once (a
view shares its base's bytes; constants and initializers are reported apart, as they live for the
whole session).

The nodes of bodies (If branches, Loop and Scan bodies, ...) have rows of their own, named by their
path (`Loop_0/body/Add_1`: parent, the attribute holding the body, node; an unnamed node is
`<OpType>_<step index>`), with their calls per run (a Loop body's node runs once per iteration).
A control-flow node's row keeps its inclusive time (its body's included), so nothing is counted
twice: run totals add the model graph's nodes only, a row's % is its share of the run (a body row's
share is part of its parent's), `self_s` is a node's time without its body's nodes, and the op-type
summary adds self times. Live bytes are tracked for the model graph's values (a body's
temporaries are not). A fused node names the written nodes it replaced (`fused_from`).
"""
from __future__ import annotations

import html
import json
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from . import run_scope
from .engine import PreparedModel, StepClock, prepare
from .executor import execute
from .inputs import bind_inputs
from .plan import Plan, StepInfo, describe_value, scope_depth, scope_path


class _Mean:
    calls: int
    total_s: float

    @property
    def mean_s(self) -> float:
        return self.total_s / self.calls if self.calls else 0.0


@dataclass
class NodeStats(_Mean):
    """One node (a step of the plan, or of a body's plan) over every profiled run."""
    index: int                          # its step's position in its plan (the model's, or its body's)
    name: str
    op_type: str
    domain: str
    version: int
    calls: int = 0
    total_s: float = 0.0                # inclusive: a control-flow node's body counts
    max_s: float = 0.0
    live_bytes: int | None = 0          # alive right after the node ran (its inputs not yet freed), last
                                        # run; None for a body's node (bodies' values are not tracked)
    inputs: list[str] = field(default_factory=list)    # 'float32[1, 3, 224, 224]', first run
    outputs: list[str] = field(default_factory=list)
    algorithm: str = ""                 # how the kernel computed (Conv: select.ALGORITHMS), "" if it does not say
    scope: tuple[str, ...] = ()         # StepInfo.scope: ('Loop_0', 'body', 'Add_1')
    fused_from: tuple[str, ...] = ()    # the written nodes the optimiser merged into this one
    self_s: float = 0.0                 # total_s without the time of its bodies' nodes
    runs: int = 1                       # profiled runs, for the per-run figures

    @property
    def op(self) -> str:
        return f"{self.domain}::{self.op_type}" if self.domain else self.op_type

    @property
    def op_label(self) -> str:
        """'Conv-11', or 'Conv-11 [winograd]' when the kernel says which algorithm ran."""
        label = f"{self.op}-{self.version}"
        return f"{label} [{self.algorithm}]" if self.algorithm else label

    @property
    def path(self) -> str:
        return scope_path(self.scope, self.name)

    @property
    def depth(self) -> int:
        return scope_depth(self.scope)

    @property
    def parent(self) -> str | None:
        """The path of the control-flow node whose body holds this one (None at the top)."""
        return "/".join(self.scope[:-2]) if len(self.scope) > 2 else None

    @property
    def label(self) -> str:
        """The path, and for a fused node the nodes it replaced: 'conv1/Conv (conv1 + relu1)'."""
        return f"{self.path} ({' + '.join(self.fused_from)})" if self.fused_from else self.path

    @property
    def calls_per_run(self) -> float:
        return self.calls / self.runs

    @property
    def per_run_s(self) -> float:
        return self.total_s / self.runs

    @property
    def self_per_run_s(self) -> float:
        return self.self_s / self.runs


@dataclass
class OpTypeStats(_Mean):
    """Every node of one operator type together; total_s adds their self times (a control-flow
    node's body is counted under its own nodes' types)."""
    op: str
    nodes: int
    calls: int
    total_s: float


@dataclass
class Event:
    """One node's execution in one run: for the Chrome trace."""
    run: int
    index: int                          # in Profile.nodes
    start_s: float                      # from the start of the profile
    dur_s: float                        # wall clock, the profiler's bookkeeping for its body included
    live_bytes: int | None              # None for a body's node
    depth: int = 0


class Profile:
    """The result of `onnx_mini.profile`: per-node and per-op-type times, calls and live bytes.
    `nodes` lists the model graph's nodes in plan order, each followed by its bodies' nodes."""

    def __init__(self, name: str, nodes: list[NodeStats], events: list[Event], run_times: list[float],
                 run_spans: list[tuple[float, float]], constant_bytes: int):
        self.name = name
        self.nodes = nodes
        self.events = events
        self.run_times = run_times          # seconds per run, without the profiler's own bookkeeping
        self.run_spans = run_spans          # (start, duration) of each run on the trace's clock (with it)
        self.constant_bytes = constant_bytes
        for n in nodes:
            n.runs = max(self.runs, 1)

    # -- summaries ---------------------------------------------------------------------------------

    @property
    def runs(self) -> int:
        return len(self.run_times)

    @property
    def peak_live_bytes(self) -> int:
        return max((e.live_bytes for e in self.events if e.live_bytes is not None), default=0)

    @property
    def node_time_s(self) -> float:
        """Time spent inside the model graph's kernels (bodies within their parents), over every run."""
        return sum(n.total_s for n in self.nodes if not n.depth)

    @property
    def body_nodes(self) -> int:
        return sum(1 for n in self.nodes if n.depth)

    def share(self, seconds: float) -> float:
        """`seconds` (over every run) as a fraction of node_time_s."""
        return seconds / (self.node_time_s or 1.0)

    def by_op_type(self) -> list[OpTypeStats]:
        """Operator types, the most expensive first (self times: they add up to node_time_s)."""
        groups: dict[str, OpTypeStats] = {}
        for n in self.nodes:
            g = groups.setdefault(n.op, OpTypeStats(n.op, 0, 0, 0.0))
            g.nodes += 1
            g.calls += n.calls
            g.total_s += n.self_s
        return sorted(groups.values(), key=lambda g: (-g.total_s, g.op))

    def slowest(self, top: int | None = None) -> list[NodeStats]:
        """Nodes by inclusive time, the slowest first (a control-flow node before its body's nodes)."""
        order = {id(n): k for k, n in enumerate(self.nodes)}
        ranked = sorted(self.nodes, key=lambda n: (-n.total_s, order[id(n)]))
        return ranked if top is None else ranked[:top]

    def to_dict(self) -> dict:
        runs = max(self.runs, 1)
        return {
            "model": self.name,
            "runs": self.runs,
            "run_ms": [t * 1e3 for t in self.run_times],
            "median_run_ms": statistics.median(self.run_times) * 1e3 if self.run_times else 0.0,
            "node_ms_per_run": self.node_time_s * 1e3 / runs,
            "peak_live_bytes": self.peak_live_bytes,
            "constant_bytes": self.constant_bytes,
            "op_types": [{"op": g.op, "nodes": g.nodes, "calls": g.calls, "calls_per_run": g.calls / runs,
                          "total_ms": g.total_s * 1e3, "ms_per_run": g.total_s * 1e3 / runs,
                          "mean_ms": g.mean_s * 1e3, "share": self.share(g.total_s)} for g in self.by_op_type()],
            "nodes": [{"index": n.index, "name": n.name, "path": n.path, "depth": n.depth, "parent": n.parent,
                       "op": n.op, "version": n.version, "calls": n.calls, "calls_per_run": n.calls_per_run,
                       "total_ms": n.total_s * 1e3, "mean_ms": n.mean_s * 1e3, "max_ms": n.max_s * 1e3,
                       "ms_per_run": n.per_run_s * 1e3, "self_ms_per_run": n.self_per_run_s * 1e3,
                       "share": self.share(n.total_s), "live_bytes": n.live_bytes,
                       "inputs": n.inputs, "outputs": n.outputs,
                       **({"algorithm": n.algorithm} if n.algorithm else {}),
                       **({"fused_from": list(n.fused_from)} if n.fused_from else {})}
                      for n in self.nodes],
        }

    # -- outputs -----------------------------------------------------------------------------------

    def _summary(self) -> str:
        med = statistics.median(self.run_times) * 1e3 if self.run_times else 0.0
        bodies = f" (+ {self.body_nodes} in subgraphs)" if self.body_nodes else ""
        return (f"{self.runs} run(s), median {med:.2f} ms; {len(self.nodes) - self.body_nodes} nodes{bodies}; "
                f"peak live values {format_bytes(self.peak_live_bytes)} "
                f"(+ {format_bytes(self.constant_bytes)} of constants)")

    def table(self, top: int = 15) -> str:
        """A text report: the run summary, every op type, then the `top` slowest nodes; per run."""
        runs = max(self.runs, 1)
        lines = [f"{self.name}: {self._summary()}", ""]
        rows = [(g.op, str(g.nodes), f"{g.calls / runs:g}", f"{g.total_s * 1e3 / runs:.3f}",
                 f"{g.mean_s * 1e3:.3f}", f"{100 * self.share(g.total_s):.1f}") for g in self.by_op_type()]
        lines += _grid(("op type", "nodes", "calls/run", "ms/run", "ms/call", "%"), rows)
        if self.body_nodes:
            lines.append("(op types add self times: a control-flow node's body counts under its nodes' types)")
        ranked = self.slowest(top)
        if ranked:
            lines += ["", f"slowest {len(ranked)} node(s):"]
            nested = bool(self.body_nodes)
            rows = [(n.label, n.op_label, f"{n.calls_per_run:g}", f"{n.mean_s * 1e3:.3f}",
                     f"{n.per_run_s * 1e3:.3f}", f"{100 * self.share(n.total_s):.1f}",
                     *((f"{100 * self.share(n.self_s):.1f}",) if nested else ()),
                     "-" if n.live_bytes is None else format_bytes(n.live_bytes), ", ".join(n.outputs))
                    for n in ranked]
            lines += _grid(("node", "op", "calls/run", "ms/call", "ms/run", "%", *(("self %",) if nested else ()),
                            "live after", "outputs"), rows)
        return "\n".join(lines)

    def to_json(self, path) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=1)

    def to_chrome_trace(self, path) -> None:
        """Trace Event Format (JSON object form): one complete ('X') event per node and run, a body's
        nodes nested in their parent's span, one per run, and a 'live bytes' counter; opens in
        https://ui.perfetto.dev and chrome://tracing."""
        events: list[dict] = [
            {"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": f"onnx_mini: {self.name}"}},
            {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": "runs"}},
            {"name": "thread_name", "ph": "M", "pid": 1, "tid": 2, "args": {"name": "nodes"}},
        ]
        for r, (start, dur) in enumerate(self.run_spans):
            events.append({"name": f"run {r + 1}", "cat": "run", "ph": "X", "pid": 1, "tid": 1,
                           "ts": start * 1e6, "dur": dur * 1e6})
        # parents first where spans start together, so that viewers nest the body's events inside
        for e in sorted(self.events, key=lambda e: (e.start_s, -e.dur_s, e.depth)):
            n = self.nodes[e.index]
            args = {"op": n.op_label, "path": n.path, "run": e.run + 1, "inputs": n.inputs, "outputs": n.outputs}
            if n.fused_from:
                args["fused_from"] = list(n.fused_from)
            if e.live_bytes is not None:
                args["live_bytes"] = e.live_bytes
            events.append({"name": (n.scope[-1] if n.scope else n.name) or n.op_type, "cat": n.op, "ph": "X",
                           "pid": 1, "tid": 2, "ts": e.start_s * 1e6, "dur": e.dur_s * 1e6, "args": args})
            if e.live_bytes is not None:
                events.append({"name": "live bytes", "ph": "C", "pid": 1, "tid": 2,
                               "ts": (e.start_s + e.dur_s) * 1e6, "args": {"bytes": e.live_bytes}})
        with open(path, "w") as f:
            json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)

    def to_html(self, path) -> None:
        """A self-contained page: summary, a per-op-type bar chart (inline SVG), the op-type table and
        the node table, slowest first (a click on a column header sorts by it); figures per run."""
        with open(path, "w", encoding="utf-8") as f:
            f.write(self._html())

    def _html(self) -> str:
        esc = html.escape
        runs = max(self.runs, 1)
        groups = self.by_op_type()
        bar_h, chart_w = 22, 520
        label_w = 16 + 7 * max((len(g.op) for g in groups), default=10)     # ~7 px per character at 12 px
        top = max((g.total_s for g in groups), default=0.0) or 1.0
        bars = []
        for i, g in enumerate(groups):
            y = i * bar_h
            w = max(1.0, chart_w * g.total_s / top)
            ms = g.total_s * 1e3 / runs
            bars.append(
                f'<text x="{label_w - 6}" y="{y + 15}" text-anchor="end">{esc(g.op)}</text>'
                f'<rect x="{label_w}" y="{y + 3}" width="{w:.1f}" height="{bar_h - 6}" fill="#3b7dd8">'
                f'<title>{esc(g.op)}: {ms:.3f} ms per run in {g.calls / runs:g} call(s) per run</title></rect>'
                f'<text x="{label_w + w + 6:.1f}" y="{y + 15}">{ms:.3f} ms/run '
                f'({100 * self.share(g.total_s):.1f}%)</text>')
        height = max(bar_h, bar_h * len(groups))
        svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{label_w + chart_w + 180}" height="{height}" '
               f'font-family="sans-serif" font-size="12">{"".join(bars)}</svg>')

        def num(value: float, text: str | None = None) -> str:     # a cell the sort reads as a number
            return f'<td class="n" data-v="{value:.9g}">{esc(text if text is not None else f"{value:.3f}")}</td>'

        op_rows = "".join(
            f"<tr><td>{esc(g.op)}</td>{num(g.nodes, str(g.nodes))}{num(g.calls / runs, f'{g.calls / runs:g}')}"
            f"{num(g.total_s * 1e3 / runs)}{num(g.mean_s * 1e3)}"
            f"{num(100 * self.share(g.total_s), f'{100 * self.share(g.total_s):.1f}')}</tr>" for g in groups)
        order = {id(n): k for k, n in enumerate(self.nodes)}
        node_rows = []
        for n in self.slowest():
            pct = 100 * self.share(n.total_s)
            hot = ' class="hot"' if pct >= HOT_PERCENT else ""
            bar = f"background:linear-gradient(90deg,#f3a25f {min(pct, 100):.1f}%,transparent {min(pct, 100):.1f}%)"
            live = "-" if n.live_bytes is None else format_bytes(n.live_bytes)
            node_rows.append(
                f"<tr{hot}>{num(order[id(n)], str(order[id(n)]))}"
                f'<td style="padding-left:{8 + 16 * n.depth}px">{esc(n.label)}</td><td>{esc(n.op_label)}</td>'
                f"{num(n.calls_per_run, f'{n.calls_per_run:g}')}{num(n.mean_s * 1e3)}{num(n.per_run_s * 1e3)}"
                f'<td class="n" data-v="{pct:.9g}" style="{bar}">{pct:.1f}</td>{num(n.self_per_run_s * 1e3)}'
                f"{num(-1 if n.live_bytes is None else n.live_bytes, live)}"
                f"<td>{esc(', '.join(n.inputs))}</td><td>{esc(', '.join(n.outputs))}</td></tr>")
        return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>onnx_mini profile: {esc(self.name)}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; font-size: 13px; }}
th, td {{ border: 1px solid #ccc; padding: 3px 8px; text-align: left; }}
th {{ background: #f0f0f0; cursor: pointer; }}
td.n {{ text-align: right; }}
tr.hot td {{ font-weight: bold; background-color: #fff1e0; }}
</style></head><body>
<h1>onnx_mini profile: {esc(self.name)}</h1>
<p>{esc(self._summary())}.</p>
<p>Every figure is per run (the mean of {self.runs} run(s)); % is the share of the time the model
graph's nodes took per run ({self.node_time_s * 1e3 / runs:.3f} ms). A control-flow node's time
includes its body's nodes, listed under it by path; "self" leaves them out.</p>
<h2>Time by operator type (ms per run, self time)</h2>
{svg}
<table class="sortable"><thead><tr><th>op type</th><th>nodes</th><th>calls/run</th><th>ms/run</th><th>ms/call</th>
<th>%</th></tr></thead><tbody>
{op_rows}</tbody></table>
<h2>Nodes, slowest first</h2>
<p>Rows of {HOT_PERCENT:g}% of the run or more are highlighted; click a column header to sort (# is plan order).</p>
<table class="sortable"><thead><tr><th class="asc">#</th><th>node</th><th>op</th><th>calls/run</th><th>ms/call</th>
<th>ms/run</th><th>%</th><th>self ms/run</th><th>live after</th><th>inputs</th><th>outputs</th></tr></thead><tbody>
{"".join(node_rows)}</tbody></table>
<script>{_SORT_JS}</script>
</body></html>
"""


HOT_PERCENT = 10.0    # the HTML highlights nodes taking at least this share of the run

# Click a header: sort the rows by that column (numbers by data-v, biggest first, unless the header
# is class "asc"; text A-Z); click again: reverse.
_SORT_JS = """
for (const table of document.querySelectorAll("table.sortable")) {
  table.querySelectorAll("th").forEach((th, col) => th.addEventListener("click", () => {
    const body = table.tBodies[0], rows = [...body.rows];
    const key = r => r.cells[col].dataset.v === undefined ? r.cells[col].textContent : +r.cells[col].dataset.v;
    const ascending = th.classList.contains("asc") || typeof key(rows[0]) === "string";
    const dir = th.dataset.dir = th.dataset.dir ? -th.dataset.dir : ascending ? 1 : -1;
    rows.sort((a, b) => ((key(a) > key(b)) - (key(a) < key(b))) * dir);
    rows.forEach(r => body.appendChild(r));
  }));
}
"""


def profile(model, feeds, runs: int = 10, *, warmup: int = 1, optimize: bool = True,
            progress: Callable[[int, int], None] | None = None) -> Profile:
    """Run `model` (a path, bytes, ModelProto, or a prepared model) `runs` times on `feeds` (a dict
    name -> value, or a list in input order) after `warmup` unrecorded runs, and return the Profile.
    progress(done, total) is called after each run, warm-up included. A model whose runs manage
    BLAS starts them once its mode is decided (PreparedModel.settle: the machine's load read, the
    model's mode trials run; at most ~5 s)."""
    if runs < 1:
        raise ValueError("runs must be at least 1")
    prepared = model if isinstance(model, PreparedModel) else _prepare(model, optimize)
    plan = prepared.plan_to_run(prepared.plan_for(tuple(prepared.plan.output_names), feeds), feeds)
    name = prepared.model.graph.name or "model"
    constants = set()
    constant_bytes = sum(_root_bytes(v, constants) for v in plan.template if v is not None)
    recorder = _Recorder(plan, constants)
    total = warmup + runs
    prepared.settle(feeds)      # not a new process's first runs' mode, nor the model's mode trials
    for r in range(total):
        recorder.start(r - warmup if r >= warmup else None)
        with run_scope.running(prepared.threads, plan.uses_blas, prepared.max_tensor_bytes,   # as run() does
                               prepared.blas_modes, trial=False):
            execute(plan, recorder.bind(feeds), recorder.hook)
        recorder.finish()
        if progress is not None:
            progress(r + 1, total)
    nodes, events = recorder.result()
    return Profile(name, nodes, events, recorder.run_times, recorder.run_spans, constant_bytes)


def _algorithm(info: StepInfo) -> str:
    """The algorithm(s) the step's kernel reports for the shapes it ran on (its function's
    `algorithms`, shape -> name: Conv), distinct names joined, in the order first seen."""
    seen = getattr(info.kernel, "algorithms", None)
    return ", ".join(dict.fromkeys(seen.values())) if isinstance(seen, dict) else ""


def _prepare(model, optimize: bool) -> PreparedModel:
    session = getattr(model, "prepared", None)     # an InferenceSession
    if isinstance(session, PreparedModel):
        return session
    return prepare(model, optimize=optimize)


class _Recorder:
    """The hook: times each step with a StepClock (its bookkeeping is not charged to the kernels),
    keeps a row per node, bodies' nodes made at their first call, and the bytes of the model
    graph's live buffers up to date incrementally."""

    def __init__(self, plan: Plan, constants: set[int]):
        self.plan = plan
        self.constants = constants
        infos = plan.scoped_infos()
        self.top = {info.scope: i for i, info in enumerate(infos)}    # scope -> step index
        self.infos: dict[tuple, StepInfo] = {}                        # scope -> info, every node seen
        self.nodes: dict[tuple, NodeStats] = {}
        self.in_body: dict[tuple, int] = {}     # a body's scope -> its nodes seen so far (their index)
        self.body_order: dict[tuple, int] = {}  # a body's scope -> when first seen (If: then or else first)
        for i, info in enumerate(infos):
            self._node(info, i)
        self.events: list[tuple] = []           # (run, scope, start, wall, live, depth)
        self.run_times: list[float] = []
        self.run_spans: list[tuple[float, float]] = []
        self.clock = StepClock()
        self.origin = self.clock.began

    def _node(self, info: StepInfo, index: int) -> NodeStats:
        n = self.nodes[info.scope] = NodeStats(index, info.name, info.op_type, info.domain, info.version,
                                               scope=info.scope, fused_from=info.fused_from)
        self.infos[info.scope] = info
        return n

    def start(self, run: int | None) -> None:
        self.run = run                             # None: a warm-up run, not recorded
        self.slot_keys: dict[int, list[int]] = {}  # slot -> ids of the buffers its value holds
        self.refs: dict[int, int] = {}             # buffer id -> number of slots holding it
        self.sizes: dict[int, int] = {}            # buffer id -> bytes
        self.live = 0

    def bind(self, feeds) -> list[Any]:
        slots = bind_inputs(self.plan, feeds)
        for spec in self.plan.inputs:     # the values given (not the defaults, which are constants)
            if slots[spec.slot] is not self.plan.template[spec.slot]:
                self._hold(spec.slot, slots[spec.slot])
        self.clock.start()
        return slots

    def finish(self) -> None:
        if self.run is not None:
            # run time: kernels plus the walk, without the hook's own bookkeeping
            self.run_times.append(self.clock.elapsed())
            self.run_spans.append((self.clock.began - self.origin, time.perf_counter() - self.clock.began))

    def hook(self, info: StepInfo, args: tuple, results: tuple) -> None:
        depth = info.depth
        now, start, own = self.clock.step(depth)
        live = None
        if depth == 0:
            _, _, out, frees = self.plan.steps[self.top[info.scope]]
            for s, v in zip((out,) if out.__class__ is int else out, results):
                self._drop(s)
                self._hold(s, v)
            live = self.live
            for s in frees:
                self._drop(s)
        n = self.nodes.get(info.scope)
        if n is None:
            body = info.scope[:-1]
            self.body_order.setdefault(body, len(self.body_order))
            index = self.in_body[body] = self.in_body.get(body, -1) + 1
            n = self._node(info, index)
            n.live_bytes = None
        if self.run is not None:
            n.calls += 1
            n.total_s += own
            n.max_s = max(n.max_s, own)
            if live is not None:
                n.live_bytes = live
            if not n.outputs:
                n.inputs = [describe_value(a) for a in args]
                n.outputs = [describe_value(v) for v in results]
            self.events.append((self.run, info.scope, start - self.origin, now - start, live, depth))
        self.clock.done(depth, now)

    def result(self) -> tuple[list[NodeStats], list[Event]]:
        """The nodes in plan order, each followed by its bodies' (a body's in its plan order, the
        bodies of one node in the order first run), with their self times; the events."""
        for scope, n in self.nodes.items():
            n.algorithm = _algorithm(self.infos[scope])
            n.self_s = n.total_s
        for n in self.nodes.values():
            parent = self.nodes.get(n.scope[:-2]) if len(n.scope) > 2 else None
            if parent is not None:
                parent.self_s -= n.total_s
        for n in self.nodes.values():
            n.self_s = max(n.self_s, 0.0)     # rounding

        def key(n: NodeStats) -> tuple:
            k = []
            for j in range(0, len(n.scope), 2):
                if j:
                    k.append(self.body_order[n.scope[:j]])
                k.append(self.nodes[n.scope[:j + 1]].index)
            return tuple(k)
        nodes = sorted((n for n in self.nodes.values() if n.calls or not n.depth), key=key)
        position = {n.scope: k for k, n in enumerate(nodes)}
        events = [Event(run, position[scope], start, wall, live, depth)
                  for run, scope, start, wall, live, depth in self.events]
        return nodes, events

    def _hold(self, slot: int, value: Any) -> None:
        if slot < 2 or value is None:
            return
        keys = []
        for a in _arrays(value):
            root = _root(a)
            key = id(root)
            if key in self.constants:
                continue
            keys.append(key)
            count = self.refs.get(key, 0)
            if count == 0:
                self.sizes[key] = size = _nbytes(root, a)
                self.live += size
            self.refs[key] = count + 1
        if keys:
            self.slot_keys[slot] = keys

    def _drop(self, slot: int) -> None:
        keys = self.slot_keys.pop(slot, None)
        if not keys:
            return
        for key in keys:
            count = self.refs[key] - 1
            if count == 0:
                del self.refs[key]
                self.live -= self.sizes.pop(key)
            else:
                self.refs[key] = count


def _arrays(value: Any):
    """The numpy arrays inside a value (a tensor, a sequence, a map, an optional)."""
    if isinstance(value, np.ndarray):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _arrays(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _arrays(v)


def _root(a: np.ndarray):
    """The object owning a view's memory (the array itself when it owns it)."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a.base if a.base is not None else a


def _nbytes(root: Any, a: np.ndarray) -> int:
    if isinstance(root, np.ndarray):
        return root.nbytes
    try:
        return memoryview(root).nbytes
    except TypeError:
        return a.nbytes


def _root_bytes(value: Any, seen: set[int]) -> int:
    total = 0
    for a in _arrays(value):
        root = _root(a)
        if id(root) not in seen:
            seen.add(id(root))
            total += _nbytes(root, a)
    return total


def format_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _grid(header: tuple, rows: list[tuple]) -> list[str]:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    fmt = lambda row: "  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip()  # noqa: E731
    return [fmt(header), fmt(tuple("-" * w for w in widths))] + [fmt(r) for r in rows]
