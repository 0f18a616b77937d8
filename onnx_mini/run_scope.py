"""The scope of one model run: the services a run uses, entered together.

`running(threads)` caps parallel.split's threads for the run (parallel.limited), puts numpy's BLAS
in the run's mode (blas.during_run: OpenBLAS's thread count changes only while runs are in
progress) and, only if the user opted in (ONNX_MINI_MALLOC=tuned), tunes glibc's malloc at the
first run (memory.tune_once). Every run goes through it: PreparedModel.run, compare, profile.

It sits above parallel, blas and memory so that none of them imports another to set up a run
(parallel imports no onnx_mini module, blas imports parallel only, memory none).
"""
from __future__ import annotations

import contextlib

from . import blas, memory, parallel


@contextlib.contextmanager
def running(threads: int | None = None):
    """The scope of one run: at most `threads` threads (None or 0: no cap), numpy's BLAS under
    blas.during_run, and malloc tuned once per process if ONNX_MINI_MALLOC=tuned."""
    memory.tune_once()
    with parallel.limited(threads), blas.during_run():     # the cap first: during_run reads it
        yield
