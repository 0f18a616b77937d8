"""ai.onnx.ml map operators: CastMap and DictVectorizer (a map in, a tensor out) and ZipMap (a tensor
in, a sequence of maps out).

A map is a Python dict. A graph input arrives checked against its declared type (inputs.MapValue:
keys and values of the declared types, which it carries as key_dtype/value_dtype so that even an
empty map knows them); an undeclared plain dict has its types guessed from its items. ZipMap gives
one plain dict per row, keys the class labels (str or int), values Python floats.
"""
from __future__ import annotations

import numpy as np

from ...errors import InvalidValueError
from ...registry import kernel
from .._common import float_to
from ._common import class_labels
from .encoders import ML, Lookup, exactly_one, tname


def _guess_dtype(items) -> np.dtype | None:
    """The element type of a plain dict's keys or values, from its first one (None when empty)."""
    for v in items:
        if isinstance(v, str):
            return np.dtype(object)
        if isinstance(v, (np.generic, np.ndarray)):
            return v.dtype
        return np.dtype(np.int64) if isinstance(v, int) else np.dtype(np.float32)
    return None


def map_arrays(m) -> tuple[np.ndarray, np.ndarray]:
    """A map's keys and values as two 1-D arrays of its key and value types (in the dict's order)."""
    if not isinstance(m, dict):
        raise InvalidValueError(f"the input must be a map (dict), got {type(m).__name__}")
    kdt = getattr(m, "key_dtype", None)
    vdt = getattr(m, "value_dtype", None)
    kdt = kdt if kdt is not None else (_guess_dtype(m) or np.dtype(np.int64))
    vdt = vdt if vdt is not None else (_guess_dtype(m.values()) or np.dtype(np.float32))
    try:
        keys = np.array(list(m), dtype=kdt)
        values = np.array(list(m.values()), dtype=vdt)
    except (TypeError, ValueError, OverflowError) as e:
        raise InvalidValueError(f"the map's keys or values do not have one type ({e})") from None
    if keys.ndim != 1 or values.ndim != 1:
        raise InvalidValueError("the map's keys and values must be scalars")
    return keys, values


def _key_kind(dtype: np.dtype) -> str:
    return "string" if dtype == object else "integer" if dtype.kind in "iu" else tname(dtype)


# -- CastMap -----------------------------------------------------------------------------------------

def _cast_values(values: np.ndarray, to: np.dtype) -> np.ndarray:
    """Map values (float32 or strings) as `to` (float32, int64 or strings). Floats become integers
    toward zero (saturating, NaN -> 0) and strings by their shortest repr; strings are parsed."""
    if values.dtype == to:
        return values
    if values.dtype != object:                       # float32 -> int64 or string
        return float_to(values, to) if to != object else values.astype(str).astype(object)
    try:                                             # string -> float32 or int64
        if to == np.int64:
            try:
                return values.astype(np.int64)
            except (ValueError, OverflowError):      # "1.5": parsed as a number, then truncated
                return float_to(values.astype(np.float64), to)
        return values.astype(to)
    except (ValueError, TypeError) as e:
        raise InvalidValueError(f"cannot convert the map's string values to {tname(to)}: {e}") from None


@kernel("CastMap", since=1, domain=ML)
def cast_map_1(*, cast_to="TO_FLOAT", map_form="DENSE", max_map=1):
    # Values in ascending key order as a [1, n] tensor (onnxruntime's shape). DENSE: n = the map's size;
    # SPARSE: n = max_map, each value at the position of its key (in [0, max_map)), zeros (empty
    # strings) elsewhere.
    targets = {"TO_FLOAT": np.dtype(np.float32), "TO_INT64": np.dtype(np.int64), "TO_STRING": np.dtype(object)}
    if cast_to not in targets:
        raise ValueError(f"cast_to {cast_to!r} is not one of {', '.join(targets)}")
    if map_form not in ("DENSE", "SPARSE"):
        raise ValueError(f"map_form {map_form!r} is not one of DENSE, SPARSE")
    if map_form == "SPARSE" and max_map <= 0:
        raise ValueError(f"max_map must be positive with map_form SPARSE, got {max_map}")
    to = targets[cast_to]
    sparse = map_form == "SPARSE"

    def run(m):
        keys, values = map_arrays(m)
        if keys.dtype.kind not in "iu":
            raise InvalidValueError(f"the map's keys must be int64, got {_key_kind(keys.dtype)} keys")
        if values.dtype not in (np.float32, object):
            raise InvalidValueError(f"the map's values must be float or string, got {tname(values.dtype)}")
        order = np.argsort(keys, kind="stable")
        values = _cast_values(values[order], to)
        if not sparse:
            return values.reshape(1, -1)
        keys = keys[order]
        if keys.size and (keys[0] < 0 or keys[-1] >= max_map):
            bad = keys[(keys < 0) | (keys >= max_map)]
            raise InvalidValueError(f"key {int(bad[0])} is out of range for map_form SPARSE with max_map={max_map} "
                                    f"(accepted: [0, {max_map - 1}])")
        out = np.zeros(max_map, dtype=to)
        if to == object:
            out[...] = ""
        out[keys] = values
        return out.reshape(1, -1)
    return run


# -- DictVectorizer ----------------------------------------------------------------------------------

@kernel("DictVectorizer", since=1, domain=ML)
def dict_vectorizer_1(*, int64_vocabulary=None, string_vocabulary=None):
    # Y[i] = X[vocabulary[i]], zero ("" for strings) for a vocabulary entry the map lacks; Y is 1-D as
    # the spec says. Keys outside the vocabulary are ignored (as scikit-learn and onnxruntime do).
    strings = exactly_one(int64_vocabulary=int64_vocabulary, string_vocabulary=string_vocabulary) \
        == "string_vocabulary"
    vocabulary = np.array(string_vocabulary if strings else int64_vocabulary, dtype=object if strings else np.int64)

    def run(m):
        keys, values = map_arrays(m)
        if (keys.dtype == object) != strings or (not strings and keys.dtype.kind not in "iu"):
            raise InvalidValueError(f"the map has {_key_kind(keys.dtype)} keys but the node sets "
                                    f"{'string' if strings else 'int64'}_vocabulary")
        pos = Lookup(keys.astype(vocabulary.dtype, copy=False))(vocabulary)
        out = np.zeros(vocabulary.size, dtype=values.dtype)
        if values.dtype == object:
            out[...] = ""
        found = pos >= 0
        out[found] = values[pos[found]]
        return out
    return run


# -- ZipMap ------------------------------------------------------------------------------------------

@kernel("ZipMap", since=1, domain=ML)
def zip_map_1(*, classlabels_int64s=None, classlabels_strings=None):
    # One dict per row of X ([N, C], or [C] for one row): {label[j]: X[i, j]}
    labels = class_labels(classlabels_int64s, classlabels_strings, "classlabels_int64s").tolist()
    if len(set(labels)) != len(labels):
        raise ValueError(f"the class labels {labels} repeat a label")
    n = len(labels)
    one_row = (1, n)
    dicts = _row_dicts(labels)

    def run(x):
        if x.shape == one_row:                  # batch 1: no checks, no row loop (1.1 -> 0.8 us, 3 labels)
            return [dict(zip(labels, x.tolist()[0]))]
        if x.ndim not in (1, 2):
            raise InvalidValueError(f"X must be 1-D or 2-D, got shape {list(x.shape)}")
        rows = x.reshape(1, -1) if x.ndim == 1 else x
        if rows.shape[1] != n:
            raise InvalidValueError(f"X has {rows.shape[1]} columns but there are {n} class labels")
        return dicts(rows)
    return run


# up to this many labels, rows become dicts through a dict display written for their count: 1000 rows
# of 3 labels 490 -> 210 us against dict(zip(labels, row)) per row (fastest calls, under load)
_DISPLAY_LABELS = 16


def _row_dicts(labels: list):
    """fn(rows [N, C]) -> one dict {labels[j]: row[j]} per row (Python floats). Up to _DISPLAY_LABELS labels,
    a comprehension with a dict display of C entries (compiled here from the count alone: the labels
    are bound as arguments, never written into the source) over the columns zipped into rows."""
    n = len(labels)
    if n == 0 or n > _DISPLAY_LABELS:
        return lambda rows: [dict(zip(labels, r)) for r in rows.tolist()]
    keys = ", ".join(f"k{j}" for j in range(n))
    values = ", ".join(f"v{j}" for j in range(n))
    entries = ", ".join(f"k{j}: v{j}" for j in range(n))
    source = (f"def make({keys}):\n"
              f"    return lambda rows: [{{{entries}}} for {values}, in zip(*rows.T.tolist())]\n")
    scope = {}
    exec(compile(source, "<zipmap rows>", "exec"), scope)
    return scope["make"](*labels)
