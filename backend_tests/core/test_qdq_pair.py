"""optimize/qdq_pair.py: QuantizeLinear read back by a DequantizeLinear with the same constant
per-tensor parameters becomes one QuantizeDequantize step, bit for bit the spec formula and the graph
as written (ties of both parities, both bounds, NaN, infinities, the sign of zero); and the cases where
it must not fire."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_mini
from onnx_mini.optimize import FUSED_DOMAIN
from helpers import elem_type, init, model, steps

pytestmark = pytest.mark.filterwarnings("error::onnx_mini.optimize.OptimizationWarning")
PAIR = [(FUSED_DOMAIN, "QuantizeDequantize")]
WRITTEN = [("", "QuantizeLinear"), ("", "DequantizeLinear")]


def pair(scale=0.5, zp=128, codes=np.uint8, shape=(64,), dq_scale=None, dq_zp=None, opset=21, x_type=TensorProto.FLOAT,
         extra_outputs=(), q_attrs=None, dq_attrs=None):
    """x -> QuantizeLinear(scale, zp) -> DequantizeLinear(dq_scale, dq_zp: the same by default) -> y."""
    inits = [init("s", np.float32(scale)), init("z", np.array(zp, codes)),
             init("s2", np.float32(scale if dq_scale is None else dq_scale)),
             init("z2", np.array(zp if dq_zp is None else dq_zp, codes))]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["c"], name="q", **(q_attrs or {})),
             helper.make_node("DequantizeLinear", ["c", "s2", "z2"], ["y"], name="dq", **(dq_attrs or {}))]
    outputs = [("y", TensorProto.FLOAT, None)] + [(n, elem_type(codes), None) for n in extra_outputs]
    return model(nodes, [("x", x_type, None if shape is None else list(shape))], outputs, inits, opset=opset)


def formula(x, scale, zp, codes):
    """The spec: y = (saturate(round_half_even(x / s) + zp) - zp) * s, in float64 then float32 (exact
    here: the quotient and product are float32 operations, the rest integers); NaN gives the zero
    point, as QuantizeLinear does here (the spec leaves it undefined)."""
    info = np.iinfo(codes)
    q = (x.astype(np.float32) / np.float32(scale)).astype(np.float64)
    q = np.where(np.isnan(q), 0, q)
    c = np.clip(np.rint(q) + zp, info.min, info.max)
    return ((c - zp).astype(np.float32) * np.float32(scale)).astype(np.float32)


def probe_values(scale, zp, codes):
    """Ties of both parities around zero and near both bounds, the bounds, beyond them, NaN, +-inf,
    +-0 and tiny values of both signs (which round to a zero that must be +0), and random values."""
    info = np.iinfo(codes)
    k = np.arange(info.min - zp - 3, info.max - zp + 4, dtype=np.float64)
    ties = np.concatenate([k + 0.5, k - 0.5, k, k + 0.25, k - 0.75])
    special = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, -1e-30, 0.49, -0.49, 1e30, -1e30])
    rng = np.random.default_rng(0)
    noise = rng.standard_normal(1000) * (info.max - info.min) / 3
    return np.concatenate([ties * scale, special, noise * scale]).astype(np.float32)


def bits(a):
    return np.ascontiguousarray(a).view(np.uint32)


CASES = [(0.5, 128, np.uint8), (0.5, 3, np.uint8), (0.25, 0, np.uint8), (1.0, 255, np.uint8),
         (0.5, 0, np.int8), (0.125, -7, np.int8), (0.03, 17, np.uint8),
         (0.5, 1000, np.uint16), (2.0, -3, np.int16)]


@pytest.mark.parametrize("scale,zp,codes", CASES, ids=[f"{np.dtype(c).name}-s{s}-z{z}" for s, z, c in CASES])
def test_pair_is_one_step_bit_for_bit(scale, zp, codes):
    x = probe_values(scale, zp, codes)
    m = pair(scale, zp, codes, shape=x.shape)
    opt, raw = onnx_mini.prepare(m), onnx_mini.prepare(m, optimize=False)
    assert steps(opt) == PAIR
    (got,), (ref,) = opt.run({"x": x}), raw.run({"x": x})
    assert got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_array_equal(bits(got), bits(ref))
    np.testing.assert_array_equal(bits(got), bits(formula(x, scale, zp, codes)))


def test_values_by_hand():
    # scale 0.5, zero point 128 (uint8): x / 0.5 rounded half to even, kept within [-128, 127]
    x = np.array([0.25, 0.75, -0.25, -0.75, 1.3, 100.0, -100.0, np.nan, -0.1], np.float32)
    y = onnx_mini.prepare(pair(0.5, 128, shape=x.shape)).run({"x": x})[0]
    np.testing.assert_array_equal(bits(y), bits(np.array([0.0, 1.0, 0.0, -1.0, 1.5, 63.5, -64.0, 0.0, 0.0],
                                                         np.float32)))


def test_views_scalars_empty_and_fresh_result():
    m = pair(0.5, 128, shape=None)
    opt = onnx_mini.prepare(m)
    assert steps(opt) == PAIR
    base = probe_values(0.5, 128, np.uint8)[:600].reshape(20, 30)
    for v in (base, base.T, base[::3, 1::2], base[2, 5].reshape(()), base[:0]):
        x = v.copy() if v.ndim == 0 else v
        keep = np.array(x, copy=True)
        y = opt.run({"x": x})[0]
        assert y.shape == x.shape and y.dtype == np.float32
        np.testing.assert_array_equal(bits(y.reshape(-1)), bits(formula(keep, 0.5, 128, np.uint8).reshape(-1)))
        np.testing.assert_array_equal(bits(np.asarray(x).reshape(-1)), bits(keep.reshape(-1)))   # x untouched


def test_older_opsets_and_int32_input():
    x = probe_values(0.25, 10, np.uint8)
    for opset in (10, 13, 19):
        m = pair(0.25, 10, shape=x.shape, opset=opset)
        opt, raw = onnx_mini.prepare(m), onnx_mini.prepare(m, optimize=False)
        assert steps(opt) == PAIR
        np.testing.assert_array_equal(bits(opt.run({"x": x})[0]), bits(raw.run({"x": x})[0]))
    # QuantizeLinear-13 takes int32 x with a float32 scale: the fused step runs the written kernels
    m = pair(0.25, 10, shape=(5,), opset=13, x_type=TensorProto.INT32)
    xi = np.array([-3, 0, 7, 100, -100], np.int32)
    opt, raw = onnx_mini.prepare(m), onnx_mini.prepare(m, optimize=False)
    assert steps(opt) == PAIR
    np.testing.assert_array_equal(opt.run({"x": xi})[0], raw.run({"x": xi})[0])
    np.testing.assert_array_equal(opt.run({"x": xi})[0], formula(xi.astype(np.float32), 0.25, 10, np.uint8))


def test_wrong_input_type_is_the_written_nodes_error():
    opt = onnx_mini.prepare(pair(0.5, 128, shape=(4,)))
    assert steps(opt) == PAIR
    with pytest.raises(onnx_mini.errors.OnnxMiniError, match="float16|y_scale|x"):
        opt.run({"x": np.zeros(4, np.float16)})


@pytest.mark.parametrize("change", [
    dict(dq_scale=0.25), dict(dq_zp=127), dict(extra_outputs=["c"]),
    dict(q_attrs={"output_dtype": TensorProto.UINT8, "block_size": 2}),
    dict(opset=23, dq_attrs={"output_dtype": TensorProto.FLOAT16}),
    dict(opset=23, q_attrs={"precision": TensorProto.FLOAT16}),
], ids=["other-scale", "other-zero-point", "codes-are-an-output", "block-size", "float16-output", "float16-precision"])
def test_not_fused(change):
    m = pair(0.5, 128, shape=(8,), **change)
    opt = onnx_mini.prepare(m)
    assert steps(opt) == WRITTEN
    x = probe_values(0.5, 128, np.uint8)[:8]
    for g, r in zip(opt.run({"x": x}), onnx_mini.prepare(m, optimize=False).run({"x": x})):
        np.testing.assert_array_equal(g, r)


def test_not_fused_with_a_per_axis_scale_or_a_fed_scale():
    m = pair(0.5, 128, shape=(2, 3))
    for name in ("s", "z", "s2", "z2"):
        (t,) = [i for i in m.graph.initializer if i.name == name]
        v = numpy_helper.to_array(t)
        t.CopyFrom(init(name, np.repeat(v, 3)))
    assert steps(onnx_mini.prepare(m)) == WRITTEN
    m = pair(0.5, 128, shape=(8,))
    (s,) = [i for i in m.graph.initializer if i.name == "s"]
    m.graph.initializer.remove(s)
    m.graph.input.append(helper.make_tensor_value_info("s", TensorProto.FLOAT, []))
    assert steps(onnx_mini.prepare(m)) == WRITTEN


def test_a_lookup_chain_keeps_its_pairs():
    # Q -> DQ -> HardSwish -> Q -> DQ: DQ -> HardSwish -> Q is the lookup table (qdq_lut runs first),
    # which takes the Q before it and the DQ after it in: no pair is left for qdq_pair
    inits = [init(n, v) for n, v in (("s", np.float32(0.05)), ("z", np.uint8(128)),
                                     ("s2", np.float32(0.02)), ("z2", np.uint8(3)))]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["a"]),
             helper.make_node("DequantizeLinear", ["a", "s", "z"], ["b"]),
             helper.make_node("HardSwish", ["b"], ["h"]),
             helper.make_node("QuantizeLinear", ["h", "s2", "z2"], ["c"]),
             helper.make_node("DequantizeLinear", ["c", "s2", "z2"], ["y"])]
    m = model(nodes, [("x", TensorProto.FLOAT, [300])], [("y", TensorProto.FLOAT, None)], inits)
    opt, raw = onnx_mini.prepare(m), onnx_mini.prepare(m, optimize=False)
    assert steps(opt) == [(FUSED_DOMAIN, "LookupTable")]
    x = np.linspace(-8, 8, 300, dtype=np.float32)
    np.testing.assert_array_equal(bits(opt.run({"x": x})[0]), bits(raw.run({"x": x})[0]))


def test_kernel_with_fed_parameters_runs_the_written_kernels():
    """The fused kernel without constants (or fed other arrays than its constants) is Quantize then
    DequantizeLinear of the given versions: per-tensor values by the formula, per-axis ones too."""
    from onnx_mini.ops.fused import fused_quantize_dequantize
    x = probe_values(0.25, 3, np.uint8)
    s, z = np.array(0.25, np.float32), np.array(3, np.uint8)
    run = fused_quantize_dequantize(q_version=21, dq_version=21)
    np.testing.assert_array_equal(bits(run(x, s, z)), bits(formula(x, 0.25, 3, np.uint8)))
    constant = fused_quantize_dequantize(q_version=21, dq_version=21, _constants={1: s, 2: z})
    s2, z2 = np.array(0.5, np.float32), np.array(10, np.uint8)     # not the constants: the general path
    np.testing.assert_array_equal(bits(constant(x, s2, z2)), bits(formula(x, 0.5, 10, np.uint8)))
    xa = x[:600].reshape(200, 3)
    sa, za = np.array([0.25, 0.5, 2.0], np.float32), np.array([3, 128, 250], np.uint8)
    want = np.stack([formula(xa[:, i], sa[i], int(za[i]), np.uint8) for i in range(3)], axis=1)
    np.testing.assert_array_equal(bits(run(xa, sa, za)), bits(want))
