"""optimize/scan_hoist.py: a Scan body's MatMul of a scan input by a matrix the body does not compute,
hoisted out of the loop as one MatMul over the whole scan input. Checked on the rewritten graph's
nodes, against a by-hand numpy recurrence and the graph run as written (optimize=False), and on the
graphs where it must not fire."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_mini
from onnx_mini import loader
from onnx_mini.optimize import optimize_graph, with_fused_domain
from helpers import F, init, model

pytestmark = pytest.mark.filterwarnings("error::onnx_mini.optimize.OptimizationWarning")
RNG = np.random.default_rng(11)
HIDDEN, N_IN = 6, 4


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def cell(x_reader="MatMul", w="wx", extra=(), body_inits=(), row=(1,), x_row=None):
    """The body of h = Tanh(x_t Wx + h Wh + b) (y = Identity(h)); `extra` nodes appended, `x_row` the
    declared shape of the scan input's element."""
    first = (helper.make_node("MatMul", ["cell_x", w], ["xw"]) if x_reader == "MatMul"
             else helper.make_node("MatMul", [w, "cell_x"], ["xw"]))
    nodes = [first, helper.make_node("MatMul", ["cell_h", "wh"], ["hw"]),
             helper.make_node("Add", ["xw", "hw"], ["pre0"]), helper.make_node("Add", ["pre0", "b"], ["pre"]),
             helper.make_node("Tanh", ["pre"], ["cell_h_out"]),
             helper.make_node("Identity", ["cell_h_out"], ["cell_y"]), *extra]
    outs = [helper.make_tensor_value_info("cell_h_out", F, [*row, HIDDEN]),
            helper.make_tensor_value_info("cell_y", F, [*row, HIDDEN])]
    outs += [helper.make_tensor_value_info(n.output[0], F, None) for n in extra]
    return helper.make_graph(nodes, "rnn_cell",
                             [helper.make_tensor_value_info("cell_h", F, [*row, HIDDEN]),
                              helper.make_tensor_value_info("cell_x", F, x_row or [*row, N_IN])],
                             outs, list(body_inits))


def rnn_model(body, x_shape, opset=21, extra_outputs=(), wx_shape=(N_IN, HIDDEN), h_shape=(1, HIDDEN), **attrs):
    nodes = [helper.make_node("Scan", ["h0", "x"], ["h_last", "y", *extra_outputs], body=body,
                              num_scan_inputs=1, **attrs)]
    inits = [init("wx", rand(*wx_shape)), init("wh", rand(HIDDEN, HIDDEN) * 0.3), init("b", rand(HIDDEN))]
    return model(nodes, [("h0", F, list(h_shape)), ("x", F, list(x_shape))],
                 [("h_last", F, None), ("y", F, None), *[(o, F, None) for o in extra_outputs]], inits,
                 opset=opset)


def weights(m):
    return {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}


def optimized(m):
    loaded = loader.load(m)
    return optimize_graph(loaded.graph, with_fused_domain(loaded.opsets), static_inputs=True)


def recurrence(x_rows, h, w):
    """By hand: the states after each element, in the order the body reads them."""
    ys = []
    for x_t in x_rows:
        h = np.tanh(x_t.astype(np.float64) @ w["wx"] + h @ w["wh"] + w["b"])
        ys.append(h)
    return h, np.stack(ys)


def run_both(m, feeds):
    got = onnx_mini.prepare(m).run(feeds)
    ref = onnx_mini.prepare(m, optimize=False).run(feeds)
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype and g.shape == r.shape
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)
    return got


def test_hoisted_on_the_scan_rnn_shape():
    """Outside: MatMul(x, wx) feeding the Scan; inside: that MatMul gone, its output the body's input
    (declared as the product's row), wx no longer captured, and the Identity making y gone (the
    body's outputs both name h); results those of the recurrence."""
    m = rnn_model(cell(), (5, 1, N_IN))
    g = optimized(m)
    assert [n.op_type for n in g.nodes] == ["MatMul", "Scan"]
    mm, scan = g.nodes
    assert mm.inputs == ("x", "wx") and scan.inputs == ("h0", mm.outputs[0])
    body = scan.attrs["body"]
    assert [n.op_type for n in body.nodes] == ["MatMul", "Add", "Add", "Tanh"]     # y = Identity(h) too
    assert body.nodes[0].inputs == ("cell_h", "wh")
    assert [v.name for v in body.outputs] == ["cell_h_out", "cell_h_out"]
    assert [v.name for v in body.inputs] == ["cell_h", "xw"]
    assert body.inputs[1].type.shape == (1, HIDDEN)
    assert set(scan.captures) == {"wh", "b"}
    feeds = {"h0": rand(1, HIDDEN), "x": rand(5, 1, N_IN)}
    h_last, y = run_both(m, feeds)
    want_h, want_y = recurrence(feeds["x"], feeds["h0"], weights(m))
    np.testing.assert_allclose(h_last, want_h, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-6)
    assert np.ptp(y[-1]) > 0.1


@pytest.mark.parametrize("axis,direction,out_direction", [(1, 0, 0), (1, 1, 0), (-2, 1, 1), (0, 1, 0)])
def test_scan_axes_and_directions_are_kept(axis, direction, out_direction):
    """A batch of 2 rows scanned along axis 1 (or -2), forward or reverse, the outputs forward or
    reverse: the hoisted product keeps the scan axis and direction as written."""
    if axis == 0:
        x_shape, row = (5, 2, N_IN), (2,)
    else:
        x_shape, row = (2, 5, N_IN), (2,)
    m = rnn_model(cell(row=row), x_shape, h_shape=(2, HIDDEN), scan_input_axes=[axis],
                  scan_input_directions=[direction], scan_output_directions=[out_direction])
    assert [n.op_type for n in optimized(m).nodes] == ["MatMul", "Scan"]
    feeds = {"h0": rand(2, HIDDEN), "x": rand(*x_shape)}
    h_last, y = run_both(m, feeds)
    rows = np.moveaxis(feeds["x"], axis, 0)
    want_h, want_y = recurrence(rows[::-1] if direction else rows, feeds["h0"], weights(m))
    np.testing.assert_allclose(h_last, want_h, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(y, want_y[::-1] if out_direction else want_y, rtol=1e-5, atol=1e-6)


def test_one_dimensional_rows():
    """x [T, K] scanned along axis 0: rows [K], products [N] (MatMul of a vector)."""
    m = rnn_model(cell(row=()), (5, N_IN), h_shape=(HIDDEN,))
    g = optimized(m)
    assert [n.op_type for n in g.nodes] == ["MatMul", "Scan"]
    assert g.nodes[1].attrs["body"].inputs[1].type.shape == (HIDDEN,)
    feeds = {"h0": rand(HIDDEN), "x": rand(5, N_IN)}
    h_last, y = run_both(m, feeds)
    np.testing.assert_allclose(y, recurrence(feeds["x"], feeds["h0"], weights(m))[1], rtol=1e-5, atol=1e-6)


def test_body_initializer_matrix_moves_out():
    """A matrix held by the body itself becomes an outer initializer of the same value."""
    wx = rand(N_IN, HIDDEN)
    m = rnn_model(cell(w="inner_w", body_inits=[init("inner_w", wx)]), (5, 1, N_IN))
    g = optimized(m)
    assert [n.op_type for n in g.nodes] == ["MatMul", "Scan"]
    np.testing.assert_array_equal(g.initializers[g.nodes[0].inputs[1]], wx)
    feeds = {"h0": rand(1, HIDDEN), "x": rand(5, 1, N_IN)}
    h_last, y = run_both(m, feeds)
    np.testing.assert_allclose(y, recurrence(feeds["x"], feeds["h0"], {**weights(m), "wx": wx})[1],
                               rtol=1e-5, atol=1e-6)


def test_zero_steps_give_the_declared_empty_outputs():
    m = rnn_model(cell(), (0, 1, N_IN))
    feeds = {"h0": rand(1, HIDDEN), "x": rand(0, 1, N_IN)}
    h_last, y = run_both(m, feeds)
    np.testing.assert_array_equal(h_last, feeds["h0"])
    assert y.shape == (0, 1, HIDDEN)


def not_hoisted(m, feeds):
    assert "MatMul" not in [n.op_type for n in optimized(m).nodes]
    run_both(m, feeds)


def test_not_hoisted_when_the_scan_input_is_read_elsewhere_in_the_body():
    feeds = {"h0": rand(1, HIDDEN), "x": rand(5, 1, N_IN)}
    neg = helper.make_node("Neg", ["cell_x"], ["cell_neg"])
    not_hoisted(rnn_model(cell(extra=[neg]), (5, 1, N_IN), extra_outputs=["negs"]), feeds)
    # the scan input passed through as a scan output
    through = helper.make_node("Identity", ["cell_x"], ["cell_x_out"])
    not_hoisted(rnn_model(cell(extra=[through]), (5, 1, N_IN), extra_outputs=["xs"]), feeds)


def test_not_hoisted_when_the_matrix_is_computed_in_the_body():
    feeds = {"h0": rand(1, HIDDEN), "x": rand(5, 1, N_IN)}
    body = cell(w="w2")
    body.node.insert(0, helper.make_node("Neg", ["wx"], ["w2"]))
    not_hoisted(rnn_model(body, (5, 1, N_IN)), feeds)


def test_not_hoisted_for_the_other_operand_order_the_last_axis_or_an_unknown_rank():
    # W @ x_t: x [T, K, 1] rows [K, 1], the product [N, 1]
    body = cell(x_reader="first", w="wxt", row=(), x_row=[N_IN, 1])
    m = model([helper.make_node("Scan", ["h0", "x"], ["h_last", "y"], body=body, num_scan_inputs=1)],
              [("h0", F, [HIDDEN]), ("x", F, [5, N_IN, 1])], [("h_last", F, None), ("y", F, None)],
              [init("wxt", rand(HIDDEN, N_IN)), init("wh", rand(HIDDEN, HIDDEN)), init("b", rand(HIDDEN))])
    assert "MatMul" not in [n.op_type for n in optimized(m).nodes]
    # scanned along the contracted axis: x [K, T], rows [K]
    m = rnn_model(cell(row=()), (N_IN, 5), h_shape=(HIDDEN,), scan_input_axes=[1])
    not_hoisted(m, {"h0": rand(HIDDEN), "x": rand(N_IN, 5)})
    m = rnn_model(cell(row=()), (N_IN, 5), h_shape=(HIDDEN,), scan_input_axes=[-1])
    not_hoisted(m, {"h0": rand(HIDDEN), "x": rand(N_IN, 5)})
    # the scan input's rank unknown before run
    m = rnn_model(cell(), (5, 1, N_IN))
    del m.graph.input[1].type.tensor_type.shape.dim[:]
    m.graph.input[1].type.tensor_type.ClearField("shape")
    not_hoisted(m, {"h0": rand(1, HIDDEN), "x": rand(5, 1, N_IN)})


def test_not_hoisted_for_a_batched_matrix():
    m = rnn_model(cell(), (5, 1, N_IN), wx_shape=(1, N_IN, HIDDEN))
    feeds = {"h0": rand(1, HIDDEN), "x": rand(5, 1, N_IN)}
    assert "MatMul" not in [n.op_type for n in optimized(m).nodes]
    onnx_mini.prepare(m).run(feeds)


def test_opset_8_scan_is_left_as_written():
    """Scan-8 has a batch axis and sequence_lens: not rewritten."""
    body = cell(row=())
    m = model([helper.make_node("Scan", ["", "h0", "x"], ["h_last", "y"], body=body, num_scan_inputs=1)],
              [("h0", F, [1, HIDDEN]), ("x", F, [1, 5, N_IN])], [("h_last", F, None), ("y", F, None)],
              [init("wx", rand(N_IN, HIDDEN)), init("wh", rand(HIDDEN, HIDDEN) * 0.3), init("b", rand(HIDDEN))],
              opset=8, ir_version=3)
    assert [n.op_type for n in optimized(m).nodes] == ["Scan"]
    feeds = {"h0": rand(1, HIDDEN), "x": rand(1, 5, N_IN)}
    h_last, y = run_both(m, feeds)
    np.testing.assert_allclose(y[0], recurrence(feeds["x"][0], feeds["h0"][0], weights(m))[1], rtol=1e-5,
                               atol=1e-6)


def test_two_scan_inputs_both_hoisted():
    """h = Tanh(a_t Wa + c_t Wc + h Wh + b): both projections leave the loop."""
    nodes = [helper.make_node("MatMul", ["cell_a", "wa"], ["aw"]), helper.make_node("MatMul", ["cell_c", "wc"], ["cw"]),
             helper.make_node("MatMul", ["cell_h", "wh"], ["hw"]), helper.make_node("Add", ["aw", "cw"], ["s0"]),
             helper.make_node("Add", ["s0", "hw"], ["s1"]), helper.make_node("Add", ["s1", "b"], ["s2"]),
             helper.make_node("Tanh", ["s2"], ["cell_h_out"]), helper.make_node("Identity", ["cell_h_out"], ["cell_y"])]
    body = helper.make_graph(nodes, "cell2", [helper.make_tensor_value_info(n, F, s) for n, s in
                                              (("cell_h", [1, HIDDEN]), ("cell_a", [1, N_IN]), ("cell_c", [1, 3]))],
                             [helper.make_tensor_value_info(n, F, [1, HIDDEN]) for n in ("cell_h_out", "cell_y")])
    w = {"wa": rand(N_IN, HIDDEN), "wc": rand(3, HIDDEN), "wh": rand(HIDDEN, HIDDEN) * 0.3, "b": rand(HIDDEN)}
    m = model([helper.make_node("Scan", ["h0", "a", "c"], ["h_last", "y"], body=body, num_scan_inputs=2,
                                scan_input_directions=[1, 1])],
              [("h0", F, [1, HIDDEN]), ("a", F, [5, 1, N_IN]), ("c", F, [5, 1, 3])],
              [("h_last", F, None), ("y", F, None)], [init(k, v) for k, v in w.items()])
    g = optimized(m)
    assert [n.op_type for n in g.nodes] == ["MatMul", "MatMul", "Scan"]
    assert [n.op_type for n in g.nodes[2].attrs["body"].nodes].count("MatMul") == 1
    feeds = {"h0": rand(1, HIDDEN), "a": rand(5, 1, N_IN), "c": rand(5, 1, 3)}
    h_last, y = run_both(m, feeds)
    h, ys = feeds["h0"].astype(np.float64), []
    for a_t, c_t in zip(feeds["a"][::-1], feeds["c"][::-1]):
        h = np.tanh(a_t @ w["wa"] + c_t @ w["wc"] + h @ w["wh"] + w["b"])
        ys.append(h)
    np.testing.assert_allclose(y, np.stack(ys), rtol=1e-5, atol=1e-6)


def test_nested_scan_reads_the_matrix_from_the_outer_graph():
    """The Scan inside a Loop body, its scan input and matrix two scopes out: the results of the
    recurrence run twice."""
    scan = helper.make_node("Scan", ["h_in", "x"], ["h_last", "y"], body=cell(), num_scan_inputs=1)
    loop_body = helper.make_graph(
        [scan, helper.make_node("Identity", ["cond_in"], ["cond_out"])], "loop_body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_in", F, [1, HIDDEN])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_last", F, [1, HIDDEN])])
    trip = init("trip", np.array(2, np.int64))
    m = model([helper.make_node("Loop", ["trip", "", "h0"], ["h_final"], body=loop_body)],
              [("h0", F, [1, HIDDEN]), ("x", F, [5, 1, N_IN])], [("h_final", F, None)],
              [trip, init("wx", rand(N_IN, HIDDEN)), init("wh", rand(HIDDEN, HIDDEN) * 0.3), init("b", rand(HIDDEN))])
    feeds = {"h0": rand(1, HIDDEN), "x": rand(5, 1, N_IN)}
    (got,) = run_both(m, feeds)
    w = weights(m)
    h = feeds["h0"]
    for _ in range(2):
        h = recurrence(feeds["x"], h, w)[0]
    np.testing.assert_allclose(got, h, rtol=1e-5, atol=1e-6)


def test_fed_matrix_is_hoisted_too():
    """The matrix a graph input (fed, constant over the Scan): the hoisted MatMul reads it."""
    nodes = [helper.make_node("Scan", ["h0", "x"], ["h_last", "y"], body=cell(), num_scan_inputs=1)]
    m = model(nodes, [("h0", F, [1, HIDDEN]), ("x", F, [5, 1, N_IN]), ("wx", F, [N_IN, HIDDEN])],
              [("h_last", F, None), ("y", F, None)], [init("wh", rand(HIDDEN, HIDDEN) * 0.3), init("b", rand(HIDDEN))])
    g = optimized(m)
    assert [n.op_type for n in g.nodes] == ["MatMul", "Scan"] and g.nodes[0].inputs == ("x", "wx")
    feeds = {"h0": rand(1, HIDDEN), "x": rand(5, 1, N_IN), "wx": rand(N_IN, HIDDEN)}
    h_last, y = run_both(m, feeds)
    np.testing.assert_allclose(y, recurrence(feeds["x"], feeds["h0"], {**weights(m), "wx": feeds["wx"]})[1],
                               rtol=1e-5, atol=1e-6)


def test_negative_axis_before_opset_11_keeps_its_error():
    m = rnn_model(cell(row=(2,)), (2, 5, N_IN), h_shape=(2, HIDDEN), opset=9, scan_input_axes=[-2])
    assert [n.op_type for n in optimized(m).nodes] == ["Scan"]
    with pytest.raises(onnx_mini.errors.OnnxMiniError, match="non-negative"):
        onnx_mini.prepare(m).run({"h0": rand(2, HIDDEN), "x": rand(2, 5, N_IN)})


def test_output_identity_dropped_alone_and_kept_where_it_must_stay():
    """No projection to hoist (x_t read twice): the body output made by an Identity of a computed value
    still names that value; an Identity of a body input, one whose output is also read in the body,
    and one whose output is listed twice stay."""
    feeds = {"h0": rand(1, HIDDEN), "x": rand(5, 1, N_IN)}
    neg = helper.make_node("Neg", ["cell_x"], ["cell_neg"])
    m = rnn_model(cell(extra=[neg]), (5, 1, N_IN), extra_outputs=["negs"])
    (scan,) = optimized(m).nodes
    body = scan.attrs["body"]
    assert "Identity" not in [n.op_type for n in body.nodes] and len(body.nodes) == 6
    assert [v.name for v in body.outputs] == ["cell_h_out", "cell_h_out", "cell_neg"]
    assert [v.type.shape for v in body.outputs[:2]] == [(1, HIDDEN), (1, HIDDEN)]
    h_last, y, negs = run_both(m, feeds)
    np.testing.assert_allclose(y, recurrence(feeds["x"], feeds["h0"], weights(m))[1], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(negs, -feeds["x"])

    def identities(body):
        m = rnn_model(body, (5, 1, N_IN), extra_outputs=[o.name for o in body.output[2:]])
        (scan,) = [n for n in optimized(m).nodes if n.op_type == "Scan"]
        run_both(m, feeds)
        return [n.op_type for n in scan.attrs["body"].nodes].count("Identity")

    through = cell(extra=[helper.make_node("Identity", ["cell_x"], ["cell_x_out"])])
    assert identities(through) == 1            # of a body input (y's Identity of h goes)
    read = cell(extra=[helper.make_node("Neg", ["cell_y"], ["neg_y"])])
    assert identities(read) == 1
    twice = cell()
    twice.output.append(helper.make_tensor_value_info("cell_y", F, [1, HIDDEN]))
    assert identities(twice) == 1
