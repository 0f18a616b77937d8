"""Spec tests for Cast (1-28), CastLike (15-25) and BitCast (26).

Every (from, to) pair each version's type constraints allow is run on values exactly representable
in both types, so the expected result is the same numbers in the target type; the rounding,
saturation, wrap-around, string and float8e8m0 rules are checked on hand-computed values.
"""
from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper

import onnx_mini
from onnx_mini.errors import InvalidNodeError, KernelError

from helpers import NODE, assert_same, elem_type, np_type, run_node, type_names

CAST_VERSIONS = [1, 6, 9, 13, 19, 21, 23, 24, 25, 28]
CASTLIKE_VERSIONS = [15, 19, 21, 23, 24, 25]
T = TensorProto
F8 = {"float8e4m3fn": 448.0, "float8e4m3fnuz": 240.0, "float8e5m2": 57344.0, "float8e5m2fnuz": 57344.0}


def run_nodes(nodes, inputs: dict, outputs: list, opset: int):
    """Run a graph of `nodes` on named inputs; returns the named outputs' values."""
    declared = [helper.make_tensor_value_info(n, elem_type(x.dtype), x.shape) for n, x in inputs.items()]
    graph = helper.make_graph(nodes, "g", declared, [helper.make_empty_tensor_value_info(o) for o in outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    return onnx_mini.prepare(model).run(list(inputs.values()))


def cast(version: int, x: np.ndarray, to, **attrs):
    return run_node("Cast", version, [x], to=to, **attrs)


# -- every allowed pair --------------------------------------------------------------------------

CANDIDATES = [1, 0, 2, -1, 0.5, 3, -2, 4, 1.5, -0.5, 6]


def representable(v: float, tname: str) -> bool:
    if tname == "string":
        return True
    if tname == "bool":
        return v in (0, 1)
    dt = np_type(tname)
    if tname.startswith(("int", "uint")):
        info = ml_dtypes.iinfo(dt)
        return float(v).is_integer() and info.min <= v <= info.max
    with np.errstate(all="ignore"):
        return float(np.array(v, dtype=np.float64).astype(np.float32).astype(dt).astype(np.float64)) == v


def typed(values, tname: str) -> np.ndarray:
    """The values in type tname (exact); strings as their shortest text ("1", "0.5", "-2")."""
    if tname == "string":
        return np.array([str(int(v)) if float(v).is_integer() else str(v) for v in values], dtype=object)
    if tname == "bool":
        return np.array(values, dtype=np.float64) != 0
    return np.array(values, dtype=np.float64).astype(np.float32).astype(np_type(tname))


def as_text(values, src: str) -> np.ndarray:
    """Expected Cast(-> string) output: integers as integers, floats with a '.0', bool as 1/0."""
    if src == "bool":
        return np.array(["1" if v else "0" for v in values], dtype=object)
    if src.startswith(("int", "uint")):
        return np.array([str(int(v)) for v in values], dtype=object)
    return np.array([repr(float(v)) for v in values], dtype=object)


def pair_cases(op, versions):
    out = []
    for v in versions:
        for src in type_names(op, v, "T1"):
            out.append(pytest.param(v, src, id=f"v{v}-{src}"))
    return out


def check_every_target(op, version, src):
    targets = type_names(op, version, "T2")
    x_by_target, nodes, outs, inputs = {}, [], [], {}
    for k, dst in enumerate(targets):
        vals = [v for v in CANDIDATES if representable(v, src) and representable(v, dst)]
        x = typed(vals, src).reshape(1, -1)
        inputs[f"x{k}"] = x
        x_by_target[dst] = vals
        if op == "Cast":
            to = getattr(T, dst.upper())
            attrs = {"to": dst.upper()} if version == 1 else {"to": to}
            nodes.append(helper.make_node("Cast", [f"x{k}"], [f"y{k}"], **attrs))
        else:
            inputs[f"like{k}"] = typed([], dst)
            nodes.append(helper.make_node("CastLike", [f"x{k}", f"like{k}"], [f"y{k}"]))
        outs.append(f"y{k}")
    got = run_nodes(nodes, inputs, outs, version)
    for dst, y in zip(targets, got):
        vals = x_by_target[dst]
        exp = as_text(vals, src) if dst == "string" and src != "string" else typed(vals, dst)
        assert_same(y, exp.reshape(1, -1))


@pytest.mark.parametrize("version,src", pair_cases("Cast", CAST_VERSIONS))
def test_cast_every_type_pair(version, src):
    check_every_target("Cast", version, src)


@pytest.mark.parametrize("version,src", pair_cases("CastLike", CASTLIKE_VERSIONS))
def test_castlike_every_type_pair(version, src):
    check_every_target("CastLike", version, src)


# -- rules on hand-computed values ---------------------------------------------------------------

@pytest.mark.parametrize("version", CAST_VERSIONS[1:])
@pytest.mark.parametrize("dtype,to,expected", [
    (np.int8, T.INT8, [2, -2, 0, 0, 127, -128]), (np.int32, T.INT32, [2, -2, 0, 0, 127, -128]),
    (np.int64, T.INT64, [2, -2, 0, 0, 127, -128]), (np.int16, T.INT16, [2, -2, 0, 0, 127, -128]),
])
def test_float_to_int_truncates_toward_zero(version, dtype, to, expected):
    x = np.array([2.7, -2.7, 0.5, -0.5, 127.9, -128.9], np.float32)
    assert_same(cast(version, x, to), np.array(expected, dtype))
    assert_same(cast(version, x.astype(np.float64), to), np.array(expected, dtype))


@pytest.mark.parametrize("version", CAST_VERSIONS[5:])
def test_float_to_int4_truncates(version):
    x = np.array([7.9, -7.9, 2.5, -0.5], np.float32)
    assert_same(cast(version, x, T.INT4), np.array([7, -7, 2, 0], ml_dtypes.int4))
    assert_same(cast(version, x[:3], T.UINT4), np.array([7, 9, 2], ml_dtypes.uint4))  # -7 wraps to 9


@pytest.mark.parametrize("version", CAST_VERSIONS[1:])
@pytest.mark.parametrize("x,to,expected", [
    (np.array([200, -200, 127, 256], np.int16), np.int8, [-56, 56, 127, 0]),   # the spec's 200 -> -56
    (np.array([70000, -1], np.int32), np.int16, [4464, -1]),
    (np.array([-1, 256, 300], np.int32), np.uint8, [255, 0, 44]),
    (np.array([2**32 + 5, -1], np.int64), np.uint32, [5, 2**32 - 1]),
    (np.array([2**63], np.uint64), np.int64, [-2**63]),
    (np.array([255, 128], np.uint8), np.int8, [-1, -128]),
    (np.array([0, 1, 36, -1], np.int32), np.bool_, [False, True, True, True]),
    (np.array([0.0, -0.0, 0.1, np.nan, -np.inf], np.float32), np.bool_, [False, False, True, True, True]),
    (np.array([True, False]), np.float32, [1.0, 0.0]),
    (np.array([True, False]), np.int64, [1, 0]),
])
def test_cast_numeric_rules(version, x, to, expected):
    assert_same(cast(version, x, elem_type(to)), np.array(expected, to))


@pytest.mark.parametrize("version", CAST_VERSIONS[5:])
def test_integer_wraps_into_4_bit_types(version):
    x = np.array([17, -9, 8, -1, 15], np.int32)
    assert_same(cast(version, x, T.INT4), np.array([1, 7, -8, -1, -1], ml_dtypes.int4))
    assert_same(cast(version, x, T.UINT4), np.array([1, 7, 8, 15, 15], ml_dtypes.uint4))


@pytest.mark.parametrize("version", [25, 28])
def test_integer_wraps_into_2_bit_types(version):
    x = np.array([5, -3, 2, -1], np.int64)
    assert_same(cast(version, x, T.INT2), np.array([1, 1, -2, -1], ml_dtypes.int2))
    assert_same(cast(version, x, T.UINT2), np.array([1, 1, 2, 3], ml_dtypes.uint2))


@pytest.mark.parametrize("version", CAST_VERSIONS[1:])
def test_float_overflow_gives_infinity(version):
    x = np.array([1e300, -1e300, 70000.0, 1e-300], np.float64)
    assert_same(cast(version, x, T.FLOAT), np.array([np.inf, -np.inf, 70000, 0], np.float32))
    assert_same(cast(version, x, T.FLOAT16), np.array([np.inf, -np.inf, np.inf, 0], np.float16))
    # float16 rounds to nearest even: 2049 is halfway between 2048 and 2050
    assert_same(cast(version, np.array([2049, 2051], np.int32), T.FLOAT16), np.array([2048, 2052], np.float16))


@pytest.mark.parametrize("version", CAST_VERSIONS[3:])
def test_bfloat16_rounds_to_nearest_even(version):
    # bfloat16 keeps 8 significant bits: 257 is halfway between 256 and 258, 259 between 258 and 260
    x = np.array([257, 259, 1e39, -np.inf, np.nan], np.float64)
    exp = np.array([256, 260, np.inf, -np.inf, np.nan], np.float32).astype(ml_dtypes.bfloat16)
    assert_same(cast(version, x, T.BFLOAT16), exp)


# -- float8 saturation ---------------------------------------------------------------------------

F8_CASES = [  # input -> (saturate=1, saturate=0) per type, hand-derived from the spec tables
    ("float8e4m3fn", [1000, -1000, np.inf, -np.inf, np.nan, 17, 464, -0.0],
     [448, -448, 448, -448, np.nan, 16, 448, -0.0], [np.nan, np.nan, np.nan, np.nan, np.nan, 16, 448, -0.0]),
    ("float8e4m3fnuz", [1000, -1000, np.inf, -np.inf, np.nan, 17, -0.0],
     [240, -240, 240, -240, np.nan, 16, 0], [np.nan, np.nan, np.nan, np.nan, np.nan, 16, 0]),
    ("float8e5m2", [1e6, -1e6, np.inf, -np.inf, np.nan, 9, -0.0],
     [57344, -57344, 57344, -57344, np.nan, 8, -0.0], [np.inf, -np.inf, np.inf, -np.inf, np.nan, 8, -0.0]),
    ("float8e5m2fnuz", [1e6, -1e6, np.inf, -np.inf, np.nan, 9, -0.0],
     [57344, -57344, 57344, -57344, np.nan, 8, 0], [np.nan, np.nan, np.nan, np.nan, np.nan, 8, 0]),
]


@pytest.mark.parametrize("version", CAST_VERSIONS[4:])
@pytest.mark.parametrize("src", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("tname,x,sat,nosat", F8_CASES, ids=[c[0] for c in F8_CASES])
def test_cast_float8_saturate(version, src, tname, x, sat, nosat):
    dt = np_type(tname)
    if src is np.float16:   # float16 tops out at 65504
        x = [min(max(v, -65504.0), 65504.0) if np.isfinite(v) else v for v in x]
    xs = np.array(x, src)
    got_sat = cast(version, xs, getattr(T, tname.upper()))
    got_nosat = cast(version, xs, getattr(T, tname.upper()), saturate=0)
    assert_same(got_sat, np.array(sat, np.float32).astype(dt))
    assert_same(got_nosat, np.array(nosat, np.float32).astype(dt))
    # -0.0 stays negative in the types that have it
    assert np.signbit(got_sat.astype(np.float32)[-1]) == (not tname.endswith("fnuz"))


@pytest.mark.parametrize("version", CAST_VERSIONS[4:])
def test_cast_integers_to_float8(version):
    x = np.array([1000, -3, 17, 0], np.int32)
    assert_same(cast(version, x, T.FLOAT8E4M3FN),
                np.array([448, -3, 16, 0], np.float32).astype(ml_dtypes.float8_e4m3fn))
    assert_same(cast(version, x, T.FLOAT8E4M3FN, saturate=0),
                np.array([np.nan, -3, 16, 0], np.float32).astype(ml_dtypes.float8_e4m3fn))


@pytest.mark.parametrize("version", CAST_VERSIONS[4:])
def test_cast_from_float8(version):
    x = np.array([448, -0.5, np.nan], np.float32).astype(ml_dtypes.float8_e4m3fn)
    assert_same(cast(version, x, T.FLOAT), np.array([448, -0.5, np.nan], np.float32))
    assert_same(cast(version, x[:2], T.INT32), np.array([448, 0], np.int32))
    assert_same(cast(version, x, T.FLOAT8E5M2),
                np.array([448, -0.5, np.nan], np.float32).astype(ml_dtypes.float8_e5m2))
    # 448 is above e4m3fnuz's 240: saturated, or NaN without saturation
    assert_same(cast(version, x[:1], T.FLOAT8E4M3FNUZ), np.array([240], np.float32).astype(ml_dtypes.float8_e4m3fnuz))
    assert np.isnan(cast(version, x[:1], T.FLOAT8E4M3FNUZ, saturate=0).astype(np.float32)[0])


@pytest.mark.parametrize("version", CAST_VERSIONS[6:])
def test_cast_float4e2m1(version):
    x = np.array([0.25, 0.75, 2.5, 5, 7, 100, -100, -np.inf, -1.25], np.float32)
    exp = np.array([0, 1, 2, 4, 6, 6, -6, -6, -1], np.float32)   # nearest even; saturating
    assert_same(cast(version, x, T.FLOAT4E2M1), exp.astype(ml_dtypes.float4_e2m1fn))
    assert_same(cast(version, exp.astype(ml_dtypes.float4_e2m1fn), T.FLOAT16), exp.astype(np.float16))


# -- float8e8m0 ----------------------------------------------------------------------------------

E8M0_CASES = [  # x, up, down, nearest (powers of two as exponents)
    (3.0, 2, 1, 2), (2.9, 2, 1, 1), (3.1, 2, 1, 2), (5.0, 3, 2, 2), (6.0, 3, 2, 3), (4.0, 2, 2, 2),
    (0.3, -1, -2, -2), (0.124, -3, -4, -3), (1.0, 0, 0, 0), (2.0**-127, -127, -127, -127),
]


@pytest.mark.parametrize("version", [24, 25, 28])
@pytest.mark.parametrize("mode,col", [("up", 1), ("down", 2), ("nearest", 3)])
def test_cast_to_float8e8m0_round_modes(version, mode, col):
    x = np.array([c[0] for c in E8M0_CASES], np.float64)
    exp = np.array([2.0 ** c[col] for c in E8M0_CASES], np.float64).astype(ml_dtypes.float8_e8m0fnu)
    for saturate in (0, 1):
        assert_same(cast(version, x, T.FLOAT8E8M0, saturate=saturate, round_mode=mode), exp)
    assert_same(cast(version, x.astype(np.float32), T.FLOAT8E8M0, round_mode=mode), exp)


@pytest.mark.parametrize("version", [24, 25, 28])
def test_cast_to_float8e8m0_special_values(version):
    x = np.array([0.0, np.inf, np.nan, 1e39, 2.0**-130], np.float64)
    top, bottom = 2.0**127, 2.0**-127
    sat = np.array([bottom, top, np.nan, top, bottom]).astype(ml_dtypes.float8_e8m0fnu)
    assert_same(cast(version, x, T.FLOAT8E8M0, saturate=1, round_mode="up"), sat)
    got = cast(version, x, T.FLOAT8E8M0, saturate=0, round_mode="nearest").astype(np.float64)
    assert np.isnan(got).all()
    back = cast(version, np.array([0.5, 2.0**-127, 2.0**127]).astype(ml_dtypes.float8_e8m0fnu), T.FLOAT)
    assert_same(back, np.array([0.5, 2.0**-127, 2.0**127], np.float32))


@pytest.mark.parametrize("version", [24, 25, 28])
def test_round_mode_is_checked(version):
    with pytest.raises(InvalidNodeError, match=f"{NODE}.*round_mode"):
        cast(version, np.ones(2, np.float32), T.FLOAT8E8M0, round_mode="sideways")


# -- strings -------------------------------------------------------------------------------------

STRING_VERSIONS = CAST_VERSIONS[2:]


@pytest.mark.parametrize("version", STRING_VERSIONS)
@pytest.mark.parametrize("to,dtype", [(T.FLOAT, np.float32), (T.DOUBLE, np.float64), (T.FLOAT16, np.float16)])
def test_strings_to_floats(version, to, dtype):
    s = np.array(["INF", "+INF", "-inf", "NaN", "nan", "1e-5", "1E8", "3.14", " 2.5 ", "-0", "+inf", "Inf"],
                 dtype=object)
    exp = np.array([np.inf, np.inf, -np.inf, np.nan, np.nan, 1e-5, 1e8, 3.14, 2.5, -0.0, np.inf, np.inf])
    exp = exp.astype(dtype)
    assert_same(cast(version, s, to), exp)


@pytest.mark.parametrize("version", STRING_VERSIONS)
def test_strings_to_integers(version):
    s = np.array(["1000", "-7", "100.5", "-2.9", "1e3", "0"], dtype=object)
    assert_same(cast(version, s, T.INT32), np.array([1000, -7, 100, -2, 1000, 0], np.int32))
    assert_same(cast(version, s[:2], T.INT8), np.array([-24, -7], np.int8))    # 1000 wraps like an int cast
    big = np.array(["9223372036854775807", "-9223372036854775808"], dtype=object)
    assert_same(cast(version, big, T.INT64), np.array([2**63 - 1, -2**63], np.int64))
    assert_same(cast(version, np.array(["18446744073709551615"], dtype=object), T.UINT64),
                np.array([2**64 - 1], np.uint64))


@pytest.mark.parametrize("version", STRING_VERSIONS)
def test_strings_to_bool(version):
    s = np.array(["0", "1", "2.5", "0.0", "true", "False"], dtype=object)
    assert_same(cast(version, s, T.BOOL), np.array([False, True, True, False, True, False]))


@pytest.mark.parametrize("version", STRING_VERSIONS)
def test_numbers_to_strings(version):
    f = np.array([0.1, 1e-7, 3.0, -0.0, np.nan, np.inf, -np.inf, 0.47892547], np.float32)
    assert_same(cast(version, f, T.STRING),
                np.array(["0.1", "1e-07", "3.0", "-0.0", "NaN", "INF", "-INF", "0.47892547"], dtype=object))
    assert_same(cast(version, np.array([0.1, 1 / 3], np.float64), T.STRING),
                np.array(["0.1", "0.3333333333333333"], dtype=object))
    assert_same(cast(version, np.array([0.1], np.float16), T.STRING), np.array(["0.1"], dtype=object))
    assert_same(cast(version, np.array([-5, 2**40], np.int64), T.STRING),
                np.array(["-5", "1099511627776"], dtype=object))
    assert_same(cast(version, np.array([True, False]), T.STRING), np.array(["1", "0"], dtype=object))
    assert_same(cast(version, np.array(["a", "b"], dtype=object), T.STRING), np.array(["a", "b"], dtype=object))


@pytest.mark.parametrize("version", STRING_VERSIONS)
@pytest.mark.parametrize("dtype,to", [(np.float32, T.FLOAT), (np.float64, T.DOUBLE), (np.float16, T.FLOAT16)])
def test_float_string_round_trip(version, dtype, to):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(200) * 10.0 ** rng.integers(-20, 20, 200)).astype(dtype)
    x = x[np.isfinite(x)]
    assert_same(cast(version, cast(version, x, T.STRING), to), x)


# -- Cast-1 and invalid 'to' ---------------------------------------------------------------------

@pytest.mark.parametrize("to,dtype", [("FLOAT", np.float32), ("INT32", np.int32), ("float16", np.float16),
                                      ("BOOL", np.bool_), ("UINT64", np.uint64)])
def test_cast_1_takes_a_type_name(to, dtype):
    x = np.array([0.0, 1.0, 2.0, 3.0], np.float64)
    assert_same(cast(1, x, to), x.astype(dtype))


@pytest.mark.parametrize("version,to", [
    (1, "STRING"), (1, "BFLOAT16"), (1, "NOTATYPE"), (6, T.STRING), (6, T.BFLOAT16), (9, T.BFLOAT16),
    (13, T.FLOAT8E4M3FN), (19, T.INT4), (21, T.FLOAT4E2M1), (23, T.FLOAT8E8M0), (24, T.INT2),
    (25, getattr(T, "FLOAT6E2M3", 0)), (28, T.COMPLEX64), (28, 0),
])
def test_cast_rejects_types_the_version_does_not_allow(version, to):
    with pytest.raises(InvalidNodeError, match=f"{NODE}.*to"):
        cast(version, np.ones(2, np.float32), to)


@pytest.mark.parametrize("version,x", [(6, np.array(["1"], dtype=object)), (13, np.ones(2, ml_dtypes.float8_e4m3fn)),
                                       (9, np.ones(2, ml_dtypes.bfloat16)), (19, np.ones(2, np.complex64))])
def test_cast_rejects_input_types_the_version_does_not_allow(version, x):
    with pytest.raises(KernelError, match=re.compile(f"{NODE}.*not allowed", re.S)):
        cast(version, x, T.FLOAT)


@pytest.mark.parametrize("version", [1, 13, 25])
def test_cast_empty_and_scalar(version):
    to = "INT64" if version == 1 else T.INT64
    assert_same(cast(version, np.zeros((0, 3), np.float32), to), np.zeros((0, 3), np.int64))
    assert_same(cast(version, np.array(2.5, np.float32), to), np.array(2, np.int64))


# -- CastLike ------------------------------------------------------------------------------------

def castlike(version, x, like, **attrs):
    return run_node("CastLike", version, [x, like], **attrs)


@pytest.mark.parametrize("version", CASTLIKE_VERSIONS[1:])
def test_castlike_saturate(version):
    x = np.array([1000, np.inf, 17], np.float32)
    like = np.zeros(0, ml_dtypes.float8_e4m3fn)
    f8 = ml_dtypes.float8_e4m3fn
    assert_same(castlike(version, x, like), np.array([448, 448, 16], np.float32).astype(f8))
    assert_same(castlike(version, x, like, saturate=0), np.array([np.nan, np.nan, 16], np.float32).astype(f8))


@pytest.mark.parametrize("version", [24, 25])
def test_castlike_round_mode(version):
    like = np.zeros(0, ml_dtypes.float8_e8m0fnu)
    x = np.array([3.0, 5.0], np.float32)
    for mode, exp in (("up", [4, 8]), ("down", [2, 4]), ("nearest", [4, 4])):
        assert_same(castlike(version, x, like, round_mode=mode),
                    np.array(exp, np.float32).astype(ml_dtypes.float8_e8m0fnu))


@pytest.mark.parametrize("version", CASTLIKE_VERSIONS)
def test_castlike_strings_and_truncation(version):
    assert_same(castlike(version, np.array(["-2.5", "INF"], dtype=object), np.zeros(1, np.float64)),
                np.array([-2.5, np.inf]))
    assert_same(castlike(version, np.array([-2.5, 2.5], np.float64), np.zeros(1, np.int16)),
                np.array([-2, 2], np.int16))
    assert_same(castlike(version, np.array([7], np.int32), np.array(["x"], dtype=object)),
                np.array(["7"], dtype=object))


@pytest.mark.parametrize("version,like", [(15, np.zeros(1, ml_dtypes.float8_e5m2)), (19, np.zeros(1, ml_dtypes.int4)),
                                          (21, np.zeros(1, ml_dtypes.float4_e2m1fn)),
                                          (25, np.zeros(1, np.complex64))])
def test_castlike_rejects_target_types_the_version_does_not_allow(version, like):
    with pytest.raises(KernelError, match=re.compile(f"{NODE}.*target_type", re.S)):
        castlike(version, np.ones(2, np.float32), like)


# -- BitCast -------------------------------------------------------------------------------------

def bitcast(x, to):
    return run_node("BitCast", 26, [x], to=to)


BITCAST_EXAMPLES = [  # (input, to, expected): bit patterns written by hand
    (np.array([1.0, -2.0], np.float32), T.INT32, np.array([0x3F800000, -0x40000000], np.int32)),
    (np.array([0x3F800000], np.uint32), T.FLOAT, np.array([1.0], np.float32)),
    (np.array([1.0], np.float64), T.INT64, np.array([0x3FF0000000000000], np.int64)),
    (np.array([1.0, -0.0], np.float16), T.UINT16, np.array([0x3C00, 0x8000], np.uint16)),
    (np.array([1.0], np.float32).astype(ml_dtypes.bfloat16), T.INT16, np.array([0x3F80], np.int16)),
    (np.array([0x3C00], np.uint16), T.FLOAT16, np.array([1.0], np.float16)),
    (np.array([-1, 127, -128], np.int8), T.UINT8, np.array([255, 127, 128], np.uint8)),
    (np.array([True, False]), T.UINT8, np.array([1, 0], np.uint8)),
    (np.array([1, 0], np.uint8), T.BOOL, np.array([True, False])),
    (np.array([1.0], np.float32).astype(ml_dtypes.float8_e4m3fn), T.UINT8, np.array([0x38], np.uint8)),
    (np.array([1.0], np.float32).astype(ml_dtypes.float8_e5m2), T.UINT8, np.array([0x3C], np.uint8)),
    (np.array([1.0], np.float32).astype(ml_dtypes.float8_e4m3fnuz), T.INT8, np.array([0x40], np.int8)),
    (np.array([1.0], np.float32).astype(ml_dtypes.float8_e8m0fnu), T.UINT8, np.array([127], np.uint8)),
    (np.array([0x38], np.uint8), T.FLOAT8E4M3FN, np.array([1.0], np.float32).astype(ml_dtypes.float8_e4m3fn)),
    (np.array([1 + 2j], np.complex64), T.UINT64, np.array([0x40000000_3F800000], np.uint64)),
    (np.array([-1, 7, -8], ml_dtypes.int4), T.UINT4, np.array([15, 7, 8], ml_dtypes.uint4)),
    (np.array([15, 2, 9], ml_dtypes.uint4), T.INT4, np.array([-1, 2, -7], ml_dtypes.int4)),
    (np.array([2, 11], ml_dtypes.uint4), T.FLOAT4E2M1,
     np.array([1.0, -1.5], np.float32).astype(ml_dtypes.float4_e2m1fn)),
    (np.array([6.0, -0.5], np.float32).astype(ml_dtypes.float4_e2m1fn), T.INT4, np.array([7, -7], ml_dtypes.int4)),
    (np.array([-1, -2, 1], ml_dtypes.int2), T.UINT2, np.array([3, 2, 1], ml_dtypes.uint2)),
    (np.array(1.0, np.float32), T.INT32, np.array(0x3F800000, np.int32)),
    (np.zeros((2, 0), np.float32), T.UINT32, np.zeros((2, 0), np.uint32)),
]


@pytest.mark.parametrize("x,to,expected", BITCAST_EXAMPLES)
def test_bitcast_examples(x, to, expected):
    assert_same(bitcast(x, to), expected)


def bitcast_pairs():
    types = type_names("BitCast", 26, "T1")
    small = {"bool": 8, "int4": 4, "uint4": 4, "float4e2m1": 4, "int2": 2, "uint2": 2}
    width = {t: small.get(t, np_type(t).itemsize * 8) for t in types}
    return [pytest.param(a, b, id=f"{a}-{b}")
            for a in types for b in type_names("BitCast", 26, "T2") if width[a] == width[b]]


@pytest.mark.parametrize("src,dst", bitcast_pairs())
def test_bitcast_every_same_width_pair(src, dst):
    if src in ("int4", "uint4", "float4e2m1", "int2", "uint2"):
        codes = np.arange(16 if "4" in src else 4, dtype=np.uint8)
    else:
        codes = np.array([0, 1, 0x3F, 0x40, 0x7F, 0x80, 0x55, 0xAA] * np_type(src).itemsize, np.uint8)
        if src == "bool":
            codes = codes % 2
    x = codes.view(np.uint8)
    x = x.view(np_type(src)) if src not in ("int4", "int2") else \
        ((codes.astype(np.int16) ^ (8 if src == "int4" else 2)) - (8 if src == "int4" else 2)).astype(np_type(src))
    y = bitcast(x.reshape(2, -1), getattr(T, dst.upper()))
    assert y.dtype == np_type(dst) and y.shape == x.reshape(2, -1).shape
    # the same bits: compare the stored bytes (the low bits for 4-/2-bit types)
    assert y.tobytes() == x.tobytes()
    if src in ("int4", "int2", "uint4", "uint2", "float4e2m1"):
        np.testing.assert_array_equal(y.reshape(-1).view(np.uint8), codes)


@pytest.mark.parametrize("x,to", [(np.ones(2, np.float32), T.INT64), (np.ones(2, np.int8), T.INT16),
                                  (np.ones(2, ml_dtypes.int4), T.INT8), (np.ones(2, np.float64), T.COMPLEX128)])
def test_bitcast_needs_the_same_bit_width(x, to):
    with pytest.raises(KernelError, match=re.compile(f"{NODE}.*bit width", re.S)):
        bitcast(x, to)


@pytest.mark.parametrize("to", [T.STRING, 0])
def test_bitcast_rejects_string_target(to):
    with pytest.raises(InvalidNodeError, match=NODE):
        bitcast(np.ones(2, np.float32), to)


def test_bitcast_rejects_strings():
    with pytest.raises(KernelError, match=NODE):
        bitcast(np.array(["a"], dtype=object), T.UINT8)


@pytest.mark.parametrize("src", ["float", "string", "int8", "bool", "float8e8m0"])
def test_cast_scalar_and_empty_to_every_type(src):
    """0-d and empty inputs keep their shape for every target of Cast-28 (1 is exact in all types)."""
    targets = type_names("Cast", 28, "T2")
    x = typed([1], src).reshape(())
    nodes = [helper.make_node("Cast", ["x"], [f"y{k}"], to=getattr(T, d.upper())) for k, d in enumerate(targets)]
    nodes += [helper.make_node("Cast", ["e"], [f"z{k}"], to=getattr(T, d.upper())) for k, d in enumerate(targets)]
    outs = [f"y{k}" for k in range(len(targets))] + [f"z{k}" for k in range(len(targets))]
    got = run_nodes(nodes, {"x": x, "e": typed([], src).reshape(0, 2)}, outs, 28)
    for k, dst in enumerate(targets):
        exp = as_text([1], src) if dst == "string" and src != "string" else typed([1], dst)
        assert_same(got[k], exp.reshape(()))
        assert_same(got[len(targets) + k], exp[:0].reshape(0, 2))


@pytest.mark.parametrize("version", CAST_VERSIONS[4:])
def test_double_rounds_once(version):
    """float64 -> small floats round once: 1 + 2**-8 + 2**-30 lies just above the bfloat16 halfway point
    1 + 2**-8 (a float32 step would drop the 2**-30 and round the tie to even, 1.0)."""
    x = np.array([1 + 2**-8 + 2**-30, -(1 + 2**-8 + 2**-30), 1 + 2**-8, 1 + 3 * 2**-8], np.float64)
    assert_same(cast(version, x, T.BFLOAT16),
                np.array([1 + 2**-7, -(1 + 2**-7), 1, 1 + 2**-6], np.float32).astype(ml_dtypes.bfloat16))
    y = np.array([1 + 2**-4 + 2**-40, 1 + 2**-4, -(1 + 3 * 2**-4 - 2**-40)], np.float64)   # e4m3fn: 3 mantissa bits
    assert_same(cast(version, y, T.FLOAT8E4M3FN),
                np.array([1.125, 1, -1.125], np.float32).astype(ml_dtypes.float8_e4m3fn))
    if version >= 23:
        z = np.array([2.5 + 2**-40, 2.5, 0.25, 0.25 + 2**-40], np.float64)
        assert_same(cast(version, z, T.FLOAT4E2M1),
                    np.array([3, 2, 0, 0.5], np.float32).astype(ml_dtypes.float4_e2m1fn))


@pytest.mark.parametrize("version", CAST_VERSIONS[4:])
def test_cast_float8e5m2_to_itself_saturates_infinity(version):
    f8 = ml_dtypes.float8_e5m2
    x = np.array([np.inf, -np.inf, 3, np.nan], np.float32).astype(f8)
    assert_same(cast(version, x, T.FLOAT8E5M2), np.array([57344, -57344, 3, np.nan], np.float32).astype(f8))
    assert_same(cast(version, x, T.FLOAT8E5M2, saturate=0), x)
