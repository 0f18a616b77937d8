"""ai.onnx.ml preprocessing: ArrayFeatureExtractor, Binarizer, Imputer, Normalizer, Scaler,
OneHotEncoder, FeatureVectorizer.

Features are the last axis (an [N, F] tensor holds N rows of F features). Numeric results the spec
types as float are float32: computed in float32 for a float32 input, in float64 otherwise (double
and integer inputs keep their precision), rounded once.
"""
from __future__ import annotations

import math

import numpy as np

from ... import memory
from ...errors import InvalidValueError
from ...registry import kernel
from .._common import as_array, float_to, round_f32
from ._common import row_reduce
from .encoders import ML, Lookup, exactly_one, tname


_F32 = np.dtype(np.float32)      # (a native float32 array's dtype is this object: `is` tests it in ~30 ns, == ~90)


def _float(x: np.ndarray) -> np.ndarray:
    """x as the float type the computation runs in: float32 stays, anything else goes to float64."""
    return x if x.dtype == np.float32 else x.astype(np.float64)


def _features(x: np.ndarray) -> int:
    """The number of features of x: its last dimension (1 for a scalar)."""
    return x.shape[-1] if x.ndim else 1


def _per_feature(values: np.ndarray, x: np.ndarray, what: str) -> None:
    """An attribute of length 1 (applies to every feature) or F (one per feature of x)."""
    if values.size not in (1, _features(x)):
        raise InvalidValueError(f"{what} has {values.size} values; it must have 1 or one per feature "
                                f"(the input has {_features(x)} features, shape {list(x.shape)})")


# -- ArrayFeatureExtractor ---------------------------------------------------------------------------

@kernel("ArrayFeatureExtractor", since=1, domain=ML)
def array_feature_extractor_1():
    def run(x, y):
        if x.ndim == 0:
            raise InvalidValueError("X must have at least one dimension")
        if y.dtype.kind not in "iu":
            raise InvalidValueError(f"the indices Y must be int64, got {tname(y.dtype)}")
        indices = y.reshape(-1)
        n = x.shape[-1]
        if indices.size and (indices.min() < 0 or indices.max() >= n):
            bad = indices[(indices < 0) | (indices >= n)]
            raise InvalidValueError(f"index {int(bad[0])} is out of range for the last axis of X "
                                    f"(size {n}, shape {list(x.shape)}): accepted [0, {n - 1}]")
        z = x.take(indices, axis=-1)
        # a 1-D X gives one row [1, len(Y)], as onnxruntime does
        return z.reshape(1, -1) if x.ndim == 1 else z
    return run


# -- Binarizer -------------------------------------------------------------------------------------

@kernel("Binarizer", since=1, domain=ML)
def binarizer_1(*, threshold=0.0):
    # greater than the threshold -> 1, anything else (NaN included) -> 0, in X's type
    return lambda x: as_array(x > threshold).astype(x.dtype)


# -- Imputer ---------------------------------------------------------------------------------------

@kernel("Imputer", since=1, domain=ML)
def imputer_1(*, imputed_value_floats=None, imputed_value_int64s=None, replaced_value_float=0.0,
              replaced_value_int64=0):
    exactly_one(imputed_value_floats=imputed_value_floats, imputed_value_int64s=imputed_value_int64s)
    floats = None if imputed_value_floats is None else np.array(imputed_value_floats, dtype=np.float32)
    ints = None if imputed_value_int64s is None else np.array(imputed_value_int64s, dtype=np.int64)
    nan = math.isnan(replaced_value_float)

    def run(x):
        if x.dtype.kind == "f":
            if floats is None:
                raise InvalidValueError(f"a {tname(x.dtype)} input needs imputed_value_floats "
                                        "(the node sets imputed_value_int64s)")
            fill = floats.astype(x.dtype)
            mask = np.isnan(x) if nan else x == replaced_value_float
        elif x.dtype.kind in "iu":
            if ints is None:
                raise InvalidValueError(f"an {tname(x.dtype)} input needs imputed_value_int64s "
                                        "(the node sets imputed_value_floats)")
            info = np.iinfo(x.dtype)
            if ints.size and (ints.min() < info.min or ints.max() > info.max):
                raise InvalidValueError(f"imputed_value_int64s {ints.tolist()} do not fit the input's type "
                                        f"{tname(x.dtype)}")
            fill = ints.astype(x.dtype)
            mask = x == np.int64(replaced_value_int64)
        else:
            raise InvalidValueError(f"the input must be a float, double, int64 or int32 tensor, got "
                                    f"{tname(x.dtype)}")
        _per_feature(fill, x, "imputed_value_" + ("floats" if x.dtype.kind == "f" else "int64s"))
        return as_array(np.where(mask, fill.reshape(()) if fill.size == 1 else fill, x))
    return run


# -- Normalizer ------------------------------------------------------------------------------------

# One float32 row of at most this many values has its L1 norm summed on Python floats: numpy adds
# fewer than 8 float32 values (its pairwise-sum block) left to right, which round_f32 after each +
# reproduces (the same bits: tested against numpy); the row is then divided by it as a Python float,
# cheaper than a numpy scalar. [1, 3]: 2.6 vs 5.2 us a call (measured under load)
_SEQUENTIAL_SUM = 7


@kernel("Normalizer", since=1, domain=ML)
def normalizer_1(*, norm="MAX"):
    # Each row (the last axis) divided by: MAX its maximum, L1 the sum of its absolute values, L2 its
    # Euclidean norm (sign kept); a zero divisor leaves the row as it is.
    divisors = {
        "MAX": lambda v: row_reduce(np.maximum, v),
        "L1": lambda v: row_reduce(np.add, np.abs(v)),
        # each row's dot product with itself (BLAS): no [N, F] temporary of squares; 2.3x faster than
        # square + sum on [1000, 5136] float32 rows (skl_tfidf_svc), at least as exact
        "L2": lambda v: np.sqrt(np.matmul(v[..., None, :], v[..., :, None])[..., 0]),
    }
    if norm not in divisors:
        raise ValueError(f"norm {norm!r} is not one of 'MAX', 'L1', 'L2'")
    divisor = divisors[norm]
    # one row (batch 1): the whole-array reduction over the same contiguous elements gives the same
    # divisor at ~2 us less than a keepdims one and its zero check (a [1, 3] row, measured under load);
    # L2: the same product as a batch's row, as a scalar (a [1, 5136] row: ~2 us less)
    # (the ufuncs' reduce straight: np.max and .sum() are Python wrappers of it, ~0.5-2 us on a [1, 3] row)
    whole = {"MAX": lambda v: np.maximum.reduce(v, axis=None), "L1": lambda v: np.add.reduce(np.abs(v), axis=None),
             "L2": lambda v: np.sqrt(np.matmul(v[..., None, :], v[..., :, None]).reshape(()))}[norm]

    row_l1 = norm == "L1"

    def run(x):
        if row_l1 and x.dtype is _F32 and x.ndim and 0 < x.size <= _SEQUENTIAL_SUM and x.size == x.shape[-1]:
            vals = x.reshape(-1).tolist()
            d = abs(vals[0])
            for a in vals[1:]:
                d = round_f32(d + abs(a))
            return x / d if d != 0 else x.copy()   # (a Python float: float32 division, NEP 50)
        v = x if x.dtype is _F32 else _float(x)
        if v.size == 0:
            return v.astype(np.float32)
        if v.ndim and v.size == v.shape[-1] and v.flags.c_contiguous:
            d = whole(v)
            y = v / d if d != 0 else v.copy()
            return y if v is x else y.astype(np.float32, copy=False)
        row = v.reshape(1) if v.ndim == 0 else v
        d = divisor(row)
        if np.count_nonzero(d) < d.size:       # (count_nonzero: a C call, unlike d.all())
            d[d == 0] = 1
        if row.dtype is _F32 and d.dtype is _F32:       # large (20 MB at 1000 tf-idf rows): recycled
            y = np.divide(row, d, out=memory.empty(row.shape, _F32))
        else:
            y = row / d
        return y.reshape(x.shape).astype(np.float32, copy=False)
    return run


# -- Scaler ----------------------------------------------------------------------------------------

@kernel("Scaler", since=1, domain=ML)
def scaler_1(*, offset=None, scale=None):
    # Y = (X - offset) * scale, each of length 1 or one per feature; a missing one is the identity
    if offset and scale and len(offset) != len(scale):
        raise ValueError(f"offset ({len(offset)} values) and scale ({len(scale)}) must have the same length")
    off = np.array(offset or [0.0], dtype=np.float32)
    mul = np.array(scale or [1.0], dtype=np.float32)
    sizes = {1, off.size, mul.size}
    mixed = len(sizes) > 2      # two per-feature lengths: no X fits both, _per_feature says which

    # [1, n] copies for a 2-D X: operands of one rank take numpy's plain loop, without the broadcasting
    # set-up a 1-D one costs ([1, 20] float32: ~1.5 against ~2.9 us a call, measured under load)
    off2, mul2 = off.reshape(1, -1), mul.reshape(1, -1)

    def run(x):
        if mixed or (x.shape[-1] if x.ndim else 1) not in sizes:
            _per_feature(off, x, "offset")
            _per_feature(mul, x, "scale")
        if x.dtype is _F32:                     # the usual input, without _float's and the cast's checks
            if x.ndim == 2:
                y = x - off2                    # a new array, of X's shape (off2 has one row)
                y *= mul2
                return y
            y = x - off                         # a new array (off is 1-D)
            y *= mul
            return y
        y = _float(x) - off                     # a new array (off is 1-D): float32 is the result
        y *= mul
        return y if y.dtype == np.float32 else y.astype(np.float32)
    return run


# -- OneHotEncoder ---------------------------------------------------------------------------------

@kernel("OneHotEncoder", since=1, domain=ML)
def one_hot_encoder_1(*, cats_int64s=None, cats_strings=None, zeros=1):
    which = exactly_one(cats_int64s=cats_int64s, cats_strings=cats_strings)
    strings = which == "cats_strings"
    cats = np.array(cats_strings if strings else cats_int64s, dtype=object if strings else np.int64)
    lookup = Lookup(cats)
    columns = np.arange(cats.size)

    def run(x):
        if strings != (x.dtype == object):
            raise InvalidValueError(f"a {tname(x.dtype)} input needs "
                                    f"{'cats_strings' if x.dtype == object else 'cats_int64s'}, the node "
                                    f"sets {which}")
        if x.dtype.kind == "f":  # floats are cast to integers (toward zero); NaN/inf match nothing
            pos = lookup(float_to(x, np.dtype(np.int64)))
            pos[~np.isfinite(x)] = -1
        else:
            pos = lookup(x if strings else x.astype(np.int64, copy=False))
        if not zeros:
            unknown = pos < 0
            if unknown.any():
                raise InvalidValueError(f"category {x[unknown].tolist()[0]!r} is not in {which} and zeros=0 forbids "
                                        "unknown categories")
        return (pos[..., None] == columns).astype(np.float32)
    return run


# -- FeatureVectorizer -----------------------------------------------------------------------------

@kernel("FeatureVectorizer", since=1, domain=ML)
def feature_vectorizer_1(*, inputdimensions=None, _n_inputs):
    # Inputs are [N, C] (1-D: [1, C]; higher ranks: [N, rest flattened]); each one is cut or padded
    # with zeros to its inputdimensions entry and the pieces are concatenated along the columns.
    if inputdimensions is not None:
        if len(inputdimensions) != _n_inputs:
            raise ValueError(f"inputdimensions has {len(inputdimensions)} entries for {_n_inputs} inputs")
        if any(d < 0 for d in inputdimensions):
            raise ValueError(f"inputdimensions {list(inputdimensions)} must not be negative")

    def run(*xs):
        mats = [x.reshape(1, -1) if x.ndim <= 1 else x.reshape(x.shape[0], math.prod(x.shape[1:])) for x in xs]
        rows = {m.shape[0] for m in mats}
        if len(rows) > 1:
            raise InvalidValueError(f"the inputs have different batch sizes: "
                                    f"{', '.join(str(list(x.shape)) for x in xs)}")
        for x in xs:
            if x.dtype.kind not in "iuf":
                raise InvalidValueError(f"the inputs must be int32, int64, float or double, got {tname(x.dtype)}")
        widths = list(inputdimensions) if inputdimensions is not None else [m.shape[1] for m in mats]
        out = np.zeros((mats[0].shape[0], sum(widths)), dtype=np.float32)
        col = 0
        for m, w in zip(mats, widths):
            k = min(w, m.shape[1])
            out[:, col:col + k] = m[:, :k]
            col += w
        return out
    return run
