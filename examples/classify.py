"""Classify an image-shaped input with the light ResNet-50 that ships inside the onnx package.

    python examples/classify.py            # or: make demo

Loads the model from onnx's test data, builds a 224x224 RGB test picture (a colour gradient with a
disc), normalises it the ImageNet way, runs onnx_mini, and prints the top-5 class indices with
their probabilities and the median latency. When onnxruntime is installed it runs the same input
there too and prints its top-5, the largest difference between the two outputs and its latency.
(The light models' weights are generated inside the graph, so the classes are not meaningful
ImageNet predictions: the point is that both runtimes agree, and how fast.)
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np
import onnx

import onnx_mini

MODEL = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / "light_resnet50.onnx"


def test_picture(size: int = 224) -> np.ndarray:
    """An RGB uint8 picture: a diagonal colour gradient with a bright disc in the middle."""
    yy, xx = np.mgrid[0:size, 0:size] / (size - 1)
    rgb = np.stack([xx, yy, 1 - (xx + yy) / 2], axis=-1)
    disc = (xx - 0.5) ** 2 + (yy - 0.5) ** 2 < 0.06
    rgb[disc] = [1.0, 0.9, 0.2]
    return (rgb * 255).round().astype(np.uint8)


def preprocess(picture: np.ndarray) -> np.ndarray:
    """HWC uint8 -> NCHW float32, ImageNet mean/std normalisation."""
    mean = np.array([0.485, 0.456, 0.406], np.float32)
    std = np.array([0.229, 0.224, 0.225], np.float32)
    x = (picture.astype(np.float32) / 255 - mean) / std
    return x.transpose(2, 0, 1)[None].copy()


def top5(scores: np.ndarray) -> list[tuple[int, float]]:
    p = scores.reshape(-1).astype(np.float64)
    if not np.isclose(p.sum(), 1, atol=1e-3) or p.min() < 0:   # logits: turn them into probabilities
        p = np.exp(p - p.max())
        p /= p.sum()
    best = np.argsort(-p, kind="stable")[:5]
    return [(int(i), float(p[i])) for i in best]


def median_time(fn, runs: int = 7) -> float:
    fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    model = onnx.load(str(MODEL))
    inits = {i.name for i in model.graph.initializer}
    input_name = next(i.name for i in model.graph.input if i.name not in inits)
    x = preprocess(test_picture())

    t0 = time.perf_counter()
    rep = onnx_mini.prepare(model)
    prepare_s = time.perf_counter() - t0
    (scores,) = rep.run({input_name: x})
    latency = median_time(lambda: rep.run({input_name: x}))
    print(f"light ResNet-50 ({len(model.graph.node)} nodes), input {list(x.shape)} float32")
    print(f"onnx_mini: prepare {prepare_s * 1e3:.0f} ms, run {latency * 1e3:.1f} ms (median of 7)")
    print("top-5 (class index: probability):")
    for i, p in top5(scores):
        print(f"  {i:4d}: {p:.4f}")
    if np.ptp(scores) == 0:
        print("  (every class scores the same: the light model's generated weights are constant)")

    try:
        import onnxruntime as ort
    except ImportError:
        print("onnxruntime is not installed: no comparison (pip install onnxruntime)")
        return
    options = ort.SessionOptions()
    options.log_severity_level = 3     # no warning about the model's unused initializers
    sess = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    (ort_scores,) = sess.run(None, {input_name: x})
    ort_latency = median_time(lambda: sess.run(None, {input_name: x}))
    same = [i for i, _ in top5(scores)] == [i for i, _ in top5(ort_scores)]
    print(f"onnxruntime {ort.__version__}: run {ort_latency * 1e3:.1f} ms (median of 7); "
          f"onnx_mini/onnxruntime = {latency / ort_latency:.2f}x")
    print(f"same top-5 as onnxruntime: {same}; max |difference| of the outputs: "
          f"{float(np.abs(scores - ort_scores).max()):.2e}")


if __name__ == "__main__":
    main()
