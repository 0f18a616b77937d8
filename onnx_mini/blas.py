"""Matrix products on numpy's BLAS, with onnx_mini choosing how many threads each one gets.

numpy's wheels bundle OpenBLAS, which runs every product above a small size on all cores with
worker threads that wait for one another. On a machine whose cores are also busy with other
processes those waits dominate: the light ResNet-50 takes 67 ms here on the idle 2-vCPU machine and
1.09 s with two busy processes beside it (148 ms with one BLAS thread; a 2048x512x49 product: 0.6 ms
idle, 8 ms loaded). So while onnx_mini runs a model (`during_run`), numpy's OpenBLAS is set to one
thread, and `matmul` splits the products worth it into row (or column, or batch) blocks over
parallel.split's small pool: one hand-off per product instead of OpenBLAS's many, the calling thread
computing a block itself. Each block is its own BLAS call on its own slice of the output, so the
result does not depend on timing.

ONNX_MINI_BLAS_THREADS=native leaves numpy's BLAS alone (its own threads, no splitting), as does a
numpy whose BLAS is not the bundled OpenBLAS (then its thread count cannot be set from here).
Outside a run (constant folding at prepare time, the user's own numpy calls) nothing changes.
"""
from __future__ import annotations

import contextlib
import ctypes
import glob
import math
import os
import threading

import numpy as np

from . import parallel

# A part of a split product must have at least this many multiply-adds: waking a pool thread costs
# ~70 us on this VM, so smaller parts lose (measured: an LSTM step's 16x256x1024 product takes 180 us
# whole and 171 us split in two; with parts of 1M the GRU/LSTM models ran 5-30% slower than with 4M).
MIN_PART_MACS = 4_000_000
_SPLIT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.complex64), np.dtype(np.complex128))


def _find_openblas():
    """(get_num_threads, set_num_threads) of the OpenBLAS bundled with numpy's wheel, or None."""
    libs = os.path.join(os.path.dirname(os.path.dirname(np.__file__)), "numpy.libs")
    for path in sorted(glob.glob(os.path.join(libs, "libscipy_openblas*"))):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for get_name, set_name in (("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
                                   ("scipy_openblas_get_num_threads", "scipy_openblas_set_num_threads"),
                                   ("openblas_get_num_threads", "openblas_set_num_threads")):
            get, set_ = getattr(lib, get_name, None), getattr(lib, set_name, None)
            if get is not None and set_ is not None:
                get.restype, get.argtypes = ctypes.c_int, []
                set_.restype, set_.argtypes = None, [ctypes.c_int]
                return get, set_
    return None


_OPENBLAS = None if os.environ.get("ONNX_MINI_BLAS_THREADS", "").lower() == "native" else _find_openblas()
_lock = threading.Lock()
_active = 0          # runs in progress (any thread)
_saved = 1           # OpenBLAS's thread count before the first of them started


def managed() -> bool:
    """Whether onnx_mini sets numpy's BLAS threads during runs and splits products itself."""
    return _OPENBLAS is not None


@contextlib.contextmanager
def during_run():
    """numpy's OpenBLAS on one thread while any onnx_mini run is in progress; restored after the last."""
    global _active, _saved
    if _OPENBLAS is None:
        yield
        return
    get, set_ = _OPENBLAS
    with _lock:
        _active += 1
        if _active == 1:
            _saved = get()
            if _saved != 1:
                set_(1)
    try:
        yield
    finally:
        with _lock:
            _active -= 1
            if _active == 0 and _saved != 1:
                set_(_saved)


def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """np.matmul(a, b, out=out), split over the pool's threads when the product is large enough
    and runs inside during_run (float types only; anything else goes to np.matmul unchanged)."""
    if (_active == 0 or a.ndim < 2 or b.ndim < 2 or a.dtype != b.dtype or a.dtype not in _SPLIT_DTYPES
            or a.shape[-1] != b.shape[-2] or parallel.threads() < 2):
        return np.matmul(a, b, out=out)
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    if a.ndim > 2 and b.ndim == 2 and a.flags.c_contiguous:   # a stack of rows times one matrix
        if out is not None and not out.flags.c_contiguous:
            return np.matmul(a, b, out=out)
        y = _split_2d(a.reshape(-1, k), b, None if out is None else out.reshape(-1, n))
        return y.reshape(*a.shape[:-1], n) if out is None else out
    if a.ndim == 2 and b.ndim == 2:
        return _split_2d(a, b, out)
    if a.shape[:-2] == b.shape[:-2] and math.prod(a.shape[:-2]) == 1:   # a batch of one: a 2-D product
        if out is not None:
            return np.matmul(a, b, out=out)
        return _split_2d(a.reshape(m, k), b.reshape(k, n), None).reshape(*a.shape[:-1], n)
    if a.shape[:-2] == b.shape[:-2]:                                  # same batch: split the first batch axis
        macs = math.prod(a.shape[1:-2]) * m * k * n
        if macs * a.shape[0] < 2 * MIN_PART_MACS:
            return np.matmul(a, b, out=out)
        if out is None:
            out = np.empty((*a.shape[:-1], n), a.dtype)

        def part(i, j):
            np.matmul(a[i:j], b[i:j], out=out[i:j])
        parallel.split(part, a.shape[0], max(1, MIN_PART_MACS // max(1, macs)))
        return out
    return np.matmul(a, b, out=out)


def _split_2d(a, b, out):
    m, k = a.shape
    n = b.shape[1]
    if m * k * n < 2 * MIN_PART_MACS:
        return np.matmul(a, b, out=out)
    if out is None:
        out = np.empty((m, n), a.dtype)
    if m >= n:
        def part(i, j):
            np.matmul(a[i:j], b, out=out[i:j])
        parallel.split(part, m, max(1, MIN_PART_MACS // (k * n)))
    else:
        def part(i, j):
            np.matmul(a, b[:, i:j], out=out[:, i:j])
        parallel.split(part, n, max(1, MIN_PART_MACS // (k * m)))
    return out
