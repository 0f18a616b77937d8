"""ops/contrib/quantized_matmul.py: a centred MatMulIntegerScaled (single or grouped) with a constant B takes
one float32 product where B's column sums prove every partial sum within 2^24 (max |A - a_zp| * max_n
sum_k |B[k, n] - b_zp|), K split only beyond; the bits of the integer definition either way."""
from __future__ import annotations

import numpy as np
import pytest

from onnx_mini.ops.contrib import quantized_matmul as qm
from onnx_mini.ops.math import matmul as mm

F32 = np.float32


def codes(m, k, zp, seed=0, extreme=False):
    """DynamicQuantizeCentred's A: codes - zp in [-zp, 255 - zp], as float32; extreme: only both ends."""
    r = np.random.default_rng(seed)
    q = (r.choice([0, 255], (1, m, k)) if extreme else r.integers(0, 256, (1, m, k))).astype(np.int64)
    return (q - zp).astype(F32), np.array(zp, np.uint8)


def weights(k, n, top, seed=1):
    """int8 B of values up to `top` in magnitude, normal-looking (as quantize_dynamic's weights), and its
    zero point 0."""
    r = np.random.default_rng(seed)
    b = np.clip(np.round(r.standard_normal((k, n)) * top / 4), -top, top).astype(np.int8)
    b[0, :] = top                                  # every column reaches the top
    return b, np.zeros((), np.int8)


def reference(a, a_zp, b, b_zp, scale, bias):
    """The chain in integers, then Cast, Mul and Add as their kernels compute them (float32 steps)."""
    acc = a.astype(np.int64) @ (b.astype(np.int64) - b_zp.astype(np.int64))
    y = acc.astype(np.int32).astype(F32) * scale
    return y if bias is None else y + bias


def count_products(monkeypatch):
    calls = []
    real = mm.matmul

    def spy(a, b, what="matrix product"):
        calls.append(a.shape[-1])
        return real(a, b, what)
    monkeypatch.setattr(mm, "matmul", spy)      # (outside a run: no row blocks, the whole product)
    return calls


@pytest.mark.parametrize("k,top,zp,parts", [
    (1536, 127, 128, 1),    # K * 128 * 127 = 25M > 2^24, but the column sums * 128 stay under
    (3072, 127, 128, 1),    # BERT-base's second feed-forward product
    (3072, 127, 3, 2),      # after a Gelu (zero point near 0: |A| up to 252): beyond, K split
    (1024, 64, 10, 1),      # this bench model's 1024 x 256 (already one product by K * ra * rb)
], ids=str)
def test_one_product_where_the_column_sums_allow(k, top, zp, parts, monkeypatch):
    a, a_zp = codes(16, k, zp)
    b, b_zp = weights(k, 24, top)
    scale = np.array(3e-5, F32)
    bias = np.linspace(-1, 1, 24).astype(F32)
    sums = int(np.abs(b.astype(np.int64)).sum(axis=0).max())
    assert (max(zp, 255 - zp) * sums <= 1 << 24) == (parts == 1)
    f = qm.matmul_integer_scaled_1(centred=1, _constants={1: b, 3: b_zp})
    calls = count_products(monkeypatch)
    y = f(a, b, a_zp, b_zp, scale, None, bias)
    assert len(calls) == (1 if parts == 1 else -(-k // (mm.F32_EXACT // (max(zp, 255 - zp) * top))))
    np.testing.assert_array_equal(y, reference(a, a_zp, b, b_zp, scale, bias))


def test_extremes_past_the_column_bound_still_split_exactly(monkeypatch):
    """Codes only at -zp / 255 - zp and B at +-127 with per-column zero points: the column sums exceed 2^24,
    so K splits (the float64 sum of exact parts); bits of the integers."""
    k, n = 2048, 8
    a, a_zp = codes(4, k, 0, extreme=True)
    r = np.random.default_rng(3)
    b = r.choice(np.array([-128, 127], np.int8), (k, n))
    b_zp = np.array([0, 127, -128, 5, 0, 1, -1, 64], np.int8)
    scale = np.array(1e-6, F32)
    f = qm.matmul_integer_scaled_1(centred=1, _constants={1: b, 3: b_zp})
    calls = count_products(monkeypatch)
    y = f(a, b, a_zp, b_zp, scale)
    assert len(calls) > 1
    np.testing.assert_array_equal(y, reference(a, a_zp, b, b_zp, scale, None))


def test_fed_weights_keep_the_type_bound(monkeypatch):
    """B fed at run time: no column sums (no pass over B per call), K split by the type's bound; same bits."""
    a, a_zp = codes(8, 1536, 128)
    b, b_zp = weights(1536, 16, 127)
    scale = np.array(2e-5, F32)
    f = qm.matmul_integer_scaled_1(centred=1)
    calls = count_products(monkeypatch)
    y = f(a, b, a_zp, b_zp, scale)
    assert len(calls) == 2
    np.testing.assert_array_equal(y, reference(a, a_zp, b, b_zp, scale, None))


@pytest.mark.parametrize("centred", [1, 0])
@pytest.mark.parametrize("k,zp,parts", [(1536, 128, 1), (768, 0, 1), (3072, 0, 6)])
def test_group_one_product_where_the_column_sums_allow(k, zp, parts, centred, monkeypatch):
    """Q, K, V as one joint product (BERT-base's K = 768 with int8 weights up to 127: K * 255 * 127 > 2^24,
    two products before) when the column sums allow, else K split as before (3072 / 518-term chunks);
    each output the bits of its own chain; centred=0: A as uint8 codes with their zero point."""
    n = 16
    a, a_zp = codes(8, k, zp, seed=4)
    bs = [weights(k, n, 127, seed=s)[0] for s in (5, 6, 7)]
    b_zp = np.zeros((), np.int8)
    scales = [np.array(s, F32) for s in (1e-5, 2e-5, 3e-5)]
    biases = [np.full(n, v, F32) for v in (0.5, -0.25, 0.125)]
    constants = {}
    for i, (b, bias) in enumerate(zip(bs, biases)):
        constants.update({2 + 5 * i: b, 3 + 5 * i: b_zp, 6 + 5 * i: bias})
    g = qm.matmul_integer_scaled_group_1(centred=centred, _n_outputs=3, _constants=constants)
    given = a if centred else (a + zp).astype(np.uint8)         # the codes themselves
    calls = count_products(monkeypatch)
    rest = []
    for b, s, bias in zip(bs, scales, biases):
        rest += [b, b_zp, s, None, bias]
    outs = g(given, a_zp, *rest)
    sums = max(int(np.abs(b.astype(np.int64)).sum(axis=0).max()) for b in bs)
    assert (max(zp, 255 - zp) * sums <= 1 << 24) == (parts == 1)
    assert len(calls) == parts
    for y, b, s, bias in zip(outs, bs, scales, biases):
        np.testing.assert_array_equal(y, reference(a, a_zp, b, b_zp, s, bias))


def test_column_sums():
    assert qm._column_sums(np.array([[1, -2], [-3, 4], [5, 0]], F32)) == 9
    assert qm._column_sums(np.array([-3, 4], F32)) == 7
    assert qm._column_sums(np.zeros((0, 3), F32)) == 0
    assert qm._column_sums(np.array([[[1, 1]], [[-7, 2]]], F32)) == 7       # a stack of Bs [2, 1, 2]
