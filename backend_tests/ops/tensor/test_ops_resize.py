"""Resize and Upsample against a slow, obviously-correct implementation written from the spec text.

The reference below loops over every output element and every axis in plain Python: x_original from
the coordinate_transformation_mode formula, then the 1-D rule of the mode (nearest rounding, linear
or Keys cubic with taps at floor(x)-1 .. floor(x)+2, antialias stretching the filter by 1/scale),
with edge values outside the input, exclude_outside renormalising, and extrapolation_value for
tf_crop_and_resize. It shares no code with onnx_mini/ops/tensor/resize.py.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnx_mini
from onnx_mini.errors import InvalidNodeError, KernelError

from helpers import np_type, sample, type_matrix


# -- the slow reference ---------------------------------------------------------------------------

def ref_coord(mode, xr, n_in, n_out_f, scale, start=0.0, end=1.0):
    if mode == "half_pixel":
        return (xr + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        adjustment = math.floor(n_out_f) / n_out_f
        return n_in / 2 * (1 - adjustment) + (xr + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (xr + 0.5) / scale - 0.5 if n_out_f > 1 else 0.0
    if mode == "align_corners":
        return xr * (n_in - 1) / (n_out_f - 1) if n_out_f > 1 else 0.0
    if mode == "asymmetric":
        return xr / scale
    if mode == "tf_half_pixel_for_nn":
        return (xr + 0.5) / scale
    assert mode == "tf_crop_and_resize"
    if n_out_f > 1:
        return start * (n_in - 1) + xr * (end - start) * (n_in - 1) / (n_out_f - 1)
    return 0.5 * (start + end) * (n_in - 1)


def ref_weights_1d(x, n, mode, nearest_mode, a, exclude_outside, antialias, scale):
    """[(input index, weight)] for one coordinate; indices may lie outside [0, n-1]."""
    if mode == "nearest":
        frac = x - math.floor(x)
        if nearest_mode == "floor":
            i = math.floor(x)
        elif nearest_mode == "ceil":
            i = math.ceil(x)
        elif nearest_mode == "round_prefer_floor":
            i = math.floor(x) if frac <= 0.5 else math.ceil(x)
        else:
            i = math.floor(x) if frac < 0.5 else math.ceil(x)
        return [(i, 1.0)]
    stretch = max(1.0, 1.0 / scale) if antialias else 1.0
    if not antialias:
        x0 = math.floor(x)
        s = x - x0
        if mode == "linear":
            taps = [(x0, 1 - s), (x0 + 1, s)]
        else:   # Keys (1981), coefficients of the 4 neighbours as polynomials in s
            taps = [(x0 - 1, ((a * (s + 1) - 5 * a) * (s + 1) + 8 * a) * (s + 1) - 4 * a),
                    (x0, ((a + 2) * s - (a + 3)) * s * s + 1),
                    (x0 + 1, ((a + 2) * (1 - s) - (a + 3)) * (1 - s) * (1 - s) + 1),
                    (x0 + 2, ((a * (2 - s) - 5 * a) * (2 - s) + 8 * a) * (2 - s) - 4 * a)]
    else:
        taps = []
        for j in range(math.floor(x) - 10, math.floor(x) + 12):
            t = abs(j - x) / stretch
            if mode == "linear":
                w = max(0.0, 1 - t)
            elif t <= 1:
                w = (a + 2) * t ** 3 - (a + 3) * t ** 2 + 1
            elif t < 2:
                w = a * t ** 3 - 5 * a * t ** 2 + 8 * a * t - 4 * a
            else:
                w = 0.0
            taps.append((j, w))
    if exclude_outside:
        taps = [(j, w if 0 <= j < n else 0.0) for j, w in taps]
    total = sum(w for _, w in taps)
    return [(j, w / total) for j, w in taps]


def ref_resize(x, out_shape, scales, out_f, mode="nearest", coord="half_pixel", nearest_mode="round_prefer_floor",
               a=-0.75, exclude_outside=0, extrapolation=0.0, antialias=0, roi=None):
    r = x.ndim
    y = np.zeros(out_shape, dtype=np.float64)
    for out_idx in itertools.product(*[range(d) for d in out_shape]):
        per_axis, outside = [], False
        for d in range(r):
            start, end = (roi[d], roi[r + d]) if roi is not None else (0.0, 1.0)
            if out_shape[d] == x.shape[d] and scales[d] == 1 and coord not in ("tf_crop_and_resize",
                                                                               "tf_half_pixel_for_nn"):
                per_axis.append([(out_idx[d], 1.0)])
                continue
            xo = ref_coord(coord, out_idx[d], x.shape[d], out_f[d], scales[d], start, end)
            if coord == "tf_crop_and_resize" and not 0 <= xo <= x.shape[d] - 1:
                outside = True
            per_axis.append(ref_weights_1d(xo, x.shape[d], mode, nearest_mode, a, exclude_outside, antialias,
                                           scales[d]))
        if outside:
            y[out_idx] = extrapolation
            continue
        total = 0.0
        for combo in itertools.product(*per_axis):
            w = math.prod(wt for _, wt in combo)
            idx = tuple(min(max(j, 0), x.shape[d] - 1) for d, (j, _) in enumerate(combo))
            total += w * float(x[idx])
        y[out_idx] = total
    return y


# -- running onnx_mini ----------------------------------------------------------------------------

def run_resize(version, x, roi=None, scales=None, sizes=None, **attrs):
    names = ["X", "roi" if roi is not None else "", "scales" if scales is not None else "",
             "sizes" if sizes is not None else ""]
    while names[-1] == "":
        names.pop()
    if version == 10:
        names = ["X", "scales"]
    node = helper.make_node("Resize", names, ["Y"], **attrs)
    feeds = {"X": x, "roi": roi, "scales": scales, "sizes": sizes}
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT if n in ("roi", "scales") else
                                            TensorProto.INT64 if n == "sizes" else
                                            helper.np_dtype_to_tensor_dtype(x.dtype) if x.dtype != object
                                            else TensorProto.STRING, None) for n in names if n]
    graph = helper.make_graph([node], "g", inputs, [helper.make_empty_tensor_value_info("Y")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", version)], ir_version=10)
    return onnx_mini.prepare(model).run({n: feeds[n] for n in names if n})[0]


X = np.array([[[[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]]], dtype=np.float32) ** 1.5

COORDS = {11: ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_half_pixel_for_nn",
               "tf_crop_and_resize"],
          13: ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_crop_and_resize"],
          18: ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
               "tf_crop_and_resize"]}
COORDS[19] = COORDS[18]
MODES = [("nearest", "round_prefer_floor"), ("nearest", "round_prefer_ceil"), ("nearest", "floor"),
         ("nearest", "ceil"), ("linear", None), ("cubic", None)]
ROI = np.array([0, 0, 0.2, 0.1, 1, 1, 0.9, 0.8], dtype=np.float32)


@pytest.mark.parametrize("version", [11, 13, 18, 19])
@pytest.mark.parametrize("mode, nearest_mode", MODES)
@pytest.mark.parametrize("target", ["scales_up", "scales_down", "sizes"])
def test_resize_matrix_against_the_slow_reference(version, mode, nearest_mode, target):
    for coord in COORDS[version]:
        attrs = {"mode": mode, "coordinate_transformation_mode": coord}
        if nearest_mode:
            attrs["nearest_mode"] = nearest_mode
        roi = ROI if coord == "tf_crop_and_resize" else None
        roi_v = roi.astype(np.float64) if roi is not None else np.array([0, 0, 0, 0, 1, 1, 1, 1.0])
        span = roi_v[4:] - roi_v[:4]
        if target == "sizes":
            sizes = np.array([1, 1, 5, 3], dtype=np.int64)
            scales_used = sizes / np.array(X.shape)
            out_f = sizes.astype(np.float64)
            got = run_resize(version, X, roi=roi if roi is not None else
                             (np.array([], np.float32) if version == 11 else None),
                             scales=np.array([], np.float32) if version == 11 else None, sizes=sizes, **attrs)
            out_shape = tuple(sizes)
        else:
            sc = np.array([1, 1, 1.7, 2.3] if target == "scales_up" else [1, 1, 0.7, 0.6], dtype=np.float32)
            scales_used = sc.astype(np.float64)
            out_f = np.array(X.shape) * span * scales_used
            out_shape = tuple(int(math.floor(v)) for v in out_f)
            got = run_resize(version, X, roi=roi if roi is not None else
                             (np.array([], np.float32) if version == 11 else None), scales=sc, **attrs)
        exp = ref_resize(X, out_shape, scales_used, out_f, mode=mode, coord=coord,
                         nearest_mode=nearest_mode or "round_prefer_floor", extrapolation=-7.0 if roi is not None
                         else 0.0, roi=roi_v if roi is not None else None) if coord != "tf_crop_and_resize" else \
            ref_resize(X, out_shape, scales_used, out_f, mode=mode, coord=coord,
                       nearest_mode=nearest_mode or "round_prefer_floor", roi=roi_v)
        assert got.dtype == np.float32 and got.shape == out_shape, (coord, got.shape, out_shape)
        np.testing.assert_allclose(got, exp, rtol=1e-5, atol=1e-5, err_msg=f"{version} {mode} {coord}")


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("exclude_outside, antialias", [(0, 1), (1, 0), (1, 1)])
def test_antialias_and_exclude_outside(mode, exclude_outside, antialias):
    x = np.arange(1, 1 + 6 * 7, dtype=np.float32).reshape(1, 1, 6, 7) ** 1.3
    sc = np.array([1, 1, 0.45, 0.6], dtype=np.float32)
    got = run_resize(19, x, scales=sc, mode=mode, exclude_outside=exclude_outside, antialias=antialias,
                     cubic_coeff_a=-0.5)
    out_f = np.array(x.shape) * sc.astype(np.float64)
    exp = ref_resize(x, tuple(int(v) for v in np.floor(out_f)), sc.astype(np.float64), out_f, mode=mode,
                     a=-0.5, exclude_outside=exclude_outside, antialias=antialias)
    np.testing.assert_allclose(got, exp, rtol=1e-5, atol=1e-5)


def test_tf_crop_and_resize_extrapolation_value():
    roi = np.array([0, 0, -0.4, 0.6, 1, 1, 1.2, 1.7], dtype=np.float32)
    sizes = np.array([1, 1, 4, 4], dtype=np.int64)
    got = run_resize(19, X, roi=roi, sizes=sizes, mode="linear", coordinate_transformation_mode="tf_crop_and_resize",
                     extrapolation_value=10.0)
    exp = ref_resize(X, (1, 1, 4, 4), sizes / np.array(X.shape), sizes.astype(float), mode="linear",
                     coord="tf_crop_and_resize", extrapolation=10.0, roi=roi.astype(np.float64))
    assert (got == 10).any()
    np.testing.assert_allclose(got, exp, rtol=1e-5)


# sizes (2, 6) for axes (3, 2) of a 3x4 input: not_larger scales both by min(2/4, 6/3) = 0.5 and
# rounds half up (1.5 -> 2), not_smaller by max(...) = 2.
@pytest.mark.parametrize("policy, expected_shape, scales", [
    ("stretch", (1, 1, 6, 2), (1, 1, 2, 0.5)), ("not_larger", (1, 1, 2, 2), (1, 1, 0.5, 0.5)),
    ("not_smaller", (1, 1, 6, 8), (1, 1, 2, 2))])
def test_axes_and_keep_aspect_ratio_policy(policy, expected_shape, scales):
    sizes = np.array([2, 6], dtype=np.int64)
    got = run_resize(18, X, sizes=sizes, axes=[3, 2], keep_aspect_ratio_policy=policy)
    assert got.shape == expected_shape
    exp = ref_resize(X, expected_shape, scales, np.array(expected_shape, float))
    np.testing.assert_array_equal(got, exp.astype(np.float32))


@pytest.mark.parametrize("version, tname", type_matrix("Resize", [10, 11, 13, 18, 19]))
def test_nearest_keeps_every_type(version, tname):
    x = sample(tname, (1, 2, 2, 3))
    sc = np.array([1, 1, 2, 1.5], dtype=np.float32)
    kw = {"roi": np.array([], np.float32)} if version == 11 else {}
    got = run_resize(version, x, scales=sc, **kw, **({} if version == 10 else {"nearest_mode": "floor",
                                                                                "coordinate_transformation_mode":
                                                                                "asymmetric"}))
    # asymmetric + floor: output (i, j) reads input (floor(i / 2), floor(j / 1.5))
    rows, cols = np.floor(np.arange(4) / 2).astype(int), np.floor(np.arange(4) / 1.5).astype(int)
    exp = x[:, :, rows][:, :, :, cols]
    assert got.dtype == x.dtype and got.shape == exp.shape
    assert got.astype(object).tolist() == exp.astype(object).tolist()


@pytest.mark.parametrize("tname", ["float16", "bfloat16", "double", "uint8", "int32"])
def test_linear_on_other_numeric_types(tname):
    x = (np.arange(12).reshape(1, 1, 3, 4) * 10).astype(np_type(tname))
    got = run_resize(19, x, scales=np.array([1, 1, 2, 2], np.float32), mode="linear")
    exp = ref_resize(x.astype(np.float64), (1, 1, 6, 8), (1, 1, 2, 2), (1, 1, 6, 8), mode="linear")
    assert got.dtype == x.dtype
    if tname in ("uint8", "int32"):
        exp = np.rint(exp)
    np.testing.assert_allclose(got.astype(np.float64), exp, rtol=1e-2 if tname in ("float16", "bfloat16") else 1e-7)


def test_resize_10_and_upsample_are_asymmetric():
    x = np.array([[[[1, 2], [3, 4]]]], dtype=np.float32)
    sc = np.array([1, 1, 2, 3], dtype=np.float32)
    nearest = [[1, 1, 1, 2, 2, 2], [1, 1, 1, 2, 2, 2], [3, 3, 3, 4, 4, 4], [3, 3, 3, 4, 4, 4]]
    np.testing.assert_array_equal(run_resize(10, x, scales=sc)[0, 0], nearest)
    lin = run_resize(10, x, scales=sc, mode="linear")[0, 0]
    # x_original = x_resized / scale, edge values beyond the last input
    np.testing.assert_allclose(lin[0], [1, 1 + 1 / 3, 1 + 2 / 3, 2, 2, 2], rtol=1e-6)
    np.testing.assert_allclose(lin[:, 0], [1, 2, 3, 3], rtol=1e-6)
    for version, node_kw, inputs in [
            (9, {}, ["X", "s"]), (7, {"scales": [1.0, 1.0, 2.0, 3.0]}, ["X"]),
            (1, {"height_scale": 2.0, "width_scale": 3.0}, ["X"])]:
        node = helper.make_node("Upsample", inputs, ["Y"], **node_kw)
        graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
                                                for n in inputs], [helper.make_empty_tensor_value_info("Y")])
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", version)], ir_version=7)
        feeds = {"X": x, "s": sc}
        (y,) = onnx_mini.prepare(m).run({n: feeds[n] for n in inputs})
        np.testing.assert_array_equal(y[0, 0], nearest)


def test_errors_name_the_node():
    with pytest.raises(KernelError, match="exactly one of 'scales' and 'sizes'"):
        run_resize(19, X, scales=np.array([1, 1, 2, 2], np.float32), sizes=np.array([1, 1, 2, 2]))
    with pytest.raises(KernelError, match="scales has 3 values"):
        run_resize(19, X, scales=np.array([1, 2, 2], np.float32))
    with pytest.raises(InvalidNodeError, match="half_pixel_symmetric"):
        run_resize(13, X, scales=np.array([1, 1, 2, 2], np.float32),
                   coordinate_transformation_mode="half_pixel_symmetric")
    with pytest.raises(KernelError, match="numeric"):
        run_resize(19, np.array([[["a", "b"]]], dtype=object), scales=np.array([1, 1, 2], np.float32),
                   mode="linear")


def test_axes_are_resized_in_the_cheapest_order():
    """Gathers along the last axis cost most: a 2x upsample resizes it first (while the array is
    small), a downsample of it first too; an outer axis that shrinks goes before a growing last one."""
    from onnx_mini.ops.tensor.resize import _cheapest_order
    axes = [0, 1, 2, 3]
    assert _cheapest_order((1, 32, 64, 64), axes, [2, 3], [1, 32, 128, 128]) == (3, 2)
    assert _cheapest_order((1, 32, 64, 64), axes, [2, 3], [1, 32, 128, 32]) == (3, 2)
    assert _cheapest_order((1, 32, 64, 64), axes, [2, 3], [1, 32, 16, 80]) == (2, 3)
    assert _cheapest_order((1, 32, 64, 64), axes, [3], [1, 32, 64, 128]) == [3]


# -- integer-factor upsampling (resize._apply_periodic, resize._repeat) --------------------------------

@pytest.mark.parametrize("mode, nearest_mode", MODES)
@pytest.mark.parametrize("exclude_outside, antialias", [(0, 0), (1, 0), (0, 1)])
def test_integer_factor_upsample_against_the_slow_reference(mode, nearest_mode, exclude_outside, antialias,
                                                            monkeypatch):
    """Factors 2 and 3, which take the periodic-taps path (or for nearest the plain repeat) where
    the taps repeat (antialias: one resized axis only, the reference's wide filter is slow)."""
    from onnx_mini.ops.tensor import resize
    monkeypatch.setattr(resize, "FAST_MIN_LAST", 0)     # (small arrays keep the gathers)
    monkeypatch.setattr(resize, "FAST_MIN_OUTER", 0)
    calls, periodic, repeat = [], resize._apply_periodic, resize._repeat
    monkeypatch.setattr(resize, "_apply_periodic", lambda *a: calls.append(a[2].f) or periodic(*a))
    monkeypatch.setattr(resize, "_repeat", lambda *a: calls.append(a[2]) or repeat(*a))
    x = (np.arange(1, 1 + 2 * 3 * 5, dtype=np.float32).reshape(1, 2, 3, 5) ** 1.3) * np.where(
        np.arange(5) % 2, -1, 1).astype(np.float32)
    for coord in COORDS[19]:
        if antialias and coord == "tf_crop_and_resize":   # (the reference filters every axis: minutes)
            continue
        roi = ROI if coord == "tf_crop_and_resize" else None
        for sc in ([1, 1, 2, 2], [1, 1, 1, 3]) if not antialias else ([1, 1, 1, 3],):
            sc = np.array(sc, dtype=np.float32)
            attrs = {"mode": mode, "coordinate_transformation_mode": coord, "exclude_outside": exclude_outside}
            if nearest_mode:
                attrs["nearest_mode"] = nearest_mode
            if mode != "nearest":
                attrs["antialias"] = antialias
            got = run_resize(19, x, roi=roi, scales=sc, **attrs)
            roi_v = roi.astype(np.float64) if roi is not None else np.array([0, 0, 0, 0, 1, 1, 1, 1.0])
            out_f = np.array(x.shape) * (roi_v[4:] - roi_v[:4]) * sc.astype(np.float64)
            exp = ref_resize(x, tuple(int(math.floor(v)) for v in out_f), sc.astype(np.float64), out_f, mode=mode,
                             coord=coord, nearest_mode=nearest_mode or "round_prefer_floor",
                             exclude_outside=exclude_outside, antialias=antialias if mode != "nearest" else 0,
                             roi=roi_v if roi is not None else None)
            np.testing.assert_allclose(got, exp, rtol=1e-5, atol=1e-5, err_msg=f"{mode} {coord} {sc}")
    if mode == "nearest" or not exclude_outside:    # (renormalised edge weights do not repeat)
        assert 3 in calls and (antialias or 2 in calls)     # the factors went by the periodic path


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("coord", ["half_pixel", "asymmetric", "pytorch_half_pixel", "tf_half_pixel_for_nn"])
@pytest.mark.parametrize("f", [2, 3, 4])
def test_periodic_taps_give_the_bits_of_the_gathers(mode, coord, f):
    """Integer-factor taps repeat with period f; the sliced path then sums the same float32
    products in the same order as one gather per tap (written out here), so the bits agree."""
    from onnx_mini.ops.tensor import resize
    cfg = resize._Config(mode, coord, "round_prefer_floor", -0.75, 0, 0.0, 0, None, "stretch",
                         resize._COORD_MODES)
    n = 7
    xo = resize._original_coords(cfg, n * f, n, float(f), float(n * f), 0.0, 1.0)
    idx, w = resize._taps(cfg, xo, n, float(f))
    wt = None if w is None else w.astype(np.float32)
    period = resize._periodic_taps(idx, wt, n, 2, 3)
    assert period is not None and period.f == f
    x = np.random.default_rng(f).standard_normal((2, 3, n)).astype(np.float32) * 10
    got = resize._apply_periodic(x, 2, period)
    if wt is None:
        exp = x[..., idx[:, 0]]
    else:
        exp = x[..., idx[:, 0]] * wt[:, 0]
        for k in range(1, idx.shape[1]):
            if wt[:, k].any():
                exp = exp + x[..., idx[:, k]] * wt[:, k]
    assert got.dtype == x.dtype and got.shape == (2, 3, n * f)
    np.testing.assert_array_equal(got.view(np.uint32), exp.view(np.uint32))


def test_taps_that_do_not_repeat_keep_the_gathers():
    """align_corners at 2x (x_original = i * (n - 1) / (2n - 1)) and a non-integer factor."""
    from onnx_mini.ops.tensor import resize
    cfg = resize._Config("linear", "align_corners", "round_prefer_floor", -0.75, 0, 0.0, 0, None, "stretch",
                         resize._COORD_MODES)
    idx, w = resize._taps(cfg, resize._original_coords(cfg, 16, 8, 2.0, 16.0, 0.0, 1.0), 8, 2.0)
    assert resize._periodic_taps(idx, w.astype(np.float32), 8) is None
    cfg = resize._Config("linear", "half_pixel", "round_prefer_floor", -0.75, 0, 0.0, 0, None, "stretch",
                         resize._COORD_MODES)
    idx, w = resize._taps(cfg, resize._original_coords(cfg, 12, 8, 1.5, 12.0, 0.0, 1.0), 8, 1.5)
    assert resize._periodic_taps(idx, w.astype(np.float32), 8) is None
