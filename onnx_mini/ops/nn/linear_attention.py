"""Recurrent LinearAttention (27) and CausalConvWithState (27), as in gated DeltaNet / Mamba blocks.

LinearAttention runs the spec's recurrence token by token (one step per position of the sequence,
vectorised over batch, heads and the state matrix), which is exactly "the recurrent update run
sequentially"; chunk_size is only a tuning hint of chunk-parallel implementations and changes nothing.
Query head h reads kv head h // (q_num_heads / kv_num_heads). float16 / bfloat16 are computed in
float32 and rounded once per output.
"""
from __future__ import annotations

import math

import numpy as np

from ...errors import InvalidValueError
from ...registry import kernel

UPDATE_RULES = ("linear", "gated", "delta", "gated_delta")


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else v


def _f32(x: np.ndarray) -> np.ndarray:
    return x if x.dtype == np.float32 else x.astype(np.float32)


@kernel("LinearAttention", since=27)
def linear_attention_27(*, q_num_heads, kv_num_heads, chunk_size=64, scale=0.0, update_rule="gated_delta"):
    rule = _text(update_rule)
    if rule not in UPDATE_RULES:
        raise ValueError(f"update_rule must be one of {', '.join(UPDATE_RULES)}, got {rule!r}")
    if q_num_heads <= 0 or kv_num_heads <= 0:
        raise ValueError(f"q_num_heads ({q_num_heads}) and kv_num_heads ({kv_num_heads}) must be positive")
    if q_num_heads % kv_num_heads:
        raise ValueError(f"q_num_heads ({q_num_heads}) must be a multiple of kv_num_heads ({kv_num_heads})")
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    gated = rule in ("gated", "gated_delta")
    delta = rule in ("delta", "gated_delta")
    hq, hkv = q_num_heads, kv_num_heads
    g = hq // hkv

    def run(query, key, value, past_state=None, decay=None, beta=None):
        for name, x in (("query", query), ("key", key), ("value", value)):
            if x.ndim != 3:
                raise InvalidValueError(f"{name} must be 3-D (batch, seq, heads * size), got {list(x.shape)}")
        b, t, qh = query.shape
        if key.shape[:2] != (b, t) or value.shape[:2] != (b, t):
            raise InvalidValueError(f"query {list(query.shape)}, key {list(key.shape)} and value "
                                    f"{list(value.shape)} must share batch and sequence length")
        if qh % hq or value.shape[2] % hkv:
            raise InvalidValueError(f"query width {qh} / value width {value.shape[2]} are not multiples of "
                                    f"q_num_heads {hq} / kv_num_heads {hkv}")
        dk, dv = qh // hq, value.shape[2] // hkv
        if key.shape[2] != hkv * dk:
            raise InvalidValueError(f"key width {key.shape[2]} must be kv_num_heads * d_k = {hkv * dk}")
        s_type = past_state.dtype if past_state is not None else query.dtype
        if past_state is None:
            state = np.zeros((b, hkv, dk, dv), np.float32)
        else:
            if past_state.shape != (b, hkv, dk, dv):
                raise InvalidValueError(f"past_state must have shape {[b, hkv, dk, dv]}, got {list(past_state.shape)}")
            state = past_state.astype(np.float32)        # a fresh copy, updated below
        if gated:
            if decay is None:
                raise InvalidValueError(f"update_rule {rule!r} needs the decay input")
            if decay.shape == (b, t, hkv * dk):
                gate = np.exp(_f32(decay).reshape(b, t, hkv, dk, 1))
            elif decay.shape == (b, t, hkv):
                gate = np.exp(_f32(decay).reshape(b, t, hkv, 1, 1))
            else:
                raise InvalidValueError(f"decay must have shape {[b, t, hkv * dk]} or {[b, t, hkv]}, "
                                        f"got {list(decay.shape)}")
        if delta:
            if beta is None:
                raise InvalidValueError(f"update_rule {rule!r} needs the beta input")
            if beta.shape not in ((b, t, hkv), (b, t, 1)):
                raise InvalidValueError(f"beta must have shape {[b, t, hkv]} or {[b, t, 1]}, got {list(beta.shape)}")
            rate = _f32(beta).reshape(b, t, beta.shape[2], 1)
        s = scale if scale else 1.0 / math.sqrt(dk)
        q = _f32(query).reshape(b, t, hkv, g, dk) * np.float32(s)
        k = _f32(key).reshape(b, t, hkv, dk)
        v = _f32(value).reshape(b, t, hkv, dv)
        out = np.empty((b, t, hkv, g, dv), np.float32)
        for i in range(t):       # state is our own buffer: updated in place
            if gated:
                state *= gate[:, i]
            ki, vi = k[:, i], v[:, i]
            if delta:       # S += beta k (v - S^T k), with the already decayed S for gated_delta
                pred = np.matmul(ki[:, :, None, :], state)[:, :, 0]
                vi = rate[:, i] * (vi - pred)
            state += ki[..., :, None] * vi[..., None, :]
            np.matmul(q[:, i], state, out=out[:, i])
        return out.reshape(b, t, hq * dv).astype(query.dtype, copy=False), state.astype(s_type, copy=False)
    return run


@kernel("CausalConvWithState", since=27)
def causal_conv_with_state_27(*, activation="none"):
    act = _text(activation)
    if act not in ("none", "silu", "swish"):
        raise ValueError(f"activation must be 'silu', 'swish' or 'none', got {act!r}")
    silu = act != "none"

    def run(input, weight, bias=None, past_state=None):
        if input.ndim != 3:
            raise InvalidValueError(f"input must be 3-D (batch, channels, length), got {list(input.shape)}")
        b, c, n = input.shape
        if weight.ndim != 3 or weight.shape[:2] != (c, 1) or weight.shape[2] < 1:
            raise InvalidValueError(f"weight must have shape [{c}, 1, k] with k >= 1, got {list(weight.shape)}")
        k = weight.shape[2]
        if bias is not None and bias.shape != (c,):
            raise InvalidValueError(f"bias must have shape [{c}], got {list(bias.shape)}")
        x = _f32(input)
        if past_state is None:
            state = np.zeros((b, c, k - 1), np.float32)
        elif past_state.shape != (b, c, k - 1):
            raise InvalidValueError(f"past_state must have shape {[b, c, k - 1]}, got {list(past_state.shape)}")
        else:
            state = _f32(past_state)
        padded = np.concatenate([state, x], axis=2)          # (b, c, k - 1 + n)
        w = _f32(weight)[:, 0]                               # (c, k)
        y = padded[:, :, 0:n] * w[:, 0:1]
        for j in range(1, k):                                # one multiply-add per tap
            y += padded[:, :, j:j + n] * w[:, j:j + 1]
        if bias is not None:
            y += _f32(bias)[:, None]
        if silu:
            with np.errstate(over="ignore"):
                y = y / (1 + np.exp(-y))
        present = padded[:, :, padded.shape[2] - (k - 1):]
        dt = input.dtype
        return y.astype(dt, copy=False), present.astype(dt)
    return run
