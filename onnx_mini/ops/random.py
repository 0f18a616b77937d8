"""Random generators (every version): RandomNormal, RandomNormalLike, RandomUniform, RandomUniformLike,
Multinomial, Bernoulli.

Seeds. With a `seed` attribute, every run of the node starts a fresh numpy Generator (PCG64) keyed
by the seed's float64 bits, so the node returns the same values on every run and in every separately
prepared copy of the model (seeds 1.0 and 1.5 differ). Without one, the node owns a Generator
seeded from the OS at prepare time and each run draws new values. The ONNX spec calls these ops
non-deterministic across implementations, so values never match another runtime's seeded draws
(the official Bernoulli data come from numpy's global RandomState, not from the seed attribute).
None of these ops is constant-folded (their kernels are registered with foldable=False).

Draws are made in float64 (float32 for normal draws of float32 and narrower types) and rounded once
to the output type; bfloat16/float16 outputs go through float32.
"""
from __future__ import annotations

import numpy as np

from ..errors import InvalidValueError
from ..registry import kernel
from ._common import allowed_dtypes, check_shape, dtype_attribute, upcast


def _rng_source(seed):
    """A callable returning the Generator of one run (see the module doc for the seed rule)."""
    if seed is None:
        rng = np.random.default_rng()
        return lambda: rng
    key = int(np.array(float(seed), dtype=np.float64).view(np.uint64))
    return lambda: np.random.Generator(np.random.PCG64(key))


def _shape_attribute(shape) -> tuple[int, ...]:
    dims = tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise ValueError(f"shape {list(dims)} has a negative dimension")
    return dims


def _like_dtype(op: str, version: int, dtype):
    """The output dtype of a *Like op: the attribute's (checked now), or None (the input's, checked at run)."""
    return None if dtype is None else dtype_attribute(dtype, op, version, "T2", "dtype")


def _input_dtype(x: np.ndarray, op: str, version: int, param: str) -> np.dtype:
    if x.dtype not in allowed_dtypes(op, version, param):
        raise InvalidValueError(f"the output type is the input's ({x.dtype}) when dtype is not given, "
                                f"and {op}-{version} cannot produce it: set the dtype attribute")
    return x.dtype


def _normal(rng, shape, mean: float, scale: float, dtype: np.dtype) -> np.ndarray:
    work = np.float64 if dtype == np.float64 else np.float32
    z = rng.standard_normal(shape, dtype=work)
    if scale != 1.0:
        z *= work(scale)
    if mean != 0.0:
        z += work(mean)
    return z.astype(dtype, copy=False)


def _uniform(rng, shape, low: float, high: float, dtype: np.dtype) -> np.ndarray:
    u = rng.random(shape)                                   # float64 in [0, 1)
    if (low, high) != (0.0, 1.0):
        u *= high - low
        u += low
    return u.astype(dtype, copy=False)


# -- RandomNormal / RandomUniform ------------------------------------------------------------------

def _generator_factory(op: str, version: int, draw, shape, dtype, seed, a: float, b: float):
    dims = check_shape(_shape_attribute(shape), np.float64)
    dt = dtype_attribute(dtype, op, version, "T", "dtype")
    rng = _rng_source(seed)
    return lambda: draw(rng(), dims, a, b, dt)


@kernel("RandomNormal", since=(1, 22), foldable=False)
def random_normal_1(*, shape, dtype=1, mean=0.0, scale=1.0, seed=None, _version):
    return _generator_factory("RandomNormal", _version, _normal, shape, dtype, seed, mean, scale)


@kernel("RandomUniform", since=(1, 22), foldable=False)
def random_uniform_1(*, shape, dtype=1, low=0.0, high=1.0, seed=None, _version):
    return _generator_factory("RandomUniform", _version, _uniform, shape, dtype, seed, low, high)


def _like_factory(op: str, version: int, draw, dtype, seed, a: float, b: float):
    dt = _like_dtype(op, version, dtype)
    rng = _rng_source(seed)

    def run(x):
        return draw(rng(), x.shape, a, b, dt if dt is not None else _input_dtype(x, op, version, "T2"))
    return run


@kernel("RandomNormalLike", since=(1, 22), foldable=False)
def random_normal_like_1(*, dtype=None, mean=0.0, scale=1.0, seed=None, _version):
    return _like_factory("RandomNormalLike", _version, _normal, dtype, seed, mean, scale)


@kernel("RandomUniformLike", since=(1, 22), foldable=False)
def random_uniform_like_1(*, dtype=None, low=0.0, high=1.0, seed=None, _version):
    return _like_factory("RandomUniformLike", _version, _uniform, dtype, seed, low, high)


# -- Multinomial -----------------------------------------------------------------------------------

def _multinomial(rng, logits: np.ndarray, sample_size: int, dtype: np.dtype) -> np.ndarray:
    if logits.ndim != 2:
        raise InvalidValueError(f"input must be 2-D [batch_size, class_size], got shape {list(logits.shape)}")
    batch, classes = logits.shape
    if classes == 0 and batch and sample_size:
        raise InvalidValueError("input has no classes to sample from")
    lp = upcast(logits).astype(np.float64)
    top = lp.max(axis=1, keepdims=True) if classes else lp
    if np.isnan(lp).any() or (classes and (top == -np.inf).any()) or np.isposinf(lp).any():
        raise InvalidValueError("each row of log-probabilities needs a finite maximum and no NaN")
    cdf = np.cumsum(np.exp(lp - top), axis=1)
    cdf /= cdf[:, -1:] if classes else 1.0
    # One sorted search over all rows: row r's cdf is shifted to [r, r + 1].
    rows = np.arange(batch, dtype=np.float64)[:, None]
    u = rng.random((batch, sample_size))
    flat = (cdf + rows).ravel()
    idx = np.searchsorted(flat, (u + rows).ravel(), side="right").reshape(batch, sample_size)
    idx -= np.arange(batch)[:, None] * classes
    return np.minimum(idx, max(classes - 1, 0)).astype(dtype)


def _multinomial_factory(version: int, dtype, sample_size, seed):
    dt = dtype_attribute(dtype, "Multinomial", version, "T2", "dtype")
    if sample_size < 0:
        raise ValueError(f"sample_size must be >= 0, got {sample_size}")
    rng = _rng_source(seed)
    n = int(sample_size)
    return lambda x: _multinomial(rng(), x, n, dt)


@kernel("Multinomial", since=(7, 22), foldable=False)
def multinomial_7(*, dtype=6, sample_size=1, seed=None, _version):
    return _multinomial_factory(_version, dtype, sample_size, seed)


# -- Bernoulli -------------------------------------------------------------------------------------

def _bernoulli(rng, p: np.ndarray, dtype: np.dtype) -> np.ndarray:
    pf = upcast(p)
    if pf.size and not ((pf >= 0) & (pf <= 1)).all():
        raise InvalidValueError("every probability must be in [0, 1] (found a value outside, or NaN)")
    hit = rng.random(p.shape) < pf
    return hit if dtype == np.bool_ else hit.astype(dtype)


def _bernoulli_factory(version: int, dtype, seed):
    dt = None if dtype is None else dtype_attribute(dtype, "Bernoulli", version, "T2", "dtype")
    rng = _rng_source(seed)

    def run(x):
        return _bernoulli(rng(), x, dt if dt is not None else _input_dtype(x, "Bernoulli", version, "T2"))
    return run


@kernel("Bernoulli", since=(15, 22), foldable=False)
def bernoulli_15(*, dtype=None, seed=None, _version):
    return _bernoulli_factory(_version, dtype, seed)
