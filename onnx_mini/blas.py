"""Matrix products on numpy's BLAS, with onnx_mini choosing how many threads each one gets.

numpy's wheels bundle OpenBLAS, which runs every product above a small size on all cores with
worker threads that spin and wait for one another. On an idle machine that is the fastest there
is; on a machine whose cores are also busy with other processes those waits dominate: the light
ResNet-50 takes 67 ms here on the idle 2-vCPU machine and 0.26 to 1.09 s with two busy processes
beside it (a 2048x512x49 product: 0.6 ms idle, 8 ms loaded). onnx_mini's own pool does not spin:
waking its thread costs ~70 us on this VM, so splitting products itself loses to OpenBLAS on an idle
machine (64x576x3136: 1.4 ms OpenBLAS, 3.1 ms split) and wins when loaded (5.8 against 1.5 ms).

So each run (`during_run`) picks a mode when it starts, kept while runs overlap:
- "native": OpenBLAS's own threads, no splitting: other processes have used less than half a core
  in the last two readings of the machine's load (a quarter second apart) and in none of the
  readings of the last 3 seconds (see _busy: neighbours' load comes in bursts that one reading
  between two of them does not see; a burst makes a native run 10-30 times slower, splitting makes
  a run on an idle machine at most ~2 times slower), unless the model chose split (below). A
  process starts in "split" until its readings say idle;
- "split": numpy's OpenBLAS on one thread and `matmul` splitting the products worth it into row
  (or column, or batch) blocks over parallel.split's pool, one hand-off per product, the calling
  thread computing a block itself: the machine is busy, or the run is capped to one thread
  (`prepare(threads=1)`, `intra_op_num_threads=1`: then nothing is split either), or the model's
  runs measured faster so on this idle machine (ModeChoice: a prepared model's first runs on an idle
  machine try both modes in turn and keep the faster, tried again a minute later; OpenBLAS's spinning
  worker takes the second core from onnx_mini's own parallel work for ~0.1 s after each product it
  shares).
Each block is its own BLAS call on its own slice of the output, so results do not depend on timing
within a mode; the mode may change a convolution's algorithm (select's `splitting`), so the two modes'
results may differ in their last bits.

ONNX_MINI_BLAS_THREADS=split (or managed) always splits, =native always leaves numpy's BLAS alone
(its own threads, no splitting), as does a numpy whose BLAS is not the bundled OpenBLAS (then its
thread count cannot be set from here). Outside a run (constant folding at prepare time, the user's
own numpy calls) nothing changes: one object (_ThreadState) owns the count onnx_mini sets, for runs
and own_threads blocks alike, and gives OpenBLAS its own count back when the last of them ends.
"""
from __future__ import annotations

import contextlib
import ctypes
import glob
import math
import os
import threading
import time

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


POLICY = os.environ.get("ONNX_MINI_BLAS_THREADS", "auto").lower()      # auto, split (managed), native


def _forced_split() -> bool:
    """Whether the policy puts every run in "split" mode whatever the load."""
    return POLICY in ("split", "managed")


_OPENBLAS = None if POLICY == "native" else _find_openblas()
_CPUS = os.cpu_count() or 1
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
# The auto policy's constants. Split is the safe side: splitting on an idle machine costs up to ~2x
# on a product (64x576x3136: 1.4 -> 3.1 ms), OpenBLAS's spinning threads on a busy one 10-30x
# (2048x512x49: 0.6 -> 8 ms; mobilenet_qdq runs of 112 ms against a 3.4 ms median).
_BUSY_CORES = 0.5    # other processes' cores from which a reading is busy
_EVERY = 0.25        # seconds between two readings of the machine's load (one costs ~15-35 us)
# Bursty neighbours leave readings of 0.25 s that look idle between bursts: once a reading is busy,
# "split" is kept this long (every busy reading renews it) ... Replaying a 45 s trace of this shared
# machine's own load (1.1 cores on average, in bursts) in 50 ms slots: the old policy (each reading
# alone) ran native in 14% of the slots with a burst, a 1 s hold in 2%, 3 s in 1%, 5 s never native.
_HOLD = 3.0
# ... and "native" needs this many idle readings in a row (>= 0.5 s without a busy one) after it
# (without a hold: 14% -> 2% of the burst slots native in the same replay).
_IDLE_READINGS = 2


# -- the mode one model's runs take on an idle machine ----------------------------------------------
# On an idle machine the auto policy's runs would all be "native", but which mode is faster depends on
# the model: after each product it shares, OpenBLAS's worker spins for ~0.11 s (a full core of CPU time
# measured in the 0.2 s after one 512^3 product, whatever the thread count is set to meanwhile), taking
# the second core from onnx_mini's pool (images on two threads, a Gelu by blocks, depthwise parts) and,
# on this VM, slowing the calling thread too. The same process, the modes alternating (native / split):
# Magika 133 / 83 ms, the Scan RNN 1.16 / 0.74, the greedy decoder 3.9 / 3.2, rapidocr's classifier
# 6.6 / 6.0; BERT 18 / 28, the GRU 20 / 26, the LSTM 28 / 36, the U-Net 22 / 28, PP-OCR det 87 / 106.
# So each prepared model tries both on its first runs on an idle machine and keeps the faster (ModeChoice).
PHASES = 4             # blocks of trial runs: native, split, native, split
TRIAL_RUNS = 2         # timed runs in each block (after one left out), at least
TRIAL_SECONDS = 0.15   # ... and at least this much of their time (a run of a millisecond: this VM's noise),
TRIAL_MAX_RUNS = 120   # ... or this many runs
SPLIT_MARGIN = 0.9     # "split" kept when its median run is at most this share of native's: else native,
                       # the mode before the choice (two modes within ~10% are within this VM's noise)
RETRY_SECONDS = 60.0   # a choice this old is tried again at the next run (a trial a neighbour's burst misled)


class ModeChoice:
    """One prepared model's mode on an idle machine (see above): its first runs there are tried in
    PHASES blocks, native, split, native, split (blocks, not alternating runs: a native run's spinning
    worker slows the run after it; two of each: a drift of the machine's speed weighs on both), each
    block's first run left out (the model's first run; the first after the other mode), the runs that
    overlap others not timed; then split where its median is at most SPLIT_MARGIN of native's, tried
    again RETRY_SECONDS later. A hooked run (profile, compare) takes the decided mode but is no trial
    (native until decided). Used under _state.lock."""
    __slots__ = ("phase", "started", "timed", "times", "split", "until")

    def __init__(self):
        self.phase = 0               # the block being tried (even: native, odd: split)
        self.started = 0             # trial runs started in this block
        self.timed = []              # this block's timed durations
        self.times = ([], [])        # every timed duration, per mode
        self.split = None            # the choice; None while trying
        self.until = 0.0             # when the choice is tried again (time.monotonic)

    def take(self, trial: bool):
        """(split, the trial's (block, index) or None) for a run starting now on an idle machine."""
        if self.split is not None and trial and time.monotonic() > self.until:
            self.__init__()
        if self.split is not None or not trial:
            return bool(self.split), None
        self.started += 1
        return bool(self.phase % 2), (self.phase, self.started - 1)

    def record(self, trial, seconds: float) -> None:
        phase, index = trial
        if index == 0 or phase != self.phase or self.split is not None:
            return
        self.timed.append(seconds)
        self.times[phase % 2].append(seconds)
        if len(self.timed) >= TRIAL_MAX_RUNS or (len(self.timed) >= TRIAL_RUNS and sum(self.timed) >= TRIAL_SECONDS):
            self.phase, self.started, self.timed = self.phase + 1, 0, []
            if self.phase == PHASES:
                native, split = (sorted(t)[len(t) // 2] for t in self.times)
                self.split = split <= SPLIT_MARGIN * native
                self.until = time.monotonic() + RETRY_SECONDS


class _Trial:
    """A run timed for its model's ModeChoice: its (phase, index), the count of runs started with it."""
    __slots__ = ("choice", "trial", "started")

    def __init__(self, choice, trial, started):
        self.choice, self.trial, self.started = choice, trial, started


class _Load:
    """The auto policy's state (see _busy). Updated only by _busy, which runs under _state.lock."""
    __slots__ = ("next", "busy", "until", "idle", "prev")

    def __init__(self, now: float, snapshot):
        self.next = now + _EVERY     # when the next reading is due
        self.busy = True             # the decision until then: "split" until idle readings say otherwise
        self.until = now             # "split" is held until then (a busy reading + _HOLD)
        self.idle = 0                # idle readings in a row
        self.prev = snapshot         # (time, machine cpu, own cpu) of the previous reading, or None


def tries_modes() -> bool:
    """Whether runs with a ModeChoice may try both modes: the auto policy on the bundled OpenBLAS."""
    return POLICY == "auto" and _OPENBLAS is not None


def managed() -> bool:
    """Whether onnx_mini can set numpy's BLAS threads (the bundled OpenBLAS, not ONNX_MINI_BLAS_THREADS=native)."""
    return _OPENBLAS is not None


def splitting() -> bool:
    """Whether the runs in progress are in "split" mode (OpenBLAS on one thread, onnx_mini splitting)."""
    return _state.split and _state.runs > 0


def _snapshot(now: float):
    machine = _machine_cpu_seconds()
    return None if machine is None else (now, machine, sum(os.times()[:2]))


def _others(now: float) -> float:
    """The cores other processes kept busy since the previous reading: the CPU time the whole machine
    spent (Linux's /proc/stat: user, system, irq, steal...) minus this process's own (its threads,
    OpenBLAS's spinning ones included, do not count). Without /proc/stat: the 1-minute load average
    minus this thread."""
    snap = _snapshot(now)
    prev, _load.prev = _load.prev, snap
    if snap is None:
        try:
            return os.getloadavg()[0] - 1
        except OSError:
            return 0.0
    if prev is None or now <= prev[0]:
        return 0.0
    return (snap[1] - prev[1] - (snap[2] - prev[2])) / (now - prev[0])


def _busy() -> bool:
    """Whether a run starting now takes "split" mode under the auto policy: a reading of the
    machine's load (_others) at most every _EVERY seconds, the first one _EVERY after import (the
    window from import on: "split" until then); a busy reading (>= _BUSY_CORES of other processes)
    holds "split" for _HOLD seconds, and "native" comes back only after _IDLE_READINGS idle readings
    in a row once the hold is over. Between readings: one clock read and a comparison (~0.2 us)."""
    now = time.monotonic()
    load = _load
    if now < load.next:
        return load.busy
    load.next = now + _EVERY
    if _others(now) >= _BUSY_CORES:
        load.until = now + _HOLD
        load.idle = 0
    else:
        load.idle += 1
    load.busy = now < load.until or load.idle < _IDLE_READINGS
    return load.busy


def _machine_cpu_seconds() -> float | None:
    try:
        with open("/proc/stat", "rb") as f:
            fields = f.readline().split()
        # cpu user nice system idle iowait irq softirq steal ...: everything but idle and iowait
        ticks = sum(int(v) for k, v in enumerate(fields[1:9]) if k not in (3, 4))
        return ticks / _TICKS
    except (OSError, ValueError, IndexError):
        return None


# the first reading's window starts at import (prepare comes between): no /proc/stat read otherwise
_load = _Load(time.monotonic(), _snapshot(time.monotonic()) if POLICY == "auto" and _OPENBLAS else None)


class _ThreadState:
    """The one owner of OpenBLAS's thread count while onnx_mini changes it: the runs in progress (any
    thread), the own_threads blocks in progress, the mode of those runs and the count to give back.
    Every change happens under one lock, and the count OpenBLAS had before the first run (or block)
    started is set again when the last one ends, so nothing changes outside runs. Runs and blocks
    that overlap agree through it: a block ending while a sequential run still needs one thread
    leaves one thread."""

    def __init__(self):
        self.lock = threading.Lock()
        self.runs = 0          # runs in progress (any thread)
        self.started = 0       # runs started so far (a trial run is timed only if none started during it)
        self.blocks = 0        # own_threads blocks in progress (any thread)
        self.split = False     # the mode of the runs in progress: True = "split", False = "native"
        self.saved = 1         # OpenBLAS's thread count before the first run or block started
        # the count OpenBLAS has while runs or blocks are in progress (read when the first starts, then
        # what _settle set): no ctypes call to read it again, none to set the count it already has
        # (~0.2 us a read, ~0.5 us a set even to the same count; 2-3 of them per run before)
        self.current = 1

    def _settle(self) -> None:
        """Set OpenBLAS's thread count to what the runs and blocks in progress need (lock held)."""
        want = 1 if self.blocks or (self.runs and self.split) else self.saved
        if self.current != want:
            _OPENBLAS[1](want)
            self.current = want

    def start_run(self, single: bool, choice: ModeChoice | None = None, trial: bool = True):
        """Enter a run; returns a _Trial when the run is one of its model's timed trials, else None."""
        with self.lock:
            timed = None
            self.started += 1
            if self.runs == 0:
                if self.blocks == 0:
                    # the first run: OpenBLAS's count now, maybe the user's since the last run, is
                    # the one to give back
                    self.saved = self.current = _OPENBLAS[0]()
                self.split = single or _forced_split() or (POLICY == "auto" and _busy())
                if not self.split and POLICY == "auto" and choice is not None:   # an idle machine
                    self.split, taken = choice.take(trial)
                    if taken is not None:
                        timed = _Trial(choice, taken, self.started)
            elif single:       # a sequential run joins native ones: one BLAS thread for all
                self.split = True
            self.runs += 1
            self._settle()
            return timed

    def end_run(self, timed: _Trial | None = None, seconds: float = 0.0) -> None:
        with self.lock:
            if timed is not None and self.started == timed.started:      # no run overlapped it
                timed.choice.record(timed.trial, seconds)
            self.runs -= 1
            self._settle()

    def start_block(self) -> bool:
        """Enter an own_threads block; False (nothing changed) outside runs and in "split" mode."""
        with self.lock:
            if self.runs == 0 or self.split:
                return False
            self.blocks += 1
            self._settle()
            return True

    def end_block(self) -> None:
        with self.lock:
            self.blocks -= 1
            self._settle()


_state = _ThreadState()


def start_run(choice: ModeChoice | None = None, trial: bool = True):
    """Enter the BLAS mode of one run (see the module doc); true when end_run() must follow: a _Trial
    when the run is one of its model's timed trials (choice: the model's ModeChoice; trial False: a run
    that takes the model's mode but is not timed, a hooked one), else True. OpenBLAS's thread count is
    restored after the last overlapping run ends."""
    if _OPENBLAS is None:
        return False
    return _state.start_run(parallel.threads() < 2, choice, trial) or True


def end_run(timed: _Trial | None = None, seconds: float = 0.0) -> None:
    """Leave a run; timed (start_run's _Trial) and the run's duration go to its model's ModeChoice."""
    _state.end_run(timed, seconds)


def settle(timeout: float = 1.0) -> bool:
    """Read the machine's load until the auto policy has decided the mode of the runs that start next
    (a process runs in "split" until two idle readings a quarter second apart, _busy), for at most
    `timeout` seconds, and return whether those runs will split. For tools that time runs (the CLI's
    bench, profile and run's steady state), which otherwise time that first window: the U-Net on this
    idle VM, `onnx-mini bench`: 36 ms a run in it, 20-24 after it. It only reads: no thread count
    changes, and runs in progress keep their mode."""
    if _OPENBLAS is None:
        return False
    if POLICY != "auto":
        return _forced_split()
    end = time.monotonic() + timeout
    while True:
        with _state.lock:
            busy = _busy()
            now = time.monotonic()
            decided = not busy or _load.until > now      # idle readings, or a busy one holding "split"
            wait = _load.next - now
        if decided or now + wait > end:
            return busy
        time.sleep(max(0.0, wait))


@contextlib.contextmanager
def during_run():
    """start_run() ... end_run() as a block."""
    started = start_run()
    try:
        yield
    finally:
        if started:
            end_run()


@contextlib.contextmanager
def own_threads():
    """Within the block the caller spreads independent work (the images of a batch) over
    parallel.split's threads: OpenBLAS runs each call on one thread meanwhile (in "native" mode;
    "split" mode already does). Measured on ResNet-50 at batch 32: 87 ms per image with OpenBLAS's
    threads inside each product, 67 ms with the images on two threads."""
    if _OPENBLAS is None or not _state.start_block():
        yield
        return
    try:
        yield
    finally:
        _state.end_block()


# A constant right operand B [K, N] of one-row products (a decoder's token, a batch-1 dense layer) reads
# faster as N rows of K (dot products, OpenBLAS's gemv_t) unless N is this many times K, where the K rows
# of N (gemv_n) win. Medians of one-row products on two threads, weights cycled from memory (~70 MB),
# [K, N] rows against N rows: 4864x896 711 / 364 us, 896x896 138 / 100, 896x1152 160 / 113, 1024x1024
# 138 / 122; 640x1536 111 / 126, 896x4864 497 / 562, 768x3072 202 / 262, 256x4864 108 / 211.
GEMV_ROWS_MAX_WIDENING = 2


# Smaller matrices keep their order: they sit in the caches, where it hardly matters (one-row products,
# the matrix cycled from memory, [K, N] rows against N rows: 512x256 13.0 / 13.3 us, 64x256 2.7 / 3.3),
# and a C-ordered B takes np.dot, ~0.7 us cheaper a call than np.matmul (ops/fused.py).
LAYOUT_MIN_BYTES = 1 << 20


def reads_as_rows(k: int, n: int) -> bool:
    """Whether a constant B [K, N] of one-row products is best stored as N contiguous rows of K (used as
    B^T's transposed view: BLAS takes it without a copy for any number of rows of A)."""
    return n <= GEMV_ROWS_MAX_WIDENING * k


def laid_out(b: np.ndarray) -> np.ndarray:
    """A constant B in the memory order one-row products read faster: a matrix [K, N] Fortran-ordered where
    reads_as_rows and it holds LAYOUT_MIN_BYTES or more, anything else C-ordered; B itself when already so."""
    if b.ndim == 2 and b.nbytes >= LAYOUT_MIN_BYTES and reads_as_rows(*b.shape):
        return np.asfortranarray(b)
    return np.ascontiguousarray(b)


def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """np.matmul(a, b, out=out), split over the pool's threads when the product is large enough
    and runs inside during_run (float types only; anything else goes to np.matmul unchanged)."""
    if (not _state.split or _state.runs == 0 or a.ndim < 2 or b.ndim < 2
            or a.size * b.shape[-1] < 2 * MIN_PART_MACS     # (a lower bound of the MACs) too small to split
            or a.dtype != b.dtype or a.dtype not in _SPLIT_DTYPES or a.shape[-1] != b.shape[-2]
            or parallel.threads() < 2):
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
