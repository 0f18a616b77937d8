"""Function inlining with subgraphs: model-local functions and schema function bodies whose nodes hold
subgraphs (If/Loop bodies reading the function's scope), attribute references inside those subgraphs,
recursion refused, and type-dependent ("context-dependent") schema bodies built from input types.
"""
from __future__ import annotations

import numpy as np
import pytest
from onnx import AttributeProto, TensorProto, helper, numpy_helper

import onnx_mini
from onnx_mini import catalog
from onnx_mini import inline
from onnx_mini import registry
from onnx_mini import resolve as resolve_module
from onnx_mini import schema_bodies
from onnx_mini.errors import InvalidNodeError, UnsupportedOperatorError

from helpers import NODE, assert_same, i64

F, I64 = TensorProto.FLOAT, TensorProto.INT64
LOCAL = "local.fn"


def f32(values) -> np.ndarray:
    return np.array(values, np.float32)


def ref(name: str, refers_to: str, attr_type: int) -> AttributeProto:
    """An attribute of a function body node that takes the calling node's attribute `refers_to`."""
    a = AttributeProto()
    a.name, a.ref_attr_name, a.type = name, refers_to, attr_type
    return a


def make_node(op, ins, outs, name="", attrs=(), domain="", **kw):
    n = helper.make_node(op, list(ins), list(outs), name=name, domain=domain, **kw)
    n.attribute.extend(attrs)
    return n


def branch(nodes, outputs, inputs=()):
    return helper.make_graph(nodes, "g", [helper.make_empty_tensor_value_info(x) for x in inputs],
                             [helper.make_empty_tensor_value_info(x) for x in outputs])


def model(nodes, inputs: dict, outputs, functions=(), opset=18):
    g = helper.make_graph(nodes, "main",
                          [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
                           for k, v in inputs.items()],
                          [helper.make_empty_tensor_value_info(o) for o in outputs])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(LOCAL, 1)],
                             functions=list(functions), ir_version=10)


def run(nodes, inputs: dict, outputs, functions=(), opset=18):
    return list(onnx_mini.prepare(model(nodes, inputs, outputs, functions, opset)).run(inputs))


def function(name, inputs, outputs, nodes, attributes=(), attribute_protos=()):
    return helper.make_function(LOCAL, name, list(inputs), list(outputs), nodes, [helper.make_opsetid("", 18)],
                                attributes=list(attributes), attribute_protos=list(attribute_protos))


# -- model-local functions holding subgraphs -----------------------------------------------------------

def scale_or_shift():
    """F(x, y)<alpha>: sum(x) > 0 ? x * alpha : x + y; the branches read x and y from F's scope and the
    then-branch's Constant takes the caller's alpha."""
    then_g = branch([make_node("Constant", [], ["c"], attrs=[ref("value_float", "alpha", AttributeProto.FLOAT)]),
                     make_node("Mul", ["x", "c"], ["t"])], ["t"])
    else_g = branch([make_node("Add", ["x", "y"], ["t"])], ["t"])      # same inner name in both branches
    body = [make_node("ReduceSum", ["x"], ["s"], keepdims=0), make_node("Constant", [], ["zero"], value_float=0.0),
            make_node("Greater", ["s", "zero"], ["cond"]),
            make_node("If", ["cond"], ["t"], then_branch=then_g, else_branch=else_g),
            make_node("Identity", ["t"], ["out"])]
    return function("ScaleOrShift", ["x", "y"], ["out"], body, attributes=["alpha"])


def test_function_with_if_reading_its_scope_and_attribute_refs():
    call = make_node("ScaleOrShift", ["a", "b"], ["r"], name="call", domain=LOCAL, alpha=3.0)
    rep = onnx_mini.prepare(model([call], {"a": f32([1, 2]), "b": f32([10, 20])}, ["r"], [scale_or_shift()]))
    assert_same(rep.run([f32([1, 2]), f32([10, 20])])[0], f32([3, 6]))
    assert_same(rep.run([f32([-1, -2]), f32([10, 20])])[0], f32([9, 18]))


def test_function_called_twice_with_names_that_clash_with_the_caller():
    # the caller has its own "x", "t", "s", "cond": the function's names must not collide with them
    nodes = [make_node("Neg", ["a"], ["x"]), make_node("Neg", ["x"], ["t"]), make_node("Identity", ["t"], ["s"]),
             make_node("Identity", ["s"], ["cond"]),
             make_node("ScaleOrShift", ["a", "b"], ["r1"], domain=LOCAL, alpha=2.0),
             make_node("ScaleOrShift", ["cond", "b"], ["r2"], domain=LOCAL, alpha=5.0)]
    r1, r2, t = run(nodes, {"a": f32([1, 2]), "b": f32([10, 20])}, ["r1", "r2", "t"], [scale_or_shift()])
    assert_same(r1, f32([2, 4]))
    assert_same(r2, f32([5, 10]))
    assert_same(t, f32([1, 2]))


@pytest.mark.parametrize("optimize", [True, False])
def test_function_argument_named_like_a_branch_local_value(optimize):
    # the caller passes its value "t" as x; inside the function's branches "t" is a local output, which
    # must not shadow the argument (else_branch: Add(x, y) -> t would read its own output)
    nodes = [make_node("Neg", ["a"], ["t"]), make_node("ScaleOrShift", ["t", "b"], ["r"], domain=LOCAL, alpha=2.0)]
    m = model(nodes, {"a": f32([1, 2]), "b": f32([10, 20])}, ["r"], [scale_or_shift()], 18)
    rep = onnx_mini.prepare(m, optimize=optimize)
    assert_same(rep.run([f32([1, 2]), f32([10, 20])])[0], f32([9, 18]))       # sum(-a) < 0: -a + b
    assert_same(rep.run([f32([-1, -2]), f32([10, 20])])[0], f32([2, 4]))      # sum(-a) > 0: -a * 2


def test_function_with_loop_and_nested_if_and_defaults():
    """G(x, n)<k = 2>: acc = x; repeat n times: acc = acc + (i is even ? x * k : x). The If inside the Loop
    body reads x (the function's input) two scopes up, and k (an attribute default) through a ref."""
    even_g = branch([make_node("Constant", [], ["kk"], attrs=[ref("value_float", "k", AttributeProto.FLOAT)]),
                     make_node("Mul", ["x", "kk"], ["d"])], ["d"])
    odd_g = branch([make_node("Identity", ["x"], ["d"])], ["d"])
    loop_body = branch([make_node("Constant", [], ["two"], value=numpy_helper.from_array(i64(2))),
                        make_node("Mod", ["i", "two"], ["r"]),
                        make_node("Constant", [], ["zero"], value=numpy_helper.from_array(i64(0))),
                        make_node("Equal", ["r", "zero"], ["even"]),
                        make_node("If", ["even"], ["d"], then_branch=even_g, else_branch=odd_g),
                        make_node("Add", ["acc_in", "d"], ["acc_out"]),
                        make_node("Identity", ["cond_in"], ["cond_out"])],
                       ["cond_out", "acc_out"], ["i", "cond_in", "acc_in"])
    body = [make_node("Loop", ["n", "", "x"], ["out"], body=loop_body)]
    g = function("G", ["x", "n"], ["out"], body,
                 attribute_protos=[helper.make_attribute("k", 2.0)])
    x = f32([1, 10])
    out, = run([make_node("G", ["x", "n"], ["y"], domain=LOCAL)], {"x": x, "n": i64(3)}, ["y"], [g])
    assert_same(out, x + 2 * x + x + 2 * x)
    out, = run([make_node("G", ["x", "n"], ["y"], domain=LOCAL, k=10.0)], {"x": x, "n": i64(2)}, ["y"], [g])
    assert_same(out, x + 10 * x + x)


def test_function_graph_attribute_comes_from_the_caller_scope():
    """Choose(c)<then> runs If(c) with the caller's graph as then_branch: it reads the caller's `v`."""
    body = [make_node("If", ["c"], ["out"], attrs=[ref("then_branch", "then", AttributeProto.GRAPH)],
                      else_branch=branch([make_node("Constant", [], ["z"], value_float=-1.0)], ["z"]))]
    choose = function("Choose", ["c"], ["out"], body, attributes=["then"])
    caller_branch = branch([make_node("Add", ["v", "v"], ["w"])], ["w"])
    call = make_node("Choose", ["c"], ["y"], domain=LOCAL, then=caller_branch)
    y, = run([call], {"c": np.array(True), "v": f32([4])}, ["y"], [choose])
    assert_same(y, f32([8]))
    y, = run([call], {"c": np.array(False), "v": f32([4])}, ["y"], [choose])
    assert_same(y, f32(-1))


def test_recursive_functions_are_refused():
    direct = function("Rec", ["x"], ["y"], [make_node("Rec", ["x"], ["y"], domain=LOCAL)])
    with pytest.raises(InvalidNodeError, match="nest too deeply"):
        onnx_mini.prepare(model([make_node("Rec", ["a"], ["b"], name=NODE, domain=LOCAL)], {"a": f32([1])}, ["b"],
                                [direct]))
    loop_body = branch([make_node("Rec", ["acc_in"], ["acc_out"], domain=LOCAL),
                        make_node("Identity", ["cond_in"], ["cond_out"])], ["cond_out", "acc_out"],
                       ["i", "cond_in", "acc_in"])
    via_loop = function("Rec", ["x"], ["y"], [make_node("Loop", ["", "", "x"], ["y"], body=loop_body)])
    with pytest.raises(InvalidNodeError, match="nest more than 64 deep"):
        onnx_mini.prepare(model([make_node("Rec", ["a"], ["b"], name=NODE, domain=LOCAL)], {"a": f32([1])}, ["b"],
                                [via_loop]))


# -- schema function bodies holding subgraphs ------------------------------------------------------------

@pytest.fixture
def without_kernel(monkeypatch):
    """remove(op): the op's kernels disappear for this test, so its schema function body runs."""
    catalog.load_all_ops()

    def remove(op, domain=""):
        for key in [k for k in registry._KERNELS if k[:2] == (domain, op)]:
            monkeypatch.delitem(registry._KERNELS, key)
        resolve_module._resolve.cache_clear()
    yield remove
    monkeypatch.undo()
    resolve_module._resolve.cache_clear()


def test_schema_body_with_loop(without_kernel):
    without_kernel("Range")   # Range-11's function body is a Loop reading start/delta from its scope
    for start, limit, delta, dtype in ((1, 10, 3, np.int64), (10, 4, -2, np.int32), (0.5, 2, 0.5, np.float32)):
        args = {"s": np.array(start, dtype), "l": np.array(limit, dtype), "d": np.array(delta, dtype)}
        out, = run([make_node("Range", ["s", "l", "d"], ["r"])], args, ["r"], opset=21)
        assert_same(out, np.arange(start, limit, delta).astype(dtype))


def test_schema_body_with_if(without_kernel):
    without_kernel("AffineGrid")   # AffineGrid's body branches on the rank of size with If
    theta = f32([[[1, 0, 0], [0, 1, 0]], [[2, 0, 0], [0, 1, 1]]])   # identity; x doubled and y shifted by 1
    out, = run([make_node("AffineGrid", ["theta", "size"], ["grid"], align_corners=1)],
               {"theta": theta, "size": i64([2, 1, 2, 3])}, ["grid"], opset=20)
    xs, ys = np.meshgrid(f32([-1, 0, 1]), f32([-1, 1]))   # (H, W) = (2, 3), corners aligned
    assert_same(out, np.stack([np.stack([xs, ys], axis=-1), np.stack([2 * xs, ys + 1], axis=-1)]))


# -- type-dependent schema bodies ----------------------------------------------------------------------

def test_typed_body_built_at_prepare_time_from_declared_types(without_kernel, monkeypatch):
    without_kernel("CastLike")
    built = []
    monkeypatch.setattr(inline, "typed_function_body",
                        lambda *a: built.append(a[2]) or schema_bodies.typed_function_body(*a))
    rep = onnx_mini.prepare(model([make_node("CastLike", ["x", "like"], ["y"])],
                                  {"x": f32([1.5, -2.5]), "like": i64([0])}, ["y"], opset=21))
    assert len(built) == 1 and built[0][1].elem_type == I64
    assert [i.op_type for i in rep.plan.infos] == ["Cast"]    # inlined: no CastLike step left
    assert_same(rep.run([f32([1.5, -2.5]), i64([0])])[0], i64([1, -2]))
    assert len(built) == 1


def test_typed_body_built_per_run_time_signature(without_kernel, monkeypatch):
    without_kernel("CastLike")
    built = []
    monkeypatch.setattr(inline, "typed_function_body",
                        lambda *a: built.append(a[2]) or schema_bodies.typed_function_body(*a))
    g = helper.make_graph([make_node("Identity", ["like"], ["like2"]), make_node("CastLike", ["x", "like2"], ["y"],
                                                                                  name=NODE)], "main",
                          [helper.make_tensor_value_info("x", F, None),
                           helper.make_tensor_value_info("like", TensorProto.UNDEFINED, None)],
                          [helper.make_empty_tensor_value_info("y")])
    rep = onnx_mini.prepare(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10))
    assert built == []                        # the target type is unknown before run time
    for like, expected in ((i64([0]), i64([1, -2])), (np.array([0], np.float64), np.array([1.5, -2.5])),
                           (i64([7, 7]), i64([1, -2]))):
        assert_same(rep.run([f32([1.5, -2.5]), like])[0], expected)
    assert [t[1].elem_type for t in built] == [I64, TensorProto.DOUBLE]   # one body per signature


def test_typed_body_errors(without_kernel):
    without_kernel("CastLike")
    # a sequence as the type to cast like: onnx's CastLike builder makes no body for it
    g = helper.make_graph([make_node("CastLike", ["x", "like"], ["y"], name=NODE)], "main",
                          [helper.make_tensor_value_info("x", F, [1]),
                           helper.make_tensor_sequence_value_info("like", F, None)],
                          [helper.make_empty_tensor_value_info("y")])
    with pytest.raises(UnsupportedOperatorError,
                       match=rf"{NODE}.*no type-dependent function body.*tensor\(float\), sequence\(tensor\(float\)\)"):
        onnx_mini.prepare(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10))
