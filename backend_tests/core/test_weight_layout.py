"""weight_layout.py: a constant matrix only MatMul / Gemm read as their right operand is stored in the
memory order their one-row products read faster (N rows of K unless N > 2K), with its values and shape,
whether the graph is optimised or not; others keep the loader's order; external data mapped from a file
is not copied."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_mini
from onnx_mini import blas

F = TensorProto.FLOAT


def rand(*shape, seed=0):
    return np.random.default_rng(seed + sum(shape)).standard_normal(shape).astype(np.float32)


def model(nodes, inputs, outputs, inits):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, F, s) for n, s in inputs],
                          [helper.make_tensor_value_info(n, F, None) for n in outputs], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def stored(prepared, name):
    return prepared.model.graph.initializers[name]


@pytest.fixture
def any_size(monkeypatch):
    """Small matrices laid out too (the tests' matrices are below blas.LAYOUT_MIN_BYTES)."""
    monkeypatch.setattr(blas, "LAYOUT_MIN_BYTES", 0)


def test_the_rule():
    assert blas.reads_as_rows(768, 768) and blas.reads_as_rows(3072, 768) and blas.reads_as_rows(512, 1024)
    assert not blas.reads_as_rows(512, 1025) and not blas.reads_as_rows(768, 3072)


@pytest.mark.parametrize("optimize", [True, False])
@pytest.mark.parametrize("k, n, fortran", [(96, 64, True), (64, 128, True), (32, 96, False)])
def test_matmul_weights(any_size, optimize, k, n, fortran):
    w = rand(k, n)
    m = model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", [None, k])], ["y"],
              [numpy_helper.from_array(w, "w")])
    p = onnx_mini.prepare(m, optimize=optimize)
    laid = stored(p, "w")
    assert laid.flags.f_contiguous == fortran and laid.flags.c_contiguous != fortran
    np.testing.assert_array_equal(laid, w)                       # the values and shape, as written
    for rows in (1, 5):
        x = rand(rows, k, seed=rows)
        (y,) = p.run([x])
        np.testing.assert_allclose(y, x.astype(np.float64) @ w.astype(np.float64), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("trans_b, shape, fortran", [(1, (200, 64), True),    # B' [64, 200]: N > 2K
                                                     (1, (64, 96), False),     # B' [96, 64]: rows of K = B as is
                                                     (0, (96, 64), True)])
def test_gemm_weights(any_size, trans_b, shape, fortran):
    w, c = rand(*shape), rand(shape[0] if trans_b else shape[1])
    k = shape[1] if trans_b else shape[0]
    m = model([helper.make_node("Gemm", ["x", "w", "c"], ["y"], transB=trans_b, alpha=0.5)], [("x", [1, k])], ["y"],
              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(c, "c")])
    p = onnx_mini.prepare(m)
    assert stored(p, "w").flags.f_contiguous == fortran
    x = rand(1, k)
    wt = w.T if trans_b else w
    np.testing.assert_allclose(p.run([x])[0], 0.5 * (x.astype(np.float64) @ wt) + c, rtol=1e-5, atol=1e-5)


def test_other_readers_keep_the_order(any_size):
    # read by a MatMul and by an Add: left as loaded; read by two MatMuls that agree: laid out once
    w, v = rand(96, 64), rand(96, 64, seed=1)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Add", ["w", "w"], ["q"]),
             helper.make_node("MatMul", ["x", "v"], ["r"]), helper.make_node("MatMul", ["z", "v"], ["s"])]
    m = model(nodes, [("x", [1, 96]), ("z", [3, 96])], ["p", "q", "r", "s"],
              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(v, "v")])
    p = onnx_mini.prepare(m)
    assert stored(p, "w").flags.c_contiguous and stored(p, "v").flags.f_contiguous
    x, z = rand(1, 96), rand(3, 96, seed=2)
    got = p.run({"x": x, "z": z})
    for g, want in zip(got, (x @ w, w + w, x @ v, z @ v)):
        np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-5)


def test_small_matrices_keep_the_order():
    small, large = rand(256, 256), rand(768, 512)          # 256 KB and 1.5 MB (blas.LAYOUT_MIN_BYTES: 1 MB)
    nodes = [helper.make_node("MatMul", ["x", "s"], ["p"]), helper.make_node("MatMul", ["y", "l"], ["q"])]
    m = model(nodes, [("x", [1, 256]), ("y", [1, 768])], ["p", "q"],
              [numpy_helper.from_array(small, "s"), numpy_helper.from_array(large, "l")])
    p = onnx_mini.prepare(m)
    assert stored(p, "s").flags.c_contiguous and stored(p, "l").flags.f_contiguous
    x, y = rand(1, 256), rand(1, 768)
    got = p.run({"x": x, "y": y})
    np.testing.assert_allclose(got[1], y.astype(np.float64) @ large, rtol=1e-5, atol=1e-3)   # sums of 768


def test_mapped_external_data_is_not_copied(tmp_path):
    k = n = 1024                                       # 4 MB: the loader maps it (MMAP_THRESHOLD)
    w = rand(k, n)
    t = numpy_helper.from_array(w, "w")
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "w.bin"), ("offset", "0"), ("length", str(w.nbytes))):
        e = t.external_data.add()
        e.key, e.value = key, value
    (tmp_path / "w.bin").write_bytes(w.tobytes())
    m = model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", [1, k])], ["y"], [t])
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    p = onnx_mini.prepare(str(path))
    assert stored(p, "w").flags.c_contiguous            # still the mapping, not a Fortran-ordered copy
    x = rand(1, k)
    np.testing.assert_allclose(p.run([x])[0], x.astype(np.float64) @ w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("other, laid", [("MatMul", True), ("Add", False), ("Identity", False)])
def test_weights_read_inside_if_branches(any_size, other, laid):
    # a merged decoder's form: both branches of an If multiply by the outer weights. Laid out when every
    # reader is such a product; left alone when a branch adds it, or hands it on as its output
    w = rand(96, 64)

    def branch(op, tag):
        if op == "MatMul":
            node = helper.make_node("MatMul", ["x", "w"], [f"y_{tag}"])
        elif op == "Add":
            node = helper.make_node("Add", ["w", "w"], [f"y_{tag}"])
        else:
            return helper.make_graph([], tag, [], [helper.make_tensor_value_info("w", F, None)])
        return helper.make_graph([node], tag, [], [helper.make_tensor_value_info(f"y_{tag}", F, None)])
    node = helper.make_node("If", ["c"], ["y"], then_branch=branch("MatMul", "then"), else_branch=branch(other, "else"))
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                                        helper.make_tensor_value_info("x", F, [1, 96])],
                          [helper.make_tensor_value_info("y", F, None)], [numpy_helper.from_array(w, "w")])
    p = onnx_mini.prepare(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    assert stored(p, "w").flags.f_contiguous == laid
    x = rand(1, 96)
    np.testing.assert_allclose(p.run({"c": np.array(True), "x": x})[0], x.astype(np.float64) @ w, rtol=1e-5,
                               atol=1e-5)


def test_inference_session_lays_out_too():
    w = rand(768, 512)                                  # 1.5 MB, read as B: Fortran-ordered
    m = model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", [1, 768])], ["y"],
              [numpy_helper.from_array(w, "w")])
    s = onnx_mini.InferenceSession(m.SerializeToString())
    assert stored(s.prepared, "w").flags.f_contiguous
    x = rand(1, 768)
    np.testing.assert_allclose(s.run(None, {"x": x})[0], x.astype(np.float64) @ w, rtol=1e-5, atol=1e-3)
