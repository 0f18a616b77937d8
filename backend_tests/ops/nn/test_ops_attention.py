"""Spec tests for Attention (23, 24, 25), RotaryEmbedding (23), LinearAttention (27) and
CausalConvWithState (27).

Expected values come from slow references written from the spec's equations in this file (plain
loops over batch, head, query row and key in float64), or by hand; the type matrices come from the
schemas' type constraints.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import TensorProto

from onnx_mini.errors import InvalidNodeError, KernelError

from helpers import NODE, np_type, run_node, type_params, versions

RTOL = {"float16": 5e-3, "bfloat16": 3e-2, "float": 2e-5, "double": 1e-12}
ATOL = {"float16": 2e-3, "bfloat16": 2e-2, "float": 1e-6, "double": 1e-12}


def close(got, exp, tname="float"):
    exp = np.asarray(exp)
    assert type(got) is np.ndarray, type(got)
    assert got.shape == exp.shape, (got.shape, exp.shape)
    np.testing.assert_allclose(got.astype(np.float64), exp.astype(np.float64), rtol=RTOL[tname], atol=ATOL[tname])


def rnd(shape, seed, lo=-1.0, hi=1.0):
    return np.random.default_rng(seed).uniform(lo, hi, size=shape)


# -- Attention reference (spec equations, loops) --------------------------------------------------

def to4d(x, heads):
    """(batch, seq, heads * size) -> (batch, heads, seq, size), element by element."""
    if x.ndim == 4:
        return x.astype(np.float64)
    b, s, hidden = x.shape
    d = hidden // heads
    out = np.empty((b, heads, s, d))
    for bi in range(b):
        for h in range(heads):
            for si in range(s):
                out[bi, h, si] = x[bi, si, h * d:(h + 1) * d]
    return out


def attention_ref(Q, K, V, mask=None, past_k=None, past_v=None, nonpad=None, *, version=23,
                  q_num_heads=None, kv_num_heads=None, is_causal=0, scale=None, softcap=0.0,
                  left_window_size=-1, right_window_size=-1, qk_matmul_output_mode=0):
    """-> (Y, present_key, present_value, qk_matmul_output) in float64, from the spec's text."""
    q, k, v = to4d(Q, q_num_heads), to4d(K, kv_num_heads), to4d(V, kv_num_heads)
    past = 0
    if past_k is not None:
        past = past_k.shape[2]
        k = np.concatenate([past_k.astype(np.float64), k], axis=2)
        v = np.concatenate([past_v.astype(np.float64), v], axis=2)
    b, hq, sq, d = q.shape
    hkv, total, dv = k.shape[1], k.shape[2], v.shape[3]
    group = hq // hkv
    s = 1 / math.sqrt(d) if scale is None else scale
    m4 = None
    if mask is not None:
        m = np.where(mask, 0.0, -np.inf) if mask.dtype == bool else mask.astype(np.float64)
        if version >= 24 and m.shape[-1] < total:
            m = np.concatenate([m, np.full(m.shape[:-1] + (total - m.shape[-1],), -np.inf)], axis=-1)
        m4 = np.broadcast_to(m.reshape((1,) * (4 - m.ndim) + m.shape), (b, hq, sq, total))
    y = np.zeros((b, hq, sq, dv))
    qk = np.zeros((b, hq, sq, total))
    for bi in range(b):
        if past_k is not None:
            offset = past
        elif nonpad is not None and version >= 24:
            offset = int(nonpad[bi]) - sq
        else:
            offset = 0
        for h in range(hq):
            kh = h // group          # each kv head serves `group` consecutive query heads
            for i in range(sq):
                raw = np.array([sum(q[bi, h, i, c] * k[bi, kh, j, c] for c in range(d)) * s for j in range(total)])
                capped = softcap * np.tanh(raw / softcap) if softcap else raw
                bias = np.zeros(total)
                p = offset + i
                for j in range(total):
                    if m4 is not None:
                        bias[j] += m4[bi, h, i, j]
                    if is_causal and j > p:
                        bias[j] = -np.inf
                    if left_window_size >= 0 and j < p - left_window_size:
                        bias[j] = -np.inf
                    if right_window_size >= 0 and j > p + right_window_size:
                        bias[j] = -np.inf
                    if nonpad is not None and j >= nonpad[bi]:
                        bias[j] = -np.inf
                scores = capped + bias
                if np.all(bias == -np.inf):
                    prob = np.zeros(total)
                else:
                    e = np.exp(scores - scores.max())
                    prob = e / e.sum()
                y[bi, h, i] = sum(prob[j] * v[bi, kh, j] for j in range(total))
                qk[bi, h, i] = [raw, capped, scores, prob][qk_matmul_output_mode]
    if Q.ndim == 3:
        y = y.transpose(0, 2, 1, 3).reshape(b, sq, hq * dv)
    return y, k, v, qk


ATTN_VERSIONS = versions("Attention")


def test_attention_versions():
    assert ATTN_VERSIONS == [23, 24, 25]


def f32(shape, seed):
    return rnd(shape, seed).astype(np.float32)


# (name, minimum version, inputs builder, attributes)
def _cases():
    B, H, S, L, D = 2, 3, 4, 6, 8
    c = {}
    c["4d"] = (23, lambda: [f32((B, H, S, D), 1), f32((B, H, L, D), 2), f32((B, H, L, 5), 3)], {})
    c["3d"] = (23, lambda: [f32((B, S, 24), 1), f32((B, L, 24), 2), f32((B, L, 15), 3)],
               dict(q_num_heads=3, kv_num_heads=3))
    c["3d_gqa"] = (23, lambda: [f32((B, S, 32), 1), f32((B, L, 16), 2), f32((B, L, 12), 3)],
                   dict(q_num_heads=4, kv_num_heads=2))
    c["3d_mqa_causal"] = (23, lambda: [f32((B, S, 32), 4), f32((B, L, 8), 5), f32((B, L, 6), 6)],
                          dict(q_num_heads=4, kv_num_heads=1, is_causal=1))
    c["4d_gqa"] = (23, lambda: [f32((B, 6, S, D), 1), f32((B, 2, L, D), 2), f32((B, 2, L, D), 3)], {})
    c["causal_square"] = (23, lambda: [f32((B, H, S, D), 7), f32((B, H, S, D), 8), f32((B, H, S, D), 9)],
                          dict(is_causal=1))
    c["causal_rect"] = (23, lambda: [f32((B, H, S, D), 7), f32((B, H, L, D), 8), f32((B, H, L, D), 9)],
                        dict(is_causal=1))
    c["scale"] = (23, lambda: [f32((B, H, S, D), 10), f32((B, H, L, D), 11), f32((B, H, L, D), 12)],
                  dict(scale=0.7))
    c["softcap"] = (23, lambda: [f32((B, H, S, D), 13) * 4, f32((B, H, L, D), 14) * 4, f32((B, H, L, D), 15)],
                    dict(softcap=1.5, scale=0.9))
    c["float_mask_2d"] = (23, lambda: [f32((B, H, S, D), 1), f32((B, H, L, D), 2), f32((B, H, L, D), 3),
                                       f32((S, L), 4)], {})
    c["float_mask_3d_causal"] = (23, lambda: [f32((B, H, S, D), 1), f32((B, H, L, D), 2), f32((B, H, L, D), 3),
                                              f32((H, S, L), 4)], dict(is_causal=1))
    c["float_mask_4d"] = (23, lambda: [f32((B, H, S, D), 1), f32((B, H, L, D), 2), f32((B, H, L, D), 3),
                                       f32((B, 1, S, L), 4)], {})
    c["bool_mask_row"] = (23, lambda: [f32((B, H, S, D), 1), f32((B, H, L, D), 2), f32((B, H, L, D), 3),
                                       np.array([True, False, True, True, False, True])], {})
    c["bool_mask_causal_full_row"] = (23, lambda: [f32((1, 2, 2, D), 5), f32((1, 2, 2, D), 6), f32((1, 2, 2, D), 7),
                                                   np.array([[True, False], [False, False]])], dict(is_causal=1))
    c["past"] = (23, lambda: [f32((B, H, S, D), 1), f32((B, H, 2, D), 2), f32((B, H, 2, D), 3), None,
                              f32((B, H, 5, D), 4), f32((B, H, 5, D), 5)], {})
    c["past_causal_gqa_3d"] = (23, lambda: [f32((B, S, 32), 1), f32((B, S, 16), 2), f32((B, S, 8), 3), None,
                                            f32((B, 2, 3, 8), 4), f32((B, 2, 3, 4), 5)],
                               dict(q_num_heads=4, kv_num_heads=2, is_causal=1))
    c["past_mask_causal"] = (23, lambda: [f32((B, H, S, D), 1), f32((B, H, S, D), 2), f32((B, H, S, D), 3),
                                          f32((B, 1, S, 7), 6), f32((B, H, 3, D), 4), f32((B, H, 3, D), 5)],
                             dict(is_causal=1))
    c["nonpad"] = (24, lambda: [f32((B, H, S, D), 1), f32((B, H, L, D), 2), f32((B, H, L, D), 3), None, None, None,
                                np.array([3, 6])], {})
    c["nonpad_causal"] = (24, lambda: [f32((B, H, S, D), 1), f32((B, H, L, D), 2), f32((B, H, L, D), 3), None, None,
                                       None, np.array([5, 2])], dict(is_causal=1))
    c["short_mask"] = (24, lambda: [f32((B, H, S, D), 1), f32((B, H, L, D), 2), f32((B, H, L, D), 3),
                                    f32((B, H, S, 4), 4), None, None, np.array([3, 4])], {})
    c["window_causal"] = (25, lambda: [f32((B, H, S, D), 1), f32((B, H, L, D), 2), f32((B, H, L, D), 3)],
                          dict(is_causal=1, left_window_size=2))
    c["window_two_sided"] = (25, lambda: [f32((B, H, S, D), 1), f32((B, H, L, D), 2), f32((B, H, L, D), 3)],
                             dict(left_window_size=1, right_window_size=2))
    c["window_past_nonpad"] = (25, lambda: [f32((B, H, S, D), 1), f32((B, H, L, D), 2), f32((B, H, L, D), 3),
                                            None, None, None, np.array([6, 5])],
                               dict(is_causal=1, left_window_size=1))
    return c


CASES = _cases()


@pytest.mark.parametrize("version,case", [(v, c) for c, (since, _, _) in CASES.items()
                                          for v in ATTN_VERSIONS if v >= since])
def test_attention_matches_reference(version, case):
    _, build, attrs = CASES[case]
    inputs = build()
    has_past = len(inputs) > 4 and inputs[4] is not None
    n_out = 3 if has_past else 1
    got = run_node("Attention", version, inputs, n_outputs=n_out, **attrs)
    got = got if isinstance(got, tuple) else (got,)
    ins = inputs + [None] * (7 - len(inputs))
    y, pk, pv, _ = attention_ref(ins[0], ins[1], ins[2], ins[3], ins[4], ins[5], ins[6], version=version, **attrs)
    assert got[0].dtype == np.float32
    close(got[0], y)
    if has_past:
        assert got[1].dtype == got[2].dtype == np.float32
        np.testing.assert_array_equal(got[1], pk.astype(np.float32))
        np.testing.assert_array_equal(got[2], pv.astype(np.float32))


@pytest.mark.parametrize("version", ATTN_VERSIONS)
@pytest.mark.parametrize("mode", [0, 1, 2, 3])
def test_attention_qk_matmul_output_modes(version, mode):
    Q, K, V = f32((2, 2, 3, 4), 20) * 3, f32((2, 2, 5, 4), 21) * 3, f32((2, 2, 5, 4), 22)
    mask = f32((3, 5), 23)
    mask[1, 3] = -np.inf
    pk, pv = f32((2, 2, 2, 4), 24), f32((2, 2, 2, 4), 25)
    mask = np.concatenate([np.zeros((3, 2), np.float32), mask], axis=1)    # total = 2 + 5
    attrs = dict(qk_matmul_output_mode=mode, softcap=2.0, is_causal=1)
    y, present_k, present_v, qk = run_node("Attention", version, [Q, K, V, mask, pk, pv], n_outputs=4, **attrs)
    ey, ek, ev, eqk = attention_ref(Q, K, V, mask, pk, pv, version=version, **attrs)
    close(y, ey)
    close(qk, eqk)
    assert qk.dtype == np.float32 and qk.shape == (2, 2, 3, 7)
    np.testing.assert_array_equal(present_k, ek.astype(np.float32))


@pytest.mark.parametrize("version", ATTN_VERSIONS)
def test_attention_fully_masked_row_is_zero(version):
    Q, K, V = f32((1, 2, 2, 4), 30), f32((1, 2, 2, 4), 31), f32((1, 2, 2, 4), 32) + 2
    mask = np.array([[False, False], [True, True]])
    y, _, _, probs = run_node("Attention", version, [Q, K, V, mask], n_outputs=4, qk_matmul_output_mode=3)
    assert np.all(np.isfinite(y)) and np.all(np.isfinite(probs))
    np.testing.assert_array_equal(y[:, :, 0], 0)
    np.testing.assert_array_equal(probs[:, :, 0], 0)
    close(probs[:, :, 1].sum(-1), np.ones((1, 2)))
    # a float mask of -inf everywhere in a row is fully masked too
    fmask = np.where(mask, 0, -np.inf).astype(np.float32)
    np.testing.assert_array_equal(run_node("Attention", version, [Q, K, V, fmask])[:, :, 0], 0)


@pytest.mark.parametrize("version", ATTN_VERSIONS)
def test_attention_uniform_weights_by_hand(version):
    # Q = 0: every score is 0, so Y is the mean of the attended values.
    Q, K = np.zeros((1, 1, 3, 2), np.float32), f32((1, 1, 3, 2), 40)
    V = np.array([[[[1, 10], [2, 20], [6, 60]]]], np.float32)
    close(run_node("Attention", version, [Q, K, V]), np.tile([[[[3, 30]]]], (1, 1, 3, 1)))
    close(run_node("Attention", version, [Q, K, V], is_causal=1),
          np.array([[[[1, 10], [1.5, 15], [3, 30]]]], np.float32))


def test_attention_bidirectional_window_by_hand():
    Q = K = np.zeros((1, 1, 5, 1), np.float32)
    V = np.arange(5, dtype=np.float32).reshape(1, 1, 5, 1)
    y = run_node("Attention", 25, [Q, K, V], left_window_size=1, right_window_size=2)
    close(y.reshape(-1), [1.0, 1.5, 2.5, 3.0, 3.5])


def test_attention_nonpad_offset_by_hand():
    # External cache, decode step: nonpad 3 of 5 keys -> the query sees keys 0..2 (mean 1 of V = 0..4).
    Q, K = np.zeros((1, 1, 1, 2), np.float32), f32((1, 1, 5, 2), 41)
    V = np.arange(5, dtype=np.float32).reshape(1, 1, 5, 1)
    close(run_node("Attention", 24, [Q, K, V, None, None, None, np.array([3])], is_causal=1), [[[[1.0]]]])
    # negative offset (nonpad 1 < q_seq 2): row 0 sees nothing -> 0, row 1 sees key 0
    Q2 = np.zeros((1, 1, 2, 2), np.float32)
    V2 = V + 7
    close(run_node("Attention", 24, [Q2, K, V2, None, None, None, np.array([1])], is_causal=1), [[[[0.0], [7.0]]]])


@pytest.mark.parametrize("version", ATTN_VERSIONS)
def test_attention_present_without_past_is_4d_kv(version):
    Q, K, V = f32((2, 3, 8), 42), f32((2, 5, 8), 43), f32((2, 5, 6), 44)
    y, pk, pv = run_node("Attention", version, [Q, K, V], n_outputs=3, q_num_heads=2, kv_num_heads=2)
    assert y.shape == (2, 3, 6)
    np.testing.assert_array_equal(pk, to4d(K, 2).astype(np.float32))
    np.testing.assert_array_equal(pv, to4d(V, 2).astype(np.float32))


@pytest.mark.parametrize("version", ATTN_VERSIONS)
def test_attention_mask_with_one_key_column(version):
    # 23: a last dimension of 1 broadcasts over the keys; 24+: a shorter last dimension is padded
    # with -inf, so only key 0 is attended and Y is V's first row.
    Q, K, V = f32((1, 1, 2, 4), 45), f32((1, 1, 3, 4), 46), f32((1, 1, 3, 2), 47)
    mask = np.array([[0.5], [0.25]], np.float32)
    y = run_node("Attention", version, [Q, K, V, mask])
    if version == 23:
        close(y, attention_ref(Q, K, V)[0])
    else:
        close(y, np.broadcast_to(V[:, :, :1], (1, 1, 2, 2)))


@pytest.mark.parametrize("version,tname", type_params("Attention", ATTN_VERSIONS, "T1"))
def test_attention_every_type(version, tname):
    dt = np_type(tname)
    Q, K, V = (rnd(s, seed).astype(dt) for s, seed in (((2, 4, 16), 50), ((2, 5, 8), 51), ((2, 5, 6), 52)))
    mask = rnd((4, 5), 53).astype(dt)
    pk, pv = rnd((2, 2, 3, 4), 54).astype(dt), rnd((2, 2, 3, 3), 55).astype(dt)
    mask = np.concatenate([np.zeros((4, 3), dt), mask], axis=1)
    attrs = dict(q_num_heads=4, kv_num_heads=2, is_causal=1, qk_matmul_output_mode=3)
    y, k, v, qk = run_node("Attention", version, [Q, K, V, mask, pk, pv], n_outputs=4, **attrs)
    ey, ek, ev, eqk = attention_ref(Q, K, V, mask, pk, pv, version=version, **attrs)
    for got, exp in ((y, ey), (k, ek), (v, ev), (qk, eqk)):
        assert got.dtype == dt
        close(got, exp.astype(dt), tname)


@pytest.mark.parametrize("version,tname", type_params("Attention", ATTN_VERSIONS, "T2"))
def test_attention_value_type_differs(version, tname):
    dt = np_type(tname)
    Q, K = f32((1, 2, 3, 4), 60), f32((1, 2, 4, 4), 61)
    V, pv = rnd((1, 2, 4, 3), 62).astype(dt), rnd((1, 2, 1, 3), 63).astype(dt)
    pk = f32((1, 2, 1, 4), 64)
    y, k, v = run_node("Attention", version, [Q, K, V, None, pk, pv], n_outputs=3)
    ey, _, ev, _ = attention_ref(Q, K, V, None, pk, pv, version=version)
    assert y.dtype == np.float32 and k.dtype == np.float32 and v.dtype == dt
    close(y, ey, "float" if tname in ("float", "double") else tname)
    close(v, ev.astype(dt), tname)


@pytest.mark.parametrize("version,tname", type_params("Attention", ATTN_VERSIONS, "U"))
def test_attention_every_mask_type(version, tname):
    dt = np_type(tname)
    Q, K, V = f32((1, 2, 3, 4), 70), f32((1, 2, 4, 4), 71), f32((1, 2, 4, 4), 72)
    if tname == "bool":
        mask = np.array([[True, False, True, True], [False, True, True, False], [True, True, True, True]])
    else:
        mask = np.array([[0, 1, 2, 0], [3, 0, 1, 2], [1, 1, 0, 3]]).astype(dt)   # added to the scores
    close(run_node("Attention", version, [Q, K, V, mask]), attention_ref(Q, K, V, mask, version=version)[0])


@pytest.mark.parametrize("version", ATTN_VERSIONS)
def test_attention_softmax_precision(version):
    Q, K, V = f32((1, 2, 3, 4), 80), f32((1, 2, 4, 4), 81), f32((1, 2, 4, 4), 82)
    for prec in (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16):
        tname = {TensorProto.FLOAT16: "float16", TensorProto.BFLOAT16: "bfloat16"}.get(prec, "float")
        y = run_node("Attention", version, [Q, K, V], softmax_precision=prec)
        assert y.dtype == np.float32
        close(y, attention_ref(Q, K, V)[0], tname)
    q16 = Q.astype(np.float16)
    y, _, _, p = run_node("Attention", version, [q16, K.astype(np.float16), V.astype(np.float16)], n_outputs=4,
                          softmax_precision=TensorProto.FLOAT, qk_matmul_output_mode=3)
    assert y.dtype == p.dtype == np.float16        # mode 3 is emitted at T1


@pytest.mark.parametrize("version", ATTN_VERSIONS)
def test_attention_empty_query(version):
    y = run_node("Attention", version, [np.zeros((2, 3, 0, 4), np.float32), f32((2, 3, 5, 4), 1), f32((2, 3, 5, 2), 2)])
    assert y.shape == (2, 3, 0, 2) and y.dtype == np.float32


@pytest.mark.parametrize("version", ATTN_VERSIONS)
@pytest.mark.parametrize("inputs,attrs,error,words", [
    # 3-D hidden size not a multiple of the head count
    (lambda: [f32((1, 2, 10), 1), f32((1, 2, 8), 2), f32((1, 2, 8), 3)], dict(q_num_heads=4, kv_num_heads=2),
     KernelError, "multiple"),
    # 4-D query heads not a multiple of kv heads
    (lambda: [f32((1, 3, 2, 4), 1), f32((1, 2, 2, 4), 2), f32((1, 2, 2, 4), 3)], {}, KernelError, "multiple"),
    # 3-D without head counts
    (lambda: [f32((1, 2, 8), 1), f32((1, 2, 8), 2), f32((1, 2, 8), 3)], {}, KernelError, "q_num_heads"),
    # attribute head counts that do not divide: caught when the model is prepared
    (lambda: [f32((1, 2, 12), 1), f32((1, 2, 8), 2), f32((1, 2, 8), 3)], dict(q_num_heads=3, kv_num_heads=2),
     InvalidNodeError, "multiple"),
    (lambda: [f32((1, 2, 2, 4), 1), f32((1, 2, 3, 4), 2), f32((1, 2, 3, 4), 3), f32((2, 4), 4)], {},
     KernelError, "attn_mask"),
    (lambda: [f32((1, 2, 2, 4), 1), f32((1, 2, 3, 4), 2), f32((1, 2, 3, 4), 3), None, f32((1, 2, 1, 4), 4)], {},
     KernelError, "past_value"),
    (lambda: [f32((1, 2, 2, 4), 1), f32((1, 2, 3, 4), 2), f32((1, 2, 3, 4), 3)], dict(qk_matmul_output_mode=4),
     InvalidNodeError, "qk_matmul_output_mode"),
    (lambda: [f32((1, 2, 2, 4), 1), f32((1, 2, 3, 4), 2), f32((1, 2, 3, 4), 3)], dict(softmax_precision=7),
     InvalidNodeError, "softmax_precision"),
    (lambda: [f32((1, 2, 2, 4), 1), f32((1, 2, 3, 5), 2), f32((1, 2, 3, 4), 3)], {}, KernelError, "head size"),
])
def test_attention_errors(version, inputs, attrs, error, words):
    with pytest.raises(error) as info:
        run_node("Attention", version, inputs(), **attrs)
    assert NODE in str(info.value) and words in str(info.value), str(info.value)


def test_attention_nonpad_shape_error():
    with pytest.raises(KernelError, match="nonpad_kv_seqlen"):
        run_node("Attention", 24, [f32((2, 1, 2, 4), 1), f32((2, 1, 3, 4), 2), f32((2, 1, 3, 4), 3), None, None, None,
                                   np.array([1, 2, 3])])


def test_attention_window_attributes_only_in_25():
    ins = [f32((1, 1, 2, 4), 1), f32((1, 1, 3, 4), 2), f32((1, 1, 3, 4), 3)]
    with pytest.raises(InvalidNodeError, match="left_window_size"):
        run_node("Attention", 24, ins, left_window_size=1)
    with pytest.raises(InvalidNodeError, match="window"):
        run_node("Attention", 25, ins, left_window_size=-2)


# -- RotaryEmbedding -----------------------------------------------------------------------------

def rotary_ref(x, cos, sin, pos=None, *, interleaved=0, num_heads=None, rotary_embedding_dim=0):
    """Rotate each (x1, x2) pair: (cos x1 - sin x2, sin x1 + cos x2); pairs are (i, i + rd/2) or
    (2i, 2i + 1) when interleaved; dims past rotary_embedding_dim are unchanged."""
    x = x.astype(np.float64)
    out = x.copy()
    four = x.ndim == 4
    if four:
        b, h, s, d = x.shape
    else:
        b, s, hidden = x.shape
        h = num_heads
        d = hidden // h
    rd = rotary_embedding_dim or d
    half = rd // 2
    for bi in range(b):
        for si in range(s):
            row = pos[bi, si] if pos is not None else None
            c = cos[row] if pos is not None else cos[bi, si]
            sn = sin[row] if pos is not None else sin[bi, si]
            for hi in range(h):
                for i in range(half):
                    a, bb = (2 * i, 2 * i + 1) if interleaved else (i, i + half)
                    if four:
                        x1, x2 = x[bi, hi, si, a], x[bi, hi, si, bb]
                        out[bi, hi, si, a] = c[i] * x1 - sn[i] * x2
                        out[bi, hi, si, bb] = sn[i] * x1 + c[i] * x2
                    else:
                        o = hi * d
                        x1, x2 = x[bi, si, o + a], x[bi, si, o + bb]
                        out[bi, si, o + a] = c[i] * x1 - sn[i] * x2
                        out[bi, si, o + bb] = sn[i] * x1 + c[i] * x2
    return out


def caches(rows_shape, half, seed):
    theta = rnd(rows_shape + (half,), seed, 0, 6)
    return np.cos(theta), np.sin(theta)


ROPE_CASES = [  # (x shape, attributes, with position_ids)
    ((2, 3, 4, 8), {}, True), ((2, 3, 4, 8), {}, False), ((2, 3, 4, 8), dict(interleaved=1), True),
    ((2, 3, 4, 8), dict(interleaved=1), False), ((2, 3, 4, 8), dict(rotary_embedding_dim=4), True),
    ((2, 3, 4, 8), dict(rotary_embedding_dim=4, interleaved=1), False),
    ((2, 4, 24), dict(num_heads=3), True), ((2, 4, 24), dict(num_heads=3, interleaved=1), False),
    ((2, 4, 24), dict(num_heads=3, rotary_embedding_dim=6, interleaved=1), True),
    ((1, 1, 0, 8), {}, True),
]


@pytest.mark.parametrize("tname", [p.values[1] for p in type_params("RotaryEmbedding", [23])])
@pytest.mark.parametrize("shape,attrs,with_pos", ROPE_CASES)
def test_rotary_embedding(tname, shape, attrs, with_pos):
    dt = np_type(tname)
    x = rnd(shape, 90).astype(dt)
    head = shape[3] if len(shape) == 4 else shape[2] // attrs["num_heads"]
    half = (attrs.get("rotary_embedding_dim") or head) // 2
    b, s = shape[0], shape[2] if len(shape) == 4 else shape[1]
    if with_pos:
        cos, sin = caches((10,), half, 91)
        pos = np.random.default_rng(92).integers(0, 10, size=(b, s))
        ins = [x, cos.astype(dt), sin.astype(dt), pos]
    else:
        cos, sin = caches((b, s), half, 91)
        pos = None
        ins = [x, cos.astype(dt), sin.astype(dt)]
    got = run_node("RotaryEmbedding", 23, ins, **attrs)
    assert got.dtype == dt
    exp = rotary_ref(x, ins[1].astype(np.float64), ins[2].astype(np.float64), pos, **attrs)
    close(got, exp.astype(dt), tname)
    if attrs.get("rotary_embedding_dim"):    # the tail is copied as is
        rd = attrs["rotary_embedding_dim"]
        if len(shape) == 4:
            np.testing.assert_array_equal(got[..., rd:], x[..., rd:])


def test_rotary_embedding_by_hand():
    # a quarter turn maps (x1, x2) to (-x2, x1); the zero angle keeps the pair
    x = np.array([[[[1, 2, 3, 4]]]], np.float32)
    cos = np.array([[0, 1]], np.float32)
    sin = np.array([[1, 0]], np.float32)
    pos = np.array([[0]])
    close(run_node("RotaryEmbedding", 23, [x, cos, sin, pos]), [[[[-3, 2, 1, 4]]]])
    close(run_node("RotaryEmbedding", 23, [x, cos, sin, pos], interleaved=1), [[[[-2, 1, 3, 4]]]])


@pytest.mark.parametrize("ins,attrs,words", [
    (lambda: [f32((1, 2, 8), 1), f32((4, 2), 2), f32((4, 2), 3), np.zeros((1, 2), np.int64)], {}, "num_heads"),
    (lambda: [f32((1, 2, 9), 1), f32((4, 2), 2), f32((4, 2), 3), np.zeros((1, 2), np.int64)], dict(num_heads=2),
     "multiple"),
    (lambda: [f32((1, 1, 2, 4), 1), f32((4, 2), 2), f32((4, 2), 3), np.array([[0, 4]])], {}, "position_ids"),
    (lambda: [f32((1, 1, 2, 4), 1), f32((4, 2), 2), f32((4, 2), 3), np.array([[0, -1]])], {}, "position_ids"),
    (lambda: [f32((1, 1, 2, 4), 1), f32((4, 1), 2), f32((4, 1), 3), np.array([[0, 1]])], {}, "rotary_embedding_dim"),
    (lambda: [f32((1, 1, 2, 4), 1), f32((4, 2), 2), f32((4, 2), 3), np.array([[0, 1]])],
     dict(rotary_embedding_dim=3), "even"),
    (lambda: [f32((1, 1, 2, 4), 1), f32((1, 3, 2), 2), f32((1, 3, 2), 3)], {}, "shape"),
])
def test_rotary_embedding_errors(ins, attrs, words):
    with pytest.raises(KernelError) as info:
        run_node("RotaryEmbedding", 23, ins(), **attrs)
    assert NODE in str(info.value) and words in str(info.value), str(info.value)


# -- LinearAttention -----------------------------------------------------------------------------

def linear_attention_ref(query, key, value, past=None, decay=None, beta=None, *, q_num_heads, kv_num_heads,
                         update_rule="gated_delta", scale=0.0, chunk_size=64):
    """The spec's recurrence, token by token, per batch and query head (float64)."""
    b, t, _ = query.shape
    hq, hkv = q_num_heads, kv_num_heads
    dk, dv = query.shape[2] // hq, value.shape[2] // hkv
    s = scale or 1 / math.sqrt(dk)
    q = query.astype(np.float64).reshape(b, t, hq, dk)
    k = key.astype(np.float64).reshape(b, t, hkv, dk)
    v = value.astype(np.float64).reshape(b, t, hkv, dv)
    state = np.zeros((b, hkv, dk, dv)) if past is None else past.astype(np.float64).copy()
    out = np.zeros((b, t, hq, dv))
    for bi in range(b):
        for h in range(hkv):
            S = state[bi, h]
            for ti in range(t):
                kt, vt = k[bi, ti, h], v[bi, ti, h]
                if update_rule in ("gated", "gated_delta"):
                    g = decay[bi, ti].astype(np.float64)
                    g = g[h * dk:(h + 1) * dk] if g.shape[0] == hkv * dk else np.full(dk, g[h])
                    S = np.exp(g)[:, None] * S
                if update_rule in ("delta", "gated_delta"):
                    bt = float(beta[bi, ti, h if beta.shape[2] > 1 else 0])
                    S = S + bt * np.outer(kt, vt - S.T @ kt)
                else:
                    S = S + np.outer(kt, vt)
                for hh in range(hq):
                    if hh // (hq // hkv) == h:
                        out[bi, ti, hh] = s * (q[bi, ti, hh] @ S)
            state[bi, h] = S
    return out.reshape(b, t, hq * dv), state


def la_inputs(b, t, hq, hkv, dk, dv, seed, decay_per_head=False, beta_scalar=False, past=False):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, t, hq * dk)).astype(np.float32)
    k = rng.standard_normal((b, t, hkv, dk))
    k = (k / np.linalg.norm(k, axis=-1, keepdims=True)).reshape(b, t, hkv * dk).astype(np.float32)
    v = rng.standard_normal((b, t, hkv * dv)).astype(np.float32)
    ps = rng.standard_normal((b, hkv, dk, dv)).astype(np.float32) * 0.3 if past else None
    decay = (-np.abs(rng.standard_normal((b, t, hkv if decay_per_head else hkv * dk))) * 0.2).astype(np.float32)
    beta = rng.uniform(0, 1, (b, t, 1 if beta_scalar else hkv)).astype(np.float32)
    return q, k, v, ps, decay, beta


LA_CASES = [  # (update_rule, b, t, hq, hkv, dk, dv, options, attributes)
    ("linear", 2, 4, 2, 2, 4, 3, {}, {}),
    ("linear", 1, 1, 2, 2, 4, 4, {"past": True}, {}),
    ("gated", 2, 5, 2, 2, 4, 3, {}, {}),
    ("gated", 2, 5, 2, 2, 4, 3, {"decay_per_head": True, "past": True}, {}),
    ("delta", 2, 5, 2, 2, 4, 3, {}, {"scale": 0.3}),
    ("gated_delta", 2, 5, 2, 2, 4, 3, {"past": True}, {}),
    ("gated_delta", 2, 5, 4, 2, 4, 3, {"beta_scalar": True}, {}),        # GQA
    ("gated_delta", 1, 3, 4, 1, 4, 5, {"decay_per_head": True}, {"chunk_size": 2}),   # MQA
    ("gated_delta", 1, 0, 2, 2, 4, 3, {"past": True}, {}),                # empty sequence
]


@pytest.mark.parametrize("rule,b,t,hq,hkv,dk,dv,opts,attrs", LA_CASES)
def test_linear_attention(rule, b, t, hq, hkv, dk, dv, opts, attrs):
    q, k, v, ps, decay, beta = la_inputs(b, t, hq, hkv, dk, dv, 100 + t, **opts)
    ins = [q, k, v, ps, decay if "gated" in rule else None, beta if "delta" in rule else None]
    out, state = run_node("LinearAttention", 27, ins, n_outputs=2, update_rule=rule, q_num_heads=hq,
                          kv_num_heads=hkv, **attrs)
    eo, es = linear_attention_ref(*ins, q_num_heads=hq, kv_num_heads=hkv, update_rule=rule, **attrs)
    assert out.dtype == state.dtype == np.float32
    assert out.shape == (b, t, hq * dv) and state.shape == (b, hkv, dk, dv)
    close(out, eo)
    close(state, es)


def test_linear_attention_by_hand():
    # one token, one head, d_k = d_v = 1: S = k v, o = scale q k v (scale 1/sqrt(1) = 1)
    q, k, v = (np.array([[[x]]], np.float32) for x in (2.0, 3.0, 5.0))
    out, state = run_node("LinearAttention", 27, [q, k, v], n_outputs=2, update_rule="linear",
                          q_num_heads=1, kv_num_heads=1)
    close(out, [[[30.0]]])
    close(state, [[[[15.0]]]])
    # delta with beta 1 from S0 = 4: S = 4 + k (v - 4 k) = 4 + 3 (5 - 12) = -17
    out, state = run_node("LinearAttention", 27, [q, k, v, np.array([[[[4.0]]]], np.float32), None,
                                                  np.array([[[1.0]]], np.float32)],
                          n_outputs=2, update_rule="delta", q_num_heads=1, kv_num_heads=1)
    close(state, [[[[-17.0]]]])
    close(out, [[[-34.0]]])


@pytest.mark.parametrize("tname", [p.values[1] for p in type_params("LinearAttention", [27], "T")])
@pytest.mark.parametrize("sname", [p.values[1] for p in type_params("LinearAttention", [27], "S")])
def test_linear_attention_every_type(tname, sname):
    dt, st = np_type(tname), np_type(sname)
    q, k, v, ps, decay, beta = la_inputs(1, 3, 2, 2, 4, 3, 7, past=True)
    q, k, v, decay, beta = (x.astype(dt) for x in (q, k, v, decay, beta))
    ps = ps.astype(st)
    out, state = run_node("LinearAttention", 27, [q, k, v, ps, decay, beta], n_outputs=2, q_num_heads=2,
                          kv_num_heads=2)
    eo, es = linear_attention_ref(q, k, v, ps, decay, beta, q_num_heads=2, kv_num_heads=2)
    assert out.dtype == dt and state.dtype == st
    loosest = max(tname, sname, key=lambda n: RTOL[n])   # the state's rounding feeds the output
    close(out, eo.astype(dt), loosest)
    close(state, es.astype(st), sname)


@pytest.mark.parametrize("ins,attrs,error,words", [
    (lambda: la_inputs(1, 2, 2, 2, 4, 3, 1)[:3], dict(update_rule="gated"), KernelError, "decay"),
    (lambda: la_inputs(1, 2, 2, 2, 4, 3, 1)[:3] + (None, la_inputs(1, 2, 2, 2, 4, 3, 1)[4]), {}, KernelError, "beta"),
    (lambda: la_inputs(1, 2, 2, 2, 4, 3, 1)[:3], dict(update_rule="softmax"), InvalidNodeError, "update_rule"),
    (lambda: la_inputs(1, 2, 3, 2, 4, 3, 1)[:3], dict(update_rule="linear", q_num_heads=3), InvalidNodeError,
     "multiple"),
    (lambda: la_inputs(1, 2, 2, 2, 4, 3, 1)[:3] + (np.zeros((1, 2, 4, 4), np.float32),), dict(update_rule="linear"),
     KernelError, "past_state"),
])
def test_linear_attention_errors(ins, attrs, error, words):
    attrs = {"q_num_heads": 2, "kv_num_heads": 2, **attrs}
    with pytest.raises(error) as info:
        run_node("LinearAttention", 27, list(ins()), n_outputs=2, **attrs)
    assert NODE in str(info.value) and words in str(info.value), str(info.value)


# -- CausalConvWithState -------------------------------------------------------------------------

def causal_conv_ref(x, w, bias=None, past=None, activation="none"):
    """y[b, c, t] = sum_j w[c, 0, j] * padded[b, c, t + j] + bias[c], padded = past ++ x (zeros without
    past); present = the last k - 1 positions of padded."""
    b, c, n = x.shape
    k = w.shape[2]
    past = np.zeros((b, c, k - 1)) if past is None else past.astype(np.float64)
    padded = np.concatenate([past, x.astype(np.float64)], axis=2)
    y = np.zeros((b, c, n))
    for bi in range(b):
        for ci in range(c):
            for t in range(n):
                acc = sum(w[ci, 0, j] * padded[bi, ci, t + j] for j in range(k))
                if bias is not None:
                    acc += bias[ci]
                if activation in ("silu", "swish"):
                    acc = acc / (1 + math.exp(-acc))
                y[bi, ci, t] = acc
    return y, padded[:, :, padded.shape[2] - (k - 1):]


CONV_CASES = [  # (b, c, n, k, bias, past, activation)
    (2, 3, 6, 4, False, False, "none"), (2, 3, 6, 4, True, True, "none"), (1, 2, 5, 3, True, False, "silu"),
    (2, 2, 1, 4, False, True, "swish"),       # decode step
    (1, 2, 2, 4, False, False, "none"),       # shorter than k - 1: present keeps zeros
    (1, 2, 2, 4, True, True, "silu"),         # shorter than k - 1: present keeps part of past
    (1, 3, 5, 1, True, False, "none"),        # k = 1: empty state
    (1, 1, 1, 1, False, False, "none"),
    (2, 3, 0, 3, False, True, "none"),        # empty input: present = past
]


@pytest.mark.parametrize("tname", [p.values[1] for p in type_params("CausalConvWithState", [27])])
@pytest.mark.parametrize("b,c,n,k,with_bias,with_past,act", CONV_CASES)
def test_causal_conv_with_state(tname, b, c, n, k, with_bias, with_past, act):
    dt = np_type(tname)
    x, w = rnd((b, c, n), 1).astype(dt), rnd((c, 1, k), 2).astype(dt)
    bias = rnd((c,), 3).astype(dt) if with_bias else None
    past = rnd((b, c, k - 1), 4).astype(dt) if with_past else None
    y, state = run_node("CausalConvWithState", 27, [x, w, bias, past], n_outputs=2, activation=act)
    ey, es = causal_conv_ref(x, w.astype(np.float64), None if bias is None else bias.astype(np.float64), past, act)
    assert y.dtype == state.dtype == dt
    close(y, ey.astype(dt), tname)
    assert state.shape == (b, c, k - 1)
    np.testing.assert_array_equal(state.astype(np.float64), es)     # copied values: exact


def test_causal_conv_by_hand():
    x = np.array([[[1, 2, 3]]], np.float32)
    w = np.array([[[1, 10, 100]]], np.float32)            # y[t] = x[t-2] + 10 x[t-1] + 100 x[t]
    y, state = run_node("CausalConvWithState", 27, [x, w], n_outputs=2)
    close(y, [[[100, 210, 321]]])
    close(state, [[[2, 3]]])
    bias, past = np.array([0.5], np.float32), np.array([[[7, 8]]], np.float32)
    y, state = run_node("CausalConvWithState", 27, [x, w, bias, past], n_outputs=2)
    close(y, [[[7 + 80 + 100 + 0.5, 8 + 10 + 200 + 0.5, 1 + 20 + 300 + 0.5]]])
    close(state, [[[2, 3]]])


@pytest.mark.parametrize("ins,attrs,error,words", [
    (lambda: [f32((1, 2, 3), 1), f32((3, 1, 2), 2)], {}, KernelError, "weight"),
    (lambda: [f32((1, 2, 3), 1), f32((2, 2, 2), 2)], {}, KernelError, "weight"),
    (lambda: [f32((1, 2, 3), 1), f32((2, 1, 2), 2), f32((3,), 3)], {}, KernelError, "bias"),
    (lambda: [f32((1, 2, 3), 1), f32((2, 1, 3), 2), None, f32((1, 2, 1), 3)], {}, KernelError, "past_state"),
    (lambda: [f32((2, 3), 1), f32((2, 1, 2), 2)], {}, KernelError, "input"),
    (lambda: [f32((1, 2, 3), 1), f32((2, 1, 2), 2)], dict(activation="relu"), InvalidNodeError, "activation"),
])
def test_causal_conv_errors(ins, attrs, error, words):
    with pytest.raises(error) as info:
        run_node("CausalConvWithState", 27, ins(), n_outputs=2, **attrs)
    assert NODE in str(info.value) and words in str(info.value), str(info.value)


# -- the optimiser's fused Attention (softmax without the max shift when the row sums allow it) --------

def fused_ref(q, k, v, mask, c):
    """softmax(q k / c + mask) v in float64, shifted by each row's maximum (rows of -inf give NaN)."""
    s = np.matmul(q.astype(np.float64), k.astype(np.float64)) / c + mask
    with np.errstate(invalid="ignore"):
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        return np.matmul(e / e.sum(axis=-1, keepdims=True), v.astype(np.float64))


@pytest.mark.parametrize("case", ["plain", "overflow", "far_below", "masked_row"])
def test_fused_attention_softmax_paths(case):
    from onnx_mini.ops.fused import fused_attention
    q, k, v = (rnd(s, i).astype(np.float32) for i, s in enumerate([(1, 2, 4, 8), (1, 2, 8, 6), (1, 2, 6, 8)]))
    mask = np.zeros((1, 1, 4, 6), np.float32)
    if case == "overflow":          # exp(scores) overflows float32: the shifted path
        q *= 300
    elif case == "far_below":       # one row's terms all below exp's normal range: the shifted path
        mask[..., 1, :] = -200
    elif case == "masked_row":      # a row of -inf: NaN, as Softmax's nodes give
        mask[..., 2, :] = -np.inf
    got = fused_attention(scale=2.0, divide=1)(q, k, v, mask)
    exp = fused_ref(q, k, v, mask, 2.0)
    assert got.dtype == np.float32 and got.shape == (1, 2, 4, 8)
    if case == "masked_row":
        assert np.isnan(got[:, :, 2]).all()
        got, exp = np.delete(got, 2, axis=2), np.delete(exp, 2, axis=2)
    close(got, exp)
