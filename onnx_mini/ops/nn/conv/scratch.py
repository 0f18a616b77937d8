"""Scratch buffers the depthwise layouts keep across the blocks of one call."""
from __future__ import annotations

import numpy as np


def buffer(buffers, name, shape, dtype, zeros=False):
    """A (shape) view of a buffer kept across the blocks of one call (reallocated for a larger block);
    a zeroed buffer keeps its zeros where the blocks never write (the padding)."""
    buf = buffers.get(name)
    if buf is None or buf.dtype != dtype or any(h < s for h, s in zip(buf.shape, shape)):
        buf = buffers[name] = (np.zeros if zeros else np.empty)(shape, dtype=dtype)
        return buf
    return buf if buf.shape == shape else buf[tuple(slice(0, s) for s in shape)]
