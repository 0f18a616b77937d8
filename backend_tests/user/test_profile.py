"""onnx_mini.profile: per-node and per-op-type times and calls, live bytes, and the four outputs."""
import json
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_mini
from helpers import REPO
from onnx_mini.errors import InputError
from onnx_mini.profile import Profile, format_bytes

N = 1000   # float32 elements: 4000 bytes per value


def chain_model() -> onnx.ModelProto:
    """X -> Add(X, X) -> Mul(A, A) -> Reshape (a view of B) -> Relu -> Y."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["X", "X"], ["A"], name="double"),
         helper.make_node("Mul", ["A", "A"], ["B"], name="square"),
         helper.make_node("Reshape", ["B", "shape"], ["R"], name="fold"),
         helper.make_node("Relu", ["R"], ["Y"], name="relu")],
        "chain", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [N])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [10, 100])],
        [numpy_helper.from_array(np.array([10, 100], np.int64), "shape")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


@pytest.fixture(scope="module")
def prof() -> Profile:
    x = np.linspace(-1, 1, N, dtype=np.float32)
    return onnx_mini.profile(chain_model(), {"X": x}, runs=3, warmup=1, optimize=False)


def test_public_api():
    assert onnx_mini.profile is sys.modules["onnx_mini.profile"].profile
    assert onnx_mini.Profile is Profile


def test_nodes_calls_and_times(prof):
    assert prof.runs == 3 and len(prof.run_times) == 3
    assert [(n.name, n.op_type, n.version) for n in prof.nodes] == [
        ("double", "Add", 14), ("square", "Mul", 14), ("fold", "Reshape", 21), ("relu", "Relu", 14)]
    assert all(n.calls == 3 for n in prof.nodes)               # the warm-up run is not recorded
    assert all(n.total_s > 0 and n.max_s >= n.mean_s > 0 for n in prof.nodes)
    assert prof.node_time_s <= sum(prof.run_times)
    assert prof.nodes[0].inputs == ["float32[1000]", "float32[1000]"]
    assert prof.nodes[2].outputs == ["float32[10, 100]"]
    groups = prof.by_op_type()
    assert sorted(g.op for g in groups) == ["Add", "Mul", "Relu", "Reshape"]
    assert all(g.nodes == 1 and g.calls == 3 for g in groups)
    assert [g.total_s for g in groups] == sorted((g.total_s for g in groups), reverse=True)


def test_live_bytes_count_each_buffer_once(prof):
    # after Add: X and A; after Mul: A and B (X freed); Reshape's output is a view of B: B's bytes once;
    # after Relu: R (= B's buffer) and Y. The shape initializer is a constant, reported apart.
    assert [n.live_bytes for n in prof.nodes] == [8000, 8000, 4000, 8000]
    assert prof.peak_live_bytes == 8000 and prof.constant_bytes == 16
    assert len(prof.events) == 12 and {e.live_bytes for e in prof.events} == {4000, 8000}


def test_op_types_are_grouped_and_domains_named():
    x = np.zeros((2, 3), np.float32)
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
         helper.make_node("Scaler", ["b"], ["y"], domain="ai.onnx.ml", offset=[0.0], scale=[2.0])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("ai.onnx.ml", 3)])
    p = onnx_mini.profile(model, {"x": x}, runs=2)
    groups = {g.op: g for g in p.by_op_type()}
    assert set(groups) == {"Relu", "ai.onnx.ml::Scaler"}
    assert (groups["Relu"].nodes, groups["Relu"].calls) == (2, 4)
    assert "ai.onnx.ml::Scaler" in p.table()


def test_table(prof):
    text = prof.table(top=2)
    assert text.startswith("chain: 3 run(s), median ")
    assert "peak live values 7.8 KiB (+ 16 B of constants)" in text
    header = next(line for line in text.splitlines() if line.startswith("op type"))
    assert header.split() == ["op", "type", "nodes", "calls", "total", "ms", "mean", "ms", "%"]
    assert "slowest 2 node(s):" in text
    assert sum(line.split()[:1] in (["double"], ["square"], ["fold"], ["relu"]) for line in text.splitlines()) == 2


def test_json(prof, tmp_path):
    prof.to_json(tmp_path / "p.json")
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["model"] == "chain" and data["runs"] == 3 and len(data["run_ms"]) == 3
    assert data["peak_live_bytes"] == 8000 and data["constant_bytes"] == 16
    assert [n["op"] for n in data["nodes"]] == ["Add", "Mul", "Reshape", "Relu"]
    assert abs(sum(o["share"] for o in data["op_types"]) - 1) < 1e-9
    assert data["nodes"][3]["live_bytes"] == 8000 and data["nodes"][0]["calls"] == 3


def test_chrome_trace(prof, tmp_path):
    prof.to_chrome_trace(tmp_path / "t.json")
    trace = json.loads((tmp_path / "t.json").read_text())
    events = trace["traceEvents"]
    runs = [e for e in events if e["ph"] == "X" and e["cat"] == "run"]
    nodes = [e for e in events if e["ph"] == "X" and e["cat"] != "run"]
    assert len(runs) == 3 and len(nodes) == 12
    assert all({"name", "ph", "ts", "dur", "pid", "tid"} <= set(e) for e in runs + nodes)
    assert [e["name"] for e in nodes[:4]] == ["double", "square", "fold", "relu"]
    for e in nodes:    # every node event lies inside its run, in order
        run = runs[e["args"]["run"] - 1]
        assert run["ts"] <= e["ts"] and e["ts"] + e["dur"] <= run["ts"] + run["dur"] + 1
    starts = [e["ts"] for e in nodes]
    assert starts == sorted(starts)
    counters = [e for e in events if e["ph"] == "C"]
    assert len(counters) == 12 and counters[0]["args"] == {"bytes": 8000}
    assert any(e["ph"] == "M" and e["name"] == "process_name" for e in events)


def test_html_is_self_contained(prof, tmp_path):
    prof.to_html(tmp_path / "p.html")
    page = (tmp_path / "p.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and page.count("<svg") == 1 and page.count("<rect") == 4
    assert "<script" not in page and "src=" not in page and "href=" not in page
    for name in ("double", "square", "fold", "relu", "Reshape"):
        assert name in page


def test_html_escapes_names(tmp_path):
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="<b>&")], "<g>",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    onnx_mini.profile(model, {"x": np.ones(1, np.float32)}, runs=1).to_html(tmp_path / "p.html")
    page = (tmp_path / "p.html").read_text()
    assert "&lt;b&gt;&amp;" in page and "<b>&" not in page and "&lt;g&gt;" in page


def test_control_flow_and_sessions():
    sys.path.insert(0, str(REPO / "examples"))
    try:
        import sequence_model
    finally:
        sys.path.pop(0)
    sess = onnx_mini.InferenceSession(sequence_model.build_model().SerializeToString())
    words = sequence_model.encode("the film was great <end>")
    p = onnx_mini.profile(sess, {"words": words}, runs=2, warmup=0)
    loop = next(n for n in p.nodes if n.op_type == "Loop")
    assert loop.calls == 2 and loop.outputs == ["float32[4]", "float32[5, 4]"]
    # the body's nodes are not steps of their own: their time is the Loop's
    assert not {n.op_type for n in p.nodes} & {"If", "Gather", "Equal", "Not", "Tanh", "Identity"}
    prepared = onnx_mini.prepare(chain_model())
    assert len(onnx_mini.profile(prepared, [np.ones(N, np.float32)], runs=1).nodes) >= 1


def test_progress_and_errors():
    calls = []
    onnx_mini.profile(chain_model(), {"X": np.ones(N, np.float32)}, runs=2, warmup=1,
                      progress=lambda done, total: calls.append((done, total)))
    assert calls == [(1, 3), (2, 3), (3, 3)]
    with pytest.raises(ValueError, match="runs must be at least 1"):
        onnx_mini.profile(chain_model(), {"X": np.ones(N, np.float32)}, runs=0)
    with pytest.raises(InputError, match="'X'"):
        onnx_mini.profile(chain_model(), {"X": np.ones(3, np.float32)}, runs=1)


def test_format_bytes():
    assert [format_bytes(n) for n in (0, 1023, 1024, 5 * 2**20, 3 * 2**30)] == [
        "0 B", "1023 B", "1.0 KiB", "5.0 MiB", "3.0 GiB"]


def test_conv_algorithm_shown_per_node(tmp_path):
    """A Conv's row says which algorithm ran (the kernel function's `algorithms`), in the table, the
    JSON and the HTML; a node whose kernel does not say has none."""
    w = np.ones((4, 3, 3, 3), np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["X", "W"], ["C"], name="conv", pads=[1, 1, 1, 1]),
         helper.make_node("Neg", ["C"], ["Y"], name="neg")],
        "conv", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 4, 8, 8])], [numpy_helper.from_array(w, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    x = np.ones((1, 3, 8, 8), np.float32)
    prepared = onnx_mini.prepare(model, optimize=False, conv_algorithm="shifted")
    p = onnx_mini.profile(prepared, {"X": x}, runs=1)
    assert [(n.name, n.algorithm) for n in p.nodes] == [("conv", "shifted"), ("neg", "")]
    assert "Conv-11 [shifted]" in p.table()
    p.to_json(tmp_path / "p.json")
    nodes = json.loads((tmp_path / "p.json").read_text())["nodes"]
    assert nodes[0]["algorithm"] == "shifted" and "algorithm" not in nodes[1]
    p.to_html(tmp_path / "p.html")
    assert "Conv-11 [shifted]" in (tmp_path / "p.html").read_text()
