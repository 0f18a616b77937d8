"""Helpers shared by kernels of several families (one place each).

- axis normalisation: normalize_axis (one axis), normalize_axes (a list of axes, no repeats)
- integer tensors / attribute lists as Python ints: int_list
- ndarray results from ufuncs: as_array
- the opset 1-6 `broadcast`/`axis` form of binary ops: legacy_broadcast
- same element type of two inputs: same_type
- low-precision floats computed in float32 and rounded back once: UPCAST, upcast, float32_compute
- the "zero" of a type (0, False, ""): zero_of
- Max/Min against a constant at numpy's full speed (Relu, Clip, ...): with_scalar
- a constant operand as a read-only 0-d array, made once (cheaper in a ufunc than a scalar): scalar_array
- np.errstate as a decorator at a third of its per-call cost (tiny tensors): fp_errors_ignored
- float32 scalar arithmetic on Python floats (one rounding per step): round_f32
- float results stored in any type without undefined casts: float_to
- element-type attributes checked against the schema's type constraint: allowed_dtypes, dtype_attribute
- the size limit on tensors whose shape comes from data (dtypes.set_limits): check_shape
- a weight transform made once from a factory's _constants (onnxruntime's PrePack): prepack
- constant integer-list inputs (starts, axes, pads...) read once: constant_lists; per-shape checks: by_shape
- an elementwise function of a large array computed by blocks on the pool's threads: by_blocks
"""
from __future__ import annotations

import contextlib
import contextvars
import ctypes
import functools
import inspect

import ml_dtypes
import numpy as np
import onnx
import onnx.defs

from .. import memory, parallel
from ..dtypes import check_size, np_dtype, type_name
from ..errors import InvalidValueError, ModelLoadError


def check_shape(shape, dtype, what: str = "the output"):
    """`shape`, after checking that a tensor of it may be allocated: a ResourceLimitError (the executor
    names the node) when it would pass max_tensor_bytes (dtypes.set_limits) or has a negative dimension.
    One call per kernel that allocates from input values, e.g. `np.full(check_shape(dims, dt), v)`."""
    check_size(shape, dtype, what)
    return shape


def normalize_axis(axis: int, rank: int, what: str = "axis") -> int:
    """Map an axis in [-rank, rank-1] to [0, rank-1]; InvalidValueError outside that range."""
    if not -rank <= axis < rank:
        raise InvalidValueError(f"{what} {axis} is out of range for a tensor of rank {rank} "
                                f"(accepted: [{-rank}, {rank - 1}])")
    return axis + rank if axis < 0 else axis


def normalize_axes(axes, rank: int, what: str = "axes") -> list[int]:
    """Each axis of `axes` mapped into [0, rank-1] (negative ones count from the back);
    InvalidValueError for an axis out of [-rank, rank-1] or a repeated one."""
    out = []
    for a in axes:
        if not -rank <= a < rank:
            raise InvalidValueError(f"{what} {list(axes)}: axis {a} is out of range for rank {rank} "
                                    f"(accepted: [{-rank}, {rank - 1}])")
        out.append(a + rank if a < 0 else a)
    if len(set(out)) != len(out):
        raise InvalidValueError(f"{what} {list(axes)} repeat an axis (the same axis twice for rank {rank})")
    return out


def int_list(values, what: str) -> list[int]:
    """A 1-D (or scalar) integer tensor, or an attribute list, as a list of Python ints."""
    if isinstance(values, np.ndarray):
        if values.dtype.kind not in "iu":
            raise InvalidValueError(f"{what} must be an integer tensor, got {values.dtype}")
        if values.ndim > 1:
            raise InvalidValueError(f"{what} must be 1-D, got shape {list(values.shape)}")
        return values.reshape(-1).tolist()
    return [int(v) for v in values]


def as_array(x):
    """numpy ufuncs return scalars for 0-d inputs; kernels always hand back ndarrays."""
    return x if x.__class__ is np.ndarray else np.asarray(x)


def legacy_broadcast(a: np.ndarray, b: np.ndarray, broadcast: int, axis) -> np.ndarray:
    """Opsets 1-6: B must equal A's shape, or with broadcast=1 be a contiguous run of A's dimensions
    starting at `axis` (default: aligned to the end); size-1 dims of B broadcast. Returns B reshaped."""
    if not broadcast:
        if a.shape != b.shape:
            raise InvalidValueError(f"shapes {list(a.shape)} and {list(b.shape)} differ and broadcast=0")
        return b
    if b.ndim > a.ndim:
        raise InvalidValueError(f"B of shape {list(b.shape)} has higher rank than A {list(a.shape)}")
    start = a.ndim - b.ndim if axis is None else (axis + a.ndim if axis < 0 else axis)
    if not 0 <= start <= a.ndim - b.ndim:
        raise InvalidValueError(f"axis {axis} does not fit B of shape {list(b.shape)} into A {list(a.shape)}")
    for i, d in enumerate(b.shape):
        if d not in (1, a.shape[start + i]):
            raise InvalidValueError(f"B of shape {list(b.shape)} does not match A {list(a.shape)} "
                                    f"from axis {start}")
    return b.reshape((1,) * start + b.shape + (1,) * (a.ndim - start - b.ndim))


def same_type(a: np.ndarray, b: np.ndarray) -> None:
    if a.dtype != b.dtype:
        raise InvalidValueError(f"inputs must have the same element type, got {a.dtype} and {b.dtype}")


#: float types numpy has no (fast or any) arithmetic for: compute in float32, round back once.
UPCAST = frozenset(np.dtype(t) for t in (
    np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fnuz,
    ml_dtypes.float8_e5m2, ml_dtypes.float8_e5m2fnuz, ml_dtypes.float8_e8m0fnu, ml_dtypes.float4_e2m1fn))


def upcast(x: np.ndarray) -> np.ndarray:
    """x as float32 when its type is in UPCAST, else x itself."""
    return x.astype(np.float32) if x.dtype in UPCAST else x


def float32_compute(fn):
    """Wrap fn(x, *rest) so that an UPCAST-typed x (and any array in rest of the same type) is
    computed in float32 and the result rounded back once to x's type; other types pass through.
    A string tensor gets a clear InvalidValueError (the try costs nothing unless fn fails)."""
    if _takes_one(fn):
        # Without *rest: a call of a fixed-arity function takes CPython's fast path (a tiny Neg:
        # ~0.57 against ~0.76 us here, numpy's own call ~0.39).
        def unary(x):
            try:
                dt = x.dtype
                if dt in UPCAST:
                    return as_array(fn(x.astype(np.float32))).astype(dt)
                r = fn(x)
                return r if r.__class__ is np.ndarray else np.asarray(r)
            except (TypeError, ValueError) as e:
                if isinstance(e, InvalidValueError) or x.dtype != object:
                    raise
                raise _string_error(x) from None
        return unary

    def run(x, *rest):
        try:
            dt = x.dtype
            if dt in UPCAST:
                rest = [r.astype(np.float32) if isinstance(r, np.ndarray) and r.dtype == dt else r for r in rest]
                return as_array(fn(x.astype(np.float32), *rest)).astype(dt)
            return as_array(fn(x, *rest))
        except (TypeError, ValueError) as e:
            if isinstance(e, InvalidValueError) or x.dtype != object:
                raise
            raise _string_error(x) from None
    return run


def _takes_one(fn) -> bool:
    """Whether fn takes exactly one argument: a one-input ufunc, or a function of one positional
    parameter (no *args, no defaults after it)."""
    if isinstance(fn, np.ufunc):
        return fn.nin == 1
    code = getattr(fn, "__code__", None)
    return code is not None and code.co_argcount == 1 and not code.co_flags & inspect.CO_VARARGS


def _string_error(x) -> InvalidValueError:
    return InvalidValueError(f"the operator computes on numbers, got a string tensor of shape {list(x.shape)}")


def zero_of(dtype: np.dtype) -> np.ndarray:
    """The 0-d "zero" of a type: 0, False, or the empty string for string (object) tensors."""
    return np.array("", dtype=object) if dtype == object else np.zeros((), dtype=dtype)


# numpy runs maximum/minimum through its SIMD loops only when both operands are contiguous runs: against
# a scalar the same call is ~2.6x slower (106k float32: 41 vs 15.5 us; 1.2M: 455 vs 210 us; add or
# multiply by a scalar have no such gap). So with_scalar gives the constant as a read-only run of it
# (_RUN elements: runs of 4096 lose half the gain to per-row setup, 65536 is as fast as a whole
# array) against x seen as rows of that length, plus the tail.
_RUN = 1 << 16
_RUN_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_runs: dict = {}


def with_scalar(ufunc, x: np.ndarray, value, out: np.ndarray | None = None) -> np.ndarray:
    """ufunc(x, value, out=out) for np.maximum / np.minimum and a scalar value of x's type, faster on
    contiguous float32/float64 arrays; exactly numpy's result (NaN propagates) in every case."""
    dt = x.dtype
    if (x.size < 1024 or dt not in _RUN_DTYPES or not x.flags.c_contiguous
            or (out is not None and out is not x
                and (out.shape != x.shape or out.dtype != dt or not out.flags.c_contiguous))):
        return as_array(ufunc(x, scalar_array(dt, value) if dt.kind in "iuf" else value, out=out))
    key = (dt, type(value), str(value))     # str: -0.0 apart from 0.0, and NaN equal to itself
    run = _runs.get(key)
    if run is None:
        if len(_runs) >= 16:
            _runs.clear()
        run = _runs[key] = np.full(_RUN, dt.type(value), dtype=dt)
        run.flags.writeable = False
    if out is None:
        out = np.empty_like(x)
    xf, of = x.reshape(-1), out.reshape(-1)
    n = xf.size
    if n <= _RUN:                       # one run (the usual layer output): no row split
        ufunc(xf, run[:n], out=of)
        return out
    rows, tail = divmod(n, _RUN)
    body = rows * _RUN
    ufunc(xf[:body].reshape(rows, _RUN), run, out=of[:body].reshape(rows, _RUN))
    if tail:
        ufunc(xf[body:], run[:tail], out=of[body:])
    return out


_scalars: dict = {}


try:        # the clip ufunc itself: np.clip's Python wrapper costs ~4 us a call, half a small tensor's time
    from numpy._core.umath import clip as clip_ufunc
except ImportError:     # numpy 1.x
    clip_ufunc = np.clip


try:        # numpy >= 2: the per-thread context variable np.errstate sets, and its state maker
    from numpy._core.umath import _extobj_contextvar as _FP_STATE, _make_extobj
    _FP_STATE.reset(_FP_STATE.set(_make_extobj(over="ignore")))     # private: a numpy that differs falls back
except Exception:       # numpy 1.x, or another private API
    _FP_STATE = None


def fp_errors_ignored(**kinds):
    """A decorator: its function runs under np.errstate(**kinds) (e.g. over="ignore"), the very state
    (other settings kept, per thread, restored on exit) set on numpy's own context variable: ~0.4 us a
    call against the decorator's ~1.4 (its wrapper passes five keywords each call; measured under load),
    a fixed cost that outweighs the math on a one-element tensor."""
    def wrap(fn):
        if _FP_STATE is None:
            return np.errstate(**kinds)(fn)
        state, make = _FP_STATE, _make_extobj

        @functools.wraps(fn)
        def run(*args):
            token = state.set(make(**kinds))
            try:
                return fn(*args)
            finally:
                state.reset(token)
        return run
    return wrap


def scalar_array(dt: np.dtype, value) -> np.ndarray:
    """value as a read-only 0-d array of type dt, made once: as a ufunc operand, a Python or numpy
    scalar costs each call ~0.7-1 us more here (np.maximum on [1, 128] float32: ~2.0 against ~1.1 us),
    for the same loop and values."""
    # an int keys by itself (bool is not int here), a float by its text: -0.0 apart from 0.0,
    # and NaN equal to itself
    key = (dt, value) if value.__class__ is int else (dt, type(value), str(value))
    zero_d = _scalars.get(key)
    if zero_d is None:
        if len(_scalars) >= 64:
            _scalars.clear()
        zero_d = _scalars[key] = np.array(dt.type(value), dtype=dt)
        zero_d.flags.writeable = False
    return zero_d


_C_FLOAT = ctypes.c_float


def round_f32(v: float) -> float:
    """v rounded once to float32 (to nearest, ties to even; beyond float32's range +-inf), as a Python
    float: ctypes' C conversion, ~0.16 us against float(np.float32(v))'s ~0.32 (which also warns on
    overflow). One +, -, *, / or sqrt of float32 values done on Python floats and then rounded by it
    is exactly numpy's float32 result: binary64 has 53 >= 2 * 24 + 2 bits, so the double rounding is
    innocuous (Figueroa, "When is double rounding innocuous?", 1995); overflow rounds to inf alike.
    For per-call scalar steps that numpy scalars or tiny arrays make slow (~0.3-2.5 us each)."""
    return _C_FLOAT(v).value


def float_to(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A float result converted to `dtype`. For an integer dtype: truncated toward zero, -inf/+inf and
    out-of-range values saturate to the type's bounds, NaN becomes 0 (so no cast is undefined)."""
    if dtype.kind not in "iu":
        return x.astype(dtype, copy=False)
    info = np.iinfo(dtype)
    x = np.nan_to_num(np.trunc(x), nan=0.0, posinf=float(info.max), neginf=float(info.min))
    return np.clip(x, float(info.min), float(info.max)).astype(dtype)


@functools.lru_cache(maxsize=None)
def allowed_dtypes(op: str, version: int, param: str) -> frozenset:
    """The numpy dtypes of the tensor types the schema of (op, version) allows for type parameter
    `param`, e.g. allowed_dtypes("EyeLike", 22, "T2"); used to validate dtype attributes."""
    schema = onnx.defs.get_schema(op, version)
    (constraint,) = [c for c in schema.type_constraints if c.type_param_str == param]
    names = [t[len("tensor("):-1] for t in constraint.allowed_type_strs if t.startswith("tensor(")]
    return frozenset(np_dtype(getattr(onnx.TensorProto, n.upper())) for n in names)


def dtype_attribute(value: int, op: str, version: int, param: str, what: str) -> np.dtype:
    """The numpy dtype of a TensorProto element-type attribute, ValueError when the schema forbids it."""
    allowed = allowed_dtypes(op, version, param)
    try:
        dt = np_dtype(int(value))
    except ModelLoadError:
        dt = None
    if dt not in allowed:
        raise ValueError(f"{what}={value} ({type_name(int(value))}) is not an allowed output type of "
                         f"{op}-{version}")
    return dt


def broadcasts_to(shape: tuple, target: tuple) -> bool:
    """Whether an array of `shape` broadcasts to `target` without changing it (ONNX unidirectional
    broadcasting: PRelu's slope, normalization scales, attention masks)."""
    if tuple(shape) == tuple(target):
        return True
    try:
        return np.broadcast_shapes(tuple(shape), tuple(target)) == tuple(target)
    except ValueError:
        return False


def prepack(fn, constants, indices, required=1):
    """fn over the node's inputs at `indices`, made once at prepare (onnxruntime's PrePack) when the first
    `required` of them are constants (the others: constants or omitted). Returns get(*those inputs at run
    time): the prepared value while they are the arrays it was made from (a constant arrives as that same
    array), else fn computed per call (inputs fed at run time). A transform failing at prepare is left to
    fail at run time, where a fed input's error is raised, so both report alike. Within a model's
    planning (prepacking), a transform the model has made already is not made again (below)."""
    constants = constants or {}
    if any(i not in constants for i in indices[:required]):
        return fn
    made = tuple(constants.get(i) for i in indices)
    memo = _prepacked.get()
    key = None if memo is None else _transform_key(fn, made)
    if key is not None and key in memo:
        value = memo[key][0]
    else:
        try:
            value = fn(*made)
        except Exception:
            return fn
        if isinstance(value, np.ndarray):
            value.setflags(write=False)     # shared by every run
        if key is not None:
            memo[key] = (value, made, fn)   # made and fn pinned: the ids in the key stay theirs

    def get(*args):
        for a, m in zip(args, made):    # a plain loop: ~0.3 us less per call than all() over a generator
            if a is not m:
                return fn(*args)
        return value
    return get


# The transforms of constant inputs a model has made (prepack), while its plans are built (prepacking):
# the general plan, each shape-specialised plan (specialize.py plans the graph again at a run's first
# new input shape, with the same constant arrays) and each subset of outputs share them, so a weight is
# transformed once and held once. The int4 decoder's first run re-made its MatMulNBits weights (0.41 s
# of 0.42, and a second 60 MB copy). Per model (the dict lives on the PreparedModel), never global.
_prepacked: contextvars.ContextVar[dict | None] = contextvars.ContextVar("onnx_mini_prepacked", default=None)
_SCALARS = (int, float, str, bytes, bool, type(None), np.dtype, np.generic)


@contextlib.contextmanager
def prepacking(memo: dict):
    """prepack() within the block reuses and records the transforms in `memo` (one model's)."""
    token = _prepacked.set(memo)
    try:
        yield
    finally:
        _prepacked.reset(token)


def _transform_key(fn, made: tuple):
    """What decides fn(*made): fn's code, the values it closes over (scalars and tuples of them by value,
    anything else by identity: pinned with the memo entry) and the constant arrays by identity. None for
    what is not a plain function (nothing reused)."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return None
    parts = []
    for cell in fn.__closure__ or ():
        try:
            v = cell.cell_contents
        except ValueError:                  # a cell not yet filled
            return None
        if isinstance(v, _SCALARS) or (isinstance(v, tuple) and all(isinstance(e, _SCALARS) for e in v)):
            parts.append((0, v))
        else:
            parts.append((1, id(v)))
    key = code, tuple(parts), fn.__defaults__, tuple(id(m) for m in made)
    try:
        hash(key)
    except TypeError:                       # (an unhashable default argument)
        return None
    return key


MISSING = object()
SHAPES_KEPT = 64   # input shapes one node keeps the checked index / shape of (bookkeeping, not a measurement)


def by_shape(make):
    """index(shape): make(shape) computed once per input shape (up to SHAPES_KEPT of them) and kept;
    what make raises is raised again at each call of that shape. The per-call checks of a kernel
    whose other inputs are constants, done once: a Slice of the VAD costs ~0.9 us instead of ~6."""
    made: dict = {}

    def index(shape):
        known = made.get(shape, MISSING)
        if known is MISSING:
            known = make(shape)
            if len(made) < SHAPES_KEPT:
                made[shape] = known
        return known
    return index


def constant_lists(constants, required: tuple, optional: tuple, what: dict):
    """For a kernel whose integer-list inputs (starts, axes, pads...) are usually constants: (their values
    as given, the same as lists of ints) when every `required` input index is a constant, else None
    (also when one is not a valid integer list: the per-call path reports it). An `optional` index
    not in the constants gives None, which matches an omitted input; the kernel compares its inputs
    to the given values by identity (a constant arrives as that same array), so one fed at run time
    takes the per-call path. `what` names each index in int_list's errors."""
    constants = constants or {}
    if any(i not in constants for i in required):
        return None
    given = tuple(constants.get(i) for i in required + optional)
    try:
        return given, tuple(None if v is None else int_list(v, what[i])
                            for i, v in zip(required + optional, given))
    except (InvalidValueError, TypeError, ValueError):
        return None


# An elementwise function of at least this many values runs by blocks of at most BLOCK_VALUES on both
# threads (Gelu, float32, in one process, alternating, median ms whole / in blocks on two threads:
# 512K 1.66 / 1.56, 1M 3.9 / 3.3, 1.7M 7.2 / 3.9, 3.4M 16.8 / 7.2; below ~1M the pool's hand-off and the
# GIL taken back between the blocks' numpy calls cost what the second thread saves)
BLOCKS_MIN_VALUES = 1 << 20
BLOCK_VALUES = 1 << 20          # 3.4M values: 4 blocks 8.65 ms, 8 blocks 8.09, 2 (halves) 9.7, whole 18.0;
                                # 1.7M: 2 blocks 3.9 ms, 4 or 8 blocks 5.0-6.4 (alternating, alone)


def by_blocks(fn):
    """fn(x) for an elementwise fn whose result has x's shape and type (each value from the same value of
    x alone): a large contiguous x by blocks of its flat values shared among parallel.split's threads,
    each block's result copied into the output while in the caches; the same values as fn(x) whole."""
    def run(x):
        n = x.size
        if n < BLOCKS_MIN_VALUES or parallel.threads() < 2 or not x.flags.c_contiguous:
            return fn(x)
        blocks = max(2, -(-n // BLOCK_VALUES))
        blocks += blocks % 2
        flat, out = x.reshape(-1), memory.empty(n, x.dtype)

        def work(b0, b1):
            for b in range(b0, b1):
                s, e = n * b // blocks, n * (b + 1) // blocks
                out[s:e] = fn(flat[s:e])
        parallel.split(work, blocks, blocks // 2)
        return out.reshape(x.shape)
    return run
