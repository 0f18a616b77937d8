"""Scaled dot-product Attention (23, 24, 25) and RotaryEmbedding (23).

Attention works on the 4-D (batch, heads, seq, head_size) form; 3-D (batch, seq, heads * head_size)
inputs are viewed as 4-D through q_num_heads / kv_num_heads and the output goes back to 3-D.
Grouped-query attention never copies K/V per query head: Q is viewed as
(batch, kv_heads, group, seq, head_size) against K/V of shape (batch, kv_heads, 1, ...), so query
head h reads kv head h // group, as the spec's repeat of each kv head does.

The bias added to the scores sums the spec's pieces, each 0 (allowed) or -inf (masked):
attn_mask (a boolean mask, or a float/int mask added as is), the causal frontier
(key j <= i + offset), from 24 the nonpad_kv_seqlen padding (j < nonpad[b]) and, from 25, the
sliding window (p - left <= j <= p + right, p = i + offset). offset is the past length with
past_key, nonpad[b] - q_seq_len with nonpad_kv_seqlen (24+), else 0. A query row whose whole bias
is -inf gets zero probabilities (and a zero output row), not NaN.

float16 / bfloat16 are computed in float32 and rounded once per output; double stays double.
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from ... import blas
from ...errors import InvalidValueError
from ...registry import kernel
from .._common import UPCAST, broadcasts_to
from .normalization import last_axis_sums

_SOFTMAX_TYPES = {1: np.dtype(np.float32), 10: np.dtype(np.float16), 11: np.dtype(np.float64),
                  16: np.dtype(ml_dtypes.bfloat16)}


def _compute_type(dt: np.dtype) -> np.dtype:
    return np.dtype(np.float64) if dt == np.float64 else np.dtype(np.float32)


def _as(x: np.ndarray, dt: np.dtype) -> np.ndarray:
    return x if x.dtype == dt else x.astype(dt)


def _heads_4d(x: np.ndarray, heads, what: str) -> np.ndarray:
    """(batch, seq, heads * size) -> the (batch, heads, seq, size) view; 4-D inputs pass through."""
    if x.ndim == 4:
        if heads is not None and x.shape[1] != heads:
            raise InvalidValueError(f"{what} has {x.shape[1]} heads (shape {list(x.shape)}) but the "
                                    f"num_heads attribute says {heads}")
        return x
    if x.ndim != 3:
        raise InvalidValueError(f"{what} must be 3-D or 4-D, got shape {list(x.shape)}")
    if heads is None:
        raise InvalidValueError(f"{what} is 3-D: q_num_heads and kv_num_heads must be given")
    b, s, hidden = x.shape
    if heads <= 0 or hidden % heads:
        raise InvalidValueError(f"{what} hidden size {hidden} is not a multiple of its head count {heads}")
    return x.reshape(b, s, heads, hidden // heads).transpose(0, 2, 1, 3)


def _attention(*, version: int, is_causal, q_num_heads, kv_num_heads, qk_matmul_output_mode, scale,
               softcap, softmax_precision, left_window_size=-1, right_window_size=-1, n_outputs=1):
    """The kernel function of every Attention version (attributes already checked)."""
    if qk_matmul_output_mode not in (0, 1, 2, 3):
        raise ValueError(f"qk_matmul_output_mode must be 0, 1, 2 or 3, got {qk_matmul_output_mode}")
    if softmax_precision is not None and softmax_precision not in _SOFTMAX_TYPES:
        raise ValueError(f"softmax_precision must be one of 1 (float), 10 (float16), 11 (double), "
                         f"16 (bfloat16), got {softmax_precision}")
    if (q_num_heads is None) != (kv_num_heads is None):
        raise ValueError("q_num_heads and kv_num_heads must be given together")
    if q_num_heads is not None and (q_num_heads <= 0 or kv_num_heads <= 0):
        raise ValueError(f"q_num_heads ({q_num_heads}) and kv_num_heads ({kv_num_heads}) must be positive")
    if q_num_heads is not None and q_num_heads % kv_num_heads:
        raise ValueError(f"q_num_heads ({q_num_heads}) must be a multiple of kv_num_heads ({kv_num_heads})")
    if left_window_size < -1 or right_window_size < -1:
        raise ValueError(f"left_window_size ({left_window_size}) and right_window_size "
                         f"({right_window_size}) must be >= -1")
    sm_type = None if softmax_precision is None else _SOFTMAX_TYPES[softmax_precision]
    causal = bool(is_causal)
    pad_short_mask = version >= 24
    want_present = n_outputs >= 2
    want_qk = n_outputs >= 4

    def run(Q, K, V, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None):
        t1, t2 = Q.dtype, V.dtype
        if K.dtype != t1:
            raise InvalidValueError(f"Q ({t1}) and K ({K.dtype}) must have the same type")
        if not Q.ndim == K.ndim == V.ndim:
            raise InvalidValueError(f"Q, K and V must have the same rank, got shapes {list(Q.shape)}, "
                                    f"{list(K.shape)}, {list(V.shape)}")
        three_d = Q.ndim == 3
        q = _heads_4d(Q, q_num_heads, "Q")
        k = _heads_4d(K, kv_num_heads, "K")
        v = _heads_4d(V, kv_num_heads, "V")
        b, hq, sq, d = q.shape
        hkv = k.shape[1]
        if k.shape[0] != b or v.shape[0] != b or v.shape[1] != hkv or k.shape[3] != d or v.shape[2] != k.shape[2]:
            raise InvalidValueError(f"Q {list(Q.shape)}, K {list(K.shape)} and V {list(V.shape)} do not agree "
                                    "on batch size, kv heads, head size or kv sequence length")
        if hkv == 0 or hq % hkv:
            raise InvalidValueError(f"the {hq} query heads are not a multiple of the {hkv} key/value heads")
        if (past_key is None) != (past_value is None):
            raise InvalidValueError("past_key and past_value must be given together")
        if past_key is not None:
            if (past_key.ndim != 4 or past_value.ndim != 4 or past_key.shape[:2] != (b, hkv)
                    or past_value.shape[:2] != (b, hkv) or past_key.shape[3] != d
                    or past_value.shape[3] != v.shape[3] or past_key.shape[2] != past_value.shape[2]):
                raise InvalidValueError(f"past_key {list(past_key.shape)} / past_value {list(past_value.shape)} "
                                        f"do not match K {list(k.shape)} / V {list(v.shape)} (4-D form)")
            if past_key.dtype != t1 or past_value.dtype != t2:
                raise InvalidValueError(f"past_key ({past_key.dtype}) and past_value ({past_value.dtype}) must "
                                        f"have the types of K ({t1}) and V ({t2})")
            past = past_key.shape[2]
            k = np.concatenate([past_key, k], axis=2)
            v = np.concatenate([past_value, v], axis=2)
        else:
            past = None
        total = k.shape[2]
        present = (k, v) if want_present else ()

        ct = _compute_type(t1)
        s = scale if scale is not None else 1.0 / math.sqrt(d)
        g = hq // hkv
        qg = _as(q, ct).reshape(b, hkv, g, sq, d) * ct.type(s)
        kg = _as(k, ct)[:, :, None]
        scores = blas.matmul(qg, kg.swapaxes(-1, -2)).reshape(b, hq, sq, total)
        # scores is our own buffer from here on: softcap, bias and softmax work in place, and a
        # requested qk_matmul_output snapshot is copied before the next in-place step.
        qk_out = scores.copy() if want_qk and qk_matmul_output_mode == 0 else None
        if softcap:
            c = ct.type(softcap)
            np.divide(scores, c, out=scores)
            np.tanh(scores, out=scores)
            scores *= c
        if want_qk and qk_matmul_output_mode == 1:
            qk_out = scores.copy()

        bias = _bias(attn_mask, nonpad_kv_seqlen, past, ct, (b, hq, sq, total), causal, pad_short_mask,
                     left_window_size, right_window_size)
        dead = None
        if bias is not None:
            scores += bias
            dead = bias.max(axis=-1, keepdims=True) == -np.inf
            if not dead.any():
                dead = None
        if want_qk and qk_matmul_output_mode == 2:
            qk_out = scores.copy()
        probs = _softmax(scores, sm_type, ct)
        if dead is not None:     # rows whose whole bias is -inf: zeros (not NaN, even for inf scores)
            np.copyto(probs, ct.type(0), where=dead)
        if want_qk and qk_matmul_output_mode == 3:
            qk_out = probs
        dv = v.shape[3]
        y = blas.matmul(probs.reshape(b, hkv, g, sq, total), _as(v, ct)[:, :, None]).reshape(b, hq, sq, dv)
        if three_d:
            y = y.transpose(0, 2, 1, 3).reshape(b, sq, hq * dv)
        y = _as(y, t1)
        if not want_present:
            return (y,)
        if not want_qk:
            return (y, *present)
        return (y, *present, _as(qk_out, t1))
    return run


def _softmax(x: np.ndarray, sm_type, ct: np.dtype) -> np.ndarray:
    """Softmax over the last axis in the softmax_precision type (None: the compute type), computed in
    place in x (an owned buffer); a row of only -inf gives zeros (the caller zeroes masked rows anyway)."""
    if sm_type is not None and sm_type != ct:
        if sm_type in UPCAST:   # round to the low precision, compute in float32, round the result
            p = _softmax(x.astype(sm_type).astype(np.float32), None, np.dtype(np.float32))
            return p.astype(sm_type).astype(ct)
        return _softmax(x.astype(sm_type), None, sm_type).astype(ct)
    m = x.max(axis=-1, keepdims=True)
    m[np.isneginf(m)] = 0
    x -= m
    np.exp(x, out=x)
    total = last_axis_sums(x)
    total[total == 0] = 1
    x /= total
    return x


def _bias(mask, nonpad, past, ct: np.dtype, shape, causal: bool, pad_short_mask: bool,
          left: int, right: int):
    """The additive bias broadcastable to (batch, q_heads, q_seq, total), or None when nothing masks.
    past: the past length when past_key is given, else None."""
    b, hq, sq, total = shape
    neg = ct.type(-np.inf)
    out = None
    if mask is not None:
        if mask.ndim == 0 or mask.ndim > 4:
            raise InvalidValueError(f"attn_mask must have rank 1 to 4, got shape {list(mask.shape)}")
        out = np.where(mask, ct.type(0), neg) if mask.dtype == np.bool_ else _as(mask, ct)
        n = out.shape[-1]
        if pad_short_mask and n < total:   # 24+: a shorter last dim is padded with -inf
            out = np.concatenate([out, np.full(out.shape[:-1] + (total - n,), neg, ct)], axis=-1)
        if not broadcasts_to(out.shape, shape):
            raise InvalidValueError(f"attn_mask of shape {list(mask.shape)} does not broadcast to "
                                    f"(batch, q_num_heads, q_seq, total_seq) = {list(shape)}")
    if nonpad is not None:
        if nonpad.shape != (b,):
            raise InvalidValueError(f"nonpad_kv_seqlen must have shape [{b}] (batch_size), "
                                    f"got {list(nonpad.shape)}")
        nonpad = nonpad.astype(np.int64).reshape(b, 1, 1, 1)
    window = left >= 0 or right >= 0
    if not (causal or window or nonpad is not None):
        return out
    rows = np.arange(sq).reshape(sq, 1)
    cols = np.arange(total)
    if past is not None or nonpad is None:
        pos = rows + (past or 0)                            # (sq, 1)
    else:
        pos = rows + (nonpad - sq)                          # (b, 1, sq, 1)
    allowed = None

    def both(a, c):
        return c if a is None else a & c
    if causal:
        allowed = both(allowed, cols <= pos)
    if left >= 0:
        allowed = both(allowed, cols >= pos - left)
    if right >= 0:
        allowed = both(allowed, cols <= pos + right)
    if nonpad is not None:
        allowed = both(allowed, cols < nonpad)
    structural = np.where(allowed, ct.type(0), neg)
    return structural if out is None else out + structural


def _attrs_common(scale, softcap):
    return (None if scale is None else float(scale)), float(softcap or 0.0)


@kernel("Attention", since=(23, 24), heavy=True)
def attention_23(*, is_causal=0, kv_num_heads=None, q_num_heads=None, qk_matmul_output_mode=0,
                 scale=None, softcap=0.0, softmax_precision=None, _n_outputs=1, _version):
    scale, softcap = _attrs_common(scale, softcap)
    return _attention(version=_version, is_causal=is_causal, q_num_heads=q_num_heads, kv_num_heads=kv_num_heads,
                      qk_matmul_output_mode=qk_matmul_output_mode, scale=scale, softcap=softcap,
                      softmax_precision=softmax_precision, n_outputs=_n_outputs)


@kernel("Attention", since=25, heavy=True)
def attention_25(*, is_causal=0, kv_num_heads=None, q_num_heads=None, qk_matmul_output_mode=0,
                 scale=None, softcap=0.0, softmax_precision=None, left_window_size=-1, right_window_size=-1,
                 _n_outputs=1, _version):
    scale, softcap = _attrs_common(scale, softcap)
    return _attention(version=_version, is_causal=is_causal, q_num_heads=q_num_heads, kv_num_heads=kv_num_heads,
                      qk_matmul_output_mode=qk_matmul_output_mode, scale=scale, softcap=softcap,
                      softmax_precision=softmax_precision, left_window_size=left_window_size,
                      right_window_size=right_window_size, n_outputs=_n_outputs)


# -- RotaryEmbedding -----------------------------------------------------------------------------

@kernel("RotaryEmbedding", since=23)
def rotary_embedding_23(*, interleaved=0, num_heads=None, rotary_embedding_dim=0):
    if rotary_embedding_dim < 0:
        raise ValueError(f"rotary_embedding_dim must be >= 0, got {rotary_embedding_dim}")
    if num_heads is not None and num_heads <= 0:
        raise ValueError(f"num_heads must be positive, got {num_heads}")

    def run(X, cos_cache, sin_cache, position_ids=None):
        dt = X.dtype
        ct = _compute_type(dt)
        if X.ndim == 4:
            x = X                                   # (batch, heads, seq, head_size)
            b, _, s, head = x.shape
            head_axis = 1
        elif X.ndim == 3:
            if num_heads is None:
                raise InvalidValueError("X is 3-D: the num_heads attribute is required")
            b, s, hidden = X.shape
            if hidden % num_heads:
                raise InvalidValueError(f"hidden size {hidden} is not a multiple of num_heads {num_heads}")
            head = hidden // num_heads
            x = X.reshape(b, s, num_heads, head)    # (batch, seq, heads, head_size)
            head_axis = 2
        else:
            raise InvalidValueError(f"X must be 3-D or 4-D, got shape {list(X.shape)}")
        rd = rotary_embedding_dim or head
        if rd > head or rd % 2:
            raise InvalidValueError(f"rotary_embedding_dim {rd} must be even and at most head_size {head}")
        half = rd // 2
        if position_ids is not None:
            if cos_cache.ndim != 2 or sin_cache.shape != cos_cache.shape:
                raise InvalidValueError(f"with position_ids, cos_cache {list(cos_cache.shape)} and sin_cache "
                                        f"{list(sin_cache.shape)} must be 2-D of one shape")
            if position_ids.shape != (b, s):
                raise InvalidValueError(f"position_ids must have shape {[b, s]}, got {list(position_ids.shape)}")
            n = cos_cache.shape[0]
            if position_ids.size and (position_ids.min() < 0 or position_ids.max() >= n):
                raise InvalidValueError(f"position_ids must be in [0, {n - 1}] (cache rows)")
            cos, sin = cos_cache[position_ids], sin_cache[position_ids]
        else:
            cos, sin = cos_cache, sin_cache
            if cos.shape != (b, s, cos.shape[-1]) or sin.shape != cos.shape:
                raise InvalidValueError(f"without position_ids, cos_cache {list(cos_cache.shape)} and sin_cache "
                                        f"{list(sin_cache.shape)} must have shape [batch, seq, rotary_dim/2] "
                                        f"= {[b, s, half]}")
        if cos.shape[-1] != half:
            raise InvalidValueError(f"the caches' last dimension {cos.shape[-1]} must be rotary_embedding_dim/2 "
                                    f"= {half}")
        # (batch, seq, half) -> broadcast against x's (.., heads, .., half) layout
        cos = np.expand_dims(_as(cos, ct), head_axis)
        sin = np.expand_dims(_as(sin, ct), head_axis)
        out = x.astype(ct)                          # a fresh copy; the tail past rd stays as is
        if interleaved:
            x1, x2 = out[..., 0:rd:2], out[..., 1:rd:2]
        else:
            x1, x2 = out[..., :half], out[..., half:rd]
        real = cos * x1 - sin * x2
        imag = sin * x1 + cos * x2
        x1[...] = real
        x2[...] = imag
        return _as(out.reshape(X.shape), dt)
    return run
