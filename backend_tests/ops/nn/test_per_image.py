"""nn/_common.per_image: a batch's images shared among the threads, each computed into its own slice;
images left over by whole rounds (one more than the threads) run afterwards on the calling thread,
whose products may then use every thread (blas.matmul), instead of one thread computing them alone."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from onnx_mini import parallel
from onnx_mini.ops.nn._common import per_image


@pytest.mark.parametrize("extra", [0, 1])
def test_images_in_whole_rounds_then_the_leftover_on_the_caller(extra):
    threads = parallel.threads()
    if threads < 2:
        pytest.skip("one thread: no rounds to share")
    n = 2 * threads + extra
    lock, order = threading.Lock(), []

    def compute(i, out):
        out[...] = i + np.arange(6, dtype=np.float32).reshape(1, 2, 3)
        with lock:
            order.append((i, threading.get_ident()))
    y = per_image(compute, (n, 2, 3), np.float32)
    np.testing.assert_array_equal(y, np.arange(n, dtype=np.float32)[:, None, None] + np.arange(6).reshape(2, 3))
    assert sorted(i for i, _ in order) == list(range(n))
    if extra:       # the leftover image last, on this thread
        assert order[-1] == (n - 1, threading.get_ident())
    assert len({t for _, t in order}) > 1          # the rounds were shared
