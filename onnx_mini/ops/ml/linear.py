"""Linear models (ai.onnx.ml): LinearRegressor-1 and LinearClassifier-1.

scores = X @ coefficients.reshape(E, F).T + intercepts, computed in float32 (float64 for a double X),
then post_transform; outputs are float32 (and int64 or string labels for the classifier).
"""
from __future__ import annotations


import numpy as np

from ...errors import InvalidValueError
from ...registry import kernel
from ._common import ROW_SCORES, binary_scores, class_labels, features_2d, label_picker, row_top_softmax
from ._common import transform_name
from ._common import post_transform as apply_transform

ML = "ai.onnx.ml"
# One row of at least this many features is multiplied by W [E, F] row-major (W.T: a dot per class)
# rather than by a contiguous W^T [F, E]: 5136 features x 4 classes 3.4 vs 5.4 us, 1024 x 10 3.1 vs
# 4.4 us; about even at 128-256, slower at 20 (1.9 vs 1.3 us); measured under load. A batch row's
# bits may differ from the row alone in either layout (BLAS picks its kernel by the shapes).
_ROW_FEATURES = 256
_F32 = np.dtype(np.float32)
_COMPUTE = (_F32, np.dtype(np.float64))     # the types features_2d gives


def _linear_scores(coefficients: np.ndarray, intercepts, rows: int | None):
    """(fn(x) -> [N, E] scores for coefficients of E rows (E = len(intercepts) when given, else `rows`,
    else whatever the number of features at run time makes it), E or None)."""
    coef64 = np.asarray(coefficients, np.float64)
    icpt = None if intercepts is None or len(intercepts) == 0 else np.asarray(intercepts, np.float64)
    if icpt is not None:
        rows = len(icpt)
    if rows is not None and (rows == 0 or coef64.size % rows):
        raise ValueError(f"{coef64.size} coefficients do not split into {rows} rows (one per "
                         f"{'intercept' if icpt is not None else 'target'})")
    # per compute type: W^T [F, E] contiguous, the intercepts as one row [1, E], and for one wide row
    # W [E, F] contiguous, made once (E known when rows is). ([1, E] rather than [E]: a batch-1 row
    # adds them with numpy's plain loop, no broadcasting set-up: ~0.35 us less on skl_logreg_b1's [1, 3])
    prepared = {}
    if rows is not None:
        for dt in _COMPUTE:
            w = coef64.reshape(rows, -1).astype(dt)
            prepared[dt] = (np.ascontiguousarray(w.T), None if icpt is None else icpt.astype(dt).reshape(1, -1),
                            w if w.shape[1] >= _ROW_FEATURES else None)
    # one float32 row: its shape and the matrix it is multiplied by (W^T, or W's transposed view for a
    # wide row, as below), to skip the general checks (~0.3 us of ~6 for skl_logreg_b1's
    # LinearClassifier, measured under load)
    f32 = prepared.get(_F32)
    row32 = None if f32 is None else (1, f32[0].shape[0])
    row_w, row_b = (None, None) if f32 is None else (f32[0] if f32[2] is None else f32[2].T, f32[1])

    def scores(x):
        if x.dtype is _F32 and x.shape == row32:
            s = np.dot(x, row_w)
            if row_b is not None:
                s += row_b
            return s
        xf = features_2d(x)
        f = xf.shape[1]
        made = prepared.get(xf.dtype)
        if made is None or made[0].shape[0] != f:
            e = rows if rows is not None else (coef64.size // f if f else 0)
            if e * f != coef64.size:
                raise InvalidValueError(f"X has {f} features per sample (shape {list(x.shape)}) but there are "
                                        f"{coef64.size} coefficients" + (f" for {rows} rows" if rows else ""))
            made = (coef64.reshape(e, f).T.astype(xf.dtype),
                    None if icpt is None else icpt.astype(xf.dtype).reshape(1, -1), None)
        # np.dot: for 2-D arrays the product @ computes, with less dispatch (a [1, 20] row by [20, 3]:
        # 1.3 vs 2.0 us of CPU time, under load)
        s = np.dot(xf, made[2].T if made[2] is not None and xf.shape[0] == 1 else made[0])
        if made[1] is not None:
            s += made[1]
        return s
    return scores, rows


@kernel("LinearRegressor", since=1, domain=ML)
def linear_regressor_1(*, coefficients=None, intercepts=None, post_transform="NONE", targets=1):
    transform = transform_name(post_transform)
    if coefficients is None or len(coefficients) == 0:
        raise ValueError("coefficients are required")
    if targets < 1:
        raise ValueError(f"targets must be positive, got {targets}")
    if intercepts and len(intercepts) != targets:
        raise ValueError(f"intercepts has {len(intercepts)} values, expected targets={targets}")
    scores, _ = _linear_scores(coefficients, intercepts, targets)
    return lambda x: apply_transform(transform, scores(x)).astype(np.float32, copy=False)


@kernel("LinearClassifier", since=1, domain=ML)
def linear_classifier_1(*, classlabels_ints=None, classlabels_strings=None, coefficients, intercepts=None,
                        multi_class=0, post_transform="NONE"):
    # multi_class (0 = one-vs-rest, 1 = multinomial) only says how the model was trained.
    labels = class_labels(classlabels_ints, classlabels_strings, "classlabels_ints")
    transform = transform_name(post_transform)
    if multi_class not in (0, 1):
        raise ValueError(f"multi_class must be 0 or 1, got {multi_class}")
    if coefficients is None or len(coefficients) == 0:
        raise ValueError("coefficients are required")
    scores, rows = _linear_scores(coefficients, intercepts, None)
    if rows not in (None, 1) and rows != len(labels):
        raise ValueError(f"{rows} score rows (intercepts) but {len(labels)} class labels")
    if len(labels) == 2:
        negative, positive = labels[0], labels[1]
    else:   # one score and no pair of labels: the score's sign says 1 or 0
        negative, positive = (("0", "1") if labels.dtype == object else (0, 1))
    pair = np.array([negative, positive], dtype=labels.dtype)
    pick = label_picker(labels)
    by_row = transform == "SOFTMAX" and 2 <= len(labels) <= ROW_SCORES
    one_row = (1, len(labels))
    singles = [labels[k:k + 1] for k in range(len(labels))]    # batch 1's label, copied per run

    def run(x):
        s = scores(x)
        if s.shape == one_row and len(labels) > 1:      # batch 1
            if by_row:                                  # (_common.ROW_SCORES)
                found = row_top_softmax(s.tolist()[0])
                if found is not None:                   # (a NaN or infinite score: numpy's path)
                    return singles[found[0]].copy(), found[1]
            elif s.dtype is _F32 and len(labels) <= ROW_SCORES:
                # argmax on Python floats: the first largest score, as numpy's argmax unless a score
                # is NaN (numpy: the first NaN), which a NaN sum tells (with the one-row product above:
                # skl_tfidf_svc_b1's 4 classes 4.4 -> 4.1 us, fastest calls under load)
                v = s.tolist()[0]
                total = sum(v)
                if total == total:                      # no NaN
                    return singles[v.index(max(v))].copy(), apply_transform(transform, s)
        if s.shape[1] == 1:   # one score: the second class when positive
            y = pair.take((s[:, 0] > 0).view(np.int8))
            if len(labels) == 2:
                return y, binary_scores(s[:, 0], transform, True).astype(np.float32)
            return y, apply_transform(transform, s).astype(np.float32, copy=False)
        if s.shape[1] != len(labels):
            raise InvalidValueError(f"{s.shape[1]} scores per sample but {len(labels)} class labels")
        return pick(s.argmax(axis=1)), apply_transform(transform, s).astype(np.float32, copy=False)
    return run
