"""Intra-op parallelism for large kernels.

numpy releases the GIL inside ufunc loops, `take` and BLAS calls, so a kernel whose work splits into
independent blocks can spread them over a small shared thread pool. ONNX_MINI_THREADS caps the
threads (default: the CPU count; 1 disables it), a prepared model's `threads=` or a session's
intra_op_num_threads caps them per run (`limited`, entered by run_scope.running). Kernels stay
pure: each part writes its own slice. A part running on a pool thread never splits again (it runs
its work inline), so parts cannot wait on each other. This module imports no other onnx_mini
module (blas builds on it).

What a part must carry to pay (each user's threshold says what it measured): on this 2-vCPU VM a pool
thread starts its part ~0.1 ms after the hand-off (92-146 us median, at times milliseconds), and two
parts made of many short numpy calls hand the GIL back and forth, each hand-off another wake-up (a
depthwise layer's row copies: 376 against 35 us while the other part ran). Parts of one long call
(BLAS, an einsum) pay the wake-up only. And for ~0.1 s after each product OpenBLAS shares over its
own threads, its worker spins on the core a part would run on (blas.ModeChoice).
"""
from __future__ import annotations

import contextlib
import contextvars
import os
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Callable


def _threads_from_environment() -> int:
    """ONNX_MINI_THREADS, or the CPU count when it is unset, empty or not a whole number (warned)."""
    value = os.environ.get("ONNX_MINI_THREADS", "").strip()
    if value:
        try:
            return max(1, int(value))
        except ValueError:
            warnings.warn(f"ONNX_MINI_THREADS={value!r} is not a whole number: the CPU count is used",
                          RuntimeWarning, stacklevel=2)
    return max(1, os.cpu_count() or 1)


THREADS = _threads_from_environment()
_pool: ThreadPoolExecutor | None = None
# A per-run cap (a session's intra_op_num_threads), local to the thread and context running it.
_cap: contextvars.ContextVar[int | None] = contextvars.ContextVar("onnx_mini_threads", default=None)
_lock = threading.Lock()


class _Worker(threading.local):
    active = False              # True on the pool's own threads (a class default: no failed lookup,
                                # which made threads() ~0.6 us, read once or twice per run)


_worker = _Worker()


def _mark_worker() -> None:
    _worker.active = True


def _get_pool() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        with _lock:
            if _pool is None:
                _pool = ThreadPoolExecutor(THREADS - 1, thread_name_prefix="onnx_mini",
                                           initializer=_mark_worker)
    return _pool


def threads() -> int:
    """How many threads split() may use here and now (1 on the pool's own threads)."""
    if _worker.active:
        return 1
    cap = _cap.get()
    return THREADS if cap is None else max(1, min(cap, THREADS))


def split(work: Callable[[int, int], None], n_items: int, min_items: int) -> None:
    """Call work(start, stop) over contiguous parts of range(n_items), in parallel when there are
    at least min_items per part; the calling thread does the first part itself."""
    parts = min(threads(), n_items // max(1, min_items))
    if parts <= 1:
        work(0, n_items)
        return
    edges = [n_items * k // parts for k in range(parts + 1)]
    futures = [_get_pool().submit(contextvars.copy_context().run, work, edges[k], edges[k + 1])
               for k in range(1, parts)]
    token = _cap.set(1)       # this thread's part must not hand work to the pool its other parts occupy
    try:
        work(edges[0], edges[1])
    finally:
        _cap.reset(token)
        for f in futures:     # every part has ended before the caller reads the result (or an error)
            f.exception()
    for f in futures:
        f.result()


def spawn(work: Callable[[], None], copies: int) -> list:
    """Start `copies` calls of work() on the pool, each in a copy of the caller's context (its size
    limits and thread cap); returns their futures. The caller must wait for them all."""
    pool = _get_pool()
    return [pool.submit(contextvars.copy_context().run, work) for _ in range(copies)]


def shared(work: Callable[[int], None], n_blocks: int) -> None:
    """work(i) for every i in range(n_blocks), each block taken by whichever thread is free next: the caller
    and the pool's threads (each block writes its own part of a result). On a busy machine a pool
    thread may start late: the caller then takes the blocks it would have, and a thread not started when they
    run out is cancelled, never waited for (split's fixed parts wait for it)."""
    helpers = min(threads(), n_blocks) - 1
    if helpers <= 0:
        for i in range(n_blocks):
            work(i)
        return
    blocks = iter(range(n_blocks))       # shared: next() on it is atomic (one C call under the GIL)

    def take():
        for i in blocks:
            work(i)
    futures = spawn(take, helpers)
    try:
        take()
    finally:
        for f in futures:
            if not f.cancel():           # started: wait for its last block (or its error)
                f.exception()
    for f in futures:
        if not f.cancelled():
            f.result()


def cap(threads: int | None) -> contextvars.Token:
    """From now on in this context split() uses at most `threads` threads (None or 0: no cap); give the
    token to uncap() to end it. limited() as two calls, for a run's hot path; None (nothing to undo)
    when that cap is already the one in force (~0.2 us a run)."""
    threads = threads or None
    return None if _cap.get() == threads else _cap.set(threads)


def uncap(token: contextvars.Token | None) -> None:
    if token is not None:
        _cap.reset(token)


@contextlib.contextmanager
def limited(threads: int | None):
    """Within the block, split() uses at most `threads` threads (None or 0: no cap)."""
    token = _cap.set(threads or None)
    try:
        yield
    finally:
        _cap.reset(token)
