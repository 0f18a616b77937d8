"""Image operators: ImageDecoder (20, onnx/defs/image) and ImageScaler (1, an experimental operator onnx
removed at opset 10, still run by onnxruntime for opsets 1-9 and found in old model-zoo and WinMLTools
models: y = x * scale + bias[c] on an [N, C, H, W] tensor).

Decoding goes through Pillow, an optional dependency (`pip install onnx-mini[image]`): it is imported
when a model actually decodes an image, so onnx_mini imports and runs every other model without it.
Pillow's JPEG decoder is libjpeg(-turbo), whose default "fancy" chroma upsampling is the one the spec
describes, and the official expected images were produced by Pillow, so the results match exactly.

The spec asks for an empty tensor when the stream cannot be decoded; a stream that decodes to an
image is returned as (H, W, 3) uint8 for RGB/BGR and (H, W, 1) for Grayscale (Pillow's "L" mode,
ITU-R 601-2 luma).
"""
from __future__ import annotations

import io

import numpy as np

from ..errors import InvalidValueError, OnnxMiniError
from ..registry import kernel
from ._common import float32_compute


class MissingDependencyError(OnnxMiniError, ImportError):
    """An optional dependency an operator needs is not installed."""


def _pillow_image():
    try:
        from PIL import Image
    except ImportError:
        raise MissingDependencyError(
            "ImageDecoder needs Pillow, which is not installed: pip install onnx-mini[image]") from None
    return Image


@kernel("ImageDecoder", since=20)
def image_decoder_20(*, pixel_format="RGB"):
    if pixel_format not in ("RGB", "BGR", "Grayscale"):
        raise ValueError(f"pixel_format must be 'RGB', 'BGR' or 'Grayscale', got {pixel_format!r}")
    mode = "L" if pixel_format == "Grayscale" else "RGB"
    channels = 1 if mode == "L" else 3

    def run(encoded_stream):
        Image = _pillow_image()
        if encoded_stream.dtype != np.uint8 or encoded_stream.ndim != 1:
            raise InvalidValueError(f"encoded_stream must be a 1-D uint8 tensor, got {encoded_stream.dtype} "
                                    f"of shape {list(encoded_stream.shape)}")
        try:
            with Image.open(io.BytesIO(encoded_stream.tobytes())) as img:
                pixels = np.asarray(img.convert(mode))
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
            # unreadable, truncated or unknown stream: the spec's empty result
            return np.zeros((0, 0, channels), dtype=np.uint8)
        pixels = pixels.reshape(pixels.shape[0], pixels.shape[1], channels)
        if pixel_format == "BGR":
            pixels = pixels[:, :, ::-1]
        return np.ascontiguousarray(pixels, dtype=np.uint8)
    return run


_IMAGE_SCALER_TYPES = frozenset(np.dtype(t) for t in (np.float16, np.float32, np.float64))


# onnx has no schema left for it, so the factory checks the attribute types itself; opset 10 is where
# onnxruntime stops accepting it (it was deprecated there)
@kernel("ImageScaler", since=1, until=10)
def image_scaler_1(*, bias=None, scale=1.0):
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.integer, np.floating)):
        raise ValueError(f"attribute 'scale' must be a float, got {scale!r}")
    if bias is not None and (not isinstance(bias, list) or
                             not all(isinstance(b, (int, float, np.integer, np.floating)) for b in bias)):
        raise ValueError(f"attribute 'bias' must be a list of floats (one per channel), got {bias!r}")
    per_channel = None if bias is None else np.array(bias, dtype=np.float64)
    # the bias in each type the math runs in (float16 runs in float32), shaped (C, 1, 1) when used
    bias_as = {} if per_channel is None else {np.dtype(t): per_channel.astype(t) for t in (np.float32, np.float64)}

    @float32_compute            # float16: x * scale + bias in float32, rounded once
    def scaled(x):
        y = x * x.dtype.type(scale)
        if bias_as:
            y += bias_as[x.dtype].reshape((-1,) + (1,) * (x.ndim - 2))
        return y

    def run(x):
        if x.dtype not in _IMAGE_SCALER_TYPES:
            raise InvalidValueError(f"input must be float16, float or double, got {x.dtype}")
        # onnxruntime also takes more than two spatial axes, each channel scaled alike
        if x.ndim < 4:
            raise InvalidValueError(f"input must be an [N, C, H, W] image batch, got shape {list(x.shape)}")
        if per_channel is not None and per_channel.size != x.shape[1]:
            raise InvalidValueError(f"bias has {per_channel.size} value(s), the input has {x.shape[1]} "
                                    f"channel(s) (shape {list(x.shape)})")
        return scaled(x)
    return run
