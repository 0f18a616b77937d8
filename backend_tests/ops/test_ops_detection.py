"""Spec tests for the object-detection operators: NonMaxSuppression (10, 11), RoiAlign (10, 16, 22).

NMS expectations are worked out by hand from the boxes' overlaps. RoiAlign is checked against values
computed by hand for small cases and against `roi_align_ref`, a slow per-sample transcription of the
algorithm the spec names (Mask R-CNN RoiAlign; 'max' as in onnxruntime and the official data: the
maximum over sample points of the largest weighted corner term).
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from onnx_mini.errors import InvalidNodeError, KernelError

from helpers import NODE, assert_same, np_type, run_node, type_params, versions


def i64(values) -> np.ndarray:
    return np.array(values, dtype=np.int64).reshape(-1, 3)


def f32(values) -> np.ndarray:
    return np.array(values, dtype=np.float32)


# -- NonMaxSuppression -------------------------------------------------------------------------

NMS_VERSIONS = versions("NonMaxSuppression")

# Four boxes [y1, x1, y2, x2]: 0 and 1 overlap with IoU 0.5/1.5 (1/3); 0 and 2 with IoU 0.9/1.1
# (~0.82); 1 and 2 with IoU 0.6/1.4 (~0.43); 3 is far away. By score: 0, 2, 1, 3.
BOXES = f32([[[0, 0, 1, 1], [0, 0.5, 1, 1.5], [0, 0.1, 1, 1.1], [5, 5, 6, 6]]])
SCORES = f32([[[0.9, 0.8, 0.85, 0.3]]])


def to_center(b: np.ndarray) -> np.ndarray:
    """[y1, x1, y2, x2] -> [x_center, y_center, width, height]."""
    y1, x1, y2, x2 = np.moveaxis(b, -1, 0)
    return np.stack([(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1], axis=-1).astype(np.float32)


def nms(version, boxes, scores, *rest, **attrs):
    return run_node("NonMaxSuppression", version, [boxes, scores, *rest], **attrs)


@pytest.mark.parametrize("version", NMS_VERSIONS)
@pytest.mark.parametrize("iou,score,max_out,expected", [
    (0.5, 0.0, 10, [0, 1, 3]),        # 2 goes (IoU 0.82 with 0); 1 stays (1/3 with 0)
    (0.3, 0.0, 10, [0, 3]),           # 1 goes too
    (0.9, 0.0, 10, [0, 2, 1, 3]),     # nothing overlaps more than 0.9
    (0.5, 0.5, 10, [0, 1]),           # 3 scores below the threshold
    (0.5, 0.0, 2, [0, 1]),            # at most two per class
    (0.5, 0.0, 1, [0]),
    (0.5, 0.0, 0, []),
    (1.0, 0.0, 10, [0, 2, 1, 3]),     # IoU never exceeds 1
    (0.0, 0.0, 10, [0, 3]),           # any overlap suppresses
    (0.5, 0.9, 10, []),               # a score equal to the threshold is not above it
    (0.5, 0.85, 10, [0]),
])
def test_nms_thresholds(version, iou, score, max_out, expected):
    inputs = [np.array([max_out], np.int64), f32([iou]), f32([score])]
    want = i64([[0, 0, k] for k in expected])
    assert_same(nms(version, BOXES, SCORES, *inputs), want)
    # the same boxes in the center-point format select the same indices
    assert_same(nms(version, to_center(BOXES), SCORES, *inputs, center_point_box=1), want)


@pytest.mark.parametrize("version", NMS_VERSIONS)
def test_nms_any_corner_order(version):
    # each box given by another pair of diagonal corners, or with its corners swapped
    flipped = BOXES[..., [2, 3, 0, 1]].copy()
    flipped[0, 1] = [1, 0.5, 0, 1.5]            # (y2, x1, y1, x2): the other diagonal
    args = [np.array([10], np.int64), f32([0.5]), f32([0.0])]
    assert_same(nms(version, flipped, SCORES, *args), i64([[0, 0, 0], [0, 0, 1], [0, 0, 3]]))


@pytest.mark.parametrize("version", NMS_VERSIONS)
def test_nms_center_point_format_by_hand(version):
    # [xc, yc, w, h]: box 0 is [0, 0]-[2, 2], box 1 [1, 0]-[3, 2] (IoU 2/6), box 2 [0.5, 0]-[2.5, 2] (IoU 3/5)
    boxes = f32([[[1, 1, 2, 2], [2, 1, 2, 2], [1.5, 1, 2, 2]]])
    scores = f32([[[0.5, 0.7, 0.6]]])
    args = [np.array([5], np.int64), f32([0.4])]
    # 1 first; 2 has IoU 3/5 with 1: gone; 0 has IoU 1/3 with 1: kept
    assert_same(nms(version, boxes, scores, *args, center_point_box=1), i64([[0, 0, 1], [0, 0, 0]]))
    # read as corners, the same numbers are other boxes: [y1, x1, y2, x2] = [1, 1, 2, 2], [2, 1, 2, 2] (no
    # area: overlaps nothing), [1.5, 1, 2, 2]: IoU(0, 2) = 0.5 -> 0 goes at 0.4, stays at 0.55
    assert_same(nms(version, boxes, scores, *args), i64([[0, 0, 1], [0, 0, 2]]))
    assert_same(nms(version, boxes, scores, *args[:1], f32([0.55])), i64([[0, 0, 1], [0, 0, 2], [0, 0, 0]]))


@pytest.mark.parametrize("version", NMS_VERSIONS)
def test_nms_iou_equal_to_threshold_is_kept(version):
    boxes = f32([[[0, 0, 1, 1], [0, 0.5, 1, 1.5]]])        # IoU 0.5 / 1.5 = 1/3 in float32
    scores = f32([[[0.9, 0.8]]])
    thr = np.float32(0.5) / np.float32(1.5)
    args = [np.array([5], np.int64)]
    assert_same(nms(version, boxes, scores, *args, f32([thr])), i64([[0, 0, 0], [0, 0, 1]]))
    assert_same(nms(version, boxes, scores, *args, f32([np.nextafter(thr, np.float32(0))])), i64([[0, 0, 0]]))


@pytest.mark.parametrize("version", NMS_VERSIONS)
def test_nms_batches_and_classes_order(version):
    # output: batch by batch, class by class, each class's boxes by decreasing score
    boxes = np.concatenate([BOXES, BOXES[:, ::-1]], axis=0)            # batch 1: boxes in reverse order
    scores = np.stack([np.concatenate([SCORES[0], SCORES[0, :, ::-1]]),
                       np.concatenate([SCORES[0, :, ::-1], f32([[0.1, 0.2, 0.3, 0.4]])])])
    args = [np.array([10], np.int64), f32([0.5])]
    want = i64([[0, 0, 0], [0, 0, 1], [0, 0, 3],
                # class 1 of batch 0, scores 0.3, 0.85, 0.8, 0.9: 3, 1, 2 (IoU(1, 2) = 0.43), not 0
                [0, 1, 3], [0, 1, 1], [0, 1, 2],
                # batch 1 holds the boxes reversed (box k is BOXES[3 - k]): class 0 as class 0 of batch 0
                [1, 0, 3], [1, 0, 2], [1, 0, 0],
                # class 1, scores 0.1, 0.2, 0.3, 0.4: 3 (BOXES[0]), 2 (BOXES[1]), 1 (BOXES[2]) goes, 0 far
                [1, 1, 3], [1, 1, 2], [1, 1, 0]])
    assert_same(nms(version, boxes, scores, *args), want)


@pytest.mark.parametrize("version", NMS_VERSIONS)
def test_nms_ties_by_index_and_identical_boxes(version):
    boxes = np.repeat(f32([[[0, 0, 1, 1]]]), 4, axis=1)
    scores = f32([[[0.5, 0.7, 0.7, 0.7]]])
    assert_same(nms(version, boxes, scores, np.array([3], np.int64), f32([0.5])), i64([[0, 0, 1]]))


@pytest.mark.parametrize("version", NMS_VERSIONS)
def test_nms_optional_inputs(version):
    empty = np.zeros((0, 3), np.int64)
    assert_same(nms(version, BOXES, SCORES), empty)                   # max_output_boxes_per_class = 0
    # iou_threshold defaults to 0 (any overlap suppresses), no score threshold
    assert_same(nms(version, BOXES, SCORES, np.array([10], np.int64)), i64([[0, 0, 0], [0, 0, 3]]))
    # scalar inputs, an omitted iou_threshold in the middle
    assert_same(nms(version, BOXES, SCORES, np.array(10, np.int64), None, np.array(0.5, np.float32)),
                i64([[0, 0, 0]]))


@pytest.mark.parametrize("version", NMS_VERSIONS)
def test_nms_degenerate_boxes_and_empty(version):
    # a box of zero area overlaps nothing, even itself
    boxes = f32([[[0, 0, 0, 1], [0, 0, 0, 1], [0, 0, 1, 1]]])
    scores = f32([[[0.9, 0.8, 0.7]]])
    assert_same(nms(version, boxes, scores, np.array([5], np.int64), f32([0.0])),
                i64([[0, 0, 0], [0, 0, 1], [0, 0, 2]]))
    assert_same(nms(version, np.zeros((2, 0, 4), np.float32), np.zeros((2, 3, 0), np.float32),
                    np.array([5], np.int64)), np.zeros((0, 3), np.int64))
    assert_same(nms(version, BOXES, np.zeros((1, 0, 4), np.float32), np.array([5], np.int64)),
                np.zeros((0, 3), np.int64))


@pytest.mark.parametrize("version", NMS_VERSIONS)
@pytest.mark.parametrize("block", [128, 5])
def test_nms_many_boxes_against_pairwise_rule(version, block, monkeypatch):
    # random boxes: the result obeys the spec's rule, checked pair by pair; candidates are examined
    # a block at a time (a small block: many blocks, suppression across blocks)
    from onnx_mini.ops import object_detection
    monkeypatch.setattr(object_detection, "_NMS_BLOCK", block)
    rng = np.random.default_rng(3)
    corner = rng.uniform(0, 10, (2, 60, 2)).astype(np.float32)
    boxes = np.concatenate([corner, corner + rng.uniform(0.5, 3, (2, 60, 2)).astype(np.float32)], axis=2)
    scores = rng.uniform(0, 1, (2, 3, 60)).astype(np.float32)
    out = nms(version, boxes, scores, np.array([1000], np.int64), f32([0.3]), f32([0.2]))
    limited = nms(version, boxes, scores, np.array([7], np.int64), f32([0.3]), f32([0.2]))

    def iou(a, b):
        ih = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
        iw = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
        inter = ih * iw
        return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)

    for b in range(2):
        for c in range(3):
            got = [k for bb, cc, k in out.tolist() if (bb, cc) == (b, c)]
            kept = []
            for k in sorted(range(60), key=lambda k: -scores[b, c, k]):
                if scores[b, c, k] > 0.2 and all(iou(boxes[b, k], boxes[b, j]) <= 0.3 for j in kept):
                    kept.append(k)
            assert got == kept and len(kept) > 7
            assert [k for bb, cc, k in limited.tolist() if (bb, cc) == (b, c)] == kept[:7]


@pytest.mark.parametrize("version", NMS_VERSIONS)
@pytest.mark.parametrize("boxes,scores,rest,pattern", [
    (np.zeros((1, 3, 3), np.float32), np.zeros((1, 1, 3), np.float32), [], "boxes must have shape"),
    (np.zeros((3, 4), np.float32), np.zeros((1, 1, 3), np.float32), [], "boxes must have shape"),
    (np.zeros((1, 3, 4), np.float32), np.zeros((1, 1, 4), np.float32), [], "scores must have shape"),
    (np.zeros((1, 3, 4), np.float32), np.zeros((2, 1, 3), np.float32), [], "scores must have shape"),
    (BOXES, SCORES, [np.array([3], np.int64), f32([1.5])], "iou_threshold"),
    (BOXES, SCORES, [np.array([3, 4], np.int64)], "max_output_boxes_per_class"),
])
def test_nms_errors(version, boxes, scores, rest, pattern):
    with pytest.raises(KernelError, match=f"{NODE}.*{pattern}"):
        nms(version, boxes, scores, *rest)


@pytest.mark.parametrize("version", NMS_VERSIONS)
def test_nms_bad_center_point_box(version):
    with pytest.raises(InvalidNodeError, match=f"{NODE}.*center_point_box"):
        nms(version, BOXES, SCORES, center_point_box=2)


# -- RoiAlign ------------------------------------------------------------------------------------

ROI_VERSIONS = versions("RoiAlign")


def bilinear_terms(img, y, x):
    """The four weighted corner terms of the sample (y, x) (all 0 outside [-1, H] x [-1, W])."""
    h, w = img.shape
    if y < -1 or y > h or x < -1 or x > w:
        return [0.0] * 4
    y, x = max(y, 0.0), max(x, 0.0)
    y0, x0 = int(y), int(x)
    y1, x1 = y0 + 1, x0 + 1
    if y0 >= h - 1:
        y0 = y1 = h - 1
        y = float(y0)
    if x0 >= w - 1:
        x0 = x1 = w - 1
        x = float(x0)
    ly, lx = y - y0, x - x0
    return [(1 - ly) * (1 - lx) * img[y0, x0], (1 - ly) * lx * img[y0, x1],
            ly * (1 - lx) * img[y1, x0], ly * lx * img[y1, x1]]


def roi_align_ref(x, rois, batch, out_h=1, out_w=1, sampling_ratio=0, spatial_scale=1.0, mode="avg",
                  half_pixel=True):
    x = x.astype(np.float64)
    out = np.zeros((len(rois), x.shape[1], out_h, out_w))
    off = 0.5 if half_pixel else 0.0
    for r, (x1, y1, x2, y2) in enumerate(rois.astype(np.float64)):
        sx, sy = x1 * spatial_scale - off, y1 * spatial_scale - off
        rw, rh = x2 * spatial_scale - off - sx, y2 * spatial_scale - off - sy
        if not half_pixel:
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        bh, bw = rh / out_h, rw / out_w
        gh = sampling_ratio if sampling_ratio > 0 else max(math.ceil(rh / out_h), 0)
        gw = sampling_ratio if sampling_ratio > 0 else max(math.ceil(rw / out_w), 0)
        for c in range(x.shape[1]):
            img = x[batch[r], c]
            for p in range(out_h):
                for q in range(out_w):
                    vals = []
                    for iy in range(gh):
                        for ix in range(gw):
                            terms = bilinear_terms(img, sy + p * bh + (iy + 0.5) * bh / gh,
                                                   sx + q * bw + (ix + 0.5) * bw / gw)
                            vals.append(sum(terms) if mode == "avg" else max(terms))
                    if vals:
                        out[r, c, p, q] = sum(vals) / max(gh * gw, 1) if mode == "avg" else max(vals)
    return out


def roi_align(version, x, rois, batch, **attrs):
    return run_node("RoiAlign", version, [x, rois, np.asarray(batch, np.int64)], **attrs)


GRID = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)   # value 4 * y + x


@pytest.mark.parametrize("version", ROI_VERSIONS)
def test_roi_align_by_hand(version):
    rois = f32([[0, 0, 3, 3]])
    half = {} if version == 10 else {"coordinate_transformation_mode": "half_pixel"}
    legacy = {} if version == 10 else {"coordinate_transformation_mode": "output_half_pixel"}
    # one sample at the roi's center: (1.5, 1.5) without the half-pixel shift, (1, 1) with it
    assert_same(roi_align(version, GRID, rois, [0], sampling_ratio=1, **legacy), f32([[[[7.5]]]]))
    if version > 10:
        assert_same(roi_align(version, GRID, rois, [0], sampling_ratio=1, **half), f32([[[[5.0]]]]))
        assert_same(roi_align(version, GRID, rois, [0], sampling_ratio=1), f32([[[[5.0]]]]))  # the default
    # max: the largest weighted corner term at (1.5, 1.5): 0.25 * 10
    assert_same(roi_align(version, GRID, rois, [0], sampling_ratio=1, mode="max", **legacy), f32([[[[2.5]]]]))
    # 2x2 bins of 1.5 with 2x2 samples each: samples at 0.375 and 1.125 (+ 1.5); the average of a
    # linear function is its value at the bin's center (0.75 or 2.25)
    assert_same(roi_align(version, GRID, rois, [0], output_height=2, output_width=2, sampling_ratio=2, **legacy),
                f32([[[[3.75, 5.25], [9.75, 11.25]]]]))
    # spatial_scale halves the roi [0, 0, 6, 6] -> [0, 0, 3, 3]
    assert_same(roi_align(version, GRID, f32([[0, 0, 6, 6]]), [0], sampling_ratio=1, spatial_scale=0.5, **legacy),
                f32([[[[7.5]]]]))


def roi_case(seed, n=2, c=3, h=6, w=7, num=5):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    x1y1 = rng.uniform(-2, 6, (num, 2))
    rois = np.concatenate([x1y1, x1y1 + rng.uniform(0, 5, (num, 2))], axis=1).astype(np.float32)
    rois[0] = [0.2, 0.3, 0.2, 0.3]                     # an empty roi
    rois[1] = [-3, -3, 9, 8]                           # overflowing the image on every side
    return x, rois, rng.integers(0, n, num)


@pytest.mark.parametrize("version,ctm", [(v, m) for v in ROI_VERSIONS for m in ("half_pixel", "output_half_pixel")
                                         if v > 10 or m == "output_half_pixel"])   # 10: output_half_pixel only
@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("sampling_ratio,out_hw,scale", [(0, (2, 3), 1.0), (2, (3, 2), 1.0), (1, (1, 1), 0.5),
                                                        (0, (4, 4), 0.75), (3, (2, 2), 1.25)])
def test_roi_align_against_reference(version, mode, ctm, sampling_ratio, out_hw, scale):
    x, rois, batch = roi_case(sampling_ratio * 7 + out_hw[0])
    attrs = dict(mode=mode, output_height=out_hw[0], output_width=out_hw[1], sampling_ratio=sampling_ratio,
                 spatial_scale=scale)
    got = roi_align(version, x, rois, batch, **attrs, **({} if version == 10 else
                                                          {"coordinate_transformation_mode": ctm}))
    want = roi_align_ref(x, rois, batch, *out_hw, sampling_ratio, scale, mode, ctm == "half_pixel")
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("chunk", [1 << 20, 300])
def test_roi_align_adaptive_grids_of_many_sizes(chunk, monkeypatch):
    # sampling_ratio 0: each roi has its own grid (1 to 12 samples per axis), rois of every size mixed;
    # with a small chunk budget the rois are processed a few at a time (one alone when it is large)
    from onnx_mini.ops import object_detection
    monkeypatch.setattr(object_detection, "_CHUNK_ELEMENTS", chunk)
    rng = np.random.default_rng(11)
    x = rng.standard_normal((1, 2, 30, 30)).astype(np.float32)
    sizes = rng.uniform(0.5, 24, (12, 2))
    rois = np.concatenate([np.zeros((12, 2)) + 2, 2 + sizes], axis=1).astype(np.float32)
    for mode in ("avg", "max"):
        got = roi_align(16, x, rois, np.zeros(12), output_height=2, output_width=2, mode=mode)
        want = roi_align_ref(x, rois, np.zeros(12, int), 2, 2, 0, 1.0, mode, True)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("version,tname", type_params("RoiAlign", ROI_VERSIONS, "T1"))
def test_roi_align_every_type(version, tname):
    dt = np_type(tname)
    x, rois, batch = roi_case(5)
    x, rois = x.astype(dt), rois.astype(dt)
    for mode in ("avg", "max"):
        got = roi_align(version, x, rois, batch, mode=mode, output_height=2, output_width=2, sampling_ratio=2)
        assert got.dtype == dt and got.shape == (5, 3, 2, 2)
        want = roi_align_ref(x.astype(np.float32), rois.astype(np.float32), batch, 2, 2, 2, 1.0, mode,
                             version > 10)
        tol = {np.dtype(np.float16): 2e-3, np.dtype(ml_dtypes.bfloat16): 1e-2}.get(dt, 1e-6)
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol)
    if dt == np.float64:   # float64 is computed in float64
        got = roi_align(version, x * (1 + 1e-12), rois, batch, sampling_ratio=1)
        assert not np.array_equal(got, roi_align(version, x, rois, batch, sampling_ratio=1))


@pytest.mark.parametrize("version", ROI_VERSIONS)
def test_roi_align_empty(version):
    x, _, _ = roi_case(1)
    assert_same(roi_align(version, x, np.zeros((0, 4), np.float32), [], output_height=2, output_width=3),
                np.zeros((0, 3, 2, 3), np.float32))
    assert_same(roi_align(version, x[:, :0], f32([[0, 0, 2, 2]]), [1], output_height=2),
                np.zeros((1, 0, 2, 1), np.float32))


@pytest.mark.parametrize("version", ROI_VERSIONS)
@pytest.mark.parametrize("x,rois,batch,pattern", [
    (GRID, f32([[0, 0, 3, 3]]), [1], "batch_indices"),
    (GRID, f32([[0, 0, 3, 3]]), [-1], "batch_indices"),
    (GRID, f32([[0, 0, 3, 3]]), [0, 0], "batch_indices must have shape"),
    (GRID, f32([[0, 0, 3]]), [0], "rois must have shape"),
    (GRID[0], f32([[0, 0, 3, 3]]), [0], "X must be 4-D"),
    (GRID, f32([[0, 0, np.nan, 3]]), [0], "finite"),
    (GRID, f32([[0, -np.inf, 3, 3]]), [0], "finite"),
    (GRID, np.zeros((1, 4), np.float64), [0], "type of X"),
])
def test_roi_align_errors(version, x, rois, batch, pattern):
    with pytest.raises(KernelError, match=f"{NODE}.*{pattern}"):
        roi_align(version, x, rois, batch)


@pytest.mark.parametrize("version,attrs,pattern", [
    (10, {"mode": "min"}, "mode"), (16, {"mode": "sum"}, "mode"),
    (16, {"coordinate_transformation_mode": "asymmetric"}, "coordinate_transformation_mode"),
    (22, {"output_height": 0}, "output_height"), (22, {"sampling_ratio": -1}, "sampling_ratio"),
    (10, {"coordinate_transformation_mode": "half_pixel"}, "coordinate_transformation_mode"),
])
def test_roi_align_bad_attributes(version, attrs, pattern):
    with pytest.raises(InvalidNodeError, match=f"{NODE}.*{pattern}"):
        roi_align(version, GRID, f32([[0, 0, 3, 3]]), [0], **attrs)
