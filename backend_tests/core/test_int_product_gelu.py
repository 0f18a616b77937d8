"""optimize/patterns.py's int8 + Gelu rule: the Gelu that alone reads a MatMulIntegerScaled step's result runs
in that step (activation="Gelu"), bit for bit the steps apart; where it must not fire; and the step's
"split"-mode path (ops/contrib/quantized_matmul.py: row blocks over the threads, each block's scale, bias
and Gelu on the thread that made it) bit for bit the whole product."""
from __future__ import annotations

import threading

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnx_mini
from onnx_mini import blas, parallel
from onnx_mini.ops.contrib import quantized_matmul as qm
from onnx_mini.ops.math.activations import gelu_20
from onnx_mini.ops.math.normal_cdf import gelu_float32
from onnx_mini.optimize import FUSED_DOMAIN, patterns
from helpers import init, model, steps

pytestmark = pytest.mark.filterwarnings("error::onnx_mini.optimize.OptimizationWarning")
F32 = np.float32
FUSED = (FUSED_DOMAIN, "MatMulIntegerScaled")
CENTRED = (FUSED_DOMAIN, "DynamicQuantizeCentred")
GELU = (FUSED_DOMAIN, "Gelu")


def ffn(gelu="erf", k=48, n=40, extra_output=False, opset=21):
    """x -> DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul(x_scale * w_scale) -> Add(b) -> Gelu -> y,
    as quantize_dynamic writes a BERT layer's first feed-forward product; gelu: "erf" (the elementary nodes
    exporters write), "none" / "tanh" (the Gelu-20 op)."""
    rng = np.random.default_rng(7)
    w = rng.standard_normal((k, n)).astype(F32)
    w_scale = (np.abs(w).max(axis=0) / 127).astype(F32)
    inits = [init("wq", np.clip(np.round(w / w_scale), -127, 127).astype(np.int8)), init("w_scale", w_scale),
             init("w_zp", np.zeros(n, np.int8)), init("b", rng.standard_normal(n).astype(F32))]
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "x_scale", "x_zp"], name="dq"),
             helper.make_node("Mul", ["x_scale", "w_scale"], ["s"], name="scales"),
             helper.make_node("MatMulInteger", ["xq", "wq", "x_zp", "w_zp"], ["p"], name="mm"),
             helper.make_node("Cast", ["p"], ["pf"], name="cast", to=TensorProto.FLOAT),
             helper.make_node("Mul", ["pf", "s"], ["ps"], name="mul"),
             helper.make_node("Add", ["ps", "b"], ["h"], name="add")]
    if gelu == "erf":
        inits += [init("sqrt2", F32(np.sqrt(2))), init("one", F32(1)), init("half", F32(0.5))]
        nodes += [helper.make_node("Div", ["h", "sqrt2"], ["t"], name="div"),
                  helper.make_node("Erf", ["t"], ["e"], name="erf"),
                  helper.make_node("Add", ["e", "one"], ["e1"], name="add1"),
                  helper.make_node("Mul", ["h", "e1"], ["he"], name="mul1"),
                  helper.make_node("Mul", ["he", "half"], ["y"], name="mul2")]
    else:
        nodes.append(helper.make_node("Gelu", ["h"], ["y"], name="gelu", approximate=gelu))
    outputs = [("y", TensorProto.FLOAT, None)] + ([("h", TensorProto.FLOAT, None)] if extra_output else [])
    return model(nodes, [("x", TensorProto.FLOAT, ["batch", k])], outputs, inits, opset=opset)


def feeds(k=48, m=9):
    return {"x": (np.random.default_rng(5).standard_normal((m, k)) * 3).astype(F32)}


def without_rule(m):
    """The model prepared with every rule but this one: the product and the Gelu as two steps."""
    full = patterns.RULES
    try:
        patterns.RULES = tuple(r for r in full if r.__name__ != "_int_product_gelu")
        return onnx_mini.prepare(m)
    finally:
        patterns.RULES = full


@pytest.mark.parametrize("gelu,opset", [("erf", 21), ("none", 21), ("tanh", 21)])
def test_gelu_in_the_product_step_bit_identical(gelu, opset):
    m = ffn(gelu, opset=opset)
    opt, apart = onnx_mini.prepare(m), without_rule(m)
    assert steps(opt) == [CENTRED, FUSED]
    assert steps(apart) == [CENTRED, FUSED, GELU if gelu == "erf" else ("", "Gelu")]
    f = feeds()
    got, ref = opt.run(f)[0], apart.run(f)[0]
    assert got.dtype == F32 and got.shape == (9, 40)
    np.testing.assert_array_equal(got, ref)
    if gelu != "erf":        # Gelu-20 as written: bit for bit the graph without any rewrite
        np.testing.assert_array_equal(got, onnx_mini.prepare(m, optimize=False).run(f)[0])


def test_profile_names_the_gelu_nodes_too():
    (n,) = [x for x in onnx_mini.profile(ffn("none"), feeds(), runs=1).nodes if x.op_type == FUSED[1]]
    assert n.fused_from == ("scales", "mm", "cast", "mul", "add", "gelu")


def test_not_when_the_product_is_also_a_graph_output():
    m = ffn("none", extra_output=True)
    assert steps(onnx_mini.prepare(m)) == [CENTRED, FUSED, ("", "Gelu")]
    f = feeds()
    for g, r in zip(onnx_mini.prepare(m).run(f), onnx_mini.prepare(m, optimize=False).run(f)):
        np.testing.assert_array_equal(g, r)


def test_not_when_another_node_reads_the_product():
    m = ffn("none")
    m.graph.node.append(helper.make_node("Relu", ["h"], ["r"], name="relu"))
    m.graph.output.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, None))
    assert steps(onnx_mini.prepare(m)) == [CENTRED, FUSED, ("", "Gelu"), ("", "Relu")]


def test_activated_steps_are_not_grouped():
    """Two products of the same codes, one read by a Gelu: the siblings rule (run before) groups them and the
    Gelu stays a step of its own (a grouped step takes no activation)."""
    m = ffn("none")
    g = m.graph
    g.node.append(helper.make_node("MatMulInteger", ["xq", "wq", "x_zp", "w_zp"], ["p2"], name="mm2"))
    g.node.append(helper.make_node("Cast", ["p2"], ["pf2"], name="cast2", to=TensorProto.FLOAT))
    g.node.append(helper.make_node("Mul", ["pf2", "w_scale"], ["z"], name="mul3"))
    g.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, None))
    opt = onnx_mini.prepare(m)
    assert (FUSED_DOMAIN, "MatMulIntegerScaledGroup") in steps(opt) and ("", "Gelu") in steps(opt)
    f = feeds()
    for a, b in zip(opt.run(f), onnx_mini.prepare(m, optimize=False).run(f)):
        np.testing.assert_array_equal(a, b)


def test_rule_disabled_leaves_the_gelu():
    assert steps(without_rule(ffn("erf"))) == [CENTRED, FUSED, GELU]


def test_unknown_activation_is_an_error():
    with pytest.raises(ValueError, match="activation"):
        qm.matmul_integer_scaled_1(activation="Relu")
    with pytest.raises(ValueError, match="approximate"):
        qm.matmul_integer_scaled_1(activation="Gelu", approximate="fast")


def test_gelu_float32_into_its_input():
    x = (np.random.default_rng(2).standard_normal((70_000,)) * 4).astype(F32)   # more than one block
    want = gelu_float32(x)
    y = x.copy()
    assert gelu_float32(y, out=y) is y
    np.testing.assert_array_equal(y, want)
    z = np.empty_like(x)
    assert gelu_float32(x, out=z) is z
    np.testing.assert_array_equal(z, want)


# -- the "split"-mode path: row blocks over the threads ----------------------------------------------------

def centred_case(m, k, n, seed=0, per_column=True, bias=True):
    rng = np.random.default_rng(seed)
    zp = np.array(rng.integers(0, 256), np.uint8)
    a = (rng.integers(0, 256, (1, m, k)).astype(F32) - F32(zp))           # DynamicQuantizeCentred's codes
    a[0, :3] = np.array([0, 255, 0], F32)[:, None] - F32(zp)               # both ends of the codes
    b = np.where(rng.random((k, n)) < 0.5, -128, 127).astype(np.int8)
    b_zp = np.where(np.arange(n) % 2, 127, -128).astype(np.int8)           # |b - b_zp| up to 255
    scale = (rng.uniform(0.5, 2, n if per_column else ()) * 1e-4).astype(F32)
    c = rng.standard_normal(n).astype(F32) if bias else None
    return a, b, zp, b_zp, scale, c


def run_kernel(args, split, monkeypatch, **attrs):
    a, b, zp, b_zp, scale, c = args
    f = qm.matmul_integer_scaled_1(centred=1, _constants={1: b, 3: b_zp}, **attrs)
    monkeypatch.setattr(blas, "splitting", lambda: split)
    try:
        return f(a, b, zp, b_zp, scale, None, c)
    finally:
        monkeypatch.undo()


@pytest.mark.parametrize("act", ["", "none", "tanh"])
@pytest.mark.parametrize("shape", [(130, 256, 256), (128, 64, 1024), (200, 300, 150)], ids=str)
def test_split_rows_bit_identical(shape, act, monkeypatch):
    """Row blocks (not a multiple of the block's rows: 130, 200) with extreme codes and per-column offsets,
    scale and bias, with and without the Gelu: the very bits of the whole product's steps; K = 300 passes
    the float32-exact bound (300 * 255 * 255 > 2^24), where the path steps aside."""
    args = centred_case(*shape)
    attrs = {"activation": "Gelu", "approximate": act} if act else {}
    split = run_kernel(args, True, monkeypatch, **attrs)
    whole = run_kernel(args, False, monkeypatch, **attrs)
    assert split.dtype == F32 and split.shape == (1, shape[0], shape[2])
    np.testing.assert_array_equal(split, whole)
    if act:        # and the Gelu kernel's own function on the product without it
        plain = run_kernel(args, False, monkeypatch)
        np.testing.assert_array_equal(whole, gelu_20(approximate=act)(plain))


def test_split_rows_takes_large_products_only():
    a, b, zp, b_zp, scale, c = centred_case(130, 256, 256, per_column=False, bias=False)
    bc = b.astype(F32) - b_zp.astype(F32)
    bound = 255 * 255
    if parallel.threads() >= 2:
        assert qm._split_rows(a, bc, bound, scale, c, None) is not None
    assert qm._split_rows(a[:, :100], bc, bound, scale, c, None) is None           # 100 * 256 * 256 < 2 * 4M
    assert qm._split_rows(a, bc, bound, scale.astype(np.float64), c, None) is None  # another scale type
    assert qm._split_rows(a.transpose(0, 2, 1)[..., :130], bc, bound, scale, c, None) is None    # not ours
    wide = np.zeros((256, qm._MAX_B_BYTES // (4 * 256) + 1), F32)     # a B over 4 MiB: blas.matmul's blocks
    assert qm._split_rows(a, wide, bound, scale, None, None) is None
    if parallel.threads() >= 2:
        assert qm._split_rows(a, wide[:, :-1], bound, scale, None, None) is not None


def test_shared_blocks_runs_each_block_once():
    seen, lock = [], threading.Lock()

    def work(i):
        with lock:
            seen.append(i)
    for n in (0, 1, 2, 7):
        seen.clear()
        parallel.shared(work, n)
        assert sorted(seen) == list(range(n))
    with parallel.limited(1):
        seen.clear()
        parallel.shared(work, 5)
        assert seen == [0, 1, 2, 3, 4]


def test_shared_blocks_raises_a_block_error():
    def work(i):
        if i == 3:
            raise RuntimeError("block 3")
    with pytest.raises(RuntimeError, match="block 3"):
        parallel.shared(work, 6)


def test_whole_model_same_in_both_modes(monkeypatch):
    """End to end in a run: split mode forced (blas's policy) gives the bits of native mode."""
    m = ffn("none", k=256, n=512)
    f = feeds(k=256, m=140)
    p = onnx_mini.prepare(m)
    monkeypatch.setattr(blas, "POLICY", "native")
    native = p.run(f)[0]
    monkeypatch.setattr(blas, "POLICY", "split")
    split = p.run(f)[0]
    np.testing.assert_array_equal(split, native)
