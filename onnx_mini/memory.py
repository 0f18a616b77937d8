"""Memory for model runs: large layer outputs in recycled buffers (empty(), below) and, only if the
user asks, glibc's malloc tuned for the way a run allocates (tune_malloc()).

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

Recycled buffers stay on by default: they change no process setting, only onnx_mini's own large
outputs (32 MB and more) come from them, and the memory they hold between runs is onnx_mini's, as an
onnxruntime arena's would be; release() gives back what no array uses, held_bytes() tells the rest.
"""
from __future__ import annotations

import ctypes
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


def tune_once() -> None:
    """At the start of every run: tune malloc the first time, if ONNX_MINI_MALLOC=tuned."""
    if not _done[0]:
        tune_malloc()


# -- recycled large buffers -------------------------------------------------------------------------
# Blocks over MMAP_THRESHOLD always get a fresh mmap from glibc, which the kernel zero-fills page by
# page: a batch of 32 through ResNet-50 faulted in ~1.3 GB per run (0.1-0.4 s of system time in a
# 2 s run). Layer outputs of that size come from empty() below instead, which hands out a buffer an
# earlier output no longer uses: 63 -> 55 ms per image at batch 32. The buffers stay allocated between
# runs, as an arena's would (release() gives them back); ONNX_MINI_MALLOC=off switches this off.

RECYCLE = MALLOC not in ("off", "default")
RECYCLE_MIN_BYTES = MMAP_THRESHOLD          # smaller blocks: malloc may serve them from its heap
_free_lock = threading.Lock()
_buffers: list = []                          # 1-D uint8 arrays, most recently handed out first


def empty(shape, dtype):
    """np.empty(shape, dtype), in a recycled buffer when it is large (see above)."""
    dtype = np.dtype(dtype)
    nbytes = dtype.itemsize
    for d in shape:
        nbytes *= d
    if nbytes < RECYCLE_MIN_BYTES or not RECYCLE or dtype.hasobject:    # objects: not from raw bytes
        return np.empty(shape, dtype)
    with _free_lock:
        for k in range(len(_buffers)):
            if nbytes <= _buffers[k].size <= 2 * nbytes and _refs(_buffers, k) == _FREE_REFS:
                buf = _buffers.pop(k)
                break
        else:
            # A miss: the free buffers did not fit, give them back; what stays is in use. A run that
            # repeats the previous one's sizes then misses nothing and holds no more than it did.
            _drop_free()
            buf = np.empty(nbytes, np.uint8)
        _buffers.insert(0, buf)
    return buf[:nbytes].view(dtype).reshape(shape)


def release() -> None:
    """Give the recycled buffers no array uses any more back to the system."""
    with _free_lock:
        _drop_free()


def held_bytes() -> int:
    """Bytes of the recycled buffers (in use or free)."""
    with _free_lock:
        return sum(b.size for b in _buffers)


def _drop_free() -> None:
    _buffers[:] = [_buffers[k] for k in range(len(_buffers)) if _refs(_buffers, k) > _FREE_REFS]


def _refs(buffers: list, k: int) -> int:
    """References to buffers[k]; _FREE_REFS when only the list holds it (every array handed out from
    it is gone: views, and views of views, keep the buffer itself alive as their base)."""
    buf = buffers[k]
    return sys.getrefcount(buf)


_FREE_REFS = _refs([bytearray(1)], 0)
