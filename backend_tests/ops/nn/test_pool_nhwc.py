"""The channels-last pool (ops/fused.py's PoolNHWC: a 2-D AveragePool / MaxPool on (N, H, W, C) data, run as
the pool over (H, W, C) with a kernel of 1 along C): bit for bit the NCHW kernel's values, which
test_ops_pool.py checks against the spec, for every attribute the pass forwards (but the average of a
window covering the whole map, which the NCHW kernel sums in another order)."""
from __future__ import annotations

import numpy as np
import pytest

from onnx_mini.errors import OnnxMiniError
from onnx_mini.ops.fused import fused_pool_nhwc
from onnx_mini.ops.nn.pool import average_pool_19, max_pool_10

RNG = np.random.default_rng(5)

CASES = [   # attributes of a 2-D pool
    dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),                  # ShuffleNet's shortcut
    dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1),
    dict(kernel_shape=[2, 3], strides=[2, 1], pads=[0, 1, 1, 0], ceil_mode=1),     # asymmetric, ceil_mode
    dict(kernel_shape=[3, 2], auto_pad="SAME_UPPER", strides=[2, 2]),
    dict(kernel_shape=[2, 2], dilations=[2, 1], strides=[1, 2]),
    dict(kernel_shape=[7, 7]),                                                      # one window: a global pool
    dict(kernel_shape=[1, 1], strides=[2, 2]),                                      # 1-sized kernel
]


def nhwc(a):
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1))


@pytest.mark.parametrize("attrs", CASES)
@pytest.mark.parametrize("op", ["AveragePool", "MaxPool"])
def test_values_are_the_nchw_pools_bit_for_bit(op, attrs):
    x = RNG.standard_normal((2, 5, 7, 7)).astype(np.float32)
    x[0, 1, 2, 3] = np.nan
    x[1, 4, 0, 0] = -np.inf
    if op == "MaxPool":
        attrs = {k: v for k, v in attrs.items() if k != "count_include_pad"}
        want = max_pool_10(**attrs)(x)[0]
    else:
        want = average_pool_19(**attrs)(x)
    keep = nhwc(x)
    got = fused_pool_nhwc(op=op, **attrs)(keep)
    assert got.dtype == want.dtype and got.shape == nhwc(want).shape
    if op == "AveragePool" and attrs["kernel_shape"] == [7, 7]:
        # one window over the whole map: the NCHW kernel sums it by one reduction (pairwise), here the taps
        # add in order: the same sum rounded in another order
        np.testing.assert_allclose(got, nhwc(want), rtol=1e-6, atol=1e-7)
    else:
        assert np.array_equal(got, nhwc(want), equal_nan=True)
    assert np.array_equal(keep, nhwc(x), equal_nan=True)        # the input untouched


def test_integer_max_pool():
    x = RNG.integers(-128, 128, (1, 3, 6, 5)).astype(np.int8)
    got = fused_pool_nhwc(op="MaxPool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])(nhwc(x))
    want = max_pool_10(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])(x)[0]
    assert got.dtype == np.int8 and np.array_equal(got, nhwc(want))


def test_bad_input_and_attributes():
    with pytest.raises(OnnxMiniError, match="4-D"):
        fused_pool_nhwc(op="MaxPool", kernel_shape=[2, 2])(np.zeros((1, 4, 4), np.float32))
    with pytest.raises(ValueError, match="2-D"):
        fused_pool_nhwc(op="MaxPool", kernel_shape=[2, 2, 2])
    with pytest.raises(ValueError, match="AveragePool or MaxPool"):
        fused_pool_nhwc(op="LpPool", kernel_shape=[2, 2])
