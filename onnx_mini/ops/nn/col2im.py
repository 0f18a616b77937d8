"""Col2Im (18), and the scatter-add of column blocks back into an image that ConvTranspose shares.

Block b (a point of the block grid) and kernel tap t land on image position b*stride + t*dilation - pad_begin,
per spatial axis; overlapping contributions are summed. The scatter loops over the kernel taps only: each
tap is one strided-slice addition covering every block at once.
"""
from __future__ import annotations

import math

import numpy as np

from ...errors import InvalidValueError
from ...registry import kernel
from .._common import UPCAST, check_shape


def _tap_slices(tap: int, grid: int, out: int, begin: int, stride: int, dil: int):
    """(source slice over the grid, destination slice over the output) for one tap along one axis, or None
    when no block of this tap lands inside the output. Position of block i: i*stride + tap*dil - begin."""
    shift = tap * dil - begin
    lo = max(0, -(shift // stride) if shift < 0 else 0)          # first i with i*stride + shift >= 0
    hi = min(grid, -((shift - out) // stride))                   # first i with i*stride + shift >= out
    if lo >= hi:
        return None
    start = lo * stride + shift
    return slice(lo, hi), slice(start, start + (hi - lo - 1) * stride + 1, stride)


def scatter_blocks(cols: np.ndarray, out_sizes, begin, strides, dilations) -> np.ndarray:
    """cols (N, C, *kernel, *grid) -> image (N, C, *out_sizes) with
    image[n, c, g*s + t*d - begin] += cols[n, c, *t, *g] for the positions inside the image.

    Positions outside the image are dropped; image positions nothing lands on are zero (the empty string for
    strings, which concatenate; False for bool, which ors)."""
    r = len(out_sizes)
    n, c = cols.shape[:2]
    kernel = cols.shape[2:2 + r]
    grid = cols.shape[2 + r:]
    shape = check_shape((n, c, *out_sizes), cols.dtype)
    image = np.full(shape, "", dtype=object) if cols.dtype == object else np.zeros(shape, dtype=cols.dtype)
    if not image.size or not cols.size:
        return image
    for tap in np.ndindex(*kernel):
        parts = [_tap_slices(tap[d], grid[d], out_sizes[d], begin[d], strides[d], dilations[d]) for d in range(r)]
        if any(p is None for p in parts):
            continue
        src = (slice(None), slice(None)) + tap + tuple(p[0] for p in parts)
        dst = (slice(None), slice(None)) + tuple(p[1] for p in parts)
        image[dst] += cols[src]
    return image


def _ints(v, what: str) -> list[int]:
    if v.ndim != 1 or v.dtype.kind not in "iu":
        raise InvalidValueError(f"{what} must be a 1-D integer tensor, got shape {list(v.shape)} of {v.dtype}")
    return [int(i) for i in v]


@kernel("Col2Im", since=18, heavy=True)
def col2im_18(*, dilations=None, pads=None, strides=None):
    for name, v in (("dilations", dilations), ("strides", strides)):
        if v is not None and min(v, default=1) < 1:
            raise ValueError(f"{name} must be positive, got {list(v)}")
    if pads is not None and min(pads, default=0) < 0:
        raise ValueError(f"pads must be >= 0, got {list(pads)}")

    def col2im(data, image_shape, block_shape):
        image = _ints(image_shape, "image_shape")
        block = _ints(block_shape, "block_shape")
        r = len(image)
        if len(block) != r or r < 1:
            raise InvalidValueError(f"image_shape {image} and block_shape {block} must have the same length >= 1")
        st = list(strides) if strides else [1] * r
        dil = list(dilations) if dilations else [1] * r
        p = list(pads) if pads else [0] * (2 * r)
        if len(st) != r or len(dil) != r or len(p) != 2 * r:
            raise InvalidValueError(f"strides {st}, dilations {dil} and pads {p} must have {r}, {r} and {2 * r} "
                                    f"values for an image of rank {r}")
        if min(image) < 0 or min(block) < 1:
            raise InvalidValueError(f"image_shape {image} must be >= 0 and block_shape {block} >= 1")
        if data.ndim != 3:
            raise InvalidValueError(f"input must be 3-D (N, C * prod(block_shape), L), got shape {list(data.shape)}")
        k = math.prod(block)
        if data.shape[1] % k:
            raise InvalidValueError(f"input dimension 1 ({data.shape[1]}) is not a multiple of the block size "
                                    f"{k} (block_shape {block})")
        grid = [(i + p[d] + p[r + d] - ((b - 1) * dl + 1)) // s + 1
                for d, (i, b, dl, s) in enumerate(zip(image, block, dil, st))]
        if min(grid) < 0 or math.prod(grid) != data.shape[2]:
            raise InvalidValueError(f"input has {data.shape[2]} blocks but image_shape {image}, block_shape {block}, "
                                    f"pads {p}, strides {st} and dilations {dil} give a grid of {grid}")
        dtype = data.dtype
        cols = data.astype(np.float32) if dtype in UPCAST else data
        cols = cols.reshape(data.shape[0], data.shape[1] // k, *block, *grid)
        return scatter_blocks(cols, image, p[:r], st, dil).astype(dtype, copy=False)
    return col2im
