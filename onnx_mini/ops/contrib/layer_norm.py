"""com.microsoft layer normalizations (version 1 each), as onnxruntime's transformer optimizer writes
them: SkipLayerNormalization, SkipSimplifiedLayerNormalization, EmbedLayerNormalization."""
from __future__ import annotations

import math

import numpy as np

from ...errors import InvalidValueError
from ...registry import kernel
from .._common import round_f32
from ..nn.normalization import _last_axis_moments, _moments
from .transformer import F32, MS, _ct, _f, _float_input

F64 = np.dtype(np.float64)


# -- Skip / Embed layer normalizations -----------------------------------------------------------

def _skip_sum(x, skip, bias, ct):
    """x + skip (+ bias) in the compute type; skip is x's shape, (1, seq, hidden) or (seq, hidden)."""
    fits = skip.shape == x.shape or (skip.ndim == x.ndim == 3 and skip.shape == (1,) + x.shape[1:]) or (
        skip.ndim == 2 and x.ndim == 3 and skip.shape == x.shape[1:])
    if x.ndim not in (2, 3) or not fits:
        raise InvalidValueError(f"skip of shape {list(skip.shape)} does not fit input {list(x.shape)} (same shape, "
                                "(1, seq, hidden) or (seq, hidden))")
    s = _f(x, ct) + _f(skip, ct)
    if bias is not None:
        s += _f(bias, ct)
    return s


def _hidden_moments(s: np.ndarray):
    """_moments over the last (hidden) axis: normalization's row-sum and dot-product path when there
    is anything to sum (float32 [1, 128, 256]: ~20 us fewer)."""
    return _last_axis_moments(s) if s.size else _moments(s, (s.ndim - 1,))


def rms_inverse(sq: np.ndarray, axes, count: int, eps: float) -> np.ndarray:
    """1 / sqrt(mean(x^2) + eps) over axes (kept) from sq = x * x: np.add.reduce / count is np.mean's own
    arithmetic without its Python layer (~4 us less). (The steps after it on fresh arrays: with out= a
    tiny array's ufunc call is slower, ~2.9 against ~1.6 us here.) One row (a decode step's token):
    those four steps on its one value as Python floats, each rounded to the type once (round_f32: the
    same bits), written back into the sum's array: ~1.5 against ~8 us (measured under load)."""
    total = np.add.reduce(sq, axis=axes, keepdims=True)
    dt = sq.dtype
    if total.size == 1 and (dt == F32 or dt == F64):
        r = _identity if dt == F64 else round_f32
        d = r(r(total.item() / r(float(count))) + r(eps))
        if 0.0 < d < math.inf:                   # (else numpy's steps: 1 / 0, NaN, a negative epsilon)
            total[...] = r(1.0 / r(math.sqrt(d)))
            return total
    return 1 / np.sqrt(total / count + dt.type(eps))


def _identity(v: float) -> float:
    return v


def _vector(p, hidden: int, what: str) -> None:
    if p is not None and p.shape != (hidden,):
        raise InvalidValueError(f"{what} must have shape [{hidden}] (hidden size), got {list(p.shape)}")


def _same_types(dt, **named):
    for name, x in named.items():
        if x is not None and x.dtype != dt:
            raise InvalidValueError(f"{name} ({x.dtype}) must have the input's type ({dt})")


@kernel("SkipLayerNormalization", since=1, domain=MS, multi_output=True)
def skip_layer_normalization_1(*, epsilon=1e-12, _n_outputs=1):
    """s = input + skip + bias; output = (s - mean) / sqrt(var + epsilon) * gamma + beta over the hidden
    axis; also mean and inv_std_var (float, shape (..., 1)) and s."""
    eps = float(epsilon)

    def run(input, skip, gamma, beta=None, bias=None):
        dt = input.dtype
        _float_input(input, "input")
        _same_types(dt, skip=skip, gamma=gamma, beta=beta, bias=bias)
        hidden = input.shape[-1]
        for name, p in (("gamma", gamma), ("beta", beta), ("bias", bias)):
            _vector(p, hidden, name)
        ct = _ct(dt)
        s = _skip_sum(input, skip, bias, ct)
        mean, d, var = _hidden_moments(s)
        inv = 1 / np.sqrt(var + ct.type(eps))
        y = d                                  # d is _moments' own buffer: scaled and shifted in place
        y *= inv
        y *= _f(gamma, ct)
        if beta is not None:
            y += _f(beta, ct)
        return _outputs(_n_outputs, y, dt, lambda: mean, inv, s)
    return run


def _outputs(n_outputs: int, y, dt, mean, inv, s) -> tuple:
    """(output, mean, inv_std_var, input_skip_bias_sum)[:n_outputs], each made only when asked for
    (mean: a function); y and s are fresh buffers, so they are cast without a copy when of type dt."""
    outs = (y.astype(dt, copy=False),)
    if n_outputs > 1:
        outs += (mean().astype(F32, copy=False),)
    if n_outputs > 2:
        outs += (inv.astype(F32, copy=False),)
    if n_outputs > 3:
        outs += (s.astype(dt, copy=False),)
    return outs


@kernel("SkipSimplifiedLayerNormalization", since=1, domain=MS, multi_output=True)
def skip_simplified_layer_normalization_1(*, epsilon=1e-12, _n_outputs=1):
    """s = input + skip + bias; output = s / sqrt(mean(s^2) + epsilon) * gamma; mean (zeros, as
    onnxruntime), inv_std_var = 1 / sqrt(mean(s^2) + epsilon) (float, shape (..., 1)) and s."""
    eps = float(epsilon)

    def run(input, skip, gamma, bias=None):
        dt = input.dtype
        _float_input(input, "input")
        _same_types(dt, skip=skip, gamma=gamma, bias=bias)
        hidden = input.shape[-1]
        _vector(gamma, hidden, "gamma")
        _vector(bias, hidden, "bias")
        ct = _ct(dt)
        s = _skip_sum(input, skip, bias, ct)
        sq = s * s
        inv = rms_inverse(sq, -1, max(s.shape[-1], 1), eps)
        y = np.multiply(s, inv, out=sq)
        y *= _f(gamma, ct)
        return _outputs(_n_outputs, y, dt, lambda: np.zeros(inv.shape, F32), inv, s)
    return run


def _lookup(table: np.ndarray, ids: np.ndarray, what: str) -> np.ndarray:
    if table.ndim != 2:
        raise InvalidValueError(f"{what} must be 2-D (rows, hidden), got shape {list(table.shape)}")
    if ids.size and (ids.min() < 0 or ids.max() >= table.shape[0]):
        raise InvalidValueError(f"{what} ids must be in [0, {table.shape[0] - 1}], got values in "
                                f"[{int(ids.min())}, {int(ids.max())}]")
    return table[ids]


@kernel("EmbedLayerNormalization", since=1, domain=MS, multi_output=True)
def embed_layer_normalization_1(*, epsilon=1e-12, mask_index_type=1, _n_outputs=1):
    """embedding_sum = word_embedding[input_ids] + position_embedding[position_ids (default 0..seq-1)]
    + segment_embedding[segment_ids]; output = LayerNorm(embedding_sum) * gamma + beta; mask_index
    (int32, per batch) = the number of non-zero mask values (0 without a mask)."""
    eps = float(epsilon)

    def run(input_ids, segment_ids, word_embedding, position_embedding, segment_embedding, gamma, beta, mask=None,
            position_ids=None):
        dt = word_embedding.dtype
        _float_input(word_embedding, "word_embedding")
        _same_types(dt, position_embedding=position_embedding, segment_embedding=segment_embedding, gamma=gamma,
                    beta=beta)
        if input_ids.ndim != 2:
            raise InvalidValueError(f"input_ids must be 2-D (batch, seq), got shape {list(input_ids.shape)}")
        b, s = input_ids.shape
        hidden = word_embedding.shape[-1]
        for name, x in (("segment_ids", segment_ids), ("mask", mask)):
            if x is not None and x.shape != (b, s):
                raise InvalidValueError(f"{name} must have input_ids' shape {[b, s]}, got {list(x.shape)}")
        if (segment_ids is None) != (segment_embedding is None):
            raise InvalidValueError("segment_ids and segment_embedding must be given together")
        for name, t in (("position_embedding", position_embedding), ("segment_embedding", segment_embedding)):
            if t is not None and (t.ndim != 2 or t.shape[1] != hidden):
                raise InvalidValueError(f"{name} must be 2-D (rows, {hidden}), got shape {list(t.shape)}")
        _vector(gamma, hidden, "gamma")
        _vector(beta, hidden, "beta")
        if position_ids is None:
            pos = np.arange(s)[None, :]
        elif position_ids.shape in ((b, s), (1, s)):
            pos = position_ids
        else:
            raise InvalidValueError(f"position_ids must have shape {[b, s]} or {[1, s]}, got "
                                    f"{list(position_ids.shape)}")
        ct = _ct(dt)
        e = _f(_lookup(word_embedding, input_ids, "word_embedding"), ct)
        e = e + _f(_lookup(position_embedding, pos, "position_embedding"), ct)
        if segment_ids is not None:
            e += _f(_lookup(segment_embedding, segment_ids, "segment_embedding"), ct)
        _, d, var = _hidden_moments(e)
        y = d / np.sqrt(var + ct.type(eps)) * _f(gamma, ct) + _f(beta, ct)
        mask_index = (np.count_nonzero(mask, axis=1) if mask is not None else np.zeros(b)).astype(np.int32)
        outs = (y.astype(dt), mask_index, e.astype(dt))
        return outs[:_n_outputs]
    return run
