"""One image's im2col (ops/nn/conv/im2col.py): the columns of a small image of many channels gathered
channels-last (`LastColumns`: window rows as runs of kw*C values, W's taps in that order, the bias
in a column of W against a column of ones), and B summed by the product through a row of ones after
NCHW columns (`Columns.biased`). Values against helpers.conv2d_direct (Conv's definition); small
integers make every float32 sum exact, so those results must match bit for bit."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_mini
from helpers import conv2d_direct
from onnx_mini.ops.nn import conv
from onnx_mini.ops.nn.conv import im2col, thresholds

RNG = np.random.default_rng(2211)


def ints(shape, lo=-3, hi=3, dtype=np.float32):
    return RNG.integers(lo, hi + 1, size=shape).astype(dtype)


def direct(x, w, b=None, strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1)):
    """conv2d_direct (pads: top, left, bottom, right) with W dilated: tap (i, j) at (i*dh, j*dw) of a
    kernel of zeros."""
    m, c, kh, kw = w.shape
    dh, dw = dilations
    wd = np.zeros((m, c, (kh - 1) * dh + 1, (kw - 1) * dw + 1), w.dtype)
    wd[:, :, ::dh, ::dw] = w
    return conv2d_direct(x, wd, b, strides=strides, pads=tuple(pads))


def onnx_pads(pads):
    """(top, left, bottom, right) -> ONNX's pads (begins, then ends: the same order in 2-D)."""
    return list(pads)


def gather(convolution, x):
    """The im2col geometry the Convolution kept for X's shape (None when none was made)."""
    layout = next(v for k, v in convolution.layouts.items() if k[0] == x.shape)
    return layout.memo.get("columns")


CASES = [  # (id, X shape, W shape, strides, pads (top, left, bottom, right), dilations)
    ("wakeword-3x3", (1, 32, 24, 8), (64, 32, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    ("no-pads", (1, 32, 7, 9), (5, 32, 3, 3), (1, 1), (0, 0, 0, 0), (1, 1)),
    ("strided-asymmetric", (1, 40, 11, 10), (6, 40, 3, 3), (2, 2), (0, 1, 2, 0), (1, 1)),
    ("stride-2-by-1", (1, 33, 9, 7), (4, 33, 3, 2), (2, 1), (1, 0, 1, 1), (1, 1)),
    ("dilated-rows", (1, 32, 10, 6), (3, 32, 3, 3), (1, 1), (2, 1, 2, 1), (2, 1)),
    ("pads-beyond-the-kernel", (1, 32, 4, 3), (2, 32, 3, 3), (1, 1), (4, 0, 1, 5), (1, 1)),
    ("1x2-padded", (1, 48, 5, 5), (7, 48, 1, 2), (1, 1), (1, 1, 1, 0), (1, 1)),
    ("one-output", (1, 32, 3, 3), (2, 32, 3, 3), (1, 1), (0, 0, 0, 0), (1, 1)),
]


@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("constant", [True, False])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_channels_last_columns_are_conv(case, constant, with_bias):
    """Every geometry above by channels-last columns (the normal choice: one image, >= 32 channels, few
    pixels), W and B constants (their layout made once) or fed: exact sums, X untouched."""
    _, xs, ws, strides, pads, dil = case
    x, w, b = ints(xs), ints(ws), ints((ws[0],)) if with_bias else None
    given = x.copy()
    convolution = conv.Convolution(pads=onnx_pads(pads), strides=list(strides), dilations=list(dil),
                                   constants={1: w, 2: b} if constant else None)
    want = direct(x, w, b, strides, pads, dil).astype(np.float32)
    for _ in range(2):          # the second call: the kept weights and geometry
        got = convolution(x, w, b)
        assert convolution.algorithms[x.shape] == "im2col"
        assert type(gather(convolution, x)) is im2col.LastColumns
        assert got.dtype == np.float32 and got.shape == want.shape and got.flags.c_contiguous
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(x, given)


def test_channels_last_columns_other_ranks():
    """1-D (more outputs than by rows) and 3-D, with a bias: the same sums as the 2-D definition (a 1-D
    Conv is a 2-D one of height 1; a 3-D one sums 2-D ones over its depth taps)."""
    x1, w1, b1 = ints((1, 36, 11)), ints((5, 36, 3)), ints((5,))
    c1 = conv.Convolution(pads=[1, 2], constants={1: w1, 2: b1})
    got = c1(x1, w1, b1)
    assert type(gather(c1, x1)) is im2col.LastColumns
    want = conv2d_direct(x1[:, :, None], w1[:, :, None], b1, pads=(0, 1, 0, 2))[:, :, 0]
    np.testing.assert_array_equal(got, want.astype(np.float32))

    x3, w3, b3 = ints((1, 32, 4, 5, 6)), ints((3, 32, 2, 3, 3)), ints((3,))
    c3 = conv.Convolution(pads=[0, 1, 1, 1, 1, 0], strides=[1, 2, 1], constants={1: w3, 2: b3})
    got = c3(x3, w3, b3)
    assert type(gather(c3, x3)) is im2col.LastColumns
    xp = np.pad(x3, ((0, 0), (0, 0), (0, 1), (0, 0), (0, 0)))          # depth pads (0, 1)
    depth = xp.shape[2] - 2 + 1
    want = np.stack([sum(conv2d_direct(xp[:, :, d + t], w3[:, :, t], strides=(2, 1), pads=(1, 1, 1, 0))
                         for t in range(2)) for d in range(depth)], axis=2) + b3.reshape(1, 3, 1, 1, 1)
    np.testing.assert_array_equal(got, want.astype(np.float32))


def test_which_gather_the_thresholds_choose():
    """Channels-last columns from LAST_COLUMNS_MIN_CHANNELS input channels up to LAST_COLUMNS_MAX_PIXELS
    output pixels, one image, more than one tap along the last axis at dilation 1; NCHW columns otherwise (with the bias
    row for one image of one group), all exact."""
    c_min, p_max = thresholds.LAST_COLUMNS_MIN_CHANNELS, thresholds.LAST_COLUMNS_MAX_PIXELS
    side = int(p_max ** 0.5)
    cases = [  # (X shape, W shape, dilations, the geometry expected)
        ((1, c_min, side, p_max // side), (4, c_min, 3, 3), (1, 1), im2col.LastColumns),
        ((1, c_min - 1, 8, 8), (4, c_min - 1, 3, 3), (1, 1), im2col.Columns),
        ((1, c_min, side, p_max // side + 1), (4, c_min, 3, 3), (1, 1), im2col.Columns),
        ((1, c_min, 8, 8), (4, c_min, 3, 3), (1, 2), im2col.Columns),
        ((1, c_min, 8, 8), (4, c_min, 3, 1), (1, 1), im2col.Columns),     # one tap per window row
    ]
    for xs, ws, dil, kind in cases:
        x, w, b = ints(xs), ints(ws), ints((ws[0],))
        convolution = conv.Convolution(pads=[1, 1, 1, 1], dilations=list(dil), algorithm="im2col",
                                       constants={1: w, 2: b})
        got = convolution(x, w, b)
        assert type(gather(convolution, x)) is kind, xs
        np.testing.assert_array_equal(got, direct(x, w, b, (1, 1), (1, 1, 1, 1), dil).astype(np.float32))


def direct_nd(x, w, b, strides, pads):
    """direct() for a 1-D Conv (a 2-D one of height 1; ONNX pads (begin, end)) or a 2-D one (ONNX pads)."""
    if x.ndim == 4:
        return direct(x, w, b, strides, (pads[0], pads[1], pads[2], pads[3]))
    y = direct(x[:, :, None], w[:, :, None], b, (1, strides[0]), (0, pads[0], 0, pads[1]))
    return y[:, :, 0]


@pytest.mark.parametrize("xs, ws, strides, pads, with_bias, as_is", [
    ((1, 1, 3000), (10, 1, 512), (160,), (0, 0), False, True),      # an STFT front end: X is its own copy
    ((1, 1, 1000), (6, 1, 80), (30,), (0, 0), True, True),
    ((1, 1, 9000), (3, 1, 64), (32,), (0, 0), True, True),         # more pixels than LAST_COLUMNS_MAX_PIXELS
    ((1, 1, 900), (5, 1, 70), (16,), (7, 3), True, False),         # padded: the channels-last copy
    ((1, 1, 6, 300), (4, 1, 2, 70), (1, 25), (1, 0, 0, 2), True, False),   # 2-D, strided along the last axis
])
def test_strided_long_window_rows_go_channels_last(xs, ws, strides, pads, with_bias, as_is):
    """One channel strided along the last axis, >= LAST_COLUMNS_ONE_CHANNEL_MIN_TAPS taps along it:
    channels-last columns at any pixel count (X itself where nothing is padded, its values untouched),
    the definition's exact sums; one tap fewer, or two channels, gather NCHW columns, also exact."""
    taps = thresholds.LAST_COLUMNS_ONE_CHANNEL_MIN_TAPS
    assert ws[-1] >= taps and (xs[-1] < 9000 or (xs[-1] - 64) // 32 + 1 > thresholds.LAST_COLUMNS_MAX_PIXELS)
    x, w, b = ints(xs), ints(ws), ints((ws[0],)) if with_bias else None
    given = x.copy()
    want = direct_nd(x, w, b, strides, pads).astype(np.float32)
    convolution = conv.Convolution(pads=list(pads), strides=list(strides), constants={1: w, 2: b})
    for _ in range(2):
        got = convolution(x, w, b)
        columns = gather(convolution, x)
        assert type(columns) is im2col.LastColumns and columns.as_is == as_is
        assert got.dtype == np.float32 and got.shape == want.shape and got.flags.c_contiguous
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(x, given)
    read_only = x.copy()
    read_only.flags.writeable = False
    wide = np.zeros(xs[:-1] + (2 * xs[-1],), np.float32)
    wide[..., ::2] = x
    for other in (read_only, wide[..., ::2]):       # the same values read-only, or strided
        np.testing.assert_array_equal(convolution(other, w, b), want)
    x2 = np.concatenate([x, ints(xs)], axis=1)
    for xi, wi in ((x, ints((*ws[:-1], taps - 1))), (x2, ints((ws[0], 2, *ws[2:])))):
        ci = conv.Convolution(pads=list(pads), strides=list(strides), constants={1: wi, 2: b})
        got = ci(xi, wi, b)
        assert type(gather(ci, xi)) is im2col.Columns
        np.testing.assert_array_equal(got, direct_nd(xi, wi, b, strides, pads).astype(np.float32))


@pytest.mark.parametrize("xs, ws, strides", [
    ((1, 1, 97, 32), (16, 1, 3, 3), (1, 1)),        # the wakeword's first layer
    ((1, 8, 12, 10), (6, 8, 3, 2), (1, 2)),         # strided, columns from the window view
    ((1, 3, 130, 130), (4, 3, 3, 3), (2, 2)),       # strided with large columns: from the phases, no bias row
    ((2, 8, 9, 9), (5, 8, 3, 3), (1, 1)),           # two images: the bias after each image's product
])
def test_bias_row_is_conv(xs, ws, strides):
    """B summed by the product (a row of ones after one image's NCHW columns), or added after it where
    the columns come otherwise: exact; without B the product alone; the constant W's layout is kept."""
    x, w, b = ints(xs), ints(ws), ints((ws[0],))
    pads = (1, 0, 1, 1)
    convolution = conv.Convolution(pads=onnx_pads(pads), strides=list(strides), algorithm="im2col",
                                   constants={1: w, 2: b})
    for _ in range(2):
        np.testing.assert_array_equal(convolution(x, w, b), direct(x, w, b, strides, pads).astype(np.float32))
    columns = gather(convolution, x)
    if xs[0] == 1:
        assert type(columns) is im2col.Columns
        assert columns.bias_row == (columns.phases is None)
        assert (("nchw", np.dtype(np.float32)) in convolution.kept) == columns.bias_row
        assert (columns.phases is not None) == (xs[2] == 130)
    plain = conv.Convolution(pads=onnx_pads(pads), strides=list(strides), algorithm="im2col")
    np.testing.assert_array_equal(plain(x, w), direct(x, w, None, strides, pads).astype(np.float32))


def direct_groups(x, w, b, pads, dilations, group):
    """direct() of each group's channels, side by side."""
    cg, mg = x.shape[1] // group, w.shape[0] // group
    return np.concatenate([direct(x[:, g * cg:(g + 1) * cg], w[g * mg:(g + 1) * mg],
                                  None if b is None else b[g * mg:(g + 1) * mg], (1, 1), pads, dilations)
                           for g in range(group)], axis=1)


@pytest.mark.parametrize("xs, ws, pads, dil, group", [
    ((1, 16, 48, 16), (32, 16, 3, 3), (1, 1, 1, 1), (1, 1), 1),     # the wakeword's second layer (bias row)
    ((1, 6, 10, 9), (4, 3, 3, 2), (0, 1, 2, 0), (2, 1), 2),         # dilated rows, two groups
    ((2, 4, 7, 5), (3, 4, 2, 3), (0, 0, 0, 0), (1, 2), 1),          # two images, unpadded, dilated columns
])
@pytest.mark.parametrize("with_bias", [True, False])
def test_narrow_outputs_gather_by_strips(xs, ws, pads, dil, group, with_bias):
    """A 2-D output at stride 1 no wider than IM2COL_STRIPS_MAX_WIDTH: its columns copied by way of the
    kernel's column shifts, the same values in the same order (the definition's exact sums); one column
    wider, the window view's columns, also exact."""
    x, w = ints(xs), ints(ws)
    b = ints((ws[0],)) if with_bias else None
    given = x.copy()
    convolution = conv.Convolution(pads=onnx_pads(pads), dilations=list(dil), group=group, algorithm="im2col",
                                   constants={1: w, 2: b})
    want = direct_groups(x, w, b, pads, dil, group).astype(np.float32)
    for _ in range(2):
        np.testing.assert_array_equal(convolution(x, w, b), want)
    columns = gather(convolution, x)
    assert type(columns) is im2col.Columns and columns.strips is not None
    np.testing.assert_array_equal(x, given)
    widest = thresholds.IM2COL_STRIPS_MAX_WIDTH
    bw = None if b is None else b[:2]
    for width, by_strips in ((widest, True), (widest + 1, False)):
        xw = ints((1, 3, 4, width + 1))             # (3x2 kernel, unpadded: width outputs)
        ww = ints((2, 3, 3, 2))
        cw = conv.Convolution(pads=[0, 0, 0, 0], algorithm="im2col", constants={1: ww, 2: bw})
        got = cw(xw, ww, bw)
        assert got.shape[-1] == width and (gather(cw, xw).strips is not None) == by_strips
        np.testing.assert_array_equal(got, direct(xw, ww, bw, (1, 1), (0, 0, 0, 0)).astype(np.float32))


def test_another_w_than_the_constant():
    """A W (or B) fed in place of the constants is laid out on the call, never from the kept layout."""
    b2 = ints((4,))
    for xs in ((1, 32, 6, 6), (1, 4, 6, 6)):         # channels-last columns, then NCHW with the bias row
        x, w, b, w2 = ints(xs), ints((4, xs[1], 3, 3)), ints((4,)), ints((4, xs[1], 3, 3))
        convolution = conv.Convolution(pads=[1, 1, 1, 1], constants={1: w, 2: b})
        want = direct(x, w, b, (1, 1), (1, 1, 1, 1)).astype(np.float32)
        np.testing.assert_array_equal(convolution(x, w, b), want)
        np.testing.assert_array_equal(convolution(x, w2, b), direct(x, w2, b, (1, 1), (1, 1, 1, 1)).astype(np.float32))
        np.testing.assert_array_equal(convolution(x, w, b2), direct(x, w, b2, (1, 1), (1, 1, 1, 1)).astype(np.float32))
        np.testing.assert_array_equal(convolution(x, w, b), want)


def test_types_and_non_finite_values():
    """float64 computes in float64, float16 in float32 rounded once; an infinity or NaN in X reaches
    exactly the outputs whose windows hold it (inf * 0 = NaN where a tap is 0, as the definition)."""
    x = RNG.standard_normal((1, 32, 6, 5))
    w = RNG.standard_normal((8, 32, 3, 3))
    b = RNG.standard_normal(8)
    want = direct(x, w, b, (1, 1), (1, 1, 1, 1))
    y64 = conv.Convolution(pads=[1, 1, 1, 1], constants={1: w, 2: b})(x, w, b)
    assert y64.dtype == np.float64
    np.testing.assert_allclose(y64, want, rtol=1e-12, atol=1e-12)
    x16, w16, b16 = x.astype(np.float16), w.astype(np.float16), b.astype(np.float16)
    y16 = conv.Convolution(pads=[1, 1, 1, 1], constants={1: w16, 2: b16})(x16, w16, b16)
    assert y16.dtype == np.float16
    want16 = direct(x16.astype(np.float64), w16.astype(np.float64), b16.astype(np.float64), (1, 1), (1, 1, 1, 1))
    np.testing.assert_allclose(y16.astype(np.float64), want16, rtol=2e-3, atol=2e-2)

    xi, wi, bi = ints((1, 32, 5, 4)), ints((3, 32, 3, 3)), ints((3,))
    wi[0, :, 1, 1] = 0          # channel 0's centre tap is 0: inf * 0 = NaN there
    xi[0, 2, 2, 1] = np.inf
    xi[0, 5, 0, 3] = np.nan
    convolution = conv.Convolution(pads=[1, 1, 1, 1], constants={1: wi, 2: bi})
    with np.errstate(invalid="ignore"):         # (BLAS's inf * 0, as wanted)
        got = convolution(xi, wi, bi)
    assert type(gather(convolution, xi)) is im2col.LastColumns
    np.testing.assert_array_equal(got, direct(xi, wi, bi, (1, 1), (1, 1, 1, 1)).astype(np.float32))
    assert np.isnan(got[0, 0, 2, 1]) and np.isnan(got[0, 1, 0, 3])


def test_fused_conv_relu_model():
    """The wakeword's Conv + Relu layers through prepare/run (the fused Conv, its Relu in place after
    the product that summed B): the definition's values, float32 within rounding."""
    x = RNG.standard_normal((1, 1, 97, 32)).astype(np.float32)
    weights = [(RNG.standard_normal((m, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
               for c, m in ((1, 16), (16, 32), (32, 64))]
    biases = [RNG.standard_normal(w.shape[0]).astype(np.float32) for w in weights]
    nodes, inits, name = [], [], "x"
    for i, (w, b) in enumerate(zip(weights, biases)):
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes += [helper.make_node("Conv", [name, f"w{i}", f"b{i}"], [f"c{i}"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"]),
                  helper.make_node("MaxPool", [f"r{i}"], [f"p{i}"], kernel_shape=[2, 2], strides=[2, 2])]
        name = f"p{i}"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 97, 32])],
                              [helper.make_tensor_value_info(name, TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    want = x.astype(np.float64)
    for w, b in zip(weights, biases):
        y = np.maximum(direct(want, w, b, (1, 1), (1, 1, 1, 1)), 0)
        h, wd = y.shape[2] // 2 * 2, y.shape[3] // 2 * 2
        want = y[:, :, :h, :wd].reshape(1, y.shape[1], h // 2, 2, wd // 2, 2).max(axis=(3, 5))
    prepared = onnx_mini.prepare(model)
    for _ in range(2):
        (got,) = prepared.run({"x": x})
        assert got.shape == (1, 64, 12, 4)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


LAST_MEMORY_CASES = [  # (id, NHWC shape, W shape, strides, pads (top, left, bottom, right), dilations)
    ("magika-5x1", (3, 40, 1, 64), (6, 64, 5, 1), (1, 1), (0, 0, 0, 0), (1, 1)),
    ("3x3-padded", (2, 9, 7, 16), (5, 16, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    ("strided-dilated", (1, 12, 11, 32), (4, 32, 3, 2), (2, 1), (0, 1, 2, 0), (2, 1)),
    ("one-image-1x1", (1, 5, 6, 40), (3, 40, 1, 1), (1, 1), (0, 0, 0, 0), (1, 1)),
]


@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("constant", [True, False])
@pytest.mark.parametrize("case", LAST_MEMORY_CASES, ids=lambda c: c[0])
def test_channels_last_memory_is_read_by_channels_last_columns(case, constant, with_bias):
    """X an NHWC tensor seen through a Transpose to NCHW (TensorFlow and JAX exports): channels-last
    columns image by image, read straight from X's memory; exact sums, X untouched. The same X made
    C-contiguous takes the NCHW columns (another geometry kept for the same shape) with the same values."""
    _, nhwc, ws, strides, pads, dil = case
    x_nhwc, w, b = ints(nhwc), ints(ws), ints((ws[0],)) if with_bias else None
    x = x_nhwc.transpose(0, 3, 1, 2)
    assert im2col.channels_last_memory(x)
    given = x_nhwc.copy()
    convolution = conv.Convolution(pads=onnx_pads(pads), strides=list(strides), dilations=list(dil),
                                   constants={1: w, 2: b} if constant else None, algorithm="im2col")
    want = direct(np.ascontiguousarray(x), w, b, strides, pads, dil).astype(np.float32)
    for _ in range(2):
        got = convolution(x, w, b)
        layout = next(v for k, v in convolution.layouts.items() if k[0] == x.shape)
        assert type(layout.memo["columns, channels-last memory"]) is im2col.LastColumns
        assert got.dtype == np.float32 and got.shape == want.shape and got.flags.c_contiguous
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(x_nhwc, given)
    np.testing.assert_array_equal(convolution(np.ascontiguousarray(x), w, b), want)
    assert "columns" in layout.memo


def test_channels_last_memory_with_few_channels_takes_nchw_columns():
    """Window rows of fewer than LAST_MEMORY_MIN_RUN values (3 channels, kw = 3): the NCHW columns."""
    x = ints((2, 10, 10, 3)).transpose(0, 3, 1, 2)
    w = ints((4, 3, 3, 3))
    assert 3 * 3 < thresholds.LAST_MEMORY_MIN_RUN
    convolution = conv.Convolution(pads=[1, 1, 1, 1], algorithm="im2col")
    got = convolution(x, w)
    layout = next(iter(convolution.layouts.values()))
    assert "columns, channels-last memory" not in layout.memo and type(layout.memo["columns"]) is im2col.Columns
    np.testing.assert_array_equal(got, direct(np.ascontiguousarray(x), w, None, (1, 1), (1, 1, 1, 1)))


def test_channels_last_memory_one_dimensional():
    """1-D: X (N, C, L) seen from (N, L, C), padded, with a bias."""
    x = ints((2, 30, 48)).transpose(0, 2, 1)
    w, b = ints((5, 48, 4)), ints((5,))
    convolution = conv.Convolution(pads=[2, 1], constants={1: w, 2: b})
    got = convolution(x, w, b)
    want = direct(np.ascontiguousarray(x)[:, :, None, :], w[:, :, None, :], b, (1, 1), (0, 2, 0, 1))[:, :, 0]
    np.testing.assert_array_equal(got, want.astype(np.float32))
