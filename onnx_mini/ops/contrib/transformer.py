"""com.microsoft attention operators (version 1 each), as onnxruntime's transformer optimizer and
model builder write them: Attention, MultiHeadAttention, GroupQueryAttention, RotaryEmbedding.
(SkipLayerNormalization, SkipSimplifiedLayerNormalization, EmbedLayerNormalization: layer_norm.py.)

Attention layout: Q, K, V are viewed as (batch, heads, seq, head_size); grouped-query attention views
Q as (batch, kv_heads, group, seq, head_size) against K/V of (batch, kv_heads, 1, ...), so K/V are
never repeated per query head. Scores are Q K^T * scale (default 1/sqrt(head_size)) plus an additive
bias; softmax over the keys; output = probabilities @ V, back to (batch, seq, heads * head_size).

Masks (Attention's mask_index, MultiHeadAttention's key_padding_mask) are additive: a masked key gets
mask_filter_value (default -10000) added, never -inf, as onnxruntime does. The forms: 1-D (batch)
valid lengths (right padding), 1-D (2 * batch) exclusive ends then inclusive starts (left padding),
2-D (batch, total), 3-D (batch, seq, total) and 4-D (batch, 1, max, max) raw masks (0 = masked; the
4-D one is read at rows [past, past + seq) and columns [0, total)). The causal mask of
`unidirectional` adds -10000 (onnxruntime does not use mask_filter_value there). The (3 * batch + 2)
form is onnxruntime's GPU-only layout and is refused with a clear error.

GroupQueryAttention follows onnxruntime's KV-cache contract: seqlens_k[b] + 1 is batch b's total
length; in the first prompt (total_sequence_length == sequence_length) every batch starts at
position 0 (and reads only position_ids' first element, as documented), otherwise at
past_b = seqlens_k[b] + 1 - sequence_length. present_key/value have
max(past length, total_sequence_length) rows: the past rows [0, past_b), then the new ones; the rest
is zero. Key j is visible to query i (position p = past_b + i) when j < seqlens_k[b] + 1, j <= p
(causal) and j > p - local_window_size (local attention). Masked keys there are -inf (excluded).
Also: packed QKV input, rotary (do_rotary with cos/sin caches, at the new tokens' positions or
position_ids), per-head RMS norm of Q and K (q_norm_weight / k_norm_weight, before the rotary),
softcap, attention_bias, a per-head sink logit in the softmax denominator (head_sink; smooth_softmax
is a zero sink) and output_qk (qk_output 1: scores before softmax, 0 where hidden; 2: probabilities).

Attention's do_rotary (no caches) uses angles position / 10000^(2j / rotary_dim) on half-split features
(GPT-NeoX style, as onnxruntime's GPU kernel; its CPU kernel refuses do_rotary).

GroupQueryAttention's quantized KV cache (k/v_quant_type PER_TENSOR or PER_CHANNEL with k/v_scale):
the new keys/values are quantized into the cache (int8: round(x / scale) saturated; 4 bits: two
values per uint8, low nibble first, saturated to [-8, 7] and stored + 8; float8e4m3fn: x / scale),
and the attention reads the dequantized cache, as onnxruntime's CPU kernel does.

sliding_window_cache=1 follows the documented window-sized cache: with capacity C (past rows) and
W = local_window_size, a batch with T positions keeps L(T) = T (T <= C), else T - G * ceil((T - C) / G)
with G = C - W + 1, the newest first-to-last in rows [0, L(T)); the attention reads the resident past
rows and the new ones (attention_bias columns stay absolute positions); present rows past L(T) are 0.

Not supported (refused with a clear error, never silently wrong): output_qk together with
sliding_window_cache; MultiHeadAttention's cache_indirection (beam search) and the (3 * batch + 2)
mask layout.

float16 / bfloat16 compute in float32 and round each output once.
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from ... import blas
from ...errors import InvalidValueError
from ...registry import kernel
from .._common import UPCAST, broadcasts_to
from ..nn.attention import _softmax, rotary_embedding_23
from ..nn._common import text

MS = "com.microsoft"
F32 = np.dtype(np.float32)
_MAX, _SUM = np.maximum.reduce, np.add.reduce     # (x.max(), x.sum() without their Python layer)
_CAUSAL_FILL = -10000.0


def _ct(dt: np.dtype) -> np.dtype:
    return np.dtype(np.float64) if dt == np.float64 else F32


def _f(x, ct):
    return None if x is None else (x if x.dtype == ct else x.astype(ct))


def _float_input(x: np.ndarray, what: str) -> None:
    if x.dtype.kind != "f" and x.dtype not in UPCAST:
        raise InvalidValueError(f"{what} must be a float tensor, got {x.dtype}")


def _heads(x: np.ndarray, n: int, what: str) -> np.ndarray:
    """(batch, seq, n * size) -> the (batch, n, seq, size) view."""
    if x.ndim != 3:
        raise InvalidValueError(f"{what} must be 3-D (batch, sequence, hidden), got shape {list(x.shape)}")
    b, s, hidden = x.shape
    if hidden % n:
        raise InvalidValueError(f"{what} hidden size {hidden} is not a multiple of the {n} heads")
    return x.reshape(b, s, n, hidden // n).transpose(0, 2, 1, 3)


def _merge(y: np.ndarray) -> np.ndarray:
    """(batch, heads, seq, size) -> (batch, seq, heads * size)."""
    b, n, s, d = y.shape
    return y.transpose(0, 2, 1, 3).reshape(b, s, n * d)


def _scores(q: np.ndarray, k: np.ndarray, scale: float) -> np.ndarray:
    """Q K^T * scale as a fresh (batch, heads, seq, total) array; K may have fewer (kv) heads."""
    b, n, s, d = q.shape
    nk, t = k.shape[1], k.shape[2]
    if nk == 0 or n % nk or k.shape[0] != b or k.shape[3] != d:
        raise InvalidValueError(f"query {list(q.shape)} and key {list(k.shape)} (batch, heads, seq, head_size) do "
                                "not agree on batch, head size or head grouping")
    # a group's query heads as the rows of one product per kv head (b * nk BLAS calls, not one per
    # query head); the scaled queries written in that order at once (q is often a transposed view)
    qs = np.multiply(q, q.dtype.type(scale), out=np.empty(q.shape, q.dtype))
    return blas.matmul(qs.reshape(b, nk, n // nk * s, d), k.swapaxes(-1, -2)).reshape(b, n, s, t)


def _mix(probs: np.ndarray, v: np.ndarray) -> np.ndarray:
    """probabilities (batch, heads, seq, total) @ V (batch, kv_heads, total, v_size)."""
    b, n, s, t = probs.shape
    nk = v.shape[1]
    if v.shape[0] != b or v.shape[2] != t or n % nk:
        raise InvalidValueError(f"value {list(v.shape)} does not match the keys (batch {b}, {t} positions) or "
                                f"the head grouping ({n} query heads)")
    return blas.matmul(probs.reshape(b, nk, n // nk * s, t), v).reshape(b, n, s, v.shape[3])


def _check_bias(bias: np.ndarray, shape: tuple, what: str) -> None:
    if not (bias.ndim == 4 and broadcasts_to(bias.shape, shape)):
        raise InvalidValueError(f"{what} of shape {list(bias.shape)} must be (batch or 1, heads or 1, sequence, "
                                f"total_sequence) = {list(shape)}")


def _mask_bias(mask: np.ndarray, b: int, s: int, t: int, past: int, fill: float, ct, what: str) -> np.ndarray:
    """The additive bias (broadcastable to (batch, 1, seq, total)) of a mask_index / key_padding_mask."""
    fill = ct.type(fill)
    cols = np.arange(t)
    if mask.ndim == 1:
        n = mask.shape[0]
        if n == b:                                   # valid lengths (right padding)
            masked = cols >= mask.astype(np.int64)[:, None]
        elif n == 2 * b:                             # exclusive ends, then inclusive starts (left padding)
            m = mask.astype(np.int64)
            masked = (cols >= m[:b, None]) | (cols < m[b:, None])
        elif n == 3 * b + 2:
            raise InvalidValueError(f"{what} of shape [3 * batch + 2] (onnxruntime's GPU layout) is not supported")
        else:
            raise InvalidValueError(f"{what} 1-D must have batch ({b}) or 2 * batch ({2 * b}) values, got {n}")
        return np.where(masked, fill, ct.type(0)).reshape(b, 1, 1, t)
    if mask.ndim == 2:
        if mask.shape != (b, t):
            raise InvalidValueError(f"{what} 2-D must have shape (batch, total_sequence) = {[b, t]}, "
                                    f"got {list(mask.shape)}")
        raw = mask.reshape(b, 1, 1, t)
    elif mask.ndim == 3:
        if mask.shape != (b, s, t):
            raise InvalidValueError(f"{what} 3-D must have shape (batch, sequence, total_sequence) = {[b, s, t]}, "
                                    f"got {list(mask.shape)}")
        raw = mask.reshape(b, 1, s, t)
    elif mask.ndim == 4:
        if mask.shape[:2] != (b, 1) or mask.shape[2] < past + s or mask.shape[3] < t:
            raise InvalidValueError(f"{what} 4-D must have shape (batch, 1, max_sequence, max_sequence) with "
                                    f"max_sequence >= {max(past + s, t)}, got {list(mask.shape)}")
        raw = mask[:, :, past:past + s, :t]
    else:
        raise InvalidValueError(f"{what} must have rank 1 to 4, got shape {list(mask.shape)}")
    return np.where(raw == 0, fill, ct.type(0))


def _causal_bias(s: int, t: int, past: int, ct) -> np.ndarray:
    """-10000 where key j is after query i's position past + i, as (seq, total)."""
    return np.where(np.arange(t)[None, :] > np.arange(s)[:, None] + past, ct.type(_CAUSAL_FILL), ct.type(0))


def _add(acc, x):
    return x if acc is None else acc + x


def _masked_attention(q, k, v, ct, scale: float, mask, mask_what: str, n_past: int, fill: float, causal,
                      attention_bias, keep_scores: bool = False):
    """softmax(Q K^T * scale + mask bias + causal bias + attention_bias) V, merged to (batch, seq,
    heads * v_size); also the scores fed to softmax when keep_scores (else None)."""
    b, n, s, _ = q.shape
    t = k.shape[2]
    bias_sum = None
    if mask is not None:
        bias_sum = _mask_bias(mask, b, s, t, n_past, fill, ct, mask_what)
    if causal:
        bias_sum = _add(bias_sum, _causal_bias(s, t, n_past, ct))
    if attention_bias is not None:
        _check_bias(attention_bias, (b, n, s, t), "attention_bias")
        bias_sum = _add(bias_sum, _f(attention_bias, ct))
    scores = _scores(q, k, scale)
    if bias_sum is not None:
        scores += bias_sum
    kept = scores.copy() if keep_scores else None
    return _merge(_mix(_softmax(scores, None, ct), v)), kept


def _scale(scale, head_size: int) -> float:
    return 1.0 / math.sqrt(head_size) if scale is None else float(scale)


def _write_rows(buffer: np.ndarray, new: np.ndarray, start) -> np.ndarray:
    """A copy of buffer (batch, heads, rows, size) with new (batch, heads, n, size) written at rows
    [start_b, start_b + n) of each batch b (start: an int or one per batch)."""
    out = buffer.copy()
    b, _, n, _ = new.shape
    rows = np.asarray(start, dtype=np.int64).reshape(-1, 1) + np.arange(n)
    if rows.size and (rows.min() < 0 or rows.max() >= buffer.shape[2]):
        raise InvalidValueError(f"the cache of {buffer.shape[2]} rows has no room for {n} new positions "
                                f"from position {int(rows.min())}")
    out.transpose(0, 2, 1, 3)[np.arange(b)[:, None], np.broadcast_to(rows, (b, n))] = new.transpose(0, 2, 1, 3)
    return out


def _rotary(interleaved: int, rotary_dim: int):
    """The standard RotaryEmbedding-23 function for (batch, heads, seq, size) inputs and per-position
    caches (batch, seq, rotary_dim / 2). Made where rotary_dim is known (the factory, for a constant
    cos cache; else the call: the factory only checks its attributes), never kept in a cache shared
    by concurrent runs."""
    return rotary_embedding_23(interleaved=interleaved, rotary_embedding_dim=rotary_dim)


def _rotation_tables(cos: np.ndarray, sin: np.ndarray, interleaved: int):
    """(C, S, swap) with rotary(x) = x * C[pos] + x[..., swap] * S[pos] for a full-width rotation (rotary
    dim = head size): swap exchanges each rotated pair's halves, C repeats cos over both, S is -sin on
    the first and sin on the second. Each output is the same product pair as the standard rotation's
    (cos * x1 - sin * x2, sin * x1 + cos * x2), summed in another order: the same bits. Made once per
    model from constant caches: the rotation is then 3 elementwise steps on the token-major rows
    instead of RotaryEmbedding's dozen on (batch, heads, seq, size) views (a 14 + 2 head decode step of
    GroupQueryAttention: ~150 against ~185 us per call, measured under load)."""
    half = cos.shape[-1]
    if interleaved:
        c = np.repeat(cos, 2, axis=-1)
        s = np.stack([-sin, sin], axis=-1).reshape(sin.shape[0], 2 * half)
        swap = np.arange(2 * half).reshape(half, 2)[:, ::-1].reshape(-1)
    else:
        c = np.concatenate([cos, cos], axis=-1)
        s = np.concatenate([-sin, sin], axis=-1)
        swap = np.roll(np.arange(2 * half), half)
    for t in (c, s, swap):
        t.setflags(write=False)        # shared by every run
    return c, s, swap


def _rotated(rows: np.ndarray, c: np.ndarray, sn: np.ndarray, swap: np.ndarray, interleaved: int) -> np.ndarray:
    """rows (..., size) rotated by _rotation_tables' C and S rows (broadcast against them): rows * C +
    rows[..., swap] * S, a new array (the halves exchanged by slices where not interleaved: faster)."""
    d = rows.shape[-1]
    swapped = rows[..., swap] if interleaved else np.concatenate((rows[..., d // 2:], rows[..., :d // 2]), axis=-1)
    swapped *= sn
    out = np.multiply(rows, c)
    out += swapped
    return out


def _gather_cache(cache: np.ndarray, pos: np.ndarray, what: str, bounds=None) -> np.ndarray:
    """cache's rows at pos; bounds: (lowest, highest) position when the caller knows them."""
    if cache.ndim != 2:
        raise InvalidValueError(f"{what} must be 2-D (max_sequence, rotary_dim / 2), got {list(cache.shape)}")
    one = int(pos.reshape(-1)[0]) if pos.size == 1 else None
    if pos.size:
        lo, hi = (one, one) if one is not None else bounds if bounds is not None else (int(pos.min()), int(pos.max()))
        if lo < 0 or hi >= cache.shape[0]:
            raise InvalidValueError(f"positions up to {hi} exceed the {cache.shape[0]} rows of {what}")
    if one is not None:     # a decode step's one position: its row as a view (no fancy indexing, costly when cold)
        return cache[one:one + 1].reshape(pos.shape + cache.shape[1:])
    return cache[pos]


# -- Attention -------------------------------------------------------------------------------------

@kernel("Attention", since=1, domain=MS, multi_output=True, heavy=True)
def attention_1(*, num_heads, do_rotary=0, mask_filter_value=-10000.0, past_present_share_buffer=0,
                qkv_hidden_sizes=None, rotary_embedding_dim=0, scale=None, unidirectional=0, _n_outputs=1):
    """input (batch, seq, in_hidden) @ weights (in_hidden, H + H + Hv) + bias -> Q, K, V; past
    (2, batch, heads, past, head_size) is prepended to K and V and present returns them. With
    past_present_share_buffer, past/present are (2, batch, heads, max_sequence, head_size) buffers and
    past_sequence_length says how many rows of past are valid (the new rows are written after them).
    do_rotary rotates Q and K at their positions past + i with angles position / 10000^(2j / rotary_dim),
    the first half of the rotary features paired with the second (GPT-NeoX style, as onnxruntime's
    GPU kernel; its CPU kernel refuses do_rotary)."""
    if num_heads <= 0:
        raise ValueError(f"num_heads must be positive, got {num_heads}")
    sizes = None if not qkv_hidden_sizes else [int(v) for v in qkv_hidden_sizes]
    if sizes is not None and (len(sizes) != 3 or sizes[0] != sizes[1] or min(sizes) <= 0
                              or any(v % num_heads for v in sizes)):
        raise ValueError(f"qkv_hidden_sizes must be 3 positive multiples of num_heads ({num_heads}) with equal Q "
                         f"and K sizes, got {sizes}")
    fill = float(mask_filter_value)

    def run(input, weights, bias=None, mask_index=None, past=None, attention_bias=None, past_sequence_length=None):
        dt = input.dtype
        _float_input(input, "input")
        if weights.dtype != dt or (bias is not None and bias.dtype != dt):
            raise InvalidValueError(f"input ({dt}), weights ({weights.dtype}) and bias must have one type")
        if input.ndim != 3 or weights.ndim != 2 or weights.shape[0] != input.shape[2]:
            raise InvalidValueError(f"input must be (batch, seq, in_hidden) and weights (in_hidden, 3 * hidden), "
                                    f"got {list(input.shape)} and {list(weights.shape)}")
        total_w = weights.shape[1]
        hq, hk, hv = sizes if sizes is not None else (total_w // 3,) * 3
        if hq + hk + hv != total_w or (sizes is None and (total_w % 3 or hq % num_heads)):
            raise InvalidValueError(f"weights' {total_w} columns do not split into Q, K, V hidden sizes "
                                    f"{[hq, hk, hv]} for {num_heads} heads")
        if bias is not None and bias.shape != (total_w,):
            raise InvalidValueError(f"bias must have shape [{total_w}], got {list(bias.shape)}")
        ct = _ct(dt)
        qkv = blas.matmul(_f(input, ct), _f(weights, ct))
        if bias is not None:
            qkv += _f(bias, ct)
        b, s, _ = input.shape
        q = _heads(qkv[..., :hq], num_heads, "Q")
        k = _heads(qkv[..., hq:hq + hk], num_heads, "K")
        v = _heads(qkv[..., hq + hk:], num_heads, "V")
        head = hq // num_heads

        if past is not None:
            if past.dtype != dt or past.ndim != 5 or past.shape[:3] != (2, b, num_heads) or past.shape[4] != head \
                    or hk != hv:
                raise InvalidValueError(f"past must be (2, batch, num_heads, past_sequence, head_size) = "
                                        f"[2, {b}, {num_heads}, *, {head}] of the input's type with equal K and V "
                                        f"hidden sizes, got {list(past.shape)} ({past.dtype})")
        if past_present_share_buffer:
            if past is None or past_sequence_length is None or past_sequence_length.size != 1:
                raise InvalidValueError("past_present_share_buffer needs past and a one-element "
                                        "past_sequence_length")
            n_past = int(past_sequence_length.reshape(-1)[0])
        else:
            n_past = 0 if past is None else past.shape[3]

        if do_rotary:
            rd = rotary_embedding_dim or head
            pos = np.arange(n_past, n_past + s)
            angles = pos[:, None] * (10000.0 ** (-np.arange(0, rd, 2) / rd))[None, :]
            cos = np.broadcast_to(np.cos(angles).astype(ct), (b, s, rd // 2))
            sin = np.broadcast_to(np.sin(angles).astype(ct), (b, s, rd // 2))
            rot = _rotary(0, rd)
            q, k = rot(q, cos, sin), rot(k, cos, sin)

        present = None
        if past is not None:
            if past_present_share_buffer:
                kp = _write_rows(_f(past[0], ct), k, n_past)
                vp = _write_rows(_f(past[1], ct), v, n_past)
                present = np.stack([kp, vp])
                k, v = kp[:, :, :n_past + s], vp[:, :, :n_past + s]
            else:
                k = np.concatenate([_f(past[0], ct), k], axis=2)
                v = np.concatenate([_f(past[1], ct), v], axis=2)
        if present is None and _n_outputs > 1:
            present = np.stack([k, v])

        y, _ = _masked_attention(q, k, v, ct, _scale(scale, head), mask_index, "mask_index", n_past, fill,
                                 unidirectional, attention_bias)
        y = y.astype(dt, copy=False)                  # a fresh buffer of its own
        if _n_outputs == 1:
            return (y,)
        return (y, present.astype(dt, copy=False))       # np.stack: fresh as well
    return run


# -- MultiHeadAttention ----------------------------------------------------------------------------

@kernel("MultiHeadAttention", since=1, domain=MS, multi_output=True, heavy=True)
def multi_head_attention_1(*, num_heads, mask_filter_value=-10000.0, scale=None, unidirectional=0, _n_outputs=1):
    """query (batch, seq, hidden) with key/value (batch, kv_seq, hidden) (bias added to each), or packed
    QKV (batch, seq, heads, 3, size), packed KV (batch, kv_seq, heads, 2, size), or key/value already
    in (batch, heads, kv_seq, size) (bias added to the query only). past_key/past_value (batch, heads,
    past, size) are prepended (buffer sharing: past_sequence_length valid rows, new ones written after).
    Outputs: output, present_key, present_value, qk (the scores fed to softmax, masks included)."""
    if num_heads <= 0:
        raise ValueError(f"num_heads must be positive, got {num_heads}")
    fill = float(mask_filter_value)
    n = num_heads

    def split_bias(bias, hq, hk, ct):
        if bias is None:
            return None, None, None
        if bias.ndim != 1 or bias.shape[0] < hq + hk:
            raise InvalidValueError(f"bias must be 1-D (hidden + hidden + v_hidden), got {list(bias.shape)}")
        bf = _f(bias, ct)
        return bf[:hq], bf[hq:hq + hk], bf[hq + hk:]

    def run(query, key=None, value=None, bias=None, key_padding_mask=None, attention_bias=None, past_key=None,
            past_value=None, past_sequence_length=None, cache_indirection=None):
        dt = query.dtype
        _float_input(query, "query")
        for name, x in (("key", key), ("value", value), ("bias", bias), ("past_key", past_key),
                        ("past_value", past_value), ("attention_bias", attention_bias)):
            if x is not None and x.dtype != dt:
                raise InvalidValueError(f"{name} ({x.dtype}) must have the query's type ({dt})")
        if cache_indirection is not None:
            raise InvalidValueError("cache_indirection (beam-search KV cache) is not supported")
        ct = _ct(dt)
        kv_projected = True
        if query.ndim == 5:                                           # packed QKV
            if key is not None or value is not None or query.shape[2:4] != (n, 3):
                raise InvalidValueError(f"packed QKV must be (batch, seq, {n}, 3, head_size) with no key/value, "
                                        f"got {list(query.shape)}")
            qf = _f(query, ct).transpose(3, 0, 2, 1, 4)              # (3, batch, heads, seq, size)
            q, k, v = qf[0], qf[1], qf[2]
            head = query.shape[4]
            bq, bk, bv = split_bias(bias, n * head, n * head, ct)
            if bias is not None:
                q, k, v = (x + bb.reshape(n, 1, head) for x, bb in ((q, bq), (k, bk), (v, bv)))
        else:
            if query.ndim != 3 or key is None:
                raise InvalidValueError(f"query must be 3-D (batch, seq, hidden) with a key, or packed QKV "
                                        f"(batch, seq, heads, 3, head_size); got {list(query.shape)}")
            hq = query.shape[2]
            if key.ndim == 5:                                         # packed KV
                if value is not None or key.shape[2:4] != (n, 2) or key.shape[4] * n != hq:
                    raise InvalidValueError(f"packed KV must be (batch, kv_seq, {n}, 2, {hq // n}) with no value, "
                                            f"got {list(key.shape)}")
                kf = _f(key, ct).transpose(3, 0, 2, 1, 4)
                k, v = kf[0], kf[1]
                hk = hv = hq
            elif key.ndim == 4:                                       # (batch, heads, kv_seq, size)
                if value is None or value.ndim != 4 or key.shape[1] != n or value.shape[1] != n:
                    raise InvalidValueError(f"4-D key and value must be (batch, {n}, kv_seq, head_size), got "
                                            f"{list(key.shape)} and {None if value is None else list(value.shape)}")
                k, v = _f(key, ct), _f(value, ct)
                hk, hv = key.shape[3] * n, value.shape[3] * n
                kv_projected = False
            else:
                if value is None or value.ndim != 3:
                    raise InvalidValueError("3-D key needs a 3-D value (batch, kv_seq, v_hidden)")
                hk, hv = key.shape[2], value.shape[2]
                k, v = _heads(_f(key, ct), n, "key"), _heads(_f(value, ct), n, "value")
            q = _heads(_f(query, ct), n, "query")
            head = hq // n
            bq, bk, bv = split_bias(bias, hq, hk, ct)
            if bias is not None:
                if bias.shape[0] != hq + hk + hv:
                    raise InvalidValueError(f"bias must have shape [{hq + hk + hv}], got {list(bias.shape)}")
                q = q + bq.reshape(n, 1, head)
                if kv_projected:
                    k = k + bk.reshape(n, 1, hk // n)
                    v = v + bv.reshape(n, 1, hv // n)
        b, _, s, _ = q.shape

        n_past = 0
        if (past_key is None) != (past_value is None):
            raise InvalidValueError("past_key and past_value must be given together")
        if past_key is not None:
            if past_key.ndim != 4 or past_key.shape[:2] != (b, n) or past_value.shape[:2] != (b, n) \
                    or past_key.shape[3] != k.shape[3] or past_value.shape[3] != v.shape[3]:
                raise InvalidValueError(f"past_key {list(past_key.shape)} / past_value {list(past_value.shape)} must "
                                        f"be (batch, heads, past, head_size) matching key {list(k.shape)}")
            if past_sequence_length is not None:                      # buffer sharing
                n_past = int(past_sequence_length.reshape(-1)[0])
                new = k.shape[2]
                pk = _write_rows(_f(past_key, ct), k, n_past)
                pv = _write_rows(_f(past_value, ct), v, n_past)
                present = (pk, pv)
                k, v = pk[:, :, :n_past + new], pv[:, :, :n_past + new]
            else:
                n_past = past_key.shape[2]
                k = np.concatenate([_f(past_key, ct), k], axis=2)
                v = np.concatenate([_f(past_value, ct), v], axis=2)
                present = (k, v)
        else:
            present = (k, v)
        y, qk = _masked_attention(q, k, v, ct, _scale(scale, head), key_padding_mask, "key_padding_mask", n_past,
                                  fill, unidirectional, attention_bias, keep_scores=_n_outputs >= 4)
        y = y.astype(dt, copy=False)                  # a fresh buffer of its own
        outs = (y, present[0].astype(dt), present[1].astype(dt)) + ((qk.astype(dt),) if qk is not None else ())
        return outs[:_n_outputs]
    return run


# -- GroupQueryAttention ---------------------------------------------------------------------------

def _rms_heads(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """Per-head RMS normalisation over the head size, times w (head_size)."""
    ms = np.mean(x * x, axis=-1, keepdims=True)
    return x / np.sqrt(ms + x.dtype.type(eps)) * w


_QUANT_TYPES = ("NONE", "PER_TENSOR", "PER_CHANNEL")
F8 = np.dtype(ml_dtypes.float8_e4m3fn)


class _KvCache:
    """One of GroupQueryAttention's K / V caches: float (quant type NONE, the input's type), or quantized
    with a scale: int8 (8 bits: round(x / scale) saturated), uint8 with 4 bits (two values per byte, low
    nibble first, each round(x / scale) saturated to [-8, 7] and stored + 8), float8e4m3fn (x / scale)."""

    def __init__(self, quant_type, bits: int, what: str):
        self.quant = text(quant_type)
        if self.quant not in _QUANT_TYPES:
            raise ValueError(f"{what}_quant_type must be one of {', '.join(_QUANT_TYPES)}, got {self.quant!r}")
        if self.quant != "NONE" and bits not in (0, 4, 8):
            raise ValueError(f"kv_cache_bit_width must be 4 or 8, got {bits}")
        self.bits, self.what = bits or 8, what

    def dtype(self, past, dt):
        """The cache's element type: the past's, else the one kv_cache_bit_width implies."""
        if self.quant == "NONE":
            return dt
        if past is not None:
            return past.dtype
        return np.dtype(np.uint8) if self.bits == 4 else np.dtype(np.int8)

    def check(self, cache_dt, dt, scale, nk: int, head: int):
        what = self.what
        if self.quant == "NONE":
            if cache_dt != dt:
                raise InvalidValueError(f"past_{what} ({cache_dt}) must have the query's type ({dt}) when "
                                        f"{what}_quant_type is NONE")
            return
        if not (cache_dt == np.int8 and self.bits == 8 or cache_dt == np.uint8 and self.bits == 4 or cache_dt == F8):
            raise InvalidValueError(f"a {self.bits}-bit quantized {what} cache must be int8 (8 bits), uint8 (4 bits) "
                                    f"or float8e4m3fn, got {cache_dt}")
        if scale is None:
            raise InvalidValueError(f"{what}_scale is required with {what}_quant_type={self.quant}")
        want = (1,) if self.quant == "PER_TENSOR" else (1, nk, 1, head)
        if scale.size != int(np.prod(want)) or (self.quant == "PER_CHANNEL" and scale.shape != want):
            raise InvalidValueError(f"{what}_scale for {self.quant} must have shape {list(want)}, got "
                                    f"{list(scale.shape)}")

    def dequantize(self, cache, scale, ct):
        if self.quant == "NONE":
            return _f(cache, ct)
        sc = _f(scale, ct).reshape((1,) * 4 if scale.size == 1 else scale.shape)
        if cache.dtype == np.uint8:                       # 4 bits: two per byte, low nibble first
            nib = np.stack([cache & 15, cache >> 4], axis=-1).reshape(cache.shape[:-1] + (-1,))
            return (nib.astype(ct) - ct.type(8)) * sc
        return cache.astype(ct) * sc

    def quantize(self, x, scale, cache_dt):
        if self.quant == "NONE":
            return x.astype(cache_dt, copy=False)     # only read: copied into the present cache
        y = x / _f(scale, x.dtype).reshape((1,) * 4 if scale.size == 1 else scale.shape)
        if cache_dt == F8:
            return y.astype(F8)
        if cache_dt == np.uint8:
            if y.shape[-1] % 2:
                raise InvalidValueError(f"a 4-bit {self.what} cache needs an even head size, got {y.shape[-1]}")
            nib = (np.clip(np.rint(y), -8, 7) + 8).astype(np.uint8)
            return nib[..., 0::2] | (nib[..., 1::2] << 4)
        return np.clip(np.rint(y), -128, 127).astype(np.int8)


def _full_cache(past, new: np.ndarray, start, rows: int) -> np.ndarray:
    """GroupQueryAttention's present cache (batch, kv_heads, rows, size): past rows [0, start_b), the
    new rows at [start_b, start_b + n), zeros after; start: one int for the whole batch, or one per
    batch (start_b + n <= rows, start_b <= past's rows: checked by the caller)."""
    b, nk, n, d = new.shape
    if isinstance(start, int) and past is not None and start == past.shape[2] and rows == start + n:
        return np.concatenate((past, new), axis=2)   # the whole past, then the new rows: one call (a decode step)
    if isinstance(start, int):               # one start for the whole batch: slice copies
        out = np.empty((b, nk, rows, d), new.dtype)
        if start:
            out[:, :, :start] = past[:, :, :start]
        out[:, :, start:start + n] = new
        if start + n < rows:
            out[:, :, start + n:] = 0
        return out
    buf = np.zeros((b, nk, rows, d), new.dtype)
    if past is not None and past.shape[2]:
        n_buf = past.shape[2]
        keep = (np.arange(n_buf)[None, :] < start[:, None])[:, None, :, None]
        buf[:, :, :n_buf] = np.where(keep, past, np.zeros((), new.dtype))
    return _write_rows(buf, new, start)


def _resident(t: np.ndarray, capacity: int, window: int) -> np.ndarray:
    """How many of t positions a window-sized cache keeps (the documented L(T)): all up to its
    capacity, then evicting G = capacity - window + 1 positions at a time."""
    g = capacity - window + 1
    over = np.maximum(t - capacity, 0)
    return np.where(t <= capacity, t, t - g * (-(-over // g)))


def _window_cache(past_key, past_value, news, start, tot, s: int, window: int):
    """sliding_window_cache: past rows [0, L(start)) hold positions start - L(start) + i; the keys read
    are those rows then the s new ones; present keeps the L(tot) newest in rows [0, L(tot)) (zeros
    after). -> ((present_k, present_v), (keys_k, keys_v) in the stored types, absolute key positions
    (batch, keys) with -1 for padding)."""
    if past_key is None:
        raise InvalidValueError("sliding_window_cache needs past_key / past_value (their rows are the capacity)")
    capacity = past_key.shape[2]
    if capacity < window:
        raise InvalidValueError(f"the cache capacity {capacity} is smaller than local_window_size {window}")
    held = _resident(start, capacity, window)                        # resident past rows per batch
    m = int((held + s).max())
    c = np.arange(m)[None, :]
    # row c of the keys: past row c while c < held, else new row c - held (past and new concatenated)
    source = np.where(c < held[:, None], c, capacity + c - held[:, None])
    source = np.clip(source, 0, capacity + s - 1)
    key_pos = np.where(c < (held + s)[:, None], start[:, None] - held[:, None] + c, -1)
    keep = _resident(np.minimum(tot, start + s), capacity, window)   # rows present keeps
    first = (np.minimum(tot, start + s) - keep) - (start - held)     # key row of present's row 0
    rows = np.arange(capacity)[None, :]
    take = np.clip(first[:, None] + rows, 0, m - 1)
    keys, present = [], []
    for past, new in zip((past_key, past_value), news):
        full = np.concatenate([past, new], axis=2)
        kk = np.take_along_axis(full, source[:, None, :, None], axis=2)
        keys.append(kk)
        out = np.take_along_axis(kk, take[:, None, :, None], axis=2)
        out[np.broadcast_to((rows >= keep[:, None])[:, None, :, None], out.shape)] = 0
        present.append(out)
    return tuple(present), tuple(keys), key_pos


def _one_token_step(n: int, nk: int, scale, tables, interleaved: int):
    """GroupQueryAttention's decode step as its arithmetic: one float32 token of one sequence, past
    given, no position_ids, mask, bias, sink, norm, softcap, window or quantized cache (the factory and
    the caller see to those). Every key from 0 to the token's position p = seqlens_k is then visible
    (the general path's `plain` case): the Q and K rows rotated at p by the constant tables, the present
    caches made, then the scores of the n query heads as (kv heads, group, size) against the kv heads'
    keys in one batched product, softmax in place and the mix: the general path's steps on the same
    values in the same order (the same bits), in ~17 numpy calls instead of ~50: each costs several us
    after a MatMulNBits has swept the caches (a 14 + 2 head, 256-row decode step: ~300 -> ~200 us a
    call in decoder_int4, ~160 -> ~120 us called alone; medians of alternated blocks, under load). Returns
    None, before computing anything, when the inputs are not of this form or a value is out of range:
    the general path then runs and raises the error that names it."""
    g = n // nk
    width = None if tables is None else tables[0].shape[-1]

    def step(query, key, value, past_key, past_value, seqlens_k, total_sequence_length):
        qs = query.shape
        if query.dtype != F32 or len(qs) != 3 or qs[0] != 1 or qs[1] != 1 or past_key is None or past_value is None:
            return None
        pks = past_key.shape
        if len(pks) != 4 or pks[0] != 1 or pks[1] != nk or past_value.shape != pks or past_key.dtype != F32 \
                or past_value.dtype != F32 or not pks[3] or seqlens_k.size != 1 or total_sequence_length.size != 1:
            return None
        d, n_buf = pks[3], pks[2]
        if key is None:                                              # packed: the Q, K, V heads' rows
            if value is not None or qs[2] != (n + 2 * nk) * d:
                return None
            heads = query.reshape(n + 2 * nk, d)
            qk, v_new = heads[:n + nk], heads[n + nk:]
        else:
            if value is None or key.dtype != F32 or value.dtype != F32 or qs[2] != n * d \
                    or key.shape != (1, 1, nk * d) or value.shape != key.shape:
                return None
            qk, v_new = np.concatenate((query.reshape(n, d), key.reshape(nk, d))), value.reshape(nk, d)
        t = int(seqlens_k.reshape(-1)[0]) + 1                         # keys read; the token's position is t - 1
        if not 1 <= t <= int(total_sequence_length.reshape(-1)[0]) or t - 1 > n_buf:
            return None
        p = t - 1
        if tables is not None:                                        # x * C + swapped x * S (_rotation_tables)
            if width != d or p >= tables[0].shape[0]:
                return None
            qk = _rotated(qk, tables[0][p], tables[1][p], tables[2], interleaved)
        rows = max(n_buf, int(total_sequence_length.reshape(-1)[0]))
        present_k = _full_cache(past_key, qk[n:].reshape(1, nk, 1, d), p, rows)
        present_v = _full_cache(past_value, v_new.reshape(1, nk, 1, d), p, rows)
        q = np.multiply(qk[:n], F32.type(_scale(scale, d))).reshape(nk, g, d)
        scores = np.matmul(q, present_k[0, :, :t].swapaxes(1, 2))    # (kv heads, group, keys)
        scores -= _MAX(scores, axis=2, keepdims=True)
        np.exp(scores, out=scores)
        scores /= _SUM(scores, axis=2, keepdims=True)
        return np.matmul(scores, present_v[0, :, :t]).reshape(1, 1, n * d), present_k, present_v
    return step


@kernel("GroupQueryAttention", since=1, domain=MS, multi_output=True)
def group_query_attention_1(*, num_heads, kv_num_heads, causal=1, do_rotary=0, k_quant_type="NONE",
                            kv_cache_bit_width=0, local_window_size=-1, qk_norm_epsilon=1e-6, qk_output=0,
                            rotary_interleaved=0, scale=None, sliding_window_cache=0, smooth_softmax=-1,
                            softcap=0.0, v_quant_type="NONE", _n_outputs=1, _constants=None):
    if num_heads <= 0 or kv_num_heads <= 0 or num_heads % kv_num_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a positive multiple of kv_num_heads ({kv_num_heads})")
    k_cache, v_cache = _KvCache(k_quant_type, kv_cache_bit_width, "k"), _KvCache(v_quant_type, kv_cache_bit_width, "v")
    sliding = bool(sliding_window_cache)
    if sliding and local_window_size <= 0:
        raise ValueError(f"sliding_window_cache=1 needs local_window_size > 0, got {local_window_size}")
    if sliding and _n_outputs >= 4:
        raise ValueError("output_qk is not supported with sliding_window_cache=1")
    if causal not in (0, 1) or (not causal and local_window_size != -1):
        raise ValueError(f"causal must be 0 or 1 and local_window_size -1 when causal is 0, got causal={causal}, "
                         f"local_window_size={local_window_size}")
    if qk_output not in (0, 1, 2):
        raise ValueError(f"qk_output must be 0, 1 or 2, got {qk_output}")
    n, nk = num_heads, kv_num_heads
    cap = float(softcap or 0.0)
    smooth = smooth_softmax == 1
    # the rotation made once when the cos cache is a constant (its width is the rotary dim)
    cos_c = (_constants or {}).get(7)
    rot_c = _rotary(rotary_interleaved, 2 * cos_c.shape[-1]) if do_rotary and cos_c is not None and cos_c.ndim == 2 \
        else None
    sin_c = (_constants or {}).get(8)
    tables = _rotation_tables(cos_c, sin_c, rotary_interleaved) if rot_c is not None and sin_c is not None \
        and sin_c.shape == cos_c.shape else None
    # a decode step's fast path (_one_token_step), where the attributes allow it (with rotary: constant
    # float32 caches; a quantized cache's scales are unused when neither cache is quantized)
    step = _one_token_step(n, nk, scale, tables if do_rotary else None, rotary_interleaved) \
        if not sliding and local_window_size <= 0 and not cap and not smooth and _n_outputs <= 3 \
        and k_cache.quant == v_cache.quant == "NONE" \
        and (not do_rotary or tables is not None and tables[0].dtype == F32 and tables[1].dtype == F32) else None

    def run(query, key=None, value=None, past_key=None, past_value=None, seqlens_k=None, total_sequence_length=None,
            cos_cache=None, sin_cache=None, position_ids=None, attention_bias=None, head_sink=None, k_scale=None,
            v_scale=None, q_norm_weight=None, k_norm_weight=None):
        if step is not None and position_ids is None and attention_bias is None and head_sink is None \
                and q_norm_weight is None and k_norm_weight is None and seqlens_k is not None \
                and total_sequence_length is not None and (not do_rotary or cos_cache is cos_c and sin_cache is sin_c):
            outs = step(query, key, value, past_key, past_value, seqlens_k, total_sequence_length)
            if outs is not None:
                return outs[:_n_outputs]
        return general(query, key, value, past_key, past_value, seqlens_k, total_sequence_length, cos_cache,
                       sin_cache, position_ids, attention_bias, head_sink, k_scale, v_scale, q_norm_weight,
                       k_norm_weight)

    def general(query, key, value, past_key, past_value, seqlens_k, total_sequence_length, cos_cache, sin_cache,
                position_ids, attention_bias, head_sink, k_scale, v_scale, q_norm_weight, k_norm_weight):
        dt = query.dtype
        _float_input(query, "query")
        if seqlens_k is None or total_sequence_length is None:
            raise InvalidValueError("seqlens_k and total_sequence_length are required")
        for name, x in (("key", key), ("value", value)):
            if x is not None and x.dtype != dt:
                raise InvalidValueError(f"{name} ({x.dtype}) must have the query's type ({dt})")
        ct = _ct(dt)
        if query.ndim != 3:
            raise InvalidValueError(f"query must be 3-D (batch, seq, hidden), got {list(query.shape)}")
        b, s, width = query.shape
        if key is None:                                               # packed QKV
            if value is not None or width % (n + 2 * nk):
                raise InvalidValueError(f"packed QKV width {width} is not (num_heads + 2 * kv_num_heads) * head_size")
            head = width // (n + 2 * nk)
            qf = _f(query, ct)
            heads = qf.reshape(b, s, n + 2 * nk, head).transpose(0, 2, 1, 3)   # (_heads of each part, at once)
            q, k, v = heads[:, :n], heads[:, n:n + nk], heads[:, n + nk:]
        else:
            if value is None or key.ndim != 3 or value.ndim != 3 or key.shape[:2] != (b, s) \
                    or value.shape[:2] != (b, s):
                raise InvalidValueError(f"key and value must be (batch, seq, kv_hidden) with the query's batch and "
                                        f"sequence, got {list(key.shape)} and "
                                        f"{None if value is None else list(value.shape)}")
            q = _heads(_f(query, ct), n, "query")
            k, v = _heads(_f(key, ct), nk, "key"), _heads(_f(value, ct), nk, "value")
            head = q.shape[3]
        if k.shape[3] != head or v.shape[3] != head:
            raise InvalidValueError(f"query, key and value head sizes differ ({head}, {k.shape[3]}, {v.shape[3]})")
        if seqlens_k.reshape(-1).shape != (b,):
            raise InvalidValueError(f"seqlens_k must have shape [{b}] (batch), got {list(seqlens_k.shape)}")
        total = int(total_sequence_length.reshape(-1)[0]) if total_sequence_length.size == 1 else None
        if total is None:
            raise InvalidValueError("total_sequence_length must be a scalar")
        if (past_key is None) != (past_value is None):
            raise InvalidValueError("past_key and past_value must be given together")
        n_buf = 0 if past_key is None else past_key.shape[2]
        k_dt, v_dt = k_cache.dtype(past_key, dt), v_cache.dtype(past_value, dt)
        k_cache.check(k_dt, dt, k_scale, nk, head)
        v_cache.check(v_dt, dt, v_scale, nk, head)
        if past_key is not None:
            stored = [head // 2 if c == np.uint8 else head for c in (k_dt, v_dt)]
            if past_key.ndim != 4 or past_value.ndim != 4 or past_key.shape[:3] != (b, nk, n_buf) \
                    or past_value.shape[:3] != (b, nk, n_buf) or [past_key.shape[3], past_value.shape[3]] != stored:
                raise InvalidValueError(f"past_key / past_value must be (batch, kv_num_heads, past, head_size) = "
                                        f"[{b}, {nk}, *, {head}] (head_size / 2 bytes for a 4-bit cache), got "
                                        f"{list(past_key.shape)} / {list(past_value.shape)}")
        first_prompt = total == s                                     # (whatever the past buffer holds)
        # the batch's extremes once, as ints (a numpy reduction of a few values costs ~1.5 us)
        if b == 1:          # one sequence: its lengths as ints, then as arrays (~3 us fewer numpy steps)
            t_lo = t_hi = int(seqlens_k.reshape(-1)[0]) + 1
            p_lo = p_hi = 0 if first_prompt else t_hi - s
            tot_b, past_b = np.array([t_hi], np.int64), np.array([p_lo], np.int64)
            pos = np.arange(p_lo, p_lo + s, dtype=np.int64)[None, :]
        else:
            tot_b = seqlens_k.astype(np.int64).reshape(-1) + 1
            past_b = np.zeros(b, np.int64) if first_prompt else tot_b - s
            pos = past_b[:, None] + np.arange(s)                      # (batch, seq) positions of the new tokens
            p_lo, p_hi, t_lo, t_hi = (int(past_b.min()), int(past_b.max()), int(tot_b.min()), int(tot_b.max())) \
                if b else (0, 0, 0, 0)
        if t_hi > total or p_lo < 0 or (p_hi > n_buf and not sliding):
            raise InvalidValueError(f"seqlens_k {seqlens_k.reshape(-1).tolist()} do not fit sequence length {s}, past "
                                    f"length {n_buf} and total_sequence_length {total}")

        if (q_norm_weight is None) != (k_norm_weight is None):
            raise InvalidValueError("q_norm_weight and k_norm_weight must be given together")
        if q_norm_weight is not None:
            if q_norm_weight.shape != (head,) or k_norm_weight.shape != (head,):
                raise InvalidValueError(f"q_norm_weight / k_norm_weight must have shape [{head}]")
            q = _rms_heads(q, _f(q_norm_weight, ct), qk_norm_epsilon)
            k = _rms_heads(k, _f(k_norm_weight, ct), qk_norm_epsilon)
        if do_rotary:
            if cos_cache is None or sin_cache is None:
                raise InvalidValueError("do_rotary needs cos_cache and sin_cache")
            bounds = None
            if position_ids is None:
                p, bounds = pos, (p_lo, p_hi + s - 1)
            elif first_prompt:     # the documented quirk: a first prompt reads position_ids' first element only
                start = int(position_ids.reshape(-1)[0]) if position_ids.size else 0
                p = np.broadcast_to(start + np.arange(s), (b, s))
            else:
                p = position_ids.astype(np.int64)
            if p.shape != (b, s):
                p = np.broadcast_to(p, (b, s)) if p.size in (1, s) else None
            if p is None:
                raise InvalidValueError(f"position_ids must have shape [{b}, {s}], got {list(position_ids.shape)}")
            if key is None and q_norm_weight is None and tables is not None and cos_cache is cos_c \
                    and sin_cache is sin_c and tables[0].shape[-1] == head:
                # packed, constant caches, full width: x * C + swapped x * S on the (batch, seq, heads, size)
                # rows (Q's and K's heads adjacent: one rotation), viewed as (batch, heads, seq, size)
                c = _f(_gather_cache(tables[0], p, "cos_cache", bounds), ct)[:, :, None]
                sn = _f(_gather_cache(tables[1], p, "sin_cache", bounds), ct)[:, :, None]
                rows = qf[..., :(n + nk) * head].reshape(b, s, n + nk, head)
                qk = _rotated(rows, c, sn, tables[2], rotary_interleaved).transpose(0, 2, 1, 3)
                q, k = qk[:, :n], qk[:, n:]
            else:
                cos = _f(_gather_cache(cos_cache, p, "cos_cache", bounds), ct)   # the rows, then the compute type
                sin = _f(_gather_cache(sin_cache, p, "sin_cache", bounds), ct)
                rot = rot_c if cos_cache is cos_c else _rotary(rotary_interleaved, 2 * cos.shape[-1])
                if key is None and q_norm_weight is None:  # packed: Q's and K's heads are adjacent, one rotation
                    qk = rot(_heads(qf[..., :(n + nk) * head], n + nk, "query"), cos, sin)
                    q, k = qk[:, :n], qk[:, n:]
                else:
                    q, k = rot(q, cos, sin), rot(k, cos, sin)

        news = (k_cache.quantize(k, k_scale, k_dt), v_cache.quantize(v, v_scale, v_dt))
        if sliding:
            stored, key_rows, key_pos = _window_cache(past_key, past_value, news, past_b, tot_b, s,
                                                      local_window_size)
        else:                # the full cache: past rows [0, past_b), the new rows after them, zeros after those
            rows = max(n_buf, total)
            start = p_lo if p_lo == p_hi else past_b
            stored = [_full_cache(past, new_q, start, rows) for past, new_q in zip((past_key, past_value), news)]
            # rows from the longest batch's total on are hidden from every query: not read (unless
            # output_qk shows every row)
            used = rows if _n_outputs >= 4 or not b else min(rows, max(t_hi, 1))
            key_rows = stored if used == rows else [x[:, :, :used] for x in stored]
            key_pos = None                                            # (keys 0, 1, ..., used - 1: made if read)
        keys = k_cache.dequantize(key_rows[0], k_scale, ct)          # what the attention reads
        values = v_cache.dequantize(key_rows[1], v_scale, ct)

        # every key read is visible to every query (one length for the batch, every row read within it,
        # no window, and one new token or no causality: a decode step): no mask to make or apply
        plain = (not sliding and p_lo == p_hi and t_lo == t_hi == used and local_window_size <= 0
                 and (s == 1 or not causal))
        allowed = None
        if not plain:
            kp = (np.arange(used)[None, :] if key_pos is None else key_pos)[:, None, :]   # each key's position
            allowed = kp < tot_b[:, None, None]                       # (batch, seq, keys)
            if sliding:
                allowed = allowed & (kp >= 0)                         # (-1: padding)
            if causal:
                allowed = allowed & (kp <= pos[:, :, None])
            if local_window_size > 0:
                allowed = allowed & (kp > pos[:, :, None] - local_window_size)
        scores = _scores(q, keys, _scale(scale, head))
        if cap:
            c = ct.type(cap)
            np.divide(scores, c, out=scores)
            np.tanh(scores, out=scores)
            scores *= c
        if attention_bias is not None:                                # its columns are absolute key positions
            _check_bias(attention_bias, (b, n, s, attention_bias.shape[-1]), "attention_bias")
            if attention_bias.shape[-1] < total:
                raise InvalidValueError(f"attention_bias last dimension must be total_sequence_length ({total}), got "
                                        f"{list(attention_bias.shape)}")
            ab = _f(attention_bias, ct)
            if not sliding and scores.shape[-1] <= ab.shape[-1]:      # keys 0, 1, ...: the first columns
                ab = ab[..., :scores.shape[-1]]
            else:
                cols = np.clip(np.arange(used)[None, :] if key_pos is None else key_pos, 0,
                               ab.shape[-1] - 1)[:, None, None, :]
                ab = np.take_along_axis(np.broadcast_to(ab, (b,) + ab.shape[1:]), np.broadcast_to(
                    cols, (b, ab.shape[1], ab.shape[2], cols.shape[-1])), axis=-1)
            scores += ab
        hidden = None if allowed is None else ~allowed[:, None]       # (batch, 1, seq, rows)
        if hidden is not None:
            np.copyto(scores, ct.type(-np.inf), where=hidden)
        # qk_output=1: the scores before softmax, 0 at the keys a query cannot see (unspecified in onnxruntime)
        qk = None
        if qk_output == 1 and _n_outputs >= 4:
            qk = scores.copy() if hidden is None else np.where(hidden, ct.type(0), scores)
        if head_sink is not None or smooth:
            sink = np.zeros(n, ct) if head_sink is None else _f(head_sink, ct).reshape(-1)
            if sink.shape != (n,):
                raise InvalidValueError(f"head_sink must have shape [{n}], got {list(head_sink.shape)}")
            sink = sink.reshape(1, n, 1, 1)
            m = np.maximum(scores.max(axis=-1, keepdims=True), sink)
            scores -= m
            np.exp(scores, out=scores)
            scores /= scores.sum(axis=-1, keepdims=True) + np.exp(sink - m)
            probs = scores
        elif hidden is None and scores.size:      # no row can be all -inf: softmax's steps, in our buffer
            scores -= _MAX(scores, axis=3, keepdims=True)
            np.exp(scores, out=scores)
            scores /= _SUM(scores, axis=3, keepdims=True)
            probs = scores
        elif hidden is None:
            probs = scores
        else:
            probs = _softmax(scores, None, ct)
        if qk_output == 2 and _n_outputs >= 4:
            qk = probs.copy()
        y = _merge(_mix(probs, values)).astype(dt, copy=False)
        outs = (y, stored[0], stored[1])
        if _n_outputs >= 4:
            if qk is None:
                raise InvalidValueError("output_qk needs qk_output=1 (before softmax) or 2 (after softmax)")
            outs += (qk.astype(dt),)
        return outs[:_n_outputs]
    return run


# -- RotaryEmbedding -------------------------------------------------------------------------------

@kernel("RotaryEmbedding", since=1, domain=MS)
def rotary_embedding_ms_1(*, interleaved=0, is_packed_batching=0, num_heads=0, rotary_embedding_dim=0, scale=1.0):
    """The standard RotaryEmbedding's rotation; position_ids is (batch, seq), or one start position
    (shape [1]) for positions start + i. Without num_heads a 3-D input's head size is
    2 * cos_cache.shape[1]. `scale` and `is_packed_batching` do not change the result (as in
    onnxruntime's CPU kernel: the caches carry any scaling, and a packed batch is rotated as given)."""
    if num_heads < 0 or rotary_embedding_dim < 0:
        raise ValueError(f"num_heads ({num_heads}) and rotary_embedding_dim ({rotary_embedding_dim}) must be >= 0")
    if rotary_embedding_dim and not num_heads:
        raise ValueError("rotary_embedding_dim needs num_heads")
    fixed = rotary_embedding_23(interleaved=interleaved, num_heads=num_heads or None,
                                rotary_embedding_dim=rotary_embedding_dim)

    def run(input, position_ids, cos_cache, sin_cache):
        _float_input(input, "input")
        if input.ndim not in (3, 4):
            raise InvalidValueError(f"input must be 3-D or 4-D, got shape {list(input.shape)}")
        b, s = (input.shape[0], input.shape[1]) if input.ndim == 3 else (input.shape[0], input.shape[2])
        pid = position_ids.astype(np.int64)
        if pid.size == 1 and pid.ndim <= 1:
            pid = np.broadcast_to(pid.reshape(-1)[0] + np.arange(s), (b, s))
        elif pid.shape != (b, s):
            raise InvalidValueError(f"position_ids must have shape [1] or {[b, s]}, got {list(position_ids.shape)}")
        if input.dtype != cos_cache.dtype or input.dtype != sin_cache.dtype:
            raise InvalidValueError(f"input ({input.dtype}) and the caches ({cos_cache.dtype}, {sin_cache.dtype}) "
                                    "must have one type")
        fn = fixed
        if input.ndim == 3 and not num_heads:
            if cos_cache.ndim != 2 or cos_cache.shape[1] == 0 or input.shape[2] % (2 * cos_cache.shape[1]):
                raise InvalidValueError(f"hidden size {input.shape[2]} is not a multiple of the head size "
                                        f"2 * cos_cache.shape[1] (cos_cache {list(cos_cache.shape)})")
            # made per call (the factory only checks its attributes): nothing shared between runs
            fn = rotary_embedding_23(interleaved=interleaved, num_heads=input.shape[2] // (2 * cos_cache.shape[1]))
        return fn(input, cos_cache, sin_cache, pid)
    return run
