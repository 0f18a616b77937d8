"""Memory for model runs: the kernels' large arrays in recycled buffers (empty(), zeros(), below) and,
only if the user asks, glibc's malloc tuned for the way a run allocates (tune_malloc()).

ONNX_MINI_MALLOC chooses, read at import:
- unset or "recycle" (the default): recycled large buffers; malloc is left alone.
- "tuned": the same, and glibc's malloc tuned at the first run (as `onnx_mini.tune_malloc()` does
  at once). The benchmarks set it.
- "off" (or "default", its older name): malloc left alone and nothing recycled: plain np.empty.

Tuning malloc. A run allocates and frees the same large temporaries (padded inputs, im2col columns,
layer outputs of 0.1 to 30 MB) over and over. glibc serves large blocks with mmap and gives freed
heap tops back to the system (its thresholds adapt, but to the last size freed), so each run
page-faults its way through fresh memory again: on this VM a fault costs about a microsecond per
4 KB, a millisecond per 4 MB. With blocks up to 32 MB taken from the heap and up to 256 MB of free
heap kept, the second run reuses the first one's pages: shufflenet 16.3 -> 11.9 ms, the U-Net 23.7
-> 19.3 ms (either setting alone made shufflenet slower: 27 and 23 ms, as each switches glibc's
adaptation off). The peak (VmHWM) does not grow; memory freed after a run stays mapped for the next
one, as an arena allocator's would. But mallopt sets it for the whole process, for every allocation
of the host (a web server, a notebook) as well, and for good: so it is opt-in, never a side effect
of running a model. Only with glibc (elsewhere tune_malloc() returns False).

Recycled buffers stay on by default: they change no process setting, only the large arrays onnx_mini's
kernels allocate (256 KB and more) come from them, and the memory they hold between runs is
onnx_mini's, as an onnxruntime arena's would be; release() gives back what no array uses,
held_bytes() tells the rest. With them, tuning malloc gains little more on the models measured.
"""
from __future__ import annotations

import ctypes
import math
import os
import sys
import threading
import warnings

import numpy as np

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20        # glibc's largest accepted value on 64-bit
TRIM_THRESHOLD = 256 << 20
MALLOC = os.environ.get("ONNX_MINI_MALLOC", "").strip().lower() or "recycle"
if MALLOC not in ("recycle", "tuned", "off", "default"):
    warnings.warn(f"ONNX_MINI_MALLOC={MALLOC!r} is not one of recycle, tuned, off: taken as recycle",
                  RuntimeWarning, stacklevel=2)
    MALLOC = "recycle"
_done = [MALLOC != "tuned"]      # nothing left for tune_once to do (not opted in, or tuned already)
_tuned = [False]                 # mallopt was called in this process
_lock = threading.Lock()


def tune_malloc() -> bool:
    """Tune glibc's malloc for repeated model runs, for the whole process and for good (see the
    module doc): blocks up to 32 MB from the heap, up to 256 MB of freed heap kept. Opt-in, also by
    ONNX_MINI_MALLOC=tuned (then done at the first run). Returns whether malloc is tuned: False
    without glibc (musl, macOS, Windows), where there is nothing to tune."""
    with _lock:
        _done[0] = True
        if not _tuned[0]:
            try:
                mallopt = ctypes.CDLL(None).mallopt
            except (OSError, AttributeError):     # not glibc: nothing to tune
                return False
            mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
            mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
            mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
            _tuned[0] = True
        return True


def tuned() -> bool:
    """Whether glibc's malloc has been tuned in this process (tune_malloc or ONNX_MINI_MALLOC=tuned)."""
    return _tuned[0]


# -- recycled buffers: onnx_mini's arena ---------------------------------------------------------------
# A run allocates and frees the same large temporaries (padded inputs, im2col columns, layer outputs)
# run after run. Left to glibc with its settings untouched, they fault in fresh pages on every run:
# blocks over its (adaptive) mmap threshold come from a fresh mmap, and freeing the heap's top gives it
# back to the system (the trim threshold adapts to twice the largest block freed), so the next run's
# growth faults again; on this VM a fault costs about a microsecond per 4 KB. The default-mode runs
# faulted 1200 times (the QDQ MobileNet, 7.4 against 3.5 ms with malloc tuned) and 3100 times (the
# U-Net, 30-33 against 16-19 ms). Batches fault more: ResNet-50 at batch 32 faulted in ~1.3 GB a run.
# So the kernels take their large per-run arrays (convolutions, pools, resizes, quantization, large
# Concats and fused BatchNormalizations) from empty() / zeros() below, which hand out a
# buffer no array uses any more (its only reference the pool's), of the very size first, else the
# smallest free one up to twice the size: a run repeating the previous one's sizes allocates nothing.
# Buffers neither this run nor the last handed out go back at the next miss (a new size), so a model
# whose shapes change does not pile up old ones, and two models run in turn keep theirs; release()
# gives back every free buffer. What is held between runs is onnx_mini's, as an onnxruntime arena's
# would be; ONNX_MINI_MALLOC=off switches all of this off (plain np.empty).

RECYCLE = MALLOC not in ("off", "default")
# 64 KB, 256 KB and 1 MB alike remove the faults of the U-Net, the QDQ MobileNet, DenseNet-121 and
# ShuffleNet (at most ~40 a run left); 4 MB leaves the last two's (1232 / 762 a run: arrays of 1-3 MB).
RECYCLE_MIN_BYTES = 256 << 10
_free_lock = threading.Lock()
_by_size: dict = {}          # nbytes -> [[1-D uint8 buffer, generation it was last handed out in], ...]
_generation = [0]            # runs begun in this process (begin_run)
_dtype, _np_empty, _np_zeros, _prod = np.dtype, np.empty, np.zeros, math.prod


def begin_run() -> None:
    """At the start of every run: a new generation of the recycled buffers; malloc tuned the first
    time if ONNX_MINI_MALLOC=tuned."""
    _generation[0] += 1
    if not _done[0]:
        tune_malloc()


def empty(shape, dtype=np.float64) -> np.ndarray:
    """np.empty(shape, dtype), in a recycled buffer when it is large (see above). A small one costs
    ~0.4 us more than np.empty (the size test)."""
    a = _recycled_view(shape, dtype)
    return _np_empty(shape, dtype) if a is None else a


def zeros(shape, dtype=np.float64) -> np.ndarray:
    """np.zeros(shape, dtype), in a recycled buffer when it is large."""
    a = _recycled_view(shape, dtype)
    if a is None:
        return _np_zeros(shape, dtype)
    a.fill(0)
    return a


def _recycled_view(shape, dtype):
    """A (shape, dtype) view of a recycled buffer, or None for an array too small to recycle (or of
    objects, never made from raw bytes, or with recycling off)."""
    dtype = _dtype(dtype)
    if shape.__class__ is int:
        shape = (shape,)
    nbytes = _prod(shape) * dtype.itemsize
    if nbytes < RECYCLE_MIN_BYTES or not RECYCLE or dtype.hasobject:
        return None
    with _free_lock:
        buf = _take(nbytes)
    return buf[:nbytes].view(dtype).reshape(shape)


def empty_like(a: np.ndarray) -> np.ndarray:
    """A C-ordered empty(a.shape, a.dtype)."""
    return empty(a.shape, a.dtype)


def recycled(buf: np.ndarray) -> bool:
    """Whether buf is one of the recycled buffers (the base of what empty() handed out): besides its
    views, only its pool entry refers to it."""
    return any(entry[0] is buf for entry in _by_size.get(buf.size, ()))


def release() -> None:
    """Give the recycled buffers no array uses any more back to the system."""
    with _free_lock:
        _drop_free(None)


def held_bytes() -> int:
    """Bytes of the recycled buffers (in use or free)."""
    with _free_lock:
        return sum(size * len(entries) for size, entries in _by_size.items())


def _take(nbytes: int) -> np.ndarray:
    generation = _generation[0]
    for entry in _by_size.get(nbytes, ()):
        if sys.getrefcount(entry[0]) == _FREE_REFS:
            entry[1] = generation
            return entry[0]
    best = None                              # the smallest free buffer holding nbytes, up to twice it
    for size, entries in _by_size.items():
        if nbytes < size <= 2 * nbytes and (best is None or size < best[0]):
            for entry in entries:
                if sys.getrefcount(entry[0]) == _FREE_REFS:
                    best = size, entry
                    break
    if best is not None:
        best[1][1] = generation
        return best[1][0]
    _drop_free(generation - 1)               # a miss: what neither this run nor the last used goes back
    # A block of this size allocated and freed first, as a run without the pool would: glibc raises its
    # mmap and trim thresholds when it frees a block it had to mmap, so the arrays numpy allocates on
    # its own keep coming from the heap's reused pages (DenseNet-121's BatchNormalizations and Concats:
    # 36 faults a run without the pool, 2428 with it, none with this block and theirs recycled too)
    np.empty(nbytes, np.uint8)
    buf = np.empty(nbytes, np.uint8)
    _by_size.setdefault(nbytes, []).append([buf, generation])
    return buf


def _drop_free(before) -> None:
    """Drop the free buffers last handed out before generation `before` (None: every free one)."""
    for size in list(_by_size):
        kept = [e for e in _by_size[size]
                if sys.getrefcount(e[0]) > _FREE_REFS or (before is not None and e[1] >= before)]
        if kept:
            _by_size[size] = kept
        else:
            del _by_size[size]


def _free_refs() -> int:
    """sys.getrefcount of a buffer only its pool entry holds (views, and views of views, keep the
    buffer itself alive as their base)."""
    entry = [np.empty(1, np.uint8), 0]
    return sys.getrefcount(entry[0])


_FREE_REFS = _free_refs()
