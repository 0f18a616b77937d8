"""The plans of one model share the transforms of their constant inputs (ops/_common.prepack within
engine's planning): the shape-specialised plan a run's new input shape builds, and a plan of other
outputs, reuse the general plan's dequantized weights instead of making (and holding) them again."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import onnx_mini
from onnx_mini.ops import _common
from onnx_mini.ops.contrib import quantized_matmul

K, N, BLOCK = 64, 8, 32


def nbits_model(rng):
    """MatMulNBits (4 bits, blocks of 32, default zero point 8) and a Shape of A (so runs specialise)."""
    q = rng.integers(0, 16, (N, K)).astype(np.uint8)
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(N, K // BLOCK, BLOCK // 2)   # low nibble first
    scales = rng.uniform(0.01, 0.1, (N, K // BLOCK)).astype(np.float32)
    nodes = [helper.make_node("MatMulNBits", ["a", "b", "s"], ["y"], domain="com.microsoft", K=K, N=N,
                              bits=4, block_size=BLOCK),
             helper.make_node("Shape", ["a"], ["shape"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["m", K])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                           helper.make_tensor_value_info("shape", TensorProto.INT64, None)],
                          [numpy_helper.from_array(packed, "b"), numpy_helper.from_array(scales, "s")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    w = (q.astype(np.float64) - 8) * np.repeat(scales.astype(np.float64), BLOCK, axis=1)      # [N, K]
    return model, w


def test_specialised_plans_reuse_the_dequantized_weights(monkeypatch):
    rng = np.random.default_rng(0)
    model, w = nbits_model(rng)
    calls = []
    real = quantized_matmul.unpack_bits          # the weights' codes, unpacked once per dequantization
    monkeypatch.setattr(quantized_matmul, "unpack_bits", lambda *a: calls.append(1) or real(*a))
    prepared = onnx_mini.prepare(model)
    assert len(calls) == 1                                   # the general plan's transform
    for m in (1, 3, 1, 5):                                   # three shapes: three specialised plans
        a = rng.standard_normal((m, K)).astype(np.float32)
        y, shape = prepared.run({"a": a})
        np.testing.assert_allclose(y, a.astype(np.float64) @ w.T, rtol=1e-5, atol=1e-5)
        assert shape.tolist() == [m, K]
    assert len(calls) == 1                                   # made once, for every plan
    onnx_mini.prepare(model)
    assert len(calls) == 2                                   # per model: another model makes its own


def test_transform_keys():
    def factory(k, table=None):
        def transform(x):
            return x * k if table is None else x + table
        return transform
    t = np.ones(3)
    a, b = np.ones(2), np.ones(2)
    key = _common._transform_key
    assert key(factory(2), (a,)) == key(factory(2), (a,))                 # same code, values, arrays
    assert key(factory(2), (a,)) != key(factory(3), (a,))                 # another attribute value
    assert key(factory(2), (a,)) != key(factory(2), (b,))                 # another constant array
    assert key(factory(2, t), (a,)) == key(factory(2, t), (a,))           # the same array closed over
    assert key(factory(2, t), (a,)) != key(factory(2, t.copy()), (a,))    # another one: by identity
    assert key(len, (a,)) is None                                         # not a plain function

    def with_default(x, d=[1]):
        return x
    assert key(with_default, (a,)) is None                                # unhashable default: no reuse


def test_a_qlinear_conv_scale_proof_is_made_once_per_node_and_bound(monkeypatch):
    # The float32 rescale's proof (conv_quantized._scale_plan) of a constant QLinearConv depends on the
    # scales, y's zero point and the accumulator bound: the optimiser's checks and the kernels that plan the
    # node (NCHW and channels-last) share it within the model's planning. Two nodes reading the same scale
    # and zero-point initializers but with other bounds (a 3x3 Conv, a depthwise one) each get their own.
    from onnx_mini.ops.nn import conv_quantized
    from helpers import conv2d_direct
    proofs, plans = [], []
    real_proof, real_plan = conv_quantized._scale_plan, conv_quantized._constant_qlinear_conv
    monkeypatch.setattr(conv_quantized, "_scale_plan", lambda *a: proofs.append(a[-1]) or real_proof(*a))
    monkeypatch.setattr(conv_quantized, "_constant_qlinear_conv", lambda *a, **k: plans.append(1) or real_plan(*a, **k))
    rng = np.random.default_rng(4)
    w1 = rng.integers(-128, 128, (8, 3, 3, 3)).astype(np.int8)
    w2 = rng.integers(-128, 128, (8, 1, 3, 3)).astype(np.int8)
    b = rng.integers(-2000, 2000, 8).astype(np.int32)
    consts = {"xs": np.array(0.02, np.float32), "xz": np.array(128, np.uint8), "ws": np.array(0.01, np.float32),
              "wz": np.array(0, np.int8), "ys": np.array(0.05, np.float32), "yz": np.array(3, np.uint8),
              "w1": w1, "w2": w2, "b": b}
    common = dict(pads=[1, 1, 1, 1], kernel_shape=[3, 3])
    nodes = [helper.make_node("QLinearConv", ["x", "xs", "xz", "w1", "ws", "wz", "ys", "yz", "b"], ["h"], **common),
             helper.make_node("QLinearConv", ["h", "ys", "yz", "w2", "ws", "wz", "ys", "yz", "b"], ["y"], group=8,
                              **common)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 3, 6, 7])],
                          [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
                          [numpy_helper.from_array(v, k) for k, v in consts.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    prepared = onnx_mini.prepare(model)
    assert len(proofs) == 2 and proofs[0] != proofs[1]         # one per node: two bounds
    assert len(plans) > len(proofs)                   # the node planned more often than proven
    x = rng.integers(0, 256, (1, 3, 6, 7)).astype(np.uint8)

    def qconv(xq, xs, xz, w, group):
        acc = conv2d_direct(xq.astype(np.int64) - int(xz), w.astype(np.int64), b, (1, 1), (1, 1, 1, 1), group,
                            dtype=np.int64)
        scale = np.float64(xs) * np.float64(consts["ws"]) / np.float64(consts["ys"])
        return np.clip(np.rint(acc * scale) + 3, 0, 255).astype(np.uint8)
    h = qconv(x, consts["xs"], 128, w1, 1)
    want = qconv(h, consts["ys"], 3, w2, 8)
    np.testing.assert_array_equal(prepared.run({"x": x})[0], want)
