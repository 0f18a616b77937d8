"""Spec tests for Dropout, Flatten and Shrink, every version and every type of each version's type
constraints. Expected values are written by hand or computed with plain formulas from the spec."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest

from onnx_mini.errors import InvalidNodeError, KernelError

from helpers import FP4, NODE, assert_same, np_type, run_node, sample, type_params

DROPOUT_ATTR_VERSIONS = [1, 6, 7, 10]
DROPOUT_INPUT_VERSIONS = [12, 13, 22]


def node_error(kind, pattern: str):
    return pytest.raises(kind, match=re.compile(f"{NODE}.*{pattern}", re.S))


# -- Dropout -------------------------------------------------------------------------------------

def old_attrs(version: int) -> dict:
    return {"is_test": 1} if version < 7 else {}


@pytest.mark.parametrize("version,tname", type_params("Dropout", DROPOUT_ATTR_VERSIONS + DROPOUT_INPUT_VERSIONS))
def test_dropout_inference_every_type(version, tname):
    x = sample(tname, (2, 3, 4))
    mask_type = np.bool_ if version >= 10 else np_type(tname)     # before 10 the mask has X's type
    assert_same(run_node("Dropout", version, [x], **old_attrs(version)), x)
    y, mask = run_node("Dropout", version, [x], 2, **old_attrs(version))
    assert_same(y, x)
    assert_same(mask, np.ones(x.shape, mask_type))


@pytest.mark.parametrize("version", DROPOUT_INPUT_VERSIONS)
def test_dropout_12_inference_ignores_ratio(version):
    x = np.arange(-3, 3, dtype=np.float32).reshape(2, 3)
    for extra in ([np.array(0.7, np.float32)], [np.array(0.7, np.float32), np.array(False)],
                  [None, np.array(False)], [np.array(2.0, np.float32), np.array([False])]):
        y, mask = run_node("Dropout", version, [x, *extra], 2, seed=3)
        assert_same(y, x)
        assert_same(mask, np.ones(x.shape, bool))


def expected_training(x, ratio, seed):
    """The spec: output = scale * data * mask, scale = 1 / (1 - ratio); a value is kept when its uniform
    draw in [0, 1) (RandomState(seed), as the official data) is >= ratio."""
    keep = np.random.RandomState(seed).uniform(0, 1, x.shape) >= ratio
    return x.astype(np.float64) * keep / (1 - ratio), keep


@pytest.mark.parametrize("version,tname", type_params("Dropout", DROPOUT_INPUT_VERSIONS))
def test_dropout_training_every_type(version, tname):
    x = sample(tname, (4, 5))                   # FP4 values: exact times 2 in every type
    ratio = np.array(0.5).astype(np_type(tname))
    y, mask = run_node("Dropout", version, [x, ratio, np.array(True)], 2, seed=5)
    ey, keep = expected_training(x, 0.5, 5)
    assert_same(mask, keep)
    assert_same(y, ey.astype(np_type(tname)))
    assert 0 < keep.sum() < keep.size           # a real mix of kept and dropped values


@pytest.mark.parametrize("tname", ["float16", "double"])
@pytest.mark.parametrize("version", DROPOUT_INPUT_VERSIONS)
def test_dropout_training_ratio_types(version, tname):
    x = np.linspace(-2, 2, 30, dtype=np.float32).reshape(5, 6)
    y, mask = run_node("Dropout", version, [x, np.array(0.75, np_type(tname)), np.array(True)], 2, seed=0)
    ey, keep = expected_training(x, 0.75, 0)
    assert_same(mask, keep)
    np.testing.assert_allclose(y, ey, rtol=1e-6)
    assert y.dtype == np.float32


def test_dropout_training_defaults_and_seeding():
    x = np.ones((50, 40), np.float32)
    # no ratio given: 0.5; without a seed the draws differ from run to run of new models
    y, mask = run_node("Dropout", 22, [x, None, np.array(True)], 2)
    assert set(np.unique(y).tolist()) <= {0.0, 2.0}
    assert_same(y, np.where(mask, 2.0, 0.0).astype(np.float32))
    assert 800 < mask.sum() < 1200
    y2 = run_node("Dropout", 22, [x, None, np.array(True)])
    assert not np.array_equal(y, y2)
    # the same seed gives the same mask
    a = run_node("Dropout", 22, [x, np.array(0.3, np.float32), np.array(True)], seed=11)
    b = run_node("Dropout", 22, [x, np.array(0.3, np.float32), np.array(True)], seed=11)
    assert_same(a, b)
    # ratio 0 in training: a copy of the input and an all-kept mask
    y, mask = run_node("Dropout", 22, [x, np.array(0.0, np.float32), np.array(True)], 2)
    assert_same(y, x)
    assert_same(mask, np.ones(x.shape, bool))


def test_dropout_training_nan_and_empty():
    x = np.array([np.nan] * 8, np.float32)
    y = run_node("Dropout", 13, [x, np.array(0.5, np.float32), np.array(True)], seed=1)
    assert np.isnan(y).all()                     # scale * NaN * mask stays NaN
    y, mask = run_node("Dropout", 13, [np.zeros((0, 3), np.float32), np.array(0.5, np.float32), np.array(True)], 2)
    assert y.shape == mask.shape == (0, 3) and mask.dtype == bool


@pytest.mark.parametrize("version", [1, 6])
def test_dropout_old_training_mode(version):
    """is_test=0 (the default) before opset 7 is training: random, scaled, mask of X's type."""
    x = np.full((30, 30), 3.0, np.float32)
    y, mask = run_node("Dropout", version, [x], 2, ratio=0.25)
    assert mask.dtype == np.float32 and set(np.unique(mask).tolist()) == {0.0, 1.0}
    np.testing.assert_allclose(y, x * mask / 0.75, rtol=1e-6)
    assert 600 < mask.sum() < 750


def test_dropout_7_10_have_no_training():
    x = np.arange(6, dtype=np.float32)
    for version in (7, 10):
        assert_same(run_node("Dropout", version, [x], ratio=0.9), x)


def test_dropout_errors():
    x = np.ones((2, 2), np.float32)
    for bad in (1.0, -0.1):
        with node_error(KernelError, "ratio"):
            run_node("Dropout", 22, [x, np.array(bad, np.float32), np.array(True)])
    with node_error(KernelError, "scalar"):
        run_node("Dropout", 22, [x, np.array([0.1, 0.2], np.float32), np.array(True)])
    with node_error(InvalidNodeError, "ratio"):
        run_node("Dropout", 6, [x], ratio=1.5)
    with node_error(InvalidNodeError, "is_test"):
        run_node("Dropout", 7, [x], is_test=1)


# -- Flatten -------------------------------------------------------------------------------------

FLATTEN_VERSIONS = [1, 9, 11, 13, 21, 23, 24, 25]


@pytest.mark.parametrize("version,tname", type_params("Flatten", FLATTEN_VERSIONS))
def test_flatten_every_type(version, tname):
    x = sample(tname, (2, 3, 4))
    got = run_node("Flatten", version, [x])
    assert_same(got, x.reshape(2, 12))
    assert_same(run_node("Flatten", version, [x], axis=2), x.reshape(6, 4))


FLATTEN_CASES = [  # (shape, axis, expected shape)
    ((2, 3, 4, 5), 0, (1, 120)), ((2, 3, 4, 5), 1, (2, 60)), ((2, 3, 4, 5), 3, (24, 5)),
    ((2, 3, 4, 5), 4, (120, 1)), ((2, 3, 4, 5), -1, (24, 5)), ((2, 3, 4, 5), -4, (1, 120)),
    ((2, 3, 4, 5), -2, (6, 20)), ((5,), 1, (5, 1)), ((5,), 0, (1, 5)), ((), 0, (1, 1)),
    ((2, 0, 3), 1, (2, 0)), ((2, 0, 3), 2, (0, 3)), ((0, 4), -1, (0, 4)),
]


@pytest.mark.parametrize("version,shape,axis,expected",
                         [(v, *c) for v in FLATTEN_VERSIONS for c in FLATTEN_CASES if v >= 11 or c[1] >= 0])
def test_flatten_cases(version, shape, axis, expected):   # negative axes come with opset 11
    x = np.arange(math.prod(shape), dtype=np.float32).reshape(shape)
    got = run_node("Flatten", version, [x], axis=axis)
    assert_same(got, x.reshape(expected))     # row-major order


def test_flatten_is_a_view_and_errors():
    import onnx_mini.ops.nn.misc as misc
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    out = misc.flatten_11(axis=-1)(x)
    assert np.shares_memory(out, x) and out.shape == (6, 4)
    with node_error(KernelError, "out of range"):
        run_node("Flatten", 13, [x], axis=4)
    with node_error(KernelError, "out of range"):
        run_node("Flatten", 13, [x], axis=-4)
    with node_error(KernelError, "out of range"):
        run_node("Flatten", 9, [x], axis=5)
    with node_error(InvalidNodeError, "axis"):
        run_node("Flatten", 9, [x], axis=-1)


# -- Shrink --------------------------------------------------------------------------------------

@pytest.mark.parametrize("version,tname", type_params("Shrink", [9]))
def test_shrink_every_type(version, tname):
    dt = np_type(tname)
    if dt.kind in "iu":
        x = np.arange(0, 7, dtype=dt) if dt.kind == "u" else np.arange(-3, 4, dtype=dt)
        # lambd 1.5 -> 1 and bias 1.0 in X's type: x < -1 -> x + 1, x > 1 -> x - 1, else 0
        exp = [0, 0, 1, 2, 3, 4, 5] if dt.kind == "u" else [-2, -1, 0, 0, 0, 1, 2]
        assert_same(run_node("Shrink", 9, [x], lambd=1.5, bias=1.0), np.array(exp, dt))
    else:
        x = np.array(FP4, dt)
        exp = [v + 1 if v < -1.5 else v - 1 if v > 1.5 else 0 for v in FP4]
        assert_same(run_node("Shrink", 9, [x], lambd=1.5, bias=1.0), np.array(exp, dt))


def test_shrink_defaults_and_edges():
    x = np.array([-2.0, -0.5, -0.25, 0.0, 0.5, 0.75, np.nan, np.inf, -np.inf], np.float32)
    # lambd 0.5, bias 0: hard shrink; |x| == lambd gives 0
    exp = np.array([-2.0, 0.0, 0.0, 0.0, 0.0, 0.75, 0.0, np.inf, -np.inf], np.float32)
    assert_same(run_node("Shrink", 9, [x]), exp)
    # soft shrink from the spec example
    x = np.arange(-2.0, 2.1, dtype=np.float32)
    assert_same(run_node("Shrink", 9, [x], lambd=1.5, bias=1.5), np.array([-0.5, 0, 0, 0, 0.5], np.float32))
    # integer arithmetic wraps in the input type
    x = np.array([-128, 127, 0], np.int8)
    assert_same(run_node("Shrink", 9, [x], lambd=0.0, bias=2.0), np.array([-126, 125, 0], np.int8))
    assert_same(run_node("Shrink", 9, [x], lambd=0.0, bias=-2.0), np.array([126, -127, 0], np.int8))
    assert_same(run_node("Shrink", 9, [np.zeros((0, 2), np.float32)]), np.zeros((0, 2), np.float32))
