"""Conv by strips (ops/nn/conv/strips.py): 2-D, stride 1, one group; the kernel's column shifts of X
as strips, one product with W's kernel rows stacked (B in a column against a row of ones), the
kernel rows' partial sums added. Values against helpers.conv2d_direct (Conv's definition; a dilated
W is written out with its zeros there); small integers make every float32 sum exact, so those
results must match bit for bit."""
from __future__ import annotations

import threading

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import onnx_mini
from helpers import conv2d_direct
from onnx_mini.ops.nn import conv
from onnx_mini.ops.nn.conv import strips, thresholds

RNG = np.random.default_rng(2207)


def ints(shape, lo=-3, hi=3, dtype=np.float32):
    return RNG.integers(lo, hi + 1, size=shape).astype(dtype)


def direct(x, w, b=None, pads=(0, 0, 0, 0), dilations=(1, 1), dtype=np.float64):
    """conv2d_direct with W dilated: taps (i, j) at (i*dh, j*dw) of a kernel of zeros. pads: ONNX order
    (top, left, bottom, right)."""
    m, c, kh, kw = w.shape
    dh, dw = dilations
    wd = np.zeros((m, c, (kh - 1) * dh + 1, (kw - 1) * dw + 1), w.dtype)
    wd[:, :, ::dh, ::dw] = w
    return conv2d_direct(x, wd, b, pads=tuple(pads), dtype=dtype)


CASES = [  # (id, X shape, W shape, pads (top, left, bottom, right), dilations)
    ("3x3-same", (1, 5, 9, 11), (4, 5, 3, 3), (1, 1, 1, 1), (1, 1)),
    ("batch", (3, 4, 8, 7), (2, 4, 3, 3), (1, 1, 1, 1), (1, 1)),
    ("no-pads", (1, 4, 6, 9), (3, 4, 3, 3), (0, 0, 0, 0), (1, 1)),
    ("asymmetric-2x4", (1, 3, 7, 8), (2, 3, 2, 4), (0, 2, 3, 1), (1, 1)),
    ("pads-beyond-the-kernel", (1, 3, 7, 8), (2, 3, 3, 3), (5, 0, 0, 6), (1, 1)),
    ("dilated", (1, 3, 10, 9), (2, 3, 3, 2), (2, 1, 2, 1), (2, 3)),
    ("one-kernel-row", (1, 4, 6, 6), (3, 4, 1, 3), (0, 1, 0, 1), (1, 1)),
    ("one-kernel-column", (1, 4, 6, 6), (3, 4, 3, 1), (1, 0, 1, 0), (1, 1)),
    ("5x5", (1, 6, 12, 10), (5, 6, 5, 5), (2, 2, 2, 2), (1, 1)),
    ("one-output", (1, 4, 3, 3), (3, 4, 3, 3), (0, 0, 0, 0), (1, 1)),
    ("x-only-in-padding-rows", (1, 2, 2, 5), (2, 2, 3, 3), (4, 1, 0, 1), (1, 1)),
]


@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("constant", [True, False])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_strips_forced_is_conv(case, constant, with_bias):
    """Forced strips on every geometry above, W and B constants (made once) or fed: exact sums."""
    _, xs, ws, pads, dil = case
    x, w, b = ints(xs), ints(ws), ints((ws[0],)) if with_bias else None
    given = x.copy()
    convolution = conv.Convolution(pads=list(pads[:2]) + list(pads[2:]), dilations=list(dil), algorithm="strips",
                                   constants={1: w, 2: b} if constant else None)
    want = direct(x, w, b, pads, dil).astype(np.float32)
    for _ in range(2):          # the second call: the kept weights and geometry
        got = convolution(x, w, b)
        assert convolution.algorithms[x.shape] == "strips"
        assert got.dtype == np.float32 and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(x, given)


def test_strips_random_floats_and_other_types():
    """Random float32 within rounding of the float64 definition; float64 computes in float64;
    float16 computes in float32 and rounds once."""
    x = RNG.standard_normal((2, 8, 13, 12)).astype(np.float32)
    w = RNG.standard_normal((6, 8, 3, 3)).astype(np.float32)
    b = RNG.standard_normal(6).astype(np.float32)
    want = direct(x, w, b, (1, 1, 1, 1))
    c = conv.Convolution(pads=[1, 1, 1, 1], algorithm="strips", constants={1: w, 2: b})
    np.testing.assert_allclose(c(x, w, b), want, rtol=1e-5, atol=1e-5)
    x64, w64, b64 = x.astype(np.float64), w.astype(np.float64), b.astype(np.float64)
    y64 = conv.Convolution(pads=[1, 1, 1, 1], algorithm="strips")(x64, w64, b64)
    assert y64.dtype == np.float64
    np.testing.assert_allclose(y64, want, rtol=1e-12, atol=1e-12)
    x16, w16, b16 = x.astype(np.float16), w.astype(np.float16), b.astype(np.float16)
    y16 = conv.Convolution(pads=[1, 1, 1, 1], algorithm="strips", constants={1: w16, 2: b16})(x16, w16, b16)
    assert y16.dtype == np.float16
    want16 = direct(x16.astype(np.float32), w16.astype(np.float32), b16.astype(np.float32), (1, 1, 1, 1))
    np.testing.assert_allclose(y16.astype(np.float64), want16, rtol=2e-3, atol=2e-2)


def test_strips_non_finite_values_as_im2col():
    """An infinity in X: the sums it reaches are +-inf, or NaN where a zero tap multiplies it, exactly
    where im2col (which also multiplies what it reads as written) puts them."""
    x, w, b = ints((1, 3, 9, 9)), ints((2, 3, 3, 3)), ints((2,))
    w[0, 1, 0, 0] = 0
    x[0, 1, 4, 4] = np.inf
    with np.errstate(invalid="ignore"):
        got = conv.Convolution(pads=[1, 1, 1, 1], algorithm="strips")(x, w, b)
        ref = conv.Convolution(pads=[1, 1, 1, 1], algorithm="im2col")(x, w, b)
    np.testing.assert_array_equal(got, ref)
    assert np.isnan(got).any() and np.isinf(got).any()


def test_strips_weights_and_geometry_made_once(monkeypatch):
    made = []
    original = strips.weights
    monkeypatch.setattr(strips, "weights", lambda *a: made.append(1) or original(*a))
    x, w, b = ints((1, 4, 20, 20)), ints((2, 4, 3, 3)), ints((2,))
    c = conv.Convolution(pads=[1, 1, 1, 1], constants={1: w, 2: b})
    for _ in range(3):
        np.testing.assert_array_equal(c(x, w, b), direct(x, w, b, (1, 1, 1, 1)).astype(np.float32))
    assert c.algorithms[x.shape] == "strips" and len(made) == 1
    other = ints((2,))                  # another B at run time: its own weights, this call only
    np.testing.assert_array_equal(c(x, w, other), direct(x, w, other, (1, 1, 1, 1)).astype(np.float32))
    assert len(made) == 2


def test_strips_weights_layout():
    """Ws row di*M + m, column c*kw + dj is W[m, c, di, dj]; the last column B for kernel row 0 only."""
    w = np.arange(2 * 3 * 2 * 4, dtype=np.float32).reshape(2, 3, 2, 4)
    b = np.array([7, 9], np.float32)
    ws = strips.weights(w, b, np.float32)
    assert ws.shape == (4, 13)
    assert ws[1 * 2 + 1, 2 * 4 + 3] == w[1, 2, 1, 3] and ws[0, 4] == w[0, 1, 0, 0]
    np.testing.assert_array_equal(ws[:, -1], [7, 9, 0, 0])
    np.testing.assert_array_equal(strips.weights(w, None, np.float32)[:, -1], 0)


def select_2d(c, m, side, kernel=(3, 3), strides=(1, 1), group=1, **kw):
    out = [(side + 2 - k) // s + 1 for k, s in zip(kernel, strides)]
    return conv.select((1, c, side, side), (m, c // group, *kernel), np.float32, group=group, kernel=list(kernel),
                       strides=list(strides), dilations=[1, 1], begin=[1, 1], end=[1, 1], out=out, **kw)


def test_select_strips():
    """2-D stride 1, one group, M <= STRIPS_MAX_OUTPUT_SHARE (_SPLITTING in a run that splits its
    products) * kw * C and at least STRIPS_MIN_PIXELS outputs."""
    for c, m, side in ((32, 16, 128), (16, 16, 128), (64, 32, 64), (128, 64, 32), (128, 128, 16)):
        assert select_2d(c, m, side) == select_2d(c, m, side, splitting=True) == "strips"
    for c, m, side in ((32, 64, 32), (64, 128, 16)):    # M = 2/3 kw*C: strips only where the run does not split
        assert select_2d(c, m, side) == "strips"
        assert select_2d(c, m, side, splitting=True) == "im2col"
    assert select_2d(3, 16, 128) == "im2col"            # M against kw*C = 9: Z three times Y costs more
    assert select_2d(16, 48, 32) == "im2col"            # 48 > 2/3 * 48
    assert select_2d(16, 16, 14) == "im2col"            # 196 outputs: the fixed cost
    assert select_2d(16, 16, 64, strides=(2, 2)) == "im2col"
    assert select_2d(256, 256, 14) == "winograd"        # Winograd first where it applies
    assert select_2d(8, 8, 8, forced="strips") == "strips"
    assert select_2d(8, 8, 8, strides=(2, 2), forced="strips") == "im2col"     # cannot: the normal choice
    assert select_2d(8, 8, 8, group=2, forced="strips") == "im2col"
    one_d = conv.select((1, 32, 4000), (16, 32, 3), np.float32, group=1, kernel=[3], strides=[1], dilations=[1],
                        begin=[1], end=[1], out=[4000], forced="strips")
    assert one_d != "strips"


def test_model_conv_bn_relu_goes_strips():
    """A Conv + BatchNormalization + Relu model (fused by the optimiser) of a U-Net decoder's shape takes
    strips and gives the definition's values."""
    x, w, b = ints((1, 8, 24, 24)), ints((4, 8, 3, 3)), ints((4,))
    scale, shift = np.array([1, 2, 0.5, 1], np.float32), np.array([0, -1, 2, 3], np.float32)
    mean, var = np.array([1, 0, -1, 0], np.float32), np.ones(4, np.float32) - 1e-5
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "t", "mu", "v"], ["n"]),
             helper.make_node("Relu", ["n"], ["y"])]
    inits = [numpy_helper.from_array(a, k) for a, k in ((w, "w"), (b, "b"), (scale, "s"), (shift, "t"),
                                                         (mean, "mu"), (var, "v"))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)], ir_version=8)
    c = direct(x, w, b, (1, 1, 1, 1))
    want = np.maximum((c - mean[:, None, None]) / np.sqrt(var + 1e-5)[:, None, None] * scale[:, None, None]
                      + shift[:, None, None], 0)
    prepared = onnx_mini.prepare(model)
    np.testing.assert_allclose(prepared.run([x])[0], want, rtol=1e-5, atol=1e-5)
    assert thresholds.STRIPS_MIN_PIXELS <= 24 * 24
    report = onnx_mini.profile(prepared, [x], runs=1)
    assert [n.algorithm for n in report.nodes] == ["strips"]


@pytest.mark.parametrize("policy", ["split", "auto"])
def test_strips_in_runs_of_either_mode(monkeypatch, policy):
    """In a run that splits its products over the pool (its one product split by blas.matmul: the
    product is made large enough here) and in one that does not, the same exact values."""
    monkeypatch.setattr(onnx_mini.blas, "MIN_PART_MACS", 1000)
    x, w, b = ints((1, 8, 40, 36)), ints((4, 8, 3, 3)), ints((4,))
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    calls = []
    original = strips.conv
    monkeypatch.setattr(strips, "conv", lambda *a: calls.append(onnx_mini.blas.splitting()) or original(*a))
    monkeypatch.setattr(onnx_mini.blas, "POLICY", policy)
    y = onnx_mini.prepare(model, threads=2).run([x])[0]
    np.testing.assert_array_equal(y, direct(x, w, b, (1, 1, 1, 1)).astype(np.float32))
    assert len(calls) == 1
    if policy == "split" and onnx_mini.blas.managed():
        assert calls == [True]


def test_strips_with_a_fused_residual_and_relu_per_image():
    """Conv + Add(residual) + Relu fused by the optimiser, a batch of 2: each image by strips, its
    residual and Relu applied while it is in the caches; exact against the definition."""
    x, w, b, r = ints((2, 6, 20, 18)), ints((3, 6, 3, 3)), ints((3,)), ints((2, 3, 20, 18))
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "r"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x.shape),
                                           helper.make_tensor_value_info("r", onnx.TensorProto.FLOAT, r.shape)],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    prepared = onnx_mini.prepare(model)
    want = np.maximum(direct(x, w, b, (1, 1, 1, 1)) + r, 0).astype(np.float32)
    np.testing.assert_array_equal(prepared.run({"x": x, "r": r})[0], want)
    report = onnx_mini.profile(prepared, {"x": x, "r": r}, runs=1)
    assert [n.algorithm for n in report.nodes] == ["strips"]


def test_strips_reads_a_strided_view_of_x():
    """X given as a non-contiguous view (every other column of a wider array): the same exact sums."""
    wide, w = ints((1, 4, 18, 40)), ints((3, 4, 3, 3))
    x = wide[:, :, :, ::2]
    got = conv.Convolution(pads=[1, 2, 0, 1], algorithm="strips")(x, w)
    np.testing.assert_array_equal(got, direct(np.ascontiguousarray(x), w, None, (1, 2, 0, 1)).astype(np.float32))


@pytest.mark.parametrize("kept_max", [256 << 10, 0])
def test_strips_kept_per_thread(monkeypatch, kept_max):
    """Strips up to STRIPS_KEPT_MAX_BYTES are kept per thread, their zeros and ones written once: later
    calls copy X's values only, so an X full of large values must leave the padding zero for the next
    X; another thread gets its own. Above the size, each call fills a fresh buffer whole."""
    monkeypatch.setattr(thresholds, "STRIPS_KEPT_MAX_BYTES", kept_max)
    xs, ws, pads = (1, 3, 7, 8), (2, 3, 3, 3), (2, 1, 0, 2)
    out = (7 + 2 - 2, 8 + 1 + 2 - 2)
    g = strips.Strips(xs, np.dtype(np.float32), (3, 3), (1, 1), (2, 1), out)
    w = ints(ws)
    ws_ = strips.weights(w, None, np.float32)
    first = strips.conv(np.full(xs, 1e6, np.float32), ws_, g).copy()
    np.testing.assert_array_equal(first, direct(np.full(xs, 1e6, np.float32), w, None, pads).astype(np.float32))
    x = ints(xs)
    np.testing.assert_array_equal(strips.conv(x, ws_, g), direct(x, w, None, pads).astype(np.float32))
    s = g.strips(x)
    assert (g.strips(ints(xs)) is s) == (kept_max > 0)
    assert np.all(s[-1] == 1)
    seen = []
    thread = threading.Thread(target=lambda: seen.append((g.strips(x), strips.conv(x, ws_, g).copy())))
    thread.start()
    thread.join()
    assert seen[0][0] is not s
    np.testing.assert_array_equal(seen[0][1], direct(x, w, None, pads).astype(np.float32))
