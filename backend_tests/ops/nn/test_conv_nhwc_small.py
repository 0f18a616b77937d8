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


def counted(monkeypatch, name):
    """ConvNHWC's method `name` wrapped to count its calls (restored after the test)."""
    calls, real = [], getattr(channels_last.ConvNHWC, name)

    def spy(self, *args):
        calls.append(1)
        return real(self, *args)
    monkeypatch.setattr(channels_last.ConvNHWC, name, spy)
    return calls


def growing(shape, c, count):
    """Inputs of growing magnitude: a border left holding an earlier X's values would change the edge
    outputs by far more than rounding."""
    return [(np.random.default_rng(seed).standard_normal((1, c, *shape)) * 10 ** seed).astype(np.float32)
            for seed in range(count)]


def check_each(fn, w, b, xs, strides, pads):
    for seed, x in enumerate(xs):
        got = fn(nhwc(x), w, b).transpose(0, 3, 1, 2)
        want = conv2d_direct(x, w, b, strides, pads, w.shape[0])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * 10 ** seed)


@pytest.mark.parametrize("strides,pads", [((1, 1), (1, 1, 1, 1)), ((2, 2), (1, 1, 1, 1)), ((1, 1), (0, 2, 1, 0))])
def test_repeated_calls_keep_the_padding_zero(monkeypatch, strides, pads):
    rng = np.random.default_rng(0)
    c = 8
    w = rng.standard_normal((c, 1, 3, 3)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    fn = kernel(w, b, strides=list(strides), pads=list(pads))
    calls = counted(monkeypatch, "_depthwise_small")
    check_each(fn, w, b, growing((9, 10), c, 3), strides, pads)
    assert len(calls) == 3          # the small path ran each time


def test_bit_identical_to_a_fresh_buffer_and_across_threads():
    """Repeated and concurrent calls give Y bit for bit as the first call on a new kernel does."""
    rng = np.random.default_rng(1)
    c = 24
    w = rng.standard_normal((c, 1, 3, 3)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    xs = [nhwc(rng.standard_normal((1, c, 28, 28)).astype(np.float32)) for _ in range(4)]
    want = [kernel(w, b, pads=[1, 1, 1, 1])(x, w, b) for x in xs]
    check_threads(kernel(w, b, pads=[1, 1, 1, 1]), w, b, xs, want, 40)


def check_threads(fn, w, b, xs, want, calls):
    """Three threads calling fn on the inputs xs in turn, `calls` each: every Y bit for bit as want's."""
    results = {}

    def worker(k):
        results[k] = [fn(xs[(k + i) % len(xs)], w, b).copy() for i in range(calls)]
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k, ys in results.items():
        for i, y in enumerate(ys):
            assert np.array_equal(y.view(np.uint32), want[(k + i) % len(xs)].view(np.uint32))


@pytest.mark.parametrize("pads", [(1, 1, 1, 1), (0, 2, 1, 0)])
def test_phases_kept_per_thread(monkeypatch, pads):
    """The strided depthwise path's column phases (ConvNHWC._depthwise_phased) below
    DW_READ_ROWS_MIN_BYTES are kept per thread and shape, their zeros written once: repeated calls of
    growing magnitude against Conv's definition, and concurrent calls bit for bit as a new kernel's."""
    rng = np.random.default_rng(2)
    c = 8
    w = rng.standard_normal((c, 1, 3, 3)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    fn = kernel(w, b, strides=[2, 2], pads=list(pads))
    calls = counted(monkeypatch, "_depthwise_phased")
    xs = growing((40, 38), c, 4)
    check_each(fn, w, b, xs, (2, 2), pads)
    assert len(calls) == 4
    xs = [nhwc(x) for x in xs]
    check_threads(fn, w, b, xs, [kernel(w, b, strides=[2, 2], pads=list(pads))(x, w, b) for x in xs], 12)
