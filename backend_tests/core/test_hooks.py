"""The per-node hook reaches the nodes of bodies (If branches, Loop and Scan bodies, nested), each
call saying where the node is (StepInfo.scope / path / depth); nothing changes when no hook is set;
concurrent runs each see their own hook."""
import contextvars
import io
import re
import threading

import numpy as np
import pytest
from onnx import helper

import onnx_mini
import onnx_mini.executor
from onnx_mini import parallel
from onnx_mini.plan import TRACING, StepInfo, Tracing, step_labels

from helpers import F, control_flow_feeds, control_flow_model, model

LOOP_BODY = ["Loop_0/body/Identity_0", "Loop_0/body/Add_1", "Loop_0/body/Mod_2", "Loop_0/body/Equal_3"]


def expected_paths(c: bool) -> list[str]:
    """Every hook call of one run, in order: a body's steps right after they ran, before their parent."""
    loop = []
    for i in range(3):          # iterations 0 and 2: i even, then_branch; 1: else_branch
        branch = "then_branch/Mul_0" if i % 2 == 0 else "else_branch/Neg_0"
        loop += [*LOOP_BODY, f"Loop_0/body/If_4/{branch}", "Loop_0/body/If_4"]
    choose = "choose/then_branch/twice" if c else "choose/else_branch/Sub_0"
    return [*loop, "Loop_0", choose, "choose", *["scan/body/accumulate", "scan/body/Neg_1"] * 3, "scan"]


@pytest.fixture(scope="module")
def prepared():
    return onnx_mini.prepare(control_flow_model())


@pytest.mark.parametrize("c", [True, False])
def test_hook_sees_every_body_step_with_its_path(prepared, c):
    calls: list[tuple[StepInfo, tuple, tuple]] = []
    outs = prepared.run(control_flow_feeds(c), hook=lambda info, ins, outs: calls.append((info, ins, outs)))
    assert [info.path for info, _, _ in calls] == expected_paths(c)
    by_path = {info.path: info for info, _, _ in calls}
    nested = by_path["Loop_0/body/If_4/then_branch/Mul_0"]
    assert nested.scope == ("Loop_0", "body", "If_4", "then_branch", "Mul_0") and nested.depth == 2
    assert (nested.op_type, nested.name, nested.inputs, nested.outputs) == ("Mul", "", ("a", "a"), ("t",))
    assert by_path["Loop_0"].depth == 0 and by_path["Loop_0/body/Add_1"].depth == 1
    assert by_path["scan/body/accumulate"].scope == ("scan", "body", "accumulate")   # a named node: its name
    # the values a body step received and made: Loop iteration 0 adds x to acc = x
    x = control_flow_feeds(c)["x"]
    adds = [(ins, outs) for info, ins, outs in calls if info.path == "Loop_0/body/Add_1"]
    assert len(adds) == 3 and np.array_equal(adds[0][0][0], x) and np.array_equal(adds[0][1][0], 2 * x)
    # and the model's results are those of the unhooked run
    for got, want in zip(outs, prepared.run(control_flow_feeds(c))):
        assert np.array_equal(got, want)
    # the same StepInfo object for a node on every call (consumers may key on it)
    assert len({id(info) for info, _, _ in calls if info.path == "Loop_0/body/Add_1"}) == 1


def test_hook_path_of_unnamed_and_repeated_names():
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["b"], name="same"),
             helper.make_node("Neg", ["b"], ["c"], name="same"), helper.make_node("Abs", ["c"], ["y"], name="abs")]
    seen = []
    onnx_mini.prepare(model(nodes, [("x", F, [2])], [("y", F, [2])]), optimize=False).run(
        {"x": np.ones(2, np.float32)}, hook=lambda info, *_: seen.append(info.path))
    # a name two steps share would not say which: those get the `<OpType>_<index>` form as well
    assert seen == ["Relu_0", "same_1", "same_2", "abs"]
    assert step_labels([StepInfo("", "Add", "", 14, 21, (), ())]) == ["Add_0"]


def test_no_hook_runs_bodies_on_the_plain_loop(prepared, monkeypatch):
    """Without a hook SubPlan.run takes the executor's plain loop: the hooked one is never entered,
    and no tracing state is left behind."""
    entered = []
    real = onnx_mini.executor._execute_hooked

    def spy(plan, slots, hook, scope):
        entered.append(scope)
        return real(plan, slots, hook, scope)
    monkeypatch.setattr(onnx_mini.executor, "_execute_hooked", spy)
    plain = prepared.run(control_flow_feeds())
    assert entered == [] and TRACING.get() is None
    hooked = prepared.run(control_flow_feeds(), hook=lambda *_: None)
    # the model graph, 3 Loop bodies and their 3 Ifs' branches, the If's branch, 3 Scan bodies
    assert entered.count(()) == 1 and len(entered) == 1 + 3 + 3 + 1 + 3
    assert ("Loop_0", "body", "If_4", "else_branch") in entered
    assert TRACING.get() is None
    for a, b in zip(plain, hooked):
        assert np.array_equal(a, b)


def test_a_body_hook_error_reaches_the_caller_as_is(prepared):
    """An exception a hook raises for a body's step is the caller's own, not a KernelError of the
    control-flow nodes it passed through; no tracing state is left behind."""
    def failing(info, *_):
        if info.depth == 2:
            raise RuntimeError("hook failed")
    with pytest.raises(RuntimeError, match="hook failed") as caught:
        prepared.run(control_flow_feeds(), hook=failing)
    assert type(caught.value) is RuntimeError
    assert TRACING.get() is None
    seen = []
    prepared.run(control_flow_feeds(), hook=lambda info, *_: seen.append(info.path))   # still fine afterwards
    assert seen == expected_paths(True)


def test_verbose_trace_indents_body_steps():
    out = io.StringIO()
    onnx_mini.prepare(control_flow_model(), verbose=out).run(control_flow_feeds(False))
    lines = out.getvalue().splitlines()
    parsed = [re.match(r"\[\s*(\d+)\] ( *)(\S+) (\S+)-\d+  .* (\d+\.\d+) ms$", line).groups() for line in lines]
    assert [p[2] for p in parsed] == expected_paths(False)
    assert [int(p[0]) for p in parsed] == list(range(len(lines)))
    depth = {p[2]: len(p[1]) // 2 for p in parsed}
    assert depth["Loop_0"] == 0 and depth["Loop_0/body/Add_1"] == 1 and depth["Loop_0/body/If_4/then_branch/Mul_0"] == 2
    # a control-flow node's time includes its body's: the Loop's covers its body's steps' times
    ms = {}
    for p in parsed:
        ms[p[2]] = ms.get(p[2], 0.0) + float(p[4])
    body = sum(v for k, v in ms.items() if k.startswith("Loop_0/body/") and k.count("/") == 2)
    assert ms["Loop_0"] >= body - 0.01      # 0.01: each line is rounded to the microsecond


def test_threads_each_see_their_own_hook(prepared):
    """Two threads run the same prepared model at once with different hooks (and a third with none):
    each hook gets exactly its own run's steps, bodies included."""
    rounds = 30
    barrier = threading.Barrier(3)
    seen = {True: [], False: []}
    errors = []

    def work(c):
        try:
            hook = (lambda info, *_: seen[c].append(info.path)) if c is not None else None
            for _ in range(rounds):
                barrier.wait()
                prepared.run(control_flow_feeds(bool(c)), hook=hook)
        except BaseException as e:      # noqa: BLE001 - reported below
            errors.append(e)
            barrier.abort()
    threads = [threading.Thread(target=work, args=(c,)) for c in (True, False, None)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert seen[True] == expected_paths(True) * rounds
    assert seen[False] == expected_paths(False) * rounds


def test_tracing_follows_work_onto_pool_threads():
    """parallel.split and parallel.spawn run work in a copy of the caller's context: a body run on a
    pool thread inside a hooked run still finds the hook (TRACING)."""
    tracing = Tracing(lambda *_: None, ("Conv_0",))
    got = []

    def work(*_):
        got.append((threading.get_ident(), TRACING.get()))
    token = TRACING.set(tracing)
    try:
        with parallel.limited(2):
            parallel.split(work, 2, 1)
            for f in parallel.spawn(work, 1):
                f.result()
    finally:
        TRACING.reset(token)
    assert [t for _, t in got] == [tracing] * 3
    if parallel.THREADS > 1:
        assert len({ident for ident, _ in got}) > 1     # some of it did run on another thread
    # a fresh context (a new thread) starts with no hook
    assert contextvars.Context().run(TRACING.get) is None


def test_a_model_run_inside_a_hooked_kernel_is_not_traced():
    """A user kernel that runs another prepared model (with bodies) inside a hooked run: the outer
    hook sees the outer steps only."""
    inner = onnx_mini.prepare(control_flow_model())
    ops = onnx_mini.CustomOps()

    @ops.kernel("RunInner", since=1, domain="test.hooks")
    def run_inner():
        def run(x):
            return inner.run(control_flow_feeds() | {"x": x})["acc"]
        return run
    outer = model([helper.make_node("RunInner", ["x"], ["y"], domain="test.hooks", name="inner")],
                  [("x", F, [4])], [("y", F, None)], opset=[helper.make_opsetid("", 21),
                                                             helper.make_opsetid("test.hooks", 1)])
    seen = []
    x = control_flow_feeds()["x"]
    y = onnx_mini.prepare(outer, custom_ops=ops).run({"x": x}, hook=lambda info, *_: seen.append(info.path))
    assert seen == ["inner"] and np.array_equal(y[0], inner.run(control_flow_feeds())["acc"])
