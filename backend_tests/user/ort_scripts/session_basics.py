"""An onnxruntime script: options, providers, the model's description, runs (all outputs, one, with
RunOptions). The test runs it unchanged with `onnxruntime` bound to onnx_mini and, when installed,
to onnxruntime, and compares RESULTS."""
import os
import tempfile

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper, save

RESULTS = {}
W = np.array([[1, -1, 0.5], [0, 2, -1], [-1, 0, 1], [0.5, 0.5, 0.5]], np.float32)
B = np.array([0.1, -0.2, 0.3], np.float32)

with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "classifier.onnx")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["features", "w"], ["xw"], name="dense"),
         helper.make_node("Add", ["xw", "b"], ["logits"], name="bias"),
         helper.make_node("Softmax", ["logits"], ["scores"], axis=-1, name="softmax"),
         helper.make_node("ArgMax", ["logits"], ["label"], axis=1, keepdims=0, name="argmax")],
        "classifier", [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 3]),
         helper.make_tensor_value_info("label", TensorProto.INT64, ["batch"])],
        [numpy_helper.from_array(W, "w"), numpy_helper.from_array(B, "b")])
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)

    ort.set_default_logger_severity(3)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    sess = ort.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])

    RESULTS["device"] = ort.get_device()
    RESULTS["cpu_available"] = "CPUExecutionProvider" in ort.get_available_providers()
    RESULTS["providers"] = sess.get_providers()
    RESULTS["inputs"] = [(i.name, i.type, i.shape) for i in sess.get_inputs()]
    RESULTS["outputs"] = [(o.name, o.type, o.shape) for o in sess.get_outputs()]

    x = np.array([[1, 2, 3, 4], [-1, 0, 1, 0], [0.5, -0.5, 2, 1]], np.float32)
    name = sess.get_inputs()[0].name
    RESULTS["all"] = sess.run(None, {name: x})
    RESULTS["scores_only"] = sess.run(["scores"], {name: x})
    RESULTS["label_with_run_options"] = sess.run(["label"], {name: x}, ort.RunOptions())
