"""An onnxruntime script using IOBinding: CPU inputs, outputs the run allocates, a preallocated
output OrtValue, the pointer forms with OrtValue.data_ptr(), rebinding (a binding's outputs are
written again in place by its later runs)."""
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
         helper.make_node("Sigmoid", ["logits"], ["scores"], name="sigmoid"),
         helper.make_node("ArgMax", ["logits"], ["label"], axis=1, keepdims=0, name="argmax")],
        "model", [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 3]),
         helper.make_tensor_value_info("label", TensorProto.INT64, ["batch"])],
        [numpy_helper.from_array(W, "w")])
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    x = np.array([[1, -2, 0.5, 3], [0, 1, -1, 2]], np.float32)

    binding = sess.io_binding()
    binding.bind_cpu_input("features", x)
    binding.bind_output("scores")
    binding.bind_output("label", "cpu", 0)
    binding.synchronize_inputs()
    sess.run_with_iobinding(binding)
    binding.synchronize_outputs()
    RESULTS["copied"] = binding.copy_outputs_to_cpu()
    # views of the outputs: the binding's later runs write into them while the shapes stay the same
    RESULTS["views"] = [(v.data_type(), v.shape(), v.numpy()) for v in binding.get_outputs()]

    # a preallocated output and an OrtValue input
    xv = ort.OrtValue.ortvalue_from_numpy(x)
    scores = ort.OrtValue.ortvalue_from_shape_and_type([2, 3], np.float32)
    preallocated = sess.io_binding()
    preallocated.bind_ortvalue_input("features", xv)
    preallocated.bind_ortvalue_output("scores", scores)
    sess.run_with_iobinding(preallocated)
    RESULTS["preallocated"] = scores.numpy().copy()
    RESULTS["preallocated_returned"] = preallocated.get_outputs()[0].numpy()

    # the pointer forms, with pointers onnx_mini and onnxruntime both understand
    doubled = ort.OrtValue.ortvalue_from_numpy(x * 2)
    out = np.zeros((2, 3), np.float32)
    out_value = ort.OrtValue.ortvalue_from_numpy(out)
    pointers = sess.io_binding()
    pointers.bind_input("features", "cpu", 0, np.float32, doubled.shape(), doubled.data_ptr())
    pointers.bind_output("scores", "cpu", 0, np.float32, [2, 3], out_value.data_ptr())
    sess.run_with_iobinding(pointers)
    RESULTS["into_pointer"] = out.copy()

    # rebinding: new input, then fewer outputs
    binding.clear_binding_inputs()
    binding.bind_cpu_input("features", x + 1)
    sess.run_with_iobinding(binding)
    RESULTS["rebound"] = binding.copy_outputs_to_cpu()
    binding.clear_binding_outputs()
    binding.bind_output("label")
    sess.run_with_iobinding(binding, ort.RunOptions())
    RESULTS["one_output"] = binding.copy_outputs_to_cpu()
