"""The application models of issue 22, built deterministically with no download.

Each builder returns an ``App``: the model, its feeds, and ``drive(call)``, what one timed "call" of an
application does with a runtime's ``call(feeds) -> list of outputs`` (one run, or 20 streaming chunks
with the state carried). Weights and inputs come from seeded numpy RNGs; the quantized models come from
onnxruntime's own quantization tools (bench-only extras, as the issue allows) and the scikit-learn
pipelines from skl2onnx, so their versions are part of the benchmark (``versions()``).

    vad_stream      silero-vad-like: If on the sample rate (16 kHz / 8 kHz branch, each with its own
                    weights), Conv1d-DFT front end + magnitude, 4 Conv1d+Relu, LSTM (hidden 64, opset 14)
                    whose (h, c) is carried from chunk to chunk, Gemm + Sigmoid; 20 chunks of 512 samples
    wakeword        openWakeWord-like chain on 1 s of audio: Conv1d-DFT power spectrum, MatMul mel
                    filterbank (32 bands), Log; 3 x (Conv+Relu+MaxPool); LSTM head (hidden 64), Gemm, Sigmoid
    bert_dynint8    models.bert (2 layers, hidden 256, batch 1 x seq 128) through quantize_dynamic
                    (MatMulInteger + DynamicQuantizeLinear)
    mobilenet_qdq   MobileNet-v3-like CNN (BN folded, Relu6 / HardSwish), [1,3,224,224], quantize_static QDQ
    mobilenet_qop   the same float model through quantize_static QOperator (QLinearConv, QGemm, ...)
    decoder_int4    one Llama-style decoder block, hidden 896 / 14 heads / 2 KV heads (a Qwen2-0.5B layer's
                    shape): MatMulNBits (4 bits, block 32, MatMul4BitsQuantizer) and GroupQueryAttention
                    (packed QKV, rotary, SimplifiedLayerNormalization) as onnxruntime-genai's builder writes
                    them; one decode step with 256 cached tokens
    greedy_loop     greedy decoder: a Loop of 20 steps holding embedding Gather, GRU (seq 1), dot-product
                    attention over 50 encoder states, Gemm, ArgMax and an If on EOS
    scan_rnn        Scan over T=100 steps of h = Tanh(x W + h R + b) (input 64, hidden 128)
    skl_logreg      StandardScaler + LogisticRegression (20 features, 3 classes), batch 1 / 1000
    skl_gbc         GradientBoostingClassifier (100 rounds x 3 classes, depth 3) with ZipMap, batch 1 / 1000
    skl_tfidf_svc   TfidfVectorizer (words, 1-2 grams) + LinearSVC (4 classes), text, batch 1 / 1000

    .venv/bin/python benchmarks/app_models.py        # builds each, runs both runtimes once, compares
"""
from __future__ import annotations

import contextlib
import functools
import logging
import math
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
import models  # noqa: E402  (the _Graph builder and the BERT encoder)
from models import IR_VERSION, OPSET, _Graph  # noqa: E402

F, I64, I32, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32, TensorProto.BOOL
MS = "com.microsoft"
Call = Callable[[dict], list]


@contextlib.contextmanager
def _quiet():
    """onnxruntime's quantizers log INFO lines per node and a pre-processing advice per call: keep the
    benchmark's output readable."""
    root = logging.getLogger()
    saved = root.level, logging.getLogger("onnxruntime").level
    root.setLevel(logging.ERROR)
    logging.getLogger("onnxruntime").setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(saved[0])
        logging.getLogger("onnxruntime").setLevel(saved[1])


@dataclass
class App:
    name: str
    label: str
    model: onnx.ModelProto
    feeds: dict
    # one timed call of the application: drive(call) -> outputs compared across runtimes
    drive: Callable[[Call], list] | None = None
    # agreement bound: max |diff| / max |onnxruntime value| per output (see bench_apps.compare)
    tol: float = 1e-3
    why_tol: str = ""
    checks: list[dict] = field(default_factory=list)    # more feeds, checked for agreement only

    def run(self, call: Call) -> list:
        return self.drive(call) if self.drive else call(self.feeds)


def versions() -> dict[str, str]:
    """The versions of the tools that wrote the models (the issue asks the benchmark to state them)."""
    out = {}
    for mod in ("onnxruntime", "skl2onnx", "sklearn", "onnx_ir", "onnx", "numpy"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:
            out[mod] = "not installed"
    return out


class _Sub(_Graph):
    """A _Graph whose value names carry a tag, so a body graph never shadows an outer-scope name."""

    def __init__(self, seed: int, tag: str):
        super().__init__(seed)
        self.tag = tag

    def name(self, prefix: str) -> str:
        return f"{self.tag}_{super().name(prefix)}"

    def graph(self, name: str, inputs, outputs) -> onnx.GraphProto:
        return helper.make_graph(self.nodes, name, inputs, outputs, initializer=self.inits)


def _model(graph: onnx.GraphProto, extra_opsets=(), check: bool = True) -> onnx.ModelProto:
    opsets = [helper.make_opsetid("", OPSET)] + [helper.make_opsetid(d, v) for d, v in extra_opsets]
    m = helper.make_model(graph, opset_imports=opsets, producer_name="onnx_mini-benchmarks")
    m.ir_version = IR_VERSION
    if check:
        onnx.checker.check_model(m, full_check=True)
    return m


def _ints(*v) -> np.ndarray:
    return np.array(v, np.int64)


def dft_weights(n_fft: int) -> np.ndarray:
    """Conv1d weights [2 * (n_fft/2 + 1), 1, n_fft] of a Hann-windowed DFT: the cosine rows, then the
    (negated) sine rows, as STFT-by-convolution front ends (silero-vad, openWakeWord) store them."""
    n = np.arange(n_fft)
    k = np.arange(n_fft // 2 + 1)[:, None]
    win = 0.5 - 0.5 * np.cos(2 * np.pi * n / n_fft)          # periodic Hann
    ang = 2 * np.pi * k * n / n_fft
    return np.concatenate([win * np.cos(ang), -win * np.sin(ang)])[:, None, :].astype(np.float32)


def mel_filterbank(n_fft: int, n_mels: int, sr: int = 16000, fmin: float = 60.0, fmax: float = 3800.0) -> np.ndarray:
    """[n_fft/2 + 1, n_mels] triangular filters on the HTK mel scale (for MatMul on a power spectrum)."""
    mel = lambda f: 2595.0 * np.log10(1.0 + f / 700.0)  # noqa: E731
    hz = lambda m: 700.0 * (10.0 ** (m / 2595.0) - 1.0)  # noqa: E731
    edges = hz(np.linspace(mel(fmin), mel(fmax), n_mels + 2))
    freqs = np.arange(n_fft // 2 + 1) * sr / n_fft
    lo, mid, hi = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    tri = np.maximum(0.0, np.minimum((freqs - lo) / (mid - lo), (hi - freqs) / (hi - mid)))
    return tri.T.astype(np.float32)


def _power(g: _Graph, audio3d: str, n_fft: int, hop: int, magnitude: bool) -> str:
    """Conv1d-DFT of [1, 1, samples] -> [1, n_fft/2 + 1, frames] power (or magnitude) spectrum."""
    bins = n_fft // 2 + 1
    spec = g.op("Conv", [audio3d, g.const(dft_weights(n_fft), "dft")], kernel_shape=[n_fft], strides=[hop])
    re = g.op("Slice", [spec, g.const(_ints(0)), g.const(_ints(bins)), g.const(_ints(1))])
    im = g.op("Slice", [spec, g.const(_ints(bins)), g.const(_ints(2 * bins)), g.const(_ints(1))])
    p = g.op("Add", [g.op("Mul", [re, re]), g.op("Mul", [im, im])])
    return g.op("Sqrt", [p]) if magnitude else p


def _lstm(g: _Graph, x: str, n_in: int, hidden: int, h0: str = "", c0: str = "") -> list[str]:
    w = g.weight((1, 4 * hidden, n_in), fan_in=hidden, prefix="W")
    r = g.weight((1, 4 * hidden, hidden), fan_in=hidden, prefix="R")
    b = g.const((g.rng.standard_normal((1, 8 * hidden)) * 0.1).astype(np.float32), "B")
    return g.op("LSTM", [x, w, r, b, "", h0, c0], n_out=3, hidden_size=hidden)


def _conv1d(g: _Graph, x: str, c_in: int, c_out: int, k: int, stride: int = 1) -> str:
    y = g.op("Conv", [x, g.weight((c_out, c_in, k), fan_in=c_in * k), g.const(np.zeros(c_out, np.float32))],
             kernel_shape=[k], strides=[stride], pads=[k // 2, k // 2])
    return g.op("Relu", [y])


def _zip_outputs(chunks: list[list]) -> list:
    """Per-chunk outputs [[out, state], ...] -> [all outs stacked, the last state]."""
    return [np.stack([c[0] for c in chunks]), chunks[-1][1]]


# -- 1. streaming VAD ------------------------------------------------------------------------------

VAD_CHUNK, VAD_CHUNKS, VAD_HIDDEN = 512, 20, 64


def _vad_branch(seed: int, tag: str, n_fft: int, hop: int, pad: int) -> onnx.GraphProto:
    g = _Sub(seed, tag)
    x = g.op("Unsqueeze", ["input", g.const(_ints(1))])                      # [1, 1, samples]
    x = g.op("Pad", [x, g.const(_ints(0, 0, 0, 0, 0, pad))], mode="reflect")
    x = _power(g, x, n_fft, hop, magnitude=True)                              # [1, bins, 3]
    x = _conv1d(g, x, n_fft // 2 + 1, 128, 3)
    x = _conv1d(g, x, 128, 64, 3, 2)
    x = _conv1d(g, x, 64, 64, 3, 2)
    x = _conv1d(g, x, 64, 128, 3)                                             # [1, 128, 1]
    x = g.op("Transpose", [x], perm=[2, 0, 1])                                # [1 step, 1, 128]
    h0 = g.op("Slice", ["state", g.const(_ints(0)), g.const(_ints(1)), g.const(_ints(0))])
    c0 = g.op("Slice", ["state", g.const(_ints(1)), g.const(_ints(2)), g.const(_ints(0))])
    _, yh, yc = _lstm(g, x, 128, VAD_HIDDEN, h0, c0)
    state = g.op("Concat", [yh, yc], axis=0)                                   # [2, 1, H]
    h = g.op("Relu", [g.op("Squeeze", [yh, g.const(_ints(0))])])
    p = g.op("Sigmoid", [g.op("Gemm", [h, g.weight((VAD_HIDDEN, 1)), g.const(np.zeros(1, np.float32))])])
    return g.graph(f"vad_{tag}", [], [helper.make_tensor_value_info(p, F, [1, 1]),
                                      helper.make_tensor_value_info(state, F, [2, 1, VAD_HIDDEN])])


def vad_stream(seed: int = 0) -> App:
    g = _Graph(seed)
    is16 = g.op("Equal", ["sr", g.const(np.array(16000, np.int64), "sr16k")])
    branches = {"then_branch": _vad_branch(seed + 1, "k16", 256, 128, 64),
                "else_branch": _vad_branch(seed + 2, "k8", 128, 64, 32)}
    g.nodes.append(helper.make_node("If", [is16], ["output", "stateN"], name="sample_rate_if", **branches))
    model = _model(helper.make_graph(
        g.nodes, "vad_stream",
        [helper.make_tensor_value_info("input", F, [1, "samples"]),
         helper.make_tensor_value_info("state", F, [2, 1, VAD_HIDDEN]),
         helper.make_tensor_value_info("sr", I64, [])],
        [helper.make_tensor_value_info("output", F, [1, 1]),
         helper.make_tensor_value_info("stateN", F, [2, 1, VAD_HIDDEN])], initializer=g.inits))
    rng = np.random.default_rng(seed + 3)
    t = np.arange(VAD_CHUNK * VAD_CHUNKS) / 16000
    audio = (0.3 * np.sin(2 * np.pi * 440 * t) * (t > 0.3) + 0.05 * rng.standard_normal(t.size)).astype(np.float32)
    chunks = audio.reshape(VAD_CHUNKS, 1, VAD_CHUNK)
    state0 = np.zeros((2, 1, VAD_HIDDEN), np.float32)
    sr16 = np.array(16000, np.int64)

    def drive(call: Call) -> list:
        state, outs = state0, []
        for c in chunks:
            out = call({"input": c, "state": state, "sr": sr16})
            outs.append(out)
            state = out[1]
        return _zip_outputs(outs)

    feeds8k = {"input": audio[:256].reshape(1, 256), "state": state0, "sr": np.array(8000, np.int64)}
    return App("vad_stream", f"VAD: If(sr) + Conv-DFT + LSTM {VAD_HIDDEN}, {VAD_CHUNKS} chunks x {VAD_CHUNK} "
               "samples, state carried", model, {"input": chunks[0], "state": state0, "sr": sr16}, drive,
               checks=[feeds8k])


# -- 2. wake-word chain ----------------------------------------------------------------------------

def wakeword(seed: int = 0, samples: int = 16000, n_fft: int = 512, hop: int = 160, n_mels: int = 32) -> App:
    g = _Graph(seed)
    x = g.op("Unsqueeze", ["audio", g.const(_ints(1))])                        # [1, 1, samples]
    p = _power(g, x, n_fft, hop, magnitude=False)                              # [1, 257, T]
    p = g.op("Transpose", [p], perm=[0, 2, 1])                                  # [1, T, 257]
    mel = g.op("MatMul", [p, g.const(mel_filterbank(n_fft, n_mels), "mel_fb")])
    x = g.op("Log", [g.op("Add", [mel, g.const(np.float32(1e-6))])])           # [1, T, 32]
    x = g.op("Unsqueeze", [x, g.const(_ints(1))])                              # [1, 1, T, 32]
    c = 1
    for c_out in (16, 32, 64):
        w = g.weight((c_out, c, 3, 3), fan_in=c * 9)
        x = g.op("Relu", [g.op("Conv", [x, w, g.const(np.zeros(c_out, np.float32))], kernel_shape=[3, 3],
                               pads=[1, 1, 1, 1])])
        x = g.op("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])
        c = c_out
    frames = (samples - n_fft) // hop + 1
    t, f = frames // 8, n_mels // 8                                            # [1, 64, t, f]
    x = g.op("Reshape", [g.op("Transpose", [x], perm=[2, 0, 1, 3]), g.const(_ints(t, 1, c * f))])
    _, yh, _ = _lstm(g, x, c * f, 64)
    h = g.op("Squeeze", [yh, g.const(_ints(0))])
    g.nodes.append(helper.make_node("Sigmoid", [g.op("Gemm", [h, g.weight((64, 1)), g.const(np.zeros(1, np.float32))])],
                                    ["score"]))
    model = g.model("wakeword", [helper.make_tensor_value_info("audio", F, [1, samples])],
                    [helper.make_tensor_value_info("score", F, [1, 1])])
    t = np.arange(samples) / 16000
    rng = np.random.default_rng(seed + 1)
    audio = (0.2 * np.sin(2 * np.pi * (300 + 400 * t) * t) + 0.05 * rng.standard_normal(samples)).astype(np.float32)
    return App("wakeword", f"wake word: Conv-DFT + MatMul mel {n_mels} + Log, 3 x Conv/Relu/MaxPool, "
               "LSTM 64, Gemm, Sigmoid; 1 s of audio", model, {"audio": audio[None, :]})


# -- 3. dynamic-int8 BERT --------------------------------------------------------------------------

def bert_dynint8() -> App:
    from onnxruntime.quantization import QuantType, quantize_dynamic
    model, feeds = models.bert(batch=1)
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp, "bert.onnx"), Path(tmp, "bert.int8.onnx")
        onnx.save(model, src)
        # reduce_range: 7-bit weights, as onnxruntime's docs advise on AVX2 without VNNI (this VM):
        # its u8s8 kernel sums byte pairs in int16 and saturates otherwise, which is not the
        # MatMulInteger definition, so the outputs would not be comparable.
        with _quiet():
            quantize_dynamic(src, dst, weight_type=QuantType.QInt8, reduce_range=True)
        q = onnx.load(dst)
    return App("bert_dynint8", "BERT-style encoder, 2 layers, hidden 256, seq 128, quantize_dynamic "
               "(MatMulInteger)", q, feeds)


# -- 4. QDQ / QOperator MobileNet-style CNN --------------------------------------------------------

def _conv_folded(g: _Graph, x: str, c_in: int, c_out: int, k: int, stride: int, group: int, act: str | None):
    """Conv with BatchNormalization folded into its weights and bias (as exporters leave it)."""
    w = g.rng.standard_normal((c_out, c_in // group, k, k)).astype(np.float32) / math.sqrt(c_in // group * k * k)
    gamma = 1 + 0.1 * g.rng.standard_normal(c_out)
    var = 1 + 0.1 * np.abs(g.rng.standard_normal(c_out))
    scale = (gamma / np.sqrt(var + 1e-5)).astype(np.float32)
    bias = (0.1 * g.rng.standard_normal(c_out)).astype(np.float32)
    y = g.op("Conv", [x, g.const(w * scale[:, None, None, None], "conv_w"), g.const(bias, "conv_b")],
             kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4, group=group)
    if act == "relu6":
        return g.op("Clip", [y, g.const(np.float32(0.0)), g.const(np.float32(6.0))])
    if act == "hardswish":
        return g.op("HardSwish", [y])
    return y


@functools.lru_cache(maxsize=1)
def _mobilenet_float(size: int = 224, classes: int = 1000, seed: int = 0):
    g = _Graph(seed)
    x = _conv_folded(g, "image", 3, 16, 3, 2, 1, "hardswish")
    c = 16
    # (output channels, stride, activation) of the depthwise-separable blocks (MobileNet-v3-small-like widths)
    for c_out, s, act in [(16, 2, "relu6"), (24, 2, "relu6"), (24, 1, "relu6"), (40, 2, "hardswish"),
                          (40, 1, "hardswish"), (48, 1, "hardswish"), (96, 2, "hardswish"), (96, 1, "hardswish"),
                          (576, 1, "hardswish")]:
        x = _conv_folded(g, x, c, c, 3, s, c, act)          # depthwise
        x = _conv_folded(g, x, c, c_out, 1, 1, 1, act if c_out == 576 else None)   # pointwise (linear bottleneck)
        c = c_out
    x = g.op("Flatten", [g.op("GlobalAveragePool", [x])], axis=1)
    x = g.op("HardSwish", [g.op("Gemm", [x, g.weight((1024, c), fan_in=c), g.const(np.zeros(1024, np.float32))],
                                transB=1)])
    g.nodes.append(helper.make_node("Gemm", [x, g.weight((classes, 1024), fan_in=1024),
                                             g.const(np.zeros(classes, np.float32))], ["logits"], transB=1))
    model = g.model("mobilenet_v3_like", [helper.make_tensor_value_info("image", F, [1, 3, size, size])],
                    [helper.make_tensor_value_info("logits", F, [1, classes])])
    rng = np.random.default_rng(seed + 1)
    calib = [rng.standard_normal((1, 3, size, size)).astype(np.float32) for _ in range(4)]
    return model, calib, rng.standard_normal((1, 3, size, size)).astype(np.float32)


def _mobilenet_quantized(fmt: str) -> App:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    model, calib, image = _mobilenet_float()

    class Reader(CalibrationDataReader):       # the same 4 seeded images every time
        def __init__(self):
            self.it = iter([{"image": x} for x in calib])

        def get_next(self):
            return next(self.it, None)

    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp, "m.onnx"), Path(tmp, "m.q.onnx")
        onnx.save(model, src)
        # U8 activations / S8 weights (onnxruntime's advised CPU pair), 7-bit weights: see bert_dynint8
        with _quiet():
            quantize_static(src, dst, Reader(), quant_format=getattr(QuantFormat, fmt),
                            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, reduce_range=True)
        q = onnx.load(dst)
    ops = sorted({n.op_type for n in q.graph.node} - {"Flatten"})
    return App(f"mobilenet_{fmt.lower()[:3]}", f"MobileNet-v3-like CNN [1,3,224,224], quantize_static {fmt} "
               f"({', '.join(o for o in ops if o.startswith(('QLinear', 'Quantize', 'Dequantize', 'QGemm')))})",
               q, {"image": image}, tol=0.03,
               why_tol="activations are requantized to uint8 at every layer and a value within float rounding of "
                       "a .5 tie lands one step apart (measured: one element of 40x14x14, acc*scale = -103.49999 "
                       "exactly, -103.5 in onnxruntime's float32 requantization); the later layers carry it: "
                       "at most 2 steps of the logits' scale = 1.5e-2 of their max")


def mobilenet_qdq() -> App:
    return _mobilenet_quantized("QDQ")


def mobilenet_qop() -> App:
    return _mobilenet_quantized("QOperator")


# -- 5. int4 decoder block -------------------------------------------------------------------------

def decoder_int4(hidden: int = 896, heads: int = 14, kv_heads: int = 2, inter: int = 4864, past: int = 256,
                 max_pos: int = 2048, seed: int = 0) -> App:
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    g = _Graph(seed)
    hd = hidden // heads
    # seqlens_k and total_sequence_length from the attention mask, as the builder writes them
    total = g.op("Cast", [g.op("Gather", [g.op("Shape", ["attention_mask"]), g.const(np.array(1, np.int64))])],
                 to=I32)
    lens = g.op("ReduceSum", ["attention_mask", g.const(_ints(1))], keepdims=0)
    seqlens = g.op("Cast", [g.op("Sub", [lens, g.const(np.array(1, np.int64))])], to=I32)

    def gamma():
        return g.const((1 + 0.1 * g.rng.standard_normal(hidden)).astype(np.float32), "ln_w")

    ln1 = g.op("SimplifiedLayerNormalization", ["hidden_states", gamma()], axis=-1, epsilon=1e-6)
    qkv = g.op("MatMul", [ln1, g.weight((hidden, (heads + 2 * kv_heads) * hd), prefix="qkv_proj")])
    inv = 1.0 / 10000.0 ** (np.arange(0, hd, 2) / hd)
    ang = np.arange(max_pos)[:, None] * inv[None, :]
    attn, pk, pv = g.op("GroupQueryAttention",
                        [qkv, "", "", "past_key_values.0.key", "past_key_values.0.value", seqlens, total,
                         g.const(np.cos(ang).astype(np.float32), "cos_cache"),
                         g.const(np.sin(ang).astype(np.float32), "sin_cache")],
                        n_out=3, domain=MS, num_heads=heads, kv_num_heads=kv_heads, do_rotary=1,
                        rotary_interleaved=0, local_window_size=-1, scale=1.0 / math.sqrt(hd))
    o = g.op("MatMul", [attn, g.weight((hidden, hidden), prefix="o_proj")])
    ln2, _, _, res = g.op("SkipSimplifiedLayerNormalization", [o, "hidden_states", gamma()], n_out=4, domain=MS,
                          epsilon=1e-6)
    g.nodes[-1].output[1] = g.nodes[-1].output[2] = ""
    gate = g.op("MatMul", [ln2, g.weight((hidden, inter), prefix="gate_proj")])
    up = g.op("MatMul", [ln2, g.weight((hidden, inter), prefix="up_proj")])
    act = g.op("Mul", [g.op("Mul", [gate, g.op("Sigmoid", [gate])]), up])
    down = g.op("MatMul", [act, g.weight((inter, hidden), prefix="down_proj")])
    g.nodes.append(helper.make_node("Add", [down, res], ["output"]))
    for n in g.nodes:
        for k, v in {pk: "present.0.key", pv: "present.0.value"}.items():
            n.output[:] = [v if o_ == k else o_ for o_ in n.output]
    kv_shape = [1, kv_heads, "past_seq", hd]
    float_model = _model(helper.make_graph(
        g.nodes, "decoder_block",
        [helper.make_tensor_value_info("hidden_states", F, [1, 1, hidden]),
         helper.make_tensor_value_info("attention_mask", I64, [1, "total_seq"]),
         helper.make_tensor_value_info("past_key_values.0.key", F, kv_shape),
         helper.make_tensor_value_info("past_key_values.0.value", F, kv_shape)],
        [helper.make_tensor_value_info("output", F, [1, 1, hidden]),
         helper.make_tensor_value_info("present.0.key", F, [1, kv_heads, "total_seq", hd]),
         helper.make_tensor_value_info("present.0.value", F, [1, kv_heads, "total_seq", hd])],
        initializer=g.inits), extra_opsets=[(MS, 1)], check=False)   # SimplifiedLayerNormalization: onnxruntime's
    # MatMulNBitsQuantizer: every MatMul with a constant B -> MatMulNBits (symmetric int4, blocks of 32 along K),
    # accuracy_level 4 as Microsoft's CPU int4 releases ("cpu-int4-rtn-block-32-acc-level-4"): onnxruntime
    # then quantizes the activations to int8 per block (8x faster here than level 0, measured); the level is a
    # minimum accuracy, onnx_mini computes in float32.
    quant = MatMulNBitsQuantizer(float_model, bits=4, block_size=32, is_symmetric=True, accuracy_level=4)
    with _quiet():
        quant.process()
    model = quant.model.model
    rng = np.random.default_rng(seed + 1)
    feeds = {"hidden_states": rng.standard_normal((1, 1, hidden)).astype(np.float32),
             "attention_mask": np.ones((1, past + 1), np.int64),
             "past_key_values.0.key": rng.standard_normal((1, kv_heads, past, hd)).astype(np.float32),
             "past_key_values.0.value": rng.standard_normal((1, kv_heads, past, hd)).astype(np.float32)}
    return App("decoder_int4", f"int4 decoder block (MatMulNBits b32 + GroupQueryAttention {heads}/{kv_heads} heads), "
               f"hidden {hidden}, accuracy_level 4, 1 decode step, {past} cached tokens", model, feeds, tol=1e-2,
               why_tol="accuracy_level 4: onnxruntime rounds the activations to int8 per block of 32, onnx_mini "
                       "keeps float32 (measured 5e-3 between onnxruntime's level 4 and level 0, whose output "
                       "onnx_mini matches to 5e-7)")


# -- 6. greedy decoder in a Loop -------------------------------------------------------------------

def greedy_loop(steps: int = 20, vocab: int = 1000, emb: int = 128, hidden: int = 256, enc_len: int = 50,
                eos: int = 1, seed: int = 0) -> App:
    g = _Graph(seed)
    enc = g.op("Squeeze", ["encoder_states", g.const(_ints(0))])               # [S, H]
    enc_t = g.op("Transpose", [enc], perm=[1, 0])                                # [H, S]
    b = _Sub(seed + 1, "body")
    tok, h = "body_token", "body_h"
    e = b.op("Unsqueeze", [b.op("Gather", [b.weight((vocab, emb), fan_in=emb, prefix="embedding"), tok], axis=0),
                           b.const(_ints(0))])                                  # [1, 1, emb]
    _, hn = b.op("GRU", [e, b.weight((1, 3 * hidden, emb), fan_in=hidden), b.weight((1, 3 * hidden, hidden),
                 fan_in=hidden), b.const(np.zeros((1, 6 * hidden), np.float32)), "", h], n_out=2,
                 hidden_size=hidden, linear_before_reset=1)
    q = b.op("Reshape", [hn, b.const(_ints(1, hidden))])
    att = b.op("Softmax", [b.op("Mul", [b.op("MatMul", [q, enc_t]), b.const(np.float32(1 / math.sqrt(hidden)))])],
               axis=-1)                                                          # [1, S]
    ctx = b.op("MatMul", [att, enc])
    mix = b.op("Tanh", [b.op("Gemm", [b.op("Concat", [q, ctx], axis=1), b.weight((2 * hidden, hidden)),
                                      b.const(np.zeros(hidden, np.float32))])])
    out_b = (0.1 * b.rng.standard_normal(vocab)).astype(np.float32)
    out_b[eos] = -100.0       # EOS never wins: every call runs all the steps (the If is still evaluated each time)
    logits = b.op("Gemm", [mix, b.weight((hidden, vocab)), b.const(out_b)])
    nxt = b.op("ArgMax", [logits], axis=1, keepdims=0)                           # [1] int64
    is_eos = b.op("Squeeze", [b.op("Equal", [nxt, b.const(_ints(eos))]), b.const(_ints(0))])
    stop = helper.make_graph([helper.make_node("Constant", [], ["stop_c"], value=helper.make_tensor("f", B, [], [False]))],
                             "stop", [], [helper.make_tensor_value_info("stop_c", B, [])])
    go = helper.make_graph([helper.make_node("Constant", [], ["go_c"], value=helper.make_tensor("t", B, [], [True]))],
                           "go", [], [helper.make_tensor_value_info("go_c", B, [])])
    b.nodes.append(helper.make_node("If", [is_eos], ["cond_out"], then_branch=stop, else_branch=go))
    b.nodes.append(helper.make_node("Identity", [nxt], ["token_out"]))
    b.nodes.append(helper.make_node("Identity", [hn], ["h_out"]))
    b.nodes.append(helper.make_node("Identity", [nxt], ["token_scan"]))
    body = b.graph("greedy_step",
                   [helper.make_tensor_value_info("iter", I64, []), helper.make_tensor_value_info("cond_in", B, []),
                    helper.make_tensor_value_info(tok, I64, [1]), helper.make_tensor_value_info(h, F, [1, 1, hidden])],
                   [helper.make_tensor_value_info("cond_out", B, []), helper.make_tensor_value_info("token_out", I64, [1]),
                    helper.make_tensor_value_info("h_out", F, [1, 1, hidden]),
                    helper.make_tensor_value_info("token_scan", I64, [1])])
    h0 = g.op("Unsqueeze", [g.op("ReduceMean", [enc, g.const(_ints(0))], keepdims=1), g.const(_ints(0))])  # [1,1,H]
    g.nodes.append(helper.make_node("Loop", [g.const(np.array(steps, np.int64), "max_steps"),
                                             g.const(np.array(True), "go"), g.const(_ints(0), "bos"), h0],
                                    ["last_token", "last_h", "tokens"], body=body))
    model = g.model("greedy_decoder", [helper.make_tensor_value_info("encoder_states", F, [1, enc_len, hidden])],
                    [helper.make_tensor_value_info("tokens", I64, ["steps", 1]),
                     helper.make_tensor_value_info("last_h", F, [1, 1, hidden])])
    enc_in = np.random.default_rng(seed + 2).standard_normal((1, enc_len, hidden)).astype(np.float32)
    return App("greedy_loop", f"greedy decoder: Loop {steps} x (Gather, GRU {hidden}, attention over {enc_len}, "
               f"Gemm to {vocab}, ArgMax, If on EOS)", model, {"encoder_states": enc_in})


# -- 7. Scan RNN -----------------------------------------------------------------------------------

def scan_rnn(steps: int = 100, n_in: int = 64, hidden: int = 128, seed: int = 0) -> App:
    g = _Graph(seed)
    wx, wh = g.weight((n_in, hidden)), g.weight((hidden, hidden))
    bias = g.const((0.1 * g.rng.standard_normal(hidden)).astype(np.float32), "b")
    b = _Sub(seed, "cell")
    pre = b.op("Add", [b.op("Add", [b.op("MatMul", ["cell_x", wx]), b.op("MatMul", ["cell_h", wh])]), bias])
    b.nodes.append(helper.make_node("Tanh", [pre], ["cell_h_out"]))
    b.nodes.append(helper.make_node("Identity", ["cell_h_out"], ["cell_y"]))
    body = b.graph("rnn_cell", [helper.make_tensor_value_info("cell_h", F, [1, hidden]),
                                helper.make_tensor_value_info("cell_x", F, [1, n_in])],
                   [helper.make_tensor_value_info("cell_h_out", F, [1, hidden]),
                    helper.make_tensor_value_info("cell_y", F, [1, hidden])])
    g.nodes.append(helper.make_node("Scan", ["h0", "x"], ["h_last", "y"], body=body, num_scan_inputs=1))
    model = g.model("scan_rnn", [helper.make_tensor_value_info("h0", F, [1, hidden]),
                                 helper.make_tensor_value_info("x", F, [steps, 1, n_in])],
                    [helper.make_tensor_value_info("h_last", F, [1, hidden]),
                     helper.make_tensor_value_info("y", F, [steps, 1, hidden])])
    rng = np.random.default_rng(seed + 1)
    feeds = {"h0": np.zeros((1, hidden), np.float32), "x": rng.standard_normal((steps, 1, n_in)).astype(np.float32)}
    return App("scan_rnn", f"Scan over {steps} steps of Tanh(x W + h R + b), input {n_in}, hidden {hidden}",
               model, feeds)


# -- 8. scikit-learn pipelines ---------------------------------------------------------------------

SKL_OPSETS = {"": 17, "ai.onnx.ml": 3}
SKL_BATCHES = (1, 1000)


@functools.lru_cache(maxsize=None)
def _skl(kind: str):
    """(ONNX model, test inputs of 1000 rows) of a fitted scikit-learn pipeline, built once per process."""
    from skl2onnx import to_onnx
    from sklearn.datasets import make_classification
    if kind == "tfidf_svc":
        from sklearn.feature_extraction.text import TfidfVectorizer
        from sklearn.pipeline import make_pipeline
        from sklearn.svm import LinearSVC
        from skl2onnx.common.data_types import StringTensorType
        rng = np.random.default_rng(0)
        topics = [[f"w{t}_{i}" for i in range(40)] for t in range(4)]
        common = [f"c{i}" for i in range(60)]

        def texts(n):
            y = rng.integers(0, 4, n)
            docs = [" ".join(rng.choice(topics[c], 4).tolist() + rng.choice(common, 8).tolist()) for c in y]
            return np.array(docs, dtype=object), y
        x, y = texts(2000)
        pipe = make_pipeline(TfidfVectorizer(ngram_range=(1, 2), min_df=2), LinearSVC(dual="auto", random_state=0))
        pipe.fit(x, y)
        # an explicit LinearSVC option keeps skl2onnx 1.20's pipeline parser from adding a 'zipmap' option
        # that its LinearSVC converter then rejects
        model = to_onnx(pipe, initial_types=[("text", StringTensorType([None, 1]))], target_opset=SKL_OPSETS,
                        options={LinearSVC: {"nocl": False}})
        _c_locale_fallback(model)
        return model, texts(1000)[0].reshape(-1, 1)
    x, y = make_classification(n_samples=3000, n_features=20, n_informative=10, n_classes=3, random_state=0)
    x = x.astype(np.float32)
    if kind == "logreg":
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler
        pipe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=500)).fit(x[:2000], y[:2000])
        model = to_onnx(pipe, x[:1], target_opset=SKL_OPSETS, options={LogisticRegression: {"zipmap": False}})
    else:
        from sklearn.ensemble import GradientBoostingClassifier
        clf = GradientBoostingClassifier(n_estimators=100, max_depth=3, random_state=0).fit(x[:2000], y[:2000])
        model = to_onnx(clf, x[:1], target_opset=SKL_OPSETS)     # ZipMap on: a list of {class: probability}
    return model, x[2000:3000]


def _c_locale_fallback(model: onnx.ModelProto) -> None:
    """StringNormalizer without a locale means en_US.UTF-8 to onnxruntime, which fails to create the session
    where that locale is not installed (this VM has C.UTF-8 only). Name C.UTF-8 there: the text is ASCII, so
    lower-casing is the same in both locales."""
    import locale
    try:
        saved = locale.setlocale(locale.LC_CTYPE)
        locale.setlocale(locale.LC_CTYPE, "en_US.UTF-8")
        locale.setlocale(locale.LC_CTYPE, saved)
        return
    except locale.Error:
        pass
    for n in model.graph.node:
        if n.op_type == "StringNormalizer" and not any(a.name == "locale" for a in n.attribute):
            n.attribute.append(helper.make_attribute("locale", "C.UTF-8"))


def _skl_app(kind: str, label: str, batch: int) -> App:
    model, rows = _skl(kind)
    name = model.graph.input[0].name
    return App(f"skl_{kind}_b{batch}", f"{label}, batch {batch}", model, {name: rows[:batch]})


SKL_KINDS = {"logreg": "scikit-learn StandardScaler + LogisticRegression (20 features, 3 classes)",
             "gbc": "scikit-learn GradientBoostingClassifier 100 x 3 trees, ZipMap output",
             "tfidf_svc": "scikit-learn TfidfVectorizer (1-2 grams) + LinearSVC, text"}

BUILDERS: dict[str, Callable[[], App]] = {
    "vad_stream": vad_stream, "wakeword": wakeword, "bert_dynint8": bert_dynint8,
    "mobilenet_qdq": mobilenet_qdq, "mobilenet_qop": mobilenet_qop, "decoder_int4": decoder_int4,
    "greedy_loop": greedy_loop, "scan_rnn": scan_rnn,
    **{f"skl_{k}_b{b}": functools.partial(_skl_app, k, label, b) for k, label in SKL_KINDS.items()
       for b in SKL_BATCHES},
}


def main() -> int:
    import onnx_mini
    import onnxruntime as ort
    print(versions())
    only = sys.argv[1:]
    for name, build in BUILDERS.items():
        if only and not any(o in name for o in only):
            continue
        app = build()
        sess = ort.InferenceSession(app.model.SerializeToString(), providers=["CPUExecutionProvider"])
        rep = onnx_mini.prepare(app.model)
        base = app.run(lambda f: sess.run(None, f))
        mini = app.run(lambda f: list(rep.run(f)))
        print(f"{name:16s} nodes {len(app.model.graph.node):4d}  {[np.shape(o) for o in base]}  "
              f"{type(mini[0]).__name__} {type(base[0]).__name__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
