"""Graph sort, opset resolution, planning (folding, frees), input validation and error reporting."""
import random

import numpy as np
import onnx.defs
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_mini
from onnx_mini import catalog
from onnx_mini import registry
from onnx_mini import resolve as resolve_module
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
    assert resolve_module.resolve("", "Reshape", opset).version == version
    assert resolve_module.resolve("ai.onnx", "Reshape", opset).kernel.since == version


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
    catalog.load_all_ops()
    monkeypatch.delitem(registry._KERNELS, ("", "GreaterOrEqual", 12))
    resolve_module._resolve.cache_clear()
    try:
        rep = onnx_mini.prepare(model([helper.make_node("GreaterOrEqual", ["x", "y"], ["z"], name="ge")],
                                      [("x", F, [3]), ("y", F, [3])], [("z", TensorProto.BOOL, [3])], opset=12))
        assert [i.op_type for i in rep.plan.infos] == ["Greater", "Equal", "Or"]
        assert all(i.name.startswith("ge/") for i in rep.plan.infos)
        (z,) = rep.run([np.array([1, 2, 3], np.float32), np.array([2, 2, 2], np.float32)])
        assert z.tolist() == [False, True, True]
    finally:
        resolve_module._resolve.cache_clear()


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


def test_steps_of_every_arity_run_and_free_their_slots():
    # the executor calls steps of 1 to 3 inputs directly and the rest through an argument list; each
    # frees the slots whose last reader it is (none, one or several)
    nodes = [helper.make_node("Where", ["c", "x", "z"], ["w"]),               # 3 inputs, frees c
             helper.make_node("Sum", ["w", "x", "z", "w"], ["s"]),            # 4 inputs, frees w, x, z
             helper.make_node("Split", ["s"], ["s0", "s1"], axis=0),          # 2 outputs
             helper.make_node("Neg", ["s0"], ["n"]),                          # 1 input
             helper.make_node("Mul", ["n", "s1"], ["y"])]                     # 2 inputs
    m = model(nodes, [("c", TensorProto.BOOL, [2]), ("x", F, [2]), ("z", F, [2])], [("y", F, [1])], opset=17)
    rep = onnx_mini.prepare(m, optimize=False)
    feeds = [np.array([True, False]), np.array([1, 2], np.float32), np.array([10, 20], np.float32)]
    slots = bind_inputs(rep.plan, feeds)
    (y,) = execute(rep.plan, slots)
    # w = [1, 20]; s = w + x + z + w = [1+1+10+1, 20+2+20+20] = [13, 62]; y = -13 * 62
    assert y.tolist() == [-13 * 62]
    live = [rep.plan.slot_names[i] for i, v in enumerate(slots) if v is not None]
    assert live == ["y"] and slots[0] is None      # every intermediate and input dropped; slot 0 stays None


def test_kernel_error_of_a_three_input_step_names_it():
    m = model([helper.make_node("Where", ["c", "x", "z"], ["y"], name="bad_where")],
              [("c", TensorProto.BOOL, [2]), ("x", F, [3]), ("z", F, [2])], [("y", F, None)], opset=17)
    with pytest.raises(KernelError) as e:
        onnx_mini.prepare(m).run([np.array([True, False]), np.ones(3, np.float32), np.ones(2, np.float32)])
    assert e.value.node == "bad_where" and "bool[2]" in str(e.value) and "float32[3]" in str(e.value)


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


def test_usual_feeds_bind_as_read_only_views(two_inputs):
    """The usual call (a dict of exactly the inputs, or one value per input) takes bind_inputs's quick
    check: the slots hold read-only views of the caller's arrays, which stay writeable."""
    x, y = np.arange(6, dtype=np.float32).reshape(2, 3), np.ones((1, 3), np.float32)
    plan = two_inputs.plan
    for feeds in ({"y": y, "x": x}, [x, y], (x, y)):
        slots = bind_inputs(plan, feeds)
        got = {i.name: slots[i.slot] for i in plan.inputs}
        for name, given in (("x", x), ("y", y)):
            assert got[name] is not given and np.shares_memory(got[name], given)
            assert not got[name].flags.writeable and given.flags.writeable
        np.testing.assert_array_equal(two_inputs.run(feeds)[0], x + y)


def test_quick_binding_reports_the_first_fault_the_general_matching_finds(two_inputs):
    bad_x = np.zeros((2, 3), np.float64)
    # two names, as many as the inputs: an unknown name wins over the bad value before it
    with pytest.raises(InputError, match="unknown input.*'w'"):
        two_inputs.run({"x": bad_x, "w": np.zeros((1, 3), np.float32)})
    # two bad values: the first in the caller's order is named
    with pytest.raises(InputError, match="'y'.*dimension 0 must be 1"):
        two_inputs.run({"y": np.zeros((2, 3), np.float32), "x": bad_x})
    with pytest.raises(InputError, match="'x'.*element type float.*float64"):
        two_inputs.run((bad_x, np.zeros((2, 3), np.float32)))


def test_quick_binding_converts_what_the_declared_type_asks():
    # a fixed and a symbolic dim; str_ arrays and non-str elements of a string tensor become str objects
    m = model([helper.make_node("Identity", ["s"], ["t"])], [("s", TensorProto.STRING, ["N", 2])],
              [("t", TensorProto.STRING, None)])
    rep = onnx_mini.prepare(m)
    (t,) = rep.run({"s": np.array([["a", "b"]])})
    assert t.dtype == object and t.tolist() == [["a", "b"]]
    (t,) = rep.run(np.array([["a", 5]], dtype=object))
    assert t.tolist() == [["a", "5"]]
    with pytest.raises(InputError, match="'s'.*dimension 1 must be 2"):
        rep.run([np.array([["a", "b", "c"]], dtype=object)])


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


# -- values that are not tensors: sequences and optionals -----------------------------------------

from onnx import TensorProto  # noqa: E402

from onnx_mini import plan as plan_module  # noqa: E402
from onnx_mini import planner  # noqa: E402
from onnx_mini.graph import free_names  # noqa: E402

SEQ_F = helper.make_sequence_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, None))
OPT_T = helper.make_optional_type_proto(helper.make_tensor_type_proto(TensorProto.INT64, [2]))
OPT_SEQ = helper.make_optional_type_proto(SEQ_F)


def typed_model(nodes, inputs, outputs, opset=18):
    """inputs/outputs: [(name, TypeProto)]."""
    g = helper.make_graph(nodes, "g", [helper.make_value_info(n, t) for n, t in inputs],
                          [helper.make_value_info(n, t) for n, t in outputs])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def passthrough_model():
    """seq, opt_t, opt_seq -> Identity of each: sequence and optional values in and out."""
    nodes = [helper.make_node("Identity", [x], [f"{x}_out"]) for x in ("seq", "opt_t", "opt_seq")]
    types = [("seq", SEQ_F), ("opt_t", OPT_T), ("opt_seq", OPT_SEQ)]
    return typed_model(nodes, types, [(f"{n}_out", t) for n, t in types])


SEQ_VALUE = [np.array([1.5, 2], np.float32), np.zeros((0, 3), np.float32), np.array(7, np.float32)]


def check_passthrough(outs, opt_t, opt_seq):
    seq_out, t_out, s_out = outs
    assert isinstance(seq_out, list) and len(seq_out) == 3
    for got, exp in zip(seq_out, SEQ_VALUE):
        assert got.dtype == exp.dtype and got.shape == exp.shape and np.array_equal(got, exp)
    assert (t_out is None) if opt_t is None else t_out.tolist() == opt_t.tolist()
    assert (s_out is None) if opt_seq is None else [a.tolist() for a in s_out] == [a.tolist() for a in opt_seq]


@pytest.mark.parametrize("opt_t,opt_seq", [(np.array([3, 4]), SEQ_VALUE[:1]), (None, None), (None, [])])
def test_sequences_and_optionals_through_prepare_run(opt_t, opt_seq):
    rep = onnx_mini.prepare(passthrough_model())
    check_passthrough(list(rep.run([SEQ_VALUE, opt_t, opt_seq])), opt_t, opt_seq)
    check_passthrough(list(rep.run({"seq": tuple(SEQ_VALUE), "opt_t": opt_t, "opt_seq": opt_seq})), opt_t, opt_seq)


@pytest.mark.parametrize("opt_t,opt_seq", [(np.array([3, 4]), SEQ_VALUE[1:]), (None, None)])
def test_sequences_and_optionals_through_inference_session(opt_t, opt_seq):
    sess = onnx_mini.InferenceSession(passthrough_model().SerializeToString())
    assert [i.type for i in sess.get_inputs()] == ["seq(tensor(float))", "optional(tensor(int64))",
                                                   "optional(seq(tensor(float)))"]
    check_passthrough(sess.run(None, {"seq": SEQ_VALUE, "opt_t": opt_t, "opt_seq": opt_seq}), opt_t, opt_seq)
    (only,) = sess.run(["seq_out"], {"seq": SEQ_VALUE, "opt_t": opt_t, "opt_seq": opt_seq})
    assert isinstance(only, list) and len(only) == 3


def test_sequences_and_optionals_through_the_backend_api():
    check_passthrough(list(onnx_mini.run_model(passthrough_model(), [SEQ_VALUE, None, SEQ_VALUE])), None, SEQ_VALUE)
    # run_node declares no types: a list (or tuple) is a sequence, None an empty optional
    node = helper.make_node("SequenceLength", ["s"], ["n"])
    assert onnx_mini.run_node(node, [SEQ_VALUE])[0].tolist() == 3
    assert onnx_mini.run_node(node, [tuple(SEQ_VALUE[:2])])[0].tolist() == 2
    node = helper.make_node("OptionalHasElement", ["o"], ["h"])
    assert onnx_mini.run_node(node, [None])[0].tolist() is False
    (out,) = onnx_mini.run_node(helper.make_node("Identity", ["s"], ["t"]), [SEQ_VALUE])
    assert isinstance(out, list) and not out[0].flags.writeable       # caller's arrays stay read-only views


def test_omitted_optional_input_in_a_dict_is_empty():
    rep = onnx_mini.prepare(passthrough_model())
    check_passthrough(list(rep.run({"seq": SEQ_VALUE})), None, None)
    with pytest.raises(InputError, match="missing input.*'seq'"):
        rep.run({"opt_t": None})


def test_sequence_outputs_are_fresh_lists_every_run():
    m = typed_model([helper.make_node("SequenceEmpty", [], ["e"])], [], [("e", SEQ_F)])
    rep = onnx_mini.prepare(m)
    first = rep.run([])[0]
    first.append(np.zeros(1, np.float32))
    assert rep.run([])[0] == []
    sess = onnx_mini.InferenceSession(m)
    sess.run(None, {})[0].append(1)
    assert sess.run(None, {})[0] == []


@pytest.mark.parametrize("feeds,pattern", [
    ([np.zeros(2, np.float32), None, None], r"'seq': expected a sequence \(seq\(tensor\(float\)\)\) given as a "
                                            r"list, got a tensor float32\[2\]"),
    ([[np.zeros(2, np.int32)], None, None], r"'seq\[0\]': expected element type float.*int32"),
    ([[np.zeros(2, np.float32), "x"], None, None], r"'seq\[1\]': .*float"),
    ([SEQ_VALUE, np.array([1, 2, 3]), None], r"'opt_t': expected rank 1|'opt_t': dimension 0 must be 2"),
    ([SEQ_VALUE, np.array([1.0, 2.0]), None], r"'opt_t': expected element type int64"),
    ([SEQ_VALUE, [np.array([1, 2])], None], r"'opt_t': expected a tensor \(tensor\(int64\)\), got a sequence"),
    ([SEQ_VALUE, None, np.zeros(2, np.float32)], r"'opt_seq': expected a sequence"),
    ([SEQ_VALUE, None, {"a": 1}], r"'opt_seq': expected a sequence.*got a map"),
])
def test_sequence_and_optional_input_errors(feeds, pattern):
    with pytest.raises(InputError, match=pattern):
        onnx_mini.prepare(passthrough_model()).run(feeds)


def test_tensor_input_given_none_or_a_list_of_arrays():
    rep = onnx_mini.prepare(model([helper.make_node("Identity", ["x"], ["y"])], [("x", F, [2])], [("y", F, [2])]))
    with pytest.raises(InputError, match="'x': expected a tensor.*got None"):
        rep.run({"x": None})
    with pytest.raises(InputError, match="'x': expected a tensor.*got a sequence"):
        rep.run({"x": [np.zeros(2, np.float32)]})


def test_positional_count_error_hints_at_sequence_inputs():
    rep = onnx_mini.prepare(typed_model([helper.make_node("Identity", ["s"], ["t"])], [("s", SEQ_F)], [("t", SEQ_F)]))
    with pytest.raises(InputError, match=r"expected 1 positional.*run\(\[\[t1, t2\]"):
        rep.run(SEQ_VALUE[:2])
    assert len(rep.run([SEQ_VALUE[:2]])[0]) == 2


def test_kernel_error_describes_sequences():
    m = typed_model([helper.make_node("SequenceAt", ["s", "p"], ["t"], name="at")],
                    [("s", SEQ_F), ("p", helper.make_tensor_type_proto(TensorProto.INT64, []))],
                    [("t", helper.make_tensor_type_proto(TensorProto.FLOAT, None))])
    with pytest.raises(KernelError, match=r"'at'.*s: sequence\[2\] of float32.*p: int64\[\]"):
        onnx_mini.prepare(m).run([SEQ_VALUE[:2], np.array(5)])


# -- sub-plans: GRAPH attributes planned once, captured outer values passed as step inputs --------

@pytest.fixture
def choose_kernel(monkeypatch):
    """A temporary If-like kernel test.subplan::Choose(cond; then_branch, else_branch, extra: GRAPHS)."""
    from onnx_mini.registry import _KERNELS, kernel
    from onnx_mini.resolve import _resolve

    calls = []
    monkeypatch.setattr(registry, "_KERNELS", dict(_KERNELS))   # the registration disappears afterwards
    _resolve.cache_clear()

    @kernel("Choose", since=1, domain="test.subplan", multi_output=False)
    def choose(*, then_branch, else_branch, extra=()):
        calls.append((then_branch, else_branch, list(extra)))
        k = then_branch.n_captures
        assert else_branch.n_captures == k and all(e.n_captures == k for e in extra)

        def run(cond, *captured):
            branch = then_branch if bool(cond) else else_branch
            (out,) = branch.run([], captured)
            for e in extra:   # each extra graph maps the result once more
                (out,) = e.run([out], captured)
            return out
        return run

    yield calls
    _resolve.cache_clear()


def choose_model(extra=None):
    then_g = helper.make_graph([helper.make_node("Add", ["a", "b"], ["r"])], "then", [],
                               [helper.make_empty_tensor_value_info("r")])
    else_g = helper.make_graph([helper.make_node("Add", ["c", "c"], ["r"])], "else", [],
                               [helper.make_empty_tensor_value_info("r")])
    attrs = {"then_branch": then_g, "else_branch": else_g}
    if extra:
        attrs["extra"] = extra
    node = helper.make_node("Choose", ["cond"], ["y"], domain="test.subplan", name="chooser", **attrs)
    return model([node], [("cond", TensorProto.BOOL, []), ("a", F, [2]), ("b", F, [2]), ("c", F, [2])],
                 [("y", F, [2])], opset=[helper.make_opsetid("", 18), helper.make_opsetid("test.subplan", 1)])


def test_subplans_read_different_outer_names(choose_kernel):
    rep = onnx_mini.prepare(choose_model())
    (then_b, else_b, _), = choose_kernel
    assert isinstance(then_b, plan_module.SubPlan) and then_b.n_captures == 3
    ins = rep.plan.infos[0].inputs                                   # captures follow the node's own inputs
    assert ins[0] == "cond" and sorted(ins[1:]) == ["a", "b", "c"]
    a, b, c = (np.array(v, np.float32) for v in ([1, 2], [10, 20], [100, 200]))
    assert rep.run([np.array(True), a, b, c])[0].tolist() == [11, 22]
    assert rep.run([np.array(False), a, b, c])[0].tolist() == [200, 400]


def test_graphs_attribute_becomes_a_list_of_subplans(choose_kernel):
    # each extra graph has an input and reads outer `a`: out -> out + a
    g = helper.make_graph([helper.make_node("Add", ["v", "a"], ["w"])], "plus_a",
                          [helper.make_empty_tensor_value_info("v")], [helper.make_empty_tensor_value_info("w")])
    rep = onnx_mini.prepare(choose_model(extra=[g, g]))
    (_, _, extra), = choose_kernel
    assert len(extra) == 2 and all(isinstance(e, plan_module.SubPlan) for e in extra)
    a, b, c = (np.array(v, np.float32) for v in ([1, 2], [10, 20], [100, 200]))
    assert rep.run([np.array(True), a, b, c])[0].tolist() == [13, 26]


def test_subplans_are_built_at_prepare_only(choose_kernel, monkeypatch):
    rep = onnx_mini.prepare(choose_model())
    monkeypatch.setattr(planner, "build_plan", lambda *a, **k: pytest.fail("planned at run time"))
    one = np.ones(2, np.float32)
    for cond in (True, False, True):
        rep.run([np.array(cond), one, one, one])
    assert len(choose_kernel) == 1                                   # the factory ran once


def test_body_steps_never_free_outer_values(choose_kernel):
    # the caller holds the outer values for the whole call: a body's steps leave their slots alone
    rep = onnx_mini.prepare(choose_model())
    (then_b, else_b, _), = choose_kernel
    for sub, names in ((then_b, ("a", "b")), (else_b, ("c",))):
        outer = {sub.plan.slot_names.index(n) for n in names}
        assert all(not outer & set(frees) for _, _, _, frees in sub.plan.steps)
    a, b, c = (np.array(v, np.float32) for v in ([1, 2], [10, 20], [100, 200]))
    for _ in range(2):
        assert rep.run([np.array(True), a, b, c])[0].tolist() == [11, 22]
        assert rep.run([np.array(False), a, b, c])[0].tolist() == [200, 400]


def test_node_with_captures_is_never_folded(choose_kernel):
    # every input of the node is an initializer, but the branches read the outer `x`: run-time only
    then_g = helper.make_graph([helper.make_node("Add", ["x", "x"], ["r"])], "then", [],
                               [helper.make_empty_tensor_value_info("r")])
    node = helper.make_node("Choose", ["cond"], ["y"], domain="test.subplan", then_branch=then_g, else_branch=then_g)
    cond = numpy_helper.from_array(np.array(True), "cond")
    m = model([node], [("x", F, [2])], [("y", F, [2])], [cond],
              opset=[helper.make_opsetid("", 18), helper.make_opsetid("test.subplan", 1)])
    rep = onnx_mini.prepare(m)
    assert [i.op_type for i in rep.plan.infos] == ["Choose"]
    assert rep.run([np.array([1, 2], np.float32)])[0].tolist() == [2, 4]
    assert rep.run([np.array([5, 6], np.float32)])[0].tolist() == [10, 12]


def test_free_names_and_captures_of_nested_subgraphs():
    inner = helper.make_graph([helper.make_node("Add", ["v", "outer_k"], ["w"])], "inner",
                              [helper.make_empty_tensor_value_info("v")], [helper.make_empty_tensor_value_info("w")])
    body = helper.make_graph([helper.make_node("SequenceMap", ["s"], ["t"], body=inner),
                              helper.make_node("Identity", ["mid"], ["m2"])], "body",
                             [helper.make_empty_tensor_value_info("s")], [helper.make_empty_tensor_value_info("t")])
    node = helper.make_node("SequenceMap", ["seq"], ["out"], body=body)
    parsed = onnx_mini.loader.parse_node(node)
    assert set(parsed.captures) == {"outer_k", "mid"}
    assert set(free_names(parsed.attrs["body"])) == {"outer_k", "mid"}


def test_run_node_tells_sequences_from_nested_number_lists():
    (n,) = onnx_mini.run_node(helper.make_node("SequenceLength", ["s"], ["n"]), [[]])
    assert n.tolist() == 0
    (y,) = onnx_mini.run_node(helper.make_node("Shape", ["x"], ["y"]), [[[1, 2, 3], [4, 5, 6]]])
    assert y.tolist() == [2, 3]


def test_function_body_gets_the_schema_default_of_an_omitted_attribute(monkeypatch):
    # MeanVarianceNormalization's body reads @axes; a caller without `axes` means the schema default
    # [0, 2, 3], which only the schema (not the body's FunctionProto) knows.
    catalog.load_all_ops()
    monkeypatch.delitem(registry._KERNELS, ("", "MeanVarianceNormalization", 13), raising=False)
    resolve_module._resolve.cache_clear()
    try:
        x = np.arange(24, dtype=np.float32).reshape(2, 3, 2, 2) ** 2
        rep = onnx_mini.prepare(model([helper.make_node("MeanVarianceNormalization", ["x"], ["y"])],
                                      [("x", F, [2, 3, 2, 2])], [("y", F, None)], opset=18))
        assert "MeanVarianceNormalization" not in [i.op_type for i in rep.plan.infos]
        mean = x.mean(axis=(0, 2, 3), keepdims=True)
        std = np.sqrt((x ** 2).mean(axis=(0, 2, 3), keepdims=True) - mean ** 2)
        np.testing.assert_allclose(rep.run([x])[0], (x - mean) / (std + 1e-9), rtol=1e-4)
    finally:
        resolve_module._resolve.cache_clear()


def test_export_outputs_hands_tensors_as_they_are_and_copies_lists_and_maps():
    from onnx_mini.inputs import export_outputs
    a, b = np.zeros(2, np.float32), np.ones(3, np.int64)
    values = [a, b]
    out = export_outputs(values)
    assert out[0] is a and out[1] is b
    shared_map, shared_seq = {1: 0.5}, [{"x": 1.0}]          # constants of a plan, shared by every run
    out = export_outputs([a, shared_seq, shared_map])
    assert out[0] is a and out[1] == [{"x": 1.0}] and out[2] == {1: 0.5}
    assert out[1] is not shared_seq and out[1][0] is not shared_seq[0] and out[2] is not shared_map
    out[1][0]["x"] = 7.0
    assert shared_seq == [{"x": 1.0}]


def test_model_limits_nest_when_a_run_keeps_the_limit_in_force():
    from onnx_mini import dtypes
    assert dtypes.enter_model_limits(None) is None           # no limit in force: nothing to undo
    dtypes.leave_model_limits(None)
    outer = dtypes.enter_model_limits(1000)
    try:
        assert dtypes.enter_model_limits(1000) is None
        inner = dtypes.enter_model_limits(None)              # a nested model without a limit lifts it
        assert inner is not None and dtypes._model_max_tensor_bytes.get() is None
        dtypes.leave_model_limits(inner)
        assert dtypes._model_max_tensor_bytes.get() == 1000
    finally:
        dtypes.leave_model_limits(outer)
    assert dtypes._model_max_tensor_bytes.get() is None
    with pytest.raises(ValueError):
        dtypes.enter_model_limits(0)


def test_fixed_shape_inputs_pass_their_quick_check_and_keep_every_error():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    s = helper.make_tensor_value_info("s", TensorProto.INT64, [])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    prepared = onnx_mini.prepare(helper.make_model(
        helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x, s], [y]),
        opset_imports=[helper.make_opsetid("", 17)]))
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    for _ in range(2):                                  # the binder is made at the first run
        (out,) = prepared.run({"x": a, "s": np.array(4, np.int64)})
        assert np.array_equal(out, a) and not out.flags.writeable and a.flags.writeable
    with pytest.raises(InputError, match=r"input 'x': dimension 1 must be 3 \(shape \[2, 3\]\), got shape \[2, 4\]"):
        prepared.run({"x": np.zeros((2, 4), np.float32), "s": np.array(4, np.int64)})
    with pytest.raises(InputError, match=r"input 's': expected rank 0 \(shape \[\]\), got shape \[1\]"):
        prepared.run([a, np.array([4], np.int64)])
    with pytest.raises(InputError, match=r"input 'x': expected element type float \(float32\), got float64"):
        prepared.run([a.astype(np.float64), np.array(4, np.int64)])
    (out,) = prepared.run([a.tolist(), 4])              # Python values still convert
    assert np.array_equal(out, a)


def test_short_run_path_keeps_limits_hooks_and_read_only_inputs():
    """PreparedModel.run's short path (one plan, no hook): the model's size limit in force, the
    caller's array left writeable; a hooked run still reports its steps."""
    from onnx_mini.errors import OnnxMiniError
    g = helper.make_graph([helper.make_node("Tile", ["X", "R"], ["Y"])], "g",
                          [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 2]),
                           helper.make_tensor_value_info("R", TensorProto.INT64, [2])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    rep = onnx_mini.prepare(model, max_tensor_bytes=64)
    assert rep._plain
    x = np.array([[1.0, 2.0]], np.float32)
    y = rep.run({"X": x, "R": np.array([2, 1], np.int64)})[0]
    np.testing.assert_array_equal(y, [[1, 2], [1, 2]])
    assert x.flags.writeable                                 # the caller's array untouched
    with pytest.raises(OnnxMiniError, match="max_tensor_bytes|limit"):   # 32 floats = 128 bytes > 64
        rep.run({"X": x, "R": np.array([16, 1], np.int64)})
    seen = []
    rep.run({"X": x, "R": np.array([1, 1], np.int64)}, hook=lambda info, i, o: seen.append(info.op_type))
    assert seen == ["Tile"]
