"""Sequence operators (onnx/defs/sequence): sequences are Python lists of arrays, never mutated in place.

SequenceEmpty, SequenceConstruct, SequenceLength, SequenceAt, SequenceInsert, SequenceErase,
SplitToSequence, ConcatFromSequence, SequenceMap (runs its body sub-plan once per element).
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from .. import dtypes
from ..errors import InvalidValueError
from ..registry import kernel
from ._common import normalize_axis

#: element types a sequence may hold in opset 11..23 (the schemas' S constraint; 24 adds bfloat16)
_SEQ_ELEM_TYPES = frozenset(getattr(TensorProto, n) for n in (
    "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FLOAT16", "FLOAT", "DOUBLE",
    "STRING", "BOOL", "COMPLEX64", "COMPLEX128"))


def _position(position: np.ndarray, n: int, insert: bool = False) -> int:
    """A position tensor (a scalar; a one-element tensor is accepted) checked against [-n, n - 1]
    ([-n, n] when inserting), made non-negative."""
    p = np.asarray(position)
    if p.size != 1 or p.ndim > 1 or p.dtype.kind not in "iu":
        raise InvalidValueError(f"position must be an int32/int64 scalar, got {p.dtype}{list(p.shape)}")
    k = int(p.reshape(()))
    hi = n if insert else n - 1
    if not -n <= k <= hi:
        raise InvalidValueError(f"position {k} is out of range [{-n}, {hi}] for a sequence of "
                                f"{n} tensor(s)")
    return k + n if k < 0 else k


def _check_sequence(seq) -> None:
    if not isinstance(seq, list):
        raise InvalidValueError(f"expected a sequence as first input, got "
                                f"{'None' if seq is None else type(seq).__name__}")


def _same_dtype(values) -> None:
    """All tensors of a sequence share one element type."""
    if values:
        dt = values[0].dtype
        bad = next((v.dtype for v in values if v.dtype != dt), None)
        if bad is not None:
            raise InvalidValueError(f"the tensors of a sequence must share one element type, "
                                    f"got {dt} and {bad}")


# -- construction and access ---------------------------------------------------------------------

@kernel("SequenceEmpty", since=11)
def sequence_empty_11(*, dtype=TensorProto.FLOAT):
    if dtype not in _SEQ_ELEM_TYPES:
        raise ValueError(f"dtype {dtype} ({dtypes.type_name(dtype) if dtype in dtypes.NP_DTYPE else 'unknown'}) "
                         "is not an element type a sequence may hold")
    return lambda: []


@kernel("SequenceConstruct", since=11)
def sequence_construct_11():
    def run(*tensors):
        _same_dtype(tensors)
        return list(tensors)
    return run


@kernel("SequenceLength", since=11)
def sequence_length_11():
    def run(seq):
        _check_sequence(seq)
        return np.array(len(seq), dtype=np.int64)
    return run


@kernel("SequenceAt", since=11)
def sequence_at_11():
    def run(seq, position):
        _check_sequence(seq)
        return seq[_position(position, len(seq))]
    return run


@kernel("SequenceInsert", since=11)
def sequence_insert_11():
    def run(seq, tensor, position=None):
        _check_sequence(seq)
        n = len(seq)
        if seq and tensor.dtype != seq[0].dtype:
            raise InvalidValueError(f"a {tensor.dtype} tensor cannot join a sequence of "
                                    f"{seq[0].dtype} tensors")
        k = n if position is None else _position(position, n, insert=True)
        return [*seq[:k], tensor, *seq[k:]]
    return run


@kernel("SequenceErase", since=11)
def sequence_erase_11():
    def run(seq, position=None):
        _check_sequence(seq)
        n = len(seq)
        if n == 0:
            raise InvalidValueError("cannot erase from an empty sequence")
        k = n - 1 if position is None else _position(position, n)
        return [*seq[:k], *seq[k + 1:]]
    return run


# -- split / concat --------------------------------------------------------------------------------

def split_bounds(length: int, split) -> list[int]:
    """Start offsets plus the end: a scalar split gives chunks of that size (the last may be shorter),
    a 1-D split the listed sizes (>= 0, summing to `length`)."""
    s = np.asarray(split)
    if s.dtype.kind not in "iu" or s.ndim > 1:
        raise InvalidValueError(f"split must be an int32/int64 scalar or 1-D tensor, got {s.dtype}{list(s.shape)}")
    if s.ndim == 0:
        size = int(s)
        if size <= 0:
            raise InvalidValueError(f"a scalar split must be positive, got {size}")
        return [*range(0, length, size), length] if length else [0]
    sizes = s.astype(np.int64)
    if (sizes < 0).any():
        raise InvalidValueError(f"split sizes must be >= 0, got {sizes.tolist()}")
    if int(sizes.sum()) != length:
        raise InvalidValueError(f"split sizes {sizes.tolist()} sum to {int(sizes.sum())}, but the dimension "
                                f"being split has {length}")
    return [0, *np.cumsum(sizes).tolist()]


@kernel("SplitToSequence", since=(11, 24))
def split_to_sequence_11(*, axis=0, keepdims=1):
    if keepdims not in (0, 1):
        raise ValueError(f"keepdims must be 0 or 1, got {keepdims}")

    def run(x, split=None):
        ax = normalize_axis(axis, x.ndim)
        if split is None and not keepdims:  # chunks of 1 without the split axis (views)
            return list(np.moveaxis(x, ax, 0))
        bounds = range(x.shape[ax] + 1) if split is None else split_bounds(x.shape[ax], split)
        lead = (slice(None),) * ax
        return [x[(*lead, slice(a, b))] for a, b in zip(bounds[:-1], bounds[1:])]
    return run


@kernel("ConcatFromSequence", since=11)
def concat_from_sequence_11(*, axis, new_axis=0):
    if new_axis not in (0, 1):
        raise ValueError(f"new_axis must be 0 or 1, got {new_axis}")

    def run(seq):
        _check_sequence(seq)
        if not seq:
            raise InvalidValueError("the input sequence is empty")
        _same_dtype(seq)
        rank = seq[0].ndim
        ax = normalize_axis(axis, rank + new_axis)
        shapes = {t.shape[:ax] + t.shape[ax + 1 - new_axis:] for t in seq}
        if len(shapes) > 1 or any(t.ndim != rank for t in seq):
            raise InvalidValueError(f"tensors of shapes {[list(t.shape) for t in seq]} "
                                    f"differ outside axis {axis}" + (" (new_axis=1: shapes must be equal)"
                                                                     if new_axis else ""))
        return np.stack(seq, axis=ax) if new_axis else np.concatenate(seq, axis=ax)
    return run


# -- SequenceMap -----------------------------------------------------------------------------------

@kernel("SequenceMap", since=17)
def sequence_map_17(*, body, _n_inputs, _n_outputs):
    if len(body.input_names) != _n_inputs:
        raise ValueError(f"the body takes {len(body.input_names)} input(s) but the node has {_n_inputs}")
    if len(body.output_names) != _n_outputs:
        raise ValueError(f"the body has {len(body.output_names)} output(s) but the node has {_n_outputs}")
    n_extra = _n_inputs - 1    # the step's inputs: seq, the additional inputs, then the captured values

    def run(seq, *rest):
        extra, captured = rest[:n_extra], rest[n_extra:]
        _check_sequence(seq)
        n = len(seq)
        for j, x in enumerate(extra):
            if isinstance(x, list) and len(x) != n:
                raise InvalidValueError(f"input {j + 1} is a sequence of {len(x)} tensor(s), "
                                        f"the first input has {n}")
            if x is None:
                raise InvalidValueError(f"input {j + 1} is missing")
        seqs = [j for j, x in enumerate(extra) if isinstance(x, list)]
        outs: list[list] = [[] for _ in range(_n_outputs)]
        call = body.runner(captured)
        for i in range(n):
            args = [seq[i], *extra]
            for j in seqs:
                args[j + 1] = extra[j][i]
            for o, v in zip(outs, call(args)):
                o.append(v)
        return tuple(outs)
    return run
