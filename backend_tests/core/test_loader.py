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


def _external_model(tmp_path, location, data=np.arange(4, dtype=np.float32), offset=0, length=None,
                    node=None):
    t = numpy_helper.from_array(data, "w")
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    length = data.nbytes if length is None else length
    for k, v in (("location", location), ("offset", str(offset)), ("length", str(length))):
        e = t.external_data.add()
        e.key, e.value = k, v
    node = node or helper.make_node("Identity", ["w"], ["y"])
    m = model([node], [], [("y", F, None)], [t])
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


def test_string_list_attributes_decode_as_utf8_and_keep_other_bytes():
    # UTF-8 strings (bytes.decode per element) become str, a list holding any other bytes keeps those
    # as bytes (decode_text per element) rather than failing to load
    node = helper.make_node("Add", ["x", "b"], ["y"])
    node.attribute.append(helper.make_attribute("names", ["leaf", "BRANCH_LEQ", "é€"]))
    node.attribute.append(helper.make_attribute("raw", [b"ok", b"\xff\xfe", "ü".encode()]))
    m = add_model()
    m.graph.node[0].CopyFrom(node)
    attrs = loader.load(m).graph.nodes[0].attrs
    assert attrs["names"] == ["leaf", "BRANCH_LEQ", "é€"]
    assert attrs["raw"] == ["ok", b"\xff\xfe", "ü"]


def test_initializer_is_a_read_only_copy_of_the_proto_values():
    """An initializer may be a view over the bytes protobuf hands out (no second copy), but never over
    the caller's ModelProto: changing the proto afterwards changes nothing loaded."""
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    m = model([helper.make_node("Identity", ["w"], ["y"])], [], [("y", F, [3, 4])], [numpy_helper.from_array(w, "w")])
    got = loader.load(m).graph.initializers["w"]
    m.graph.initializer[0].raw_data = np.zeros(12, np.float32).tobytes()
    assert got.dtype == np.float32 and not got.flags.writeable
    np.testing.assert_array_equal(got, w)


def test_a_large_model_file_loaded_keeps_nothing_of_it(tmp_path):
    """What was loaded from a file of MMAP_THRESHOLD bytes or more (initializers may be views of the
    parsed bytes) must not depend on the file afterwards (overwritten here with zeros of the same size)."""
    w = np.arange(loader.MMAP_THRESHOLD // 4 + 10, dtype=np.float32)
    m = model([helper.make_node("Identity", ["w"], ["y"])], [], [("y", F, [w.size])], [numpy_helper.from_array(w, "w")])
    path = tmp_path / "big.onnx"
    path.write_bytes(m.SerializeToString())
    assert path.stat().st_size >= loader.MMAP_THRESHOLD
    rep = onnx_mini.prepare(str(path))
    got = loader.load(str(path)).graph.initializers["w"]
    path.write_bytes(bytes(path.stat().st_size))
    np.testing.assert_array_equal(got, w)
    np.testing.assert_array_equal(rep.run({})[0], w)


# -- external data hardening --------------------------------------------------------------------

def test_external_data_hard_link_is_rejected(tmp_path):
    inner = tmp_path / "m"
    inner.mkdir()
    (tmp_path / "secret.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    os.link(tmp_path / "secret.bin", inner / "w.bin")
    path, _ = _external_model(inner, "w.bin")
    with pytest.raises(ExternalDataError, match="hard link"):
        onnx_mini.prepare(str(path))


def test_external_data_fifo_is_rejected_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "w.bin")       # opening a FIFO for reading would block forever
    path, _ = _external_model(tmp_path, "w.bin")
    with pytest.raises(ExternalDataError, match="not a regular file"):
        onnx_mini.prepare(str(path))


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_external_data_device_and_directory_are_rejected(tmp_path):
    if os.geteuid() == 0:               # root can make a device node inside the folder
        os.mknod(tmp_path / "zero", 0o600 | __import__("stat").S_IFCHR, os.makedev(1, 5))
        path, _ = _external_model(tmp_path, "zero")
        with pytest.raises(ExternalDataError, match="not a regular file"):
            onnx_mini.prepare(str(path))
    (tmp_path / "d").mkdir()
    for location in ("d", ".", "d/."):
        path, _ = _external_model(tmp_path, location)
        with pytest.raises(ExternalDataError):
            onnx_mini.prepare(str(path))


@pytest.mark.parametrize("offset,length,match", [
    (12, None, "holds 16 bytes, 16 needed at offset 12"),         # runs past the end of the file
    (10**15, None, "offset"),                                      # far past the end
    (0, 8, "length 8 does not match"),                             # shorter than the tensor
    (0, 10**12, "length 1000000000000 does not match"),            # longer than the tensor
    (-4, None, "negative"),
    ("x", None, "bad offset"),
])
def test_external_data_offset_and_length_are_checked_before_reading(tmp_path, offset, length, match):
    path, data = _external_model(tmp_path, "w.bin", offset=offset, length=length)
    (tmp_path / "w.bin").write_bytes(data.tobytes())
    with pytest.raises(ExternalDataError, match=match):
        onnx_mini.prepare(str(path))


def test_external_data_at_an_offset(tmp_path):
    path, data = _external_model(tmp_path, "w.bin", offset=3)
    (tmp_path / "w.bin").write_bytes(b"abc" + data.tobytes() + b"tail")
    np.testing.assert_array_equal(onnx_mini.prepare(str(path)).run([])[0], data)


def test_external_data_from_bytes_or_proto_needs_base_dir(tmp_path):
    path, data = _external_model(tmp_path, "w.bin")
    (tmp_path / "w.bin").write_bytes(data.tobytes())
    raw = path.read_bytes()
    for source in (raw, onnx.load_model_from_string(raw), io.BytesIO(raw)):
        with pytest.raises(ExternalDataError, match="base_dir="):
            onnx_mini.prepare(source)
        np.testing.assert_array_equal(onnx_mini.prepare(source if not isinstance(source, io.BytesIO)
                                                        else io.BytesIO(raw), base_dir=str(tmp_path)).run([])[0],
                                      data)


def test_large_external_data_is_memory_mapped_read_only(tmp_path):
    data = np.arange(1 << 19, dtype=np.float32)            # 2 MiB: above the mmap threshold
    path, _ = _external_model(tmp_path, "w.bin", data=data, offset=5)
    (tmp_path / "w.bin").write_bytes(b"12345" + data.tobytes())
    w = loader.load(str(path)).graph.initializers["w"]
    assert not w.flags.writeable and not w.flags.owndata
    np.testing.assert_array_equal(w, data)


def test_external_string_tensor_is_rejected(tmp_path):
    t = helper.make_tensor("w", TensorProto.STRING, [1], [b"a"])
    t.ClearField("string_data")
    t.data_location = TensorProto.EXTERNAL
    e = t.external_data.add()
    e.key, e.value = "location", "w.bin"
    (tmp_path / "w.bin").write_bytes(b"a")
    m = model([helper.make_node("Identity", ["w"], ["y"])], [], [("y", TensorProto.STRING, [1])], [t])
    with pytest.raises(ExternalDataError, match="string"):
        onnx_mini.prepare(m, base_dir=str(tmp_path))


def test_model_path_must_be_a_regular_file(tmp_path):
    os.mkfifo(tmp_path / "m.onnx")
    with pytest.raises(ModelLoadError, match="regular file"):
        onnx_mini.prepare(str(tmp_path / "m.onnx"))


_RSS_SCRIPT = """
import resource, sys
import numpy as np
import onnx_mini
peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
before = peak()
(y,) = onnx_mini.prepare(sys.argv[1]).run([])
loaded = peak()
print(y.shape[0], float(y.max()), loaded - before, peak() - before)
"""


def test_external_data_of_300_mb_is_mapped_not_copied(tmp_path):
    """300 MiB of external data: loading and running an Identity on it maps the file (no page is
    read until used); reading every element afterwards costs the pages once, never twice."""
    import subprocess
    import sys
    n = 300 * 2**20 // 4
    chunk = np.ones(1 << 20, np.float32)           # 300 MiB = 75 chunks of 4 MiB
    with open(tmp_path / "w.bin", "wb") as f:
        for _ in range(n // chunk.size):
            f.write(chunk.tobytes())
    path, _ = _external_model(tmp_path, "w.bin", data=np.empty(0, np.float32))
    m = onnx.load(str(path), load_external_data=False)
    m.graph.initializer[0].dims[:] = [n]
    next(e for e in m.graph.initializer[0].external_data if e.key == "length").value = str(n * 4)
    onnx.save(m, str(path))
    out = subprocess.run([sys.executable, "-c", _RSS_SCRIPT, str(path)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    size, value, loaded, touched = out.stdout.split()
    assert (int(size), float(value)) == (n, 1.0)
    assert int(loaded) < 0.1 * n * 4, f"loading grew peak RSS by {int(loaded) / 2**20:.0f} MiB"
    assert int(touched) < 1.3 * n * 4, f"reading grew peak RSS by {int(touched) / 2**20:.0f} MiB"


@pytest.mark.parametrize("dt", [np.float32, np.float64, np.int64, np.float16, np.uint8])
def test_raw_data_arrays_carry_the_canonical_dtype_object(dt):
    """raw_data is read as little-endian ('<f4'), which equals float32 but is another object: the loader
    hands out the canonical one, so kernels' `a.dtype is b.dtype` fast paths hold for weights too."""
    import onnx.numpy_helper as nh
    a = dtypes.tensor_to_array(nh.from_array(np.arange(6).astype(dt).reshape(2, 3), "w"))
    assert a.dtype is np.dtype(dt)
    np.testing.assert_array_equal(a, np.arange(6).astype(dt).reshape(2, 3))
