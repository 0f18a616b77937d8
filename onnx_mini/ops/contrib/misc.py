"""com.microsoft Inverse, Trilu, GridSample and Range (version 1 each).

Trilu, GridSample (bilinear / nearest / bicubic on 4-D input) and Range have the math of the ai.onnx
kernels they predate (Trilu-14, GridSample-16, Range-11), which these reuse; Range's delta is optional
here (default 1). Inverse inverts every matrix of a batch (float16 computed in float32).
"""
from __future__ import annotations

import numpy as np

from ...errors import InvalidValueError
from ...registry import kernel
from .._common import UPCAST
from ..generator import arange
from ..tensor.grid import grid_sample_16
from ..tensor.select import trilu_14

MS = "com.microsoft"


@kernel("Inverse", since=1, domain=MS)
def inverse_1():
    def run(x):
        if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
            raise InvalidValueError(f"X must be a (batch of) square matrices, got shape {list(x.shape)}")
        dt = x.dtype
        try:
            y = np.linalg.inv(x.astype(np.float32) if dt in UPCAST else x)
        except np.linalg.LinAlgError:
            raise InvalidValueError("a matrix of X is singular (not invertible)") from None
        return y.astype(dt, copy=False)
    return run


@kernel("Trilu", since=1, domain=MS)
def trilu_ms_1(*, upper=1):
    return trilu_14(upper=upper)


@kernel("GridSample", since=1, domain=MS)
def grid_sample_ms_1(*, align_corners=0, mode="bilinear", padding_mode="zeros"):
    sample = grid_sample_16(align_corners=align_corners, mode=mode, padding_mode=padding_mode)

    def run(x, grid):
        if x.dtype.kind != "f" or grid.dtype.kind != "f":
            raise InvalidValueError(f"X ({x.dtype}) and Grid ({grid.dtype}) must be float tensors")
        return sample(x, grid)
    return run


@kernel("Range", since=1, domain=MS)
def range_ms_1():
    def run(start, limit, delta=None):
        if delta is None:
            delta = np.ones((), dtype=start.dtype)
        return arange(start, limit, delta)
    return run
