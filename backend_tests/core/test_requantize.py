"""optimize/requantize.py: a QDQ model's requantization (QuantizeDequantize, or a LookupTable taking
floats in and out) alone reading a Conv's / ConvNHWC's output runs in place in that Conv's epilogue,
bit for bit the graph as written (optimize=False) on values at the rounding ties, past both bounds,
NaN, infinities and both zeros; and the cases where it must not fire."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnx_mini
from onnx_mini.ops.nn.conv.run import _finish_planes
from onnx_mini.optimize import FUSED_DOMAIN
from helpers import init, model, steps

pytestmark = [pytest.mark.filterwarnings("error::onnx_mini.optimize.OptimizationWarning"),
              pytest.mark.filterwarnings("ignore::RuntimeWarning")]     # the probe's infinities and NaN
F = TensorProto.FLOAT


def qdq(x, y, tag, scale, zp, codes=np.uint8):
    """x -> QuantizeLinear -> DequantizeLinear -> y with constant per-tensor parameters."""
    inits = [init(f"{tag}_s", np.float32(scale)), init(f"{tag}_z", np.array(zp, codes))]
    nodes = [helper.make_node("QuantizeLinear", [x, f"{tag}_s", f"{tag}_z"], [f"{tag}_q"]),
             helper.make_node("DequantizeLinear", [f"{tag}_q", f"{tag}_s", f"{tag}_z"], [y])]
    return nodes, inits


def conv_then(after: str, c=3, scale=0.25, zp=128, codes=np.uint8, extra_outputs=()):
    """x [N, c, H, W] -> Conv 1x1 (W = identity, B = 0: its output is x itself, + 0) -> `after`:
    'qdq' (QuantizeLinear -> DequantizeLinear) or 'lut' (... -> HardSwish -> QuantizeLinear ->
    DequantizeLinear) -> y."""
    w = np.eye(c, dtype=np.float32).reshape(c, c, 1, 1)
    inits = [init("w", w), init("b", np.zeros(c, np.float32))]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["t"], name="conv")]
    if after == "qdq":
        n, i = qdq("t", "y", "a", scale, zp, codes)
        nodes += n
        inits += i
    else:
        n, i = qdq("t", "d", "a", scale, zp, codes)
        n2, i2 = qdq("h", "y", "o", scale * 2, zp, codes)
        nodes += [*n, helper.make_node("HardSwish", ["d"], ["h"]), *n2]
        inits += i + i2
    outs = [("y", F, None)] + [(o, F, None) for o in extra_outputs]
    return model(nodes, [("x", F, None)], outs, inits)


def probe(shape, scale, zp, codes=np.uint8, seed=0):
    """x of `shape` holding the ties of both parities around every code, values past both bounds,
    NaN, +-inf, +-0, tiny values and random ones (repeated / cut to fill the shape)."""
    info = np.iinfo(codes)
    k = np.arange(info.min - zp - 3, info.max - zp + 4, dtype=np.float64)
    ties = np.concatenate([k + 0.5, k - 0.5, k, k + 0.25, k - 0.75]) * scale
    special = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, -1e-30, 1e30, -1e30, 3e38, -3e38]
    rng = np.random.default_rng(seed)
    values = np.concatenate([ties, special, rng.standard_normal(2000) * 100 * scale])
    size = int(np.prod(shape))
    return np.resize(rng.permutation(values), size).reshape(shape).astype(np.float32)


def bits(a):
    return np.ascontiguousarray(a).view(np.uint32)


def same_bits(m, feeds):
    opt, raw = onnx_mini.prepare(m), onnx_mini.prepare(m, optimize=False)
    got, ref = opt.run(feeds), raw.run(feeds)
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype and g.shape == r.shape
        np.testing.assert_array_equal(bits(g), bits(r))
    return opt, got


@pytest.mark.parametrize("after", ["qdq", "lut"])
@pytest.mark.parametrize("shape", [(1, 3, 37, 41), (2, 3, 30, 30)])
def test_conv_requantized_in_its_epilogue_bit_for_bit(after, shape):
    m = conv_then(after)
    opt, _ = same_bits(m, {"x": probe(shape, 0.25, 128)})
    assert steps(opt) == [(FUSED_DOMAIN, "Conv")]
    (info,) = opt.plan.infos
    assert info.fused_from[0] == "conv"


@pytest.mark.parametrize("after", ["qdq", "lut"])
def test_strided_conv_requantized_by_runs_of_channel_planes(monkeypatch, after):
    # a one-image im2col (3x3 /2: its columns from the stride phases) requantizes plane by plane
    # (thresholds.FINISH_BLOCK_BYTES 1): the graph's bits still
    from onnx_mini.ops.nn.conv import run, thresholds
    monkeypatch.setattr(thresholds, "FINISH_BLOCK_BYTES", 1)
    blocked = []
    monkeypatch.setattr(run, "_finish_planes", lambda *a: blocked.append(1) or _finish_planes(*a))
    m = conv_then(after)
    m.graph.initializer[0].CopyFrom(init("w", np.random.default_rng(3).standard_normal((3, 3, 3, 3)).astype(np.float32)))
    for k, v in (("kernel_shape", [3, 3]), ("strides", [2, 2]), ("pads", [1, 1, 1, 1])):
        m.graph.node[0].attribute.append(helper.make_attribute(k, v))
    del m.graph.node[0].input[2]         # no B: im2col's plain columns (a B would be summed by the product)
    opt, _ = same_bits(m, {"x": probe((1, 3, 37, 41), 0.25, 128)})
    assert steps(opt) == [(FUSED_DOMAIN, "Conv")] and blocked


def test_values_by_hand():
    # identity Conv, scale 0.5, zero point 128: x / 0.5 rounded half to even, kept within [-128, 127]
    m = conv_then("qdq", c=1, scale=0.5, zp=128)
    x = np.array([0.25, 0.75, -0.25, -0.75, 1.3, 100.0, -100.0, np.nan, -0.1], np.float32).reshape(1, 1, 1, 9)
    opt = onnx_mini.prepare(m)
    assert steps(opt) == [(FUSED_DOMAIN, "Conv")]
    y = opt.run({"x": x})[0]
    want = np.array([0.0, 1.0, 0.0, -1.0, 1.5, 63.5, -64.0, 0.0, 0.0], np.float32).reshape(1, 1, 1, 9)
    np.testing.assert_array_equal(bits(y), bits(want))


def test_int8_codes():
    m = conv_then("lut", scale=0.125, zp=-7, codes=np.int8)
    opt, _ = same_bits(m, {"x": probe((1, 3, 20, 20), 0.125, -7, np.int8)})
    assert steps(opt) == [(FUSED_DOMAIN, "Conv")]


def test_not_fused_when_the_conv_output_is_read_elsewhere():
    m = conv_then("qdq", extra_outputs=("t",))
    opt, (y, t) = same_bits(m, {"x": probe((1, 3, 8, 8), 0.25, 128)})
    assert (FUSED_DOMAIN, "QuantizeDequantize") in steps(opt)
    assert not np.array_equal(bits(t), bits(y))     # the Conv's own output, not requantized


def test_other_input_types_run_the_steps_apart():
    # float64 X (its W fed as float64): the fused Conv's requantization runs as its own kernel
    c = 2
    inits = [init("a_s", np.float32(0.25)), init("a_z", np.array(128, np.uint8))]
    nodes = [helper.make_node("Conv", ["x", "w"], ["t"]),
             helper.make_node("Cast", ["t"], ["t32"], to=F),
             helper.make_node("QuantizeLinear", ["t32", "a_s", "a_z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "a_s", "a_z"], ["y"])]
    m = model(nodes, [("x", TensorProto.DOUBLE, None), ("w", TensorProto.DOUBLE, None)], [("y", F, None)], inits)
    x = probe((1, c, 6, 6), 0.25, 128).astype(np.float64)
    same_bits(m, {"x": x, "w": np.eye(c).reshape(c, c, 1, 1)})


def _channels_last_block(c=8, n_dw=2):
    """1x1 Conv -> QDQ -> (depthwise 3x3 Conv -> QDQ -> HardSwish LUT) x n_dw -> 1x1 Conv -> QDQ: a
    region channels_last.py runs channels-last, every requantization after a Conv."""
    rng = np.random.default_rng(1)
    inits, nodes = [], []

    def conv(x, y, w, group=1, pads=(0, 0, 0, 0)):
        k = len(inits)
        inits.extend([init(f"w{k}", w.astype(np.float32)), init(f"b{k}", rng.standard_normal(w.shape[0]).astype(np.float32))])
        nodes.append(helper.make_node("Conv", [x, f"w{k}", f"b{k}"], [y], group=group, pads=list(pads)))

    conv("x", "c0", rng.standard_normal((c, c, 1, 1)))
    n, i = qdq("c0", "d0", "q0", 0.05, 128)
    nodes += n
    inits += i
    x = "d0"
    for k in range(n_dw):
        conv(x, f"dw{k}", rng.standard_normal((c, 1, 3, 3)), group=c, pads=(1, 1, 1, 1))
        n, i = qdq(f"dw{k}", f"e{k}", f"r{k}", 0.05, 100)
        n2, i2 = qdq(f"h{k}", f"g{k}", f"s{k}", 0.04, 120)
        nodes += [*n, helper.make_node("HardSwish", [f"e{k}"], [f"h{k}"]), *n2]
        inits += i + i2
        x = f"g{k}"
    conv(x, "c1", rng.standard_normal((c, c, 1, 1)))
    n, i = qdq("c1", "y", "q1", 0.05, 128)
    return model(nodes + n, [("x", F, None)], [("y", F, None)], inits + i)


@pytest.mark.parametrize("shape", [(1, 8, 40, 40), (2, 8, 17, 23)])
def test_channels_last_region_requantized_per_part(shape):
    m = _channels_last_block()
    x = probe(shape, 0.05, 128)
    opt, _ = same_bits(m, {"x": x})
    ops = steps(opt)
    assert (FUSED_DOMAIN, "ConvNHWC") in ops
    assert not {(FUSED_DOMAIN, "QuantizeDequantize"), (FUSED_DOMAIN, "LookupTable")} & set(ops)
    fused = [i for i in opt.plan.infos if i.op_type in ("Conv", "ConvNHWC")]
    assert len(fused) == 4 and all(len(i.inputs) > 4 for i in fused)
    # the random part alone: the depthwise parts' own values, NaN-free
    same_bits(m, {"x": np.random.default_rng(3).standard_normal(shape).astype(np.float32) * 5})


@pytest.mark.parametrize("blas_threads", ["native", "split"])
def test_both_blas_modes(monkeypatch, blas_threads):
    monkeypatch.setenv("ONNX_MINI_BLAS_THREADS", blas_threads)
    same_bits(_channels_last_block(c=16, n_dw=1), {"x": probe((1, 16, 56, 56), 0.05, 128)})


@pytest.mark.parametrize("n,rn", [(1, 1), (2, 2), (2, 1)])
def test_conv_with_residual_and_activation_then_requantized(n, rn):
    # Conv -> Add(r) -> Relu -> QDQ: one fused Conv with Z, the activation and the step (r broadcasts
    # along the images when rn = 1)
    c = 4
    rng = np.random.default_rng(2)
    inits = [init("w", rng.standard_normal((c, c, 3, 3)).astype(np.float32)),
             init("b", rng.standard_normal(c).astype(np.float32))]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["t"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["t", "r"], ["u"]),
             helper.make_node("Relu", ["u"], ["v"])]
    q, i = qdq("v", "y", "a", 0.1, 3)
    m = model(nodes + q, [("x", F, None), ("r", F, None)], [("y", F, None)], inits + i)
    feeds = {"x": probe((n, c, 9, 7), 0.1, 3, seed=4), "r": probe((rn, c, 9, 7), 0.1, 3, seed=5)}
    opt, _ = same_bits(m, feeds)
    assert steps(opt) == [(FUSED_DOMAIN, "Conv")]
    (info,) = opt.plan.infos
    assert info.inputs[3] == "r" and len(info.inputs) == 6


def test_kernel_given_other_parameters_runs_the_step_apart():
    # the fused kernel's own paths: the constants it was made with (the step in the epilogue), equal
    # parameters in other arrays (the step's kernel after the Conv), float64 X (the written kernels)
    from onnx_mini.ops.fused import fused_conv, fused_quantize_dequantize
    c = 3
    w = np.random.default_rng(6).standard_normal((c, c, 1, 1)).astype(np.float32)
    s, z = np.array(0.05, np.float32), np.array(128, np.uint8)
    run = fused_conv(requantize="QuantizeDequantize", q_version=21, dq_version=21, _constants={1: w, 4: s, 5: z})
    step = fused_quantize_dequantize(q_version=21, dq_version=21, _constants={1: s, 2: z})
    plain = fused_conv(_constants={1: w})
    x = probe((2, c, 5, 6), 0.05, 128)
    want = step(plain(x, w), s, z)
    for got in (run(x, w, None, None, s, z), run(x, w, None, None, s.copy(), z.copy())):
        np.testing.assert_array_equal(bits(got), bits(want))
    # float64: the written kernels' answer, whatever it is (a value or the same error)
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    outcome = []
    for f in (lambda: step(plain(x64, w64), s, z), lambda: run(x64, w64, None, None, s, z)):
        try:
            outcome.append(bits(f().astype(np.float32)).tolist())
        except Exception as e:
            outcome.append((type(e), str(e)))
    assert outcome[0] == outcome[1]
