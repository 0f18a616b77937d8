"""A classic machine-learning pipeline in ai.onnx.ml, built with onnx.helper, scored by onnx_mini.

    python examples/ml_pipeline.py

What a scikit-learn pipeline exported to ONNX looks like, written by hand here so that every
weight is visible: measurements with missing values (NaN) and a colour given as a string go
through
  1. Imputer          NaN -> the column's training mean,
  2. Scaler           (x - mean) * 1/std,
  3. OneHotEncoder    the colour string -> three 0/1 columns (Flatten drops the extra axis),
  4. Concat           six features,
  5. LinearClassifier three classes, softmax probabilities and the winning label,
  6. ZipMap           the probabilities as one {label: probability} dict per row.
The script checks every number against numpy, and against onnxruntime when it is installed.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, checker, helper

import onnx_mini

CLASSES = ["apple", "lemon", "plum"]
COLOURS = ["red", "yellow", "purple"]
MEANS = np.array([150.0, 7.0, 0.6], np.float32)          # weight (g), diameter (cm), sugar ratio
STDS = np.array([40.0, 1.5, 0.2], np.float32)
COEF = np.array([[0.8, 0.6, 0.3, 2.0, -1.0, -1.0],        # one row per class, one column per feature
                 [-0.2, 0.1, -1.2, -1.0, 2.5, -1.0],
                 [-0.9, -0.8, 0.4, -0.5, -1.0, 2.2]], np.float32)
INTERCEPTS = np.array([0.1, -0.2, 0.0], np.float32)


def build_model():
    F, S = TensorProto.FLOAT, TensorProto.STRING
    ml = "ai.onnx.ml"
    nodes = [
        helper.make_node("Imputer", ["measures"], ["filled"], domain=ml, name="impute",
                         imputed_value_floats=MEANS.tolist(), replaced_value_float=float("nan")),
        helper.make_node("Scaler", ["filled"], ["scaled"], domain=ml, name="scale",
                         offset=MEANS.tolist(), scale=(1 / STDS).tolist()),
        helper.make_node("OneHotEncoder", ["colour"], ["colour_3d"], domain=ml, name="encode_colour",
                         cats_strings=COLOURS, zeros=1),
        helper.make_node("Flatten", ["colour_3d"], ["colour_onehot"], axis=1),
        helper.make_node("Concat", ["scaled", "colour_onehot"], ["features"], axis=1),
        helper.make_node("LinearClassifier", ["features"], ["label", "probabilities"], domain=ml, name="classify",
                         coefficients=COEF.reshape(-1).tolist(), intercepts=INTERCEPTS.tolist(),
                         classlabels_strings=CLASSES, post_transform="SOFTMAX"),
        helper.make_node("ZipMap", ["probabilities"], ["by_class"], domain=ml, classlabels_strings=CLASSES),
    ]
    graph = helper.make_graph(
        nodes, "fruit_pipeline",
        [helper.make_tensor_value_info("measures", F, ["N", 3]),
         helper.make_tensor_value_info("colour", S, ["N", 1])],
        [helper.make_tensor_value_info("label", S, ["N"]),
         helper.make_tensor_value_info("probabilities", F, ["N", 3]),
         helper.make_value_info("by_class", helper.make_sequence_type_proto(
             helper.make_map_type_proto(S, helper.make_tensor_type_proto(F, []))))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(ml, 3)],
                              ir_version=10, producer_name="examples/ml_pipeline.py")
    checker.check_model(model, full_check=True)
    return model


def numpy_reference(measures: np.ndarray, colour: np.ndarray):
    filled = np.where(np.isnan(measures), MEANS, measures)
    scaled = (filled - MEANS) * (1 / STDS)
    onehot = (colour == np.array(COLOURS, dtype=object)).astype(np.float32)   # [N, 1] vs [3] -> [N, 3]
    scores = np.concatenate([scaled, onehot], axis=1) @ COEF.T + INTERCEPTS
    p = np.exp(scores - scores.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    return np.array(CLASSES, dtype=object)[p.argmax(axis=1)], p


def main() -> None:
    measures = np.array([[160, 7.5, 0.55], [120, np.nan, 0.3], [60, 4.0, 0.8], [np.nan, 6.0, np.nan]],
                        np.float32)
    colour = np.array([["red"], ["yellow"], ["purple"], ["green"]], dtype=object)   # 'green' is unknown: zeros
    model_proto = build_model()
    model = onnx_mini.prepare(model_proto)
    label, probabilities, by_class = model.run({"measures": measures, "colour": colour})
    print(f"ai.onnx.ml pipeline, {len(model_proto.graph.node)} nodes: "
          + " -> ".join(n.op_type for n in model_proto.graph.node))
    for row, c, lab, d in zip(measures, colour[:, 0], label, by_class):
        probs = ", ".join(f"{k} {v:.3f}" for k, v in d.items())
        values = "[" + ", ".join(f"{v:g}" for v in row) + "]"
        print(f"  {values:18s} {c:7s} -> {lab:6s} ({probs})")

    ref_label, ref_p = numpy_reference(measures, colour)
    assert list(label) == list(ref_label), (label, ref_label)
    np.testing.assert_allclose(probabilities, ref_p, rtol=1e-5, atol=1e-6)
    assert [list(d) for d in by_class] == [CLASSES] * len(measures)
    np.testing.assert_allclose([list(d.values()) for d in by_class], ref_p, rtol=1e-5, atol=1e-6)
    print("checked against numpy: labels and probabilities agree")

    try:
        import onnxruntime as ort
    except ImportError:
        print("onnxruntime is not installed: no comparison (pip install onnxruntime)")
        return
    sess = ort.InferenceSession(model_proto.SerializeToString(), providers=["CPUExecutionProvider"])
    ort_label, ort_p, _ = sess.run(None, {"measures": measures, "colour": colour})
    same = list(ort_label) == list(label) and np.allclose(ort_p, probabilities, rtol=1e-5, atol=1e-6)
    print(f"same labels and probabilities as onnxruntime {ort.__version__}: {same}")


if __name__ == "__main__":
    main()
