"""Spec tests for the activations: Celu, Elu, Gelu, HardSigmoid, HardSwish, LeakyRelu, Mish, PRelu, Relu,
Selu, Sigmoid, Softplus, Softsign, Swish, SwiGLU, ThresholdedRelu (every version).

Expected values are the formulas of the spec text, evaluated element by element in float64 with
Python's math module, rounded once to the tested type (or written by hand).
"""
from __future__ import annotations

import inspect
import math
import re
import warnings

import numpy as np
import onnx.defs
import pytest

from onnx_mini import catalog
from onnx_mini import registry
from onnx_mini.errors import InvalidNodeError, KernelError
from onnx_mini.ops._common import scalar_array, with_scalar

from helpers import assert_same, np_type, run_op as run, sample, type_matrix

RTOL = {"float16": 2e-3, "bfloat16": 1.6e-2, "float": 1e-6, "double": 1e-14}


def versions(op):
    return sorted(s.since_version for s in onnx.defs.get_all_schemas_with_history()
                  if s.name == op and s.domain == "")


def f32(v):
    return float(np.float32(v))


def sigmoid(v):
    return 1 / (1 + math.exp(-v)) if v >= 0 else math.exp(v) / (1 + math.exp(v))


def expm1(v):
    return math.expm1(v) if v < 709 else math.inf


def gelu_tanh(v):
    two_u = 2 * math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)
    return v / (1 + math.exp(-two_u)) if -two_u < 709 else math.copysign(0.0, v)


def softplus(v):
    return max(v, 0.0) + math.log1p(math.exp(-abs(v)))


# op -> formula(v, **attributes) from the spec text; defaults are the schema's (float32) values.
FORMULAS = {
    "Celu": lambda v, alpha=1.0: max(0.0, v) + min(0.0, alpha * expm1(v / alpha)),
    "Elu": lambda v, alpha=1.0: v if v >= 0 else alpha * math.expm1(v),
    # 0.5 * x * (1 + erf(x / sqrt(2))), written with erfc = 1 - erf so that float64 keeps the tail;
    # 0.5 * x * (1 + tanh(u)) as x / (1 + exp(-2u)), the same function without 1 + tanh(u)'s cancellation
    "Gelu": lambda v, approximate="none": 0.5 * v * math.erfc(-v / math.sqrt(2)) if approximate == "none"
    else gelu_tanh(v),
    "HardSigmoid": lambda v, alpha=f32(0.2), beta=0.5: max(0.0, min(1.0, alpha * v + beta)),
    "HardSwish": lambda v: v * max(0.0, min(1.0, v / 6 + 0.5)),
    "LeakyRelu": lambda v, alpha=f32(0.01): v if v >= 0 else alpha * v,
    "Mish": lambda v: v * math.tanh(softplus(v)),
    "Relu": lambda v: max(v, 0),
    "Selu": lambda v, alpha=f32(1.6732632423543772), gamma=f32(1.0507009873554805):
    gamma * v if v > 0 else gamma * alpha * math.expm1(v),   # alpha * e^x - alpha, without cancellation
    "Sigmoid": sigmoid,
    "Softplus": softplus,
    "Softsign": lambda v: v / (1 + abs(v)),
    "Swish": lambda v, alpha=1.0: v * sigmoid(alpha * v),
    "ThresholdedRelu": lambda v, alpha=1.0: v if v > alpha else 0.0,
}
SELU_1 = {"alpha": f32(1.6732), "gamma": f32(1.0507)}   # version 1 has other defaults


def reference(op, x, **attrs):
    fn = FORMULAS[op]
    if op == "Selu" and attrs.pop("_v1", False):
        attrs = {**SELU_1, **attrs}
    flat = [fn(float(v), **attrs) for v in x.ravel()]
    if x.dtype.kind in "iu":
        return np.array(flat, dtype=x.dtype).reshape(x.shape)
    return np.array(flat).astype(x.dtype).reshape(x.shape)


def assert_close(got, exp, tname="float"):
    assert type(got) is np.ndarray and got.dtype == exp.dtype and got.shape == exp.shape, \
        (type(got), got.dtype, exp.dtype, got.shape, exp.shape)
    np.testing.assert_allclose(got.astype(np.float64), exp.astype(np.float64), rtol=RTOL.get(tname, 0),
                               atol=1e-7 if tname != "double" else 1e-300)


VALUES = [-6.0, -3.0, -2.0, -1.5, -1.0, -0.5, -0.25, 0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 6.0]


def float_input(tname):
    return np.array(VALUES, dtype=np_type(tname)).reshape(3, 5)


PARAMS = [pytest.param(op, *p.values, id=f"{op}-{p.id}") for op in FORMULAS for p in type_matrix(op, versions(op))]


@pytest.mark.parametrize("op,version,tname", PARAMS)
def test_every_version_and_type(op, version, tname):
    if np_type(tname).kind in "iu":      # Relu-14
        x = sample(tname, (3, 7))
        assert_same(run(op, version, [x]), reference(op, x))
        return
    x = float_input(tname)
    exp = reference(op, x, **({"_v1": True} if op == "Selu" and version == 1 else {}))
    assert_close(run(op, version, [x]), exp, tname)


def prelu_ref(x, slope):
    slope = np.broadcast_to(slope, x.shape)
    return np.array([v if v >= 0 else s * v for v, s in zip(x.ravel().tolist(), slope.ravel().tolist())],
                    dtype=x.dtype).reshape(x.shape)


@pytest.mark.parametrize("version,tname", type_matrix("PRelu", versions("PRelu")))
def test_prelu_every_version_and_type(version, tname):
    dt = np_type(tname)
    if dt.kind in "iu":
        x = np.array([[-3, 0, 2, 5], [7, -1, -8, 1]] if dt.kind == "i" else [[3, 0, 2, 5], [7, 1, 8, 1]], dtype=dt)
        slope = np.array([[2, 3, 0, 1], [1, 5, 2, 4]], dtype=dt)
        assert_same(run("PRelu", version, [x, slope]), prelu_ref(x, slope))
        return
    x = float_input(tname)
    slope = np.array([0.25, -0.5, 2.0, 0.0, 1.5] * 3, dtype=dt).reshape(3, 5)
    assert_close(run("PRelu", version, [x, slope]), prelu_ref(x, slope), tname)


SWIGLU_A = [[1.0, -2.0, 3.0, 4.0], [-1.0, 2.0, -3.0, 0.5]]
SWIGLU_B = [[0.5, 1.0, -1.0, 2.0], [2.0, -1.0, 0.5, 1.0]]


@pytest.mark.parametrize("version,tname", type_matrix("SwiGLU", versions("SwiGLU")))
@pytest.mark.parametrize("alpha", [None, 0.5, -1.5])
def test_swiglu_every_type(version, tname, alpha):
    a, b = (np.array(v, dtype=np_type(tname)) for v in (SWIGLU_A, SWIGLU_B))
    attrs = {} if alpha is None else {"alpha": alpha}
    swish = reference("Swish", a, **attrs).astype(np.float64)
    exp = (swish * b.astype(np.float64)).astype(a.dtype)
    assert_close(run("SwiGLU", version, [a, b], **attrs), exp, tname)


def test_every_version_is_tested():
    tested = {(op, v) for op, v, _ in (p.values for p in PARAMS)} | {("PRelu", v) for v in versions("PRelu")} \
        | {("SwiGLU", 28)}
    for op in list(FORMULAS) + ["PRelu", "SwiGLU"]:
        for v in versions(op):
            assert (op, v) in tested
            assert ("", op, v) in catalog.registered(), (op, v)


# -- attributes ------------------------------------------------------------------------------------

def _default(a):
    """The default of an onnx attribute schema as a Python value (None when it has none)."""
    d = a.default_value
    if not d.name:
        return None
    return {1: d.f, 2: d.i, 3: d.s.decode()}.get(d.type, None)


@pytest.mark.parametrize("op", list(FORMULAS) + ["PRelu", "SwiGLU"])
def test_factories_declare_exactly_the_schema_attributes_and_defaults(op):
    for v in versions(op):
        spec = catalog.registered()[("", op, v)]
        schema = onnx.defs.get_schema(op, v)
        assert spec.attributes == set(schema.attributes), (op, v)
        params = inspect.signature(spec.factory).parameters
        for name, a in schema.attributes.items():
            default = params[name].default
            assert default == _default(a) or (default is None and _default(a) is None), (op, v, name)
            assert default is not inspect.Parameter.empty, (op, v, name)   # no ONNX attribute here is required


ATTR_CASES = [  # (op, versions, attributes)
    ("Celu", (12, 28), {"alpha": 2.0}), ("Celu", (12, 28), {"alpha": 0.5}), ("Celu", (28,), {"alpha": -1.5}),
    ("Elu", (1, 6, 22), {"alpha": 2.5}), ("Elu", (6, 22), {"alpha": 0.0}), ("Elu", (22,), {"alpha": -1.0}),
    ("Gelu", (20,), {"approximate": "tanh"}), ("Gelu", (20,), {"approximate": "none"}),
    ("HardSigmoid", (1, 6, 22), {"alpha": 0.5, "beta": 0.25}), ("HardSigmoid", (22,), {"alpha": -0.3}),
    ("LeakyRelu", (1, 6, 16), {"alpha": 0.1}), ("LeakyRelu", (16,), {"alpha": 1.0}),
    ("LeakyRelu", (6, 16), {"alpha": 2.5}), ("LeakyRelu", (16,), {"alpha": -0.5}),
    ("LeakyRelu", (16,), {"alpha": -3.0}),
    ("Selu", (1, 6, 22), {"alpha": 2.0, "gamma": 3.0}), ("Selu", (6,), {"gamma": 0.5}),
    ("Swish", (24,), {"alpha": 0.5}), ("Swish", (24,), {"alpha": -2.0}), ("Swish", (24,), {"alpha": 0.0}),
    ("ThresholdedRelu", (10, 22), {"alpha": 0.5}), ("ThresholdedRelu", (10, 22), {"alpha": -1.0}),
    ("ThresholdedRelu", (22,), {"alpha": 0.0}), ("ThresholdedRelu", (22,), {"alpha": 2.5}),
]


@pytest.mark.parametrize("op,vs,attrs", ATTR_CASES)
@pytest.mark.parametrize("tname", ["float", "double"])
def test_attributes(op, vs, attrs, tname):
    x = float_input(tname)
    for v in vs:
        extra = {"_v1": True} if op == "Selu" and v == 1 else {}
        as_onnx = {k: f32(a) if isinstance(a, float) else a for k, a in attrs.items()}  # float attributes are float32
        assert_close(run(op, v, [x], **attrs), reference(op, x, **as_onnx, **extra), tname)


def test_thresholded_relu_negative_alpha_gives_positive_zeros():
    got = run("ThresholdedRelu", 22, [np.array([-3.0, -1.0, -0.5, 0.5], np.float32)], alpha=-1.0)
    assert_same(got, np.array([0.0, 0.0, -0.5, 0.5], np.float32))
    assert not np.signbit(got[:2]).any()


@pytest.mark.parametrize("alpha,exp", [(math.inf, [0.0, 0.0, 0.0, 0.0]), (-math.inf, [0.0, -1.0, 0.0, math.inf])])
def test_thresholded_relu_infinite_alpha(alpha, exp):
    x = np.array([-math.inf, -1.0, math.nan, math.inf], np.float32)
    assert_same(run("ThresholdedRelu", 22, [x], alpha=alpha), np.array(exp, np.float32))


LEGACY = ["Elu", "HardSigmoid", "LeakyRelu", "PRelu", "Relu", "Selu", "Sigmoid"]


@pytest.mark.parametrize("op", LEGACY)
def test_consumed_inputs_only_in_version_1(op):
    x = float_input("float")
    inputs = [x, np.array([0.5], np.float32)] if op == "PRelu" else [x]
    exp = run(op, 1, inputs)
    assert_same(run(op, 1, inputs, consumed_inputs=[0]), exp)
    with pytest.raises(InvalidNodeError, match="consumed_inputs"):
        run(op, 6, inputs, consumed_inputs=[0])


@pytest.mark.parametrize("op,version,attrs", [
    ("Relu", 14, {"alpha": 1.0}), ("Softplus", 22, {"alpha": 1.0}), ("HardSwish", 22, {"alpha": 0.5}),
    ("Mish", 22, {"beta": 1.0}), ("Sigmoid", 13, {"alpha": 2.0}), ("Gelu", 20, {"alpha": 1.0}),
    ("Celu", 12, {"gamma": 1.0}), ("Swish", 24, {"beta": 1.0}),
])
def test_attributes_outside_the_schema_are_rejected(op, version, attrs):
    with pytest.raises(InvalidNodeError, match=re.compile(rf"unnamed node \({op}.*{next(iter(attrs))}")):
        run(op, version, [np.ones(3, np.float32)], **attrs)


def test_bad_attribute_values_name_the_node():
    with pytest.raises(InvalidNodeError, match=r"unnamed node \(Gelu.*approximate"):
        run("Gelu", 20, [np.ones(3, np.float32)], approximate="erf")
    with pytest.raises(InvalidNodeError, match=r"unnamed node \(Celu.*alpha"):
        run("Celu", 12, [np.ones(3, np.float32)], alpha=0.0)


# -- large, small and special values ---------------------------------------------------------------

EXTREMES = [-1e4, -800.0, -100.0, -30.0, -20.0, -1e-30, 0.0, 1e-30, 20.0, 30.0, 100.0, 800.0, 1e4]


@pytest.mark.parametrize("op", ["Sigmoid", "Softplus", "Mish", "Swish", "Elu", "Selu", "Celu", "Gelu",
                                "Softsign", "HardSwish", "HardSigmoid", "LeakyRelu"])
@pytest.mark.parametrize("tname", ["float", "double", "float16"])
def test_extremes_neither_overflow_nor_warn(op, tname):
    dt = np_type(tname)
    with np.errstate(over="ignore"):
        x = np.array(EXTREMES, dtype=dt)
    x = x[np.isfinite(x)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = run(op, versions(op)[-1], [x])
    exp = reference(op, x)
    assert np.isfinite(got).all()
    # relative accuracy wherever the result is a normal number (e.g. sigmoid(-100) = 3.7e-44 in double)
    tiny = {"float": 1.2e-38, "double": 2.3e-308, "float16": 6.2e-5}[tname]
    np.testing.assert_allclose(got.astype(np.float64), exp.astype(np.float64), rtol=RTOL[tname], atol=tiny)


def test_sigmoid_softplus_mish_tails_by_hand():
    x = np.array([-1000.0, -100.0, -40.0, 40.0, 100.0, 1000.0])
    np.testing.assert_allclose(run("Sigmoid", 13, [x]), [0.0, math.exp(-100), math.exp(-40) / (1 + math.exp(-40)),
                                                          1 / (1 + math.exp(-40)), 1.0, 1.0], rtol=1e-15)
    np.testing.assert_allclose(run("Softplus", 22, [x]), [0.0, math.exp(-100), math.log1p(math.exp(-40)),
                                                           40 + math.log1p(math.exp(-40)), 100.0, 1000.0],
                               rtol=1e-15)
    np.testing.assert_allclose(run("Mish", 22, [x]), [-0.0, -100 * math.exp(-100), -40 * math.exp(-40), 40.0, 100.0,
                                                       1000.0], rtol=1e-12)
    # Gelu's left tail 0.5 * x * erfc(-x / sqrt(2)) keeps its relative precision
    g = run("Gelu", 20, [np.array([-10.0, -20.0])])
    np.testing.assert_allclose(g, [-5 * math.erfc(10 / math.sqrt(2)), -10 * math.erfc(20 / math.sqrt(2))], rtol=1e-13)


@pytest.mark.parametrize("tname", ["float", "double"])
def test_gelu_tanh_left_tail_keeps_its_precision(tname):
    """Against FORMULAS' quotient x / (1 + exp(-2u)) in float64, which keeps the tail where 1 + tanh(u)
    cancels (float32: to 0 or a multiple of 2^-24 below x ~ -5); with exp(-2u) past the type's range
    the result is -0 without a warning."""
    xs = [-4.0, -5.5, -7.0, -9.0, -10.5] + ([-11.0, -30.0] if tname == "float" else [-25.0, -40.0])
    x = np.array(xs, np_type(tname))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = run("Gelu", 20, [x], approximate="tanh")
    want = [gelu_tanh(float(v)) for v in x]
    # float32: the argument's own rounding (|2u| ~ 100 times a few ulp) bounds the relative error;
    # relative accuracy wherever the result is a normal number (x = -10.5: -7.4e-43 in float32's
    # subnormals, where exp(-2u) = e^99 is already past its range: -0)
    rtol, tiny = {"float": (2e-4, 1.2e-38), "double": (1e-12, 2.3e-308)}[tname]
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=rtol, atol=tiny)
    assert np.signbit(got[-1]) and (got[:4] < 0).all()


@pytest.mark.parametrize("op", list(FORMULAS))
def test_nan_propagates(op):
    x = np.array([math.nan, 1.0, -1.0], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = run(op, versions(op)[-1], [x])
    # ThresholdedRelu's body is Where(Less(alpha, X), X, 0): NaN is not above alpha, so 0
    assert (got[0] == 0) if op == "ThresholdedRelu" else math.isnan(got[0])
    assert_close(got[1:], reference(op, x[1:]))


def test_infinities():
    x = np.array([-math.inf, math.inf], np.float32)
    expected = {"Relu": [0, math.inf], "Sigmoid": [0, 1], "Softplus": [0, math.inf], "Elu": [-1, math.inf],
                "HardSigmoid": [0, 1], "LeakyRelu": [-math.inf, math.inf], "Swish": [math.nan, math.inf],
                "Gelu": [math.nan, math.inf], "ThresholdedRelu": [0, math.inf], "Celu": [-1, math.inf]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for op, exp in expected.items():
            assert_same(run(op, versions(op)[-1], [x]), np.array(exp, np.float32))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("size", [1023, 1024, 65536, 65537, 3 * 65536 + 5])
def test_max_and_min_against_a_constant_are_numpys_bit_for_bit(dtype, size):
    # with_scalar lays the constant out as a run (numpy's fast loops); the result must be numpy's own,
    # signed zeros and NaN included, whether new, in place, or on a strided view
    rng = np.random.default_rng(size)
    x = rng.standard_normal(size).astype(dtype)
    x[rng.integers(0, size, 40)] = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 6.0, -1.5] * 5, dtype)
    bits = np.int32 if dtype == np.float32 else np.int64
    for ufunc, v in ((np.maximum, 0), (np.minimum, 6), (np.maximum, -1.5), (np.maximum, -0.0), (np.minimum, 0)):
        want = ufunc(x, dtype(v)).view(bits)
        assert np.array_equal(with_scalar(ufunc, x, v).view(bits), want)
        y = x.copy()
        assert with_scalar(ufunc, y, v, out=y) is y and np.array_equal(y.view(bits), want)
        assert np.array_equal(with_scalar(ufunc, x[::2], v).view(bits), want[::2])
        assert np.array_equal(with_scalar(ufunc, x[: size // 8 * 8].reshape(8, -1), v).view(bits),
                              want[: size // 8 * 8].reshape(8, -1))


def test_constant_runs_are_kept_apart_by_value_type_and_nan():
    # the runs with_scalar keeps are found by the constant's type and text: a float32 0.1 is not a
    # float64 0.1 in a float64 run, and a NaN constant finds its own run again
    x = np.random.default_rng(3).standard_normal(5000)
    for v in (np.float32(0.1), 0.1, np.float32(0.1)):
        assert np.array_equal(with_scalar(np.minimum, x, v), np.minimum(x, np.float64(v)))
    for _ in range(2):
        assert np.isnan(with_scalar(np.maximum, x, float("nan"))).all()


def test_small_tensors_get_the_constant_as_a_kept_0d_array():
    # below 1024 values with_scalar hands numpy the constant as a read-only 0-d array of x's type, kept by
    # the constant's type and value (scalar_array): -0.0 apart from 0.0, a float32 0.1 apart from 0.1,
    # NaN found again; the results are numpy's own with the constant as a scalar of x's type
    x = np.array([-0.0, 0.0, np.nan, 0.1, -2.0, 3.0])
    for ufunc, v in ((np.minimum, np.float32(0.1)), (np.minimum, 0.1), (np.maximum, float("nan")),
                     (np.maximum, 0), (np.minimum, 1), (np.minimum, True)):
        for _ in range(2):          # made, then found
            assert np.array_equal(with_scalar(ufunc, x, v).view(np.int64), ufunc(x, np.float64(v)).view(np.int64))
    f32 = np.dtype(np.float32)
    s = scalar_array(f32, 1.5)
    assert s.shape == () and s.dtype == f32 and s == 1.5 and not s.flags.writeable
    assert scalar_array(f32, 1.5) is s and scalar_array(np.dtype(np.float64), 1.5) is not s
    assert not np.signbit(scalar_array(f32, 0.0)) and np.signbit(scalar_array(f32, -0.0))
    assert scalar_array(f32, 1) == 1 and scalar_array(np.dtype(np.int8), 1).dtype == np.int8
    assert np.isnan(scalar_array(f32, float("nan"))) and scalar_array(f32, float("nan")) is scalar_array(f32, float("nan"))


@pytest.mark.parametrize("op, attrs, formula", [
    ("Relu", {}, lambda x: np.where(x > 0, x, 0)),
    ("Clip", {"min": -0.5, "max": 0.25}, lambda x: np.where(x < -0.5, -0.5, np.where(x > 0.25, 0.25, x))),
    ("HardSigmoid", {}, lambda x: np.where(x * 0.2 + 0.5 < 0, 0, np.where(x * 0.2 + 0.5 > 1, 1, x * 0.2 + 0.5)))])
def test_large_tensors_through_the_fast_constant_runs(op, attrs, formula):
    x = np.random.default_rng(1).standard_normal((3, 70001)).astype(np.float32) * 4
    x[0, :3] = [np.nan, -np.inf, np.inf]
    version = 6 if op == "Clip" else versions(op)[-1]
    with np.errstate(invalid="ignore"):
        exp = formula(x).astype(np.float32)     # in float32 as the kernel: exact, no rounding apart
    exp[0, 0] = np.nan
    assert_same(run(op, version, [x], **attrs), exp)


@pytest.mark.parametrize("op", list(FORMULAS) + ["PRelu", "SwiGLU"])
@pytest.mark.parametrize("shape", [(), (0,), (2, 0, 3)])
def test_scalar_and_empty(op, shape):
    x = np.full(shape, -0.75, np.float32)
    inputs = [x, np.full(shape, 0.5, np.float32)] if op in ("PRelu", "SwiGLU") else [x]
    got = run(op, versions(op)[-1], inputs)
    if op == "PRelu":
        exp = prelu_ref(x, inputs[1])
    elif op == "SwiGLU":
        exp = (reference("Swish", x).astype(np.float64) * 0.5).astype(np.float32)
    else:
        exp = reference(op, x)
    assert_close(got, exp)


# -- PRelu broadcasting ----------------------------------------------------------------------------

X4 = (np.arange(2 * 3 * 4 * 5, dtype=np.float32) - 60).reshape(2, 3, 4, 5) / 8


@pytest.mark.parametrize("version", [7, 9, 16])
@pytest.mark.parametrize("slope_shape", [(), (1,), (5,), (4, 1), (3, 1, 1), (1, 3, 4, 5), (2, 3, 4, 5), (4, 5)])
def test_prelu_unidirectional_broadcast(version, slope_shape):
    slope = (np.arange(math.prod(slope_shape), dtype=np.float32) / 4 - 0.5).reshape(slope_shape)
    assert_same(run("PRelu", version, [X4, slope]), prelu_ref(X4, slope))


@pytest.mark.parametrize("version", [7, 16])
@pytest.mark.parametrize("slope_shape", [(3,), (2, 1, 1, 1, 1), (1, 3, 4, 6), (4, 4)])
def test_prelu_slope_must_broadcast_to_x(version, slope_shape):
    with pytest.raises(KernelError, match=re.compile(r"unnamed node \(PRelu.*slope.*broadcast", re.S)):
        run("PRelu", version, [X4, np.ones(slope_shape, np.float32)])


@pytest.mark.parametrize("version", [1, 6])
def test_prelu_legacy_slope_forms(version):
    # one slope shared; one per channel (axis 1); same shape; numpy-broadcastable
    per_channel = np.array([0.5, -1.0, 2.0], np.float32)
    assert_same(run("PRelu", version, [X4, per_channel]), prelu_ref(X4, per_channel.reshape(3, 1, 1)))
    assert_same(run("PRelu", version, [X4, np.array([0.25], np.float32)]), prelu_ref(X4, np.float32(0.25)))
    full = np.full(X4.shape, -0.5, np.float32)
    assert_same(run("PRelu", version, [X4, full]), prelu_ref(X4, full))
    last = np.arange(5, dtype=np.float32) / 2
    assert_same(run("PRelu", version, [X4, last]), prelu_ref(X4, last))
    with pytest.raises(KernelError, match="slope"):
        run("PRelu", version, [X4, np.ones(4, np.float32)[:, None, None]])


def test_prelu_and_swiglu_need_one_type():
    with pytest.raises(KernelError, match="same element type"):
        run("PRelu", 16, [X4, np.ones(5, np.float64)])
    with pytest.raises(KernelError, match="same element type"):
        run("SwiGLU", 28, [np.ones(3, np.float16), np.ones(3, np.float32)])


def test_swiglu_shapes_must_match():
    with pytest.raises(KernelError, match=re.compile(r"unnamed node \(SwiGLU.*same shape", re.S)):
        run("SwiGLU", 28, [np.ones((2, 4), np.float32), np.ones((4,), np.float32)])


def test_relu_int_types_keep_type_and_wrap_nothing():
    x = np.array([-128, -1, 0, 1, 127], np.int8)
    assert_same(run("Relu", 14, [x]), np.array([0, 0, 0, 1, 127], np.int8))
    x = np.array([-2**63, 2**63 - 1], np.int64)
    assert_same(run("Relu", 14, [x]), np.array([0, 2**63 - 1], np.int64))


def test_prelu_unsigned_is_identity():
    x = np.array([0, 3, 2**32 - 1], np.uint32)
    assert_same(run("PRelu", 16, [x, np.array([7], np.uint32)]), x)


@pytest.mark.parametrize("op", ["Sigmoid", "Elu", "Mish", "Gelu", "PRelu"])
def test_large_inputs_match_the_formula(op):
    x = np.linspace(-12, 12, 30000, dtype=np.float64).reshape(3, -1)
    inputs = [x, np.full((1, 1), 0.25)] if op == "PRelu" else [x]
    exp = prelu_ref(x, inputs[1]) if op == "PRelu" else reference(op, x)
    got = run(op, versions(op)[-1], inputs)
    assert got.dtype == x.dtype and got.shape == x.shape
    # Gelu's tail: an ulp of x / sqrt(2) moves erfc(z) by 2 z^2 ulps (z up to 8.5 here)
    np.testing.assert_allclose(got, exp, rtol=1e-13 if op == "Gelu" else 1e-14, atol=1e-300)


def test_gelu_float32_to_a_few_ulp_everywhere():
    """float32 Gelu (normal_cdf.gelu_float32: a table of Phi on a 1/2048 grid and a short series) against
    0.5 x erfc(-x / sqrt(2)) in float64 on a dense grid, the left tail included (where scaling x by
    1/sqrt(2) in float32 alone costs ~200 ulp). Measured: 2.9 ulp, 1.5 steps of 2^-149 if subnormal."""
    rng = np.random.default_rng(0)
    x = np.concatenate([np.linspace(-16, 16, 64001), np.linspace(-1e-3, 1e-3, 2001),
                        np.arange(-15 * 2048, 6 * 2048 + 1) / 2048,         # the table's own points
                        rng.standard_normal(20000) * 3, rng.uniform(-14.5, -12.5, 20000)]).astype(np.float32)
    exact = np.array([0.5 * v * math.erfc(-v / math.sqrt(2)) for v in x.astype(np.float64).tolist()])
    got = run("Gelu", 20, [x])
    assert got.dtype == np.float32
    normal = np.abs(exact) >= np.finfo(np.float32).tiny
    ulps = np.abs(got[normal] - exact[normal]) / np.spacing(np.abs(exact[normal]).astype(np.float32))
    assert ulps.max() <= 3
    assert (np.abs(got[~normal] - exact[~normal]) <= 2 * 2.0 ** -149).all()     # subnormal results
    tail = np.array([-5.0, -9.0, -12.0, -13.5, -14.0], np.float32)
    np.testing.assert_allclose(run("Gelu", 20, [tail]), [0.5 * v * math.erfc(-v / math.sqrt(2)) for v in tail.tolist()],
                               rtol=1e-6, atol=2.0 ** -148)       # the last two are subnormal


def test_gelu_float32_tiny_and_subnormal_inputs():
    """|x| < 2^-122 (results x / 2 and below, subnormal inputs included): x * p ~ x / 16 is rounded to a
    subnormal first, so the bound there is 4 ulp, or 4 steps of 2^-149 for subnormal results (measured:
    4.0); above, the dense grid's 3. Zeros keep their sign; powers of two come back halved exactly."""
    rng = np.random.default_rng(5)
    mags = np.exp2(rng.uniform(-149, -110, 60000))
    x = np.concatenate([mags * rng.choice([-1.0, 1.0], mags.size), np.arange(1, 4096) * 2.0 ** -149,
                        [2.0 ** -127, -(2.0 ** -120), 2.0 ** -122]]).astype(np.float32)
    exact = np.array([0.5 * v * math.erfc(-v / math.sqrt(2)) for v in x.astype(np.float64).tolist()])
    got = run("Gelu", 20, [x]).astype(np.float64)
    normal = np.abs(exact) >= np.finfo(np.float32).tiny
    step = np.where(normal, np.spacing(np.abs(exact).astype(np.float32)), 2.0 ** -149)
    err = np.abs(got - exact) / step
    assert err.max() <= 4
    assert err[np.abs(x) >= 2.0 ** -122].max() <= 3
    assert (got[-3:] == [2.0 ** -128, -(2.0 ** -121), 2.0 ** -123]).all()
    zeros = run("Gelu", 20, [np.array([0.0, -0.0], np.float32)])
    assert_same(zeros, np.array([0.0, -0.0], np.float32))
    assert np.signbit(zeros[1]) and not np.signbit(zeros[0])


def test_gelu_float32_nan_anywhere_stays_nan():
    """NaN (any sign or payload) gives NaN and leaves its neighbours alone; its bits index the tables
    like any value's, inside them (an index wrapped by numpy's take loops once per table length:
    ~16 us a NaN before the 16-bit indexes)."""
    from onnx_mini.ops.math import normal_cdf

    rng = np.random.default_rng(3)
    x = rng.uniform(-16, 7, 50000).astype(np.float32)
    nans = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFFFFFFF, 0x7FBFFFFF], np.uint32).view(np.float32)
    where = rng.choice(x.size, 5000, replace=False)
    x[where] = np.resize(nans, where.size)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got = run("Gelu", 20, [x])
        assert np.isnan(got[where]).all()
        assert_same(np.delete(got, where), run("Gelu", 20, [np.delete(x, where)]))
        block = np.resize(nans, 4096)
        out, d, g, k = np.empty(4096, np.float32), np.empty(4096, np.float32), np.empty((2, 4096), np.float32), \
            np.full(4096, -1, np.int32)
        normal_cdf._gelu_block(block, out, d, g, k)
    assert np.isnan(out).all()
    assert 0 <= k.min() and k.max() < normal_cdf._TABLES.shape[1] == normal_cdf._LAM.size == normal_cdf._PHI16.size


def test_gelu_float32_edges():
    """Beyond the table's range [-15, 6]: x itself above (Phi is 1 in float32), 0 below; zeros, a 0-d
    and a strided input, and more elements than one block (32768)."""
    x = np.array([6.5, 100.0, 3e38, -15.5, -1e30, 0.0, -0.0], np.float32)
    got = run("Gelu", 20, [x])
    assert_same(got, np.array([6.5, 100.0, 3e38, -0.0, -0.0, 0.0, -0.0], np.float32))
    assert np.signbit(got[-1]) and not np.signbit(got[-2])
    assert_same(run("Gelu", 20, [np.array(1.0, np.float32)]), np.array(0.8413448, np.float32))
    big = np.linspace(-8, 8, 2 * 40000, dtype=np.float32).reshape(2, 40000)
    exact = np.array([0.5 * v * math.erfc(-v / math.sqrt(2)) for v in big.T.astype(np.float64).ravel().tolist()])
    got = run("Gelu", 20, [big.T])
    assert got.shape == (40000, 2)
    np.testing.assert_allclose(got.ravel(), exact, rtol=4e-7, atol=1e-30)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("tname", ["float", "double", "float16"])
def test_gelu_by_blocks_on_the_threads_is_the_whole_call(monkeypatch, approximate, tname):
    """A large Gelu runs by blocks on the pool's threads (ops/_common.by_blocks; its sizes shrunk here
    so that a small array splits into uneven blocks): the same bits as one call, the spec's values."""
    from onnx_mini.ops import _common
    x = (np.random.default_rng(7).standard_normal((3, 5, 67)) * 4).astype(np_type(tname))
    whole = run("Gelu", 20, [x], approximate=approximate)
    monkeypatch.setattr(_common, "BLOCKS_MIN_VALUES", 64)
    monkeypatch.setattr(_common, "BLOCK_VALUES", 97)
    blocks = run("Gelu", 20, [x], approximate=approximate)
    assert blocks.shape == x.shape and blocks.dtype == x.dtype
    np.testing.assert_array_equal(blocks.view(np.uint8), whole.view(np.uint8))
    want = [FORMULAS["Gelu"](float(v), approximate=approximate) for v in x.reshape(-1)]
    np.testing.assert_allclose(blocks.reshape(-1).astype(np.float64), want, rtol=RTOL[tname], atol=1e-6)
