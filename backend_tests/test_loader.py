"""Loader: model sources, IR versions, initializer-inputs (IR 3), sparse initializers, external data."""
import io
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_mini
from onnx_mini import dtypes, loader
from onnx_mini.errors import ExternalDataError, ModelLoadError

from helpers import F, model


def add_model(**kw):
    return model([helper.make_node("Add", ["x", "b"], ["y"])], [("x", F, [2])], [("y", F, [2])],
                 [numpy_helper.from_array(np.array([10, 20], np.float32), "b")], **kw)


def test_every_source_kind(tmp_path):
    m = add_model()
    path = tmp_path / "m.onnx"
    onnx.save(m, path)
    x = np.array([1, 2], np.float32)
    for source in (m, str(path), path, m.SerializeToString(), io.BytesIO(m.SerializeToString()), open(path, "rb")):
        (y,) = onnx_mini.prepare(source).run([x])
        np.testing.assert_array_equal(y, [11, 22])


def test_caller_model_is_not_mutated():
    m = add_model()
    before = m.SerializeToString()
    onnx_mini.prepare(m).run([np.array([1, 2], np.float32)])
    assert m.SerializeToString() == before


@pytest.mark.parametrize("ir", [2, 15])
def test_ir_version_out_of_range(ir):
    with pytest.raises(ModelLoadError, match="IR version"):
        onnx_mini.prepare(add_model(ir_version=ir))


@pytest.mark.parametrize("ir", [3, 4, 9, 14])
def test_ir_versions_in_range(ir):
    (y,) = onnx_mini.prepare(add_model(ir_version=ir, opset=7)).run([np.array([1, 2], np.float32)])
    np.testing.assert_array_equal(y, [11, 22])


def test_garbage_bytes():
    with pytest.raises(ModelLoadError):
        onnx_mini.prepare(b"\xff\x00 definitely not protobuf")


def test_ir3_initializer_inputs_are_optional_with_default():
    # IR 3 style: the initializer 'b' is also listed as a graph input.
    m = model([helper.make_node("Add", ["x", "b"], ["y"])], [("x", F, [2]), ("b", F, [2])], [("y", F, [2])],
              [numpy_helper.from_array(np.array([10, 20], np.float32), "b")], opset=6, ir_version=3)
    rep = onnx_mini.prepare(m)
    assert rep.input_names == ["x"]
    x = np.array([1, 2], np.float32)
    np.testing.assert_array_equal(rep.run([x])[0], [11, 22])                       # positional: x only
    np.testing.assert_array_equal(rep.run({"x": x})[0], [11, 22])                   # default used
    np.testing.assert_array_equal(rep.run({"x": x, "b": np.ones(2, np.float32)})[0], [2, 3])  # override
    np.testing.assert_array_equal(rep.run([x, np.ones(2, np.float32)])[0], [2, 3])  # one per graph input


def test_initializer_backed_inputs_fold_until_a_run_overrides_them():
    # b + b depends only on an initializer-backed input: folded in the main plan, recomputed when fed.
    nodes = [helper.make_node("Add", ["b", "b"], ["bb"]), helper.make_node("Add", ["x", "bb"], ["y"])]
    m = model(nodes, [("x", F, [2]), ("b", F, [2])], [("y", F, [2])],
              [numpy_helper.from_array(np.array([10, 20], np.float32), "b")], opset=6, ir_version=3)
    rep = onnx_mini.prepare(m)
    x, ones = np.array([1, 2], np.float32), np.ones(2, np.float32)
    assert len(rep.plan.steps) == 1
    np.testing.assert_array_equal(rep.run({"x": x})[0], [21, 42])
    np.testing.assert_array_equal(rep.run({"x": x, "b": ones})[0], [3, 4])
    np.testing.assert_array_equal(rep.run([x, ones])[0], [3, 4])
    np.testing.assert_array_equal(rep.run({"x": x})[0], [21, 42])          # the default again
    sess = onnx_mini.InferenceSession(m)
    assert [v.tolist() for v in sess.run(["bb", "y"], {"x": x, "b": ones})] == [[2, 2], [3, 4]]
    assert [v.tolist() for v in sess.run(["bb", "y"], {"x": x})] == [[20, 40], [21, 42]]
    assert len(onnx_mini.prepare(m, optimize=False).plan.steps) == 2


def test_sparse_initializer_and_sparse_constant():
    values = numpy_helper.from_array(np.array([5, 7], np.float32), "s")
    linear = numpy_helper.from_array(np.array([1, 4], np.int64))
    coords = numpy_helper.from_array(np.array([[0, 1], [1, 1]], np.int64))
    sparse_init = helper.make_sparse_tensor(values, linear, [2, 3])
    sparse_attr = helper.make_sparse_tensor(numpy_helper.from_array(np.array([5, 7], np.float32), "c"),
                                            coords, [2, 3])
    m = model([helper.make_node("Constant", [], ["c"], sparse_value=sparse_attr),
               helper.make_node("Add", ["s", "c"], ["y"])], [], [("y", F, [2, 3])])
    m.graph.sparse_initializer.append(sparse_init)
    (y,) = onnx_mini.prepare(m).run([])
    expected = np.zeros((2, 3), np.float32)
    expected.flat[[1, 4]] += [5, 7]
    expected[0, 1] += 5
    expected[1, 1] += 7
    np.testing.assert_array_equal(y, expected)


def _external_model(tmp_path, location, data=np.arange(4, dtype=np.float32)):
    t = numpy_helper.from_array(data, "w")
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", "0"), ("length", str(data.nbytes))):
        e = t.external_data.add()
        e.key, e.value = k, v
    m = model([helper.make_node("Identity", ["w"], ["y"])], [], [("y", F, [4])], [t])
    path = tmp_path / "model.onnx"
    path.write_bytes(m.SerializeToString())
    return path, data


def test_external_data_relative_to_model_folder(tmp_path):
    (tmp_path / "sub").mkdir()
    path, data = _external_model(tmp_path, "sub/weights.bin")
    (tmp_path / "sub" / "weights.bin").write_bytes(b"\0" * 0 + data.tobytes())
    np.testing.assert_array_equal(onnx_mini.prepare(str(path)).run([])[0], data)


@pytest.mark.parametrize("location", ["/etc/passwd", "../secret.bin", "sub/../../secret.bin"])
def test_external_data_escapes_are_rejected(tmp_path, location):
    inner = tmp_path / "m"
    inner.mkdir()
    (tmp_path / "secret.bin").write_bytes(b"\0" * 16)
    path, _ = _external_model(inner, location)
    with pytest.raises(ExternalDataError):
        onnx_mini.prepare(str(path))


def test_external_data_symlink_leaving_folder_is_rejected(tmp_path):
    inner = tmp_path / "m"
    inner.mkdir()
    (tmp_path / "secret.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    os.symlink(tmp_path / "secret.bin", inner / "w.bin")
    path, _ = _external_model(inner, "w.bin")
    with pytest.raises(ExternalDataError, match="outside"):
        onnx_mini.prepare(str(path))


def test_external_data_short_file_and_unknown_folder(tmp_path):
    path, data = _external_model(tmp_path, "w.bin")
    (tmp_path / "w.bin").write_bytes(data.tobytes()[:5])
    with pytest.raises(ExternalDataError, match="5 bytes"):
        onnx_mini.prepare(str(path))
    with pytest.raises(ExternalDataError, match="folder is unknown"):
        onnx_mini.prepare(path.read_bytes())


# -- dtypes: every element type through both encodings ------------------------------------------

def _sample(elem):
    dt = dtypes.NP_DTYPE[elem]
    if elem == TensorProto.STRING:
        return np.array([["a", "bé"], ["", "z"]], dtype=object)
    if elem == TensorProto.BOOL:
        return np.array([[True, False], [False, True]])
    if dt.kind == "c":
        return np.array([[1 + 2j, -3.5j], [0, 4]], dtype=dt)
    if dt.kind in "iu":
        return np.array([[0, 1], [2, 3]], dtype=dt) if dt.kind == "u" else np.array([[-1, 0], [1, -2]], dtype=dt)
    if elem in (TensorProto.INT4, TensorProto.INT2):
        return np.array([[-2, -1], [0, 1]]).astype(dt)
    if elem in (TensorProto.UINT4, TensorProto.UINT2):
        return np.array([[0, 1], [2, 3]]).astype(dt)
    values = [[0.5, -1.0], [2.0, 0.0]] if "e8m0" not in dt.name else [[0.5, 1.0], [2.0, 4.0]]
    return np.array(values, dtype=np.float32).astype(dt)


@pytest.mark.parametrize("elem", sorted(dtypes.NP_DTYPE), ids=dtypes.type_name)
@pytest.mark.parametrize("shape", [(2, 2), (3,), (0,)], ids=str)
def test_dtype_round_trip(elem, shape):
    a = _sample(elem).reshape(-1)[: shape[0]] if shape != (2, 2) else _sample(elem)
    if shape == (3,):
        a = _sample(elem).reshape(-1)[:3]   # odd count exercises partial packed bytes
    back = dtypes.tensor_to_array(dtypes.array_to_tensor(a, "t"))
    assert back.dtype == a.dtype and back.shape == a.shape
    assert back.tobytes() == a.tobytes() if a.dtype != object else back.tolist() == a.tolist()
    # and the typed-field encoding written by onnx.helper.make_tensor
    vals = [s.encode() for s in a.flat] if a.dtype == object else a.reshape(-1).tolist()
    typed = helper.make_tensor("t", elem, a.shape, vals)
    back2 = dtypes.tensor_to_array(typed)
    assert back2.dtype == a.dtype
    assert back2.tobytes() == a.tobytes() if a.dtype != object else back2.tolist() == a.tolist()


def test_packed_int4_layout_low_nibble_first():
    # bytes 0x8F, 0x07 -> codes 0xF (-1), 0x8 (-8), 0x7 (7): element 0 in the low nibble
    t = TensorProto()
    t.data_type, t.raw_data = TensorProto.INT4, bytes([0x8F, 0x07])
    t.dims.extend([3])
    np.testing.assert_array_equal(dtypes.tensor_to_array(t).astype(np.int8), [-1, -8, 7])


def test_raw_data_size_mismatch():
    t = numpy_helper.from_array(np.zeros(3, np.float32))
    t.raw_data = t.raw_data[:-1]
    with pytest.raises(ModelLoadError, match="11 bytes"):
        dtypes.tensor_to_array(t)


def test_load_returns_plain_objects():
    m = loader.load(add_model())
    assert m.graph.nodes[0].op_type == "Add" and m.opsets == {"": 21}
    assert not m.graph.initializers["b"].flags.writeable
