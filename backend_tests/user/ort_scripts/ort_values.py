"""An onnxruntime script using OrtValue: made from numpy (sharing its memory), from shape and type,
run_with_ort_values, update_inplace, an OrtValue fed to run()."""
import os
import tempfile

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper, save

RESULTS = {}
W = np.array([[1, 0, -1], [2, 1, 0], [0, -1, 1], [1, 1, 1]], np.float32)

with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "model.onnx")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["features", "w"], ["logits"], name="dense"),
         helper.make_node("Relu", ["logits"], ["scores"], name="relu"),
         helper.make_node("ReduceSum", ["scores"], ["total"], keepdims=0, name="total")],
        "model", [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 3]),
         helper.make_tensor_value_info("total", TensorProto.FLOAT, [])],
        [numpy_helper.from_array(W, "w")])
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])

    x = np.arange(8, dtype=np.float32).reshape(2, 4) - 3
    xv = ort.OrtValue.ortvalue_from_numpy(x, "cpu", 0)
    RESULTS["describe"] = (xv.shape(), xv.data_type(), xv.device_name(), xv.is_tensor(), xv.element_type(),
                           xv.has_value(), xv.tensor_size_in_bytes())
    x[0, 0] = 42                                    # the OrtValue shares the array's memory
    RESULTS["shared"] = xv.numpy().copy()
    iv = ort.OrtValue.ortvalue_from_numpy(np.array([1, 2, 3], np.int64))
    RESULTS["int64"] = (iv.data_type(), iv.element_type(), iv.numpy())
    blank = ort.OrtValue.ortvalue_from_shape_and_type([3, 2], np.float32)
    RESULTS["blank"] = (blank.shape(), blank.data_type(), blank.element_type(), blank.numpy().dtype.name)
    typed = ort.OrtValue.ortvalue_from_shape_and_type([2], TensorProto.INT64)
    RESULTS["typed"] = (typed.shape(), typed.data_type(), typed.numpy().dtype.name)

    outs = sess.run_with_ort_values(["scores", "total"], {"features": xv})
    RESULTS["are_ortvalues"] = all(isinstance(o, ort.OrtValue) for o in outs)
    RESULTS["outputs"] = [(o.data_type(), o.shape(), o.numpy()) for o in outs]
    xv.update_inplace(np.ones((2, 4), np.float32))
    RESULTS["after_update"] = sess.run_with_ort_values(None, {"features": xv})[0].numpy()
    RESULTS["run_takes_ortvalue"] = sess.run(["total"], {"features": xv})[0]
