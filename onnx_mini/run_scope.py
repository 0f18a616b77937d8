"""The scope of one model run: the services a run uses, entered together.

`enter(threads, uses_blas)` ... `leave(scope)` (or the block `running(...)`) caps parallel.split's
threads for the run (parallel.cap), puts numpy's BLAS in the run's mode when the plan has heavy steps
(blas.start_run: OpenBLAS's thread count changes only while runs are in progress) and, only if the user opted in (ONNX_MINI_MALLOC=tuned), tunes glibc's malloc at the
first run (memory.tune_once). Every run goes through it: PreparedModel.run, compare, profile.

It sits above parallel, blas and memory so that none of them imports another to set up a run
(parallel imports no onnx_mini module, blas imports parallel only, memory none).
"""
from __future__ import annotations

import contextlib

from . import blas, memory, parallel


def enter(threads: int | None = None, uses_blas: bool = True) -> tuple:
    """Enter the scope of one run: at most `threads` threads (None or 0: no cap), numpy's BLAS in the
    run's mode (blas.start_run) unless the plan makes no BLAS call worth managing (`uses_blas`
    False: no heavy step, bodies included; its small products run as OpenBLAS is set), malloc
    tuned once per process if ONNX_MINI_MALLOC=tuned. Returns the token leave() takes. Two plain
    calls rather than a generator context manager: on a tiny model the scope was ~12 us of a 16 us run."""
    memory.tune_once()
    token = parallel.cap(threads)            # the cap first: start_run reads it
    try:
        return token, uses_blas and blas.start_run()
    except BaseException:
        parallel.uncap(token)
        raise


def leave(scope: tuple) -> None:
    token, blas_started = scope
    try:
        if blas_started:
            blas.end_run()
    finally:
        parallel.uncap(token)


@contextlib.contextmanager
def running(threads: int | None = None, uses_blas: bool = True):
    """enter() ... leave() as a block (compare, profile)."""
    scope = enter(threads, uses_blas)
    try:
        yield
    finally:
        leave(scope)
