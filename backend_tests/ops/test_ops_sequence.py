"""Spec tests for the sequence operators: SequenceEmpty/Construct/Length/At/Insert/Erase,
SplitToSequence, ConcatFromSequence and SequenceMap (its body run as a sub-plan).

Expected values are written by hand or with a plain numpy formula transcribed from the spec.
"""
from __future__ import annotations

import re

import numpy as np
import onnx.defs
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_mini
from onnx_mini import planner
from onnx_mini.errors import InvalidNodeError, KernelError

from helpers import assert_same, elem_type, np_type, run_op, sample


def seq_types(op: str, version: int) -> list[str]:
    """Element type names of the sequence constraint (seq(tensor(x))) of op-version."""
    schema = onnx.defs.get_schema(op, version)
    assert schema.since_version == version
    for tc in schema.type_constraints:
        names = [re.fullmatch(r"seq\(tensor\((\w+)\)\)", t) for t in tc.allowed_type_strs]
        if names and all(names):
            return [m.group(1) for m in names]
    raise AssertionError(f"{op}-{version} has no sequence constraint")


def matrix(op, versions=(11,)):
    return [pytest.param(v, t, id=f"v{v}-{t}") for v in versions for t in seq_types(op, v)]


def i64(v):
    return np.array(v, dtype=np.int64)


def vinfo(name, value):
    """Declared type of a test value: a tensor, or a sequence (list) of tensors of one type."""
    if isinstance(value, list):
        return helper.make_tensor_sequence_value_info(name, elem_type(value[0].dtype) if value else TensorProto.FLOAT,
                                                      None)
    return helper.make_tensor_value_info(name, elem_type(value.dtype), value.shape)


def run_graph(nodes, inputs: dict, outputs, opset=17, initializers=()):
    """Run nodes on named inputs; outputs: names (undeclared types). Returns the list of outputs."""
    graph = helper.make_graph(nodes, "g", [vinfo(k, v) for k, v in inputs.items()],
                              [helper.make_empty_tensor_value_info(o) for o in outputs], list(initializers))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    return list(onnx_mini.prepare(m).run(inputs))


def op(name, ins, outs=("out",), **attrs):
    return helper.make_node(name, list(ins), list(outs), name=f"my_{name}", **attrs)


# -- SequenceEmpty / SequenceConstruct / SequenceLength ------------------------------------------

@pytest.mark.parametrize("version,tname", matrix("SequenceEmpty"))
def test_sequence_empty_every_dtype(version, tname):
    dtype = getattr(TensorProto, tname.upper())
    (out, n) = run_graph([op("SequenceEmpty", [], ["s"], dtype=dtype), op("SequenceLength", ["s"], ["n"])], {},
                         ["s", "n"])
    assert out == [] and isinstance(out, list)
    assert_same(n, i64(0))


def test_sequence_empty_default_and_bad_dtype():
    assert run_graph([op("SequenceEmpty", [], ["s"])], {}, ["s"]) == [[]]
    for bad in (TensorProto.BFLOAT16, 999):   # bfloat16 is not in SequenceEmpty-11's list
        with pytest.raises(InvalidNodeError, match="my_SequenceEmpty.*dtype"):
            run_graph([op("SequenceEmpty", [], ["s"], dtype=bad)], {}, ["s"])


def test_sequence_empty_result_is_not_shared_between_runs():
    m = helper.make_model(helper.make_graph([op("SequenceEmpty", [], ["s"])], "g", [],
                                            [helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, None)]),
                          opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    rep = onnx_mini.prepare(m)
    first = rep.run([])[0]
    first.append(np.zeros(1, np.float32))   # the caller may modify what it got back
    assert rep.run([])[0] == []


@pytest.mark.parametrize("version,tname", [pytest.param(11, t, id=t) for t in seq_types("SequenceConstruct", 11)])
def test_sequence_construct_and_length_every_type(version, tname):
    a, b, c = sample(tname, (2, 3)), sample(tname, (0,)), sample(tname, ())
    seq, n = run_graph([op("SequenceConstruct", ["a", "b", "c"], ["s"]), op("SequenceLength", ["s"], ["n"])],
                       {"a": a, "b": b, "c": c}, ["s", "n"], opset=version)
    assert_same(seq, [sample(tname, (2, 3)), sample(tname, (0,)), sample(tname, ())])
    assert_same(n, i64(3))


def test_sequence_construct_rejects_mixed_types():
    with pytest.raises(KernelError, match="my_SequenceConstruct.*one element type.*float32.*int64"):
        run_graph([op("SequenceConstruct", ["a", "b"], ["s"])],
                  {"a": np.zeros(2, np.float32), "b": np.zeros(2, np.int64)}, ["s"])


@pytest.mark.parametrize("version,tname", matrix("SequenceLength"))
def test_sequence_length_every_type(version, tname):
    assert_same(run_op("SequenceLength", version, [[sample(tname, (2,)), sample(tname, (1, 4))]]), i64(2))


# -- SequenceAt / SequenceInsert / SequenceErase -------------------------------------------------

SEQ = [np.array([1, 2, 3]), np.array([4]), np.array([[5, 6]])]


@pytest.mark.parametrize("version,tname", matrix("SequenceAt"))
def test_sequence_at_every_type(version, tname):
    seq = [sample(tname, (2,)), sample(tname, (3, 1)), sample(tname, ())]
    for pos, k in ((0, 0), (1, 1), (2, 2), (-1, 2), (-3, 0)):
        for idt in (np.int32, np.int64):
            assert_same(run_op("SequenceAt", version, [seq, np.array(pos, idt)]), seq[k])


@pytest.mark.parametrize("pos", [3, -4, 100])
def test_sequence_at_out_of_range(pos):
    with pytest.raises(KernelError, match=rf"position {pos} is out of range \[-3, 2\]"):
        run_op("SequenceAt", 11, [SEQ, i64(pos)])


def test_sequence_at_position_must_be_a_scalar_integer():
    with pytest.raises(KernelError, match="position must be an int32/int64 scalar"):
        run_op("SequenceAt", 11, [SEQ, i64([0, 1])])
    with pytest.raises(KernelError, match="position must be an int32/int64 scalar"):
        run_op("SequenceAt", 11, [SEQ, np.array(0.0, np.float32)])
    assert_same(run_op("SequenceAt", 11, [SEQ, i64([1])]), SEQ[1])   # one-element tensors are accepted


@pytest.mark.parametrize("version,tname", matrix("SequenceInsert"))
def test_sequence_insert_every_type(version, tname):
    a, b, t = sample(tname, (2,)), sample(tname, (1, 2)), sample(tname, (3,))
    assert_same(run_op("SequenceInsert", version, [[a, b], t]), [a, b, t])           # default: at the back
    assert_same(run_op("SequenceInsert", version, [[a, b], t, np.array(0, np.int32)]), [t, a, b])


@pytest.mark.parametrize("pos,order", [(0, "tabc"), (1, "atbc"), (3, "abct"), (-1, "abtc"), (-3, "tabc"),
                                       (2, "abtc")])
def test_sequence_insert_positions(pos, order):
    items = {"a": np.array([1]), "b": np.array([2]), "c": np.array([3]), "t": np.array([9])}
    out = run_op("SequenceInsert", 11, [[items["a"], items["b"], items["c"]], items["t"], i64(pos)])
    assert_same(out, [items[k] for k in order])


def test_sequence_insert_errors():
    for pos in (4, -4):
        with pytest.raises(KernelError, match=rf"position {pos} is out of range \[-3, 3\]"):
            run_op("SequenceInsert", 11, [SEQ, np.array([7]), i64(pos)])
    with pytest.raises(KernelError, match="float32 tensor cannot join a sequence of int64"):
        run_op("SequenceInsert", 11, [SEQ, np.array([7], np.float32)])


def test_sequence_insert_into_empty_sequence_and_input_untouched():
    t = np.array([1.5], np.float32)
    out, = run_graph([op("SequenceEmpty", [], ["e"]), op("SequenceInsert", ["e", "t"], ["s"]),
                      op("SequenceInsert", ["s", "t", "zero"], ["out"])], {"t": t}, ["out"],
                     initializers=[numpy_helper.from_array(i64(0), "zero")])
    assert_same(out, [t, t])


@pytest.mark.parametrize("version,tname", matrix("SequenceErase"))
def test_sequence_erase_every_type(version, tname):
    a, b, c = sample(tname, (2,)), sample(tname, (1,)), sample(tname, (0,))
    assert_same(run_op("SequenceErase", version, [[a, b, c]]), [a, b])       # default: the last one
    assert_same(run_op("SequenceErase", version, [[a, b, c], np.array(-3, np.int32)]), [b, c])


@pytest.mark.parametrize("pos,left", [(0, "bc"), (1, "ac"), (2, "ab"), (-1, "ab"), (-2, "ac"), (-3, "bc")])
def test_sequence_erase_positions(pos, left):
    items = {"a": np.array([1]), "b": np.array([2]), "c": np.array([3])}
    out = run_op("SequenceErase", 11, [[items["a"], items["b"], items["c"]], i64(pos)])
    assert_same(out, [items[k] for k in left])


def test_sequence_erase_errors():
    for pos in (3, -4):
        with pytest.raises(KernelError, match=rf"position {pos} is out of range \[-3, 2\]"):
            run_op("SequenceErase", 11, [SEQ, i64(pos)])
    with pytest.raises(KernelError, match="my_SequenceErase.*empty sequence"):
        run_graph([op("SequenceEmpty", [], ["e"]), op("SequenceErase", ["e"], ["out"])], {}, ["out"])


# -- SplitToSequence -----------------------------------------------------------------------------

@pytest.mark.parametrize("version,tname", matrix("SplitToSequence", (11, 24)))
def test_split_to_sequence_every_type(version, tname):
    x = sample(tname, (3, 4))
    assert_same(run_op("SplitToSequence", version, [x], axis=1), [x[:, k:k + 1] for k in range(4)])
    assert_same(run_op("SplitToSequence", version, [x, i64(3)], axis=1), [x[:, :3], x[:, 3:]])
    assert_same(run_op("SplitToSequence", version, [x, np.array([1, 2], np.int32)]), [x[:1], x[1:]])


X34 = np.arange(12, dtype=np.float32).reshape(3, 4)


@pytest.mark.parametrize("split,axis,keepdims,expected", [
    (None, 0, 1, [X34[:1], X34[1:2], X34[2:]]),
    (None, 0, 0, [X34[0], X34[1], X34[2]]),
    (None, -1, 0, [X34[:, k] for k in range(4)]),
    (None, -2, 1, [X34[k:k + 1] for k in range(3)]),
    (i64(2), 1, 1, [X34[:, :2], X34[:, 2:]]),
    (i64(3), 1, 0, [X34[:, :3], X34[:, 3:]]),          # keepdims is ignored when split is given
    (i64(5), 1, 1, [X34]),                              # one short chunk
    (i64(1), 0, 0, [X34[:1], X34[1:2], X34[2:]]),       # a given split of 1 keeps the axis
    (i64([1, 0, 3]), -1, 1, [X34[:, :1], X34[:, 1:1], X34[:, 1:]]),   # zero-length part
    (i64([3]), 0, 1, [X34]),
    (np.array([2, 2], np.int32), 1, 1, [X34[:, :2], X34[:, 2:]]),
])
def test_split_to_sequence_cases(split, axis, keepdims, expected):
    ins = [X34] if split is None else [X34, split]
    assert_same(run_op("SplitToSequence", 24, ins, axis=axis, keepdims=keepdims), expected)


def test_split_to_sequence_empty_axis_and_views():
    x = np.zeros((0, 2), np.float32)
    assert run_op("SplitToSequence", 11, [x]) == []
    assert run_op("SplitToSequence", 11, [x, i64(2)]) == []
    data = np.arange(6, dtype=np.int64)
    out = run_op("SplitToSequence", 11, [data, i64([2, 4])])
    assert all(np.shares_memory(p, data) for p in out)     # views, not copies


@pytest.mark.parametrize("split,pattern", [
    (i64([1, 1]), r"sum to 2, but the dimension being split has 3"),
    (i64([4, -1]), r"must be >= 0"),
    (i64(0), r"scalar split must be positive"),
    (i64(-2), r"scalar split must be positive"),
    (i64([[1, 2]]), r"scalar or 1-D"),
    (np.array([1.0, 2.0], np.float32), r"int32/int64"),
])
def test_split_to_sequence_bad_split(split, pattern):
    with pytest.raises(KernelError, match=pattern):
        run_op("SplitToSequence", 11, [np.zeros(3, np.float32), split])


def test_split_to_sequence_bad_axis_and_keepdims():
    with pytest.raises(KernelError, match="axis 2 is out of range"):
        run_op("SplitToSequence", 11, [X34], axis=2)
    with pytest.raises(InvalidNodeError, match="keepdims"):
        run_op("SplitToSequence", 11, [X34], keepdims=2)


# -- ConcatFromSequence --------------------------------------------------------------------------

@pytest.mark.parametrize("version,tname", matrix("ConcatFromSequence"))
def test_concat_from_sequence_every_type(version, tname):
    a, b = sample(tname, (2, 3)), sample(tname, (1, 3))
    assert_same(run_op("ConcatFromSequence", version, [[a, b]], axis=0), np.concatenate([a, b]))
    assert_same(run_op("ConcatFromSequence", version, [[a, a]], axis=1, new_axis=1), np.stack([a, a], 1))


A = np.arange(6, dtype=np.float32).reshape(2, 3)
B = np.arange(6, 12, dtype=np.float32).reshape(2, 3)


@pytest.mark.parametrize("axis,new_axis,expected", [
    (0, 0, [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]),
    (1, 0, [[0, 1, 2, 6, 7, 8], [3, 4, 5, 9, 10, 11]]),
    (-1, 0, [[0, 1, 2, 6, 7, 8], [3, 4, 5, 9, 10, 11]]),
    (-2, 0, [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]),
    (0, 1, [[[0, 1, 2], [3, 4, 5]], [[6, 7, 8], [9, 10, 11]]]),
    (2, 1, [[[0, 6], [1, 7], [2, 8]], [[3, 9], [4, 10], [5, 11]]]),          # new last axis
    (-1, 1, [[[0, 6], [1, 7], [2, 8]], [[3, 9], [4, 10], [5, 11]]]),
    (-3, 1, [[[0, 1, 2], [3, 4, 5]], [[6, 7, 8], [9, 10, 11]]]),
    (1, 1, [[[0, 1, 2], [6, 7, 8]], [[3, 4, 5], [9, 10, 11]]]),
])
def test_concat_from_sequence_axes(axis, new_axis, expected):
    out = run_op("ConcatFromSequence", 11, [[A, B]], axis=axis, new_axis=new_axis)
    assert_same(out, np.array(expected, np.float32))


def test_concat_from_sequence_scalars_and_single():
    s = [np.array(1, np.int32), np.array(2, np.int32)]
    assert_same(run_op("ConcatFromSequence", 11, [s], axis=0, new_axis=1), np.array([1, 2], np.int32))
    assert_same(run_op("ConcatFromSequence", 11, [[A]], axis=1), A)


@pytest.mark.parametrize("seq,attrs,pattern", [
    ([A, B], {"axis": 2}, r"axis 2 is out of range for a tensor of rank 2 \(accepted: \[-2, 1\]\)"),
    ([A, B], {"axis": 3, "new_axis": 1}, r"accepted: \[-3, 2\]"),
    ([A, B[:, :2]], {"axis": 0}, r"differ outside axis 0"),
    ([A, B[:1]], {"axis": 0, "new_axis": 1}, r"shapes must be equal"),
    ([A, B.reshape(2, 3, 1)], {"axis": 0}, r"differ outside axis"),
    ([np.array(1.0, np.float32)], {"axis": 0}, r"rank 0"),
])
def test_concat_from_sequence_errors(seq, attrs, pattern):
    with pytest.raises(KernelError, match=pattern):
        run_op("ConcatFromSequence", 11, [seq], **attrs)


def test_concat_from_sequence_mixed_types_through_run_node():
    # run_node declares no types, so a mixed sequence reaches the kernel
    node = op("ConcatFromSequence", ["s"], axis=0)
    with pytest.raises(KernelError, match="my_ConcatFromSequence.*one element type.*float32.*float64"):
        onnx_mini.run_node(node, [[A, B.astype(np.float64)]])
    assert_same(onnx_mini.run_node(node, [(A, B)])[0], np.concatenate([A, B]))   # a tuple is a sequence too


def test_concat_from_sequence_empty_and_bad_attributes():
    with pytest.raises(KernelError, match="input sequence is empty"):
        run_graph([op("SequenceEmpty", [], ["e"]), op("ConcatFromSequence", ["e"], ["out"], axis=0)], {}, ["out"])
    with pytest.raises(InvalidNodeError, match="'axis'"):
        run_op("ConcatFromSequence", 11, [[A]])
    with pytest.raises(InvalidNodeError, match="new_axis"):
        run_op("ConcatFromSequence", 11, [[A]], axis=0, new_axis=2)


# -- SequenceMap ---------------------------------------------------------------------------------

def body(nodes, inputs, outputs, initializers=()):
    return helper.make_graph(nodes, "body", [helper.make_empty_tensor_value_info(n) for n in inputs],
                             [helper.make_empty_tensor_value_info(n) for n in outputs], list(initializers))


@pytest.mark.parametrize("version,tname", matrix("SequenceMap", (17,)))
def test_sequence_map_every_type(version, tname):
    seq = [sample(tname, (2,)), sample(tname, (3, 1))]
    b = body([helper.make_node("Identity", ["x"], ["y"]), helper.make_node("Shape", ["x"], ["s"])], ["x"], ["y", "s"])
    ys, shapes = run_graph([op("SequenceMap", ["seq"], ["ys", "shapes"], body=b)], {"seq": seq}, ["ys", "shapes"],
                           opset=version)
    assert_same(ys, seq)
    assert_same(shapes, [i64([2]), i64([3, 1])])


def test_sequence_map_several_inputs_and_outputs():
    s1 = [np.array([1, 2], np.int64), np.array([3], np.int64), np.array([], np.int64)]
    s2 = [np.array([10, 20], np.int64), np.array([30], np.int64), np.array([], np.int64)]
    t = np.array(100, np.int64)
    b = body([helper.make_node("Add", ["a", "b"], ["ab"]), helper.make_node("Add", ["ab", "c"], ["abc"])],
             ["a", "b", "c"], ["ab", "abc"])
    ab, abc = run_graph([op("SequenceMap", ["s1", "s2", "t"], ["ab", "abc"], body=b)],
                        {"s1": s1, "s2": s2, "t": t}, ["ab", "abc"])
    assert_same(ab, [i64([11, 22]), i64([33]), i64([])])
    assert_same(abc, [i64([111, 122]), i64([133]), i64([])])


def test_sequence_map_reads_outer_scope_values():
    # The body adds `offset` (a graph input) and `scale` (an initializer of the main graph), and has its
    # own initializer `one`: y = (x + offset) + scale + one.
    seq = [np.array([1.0, 2.0], np.float32), np.array([5.0], np.float32)]
    one = numpy_helper.from_array(np.array(1.0, np.float32), "one")
    b = body([helper.make_node("Add", ["x", "offset"], ["t"]), helper.make_node("Add", ["t", "scale"], ["u"]),
              helper.make_node("Add", ["u", "one"], ["y"])], ["x"], ["y"], [one])
    scale = numpy_helper.from_array(np.array(100.0, np.float32), "scale")
    for offset in (0.5, -3.0):
        (ys,) = run_graph([op("SequenceMap", ["seq"], ["ys"], body=b)],
                          {"seq": seq, "offset": np.array(offset, np.float32)}, ["ys"], initializers=[scale])
        assert_same(ys, [np.array([1 + offset + 101, 2 + offset + 101], np.float32),
                         np.array([5 + offset + 101], np.float32)])


def test_sequence_map_with_constant_inputs_is_not_folded_when_it_captures():
    # Everything but the captured `x` is constant: the node must run at run time, with each run's x.
    c = numpy_helper.from_array(np.array([1, 2], np.int64), "c")
    b = body([helper.make_node("Add", ["e", "x"], ["y"])], ["e"], ["y"])
    nodes = [op("SequenceConstruct", ["c", "c"], ["seq"]), op("SequenceMap", ["seq"], ["out"], body=b)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.INT64, [])],
                          [helper.make_tensor_sequence_value_info("out", TensorProto.INT64, None)], [c])
    rep = onnx_mini.prepare(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10))
    assert [i.op_type for i in rep.plan.infos] == ["SequenceMap"]         # SequenceConstruct folded
    assert_same(rep.run([i64(10)])[0], [i64([11, 12])] * 2)
    assert_same(rep.run([i64(-1)])[0], [i64([0, 1])] * 2)


def test_sequence_map_nested_reads_the_outermost_scope():
    # outer SequenceMap over a sequence of sequences is not allowed (S is seq(tensor)), so nest through the
    # body: the inner SequenceMap splits each element into a sequence and adds the outermost `k`.
    inner = body([helper.make_node("Add", ["v", "k"], ["w"])], ["v"], ["w"])
    outer = body([helper.make_node("SplitToSequence", ["x"], ["parts"], axis=0, keepdims=0),
                  helper.make_node("SequenceMap", ["parts"], ["added"], body=inner, name="inner_map"),
                  helper.make_node("ConcatFromSequence", ["added"], ["y"], axis=0, new_axis=1)], ["x"], ["y"])
    seq = [i64([1, 2, 3]), i64([4])]
    (ys,) = run_graph([op("SequenceMap", ["seq"], ["ys"], body=outer)], {"seq": seq, "k": i64(1000)}, ["ys"])
    assert_same(ys, [i64([1001, 1002, 1003]), i64([1004])])


def test_sequence_map_body_is_planned_once(monkeypatch):
    b = body([helper.make_node("Add", ["x", "x"], ["y"])], ["x"], ["y"])
    g = helper.make_graph([op("SequenceMap", ["seq"], ["out"], body=b)], "g",
                          [helper.make_tensor_sequence_value_info("seq", TensorProto.INT64, None)],
                          [helper.make_tensor_sequence_value_info("out", TensorProto.INT64, None)])
    rep = onnx_mini.prepare(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10))

    def no_planning(*a, **k):
        raise AssertionError("planned at run time")
    monkeypatch.setattr(planner, "build_plan", no_planning)
    for _ in range(2):
        assert_same(rep.run([[i64([1, 2]), i64([3])]])[0], [i64([2, 4]), i64([6])])


def test_sequence_map_empty_sequence_gives_empty_outputs():
    b = body([helper.make_node("Identity", ["x"], ["y"])], ["x"], ["y"])
    out, = run_graph([op("SequenceEmpty", [], ["e"]), op("SequenceMap", ["e"], ["out"], body=b)], {}, ["out"])
    assert out == []


def test_sequence_map_errors():
    b2 = body([helper.make_node("Add", ["a", "b"], ["y"])], ["a", "b"], ["y"])
    s = [i64([1]), i64([2])]
    with pytest.raises(KernelError, match=r"my_SequenceMap.*input 1 is a sequence of 1 tensor\(s\), the first input has 2"):
        run_graph([op("SequenceMap", ["s", "t"], ["out"], body=b2)], {"s": s, "t": [i64([1])]}, ["out"])
    with pytest.raises(InvalidNodeError, match="body takes 2 input.*node has 1"):
        run_graph([op("SequenceMap", ["s"], ["out"], body=b2)], {"s": s}, ["out"])
    with pytest.raises(InvalidNodeError, match="body has 1 output.*node has 2"):
        run_graph([op("SequenceMap", ["s", "s"], ["o1", "o2"], body=b2)], {"s": s}, ["o1", "o2"])


def test_sequence_map_error_inside_body_names_both_nodes():
    b = body([helper.make_node("Reshape", ["x", "shape"], ["y"], name="inner_reshape")], ["x"], ["y"],
             [numpy_helper.from_array(i64([4]), "shape")])
    with pytest.raises(KernelError) as e:
        run_graph([op("SequenceMap", ["s"], ["out"], body=b)], {"s": [i64([1, 2, 3, 4]), i64([1])]}, ["out"])
    assert "my_SequenceMap" in str(e.value) and "inner_reshape" in str(e.value)


def test_sequence_map_body_problems_are_reported_at_prepare():
    b = body([helper.make_node("NoSuchOp", ["x"], ["y"], name="ghost")], ["x"], ["y"])
    with pytest.raises(onnx_mini.errors.UnsupportedOperatorError, match="ghost.*subgraph 'body' of node 'my_SequenceMap'"):
        run_graph([op("SequenceMap", ["s"], ["out"], body=b)], {"s": [i64([1])]}, ["out"])
    b = body([helper.make_node("Add", ["x", "nowhere"], ["y"])], ["x"], ["y"])
    with pytest.raises(onnx_mini.errors.GraphError, match="'nowhere'.*my_SequenceMap"):
        run_graph([op("SequenceMap", ["s"], ["out"], body=b)], {"s": [i64([1])]}, ["out"])
