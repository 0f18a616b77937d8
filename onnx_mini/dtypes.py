"""TensorProto element types <-> numpy/ml_dtypes, and TensorProto <-> numpy arrays.

This is the only module that knows how ONNX stores tensor bytes: typed fields, raw_data (little
endian), and the packed sub-byte types (4-bit: int4/uint4/float4e2m1, 2-bit: int2/uint2, 6-bit:
float6e2m3/float6e3m2), all packed as an LSB-first bit stream. External data arrives here as bytes
already read by the loader, which owns the path-safety rules.
"""
from __future__ import annotations

import contextlib
import contextvars
import math
import os
import sys
import threading

import ml_dtypes
import numpy as np
from onnx import TensorProto

from .errors import ModelLoadError, ResourceLimitError

_T = TensorProto
_ML = {
    _T.BFLOAT16: "bfloat16",
    _T.FLOAT8E4M3FN: "float8_e4m3fn",
    _T.FLOAT8E4M3FNUZ: "float8_e4m3fnuz",
    _T.FLOAT8E5M2: "float8_e5m2",
    _T.FLOAT8E5M2FNUZ: "float8_e5m2fnuz",
    _T.UINT4: "uint4",
    _T.INT4: "int4",
    _T.FLOAT4E2M1: "float4_e2m1fn",
    _T.FLOAT8E8M0: "float8_e8m0fnu",
    _T.UINT2: "uint2",
    _T.INT2: "int2",
}
# FLOAT6 types exist only in recent onnx/ml_dtypes; register them when both know them.
for _name, _ml in (("FLOAT6E2M3", "float6_e2m3fn"), ("FLOAT6E3M2", "float6_e3m2fn")):
    if hasattr(_T, _name) and hasattr(ml_dtypes, _ml):
        _ML[getattr(_T, _name)] = _ml

#: element type -> numpy dtype, for every type this installation can represent.
NP_DTYPE: dict[int, np.dtype] = {
    _T.FLOAT: np.dtype(np.float32),
    _T.UINT8: np.dtype(np.uint8),
    _T.INT8: np.dtype(np.int8),
    _T.UINT16: np.dtype(np.uint16),
    _T.INT16: np.dtype(np.int16),
    _T.INT32: np.dtype(np.int32),
    _T.INT64: np.dtype(np.int64),
    _T.STRING: np.dtype(object),
    _T.BOOL: np.dtype(np.bool_),
    _T.FLOAT16: np.dtype(np.float16),
    _T.DOUBLE: np.dtype(np.float64),
    _T.UINT32: np.dtype(np.uint32),
    _T.UINT64: np.dtype(np.uint64),
    _T.COMPLEX64: np.dtype(np.complex64),
    _T.COMPLEX128: np.dtype(np.complex128),
    **{k: np.dtype(getattr(ml_dtypes, v)) for k, v in _ML.items()},
}
ELEM_TYPE: dict[np.dtype, int] = {v: k for k, v in NP_DTYPE.items()}

#: bits per element of the packed sub-byte types.
PACKED_BITS: dict[int, int] = {
    k: b for k, b in (
        (_T.UINT4, 4), (_T.INT4, 4), (_T.FLOAT4E2M1, 4), (_T.UINT2, 2), (_T.INT2, 2),
        (getattr(_T, "FLOAT6E2M3", -1), 6), (getattr(_T, "FLOAT6E3M2", -2), 6),
    ) if k in NP_DTYPE
}
_SIGNED_PACKED = {_T.INT4, _T.INT2}
# Types whose int32_data entries are bit patterns (one element each), not values.
_BIT_PATTERN = {_T.FLOAT16, _T.BFLOAT16, _T.FLOAT8E4M3FN, _T.FLOAT8E4M3FNUZ, _T.FLOAT8E5M2,
                _T.FLOAT8E5M2FNUZ, _T.FLOAT8E8M0} | {k for k, b in PACKED_BITS.items() if b == 6}

# Which typed field holds each element type, and how its values map onto the numpy dtype.
_FIELD = {
    _T.FLOAT: "float_data", _T.COMPLEX64: "float_data",
    _T.DOUBLE: "double_data", _T.COMPLEX128: "double_data",
    _T.INT64: "int64_data",
    _T.UINT32: "uint64_data", _T.UINT64: "uint64_data",
    _T.STRING: "string_data",
}


def type_name(elem_type: int) -> str:
    try:
        return _T.DataType.Name(elem_type).lower()
    except ValueError:
        return f"<unknown element type {elem_type}>"


def np_dtype(elem_type: int) -> np.dtype:
    """The numpy dtype for a TensorProto element type; ModelLoadError if unknown."""
    try:
        return NP_DTYPE[elem_type]
    except KeyError:
        raise ModelLoadError(f"unsupported tensor element type {elem_type} ({type_name(elem_type)})") from None


def elem_type(dtype) -> int:
    """The TensorProto element type of a numpy dtype (str/bytes arrays map to STRING)."""
    dtype = np.dtype(dtype)
    if dtype.kind in "USO":
        return _T.STRING
    try:
        return ELEM_TYPE[dtype]
    except KeyError:
        raise ModelLoadError(f"numpy dtype {dtype} has no ONNX element type") from None


# ---------------------------------------------------------------------------------------------
# Resource limits: the size a single tensor may have when its shape comes from the model or from data.

def _default_max_tensor_bytes() -> int:
    """16 GiB, or half the physical memory when that is smaller."""
    cap = 16 << 30
    try:
        cap = min(cap, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2)
    except (ValueError, OSError, AttributeError):  # not on every platform
        pass
    return cap


DEFAULT_MAX_TENSOR_BYTES = _default_max_tensor_bytes()
# Loop iterations: exported models loop over tokens, time steps or boxes (at most ~10**5-10**6 iterations);
# one onnx_mini iteration costs at least ~10 microseconds (a subgraph run), so 10**7 iterations leave 10x
# headroom over real models while a runaway loop (cond always true, M = INT64_MAX or omitted) stops with an
# error after minutes instead of never, and its per-iteration bookkeeping stays bounded.
DEFAULT_MAX_LOOP_ITERATIONS = 10**7
_limits = {"max_tensor_bytes": DEFAULT_MAX_TENSOR_BYTES, "max_loop_iterations": DEFAULT_MAX_LOOP_ITERATIONS}
_limits_lock = threading.Lock()


def set_limits(*, max_tensor_bytes: int | None = None, max_loop_iterations: int | None = None) -> dict:
    """Set process-wide limits; returns the previous values (pass them back to restore).

    max_tensor_bytes: the largest tensor (in bytes) that a model may make onnx_mini allocate from
    shapes it declares or computes (initializers, ConstantOfShape, Expand, Tile, Range, Resize, Pad...).
    max_loop_iterations: the most iterations one Loop node may run in one call (default 10**7).
    None keeps the current value; 0 restores the default."""
    with _limits_lock:
        previous = dict(_limits)
        for name, value, default in (("max_tensor_bytes", max_tensor_bytes, DEFAULT_MAX_TENSOR_BYTES),
                                     ("max_loop_iterations", max_loop_iterations, DEFAULT_MAX_LOOP_ITERATIONS)):
            if value is not None:
                if int(value) < 0:
                    raise ValueError(f"{name} must be >= 0")
                _limits[name] = int(value) or default
    return previous


# A prepared model's own max_tensor_bytes (prepare(..., max_tensor_bytes=)), set around its loading,
# planning and runs; the smaller of it and the process-wide limit applies.
_model_max_tensor_bytes: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "onnx_mini_max_tensor_bytes", default=None)


@contextlib.contextmanager
def model_limits(max_tensor_bytes: int | None = None):
    """Within the block, tensors may take at most max_tensor_bytes (None: only the process-wide limit)."""
    token = enter_model_limits(max_tensor_bytes)
    try:
        yield
    finally:
        leave_model_limits(token)


def enter_model_limits(max_tensor_bytes: int | None):
    """model_limits() as two calls (a run's hot path): returns the token leave_model_limits takes
    (None, nothing to undo, when that limit is already the one in force)."""
    if max_tensor_bytes is not None and int(max_tensor_bytes) <= 0:
        raise ValueError("max_tensor_bytes must be > 0")
    limit = None if max_tensor_bytes is None else int(max_tensor_bytes)
    return None if _model_max_tensor_bytes.get() == limit else _model_max_tensor_bytes.set(limit)


def leave_model_limits(token) -> None:
    if token is not None:
        _model_max_tensor_bytes.reset(token)


def get_limits() -> dict:
    return dict(_limits)


def max_loop_iterations() -> int:
    """The current cap on one Loop node's iterations (set_limits(max_loop_iterations=...))."""
    return _limits["max_loop_iterations"]


def check_size(shape, dtype, what: str = "the result", error=ResourceLimitError) -> int:
    """Raise `error` (a ResourceLimitError by default) before allocating a tensor of `shape` and
    `dtype` when it would exceed max_tensor_bytes or has a negative dimension; returns its element count.

    Call it in a kernel before the allocation whose size comes from data:
        check_size(shape, dtype, "ConstantOfShape output")"""
    count = 1
    for d in shape:
        d = int(d)
        if d < 0:
            raise error(f"{what}: negative dimension in shape {list(map(int, shape))}")
        count *= d
    itemsize = np.dtype(dtype).itemsize if dtype is not None else 1
    nbytes = count * itemsize
    cap = _limits["max_tensor_bytes"]
    own = _model_max_tensor_bytes.get()
    if own is not None:
        cap = min(cap, own)
    if nbytes > cap:
        raise error(f"{what}: shape {list(map(int, shape))} of {np.dtype(dtype) if dtype is not None else 'bytes'} "
                    f"needs {nbytes:,} bytes, over the limit of {cap:,} bytes "
                    "(onnx_mini.dtypes.set_limits(max_tensor_bytes=...) raises it)")
    return count


def stored_nbytes(elem: int, dims) -> int:
    """Bytes the raw (little-endian / packed) encoding of a tensor of this type and shape holds."""
    count = math.prod(dims)
    if elem in PACKED_BITS:
        return math.ceil(count * PACKED_BITS[elem] / 8)
    return count * np_dtype(elem).itemsize


# ---------------------------------------------------------------------------------------------
# Sub-byte packing: element i occupies bits [i*b, (i+1)*b) of the little-endian bit stream.

def unpack_bits(packed: np.ndarray, bits: int, count: int, signed: bool) -> np.ndarray:
    """Unpack `count` codes of `bits` bits each from uint8 bytes; returns uint8 (or int8) codes."""
    need = math.ceil(count * bits / 8)
    if packed.size < need:
        raise ModelLoadError(f"packed {bits}-bit data has {packed.size} bytes, {need} needed for {count} values")
    stream = np.unpackbits(packed[:need], bitorder="little")[: count * bits].reshape(count, bits)
    codes = np.packbits(stream, axis=1, bitorder="little").reshape(count)
    if signed:  # sign-extend two's complement codes into int8
        codes = ((codes.astype(np.int16) ^ (1 << (bits - 1))) - (1 << (bits - 1))).astype(np.int8)
    return codes


def pack_bits(codes: np.ndarray, bits: int) -> np.ndarray:
    """Inverse of unpack_bits: the low `bits` bits of each code into a packed uint8 stream."""
    flat = np.ascontiguousarray(codes).reshape(-1).view(np.uint8)
    stream = np.unpackbits(flat.reshape(-1, 1), axis=1, bitorder="little")[:, :bits]
    return np.packbits(stream.reshape(-1), bitorder="little")


def _codes_to_array(codes: np.ndarray, elem: int, dims) -> np.ndarray:
    dtype = NP_DTYPE[elem]
    if elem in _SIGNED_PACKED:  # int4/int2 from their integer values
        return codes.astype(dtype).reshape(dims)
    return codes.astype(np.uint8).view(dtype).reshape(dims)


# ---------------------------------------------------------------------------------------------

def tensor_to_array(t: TensorProto, raw=None, *, copy: bool = True) -> np.ndarray:
    """Decode a TensorProto into a numpy array.

    raw: the bytes (or a read-only buffer such as an mmap) of external data read by the loader; when
    given it replaces t.raw_data. copy=False lets a plain little-endian tensor stay a read-only view
    over `raw` (the loader's memory-mapped external data) instead of a fresh array.
    """
    elem = t.data_type
    dims = tuple(t.dims)
    if any(d < 0 for d in dims):
        raise ModelLoadError(f"tensor {t.name!r} has negative dimensions {list(dims)}")
    dtype = np_dtype(elem)
    count = check_size(dims, dtype, f"tensor {t.name!r}", ModelLoadError)
    if raw is None and t.HasField("raw_data"):
        raw = t.raw_data
    if raw is not None:
        if elem == _T.STRING:
            raise ModelLoadError(f"string tensor {t.name!r} cannot use raw_data")
        if elem in PACKED_BITS:
            codes = unpack_bits(np.frombuffer(raw, np.uint8), PACKED_BITS[elem], count, elem in _SIGNED_PACKED)
            return _codes_to_array(codes, elem, dims)
        le = dtype.newbyteorder("<") if dtype.itemsize > 1 and dtype.kind in "iufc" else dtype
        if len(raw) != count * dtype.itemsize:
            raise ModelLoadError(
                f"tensor {t.name!r}: raw data has {len(raw)} bytes, shape {list(dims)} of "
                f"{type_name(elem)} needs {count * dtype.itemsize}")
        arr = np.frombuffer(raw, dtype=le)
        if copy or arr.dtype != dtype:
            arr = arr.astype(dtype, copy=True)
        elif arr.dtype is not dtype:    # '<f4' equals float32 but is another object: kernels' `is` checks miss it
            arr = arr.view(dtype)
        if elem == _T.BOOL and arr.size and arr.view(np.uint8).max() > 1:  # only 0/1 are booleans
            arr = arr.view(np.uint8) != 0
        return arr.reshape(dims)

    field = _FIELD.get(elem, "int32_data")
    values = getattr(t, field)
    if elem == _T.STRING:
        arr = np.empty(len(values), dtype=object)
        arr[:] = [decode_text(s) for s in values]
        n_expected = count
    elif elem in PACKED_BITS and PACKED_BITS[elem] != 6:
        # int32_data holds one packed byte per entry
        packed = np.array(values, dtype=np.int64).astype(np.uint8)
        codes = unpack_bits(packed, PACKED_BITS[elem], count, elem in _SIGNED_PACKED)
        return _codes_to_array(codes, elem, dims)
    elif elem in _BIT_PATTERN:
        bits = np.array(values, dtype=np.int64).astype(np.uint16 if dtype.itemsize == 2 else np.uint8)
        if elem in PACKED_BITS:  # float6: one 6-bit code per entry
            bits &= 0x3F
        arr = bits.view(dtype)
        n_expected = count
    elif elem in (_T.COMPLEX64, _T.COMPLEX128):
        arr = np.array(values, dtype=np.float32 if elem == _T.COMPLEX64 else np.float64).view(dtype)
        n_expected = count
    else:
        arr = np.array(values, dtype=np.uint64 if field == "uint64_data" else None).astype(dtype)
        n_expected = count
    if arr.size != n_expected:
        raise ModelLoadError(
            f"tensor {t.name!r}: {arr.size} values stored, shape {list(dims)} needs {n_expected}")
    return arr.reshape(dims)


def decode_text(s: bytes):
    """ONNX strings are UTF-8; anything else stays bytes rather than failing."""
    try:
        return s.decode("utf-8")
    except UnicodeDecodeError:
        return s


def array_to_tensor(arr, name: str = "") -> TensorProto:
    """Encode a numpy array (any supported dtype, incl. packed sub-byte types) as a TensorProto."""
    arr = np.asarray(arr)
    t = TensorProto()
    t.name = name
    t.dims.extend(arr.shape)
    elem = elem_type(arr.dtype)
    t.data_type = elem
    if elem == _T.STRING:
        t.string_data.extend(s if isinstance(s, bytes) else str(s).encode("utf-8") for s in arr.reshape(-1))
    elif elem in PACKED_BITS:
        codes = arr.astype(np.int8) if elem in _SIGNED_PACKED else arr.view(np.uint8)
        t.raw_data = pack_bits(codes, PACKED_BITS[elem]).tobytes()
    else:
        a = np.ascontiguousarray(arr)
        if sys.byteorder == "big" and a.dtype.itemsize > 1:
            a = a.byteswap()
        t.raw_data = a.tobytes()
    return t
