"""Models that exporters write and onnxruntime runs, which onnx_mini used to refuse or get wrong:
declared dimensions of -1 (Paddle, WinMLTools, OnnxMLTools), nodes of ai.onnx.ml / com.microsoft in a
model that imports no opset for that domain, and string inputs given as object arrays of other Python
values (onnxruntime stores str() of each element). ImageScaler and float16 Softmax are tested with
their operators (ops/test_ops_image.py, ops/math/test_ops_softmax.py)."""
from __future__ import annotations

import importlib.util
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnx_mini
from onnx_mini import InferenceSession, loader
from onnx_mini.cli import main
from onnx_mini.errors import InputError, UnsupportedOperatorError
from onnx_mini.loader import MissingOpsetWarning

from helpers import F, model

HAS_ORT = importlib.util.find_spec("onnxruntime") is not None
S = TensorProto.STRING


def ort_session(m: onnx.ModelProto):
    ort = pytest.importorskip("onnxruntime")
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])


# -- a declared dimension of -1 is unknown ---------------------------------------------------------

def relu_model(dim: int = -1) -> onnx.ModelProto:
    return model([helper.make_node("Relu", ["x"], ["y"])], [("x", F, [dim, 3])], [("y", F, [dim, 3])], opset=13)


@pytest.mark.parametrize("dim", [-1, -2, -7])
def test_negative_dims_load_as_unknown(dim):
    # onnxruntime reads every negative dim_value as unknown (checked with 1.32: -1, -2, -7 all None)
    g = loader.load(relu_model(dim)).graph
    assert g.inputs[0].type.shape == (None, 3)
    assert g.outputs[0].type.shape == (None, 3)


def test_symbolic_and_fixed_dims_are_kept():
    m = model([helper.make_node("Relu", ["x"], ["y"])], [("x", F, ["batch", 0, 3])], [("y", F, None)])
    assert loader.load(m).graph.inputs[0].type.shape == ("batch", 0, 3)


@pytest.mark.parametrize("batch", [2, 5])
def test_minus_one_batch_runs_with_any_batch(batch):
    x = (np.arange(batch * 3, dtype=np.float32) - 4).reshape(batch, 3)
    expected = np.maximum(x, 0)
    (y,) = onnx_mini.prepare(relu_model()).run([x])
    np.testing.assert_array_equal(y, expected)
    sess = InferenceSession(relu_model().SerializeToString())
    (y2,) = sess.run(None, {"x": x})
    np.testing.assert_array_equal(y2, expected)


def test_minus_one_shows_as_none_like_onnxruntime():
    sess = InferenceSession(relu_model().SerializeToString())
    assert sess.get_inputs()[0].shape == [None, 3]
    assert sess.get_outputs()[0].shape == [None, 3]
    if HAS_ORT:
        o = ort_session(relu_model())
        assert o.get_inputs()[0].shape == sess.get_inputs()[0].shape


def test_fixed_dims_beside_minus_one_are_still_checked():
    with pytest.raises(InputError, match=r"dimension 1 must be 3"):
        onnx_mini.prepare(relu_model()).run([np.zeros((2, 4), np.float32)])


def test_cli_run_on_a_minus_one_model(tmp_path, capsys):
    path = tmp_path / "neg.onnx"
    onnx.save(relu_model(), path)
    assert main(["run", str(path), "--seed", "0"]) == 0       # was: ValueError: negative dimensions
    out, err = capsys.readouterr()
    assert "y: float32[1, 3]" in out                          # an unknown dimension is taken as 1
    assert "Traceback" not in out + err


# -- a node of a domain the model imports no opset for ------------------------------------------------

def unimported(node, inputs, outputs, opset=13) -> onnx.ModelProto:
    """A model whose only opset import is ai.onnx."""
    return model([node] if not isinstance(node, list) else node, inputs, outputs, opset=opset)


def test_ml_node_without_its_opset_import_runs_and_warns():
    m = unimported(helper.make_node("Normalizer", ["x"], ["y"], domain="ai.onnx.ml", norm="L1"),
                   [("x", F, [2, 3])], [("y", F, None)])
    x = np.array([[1, -2, 3], [0, 4, 4]], np.float32)
    with pytest.warns(MissingOpsetWarning, match=r"'ai.onnx.ml'.*opset 5"):
        prepared = onnx_mini.prepare(m)
    # L1: each row over the sum of its absolute values (6 and 8)
    np.testing.assert_allclose(prepared.run([x])[0], [[1 / 6, -2 / 6, 3 / 6], [0, 0.5, 0.5]], rtol=1e-6)


def test_microsoft_node_without_its_opset_import_runs_and_warns():
    node = helper.make_node("FusedMatMul", ["a", "b"], ["y"], domain="com.microsoft", alpha=0.5, transB=1)
    m = unimported(node, [("a", F, [1, 2]), ("b", F, [2, 2])], [("y", F, None)])
    a = np.array([[1, 2]], np.float32)
    b = np.array([[3, 4], [5, 6]], np.float32)
    with pytest.warns(MissingOpsetWarning, match=r"'com.microsoft'.*opset 1"):
        sess = InferenceSession(m.SerializeToString())
    # 0.5 * a @ b.T = 0.5 * [1*3 + 2*4, 1*5 + 2*6] = [5.5, 8.5]
    np.testing.assert_array_equal(sess.run(None, {"a": a, "b": b})[0], [[5.5, 8.5]])


def test_info_counts_a_node_of_an_unimported_domain_as_running(tmp_path, capsys):
    m = unimported(helper.make_node("Gelu", ["x"], ["y"], domain="com.microsoft"), [("x", F, [1])], [("y", F, None)])
    path = tmp_path / "gelu.onnx"
    onnx.save(m, path)
    assert main(["info", str(path)]) == 0
    out = capsys.readouterr().out
    gelu = [line for line in out.splitlines() if "Gelu" in line]
    assert gelu and "missing" not in gelu[0] and "kernel" in gelu[0], out


def test_the_warning_points_at_the_callers_line():
    m = unimported(helper.make_node("Gelu", ["x"], ["y"], domain="com.microsoft"), [("x", F, [1])], [("y", F, None)])
    with pytest.warns(MissingOpsetWarning) as caught:
        onnx_mini.prepare(m)
    assert [w.filename for w in caught] == [__file__]


def test_a_function_importing_the_domain_itself_needs_no_implied_opset():
    body = [helper.make_node("Normalizer", ["a"], ["b"], domain="ai.onnx.ml", norm="L1")]
    fn = helper.make_function("local", "L1", ["a"], ["b"], body,
                              [helper.make_opsetid("", 13), helper.make_opsetid("ai.onnx.ml", 1)])
    m = model([helper.make_node("L1", ["x"], ["y"], domain="local")], [("x", F, [1, 2])], [("y", F, None)],
              opset=[helper.make_opsetid("", 13), helper.make_opsetid("local", 1)], functions=[fn])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prepared = onnx_mini.prepare(m)
    np.testing.assert_allclose(prepared.run([np.array([[1, 3]], np.float32)])[0], [[0.25, 0.75]])


def test_one_warning_per_missing_domain_per_prepare():
    nodes = [helper.make_node("Gelu", ["x"], ["g1"], domain="com.microsoft"),
             helper.make_node("Gelu", ["g1"], ["g2"], domain="com.microsoft"),
             helper.make_node("Normalizer", ["g2"], ["y"], domain="ai.onnx.ml", norm="MAX")]
    m = unimported(nodes, [("x", F, [1, 2])], [("y", F, None)])
    for _ in range(2):                           # a second prepare warns again, once per domain
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            prepared = onnx_mini.prepare(m)
        domains = sorted(str(w.message).split("'")[1] for w in caught if w.category is MissingOpsetWarning)
        assert domains == ["ai.onnx.ml", "com.microsoft"]
    # Gelu(x) = x * Phi(x); MAX divides by the row's largest value: Gelu(0) = 0, the larger one gives 1
    np.testing.assert_allclose(prepared.run([np.array([[0, 2]], np.float32)])[0], [[0, 1]], atol=1e-7)


def test_the_implied_ml_opset_is_the_newest_like_onnxruntime():
    # keys_tensor / values_tensor exist only from LabelEncoder-4: onnxruntime runs this node without an
    # ai.onnx.ml import, so it assumes the newest ai.onnx.ml opset, not version 1
    node = helper.make_node("LabelEncoder", ["x"], ["y"], domain="ai.onnx.ml",
                            keys_tensor=onnx.numpy_helper.from_array(np.array([1, 2], np.int64)),
                            values_tensor=onnx.numpy_helper.from_array(np.array([10, 20], np.int64)),
                            default_tensor=onnx.numpy_helper.from_array(np.array([-1], np.int64)))
    m = unimported(node, [("x", TensorProto.INT64, [3])], [("y", TensorProto.INT64, None)])
    x = np.array([2, 7, 1], np.int64)
    with pytest.warns(MissingOpsetWarning):
        got = onnx_mini.prepare(m).run([x])[0]
    np.testing.assert_array_equal(got, [20, -1, 10])
    if HAS_ORT:
        np.testing.assert_array_equal(ort_session(m).run(None, {"x": x})[0], got)


def test_a_domain_used_only_in_a_subgraph_is_implied_too():
    then = helper.make_graph([helper.make_node("Normalizer", ["x"], ["t"], domain="ai.onnx.ml", norm="L1")],
                             "then", [], [helper.make_tensor_value_info("t", F, None)])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", F, None)])
    node = helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)
    m = unimported(node, [("c", TensorProto.BOOL, []), ("x", F, [1, 2])], [("y", F, None)])
    with pytest.warns(MissingOpsetWarning, match="ai.onnx.ml"):
        prepared = onnx_mini.prepare(m)
    np.testing.assert_allclose(prepared.run([np.array(True), np.array([[1, 3]], np.float32)])[0], [[0.25, 0.75]])


def test_no_warning_when_the_domain_is_imported():
    m = model([helper.make_node("Normalizer", ["x"], ["y"], domain="ai.onnx.ml", norm="L1")],
              [("x", F, [1, 2])], [("y", F, None)],
              opset=[helper.make_opsetid("", 13), helper.make_opsetid("ai.onnx.ml", 1)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        onnx_mini.prepare(m)


def test_an_unknown_domain_still_needs_its_import():
    m = unimported(helper.make_node("Frobnicate", ["x"], ["y"], domain="com.example"),
                   [("x", F, [1])], [("y", F, None)])
    with pytest.raises(UnsupportedOperatorError, match="imports no opset for domain 'com.example'"):
        onnx_mini.prepare(m)


# -- string inputs given as object arrays of other values -----------------------------------------------

def identity_strings() -> onnx.ModelProto:
    return model([helper.make_node("Identity", ["x"], ["y"])], [("x", S, None)], [("y", S, None)], opset=13)


def test_string_input_elements_become_their_str():
    values = ["a", np.nan, 5, None, 5.0, True, np.float32(1.5), np.int64(7), "é"]
    x = np.empty(len(values), dtype=object)
    x[:] = values
    kept = list(x)
    (y,) = onnx_mini.prepare(identity_strings()).run([x])
    assert y.dtype == object and y.tolist() == ["a", "nan", "5", "None", "5.0", "True", "1.5", "7", "é"]
    assert all(type(v) is str for v in y)
    assert all(a is b for a, b in zip(x, kept)) and np.isnan(x[1])        # the caller's array is untouched
    if HAS_ORT:
        assert ort_session(identity_strings()).run(None, {"x": x})[0].tolist() == y.tolist()


def test_string_input_shapes_and_lists_are_converted_too():
    prepared = onnx_mini.prepare(identity_strings())
    x = np.array([[1, None], [2.5, "b"]], dtype=object)
    assert prepared.run([x])[0].tolist() == [["1", "None"], ["2.5", "b"]]
    assert prepared.run([np.array(3, dtype=object)])[0].tolist() == "3"        # 0-d
    assert prepared.run([["a", 1, None]])[0].tolist() == ["a", "1", "None"]
    assert prepared.run([np.empty((0, 2), dtype=object)])[0].shape == (0, 2)



def test_one_text_of_a_declared_shape_is_checked_as_a_longer_one():
    # [None, 1], as a text classifier declares it: a single element takes a shorter check than the set
    prepared = onnx_mini.prepare(model([helper.make_node("Identity", ["x"], ["y"])], [("x", S, [None, 1])],
                                       [("y", S, None)], opset=13))
    x = np.array([["a"]], dtype=object)
    y = prepared.run({"x": x})[0]
    assert y.tolist() == [["a"]] and y[0, 0] is x[0, 0] and not y.flags.writeable and x.flags.writeable
    for value, text in [(5, "5"), (None, "None"), (np.str_("b"), "b"), (b"c", "c")]:
        one = np.empty((1, 1), dtype=object)
        one[0, 0] = value
        out = prepared.run({"x": one})[0]
        assert out.tolist() == [[text]] and type(out[0, 0]) is str and one[0, 0] is value
    assert prepared.run({"x": np.array([["a"], [7]], dtype=object)})[0].tolist() == [["a"], ["7"]]
    with pytest.raises(InputError, match="dimension 1 must be 1"):
        prepared.run({"x": np.array([["a", "b"]], dtype=object)})

def test_bytes_elements_are_decoded_as_onnx_strings():
    # UTF-8 bytes are the ONNX string itself (onnxruntime would store "b'...'", which no model's keys
    # match); bytes that are not UTF-8 stay bytes, as in the model's own string tensors
    prepared = onnx_mini.prepare(identity_strings())
    assert prepared.run([np.array([b"ab", "\u00e9".encode(), b"\xff"], dtype=object)])[0].tolist() == \
        ["ab", "\u00e9", b"\xff"]
    assert prepared.run([np.array([b"ab", b"c"])])[0].tolist() == ["ab", "c"]          # a numpy bytes array
    assert prepared.run([np.array(["ab", "c"])])[0].tolist() == ["ab", "c"]            # a numpy str array


def test_string_arrays_of_str_are_not_copied():
    x = np.array(["q", "r"], dtype=object)
    (y,) = onnx_mini.prepare(identity_strings()).run([x])
    assert np.shares_memory(y, x) and not y.flags.writeable


def test_label_encoder_finds_keys_given_as_other_types():
    node = helper.make_node("LabelEncoder", ["x"], ["y"], domain="ai.onnx.ml",
                            keys_strings=["nan", "5", "a", "None", "5.0"], values_int64s=[1, 2, 3, 4, 5],
                            default_int64=-1)
    m = model([node], [("x", S, [6])], [("y", TensorProto.INT64, None)],
              opset=[helper.make_opsetid("", 13), helper.make_opsetid("ai.onnx.ml", 2)])
    x = np.array(["a", np.nan, 5, None, 5.0, "zz"], dtype=object)
    got = onnx_mini.prepare(m).run([x])[0]
    np.testing.assert_array_equal(got, [3, 1, 2, 4, 5, -1])
    if HAS_ORT:
        np.testing.assert_array_equal(ort_session(m).run(None, {"x": x})[0], got)
