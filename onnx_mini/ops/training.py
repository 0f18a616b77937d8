"""Training operators of the ai.onnx.preview.training domain: Adagrad, Adam, Momentum, Gradient (version 1).

The optimizers take R (learning rate, scalar), T (update count, int64 scalar) and then n groups of
tensors laid out group by group (X_1..X_n, G_1..G_n, then V_1..V_n and/or H_1..H_n); they return
the new X_1..X_n followed by the new state tensors in the same layout. The scalars are read as
Python floats, so the element-wise math stays in each tensor's own type (float or double).

Gradient(xs, zs, y) differentiates the value `y` of the graph the node lives in with respect to the
graph values named in `xs`, at the point given by the node's inputs (the values of xs then zs).
A kernel does not see its graph, so the planner injects it (`_graph`, `_opsets`); at prepare time
the factory slices the nodes that compute y from xs/zs (graph initializers are constants), plans
them as a forward sub-plan, and at run time runs it and walks the nodes backwards applying each
op's vector-Jacobian product (reverse-mode differentiation). Supported ops: see _VJP.
"""
from __future__ import annotations

import numpy as np

from ..errors import InvalidValueError
from ..graph import Graph, ValueInfo, topo_sort
from ..plan import describe_value
from ..registry import kernel

TRAINING = "ai.onnx.preview.training"


# -- optimizers ------------------------------------------------------------------------------------

def _scalar(v: np.ndarray, what: str, kind: str):
    a = np.asarray(v)
    if a.size != 1:
        raise InvalidValueError(f"{what} must be a scalar, got shape {list(a.shape)}")
    if a.dtype.kind not in kind:
        raise InvalidValueError(f"{what} has type {a.dtype}")
    return a.reshape(()).item()


def _groups(tensors: tuple, k: int, n_outputs: int, k_out: int, op: str) -> list[tuple]:
    """Split the variadic inputs into n groups of k tensors (X, G, ...) of one type each."""
    if not tensors or len(tensors) % k:
        raise InvalidValueError(f"{op} takes R, T and then {k} tensors per optimized tensor; "
                                f"got {len(tensors)} after R and T")
    n = len(tensors) // k
    if n_outputs > k_out * n:
        raise InvalidValueError(f"{op} optimizing {n} tensor(s) has at most {k_out * n} outputs, "
                                f"the node has {n_outputs}")
    groups = [tuple(tensors[j * n + i] for j in range(k)) for i in range(n)]
    for i, g in enumerate(groups):
        if any(t.dtype != g[0].dtype for t in g) or g[0].dtype not in (np.float32, np.float64):
            raise InvalidValueError(f"tensors of group {i + 1} must all be float or all double, got "
                                    f"{[str(t.dtype) for t in g]}")
    return groups


def _arrange(per_group: list[tuple], n_outputs: int) -> tuple:
    """[(X_new, S_new, ...) per group] -> (X_1..X_n, S_1..S_n, ...), cut to the node's outputs."""
    return tuple(np.asarray(v) for outs in zip(*per_group) for v in outs)[:n_outputs]


def _check_count(n_inputs: int, k: int, op: str):
    if n_inputs < 2 + k or (n_inputs - 2) % k:
        raise ValueError(f"{op} takes R, T and then {k} tensors per optimized tensor, the node has "
                         f"{n_inputs} input(s)")


@kernel("Adagrad", since=1, domain=TRAINING)
def adagrad_1(*, decay_factor=0.0, epsilon=1e-6, norm_coefficient=0.0, _n_inputs, _n_outputs):
    _check_count(_n_inputs, 3, "Adagrad")

    def run(r, t, *tensors):
        lr = _scalar(r, "R", "f") / (1.0 + _scalar(t, "T", "iu") * decay_factor)
        out = []
        for x, g, h in _groups(tensors, 3, _n_outputs, 2, "Adagrad"):
            g_reg = norm_coefficient * x + g
            h_new = h + g_reg * g_reg
            out.append((x - lr * g_reg / (np.sqrt(h_new) + epsilon), h_new))
        return _arrange(out, _n_outputs)
    return run


@kernel("Adam", since=1, domain=TRAINING)
def adam_1(*, alpha=0.9, beta=0.999, epsilon=1e-6, norm_coefficient=0.0, norm_coefficient_post=0.0,
           _n_inputs, _n_outputs):
    _check_count(_n_inputs, 4, "Adam")

    def run(r, t, *tensors):
        lr, step = _scalar(r, "R", "f"), _scalar(t, "T", "iu")
        if step > 0:
            lr = lr * np.sqrt(1.0 - beta ** step) / (1.0 - alpha ** step)
        lr = float(lr)
        out = []
        for x, g, v, h in _groups(tensors, 4, _n_outputs, 3, "Adam"):
            g_reg = norm_coefficient * x + g
            v_new = alpha * v + (1.0 - alpha) * g_reg
            h_new = beta * h + (1.0 - beta) * (g_reg * g_reg)
            x_new = x - lr * (v_new / (np.sqrt(h_new) + epsilon))
            if norm_coefficient_post:
                x_new = (1.0 - norm_coefficient_post) * x_new
            out.append((x_new, v_new, h_new))
        return _arrange(out, _n_outputs)
    return run


@kernel("Momentum", since=1, domain=TRAINING)
def momentum_1(*, alpha, beta, mode, norm_coefficient, _n_inputs, _n_outputs):
    if mode not in ("standard", "nesterov"):
        raise ValueError(f"mode must be 'standard' or 'nesterov', got {mode!r}")
    _check_count(_n_inputs, 3, "Momentum")
    nesterov = mode == "nesterov"

    def run(r, t, *tensors):
        lr = _scalar(r, "R", "f")
        b = beta if _scalar(t, "T", "iu") > 0 else 1.0
        out = []
        for x, g, v in _groups(tensors, 3, _n_outputs, 2, "Momentum"):
            g_reg = norm_coefficient * x + g
            v_new = alpha * v + b * g_reg
            x_new = x - lr * (g_reg + alpha * v_new) if nesterov else x - lr * v_new
            out.append((x_new, v_new))
        return _arrange(out, _n_outputs)
    return run


# -- Gradient: vector-Jacobian products ------------------------------------------------------------

def _unbroadcast(g: np.ndarray, shape: tuple) -> np.ndarray:
    """Sum g over the dimensions numpy broadcasting added or stretched to reach g.shape from shape."""
    if g.shape == tuple(shape):
        return g
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, d in enumerate(shape) if d == 1 and g.shape[lead + i] != 1)
    s = g.sum(axis=axes, keepdims=True) if axes else g
    return s.reshape(shape)


def _binary(rule):
    def vjp(node, ins, outs, g):
        a, b = ins[0], ins[1]
        ga, gb = rule(a, b, outs[0], g)
        return [None if ga is None else _unbroadcast(ga, a.shape), None if gb is None else _unbroadcast(gb, b.shape)]
    return vjp


def _unary(rule):
    return lambda node, ins, outs, g: [rule(ins[0], outs[0], g)] + [None] * (len(ins) - 1)


def _reshaped(node, ins, outs, g):
    return [g.reshape(ins[0].shape)] + [None] * (len(ins) - 1)


def _matmul(node, ins, outs, g):
    a, b = ins
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    g2 = g[..., None] if b.ndim == 1 else g          # restore the dims numpy's 1-D promotion removed
    if a.ndim == 1:
        g2 = g2[..., None, :]
    ga = _unbroadcast(np.matmul(g2, np.swapaxes(b2, -1, -2)), a2.shape).reshape(a.shape)
    gb = _unbroadcast(np.matmul(np.swapaxes(a2, -1, -2), g2), b2.shape).reshape(b.shape)
    return [ga, gb]


def _gemm(node, ins, outs, g):
    a, b = ins[0], ins[1]
    alpha, beta = node.attrs.get("alpha", 1.0), node.attrs.get("beta", 1.0)
    ta, tb = node.attrs.get("transA", 0), node.attrs.get("transB", 0)
    am, bm = (a.T if ta else a), (b.T if tb else b)
    ga = alpha * (g @ bm.T)
    gb = alpha * (am.T @ g)
    grads = [ga.T if ta else ga, gb.T if tb else gb]
    if len(ins) > 2 and ins[2] is not None:
        grads.append(_unbroadcast(beta * g, ins[2].shape))
    return grads


def _transpose(node, ins, outs, g):
    perm = node.attrs.get("perm") or list(range(ins[0].ndim))[::-1]
    return [np.transpose(g, np.argsort(perm))]


def _sum(node, ins, outs, g):
    return [_unbroadcast(g, x.shape) for x in ins]


def _reduce(mean: bool):
    def vjp(node, ins, outs, g):
        x = ins[0]
        axes = node.attrs.get("axes")
        if len(ins) > 1 and ins[1] is not None:
            axes = ins[1].tolist()
        if not axes:
            axes = [] if node.attrs.get("noop_with_empty_axes", 0) else list(range(x.ndim))
        axes = sorted(a + x.ndim if a < 0 else a for a in axes)
        if not node.attrs.get("keepdims", 1):
            g = np.expand_dims(g, tuple(axes))
        count = int(np.prod([x.shape[a] for a in axes])) if mean else 1
        full = np.broadcast_to(g, x.shape)
        return [full / count if mean else full.copy()] + [None] * (len(ins) - 1)
    return vjp


def _cast_back(node, ins, outs, g):
    x = ins[0]
    return [g.astype(x.dtype) if x.dtype.kind == "f" else None]


_VJP = {
    "Add": _binary(lambda a, b, y, g: (g, g)),
    "Sub": _binary(lambda a, b, y, g: (g, -g)),
    "Mul": _binary(lambda a, b, y, g: (g * b, g * a)),
    "Div": _binary(lambda a, b, y, g: (g / b, -g * a / (b * b))),
    "Pow": _binary(lambda a, b, y, g: (g * b * np.power(a, b - 1),
                                       g * y * np.log(np.where(a > 0, a, 1)))),
    "MatMul": _matmul,
    "Gemm": _gemm,
    "Neg": _unary(lambda x, y, g: -g),
    "Identity": _unary(lambda x, y, g: g),
    "Relu": _unary(lambda x, y, g: g * (x > 0)),
    "Abs": _unary(lambda x, y, g: g * np.sign(x)),
    "Exp": _unary(lambda x, y, g: g * y),
    "Log": _unary(lambda x, y, g: g / x),
    "Sqrt": _unary(lambda x, y, g: g / (2 * y)),
    "Reciprocal": _unary(lambda x, y, g: -g * y * y),
    "Tanh": _unary(lambda x, y, g: g * (1 - y * y)),
    "Sigmoid": _unary(lambda x, y, g: g * y * (1 - y)),
    "Sin": _unary(lambda x, y, g: g * np.cos(x)),
    "Cos": _unary(lambda x, y, g: -g * np.sin(x)),
    "Reshape": _reshaped, "Flatten": _reshaped, "Squeeze": _reshaped, "Unsqueeze": _reshaped,
    "Transpose": _transpose,
    "Sum": _sum,
    "ReduceSum": _reduce(False),
    "ReduceMean": _reduce(True),
    "Cast": _cast_back,
}


def _forward_slice(graph: Graph, xs: list[str], zs: list[str], y: str) -> tuple[list, dict]:
    """The graph's nodes that compute y from xs/zs (topologically sorted) and the initializers they read.
    ValueError when y depends on a value that is neither given, an initializer, nor computed."""
    given = set(xs) | set(zs)
    producer = {o: n for n in graph.nodes for o in n.outputs if o}
    graph_inputs = {v.name for v in graph.inputs}
    needed: dict[int, object] = {}
    consts: dict[str, np.ndarray] = {}
    stack = [y]
    seen = set()
    while stack:
        name = stack.pop()
        if not name or name in seen or name in given:
            continue
        seen.add(name)
        node = producer.get(name)
        if node is None:
            if name in graph.initializers:
                consts[name] = graph.initializers[name]
                continue
            where = "a graph input" if name in graph_inputs else "a value no node of this graph produces"
            raise ValueError(f"y={y!r} depends on {name!r}, {where} not listed in xs or zs")
        if node.op_type == "Gradient":
            raise ValueError(f"y={y!r} is computed through another Gradient node ({node.name!r}): "
                             f"higher-order gradients are not supported")
        if node.op_type not in _VJP or node.domain not in ("", "ai.onnx"):
            raise ValueError(f"cannot differentiate through {node.op_type} (node {node.name!r}); "
                             f"supported: {', '.join(sorted(_VJP))}")
        if node.captures:
            raise ValueError(f"cannot differentiate through node {node.name!r}, which holds subgraphs")
        needed[id(node)] = node
        stack.extend(node.inputs)
    nodes = [n for n in graph.nodes if id(n) in needed]
    return topo_sort(nodes, given | set(consts)), consts


@kernel("Gradient", since=1, domain=TRAINING)
def gradient_1(*, xs, y, zs=None, _graph=None, _plan=None, _n_inputs, _n_outputs):
    if _graph is None or _plan is None:
        raise ValueError("Gradient needs the planner to inject the enclosing graph (_graph, _plan)")
    xs, zs = list(xs), list(zs or [])
    names = xs + zs
    if len(set(names)) != len(names):
        raise ValueError(f"xs and zs name a value twice: {names}")
    if _n_inputs != len(names):
        raise ValueError(f"the node has {_n_inputs} input(s) but xs and zs name {len(names)} value(s)")
    if _n_outputs > len(xs):
        raise ValueError(f"the node has {_n_outputs} output(s) but xs names only {len(xs)} value(s)")
    nodes, consts = _forward_slice(_graph, xs, zs, y)
    values = [o for n in nodes for o in n.outputs if o]
    sub = Graph(f"Gradient({y})", nodes, [ValueInfo(n, None) for n in names],
                [ValueInfo(v, None) for v in values], consts)
    forward = _plan(sub)            # the forward graph planned once, as a body
    order = nodes[::-1]

    def run(*inputs):
        env = dict(zip(names, inputs))
        env.update(consts)
        env.update(zip(values, forward.run(list(inputs))))
        target = env[y]
        if not isinstance(target, np.ndarray) or target.dtype.kind != "f":
            raise InvalidValueError(f"y={y!r} must be a float tensor, got {describe_value(target)}")
        grads = {y: np.ones_like(target)}
        for node in order:
            gout = [grads.get(o) for o in node.outputs]
            if gout[0] is None:
                continue
            ins = [env.get(i) if i else None for i in node.inputs]
            for name, g in zip(node.inputs, _VJP[node.op_type](node, ins, [env[o] for o in node.outputs if o],
                                                               gout[0])):
                if g is None or not name or env[name].dtype.kind != "f":
                    continue
                grads[name] = g if name not in grads else grads[name] + g
        out = []
        for x_name, x in zip(xs, inputs):
            dt = x.dtype if x.dtype.kind == "f" else np.dtype(np.float32)
            g = grads.get(x_name)
            out.append(np.zeros(x.shape, dt) if g is None else np.asarray(g, dtype=dt).reshape(x.shape))
        return tuple(out[:_n_outputs])
    return run

