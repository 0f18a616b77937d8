"""A script written for onnxruntime that runs unchanged on onnx_mini.

Everything below the import is plain onnxruntime code: options, providers, the model's description,
a run of every output, a run of one output, runs from several threads, OrtValue and IOBinding, a
profiled session and its JSON trace. Only the import line decides which runtime does the work:

    python examples/ort_swap.py                    # import onnx_mini as ort
    python examples/ort_swap.py --onnxruntime      # import onnxruntime as ort
    python examples/ort_swap.py --save out.npz     # also save every result (the test compares both)

The model (a small classifier with a symbolic batch dimension: MatMul, Add, Relu, MatMul, Softmax,
ArgMax) is built with onnx.helper and saved to a temporary folder, as an exported model would be.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from onnx import TensorProto, helper, numpy_helper, save

if "--onnxruntime" in sys.argv:
    import onnxruntime as ort
else:
    import onnx_mini as ort


def build_model(path: str) -> None:
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((8, 16)).astype(np.float32)
    b1 = rng.standard_normal(16).astype(np.float32)
    w2 = rng.standard_normal((16, 4)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["features", "w1"], ["h"], name="dense1"),
        helper.make_node("Add", ["h", "b1"], ["h_bias"], name="bias1"),
        helper.make_node("Relu", ["h_bias"], ["hidden"], name="relu1"),
        helper.make_node("MatMul", ["hidden", "w2"], ["logits"], name="dense2"),
        helper.make_node("Softmax", ["logits"], ["probabilities"], axis=-1, name="softmax"),
        helper.make_node("ArgMax", ["logits"], ["label"], axis=1, keepdims=0, name="argmax"),
    ]
    graph = helper.make_graph(
        nodes, "tiny_classifier",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("label", TensorProto.INT64, ["batch"]),
         helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(b1, "b1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10,
                              producer_name="ort_swap_example", doc_string="a tiny classifier")
    helper.set_model_props(model, {"classes": "cat,dog,bird,fish"})
    save(model, path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--onnxruntime", action="store_true", help="run with onnxruntime instead of onnx_mini")
    parser.add_argument("--save", help="save every result to this .npz file")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "classifier.onnx")
        build_model(path)

        # ---- from here on: onnxruntime code, untouched ----------------------------------------
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3
        sess = ort.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])

        meta = sess.get_modelmeta()
        classes = meta.custom_metadata_map["classes"].split(",")
        print(f"runtime: {ort.__name__}; providers: {sess.get_providers()}")
        print(f"model: {meta.graph_name} by {meta.producer_name} ({meta.description})")
        for arg in sess.get_inputs():
            print(f"  input  {arg.name}: {arg.type} {arg.shape}")
        for arg in sess.get_outputs():
            print(f"  output {arg.name}: {arg.type} {arg.shape}")

        features = np.random.default_rng(1).standard_normal((5, 8)).astype(np.float32)
        input_name = sess.get_inputs()[0].name
        label, probabilities = sess.run(None, {input_name: features})
        print("labels:", [classes[i] for i in label])
        print("confidence:", " ".join(f"{p:.3f}" for p in probabilities.max(axis=1)))

        (probs_only,) = sess.run(["probabilities"], {input_name: features})
        batches = np.array_split(features, 5)
        with ThreadPoolExecutor(4) as pool:
            threaded = list(pool.map(lambda x: sess.run(["label"], {input_name: x})[0], batches))
        print("threaded labels:", [classes[i] for part in threaded for i in part])

        features_value = ort.OrtValue.ortvalue_from_numpy(features)
        (label_value,) = sess.run_with_ort_values(["label"], {input_name: features_value})
        print(f"OrtValue: {label_value.data_type()} {label_value.shape()} on {label_value.device_name()}")
        binding = sess.io_binding()
        binding.bind_ortvalue_input(input_name, features_value)
        binding.bind_output("probabilities")
        sess.run_with_iobinding(binding)
        (bound_probabilities,) = binding.copy_outputs_to_cpu()

        profiling = ort.SessionOptions()
        profiling.enable_profiling = True
        profiling.profile_file_prefix = os.path.join(tmp, "classifier_profile")
        profiled = ort.InferenceSession(path, sess_options=profiling, providers=["CPUExecutionProvider"])
        for _ in range(3):
            profiled.run(None, {input_name: features})
        with open(profiled.end_profiling()) as f:
            trace = json.load(f)
        node_events = [e for e in trace if e["cat"] == "Node"]
        print(f"profile: {sum(e['name'] == 'model_run' for e in trace)} runs, every node event timed on "
              f"{sorted({e['args']['provider'] for e in node_events})}")
        # ---------------------------------------------------------------------------------------

    assert np.array_equal(probs_only, probabilities)
    assert np.array_equal(np.concatenate(threaded), label)
    assert np.array_equal(label_value.numpy(), label) and np.array_equal(bound_probabilities, probabilities)
    assert node_events and all(e["ph"] == "X" and e["name"].endswith("_kernel_time") for e in node_events)
    if args.save:
        np.savez(args.save, label=label, probabilities=probabilities)
    return 0


if __name__ == "__main__":
    sys.exit(main())
