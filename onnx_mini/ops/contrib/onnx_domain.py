"""The two contrib schemas onnxruntime registers in the ai.onnx domain although onnx does not define
them there (onnxruntime's transformer optimizer writes both into opset 12-16 models):

- SimplifiedLayerNormalization (version 1, any ai.onnx opset): RMS normalisation over the axes from
  `axis`, y = x / sqrt(mean(x^2) + epsilon) * scale; optional second output inv_std_var (stash type).
- LayerNormalization for ai.onnx opsets below 17 (version 1): the semantics of LayerNormalization-17,
  whose kernel it reuses.

The registry resolves an ai.onnx node that onnx has no schema for at the model's opset to the newest
kernel registered for a version not above it, so these are reached only where onnx has nothing.
"""
from __future__ import annotations

import math

import numpy as np

from ...registry import kernel
from .._common import normalize_axis
from ..nn.normalization import layer_normalization_17
from .layer_norm import rms_inverse

_STASH = {1: np.dtype(np.float32), 11: np.dtype(np.float64)}


def _stash_dtype(stash_type: int) -> np.dtype:
    if stash_type not in _STASH:
        raise ValueError(f"stash_type must be 1 (float) or 11 (double), got {stash_type}")
    return _STASH[stash_type]


@kernel("LayerNormalization", since=1, multi_output=True, rank="first")
def layer_normalization_contrib_1(*, axis=-1, epsilon=1e-5, stash_type=1, _n_outputs=1):
    _stash_dtype(stash_type)
    return layer_normalization_17(axis=axis, epsilon=epsilon, stash_type=stash_type, _n_outputs=_n_outputs)


@kernel("SimplifiedLayerNormalization", since=1, multi_output=True)
def simplified_layer_normalization_1(*, axis=-1, epsilon=1e-5, stash_type=1, _n_outputs=1):
    stash = _stash_dtype(stash_type)

    def run(x, scale):
        ax = normalize_axis(axis, x.ndim)
        cd = np.dtype(np.float64) if np.float64 in (x.dtype, scale.dtype, stash) else np.dtype(np.float32)
        xf = x.astype(cd, copy=False)
        axes = tuple(range(ax, x.ndim))
        inv = rms_inverse(xf * xf, axes, max(math.prod(x.shape[ax:]), 1), epsilon)   # (empty: 1 / sqrt(eps))
        y = np.asarray(xf * inv * scale.astype(cd, copy=False)).astype(scale.dtype, copy=False)
        return (y, inv.astype(stash, copy=False))[:_n_outputs]

    return run
