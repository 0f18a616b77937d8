"""Shape and layout operators: Identity, Shape, Reshape, Squeeze, Unsqueeze, Transpose, Size (views,
never copies), and DepthToSpace / SpaceToDepth (a reshape-transpose-reshape copy)."""
from __future__ import annotations

import math

import numpy as np

from ...errors import InvalidValueError
from ...registry import kernel
from .._common import SHAPES_KEPT, by_shape, constant_lists, int_list, normalize_axes


def _identity(x):
    return x


@kernel("Identity", since=(1, 13, 14, 16, 19, 21, 23, 24, 25), views=True, rank="first")
def identity_1():
    # Tensors, sequences (14+) and optionals (16+) pass through unchanged: no copy.
    return _identity


# -- Shape ---------------------------------------------------------------------------------------

@kernel("Shape", since=(1, 13))
def shape_1():
    return shape_15()


@kernel("Shape", since=(15, 19, 21, 23, 24, 25))
def shape_15(*, start=0, end=None):
    # Python slicing clamps negative/out-of-range bounds to [0, rank] exactly as the spec asks,
    # and start > end gives an empty shape.
    span = slice(start, end)
    # A copy of the array made at the first run of each input shape: ~0.34 against ~0.54 us for
    # np.array(shape) on a rank-2 input here (tuples of ints convert slowly).
    made: dict[tuple, np.ndarray] = {}

    def shape(data):
        dims = data.shape
        known = made.get(dims)
        if known is None:
            known = np.array(dims[span], dtype=np.int64)
            if len(made) < SHAPES_KEPT:
                made[dims] = known
        return known.copy()
    return shape


# -- Reshape -------------------------------------------------------------------------------------

def target_shape(in_shape: tuple, requested, allowzero: bool) -> tuple:
    """The output shape of Reshape: 0 copies the input dim (unless allowzero), one -1 is inferred."""
    shape = [int(d) for d in requested]
    inferred = [i for i, d in enumerate(shape) if d == -1]
    if len(inferred) > 1:
        raise InvalidValueError(f"shape {shape} has more than one -1")
    bad = [d for d in shape if d < -1]
    if bad:
        raise InvalidValueError(f"shape {shape} has invalid dimension(s) {bad} (only -1 may be negative)")
    if allowzero:
        if inferred and 0 in shape:
            raise InvalidValueError(f"shape {shape} has both 0 and -1, which allowzero=1 forbids")
    else:
        for i, d in enumerate(shape):
            if d == 0:
                if i >= len(in_shape):
                    raise InvalidValueError(f"shape {shape}: 0 at index {i} copies an input dimension, but "
                                            f"the input {list(in_shape)} has rank {len(in_shape)}")
                shape[i] = in_shape[i]
    total = math.prod(in_shape)
    if inferred:
        known = math.prod(d for i, d in enumerate(shape) if i != inferred[0])
        if known == 0:
            raise InvalidValueError(f"cannot infer the -1 of shape {shape} for input {list(in_shape)}: "
                                    "the other dimensions multiply to 0")
        if total % known:
            raise InvalidValueError(f"cannot reshape input {list(in_shape)} ({total} elements) to {shape}")
        shape[inferred[0]] = total // known
    elif math.prod(shape) != total:
        raise InvalidValueError(f"cannot reshape input {list(in_shape)} ({total} elements) to {shape} "
                                f"({math.prod(shape)} elements)")
    return tuple(shape)


_INT64 = np.dtype(np.int64)
_SAME = object()     # a Reshape to the input's own shape


@kernel("Reshape", since=1, views=True)
def reshape_1(*, shape=None, consumed_inputs=None):
    if shape is None:
        raise ValueError("Reshape-1 needs the attribute 'shape'")
    requested = tuple(shape)
    return lambda data: data.reshape(target_shape(data.shape, requested, False))


@kernel("Reshape", since=(5, 13), views=True)
def reshape_5(*, _constants=None):
    return reshape_14(allowzero=0, _constants=_constants)     # a constant shape's shortcut too


@kernel("Reshape", since=(14, 19, 21, 23, 24, 25), views=True)
def reshape_14(*, allowzero=0, _constants=None):
    allow = bool(allowzero)
    # A fed shape's output shape, worked out (every rule checked by target_shape) once per pair of
    # input shape and requested values, the latter keyed by their bytes (int64, 1-D: the bytes are the
    # values): [2, 3] to [2, 3] ~0.45-0.5 against ~0.75-1.1 us a call (bench_core's chain, best of
    # alternating blocks, under load).
    made: dict[tuple, object] = {}

    def reshape(data, shape):
        if shape.dtype is not _INT64 and shape.dtype != _INT64:   # a dtype, not np.int64: cheaper
            raise InvalidValueError(f"the shape input must be int64, got {shape.dtype}")
        if shape.ndim != 1:
            raise InvalidValueError(f"the shape input must be 1-D, got shape {list(shape.shape)}")
        dims = data.shape
        key = (dims, shape.tobytes())
        out = made.get(key)
        if out is None:
            out = target_shape(dims, shape.tolist(), allow)
            if out == dims:
                out = _SAME
            if len(made) < SHAPES_KEPT:
                made[key] = out
        # The same shape: the input itself, as Identity gives it (a view of it would equal it).
        return data if out is _SAME else data.reshape(out)

    fixed = (_constants or {}).get(1)
    if not isinstance(fixed, np.ndarray) or fixed.dtype != _INT64 or fixed.ndim != 1:
        return reshape
    # A constant shape: the output shape worked out once per input shape ([1, 1, 256] -> [1, 256]:
    # ~0.5 against ~1.2 us a call, measured under load).
    requested = tuple(fixed.tolist())
    out_shape = by_shape(lambda in_shape: target_shape(in_shape, requested, allow))

    def reshape_fixed(data, shape):
        if shape is fixed:        # a constant arrives as the very array the factory saw
            return data.reshape(out_shape(data.shape))
        return reshape(data, shape)
    return reshape_fixed


# -- Squeeze / Unsqueeze -------------------------------------------------------------------------

def squeeze(data: np.ndarray, axes) -> np.ndarray:
    """Remove the listed size-1 dims (all size-1 dims when axes is None; none when it is empty, as
    onnx's shape inference reads the spec); a view."""
    return data.reshape(squeezed_shape(data.shape, axes))


def squeezed_shape(shape: tuple, axes) -> tuple:
    if axes is None:
        return tuple(d for d in shape if d != 1)
    ax = normalize_axes(axes, len(shape))
    bad = [a for a in ax if shape[a] != 1]
    if bad:
        raise InvalidValueError(f"cannot squeeze axes {bad} of shape {list(shape)}: "
                                "their size is not 1")
    return tuple(d for k, d in enumerate(shape) if k not in ax)


def unsqueeze(data: np.ndarray, axes) -> np.ndarray:
    """Insert size-1 dims at the listed positions of the output; a view."""
    return data.reshape(unsqueezed_shape(data.shape, axes))


def unsqueezed_shape(shape: tuple, axes) -> tuple:
    out_rank = len(shape) + len(axes)
    ax = set(normalize_axes(axes, out_rank))
    dims = iter(shape)
    return tuple(1 if k in ax else next(dims) for k in range(out_rank))


def _fixed_axes(shape_of, per_call, constants, required: bool):
    """The Squeeze / Unsqueeze function when their `axes` input is a constant (or omitted, when not
    `required`): the output shape made once per input shape (the VAD's Unsqueeze and Squeeze: ~0.7
    against ~3.5 us a call, measured under load)."""
    fixed = constant_lists(constants, (1,), (), {1: "axes"}) if required else \
        constant_lists(constants, (), (1,), {1: "axes"})
    if fixed is None:
        return per_call
    (a0,), (axes,) = fixed
    out_shape = by_shape(lambda shape: shape_of(shape, axes))

    def run(data, axes=None):
        if axes is a0:          # a constant arrives as the very array the factory saw
            return data.reshape(out_shape(data.shape))
        return per_call(data, axes)
    return run


@kernel("Squeeze", since=(1, 11), views=True, rank="squeeze")
def squeeze_1(*, axes=None):
    axes = None if axes is None else list(axes)
    out_shape = by_shape(lambda shape: squeezed_shape(shape, axes))
    return lambda data: data.reshape(out_shape(data.shape))


@kernel("Squeeze", since=(13, 21, 23, 24, 25), views=True, rank="squeeze")
def squeeze_13(*, _constants=None):
    def run(data, axes=None):
        return squeeze(data, None if axes is None else int_list(axes, "axes"))
    return _fixed_axes(squeezed_shape, run, _constants, required=False)


@kernel("Unsqueeze", since=(1, 11), views=True, rank="unsqueeze")
def unsqueeze_1(*, axes):
    axes = list(axes)
    out_shape = by_shape(lambda shape: unsqueezed_shape(shape, axes))
    return lambda data: data.reshape(out_shape(data.shape))


@kernel("Unsqueeze", since=(13, 21, 23, 24, 25), views=True, rank="unsqueeze")
def unsqueeze_13(*, _constants=None):
    def run(data, axes):
        return unsqueeze(data, int_list(axes, "axes"))
    return _fixed_axes(unsqueezed_shape, run, _constants, required=True)


# -- Transpose -----------------------------------------------------------------------------------

@kernel("Transpose", since=(1, 13, 21, 23, 24, 25), views=True, rank="first")
def transpose_1(*, perm=None):
    if perm is None:
        return np.transpose          # reverses the axes; a view
    perm = [int(p) for p in perm]
    if sorted(perm) != list(range(len(perm))):
        raise ValueError(f"perm {perm} is not a permutation of [0, {len(perm) - 1}]")

    def transpose(data):
        if data.ndim != len(perm):
            raise InvalidValueError(f"perm {perm} has {len(perm)} entries but the input has rank {data.ndim}")
        return data.transpose(perm)
    return transpose


# -- DepthToSpace / SpaceToDepth -----------------------------------------------------------------

def _nchw(x: np.ndarray) -> tuple:
    if x.ndim != 4:
        raise InvalidValueError(f"the input must be 4-D [N, C, H, W], got shape {list(x.shape)}")
    return x.shape


def _check_block_attrs(blocksize: int, mode: str) -> None:
    if blocksize < 1:
        raise ValueError(f"blocksize must be >= 1, got {blocksize}")
    if mode not in ("DCR", "CRD"):
        raise ValueError(f"mode must be 'DCR' or 'CRD', got {mode!r}")


def depth_to_space(x: np.ndarray, bs: int, mode: str) -> np.ndarray:
    b, c, h, w = _nchw(x)
    if c % (bs * bs):
        raise InvalidValueError(f"channels {c} are not a multiple of blocksize^2 = {bs * bs}")
    oc = c // (bs * bs)
    if mode == "DCR":   # channel index = (row * bs + col) * oc + depth
        tmp = x.reshape(b, bs, bs, oc, h, w).transpose(0, 3, 4, 1, 5, 2)
    else:               # CRD: channel index = (depth * bs + row) * bs + col
        tmp = x.reshape(b, oc, bs, bs, h, w).transpose(0, 1, 4, 2, 5, 3)
    return tmp.reshape(b, oc, h * bs, w * bs)


def space_to_depth(x: np.ndarray, bs: int, mode: str) -> np.ndarray:
    b, c, h, w = _nchw(x)
    if h % bs or w % bs:
        raise InvalidValueError(f"height {h} and width {w} must be multiples of blocksize {bs}")
    tmp = x.reshape(b, c, h // bs, bs, w // bs, bs)
    # The exact inverse of DepthToSpace in the same mode.
    tmp = tmp.transpose(0, 3, 5, 1, 2, 4) if mode == "DCR" else tmp.transpose(0, 1, 3, 5, 2, 4)
    return tmp.reshape(b, c * bs * bs, h // bs, w // bs)


@kernel("DepthToSpace", since=1)
def depth_to_space_1(*, blocksize):
    return depth_to_space_11(blocksize=blocksize, mode="DCR")


@kernel("DepthToSpace", since=(11, 13, 28))
def depth_to_space_11(*, blocksize, mode="DCR"):
    _check_block_attrs(blocksize, mode)
    return lambda x: depth_to_space(x, blocksize, mode)


@kernel("SpaceToDepth", since=(1, 13))
def space_to_depth_1(*, blocksize):
    return space_to_depth_28(blocksize=blocksize, mode="DCR")


@kernel("SpaceToDepth", since=28)
def space_to_depth_28(*, blocksize, mode="DCR"):
    _check_block_attrs(blocksize, mode)
    return lambda x: space_to_depth(x, blocksize, mode)


# -- Size ----------------------------------------------------------------------------------------

@kernel("Size", since=(1, 13, 19, 21, 23, 24, 25))
def size_1():
    return lambda data: np.array(data.size, dtype=np.int64)
