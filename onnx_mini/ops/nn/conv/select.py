"""Which algorithm computes a Conv: a pure function of the shapes, the compute type and what is known
of the weights, with the tuned thresholds of thresholds.py.

Algorithms (the names `prepare(model, conv_algorithm=...)` takes):
- "pointwise": 1x1 kernel, stride 1, no padding: one matmul per group (pointwise.py);
- "im2col": windows copied once into columns, one matmul per group; computes every Conv (im2col.py;
  one 1-D image with a few output positions: a matrix-vector product per position, by rows);
- "shifted": stride 1, one group: one matmul per tap on runs of the flat padded input (shifted.py;
  not while the run splits its products: see `splitting`);
- "strips": 2-D, stride 1, one group: the kernel's column shifts of the input as strips, one matmul
  with W's kernel rows stacked, the rows' partial sums added (strips.py);
- "winograd": F(2x2, 3x3), 2-D 3x3, stride and dilation 1, one group, float32/float64 compute type,
  finite X and W, not for integer sums that must stay exact in float32 (`exact`: its transforms
  take quarters and grow the values) (winograd.py);
- "depthwise-flat", "depthwise-channels-last": one input channel per group (depthwise.py);
- "depthwise-einsum": the same with one output channel per input channel;
- "depthwise-banded": the same, 2-D, float32/float64 compute type, finite X and W (banded.py);
- "dft": a constant W that is a windowed real DFT basis (an STFT as a Conv1d: `dft`, dft.basis),
  dilation 1, float32, finite X: numpy's real FFT of the frames (dft.py).
"empty" is not an algorithm: no product to sum (no image, no output or no input channel), Y is B.

A forced algorithm is taken wherever it can compute the Conv (its thresholds ignored); where it
cannot (a shape or type it does not handle, non-finite values for winograd and depthwise-banded,
anything but pointwise for a channel-shuffled output) the normal choice is made instead.
"""
from __future__ import annotations

import math

import numpy as np

from ..._common import UPCAST
from . import banded, strips, thresholds, winograd

ALGORITHMS = ("pointwise", "im2col", "shifted", "strips", "winograd", "depthwise-flat", "depthwise-channels-last",
              "depthwise-einsum", "depthwise-banded", "dft")
EMPTY = "empty"
NEEDS_FINITE = frozenset({"winograd", "depthwise-banded", "dft"})   # their transforms turn an infinity into NaN


def check_name(name) -> str | None:
    """name (None: no choice forced) or ValueError naming the algorithms."""
    if name is not None and name not in ALGORITHMS:
        raise ValueError(f"unknown conv_algorithm {name!r}: expected one of {', '.join(ALGORITHMS)}")
    return name


def select(x_shape, w_shape, dtype, *, group: int, kernel, strides, dilations, begin, end, out,
           finite: bool = True, forced: str | None = None, shuffle: bool = False, exact: bool = False,
           splitting: bool = False, dft: bool = False) -> str:
    """The algorithm for X of `x_shape` and type `dtype` (float16/bfloat16 compute in float32), W of
    `w_shape`, and the checked geometry (kernel, strides, dilations, pads begin/end, output sizes).
    finite: whether X and W may go to the algorithms that need finite values (False when a value is
    known not to be); forced: an algorithm to take where it applies; shuffle: the output is written
    in channel-shuffle order (ops/fused.py), which only pointwise does (ValueError otherwise); exact: X and W
    hold integers whose sums must stay exact (ConvInteger, QLinearConv in float32): no Winograd;
    splitting: the run splits its products over onnx_mini's pool (blas.splitting()): no shifted, whose
    per-tap products each pay a hand-off and whose accumulations run on one thread, where im2col shares
    its gathers and products among the threads (thresholds.SHIFT_WHEN_SPLITTING); dft: W is the
    Conv's constant and a windowed real DFT basis (dft.basis found one)."""
    n, c = x_shape[:2]
    m, cg = w_shape[:2]
    if n == 0 or m == 0 or cg == 0:
        return EMPTY
    dtype = np.dtype(np.float32) if np.dtype(dtype) in UPCAST else np.dtype(dtype)
    pointwise = (all(k == 1 for k in kernel) and all(s == 1 for s in strides) and not any(begin)
                 and not any(end))
    depthwise = cg == 1 and group > 1
    mult = m // group
    stride_1 = all(s == 1 for s in strides)

    def applies(name: str) -> bool:
        if shuffle:
            return name == "pointwise" and pointwise
        return {"pointwise": pointwise,
                "im2col": True,
                "shifted": stride_1 and group == 1,
                "strips": strips.applies(group, kernel, strides),
                "winograd": finite and not exact and winograd.applies(dtype, group, kernel, strides, dilations),
                "depthwise-flat": depthwise,
                "depthwise-channels-last": depthwise,
                "depthwise-einsum": depthwise and mult == 1,
                "depthwise-banded": depthwise and finite and banded.applies(dtype, kernel, mult),
                "dft": (dft and finite and not exact and dtype == np.float32 and len(kernel) == 1 and group == 1
                        and dilations[0] == 1)}[name]

    if forced is not None and applies(forced):
        return forced
    if pointwise:
        return "pointwise"
    if shuffle:
        raise ValueError("a channel shuffle is folded only into pointwise Conv")
    pixels = math.prod(out)
    if (applies("dft") and kernel[0] >= thresholds.DFT_MIN_TAPS
            and n * m * c * kernel[0] * pixels >= thresholds.DFT_MIN_MACS):
        return "dft"
    if depthwise:
        if pixels > thresholds.DW_LAST_MAX_PIXELS:
            if (max(strides) > 1 and mult == 1 and group <= thresholds.DW_IM2COL_MAX_CHANNELS
                    and c * math.prod(kernel) * pixels * dtype.itemsize <= thresholds.DW_IM2COL_MAX_COLUMN_BYTES):
                return "im2col"     # strided, few channels: the columns and one product beat the taps
            layout = "depthwise-flat"
        else:
            layout = "depthwise-einsum" if mult == 1 else "depthwise-channels-last"
        banded_first = True
        if layout == "depthwise-einsum":        # against the einsum, banded wins where measured so
            if max(strides) > 1:                # strided: banded lost to both einsum and im2col
                return "im2col" if group <= thresholds.DW_IM2COL_MAX_CHANNELS else layout
            banded_first = math.prod(kernel) * out[-1] * group * dtype.itemsize > thresholds.DW_EINSUM_MAX_WEIGHT_BYTES
        if banded_first and applies("depthwise-banded") and out[1] <= thresholds.BANDED_MAX_WIDTH:
            return "depthwise-banded"
        return layout
    if (applies("winograd") and c >= thresholds.WINOGRAD_MIN_CHANNELS and m >= thresholds.WINOGRAD_MIN_CHANNELS
            and pixels >= thresholds.WINOGRAD_MIN_PIXELS):
        return "winograd"
    if applies("strips") and strips.pays(pixels, m, kernel[1], c, splitting):
        return "strips"
    if stride_1 and group == 1 and (thresholds.SHIFT_WHEN_SPLITTING or not splitting) and (
            (m < c and pixels >= thresholds.SHIFT_MIN_PIXELS)
            or (m == c and c * math.prod(kernel) * pixels * dtype.itemsize >= thresholds.SHIFT_SAME_MIN_COLUMN_BYTES)):
        return "shifted"
    return "im2col"
