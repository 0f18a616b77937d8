"""Spec tests for FlexAttention (ai.onnx.preview, version 1).

Expected values come from a slow reference written from the schema's pseudo code in this file: a loop
over batch, query head and query row in float64 (query head h reads kv head h // group), with the
modifiers applied as Python functions on the whole (B, Hq, L, S) tensor, as the subgraphs are.
"""
from __future__ import annotations

import math

import numpy as np
import onnx_mini
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_mini.errors import InvalidNodeError, KernelError

from helpers import NODE, elem_type, np_type, raises_naming_node, run_node, type_params, versions

DOMAIN = "ai.onnx.preview"
RTOL = {"float16": 5e-3, "bfloat16": 3e-2, "float": 2e-5, "double": 1e-12}
ATOL = {"float16": 2e-3, "bfloat16": 2e-2, "float": 1e-6, "double": 1e-12}


def rnd(shape, seed, tname="float"):
    return np.random.default_rng(seed).uniform(-1.0, 1.0, size=shape).astype(np_type(tname))


def reference(Q, K, V, scale=None, score_mod=None, prob_mod=None):
    q, k, v = (x.astype(np.float64) for x in (Q, K, V))
    b, hq, l, e = q.shape
    hkv, s = k.shape[1], k.shape[2]
    group = hq // hkv
    factor = 1 / math.sqrt(e) if scale is None else scale
    scores = np.empty((b, hq, l, s))
    for bi in range(b):
        for h in range(hq):
            for i in range(l):
                for j in range(s):
                    scores[bi, h, i, j] = sum(q[bi, h, i, t] * k[bi, h // group, j, t] for t in range(e)) * factor
    if score_mod is not None:
        scores = score_mod(scores)
    probs = np.empty_like(scores)
    for idx in np.ndindex(b, hq, l):
        row = np.exp(scores[idx] - scores[idx].max())
        probs[idx] = row / row.sum()
    if prob_mod is not None:
        probs = prob_mod(probs)
    y = np.empty((b, hq, l, v.shape[3]))
    for bi in range(b):
        for h in range(hq):
            for i in range(l):
                y[bi, h, i] = sum(probs[bi, h, i, j] * v[bi, h // group, j] for j in range(s))
    return y


def close(got, exp, tname="float"):
    assert type(got) is np.ndarray and got.dtype == np_type(tname) and got.shape == exp.shape
    np.testing.assert_allclose(got.astype(np.float64), exp, rtol=RTOL[tname], atol=ATOL[tname])


def flex(Q, K, V, **attrs):
    return run_node("FlexAttention", 1, [Q, K, V], domain=DOMAIN, **attrs)


def modifier(name, nodes, inits=(), dtype=TensorProto.FLOAT, inp="x", out="y"):
    """A one-input one-output subgraph (x -> y) of rank-4 tensors."""
    return helper.make_graph(nodes, name, [helper.make_tensor_value_info(inp, dtype, None)],
                             [helper.make_tensor_value_info(out, dtype, None)], list(inits))


def const(name, value, dtype=np.float32):
    return numpy_helper.from_array(np.array(value, dtype), name)


def test_versions_listed():
    assert versions("FlexAttention", DOMAIN) == [1]


@pytest.mark.parametrize("version,tname", type_params("FlexAttention", [1], "T1", DOMAIN))
def test_every_type(version, tname):
    Q, K, V = rnd((2, 2, 3, 4), 1, tname), rnd((2, 2, 5, 4), 2, tname), rnd((2, 2, 5, 3), 3, tname)
    close(flex(Q, K, V), reference(Q, K, V), tname)


@pytest.mark.parametrize("hq,hkv", [(4, 4), (4, 2), (6, 1), (3, 3)])
def test_grouped_query_heads_and_head_sizes(hq, hkv):
    Q, K, V = rnd((1, hq, 4, 8), 4), rnd((1, hkv, 6, 8), 5), rnd((1, hkv, 6, 5), 6)
    close(flex(Q, K, V), reference(Q, K, V))


@pytest.mark.parametrize("scale", [0.1, 1.0, -2.0])
def test_scale_attribute(scale):
    Q, K, V = rnd((1, 2, 3, 4), 7), rnd((1, 2, 3, 4), 8), rnd((1, 2, 3, 4), 9)
    close(flex(Q, K, V, scale=scale), reference(Q, K, V, scale=scale))


def test_score_mod_soft_cap_and_prob_mod():
    Q, K, V = rnd((2, 2, 3, 4), 10), rnd((2, 2, 4, 4), 11), rnd((2, 2, 4, 2), 12)
    cap = modifier("cap", [helper.make_node("Div", ["x", "c"], ["d"]), helper.make_node("Tanh", ["d"], ["t"]),
                           helper.make_node("Mul", ["t", "c"], ["y"])], [const("c", 0.3)])
    half = modifier("half", [helper.make_node("Mul", ["x", "h"], ["y"])], [const("h", 0.5)])
    got = flex(Q, K, V, score_mod=cap, prob_mod=half)
    close(got, reference(Q, K, V, score_mod=lambda s: np.tanh(s / 0.3) * 0.3, prob_mod=lambda p: p * 0.5))


def test_causal_mask_from_the_score_shape():
    # Trilu keeps the lower triangle of ones: masked (future) positions become -inf via Where.
    Q, K, V = rnd((1, 2, 4, 4), 13), rnd((1, 2, 4, 4), 14), rnd((1, 2, 4, 3), 15)
    mask = modifier("causal", [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("ConstantOfShape", ["shape"], ["ones"],
                         value=numpy_helper.from_array(np.array([1], np.int64))),
        helper.make_node("Trilu", ["ones"], ["lower"], upper=0),
        helper.make_node("Cast", ["lower"], ["keep"], to=TensorProto.BOOL),
        helper.make_node("Where", ["keep", "x", "ninf"], ["y"])], [const("ninf", -np.inf)])
    tri = np.tril(np.ones((4, 4), bool))
    close(flex(Q, K, V, score_mod=mask), reference(Q, K, V, score_mod=lambda s: np.where(tri, s, -np.inf)))


def test_fully_masked_row_is_nan_as_softmax_defines():
    Q, K, V = rnd((1, 1, 2, 2), 16), rnd((1, 1, 2, 2), 17), rnd((1, 1, 2, 2), 18)
    # score_mod x - inf masks every key of every row
    minus = modifier("minus", [helper.make_node("Sub", ["x", "z"], ["y"])], [const("z", np.inf)])
    got = flex(Q, K, V, score_mod=minus)
    assert got.dtype == np.float32 and got.shape == (1, 1, 2, 2) and np.isnan(got).all()


def test_modifier_reads_an_outer_scope_value():
    # score_mod adds the main graph's input "bias" (captured), broadcast over (B, Hq, L, S)
    Q, K, V = rnd((1, 2, 3, 4), 19), rnd((1, 2, 3, 4), 20), rnd((1, 2, 3, 4), 21)
    bias = rnd((3, 3), 22)
    sub = modifier("bias", [helper.make_node("Add", ["x", "bias"], ["y"])])
    node = helper.make_node("FlexAttention", ["Q", "K", "V"], ["Y"], name=NODE, domain=DOMAIN, score_mod=sub)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
                                            for n in ("Q", "K", "V", "bias")],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(DOMAIN, 1)],
                              ir_version=10)
    (got,) = onnx_mini.prepare(model).run([Q, K, V, bias])
    close(got, reference(Q, K, V, score_mod=lambda s: s + bias))


@pytest.mark.parametrize("tname,precision,seen", [("float16", None, "float"), ("double", None, "double"),
                                                  ("float", 11, "double"), ("double", 1, "float"),
                                                  ("float", 10, "float16")])
def test_softmax_precision_sets_the_modifier_type(tname, precision, seen):
    # the score_mod adds a constant of the expected type: Add fails on any other type
    Q, K, V = rnd((1, 1, 2, 4), 23, tname), rnd((1, 1, 3, 4), 24, tname), rnd((1, 1, 3, 2), 25, tname)
    et = elem_type(np_type(seen))
    sub = modifier("typed", [helper.make_node("Add", ["x", "zero"], ["y"])],
                   [numpy_helper.from_array(np.zeros((), np_type(seen)), "zero")], dtype=et)
    attrs = {} if precision is None else {"softmax_precision": precision}
    got = flex(Q, K, V, score_mod=sub, **attrs)
    loose = "float16" if "float16" in (tname, seen) else ("float" if "float" in (tname, seen) else "double")
    assert got.dtype == np_type(tname)
    np.testing.assert_allclose(got.astype(np.float64), reference(Q, K, V), rtol=RTOL[loose], atol=ATOL[loose])


def test_empty_sequences():
    Q, K, V = rnd((1, 2, 0, 4), 1), rnd((1, 2, 3, 4), 2), rnd((1, 2, 3, 5), 3)
    assert flex(Q, K, V).shape == (1, 2, 0, 5)


# -- errors -----------------------------------------------------------------------------------------

def test_bad_inputs():
    Q = rnd((1, 2, 3, 4), 1)
    with raises_naming_node(KernelError, "rank 4"):
        flex(Q[0], Q[0], Q[0])
    with raises_naming_node(KernelError, "multiple of kv_num_heads"):
        flex(rnd((1, 3, 3, 4), 1), rnd((1, 2, 3, 4), 2), rnd((1, 2, 3, 4), 3))
    with raises_naming_node(KernelError, "do not fit"):
        flex(Q, rnd((1, 2, 3, 5), 2), rnd((1, 2, 3, 4), 3))
    with raises_naming_node(KernelError, "one type"):
        flex(Q, Q, Q.astype(np.float64))


def test_bad_attributes():
    Q = rnd((1, 1, 2, 2), 1)
    with raises_naming_node(InvalidNodeError, "softmax_precision"):
        flex(Q, Q, Q, softmax_precision=6)
    two_outputs = helper.make_graph([helper.make_node("Identity", ["x"], ["y"]),
                                     helper.make_node("Identity", ["x"], ["z"])], "two",
                                    [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                                    [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "yz"])
    with raises_naming_node(InvalidNodeError, "prob_mod must have exactly one input and one output"):
        flex(Q, Q, Q, prob_mod=two_outputs)


def test_modifier_must_keep_shape_and_type():
    Q = rnd((1, 1, 2, 2), 1)
    shrink = modifier("shrink", [helper.make_node("ReduceSum", ["x"], ["y"], keepdims=1)])
    with raises_naming_node(KernelError, "score_mod must return a tensor of the input's shape"):
        flex(Q, Q, Q, score_mod=shrink)
    widen = modifier("widen", [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.DOUBLE)])
    with raises_naming_node(KernelError, "prob_mod must return"):
        flex(Q, Q, Q, prob_mod=widen)
