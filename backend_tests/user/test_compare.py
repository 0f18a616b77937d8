"""onnx_mini.compare: every intermediate value against onnxruntime or onnx.reference, and the first
node that diverges (found here by planting a wrong kernel)."""
from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_mini
from helpers import F, I64, model
from onnx_mini import registry
from onnx_mini import resolve as resolve_module
from onnx_mini.compare import _difference
from onnx_mini.errors import InputError, OnnxMiniError

HAS_ORT = importlib.util.find_spec("onnxruntime") is not None
AGAINST = ["reference", pytest.param("onnxruntime", marks=pytest.mark.skipif(not HAS_ORT, reason="no onnxruntime"))]


def chain():
    """x -> Relu -> Add(b) -> Exp -> ReduceSum; Shape of x on the side (an int64 value)."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Add", ["r", "b"], ["s"], name="add"),
             helper.make_node("Exp", ["s"], ["e"], name="exp"),
             helper.make_node("ReduceSum", ["e"], ["y"], keepdims=0, name="sum"),
             helper.make_node("Shape", ["x"], ["shape"], name="shape")]
    return model(nodes, [("x", F, ["N", 3])], [("y", F, []), ("shape", I64, [2])],
                 [numpy_helper.from_array(np.array([0.5, -1, 2], np.float32), "b")])


X = np.array([[1, -2, 0.25], [-1, 3, 0.5]], np.float32)


@pytest.fixture
def planted(monkeypatch):
    """plant(op, version, fn_factory): onnx_mini's kernel for (op, version) replaced for this test."""
    def plant(op, version, factory):
        spec = registry._KERNELS[("", op, version)]
        monkeypatch.setitem(registry._KERNELS, ("", op, version), replace(spec, factory=factory))
        resolve_module._resolve.cache_clear()
    yield plant
    monkeypatch.undo()
    resolve_module._resolve.cache_clear()


@pytest.mark.parametrize("against", AGAINST)
def test_agreeing_model(against):
    result = onnx_mini.compare(chain(), {"x": X}, against=against)
    assert result.ok and result.divergence is None
    assert (result.against, result.compared, result.steps, result.not_compared) == (against, 5, 5, ())
    assert str(result).endswith("5 value(s) of 5 node(s) compared; all agree")


@pytest.mark.parametrize("against", AGAINST)
def test_planted_divergence_is_the_first_diverging_node(against, planted):
    # Add is off by 0.01: Add, Exp and ReduceSum all diverge; the report names Add (the first)
    planted("Add", 14, lambda: lambda a, b: np.add(a, b) + np.float32(0.01))
    result = onnx_mini.compare(chain(), {"x": X}, against=against, rtol=1e-4, atol=1e-5)
    d = result.divergence
    assert not result.ok
    assert (d.index, d.node, d.op_type, d.version, d.output) == (1, "add", "Add", 14, "s")
    assert d.inputs == (("r", "float32[2, 3]"), ("b", "float32[3]"))
    assert d.ours == d.theirs == "float32[2, 3]"
    assert d.max_abs_error == pytest.approx(0.01, rel=1e-3)
    s = np.maximum(X, 0) + np.array([0.5, -1, 2], np.float32)
    assert d.max_rel_error == pytest.approx((0.01 / np.abs(s)).max(), rel=1e-3)
    assert d.reason.startswith("6 of 6 value(s) beyond tolerance, largest at ")
    text = str(result)
    assert "first divergence at step 1: node 'add' (Add-14), output 's'" in text
    assert "inputs: r: float32[2, 3], b: float32[3]" in text and f"{against}: float32[2, 3]" in text


def test_tolerance_decides(planted):
    planted("Relu", 14, lambda: lambda x: np.maximum(x, 0) * np.float32(1 + 1e-3))
    assert onnx_mini.compare(chain(), {"x": X}, against="reference", rtol=1e-2).ok
    d = onnx_mini.compare(chain(), {"x": X}, against="reference", rtol=1e-4).divergence
    assert d.node == "relu" and d.index == 0 and d.inputs == (("x", "float32[2, 3]"),)


def test_shape_and_dtype_divergences(planted):
    planted("Shape", 21, lambda **kw: lambda x: np.array(x.shape, np.int32))
    d = onnx_mini.compare(chain(), {"x": X}, against="reference").divergence
    assert (d.node, d.reason, d.max_abs_error) == ("shape", "element types differ (int32 vs int64)", float("inf"))
    planted("Exp", 13, lambda: lambda x: np.exp(x)[:1])
    d = onnx_mini.compare(chain(), {"x": X}, against="reference").divergence
    assert (d.node, d.reason) == ("exp", "shapes differ ([1, 3] vs [2, 3])")


def test_sequences_and_python_feeds():
    nodes = [helper.make_node("SplitToSequence", ["x"], ["seq"], axis=0, name="split"),
             helper.make_node("SequenceAt", ["seq", "i"], ["row"], name="at"),
             helper.make_node("Neg", ["row"], ["y"], name="neg")]
    m = model(nodes, [("x", F, [2, 3]), ("i", I64, [])], [("y", F, [3])])
    result = onnx_mini.compare(m, {"x": X.tolist(), "i": 1}, against="reference")
    assert result.ok and result.compared == 3


def test_model_with_external_data(tmp_path):
    onnx.save(chain(), tmp_path / "m.onnx", save_as_external_data=True, location="w.bin", size_threshold=0)
    assert onnx_mini.compare(str(tmp_path / "m.onnx"), {"x": X}, against="reference").ok


def test_errors(monkeypatch):
    with pytest.raises(OnnxMiniError, match="choose one of 'onnxruntime', 'reference'"):
        onnx_mini.compare(chain(), {"x": X}, against="tensorflow")
    with pytest.raises(InputError, match="missing input"):
        onnx_mini.compare(chain(), {}, against="reference")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)       # as if it were not installed
    with pytest.raises(OnnxMiniError, match=r"needs onnxruntime \(pip install onnxruntime\).*against='reference'"):
        onnx_mini.compare(chain(), {"x": X}, against="onnxruntime")
    monkeypatch.setitem(sys.modules, "onnx.reference", None)
    with pytest.raises(OnnxMiniError, match="needs onnx.reference"):
        onnx_mini.compare(chain(), {"x": X}, against="reference")


@pytest.mark.skipif(not HAS_ORT, reason="no onnxruntime")
def test_onnxruntime_refusal_is_an_onnx_mini_error():
    # an opset newer than onnxruntime's: onnx_mini runs the model, onnxruntime refuses it
    m = model([helper.make_node("Relu", ["x"], ["y"])], [("x", F, [2])], [("y", F, [2])], opset=28, ir_version=13)
    with pytest.raises(OnnxMiniError, match="^onnxruntime cannot run the model: "):
        onnx_mini.compare(m, {"x": np.ones(2, np.float32)}, against="onnxruntime")


def test_difference_rules():
    f = np.float32
    nan, inf = np.nan, np.inf
    assert _difference(np.array([1, nan, inf, -inf], f), np.array([1, nan, inf, -inf], f), 0, 0) is None
    reason, a, r = _difference(np.array([1, nan], f), np.array([1, 2], f), 0, 0)
    assert a == inf and reason.startswith("1 of 2 value(s) beyond tolerance, largest at [1]: nan vs 2.0")
    reason, a, r = _difference(np.array([1, 2, 4], f), np.array([1, 2.5, 2], f), 0, 1.0)
    assert (a, r) == (2.0, 1.0) and reason.startswith("1 of 3")          # 0.5 within atol, 2 is not
    assert _difference(np.array([], f), np.array([], f), 0, 0) is None
    assert _difference(np.array(["a", "b"], object), np.array(["a", "c"], object), 0, 0)[0] == \
        "1 of 2 value(s) differ, first at [1]: 'b' vs 'c'"
    assert _difference(np.array([True]), np.array([False]), 1, 1) is not None     # exact, whatever the tolerance
    assert _difference(np.array([3]), np.array([4]), 1, 1)[0] == "1 of 1 value(s) differ, first at [0]: 3 vs 4"
    assert _difference([np.ones(2, f)], [np.ones(2, f), np.ones(2, f)], 0, 0)[0] == "sequence lengths differ (1 vs 2)"
    assert _difference([np.ones(2, f)], [np.zeros(2, f)], 0, 0)[0].startswith("sequence item 0: 2 of 2")
    assert _difference({1: 0.5}, {1: 0.5}, 0, 0) is None
    assert _difference({1: 0.5}, {2: 0.5}, 0, 0)[0] == "map keys differ"
    assert _difference(None, None, 0, 0) is None and _difference(None, np.ones(1), 0, 0)[1] == inf
    assert _difference(np.ones(1, np.int64), np.ones(1, np.int64) * 2, 0, 0)[1:] == (1.0, 0.5)


def test_divergence_inside_a_model_local_function(planted):
    body = helper.make_function("custom", "Twice", ["a"], ["b"], [helper.make_node("Add", ["a", "a"], ["b"])],
                                [helper.make_opsetid("", 21)])
    graph = helper.make_graph([helper.make_node("Twice", ["x"], ["y"], domain="custom", name="tw"),
                               helper.make_node("Neg", ["y"], ["z"], name="neg")], "g",
                              [helper.make_tensor_value_info("x", F, [2])],
                              [helper.make_tensor_value_info("z", F, [2])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("custom", 1)],
                          functions=[body], ir_version=10)
    assert onnx_mini.compare(m, {"x": np.ones(2, np.float32)}, against="reference").ok
    planted("Add", 14, lambda: lambda a, b: a + b + 1)
    d = onnx_mini.compare(m, {"x": np.ones(2, np.float32)}, against="reference").divergence
    assert (d.op_type, d.output, d.max_abs_error) == ("Add", "y", 1.0)
    assert d.reason.endswith("(computed for the model's node 'tw' (custom::Twice))")
