"""Independent branches (onnx_mini/schedule.py) run at the same time, with the sequential results."""
from __future__ import annotations

import contextvars

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_mini
from onnx_mini import blas, executor, parallel
from onnx_mini.errors import KernelError
from onnx_mini.schedule import find_blocks

needs_threads = pytest.mark.skipif(parallel.THREADS < 2 or not blas.managed(),
                                   reason="branches run in parallel only with 2+ threads and managed BLAS")


@pytest.fixture(autouse=True)
def parallel_whatever_the_branch_time(monkeypatch):
    """These models are small: make every block run its branches at the same time (blocks run in
    parallel in blas's "split" mode only, which a busy machine or ONNX_MINI_BLAS_THREADS=split picks)."""
    monkeypatch.setattr(executor, "MIN_BRANCH_SECONDS", 0.0)
    monkeypatch.setattr(blas, "POLICY", "split")


def inception(modules=2, c=8, size=12, seed=0):
    """`modules` Inception-style modules: 1x1 | 1x1 -> 3x3 | maxpool -> 1x1, concatenated, then 1x1."""
    rng = np.random.default_rng(seed)
    inits, nodes = [], []

    def weight(name, m, cin, k):
        inits.append(numpy_helper.from_array(rng.standard_normal((m, cin, k, k)).astype(np.float32) * 0.3, name))
        return name

    x = "x"
    for i in range(modules):
        p = f"m{i}_"
        nodes += [helper.make_node("Conv", [x, weight(p + "w1", 4, c, 1)], [p + "b1"]),
                  helper.make_node("Conv", [x, weight(p + "w2a", 4, c, 1)], [p + "b2a"]),
                  helper.make_node("Relu", [p + "b2a"], [p + "b2r"]),
                  helper.make_node("Conv", [p + "b2r", weight(p + "w2b", 4, 4, 3)], [p + "b2"], pads=[1, 1, 1, 1]),
                  helper.make_node("MaxPool", [x], [p + "b3a"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
                  helper.make_node("Conv", [p + "b3a", weight(p + "w3", 4, c, 1)], [p + "b3"]),
                  helper.make_node("Concat", [p + "b1", p + "b2", p + "b3"], [p + "cat"], axis=1),
                  helper.make_node("Conv", [p + "cat", weight(p + "wo", c, 12, 1)], [p + "out"])]
        x = p + "out"
    g = helper.make_graph(nodes, "inception", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                             [1, c, size, size])],
                          [helper.make_tensor_value_info(x, TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


def test_modules_become_blocks_of_three_branches():
    prepared = onnx_mini.prepare(inception(3))
    blocks = prepared.plan.blocks
    assert [len(b.branches) for b in blocks] == [3, 3, 3]
    steps = prepared.plan.steps
    for b in blocks:
        assert steps[b.stop][1] and prepared.plan.infos[b.stop].op_type == "Concat"   # the join
        inside = sorted(i for br in b.branches for i, *_ in br)
        assert inside == list(range(b.start, b.stop))
    # the module's input is read by every branch: freed only once the block is done
    names = prepared.plan.slot_names
    for i, b in enumerate(blocks):
        assert names.index("x" if i == 0 else f"m{i - 1}_out") in b.after


def test_chains_have_no_blocks():
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["b"]),
             helper.make_node("Abs", ["b"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    assert find_blocks(onnx_mini.prepare(helper.make_model(g)).plan) == ()


@needs_threads
def test_parallel_run_equals_sequential_and_uses_blocks(monkeypatch):
    model = inception(3)
    x = np.random.default_rng(1).standard_normal((1, 8, 12, 12)).astype(np.float32)
    want = onnx_mini.prepare(model, threads=1).run([x])[0]
    calls = []
    real = executor._run_block
    monkeypatch.setattr(executor, "_run_block", lambda *a: calls.append(1) or real(*a))
    prepared = onnx_mini.prepare(model)
    for _ in range(20):
        np.testing.assert_array_equal(prepared.run([x])[0], want)
    assert len(calls) == 20 * 3


def test_threads_1_runs_sequentially(monkeypatch):
    monkeypatch.setattr(executor, "_run_block", lambda *a: pytest.fail("a block ran with threads=1"))
    x = np.ones((1, 8, 12, 12), np.float32)
    onnx_mini.prepare(inception(2), threads=1).run([x])
    sess_opts = onnx_mini.SessionOptions()
    sess_opts.intra_op_num_threads = 1
    onnx_mini.InferenceSession(inception(2).SerializeToString(), sess_opts).run(None, {"x": x})


@needs_threads
def test_error_in_a_branch_names_its_node():
    model = inception(2)
    for n in model.graph.node:
        if n.output[0] == "m1_b2":
            del n.attribute[:]     # 3x3 kernel without pads: output 10x10, cannot concat with 12x12
    prepared = onnx_mini.prepare(model)
    with pytest.raises(KernelError, match="Concat"):
        prepared.run([np.ones((1, 8, 12, 12), np.float32)])
    # a failing kernel inside a branch
    model = inception(2)
    for init in model.graph.initializer:
        if init.name == "m0_w3":
            init.CopyFrom(numpy_helper.from_array(np.ones((4, 3, 1, 1), np.float32), "m0_w3"))
    with pytest.raises(KernelError) as e:
        onnx_mini.prepare(model).run([np.ones((1, 8, 12, 12), np.float32)])
    assert e.value.op_type == "Conv"


def test_spawned_work_sees_the_callers_context():
    var = contextvars.ContextVar("probe", default="unset")
    seen = []
    token = var.set("caller's")
    try:
        for f in parallel.spawn(lambda: seen.append(var.get()), 2):
            f.result()
    finally:
        var.reset(token)
    assert seen == ["caller's", "caller's"]


def test_value_shared_by_branches_is_never_written_in_place():
    """The module input is read by a Relu in one branch (its last reader in plan order, so inplace.py
    would take its buffer) and by a Conv in another: inside a block the Relu runs the regular kernel."""
    rng = np.random.default_rng(6)
    w = numpy_helper.from_array(rng.standard_normal((16, 16, 1, 1)).astype(np.float32), "w")
    w2 = numpy_helper.from_array(rng.standard_normal((16, 16, 1, 1)).astype(np.float32), "w2")
    nodes = [helper.make_node("Sigmoid", ["x"], ["e"]),                       # the entry, made by the plan
             helper.make_node("Conv", ["e", "w"], ["a"]),
             helper.make_node("Relu", ["e"], ["r"]), helper.make_node("Conv", ["r", "w2"], ["b"]),
             helper.make_node("Concat", ["a", "b"], ["y"], axis=1)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 64, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, w2])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    prepared = onnx_mini.prepare(model)
    (block,) = prepared.plan.blocks
    relu = [fn for br in block.branches for i, fn, *_ in br if prepared.plan.infos[i].op_type == "Relu"]
    assert relu and not hasattr(relu[0], "regular")
    x = rng.standard_normal((1, 16, 64, 64)).astype(np.float32)
    want = onnx_mini.prepare(model, threads=1).run([x])[0]
    for _ in range(10):
        np.testing.assert_array_equal(prepared.run([x])[0], want)


@needs_threads
def test_blocks_of_short_branches_run_in_turn(monkeypatch):
    monkeypatch.setattr(executor, "MIN_BRANCH_SECONDS", 10.0)     # no branch of this model takes 10 s
    spawned = []
    real = parallel.spawn
    monkeypatch.setattr(parallel, "spawn", lambda *a: spawned.append(1) or real(*a))
    model = inception(2)
    x = np.random.default_rng(7).standard_normal((1, 8, 12, 12)).astype(np.float32)
    prepared = onnx_mini.prepare(model)
    want = onnx_mini.prepare(model, threads=1).run([x])[0]
    for _ in range(3):
        np.testing.assert_array_equal(prepared.run([x])[0], want)
    assert spawned == [] and all(b.worth == [False] for b in prepared.plan.blocks)
