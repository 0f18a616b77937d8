"""Shape specialisation (onnx_mini/specialize.py) and the pass-through elimination it enables.

Every result is compared with the same model run with optimize=False (the graph exactly as written,
no folding, no specialisation), on several input shapes, so a wrongly folded shape cannot pass.
"""
from __future__ import annotations

import itertools

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import onnx_mini
from helpers import REPO
from onnx_mini import specialize

OPSET = [helper.make_opsetid("", 21)]


def make(nodes, inputs, outputs, inits=(), opset=OPSET):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=opset)


def tensor(name, dims, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, dims)


def plans(prepared):
    """The specialised plans of the model's main plan, by signature."""
    sp = prepared._specializers.get(id(prepared.plan))
    return {} if sp is None else {k: v[0] for k, v in sp._plans.items() if v is not None}


def same_as_written(model, feeds_list):
    fast, plain = onnx_mini.prepare(model), onnx_mini.prepare(model, optimize=False)
    for feeds in feeds_list:
        for got, want in zip(fast.run(feeds), plain.run(feeds)):
            np.testing.assert_array_equal(got, want)
    return fast


def flatten_cnn():
    """Conv -> MaxPool -> Shape/Gather/Concat/Reshape flatten (an exporter's spelling) -> MatMul.
    The weight comes from ConstantOfShape + Mul, so it is a folded constant."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus1"),
             numpy_helper.from_array(np.array([36, 5], np.int64), "fc_shape")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("MaxPool", ["c"], ["p"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1),
             helper.make_node("Shape", ["p"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Concat", ["n", "minus1"], ["target"], axis=0),
             helper.make_node("Reshape", ["p", "target"], ["flat"]),
             helper.make_node("ConstantOfShape", ["fc_shape"], ["ones"],
                              value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.5])),
             helper.make_node("MatMul", ["flat", "ones"], ["y"])]
    return make(nodes, [tensor("x", ["N", 3, "H", "W"])], [tensor("y", None)], inits)


def test_shape_chain_folds_per_signature_and_matches_the_graph_as_written():
    model = flatten_cnn()
    rng = np.random.default_rng(1)
    feeds = [[rng.standard_normal((n, 3, 12, 12)).astype(np.float32)] for n in (1, 3, 1)]
    fast = same_as_written(model, feeds)
    assert [i.op_type for i in fast.plan.infos].count("Shape") == 1      # the general plan keeps it
    specialised = plans(fast)
    assert len(specialised) == 2                                          # batch 1 and batch 3
    for plan in specialised.values():
        assert {"Shape", "Gather", "Concat", "ConstantOfShape"}.isdisjoint(i.op_type for i in plan.infos)


def test_folded_constants_are_shared_not_recomputed():
    model = flatten_cnn()
    fast = onnx_mini.prepare(model)
    x = np.ones((2, 3, 12, 12), np.float32)
    fast.run([x])
    general = {id(v) for v in fast.plan.template if isinstance(v, np.ndarray)}
    (plan,) = plans(fast).values()
    ones = [v for v in plan.template if isinstance(v, np.ndarray) and v.shape == (36, 5)]
    assert ones and all(id(v) in general for v in ones)


def test_same_signature_plans_once(monkeypatch):
    model = flatten_cnn()
    fast = onnx_mini.prepare(model)
    calls = []
    real = onnx_mini.engine.prepare_plan
    monkeypatch.setattr(onnx_mini.engine, "prepare_plan", lambda *a, **k: calls.append(1) or real(*a, **k))
    x = np.ones((2, 3, 12, 12), np.float32)
    for _ in range(5):
        fast.run([x])
    assert len(calls) == 1
    fast.run([np.ones((1, 3, 12, 12), np.float32)])
    assert len(calls) == 2


def test_signature_cap_falls_back_to_the_general_plan(monkeypatch):
    monkeypatch.setattr(specialize, "MAX_SIGNATURES", 2)
    model = flatten_cnn()
    rng = np.random.default_rng(2)
    feeds = [[rng.standard_normal((n, 3, 12, 12)).astype(np.float32)] for n in (1, 2, 3, 4, 2)]
    fast = same_as_written(model, feeds)
    assert len(fast._specializers[id(fast.plan)]._plans) == 2


def test_data_dependent_shapes_are_not_frozen():
    """NonZero's output shape depends on the values: Shape after it must stay a run-time step."""
    nodes = [helper.make_node("NonZero", ["x"], ["nz"]),
             helper.make_node("Shape", ["nz"], ["s"]),
             helper.make_node("Shape", ["x"], ["sx"]),
             helper.make_node("Concat", ["s", "sx"], ["y"], axis=0)]
    model = make(nodes, [tensor("x", ["N"])], [tensor("y", None, TensorProto.INT64)])
    feeds = [[np.array([1, 0, 2], np.float32)], [np.array([0, 0, 3], np.float32)], [np.zeros(3, np.float32)]]
    fast = same_as_written(model, feeds)
    assert [r[0].tolist() for r in map(fast.run, feeds)] == [[1, 2, 3], [1, 1, 3], [1, 0, 3]]


def test_window_shapes_match_the_kernels():
    """Conv / MaxPool / AveragePool output shapes inferred for folding equal the kernels' results,
    over pads, strides, dilations, auto_pad and ceil_mode."""
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.standard_normal((2, 1, 3, 2)).astype(np.float32), "w")
    for op, auto_pad, stride, dil, ceil in itertools.product(
            ("Conv", "MaxPool", "AveragePool"), ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"), (1, 2, 3),
            (1, 2), (0, 1)):
        if (op == "Conv" and ceil) or (op == "AveragePool" and dil == 2):
            continue
        attrs = dict(auto_pad=auto_pad, strides=[stride, stride])
        if auto_pad == "NOTSET":
            attrs["pads"] = [1, 0, 2, 1]
        if op != "AveragePool":
            attrs["dilations"] = [dil, dil]
        if op == "Conv":
            node = helper.make_node("Conv", ["x", "w"], ["c"], **attrs)
        else:
            node = helper.make_node(op, ["x"], ["c"], kernel_shape=[3, 2], ceil_mode=ceil, **attrs)
        nodes = [node, helper.make_node("Shape", ["c"], ["y"])]
        model = make(nodes, [tensor("x", ["N", 1, "H", "W"])], [tensor("y", None, TensorProto.INT64)],
                     [w] if op == "Conv" else [])
        fast = same_as_written(model, [[np.ones((1, 1, h, 9), np.float32)] for h in (7, 8)])
        assert all("Shape" not in {i.op_type for i in p.infos} for p in plans(fast).values()), (op, attrs)


def test_sequence_inputs_keep_the_general_plan():
    nodes = [helper.make_node("SequenceAt", ["seq", "zero"], ["t"]),
             helper.make_node("Shape", ["t"], ["y"])]
    seq = helper.make_tensor_sequence_value_info("seq", TensorProto.FLOAT, None)
    zero = numpy_helper.from_array(np.array(0, np.int64), "zero")
    model = make(nodes, [seq], [tensor("y", None, TensorProto.INT64)], [zero])
    fast = onnx_mini.prepare(model)
    assert fast.run([[np.ones((2, 5), np.float32)]])[0].tolist() == [2, 5]
    assert plans(fast) == {}


def test_session_and_intermediate_outputs_are_specialised_too():
    model = flatten_cnn()
    sess = onnx_mini.InferenceSession(model.SerializeToString())
    x = np.random.default_rng(4).standard_normal((2, 3, 12, 12)).astype(np.float32)
    y, s = sess.run(["y", "s"], {"x": x})
    assert s.tolist() == [2, 4, 3, 3]
    np.testing.assert_array_equal(y, onnx_mini.prepare(model, optimize=False).run([x])[0])


# -- pass-through nodes --------------------------------------------------------------------------

def passthrough_model(dropout_mode=None, identity_is_output=False):
    inits = [numpy_helper.from_array(np.array([2, 6], np.int64), "same"),
             numpy_helper.from_array(np.array(1.5, np.float32), "ratio")]
    drop_inputs = ["i", "ratio"]
    if dropout_mode is not None:
        inits.append(numpy_helper.from_array(np.array(dropout_mode), "mode"))
        drop_inputs.append("mode")
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Identity", ["r"], ["i"]),
             helper.make_node("Dropout", drop_inputs, ["d"], seed=1),
             helper.make_node("Reshape", ["d", "same"], ["rs"]),
             helper.make_node("Neg", ["rs"], ["y"])]
    outputs = [tensor("y", None)] + ([tensor("i", None)] if identity_is_output else [])
    return make(nodes, [tensor("x", [2, 6])], outputs, inits)


def ops_of(prepared):
    return [i.op_type for i in prepared.plan.infos]


def test_identity_dropout_and_same_shape_reshape_are_bypassed():
    x = np.arange(-6, 6, dtype=np.float32).reshape(2, 6)
    for mode in (None, False):
        fast = same_as_written(passthrough_model(mode), [[x]])
        assert ops_of(fast) == ["Relu", "Neg"]
        np.testing.assert_array_equal(fast.run([x])[0], -np.maximum(x, 0))


def test_passthrough_kept_where_it_matters():
    x = np.arange(-6, 6, dtype=np.float32).reshape(2, 6)
    fast = same_as_written(passthrough_model(identity_is_output=True), [[x]])
    assert "Identity" in ops_of(fast)           # its output is a graph output
    # training-mode Dropout draws random numbers: never bypassed
    assert "Dropout" in ops_of(onnx_mini.prepare(passthrough_model(True)))


def test_identity_read_by_a_subgraph_is_kept():
    then = helper.make_graph([helper.make_node("Neg", ["i"], ["o"])], "then", [], [tensor("o", None)])
    other = helper.make_graph([helper.make_node("Abs", ["i"], ["o2"])], "else", [], [tensor("o2", None)])
    nodes = [helper.make_node("Identity", ["x"], ["i"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    model = make(nodes, [tensor("x", [3]), tensor("c", [], TensorProto.BOOL)], [tensor("y", None)])
    x = np.array([-1, 2, -3], np.float32)
    fast = same_as_written(model, [[x, np.array(True)], [x, np.array(False)]])
    assert "Identity" in ops_of(fast)


def test_chain_benchmark_model_specialises_to_half_the_steps():
    """bench_core's 1000-node chain: Shape/Reshape round trips go once shapes are known."""
    import sys
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import bench_core
    finally:
        sys.path.pop(0)
    model = bench_core.chain_model(40)
    x = np.random.default_rng(5).standard_normal((2, 3)).astype(np.float32)
    fast = same_as_written(model, [[x]])
    (plan,) = plans(fast).values()
    assert len(fast.plan.steps) == 40 and sorted({i.op_type for i in plan.infos}) == ["Add", "GatherElements"]
    assert len(plan.steps) == 20
    # its Adds ([2, 3]: nothing to write in place) run their kernel bare after the first run (inplace.probe)
    assert not any(hasattr(fn, "regular") for fn, *_ in plan.steps)


def test_profile_shows_the_specialised_plan():
    model = flatten_cnn()
    x = np.ones((2, 3, 12, 12), np.float32)
    prof = onnx_mini.profile(model, [x], runs=2)
    ops = {n.op_type for n in prof.nodes}
    assert "Shape" not in ops and "Conv" in ops
    assert "Shape" in {n.op_type for n in onnx_mini.profile(model, [x], runs=1, optimize=False).nodes}
