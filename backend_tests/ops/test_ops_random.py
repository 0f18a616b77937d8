"""Spec tests for the random generators: RandomNormal, RandomNormalLike, RandomUniform, RandomUniformLike
(1, 22), Multinomial (7, 22), Bernoulli (15, 22).

Values are random, so the tests check what the spec and our seed rule fix: shapes and dtypes (every
type of every version), the distribution's moments over 10^5 draws within loose bounds, seeded runs
equal across runs and across separately prepared copies, unseeded runs different, no constant
folding, and errors naming the node.
"""
from __future__ import annotations

import numpy as np
import onnx_mini
import pytest
from onnx import TensorProto, helper

from onnx_mini.errors import InvalidNodeError, KernelError

from helpers import NODE, attribute, elem_type, np_type, raises_naming_node, run_node, type_params, versions

N = 100_000


def prepared(op, version, inputs=(), **attrs):
    """A one-node model (node NODE) prepared once: inputs are [(name, array)]; returns run(*arrays)."""
    node = helper.make_node(op, [n for n, _ in inputs], ["out"], name=NODE)
    node.attribute.extend(attribute(k, v) for k, v in attrs.items())
    declared = [helper.make_tensor_value_info(n, elem_type(x.dtype), x.shape) for n, x in inputs]
    graph = helper.make_graph([node], "g", declared, [helper.make_empty_tensor_value_info("out")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", version)], ir_version=10)
    rep = onnx_mini.prepare(model)
    return lambda *xs: rep.run(list(xs))[0]


def test_versions_listed():
    assert versions("RandomNormal") == versions("RandomUniform") == [1, 22]
    assert versions("RandomNormalLike") == versions("RandomUniformLike") == [1, 22]
    assert versions("Multinomial") == [7, 22] and versions("Bernoulli") == [15, 22]


# -- RandomNormal / RandomUniform -------------------------------------------------------------------

@pytest.mark.parametrize("op", ["RandomNormal", "RandomUniform"])
@pytest.mark.parametrize("version,tname", type_params("RandomNormal", [1, 22]))
def test_generator_every_dtype(op, version, tname):
    out = run_node(op, version, [], shape=[2, 3, 4], dtype=getattr(TensorProto, tname.upper()), seed=3.0)
    assert type(out) is np.ndarray and out.dtype == np_type(tname) and out.shape == (2, 3, 4)
    assert np.isfinite(out.astype(np.float32)).all()


@pytest.mark.parametrize("op", ["RandomNormal", "RandomUniform"])
@pytest.mark.parametrize("version", [1, 22])
def test_generator_default_dtype_is_float(op, version):
    out = run_node(op, version, [], shape=[5])
    assert out.dtype == np.float32 and out.shape == (5,)


@pytest.mark.parametrize("version", [1, 22])
@pytest.mark.parametrize("mean,scale", [(0.0, 1.0), (3.0, 0.5), (-2.0, 4.0)])
def test_random_normal_moments(version, mean, scale):
    out = run_node("RandomNormal", version, [], shape=[N], mean=mean, scale=scale, dtype=TensorProto.DOUBLE)
    assert out.dtype == np.float64
    assert abs(out.mean() - mean) < 0.02 * scale
    assert abs(out.std() - scale) < 0.02 * scale
    # a normal sample has ~68% of its values within one standard deviation
    assert abs(np.mean(np.abs(out - mean) < scale) - 0.6827) < 0.01


@pytest.mark.parametrize("version", [1, 22])
@pytest.mark.parametrize("low,high", [(0.0, 1.0), (-3.0, 5.0), (10.0, 10.5)])
def test_random_uniform_moments(version, low, high):
    out = run_node("RandomUniform", version, [], shape=[N], low=low, high=high, dtype=TensorProto.DOUBLE)
    width = high - low
    assert out.min() >= low and out.max() < high
    assert abs(out.mean() - (low + high) / 2) < 0.01 * width
    assert abs(out.var() - width ** 2 / 12) < 0.02 * width ** 2 / 12
    hist, _ = np.histogram(out, bins=10, range=(low, high))
    assert (np.abs(hist / N - 0.1) < 0.01).all()


@pytest.mark.parametrize("op", ["RandomNormal", "RandomUniform"])
def test_generator_scalar_and_empty_shapes(op):
    assert run_node(op, 22, [], shape=[]).shape == ()
    assert run_node(op, 22, [], shape=[3, 0]).shape == (3, 0)


# -- seeds ------------------------------------------------------------------------------------------

SEEDED = [  # (op, version, inputs, attributes)
    ("RandomNormal", 1, [], {"shape": [4, 5]}),
    ("RandomNormal", 22, [], {"shape": [4, 5], "dtype": TensorProto.DOUBLE}),
    ("RandomUniform", 22, [], {"shape": [20]}),
    ("RandomNormalLike", 22, [("x", np.zeros((3, 4), np.float32))], {}),
    ("RandomUniformLike", 1, [("x", np.zeros((3, 4), np.float64))], {}),
    ("Multinomial", 22, [("x", np.log(np.full((3, 5), 0.2, np.float32)))], {"sample_size": 20}),
    ("Bernoulli", 22, [("x", np.full((30,), 0.5, np.float32))], {}),
]


@pytest.mark.parametrize("op,version,inputs,attrs", SEEDED, ids=[f"{c[0]}-{c[1]}" for c in SEEDED])
def test_seed_reproducible_across_runs_and_prepares(op, version, inputs, attrs):
    arrays = [x for _, x in inputs]
    first = prepared(op, version, inputs, seed=7.0, **attrs)
    second = prepared(op, version, inputs, seed=7.0, **attrs)
    a, b, c = first(*arrays), first(*arrays), second(*arrays)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, c)
    other = prepared(op, version, inputs, seed=7.5, **attrs)(*arrays)
    assert a.dtype == other.dtype and a.shape == other.shape and not np.array_equal(a, other)


@pytest.mark.parametrize("op,version,inputs,attrs", SEEDED, ids=[f"{c[0]}-{c[1]}" for c in SEEDED])
def test_no_seed_gives_fresh_values(op, version, inputs, attrs):
    arrays = [x for _, x in inputs]
    run = prepared(op, version, inputs, **attrs)
    a, b = run(*arrays), run(*arrays)
    assert a.shape == b.shape and not np.array_equal(a, b)
    assert not np.array_equal(a, prepared(op, version, inputs, **attrs)(*arrays))


def test_not_constant_folded_with_initializer_input():
    # RandomUniformLike of an initializer: every input is constant, yet each run must draw anew.
    node = helper.make_node("RandomUniformLike", ["c"], ["out"], name=NODE)
    init = helper.make_tensor("c", TensorProto.FLOAT, [50], np.zeros(50))
    graph = helper.make_graph([node], "g", [], [helper.make_empty_tensor_value_info("out")], [init])
    rep = onnx_mini.prepare(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)], ir_version=10))
    a, b = rep.run([])[0], rep.run([])[0]
    assert a.shape == (50,) and not np.array_equal(a, b)


# -- *Like ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["RandomNormalLike", "RandomUniformLike"])
@pytest.mark.parametrize("version,tname", type_params("RandomNormalLike", [1, 22], "T1"))
def test_like_takes_shape_from_any_input_type(op, version, tname):
    x = np.zeros((2, 3), np_type(tname)) if tname != "string" else np.full((2, 3), "a", dtype=object)
    out = run_node(op, version, [x], dtype=TensorProto.DOUBLE)
    assert out.dtype == np.float64 and out.shape == (2, 3)


@pytest.mark.parametrize("op", ["RandomNormalLike", "RandomUniformLike"])
@pytest.mark.parametrize("version,tname", type_params("RandomNormalLike", [1, 22], "T2"))
def test_like_copies_input_dtype(op, version, tname):
    out = run_node(op, version, [np.zeros((4, 1, 2), np_type(tname))])
    assert out.dtype == np_type(tname) and out.shape == (4, 1, 2)


def test_like_moments():
    x = np.zeros((N,), np.float64)
    n = run_node("RandomNormalLike", 22, [x], mean=1.0, scale=2.0)
    assert abs(n.mean() - 1.0) < 0.04 and abs(n.std() - 2.0) < 0.04
    u = run_node("RandomUniformLike", 22, [x], low=-1.0, high=3.0)
    assert u.min() >= -1.0 and u.max() < 3.0 and abs(u.mean() - 1.0) < 0.04


@pytest.mark.parametrize("op", ["RandomNormalLike", "RandomUniformLike"])
def test_like_input_type_not_an_output_type(op):
    with raises_naming_node(KernelError, "dtype"):
        run_node(op, 22, [np.zeros((2,), np.int32)])


@pytest.mark.parametrize("op,version", [("RandomNormal", 1), ("RandomUniform", 22), ("RandomNormalLike", 1),
                                        ("RandomUniformLike", 22), ("Bernoulli", 15)])
def test_bad_dtype_attribute(op, version):
    inputs = [np.zeros((2,), np.float32)] if "Like" in op or op == "Bernoulli" else []
    attrs = {} if inputs else {"shape": [2]}
    bad = TensorProto.STRING if op == "Bernoulli" else TensorProto.INT32
    with raises_naming_node(InvalidNodeError, "dtype"):
        run_node(op, version, inputs, dtype=bad, **attrs)


def test_random_normal_bfloat16_only_from_22():
    with raises_naming_node(InvalidNodeError, "dtype"):
        run_node("RandomNormal", 1, [], shape=[2], dtype=TensorProto.BFLOAT16)
    assert run_node("RandomNormal", 22, [], shape=[2], dtype=TensorProto.BFLOAT16).dtype == np_type("bfloat16")


def test_negative_shape():
    with raises_naming_node(InvalidNodeError, "negative"):
        run_node("RandomUniform", 22, [], shape=[2, -1])


# -- Multinomial ------------------------------------------------------------------------------------

@pytest.mark.parametrize("version,tname", type_params("Multinomial", [7, 22], "T1"))
def test_multinomial_every_input_type(version, tname):
    with np.errstate(divide="ignore"):
        logits = np.log(np.array([[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]])).astype(np_type(tname))
    out = run_node("Multinomial", version, [logits], sample_size=50)
    assert out.dtype == np.int32 and out.shape == (2, 50)
    assert set(out[0].tolist()) <= {0, 1} and (out[1] == 2).all()   # zero-probability classes never drawn


@pytest.mark.parametrize("version", [7, 22])
@pytest.mark.parametrize("dtype", [TensorProto.INT32, TensorProto.INT64])
def test_multinomial_dtype(version, dtype):
    out = run_node("Multinomial", version, [np.zeros((3, 4), np.float32)], dtype=dtype, sample_size=6)
    assert out.dtype == np_type("int32" if dtype == TensorProto.INT32 else "int64") and out.shape == (3, 6)
    assert out.min() >= 0 and out.max() <= 3


def test_multinomial_frequencies():
    # unnormalised log-probabilities: row 0 has weights 1:2:3:4, row 1 is uniform over 2 classes
    weights = np.array([[1.0, 2.0, 3.0, 4.0], [5.0, 5.0, 0.0, 0.0]])
    with np.errstate(divide="ignore"):
        logits = np.log(weights) + 7.0   # the shift must not matter
    out = run_node("Multinomial", 22, [logits], sample_size=N, dtype=TensorProto.INT64)
    for row, w in zip(out, weights):
        freq = np.bincount(row, minlength=4) / N
        np.testing.assert_allclose(freq, w / w.sum(), atol=0.01)


def test_multinomial_default_sample_size_and_empty_batch():
    assert run_node("Multinomial", 22, [np.zeros((2, 3), np.float32)]).shape == (2, 1)
    assert run_node("Multinomial", 22, [np.zeros((0, 3), np.float32)], sample_size=4).shape == (0, 4)


def test_multinomial_errors():
    with raises_naming_node(KernelError, "2-D"):
        run_node("Multinomial", 22, [np.zeros((3,), np.float32)])
    with raises_naming_node(KernelError, "NaN|finite"):
        run_node("Multinomial", 22, [np.array([[0.0, np.nan]], np.float32)])
    with raises_naming_node(KernelError, "finite"):
        run_node("Multinomial", 22, [np.array([[-np.inf, -np.inf]], np.float32)])
    with raises_naming_node(InvalidNodeError, "dtype"):
        run_node("Multinomial", 22, [np.zeros((1, 2), np.float32)], dtype=TensorProto.FLOAT)
    with raises_naming_node(InvalidNodeError, "sample_size"):
        run_node("Multinomial", 22, [np.zeros((1, 2), np.float32)], sample_size=-1)


# -- Bernoulli --------------------------------------------------------------------------------------

@pytest.mark.parametrize("version,tname", type_params("Bernoulli", [15, 22], "T2"))
def test_bernoulli_every_output_type(version, tname):
    p = np.array([0.0, 1.0, 0.0, 1.0, 1.0], np.float32)
    out = run_node("Bernoulli", version, [p], dtype=getattr(TensorProto, tname.upper()))
    assert out.dtype == np_type(tname) and out.shape == (5,)
    np.testing.assert_array_equal(out.astype(np.float64), p.astype(np.float64))


@pytest.mark.parametrize("version,tname", type_params("Bernoulli", [15, 22], "T1"))
def test_bernoulli_default_dtype_is_input_type(version, tname):
    p = np.array([[1.0, 0.0], [0.0, 1.0]]).astype(np_type(tname))
    out = run_node("Bernoulli", version, [p])
    assert out.dtype == np_type(tname)
    np.testing.assert_array_equal(out.astype(np.float64), p.astype(np.float64))


def test_bernoulli_frequency():
    p = np.repeat(np.array([0.1, 0.5, 0.9], np.float64)[:, None], N // 2, axis=1)
    out = run_node("Bernoulli", 22, [p], dtype=TensorProto.BOOL)
    assert out.dtype == np.bool_
    np.testing.assert_allclose(out.mean(axis=1), [0.1, 0.5, 0.9], atol=0.01)


def test_bernoulli_empty_and_scalar():
    assert run_node("Bernoulli", 22, [np.zeros((0, 2), np.float32)]).shape == (0, 2)
    assert run_node("Bernoulli", 22, [np.array(1.0, np.float64)]).tolist() == 1.0


@pytest.mark.parametrize("bad", [1.5, -0.1, np.nan])
def test_bernoulli_probability_out_of_range(bad):
    with raises_naming_node(KernelError, r"\[0, 1\]"):
        run_node("Bernoulli", 22, [np.array([0.5, bad], np.float32)])
