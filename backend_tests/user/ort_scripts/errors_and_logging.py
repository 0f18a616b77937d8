"""An onnxruntime script's error handling and logger settings: a missing input is a ValueError, other
bad requests raise, an invalid logger severity raises, a GPU device raises a RuntimeError on a CPU
build; the session keeps working after each."""
import os
import tempfile

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, save

RESULTS = {}


def raises(f, kind=Exception):
    try:
        f()
    except kind:
        return True
    return False


with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "model.onnx")
    graph = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["y"], name="neg")], "model",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    x = np.array([1.5, -2], np.float32)

    RESULTS["missing_input_is_value_error"] = raises(lambda: sess.run(None, {}), ValueError)
    RESULTS["unknown_input_raises"] = raises(lambda: sess.run(None, {"x": x, "bogus": x}))
    RESULTS["unknown_output_raises"] = raises(lambda: sess.run(["nope"], {"x": x}))
    RESULTS["wrong_type_raises"] = raises(lambda: sess.run(None, {"x": x.astype(np.float64)}))
    RESULTS["wrong_shape_raises"] = raises(lambda: sess.run(None, {"x": np.zeros(3, np.float32)}))
    RESULTS["severity_5_raises"] = raises(lambda: ort.set_default_logger_severity(5))
    RESULTS["severity_minus_1_raises"] = raises(lambda: ort.set_default_logger_severity(-1))
    ort.set_default_logger_severity(4)
    ort.set_default_logger_verbosity(1)
    ort.set_default_logger_severity(2)
    RESULTS["gpu_value_is_runtime_error"] = raises(lambda: ort.OrtValue.ortvalue_from_numpy(x, "cuda", 0), RuntimeError)
    RESULTS["still_runs"] = sess.run(None, {"x": x})[0]
