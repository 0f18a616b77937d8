"""ai.onnx.ml encoders: LabelEncoder (1, 2, 4) and CategoryMapper.

Also home of `Lookup`, the vectorised "position of each value in a fixed key list" that every ml
kernel mapping values through keys shares (OneHotEncoder, DictVectorizer): prepared once in the
factory (sorted numeric keys, a dict of string keys), each run is one vectorised pass.
"""
from __future__ import annotations

from itertools import repeat

import numpy as np

from ...dtypes import elem_type, type_name
from ...errors import InvalidValueError
from ...registry import kernel

ML = "ai.onnx.ml"


def tname(dtype: np.dtype) -> str:
    """ONNX name of a numpy dtype ('float', 'int64', 'string')."""
    return type_name(elem_type(dtype))


class Lookup:
    """Positions of values in a fixed list of keys, prepared once: numbers through one np.searchsorted
    over the sorted keys, strings through a dict. A key listed twice maps to its last position; a
    float NaN key matches any NaN."""

    def __init__(self, keys: np.ndarray):
        keys = np.asarray(keys).reshape(-1)
        self.dtype = keys.dtype
        index = np.arange(keys.size, dtype=np.int64)
        self.nan_at = -1
        if keys.dtype == object:
            self.table = dict(zip(keys.tolist(), index.tolist()))     # later keys overwrite earlier ones
            return
        if keys.dtype.kind == "f":
            nan = np.isnan(keys)
            if nan.any():
                self.nan_at = int(index[nan][-1])
                keys, index = keys[~nan], index[~nan]
        # np.unique of the reversed keys keeps each key's first position there: its last one here
        self.sorted, first = np.unique(keys[::-1], return_index=True)
        self.positions = index[::-1][first]

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """int64 array of x's shape: the key position of each element of x, -1 where it is no key."""
        flat = x.reshape(-1)
        if self.dtype == object:
            try:
                pos = np.fromiter(map(self.table.get, flat, repeat(-1)), np.int64, flat.size)
            except TypeError:  # an object tensor holding unhashable things
                kinds = sorted({type(v).__name__ for v in flat.tolist()} - {"str"})
                raise InvalidValueError(f"a string tensor holds non-string elements ({', '.join(kinds)})") from None
            return pos.reshape(x.shape)
        n = self.sorted.size
        if n == 0:
            pos = np.full(flat.shape, -1, dtype=np.int64)
        else:
            at = np.minimum(np.searchsorted(self.sorted, flat), n - 1)
            pos = np.where(self.sorted[at] == flat, self.positions[at], -1)
        if self.nan_at >= 0:
            pos[np.isnan(flat)] = self.nan_at
        return pos.reshape(x.shape)


class Mapping:
    """keys[i] -> values[i] (the last one for a repeated key), `default` for anything else; the input
    must have the keys' element type. Output: values' type, input's shape."""

    def __init__(self, keys: np.ndarray, values: np.ndarray, default):
        if len(keys) != len(values):
            raise ValueError(f"the keys ({len(keys)}) and the values ({len(values)}) differ in length")
        self.lookup = Lookup(keys)
        self.table = np.empty(len(values) + 1, dtype=values.dtype)   # table[-1] is the default
        self.table[:-1] = values
        self.table[-1] = default

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if x.dtype != self.lookup.dtype:
            raise InvalidValueError(f"the input is a {tname(x.dtype)} tensor but the keys are "
                                    f"{tname(self.lookup.dtype)}: the types must be the same")
        return self.table[self.lookup(x)]


def typed_default(value, dtype: np.dtype, what: str):
    """An int attribute as a value of integer `dtype`, ValueError when it does not fit."""
    info = np.iinfo(dtype)
    if not info.min <= value <= info.max:
        raise ValueError(f"{what}={value} does not fit the values' type {tname(dtype)}")
    return value


def exactly_one(**attrs) -> str:
    """The name of the one attribute of `attrs` that is set (not None); ValueError otherwise."""
    given = [k for k, v in attrs.items() if v is not None]
    if len(given) != 1:
        raise ValueError(f"exactly one of {', '.join(attrs)} must be set"
                         + (f" (got {', '.join(given)})" if given else " (none is)"))
    return given[0]


def _one_of(kind: str, floats, int64s, strings, tensor=None, with_tensor: bool = False) -> np.ndarray:
    """The one set attribute among `kind`_floats/_int64s/_strings (and `kind`_tensor when the version
    has it) as a 1-D array: float32, int64, strings (object) or the tensor's type."""
    attrs = {f"{kind}_floats": floats, f"{kind}_int64s": int64s, f"{kind}_strings": strings}
    if with_tensor:
        attrs[f"{kind}_tensor"] = tensor
    name = exactly_one(**attrs)
    if name.endswith("_tensor"):
        return _attribute_tensor(tensor, name)
    dtype = {"floats": np.float32, "int64s": np.int64, "strings": object}[name.rsplit("_", 1)[1]]
    return np.array(attrs[name], dtype=dtype).reshape(-1)


#: element types LabelEncoder-4 accepts for keys and values (T1 and T2).
_LE4_TYPES = frozenset(np.dtype(t) for t in (object, np.int64, np.float32, np.int32, np.int16, np.float64))


def _attribute_tensor(t: np.ndarray, what: str) -> np.ndarray:
    if t.ndim > 1:
        raise ValueError(f"{what} must be a 1-D tensor, got shape {list(t.shape)}")
    if t.dtype not in _LE4_TYPES:
        raise ValueError(f"{what} has element type {tname(t.dtype)}, not one of string, int64, float, "
                         "int32, int16, double")
    return t.reshape(-1)


# -- LabelEncoder ------------------------------------------------------------------------------------

@kernel("LabelEncoder", since=1, domain=ML)
def label_encoder_1(*, classes_strings=None, default_int64=-1, default_string="_Unused"):
    # string -> its index in classes_strings (default_int64 when absent);
    # int64 -> classes_strings[i] (default_string when i is out of range)
    classes = np.array(classes_strings or [], dtype=object)
    n = classes.size
    to_int = Mapping(classes, np.arange(n, dtype=np.int64), typed_default(default_int64, np.dtype(np.int64),
                                                                             "default_int64"))
    strings = np.append(classes, np.array([default_string], dtype=object))

    def run(x):
        if x.dtype == object:
            return to_int(x)
        if x.dtype != np.int64:
            raise InvalidValueError(f"the input must be a string or int64 tensor, got {tname(x.dtype)}")
        return strings[np.where((x >= 0) & (x < n), x, n)]
    return run


def _label_defaults(values: np.ndarray, default_float, default_int64, default_string):
    if values.dtype == object:
        return default_string
    if values.dtype.kind == "f":
        return default_float
    return typed_default(default_int64, values.dtype, "default_int64")


@kernel("LabelEncoder", since=2, domain=ML)
def label_encoder_2(*, keys_floats=None, keys_int64s=None, keys_strings=None, values_floats=None,
                    values_int64s=None, values_strings=None, default_float=-0.0, default_int64=-1,
                    default_string="_Unused"):
    keys = _one_of("keys", keys_floats, keys_int64s, keys_strings)
    values = _one_of("values", values_floats, values_int64s, values_strings)
    return Mapping(keys, values, _label_defaults(values, default_float, default_int64, default_string))


@kernel("LabelEncoder", since=4, domain=ML)
def label_encoder_4(*, keys_floats=None, keys_int64s=None, keys_strings=None, keys_tensor=None,
                    values_floats=None, values_int64s=None, values_strings=None, values_tensor=None,
                    default_float=-0.0, default_int64=-1, default_string="_Unused", default_tensor=None):
    keys = _one_of("keys", keys_floats, keys_int64s, keys_strings, keys_tensor, with_tensor=True)
    values = _one_of("values", values_floats, values_int64s, values_strings, values_tensor, with_tensor=True)
    if default_tensor is not None:
        if default_tensor.size != 1:
            raise ValueError(f"default_tensor must hold one value, got shape {list(default_tensor.shape)}")
        if default_tensor.dtype != values.dtype:
            raise ValueError(f"default_tensor is {tname(default_tensor.dtype)} but the values are "
                             f"{tname(values.dtype)}")
        default = default_tensor.reshape(-1)[0]
    else:
        default = _label_defaults(values, default_float, default_int64, default_string)
    return Mapping(keys, values, default)


# -- CategoryMapper ----------------------------------------------------------------------------------

@kernel("CategoryMapper", since=1, domain=ML)
def category_mapper_1(*, cats_int64s=None, cats_strings=None, default_int64=-1, default_string="_Unused"):
    ints = np.array(cats_int64s or [], dtype=np.int64)
    strings = np.array(cats_strings or [], dtype=object)
    if ints.size != strings.size:
        raise ValueError(f"cats_int64s ({ints.size}) and cats_strings ({strings.size}) differ in length")
    to_int = Mapping(strings, ints, typed_default(default_int64, np.dtype(np.int64), "default_int64"))
    to_string = Mapping(ints, strings, default_string)

    def run(x):
        if x.dtype == object:
            return to_int(x)
        if x.dtype == np.int64:
            return to_string(x)
        raise InvalidValueError(f"the input must be a string or int64 tensor, got {tname(x.dtype)}")
    return run
