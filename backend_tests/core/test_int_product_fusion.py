"""optimize/patterns.py's int8 tail: MatMulInteger -> Cast(to=FLOAT) -> Mul(scale) [-> Add(bias)] becomes one
MatMulIntegerScaled step (ops/contrib/quantized_matmul.py), bit for bit the graph as written, at the extremes
of the 8-bit types and on both sides of the float32-exact bound; and the cases where it must not fire."""
from __future__ import annotations

import numpy as np
import pytest
import onnx
from onnx import TensorProto, helper, numpy_helper

import onnx_mini
from onnx_mini.optimize import FUSED_DOMAIN, patterns
from helpers import elem_type, model

pytestmark = pytest.mark.filterwarnings("error::onnx_mini.optimize.OptimizationWarning")
FUSED = (FUSED_DOMAIN, "MatMulIntegerScaled")
CENTRED = (FUSED_DOMAIN, "DynamicQuantizeCentred")      # the codes' DynamicQuantizeLinear, read by FUSED alone
F32 = np.float32


def init(name, value):
    return numpy_helper.from_array(np.asarray(value), name)


def tail(k=64, n=5, a_type=np.uint8, b_type=np.int8, scale_shape=(), bias=True, to=TensorProto.FLOAT,
         extra_outputs=(), extra_nodes=(), scale=None, seed=0, b=None, fed_bias=False):
    """A [m, k] codes and its zero point fed -> MatMulInteger(A, B, a_zp, b_zp) with constant extreme B and
    per-column b_zp -> Cast(to) -> Mul(., s) -> [Add(., bias)] -> y. scale: a constant of `scale_shape`
    unless given as a (name, nodes, inputs) of our own."""
    rng = np.random.default_rng(seed)
    info = np.iinfo(b_type)
    if b is None:
        b = extremes(rng, (k, n), b_type)
    b_zp = np.where(np.arange(n) % 2, info.min, info.max).astype(b_type)      # offsets up to 255
    s = (rng.uniform(0.5, 2, scale_shape) * 10.0 ** rng.integers(-6, 3, scale_shape)).astype(F32)
    bias_v = rng.standard_normal(n).astype(F32) * 1e3
    inits = [init("B", b), init("b_zp", b_zp)]
    nodes = [helper.make_node("MatMulInteger", ["a", "B", "a_zp", "b_zp"], ["p"], name="mm"),
             helper.make_node("Cast", ["p"], ["pf"], name="cast", to=to)]
    inputs = [("a", elem_type(a_type), None), ("a_zp", elem_type(a_type), [])]
    if scale is None:
        inits.append(init("s", s))
        s_name = "s"
    else:
        s_name, s_nodes, s_inputs = scale
        nodes += s_nodes
        inputs += s_inputs
    nodes.append(helper.make_node("Mul", ["pf", s_name], ["scaled" if bias else "y"], name="mul"))
    if bias:
        if fed_bias:
            inputs.append(("bias", TensorProto.FLOAT, [n]))
        else:
            inits.append(init("bias", bias_v))
        nodes.append(helper.make_node("Add", ["bias", "scaled"], ["y"], name="add"))
    nodes += list(extra_nodes)
    outputs = [("y", TensorProto.FLOAT if to == TensorProto.FLOAT else to, None)]
    outputs += [(o, t, None) for o, t in extra_outputs]
    return model(nodes, inputs, outputs, inits, opset=21)


def extremes(rng, shape, dtype):
    """The type's two ends, with a few values between."""
    info = np.iinfo(dtype)
    x = np.where(rng.random(shape) < 0.5, info.min, info.max).astype(np.int64)
    mid = rng.random(shape) < 0.1
    x[mid] = rng.integers(info.min, info.max + 1, int(mid.sum()))
    return x.astype(dtype)


def feeds(a_type, k, m=7, seed=1, a=None):
    rng = np.random.default_rng(seed)
    info = np.iinfo(a_type)
    a = extremes(rng, (m, k), a_type) if a is None else a
    return {"a": a, "a_zp": np.array(info.max if a_type == np.uint8 else info.min, a_type)}


def steps(rep):
    return [(i.domain, i.op_type) for i in rep.plan.infos]


def same_as_written(m, f, expected):
    opt, raw = onnx_mini.prepare(m), onnx_mini.prepare(m, optimize=False)
    assert steps(opt) == expected
    got, ref = opt.run(f), raw.run(f)
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype and g.shape == r.shape
        np.testing.assert_array_equal(g, r)
    return got[0]


@pytest.mark.parametrize("k", [64, 258, 300, 2048], ids=lambda k: f"K{k}")    # 258: 258 * 255 * 255 > 2^24
@pytest.mark.parametrize("a_type,b_type", [(np.uint8, np.int8), (np.uint8, np.uint8), (np.int8, np.int8),
                                           (np.int8, np.uint8)], ids=["u8i8", "u8u8", "i8i8", "i8u8"])
@pytest.mark.parametrize("scale_shape", [(), (1,), (5,)], ids=["scalar", "size1", "per-column"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_bit_identical_at_the_extremes(k, a_type, b_type, scale_shape, bias):
    m = tail(k, a_type=a_type, b_type=b_type, scale_shape=scale_shape, bias=bias)
    y = same_as_written(m, feeds(a_type, k), [FUSED])
    assert y.dtype == F32 and y.shape == (7, 5)


def test_largest_sums_are_exact():
    """Every product at its largest (|a - a_zp| = |b - b_zp| = 255): the sum K * 65025 passes 2^24 and
    float32 could not hold it rounded the same way twice; the result is float32(exact sum) * s + bias."""
    k = 4096
    b = np.full((k, 5), -128, np.int8)          # b_zp alternates 127 / -128: offsets -255 and 0
    m = tail(k, b=b, scale_shape=(5,))
    f = feeds(np.uint8, k, a=np.zeros((3, k), np.uint8))       # a_zp 255: offsets -255
    y = same_as_written(m, f, [FUSED])
    init_of = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    exact = np.array([k * 255 * 255 if j % 2 == 0 else 0 for j in range(5)], np.int64)
    want = exact.astype(F32) * init_of["s"] + init_of["bias"]
    np.testing.assert_array_equal(y, np.broadcast_to(want, (3, 5)))


def test_profile_names_the_replaced_nodes():
    m = tail()
    (n,) = onnx_mini.profile(m, feeds(np.uint8, 64), runs=1).nodes
    assert (n.domain, n.op_type, n.fused_from) == (*FUSED, ("mm", "cast", "mul", "add"))


def test_optional_zero_points_and_batched_a():
    m = tail()
    nodes = list(m.graph.node)
    nodes[0] = helper.make_node("MatMulInteger", ["a", "B"], ["p"], name="mm")
    m2 = model(nodes, [("a", TensorProto.UINT8, None)], [("y", TensorProto.FLOAT, None)], list(m.graph.initializer))
    rng = np.random.default_rng(3)
    same_as_written(m2, {"a": rng.integers(0, 256, (2, 3, 64), dtype=np.uint8)}, [FUSED])


# -- where it must not fire ------------------------------------------------------------------------

WRITTEN = [("", "MatMulInteger"), ("", "Cast"), ("", "Mul"), ("", "Add")]


def test_not_fused_when_the_product_is_a_graph_output():
    m = tail(extra_outputs=[("p", TensorProto.INT32)])
    same_as_written(m, feeds(np.uint8, 64), WRITTEN)


def test_not_fused_when_the_cast_is_read_elsewhere():
    m = tail(extra_nodes=[helper.make_node("Neg", ["pf"], ["neg"])], extra_outputs=[("neg", TensorProto.FLOAT)])
    same_as_written(m, feeds(np.uint8, 64), [*WRITTEN, ("", "Neg")])


def test_add_left_out_when_the_scaled_product_is_a_graph_output():
    m = tail(extra_outputs=[("scaled", TensorProto.FLOAT)])
    same_as_written(m, feeds(np.uint8, 64), [FUSED, ("", "Add")])


def test_add_left_out_when_the_bias_is_fed():
    m = tail(fed_bias=True)
    f = {**feeds(np.uint8, 64), "bias": np.arange(5, dtype=F32)}
    same_as_written(m, f, [FUSED, ("", "Add")])


@pytest.mark.parametrize("to", [TensorProto.DOUBLE, TensorProto.INT64, TensorProto.FLOAT16])
def test_not_fused_when_the_cast_is_to_another_type(to):
    m = tail(to=to, bias=False)
    nodes = list(m.graph.node)
    nodes[2] = helper.make_node("Mul", ["pf", "s2"], ["y"], name="mul")
    dt = helper.tensor_dtype_to_np_dtype(to)
    inits = [i for i in m.graph.initializer if i.name != "s"] + [init("s2", np.array(3, dt))]
    m = model(nodes, [(i.name, i.type.tensor_type.elem_type, None) for i in m.graph.input],
              [("y", to, None)], inits)
    same_as_written(m, feeds(np.uint8, 64), [("", "MatMulInteger"), ("", "Cast"), ("", "Mul")])


@pytest.mark.parametrize("shape", [(7, 5), (7, 1), (1, 5), (3,)], ids=str)
def test_not_fused_when_the_other_factor_is_not_a_scale(shape):
    """A [7, 5] / [7, 1] / [1, 5] factor is not one value or one per column ([1, 5] could make a 1-D
    product 2-D); [3] is not N = 5 (the graph then fails as written)."""
    m = tail(scale_shape=shape)
    opt = onnx_mini.prepare(m)
    assert steps(opt) == WRITTEN
    if shape != (3,):
        same_as_written(m, feeds(np.uint8, 64), WRITTEN)


def test_scale_product_read_elsewhere_stays():
    """x_scale * w_scale also a graph output: the Mul making it stays, the fused step reads its result."""
    m = dynamic_int8_mlp(True)
    m.graph.output.append(helper.make_tensor_value_info("s0", TensorProto.FLOAT, None))
    x = {"x": np.random.default_rng(6).standard_normal((2, 48)).astype(F32)}
    same_as_written(m, x, [CENTRED, ("", "Mul"), FUSED, CENTRED, FUSED])


def test_not_fused_when_the_scale_is_fed():
    m = tail(scale=("s_in", [], [("s_in", TensorProto.FLOAT, [])]))
    same_as_written(m, {**feeds(np.uint8, 64), "s_in": np.array(0.25, F32)}, WRITTEN)


def test_not_fused_when_int32_sums_could_wrap():
    """K = 33026: K * 255 * 255 >= 2^31, the written graph's int32 may wrap before Cast reads it (33025: no)."""
    k = 33026
    m = tail(k, n=1, b=np.full((k, 1), 7, np.int8), scale_shape=(), bias=False)
    opt = onnx_mini.prepare(m)
    assert steps(opt) == [("", "MatMulInteger"), ("", "Cast"), ("", "Mul")]
    assert steps(onnx_mini.prepare(tail(k - 1, n=1, b=np.full((k - 1, 1), 7, np.int8), bias=False))) == [FUSED]


def test_rules_disabled_leave_the_chain():
    """The measurement switch (patterns.RULES without the rule) gives the graph as written."""
    full = patterns.RULES
    try:
        patterns.RULES = tuple(r for r in full if r.__name__ != "_int_product_tail")
        assert steps(onnx_mini.prepare(tail())) == WRITTEN
    finally:
        patterns.RULES = full


# -- end to end: a quantize_dynamic-style graph, built by hand ------------------------------------------

def dynamic_int8_mlp(per_column: bool):
    """x -> DynamicQuantizeLinear -> MatMulInteger(xq, Wq, x_zp, w_zp) -> Cast -> Mul(x_scale * w_scale)
    -> Add(b), twice (the second layer's input quantized again), as onnxruntime's quantize_dynamic writes it."""
    rng = np.random.default_rng(11)
    nodes, inits, x = [], [], "x"
    for i, (k, n) in enumerate([(48, 32), (32, 16)]):
        w = rng.standard_normal((k, n)).astype(F32)
        w_scale = (np.abs(w).max(axis=0) / 127).astype(F32) if per_column else np.float32(np.abs(w).max() / 127)
        inits += [init(f"w{i}_q", np.clip(np.round(w / w_scale), -127, 127).astype(np.int8)),
                  init(f"w{i}_scale", w_scale), init(f"w{i}_zp", np.zeros(n if per_column else (), np.int8)),
                  init(f"b{i}", rng.standard_normal(n).astype(F32))]
        nodes += [helper.make_node("DynamicQuantizeLinear", [x], [f"x{i}_q", f"x{i}_scale", f"x{i}_zp"], name=f"dq{i}"),
                  helper.make_node("Mul", [f"x{i}_scale", f"w{i}_scale"], [f"s{i}"], name=f"scales{i}"),
                  helper.make_node("MatMulInteger", [f"x{i}_q", f"w{i}_q", f"x{i}_zp", f"w{i}_zp"], [f"p{i}"],
                                   name=f"mm{i}"),
                  helper.make_node("Cast", [f"p{i}"], [f"pf{i}"], name=f"cast{i}", to=TensorProto.FLOAT),
                  helper.make_node("Mul", [f"pf{i}", f"s{i}"], [f"y{i}s"], name=f"mul{i}"),
                  helper.make_node("Add", [f"y{i}s", f"b{i}"], [f"y{i}"], name=f"add{i}")]
        x = f"y{i}"
    return model(nodes, [("x", TensorProto.FLOAT, ["batch", 48])], [(x, TensorProto.FLOAT, None)], inits, opset=21)


@pytest.mark.parametrize("per_column", [False, True], ids=["per-tensor", "per-column"])
def test_quantize_dynamic_style_model(per_column):
    m = dynamic_int8_mlp(per_column)
    layer = [CENTRED, FUSED]          # the scales' Mul taken in too
    x = {"x": np.random.default_rng(5).standard_normal((9, 48)).astype(F32) * 3}
    y = same_as_written(m, x, layer + layer)
    names = [i.fused_from for i in onnx_mini.prepare(m).plan.infos if i.op_type == FUSED[1]]
    assert names == [(f"scales{i}", f"mm{i}", f"cast{i}", f"mul{i}", f"add{i}") for i in (0, 1)]
    assert y.shape == (9, 16) and np.isfinite(y).all()
    # and against the float model the quantization approximates (a loose, real check on the scale path)
    rng = np.random.default_rng(11)
    h = x["x"]
    for k, n in [(48, 32), (32, 16)]:
        w = rng.standard_normal((k, n)).astype(F32)
        h = h @ w + rng.standard_normal(n).astype(F32)
    np.testing.assert_allclose(y, h, rtol=0.1, atol=0.1 * np.abs(h).max())


@pytest.mark.parametrize("per_channel", [False, True], ids=["per-tensor", "per-channel"])
def test_onnxruntime_quantize_dynamic_output(tmp_path, per_channel):
    """The file onnxruntime's quantize_dynamic writes for MatMul + Add, Relu, MatMul + Add: every product
    tail fuses, the result is the graph as written bit for bit, and near the float model. (onnxruntime's
    own run is no bit reference: with per-channel weights its CPU MatMulInteger's int32 sums differ from
    the exact (x - x_zp) @ (W - W_zp) here.)"""
    quantization = pytest.importorskip("onnxruntime.quantization")
    rng = np.random.default_rng(0)
    inits = [init("W0", rng.standard_normal((48, 32)).astype(F32)), init("b0", rng.standard_normal(32).astype(F32)),
             init("W1", rng.standard_normal((32, 16)).astype(F32)), init("b1", rng.standard_normal(16).astype(F32))]
    nodes = [helper.make_node("MatMul", ["x", "W0"], ["h0"]), helper.make_node("Add", ["h0", "b0"], ["h1"]),
             helper.make_node("Relu", ["h1"], ["h2"]), helper.make_node("MatMul", ["h2", "W1"], ["h3"]),
             helper.make_node("Add", ["h3", "b1"], ["y"])]
    src, dst = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(model(nodes, [("x", TensorProto.FLOAT, ["n", 48])], [("y", TensorProto.FLOAT, None)], inits, opset=17,
                    ir_version=8), str(src))
    quantization.quantize_dynamic(str(src), str(dst), weight_type=quantization.QuantType.QInt8,
                                  per_channel=per_channel)
    q = onnx.load(str(dst))
    x = {"x": rng.standard_normal((5, 48)).astype(F32)}
    layer = [CENTRED, FUSED]
    y = same_as_written(q, x, layer + [("", "Relu")] + layer)
    w = {i.name: numpy_helper.to_array(i) for i in inits}
    ref = np.maximum(x["x"] @ w["W0"] + w["b0"], 0) @ w["W1"] + w["b1"]
    np.testing.assert_allclose(y, ref, rtol=0.05, atol=0.05 * np.abs(ref).max())
