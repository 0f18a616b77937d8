"""Spec tests for the ai.onnx.preview.training operators: Adagrad, Adam, Momentum and Gradient (version 1).

Optimizer expectations are the pseudo code of each schema's doc, transcribed below in float64 and
compared with a tolerance fitting the tensors' type. Gradient expectations are derivatives worked out
by hand, or central finite differences of the forward graph in float64.

Gradient needs the planner to hand the kernel its enclosing graph (the `_graph`/`_plan` injection);
the "factory" mode calls the kernel factory with the parsed graph itself, the "planner" mode goes
through onnx_mini.prepare and is skipped while the planner lacks that hook.
"""
from __future__ import annotations

import numpy as np
import onnx_mini
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_mini import registry
from onnx_mini.executor import execute
from onnx_mini.plan import SubPlan
from onnx_mini.prepare import prepare_plan
from onnx_mini.errors import InvalidNodeError, KernelError
from onnx_mini.loader import from_proto
from onnx_mini.ops.training import gradient_1

from helpers import NODE, np_type, raises_naming_node, run_node, type_params, versions

TRAINING = "ai.onnx.preview.training"
TOL = {np.dtype(np.float32): dict(rtol=2e-6, atol=1e-7), np.dtype(np.float64): dict(rtol=1e-13, atol=1e-15)}


def test_versions_listed():
    for op in ("Adagrad", "Adam", "Momentum", "Gradient"):
        assert versions(op, TRAINING) == [1]


def run_opt(op, r, t, tensors, n_out, **attrs):
    """Run an optimizer node: inputs R, T, *tensors; returns the tuple of its n_out outputs."""
    out = run_node(op, 1, [np.array(r, tensors[0].dtype if tensors[0].dtype == np.float64 else np.float32),
                           np.array(t, np.int64), *tensors], n_outputs=n_out, domain=TRAINING, **attrs)
    return out if isinstance(out, tuple) else (out,)


def check(got, exp, dtype):
    assert len(got) == len(exp)
    for g, e in zip(got, exp):
        assert type(g) is np.ndarray and g.dtype == dtype and g.shape == np.shape(e), (g.dtype, g.shape)
        np.testing.assert_allclose(g, e, **TOL[np.dtype(dtype)])


def f32(attrs: dict) -> dict:
    """FLOAT attributes as the node stores them (float32), for the float64 references."""
    return {k: float(np.float32(v)) if isinstance(v, float) else v for k, v in attrs.items()}


def rnd(shape, seed, dtype=np.float32, lo=-2.0, hi=2.0):
    return np.random.default_rng(seed).uniform(lo, hi, shape).astype(dtype)


# -- Adagrad ----------------------------------------------------------------------------------------

def adagrad_ref(r, t, x, g, h, norm_coefficient=0.0, epsilon=1e-6, decay_factor=0.0):
    x, g, h = (np.asarray(a, np.float64) for a in (x, g, h))
    rr = r / (1 + t * decay_factor)
    g_reg = norm_coefficient * x + g
    h_new = h + g_reg * g_reg
    return x - rr * g_reg / (np.sqrt(h_new) + epsilon), h_new


@pytest.mark.parametrize("version,tname", type_params("Adagrad", [1], "T3", TRAINING))
@pytest.mark.parametrize("attrs", [{}, {"norm_coefficient": 0.01, "epsilon": 1e-3, "decay_factor": 0.1}])
@pytest.mark.parametrize("t", [0, 3])
def test_adagrad_one_tensor(version, tname, attrs, t):
    dt = np_type(tname)
    x, g, h = rnd((2, 3), 1, dt), rnd((2, 3), 2, dt), rnd((2, 3), 3, dt, 0.0, 1.0)
    check(run_opt("Adagrad", 0.1, t, [x, g, h], 2, **attrs), adagrad_ref(0.1, t, x, g, h, **f32(attrs)), dt)


def test_adagrad_two_tensors_grouped_layout():
    # inputs R, T, X1, X2, G1, G2, H1, H2 -> outputs X1_new, X2_new, H1_new, H2_new
    x1, x2 = rnd((3,), 1), rnd((2, 2), 2)
    g1, g2 = rnd((3,), 3), rnd((2, 2), 4)
    h1, h2 = rnd((3,), 5, lo=0.0), rnd((2, 2), 6, lo=0.0)
    attrs = {"norm_coefficient": 0.001, "epsilon": 1e-5, "decay_factor": 0.1}
    got = run_opt("Adagrad", 0.1, 1, [x1, x2, g1, g2, h1, h2], 4, **attrs)
    (a1, b1), (a2, b2) = adagrad_ref(0.1, 1, x1, g1, h1, **f32(attrs)), adagrad_ref(0.1, 1, x2, g2, h2, **f32(attrs))
    check(got, [a1, a2, b1, b2], np.float32)


def test_adagrad_hand_values():
    # R=1, T=0, X=1, G=3, H=0 -> H_new = 9, X_new = 1 - 3 / (3 + 0) = 0 (epsilon 0)
    got = run_opt("Adagrad", 1.0, 0, [np.array([1.0], np.float64), np.array([3.0]), np.array([0.0])], 2,
                  epsilon=0.0)
    check(got, [[0.0], [9.0]], np.float64)


# -- Adam -------------------------------------------------------------------------------------------

def adam_ref(r, t, x, g, v, h, norm_coefficient=0.0, norm_coefficient_post=0.0, alpha=0.9, beta=0.999,
             epsilon=1e-6):
    x, g, v, h = (np.asarray(a, np.float64) for a in (x, g, v, h))
    g_reg = norm_coefficient * x + g
    v_new = alpha * v + (1 - alpha) * g_reg
    h_new = beta * h + (1 - beta) * g_reg * g_reg
    h_sqrt = np.sqrt(h_new) + epsilon
    r_adj = r * np.sqrt(1 - beta ** t) / (1 - alpha ** t) if t > 0 else r
    x_new = x - r_adj * v_new / h_sqrt
    return (1 - norm_coefficient_post) * x_new, v_new, h_new


ADAM_ATTRS = [{}, {"norm_coefficient": 0.001, "alpha": 0.95, "beta": 0.1, "epsilon": 1e-7},
              {"norm_coefficient_post": 0.25, "alpha": 0.5, "beta": 0.8, "epsilon": 1e-2}]


@pytest.mark.parametrize("version,tname", type_params("Adam", [1], "T3", TRAINING))
@pytest.mark.parametrize("attrs", ADAM_ATTRS)
@pytest.mark.parametrize("t", [0, 1, 5])
def test_adam_one_tensor(version, tname, attrs, t):
    dt = np_type(tname)
    x, g, v, h = rnd((4,), 1, dt), rnd((4,), 2, dt), rnd((4,), 3, dt), rnd((4,), 4, dt, 0.0, 1.0)
    check(run_opt("Adam", 0.1, t, [x, g, v, h], 3, **attrs), adam_ref(0.1, t, x, g, v, h, **f32(attrs)), dt)


def test_adam_two_tensors_grouped_layout():
    xs = [rnd((1,), 1), rnd((2,), 2)]
    gs = [rnd((1,), 3), rnd((2,), 4)]
    vs = [rnd((1,), 5), rnd((2,), 6)]
    hs = [rnd((1,), 7, lo=0.0), rnd((2,), 8, lo=0.0)]
    attrs = {"norm_coefficient": 0.001, "alpha": 0.95, "beta": 0.85, "epsilon": 1e-2}
    got = run_opt("Adam", 0.1, 2, [*xs, *gs, *vs, *hs], 6, **attrs)
    r1, r2 = (adam_ref(0.1, 2, xs[i], gs[i], vs[i], hs[i], **f32(attrs)) for i in range(2))
    check(got, [r1[0], r2[0], r1[1], r2[1], r1[2], r2[2]], np.float32)


def test_adam_hand_values():
    # T=0, alpha=beta=0.5, epsilon=0: V_new = 0.5*G = 1, H_new = 0.5*G^2 = 2, X_new = X - R * 1/sqrt(2)
    got = run_opt("Adam", 2.0, 0, [np.array([1.0], np.float64), np.array([2.0]), np.array([0.0]), np.array([0.0])],
                  3, alpha=0.5, beta=0.5, epsilon=0.0)
    check(got, [[1 - 2 / np.sqrt(2)], [1.0], [2.0]], np.float64)


# -- Momentum ---------------------------------------------------------------------------------------

def momentum_ref(r, t, x, g, v, norm_coefficient, alpha, beta, mode):
    x, g, v = (np.asarray(a, np.float64) for a in (x, g, v))
    g_reg = norm_coefficient * x + g
    b = beta if t > 0 else 1
    v_new = alpha * v + b * g_reg
    if mode == "nesterov":
        return x - r * (g_reg + alpha * v_new), v_new
    return x - r * v_new, v_new


@pytest.mark.parametrize("version,tname", type_params("Momentum", [1], "T3", TRAINING))
@pytest.mark.parametrize("mode", ["standard", "nesterov"])
@pytest.mark.parametrize("t", [0, 2])
def test_momentum_one_tensor(version, tname, mode, t):
    dt = np_type(tname)
    x, g, v = rnd((2, 2), 1, dt), rnd((2, 2), 2, dt), rnd((2, 2), 3, dt)
    attrs = {"norm_coefficient": 0.001, "alpha": 0.95, "beta": 0.1, "mode": mode}
    check(run_opt("Momentum", 0.1, t, [x, g, v], 2, **attrs), momentum_ref(0.1, t, x, g, v, **f32(attrs)), dt)


def test_momentum_two_tensors_and_hand_values():
    # X=1, G=1, V=1, alpha=0.5, beta=0.25, T=1, R=1: V_new = 0.5 + 0.25 = 0.75, X_new = 0.25 (standard)
    one = np.array([1.0], np.float64)
    x2, g2, v2 = np.array([2.0, 0.0]), np.array([0.0, 4.0]), np.array([0.0, 0.0])
    got = run_opt("Momentum", 1.0, 1, [one, x2, one, g2, one, v2], 4, norm_coefficient=0.0, alpha=0.5,
                  beta=0.25, mode="standard")
    check(got, [[0.25], [2.0, -1.0], [0.75], [0.0, 1.0]], np.float64)
    # nesterov: X_new = X - R * (G + alpha * V_new) = 1 - (1 + 0.375) = -0.375
    got = run_opt("Momentum", 1.0, 1, [one, one, one], 2, norm_coefficient=0.0, alpha=0.5, beta=0.25,
                  mode="nesterov")
    check(got, [[-0.375], [0.75]], np.float64)


# -- optimizer errors -------------------------------------------------------------------------------

def test_optimizer_input_count_must_fit_the_groups():
    x = np.zeros(2, np.float32)
    with raises_naming_node(InvalidNodeError, "Adam takes R, T"):
        run_opt("Adam", 0.1, 0, [x, x, x], 3)
    with raises_naming_node(InvalidNodeError, "Adagrad takes R, T"):
        run_opt("Adagrad", 0.1, 0, [x, x], 2)


def test_momentum_bad_mode_and_missing_attributes():
    x = np.zeros(2, np.float32)
    with raises_naming_node(InvalidNodeError, "mode"):
        run_opt("Momentum", 0.1, 0, [x, x, x], 2, norm_coefficient=0.0, alpha=0.9, beta=0.1, mode="heavy")
    with raises_naming_node(InvalidNodeError, "required"):
        run_opt("Momentum", 0.1, 0, [x, x, x], 2, alpha=0.9, beta=0.1, mode="standard")


def test_optimizer_bad_values():
    x = np.zeros(2, np.float32)
    with raises_naming_node(KernelError, "float or all double"):
        run_opt("Adagrad", 0.1, 0, [x, x.astype(np.float64), x], 2)
    with raises_naming_node(KernelError, "R must be a scalar"):
        run_node("Adagrad", 1, [np.zeros(2, np.float32), np.array(0, np.int64), x, x, x], n_outputs=2,
                 domain=TRAINING)


# -- Gradient ---------------------------------------------------------------------------------------

HOOK = "_graph" in registry.INJECTED


def grad_model(nodes, inputs, xs, y, zs=(), grad_inputs=None, outputs=None, inits=(), dtype=TensorProto.DOUBLE):
    """A model of the forward `nodes` plus a Gradient node named NODE (xs, zs, y) whose inputs are
    grad_inputs (default xs + zs) and outputs `outputs` (default d_<x> for each x)."""
    outputs = [f"d_{x}" for x in xs] if outputs is None else outputs
    attrs = {"xs": list(xs), "y": y}
    if zs:
        attrs["zs"] = list(zs)
    grad = helper.make_node("Gradient", list(grad_inputs or [*xs, *zs]), outputs, name=NODE, domain=TRAINING,
                            **attrs)
    graph = helper.make_graph(
        [*nodes, grad], "g", [helper.make_tensor_value_info(n, dtype, None) for n in inputs],
        [helper.make_tensor_value_info(o, dtype, None) for o in outputs if o], list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(TRAINING, 1)],
                             ir_version=10)


def run_gradient(model, feeds: dict, mode: str):
    """The Gradient node's outputs (graph outputs) for the graph inputs `feeds`."""
    if mode == "planner":
        if not HOOK:
            pytest.skip("the planner does not inject _graph/_plan yet")
        return onnx_mini.prepare(model).run([feeds[i.name] for i in model.graph.input])
    m = from_proto(model)
    (node,) = [n for n in m.graph.nodes if n.op_type == "Gradient"]
    try:
        def plan(g):     # what the planner injects: the graph planned as a body, through the whole pipeline
            return SubPlan(prepare_plan(g, dict(m.opsets)), g.name, (), (), execute)
        fn = gradient_1(_graph=m.graph, _plan=plan, _n_inputs=len(node.inputs), _n_outputs=len(node.outputs),
                        **node.attrs)
    except ValueError as e:  # what the planner reports as an InvalidNodeError naming the node
        raise InvalidNodeError(str(e), node=node.name, op_type="Gradient", domain=TRAINING) from e
    outs = fn(*[feeds[i] for i in node.inputs])
    return [o for o, name in zip(outs, node.outputs) if name]


MODES = ["factory", "planner"]


def forward(nodes, inputs, y, inits, feeds):
    graph = helper.make_graph(nodes, "f", [helper.make_tensor_value_info(n, TensorProto.DOUBLE, None) for n in inputs],
                              [helper.make_tensor_value_info(y, TensorProto.DOUBLE, None)], list(inits))
    rep = onnx_mini.prepare(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10))
    return lambda values: rep.run([values[n] for n in inputs])[0]


def numeric_grad(f, feeds, x, eps=1e-6):
    """d sum(f) / d feeds[x] by central differences (float64)."""
    base = feeds[x]
    g = np.zeros(base.shape)
    for idx in np.ndindex(*base.shape):
        for sign in (1, -1):
            pert = base.copy()
            pert[idx] += sign * eps
            g[idx] += sign * f({**feeds, x: pert}).sum()
    return g / (2 * eps)


@pytest.mark.parametrize("mode", MODES)
def test_gradient_of_add_and_mul_by_hand(mode):
    # d = (a + b) * a: dd/da = 2a + b, dd/db = a
    nodes = [helper.make_node("Add", ["a", "b"], ["c"]), helper.make_node("Mul", ["c", "a"], ["d"])]
    a, b = np.array(1.5), np.array(-4.0)
    da, db = run_gradient(grad_model(nodes, ["a", "b"], ["a", "b"], "d"), {"a": a, "b": b}, mode)
    check([da, db], [2 * a + b, a], np.float64)


@pytest.mark.parametrize("mode", MODES)
def test_gradient_broadcast_sums_back(mode):
    # y = ReduceSum(A * b) with b broadcast over rows: dy/dA = b in every row, dy/db = column sums of A
    A, b = rnd((2, 3), 1, np.float64), rnd((3,), 2, np.float64)
    nodes = [helper.make_node("Mul", ["A", "b"], ["p"]), helper.make_node("ReduceSum", ["p"], ["y"], keepdims=0)]
    dA, db = run_gradient(grad_model(nodes, ["A", "b"], ["A", "b"], "y"), {"A": A, "b": b}, mode)
    check([dA, db], [np.broadcast_to(b, (2, 3)), A.sum(axis=0)], np.float64)


@pytest.mark.parametrize("mode", MODES)
def test_gradient_float32_and_float16(mode):
    # y = x * x -> dy/dx = 2x, in the input's type
    for dt, et in ((np.float32, TensorProto.FLOAT), (np.float16, TensorProto.FLOAT16)):
        x = np.array([0.5, -1.0, 3.0], dt)
        (dx,) = run_gradient(grad_model([helper.make_node("Mul", ["x", "x"], ["y"])], ["x"], ["x"], "y", dtype=et),
                             {"x": x}, mode)
        assert dx.dtype == dt
        np.testing.assert_array_equal(dx, 2 * x)


CHAINS = {  # name: (nodes, inputs with shapes, xs, y, initializers)
    "matmul-relu-sub-div-neg": (
        [helper.make_node("MatMul", ["X", "W"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("Sub", ["r", "b"], ["s"]), helper.make_node("Div", ["s", "d"], ["q"]),
         helper.make_node("Neg", ["q"], ["n"]), helper.make_node("Identity", ["n"], ["y"])],
        {"X": (2, 3, 4), "W": (4, 5), "b": (5,), "d": (2, 1, 5)}, ["X", "W", "b", "d"], "y", []),
    "matmul-vectors": (
        [helper.make_node("MatMul", ["v", "M"], ["h"]), helper.make_node("MatMul", ["h", "u"], ["y"])],
        {"v": (3,), "M": (3, 4), "u": (4,)}, ["v", "M", "u"], "y", []),
    "gemm-unary": (
        [helper.make_node("Gemm", ["A", "B", "C"], ["g"], transA=1, transB=1, alpha=0.5, beta=2.0),
         helper.make_node("Tanh", ["g"], ["t"]), helper.make_node("Sigmoid", ["t"], ["s"]),
         helper.make_node("Exp", ["s"], ["e"]), helper.make_node("Log", ["e"], ["l"]),
         helper.make_node("Sqrt", ["e"], ["r"]), helper.make_node("Abs", ["l"], ["a"]),
         helper.make_node("Pow", ["r", "a"], ["p"]), helper.make_node("Sum", ["p", "a", "r"], ["y"])],
        {"A": (4, 2), "B": (3, 4), "C": (3,)}, ["A", "B", "C"], "y", []),
    "shapes-and-reductions": (
        [helper.make_node("Transpose", ["X"], ["t"], perm=[1, 0, 2]),
         helper.make_node("Reshape", ["t", "shape"], ["r"]), helper.make_node("Unsqueeze", ["r", "ax0"], ["u"]),
         helper.make_node("ReduceMean", ["u"], ["m"], axes=[-1], keepdims=0),
         helper.make_node("Mul", ["m", "m"], ["mm"]), helper.make_node("ReduceSum", ["mm", "ax2"], ["s"]),
         helper.make_node("Squeeze", ["s"], ["y"])],
        {"X": (2, 3, 2)}, ["X"], "y",
        [numpy_helper.from_array(np.array([3, 4], np.int64), "shape"),
         numpy_helper.from_array(np.array([0], np.int64), "ax0"),
         numpy_helper.from_array(np.array([-1], np.int64), "ax2")]),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", list(CHAINS))
def test_gradient_matches_finite_differences(mode, case):
    nodes, shapes, xs, y, inits = CHAINS[case]
    feeds = {n: rnd(s, k, np.float64, 0.2, 1.5) for k, (n, s) in enumerate(shapes.items())}
    if "b" in feeds:
        feeds["b"] = feeds["b"] - 1.0          # some ReLU inputs negative
    grads = run_gradient(grad_model(nodes, list(shapes), xs, y, inits=inits), feeds, mode)
    f = forward(nodes, list(shapes), y, inits, feeds)
    for x, g in zip(xs, grads):
        assert g.dtype == np.float64 and g.shape == feeds[x].shape
        np.testing.assert_allclose(g, numeric_grad(f, feeds, x), rtol=1e-5, atol=1e-7, err_msg=x)


@pytest.mark.parametrize("mode", MODES)
def test_gradient_zs_constants_and_independent_x(mode):
    # y = (x * z) + w with w an initializer; dy/dx = z; dy/dk = 0 (y does not depend on k)
    nodes = [helper.make_node("Mul", ["x", "z"], ["p"]), helper.make_node("Add", ["p", "w"], ["y"])]
    w = numpy_helper.from_array(np.array([10.0, 20.0]), "w")
    x, z, k = np.array([1.0, 2.0]), np.array([3.0, -4.0]), np.array([[7.0]])
    model = grad_model(nodes, ["x", "z", "k"], ["x", "k"], "y", zs=["z"], inits=[w])
    dx, dk = run_gradient(model, {"x": x, "z": z, "k": k}, mode)
    check([dx, dk], [z, np.zeros((1, 1))], np.float64)


@pytest.mark.parametrize("mode", MODES)
def test_gradient_at_given_intermediate_value_and_skipped_output(mode):
    # y = h * h with h = a + b; Gradient(xs=[h, a]) fed H_1: dy/dh = 2 * H_1 (the given value), dy/da = 0
    # because h is held as an independent variable; the second output is skipped (empty name).
    nodes = [helper.make_node("Add", ["a", "b"], ["h"]), helper.make_node("Mul", ["h", "h"], ["y"])]
    model = grad_model(nodes, ["a", "b", "h1", "a1"], ["h", "a"], "y", grad_inputs=["h1", "a1"],
                       outputs=["dh", ""])
    (dh,) = run_gradient(model, {"a": np.array([1.0]), "b": np.array([2.0]), "h1": np.array([5.0]),
                                 "a1": np.array([0.0]), "h": np.array([5.0])}, mode)
    check([dh], [[10.0]], np.float64)


@pytest.mark.parametrize("mode", MODES)
def test_gradient_y_equals_x(mode):
    (dx,) = run_gradient(grad_model([], ["x"], ["x"], "x"), {"x": np.array([1.0, 2.0])}, mode)
    check([dx], [[1.0, 1.0]], np.float64)


@pytest.mark.parametrize("mode", MODES)
def test_gradient_errors(mode):
    unsupported = [helper.make_node("Softmax", ["x"], ["y"])]
    with raises_naming_node(InvalidNodeError, "cannot differentiate through Softmax"):
        run_gradient(grad_model(unsupported, ["x"], ["x"], "y"), {"x": np.zeros(2)}, mode)
    free = [helper.make_node("Add", ["x", "q"], ["y"])]
    with raises_naming_node(InvalidNodeError, "depends on 'q', a graph input not listed in xs or zs"):
        run_gradient(grad_model(free, ["x", "q"], ["x"], "y"), {"x": np.zeros(2), "q": np.zeros(2)}, mode)
    add = [helper.make_node("Add", ["x", "x"], ["y"])]
    with raises_naming_node(InvalidNodeError, "input"):
        run_gradient(grad_model(add, ["x"], ["x"], "y", grad_inputs=["x", "x"]), {"x": np.zeros(2)}, mode)
    with raises_naming_node(InvalidNodeError, "depends on 'nowhere'"):
        run_gradient(grad_model(add, ["x"], ["x"], "nowhere"), {"x": np.zeros(2)}, mode)


def test_gradient_without_planner_hook_fails_clearly():
    with pytest.raises(ValueError, match="_graph"):
        gradient_1(xs=["x"], y="y", _n_inputs=1, _n_outputs=1)
