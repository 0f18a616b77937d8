"""Batch 1 (one row) takes quicker paths in Normalizer and the SOFTMAX post-transform (whole-array
reductions in place of per-row ones): a row alone must give exactly what it gives inside a batch, and
what the spec's formula gives."""
from __future__ import annotations

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
    for i in range(len(x)):
        one_label, one = run_node("LinearClassifier", 1, [x[i:i + 1]], **args)
        np.testing.assert_array_equal(one[0], probs[i])
        assert one_label.tolist() == [labels[i]]
