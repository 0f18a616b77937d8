"""Depthwise Conv (one input channel per group, possibly with a channel multiplier) by a multiply
per kernel tap into a reused buffer (out=) and an in-place add: no per-tap temporaries, the first tap
assigned rather than added to zeros. numpy's cost here is mostly per inner loop, so the layout is the
one giving long inner loops (select.py picks it by shape):
- "flat" (depthwise_flat.py, large images): every tap reads one contiguous run of a flattened plane;
- "channels-last" / "einsum" (depthwise_channels_last.py, small images): the input transposed once
  so that the per-tap weights lie along the contiguous axis; with one output channel per input
  channel, one einsum over the windows.
The work goes in blocks of images or channels spread over threads (thresholds.DW_*). The narrow
outputs' alternative, products with banded matrices, is banded.py. Measurements: benchmarks/README.md.
"""
from __future__ import annotations

import math

import numpy as np

from .... import memory, parallel
from . import depthwise_channels_last, depthwise_flat, thresholds

LAYOUTS = {"depthwise-flat": depthwise_flat.layout, "depthwise-channels-last": depthwise_channels_last.layout,
           "depthwise-einsum": depthwise_channels_last.einsum_layout}


def conv(x, w, b, group, kernel, strides, dil, begin, out, name, memo, keep):
    """Y (N, M, *out) of x (N, C, ...) and w (M, 1, ...), bias included, with layout `name` (a key of
    LAYOUTS). memo: the calling Conv's dict for this input shape (the layout's plan, its blocks);
    keep(key, make): the layout's arrangement of W, kept there when W is the Conv's constant."""
    n = x.shape[0]
    m = w.shape[0]
    mult = m // group
    y = memory.empty((n, m, *out), dtype=x.dtype)
    made = memo.get("made")
    if made is None:
        taps = list(np.ndindex(*kernel))
        step, plane = LAYOUTS[name](x.shape[2:], kernel, strides, dil, begin, out, mult, taps)
        made = memo["made"] = (taps, step, plane, getattr(step, "weights", None))
    taps, step, plane, arranged = made
    wk = w.reshape(group, mult, len(taps))
    if arranged is not None:        # the einsum's own arrangement of W (every channel, one block per image)
        wk = keep("depthwise weights", lambda: arranged(wk))
    threads = parallel.threads()
    blocks, want = memo.get(("blocks", threads)) or memo.setdefault(
        ("blocks", threads), blocks_of(n, m, group, len(taps), plane * x.itemsize, math.prod(out),
                                       name == "depthwise-flat", threads))
    if len(blocks) == 1 and arranged is not None:     # the einsum on the whole input (a small Conv's cost counts)
        step(x, wk, None if b is None else b.reshape(m, 1), y.reshape(n, m, 1, *out), {})
        return y

    def work(lo, hi):
        buffers = {}
        for i0, i1, c0, c1 in blocks[lo:hi]:
            step(x[i0:i1, c0:c1], wk if arranged is not None else wk[c0:c1],
                 None if b is None else b[c0 * mult:c1 * mult].reshape(c1 - c0, mult),
                 y[i0:i1, c0 * mult:c1 * mult].reshape(i1 - i0, c1 - c0, mult, *out), buffers)
    if want > 1 and len(blocks) > 1:
        parallel.split(work, len(blocks), len(blocks) // want)
    else:
        work(0, len(blocks))
    return y


def blocks_of(n, m, group, taps, per_channel_bytes, pixels, flat, threads):
    """-> (blocks (i0, i1, c0, c1), want): blocks of whole images, or of channels of one image, of at
    most thresholds.DW_BLOCK_BYTES of scratch (flat), at least `want` of them for the threads. One
    image in channels-last stays one block: splitting its channels shortens the inner loops (512x14x14
    on two threads: 0.39 -> 0.66 ms)."""
    block_bytes = thresholds.DW_BLOCK_BYTES
    per_image = group * per_channel_bytes
    want = max(1, min(threads, n * m * pixels * taps // thresholds.DW_MIN_PART_MACS))
    if n > 1 and (per_image <= block_bytes or not flat):
        per = max(1, min(block_bytes // per_image, n // want))
        blocks = [(i, min(n, i + per), 0, group) for i in range(0, n, per)]
    elif flat:
        parts = -(-per_image // block_bytes)
        if n == 1:
            parts = -(-parts // want) * want
        per = -(-group // parts)
        blocks = [(i, i + 1, c, min(group, c + per)) for i in range(n) for c in range(0, group, per)]
    else:
        blocks = [(0, 1, 0, group)]
    return blocks, want
