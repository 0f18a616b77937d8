"""Whole models shaped like what converters emit (sklearn-onnx pipelines, random forests, gradient
boosting, SVMs with probabilities, greedy-decoding Loops, Scan RNNs), run end to end through
`onnx_mini.prepare(model).run(...)` and `onnx_mini.InferenceSession(model).run(None, feeds)`.

Every expected value is computed in this file, independently of any runtime: numpy formulas written
from the spec text, trees walked one sample at a time in plain Python, the recurrences unrolled in a
numpy loop.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_mini
from onnx_mini.errors import KernelError

ML = "ai.onnx.ml"
F, I64, BOOL, STR = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL, TensorProto.STRING


def build(nodes, inputs, outputs, initializers=(), opsets=(("", 21),), name="g"):
    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [vi if not isinstance(vi, tuple) else helper.make_tensor_value_info(*vi) for vi in outputs],
        [numpy_helper.from_array(v, k) for k, v in dict(initializers).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets],
                             ir_version=10, producer_name="test_pipelines")


def run_both(model, feeds: dict) -> list:
    """Outputs of prepare(model).run(feeds); InferenceSession(model).run(None, feeds) must give the same."""
    out = list(onnx_mini.prepare(model).run(feeds))
    again = onnx_mini.InferenceSession(model).run(None, feeds)
    assert len(again) == len(out)
    for a, b in zip(out, again):
        if isinstance(a, np.ndarray):
            assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape
            assert a.tolist() == b.tolist() if a.dtype == object else np.array_equal(a, b, equal_nan=True)
        else:
            assert a == b
    return out


def close(got, expected, dtype=np.float32, rtol=1e-5, atol=1e-6):
    assert type(got) is np.ndarray and got.dtype == dtype, (type(got), getattr(got, "dtype", None))
    expected = np.asarray(expected, np.float64)
    assert got.shape == expected.shape, (got.shape, expected.shape)
    np.testing.assert_allclose(got.astype(np.float64), expected, rtol=rtol, atol=atol)


def same(got, expected: np.ndarray):
    assert type(got) is np.ndarray and got.dtype == expected.dtype and got.shape == expected.shape, (
        type(got), getattr(got, "dtype", None), getattr(got, "shape", None), expected.dtype, expected.shape)
    assert got.tolist() == expected.tolist()


# -- 1. scikit-learn pipeline: Scaler -> LinearClassifier -> Normalizer -> ZipMap -------------------

def sklearn_logreg_pipeline(labels, mean, std, coef, intercept):
    """What sklearn-onnx emits for Pipeline(StandardScaler(), LogisticRegression(multi_class='ovr')):
    Scaler(offset=mean, scale=1/std), LinearClassifier(post_transform=LOGISTIC) whose scores are
    L1-normalized into probabilities, the label cast, and ZipMap turning rows into {label: prob}."""
    n_features, n_classes = coef.shape[1], coef.shape[0]
    string_labels = isinstance(labels[0], str)
    key = "classlabels_strings" if string_labels else "classlabels_ints"
    zkey = "classlabels_strings" if string_labels else "classlabels_int64s"
    nodes = [
        helper.make_node("Scaler", ["input"], ["variable"], domain=ML, name="Scaler",
                         offset=mean.tolist(), scale=(1.0 / std).tolist()),
        helper.make_node("LinearClassifier", ["variable"], ["label", "probability_tensor"], domain=ML,
                         name="LinearClassifier", coefficients=coef.ravel().tolist(),
                         intercepts=intercept.tolist(), multi_class=0, post_transform="LOGISTIC",
                         **{key: list(labels)}),
        helper.make_node("Normalizer", ["probability_tensor"], ["probabilities"], domain=ML,
                         name="Normalizer", norm="L1"),
        helper.make_node("Identity", ["label"], ["output_label"], name="Identity") if string_labels else
        helper.make_node("Cast", ["label"], ["output_label"], name="Cast", to=I64),
        helper.make_node("ZipMap", ["probabilities"], ["output_probability"], domain=ML, name="ZipMap",
                         **{zkey: list(labels)}),
    ]
    zip_out = helper.make_value_info(
        "output_probability",
        helper.make_sequence_type_proto(helper.make_map_type_proto(STR if string_labels else I64,
                                                                   helper.make_tensor_type_proto(F, []))))
    return build(nodes, [("input", F, [None, n_features])],
                 [("output_label", STR if string_labels else I64, [None]), zip_out],
                 opsets=[("", 21), (ML, 1)])


@pytest.mark.parametrize("labels", [[3, 7, 11, 20], ["setosa", "versicolor", "virginica", "other"]],
                         ids=["int-labels", "string-labels"])
def test_sklearn_logistic_regression_pipeline(labels):
    rng = np.random.default_rng(10)
    n, f, c = 64, 5, len(labels)
    mean = rng.normal(size=f).astype(np.float32)
    std = rng.uniform(0.5, 2.0, size=f).astype(np.float32)
    coef = rng.normal(size=(c, f)).astype(np.float32)
    intercept = rng.normal(size=c).astype(np.float32)
    x = (rng.normal(size=(n, f)) * 2 + mean).astype(np.float32)
    model = sklearn_logreg_pipeline(labels, mean, std, coef, intercept)

    # The spec's formulas: Scaler (x - offset) * scale; LinearClassifier scores x W^T + b, then the
    # logistic; Normalizer L1 divides each row by its sum; the label is the class of the top score.
    z = (x.astype(np.float64) - mean) * (1.0 / std).astype(np.float32)
    scores = z @ coef.T.astype(np.float64) + intercept
    prob = 1.0 / (1.0 + np.exp(-scores))
    prob = prob / prob.sum(axis=1, keepdims=True)
    expected_labels = np.array([labels[k] for k in scores.argmax(axis=1)],
                               dtype=object if isinstance(labels[0], str) else np.int64)

    out_label, out_prob = run_both(model, {"input": x})
    same(out_label, expected_labels)
    assert isinstance(out_prob, list) and len(out_prob) == n
    for row, exp in zip(out_prob, prob):
        assert isinstance(row, dict) and sorted(row) == sorted(labels)
        np.testing.assert_allclose([row[k] for k in labels], exp, rtol=1e-5, atol=1e-5)


# -- 2. tree ensembles ---------------------------------------------------------------------------

def grow_forest(rng, n_trees, max_depth, n_features, leaf_value, missing_rate=0.0, dtype=np.float32):
    """A list of trees; a tree is a list of nodes in pre-order (node id = position):
    ("split", feature, threshold, true_id, false_id, nan_goes_true) or ("leaf", values).
    The root always splits; below depth 2 a node becomes a leaf early with probability 0.15.
    Thresholds are exact in `dtype`."""
    forest = []
    for _ in range(n_trees):
        nodes: list = []

        def grow(depth):
            idx = len(nodes)
            nodes.append(None)
            if depth == max_depth or (depth >= 2 and rng.random() < 0.15):
                nodes[idx] = ("leaf", leaf_value(rng))
            else:
                feature = int(rng.integers(n_features))
                threshold = float(dtype(rng.normal()))
                nan_true = bool(rng.random() < missing_rate)
                t = grow(depth + 1)
                f = grow(depth + 1)
                nodes[idx] = ("split", feature, threshold, t, f, nan_true)
            return idx

        grow(0)
        forest.append(nodes)
    return forest


def walk(tree, row, strict=False):
    """The leaf values a sample reaches: BRANCH_LEQ (x <= threshold goes to the true branch; with
    strict, BRANCH_LT); a NaN feature goes to the true branch only where missing values track true."""
    node = tree[0]
    while node[0] == "split":
        _, feature, threshold, t, f, nan_true = node
        v = row[feature]
        node = tree[t] if (nan_true if math.isnan(v) else (v < threshold if strict else v <= threshold)) else tree[f]
    return node[1]


def forest_inputs(rng, forest, n, n_features, nan_rate=0.0, dtype=np.float32):
    """Samples of `dtype`; a quarter of the values of each row equal a threshold of the forest
    exactly (so that BRANCH_LEQ against BRANCH_LT matters), or for float64 sit one ulp above or
    below one (so that comparing in float32 would misroute them); a fraction nan_rate are NaN."""
    x = rng.normal(size=(n, n_features)).astype(dtype)
    thresholds = [(nd[1], nd[2]) for tree in forest for nd in tree if nd[0] == "split"]
    for i in range(n):
        for _ in range(max(1, n_features // 4)):
            feature, threshold = thresholds[int(rng.integers(len(thresholds)))]
            step = [0.0, np.inf, -np.inf][int(rng.integers(3))] if dtype == np.float64 else 0.0
            x[i, feature] = np.nextafter(threshold, step) if step else threshold
    if nan_rate:
        x[rng.random(size=x.shape) < nan_rate] = np.nan
    return x


def legacy_nodes(forest):
    """The nodes_* attributes of TreeEnsembleRegressor/Classifier (ml opsets 1 and 3), and the list
    of (tree id, node id, leaf values) of the leaves."""
    a = {k: [] for k in ("nodes_treeids", "nodes_nodeids", "nodes_featureids", "nodes_values", "nodes_modes",
                         "nodes_truenodeids", "nodes_falsenodeids", "nodes_missing_value_tracks_true")}
    leaves = []
    for t, tree in enumerate(forest):
        for i, nd in enumerate(tree):
            split = nd[0] == "split"
            a["nodes_treeids"].append(t)
            a["nodes_nodeids"].append(i)
            a["nodes_featureids"].append(nd[1] if split else 0)
            a["nodes_values"].append(nd[2] if split else 0.0)
            a["nodes_modes"].append("BRANCH_LEQ" if split else "LEAF")
            a["nodes_truenodeids"].append(nd[3] if split else 0)
            a["nodes_falsenodeids"].append(nd[4] if split else 0)
            a["nodes_missing_value_tracks_true"].append(int(nd[5]) if split else 0)
            if not split:
                leaves.append((t, i, nd[1]))
    return a, leaves


def ensemble5_attrs(forest, targets_of_tree):
    """TreeEnsemble (ml opset 5) attributes: interior nodes in nodes_*, leaves in leaf_*.
    targets_of_tree[t] lists the (target id, index into the leaf values) tree t feeds: one tree of
    the old encoding whose leaves feed several targets becomes one copy per target (a leaf_* entry
    carries a single target)."""
    nd_feat, nd_split, nd_true, nd_false, nd_tleaf, nd_fleaf, nd_miss, roots = [], [], [], [], [], [], [], []
    leaf_target, leaf_weight = [], []
    for t, tree in enumerate(forest):
        for target, k in targets_of_tree[t]:
            interior = {}
            leaf = {}
            for i, nd in enumerate(tree):
                if nd[0] == "split":
                    interior[i] = len(nd_feat) + len(interior)
                else:
                    leaf[i] = len(leaf_target) + len(leaf)
            roots.append(interior[0])
            for i, nd in enumerate(tree):
                if nd[0] == "split":
                    _, feature, threshold, ti, fi, nan_true = nd
                    nd_feat.append(feature)
                    nd_split.append(threshold)
                    nd_tleaf.append(int(ti in leaf))
                    nd_true.append(leaf[ti] if ti in leaf else interior[ti])
                    nd_fleaf.append(int(fi in leaf))
                    nd_false.append(leaf[fi] if fi in leaf else interior[fi])
                    nd_miss.append(int(nan_true))
            for i, nd in enumerate(tree):
                if nd[0] == "leaf":
                    leaf_target.append(target)
                    leaf_weight.append(nd[1][k])
    return dict(
        nodes_featureids=nd_feat, nodes_splits=np.array(nd_split, np.float32),
        nodes_modes=np.zeros(len(nd_feat), np.uint8), nodes_truenodeids=nd_true, nodes_falsenodeids=nd_false,
        nodes_trueleafs=nd_tleaf, nodes_falseleafs=nd_fleaf, nodes_missing_value_tracks_true=nd_miss,
        tree_roots=roots, leaf_targetids=leaf_target, leaf_weights=np.array(leaf_weight, np.float32))


def tensor_attrs(attrs: dict) -> dict:
    return {k: numpy_helper.from_array(v) if isinstance(v, np.ndarray) else v for k, v in attrs.items()}


N_TREES_RF, DEPTH_RF, N_FEATURES, N_CLASSES = 100, 5, 8, 3
RF_LABELS = [10, 20, 30]


@pytest.fixture(scope="module")
def random_forest():
    """A RandomForestClassifier as sklearn-onnx writes it: each leaf holds the class frequencies of
    its training samples divided by the number of trees, so that summing over trees averages."""
    rng = np.random.default_rng(2024)

    def leaf(rng):
        counts = rng.integers(0, 20, size=N_CLASSES).astype(np.float64) + (rng.random(N_CLASSES) < 0.3) * 30
        counts[int(rng.integers(N_CLASSES))] += 1
        return [float(np.float32(v)) for v in counts / counts.sum() / N_TREES_RF]

    forest = grow_forest(rng, N_TREES_RF, DEPTH_RF, N_FEATURES, leaf)
    x = forest_inputs(rng, forest, 150, N_FEATURES)
    rows = x.astype(np.float64).tolist()
    prob = np.array([np.sum([walk(tree, row) for tree in forest], axis=0) for row in rows])
    # samples sitting exactly on thresholds are exercised: BRANCH_LT would give other results
    prob_lt = np.array([np.sum([walk(tree, row, strict=True) for tree in forest], axis=0) for row in rows])
    assert (np.abs(prob_lt - prob).max(axis=1) > 1e-3).sum() > 20
    return forest, x, prob


def test_random_forest_tree_ensemble_classifier_ml3(random_forest):
    forest, x, prob = random_forest
    a, leaves = legacy_nodes(forest)
    del a["nodes_missing_value_tracks_true"]     # sklearn-onnx leaves it out for random forests
    for t, i, values in leaves:
        for c, w in enumerate(values):
            a.setdefault("class_treeids", []).append(t)
            a.setdefault("class_nodeids", []).append(i)
            a.setdefault("class_ids", []).append(c)
            a.setdefault("class_weights", []).append(w)
    node = helper.make_node("TreeEnsembleClassifier", ["input"], ["label", "probabilities"], domain=ML,
                            name="TreeEnsembleClassifier", classlabels_int64s=RF_LABELS,
                            post_transform="NONE", **a)
    model = build([node], [("input", F, [None, N_FEATURES])],
                  [("label", I64, [None]), ("probabilities", F, [None, N_CLASSES])], opsets=[("", 21), (ML, 3)])
    label, got = run_both(model, {"input": x})
    close(got, prob)
    margin = np.sort(prob, axis=1)
    decided = margin[:, -1] - margin[:, -2] > 1e-5      # labels where float rounding cannot flip the argmax
    assert decided.sum() > 0.9 * len(x)
    same(label[decided], np.array(RF_LABELS, np.int64)[prob.argmax(axis=1)][decided])


def test_random_forest_tree_ensemble_ml5(random_forest):
    """The same forest as TreeEnsemble (ml opset 5): a copy of each tree per class, then the
    ArgMax + label lookup the spec suggests in place of TreeEnsembleClassifier's label output."""
    forest, x, prob = random_forest
    attrs = ensemble5_attrs(forest, [[(c, c) for c in range(N_CLASSES)]] * len(forest))
    nodes = [
        helper.make_node("TreeEnsemble", ["input"], ["probabilities"], domain=ML, name="TreeEnsemble",
                         n_targets=N_CLASSES, aggregate_function=1, post_transform=0, **tensor_attrs(attrs)),
        helper.make_node("ArgMax", ["probabilities"], ["top"], axis=1, keepdims=0),
        helper.make_node("Gather", ["labels", "top"], ["label"], axis=0),
    ]
    model = build(nodes, [("input", F, [None, N_FEATURES])],
                  [("label", I64, [None]), ("probabilities", F, [None, N_CLASSES])],
                  {"labels": np.array(RF_LABELS, np.int64)}, opsets=[("", 21), (ML, 5)])
    assert len(attrs["tree_roots"]) == N_TREES_RF * N_CLASSES
    label, got = run_both(model, {"input": x})
    close(got, prob)
    margin = np.sort(prob, axis=1)
    decided = margin[:, -1] - margin[:, -2] > 1e-5
    same(label[decided], np.array(RF_LABELS, np.int64)[prob.argmax(axis=1)][decided])


def test_random_forest_too_few_features_names_the_node(random_forest):
    forest, x, _ = random_forest
    a, leaves = legacy_nodes(forest)
    a.update(class_treeids=[t for t, _, _ in leaves], class_nodeids=[i for _, i, _ in leaves],
             class_ids=[0] * len(leaves), class_weights=[v[0] for _, _, v in leaves])
    node = helper.make_node("TreeEnsembleClassifier", ["input"], ["label", "probabilities"], domain=ML,
                            name="forest", classlabels_int64s=RF_LABELS, **a)
    model = build([node], [("input", F, [None, None])], [("label", I64, [None]), ("probabilities", F, None)],
                  opsets=[("", 21), (ML, 3)])
    assert max(a["nodes_featureids"]) == N_FEATURES - 1
    message = r"(?s)'forest'.*TreeEnsembleClassifier.*reads feature 7 but X has 6 features"
    with pytest.raises(KernelError, match=message):
        onnx_mini.prepare(model).run({"input": x[:, : N_FEATURES - 2]})


@pytest.fixture(scope="module")
def boosted(request):
    """A GradientBoostingRegressor / HistGradientBoostingRegressor: 60 trees of depth 6, leaves
    already scaled by the learning rate, a base value (the mean of the training targets), and NaN
    inputs routed by nodes_missing_value_tracks_true. For double inputs sklearn-onnx writes the
    thresholds, weights and base values as double tensors (the *_as_tensor attributes, ml opset 3)."""
    dtype = request.param
    rng = np.random.default_rng(77)
    forest = grow_forest(rng, 60, 6, N_FEATURES, lambda r: [float(dtype(0.1 * r.normal()))], missing_rate=0.5,
                         dtype=dtype)
    x = forest_inputs(rng, forest, 120, N_FEATURES, nan_rate=0.1, dtype=dtype)
    base = 3.25
    y = np.array([[base + sum(walk(tree, row)[0] for tree in forest)] for row in x.astype(np.float64).tolist()])
    if dtype == np.float64:    # the float64 case is meaningful: float32 thresholds would change the results
        rounded = [[nd[:2] + (float(np.float32(nd[2])),) + nd[3:] if nd[0] == "split" else nd for nd in tree]
                   for tree in forest]
        y32 = np.array([[base + sum(walk(tree, row)[0] for tree in rounded)] for row in x.tolist()])
        assert (np.abs(y32 - y) > 1e-3).sum() > 10
    return forest, x, base, y


def legacy_regressor(forest, base, ml_opset, dtype):
    a, leaves = legacy_nodes(forest)
    a.update(target_treeids=[t for t, _, _ in leaves], target_nodeids=[i for _, i, _ in leaves],
             target_ids=[0] * len(leaves), target_weights=[v[0] for _, _, v in leaves], base_values=[base])
    if dtype == np.float64:
        for name in ("nodes_values", "target_weights", "base_values"):
            a[f"{name}_as_tensor"] = numpy_helper.from_array(np.array(a.pop(name), np.float64))
    node = helper.make_node("TreeEnsembleRegressor", ["input"], ["variable"], domain=ML, name="TreeEnsembleRegressor",
                            n_targets=1, aggregate_function="SUM", post_transform="NONE", **a)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    return build([node], [("input", elem, [None, N_FEATURES])], [("variable", F, [None, 1])],
                 opsets=[("", 21), (ML, ml_opset)])


# ml opset 1 has no *_as_tensor attributes: double thresholds need ml opset 3
@pytest.mark.parametrize("boosted,ml_opset", [pytest.param(np.float32, 1, id="float-ml1"),
                                              pytest.param(np.float32, 3, id="float-ml3"),
                                              pytest.param(np.float64, 3, id="double-ml3")], indirect=["boosted"])
def test_gradient_boosting_tree_ensemble_regressor(boosted, ml_opset):
    forest, x, base, y = boosted
    (got,) = run_both(legacy_regressor(forest, base, ml_opset, x.dtype.type), {"input": x})
    close(got, y, atol=1e-5)       # the spec's Y is tensor(float) whatever the input type
    assert np.isnan(x).any()


@pytest.mark.parametrize("boosted", [np.float32, np.float64], ids=["float", "double"], indirect=True)
def test_gradient_boosting_tree_ensemble_ml5(boosted):
    """TreeEnsemble has no base_values: the converter adds them with an Add node. Its output has the
    input's type, and double models keep double thresholds and weights."""
    forest, x, base, y = boosted
    attrs = ensemble5_attrs(forest, [[(0, 0)]] * len(forest))
    attrs["nodes_splits"] = attrs["nodes_splits"].astype(x.dtype) if x.dtype == np.float32 else np.array(
        [nd[2] for tree in forest for nd in tree if nd[0] == "split"], np.float64)
    attrs["leaf_weights"] = np.array([nd[1][0] for tree in forest for nd in tree if nd[0] == "leaf"], x.dtype)
    nodes = [helper.make_node("TreeEnsemble", ["input"], ["raw"], domain=ML, n_targets=1, aggregate_function=1,
                              **tensor_attrs(attrs)),
             helper.make_node("Add", ["raw", "base"], ["variable"])]
    elem = helper.np_dtype_to_tensor_dtype(x.dtype)
    model = build(nodes, [("input", elem, [None, N_FEATURES])], [("variable", elem, [None, 1])],
                  {"base": np.array([base], x.dtype)}, opsets=[("", 21), (ML, 5)])
    (got,) = run_both(model, {"input": x})
    close(got, y, dtype=x.dtype, atol=1e-5 if x.dtype == np.float32 else 1e-12)


# -- 3. SVM classifier with probabilities ---------------------------------------------------------

def svm_probabilities(x, sv, vectors_per_class, coef, rho, prob_a, prob_b, gamma):
    """The label and probabilities of a libsvm-style multi-class SVC (one-vs-one), per sample:
    RBF kernel K = exp(-gamma |x - sv|^2); for each pair i < j (in the order (0,1), (0,2), ...,
    (1,2), ...) the decision value d = sum_{s in class i} coef[j-1, s] K_s + sum_{s in class j}
    coef[i, s] K_s + rho[pair] (a vote for i when d > 0, else for j); Platt's sigmoid
    r_ij = 1 / (1 + exp(d * prob_a[pair] + prob_b[pair])) clipped to [1e-7, 1 - 1e-7], r_ji = 1 - r_ij;
    then the pairwise coupling of Wu, Lin and Weng (2004, method 2, as in libsvm and onnxruntime):
    minimise p^T Q p with Q_tt = sum_{j != t} r_jt^2, Q_tj = -r_jt r_tj, sum(p) = 1, by coordinate
    updates until max_t |(Qp)_t - p^T Q p| < 0.005 / k (at most max(100, k) sweeps).
    The label is the class with the most votes (first on ties), as onnxruntime writes it."""
    k = len(vectors_per_class)
    starts = np.concatenate([[0], np.cumsum(vectors_per_class)])
    labels, probs = [], []
    for row in x.astype(np.float64):
        kern = np.exp(-gamma * ((sv.astype(np.float64) - row) ** 2).sum(axis=1))
        r = np.zeros((k, k))
        votes = np.zeros(k, np.int64)
        pair = 0
        for i in range(k):
            for j in range(i + 1, k):
                si, sj = slice(starts[i], starts[i + 1]), slice(starts[j], starts[j + 1])
                d = coef[j - 1, si] @ kern[si] + coef[i, sj] @ kern[sj] + rho[pair]
                votes[i if d > 0 else j] += 1
                q = min(max(1.0 / (1.0 + math.exp(d * prob_a[pair] + prob_b[pair])), 1e-7), 1 - 1e-7)
                r[i, j], r[j, i] = q, 1 - q
                pair += 1
        q_mat = -r.T * r
        np.fill_diagonal(q_mat, (r ** 2).sum(axis=0) - np.diag(r) ** 2)
        p = np.full(k, 1.0 / k)
        for _ in range(max(100, k)):
            qp = q_mat @ p
            pqp = p @ qp
            if np.abs(qp - pqp).max() < 0.005 / k:
                break
            for t in range(k):
                diff = (pqp - qp[t]) / q_mat[t, t]
                p[t] += diff
                pqp = (pqp + diff * (diff * q_mat[t, t] + 2 * qp[t])) / (1 + diff) ** 2
                qp = (qp + diff * q_mat[t]) / (1 + diff)
                p = p / (1 + diff)
        labels.append(int(np.argmax(votes)))
        probs.append(p)
    return np.array(labels), np.array(probs)


def test_svm_classifier_rbf_with_probabilities():
    """sklearn SVC(kernel='rbf', probability=True) on 3 classes as sklearn-onnx writes it."""
    rng = np.random.default_rng(5)
    n_features, vectors_per_class = 4, [4, 5, 3]
    n_sv = sum(vectors_per_class)
    sv = rng.normal(size=(n_sv, n_features)).astype(np.float32)
    coef = rng.normal(size=(2, n_sv)).astype(np.float32)
    rho = rng.normal(size=3).astype(np.float32)
    prob_a = -rng.uniform(1, 3, size=3).astype(np.float32)
    prob_b = (0.3 * rng.normal(size=3)).astype(np.float32)
    gamma = 0.3
    labels = ["cat", "dog", "fish"]
    x = rng.normal(size=(200, n_features)).astype(np.float32)
    node = helper.make_node(
        "SVMClassifier", ["X"], ["label", "probabilities"], domain=ML, name="SVMClassifier",
        classlabels_strings=labels, coefficients=coef.ravel().tolist(), kernel_params=[gamma, 0.0, 3.0],
        kernel_type="RBF", post_transform="NONE", prob_a=prob_a.tolist(), prob_b=prob_b.tolist(),
        rho=rho.tolist(), support_vectors=sv.ravel().tolist(), vectors_per_class=vectors_per_class)
    zip_node = helper.make_node("ZipMap", ["probabilities"], ["output_probability"], domain=ML,
                                classlabels_strings=labels)
    zip_out = helper.make_value_info("output_probability", helper.make_sequence_type_proto(
        helper.make_map_type_proto(STR, helper.make_tensor_type_proto(F, []))))
    model = build([node, zip_node], [("X", F, [None, n_features])],
                  [("label", STR, [None]), ("probabilities", F, [None, 3]), zip_out], opsets=[("", 21), (ML, 1)])
    exp_label, exp_prob = svm_probabilities(x, sv, vectors_per_class, coef, rho, prob_a, prob_b, gamma)
    # the case is meaningful: the vote winner and the most probable class differ on some rows
    assert (exp_prob.argmax(axis=1) != exp_label).sum() > 10
    label, prob, zipped = run_both(model, {"X": x})
    same(label, np.array([labels[k] for k in exp_label], dtype=object))
    close(prob, exp_prob, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(prob.sum(axis=1), 1.0, rtol=1e-5)
    assert [sorted(d) for d in zipped] == [labels] * len(x)
    np.testing.assert_allclose([[d[k] for k in labels] for d in zipped], exp_prob, rtol=1e-4, atol=1e-5)


# -- 4. greedy decoding: Loop with a scan output and an If in the body ------------------------------

V, H, MAX_LEN, END, GATE = 12, 8, 10, 0, 5.0


def decoder_model(with_max_len: bool, opset: int = 21):
    """A toy greedy decoder as a converter writes it (torch.onnx for a while loop over generate()):
    Loop(M, cond, tok, h); the body embeds the current token and the step number, projects it to
    logits, takes the ArgMax as the next token, keeps going while it is not END (the body's cond)
    and updates the state through an If: confident steps (max logit > GATE) take tanh(emb + h), the
    others h / 2 + emb. The next tokens are the Loop's scan output. The If branches capture values
    of the body (s, h, emb) and the body captures the main graph's initializers (E, P, W)."""
    vi = helper.make_tensor_value_info
    then_g = helper.make_graph([helper.make_node("Tanh", ["s"], ["h_then"])], "then", [], [vi("h_then", F, [H])])
    else_g = helper.make_graph([helper.make_node("Mul", ["h_in", "half"], ["h_half"]),
                                helper.make_node("Add", ["h_half", "emb"], ["h_else"])],
                               "else", [], [vi("h_else", F, [H])])
    body_nodes = [
        helper.make_node("Gather", ["E", "tok_in"], ["tok_emb"], axis=0),
        helper.make_node("Gather", ["P", "step"], ["pos_emb"], axis=0, name="position_embedding"),
        helper.make_node("Add", ["tok_emb", "pos_emb"], ["emb"]),
        helper.make_node("Add", ["emb", "h_in"], ["s"]),
        helper.make_node("MatMul", ["s", "W"], ["logits"]),
        helper.make_node("ArgMax", ["logits"], ["next"], axis=0, keepdims=0),
        helper.make_node("Equal", ["next", "end"], ["is_end"]),
        helper.make_node("Not", ["is_end"], ["cond_out"]),
        helper.make_node("ReduceMax", ["logits"], ["top"], keepdims=0),
        helper.make_node("Greater", ["top", "gate"], ["confident"]),
        helper.make_node("If", ["confident"], ["h_out"], then_branch=then_g, else_branch=else_g),
        helper.make_node("Identity", ["next"], ["tok_out"]),
        helper.make_node("Identity", ["next"], ["emitted"]),
    ]
    body = helper.make_graph(
        body_nodes, "body",
        [vi("step", I64, []), vi("cond_in", BOOL, []), vi("tok_in", I64, []), vi("h_in", F, [H])],
        [vi("cond_out", BOOL, []), vi("tok_out", I64, []), vi("h_out", F, [H]), vi("emitted", I64, [])])
    loop = helper.make_node("Loop", ["max_len" if with_max_len else "", "keep_going", "tok0", "h0"],
                            ["tok_last", "h_last", "tokens"], body=body, name="decode")
    rng = np.random.default_rng(3)
    inits = {
        "E": rng.normal(size=(V, H)).astype(np.float32),
        "P": (0.5 * rng.normal(size=(MAX_LEN, H))).astype(np.float32),
        "W": rng.normal(size=(H, V)).astype(np.float32),
        "end": np.array(END, np.int64), "gate": np.array(GATE, np.float32), "half": np.array(0.5, np.float32),
        "keep_going": np.array(True),
    }
    inputs = [("tok0", I64, []), ("h0", F, [H])] + ([("max_len", I64, [])] if with_max_len else [])
    model = build([loop], inputs, [("tok_last", I64, []), ("h_last", F, [H]), ("tokens", I64, [None])],
                  inits, opsets=[("", opset)])
    return model, inits


def greedy_decode(inits, tok, h, max_len):
    """The same recurrence in numpy (float32 like the model), plus which If branches ran."""
    E, P, W = inits["E"], inits["P"], inits["W"]
    tokens, branches = [], []
    for step in range(max_len):
        emb = E[tok] + P[step]
        s = emb + h
        logits = s @ W
        order = np.sort(logits)
        assert order[-1] - order[-2] > 1e-4 and abs(order[-1] - GATE) > 1e-4   # no near-ties: the path is stable
        tok = int(np.argmax(logits))
        branches.append(bool(logits.max() > GATE))
        h = np.tanh(s) if branches[-1] else h * np.float32(0.5) + emb
        tokens.append(tok)
        if tok == END:
            break
    return tok, h.astype(np.float32), np.array(tokens, np.int64), branches


# (start token, seed of h0): the first two reach END before MAX_LEN, the last two run MAX_LEN steps
ENDING, RUNNING = [(10, 1), (1, 1)], [(11, 0), (8, 1)]


@pytest.mark.parametrize("start,h_seed,with_max_len",
                         [pytest.param(s, k, True, id=f"max_len-{s}-{k}") for s, k in ENDING + RUNNING]
                         + [pytest.param(s, k, False, id=f"cond_only-{s}-{k}") for s, k in ENDING])
def test_greedy_decoding_loop(start, h_seed, with_max_len):
    # without M the loop stops only through the body's cond: only sequences that end by themselves
    model, inits = decoder_model(with_max_len)
    h0 = np.random.default_rng(h_seed).normal(size=H).astype(np.float32)
    tok, h, tokens, branches = greedy_decode(inits, start, h0, MAX_LEN)
    assert (tokens[-1] == END and len(tokens) < MAX_LEN) == ((start, h_seed) in ENDING)
    feeds = {"tok0": np.array(start, np.int64), "h0": h0}
    if with_max_len:
        feeds["max_len"] = np.array(MAX_LEN, np.int64)
    got_tok, got_h, got_tokens = run_both(model, feeds)
    same(got_tokens, tokens)
    same(got_tok, np.array(tok, np.int64))
    close(got_h, h, rtol=1e-5, atol=1e-6)


def test_greedy_decoding_past_the_position_table_names_both_nodes():
    """Without M a sequence that never emits END steps past the MAX_LEN rows of P: the error names
    the Loop and the Gather inside its body."""
    model, _ = decoder_model(False)
    start, k = RUNNING[1]
    h0 = np.random.default_rng(k).normal(size=H).astype(np.float32)
    with pytest.raises(KernelError, match=r"(?s)'decode'.*position_embedding.*index 10 is out of bounds"):
        onnx_mini.prepare(model).run({"tok0": np.array(start, np.int64), "h0": h0})


def test_greedy_decoding_paths_take_both_branches():
    """Every case above runs both branches of the If at least once."""
    _, inits = decoder_model(True)
    for start, k in ENDING + RUNNING:
        branches = greedy_decode(inits, start, np.random.default_rng(k).normal(size=H).astype(np.float32), MAX_LEN)[3]
        assert set(branches) == {True, False}, (start, k)


def test_greedy_decoding_loop_short_max_len():
    model, inits = decoder_model(True)
    h0 = np.random.default_rng(0).normal(size=H).astype(np.float32)
    for max_len in (0, 1, 3):
        tok, h, tokens, _ = greedy_decode(inits, 11, h0, max_len)
        got_tok, got_h, got_tokens = run_both(model, {"tok0": np.array(11, np.int64), "h0": h0,
                                                      "max_len": np.array(max_len, np.int64)})
        same(got_tokens, tokens)
        same(got_tok, np.array(11 if max_len == 0 else tok, np.int64))
        close(got_h, h0 if max_len == 0 else h, rtol=1e-5, atol=1e-6)


# -- 5. Scan running an RNN cell ------------------------------------------------------------------

T, B, IN, HID = 7, 3, 5, 4


def scan_rnn_model(opset: int, layout: str):
    """Scan(h0, X) with the body h' = tanh(x_t W^T + h R^T + b), outputs (h_T, Y): what tf2onnx and
    hand-written exporters emit for a simple RNN. layout: 'time_major' X [T, B, I];
    'batch_first' X [B, T, I] with scan_input_axes / scan_output_axes = 1; 'reverse' scans X and
    writes Y backwards (scan_*_directions = 1)."""
    vi = helper.make_tensor_value_info
    body = helper.make_graph(
        [helper.make_node("MatMul", ["x_t", "Wt"], ["xw"]),
         helper.make_node("MatMul", ["h_prev", "Rt"], ["hr"]),
         helper.make_node("Add", ["xw", "hr"], ["pre0"]),
         helper.make_node("Add", ["pre0", "b"], ["pre"]),
         helper.make_node("Tanh", ["pre"], ["h_next"]),
         helper.make_node("Identity", ["h_next"], ["y_t"])],
        "rnn_cell",
        [vi("h_prev", F, [B, HID]), vi("x_t", F, [B, IN])],
        [vi("h_next", F, [B, HID]), vi("y_t", F, [B, HID])])
    attrs = {"num_scan_inputs": 1}
    if layout == "batch_first":
        attrs.update(scan_input_axes=[1], scan_output_axes=[1])
    elif layout == "reverse":
        attrs.update(scan_input_directions=[1], scan_output_directions=[1])
    rng = np.random.default_rng(9)
    inits = {"Wt": (0.5 * rng.normal(size=(IN, HID))).astype(np.float32),
             "Rt": (0.5 * rng.normal(size=(HID, HID))).astype(np.float32),
             "b": (0.1 * rng.normal(size=HID)).astype(np.float32)}
    x_shape = [B, T, IN] if layout == "batch_first" else [T, B, IN]
    y_shape = [B, T, HID] if layout == "batch_first" else [T, B, HID]
    node = helper.make_node("Scan", ["h0", "X"], ["h_last", "Y"], body=body, name="rnn", **attrs)
    model = build([node], [("h0", F, [B, HID]), ("X", F, x_shape)], [("h_last", F, [B, HID]), ("Y", F, y_shape)],
                  inits, opsets=[("", opset)])
    return model, inits


@pytest.mark.parametrize("opset", [9, 11, 21])
@pytest.mark.parametrize("layout", ["time_major", "batch_first", "reverse"])
def test_scan_rnn(opset, layout):
    model, w = scan_rnn_model(opset, layout)
    rng = np.random.default_rng(opset)
    h0 = rng.normal(size=(B, HID)).astype(np.float32)
    xs = rng.normal(size=(T, B, IN)).astype(np.float32)         # time-major view of the sequence
    order = range(T - 1, -1, -1) if layout == "reverse" else range(T)
    h, ys = h0.astype(np.float64), {}
    for t in order:
        h = np.tanh(xs[t] @ w["Wt"].astype(np.float64) + h @ w["Rt"].astype(np.float64) + w["b"])
        ys[t] = h
    # a reverse output direction writes the k-th step's output at position T-1-k: Y[t] pairs with X[t]
    y = np.stack([ys[t] for t in range(T)])
    feeds = {"h0": h0, "X": xs.transpose(1, 0, 2).copy() if layout == "batch_first" else xs}
    got_h, got_y = run_both(model, feeds)
    close(got_h, h, atol=1e-5)
    close(got_y, y.transpose(1, 0, 2) if layout == "batch_first" else y, atol=1e-5)
