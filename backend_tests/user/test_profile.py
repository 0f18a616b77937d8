"""onnx_mini.profile: per-node and per-op-type times and calls, live bytes, and the four outputs."""
import html
import json
import re
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_mini
from helpers import REPO, control_flow_feeds, control_flow_model
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
    assert header.split() == ["op", "type", "nodes", "calls/run", "ms/run", "ms/call", "%"]
    double = prof.nodes[0]       # every figure per run: 3 runs, one call each
    row = next(line for line in prof.table().splitlines() if line.startswith("double "))
    assert row.split()[2:5] == ["1", f"{double.mean_s * 1e3:.3f}", f"{double.total_s / 3 * 1e3:.3f}"]
    assert "self %" not in text          # no bodies: no self column
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
    assert page.count("<script>") == 1 and "src=" not in page and "href=" not in page    # inline only
    for name in ("double", "square", "fold", "relu", "Reshape"):
        assert name in page


def _node_rows(page: str) -> list[list[str]]:
    """The node table's rows as lists of cell texts (the last table of the page)."""
    table = page[page.rindex("<table"):]
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", table[table.index("<tbody>"):], re.S)
    return [[html.unescape(re.sub(r"<[^>]+>", "", c)) for c in re.findall(r"<td[^>]*>(.*?)</td>", r, re.S)]
            for r in rows]


def test_html_slowest_first_per_run_and_highlighted(prof, tmp_path):
    prof.to_html(tmp_path / "p.html")
    page = (tmp_path / "p.html").read_text()
    rows = _node_rows(page)
    per_run = [float(r[5]) for r in rows]                  # ms/run
    assert per_run == sorted(per_run, reverse=True) and len(rows) == 4
    assert [r[1] for r in rows] == [n.name for n in prof.slowest()]
    first = prof.slowest()[0]
    assert rows[0][5] == f"{first.total_s / 3 * 1e3:.3f}" and rows[0][4] == f"{first.mean_s * 1e3:.3f}"
    # the # column keeps plan order, for sorting back to it
    assert sorted(int(r[0]) for r in rows) == [0, 1, 2, 3]
    # the bars are per run too, with their unit
    group = prof.by_op_type()[0]
    assert f"{group.total_s / 3 * 1e3:.3f} ms/run" in page
    # rows of >= 10% of the run stand out; here each of the 4 nodes is one of them or not, by its share
    hot = re.findall(r'<tr class="hot">', page)
    assert len(hot) == sum(1 for n in prof.nodes if 100 * n.total_s / prof.node_time_s >= 10)
    assert "onclick" not in page and 'addEventListener("click"' in page      # header clicks sort


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
    # the body's nodes have rows of their own, under the Loop, once per word (5 words) per run
    body = [n for n in p.nodes if n.parent == loop.path]
    assert body and all(n.path.startswith(loop.path + "/body/") for n in body)
    assert {n.op_type for n in body} >= {"Gather", "Equal", "If"}
    assert all(n.calls_per_run == 5 for n in body)
    branch = next(n for n in body if n.op_type == "If")
    assert any(n.parent == branch.path for n in p.nodes)        # and the If's branch, one level deeper
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


# -- bodies: If branches, Loop and Scan bodies, nested -------------------------------------------------

TREE = ["Loop_0", "Loop_0/body/Identity_0", "Loop_0/body/Add_1", "Loop_0/body/Mod_2", "Loop_0/body/Equal_3",
        "Loop_0/body/If_4", "Loop_0/body/If_4/then_branch/Mul_0", "Loop_0/body/If_4/else_branch/Neg_0",
        "choose", "choose/then_branch/twice", "scan", "scan/body/accumulate", "scan/body/Neg_1"]
PER_RUN = {"Loop_0": 1, "Loop_0/body/Add_1": 3, "Loop_0/body/If_4": 3, "Loop_0/body/If_4/then_branch/Mul_0": 2,
           "Loop_0/body/If_4/else_branch/Neg_0": 1, "choose": 1, "choose/then_branch/twice": 1, "scan": 1,
           "scan/body/accumulate": 3, "scan/body/Neg_1": 3}


@pytest.fixture(scope="module")
def nested() -> Profile:
    return onnx_mini.profile(control_flow_model(), control_flow_feeds(True), runs=3, warmup=1)


def test_body_nodes_have_rows_by_path_with_calls_per_run(nested):
    p = nested
    by_path = {n.path: n for n in p.nodes}
    assert [n.path for n in p.nodes] == TREE                  # each node followed by its bodies' nodes
    for path, calls in PER_RUN.items():
        n = by_path[path]
        assert (n.calls_per_run, n.calls) == (calls, 3 * calls), path
        assert n.per_run_s == pytest.approx(n.total_s / 3) and n.mean_s == pytest.approx(n.total_s / n.calls)
    mul = by_path["Loop_0/body/If_4/then_branch/Mul_0"]
    assert (mul.depth, mul.parent, mul.index, mul.name, mul.op_type) == (2, "Loop_0/body/If_4", 0, "", "Mul")
    assert by_path["Loop_0/body/Add_1"].index == 1 and by_path["scan/body/accumulate"].name == "accumulate"
    assert by_path["Loop_0/body/Add_1"].outputs == ["float32[4]"]
    assert by_path["Loop_0"].live_bytes > 0 and by_path["Loop_0/body/Add_1"].live_bytes is None
    assert p.body_nodes == 10


def test_body_times_are_not_counted_twice(nested):
    p = nested
    by_path = {n.path: n for n in p.nodes}
    top = [n for n in p.nodes if n.depth == 0]
    assert p.node_time_s == pytest.approx(sum(n.total_s for n in top)) and p.node_time_s <= sum(p.run_times)
    for n in p.nodes:        # a parent's time holds its bodies' nodes; self time is the rest
        children = [c for c in p.nodes if c.parent == n.path]
        assert n.total_s >= sum(c.total_s for c in children) > 0 or not children
        assert n.self_s == pytest.approx(max(n.total_s - sum(c.total_s for c in children), 0.0))
    # op types add self times: their shares sum to the whole, If and Loop only their own overhead
    groups = {g.op: g for g in p.by_op_type()}
    assert sum(g.total_s for g in groups.values()) == pytest.approx(p.node_time_s)
    assert groups["Loop"].total_s == pytest.approx(by_path["Loop_0"].self_s)
    assert groups["If"].nodes == 2 and groups["If"].calls == 3 * (3 + 1)
    assert groups["Add"].nodes == 3 and groups["Add"].calls == 3 * (3 + 1 + 3)
    data = p.to_dict()
    assert sum(o["share"] for o in data["op_types"]) == pytest.approx(1)
    shares = {n["path"]: n["share"] for n in data["nodes"]}
    assert sum(shares[n.path] for n in top) == pytest.approx(1)


def test_body_rows_in_table_json_trace_and_html(nested, tmp_path):
    p = nested
    text = p.table(top=20)
    assert "3 run(s)" in text and "3 nodes (+ 10 in subgraphs)" in text
    header = next(line for line in text.splitlines() if line.startswith("node "))
    assert header.split() == ["node", "op", "calls/run", "ms/call", "ms/run", "%", "self", "%", "live", "after",
                              "outputs"]
    row = next(line for line in text.splitlines() if line.startswith("Loop_0/body/If_4/then_branch/Mul_0 "))
    assert row.split()[1:3] == ["Mul-14", "2"] and row.split()[-2:] == ["-", "float32[4]"]

    p.to_json(tmp_path / "p.json")
    nodes = {n["path"]: n for n in json.loads((tmp_path / "p.json").read_text())["nodes"]}
    assert set(nodes) == set(TREE)
    add = nodes["Loop_0/body/Add_1"]
    assert (add["parent"], add["depth"], add["calls"], add["calls_per_run"], add["live_bytes"]) == (
        "Loop_0", 1, 9, 3, None)
    assert add["ms_per_run"] == pytest.approx(add["total_ms"] / 3)

    p.to_chrome_trace(tmp_path / "t.json")
    events = [e for e in json.loads((tmp_path / "t.json").read_text())["traceEvents"]
              if e["ph"] == "X" and e["cat"] != "run"]
    assert len(events) == 3 * sum(PER_RUN.get(path, 3 if path.startswith("Loop_0/body/") else 1) for path in TREE)
    assert sum(e["args"]["path"] == "Loop_0/body/Add_1" for e in events) == 9
    for e in events:          # a body's node lies within its parent's span in the same run
        parent = next((n.parent for n in p.nodes if n.path == e["args"]["path"]), None)
        if parent is None:
            continue
        assert any(q["args"]["path"] == parent and q["args"]["run"] == e["args"]["run"]
                   and q["ts"] <= e["ts"] and e["ts"] + e["dur"] <= q["ts"] + q["dur"] for q in events), e
    assert {e["name"] for e in events if e["args"]["path"].split("/")[0] == "scan"} == {"scan", "accumulate", "Neg_1"}
    counters = [e for e in json.loads((tmp_path / "t.json").read_text())["traceEvents"] if e["ph"] == "C"]
    assert len(counters) == 3 * 3          # live bytes: the model graph's nodes only

    p.to_html(tmp_path / "p.html")
    page = (tmp_path / "p.html").read_text()
    rows = _node_rows(page)
    assert sorted(r[1] for r in rows) == sorted(TREE)
    per_run = [float(r[5]) for r in rows]
    assert per_run == sorted(per_run, reverse=True)
    calls = {r[1]: r[3] for r in rows}
    assert calls["Loop_0/body/If_4/then_branch/Mul_0"] == "2" and calls["Loop_0/body/Add_1"] == "3"
    assert 'style="padding-left:40px">Loop_0/body/If_4/then_branch/Mul_0<' in page      # indented by depth


# -- fused nodes name what they replaced ---------------------------------------------------------------

def conv_bn_relu(names=("conv", "bn", "relu")) -> onnx.ModelProto:
    w = numpy_helper.from_array(np.linspace(-1, 1, 4 * 3 * 9, dtype=np.float32).reshape(4, 3, 3, 3), "W")
    bn = [numpy_helper.from_array(np.full(4, v, np.float32), n) for n, v in
          (("scale", 2.0), ("bias", 0.5), ("mean", 0.1), ("var", 1.0))]
    graph = helper.make_graph(
        [helper.make_node("Conv", ["X", "W"], ["C"], name=names[0], pads=[1, 1, 1, 1]),
         helper.make_node("BatchNormalization", ["C", "scale", "bias", "mean", "var"], ["B"], name=names[1]),
         helper.make_node("Relu", ["B"], ["Y"], name=names[2])],
        "fused", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 3, 6, 6])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 4, 6, 6])], [w, *bn])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def test_fused_node_names_the_nodes_it_replaced(tmp_path):
    x = np.linspace(-1, 1, 108, dtype=np.float32).reshape(1, 3, 6, 6)
    p = onnx_mini.profile(conv_bn_relu(), {"X": x}, runs=2)
    (n,) = p.nodes                          # BatchNormalization folded into the Conv, then Relu fused
    assert (n.domain, n.op_type, n.fused_from) == ("onnx_mini.fused", "Conv", ("conv", "bn", "relu"))
    assert n.label == "conv/Conv (conv + bn + relu)" and n.label in p.table()
    p.to_json(tmp_path / "p.json")
    assert json.loads((tmp_path / "p.json").read_text())["nodes"][0]["fused_from"] == ["conv", "bn", "relu"]
    p.to_chrome_trace(tmp_path / "t.json")
    events = [e for e in json.loads((tmp_path / "t.json").read_text())["traceEvents"] if e.get("cat") == n.op]
    assert len(events) == 2 and all(e["args"]["fused_from"] == ["conv", "bn", "relu"] for e in events)
    p.to_html(tmp_path / "p.html")
    assert "conv/Conv (conv + bn + relu)" in (tmp_path / "p.html").read_text()
    # unnamed nodes: `<OpType>@<position in the graph>`; the fused node itself `<OpType>_<step>`
    (u,) = onnx_mini.profile(conv_bn_relu(("", "", "")), {"X": x}, runs=1).nodes
    assert u.label == "Conv_0 (Conv@0 + BatchNormalization@1 + Relu@2)"
    # as written: nothing fused, nothing to name
    raw = onnx_mini.profile(conv_bn_relu(), {"X": x}, runs=1, optimize=False)
    assert [(m.path, m.fused_from) for m in raw.nodes] == [("conv", ()), ("bn", ()), ("relu", ())]
