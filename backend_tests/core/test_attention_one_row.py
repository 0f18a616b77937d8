"""The fused Attention kernel's small products (ops/fused.py): two matrices by np.dot, batched ones by
np.matmul, bad shapes still reported by MatMul's message; a one-row softmax divided by its 0-d sum."""
from __future__ import annotations

import numpy as np
import pytest

from onnx_mini.errors import InvalidValueError
from onnx_mini.ops import fused


def reference(q, k, v, c):
    """softmax(q k' * c) v in float64, by hand."""
    s = q.astype(np.float64) @ k.astype(np.float64).swapaxes(-1, -2) * c
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)) @ v.astype(np.float64)


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("rows,keys,d", [(1, 50, 256), (1, 1, 16), (3, 7, 8)])
def test_two_matrices_match_the_formula_and_the_batched_form(dt, rows, keys, d):
    """A decoder step ([1, 256] over 50 keys, scale 1/16 as greedy_loop's) and small blocks: near the float64
    formula, and equal to the same heads given as a batch of one (np.matmul's path)."""
    r = np.random.default_rng(rows * keys)
    q, k, v = (r.standard_normal(shape).astype(dt) for shape in ((rows, d), (keys, d), (keys, d)))
    run = fused.fused_attention(scale=0.0625, transpose_k=1)
    y = run(q, k, v)
    assert y.dtype == dt and y.shape == (rows, d)
    tol = 1e-5 if dt == np.float32 else 1e-12
    np.testing.assert_allclose(y, reference(q, k, v, 0.0625), rtol=tol, atol=tol)
    batched = run(q[None], k[None], v[None])
    np.testing.assert_allclose(batched[0], y, rtol=tol, atol=tol)


def test_mismatched_shapes_name_the_op():
    run = fused.fused_attention(scale=0.5)
    q, k, v = np.ones((1, 4), np.float32), np.ones((5, 3), np.float32), np.ones((3, 2), np.float32)
    with pytest.raises(InvalidValueError, match="Attention"):
        run(q, k, v)


def test_one_row_divides_by_its_sum():
    """One query over two keys, scores 0 and ln 3 (scale 1): weights 1/4 and 3/4 of V's rows, exactly in
    float64 to rounding."""
    q = np.array([[1.0, 0.0]])
    k = np.array([[0.0, 5.0], [np.log(3.0), 5.0]]).T          # given as K'
    v = np.array([[4.0, -8.0], [8.0, 4.0]])
    y = fused.fused_attention(scale=1.0)(q, k, v)
    np.testing.assert_allclose(y, [[0.25 * 4 + 0.75 * 8, 0.25 * -8 + 0.75 * 4]], rtol=1e-15)


@pytest.mark.parametrize("divide,scale", [(0, 0.0625), (1, 16.0), (0, 1.0)])
def test_matrices_without_mask_equal_the_masked_path(divide, scale):
    """Matrices without a mask and with a zero mask (adding +0.0 changes no score): the same bits, near the
    float64 formula, for a multiplied and a divided scale."""
    r = np.random.default_rng(7)
    q, k, v = r.standard_normal((2, 32)).astype(np.float32), r.standard_normal((32, 9)).astype(np.float32), \
        r.standard_normal((9, 5)).astype(np.float32)
    run = fused.fused_attention(scale=scale, divide=divide)
    y = run(q, k, v)
    np.testing.assert_array_equal(y, run(q, k, v, np.zeros((2, 9), np.float32)))
    c = 1 / scale if divide else scale
    np.testing.assert_allclose(y, reference(q, k.T, v, c), rtol=1e-5, atol=1e-6)


def test_matrices_whose_scores_overflow_take_the_shifted_softmax():
    """Scores near 1000 overflow exp without the shift: the result is still the softmax (the largest score's
    row of V where it dominates)."""
    q = np.array([[1000.0, 0.0]], np.float32)
    k = np.array([[1.0, 0.0], [0.99, 0.0]], np.float32).T      # scores 1000 and 990
    v = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    y = fused.fused_attention(scale=1.0)(q, k, v)
    w = 1 / (1 + np.exp(-10.0))
    np.testing.assert_allclose(y, [[w * 1 + (1 - w) * 3, w * 2 + (1 - w) * 4]], rtol=1e-5)
