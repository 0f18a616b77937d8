"""The nine light models of the onnx package: onnx_mini vs onnxruntime vs onnx.reference, one process.

    .venv/bin/python benchmarks/bench_models.py            # full run
    .venv/bin/python benchmarks/bench_models.py --quick    # fewer repetitions
    .venv/bin/python benchmarks/bench_models.py resnet50   # only the models whose name contains it

Each model (ResNet-50, VGG-19, DenseNet-121, Inception v1/v2, ShuffleNet, SqueezeNet, AlexNet,
ZFNet-512; weights generated inside the graph) runs on the same random [1, 3, 224, 224] input in
every runtime. Outputs are cross-checked against onnxruntime (max abs difference <= 1e-3 of the
output's scale) before timing; a differing onnx.reference is still timed, and said so. The table
gives median latencies and ratios, then their geometric means over the models each pair ran. onnx.reference is slow (up to seconds per
run), so it gets fewer repeats. Timing, runners and table come from bench_core.py.
"""
from __future__ import annotations

import argparse
import gc
import math
import sys
import time
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).parent))
import bench_core as core  # noqa: E402

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
MODELS = ["resnet50", "vgg19", "densenet121", "inception_v1", "inception_v2", "shufflenet", "squeezenet",
          "bvlc_alexnet", "zfnet512"]
REPEATS = {False: 15, True: 3}
REF_REPEATS = {False: 3, True: 1}


def load(name: str):
    model = onnx.load(str(LIGHT / f"light_{name}.onnx"))
    inits = {i.name for i in model.graph.initializer}
    inp = next(i for i in model.graph.input if i.name not in inits)
    shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    return model, {inp.name: x}


def check(runners, outs, label: str, notes: list[str]) -> None:
    base = outs.get("onnxruntime")
    if base is None:
        notes.append(f"{label}: outputs not cross-checked (no onnxruntime output)")
        return
    scale = max(float(np.abs(base[0]).max()), 1e-6)
    for name, out in outs.items():
        if name == "onnxruntime" or out is None:
            continue
        err = float(np.abs(out[0].astype(np.float64) - base[0]).max()) / scale
        if err > 1e-3:   # onnx_mini is not timed on a wrong result; a wrong reference still is
            notes.append(f"{label}: {name} output DIFFERS from onnxruntime (max rel err {err:.1e})")
            if name == "onnx_mini":
                runners[name].error = f"output differs from onnxruntime (max rel err {err:.1e}) - not timed"


def geomean(values) -> float | None:
    values = [v for v in values if v]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer repetitions")
    p.add_argument("only", nargs="*", help="run only the models whose name contains one of these")
    args = p.parse_args(argv)
    start = time.perf_counter()
    print("machine:", core.machine_info())
    table = core.Table()
    ratios_ort, ratios_ref = [], []
    for name in MODELS:
        if args.only and not any(o in name for o in args.only):
            continue
        label = f"{name} [1,3,224,224]"
        print(f"\n[{name}]", flush=True)
        try:
            model, feeds = load(name)
            runners = core.make_runners(model)
            outs = {n: r.try_run(feeds) for n, r in runners.items()}
            check(runners, outs, label, table.notes)
            times = {}
            for n, r in runners.items():
                reps = REF_REPEATS[args.quick] if n == "onnx.reference" else REPEATS[args.quick]
                times[n] = r.time(feeds, reps, core.MIN_SAMPLE[args.quick])
            table.add(label, times)
            core.runner_notes(table, label, runners)
            m, o, r = (times.get(n) for n in core.RUNTIMES)
            if m and o:
                ratios_ort.append(m / o)
            if m and r:
                ratios_ref.append(r / m)
            setups = ", ".join(f"{n} {core.fmt_time(rr.setup_time)}" for n, rr in runners.items() if rr.setup_time)
            table.notes.append(f"{label}: setup (prepare / session / evaluator): {setups}")
        except Exception as e:   # one broken model must not hide the others
            table.notes.append(f"{label}: aborted: {core.short(e, 300)}")
            print(f"  aborted: {core.short(e, 300)}", flush=True)
        gc.collect()
    g_ort, g_ref = geomean(ratios_ort), geomean(ratios_ref)
    extra = (f"\ngeometric mean over {len(ratios_ort)} models: onnx_mini/onnxruntime = "
             + (f"{g_ort:.2f}x" if g_ort else "n/a")
             + f"; over {len(ratios_ref)} models: onnx.reference/onnx_mini = " + (f"{g_ref:.2f}x" if g_ref else "n/a"))
    core.report(table, args.quick, start, extra, what="median latency per run after warm-up")
    return 0


if __name__ == "__main__":
    sys.exit(main())
