"""Graph sort, opset resolution, planning (folding, frees), input validation and error reporting."""
import random

import numpy as np
import onnx.defs
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_mini
from onnx_mini import registry
from onnx_mini.errors import (GraphError, InputError, InvalidNodeError, KernelError, OnnxMiniError,
                              UnsupportedOperatorError)
from onnx_mini.graph import Node, topo_sort
from onnx_mini.inputs import bind_inputs
from onnx_mini.executor import execute

from helpers import F, I64, model


def chain_nodes(n):
    """x -> Add(x, one) -> ... n times; returns nodes in order."""
    names = ["x"] + [f"v{i}" for i in range(n)]
    return [helper.make_node("Add", [names[i], "one"], [names[i + 1]], name=f"add{i}") for i in range(n)]


def chain_model(nodes, n):
    one = numpy_helper.from_array(np.ones(2, np.float32), "one")
    return model(nodes, [("x", F, [2])], [(f"v{n - 1}", F, [2])], [one])


# -- sort -------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(5))
def test_any_node_order_runs(seed):
    nodes = chain_nodes(30)
    random.Random(seed).shuffle(nodes)
    (y,) = onnx_mini.prepare(chain_model(nodes, 30)).run([np.zeros(2, np.float32)])
    np.testing.assert_array_equal(y, [30, 30])


def test_sort_is_stable_for_independent_nodes():
    nodes = [Node(f"n{i}", "Identity", "", ("x",), (f"y{i}",), {}, i) for i in (3, 1, 2)]
    assert [n.name for n in topo_sort(nodes, {"x"})] == ["n3", "n1", "n2"]


def test_cycle_names_the_nodes():
    nodes = [helper.make_node("Add", ["x", "b"], ["a"], name="first"),
             helper.make_node("Add", ["a", "x"], ["b"], name="second")]
    with pytest.raises(GraphError, match="cycle.*first.*second"):
        onnx_mini.prepare(model(nodes, [("x", F, [2])], [("b", F, [2])]))


def test_undefined_value_is_named():
    nodes = [helper.make_node("Add", ["x", "ghost"], ["y"], name="adder")]
    with pytest.raises(GraphError, match="'ghost'.*adder"):
        onnx_mini.prepare(model(nodes, [("x", F, [2])], [("y", F, [2])]))


def test_output_produced_by_nothing():
    with pytest.raises(GraphError, match="'nothing'"):
        onnx_mini.prepare(model([], [("x", F, [2])], [("nothing", F, [2])]))


# -- resolution -------------------------------------------------------------------------------

@pytest.mark.parametrize("opset, version", [(1, 1), (4, 1), (5, 5), (12, 5), (13, 13), (14, 14), (18, 14),
                                            (19, 19), (25, 25)])
def test_reshape_version_follows_opset(opset, version):
    assert registry.resolve("", "Reshape", opset).version == version
    assert registry.resolve("ai.onnx", "Reshape", opset).kernel.since == version


def test_reshape_1_and_5_run_with_their_own_signature():
    x = np.arange(6, dtype=np.float32)
    m1 = model([helper.make_node("Reshape", ["x"], ["y"], shape=[3, 2])], [("x", F, [6])], [("y", F, None)],
               opset=4)
    assert onnx_mini.prepare(m1).run([x])[0].shape == (3, 2)
    m5 = model([helper.make_node("Reshape", ["x", "s"], ["y"])], [("x", F, [6]), ("s", I64, [2])],
               [("y", F, None)], opset=5)
    assert onnx_mini.prepare(m5).run([x, np.array([2, 3])])[0].shape == (2, 3)
    with pytest.raises(InvalidNodeError, match="allowzero"):   # allowzero exists only from 14
        onnx_mini.prepare(model([helper.make_node("Reshape", ["x", "s"], ["y"], allowzero=1)],
                                [("x", F, [6]), ("s", I64, [2])], [("y", F, None)], opset=13))


def test_unknown_op_domain_and_version_are_reported():
    with pytest.raises(UnsupportedOperatorError, match="'n1'.*NoSuchOp"):
        onnx_mini.prepare(model([helper.make_node("NoSuchOp", ["x"], ["y"], name="n1")], [("x", F, [2])],
                                [("y", F, [2])]))
    with pytest.raises(UnsupportedOperatorError, match="com.example"):
        onnx_mini.prepare(model([helper.make_node("Op", ["x"], ["y"], domain="com.example")], [("x", F, [2])],
                                [("y", F, [2])], opset=[helper.make_opsetid("", 21),
                                                        helper.make_opsetid("com.example", 1)]))
    # GatherElements appeared in opset 11
    with pytest.raises(UnsupportedOperatorError, match="opset 10") as e:
        onnx_mini.prepare(model([helper.make_node("GatherElements", ["x", "i"], ["y"])],
                                [("x", F, [2]), ("i", I64, [2])], [("y", F, [2])], opset=10))
    assert e.value.op_type == "GatherElements" and e.value.opset == 10


def test_schema_function_body_is_inlined(monkeypatch):
    # GreaterOrEqual-12 has a kernel, and a schema body (Greater, Equal, Or): without the kernel,
    # resolution must inline that body, naming its nodes after the caller.
    registry.load_all_ops()
    monkeypatch.delitem(registry._KERNELS, ("", "GreaterOrEqual", 12))
    registry._resolve.cache_clear()
    try:
        rep = onnx_mini.prepare(model([helper.make_node("GreaterOrEqual", ["x", "y"], ["z"], name="ge")],
                                      [("x", F, [3]), ("y", F, [3])], [("z", TensorProto.BOOL, [3])], opset=12))
        assert [i.op_type for i in rep.plan.infos] == ["Greater", "Equal", "Or"]
        assert all(i.name.startswith("ge/") for i in rep.plan.infos)
        (z,) = rep.run([np.array([1, 2, 3], np.float32), np.array([2, 2, 2], np.float32)])
        assert z.tolist() == [False, True, True]
    finally:
        registry._resolve.cache_clear()


def test_model_local_function_is_inlined():
    f = helper.make_function("local", "AddTwice", ["a", "b"], ["c"],
                             [helper.make_node("Add", ["a", "b"], ["t"]), helper.make_node("Add", ["t", "b"], ["c"])],
                             [helper.make_opsetid("", 14)])
    m = model([helper.make_node("AddTwice", ["x", "x"], ["y"], domain="local")], [("x", F, [2])],
              [("y", F, [2])], opset=[helper.make_opsetid("", 14), helper.make_opsetid("local", 1)],
              functions=[f])
    np.testing.assert_array_equal(onnx_mini.prepare(m).run([np.array([1, 2], np.float32)])[0], [3, 6])


def test_supported_ops_lists_registered_versions():
    ops = onnx_mini.supported_ops()
    assert ("", "Reshape", 14) in ops and ("", "GatherElements", 13) in ops and ("", "Shape", 1) in ops


# -- plan and executor ------------------------------------------------------------------------

def test_constant_subgraph_is_folded_and_intermediates_are_freed():
    c = numpy_helper.from_array(np.array([1, 2], np.float32), "c")
    nodes = [helper.make_node("Add", ["c", "c"], ["cc"]),          # constant: folded at prepare
             helper.make_node("Add", ["x", "cc"], ["a"]),
             helper.make_node("Add", ["a", "a"], ["b"]),
             helper.make_node("Add", ["b", "x"], ["y"])]
    rep = onnx_mini.prepare(model(nodes, [("x", F, [2])], [("y", F, [2])], [c]))
    assert [i.op_type for i in rep.plan.infos] == ["Add", "Add", "Add"]
    seen = []
    rep.run([np.ones(2, np.float32)], hook=lambda info, ins, outs: seen.append(info.outputs))
    assert seen == [("a",), ("b",), ("y",)]
    slots = bind_inputs(rep.plan, [np.ones(2, np.float32)])
    (y,) = execute(rep.plan, slots)
    np.testing.assert_array_equal(y, [1 + 2 * (1 + 2), 1 + 2 * (1 + 4)][:1] * 0 + [2 * 3 + 1, 2 * 5 + 1])
    live = [i for i, v in enumerate(slots) if v is not None and rep.plan.slot_names[i] in ("a", "b", "x")]
    assert live == []   # a, b and the input are dropped after their last use
    unopt = onnx_mini.prepare(model(nodes, [("x", F, [2])], [("y", F, [2])], [c]), optimize=False)
    assert len(unopt.plan.steps) == 4


def test_kernel_error_names_node_op_version_and_inputs():
    m = model([helper.make_node("Reshape", ["x", "s"], ["y"], name="bad_reshape")],
              [("x", F, [6]), ("s", I64, [2])], [("y", F, None)], opset=14)
    with pytest.raises(KernelError) as e:
        onnx_mini.prepare(m).run([np.zeros(6, np.float32), np.array([4, -1])])
    msg = str(e.value)
    assert "bad_reshape" in msg and "Reshape-14" in msg and "float32[6]" in msg and "int64[2]" in msg
    assert e.value.node == "bad_reshape" and e.value.version == 14 and isinstance(e.value, OnnxMiniError)


def test_unknown_attribute_and_missing_required_attribute():
    with pytest.raises(InvalidNodeError, match="'foo'"):
        onnx_mini.prepare(model([helper.make_node("Shape", ["x"], ["y"], foo=1)], [("x", F, [2])],
                                [("y", I64, None)]))
    with pytest.raises(InvalidNodeError, match="'value'"):
        onnx_mini.prepare(model([helper.make_node("Constant", [], ["y"])], [], [("y", F, None)], opset=9))


def test_inputs_are_never_mutated_and_outputs_alias_safely():
    x = np.arange(6, dtype=np.float32)
    keep = x.copy()
    m = model([helper.make_node("Reshape", ["x", "s"], ["y"])], [("x", F, [6]), ("s", I64, [2])],
              [("y", F, None)])
    (y,) = onnx_mini.prepare(m).run([x, np.array([2, 3])])
    assert np.shares_memory(x, y) and not y.flags.writeable
    np.testing.assert_array_equal(x, keep)


# -- input validation -------------------------------------------------------------------------

@pytest.fixture
def two_inputs():
    return onnx_mini.prepare(model([helper.make_node("Add", ["x", "y"], ["z"])],
                                   [("x", F, ["N", 3]), ("y", F, [1, 3])], [("z", F, None)]))


def test_input_errors(two_inputs):
    ok = np.zeros((2, 3), np.float32), np.zeros((1, 3), np.float32)
    assert two_inputs.run(list(ok))[0].shape == (2, 3)
    cases = [
        ({"x": ok[0]}, "missing input.*'y'"),
        ({"x": ok[0], "y": ok[1], "w": ok[1]}, "unknown input.*'w'"),
        ([ok[0]], "expected 2 positional"),
        ([ok[0].astype(np.float64), ok[1]], "'x'.*element type float.*float64"),
        ([np.zeros(3, np.float32), ok[1]], "'x'.*rank 2"),
        ([ok[0], np.zeros((2, 3), np.float32)], "'y'.*dimension 0 must be 1"),
        ("nonsense", "list, a tuple or a dict"),
    ]
    for feeds, pattern in cases:
        with pytest.raises(InputError, match=pattern):
            two_inputs.run(feeds)


def test_python_lists_become_arrays_of_the_declared_type(two_inputs):
    (z,) = two_inputs.run({"x": [[1, 2, 3]], "y": [[1, 1, 1]]})
    assert z.dtype == np.float32
    np.testing.assert_array_equal(z, [[2, 3, 4]])


def test_run_node_and_backend_interface():
    node = helper.make_node("Add", ["a", "b"], ["c"])
    (c,) = onnx_mini.run_node(node, [np.array([1], np.int32), np.array([2], np.int32)])
    assert c.dtype == np.int32 and c.tolist() == [3]
    assert onnx_mini.supports_device("CPU") and not onnx_mini.supports_device("CUDA")
    out = onnx_mini.run_model(chain_model(chain_nodes(2), 2), [np.zeros(2, np.float32)])
    assert out["v1"].tolist() == [2, 2] and out[0].tolist() == [2, 2]


def test_session_intermediate_outputs():
    m = chain_model(chain_nodes(3), 3)
    sess = onnx_mini.InferenceSession(m.SerializeToString())
    assert [i.name for i in sess.get_inputs()] == ["x"] and sess.get_outputs()[0].type == "tensor(float)"
    v0, v2 = sess.run(["v0", "v2"], {"x": np.zeros(2, np.float32)})
    assert v0.tolist() == [1, 1] and v2.tolist() == [3, 3]


def test_one_prepared_model_runs_from_many_threads():
    from concurrent.futures import ThreadPoolExecutor
    rep = onnx_mini.prepare(chain_model(chain_nodes(50), 50))
    xs = [np.full(2, k, np.float32) for k in range(40)]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda x: rep.run([x])[0], xs))
    for k, y in enumerate(results):
        np.testing.assert_array_equal(y, [k + 50, k + 50])
