"""Spec tests for the ai.onnx.ml model operators: TreeEnsembleRegressor / TreeEnsembleClassifier (1, 3, 5),
TreeEnsemble-5, SVMClassifier-1, SVMRegressor-1, LinearClassifier-1, LinearRegressor-1.

Expected values come from plain per-sample Python references written in this file from the spec text
(walk each tree node by node, sum kernels over support vectors, ...), or are written by hand.
"""
from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnx_mini
from onnx_mini.errors import InvalidNodeError, KernelError

from helpers import assert_same, np_type, raises_naming_node, run_node, type_params, versions

ML = "ai.onnx.ml"
MODES = ["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ"]
TRANSFORMS = ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO", "PROBIT"]


def run(op, version, x, n_outputs=1, **attrs):
    return run_node(op, version, [x], n_outputs, domain=ML, **attrs)


def close(got, expected, dtype=np.float32, atol=1e-5):
    assert type(got) is np.ndarray and got.dtype == dtype, (type(got), getattr(got, "dtype", None))
    expected = np.asarray(expected, np.float64)
    assert got.shape == expected.shape, (got.shape, expected.shape)
    np.testing.assert_allclose(got.astype(np.float64), expected, rtol=1e-5, atol=atol)


# -- references (plain Python, one sample at a time) -----------------------------------------------

def compare(mode, v, t):
    return {"BRANCH_LEQ": v <= t, "BRANCH_LT": v < t, "BRANCH_GTE": v >= t, "BRANCH_GT": v > t,
            "BRANCH_EQ": v == t, "BRANCH_NEQ": v != t}[mode]


def transform_row(name, row):
    if name == "NONE":
        return list(row)
    if name == "LOGISTIC":
        return [1 / (1 + math.exp(-v)) for v in row]
    if name == "PROBIT":
        return [NormalDist().inv_cdf(v) if 0 < v < 1 else (math.nan if not 0 <= v <= 1 else
                                                           (-math.inf if v == 0 else math.inf)) for v in row]
    keep = [name == "SOFTMAX" or v != 0 for v in row]
    top = max([v for v, k in zip(row, keep) if k], default=0)
    e = [math.exp(v - top) if k else 0.0 for v, k in zip(row, keep)]
    total = sum(e)
    return [v / total if total else 0.0 for v in e]


def legacy_leaves(a, row):
    """The (tree id, node id) leaf each tree of a TreeEnsembleRegressor/Classifier attribute set reaches."""
    nodes = {(t, n): i for i, (t, n) in enumerate(zip(a["nodes_treeids"], a["nodes_nodeids"]))}
    tracks = a.get("nodes_missing_value_tracks_true") or [0] * len(nodes)
    out = []
    for tree in dict.fromkeys(a["nodes_treeids"]):
        i = nodes[(tree, 0)]
        while a["nodes_modes"][i] != "LEAF":
            v = float(row[a["nodes_featureids"][i]])
            go = (math.isnan(v) and tracks[i]) or compare(a["nodes_modes"][i], v, a["nodes_values"][i])
            i = nodes[(tree, a["nodes_truenodeids"][i] if go else a["nodes_falsenodeids"][i])]
        out.append((tree, a["nodes_nodeids"][i]))
    return out


def aggregate(per_tree, k, how, n_trees):
    """per_tree: for each tree, a list of (target, weight) -> one value per target (0 when none)."""
    out = []
    for target in range(k):
        values = [sum(w for t, w in leaf if t == target) for leaf in per_tree if any(t == target for t, _ in leaf)]
        if how == "SUM":
            out.append(sum(values))
        elif how == "AVERAGE":
            out.append(sum(values) / n_trees)
        else:
            out.append((min if how == "MIN" else max)(values) if values else 0.0)
    return out


def ref_regressor(a, x, k, how="SUM", base=None, transform="NONE", prefix="target"):
    rows = []
    for row in np.asarray(x, np.float64):
        per_tree = [[(i, w) for t, n, i, w in zip(a[f"{prefix}_treeids"], a[f"{prefix}_nodeids"],
                                                   a[f"{prefix}_ids"], a[f"{prefix}_weights"]) if (t, n) == leaf]
                    for leaf in legacy_leaves(a, row)]
        scores = aggregate(per_tree, k, how, len(per_tree))
        scores = [s + (base[j] if base else 0) for j, s in enumerate(scores)]
        rows.append(transform_row(transform, scores))
    return np.array(rows).reshape(len(rows), k)


# -- the test forest: two trees over 3 features, 2 targets ------------------------------------------

def forest(mode="BRANCH_LEQ", tracks=None):
    """tree 0: x0 <= 0.5 ? (x1 <mode> 1.0 ? leaf 3 : leaf 4) : leaf 2;  tree 1: x2 > -1 ? leaf 1 : leaf 2."""
    a = dict(nodes_treeids=[0, 0, 0, 0, 0, 1, 1, 1], nodes_nodeids=[0, 1, 2, 3, 4, 0, 1, 2],
             nodes_featureids=[0, 1, 0, 0, 0, 2, 0, 0], nodes_values=[0.5, 1.0, 0.0, 0.0, 0.0, -1.0, 0.0, 0.0],
             nodes_modes=["BRANCH_LEQ", mode, "LEAF", "LEAF", "LEAF", "BRANCH_GT", "LEAF", "LEAF"],
             nodes_truenodeids=[1, 3, 0, 0, 0, 1, 0, 0], nodes_falsenodeids=[2, 4, 0, 0, 0, 2, 0, 0])
    if tracks is not None:
        a["nodes_missing_value_tracks_true"] = tracks
    return a


TARGETS = dict(target_treeids=[0, 0, 0, 0, 1, 1, 1], target_nodeids=[2, 3, 3, 4, 1, 2, 2],
               target_ids=[0, 0, 1, 1, 0, 0, 1], target_weights=[1.5, -2.0, 0.25, 3.0, 0.5, -1.0, 4.0])

X = np.array([[0.0, 1.0, 0.0], [0.5, 0.0, -1.0], [1.0, 2.0, 3.0], [-2.0, 1.5, -3.0], [0.25, 1.0, -0.5],
              [np.nan, 1.0, 0.0], [0.0, np.nan, np.nan], [7.0, -1.0, 1.0]], np.float32)
X_FINITE = X[np.isfinite(X).all(axis=1)]


def regressor_attrs(mode="BRANCH_LEQ", tracks=None, **extra):
    return {**forest(mode, tracks), **TARGETS, "n_targets": 2, **extra}


# -- TreeEnsembleRegressor --------------------------------------------------------------------------

@pytest.mark.parametrize("version,tname", type_params("TreeEnsembleRegressor", versions("TreeEnsembleRegressor", ML),
                                                      "T", ML))
def test_tree_regressor_every_type(version, tname):
    x = X_FINITE.astype(np_type(tname)) if tname.startswith("float") or tname == "double" else \
        np.array([[0, 1, 0], [1, 0, -1], [-2, 3, 5], [0, 2, -4]], np_type(tname))
    a = regressor_attrs()
    close(run("TreeEnsembleRegressor", version, x, **a), ref_regressor(a, x, 2))


@pytest.mark.parametrize("version", [1, 3, 5])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("tracks", [None, [1, 1, 0, 0, 0, 1, 0, 0], [0, 0, 0, 0, 0, 0, 0, 0]])
def test_tree_regressor_modes_and_nan(version, mode, tracks):
    a = regressor_attrs(mode, tracks)
    close(run("TreeEnsembleRegressor", version, X, **a), ref_regressor(a, X, 2))


def test_tree_regressor_nan_by_hand():
    # tree 0 root x0 <= 0.5: NaN is false (-> leaf 2: 1.5 on target 0) unless tracked (-> node 1)
    a = regressor_attrs()
    x = np.array([[np.nan, 0.0, 0.0]], np.float32)       # tree 1: 0 > -1 -> leaf 1 (0.5 on target 0)
    close(run("TreeEnsembleRegressor", 3, x, **a), [[2.0, 0.0]])
    a = regressor_attrs(tracks=[1, 0, 0, 0, 0, 0, 0, 0])  # NaN -> node 1: 0 <= 1 -> leaf 3 (-2, 0.25)
    close(run("TreeEnsembleRegressor", 3, x, **a), [[-1.5, 0.25]])


@pytest.mark.parametrize("version", [1, 3, 5])
@pytest.mark.parametrize("how", ["SUM", "AVERAGE", "MIN", "MAX"])
@pytest.mark.parametrize("transform", TRANSFORMS)
def test_tree_regressor_aggregate_and_transform(version, how, transform):
    base = [0.25, -0.5]
    a = regressor_attrs("BRANCH_LT", aggregate_function=how, post_transform=transform, base_values=base)
    x = X if transform != "PROBIT" else X * 0.01 + 0.3   # probabilities for PROBIT
    expected = ref_regressor(a, x, 2, how, base, transform)
    close(run("TreeEnsembleRegressor", version, x, **a), expected, atol=1e-4)


def test_tree_regressor_by_hand():
    a = regressor_attrs()
    # sample 0: tree 0 x0=0<=.5, x1=1<=1 -> leaf 3 (t0 -2, t1 .25); tree 1 x2=0>-1 -> leaf 1 (t0 .5)
    # sample 1: tree 0 x0=.5<=.5, x1=0<=1 -> leaf 3; tree 1 x2=-1 > -1 false -> leaf 2 (t0 -1, t1 4)
    x = np.array([[0, 1, 0], [0.5, 0, -1]], np.float32)
    close(run("TreeEnsembleRegressor", 1, x, **a), [[-1.5, 0.25], [-3.0, 4.25]])
    close(run("TreeEnsembleRegressor", 1, x, aggregate_function="AVERAGE", **a), [[-0.75, 0.125], [-1.5, 2.125]])
    close(run("TreeEnsembleRegressor", 1, x, aggregate_function="MIN", **a), [[-2.0, 0.25], [-2.0, 0.25]])
    close(run("TreeEnsembleRegressor", 1, x, aggregate_function="MAX", **a), [[0.5, 0.25], [-1.0, 4.0]])


def test_tree_regressor_as_tensor_double_precision():
    # threshold 0.1 in double: a double 0.1 is <= it; the float32 0.1 (0.100000001...) is not
    a = regressor_attrs()
    a.pop("nodes_values")
    a["nodes_values_as_tensor"] = np.array([0.1, 1.0, 0, 0, 0, -1.0, 0, 0], np.float64)
    a.pop("target_weights")
    a["target_weights_as_tensor"] = np.array(TARGETS["target_weights"], np.float64)
    a["base_values_as_tensor"] = np.array([1.0, 2.0])
    # tree 0: 0.1 <= 0.1, node 1: 5 <= 1 false -> leaf 4 (t1 3); tree 1: 0 > -1 -> leaf 1 (t0 .5)
    x64 = np.array([[0.1, 5.0, 0.0]], np.float64)
    close(run("TreeEnsembleRegressor", 3, x64, **a), [[0.5 + 1, 3.0 + 2]])
    x32 = np.array([[0.1, 5.0, 0.0]], np.float32)       # float compares with the threshold as float: equal
    close(run("TreeEnsembleRegressor", 3, x32, **a), [[0.5 + 1, 3.0 + 2]])
    x32 = np.array([[0.1000001, 5.0, 0.0]], np.float32)  # above -> leaf 2 (t0 1.5) + tree 1 leaf 1 (.5)
    close(run("TreeEnsembleRegressor", 3, x32, **a), [[1.5 + 0.5 + 1, 2.0]])


def test_tree_regressor_single_target_default_and_empty_batch():
    a = {**forest(), "target_treeids": [0, 0, 0, 1, 1], "target_nodeids": [2, 3, 4, 1, 2],
         "target_ids": [0, 0, 0, 0, 0], "target_weights": [1.0, 2.0, 3.0, 10.0, 20.0]}
    x = np.array([[0, 1, 0], [9, 9, -9]], np.float32)
    close(run("TreeEnsembleRegressor", 3, x, **a), [[12.0], [21.0]])
    close(run("TreeEnsembleRegressor", 3, np.zeros((0, 3), np.float32), **a), np.zeros((0, 1)))


def test_tree_regressor_many_trees_matches_reference():
    rng = np.random.default_rng(7)
    a = {k: [] for k in ("nodes_treeids", "nodes_nodeids", "nodes_featureids", "nodes_values", "nodes_modes",
                         "nodes_truenodeids", "nodes_falsenodeids", "target_treeids", "target_nodeids",
                         "target_ids", "target_weights")}
    for tree in range(12):   # complete trees of depth 3, random features/thresholds/modes
        for node in range(15):
            leaf = node >= 7
            a["nodes_treeids"].append(tree)
            a["nodes_nodeids"].append(node)
            a["nodes_featureids"].append(int(rng.integers(4)))
            a["nodes_values"].append(float(rng.integers(-4, 5)) / 2)
            a["nodes_modes"].append("LEAF" if leaf else MODES[int(rng.integers(6))])
            a["nodes_truenodeids"].append(0 if leaf else 2 * node + 1)
            a["nodes_falsenodeids"].append(0 if leaf else 2 * node + 2)
            if leaf:
                for target in range(3):
                    a["target_treeids"].append(tree)
                    a["target_nodeids"].append(node)
                    a["target_ids"].append(target)
                    a["target_weights"].append(float(rng.integers(-8, 9)) / 4)
    x = (rng.integers(-5, 6, size=(40, 4)) / 2).astype(np.float32)
    close(run("TreeEnsembleRegressor", 3, x, n_targets=3, **a), ref_regressor(a, x, 3), atol=1e-4)


# -- TreeEnsembleClassifier -------------------------------------------------------------------------

def classifier_attrs(labels, class_ids, weights, **extra):
    a = {**forest(), "class_treeids": TARGETS["target_treeids"], "class_nodeids": TARGETS["target_nodeids"],
         "class_ids": class_ids, "class_weights": weights, **extra}
    a["classlabels_strings" if isinstance(labels[0], str) else "classlabels_int64s"] = labels
    return a


@pytest.mark.parametrize("version", [1, 3, 5])
@pytest.mark.parametrize("labels", [[10, 20, 30], ["a", "b", "c"]])
@pytest.mark.parametrize("transform", TRANSFORMS[:4])
def test_tree_classifier_multiclass(version, labels, transform):
    ids = [0, 1, 2, 1, 2, 0, 2]
    base = [0.1, -0.2, 0.05]
    a = classifier_attrs(labels, ids, TARGETS["target_weights"], base_values=base, post_transform=transform)
    y, z = run("TreeEnsembleClassifier", version, X, 2, **a)
    raw = ref_regressor(a, X, 3, "SUM", base, "NONE", prefix="class")
    assert_same(y, np.array([labels[i] for i in raw.argmax(axis=1)], dtype=object if isinstance(labels[0], str)
                            else np.int64))
    close(z, [transform_row(transform, r) for r in raw])


@pytest.mark.parametrize("version,tname", type_params("TreeEnsembleClassifier", [1, 3, 5], "T1", ML))
def test_tree_classifier_every_type(version, tname):
    x = np.array([[0, 1, 0], [1, 0, -1], [-2, 3, 5], [0, 2, -4]]).astype(np_type(tname))
    a = classifier_attrs([4, 5], [0, 1, 0, 1, 1, 0, 1], TARGETS["target_weights"])
    y, z = run("TreeEnsembleClassifier", version, x, 2, **a)
    raw = ref_regressor(a, x, 2, prefix="class")
    assert_same(y, np.array([4, 5])[raw.argmax(axis=1)])
    close(z, raw)


@pytest.mark.parametrize("labels", [[0, 1], ["no", "yes"]])
@pytest.mark.parametrize("transform", ["NONE", "LOGISTIC", "PROBIT", "SOFTMAX"])
def test_tree_classifier_binary_one_class_weights(labels, transform):
    """Two classes, weights for one class only: the score s (plus base) is the second class's; the first
    gets 1 - s (non-negative weights); label = second class when s > 0.5."""
    w = [0.1, 0.2, 0.1, 0.15, 0.05, 0.1, 0.2]
    a = classifier_attrs(labels, [0] * 7, w, post_transform=transform, base_values=[0.1])
    x = X_FINITE
    y, z = run("TreeEnsembleClassifier", 3, x, 2, **a)
    s = ref_regressor(a, x, 1, prefix="class")[:, 0] + 0.1
    assert_same(y, np.array([labels[int(v > 0.5)] for v in s], dtype=object if isinstance(labels[0], str)
                            else np.int64))
    if transform == "NONE":
        expected = [[1 - v, v] for v in s]
    elif transform == "LOGISTIC":
        expected = [[1 / (1 + math.exp(v)), 1 / (1 + math.exp(-v))] for v in s]
    elif transform == "PROBIT":
        expected = [[-NormalDist().inv_cdf(v), NormalDist().inv_cdf(v)] for v in s]
    else:
        expected = [transform_row("SOFTMAX", [1 - v, v]) for v in s]
    close(z, expected, atol=1e-4)


def test_tree_classifier_binary_mixed_weights():
    # negative weights: s is a margin: label = second class when s > 0, scores [-s, s]
    a = classifier_attrs([0, 1], [1] * 7, TARGETS["target_weights"])
    x = np.array([[0, 1, 0], [0.5, 0, -1], [9, 0, 9]], np.float32)
    y, z = run("TreeEnsembleClassifier", 3, x, 2, **a)
    # every weight goes to the one class: leaf 3 holds -2 + .25, tree 1's leaf 2 holds -1 + 4
    # sample 0: leaf 3 (-1.75) + leaf 1 (.5) = -1.25; sample 1: leaf 3 (-1.75) + tree 1 leaf 2 (3) = 1.25;
    # sample 2: leaf 2 (1.5) + leaf 1 (.5) = 2
    assert_same(y, np.array([0, 1, 1], np.int64))
    close(z, [[1.25, -1.25], [-1.25, 1.25], [-2.0, 2.0]])
    y, z = run("TreeEnsembleClassifier", 3, x, 2, post_transform="LOGISTIC", **a)
    close(z, [[1 / (1 + math.exp(v)), 1 / (1 + math.exp(-v))] for v in (-1.25, 1.25, 2.0)])


def test_tree_classifier_binary_both_classes_uses_argmax():
    a = classifier_attrs(["x", "y"], [0, 1, 0, 1, 1, 0, 1], [1.0, 2.0, 0.5, 1.0, 3.0, 0.25, 0.5])
    x = np.array([[0, 1, 0], [9, 9, 9]], np.float32)
    y, z = run("TreeEnsembleClassifier", 5, x, 2, **a)
    # sample 0: leaf 3 (c0 2? no: ids [0,1,...]: leaf 3 -> c1 2.0 and c0 0.5) + tree 1 leaf 1 (c1 3.0)
    # sample 1: leaf 2 (c0 1.0) + leaf 1 (c1 3.0)
    assert_same(y, np.array(["y", "y"], dtype=object))
    close(z, [[0.5, 5.0], [1.0, 3.0]])


# -- TreeEnsemble-5 -------------------------------------------------------------------------------

def te5(modes=(0, 0, 0), splits=(3.14, 1.2, 4.2), dtype=np.float64, **extra):
    """The official example tree: node 0 (x0 vs 3.14) -> node 1 / node 2, node 1 -> leaves 0 / 2,
    node 2 -> leaves 1 / 3 (feature 0 everywhere). leaf weights 5.23, 12.12, -12.23, 7.21 on targets 0,1,0,1."""
    a = dict(n_targets=2, tree_roots=[0], nodes_modes=np.array(modes, np.uint8), nodes_featureids=[0, 0, 0],
             nodes_splits=np.array(splits, dtype), nodes_truenodeids=[1, 0, 1], nodes_trueleafs=[0, 1, 1],
             nodes_falsenodeids=[2, 2, 3], nodes_falseleafs=[0, 1, 1], leaf_targetids=[0, 1, 0, 1],
             leaf_weights=np.array([5.23, 12.12, -12.23, 7.21], dtype))
    a.update(extra)
    return a


def te5_ref(a, x):
    """Walk the TreeEnsemble-5 layout one sample at a time."""
    names = {0: "BRANCH_LEQ", 1: "BRANCH_LT", 2: "BRANCH_GTE", 3: "BRANCH_GT", 4: "BRANCH_EQ", 5: "BRANCH_NEQ"}
    tracks = a.get("nodes_missing_value_tracks_true") or [0] * len(a["nodes_featureids"])
    sets, current = [], []
    for v in (a["membership_values"] if "membership_values" in a else []):
        if math.isnan(v):
            sets.append(current)
            current = []
        else:
            current.append(float(v))
    member_index = np.cumsum(np.asarray(a["nodes_modes"]) == 6) - 1
    how = ["AVERAGE", "SUM", "MIN", "MAX"][a.get("aggregate_function", 1)]
    rows = []
    for row in np.asarray(x, np.float64):
        per_tree = []
        for root in a["tree_roots"]:
            i, leaf = root, None
            while leaf is None:
                v, mode = float(row[a["nodes_featureids"][i]]), int(a["nodes_modes"][i])
                if math.isnan(v) and tracks[i]:
                    go = True
                elif mode == 6:
                    go = v in sets[member_index[i]]
                else:
                    go = compare(names[mode], v, float(a["nodes_splits"][i]))
                side = "true" if go else "false"
                nxt = a[f"nodes_{side}nodeids"][i]
                if a[f"nodes_{side}leafs"][i]:
                    leaf = nxt
                else:
                    i = nxt
            per_tree.append([(a["leaf_targetids"][leaf], float(a["leaf_weights"][leaf]))])
        scores = aggregate(per_tree, a["n_targets"], how, len(per_tree))
        rows.append(transform_row(["NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT"][a.get("post_transform", 0)],
                                  scores))
    return np.array(rows).reshape(len(rows), a["n_targets"])


def test_tree_ensemble_spec_example():
    x = np.array([1.2, 3.4, -0.12, 1.66, 4.14, 1.77], np.float64).reshape(3, 2)
    close(run("TreeEnsemble", 5, x, **te5()), [[5.23, 0], [5.23, 0], [0, 12.12]], np.float64)


@pytest.mark.parametrize("version,tname", type_params("TreeEnsemble", [5], "T", ML))
def test_tree_ensemble_every_type(version, tname):
    dt = np_type(tname)
    a = te5(splits=(3.0, 1.0, 4.0), dtype=dt)
    x = np.array([[1.0, 0], [3.0, 1], [0.5, 2], [4.0, 0], [5.0, 1]], dt)
    got = run("TreeEnsemble", version, x, **a)
    a["leaf_weights"] = a["leaf_weights"].astype(np.float64)
    close(got, te5_ref(a, x), dt, atol=2e-2 if dt == np.float16 else 1e-5)


@pytest.mark.parametrize("modes", [(0, 1, 2), (3, 4, 5), (5, 5, 5), (2, 2, 2), (4, 0, 3), (1, 1, 1)])
@pytest.mark.parametrize("tracks", [None, [1, 0, 1], [0, 1, 0]])
def test_tree_ensemble_modes_and_nan(modes, tracks):
    a = te5(modes=modes, splits=(1.0, 0.5, 2.0))
    if tracks:
        a["nodes_missing_value_tracks_true"] = tracks
    x = np.array([[v] for v in (0.5, 1.0, 2.0, 3.0, -1.0, np.nan)], np.float64)
    close(run("TreeEnsemble", 5, x, **a), te5_ref(a, x), np.float64)


def test_tree_ensemble_set_membership_spec_example():
    a = te5(modes=(0, 6, 6), splits=(11, 232344.0, np.nan), dtype=np.float32, n_targets=4,
            membership_values=np.array([1.2, 3.7, 8, 9, np.nan, 12, 7, np.nan], np.float32),
            nodes_truenodeids=[1, 0, 1], nodes_falsenodeids=[2, 2, 3], nodes_falseleafs=[1, 0, 1],
            leaf_targetids=[0, 1, 2, 3], leaf_weights=np.array([1, 10, 1000, 100], np.float32))
    x = np.array([1.2, 3.4, -0.12, np.nan, 12, 7], np.float32).reshape(-1, 1)
    expected = [[1, 0, 0, 0], [0, 0, 0, 100], [0, 0, 0, 100], [0, 0, 1000, 0], [0, 0, 1000, 0], [0, 10, 0, 0]]
    close(run("TreeEnsemble", 5, x, **a), expected)
    a["nodes_missing_value_tracks_true"] = [1, 0, 0]     # NaN now goes left: not in {1.2, 3.7, 8, 9} nor {12, 7}
    close(run("TreeEnsemble", 5, x, **a)[3], [0, 0, 0, 100])


@pytest.mark.parametrize("agg", [0, 1, 2, 3])
@pytest.mark.parametrize("transform", [0, 1, 2, 3, 4])
def test_tree_ensemble_aggregate_and_transform(agg, transform):
    # two trees: the example tree and a one-leaf tree (a node whose branches reach the same leaf)
    a = te5(aggregate_function=agg, post_transform=transform, tree_roots=[0, 3],
            nodes_modes=np.array([0, 0, 0, 0], np.uint8), nodes_featureids=[0, 0, 0, 1],
            nodes_splits=np.array([3.14, 1.2, 4.2, 0.0]), nodes_truenodeids=[1, 0, 2, 4],
            nodes_trueleafs=[0, 1, 1, 1], nodes_falsenodeids=[2, 1, 3, 4], nodes_falseleafs=[0, 1, 1, 1],
            leaf_targetids=[0, 1, 0, 1, 1], leaf_weights=np.array([0.23, 0.12, -0.23, 0.21, 0.3]))
    x = np.array([1.2, 3.4, -0.12, 1.66, 4.14, 1.77, 5, 0], np.float64).reshape(4, 2)
    if transform == 4:
        a["leaf_weights"] = np.array([0.23, 0.12, 0.03, 0.21, 0.3])
    close(run("TreeEnsemble", 5, x, **a), te5_ref(a, x), np.float64, atol=1e-4)


def test_tree_ensemble_float16_output_and_empty():
    a = te5(dtype=np.float16)
    x = np.array([[1.0, 0], [4.0, 0]], np.float16)
    got = run("TreeEnsemble", 5, x, **a)
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), [[5.23, 0], [0, 12.12]], rtol=1e-3)
    assert_same(run("TreeEnsemble", 5, np.zeros((0, 2), np.float32), **te5(dtype=np.float32)),
                np.zeros((0, 2), np.float32))


# -- tree errors ----------------------------------------------------------------------------------

def test_tree_feature_out_of_range_names_node():
    a = regressor_attrs()
    with raises_naming_node(KernelError, "feature 2"):
        run("TreeEnsembleRegressor", 3, np.zeros((2, 2), np.float32), **a)
    with raises_naming_node(KernelError, "feature 1"):
        run("TreeEnsemble", 5, np.zeros((2, 1), np.float64), **te5(nodes_featureids=[0, 1, 0]))


@pytest.mark.parametrize("change,pattern", [
    ({"nodes_modes": ["BRANCH_LEQ", "BRANCH_XX", "LEAF", "LEAF", "LEAF", "BRANCH_GT", "LEAF", "LEAF"]}, "nodes_modes"),
    ({"nodes_truenodeids": [1, 9, 0, 0, 0, 1, 0, 0]}, "does not define"),
    ({"nodes_truenodeids": [0, 3, 0, 0, 0, 1, 0, 0]}, "cycle"),
    ({"nodes_featureids": [0, -1, 0, 0, 0, 2, 0, 0]}, "negative"),
    ({"nodes_values": [0.5, 1.0]}, "same length"),
    ({"target_ids": [0, 0, 1, 1, 0, 0, 2]}, "out of range"),
    ({"target_nodeids": [2, 3, 3, 4, 1, 2, 7]}, "not defined"),
    ({"post_transform": "SIGMOID"}, "post_transform"),
    ({"aggregate_function": "MEDIAN"}, "aggregate_function"),
    ({"base_values": [1.0, 2.0, 3.0]}, "base_values"),
])
def test_tree_regressor_invalid_attributes(change, pattern):
    with raises_naming_node(InvalidNodeError, pattern):
        run("TreeEnsembleRegressor", 3, X, **{**regressor_attrs(), **change})


@pytest.mark.parametrize("change,pattern", [
    ({"nodes_modes": np.array([0, 7, 0], np.uint8)}, "nodes_modes"),
    ({"nodes_truenodeids": [1, 4, 2]}, "leaf index"),
    ({"nodes_falsenodeids": [5, 1, 3]}, "node index"),
    ({"tree_roots": [3]}, "tree_roots"),
    ({"leaf_targetids": [0, 1, 0, 2]}, "leaf_targetids"),
    ({"nodes_modes": np.array([0, 6, 0], np.uint8)}, "membership_values"),
    ({"aggregate_function": 4}, "aggregate_function"),
    ({"post_transform": 5}, "post_transform"),
])
def test_tree_ensemble_invalid_attributes(change, pattern):
    with raises_naming_node(InvalidNodeError, pattern):
        run("TreeEnsemble", 5, np.zeros((1, 2)), **te5(**change))


def test_tree_classifier_needs_one_label_list():
    a = classifier_attrs([0, 1], [0] * 7, [1.0] * 7)
    a["classlabels_strings"] = ["a", "b"]
    with raises_naming_node(InvalidNodeError, "exactly one"):
        run("TreeEnsembleClassifier", 3, X, 2, **a)


# -- SVM --------------------------------------------------------------------------------------------

def kernel_value(kind, params, x, v):
    gamma, coef0, degree = params
    dot = float(np.dot(x, v))
    if kind == "LINEAR":
        return dot
    if kind == "POLY":
        return (gamma * dot + coef0) ** degree
    if kind == "SIGMOID":
        return math.tanh(gamma * dot + coef0)
    return math.exp(-gamma * float(np.sum((np.asarray(x) - v) ** 2)))


def ref_svc_decisions(a, row):
    """Pairwise decisions (i < j, i outer) and votes of a libsvm-layout SVMClassifier, one sample."""
    per_class = a["vectors_per_class"]
    n_sv, c = sum(per_class), len(per_class)
    sv = np.asarray(a["support_vectors"]).reshape(n_sv, -1)
    coef = np.asarray(a["coefficients"]).reshape(c - 1, n_sv)
    k = [kernel_value(a["kernel_type"], a["kernel_params"], row, v) for v in sv]
    start = np.concatenate([[0], np.cumsum(per_class)])
    decisions, votes, p = [], [0] * c, 0
    for i in range(c):
        for j in range(i + 1, c):
            d = sum(coef[j - 1][m] * k[m] for m in range(start[i], start[i + 1]))
            d += sum(coef[i][m] * k[m] for m in range(start[j], start[j + 1]))
            d += a["rho"][p]
            p += 1
            decisions.append(d)
            votes[i if d > 0 else j] += 1
    return decisions, votes


def ref_coupling(r):
    """Wu, Lin & Weng's pairwise coupling (libsvm's multiclass_probability), one sample, plain Python."""
    c = len(r)
    q = [[0.0] * c for _ in range(c)]
    for t in range(c):
        for j in range(c):
            if j != t:
                q[t][t] += r[j][t] ** 2
                q[t][j] = -r[j][t] * r[t][j]
    p = [1 / c] * c
    for _ in range(100):
        qp = [sum(q[t][j] * p[j] for j in range(c)) for t in range(c)]
        pqp = sum(p[t] * qp[t] for t in range(c))
        if max(abs(qp[t] - pqp) for t in range(c)) < 0.005 / c:
            break
        for t in range(c):
            diff = (-qp[t] + pqp) / q[t][t]
            p[t] += diff
            pqp = (pqp + diff * (diff * q[t][t] + 2 * qp[t])) / (1 + diff) / (1 + diff)
            for j in range(c):
                qp[j] = (qp[j] + diff * q[t][j]) / (1 + diff)
                p[j] /= 1 + diff
    return p


def svc_attrs(c, kind, rng, labels=None, proba=False, transform="NONE"):
    per_class = [2, 1, 3, 2][:c]
    n_sv = sum(per_class)
    a = dict(vectors_per_class=per_class, support_vectors=[float(v) for v in rng.integers(-3, 4, n_sv * 3) / 2],
             coefficients=[float(v) for v in rng.integers(-4, 5, (c - 1) * n_sv) / 4],
             rho=[float(v) for v in rng.integers(-2, 3, c * (c - 1) // 2) / 4], kernel_type=kind,
             kernel_params=[0.5, 0.25, 2.0], post_transform=transform)
    labels = labels or list(range(100, 100 + c))
    a["classlabels_strings" if isinstance(labels[0], str) else "classlabels_ints"] = labels
    if proba:
        a["prob_a"] = [float(v) for v in rng.integers(-6, -1, c * (c - 1) // 2) / 2]
        a["prob_b"] = [float(v) for v in rng.integers(-2, 3, c * (c - 1) // 2) / 4]
    return a, labels


SVM_X = np.array([[0.5, -1.0, 2.0], [1.0, 1.0, 1.0], [-2.0, 0.5, 0.0], [0.0, 0.0, 0.0], [3.0, -1.5, 0.5]], np.float32)


@pytest.mark.parametrize("kind", ["LINEAR", "POLY", "RBF", "SIGMOID"])
@pytest.mark.parametrize("c", [3, 4])
@pytest.mark.parametrize("labels", [None, "strings"])
def test_svm_classifier_multiclass_votes(kind, c, labels):
    rng = np.random.default_rng(c)
    a, labels = svc_attrs(c, kind, rng, [f"k{i}" for i in range(c)] if labels else None)
    y, z = run("SVMClassifier", 1, SVM_X, 2, **a)
    refs = [ref_svc_decisions(a, row) for row in SVM_X.astype(np.float64)]
    assert y.tolist() == [labels[int(np.argmax(votes))] for _, votes in refs]
    close(z, [d for d, _ in refs], atol=1e-4)     # one column per class pair


@pytest.mark.parametrize("kind", ["LINEAR", "RBF"])
@pytest.mark.parametrize("transform", ["NONE", "LOGISTIC"])
def test_svm_classifier_binary(kind, transform):
    rng = np.random.default_rng(2)
    a, labels = svc_attrs(2, kind, rng, ["neg", "pos"], transform=transform)
    y, z = run("SVMClassifier", 1, SVM_X, 2, **a)
    d = [ref_svc_decisions(a, row)[0][0] for row in SVM_X.astype(np.float64)]
    assert y.tolist() == [labels[0] if v > 0 else labels[1] for v in d]   # d > 0 votes for the first class
    expected = [[-v, v] for v in d] if transform == "NONE" else \
        [[1 / (1 + math.exp(v)), 1 / (1 + math.exp(-v))] for v in d]
    close(z, expected, atol=1e-4)


@pytest.mark.parametrize("c", [2, 3, 4])
def test_svm_classifier_probabilities(c):
    rng = np.random.default_rng(10 + c)
    a, labels = svc_attrs(c, "RBF", rng, proba=True)
    y, z = run("SVMClassifier", 1, SVM_X, 2, **a)
    expected_y, expected_z = [], []
    for row in SVM_X.astype(np.float64):
        decisions, votes = ref_svc_decisions(a, row)
        r = [[0.0] * c for _ in range(c)]
        p = 0
        for i in range(c):
            for j in range(i + 1, c):
                v = 1 / (1 + math.exp(decisions[p] * a["prob_a"][p] + a["prob_b"][p]))
                r[i][j] = min(max(v, 1e-7), 1 - 1e-7)
                r[j][i] = 1 - r[i][j]
                p += 1
        expected_y.append(labels[int(np.argmax(votes))])
        expected_z.append(ref_coupling(r))
    assert y.tolist() == expected_y
    close(z, expected_z, atol=1e-4)
    np.testing.assert_allclose(z.sum(axis=1), 1, rtol=1e-4)


def test_svm_classifier_linear_mode_by_hand():
    # no support vectors: one coefficient row per class, rho[0] added to every class score
    a = dict(classlabels_ints=[7, 8, 9], coefficients=[1.0, 0.0, 0.0, 1.0, -1.0, -1.0], rho=[0.5])
    x = np.array([[2.0, 1.0], [0.0, 3.0], [-2.0, -2.0]], np.float32)
    y, z = run("SVMClassifier", 1, x, 2, **a)
    assert_same(y, np.array([7, 8, 9], np.int64))
    close(z, [[2.5, 1.5, -2.5], [0.5, 3.5, -2.5], [-1.5, -1.5, 4.5]])


@pytest.mark.parametrize("version,tname", type_params("SVMClassifier", [1], "T1", ML))
def test_svm_classifier_every_type(version, tname):
    a, labels = svc_attrs(3, "POLY", np.random.default_rng(3))
    x = np.array([[1, -1, 2], [0, 3, -2]]).astype(np_type(tname))
    y, z = run("SVMClassifier", version, x, 2, **a)
    refs = [ref_svc_decisions(a, row) for row in x.astype(np.float64)]
    assert_same(y, np.array([labels[int(np.argmax(v))] for _, v in refs], np.int64))
    close(z, [d for d, _ in refs], atol=1e-4)


@pytest.mark.parametrize("kind", ["LINEAR", "POLY", "RBF", "SIGMOID"])
@pytest.mark.parametrize("one_class", [0, 1])
def test_svm_regressor(kind, one_class):
    sv = np.array([[1.0, 0.0, -1.0], [0.5, 2.0, 0.0], [-1.0, -1.0, 1.0]])
    coefs, rho, params = [0.5, -1.25, 2.0], [-0.75], [0.5, 0.25, 3.0]
    got = run("SVMRegressor", 1, SVM_X, n_supports=3, support_vectors=sv.reshape(-1).tolist(), coefficients=coefs,
              rho=rho, kernel_type=kind, kernel_params=params, one_class=one_class)
    s = [sum(cf * kernel_value(kind, params, row, v) for cf, v in zip(coefs, sv)) + rho[0]
         for row in SVM_X.astype(np.float64)]
    close(got, [[(1.0 if v > 0 else -1.0) if one_class else v] for v in s], atol=1e-4)


@pytest.mark.parametrize("version,tname", type_params("SVMRegressor", [1], "T", ML))
def test_svm_regressor_linear_every_type(version, tname):
    x = np.array([[1, 2, 3], [-1, 0, 4]]).astype(np_type(tname))
    got = run("SVMRegressor", version, x, coefficients=[1.0, -2.0, 0.5], rho=[0.25])
    close(got, [[1 - 4 + 1.5 + 0.25], [-1 + 0 + 2 + 0.25]])


def test_svm_errors():
    with raises_naming_node(KernelError, "features"):
        run("SVMRegressor", 1, np.zeros((2, 4), np.float32), coefficients=[1.0, -2.0, 0.5], rho=[0.25])
    with raises_naming_node(InvalidNodeError, "kernel_type"):
        run("SVMRegressor", 1, SVM_X, coefficients=[1.0, -2.0, 0.5], rho=[0.25], kernel_type="CUBIC")
    a, _ = svc_attrs(3, "RBF", np.random.default_rng(0))
    with raises_naming_node(InvalidNodeError, "rho"):
        run("SVMClassifier", 1, SVM_X, 2, **{**a, "rho": [0.0]})
    with raises_naming_node(InvalidNodeError, "coefficients"):
        run("SVMClassifier", 1, SVM_X, 2, **{**a, "coefficients": a["coefficients"][:-1]})
    with raises_naming_node(InvalidNodeError, "prob_a and prob_b"):
        run("SVMClassifier", 1, SVM_X, 2, **{**a, "prob_a": [1.0, 2.0, 3.0]})


# -- linear models ----------------------------------------------------------------------------------

@pytest.mark.parametrize("version,tname", type_params("LinearRegressor", [1], "T", ML))
def test_linear_regressor_every_type(version, tname):
    x = np.array([[1, 2], [3, -4], [0, 0]]).astype(np_type(tname))
    got = run("LinearRegressor", version, x, coefficients=[0.5, -1.0, 2.0, 0.25], intercepts=[1.0, -1.0], targets=2)
    close(got, [[1 * 0.5 - 2 + 1, 2 + 0.5 - 1], [1.5 + 4 + 1, 6 - 1 - 1], [1, -1]])


@pytest.mark.parametrize("transform", TRANSFORMS)
def test_linear_regressor_transforms(transform):
    x = np.array([[0.1, 0.2], [0.3, -0.1]], np.float32)
    coef, icpt = [0.5, 1.0, -0.5, 0.25, 1.0, 1.0], [0.25, 0.5, 0.0]
    got = run("LinearRegressor", 1, x, coefficients=coef, intercepts=icpt, targets=3, post_transform=transform)
    raw = [[sum(coef[t * 2 + f] * float(row[f]) for f in range(2)) + icpt[t] for t in range(3)] for row in x]
    close(got, [transform_row(transform, r) for r in raw], atol=1e-4)


def test_linear_regressor_default_one_target_no_intercept():
    got = run("LinearRegressor", 1, np.array([[1.0, 2.0, 3.0]], np.float64), coefficients=[1.0, 1.0, -1.0])
    close(got, [[0.0]])
    with raises_naming_node(KernelError, "features"):
        run("LinearRegressor", 1, np.zeros((1, 2), np.float32), coefficients=[1.0, 1.0, -1.0])


@pytest.mark.parametrize("version,tname", type_params("LinearClassifier", [1], "T1", ML))
def test_linear_classifier_every_type(version, tname):
    x = np.array([[1, 2], [3, -4], [-1, 0]]).astype(np_type(tname))
    y, z = run("LinearClassifier", version, x, 2, coefficients=[1.0, 0.0, 0.0, 1.0, -1.0, -1.0],
               intercepts=[0.0, 0.5, 0.25], classlabels_ints=[3, 4, 5])
    assert_same(y, np.array([4, 3, 5], np.int64))
    close(z, [[1, 2.5, -2.75], [3, -3.5, 1.25], [-1, 0.5, 1.25]])


@pytest.mark.parametrize("transform", TRANSFORMS[:4])
@pytest.mark.parametrize("multi_class", [0, 1])
def test_linear_classifier_multiclass_strings(transform, multi_class):
    x = np.array([[0.5, 1.0], [-1.0, 2.0], [0.0, 0.0]], np.float32)
    coef, icpt = [1.0, -1.0, 0.5, 0.5, -2.0, 0.0], [0.1, 0.2, 0.3]
    y, z = run("LinearClassifier", 1, x, 2, coefficients=coef, intercepts=icpt, classlabels_strings=["a", "b", "c"],
               post_transform=transform, multi_class=multi_class)
    raw = [[sum(coef[t * 2 + f] * float(row[f]) for f in range(2)) + icpt[t] for t in range(3)] for row in x]
    assert_same(y, np.array(["abc"[int(np.argmax(r))] for r in raw], dtype=object))
    close(z, [transform_row(transform, r) for r in raw], atol=1e-5)


@pytest.mark.parametrize("transform", ["NONE", "LOGISTIC"])
def test_linear_classifier_binary_single_score(transform):
    # one row of coefficients and two labels: s > 0 -> second label; scores [1 - s, s]
    x = np.array([[1.0, 1.0], [0.0, -1.0], [0.25, 0.0]], np.float32)
    y, z = run("LinearClassifier", 1, x, 2, coefficients=[0.5, 0.25], intercepts=[-0.5],
               classlabels_strings=["n", "p"], post_transform=transform)
    s = [0.25, -0.75, -0.375]
    assert_same(y, np.array(["p", "n", "n"], dtype=object))
    close(z, [[1 - v, v] for v in s] if transform == "NONE" else
          [[1 / (1 + math.exp(v)), 1 / (1 + math.exp(-v))] for v in s])


def test_linear_classifier_errors():
    with raises_naming_node(InvalidNodeError, "exactly one"):
        run("LinearClassifier", 1, SVM_X, 2, coefficients=[1.0, 2.0, 3.0])
    with raises_naming_node(InvalidNodeError, "class labels"):
        run("LinearClassifier", 1, SVM_X, 2, coefficients=[1.0] * 9, intercepts=[0.0, 0.0, 0.0],
            classlabels_ints=[1, 2])
    with raises_naming_node(KernelError, "features"):
        run("LinearClassifier", 1, np.zeros((2, 2), np.float32), 2, coefficients=[1.0] * 9,
            intercepts=[0.0, 0.0, 0.0], classlabels_ints=[1, 2, 3])


def test_models_through_session_with_string_labels():
    """A two-node-free model with both outputs named: labels are str objects, scores float32."""
    node = helper.make_node("TreeEnsembleClassifier", ["X"], ["label", "prob"], domain=ML,
                            **classifier_attrs(["a", "b", "c"], [0, 1, 2, 1, 2, 0, 2], TARGETS["target_weights"]))
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 3])],
                              [helper.make_tensor_value_info("label", TensorProto.STRING, [None]),
                               helper.make_tensor_value_info("prob", TensorProto.FLOAT, [None, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(ML, 3)],
                              ir_version=10)
    label, prob = onnx_mini.prepare(model).run([X_FINITE])
    assert label.dtype == object and all(isinstance(v, str) for v in label)
    assert prob.dtype == np.float32 and prob.shape == (len(X_FINITE), 3)
