"""Patterns written as elementary ops by exporters, run by one kernel of the private domain each.

- SiLU / Swish:  Mul(x, Sigmoid(x))                                  -> Swish(x)
- HardSwish as written by PaddlePaddle's exporter: Div(Mul(x, Clip(Add(x, 3), 0, 6)), 6) (or the last
                 step a Mul by a constant), constants exactly these, float32 / float64
                                                                       -> ClipSwish(x, scale_op, scale)
- Gelu (erf):    x * 0.5 * (1 + Erf(x / sqrt(2)))  (Div by sqrt 2 or Mul by 1/sqrt 2; the three products
                 in any grouping)                                      -> Gelu(x)
- Gelu (tanh):   x * 0.5 * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))  (Pow(x, 3) or x*x*x, the
                 four factors of 0.044715 * x^3 in any grouping: jax2tf's x * (x * (0.044715 * x)))
                                                                       -> Gelu(x, approximate='tanh')
- LayerNorm:     ReduceMean, Sub, Pow 2 (or Mul d*d), ReduceMean, Add eps, Sqrt, Div, Mul scale, Add bias
                                                                       -> LayerNormalization(x, scale, bias)
- attention:     MatMul(Softmax(MatMul(Q, K') [/ c or * c] [+ mask]), V), softmax over the last axis
                                                                       -> Attention(Q, K, V[, mask])
- int8 tail:     MatMulInteger(A, B, a_zp, b_zp) -> Cast(to=FLOAT) -> Mul(., s) [-> Add(., bias)], B a
                 constant int8/uint8 matrix with K * 255 * 255 < 2^31 (the exact sums fit the int32 that
                 Cast reads), s a float32 per-tensor or per-column scale (when s = Mul(s1, s2) is read
                 there alone, that Mul too), bias a constant one
                                                         -> MatMulIntegerScaled(A, B, a_zp, b_zp, s1, s2[, bias])
- int8 codes:    DynamicQuantizeLinear(x) -> (q, s, zp) with q read only as A of such MatMulIntegerScaled steps
                 whose a_zp is zp                 -> DynamicQuantizeCentred(x) giving q - zp in float32,
                                                     the steps marked centred=1
- int8 siblings: MatMulIntegerScaled steps with the same A and a_zp, constant Bs of one K and type whose
                 joint product stays exact in float32           -> MatMulIntegerScaledGroup (one output each)
- int8 + Gelu:   a MatMulIntegerScaled step whose result a Gelu alone reads
                                                  -> MatMulIntegerScaled(activation="Gelu", approximate=its own)
- one-hot product: MatMul(Cast(Equal(A, C)), E), C a constant integer [1, ..., 1, K] of distinct values,
                 E a constant finite [K, D] float32 / float64 matrix (jax2tf's one_hot + Dense)
                                                                       -> OneHotMatMul(A, C, E)

Every intermediate must be read by the next node of the pattern alone (never a graph output or a
subgraph capture); numeric constants must be scalars (0-d, or of a rank that cannot broadcast the
result to a larger shape) within 1e-4 of the expected value.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from ..ops.fused import one_hot_bias
from ._context import FUSED_DOMAIN, Context, written_nodes

_ELEM = (7, 13, 14)           # Add / Sub / Mul / Div with numpy broadcasting
_POW = (7, 12, 13, 15)


def fuse_patterns(ctx: Context) -> bool:
    changed = False
    for rule in RULES:
        for node in list(ctx.nodes):
            if ctx.alive(node):     # still there (an earlier match may have taken it)
                changed |= rule(ctx, node)
    return changed


# -- helpers -------------------------------------------------------------------------------------

def _out(node) -> str:
    return node.outputs[0] if len(node.outputs) == 1 else ""


def _next(ctx: Context, node, op: str, versions=_ELEM):
    """The node reading `node`'s single output alone, if it is `op` at one of `versions`."""
    o = _out(node)
    user = ctx.single_user(o) if o else None
    return user if ctx.is_op(user, op, versions) else None


def _prev(ctx: Context, name: str, op: str, reader, versions=_ELEM):
    """The producer of `name` if it is `op` and `reader` alone reads its single output."""
    p = ctx.producer.get(name)
    if ctx.is_op(p, op, versions) and _out(p) == name and ctx.only_consumer(name, reader):
        return p
    return None


def _const(ctx: Context, name: str, target: float, like: str) -> bool:
    """`name` is a scalar constant close to target, that cannot change the shape of `like` by broadcasting."""
    if not ctx.close(name, target):
        return False
    nd = ctx.value(name).ndim
    rank = ctx.rank(like)
    return nd == 0 or (rank is not None and nd <= rank)


def _other(node, name: str) -> str | None:
    """The other input of a binary node one of whose inputs is `name`."""
    if len(node.inputs) != 2:
        return None
    a, b = node.inputs
    return b if a == name else a if b == name else None


def _fuse(ctx: Context, nodes: list, op: str, inputs, attrs: dict) -> bool:
    ctx.replace(nodes, [ctx.fused_node(nodes[-1], op, inputs, nodes[-1].outputs, attrs)])
    return True


# -- SiLU ------------------------------------------------------------------------------------------

def _silu(ctx: Context, sig) -> bool:
    if not ctx.is_op(sig, "Sigmoid", (1, 6, 13)) or not sig.inputs or not sig.inputs[0]:
        return False
    x = sig.inputs[0]
    mul = _next(ctx, sig, "Mul")
    if mul is None or _other(mul, _out(sig)) != x:
        return False
    return _fuse(ctx, [sig, mul], "Swish", (x,), {})


# -- HardSwish written as Add, Clip, Mul, Div ------------------------------------------------------------

_CLIP_VERSIONS = (1, 6, 11, 12, 13)


def _exactly(ctx: Context, name: str, value: float, like: str, dtype=None):
    """The dtype of constant `name` when it holds exactly `value` in float32 / float64 (of `dtype` when
    given) and cannot broadcast `like` to a larger shape, else None."""
    v = ctx.value(name) if name and ctx.is_constant(name) else None
    if (not isinstance(v, np.ndarray) or v.size != 1 or v.dtype not in _FLOAT_TYPES
            or (dtype is not None and v.dtype != dtype)
            or float(v.reshape(())) != value or not _const(ctx, name, value, like)):
        return None
    return v.dtype


_FLOAT_TYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _clip_swish(ctx: Context, add) -> bool:
    """Add(x, 3) -> Clip(0, 6) -> Mul(x, .) -> Div(., 6) or Mul(., c): one step doing those very
    operations in that order (the values of the four nodes, bit for bit), which fuse.py may then put in a
    Conv's epilogue. ONNX's HardSwish (x * clip(x / 6 + 1 / 2, 0, 1)) rounds otherwise: not that."""
    if not ctx.is_op(add, "Add") or len(add.inputs) != 2 or not all(add.inputs):
        return False
    clip = _next(ctx, add, "Clip", _CLIP_VERSIONS)     # (the cheap test first: every Add comes here)
    if clip is None or clip.inputs[0] != _out(add):
        return False
    for x, three in (add.inputs, add.inputs[::-1]):
        dtype = _exactly(ctx, three, 3.0, x)
        if dtype is not None and not ctx.is_constant(x):
            break
    else:
        return False
    if ctx.version(clip) >= 11:
        if len(clip.inputs) != 3 or _exactly(ctx, clip.inputs[1], 0.0, x, dtype) is None \
                or _exactly(ctx, clip.inputs[2], 6.0, x, dtype) is None:
            return False
    elif clip.attrs.get("min") != 0.0 or clip.attrs.get("max") != 6.0 or len(clip.inputs) != 1:
        return False
    mul = _next(ctx, clip, "Mul")
    if mul is None or _other(mul, _out(clip)) != x:
        return False
    last = ctx.single_user(_out(mul)) if _out(mul) else None
    for op in ("Div", "Mul"):     # / 6, or * any constant
        if ctx.is_op(last, op, _ELEM) and len(last.inputs) == 2 and last.inputs[0] == _out(mul):
            scale = 6.0 if op == "Div" else ctx.scalar(last.inputs[1])
            if scale is not None and _exactly(ctx, last.inputs[1], scale, x, dtype) is not None:
                return _fuse(ctx, [add, clip, mul, last], "ClipSwish", (x,), {"scale_op": op, "scale": scale})
    return False


# -- Gelu --------------------------------------------------------------------------------------------

def _gelu_tail(ctx: Context, node, x: str):
    """After Erf / Tanh: Add 1, then the product with x and 0.5 (any grouping) -> (nodes, ok)."""
    add = _next(ctx, node, "Add")
    if add is None or not _const(ctx, _other(add, _out(node)) or "", 1.0, x):
        return None
    m1 = _next(ctx, add, "Mul")
    if m1 is None:
        return None
    o = _other(m1, _out(add))
    if o == x:                                   # (x * (1 + e)) * 0.5
        m2 = _next(ctx, m1, "Mul")
        if m2 is not None and _const(ctx, _other(m2, _out(m1)) or "", 0.5, x):
            return [add, m1, m2]
        return None
    if o and _const(ctx, o, 0.5, x):              # x * ((1 + e) * 0.5)
        m2 = _next(ctx, m1, "Mul")
        if m2 is not None and _other(m2, _out(m1)) == x:
            return [add, m1, m2]
        return None
    h = _prev(ctx, o, "Mul", m1) if o else None   # (x * 0.5) * (1 + e)
    if h is not None and x in h.inputs and _const(ctx, _other(h, x) or "", 0.5, x):
        return [h, add, m1]
    return None


def _gelu_erf(ctx: Context, erf) -> bool:
    if not ctx.is_op(erf, "Erf", (9, 13)) or not erf.inputs or not erf.inputs[0]:
        return False
    pre = ctx.producer.get(erf.inputs[0])
    if pre is None or not ctx.only_consumer(erf.inputs[0], erf) or len(pre.inputs) != 2:
        return False
    x, c = pre.inputs
    if ctx.is_op(pre, "Div"):
        ok = _const(ctx, c, math.sqrt(2.0), x)
    elif ctx.is_op(pre, "Mul"):
        if not _const(ctx, c, 1 / math.sqrt(2.0), x):
            x, c = c, x
        ok = _const(ctx, c, 1 / math.sqrt(2.0), x)
    else:
        return False
    tail = _gelu_tail(ctx, erf, x) if ok else None
    if tail is None:
        return False
    return _fuse(ctx, [pre, erf, *tail], "Gelu", (x,), {"approximate": "none"})


def _product_leaves(ctx: Context, name: str, reader, nodes: list, leaves: list) -> None:
    """The factors of `name` as a tree of Mul nodes, each read by the next alone (appended to nodes),
    Pow(x, 3) counted as three factors x; anything else is a leaf. At most three nodes in all: a
    product of four factors has three."""
    p = ctx.producer.get(name)
    if (p is not None and len(nodes) < 3 and len(p.inputs) == 2 and _out(p) == name
            and ctx.only_consumer(name, reader)):
        if ctx.is_op(p, "Mul"):
            nodes.append(p)
            for i in p.inputs:
                _product_leaves(ctx, i, p, nodes, leaves)
            return
        if ctx.is_op(p, "Pow", _POW) and _const(ctx, p.inputs[1], 3.0, p.inputs[0]):
            nodes.append(p)
            leaves += [p.inputs[0]] * 3
            return
    leaves.append(name)


def _scaled_cube(ctx: Context, name: str, reader, x: str):
    """The nodes making `name` = 0.044715 * x^3 read by `reader` alone, in any grouping of the product:
    (x^3) * c with x^3 = Pow(x, 3), x * (x * x) or (x * x) * x, or c folded in anywhere (jax2tf writes
    x * (x * (c * x))); else None."""
    nodes, leaves = [], []
    _product_leaves(ctx, name, reader, nodes, leaves)
    if not nodes or len(leaves) != 4 or leaves.count(x) != 3:
        return None
    c = next(v for v in leaves if v != x)
    return nodes if _const(ctx, c, 0.044715, x) else None


def _gelu_tanh(ctx: Context, th) -> bool:
    if not ctx.is_op(th, "Tanh", (1, 6, 13)) or not th.inputs or not th.inputs[0]:
        return False
    scale = _prev(ctx, th.inputs[0], "Mul", th)
    if scale is None or len(scale.inputs) != 2:
        return False
    k = math.sqrt(2.0 / math.pi)
    for i in (0, 1):
        inner = _prev(ctx, scale.inputs[i], "Add", scale)
        if inner is None or len(inner.inputs) != 2 or not ctx.close(scale.inputs[1 - i], k):
            continue
        for j in (0, 1):
            x = inner.inputs[1 - j]
            cube = _scaled_cube(ctx, inner.inputs[j], inner, x)
            if cube is None:
                continue
            if not _const(ctx, scale.inputs[1 - i], k, x):
                return False
            tail = _gelu_tail(ctx, th, x)
            if tail is None:
                return False
            return _fuse(ctx, [*cube, inner, scale, th, *tail], "Gelu", (x,), {"approximate": "tanh"})
    return False


# -- LayerNormalization ----------------------------------------------------------------------------

def _reduce_axes(ctx: Context, node, x: str):
    """The normalised axis of a ReduceMean (keepdims) over a trailing run of axes ending at the last,
    as a negative number; None otherwise."""
    if not ctx.is_op(node, "ReduceMean", (1, 11, 13, 18)) or not node.attrs.get("keepdims", 1):
        return None
    axes = ctx.axes(node)       # (an attribute before opset 18, the second input from it)
    if not axes:
        return None
    if any(a >= 0 for a in axes):
        rank = ctx.rank(x)
        if rank is None:
            return None
        axes = [a - rank if a >= 0 else a for a in axes]
    axes = sorted(set(axes))
    if axes != list(range(-len(axes), 0)):
        return None
    return axes[0]


def _layer_norm(ctx: Context, r1) -> bool:
    if not r1.inputs or not r1.inputs[0]:
        return False
    x = r1.inputs[0]
    axis = _reduce_axes(ctx, r1, x)
    if axis is None:
        return False
    sub = _next(ctx, r1, "Sub")
    if sub is None or sub.inputs != (x, _out(r1)):
        return False
    d = _out(sub)
    users = list({id(u): u for u in ctx.consumers.get(d, [])}.values())
    if d in ctx.outputs or len(users) != 2 or sum(len(u.captures) for u in users):
        return False
    sq = next((u for u in users if ctx.is_op(u, "Pow", _POW) and u.inputs[0] == d
               and _const(ctx, u.inputs[1], 2.0, d)), None) or \
        next((u for u in users if ctx.is_op(u, "Mul") and u.inputs == (d, d)), None)
    div = next((u for u in users if ctx.is_op(u, "Div") and len(u.inputs) == 2 and u.inputs[0] == d), None)
    if sq is None or div is None or sq is div:
        return False
    r2 = ctx.single_user(_out(sq))
    if r2 is None or _reduce_axes(ctx, r2, d) != axis:
        return False
    add = _next(ctx, r2, "Add")
    eps_name = _other(add, _out(r2)) if add is not None else None
    if not eps_name or not ctx.is_constant(eps_name) or ctx.scalar(eps_name) is None:
        return False
    eps = ctx.scalar(eps_name)
    if not (0 <= eps < 1) or not _const(ctx, eps_name, eps, x):
        return False
    root = _next(ctx, add, "Sqrt", (1, 6, 13))
    if root is None or ctx.single_user(_out(root)) is not div or div.inputs[1] != _out(root):
        return False
    mul = _next(ctx, div, "Mul")
    if mul is None:
        return False
    scale = _other(mul, _out(div))
    bias_add = _next(ctx, mul, "Add")
    bias = _other(bias_add, _out(mul)) if bias_add is not None else None
    if not scale or not bias or not _affine_param(ctx, scale, axis) or not _affine_param(ctx, bias, axis):
        return False
    return _fuse(ctx, [r1, sub, sq, r2, add, root, div, mul, bias_add], "LayerNormalization",
                 (x, scale, bias), {"axis": axis, "epsilon": eps})


def _affine_param(ctx: Context, name: str, axis: int) -> bool:
    """A constant scale/bias that broadcasts over the normalised axes only (rank <= their count)."""
    v = ctx.value(name)
    return v is not None and hasattr(v, "ndim") and v.ndim <= -axis


# -- attention -------------------------------------------------------------------------------------

def _attention(ctx: Context, sm) -> bool:
    v = ctx.version(sm) if ctx.is_op(sm, "Softmax", (1, 11, 13)) else None
    if v is None or not sm.inputs or not sm.inputs[0]:
        return False
    if sm.attrs.get("axis", -1 if v >= 13 else 1) != -1:
        return False
    pv = ctx.single_user(_out(sm))
    if not ctx.is_op(pv, "MatMul", (1, 9, 13)) or pv.inputs[0] != _out(sm) or pv.inputs[1] == _out(sm):
        return False
    nodes = [sm, pv]
    cur, reader = sm.inputs[0], sm
    mask = None
    add = _prev(ctx, cur, "Add", reader)
    if add is not None and len(add.inputs) == 2:
        for i in (0, 1):
            inner = ctx.producer.get(add.inputs[i])
            if (inner is not None and inner.op_type in ("Div", "Mul", "MatMul")
                    and ctx.only_consumer(add.inputs[i], add)):
                mask, cur, reader = add.inputs[1 - i], add.inputs[i], add
                nodes.insert(0, add)
                break
    scale, divide = 1.0, 0
    for op in ("Div", "Mul"):
        s = _prev(ctx, cur, op, reader)
        if s is None or len(s.inputs) != 2:
            continue
        a, c = s.inputs
        if op == "Mul" and ctx.scalar(a) is not None and ctx.scalar(c) is None:
            a, c = c, a
        val = ctx.scalar(c)
        if val is None or not _const(ctx, c, val, a) or val == 0:
            return False
        scale, divide = val, int(op == "Div")
        cur, reader = a, s
        nodes.insert(0, s)
        break
    qk = _prev(ctx, cur, "MatMul", reader, (1, 9, 13))
    if qk is None or len(qk.inputs) != 2:
        return False
    nodes.insert(0, qk)
    q, k = qk.inputs
    transpose_k = 0
    tr = _prev(ctx, k, "Transpose", qk, (1, 13, 21, 23, 24, 25))
    perm = tr.attrs.get("perm") if tr is not None else None
    if perm is not None and len(perm) >= 2 and list(perm) == [*range(len(perm) - 2), len(perm) - 1, len(perm) - 2]:
        k, transpose_k = tr.inputs[0], 1
        nodes.insert(0, tr)
    inputs = (q, k, pv.inputs[1]) + ((mask,) if mask else ())
    return _fuse(ctx, nodes, "Attention", inputs, {"scale": scale, "divide": divide, "transpose_k": transpose_k})


# -- the dynamic-int8 product tail ----------------------------------------------------------------

_F32 = np.dtype(np.float32)


def _int_product_tail(ctx: Context, mm) -> bool:
    if not ctx.is_op(mm, "MatMulInteger", (10,)) or len(mm.inputs) < 2 or not all(mm.inputs[:2]):
        return False
    w = ctx.value(mm.inputs[1]) if ctx.is_constant(mm.inputs[1]) else None
    if not isinstance(w, np.ndarray) or w.ndim < 2 or w.dtype.kind not in "iu" or w.dtype.itemsize != 1:
        return False
    if w.shape[-2] * 255 * 255 >= 1 << 31:   # |a - a_zp|, |b - b_zp| <= 255: else int32 might wrap before Cast
        return False
    cast = _next(ctx, mm, "Cast", None)
    if cast is None or cast.attrs.get("to") != 1:                  # TensorProto.FLOAT
        return False
    mul = _next(ctx, cast, "Mul")
    scale = _other(mul, _out(cast)) if mul is not None else None
    if not scale or not _scale_of(ctx, scale, w.shape[-1]):
        return False
    nodes, inputs = [mm, cast, mul], [*mm.inputs, "", ""][:4] + [scale, ""]
    product = _prev(ctx, scale, "Mul", mul)      # x_scale * w_scale read by this Mul alone: one step less
    if product is not None and not ctx.is_constant(scale) and len(product.inputs) == 2 and \
            all(_scale_of(ctx, x, w.shape[-1]) for x in product.inputs):
        nodes.insert(0, product)
        inputs[4:6] = product.inputs
    add = _next(ctx, mul, "Add")
    bias = _other(add, _out(mul)) if add is not None else None
    if bias and ctx.is_constant(bias) and _scale_of(ctx, bias, w.shape[-1]):
        nodes.append(add)
        inputs.append(bias)
    return _fuse(ctx, nodes, "MatMulIntegerScaled", inputs, {})


def _scale_of(ctx: Context, name: str, n: int, depth: int = 0) -> bool:
    """`name` is float32, one value or one per column (shape [] / [1] / [n]): it scales (or shifts) the
    [..., M, n] product without changing its shape. A constant, DynamicQuantizeLinear's scale (a float32
    scalar by the spec), or the Mul of two such (quantize_dynamic writes x_scale * w_scale)."""
    if ctx.is_constant(name):
        v = ctx.value(name)
        return isinstance(v, np.ndarray) and v.dtype == _F32 and v.ndim <= 1 and v.size in (1, n)
    p = ctx.producer.get(name)
    if ctx.is_op(p, "DynamicQuantizeLinear", (11,)):
        return len(p.outputs) > 1 and p.outputs[1] == name
    return (depth < 4 and ctx.is_op(p, "Mul") and len(p.inputs) == 2
            and all(_scale_of(ctx, x, n, depth + 1) for x in p.inputs))


def _centred_codes(ctx: Context, dq) -> bool:
    """After _int_product_tail: the products make the codes float32 and subtract the zero point again;
    DynamicQuantizeCentred gives them so, without the uint8 array (ops/contrib/quantized_matmul.py)."""
    if not ctx.is_op(dq, "DynamicQuantizeLinear", (11,)) or len(dq.outputs) < 3 or not all(dq.outputs):
        return False
    q, zp = dq.outputs[0], dq.outputs[2]
    users = ctx.consumers.get(q, [])
    if q in ctx.outputs or not users or any(
            u.domain != FUSED_DOMAIN or u.op_type != "MatMulIntegerScaled" or u.attrs.get("centred")
            or len(u.inputs) < 3 or u.inputs[0] != q or u.inputs[2] != zp or q in (*u.inputs[1:], *u.captures)
            for u in users):
        return False
    for u in list(users):                       # one by one: each keeps its place in the order
        ctx.replace([u], [replace(u, attrs={**u.attrs, "centred": 1})])
    ctx.replace([dq], [ctx.fused_node(dq, "DynamicQuantizeCentred", dq.inputs, dq.outputs, {})])
    return True


def _int_product_siblings(ctx: Context, first) -> bool:
    """After _centred_codes: MatMulIntegerScaled steps reading the same A and a_zp (a layer's Q, K, V)
    -> one MatMulIntegerScaledGroup step multiplying A once by their Bs side by side, where that product's
    sums stay exact in float32 (K * 255 * the largest measured |B - b_zp| <= 2^24: bit for bit each own
    product). It takes the place of the first step, so every other input must be there before it."""
    head = _sibling(ctx, first, None, None)
    if head is None:
        return False
    order = {id(n): i for i, n in enumerate(ctx.nodes)}
    start = order[id(first)]
    group, bounds = [first], [head[2]]
    a, a_zp = first.inputs[0], first.inputs[2]
    for u in sorted({id(u): u for u in ctx.consumers.get(a, [])}.values(), key=lambda n: order[id(n)]):
        if order[id(u)] <= start:
            continue
        got = _sibling(ctx, u, first, head)
        if got is not None and all(not x or ctx.is_constant(x) or ctx.producer.get(x) is None
                                   or order[id(ctx.producer[x])] < start for x in u.inputs[4:]):
            group.append(u)
            bounds.append(got[2])
    if len(group) < 2 or head[0] * 255 * max(bounds) > 1 << 24:
        return False
    inputs = [a, a_zp]
    for u in group:
        ins = [*u.inputs, "", ""][:7]
        inputs += [ins[1], ins[3], *ins[4:7]]
    attrs = {"centred": 1} if first.attrs.get("centred") else {}
    fused = ctx.fused_node(first, "MatMulIntegerScaledGroup", inputs, [u.outputs[0] for u in group], attrs)
    ctx.replace([first], [replace(fused, fused_from=written_nodes(group))])   # at the first step's place
    ctx.replace(group[1:], [])
    return True


def _sibling(ctx: Context, u, first, head):
    """(K, B's type, max |B - b_zp|) of a MatMulIntegerScaled step with a constant 2-D 8-bit B and a constant
    or absent zero point of its type (per tensor or per column); when `first` is given, one reading its A and
    a_zp, as centred as it, with a B of head's K and type. None otherwise."""
    if u.domain != FUSED_DOMAIN or u.op_type != "MatMulIntegerScaled" or u.captures or len(u.outputs) != 1 \
            or not u.outputs[0] or not 5 <= len(u.inputs) <= 7 or not u.inputs[0] or u.attrs.get("activation"):
        return None
    if first is not None and (u.inputs[0] != first.inputs[0] or u.inputs[2] != first.inputs[2]
                              or bool(u.attrs.get("centred")) != bool(first.attrs.get("centred"))):
        return None
    b = ctx.value(u.inputs[1]) if ctx.is_constant(u.inputs[1]) else None
    if not isinstance(b, np.ndarray) or b.ndim != 2 or b.dtype.kind not in "iu" or b.dtype.itemsize != 1:
        return None
    zp = None
    if u.inputs[3]:
        zp = ctx.value(u.inputs[3]) if ctx.is_constant(u.inputs[3]) else None
        if not isinstance(zp, np.ndarray) or zp.dtype != b.dtype or not (zp.size == 1 or zp.shape == (b.shape[1],)):
            return None
    if head is not None and (b.shape[0], b.dtype) != head[:2]:
        return None
    offsets = b.astype(np.int64) - (0 if zp is None else zp.reshape(-1).astype(np.int64))
    return b.shape[0], b.dtype, int(np.abs(offsets).max(initial=0))


def _int_product_gelu(ctx: Context, mm) -> bool:
    """After the siblings (a grouped step takes no activation): the Gelu that alone reads a MatMulIntegerScaled
    step's result (a BERT layer's first feed-forward product) done in that step: in place on its buffer, and
    in blas's split mode on the thread that made each block of rows (ops/contrib/quantized_matmul.py)."""
    if mm.domain != FUSED_DOMAIN or mm.op_type != "MatMulIntegerScaled" or mm.attrs.get("activation") \
            or mm.captures or len(mm.outputs) != 1 or not mm.outputs[0]:
        return False
    gelu = ctx.single_user(mm.outputs[0])
    if gelu is None or len(gelu.inputs) != 1 or len(gelu.outputs) != 1 or not (
            (gelu.domain == FUSED_DOMAIN and gelu.op_type == "Gelu") or ctx.is_op(gelu, "Gelu", (20,))):
        return False
    approximate = gelu.attrs.get("approximate", "none")
    if approximate not in ("none", "tanh"):
        return False
    ctx.replace([mm, gelu], [replace(mm, outputs=gelu.outputs,
                                     attrs={**mm.attrs, "activation": "Gelu", "approximate": approximate})])
    return True


# -- one-hot product ---------------------------------------------------------------------------------

_CAST_TO = {np.dtype(np.float32): 1, np.dtype(np.float64): 11}      # TensorProto FLOAT, DOUBLE


def _one_hot_product(ctx: Context, mm) -> bool:
    """MatMul(Cast(Equal(A, C)), E): C a constant integer [1, ..., 1, K] of distinct values, E a constant
    finite [K, D] float32 / float64 matrix, the Cast to E's type, each value read by the next alone ->
    OneHotMatMul(A, C, E) (ops/fused.py: rows of E gathered where A's last axis is 1); an Add of a
    constant B of E's type varying along the last axis alone (a Dense layer's bias: [1, ..., 1, D]),
    reading the product alone, joins it as OneHotMatMul(A, C, E, B) (the rows gathered from E + B)."""
    if not ctx.is_op(mm, "MatMul", (1, 9, 13)) or len(mm.inputs) != 2 or not ctx.is_constant(mm.inputs[1]):
        return False
    e = ctx.value(mm.inputs[1])
    if not isinstance(e, np.ndarray) or e.ndim != 2 or e.dtype not in _CAST_TO or not np.isfinite(e).all():
        return False
    cast = _prev(ctx, mm.inputs[0], "Cast", mm, None)
    if cast is None or cast.attrs.get("to") != _CAST_TO[e.dtype]:
        return False
    eq = _prev(ctx, cast.inputs[0], "Equal", cast, (7, 11, 13, 19))
    if eq is None or len(eq.inputs) != 2:
        return False
    for a, c in (eq.inputs, eq.inputs[::-1]):
        v = ctx.value(c) if ctx.is_constant(c) and not ctx.is_constant(a) else None
        if (isinstance(v, np.ndarray) and v.dtype.kind in "iu" and v.ndim >= 1 and v.shape[-1] == e.shape[0]
                and v.size == e.shape[0] and np.unique(v).size == v.size):
            add = _next(ctx, mm, "Add", (7, 13, 14))
            bias = _other(add, _out(mm)) if add is not None else None
            b = ctx.value(bias) if bias and ctx.is_constant(bias) else None
            if one_hot_bias(b, e):
                return _fuse(ctx, [eq, cast, mm, add], "OneHotMatMul", (a, c, mm.inputs[1], bias), {})
            return _fuse(ctx, [eq, cast, mm], "OneHotMatMul", (a, c, mm.inputs[1]), {})
    return False


RULES = (_silu, _clip_swish, _gelu_erf, _gelu_tanh, _layer_norm, _attention, _int_product_tail, _centred_codes,
         _int_product_siblings, _int_product_gelu, _one_hot_product)
