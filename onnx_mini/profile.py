"""Profiling: where a model spends its time and memory, node by node and by operator type.

    prof = onnx_mini.profile("model.onnx", {"x": x}, runs=10)
    print(prof.table())
    prof.to_json("p.json"); prof.to_chrome_trace("p.trace.json"); prof.to_html("p.html")

It runs the model through the executor's per-node hook (the plain loop pays nothing when no profile
is taken) and records, for every step of the plan, the time its kernel took and the bytes of the
values alive once it has run: graph inputs and intermediate results, each buffer counted once (a
view shares its base's bytes; constants and initializers are reported apart, as they live for the
whole session). A control-flow node (If, Loop, Scan) counts the time of its body as its own.
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
from .engine import PreparedModel, prepare
from .executor import execute
from .inputs import bind_inputs
from .plan import Plan, StepInfo, describe_value


class _Mean:
    calls: int
    total_s: float

    @property
    def mean_s(self) -> float:
        return self.total_s / self.calls if self.calls else 0.0


@dataclass
class NodeStats(_Mean):
    """One step of the plan (one node) over every profiled run."""
    index: int
    name: str
    op_type: str
    domain: str
    version: int
    calls: int = 0
    total_s: float = 0.0
    max_s: float = 0.0
    live_bytes: int = 0                 # alive right after the node ran (its inputs not yet freed), last run
    inputs: list[str] = field(default_factory=list)    # 'float32[1, 3, 224, 224]', first run
    outputs: list[str] = field(default_factory=list)
    algorithm: str = ""                 # how the kernel computed (Conv: select.ALGORITHMS), "" if it does not say

    @property
    def op(self) -> str:
        return f"{self.domain}::{self.op_type}" if self.domain else self.op_type

    @property
    def op_label(self) -> str:
        """'Conv-11', or 'Conv-11 [winograd]' when the kernel says which algorithm ran."""
        label = f"{self.op}-{self.version}"
        return f"{label} [{self.algorithm}]" if self.algorithm else label


@dataclass
class OpTypeStats(_Mean):
    """Every node of one operator type together."""
    op: str
    nodes: int
    calls: int
    total_s: float


@dataclass
class Event:
    """One node's execution in one run: for the Chrome trace."""
    run: int
    index: int
    start_s: float                      # from the start of the profile
    dur_s: float
    live_bytes: int


class Profile:
    """The result of `onnx_mini.profile`: per-node and per-op-type times, calls and live bytes."""

    def __init__(self, name: str, nodes: list[NodeStats], events: list[Event], run_times: list[float],
                 run_spans: list[tuple[float, float]], constant_bytes: int):
        self.name = name
        self.nodes = nodes
        self.events = events
        self.run_times = run_times          # seconds per run, without the profiler's own bookkeeping
        self.run_spans = run_spans          # (start, duration) of each run on the trace's clock (with it)
        self.constant_bytes = constant_bytes

    # -- summaries ---------------------------------------------------------------------------------

    @property
    def runs(self) -> int:
        return len(self.run_times)

    @property
    def peak_live_bytes(self) -> int:
        return max((e.live_bytes for e in self.events), default=0)

    @property
    def node_time_s(self) -> float:
        """Time spent inside kernels, over every run."""
        return sum(n.total_s for n in self.nodes)

    def by_op_type(self) -> list[OpTypeStats]:
        """Operator types, the most expensive first."""
        groups: dict[str, OpTypeStats] = {}
        for n in self.nodes:
            g = groups.setdefault(n.op, OpTypeStats(n.op, 0, 0, 0.0))
            g.nodes += 1
            g.calls += n.calls
            g.total_s += n.total_s
        return sorted(groups.values(), key=lambda g: (-g.total_s, g.op))

    def slowest(self, top: int | None = None) -> list[NodeStats]:
        ranked = sorted(self.nodes, key=lambda n: (-n.total_s, n.index))
        return ranked if top is None else ranked[:top]

    def to_dict(self) -> dict:
        total = self.node_time_s or 1.0
        return {
            "model": self.name,
            "runs": self.runs,
            "run_ms": [t * 1e3 for t in self.run_times],
            "median_run_ms": statistics.median(self.run_times) * 1e3 if self.run_times else 0.0,
            "peak_live_bytes": self.peak_live_bytes,
            "constant_bytes": self.constant_bytes,
            "op_types": [{"op": g.op, "nodes": g.nodes, "calls": g.calls, "total_ms": g.total_s * 1e3,
                          "mean_ms": g.mean_s * 1e3, "share": g.total_s / total} for g in self.by_op_type()],
            "nodes": [{"index": n.index, "name": n.name, "op": n.op, "version": n.version, "calls": n.calls,
                       "total_ms": n.total_s * 1e3, "mean_ms": n.mean_s * 1e3, "max_ms": n.max_s * 1e3,
                       "live_bytes": n.live_bytes, "inputs": n.inputs, "outputs": n.outputs,
                       **({"algorithm": n.algorithm} if n.algorithm else {})}
                      for n in self.nodes],
        }

    # -- outputs -----------------------------------------------------------------------------------

    def table(self, top: int = 15) -> str:
        """A text report: the run summary, every op type, then the `top` slowest nodes."""
        total = self.node_time_s or 1.0
        med = statistics.median(self.run_times) * 1e3 if self.run_times else 0.0
        lines = [f"{self.name}: {self.runs} run(s), median {med:.2f} ms; {len(self.nodes)} nodes; "
                 f"peak live values {format_bytes(self.peak_live_bytes)} "
                 f"(+ {format_bytes(self.constant_bytes)} of constants)", ""]
        rows = [(g.op, str(g.nodes), str(g.calls), f"{g.total_s * 1e3:.3f}", f"{g.mean_s * 1e3:.3f}",
                 f"{100 * g.total_s / total:.1f}") for g in self.by_op_type()]
        lines += _grid(("op type", "nodes", "calls", "total ms", "mean ms", "%"), rows)
        ranked = self.slowest(top)
        if ranked:
            lines += ["", f"slowest {len(ranked)} node(s):"]
            rows = [(n.name or f"#{n.index}", n.op_label, str(n.calls), f"{n.mean_s * 1e3:.3f}",
                     f"{100 * n.total_s / total:.1f}", format_bytes(n.live_bytes), ", ".join(n.outputs))
                    for n in ranked]
            lines += _grid(("node", "op", "calls", "mean ms", "%", "live after", "outputs"), rows)
        return "\n".join(lines)

    def to_json(self, path) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=1)

    def to_chrome_trace(self, path) -> None:
        """Trace Event Format (JSON object form): one complete ('X') event per node and run, one per
        run, and a 'live bytes' counter; opens in https://ui.perfetto.dev and chrome://tracing."""
        events: list[dict] = [
            {"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": f"onnx_mini: {self.name}"}},
            {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": "runs"}},
            {"name": "thread_name", "ph": "M", "pid": 1, "tid": 2, "args": {"name": "nodes"}},
        ]
        for r, (start, dur) in enumerate(self.run_spans):
            events.append({"name": f"run {r + 1}", "cat": "run", "ph": "X", "pid": 1, "tid": 1,
                           "ts": start * 1e6, "dur": dur * 1e6})
        for e in self.events:
            n = self.nodes[e.index]
            events.append({"name": n.name or n.op_type, "cat": n.op, "ph": "X", "pid": 1, "tid": 2,
                           "ts": e.start_s * 1e6, "dur": e.dur_s * 1e6,
                           "args": {"op": n.op_label, "run": e.run + 1, "inputs": n.inputs,
                                    "outputs": n.outputs, "live_bytes": e.live_bytes}})
            events.append({"name": "live bytes", "ph": "C", "pid": 1, "tid": 2, "ts": (e.start_s + e.dur_s) * 1e6,
                           "args": {"bytes": e.live_bytes}})
        with open(path, "w") as f:
            json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)

    def to_html(self, path) -> None:
        """A self-contained page: summary, a per-op-type bar chart (inline SVG) and the node table."""
        with open(path, "w", encoding="utf-8") as f:
            f.write(self._html())

    def _html(self) -> str:
        esc = html.escape
        total = self.node_time_s or 1.0
        groups = self.by_op_type()
        med = statistics.median(self.run_times) * 1e3 if self.run_times else 0.0
        bar_h, chart_w = 22, 520
        label_w = 16 + 7 * max((len(g.op) for g in groups), default=10)     # ~7 px per character at 12 px
        top = max((g.total_s for g in groups), default=0.0) or 1.0
        bars = []
        for i, g in enumerate(groups):
            y = i * bar_h
            w = max(1.0, chart_w * g.total_s / top)
            bars.append(
                f'<text x="{label_w - 6}" y="{y + 15}" text-anchor="end">{esc(g.op)}</text>'
                f'<rect x="{label_w}" y="{y + 3}" width="{w:.1f}" height="{bar_h - 6}" fill="#3b7dd8">'
                f'<title>{esc(g.op)}: {g.total_s * 1e3:.3f} ms in {g.calls} call(s)</title></rect>'
                f'<text x="{label_w + w + 6:.1f}" y="{y + 15}">{g.total_s * 1e3:.2f} ms '
                f'({100 * g.total_s / total:.1f}%)</text>')
        height = max(bar_h, bar_h * len(groups))
        svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{label_w + chart_w + 160}" height="{height}" '
               f'font-family="sans-serif" font-size="12">{"".join(bars)}</svg>')
        op_rows = "".join(
            f"<tr><td>{esc(g.op)}</td><td>{g.nodes}</td><td>{g.calls}</td><td>{g.total_s * 1e3:.3f}</td>"
            f"<td>{g.mean_s * 1e3:.3f}</td><td>{100 * g.total_s / total:.1f}</td></tr>" for g in groups)
        node_rows = "".join(
            f"<tr><td>{n.index}</td><td>{esc(n.name)}</td><td>{esc(n.op_label)}</td><td>{n.calls}</td>"
            f"<td>{n.mean_s * 1e3:.3f}</td><td>{100 * n.total_s / total:.1f}</td>"
            f"<td>{esc(format_bytes(n.live_bytes))}</td><td>{esc(', '.join(n.inputs))}</td>"
            f"<td>{esc(', '.join(n.outputs))}</td></tr>" for n in self.nodes)
        return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>onnx_mini profile: {esc(self.name)}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; font-size: 13px; }}
th, td {{ border: 1px solid #ccc; padding: 3px 8px; text-align: left; }}
th {{ background: #f0f0f0; }}
</style></head><body>
<h1>onnx_mini profile: {esc(self.name)}</h1>
<p>{self.runs} run(s), median {med:.2f} ms; {len(self.nodes)} nodes;
peak live values {esc(format_bytes(self.peak_live_bytes))}, constants {esc(format_bytes(self.constant_bytes))}.</p>
<h2>Time by operator type</h2>
{svg}
<table><tr><th>op type</th><th>nodes</th><th>calls</th><th>total ms</th><th>mean ms</th><th>%</th></tr>
{op_rows}</table>
<h2>Nodes (plan order)</h2>
<table><tr><th>#</th><th>node</th><th>op</th><th>calls</th><th>mean ms</th><th>%</th><th>live after</th>
<th>inputs</th><th>outputs</th></tr>
{node_rows}</table>
</body></html>
"""


def profile(model, feeds, runs: int = 10, *, warmup: int = 1, optimize: bool = True,
            progress: Callable[[int, int], None] | None = None) -> Profile:
    """Run `model` (a path, bytes, ModelProto, or a prepared model) `runs` times on `feeds` (a dict
    name -> value, or a list in input order) after `warmup` unrecorded runs, and return the Profile.
    progress(done, total) is called after each run, warm-up included."""
    if runs < 1:
        raise ValueError("runs must be at least 1")
    prepared = model if isinstance(model, PreparedModel) else _prepare(model, optimize)
    plan = prepared.plan_to_run(prepared.plan_for(tuple(prepared.plan.output_names), feeds), feeds)
    name = prepared.model.graph.name or "model"
    nodes = [NodeStats(i, info.name, info.op_type, info.domain, info.version) for i, info in enumerate(plan.infos)]
    constants = set()
    constant_bytes = sum(_root_bytes(v, constants) for v in plan.template if v is not None)
    recorder = _Recorder(plan, nodes, constants)
    total = warmup + runs
    for r in range(total):
        recorder.start(r - warmup if r >= warmup else None)
        with run_scope.running(prepared.threads):
            execute(plan, recorder.bind(feeds), recorder.hook)
        recorder.finish()
        if progress is not None:
            progress(r + 1, total)
    for n, info in zip(nodes, plan.infos):
        n.algorithm = _algorithm(info)
    return Profile(name, nodes, recorder.events, recorder.run_times, recorder.run_spans, constant_bytes)


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
    """The hook: times each step (from the end of the previous hook call to this one, so bookkeeping
    is not charged to the kernels) and keeps the bytes of live buffers up to date incrementally."""

    def __init__(self, plan: Plan, nodes: list[NodeStats], constants: set[int]):
        self.plan = plan
        self.nodes = nodes
        self.constants = constants
        self.index = {id(info): i for i, info in enumerate(plan.infos)}
        self.events: list[Event] = []
        self.run_times: list[float] = []
        self.run_spans: list[tuple[float, float]] = []
        self.origin = time.perf_counter()

    def start(self, run: int | None) -> None:
        self.run = run                             # None: a warm-up run, not recorded
        self.slot_keys: dict[int, list[int]] = {}  # slot -> ids of the buffers its value holds
        self.refs: dict[int, int] = {}             # buffer id -> number of slots holding it
        self.sizes: dict[int, int] = {}            # buffer id -> bytes
        self.live = 0
        self.kernel_time = 0.0

    def bind(self, feeds) -> list[Any]:
        slots = bind_inputs(self.plan, feeds)
        for spec in self.plan.inputs:     # the values given (not the defaults, which are constants)
            if slots[spec.slot] is not self.plan.template[spec.slot]:
                self._hold(spec.slot, slots[spec.slot])
        self.run_start = self.last = time.perf_counter()
        return slots

    def finish(self) -> None:
        end = time.perf_counter()
        if self.run is not None:
            # run time: kernels plus the walk, without the hook's own bookkeeping
            self.run_times.append(self.kernel_time + (end - self.last))
            self.run_spans.append((self.run_start - self.origin, end - self.run_start))

    def hook(self, info: StepInfo, args: tuple, results: tuple) -> None:
        now = time.perf_counter()
        dur = now - self.last
        self.kernel_time += dur
        i = self.index[id(info)]
        _, _, out, frees = self.plan.steps[i]
        for s, v in zip((out,) if out.__class__ is int else out, results):
            self._drop(s)
            self._hold(s, v)
        live = self.live
        for s in frees:
            self._drop(s)
        if self.run is not None:
            n = self.nodes[i]
            n.calls += 1
            n.total_s += dur
            n.max_s = max(n.max_s, dur)
            n.live_bytes = live
            if not n.outputs:
                n.inputs = [describe_value(a) for a in args]
                n.outputs = [describe_value(v) for v in results]
            start = self.last - self.origin
            self.events.append(Event(self.run, i, start, dur, live))
        self.last = time.perf_counter()

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
