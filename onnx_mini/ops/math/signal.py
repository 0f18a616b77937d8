"""Signal processing: DFT (17, 20), STFT (17), BlackmanWindow, HammingWindow, HannWindow, MelWeightMatrix (17).

Complex tensors are real tensors with a trailing dimension of 2 (real, imaginary); a trailing 1 means
a real signal. numpy.fft does the transforms (float32 stays float32; float16/bfloat16 go through
float32 and are rounded back once).
"""
from __future__ import annotations

import numpy as np

from ...errors import InvalidValueError
from ...registry import kernel
from .._common import UPCAST, dtype_attribute, float_to, normalize_axis

# -- complex <-> trailing pair -----------------------------------------------------------------------


def _compute_type(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.float32) if dtype in UPCAST else dtype


_COMPLEX = {np.dtype(np.float32): np.dtype(np.complex64), np.dtype(np.float64): np.dtype(np.complex128)}


def to_complex(x: np.ndarray, what: str = "input") -> tuple[np.ndarray, bool]:
    """(values, is_complex) of a [..., 1] (real) or [..., 2] (complex) tensor; real values stay real.
    A contiguous float32/float64 pair tensor is viewed as complex without a copy."""
    if x.ndim < 1 or x.shape[-1] not in (1, 2):
        raise InvalidValueError(f"{what} must end with a dimension of 1 (real) or 2 (complex), "
                                f"got shape {list(x.shape)}")
    x = x.astype(_compute_type(x.dtype), copy=False)
    if x.shape[-1] == 1:
        return x[..., 0], False
    if x.flags.c_contiguous and x.size:
        return x.view(_COMPLEX[x.dtype])[..., 0], True
    return x[..., 0] + 1j * x[..., 1], True


def from_complex(y: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A complex result as [..., 2] of `dtype` (a real result as [..., 1])."""
    if not np.iscomplexobj(y):
        return y[..., None].astype(dtype, copy=False)
    if y.size:
        y = np.ascontiguousarray(y)
        return y.view(y.real.dtype).reshape(*y.shape, 2).astype(dtype, copy=False)
    return np.zeros((*y.shape, 2), dtype=dtype)


def _positive_scalar(x: np.ndarray, name: str) -> int:
    if x.size != 1 or x.ndim > 1:
        raise InvalidValueError(f"{name} must be a scalar, got shape {list(x.shape)}")
    if x.dtype.kind not in "iu":
        raise InvalidValueError(f"{name} must be an integer, got {x.dtype}")
    value = int(x.reshape(()))
    if value <= 0:
        raise InvalidValueError(f"{name} must be positive, got {value}")
    return value


# -- DFT -------------------------------------------------------------------------------------------


def dft(data: np.ndarray, axis: int, length: int | None, inverse: bool, onesided: bool) -> np.ndarray:
    """The DFT of `data` along `axis` (of the full rank, the trailing pair dimension excluded)."""
    r = data.ndim
    ax = normalize_axis(axis, r)
    if ax == r - 1:
        raise InvalidValueError(f"axis {axis} is the trailing real/imaginary dimension (rank {r})")
    x, is_complex = to_complex(data)
    if x.shape[ax] == 0:
        raise InvalidValueError(f"the signal axis {axis} is empty (shape {list(data.shape)})")
    if onesided and not inverse:        # RFFT: real -> one-sided complex
        if is_complex:
            raise InvalidValueError("onesided=1 with inverse=0 (RFFT) needs a real input (trailing dim 1)")
        y = np.fft.rfft(x, n=length, axis=ax)
    elif onesided:                      # IRFFT: one-sided complex -> real
        if not is_complex:
            raise InvalidValueError("onesided=1 with inverse=1 (IRFFT) needs a complex input (trailing dim 2)")
        n = length if length is not None else 2 * (x.shape[ax] - 1)
        if n <= 0:
            raise InvalidValueError(f"IRFFT of {x.shape[ax]} bins has no default dft_length; give one")
        y = np.fft.irfft(x, n=n, axis=ax)
    else:
        y = (np.fft.ifft if inverse else np.fft.fft)(x, n=length, axis=ax)
    return from_complex(y, data.dtype)


def _dft_length(dft_length) -> int | None:
    return None if dft_length is None else _positive_scalar(dft_length, "dft_length")


@kernel("DFT", since=17)
def dft_17(*, axis=1, inverse=0, onesided=0):
    inv, one = bool(inverse), bool(onesided)
    return lambda input, dft_length=None: dft(input, axis, _dft_length(dft_length), inv, one)


@kernel("DFT", since=20)
def dft_20(*, inverse=0, onesided=0):
    inv, one = bool(inverse), bool(onesided)

    def run(input, dft_length=None, axis=None):
        if axis is None:
            ax = -2
        else:
            if axis.size != 1 or axis.dtype.kind not in "iu":
                raise InvalidValueError(f"axis must be an integer scalar, got {axis.dtype} {list(axis.shape)}")
            ax = int(axis.reshape(()))
        return dft(input, ax, _dft_length(dft_length), inv, one)
    return run


# -- STFT ------------------------------------------------------------------------------------------


@kernel("STFT", since=17)
def stft_17(*, onesided=1):
    one = bool(onesided)

    def run(signal, frame_step, window=None, frame_length=None):
        if signal.ndim != 3:
            raise InvalidValueError(f"signal must have rank 3 [batch, length, 1|2], got {list(signal.shape)}")
        x, is_complex = to_complex(signal, "signal")
        if one and is_complex:
            raise InvalidValueError("onesided=1 needs a real signal (trailing dim 1)")
        step = _positive_scalar(frame_step, "frame_step")
        if window is not None and window.ndim != 1:
            raise InvalidValueError(f"window must be 1-D, got shape {list(window.shape)}")
        if frame_length is not None:
            length = _positive_scalar(frame_length, "frame_length")
            if window is not None and window.shape[0] != length:
                raise InvalidValueError(f"window has {window.shape[0]} values but frame_length is {length}")
        else:
            length = window.shape[0] if window is not None else x.shape[1]
        if not 0 < length <= x.shape[1]:
            raise InvalidValueError(f"frame length {length} does not fit the signal length {x.shape[1]}")
        # frames = floor((signal_length - frame_length) / frame_step) + 1, as a strided view
        frames = np.lib.stride_tricks.sliding_window_view(x, length, axis=1)[:, ::step]
        if window is not None:
            frames = frames * window.astype(_compute_type(window.dtype), copy=False)
        y = np.fft.rfft(frames, axis=-1) if one else np.fft.fft(frames, axis=-1)
        return from_complex(y, signal.dtype)
    return run


# -- windows ---------------------------------------------------------------------------------------


def cosine_window(size: np.ndarray, periodic: bool, a0: float, a1: float, a2: float, dtype) -> np.ndarray:
    """w[n] = a0 - a1 cos(2 pi n / N) + a2 cos(4 pi n / N), n in [0, size), with N = size (periodic)
    or size - 1 (symmetric); computed in float64 and converted to `dtype`. A symmetric window of
    size 1 (N = 0, where the schema's function body divides by zero) is [1], as in numpy, scipy and torch."""
    if size.size != 1 or size.ndim > 1 or size.dtype.kind not in "iu":
        raise InvalidValueError(f"size must be an integer scalar, got {size.dtype} {list(size.shape)}")
    n = int(size.reshape(()))
    if n < 0:
        raise InvalidValueError(f"size must be >= 0, got {n}")
    denom = n if periodic else n - 1
    if denom == 0:
        return np.ones(n, dtype=dtype)
    angle = 2 * np.pi * np.arange(n, dtype=np.float64) / denom
    w = a0 - a1 * np.cos(angle) + a2 * np.cos(2 * angle)
    return float_to(w, dtype)


def _window(op: str, a0: float, a1: float, a2: float):
    def factory(*, periodic=1, output_datatype=1):
        dtype = dtype_attribute(output_datatype, op, 17, "T2", "output_datatype")
        per = bool(periodic)
        return lambda size: cosine_window(size, per, a0, a1, a2, dtype)
    factory.__name__ = f"{op}_17"
    return factory


kernel("HannWindow", since=17)(_window("HannWindow", 0.5, 0.5, 0.0))
kernel("HammingWindow", since=17)(_window("HammingWindow", 25 / 46, 21 / 46, 0.0))
kernel("BlackmanWindow", since=17)(_window("BlackmanWindow", 0.42, 0.5, 0.08))


# -- MelWeightMatrix -------------------------------------------------------------------------------


def _float_scalar(x: np.ndarray, name: str) -> float:
    if x.size != 1 or x.ndim > 1:
        raise InvalidValueError(f"{name} must be a scalar, got shape {list(x.shape)}")
    return float(x.reshape(()).astype(np.float64))


def mel_weight_matrix(num_mel_bins: int, dft_length: int, sample_rate: int, lower: float, upper: float,
                      dtype) -> np.ndarray:
    """[dft_length // 2 + 1, num_mel_bins] triangular filters of peak 1 on the mel scale
    mel(f) = 2595 log10(1 + f / 700). The num_mel_bins + 2 band edges are evenly spaced in mels from
    mel(lower) by (mel(upper) - mel(lower)) / (num_mel_bins + 2), mapped back to hertz and to the
    spectrogram bin floor((dft_length + 1) * f / sample_rate); filter i rises linearly from edge i to 1
    at edge i + 1 (a single 1 when they coincide) and falls linearly to 0 at edge i + 2."""
    if not 0 <= lower <= upper:
        raise InvalidValueError(f"need 0 <= lower_edge_hertz <= upper_edge_hertz, got {lower}, {upper}")
    n_bins = dft_length // 2 + 1
    low_mel = 2595 * np.log10(1 + lower / 700)
    high_mel = 2595 * np.log10(1 + upper / 700)
    mel_step = (high_mel - low_mel) / (num_mel_bins + 2)
    mels = np.arange(num_mel_bins + 2, dtype=np.float64) * mel_step + low_mel
    hertz = 700 * (10 ** (mels / 2595) - 1)
    edges = np.floor((dft_length + 1) * hertz / sample_rate).astype(np.int64)
    left, center, right = edges[:-2], edges[1:-1], edges[2:]
    j = np.arange(n_bins)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        rise = np.where(center > left, (j - left) / (center - left), 1.0)
        fall = (right - j) / (right - center)
    out = np.where((left <= j) & (j <= center), rise, 0.0)
    out = np.where((center <= j) & (j < right), fall, out)
    return float_to(out, dtype)


@kernel("MelWeightMatrix", since=17)
def mel_weight_matrix_17(*, output_datatype=1, _version):
    dtype = dtype_attribute(output_datatype, "MelWeightMatrix", _version, "T3", "output_datatype")

    def run(num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz):
        return mel_weight_matrix(
            _positive_scalar(num_mel_bins, "num_mel_bins"), _positive_scalar(dft_length, "dft_length"),
            _positive_scalar(sample_rate, "sample_rate"), _float_scalar(lower_edge_hertz, "lower_edge_hertz"),
            _float_scalar(upper_edge_hertz, "upper_edge_hertz"), dtype)
    return run
