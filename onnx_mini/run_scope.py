"""The scope of one model run: the services a run uses, entered together.

`enter(threads, uses_blas, max_tensor_bytes)` ... `leave(scope)` (or the block `running(...)`) caps
parallel.split's threads for the run (parallel.cap), puts numpy's BLAS in the run's mode when the
plan has heavy steps (blas.start_run: OpenBLAS's thread count changes only while runs are in
progress), puts the model's own tensor size limit in force (dtypes.enter_model_limits), starts a
generation of the recycled buffers and, only if the user opted in (ONNX_MINI_MALLOC=tuned), tunes
glibc's malloc at the first run (memory.begin_run).
Every run goes through it: PreparedModel.run, compare, profile. `settle(threads, uses_blas)` is for the
tools that time runs: they start once the BLAS mode such runs take is decided (blas.settle).

It sits above parallel, blas and memory (and the leaf dtypes) so that none of them imports another
to set up a run (parallel imports no onnx_mini module, blas imports parallel only, memory none).
"""
from __future__ import annotations

import contextlib
import time

from . import blas, dtypes, memory, parallel

# The usual small run (no thread cap asked or in force, no heavy step, no size limit) reads the two
# context variables straight and has nothing to undo: enter+leave 0.42 -> 0.22 us (timeit, under load).
_cap_get = parallel._cap.get
_limit_get = dtypes._model_max_tensor_bytes.get
_NOTHING = (None, False, None, 0.0)


def enter(threads: int | None = None, uses_blas: bool = True, max_tensor_bytes: int | None = None,
          modes: blas.ModeChoice | None = None, trial: bool = True) -> tuple:
    """Enter the scope of one run: at most `threads` threads (None or 0: no cap), numpy's BLAS in the
    run's mode (blas.start_run; modes: the model's blas.ModeChoice, which times the run when it is one
    of its trials, unless `trial` is False) unless the plan makes no BLAS call worth managing
    (`uses_blas` False: no heavy step, bodies included; its small products run as OpenBLAS is set), the
    model's own tensor size limit (dtypes.model_limits; None: the process-wide one only), a new
    generation of recycled buffers, malloc tuned once per process if ONNX_MINI_MALLOC=tuned. Returns
    the token leave() takes. Plain calls rather than a generator context manager: on a tiny model the
    scope was ~12 us of a 16 us run."""
    memory.begin_run()
    if not threads and not uses_blas and max_tensor_bytes is None and _cap_get() is None and _limit_get() is None:
        return _NOTHING                      # no cap, no BLAS mode, no limit to put in force or undo
    token = parallel.cap(threads)            # the cap first: start_run reads it
    try:
        blas_started = uses_blas and blas.start_run(modes, trial)
        try:
            limits = dtypes.enter_model_limits(max_tensor_bytes)
            began = time.perf_counter() if blas_started.__class__ is blas._Trial else 0.0
            return token, blas_started, limits, began
        except BaseException:
            if blas_started:
                blas.end_run()
            raise
    except BaseException:
        parallel.uncap(token)
        raise


def leave(scope: tuple) -> None:
    if scope is _NOTHING:
        return
    token, blas_started, limits, began = scope
    try:
        try:
            dtypes.leave_model_limits(limits)
        finally:
            if blas_started.__class__ is blas._Trial:
                blas.end_run(blas_started, time.perf_counter() - began)
            elif blas_started:
                blas.end_run()
    finally:
        parallel.uncap(token)


@contextlib.contextmanager
def running(threads: int | None = None, uses_blas: bool = True, max_tensor_bytes: int | None = None,
            modes: blas.ModeChoice | None = None, trial: bool = True):
    """enter() ... leave() as a block (compare, profile)."""
    scope = enter(threads, uses_blas, max_tensor_bytes, modes, trial)
    try:
        yield
    finally:
        leave(scope)


def settle(threads: int | None = None, uses_blas: bool = True) -> None:
    """Before timing runs of a plan (the CLI's bench and run's steady state, profile): wait until the
    BLAS mode those runs take is decided (blas.settle: a new process runs "split" until the machine reads
    idle), where it is in question: a plan that manages BLAS and is not capped to one thread (a sequential
    run splits whatever the load)."""
    if uses_blas and threads != 1:
        blas.settle()
