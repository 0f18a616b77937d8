"""onnx_mini.blas: numpy's OpenBLAS on one thread during runs, large products split over the pool.

Split products are checked for exact equality on integer-valued floats (every summation order gives
the same result there), so a block written to the wrong place or left out cannot pass.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_mini
from onnx_mini import blas, parallel, run_scope

needs_openblas = pytest.mark.skipif(not blas.managed(), reason="numpy's BLAS is not the bundled OpenBLAS")


@pytest.fixture(autouse=True)
def split_mode(monkeypatch):
    """Runs in "split" mode whatever the machine's load (the auto policy is tested on its own)."""
    monkeypatch.setattr(blas, "POLICY", "split")


def ints(rng, *shape, dtype=np.float32):
    return rng.integers(-4, 5, size=shape).astype(dtype)


@pytest.fixture
def small_parts(monkeypatch):
    """Split products from a few hundred multiply-adds on, so that small test matrices split."""
    monkeypatch.setattr(blas, "MIN_PART_MACS", 64)
    calls = []
    real = parallel.split

    def counting(work, n_items, min_items):       # the calls that do split: two parts or more
        if parallel.threads() > 1 and n_items // max(1, min_items) > 1:
            calls.append((n_items, min_items))
        real(work, n_items, min_items)
    monkeypatch.setattr(parallel, "split", counting)
    return calls


CASES = [
    ((37, 20), (20, 9)),            # more rows than columns: row blocks
    ((5, 30), (30, 41)),            # more columns: column blocks
    ((3, 7, 16), (16, 12)),         # a stack of rows times one matrix
    ((6, 9, 16), (6, 16, 10)),      # same batch: batch blocks
    ((1, 40, 16), (1, 16, 33)),     # a batch of one: a 2-D product
    ((2, 3, 9, 8), (2, 3, 8, 5)),   # two batch axes
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("sa, sb", CASES)
def test_split_products_equal_numpy(small_parts, sa, sb, dtype):
    rng = np.random.default_rng(0)
    a, b = ints(rng, *sa, dtype=dtype), ints(rng, *sb, dtype=dtype)
    with run_scope.running():
        y = blas.matmul(a, b)
    if parallel.threads() > 1 and blas.managed():
        assert small_parts, "the product was not split"
    assert y.dtype == dtype and y.shape == np.matmul(a, b).shape
    np.testing.assert_array_equal(y, np.matmul(a, b))


def test_split_into_out_and_views(small_parts):
    rng = np.random.default_rng(1)
    a = ints(rng, 64, 48)[:, ::2]              # a strided view
    b = ints(rng, 24, 70).T.copy().T           # Fortran-ordered
    out = np.full((64, 70), np.nan, np.float32)
    with run_scope.running():
        y = blas.matmul(a, b, out=out)
    assert y is out
    np.testing.assert_array_equal(out, np.matmul(a, b))


def test_no_split_outside_runs_or_with_one_thread(small_parts):
    rng = np.random.default_rng(2)
    a, b = ints(rng, 40, 30), ints(rng, 30, 40)
    np.testing.assert_array_equal(blas.matmul(a, b), a @ b)      # not inside a run
    with run_scope.running(1):
        np.testing.assert_array_equal(blas.matmul(a, b), a @ b)
    assert small_parts == []


def test_non_float_and_mismatched_go_to_numpy(small_parts):
    a = np.arange(600, dtype=np.int64).reshape(20, 30)
    with run_scope.running():
        np.testing.assert_array_equal(blas.matmul(a, a.T), a @ a.T)
        with pytest.raises(ValueError):
            blas.matmul(np.ones((4, 5), np.float32), np.ones((4, 5), np.float32))
    assert small_parts == []


@needs_openblas
def test_openblas_one_thread_during_runs_and_restored():
    get, set_ = blas._OPENBLAS
    before = get()
    try:
        set_(2)
        seen = []
        with run_scope.running():
            seen.append(get())
            with run_scope.running():        # nested (a subgraph, a second session): still one
                seen.append(get())
            seen.append(get())
        assert seen == [1, 1, 1]
        assert get() == 2
    finally:
        set_(before)


@needs_openblas
def test_concurrent_runs_restore_once_the_last_ends():
    get, set_ = blas._OPENBLAS
    before = get()
    set_(2)
    try:
        inside, release = threading.Event(), threading.Event()

        def other():
            with run_scope.running():
                inside.set()
                release.wait(10)
        t = threading.Thread(target=other)
        t.start()
        assert inside.wait(10)
        with run_scope.running():
            assert get() == 1
        assert get() == 1, "restored while another run was still in progress"
        release.set()
        t.join(10)
        assert get() == 2
    finally:
        set_(before)


def _conv_model(n=2, c=16, m=32, size=24):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, c, size, size])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    rng = np.random.default_rng(3)
    w = onnx.numpy_helper.from_array(ints(rng, m, c, 3, 3), "w")
    mm = onnx.numpy_helper.from_array(ints(rng, size, size), "mm")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("MatMul", ["c", "mm"], ["y"])]
    g = helper.make_graph(nodes, "g", [x], [y], [w, mm])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


def test_model_results_do_not_depend_on_threads(small_parts):
    rng = np.random.default_rng(4)
    x = ints(rng, 2, 16, 24, 24)
    model = _conv_model()
    one = onnx_mini.prepare(model, threads=1).run([x])[0]
    assert small_parts == []
    many = onnx_mini.prepare(model).run([x])[0]
    np.testing.assert_array_equal(one, many)
    # the exact product, computed in float64 from the definition of a padded 3x3 convolution
    w = onnx.numpy_helper.to_array(model.graph.initializer[0]).astype(np.float64)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    conv = sum(np.einsum("mc,nchw->nmhw", w[:, :, i, j], xp[:, :, i:i + 24, j:j + 24])
               for i in range(3) for j in range(3))
    mm = onnx.numpy_helper.to_array(model.graph.initializer[1]).astype(np.float64)
    np.testing.assert_array_equal(one, (conv @ mm).astype(np.float32))


def test_threads_option_is_checked():
    with pytest.raises(onnx_mini.errors.OnnxMiniError, match="threads"):
        onnx_mini.prepare(_conv_model(), threads=-1)
    with pytest.raises(onnx_mini.errors.OnnxMiniError, match="threads"):
        onnx_mini.prepare(_conv_model(), threads="2")


def test_native_mode_leaves_blas_alone():
    code = ("import onnx_mini.blas as b, onnx_mini.run_scope as r\n"
            "with r.running(): pass\n"
            "print(b.managed())\n")
    env = dict(os.environ, ONNX_MINI_BLAS_THREADS="native")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


@needs_openblas
@pytest.mark.parametrize("busy", [False, True])
def test_auto_policy_follows_the_load(monkeypatch, busy):
    monkeypatch.setattr(blas, "POLICY", "auto")
    monkeypatch.setattr(blas, "_busy", lambda: busy)
    get, set_ = blas._OPENBLAS
    before = get()
    try:
        set_(2)
        with run_scope.running():
            seen = (get(), blas.splitting())
        assert seen == ((1, True) if busy else (2, False))
        with run_scope.running(1):              # a sequential run: one BLAS thread whatever the load
            assert (get(), blas.splitting()) == (1, True)
        assert get() == 2
    finally:
        set_(before)


class _Clock:
    def __init__(self, now=100.0):
        self.now = now

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


@pytest.fixture
def auto_policy(monkeypatch):
    """The auto policy on a fake clock and scripted readings: returns (clock, readings, taken);
    `readings` are the cores other processes used, one popped per reading, `taken` the times read."""
    clock, readings, taken = _Clock(), [], []
    monkeypatch.setattr(blas, "POLICY", "auto")
    monkeypatch.setattr(blas, "time", clock)
    monkeypatch.setattr(blas, "_load", blas._Load(clock.now, None))     # as imported at clock.now

    def others(now):
        taken.append(now)
        return readings.pop(0)
    monkeypatch.setattr(blas, "_others", others)
    return clock, readings, taken


def test_auto_policy_splits_until_two_idle_readings_then_holds_split_after_a_busy_one(auto_policy):
    clock, readings, taken = auto_policy
    t0 = clock.now

    def busy_at(dt):
        clock.now = t0 + dt
        return blas._busy()
    assert busy_at(0.1) is True and taken == []          # before the first reading: split
    readings.append(0.2)
    assert busy_at(0.25) is True                         # one idle reading is not enough
    assert busy_at(0.4) is True and taken == [t0 + 0.25]  # no reading before _EVERY has passed
    readings.append(0.49)
    assert busy_at(0.5) is False                         # the second idle one in a row: native
    assert busy_at(0.7) is False and len(taken) == 2
    readings.append(0.5)                                 # half a core of other processes: busy
    assert busy_at(0.75) is True
    # idle readings from then on: split is held until 0.75 + _HOLD = 3.75 ...
    readings.extend([0.0] * 4)
    assert [busy_at(dt) for dt in (1.0, 1.25, 1.5, 1.75)] == [True] * 4
    readings.append(2.0)                                 # ... and a busy reading renews the hold
    assert busy_at(2.0) is True
    readings.extend([0.0] * 20)
    dts = [2.25 + 0.25 * i for i in range(14)]           # readings up to 5.5
    seen = [busy_at(dt) for dt in dts]
    assert seen == [dt < 2.0 + blas._HOLD for dt in dts]  # native again at 5.0: > 2 idle readings since
    assert blas._HOLD == 3.0 and blas._IDLE_READINGS == 2


def test_auto_policy_after_the_hold_still_needs_idle_readings_in_a_row(auto_policy, monkeypatch):
    clock, readings, taken = auto_policy
    monkeypatch.setattr(blas, "_HOLD", 0.1)              # a hold shorter than the readings' interval
    t0 = clock.now
    decisions = []
    for i, cores in enumerate([0.0, 0.0, 0.9, 0.0, 0.3, 0.0, 0.7, 0.1, 0.2]):
        readings.append(cores)
        clock.now = t0 + 0.25 * (i + 1)
        decisions.append(blas._busy())
    assert decisions == [True, False, True, True, False, False, True, True, False]
    assert len(taken) == 9


@pytest.fixture
def fake_openblas(monkeypatch):
    count = [2]
    monkeypatch.setattr(blas, "_OPENBLAS", (lambda: count[0], lambda n: count.__setitem__(0, n)))
    return count


def test_settle_reads_until_two_idle_readings_then_reads_no_more(auto_policy, fake_openblas):
    clock, readings, taken = auto_policy
    t0 = clock.now
    readings.extend([0.1, 0.2])
    assert blas.settle() is False                           # native, decided by the second idle reading
    assert taken == [t0 + 0.25, t0 + 0.5] and clock.now == t0 + 0.5     # slept until each was due
    assert blas.settle() is False and len(taken) == 2       # decided: no reading before the next is due
    assert fake_openblas == [2]                             # reading changes no thread count


def test_settle_stops_at_a_busy_reading(auto_policy, fake_openblas):
    clock, readings, taken = auto_policy
    readings.append(0.9)
    assert blas.settle() is True and len(taken) == 1        # the hold decides "split" at once


def test_settle_gives_up_at_its_timeout(auto_policy, fake_openblas):
    clock, readings, taken = auto_policy
    t0 = clock.now
    readings.append(0.0)
    assert blas.settle(timeout=0.3) is True                 # one idle reading; the second not due in time
    assert taken == [t0 + 0.25] and clock.now == t0 + 0.25


@pytest.mark.parametrize("policy, expected", [("split", True), ("managed", True), ("native", False)])
def test_settle_under_a_forced_policy_reads_nothing(monkeypatch, fake_openblas, policy, expected):
    monkeypatch.setattr(blas, "POLICY", policy)
    monkeypatch.setattr(blas, "_busy", lambda: pytest.fail("read the load"))
    assert blas.settle() is expected


def test_settle_without_openblas_reads_nothing(monkeypatch):
    monkeypatch.setattr(blas, "_OPENBLAS", None)
    monkeypatch.setattr(blas, "_busy", lambda: pytest.fail("read the load"))
    assert blas.settle() is False


def test_a_reading_compares_the_machine_cpu_with_this_process_own(monkeypatch):
    snaps = [(10.0, 1000.0, 50.0), (10.5, 1000.9, 50.6), (11.0, 1001.0, 51.1), None]
    monkeypatch.setattr(blas, "_snapshot", lambda now: snaps.pop(0))
    monkeypatch.setattr(blas, "_load", blas._Load(9.0, None))
    assert blas._others(10.0) == 0.0                     # nothing to compare with: idle
    # 0.9 s of the machine's CPU in 0.5 s, 0.6 of them this process's: 0.3 s of others = 0.6 cores
    assert blas._others(10.5) == pytest.approx(0.6)
    assert blas._others(11.0) == pytest.approx(-0.8)     # own CPU counted in ticks: may exceed (idle)
    monkeypatch.setattr(os, "getloadavg", lambda: (1.75, 1.0, 1.0))
    assert blas._others(11.5) == pytest.approx(0.75)     # no /proc/stat: the load average minus this thread


def test_a_real_reading_of_the_machine_is_a_number_of_cores():
    load = blas._Load(0.0, blas._snapshot(0.0))
    if load.prev is None:
        pytest.skip("no /proc/stat")
    now, machine, own = load.prev
    assert machine > 0 and own > 0 and now == 0.0


def test_runs_read_the_load_once_per_first_run_and_follow_it(auto_policy, monkeypatch):
    """start_run consults the policy only when the first of overlapping runs starts, and never for a
    sequential run (prepare(threads=1)): one BLAS thread whatever the load."""
    clock, readings, taken = auto_policy
    calls, count = [], [2]

    def get():
        return count[0]

    def set_(n):
        calls.append(n)
        count[0] = n
    monkeypatch.setattr(blas, "_OPENBLAS", (get, set_))
    t0 = clock.now
    clock.now = t0 + 0.1
    with run_scope.running():                            # before any reading: split
        assert blas.splitting() and count[0] == 1
    readings.extend([0.0, 0.0])
    clock.now = t0 + 0.25
    run_scope.leave(run_scope.enter(None, True))
    clock.now = t0 + 0.5
    with run_scope.running():                            # two idle readings: native, count untouched
        assert not blas.splitting() and count[0] == 2
        clock.now = t0 + 0.8                             # a nested run joins the mode: no reading
        with run_scope.running():
            assert not blas.splitting()
    assert len(taken) == 2 and count[0] == 2
    clock.now = t0 + 1.2
    with run_scope.running(1):                           # sequential: split, the policy not consulted
        assert blas.splitting() and count[0] == 1
    # split (no reading yet), split (one idle reading), native (no call), sequential
    assert len(taken) == 2 and count[0] == 2 and calls == [1, 2, 1, 2, 1, 2]


def test_prepare_threads_one_runs_split_whatever_the_load(monkeypatch):
    monkeypatch.setattr(blas, "POLICY", "auto")
    monkeypatch.setattr(blas, "_busy", lambda: pytest.fail("a sequential run consulted the load"))
    calls, count = [], [3]

    def set_(n):
        calls.append(n)
        count[0] = n
    monkeypatch.setattr(blas, "_OPENBLAS", (lambda: count[0], set_))
    rng = np.random.default_rng(5)
    x = ints(rng, 2, 16, 24, 24)
    prepared = onnx_mini.prepare(_conv_model(), threads=1)
    assert calls == []                                     # prepare changes nothing
    assert prepared.run([x])[0].shape == (2, 32, 24, 24)
    assert calls == [1, 3] and count[0] == 3               # one BLAS thread during the run, then given back


@pytest.mark.parametrize("env, expected", [("auto", "True True"), ("split", "True True"),
                                           ("managed", "True True"), ("native", "False False")])
def test_the_environment_forces_the_mode(env, expected):
    # auto: the first run after import is split (no reading yet, or one idle one: not two in a row)
    code = ("import onnx_mini.blas as b, onnx_mini.run_scope as r\n"
            "with r.running():\n"
            "    print(b.splitting(), b.managed())\n")
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, ONNX_MINI_BLAS_THREADS=env),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    if env != "native" and "True" not in out.stdout.split()[1:]:
        pytest.skip("numpy's BLAS is not the bundled OpenBLAS")
    assert out.stdout.strip() == expected

@needs_openblas
def test_sequential_run_joining_a_native_one_gets_one_blas_thread(monkeypatch):
    monkeypatch.setattr(blas, "POLICY", "native_for_test")      # neither split nor auto: native mode
    get, set_ = blas._OPENBLAS
    before = get()
    try:
        set_(2)
        with run_scope.running():
            assert (get(), blas.splitting()) == (2, False)
            with run_scope.running(1):
                assert (get(), blas.splitting()) == (1, True)
        assert get() == 2
    finally:
        set_(before)


@needs_openblas
def test_own_threads_puts_openblas_on_one_thread_in_native_mode(monkeypatch):
    monkeypatch.setattr(blas, "POLICY", "native_for_test")
    get, set_ = blas._OPENBLAS
    before = get()
    try:
        set_(2)
        with run_scope.running():
            with blas.own_threads():
                inside = get()
            after = get()
        assert (inside, after) == (1, 2)
    finally:
        set_(before)


@needs_openblas
def test_own_threads_ending_keeps_one_thread_for_a_sequential_run(monkeypatch):
    """One owner for runs and own_threads blocks: a block that ends while a sequential run (which
    joined the native one) is in progress leaves OpenBLAS on one thread; the last run restores it."""
    monkeypatch.setattr(blas, "POLICY", "native_for_test")
    get, set_ = blas._OPENBLAS
    before = get()
    try:
        set_(2)
        with run_scope.running():
            block = blas.own_threads()
            block.__enter__()
            assert get() == 1
            with run_scope.running(1):
                block.__exit__(None, None, None)
                assert (get(), blas.splitting()) == (1, True)
            assert get() == 1                   # the mode of the runs in progress: split until they all end
        assert get() == 2
        with blas.own_threads():               # outside runs: nothing changes
            assert get() == 2
    finally:
        set_(before)


@needs_openblas
@pytest.mark.parametrize("policy", ["split", "native_for_test"])
def test_overlapping_runs_and_blocks_from_threads_restore_the_count(monkeypatch, policy):
    """Runs from several threads, capped or not, with own_threads blocks inside, starting and ending
    in every order: once all have ended OpenBLAS has the count it had before, and during any of them
    it never has more than that."""
    monkeypatch.setattr(blas, "POLICY", policy)
    get, set_ = blas._OPENBLAS
    before = get()
    try:
        set_(3)
        seen, errors = [], []
        barrier = threading.Barrier(4)

        def worker(k):
            try:
                barrier.wait(10)
                for i in range(200):
                    with run_scope.running(1 if (i + k) % 3 == 0 else None):
                        seen.append(get())
                        if i % 2:
                            with blas.own_threads():
                                seen.append(get())
            except Exception as e:       # reported below: a thread's assertion would be lost
                errors.append(e)
        threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors and not any(t.is_alive() for t in threads)
        assert set(seen) <= {1, 3} and get() == 3
        assert (blas._state.runs, blas._state.blocks) == (0, 0)
    finally:
        set_(before)


def test_run_services_import_no_cycle():
    """parallel imports no onnx_mini module, blas only parallel, memory none; run_scope ties them
    (with dtypes' model limits, a leaf)."""
    import ast
    import pathlib

    def imported(mod):
        tree = ast.parse(pathlib.Path(mod.__file__).read_text())
        names = set()
        for node in ast.walk(tree):        # function-level imports too: none may dodge a cycle
            if isinstance(node, ast.ImportFrom) and node.level:
                names.update([node.module] if node.module else [a.name for a in node.names])
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
                names.update(m.split(".", 1)[1] for m in mods if m.startswith("onnx_mini."))
        return names
    from onnx_mini import memory
    assert imported(parallel) == set()
    assert imported(blas) == {"parallel"}
    assert imported(memory) == set()
    assert imported(run_scope) == {"blas", "dtypes", "memory", "parallel"}


def _watch_blas_mode(monkeypatch) -> list:
    """Record each run that enters blas's run mode."""
    entered = []
    original = blas.start_run

    def start_run(*args):
        entered.append(True)
        return original(*args)
    monkeypatch.setattr(blas, "start_run", start_run)
    return entered


def test_a_plan_without_heavy_steps_leaves_blas_alone(monkeypatch):
    # ~6 us of lock and thread-count bookkeeping per run saved for tiny models (scikit-learn at batch 1)
    entered = _watch_blas_mode(monkeypatch)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])
    light = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "light", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    prepared = onnx_mini.prepare(light)
    assert not prepared.plan.uses_blas
    prepared.run([np.eye(2, dtype=np.float32)])
    assert entered == []


def test_a_matmul_inside_a_body_makes_the_plan_manage_blas(monkeypatch):
    entered = _watch_blas_mode(monkeypatch)
    vi = helper.make_tensor_value_info
    body = helper.make_graph([helper.make_node("MatMul", ["x", "x"], ["t"])], "then", [],
                             [vi("t", TensorProto.FLOAT, [2, 2])])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [],
                              [vi("e", TensorProto.FLOAT, [2, 2])])
    m = helper.make_model(helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=body, else_branch=other)], "g",
        [vi("c", TensorProto.BOOL, []), vi("x", TensorProto.FLOAT, [2, 2])], [vi("y", TensorProto.FLOAT, [2, 2])]),
        opset_imports=[helper.make_opsetid("", 17)])
    prepared = onnx_mini.prepare(m)
    assert prepared.plan.uses_blas
    y = prepared.run({"c": np.array(True), "x": np.full((2, 2), 2, np.float32)})[0]
    np.testing.assert_array_equal(y, np.full((2, 2), 8, np.float32))
    assert entered == [True]


def test_runs_call_openblas_only_to_change_its_count(monkeypatch):
    # each ctypes call costs 0.2-0.5 us per run: the count is read once when the first run starts
    # and set only when it must change; a count the user sets between runs is the one given back
    calls, count = [], [3]

    def get():
        calls.append("get")
        return count[0]

    def set_(n):
        calls.append(("set", n))
        count[0] = n
    monkeypatch.setattr(blas, "_OPENBLAS", (get, set_))
    monkeypatch.setattr(blas, "POLICY", "native")
    scope = run_scope.enter(None, True)
    run_scope.leave(scope)
    assert calls == ["get"] and count[0] == 3               # native: nothing to change
    calls.clear()
    monkeypatch.setattr(blas, "POLICY", "split")
    scope = run_scope.enter(None, True)
    inner = run_scope.enter(None, True)                      # nested: already one thread, no call
    run_scope.leave(inner)
    run_scope.leave(scope)
    assert calls == ["get", ("set", 1), ("set", 3)]
    calls.clear()
    count[0] = 2                                             # the user's own setting between runs
    run_scope.leave(run_scope.enter(None, True))
    assert calls == ["get", ("set", 1), ("set", 2)] and count[0] == 2


def test_a_run_sets_its_thread_cap_only_when_it_changes():
    assert parallel.cap(None) is None                        # no cap in force: nothing to set or undo
    parallel.uncap(None)
    outer = parallel.cap(1)
    try:
        assert parallel.threads() == 1
        assert parallel.cap(1) is None                       # the same cap: nothing to undo
        inner = parallel.cap(None)                           # a nested run without a cap lifts it
        assert inner is not None and parallel.threads() == parallel.THREADS
        parallel.uncap(inner)
        assert parallel.threads() == 1
    finally:
        parallel.uncap(outer)
    assert parallel.threads() == parallel.THREADS


def test_run_scope_puts_the_model_limit_in_force_and_undoes_all_on_a_bad_one(monkeypatch):
    from onnx_mini import dtypes
    calls = []
    monkeypatch.setattr(blas, "start_run", lambda *args: calls.append("start") or True)
    monkeypatch.setattr(blas, "end_run", lambda *args: calls.append("end"))
    scope = run_scope.enter(2, True, 1000)
    try:
        assert dtypes._model_max_tensor_bytes.get() == 1000 and parallel._cap.get() == 2
    finally:
        run_scope.leave(scope)
    assert dtypes._model_max_tensor_bytes.get() is None and parallel._cap.get() is None
    assert calls == ["start", "end"]
    with pytest.raises(ValueError):                          # a limit <= 0: BLAS mode and cap undone
        run_scope.enter(2, True, 0)
    assert calls == ["start", "end", "start", "end"] and parallel._cap.get() is None
    with run_scope.running(None, False, 500):
        assert dtypes._model_max_tensor_bytes.get() == 500
    assert dtypes._model_max_tensor_bytes.get() is None and calls[-1] == "end"



def test_a_small_run_inside_a_capped_limited_one_still_lifts_cap_and_limit():
    """enter()'s nothing-to-do path is taken only when no cap and no limit are in force."""
    from onnx_mini import dtypes
    outer = run_scope.enter(1, False, 1000)
    try:
        inner = run_scope.enter(None, False, None)           # a nested model: no cap, no limit of its own
        try:
            assert parallel._cap.get() is None and dtypes._model_max_tensor_bytes.get() is None
        finally:
            run_scope.leave(inner)
        assert parallel._cap.get() == 1 and dtypes._model_max_tensor_bytes.get() == 1000
    finally:
        run_scope.leave(outer)
    assert parallel._cap.get() is None and dtypes._model_max_tensor_bytes.get() is None
    scope = run_scope.enter(None, False, None)               # nothing in force: nothing set
    assert parallel._cap.get() is None and dtypes._model_max_tensor_bytes.get() is None
    run_scope.leave(scope)


@pytest.mark.parametrize("value, warned", [("", False), ("  ", False), ("many", True), ("1.5", True)])
def test_an_empty_or_malformed_thread_count_falls_back_to_the_cpu_count(value, warned):
    code = "import os, onnx_mini, onnx_mini.parallel as p; print(p.THREADS == max(1, os.cpu_count() or 1))"
    env = dict(os.environ, ONNX_MINI_THREADS=value)
    out = subprocess.run([sys.executable, "-W", "always", "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr
    assert ("ONNX_MINI_THREADS=" in out.stderr) == warned, out.stderr


# -- ModeChoice: each model's mode on an idle machine, tried on its first runs -----------------------

def _try(choice, seconds_native, seconds_split):
    """Run trials until the choice is made, each run's duration the next of its mode's list (cycled);
    returns the modes taken in order."""
    modes, n = [], 0
    while choice.split is None and n < 1000:
        split, taken = choice.take(True)
        modes.append(split)
        durations = seconds_split if split else seconds_native
        choice.record(taken, durations[n % len(durations)])
        n += 1
    return modes


def test_mode_choice_tries_native_then_split_twice_and_keeps_the_faster(monkeypatch):
    monkeypatch.setattr(blas, "TRIAL_RUNS", 3)
    monkeypatch.setattr(blas, "TRIAL_SECONDS", 0.25)
    choice = blas.ModeChoice()
    # 0.1 s runs: each block's first left out, then 3 timed (0.3 s >= TRIAL_SECONDS); four blocks
    modes = _try(choice, [0.10], [0.085])
    assert modes == ([False] * 4 + [True] * 4) * 2
    assert choice.split is True and len(choice.times[0]) == len(choice.times[1]) == 6
    assert choice.take(True) == (True, None) and choice.take(False) == (True, None)   # decided: no more trials
    slower = blas.ModeChoice()
    _try(slower, [0.10], [0.095])           # split not at least 10% faster: native stays
    assert slower.split is False and slower.take(True) == (False, None)


def test_mode_choice_times_short_runs_for_long_enough(monkeypatch):
    """Runs of a millisecond are timed until TRIAL_SECONDS of them (or TRIAL_MAX_RUNS) in each block."""
    monkeypatch.setattr(blas, "TRIAL_SECONDS", 0.05)
    monkeypatch.setattr(blas, "TRIAL_MAX_RUNS", 30)
    choice = blas.ModeChoice()
    modes = _try(choice, [0.002], [0.001])
    blocks = [26, 31, 26, 31]                # 25 timed (0.05 s); split: the cap, 30 timed
    assert modes == sum(([k % 2 == 1] * n for k, n in enumerate(blocks)), [])
    assert choice.split is True


def test_mode_choice_leaves_out_first_runs_hooked_runs_and_stale_phases():
    choice = blas.ModeChoice()
    assert choice.take(False) == (False, None)          # a hooked run before the choice: native, not a trial
    split, first = choice.take(True)
    assert split is False and first == (0, 0)
    choice.record(first, 99.0)                          # the first run of a phase: left out
    assert choice.times == ([], [])
    _, second = choice.take(True)
    choice.phase = 1                                    # (as if the native trials ended meanwhile)
    choice.record(second, 1.0)                          # a native trial ending in the split phase: dropped
    assert choice.times == ([], [])


def test_a_model_on_an_idle_machine_takes_the_mode_its_trials_chose(auto_policy, monkeypatch):
    """Through run_scope, as PreparedModel.run enters it: on an idle machine a model's runs are its
    trials (native, split, native, split), timed; a run another overlaps is not timed; a busy reading
    means split and no trial; once chosen, the model's runs on an idle machine take its mode."""
    clock, readings, taken = auto_policy
    monkeypatch.setattr(blas, "_OPENBLAS", (lambda: 2, lambda n: None))
    monkeypatch.setattr(blas, "TRIAL_RUNS", 2)
    monkeypatch.setattr(blas, "TRIAL_SECONDS", 0.0)
    fake = [0.0]
    monkeypatch.setattr(run_scope, "time", type("T", (), {"perf_counter": staticmethod(lambda: fake[0])}))
    t0 = clock.now
    readings.extend([0.0, 0.0])
    for dt in (0.25, 0.5):                               # two idle readings: native from here on
        clock.now = t0 + dt
        assert blas._busy() is (dt == 0.25)
    choice = blas.ModeChoice()
    seen = []

    def run(nested=False):
        scope = run_scope.enter(None, True, None, choice)
        split = blas.splitting()
        seen.append(split)
        if nested:
            run_scope.leave(run_scope.enter(None, True, None, choice))
        fake[0] += 0.0625 if split else 0.125            # (binary fractions: exact differences)
        run_scope.leave(scope)
    run()                                                # native, left out (a block's first)
    run(nested=True)                                     # native, overlapped: not timed
    run(), run()                                         # native, timed twice: the split block next
    assert choice.times == ([0.125, 0.125], []) and seen == [False] * 4
    readings.append(0.9)                                 # a busy reading: split, no trial
    clock.now = t0 + 0.75
    run()
    assert seen[-1] is True and choice.started == 0 and choice.times[1] == []
    clock.now = t0 + 5.0                                 # the hold over, two idle readings again
    readings.extend([0.0, 0.0])
    blas._busy()
    clock.now = t0 + 5.25
    for _ in range(3 * 3):                               # split, native, split: three runs a block
        run()
    assert seen[-9:] == [True] * 3 + [False] * 3 + [True] * 3
    assert choice.times == ([0.125] * 4, [0.0625] * 4) and choice.split is True
    run()                                                # chosen: split on an idle machine
    assert seen[-1] is True


def test_mode_choice_is_tried_again_after_a_while(monkeypatch):
    """A choice RETRY_SECONDS old is tried again at the next trial run (a neighbour's burst may have
    misled it); a hooked run does not start trials."""
    clock = [100.0]
    monkeypatch.setattr(blas.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(blas, "TRIAL_SECONDS", 0.0)
    choice = blas.ModeChoice()
    _try(choice, [0.1], [0.05])
    assert choice.split is True and choice.until == 100.0 + blas.RETRY_SECONDS
    clock[0] += blas.RETRY_SECONDS + 1
    assert choice.take(False) == (True, None)            # hooked: the choice, no trial
    assert choice.take(True) == (False, (0, 0))          # trials again, native first
    assert choice.split is None and choice.times == ([], [])
    _try(choice, [0.05], [0.1])
    assert choice.split is False


def test_prepared_model_settle_runs_the_trials(monkeypatch):
    """PreparedModel.settle (the CLI's bench and profile call it before timing) runs the model until its
    mode is chosen; a plan without heavy steps has no mode to wait for."""
    if not blas.managed():
        pytest.skip("numpy's BLAS is not the bundled OpenBLAS")
    monkeypatch.setattr(blas, "POLICY", "auto")
    monkeypatch.setattr(blas, "_busy", lambda: False)              # an idle machine
    monkeypatch.setattr(blas, "TRIAL_SECONDS", 0.0)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 8])
    w = numpy_helper.from_array(np.eye(8, dtype=np.float32), "w")
    heavy = helper.make_model(helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [x], [y], [w]),
                              opset_imports=[helper.make_opsetid("", 17)])
    rep = onnx_mini.prepare(heavy)
    feeds = {"x": np.ones((8, 8), np.float32)}
    assert rep.settle(feeds, timeout=10.0) in ("native", "split")
    assert rep.blas_modes.split is not None and sum(map(len, rep.blas_modes.times)) >= 2 * blas.PHASES
    light = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    assert onnx_mini.prepare(light).settle(feeds) is None
