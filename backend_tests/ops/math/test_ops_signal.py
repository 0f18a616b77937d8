"""Spec tests for DFT (17, 20), STFT, the Hann/Hamming/Blackman windows and MelWeightMatrix (17), every
type of each type constraint. References are the spec's formulas written out here (DFT sums as
matrices of exp(-2 pi j k n / N), windows as cosine sums, mel filters element by element), never numpy.fft.
"""
from __future__ import annotations

import math
import re

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto

from helpers import NODE, np_type, run_node, type_params
from onnx_mini.errors import InvalidNodeError, KernelError

TOL = {np.dtype(np.float64): 1e-10, np.dtype(np.float32): 1e-5, np.dtype(np.float16): 2e-3,
       np.dtype(ml_dtypes.bfloat16): 1.6e-2}


def close(got: np.ndarray, exp: np.ndarray, dtype) -> None:
    """Same dtype and shape; values within the type's precision, relative to the largest value."""
    dtype = np.dtype(dtype)
    assert got.dtype == dtype and got.shape == exp.shape, (got.dtype, got.shape, exp.shape)
    scale = max(float(np.abs(exp).max()) if exp.size else 1.0, 1.0)
    np.testing.assert_allclose(got.astype(np.float64), exp.astype(np.float64), rtol=0, atol=TOL[dtype] * scale * 4)


def scalar(value, dtype=np.int64) -> np.ndarray:
    return np.array(value, dtype=dtype)


# -- DFT reference ---------------------------------------------------------------------------------

def dft_ref(x: np.ndarray, axis: int, n: int, inverse: bool) -> np.ndarray:
    """y[k] = sum_n x[n] exp(-2 pi j k n / N) (inverse: exp(+...) / N) along axis, x zero-padded or
    truncated to N first. x is complex (no trailing pair dimension)."""
    m = x.shape[axis]
    x = np.moveaxis(x.astype(np.complex128), axis, -1)
    x = np.concatenate([x[..., :n], np.zeros(x.shape[:-1] + (max(n - m, 0),))], axis=-1)
    k = np.arange(n)
    w = np.exp((2j if inverse else -2j) * np.pi * np.outer(k, k) / n)
    y = x @ w.T / (n if inverse else 1)
    return np.moveaxis(y, -1, axis)


def irfft_ref(x: np.ndarray, axis: int, n: int) -> np.ndarray:
    """The real signal of a one-sided spectrum: X[k] for k <= n // 2 (padded/truncated), completed by
    conjugate symmetry X[n - k] = X[k]*, inverse DFT, real part."""
    x = np.moveaxis(x.astype(np.complex128), axis, -1)
    half = n // 2 + 1
    x = np.concatenate([x[..., :half], np.zeros(x.shape[:-1] + (max(half - x.shape[-1], 0),))], axis=-1)
    full = np.concatenate([x, np.conj(x[..., 1:n - half + 1][..., ::-1])], axis=-1)
    return np.moveaxis(dft_ref(full, -1, n, True).real, -1, axis)


def pairs(y: np.ndarray) -> np.ndarray:
    return np.stack([y.real, y.imag], axis=-1)


def signal(shape, dtype, is_complex: bool) -> np.ndarray:
    """Exact small values of the type with a trailing 1 (real) or 2 (complex)."""
    i = np.arange(math.prod(shape) * (2 if is_complex else 1))
    v = ((i * 7 % 11) - 5) * 0.25
    return v.reshape(*shape, 2 if is_complex else 1).astype(dtype)


def as_complex(x: np.ndarray) -> np.ndarray:
    f = x.astype(np.float64)
    return f[..., 0] + 1j * f[..., 1] if x.shape[-1] == 2 else f[..., 0]


def run_dft(version, x, axis=None, dft_length=None, **attrs):
    """DFT with the axis as attribute (17) or input (20); dft_length an int64 scalar when given."""
    length = None if dft_length is None else scalar(dft_length)
    if version == 17:
        return run_node("DFT", 17, [x] + ([length] if length is not None else []),
                        **attrs, **({} if axis is None else {"axis": axis}))
    inputs = [x, length] + ([] if axis is None else [scalar(axis)])
    while inputs[-1] is None:
        inputs.pop()
    return run_node("DFT", 20, inputs, **attrs)


@pytest.mark.parametrize("version,tname", type_params("DFT", [17, 20], "T1"))
@pytest.mark.parametrize("is_complex", [False, True], ids=["real", "complex"])
def test_dft_every_type(version, tname, is_complex):
    dt = np_type(tname)
    x = signal((2, 8), dt, is_complex)
    got = run_dft(version, x, axis=1)
    close(got, pairs(dft_ref(as_complex(x), 1, 8, False)), dt)
    got = run_dft(version, x, axis=1, inverse=1)
    close(got, pairs(dft_ref(as_complex(x), 1, 8, True)), dt)


@pytest.mark.parametrize("version", [17, 20])
@pytest.mark.parametrize("axis", [0, 1, 2, -2, -3, -4])
@pytest.mark.parametrize("is_complex", [False, True], ids=["real", "complex"])
def test_dft_axes(version, axis, is_complex):
    x = signal((2, 3, 5), np.float64, is_complex)   # rank 4 with the pair dimension
    got = run_dft(version, x, axis=axis)
    close(got, pairs(dft_ref(as_complex(x), axis % 4, x.shape[axis % 4], False)), np.float64)


@pytest.mark.parametrize("version", [17, 20])
def test_dft_default_axis(version):
    x = signal((2, 3, 5), np.float32, True)
    default = 1 if version == 17 else 2   # 17: axis=1; 20: axis=-2, the last signal axis
    close(run_dft(version, x), pairs(dft_ref(as_complex(x), default, x.shape[default], False)), np.float32)


@pytest.mark.parametrize("version", [17, 20])
@pytest.mark.parametrize("length", [3, 8, 12, 1])
@pytest.mark.parametrize("inverse", [0, 1])
def test_dft_length_pads_or_truncates(version, length, inverse):
    x = signal((2, 8), np.float64, True)
    got = run_dft(version, x, axis=1, dft_length=length, inverse=inverse)
    close(got, pairs(dft_ref(as_complex(x), 1, length, bool(inverse))), np.float64)
    got = run_node("DFT", version, [x, scalar(length, np.int32)] + ([scalar(1, np.int32)] if version == 20 else []),
                   **({"axis": 1} if version == 17 else {}), inverse=inverse)  # T2 = int32
    close(got, pairs(dft_ref(as_complex(x), 1, length, bool(inverse))), np.float64)


@pytest.mark.parametrize("version", [17, 20])
@pytest.mark.parametrize("n,length", [(8, None), (7, None), (8, 6), (8, 11)])
def test_dft_onesided_forward(version, n, length):
    x = signal((3, n), np.float32, False)
    got = run_dft(version, x, axis=1, dft_length=length, onesided=1)
    full_n = length or n
    exp = dft_ref(as_complex(x), 1, full_n, False)[:, :full_n // 2 + 1]
    close(got, pairs(exp), np.float32)


@pytest.mark.parametrize("version", [17, 20])
@pytest.mark.parametrize("bins,length", [(5, None), (5, 9), (5, 6), (4, 12)])
def test_dft_onesided_inverse(version, bins, length):
    x = signal((2, bins), np.float64, True)
    got = run_dft(version, x, axis=1, dft_length=length, onesided=1, inverse=1)
    n = length or 2 * (bins - 1)
    close(got, irfft_ref(as_complex(x), 1, n)[..., None], np.float64)


@pytest.mark.parametrize("version", [17, 20])
def test_dft_strided_input(version):
    x = signal((4, 10), np.float32, True)[::2, 1::2]   # not contiguous: no complex view of it
    close(run_dft(version, x, axis=1), pairs(dft_ref(as_complex(x), 1, 5, False)), np.float32)


def test_dft_round_trip_hand_example():
    # the DFT of [1, 0, 0, 0] is [1, 1, 1, 1]; of [1, 1, 1, 1] it is [4, 0, 0, 0]
    x = np.array([[[1.0], [0.0], [0.0], [0.0]], [[1.0], [1.0], [1.0], [1.0]]], dtype=np.float32)
    got = run_dft(20, x, axis=1)
    exp = np.zeros((2, 4, 2), np.float32)
    exp[0, :, 0] = 1
    exp[1, 0, 0] = 4
    close(got, exp, np.float32)


@pytest.mark.parametrize("version", [17, 20])
def test_dft_errors(version):
    x = signal((2, 4), np.float32, True)
    for axis in (2, -1, 3, -4):  # the pair dimension, or out of range
        with pytest.raises(KernelError, match=NODE):
            run_dft(version, x, axis=axis)
    with pytest.raises(KernelError, match=re.compile(f"{NODE}.*real", re.S)):
        run_dft(version, x, axis=1, onesided=1)
    with pytest.raises(KernelError, match=re.compile(f"{NODE}.*complex", re.S)):
        run_dft(version, signal((2, 4), np.float32, False), axis=1, onesided=1, inverse=1)
    with pytest.raises(KernelError, match=re.compile(f"{NODE}.*dimension of 1", re.S)):
        run_dft(version, np.zeros((2, 4, 3), np.float32), axis=1)
    with pytest.raises(KernelError, match=re.compile(f"{NODE}.*positive", re.S)):
        run_dft(version, x, axis=1, dft_length=0)
    with pytest.raises(KernelError, match=re.compile(f"{NODE}.*empty", re.S)):
        run_dft(version, np.zeros((2, 0, 2), np.float32), axis=1)


# -- STFT ------------------------------------------------------------------------------------------

def stft_ref(x: np.ndarray, step: int, length: int, window, onesided: bool) -> np.ndarray:
    """Frame t is x[:, t * step : t * step + length] times the window; its DFT, one-sided or not."""
    frames = (x.shape[1] - length) // step + 1
    w = np.ones(length) if window is None else window.astype(np.float64)
    out = []
    for t in range(frames):
        spec = dft_ref(x[:, t * step:t * step + length] * w, 1, length, False)
        out.append(spec[:, :length // 2 + 1] if onesided else spec)
    return pairs(np.stack(out, axis=1))


@pytest.mark.parametrize("tname", [p.values[1] for p in type_params("STFT", [17], "T1")])
@pytest.mark.parametrize("onesided", [1, 0])
def test_stft_every_type(tname, onesided):
    dt = np_type(tname)
    x = signal((2, 20), dt, False)
    window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(8) / 8)).astype(dt)
    got = run_node("STFT", 17, [x, scalar(4), window], onesided=onesided)
    close(got, stft_ref(as_complex(x), 4, 8, window, bool(onesided)), dt)


@pytest.mark.parametrize("len_type", [np.int32, np.int64])
def test_stft_frame_length_forms(len_type):
    x = signal((1, 17), np.float64, False)
    cx = as_complex(x)
    # frame_length alone: a rectangular window
    got = run_node("STFT", 17, [x, scalar(3, len_type), None, scalar(6, len_type)])
    close(got, stft_ref(cx, 3, 6, None, True), np.float64)
    # both window and frame_length
    window = np.linspace(0.5, 1, 6)
    got = run_node("STFT", 17, [x, scalar(3, len_type), window, scalar(6, len_type)], onesided=0)
    close(got, stft_ref(cx, 3, 6, window, False), np.float64)
    # neither: one frame of the whole signal
    got = run_node("STFT", 17, [x, scalar(5, len_type)])
    close(got, stft_ref(cx, 5, 17, None, True), np.float64)


def test_stft_complex_signal():
    x = signal((2, 12), np.float32, True)
    got = run_node("STFT", 17, [x, scalar(2), None, scalar(4)], onesided=0)
    close(got, stft_ref(as_complex(x), 2, 4, None, False), np.float32)
    with pytest.raises(KernelError, match=re.compile(f"{NODE}.*real", re.S)):
        run_node("STFT", 17, [x, scalar(2), None, scalar(4)])


def test_stft_errors():
    x = signal((1, 10), np.float32, False)
    with pytest.raises(KernelError, match=re.compile(f"{NODE}.*frame_length", re.S)):
        run_node("STFT", 17, [x, scalar(2), np.ones(4, np.float32), scalar(5)])
    with pytest.raises(KernelError, match=re.compile(f"{NODE}.*does not fit", re.S)):
        run_node("STFT", 17, [x, scalar(2), None, scalar(11)])
    with pytest.raises(KernelError, match=re.compile(f"{NODE}.*positive", re.S)):
        run_node("STFT", 17, [x, scalar(0), None, scalar(4)])
    with pytest.raises(KernelError, match=re.compile(f"{NODE}.*rank 3", re.S)):
        run_node("STFT", 17, [np.zeros((10, 1), np.float32), scalar(2)])


# -- windows ---------------------------------------------------------------------------------------

WINDOWS = {  # op: (a0, a1, a2) of w[n] = a0 - a1 cos(2 pi n / N) + a2 cos(4 pi n / N)
    "HannWindow": (0.5, 0.5, 0.0), "HammingWindow": (25 / 46, 21 / 46, 0.0), "BlackmanWindow": (0.42, 0.5, 0.08),
}


def window_ref(op: str, size: int, periodic: bool) -> np.ndarray:
    a0, a1, a2 = WINDOWS[op]
    n = np.arange(size, dtype=np.float64)
    big_n = size if periodic else size - 1
    if big_n == 0:
        return np.ones(size)   # a symmetric window of size 1: [1] (numpy, scipy and torch agree)
    return a0 - a1 * np.cos(2 * np.pi * n / big_n) + a2 * np.cos(4 * np.pi * n / big_n)


WINDOW_MATRIX = [pytest.param(op, p.values[1], id=f"{op}-{p.values[1]}") for op in WINDOWS
                 for p in type_params(op, [17], "T2")]


@pytest.mark.parametrize("op,tname", WINDOW_MATRIX)
@pytest.mark.parametrize("periodic", [1, 0])
def test_window_every_output_type(op, tname, periodic):
    dt = np_type(tname)
    got = run_node(op, 17, [scalar(9, np.int32)], periodic=periodic,
                   output_datatype=getattr(TensorProto, tname.upper()))
    exp = window_ref(op, 9, bool(periodic))
    if dt.kind in "iu":   # converted like a cast: truncated toward zero
        np.testing.assert_array_equal(got, np.trunc(exp).astype(dt))
        assert got.dtype == dt
    else:
        close(got, exp, dt)


@pytest.mark.parametrize("op", list(WINDOWS))
@pytest.mark.parametrize("size", [0, 1, 2, 10, 33])
@pytest.mark.parametrize("size_type", [np.int32, np.int64])
def test_window_sizes_and_defaults(op, size, size_type):
    got = run_node(op, 17, [scalar(size, size_type)])   # periodic=1, float output by default
    close(got, window_ref(op, size, True), np.float32)
    close(run_node(op, 17, [scalar(size, size_type)], periodic=0), window_ref(op, size, False), np.float32)


def test_window_hand_values():
    close(run_node("HannWindow", 17, [scalar(4)]), np.array([0, 0.5, 1, 0.5]), np.float32)
    close(run_node("HannWindow", 17, [scalar(5)], periodic=0), np.array([0, 0.5, 1, 0.5, 0]), np.float32)
    close(run_node("HammingWindow", 17, [scalar(2)]), np.array([4 / 46, 1]), np.float32)
    close(run_node("BlackmanWindow", 17, [scalar(3)], periodic=0), np.array([0, 1, 0]), np.float32)
    close(run_node("HannWindow", 17, [scalar(1)]), np.array([0.0]), np.float32)          # N = 1, n = 0
    close(run_node("HannWindow", 17, [scalar(1)], periodic=0), np.array([1.0]), np.float32)


@pytest.mark.parametrize("op", list(WINDOWS))
def test_window_errors(op):
    with pytest.raises(KernelError, match=re.compile(f"{NODE}.*>= 0", re.S)):
        run_node(op, 17, [scalar(-1)])
    with pytest.raises(InvalidNodeError, match=re.compile(f"{NODE}.*output_datatype", re.S)):
        run_node(op, 17, [scalar(4)], output_datatype=TensorProto.STRING)


# -- MelWeightMatrix -------------------------------------------------------------------------------

def mel_ref(num_mel_bins, dft_length, sample_rate, lower, upper) -> np.ndarray:
    """mel(f) = 2595 log10(1 + f / 700); num_mel_bins + 2 edges from mel(lower) in steps of
    (mel(upper) - mel(lower)) / (num_mel_bins + 2), back to hertz, to bin floor((dft_length + 1) f / rate);
    band i is a triangle of peak 1 rising from edge i to edge i + 1 and falling to edge i + 2."""
    mel = lambda f: 2595 * math.log10(1 + f / 700)  # noqa: E731
    hertz = lambda m: 700 * (10 ** (m / 2595) - 1)  # noqa: E731
    step = (mel(upper) - mel(lower)) / (num_mel_bins + 2)
    edges = [math.floor((dft_length + 1) * hertz(i * step + mel(lower)) / sample_rate)
             for i in range(num_mel_bins + 2)]
    out = np.zeros((dft_length // 2 + 1, num_mel_bins))
    for i in range(num_mel_bins):
        left, center, right = edges[i:i + 3]
        if center == left:
            out[center, i] = 1
        for j in range(left, center + 1) if center > left else ():
            out[j, i] = (j - left) / (center - left)
        for j in range(center, right):
            out[j, i] = (right - j) / (right - center)
    return out


def test_mel_weight_matrix_official_example():
    # the expected matrix printed in onnx's test for (8, 16, 8192, 0, 4096)
    got = run_node("MelWeightMatrix", 17, [scalar(8, np.int32), scalar(16, np.int32), scalar(8192, np.int32),
                                           scalar(0, np.float32), scalar(4096, np.float32)])
    exp = np.zeros((9, 8), np.float32)
    for j, i in [(0, 0), (0, 1), (1, 2), (1, 3), (2, 4), (3, 5), (4, 6), (5, 7)]:
        exp[j, i] = 1
    np.testing.assert_array_equal(got, exp)
    assert got.dtype == np.float32


MEL_CASES = [(5, 32, 16000, 100.0, 6000.0), (10, 512, 16000, 0.0, 8000.0), (3, 64, 8000, 300.0, 3500.0),
             (20, 1024, 22050, 20.0, 11025.0)]


@pytest.mark.parametrize("case", MEL_CASES)
@pytest.mark.parametrize("int_type", [np.int32, np.int64])
@pytest.mark.parametrize("float_type", [np.float32, np.float64, np.float16, ml_dtypes.bfloat16])
def test_mel_weight_matrix_formula(case, int_type, float_type):
    bins, length, rate, lower, upper = case
    lower_t, upper_t = scalar(lower, float_type), scalar(upper, float_type)
    got = run_node("MelWeightMatrix", 17, [scalar(bins, int_type), scalar(length, int_type),
                                           scalar(rate, int_type), lower_t, upper_t])
    exp = mel_ref(bins, length, rate, float(lower_t.astype(np.float64)), float(upper_t.astype(np.float64)))
    close(got, exp, np.float32)


@pytest.mark.parametrize("tname", [p.values[1] for p in type_params("MelWeightMatrix", [17], "T3")])
def test_mel_weight_matrix_every_output_type(tname):
    dt = np_type(tname)
    got = run_node("MelWeightMatrix", 17, [scalar(6), scalar(64), scalar(16000), scalar(0.0, np.float32),
                                           scalar(8000.0, np.float32)],
                   output_datatype=getattr(TensorProto, tname.upper()))
    exp = mel_ref(6, 64, 16000, 0.0, 8000.0)
    if dt.kind in "iu":
        np.testing.assert_array_equal(got, np.trunc(exp).astype(dt))
        assert got.dtype == dt
    else:
        close(got, exp, dt)


def test_mel_weight_matrix_errors():
    args = [scalar(4), scalar(32), scalar(8000), scalar(0.0, np.float32), scalar(4000.0, np.float32)]
    for k, bad in ((0, scalar(0)), (1, scalar(-2)), (2, scalar(0)), (3, scalar(5000.0, np.float32))):
        wrong = list(args)
        wrong[k] = bad
        with pytest.raises(KernelError, match=NODE):
            run_node("MelWeightMatrix", 17, wrong)
    with pytest.raises(InvalidNodeError, match=re.compile(f"{NODE}.*output_datatype", re.S)):
        run_node("MelWeightMatrix", 17, args, output_datatype=TensorProto.BOOL)
