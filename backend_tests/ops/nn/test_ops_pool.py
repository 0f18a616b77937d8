"""Spec tests for the pools: AveragePool, MaxPool, LpPool, Global{Average,Max,Lp}Pool, MaxUnpool, MaxRoiPool.

Expected values come from hand computation or from slow loops written here from the spec text:
output sizes by the documented floor/ceil formulas (windows starting in the right padding dropped),
window cells visited one by one, pads that are not values (-inf for max, not counted for average
unless count_include_pad, zeros for Lp), MaxPool indices as flat positions in (N, C, *spatial),
row major or (storage_order=1) column major over the spatial axes, first maximum on ties.
"""
from __future__ import annotations

import math

import warnings

import numpy as np
import pytest

from onnx_mini.errors import InvalidNodeError, KernelError

from helpers import NODE, assert_same, np_type, run_node, sample, type_params, versions

AVG, MAX, LP = "AveragePool", "MaxPool", "LpPool"
VERSIONS = {op: versions(op) for op in (AVG, MAX, LP, "GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool",
                                        "MaxUnpool", "MaxRoiPool")}


# -- slow references ------------------------------------------------------------------------------

def out_size(i, k, s, d, b, e, ceil):
    ext = (k - 1) * d + 1
    o = (math.ceil if ceil else math.floor)((i + b + e - ext) / s) + 1
    if ceil and (o - 1) * s >= i + b:      # a window starting in the right padding is ignored
        o -= 1
    return o


def same_pads(sizes, kernel, strides, dil, mode):
    begin, end = [], []
    for i, k, s, d in zip(sizes, kernel, strides, dil):
        total = max(0, (math.ceil(i / s) - 1) * s + (k - 1) * d + 1 - i)
        small, big = total // 2, total - total // 2
        begin.append(small if mode == "SAME_UPPER" else big)
        end.append(big if mode == "SAME_UPPER" else small)
    return begin, end


def ref_pool(x, kind, kernel, strides=None, dil=None, pads=None, ceil=False, include_pad=False, p=2,
             storage_order=0, auto_pad="NOTSET"):
    """-> (Y as float64, flat indices) by visiting every window cell."""
    r = len(kernel)
    sizes = x.shape[2:]
    strides = strides or [1] * r
    dil = dil or [1] * r
    if auto_pad != "NOTSET":   # SAME: ceil(i / s); VALID: ceil((i - extent + 1) / s); both for any ceil_mode
        ceil = False
    if auto_pad.startswith("SAME"):
        begin, end = same_pads(sizes, kernel, strides, dil, auto_pad)
    else:
        pads = pads if pads and auto_pad == "NOTSET" else [0] * (2 * r)
        begin, end = pads[:r], pads[r:]
    outs = [out_size(*a, ceil) for a in zip(sizes, kernel, strides, dil, begin, end)]
    if auto_pad.startswith("SAME"):
        assert outs == [math.ceil(i / s) for i, s in zip(sizes, strides)]
    y = np.zeros(x.shape[:2] + tuple(outs))
    idx = np.zeros(y.shape, dtype=np.int64)
    for n, c, *o in np.ndindex(*y.shape):
        vals, where, npad = [], [], 0
        for tap in np.ndindex(*kernel):
            pos = [oo * s - b + t * d for oo, s, b, t, d in zip(o, strides, begin, tap, dil)]
            if all(0 <= q < i for q, i in zip(pos, sizes)):
                vals.append(float(x[(n, c, *pos)]))
                where.append(pos)
            elif all(-b <= q < i + e for q, i, b, e in zip(pos, sizes, begin, end)):
                npad += 1
        if kind == MAX:
            m = max(vals)
            pos = where[vals.index(m)]
            if storage_order:
                flat = sum(q * math.prod(sizes[:d]) for d, q in enumerate(pos))
            else:
                flat = sum(q * math.prod(sizes[d + 1:]) for d, q in enumerate(pos))
            y[(n, c, *o)], idx[(n, c, *o)] = m, (n * x.shape[1] + c) * math.prod(sizes) + flat
        elif kind == AVG:
            y[(n, c, *o)] = sum(vals) / (len(vals) + (npad if include_pad else 0))
        else:
            y[(n, c, *o)] = sum(abs(v) ** p for v in vals) ** (1 / p)
    return y, idx


def data(shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


# -- every version x type -------------------------------------------------------------------------

def typed_input(tname):
    x = sample(tname, (2, 3, 3, 4))
    return x, x.astype(np.float64)


@pytest.mark.parametrize("version,tname", type_params(MAX, VERSIONS[MAX]))
def test_maxpool_every_type(version, tname):
    x, xf = typed_input(tname)
    exp, idx = ref_pool(xf, MAX, [2, 2], pads=[1, 0, 0, 1])
    n_out = 1 if version == 1 else 2
    got = run_node(MAX, version, [x], n_outputs=n_out, kernel_shape=[2, 2], pads=[1, 0, 0, 1])
    if n_out == 1:
        assert_same(got, exp.astype(x.dtype))
    else:
        assert_same(got[0], exp.astype(x.dtype))
        assert_same(got[1], idx)


@pytest.mark.parametrize("version,tname", type_params(AVG, VERSIONS[AVG]))
def test_averagepool_every_type(version, tname):
    x, xf = typed_input(tname)       # sums of 1, 2 or 4 FP4 values: every average is exact
    exp, _ = ref_pool(xf, AVG, [2, 2], strides=[1, 2], pads=[1, 0, 0, 0])
    got = run_node(AVG, version, [x], kernel_shape=[2, 2], strides=[1, 2], pads=[1, 0, 0, 0])
    assert_same(got, exp.astype(x.dtype))


@pytest.mark.parametrize("version,tname", type_params(LP, VERSIONS[LP]))
def test_lppool_every_type(version, tname):
    x, xf = typed_input(tname)
    exp, _ = ref_pool(xf, LP, [2, 2], pads=[0, 1, 0, 1], p=1)
    p = 1.0 if version == 1 else 1      # a float attribute in version 1, an int from 2 on
    assert_same(run_node(LP, version, [x], kernel_shape=[2, 2], pads=[0, 1, 0, 1], p=p), exp.astype(x.dtype))


@pytest.mark.parametrize("version,tname", type_params("GlobalMaxPool", VERSIONS["GlobalMaxPool"]))
def test_globalmaxpool_every_type(version, tname):
    x = sample(tname, (2, 3, 2, 5))
    exp = x.astype(np.float64).max(axis=(2, 3), keepdims=True).astype(x.dtype)
    assert_same(run_node("GlobalMaxPool", version, [x]), exp)


@pytest.mark.parametrize("version,tname", type_params("GlobalAveragePool", VERSIONS["GlobalAveragePool"]))
def test_globalaveragepool_every_type(version, tname):
    x = sample(tname, (2, 3, 2, 2))   # averages of 4 FP4 values: exact
    exp = x.astype(np.float64).mean(axis=(2, 3), keepdims=True).astype(x.dtype)
    assert_same(run_node("GlobalAveragePool", version, [x]), exp)


@pytest.mark.parametrize("version,tname", type_params("GlobalLpPool", VERSIONS["GlobalLpPool"]))
def test_globallppool_every_type(version, tname):
    x = sample(tname, (2, 3, 2, 5))
    exp = np.abs(x.astype(np.float64)).sum(axis=(2, 3), keepdims=True).astype(x.dtype)
    assert_same(run_node("GlobalLpPool", version, [x], p=1.0 if version == 1 else 1), exp)


@pytest.mark.parametrize("version,tname", type_params("MaxUnpool", VERSIONS["MaxUnpool"], "T1"))
def test_maxunpool_every_type(version, tname):
    x = sample(tname, (1, 2, 2, 2))
    ind = np.array([[[[0, 3], [9, 14]], [[17, 18], [24, 31]]]], dtype=np.int64)
    exp = np.zeros(32, dtype=x.dtype)
    exp[ind.reshape(-1)] = x.reshape(-1)
    got = run_node("MaxUnpool", version, [x, ind], kernel_shape=[2, 2], strides=[2, 2])
    assert_same(got, exp.reshape(1, 2, 4, 4))


@pytest.mark.parametrize("version,tname", type_params("MaxRoiPool", VERSIONS["MaxRoiPool"]))
def test_maxroipool_every_type(version, tname):
    x = sample(tname, (1, 2, 4, 4))
    rois = np.array([[0, 0, 0, 3, 3], [0, 1, 1, 2, 2]], dtype=x.dtype)
    exp = ref_roi(x.astype(np.float64), rois.astype(np.float64), (2, 2), 1.0).astype(x.dtype)
    assert_same(run_node("MaxRoiPool", version, [x, rois], pooled_shape=[2, 2]), exp)


# -- hand-computed values ------------------------------------------------------------------------

X44 = np.arange(1, 17, dtype=np.float32).reshape(1, 1, 4, 4)


def test_maxpool_hand_values():
    # 3x3 stride 2, ceil_mode: windows rows/cols {0,1,2} and {2,3}
    assert_same(run_node(MAX, 22, [X44], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
                np.array([[[[11, 12], [15, 16]]]], np.float32))
    # floor mode: a single window
    assert_same(run_node(MAX, 22, [X44], kernel_shape=[3, 3], strides=[2, 2]), np.array([[[[11]]]], np.float32))


def test_averagepool_hand_values():
    # ceil_mode: the partial windows average their 6 and 4 real cells
    assert_same(run_node(AVG, 22, [X44], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
                np.array([[[[6, 7.5], [12, 13.5]]]], np.float32))
    # pads 1: corner window holds 1, 2, 5, 6 and 5 pads -> 14/4, or 14/9 counting the pads
    got = run_node(AVG, 22, [X44], kernel_shape=[3, 3], strides=[3, 3], pads=[1, 1, 1, 1])
    assert got[0, 0, 0, 0] == np.float32(14 / 4)
    got = run_node(AVG, 22, [X44], kernel_shape=[3, 3], strides=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1)
    assert got[0, 0, 0, 0] == np.float32(14 / 9)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("shape", [(2, 3, 7, 7), (1, 4, 3, 5), (2, 2, 6)])
def test_pools_whose_window_is_the_whole_input(dtype, shape):
    """A kernel the size of the unpadded input (a global pool written as a sliding one) is one
    reduction: the mean and maximum of each image's channel, NaN kept, with strides or ceil_mode that
    change nothing; with padding the windows go tap by tap again."""
    x = data(shape, dtype=dtype)
    x[0, 0, 0] = np.nan
    spatial = tuple(range(2, x.ndim))
    kernel = list(shape[2:])
    for attrs in (dict(kernel_shape=kernel), dict(kernel_shape=kernel, strides=[2] * len(kernel), ceil_mode=1)):
        mean = x.astype(np.float64).mean(axis=spatial, keepdims=True)
        np.testing.assert_allclose(run_node(AVG, 22, [x], **attrs).astype(np.float64), mean,
                                   rtol=1e-3 if dtype == np.float16 else 1e-6)
        assert_same(run_node(MAX, 22, [x], **attrs), np.max(x, axis=spatial, keepdims=True))
    padded = dict(kernel_shape=kernel, pads=[1] * (2 * len(kernel)))
    want, _ = ref_pool(x.astype(np.float64), MAX, kernel, pads=[1] * (2 * len(kernel)))
    assert_same(run_node(MAX, 22, [x], **padded), want.astype(dtype))


def test_maxpool_indices_hand_values():
    x = np.arange(1, 26, dtype=np.float32).reshape(1, 1, 5, 5)
    y, i = run_node(MAX, 12, [x], n_outputs=2, kernel_shape=[2, 2], strides=[2, 2])
    assert_same(y, np.array([[[[7, 9], [17, 19]]]], np.float32))
    assert_same(i, np.array([[[[6, 8], [16, 18]]]], np.int64))
    y, i = run_node(MAX, 12, [x], n_outputs=2, kernel_shape=[2, 2], strides=[2, 2], storage_order=1)
    assert_same(i, np.array([[[[6, 16], [8, 18]]]], np.int64))     # (h, w) -> h + 5 w


def test_maxpool_ties_pick_first():
    x = np.array([[[[1, 3, 3], [3, 2, 3]]]], np.float32)
    y, i = run_node(MAX, 22, [x], n_outputs=2, kernel_shape=[2, 2])
    assert_same(y, np.array([[[[3, 3]]]], np.float32))
    assert_same(i, np.array([[[[1, 1]]]], np.int64))
    y, i = run_node(MAX, 22, [x], n_outputs=2, kernel_shape=[2, 2], storage_order=1)
    assert_same(i, np.array([[[[2, 2]]]], np.int64))   # (0, 1) -> 0 + 1 * 2 in column major


def test_lppool_hand_values():
    x = np.array([[[3, -4, 12, 0]]], np.float64)
    assert_same(run_node(LP, 22, [x], kernel_shape=[2], strides=[2]), np.array([[[5, 12]]], np.float64))
    assert_same(run_node(LP, 22, [x], kernel_shape=[2], p=1), np.array([[[7, 16, 12]]], np.float64))


# -- attributes against the slow reference -------------------------------------------------------

CASES = [  # (input shape, attributes, version at least)
    ((2, 3, 7), dict(kernel_shape=[3]), 1),
    ((1, 2, 7), dict(kernel_shape=[3], strides=[2], pads=[2, 1]), 1),
    ((1, 2, 6, 7), dict(kernel_shape=[3, 2], strides=[2, 3], pads=[1, 0, 1, 1]), 1),
    ((1, 2, 5, 5, 4), dict(kernel_shape=[2, 3, 2], strides=[2, 1, 2], pads=[1, 1, 0, 0, 1, 1]), 1),
    ((1, 2, 6, 7), dict(kernel_shape=[3, 3], auto_pad="SAME_UPPER", strides=[2, 2]), 1),
    ((1, 2, 6, 7), dict(kernel_shape=[2, 3], auto_pad="SAME_LOWER", strides=[1, 2]), 1),
    ((1, 2, 6, 7), dict(kernel_shape=[4, 2], auto_pad="SAME_LOWER"), 1),
    ((1, 2, 6, 7), dict(kernel_shape=[3, 3], auto_pad="VALID", strides=[2, 2]), 1),
    ((1, 2, 6, 7), dict(kernel_shape=[3, 3], auto_pad="NOTSET", pads=[1, 1, 1, 1]), 1),
    ((1, 2, 6, 7), dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1), 10),
    ((1, 2, 6, 7), dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1, auto_pad="VALID"), 10),
    ((1, 2, 6, 7), dict(kernel_shape=[3, 2], strides=[2, 3], ceil_mode=1, auto_pad="SAME_LOWER"), 10),
    ((1, 2, 5, 7), dict(kernel_shape=[2, 3], strides=[3, 2], pads=[1, 0, 1, 2], ceil_mode=1), 10),
    ((1, 1, 2, 2), dict(kernel_shape=[3, 3], strides=[3, 3], pads=[1, 1, 1, 1], ceil_mode=1), 10),
    ((1, 1, 2, 2), dict(kernel_shape=[1, 1], strides=[2, 2], ceil_mode=1), 10),
    ((1, 2, 8, 7), dict(kernel_shape=[2, 2], dilations=[2, 3]), "dil"),
    ((1, 2, 8, 9), dict(kernel_shape=[3, 2], dilations=[2, 2], strides=[2, 3], pads=[2, 1, 0, 2]), "dil"),
    ((1, 2, 9, 8), dict(kernel_shape=[3, 3], dilations=[2, 2], strides=[2, 2], ceil_mode=1), "dil"),
    ((1, 1, 6, 7, 5), dict(kernel_shape=[2, 2, 2], dilations=[2, 1, 2], auto_pad="SAME_UPPER"), "dil"),
    # a stride-1 axis reduced flat before a strided inner axis, then a strided last axis
    ((2, 2, 5, 6, 7), dict(kernel_shape=[2, 3, 3], strides=[1, 2, 2], pads=[1, 0, 1, 0, 1, 1]), 1),
    ((2, 3, 6, 5), dict(kernel_shape=[1, 3], strides=[2, 1], pads=[0, 1, 0, 1]), 1),
]
FIRST = {MAX: {"dil": 10}, AVG: {"dil": 19}, LP: {"dil": 18, 10: 18}}


def case_versions(op, since):
    first = FIRST[op].get(since, since)
    return [v for v in VERSIONS[op] if v >= first]


def ref_args(attrs, p=2, include_pad=False, storage_order=0):
    return dict(strides=attrs.get("strides"), dil=attrs.get("dilations"), pads=attrs.get("pads"),
                ceil=bool(attrs.get("ceil_mode", 0)), auto_pad=attrs.get("auto_pad", "NOTSET"), p=p,
                include_pad=include_pad, storage_order=storage_order)


@pytest.mark.parametrize("op", [MAX, AVG, LP])
@pytest.mark.parametrize("shape,attrs,since", CASES)
def test_attributes_against_reference(op, shape, attrs, since):
    x = data(shape)
    exp, idx = ref_pool(x.astype(np.float64), op, attrs["kernel_shape"], **ref_args(attrs))
    for v in case_versions(op, since):
        if op == MAX and v >= 8:
            y, i = run_node(op, v, [x], n_outputs=2, **attrs)
            assert_same(i, idx)
        else:
            y = run_node(op, v, [x], **attrs)
        assert y.dtype == np.float32 and y.shape == exp.shape
        np.testing.assert_allclose(y, exp, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", [MAX, AVG])
@pytest.mark.parametrize("shape,attrs,since", CASES)
@pytest.mark.parametrize("include_pad", [0, 1])
def test_pools_straight_from_the_unpadded_input(monkeypatch, op, shape, attrs, since, include_pad):
    """The windows reduced from the unpadded input (pool._box_direct: a tap every output reads inside
    the input first, the others on the outputs they read inside it), forced wherever an axis has
    such a tap, against the reference; where none has, the padded path answers the same."""
    from onnx_mini.ops.nn import pool
    monkeypatch.setattr(pool, "_DIRECT_MIN_STRIDE", 1)
    monkeypatch.setattr(pool, "_DIRECT_PADDED_ONLY", False)
    if op == MAX and include_pad:
        return
    x = data(shape, seed=5)
    exp, _ = ref_pool(x.astype(np.float64), op, attrs["kernel_shape"], **ref_args(attrs, include_pad=bool(include_pad)))
    for v in case_versions(op, since):
        if op == AVG and include_pad and v < 7:
            continue
        extra = dict(count_include_pad=include_pad) if op == AVG and v >= 7 else {}
        y = run_node(op, v, [x], **attrs, **extra)
        y = y[0] if isinstance(y, (list, tuple)) else y
        np.testing.assert_allclose(y, exp, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape,kernel,strides,pads,direct", [
    ((1, 4, 12, 12), [3, 3], [2, 2], [1, 1, 1, 1], True),      # ResNet's and ShuffleNet's pools
    ((1, 4, 12, 12), [3, 3], [2, 2], [0, 0, 0, 0], False),     # unpadded: the flat rows are faster
    ((1, 4, 12, 12), [3, 3], [1, 1], [1, 1, 1, 1], False),     # stride 1: likewise
    ((1, 4, 12, 12), [3, 3], [2, 1], [1, 1, 1, 1], False),
    ((1, 4, 4, 4), [2, 2], [2, 2], [1, 1, 1, 1], False),       # no tap reads inside for every output
])
def test_pools_pick_the_unpadded_reduction(monkeypatch, shape, kernel, strides, pads, direct):
    from onnx_mini.ops.nn import pool
    calls = []
    original = pool._box_direct
    monkeypatch.setattr(pool, "_box_direct", lambda *a: calls.append(1) or original(*a))
    x = data(shape, seed=6)
    for op in (MAX, AVG):
        exp, _ = ref_pool(x.astype(np.float64), op, kernel, strides=strides, pads=pads)
        y = run_node(op, 19 if op == AVG else 12, [x], kernel_shape=kernel, strides=strides, pads=pads)
        y = y[0] if isinstance(y, (list, tuple)) else y
        np.testing.assert_allclose(y, exp, rtol=1e-5, atol=1e-6)
    assert len(calls) == (2 if direct else 0)


@pytest.mark.parametrize("shape,attrs,since", CASES)
def test_averagepool_count_include_pad(shape, attrs, since):
    x = data(shape, seed=1)
    exp, _ = ref_pool(x.astype(np.float64), AVG, attrs["kernel_shape"], **ref_args(attrs, include_pad=True))
    for v in case_versions(AVG, since):
        if v >= 7:
            np.testing.assert_allclose(run_node(AVG, v, [x], count_include_pad=1, **attrs), exp, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape,attrs,since", CASES)
def test_maxpool_indices_column_major(shape, attrs, since):
    x = data(shape, seed=2)
    exp, idx = ref_pool(x.astype(np.float64), MAX, attrs["kernel_shape"], **ref_args(attrs, storage_order=1))
    for v in case_versions(MAX, since):
        if v >= 8:
            y, i = run_node(MAX, v, [x], n_outputs=2, storage_order=1, **attrs)
            np.testing.assert_array_equal(y, exp.astype(np.float32))
            assert_same(i, idx)


@pytest.mark.parametrize("op", [MAX, AVG])
@pytest.mark.parametrize("strides", [[1, 1], [2, 2], [1, 2]])
def test_windows_never_mix_rows_images_or_infinities(op, strides):
    # the rows are reduced flat: positions whose taps run into the next row, channel or image are
    # computed and cropped; +-inf at the row ends must neither leak into real windows nor warn
    x = data((2, 3, 6, 7), seed=4)
    x[..., 0], x[..., -1] = -np.inf, np.inf
    x[1, 2, -1, :] = np.inf
    exp, _ = ref_pool(x.astype(np.float64), op, [3, 3], strides=strides, pads=[1, 0, 0, 1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = run_node(op, 19 if op == AVG else 12, [x], kernel_shape=[3, 3], strides=strides, pads=[1, 0, 0, 1])
    got = got[0] if isinstance(got, (list, tuple)) else got
    np.testing.assert_allclose(got, exp, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("p", [1, 2, 3])
def test_lppool_p(p):
    x = data((2, 2, 5, 6), seed=3, dtype=np.float64)
    exp, _ = ref_pool(x, LP, [2, 3], strides=[1, 2], pads=[1, 0, 0, 1], p=p)
    got = run_node(LP, 11, [x], kernel_shape=[2, 3], strides=[1, 2], pads=[1, 0, 0, 1], p=p)
    np.testing.assert_allclose(got, exp, rtol=1e-12)
    got = run_node(LP, 1, [x], kernel_shape=[2, 3], strides=[1, 2], pads=[1, 0, 0, 1], p=float(p))
    np.testing.assert_allclose(got, exp, rtol=1e-12)


def test_default_p_is_2():
    x = np.array([[[3, 4]]], np.float32)
    assert_same(run_node(LP, 22, [x], kernel_shape=[2]), np.array([[[5]]], np.float32))
    assert_same(run_node("GlobalLpPool", 22, [x]), np.array([[[5]]], np.float32))
    assert_same(run_node("GlobalLpPool", 1, [x]), np.array([[[5]]], np.float32))


@pytest.mark.parametrize("tname", ["int8", "uint8"])
def test_maxpool_integers_keep_type_and_extremes(tname):
    dt = np_type(tname)
    info = np.iinfo(dt)
    x = np.array([[[[info.min, info.min, 5], [info.max, info.min, info.min]]]], dt)
    y, i = run_node(MAX, 12, [x], n_outputs=2, kernel_shape=[2, 2], pads=[1, 1, 0, 0])
    exp, idx = ref_pool(x.astype(np.float64), MAX, [2, 2], pads=[1, 1, 0, 0])
    assert_same(y, exp.astype(dt))
    assert_same(i, idx)


def test_maxpool_nan_and_inf():
    x = np.array([[[1, np.nan, 2, -np.inf, -np.inf]]], np.float32)
    got = run_node(MAX, 22, [x], kernel_shape=[2], strides=[2], ceil_mode=1)
    np.testing.assert_array_equal(got, np.array([[[np.nan, 2, -np.inf]]], np.float32))


def test_empty_batch():
    x = np.zeros((0, 3, 4, 4), np.float32)
    assert_same(run_node(MAX, 22, [x], kernel_shape=[2, 2]), np.zeros((0, 3, 3, 3), np.float32))
    assert_same(run_node(AVG, 22, [x], kernel_shape=[2, 2], pads=[1, 1, 1, 1]), np.zeros((0, 3, 5, 5), np.float32))
    assert_same(run_node("GlobalAveragePool", 22, [x]), np.zeros((0, 3, 1, 1), np.float32))


def test_global_pools_nd():
    x = data((2, 3, 2, 3, 4), seed=4, dtype=np.float64)
    np.testing.assert_allclose(run_node("GlobalAveragePool", 1, [x]), x.mean(axis=(2, 3, 4), keepdims=True))
    assert_same(run_node("GlobalMaxPool", 1, [x]), x.max(axis=(2, 3, 4), keepdims=True))
    np.testing.assert_allclose(run_node("GlobalLpPool", 2, [x], p=3),
                               (np.abs(x) ** 3).sum(axis=(2, 3, 4), keepdims=True) ** (1 / 3))
    x1 = data((2, 3, 5), seed=5)
    assert_same(run_node("GlobalMaxPool", 22, [x1]), x1.max(axis=2, keepdims=True))


def test_maxpool_without_indices_output_in_version_8():
    x = data((1, 2, 4, 4))
    exp, _ = ref_pool(x.astype(np.float64), MAX, [2, 2], strides=[2, 2])
    assert_same(run_node(MAX, 8, [x], kernel_shape=[2, 2], strides=[2, 2]), exp.astype(np.float32))


# -- MaxUnpool ------------------------------------------------------------------------------------

@pytest.mark.parametrize("version", VERSIONS["MaxUnpool"])
def test_maxunpool_inverts_maxpool(version):
    x = data((2, 3, 6, 5), seed=6)
    y, i = run_node(MAX, 12, [x], n_outputs=2, kernel_shape=[2, 2], strides=[2, 2])
    # from the MaxPool's input shape: every max back at its place, zeros elsewhere
    got = run_node("MaxUnpool", version, [y, i, np.array(x.shape, np.int64)], kernel_shape=[2, 2], strides=[2, 2])
    exp = np.zeros(x.size, np.float32)
    exp[i.reshape(-1)] = y.reshape(-1)
    assert_same(got, exp.reshape(x.shape))
    # pooling the unpooled tensor gives back the pooled values
    again = run_node(MAX, 12, [got], kernel_shape=[2, 2], strides=[2, 2])
    assert_same(again, y)


def test_maxunpool_with_output_shape_keeps_coordinates():
    # indices into the inferred 4x4 output; a 5x5 output_shape keeps each cell's (h, w)
    x = np.array([[[[5, 6], [7, 8]]]], np.float32)
    ind = np.array([[[[5, 7], [13, 15]]]], np.int64)
    got = run_node("MaxUnpool", 22, [x, ind, np.array([1, 1, 5, 5], np.int64)], kernel_shape=[2, 2], strides=[2, 2])
    exp = np.zeros((1, 1, 5, 5), np.float32)
    exp[0, 0, 1, 1], exp[0, 0, 1, 3], exp[0, 0, 3, 1], exp[0, 0, 3, 3] = 5, 6, 7, 8
    assert_same(got, exp)


def test_maxunpool_pads_and_1d():
    x = np.array([[[4, 9]]], np.float32)
    ind = np.array([[[0, 3]]], np.int64)
    # (2 - 1) * 2 + 3 - 1 - 0 = 4 cells
    got = run_node("MaxUnpool", 11, [x, ind], kernel_shape=[3], strides=[2], pads=[1, 0])
    assert_same(got, np.array([[[4, 0, 0, 9]]], np.float32))


def test_maxunpool_bad_index():
    x = np.array([[[4, 9]]], np.float32)
    with pytest.raises(KernelError, match=NODE):
        run_node("MaxUnpool", 11, [x, np.array([[[0, 7]]], np.int64)], kernel_shape=[2], strides=[2])
    with pytest.raises(KernelError, match=NODE):
        run_node("MaxUnpool", 11, [x, np.array([[[-1, 2]]], np.int64)], kernel_shape=[2], strides=[2])


# -- MaxRoiPool -----------------------------------------------------------------------------------

def ref_roi(x, rois, pooled, scale):
    """Fast R-CNN RoI max pooling: box corners scaled and rounded (half away from zero), inclusive;
    each bin spans [floor(p * size / pooled), ceil((p + 1) * size / pooled)) offset by the start,
    clipped to the map; empty bins give 0."""
    rnd = (lambda v: math.floor(abs(v) + 0.5) * (1 if v >= 0 else -1))
    ph, pw = pooled
    c, h, w = x.shape[1:]
    y = np.zeros((len(rois), c, ph, pw))
    for k, (b, x1, y1, x2, y2) in enumerate(rois):
        sw, sh, ew, eh = (rnd(v * scale) for v in (x1, y1, x2, y2))
        rh, rw = max(eh - sh + 1, 1), max(ew - sw + 1, 1)
        for i in range(ph):
            hs = min(max(math.floor(i * rh / ph) + sh, 0), h)
            he = min(max(math.ceil((i + 1) * rh / ph) + sh, 0), h)
            for j in range(pw):
                ws = min(max(math.floor(j * rw / pw) + sw, 0), w)
                we = min(max(math.ceil((j + 1) * rw / pw) + sw, 0), w)
                for ch in range(c):
                    if he > hs and we > ws:
                        y[k, ch, i, j] = x[int(b), ch, hs:he, ws:we].max()
    return y


def test_maxroipool_hand_values():
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    # roi (x1=0, y1=0, x2=3, y2=3): 4x4 cells in 2x2 bins of 2x2
    got = run_node("MaxRoiPool", 1, [x, np.array([[0, 0, 0, 3, 3]], np.float32)], pooled_shape=[2, 2])
    assert_same(got, np.array([[[[5, 7], [13, 15]]]], np.float32))
    # spatial_scale 0.5 halves the box to (0, 0)..(1, 2) rounded: rows 0-2, cols 0-1
    got = run_node("MaxRoiPool", 1, [x, np.array([[0, 0, 0, 2, 4]], np.float32)], pooled_shape=[1, 1],
                   spatial_scale=0.5)
    assert_same(got, np.array([[[[9]]]], np.float32))


def test_maxroipool_against_reference():
    x = data((2, 3, 9, 11), seed=7)
    rois = np.array([[0, 0, 0, 10, 8], [1, 2.4, 3.6, 7.5, 5], [1, -3, -2, 4, 3], [0, 9, 7, 30, 20],
                     [1, 5, 5, 5, 5], [0, 6, 2, 3, 1]], np.float32)
    for pooled, scale in (((2, 3), 1.0), ((3, 2), 0.5), ((4, 4), 0.8)):
        exp = ref_roi(x.astype(np.float64), rois.astype(np.float64), pooled, scale)
        got = run_node("MaxRoiPool", 22, [x, rois], pooled_shape=list(pooled), spatial_scale=scale)
        assert_same(got, exp.astype(np.float32))


def test_maxroipool_bad_batch_index():
    x = data((1, 1, 4, 4))
    with pytest.raises(KernelError, match=NODE):
        run_node("MaxRoiPool", 22, [x, np.array([[1, 0, 0, 1, 1]], np.float32)], pooled_shape=[1, 1])


# -- errors ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("op,version", [(MAX, 1), (MAX, 22), (AVG, 7), (AVG, 22), (LP, 2), (LP, 22)])
def test_kernel_larger_than_padded_input(op, version):
    x = data((1, 1, 3, 3))
    with pytest.raises(KernelError, match=NODE):
        run_node(op, version, [x], kernel_shape=[4, 2], pads=[0, 0, 0, 0])
    run_node(op, version, [x], kernel_shape=[4, 2], pads=[1, 0, 0, 0])     # fits once padded


@pytest.mark.parametrize("op", [MAX, AVG, LP])
def test_bad_attributes(op):
    x = data((1, 1, 3, 3))
    with pytest.raises(InvalidNodeError, match=f"{NODE}.*auto_pad"):
        run_node(op, 11, [x], kernel_shape=[2, 2], auto_pad="SAME")
    with pytest.raises(InvalidNodeError, match=f"{NODE}.*kernel_shape"):
        run_node(op, 11, [x])
    with pytest.raises(InvalidNodeError, match=f"{NODE}.*pads"):
        run_node(op, 11, [x], kernel_shape=[2, 2], pads=[1, 1])
    with pytest.raises(InvalidNodeError, match=f"{NODE}.*strides"):
        run_node(op, 11, [x], kernel_shape=[2, 2], strides=[0, 1])
    with pytest.raises(KernelError, match=f"{NODE}.*rank"):
        run_node(op, 11, [x], kernel_shape=[2])


def test_dilations_not_in_old_versions():
    x = data((1, 1, 5, 5))
    with pytest.raises(InvalidNodeError, match=f"{NODE}.*dilations"):
        run_node(AVG, 11, [x], kernel_shape=[2, 2], dilations=[2, 2])
    with pytest.raises(InvalidNodeError, match=f"{NODE}.*storage_order"):
        run_node(MAX, 1, [x], kernel_shape=[2, 2], storage_order=1)


def test_max_pool_of_a_large_batch_goes_image_by_image_with_the_same_result():
    """Batches of 1M+ elements are pooled image by image (nn/_common.per_image): the result must be
    the one of each image pooled alone, the threads notwithstanding."""
    import onnx_mini
    from onnx import TensorProto, helper
    x = np.random.default_rng(3).standard_normal((4, 8, 180, 190)).astype(np.float32)
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    rep = onnx_mini.prepare(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]))
    y = rep.run([x])[0]
    assert y.shape == (4, 8, 90, 95)
    for i in range(4):
        np.testing.assert_array_equal(y[i:i + 1], rep.run([x[i:i + 1]])[0])
    # the window maximum, from the definition, on a few output positions
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    for (i, c, r, q) in [(0, 0, 0, 0), (3, 7, 89, 94), (2, 4, 45, 10)]:
        assert y[i, c, r, q] == xp[i, c, 2 * r:2 * r + 3, 2 * q:2 * q + 3].max()


# -- windows that tile the input (kernel == strides, no padding: pool._tiles) ------------------------

TILED = [  # (input shape, kernel): cells past the last window left out on odd sizes
    ((1, 2, 4, 6), [2, 2]),
    ((1, 3, 7, 9), [2, 2]),          # the wake-word model's 97-row case in small
    ((2, 2, 6, 9), [3, 3]),
    ((1, 2, 5, 8), [1, 2]),
    ((1, 2, 8, 5), [2, 1]),
    ((1, 3, 10), [4]),
    ((1, 2, 4, 5, 6), [2, 2, 3]),
    ((1, 1, 3, 3), [1, 1]),
]


@pytest.mark.parametrize("shape,kernel", TILED)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8, np.float16])
def test_maxpool_of_tiling_windows(monkeypatch, shape, kernel, dtype):
    """Windows that tile the input are reduced from a split view of it (pool._tiles): the window
    maxima of the slow reference, and bit for bit the values of the general path (_box), -0.0 and
    NaN included."""
    from onnx_mini.ops.nn import pool
    x = data(shape, seed=7) * 3
    x = x.astype(dtype)
    if dtype != np.int8:
        x.reshape(-1)[::5] = -0.0
        x.reshape(-1)[3] = np.nan
    calls = []
    original = pool._tiles
    monkeypatch.setattr(pool, "_tiles", lambda *a: calls.append(1) or original(*a))
    xf = x.astype(np.float64)
    exp, _ = ref_pool(np.where(np.isnan(xf), -np.inf, xf), MAX, kernel, strides=kernel)
    has_nan, _ = ref_pool(np.isnan(xf).astype(np.float64), MAX, kernel, strides=kernel)
    exp[has_nan == 1] = np.nan          # NaN wins a window (np.maximum's rule, the general path's too)
    got = run_node(MAX, 12, [x], kernel_shape=kernel, strides=kernel)
    assert len(calls) == 1 and got.dtype == dtype and got.shape == exp.shape
    np.testing.assert_array_equal(got.astype(np.float64), exp)
    monkeypatch.setattr(pool, "_tiles_plan", lambda *a: None)      # the general path
    general = run_node(MAX, 12, [x], kernel_shape=kernel, strides=kernel)
    assert len(calls) == 1
    assert got.tobytes() == np.ascontiguousarray(general).tobytes()


def test_maxpool_of_tiling_windows_hand_values():
    x = np.array([[[[1, 5, 2, 0, 9],
                    [3, 4, -1, 8, 9],
                    [7, 0, 6, 6, 9]]]], np.float32)
    # 2x2 stride 2: the last row and column belong to no window
    assert_same(run_node(MAX, 12, [x], kernel_shape=[2, 2], strides=[2, 2]), np.array([[[[5, 8]]]], np.float32))
    assert_same(run_node(MAX, 12, [x], kernel_shape=[1, 2], strides=[1, 2]),
                np.array([[[[5, 2], [4, 8], [7, 6]]]], np.float32))
    # ceil_mode keeps the partial windows: not tiling, the general path answers
    assert_same(run_node(MAX, 12, [x], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1),
                np.array([[[[5, 8, 9], [7, 6, 9]]]], np.float32))


@pytest.mark.parametrize("attrs", [dict(kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 1, 1]),
                                   dict(kernel_shape=[2, 2], strides=[2, 2], dilations=[2, 1]),
                                   dict(kernel_shape=[2, 2], strides=[2, 1]),
                                   dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)])
def test_maxpool_windows_that_do_not_tile_take_the_general_path(monkeypatch, attrs):
    from onnx_mini.ops.nn import pool
    calls = []
    monkeypatch.setattr(pool, "_tiles", lambda *a: calls.append(1))
    x = data((1, 2, 7, 9), seed=8)
    exp, _ = ref_pool(x.astype(np.float64), MAX, attrs["kernel_shape"], **ref_args(attrs))
    np.testing.assert_array_equal(run_node(MAX, 12, [x], **attrs), exp.astype(np.float32))
    assert not calls


@pytest.mark.parametrize("kernel", [[2, 2], [1, 3], [3, 1]])
def test_maxpool_of_tiling_windows_on_a_strided_input(kernel):
    """X a view with gaps (a transposed, stepped input, as a kernel may receive from a view-making
    producer): the split view and the flat last-axis pass read it where it lies, X left untouched."""
    from onnx_mini.ops.nn import pool
    base = data((1, 3, 9, 14), seed=9)
    x = base.transpose(0, 1, 3, 2)[:, :, ::2, :]           # (1, 3, 7, 9), no axis contiguous but the last's step
    before = base.copy()
    got = pool.max_pool_10(kernel_shape=kernel, strides=kernel)(x)[0]
    exp, _ = ref_pool(x.astype(np.float64), MAX, kernel, strides=kernel)
    np.testing.assert_array_equal(got, exp.astype(np.float32))
    assert_same(base, before)
