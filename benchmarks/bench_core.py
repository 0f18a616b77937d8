"""Core benchmarks: onnx_mini vs onnxruntime (CPUExecutionProvider) vs onnx.reference.ReferenceEvaluator.

    .venv/bin/python benchmarks/bench_core.py            # full run (under ~3 minutes)
    .venv/bin/python benchmarks/bench_core.py --quick    # fewer repetitions (under ~40 s)
    .venv/bin/python benchmarks/bench_core.py --only control   # one case (chain, gather, reshape, control, decode)

Cases (see benchmarks/README.md):
  1. per-node overhead: a 1000-node dependency chain of tiny Add/Shape/Reshape/GatherElements nodes;
     for onnx_mini also the executor loop's own cost per node.
  2. GatherElements on 2048x2048 float32 with int64 indices in [-2048, 2048), axis 0 and axis 1.
  3. Shape -> Reshape chain on a 64 MB float32 tensor: should be free (views, no copies).
  4. control flow: a Loop of 100 iterations over a tiny elementwise body and over a GRU-cell-like
     MatMul body, a Scan of 100 steps of a small RNN cell; each against the same body run 100 times
     from Python (prepared once as a model of its own), and against onnxruntime on 2 threads, in
     alternating blocks after a pause (see `alternating`).
  5. one-row products: a decoder step's float32 MatMuls (GPT-2-small's shapes, 6 layers, 170 MB of
     weights: 768 -> 2304, 768 -> 768, 768 -> 3072, 3072 -> 768) on one token; onnx_mini with its
     matrices in the order it chooses (weight_layout.py) and in the loader's, against onnxruntime on
     2 threads, in alternating blocks after a pause.

All runtimes run in this process. Times are medians over repeats, after warm-up. A runtime that is
missing or fails on a case is shown as 'n/a' (the reason is printed below the table); nothing here
is allowed to stop the other cases.
"""
from __future__ import annotations

import argparse
import gc
import math
import os
import platform
import statistics
import sys
import tempfile
import time
import tracemalloc
from typing import Any, Callable

# onnx_mini leaves the process's malloc alone by default; the benchmarks opt in to its tuning (at the
# first run, as before it became opt-in) so that their figures stay comparable with earlier ones. Every
# script imports this module first, bench_suite's children too. Set ONNX_MINI_MALLOC to measure another
# setting: the machine line says which one ran.
os.environ.setdefault("ONNX_MINI_MALLOC", "tuned")

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import onnx_mini  # noqa: E402
from onnx_mini.executor import execute  # noqa: E402
from onnx_mini.inputs import bind_inputs  # noqa: E402

try:
    import onnxruntime as ort
except Exception as e:  # missing or broken install: every onnxruntime cell becomes n/a
    ort = None
    ORT_IMPORT_ERROR = f"{type(e).__name__}: {e}"
else:
    ORT_IMPORT_ERROR = ""

try:
    from onnx.reference import ReferenceEvaluator
except Exception as e:
    ReferenceEvaluator = None
    REF_IMPORT_ERROR = f"{type(e).__name__}: {e}"
else:
    REF_IMPORT_ERROR = ""

IR_VERSION = 10          # onnxruntime accepts IR <= 13 only
OPSET = 21
RUNTIMES = ("onnx_mini", "onnxruntime", "onnx.reference")

# Repetitions (full, quick). Each timed sample lasts at least MIN_SAMPLE seconds (inner loop).
REPEATS = {"chain": (60, 7), "gather": (40, 5), "reshape": (60, 7)}
# Alternating blocks (full, quick): how many blocks per runtime, how many timed calls per block.
BLOCKS = {"control": ((5, 15), (2, 5)), "decode": ((8, 30), (2, 10))}
PAUSE = 0.5   # seconds before each block: a runtime's spinning threads must not steal the next one's core
MIN_SAMPLE = {False: 0.05, True: 0.01}


# -- timing ---------------------------------------------------------------------------------------

def measure(fn: Callable[[], Any], repeats: int, *, warmup: int = 2, min_sample: float = 0.02,
            max_seconds: float = 30.0) -> float:
    """Median seconds per call of fn(): warm-up calls, then `repeats` samples, each of enough calls
    to last min_sample. Stops early (with at least 3 samples) once max_seconds are spent."""
    for _ in range(warmup):
        fn()
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-9)
    inner = max(1, math.ceil(min_sample / one))
    samples = []
    start = time.perf_counter()
    gc_was = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            samples.append((time.perf_counter() - t0) / inner)
            if len(samples) >= 3 and time.perf_counter() - start > max_seconds:
                break
    finally:
        if gc_was:
            gc.enable()
    return statistics.median(samples)


def measure_batch(make: Callable[[], Any], fn: Callable[[Any], Any], repeats: int, *, per_sample: int,
                  warmup: int = 2) -> float:
    """Like measure(), for a fn that consumes a fresh argument each call (built by make(), untimed)."""
    for _ in range(warmup):
        fn(make())
    samples = []
    gc_was = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeats):
            args = [make() for _ in range(per_sample)]
            t0 = time.perf_counter()
            for a in args:
                fn(a)
            samples.append((time.perf_counter() - t0) / per_sample)
    finally:
        if gc_was:
            gc.enable()
    return statistics.median(samples)


def alternating(fns: dict[str, Callable[[], Any] | None], blocks: int, per_block: int,
                errors: dict[str, str] | None = None) -> dict[str, float | None]:
    """Median seconds per call of each fn, the runtimes taking turns in blocks: before each block a
    PAUSE (onnxruntime's pool spins for a while after a call, stealing a core from whoever runs next)
    and one untimed call, then `per_block` back-to-back timed calls; the median per block, then the
    median over blocks. A None fn gives None, as one that raises (its error in `errors`)."""
    samples: dict[str, list[float]] = {k: [] for k in fns}
    live = {k: f for k, f in fns.items() if f is not None}
    gc_was = gc.isenabled()
    try:
        for _ in range(blocks):
            for name, fn in list(live.items()):
                time.sleep(PAUSE)
                try:
                    fn()
                    gc.disable()
                    times = []
                    for _ in range(per_block):
                        t0 = time.perf_counter()
                        fn()
                        times.append(time.perf_counter() - t0)
                except Exception as e:
                    del live[name]
                    samples[name] = []
                    if errors is not None:
                        errors[name] = f"timing failed: {short(e)}"
                    continue
                finally:
                    if gc_was:
                        gc.enable()
                samples[name].append(statistics.median(times))
    finally:
        if gc_was:
            gc.enable()
    return {k: statistics.median(v) if v else None for k, v in samples.items()}


def fmt_time(t: float | None) -> str:
    if t is None:
        return "n/a"
    if t < 1e-6:
        return f"{t * 1e9:.0f} ns"
    if t < 1e-3:
        return f"{t * 1e6:.2f} us"
    if t < 1.0:
        return f"{t * 1e3:.2f} ms"
    return f"{t:.2f} s"


def fmt_ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b == 0:
        return "n/a"
    r = a / b
    return f"{r:.1f}x" if r >= 10 else f"{r:.2f}x" if r >= 0.1 else f"{r:.2g}x"


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "n/a"
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def short(e: BaseException, limit: int = 160) -> str:
    msg = " ".join(f"{type(e).__name__}: {e}".split())
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."


# -- runtimes -------------------------------------------------------------------------------------

class Runner:
    """One runtime on one model: build(), then call(feeds) -> list of outputs. Failures are kept as text."""

    def __init__(self, name: str, model: onnx.ModelProto, **options: Any):
        """options: onnxruntime SessionOptions fields, or onnx_mini.prepare keywords."""
        self.name = name
        self.error = ""
        self.missing = False       # runtime not importable (said once at the top, not per case)
        self.setup_time: float | None = None
        self.obj: Any = None
        self.call: Callable[[dict], list] | None = None
        t0 = time.perf_counter()
        try:
            if name == "onnx_mini":
                rep = onnx_mini.prepare(model, **options)
                self.obj = rep
                self.call = lambda feeds: list(rep.run(feeds))
            elif name == "onnxruntime":
                if ort is None:
                    raise RuntimeError(f"onnxruntime not importable ({ORT_IMPORT_ERROR})")
                so = ort.SessionOptions()
                for k, v in options.items():
                    setattr(so, k, v)
                sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
                self.obj = sess
                self.call = lambda feeds: sess.run(None, feeds)
            elif name == "onnx.reference":
                if ReferenceEvaluator is None:
                    raise RuntimeError(f"onnx.reference not importable ({REF_IMPORT_ERROR})")
                ref = ReferenceEvaluator(model)
                self.obj = ref
                self.call = lambda feeds: ref.run(None, feeds)
            else:
                raise ValueError(name)
            self.setup_time = time.perf_counter() - t0
        except Exception as e:
            self.missing = (name == "onnxruntime" and ort is None) or (
                name == "onnx.reference" and ReferenceEvaluator is None)
            self.error = f"setup failed: {short(e)}"
            self.call = None

    @property
    def ok(self) -> bool:
        return self.call is not None and not self.error

    def settle(self, feeds: dict) -> None:
        """onnx_mini only: its runs on feeds until the model's BLAS mode on this machine is chosen
        (PreparedModel.settle, at most ~5 s), so that the timed calls are its steady state."""
        if self.name == "onnx_mini" and self.ok:
            self.obj.settle(feeds)

    def try_run(self, feeds: dict) -> list | None:
        if not self.ok:
            return None
        try:
            return self.call(feeds)
        except Exception as e:
            self.error = f"run failed: {short(e)}"
            return None

    def time(self, feeds: dict, repeats: int, min_sample: float) -> float | None:
        if not self.ok:
            return None
        try:
            return measure(lambda: self.call(feeds), repeats, min_sample=min_sample)
        except Exception as e:
            self.error = f"timing failed: {short(e)}"
            return None


def make_runners(model: onnx.ModelProto) -> dict[str, Runner]:
    return {name: Runner(name, model) for name in RUNTIMES}


def check_against(runners: dict[str, Runner], outs: dict[str, list | None], ref_name: str,
                  notes: list[str], label: str) -> None:
    """Compare every runtime's outputs to ref_name's with np.array_equal; a mismatch disables timing."""
    base = outs.get(ref_name)
    if base is None:
        notes.append(f"{label}: outputs not cross-checked (no {ref_name} output to compare with)")
        return
    for name, out in outs.items():
        if name == ref_name or out is None:
            continue
        same = len(out) == len(base) and all(
            np.asarray(a).shape == np.asarray(b).shape and np.array_equal(a, b) for a, b in zip(out, base))
        if not same:
            runners[name].error = f"output differs from {ref_name} (np.array_equal is False) - not timed"
            notes.append(f"{label}: {name} output DIFFERS from {ref_name}")


# -- models ---------------------------------------------------------------------------------------

def make_model(nodes, inputs, outputs, initializers, name: str) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="bench_core")
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


def chain_model(n_nodes: int, shape=(2, 3), seed: int = 0) -> onnx.ModelProto:
    """x -> Add(., c) -> Shape -> Reshape(add, shape) -> GatherElements(., idx) -> Add ... (one line).

    The input has symbolic dims so that no runtime can turn Shape into a constant from the declared type.
    """
    assert n_nodes % 4 == 0
    rng = np.random.default_rng(seed)
    c = numpy_helper.from_array(np.full(shape, 0.125, dtype=np.float32), "c")
    idx = numpy_helper.from_array(rng.integers(-shape[0], shape[0], size=shape, dtype=np.int64), "idx")
    nodes, prev = [], "x"
    for k in range(n_nodes // 4):
        a, s, r, g = f"add{k}", f"shape{k}", f"reshape{k}", f"gather{k}"
        nodes += [
            helper.make_node("Add", [prev, "c"], [a], name=f"Add_{k}"),
            helper.make_node("Shape", [a], [s], name=f"Shape_{k}"),
            helper.make_node("Reshape", [a, s], [r], name=f"Reshape_{k}"),
            helper.make_node("GatherElements", [r, "idx"], [g], name=f"GatherElements_{k}", axis=0),
        ]
        prev = g
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "M"])
    y = helper.make_tensor_value_info(prev, TensorProto.FLOAT, list(shape))  # = idx.shape
    return make_model(nodes, [x], [y], [c, idx], "chain")


def gather_model(axis: int, shape) -> onnx.ModelProto:
    node = helper.make_node("GatherElements", ["data", "indices"], ["y"], axis=axis)
    return make_model([node],
                      [helper.make_tensor_value_info("data", TensorProto.FLOAT, list(shape)),
                       helper.make_tensor_value_info("indices", TensorProto.INT64, list(shape))],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))], [], "gather")


def reshape_model(shape, round_trips: int) -> onnx.ModelProto:
    """x -> [Shape(prev); Reshape(prev, [-1]); Reshape(flat, shape)] * round_trips."""
    flat = numpy_helper.from_array(np.array([math.prod(shape)], dtype=np.int64), "flat_shape")
    nodes, prev = [], "x"
    for k in range(round_trips):
        s, f, b = f"s{k}", f"flat{k}", f"back{k}"
        nodes += [helper.make_node("Shape", [prev], [s]),
                  helper.make_node("Reshape", [prev, "flat_shape"], [f]),
                  helper.make_node("Reshape", [f, s], [b])]
        prev = b
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                      [helper.make_tensor_value_info(prev, TensorProto.FLOAT, list(shape))], [flat], "reshape")


def _vi(name: str, elem: int, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _weights(rng, **shapes) -> list[onnx.TensorProto]:
    return [numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)
            for name, shape in shapes.items()]


def loop_models(kind: str, iterations: int = 100, seed: int = 4):
    """(Loop model, its body as a model of its own, the Loop's feeds) for kind "elementwise" (x * a + b
    on float32[16]) or "gru" (a GRU cell on a [1, 64] state: three [64, 64] MatMuls, gates, blend). The
    body's outputs: cond (passed through), the next state, and the state again as a scan output."""
    rng = np.random.default_rng(seed)
    B, I64 = TensorProto.BOOL, TensorProto.INT64
    if kind == "elementwise":
        shape = [16]
        inits = [numpy_helper.from_array(np.full(16, 0.5, np.float32), "a"),
                 numpy_helper.from_array(np.full(16, 0.25, np.float32), "b")]
        nodes = [helper.make_node("Mul", ["x_in", "a"], ["t"]), helper.make_node("Add", ["t", "b"], ["x_out"])]
    else:
        d = 64
        shape = [1, d]
        inits = _weights(rng, Wz=(d, d), Wr=(d, d), Wn=(d, d), bz=(d,), br=(d,), bn=(d,))
        nodes = []
        for g in "zr":      # z, r = sigmoid(h Wg + bg)
            nodes += [helper.make_node("MatMul", ["x_in", f"W{g}"], [f"m{g}"]),
                      helper.make_node("Add", [f"m{g}", f"b{g}"], [f"p{g}"]),
                      helper.make_node("Sigmoid", [f"p{g}"], [g])]
        nodes += [helper.make_node("Mul", ["r", "x_in"], ["rh"]), helper.make_node("MatMul", ["rh", "Wn"], ["mn"]),
                  helper.make_node("Add", ["mn", "bn"], ["pn"]), helper.make_node("Tanh", ["pn"], ["n"]),
                  helper.make_node("Sub", ["n", "x_in"], ["d"]), helper.make_node("Mul", ["z", "d"], ["zd"]),
                  helper.make_node("Sub", ["n", "zd"], ["x_out"])]       # (1 - z) n + z h = n - z (n - h)
    nodes += [helper.make_node("Identity", ["x_out"], ["y"]), helper.make_node("Identity", ["cond_in"], ["cond_out"])]
    body_in = [_vi("i", I64, []), _vi("cond_in", B, []), _vi("x_in", TensorProto.FLOAT, shape)]
    body_out = [_vi("cond_out", B, []), _vi("x_out", TensorProto.FLOAT, shape), _vi("y", TensorProto.FLOAT, shape)]
    # cond given (true): onnx.reference's Loop fails on an omitted one
    loop = helper.make_node("Loop", ["M", "cond", "x0"], ["x_final", "ys"], name="loop",
                            body=helper.make_graph(nodes, "body", body_in, body_out))
    loop_model = make_model([loop], [_vi("M", I64, []), _vi("x0", TensorProto.FLOAT, shape)],
                            [_vi("x_final", TensorProto.FLOAT, shape),
                             _vi("ys", TensorProto.FLOAT, [iterations, *shape])],
                            [*inits, numpy_helper.from_array(np.array(True), "cond")], f"loop_{kind}")
    body_model = make_model(nodes, body_in, body_out, inits, f"body_{kind}")
    feeds = {"M": np.array(iterations, np.int64), "x0": rng.standard_normal(shape).astype(np.float32)}
    return loop_model, body_model, feeds


def scan_models(steps: int = 100, d: int = 32, d_in: int = 16, seed: int = 5):
    """(Scan model, its body as a model of its own, the Scan's feeds): h = tanh(x_t W + h R + b) over
    `steps` inputs x_t of [1, d_in], h of [1, d]; the scan output is h at each step."""
    rng = np.random.default_rng(seed)
    F = TensorProto.FLOAT
    inits = _weights(rng, W=(d_in, d), R=(d, d), bias=(d,))
    nodes = [helper.make_node("MatMul", ["x_t", "W"], ["xw"]), helper.make_node("MatMul", ["h_in", "R"], ["hr"]),
             helper.make_node("Add", ["xw", "hr"], ["s"]), helper.make_node("Add", ["s", "bias"], ["s2"]),
             helper.make_node("Tanh", ["s2"], ["h_out"]), helper.make_node("Identity", ["h_out"], ["y"])]
    body_in = [_vi("h_in", F, [1, d]), _vi("x_t", F, [1, d_in])]
    body_out = [_vi("h_out", F, [1, d]), _vi("y", F, [1, d])]
    scan = helper.make_node("Scan", ["h0", "xs"], ["h_final", "ys"], name="scan", num_scan_inputs=1,
                            body=helper.make_graph(nodes, "body", body_in, body_out))
    scan_model = make_model([scan], [_vi("h0", F, [1, d]), _vi("xs", F, [steps, 1, d_in])],
                            [_vi("h_final", F, [1, d]), _vi("ys", F, [steps, 1, d])], inits, "scan_rnn")
    body_model = make_model(nodes, body_in, body_out, inits, "body_rnn")
    feeds = {"h0": np.zeros((1, d), np.float32), "xs": rng.standard_normal((steps, 1, d_in)).astype(np.float32)}
    return scan_model, body_model, feeds


def ort_optimized_node_count(model: onnx.ModelProto) -> int | None:
    """How many nodes onnxruntime keeps after its default graph optimizations (None if unknown)."""
    if ort is None:
        return None
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "opt.onnx")
        try:
            so = ort.SessionOptions()
            so.optimized_model_filepath = path
            so.log_severity_level = 3   # no warning about hardware-specific optimized models
            ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
            return len(onnx.load(path).graph.node)
        except Exception:
            return None


# -- report ---------------------------------------------------------------------------------------

class Table:
    def __init__(self):
        self.rows: list[tuple[str, dict[str, float | None]]] = []
        self.notes: list[str] = []

    def add(self, label: str, times: dict[str, float | None]) -> None:
        self.rows.append((label, times))
        t = times
        print(f"  {label}: " + ", ".join(f"{n} {fmt_time(t.get(n))}" for n in RUNTIMES), flush=True)

    def render(self) -> str:
        head = ("case", "onnx_mini", "onnxruntime", "onnx.reference", "mini/ort", "ref/mini")
        body = []
        for label, t in self.rows:
            m, o, r = (t.get(n) for n in RUNTIMES)
            body.append((label, fmt_time(m), fmt_time(o), fmt_time(r), fmt_ratio(m, o), fmt_ratio(r, m)))
        widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]

        def line(row):
            return "| " + " | ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                     for i, (c, w) in enumerate(zip(row, widths))) + " |"
        sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
        return "\n".join([line(head), sep, *map(line, body)])


def runner_notes(table: Table, label: str, runners: dict[str, Runner]) -> None:
    for name, r in runners.items():
        if r.error and not r.missing:
            table.notes.append(f"{label}: {name} n/a - {r.error}")


# -- case 1: per-node overhead --------------------------------------------------------------------

def case_chain(table: Table, quick: bool, n_nodes: int = 1000) -> None:
    label = f"1. chain of {n_nodes} tiny nodes"
    print(f"\n[{label}] Add/Shape/Reshape/GatherElements on float32[2,3], one dependency line", flush=True)
    reps, min_sample = REPEATS["chain"][quick], MIN_SAMPLE[quick]
    model = chain_model(n_nodes)
    x = np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)
    feeds = {"x": x}
    runners = make_runners(model)
    outs = {n: r.try_run(feeds) for n, r in runners.items()}
    check_against(runners, outs, "onnxruntime" if outs.get("onnxruntime") is not None else "onnx.reference",
                  table.notes, label)
    times = {n: r.time(feeds, reps, min_sample) for n, r in runners.items()}
    table.add(f"{label}, per run", times)
    table.add(f"{label}, per node", {n: (t / n_nodes if t is not None else None) for n, t in times.items()})
    runner_notes(table, label, runners)
    setup = f"{label}: setup (prepare / session / evaluator): " + ", ".join(
        f"{n} {fmt_time(r.setup_time)}" for n, r in runners.items())
    print("  " + setup)
    table.notes.append(setup)

    # Both runtimes drop nodes by default once shapes are known (onnx_mini specialises its plan to
    # the first run's input shapes: the Shape nodes fold and the same-shape Reshapes go). The second
    # row makes both run every node: onnx_mini with optimize=False, onnxruntime with ORT_DISABLE_ALL.
    mini = runners["onnx_mini"]
    if mini.ok:
        specialised = [p for sp in mini.obj._specializers.values() for p, _ in filter(None, sp._plans.values())]
        msg = (f"{label}: onnx_mini's plan has {len(mini.obj.plan.steps)} steps; specialised to the input's "
               f"shape at the first run: {', '.join(str(len(p.steps)) for p in specialised) or 'none'} steps")
        table.notes.append(msg)
        print("  " + msg)
    kept = ort_optimized_node_count(model) if ort is not None and runners["onnxruntime"].ok else None
    if kept is not None:
        table.notes.append(f"{label}: onnxruntime keeps {kept} of {n_nodes} nodes after its default graph "
                           "optimizations")
    every = {"onnx_mini": Runner("onnx_mini", model, optimize=False)}
    if ort is not None:
        every["onnxruntime"] = Runner("onnxruntime", model,
                                      graph_optimization_level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    t_every = {n: r.time(feeds, reps, min_sample) if r.try_run(feeds) is not None else None
               for n, r in every.items()}
    t_every["onnx.reference"] = times.get("onnx.reference")
    table.add(f"{label}, per node, every node run", {n: (t / n_nodes if t else None) for n, t in t_every.items()})

    # onnx_mini: split a run of every node into input binding, the executor loop and the kernels.
    if every["onnx_mini"].ok:
        try:
            _chain_breakdown(every["onnx_mini"].obj.plan, feeds, n_nodes, reps, t_every["onnx_mini"], table)
        except Exception as e:
            table.notes.append(f"{label}: onnx_mini breakdown failed - {short(e)}")


def _chain_breakdown(plan, feeds: dict, n_nodes: int, reps: int, t_run: float | None, table: Table) -> None:
    steps = plan.steps
    if len(steps) != n_nodes:
        table.notes.append(f"chain: onnx_mini plan has {len(steps)} steps, not {n_nodes} "
                           "(something was constant-folded or fused)")
    # Pre-bind every step's arguments by walking the plan once, exactly as execute() does.
    slots = bind_inputs(plan, feeds)
    bound = []
    for fn, ins, out, _frees in steps:
        args = tuple(slots[i] for i in ins)
        result = fn(*args)
        bound.append((fn, args))
        if out.__class__ is int:
            slots[out] = result
        else:
            for o, v in zip(out, result):
                slots[o] = v

    def direct():
        for fn, args in bound:
            fn(*args)

    per_sample = 20
    t_bind = measure(lambda: bind_inputs(plan, feeds), reps, min_sample=0.005)
    t_exec = measure_batch(lambda: bind_inputs(plan, feeds), lambda s: execute(plan, s), reps,
                           per_sample=per_sample)
    t_direct = measure(direct, reps, min_sample=MIN_SAMPLE[False])
    overhead = t_exec - t_direct
    by_op: dict[str, list] = {}
    for (fn, args), info in zip(bound, plan.infos):
        by_op.setdefault(info.op_type, []).append((fn, args))
    op_times = {}
    for op, items in by_op.items():
        def calls(items=items):
            for fn, args in items:
                fn(*args)
        op_times[op] = measure(calls, reps, min_sample=0.01) / len(items)

    lines = [
        f"onnx_mini breakdown (per node, {len(steps)} plan steps): "
        f"run() {fmt_time(t_run / n_nodes if t_run else None)} = "
        f"execute() {fmt_time(t_exec / n_nodes)} + rest (bind_inputs, output tuple; difference of two medians) "
        f"{fmt_time((t_run - t_exec) / n_nodes) if t_run else 'n/a'}",
        f"  kernels called directly with pre-bound args: {fmt_time(t_direct / n_nodes)}; "
        f"executor overhead = execute() - direct = {fmt_time(overhead / n_nodes)} per node "
        f"({100 * overhead / t_exec:.0f}% of execute())",
        f"  bind_inputs(): {fmt_time(t_bind)} per run; kernel cost by op: "
        + ", ".join(f"{op} {fmt_time(t)}" for op, t in op_times.items()),
    ]
    for line in lines:
        print("  " + line)
    table.notes.extend(lines)


# -- case 2: GatherElements -----------------------------------------------------------------------

def case_gather(table: Table, quick: bool, n: int = 2048) -> None:
    print(f"\n[2. GatherElements] float32[{n},{n}], int64 indices in [-{n}, {n})", flush=True)
    reps, min_sample = REPEATS["gather"][quick], MIN_SAMPLE[quick]
    rng = np.random.default_rng(2)
    data = rng.standard_normal((n, n)).astype(np.float32)
    indices = rng.integers(-n, n, size=(n, n), dtype=np.int64)
    feeds = {"data": data, "indices": indices}
    for axis in (0, 1):
        label = f"2. GatherElements {n}x{n} axis={axis}"
        model = gather_model(axis, (n, n))
        runners = make_runners(model)
        outs = {name: r.try_run(feeds) for name, r in runners.items()}
        if outs["onnxruntime"] is not None:
            check_against(runners, outs, "onnxruntime", table.notes, label)
            if runners["onnx_mini"].ok:
                print(f"  axis={axis}: onnx_mini output equals onnxruntime's (np.array_equal): True")
        else:
            # No onnxruntime to compare with: check onnx_mini against numpy itself.
            expected = np.take_along_axis(data, np.where(indices < 0, indices + n, indices), axis=axis)
            got = outs["onnx_mini"]
            if got is not None and not np.array_equal(got[0], expected):
                runners["onnx_mini"].error = "output differs from np.take_along_axis - not timed"
            table.notes.append(f"{label}: onnxruntime unavailable, onnx_mini checked against np.take_along_axis")
        times = {name: r.time(feeds, reps, min_sample) for name, r in runners.items()}
        table.add(label, times)
        runner_notes(table, label, runners)
        # onnx_mini (numpy) uses one core; onnxruntime uses all by default. Show its one-thread time too.
        if ort is not None and runners["onnxruntime"].ok and times["onnxruntime"] is not None:
            one = Runner("onnxruntime", model, intra_op_num_threads=1)
            t1 = one.time(feeds, reps, min_sample) if one.try_run(feeds) is not None else None
            msg = (f"{label}: onnxruntime with intra_op_num_threads=1: {fmt_time(t1)}"
                   + (f" (onnx_mini/ort = {fmt_ratio(times['onnx_mini'], t1)})" if t1 else ""))
            print("  " + msg)
            table.notes.append(msg)
        del runners, outs
        gc.collect()


# -- case 3: Shape/Reshape on 64 MB ---------------------------------------------------------------

def case_reshape(table: Table, quick: bool, shape=(4096, 4096), round_trips: int = 4) -> None:
    n_nodes = 3 * round_trips
    label = f"3. Shape/Reshape x{n_nodes} on 64 MB"
    print(f"\n[{label}] float32{list(shape)} <-> ({math.prod(shape)},), {round_trips} round trips "
          f"({2 * round_trips} Reshape + {round_trips} Shape nodes)", flush=True)
    reps, min_sample = REPEATS["reshape"][quick], MIN_SAMPLE[quick]
    model = reshape_model(shape, round_trips)
    x = np.random.default_rng(3).standard_normal(shape, dtype=np.float32)
    feeds = {"x": x}
    runners = make_runners(model)
    outs = {name: r.try_run(feeds) for name, r in runners.items()}
    for name, out in outs.items():
        if out is not None and not (out[0].shape == x.shape and np.array_equal(out[0], x)):
            runners[name].error = "output is not equal to the input - not timed"
    times = {name: r.time(feeds, reps, min_sample) for name, r in runners.items()}
    table.add(label, times)
    runner_notes(table, label, runners)

    shares = {name: (bool(np.shares_memory(out[0], x)) if out is not None else None) for name, out in outs.items()}
    peaks = {}
    for name in ("onnx_mini", "onnx.reference"):   # numpy allocations are visible to tracemalloc
        r = runners[name]
        if not r.ok:
            peaks[name] = None
            continue
        gc.collect()
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            result = r.call(feeds)
            peaks[name] = tracemalloc.get_traced_memory()[1] - base
            del result
        except Exception:
            peaks[name] = None
        finally:
            tracemalloc.stop()
    line = ("output shares memory with the input (np.shares_memory): "
            + ", ".join(f"{n} {'n/a' if s is None else s}" for n, s in shares.items())
            + f"; peak extra memory of one run (tracemalloc, input is {fmt_bytes(x.nbytes)}): "
            + ", ".join(f"{n} {fmt_bytes(p)}" for n, p in peaks.items())
            + " (onnxruntime's own allocator is invisible to tracemalloc)")
    print("  " + line)
    table.notes.append(f"{label}: {line}")


# -- case 4: control flow -------------------------------------------------------------------------

def _body_from_python(rep, feeds: dict, kind: str) -> Callable[[], list]:
    """What an application without Loop/Scan would do: the body, prepared once as a model of its own,
    run once per iteration from a Python loop (its scan output kept in a list)."""
    if kind == "scan":
        h0, xs = feeds["h0"], feeds["xs"]

        def run():
            h, ys = h0, []
            for t in range(xs.shape[0]):
                h, y = rep.run([h, xs[t]])
                ys.append(y)
            return [h, ys]
    else:
        x0, n, cond = feeds["x0"], int(feeds["M"]), np.array(True)

        def run():
            x, ys = x0, []
            for i in range(n):
                _, x, y = rep.run([np.array(i, np.int64), cond, x])
                ys.append(y)
            return [x, ys]
    return run


def case_control_flow(table: Table, quick: bool) -> None:
    blocks, per_block = BLOCKS["control"][quick]
    cases = [("elementwise", "4. Loop x100, elementwise body (2 nodes, float32[16])"),
             ("gru", "4. Loop x100, GRU-cell body (3 MatMul [1,64]x[64,64])"),
             ("scan", "4. Scan x100, RNN cell (2 MatMul, [1,32] state)")]
    print(f"\n[4. control flow] {blocks} alternating blocks of {per_block} calls per runtime, "
          f"{PAUSE} s pause before each; onnxruntime on 2 threads", flush=True)
    for kind, label in cases:
        model, body, feeds = scan_models() if kind == "scan" else loop_models(kind)
        runners = {"onnx_mini": Runner("onnx_mini", model),
                   "onnxruntime": Runner("onnxruntime", model, intra_op_num_threads=2),
                   "onnx.reference": Runner("onnx.reference", model)}
        outs = {n: r.try_run(feeds) for n, r in runners.items()}
        from_python = Runner("onnx_mini", body)
        body_run = _body_from_python(from_python.obj, feeds, kind) if from_python.ok else None
        mine = outs["onnx_mini"]
        if body_run is not None and mine is not None:
            state, ys = body_run()
            if not (np.allclose(mine[0], state, rtol=1e-5, atol=1e-6) and np.allclose(mine[1], np.stack(ys),
                                                                                     rtol=1e-5, atol=1e-6)):
                body_run = None
                table.notes.append(f"{label}: the body run from Python DIFFERS from the node's outputs - not timed")
        for name, out in outs.items():       # float products may round apart: a tolerance, not equality
            if name == "onnx_mini" or out is None or mine is None:
                continue
            shapes = [(np.shape(a), np.shape(b)) for a, b in zip(mine, out) if np.shape(a) != np.shape(b)]
            if shapes:
                runners[name].error = (f"output shape {list(shapes[0][1])} where onnx_mini gives "
                                       f"{list(shapes[0][0])} - not timed")
            elif not all(np.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(mine, out)):
                runners[name].error = "output differs from onnx_mini's beyond rtol 1e-4 - not timed"
        errors: dict[str, str] = {}
        fns = {n: (lambda r=r: r.call(feeds)) if r.ok else None for n, r in runners.items()}
        fns["body x100"] = body_run
        times = alternating(fns, blocks, per_block, errors)
        for name, err in errors.items():
            if name in runners:
                runners[name].error = err
            else:
                table.notes.append(f"{label}: {name} n/a - {err}")
        table.add(label, {n: times.get(n) for n in RUNTIMES})
        runner_notes(table, label, runners)
        mini, body_x100 = times["onnx_mini"], times["body x100"]
        line = (f"{label}: onnx_mini {fmt_time(mini)}, the body run 100 times from Python {fmt_time(body_x100)}: "
                f"node / (body x100) = {fmt_ratio(mini, body_x100)} (bar: 1.3x); onnx_mini / onnxruntime "
                f"(2 threads) = {fmt_ratio(mini, times['onnxruntime'])}")
        print("  " + line, flush=True)
        table.notes.append(line)
        del runners, outs, from_python
        gc.collect()


def decode_model(layers: int = 6, d: int = 768, seed: int = 6) -> onnx.ModelProto:
    """x [1, d] -> per layer: qkv = x W0, a = x + qkv[:, :d] W1, y = a + tanh(x W2) W3 (the shapes of a
    GPT-2-small decoder step's products, weights N(0, 0.02^2)); the attention itself left out."""
    rng = np.random.default_rng(seed)
    nodes, inits, prev = [], [], "x"
    inits += [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (("lo", [0]), ("hi", [d]), ("ax", [1]))]
    for i in range(layers):
        for j, (k, n) in enumerate(((d, 3 * d), (d, d), (d, 4 * d), (4 * d, d))):
            inits.append(numpy_helper.from_array((rng.standard_normal((k, n)) * 0.02).astype(np.float32), f"w{i}_{j}"))
        nodes += [helper.make_node("MatMul", [prev, f"w{i}_0"], [f"qkv{i}"]),
                  helper.make_node("Slice", [f"qkv{i}", "lo", "hi", "ax"], [f"q{i}"]),
                  helper.make_node("MatMul", [f"q{i}", f"w{i}_1"], [f"o{i}"]),
                  helper.make_node("Add", [prev, f"o{i}"], [f"a{i}"]),
                  helper.make_node("MatMul", [prev, f"w{i}_2"], [f"u{i}"]),
                  helper.make_node("Tanh", [f"u{i}"], [f"t{i}"]),
                  helper.make_node("MatMul", [f"t{i}", f"w{i}_3"], [f"m{i}"]),
                  helper.make_node("Add", [f"a{i}", f"m{i}"], [f"y{i}"])]
        prev = f"y{i}"
    return make_model(nodes, [_vi("x", TensorProto.FLOAT, [1, d])], [_vi(prev, TensorProto.FLOAT, [1, d])],
                      inits, "decode")


def case_decode(table: Table, quick: bool) -> None:
    from onnx_mini import blas
    blocks, per_block = BLOCKS["decode"][quick]
    label = "5. decoder step, 24 MatMul [1,768] x 170 MB float32"
    print(f"\n[{label}] {blocks} alternating blocks of {per_block} calls per runtime, {PAUSE} s pause "
          "before each; onnxruntime on 2 threads", flush=True)
    model = decode_model()
    feeds = {"x": np.random.default_rng(1).standard_normal((1, 768)).astype(np.float32)}
    runners = {"onnx_mini": Runner("onnx_mini", model), "onnxruntime": Runner("onnxruntime", model,
                                                                              intra_op_num_threads=2)}
    kept = blas.LAYOUT_MIN_BYTES
    blas.LAYOUT_MIN_BYTES = math.inf           # every matrix as the loader made it (C order)
    try:
        as_loaded = Runner("onnx_mini", model)
    finally:
        blas.LAYOUT_MIN_BYTES = kept
    mine = runners["onnx_mini"].try_run(feeds)
    for name, r in (("onnxruntime", runners["onnxruntime"]), ("as loaded", as_loaded)):
        out = r.try_run(feeds)
        if out is not None and mine is not None and not np.allclose(out[0], mine[0], rtol=1e-4, atol=1e-4):
            r.error = "output differs from onnx_mini's beyond rtol 1e-4 - not timed"
    for r in (runners["onnx_mini"], as_loaded):
        r.settle(feeds)
    errors: dict[str, str] = {}
    fns = {n: (lambda r=r: r.call(feeds)) if r.ok else None for n, r in runners.items()}
    fns["as loaded"] = (lambda: as_loaded.call(feeds)) if as_loaded.ok else None
    times = alternating(fns, blocks, per_block, errors)
    for name, err in errors.items():
        (runners[name] if name in runners else as_loaded).error = err
    table.add(label, {"onnx_mini": times["onnx_mini"], "onnxruntime": times["onnxruntime"], "onnx.reference": None})
    runner_notes(table, label, runners)
    line = (f"{label}: onnx_mini {fmt_time(times['onnx_mini'])}, with the matrices in the loader's order "
            f"{fmt_time(times['as loaded'])} ({fmt_ratio(times['onnx_mini'], times['as loaded'])}), onnxruntime "
            f"{fmt_time(times['onnxruntime'])}: onnx_mini / onnxruntime {fmt_ratio(times['onnx_mini'], times['onnxruntime'])}"
            f" (as loaded: {fmt_ratio(times['as loaded'], times['onnxruntime'])})")
    if as_loaded.error:
        line += f"; as loaded n/a - {as_loaded.error}"
    print("  " + line, flush=True)
    table.notes.append(line)
    table.notes.append(f"{label}: onnx.reference not run (its products are numpy's own, as onnx_mini's)")
    del runners, as_loaded
    gc.collect()


# -- main -----------------------------------------------------------------------------------------

def machine_info() -> str:
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for ln in f:
                if ln.startswith("model name"):
                    cpu = ln.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return (f"python {platform.python_version()}, numpy {np.__version__}, onnx {onnx.__version__}, "
            f"onnxruntime {ort.__version__ if ort is not None else 'n/a'}, onnx_mini {onnx_mini.__version__}, "
            f"CPU count {os.cpu_count()}" + (f" ({cpu})" if cpu else "") + f", {platform.system()} {platform.machine()}"
            f", ONNX_MINI_MALLOC={onnx_mini.memory.MALLOC}"
            + (" (glibc malloc tuned at the first run)" if onnx_mini.memory.MALLOC == "tuned" else ""))


def speed_probe() -> dict[str, float]:
    """This machine's speed now, in ~50 ms: a pure-Python loop (ns an iteration), a numpy ufunc call on a
    tiny array (ns a call) and float32 tanh (ns a value), medians of a few repeats. The load average misses
    what slows this VM most (a 3M-iteration Python loop took 268 and 401 ms a minute apart, nothing else
    of ours running, /proc/stat's steal time under 1%), and onnx_mini's small-model times follow the first
    two where onnxruntime's C++ moves less; bench_apps and bench_suite print it at their start and end."""
    def per(fn, n, reps=5):
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return statistics.median(times) / n * 1e9

    def loop():
        s = 0
        for i in range(100_000):
            s += i

    tiny, zero = np.ones(16, np.float32), np.zeros(16, np.float32)
    wide = np.linspace(-3, 3, 16384, dtype=np.float32)
    out = np.empty_like(wide)

    def calls():
        for _ in range(5_000):
            np.add(tiny, zero, out=tiny)

    def tanh():
        for _ in range(10):
            np.tanh(wide, out=out)
    return {"python_loop_ns": per(loop, 100_000), "numpy_call_ns": per(calls, 5_000),
            "tanh_f32_ns": per(tanh, 10 * wide.size)}


def speed_text(probe: dict[str, float]) -> str:
    return (f"python loop {probe['python_loop_ns']:.0f} ns/iteration, numpy tiny call {probe['numpy_call_ns']:.0f} ns, "
            f"float32 tanh {probe['tanh_f32_ns']:.2f} ns/value")


def report(table: "Table", quick: bool, start: float, extra: str = "",
           what: str = "median of repeats after warm-up") -> None:
    """The closing report every benchmark script prints: the table, `extra` lines, notes, total time."""
    print(f"\nResults ({'quick' if quick else 'full'} run; {what}; "
          "mini/ort = onnx_mini time / onnxruntime time, ref/mini = onnx.reference time / onnx_mini time)")
    print("machine:", machine_info())
    print(table.render())
    if extra:
        print(extra)
    print_findings(None, [], table.notes)
    print(f"\ntotal benchmark time: {time.perf_counter() - start:.1f} s")


def print_findings(bars_title: str | None, bars: list[str], notes: list[str]) -> None:
    """The bars a script measured (under `bars_title`) and its notes, one " - " line each."""
    for title, lines in ((bars_title, bars), ("Notes", notes)):
        if lines:
            print(f"\n{title}:")
            for line in lines:
                print(" - " + line)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer repetitions (under ~40 s)")
    cases = {"chain": case_chain, "gather": case_gather, "reshape": case_reshape, "control": case_control_flow,
             "decode": case_decode}
    p.add_argument("--only", choices=sorted(cases), action="append", help="run only this case (repeatable)")
    args = p.parse_args(argv)
    start = time.perf_counter()
    print("machine:", machine_info())
    if ORT_IMPORT_ERROR:
        print(f"note: onnxruntime unavailable ({ORT_IMPORT_ERROR}); its column is n/a")
    if REF_IMPORT_ERROR:
        print(f"note: onnx.reference unavailable ({REF_IMPORT_ERROR}); its column is n/a")
    table = Table()
    for case in [cases[c] for c in args.only] if args.only else cases.values():
        try:
            case(table, args.quick)
        except Exception as e:   # keep going: one broken case must not hide the others
            table.notes.append(f"{case.__name__} aborted: {short(e, 300)}")
            print(f"  {case.__name__} aborted: {short(e, 300)}", flush=True)
        gc.collect()

    report(table, args.quick, start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
