"""optimize/patterns.py's int8 siblings: MatMulIntegerScaled steps reading the same A and a_zp (a BERT layer's
Q, K and V products) become one MatMulIntegerScaledGroup step (ops/contrib/quantized_matmul.py) multiplying A
once by the Bs side by side, bit for bit the graph as written, where the joint float32 product stays exact;
and the cases where it must not fire."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnx_mini
from onnx_mini.errors import OnnxMiniError
from onnx_mini.ops.contrib.quantized_matmul import matmul_integer_scaled_1, matmul_integer_scaled_group_1
from onnx_mini.optimize import FUSED_DOMAIN, patterns
from helpers import elem_type, init, model, steps

pytestmark = pytest.mark.filterwarnings("error::onnx_mini.optimize.OptimizationWarning")
SINGLE = (FUSED_DOMAIN, "MatMulIntegerScaled")
GROUP = (FUSED_DOMAIN, "MatMulIntegerScaledGroup")
CENTRED = (FUSED_DOMAIN, "DynamicQuantizeCentred")
F32 = np.float32


def weights(rng, k, n, b_type, extreme):
    info = np.iinfo(b_type)
    if extreme:             # the type's two ends
        return np.where(rng.random((k, n)) < 0.5, info.min, info.max).astype(b_type)
    return rng.integers(info.min, info.max + 1, (k, n)).astype(b_type)


def siblings(k=256, n=256, count=3, b_types=(np.int8,) * 3, per_column=True, bias=True, extreme=False,
             b_zps=None, codes=False, a_type=np.uint8, outputs=None, seed=0):
    """x [m, k] -> DynamicQuantizeLinear (or, codes=True, uint8/int8 codes and their zero point fed, a constant
    x_scale) ->
    `count` x MatMulInteger(q, W_i, zp, W_zp_i) -> Cast -> Mul(x_scale * w_scale_i) [-> Add(b_i)] -> y_i, as
    onnxruntime's quantize_dynamic writes a BERT layer's Q, K and V. outputs: the graph outputs (default
    every y_i)."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    if codes:
        inputs = [("q", elem_type(a_type), None), ("zp", elem_type(a_type), [])]
        inits.append(init("xs", np.float32(0.01)))     # a fed scale would leave the chain (the tail rule's)
    else:
        inputs = [("x", TensorProto.FLOAT, None)]
        nodes.append(helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "xs", "zp"], name="dq"))
    for i in range(count):
        bt = b_types[i]
        w = weights(rng, k, n, bt, extreme)
        w_zp = np.zeros(n if per_column else (), bt) if b_zps is None else b_zps[i]
        w_scale = (rng.uniform(0.5, 2, n if per_column else ()) * 1e-3).astype(F32)
        inits += [init(f"w{i}", w), init(f"w{i}_zp", w_zp), init(f"w{i}_s", w_scale)]
        nodes += [helper.make_node("Mul", ["xs", f"w{i}_s"], [f"s{i}"], name=f"scales{i}"),
                  helper.make_node("MatMulInteger", ["q", f"w{i}", "zp", f"w{i}_zp"], [f"p{i}"], name=f"mm{i}"),
                  helper.make_node("Cast", [f"p{i}"], [f"pf{i}"], name=f"cast{i}", to=TensorProto.FLOAT),
                  helper.make_node("Mul", [f"pf{i}", f"s{i}"], [f"y{i}" if not bias else f"m{i}"], name=f"mul{i}")]
        if bias:
            inits.append(init(f"b{i}", rng.standard_normal(n).astype(F32)))
            nodes.append(helper.make_node("Add", [f"m{i}", f"b{i}"], [f"y{i}"], name=f"add{i}"))
    outs = [(o, TensorProto.FLOAT, None) for o in (outputs or [f"y{i}" for i in range(count)])]
    return model(nodes, inputs, outs, inits, opset=21)


def same_as_written(m, f, expected):
    """The optimised model runs `expected` steps and gives the graph as written bit for bit, each output its
    own contiguous array."""
    opt, raw = onnx_mini.prepare(m), onnx_mini.prepare(m, optimize=False)
    assert steps(opt) == expected
    got, ref = opt.run(f), raw.run(f)
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype and g.shape == r.shape and g.flags.c_contiguous
        np.testing.assert_array_equal(g, r)
    return got


def activations(k, m=128, extreme=False, seed=1):
    """[1, m, k] float32; extreme: two values far apart, so the codes are 0 and 255 only."""
    rng = np.random.default_rng(seed)
    if extreme:
        return {"x": np.where(rng.random((1, m, k)) < 0.5, -3.0, 5.0).astype(F32)}
    return {"x": (rng.standard_normal((1, m, k)) * 2).astype(F32)}


@pytest.mark.parametrize("extreme", [False, True], ids=["random", "extreme"])
@pytest.mark.parametrize("per_column", [True, False], ids=["per-column", "per-tensor"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_bert_layer_qkv_bit_identical(extreme, per_column, bias):
    m = siblings(per_column=per_column, bias=bias, extreme=extreme)
    ys = same_as_written(m, activations(256, extreme=extreme), [CENTRED, GROUP])
    assert [y.shape for y in ys] == [(1, 128, 256)] * 3


def test_extreme_codes_reach_both_ends():
    """The extreme activations do quantize to the codes 0 and 255 (what the test above relies on)."""
    x = activations(256, extreme=True)["x"]
    (q, _, _) = onnx_mini.prepare(model([helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"])],
                                        [("x", TensorProto.FLOAT, None)],
                                        [(o, t, None) for o, t in (("q", TensorProto.UINT8), ("s", TensorProto.FLOAT),
                                                                   ("z", TensorProto.UINT8))])).run({"x": x})
    assert set(np.unique(q)) == {0, 255}


def test_largest_k_and_one_past_it():
    """int8 weights at both ends less a zero point of 0 (|B - b_zp| <= 128): the joint product stays exact
    up to K = 2^24 // (255 * 128) = 514; at 515 each product keeps its own step."""
    k = (1 << 24) // (255 * 128)
    assert k == 514
    same_as_written(siblings(k=k, n=8, extreme=True), activations(k, m=5, extreme=True), [CENTRED, GROUP])
    same_as_written(siblings(k=k + 1, n=8, extreme=True), activations(k + 1, m=5, extreme=True),
                    [CENTRED, SINGLE, SINGLE, SINGLE])


def test_measured_range_of_b_decides():
    """With b_zp = 127 the offsets of -128 reach 255: the bound halves (K <= 258)."""
    k, n = 258, 4
    zps = [np.full(n, 127, np.int8)] * 3
    same_as_written(siblings(k=k, n=n, extreme=True, b_zps=zps), activations(k, m=3, extreme=True), [CENTRED, GROUP])
    same_as_written(siblings(k=k + 1, n=n, extreme=True, b_zps=zps), activations(k + 1, m=3, extreme=True),
                    [CENTRED, SINGLE, SINGLE, SINGLE])


@pytest.mark.parametrize("a_type,b_type", [(np.uint8, np.int8), (np.int8, np.uint8), (np.uint8, np.uint8)],
                         ids=["u8i8", "i8u8", "u8u8"])
def test_fed_codes_not_centred(a_type, b_type):
    """Codes and zero point fed: the steps are not centred, the group neither; the type's two ends."""
    k, n = 64, 16
    m = siblings(k=k, n=n, codes=True, a_type=a_type, b_types=(b_type,) * 3, extreme=True)
    rng = np.random.default_rng(3)
    info = np.iinfo(a_type)
    f = {"q": np.where(rng.random((2, 9, k)) < 0.5, info.min, info.max).astype(a_type),
         "zp": np.array(info.max, a_type)}
    same_as_written(m, f, [GROUP])
    (g,) = [i for i in onnx_mini.prepare(m).plan.infos if i.op_type == GROUP[1]]
    assert "centred" not in (g.attrs if hasattr(g, "attrs") else {})


def test_profile_names_every_replaced_node():
    m = siblings(k=32, n=8, count=2)
    prof = onnx_mini.profile(m, activations(32, m=4), runs=1).nodes
    (g,) = [n for n in prof if n.op_type == GROUP[1]]
    assert g.fused_from == tuple(f"{x}{i}" for i in (0, 1) for x in ("scales", "mm", "cast", "mul", "add"))


def test_one_output_also_read_elsewhere():
    """A sibling's result that is a graph output and read by another node: the group fires, outputs hold."""
    m = siblings(k=32, n=8)
    m.graph.node.append(helper.make_node("Relu", ["y1"], ["r"], name="relu"))
    m.graph.output.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, None))
    got = same_as_written(m, activations(32, m=4), [CENTRED, GROUP, ("", "Relu")])
    np.testing.assert_array_equal(got[3], np.maximum(got[1], 0))


def test_unread_product_left_out():
    """y1 read by nothing goes before the rule sees it: the other two still group."""
    m = siblings(k=32, n=8, outputs=["y2", "y0"])
    same_as_written(m, activations(32, m=4), [CENTRED, GROUP])
    (g,) = [i for i in onnx_mini.prepare(m).plan.infos if i.op_type == GROUP[1]]
    assert "mm1" not in g.fused_from and {"mm0", "mm2"} <= set(g.fused_from)


def test_different_b_types_group_apart():
    """Q and K int8, V uint8: Q and K in one step, V alone."""
    m = siblings(k=32, n=8, b_types=(np.int8, np.int8, np.uint8))
    same_as_written(m, activations(32, m=4), [CENTRED, GROUP, SINGLE])


def test_different_a_not_grouped():
    """Two products of two quantizations of x: different A, nothing to share."""
    m = siblings(k=32, n=8, count=2)
    nodes = list(m.graph.node)
    nodes.insert(1, helper.make_node("DynamicQuantizeLinear", ["x"], ["q2", "xs2", "zp2"], name="dq2"))
    for nd in nodes:
        if nd.name in ("mm1", "scales1"):
            nd.input[:] = [{"q": "q2", "zp": "zp2", "xs": "xs2"}.get(x, x) for x in nd.input]
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    same_as_written(m, activations(32, m=4), [CENTRED, CENTRED, SINGLE, SINGLE])


def test_scale_made_after_the_first_product_keeps_its_step():
    """The third product's scale is that of a quantization of the first one's result: its step cannot move
    before it; the first two still group."""
    m = siblings(k=32, n=8)
    nodes = list(m.graph.node)
    for nd in nodes:
        if nd.name == "scales2":
            nd.input[:] = ["late_s", "w2_s"]
    nodes.insert([n.name for n in nodes].index("scales2"),
                 helper.make_node("DynamicQuantizeLinear", ["y0"], ["late_q", "late_s", "late_zp"], name="late"))
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    got = same_as_written(m, activations(32, m=4), [CENTRED, GROUP, ("", "DynamicQuantizeLinear"), SINGLE])
    assert np.isfinite(got[2]).all() and got[2].any()


def test_rule_disabled_leaves_the_steps():
    full = patterns.RULES
    try:
        patterns.RULES = tuple(r for r in full if r.__name__ != "_int_product_siblings")
        assert steps(onnx_mini.prepare(siblings(k=32, n=8))) == [CENTRED, SINGLE, SINGLE, SINGLE]
    finally:
        patterns.RULES = full


# -- the kernel alone ----------------------------------------------------------------------------------

def kernel_case(fed_b=False, seed=4):
    rng = np.random.default_rng(seed)
    k, n = 40, 6
    bs = [weights(rng, k, n, np.int8, True), weights(rng, k, n, np.uint8, False)]
    zps = [np.array(-128, np.int8), rng.integers(0, 256, n).astype(np.uint8)]
    s2 = [np.float32(3e-3), rng.uniform(1, 2, n).astype(F32)]
    bias = [None, rng.standard_normal(n).astype(F32)]
    rest = []
    for i in range(2):
        rest += [bs[i], zps[i], np.array(0.5, F32), s2[i], bias[i]]
    consts = {} if fed_b else {j + 2: v for j, v in enumerate(rest) if v is not None and j % 5 in (0, 1, 3, 4)}
    group = matmul_integer_scaled_group_1(centred=0, _n_outputs=2, _constants=consts)
    singles = [matmul_integer_scaled_1(_constants={} if fed_b else {1: bs[i], 3: zps[i]}) for i in range(2)]
    return group, singles, rest, bs, zps, s2, bias


@pytest.mark.parametrize("fed_b", [False, True], ids=["constant-b", "fed-b"])
def test_kernel_matches_each_step(fed_b):
    """Mixed B types, per-tensor and per-column zero points and scales: each output is its own step's."""
    group, singles, rest, bs, zps, s2, bias = kernel_case(fed_b)
    a = np.random.default_rng(9).integers(0, 256, (3, 40)).astype(np.uint8)
    a_zp = np.array(200, np.uint8)
    got = group(a, a_zp, *rest)
    for i, s in enumerate(singles):
        want = s(a, bs[i], a_zp, zps[i], np.array(0.5, F32), s2[i], bias[i])
        assert got[i].dtype == F32 and got[i].flags.c_contiguous
        np.testing.assert_array_equal(got[i], want)
    # the first by hand: (a - 200) @ (b + 128) * (0.5 * 0.003)
    exact = (a.astype(np.int64) - 200) @ (bs[0].astype(np.int64) + 128)
    np.testing.assert_array_equal(got[0], exact.astype(F32) * (np.float32(0.5) * np.float32(3e-3)))


def test_kernel_errors_as_the_steps():
    """An A of the wrong type, or of the wrong K: each step's own error."""
    group, _, rest, *_ = kernel_case()
    with pytest.raises(OnnxMiniError, match="int8 or uint8"):
        group(np.zeros((3, 40), np.int32), np.array(0, np.int32), *rest)
    with pytest.raises(OnnxMiniError, match="cannot be multiplied"):
        group(np.zeros((3, 41), np.uint8), np.array(0, np.uint8), *rest)
