"""Object-detection operators (onnx/defs/object_detection): NonMaxSuppression (10, 11) and RoiAlign
(10, 16, 22).

NonMaxSuppression follows the spec and the behaviour of onnxruntime (whose results the official data
reproduces): boxes scoring strictly above score_threshold are candidates (the spec's "boxes with score
less than score_threshold are removed" leaves a score equal to it open; onnxruntime and onnx's
reference drop it too), taken by descending score (ties: lower box index first), and a candidate is
suppressed when its IoU with an already selected box of the same batch and class is strictly greater
than iou_threshold. IoU is computed in float32 (the official boundary test sets the threshold to the
float32 IoU); a box of zero area overlaps nothing.

RoiAlign samples a grid of points in each output bin and interpolates them bilinearly. 'avg' averages
the samples; 'max' is defined, as in onnxruntime and the official data, as the maximum over the sample
points of the largest of the four *weighted corner terms* w_i * v_i of each point (not the maximum of
the interpolated values). Samples are computed per roi and per axis (bilinear interpolation is
separable), the four corners of a sample are two rows and two columns, so a single fancy-index gather
per chunk of rois brings every needed value.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import InvalidValueError
from ..registry import kernel
from ._common import UPCAST


# -- NonMaxSuppression ----------------------------------------------------------------------------

def _scalar_input(x, what: str, default):
    """The value of an optional scalar input given as a 0-d or one-element tensor (default if omitted/empty)."""
    if x is None or x.size == 0:
        return default
    if x.size != 1:
        raise InvalidValueError(f"{what} must hold a single value, got shape {list(x.shape)}")
    return x.reshape(-1)[0]


def _corners(boxes: np.ndarray, center_point_box: int):
    """(y1, x1, y2, x2) with y1 <= y2 and x1 <= x2, each of shape boxes.shape[:-1], in float32."""
    b = boxes.astype(np.float32, copy=False)
    if center_point_box:
        xc, yc, w, h = b[..., 0], b[..., 1], b[..., 2], b[..., 3]
        half_w, half_h = w / np.float32(2), h / np.float32(2)
        x1, x2, y1, y2 = xc - half_w, xc + half_w, yc - half_h, yc + half_h
        return np.minimum(y1, y2), np.minimum(x1, x2), np.maximum(y1, y2), np.maximum(x1, x2)
    return (np.minimum(b[..., 0], b[..., 2]), np.minimum(b[..., 1], b[..., 3]),
            np.maximum(b[..., 0], b[..., 2]), np.maximum(b[..., 1], b[..., 3]))


#: candidates are examined this many at a time (by decreasing score)
_NMS_BLOCK = 128


def _iou(coords, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU (float32) of every box of `a` (indices) with every box of `b`: shape (len(a), len(b)).
    Corners are ordered, so boxes that do not intersect (including boxes of no area) have
    intersection 0 and IoU 0, or NaN for two boxes of no area (0/0), which no threshold test passes."""
    y1, x1, y2, x2, area = coords
    inter = np.minimum(y2[a][:, None], y2[b])
    inter -= np.maximum(y1[a][:, None], y1[b])
    np.maximum(inter, 0, out=inter)
    iw = np.minimum(x2[a][:, None], x2[b])
    iw -= np.maximum(x1[a][:, None], x1[b])
    np.maximum(iw, 0, out=iw)
    inter *= iw
    union = np.add(area[a][:, None], area[b], out=iw)
    union -= inter
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.divide(inter, union, out=inter)


def _greedy_nms(coords, order: np.ndarray, iou_thr, max_out: int) -> np.ndarray:
    """The spec's greedy selection over `order` (candidate indices by decreasing score), vectorised
    block by block: a block's candidates overlapping a box selected before are dropped; inside the
    block, keep[j] = "no kept i < j overlaps j", solved as a fixed point of that rule (it has a single
    solution, reached in at most len(block) rounds, usually two or three)."""
    picked = np.zeros(0, dtype=order.dtype)
    for start in range(0, order.size, _NMS_BLOCK):
        block = order[start:start + _NMS_BLOCK]
        if picked.size:
            block = block[~(_iou(coords, picked, block) > iou_thr).any(axis=0)]
        overlaps = np.triu(_iou(coords, block, block) > iou_thr, 1)    # overlaps[i, j]: i before j
        keep = np.ones(block.size, dtype=bool)
        while True:
            new = ~(keep @ overlaps)
            if (new == keep).all():
                break
            keep = new
        picked = np.concatenate([picked, block[keep][:max_out - picked.size]])
        if picked.size >= max_out:
            break
    return picked


def _nms(center_point_box: int):
    def run(boxes, scores, max_output_boxes_per_class=None, iou_threshold=None, score_threshold=None):
        if boxes.ndim != 3 or boxes.shape[2] != 4:
            raise InvalidValueError(f"boxes must have shape [num_batches, spatial_dimension, 4], "
                                    f"got {list(boxes.shape)}")
        if scores.ndim != 3 or scores.shape[0] != boxes.shape[0] or scores.shape[2] != boxes.shape[1]:
            raise InvalidValueError(f"scores must have shape [num_batches, num_classes, spatial_dimension] = "
                                    f"[{boxes.shape[0]}, C, {boxes.shape[1]}], got {list(scores.shape)}")
        max_out = int(_scalar_input(max_output_boxes_per_class, "max_output_boxes_per_class", 0))
        iou_thr = np.float32(_scalar_input(iou_threshold, "iou_threshold", 0.0))
        if not 0 <= iou_thr <= 1:
            raise InvalidValueError(f"iou_threshold must be in [0, 1], got {iou_thr}")
        score_thr = _scalar_input(score_threshold, "score_threshold", None)
        selected = []
        if max_out > 0:
            y1, x1, y2, x2 = _corners(boxes, center_point_box)
            area = (y2 - y1) * (x2 - x1)
            for b in range(scores.shape[0]):
                coords = (y1[b], x1[b], y2[b], x2[b], area[b])
                for c in range(scores.shape[1]):
                    s = scores[b, c]
                    order = np.argsort(-s, kind="stable")   # decreasing score, ties by box index
                    if score_thr is not None:
                        order = order[s[order] > score_thr]
                    k = _greedy_nms(coords, order, iou_thr, max_out).astype(np.int64)
                    if k.size:
                        selected.append(np.stack([np.full_like(k, b), np.full_like(k, c), k], axis=1))
        if not selected:
            return np.zeros((0, 3), dtype=np.int64)
        return np.concatenate(selected)
    return run


@kernel("NonMaxSuppression", since=(10, 11))
def non_max_suppression_10(*, center_point_box=0):
    if center_point_box not in (0, 1):
        raise ValueError(f"center_point_box must be 0 or 1, got {center_point_box}")
    return _nms(center_point_box)


# -- RoiAlign -------------------------------------------------------------------------------------

#: upper bound on the elements of one chunk's gathered sample values (rois are processed in chunks)
_CHUNK_ELEMENTS = 1 << 20


def _axis_samples(start, bin_size, grid, gmax: int, n_out: int, size: int, dtype):
    """Sample rows (or columns) of every roi along one axis.

    start, bin_size, grid: per roi (R,). Returns (index, weight, present):
    index (R, n_out, 2, gmax) int: the low and high neighbour of each sample (clamped like the spec's
    reference implementation); weight (R, n_out, 2, gmax): their bilinear weights, 0 for a sample
    outside [-1, size] (the whole sample then counts as 0) and for padding; present (R, gmax): which
    of the gmax sample slots exist for the roi (rois with a smaller grid are padded)."""
    g = np.arange(gmax)
    step = bin_size / np.maximum(grid, 1)
    pos = (start[:, None, None] + np.arange(n_out)[None, :, None] * bin_size[:, None, None]
           + (g + 0.5)[None, None, :] * step[:, None, None])                     # (R, n_out, gmax)
    present = g[None, :] < grid[:, None]
    inside = (pos >= -1.0) & (pos <= size) & present[:, None, :]
    pos = np.maximum(pos, 0.0)
    low = np.floor(pos).astype(np.int64)
    top = low >= size - 1
    low = np.where(top, size - 1, low)
    high = np.where(top, size - 1, low + 1)
    frac = np.where(top, 0.0, pos - low)
    index = np.stack([low, high], axis=2)
    weight = np.stack([1.0 - frac, frac], axis=2) * inside[:, :, None, :]
    return index, weight.astype(dtype), present


def _roi_align(mode: str, out_h: int, out_w: int, sampling_ratio: int, spatial_scale: float, half_pixel: bool):
    offset = 0.5 if half_pixel else 0.0

    def run(X, rois, batch_indices):
        if X.ndim != 4:
            raise InvalidValueError(f"X must be 4-D (N, C, H, W), got shape {list(X.shape)}")
        if rois.ndim != 2 or rois.shape[1] != 4:
            raise InvalidValueError(f"rois must have shape [num_rois, 4], got {list(rois.shape)}")
        if batch_indices.shape != (rois.shape[0],):
            raise InvalidValueError(f"batch_indices must have shape [num_rois] = [{rois.shape[0]}], "
                                    f"got {list(batch_indices.shape)}")
        if rois.dtype != X.dtype:
            raise InvalidValueError(f"rois ({rois.dtype}) must have the type of X ({X.dtype})")
        n, c, h, w = X.shape
        bad = (batch_indices < 0) | (batch_indices >= n)
        if bad.any():
            raise InvalidValueError(f"batch_indices {batch_indices[bad].tolist()} out of range [0, {n - 1}]")
        dtype = np.dtype(np.float32) if X.dtype in UPCAST else X.dtype
        num = rois.shape[0]
        out = np.zeros((num, out_h, out_w, c), dtype=dtype)
        if num == 0 or c == 0 or h == 0 or w == 0:
            return out.transpose(0, 3, 1, 2).astype(X.dtype)
        r = rois.astype(np.float64) * spatial_scale - offset        # x1, y1, x2, y2
        if not np.isfinite(r).all():
            raise InvalidValueError("rois must be finite (NaN or infinite coordinates)")
        roi_w, roi_h = r[:, 2] - r[:, 0], r[:, 3] - r[:, 1]
        if not half_pixel:
            roi_w, roi_h = np.maximum(roi_w, 1.0), np.maximum(roi_h, 1.0)
        bin_h, bin_w = roi_h / out_h, roi_w / out_w
        if sampling_ratio > 0:
            grid_h = grid_w = np.full(num, sampling_ratio, dtype=np.int64)
        else:
            grid_h = np.maximum(np.ceil(roi_h / out_h), 0).astype(np.int64)
            grid_w = np.maximum(np.ceil(roi_w / out_w), 0).astype(np.int64)
        count = np.maximum(grid_h * grid_w, 1)
        # channels last, so that one gather brings C contiguous values per sample
        data = np.ascontiguousarray(X.transpose(0, 2, 3, 1), dtype=dtype)
        order = np.argsort(grid_h * grid_w, kind="stable")          # similar grids in the same chunk
        cost = (4 * out_h * out_w * c) * np.maximum(grid_h * grid_w, 1)[order]
        start = 0
        while start < num:
            fits = np.arange(1, num - start + 1) * cost[start:]     # increasing: the chunk's last is its largest
            stop = start + max(1, int(np.searchsorted(fits, _CHUNK_ELEMENTS, side="right")))
            sel = order[start:stop]
            out[sel] = _roi_chunk(data, batch_indices[sel], r[sel, 1], r[sel, 0], bin_h[sel], bin_w[sel],
                                  grid_h[sel], grid_w[sel], count[sel], out_h, out_w, mode, dtype)
            start = stop
        return out.transpose(0, 3, 1, 2).astype(X.dtype, copy=False)
    return run


def _roi_chunk(data, bidx, y0, x0, bin_h, bin_w, grid_h, grid_w, count, out_h, out_w, mode, dtype):
    """Output bins (R, out_h, out_w, C) of a chunk of rois; data is (N, H, W, C)."""
    _, h, w, c = data.shape
    gh, gw = int(grid_h.max()), int(grid_w.max())
    num = bidx.shape[0]
    if gh == 0 or gw == 0:                       # no sample in any roi of the chunk
        return np.zeros((num, out_h, out_w, c), dtype=dtype)
    yi, wy, y_present = _axis_samples(y0, bin_h, grid_h, gh, out_h, h, dtype)   # (R, P, 2, Gh)
    xi, wx, x_present = _axis_samples(x0, bin_w, grid_w, gw, out_w, w, dtype)   # (R, Q, 2, Gw)
    # values[r, p, a, g, q, b, k, :] = data[bidx[r], yi[r, p, a, g], xi[r, q, b, k], :]
    values = data[bidx[:, None, None], yi.reshape(num, -1)[:, :, None], xi.reshape(num, -1)[:, None, :]]
    values = values.reshape(num, out_h, 2, gh, out_w, 2, gw, c)
    if mode == "avg":
        # sum over the corners a, b and samples g, k of wy * wx * value, one axis at a time
        t = wy.reshape(num, out_h, 1, 2 * gh) @ values.reshape(num, out_h, 2 * gh, -1)  # (R, P, 1, Q*2*Gw*C)
        t = wx.reshape(num, 1, out_w, 1, 2 * gw) @ t.reshape(num, out_h, out_w, 2 * gw, c)  # (R, P, Q, 1, C)
        return t[:, :, :, 0] / count[:, None, None, None].astype(dtype)
    terms = (wy[:, :, :, :, None, None, None, None] * wx[:, None, None, None, :, :, :, None]) * values
    samples = terms.max(axis=(2, 5))                                           # (R, P, Gh, Q, Gw, C)
    present = y_present[:, None, :, None, None, None] & x_present[:, None, None, None, :, None]
    samples = np.where(present, samples, -np.inf).max(axis=(2, 4))             # (R, P, Q, C)
    empty = (grid_h == 0) | (grid_w == 0)
    if empty.any():                                                             # no sample: 0
        samples[empty] = 0
    return samples


def _roi_align_factory(mode, output_height, output_width, sampling_ratio, spatial_scale, ctm):
    if mode not in ("avg", "max"):
        raise ValueError(f"mode must be 'avg' or 'max', got {mode!r}")
    if ctm not in ("half_pixel", "output_half_pixel"):
        raise ValueError(f"coordinate_transformation_mode must be 'half_pixel' or 'output_half_pixel', got {ctm!r}")
    if output_height < 1 or output_width < 1:
        raise ValueError(f"output_height and output_width must be positive, got {output_height}, {output_width}")
    if sampling_ratio < 0:
        raise ValueError(f"sampling_ratio must be >= 0, got {sampling_ratio}")
    if not math.isfinite(spatial_scale):
        raise ValueError(f"spatial_scale must be finite, got {spatial_scale}")
    return _roi_align(mode, output_height, output_width, sampling_ratio, spatial_scale, ctm == "half_pixel")


@kernel("RoiAlign", since=10)
def roi_align_10(*, mode="avg", output_height=1, output_width=1, sampling_ratio=0, spatial_scale=1.0):
    # Version 10 has no coordinate_transformation_mode: it behaves as 'output_half_pixel'.
    return _roi_align_factory(mode, output_height, output_width, sampling_ratio, spatial_scale,
                              "output_half_pixel")


@kernel("RoiAlign", since=(16, 22))
def roi_align_16(*, coordinate_transformation_mode="half_pixel", mode="avg", output_height=1,
                 output_width=1, sampling_ratio=0, spatial_scale=1.0):
    return _roi_align_factory(mode, output_height, output_width, sampling_ratio, spatial_scale,
                              coordinate_transformation_mode)
