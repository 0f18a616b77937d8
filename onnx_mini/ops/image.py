"""Image operators (onnx/defs/image): ImageDecoder (20).

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
