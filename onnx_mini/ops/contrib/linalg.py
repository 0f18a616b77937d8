"""com.microsoft CDist and Solve (version 1 each): pairwise distances and linear systems, as skl2onnx
writes them for nearest neighbours, kernel PCA and Gaussian processes.

CDist(A [N, K], B [M, K]) -> [N, M], float or double. onnxruntime implements the metrics
"sqeuclidean" and "euclidean" (default "sqeuclidean"); onnx_mini also runs "minkowski" with the
attribute `p` (default 2; skl2onnx writes it for KNeighbors* with p != 2, which onnxruntime rejects),
"cityblock" (alias "manhattan") and "chebyshev", the scipy.spatial.distance.cdist metrics of those names.
(Squared) euclidean distances are computed in float64 as |a|^2 + |b|^2 - 2 a.b, clipped at 0 (rounding
can make the expansion slightly negative), then rounded once to the input type: for float inputs
that is more accurate than onnxruntime, which expands in float32; a near-zero distance between
points far from the origin keeps float64's cancellation error (~1e-16 |a|^2), as scikit-learn's.
B's half of the expansion is made once when B is a constant (the training set). The other metrics
take |a - b| row block by row block, in float64.

Solve(A [n, n], Y [n] or [n, k]) -> X of Y's shape: onnxruntime has no Solve; skl2onnx's
GaussianProcessClassifier writes it (domain com.microsoft) with the meaning of
scipy.linalg.solve(A, Y, lower=lower, transposed=transposed), the function mlprodict's runtime calls:
X solves A X = Y (A^T X = Y with transposed=1) for a general square A. `lower` only matters there
for symmetric / positive-definite solvers and is ignored for a general A, so here too (a
triangular A, the Cholesky factor skl2onnx writes, is solved exactly as such by the general solver).
A singular A is an error.
"""
from __future__ import annotations

import math

import numpy as np

from ... import blas
from ...errors import InvalidValueError
from ...registry import kernel
from .._common import prepack, same_type

MS = "com.microsoft"
FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
BLOCK = 1 << 20                     # elements of one |a - b| block (8 MB in float64)
_P = {"cityblock": 1.0, "manhattan": 1.0, "chebyshev": math.inf}


def _matrices(a: np.ndarray, b: np.ndarray) -> None:
    if a.dtype not in FLOATS or b.dtype not in FLOATS:
        raise InvalidValueError(f"A and B must be float or double tensors, got {a.dtype} and {b.dtype}")
    same_type(a, b)
    if a.ndim != 2 or b.ndim != 2:
        raise InvalidValueError(f"A and B must be 2-D, got shapes {list(a.shape)} and {list(b.shape)}")
    if a.shape[1] != b.shape[1]:
        raise InvalidValueError(f"A {list(a.shape)} and B {list(b.shape)} must have the same number of columns")


def _right_half(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """B's part of the expansion: B^T and |b|^2 per row, in float64."""
    b64 = b.astype(np.float64)
    return np.ascontiguousarray(b64.T), np.einsum("ij,ij->i", b64, b64)


def _squared(a: np.ndarray, bt: np.ndarray, bb: np.ndarray) -> np.ndarray:
    a64 = a.astype(np.float64)
    d = blas.matmul(a64, bt)
    d *= -2.0
    d += np.einsum("ij,ij->i", a64, a64)[:, None]
    d += bb
    return np.maximum(d, 0.0, out=d)


def _lp(a: np.ndarray, b: np.ndarray, p: float) -> np.ndarray:
    """(sum |a - b|^p)^(1/p) for every pair of rows (the max for p = inf), in float64, block by block."""
    n, m, k = a.shape[0], b.shape[0], a.shape[1]
    out = np.empty((n, m), np.float64)
    b64 = b.astype(np.float64)
    step = max(1, BLOCK // max(1, m * k))
    for i in range(0, n, step):
        diff = np.abs(a[i:i + step, None, :].astype(np.float64) - b64[None])
        if p == math.inf:
            out[i:i + step] = diff.max(axis=2, initial=0.0)
        elif p == 1:
            out[i:i + step] = diff.sum(axis=2)
        else:
            out[i:i + step] = (diff ** p).sum(axis=2) ** (1.0 / p)
    return out


@kernel("CDist", since=1, domain=MS, heavy=True)
def cdist_1(*, metric="sqeuclidean", p=None, _constants=None):
    if not isinstance(metric, str):
        raise ValueError(f"metric must be a string, got {metric!r}")
    if p is not None and metric != "minkowski":
        raise ValueError(f"attribute p applies to metric 'minkowski' only, not {metric!r}")
    if metric in ("sqeuclidean", "euclidean"):
        half = prepack(_right_half, _constants, (1,))
        root = metric == "euclidean"

        def run(a, b):
            _matrices(a, b)
            d = _squared(a, *half(b))
            return (np.sqrt(d, out=d) if root else d).astype(a.dtype, copy=False)
        return run
    if metric == "minkowski":
        order = 2.0 if p is None else p
        if not isinstance(order, (int, float)) or not order > 0:
            raise ValueError(f"p must be a positive number, got {p!r}")
    elif metric in _P:
        order = _P[metric]
    else:
        raise ValueError(f"metric {metric!r} is not supported (supported: sqeuclidean, euclidean, minkowski, "
                         f"cityblock, manhattan, chebyshev)")

    def run_lp(a, b):
        _matrices(a, b)
        return _lp(a, b, float(order)).astype(a.dtype, copy=False)
    return run_lp


@kernel("Solve", since=1, domain=MS, heavy=True)
def solve_1(*, lower=0, transposed=0):
    # lower: accepted and, as scipy.linalg.solve does for a general matrix, not used
    def run(a, y):
        if a.dtype not in FLOATS:
            raise InvalidValueError(f"A and Y must be float or double tensors, got {a.dtype}")
        same_type(a, y)
        if a.ndim != 2 or a.shape[0] != a.shape[1]:
            raise InvalidValueError(f"A must be a square matrix, got shape {list(a.shape)}")
        if y.ndim not in (1, 2) or y.shape[0] != a.shape[0]:
            raise InvalidValueError(f"Y must have shape [{a.shape[0]}] or [{a.shape[0]}, k] to match A "
                                    f"{list(a.shape)}, got {list(y.shape)}")
        if y.size == 0:
            return np.zeros(y.shape, y.dtype)
        try:
            return np.linalg.solve(a.T if transposed else a, y).astype(y.dtype, copy=False)
        except np.linalg.LinAlgError:
            raise InvalidValueError("A is singular: the system has no unique solution") from None
    return run
