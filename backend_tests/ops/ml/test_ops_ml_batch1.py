"""Batch 1 (one row) takes quicker paths in Normalizer (whole-array reductions in place of per-row
ones): a row alone must give exactly what it gives inside a batch, and what the spec's formula gives.
A classifier's one-row SOFTMAX (up to 16 classes) runs on Python floats, in float64 rounded once: its
top class is the batch's, its probabilities the batch's within float32 rounding (the batch takes float32
exps of float32 scores); without SOFTMAX its top class is found on Python floats, the batch's too. Also:
a wide row's LinearClassifier product (W [E, F]) and labels 0..K-1 returned as the argmax itself. (The
tree ensembles' one-row walk: test_ops_ml_forest.py.)"""
from __future__ import annotations

import math

import numpy as np
import pytest

from helpers import run_node

ML = "ai.onnx.ml"
ROWS = np.array([[3.0, -4.0, 1.0], [0.0, 0.0, 0.0], [-2.0, -1.0, -5.0], [np.nan, 1.0, 2.0]], np.float32)


def spec_normalizer(x: np.ndarray, norm: str) -> np.ndarray:
    x = x.astype(np.float64)
    d = {"MAX": x.max(axis=1), "L1": np.abs(x).sum(axis=1), "L2": np.sqrt((x * x).sum(axis=1))}[norm]
    d = np.where(d == 0, 1, d)[:, None]         # a zero divisor leaves the row as it is
    return (x / d).astype(np.float32)


@pytest.mark.parametrize("norm", ["MAX", "L1", "L2"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_normalizer_one_row_is_the_row_of_the_batch(norm, dtype):
    x = np.nan_to_num(ROWS, nan=7.0).astype(dtype) if dtype == np.int64 else ROWS.astype(dtype)
    batch = run_node("Normalizer", 1, [x], domain=ML, norm=norm)
    for i in range(len(x)):
        for row in (x[i:i + 1], x[i]):                    # [1, F] and [F]
            alone = run_node("Normalizer", 1, [row], domain=ML, norm=norm)
            assert alone.dtype == np.float32 and alone.shape == row.shape
            np.testing.assert_array_equal(alone.reshape(-1), batch[i])
    np.testing.assert_allclose(batch, spec_normalizer(x, norm), rtol=1e-6)


def test_linear_classifier_softmax_one_row_is_the_row_of_the_batch():
    coefficients = [0.5, -1.0, 2.0, 1.5, 0.25, -0.75, -2.0, 1.0, 0.5]       # 3 classes x 3 features
    intercepts = [0.1, -0.2, 0.3]
    x = np.nan_to_num(ROWS, nan=0.0) * 10                                   # large scores: the max shift matters
    args = dict(domain=ML, n_outputs=2, classlabels_ints=[4, 5, 6], coefficients=coefficients,
                intercepts=intercepts, post_transform="SOFTMAX")
    labels, probs = run_node("LinearClassifier", 1, [x], **args)
    scores = x.astype(np.float64) @ np.array(coefficients).reshape(3, 3).T + intercepts
    e = np.exp(scores - scores.max(axis=1, keepdims=True))
    np.testing.assert_allclose(probs, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(labels, np.array([4, 5, 6])[scores.argmax(axis=1)])
    spec = (e / e.sum(axis=1, keepdims=True)).astype(np.float32)
    for i in range(len(x)):
        one_label, one = run_node("LinearClassifier", 1, [x[i:i + 1]], **args)
        # the float32 scores' rounding (the intercept 0.1) moves exp(-47.8) by ~1e-6 relative; the
        # batch has the same scores
        np.testing.assert_allclose(one[0], spec[i], rtol=1e-5, atol=0)
        np.testing.assert_allclose(one[0], probs[i], rtol=1e-6, atol=0)
        assert one_label.tolist() == [labels[i]]


@pytest.mark.parametrize("norm", ["MAX", "L1", "L2"])
def test_normalizer_one_wide_row_is_the_row_of_the_batch(norm):
    # long rows (a tf-idf vector of 5136 terms): BLAS sums the L2 products; alone or in a batch, the same bits
    rng = np.random.default_rng(5)
    x = np.where(rng.random((4, 5136)) < 0.01, rng.random((4, 5136)), 0).astype(np.float32)
    x[2] = 0                                                    # a zero row stays zeros
    batch = run_node("Normalizer", 1, [x], domain=ML, norm=norm)
    for i in range(len(x)):
        np.testing.assert_array_equal(run_node("Normalizer", 1, [x[i:i + 1]], domain=ML, norm=norm)[0], batch[i])
    np.testing.assert_allclose(batch, spec_normalizer(x, norm), rtol=1e-6)


@pytest.mark.parametrize("labels", [[0, 1, 2], [0, 2, 1], [1, 2, 3]])
def test_classifier_labels_0_to_k_are_the_argmax_itself(labels):
    # labels 0..K-1 in order are returned as the argmax indices (no lookup): the same int64 labels
    coefficients = [1.0, 0.0, 0.0, 1.0, -1.0, -1.0]                       # 3 classes x 2 features
    x = np.array([[3.0, 0.0], [0.0, 3.0], [-2.0, -2.0], [1.0, 1.0]], np.float32)   # winners 0, 1, 2, 0 (tie)
    winners = [0, 1, 2, 0]
    got, _ = run_node("LinearClassifier", 1, [x], domain=ML, n_outputs=2, classlabels_ints=labels,
                      coefficients=coefficients)
    assert got.dtype == np.int64 and got.tolist() == [labels[i] for i in winners]
    # three one-leaf trees, one per class: every row scores [0.5, 0.25, 1.0], the third class wins
    attrs = dict(nodes_treeids=[0, 1, 2], nodes_nodeids=[0, 0, 0], nodes_featureids=[0, 0, 0],
                 nodes_modes=["LEAF"] * 3, nodes_values=[0.0] * 3, nodes_truenodeids=[0] * 3,
                 nodes_falsenodeids=[0] * 3, class_treeids=[0, 1, 2], class_nodeids=[0, 0, 0],
                 class_ids=[0, 1, 2], class_weights=[0.5, 0.25, 1.0], classlabels_int64s=labels)
    got, scores = run_node("TreeEnsembleClassifier", 1, [x], domain=ML, n_outputs=2, **attrs)
    assert got.dtype == np.int64 and got.tolist() == [labels[2]] * 4
    np.testing.assert_array_equal(scores, np.tile(np.float32([0.5, 0.25, 1.0]), (4, 1)))


@pytest.mark.parametrize("features", [20, 300])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_linear_classifier_one_wide_row(features, dtype):
    # one row of 300 features takes the W [E, F] product (a dot per class), 20 the W^T [F, E] one:
    # both are X @ W^T + b
    rng = np.random.default_rng(features)
    coefficients = (rng.integers(-8, 9, size=4 * features) / 8).tolist()
    intercepts = [0.5, -0.25, 0.0, 1.0]
    x = (rng.integers(-4, 5, size=(3, features)) / 4).astype(dtype)
    expected = x.astype(np.float64) @ np.array(coefficients).reshape(4, features).T + intercepts
    for i in range(len(x)):
        labels, scores = run_node("LinearClassifier", 1, [x[i:i + 1]], domain=ML, n_outputs=2,
                                  classlabels_ints=[7, 8, 9, 10], coefficients=coefficients, intercepts=intercepts)
        np.testing.assert_array_equal(scores[0], expected[i].astype(np.float32))   # multiples of 1/32: exact
        assert labels.tolist() == [[7, 8, 9, 10][int(np.argmax(expected[i]))]]


@pytest.mark.parametrize("classes", [3, 20])
def test_softmax_one_row_with_nan_and_infinities_is_the_row_of_the_batch(classes):
    # up to 16 scores one row runs on Python floats, unless a score is NaN or the largest infinite:
    # then numpy's path gives the batch's bits (NaN rows all NaN); finite rows within float32 rounding
    rng = np.random.default_rng(classes)
    coefficients = (rng.integers(-4, 5, size=classes * 2) / 4).tolist()
    x = np.array([[1.0, 2.0], [np.nan, 1.0], [np.inf, 0.0], [-np.inf, 1.0], [1e30, -1e30]], np.float32)
    args = dict(domain=ML, n_outputs=2, classlabels_ints=list(range(classes)), coefficients=coefficients,
                post_transform="SOFTMAX")
    with np.errstate(all="ignore"):
        labels, probs = run_node("LinearClassifier", 1, [x], **args)
        assert np.isnan(probs[1]).all()
        for i in range(len(x)):
            one_label, one = run_node("LinearClassifier", 1, [x[i:i + 1]], **args)
            if np.isfinite(one[0]).all() and classes <= 16:
                np.testing.assert_allclose(one[0], probs[i], rtol=1e-6, atol=0)
            else:
                np.testing.assert_array_equal(one[0], probs[i])
            assert one_label.tolist() == [labels[i]]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_linear_classifier_one_row_adds_the_intercepts_in_the_compute_type(dtype):
    # one row's intercepts are added on Python floats: a float32 X's scores must be the float32 sums
    # (1000 + float32(0.1) is 1000.1000366 in float32, 1000.1000000015 in float64), a double X's the
    # float64 ones; its SOFTMAX is then those scores' in float64, rounded once to float32
    coefficients = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0]                          # 3 classes x 2 features
    intercepts = [0.1, -0.3, 0.7]
    x = np.array([[1000.0, 1.0], [3.0, -2.0], [-1e30, 5.0], [np.nan, 1.0], [np.inf, 0.0]], dtype)
    args = dict(domain=ML, n_outputs=2, classlabels_ints=[0, 1, 2], coefficients=coefficients,
                intercepts=intercepts, post_transform="SOFTMAX")
    with np.errstate(all="ignore"):
        products = np.stack([x[:, 0], x[:, 1], x[:, 0] + x[:, 1]], axis=1)      # exact for these rows
        # (float attributes are float32: a double X adds float32(0.1) in float64)
        scores = products + np.array(intercepts, np.float32).astype(dtype)       # rounded in X's type
        batch_labels, batch = run_node("LinearClassifier", 1, [x], **args)
        for i in range(len(x)):
            label, probs = run_node("LinearClassifier", 1, [x[i:i + 1]], **args)
            v = scores[i].tolist()
            if all(np.isfinite(v)):
                e = [math.exp(a - max(v)) for a in v]
                np.testing.assert_array_equal(probs[0], np.float32([a / sum(e) for a in e]))
                assert label.tolist() == [int(np.argmax(v))]
            else:               # a NaN or infinite score: numpy's path, the batch's bits
                np.testing.assert_array_equal(probs[0], batch[i])
                assert label.tolist() == [batch_labels[i]]


@pytest.mark.parametrize("features", [1, 2, 3, 5, 7, 8, 9])
def test_normalizer_l1_one_float32_row_is_numpys_float32_quotient(features):
    # A float32 row of at most 7 values sums its L1 norm on Python floats, rounded to float32 after
    # each add: the same bits as numpy's float32 sum of the row and quotient (the batch's row and the
    # spec's formula in float32), over values spread across float32's range, subnormals included.
    import onnx_mini
    from helpers import one_node_model

    rng = np.random.default_rng(features)
    rows = (rng.standard_normal((400, features)) * np.exp2(rng.integers(-140, 120, (400, features)))).astype(np.float32)
    rows[0] = 0.0                               # a zero divisor leaves the row as it is
    rows[1] = -0.0
    rows[2, 0] = np.nan
    rows[3, -1] = np.inf
    rows[4, 0] = np.float32(3e38)               # the float32 sum overflows to inf (not so in float64)
    rows[4, -1] = np.float32(-3e38)
    model, _ = one_node_model("Normalizer", [rows[:1]], domain=ML, norm="L1")
    session = onnx_mini.prepare(model)
    with np.errstate(invalid="ignore", over="ignore"):
        batch = session.run([rows])[0]
        for i, row in enumerate(rows):
            total = np.abs(row).sum(dtype=np.float32)
            expected = row / total if total != 0 else row
            for shape in ((1, features), (features,)):
                alone = session.run([row.reshape(shape)])[0]
                assert alone.dtype == np.float32 and alone.shape == shape
                assert alone.reshape(-1).tobytes() == expected.tobytes(), (i, row, alone, expected)
                assert alone.reshape(-1).tobytes() == batch[i].tobytes()
        strided = rows[5:6, ::-1]                   # a non-contiguous row: the same values
        assert session.run([strided])[0].tobytes() == session.run([strided.copy()])[0].tobytes()


@pytest.mark.parametrize("transform", ["NONE", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT"])
@pytest.mark.parametrize("labels", [dict(classlabels_ints=[0, 1, 2, 3]),
                                    dict(classlabels_strings=["a", "b", "c", "d"])])
def test_linear_classifier_one_row_top_class_without_softmax(transform, labels):
    # one float32 row's top class is found on Python floats (SOFTMAX aside): the first largest score, as
    # numpy's argmax, ties and -0.0 == 0.0 included; a NaN score makes numpy decide (its first NaN).
    # Scores and labels: the batch's row, bit for bit.
    coefficients = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, -1.0, 0.0]                # 4 classes x 2 features
    x = np.array([[1.0, 2.0], [2.0, 2.0], [2.0, 1.0], [0.0, -0.0], [-0.0, 0.0], [np.nan, 1.0],
                  [1.0, np.nan], [np.inf, 1.0], [-np.inf, 1.0], [np.inf, -np.inf], [-3.0, -1.0]], np.float32)
    with np.errstate(all="ignore"):     # (0 * inf, inf - inf: NaN scores)
        scores = x @ np.float32(coefficients).reshape(4, 2).T
    # the first largest score (the first NaN when there is one): rows 0-4 and 10 by hand
    expected = [int(np.argmax(row)) for row in scores]
    assert expected[:5] + expected[-1:] == [2, 2, 2, 0, 0, 3]
    names = labels.get("classlabels_ints") or labels["classlabels_strings"]
    args = dict(domain=ML, n_outputs=2, coefficients=coefficients, post_transform=transform, **labels)
    with np.errstate(all="ignore"):
        batch_labels, batch = run_node("LinearClassifier", 1, [x], **args)
        assert batch_labels.tolist() == [names[k] for k in expected]
        for i in range(len(x)):
            label, scores = run_node("LinearClassifier", 1, [x[i:i + 1]], **args)
            assert label.tolist() == [names[expected[i]]] and label.dtype == batch_labels.dtype
            assert scores.dtype == np.float32 and scores.tobytes() == batch[i:i + 1].tobytes()
