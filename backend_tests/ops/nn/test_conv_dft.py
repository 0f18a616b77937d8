"""A Conv whose constant W is a windowed real DFT basis (an STFT as a Conv1d) computed by the real FFT
(onnx_mini/ops/nn/conv/dft.py): which weights are recognised as such a basis, and the results against
the exact sum over the given float32 weights (float64 frames times float64 weights), within the bound
the module states: 2^-22 * sum |x * w| for the basis, plus the float32 rounding of the result."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_mini
from onnx_mini.ops.nn import conv
from onnx_mini.ops.nn.conv import dft, thresholds

RNG = np.random.default_rng(77)


def hann(n: int) -> np.ndarray:
    return 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n) / n)


def stft_weights(n: int, bins: int | None = None, window=None, order=("cos", "-sin"), dtype=np.float32):
    """Rows of window * cos / +-sin(2 pi k n / N), k < bins, one block per entry of order, written
    from the definition in float64 and rounded once (as silero-vad and torchlibrosa store them)."""
    bins = n // 2 + 1 if bins is None else bins
    win = hann(n) if window is None else window
    angle = 2 * np.pi * np.arange(bins)[:, None] * np.arange(n) / n
    parts = {"cos": np.cos(angle), "sin": np.sin(angle), "-sin": -np.sin(angle), "-cos": -np.cos(angle)}
    return np.concatenate([win * parts[p] for p in order])[:, None, :].astype(dtype)


def direct(x, w, stride, pads=(0, 0), b=None):
    """(the exact sum over the given weights in float64, sum |x w|): frames of the zero-padded x."""
    n = w.shape[2]
    xp = np.pad(x[:, 0].astype(np.float64), ((0, 0), pads))
    t = (xp.shape[1] - n) // stride + 1
    frames = np.stack([xp[:, i * stride:i * stride + n] for i in range(t)], axis=1)    # [B, T, N]
    w64 = w[:, 0].astype(np.float64)
    y = np.einsum("btn,mn->bmt", frames, w64)
    if b is not None:
        y += b.astype(np.float64)[:, None]
    return y, np.einsum("btn,mn->bmt", np.abs(frames), np.abs(w64))


def bound_of(x, w, stride, pads=(0, 0), b=None):
    """(the exact sum, the module's bound on the distance to it: 2^-22 * sum |x w| + 2^-40 max |W|
    sum |x|, plus the result's rounding to float32)."""
    ref, mag = direct(x, w, stride, pads, b)
    size = direct(x, np.ones_like(w[:1]), stride, pads)[1]           # sum |x| over each frame
    bound = 2.0 ** -22 * mag + 2.0 ** -40 * float(np.abs(w).max()) * size + 2.0 ** -24 * np.abs(ref)
    return ref, bound + (0 if b is None else 2.0 ** -24 * np.abs(b.astype(np.float64))[:, None])


def assert_within_bound(y, x, w, stride, pads=(0, 0), b=None):
    ref, bound = bound_of(x, w, stride, pads, b)
    assert y.dtype == np.float32 and y.shape == ref.shape
    err = np.abs(y.astype(np.float64) - ref)
    assert (err <= bound).all(), float((err / np.maximum(bound, 1e-300)).max())


# -- recognising the basis -------------------------------------------------------------------------

@pytest.mark.parametrize("n,bins,order,window_sign,blocks,zero_rows", [
    (512, None, ("cos", "-sin"), 1, ((0, 257, 0, 1.0), (257, 257, 1, 1.0)), (257, 513)),   # silero, our wakeword
    (256, None, ("cos", "sin"), 1, ((0, 129, 0, 1.0), (129, 129, 1, -1.0)), (129, 257)),   # nnAudio's +sin
    (400, None, ("-sin", "cos"), 1, ((0, 201, 1, 1.0), (201, 201, 0, 1.0)), (0, 200)),     # sine block first
    (512, None, ("cos",), 1, ((0, 257, 0, 1.0),), ()),                  # torchlibrosa's conv_real alone
    (512, None, ("-sin",), -1, ((0, 257, 1, -1.0),), (0, 256)),         # ... its conv_imag alone (the window
                                                                        # from the sines: its sign absorbs theirs)
    (512, 100, ("-cos", "-sin"), -1, ((0, 100, 0, 1.0), (100, 100, 1, -1.0)), (100,)),     # fewer bins
    (401, None, ("cos", "-sin"), 1, ((0, 201, 0, 1.0), (201, 201, 1, 1.0)), (201,)),        # odd N: no N/2
])
def test_basis_recognised_with_its_blocks(n, bins, order, window_sign, blocks, zero_rows):
    w = stft_weights(n, bins, order=order)
    b = dft.basis(w)
    assert b is not None and b.blocks == blocks and b.zero_rows == zero_rows
    assert np.array_equal(b.zero_weights, w[list(zero_rows), 0].T.astype(np.float64))
    # the window read off W: the cosine block's first row as stored, or the sines' least squares
    # (0 where every sine of the block is 0: n = 0 and N/2, never read)
    want = window_sign * hann(n)
    if "cos" not in order and "-cos" not in order:
        want[[0, n // 2]] = 0
    assert np.allclose(b.window, want, rtol=0, atol=1e-7)


def test_basis_from_an_fft_of_the_identity_rectangular_window():
    """silero-vad's way: the rows of np.fft.fft(eye(N)) (computed, not written) stacked re / im."""
    n = 256
    f = np.fft.fft(np.eye(n))[: n // 2 + 1]
    w = np.concatenate([f.real, f.imag])[:, None, :].astype(np.float32)
    b = dft.basis(w)
    assert b is not None and b.blocks == ((0, 129, 0, 1.0), (129, 129, 1, 1.0))
    assert (b.window == 1).all()


def test_not_a_basis():
    w = stft_weights(512)
    assert dft.basis(RNG.standard_normal((514, 1, 512)).astype(np.float32)) is None
    at = (300, 0, int(np.abs(w[300, 0]).argmax()))
    off = w.copy()
    off[at] *= np.float32(1 + 2 ** -19)
    assert dft.basis(off) is None                        # one weight ~8 ulps off
    near = w.copy()
    near[at] = np.nextafter(near[at], np.float32(9))
    assert dft.basis(near) is not None                   # one ulp off: still within the bound
    assert dft.basis(w.astype(np.float64)) is None       # float32 only
    assert dft.basis(np.concatenate([w[:, :, :], w[:, :, :]], axis=1)) is None      # two input channels
    assert dft.basis(stft_weights(512, order=("cos", "cos"))) is None               # one spectrum only
    other = stft_weights(512, window=np.hamming(512), order=("-sin",))
    assert dft.basis(np.concatenate([stft_weights(512, order=("cos",)), other])) is None   # two windows
    # the angles in float32 (2 pi k n / N up to ~1600 rad: errors ~1e-4): not the basis
    k, t = np.arange(257, dtype=np.float32)[:, None], np.arange(512, dtype=np.float32)
    angle32 = np.float32(2 * np.pi) * k * t / np.float32(512)
    w32 = np.concatenate([np.cos(angle32), -np.sin(angle32)])[:, None, :].astype(np.float32)
    assert dft.basis(w32) is None
    assert dft.basis(np.zeros((514, 1, 512), np.float32)) is None
    inf = w.copy()
    inf[0, 0, 3] = np.inf
    assert dft.basis(inf) is None


# -- the computation -------------------------------------------------------------------------------

@pytest.mark.parametrize("n,stride,batch,frames,pads,order", [
    (512, 160, 1, 97, (0, 0), ("cos", "-sin")),
    (400, 160, 2, 40, (200, 200), ("cos", "-sin")),
    (512, 128, 1, 30, (0, 0), ("-sin",)),
    (512, 256, 3, 12, (256, 3), ("cos", "sin")),
    (1024, 320, 1, 300, (0, 0), ("cos", "-sin")),     # several frame blocks (thresholds.DFT_BLOCK_BYTES)
])
def test_dft_conv_against_the_exact_sum(n, stride, batch, frames, pads, order):
    w = stft_weights(n, order=order)
    size = (frames - 1) * stride + n - sum(pads)
    x = (RNG.standard_normal((batch, 1, size)) * [[[0.1]], [[3.0]], [[1e-3]]][:batch]).astype(np.float32)
    y = dft.conv(x, dft.basis(w), stride, pads[0], pads[1], frames)
    assert_within_bound(y, x, w, stride, pads)


def test_zero_rows_with_a_weight_on_a_zero_of_the_window():
    """The sine rows of k = 0 and N/2 (all 0 in the basis) are summed from the windowed frames by their
    weights over the window; a weight where the window is 0 (Hann's first tap) cannot be: those rows are
    then summed from the frames themselves. Both within the bound."""
    w = stft_weights(512)
    x = RNG.standard_normal((1, 1, 160 * 20 + 512)).astype(np.float32)
    plain = dft.basis(w)
    assert plain.windowed_zero_weights is not None
    assert_within_bound(dft.conv(x, plain, 160, 0, 0, 21), x, w, 160)
    odd = w.copy()
    odd[513, 0, 0] = 1e-17                  # the N/2 sine row, at the window's zero
    b = dft.basis(odd)
    assert b is not None and b.zero_rows == (257, 513) and b.windowed_zero_weights is None
    assert_within_bound(dft.conv(x, b, 160, 0, 0, 21), x, odd, 160)


def test_dft_conv_in_blocks_of_frames(monkeypatch):
    """Blocks of 3 frames (a block size that does not divide the frames) give the same values as one block."""
    w = stft_weights(512)
    x = RNG.standard_normal((2, 1, 160 * 10 + 512)).astype(np.float32)
    whole = dft.conv(x, dft.basis(w), 160, 0, 0, 11)
    monkeypatch.setattr(thresholds, "DFT_BLOCK_BYTES", 3 * 8 * 512)
    assert np.array_equal(dft.conv(x, dft.basis(w), 160, 0, 0, 11), whole)


def conv_model(w, s, stride, pads=(0, 0), b=None, fed_w=False, relu=False):
    inputs = ["x", "w"] + (["b"] if b is not None else [])
    nodes = [helper.make_node("Conv", inputs, ["c" if relu else "y"], kernel_shape=[w.shape[2]], strides=[stride],
                              pads=list(pads))]
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    inits = [] if fed_w else [numpy_helper.from_array(w, "w")]
    if b is not None:
        inits.append(numpy_helper.from_array(b, "b"))
    graph_inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 1, s])]
    if fed_w:
        graph_inputs.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, list(w.shape)))
    g = helper.make_graph(nodes, "stft", graph_inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def conv_algorithms(prepared):
    """{input shape: algorithm} of the model's one Conv (the profiler's source)."""
    infos = [i for i in prepared.plan.infos if i.op_type == "Conv"]
    assert len(infos) == 1
    return infos[0].kernel.algorithms


def test_a_model_takes_the_fft_with_bias_and_relu_fused():
    w = stft_weights(512)
    b = RNG.standard_normal(514).astype(np.float32)
    x = RNG.standard_normal((1, 1, 160 * 96 + 512 - 20)).astype(np.float32)
    prepared = onnx_mini.prepare(conv_model(w, x.shape[2], 160, (10, 10), b, relu=True))
    y = prepared.run({"x": x})[0]
    assert list(conv_algorithms(prepared).values()) == ["dft"]
    ref, bound = bound_of(x, w, 160, (10, 10), b)
    assert (np.abs(y - np.maximum(ref, 0)) <= bound).all()
    assert (y >= 0).all()


@pytest.mark.filterwarnings("ignore:invalid value encountered in matmul")   # inf * 0 in the direct sum
def test_fed_weights_small_inputs_and_infinities_take_the_direct_sum():
    w = stft_weights(512)
    x = RNG.standard_normal((1, 1, 160 * 96 + 512)).astype(np.float32)
    fed = onnx_mini.prepare(conv_model(w, x.shape[2], 160, fed_w=True))
    fed.run({"x": x, "w": w})
    assert list(conv_algorithms(fed).values()) == ["im2col"]        # W fed: never looked at as a basis
    short = x[:, :, :160 * 3 + 512]                                  # 4 frames: under DFT_MIN_MACS
    small = onnx_mini.prepare(conv_model(w, short.shape[2], 160))
    small.run({"x": short})
    assert list(conv_algorithms(small).values()) == ["im2col"]
    bad = x.copy()
    bad[0, 0, 1000] = np.inf
    prepared = onnx_mini.prepare(conv_model(w, x.shape[2], 160))
    y = prepared.run({"x": bad})[0]
    assert list(conv_algorithms(prepared).values()) == ["im2col"]   # the FFT would spread NaN over the frame
    frame = [t for t in range(97) if t * 160 <= 1000 < t * 160 + 512]
    assert np.isinf(y[0, 1, frame]).all()                           # cos rows 1: inf * w, w != 0
    assert np.isfinite(np.delete(y[0], frame, axis=1)).all()


def test_select_takes_dft_only_where_it_applies():
    geo = dict(group=1, kernel=[512], strides=[160], dilations=[1], begin=[0], end=[0], out=[97])
    assert conv.select((1, 1, 15872), (514, 1, 512), np.float32, dft=True, **geo) == "dft"
    assert conv.select((1, 1, 15872), (514, 1, 512), np.float32, **geo) != "dft"        # not a known basis
    assert conv.select((1, 1, 15872), (514, 1, 512), np.float32, dft=True, finite=False, **geo) != "dft"
    assert conv.select((1, 1, 15872), (514, 1, 512), np.float32, dft=True, exact=True, **geo) != "dft"
    assert conv.select((1, 1, 15872), (514, 1, 512), np.float64, dft=True, **geo) != "dft"
    few = dict(geo, out=[4])                                          # 1M multiply-adds: the direct sum
    assert conv.select((1, 1, 992), (514, 1, 512), np.float32, dft=True, **few) != "dft"
    assert conv.select((1, 1, 992), (514, 1, 512), np.float32, dft=True, forced="dft", **few) == "dft"
    short = dict(geo, kernel=[256], strides=[128], out=[200])         # 256 taps: the direct sum
    assert conv.select((1, 1, 25728), (258, 1, 256), np.float32, dft=True, **short) != "dft"
    dilated = dict(geo, dilations=[2], out=[94])
    assert conv.select((1, 1, 15872), (514, 1, 512), np.float32, dft=True, forced="dft", **dilated) != "dft"
