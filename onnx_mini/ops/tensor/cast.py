"""Type conversion: Cast (1-28), CastLike (15-25), BitCast (26).

The numeric rules follow the Cast doc tables:
- integer -> integer (incl. int4/uint4/int2/uint2) and float -> integer wrap like C after truncating
  toward zero (float -> int64 first, then the two's complement wrap; ml_dtypes does the same for the
  sub-byte types, which is what the official data expects);
- to float8 (e4m3fn, e4m3fnuz, e5m2, e5m2fnuz): round to nearest even; saturate=1 clamps to the
  largest finite value (+/-inf too, per the corrected table of Cast-24: onnx/onnx#7085), saturate=0
  gives inf/NaN per the type (ml_dtypes' own rules);
- to float8e8m0: round_mode up/down/nearest on the exponent, saturate clamps, NaN stays NaN;
- to float4e2m1 / float6: round to nearest even, always saturating (the types have no inf);
- float64 sources round once to the small ml_dtypes floats (round-to-odd to float32 first, as
  ml_dtypes itself goes through float32 and would round twice);
- strings: parsed as decimal/scientific numbers or INF/-INF/NaN (case-insensitive); numbers are written
  in the shortest form that reads back to the same value of their own type (ml_dtypes floats: of
  float32), NaN/INF/-INF for the special values, and 1/0 for booleans.

Helpers other kernels may use: cast_array(x, dtype, saturate, round_mode), to_float8, to_float8e8m0,
schema_dtypes (the numpy dtypes a schema version allows for a type parameter).
"""
from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
import onnx.defs
from onnx import TensorProto

from ...dtypes import NP_DTYPE, type_name
from ...errors import InvalidValueError
from ...registry import kernel
from .._common import as_array

_OBJ = np.dtype(object)
_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)
_I64, _U64 = np.dtype(np.int64), np.dtype(np.uint64)
_BOOL = np.dtype(np.bool_)

#: float8 types with a saturate rule -> their largest finite value.
FLOAT8_MAX = {np.dtype(t): float(ml_dtypes.finfo(t).max) for t in (
    ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fnuz, ml_dtypes.float8_e5m2, ml_dtypes.float8_e5m2fnuz)}
E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
_E5M2 = np.dtype(ml_dtypes.float8_e5m2)
#: ml_dtypes integer types (stored one per byte, low bits significant).
SUBBYTE_INTS = frozenset(np.dtype(t) for t in (ml_dtypes.int4, ml_dtypes.uint4, ml_dtypes.int2, ml_dtypes.uint2))
#: ml_dtypes floats reached by a plain round-to-nearest-even astype from float32/float64.
_PLAIN_FLOATS = frozenset([np.dtype(ml_dtypes.bfloat16), np.dtype(ml_dtypes.float4_e2m1fn)]
                          + [np.dtype(getattr(ml_dtypes, n)) for n in ("float6_e2m3fn", "float6_e3m2fn")
                             if hasattr(ml_dtypes, n)])
_ML_FLOATS = frozenset(FLOAT8_MAX) | {E8M0} | _PLAIN_FLOATS
_NATIVE_INTS = frozenset(np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64,
                                               np.uint8, np.uint16, np.uint32, np.uint64))
_NATIVE_FLOATS = frozenset(np.dtype(t) for t in (np.float16, np.float32, np.float64))
_NATIVE = _NATIVE_INTS | _NATIVE_FLOATS | {_BOOL}
ROUND_MODES = ("up", "down", "nearest")


def is_string(dtype: np.dtype) -> bool:
    return dtype.kind in "OUS"


# -- schema type sets ----------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def schema_dtypes(op: str, version: int, param: str) -> dict:
    """{numpy dtype: TensorProto element type} a schema version allows for a type parameter
    (types this installation cannot represent are left out)."""
    schema = onnx.defs.get_schema(op, version)
    (tc,) = [t for t in schema.type_constraints if t.type_param_str == param]
    out = {}
    for s in tc.allowed_type_strs:
        elem = getattr(TensorProto, s[len("tensor("):-1].upper(), None)
        if elem in NP_DTYPE:
            out[NP_DTYPE[elem]] = elem
    return out


def _type_list(allowed: dict) -> str:
    return ", ".join(type_name(e) for e in sorted(allowed.values()))


def target_dtype(to, allowed: dict, what: str = "to") -> np.dtype:
    """The numpy dtype of element type `to` (an int, or a type name such as 'FLOAT' for Cast-1);
    ValueError when the version does not allow it (the planner names the node)."""
    if isinstance(to, (str, bytes)):
        name = to.decode() if isinstance(to, bytes) else to
        elem = getattr(TensorProto, name.strip().upper(), None)
        if not isinstance(elem, int):
            raise ValueError(f"{what}={name!r} is not a TensorProto element type name")
    else:
        elem = int(to)
    dt = NP_DTYPE.get(elem)
    if dt is None or dt not in allowed:
        raise ValueError(f"{what}={elem} ({type_name(elem)}) is not allowed by this operator version "
                         f"(allowed: {_type_list(allowed)})")
    return dt


def check_input(x: np.ndarray, allowed: dict, what: str = "input") -> None:
    dt = x.dtype
    if dt not in allowed and not (is_string(dt) and _OBJ in allowed):
        raise InvalidValueError(f"{what} of type {dt} is not allowed by this operator version "
                                f"(allowed: {_type_list(allowed)})")


# -- float targets with special rules ------------------------------------------------------------

def to_float8(x: np.ndarray, dtype: np.dtype, saturate: bool = True) -> np.ndarray:
    """float32/float64 x -> float8 (e4m3fn, e4m3fnuz, e5m2, e5m2fnuz), round to nearest even.
    saturate: out-of-range values and +/-inf become +/-max (NaN stays NaN); otherwise ml_dtypes'
    rules (inf or NaN per type), which are the spec's saturate=0 table."""
    if saturate:
        top = FLOAT8_MAX[dtype]
        x = np.clip(x, -top, top)   # NaN propagates through clip
    if x.dtype == _F64:
        x = float64_to_float32_odd(x)
    with np.errstate(over="ignore", invalid="ignore"):
        return as_array(x.astype(dtype))


def to_float8e8m0(x: np.ndarray, saturate: bool = True, round_mode: str = "up") -> np.ndarray:
    """float32/float64 x -> float8e8m0 (2**k, k in [-127, 127]; code 255 is NaN).
    round_mode: up (away from zero), down (toward zero), nearest (ties up), on |x| (negative inputs
    are unspecified by the spec; their magnitude is used). Zero, inf and out-of-range values clamp to
    the extreme codes with saturate, else become NaN."""
    a = np.abs(x)
    mant, exp = np.frexp(a)                 # a = mant * 2**exp, mant in [0.5, 1)
    if round_mode == "up":
        exp = exp - (mant == 0.5)
    elif round_mode == "down":
        exp = exp - 1
    else:  # nearest, ties up: the significand 2*mant rounds up from 1.5
        exp = exp - (mant < 0.75)
    code = exp.astype(np.int32) + 127
    zero = a == 0
    inf = np.isinf(a)
    if saturate:
        code = np.clip(code, 0, 254)
        code = np.where(zero, 0, np.where(inf, 254, code))
    else:
        code = np.where(zero | inf | (code < 0) | (code > 254), 255, code)
    code = np.where(np.isnan(a), 255, code)
    return code.astype(np.uint8).view(E8M0)


# -- strings -------------------------------------------------------------------------------------

def _as_str(x: np.ndarray) -> np.ndarray:
    """A str (kind 'U') array; numpy decodes bytes items of an object array as it converts."""
    if x.dtype.kind == "U":
        return x
    if x.dtype.kind == "S":
        return np.char.decode(x, "utf-8")
    return x.astype(str)


def parse_strings(x: np.ndarray, to: np.dtype) -> np.ndarray:
    """Strings -> numbers: decimal/scientific notation, INF/+INF/-INF/NaN in any case; "true"/"false"
    for booleans. Integer targets parse integers exactly and truncate decimal strings toward zero."""
    s = np.asarray(np.char.strip(_as_str(x)))
    try:
        if to in _NATIVE_INTS or to in SUBBYTE_INTS:
            try:
                return s.astype(_U64 if to == _U64 else _I64)
            except (ValueError, OverflowError):
                pass
        if to == _BOOL:
            low = np.char.lower(s)
            s = np.where(low == "true", "1", np.where(low == "false", "0", s))
        with np.errstate(invalid="ignore", over="ignore"):
            return s.astype(_F64)
    except ValueError as e:
        raise InvalidValueError(f"cannot convert string to {to}: {e}") from None


_SPECIAL = {"nan": "NaN", "-nan": "NaN", "inf": "INF", "-inf": "-INF"}


def format_numbers(x: np.ndarray) -> np.ndarray:
    """Numbers -> object array of str: the shortest text reading back to the same value of x's type."""
    dt = x.dtype
    if dt == _BOOL:
        return np.where(x, "1", "0").astype(object)
    if dt in SUBBYTE_INTS:
        x = x.astype(np.int8)
    elif dt in _ML_FLOATS:
        x = x.astype(_F32)
    s = x.astype(str)
    if x.dtype.kind == "f":
        for k, v in _SPECIAL.items():
            s = np.where(s == k, v, s)
    return s.astype(object)


# -- the conversion ------------------------------------------------------------------------------

def float64_to_float32_odd(x: np.ndarray) -> np.ndarray:
    """float64 -> float32 rounding to odd (truncate, then set the last bit when inexact).

    ml_dtypes converts double to its small floats through float32 (rounding twice); rounding to odd
    first keeps the sticky information, so the second round-to-nearest-even to any type with at most
    22 significant bits (bfloat16, float8, float4, float6) gives the correctly rounded result."""
    with np.errstate(over="ignore", invalid="ignore"):
        r = x.astype(_F32)
        back = r.astype(_F64)
    inexact = back != x
    inexact &= ~np.isnan(x)
    if not inexact.any():
        return r
    bits = r.view(np.uint32).copy()
    bits -= (np.abs(back) > np.abs(x)) & inexact    # rounded away from zero: one step back (sign-magnitude)
    bits |= inexact.astype(np.uint32)
    return bits.view(_F32)


def _normalize_source(x: np.ndarray) -> np.ndarray:
    """ml_dtypes inputs as an exact numpy-native array (sub-byte ints -> int8, ml floats -> float32)."""
    dt = x.dtype
    if dt in SUBBYTE_INTS:
        return x.astype(np.int8)
    if dt in _ML_FLOATS:
        return x.astype(_F32)
    return x


def plain_sources(to: np.dtype) -> frozenset:
    """The numpy types whose astype(to) is the Cast (it can neither warn nor need the float -> int
    wrap): the fast path; empty unless `to` is a native numpy type."""
    if to not in _NATIVE:
        return frozenset()
    return frozenset(dt for dt in _NATIVE if (dt.kind in "biu" and (to.kind != "f" or to.itemsize >= 4))
                     or (dt.kind == "f" and (to.kind == "b" or (to.kind == "f" and to.itemsize >= dt.itemsize))))


@functools.lru_cache(maxsize=None)
def converter(to: np.dtype, saturate: bool = True, round_mode: str = "up"):
    """fn(x) -> x converted to `to` following the Cast rules (built once per target and attributes)."""
    to = np.dtype(to)

    if is_string(to):
        def to_string(x):
            if is_string(x.dtype):
                return x if x.dtype == _OBJ else x.astype(object)
            return format_numbers(x)
        return to_string

    def source(x):
        if is_string(x.dtype):
            return parse_strings(x, to)
        return _normalize_source(x)

    if to in _NATIVE:
        wrap_from_float = to in _NATIVE_INTS and to not in (_I64, _U64)
        plain = plain_sources(to)

        def to_native(x):
            if x.dtype in plain:
                return x.astype(to, copy=False)
            x = source(x)
            with np.errstate(invalid="ignore", over="ignore"):
                if wrap_from_float and x.dtype.kind == "f":
                    x = x.astype(_I64)      # truncate toward zero, then wrap like the integer casts
                return x.astype(to)
        return to_native

    if to in SUBBYTE_INTS:
        def to_subbyte(x):
            if x.dtype == to:
                return x
            x = source(x)
            if x.dtype == _BOOL:
                x = x.astype(np.int8)
            with np.errstate(invalid="ignore", over="ignore"):
                return x.astype(to)     # ml_dtypes: truncate toward zero, keep the low bits
        return to_subbyte

    def as_float(x):
        """x as float32/float64 (exact for every source but int64/uint64 beyond 2**53)."""
        x = source(x)
        if x.dtype in (_F32, _F64):
            return x
        return x.astype(_F32 if x.dtype.itemsize <= 2 else _F64)

    if to in FLOAT8_MAX:
        # the same type passes through, except float8e5m2's +/-inf, which saturate=1 clamps (the table)
        identity = not saturate or to != _E5M2

        def to_f8(x):
            return x if identity and x.dtype == to else to_float8(as_float(x), to, saturate)
        return to_f8
    if to == E8M0:
        def to_e8m0(x):
            return x if x.dtype == to else to_float8e8m0(as_float(x), saturate, round_mode)
        return to_e8m0
    if to in _PLAIN_FLOATS:
        def to_plain(x):
            if x.dtype == to:
                return x
            x = as_float(x)
            if x.dtype == _F64:
                x = float64_to_float32_odd(x)
            return x.astype(to)
        return to_plain
    raise ValueError(f"no conversion to {to}")


def cast_array(x: np.ndarray, to, saturate: bool = True, round_mode: str = "up") -> np.ndarray:
    """x converted to dtype `to` with Cast's rules (a public helper for other kernels)."""
    return converter(np.dtype(to), bool(saturate), round_mode)(x)


def _check_round_mode(round_mode) -> str:
    if round_mode not in ROUND_MODES:
        raise ValueError(f"round_mode must be one of {', '.join(ROUND_MODES)}, got {round_mode!r}")
    return round_mode


# -- Cast ----------------------------------------------------------------------------------------

def _cast_fn(version: int, to, saturate=1, round_mode="up"):
    allowed_in = schema_dtypes("Cast", version, "T1")
    dst = target_dtype(to, schema_dtypes("Cast", version, "T2"))
    convert = converter(dst, bool(saturate), _check_round_mode(round_mode))
    plain = plain_sources(dst) & allowed_in.keys()     # one lookup for the usual casts: ~0.2 us less a call

    def run(x):
        if x.dtype in plain:
            return x.astype(dst, copy=False)
        check_input(x, allowed_in)
        return convert(x)
    return run


@kernel("Cast", since=(1, 6, 9, 13), views=True, rank="first")
def cast_1(*, to, _version):
    return _cast_fn(_version, to)      # Cast-1's `to` is a type name (e.g. "FLOAT")


@kernel("Cast", since=(19, 21, 23), views=True, rank="first")
def cast_19(*, to, saturate=1, _version):
    return _cast_fn(_version, to, saturate)


@kernel("Cast", since=(24, 25, 28), views=True, rank="first")
def cast_24(*, to, saturate=1, round_mode="up", _version):
    return _cast_fn(_version, to, saturate, round_mode)


# -- CastLike ------------------------------------------------------------------------------------

def _castlike_fn(version: int, saturate=1, round_mode="up"):
    allowed_in = schema_dtypes("CastLike", version, "T1")
    allowed_out = schema_dtypes("CastLike", version, "T2")
    saturate = bool(saturate)
    _check_round_mode(round_mode)

    def run(x, target_type):
        check_input(x, allowed_in)
        to = target_type.dtype
        if is_string(to):
            to = _OBJ
        check_input(target_type, allowed_out, "target_type")
        return converter(to, saturate, round_mode)(x)
    return run


@kernel("CastLike", since=15, views=True)
def castlike_15(*, _version):
    return _castlike_fn(_version)


@kernel("CastLike", since=(19, 21, 23), views=True)
def castlike_19(*, saturate=1, _version):
    return _castlike_fn(_version, saturate)


@kernel("CastLike", since=(24, 25), views=True)
def castlike_24(*, saturate=1, round_mode="up", _version):
    return _castlike_fn(_version, saturate, round_mode)


# -- BitCast -------------------------------------------------------------------------------------

_BITS_OVERRIDE = {np.dtype(ml_dtypes.int4): 4, np.dtype(ml_dtypes.uint4): 4, np.dtype(ml_dtypes.float4_e2m1fn): 4,
                  np.dtype(ml_dtypes.int2): 2, np.dtype(ml_dtypes.uint2): 2}


def bit_width(dtype: np.dtype) -> int:
    return _BITS_OVERRIDE.get(dtype, dtype.itemsize * 8)


@kernel("BitCast", since=26, views=True)
def bitcast_26(*, to, _version):
    allowed_in = schema_dtypes("BitCast", _version, "T1")
    dst = target_dtype(to, schema_dtypes("BitCast", _version, "T2"))
    bits = bit_width(dst)

    def run(x):
        check_input(x, allowed_in)
        if bit_width(x.dtype) != bits:
            raise InvalidValueError(f"BitCast needs types of the same bit width: input {x.dtype} has "
                                    f"{bit_width(x.dtype)} bits, 'to' {dst} has {bits}")
        # ml_dtypes keeps a sub-byte value's code in the low bits of its byte, so a view reinterprets
        # the bits for 4-/2-bit types too; numpy arrays are little endian on every supported platform.
        return x.view(dst)
    return run
