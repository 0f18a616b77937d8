"""Benchmark suite: latency and peak memory of onnx_mini vs onnxruntime vs onnx.reference on real models.

    .venv/bin/python benchmarks/bench_suite.py               # full run (~15 min)
    .venv/bin/python benchmarks/bench_suite.py --quick       # fewer repetitions (~5 min)
    .venv/bin/python benchmarks/bench_suite.py --only bert   # only the cases whose name contains it (repeatable)
    .venv/bin/python benchmarks/bench_suite.py --no-memory   # everything in this process, latency only (faster)
    .venv/bin/python benchmarks/bench_suite.py --chart-from benchmarks/results/bench_suite.json   # chart only
    .venv/bin/python benchmarks/bench_suite.py --blas-threads 1   # diagnostic: numpy's BLAS on one thread

Cases: (a) the nine light models of the onnx package ([1,3,224,224]); (b) the models benchmarks/models.py
builds (BERT-style encoder, GRU, LSTM, MobileNet-like CNN, small U-Net, 500-tree ensemble); (c) the light
ResNet-50 with a symbolic batch dim, at batch 1, 8 and 32.

Each (case, runtime) runs in its own subprocess (unless --no-memory). The parent builds the model once and
saves it (.onnx) with its feeds (.npz) to a temporary directory. The child imports numpy, onnx, onnx_mini,
onnxruntime and onnx.reference (bench_core imports them all), loads the model and feeds from those files
(for onnxruntime it also serializes the model to bytes there, so that transient copy is not charged to it),
runs gc, then reads VmRSS from /proc/self/status as the BASELINE and resets
the kernel's high-water mark (writes "5" to /proc/self/clear_refs, so VmHWM restarts at the current RSS).
It then creates the runtime (onnx_mini.prepare / InferenceSession / ReferenceEvaluator), runs once (the
output is saved for the cross-check), then the timed runs. PEAK MEMORY = VmHWM at the end - BASELINE:
the largest extra resident memory the runtime needed for its setup (weights, plans, folded constants)
plus running the model, on top of what the process held before it. Where clear_refs cannot be written,
VmHWM is not reset and the figure is flagged "(no reset)".

Latency = median seconds per run after warm-up (bench_core.measure); a full run measures onnx_mini and
onnxruntime in 3 rounds, taking turns (--rounds), and reports the median round, so that a slow spell
of this shared VM (single runs move 2x) does not fall on one runtime only. onnxruntime runs with
intra_op_num_threads=2 (this machine's core count, also its default); onnx_mini with its defaults but
ONNX_MINI_MALLOC=tuned (bench_core sets it, see benchmarks/README.md).
Outputs of onnx_mini and onnx.reference are compared with onnxruntime's (max |diff| <= 1e-3 of the
output's max |value|) and any difference is flagged. onnx.reference is skipped where one run would take
too long (resnet50 at batch 8 and 32: ~8x and ~32x its batch-1 time; the 500-tree ensemble: ~50 s a run);
where it is slow it gets a single timed run. Writes benchmarks/results/bench_suite.json and (with
matplotlib, imported lazily) bench_suite.png; a run with --only writes neither.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
RUNTIMES = ("onnx_mini", "onnxruntime", "onnx.reference")
ORT_THREADS = 2
TOL = 1e-3

# (repeats, min seconds per timed sample) for onnx_mini / onnxruntime, and repeats for onnx.reference
REPEATS = {False: 15, True: 5}
MIN_SAMPLE = {False: 0.05, True: 0.01}
REF_REPEATS = {False: 3, True: 1}
SLOW_RUN = {False: 3.0, True: 1.0}          # onnx_mini/onnxruntime first run slower than this: 1 to 3 samples
SLOW_BUDGET = {False: 30.0, True: 10.0}
REF_SLOW = {False: 4.0, True: 2.0}          # a first reference run slower than this: one timed run only
CHILD_TIMEOUT = {False: 400, True: 200}     # seconds per (case, runtime) subprocess
BATCHES = (1, 8, 32)


# -- cases ----------------------------------------------------------------------------------------

@dataclass
class Case:
    name: str
    group: str                    # "light", "built", "batch"
    label: str
    skip_ref: str = ""            # why onnx.reference is not run ("" = run it)
    batch: int = 1


def _cases() -> list[Case]:
    import bench_models
    import models
    out = [Case(n, "light", f"{n} [1,3,224,224]") for n in bench_models.MODELS]
    out += [Case(n, "built", models.DESCRIPTIONS[n],
                 skip_ref="walks the 500 trees in Python: ~50 s per run on 1000 rows, measured" if n == "trees"
                 else "") for n in models.BUILDERS]
    for b in BATCHES:
        out.append(Case(f"resnet50_b{b}", "batch", f"resnet50 batch {b} (symbolic batch dim)", batch=b,
                        skip_ref="" if b == 1 else f"one run would take ~{b}x its batch-1 time"))
    return out


def resnet50_batched(batch: int):
    """Light ResNet-50 with the input's first dim made symbolic ('N') in a copy of the proto.

    The graph's final Reshape has the constant shape [1, 2048] (initializer OC2_DUMMY_1); it is rewritten
    to [-1, 2048] as well, or no runtime could run batch > 1. The output's first dim becomes 'N' too."""
    import bench_models
    import numpy as np
    import onnx
    from onnx import numpy_helper
    base, _ = bench_models.load("resnet50")
    model = onnx.ModelProto()
    model.CopyFrom(base)
    g = model.graph
    inits = {i.name for i in g.initializer}
    inp = next(i for i in g.input if i.name not in inits)
    for v in (inp, g.output[0]):
        d0 = v.type.tensor_type.shape.dim[0]
        d0.Clear()
        d0.dim_param = "N"
    for k, init in enumerate(g.initializer):
        if init.name == "OC2_DUMMY_1":
            g.initializer[k].CopyFrom(numpy_helper.from_array(np.array([-1, 2048], np.int64), init.name))
    shape = [batch] + [d.dim_value for d in inp.type.tensor_type.shape.dim[1:]]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    return model, {inp.name: x}


def build(case: Case):
    import bench_models
    import models
    if case.group == "light":
        return bench_models.load(case.name)
    if case.group == "built":
        return models.BUILDERS[case.name]()
    return resnet50_batched(case.batch)


# -- one measurement (runs in the child) ----------------------------------------------------------

def _status() -> dict[str, int]:
    out = {}
    try:
        with open("/proc/self/status") as f:
            for ln in f:
                if ln.startswith(("VmRSS:", "VmHWM:")):
                    k, v = ln.split(":", 1)
                    out[k] = int(v.split()[0]) * 1024
    except OSError:
        pass
    return out


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class _Serialized:
    """Stands in for a ModelProto whose bytes were made before the baseline (onnxruntime's Runner only
    calls SerializeToString), so that the transient copy is not charged to onnxruntime's peak."""

    def __init__(self, blob: bytes):
        self.blob = blob

    def SerializeToString(self) -> bytes:  # noqa: N802 (protobuf's name)
        return self.blob


def load_case(model_path: str, feeds_path: str):
    import numpy as np
    import onnx
    model = onnx.load(model_path)
    with np.load(feeds_path) as z:
        feeds = {k: z[k] for k in z.files}
    return model, feeds


def measure_one(case: Case, runtime: str, quick: bool, memory: bool, out_path: str | None, model_feeds) -> dict:
    """model_feeds: (ModelProto, feeds), or (model path, feeds path) saved by the parent."""
    import numpy as np
    import bench_core as core
    res: dict = {"case": case.name, "runtime": runtime}
    model, feeds = model_feeds if not isinstance(model_feeds[0], str) else load_case(*model_feeds)
    if runtime == "onnxruntime":
        model = _Serialized(model.SerializeToString())
    if memory:
        gc.collect()
        base = _status().get("VmRSS")
        res["hwm_reset"] = _reset_hwm()
    opts = {"intra_op_num_threads": ORT_THREADS} if runtime == "onnxruntime" else {}
    runner = core.Runner(runtime, model, **opts)
    res["setup_s"] = runner.setup_time
    t0 = time.perf_counter()
    out = runner.try_run(feeds)
    first = time.perf_counter() - t0
    res["first_run_s"] = first
    if out is not None:
        if out_path:
            np.savez(out_path, *[np.asarray(o) for o in out])
        else:
            res["outputs"] = out
        try:
            if runtime == "onnx.reference":
                slow = first > REF_SLOW[quick]
                res["ref_slow"] = slow
                if slow and quick:      # the first run is the measurement (it has no warm-up to speak of)
                    res["timed_runs"], res["latency_s"] = 0, first
                else:
                    res["timed_runs"] = 1 if slow else REF_REPEATS[quick]
                    res["latency_s"] = core.measure(lambda: runner.call(feeds), res["timed_runs"],
                                                    warmup=0 if slow else 1, min_sample=0.0, max_seconds=60)
            else:                       # the first run above was a warm-up already
                runner.settle(feeds)    # onnx_mini: its BLAS mode chosen (at most 5 s)
                slow = first > SLOW_RUN[quick]      # seconds-long runs: fewer samples, within ~SLOW_BUDGET s
                reps = max(1, min(3, int(SLOW_BUDGET[quick] / first))) if slow else REPEATS[quick]
                res["timed_runs"] = reps if slow else None
                res["latency_s"] = core.measure(lambda: runner.call(feeds), reps,
                                                warmup=(0 if slow else 1) if quick else 2,
                                                min_sample=MIN_SAMPLE[quick])
        except Exception as e:
            runner.error = f"timing failed: {core.short(e)}"
    res["error"] = runner.error
    if memory and base is not None and res.get("latency_s") is not None:   # a failed runtime has no figure
        st = _status()
        res["peak_bytes"] = st["VmHWM"] - base if "VmHWM" in st else None
        res["baseline_bytes"] = base
    return res


def child_main(args) -> int:
    case = next(c for c in _cases() if c.name == args.case)
    res = measure_one(case, args.runtime, args.quick, memory=True, out_path=args.out,
                      model_feeds=(args.model, args.feeds))
    print("RESULT " + json.dumps(res), flush=True)
    return 0


# -- parent ---------------------------------------------------------------------------------------

def save_case(case: Case, model_feeds, tmp: str) -> tuple[str, str]:
    import numpy as np
    import onnx
    model, feeds = model_feeds
    paths = os.path.join(tmp, f"{case.name}.onnx"), os.path.join(tmp, f"{case.name}.feeds.npz")
    onnx.save(model, paths[0])
    np.savez(paths[1], **feeds)
    return paths


def run_child(case: Case, runtime: str, quick: bool, tmp: str, paths: tuple[str, str]) -> tuple[dict, list | None]:
    import numpy as np
    out_path = os.path.join(tmp, f"{case.name}.{runtime}.npz")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--case", case.name, "--runtime", runtime,
           "--model", paths[0], "--feeds", paths[1], "--out", out_path] + (["--quick"] if quick else [])
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=CHILD_TIMEOUT[quick])
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {CHILD_TIMEOUT[quick]} s (subprocess killed)"}, None
    line = next((ln for ln in reversed(p.stdout.splitlines()) if ln.startswith("RESULT ")), None)
    if line is None:
        tail = " ".join((p.stderr or p.stdout).strip().splitlines()[-3:])
        return {"error": f"child exited {p.returncode}: {tail[-300:]}"}, None
    res = json.loads(line[len("RESULT "):])
    outs = None
    if os.path.exists(out_path):
        with np.load(out_path) as z:
            outs = [z[f"arr_{i}"] for i in range(len(z.files))]
        os.remove(out_path)
    return res, outs


def run_inprocess(case: Case, runtime: str, quick: bool, model_feeds) -> tuple[dict, list | None]:
    try:
        res = measure_one(case, runtime, quick, memory=False, out_path=None, model_feeds=model_feeds)
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}, None
    return res, res.pop("outputs", None)


def rel_err(a: list, b: list) -> float:
    import numpy as np
    if len(a) != len(b):
        return math.inf
    worst = 0.0
    for x, y in zip(a, b):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        if x.shape != y.shape:
            return math.inf
        if y.size:
            worst = max(worst, float(np.abs(x - y).max()) / max(float(np.abs(y).max()), 1e-6))
    return worst


def softmax_inputs_err(model_feeds, runtime: str):
    """For a model whose outputs are all Softmax results: (the max relative error of `runtime`'s Softmax
    inputs against onnxruntime's, the largest of those inputs' magnitudes), run once in this process on
    a copy of the model whose outputs are the Softmax inputs; None for other models or a failed run.
    The light models have random weights and take random inputs: ResNet-50's logits reach ~1e19, where
    the order of a product's sums (the batch, the BLAS threads) moves them by float32 rounding and the
    Softmax of the near-ties that leaves then differs by O(1)."""
    import numpy as np
    import onnx
    import bench_core as core
    model, feeds = model_feeds if not isinstance(model_feeds[0], str) else load_case(*model_feeds)
    producer = {o: n for n in model.graph.node for o in n.output}
    nodes = [producer.get(o.name) for o in model.graph.output]
    if not nodes or any(n is None or n.op_type != "Softmax" or n.domain not in ("", "ai.onnx") for n in nodes):
        return None
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    del copy.graph.output[:]
    for n in nodes:
        copy.graph.output.append(onnx.helper.make_empty_tensor_value_info(n.input[0]))
    try:
        got = core.Runner(runtime, copy).call(feeds)
        want = core.Runner("onnxruntime", _Serialized(copy.SerializeToString()),
                           intra_op_num_threads=ORT_THREADS).call(feeds)
    except Exception:
        return None
    return rel_err(got, want), max(float(np.abs(np.asarray(w, np.float64)).max()) for w in want)


def geomean(values) -> float | None:
    values = [v for v in values if v]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def _ratio(a, b):
    return a / b if a and b else None


def render(rows: list[dict], memory: bool) -> str:
    import bench_core as core
    head = ["case", "onnx_mini", "onnxruntime", "onnx.reference", "mini/ort", "ref/mini"]
    if memory:
        head += ["mini peak", "ort peak", "ref peak", "mem mini/ort"]
    body = []
    for r in rows:
        t = r["latency"]
        m, o, f = (t.get(n) for n in RUNTIMES)
        ratio = core.fmt_ratio(m, o) + ("!" if r.get("mini_differs") else "")
        cells = [r["name"], core.fmt_time(m), core.fmt_time(o), core.fmt_time(f), ratio, core.fmt_ratio(f, m)]
        if memory:
            p = r["peak"]
            cells += [core.fmt_bytes(p.get(n)) for n in RUNTIMES] + [core.fmt_ratio(p.get("onnx_mini"),
                                                                                    p.get("onnxruntime"))]
        body.append(cells)
    widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]

    def line(row):
        return "| " + " | ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))) + " |"
    return "\n".join([line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, body)])


def summary(rows: list[dict], memory: bool) -> list[str]:
    """The issue's bars, measured."""
    out = []
    by = {g: [r for r in rows if r["group"] == g] for g in ("light", "built", "batch")}

    def lat_ratios(rs):
        return {r["name"]: _ratio(r["latency"].get("onnx_mini"), r["latency"].get("onnxruntime"))
                for r in rs if not r.get("mini_differs")}

    def ref_ratios(rs):
        return [_ratio(r["latency"].get("onnx.reference"), r["latency"].get("onnx_mini")) for r in rs]

    for g, bar, what in (("light", 2.0, "light models"), ("built", 3.0, "built models")):
        rs = lat_ratios(by[g])
        gm = geomean(rs.values())
        if gm is None:
            continue
        n = sum(1 for v in rs.values() if v)
        out.append(f"{what}: geomean onnx_mini/onnxruntime = {gm:.2f}x over {n} models "
                   f"(bar <= {bar:.1f}: {'MET' if gm <= bar else 'NOT MET'})")
        gr = geomean(ref_ratios(by[g]))
        if gr:
            out.append(f"{what}: geomean onnx.reference/onnx_mini = {gr:.1f}x over "
                       f"{sum(1 for v in ref_ratios(by[g]) if v)} models")
        if g == "light":
            over = {k: v for k, v in rs.items() if v and v > 3.0}
            out.append("light models above 3.0x: " + (", ".join(f"{k} {v:.2f}x" for k, v in over.items())
                                                       if over else "none") + " (bar: none)")
    if memory and by["light"]:
        mem = {r["name"]: _ratio(r["peak"].get("onnx_mini"), r["peak"].get("onnxruntime")) for r in by["light"]}
        vals = [v for v in mem.values() if v]
        if vals:
            over = {k: v for k, v in mem.items() if v and v > 1.5}
            out.append(f"light models peak memory onnx_mini/onnxruntime: geomean {geomean(vals):.2f}x, max "
                       f"{max(vals):.2f}x; above 1.5x: " + (", ".join(f"{k} {v:.2f}x" for k, v in over.items())
                                                            if over else "none") + " (bar: none above 1.5x)")
    bt = {r["batch"]: r for r in by["batch"]}
    if 1 in bt and max(bt) > 1:
        big = max(bt)
        for n in RUNTIMES:
            per = {b: r["latency"].get(n) / b for b, r in sorted(bt.items()) if r["latency"].get(n)}
            if not per:
                continue
            s = ", ".join(f"b{b} {v * 1e3:.2f} ms" for b, v in per.items())
            line = f"{n}: cost per sample {s}"
            if 1 in per and big in per:
                ok = per[big] <= per[1]
                line += f"; b{big}/b1 = {per[big] / per[1]:.2f}x"
                if n == "onnx_mini":
                    line += f" (bar: <= 1.00: {'MET' if ok else 'NOT MET'})"
            out.append(line)
    return out


def chart(payload: dict, path: Path) -> str:
    """Bar chart of onnx_mini / onnxruntime latency per case (log scale). Returns a message."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:
        return f"chart skipped: matplotlib not importable ({type(e).__name__}: {e}); pip install -e '.[bench]'"
    rows = [r for r in payload["rows"] if _ratio(r["latency"].get("onnx_mini"), r["latency"].get("onnxruntime"))]
    if not rows:
        return "chart skipped: no case with both onnx_mini and onnxruntime latencies"
    colors = {"light": "#4c72b0", "built": "#dd8452", "batch": "#55a868"}
    names = [r["name"] for r in rows]
    vals = [r["latency"]["onnx_mini"] / r["latency"]["onnxruntime"] for r in rows]
    fig, ax = plt.subplots(figsize=(max(8, 0.55 * len(rows) + 2), 5.2))
    bars = ax.bar(range(len(rows)), vals, color=[colors[r["group"]] for r in rows])
    for b, v, r in zip(bars, vals, rows):
        ax.text(b.get_x() + b.get_width() / 2, v * 1.04, f"{v:.2f}" + ("!" if r.get("mini_differs") else ""),
                ha="center", va="bottom", fontsize=7)
    ax.set_yscale("log")
    lo, hi = min(0.5, min(vals) / 1.3), max(4.0, max(vals) * 1.4)
    ax.set_ylim(lo, hi)
    ticks = [t for t in (0.1, 0.2, 0.5, 1, 2, 3, 5, 10, 20, 50, 100, 200, 500) if lo <= t <= hi]
    ax.set_yticks(ticks, [f"{t:g}x" for t in ticks])
    ax.minorticks_off()
    ax.axhline(1.0, color="black", lw=0.8)
    for y, ls, lab in ((2.0, "--", "light geomean bar 2.0"), (3.0, ":", "per-model bar 3.0 / built geomean bar")):
        ax.axhline(y, color="gray", lw=0.8, ls=ls, label=lab)
    ax.set_xticks(range(len(rows)), names, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("onnx_mini / onnxruntime latency (log scale, lower is better)")
    from matplotlib.patches import Patch
    handles = [Patch(color=c, label=f"{g} models" if g != "batch" else "resnet50 by batch")
               for g, c in colors.items()] + ax.get_legend_handles_labels()[0]
    ax.legend(handles=handles, fontsize=7, loc="upper left")
    ax.set_title(f"onnx_mini vs onnxruntime ({ORT_THREADS} threads), {payload['mode']} run, {payload['date']}"
                 + (f"\n{payload['load']}" if payload.get("load") else ""), fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"chart written: {path}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer repetitions (~5 min instead of ~15)")
    p.add_argument("--rounds", type=int, metavar="N",
                   help="measure onnx_mini and onnxruntime N times per case, taking turns, and report the "
                        "median round (default: 3, 1 with --quick): a slow spell of this machine then "
                        "falls on both runtimes instead of on one")
    p.add_argument("--only", action="append", default=[], metavar="NAME",
                   help="run only the cases whose name contains NAME (repeatable; e.g. light names, bert, resnet50_b)")
    p.add_argument("--no-memory", action="store_true",
                   help="no subprocesses: every runtime in this process, latency only")
    p.add_argument("--results", default=str(RESULTS), help="where bench_suite.json / .png go")
    p.add_argument("--chart-from", metavar="JSON", help="only draw the chart from a saved results file")
    p.add_argument("--blas-threads", type=int, metavar="N",
                   help="set OPENBLAS_NUM_THREADS/OMP_NUM_THREADS/MKL_NUM_THREADS=N for numpy (onnx_mini and "
                        "onnx.reference; onnxruntime uses its own kernels) - a diagnostic, not the default; "
                        "results go to bench_suite_blasN.json/.png")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--case", help=argparse.SUPPRESS)
    p.add_argument("--runtime", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--feeds", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    sys.path.insert(0, str(HERE))
    if args.child:
        return child_main(args)
    if args.chart_from:
        payload = json.loads(Path(args.chart_from).read_text())
        print(chart(payload, Path(args.chart_from).with_suffix(".png")))
        return 0

    if args.blas_threads:           # before numpy is imported here and inherited by the children
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(args.blas_threads)
    import bench_core as core
    start = time.perf_counter()
    memory = not args.no_memory
    mode = (("quick" if args.quick else "full") + ("" if memory else ", no memory")
            + (f", BLAS threads {args.blas_threads}" if args.blas_threads else ""))
    print("machine:", core.machine_info())
    print(f"mode: {mode}; onnxruntime intra_op_num_threads={ORT_THREADS}; "
          + ("each runtime in its own subprocess" if memory else "all runtimes in this process"), flush=True)
    load_start, speed_start = os.getloadavg(), core.speed_probe()
    print(f"load average at start (1/5/15 min): {load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f}")
    print("machine speed at start:", core.speed_text(speed_start))
    cases = [c for c in _cases() if not args.only or any(o in c.name for o in args.only)]
    rows, notes = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            print(f"\n[{case.name}] {case.label}", flush=True)
            try:     # built once here; with memory, saved for the children (a clean baseline: load only)
                model_feeds = build(case)
                paths = save_case(case, model_feeds, tmp) if memory else None
            except Exception as e:
                notes.append(f"{case.name}: build failed: {core.short(e, 300)}")
                print(f"  build failed: {core.short(e, 300)}", flush=True)
                continue
            row = {"name": case.name, "group": case.group, "label": case.label, "batch": case.batch,
                   "latency": {}, "peak": {}, "setup": {}}
            outs = {}
            rounds = {}     # runtime -> latency of each round
            for rnd in range(args.rounds):
                for rt in RUNTIMES:
                    if rt == "onnx.reference" and (case.skip_ref or rnd > 0):
                        if case.skip_ref and rnd == 0:
                            notes.append(f"{case.name}: onnx.reference skipped ({case.skip_ref})")
                        continue
                    t0 = time.perf_counter()
                    res, out = (run_child(case, rt, args.quick, tmp, paths) if memory
                                else run_inprocess(case, rt, args.quick, model_feeds))
                    wall = time.perf_counter() - t0
                    if res.get("error"):
                        notes.append(f"{case.name}: {rt} n/a - {res['error']}")
                    rounds.setdefault(rt, []).append(res.get("latency_s"))
                    peak = res.get("peak_bytes")
                    if rnd == 0 or (peak is not None and (row["peak"].get(rt) or 0) < peak):
                        row["peak"][rt] = peak              # the largest of the rounds
                    if rnd == 0:
                        row["setup"][rt] = res.get("setup_s")
                        outs[rt] = out
                    if memory and res.get("hwm_reset") is False:
                        notes.append(f"{case.name}: {rt}: VmHWM could not be reset (no reset): peak includes model load")
                    if rt == "onnx.reference" and res.get("ref_slow") and res.get("latency_s"):
                        notes.append(f"{case.name}: onnx.reference slow (first run {res['first_run_s']:.1f} s): "
                                     + ("that run is its time" if res.get("timed_runs") == 0 else "one timed run"))
                    if rt != "onnx.reference" and res.get("timed_runs") and rnd == 0:
                        notes.append(f"{case.name}: {rt} slow (first run {res['first_run_s']:.1f} s): "
                                     f"{res['timed_runs']} timed run(s) per round, no further warm-up")
                    print(f"  {rt:15s} latency {core.fmt_time(res.get('latency_s')):>10s}  "
                          + (f"peak {core.fmt_bytes(res.get('peak_bytes')):>9s}  " if memory else "")
                          + f"setup {core.fmt_time(res.get('setup_s')):>9s}  ({wall:.1f} s)"
                          + (f"  round {rnd + 1}" if args.rounds > 1 else "")
                          + (f"  {res['error']}" if res.get("error") else ""), flush=True)
            for rt, lat in rounds.items():     # the median of the rounds (a failed round: no figure)
                row["latency"][rt] = None if None in lat else statistics.median(lat)
                if len(lat) > 1:
                    row.setdefault("latency_rounds", {})[rt] = lat
            base = outs.get("onnxruntime")
            for rt in ("onnx_mini", "onnx.reference"):
                if outs.get(rt) is None:
                    continue
                if base is None:
                    notes.append(f"{case.name}: {rt} output not cross-checked (no onnxruntime output)")
                    continue
                err = rel_err(outs[rt], base)
                row.setdefault("rel_err", {})[rt] = err
                if err > TOL:
                    logits = softmax_inputs_err(model_feeds, rt) if rt == "onnx_mini" else None
                    if logits is not None and logits[0] <= TOL:
                        row.setdefault("logits_rel_err", {})[rt] = logits[0]
                        notes.append(f"{case.name}: {rt} output differs from onnxruntime (max rel err {err:.1e}), "
                                     f"its Softmax's input does not (max rel err {logits[0]:.1e}): logits up to "
                                     f"{logits[1]:.1e}, where float32 rounding decides the Softmax")
                        continue
                    notes.append(f"{case.name}: {rt} output DIFFERS from onnxruntime (max rel err {err:.1e})")
                    if rt == "onnx_mini":
                        row["mini_differs"] = True
            rows.append(row)
            if paths:
                for path in paths:
                    os.remove(path)
            del model_feeds
            gc.collect()

    print(f"\nResults ({mode} run; median latency per run; peak = VmHWM - VmRSS baseline after imports, model "
          "load and gc, per runtime in its own process; mini/ort = onnx_mini / onnxruntime, ref/mini = "
          "onnx.reference / onnx_mini; '!' = onnx_mini output differs)")
    print("machine:", core.machine_info())
    load_end, speed_end = os.getloadavg(), core.speed_probe()
    load = (f"load average (1/5/15 min) at start {load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f}, "
            f"at end {load_end[0]:.2f} {load_end[1]:.2f} {load_end[2]:.2f} (this machine has {os.cpu_count()} CPUs)")
    print(load)
    print(f"machine speed at start: {core.speed_text(speed_start)}; at end: {core.speed_text(speed_end)}")
    print(render(rows, memory))
    legend = [f"{r['name']} = {r['label']}" for r in rows if r["group"] != "light"]
    if any(r["group"] == "light" for r in rows):
        legend.append("light models: the onnx package's, [1,3,224,224]")
    print("cases: " + "; ".join(legend))
    bars = summary(rows, memory)
    core.print_findings("Bars of issue 9 (measured)", bars, notes)
    payload = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "mode": mode,
               "machine": core.machine_info(), "load": load, "speed": {"start": speed_start, "end": speed_end},
               "rows": rows, "bars": bars, "notes": notes}
    results = Path(args.results)
    if not args.only:       # a partial run does not overwrite the saved results
        results.mkdir(parents=True, exist_ok=True)
        stem = "bench_suite" + (f"_blas{args.blas_threads}" if args.blas_threads else "")
        (results / f"{stem}.json").write_text(json.dumps(payload, indent=1))
        print(f"\nresults written: {results / (stem + '.json')}")
        print(chart(payload, results / f"{stem}.png"))
    print(f"\ntotal benchmark time: {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
