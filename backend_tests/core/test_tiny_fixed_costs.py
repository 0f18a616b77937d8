"""Fixed per-call costs on tiny tensors: fp_errors_ignored (np.errstate's state, set more cheaply), the
fused Sigmoid of one element (computed between two buffers, not in place) and Gemm's one-element sum
with C compute what the general forms do, bit for bit, with no new warning."""
from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest

from onnx_mini.ops import fused
from onnx_mini.ops._common import fp_errors_ignored
from onnx_mini.ops.math.matmul import gemm_11

SPECIALS = np.array([-104.0, -100.0, -89.0, -88.8, -88.7, -87.3, -20.0, -1.5, -1e-45, -0.0, 0.0, 1e-45, 0.3,
                     17.0, 88.7, 89.0, 3.4e38, -3.4e38, np.inf, -np.inf, np.nan], np.float32)


def sigmoid_by_steps(v: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-v)), each step one rounding in v's type (the fused kernels' order), on a copy."""
    with np.errstate(over="ignore"):
        e = np.exp(np.negative(v))
    return np.reciprocal(e + v.dtype.type(1))


def test_fp_errors_ignored_sets_only_its_kinds_and_restores_the_state():
    big = np.array([100.0], np.float32)

    @fp_errors_ignored(over="ignore")
    def exp_then(x, other):
        r = np.exp(x)
        other()
        return r

    before = np.geterr()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert exp_then(big, lambda: None)[0] == np.inf            # overflow: no warning inside
        with pytest.raises(RuntimeWarning):
            np.exp(big)                                            # ... and warned again outside
        with np.errstate(invalid="raise"):                         # the caller's other settings hold inside
            with pytest.raises(FloatingPointError):
                exp_then(big, lambda: np.multiply(np.float32(0), np.float32(np.inf)))
            assert np.geterr()["invalid"] == "raise"               # restored after the exception
    assert np.geterr() == before
    assert exp_then.__name__ == "exp_then"

    seen = []                                                      # per thread: another thread keeps its state

    def other_thread():
        seen.append(np.geterr()["over"])
    exp_then(big, lambda: (t := threading.Thread(target=other_thread), t.start(), t.join()))
    assert seen == [before["over"]]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fused_gemm_sigmoid_of_one_element_is_the_stepwise_formula(dtype):
    run = fused.fused_gemm(activation="Sigmoid", _constants={})
    values = SPECIALS.astype(dtype)
    one, zero = np.ones((1, 1), dtype), np.zeros((1, 1), dtype)
    want = sigmoid_by_steps(values)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = np.array([run(np.array([[v]], dtype), one, zero)[0, 0] for v in values])
    assert got.dtype == dtype
    assert np.array_equal(got.view(f"u{got.itemsize}"), want.view(f"u{want.itemsize}"))
    at = list(SPECIALS).index
    assert got[at(np.float32(-3.4e38))] == 0 and got[at(np.inf)] == 1 and np.isnan(got[-1])
    if dtype == np.float32:                                        # exp(104) overflows float32: 1 / inf
        assert got[at(-104.0)] == 0
    # the many-element path: the same bits as the one-element path
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        many = run(values[:, None], one, zero)[:, 0]
    assert np.array_equal(many.view(f"u{got.itemsize}"), want.view(f"u{want.itemsize}"))


def test_fused_gemm_sigmoid_one_element_from_a_product_and_bias():
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((1, 64)).astype(np.float32), rng.standard_normal((64, 1)).astype(np.float32)
    c = np.array([0.25], np.float32)
    run = fused.fused_gemm(activation="Sigmoid", _constants={2: c})
    y = np.dot(a, b) + c.reshape(1, 1)
    got = run(a, b, c)
    assert got.shape == (1, 1) and got.tobytes() == sigmoid_by_steps(y).tobytes()
    assert c[0] == np.float32(0.25)                                # C untouched


@pytest.mark.parametrize("beta", [1.0, 2.0])
def test_gemm_one_element_sum_with_c(beta):
    a = np.array([[1.5, -2.0, 0.5]], np.float32)
    b = np.array([[2.0], [1.0], [4.0]], np.float32)              # a @ b = 3 - 2 + 2 = 3
    c = np.array([[0.75]], np.float32)
    got = gemm_11(beta=beta)(a, b, c)
    assert got.shape == (1, 1) and got[0, 0] == np.float32(3.0 + beta * 0.75)
    assert got is not c and c[0, 0] == np.float32(0.75)
    scalar_c = np.array(0.5, np.float32)                          # a 0-d C broadcasts to the product
    assert gemm_11()(a, b, scalar_c)[0, 0] == np.float32(3.5)
    ints = gemm_11(beta=beta)(np.array([[2, 3]], np.int32), np.array([[4], [5]], np.int32), np.array([[7]], np.int32))
    assert ints.dtype == np.int32 and ints[0, 0] == 23 + beta * 7


@pytest.mark.parametrize("beta", [1.0, 0.5])
def test_gemm_constant_1d_c_added_as_a_row(beta):
    """Gemm's kernel adds a constant 1-D C as [1, N]: the sums of C as given, checked as given."""
    from onnx_mini.errors import InvalidValueError
    a = np.array([[1.0, 2.0], [3.0, -1.0]], np.float32)
    b = np.array([[0.5, 1.0, -2.0], [4.0, 0.0, 1.0]], np.float32)     # a @ b = [[8.5, 1, 0], [-2.5, 3, -7]]
    c = np.array([1.0, -4.0, 0.25], np.float32)
    run = gemm_11(beta=beta, _constants={2: c})
    want = np.array([[8.5, 1.0, 0.0], [-2.5, 3.0, -7.0]], np.float32) + np.float32(beta) * c
    assert np.array_equal(run(a, b, c), want)
    assert np.array_equal(run(a, b, c.copy()), want)                  # C fed at run time
    assert c.tolist() == [1.0, -4.0, 0.25]
    wrong = np.ones(2, np.float32)
    with pytest.raises(InvalidValueError, match=r"C of shape \[2\] is not unidirectionally broadcastable"):
        gemm_11(_constants={2: wrong})(a, b, wrong)


def test_float_pow_warns_of_nothing_and_leaves_numpy_settings():
    from onnx_mini.ops.math.elementwise import _power
    x = np.array([-8.0, 10.0, 0.0, 2.0], np.float32)
    y = np.array([0.5, 50.0, -1.0, 3.0], np.float32)
    before = np.geterr()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = _power(x, y)                       # invalid, overflow, divide by zero, exact
    assert got.dtype == np.float32 and np.isnan(got[0]) and got[1:].tolist() == [np.inf, np.inf, 8.0]
    assert np.geterr() == before
