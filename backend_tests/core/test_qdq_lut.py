"""optimize/qdq_lut.py: DequantizeLinear -> elementwise ops -> QuantizeLinear on 8-bit codes becomes one
lookup table, bit for bit the graph as written on every code; and the cases where it must not fire."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnx_mini
from onnx_mini.optimize import FUSED_DOMAIN
from helpers import elem_type, init, model, steps

pytestmark = pytest.mark.filterwarnings("error::onnx_mini.optimize.OptimizationWarning")
LUT = [(FUSED_DOMAIN, "LookupTable")]


def qdq(chain, codes=np.uint8, s_in=0.05, z_in=128, s_out=0.03, z_out=0, out=np.uint8, shape=(4, 3, 64),
        extra_outputs=(), scale_in=None, opset=21):
    """x (codes) -> DequantizeLinear -> chain -> QuantizeLinear -> y. chain: [(op, {const name: value},
    attrs, chain operand position)]; the constants become initializers."""
    inits = [init("s_in", np.float32(s_in) if scale_in is None else scale_in), init("z_in", np.array(z_in, codes)),
             init("s_out", np.float32(s_out)), init("z_out", np.array(z_out, out))]
    nodes = [helper.make_node("DequantizeLinear", ["x", "s_in", "z_in"], ["t0"], name="dq")]
    for i, (op, consts, attrs, pos) in enumerate(chain):
        ins = list(consts)
        ins.insert(pos, f"t{i}")
        inits += [init(k, v) for k, v in consts.items()]
        nodes.append(helper.make_node(op, ins, [f"t{i + 1}"], name=f"op{i}", **attrs))
    nodes.append(helper.make_node("QuantizeLinear", [f"t{len(chain)}", "s_out", "z_out"], ["y"], name="q"))
    outputs = [("y", elem_type(out), None)] + [(n, TensorProto.FLOAT, None) for n in extra_outputs]
    return model(nodes, [("x", elem_type(codes), list(shape))], outputs, inits, opset=opset)


def all_codes(codes, shape):
    """Every code at least once, shuffled, in `shape`."""
    n = int(np.prod(shape))
    bits = np.random.default_rng(n).permutation(np.resize(np.arange(256, dtype=np.uint8), n))
    return bits.view(codes).reshape(shape)


def same_as_written(m, codes, shape, expected=LUT):
    opt, raw = onnx_mini.prepare(m), onnx_mini.prepare(m, optimize=False)
    assert steps(opt) == expected
    x = all_codes(codes, shape)
    (got,), (ref,) = opt.run({"x": x}), raw.run({"x": x})
    assert got.dtype == ref.dtype and got.shape == ref.shape
    np.testing.assert_array_equal(got, ref)
    return got


f = np.float32
CHAINS = {
    "HardSwish": [("HardSwish", {}, {}, 0)],
    "HardSigmoid": [("HardSigmoid", {}, {"alpha": 0.3, "beta": 0.4}, 0)],
    "Sigmoid": [("Sigmoid", {}, {}, 0)],
    "Tanh": [("Tanh", {}, {}, 0)],
    "Relu": [("Relu", {}, {}, 0)],
    "LeakyRelu": [("LeakyRelu", {}, {"alpha": 0.1}, 0)],
    "Clip": [("Clip", {"lo": f(0), "hi": f(6)}, {}, 0)],
    "Mul": [("Mul", {"c": f(1.7)}, {}, 0)],
    "Sub-from-constant": [("Sub", {"c": f(0.25)}, {}, 1)],
    "Add-rank-1-constant": [("Add", {"c": np.array([0.3], f)}, {}, 0)],
    "Mul-HardSwish": [("Mul", {"c": f(2.5)}, {}, 0), ("HardSwish", {}, {}, 0)],
    "Clip-Sigmoid-Add": [("Clip", {"lo": f(-1), "hi": f(1)}, {}, 0), ("Sigmoid", {}, {}, 0),
                         ("Add", {"c": f(-0.5)}, {}, 0)],
    "requantize": [],
}
QPARAMS = [(0.05, 128, 0.03, 0), (0.1, 3, 0.02, 200), (0.7, 255, 0.5, 17)]   # s_in, z_in (uint8), s_out, z_out


@pytest.mark.parametrize("chain", CHAINS, ids=list(CHAINS))
@pytest.mark.parametrize("codes", [np.uint8, np.int8], ids=["uint8", "int8"])
@pytest.mark.parametrize("out", [np.uint8, np.int8], ids=["to-uint8", "to-int8"])
@pytest.mark.parametrize("qp", QPARAMS, ids=["q0", "q1", "q2"])
def test_chain_is_one_lookup_bit_for_bit(chain, codes, out, qp):
    s_in, z_in, s_out, z_out = qp
    shift = lambda z, dt: z if dt == np.uint8 else z - 128     # the same zero points in int8's range
    m = qdq(CHAINS[chain], codes, s_in, shift(z_in, codes), s_out, shift(z_out, out), out, shape=(2, 128, 256))
    same_as_written(m, codes, (2, 128, 256))       # 65536 values, every code
    same_as_written(qdq(CHAINS[chain], codes, s_in, shift(z_in, codes), s_out, shift(z_out, out), out,
                        shape=(257,)), codes, (257,))     # an odd size


def test_values_by_hand():
    # uint8 codes, scale 0.5, zero point 128 -> Relu -> scale 0.25, zero point 10: code c gives
    # max(c - 128, 0) * 0.5 / 0.25 + 10, saturated at 255
    m = qdq(CHAINS["Relu"], np.uint8, 0.5, 128, 0.25, 10, shape=(16, 16))
    y = same_as_written(m, np.uint8, (16, 16))
    x = all_codes(np.uint8, (16, 16)).astype(np.int64)
    np.testing.assert_array_equal(y, np.minimum(np.maximum(x - 128, 0) * 2 + 10, 255))


def test_int8_codes_index_by_their_bits():
    # int8 -128..127, scale 1, zero point 0 -> Neg -> scale 1, zero point 0 (int8): -x saturated
    m = qdq([("Neg", {}, {}, 0)], np.int8, 1.0, 0, 1.0, 0, np.int8, shape=(8, 64))
    y = same_as_written(m, np.int8, (8, 64))
    x = all_codes(np.int8, (8, 64)).astype(np.int64)
    np.testing.assert_array_equal(y, np.clip(-x, -128, 127))


def test_older_opsets():
    same_as_written(qdq(CHAINS["Mul-HardSwish"], opset=14, shape=(2, 300)), np.uint8, (2, 300))
    same_as_written(qdq(CHAINS["Sigmoid"], opset=13, shape=(2, 300)), np.uint8, (2, 300))


def test_profile_names_the_replaced_nodes():
    m = qdq(CHAINS["Mul-HardSwish"])
    (n,) = onnx_mini.profile(m, {"x": all_codes(np.uint8, (4, 3, 64))}, runs=1).nodes
    assert (n.domain, n.op_type, n.fused_from) == (FUSED_DOMAIN, "LookupTable", ("dq", "op0", "op1", "q"))


DQ_CHAIN_Q = [("", "DequantizeLinear"), ("", "Mul"), ("", "HardSwish"), ("", "QuantizeLinear")]


def test_not_fused_when_an_intermediate_is_read_elsewhere():
    m = qdq(CHAINS["Mul-HardSwish"], extra_outputs=["t1"])          # Mul's output is also a graph output
    opt = onnx_mini.prepare(m)
    assert steps(opt) == DQ_CHAIN_Q
    x = all_codes(np.uint8, (4, 3, 64))
    for g, r in zip(opt.run({"x": x}), onnx_mini.prepare(m, optimize=False).run({"x": x})):
        np.testing.assert_array_equal(g, r)


def test_not_fused_with_a_per_channel_scale():
    m = qdq(CHAINS["HardSwish"], shape=(4, 3), scale_in=np.array([0.1, 0.2, 0.3], np.float32))
    m.graph.node[0].attribute.append(helper.make_attribute("axis", 1))
    assert steps(onnx_mini.prepare(m)) == [("", "DequantizeLinear"), ("", "HardSwish"), ("", "QuantizeLinear")]


def test_not_fused_when_the_scale_is_an_input():
    m = qdq(CHAINS["HardSwish"])
    (s,) = [i for i in m.graph.initializer if i.name == "s_in"]
    m.graph.initializer.remove(s)
    m.graph.input.append(helper.make_tensor_value_info("s_in", TensorProto.FLOAT, []))
    assert steps(onnx_mini.prepare(m)) == [("", "DequantizeLinear"), ("", "HardSwish"), ("", "QuantizeLinear")]


def test_a_fed_override_of_the_scale_runs_the_graph_as_written():
    m = qdq(CHAINS["Sigmoid"], opset=13)
    m.ir_version = 3                     # IR 3: initializers are inputs' defaults, a run may feed them
    m.graph.input.append(helper.make_tensor_value_info("s_in", TensorProto.FLOAT, []))
    opt, raw = onnx_mini.prepare(m), onnx_mini.prepare(m, optimize=False)
    x = all_codes(np.uint8, (4, 3, 64))
    for feeds in ({"x": x}, {"x": x, "s_in": np.array(0.2, np.float32)}):
        np.testing.assert_array_equal(opt.run(feeds)[0], raw.run(feeds)[0])
    assert not np.array_equal(opt.run({"x": x})[0], opt.run({"x": x, "s_in": np.array(0.2, np.float32)})[0])


def test_not_fused_when_the_output_is_not_8_bit():
    m = qdq(CHAINS["HardSwish"], out=np.int16, z_out=0)
    assert steps(onnx_mini.prepare(m)) == [("", "DequantizeLinear"), ("", "HardSwish"), ("", "QuantizeLinear")]


def test_not_fused_without_the_input_zero_point():
    m = qdq(CHAINS["HardSwish"])
    del m.graph.node[0].input[2]        # x's type then is not known before run
    assert steps(onnx_mini.prepare(m)) == [("", "DequantizeLinear"), ("", "HardSwish"), ("", "QuantizeLinear")]


def test_wrong_code_type_fed_is_an_error_naming_the_node():
    opt = onnx_mini.prepare(qdq(CHAINS["HardSwish"]))
    with pytest.raises(onnx_mini.errors.OnnxMiniError, match="LookupTable|int8"):
        opt.run({"x": np.zeros((4, 3, 64), np.int8)})


@pytest.mark.parametrize("codes", [np.uint8, np.int8], ids=["uint8", "int8"])
def test_lookup_kernel_on_views_scalars_and_empty(codes):
    """The kernel itself: y[i] = table[x[i]'s bits as uint8] on a strided view, a 0-d and an empty
    input, the result a fresh writable array of the table's type and x's shape."""
    from onnx_mini.ops.fused import fused_lookup_table
    table = ((np.arange(256) * 7 + 3) % 256).astype(np.uint8).view(np.int8)     # int8 output codes
    run = fused_lookup_table(codes=np.dtype(codes).name, _constants={1: table})
    x = all_codes(codes, (16, 32))
    for v in (x, x.T, x[::3, 1::2], x[2, 5].reshape(()), x[:0]):
        y = run(v, table)
        assert y.dtype == np.int8 and y.shape == v.shape and y.flags.writeable
        np.testing.assert_array_equal(y.view(np.uint8).astype(np.int64),
                                      (v.view(np.uint8).astype(np.int64) * 7 + 3) % 256)
    with pytest.raises(onnx_mini.errors.InvalidValueError):
        run(x.astype(np.int16), table)


# -- the QuantizeLinear before the chain and the DequantizeLinear after it, in the same step ----------

def qdq_float(chain, codes=np.uint8, q0=(0.05, 128), s_in=0.05, z_in=128, s_out=0.03, z_out=0, out=np.uint8,
              dq1=(0.03, 0), shape=(4, 3, 64), opset=21, x_type=TensorProto.FLOAT, first=True, last=True,
              extra_outputs=()):
    """x (float) -> QuantizeLinear(q0) -> [qdq's chain] -> DequantizeLinear(dq1) -> y; `first` / `last`
    False leave that end out (x codes / y codes)."""
    m = qdq(chain, codes, s_in, z_in, s_out, z_out, out, shape=shape, opset=opset)
    g = m.graph
    if first:
        g.initializer.extend([init("s0", np.float32(q0[0])), init("z0", np.array(q0[1], codes))])
        g.node.insert(0, helper.make_node("QuantizeLinear", ["xf", "s0", "z0"], ["x"], name="q0"))
        del g.input[:]
        g.input.append(helper.make_tensor_value_info("xf", x_type, list(shape)))
    if last:
        g.initializer.extend([init("s1", np.float32(dq1[0])), init("z1", np.array(dq1[1], out))])
        g.node.append(helper.make_node("DequantizeLinear", ["y", "s1", "z1"], ["yf"], name="dq1"))
        del g.output[:]
        g.output.append(helper.make_tensor_value_info("yf", TensorProto.FLOAT, None))
    for n in extra_outputs:
        g.output.append(helper.make_tensor_value_info(n, elem_type(codes), None))
    return m


def hard_floats(scale, shape, dtype=np.float32):
    """Every code's quotient and the ties either side (both parities), past both bounds, NaN, the
    infinities, both zeros, huge values; repeated to `shape`."""
    r = np.arange(-300, 301, dtype=np.float64)
    v = np.concatenate([(r[:, None] + [0, 0.5, -0.5, 0.49, 0.51]).reshape(-1) * scale,
                        [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 3e38, -3e38, 1e-30]])
    with np.errstate(over="ignore"):
        return np.resize(v.astype(dtype), int(np.prod(shape))).reshape(shape)


def same_floats_as_written(m, x, name, expected=LUT):
    opt, raw = onnx_mini.prepare(m), onnx_mini.prepare(m, optimize=False)
    assert steps(opt) == expected
    with np.errstate(over="ignore", invalid="ignore"):
        got, ref = opt.run({name: x}), raw.run({name: x})
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype and g.shape == r.shape
        np.testing.assert_array_equal(g.reshape(-1).view(np.uint8), r.reshape(-1).view(np.uint8))   # bits: -0, NaN
    return got[0]


# (q0 scale, q0 zp, DequantizeLinear's s_in, z_in, QuantizeLinear's s_out, z_out, dq1 scale, dq1 zp): the same
# parameters either side of each pair as a QDQ model writes them, or not; y's zero point 128 puts every
# code - zp in int8's range (the table then holds the difference), 10 does not
FLOAT_PARAMS = [(0.05, 128, 0.05, 128, 0.03, 128, 0.03, 128), (0.1, 3, 0.1, 3, 0.02, 10, 0.02, 10),
                (0.7, 255, 0.5, 250, 0.5, 0, 0.25, 0), (0.013, 0, 0.013, 0, 0.4, 200, 0.4, 200)]


@pytest.mark.parametrize("chain", ["HardSwish", "Sigmoid", "Mul-HardSwish", "requantize"])
@pytest.mark.parametrize("codes", [np.uint8, np.int8], ids=["uint8", "int8"])
@pytest.mark.parametrize("out", [np.uint8, np.int8], ids=["to-uint8", "to-int8"])
@pytest.mark.parametrize("qp", FLOAT_PARAMS, ids=["p0", "p1", "p2", "p3"])
def test_float_in_float_out_is_one_step_bit_for_bit(chain, codes, out, qp):
    s0, z0, s_in, z_in, s_out, z_out, s1, z1 = qp
    shift = lambda z, dt: z if dt == np.uint8 else z - 128     # the same zero points in int8's range
    shape = (2, 24, 128)
    m = qdq_float(CHAINS[chain], codes, (s0, shift(z0, codes)), s_in, shift(z_in, codes), s_out, shift(z_out, out),
                  out, (s1, shift(z1, out)), shape=shape)
    same_floats_as_written(m, hard_floats(s0, shape), "xf")


def test_float_step_values_by_hand():
    # x / 0.5 rounded half to even + 128, saturated -> Relu at scale 0.5, zp 128 -> scale 0.25, zp 10 ->
    # back to floats: (min(max(code - 128, 0) * 2 + 10, 255) - 10) * 0.25
    m = qdq_float(CHAINS["Relu"], np.uint8, (0.5, 128), 0.5, 128, 0.25, 10, np.uint8, (0.25, 10), shape=(8,))
    x = np.array([-1.0, 0.25, 0.75, 1.25, 3.0, 40.0, 70.0, np.nan], np.float32)
    # codes: 126, 128 (0.5 ties to 0), 130 (1.5 to 2), 130 (2.5 to 2), 134, 208, 255, 128 (NaN: the zero point)
    y = same_floats_as_written(m, x, "xf")
    codes = np.array([126, 128, 130, 130, 134, 208, 255, 128])
    np.testing.assert_array_equal(y, (np.minimum(np.maximum(codes - 128, 0) * 2 + 10, 255) - 10) * 0.25)


@pytest.mark.parametrize("first,last", [(True, False), (False, True)], ids=["quantize-only", "dequantize-only"])
def test_one_end_only(first, last):
    m = qdq_float(CHAINS["HardSwish"], first=first, last=last, dq1=(0.03, 5), shape=(3, 5, 64))
    if first:
        same_floats_as_written(m, hard_floats(0.05, (3, 5, 64)), "xf")
    else:
        same_floats_as_written(m, all_codes(np.uint8, (3, 5, 64)), "x")


def test_float_step_on_views_scalars_empty_and_odd_sizes():
    for shape in [(257,), (1, 1), (0, 4), ()]:
        mm = qdq_float(CHAINS["HardSwish"], shape=shape)
        same_floats_as_written(mm, hard_floats(0.05, shape), "xf")
    from onnx_mini.ops.fused import fused_lookup_table
    from onnx_mini.ops.quantization import quantized_lookup
    table = ((np.arange(256) * 7 + 3) % 256).astype(np.uint8)
    consts = {1: table, 2: np.array(0.05, np.float32), 3: np.array(128, np.uint8), 4: np.array(0.03, np.float32),
              5: np.array(10, np.uint8)}
    run = fused_lookup_table(codes="uint8", q_version=21, dq_version=21, _constants=consts)
    assert run.__name__ == "run_constant"           # the one-step path, proven at prepare
    slow = quantized_lookup(fused_lookup_table(codes="uint8"), 21, 21, np.uint8)     # the three steps
    x = hard_floats(0.05, (40, 30))
    params = [consts[i] for i in range(1, 6)]
    for v in (x, x.T, x[::3, 1::2], x[:0]):
        with np.errstate(over="ignore", invalid="ignore"):
            got, want = run(v, *params), slow(v, *params)
        assert got.dtype == np.float32 and got.shape == v.shape and got.flags.writeable
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_float16_input_takes_the_written_kernels():
    # opset 23: x float16, its scale float32: one step, which runs the written kernels for such an x
    m = qdq_float(CHAINS["HardSwish"], x_type=TensorProto.FLOAT16, shape=(4, 64), opset=23)
    same_floats_as_written(m, hard_floats(0.05, (4, 64), np.float16), "xf")
    # opset 21: the scale has x's type, float16: that QuantizeLinear stays as written
    m = qdq_float(CHAINS["HardSwish"], x_type=TensorProto.FLOAT16, shape=(4, 64))
    (s0,) = [i for i in m.graph.initializer if i.name == "s0"]
    s0.CopyFrom(init("s0", np.float16(0.05)))
    same_floats_as_written(m, hard_floats(0.05, (4, 64), np.float16), "xf", expected=[("", "QuantizeLinear")] + LUT)


def test_ends_not_taken_when_their_codes_are_read_elsewhere():
    m = qdq_float(CHAINS["HardSwish"], extra_outputs=["x"])             # q0's codes are a graph output
    got = same_floats_as_written(m, hard_floats(0.05, (4, 3, 64)), "xf", expected=[("", "QuantizeLinear")] + LUT)
    assert got.dtype == np.float32


def test_ends_not_taken_with_a_per_channel_or_fed_scale():
    m = qdq_float(CHAINS["HardSwish"], shape=(4, 3))
    (s1,) = [i for i in m.graph.initializer if i.name == "s1"]
    s1.CopyFrom(init("s1", np.array([0.1, 0.2, 0.3], np.float32)))
    m.graph.node[-1].attribute.append(helper.make_attribute("axis", 1))
    (z1,) = [i for i in m.graph.initializer if i.name == "z1"]
    z1.CopyFrom(init("z1", np.array([0, 1, 2], np.uint8)))
    same_floats_as_written(m, hard_floats(0.05, (4, 3)), "xf", expected=LUT + [("", "DequantizeLinear")])


def test_a_fed_override_of_an_end_scale_runs_the_graph_as_written():
    m = qdq_float(CHAINS["Sigmoid"], opset=13, shape=(4, 64))
    m.ir_version = 3                     # IR 3: initializers are inputs' defaults, a run may feed them
    m.graph.input.append(helper.make_tensor_value_info("s0", TensorProto.FLOAT, []))
    opt, raw = onnx_mini.prepare(m), onnx_mini.prepare(m, optimize=False)
    assert steps(opt) == LUT             # the default run: s0 its initializer
    x = hard_floats(0.05, (4, 64))
    with np.errstate(over="ignore"):
        for feeds in ({"xf": x}, {"xf": x, "s0": np.array(0.2, np.float32)}):
            np.testing.assert_array_equal(opt.run(feeds)[0].view(np.uint32), raw.run(feeds)[0].view(np.uint32))
        assert not np.array_equal(opt.run({"xf": x})[0], opt.run({"xf": x, "s0": np.array(0.2, np.float32)})[0])
