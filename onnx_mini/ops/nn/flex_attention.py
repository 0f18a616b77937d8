"""FlexAttention (ai.onnx.preview, version 1): scaled dot-product attention over rank-4 inputs with
optional score_mod / prob_mod subgraphs.

    scores = (Q @ K^T) * scale                 (scale defaults to 1 / sqrt(head_size))
    scores = score_mod(scores)                 (B, Hq, L, S) in softmax_precision, whole tensor at once
    probs  = Softmax(scores, axis=-1)
    probs  = prob_mod(probs)
    Y      = probs @ V

Q @ K^T is computed in float32 (float64 for double inputs) and cast to softmax_precision (default:
float32, or double for double inputs), in which the modifiers and the softmax run; probs @ V runs in
the same compute type and Y is rounded once to the input type. Grouped-query attention never copies
K/V: Q is viewed as (B, Hkv, group, L, E) against K/V of shape (B, Hkv, 1, S, E), so query head h
reads kv head h // group. A query row whose scores are all -inf gives NaN, as Softmax defines it.
The modifier subgraphs arrive as SubPlans; the values they capture from the outer scope follow
Q, K, V among the step's inputs.
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from ...errors import InvalidValueError
from ...registry import kernel
from ..math.softmax import softmax

_PRECISIONS = {1: np.dtype(np.float32), 10: np.dtype(np.float16), 11: np.dtype(np.float64),
               16: np.dtype(ml_dtypes.bfloat16)}


def _check_modifier(sub, what: str) -> None:
    if sub is not None and (len(sub.input_names) != 1 or len(sub.output_names) != 1):
        raise ValueError(f"{what} must have exactly one input and one output, it has "
                         f"{len(sub.input_names)} and {len(sub.output_names)}")


def _apply(sub, x: np.ndarray, captured, what: str) -> np.ndarray:
    (out,) = sub.run([x], captured)
    if not isinstance(out, np.ndarray) or out.shape != x.shape or out.dtype != x.dtype:
        got = f"{out.dtype}{list(out.shape)}" if isinstance(out, np.ndarray) else type(out).__name__
        raise InvalidValueError(f"{what} must return a tensor of the input's shape and type "
                                f"({x.dtype}{list(x.shape)}), got {got}")
    return out


@kernel("FlexAttention", since=1, domain="ai.onnx.preview")
def flex_attention_1(*, scale=None, softmax_precision=None, score_mod=None, prob_mod=None):
    if softmax_precision is not None and softmax_precision not in _PRECISIONS:
        raise ValueError(f"softmax_precision must be one of 1 (float), 10 (float16), 11 (double), "
                         f"16 (bfloat16), got {softmax_precision}")
    _check_modifier(score_mod, "score_mod")
    _check_modifier(prob_mod, "prob_mod")
    fixed_precision = None if softmax_precision is None else _PRECISIONS[softmax_precision]

    def run(Q, K, V, *captured):
        if not Q.ndim == K.ndim == V.ndim == 4:
            raise InvalidValueError(f"Q, K and V must be rank 4, got shapes {list(Q.shape)}, {list(K.shape)}, "
                                    f"{list(V.shape)}")
        if not Q.dtype == K.dtype == V.dtype:
            raise InvalidValueError(f"Q, K and V must have one type, got {Q.dtype}, {K.dtype}, {V.dtype}")
        b, hq, l, e = Q.shape
        if K.shape[0] != b or V.shape[0] != b or K.shape[3] != e or K.shape[:3] != V.shape[:3]:
            raise InvalidValueError(f"shapes do not fit: Q {list(Q.shape)} (B, Hq, L, E), K {list(K.shape)} "
                                    f"(B, Hkv, S, E), V {list(V.shape)} (B, Hkv, S, Ev)")
        hkv, s, ev = K.shape[1], K.shape[2], V.shape[3]
        if hkv == 0 or hq % hkv:
            raise InvalidValueError(f"q_num_heads ({hq}) must be a multiple of kv_num_heads ({hkv})")
        group = hq // hkv
        ct = np.dtype(np.float64) if Q.dtype == np.float64 else np.dtype(np.float32)
        sp = fixed_precision or ct
        q = Q.astype(ct, copy=False).reshape(b, hkv, group, l, e)
        k = K.astype(ct, copy=False).reshape(b, hkv, 1, s, e)
        v = V.astype(ct, copy=False).reshape(b, hkv, 1, s, ev)
        factor = scale if scale is not None else (1.0 / math.sqrt(e) if e else 1.0)
        scores = np.matmul(q, np.swapaxes(k, -1, -2))
        scores *= ct.type(factor)
        scores = scores.reshape(b, hq, l, s).astype(sp, copy=False)
        if score_mod is not None:
            scores = _apply(score_mod, scores, captured, "score_mod")
        with np.errstate(invalid="ignore"):   # a fully masked row is NaN, as Softmax defines it
            if sp in (np.float32, np.float64):
                probs = softmax(scores, 3)
            else:  # float16 / bfloat16 precision: computed in float32, rounded back once
                probs = softmax(scores.astype(np.float32), 3).astype(sp)
        if prob_mod is not None:
            probs = _apply(prob_mod, probs, captured, "prob_mod")
        y = np.matmul(probs.astype(ct, copy=False).reshape(b, hkv, group, l, s), v)
        return y.reshape(b, hq, l, ev).astype(Q.dtype, copy=False)
    return run
