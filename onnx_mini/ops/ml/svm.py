"""Support vector machines (ai.onnx.ml): SVMClassifier-1 and SVMRegressor-1.

Kernels K(x, v) with kernel_params [gamma, coef0, degree]: LINEAR x.v, POLY (gamma x.v + coef0)^degree,
RBF exp(-gamma |x - v|^2), SIGMOID tanh(gamma x.v + coef0); computed in float64, outputs float32.

SVMClassifier with support vectors (libsvm layout): coefficients [C-1, n_sv], one rho per class pair
(i < j, i outer); the pair's decision d = sum over i's vectors of coef[j-1] K + sum over j's vectors of
coef[i] K + rho votes for i when d > 0, else j; the label is the class with most votes (first on ties).
Z holds the pair decisions (C > 2), or [-d, d] for two classes; with prob_a / prob_b, each pair's
Platt probability 1 / (1 + exp(d A + B)) (clipped to [1e-7, 1 - 1e-7]) is coupled into per-class
probabilities (Wu, Lin & Weng's method, as libsvm does) and Z holds those. Without support vectors the
model is linear: Z = X @ coefficients.reshape(C, F).T + rho[0], label of the top score.
"""
from __future__ import annotations

import numpy as np

from ...errors import InvalidValueError
from ...registry import kernel
from ._common import binary_scores, class_labels, features_2d, transform_name
from ._common import post_transform as apply_transform

ML = "ai.onnx.ml"
KERNELS = ("LINEAR", "POLY", "RBF", "SIGMOID")


def _kernel(kernel_type: str, kernel_params):
    """fn(x [N, F], vectors [M, F]) -> [N, M] kernel values (float64)."""
    if kernel_type not in KERNELS:
        raise ValueError(f"kernel_type must be one of {', '.join(KERNELS)}, got {kernel_type!r}")
    if kernel_params and len(kernel_params) != 3:
        raise ValueError(f"kernel_params must hold [gamma, coef0, degree], got {len(kernel_params)} values")
    gamma, coef0, degree = kernel_params if kernel_params else (0.0, 0.0, 0.0)
    if kernel_type == "LINEAR":
        return lambda x, v: x @ v.T
    if kernel_type == "POLY":
        return lambda x, v: (gamma * (x @ v.T) + coef0) ** degree
    if kernel_type == "SIGMOID":
        return lambda x, v: np.tanh(gamma * (x @ v.T) + coef0)

    def rbf(x, v):
        d2 = (x * x).sum(axis=1)[:, None] + (v * v).sum(axis=1)[None, :] - 2 * (x @ v.T)
        return np.exp(-gamma * np.maximum(d2, 0))
    return rbf


def _features(x, f: int) -> np.ndarray:
    xf = features_2d(x, np.dtype(np.float64))
    if xf.shape[1] != f:
        raise InvalidValueError(f"X has {xf.shape[1]} features per sample (shape {list(x.shape)}), the model "
                                f"expects {f}")
    return xf


def couple_pairwise(r: np.ndarray) -> np.ndarray:
    """Per-class probabilities [N, C] from pairwise ones r [N, C, C] (r[:, i, j] = P(i | i or j)):
    the iterative method of Wu, Lin & Weng (2004), 100 iterations at most, stopping per sample when
    every |(Qp)_t - p'Qp| < 0.005 / C."""
    n, c, _ = r.shape
    q = -r.transpose(0, 2, 1) * r                            # q[:, i, j] = -r[:, j, i] r[:, i, j]
    idx = np.arange(c)
    q[:, idx, idx] = (r.transpose(0, 2, 1) ** 2).sum(axis=2) - r[:, idx, idx] ** 2
    p = np.full((n, c), 1.0 / c)
    eps = 0.005 / c
    active = np.ones(n, bool)
    for _ in range(100):
        qp = np.einsum("nij,nj->ni", q, p)
        pqp = (p * qp).sum(axis=1)
        active &= np.abs(qp - pqp[:, None]).max(axis=1) >= eps
        if not active.any():
            break
        for t in range(c):
            diff = np.where(active, (pqp - qp[:, t]) / q[:, t, t], 0.0)
            p[:, t] += diff
            scale = 1 + diff
            pqp = (pqp + diff * (diff * q[:, t, t] + 2 * qp[:, t])) / scale / scale
            qp = (qp + diff[:, None] * q[:, t, :]) / scale[:, None]
            p /= scale[:, None]
    return p


@kernel("SVMClassifier", since=1, domain=ML)
def svm_classifier_1(*, classlabels_ints=None, classlabels_strings=None, coefficients=None, kernel_params=None,
                     kernel_type="LINEAR", post_transform="NONE", prob_a=None, prob_b=None, rho=None,
                     support_vectors=None, vectors_per_class=None):
    labels = class_labels(classlabels_ints, classlabels_strings, "classlabels_ints")
    transform = transform_name(post_transform)
    c = len(labels)
    if not coefficients:
        raise ValueError("coefficients are required")
    if not rho:
        raise ValueError("rho is required")
    prob_a, prob_b = prob_a or [], prob_b or []
    if len(prob_a) != len(prob_b):
        raise ValueError(f"prob_a and prob_b must have the same length, got {len(prob_a)} and {len(prob_b)}")
    coefs = np.asarray(coefficients, np.float64)
    per_class = list(vectors_per_class or [])
    n_sv = sum(per_class)
    if n_sv == 0:   # linear model: one row of coefficients per class, rho[0] added to every score
        if coefs.size % c:
            raise ValueError(f"{coefs.size} coefficients do not split into one row per class ({c} classes)")
        w = coefs.reshape(c, -1)
        bias = float(rho[0])

        def run_linear(x):
            s = _features(x, w.shape[1]) @ w.T + bias
            return labels[np.argmax(s, axis=1)], apply_transform(transform, s).astype(np.float32)
        return run_linear

    if len(per_class) != c or min(per_class) < 0:
        raise ValueError(f"vectors_per_class {per_class} must hold one non-negative count per class ({c})")
    sv = np.asarray(support_vectors or [], np.float64)
    if sv.size == 0 or sv.size % n_sv:
        raise ValueError(f"{sv.size} support_vectors values do not split into {n_sv} vectors")
    sv = sv.reshape(n_sv, -1)
    if coefs.size != (c - 1) * n_sv:
        raise ValueError(f"coefficients has {coefs.size} values, expected (classes - 1) * vectors = {(c - 1) * n_sv}")
    coefs = coefs.reshape(c - 1, n_sv)
    pairs = [(i, j) for i in range(c) for j in range(i + 1, c)]
    if len(rho) != len(pairs):
        raise ValueError(f"rho has {len(rho)} values, expected one per class pair ({len(pairs)})")
    if prob_a and len(prob_a) != len(pairs):
        raise ValueError(f"prob_a has {len(prob_a)} values, expected one per class pair ({len(pairs)})")
    start = np.concatenate([[0], np.cumsum(per_class)]).astype(int)
    # decisions = K(x, sv) @ pair_weights + rho: one column per pair
    pair_weights = np.zeros((n_sv, len(pairs)))
    for p, (i, j) in enumerate(pairs):
        pair_weights[start[i]:start[i + 1], p] = coefs[j - 1, start[i]:start[i + 1]]
        pair_weights[start[j]:start[j + 1], p] = coefs[i, start[j]:start[j + 1]]
    rho_ = np.asarray(rho, np.float64)
    first = np.array([i for i, _ in pairs], np.int64)
    second = np.array([j for _, j in pairs], np.int64)
    a, b = np.asarray(prob_a, np.float64), np.asarray(prob_b, np.float64)
    kern = _kernel(kernel_type, kernel_params)

    def run(x):
        xf = _features(x, sv.shape[1])
        n = xf.shape[0]
        d = kern(xf, sv) @ pair_weights + rho_
        winners = np.where(d > 0, first, second)
        votes = np.bincount((np.arange(n)[:, None] * c + winners).reshape(-1), minlength=n * c).reshape(n, c)
        y = labels[np.argmax(votes, axis=1)] if n else labels[:0]
        if a.size:
            r = np.clip(1 / (1 + np.exp(d * a + b)), 1e-7, 1 - 1e-7)
            pairwise = np.zeros((n, c, c))
            pairwise[:, first, second] = r
            pairwise[:, second, first] = 1 - r
            z = apply_transform(transform, couple_pairwise(pairwise))
        elif c == 2:
            z = binary_scores(d[:, 0], transform, False)
        else:
            z = apply_transform(transform, d)
        return y, z.astype(np.float32)
    return run


@kernel("SVMRegressor", since=1, domain=ML)
def svm_regressor_1(*, coefficients=None, kernel_params=None, kernel_type="LINEAR", n_supports=0, one_class=0,
                    post_transform="NONE", rho=None, support_vectors=None):
    transform = transform_name(post_transform)
    if not coefficients:
        raise ValueError("coefficients are required")
    if not rho:
        raise ValueError("rho is required")
    coefs = np.asarray(coefficients, np.float64)
    bias = float(rho[0])
    if n_supports > 0:
        sv = np.asarray(support_vectors or [], np.float64)
        if sv.size == 0 or sv.size % n_supports:
            raise ValueError(f"{sv.size} support_vectors values do not split into n_supports={n_supports} vectors")
        if coefs.size != n_supports:
            raise ValueError(f"coefficients has {coefs.size} values, expected n_supports={n_supports}")
        sv = sv.reshape(n_supports, -1)
        kern = _kernel(kernel_type, kernel_params)
        score = lambda x: kern(_features(x, sv.shape[1]), sv) @ coefs + bias  # noqa: E731
    elif n_supports == 0:   # linear: one coefficient per feature
        _kernel(kernel_type, kernel_params)
        score = lambda x: _features(x, coefs.size) @ coefs + bias  # noqa: E731
    else:
        raise ValueError(f"n_supports must not be negative, got {n_supports}")

    def run(x):
        s = score(x)[:, None]
        if one_class:   # novelty detection: +1 inside, -1 outside
            return np.where(s > 0, 1.0, -1.0).astype(np.float32)
        return apply_transform(transform, s).astype(np.float32)
    return run
