"""Weight transforms of the quantized kernels made once at prepare (onnxruntime's PrePack).

For each kernel: a model whose weights (and the scales / zero points the transform needs) are
initializers gives, bit for bit, what the same model gives with those inputs fed at run time; the
transform runs at prepare and never again over several runs, while fed weights are transformed on
every run (a new weight gives a new result).
"""
from __future__ import annotations

import numpy as np
import pytest

import onnx_mini
from onnx_mini.errors import KernelError
from onnx_mini.ops.contrib import qlinear as ql
from onnx_mini.ops.contrib import quantized_matmul as qm
from onnx_mini.ops.nn import conv_quantized as cq

from helpers import assert_same, one_node_model, raises_naming_node

MS = "com.microsoft"
F32, U8, I8 = np.float32, np.uint8, np.int8


def f(v):
    return np.array(v, F32)


def pack(values, bits):
    """uint8 values (< 2**bits) along the last axis -> bytes, first value in the lowest bits."""
    per = 8 // bits
    v = values.reshape(values.shape[:-1] + (-1, per)).astype(np.uint32)
    return sum(v[..., j] << (j * bits) for j in range(per)).astype(U8)


def nbits_weights(rng, N, K, bs, bits):
    """Random quantized weights q [N, n_blocks * bs] and the packed B [N, n_blocks, blob]."""
    nb = -(-K // bs)
    q = rng.integers(0, 1 << bits, (N, nb * bs)).astype(U8)
    return q, pack(q, bits).reshape(N, nb, bs * bits // 8)


def counting(monkeypatch, module, name):
    """Replace module.name by a wrapper counting its calls."""
    calls = []
    real = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def runs(inputs, vary):
    """Three input lists: `inputs`, then two with input `vary` (the activation) changed."""
    rng = np.random.default_rng(99)
    out = [list(inputs)]
    for _ in range(2):
        x = inputs[vary]
        # integers shuffled (indices stay in range), floats redrawn
        new = (rng.permutation(x.reshape(-1)).reshape(x.shape) if x.dtype.kind in "iu"
               else rng.standard_normal(x.shape).astype(x.dtype))
        out.append(list(inputs[:vary]) + [new] + list(inputs[vary + 1:]))
    return out


def _cases():
    rng = np.random.default_rng(7)
    cases = []
    # MatMulNBits: packed zero points; float zero points with g_idx and bias
    N, K, bs = 5, 40, 16
    q, b = nbits_weights(rng, N, K, bs, 4)
    sc = (rng.random((N, 3)) + 0.5).astype(F32)
    zp = pack(rng.integers(0, 16, (N, 4)).astype(U8), 4)
    a = rng.standard_normal((2, K)).astype(F32)
    attrs = dict(K=K, N=N, bits=4, block_size=bs)
    cases.append(pytest.param("MatMulNBits", [a, b, sc, zp], {1, 2, 3}, 1, attrs, (qm, "unpack_bits"),
                              id="MatMulNBits"))
    g_idx = rng.integers(0, 3, K).astype(np.int32)
    cases.append(pytest.param("MatMulNBits", [a, b, sc, (rng.random((N, 3)) * 16).astype(F32), g_idx,
                                              rng.standard_normal(N).astype(F32)], {1, 2, 3, 4}, 1, attrs,
                              (qm, "unpack_bits"), id="MatMulNBits-g_idx"))
    # integer products: B - b_zero_point prepared
    a8, b8 = rng.integers(0, 256, (2, 3, 5)).astype(U8), rng.integers(-128, 128, (5, 4)).astype(I8)
    b_s, b_zp = f([0.1, 0.2, 0.3, 0.4]), np.array([0, 3, -2, 7], I8)
    cases.append(pytest.param("MatMulIntegerToFloat", [a8, b8, f(0.05), b_s, np.array(120, U8), b_zp, f([1, 2, 3, 4])],
                              {1, 3, 5}, 1, {}, (qm, "_centered_b"), id="MatMulIntegerToFloat"))
    cases.append(pytest.param("DynamicQuantizeMatMul", [rng.standard_normal((3, 5)).astype(F32), b8, b_s, b_zp],
                              {1, 2, 3}, 1, {}, (qm, "_centered_b"), id="DynamicQuantizeMatMul"))
    cases.append(pytest.param("QGemm", [a8[0], f(0.05), np.array(120, U8), b8.T.copy(), b_s, b_zp,
                                        rng.integers(-500, 500, 4).astype(np.int32), f(0.5), np.array(100, U8)],
                              {3, 4, 5}, 1, dict(alpha=1.5, transB=1), (qm, "_centered_b"), id="QGemm-transB"))
    Hin, nh, hs = 8, 2, 4
    cases.append(pytest.param("QAttention", [rng.integers(0, 256, (2, 3, Hin)).astype(U8),
                                             rng.integers(-128, 128, (Hin, 3 * nh * hs)).astype(I8),
                                             rng.standard_normal(3 * nh * hs).astype(F32), f(0.02),
                                             (rng.random(3 * nh * hs) * 0.02).astype(F32), None, np.array(128, U8),
                                             rng.integers(-3, 3, 3 * nh * hs).astype(I8)],
                              {1, 2, 4, 7}, 1, dict(num_heads=nh, unidirectional=1), (qm, "_centered_b"),
                              id="QAttention"))
    # DynamicQuantizeLSTM: W and R dequantized
    I, H = 4, 3
    w, r = rng.integers(-128, 128, (2, I, 4 * H)).astype(I8), rng.integers(-128, 128, (2, H, 4 * H)).astype(I8)
    cases.append(pytest.param("DynamicQuantizeLSTM", [
        rng.standard_normal((3, 2, I)).astype(F32), w, r, rng.standard_normal((2, 8 * H)).astype(F32), None, None,
        None, None, (rng.random((2, 4 * H)) * 0.02).astype(F32), rng.integers(-3, 3, (2, 4 * H)).astype(I8),
        (rng.random(2) * 0.02).astype(F32), np.array([1, -1], I8)], {1, 2, 8, 9, 10, 11}, 3,
        dict(hidden_size=H, direction="bidirectional"), (qm, "_dequantize_gates"), id="DynamicQuantizeLSTM"))
    # QEmbedLayerNormalization: the five tables dequantized
    V, P, H = 10, 6, 8
    tables = [rng.integers(0, 256, s).astype(U8) for s in ((V, H), (P, H), (2, H), (H,), (H,))]
    cases.append(pytest.param("QEmbedLayerNormalization", [
        rng.integers(0, V, (2, 4)).astype(np.int32), rng.integers(0, 2, (2, 4)).astype(np.int32), *tables,
        np.array([[1, 1, 1, 0], [1, 1, 0, 0]], np.int32), f(0.01), f(0.02), f(0.03), f(0.01), f(0.005),
        *(np.array(z, U8) for z in (128, 120, 100, 3, 130))], set(range(2, 7)) | set(range(8, 18)), 2, {},
        (ql, "dequantize"), id="QEmbedLayerNormalization"))
    # convolutions: w - w_zero_point prepared
    x = rng.integers(0, 256, (1, 3, 5, 6)).astype(U8)
    wc = rng.integers(-60, 60, (4, 3, 3, 3)).astype(I8)
    w_zp = np.array([0, 2, -1, 5], I8)
    conv = dict(pads=[1, 1, 1, 1], kernel_shape=[3, 3])
    qconv = [x, f(0.02), np.array(128, U8), wc, (rng.random(4) * 0.01).astype(F32), w_zp, f(0.05),
             np.array(120, U8), rng.integers(-100, 100, 4).astype(np.int32)]
    cases.append(pytest.param("ConvInteger", [x, wc, np.array(128, U8), w_zp], {1, 3}, 1, dict(conv, _v=("", 10)),
                              (cq, "_shifted_weight"), id="ConvInteger"))
    cases.append(pytest.param("QLinearConv", qconv, {3, 4, 5, 8}, 1, dict(conv, _v=("", 10)),
                              (cq, "_shifted_weight"), id="QLinearConv"))
    cases.append(pytest.param("QLinearConv", [x.transpose(0, 2, 3, 1).copy()] + qconv[1:], {3, 4, 5}, 1,
                              dict(conv, channels_last=1), (cq, "_shifted_weight"), id="QLinearConv-ms-channels-last"))
    return cases


def _prepare(op, inputs, const, n_outputs, attrs):
    attrs = dict(attrs)
    domain, version = attrs.pop("_v", (MS, 1))
    model, fed = one_node_model(op, inputs, const, n_outputs, domain, version, **attrs)
    return onnx_mini.prepare(model), fed


@pytest.mark.parametrize("op,inputs,const,n_outputs,attrs,transform", _cases())
def test_constant_weights_prepared_once(monkeypatch, op, inputs, const, n_outputs, attrs, transform):
    calls = counting(monkeypatch, *transform)
    rep_const, fed_const = _prepare(op, inputs, const, n_outputs, attrs)
    at_prepare = len(calls)
    assert at_prepare > 0                           # the transform ran at prepare
    rep_fed, fed_all = _prepare(op, inputs, set(), n_outputs, attrs)
    assert len(calls) == at_prepare                 # nothing to prepare when every input is fed
    for run_inputs in runs(inputs, 0):
        before = len(calls)
        got = rep_const.run([run_inputs[k] for k in fed_const])
        assert len(calls) == before                 # a run with constant weights transforms nothing
        exp = rep_fed.run([run_inputs[k] for k in fed_all])
        assert len(calls) > before                  # fed weights: transformed on this run
        assert_same(list(got), list(exp))


def test_fed_weight_changes_the_result():
    """Weights fed at run time are transformed on every run: a new weight gives a new result."""
    rng = np.random.default_rng(3)
    x = rng.integers(0, 256, (1, 2, 4, 4)).astype(U8)
    w1, w2 = (rng.integers(-60, 60, (3, 2, 2, 2)).astype(I8) for _ in range(2))
    rep, _ = _prepare("ConvInteger", [x, w1], set(), 1, dict(_v=("", 10)))
    (y1,), (y2,) = rep.run([x, w1]), rep.run([x, w2])
    for w, y in ((w1, y1), (w2, y2)):
        rep_c, _ = _prepare("ConvInteger", [x, w], {1}, 1, dict(_v=("", 10)))
        assert_same(y, rep_c.run([x])[0])
    assert not np.array_equal(y1, y2)


@pytest.mark.parametrize("case", ["weight-fed", "zero-point-fed"])
def test_partly_constant_transformed_per_run(monkeypatch, case):
    """The weight constant but its zero point fed (or the reverse): transformed on every run, same values."""
    calls = counting(monkeypatch, qm, "_centered_b")
    rng = np.random.default_rng(4)
    a8, b8 = rng.integers(0, 256, (3, 5)).astype(U8), rng.integers(-128, 128, (5, 4)).astype(I8)
    inputs = [a8, b8, f(0.05), f([0.1, 0.2, 0.3, 0.4]), np.array(120, U8), np.array([0, 3, -2, 7], I8)]
    rep, fed = _prepare("MatMulIntegerToFloat", inputs, {5} if case == "weight-fed" else {1}, 1, {})
    rep_all, _ = _prepare("MatMulIntegerToFloat", inputs, set(), 1, {})
    for k in range(3):
        before = len(calls)
        got = rep.run([inputs[i] for i in fed])
        assert len(calls) == before + 1
        assert_same(list(got), list(rep_all.run(inputs)))


def test_prepared_weights_are_one_array_across_runs(monkeypatch):
    """Every run gets the same read-only prepared weight w - w_zero_point."""
    seen = []
    real = cq.Convolution.__call__

    def spy(self, x, w, *rest, **kw):      # the weight the convolution receives
        seen.append(w)
        return real(self, x, w, *rest, **kw)
    monkeypatch.setattr(cq.Convolution, "__call__", spy)
    rng = np.random.default_rng(5)
    x = rng.integers(0, 256, (1, 2, 4, 4)).astype(U8)
    w = rng.integers(-60, 60, (3, 2, 2, 2)).astype(I8)
    rep, _ = _prepare("ConvInteger", [x, w, None, np.array(2, I8)], {1, 3}, 1, dict(_v=("", 10)))
    for _ in range(3):
        rep.run([x])
    assert len(seen) == 3 and all(s is seen[0] for s in seen) and not seen[0].flags.writeable


def test_invalid_constant_weight_fails_at_run_time():
    """A constant weight the transform rejects fails when the model runs, as a fed one does."""
    rng = np.random.default_rng(6)
    q, b = nbits_weights(rng, 2, 32, 16, 4)
    a = np.zeros((1, 32), F32)
    rep, fed = _prepare("MatMulNBits", [a, b[:1], np.ones((2, 2), F32)], {1, 2}, 1, dict(K=32, N=2, block_size=16))
    with raises_naming_node(KernelError, "B must be uint8"):
        rep.run([a])
    x = np.zeros((1, 2, 4, 4), U8)
    rep, _ = _prepare("ConvInteger", [x, np.zeros((3, 2, 2, 2), I8), None, np.zeros(2, I8)], {1, 3}, 1,
                      dict(_v=("", 10)))
    with raises_naming_node(KernelError, "w_zero_point"):
        rep.run([x])


@pytest.mark.parametrize("bias", ["constant", "omitted"])
def test_dynamic_quantize_lstm_packs_its_dequantized_weights_once(monkeypatch, bias):
    """DynamicQuantizeLSTM with constant weights hands its LSTM the dequantized W and R as constants: the
    LSTM packs them (gates reordered, transposed) at prepare, not on every run, B constant or omitted;
    results bit for bit those of the same model with every input fed."""
    from onnx_mini.ops.rnn import driver
    calls = counting(monkeypatch, driver, "pack")
    rng = np.random.default_rng(6)
    I, H = 4, 3
    inputs = [rng.standard_normal((3, 2, I)).astype(F32), rng.integers(-128, 128, (2, I, 4 * H)).astype(I8),
              rng.integers(-128, 128, (2, H, 4 * H)).astype(I8), rng.standard_normal((2, 8 * H)).astype(F32),
              None, None, None, None, (rng.random((2, 4 * H)) * 0.02).astype(F32),
              rng.integers(-3, 3, (2, 4 * H)).astype(I8), (rng.random(2) * 0.02).astype(F32), np.array([1, -1], I8)]
    if bias == "omitted":
        inputs[3] = None
    const = {1, 2, 3, 8, 9, 10, 11}
    attrs = dict(hidden_size=H, direction="bidirectional")
    rep, fed = _prepare("DynamicQuantizeLSTM", inputs, const, 3, attrs)
    assert calls                                      # at prepare
    rep_fed, fed_all = _prepare("DynamicQuantizeLSTM", inputs, set(), 3, attrs)
    for run_inputs in runs(inputs, 0):
        before = len(calls)
        got = rep.run([run_inputs[k] for k in fed])
        assert len(calls) == before                   # no run packs the constant weights again
        assert_same(list(got), list(rep_fed.run([run_inputs[k] for k in fed_all])))
        assert len(calls) > before                    # (fed weights: packed on every run)
