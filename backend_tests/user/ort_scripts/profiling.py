"""An onnxruntime script profiling a session: enable_profiling with a file prefix, three runs,
end_profiling, and reading the JSON trace it wrote."""
import json
import os
import re
import tempfile

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper, save

RESULTS = {}

with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "model.onnx")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "bias"], ["shifted"], name="add_bias"),
         helper.make_node("Mul", ["shifted", "x"], ["product"], name="scale"),
         helper.make_node("Relu", ["product"], ["y"])],                 # unnamed: onnxruntime names it
        "model", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        [numpy_helper.from_array(np.array([1, -2, 0.5], np.float32), "bias")])
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)

    options = ort.SessionOptions()
    options.enable_profiling = True
    prefix = os.path.join(tmp, "my_profile")
    options.profile_file_prefix = prefix
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    RESULTS["start_ns_set"] = sess.get_profiling_start_time_ns() > 0
    x = np.array([[1, 2, 3], [-1, 0, 1]], np.float32)
    for batch in (x, x[:1], x):
        RESULTS.setdefault("y", []).append(sess.run(None, {"x": batch})[0])
    profile_file = sess.end_profiling()
    RESULTS["file_name"] = bool(re.fullmatch(re.escape(prefix) + r"_\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d_\d{3}\.json",
                                             profile_file))
    RESULTS["ended_twice"] = sess.end_profiling()
    with open(profile_file) as f:
        events = json.load(f)

    RESULTS["event_keys"] = sorted({k for e in events for k in e})
    RESULTS["phases"] = sorted({e["ph"] for e in events})
    RESULTS["categories"] = sorted({e["cat"] for e in events})
    RESULTS["integer_times"] = all(isinstance(e["ts"], int) and isinstance(e["dur"], int) and e["dur"] >= 0
                                   for e in events)
    RESULTS["one_pid"] = len({e["pid"] for e in events}) == 1
    session = [e["name"] for e in events if e["cat"] == "Session"]
    RESULTS["runs"] = session.count("model_run")
    RESULTS["set_up"] = [n for n in session if n in ("model_loading_uri", "session_initialization")]
    nodes = [e for e in events if e["cat"] == "Node"]
    RESULTS["node_names"] = [e["name"] for e in nodes]
    RESULTS["node_args"] = [(a["op_name"], a["provider"], a["node_index"], a["input_type_shape"],
                             a["output_type_shape"], a["activation_size"], a["parameter_size"], a["output_size"])
                            for a in (e["args"] for e in nodes)]
    runs = [e for e in events if e["name"] == "model_run"]
    RESULTS["nodes_inside_runs"] = all(
        any(r["ts"] <= e["ts"] and e["ts"] + e["dur"] <= r["ts"] + r["dur"] + 1 for r in runs) for e in nodes)
