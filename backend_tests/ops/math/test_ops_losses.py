"""Spec tests for NegativeLogLikelihoodLoss (12, 13, 22) and SoftmaxCrossEntropyLoss (12, 13).

The expected losses come from plain loops over (n, d1, ..., dk) written from the spec text:
loss = -input[n, c, d...] * weight[c] with c = target[n, d...], 0 where target == ignore_index;
'mean' divides the sum by the summed weights of the targets that are not ignored.
"""
from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

from onnx_mini.errors import InvalidNodeError, KernelError

from helpers import NODE, np_type, run_node, type_matrix

RTOL = {"float16": 2e-3, "bfloat16": 1.6e-2, "float": 1e-6, "double": 1e-12}


def nll_ref(logp, target, weight=None, reduction="mean", ignore_index=None):
    """Loops from the spec, in float64."""
    logp = logp.astype(np.float64)
    loss = np.zeros(target.shape)
    wsum = 0.0
    for pos in np.ndindex(*target.shape):
        c = int(target[pos])
        if ignore_index is not None and c == ignore_index:
            continue
        w = 1.0 if weight is None else float(weight[c])
        loss[pos] = -logp[(pos[0], c) + pos[1:]] * w
        wsum += w
    if reduction == "none":
        return loss
    if reduction == "sum":
        return np.array(loss.sum())
    return np.array(loss.sum() / wsum)


def log_softmax_ref(x):
    """log(exp(x[n, c, ...]) / sum over c of exp(x[n, c', ...])), in float64."""
    x = x.astype(np.float64)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


def check(got, exp, dtype, tname):
    assert type(got) is np.ndarray and got.dtype == np.dtype(dtype) and got.shape == exp.shape, \
        (type(got), got.dtype, got.shape, exp.shape)
    np.testing.assert_allclose(got.astype(np.float64), exp, rtol=RTOL[tname], atol=1e-6)


def case(tname, shape, seed, tind=np.int64, ignore=None):
    rng = np.random.default_rng(seed)
    x = (rng.integers(-8, 8, size=shape) / 4).astype(np_type(tname))
    target = rng.integers(0, shape[1], size=(shape[0],) + shape[2:]).astype(tind)
    if ignore is not None:
        target.flat[::3] = ignore
    w = (rng.integers(1, 8, size=shape[1]) / 4).astype(np_type(tname))
    return x, target, w


NLL_TYPES = [(p.values[0], p.values[1]) for p in type_matrix("NegativeLogLikelihoodLoss", [12, 13, 22])]
SCE_TYPES = [(p.values[0], p.values[1]) for p in type_matrix("SoftmaxCrossEntropyLoss", [12, 13])]
REDUCTIONS = ["none", "sum", "mean"]


@pytest.mark.parametrize("version,tname", NLL_TYPES)
@pytest.mark.parametrize("tind", [np.int32, np.int64])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_nll_every_type(version, tname, tind, reduction):
    x, t, w = case(tname, (3, 4), 1, tind)
    for weight in (None, w):
        got = run_node("NegativeLogLikelihoodLoss", version, [x, t] + ([] if weight is None else [weight]),
                       reduction=reduction)
        check(got, nll_ref(x, t, weight, reduction), x.dtype, tname)


@pytest.mark.parametrize("version,tname", SCE_TYPES)
@pytest.mark.parametrize("tind", [np.int32, np.int64])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_sce_every_type(version, tname, tind, reduction):
    x, t, w = case(tname, (3, 4), 2, tind)
    lp = log_softmax_ref(x)
    for weight in (None, w):
        loss, log_prob = run_node("SoftmaxCrossEntropyLoss", version,
                                  [x, t] + ([] if weight is None else [weight]), 2, reduction=reduction)
        check(loss, nll_ref(lp, t, weight, reduction), x.dtype, tname)
        check(log_prob, lp, x.dtype, tname)


@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 4), (2, 3, 2, 2), (1, 4, 2, 1, 3)])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ignore", [None, 1, -1, 10])
def test_nll_nd_weights_and_ignore_index(shape, reduction, weighted, ignore):
    x, t, w = case("double", shape, 3, ignore=ignore)
    weight = w if weighted else None
    attrs = {"reduction": reduction} | ({} if ignore is None else {"ignore_index": ignore})
    got = run_node("NegativeLogLikelihoodLoss", 22, [x, t] + ([weight] if weighted else []), **attrs)
    check(got, nll_ref(x, t, weight, reduction, ignore), np.float64, "double")


@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 4), (1, 4, 2, 1, 3)])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ignore", [None, 0, -5])
def test_sce_nd_weights_and_ignore_index(shape, reduction, weighted, ignore):
    x, t, w = case("float", shape, 4, ignore=ignore)
    weight = w if weighted else None
    attrs = {"reduction": reduction} | ({} if ignore is None else {"ignore_index": ignore})
    loss, log_prob = run_node("SoftmaxCrossEntropyLoss", 13, [x, t] + ([weight] if weighted else []), 2, **attrs)
    lp = log_softmax_ref(x)
    check(loss, nll_ref(lp, t, weight, reduction, ignore), np.float32, "float")
    check(log_prob, lp, np.float32, "float")


def test_nll_spec_examples():
    x = np.array([[[1.0, 2.0], [2.0, 2.0], [3.0, 2.0]], [[0.0, 1.0], [2.0, 2.0], [1.0, 2]]], np.float32)
    t = np.array([[2, 1], [0, 2]], np.int64)
    w = np.array([0.2, 0.3, 0.1], np.float32)
    none = run_node("NegativeLogLikelihoodLoss", 13, [x, t], reduction="none")
    np.testing.assert_array_equal(none, np.array([[-3, -2], [0, -2]], np.float32))
    total = run_node("NegativeLogLikelihoodLoss", 13, [x, t, w], reduction="sum")
    np.testing.assert_allclose(total, -1.1, rtol=1e-6)
    mean = run_node("NegativeLogLikelihoodLoss", 13, [x, t, w])   # mean is the default
    np.testing.assert_allclose(mean, -1.1 / 0.7, rtol=1e-6)


def test_mean_divides_by_the_weight_of_targets_not_ignored():
    x = np.array([[-1.0, -2.0], [-3.0, -4.0], [-5.0, -6.0]], np.float32)
    t = np.array([0, 1, 1], np.int64)
    w = np.array([2.0, 0.5], np.float32)
    # ignored sample 1: loss = 1*2 + 6*0.5 = 5, weights 2 + 0.5
    got = run_node("NegativeLogLikelihoodLoss", 13, [x, t, w], ignore_index=1, reduction="mean")
    np.testing.assert_allclose(got, (1 * 2 + 0) / 2.0, rtol=1e-6)   # both class-1 targets ignored
    t2 = np.array([0, 1, -1], np.int64)
    got = run_node("NegativeLogLikelihoodLoss", 13, [x, t2, w], ignore_index=-1, reduction="mean")
    np.testing.assert_allclose(got, (1 * 2 + 4 * 0.5) / 2.5, rtol=1e-6)
    got = run_node("NegativeLogLikelihoodLoss", 13, [x, t2], ignore_index=-1, reduction="mean")
    np.testing.assert_allclose(got, (1 + 4) / 2, rtol=1e-6)           # no weight: a count of 2


def test_ignored_entries_are_zero_whatever_the_input():
    x = np.array([[np.inf, -1.0], [-2.0, np.nan]], np.float32)
    t = np.array([5, 0], np.int64)
    got = run_node("NegativeLogLikelihoodLoss", 22, [x, t], ignore_index=5, reduction="none")
    np.testing.assert_array_equal(got, np.array([0, 2], np.float32))


def test_low_precision_outputs_keep_their_type():
    x = np.array([[0.5, -1.0, 2.0]], dtype=ml_dtypes.bfloat16)
    t = np.array([2], np.int32)
    loss, lp = run_node("SoftmaxCrossEntropyLoss", 13, [x, t], 2)
    assert loss.dtype == ml_dtypes.bfloat16 and lp.dtype == ml_dtypes.bfloat16 and loss.shape == ()
    np.testing.assert_allclose(float(loss), -log_softmax_ref(np.array([[0.5, -1.0, 2.0]]))[0, 2], rtol=1e-2)


def test_sce_only_first_output_and_large_scores():
    x = np.array([[1000.0, 1001.0, 1002.0]], np.float32)
    loss = run_node("SoftmaxCrossEntropyLoss", 12, [x, np.array([0], np.int64)], 1, reduction="sum")
    e = np.exp([-2.0, -1.0, 0.0])
    np.testing.assert_allclose(loss, -np.log(e[0] / e.sum()), rtol=1e-6)


@pytest.mark.parametrize("op,version", [("NegativeLogLikelihoodLoss", 13), ("SoftmaxCrossEntropyLoss", 13)])
def test_errors(op, version):
    x = np.zeros((2, 3), np.float32)
    n = 2 if op == "SoftmaxCrossEntropyLoss" else 1
    with pytest.raises(KernelError, match=re.compile(rf"'{NODE}'.*target value 3 is out of range \[0, 3\)", re.S)):
        run_node(op, version, [x, np.array([0, 3], np.int64)], n)
    with pytest.raises(KernelError, match="is not ignore_index 1"):
        run_node(op, version, [x, np.array([-1, 1], np.int64)], n, ignore_index=1)
    with pytest.raises(KernelError, match="does not match"):
        run_node(op, version, [x, np.array([0, 1, 2], np.int64)], n)
    with pytest.raises(KernelError, match=r"weight must have shape \[3\]"):
        run_node(op, version, [x, np.array([0, 1], np.int64), np.ones(2, np.float32)], n)
    with pytest.raises(KernelError, match=r"\(N, C"):
        run_node(op, version, [np.zeros(3, np.float32), np.array([0], np.int64)], n)
    with pytest.raises(InvalidNodeError, match=re.compile(rf"'{NODE}'.*reduction", re.S)):
        run_node(op, version, [x, np.array([0, 1], np.int64)], n, reduction="avg")


def test_empty_batch():
    x = np.zeros((0, 3), np.float32)
    t = np.zeros((0,), np.int64)
    assert run_node("NegativeLogLikelihoodLoss", 13, [x, t], reduction="none").shape == (0,)
    assert float(run_node("NegativeLogLikelihoodLoss", 13, [x, t], reduction="sum")) == 0.0
