"""GridSample (16, 20, 22) and AffineGrid (20): sampling an N-D input at normalised grid positions.

GridSample gathers, for every corner of the interpolation stencil at once (1 for nearest, 2^r for
linear, 4^r for cubic), the input values at all output positions with one fancy-index, and sums
them weighted: no loop over output pixels. Normalised positions in [-1, 1] map to pixel
coordinates per align_corners; padding_mode decides what lies outside (zeros, border values, or
reflections). Following torch.nn.functional.grid_sample, which the spec cites: linear and nearest
pad the coordinate itself, cubic pads each of its tap positions.
"""
from __future__ import annotations

import itertools

import numpy as np

from ...errors import InvalidValueError
from ...registry import kernel
from .._common import UPCAST

_MODES_16 = {"bilinear": "linear", "nearest": "nearest", "bicubic": "cubic"}
_MODES_20 = {"linear": "linear", "nearest": "nearest", "cubic": "cubic"}
_CUBIC_A = -0.75


def _text(v):
    return v.decode() if isinstance(v, bytes) else v


@kernel("GridSample", since=16)
def grid_sample_16(*, align_corners=0, mode="bilinear", padding_mode="zeros"):
    return _grid_sample_fn(align_corners, mode, padding_mode, _MODES_16, spatial_ranks=(2,))


@kernel("GridSample", since=(20, 22))
def grid_sample_20(*, align_corners=0, mode="linear", padding_mode="zeros"):
    return _grid_sample_fn(align_corners, mode, padding_mode, _MODES_20, spatial_ranks=None)


def _grid_sample_fn(align_corners, mode, padding_mode, modes, spatial_ranks):
    mode, padding_mode = _text(mode), _text(padding_mode)
    if mode not in modes:
        raise ValueError(f"unknown mode {mode!r} (known: {', '.join(modes)})")
    if padding_mode not in ("zeros", "border", "reflection"):
        raise ValueError(f"unknown padding_mode {padding_mode!r} (known: zeros, border, reflection)")
    kind, align = modes[mode], bool(align_corners)

    def grid_sample(x, grid):
        r = x.ndim - 2
        if r < 1 or (spatial_ranks and r not in spatial_ranks):
            raise InvalidValueError(f"X must have rank {', '.join(str(s + 2) for s in spatial_ranks or (3,))}"
                                    f"{'' if spatial_ranks else ' or more'}, got shape {list(x.shape)}")
        if grid.ndim != r + 2 or grid.shape[0] != x.shape[0] or grid.shape[-1] != r:
            raise InvalidValueError(f"grid must have shape (N, *out, {r}) with N = {x.shape[0]}, got "
                                    f"{list(grid.shape)}")
        return _sample(x, grid, kind, align, padding_mode)
    return grid_sample


def _sample(x: np.ndarray, grid: np.ndarray, kind: str, align: bool, padding: str) -> np.ndarray:
    n, c, sizes = x.shape[0], x.shape[1], x.shape[2:]
    r, out_spatial = len(sizes), grid.shape[1:-1]
    if kind != "nearest" and (x.dtype == object or x.dtype == np.bool_):
        raise InvalidValueError(f"mode {kind!r} needs a numeric input, got {x.dtype}")
    g = grid.astype(np.float64).reshape(n, -1, r)
    # grid's last axis lists coordinates innermost first: g[..., 0] indexes the last spatial axis.
    coords = [_unnormalise(g[..., r - 1 - d], sizes[d], align) for d in range(r)]
    flat = x.reshape(n, c, -1).transpose(0, 2, 1)          # (N, P, C) view: one row of C per position
    strides = [int(np.prod(sizes[d + 1:], dtype=np.int64)) for d in range(r)]
    batch = np.arange(n)[:, None]
    q = g.shape[1]

    def gather(indices):
        """Values at integer positions (per axis (N, Q) arrays, already in range) -> (N, Q, C)."""
        lin = sum(i * s for i, s in zip(indices, strides))
        return flat[batch, lin]

    if kind == "nearest":
        pos = [np.rint(_pad_coord(p, s, align, padding)) for p, s in zip(coords, sizes)]   # half to even
        inside = _inside(pos, sizes)
        idx = [np.clip(p, 0, s - 1).astype(np.intp) for p, s in zip(pos, sizes)]
        out = gather(idx)
        if padding == "zeros" and not inside.all():
            out = np.where(inside[..., None], out, np.zeros((), dtype=out.dtype))
    else:
        work = np.float32 if x.dtype in UPCAST or x.dtype == np.float32 else np.float64
        acc = np.zeros((n, q, c), dtype=np.complex128 if x.dtype.kind == "c" else work)
        if kind == "linear":
            pos = [_pad_coord(p, s, align, padding) for p, s in zip(coords, sizes)]
            base = [np.floor(p) for p in pos]
            stencils = [[(b, 1 - (p - b)), (b + 1, p - b)] for p, b in zip(pos, base)]
        else:
            base = [np.floor(p) for p in coords]
            stencils = [[(b + k - 1, w) for k, w in enumerate(_cubic_weights(p - b))] for p, b in zip(coords, base)]
            stencils = [[(_pad_index(i, s, align, padding), w) for i, w in st] for st, s in zip(stencils, sizes)]
        for corner in itertools.product(*stencils):
            weight = np.prod([w for _, w in corner], axis=0)
            taps = [i for i, _ in corner]
            inside = _inside(taps, sizes)
            idx = [np.clip(i, 0, s - 1).astype(np.intp) for i, s in zip(taps, sizes)]
            if not inside.all():
                weight = np.where(inside, weight, 0.0)    # only 'zeros' padding leaves taps outside
            acc += gather(idx) * weight[..., None].astype(work)
        out = acc
        if x.dtype.kind in "iu":
            info = np.iinfo(x.dtype)
            out = np.clip(np.rint(out), info.min, info.max)
        out = out.astype(x.dtype)
    return np.ascontiguousarray(out.transpose(0, 2, 1)).reshape((n, c) + tuple(out_spatial))


def _unnormalise(g: np.ndarray, size: int, align: bool) -> np.ndarray:
    """[-1, 1] -> pixel coordinates: corner pixel centres (align_corners=1) or their outer edges."""
    if align:
        return (g + 1) / 2 * (size - 1)
    return ((g + 1) * size - 1) / 2


def _reflect(p: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Reflect p into [lo, hi] as often as needed (a mirror at each end)."""
    span = hi - lo
    if span <= 0:
        return np.zeros_like(p)
    d = np.abs(p - lo)
    flips = np.floor(d / span)
    rest = d - flips * span
    return np.where(flips % 2 == 0, lo + rest, hi - rest)


def _pad_coord(p: np.ndarray, size: int, align: bool, padding: str) -> np.ndarray:
    if padding == "border":
        return np.clip(p, 0, size - 1)
    if padding == "reflection":
        p = _reflect(p, 0, size - 1) if align else _reflect(p, -0.5, size - 0.5)
        return np.clip(p, 0, size - 1)
    return p


def _pad_index(i: np.ndarray, size: int, align: bool, padding: str) -> np.ndarray:
    if padding == "zeros":
        return i
    return np.floor(_pad_coord(i, size, align, padding) + 0.5) if padding == "reflection" else \
        np.clip(i, 0, size - 1)


def _inside(positions, sizes) -> np.ndarray:
    ok = np.ones(positions[0].shape, dtype=bool)
    for p, s in zip(positions, sizes):
        ok &= (p >= 0) & (p <= s - 1)
    return ok


def _cubic_weights(t: np.ndarray):
    """Keys' cubic weights (a = -0.75) of the taps at floor-1 .. floor+2 for fractional part t."""
    a = _CUBIC_A

    def near(d):
        return ((a + 2) * d - (a + 3)) * d * d + 1

    def far(d):
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


# -- AffineGrid -----------------------------------------------------------------------------------

@kernel("AffineGrid", since=20)
def affine_grid_20(*, align_corners=0):
    align = bool(align_corners)

    def affine_grid(theta, size):
        dims = [int(v) for v in np.asarray(size).reshape(-1)]
        r = len(dims) - 2
        if r not in (2, 3):
            raise InvalidValueError(f"size must have 4 (2-D) or 5 (3-D) entries, got {dims}")
        if theta.ndim != 3 or theta.shape[1:] != (r, r + 1) or theta.shape[0] != dims[0]:
            raise InvalidValueError(f"theta must have shape ({dims[0]}, {r}, {r + 1}) for size {dims}, got "
                                    f"{list(theta.shape)}")
        spatial = dims[2:]
        axes = [_base_positions(s, align) for s in spatial]         # per spatial axis, outermost first
        mesh = np.meshgrid(*axes, indexing="ij")
        # homogeneous positions ordered (x, y[, z], 1): x runs along the innermost axis
        base = np.stack([m.reshape(-1) for m in reversed(mesh)] + [np.ones(mesh[0].size)], axis=-1)
        t = theta.astype(np.float32) if theta.dtype in UPCAST else theta
        out = np.einsum("pk,njk->npj", base.astype(t.dtype), t)
        return out.reshape([dims[0], *spatial, r]).astype(theta.dtype)
    return affine_grid


def _base_positions(size: int, align: bool) -> np.ndarray:
    if size <= 1:
        return np.zeros(size)
    steps = np.linspace(-1.0, 1.0, size)
    return steps if align else steps * (size - 1) / size
