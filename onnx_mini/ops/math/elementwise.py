"""Element-wise arithmetic: Add (every version, incl. the legacy broadcast=1/axis form of 1 and 6)."""
from __future__ import annotations

import numpy as np

from ...registry import kernel
from .._common import as_array, legacy_broadcast, same_type


def binary(ufunc):
    """The kernel function of a numpy-broadcasting binary op that keeps the (shared) input type."""
    def run(a, b):
        same_type(a, b)
        return as_array(ufunc(a, b))
    return run


def legacy_binary(ufunc, broadcast, axis):
    def run(a, b):
        same_type(a, b)
        return as_array(ufunc(a, legacy_broadcast(a, b, broadcast, axis)))
    return run


@kernel("Add", since=1)
def add_1(*, broadcast=0, axis=None, consumed_inputs=None):
    return legacy_binary(np.add, broadcast, axis)


@kernel("Add", since=6)
def add_6(*, broadcast=0, axis=None):
    return legacy_binary(np.add, broadcast, axis)


@kernel("Add", since=(7, 13, 14))
def add_7():
    return binary(np.add)
