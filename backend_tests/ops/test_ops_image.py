"""Spec tests for ImageDecoder (20): lossless images made with Pillow here, decoded back; the missing-Pillow
error (Pillow hidden from the import system, nothing uninstalled); undecodable streams."""
from __future__ import annotations

import io
import re
import sys

import numpy as np
import pytest

from onnx_mini.errors import InvalidNodeError, KernelError, OnnxMiniError

from helpers import NODE, assert_same, run_node, type_params

from PIL import Image   # a test dependency (the `test` extra); the kernel itself imports it lazily

# 3 x 4 RGB pixels: primaries, greys (R = G = B) and a few mixed colours
PIXELS = np.array([[[255, 0, 0], [0, 255, 0], [0, 0, 255], [0, 0, 0]],
                   [[255, 255, 255], [128, 128, 128], [7, 7, 7], [10, 20, 30]],
                   [[200, 100, 50], [1, 2, 3], [254, 253, 252], [99, 0, 199]]], dtype=np.uint8)
# ITU-R 601-2 luma L = 0.299 R + 0.587 G + 0.114 B, rounded: 76.2 -> 76, 149.7 -> 150, 29.1 -> 29;
# a grey keeps its value; (10, 20, 30) -> 18.1; (200, 100, 50) -> 124.2; (1, 2, 3) -> 1.8;
# (254, 253, 252) -> 253.2; (99, 0, 199) -> 52.3
GRAY = np.array([[76, 150, 29, 0], [255, 128, 7, 18], [124, 2, 253, 52]], dtype=np.uint8)[:, :, None]


def encode(pixels: np.ndarray, fmt: str, mode: str | None = None) -> np.ndarray:
    buf = io.BytesIO()
    img = Image.fromarray(pixels)
    if mode:
        img = img.convert(mode)
    img.save(buf, format=fmt)
    return np.frombuffer(buf.getvalue(), dtype=np.uint8)


def decode(stream, **attrs):
    return run_node("ImageDecoder", 20, [stream], **attrs)


@pytest.mark.parametrize("fmt", ["PNG", "BMP", "TIFF", "PPM"])
@pytest.mark.parametrize("pixel_format", ["RGB", "BGR", "Grayscale", None])
def test_lossless_round_trip(fmt, pixel_format):
    stream = encode(PIXELS, fmt)
    attrs = {} if pixel_format is None else {"pixel_format": pixel_format}
    expected = {"RGB": PIXELS, None: PIXELS, "BGR": PIXELS[:, :, ::-1].copy(), "Grayscale": GRAY}[pixel_format]
    assert_same(decode(stream, **attrs), expected)


def test_gray_and_alpha_images():
    # a grayscale PNG decodes to three equal channels; an RGBA PNG's alpha is dropped
    grey = encode(GRAY[:, :, 0], "PNG")
    assert_same(decode(grey), np.repeat(GRAY, 3, axis=2))
    assert_same(decode(grey, pixel_format="Grayscale"), GRAY)
    rgba = np.concatenate([PIXELS, np.full((3, 4, 1), 17, np.uint8)], axis=2)
    assert_same(decode(encode(rgba, "PNG")), PIXELS)


def test_jpeg_of_a_flat_image():
    # JPEG is lossy, but a flat mid-grey image survives exactly
    flat = np.full((16, 16, 3), 128, np.uint8)
    assert_same(decode(encode(flat, "JPEG")), flat)
    assert_same(decode(encode(flat, "JPEG"), pixel_format="Grayscale"), flat[:, :, :1])


@pytest.mark.parametrize("version,tname", type_params("ImageDecoder", [20], "T1"))
def test_every_type(version, tname):
    assert tname == "uint8"
    out = decode(encode(PIXELS, "PNG"))
    assert out.dtype == np.uint8 and out.flags.c_contiguous


@pytest.mark.parametrize("stream", [np.zeros(0, np.uint8), np.frombuffer(b"not an image at all", np.uint8),
                                    encode(PIXELS, "PNG")[:40]])
@pytest.mark.parametrize("pixel_format,channels", [("RGB", 3), ("Grayscale", 1)])
def test_undecodable_stream_gives_an_empty_image(stream, pixel_format, channels):
    assert_same(decode(stream, pixel_format=pixel_format), np.zeros((0, 0, channels), np.uint8))


def test_missing_pillow_is_a_clear_error(monkeypatch):
    # None in sys.modules makes `import PIL` fail as if Pillow were not installed
    stream = encode(PIXELS, "PNG")
    monkeypatch.setitem(sys.modules, "PIL", None)
    monkeypatch.setitem(sys.modules, "PIL.Image", None)
    with pytest.raises(KernelError, match=re.escape(NODE) + r".*Pillow.*pip install onnx-mini\[image\]") as err:
        decode(stream)
    assert isinstance(err.value.__cause__, OnnxMiniError) and isinstance(err.value.__cause__, ImportError)


def test_pillow_is_imported_lazily():
    # importing onnx_mini's image module does not import Pillow
    import onnx_mini.ops.image as image_module
    assert "PIL" not in image_module.__dict__ and "Image" not in image_module.__dict__


@pytest.mark.parametrize("stream,pattern", [(np.zeros((2, 3), np.uint8), "1-D uint8")])
def test_bad_input(stream, pattern):
    with pytest.raises(KernelError, match=f"{NODE}.*{pattern}"):
        decode(stream)


def test_bad_pixel_format():
    with pytest.raises(InvalidNodeError, match=f"{NODE}.*pixel_format"):
        decode(encode(PIXELS, "PNG"), pixel_format="CMYK")
