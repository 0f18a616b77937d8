"""Application benchmarks of issue 22: the models applications run per request, per audio chunk or per
token, onnx_mini next to onnxruntime.

    .venv/bin/python benchmarks/bench_apps.py                 # full run (~3 min here)
    .venv/bin/python benchmarks/bench_apps.py --quick         # fewer, shorter blocks (~1.5 min)
    .venv/bin/python benchmarks/bench_apps.py --only vad --only skl_gbc   # cases whose name contains NAME
    .venv/bin/python benchmarks/bench_apps.py --chart-from benchmarks/results/bench_apps.json

The models (benchmarks/app_models.py, built with no download from seeded RNGs; the quantized ones through
onnxruntime's quantization tools, the scikit-learn ones through skl2onnx, whose versions are printed):
a streaming VAD (If + Conv-DFT + LSTM, 20 chunks with the state carried per call), a wake-word chain, a
dynamic-int8 BERT, a QDQ and a QOperator int8 MobileNet-style CNN, an int4 decoder block (MatMulNBits +
GroupQueryAttention, one decode step), a greedy decoder in a Loop, a Scan RNN, and three scikit-learn
pipelines at batch 1 and 1000.

Method (the issue's): both runtimes in this process, onnxruntime with intra_op_num_threads=2, onnx_mini
with its defaults (and ONNX_MINI_MALLOC=tuned, as every script here: see benchmarks/README.md). First each
runtime runs the case once and the outputs are compared (a '!' after the ratio and a note when they
differ beyond the case's tolerance). Then BLOCKS alternating blocks, the runtime order swapped every block:
each block starts with gc, a 0.5 s pause (so the other runtime's spinning thread pool has gone quiet) and
one untimed call, then times back-to-back calls of one runtime alone (enough to last BLOCK_SECONDS, at
least MIN_CALLS), each call timed on its own with gc off. The figure is the median of all the per-call
times of a runtime. A "call" is what the application does once: one run, or for vad_stream 20 chunks in
sequence. Writes benchmarks/results/bench_apps.json and bench_apps.png (not with --only).
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_core as core  # noqa: E402  (first: sets ONNX_MINI_MALLOC=tuned before onnx_mini loads)
from bench_suite import geomean  # noqa: E402

import numpy as np  # noqa: E402

import app_models  # noqa: E402

RESULTS = HERE / "results"
ORT_THREADS = 2
PAUSE = 0.5                                  # seconds before each block (the method)
BLOCKS = {False: 7, True: 3}                 # blocks per runtime (full, quick)
BLOCK_SECONDS = {False: 0.3, True: 0.1}      # timed calls per block: enough to last this long...
MIN_CALLS, MAX_CALLS = 3, 1000               # ...within these bounds
BAR_EACH, BAR_GEOMEAN = 2.0, 1.5             # the bars for these models
RUNTIMES = ("onnx_mini", "onnxruntime")


# -- comparing outputs ----------------------------------------------------------------------------

def _as_array(out):
    """A runtime's output as an array: ZipMap's list of {class: probability} becomes rows of the
    probabilities in key order (the keys are compared apart, in _keys)."""
    if isinstance(out, list) and out and isinstance(out[0], dict):
        return np.array([[d[k] for k in sorted(d)] for d in out], np.float64)
    return np.asarray(out)


def _keys(out):
    return [sorted(d) for d in out] if isinstance(out, list) and out and isinstance(out[0], dict) else None


def max_err(got: list, want: list) -> tuple[float, str]:
    """(worst error, which output) of got against want (onnxruntime's). Float outputs: max |diff| /
    max |want| (as bench_suite); labels, strings and integers must be equal: the error is the fraction
    of elements that differ, so one flipped label of 1000 shows as 1e-3."""
    if len(got) != len(want):
        return math.inf, f"{len(got)} outputs vs {len(want)}"
    worst, where = 0.0, ""
    for i, (g, w) in enumerate(zip(got, want)):
        if _keys(g) != _keys(w):
            return math.inf, f"output {i}: ZipMap keys differ"
        g, w = _as_array(g), _as_array(w)
        if g.shape != w.shape:
            return math.inf, f"output {i}: shape {g.shape} vs {w.shape}"
        if not w.size:
            continue
        if w.dtype.kind == "f":
            g64, w64 = g.astype(np.float64), w.astype(np.float64)
            err = float(np.abs(g64 - w64).max()) / max(float(np.abs(w64).max()), 1e-6)
        else:
            err = float(np.mean(g != w))
        if err > worst:
            worst, where = err, f"output {i}"
    return worst, where


# -- timing ---------------------------------------------------------------------------------------

def time_block(fn, calls: int) -> list[float]:
    gc.collect()
    time.sleep(PAUSE)
    fn()                                   # the untimed call
    out = []
    gc.disable()
    try:
        for _ in range(calls):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    finally:
        gc.enable()
    return out


def first_feeds(app, runner) -> dict:
    """The feeds of one run of the app's model: its own `feeds` (an App), else those of the first run one
    call of it makes (bench_real's cases, a stream's first chunk)."""
    feeds = getattr(app, "feeds", None)
    if feeds is None:
        seen = []
        app.run(lambda f: seen.append(f) or runner.call(f))
        feeds = seen[0]
    return feeds


def measure_case(app, runners: dict, quick: bool) -> dict[str, dict]:
    """Alternating blocks; per runtime: median per-call seconds, every call's time, calls per block."""
    fns = {rt: (lambda r=r: app.run(r.call)) for rt, r in runners.items()}
    if "onnx_mini" in runners:           # its steady state: the model's BLAS mode chosen (at most 5 s)
        runners["onnx_mini"].settle(first_feeds(app, runners["onnx_mini"]))
    per_call = {rt: [] for rt in fns}
    n_calls = {}
    for blk in range(BLOCKS[quick]):
        for rt in (RUNTIMES if blk % 2 == 0 else RUNTIMES[::-1]):
            if rt not in fns:
                continue
            if rt not in n_calls:            # sized from one call, made after its own pause
                t0 = time.perf_counter()
                fns[rt]()
                one = max(time.perf_counter() - t0, 1e-7)
                n_calls[rt] = min(MAX_CALLS, max(MIN_CALLS, math.ceil(BLOCK_SECONDS[quick] / one)))
            per_call[rt] += time_block(fns[rt], n_calls[rt])
    return {rt: {"median_s": statistics.median(v), "calls": len(v), "calls_per_block": n_calls[rt],
                 "q1_s": statistics.quantiles(v, n=4)[0] if len(v) > 1 else v[0],
                 "q3_s": statistics.quantiles(v, n=4)[2] if len(v) > 1 else v[0]}
            for rt, v in per_call.items() if v}


# -- report ---------------------------------------------------------------------------------------

def table(head: list[str], body: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]

    def line(row):
        return "| " + " | ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))) + " |"
    return "\n".join([line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, body)])


def ratio(row: dict) -> float | None:
    m, o = (row["latency"].get(rt) for rt in RUNTIMES)
    return m / o if m and o else None


def render(rows: list[dict]) -> str:
    body = []
    for r in rows:
        m, o = (r["latency"].get(rt) for rt in RUNTIMES)
        err = r.get("max_err")
        body.append([r["name"], core.fmt_time(m), core.fmt_time(o), core.fmt_ratio(m, o) + ("!" if r.get("differs") else ""),
                     "n/a" if err is None else f"{err:.1e}", core.fmt_time(r["setup"].get("onnx_mini")),
                     core.fmt_time(r["setup"].get("onnxruntime"))])
    return table(["case", "onnx_mini", "onnxruntime", "mini/ort", "max err", "mini prepare", "ort session"], body)


def bars(rows: list[dict]) -> list[str]:
    rs = {r["name"]: ratio(r) for r in rows if ratio(r) and not r.get("differs")}
    if not rs:
        return []
    gm = geomean(rs.values())
    over = {k: v for k, v in rs.items() if v > BAR_EACH}
    return [f"geomean onnx_mini/onnxruntime = {gm:.2f}x over {len(rs)} cases (bar <= {BAR_GEOMEAN}: "
            f"{'MET' if gm <= BAR_GEOMEAN else 'NOT MET'})",
            f"cases above {BAR_EACH}x: " + (", ".join(f"{k} {v:.2f}x" for k, v in sorted(over.items(), key=lambda kv: -kv[1]))
                                           if over else "none") + " (bar: none)"]


def chart(payload: dict, path: Path) -> str:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:
        return f"chart skipped: matplotlib not importable ({type(e).__name__}: {e}); pip install -e '.[bench]'"
    rows = [r for r in payload["rows"] if ratio(r)]
    if not rows:
        return "chart skipped: no case with both latencies"
    vals = [ratio(r) for r in rows]
    fig, ax = plt.subplots(figsize=(max(8, 0.6 * len(rows) + 2), 5.2))
    colors = ["#c44e52" if v > BAR_EACH else "#4c72b0" for v in vals]
    for i, (v, r) in enumerate(zip(vals, rows)):
        ax.bar(i, v, color=colors[i])
        ax.text(i, v * 1.04, f"{v:.2f}" + ("!" if r.get("differs") else ""), ha="center", va="bottom", fontsize=7)
    ax.set_yscale("log")
    lo, hi = min(0.5, min(vals) / 1.3), max(4.0, max(vals) * 1.4)
    ax.set_ylim(lo, hi)
    ticks = [t for t in (0.1, 0.2, 0.5, 1, 1.5, 2, 3, 5, 10, 20, 50, 100, 200) if lo <= t <= hi]
    ax.set_yticks(ticks, [f"{t:g}x" for t in ticks])
    ax.minorticks_off()
    ax.axhline(1.0, color="black", lw=0.8)
    ax.axhline(BAR_EACH, color="gray", lw=0.8, ls="--", label=f"per-model bar {BAR_EACH}x (red: above it)")
    ax.axhline(BAR_GEOMEAN, color="gray", lw=0.8, ls="-.", label=f"geomean bar {BAR_GEOMEAN}x")
    gm = geomean(vals)
    ax.axhline(gm, color="#dd8452", lw=1.0, ls=":", label=f"measured geomean {gm:.2f}x")
    ax.set_xticks(range(len(rows)), [r["name"] for r in rows], rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("onnx_mini / onnxruntime per call (log, lower is better)")
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title(f"application models: onnx_mini vs onnxruntime ({ORT_THREADS} threads), {payload['mode']} run, "
                 f"{payload['date']}\n{payload['load']}", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"chart written: {path}"


# -- main -----------------------------------------------------------------------------------------

def warm_up() -> None:
    """One tiny model through both runtimes first, so that one-time process costs (onnx_mini's operator
    catalog, onnxruntime's environment) are not charged to the first case's prepare / session time."""
    from onnx import TensorProto, helper
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    model = core.make_model([helper.make_node("Add", ["x", "x"], ["y"])], [x],
                            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])], [], "warm_up")
    for rt in RUNTIMES:
        core.Runner(rt, model).try_run({"x": np.ones(1, np.float32)})


def run_case(name: str, quick: bool, notes: list[str]) -> dict | None:
    t0 = time.perf_counter()
    try:
        app = app_models.BUILDERS[name]()
    except Exception as e:
        notes.append(f"{name}: build failed: {core.short(e, 300)}")
        print(f"\n[{name}] build failed: {core.short(e, 300)}", flush=True)
        return None
    print(f"\n[{name}] {app.label}  (built in {time.perf_counter() - t0:.1f} s)", flush=True)
    return compare_and_time(name, app, quick, notes)


def compare_and_time(name: str, app, quick: bool, notes: list[str], ort_options: dict | None = None) -> dict:
    """The row of one case: both runtimes set up on app.model, their outputs of app.run (and app.checks)
    compared, then timed in alternating blocks. ort_options: more onnxruntime SessionOptions fields."""
    row = {"name": name, "label": app.label, "latency": {}, "setup": {}, "stats": {}, "tol": app.tol}
    runners = {}
    outs = {}
    for rt in RUNTIMES:
        opts = {"intra_op_num_threads": ORT_THREADS, **(ort_options or {})} if rt == "onnxruntime" else {}
        r = core.Runner(rt, app.model, **opts)
        row["setup"][rt] = r.setup_time
        if r.ok:
            try:
                outs[rt] = [app.run(r.call)] + [r.call(f) for f in app.checks]
                runners[rt] = r
            except Exception as e:
                r.error = f"run failed: {core.short(e, 300)}"
        if r.error:
            notes.append(f"{name}: {rt} n/a - {r.error}")
            print(f"  {rt}: {r.error}", flush=True)
    if len(outs) == 2:
        errs = [max_err(g, w) for g, w in zip(outs["onnx_mini"], outs["onnxruntime"])]
        err, where = max(errs, key=lambda e: e[0])
        row["max_err"] = err
        if err > app.tol:
            row["differs"] = True
            notes.append(f"{name}: onnx_mini output DIFFERS from onnxruntime ({where}: error {err:.1e} > tolerance "
                         f"{app.tol:g})")
        elif app.tol > 1e-3:
            notes.append(f"{name}: tolerance {app.tol:g} ({app.why_tol}); measured {err:.1e}")
    stats = measure_case(app, runners, quick)
    for rt, s in stats.items():
        row["latency"][rt] = s["median_s"]
        row["stats"][rt] = s
        print(f"  {rt:12s} {core.fmt_time(s['median_s']):>10s} per call (quartiles {core.fmt_time(s['q1_s'])} - "
              f"{core.fmt_time(s['q3_s'])}, {s['calls']} calls in {BLOCKS[quick]} blocks)  "
              f"setup {core.fmt_time(row['setup'].get(rt))}", flush=True)
    m = ratio(row)
    print(f"  mini/ort {m:.2f}x" if m else "  mini/ort n/a", f" max err {row.get('max_err', math.nan):.1e}", flush=True)
    return row


def run_all(items, run_one, quick: bool):
    """warm_up, then run_one(item, quick, notes) for each item, the machine's load average and speed read
    before and after -> (rows, notes, (load, speed) at start, (load, speed) at end)."""
    warm_up()
    start = os.getloadavg(), core.speed_probe()
    print("machine speed at start:", core.speed_text(start[1]), flush=True)
    rows, notes = [], []
    for item in items:
        row = run_one(item, quick, notes)
        if row:
            rows.append(row)
    return rows, notes, start, (os.getloadavg(), core.speed_probe())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help=f"{BLOCKS[True]} blocks of {BLOCK_SECONDS[True]} s "
                   f"instead of {BLOCKS[False]} of {BLOCK_SECONDS[False]} s")
    p.add_argument("--only", action="append", default=[], metavar="NAME",
                   help="run only the cases whose name contains NAME (repeatable); writes no results file")
    p.add_argument("--list", action="store_true", help="list the cases and exit")
    p.add_argument("--results", default=str(RESULTS), help="where bench_apps.json / .png go")
    p.add_argument("--chart-from", metavar="JSON", help="only draw the chart from a saved results file")
    args = p.parse_args(argv)
    if args.list:
        print("\n".join(app_models.BUILDERS))
        return 0
    if args.chart_from:
        payload = json.loads(Path(args.chart_from).read_text())
        print(chart(payload, Path(args.chart_from).with_suffix(".png")))
        return 0
    names = [n for n in app_models.BUILDERS if not args.only or any(o in n for o in args.only)]
    if not names:
        p.error(f"no case matches {args.only}; cases: {', '.join(app_models.BUILDERS)}")
    start = time.perf_counter()
    mode = "quick" if args.quick else "full"
    versions = app_models.versions()
    print("machine:", core.machine_info())
    print("model tools:", ", ".join(f"{k} {v}" for k, v in versions.items()))
    print(f"mode: {mode}; onnxruntime intra_op_num_threads={ORT_THREADS}; both runtimes in this process, "
          f"{BLOCKS[args.quick]} alternating blocks each (pause {PAUSE} s + one untimed call, then >= "
          f"{BLOCK_SECONDS[args.quick]} s of back-to-back calls); per-call medians", flush=True)
    rows, notes, (load_start, speed_start), (load_end, speed_end) = run_all(names, run_case, args.quick)
    load = (f"load average (1/5/15 min) at start {load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f}, "
            f"at end {load_end[0]:.2f} {load_end[1]:.2f} {load_end[2]:.2f} ({os.cpu_count()} CPUs)")
    speed = f"machine speed at start: {core.speed_text(speed_start)}; at end: {core.speed_text(speed_end)}"
    print(f"\nResults ({mode} run; median time per call; mini/ort = onnx_mini / onnxruntime; max err = worst "
          "output difference (relative to the output's max |value|; for labels the fraction that differ); "
          "'!' = beyond the case's tolerance)")
    print("machine:", core.machine_info())
    print(load)
    print(speed)
    print(render(rows))
    print("cases: " + "; ".join(f"{r['name']} = {r['label']}" for r in rows))
    summary = bars(rows)
    core.print_findings("Bars of issue 22 (measured)", summary, notes)
    payload = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "mode": mode,
               "machine": core.machine_info(), "tools": versions, "load": load,
               "speed": {"start": speed_start, "end": speed_end},
               "method": {"ort_threads": ORT_THREADS, "blocks": BLOCKS[args.quick], "pause_s": PAUSE,
                          "block_seconds": BLOCK_SECONDS[args.quick]},
               "rows": rows, "bars": summary, "notes": notes}
    if not args.only:           # a partial run does not overwrite the saved results
        results = Path(args.results)
        results.mkdir(parents=True, exist_ok=True)
        (results / "bench_apps.json").write_text(json.dumps(payload, indent=1))
        print(f"\nresults written: {results / 'bench_apps.json'}")
        print(chart(payload, results / "bench_apps.png"))
    print(f"\ntotal benchmark time: {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
