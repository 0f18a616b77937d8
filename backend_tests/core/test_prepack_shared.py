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
    real = quantized_matmul.unpacked_codes       # the weights' codes, unpacked once per dequantization
    monkeypatch.setattr(quantized_matmul, "unpacked_codes", lambda *a: calls.append(1) or real(*a))
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
