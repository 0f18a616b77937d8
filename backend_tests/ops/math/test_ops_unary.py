"""Spec tests for the element-wise unary math ops: Abs, Acos, Acosh, Asin, Asinh, Atan, Atanh, Ceil, Cos,
Cosh, Erf, Exp, Floor, Log, Neg, Reciprocal, Round, Sign, Sin, Sinh, Sqrt, Tan, Tanh (every version).

Expected values come from Python's math module applied element by element in float64 (the spec's
definition of each function), rounded once to the tested type, or are written by hand.
"""
from __future__ import annotations

import math
import re
import warnings

import numpy as np
import onnx.defs
import pytest

from onnx_mini.errors import InvalidNodeError
from onnx_mini.ops.math.unary import erf, erfc

from helpers import assert_same, np_type, run_op as run, type_matrix

RTOL = {"float16": 2e-3, "bfloat16": 1.6e-2, "float": 4e-7, "double": 1e-15}


def versions(op):
    return sorted(s.since_version for s in onnx.defs.get_all_schemas_with_history()
                  if s.name == op and s.domain == "")


def sign(v):
    return v if math.isnan(v) else float((v > 0) - (v < 0))


def round_half_even(v):
    return v if not math.isfinite(v) else float(round(v))   # Python's round: halves to even


# op -> (scalar function from the spec, float inputs in its domain (exact in bfloat16/float16), exact?)
# "exact" ops must agree bit for bit; the others within a rounding of the tested type.
WIDE = [-6.0, -2.5, -1.5, -1.0, -0.5, -0.25, 0.0, 0.25, 0.5, 1.0, 1.5, 2.5, 6.0]
UNIT = [-1.0, -0.75, -0.5, -0.25, 0.0, 0.25, 0.5, 0.75, 1.0]
OPS = {
    "Abs": (abs, WIDE, True),
    "Acos": (math.acos, UNIT, False),
    "Acosh": (math.acosh, [1.0, 1.25, 1.5, 2.0, 3.0, 10.0, 100.0], False),
    "Asin": (math.asin, UNIT, False),
    "Asinh": (math.asinh, WIDE, False),
    "Atan": (math.atan, WIDE, False),
    "Atanh": (math.atanh, UNIT[1:-1], False),
    "Ceil": (lambda v: float(math.ceil(v)), WIDE + [-0.75, 0.75, 3.125], True),
    "Cos": (math.cos, WIDE, False),
    "Cosh": (math.cosh, WIDE, False),
    "Erf": (math.erf, WIDE + [3.0, 4.5, -5.0], False),
    "Exp": (math.exp, WIDE, False),
    "Floor": (lambda v: float(math.floor(v)), WIDE + [-0.75, 0.75, 3.125], True),
    "Log": (math.log, [0.125, 0.25, 0.5, 1.0, 1.5, 2.0, 6.0, 100.0], False),
    "Neg": (lambda v: -v, WIDE, True),
    "Reciprocal": (lambda v: 1.0 / v, [-6.0, -2.0, -0.5, 0.25, 0.5, 1.0, 3.0, 8.0], False),
    "Round": (round_half_even, WIDE + [0.75, 2.25, -3.5, 4.5], True),
    "Sign": (sign, WIDE, True),
    "Sin": (math.sin, WIDE, False),
    "Sinh": (math.sinh, WIDE, False),
    "Sqrt": (math.sqrt, [0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 6.0, 100.0], False),
    "Tan": (math.tan, WIDE, False),
    "Tanh": (math.tanh, WIDE, False),
}
INT_VALUES = {"Abs": [-7, -2, -1, 0, 1, 5, 9], "Neg": [-7, -2, -1, 0, 1, 5, 9], "Sign": [-7, -2, -1, 0, 1, 5, 9],
              "Erf": [-9, -6, -2, -1, 0, 1, 3, 6, 40]}


def assert_close(got, exp, tname):
    assert type(got) is np.ndarray and got.dtype == exp.dtype and got.shape == exp.shape, \
        (type(got), got.dtype, exp.dtype, got.shape, exp.shape)
    np.testing.assert_allclose(got.astype(np.float64), exp.astype(np.float64), rtol=RTOL[tname], atol=1e-300)


def reference(op, x: np.ndarray) -> np.ndarray:
    fn = OPS[op][0]
    if x.dtype.kind in "iu":   # integers: the float result truncated toward 0, like a cast
        return np.array([int(fn(float(v))) for v in x.ravel()], dtype=x.dtype).reshape(x.shape)
    return np.array([fn(float(v)) for v in x.ravel()]).astype(x.dtype).reshape(x.shape)


def int_input(op, tname):
    values = INT_VALUES[op]
    if tname.startswith("uint"):
        values = [abs(v) for v in values]
    return np.array(values, dtype=np_type(tname)).reshape(len(values), 1)


PARAMS = [pytest.param(op, *p.values, id=f"{op}-{p.id}") for op in OPS for p in type_matrix(op, versions(op))]


@pytest.mark.parametrize("op,version,tname", PARAMS)
def test_every_version_and_type(op, version, tname):
    if np_type(tname).kind in "iu":
        x = int_input(op, tname)
        assert_same(run(op, version, [x]), reference(op, x))
        return
    x = np.array(OPS[op][1], dtype=np_type(tname)).reshape(1, -1)
    got, exp = run(op, version, [x]), reference(op, x)
    if OPS[op][2]:
        assert_same(got, exp)
    else:
        assert_close(got, exp, tname)


def test_every_version_has_a_case():
    listed = {(op, v) for op in OPS for v in versions(op)}
    assert len(listed) == len({(p.values[0], p.values[1]) for p in PARAMS}) == 55


LEGACY = [op for op in OPS if 1 in versions(op)]


@pytest.mark.parametrize("op", LEGACY)
def test_consumed_inputs_only_in_version_1(op):
    x = np.array([[0.5, 1.5], [2.0, 4.0]], dtype=np.float32)
    exp = run(op, 6, [x])
    assert_same(run(op, 1, [x], consumed_inputs=[0]), exp)
    assert_same(run(op, 1, [x]), exp)
    with pytest.raises(InvalidNodeError, match="consumed_inputs"):
        run(op, 6, [x], consumed_inputs=[0])


@pytest.mark.parametrize("op", ["Abs", "Sin", "Round", "Erf", "Sign"])
def test_unknown_attribute_is_rejected(op):
    with pytest.raises(InvalidNodeError, match=re.compile(r"unnamed node \(" + op + r".*'alpha'")):
        run(op, versions(op)[-1], [np.ones(3, np.float32)], alpha=1.0)


def test_round_halves_to_even():
    x = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 0.9, 2.3, -4.5, 0.49999997, -0.0, np.inf, -np.inf, np.nan],
                 dtype=np.float32)
    exp = np.array([0.0, 2.0, 2.0, -0.0, -2.0, 1.0, 2.0, -4.0, 0.0, -0.0, np.inf, -np.inf, np.nan], np.float32)
    for v in (11, 22):
        got = run("Round", v, [x])
        assert_same(got, exp)
        assert list(np.signbit(got)) == list(np.signbit(exp))


def test_sign_of_nan_zero_and_unsigned():
    assert_same(run("Sign", 13, [np.array([np.nan, -0.0, 0.0, -3e-38, 1e38], np.float32)]),
                np.array([np.nan, 0.0, 0.0, -1.0, 1.0], np.float32))
    assert_same(run("Sign", 13, [np.array([0, 1, 255], np.uint8)]), np.array([0, 1, 1], np.uint8))


def test_abs_unsigned_and_int_keep_type():
    assert_same(run("Abs", 13, [np.array([0, 7, 2**64 - 1], np.uint64)]), np.array([0, 7, 2**64 - 1], np.uint64))
    assert_same(run("Abs", 6, [np.array([-2**62, 3], np.int64)]), np.array([2**62, 3], np.int64))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_special_values():
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -1.0, 1000.0], np.float32)
    nan, inf = np.nan, np.inf
    cases = {
        "Reciprocal": [inf, -inf, 0.0, -0.0, nan, -1.0, 1e-3],
        "Log": [-inf, -inf, inf, nan, nan, nan, math.log(1000.0)],
        "Sqrt": [0.0, -0.0, inf, nan, nan, nan, math.sqrt(1000.0)],
        "Exp": [1.0, 1.0, inf, 0.0, nan, math.exp(-1.0), inf],
        "Tanh": [0.0, -0.0, 1.0, -1.0, nan, math.tanh(-1.0), 1.0],
        "Erf": [0.0, -0.0, 1.0, -1.0, nan, math.erf(-1.0), 1.0],
        "Neg": [-0.0, 0.0, -inf, inf, nan, 1.0, -1000.0],
        "Abs": [0.0, 0.0, inf, inf, nan, 1.0, 1000.0],
        "Floor": [0.0, -0.0, inf, -inf, nan, -1.0, 1000.0],
    }
    for op, exp in cases.items():
        got = run(op, versions(op)[-1], [x])
        np.testing.assert_allclose(got, np.array(exp, np.float32), rtol=1e-6, err_msg=op)
        assert got.dtype == np.float32


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("shape", [(), (0,), (2, 0, 3)])
def test_scalar_and_empty(op, shape):
    x = np.full(shape, OPS[op][1][-2], dtype=np.float32)
    assert_close(run(op, versions(op)[-1], [x]), reference(op, x), "float")


@pytest.mark.parametrize("tname", ["float16", "bfloat16"])
@pytest.mark.parametrize("op", ["Exp", "Tanh", "Sin", "Erf", "Atan", "Sqrt"])
def test_low_precision_types_on_a_dense_grid(op, tname):
    x = np.linspace(0.0625, 4, 257).astype(np_type(tname))
    assert_close(run(op, versions(op)[-1], [x]), reference(op, x), tname)


# -- erf / erfc: the shared vectorised implementation --------------------------------------------

GRID = np.concatenate([np.linspace(-7, 7, 14001), [0.46875, -0.46875, 4.0, -4.0, 1e-300, -1e-30, 26.0, -27.0]])


def test_erf_float64_matches_math_erf():
    exp = np.array([math.erf(v) for v in GRID])
    np.testing.assert_allclose(erf(GRID), exp, rtol=2e-15, atol=0)


def test_erfc_float64_matches_math_erfc_also_in_the_tail():
    exp = np.array([math.erfc(v) for v in GRID])
    np.testing.assert_allclose(erfc(GRID), exp, rtol=4e-15, atol=0)
    assert erfc(np.array(26.0)) == pytest.approx(math.erfc(26.0), rel=1e-13)   # ~5.7e-296, no cancellation


def test_erf_float32_is_computed_in_float32_to_a_few_ulp():
    x = GRID.astype(np.float32)
    exp = np.array([math.erf(float(v)) for v in x]).astype(np.float32)
    got = erf(x)
    assert got.dtype == np.float32
    np.testing.assert_array_less(np.abs(got - exp), 5 * np.spacing(np.abs(exp)) + 1e-45)


def test_erf_special_values_and_shapes():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = erf(np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1e308]))
        c = erfc(np.array([np.inf, -np.inf, np.nan, 40.0, -40.0]))
    assert_same(got, np.array([1.0, -1.0, np.nan, 0.0, -0.0, 1.0]))
    assert np.signbit(got[4])
    assert_same(c, np.array([0.0, 2.0, np.nan, 0.0, 2.0]))
    assert erf(np.float64(0.5)).shape == () and erf(np.zeros((0, 3))).shape == (0, 3)


def test_erf_op_on_large_tensors_runs_block_by_block():
    # more elements than one block, in a non-contiguous 2-D layout, both regions of the approximation
    x = np.linspace(-5, 5, 2 * 70001).reshape(2, -1)[:, ::2]
    got = run("Erf", 13, [x])
    exp = np.array([math.erf(v) for v in x.ravel()]).reshape(x.shape)
    np.testing.assert_allclose(got, exp, rtol=2e-15, atol=0)
    assert got.dtype == np.float64 and got.shape == x.shape


def test_erf_int_types_truncate():
    x = np.array([-9, -6, -1, 0, 1, 5, 6, 100], np.int32)
    assert_same(run("Erf", 9, [x]), np.array([-1, -1, 0, 0, 0, 0, 1, 1], np.int32))


@pytest.mark.parametrize("op", ["Abs", "Exp", "Erf", "Neg"])
def test_does_not_write_into_its_input(op):
    x = np.array([[-1.5, 0.25], [3.0, -0.0]], np.float32)
    x.setflags(write=False)          # run() also compares the inputs before/after
    run(op, versions(op)[-1], [x])
