"""A numpy floor under the application models of issue 22: their products alone, next to both runtimes.

    .venv/bin/python benchmarks/bench_floors.py                       # mobilenet_qdq/qop, bert_dynint8, decoder_int4
    .venv/bin/python benchmarks/bench_floors.py --only decoder_int4

For each model (benchmarks/app_models.py; "suite:" cases: bench_suite's built float models), one run of onnx_mini with optimize=False records the inputs
of every product node (Conv, QLinearConv, ConvInteger, Gemm, QGemm, MatMul, MatMulInteger, MatMulNBits,
QLinearMatMul); the floor is then the least numpy can do for those products in float32, run back to
back in graph order (so weights stream through the caches as in a real run):
- a Conv of one group: one matrix product W [M, C*kh*kw] x columns [C*kh*kw, OH*OW], the columns made
  beforehand (their copy not counted);
- a depthwise Conv: nothing (no matrix product; how few passes numpy could make it in is open);
- a product node: a float32 matrix product of its shapes (MatMulNBits: float32 weights [K, N], what a
  numpy runtime holds for 4-bit weights: numpy has no packed low-bit product).
Products go through onnx_mini.blas.matmul inside blas.during_run (OpenBLAS's threads, or split over
two threads on a busy machine, as a run does).
Everything else a model does (quantization, activations, copies, attention's softmax) is left out,
so the floor is a lower bound of any numpy runtime on this machine; where it alone exceeds 2x
onnxruntime's whole run, issue 22's 2.0x bar cannot be reached in numpy for that model.
Timing as bench_apps.py: alternating blocks, each after gc, a 0.5 s pause and one untimed call;
per-call medians.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_core as core  # noqa: E402  (first: sets ONNX_MINI_MALLOC=tuned before onnx_mini loads)
import app_models  # noqa: E402
import models  # noqa: E402
from bench_apps import time_block  # noqa: E402

import onnx_mini  # noqa: E402
from onnx_mini import blas  # noqa: E402

CASES = ("mobilenet_qdq", "mobilenet_qop", "bert_dynint8", "decoder_int4", "suite:mobilenet", "suite:unet")
PRODUCTS = {"Conv", "QLinearConv", "ConvInteger", "Gemm", "QGemm", "MatMul", "MatMulInteger", "MatMulNBits",
            "QLinearMatMul", "FusedMatMul", "DynamicQuantizeMatMul", "MatMulIntegerToFloat"}
BLOCKS, CALLS = 7, 20


def _attrs(model) -> dict[str, dict]:
    from onnx import helper
    return {n.name: {a.name: helper.get_attribute_value(a) for a in n.attribute} for n in model.graph.node}


def _record(app) -> list[tuple[str, str, list[np.ndarray]]]:
    """(node name, op type, its input arrays) of every product node of one unoptimised run."""
    seen = []

    def hook(info, inputs, outputs):
        if info.op_type in PRODUCTS:
            seen.append((info.name, info.op_type, [None if x is None else np.asarray(x) for x in inputs]))
    rep = onnx_mini.prepare(app.model, optimize=False)
    rep.run(app.feeds, hook=hook)
    return seen


def _conv_floor(rng, x, w, attrs):
    """A function making this convolution's matrix product(s), or None for a depthwise one."""
    n, c = x.shape[:2]
    m, cg = w.shape[:2]
    k = w.shape[2:]
    group = int(attrs.get("group", 1))
    strides = list(attrs.get("strides", [1] * len(k)))
    dil = list(attrs.get("dilations", [1] * len(k)))
    pads = list(attrs.get("pads", [0] * 2 * len(k)))
    if attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        pads = [(d * (kk - 1)) // 2 for d, kk in zip(dil, k)] * 2      # SAME: the floor only needs sizes
    out = [(x.shape[2 + i] + pads[i] + pads[i + len(k)] - dil[i] * (k[i] - 1) - 1) // strides[i] + 1
           for i in range(len(k))]
    p = int(np.prod(out))
    taps = int(np.prod(k))
    if group == 1:
        wm = rng.standard_normal((m, cg * taps)).astype(np.float32)
        cols = rng.standard_normal((n, cg * taps, p)).astype(np.float32)
        return lambda: [blas.matmul(wm, cols[i]) for i in range(n)]
    if group == c and m == c:
        return None             # depthwise: left out (no product; its passes' least cost is not clear-cut)
    mg = m // group
    wm = rng.standard_normal((group, mg, cg * taps)).astype(np.float32)
    cols = rng.standard_normal((n, group, cg * taps, p)).astype(np.float32)
    return lambda: [blas.matmul(wm, cols[i]) for i in range(n)]


def _product_floor(rng, op, inputs, attrs):
    """The float32 matrix product of this node's shapes."""
    a = inputs[0]
    if op == "MatMulNBits":
        k_, n_ = int(attrs["K"]), int(attrs["N"])
        b_shape = (k_, n_)
    elif op in ("QLinearMatMul", "QGemm"):       # (A, a_scale, a_zero_point, B, ...)
        b_shape = inputs[3].shape
    else:
        b_shape = inputs[1].shape
    a2 = a.reshape(-1, a.shape[-1])
    if op in ("Gemm", "QGemm") and attrs.get("transA", 0):
        a2 = a.T
    if op in ("Gemm", "QGemm") and attrs.get("transB", 0):
        b_shape = b_shape[::-1]
    af = rng.standard_normal(a2.shape).astype(np.float32)
    bf = rng.standard_normal(b_shape[-2:]).astype(np.float32)
    return lambda: blas.matmul(af, bf)


def floor_fn(app, seen):
    rng = np.random.default_rng(0)
    attrs = _attrs(app.model)
    fns = []
    for name, op, inputs in seen:
        at = attrs.get(name, {})
        if op in ("Conv", "QLinearConv", "ConvInteger"):
            x, w = (inputs[0], inputs[3]) if op == "QLinearConv" else (inputs[0], inputs[1])
            f = _conv_floor(rng, x, w, at)
            if f is not None:
                fns.append(f)
        else:
            fns.append(_product_floor(rng, op, inputs, at))

    def run():
        with blas.during_run():         # the products on the threads a run gives them (blas.py's policy)
            for f in fns:
                f()
    return run


def _build(name: str):
    """An app_models.App; "suite:<name>": bench_suite's built model (benchmarks/models.py), one run a call."""
    if name.startswith("suite:"):
        model, feeds = models.BUILDERS[name[6:]]()
        return app_models.App(name, models.DESCRIPTIONS[name[6:]], model, feeds)
    return app_models.BUILDERS[name]()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", action="append", default=[], metavar="NAME")
    args = p.parse_args(argv)
    if core.ort is None:
        print(f"onnxruntime is needed here ({core.ORT_IMPORT_ERROR})")
        return 1
    print(core.machine_info())
    rows = []
    for name in CASES:
        if args.only and not any(o in name for o in args.only):
            continue
        app = _build(name)
        seen = _record(app)
        runners = {"onnx_mini": core.Runner("onnx_mini", app.model),
                   "onnxruntime": core.Runner("onnxruntime", app.model, intra_op_num_threads=2)}
        fns = {"onnx_mini": lambda r=runners["onnx_mini"]: app.run(r.call),
               "onnxruntime": lambda r=runners["onnxruntime"]: app.run(r.call),
               "floor": floor_fn(app, seen)}
        per = {k: [] for k in fns}
        for blk in range(BLOCKS):
            for k in (fns if blk % 2 == 0 else list(fns)[::-1]):
                per[k].append(statistics.median(time_block(fns[k], CALLS)))
        med = {k: statistics.median(v) for k, v in per.items()}
        ops = sorted({op for _, op, _ in seen})
        rows.append([name, f"{len(seen)} ({', '.join(ops)})", core.fmt_time(med["onnx_mini"]),
                     core.fmt_time(med["onnxruntime"]), core.fmt_time(med["floor"]),
                     f"{med['floor'] / med['onnxruntime']:.2f}x", f"{med['onnx_mini'] / med['onnxruntime']:.2f}x"])
        print(f"{name}: done", flush=True)
    head = ["model", "product nodes", "onnx_mini", "onnxruntime", "numpy floor", "floor / ort", "onnx_mini / ort"]
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, ["-" * w for w in widths], *rows]:
        print("| " + " | ".join(str(v).ljust(w) for v, w in zip(r, widths)) + " |")
    print("floor: the products alone in float32 numpy (lower bound; see the module's docstring); "
          f"{BLOCKS} alternating blocks of {CALLS} calls after a {core.PAUSE} s pause, per-call medians")
    return 0


if __name__ == "__main__":
    sys.exit(main())
