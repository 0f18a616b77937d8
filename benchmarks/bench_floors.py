"""A numpy floor under the application models of issue 22: their products alone, their depthwise
Convs alone, and the whole model (products, depthwise Convs and the elementwise passes between them),
next to both runtimes.

    .venv/bin/python benchmarks/bench_floors.py                       # mobilenet_qdq/qop, bert_dynint8, decoder_int4
    .venv/bin/python benchmarks/bench_floors.py --only decoder_int4
    .venv/bin/python benchmarks/bench_floors.py --depthwise-only     # the depthwise tables alone (~40 s)
    .venv/bin/python benchmarks/bench_floors.py --only mobilenet_qdq --no-depthwise-tables --per-node

For each model (benchmarks/app_models.py; "suite:" cases: bench_suite's built float models), one run of onnx_mini with optimize=False records the inputs
of every product node (Conv, QLinearConv, ConvInteger, Gemm, QGemm, MatMul, MatMulInteger, MatMulNBits,
QLinearMatMul); the products floor is then the least numpy can do for those products in float32, run
back to back in graph order (so weights stream through the caches as in a real run):
- a Conv of one group: one matrix product W [M, C*kh*kw] x columns [C*kh*kw, OH*OW], the columns made
  beforehand (their copy not counted);
- a depthwise Conv: nothing here (no matrix product); its own floor is the depthwise table (below);
- a product node: a float32 matrix product of its shapes (MatMulNBits: float32 weights [K, N], what a
  numpy runtime holds for 4-bit weights: numpy has no packed low-bit product).
Products go through onnx_mini.blas.matmul inside blas.during_run (OpenBLAS's threads, or split over
two threads on a busy machine, as a run does).
Everything else a model does (quantization, activations, copies, attention's softmax) is left out
of it, so this floor is a lower bound of any numpy runtime on this machine; where it alone exceeds 2x
onnxruntime's whole run, issue 22's 2.0x bar cannot be reached in numpy for that model.
Timing as bench_apps.py: alternating blocks, each after gc, a 0.5 s pause and one untimed call;
per-call medians.

The whole floor (the first table's second floor column) adds to the products, in run order and
timed as one run beside them, what no numpy runtime avoids between them:
- every depthwise Conv at its layer's fastest variant of the depthwise floors below (picked by
  timing them all as the depthwise table does, before the alternating blocks);
- one pass over a tensor wherever the model must touch its elements outside a product
  (elementwise_passes says where: a requantization, a unary activation not folded into the lookup
  table of the requantization after it, a residual Add, pooling, Softmax, LayerNormalization,
  dynamic quantization), each timed as the cheapest numpy call over a float32 tensor of that shape,
  np.multiply(y, 1, out=y). That pass stands for the quantize-dequantize or the lookup over codes a
  Conv's output needs; numpy does a QuantizeLinear in 3-4 such calls (scale, round, clip, back),
  a Softmax or LayerNormalization in more, so the count errs low. Stem column copies, padding and
  layout transposes are not counted either.
A second table gives the parts, each timed alone in run order, and their sum. The two bracket numpy's
least: each piece works on buffers of its own, so in the whole run it finds its input beyond the
caches where a runtime finds its producer's output warm (the whole may overstate), while a part
alone keeps its few buffers warm from call to call (their sum understates). Where the sum of the
parts exceeds 2x onnxruntime's whole run, the 2.0x bar is out of numpy's reach; below,
2 - whole floor / ort is the room (in onnxruntime runs) left for everything the floor leaves out.
--per-node prints the whole floor per product node (with the passes up to the next product: what
onnx_mini fuses into it) next to onnx_mini's profile (onnx_mini.profile, optimised; means over
its runs, the profiler's hooks adding a few us a node), to show where the room goes.

The depthwise tables (printed last), the depthwise floor: every depthwise Conv (one input channel per
group) of mobilenet_qdq and suite:mobilenet, each next to onnxruntime's time for the same Conv alone (a
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


def _record_steps(app) -> list[tuple]:
    """(StepInfo, input arrays, output arrays) of every node of one unoptimised run, in run order."""
    steps = []

    def hook(info, inputs, outputs):
        steps.append((info, [None if x is None else np.asarray(x) for x in inputs],
                      [None if x is None else np.asarray(x) for x in outputs]))
    rep = onnx_mini.prepare(app.model, optimize=False)
    rep.run(app.feeds, hook=hook)
    return steps


def _record(app, steps=None) -> list[tuple[str, str, list[np.ndarray]]]:
    """(node name, op type, its input arrays) of every product node of one unoptimised run."""
    return [(info.name, info.op_type, inputs) for info, inputs, _ in steps or _record_steps(app)
            if info.op_type in PRODUCTS]


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


def _product_fns(app, seen) -> list[Callable | None]:
    """One function per product node of `seen`: its float32 matrix product(s), None for a depthwise Conv."""
    rng = np.random.default_rng(0)
    attrs = _attrs(app.model)
    fns = []
    for name, op, inputs in seen:
        at = attrs.get(name, {})
        if op in ("Conv", "QLinearConv", "ConvInteger"):
            x, w = (inputs[0], inputs[3]) if op == "QLinearConv" else (inputs[0], inputs[1])
            fns.append(_conv_floor(rng, x, w, at))
        else:
            fns.append(_product_floor(rng, op, inputs, at))
    return fns


def _depthwise(app, seen) -> list[tuple[str, np.ndarray, np.ndarray, np.ndarray | None, dict]]:
    """(node name, X, W, B or None, attributes) of the model's 2-D depthwise Conv nodes (one input
    channel per group), in graph order."""
    attrs = _attrs(app.model)
    layers = []
    for name, op, inputs in seen:
        if op not in ("Conv", "QLinearConv"):
            continue
        at = attrs.get(name, {})
        group = int(at.get("group", 1))
        x, w, b = (inputs[0], inputs[3], inputs[8] if len(inputs) > 8 else None) if op == "QLinearConv" else (
            inputs[0], inputs[1], inputs[2] if len(inputs) > 2 else None)
        if x.ndim == 4 and group > 1 and w.shape[:2] == (group, 1) == (x.shape[1], 1):
            layers.append((name, x, w, b, at))
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


def _table(head, rows):
    """Print a markdown table."""
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, ["-" * w for w in widths], *rows]:
        print("| " + " | ".join(str(v).ljust(w) for v, w in zip(r, widths)) + " |")


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
    _table(head, rows)
    note = (f"numpy's floor for these layers (the best approach per layer): {core.fmt_time(least)}, "
            f"{least / total:.2f}x onnxruntime's {core.fmt_time(total)}")
    if whole:
        model_ort, products = whole
        note += (f"; with the products' floor {core.fmt_time(products)}: {(least + products) / model_ort:.2f}x "
                 f"onnxruntime's whole run ({core.fmt_time(model_ort)}; measured apart, a lower bound)")
    print(note)


# The whole-model floor (the module's docstring): what each node costs at least, in run order.
VIEWS = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Transpose", "Shape", "Size", "Expand",
         "Constant", "ConstantOfShape"}
# Elementwise ops that fold into a product or the pass next to them (a scale, a bias, a type change).
LINEAR = {"DequantizeLinear", "Cast"}
SCALED = {"Mul", "Add", "Sub", "Div"}           # linear when the other operand is a constant or a scalar
UNARY = {"HardSwish", "HardSigmoid", "Relu", "LeakyRelu", "PRelu", "Clip", "Sigmoid", "Tanh", "Erf", "Gelu",
         "Exp", "Log", "Sqrt", "Abs", "Neg", "Softplus", "Elu", "Selu", "Mish", "Round", "Floor", "Ceil"}
QUANTIZED_OUT = {"QLinearConv", "QLinearMatMul"}    # products that requantize their own output (and QGemm with y_scale)


def elementwise_passes(model, steps) -> list[tuple[str, str, tuple[int, ...], str]]:
    """The passes over tensors a numpy runtime cannot avoid between the products, one per entry
    (node name, op type, the tensor's shape, what the pass stands for), in run order:
    - a QuantizeLinear on a computed tensor: one pass over its input (the requantization: a
      QuantizeLinear -> DequantizeLinear pair, or the lookup over codes a table of 256 entries
      makes of DequantizeLinear -> a unary activation -> QuantizeLinear);
    - a product that requantizes its output (QLinearConv, QLinearMatMul, QGemm with y_scale): one
      pass over the output;
    - a unary activation: one pass, none when it only feeds QuantizeLinear (the lookup above);
    - DequantizeLinear, Cast and Mul/Add/Sub/Div by a constant or a scalar: none (they fold into the
      product's weights or bias, or into the pass next to them); views (Reshape, Transpose, ...): none;
    - any other node on computed tensors (residual Add, pooling, Softmax, LayerNormalization,
      DynamicQuantizeLinear, Gather): one pass over its largest tensor.
    Nodes on constants alone do nothing (folded at prepare). Each pass is timed as the cheapest
    numpy call there is over a float32 tensor of that shape (one in-place multiply), so the count
    errs low: a numpy QuantizeLinear takes 3 or 4 such calls (scale, round, clip, back)."""
    consumers: dict[str, list[str]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node.op_type)
    passes = []
    for info, live, outputs in _computed(model, steps):
        op = info.op_type
        if op in PRODUCTS:
            quantized = op in QUANTIZED_OUT or op == "QGemm" and len(info.inputs) > 6 and info.inputs[6]
            if quantized:
                passes.append((info.name, op, outputs[0].shape, "requantization of its output"))
        elif op in VIEWS or op in LINEAR or op in SCALED and sum(x.size > 1 for x in live) <= 1:
            continue
        elif op == "QuantizeLinear":
            passes.append((info.name, op, live[0].shape, "requantization"))
        elif op in UNARY:
            if any(c != "QuantizeLinear" for c in consumers.get(info.outputs[0], ["graph output"])):
                passes.append((info.name, op, live[0].shape, "activation"))
        else:
            big = max([*live, *(y for y in outputs if y is not None)], key=lambda a: a.size)
            passes.append((info.name, op, big.shape, op))
    return passes


def _computed(model, steps):
    """(StepInfo, its inputs computed from the graph's inputs, its outputs) of the steps that have
    such inputs, in run order: the others work on constants alone (folded at prepare)."""
    computed = {i.name for i in model.graph.input} - {t.name for t in model.graph.initializer}
    for info, inputs, outputs in steps:
        live = [x for name, x in zip(info.inputs, inputs) if name in computed and x is not None]
        if live:
            computed.update(info.outputs)
            yield info, live, outputs


def _pass_fn(shape):
    """The cheapest numpy pass over a float32 tensor of this shape: one in-place multiply."""
    y = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    return lambda: np.multiply(y, np.float32(1.0), out=y)


def best_depthwise(layers) -> tuple[list[Callable], list[str]]:
    """Each depthwise layer's fastest floor variant (of FLOORS'), timed as the depthwise table times
    them (_time_layers, DW_BLOCKS blocks of DW_CALLS calls): (the functions, their labels)."""
    kinds: dict[str, list] = {}
    for _, x, w, _, at in layers:
        for make in FLOORS.values():
            for label, f in make(x, w, at)[0].items():
                kinds.setdefault(label, []).append(f)
    med = _time_layers(kinds, DW_BLOCKS, DW_CALLS)
    labels = [min(kinds, key=lambda k: med[k][i]) for i in range(len(layers))]
    return [kinds[label][i] for i, label in enumerate(labels)], labels


def whole_floor(app, steps) -> tuple[dict[str, Callable], list[tuple[str, str, Callable]]]:
    """-> ({"products": ..., "depthwise": ..., "passes": ..., "whole": ...}, order): functions
    running, in run order inside blas.during_run, one part of the whole-model floor (the products;
    the depthwise Convs, each at its layer's fastest variant; the elementwise passes) or all of it;
    order: (part, node name, function) of each piece, in run order."""
    seen = _record(app, steps)
    if len({info.name for info, _, _ in steps}) < len(steps):
        raise SystemExit(f"{app.name}: nodes share a name; the whole floor pairs steps by name")
    layers = _depthwise(app, seen)
    dw_fns, _ = best_depthwise(layers) if layers else ([], [])
    dw_by_name = {name: f for (name, *_), f in zip(layers, dw_fns)}
    passes = {name: _pass_fn(shape) for name, _, shape, _ in elementwise_passes(app.model, steps)}
    product = dict(zip([name for name, _, _ in seen], _product_fns(app, seen)))
    order = []
    for info, _, _ in steps:
        if info.name in dw_by_name:
            order.append(("depthwise", info.name, dw_by_name[info.name]))
        elif product.get(info.name) is not None:
            order.append(("products", info.name, product[info.name]))
        if info.name in passes:
            order.append(("passes", info.name, passes[info.name]))
    parts = {"products": {"products"}, "depthwise": {"depthwise"}, "passes": {"passes"},
             "whole": {"products", "depthwise", "passes"}}
    return {label: _in_run([f for p, _, f in order if p in keep]) for label, keep in parts.items()}, order


def _in_run(fns):
    def run():
        with blas.during_run():         # the products on the threads a run gives them (blas.py's policy)
            for f in fns:
                f()
    return run


def per_node(app, steps, order, ort_time: float) -> None:
    """Print the whole floor node by node next to onnx_mini's profile (optimised, as it runs): each
    product node with the nodes after it up to the next product (its requantization, activation,
    pooling: what onnx_mini fuses into it), so that the two runtimes' rows cover the same nodes (a
    node onnx_mini fused from several products, as bert's Q, K, V, counts in its first one's row);
    then the sums per kind."""
    group_of, groups, anchor = {}, {}, None       # written node -> its product node; product -> (op, shape)
    dw = {name for name, *_ in _depthwise(app, _record(app, steps))}
    for info, _, outputs in _computed(app.model, steps):
        if info.op_type in PRODUCTS or anchor is None:
            anchor = info.name
            kind = "depthwise" if info.name in dw else info.op_type
            groups[anchor] = (kind, "x".join(map(str, outputs[0].shape)))
        group_of[info.name] = anchor
    pieces: dict[str, list] = {g: [] for g in groups}
    for _, name, f in order:
        pieces[group_of[name]].append(f)
    floor = _time_layers({"floor": [_in_run(fs) for fs in pieces.values()]}, DW_BLOCKS, DW_CALLS)["floor"]
    prof = onnx_mini.profile(app.model, app.feeds, runs=DW_BLOCKS * DW_CALLS)
    mini = dict.fromkeys(groups, 0.0)
    other = 0.0
    for n in prof.nodes:
        if n.depth:
            continue
        g = next((group_of[w] for w in (n.fused_from or (n.name,)) if w in group_of), None)
        if g is None:
            other += n.self_per_run_s
        else:
            mini[g] += n.self_per_run_s
    rows = [[g or f"(unnamed {kind})", kind, shape, core.fmt_time(t), f"{t / ort_time:.2f}x", core.fmt_time(mini[g]),
             f"{mini[g] / max(t, 1e-9):.1f}x"] for (g, (kind, shape)), t in zip(groups.items(), floor)]
    rows.append(["(nodes the optimiser added)", "", "", "", "", core.fmt_time(other), ""])
    rows.append(["sum", "", "", core.fmt_time(sum(floor)), f"{sum(floor) / ort_time:.2f}x",
                 core.fmt_time(sum(mini.values()) + other), f"{(sum(mini.values()) + other) / sum(floor):.1f}x"])
    print(f"\n{app.name}: the whole floor per product node (with the nodes up to the next), against "
          f"onnxruntime's whole run ({core.fmt_time(ort_time)}) and onnx_mini's profile")
    _table(["node", "kind", "output", "floor", "floor / ort run", "onnx_mini (profiled)", "onnx_mini / floor"],
           rows)
    kinds: dict[str, list] = {}                 # kind -> [nodes, floor, onnx_mini]
    for (g, (kind, _)), t in zip(groups.items(), floor):
        k = kinds.setdefault(kind, [0, 0.0, 0.0])
        k[0], k[1], k[2] = k[0] + 1, k[1] + t, k[2] + mini[g]
    print("by kind (onnx_mini's rows in onnxruntime runs; the gap: onnx_mini - floor, where the room goes)")
    _table(["kind", "nodes", "floor / ort run", "onnx_mini / ort run", "gap / ort run"],
           [[kind, n, f"{t / ort_time:.2f}x", f"{m / ort_time:.2f}x", f"{(m - t) / ort_time:.2f}x"]
            for kind, (n, t, m) in kinds.items()])


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
    p.add_argument("--no-depthwise-tables", action="store_true", help="only the first two tables")
    p.add_argument("--per-node", action="store_true", help="the whole floor node by node, next to onnx_mini's profile")
    args = p.parse_args(argv)
    if core.ort is None:
        print(f"onnxruntime is needed here ({core.ORT_IMPORT_ERROR})")
        return 1
    print(core.machine_info())
    rows, parts = [], []
    whole = {}              # model -> (onnxruntime's whole run, its products' floor): the depthwise tables' note
    for name in CASES:
        if args.depthwise_only or args.only and not any(o in name for o in args.only):
            continue
        app = _build(name)
        steps = _record_steps(app)
        seen = _record(app, steps)
        n_passes = len(elementwise_passes(app.model, steps))
        floor_parts, order = whole_floor(app, steps)
        runners = {"onnx_mini": core.Runner("onnx_mini", app.model),
                   "onnxruntime": core.Runner("onnxruntime", app.model, intra_op_num_threads=2)}
        fns = {"onnx_mini": lambda r=runners["onnx_mini"]: app.run(r.call),
               "onnxruntime": lambda r=runners["onnxruntime"]: app.run(r.call),
               **floor_parts}
        per = {k: [] for k in fns}
        for blk in range(BLOCKS):
            for k in (fns if blk % 2 == 0 else list(fns)[::-1]):
                per[k].append(statistics.median(time_block(fns[k], CALLS)))
        med = {k: statistics.median(v) for k, v in per.items()}
        ort_t = med["onnxruntime"]
        whole[name] = (ort_t, med["products"])
        ops = sorted({op for _, op, _ in seen})
        rows.append([name, f"{len(seen)} ({', '.join(ops)})", core.fmt_time(med["onnx_mini"]), core.fmt_time(ort_t),
                     core.fmt_time(med["products"]), f"{med['products'] / ort_t:.2f}x",
                     core.fmt_time(med["whole"]), f"{med['whole'] / ort_t:.2f}x", f"{med['onnx_mini'] / ort_t:.2f}x"])
        n_dw = len(_depthwise(app, seen))
        parts.append([name, f"{med['products'] / ort_t:.2f}x ({len(seen) - n_dw})",
                      f"{med['depthwise'] / ort_t:.2f}x ({n_dw})" if n_dw else "-",
                      f"{med['passes'] / ort_t:.2f}x ({n_passes})",
                      f"{(med['products'] + med['depthwise'] + med['passes']) / ort_t:.2f}x",
                      f"{med['whole'] / ort_t:.2f}x", f"{2 - med['whole'] / ort_t:.2f}x"])
        if args.per_node:
            per_node(app, steps, order, ort_t)
        print(f"{name}: done", flush=True)
    if rows:
        _table(["model", "product nodes", "onnx_mini", "onnxruntime", "products floor", "/ ort", "whole floor",
                "/ ort", "onnx_mini / ort"], rows)
        print("products floor: the products alone in float32 numpy; whole floor: the products, every depthwise "
              "Conv at its fastest numpy variant and the elementwise passes a numpy runtime cannot avoid, "
              "in run order (see the module's docstring); "
              f"{BLOCKS} alternating blocks of {CALLS} calls after a {core.PAUSE} s pause, per-call medians")
        print("\nThe whole floor's parts, each timed alone in run order, against onnxruntime's whole run "
              "(in brackets: how many nodes or passes)")
        _table(["model", "products", "depthwise Convs", "elementwise passes", "sum of parts", "whole floor",
                "room under 2.0x (2 - whole floor)"], parts)
    if args.no_depthwise_tables:
        return 0
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
