"""Spec tests for Softmax, LogSoftmax and Hardmax (1, 11, 13).

Versions 1 and 11 coerce the input to 2-D at `axis` and normalise over the flattened trailing part;
version 13 normalises along one axis. Expected values come from formulas written from the spec in
float64 (rounded to the tested type), or by hand.
"""
from __future__ import annotations

import math
import re

import ml_dtypes
import numpy as np
import pytest

from onnx_mini.errors import KernelError

from helpers import FP4, NODE, assert_same, np_type, run_node, run_op as run, type_matrix

RTOL = {"float16": 2e-3, "bfloat16": 1.6e-2, "float": 1e-6, "double": 1e-13}


def assert_close(got, exp, tname):
    assert type(got) is np.ndarray and got.dtype == exp.dtype and got.shape == exp.shape, \
        (type(got), got.dtype, exp.dtype, got.shape, exp.shape)
    np.testing.assert_allclose(got.astype(np.float64), exp.astype(np.float64), rtol=RTOL[tname], atol=1e-7)


def softmax_ref(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def log_softmax_ref(x, axis):
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


def hardmax_ref(x, axis):
    """1 at the first maximum of each lane along axis (loops, from the spec text)."""
    xm = np.moveaxis(x, axis, -1)
    y = np.zeros_like(xm)
    for pos in np.ndindex(*xm.shape[:-1]):
        lane = list(xm[pos])
        y[pos + (lane.index(max(lane)),)] = 1
    return np.moveaxis(y, -1, axis)


REFS = {"Softmax": softmax_ref, "LogSoftmax": log_softmax_ref, "Hardmax": hardmax_ref}


def reference(op, version, x, axis):
    """The spec's formula on float64 values; versions 1/11 on the [prod(:axis), prod(axis:)] matrix."""
    x64 = x.astype(np.float64)
    if version < 13:
        k = axis % x.ndim
        y = REFS[op](x64.reshape(math.prod(x.shape[:k]), -1), 1).reshape(x.shape)
    else:
        y = REFS[op](x64, axis % x.ndim)
    return y.astype(x.dtype)


def data(tname, shape):
    i = np.arange(math.prod(shape))
    return (np.array(FP4)[(i * 7) % len(FP4)]).astype(np_type(tname)).reshape(shape)


CASES = [(op, p.values[0], p.values[1]) for op in REFS for p in type_matrix(op, [1, 11, 13])]


@pytest.mark.parametrize("op,version,tname", CASES)
def test_every_type_default_axis(op, version, tname):
    x = data(tname, (2, 3, 4))
    got = run(op, version, [x])
    exp = reference(op, version, x, 1 if version < 13 else -1)
    if op == "Hardmax":
        assert_same(got, exp)
    else:
        assert_close(got, exp, tname)


@pytest.mark.parametrize("op", list(REFS))
@pytest.mark.parametrize("version", [1, 11, 13])
@pytest.mark.parametrize("axis", [0, 1, 2, -1, -2, -3])
def test_axes(op, version, axis):
    x = data("double", (2, 3, 4)) * 1.25 + np.arange(24).reshape(2, 3, 4) % 3
    got = run(op, version, [x], axis=axis)
    exp = reference(op, version, x, axis)
    assert_close(got, exp, "double")


def test_version_11_coerces_to_2d_but_13_uses_one_axis():
    x = np.array([[[0.0, 1.0], [2.0, 3.0]]], dtype=np.float32)  # shape (1, 2, 2), axis 1
    e = np.exp(np.arange(4, dtype=np.float64))
    flat = (e / e.sum()).reshape(1, 2, 2)  # all four values normalised together
    per_axis = np.stack([e[[0, 2]] / e[[0, 2]].sum(), e[[1, 3]] / e[[1, 3]].sum()], axis=1).reshape(1, 2, 2)
    for v in (1, 11):
        np.testing.assert_allclose(run("Softmax", v, [x], axis=1), flat.astype(np.float32), rtol=1e-6)
        np.testing.assert_allclose(run("LogSoftmax", v, [x], axis=1), np.log(flat).astype(np.float32), rtol=1e-6)
        assert_same(run("Hardmax", v, [x], axis=1), np.array([[[0, 0], [0, 1]]], np.float32))
    np.testing.assert_allclose(run("Softmax", 13, [x], axis=1), per_axis.astype(np.float32), rtol=1e-6)
    assert_same(run("Hardmax", 13, [x], axis=1), np.array([[[0, 0], [1, 1]]], np.float32))


def test_default_axis_differs_by_version():
    x = np.array([[1.0, 2.0], [3.0, 5.0]], dtype=np.float32)
    assert_same(run("Hardmax", 11, [x]), np.array([[0, 1], [0, 1]], np.float32))    # axis 1: rows
    assert_same(run("Hardmax", 13, [x]), np.array([[0, 1], [0, 1]], np.float32))    # axis -1: rows
    assert_same(run("Hardmax", 13, [x], axis=0), np.array([[0, 0], [1, 1]], np.float32))


@pytest.mark.parametrize("version", [1, 11, 13])
def test_hardmax_first_maximum_wins(version):
    x = np.array([[1, 3, 3], [2, 2, 1], [0, 0, 0]], dtype=np.float32)
    assert_same(run("Hardmax", version, [x], axis=1),
                np.array([[0, 1, 0], [1, 0, 0], [1, 0, 0]], np.float32))


def test_hardmax_bfloat16():
    x = np.array([[1.5, -2, 4, 4]], dtype=ml_dtypes.bfloat16)
    assert_same(run("Hardmax", 13, [x]), np.array([[0, 0, 1, 0]], dtype=ml_dtypes.bfloat16))


@pytest.mark.parametrize("version", [1, 11, 13])
def test_large_numbers_are_stable(version):
    x = np.array([[1000.0, 1001.0, 1002.0], [-1e30, 0.0, 1e30]], dtype=np.float32)
    s = run("Softmax", version, [x])
    l = run("LogSoftmax", version, [x])
    e = np.exp([-2.0, -1.0, 0.0])
    np.testing.assert_allclose(s[0], e / e.sum(), rtol=1e-6)
    np.testing.assert_allclose(l[0], np.log(e / e.sum()), rtol=1e-6)
    assert_same(s[1], np.array([0, 0, 1], np.float32))
    assert_same(l[1], np.array([-2e30, -1e30, 0], np.float32))


@pytest.mark.parametrize("op", list(REFS))
@pytest.mark.parametrize("version", [1, 11, 13])
@pytest.mark.parametrize("shape", [(0, 3), (2, 0), (0,)])
def test_empty(op, version, shape):
    x = np.zeros(shape, np.float32)
    axis = -1
    assert_same(run(op, version, [x], axis=axis), x)


@pytest.mark.parametrize("op", list(REFS))
@pytest.mark.parametrize("version", [1, 11, 13])
def test_axis_out_of_range(op, version):
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(KernelError, match=re.compile(rf"'{NODE}'.*axis 2 is out of range", re.S)):
        run_node(op, version, [x], axis=2)
    with pytest.raises(KernelError, match="axis -3"):
        run(op, version, [x], axis=-3)


@pytest.mark.parametrize("version", [1, 11, 13])
def test_nan_propagates(version):
    x = np.array([[1.0, np.nan, 2.0], [1.0, 2.0, 3.0]], dtype=np.float32)
    s = run("Softmax", version, [x])
    assert np.isnan(s[0]).all() and not np.isnan(s[1]).any()


# -- low-precision floats: computed in float32, rounded once ------------------------------------------

def float32_then_rounded(op, version, x, axis):
    """The spec's formula in float32 (as onnxruntime computes float16), rounded once to x's type."""
    x32 = x.astype(np.float32)
    k = axis % x.ndim
    lanes = x32.reshape(math.prod(x.shape[:k]), -1) if version < 13 else x32
    k = 1 if version < 13 else k
    shifted = lanes - lanes.max(axis=k, keepdims=True)
    total = np.exp(shifted).sum(axis=k, keepdims=True)
    y = np.exp(shifted) / total if op == "Softmax" else shifted - np.log(total)
    return y.reshape(x.shape).astype(x.dtype)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("version", [1, 11, 13])
@pytest.mark.parametrize("axis", [0, 1, 2, -1])
@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_low_precision_is_float32_rounded_once(op, version, axis, dtype):
    # bit for bit; float16 step by step (the function body's reading) was up to ~8 ulp away from this
    x = (np.random.default_rng(version * 10 + axis).standard_normal((4, 5, 64)) * 3).astype(dtype)
    got = run(op, version, [x], axis=axis)
    exp = float32_then_rounded(op, version, x, axis)
    assert got.dtype == exp.dtype
    assert got.view(np.uint16).tolist() == exp.view(np.uint16).tolist()


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("axis", [0, -1])
def test_float16_matches_onnxruntime_bit_for_bit(op, axis):
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper
    x = (np.random.default_rng(1).standard_normal((4, 5, 64)) * 3).astype(np.float16)
    node = helper.make_node(op, ["x"], ["y"], axis=axis)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, None)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert run(op, 13, [x], axis=axis).view(np.uint16).tolist() == want.view(np.uint16).tolist()


@pytest.mark.parametrize("optimize", [True, False])
def test_float16_softmax_after_an_explicit_cast_runs_step_by_step(optimize):
    # Attention's function body states softmax_precision as Cast(to=P) -> Softmax: there the Softmax
    # runs its own function body's form, each step rounded to float16 (as the official data of
    # test_attention_4d_causal_fp16_expanded hold); the same Softmax without the Cast rounds once
    import onnx_mini
    from onnx import TensorProto, helper
    x = (np.random.default_rng(5).standard_normal((4, 64)) * 3).astype(np.float16)
    vi = helper.make_tensor_value_info

    def model(nodes):
        g = helper.make_graph(nodes, "g", [vi("x", TensorProto.FLOAT16, [4, 64])], [vi("y", TensorProto.FLOAT16, None)])
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    cast = model([helper.make_node("Cast", ["x"], ["c"], to=TensorProto.FLOAT16), helper.make_node("Softmax", ["c"], ["y"])])
    plain = model([helper.make_node("Softmax", ["x"], ["y"])])
    # step by step in float16: each numpy operation on float16 arrays rounds to float16
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    stepwise = e / e.sum(axis=-1, keepdims=True)
    got = onnx_mini.prepare(cast, optimize=optimize).run([x])[0]
    assert got.dtype == np.float16 and got.view(np.uint16).tolist() == stepwise.view(np.uint16).tolist()
    once = onnx_mini.prepare(plain, optimize=optimize).run([x])[0]
    assert once.view(np.uint16).tolist() == float32_then_rounded("Softmax", 13, x, -1).view(np.uint16).tolist()
    assert once.view(np.uint16).tolist() != stepwise.view(np.uint16).tolist()   # the two forms differ here
