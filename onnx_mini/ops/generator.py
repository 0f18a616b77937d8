"""Generator operators: Constant (every version)."""
from __future__ import annotations

import numpy as np

from ..registry import kernel


def _constant(value: np.ndarray):
    value = np.asarray(value)
    value.flags.writeable = False  # the same array is handed out on every run
    return lambda: value


@kernel("Constant", since=(1, 9))
def constant_1(*, value):
    return _constant(value)


@kernel("Constant", since=11)
def constant_11(*, value=None, sparse_value=None):
    return constant_12(value=value, sparse_value=sparse_value)


@kernel("Constant", since=(12, 13, 19, 21, 23, 24, 25))
def constant_12(*, value=None, sparse_value=None, value_float=None, value_floats=None, value_int=None,
                value_ints=None, value_string=None, value_strings=None):
    # sparse_value arrives densified by the loader; the other forms become the tensor they describe.
    given = {
        "value": value, "sparse_value": sparse_value,
        "value_float": None if value_float is None else np.array(value_float, dtype=np.float32),
        "value_floats": None if value_floats is None else np.array(value_floats, dtype=np.float32),
        "value_int": None if value_int is None else np.array(value_int, dtype=np.int64),
        "value_ints": None if value_ints is None else np.array(value_ints, dtype=np.int64),
        "value_string": None if value_string is None else np.array(value_string, dtype=object),
        "value_strings": None if value_strings is None else _strings(value_strings),
    }
    set_ = {k: v for k, v in given.items() if v is not None}
    if len(set_) != 1:
        raise ValueError(f"Constant needs exactly one value attribute, got {sorted(set_) or 'none'}")
    return _constant(next(iter(set_.values())))


def _strings(values) -> np.ndarray:
    arr = np.empty(len(values), dtype=object)
    arr[:] = list(values)
    return arr
