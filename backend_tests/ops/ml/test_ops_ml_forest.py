"""Tree ensembles on random forests against a plain Python walk written here from the spec, through every
evaluation path of onnx_mini/ops/ml/forest.py: one row and many, the rows split into chunks and over the
threads, one comparison mode everywhere and mixed modes, NaN features with and without
missing_value_tracks_true, shallow and deep unbalanced trees, and each aggregation layout (one target per
tree in class order, in another order, trees scoring nothing, leaves scoring several targets).

Thresholds and leaf weights are multiples of 1/4 and 1/8: float32 holds them exactly and their sums are
exact in any order, so scores and labels must match exactly, not merely closely.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from onnx_mini.errors import KernelError
from onnx_mini.ops.ml import forest as forest_module

from helpers import run_node

ML = "ai.onnx.ml"
MODES = ["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ"]
N_FEATURES = 4


def random_forest(seed: int, n_trees: int, max_depth: int, modes: list[str], k: int, scoring: str) -> dict:
    """Legacy attributes (nodes_* and w_* for the weights) of random unbalanced trees. Node ids are
    shuffled within each tree and the nodes listed in random order, the root first. scoring: 'tree'
    (every leaf of tree t scores class t % k), 'reversed' (class k-1 - t % k), 'one' (every tree scores
    class 1), 'some' (as 'tree', but a third of the trees score nothing), 'multi' (each leaf scores a
    random set of classes, a class possibly twice)."""
    rng = np.random.default_rng(seed)
    a = {key: [] for key in ("nodes_treeids", "nodes_nodeids", "nodes_featureids", "nodes_values", "nodes_modes",
                             "nodes_truenodeids", "nodes_falsenodeids", "nodes_missing_value_tracks_true",
                             "w_treeids", "w_nodeids", "w_ids", "w_weights")}
    for tree in range(1000, 1000 + n_trees):          # tree ids need not start at 0
        nodes = []

        def build(depth):
            at = len(nodes)
            nodes.append(None)
            if depth == max_depth or (depth > 0 and rng.random() < 0.3):
                nodes[at] = ("LEAF", 0, 0.0, 0, 0, 0)
            else:
                mode = modes[int(rng.integers(len(modes)))]
                feature, value = int(rng.integers(N_FEATURES)), float(rng.integers(-6, 7)) / 4
                tracks = int(rng.random() < 0.4)
                true, false = build(depth + 1), build(depth + 1)
                nodes[at] = (mode, feature, value, true, false, tracks)
            return at
        build(0)
        ids = rng.permutation(len(nodes)) * 3 + 5                       # node number -> node id
        order = [0] + list(rng.permutation(np.arange(1, len(nodes))))
        t = tree - 1000
        for i in order:
            mode, feature, value, true, false, tracks = nodes[i]
            leaf = mode == "LEAF"
            a["nodes_treeids"].append(tree)
            a["nodes_nodeids"].append(int(ids[i]))
            a["nodes_featureids"].append(feature)
            a["nodes_values"].append(value)
            a["nodes_modes"].append(mode)
            a["nodes_truenodeids"].append(0 if leaf else int(ids[true]))
            a["nodes_falsenodeids"].append(0 if leaf else int(ids[false]))
            a["nodes_missing_value_tracks_true"].append(tracks)
            if not leaf:
                continue
            if scoring == "multi":
                targets = rng.integers(k, size=int(rng.integers(0, 4))).tolist()
            elif scoring == "some" and t % 3 == 2:
                targets = []
            else:
                targets = [{"tree": t % k, "some": t % k, "reversed": k - 1 - t % k, "one": 1}[scoring]]
            for target in targets:
                a["w_treeids"].append(tree)
                a["w_nodeids"].append(int(ids[i]))
                a["w_ids"].append(target)
                a["w_weights"].append(float(rng.integers(-16, 17)) / 8)
    return a


def goes_true(mode: str, v: float, t: float, tracks: int) -> bool:
    if math.isnan(v) and tracks:
        return True
    return {"BRANCH_LEQ": v <= t, "BRANCH_LT": v < t, "BRANCH_GTE": v >= t, "BRANCH_GT": v > t,
            "BRANCH_EQ": v == t, "BRANCH_NEQ": v != t}[mode]


def reference_scores(a: dict, x: np.ndarray, k: int, how: str) -> np.ndarray:
    """Walk every tree node by node for every row (the root: each tree's first listed node), then
    aggregate the reached leaves' weights per target."""
    at = {(t, n): i for i, (t, n) in enumerate(zip(a["nodes_treeids"], a["nodes_nodeids"]))}
    roots = {}
    for i, t in enumerate(a["nodes_treeids"]):
        roots.setdefault(t, i)
    weights: dict = {}
    for t, n, target, w in zip(a["w_treeids"], a["w_nodeids"], a["w_ids"], a["w_weights"]):
        leaf = weights.setdefault((t, n), {})
        leaf[target] = leaf.get(target, 0.0) + w
    out = np.zeros((len(x), k))
    for r, row in enumerate(np.asarray(x, np.float64)):
        reached = []
        for tree, i in roots.items():
            while a["nodes_modes"][i] != "LEAF":
                go = goes_true(a["nodes_modes"][i], float(row[a["nodes_featureids"][i]]),
                                    a["nodes_values"][i], a["nodes_missing_value_tracks_true"][i])
                i = at[(tree, a["nodes_truenodeids"][i] if go else a["nodes_falsenodeids"][i])]
            reached.append(weights.get((tree, a["nodes_nodeids"][i]), {}))
        for target in range(k):
            values = [leaf[target] for leaf in reached if target in leaf]
            if how in ("SUM", "AVERAGE"):
                out[r, target] = sum(values) / (len(roots) if how == "AVERAGE" else 1)
            elif values:
                out[r, target] = min(values) if how == "MIN" else max(values)
    return out


def features(seed: int, n: int, dtype=np.float32) -> np.ndarray:
    """Values on the thresholds' grid (so that EQ / NEQ / ties are exercised), a few NaNs."""
    rng = np.random.default_rng(seed)
    x = (rng.integers(-7, 8, size=(n, N_FEATURES)) / 4).astype(dtype)
    x[rng.random(x.shape) < 0.1] = np.nan
    return x


def regressor(a: dict, k: int, how: str, base=None) -> dict:
    out = {key: v for key, v in a.items() if key.startswith("nodes_")}
    out.update(target_treeids=a["w_treeids"], target_nodeids=a["w_nodeids"], target_ids=a["w_ids"],
               target_weights=a["w_weights"], n_targets=k, aggregate_function=how)
    if base is not None:
        out["base_values"] = base
    return out


@pytest.fixture(params=["one chunk", "chunks", "chunks on threads", "tree groups", "tree groups on threads"])
def walk(request, monkeypatch):
    """The rows walked at once, in chunks of a few rows, or in chunks spread over the threads; or in blocks
    of a few rows and a few trees (a forest whose tables outgrow the caches), the groups of each chunk of
    rows one after the other or over the threads."""
    if request.param != "one chunk":
        monkeypatch.setattr(forest_module, "_CHUNK", 64)
        monkeypatch.setattr(forest_module, "_TOP_CHUNK", 64)     # many rows' top levels: 8 rows a chunk
    if request.param.startswith("tree groups"):
        monkeypatch.setattr(forest_module, "_GROUPED_FROM_BYTES", 0)
        monkeypatch.setattr(forest_module, "_GROUP_TABLE_BYTES", 600)    # a few trees a group
        monkeypatch.setattr(forest_module, "_BLOCK_ROW_BYTES", 100)      # 6 rows of 4 float32 features
    if request.param.endswith("on threads"):
        monkeypatch.setattr(forest_module, "_PARALLEL_STEPS", 1)
    return request.param


@pytest.mark.parametrize("depth", [1, 3, 7])
@pytest.mark.parametrize("modes", [["BRANCH_LEQ"], ["BRANCH_NEQ"], MODES])
@pytest.mark.parametrize("scoring", ["tree", "reversed", "one", "some", "multi"])
def test_regressor_sum_matches_reference(walk, depth, modes, scoring):
    k = 3
    a = random_forest(depth * 100 + len(modes), 12, depth, modes, k, scoring)
    x = features(depth, 41)
    base = [0.5, -1.25, 2.0]
    got = run_node("TreeEnsembleRegressor", 3, [x], domain=ML, **regressor(a, k, "SUM", base))
    expected = reference_scores(a, x, k, "SUM") + base
    np.testing.assert_array_equal(got, expected.astype(np.float32))
    for row in (0, 7):                               # one row at a time: the batch-1 path
        one = run_node("TreeEnsembleRegressor", 3, [x[row:row + 1]], domain=ML, **regressor(a, k, "SUM", base))
        np.testing.assert_array_equal(one, got[row:row + 1])


@pytest.mark.parametrize("how", ["AVERAGE", "MIN", "MAX"])
@pytest.mark.parametrize("scoring", ["tree", "some", "multi"])
def test_regressor_aggregates_match_reference(walk, how, scoring):
    k = 3
    a = random_forest(7, 9, 4, MODES, k, scoring)
    x = features(3, 30)
    got = run_node("TreeEnsembleRegressor", 3, [x], domain=ML, **regressor(a, k, how))
    np.testing.assert_allclose(got, reference_scores(a, x, k, how).astype(np.float32), rtol=1e-6, atol=0)


def test_double_input_and_a_single_tree_deeper_than_the_chunk(monkeypatch):
    monkeypatch.setattr(forest_module, "_CHUNK", 8)
    a = random_forest(11, 1, 12, MODES, 1, "tree")
    x = features(5, 50, np.float64)
    got = run_node("TreeEnsembleRegressor", 3, [x], domain=ML, **regressor(a, 1, "SUM"))
    np.testing.assert_array_equal(got, reference_scores(a, x, 1, "SUM").astype(np.float32))


def softmax(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("labels", [[7, 3, 11, 5], ["cat", "dog", "eel", "fox"]])
@pytest.mark.parametrize("transform", ["NONE", "SOFTMAX", "LOGISTIC"])
@pytest.mark.parametrize("scoring", ["tree", "reversed", "multi"])
@pytest.mark.parametrize("rows", [1, 2, 37])
def test_classifier_matches_reference(walk, labels, transform, scoring, rows):
    # a gradient-boosting-like layout ('tree': one tree per class and round) and a random-forest-like one
    k = len(labels)
    a = random_forest(len(scoring) + rows, 16, 3, ["BRANCH_LEQ"] if scoring == "tree" else MODES, k, scoring)
    attrs = {key: v for key, v in a.items() if key.startswith("nodes_")}
    attrs.update(class_treeids=a["w_treeids"], class_nodeids=a["w_nodeids"], class_ids=a["w_ids"],
                 class_weights=a["w_weights"], base_values=[0.25, -0.5, 0.0, 0.125], post_transform=transform)
    attrs["classlabels_strings" if isinstance(labels[0], str) else "classlabels_int64s"] = labels
    x = features(rows, rows)
    got_labels, got_scores = run_node("TreeEnsembleClassifier", 3, [x], 2, domain=ML, **attrs)
    scores = reference_scores(a, x, k, "SUM") + attrs["base_values"]
    assert got_labels.tolist() == [labels[i] for i in np.argmax(scores, axis=1)]
    expected = {"NONE": scores, "SOFTMAX": softmax(scores), "LOGISTIC": 1 / (1 + np.exp(-scores))}[transform]
    np.testing.assert_allclose(got_scores, expected.astype(np.float32), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("scoring", ["tree", "some"])
def test_classifier_one_row_is_the_row_of_the_batch(scoring):
    # one row of a shallow gradient-boosting-like forest ('tree': every class scored by its trees in
    # order, Forest.row_sums; 'some': trees scoring nothing, scores()) with SOFTMAX: the batch's label and
    # probabilities, float64 rounded once; too few features: the error names the feature read
    k = 4
    a = random_forest(11, 24, 3, ["BRANCH_LEQ", "BRANCH_GT"], k, scoring)
    attrs = {key: v for key, v in a.items() if key.startswith("nodes_")}
    attrs.update(class_treeids=a["w_treeids"], class_nodeids=a["w_nodeids"], class_ids=a["w_ids"],
                 class_weights=a["w_weights"], base_values=[0.25, -0.5, 0.0, 0.125], post_transform="SOFTMAX",
                 classlabels_int64s=[7, 3, 11, 5])
    x = features(12, 30)
    labels, probs = run_node("TreeEnsembleClassifier", 3, [x], 2, domain=ML, **attrs)
    scores = reference_scores(a, x, k, "SUM") + attrs["base_values"]
    for i in range(len(x)):
        one_label, one = run_node("TreeEnsembleClassifier", 3, [x[i:i + 1]], 2, domain=ML, **attrs)
        assert one_label.tolist() == [labels[i]] == [[7, 3, 11, 5][int(np.argmax(scores[i]))]]
        np.testing.assert_allclose(one[0], softmax(scores[i:i + 1])[0].astype(np.float32), rtol=1.2e-7, atol=0)
        np.testing.assert_allclose(one[0], probs[i], rtol=1e-6, atol=0)
    top = max(a["nodes_featureids"])
    with pytest.raises(KernelError, match=f"reads feature {top} but X has {top} features"):
        run_node("TreeEnsembleClassifier", 3, [x[:1, :top]], 2, domain=ML, **attrs)


def test_tree_ensemble_5_members_and_nan_every_walk(monkeypatch):
    # TreeEnsemble-5 with BRANCH_MEMBER beside comparisons: the batch as a whole, in chunks, on threads and
    # row by row give the same scores (the spec example's values are tested in test_ops_ml_models.py)
    rng = np.random.default_rng(3)
    n_trees = 6
    modes, splits, features_, true_ids, true_leaf, false_ids, false_leaf, tracks = ([] for _ in range(8))
    members = []
    for t in range(n_trees):      # each tree: node 3t tests, its children 3t+1, 3t+2 test, four leaves 4t..4t+3
        for j in range(3):
            mode = int(rng.choice([0, 2, 5, 6]))
            modes.append(mode)
            splits.append(float(rng.integers(-4, 5)) / 2 if mode != 6 else np.nan)
            features_.append(int(rng.integers(3)))
            tracks.append(int(rng.random() < 0.5))
            if mode == 6:
                members.append(sorted(set((rng.integers(-4, 5, size=3) / 2).tolist())))
            if j == 0:
                true_ids.append(3 * t + 1), true_leaf.append(0), false_ids.append(3 * t + 2), false_leaf.append(0)
            else:
                true_ids.append(4 * t + 2 * (j - 1)), true_leaf.append(1)
                false_ids.append(4 * t + 2 * (j - 1) + 1), false_leaf.append(1)
    membership = np.array([v for s in members for v in s + [np.nan]], np.float32)
    attrs = dict(nodes_modes=np.array(modes, np.uint8), nodes_splits=np.array(splits, np.float32),
                 nodes_featureids=features_, nodes_truenodeids=true_ids, nodes_trueleafs=true_leaf,
                 nodes_falsenodeids=false_ids, nodes_falseleafs=false_leaf,
                 nodes_missing_value_tracks_true=tracks, tree_roots=[3 * t for t in range(n_trees)],
                 leaf_targetids=[i % 2 for i in range(4 * n_trees)],
                 leaf_weights=np.array(rng.integers(-8, 9, size=4 * n_trees) / 4, np.float32),
                 membership_values=membership, n_targets=2, aggregate_function=1)
    x = (rng.integers(-4, 5, size=(40, 3)) / 2).astype(np.float32)
    x[rng.random(x.shape) < 0.15] = np.nan
    whole = run_node("TreeEnsemble", 5, [x], domain=ML, **attrs)
    rows = np.concatenate([run_node("TreeEnsemble", 5, [x[i:i + 1]], domain=ML, **attrs) for i in range(len(x))])
    np.testing.assert_array_equal(whole, rows)
    monkeypatch.setattr(forest_module, "_CHUNK", 16)
    np.testing.assert_array_equal(run_node("TreeEnsemble", 5, [x], domain=ML, **attrs), whole)
    monkeypatch.setattr(forest_module, "_PARALLEL_STEPS", 1)
    np.testing.assert_array_equal(run_node("TreeEnsemble", 5, [x], domain=ML, **attrs), whole)
    monkeypatch.setattr(forest_module, "_GROUPED_FROM_BYTES", 0)     # blocks of a few rows and two trees
    monkeypatch.setattr(forest_module, "_GROUP_TABLE_BYTES", 200)
    monkeypatch.setattr(forest_module, "_BLOCK_ROW_BYTES", 40)
    np.testing.assert_array_equal(run_node("TreeEnsemble", 5, [x], domain=ML, **attrs), whole)


@pytest.mark.parametrize("threads", [False, True])
@pytest.mark.parametrize("rows_cap", ["row bytes", "reached bytes"])
def test_tree_groups_walk_every_tree_once_per_chunk(monkeypatch, threads, rows_cap):
    # the walk by groups of trees, made to run on a small forest: each chunk of rows (at most 6 by X's row
    # bytes, or 3 by the bytes of the chunk's leaves) visits every tree once (the groups' slices tile the
    # trees), and the scores are the reference's, exactly
    monkeypatch.setattr(forest_module, "_CHUNK", 16)      # blocks of 16 leaves: groups of 2-5 trees
    monkeypatch.setattr(forest_module, "_GROUPED_FROM_BYTES", 0)
    monkeypatch.setattr(forest_module, "_GROUP_TABLE_BYTES", 600)
    monkeypatch.setattr(forest_module, "_BLOCK_ROW_BYTES", 100)
    if rows_cap == "reached bytes":
        monkeypatch.setattr(forest_module, "_REACHED_BYTES", 3 * 8 * 12)     # 3 rows of 12 trees' leaves
    most = 3 if rows_cap == "reached bytes" else 6
    if threads:
        monkeypatch.setattr(forest_module, "_PARALLEL_STEPS", 1)
    seen = []
    walk = forest_module.Forest._leaves_walk

    def spy(self, x, trees=None):
        seen.append((x.shape[0], trees, self.n_trees))
        return walk(self, x, trees)
    monkeypatch.setattr(forest_module.Forest, "_leaves_walk", spy)
    a = random_forest(5, 12, 7, MODES, 3, "multi")
    x = features(7, 41)
    got = run_node("TreeEnsembleRegressor", 3, [x], domain=ML, **regressor(a, 3, "SUM"))
    np.testing.assert_array_equal(got, (reference_scores(a, x, 3, "SUM")).astype(np.float32))
    blocks = [(rows, trees) for rows, trees, _ in seen if trees is not None]
    assert blocks and all(0 < rows <= most for rows, _ in blocks)
    n_trees = seen[0][2]
    assert n_trees == 12
    covered = sorted(t for _, trees in blocks for t in range(n_trees)[trees])
    assert covered == sorted(list(range(n_trees)) * -(-41 // most))     # each chunk of rows over every tree


@pytest.mark.parametrize("roots,expected", [
    ([0, 1], [[11, 0], [20, 0], [10, 100]]),
    ([0, 0, 1], [[12, 0], [30, 0], [20, 100]]),          # a root listed twice is two trees
    ([0, 0], [[2, 0], [20, 0], [20, 0]]),
])
def test_tree_ensemble_5_trees_sharing_nodes(roots, expected):
    # tree A: x <= 0 ? leaf a : leaf L;  tree B: x <= 1 ? leaf L : leaf b. The shared leaf L scores class 0
    # although tree B's own leaf scores class 1: no "one class per tree" layout applies.
    attrs = dict(nodes_featureids=[0, 0], nodes_splits=np.array([0.0, 1.0], np.float32),
                 nodes_modes=np.array([0, 0], np.uint8), nodes_truenodeids=[0, 1], nodes_trueleafs=[1, 1],
                 nodes_falsenodeids=[1, 2], nodes_falseleafs=[1, 1], tree_roots=roots, leaf_targetids=[0, 0, 1],
                 leaf_weights=np.array([1, 10, 100], np.float32), n_targets=2, aggregate_function=1)
    x = np.array([[-1], [0.5], [2]], np.float32)
    np.testing.assert_array_equal(run_node("TreeEnsemble", 5, [x], domain=ML, **attrs), np.float32(expected))


def test_one_row_code_gathers_the_seven_outcome_bytes():
    # the one-row walk reads a tree's eight test outcomes (0 or 1 each) as one little-endian int64; times
    # _GATHER, its top byte must be the first seven outcomes as bits 0..6 (the eighth, padding, ignored)
    patterns = ((np.arange(256)[:, None] >> np.arange(8)) & 1).astype(np.uint8)   # every outcome set
    code = (patterns.view("<i8").reshape(-1) * forest_module._GATHER) >> 56
    np.testing.assert_array_equal(code, np.arange(256) & 127)


@pytest.mark.parametrize("depth", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("scoring", ["multi", "tree", "some"])
def test_one_row_top_levels_match_the_level_walk_and_the_reference(monkeypatch, depth, dtype, scoring):
    # one row decides each tree's top three levels at once (jump tables; for trees no deeper and one
    # value per node, the tables give the leaves' values), then walks the deeper ones; with the tables
    # off (more trees than _TOP_MAX_TREES) the level walk runs: both equal the reference
    k = 3
    a = random_forest(depth + 40, 10, depth, MODES, k, scoring)
    attrs = regressor(a, k, "SUM", [0.5, -1.25, 2.0])
    x = features(depth + 7, 30, dtype)
    expected = (reference_scores(a, x, k, "SUM") + attrs["base_values"]).astype(np.float32)
    calls = []
    top_walk = forest_module.Forest._top_walk
    monkeypatch.setattr(forest_module.Forest, "_top_walk", lambda *args: calls.append(1) or top_walk(*args))
    rows = [run_node("TreeEnsembleRegressor", 3, [x[i:i + 1]], domain=ML, **attrs) for i in range(len(x))]
    np.testing.assert_array_equal(np.concatenate(rows), expected)
    assert len(calls) == len(x)                       # the jump tables served every row
    monkeypatch.setattr(forest_module, "_TOP_MAX_TREES", 0)
    rows = [run_node("TreeEnsembleRegressor", 3, [x[i:i + 1]], domain=ML, **attrs) for i in range(len(x))]
    np.testing.assert_array_equal(np.concatenate(rows), expected)
    assert len(calls) == len(x)                       # and not these


@pytest.mark.parametrize("mode", ["BRANCH_LEQ", "BRANCH_LT", "BRANCH_NEQ"])
@pytest.mark.parametrize("depth", [2, 3, 5])
def test_one_row_single_mode_without_missing_value_tracks(monkeypatch, mode, depth):
    # one comparison mode and no missing_value_tracks_true (scikit-learn's forests): the one-row walk
    # applies the comparison alone; NaN features go to the false child (the true one for NEQ)
    k = 3
    a = random_forest(depth + 60, 12, depth, [mode], k, "tree")
    a["nodes_missing_value_tracks_true"] = [0] * len(a["nodes_modes"])
    attrs = regressor(a, k, "SUM", [0.5, -1.25, 2.0])
    x = features(depth + 9, 30)
    expected = (reference_scores(a, x, k, "SUM") + attrs["base_values"]).astype(np.float32)
    tests = []
    test = forest_module.Forest.test
    monkeypatch.setattr(forest_module.Forest, "test", lambda *args, **kw: tests.append(1) or test(*args, **kw))
    rows = [run_node("TreeEnsembleRegressor", 3, [x[i:i + 1]], domain=ML, **attrs) for i in range(len(x))]
    np.testing.assert_array_equal(np.concatenate(rows), expected)
    if depth <= 3:
        assert not tests                              # the comparison alone decided every row
    assert np.isnan(x).any(axis=1).sum() >= 3         # rows with a NaN feature were among them


def test_classifier_one_row_single_mode_without_missing_value_tracks(monkeypatch):
    # scikit-learn's gradient boosting: one mode (LEQ), no missing_value_tracks_true, depth <= 3, each
    # class scored by its trees in order: one row's sums come from the comparison alone, bound once
    # (Forest._plain_row_sums, in place of the row_sums method); the reference's label and probabilities
    # (NaN features to the false child); too few features: the error names the feature read
    k = 3
    a = random_forest(21, 30, 3, ["BRANCH_LEQ"], k, "tree")
    a["nodes_missing_value_tracks_true"] = [0] * len(a["nodes_modes"])
    attrs = {key: v for key, v in a.items() if key.startswith("nodes_")}
    attrs.update(class_treeids=a["w_treeids"], class_nodeids=a["w_nodeids"], class_ids=a["w_ids"],
                 class_weights=a["w_weights"], base_values=[0.25, -0.5, 0.125], post_transform="SOFTMAX",
                 classlabels_int64s=[4, 0, 9])
    method_calls = []
    row_sums = forest_module.Forest.row_sums
    monkeypatch.setattr(forest_module.Forest, "row_sums",
                        lambda *args: method_calls.append(1) or row_sums(*args))
    x = features(22, 30)
    scores = reference_scores(a, x, k, "SUM") + attrs["base_values"]
    for i in range(len(x)):
        one_label, one = run_node("TreeEnsembleClassifier", 3, [x[i:i + 1]], 2, domain=ML, **attrs)
        assert one_label.tolist() == [[4, 0, 9][int(np.argmax(scores[i]))]]
        np.testing.assert_allclose(one[0], softmax(scores[i:i + 1])[0].astype(np.float32), rtol=1.2e-7, atol=0)
    assert not method_calls
    top = max(a["nodes_featureids"])
    with pytest.raises(KernelError, match=f"reads feature {top} but X has {top} features"):
        run_node("TreeEnsembleClassifier", 3, [x[:1, :top]], 2, domain=ML, **attrs)


@pytest.mark.parametrize("modes", [["BRANCH_LEQ"], ["BRANCH_GT"], MODES])
@pytest.mark.parametrize("tracks", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rows", [8, 13, 64])
@pytest.mark.parametrize("how", ["SUM", "AVERAGE"])
def test_many_rows_top_levels_match_the_reference(walk, monkeypatch, modes, tracks, dtype, rows, how):
    # from _TOP_MIN_ROWS rows on, trees no deeper than the top levels with one value per node are scored
    # by Forest._top_scores (eight rows' codes per uint64, rows padded to a multiple of 8): the one
    # comparison alone (one mode, no missing_value_tracks_true) or the full test (mixed modes, NaN
    # overrides), in one chunk, chunks of 8 rows, on threads; rows below the threshold take the walk
    k = 3
    a = random_forest(rows + len(modes) + tracks, 15, 3, modes, k, "tree")
    if not tracks:
        a["nodes_missing_value_tracks_true"] = [0] * len(a["nodes_modes"])
    attrs = regressor(a, k, how, [0.5, -1.25, 2.0])
    x = features(rows + 3, rows, dtype)
    expected = (reference_scores(a, x, k, how) + attrs["base_values"]).astype(np.float32)
    calls = []
    top_scores = forest_module.Forest._top_scores
    monkeypatch.setattr(forest_module.Forest, "_top_scores", lambda *args: calls.append(1) or top_scores(*args))
    np.testing.assert_array_equal(run_node("TreeEnsembleRegressor", 3, [x], domain=ML, **attrs), expected)
    assert calls == [1]
    few = forest_module._TOP_MIN_ROWS - 1
    np.testing.assert_array_equal(run_node("TreeEnsembleRegressor", 3, [x[:few]], domain=ML, **attrs),
                                  expected[:few])
    assert calls == [1]                                # (the level walk)
