"""The channels-last depthwise Conv's small single-part path (ConvNHWC._depthwise_small) and its strided
path's column phases (_depthwise_phased): a zero-padded input buffer kept per thread and shape across calls. Its border must stay zero and its contents must
never leak from one call or thread into another: each call against Conv's definition (helpers.conv2d_direct)."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from onnx_mini.ops.fused import fused_conv_nhwc
from onnx_mini.ops.nn.conv import channels_last

from helpers import conv2d_direct


def nhwc(a):
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1))


def kernel(w, b, **attrs):
    return fused_conv_nhwc(kernel_shape=list(w.shape[2:]), group=w.shape[0], _constants={1: w, 2: b}, **attrs)


@pytest.mark.parametrize("strides,pads", [((1, 1), (1, 1, 1, 1)), ((2, 2), (1, 1, 1, 1)), ((1, 1), (0, 2, 1, 0))])
def test_repeated_calls_keep_the_padding_zero(strides, pads):
    rng = np.random.default_rng(0)
    c = 8
    w = rng.standard_normal((c, 1, 3, 3)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    fn = kernel(w, b, strides=list(strides), pads=list(pads))
    calls = []
    real_small = channels_last.ConvNHWC._depthwise_small

    def spy(self, *args):
        calls.append(1)
        return real_small(self, *args)
    channels_last.ConvNHWC._depthwise_small = spy
    try:
        for seed in range(3):
            # large values: a border left holding X's would change the edge outputs by far more than rounding
            x = (np.random.default_rng(seed).standard_normal((1, c, 9, 10)) * 10 ** seed).astype(np.float32)
            got = fn(nhwc(x), w, b).transpose(0, 3, 1, 2)
            want = conv2d_direct(x, w, b, strides, pads, c)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * 10 ** seed)
    finally:
        channels_last.ConvNHWC._depthwise_small = real_small
    assert len(calls) == 3          # the small path ran each time


def test_bit_identical_to_a_fresh_buffer_and_across_threads():
    """Repeated and concurrent calls give Y bit for bit as the first call on a new kernel does."""
    rng = np.random.default_rng(1)
    c = 24
    w = rng.standard_normal((c, 1, 3, 3)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    xs = [nhwc(rng.standard_normal((1, c, 28, 28)).astype(np.float32)) for _ in range(4)]
    want = [kernel(w, b, pads=[1, 1, 1, 1])(x, w, b) for x in xs]
    fn = kernel(w, b, pads=[1, 1, 1, 1])
    results = {}

    def worker(k):
        results[k] = [fn(xs[(k + i) % 4], w, b).copy() for i in range(40)]
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k, ys in results.items():
        for i, y in enumerate(ys):
            assert np.array_equal(y.view(np.uint32), want[(k + i) % 4].view(np.uint32))


@pytest.mark.parametrize("pads", [(1, 1, 1, 1), (0, 2, 1, 0)])
def test_phases_kept_per_thread(pads):
    """The strided depthwise path's column phases (ConvNHWC._depthwise_phased) below
    DW_READ_ROWS_MIN_BYTES are kept per thread and shape, their zeros written once: repeated calls of
    growing magnitude against Conv's definition, and concurrent calls bit for bit as a new kernel's."""
    rng = np.random.default_rng(2)
    c = 8
    w = rng.standard_normal((c, 1, 3, 3)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    fn = kernel(w, b, strides=[2, 2], pads=list(pads))
    calls = []
    real = channels_last.ConvNHWC._depthwise_phased

    def spy(self, *args):
        calls.append(1)
        return real(self, *args)
    channels_last.ConvNHWC._depthwise_phased = spy
    try:
        xs = [(np.random.default_rng(seed).standard_normal((1, c, 40, 38)) * 10 ** seed).astype(np.float32)
              for seed in range(4)]
        for seed, x in enumerate(xs):
            got = fn(nhwc(x), w, b).transpose(0, 3, 1, 2)
            want = conv2d_direct(x, w, b, (2, 2), pads, c)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * 10 ** seed)
    finally:
        channels_last.ConvNHWC._depthwise_phased = real
    assert len(calls) == 4
    fresh = [kernel(w, b, strides=[2, 2], pads=list(pads))(nhwc(x), w, b) for x in xs]
    results = {}

    def worker(k):
        results[k] = [fn(nhwc(xs[(k + i) % 4]), w, b).copy() for i in range(12)]
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k, ys in results.items():
        for i, y in enumerate(ys):
            assert np.array_equal(y.view(np.uint32), fresh[(k + i) % 4].view(np.uint32))
