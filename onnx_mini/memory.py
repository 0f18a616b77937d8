"""glibc's malloc, tuned once for the way a model run allocates.

A run allocates and frees the same large temporaries (padded inputs, im2col columns, layer outputs
of 0.1 to 30 MB) over and over. glibc serves large blocks with mmap and gives freed heap tops back
to the system (its thresholds adapt, but to the last size freed), so each run page-faults its way
through fresh memory again: on this VM a fault costs about a microsecond per 4 KB, a millisecond
per 4 MB. With blocks up to 32 MB taken from the heap and up to 256 MB of free heap kept, the
second run reuses the first one's pages: shufflenet 16.3 -> 11.9 ms, the U-Net 23.7 -> 19.3 ms
(either setting alone made shufflenet slower: 27 and 23 ms, as each switches glibc's adaptation off).
The peak (VmHWM) does not grow; memory freed after a run stays mapped for the next one, as an
arena allocator's would. Done at the first run, for the whole process, only with glibc;
ONNX_MINI_MALLOC=default leaves malloc alone.
"""
from __future__ import annotations

import ctypes
import os
import threading

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20        # glibc's largest accepted value on 64-bit
TRIM_THRESHOLD = 256 << 20
_done = [os.environ.get("ONNX_MINI_MALLOC", "").lower() == "default"]
_lock = threading.Lock()


def tune_once() -> None:
    if _done[0]:
        return
    with _lock:
        if _done[0]:
            return
        _done[0] = True
        try:
            mallopt = ctypes.CDLL(None).mallopt
        except (OSError, AttributeError):     # not glibc (musl, macOS, Windows): nothing to tune
            return
        mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
