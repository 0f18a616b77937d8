"""A Scan body's input projection hoisted out of the loop: one product over all the steps.

A Scan (opset 9+) whose body multiplies a scan input, read by that MatMul alone (as its first operand),
by a 2-D matrix the body does not compute (an outer-scope value, constant over the Scan, or a body
initializer) computes the same rows as one MatMul of the whole scan input by that matrix before the
loop, when the scan input's rank is known before run (to place its scan axis):

    Scan(h0, x){ x_t @ W ... }   ->   xW = MatMul(x, W);  Scan(h0, xW){ xW_t ... }

Row t of MatMul(x, W) along the scan axis is MatMul(x_t, W) for any axis but the contracted last
one (W being 2-D, the product maps each row of x alone), so the scan axis and direction stay as
written; the body's MatMul goes, its output name becoming the body's input. One [T, K] x [K, N]
product replaces T [1, K] x [K, N] ones (an RNN step's dispatch and BLAS set-up: scan_rnn's 100
steps of [1, 64] x [64, 128]: 10.1 -> 8.0 us a step, measured under load); only the product's
summation order may change (rounding level).
The body's remaining x W_t + h R + b then fuses into one step (fuse.py, when the body is planned).
The product of every step is held while the Scan runs ([T, ..., N], as a scan output of N columns).

Also, in the body of such a Scan (hoisted or not), an Identity making a body output of a value the
body computes, read by nothing else, goes: the output lists that value instead (a body output
may name a value another one names; each output keeps its declared type): one executor step fewer
per iteration (~0.2 us of ~8 a step on scan_rnn, whose y is Identity(h); measured under load).

Opset 8's Scan (batch axis, sequence_lens) is left as written.
"""
from __future__ import annotations

from dataclasses import replace

from ..graph import Graph, Node, TypeInfo, ValueInfo, free_names, normalize_domain
from ._context import Context

_SCAN_VERSIONS = (9, 11, 16, 19, 21, 23, 24, 25)
_MATMUL_VERSIONS = (1, 9, 13)


def hoist_scan_projections(ctx: Context) -> bool:
    changed = False
    for scan in list(ctx.nodes):
        if (scan.op_type != "Scan" or normalize_domain(scan.domain) != "" or not ctx.alive(scan)
                or ctx.version(scan) not in _SCAN_VERSIONS):
            continue
        new = _hoisted(ctx, scan)
        if new is not None:
            ctx.replace([scan], new)
            changed = True
    return changed


def _hoisted(ctx: Context, scan: Node) -> list[Node] | None:
    """[the hoisted MatMuls..., the Scan reading their products] or None when nothing applies."""
    body = scan.attrs.get("body")
    m = scan.attrs.get("num_scan_inputs")
    if not isinstance(body, Graph) or not isinstance(m, int) or set(scan.attrs) - _ATTRS:
        return None
    n_state = len(scan.inputs) - m
    if m < 1 or n_state < 0 or len(body.inputs) != len(scan.inputs):
        return None
    axes = scan.attrs.get("scan_input_axes")
    axes = [0] * m if axes is None else list(axes)
    if len(axes) != m:
        return None                   # the kernel's error stays
    inputs, hoisted = list(scan.inputs), []
    for j in range(m):
        found = _projection(ctx, scan, body, n_state + j, axes[j])
        if found is None:
            continue
        mm, w_outer, new_input = found
        out = ctx.new_name(mm.outputs[0])
        name = f"{scan.name}/{mm.name}" if scan.name and mm.name else mm.name
        hoisted.append(Node(name=name, op_type="MatMul", domain="", inputs=(inputs[n_state + j], w_outer),
                            outputs=(out,), attrs={}, index=scan.index))
        inputs[n_state + j] = out
        old = body.inputs[n_state + j].name
        body = replace(body, nodes=[n for n in body.nodes if n is not mm],
                       inputs=[new_input if k == n_state + j else v for k, v in enumerate(body.inputs)],
                       value_info={k: v for k, v in body.value_info.items() if k not in (old, new_input.name)})
    bare = _without_output_identities(body)
    if not hoisted and bare is None:
        return None
    body = body if bare is None else bare
    attrs = {**scan.attrs, "body": body}
    return [*hoisted, replace(scan, inputs=tuple(inputs), attrs=attrs, captures=free_names(body))]


_ATTRS = frozenset(("body", "num_scan_inputs", "scan_input_axes", "scan_input_directions",
                    "scan_output_axes", "scan_output_directions"))


def _projection(ctx: Context, scan: Node, body: Graph, k: int, axis: int):
    """(the body MatMul to hoist, the outer name of its matrix, the body input replacing body input k)
    when body input k, a scan input, is read once, by a MatMul as its first operand alone, and its
    matrix is a 2-D value the body does not compute; else None."""
    cell = body.inputs[k].name
    x = scan.inputs[k]
    if not x or cell in {v.name for v in body.outputs} or [v.name for v in body.inputs].count(cell) != 1:
        return None
    readers = [n for n in body.nodes if cell in n.inputs or cell in n.captures]
    if len(readers) != 1:
        return None
    mm = readers[0]
    if (mm.op_type != "MatMul" or normalize_domain(mm.domain) != "" or mm.opsets is not None or mm.attrs
            or len(mm.inputs) != 2 or mm.inputs[0] != cell or mm.inputs[1] == cell or len(mm.outputs) != 1
            or not mm.outputs[0] or mm.outputs[0] in {v.name for v in body.outputs}
            or ctx.version(mm) not in _MATMUL_VERSIONS):
        return None
    # the scan axis must not be the contracted one: 0 <= axis <= rank - 2 (negative from opset 11)
    rank = ctx.rank(x)
    if rank is None or rank < 2 or (axis < 0 and ctx.version(scan) < 11):
        return None
    if not 0 <= (axis + rank if axis < 0 else axis) <= rank - 2:
        return None
    w = mm.inputs[1]
    # the matrix: not computed in the body (a body initializer moves out as a copy of itself)
    if not w or w in {v.name for v in body.inputs} or any(w in n.outputs for n in body.nodes):
        return None
    if w in body.initializers:
        value = body.initializers[w]
        if getattr(value, "ndim", None) != 2:
            return None
        w_outer = ctx.add_initializer(w, value)
    else:
        if ctx.rank(w) != 2:
            return None
        w_outer = w
    return mm, w_outer, ValueInfo(mm.outputs[0], _row_type(ctx, body, k, w_outer, mm.outputs[0]))


def _row_type(ctx: Context, body: Graph, k: int, w: str, out: str) -> TypeInfo | None:
    """The new body input's type: the body's declared one for the product, else the scan input row's
    element type with its shape's last dim replaced by the matrix's columns (when both are known)."""
    declared = body.value_info.get(out)
    if declared is not None and declared.type is not None:
        return declared.type
    t = body.inputs[k].type
    if t is None or t.kind != "tensor":
        return None
    w_shape = ctx.static_shape(w)
    shape = None
    if t.shape is not None and len(t.shape) >= 1 and w_shape is not None:
        shape = (*t.shape[:-1], w_shape[1])
    return TypeInfo("tensor", t.elem_type, shape)


def _without_output_identities(body: Graph) -> Graph | None:
    """The body with each Identity that makes a body output (of a value a body node computes, the
    output named once and read by no node) dropped, the output naming its input; None if none."""
    producer = {o: n for n in body.nodes for o in n.outputs if o}
    read = {x for n in body.nodes for x in (*n.inputs, *n.captures)}
    names = [v.name for v in body.outputs]
    outputs, dropped = list(body.outputs), []
    for k, v in enumerate(body.outputs):
        node = producer.get(v.name)
        if (node is None or node.op_type != "Identity" or normalize_domain(node.domain) != "" or node.attrs
                or len(node.inputs) != 1 or len(node.outputs) != 1 or node.inputs[0] not in producer
                or v.name in read or names.count(v.name) != 1):
            continue
        outputs[k] = ValueInfo(node.inputs[0], v.type)
        dropped.append(node)
    if not dropped:
        return None
    return replace(body, nodes=[n for n in body.nodes if all(n is not d for d in dropped)], outputs=outputs)
