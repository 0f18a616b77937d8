"""Spec tests for ImageDecoder (20): lossless images made with Pillow here, decoded back; the missing-Pillow
error (Pillow hidden from the import system, nothing uninstalled); undecodable streams. ImageScaler (1,
removed at opset 10): y = x * scale + bias[c], by hand, and against onnxruntime when it is installed."""
from __future__ import annotations

import io
import re
import sys

import numpy as np
import pytest

from onnx_mini.errors import InvalidNodeError, KernelError, OnnxMiniError, UnsupportedOperatorError

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


# -- ImageScaler (an experimental operator onnx removed; no schema left in the installed onnx) ---------

def scale_image(x, version=9, **attrs):
    return run_node("ImageScaler", version, [x], **attrs)


@pytest.mark.parametrize("version", [1, 6, 7, 9])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_image_scaler_by_hand(version, dtype):
    x = np.arange(12, dtype=dtype).reshape(1, 3, 2, 2)            # channel c holds 4c .. 4c + 3
    # x * 2 + bias[c]: channel 0: 0 2 4 6 (+1), channel 1: 8 10 12 14 (+2), channel 2: 16 .. 22 (-3)
    expected = np.array([1, 3, 5, 7, 10, 12, 14, 16, 13, 15, 17, 19], dtype=dtype).reshape(1, 3, 2, 2)
    assert_same(scale_image(x, version, bias=[1.0, 2.0, -3.0], scale=2.0), expected)


def test_image_scaler_defaults_and_batches():
    x = np.array([[[[1.5]], [[-2.0]]], [[[4.0]], [[0.25]]]], np.float32)      # N=2, C=2, 1x1
    assert_same(scale_image(x), x)                                 # scale 1, no bias
    assert_same(scale_image(x, bias=[10.0, 20.0]), np.array([[[[11.5]], [[18.0]]], [[[14.0]], [[20.25]]]],
                                                            np.float32))
    assert_same(scale_image(x, scale=0.5), x / 2)
    empty = np.zeros((0, 2, 3, 3), np.float32)
    assert_same(scale_image(empty, bias=[1.0, 2.0]), empty)


def test_image_scaler_float16_rounds_once():
    # float16 values are 2 apart from 2048 on: 683.5 * 3 + 0.75 = 2051.25 in float32, rounded once to
    # 2052 (as onnxruntime 1.32 gives); rounding 683.5 * 3 = 2050.5 to float16 first (2050) would end at
    # 2050.75 -> 2050
    x = np.full((1, 1, 1, 1), 683.5, np.float16)
    assert_same(scale_image(x, bias=[0.75], scale=3.0), np.full((1, 1, 1, 1), 2052, np.float16))


def test_image_scaler_more_spatial_axes():
    # onnxruntime scales every axis after C alike
    x = np.ones((1, 2, 2, 1, 3), np.float32)
    assert_same(scale_image(x, bias=[1.0, -1.0], scale=3.0),
                np.concatenate([np.full((1, 1, 2, 1, 3), 4, np.float32), np.full((1, 1, 2, 1, 3), 2, np.float32)], 1))


@pytest.mark.parametrize("opset", [10, 13, 21])
def test_image_scaler_is_gone_from_opset_10(opset):
    with pytest.raises(UnsupportedOperatorError, match=f"{NODE}.*ImageScaler was removed .* in opset 10"):
        scale_image(np.zeros((1, 1, 1, 1), np.float32), opset, bias=[0.0])


@pytest.mark.parametrize("x,attrs,pattern", [
    (np.zeros((1, 3, 2, 2), np.float32), {"bias": [1.0, 2.0]}, r"bias has 2 value\(s\), the input has 3 channel"),
    (np.zeros((3, 2, 2), np.float32), {"bias": [1.0, 2.0, 3.0]}, r"\[N, C, H, W\].*\[3, 2, 2\]"),
    (np.zeros((1, 1, 2, 2), np.int32), {}, "float16, float or double, got int32"),
])
def test_image_scaler_bad_input(x, attrs, pattern):
    with pytest.raises(KernelError, match=f"(?s){NODE}.*{pattern}"):
        scale_image(x, **attrs)


@pytest.mark.parametrize("attrs,pattern", [({"scale": "big"}, "'scale' must be a float"),
                                           ({"bias": "one"}, "'bias' must be a list of floats"),
                                           ({"gain": 2.0}, "'gain' not defined")])
def test_image_scaler_bad_attributes(attrs, pattern):
    with pytest.raises(InvalidNodeError, match=f"{NODE}.*{pattern}"):
        scale_image(np.zeros((1, 1, 1, 1), np.float32), **attrs)


def test_image_scaler_matches_onnxruntime():
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper
    x = np.random.default_rng(0).standard_normal((2, 3, 5, 4)).astype(np.float32)
    node = helper.make_node("ImageScaler", ["x"], ["y"], bias=[0.5, -1.25, 3.0], scale=0.017)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)], ir_version=4)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(scale_image(x, bias=[0.5, -1.25, 3.0], scale=0.017), want, rtol=1e-6, atol=1e-7)
