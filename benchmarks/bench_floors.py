"""A numpy floor under the application models of issue 22: their products alone, and their depthwise
Convs alone, next to both runtimes.

    .venv/bin/python benchmarks/bench_floors.py                       # mobilenet_qdq/qop, bert_dynint8, decoder_int4
    .venv/bin/python benchmarks/bench_floors.py --only decoder_int4
    .venv/bin/python benchmarks/bench_floors.py --depthwise-only     # the depthwise tables alone (~40 s)

For each model (benchmarks/app_models.py; "suite:" cases: bench_suite's built float models), one run of onnx_mini with optimize=False records the inputs
of every product node (Conv, QLinearConv, ConvInteger, Gemm, QGemm, MatMul, MatMulInteger, MatMulNBits,
QLinearMatMul); the floor is then the least numpy can do for those products in float32, run back to
back in graph order (so weights stream through the caches as in a real run):
- a Conv of one group: one matrix product W [M, C*kh*kw] x columns [C*kh*kw, OH*OW], the columns made
  beforehand (their copy not counted);
- a depthwise Conv: nothing here (no matrix product); its own floor is the second table (below);
- a product node: a float32 matrix product of its shapes (MatMulNBits: float32 weights [K, N], what a
  numpy runtime holds for 4-bit weights: numpy has no packed low-bit product).
Products go through onnx_mini.blas.matmul inside blas.during_run (OpenBLAS's threads, or split over
two threads on a busy machine, as a run does).
Everything else a model does (quantization, activations, copies, attention's softmax) is left out,
so the floor is a lower bound of any numpy runtime on this machine; where it alone exceeds 2x
onnxruntime's whole run, issue 22's 2.0x bar cannot be reached in numpy for that model.
Timing as bench_apps.py: alternating blocks, each after gc, a 0.5 s pause and one untimed call;
per-call medians.

The second table, the depthwise floor: every depthwise Conv (one input channel per group) of
mobilenet_qdq and suite:mobilenet, each next to onnxruntime's time for the same Conv alone (a
single-node model, 2 threads) and onnx_mini's, with the three approaches numpy offers at their least:
- taps: the kh*kw multiplies and the adds into a preallocated output on inputs already padded and
  laid out for it (stride s: the s*s stride phases stored apart), so that each tap is one multiply
  of a contiguous run by the per-channel weights (broadcast) and one add; no copy, no padding
  counted; the run spans the padded rows (a few columns computed and dropped, the price of one
  inner loop per channel);
- im2col: the windows' copy into preallocated columns (C, kh*kw, OH*OW), from the padded input or,
  tap by tap, from its stride phases (both made beforehand), plus the product, one stacked matmul
  (C, 1, kh*kw) x columns;
- einsum: the input padded, channels-last and split into its column phases beforehand, one einsum
  over its windows against the per-tap weights into a channels-last output (no transposes counted:
  a runtime keeping the whole network channels-last would not make them), the one fused
  multiply-add numpy offers.
Each is timed on one thread and split over the pool's threads (onnx_mini.parallel.split, as a run
does: channels, for the einsum output rows); the fastest variant counts. Per layer: ratios to
onnxruntime's time; the sums over a model's depthwise layers, and the best approach per layer
summed, give numpy's floor for them (backend_tests/ops/nn/test_ops_conv.py checks that every
variant computes the convolution). Timing: per runtime or floor variant, blocks over all layers
after gc and a 0.5 s pause, each layer one untimed call then back-to-back calls, blocks
alternating; per-call medians.
"""
from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_core as core  # noqa: E402  (first: sets ONNX_MINI_MALLOC=tuned before onnx_mini loads)
import app_models  # noqa: E402
import models  # noqa: E402
from bench_apps import time_block  # noqa: E402

import onnx_mini  # noqa: E402
from onnx_mini import blas, parallel  # noqa: E402

CASES = ("mobilenet_qdq", "mobilenet_qop", "bert_dynint8", "decoder_int4", "suite:mobilenet", "suite:unet")
PRODUCTS = {"Conv", "QLinearConv", "ConvInteger", "Gemm", "QGemm", "MatMul", "MatMulInteger", "MatMulNBits",
            "QLinearMatMul", "FusedMatMul", "DynamicQuantizeMatMul", "MatMulIntegerToFloat"}
BLOCKS, CALLS = 7, 20
DW_CASES = ("mobilenet_qdq", "suite:mobilenet")     # the models whose depthwise layers get a floor
DW_BLOCKS, DW_CALLS = 3, 10


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


def _geometry(x, w, attrs):
    """(strides, dilations, pads, output sizes) of a Conv node's attributes on X, W."""
    k = w.shape[2:]
    strides = list(attrs.get("strides", [1] * len(k)))
    dil = list(attrs.get("dilations", [1] * len(k)))
    pads = list(attrs.get("pads", [0] * 2 * len(k)))
    if attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        pads = [(d * (kk - 1)) // 2 for d, kk in zip(dil, k)] * 2      # SAME: the floor only needs sizes
    out = [(x.shape[2 + i] + pads[i] + pads[i + len(k)] - dil[i] * (k[i] - 1) - 1) // strides[i] + 1
           for i in range(len(k))]
    return strides, dil, pads, out


def _conv_floor(rng, x, w, attrs):
    """A function making this convolution's matrix product(s), or None for a depthwise one."""
    n, c = x.shape[:2]
    m, cg = w.shape[:2]
    k = w.shape[2:]
    group = int(attrs.get("group", 1))
    out = _geometry(x, w, attrs)[3]
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


def _depthwise(app, seen) -> list[tuple[str, np.ndarray, np.ndarray, np.ndarray | None, dict]]:
    """(node name, X, W, B or None, attributes) of the model's 2-D depthwise Conv nodes (one input
    channel per group), in graph order."""
    attrs = _attrs(app.model)
    layers = []
    for name, op, inputs in seen:
        at = attrs.get(name, {})
        group = int(at.get("group", 1))
        if op == "Conv" and inputs[0].ndim == 4 and group > 1 and inputs[1].shape[:2] == (group, 1) == (
                inputs[0].shape[1], 1):
            layers.append((name, inputs[0], inputs[1], inputs[2] if len(inputs) > 2 else None, at))
    return layers


def _conv_model(x, w, b, attrs):
    """A model of this Conv alone: X fed, W (and B) initializers."""
    from onnx import TensorProto, helper, numpy_helper
    inits = [numpy_helper.from_array(w.astype(np.float32), "W")]
    if b is not None:
        inits.append(numpy_helper.from_array(b.astype(np.float32), "B"))
    node = helper.make_node("Conv", ["X", "W"] + (["B"] if b is not None else []), ["Y"], **attrs)
    graph = helper.make_graph([node], "conv", [helper.make_tensor_value_info("X", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _threaded(work, c, blocks):
    """-> {"1 thread": ..., "split": ...}: work(c0, c1) over c items (channels, or output rows) in
    blocks of at most `blocks` items, on the calling thread alone or split over the pool's threads."""
    def blocked(c0, c1):
        for b0 in range(c0, c1, blocks):
            work(b0, min(c1, b0 + blocks))
    return {"1 thread": lambda: blocked(0, c),
            "split": lambda: parallel.split(blocked, c, -(-c // max(1, parallel.threads())))}


def _phase_planes(x, w, attrs):
    """X padded and stored once per stride phase, each channel's phase flat (made beforehand, not
    timed): -> (planes (N*C, phases, length), reads: per tap (phase, offset), run, phase row width).
    Tap (i, j) reads, for the output rows (each `wph` long: a few columns computed and dropped), the
    contiguous run planes[:, phase, offset:offset + run]."""
    (sh, sw), (dh, dw), pads, (oh, ow) = _geometry(x, w, attrs)
    n, c = x.shape[:2]
    kh, kw = w.shape[2:]
    rows = [divmod(i * dh, sh)[::-1] for i in range(kh)]          # (phase, q) per kernel row
    cols = [divmod(j * dw, sw)[::-1] for j in range(kw)]
    hph, wph = oh + max(q for _, q in rows), ow + max(q for _, q in cols)
    phases = sorted({(pi, pj) for pi, _ in rows for pj, _ in cols})
    run = oh * wph
    length = hph * wph + max(q for _, q in cols)
    reads = [(phases.index((pi, pj)), qi * wph + qj) for pi, qi in rows for pj, qj in cols]
    xp = np.zeros((n * c, x.shape[2] + pads[0] + pads[2] + sh, x.shape[3] + pads[1] + pads[3] + sw), np.float32)
    xp[:, pads[0]:pads[0] + x.shape[2], pads[1]:pads[1] + x.shape[3]] = x.reshape(n * c, *x.shape[2:])
    planes = np.zeros((n * c, len(phases), length), np.float32)
    for k, (pi, pj) in enumerate(phases):
        planes[:, k, :hph * wph].reshape(n * c, hph, wph)[...] = xp[:, pi::sh, pj::sw][:, :hph, :wph]
    return planes, reads, run, wph


def _taps_floor(x, w, attrs) -> tuple[dict, Callable]:
    """Variants of the taps floor (the module's docstring): on _phase_planes, tap (i, j) is one
    multiply of a contiguous run by the per-channel weights and one add, all channels at once, on 1
    or 2 threads (blocks of channels sized to the L2 cache, ~256 KB, lost 1.6-2.4x here: 17 ufunc calls
    a block cost more than the caches save)."""
    n, c = x.shape[:2]
    kh, kw = w.shape[2:]
    planes, reads, run, _ = _phase_planes(x, w, attrs)
    wt = np.tile(w.reshape(c, kh * kw, 1).astype(np.float32), (n, 1, 1))
    y = np.empty((n * c, run), np.float32)
    tmp = np.empty_like(y)

    def work(c0, c1):
        for t, (k, off) in enumerate(reads):
            src = planes[c0:c1, k, off:off + run]
            if t == 0:
                np.multiply(src, wt[c0:c1, 0], out=y[c0:c1])
            else:
                np.multiply(src, wt[c0:c1, t], out=tmp[c0:c1])
                np.add(y[c0:c1], tmp[c0:c1], out=y[c0:c1])
    oh, ow = _geometry(x, w, attrs)[3]
    return ({f"taps, {k}": f for k, f in _threaded(work, n * c, n * c).items()},
            lambda: y.reshape(n, c, oh, -1)[..., :ow])


def _im2col_floor(x, w, attrs) -> tuple[dict, Callable]:
    """Variants of the im2col floor: columns (C, kh*kw, OH*OW) preallocated and copied from the input
    made beforehand, either the padded input's window view in one copy or, tap by tap, plain slices
    of _phase_planes (a strided Conv's windows read the padded input with gaps); then one stacked
    matmul (C, 1, kh*kw) x columns; on 1 or 2 threads."""
    (sh, sw), (dh, dw), pads, (oh, ow) = _geometry(x, w, attrs)
    n, c = x.shape[:2]
    kh, kw = w.shape[2:]
    xp = np.zeros((n * c, x.shape[2] + pads[0] + pads[2], x.shape[3] + pads[1] + pads[3]), np.float32)
    xp[:, pads[0]:pads[0] + x.shape[2], pads[1]:pads[1] + x.shape[3]] = x.reshape(n * c, *x.shape[2:])
    st = xp.strides
    windows = np.lib.stride_tricks.as_strided(xp, (n * c, kh, kw, oh, ow),
                                              (st[0], st[1] * dh, st[2] * dw, st[1] * sh, st[2] * sw))
    planes, reads, run, wph = _phase_planes(x, w, attrs)
    columns = np.empty((n * c, kh, kw, oh, ow), np.float32)
    flat = columns.reshape(n * c, kh * kw, oh * ow)
    by_tap = flat.reshape(n * c, kh * kw, oh, ow)
    wm = np.tile(w.reshape(c, 1, kh * kw).astype(np.float32), (n, 1, 1))
    y = np.empty((n * c, 1, oh * ow), np.float32)

    def from_windows(c0, c1):
        np.copyto(columns[c0:c1], windows[c0:c1])
        np.matmul(wm[c0:c1], flat[c0:c1], out=y[c0:c1])

    def from_phases(c0, c1):
        for t, (k, off) in enumerate(reads):
            np.copyto(by_tap[c0:c1, t], planes[c0:c1, k, off:off + run].reshape(c1 - c0, oh, wph)[:, :, :ow])
        np.matmul(wm[c0:c1], flat[c0:c1], out=y[c0:c1])
    variants = {}
    for label, work in (("windows", from_windows), ("phases", from_phases)):
        for k, f in _threaded(work, n * c, n * c).items():
            variants[f"im2col, {label}, {k}"] = f
    return variants, lambda: y.reshape(n, c, oh, ow)


def _einsum_floor(x, w, attrs) -> tuple[dict, Callable]:
    """Variants of the einsum floor: the input padded and channels-last beforehand, the windows summed
    against the weights by one einsum into a preallocated channels-last output (left so: no
    transposes counted). A window row and C merge into one inner loop against the weights tiled OW
    times, as in onnx_mini's depthwise-einsum: along W the input is stored as its sw column phases
    (phase p, column j: padded column j*sw + p), tap j reading phase p from column q (j*dw = q*sw + p),
    the (p, q) slots without a tap weighted 0 (3x3 /2: 12 slots for 9 taps). Rows split over 1 or 2
    threads."""
    (sh, sw), (dh, dw), pads, (oh, ow) = _geometry(x, w, attrs)
    n, c = x.shape[:2]
    kh, kw = w.shape[2:]
    slots = [divmod(j * dw, sw)[::-1] for j in range(kw)]               # tap j's (p, q)
    nq = max(q for _, q in slots) + 1
    xp = np.zeros((n, x.shape[2] + pads[0] + pads[2], x.shape[3] + pads[1] + pads[3] + sw * nq, c), np.float32)
    xp[:, pads[0]:pads[0] + x.shape[2], pads[1]:pads[1] + x.shape[3]] = x.transpose(0, 2, 3, 1)
    phases = np.empty((n, xp.shape[1], sw, ow + nq - 1, c), np.float32)
    for p in range(sw):
        phases[:, :, p] = xp[:, :, p::sw][:, :, :ow + nq - 1]
    st = phases.strides
    windows = np.lib.stride_tricks.as_strided(phases, (n, oh, kh, sw, nq, ow * c),
                                              (st[0], st[1] * sh, st[1] * dh, st[2], st[3], st[4]))
    wt = np.zeros((kh, sw, nq, ow, c), np.float32)
    for j, (p, q) in enumerate(slots):
        wt[:, p, q] = w[:, 0, :, j].T[:, None, :]
    wt = wt.reshape(kh, sw, nq, ow * c)
    y = np.empty((n, oh, ow * c), np.float32)

    def work(r0, r1):
        np.einsum("nhipqr,ipqr->nhr", windows[:, r0:r1], wt, out=y[:, r0:r1])
    return ({f"einsum, {k}": f for k, f in _threaded(work, oh, oh).items()},
            lambda: y.reshape(n, oh, ow, c).transpose(0, 3, 1, 2))


# Each: (x, w, attributes) -> ({variant: a function timing it}, a function returning Y (N, C, OH, OW) as
# the last variant run left it: what the tests check).
FLOORS = {"taps": _taps_floor, "im2col": _im2col_floor, "einsum": _einsum_floor}


def _time_layers(kinds: dict[str, list], blocks: int, calls: int) -> dict[str, list[float]]:
    """kinds: {kind: [one function per layer]} -> {kind: per-layer per-call medians}. Each block times
    one kind over every layer (after gc and the pause; per layer one untimed call, then `calls`)."""
    per = {k: [[] for _ in fns] for k, fns in kinds.items()}
    for blk in range(blocks):
        for kind in (kinds if blk % 2 == 0 else list(kinds)[::-1]):
            gc.collect()
            time.sleep(core.PAUSE)
            for i, fn in enumerate(kinds[kind]):
                fn()
                times = []
                for _ in range(calls):
                    t0 = time.perf_counter()
                    fn()
                    times.append(time.perf_counter() - t0)
                per[kind][i].append(statistics.median(times))
    return {k: [statistics.median(v) for v in lists] for k, lists in per.items()}


def depthwise_floor(name: str, app, seen, whole: tuple[float, float] | None) -> None:
    """Print the depthwise floor table of one model (the module's docstring); whole: onnxruntime's
    whole run and the products' floor, when the first table measured them."""
    layers = _depthwise(app, seen)
    if not layers:
        print(f"{name}: no depthwise Conv")
        return
    kinds: dict[str, list] = {"onnxruntime": [], "onnx_mini": []}
    floors: dict[str, list[list[str]]] = {floor: [] for floor in FLOORS}      # each floor's variants, per layer
    for _, x, w, b, at in layers:
        model = _conv_model(x, w, b, at)
        feeds = {"X": np.ascontiguousarray(x, dtype=np.float32)}
        for rt, opts in (("onnxruntime", {"intra_op_num_threads": 2}), ("onnx_mini", {})):
            runner = core.Runner(rt, model, **opts)
            kinds[rt].append(lambda call=runner.call, feeds=feeds: call(feeds))
        for floor, make in FLOORS.items():
            variants, _ = make(x, w, at)
            floors[floor].append(list(variants))
            for label, f in variants.items():
                kinds.setdefault(label, []).append(f)
    med = _time_layers(kinds, DW_BLOCKS, DW_CALLS)
    best = {floor: [min(med[label][i] for label in labels[i]) for i in range(len(layers))]
            for floor, labels in floors.items()}
    ort = med["onnxruntime"]
    head = ["layer", "C x H x W, stride", "onnxruntime", "onnx_mini / ort", "taps floor / ort", "im2col floor / ort",
            "einsum floor / ort"]
    rows = []
    for i, (node, x, w, _, at) in enumerate(layers):
        s = _geometry(x, w, at)[0][0]
        rows.append([node, f"{x.shape[1]}x{x.shape[2]}x{x.shape[3]} /{s}", core.fmt_time(ort[i]),
                     f"{med['onnx_mini'][i] / ort[i]:.2f}x", f"{best['taps'][i] / ort[i]:.2f}x",
                     f"{best['im2col'][i] / ort[i]:.2f}x", f"{best['einsum'][i] / ort[i]:.2f}x"])
    total = sum(ort)
    rows.append([f"sum ({len(layers)} layers)", "", core.fmt_time(total), f"{sum(med['onnx_mini']) / total:.2f}x",
                 f"{sum(best['taps']) / total:.2f}x", f"{sum(best['im2col']) / total:.2f}x",
                 f"{sum(best['einsum']) / total:.2f}x"])
    least = sum(min(f) for f in zip(*best.values()))
    print(f"\n{name}: depthwise layers against onnxruntime's single-node Conv (2 threads)")
    widths = [max(len(str(r[j])) for r in [head, *rows]) for j in range(len(head))]
    for r in [head, ["-" * v for v in widths], *rows]:
        print("| " + " | ".join(str(v).ljust(wd) for v, wd in zip(r, widths)) + " |")
    note = (f"numpy's floor for these layers (the best approach per layer): {core.fmt_time(least)}, "
            f"{least / total:.2f}x onnxruntime's {core.fmt_time(total)}")
    if whole:
        model_ort, products = whole
        note += (f"; with the products' floor {core.fmt_time(products)}: {(least + products) / model_ort:.2f}x "
                 f"onnxruntime's whole run ({core.fmt_time(model_ort)}; measured apart, a lower bound)")
    print(note)


def _build(name: str):
    """An app_models.App; "suite:<name>": bench_suite's built model (benchmarks/models.py), one run a call."""
    if name.startswith("suite:"):
        model, feeds = models.BUILDERS[name[6:]]()
        return app_models.App(name, models.DESCRIPTIONS[name[6:]], model, feeds)
    return app_models.BUILDERS[name]()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", action="append", default=[], metavar="NAME")
    p.add_argument("--depthwise-only", action="store_true", help="only the depthwise floor tables")
    args = p.parse_args(argv)
    if core.ort is None:
        print(f"onnxruntime is needed here ({core.ORT_IMPORT_ERROR})")
        return 1
    print(core.machine_info())
    rows = []
    whole = {}              # model -> (onnxruntime's whole run, its products' floor): the depthwise tables' note
    for name in CASES:
        if args.depthwise_only or args.only and not any(o in name for o in args.only):
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
        whole[name] = (med["onnxruntime"], med["floor"])
        ops = sorted({op for _, op, _ in seen})
        rows.append([name, f"{len(seen)} ({', '.join(ops)})", core.fmt_time(med["onnx_mini"]),
                     core.fmt_time(med["onnxruntime"]), core.fmt_time(med["floor"]),
                     f"{med['floor'] / med['onnxruntime']:.2f}x", f"{med['onnx_mini'] / med['onnxruntime']:.2f}x"])
        print(f"{name}: done", flush=True)
    if rows:
        head = ["model", "product nodes", "onnx_mini", "onnxruntime", "numpy floor", "floor / ort", "onnx_mini / ort"]
        widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
        for r in [head, ["-" * w for w in widths], *rows]:
            print("| " + " | ".join(str(v).ljust(w) for v, w in zip(r, widths)) + " |")
        print("floor: the products alone in float32 numpy (lower bound; see the module's docstring); "
              f"{BLOCKS} alternating blocks of {CALLS} calls after a {core.PAUSE} s pause, per-call medians")
    for name in DW_CASES:
        if args.only and not any(o in name for o in args.only):
            continue
        app = _build(name)
        depthwise_floor(name, app, _record(app), whole.get(name))
    print("depthwise floors: taps = the kh*kw multiply-adds on inputs padded and phase-split beforehand, "
          "im2col = the columns' copy plus one stacked matmul, einsum = one einsum over channels-last windows "
          "(no transposes); each the fastest of its variants, 1 thread or 2 (see the "
          f"module's docstring); {DW_BLOCKS} alternating blocks of {DW_CALLS} calls per layer after a "
          f"{core.PAUSE} s pause, per-call medians")
    return 0


if __name__ == "__main__":
    sys.exit(main())
