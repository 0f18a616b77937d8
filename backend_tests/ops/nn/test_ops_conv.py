"""Conv, ConvTranspose, ConvInteger, QLinearConv, DeformConv and Col2Im against slow direct loops written
from the spec text in this file: for each output pixel, a sum over the input channels of its group and the
kernel taps (the input position o*stride - pad_begin + tap*dilation; for ConvTranspose the input pixels i with
i*stride + tap*dilation = o + pad_begin). Geometry (auto_pad, output sizes, ConvTranspose's pads from
output_shape) is recomputed here from the formulas in the operators' docs. No code is shared with
onnx_mini/ops/nn. Data are small integers (or halves) so that every type's result is exact."""
from __future__ import annotations

import itertools
import math
import os
import re
import sys

import numpy as np
import pytest
from onnx import helper, numpy_helper

import onnx_mini
from onnx_mini.errors import InvalidNodeError, InvalidValueError, KernelError
from onnx_mini.ops.nn import conv
from onnx_mini.ops.nn.conv import banded, im2col, pointwise, shifted
from onnx_mini.ops.nn.conv import thresholds, winograd

from helpers import NODE, REPO, assert_same, elem_type, np_type, run_node, sample, type_params, versions

RNG = np.random.default_rng(1234)


def ints(shape, lo=-2, hi=2, dtype=np.float32):
    return RNG.integers(lo, hi + 1, size=shape).astype(dtype)


# -- references ----------------------------------------------------------------------------------

def ref_geometry(in_sizes, kernel, strides, dil, pads, auto_pad):
    """Conv's doc: SAME_* -> out = ceil(in / stride), the odd unit of padding at the end for SAME_UPPER and at
    the beginning for SAME_LOWER; VALID -> ceil((in - extent + 1) / stride); else floor((in + pads - extent)
    / stride) + 1. -> (pads_begin, out_sizes)"""
    r = len(in_sizes)
    begin, out = [], []
    for d in range(r):
        i, s, ext = in_sizes[d], strides[d], (kernel[d] - 1) * dil[d] + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            o = math.ceil(i / s)
            total = max(0, (o - 1) * s + ext - i)
            begin.append(total // 2 if auto_pad == "SAME_UPPER" else total - total // 2)
        elif auto_pad == "VALID":
            o = math.ceil((i - ext + 1) / s)
            begin.append(0)
        else:
            o = (i + pads[d] + pads[r + d] - ext) // s + 1
            begin.append(pads[d])
        out.append(o)
    return begin, out


def ref_conv(x, w, b, group, strides, dil, begin, out):
    """y[n, m, o] = b[m] + sum over the group's channels c and taps t of x[n, c, o*s - begin + t*d] * w[m, c, t]."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    n, m, cg = x.shape[0], w.shape[0], w.shape[1]
    kernel, in_sizes = w.shape[2:], x.shape[2:]
    y = np.zeros((n, m, *out))
    for bi, oc in itertools.product(range(n), range(m)):
        g = oc // (m // group)
        for o in np.ndindex(*out):
            acc = 0.0 if b is None else float(b[oc])
            for t in np.ndindex(*kernel):
                pos = tuple(o[d] * strides[d] - begin[d] + t[d] * dil[d] for d in range(len(out)))
                if all(0 <= p < s for p, s in zip(pos, in_sizes)):
                    acc += float(np.dot(x[(bi, slice(g * cg, (g + 1) * cg)) + pos], w[(oc, slice(None)) + t]))
            y[(bi, oc) + o] = acc
    return y


def conv_expected(x, w, b=None, group=1, strides=None, dilations=None, pads=None, auto_pad="NOTSET"):
    r = x.ndim - 2
    st, dil = strides or [1] * r, dilations or [1] * r
    begin, out = ref_geometry(x.shape[2:], w.shape[2:], st, dil, pads or [0] * 2 * r, auto_pad)
    return ref_conv(x, w, b, group, st, dil, begin, out)


def attrs_of(group=1, strides=None, dilations=None, pads=None, auto_pad="NOTSET", **extra):
    a = dict(extra)
    if group != 1:
        a["group"] = group
    for k, v in (("strides", strides), ("dilations", dilations), ("pads", pads)):
        if v is not None:
            a[k] = v
    if auto_pad != "NOTSET":
        a["auto_pad"] = auto_pad
    return a


def spy_on(monkeypatch, module, *names):
    """Wrap module's functions `names` so that each call appends its name to the returned list."""
    calls = []
    for name in names:
        original = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _f=original, _n=name: calls.append(_n) or _f(*a))
    return calls


# -- Conv ----------------------------------------------------------------------------------------

def run_conv(inputs, algorithm=None, constant=(), runs=1, version=22, **attrs):
    """Conv (node NODE) through onnx_mini.prepare(model, conv_algorithm=algorithm), the inputs whose
    index is in `constant` as initializers (known at prepare), the others fed; the results of `runs`
    runs of the one prepared model (the last one alone when runs == 1)."""
    names = ["" if x is None else f"in{k}" for k, x in enumerate(inputs)]
    while names and not names[-1]:
        names.pop()
    node = helper.make_node("Conv", names, ["out"], name=NODE, **attrs)
    fed = [(n, x) for k, (n, x) in enumerate(zip(names, inputs)) if n and k not in constant]
    inits = [numpy_helper.from_array(x, n) for k, (n, x) in enumerate(zip(names, inputs)) if n and k in constant]
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, elem_type(x.dtype), x.shape)
                                            for n, x in fed], [helper.make_empty_tensor_value_info("out")], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", version)], ir_version=10)
    prepared = onnx_mini.prepare(model, conv_algorithm=algorithm)
    results = [prepared.run([x for _, x in fed])[0] for _ in range(runs)]
    return results if runs > 1 else results[0]


def named_algorithm(case_id):
    """The algorithm a case's id names ('-shifted', '-im2col'), forced for it; None: the normal choice."""
    return next((a for a in ("shifted", "im2col") if a in case_id), None)


CONV_CASES = [  # (id, x shape, w shape, with bias, attributes)
    ("1d-strided-asym", (1, 2, 7), (3, 2, 3), True, dict(strides=[2], pads=[1, 2])),
    ("1d-shifted", (1, 3, 450), (2, 3, 3), True, dict(pads=[1, 1])),
    ("1d-dilated", (2, 3, 9), (2, 3, 2), False, dict(dilations=[3], pads=[0, 2])),
    ("2d-pointwise", (2, 3, 4, 5), (4, 3, 1, 1), True, {}),
    ("2d-pointwise-groups", (1, 6, 3, 3), (6, 2, 1, 1), False, dict(group=3)),
    ("2d-pointwise-strided", (1, 3, 5, 4), (2, 3, 1, 1), False, dict(strides=[2, 2])),
    ("2d-depthwise", (2, 3, 5, 5), (3, 1, 3, 3), True, dict(group=3, pads=[1, 1, 1, 1])),
    ("2d-depthwise-multiplier", (1, 3, 6, 5), (6, 1, 2, 3), True,
     dict(group=3, strides=[2, 1], dilations=[1, 2], pads=[0, 1, 1, 2])),
    ("2d-shifted", (1, 4, 21, 20), (3, 4, 3, 3), True, dict(pads=[1, 1, 1, 1])),
    ("2d-shifted-dilated-asym", (1, 3, 24, 22), (2, 3, 3, 3), False, dict(dilations=[2, 1], pads=[2, 0, 2, 3])),
    ("2d-shifted-same-lower", (1, 3, 20, 21), (2, 3, 2, 2), False, dict(auto_pad="SAME_LOWER")),
    ("2d-im2col-grouped", (2, 4, 7, 6), (4, 2, 3, 2), True, dict(group=2, strides=[2, 3], pads=[1, 0, 2, 1])),
    ("2d-im2col-small", (1, 2, 4, 4), (3, 2, 3, 3), True, dict(pads=[1, 1, 1, 1])),
    ("2d-same-upper", (1, 2, 7, 6), (3, 2, 4, 3), True, dict(strides=[2, 2], auto_pad="SAME_UPPER")),
    ("2d-same-lower", (1, 2, 7, 6), (3, 2, 4, 3), True, dict(strides=[2, 2], auto_pad="SAME_LOWER")),
    ("2d-valid", (1, 2, 7, 6), (3, 2, 4, 3), True, dict(strides=[2, 2], auto_pad="VALID")),
    ("2d-same-dilated", (1, 1, 5, 6), (2, 1, 2, 3), False, dict(dilations=[2, 2], auto_pad="SAME_UPPER")),
    ("3d-shifted", (1, 2, 8, 8, 7), (1, 2, 3, 3, 3), True, dict(pads=[1, 1, 1, 1, 1, 1])),
    ("3d-grouped-strided", (1, 4, 5, 4, 5), (2, 2, 2, 3, 2), True,
     dict(group=2, strides=[1, 2, 2], dilations=[2, 1, 1], pads=[0, 1, 0, 1, 0, 1])),
    ("3d-depthwise", (1, 2, 3, 4, 3), (4, 1, 2, 2, 2), False, dict(group=2, pads=[1, 0, 1, 0, 1, 0])),
]


@pytest.mark.parametrize("version", versions("Conv"))
@pytest.mark.parametrize("xs,ws,bias,attrs,algorithm", [pytest.param(*c[1:], named_algorithm(c[0]), id=c[0])
                                                        for c in CONV_CASES])
def test_conv_against_direct_loop(version, xs, ws, bias, attrs, algorithm):
    """Each case by the normal choice (run_node), and by the algorithm its id names when it names one."""
    x, w = ints(xs), ints(ws)
    b = ints((ws[0],)) if bias else None
    expected = conv_expected(x, w, b, **attrs).astype(np.float32)
    inputs = [x, w] + ([b] if bias else [])
    assert_same(run_node("Conv", version, inputs, **attrs_of(**attrs)), expected)
    if algorithm:
        assert_same(run_conv(inputs, algorithm, version=version, **attrs_of(**attrs)), expected)


@pytest.mark.parametrize("stacked", [True, False])
@pytest.mark.parametrize("case", ["2d-pointwise-groups", "2d-im2col-grouped"])
def test_conv_groups_in_one_stacked_product_or_one_call_each(monkeypatch, case, stacked):
    """Small per-group products go to one stacked matmul, large ones one BLAS call each (the table's
    bound moved to reach each branch of grouped_matmul)."""
    monkeypatch.setattr(thresholds, "STACKED_MAX_MACS", 10 ** 9 if stacked else 0)
    _, xs, ws, bias, attrs = next(c for c in CONV_CASES if c[0] == case)
    x, w = ints(xs), ints(ws)
    b = ints((ws[0],)) if bias else None
    expected = conv_expected(x, w, b, **attrs).astype(np.float32)
    assert_same(run_node("Conv", 22, [x, w] + ([b] if bias else []), **attrs_of(**attrs)), expected)


@pytest.fixture
def winograd_everywhere(monkeypatch):
    """Winograd F(2x2, 3x3) takes wide layers only (thresholds.WINOGRAD_*): the tests force it with
    conv_algorithm="winograd" on small ones; this counts its calls (per image)."""
    calls = []
    original = winograd.conv
    monkeypatch.setattr(winograd, "conv", lambda *a: calls.append(a[0].shape) or original(*a))
    return calls


@pytest.mark.parametrize("xs,ms,bias,attrs", [
    ((1, 3, 6, 6), 4, True, dict(pads=[1, 1, 1, 1])),                   # even output
    ((1, 2, 7, 5), 3, False, dict(pads=[1, 1, 1, 1])),                  # odd: the last tiles cropped
    ((2, 3, 8, 9), 2, True, dict(pads=[0, 0, 0, 0])),                   # batch of 2, no padding
    ((1, 2, 6, 7), 2, True, dict(pads=[2, 0, 1, 2])),                   # asymmetric padding
    ((1, 2, 5, 6), 3, False, dict(auto_pad="SAME_LOWER")),
    ((1, 1, 3, 3), 1, True, dict(pads=[0, 0, 0, 0])),                   # a single output pixel
])
@pytest.mark.parametrize("read_only", [True, False])
def test_conv_winograd_against_direct_loop(winograd_everywhere, xs, ms, bias, attrs, read_only):
    """Small integers: every transform is exact (factors 1 and 1/2), so the result must be too.
    read_only: W (and B) constants of the model, else fed at run time."""
    x, w = ints(xs), ints((ms, xs[1], 3, 3))
    b = ints((ms,)) if bias else None
    expected = conv_expected(x, w, b, **attrs).astype(np.float32)
    # the second run with a constant W takes the transform made by the first
    for got in run_conv([x, w] + ([b] if bias else []), "winograd", constant=(1, 2) if read_only else (), runs=2,
                        **attrs_of(**attrs)):
        assert_same(got, expected)
    assert len(winograd_everywhere) == 2 * xs[0]


def test_conv_winograd_float16_computes_in_float32_from_the_cached_constant(winograd_everywhere):
    x, w = ints((1, 3, 6, 5), dtype=np.float16), ints((2, 3, 3, 3), dtype=np.float16)
    want = conv_expected(x.astype(np.float32), w.astype(np.float32), pads=[1, 1, 1, 1]).astype(np.float16)
    for got in run_conv([x, w], "winograd", constant=(1,), runs=2, pads=[1, 1, 1, 1]):
        assert_same(got, want)
    assert len(winograd_everywhere) == 2


def test_conv_winograd_float64_and_fused_epilogue(winograd_everywhere):
    x, w, b = RNG.standard_normal((2, 5, 9, 8)), RNG.standard_normal((6, 5, 3, 3)), RNG.standard_normal(6)
    z = RNG.standard_normal((2, 6, 9, 8))
    want = np.maximum(conv_expected(x, w, b, pads=[1, 1, 1, 1]) + z, 0)

    def epilogue(y, i0, i1):       # what ops/fused.py's fused Conv passes: residual, then Relu
        y += z[i0:i1]
        np.maximum(y, 0, out=y)
    got = conv.Convolution(pads=[1, 1, 1, 1], algorithm="winograd")(x, w, b, epilogue=epilogue)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert len(winograd_everywhere) == 2


@pytest.mark.parametrize("bias", [True, False])
def test_one_image_finished_by_runs_of_channel_planes(monkeypatch, bias):
    # a one-image im2col output's B and an elementwise epilogue (the fused Conv's activation alone) by runs
    # of channel planes (thresholds.FINISH_BLOCK_BYTES): one plane a block gives the whole's bits
    from onnx_mini.ops.fused import fused_conv
    x, w = RNG.standard_normal((1, 3, 161, 160)).astype(np.float32), RNG.standard_normal((6, 3, 3, 3)).astype(np.float32)
    b = RNG.standard_normal(6).astype(np.float32) if bias else None
    consts = {1: w} if b is None else {1: w, 2: b}
    args = (x, w) if b is None else (x, w, b)
    attrs = dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2], activation="HardSwish")
    whole = fused_conv(**attrs, _constants=consts)(*args)
    monkeypatch.setattr(thresholds, "FINISH_BLOCK_BYTES", 1)
    finish, blocked = conv.run._finish_planes, []
    monkeypatch.setattr(conv.run, "_finish_planes", lambda *a: blocked.append(1) or finish(*a))
    blocks = fused_conv(**attrs, _constants=consts)
    np.testing.assert_array_equal(blocks(*args), whole)
    assert blocked
    y = conv_expected(x.astype(np.float64), w.astype(np.float64), None if b is None else b.astype(np.float64),
                      strides=[2, 2], pads=[1, 1, 1, 1])
    np.testing.assert_allclose(whole, y * np.clip(y / 6 + 0.5, 0, 1), rtol=1e-5, atol=1e-5)
    assert set(blocks.algorithms.values()) == {"im2col"}


@pytest.mark.parametrize("where", ["input", "weights", "constant weights"])
def test_conv_winograd_leaves_infinities_to_the_direct_forms(winograd_everywhere, where):
    """An infinity would come out of the transforms as inf - inf = NaN: such values go to im2col /
    shifted windows, which give the convolution's +-inf (a forced Winograd included)."""
    x, w = ints((1, 2, 6, 6), lo=1, hi=2), ints((3, 2, 3, 3), lo=1, hi=2)
    if where == "input":
        x[0, 1, 2, 3] = np.inf
    else:
        w[1, 0, 1, 1] = -np.inf
    want = conv_expected(x, w, pads=[1, 1, 1, 1]).astype(np.float32)
    assert np.isinf(want).any()
    assert_same(run_conv([x, w], "winograd", constant=(1,) if where == "constant weights" else (),
                         pads=[1, 1, 1, 1]), want)
    assert winograd_everywhere == []


def test_conv_winograd_transforms_by_hand():
    w = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
    f32 = np.dtype(np.float32)
    u = winograd.weights(w, f32)
    assert u.shape == (16, 4, 3) and u.dtype == np.float32
    g = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]])
    np.testing.assert_allclose(u[5], np.einsum("a,mcab,b->mc", g[1], w, g[1]), rtol=1e-6)   # position (1, 1)
    w[0, 0] *= 1e30                                     # every position (k, l) = 4k + l, large values too
    u = winograd.weights(w, f32)
    for k in range(4):
        for p in range(4):
            want = np.einsum("a,mcab,b->mc", g[k], w.astype(np.float64), g[p]).astype(np.float32)
            np.testing.assert_array_equal(u[4 * k + p], want)
    assert winograd.weights(w.astype(np.float16), f32).dtype == np.float32     # float16: into float32


@pytest.mark.parametrize("transform,algorithm,xs,ws,attrs", [
    ("winograd", "winograd", (1, 3, 6, 5), (4, 3, 3, 3), dict(pads=[1, 1, 1, 1])),
    ("banded", "depthwise-banded", (1, 4, 6, 5), (4, 1, 3, 3), dict(group=4, pads=[1, 1, 1, 1])),
])
def test_conv_constant_weights_transformed_once_fed_ones_every_call(monkeypatch, transform, algorithm, xs, ws, attrs):
    """A constant W's transform is made once for the model (the same array on every run); a W fed at
    run time is transformed on every call."""
    module = {"winograd": winograd, "banded": banded}[transform]
    made, used = [], []
    make, compute = module.weights, module.conv
    monkeypatch.setattr(module, "weights", lambda *a: made.append(1) or make(*a))
    monkeypatch.setattr(module, "conv", lambda x, t, *a: used.append(t) or compute(x, t, *a))
    x, w = ints(xs), ints(ws)
    want = conv_expected(x, w, **attrs).astype(np.float32)
    for got in run_conv([x, w], algorithm, constant=(1,), runs=3, **attrs):
        assert_same(got, want)
    assert len(made) == 1 and len(used) == 3 and used[0] is used[1] is used[2]
    made.clear()
    for got in run_conv([x, w], algorithm, runs=3, **attrs):
        assert_same(got, want)
    assert len(made) == 3


def test_conv_constant_bias_column_made_by_the_factory(monkeypatch):
    """The pointwise bias column of a constant W and B is made when the kernel is made, before any run."""
    made = []
    make = pointwise.bias_column
    monkeypatch.setattr(pointwise, "bias_column", lambda *a: made.append(1) or make(*a))
    x, w, b = ints((1, 4, 3, 3)), ints((12, 4, 1, 1)), ints((12,))
    fn = conv.conv_1(_constants={1: w, 2: b})
    assert len(made) == 1
    for _ in range(2):
        assert_same(fn(x, w, b), conv_expected(x, w, b).astype(np.float32))
    assert len(made) == 1 and fn.algorithms == {x.shape: "pointwise"}


def select_3x3(c, m, side, dtype=np.float32, stride=1, group=1, n=1, forced=None, finite=True):
    """select for X (n, c, side, side), W (m, c/group, 3, 3), pads 1."""
    out = (side + 2 - 3) // stride + 1
    return conv.select((n, c, side, side), (m, c // group, 3, 3), dtype, group=group, kernel=[3, 3],
                       strides=[stride, stride], dilations=[1, 1], begin=[1, 1], end=[1, 1], out=[out, out],
                       finite=finite, forced=forced)


@pytest.mark.parametrize("c,m,side,formulation", [(64, 64, 56, "im2col"), (64, 64, 224, "shifted"),
                                                   (4, 5, 224, "im2col"), (5, 4, 24, "im2col"),
                                                   (128, 64, 56, "shifted")])
def test_conv_same_channels_go_shifted_when_the_columns_are_large(monkeypatch, c, m, side, formulation):
    """Where strips does not take the Conv (off here; every one of these would go strips): as many
    outputs as inputs, shifted windows once im2col's columns would pass
    thresholds.SHIFT_SAME_MIN_COLUMN_BYTES (VGG's 224x224x64: 110 MB; 56x56x64: 7 MB); fewer outputs
    from thresholds.SHIFT_MIN_PIXELS output pixels on."""
    assert select_3x3(c, m, side) == "strips"
    monkeypatch.setattr(thresholds, "STRIPS_MIN_PIXELS", 1 << 62)
    assert select_3x3(c, m, side) == formulation


@pytest.mark.parametrize("algorithm", ["im2col", "shifted"])
@pytest.mark.parametrize("c,m", [(4, 4), (4, 5), (5, 4)])
def test_conv_shifted_and_im2col_forced(monkeypatch, c, m, algorithm):
    calls = []
    for module, function, name in ((shifted, "conv", "shifted"), (im2col, "conv", "im2col"),
                                   (im2col, "conv_biased", "im2col"), (im2col, "conv_last", "im2col")):
        original = getattr(module, function)
        monkeypatch.setattr(module, function, lambda *a, _f=original, _n=name: calls.append(_n) or _f(*a))
    x, w = ints((1, c, 24, 24)), ints((m, c, 3, 3))
    attrs = dict(pads=[1, 1, 1, 1])
    assert_same(run_conv([x, w], algorithm, **attrs_of(**attrs)), conv_expected(x, w, **attrs).astype(np.float32))
    assert calls == [algorithm]


@pytest.mark.parametrize("case", [c for c in CONV_CASES if "shifted" in c[0] or "im2col" in c[0]], ids=lambda c: c[0])
def test_conv_cases_take_the_formulation_they_name(case, monkeypatch):
    """The '-shifted' and '-im2col' cases above reach the formulation in their name when it is forced
    (so a change of the selection rule cannot leave a formulation untested)."""
    calls = []
    for module, function, name in ((shifted, "conv", "shifted"), (im2col, "conv", "im2col"),
                                   (im2col, "conv_biased", "im2col"), (im2col, "conv_last", "im2col")):
        original = getattr(module, function)
        monkeypatch.setattr(module, function, lambda *a, _f=original, _n=name: calls.append(_n) or _f(*a))
    _, xs, ws, bias, attrs = case
    run_conv([ints(xs), ints(ws)] + ([ints((ws[0],))] if bias else []), named_algorithm(case[0]), **attrs_of(**attrs))
    assert calls and set(calls) == {named_algorithm(case[0])}

DEPTHWISE_CASES = [  # (id, x shape, w shape, with bias, attributes): one input channel per group
    ("1d-strided-asym", (2, 3, 11), (6, 1, 3), True, dict(group=3, strides=[2], pads=[2, 1])),
    ("2d-same", (2, 4, 9, 8), (4, 1, 3, 3), True, dict(group=4, pads=[1, 1, 1, 1])),
    ("2d-stride2-even", (1, 3, 10, 8), (3, 1, 3, 3), True, dict(group=3, strides=[2, 2], pads=[1, 1, 1, 1])),
    ("2d-stride2-odd", (3, 2, 7, 9), (2, 1, 3, 3), False, dict(group=2, strides=[2, 2], pads=[1, 1, 1, 1])),
    ("2d-multiplier-dilated-asym", (2, 2, 9, 10), (6, 1, 3, 2), False,
     dict(group=2, strides=[1, 3], dilations=[2, 3], pads=[0, 2, 3, 1])),
    ("2d-pads-past-the-kernel", (1, 2, 4, 5), (2, 1, 2, 3), True, dict(group=2, strides=[3, 2], pads=[3, 4, 2, 5])),
    ("2d-valid", (1, 3, 8, 9), (3, 1, 4, 2), True, dict(group=3, auto_pad="VALID")),
    ("2d-same-lower", (2, 3, 7, 8), (3, 1, 4, 4), False, dict(group=3, dilations=[1, 2], auto_pad="SAME_LOWER")),
    ("2d-1x1-strided", (1, 4, 6, 7), (8, 1, 1, 1), True, dict(group=4, strides=[2, 3], pads=[0, 1, 1, 0])),
    ("3d", (2, 2, 5, 6, 4), (4, 1, 3, 2, 3), True,
     dict(group=2, strides=[1, 2, 1], dilations=[1, 1, 2], pads=[1, 0, 2, 1, 1, 0])),
]


DEPTHWISE = {"flat": "depthwise-flat", "channels-last": "depthwise-channels-last", "einsum": "depthwise-einsum",
             "banded": "depthwise-banded"}


def run_depthwise(layout, inputs, **attrs):
    """Depthwise Conv computes with banded matrices (narrow 2-D outputs, one output channel per input
    channel, finite values), on flat padded planes (large images), or channels-last (small ones):
    one einsum over the windows when there is one output channel per input channel (and strides or
    a small output), else a multiply-add per tap. Force one of the four (where it does not apply,
    the normal choice is made)."""
    return run_conv(inputs, DEPTHWISE[layout], **attrs)


@pytest.mark.parametrize("layout", ["flat", "channels-last", "einsum", "einsum-large", "banded"])
@pytest.mark.parametrize("xs,ws,bias,attrs", [pytest.param(*c[1:], id=c[0]) for c in DEPTHWISE_CASES])
def test_conv_depthwise_layouts(monkeypatch, layout, xs, ws, bias, attrs):
    """Each depthwise layout (forced: run_depthwise) on small inputs, in blocks of images or
    channels as small as they go, a thread per block; einsum-large: the einsum as it runs on large
    images (column phases when strided along the last axis, transposes in blocks)."""
    if layout == "einsum-large":
        layout = "einsum"
        monkeypatch.setattr(thresholds, "TRANSPOSE_MIN_PIXELS", 1)
        monkeypatch.setattr(thresholds, "TRANSPOSE_CHANNELS", 2)
        monkeypatch.setattr(thresholds, "TRANSPOSE_BLOCK_PIXELS", 3)
    monkeypatch.setattr(thresholds, "DW_BLOCK_BYTES", 1)
    monkeypatch.setattr(thresholds, "DW_MIN_PART_MACS", 1)
    x, w = ints(xs), ints(ws)
    b = ints((ws[0],)) if bias else None
    expected = conv_expected(x, w, b, **attrs).astype(np.float32)
    assert_same(run_depthwise(layout, [x, w] + ([b] if bias else []), **attrs_of(**attrs)), expected)


@pytest.mark.parametrize("xs,strides,mult,layout", [((1, 16, 8, 8), [2, 2], 1, "im2col"),
                                                     ((1, 16, 56, 56), [2, 2], 1, "im2col"),
                                                     ((1, 32, 60, 60), [2, 2], 1, "im2col"),
                                                     ((1, 48, 14, 14), [2, 2], 1, "depthwise-einsum"),
                                                     ((1, 96, 8, 8), [2, 2], 1, "depthwise-einsum"),
                                                     ((1, 16, 120, 120), [2, 2], 1, "im2col"),
                                                     ((1, 33, 70, 70), [2, 2], 1, "depthwise-flat"),
                                                     ((1, 16, 70, 70), [2, 2], 2, "depthwise-flat"),
                                                     ((2, 64, 28, 28), [1, 1], 1, "depthwise-einsum"),
                                                     ((1, 16, 30, 30), [1, 1], 1, "depthwise-einsum"),
                                                     ((1, 128, 30, 30), [1, 1], 1, "depthwise-einsum"),
                                                     ((1, 768, 14, 14), [1, 1], 1, "depthwise-banded"),
                                                     ((1, 8, 10, 10), [1, 1], 2, "depthwise-channels-last"),
                                                     ((1, 4, 40, 40), [1, 1], 1, "depthwise-flat")])
def test_conv_depthwise_picks_its_layout_by_shape(monkeypatch, xs, strides, mult, layout):
    """Strided images: im2col up to 32 channels (thresholds.DW_IM2COL_MAX_CHANNELS; large ones while the
    columns stay within DW_IM2COL_MAX_COLUMN_BYTES: 16 x 9 x 60 x 60 x 4 = 2 MB), small ones the einsum above;
    banded products (up to 28 output columns) for stride-1 layers whose einsum would tile over 300 kB of
    weights (768 x 14 x 9 floats); the einsum for every other small image with one output channel per
    input channel, channels-last with a channel multiplier, flat for large images (over 1024 output
    pixels; the kernel's `algorithms` says which ran)."""
    c = xs[1]
    x, w = ints(xs), ints((c * mult, 1, 3, 3))
    attrs = dict(group=c, strides=strides, pads=[1, 1, 1, 1])
    fn = conv.conv_1(**attrs_of(**attrs))
    assert_same(fn(x, w), conv_expected(x, w, **attrs).astype(np.float32))
    assert fn.algorithms == {x.shape: layout}
    assert select_3x3(c, c * mult, xs[2], stride=strides[0], group=c, n=xs[0]) == layout


def test_conv_depthwise_strided_im2col_up_to_its_column_bytes():
    """Large strided images with few channels go im2col while C x 9 x pixels of columns stay within
    thresholds.DW_IM2COL_MAX_COLUMN_BYTES (4 MB): MobileNet's 16 x 112 x 112 /2 layer (1.8 MB) and 32
    channels (3.6 MB), not 16 x 224 x 224 /2 (7.2 MB) nor 32 channels in float64; flat with 33 channels."""
    assert thresholds.DW_IM2COL_MAX_COLUMN_BYTES == 4 << 20
    assert select_3x3(16, 16, 112, stride=2, group=16) == select_3x3(32, 32, 112, stride=2, group=32) == "im2col"
    assert select_3x3(16, 16, 112, np.float64, stride=2, group=16) == "im2col"
    assert select_3x3(16, 16, 224, stride=2, group=16) == "depthwise-flat"
    assert select_3x3(32, 32, 112, np.float64, stride=2, group=32) == "depthwise-flat"
    assert select_3x3(33, 33, 112, stride=2, group=33) == "depthwise-flat"
    assert select_3x3(16, 16, 112, group=16) == "depthwise-flat"          # unstrided


@pytest.mark.parametrize("layout", ["flat", "channels-last", "einsum", "banded"])
def test_conv_depthwise_edges_do_not_leak_across_rows(monkeypatch, layout):
    """The flat layout reads a row's neighbours where the image has padding and discards those
    products: infinities in the first and last columns must reach only their own windows."""
    x = ints((2, 2, 6, 5))
    x[:, 0, 2, 0] = np.inf
    x[:, 1, 3, 4] = -np.inf
    x[1, 1, 0, 0] = np.nan
    w = ints((2, 1, 3, 3), lo=1, hi=2)
    for attrs in (dict(group=2, pads=[1, 1, 1, 1]), dict(group=2, strides=[2, 2], pads=[1, 1, 1, 1])):
        assert_same(run_depthwise(layout, [x, w], **attrs_of(**attrs)), conv_expected(x, w, **attrs).astype(np.float32))


@pytest.mark.parametrize("dtype,c", [(np.float32, 128), (np.float64, 64), (np.float32, 12)])
@pytest.mark.parametrize("strides", [[1, 1], [2, 1], [1, 2]])
def test_conv_depthwise_einsum_rows_merged_and_gapped(monkeypatch, dtype, c, strides):
    """The einsum layout merges the last output axis with the channels when its stride is 1 (weights
    tiled along the row), and leaves a gap after each channels-last row or pixel when C values span
    a multiple of 512 bytes (128 float32, 64 float64): the same sums either way, bias included."""
    assert (c * np.dtype(dtype).itemsize % thresholds.CACHE_SET_BYTES == 0) == (c != 12)
    x, w, b = ints((2, c, 5, 7), dtype=dtype), ints((c, 1, 3, 2), dtype=dtype), ints((c,), dtype=dtype)
    attrs = dict(group=c, strides=strides, pads=[1, 0, 1, 1])
    expected = conv_expected(x, w, b, **attrs).astype(dtype)
    assert_same(run_depthwise("einsum", [x, w, b], **attrs_of(**attrs)), expected)


@pytest.mark.parametrize("xs, kernel, strides, dil, pads", [
    ((2, 3, 9, 11), [3, 3], [2, 2], [1, 1], [1, 1, 1, 1]),
    ((1, 4, 7, 13), [3, 5], [1, 3], [1, 1], [0, 2, 1, 2]),
    ((1, 2, 6, 12), [2, 3], [2, 2], [1, 2], [1, 0, 0, 1]),
    ((1, 3, 5, 14), [3, 3], [1, 2], [2, 3], [2, 3, 2, 3]),
    ((1, 2, 3, 3), [3, 3], [3, 4], [1, 1], [4, 5, 4, 5]),       # more padding than input
    ((1, 5, 12), [4], [3], [1], [2, 1]),                        # 1-D
])
@pytest.mark.parametrize("dtype, c_scale", [(np.float32, 1), (np.float32, 32), (np.float64, 16)])
@pytest.mark.parametrize("phases", [False, True])
def test_conv_depthwise_einsum_strided_last_axis(monkeypatch, xs, kernel, strides, dil, pads, dtype, c_scale,
                                                  phases):
    """The einsum layout with a stride along the last axis: its inner loop along C, or (large images,
    forced here) along whole rows of the input's column phases; strides, dilations and paddings of
    every kind, channel counts whose pixels get a cache gap (128 float32, 64 float64), against the
    direct sum."""
    if phases:
        monkeypatch.setattr(thresholds, "TRANSPOSE_MIN_PIXELS", 1)
        monkeypatch.setattr(thresholds, "TRANSPOSE_CHANNELS", 5)
    xs = (xs[0], xs[1] * c_scale, *xs[2:])
    c = xs[1]
    x, w, b = ints(xs, dtype=dtype), ints((c, 1, *kernel), dtype=dtype), ints((c,), dtype=dtype)
    attrs = dict(group=c, strides=strides, dilations=dil, pads=pads)
    assert_same(run_depthwise("einsum", [x, w, b], **attrs_of(**attrs)), conv_expected(x, w, b, **attrs).astype(dtype))


@pytest.mark.parametrize("forced", [None, "depthwise-einsum"])
@pytest.mark.parametrize("strides,dil", [([2, 2], [1, 1]), ([1, 2], [1, 1]), ([2, 3], [2, 2])])
def test_conv_depthwise_einsum_phases_with_infinities_sum_the_taps_alone(monkeypatch, forced, strides, dil):
    """The einsum over column phases weighs the values its slots without a tap read by 0 (3x3, stride
    2 along the last axis: slot (1, 1) reads padded column 2j + 3, outside output j's window), and
    0 * inf is NaN: sums that are not all finite are made again from the taps' slots alone, so an
    infinity or a NaN of X reaches only its own windows; finite sums are the einsum's."""
    from onnx_mini.ops.nn.conv import depthwise_channels_last
    monkeypatch.setattr(thresholds, "TRANSPOSE_MIN_PIXELS", 1)      # the phases from this small image on
    calls = spy_on(monkeypatch, depthwise_channels_last, "sum_taps")
    attrs = dict(group=40, strides=strides, dilations=dil, pads=[1, 1, 1, 1])
    fn = conv.conv_1(_options={"conv_algorithm": forced}, **attrs_of(**attrs))
    w, b = ints((40, 1, 3, 3), lo=1, hi=2), ints((40,))
    x = ints((2, 40, 7, 12))
    x[0, :, 3, 4] = np.inf          # padded column 5: a slot without a tap of output column 1 (stride 2)
    x[1, :3, 2, 6] = -np.inf
    x[1, 5, 2, 7] = np.nan
    expected = conv_expected(x, w, b, **attrs).astype(np.float32)
    assert np.isfinite(expected).sum() > expected.size // 2
    assert_same(fn(x, w, b), expected)
    assert fn.algorithms == {x.shape: "depthwise-einsum"} and calls == ["sum_taps"]
    x = ints((2, 40, 7, 12))
    assert_same(fn(x, w, b), conv_expected(x, w, b, **attrs).astype(np.float32))
    assert calls == ["sum_taps"]


@pytest.mark.parametrize("block,channels", [(1, 2), (10, 3), (14, 64), (1000, 1000)])
@pytest.mark.parametrize("xs,strides", [((2, 5, 7, 6), [1, 1]), ((1, 128, 9, 5), [2, 1]), ((1, 3, 4, 5, 6), [1, 2, 1])])
def test_conv_depthwise_einsum_transposes_in_blocks(monkeypatch, block, channels, xs, strides):
    """The einsum's input goes to channels-last in blocks of channels, and its channels-last result
    back to NCHW in blocks of rows of the first output axis (at least one row; last blocks partial),
    gapped rows (128 float32 channels) included."""
    monkeypatch.setattr(thresholds, "TRANSPOSE_MIN_PIXELS", 1)
    monkeypatch.setattr(thresholds, "TRANSPOSE_BLOCK_PIXELS", block)
    monkeypatch.setattr(thresholds, "TRANSPOSE_CHANNELS", channels)
    c, r = xs[1], len(xs) - 2
    x, w, b = ints(xs), ints((c, 1) + (3,) * r), ints((c,))
    attrs = dict(group=c, strides=strides, pads=[1] * (2 * r))
    assert_same(run_depthwise("einsum", [x, w, b], **attrs_of(**attrs)),
                conv_expected(x, w, b, **attrs).astype(np.float32))


def test_conv_depthwise_einsum_weights_cached_per_constant_w(monkeypatch):
    """The einsum layout's tiled weights are made once for the constant W (and per output geometry):
    another W of the same shape, another input size, or a W changed in place between calls each get
    their own, against the direct sum."""
    attrs = dict(group=6, pads=[1, 1, 1, 1])
    w1, w2 = ints((6, 1, 3, 3)), ints((6, 1, 3, 3), lo=1, hi=4)
    w1.flags.writeable = w2.flags.writeable = False
    run = conv.conv_1(kernel_shape=[3, 3], _constants={1: w1}, _options={"conv_algorithm": "depthwise-einsum"},
                      **attrs)
    for x in (ints((1, 6, 5, 7)), ints((2, 6, 4, 9)), ints((1, 6, 5, 7))):
        for w in (w1, w2, w1):
            assert_same(run(x, w), conv_expected(x, w, **attrs).astype(np.float32))
    w = ints((6, 1, 3, 3))
    x = ints((1, 6, 5, 7))
    assert_same(run(x, w), conv_expected(x, w, **attrs).astype(np.float32))
    w *= 3
    assert_same(run(x, w), conv_expected(x, w, **attrs).astype(np.float32))


def _bench_floors(monkeypatch):
    """benchmarks/bench_floors.py as a module."""
    # the benchmarks default ONNX_MINI_MALLOC to "tuned" on import: not for this process's later tests
    monkeypatch.setenv("ONNX_MINI_MALLOC", os.environ.get("ONNX_MINI_MALLOC", "recycle"))
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import bench_floors
    finally:
        sys.path.pop(0)
    return bench_floors


@pytest.mark.parametrize("xs,strides,dil,pads", [((1, 3, 9, 11), [1, 1], [1, 1], [1, 1, 1, 1]),
                                                  ((2, 4, 10, 8), [2, 2], [1, 1], [1, 1, 1, 1]),
                                                  ((1, 5, 9, 7), [2, 2], [1, 1], [1, 1, 1, 1]),
                                                  ((1, 3, 12, 13), [2, 1], [2, 1], [2, 0, 1, 2]),
                                                  ((1, 2, 11, 10), [3, 2], [1, 2], [0, 2, 2, 1])])
def test_bench_floors_depthwise_floors_compute_the_conv(monkeypatch, xs, strides, dil, pads):
    """benchmarks/bench_floors.py's depthwise floors time the convolution itself: every variant of each
    floor (taps on stride phases, im2col columns, the channels-last einsum), run after its output was
    set to NaN, leaves Y equal to the direct sum (a floor computing less would prove nothing)."""
    bench_floors = _bench_floors(monkeypatch)
    c = xs[1]
    rng = np.random.default_rng(7)
    x, w = rng.standard_normal(xs).astype(np.float32), rng.standard_normal((c, 1, 3, 3)).astype(np.float32)
    attrs = dict(group=c, kernel_shape=[3, 3], strides=strides, dilations=dil, pads=pads)
    expected = conv_expected(x.astype(np.float64), w.astype(np.float64), group=c, strides=strides, dilations=dil,
                             pads=pads)
    for make in bench_floors.FLOORS.values():
        variants, result = make(x, w, attrs)
        assert len(variants) >= 2
        for label, run in variants.items():
            result()[...] = np.nan
            run()
            np.testing.assert_allclose(result(), expected, rtol=1e-5, atol=1e-5, err_msg=label)


@pytest.mark.parametrize("xs,m,group", [((1, 4, 3, 5), 12, 1), ((3, 4, 2, 2), 16, 2), ((1, 6, 4, 1), 24, 3)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("constant_b", [True, False])
def test_conv_pointwise_expanding_sums_the_bias_in_the_product(monkeypatch, xs, m, group, dtype, constant_b):
    """A 1x1 Conv with at least twice as many outputs as inputs (plus one per group) takes its bias as
    one more column of W against a row of ones after each group of X; the same sums (bias included,
    infinities and NaN where they reach), whether B is a constant (its column kept with W's) or not."""
    calls = spy_on(monkeypatch, pointwise, "with_ones_row")
    x, w, b = ints(xs, dtype=dtype), ints((m, xs[1] // group, 1, 1), dtype=dtype), ints((m,), dtype=dtype)
    x[0, 0, 0, 0], x[-1, -1, -1, -1] = np.inf, np.nan
    run = conv.conv_1(group=group, _constants={1: w, 2: b} if constant_b else {1: w})
    with np.errstate(invalid="ignore"):            # inf * 0 in the sums: NaN where it reaches, as wanted
        want = conv_expected(x.astype(np.float64), w, b, group=group).astype(dtype)
        for _ in range(2):
            assert_same(run(x, w, b), want)
        assert len(calls) == 2
        b2 = b + 1                                 # another bias with the same W: its own column
        assert_same(run(x, w, b2), conv_expected(x.astype(np.float64), w, b2, group=group).astype(dtype))


def test_conv_pointwise_keeps_the_bias_pass_when_the_output_is_not_wider(monkeypatch):
    calls = spy_on(monkeypatch, pointwise, "with_ones_row")
    x, w, b = ints((1, 4, 3, 3)), ints((7, 4, 1, 1)), ints((7,))
    assert_same(conv.conv_1()(x, w, b), conv_expected(x, w, b).astype(np.float32))
    assert calls == []


def test_conv_depthwise_banded_matrices_by_hand():
    w = np.arange(1, 13, dtype=np.float32).reshape(2, 1, 2, 3)      # C=2, kh=2, kw=3
    f32 = np.dtype(np.float32)
    t = banded.weights(w, f32, width=5, out_w=2, stride=2, dil=1)     # 2 outputs, stride 2, 3 taps: 5 columns
    assert t.shape == (2, 2, 5, 2)
    # output column j reads padded columns 2j .. 2j+2: row di of channel c holds W[c, 0, di] there
    assert_same(t[1, 0], np.array([[4, 0], [5, 0], [6, 4], [0, 5], [0, 6]], np.float32))
    assert_same(t[0, 1], np.array([[7, 0], [8, 0], [9, 7], [0, 8], [0, 9]], np.float32))


@pytest.mark.parametrize("constant", [True, False])
def test_conv_depthwise_banded_needs_finite_weights(monkeypatch, constant):
    """A zero of the banded matrices times an infinity is NaN: a non-finite W (known at prepare, or
    fed) goes per tap even when banded is forced."""
    made = spy_on(monkeypatch, banded, "weights")
    x, w = ints((1, 2, 6, 6)), ints((2, 1, 3, 3), lo=1, hi=2)
    w[1, 0, 1, 1] = np.inf          # the centre tap: it never reads padding
    attrs = dict(group=2, pads=[1, 1, 1, 1])
    fn = conv.conv_1(_constants={1: w} if constant else {}, _options={"conv_algorithm": "depthwise-banded"}, **attrs)
    assert_same(fn(x, w), conv_expected(x, w, **attrs).astype(np.float32))
    assert made == [] and fn.algorithms == {x.shape: "depthwise-einsum"}


def test_conv_depthwise_with_an_infinite_weight_is_exact():
    """Banded products multiply every padded column by zeros of T: a non-finite W goes per tap."""
    x, w = ints((1, 3, 6, 6)), ints((3, 1, 3, 3), lo=1, hi=2)
    w[1, 0, 1, 1] = np.inf          # the centre tap: it never reads padding
    attrs = dict(group=3, pads=[1, 1, 1, 1])
    assert_same(run_node("Conv", 22, [x, w], **attrs_of(**attrs)), conv_expected(x, w, **attrs).astype(np.float32))


def test_conv_kernel_shape_attribute_and_float64_values():
    x = RNG.standard_normal((2, 3, 6, 5))
    w = RNG.standard_normal((4, 3, 3, 2))
    got = run_node("Conv", 11, [x, w], kernel_shape=[3, 2], strides=[1, 2], pads=[1, 0, 0, 1])
    np.testing.assert_allclose(got, conv_expected(x, w, strides=[1, 2], pads=[1, 0, 0, 1]), rtol=1e-12, atol=1e-12)
    assert got.dtype == np.float64


@pytest.mark.parametrize("version,tname", type_params("Conv", versions("Conv")))
@pytest.mark.parametrize("xs,ws,attrs,algorithm", [
    ((1, 2, 5, 5), (3, 2, 3, 3), dict(pads=[1, 0, 1, 2]), "im2col"),
    ((1, 2, 3, 4), (2, 2, 1, 1), {}, "pointwise"),
    ((1, 2, 4, 4), (2, 1, 3, 3), dict(group=2, pads=[1, 1, 1, 1]), None),          # depthwise: the normal choice
    ((1, 2, 20, 20), (1, 2, 2, 2), dict(auto_pad="SAME_UPPER"), "shifted"),        # shifted windows
], ids=["im2col", "pointwise", "depthwise", "shifted"])
def test_conv_every_type(version, tname, xs, ws, attrs, algorithm):
    dt = np_type(tname)
    x, w, b = ints(xs, dtype=dt), ints(ws, dtype=dt), ints((ws[0],), dtype=dt)
    expected = conv_expected(x, w, b, **attrs).astype(dt)        # small integers: exact in every type
    assert_same(run_node("Conv", version, [x, w, b], **attrs_of(**attrs)), expected)
    if algorithm:       # the id's algorithm, forced
        assert_same(run_conv([x, w, b], algorithm, version=version, **attrs_of(**attrs)), expected)


@pytest.mark.parametrize("group, w_shape", [(1, (3, 2, 3, 3)), (2, (4, 1, 3, 3)), (2, (6, 1, 1, 1))])
def test_conv_kernel_keeps_each_shapes_geometry_and_plan_apart(monkeypatch, group, w_shape):
    """One Conv kernel called with inputs of several sizes (more than it keeps), a W of another
    kernel size and a wrong one: each call gets its own geometry and layout plan, and the checks
    still run for a shape not seen before."""
    monkeypatch.setattr(thresholds, "LAYOUTS", 3)
    fn = conv.conv_1(group=group, pads=[1, 1, 1, 1])
    w = ints(w_shape)
    for side in (5, 9, 6, 5, 40, 7, 9, 3, 5):
        x = ints((1, 2, side, side + 1))
        expected = conv_expected(x, w, group=group, pads=[1, 1, 1, 1]).astype(np.float32)
        assert_same(fn(x, w), expected)
    w2 = ints((w_shape[0], w_shape[1], 2, 2))
    x = ints((2, 2, 5, 6))
    assert_same(fn(x, w2), conv_expected(x, w2, group=group, pads=[1, 1, 1, 1]).astype(np.float32))
    with pytest.raises(InvalidValueError, match="channels"):
        fn(ints((1, 3, 5, 6)), w)


def test_conv_known_values():
    # 1 channel 3x3 input 0..8, 2x2 ones kernel: each output is the sum of a 2x2 window
    x = np.arange(9, dtype=np.float32).reshape(1, 1, 3, 3)
    w = np.ones((1, 1, 2, 2), np.float32)
    assert_same(run_node("Conv", 22, [x, w]), np.array([[[[8, 12], [20, 24]]]], np.float32))
    assert_same(run_node("Conv", 22, [x, w, np.array([1], np.float32)], strides=[2, 2], pads=[0, 0, 1, 1]),
                np.array([[[[9, 8], [14, 9]]]], np.float32))


def test_conv_empty_batch_and_nan():
    w = ints((2, 3, 2, 2))
    assert_same(run_node("Conv", 11, [np.zeros((0, 3, 4, 4), np.float32), w]), np.zeros((0, 2, 3, 3), np.float32))
    x = np.zeros((1, 3, 3, 3), np.float32)
    x[0, 1, 0, 0] = np.nan
    y = run_node("Conv", 11, [x, np.ones((1, 3, 2, 2), np.float32)])
    assert np.isnan(y[0, 0, 0, 0]) and not np.isnan(y[0, 0, 1, 1])


def test_conv_zero_input_channels_gives_the_bias():
    b = np.array([1.5, -2], np.float32)
    y = run_node("Conv", 22, [np.zeros((1, 0, 3, 3), np.float32), np.zeros((2, 0, 1, 1), np.float32), b])
    assert_same(y, np.broadcast_to(b.reshape(1, 2, 1, 1), (1, 2, 3, 3)).copy())


@pytest.mark.parametrize("xs,ws,attrs,match", [
    ((1, 3, 4, 4), (2, 2, 3, 3), {}, "channels"),                      # C=3, W expects 2
    ((1, 4, 4, 4), (3, 2, 3, 3), dict(group=2), "channels"),           # M=3 not divisible by group 2
    ((1, 2, 4, 4), (2, 2, 3), {}, "rank"),
    ((1, 2, 2, 2), (2, 2, 3, 3), {}, "does not fit"),
    ((1, 2, 4, 4), (2, 2, 3, 3), dict(kernel_shape=[2, 2]), "kernel_shape"),
])
def test_conv_errors_name_the_node(xs, ws, attrs, match):
    with pytest.raises(KernelError, match=re.compile(f"{NODE}.*{match}", re.S)):
        run_node("Conv", 22, [np.zeros(xs, np.float32), np.zeros(ws, np.float32)], **attrs)


def test_conv_unknown_algorithm_is_an_invalid_node():
    with pytest.raises(InvalidNodeError, match=re.compile(f"{NODE}.*unknown conv_algorithm 'fft'.*im2col", re.S)):
        run_conv([np.zeros((1, 1, 3, 3), np.float32), np.zeros((1, 1, 2, 2), np.float32)], "fft")


@pytest.mark.parametrize("algorithm", conv.ALGORITHMS)
def test_conv_every_algorithm_forced_where_it_applies_else_the_normal_choice(algorithm):
    """Every name on a 3x3 depthwise Conv and on a 3x3 Conv of one group: the forced algorithm where it
    can compute the Conv, the normal choice where it cannot; the same sums either way."""
    for xs, ws, attrs in (((1, 4, 7, 6), (4, 1, 3, 3), dict(group=4, pads=[1, 1, 1, 1])),
                          ((2, 3, 7, 6), (5, 3, 3, 3), dict(pads=[1, 1, 1, 1]))):
        x, w, b = ints(xs), ints(ws), ints((ws[0],))
        fn = conv.conv_1(_options={"conv_algorithm": algorithm}, **attrs)
        assert_same(fn(x, w, b), conv_expected(x, w, b, **attrs).astype(np.float32))
        depthwise = attrs.get("group", 1) > 1
        # (dft: W is no DFT basis here)
        applies = ((algorithm.startswith("depthwise") == depthwise and algorithm not in ("pointwise", "dft"))
                   or algorithm == "im2col")
        normal = conv.conv_1(**attrs)
        normal(x, w, b)
        assert fn.algorithms == ({x.shape: algorithm} if applies else normal.algorithms)


def test_conv_select_is_a_pure_function_of_shapes():
    """select: shapes, type and what is known of the values -> the algorithm (thresholds.py's table)."""
    assert select_3x3(256, 256, 14) == "winograd"                  # wide 3x3 from 14x14 on
    assert select_3x3(256, 256, 7) == "im2col"                     # 7x7: Winograd loses
    assert select_3x3(256, 256, 14, finite=False) == "im2col"      # an infinity would become NaN
    assert select_3x3(256, 256, 14, dtype=np.float16) == "winograd"      # float16 computes in float32
    assert select_3x3(256, 256, 14, stride=2) == "im2col"
    assert select_3x3(8, 8, 7, forced="winograd") == "winograd"    # forced: its thresholds ignored
    assert select_3x3(8, 8, 7, forced="winograd", finite=False) == "im2col"
    assert select_3x3(8, 8, 7, forced="pointwise") == "im2col"     # cannot apply: the normal choice
    assert select_3x3(32, 32, 28, group=32, stride=2) == "im2col"                  # few channels, strided
    assert select_3x3(64, 64, 28, group=64, stride=2) == "depthwise-einsum"
    assert select_3x3(768, 768, 14, group=768) == "depthwise-banded"               # einsum's weights > 300 kB
    assert select_3x3(768, 768, 14, group=768, finite=False) == "depthwise-einsum"
    assert select_3x3(32, 32, 28, group=32, forced="depthwise-flat") == "depthwise-flat"
    assert select_3x3(32, 64, 28, group=32, forced="depthwise-einsum") == "depthwise-channels-last"   # multiplier
    assert select_3x3(32, 32, 28, forced="depthwise-flat") == "strips"       # not depthwise
    assert select_3x3(0, 4, 5) == select_3x3(4, 4, 5, n=0) == "empty"
    one = dict(group=1, kernel=[1, 1], strides=[1, 1], dilations=[1, 1], begin=[0, 0], end=[0, 0], out=[5, 5])
    assert conv.select((1, 8, 5, 5), (16, 8, 1, 1), np.float32, **one) == "pointwise"
    assert conv.select((1, 8, 5, 5), (16, 8, 1, 1), np.float32, forced="im2col", shuffle=True, **one) == "pointwise"
    with pytest.raises(ValueError, match="shuffle"):
        conv.select((1, 8, 5, 5), (8, 8, 3, 3), np.float32, group=1, kernel=[3, 3], strides=[1, 1], dilations=[1, 1],
                    begin=[1, 1], end=[1, 1], out=[5, 5], shuffle=True)


def test_conv_bad_auto_pad_is_an_invalid_node():
    with pytest.raises(InvalidNodeError, match=NODE):
        run_node("Conv", 22, [np.zeros((1, 1, 3, 3), np.float32), np.zeros((1, 1, 2, 2), np.float32)],
                 auto_pad="SAME")


# -- ConvTranspose ---------------------------------------------------------------------------------

def ref_transpose_geometry(in_sizes, kernel, strides, dil, pads, adj, output_shape, auto_pad, version):
    """ConvTranspose's doc: full = stride*(in-1) + output_padding + extent; pads, or with output_shape
    total = full - output_shape split by the version's rule (11+: SAME_UPPER puts the smaller half first, else
    the larger; 1: the opposite); SAME_* without output_shape: output in*stride, the odd unit at the end for
    SAME_UPPER. A negative total (output larger than the full result) extends the end (the official
    test_convtranspose_output_shape). -> (pads_begin, out_sizes)"""
    r = len(in_sizes)
    begin, out = [], []
    for d in range(r):
        full = strides[d] * (in_sizes[d] - 1) + adj[d] + (kernel[d] - 1) * dil[d] + 1
        if output_shape or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            o = output_shape[d] if output_shape else in_sizes[d] * strides[d]
            total = max(0, full - o)
            if output_shape:
                smaller_first = (auto_pad == "SAME_UPPER") == (version >= 11)
            else:
                smaller_first = auto_pad == "SAME_UPPER"
            begin.append(total // 2 if smaller_first else total - total // 2)
        elif auto_pad == "VALID":
            o = full
            begin.append(0)
        else:
            o = full - pads[d] - pads[r + d]
            begin.append(pads[d])
        out.append(o)
    return begin, out


def ref_conv_transpose(x, w, b, group, strides, dil, begin, out):
    """y[n, m, o] = b[m] + sum over the group's input channels c, taps t and input pixels i with
    i*stride + t*dilation = o + pad_begin of x[n, c, i] * w[c, m % (M/group), t]."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    n, c, mg = x.shape[0], x.shape[1], w.shape[1]
    cg = c // group
    kernel, in_sizes = w.shape[2:], x.shape[2:]
    y = np.zeros((n, mg * group, *out))
    for bi, oc in itertools.product(range(n), range(mg * group)):
        g, mm = divmod(oc, mg)
        for o in np.ndindex(*out):
            acc = 0.0 if b is None else float(b[oc])
            for t in np.ndindex(*kernel):
                q = [o[d] + begin[d] - t[d] * dil[d] for d in range(len(out))]
                if all(qd % s == 0 and 0 <= qd // s < size for qd, s, size in zip(q, strides, in_sizes)):
                    i = tuple(qd // s for qd, s in zip(q, strides))
                    acc += float(np.dot(x[(bi, slice(g * cg, (g + 1) * cg)) + i],
                                        w[(slice(g * cg, (g + 1) * cg), mm) + t]))
            y[(bi, oc) + o] = acc
    return y


def convt_expected(x, w, b=None, version=11, group=1, strides=None, dilations=None, pads=None,
                   auto_pad="NOTSET", output_padding=None, output_shape=None):
    r = x.ndim - 2
    st, dil = strides or [1] * r, dilations or [1] * r
    begin, out = ref_transpose_geometry(x.shape[2:], w.shape[2:], st, dil, pads or [0] * 2 * r,
                                        output_padding or [0] * r, output_shape, auto_pad, version)
    return ref_conv_transpose(x, w, b, group, st, dil, begin, out)


CONVT_CASES = [  # (id, x shape, w shape, with bias, attributes)
    ("1d", (1, 2, 4), (2, 3, 3), True, dict(strides=[2], pads=[1, 0], output_padding=[1])),
    ("2d", (2, 2, 3, 3), (2, 2, 3, 3), True, {}),
    ("2d-grouped-multiplier", (1, 4, 3, 2), (4, 3, 2, 2), True,
     dict(group=2, strides=[2, 3], dilations=[1, 2], pads=[0, 1, 1, 0])),
    ("2d-depthwise", (1, 3, 3, 3), (3, 1, 3, 3), False, dict(group=3, strides=[2, 2], pads=[1, 1, 1, 1])),
    ("2d-same-upper", (1, 1, 3, 3), (1, 2, 3, 3), True, dict(strides=[2, 2], auto_pad="SAME_UPPER")),
    ("2d-same-lower", (1, 1, 3, 3), (1, 2, 3, 3), True, dict(strides=[2, 2], auto_pad="SAME_LOWER")),
    ("2d-same-dilated-adj", (1, 2, 3, 2), (2, 1, 2, 3), False,
     dict(strides=[2, 3], dilations=[2, 1], output_padding=[1, 2], auto_pad="SAME_UPPER")),
    ("2d-same-lower-stride1", (1, 1, 3, 4), (1, 1, 2, 2), False, dict(auto_pad="SAME_LOWER")),
    ("2d-valid", (1, 2, 3, 2), (2, 2, 2, 3), True, dict(strides=[2, 1], auto_pad="VALID")),
    ("2d-output-padding", (1, 1, 3, 3), (1, 2, 3, 3), False, dict(strides=[3, 2], output_padding=[1, 1])),
    ("2d-output-shape-larger", (1, 1, 3, 3), (1, 2, 3, 3), True, dict(strides=[3, 2], output_shape=[10, 8])),
    ("2d-output-shape-odd-total", (1, 1, 3, 3), (1, 1, 3, 3), False, dict(strides=[2, 2], output_shape=[6, 5])),
    ("2d-output-shape-same-upper", (1, 1, 3, 3), (1, 1, 3, 3), False,
     dict(strides=[2, 2], output_shape=[6, 4], auto_pad="SAME_UPPER")),
    ("2d-output-shape-adj", (1, 1, 3, 3), (1, 2, 3, 3), False,
     dict(strides=[3, 2], output_shape=[10, 8], output_padding=[1, 1])),
    ("2d-big-pads", (1, 1, 4, 4), (1, 1, 2, 2), False, dict(strides=[2, 2], pads=[2, 3, 1, 0])),
    ("3d", (1, 2, 2, 3, 2), (2, 2, 2, 2, 3), True, dict(strides=[1, 2, 2], pads=[1, 0, 0, 0, 1, 1])),
    ("3d-grouped", (1, 2, 2, 2, 2), (2, 2, 2, 1, 2), False, dict(group=2, strides=[2, 1, 2], dilations=[1, 1, 2])),
    # strides equal to the kernel: taps that never overlap (tiled without a scatter when nothing is cropped or added)
    ("1d-tiled", (2, 3, 5), (3, 2, 3), True, dict(strides=[3])),
    ("2d-tiled", (1, 3, 3, 4), (3, 2, 2, 2), True, dict(strides=[2, 2])),
    ("2d-tiled-grouped", (2, 4, 2, 3), (4, 3, 3, 2), False, dict(group=2, strides=[3, 2])),
    ("3d-tiled", (1, 2, 2, 3, 2), (2, 2, 2, 1, 3), True, dict(strides=[2, 1, 3])),
    ("2d-tiled-cropped", (1, 2, 3, 3), (2, 1, 2, 2), True, dict(strides=[2, 2], pads=[1, 0, 0, 1])),
    ("2d-tiled-output-padding", (1, 2, 3, 3), (2, 1, 2, 2), True, dict(strides=[2, 2], output_padding=[1, 0])),
    ("2d-tiled-dilated", (1, 1, 3, 3), (1, 1, 2, 2), False, dict(strides=[2, 2], dilations=[2, 1])),
]


@pytest.mark.parametrize("version", versions("ConvTranspose"))
@pytest.mark.parametrize("xs,ws,bias,attrs", [pytest.param(*c[1:], id=c[0]) for c in CONVT_CASES])
def test_conv_transpose_against_direct_loop(version, xs, ws, bias, attrs):
    x, w = ints(xs), ints(ws)
    m = ws[1] * attrs.get("group", 1)
    b = ints((m,)) if bias else None
    expected = convt_expected(x, w, b, version, **attrs).astype(np.float32)
    assert_same(run_node("ConvTranspose", version, [x, w] + ([b] if bias else []), **attrs_of(**attrs)), expected)


@pytest.mark.parametrize("const", [(), (1,), (1, 2)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_conv_transpose_tiled_with_constant_or_fed_weights(const, dtype):
    # a 2x2/2 upsampling as U-Nets write it: W (and B) as initializers (W^T made once at prepare) or fed
    x, w, b = ints((2, 6, 3, 4), dtype=dtype), ints((6, 4, 2, 2), dtype=dtype), ints((4,), dtype=dtype)
    expected = convt_expected(x, w, b, strides=[2, 2]).astype(dtype)
    assert_same(run_node("ConvTranspose", 22, [x, w, b], const=const, kernel_shape=[2, 2], strides=[2, 2]), expected)


def test_conv_transpose_tiled_infinity_reaches_its_tile_only():
    # one term per output position: an infinite input pixel makes its own 2x2 tile infinite, nothing else
    x = np.array([[[[0.5, np.inf], [1.0, 2.0]]]], np.float32)
    w = np.ones((1, 1, 2, 2), np.float32)
    y = run_node("ConvTranspose", 22, [x, w], const=(1,), strides=[2, 2])
    assert np.all(np.isposinf(y[0, 0, :2, 2:]))
    assert_same(y[0, 0, :2, :2], np.full((2, 2), 0.5, np.float32))
    assert_same(y[0, 0, 2:], np.array([[1, 1, 2, 2], [1, 1, 2, 2]], np.float32))


def test_conv_transpose_output_shape_split_differs_between_versions():
    # full 7x7, output_shape 6x5: total 1 and 2. 11+: NOTSET takes the larger half first (begin [1, 1]),
    # ConvTranspose-1's formula the smaller (begin [0, 1]).
    x = np.arange(9, dtype=np.float32).reshape(1, 1, 3, 3)
    w = np.ones((1, 1, 3, 3), np.float32)
    full = run_node("ConvTranspose", 11, [x, w], strides=[2, 2])
    assert full.shape == (1, 1, 7, 7)
    assert_same(run_node("ConvTranspose", 11, [x, w], strides=[2, 2], output_shape=[6, 5]), full[:, :, 1:, 1:6])
    assert_same(run_node("ConvTranspose", 1, [x, w], strides=[2, 2], output_shape=[6, 5]), full[:, :, :6, 1:6])


def test_conv_transpose_known_values():
    # 1-D: x [1, 2, 3], kernel [1, 1], stride 2 -> [1, 1, 2, 2, 3, 3]; with output_padding 1 -> a trailing 0 (+bias)
    x = np.array([[[1, 2, 3]]], np.float32)
    w = np.ones((1, 1, 2), np.float32)
    assert_same(run_node("ConvTranspose", 22, [x, w], strides=[2]), np.array([[[1, 1, 2, 2, 3, 3]]], np.float32))
    assert_same(run_node("ConvTranspose", 22, [x, w, np.array([10], np.float32)], strides=[2], output_padding=[1]),
                np.array([[[11, 11, 12, 12, 13, 13, 10]]], np.float32))
    # stride 1, kernel [1, 2]: overlaps add up
    assert_same(run_node("ConvTranspose", 22, [x, np.array([[[1, 2]]], np.float32)]),
                np.array([[[1, 4, 7, 6]]], np.float32))


@pytest.mark.parametrize("version,tname", type_params("ConvTranspose", versions("ConvTranspose")))
def test_conv_transpose_every_type(version, tname):
    dt = np_type(tname)
    x, w, b = ints((1, 2, 3, 3), dtype=dt), ints((2, 2, 2, 3), dtype=dt), ints((4,), dtype=dt)
    attrs = dict(group=2, strides=[2, 1], pads=[1, 0, 0, 1])
    assert_same(run_node("ConvTranspose", version, [x, w, b], **attrs), convt_expected(x, w, b, **attrs).astype(dt))


def test_conv_transpose_empty_batch():
    got = run_node("ConvTranspose", 22, [np.zeros((0, 2, 3, 3), np.float32), np.ones((2, 1, 2, 2), np.float32)])
    assert_same(got, np.zeros((0, 1, 4, 4), np.float32))


@pytest.mark.parametrize("xs,ws,attrs,match", [
    ((1, 3, 3, 3), (2, 2, 3, 3), {}, "channels"),
    ((1, 3, 3, 3), (3, 2, 3, 3), dict(group=2), "group"),
    ((1, 2, 3, 3), (2, 2, 3), {}, "rank"),
    ((1, 1, 2, 2), (1, 1, 2, 2), dict(pads=[3, 3, 1, 1]), "pads"),
    ((1, 1, 2, 2), (1, 1, 2, 2), dict(output_shape=[3]), "output_shape"),
])
def test_conv_transpose_errors_name_the_node(xs, ws, attrs, match):
    with pytest.raises(KernelError, match=re.compile(f"{NODE}.*{match}", re.S)):
        run_node("ConvTranspose", 22, [np.zeros(xs, np.float32), np.zeros(ws, np.float32)], **attrs)


# -- Col2Im ----------------------------------------------------------------------------------------

def ref_col2im(data, image, block, strides, dil, pads):
    """Block g of the (padded) image's grid, tap t of channel c is data[n, c*prod(block) + t, g]; it lands on
    image position g*stride + t*dilation - pad_begin; contributions add up."""
    r = len(image)
    grid = [(image[d] + pads[d] + pads[r + d] - (block[d] - 1) * dil[d] - 1) // strides[d] + 1 for d in range(r)]
    n, ck, _ = data.shape
    c = ck // math.prod(block)
    out = np.zeros((n, c, *image), dtype=np.result_type(data.dtype, np.float64))
    for bi, ci in itertools.product(range(n), range(c)):
        for ti, t in enumerate(np.ndindex(*block)):
            for li, g in enumerate(np.ndindex(*grid)):
                pos = tuple(g[d] * strides[d] + t[d] * dil[d] - pads[d] for d in range(r))
                if all(0 <= p < s for p, s in zip(pos, image)):
                    out[(bi, ci) + pos] += data[bi, ci * math.prod(block) + ti, li]
    return out


COL2IM_CASES = [  # (id, n, c, image, block, attributes)
    ("basic", 1, 1, [5, 5], [1, 5], {}),
    ("overlap", 2, 2, [4, 5], [2, 3], {}),
    ("strides", 1, 2, [5, 5], [3, 3], dict(strides=[2, 2])),
    ("pads", 1, 1, [5, 5], [1, 5], dict(pads=[0, 1, 0, 1])),
    ("asym-pads-strides", 1, 2, [6, 5], [2, 2], dict(pads=[1, 0, 2, 1], strides=[2, 3])),
    ("dilations", 1, 1, [6, 6], [2, 2], dict(dilations=[1, 5])),
    ("gaps", 1, 1, [7, 7], [2, 2], dict(strides=[3, 3])),           # positions no block reaches stay 0
    ("3d", 1, 2, [3, 4, 3], [2, 2, 2], dict(strides=[1, 2, 1], pads=[0, 1, 1, 1, 0, 0])),
]


def col2im_grid(image, block, strides=None, dilations=None, pads=None):
    r = len(image)
    st, dil, p = strides or [1] * r, dilations or [1] * r, pads or [0] * 2 * r
    return [(image[d] + p[d] + p[r + d] - (block[d] - 1) * dil[d] - 1) // st[d] + 1 for d in range(r)]


@pytest.mark.parametrize("n,c,image,block,attrs", [pytest.param(*cs[1:], id=cs[0]) for cs in COL2IM_CASES])
def test_col2im_against_direct_loop(n, c, image, block, attrs):
    r = len(image)
    data = ints((n, c * math.prod(block), math.prod(col2im_grid(image, block, **attrs))))
    expected = ref_col2im(data, image, block, attrs.get("strides", [1] * r), attrs.get("dilations", [1] * r),
                          attrs.get("pads", [0] * 2 * r)).astype(np.float32)
    got = run_node("Col2Im", 18, [data, np.array(image, np.int64), np.array(block, np.int64)], **attrs)
    assert_same(got, expected)


@pytest.mark.parametrize("version,tname", type_params("Col2Im", versions("Col2Im")))
def test_col2im_every_type(version, tname):
    # non-overlapping blocks (stride = block): a pure rearrangement, exact for every type including strings
    data = sample(tname, (1, 2 * 4, 6))                      # C=2, block 2x2, grid 2x3 on a 4x6 image
    image, block = [4, 6], [2, 2]
    got = run_node("Col2Im", version, [data, np.array(image, np.int64), np.array(block, np.int64)], strides=[2, 2])
    expected = np.empty((1, 2, 4, 6), dtype=data.dtype)
    for ci, (ti, t), (li, g) in itertools.product(range(2), enumerate(np.ndindex(2, 2)), enumerate(np.ndindex(2, 3))):
        expected[0, ci, g[0] * 2 + t[0], g[1] * 2 + t[1]] = data[0, ci * 4 + ti, li]
    assert_same(got, expected)


@pytest.mark.parametrize("tname", ["int8", "uint16", "int64", "float16", "bfloat16", "double", "complex64"])
def test_col2im_overlapping_sums_in_the_type(tname):
    dt = np_type(tname)
    data = np.arange(1, 1 + 4 * 4).reshape(1, 4, 4).astype(dt)         # block 2x2, image 3x3, grid 2x2
    got = run_node("Col2Im", 18, [data, np.array([3, 3], np.int64), np.array([2, 2], np.int64)])
    exact = data.astype(np.complex128 if tname.startswith("complex") else np.float64)
    expected = ref_col2im(exact, [3, 3], [2, 2], [1, 1], [1, 1], [0, 0, 0, 0]).astype(dt)
    assert_same(got, expected)


def test_col2im_strings_concatenate_and_bool_ors():
    # an extension of the numeric sum: overlapping strings concatenate in tap order, bools or; uncovered is ""
    # block 2x1 at stride 1 over an image 3x1: blocks at rows 0 and 1; data[0, tap, block]
    data = np.array([[["a", "c"], ["b", "d"]]], dtype=object)
    got = run_node("Col2Im", 18, [data, np.array([3, 1], np.int64), np.array([2, 1], np.int64)])
    assert_same(got, np.array(["a", "cb", "d"], dtype=object).reshape(1, 1, 3, 1))
    got = run_node("Col2Im", 18, [np.array([[["x"]]], dtype=object), np.array([2, 1], np.int64),
                                  np.array([1, 1], np.int64)], strides=[2, 1])
    assert_same(got, np.array([[[["x"], [""]]]], dtype=object))
    b = np.array([[[True, False], [False, False]]])
    assert_same(run_node("Col2Im", 18, [b, np.array([3, 1], np.int64), np.array([2, 1], np.int64)]),
                np.array([[[[True], [False], [False]]]]))


@pytest.mark.parametrize("shape,image,block,attrs,match", [
    ((1, 4, 5), [3, 3], [2, 2], {}, "blocks"),                         # grid 2x2 = 4 blocks, not 5
    ((1, 5, 4), [3, 3], [2, 2], {}, "multiple"),
    ((4, 4), [3, 3], [2, 2], {}, "3-D"),
    ((1, 4, 4), [3, 3], [2, 2, 1], {}, "same length"),
    ((1, 4, 4), [3, 3], [2, 2], dict(strides=[1]), "strides"),
])
def test_col2im_errors_name_the_node(shape, image, block, attrs, match):
    with pytest.raises(KernelError, match=re.compile(f"{NODE}.*{match}", re.S)):
        run_node("Col2Im", 18, [np.zeros(shape, np.float32), np.array(image, np.int64), np.array(block, np.int64)],
                 **attrs)


# -- DeformConv ------------------------------------------------------------------------------------

def bilinear(img, pos):
    """N-linear interpolation of img (spatial only) at the real position pos, zero outside the image."""
    base = [math.floor(p) for p in pos]
    total = 0.0
    for corner in itertools.product((0, 1), repeat=len(pos)):
        q = [b + c for b, c in zip(base, corner)]
        if all(0 <= qi < s for qi, s in zip(q, img.shape)):
            weight = math.prod((p - b) if c else (1 - (p - b)) for p, b, c in zip(pos, base, corner))
            total += weight * float(img[tuple(q)])
    return total


def ref_deform_conv(x, w, offset, b, mask, group, offset_group, strides, dil, pads):
    """y[n, m, o] = b[m] + sum over the group's channels c and taps t of w[m, c, t] * mask[n, g_c*K + t, o] *
    bilinear(x[n, c], o*s - pad_begin + t*d + offset[n, (g_c*K + t)*r + axis, o]), g_c = c's offset group."""
    x, w, offset = x.astype(np.float64), w.astype(np.float64), offset.astype(np.float64)
    n, c, m, cg = x.shape[0], x.shape[1], w.shape[0], w.shape[1]
    kernel, r = w.shape[2:], x.ndim - 2
    taps = math.prod(kernel)
    begin, out = ref_geometry(x.shape[2:], kernel, strides, dil, pads, "NOTSET")
    y = np.zeros((n, m, *out))
    for bi, oc in itertools.product(range(n), range(m)):
        g = oc // (m // group)
        for o in np.ndindex(*out):
            acc = 0.0 if b is None else float(b[oc])
            for ti, t in enumerate(np.ndindex(*kernel)):
                for k in range(cg):
                    ch = g * cg + k
                    og = ch // (c // offset_group)
                    pos = [o[d] * strides[d] - begin[d] + t[d] * dil[d] + offset[(bi, (og * taps + ti) * r + d) + o]
                           for d in range(r)]
                    scale = 1.0 if mask is None else float(mask[(bi, og * taps + ti) + o])
                    acc += float(w[(oc, k) + t]) * scale * bilinear(x[bi, ch], pos)
            y[(bi, oc) + o] = acc
    return y


def deform_out(xs, ws, strides, dil, pads):
    return ref_geometry(xs[2:], ws[2:], strides, dil, pads, "NOTSET")[1]


DEFORM_CASES = [  # (id, x shape, w shape, group, offset_group, strides, dilations, pads, bias, mask)
    ("2d", (1, 1, 4, 4), (1, 1, 2, 2), 1, 1, [1, 1], [1, 1], [0, 0, 0, 0], False, False),
    ("2d-pads-mask-bias", (2, 2, 4, 5), (3, 2, 3, 2), 1, 1, [1, 1], [1, 1], [1, 0, 1, 1], True, True),
    ("2d-groups-offset-groups", (1, 4, 5, 4), (4, 2, 2, 2), 2, 4, [2, 1], [1, 2], [1, 1, 0, 1], True, True),
    ("2d-offset-group-spans-groups", (1, 4, 4, 4), (4, 1, 2, 2), 4, 2, [1, 1], [1, 1], [0, 0, 0, 0], False, True),
    ("1d", (1, 2, 6), (2, 2, 3), 1, 2, [2], [1], [1, 1], True, False),
    ("3d", (1, 2, 3, 3, 3), (2, 1, 2, 2, 2), 2, 1, [1, 1, 1], [1, 1, 1], [0, 1, 0, 0, 0, 1], False, True),
]


@pytest.mark.parametrize("version", versions("DeformConv"))
@pytest.mark.parametrize("xs,ws,group,og,strides,dil,pads,bias,with_mask",
                         [pytest.param(*c[1:], id=c[0]) for c in DEFORM_CASES])
def test_deform_conv_against_direct_loop(version, xs, ws, group, og, strides, dil, pads, bias, with_mask):
    r = len(xs) - 2
    x, w = RNG.standard_normal(xs), RNG.standard_normal(ws)
    out = deform_out(xs, ws, strides, dil, pads)
    taps = math.prod(ws[2:])
    offset = RNG.uniform(-2.5, 2.5, size=(xs[0], og * taps * r, *out))      # samples inside and outside the image
    b = RNG.standard_normal(ws[0]) if bias else None
    mask = RNG.uniform(0, 1, size=(xs[0], og * taps, *out)) if with_mask else None
    inputs = [x, w, offset, b, mask] if with_mask else [x, w, offset] + ([b] if bias else [])
    got = run_node("DeformConv", version, inputs, group=group, offset_group=og, strides=strides, dilations=dil,
                   pads=pads)
    expected = ref_deform_conv(x, w, offset, b, mask, group, og, strides, dil, pads)
    assert got.dtype == np.float64 and got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


def test_deform_conv_zero_offsets_is_conv():
    x, w, b = ints((1, 4, 5, 5)), ints((4, 2, 3, 3)), ints((4,))
    offset = np.zeros((1, 2 * 9 * 2, 3, 3), np.float32)
    got = run_node("DeformConv", 22, [x, w, offset, b], group=2, offset_group=2, strides=[2, 2], pads=[1, 1, 1, 1])
    assert_same(got, conv_expected(x, w, b, group=2, strides=[2, 2], pads=[1, 1, 1, 1]).astype(np.float32))


def test_deform_conv_known_values():
    # the spec's example: x 0..8, 2x2 ones kernel; the [0,0] tap moves down 0.5 at output [0,0] (0 -> 1.5),
    # the [1,0] tap moves left 0.1 at output [0,1] (4 -> 3.9); the mask halves tap [1,1] at output [1,1]
    x = np.arange(9, dtype=np.float32).reshape(1, 1, 3, 3)
    offset = np.zeros((1, 8, 2, 2), np.float32)
    offset[0, 0, 0, 0] = 0.5
    offset[0, 5, 0, 1] = -0.1
    mask = np.ones((1, 4, 2, 2), np.float32)
    mask[0, 3, 1, 1] = 0.5
    got = run_node("DeformConv", 19, [x, np.ones((1, 1, 2, 2), np.float32), offset, None, mask])
    np.testing.assert_allclose(got, np.array([[[[9.5, 11.9], [20, 20]]]], np.float32), rtol=1e-6)


@pytest.mark.parametrize("version,tname", type_params("DeformConv", versions("DeformConv")))
def test_deform_conv_every_type(version, tname):
    dt = np_type(tname)
    x, w, b = ints((1, 2, 3, 3), dtype=dt), ints((2, 1, 2, 2), dtype=dt), ints((2,), dtype=dt)
    offset = (RNG.integers(-3, 4, size=(1, 2 * 4 * 2, 2, 2)) / 2).astype(dt)   # halves: exact weights
    mask = (RNG.integers(0, 3, size=(1, 2 * 4, 2, 2)) / 2).astype(dt)
    got = run_node("DeformConv", version, [x, w, offset, b, mask], group=2, offset_group=2)
    expected = ref_deform_conv(x, w, offset, b, mask, 2, 2, [1, 1], [1, 1], [0, 0, 0, 0]).astype(dt)
    assert_same(got, expected)


@pytest.mark.parametrize("offset_shape,mask_shape,attrs,match", [
    ((1, 7, 2, 2), None, {}, "offset must have shape"),
    ((1, 8, 3, 2), None, {}, "offset must have shape"),
    ((1, 8, 2, 2), (1, 3, 2, 2), {}, "mask must have shape"),
    ((1, 8, 2, 2), None, dict(offset_group=3), "offset_group"),
    ((1, 8, 2, 2), None, dict(group=2), "channels"),
])
def test_deform_conv_errors_name_the_node(offset_shape, mask_shape, attrs, match):
    inputs = [np.zeros((1, 2, 3, 3), np.float32), np.zeros((1, 2, 2, 2), np.float32),
              np.zeros(offset_shape, np.float32)]
    if mask_shape:
        inputs += [None, np.zeros(mask_shape, np.float32)]
    with pytest.raises(KernelError, match=re.compile(f"{NODE}.*{match}", re.S)):
        run_node("DeformConv", 22, inputs, **attrs)


# -- ConvInteger / QLinearConv -------------------------------------------------------------------

def int_conv_expected(x, w, xzp, wzp, group=1, strides=None, dilations=None, pads=None, auto_pad="NOTSET"):
    """conv(x - x_zero_point, w - w_zero_point) in exact Python-int arithmetic (padding is 0 after the shift:
    the input is padded with its zero point)."""
    xs = x.astype(np.int64) - (0 if xzp is None else int(xzp))
    wz = np.zeros(w.shape[0], np.int64) if wzp is None else np.broadcast_to(wzp.astype(np.int64), (w.shape[0],))
    ws = w.astype(np.int64) - wz.reshape((-1,) + (1,) * (w.ndim - 1))
    r = x.ndim - 2
    st, dil = strides or [1] * r, dilations or [1] * r
    begin, out = ref_geometry(x.shape[2:], w.shape[2:], st, dil, pads or [0] * 2 * r, auto_pad)
    y = np.zeros((x.shape[0], w.shape[0], *out), dtype=np.int64)
    cg, mg = w.shape[1], w.shape[0] // group
    for bi, oc in itertools.product(range(x.shape[0]), range(w.shape[0])):
        g = oc // mg
        for o in np.ndindex(*out):
            acc = 0
            for t in np.ndindex(*w.shape[2:]):
                pos = tuple(o[d] * st[d] - begin[d] + t[d] * dil[d] for d in range(r))
                if all(0 <= p < s for p, s in zip(pos, x.shape[2:])):
                    acc += sum(int(a) * int(c) for a, c in zip(xs[(bi, slice(g * cg, (g + 1) * cg)) + pos],
                                                               ws[(oc, slice(None)) + t]))
            y[(bi, oc) + o] = acc
    return y


def q8(shape, dt, lo=None, hi=None):
    info = np.iinfo(dt)
    return RNG.integers(info.min if lo is None else lo, (info.max if hi is None else hi) + 1, size=shape).astype(dt)


INT_TYPES = [np.uint8, np.int8]
INT_CASES = [  # (id, x shape, w shape, attributes)
    ("1d", (1, 2, 6), (3, 2, 3), dict(strides=[2], pads=[1, 1])),
    ("2d-pointwise", (1, 3, 3, 4), (2, 3, 1, 1), {}),
    ("2d-depthwise", (1, 2, 4, 4), (4, 1, 3, 3), dict(group=2, pads=[1, 1, 1, 1])),
    ("2d-grouped-strided", (2, 4, 5, 5), (2, 2, 3, 2), dict(group=2, strides=[2, 1], dilations=[1, 2],
                                                            pads=[1, 0, 0, 2])),
    ("2d-same-upper", (1, 1, 5, 4), (2, 1, 2, 3), dict(strides=[2, 2], auto_pad="SAME_UPPER")),
    ("2d-same-lower", (1, 1, 5, 4), (2, 1, 2, 3), dict(strides=[2, 2], auto_pad="SAME_LOWER")),
    ("2d-valid", (1, 1, 5, 4), (2, 1, 2, 3), dict(auto_pad="VALID")),
    ("3d", (1, 2, 3, 3, 3), (2, 2, 2, 2, 2), dict(pads=[1, 0, 0, 0, 1, 1])),
]


@pytest.mark.parametrize("xt,wt", itertools.product(INT_TYPES, INT_TYPES), ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("xs,ws,attrs", [pytest.param(*c[1:], id=c[0]) for c in INT_CASES])
def test_conv_integer_every_type_against_direct_loop(xt, wt, xs, ws, attrs):
    x, w = q8(xs, xt), q8(ws, wt)
    xzp, wzp = q8((), xt), q8((ws[0],), wt)                       # per-tensor x, per-output-channel w
    got = run_node("ConvInteger", 10, [x, w, xzp, wzp], **attrs_of(**attrs))
    assert_same(got, int_conv_expected(x, w, xzp, wzp, **attrs).astype(np.int32))


def test_conv_integer_optional_zero_points_and_known_values():
    # the spec's example: x 2..10 with zero point 1, 2x2 ones kernel
    x = np.arange(2, 11, dtype=np.uint8).reshape(1, 1, 3, 3)
    w = np.ones((1, 1, 2, 2), np.uint8)
    assert_same(run_node("ConvInteger", 10, [x, w, np.array(1, np.uint8)]),
                np.array([[[[12, 16], [24, 28]]]], np.int32))
    assert_same(run_node("ConvInteger", 10, [x, w]), np.array([[[[16, 20], [28, 32]]]], np.int32))
    # w zero point alone (x's omitted), as a 1-element tensor; padding counts as the zero point
    assert_same(run_node("ConvInteger", 10, [x, w, None, np.array([2], np.uint8)], pads=[1, 1, 0, 0])[0, 0, 0],
                np.array([-2, -5, -7], np.int32))


def test_conv_integer_large_reduction_is_exact():
    # 30 channels x 3x3 taps of 255 * 255: 17,556,750 > 2^24, beyond float32's exact integers
    x = np.full((1, 30, 3, 3), 255, np.uint8)
    w = np.full((2, 30, 3, 3), 255, np.uint8)
    w[1, 0, 0, 0] = 254
    got = run_node("ConvInteger", 10, [x, w])
    assert_same(got, np.array([270 * 65025, 270 * 65025 - 255], np.int32).reshape(1, 2, 1, 1))
    xi = np.full((1, 30, 3, 3), -128, np.int8)
    got = run_node("ConvInteger", 10, [xi, w, np.array(127, np.int8)])
    assert_same(got, np.array([-255 * 270 * 255, -255 * (270 * 255 - 1)], np.int32).reshape(1, 2, 1, 1))


def ref_requantize(acc, b, xs, ws, ys, yzp, m):
    """y = saturate(round_half_even((acc + B) * x_scale * w_scale / y_scale) + y_zero_point), per channel."""
    info = np.iinfo(yzp.dtype)
    ws = np.broadcast_to(np.asarray(ws, np.float64), (m,))
    y = np.zeros(acc.shape, dtype=yzp.dtype)
    for idx in np.ndindex(*acc.shape):
        v = (int(acc[idx]) + (0 if b is None else int(b[idx[1]]))) * float(xs) * float(ws[idx[1]]) / float(ys)
        y[idx] = min(max(round(v) + int(yzp), info.min), info.max)       # Python's round is half to even
    return y


@pytest.mark.parametrize("xt,wt,yt", itertools.product(INT_TYPES, INT_TYPES, INT_TYPES),
                         ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("per_channel,bias", [(False, False), (True, True)], ids=["per-tensor", "per-channel-bias"])
def test_qlinear_conv_every_type(xt, wt, yt, per_channel, bias):
    xs_, ws_, attrs = (1, 4, 5, 4), (4, 2, 3, 2), dict(group=2, strides=[2, 1], pads=[1, 0, 1, 1])
    x, w = q8(xs_, xt), q8(ws_, wt)
    xzp, yzp = q8((), xt), q8((), yt)
    m = ws_[0]
    wzp = q8((m,), wt) if per_channel else q8((), wt)
    x_scale, y_scale = np.float32(0.02), np.float32(0.5)
    w_scale = np.array([0.01, 0.02, 0.005, 0.03], np.float32) if per_channel else np.float32(0.015)
    b = RNG.integers(-5000, 5000, size=m).astype(np.int32) if bias else None
    inputs = [x, x_scale, xzp, w, w_scale, wzp, y_scale, yzp] + ([b] if bias else [])
    got = run_node("QLinearConv", 10, inputs, **attrs)
    acc = int_conv_expected(x, w, xzp, wzp, **attrs)
    assert_same(got, ref_requantize(acc, b, x_scale, w_scale, y_scale, yzp, m))


def test_qlinear_conv_rounds_half_to_even_and_saturates():
    # acc = x - 0 with a 1x1 kernel of 1; scale 0.5 -> ties: 1 -> 0.5 -> 0, 3 -> 1.5 -> 2, 5 -> 2.5 -> 2
    x = np.array([1, 3, 5, 7, 200, 255], np.uint8).reshape(1, 1, 1, 6)
    inputs = [x, np.float32(0.5), np.uint8(0), np.ones((1, 1, 1, 1), np.uint8), np.float32(1), np.uint8(0),
              np.float32(1), np.int8(10)]
    assert_same(run_node("QLinearConv", 10, inputs), np.array([10, 12, 12, 14, 110, 127], np.int8).reshape(1, 1, 1, 6))
    inputs[-1] = np.int8(-128)
    inputs[0] = np.zeros((1, 1, 1, 6), np.uint8)
    inputs[2] = np.uint8(255)                                   # x - zp = -255 -> -127.5 -> -128 -> -256 saturates
    assert_same(run_node("QLinearConv", 10, inputs), np.full((1, 1, 1, 6), -128, np.int8))


@pytest.mark.parametrize("op,inputs,match", [
    ("ConvInteger", [np.zeros((1, 2, 3, 3), np.uint8), np.zeros((2, 2, 2, 2), np.uint8), None,
                     np.zeros(3, np.uint8)], "w_zero_point"),
    ("ConvInteger", [np.zeros((1, 2, 3, 3), np.uint8), np.zeros((2, 2, 2, 2), np.uint8), np.zeros(2, np.uint8)],
     "x_zero_point"),
    ("ConvInteger", [np.zeros((1, 3, 3, 3), np.uint8), np.zeros((2, 2, 2, 2), np.uint8)], "channels"),
    ("QLinearConv", [np.zeros((1, 2, 3, 3), np.uint8), np.float32(1), np.uint8(0), np.zeros((2, 2, 2, 2), np.int8),
                     np.ones(3, np.float32), np.int8(0), np.float32(1), np.uint8(0)], "w_scale"),
    ("QLinearConv", [np.zeros((1, 2, 3, 3), np.uint8), np.float32(1), np.uint8(0), np.zeros((2, 2, 2, 2), np.int8),
                     np.float32(1), np.int8(0), np.float32(1), np.uint8(0), np.zeros(3, np.int32)], "B must"),
])
def test_quantized_conv_errors_name_the_node(op, inputs, match):
    with pytest.raises(KernelError, match=re.compile(f"{NODE}.*{match}", re.S)):
        run_node(op, 10, inputs)


def test_strided_view_of_contiguous_and_other_arrays():
    """nn/_common.strided_view: the ndarray constructor on a C-contiguous array (checked against its
    memory), numpy's as_strided otherwise; read-only views of the same values either way."""
    from onnx_mini.ops.nn._common import strided_view
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    v = strided_view(a, (3, 2, 2), (24, 4, 24))          # rows i, i+1 at columns j, j+1
    assert not v.flags.writeable and np.shares_memory(v, a)
    np.testing.assert_array_equal(v[1], [[6, 12], [7, 13]])
    t = a.T                                               # not C-contiguous: as_strided
    w = strided_view(t, (2, 3), (t.strides[0], t.strides[1]))
    assert not w.flags.writeable
    np.testing.assert_array_equal(w, t[:2, :3])
    with pytest.raises((ValueError, TypeError)):
        strided_view(a, (5, 6), (24, 4))                  # past the end of a's memory


# -- im2col's per-shape geometry (issue 22: small convolutions' fixed cost) ----------------------

@pytest.mark.parametrize("xs, ws, attrs", [
    ((1, 3, 7), (4, 3, 3), dict(pads=[1, 1], strides=[2])),                       # padded 1-D, strided
    ((1, 1, 40), (5, 1, 8), dict(strides=[4])),                                   # no padding: windows of X itself
    ((1, 3, 30), (4, 3, 6), dict(pads=[2, 1], strides=[3])),                       # more outputs than by rows
    ((1, 4, 30), (6, 2, 5), dict(group=2, strides=[2])),                           # ... in groups
    ((2, 4, 6, 5), (6, 2, 3, 2), dict(group=2, pads=[1, 0, 2, 1], strides=[2, 1], dilations=[1, 2])),
    ((1, 2, 3, 4, 5), (3, 2, 2, 2, 3), dict(pads=[0, 1, 1, 1, 0, 1], dilations=[2, 1, 1])),
])
@pytest.mark.parametrize("layout", ["contiguous", "strided", "read-only"])
def test_conv_im2col_columns_of_every_input_layout(monkeypatch, xs, ws, attrs, layout):
    """im2col's window view is built over a C-contiguous (padded) image: X given as a view with other
    strides (no padding: X itself is read) or read-only gives the direct loop's values, and the
    geometry is made once per input shape however many calls."""
    made = []
    for geometry in ("Columns", "Rows"):        # (a 1-D image with few outputs goes by rows)
        monkeypatch.setattr(im2col, geometry, _counted(getattr(im2col, geometry), made))
    x, w, b = ints(xs), ints(ws), ints((ws[0],))
    if layout == "strided":         # same values, every other element of a wider array
        wide = np.zeros(xs[:-1] + (2 * xs[-1],), np.float32)
        wide[..., ::2] = x
        x = wide[..., ::2]
        assert not x.flags.c_contiguous
    elif layout == "read-only":
        x.flags.writeable = False
    fn = conv.conv_1(**attrs, _constants={1: w, 2: b}, _options={"conv_algorithm": "im2col"})
    expected = conv_expected(x, w, b, **attrs).astype(np.float32)
    for _ in range(3):
        assert_same(fn(x, w, b), expected)
    assert set(fn.algorithms.values()) == {"im2col"} and len(made) == 1


def test_conv_im2col_one_image_takes_the_fused_epilogue_after_the_bias():
    """The one-image im2col path (its own finish, outside per_image) adds B, then the fused activation:
    Relu(B + conv) by hand on a 1-D Conv."""
    from onnx_mini.ops.fused import fused_conv
    x = np.array([[[1, 2, 3, 4]]], np.float32)
    w = np.array([[[1, 0, -1]], [[1, 1, 1]]], np.float32)             # a difference and a box sum
    b = np.array([0.5, -8], np.float32)
    fn = fused_conv(pads=[1, 1], activation="Relu", _constants={1: w, 2: b})
    # padded [0 1 2 3 4 0]: differences x[i-1] - x[i+1] = -2 -2 -2 3; sums 3 6 9 7
    expected = np.array([[[0, 0, 0, 3.5], [0, 0, 1, 0]]], np.float32)
    assert_same(fn(x, w, b), expected)
    assert fn.algorithms == {(1, 1, 4): "im2col"}


def _counted(cls, made):
    """A subclass of im2col's Columns / Rows that records each geometry made (isinstance still works)."""
    class Counted(cls):
        __slots__ = ()

        def __init__(self, *a):
            made.append(a)
            super().__init__(*a)
    Counted.applies = cls.applies if hasattr(cls, "applies") else None
    return Counted


ROWS_CASES = [  # (id, x shape, w shape, attributes): one 1-D image, at most ROWS_MAX_OUTPUTS positions
    ("dft-like", (1, 1, 40), (6, 1, 16), dict(strides=[8])),                      # 4 windows of X itself
    ("padded", (1, 5, 3), (7, 5, 3), dict(pads=[1, 1])),                           # 3 outputs
    ("strided-asym", (1, 4, 4), (3, 4, 3), dict(pads=[1, 2], strides=[2])),      # 3 outputs
    ("one-output", (1, 6, 2), (4, 6, 3), dict(pads=[1, 0], strides=[2])),
    ("kernel-past-input", (1, 2, 1), (3, 2, 3), dict(pads=[1, 1])),
    ("window-in-padding", (1, 2, 1), (3, 2, 2), dict(pads=[0, 3], strides=[2])),   # 2nd output: B alone
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("constant", [True, False])
@pytest.mark.parametrize("xs,ws,attrs", [pytest.param(*c[1:], id=c[0]) for c in ROWS_CASES])
def test_conv_im2col_by_rows_against_direct_loop(monkeypatch, xs, ws, attrs, constant, dtype):
    """A 1-D Conv of one image with few output positions: one matrix-vector product per position over
    the channels-last windows, W's taps reordered once for a constant W (per call for a fed one); the
    direct loop's sums, for the values of the same layer chained (its input a transposed view). One
    output position with the constant W and B (float32/64): from the second call one product over the
    taps reading X, B in it (im2col.conv_one)."""
    calls, ones, reordered = [], [], []
    conv_rows, conv_one, rows_weights = im2col.conv_rows, im2col.conv_one, im2col.rows_weights
    monkeypatch.setattr(im2col, "conv_rows", lambda *a: calls.append(1) or conv_rows(*a))
    monkeypatch.setattr(im2col, "conv_one", lambda *a: ones.append(1) or conv_one(*a))
    monkeypatch.setattr(im2col, "rows_weights", lambda w: reordered.append(1) or rows_weights(w))
    x, w, b = ints(xs).astype(dtype), ints(ws).astype(dtype), ints((ws[0],)).astype(dtype)
    fn = conv.conv_1(**attrs, _constants={1: w, 2: b} if constant else {})
    expected = conv_expected(x, w, b, **attrs)
    for _ in range(3):
        y = fn(x, w, b)
        assert y.dtype == dtype
        assert_same(y.astype(np.float32), expected.astype(np.float32))
    one = constant and dtype != np.float16 and expected.shape[-1] == 1
    assert (len(calls), len(ones)) == ((1, 2) if one else (3, 0)) and len(reordered) == (1 if constant else 3)
    assert fn.algorithms == {x.shape: "im2col"}
    # the output (a transposed view of the products: read channels-last as it is) into the next Conv
    w2 = ints((2, ws[0], 2)).astype(dtype)
    y = fn(x, w, b)
    assert_same(conv.conv_1(pads=[0, 1], _constants={1: w2})(y, w2).astype(np.float32),
                conv_expected(expected, w2, pads=[0, 1]).astype(np.float32))
    assert len(calls) + len(ones) == 5


@pytest.mark.parametrize("xs, ws, attrs, read", [
    ((1, 64, 1), (128, 64, 3), dict(pads=[1, 1]), (1, 2)),     # the VAD's last layer: the centre tap alone reads X
    ((1, 6, 2), (4, 6, 3), dict(pads=[1, 0]), (1, 3)),
    ((1, 5, 4), (3, 5, 4), dict(pads=[0, 0]), (0, 4)),         # no padding: every tap
    ((1, 2, 1), (3, 2, 2), dict(pads=[2, 0], strides=[2]), (2, 2)),         # every tap on the padding: B alone
])
@pytest.mark.parametrize("with_bias", [True, False])
def test_conv_im2col_one_position_reads_only_x(xs, ws, attrs, read, with_bias):
    """One output position, the constant W and B: from the second call one product of W's taps that read
    X (B as one more column against a 1) with X's values alone: the definition's exact sums, X untouched;
    a B fed in place of the constant one goes by rows (and adds it), then the constant B again."""
    x, w = ints(xs), ints(ws)
    b, other = (ints((ws[0],)), ints((ws[0],))) if with_bias else (None, None)
    given = x.copy()
    fn = conv.Convolution(**attrs, constants={1: w, 2: b})
    expected = conv_expected(x, w, b, **attrs).astype(np.float32)
    for _ in range(3):
        assert_same(fn(x, w, b), expected)
    layout = next(iter(fn.layouts.values()))
    assert layout.memo["columns"].read[:2] == read
    assert layout.one_w.shape == (ws[0], (read[1] - read[0]) * xs[1] + with_bias)
    if with_bias:
        assert_same(fn(x, w, other), conv_expected(x, w, other, **attrs).astype(np.float32))
        assert_same(fn(x, w, b), expected)
    np.testing.assert_array_equal(x, given)


def test_conv_im2col_one_position_infinite_weight_on_the_padding():
    """An infinite tap of the constant W where the one position reads only padding: inf * 0 = NaN as the
    spec's zero padding has it, so those taps stay in the product (no product over X's taps alone)."""
    x, w, b = ints((1, 3, 1), lo=1, hi=3), ints((2, 3, 3)), ints((2,))
    w[0, 1, 0] = np.inf
    fn = conv.Convolution(pads=[1, 1], constants={1: w, 2: b})
    for _ in range(2):
        with np.errstate(invalid="ignore"):
            y = fn(x, w, b)
        assert np.isnan(y[0, 0, 0]) and np.isfinite(y[0, 1, 0])
    assert next(iter(fn.layouts.values())).one_w is None


@pytest.mark.parametrize("xs,ws,attrs", [
    ((1, 3, 12), (2, 3, 3), dict(pads=[1, 1])),            # 12 outputs: more than ROWS_MAX_OUTPUTS
    ((2, 3, 3), (2, 3, 3), dict(pads=[1, 1])),             # two images
    ((1, 4, 4), (2, 2, 3), dict(pads=[1, 1], group=2)),    # two groups
    ((1, 3, 5), (2, 3, 2), dict(dilations=[2])),           # dilated
    ((1, 2, 3, 3), (2, 2, 3, 3), dict(strides=[2, 2])),    # 2-D
])
def test_conv_im2col_by_rows_only_where_it_applies(monkeypatch, xs, ws, attrs):
    calls = []
    conv_rows = im2col.conv_rows
    monkeypatch.setattr(im2col, "conv_rows", lambda *a: calls.append(1) or conv_rows(*a))
    x, w = ints(xs), ints(ws)
    fn = conv.conv_1(**attrs, _options={"conv_algorithm": "im2col"})
    assert_same(fn(x, w), conv_expected(x, w, **attrs).astype(np.float32))
    assert calls == []


@pytest.mark.parametrize("constant", [True, False])
def test_conv_im2col_by_rows_infinite_weight_on_the_padding(constant):
    """The padded zeros are multiplied as the spec's zero padding has them (onnxruntime and onnx's
    reference alike): an infinite tap gives NaN where it reads the padding, inf where it reads X."""
    x = ints((1, 3, 3), lo=1, hi=3)
    w = ints((2, 3, 3))
    w[0, 1, 0] = np.inf                 # tap 0 of channel 1: the left padding at output 0 only
    fn = conv.conv_1(pads=[1, 1], _constants={1: w} if constant else {})
    y = fn(x, w)
    expected = conv_expected(np.pad(x, ((0, 0), (0, 0), (1, 1))), w).astype(np.float32)   # zeros multiplied
    assert np.isnan(y[0, 0, 0]) and np.isinf(y[0, 0, 1:]).all() and np.isfinite(y[0, 1]).all()
    np.testing.assert_array_equal(y, expected)


def test_conv_im2col_by_rows_another_w_than_the_constant():
    """A shape that went by rows with the constant W, then a W fed in its place (same shape): that W's
    sums, reordered for the call; then the constant again."""
    x, w, other = ints((1, 4, 3)), ints((5, 4, 3)), ints((5, 4, 3))
    fn = conv.conv_1(pads=[1, 1], _constants={1: w})
    for weights in (w, w, other, w):
        assert_same(fn(x, weights), conv_expected(x, weights, pads=[1, 1]).astype(np.float32))


def test_conv_im2col_by_rows_by_hand():
    """Two output positions by hand: X = [[1 2 3], [4 5 6]] (C=2, L=3) padded by one on the left, k=2,
    stride 2: windows (0 | 1 2 ... ) -> columns [pad, x0], [x1, x2] of each channel."""
    x = np.array([[[1, 2, 3], [4, 5, 6]]], np.float32)
    w = np.array([[[1, 10], [100, 1000]]], np.float32)          # one output channel, (C=2, k=2)
    fn = conv.conv_1(pads=[1, 0], strides=[2], _constants={1: w})
    # position 0: taps at (pad, 1) and (pad, 4): 10*1 + 1000*4; position 1: (2, 3), (5, 6)
    expected = np.array([[[10 + 4000, 2 + 30 + 500 + 6000]]], np.float32)
    assert_same(fn(x, w), expected)


# -- QLinearConv's float32 rescale with a neighbouring float32 scale ---------------------------------

def test_qlinear_conv_rescale_takes_the_float32_next_to_a_near_tie_scale(monkeypatch):
    """A scale whose float32 rounding puts accumulator 10003 exactly on the tie 100.5 (float32's product
    rounds half to even to 100; the real product, just above, gives 101): the proof refuses that
    float32, accepts the next one up, and QLinearConv rescales in float32 with it. Every accumulator
    0..bound of the layer gives round_half_even(acc * scale) + zp saturated, the integer definition
    (acc * scale is exact in float64 here: 15-bit acc times a 24-bit scale)."""
    from fractions import Fraction
    from onnx_mini.ops.nn import conv_quantized
    acc0 = 10003
    ws = np.float32(100.5 / acc0)
    assert np.float32(acc0) * ws == np.float32(100.5) and Fraction(acc0) * Fraction(float(ws)) > Fraction(201, 2)
    c = -(-acc0 // 255)
    bound = 255 * c                                           # 1x1 kernel of ones, x_zero_point 0
    zp = np.array(0, np.uint8)
    assert not conv_quantized._float32_rescale_is_exact(np.float64(ws), zp, bound)
    s32 = conv_quantized._float32_scale(np.float64(ws), zp, bound)
    assert s32 == np.nextafter(ws, np.float32(1))
    # per channel: only the channel that needs it takes the neighbour (2^-7 is exact in float32: its own
    # rounding passes); a scale that is not finite: no proof
    both_channels = conv_quantized._float32_scale(np.array([np.float64(ws), 2.0 ** -7]), zp, bound)
    assert both_channels.dtype == np.float32
    np.testing.assert_array_equal(both_channels, [np.nextafter(ws, np.float32(1)), np.float32(2.0 ** -7)])
    assert conv_quantized._float32_scale(np.array([np.float64(ws), np.inf]), zp, bound) is None
    # one output pixel per accumulator 0..bound: x (1, c, 1, bound + 1) with column sums 0..bound
    acc = np.arange(bound + 1)
    x = np.zeros((1, c, 1, bound + 1), np.uint8)
    full = acc // 255
    for ch in range(c):
        x[0, ch, 0] = np.where(ch < full, 255, np.where(ch == full, acc % 255, 0))
    assert np.array_equal(x.astype(np.int64).sum(axis=1)[0, 0], acc)
    calls = []
    real = conv_quantized._requantize32
    monkeypatch.setattr(conv_quantized, "_requantize32", lambda *a, **k: calls.append(1) or real(*a, **k))
    consts = [np.array(np.float32(1)), np.array(0, np.uint8), np.ones((1, c, 1, 1), np.int8), np.array(ws),
              np.array(0, np.int8), np.array(np.float32(1)), np.array(5, np.uint8)]
    run = conv_quantized.qlinear_conv_10(_constants=dict(enumerate(consts, start=1)))
    y = run(x, *consts)
    assert calls                                              # the float32 rescale ran
    expected = np.clip(np.rint(acc * np.float64(ws)) + 5, 0, 255).astype(np.uint8)
    assert y.dtype == np.uint8 and y.shape == (1, 1, 1, bound + 1)
    np.testing.assert_array_equal(y[0, 0, 0], expected)
    assert y[0, 0, 0, acc0] == 101 + 5


# -- im2col: columns from the stride phases, products in bands -----------------------------------

PHASE_CASES = [  # (x shape, kernel, strides, dilations, pads begin + end, group)
    ((1, 3, 9, 10), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), 1),       # the first conv's geometry, even and odd sides
    ((1, 2, 11, 7), (3, 2), (3, 2), (1, 2), (2, 0, 1, 3), 1),       # stride 3, dilation, lopsided pads
    ((1, 4, 8, 9), (2, 4), (2, 3), (2, 1), (0, 3, 2, 0), 2),        # two groups, a tap reaching past the image
    ((1, 2, 13), (5,), (2,), (3,), (4, 1), 1),                      # 1-D
    ((1, 2, 5, 6, 7), (3, 1, 2), (2, 1, 3), (1, 1, 2), (1, 0, 2, 1, 0, 0), 1),   # 3-D, one axis unstrided
    ((1, 1, 4, 4), (1, 1), (4, 4), (1, 1), (0, 0, 0, 0), 1),        # one phase of each 4x4 block is all
    ((1, 2, 9, 8), (1, 3), (2, 2), (1, 1), (0, 1, 0, 1), 1),        # one tap down a strided axis: rows in phases
    ((1, 2, 11, 9), (3, 2), (2, 2), (2, 1), (1, 0, 1, 1), 1),       # dilation 2 down stride 2: rows in phases
    ((1, 2, 9, 8), (3, 3), (2, 1), (1, 1), (1, 1, 1, 1), 1),        # only the rows strided: no phase, rows read at 2
]


def _columns_pair(monkeypatch, xs, kernel, strides, dil, pads, group, dtype):
    """(the window view's Columns, the stride phases' Columns) of one geometry."""
    r = len(kernel)
    begin, end = list(pads[:r]), list(pads[r:])
    out = [(s + b + e - (k - 1) * d - 1) // st + 1
           for s, b, e, k, d, st in zip(xs[2:], begin, end, kernel, dil, strides)]
    made = []
    monkeypatch.setattr(thresholds, "PHASES_SINGLE_TAP", True)
    for limit in (1 << 60, 0):
        monkeypatch.setattr(thresholds, "PHASES_MIN_COLUMN_BYTES", limit)
        made.append(im2col.Columns(xs, dtype, group, kernel, strides, dil, begin, end, out))
    return made, out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced"])
@pytest.mark.parametrize("xs,kernel,strides,dil,pads,group", PHASE_CASES)
def test_im2col_phase_columns_equal_the_window_columns(monkeypatch, xs, kernel, strides, dil, pads, group, layout,
                                                       dtype):
    """The columns gathered from the stride phases are the window view's, bit for bit (float32 by 8-byte
    pairs along a stride-2 last axis when X's last axis is contiguous: NaN payloads, -0.0 and
    infinities kept), for X contiguous, a transposed copy's view or a slice of a wider array."""
    (view, phases), out = _columns_pair(monkeypatch, xs, kernel, strides, dil, pads, group, np.dtype(dtype))
    assert view.phases is None and phases.phases is not None
    x = RNG.standard_normal(xs).astype(dtype)
    flat = x.reshape(-1)
    flat[:4] = [np.inf, -0.0, -np.inf, 0.0]
    if dtype == np.float32:
        flat.view(np.uint32)[4:6] = [0x7FC00123, 0xFFA00001]        # NaNs with payloads (quiet and signalling)
    if layout == "transposed":
        x = np.ascontiguousarray(np.swapaxes(x, 1, -1)).swapaxes(1, -1)
    elif layout == "sliced":
        x = np.concatenate([x, x[..., :2]], axis=-1)[..., :xs[-1]]
    a, b = view.columns(x), phases.columns(x)
    assert a.shape == b.shape == (1, group, xs[1] // group * math.prod(kernel), math.prod(out))
    assert a.dtype == b.dtype == dtype
    assert np.array_equal(a.view(np.uint8), b.view(np.uint8))      # same bits, NaNs included


@pytest.mark.parametrize("xs,kernel,strides,dil,pads,group", PHASE_CASES)
def test_im2col_phases_conv_against_direct_loop(monkeypatch, xs, kernel, strides, dil, pads, group):
    monkeypatch.setattr(thresholds, "PHASES_MIN_COLUMN_BYTES", 0)
    monkeypatch.setattr(thresholds, "PHASES_SINGLE_TAP", True)
    calls = spy_on(monkeypatch, im2col.Phases, "columns")
    x, w, b = ints(xs), ints((4, xs[1] // group, *kernel)), ints((4,))
    attrs = dict(group=group, strides=list(strides), dilations=list(dil), pads=list(pads))
    assert_same(run_conv([x, w, b], "im2col", **attrs_of(**attrs)), conv_expected(x, w, b, **attrs).astype(np.float32))
    assert calls == ["columns"]


def test_im2col_phases_only_where_taps_skip_positions():
    """The phases split the last axis by its stride, and another strided axis only where its taps skip
    positions; a phase no tap reads is neither kept nor filled. 3x3 /2 (pad 1) on 3x224x224: every row
    is read, so 2 column phases of 225 rows (the 224 + 1 padding rows the windows reach) x 113 columns;
    1x1 /4 on 4x4: 4 x 4 phases of one position, the first alone read and filled."""
    f32 = np.dtype(np.float32)
    stem = im2col.Phases((1, 3, 224, 224), f32, (3, 3), (2, 2), (1, 1), (1, 1), (112, 112))
    assert stem.shape == (1, 2, 3, 225, 113) and len(stem.fills) == 2 and stem.zeros
    sparse = im2col.Phases((1, 1, 4, 4), f32, (1, 1), (4, 4), (1, 1), (0, 0), (1, 1))
    assert sparse.shape == (4, 4, 1, 1, 1) and len(sparse.fills) == 1 and len(sparse.taps) == 1
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    assert sparse.columns(x).reshape(-1).tolist() == [0.0]


def test_im2col_phases_chosen_by_the_size_of_the_columns():
    """From thresholds.PHASES_MIN_COLUMN_BYTES of columns on (320 KB): the first conv of a 224x224 RGB
    network (3 x 9 x 112 x 112 x 4 bytes = 1.35 MB) and MobileNet's 16x56x56 /2 depthwise layer
    (441 KB) gather from their phases; a small strided layer (16 x 9 x 12 x 12 x 4 = 83 KB), an
    unstrided one (any size) and a 1x1 /2 one (one tap per strided axis: the window view reads each
    value once) from the window view."""
    def phased(c, side, stride, dtype=np.float32, k=3, group=1):
        out = (side + 2 * (k // 2) - k) // stride + 1
        return im2col.Columns((1, c, side, side), np.dtype(dtype), group, (k, k), (stride, stride), (1, 1),
                              (k // 2,) * 2, (k // 2,) * 2, (out, out)).phases is not None
    assert phased(3, 224, 2) and phased(16, 56, 2, group=16)
    assert not phased(16, 24, 2) and not phased(3, 224, 1) and not phased(256, 56, 2, k=1)
    assert phased(3, 96, 2, np.float64) and not phased(3, 96, 2)       # 249 KB in float32, twice that in float64
    assert phased(16, 48, 2) and not phased(16, 40, 2)                  # 324 and 225 KB


BAND_CASES = [  # (x shape, w shape, attributes)
    ((1, 3, 9, 8), (5, 3, 3, 3), dict(pads=[1, 1, 1, 1])),
    ((1, 2, 10, 7), (3, 2, 2, 3), dict(pads=[0, 2, 1, 0], dilations=[2, 1])),
    ((1, 2, 17), (4, 2, 3), dict(pads=[1, 1], strides=[1])),
    ((1, 2, 5, 4, 6), (3, 2, 2, 3, 2), dict(pads=[1, 0, 1, 0, 1, 1])),
    ((2, 3, 8, 8), (4, 3, 3, 3), dict(pads=[1, 1, 1, 1])),          # two images (per_image)
]


@pytest.mark.parametrize("band_bytes", [1, 200, 1000, 1 << 30])
@pytest.mark.parametrize("xs,ws,attrs", BAND_CASES)
def test_im2col_bands_against_direct_loop(monkeypatch, xs, ws, attrs, band_bytes):
    """Columns of thresholds.IM2COL_BANDS_MIN_BYTES and more (one group) are gathered and multiplied in
    bands of output rows of about IM2COL_BAND_BYTES in a run that splits its products: one row a
    band, a few, a last short band, all."""
    monkeypatch.setattr(thresholds, "IM2COL_BANDS_MIN_BYTES", 0)
    monkeypatch.setattr(thresholds, "IM2COL_BAND_BYTES", band_bytes)
    monkeypatch.setattr(onnx_mini.blas, "splitting", lambda: True)     # as in a "split" run
    calls = spy_on(monkeypatch, im2col, "conv_bands")
    x, w, b = ints(xs), ints(ws), ints(ws[:1])
    assert_same(run_conv([x, w, b], "im2col", constant=(1, 2), **attrs),
                conv_expected(x, w, b, **attrs).astype(np.float32))
    assert calls == ["conv_bands"] * xs[0]


@pytest.mark.parametrize("threads", [1, 2])
def test_im2col_bands_results_do_not_depend_on_the_threads(monkeypatch, threads):
    """The bands are the same products whether the pool shares them or one thread runs them all: a
    float32 layer of random values gives the same bits in "split" mode on two threads as on one."""
    monkeypatch.setattr(thresholds, "IM2COL_BANDS_MIN_BYTES", 0)
    monkeypatch.setattr(thresholds, "IM2COL_BAND_BYTES", 4000)
    monkeypatch.setattr(thresholds, "STRIPS_MIN_PIXELS", 1 << 62)      # (this Conv would go strips)
    x = RNG.standard_normal((1, 8, 24, 20)).astype(np.float32)
    w = RNG.standard_normal((6, 8, 3, 3)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", 1, x.shape)],
                              [helper.make_empty_tensor_value_info("y")], [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    calls = spy_on(monkeypatch, im2col, "conv_bands")
    monkeypatch.setattr(onnx_mini.blas, "POLICY", "split")
    y = onnx_mini.prepare(model, threads=threads).run([x])[0]
    monkeypatch.setattr(onnx_mini.blas, "POLICY", "auto")
    single = onnx_mini.prepare(model, threads=1).run([x])[0]      # one thread: a run that splits, alone
    assert len(calls) == (2 if onnx_mini.blas.managed() else 0)    # (only numpy's OpenBLAS is split)
    assert np.array_equal(y, single)
    np.testing.assert_allclose(y, conv_expected(x, w, pads=[1, 1, 1, 1]), rtol=1e-5, atol=1e-5)


def test_im2col_bands_only_where_the_run_splits_its_products(monkeypatch):
    """With OpenBLAS's own threads (not splitting) the banded geometry makes the one whole product:
    the same bits as columns that are not banded."""
    monkeypatch.setattr(onnx_mini.blas, "splitting", lambda: False)
    calls = spy_on(monkeypatch, im2col, "conv_bands")
    x = RNG.standard_normal((1, 4, 20, 18)).astype(np.float32)
    w = RNG.standard_normal((5, 4, 3, 3)).astype(np.float32)
    made = []
    for limit in (0, 1 << 60):
        monkeypatch.setattr(thresholds, "IM2COL_BANDS_MIN_BYTES", limit)
        made.append(im2col.Columns(x.shape, x.dtype, 1, (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), (20, 18)))
    assert made[0].band is not None and made[1].band is None
    banded, whole = (im2col.conv(x, w, 1, cols, (20, 18)) for cols in made)
    assert calls == [] and np.array_equal(banded, whole)


def test_im2col_bands_from_their_size():
    """One group's columns of thresholds.IM2COL_BANDS_MIN_BYTES (4 MB) and more go in bands: a U-Net's
    16 -> 16 layer at 128x128 (16 x 9 x 128 x 128 x 4 bytes = 9.4 MB), not at 64x64 (2.4 MB), nor
    with two groups; bands of about IM2COL_BAND_BYTES (576 KB: 8 of the 128 output rows)."""
    def band(c, side, group=1):
        return im2col.Columns((1, c, side, side), np.dtype(np.float32), group, (3, 3), (1, 1), (1, 1), (1, 1),
                              (1, 1), (side, side)).band
    assert band(16, 128) == 576 * 1024 * 128 // (16 * 9 * 128 * 128 * 4) == 8
    assert band(16, 64) is None and band(16, 128, group=2) is None


def test_conv_depthwise_flat_stride_2_phases_copied_by_pairs():
    """A stride-2 phase of 4-byte values is copied as X's pairs read as 8-byte integers (keeping the
    first of each), the value whose pair would end past X's row copied alone: X's row 0..6 (7 columns),
    pads 1, output 4 columns: phase 0 reads X columns 1, 3, 5 (pairs 1-2, 3-4, 5-6, none left over),
    phase 1 columns 0, 2, 4, 6 (pairs 0-1, 2-3, 4-5, then 6 alone)."""
    from onnx_mini.ops.nn.conv.im2col import pair_split
    assert pair_split((slice(0, 3),), (slice(1, 6, 2),), 7) == (((slice(0, 3),), (slice(1, 7),)), None)
    assert pair_split((slice(1, 4), slice(0, 4)), (slice(0, 7, 2), slice(0, 7, 2)), 7) == (
        ((slice(1, 4), slice(0, 3)), (slice(0, 7, 2), slice(0, 6))),
        ((slice(1, 4), slice(3, 4)), (slice(0, 7, 2), slice(6, 7, 2))))
    assert pair_split((slice(0, 3),), (slice(0, 9, 3),), 9) is None


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("xs,pads", [((2, 3, 9, 7), [1, 1, 1, 1]), ((1, 2, 8, 10), [1, 1, 1, 1]),
                                     ((1, 2, 8, 9), [0, 0, 0, 0]), ((1, 2, 7, 8), [2, 1, 0, 2])])
def test_conv_depthwise_flat_stride_2_bit_for_bit(monkeypatch, dtype, xs, pads):
    """The flat layout at stride 2 (phases by pairs for 4-byte compute types, plain copies for
    float64) against the direct loop, odd and even widths, with infinities and a NaN at the edges."""
    monkeypatch.setattr(thresholds, "DW_BLOCK_BYTES", 1)
    x = ints(xs, dtype=dtype)
    x[0, 0, 0, -1] = np.inf
    x[-1, -1, -1, 0] = np.nan
    w = ints((xs[1], 1, 3, 3), lo=1, hi=3, dtype=dtype)
    attrs = dict(group=xs[1], strides=[2, 2], pads=pads)
    expected = conv_expected(x.astype(np.float64), w.astype(np.float64), **attrs).astype(dtype)
    assert_same(run_depthwise("flat", [x, w], **attrs_of(**attrs)), expected)


def test_bench_floors_whole_floor_counts_the_passes_numpy_cannot_avoid(monkeypatch):
    """bench_floors' whole floor, on a small model mixing QDQ and QLinearConv: one pass per
    QuantizeLinear on a computed tensor (the one after HardSwish standing for its lookup, so HardSwish
    has none), one for QLinearConv's own requantization, one for a Relu feeding an Add, the Add and
    the pooling; none for DequantizeLinear, for a Mul by a constant, nor for the weights' own
    DequantizeLinear (constants); the pieces in run order: the Conv as a product, the depthwise
    QLinearConv as a depthwise floor."""
    import types
    bench_floors = _bench_floors(monkeypatch)
    monkeypatch.setattr(bench_floors, "DW_BLOCKS", 1)
    monkeypatch.setattr(bench_floors, "DW_CALLS", 1)
    monkeypatch.setattr(bench_floors.core, "PAUSE", 0)
    u8 = lambda name, v: numpy_helper.from_array(np.array(v, np.uint8), name)      # noqa: E731
    f32 = lambda name, v: numpy_helper.from_array(np.array(v, np.float32), name)    # noqa: E731
    rng = np.random.default_rng(3)
    inits = [f32("s", 0.05), u8("z", 128), u8("w1", rng.integers(0, 255, (3, 2, 1, 1))), f32("ws", 0.01),
             u8("w2", rng.integers(0, 255, (3, 1, 3, 3))), f32("half", 0.5)]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="q_x"),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="dq_x"),
             helper.make_node("DequantizeLinear", ["w1", "ws", "z"], ["w1d"], name="dq_w1"),
             helper.make_node("Conv", ["xd", "w1d"], ["c1"], name="conv1"),
             helper.make_node("QuantizeLinear", ["c1", "s", "z"], ["c1q"], name="q_c1"),
             helper.make_node("DequantizeLinear", ["c1q", "s", "z"], ["c1d"], name="dq_c1"),
             helper.make_node("HardSwish", ["c1d"], ["h"], name="hswish"),
             helper.make_node("QuantizeLinear", ["h", "s", "z"], ["hq"], name="q_h"),
             helper.make_node("QLinearConv", ["hq", "s", "z", "w2", "ws", "z", "s", "z"], ["q2"], name="dw",
                              group=3, pads=[1, 1, 1, 1]),
             helper.make_node("DequantizeLinear", ["q2", "s", "z"], ["d2"], name="dq_2"),
             helper.make_node("Mul", ["d2", "half"], ["m"], name="scale"),
             helper.make_node("Relu", ["m"], ["r"], name="relu"),
             helper.make_node("Add", ["r", "c1d"], ["a"], name="residual"),
             helper.make_node("GlobalAveragePool", ["a"], ["g"], name="pool")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [1, 2, 5, 4])],
                              [helper.make_tensor_value_info("g", 1, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    app = types.SimpleNamespace(name="small", model=model,
                                feeds={"x": rng.standard_normal((1, 2, 5, 4)).astype(np.float32)})
    steps = bench_floors._record_steps(app)
    passes = bench_floors.elementwise_passes(model, steps)
    assert [(name, shape) for name, _, shape, _ in passes] == [
        ("q_x", (1, 2, 5, 4)), ("q_c1", (1, 3, 5, 4)), ("q_h", (1, 3, 5, 4)), ("dw", (1, 3, 5, 4)),
        ("relu", (1, 3, 5, 4)), ("residual", (1, 3, 5, 4)), ("pool", (1, 3, 5, 4))]
    parts, order = bench_floors.whole_floor(app, steps)
    assert [(part, name) for part, name, _ in order] == [
        ("passes", "q_x"), ("products", "conv1"), ("passes", "q_c1"), ("passes", "q_h"), ("depthwise", "dw"),
        ("passes", "dw"), ("passes", "relu"), ("passes", "residual"), ("passes", "pool")]
    for run in parts.values():
        run()
