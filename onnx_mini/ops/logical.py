"""Logical, comparison and bitwise operators (onnx/defs/logical): And, Or, Xor, Not, Equal, Greater,
Less, GreaterOrEqual, LessOrEqual, BitShift, BitwiseAnd/Or/Xor/Not.

Version 1 of And/Or/Xor/Equal/Greater/Less has the legacy `broadcast`/`axis` form; later versions
broadcast like numpy. Comparisons return bool; the two inputs share one type.
"""
from __future__ import annotations

import numpy as np

from ..registry import kernel
from ._common import as_array
from .math.elementwise import binary, legacy_binary


def _binary_versions(op: str, ufunc, versions, legacy: bool) -> None:
    """Register `op`: version 1 in the legacy broadcast form when `legacy`, `versions` with numpy's."""
    if legacy:
        @kernel(op, since=1)
        def v1(*, broadcast=0, axis=None):
            return legacy_binary(ufunc, broadcast, axis)

    @kernel(op, since=versions)
    def modern():
        return binary(ufunc)


def _unary_version(op: str, ufunc, since: int) -> None:
    def run(x):
        return as_array(ufunc(x))

    @kernel(op, since=since)
    def factory():
        return run


# -- boolean logic -------------------------------------------------------------------------------

_binary_versions("And", np.logical_and, 7, legacy=True)
_binary_versions("Or", np.logical_or, 7, legacy=True)
_binary_versions("Xor", np.logical_xor, 7, legacy=True)

_unary_version("Not", np.logical_not, 1)


# -- comparisons ---------------------------------------------------------------------------------

_binary_versions("Equal", np.equal, (7, 11, 13, 19), legacy=True)
_binary_versions("Greater", np.greater, (7, 9, 13), legacy=True)
_binary_versions("Less", np.less, (7, 9, 13), legacy=True)
_binary_versions("GreaterOrEqual", np.greater_equal, (12, 16), legacy=False)
_binary_versions("LessOrEqual", np.less_equal, (12, 16), legacy=False)


# -- bitwise -------------------------------------------------------------------------------------

@kernel("BitShift", since=(11, 28))
def bitshift_11(*, direction):
    # numpy's shifts already give what opset 28 spells out: a shift by >= the bit width or by a
    # negative amount yields 0, or -1 for a right shift of a negative value (sign fill).
    if direction == "LEFT":
        return binary(np.left_shift)
    if direction == "RIGHT":
        return binary(np.right_shift)
    raise ValueError(f"direction must be 'LEFT' or 'RIGHT', got {direction!r}")


_binary_versions("BitwiseAnd", np.bitwise_and, 18, legacy=False)
_binary_versions("BitwiseOr", np.bitwise_or, 18, legacy=False)
_binary_versions("BitwiseXor", np.bitwise_xor, 18, legacy=False)

_unary_version("BitwiseNot", np.invert, 18)
