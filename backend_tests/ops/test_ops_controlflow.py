"""Spec tests for control flow: If, Loop, Scan (every version), with bodies built by hand.

Expected values are hand-computed or written as the plain Python loop the spec's pseudo-code describes.
"""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_mini
from onnx_mini.errors import InvalidNodeError, KernelError
from onnx_mini.plan import SubPlan

from helpers import NODE, assert_same, elem_type, i64, raises_naming_node, sample, type_params, versions

IF_VERSIONS = versions("If")
LOOP_VERSIONS = versions("Loop")
SCAN_VERSIONS = versions("Scan")
F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def f32(values) -> np.ndarray:
    return np.array(values, np.float32)


def vinfo(name: str, value=None, elem=None, shape=None):
    """A declared value: from a sample value (tensor or sequence), or an element type and shape."""
    if isinstance(value, list):
        return helper.make_tensor_sequence_value_info(name, elem_type(value[0].dtype) if value else F, None)
    if value is not None:
        return helper.make_tensor_value_info(name, elem_type(value.dtype), value.shape)
    if elem is None:
        return helper.make_empty_tensor_value_info(name)
    return helper.make_tensor_value_info(name, elem, shape)


def graph(nodes, inputs, outputs, name="body", initializers=()):
    """A body graph: inputs/outputs are names (undeclared types) or ValueInfoProtos."""
    def vi(x):
        return vinfo(x) if isinstance(x, str) else x
    return helper.make_graph(nodes, name, [vi(x) for x in inputs], [vi(x) for x in outputs], list(initializers))


def node(op, ins, outs, name=NODE, **attrs):
    return helper.make_node(op, list(ins), list(outs), name=name, **attrs)


def const(name, value):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value)))


def run_graph(nodes, inputs: dict, outputs, opset, initializers=()):
    """Run nodes on named inputs (tensors or sequences); outputs are names. Returns the outputs' list."""
    g = helper.make_graph(nodes, "g", [vinfo(k, v) for k, v in inputs.items()],
                          [helper.make_empty_tensor_value_info(o) for o in outputs], list(initializers))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    return list(onnx_mini.prepare(m).run(inputs))


# -- If ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("version,tname", [p for p in type_params("If", IF_VERSIONS, "V")])
def test_if_every_type(version, tname):
    x, y = sample(tname, (2, 3)), sample(tname, (4,))
    then_g = graph([node("Identity", ["x"], ["t"], name="t")], [], ["t"])   # reads x from the outer graph
    else_g = graph([node("Identity", ["y"], ["e"], name="e")], [], ["e"])   # another shape: allowed
    for c, expected in ((True, x), (False, y)):
        out, = run_graph([node("If", ["c"], ["out"], then_branch=then_g, else_branch=else_g)],
                         {"c": np.array(c), "x": x, "y": y}, ["out"], version)
        assert_same(out, expected)


@pytest.mark.parametrize("version", IF_VERSIONS)
def test_if_several_outputs_cond_of_one_element(version):
    then_g = graph([node("Add", ["x", "x"], ["a"], name="a"), node("Neg", ["x"], ["b"], name="b")], [], ["a", "b"])
    else_g = graph([const("a", f32([7])), node("Identity", ["x"], ["b"], name="b")], [], ["a", "b"])
    x = f32([1, 2])
    for c, exp in ((np.array([True]), (f32([2, 4]), f32([-1, -2]))), (np.array([[False]]), (f32([7]), x))):
        a, b = run_graph([node("If", ["c"], ["a", "b"], then_branch=then_g, else_branch=else_g)],
                         {"c": c, "x": x}, ["a", "b"], version)
        assert_same(a, exp[0])
        assert_same(b, exp[1])


@pytest.mark.parametrize("version", [v for v in IF_VERSIONS if v >= 13])
def test_if_sequence_outputs(version):
    then_g = graph([node("SequenceConstruct", ["x", "x"], ["s"], name="s")], [], ["s"])
    else_g = graph([node("SequenceEmpty", [], ["s"], name="s", dtype=F)], [], ["s"])
    x = f32([1, 2])
    out, = run_graph([node("If", ["c"], ["out"], then_branch=then_g, else_branch=else_g)],
                     {"c": np.array(True), "x": x}, ["out"], version)
    assert_same(out, [x, x])
    out, = run_graph([node("If", ["c"], ["out"], then_branch=then_g, else_branch=else_g)],
                     {"c": np.array(False), "x": x}, ["out"], version)
    assert out == []


@pytest.mark.parametrize("version", [v for v in IF_VERSIONS if v >= 16])
def test_if_optional_outputs(version):
    then_g = graph([node("Optional", ["x"], ["o"], name="o")], [], ["o"])
    else_g = graph([node("Optional", [], ["o"], name="o", type=helper.make_tensor_type_proto(F, None))], [], ["o"])
    x = f32([3])
    nodes = [node("If", ["c"], ["opt"], then_branch=then_g, else_branch=else_g),
             node("OptionalHasElement", ["opt"], ["has"], name="has")]
    opt, has = run_graph(nodes, {"c": np.array(True), "x": x}, ["opt", "has"], version)
    assert_same(opt, x)
    assert_same(has, np.array(True))
    opt, has = run_graph(nodes, {"c": np.array(False), "x": x}, ["opt", "has"], version)
    assert opt is None
    assert_same(has, np.array(False))


def test_if_errors():
    then_g = graph([const("t", f32([1]))], [], ["t"])
    else_g = graph([const("e", f32([2]))], [], ["e"])
    for bad, pattern in ((np.array(1, np.int64), "cond must be a bool tensor"),
                         (np.array([True, False]), "cond must hold exactly one element"),
                         (np.zeros((0,), bool), "exactly one element")):
        with raises_naming_node(KernelError, pattern):
            run_graph([node("If", ["c"], ["out"], then_branch=then_g, else_branch=else_g)], {"c": bad}, ["out"], 21)
    two = graph([const("a", f32([1])), const("b", f32([2]))], [], ["a", "b"])
    with raises_naming_node(InvalidNodeError, "else_branch has 2 output"):
        run_graph([node("If", ["c"], ["out"], then_branch=then_g, else_branch=two)],
                  {"c": np.array(True)}, ["out"], 21)


def test_if_error_inside_branch_names_both_nodes():
    then_g = graph([node("Reshape", ["x", "shape"], ["t"], name="inner_reshape")], [], ["t"],
                   initializers=[numpy_helper.from_array(i64([5]), "shape")])
    else_g = graph([const("e", f32([2]))], [], ["e"])
    with pytest.raises(KernelError) as e:
        run_graph([node("If", ["c"], ["out"], then_branch=then_g, else_branch=else_g)],
                  {"c": np.array(True), "x": f32([1, 2])}, ["out"], 21)
    assert NODE in str(e.value) and "inner_reshape" in str(e.value)


# -- Loop ----------------------------------------------------------------------------------------------

def loop_body(nodes, carried=(), scans=(), cond_out="cond_out", extra_inputs=("i", "cond_in")):
    """Body inputs (i, cond_in, *carried_in), outputs (cond_out, *carried_out, *scans)."""
    return graph(nodes, [*extra_inputs, *[f"{c}_in" for c in carried]],
                 [cond_out, *[f"{c}_out" for c in carried], *scans])


def counting_body(stop_at=None):
    """acc_out = acc_in + i; scan = i * 10; cond_out = cond_in (or i < stop_at)."""
    nodes = [node("Add", ["acc_in", "i"], ["acc_out"], name="add"),
             const("ten", i64(10)), node("Mul", ["i", "ten"], ["scan"], name="mul")]
    if stop_at is None:
        nodes.append(node("Identity", ["cond_in"], ["cond_out"], name="cond"))
    else:
        nodes += [const("stop", i64(stop_at)), node("Less", ["i", "stop"], ["cond_out"], name="cond")]
    return loop_body(nodes, ["acc"], ["scan"])


def run_loop(body, m, cond, acc, version, n_out=2):
    inputs = {"acc": acc}
    names = ["", "", "acc"]
    if m is not None:
        inputs["M"], names[0] = i64(m), "M"
    if cond is not None:
        inputs["cond"], names[1] = np.array(cond), "cond"
    outs = ["acc_final", "scan_all"][:n_out]
    return run_graph([node("Loop", names, outs, body=body)], inputs, outs, version)


@pytest.mark.parametrize("version", LOOP_VERSIONS)
def test_loop_trip_count_only(version):  # for (i = 0; i < M; ++i)
    acc, scan = run_loop(counting_body(), 4, None, i64(100), version)
    assert_same(acc, i64(100 + 0 + 1 + 2 + 3))
    assert_same(scan, i64([0, 10, 20, 30]))


@pytest.mark.parametrize("version", LOOP_VERSIONS)
def test_loop_cond_only(version):  # while (cond): doubles x while it stays below 100
    body = loop_body([node("Add", ["x_in", "x_in"], ["x_out"], name="dbl"), const("lim", f32(100)),
                      node("Less", ["x_out", "lim"], ["cond_out"], name="less")], ["x"])
    x, = run_graph([node("Loop", ["", "c", "x"], ["x_final"], body=body)],
                   {"c": np.array(True), "x": f32(3)}, ["x_final"], version)
    assert_same(x, f32(192))       # 3 6 12 24 48 96 192: the body ran 6 times
    x, = run_graph([node("Loop", ["", "c", "x"], ["x_final"], body=body)],
                   {"c": np.array(False), "x": f32(3)}, ["x_final"], version)
    assert_same(x, f32(3))         # cond false on entry: the body never runs


@pytest.mark.parametrize("version", LOOP_VERSIONS)
def test_loop_trip_count_and_cond(version):
    acc, scan = run_loop(counting_body(stop_at=2), 10, True, i64(0), version)   # stops after i == 2
    assert_same(acc, i64(0 + 1 + 2))
    assert_same(scan, i64([0, 10, 20]))
    acc, scan = run_loop(counting_body(stop_at=20), 3, True, i64(0), version)   # M ends it first
    assert_same(acc, i64(3))
    assert_same(scan, i64([0, 10, 20]))


@pytest.mark.parametrize("version", LOOP_VERSIONS)
def test_loop_neither_breaks_on_body_cond(version):
    acc, scan = run_loop(counting_body(stop_at=4), None, None, i64(0), version)
    assert_same(acc, i64(0 + 1 + 2 + 3 + 4))
    assert_same(scan, i64([0, 10, 20, 30, 40]))


@pytest.mark.parametrize("version", LOOP_VERSIONS)
@pytest.mark.parametrize("m,cond", [(0, None), (-3, True), (5, False)])
def test_loop_zero_iterations(version, m, cond):
    declared = graph(counting_body().node, ["i", "cond_in", "acc_in"],
                     ["cond_out", "acc_out", vinfo("scan", elem=I64, shape=[2, "n", 3])])
    acc, scan = run_loop(declared, m, cond, i64([5]), version)
    assert_same(acc, i64([5]))
    assert_same(scan, np.zeros((0, 2, 0, 3), np.int64))   # the symbolic dim counts as 0
    acc, scan = run_loop(counting_body(), m, cond, i64([5]), version)
    assert_same(scan, np.zeros((0,), np.float32))         # undeclared body output type: float32[0]


@pytest.mark.parametrize("version,tname", type_params("Loop", LOOP_VERSIONS, "V"))
def test_loop_every_type(version, tname):
    x = sample(tname, (2, 3))
    body = loop_body([node("Identity", ["v_in"], ["v_out"], name="id"), node("Identity", ["v_in"], ["s"], name="s"),
                      node("Identity", ["cond_in"], ["cond_out"], name="c")], ["v"], ["s"])
    v, s = run_graph([node("Loop", ["M", "", "v"], ["v_final", "s_all"], body=body)],
                     {"M": i64(2), "v": x}, ["v_final", "s_all"], version)
    assert_same(v, x)
    assert_same(s, np.stack([x, x]))


@pytest.mark.parametrize("version", [v for v in LOOP_VERSIONS if v >= 13])
def test_loop_carried_sequence(version):
    body = loop_body([node("SequenceInsert", ["seq_in", "i"], ["seq_out"], name="ins"),
                      node("Identity", ["cond_in"], ["cond_out"], name="c")], ["seq"])
    seq, = run_graph([node("SequenceEmpty", [], ["empty"], name="e", dtype=I64),
                      node("Loop", ["M", "", "empty"], ["seq"], body=body)], {"M": i64(3)}, ["seq"], version)
    assert_same(seq, [i64(0), i64(1), i64(2)])


@pytest.mark.parametrize("version", [v for v in LOOP_VERSIONS if v >= 16])
def test_loop_carried_optional(version):
    # starts empty; each iteration wraps i: the final optional holds the last i
    body = loop_body([node("Optional", ["i"], ["opt_out"], name="wrap"),
                      node("OptionalHasElement", ["opt_in"], ["had"], name="had"),
                      node("Identity", ["cond_in"], ["cond_out"], name="c")], ["opt"], ["had"])
    empty = node("Optional", [], ["none"], name="none", type=helper.make_tensor_type_proto(I64, []))
    opt, had = run_graph([empty, node("Loop", ["M", "", "none"], ["opt", "had"], body=body)],
                         {"M": i64(3)}, ["opt", "had"], version)
    assert_same(opt, i64(2))
    assert_same(had, np.array([False, True, True]))


@pytest.mark.parametrize("version", LOOP_VERSIONS)
def test_loop_reads_outer_values(version):
    body = loop_body([node("Add", ["x_in", "step"], ["x_out"], name="add"),
                      node("Mul", ["x_out", "scale"], ["y"], name="mul"),
                      node("Identity", ["cond_in"], ["cond_out"], name="c")], ["x"], ["y"])
    x, y = run_graph([node("Loop", ["M", "", "x"], ["x_final", "ys"], body=body)],
                     {"M": i64(3), "x": f32([0, 1]), "step": f32([1, 10]), "scale": f32([2, 2])}, ["x_final", "ys"],
                     version)
    assert_same(x, f32([3, 31]))
    assert_same(y, f32([[2, 22], [4, 42], [6, 62]]))


@pytest.mark.parametrize("version", [11, 25])
def test_loop_nested_three_deep(version):
    # innermost adds a + 100*i1 + 10*i2 + i3, reading a from the main graph and i1, i2 from its parents
    def passthrough_cond():
        return node("Identity", ["cond_in"], ["cond_out"], name="c")
    inner = graph([const("c100", i64(100)), const("c10", i64(10)),
                   node("Mul", ["i1", "c100"], ["p1"], name="p1"), node("Mul", ["i2", "c10"], ["p2"], name="p2"),
                   node("Sum", ["s3_in", "a", "p1", "p2", "i3"], ["s3_out"], name="sum"), passthrough_cond()],
                  ["i3", "cond_in", "s3_in"], ["cond_out", "s3_out"])
    middle = graph([node("Loop", ["m3", "", "s2_in"], ["s2_out"], name="loop3", body=inner), passthrough_cond()],
                   ["i2", "cond_in", "s2_in"], ["cond_out", "s2_out"])
    outer = graph([node("Loop", ["m2", "", "s1_in"], ["s1_out"], name="loop2", body=middle), passthrough_cond(),
                   node("Identity", ["s1_out"], ["trace"], name="trace")],
                  ["i1", "cond_in", "s1_in"], ["cond_out", "s1_out", "trace"])
    s, trace = run_graph([node("Loop", ["m1", "", "s0"], ["s", "trace_all"], body=outer)],
                         {"m1": i64(2), "m2": i64(3), "m3": i64(4), "a": i64(1000), "s0": i64(0)},
                         ["s", "trace_all"], version)
    total, partial = 0, []
    for i1 in range(2):
        for i2 in range(3):
            for i3 in range(4):
                total += 1000 + 100 * i1 + 10 * i2 + i3
        partial.append(total)
    assert_same(s, i64(total))
    assert_same(trace, i64(partial))


def test_loop_errors():
    body = counting_body()
    with raises_naming_node(KernelError, "cond must be a bool tensor"):
        run_graph([node("Loop", ["M", "c", "acc"], ["a", "s"], body=body)],
                  {"M": i64(2), "c": i64(1), "acc": i64(0)}, ["a", "s"], 21)
    with raises_naming_node(KernelError, "M .max trip count. must be an int64 tensor"):
        run_graph([node("Loop", ["M", "", "acc"], ["a", "s"], body=body)], {"M": f32(2), "acc": i64(0)},
                  ["a", "s"], 21)
    bad_cond = loop_body([node("Identity", ["acc_in"], ["acc_out"], name="id"),
                          node("Identity", ["i"], ["cond_out"], name="c")], ["acc"])
    with raises_naming_node(KernelError, "condition the body returns must be a bool tensor"):
        run_graph([node("Loop", ["M", "", "acc"], ["a"], body=bad_cond)], {"M": i64(2), "acc": i64(0)}, ["a"], 21)
    with raises_naming_node(InvalidNodeError, "body has 3 output.*2 expected"):
        run_graph([node("Loop", ["M", "", "acc"], ["a"], body=body)], {"M": i64(2), "acc": i64(0)}, ["a"], 21)
    with raises_naming_node(InvalidNodeError, "body takes 3 input.*4 expected"):
        run_graph([node("Loop", ["M", "", "acc", "acc"], ["a", "b", "s"], body=body)],
                  {"M": i64(2), "acc": i64(0)}, ["a", "b", "s"], 21)
    growing = loop_body([node("Concat", ["acc_in", "acc_in"], ["acc_out"], name="cat", axis=0),
                         node("Identity", ["acc_out"], ["s"], name="s"),
                         node("Identity", ["cond_in"], ["cond_out"], name="c")], ["acc"], ["s"])
    with raises_naming_node(KernelError, r"scan output 0 changes from int64\[2\] to int64\[4\]"):
        run_graph([node("Loop", ["M", "", "acc"], ["a", "s"], body=growing)], {"M": i64(2), "acc": i64([1])},
                  ["a", "s"], 21)


def test_loop_body_intermediates_are_freed():
    body = loop_body([node("Add", ["x_in", "x_in"], ["tmp"], name="tmp"), node("Neg", ["tmp"], ["x_out"], name="neg"),
                      node("Identity", ["cond_in"], ["cond_out"], name="c")], ["x"])
    g = helper.make_graph([node("Loop", ["M", "", "x"], ["y"], body=body)], "g",
                          [vinfo("M", i64(1)), vinfo("x", f32([1]))], [helper.make_empty_tensor_value_info("y")])
    rep = onnx_mini.prepare(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10))
    (fn, *_), = rep.plan.steps
    plan = next(c.cell_contents for c in fn.__closure__ if isinstance(c.cell_contents, SubPlan)).plan
    tmp = plan.slot_names.index("tmp")
    assert any(tmp in frees for *_, frees in plan.steps)
    assert_same(rep.run([i64(3), f32([1])])[0], f32([-8]))


# -- Scan 8 --------------------------------------------------------------------------------------------

def sum_body(n_scan=1):
    """state_out = state_in + sum of the elements; scan output = state_out (a running sum)."""
    xs = [f"x{j}" for j in range(n_scan)]
    return graph([node("Sum", ["s_in", *xs], ["s_out"], name="sum"), node("Identity", ["s_out"], ["y"], name="y")],
                 ["s_in", *xs], ["s_out", "y"])


def test_scan8_batches_with_sequence_lens_and_directions():
    x = f32(np.arange(1, 13).reshape(2, 3, 2))      # batch 2, sequence 3, element [2]
    init = f32(np.zeros((2, 2)))
    lens = i64([3, 2])
    for directions, expected_y in (
            ([0], [[[1, 2], [4, 6], [9, 12]], [[7, 8], [16, 18], [0, 0]]]),
            ([1], [[[5, 6], [8, 10], [9, 12]], [[9, 10], [16, 18], [0, 0]]])):
        s, y = run_graph([node("Scan", ["lens", "init", "x"], ["s", "y"], body=sum_body(), num_scan_inputs=1,
                               directions=directions)], {"lens": lens, "init": init, "x": x}, ["s", "y"], 8)
        assert_same(s, f32([[9, 12], [16, 18]]))
        assert_same(y, f32(expected_y))                   # padded with zeros past each sequence's length


def test_scan8_without_sequence_lens_two_inputs():
    x = f32(np.arange(6).reshape(1, 3, 2))
    s, y = run_graph([node("Scan", ["", "init", "x", "x"], ["s", "y"], body=sum_body(2), num_scan_inputs=2,
                           directions=[0, 1])], {"init": f32([[0, 0]]), "x": x}, ["s", "y"], 8)
    # forward elements [0 1] [2 3] [4 5] plus backward [4 5] [2 3] [0 1]
    assert_same(y, f32([[[4, 6], [8, 12], [12, 18]]]))
    assert_same(s, f32([[12, 18]]))


@pytest.mark.parametrize("version,tname", type_params("Scan", [8], "V"))
def test_scan8_every_type(version, tname):
    x = sample(tname, (2, 3, 2))
    body = graph([node("Identity", ["s_in"], ["s_out"], name="s"), node("Identity", ["e"], ["y"], name="y")],
                 ["s_in", "e"], ["s_out", "y"])
    s, y = run_graph([node("Scan", ["", "x0", "x"], ["s", "y"], body=body, num_scan_inputs=1)],
                     {"x0": x[:, 0], "x": x}, ["s", "y"], version)
    assert_same(s, x[:, 0])
    assert_same(y, x)


def test_scan8_errors():
    x = f32(np.zeros((2, 3, 2)))
    with raises_naming_node(KernelError, r"sequence_lens values must be in \[0, 3\]"):
        run_graph([node("Scan", ["lens", "init", "x"], ["s", "y"], body=sum_body(), num_scan_inputs=1)],
                  {"lens": i64([1, 4]), "init": f32(np.zeros((2, 2))), "x": x}, ["s", "y"], 8)
    with raises_naming_node(KernelError, "initial state 0 must be a tensor with batch dim 2"):
        run_graph([node("Scan", ["", "init", "x"], ["s", "y"], body=sum_body(), num_scan_inputs=1)],
                  {"init": f32(np.zeros((3, 2))), "x": x}, ["s", "y"], 8)
    with raises_naming_node(InvalidNodeError, "directions has 2 value"):
        run_graph([node("Scan", ["", "init", "x"], ["s", "y"], body=sum_body(), num_scan_inputs=1,
                        directions=[0, 1])], {"init": f32(np.zeros((2, 2))), "x": x}, ["s", "y"], 8)


# -- Scan 9+ -------------------------------------------------------------------------------------------

SCAN9 = [v for v in SCAN_VERSIONS if v >= 9]


def run_scan(version, inputs: dict, n_states=1, n_outs=1, body=None, **attrs):
    names = list(inputs)
    outs = [f"o{k}" for k in range(n_states + n_outs)]
    return run_graph([node("Scan", names, outs, body=body or sum_body(len(names) - n_states),
                           num_scan_inputs=len(names) - n_states, **attrs)], inputs, outs, version)


@pytest.mark.parametrize("version", SCAN9)
def test_scan_running_sum(version):
    x = f32([[1, 2], [3, 4], [5, 6]])
    s, y = run_scan(version, {"init": f32([0, 0]), "x": x})
    assert_same(s, f32([9, 12]))
    assert_same(y, f32([[1, 2], [4, 6], [9, 12]]))


@pytest.mark.parametrize("version", SCAN9)
def test_scan_input_axes_and_directions(version):
    x = f32([[1, 2, 3], [10, 20, 30]])       # scanned along axis 1: elements [1 10] [2 20] [3 30]
    s, y = run_scan(version, {"init": f32([0, 0]), "x": x}, scan_input_axes=[1])
    assert_same(y, f32([[1, 10], [3, 30], [6, 60]]))
    s, y = run_scan(version, {"init": f32([0, 0]), "x": x}, scan_input_axes=[1], scan_input_directions=[1])
    assert_same(y, f32([[3, 30], [5, 50], [6, 60]]))
    assert_same(s, f32([6, 60]))


@pytest.mark.parametrize("version", SCAN9)
def test_scan_output_axes_and_directions(version):
    x = f32([[1, 2], [3, 4], [5, 6]])
    _, y = run_scan(version, {"init": f32([0, 0]), "x": x}, scan_output_axes=[1])
    assert_same(y, f32([[1, 4, 9], [2, 6, 12]]))
    _, y = run_scan(version, {"init": f32([0, 0]), "x": x}, scan_output_directions=[1])
    assert_same(y, f32([[9, 12], [4, 6], [1, 2]]))   # prepended: the last iteration comes first
    _, y = run_scan(version, {"init": f32([0, 0]), "x": x}, scan_output_axes=[1], scan_output_directions=[1])
    assert_same(y, f32([[9, 4, 1], [12, 6, 2]]))


@pytest.mark.parametrize("version", [v for v in SCAN9 if v >= 11])
def test_scan_negative_axes(version):
    x = f32([[1, 2, 3], [10, 20, 30]])
    _, y = run_scan(version, {"init": f32([0, 0]), "x": x}, scan_input_axes=[-1], scan_output_axes=[-1])
    assert_same(y, f32([[1, 3, 6], [10, 30, 60]]))


def test_scan9_rejects_negative_axes():
    with raises_naming_node(InvalidNodeError, "scan_input_axes must be non-negative"):
        run_scan(9, {"init": f32([0, 0]), "x": f32([[1, 2]])}, scan_input_axes=[-1])


@pytest.mark.parametrize("version", SCAN9)
def test_scan_two_inputs_two_states_no_output(version):
    body = graph([node("Add", ["a_in", "x"], ["a_out"], name="a"), node("Mul", ["b_in", "y"], ["b_out"], name="b")],
                 ["a_in", "b_in", "x", "y"], ["a_out", "b_out"])
    a, b = run_scan(version, {"a": f32(0), "b": f32([1, 1]), "x": f32([1, 2]), "y": f32([[2, 3], [4, 5]])},
                    n_states=2, n_outs=0, body=body, scan_input_axes=[0, 1])
    assert_same(a, f32(3))
    assert_same(b, f32([2 * 3, 4 * 5]))     # y scanned along axis 1: elements [2 4] then [3 5]


@pytest.mark.parametrize("version", SCAN9)
def test_scan_outer_capture_and_empty_sequence(version):
    body = graph([node("Mul", ["e", "k"], ["y"], name="mul"), node("Identity", ["s_in"], ["s_out"], name="s")],
                 ["s_in", "e"], ["s_out", vinfo("y", elem=F, shape=[2])])
    out = run_graph([node("Scan", ["init", "x"], ["s", "y"], body=body, num_scan_inputs=1)],
                    {"init": f32(5), "x": f32([[1, 2], [3, 4]]), "k": f32(10)}, ["s", "y"], version)
    assert_same(out[1], f32([[10, 20], [30, 40]]))
    s, y = run_graph([node("Scan", ["init", "x"], ["s", "y"], body=body, num_scan_inputs=1, scan_output_axes=[1])],
                     {"init": f32(5), "x": f32(np.zeros((0, 2))), "k": f32(10)}, ["s", "y"], version)
    assert_same(s, f32(5))
    assert_same(y, f32(np.zeros((2, 0))))   # no iteration: the declared element shape [2], then the axis


@pytest.mark.parametrize("version,tname", type_params("Scan", SCAN9, "V"))
def test_scan_every_type(version, tname):
    x = sample(tname, (3, 2))
    body = graph([node("Identity", ["e"], ["s_out"], name="s"), node("Identity", ["e"], ["y"], name="y")],
                 ["s_in", "e"], ["s_out", "y"])
    s, y = run_scan(version, {"init": x[0], "x": x}, body=body, scan_output_directions=[1])
    assert_same(s, x[2])
    assert_same(y, x[::-1])


def test_scan_errors():
    with raises_naming_node(KernelError, "scan input 1 has 3 element.*scan input 0 has 2"):
        run_scan(21, {"init": f32(0), "x": f32([1, 2]), "y": f32([1, 2, 3])})
    with raises_naming_node(KernelError, "scan_input_axes.0. 2 is out of range"):
        run_scan(21, {"init": f32([0, 0]), "x": f32([[1, 2]])}, scan_input_axes=[2])
    with raises_naming_node(InvalidNodeError, "scan_output_directions values must be 0"):
        run_scan(21, {"init": f32([0, 0]), "x": f32([[1, 2]])}, scan_output_directions=[2])
    with raises_naming_node(InvalidNodeError, "body has 2 output.*1 expected"):
        run_scan(21, {"init": f32([0, 0]), "x": f32([[1, 2]])}, n_outs=0)


# -- Iterations: buffers, lists, carried values --------------------------------------------------------
# A scan output's rows go into a buffer allocated at the first iteration when the number of rows is
# known (Scan, a Loop with M), else into a list stacked at the end; both must give the spec's values.

def scanning_loop(m, cond):
    """Loop over counting_body: M and cond as given ("" when None); outputs acc_final, scan_all."""
    inputs, names = {"acc": i64(0)}, ["", "", "acc"]
    if m is not None:
        inputs["M"], names[0] = i64(m), "M"
    if cond is not None:
        inputs["cond"], names[1] = np.array(cond), "cond"
    return run_graph([node("Loop", names, ["acc_final", "scan_all"], body=counting_body(stop_at=2))],
                     inputs, ["acc_final", "scan_all"], 21)


@pytest.mark.parametrize("m", [None, 10, 2**62])
def test_loop_stopped_by_its_condition_returns_the_rows_it_ran(m):
    # cond stops the loop after i == 2 whether M is absent (list), 10 (a buffer of 10 rows, 3 filled)
    # or beyond any buffer (list)
    acc, scan = scanning_loop(m, True)
    assert_same(acc, i64(0 + 1 + 2))
    assert_same(scan, i64([0, 10, 20]))
    assert scan.base is None or scan.base.size == scan.size    # not a view pinning the unused rows


@pytest.mark.parametrize("m", [3, None])
def test_loop_scan_output_changing_shape_fails_in_both_paths(m):
    # the row grows from [1] to [2] at the second iteration: with M (buffer) and without (list)
    body = loop_body([node("Concat", ["acc_in", "acc_in"], ["acc_out"], name="cat", axis=0),
                      node("Identity", ["acc_in"], ["s"], name="s"), const("lim", i64(2)),
                      node("Less", ["i", "lim"], ["cond_out"], name="c")], ["acc"], ["s"])
    names, inputs = (["M", "", "acc"], {"M": i64(m), "acc": i64([1])}) if m else (["", "", "acc"], {"acc": i64([1])})
    with raises_naming_node(KernelError, r"scan output 0 changes from int64\[1\] to int64\[2\] across iterations"):
        run_graph([node("Loop", names, ["a", "s_all"], body=body)], inputs, ["a", "s_all"], 21)


def test_scan_output_changing_shape_fails():
    body = graph([node("Identity", ["s_in"], ["s_out"], name="s"), node("NonZero", ["e"], ["y"], name="nz")],
                 ["s_in", "e"], ["s_out", "y"])
    with raises_naming_node(KernelError, r"scan output 0 changes from int64\[1, 1\] to int64\[1, 2\]"):
        run_scan(21, {"init": f32(0), "x": f32([[1, 0], [1, 1]])}, body=body)


def test_loop_outputs_of_two_runs_stay_independent():
    body = loop_body([node("Add", ["x_in", "i_f"], ["x_out"], name="add"), node("Cast", ["i"], ["i_f"], name="f",
                                                                              to=TensorProto.FLOAT),
                      node("Mul", ["x_out", "x_out"], ["sq"], name="sq"),
                      node("Identity", ["cond_in"], ["cond_out"], name="c")], ["x"], ["sq"])
    g = helper.make_graph([node("Loop", ["M", "", "x"], ["x_final", "sqs"], body=body)], "g",
                          [vinfo("M", i64(1)), vinfo("x", f32([1, 2]))],
                          [helper.make_empty_tensor_value_info("x_final"), helper.make_empty_tensor_value_info("sqs")])
    rep = onnx_mini.prepare(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10))
    first = rep.run([i64(3), f32([0, 10])])
    kept = [np.array(v, copy=True) for v in first]
    second = rep.run([i64(3), f32([100, 1000])])
    for a, b in zip(first, kept):            # the second run wrote nothing the first one returned
        assert_same(a, b)
    assert_same(first[0], f32([3, 13]))                   # 0 + 0 + 1 + 2
    assert_same(first[1], f32([[0, 100], [1, 121], [9, 169]]))
    assert_same(second[1], f32([[100**2, 1000**2], [101**2, 1001**2], [103**2, 1003**2]]))
    assert not any(np.shares_memory(a, b) for a in first for b in second)


@pytest.mark.parametrize("version", [13, 21])
def test_string_scalars_as_scan_rows(version):
    # a 0-d object row written into a buffer must store its string, not the array holding it
    words = np.array(["a", "bb", "ccc"], dtype=object)
    body = loop_body([node("Gather", ["words", "i"], ["w"], name="g"),
                      node("Identity", ["cond_in"], ["cond_out"], name="c")], (), ["w"])
    ws, = run_graph([node("Loop", ["M", ""], ["ws"], body=body)], {"M": i64(3), "words": words}, ["ws"], version)
    assert_same(ws, words)
    scan_body = graph([node("Identity", ["s_in"], ["s_out"], name="s"), node("Identity", ["e"], ["y"], name="y")],
                      ["s_in", "e"], ["s_out", "y"])
    _, ys = run_scan(version, {"init": np.array("", dtype=object), "x": words}, body=scan_body)
    assert_same(ys, words)


def test_loop_iteration_number_as_a_scan_output_and_unread():
    # the body outputs i itself (read: made each iteration); another body never reads it
    body = loop_body([node("Identity", ["i"], ["s"], name="s"), node("Identity", ["cond_in"], ["cond_out"], name="c")],
                     (), ["s"])
    s, = run_graph([node("Loop", ["M", ""], ["s_all"], body=body)], {"M": i64(4)}, ["s_all"], 21)
    assert_same(s, i64([0, 1, 2, 3]))
    x, = run_graph([node("Loop", ["M", "", "x"], ["x_final"],
                         body=loop_body([node("Neg", ["x_in"], ["x_out"], name="n"),
                                         node("Identity", ["cond_in"], ["cond_out"], name="c")], ["x"]))],
                   {"M": i64(3), "x": f32([1, -2])}, ["x_final"], 21)
    assert_same(x, f32([-1, 2]))


def test_loop_carried_value_reuses_its_buffer(monkeypatch):
    """A carried value dies in the body: from the second iteration on, only the body's slot holds it,
    so the in-place Add writes the next value into its buffer; the caller's array is never written."""
    from onnx_mini import inplace
    taken = []
    real = inplace.wrap

    def counted(in_place):
        def run(*args, **kwargs):
            taken.append(1)
            return in_place(*args, **kwargs)
        return run
    monkeypatch.setattr(inplace, "wrap", lambda in_place, *rest: real(counted(in_place), *rest))
    n = 256                                          # 65536 elements: above inplace.MIN_SIZE
    body = loop_body([node("Add", ["x_in", "c"], ["t"], name="add"), node("Neg", ["t"], ["x_out"], name="neg"),
                      node("Identity", ["cond_in"], ["cond_out"], name="c")], ["x"])
    g = helper.make_graph([node("Loop", ["M", "", "x"], ["y"], body=body)], "g",
                          [vinfo("M", i64(1)), vinfo("x", elem=F, shape=[n, n])],
                          [helper.make_empty_tensor_value_info("y")],
                          [numpy_helper.from_array(np.full((n, n), 0.5, np.float32), "c")])
    rep = onnx_mini.prepare(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10))
    x = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
    x_before = x.copy()
    y, = rep.run([i64(5), x])
    want = x_before
    for _ in range(5):
        want = -(want + np.float32(0.5))
    assert_same(y, want)
    assert_same(x, x_before)
    # Neg each iteration (t dies there), Add from the second iteration on (the first reads the caller's x)
    assert len(taken) == 5 + 4


def test_iterations_neither_plan_nor_bind(monkeypatch):
    """Bodies are planned and bound at prepare time: a run of If, Loop and Scan (the control-flow model
    of helpers.py, bodies nested) calls neither the planner nor binding."""
    from helpers import control_flow_feeds, control_flow_model
    from onnx_mini import binding, planner
    prepared = onnx_mini.prepare(control_flow_model())
    want = prepared.run(control_flow_feeds())

    def forbidden(*_, **__):
        raise AssertionError("planned or bound at run time")
    monkeypatch.setattr(planner, "build_plan", forbidden)
    monkeypatch.setattr(planner, "bind", forbidden)
    monkeypatch.setattr(binding, "bind", forbidden)
    for got, exp in zip(prepared.run(control_flow_feeds()), want):
        assert_same(got, exp)


def test_subplan_runner_checks_its_input_count():
    body = loop_body([node("Identity", ["cond_in"], ["cond_out"], name="c")], (), ["cond_in"])
    g = helper.make_graph([node("Loop", ["M", ""], ["conds"], body=body)], "g", [vinfo("M", i64(1))],
                          [helper.make_empty_tensor_value_info("conds")])
    rep = onnx_mini.prepare(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10))
    (fn, *_), = rep.plan.steps
    sub = next(c.cell_contents for c in fn.__closure__ if isinstance(c.cell_contents, SubPlan))
    call = sub.runner(())
    values = [i64(0), np.array(True)]
    assert_same(call(values), [np.array(True), np.array(True)])
    assert values == []                  # emptied: the body's slots held the only references
    with pytest.raises(onnx_mini.errors.InvalidValueError, match="takes 2 input.*3 given"):
        call([i64(0), np.array(True), i64(1)])
    assert sub.reads(1) and not sub.reads(0)      # the body ignores its iteration number


def _body_of(prepared) -> list:
    """The SubPlans of the model's first control-flow step (the node's bodies)."""
    fn = next(s[0] for s in prepared.plan.steps if any(isinstance(c.cell_contents, SubPlan)
                                                       for c in (s[0].__closure__ or ())))
    return [c.cell_contents for c in fn.__closure__ if isinstance(c.cell_contents, SubPlan)]


@pytest.mark.parametrize("n_scan", [1, 2, 3, 4])
def test_scan_body_of_one_step(n_scan):
    """A body that plans to one step (Sum of the state and 1 to 4 elements; the Identity of the scan
    output folded into it) runs that step alone per iteration: the running sums by hand, for every
    argument count the runner calls with (2 to 5), and the caller's inputs untouched."""
    xs = {f"x{j}": f32([[1, 2], [3, 4], [5, 6]]) * 10 ** j for j in range(n_scan)}
    kept = {k: v.copy() for k, v in xs.items()}
    inputs = {"init": f32([0.5, 0.25]), **xs}
    g = helper.make_graph([node("Scan", list(inputs), ["s", "y"], body=sum_body(n_scan), num_scan_inputs=n_scan)],
                          "g", [vinfo(k, v) for k, v in inputs.items()],
                          [helper.make_empty_tensor_value_info(o) for o in ("s", "y")])
    prepared = onnx_mini.prepare(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10))
    body, = _body_of(prepared)
    assert len(body.plan.steps) == 1
    s, y = prepared.run(inputs)
    unit = sum(10 ** j for j in range(n_scan))          # each element summed with its scaled copies
    want = f32([[1, 2], [4, 6], [9, 12]]) * unit + f32([0.5, 0.25])
    assert_same(y, want)
    assert_same(s, want[-1])
    for k, v in xs.items():
        assert_same(v, kept[k])


def test_scan_body_of_one_step_two_states_and_reversed_rows():
    """The one-step iterations (SubPlan.single_step) with two states that both take the step's result and a
    scan output written backwards: the running sums by hand, the second state's initial value never read."""
    body = graph([node("Add", ["a_in", "e"], ["a_out"], name="add")], ["a_in", "b_in", "e"],
                 ["a_out", "a_out", "a_out"])
    inputs = {"a": f32([1, 1]), "b": f32([7, 7]), "x": f32([[1, 2], [3, 4], [5, 6]])}
    g = helper.make_graph([node("Scan", list(inputs), ["a_last", "b_last", "y"], body=body, num_scan_inputs=1,
                                scan_output_directions=[1])], "g", [vinfo(k, v) for k, v in inputs.items()],
                          [helper.make_empty_tensor_value_info(o) for o in ("a_last", "b_last", "y")])
    prepared = onnx_mini.prepare(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10))
    body_plan, = _body_of(prepared)
    assert body_plan.single_step() is not None
    a, b, y = prepared.run(inputs)
    sums = f32([[2, 3], [5, 7], [10, 13]])
    assert_same(a, sums[-1])
    assert_same(b, sums[-1])
    assert_same(y, sums[::-1])


@pytest.mark.parametrize("size", [4, 20000])
def test_scan_body_of_one_step_on_the_state_alone(size):
    """A one-step body reading its state only (Tanh; the scan input sets the count): every row is the
    next power of tanh, also where the state is large enough for the in-place Tanh (inplace.py), whose
    buffer must not be a row already written."""
    body = graph([node("Tanh", ["s_in"], ["s_out"], name="t")], ["s_in", "e"], ["s_out", "s_out"])
    s0 = np.random.default_rng(3).standard_normal(size).astype(np.float32)
    inputs = {"s": s0, "x": np.zeros((3, 1), np.float32)}
    g = helper.make_graph([node("Scan", list(inputs), ["s_last", "y"], body=body, num_scan_inputs=1)], "g",
                          [vinfo(k, v) for k, v in inputs.items()],
                          [helper.make_empty_tensor_value_info(o) for o in ("s_last", "y")])
    prepared = onnx_mini.prepare(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10))
    rows = [np.tanh(s0)]
    for _ in range(2):
        rows.append(np.tanh(rows[-1]))
    for _ in range(2):
        s, y = prepared.run(inputs)
        assert_same(y, np.stack(rows))
        assert_same(s, rows[-1])


def test_scan_body_of_one_step_is_profiled_step_by_step():
    """A hooked run (the profiler) takes the body's runner, not the one-step iterations: the body's step
    is counted once per element."""
    inputs = {"init": f32([0.5, 0.25]), "x0": f32([[1, 2], [3, 4], [5, 6]])}
    g = helper.make_graph([node("Scan", list(inputs), ["s", "y"], body=sum_body(1), num_scan_inputs=1)],
                          "g", [vinfo(k, v) for k, v in inputs.items()],
                          [helper.make_empty_tensor_value_info(o) for o in ("s", "y")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    p = onnx_mini.profile(m, inputs, runs=2, warmup=0)
    step = next(n for n in p.nodes if n.depth == 1)
    assert step.calls_per_run == 3 and step.op_type == "Sum"


def test_scan_body_of_one_step_error_names_both_nodes():
    body = graph([node("Add", ["s_in", "e"], ["s_out"], name="inner_add")], ["s_in", "e"], ["s_out"])
    with pytest.raises(KernelError) as e:
        run_graph([node("Scan", ["init", "x"], ["s"], body=body, num_scan_inputs=1)],
                  {"init": f32([0, 0]), "x": f32([[1, 2, 3]])}, ["s"], 21)
    message = str(e.value)
    assert NODE in message and "inner_add" in message and "Add" in message and "float32[3]" in message


@pytest.mark.parametrize("size", [4, 20000])
def test_loop_body_of_one_step_carried_in_place(size):
    """A Loop whose body is one Tanh step on the carried value (its condition passed through): tanh three
    times, the same bits, whether or not the value is big enough to be written in place (inplace.py);
    the fed value untouched."""
    body = loop_body([node("Tanh", ["x_in"], ["x_out"], name="t")], ["x"], cond_out="cond_in")
    x0 = np.random.default_rng(5).standard_normal(size).astype(np.float32)
    kept = x0.copy()
    g = helper.make_graph([node("Loop", ["M", "", "x"], ["x_final"], body=body)], "g",
                          [vinfo("M", i64(1)), vinfo("x", x0)], [helper.make_empty_tensor_value_info("x_final")])
    prepared = onnx_mini.prepare(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10))
    assert len(_body_of(prepared)[0].plan.steps) == 1
    for _ in range(2):
        x, = prepared.run({"M": i64(3), "x": x0})
        assert_same(x, np.tanh(np.tanh(np.tanh(kept))))
    assert_same(x0, kept)


@pytest.mark.parametrize("cond", [True, False])
def test_if_branches_of_constants_only(cond):
    """Branches that plan to no step and return constants: the branch's values, each call; one with a
    step or an outer value still runs it."""
    then_g = graph([const("a", f32([1, 2])), const("b", i64(7))], [], ["a", "b"])
    else_g = graph([const("a", f32([3])), node("Neg", ["x"], ["b"], name="neg")], [], ["a", "b"])
    g = helper.make_graph([node("If", ["c"], ["a", "b"], then_branch=then_g, else_branch=else_g)], "g",
                          [vinfo("c", np.array(True)), vinfo("x", i64(4))],
                          [helper.make_empty_tensor_value_info(o) for o in ("a", "b")])
    prepared = onnx_mini.prepare(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10))
    branches = {b.key: b for b in _body_of(prepared)}
    assert not branches["then_branch"].plan.steps and branches["else_branch"].plan.steps
    for _ in range(2):
        a, b = prepared.run({"c": np.array(cond), "x": i64(4)})
        assert_same(a, f32([1, 2]) if cond else f32([3]))
        assert_same(b, i64(7) if cond else i64(-4))
    with pytest.raises(onnx_mini.errors.InvalidValueError, match="takes 0 input.*1 given"):
        branches["then_branch"].run([f32(1)])


def _ran(prepared, feeds) -> tuple[list, list[str]]:
    """The outputs of one run and the op types of every step it ran, bodies' steps included."""
    seen = []
    outs = prepared.run(feeds, hook=lambda info, *_: seen.append(info.op_type))
    return outs, seen


def test_bodies_take_outer_constants_as_their_own():
    """A body's values computed from the enclosing graphs' constants (an initializer, a Constant node)
    fold when the body is prepared, two levels down: the inner branch's Slice / Concat / Transpose of
    them never run, and its MatMul gets the result as a constant weight. Values by hand."""
    w = np.arange(6, dtype=np.float32).reshape(2, 3)           # rows [0 1 2], [3 4 5]
    inner_then = graph([node("Slice", ["w", "starts", "ends", "axes"], ["w1"], name="slice"),
                        node("Concat", ["w1", "k"], ["wk"], name="concat", axis=0),
                        node("Transpose", ["wk"], ["wt"], name="transpose"),
                        node("MatMul", ["x", "wt"], ["y"], name="matmul")], [], ["y"], name="inner_then")
    inner_else = graph([node("Neg", ["x"], ["y"], name="neg")], [], ["y"], name="inner_else")
    outer_then = graph([const("k", f32([[1, 1, 1]])),
                        node("If", ["c2"], ["y"], name="inner", then_branch=inner_then, else_branch=inner_else)],
                       [], ["y"], name="outer_then")
    outer_else = graph([node("Identity", ["x"], ["y"], name="same")], [], ["y"], name="outer_else")
    g = helper.make_graph(
        [const("starts", i64([1])), const("ends", i64([2])), const("axes", i64([0])),
         node("If", ["c1"], ["y"], name="outer", then_branch=outer_then, else_branch=outer_else)], "g",
        [vinfo("c1", np.array(True)), vinfo("c2", np.array(True)), vinfo("x", f32([[1, 2, 3]]))],
        [helper.make_empty_tensor_value_info("y")], [numpy_helper.from_array(w, "w")])
    prepared = onnx_mini.prepare(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10))
    x = f32([[1, 2, 3]])
    (y,), ran = _ran(prepared, {"c1": np.array(True), "c2": np.array(True), "x": x})
    # wk = [[3 4 5], [1 1 1]]; y = x @ wk^T = [1*3 + 2*4 + 3*5, 1 + 2 + 3]
    assert_same(y, f32([[26, 6]]))
    assert sorted(ran) == ["If", "If", "MatMul"]
    (y,), _ = _ran(prepared, {"c1": np.array(True), "c2": np.array(False), "x": x})
    assert_same(y, f32([[-1, -2, -3]]))
    assert_same(w, np.arange(6, dtype=np.float32).reshape(2, 3))


def test_bodies_read_an_overridable_initializer_as_fed():
    """An initializer that is also a graph input (a default the caller may replace) is no constant to
    a body: the body computes with the value fed."""
    body = graph([node("Transpose", ["w"], ["wt"], name="transpose"), node("MatMul", ["x", "wt"], ["y"], name="mm")],
                 [], ["y"], name="then")
    other = graph([node("Identity", ["x"], ["y"], name="same")], [], ["y"], name="else")
    w = f32([[1, 0], [0, 1]])
    g = helper.make_graph([node("If", ["c"], ["y"], then_branch=body, else_branch=other)], "g",
                          [vinfo("c", np.array(True)), vinfo("x", f32([[1, 2]])), vinfo("w", w)],
                          [helper.make_empty_tensor_value_info("y")], [numpy_helper.from_array(w, "w")])
    prepared = onnx_mini.prepare(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10))
    (y,), ran = _ran(prepared, {"c": np.array(True), "x": f32([[1, 2]])})
    assert_same(y, f32([[1, 2]]))
    (y,), ran = _ran(prepared, {"c": np.array(True), "x": f32([[1, 2]]), "w": f32([[0, 1], [2, 0]])})
    assert_same(y, f32([[2, 2]]))            # x @ [[0 2] [1 0]]
    assert "Transpose" in ran


@pytest.mark.parametrize("version", [11, 25])
def test_loop_body_takes_outer_constants_as_its_own(version):
    """A Loop body's Transpose of an outer initializer folds at prepare: per iteration only the MatMul
    and the Add run. x_{i+1} = x_i @ W^T + 1 by hand."""
    body = loop_body([node("Transpose", ["w"], ["wt"], name="transpose"),
                      node("MatMul", ["x_in", "wt"], ["p"], name="mm"),
                      node("Add", ["p", "one"], ["x_out"], name="add"),
                      node("Identity", ["cond_in"], ["cond_out"], name="c")], ["x"])
    w = f32([[0, 1], [1, 0]])                                  # swaps the two values
    g = helper.make_graph([const("one", f32([1])), node("Loop", ["M", "", "x"], ["x_final"], body=body)], "g",
                          [vinfo("M", i64(3)), vinfo("x", f32([[1, 5]]))],
                          [helper.make_empty_tensor_value_info("x_final")], [numpy_helper.from_array(w, "w")])
    prepared = onnx_mini.prepare(helper.make_model(g, opset_imports=[helper.make_opsetid("", version)],
                                                   ir_version=10))
    (x,), ran = _ran(prepared, {"M": i64(3), "x": f32([[1, 5]])})
    assert_same(x, f32([[8, 4]]))            # [1 5] -> [6 2] -> [3 7] -> [8 4]
    assert "Transpose" not in ran and ran.count("MatMul") == 3
