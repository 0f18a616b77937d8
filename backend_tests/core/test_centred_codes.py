"""optimize/patterns.py's int8 codes rule: a DynamicQuantizeLinear whose codes only fused integer products
read (with its zero point) becomes DynamicQuantizeCentred, handing them the codes less the zero point in
float32 (ops/contrib/quantized_matmul.py); bit for bit the graph as written, and where it must not fire."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_mini
from onnx_mini.errors import InvalidValueError
from onnx_mini.ops.contrib import quantized_matmul as qm
from onnx_mini.ops.quantization import dynamic_quantize_linear_11
from onnx_mini.optimize import FUSED_DOMAIN, patterns
from helpers import model

pytestmark = pytest.mark.filterwarnings("error::onnx_mini.optimize.OptimizationWarning")
F32 = np.float32
FUSED = (FUSED_DOMAIN, "MatMulIntegerScaled")
CENTRED = (FUSED_DOMAIN, "DynamicQuantizeCentred")
GROUP = (FUSED_DOMAIN, "MatMulIntegerScaledGroup")     # products sharing the codes, as one (patterns.py)
DQL = ("", "DynamicQuantizeLinear")


def _inputs():
    rng = np.random.default_rng(0)
    ties = np.array([-1.0, 0.0, 0.5, 1.5, 2.5, 254.5, 255.0], F32)      # scale 1: halves tie, round to even
    out = {
        "normal": rng.standard_normal((3, 40)).astype(F32) * 7,
        "positive": rng.uniform(0.25, 9, (2, 33)).astype(F32),        # lo = 0: zero point 0
        "negative": -rng.uniform(0.25, 9, (33,)).astype(F32),         # hi = 0: zero point 255
        "ties": ties * F32(3 / 256),
        "scale-one": np.array([-100.5, -0.5, 0.5, 1.5, 154.5], F32),  # 255 / 255: x / 1 ties exactly
        "clip": np.array([-1.5, 253.5, 7.5], F32),                    # zero point 2: 253.5 -> 254 + 2, clipped
        "zeros": np.zeros((4, 3), F32),
        "empty": np.zeros((0, 5), F32),
        "scalar": np.array(-2.5, F32),
        "tiny": np.array([1e-30, -3e-31, 0], F32),
        "near-zero": np.array([-0.001, 10, -5, -0.01, 0.002], F32),  # -0.001 / scale rounds to a zero code
        "inf": np.array([1, np.inf, -2], F32),
        "nan": np.array([1, np.nan, -2], F32),
    }
    return out


@pytest.mark.parametrize("name,x", list(_inputs().items()), ids=list(_inputs()))
def test_codes_less_zero_point_exactly(name, x):
    """y - y_zero_point, y_scale and y_zero_point are DynamicQuantizeLinear's (NaN, infinities, zeros and the
    ties at the clip take the op itself)."""
    with np.errstate(invalid="ignore"):
        y, s, z = dynamic_quantize_linear_11()(x)
        c, s2, z2 = qm.dynamic_quantize_centred_1()(x)
    assert c.dtype == F32 and c.shape == x.shape and s2.dtype == F32 and z2.dtype == np.uint8
    np.testing.assert_array_equal(c, y.astype(np.int64) - int(z))
    assert not np.signbit(c[c == 0]).any()          # code - zp = 0 is +0, as the integer difference
    assert z2 == z and (s2 == s or np.isnan(s) and np.isnan(s2))


def test_rejects_non_float32():
    with pytest.raises(InvalidValueError, match="float32"):
        qm.dynamic_quantize_centred_1()(np.zeros(3, np.float16))


def test_centred_product_checks_its_operands():
    run = qm.matmul_integer_scaled_1(centred=1)
    a, b = np.ones((2, 3), F32), np.ones((3, 2), np.int8)
    y = run(a, b, np.array(9, np.uint8), np.array(0, np.int8), F32(0.5))
    np.testing.assert_array_equal(y, np.full((2, 2), 1.5, F32))
    with pytest.raises(InvalidValueError, match="centred A"):
        run(a.astype(np.uint8), b, np.array(9, np.uint8), np.array(0, np.int8), F32(0.5))
    with pytest.raises(InvalidValueError, match="int8 or uint8"):
        run(a, b.astype(np.int16), np.array(9, np.uint8), np.array(0, np.int16), F32(0.5))


# -- graphs ------------------------------------------------------------------------------------------

def layer(extra_nodes=(), extra_outputs=(), n_products=2, a_zp="x_zp", k=300):
    """x -> DynamicQuantizeLinear -> n products MatMulInteger(x_q, W_i, a_zp, w_zp) -> Cast -> Mul(x_scale *
    w_scale) -> Add(b_i) (quantize_dynamic's Q, K, V projections share one quantized input). k = 300:
    the exact sums pass 2^24 and the product goes by chunks."""
    rng = np.random.default_rng(4)
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["x_q", "x_scale", "x_zp"], name="dq")]
    inits = [numpy_helper.from_array(np.array(131, np.uint8), "zp131")]
    outs = []
    for i in range(n_products):
        w = rng.integers(-128, 128, (k, 6)).astype(np.int8)
        w[:, 0] = -128                                     # the largest offsets: exact sums still
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(np.int8(i - 1), f"w{i}_zp"),
                  numpy_helper.from_array(rng.uniform(1e-3, 1e-2, 6).astype(F32), f"w{i}_scale"),
                  numpy_helper.from_array(rng.standard_normal(6).astype(F32), f"b{i}")]
        nodes += [helper.make_node("Mul", ["x_scale", f"w{i}_scale"], [f"s{i}"]),
                  helper.make_node("MatMulInteger", ["x_q", f"w{i}", a_zp, f"w{i}_zp"], [f"p{i}"]),
                  helper.make_node("Cast", [f"p{i}"], [f"pf{i}"], to=TensorProto.FLOAT),
                  helper.make_node("Mul", [f"pf{i}", f"s{i}"], [f"m{i}"]),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"y{i}"])]
        outs.append((f"y{i}", TensorProto.FLOAT, None))
    nodes += list(extra_nodes)
    return model(nodes, [("x", TensorProto.FLOAT, None)], outs + list(extra_outputs), inits, opset=21)


def bit_identical(m, x, expected):
    opt, raw = onnx_mini.prepare(m), onnx_mini.prepare(m, optimize=False)
    assert [(i.domain, i.op_type) for i in opt.plan.infos] == expected
    got, ref = opt.run({"x": x}), raw.run({"x": x})
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype and g.shape == r.shape
        np.testing.assert_array_equal(g, r)
        if g.dtype == F32:
            np.testing.assert_array_equal(g.view(np.uint32), r.view(np.uint32))     # zeros' signs too


X = {"normal": np.random.default_rng(1).standard_normal((2, 5, 300)).astype(F32) * 4,
     "clipped-ties": np.array([[-1.5, 253.5, 7.5] * 100], F32),     # scale 1, zero point 2: 253.5 rounds to 256
     "zeros": np.zeros((3, 300), F32),
     "nan": np.where(np.arange(300) == 7, np.nan, 1.0).astype(F32)[None]}


@pytest.mark.parametrize("name", list(X))
def test_shared_codes_bit_identical(name):
    """Two products read the codes (the Q/K/V case); x_scale read by both scales' Muls."""
    with np.errstate(invalid="ignore"):
        bit_identical(layer(), X[name], [CENTRED, GROUP])


def test_scale_and_zero_point_outputs_still_given():
    m = layer(extra_outputs=[("x_scale", TensorProto.FLOAT, None), ("x_zp", TensorProto.UINT8, None)], n_products=1)
    bit_identical(m, X["normal"], [CENTRED, FUSED])


def test_not_when_the_codes_are_a_graph_output():
    bit_identical(layer(extra_outputs=[("x_q", TensorProto.UINT8, None)], n_products=1), X["normal"], [DQL, FUSED])


def test_not_when_another_op_reads_the_codes():
    m = layer([helper.make_node("Cast", ["x_q"], ["qf"], to=TensorProto.FLOAT)], [("qf", TensorProto.FLOAT, None)],
              n_products=1)
    bit_identical(m, X["normal"], [DQL, FUSED, ("", "Cast")])


def test_not_when_a_product_takes_another_zero_point():
    bit_identical(layer(n_products=1, a_zp="zp131"), X["normal"], [DQL, FUSED])


def test_not_when_a_product_is_not_fused():
    """The second product's Cast also read elsewhere: it stays MatMulInteger, which reads the uint8 codes."""
    m = layer([helper.make_node("Neg", ["pf1"], ["neg"])], [("neg", TensorProto.FLOAT, None)])
    bit_identical(m, X["normal"], [DQL, FUSED, ("", "Mul"), ("", "MatMulInteger"), ("", "Cast"), ("", "Mul"),
                                   ("", "Add"), ("", "Neg")])


def test_rule_disabled_leaves_the_quantize():
    full = patterns.RULES
    try:
        patterns.RULES = tuple(r for r in full if r.__name__ != "_centred_codes")
        assert [(i.domain, i.op_type) for i in onnx_mini.prepare(layer()).plan.infos] == [DQL, GROUP]
    finally:
        patterns.RULES = full
