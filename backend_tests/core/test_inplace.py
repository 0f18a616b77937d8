"""In-place elementwise steps (onnx_mini/inplace.py): a dying intermediate's buffer is reused, and
nothing anyone can still see is ever written: graph outputs, live views, callers' arrays, constants."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_mini
from onnx_mini import inplace, memory
from onnx_mini.errors import KernelError

N = 256     # 65536 elements: above inplace.MIN_SIZE


def make(nodes, outputs, inits=(), inputs=("x",)):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(i, TensorProto.FLOAT, [N, N]) for i in inputs],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs], list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


@pytest.fixture
def writes(monkeypatch):
    """How many times the in-place path was taken: the kernels' in-place forms, counted (models
    prepared after this fixture get counted ones; wrapping _free instead would add a frame to the
    counts it reads)."""
    taken = []

    def counted(f):
        def run(*args, **kwargs):
            taken.append(1)
            return f(*args, **kwargs)
        return run
    real = inplace.wrap
    monkeypatch.setattr(inplace, "wrap", lambda in_place, *rest: real(counted(in_place), *rest))
    return taken


def const(name, value):
    return numpy_helper.from_array(np.asarray(value, np.float32), name)


def x_value(seed=0):
    return np.random.default_rng(seed).standard_normal((N, N)).astype(np.float32)


def test_chain_of_elementwise_steps_reuses_buffers(writes):
    nodes = [helper.make_node("Mul", ["x", "two"], ["a"]), helper.make_node("Add", ["a", "c"], ["b"]),
             helper.make_node("Relu", ["b"], ["r"]), helper.make_node("Neg", ["r"], ["n"]),
             helper.make_node("Sub", ["half", "n"], ["y"])]       # the dying operand second
    model = make(nodes, ["y"], [const("two", 2.0), const("c", np.linspace(-1, 1, N)), const("half", 0.5)])
    x = x_value()
    x_before = x.copy()
    y = onnx_mini.prepare(model).run([x])[0]
    want = 0.5 + np.maximum(x * 2 + np.linspace(-1, 1, N).astype(np.float32), 0)
    np.testing.assert_array_equal(y, want)
    np.testing.assert_array_equal(x, x_before)        # the caller's array: read, never written
    assert len(writes) == 4                           # Add, Relu, Neg, Sub wrote into their input
    np.testing.assert_array_equal(onnx_mini.prepare(model, optimize=False).run([x])[0], want)


def test_graph_output_is_not_overwritten(writes):
    nodes = [helper.make_node("Mul", ["x", "two"], ["a"]), helper.make_node("Relu", ["a"], ["r"])]
    model = make(nodes, ["a", "r"], [const("two", -2.0)])
    x = x_value(1)
    a, r = onnx_mini.prepare(model).run([x])
    np.testing.assert_array_equal(a, x * -2)
    np.testing.assert_array_equal(r, np.maximum(x * -2, 0))
    assert writes == []


def test_live_view_blocks_the_write(writes):
    """Reshape's output is a view of `a` and stays alive (a graph output) after Add reads `a` last."""
    nodes = [helper.make_node("Mul", ["x", "two"], ["a"]), helper.make_node("Reshape", ["a", "flat"], ["v"]),
             helper.make_node("Add", ["a", "one"], ["y"])]
    model = make(nodes, ["v", "y"], [const("two", 2.0), const("one", 1.0),
                                      numpy_helper.from_array(np.array([-1], np.int64), "flat")])
    x = x_value(2)
    v, y = onnx_mini.prepare(model).run([x])
    np.testing.assert_array_equal(v, (x * 2).ravel())
    np.testing.assert_array_equal(y, x * 2 + 1)
    assert writes == []


def test_callers_arrays_and_constants_are_never_targets(writes):
    nodes = [helper.make_node("Add", ["x", "w"], ["s"]), helper.make_node("Relu", ["x2"], ["t"]),
             helper.make_node("Mul", ["s", "t"], ["y"])]
    w = np.full((N, N), 0.25, np.float32)
    model = make(nodes, ["y"], [numpy_helper.from_array(w, "w")], inputs=("x", "x2"))
    prepared = onnx_mini.prepare(model)
    x, x2 = x_value(3), x_value(4)
    copies = x.copy(), x2.copy()
    y = prepared.run({"x": x, "x2": x2})[0]
    np.testing.assert_array_equal(y, (x + 0.25) * np.maximum(x2, 0))
    np.testing.assert_array_equal(x, copies[0])
    np.testing.assert_array_equal(x2, copies[1])
    # temporaries handed straight to run(): still the caller's, still not written
    y2 = prepared.run([x_value(3), x_value(4)])[0]
    np.testing.assert_array_equal(y2, y)
    assert len(writes) == 2                  # per run, Mul wrote into s (x + w, made by the plan), nothing else
    np.testing.assert_array_equal(prepared.run({"x": x, "x2": x2})[0], y)  # the initializer is intact


def test_small_tensors_and_other_types_take_the_regular_kernel(writes):
    nodes = [helper.make_node("Mul", ["x", "x"], ["a"]), helper.make_node("Add", ["a", "a"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.INT32, [N, N])],
                          [helper.make_tensor_value_info("y", TensorProto.INT32, None)])
    x = np.arange(N * N, dtype=np.int32).reshape(N, N) % 7
    y = onnx_mini.prepare(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])).run([x])[0]
    np.testing.assert_array_equal(y, 2 * x * x)
    assert writes == []


def test_same_results_as_written_with_broadcasting_both_ways():
    nodes = [helper.make_node("Exp", ["x"], ["e"]), helper.make_node("Div", ["row", "e"], ["d"]),
             helper.make_node("Tanh", ["d"], ["t"]), helper.make_node("Sub", ["t", "col"], ["y"])]
    model = make(nodes, ["y"], [const("row", np.linspace(1, 2, N)), const("col", np.linspace(0, 1, N)[:, None])])
    x = x_value(5)
    fast, plain = onnx_mini.prepare(model), onnx_mini.prepare(model, optimize=False)
    np.testing.assert_array_equal(fast.run([x])[0], plain.run([x])[0])


# -- plans specialised to their inputs' shapes (specialize.py): steps probed in the first run ------

def symbolic(nodes, outputs, inits=(), inputs=(("x", TensorProto.FLOAT, ["A", "B"]),)):
    """Like make(), the inputs' dims symbolic, and a Shape -> Reshape round trip of x first (to xs), so
    that the model's plan is specialised to the fed shapes (the round trip then folds away)."""
    nodes = [helper.make_node("Shape", ["x"], ["x_shape"]), helper.make_node("Reshape", ["x", "x_shape"], ["xs"]),
             *nodes]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(*i) for i in inputs],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs], list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


def specialised_steps(prepared):
    """(op type, wrapped?) per step of the model's one specialised plan."""
    (entry,) = [e for e in prepared._specializers[id(prepared.plan)]._plans.values() if e is not None]
    plan = entry[0]
    return [(info.op_type, hasattr(fn, "regular")) for (fn, *_), info in zip(plan.steps, plan.infos)]


def test_specialised_plan_keeps_the_wrapper_only_where_inputs_are_large(writes):
    """The Adds see [N, N] tensors, Neg a [N, 1] one (below MIN_SIZE): after the first run Neg runs its
    regular kernel, the Adds keep writing in place; results as written."""
    nodes = [helper.make_node("Mul", ["xs", "two"], ["a"]), helper.make_node("Add", ["a", "c"], ["b"]),
             helper.make_node("ReduceMax", ["xs", "one_axis"], ["m"], keepdims=1),
             helper.make_node("Neg", ["m"], ["n"]), helper.make_node("Add", ["b", "n"], ["y"])]
    model = symbolic(nodes, ["y"], [const("two", 2.0), const("c", np.linspace(-1, 1, N)),
                                    numpy_helper.from_array(np.array([1], np.int64), "one_axis")])
    x = x_value(6)
    x_before = x.copy()
    want = x * 2 + np.linspace(-1, 1, N).astype(np.float32) - x.max(axis=1, keepdims=True)
    prepared = onnx_mini.prepare(model)
    np.testing.assert_array_equal(prepared.run([x])[0], want)
    assert writes == []                  # the first run notes sizes (its frame holds the inputs): no write
    # (Mul: x is read again by ReduceMax, so not a candidate at all)
    assert specialised_steps(prepared) == [("Mul", False), ("Add", True), ("ReduceMax", False), ("Neg", False),
                                           ("Add", True)]
    for _ in range(2):
        np.testing.assert_array_equal(prepared.run([x])[0], want)
    assert len(writes) == 4              # per run: both Adds into their dying [N, N] input
    np.testing.assert_array_equal(x, x_before)
    np.testing.assert_array_equal(onnx_mini.prepare(model, optimize=False).run([x])[0], want)


def test_specialised_tiny_chain_runs_regular_kernels_from_the_second_run():
    nodes = [helper.make_node("Add", ["xs", "c"], ["a"]), helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Mul", ["r", "c"], ["y"])]
    model = symbolic(nodes, ["y"], [const("c", [[0.5, -1.5, 2.0]])])
    prepared, plain = onnx_mini.prepare(model), onnx_mini.prepare(model, optimize=False)
    x = np.array([[1.0, 2.0, -3.0], [-0.25, 0.5, 4.0]], np.float32)
    for _ in range(3):
        got = prepared.run([x])[0]
        np.testing.assert_array_equal(got, np.maximum(x + [[0.5, -1.5, 2.0]], 0) * [[0.5, -1.5, 2.0]])
        np.testing.assert_array_equal(got, plain.run([x])[0])
        assert specialised_steps(prepared) == [("Add", False), ("Relu", False), ("Mul", False)]


def test_sizes_growing_after_a_data_dependent_shape_still_give_the_same_results():
    """NonZero's count is small in the first run and above MIN_SIZE in the next (same input shape):
    the steps after it, unwrapped after the first run, compute the same values with a new array."""
    n = inplace.MIN_SIZE + 100
    nodes = [helper.make_node("NonZero", ["xs"], ["nz"]), helper.make_node("Cast", ["nz"], ["f"], to=1),
             helper.make_node("Mul", ["f", "two"], ["a"]), helper.make_node("Add", ["a", "two"], ["y"])]
    model = symbolic(nodes, ["y"], [const("two", 2.0)], inputs=(("x", TensorProto.FLOAT, ["A"]),))
    prepared, plain = onnx_mini.prepare(model), onnx_mini.prepare(model, optimize=False)
    few = np.zeros(n, np.float32)
    few[[3, 70]] = 1.0
    many = np.arange(n, dtype=np.float32) + 1
    for x in (few, many, few, many):
        x_before = x.copy()
        got = prepared.run([x])[0]
        np.testing.assert_array_equal(got, np.flatnonzero(x)[None].astype(np.float32) * 2 + 2)
        np.testing.assert_array_equal(got, plain.run([x])[0])
        np.testing.assert_array_equal(x, x_before)
        assert not any(wrapped for _, wrapped in specialised_steps(prepared))    # as the first run left them


def test_a_first_run_failing_before_the_last_probe_leaves_the_settling_to_a_later_run():
    """Gather fails on an index out of range (the error names it, through the noting step before it);
    the run after it settles the plan."""
    nodes = [helper.make_node("Mul", ["xs", "two"], ["a"]), helper.make_node("Add", ["a", "two"], ["b"]),
             helper.make_node("Gather", ["b", "i"], ["g"], axis=1), helper.make_node("Add", ["g", "two"], ["y"])]
    model = symbolic(nodes, ["y"], [const("two", 2.0)],
                     inputs=(("x", TensorProto.FLOAT, ["A", "B"]), ("i", TensorProto.INT64, ["K"])))
    prepared = onnx_mini.prepare(model)
    x = np.array([[1.0, 2.0, 3.0]], np.float32)
    with pytest.raises(KernelError, match="Gather"):
        prepared.run([x, np.array([0, 7], np.int64)])
    assert specialised_steps(prepared) == [("Mul", True), ("Add", True), ("Gather", False), ("Add", True)]
    np.testing.assert_array_equal(prepared.run([x, np.array([2, -3], np.int64)])[0], [[10.0, 6.0]])
    assert specialised_steps(prepared) == [("Mul", False), ("Add", False), ("Gather", False), ("Add", False)]
    np.testing.assert_array_equal(prepared.run([x, np.array([1, 1], np.int64)])[0], [[8.0, 8.0]])


def test_probe_leaves_the_steps_of_independent_branches_wrapped():
    from onnx_mini.plan import Plan, StepInfo
    from onnx_mini.schedule import Block

    def wrapped():
        return inplace.wrap(np.add, np.add, (0,), 2)
    info = StepInfo("add", "Add", "", 14, 21, ("p", "q"), ("r",))
    steps = [(wrapped(), (2, 3), 4, (2,)), (wrapped(), (4, 3), 5, (4,)), (wrapped(), (5, 3), 6, (5,))]
    plan = Plan(list(steps), [info] * 3, [None] * 7, [], ["r"], [6])
    plan.blocks = (Block(1, 2, (), ()),)
    inplace.probe(plan)
    assert plan.steps[1][0] is steps[1][0] and plan.steps[0][0] is not steps[0][0]
    small = np.ones(3, np.float32)
    np.testing.assert_array_equal(plan.steps[0][0](small, small), [2, 2, 2])   # the noting steps: same results
    np.testing.assert_array_equal(plan.steps[2][0](small, small), [2, 2, 2])   # the last one settles the plan
    assert [fn for fn, *_ in plan.steps] == [np.add, steps[1][0], np.add]


def test_a_recycled_buffer_is_written_in_place(writes):
    """A depthwise Conv's large output comes from memory's recycled buffers, whose pool holds one
    reference more than a plain array's owner: the elementwise steps after it still write into it."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((8, 1, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], group=8),
             helper.make_node("Neg", ["c"], ["r"]), helper.make_node("Abs", ["r"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 128, 128])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [numpy_helper.from_array(w, "w")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    x = rng.standard_normal((1, 8, 128, 128)).astype(np.float32)
    prepared = onnx_mini.prepare(model)
    ys = [prepared.run([x])[0] for _ in range(3)]
    assert ys[0].base is not None and memory.recycled(ys[0].base)   # the Conv's output buffer, written twice more
    assert len(writes) == 6                            # Neg and Abs in place, every run
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    c = sum(xp[:, :, i:i + 128, j:j + 128] * w[:, 0, i, j].astype(np.float64)[:, None, None]
            for i in range(3) for j in range(3))
    for y in ys:
        np.testing.assert_allclose(y, np.abs(c), rtol=1e-5, atol=1e-5)
    assert not np.shares_memory(ys[0], ys[1]) and not np.shares_memory(ys[1], ys[2])
