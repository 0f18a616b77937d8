"""com.microsoft quantized operators: MatMulNBits, GatherBlockQuantized, MatMulIntegerToFloat,
DynamicQuantizeMatMul, QGemm, DynamicQuantizeLSTM, the QLinear element-wise/pool/concat ops and the
contrib QuantizeLinear/DequantizeLinear.

Expected values come from the formulas of onnxruntime's ContribOperators documentation, written here
in numpy (weights packed and dequantized with plain loops in the test). onnxruntime, when installed,
is a second opinion on the end-to-end models (skipped cleanly otherwise).
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_mini
from onnx_mini.errors import InvalidNodeError, KernelError
from onnx_mini.ops.contrib import quantized_matmul as qm

from helpers import NODE, assert_same, raises_naming_node, run_node

MS = "com.microsoft"
F32, U8, I8 = np.float32, np.uint8, np.int8


def ms(op, inputs, n_outputs=1, **attrs):
    return run_node(op, 1, inputs, n_outputs, domain=MS, **attrs)


def f(v):
    return np.array(v, np.float32)


def rint_clip(y, dtype):
    """round half to even, saturate to dtype (the documented quantization)."""
    info = np.iinfo(dtype)
    return np.clip(np.rint(y), info.min, info.max).astype(dtype)


# -- packing written from the documentation ---------------------------------------------------------

def pack(values, bits):
    """uint8 values (< 2**bits) along the last axis -> bytes, first value in the lowest bits."""
    per = 8 // bits
    v = values.reshape(values.shape[:-1] + (-1, per)).astype(np.uint32)
    out = np.zeros(v.shape[:-1], np.uint32)
    for j in range(per):
        out |= v[..., j] << (j * bits)
    return out.astype(U8)


def nbits_weights(rng, N, K, bs, bits):
    """Random quantized weights q [N, n_blocks * bs] and the packed B [N, n_blocks, blob]."""
    nb = -(-K // bs)
    q = rng.integers(0, 1 << bits, (N, nb * bs)).astype(U8)
    return q, pack(q, bits).reshape(N, nb, bs * bits // 8)


def nbits_reference(a, q, scales, zp, K, bs, bias=None, g_idx=None):
    """W[n, k] = (q[n, k] - zp[n, blk(k)]) * scale[n, blk(k)] with a plain loop; Y = A @ W^T (+ bias)."""
    N = q.shape[0]
    w = np.zeros((N, K))
    for n in range(N):
        for k in range(K):
            blk = k // bs if g_idx is None else g_idx[k]
            w[n, k] = (float(q[n, k]) - float(zp[n, blk])) * float(scales[n, blk])
    y = a.astype(np.float64) @ w.T
    return y if bias is None else y + bias


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("K", [32, 40])
@pytest.mark.parametrize("zp_kind", ["none", "packed", "float"])
def test_matmul_nbits(bits, K, zp_kind):
    rng = np.random.default_rng(bits * K)
    N, bs = 5, 16
    nb = -(-K // bs)
    q, b = nbits_weights(rng, N, K, bs, bits)
    scales = (rng.random((N, nb)) + 0.5).astype(F32)
    a = rng.standard_normal((2, 3, K)).astype(F32)
    if zp_kind == "none":
        zp_in, zp = None, np.full((N, nb), 1 << (bits - 1))
    elif zp_kind == "packed":
        zp = rng.integers(0, 1 << bits, (N, nb)).astype(U8)
        per = 8 // bits
        zp_in = pack(np.pad(zp, ((0, 0), (0, -nb % per))), bits)       # [N, ceil(nb * bits / 8)]
    else:
        zp = zp_in = (rng.random((N, nb)) * (1 << bits)).astype(F32)
    y = ms("MatMulNBits", [a, b, scales, zp_in], K=K, N=N, bits=bits, block_size=bs)
    assert y.dtype == F32 and y.shape == (2, 3, N)
    np.testing.assert_allclose(y, nbits_reference(a, q, scales, zp, K, bs), rtol=1e-5, atol=1e-4)
    # blocks in K's order given as g_idx take the gathered path: the same float32 operations, the same bits
    g_idx = (np.arange(K) // bs).astype(np.int32)
    np.testing.assert_array_equal(ms("MatMulNBits", [a, b, scales, zp_in, g_idx], K=K, N=N, bits=bits,
                                     block_size=bs), y)


@pytest.mark.parametrize("K, N", [(16, 40), (64, 5)])     # W^T kept as K rows of N, and as N rows of K
@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("constant", [True, False])
def test_matmul_nbits_either_weight_layout(monkeypatch, K, N, rows, constant):
    from onnx_mini import blas
    monkeypatch.setattr(blas, "LAYOUT_MIN_BYTES", 0)        # these small matrices laid out too
    assert blas.reads_as_rows(K, N) == (N <= 2 * K)
    rng = np.random.default_rng(K * N + rows)
    bs = 16
    nb = K // bs
    q, b = nbits_weights(rng, N, K, bs, 4)
    scales = (rng.random((N, nb)) + 0.5).astype(F32)
    zp = rng.integers(0, 16, (N, nb)).astype(F32)
    a = rng.standard_normal((rows, K)).astype(F32)
    exp = nbits_reference(a, q, scales, zp, K, bs)
    if constant:        # B, scales and zero points as initializers: dequantized once, at prepare
        y = onnx_mini.prepare(nbits_model(b, scales, K, N, bs, zero_points=zp)).run([a])[0]
    else:
        y = ms("MatMulNBits", [a, b, scales, zp], K=K, N=N, bits=4, block_size=bs)
    np.testing.assert_allclose(y, exp, rtol=1e-5, atol=1e-4)
    g_idx = rng.integers(0, nb, K).astype(np.int32)        # the gathered path, either layout too
    np.testing.assert_allclose(ms("MatMulNBits", [a, b, scales, zp, g_idx], K=K, N=N, bits=4, block_size=bs),
                               nbits_reference(a, q, scales, zp, K, bs, g_idx=g_idx), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_matmul_nbits_low_precision_bias_and_g_idx(dtype):
    rng = np.random.default_rng(7)
    N, K, bs = 4, 32, 16
    q, b = nbits_weights(rng, N, K, bs, 4)
    scales = (rng.random((N, 2)) + 0.5).astype(dtype)
    a = rng.standard_normal((3, K)).astype(dtype)
    bias = rng.standard_normal(N).astype(dtype)
    g_idx = rng.integers(0, 2, K).astype(np.int32)
    y = ms("MatMulNBits", [a, b, scales, None, g_idx, bias], K=K, N=N, block_size=bs)
    assert y.dtype == np.dtype(dtype) and y.shape == (3, N)
    exp = nbits_reference(a.astype(F32), q, scales.astype(F32), np.full((N, 2), 8), K, bs, bias.astype(F32), g_idx)
    np.testing.assert_allclose(y.astype(F32), exp, rtol=2e-2, atol=0.25)


def nbits_model(b, scales, K, N, bs, n_runs_input=False, zero_points=None):
    names = ["A", "B", "scales"] + ([] if zero_points is None else ["zero_points"])
    node = helper.make_node("MatMulNBits", names, ["Y"], domain=MS, name=NODE, K=K, N=N, bits=4, block_size=bs)
    inits = [numpy_helper.from_array(scales, "scales")]
    if zero_points is not None:
        inits.append(numpy_helper.from_array(zero_points, "zero_points"))
    inputs = [helper.make_tensor_value_info("A", TensorProto.FLOAT, None)]
    if n_runs_input:
        inputs.append(helper.make_tensor_value_info("B", TensorProto.UINT8, None))
    else:
        inits.append(numpy_helper.from_array(b, "B"))
    g = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)],
                             ir_version=10)


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_codes_unpacked_low_bits_first(bits):
    # byte 0b11100100 holds, low bits first: 2-bit codes 0, 1, 2, 3; 4-bit codes 4, 14; an 8-bit code 228
    byte = np.uint8(0b11100100)
    first = {2: [0, 1, 2, 3], 4: [4, 14], 8: [228]}[bits]
    np.testing.assert_array_equal(qm.unpack_bits(np.array([[byte]]), bits), [first])
    np.testing.assert_array_equal(qm.unpack_bits(np.array([[byte, 0], [0, byte]], np.uint8), bits),
                                  [first + [0] * len(first), [0] * len(first) + first])    # each byte in turn


def test_matmul_nbits_dequantizes_initializers_once(monkeypatch):
    from onnx_mini.ops.contrib import quantized_matmul as qm
    calls = []
    real = qm.unpack_bits               # the weights' codes, unpacked once per dequantization
    monkeypatch.setattr(qm, "unpack_bits", lambda *a: calls.append(1) or real(*a))
    rng = np.random.default_rng(3)
    N, K, bs = 3, 32, 16
    q, b = nbits_weights(rng, N, K, bs, 4)
    scales = (rng.random((N, 2)) + 0.5).astype(F32)
    rep = onnx_mini.prepare(nbits_model(b, scales, K, N, bs))
    exp_w = nbits_reference(np.eye(K, dtype=F32), q, scales, np.full((N, 2), 8), K, bs)
    for _ in range(3):
        a = rng.standard_normal((2, K)).astype(F32)
        (y,) = rep.run([a])
        np.testing.assert_allclose(y, a @ exp_w, rtol=1e-5, atol=1e-4)
    assert len(calls) == 1
    # B fed by the caller: dequantized on every run (a new B gives a new result)
    rep = onnx_mini.prepare(nbits_model(b, scales, K, N, bs, n_runs_input=True))
    a = np.ones((1, K), F32)
    q2, b2 = nbits_weights(rng, N, K, bs, 4)
    (y1,) = rep.run([a, b])
    (y2,) = rep.run([a, b2])
    np.testing.assert_allclose(y1, nbits_reference(a, q, scales, np.full((N, 2), 8), K, bs), rtol=1e-5)
    np.testing.assert_allclose(y2, nbits_reference(a, q2, scales, np.full((N, 2), 8), K, bs), rtol=1e-5)


def test_matmul_nbits_errors():
    a, b, s = np.zeros((1, 32), F32), np.zeros((2, 2, 8), U8), np.ones((2, 2), F32)
    with raises_naming_node(InvalidNodeError, "bits"):
        ms("MatMulNBits", [a, b, s], K=32, N=2, bits=3, block_size=16)
    with raises_naming_node(InvalidNodeError, "block_size"):
        ms("MatMulNBits", [a, b, s], K=32, N=2, block_size=24)
    with raises_naming_node(KernelError, "B must be uint8"):
        ms("MatMulNBits", [a, b[:1], s], K=32, N=2, block_size=16)
    with raises_naming_node(KernelError, "end with K"):
        ms("MatMulNBits", [a[:, :16], b, s], K=32, N=2, block_size=16)


# -- GatherBlockQuantized ---------------------------------------------------------------------------

def gbq_reference(table, idx, scales, zp, bs, gather_axis, quantize_axis):
    """Plain loops: dequantize the whole (logical) table, then Gather; out-of-range index -> zeros."""
    deq = np.zeros(table.shape)
    for pos in np.ndindex(*table.shape):
        spos = tuple(p // bs if i == quantize_axis else (0 if scales.shape[i] == 1 else p) for i, p in enumerate(pos))
        deq[pos] = (float(table[pos]) - float(zp[spos])) * float(scales[spos])
    s = table.shape[gather_axis]
    out = []
    for i in idx.reshape(-1):
        ok = -s <= i < s
        sl = np.take(deq, int(i) % s if ok else 0, axis=gather_axis)
        out.append(sl if ok else np.zeros_like(sl))
    out = np.stack(out, axis=gather_axis)
    return out.reshape(table.shape[:gather_axis] + idx.shape + table.shape[gather_axis + 1:])


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("with_zp", [False, True])
def test_gather_block_quantized_uint8(bits, with_zp):
    rng = np.random.default_rng(bits)
    V, H, bs = 6, 32, 16
    q = rng.integers(0, 1 << bits, (V, H)).astype(U8)
    scales = (rng.random((V, H // bs)) + 0.5).astype(F32)
    zp = rng.integers(0, 1 << bits, (V, H // bs)).astype(U8) if with_zp else np.full((V, 2), 1 << (bits - 1))
    zp_in = None if not with_zp else zp if bits == 8 else pack(np.pad(zp, ((0, 0), (0, -2 % (8 // bits)))), bits)
    idx = np.array([[0, 5], [-1, 6], [-7, 2]], np.int64)          # 6 and -7 are out of range: zeros
    data = q if bits == 8 else pack(q, bits)
    y = ms("GatherBlockQuantized", [data, idx, scales, zp_in], bits=bits, block_size=bs, quantize_axis=1)
    np.testing.assert_allclose(y, gbq_reference(q, idx, scales, zp, bs, 0, 1), rtol=1e-6)
    assert y.dtype == F32 and not y[1, 1].any() and not y[2, 0].any()


@pytest.mark.parametrize("dtype,zero", [(ml_dtypes.int4, 0), (ml_dtypes.uint4, 0)])
@pytest.mark.parametrize("gather_axis,quantize_axis", [(0, 1), (1, 0), (0, 0), (-1, -1)])
def test_gather_block_quantized_int4(dtype, zero, gather_axis, quantize_axis):
    rng = np.random.default_rng(1)
    lo, hi = (-8, 8) if dtype == ml_dtypes.int4 else (0, 16)
    table = rng.integers(lo, hi, (32, 16)).astype(dtype)
    sshape = [32, 16]
    sshape[quantize_axis] //= 16
    scales = (rng.random(sshape) + 0.5).astype(np.float16)
    zp = rng.integers(lo, hi, sshape).astype(dtype)
    idx = np.array([3, -2, 0], np.int32)
    y = ms("GatherBlockQuantized", [table, idx, scales, zp], block_size=16, gather_axis=gather_axis,
           quantize_axis=quantize_axis)
    exp = gbq_reference(table.astype(np.int64), idx, scales, zp.astype(np.int64), 16, gather_axis % 2,
                        quantize_axis % 2)
    assert y.dtype == np.float16
    np.testing.assert_allclose(y.astype(F32), exp, rtol=1e-3)
    y0 = ms("GatherBlockQuantized", [table, idx, scales], block_size=16, gather_axis=gather_axis,
            quantize_axis=quantize_axis)   # default zero point 0 for int4/uint4
    exp0 = gbq_reference(table.astype(np.int64), idx, scales, np.zeros(sshape) + zero, 16, gather_axis % 2,
                         quantize_axis % 2)
    np.testing.assert_allclose(y0.astype(F32), exp0, rtol=1e-3)


def test_gather_block_quantized_float8_whole_axis_block():
    table = np.array([[0.5, -1, 2, 4], [1.5, 3, -6, 0.25]]).astype(ml_dtypes.float8_e4m3fn)
    scales = f([[2.0], [0.5]])
    y = ms("GatherBlockQuantized", [table, np.array([1, 0, 1]), scales], block_size=0, quantize_axis=1)
    assert_same(y, f([[0.75, 1.5, -3, 0.125], [1, -2, 4, 8], [0.75, 1.5, -3, 0.125]]))
    y = ms("GatherBlockQuantized", [table, np.array([1]), f([[3.0]])], block_size=0, quantize_axis=1)
    assert_same(y, f([[4.5, 9, -18, 0.75]]))       # one scale broadcast over every row


def test_gather_block_quantized_errors():
    data, scales = np.zeros((4, 8), U8), np.ones((4, 1), F32)
    with raises_naming_node(KernelError, "gathered on axis 0"):
        ms("GatherBlockQuantized", [data, np.array([0]), scales], block_size=16, gather_axis=1)
    with raises_naming_node(KernelError, "scales of shape"):
        ms("GatherBlockQuantized", [data, np.array([0]), np.ones((4, 2), F32)], block_size=16)
    with raises_naming_node(InvalidNodeError, "block_size"):
        ms("GatherBlockQuantized", [data, np.array([0]), scales], block_size=10)
    with raises_naming_node(KernelError, "block_size=0"):
        ms("GatherBlockQuantized", [data, np.array([0]), scales], block_size=0)


# -- MatMulIntegerToFloat, DynamicQuantizeMatMul, QGemm ---------------------------------------------

@pytest.mark.parametrize("ta,tb", [(U8, I8), (I8, U8), (U8, U8), (I8, I8)])
def test_matmul_integer_to_float(ta, tb):
    rng = np.random.default_rng(5)
    ia, ib = np.iinfo(ta), np.iinfo(tb)
    a = rng.integers(ia.min, ia.max + 1, (2, 3, 4)).astype(ta)
    b = rng.integers(ib.min, ib.max + 1, (4, 5)).astype(tb)
    a_zp, b_zp = np.array(ia.min + 100, ta), rng.integers(ib.min, ib.max + 1, 5).astype(tb)
    a_s, b_s, bias = f(0.02), f([0.1, 0.2, 0.3, 0.4, 0.5]), f([1, 2, 3, 4, 5])
    y = ms("MatMulIntegerToFloat", [a, b, a_s, b_s, a_zp, b_zp, bias])
    exp = (a.astype(np.int64) - int(a_zp)) @ (b.astype(np.int64) - b_zp.astype(np.int64)) * (0.02 * b_s) + bias
    assert y.dtype == F32
    np.testing.assert_allclose(y, exp, rtol=1e-5)
    y16 = ms("MatMulIntegerToFloat", [a, b, a_s.astype(np.float16), b_s.astype(np.float16)])
    exp16 = a.astype(np.int64) @ b.astype(np.int64) * (F32(np.float16(0.02)) * b_s.astype(np.float16).astype(F32))
    assert y16.dtype == np.float16
    np.testing.assert_allclose(y16.astype(F32), exp16, rtol=2e-3)


def test_dynamic_quantize_matmul():
    rng = np.random.default_rng(6)
    a = rng.standard_normal((3, 4)).astype(F32)
    b = rng.integers(-128, 128, (4, 2)).astype(I8)
    b_s, b_zp, bias = f([0.1, 0.05]), np.array([1, -2], I8), f([0.5, -0.5])
    y = ms("DynamicQuantizeMatMul", [a, b, b_s, b_zp, bias])
    # A quantized like DynamicQuantizeLinear: uint8 over [min(0, a), max(0, a)]
    lo, hi = min(0.0, float(a.min())), max(0.0, float(a.max()))
    scale = F32((hi - lo) / 255)
    zp = rint_clip(-lo / scale, U8)
    aq = rint_clip(a / scale + int(zp), U8)
    exp = (aq.astype(np.int64) - int(zp)) @ (b.astype(np.int64) - b_zp) * (scale * b_s) + bias
    np.testing.assert_allclose(y, exp, rtol=1e-5, atol=1e-6)
    with raises_naming_node(KernelError, "must be float"):
        ms("DynamicQuantizeMatMul", [a.astype(np.float16), b, b_s])


@pytest.mark.parametrize("trans_a,trans_b", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("quantized_out", [False, True])
def test_qgemm(trans_a, trans_b, quantized_out):
    rng = np.random.default_rng(8)
    a = rng.integers(0, 256, (3, 4)).astype(U8)
    b = rng.integers(-128, 128, (4, 5)).astype(I8)
    c = rng.integers(-500, 500, (5,)).astype(np.int32)
    a_s, a_zp, b_s, b_zp = f(0.05), np.array(120, U8), f(np.linspace(0.1, 0.5, 5)), np.arange(5).astype(I8)
    alpha = 1.5
    inputs = [a.T.copy() if trans_a else a, a_s, a_zp, b.T.copy() if trans_b else b, b_s, b_zp, c]
    acc = (a.astype(np.int64) - 120) @ (b.astype(np.int64) - np.arange(5)) + c
    real = alpha * acc * (0.05 * b_s.astype(np.float64))
    if quantized_out:
        y = ms("QGemm", inputs + [f(0.25), np.array(-3, I8)], alpha=alpha, transA=trans_a, transB=trans_b)
        exp = rint_clip(real / 0.25 - 3, I8)
        assert y.dtype == I8 and np.abs(y.astype(int) - exp).max() <= 1
        assert (y == exp).mean() > 0.9
    else:
        y = ms("QGemm", inputs, alpha=alpha, transA=trans_a, transB=trans_b)
        assert y.dtype == F32
        np.testing.assert_allclose(y, real, rtol=1e-5)


# -- DynamicQuantizeLSTM ----------------------------------------------------------------------------

def lstm_reference(x, w, r, b, h0, c0):
    """One forward direction, gates iofc; w [I, 4H], r [H, 4H] (the contrib layout), b [8H]."""
    H = r.shape[0]
    sig = lambda v: 1 / (1 + np.exp(-v))
    h, c, ys = h0, c0, []
    for t in range(x.shape[0]):
        g = x[t] @ w + h @ r + b[:4 * H] + b[4 * H:]
        i, o, fg, cc = sig(g[:, :H]), sig(g[:, H:2 * H]), sig(g[:, 2 * H:3 * H]), np.tanh(g[:, 3 * H:])
        c = fg * c + i * cc
        h = o * np.tanh(c)
        ys.append(h)
    return np.stack(ys)[:, None], h[None], c[None]


@pytest.mark.parametrize("per_channel", [False, True])
def test_dynamic_quantize_lstm(per_channel):
    rng = np.random.default_rng(9)
    T, B, I, H = 3, 2, 4, 3
    x = rng.standard_normal((T, B, I)).astype(F32)
    w = rng.integers(-128, 128, (1, I, 4 * H)).astype(I8)
    r = rng.integers(-128, 128, (1, H, 4 * H)).astype(I8)
    bias = rng.standard_normal((1, 8 * H)).astype(F32)
    shape = (1, 4 * H) if per_channel else (1,)
    w_s, r_s = (rng.random(shape) * 0.02).astype(F32), (rng.random(shape) * 0.02).astype(F32)
    w_zp, r_zp = rng.integers(-3, 3, shape).astype(I8), rng.integers(-3, 3, shape).astype(I8)
    h0 = rng.standard_normal((1, B, H)).astype(F32)
    y, yh, yc = ms("DynamicQuantizeLSTM", [x, w, r, bias, None, h0, None, None, w_s, w_zp, r_s, r_zp], 3,
                   hidden_size=H)
    wf = (w[0].astype(np.float64) - w_zp.reshape(1, -1)) * w_s.reshape(1, -1)
    rf = (r[0].astype(np.float64) - r_zp.reshape(1, -1)) * r_s.reshape(1, -1)
    ey, eh, ec = lstm_reference(x.astype(np.float64), wf, rf, bias[0], h0[0], np.zeros((B, H)))
    for got, exp in ((y, ey), (yh, eh), (yc, ec)):
        assert got.dtype == F32
        np.testing.assert_allclose(got, exp, rtol=1e-4, atol=1e-5)
    with raises_naming_node(KernelError, "R_scale"):
        ms("DynamicQuantizeLSTM", [x, w, r, bias, None, h0, None, None, w_s, w_zp, r_s[:0], r_zp], 3, hidden_size=H)


# -- QLinear element-wise, concat, pools ------------------------------------------------------------

TYPES8 = [pytest.param(U8, id="uint8"), pytest.param(I8, id="int8")]


def q8(rng, dtype, shape):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape).astype(dtype)


@pytest.mark.parametrize("dtype", TYPES8)
@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
def test_qlinear_binary(dtype, op):
    rng = np.random.default_rng(10)
    a, b = q8(rng, dtype, (2, 3, 4)), q8(rng, dtype, (3, 1))
    za, zb, zc = (np.array(v, dtype) for v in (5, -3 if dtype == I8 else 200, 10))
    sa, sb, sc = 0.03, 0.07, (0.11 if op == "QLinearAdd" else 2.0)
    y = ms(op, [a, f(sa), za, b, f(sb), zb, f(sc), zc])
    fa = (a.astype(np.float64) - int(za)) * F32(sa)
    fb = (b.astype(np.float64) - int(zb)) * F32(sb)
    real = fa + fb if op == "QLinearAdd" else fa * fb
    exp = rint_clip(real / F32(sc) + int(zc), dtype)
    assert y.dtype == dtype and y.shape == (2, 3, 4)
    assert np.abs(y.astype(int) - exp).max() <= 1 and (y == exp).mean() > 0.95
    # omitted zero points are 0
    y0 = ms(op, [a, f(sa), None, b, f(sb), None, f(sc)])
    fa, fb = a.astype(np.float64) * F32(sa), b.astype(np.float64) * F32(sb)
    exp0 = rint_clip((fa + fb if op == "QLinearAdd" else fa * fb) / F32(sc), dtype)
    assert np.abs(y0.astype(int) - exp0).max() <= 1


def test_qlinear_add_exact_values_round_half_to_even():
    # (1 * 1 + 2 * 0.25) / 1 = 1.5 -> 2;  (1 * 1 + 2 * 0.75) = 2.5 -> 2;  saturation at 255 and 0
    a, b = np.array([1, 1, 200, 0], U8), np.array([2, 6, 250, 0], U8)
    y = ms("QLinearAdd", [a, f(1), np.array(0, U8), b, f(0.25), np.array(0, U8), f(1), np.array(0, U8)])
    assert_same(y, np.array([2, 2, 255, 0], U8))
    y = ms("QLinearMul", [np.array([-3, 5], I8), f(1), np.array(0, I8), np.array([50, 50], I8), f(1),
                          np.array(0, I8), f(1), np.array(0, I8)])
    assert_same(y, np.array([-128, 127], I8))


@pytest.mark.parametrize("dtype", TYPES8)
def test_qlinear_sigmoid_and_leaky_relu(dtype):
    info = np.iinfo(dtype)
    x = np.arange(info.min, info.max + 1).astype(dtype).reshape(16, 16)
    zx, zy = np.array(3, dtype), np.array(info.min + 10, dtype)
    real = (x.astype(F32) - 3) * F32(0.05)          # the documented float32 computation
    y = ms("QLinearSigmoid", [x, f(0.05), zx, f(1 / 256), zy])
    exp = rint_clip(F32(1) / (F32(1) + np.exp(-real)) / F32(1 / 256) + int(zy), dtype)
    assert y.dtype == dtype and np.abs(y.astype(int) - exp).max() <= 1 and (y == exp).mean() > 0.95
    y = ms("QLinearLeakyRelu", [x, f(0.05), zx, f(0.02), zy], alpha=0.1)
    exp = rint_clip(np.where(real < 0, 0.1 * real, real) / F32(0.02) + int(zy), dtype)
    assert np.abs(y.astype(int) - exp).max() <= 1 and (y == exp).mean() > 0.95
    y = ms("QLinearLeakyRelu", [x, f(0.05), zx, f(0.05), zx])      # default alpha 0.01, same scale
    exp = rint_clip(np.where(real < 0, 0.01 * real, real) / F32(0.05) + 3, dtype)
    assert np.abs(y.astype(int) - exp).max() <= 1


@pytest.mark.parametrize("dtype", TYPES8)
def test_qlinear_concat(dtype):
    rng = np.random.default_rng(11)
    a, b = q8(rng, dtype, (2, 1, 3)), q8(rng, dtype, (2, 2, 3))
    za, zb, zy = np.array(1, dtype), np.array(-1 if dtype == I8 else 7, dtype), np.array(4, dtype)
    y = ms("QLinearConcat", [f(0.05), zy, a, f(0.03), za, b, f(0.09), zb], axis=-2)
    real = np.concatenate([(a.astype(np.float64) - int(za)) * F32(0.03), (b.astype(np.float64) - int(zb)) * F32(0.09)],
                          axis=1)
    exp = rint_clip(real / F32(0.05) + 4, dtype)
    assert y.dtype == dtype and y.shape == (2, 3, 3) and np.abs(y.astype(int) - exp).max() <= 1
    with raises_naming_node(KernelError, "triples"):
        ms("QLinearConcat", [f(0.05), zy, a, f(0.03)], axis=0)
    with raises_naming_node(KernelError, "cannot be concatenated"):
        ms("QLinearConcat", [f(0.05), zy, a, f(0.03), za, b, f(0.09), zb], axis=0)


def avg_pool_reference(x, k, stride, pad, include_pad):
    """NCHW, plain loops over windows (pads [top, left, bottom, right])."""
    N, C, Hh, W = x.shape
    oh = (Hh + pad[0] + pad[2] - k[0]) // stride[0] + 1
    ow = (W + pad[1] + pad[3] - k[1]) // stride[1] + 1
    out = np.zeros((N, C, oh, ow))
    for i in range(oh):
        for j in range(ow):
            r0, c0 = i * stride[0] - pad[0], j * stride[1] - pad[1]
            rs = [r for r in range(r0, r0 + k[0]) if 0 <= r < Hh]
            cs = [c for c in range(c0, c0 + k[1]) if 0 <= c < W]
            total = x[:, :, rs][:, :, :, cs].sum(axis=(2, 3))
            out[:, :, i, j] = total / (k[0] * k[1] if include_pad else len(rs) * len(cs))
    return out


@pytest.mark.parametrize("dtype", TYPES8)
@pytest.mark.parametrize("channels_last", [0, 1])
@pytest.mark.parametrize("include_pad", [0, 1])
def test_qlinear_average_pool(dtype, channels_last, include_pad):
    rng = np.random.default_rng(12)
    x = q8(rng, dtype, (2, 3, 5, 6))
    zx, zy = np.array(2, dtype), np.array(-4 if dtype == I8 else 9, dtype)
    given = x.transpose(0, 2, 3, 1).copy() if channels_last else x
    y = ms("QLinearAveragePool", [given, f(0.05), zx, f(0.03), zy], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
           strides=[2, 2], count_include_pad=include_pad, channels_last=channels_last)
    real = avg_pool_reference((x.astype(np.float64) - 2) * F32(0.05), (3, 3), (2, 2), (1, 1, 1, 1), include_pad)
    exp = rint_clip(real / F32(0.03) + int(zy), dtype)
    if channels_last:
        exp = exp.transpose(0, 2, 3, 1)
    assert y.dtype == dtype and y.shape == exp.shape
    assert np.abs(y.astype(int) - exp).max() <= 1 and (y == exp).mean() > 0.95


@pytest.mark.parametrize("dtype", TYPES8)
@pytest.mark.parametrize("channels_last", [0, 1])
def test_qlinear_global_average_pool(dtype, channels_last):
    rng = np.random.default_rng(13)
    x = q8(rng, dtype, (2, 3, 4, 5))
    zx, zy = np.array(-2 if dtype == I8 else 100, dtype), np.array(6, dtype)
    y = ms("QLinearGlobalAveragePool", [x, f(0.05), zx, f(0.01), zy], channels_last=channels_last)
    axes = (1, 2) if channels_last else (2, 3)
    real = ((x.astype(np.float64) - int(zx)) * F32(0.05)).mean(axis=axes, keepdims=True)
    exp = rint_clip(real / F32(0.01) + 6, dtype)
    assert y.dtype == dtype and y.shape == exp.shape and np.abs(y.astype(int) - exp).max() <= 1
    with raises_naming_node(KernelError, "must be a float scalar"):
        ms("QLinearGlobalAveragePool", [x, f([0.05, 0.1]), zx, f(0.01), zy])


def test_qlinear_errors_name_the_node():
    a = np.zeros(3, U8)
    with raises_naming_node(KernelError, "same type"):
        ms("QLinearAdd", [a, f(1), None, a.astype(I8), f(1), None, f(1)])
    with raises_naming_node(KernelError, "int8 or uint8"):
        ms("QLinearSigmoid", [a.astype(np.int16), f(1), None, f(1)])


# -- contrib QuantizeLinear / DequantizeLinear -------------------------------------------------------

@pytest.mark.parametrize("out", [np.int8, np.uint8, np.int16, np.uint16, ml_dtypes.int4, ml_dtypes.uint4])
@pytest.mark.parametrize("xtype", [np.float32, np.float16])
def test_contrib_quantize_dequantize(out, xtype):
    x = np.array([-1000, -2.5, -1.5, -0.5, 0, 0.5, 1.5, 2.5, 3.25, 1000]).astype(xtype)
    zp = np.array(1, out)
    y = ms("QuantizeLinear", [x, np.array(0.5, xtype), zp])
    info = ml_dtypes.iinfo(out)
    exp = np.clip(np.rint(x.astype(np.float64) / 0.5) + 1, info.min, info.max).astype(out)
    assert_same(y, exp)
    back = ms("DequantizeLinear", [y, np.array(0.5, xtype), zp])
    assert_same(back, ((exp.astype(np.float64) - 1) * 0.5).astype(xtype))


def test_contrib_quantize_per_axis_and_default_type():
    x = f([[1, 2, 3], [4, 5, 6]])
    y = ms("QuantizeLinear", [x, f([1, 2, 4])], axis=1)
    assert_same(y, np.array([[1, 1, 1], [4, 2, 2]], U8))    # x / scale = [[1, 1, 0.75], [4, 2.5, 1.5]], ties to even
    y = ms("DequantizeLinear", [np.array([[1, 2], [3, 4]], I8), f([1, 10]), np.array([0, 1], I8)], axis=0)
    assert_same(y, f([[1, 2], [20, 30]]))
    with raises_naming_node(KernelError, "same type|must both be"):
        ms("QuantizeLinear", [x, np.array(1, np.float16)])


# -- end to end: a 4-bit decoder-like block ---------------------------------------------------------

def decoder_block():
    """What the 4-bit weight quantizer writes: a GatherBlockQuantized embedding (uint8, 4 bits packed),
    MatMulNBits projections with packed zero points, an MLP with SiLU, a residual and an LM head."""
    rng = np.random.default_rng(20)
    V, Hd, F_, bs = 40, 32, 64, 16
    inits, weights = [], {}

    def nbits(name, K, N, a, y):
        q, b = nbits_weights(rng, N, K, bs, 4)
        nb = K // bs
        scales = (rng.random((N, nb)) * 0.05 + 0.01).astype(F32)
        zp = rng.integers(0, 16, (N, nb)).astype(U8)
        inits.extend([numpy_helper.from_array(b, f"{name}_B"), numpy_helper.from_array(scales, f"{name}_s"),
                      numpy_helper.from_array(pack(zp, 4), f"{name}_zp")])
        weights[name] = (q, scales, zp)
        return helper.make_node("MatMulNBits", [a, f"{name}_B", f"{name}_s", f"{name}_zp"], [y], domain=MS,
                                K=K, N=N, bits=4, block_size=bs, name=name)

    eq = rng.integers(0, 16, (V, Hd)).astype(U8)
    e_s = (rng.random((V, Hd // bs)) * 0.1 + 0.05).astype(F32)
    inits += [numpy_helper.from_array(pack(eq, 4), "emb_q"), numpy_helper.from_array(e_s, "emb_s")]
    nodes = [helper.make_node("GatherBlockQuantized", ["emb_q", "ids", "emb_s"], ["h0"], domain=MS, bits=4,
                              block_size=bs, gather_axis=0, quantize_axis=1, name="embed")]

    nodes += [nbits("up", Hd, F_, "h0", "u"), helper.make_node("Sigmoid", ["u"], ["sg"]),
              helper.make_node("Mul", ["u", "sg"], ["act"]), nbits("down", F_, Hd, "act", "d"),
              helper.make_node("Add", ["h0", "d"], ["h1"]), nbits("head", Hd, V, "h1", "logits")]
    graph = helper.make_graph(nodes, "decoder", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, None])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, None, V])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)],
                              ir_version=10)
    ids = np.array([[1, 7, 39, 0, 12]], np.int64)

    def lin(x, name, K):
        q, s, zp = weights[name]
        return nbits_reference(x.reshape(-1, K), q, s, zp, K, bs).reshape(x.shape[:-1] + (-1,))

    h0 = gbq_reference(eq, ids, e_s, np.full((V, 2), 8), bs, 0, 1)
    u = lin(h0, "up", Hd)
    h1 = h0 + lin(u / (1 + np.exp(-u)), "down", F_)
    expected = lin(h1, "head", Hd)
    rep = onnx_mini.prepare(model)
    for _ in range(2):      # the second run reuses the dequantized weights
        (logits,) = rep.run([ids])
        assert logits.dtype == F32 and logits.shape == (1, 5, V)
        np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-4)
    return model, {"ids": ids}, logits


def test_decoder_block_matmul_nbits_and_quantized_embedding():
    decoder_block()


def test_decoder_block_agrees_with_onnxruntime():
    ort = pytest.importorskip("onnxruntime")
    model, feeds, logits = decoder_block()
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, feeds)[0], logits, rtol=1e-4, atol=1e-4)


# -- end to end: a QDQ-to-QLinear CNN block -----------------------------------------------------------

def cnn_block():
    """QuantizeLinear -> QLinearConv -> QLinearAdd (residual) -> QLinearGlobalAveragePool -> DequantizeLinear,
    as the QDQ-to-QLinear conversion writes it (uint8 activations, int8 per-channel weights)."""
    rng = np.random.default_rng(21)
    C, Hh, W = 4, 6, 6
    w = rng.integers(-60, 60, (C, C, 3, 3)).astype(I8)
    w_s = (rng.random(C) * 0.01 + 0.005).astype(F32)
    bias = rng.integers(-200, 200, C).astype(np.int32)
    p = {"x_s": f(0.02), "x_zp": np.array(128, U8), "w": w, "w_s": w_s, "w_zp": np.zeros(C, I8),
         "c_s": f(0.05), "c_zp": np.array(120, U8), "bias": bias, "a_s": f(0.06), "a_zp": np.array(110, U8),
         "g_s": f(0.03), "g_zp": np.array(100, U8)}
    inits = [numpy_helper.from_array(v, k) for k, v in p.items()]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_s", "x_zp"], ["xq"]),
        helper.make_node("QLinearConv", ["xq", "x_s", "x_zp", "w", "w_s", "w_zp", "c_s", "c_zp", "bias"], ["cq"],
                         pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
        helper.make_node("QLinearAdd", ["cq", "c_s", "c_zp", "xq", "x_s", "x_zp", "a_s", "a_zp"], ["aq"], domain=MS),
        helper.make_node("QLinearGlobalAveragePool", ["aq", "a_s", "a_zp", "g_s", "g_zp"], ["gq"], domain=MS),
        helper.make_node("DequantizeLinear", ["gq", "g_s", "g_zp"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, Hh, W])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)],
                              ir_version=10)
    x = rng.standard_normal((1, C, Hh, W)).astype(F32)
    (y,) = onnx_mini.prepare(model).run([x])

    # numpy, step by step from the formulas
    xq = rint_clip(x / F32(0.02) + 128, U8)
    xi = np.pad(xq.astype(np.int64) - 128, ((0, 0), (0, 0), (1, 1), (1, 1)))
    acc = np.zeros((1, C, Hh, W), np.int64)
    for co in range(C):
        for i in range(Hh):
            for j in range(W):
                acc[0, co, i, j] = (xi[0, :, i:i + 3, j:j + 3] * w[co]).sum() + bias[co]
    cq = rint_clip(acc * (F32(0.02) * w_s.astype(np.float64)).reshape(1, C, 1, 1) / F32(0.05) + 120, U8)
    real = (cq.astype(np.float64) - 120) * F32(0.05) + (xq.astype(np.float64) - 128) * F32(0.02)
    aq = rint_clip(real / F32(0.06) + 110, U8)
    gq = rint_clip(((aq.astype(np.float64) - 110) * F32(0.06)).mean(axis=(2, 3), keepdims=True) / F32(0.03) + 100, U8)
    expected = ((gq.astype(np.float64) - 100) * F32(0.03)).astype(F32)
    assert y.dtype == F32 and y.shape == (1, C, 1, 1)
    np.testing.assert_allclose(y, expected, atol=0.03 + 1e-6)      # at most one output step (ties)
    return model, {"x": x}, y


def test_qlinear_cnn_block():
    cnn_block()


def test_qlinear_cnn_block_agrees_with_onnxruntime():
    ort = pytest.importorskip("onnxruntime")
    model, feeds, y = cnn_block()
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, feeds)[0], y, atol=0.03 + 1e-6)


# -- QAttention ---------------------------------------------------------------------------------------

def qattention_reference(x, w, bias, xs, ws, xz, wz, nh, mask_len=None, causal=False, past=None):
    """Dequantized projection, then softmax(Q K^T / sqrt(head_size)) V per head, with plain loops."""
    qkv = (x.astype(np.float64) - xz) @ ((w.astype(np.float64) - wz) * ws) * xs + bias
    B, S, H3 = qkv.shape
    H = H3 // 3
    hs = H // nh
    out = np.zeros((B, S, H))
    presents = np.zeros((2, B, nh, S + (0 if past is None else past.shape[3]), hs))
    for b in range(B):
        for h in range(nh):
            q = qkv[b, :, h * hs:(h + 1) * hs]
            k = qkv[b, :, H + h * hs:H + (h + 1) * hs]
            v = qkv[b, :, 2 * H + h * hs:2 * H + (h + 1) * hs]
            if past is not None:
                k, v = np.concatenate([past[0, b, h], k]), np.concatenate([past[1, b, h], v])
            presents[0, b, h], presents[1, b, h] = k, v
            total = k.shape[0]
            for i in range(S):
                sc = q[i] @ k.T / math.sqrt(hs)
                for j in range(total):
                    if (mask_len is not None and j >= mask_len[b]) or (causal and j > i + total - S):
                        sc[j] = -10000.0
                p = np.exp(sc - sc.max())
                out[b, i, h * hs:(h + 1) * hs] = (p / p.sum()) @ v
    return out, presents


@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("with_mask", [False, True])
def test_qattention(causal, with_mask):
    rng = np.random.default_rng(30)
    B, S, Hin, nh, hs = 2, 3, 8, 2, 4
    x = rng.integers(0, 256, (B, S, Hin)).astype(U8)
    w = rng.integers(-128, 128, (Hin, 3 * nh * hs)).astype(I8)
    bias = rng.standard_normal(3 * nh * hs).astype(F32)
    ws = (rng.random(3 * nh * hs) * 0.02).astype(F32)              # per column
    mask = np.array([4, 3], np.int32) if with_mask else None   # valid lengths of past + new keys
    past = rng.standard_normal((2, B, nh, 2, hs)).astype(F32)
    inputs = [x, w, bias, f(0.02), ws, mask, np.array(128, U8), np.zeros(3 * nh * hs, I8), past]
    y, present = ms("QAttention", inputs, 2, num_heads=nh, unidirectional=causal)
    exp_y, exp_p = qattention_reference(x, w, bias, F32(0.02), ws.astype(np.float64), 128, 0, nh,
                                        mask, causal, past)
    assert y.dtype == F32 and present.shape == (2, B, nh, S + 2, hs)
    np.testing.assert_allclose(y, exp_y, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(present, exp_p, rtol=1e-5, atol=1e-5)
    with raises_naming_node(KernelError, "mask_index"):
        ms("QAttention", [x, w, bias, f(0.02), ws, np.zeros(5, np.int32)], num_heads=nh)
    with raises_naming_node(InvalidNodeError, "do_rotary"):
        ms("QAttention", inputs[:5], num_heads=nh, do_rotary=1)


# -- QEmbedLayerNormalization -------------------------------------------------------------------------

@pytest.mark.parametrize("with_segment", [False, True])
def test_qembed_layer_normalization(with_segment):
    rng = np.random.default_rng(31)
    B, S, V, P, H = 2, 4, 10, 6, 8
    ids = rng.integers(0, V, (B, S)).astype(np.int32)
    seg = rng.integers(0, 2, (B, S)).astype(np.int32)
    tables = {"w": rng.integers(0, 256, (V, H)), "p": rng.integers(0, 256, (P, H)), "s": rng.integers(0, 256, (2, H)),
              "g": rng.integers(0, 256, H), "b": rng.integers(0, 256, H)}
    tables = {k: v.astype(U8) for k, v in tables.items()}
    scale = {"w": 0.01, "p": 0.02, "s": 0.03, "g": 0.01, "b": 0.005}
    zp = {"w": 128, "p": 120, "s": 100, "g": 3, "b": 130}
    mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], np.int32)
    seg_in = [seg, tables["s"], f(scale["s"]), np.array(zp["s"], U8)] if with_segment else [None] * 4
    y, mask_index = ms("QEmbedLayerNormalization", [
        ids, seg_in[0], tables["w"], tables["p"], seg_in[1], tables["g"], tables["b"], mask,
        f(scale["w"]), f(scale["p"]), seg_in[2], f(scale["g"]), f(scale["b"]),
        np.array(zp["w"], U8), np.array(zp["p"], U8), seg_in[3], np.array(zp["g"], U8), np.array(zp["b"], U8)], 2)
    deq = {k: (tables[k].astype(np.float64) - zp[k]) * F32(scale[k]) for k in tables}
    e = deq["w"][ids] + deq["p"][np.arange(S)][None] + (deq["s"][seg] if with_segment else 0)
    mean, var = e.mean(axis=-1, keepdims=True), e.var(axis=-1, keepdims=True)
    expected = (e - mean) / np.sqrt(var + 1e-12) * deq["g"] + deq["b"]
    assert y.dtype == F32 and y.shape == (B, S, H)
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)
    assert_same(mask_index, np.array([3, 2], np.int32))


# -- onnxruntime as a second opinion, op by op ---------------------------------------------------------

def _ort_and_mini(op, inputs, n_outputs=1, **attrs):
    """The one-node com.microsoft model run by onnx_mini and onnxruntime. Sub-byte and float8 inputs
    are initializers (onnxruntime cannot be fed them), and so are MatMulNBits' weights, as the quantizer
    writes them (onnxruntime's 8-bit kernel needs them constant)."""
    ort = pytest.importorskip("onnxruntime")
    names = [f"in{k}" if x is not None else "" for k, x in enumerate(inputs)]
    while names and not names[-1]:
        names.pop()
    const = {1, 2, 3} if op == "MatMulNBits" else set()
    pairs = [(n, x, k in const or x.dtype.type.__module__ != "numpy")
             for k, (n, x) in enumerate(zip(names, inputs)) if x is not None]
    fed = [(n, x) for n, x, c in pairs if not c]
    inits = [numpy_helper.from_array(x, n) for n, x, c in pairs if c]
    node = helper.make_node(op, names, [f"out{k}" for k in range(n_outputs)], domain=MS, name=NODE, **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape) for n, x in fed],
        [helper.make_empty_tensor_value_info(f"out{k}") for k in range(n_outputs)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)],
                              ir_version=10)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return onnx_mini.prepare(model).run([x for _, x in fed]), sess.run(None, dict(fed))


def _ort_cases():
    rng = np.random.default_rng(40)
    cases = []
    for bits in (2, 4):     # onnxruntime's CPU kernel has no fp32 path for 8 bits
        q, b = nbits_weights(rng, 6, 48, 16, bits)
        sc = (rng.random((6, 3)) + 0.5).astype(F32)
        a = rng.standard_normal((2, 48)).astype(F32)
        zf = (rng.random((6, 3)) * (1 << bits)).astype(F32)
        cases.append(pytest.param("MatMulNBits", [a, b, sc, None, None, np.ones(6, F32)], 1,
                                  dict(K=48, N=6, bits=bits, block_size=16), 1e-4, id=f"MatMulNBits-{bits}"))
        cases.append(pytest.param("MatMulNBits", [a, b, sc, zf], 1, dict(K=48, N=6, bits=bits, block_size=16), 1e-4,
                                  id=f"MatMulNBits-{bits}-float-zp"))
    table = rng.integers(-8, 8, (12, 32)).astype(ml_dtypes.int4)
    cases.append(pytest.param("GatherBlockQuantized", [table, np.array([[0, 11], [-1, 40]]),
                                                       (rng.random((12, 2)) + 0.5).astype(F32),
                                                       rng.integers(-8, 8, (12, 2)).astype(ml_dtypes.int4)],
                              1, dict(block_size=16), 0, id="GatherBlockQuantized-int4"))
    a8, b8 = rng.integers(0, 256, (3, 5)).astype(U8), rng.integers(-128, 128, (5, 4)).astype(I8)
    cases.append(pytest.param("QGemm", [a8, f(0.05), np.array(120, U8), b8, f([0.1, 0.2, 0.3, 0.4]), np.zeros(4, I8),
                                        rng.integers(-900, 900, 4).astype(np.int32), f(0.5), np.array(100, U8)],
                              1, dict(alpha=1.5), 1, id="QGemm-quantized"))
    cases.append(pytest.param("MatMulIntegerToFloat", [a8, b8, f(0.05), f([0.1, 0.2, 0.3, 0.4]), np.array(120, U8),
                                                       np.arange(4).astype(I8), np.ones(4, F32)],
                              1, {}, 1e-5, id="MatMulIntegerToFloat"))
    # B within [-64, 63] in the two dynamic-quantized cases: onnxruntime's u8 x s8 kernel (x86) sums
    # pairs of products in saturating int16, which 255 * 128 * 2 overflows (it gave 28.2 for 39.1 here)
    cases.append(pytest.param("DynamicQuantizeMatMul", [rng.standard_normal((2, 3, 5)).astype(F32), b8 // 2,
                                                        f([0.1, 0.2, 0.3, 0.4]), np.full(4, 2, I8)],
                              1, {}, 1e-5, id="DynamicQuantizeMatMul"))
    for dt in (U8, I8):
        x, y = q8(rng, dt, (2, 3, 4, 5)), q8(rng, dt, (4, 5))
        z = [np.array(v, dt) for v in (3, -2 if dt == I8 else 200, 7)]
        name = np.dtype(dt).name
        cases += [
            pytest.param("QLinearAdd", [x, f(0.03), z[0], y, f(0.07), z[1], f(0.11), z[2]], 1, {}, 0, id=f"Add-{name}"),
            pytest.param("QLinearMul", [x, f(0.03), z[0], y, f(0.07), z[1], f(2.0), z[2]], 1, {}, 0, id=f"Mul-{name}"),
            pytest.param("QLinearSigmoid", [x, f(0.05), z[0], f(1 / 256), z[2]], 1, {}, 0, id=f"Sigmoid-{name}"),
            pytest.param("QLinearLeakyRelu", [x, f(0.05), z[0], f(0.02), z[2]], 1, dict(alpha=0.2), 0,
                         id=f"LeakyRelu-{name}"),
            pytest.param("QLinearConcat", [f(0.05), z[2], x, f(0.03), z[0], x[:, :1], f(0.09), z[1]], 1, dict(axis=1),
                         0, id=f"Concat-{name}"),
            pytest.param("QLinearGlobalAveragePool", [x, f(0.05), z[0], f(0.03), z[2]], 1, dict(channels_last=1), 0,
                         id=f"GlobalAveragePool-{name}"),
            pytest.param("QLinearAveragePool", [x, f(0.05), z[0], f(0.03), z[2]], 1,
                         dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]), 1, id=f"AveragePool-{name}"),
        ]
    xc = rng.integers(0, 256, (1, 5, 6, 3)).astype(U8)
    wc = rng.integers(-60, 60, (4, 3, 3, 3)).astype(I8)
    cases.append(pytest.param("QLinearConv", [xc, f(0.02), np.array(128, U8), wc,
                                              (rng.random(4) * 0.01).astype(F32), np.zeros(4, I8), f(0.05),
                                              np.array(120, U8), rng.integers(-100, 100, 4).astype(np.int32)],
                              1, dict(channels_last=1, pads=[1, 1, 1, 1], kernel_shape=[3, 3]), 0,
                              id="QLinearConv-channels-last"))
    xf = (rng.standard_normal((2, 3, 4)) * 5).astype(F32)
    cases += [pytest.param("QuantizeLinear", [xf, f([0.04, 0.1, 0.2]), np.array([3, 4, 5], U8)], 1, dict(axis=1), 0,
                           id="QuantizeLinear-axis"),
              pytest.param("DequantizeLinear", [q8(rng, I8, (2, 3)), np.array(0.04, np.float16), np.array(-3, I8)], 1,
                           {}, 0, id="DequantizeLinear-f16")]
    w, r = rng.integers(-128, 128, (2, 3, 20)).astype(I8) // 2, rng.integers(-128, 128, (2, 5, 20)).astype(I8) // 2
    cases.append(pytest.param("DynamicQuantizeLSTM", [
        rng.standard_normal((4, 2, 3)).astype(F32), w, r, rng.standard_normal((2, 40)).astype(F32), None, None, None,
        None, (rng.random((2, 20)) * 0.01).astype(F32), np.zeros((2, 20), I8), (rng.random(2) * 0.01).astype(F32),
        np.zeros(2, I8)], 3, dict(hidden_size=5, direction="bidirectional"), 0.02, id="DynamicQuantizeLSTM"))
    return cases


@pytest.mark.parametrize("op,inputs,n_outputs,attrs,tolerance", _ort_cases())
def test_agrees_with_onnxruntime(op, inputs, n_outputs, attrs, tolerance):
    """tolerance: absolute for float outputs; in quantization steps for integer ones (0: identical). The
    LSTM differs because onnxruntime also quantizes X and the hidden state at every step."""
    mini, ort = _ort_and_mini(op, inputs, n_outputs, **attrs)
    for got, exp in zip(mini, ort):
        assert got.dtype == exp.dtype and got.shape == exp.shape
        np.testing.assert_allclose(got.astype(np.float64), exp.astype(np.float64), rtol=0, atol=tolerance)


# -- QLinearConv (contrib: NHWC with channels_last) ------------------------------------------------------

@pytest.mark.parametrize("channels_last", [0, 1])
def test_qlinear_conv_contrib(channels_last):
    rng = np.random.default_rng(50)
    x = rng.integers(0, 256, (1, 3, 5, 6)).astype(U8)
    w = rng.integers(-60, 60, (4, 3, 3, 3)).astype(I8)
    w_s = (rng.random(4) * 0.01).astype(F32)
    bias = rng.integers(-100, 100, 4).astype(np.int32)
    given = x.transpose(0, 2, 3, 1).copy() if channels_last else x
    y = ms("QLinearConv", [given, f(0.02), np.array(128, U8), w, w_s, np.zeros(4, I8), f(0.05), np.array(120, U8),
                           bias], channels_last=channels_last, pads=[1, 1, 1, 1], kernel_shape=[3, 3])
    xi = np.pad(x.astype(np.int64) - 128, ((0, 0), (0, 0), (1, 1), (1, 1)))
    acc = np.zeros((1, 4, 5, 6), np.int64)
    for co in range(4):
        for i in range(5):
            for j in range(6):
                acc[0, co, i, j] = (xi[0, :, i:i + 3, j:j + 3] * w[co]).sum() + bias[co]
    exp = rint_clip(acc * (F32(0.02) * w_s.astype(np.float64)).reshape(1, 4, 1, 1) / F32(0.05) + 120, U8)
    if channels_last:
        exp = exp.transpose(0, 2, 3, 1)
    assert y.dtype == U8 and y.shape == exp.shape
    assert np.abs(y.astype(int) - exp).max() <= 1 and (y == exp).mean() > 0.95


def test_edge_cases_empty_and_scalar():
    z8 = np.array(0, U8)
    y = ms("QLinearSigmoid", [np.array(128, U8), f(0.1), np.array(128, U8), f(1 / 256), z8])
    assert_same(y, np.array(128, U8))                      # sigmoid(0) = 0.5 -> 128
    y = ms("QLinearAdd", [np.zeros((0, 3), U8), f(1), z8, np.zeros(3, U8), f(1), z8, f(1), z8])
    assert_same(y, np.zeros((0, 3), U8))
    rng = np.random.default_rng(60)
    q, b = nbits_weights(rng, 2, 16, 16, 4)
    y = ms("MatMulNBits", [np.zeros((0, 16), np.float16), b, np.ones((2, 1), np.float16)], K=16, N=2, block_size=16)
    assert_same(y, np.zeros((0, 2), np.float16))
    y = ms("GatherBlockQuantized", [pack(q, 4), np.zeros((0, 2), np.int64), np.ones((2, 1), F32)], block_size=16)
    assert_same(y, np.zeros((0, 2, 16), F32))


def test_gather_block_quantized_unpacks_constant_zero_points_once(monkeypatch):
    """Packed uint8 zero points of a constant table are unpacked at prepare; each run unpacks only the
    gathered rows (fed ones: the zero points too), with the same result."""
    h, nh = helper, numpy_helper
    rng = np.random.default_rng(12)
    data = rng.integers(0, 256, (6, 16), dtype=np.uint8)                  # 6 rows of 32 4-bit values
    scales = (rng.random((6, 2)) + 0.5).astype(np.float32)               # blocks of 16
    zp = rng.integers(0, 256, (6, 1), dtype=np.uint8)                     # 2 packed 4-bit zero points a row
    idx = np.array([[4, 0], [5, 4]], np.int64)
    node = h.make_node("GatherBlockQuantized", ["data", "idx", "scales", "zp"], ["y"], domain="com.microsoft",
                       block_size=16, bits=4)
    calls = []
    real = qm.unpack_bits
    monkeypatch.setattr(qm, "unpack_bits", lambda *a: calls.append(1) or real(*a))

    def prepared(constant):
        inits = [nh.from_array(v, n) for v, n in ((data, "data"), (scales, "scales"), (zp, "zp")) if constant]
        fed = [] if constant else [("data", data), ("scales", scales), ("zp", zp)]
        graph = h.make_graph([node], "g", [h.make_tensor_value_info(n, h.np_dtype_to_tensor_dtype(v.dtype), None)
                                           for n, v in [("idx", idx)] + fed],
                             [h.make_empty_tensor_value_info("y")], inits)
        model = h.make_model(graph, opset_imports=[h.make_opsetid("", 21), h.make_opsetid("com.microsoft", 1)],
                             ir_version=10)
        return onnx_mini.prepare(model), [idx] + [v for _, v in fed]
    rep_c, feeds_c = prepared(True)
    assert len(calls) == 1                          # the zero points, at prepare
    rep_f, feeds_f = prepared(False)
    del calls[:]
    (yc,) = rep_c.run(feeds_c)
    assert len(calls) == 1                          # the gathered rows only
    (yf,) = rep_f.run(feeds_f)
    assert len(calls) == 3                          # fed: the rows and the zero points
    q = np.stack([data & 15, data >> 4], axis=-1).reshape(6, 32).astype(np.float32)
    z = np.stack([zp & 15, zp >> 4], axis=-1).reshape(6, 2).astype(np.float32)
    table = (q - np.repeat(z, 16, axis=1)) * np.repeat(scales, 16, axis=1)
    assert_same(yc, table[idx])
    assert_same(yf, yc)


# -- MatMulIntegerScaled (the optimiser's fused MatMulInteger -> Cast -> Mul [-> Add]) ------------------

def _scaled_product(constant_b: bool):
    def run(a, b, a_zp, b_zp, s, bias=None, s2=None):
        fn = qm.matmul_integer_scaled_1(_constants={1: b, 3: b_zp} if constant_b else {})
        return fn(a, b, a_zp, b_zp, s, s2) if bias is None else fn(a, b, a_zp, b_zp, s, s2, bias)
    return run


@pytest.mark.parametrize("constant_b", [True, False], ids=["constant-B", "fed-B"])
def test_matmul_integer_scaled_wraps_as_int32_beyond_its_range(constant_b):
    """K * 255 * 255 >= 2^31 (the optimiser never writes it; the kernel still agrees with the chain): the
    sum 33100 * 65025 wraps in MatMulInteger's int32, and Cast reads the wrapped value."""
    k = 33100
    a, b = np.zeros((1, k), U8), np.full((k, 2), -128, I8)
    y = _scaled_product(constant_b)(a, b, np.array(255, U8), np.array([127, -128], I8), np.float32(0.5))
    wrapped = np.array([k * 65025, 0], np.int64).astype(np.int32)     # two's complement, as int32 adds
    assert wrapped[0] < 0
    np.testing.assert_array_equal(y, (wrapped.astype(F32) * F32(0.5))[None])


@pytest.mark.parametrize("constant_b", [True, False], ids=["constant-B", "fed-B"])
def test_matmul_integer_scaled_values(constant_b):
    a = np.array([[0, 255, 7], [255, 0, 128]], U8)
    b = np.array([[-128, 127], [127, -128], [0, 5]], I8)
    s, bias = np.array([0.5, 3.0], F32), np.array([1.0, -2.0], F32)
    y = _scaled_product(constant_b)(a, b, np.array(128, U8), np.array([0, 1], I8), s, bias)
    exact = (a.astype(np.int64) - 128) @ (b.astype(np.int64) - [0, 1])
    np.testing.assert_array_equal(y, exact.astype(F32) * s + bias)
    assert y.dtype == F32 and y.shape == (2, 2)


def test_matmul_integer_scaled_broadcasts_like_mul_and_checks_types():
    run = _scaled_product(False)
    a, b = np.full((2, 3), 3, U8), np.ones((3, 2), I8)
    s = np.arange(1, 9, dtype=F32).reshape(4, 1, 2)          # enlarges the product, as Mul's broadcasting would
    y = run(a, b, np.array(1, U8), np.array(0, I8), s)
    np.testing.assert_array_equal(y, np.full((2, 2), 6, F32) * s)
    two = run(a, b, np.array(1, U8), np.array(0, I8), np.float32(3), s2=np.array([0.1, 7], F32))  # s * s2 first
    np.testing.assert_array_equal(two, np.full((2, 2), 6, F32) * (F32(3) * np.array([0.1, 7], F32)))
    with pytest.raises(qm.InvalidValueError, match="same element type"):
        run(a, b, np.array(1, U8), np.array(0, I8), np.float16(2))
    with pytest.raises(qm.InvalidValueError, match="Add"):
        run(a, b, np.array(1, U8), np.array(0, I8), np.float32(2), np.ones(3, F32))
    with pytest.raises(qm.InvalidValueError, match="int8 or uint8"):
        run(a.astype(np.int16), b, np.array(1, np.int16), np.array(0, I8), np.float32(2))
