"""Deterministic benchmark models built with onnx.helper (no download).

Every builder returns ``(ModelProto, feeds)``: the model (IR 10, opset 21, ``ai.onnx.ml`` 3 where needed,
so onnxruntime accepts it) and a dict of numpy inputs. Weights and inputs come from a seeded numpy RNG,
so two calls give byte-identical models and feeds.

    BUILDERS["bert"]()        BERT-style encoder: word + position embedding (Gather), LayerNormalization,
                              2 layers of 4-head self-attention with an additive padding mask written as
                              MatMul/Div/Add/Softmax/MatMul, GELU MLP written with Erf; hidden 256, seq 128
    BUILDERS["gru"]()         GRU (hidden 256) over seq 100, batch 16, input 128; linear head on Y_h
    BUILDERS["lstm"]()        LSTM (hidden 256), same shapes
    BUILDERS["mobilenet"]()   MobileNet-v1-like depthwise-separable CNN on [1, 3, 224, 224]: Conv + BN + Clip(0, 6),
                              13 depthwise (group = channels) / pointwise blocks, GlobalAveragePool, Gemm, Softmax
    BUILDERS["unet"]()        small U-Net on [1, 3, 128, 128]: 3 levels, MaxPool down, one ConvTranspose (2x2,
                              stride 2) and two Resize (nearest, then linear) up, Concat skips, Sigmoid
    BUILDERS["trees"]()       500-tree ensemble, 1000 rows: bench_trees.py's forest (TreeEnsembleRegressor,
                              depth 8, 20 features) when that file is there, else trees_own (depth 6, 32 features)

    .venv/bin/python benchmarks/models.py        # builds each, runs onnx_mini and onnxruntime, compares
"""
from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

IR_VERSION = 10     # onnxruntime accepts IR <= 13 only
OPSET = 21
ML_OPSET = 3
F = TensorProto.FLOAT
I64 = TensorProto.INT64


class _Graph:
    """Small builder: nodes, initializers (from a seeded RNG) and unique names."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._n = 0

    def name(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}_{self._n}"

    def const(self, value, prefix: str = "c") -> str:
        name = self.name(prefix)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def weight(self, shape, fan_in: int | None = None, prefix: str = "w") -> str:
        fan_in = fan_in or shape[0]
        w = self.rng.standard_normal(shape).astype(np.float32) * np.float32(1.0 / math.sqrt(fan_in))
        return self.const(w, prefix)

    def op(self, op_type: str, inputs, n_out: int = 1, domain: str = "", **attrs):
        outs = [self.name(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=self.name(op_type), domain=domain,
                                           **attrs))
        return outs[0] if n_out == 1 else outs

    def model(self, name: str, inputs, outputs, ml: bool = False) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, initializer=self.inits)
        opsets = [helper.make_opsetid("", OPSET)] + ([helper.make_opsetid("ai.onnx.ml", ML_OPSET)] if ml else [])
        m = helper.make_model(graph, opset_imports=opsets, producer_name="onnx_mini-benchmarks")
        m.ir_version = IR_VERSION
        onnx.checker.check_model(m, full_check=True)
        return m


# -- BERT-style encoder ---------------------------------------------------------------------------

def bert(batch: int = 2, seq: int = 128, hidden: int = 256, heads: int = 4, layers: int = 2, vocab: int = 8000,
         ffn: int = 1024, seed: int = 0):
    g = _Graph(seed)
    d = hidden // heads
    ids, mask_in = "input_ids", "attention_mask"
    # Embeddings: word Gather + position Gather (positions 0..seq-1 as a constant), LayerNormalization.
    word = g.op("Gather", [g.weight((vocab, hidden), fan_in=hidden, prefix="word_emb"), ids], axis=0)
    pos = g.op("Gather", [g.weight((seq, hidden), fan_in=hidden, prefix="pos_emb"),
                          g.const(np.arange(seq, dtype=np.int64)[None, :], "positions")], axis=0)
    x = g.op("LayerNormalization", [g.op("Add", [word, pos]), g.const(np.ones(hidden, np.float32)),
                                    g.const(np.zeros(hidden, np.float32))], axis=-1, epsilon=1e-12)
    # Additive mask [B, 1, 1, S]: (1 - mask) * -10000, as exporters write it.
    m = g.op("Cast", [mask_in], to=F)
    m = g.op("Mul", [g.op("Sub", [g.const(np.float32(1.0)), m]), g.const(np.float32(-10000.0))])
    m = g.op("Unsqueeze", [m, g.const(np.array([1, 2], np.int64))])
    split_heads = g.const(np.array([0, 0, heads, d], np.int64), "split_heads")
    merge_heads = g.const(np.array([0, 0, hidden], np.int64), "merge_heads")
    scale = g.const(np.float32(math.sqrt(d)), "sqrt_d")

    def dense(v, n_in, n_out):
        return g.op("Add", [g.op("MatMul", [v, g.weight((n_in, n_out))]),
                            g.const((g.rng.standard_normal(n_out) * 0.02).astype(np.float32), "b")])

    def ln(v):
        return g.op("LayerNormalization", [v, g.const((1 + 0.1 * g.rng.standard_normal(hidden)).astype(np.float32)),
                                           g.const((0.1 * g.rng.standard_normal(hidden)).astype(np.float32))],
                    axis=-1, epsilon=1e-12)

    for _ in range(layers):
        q = g.op("Transpose", [g.op("Reshape", [dense(x, hidden, hidden), split_heads])], perm=[0, 2, 1, 3])
        k = g.op("Transpose", [g.op("Reshape", [dense(x, hidden, hidden), split_heads])], perm=[0, 2, 3, 1])
        v = g.op("Transpose", [g.op("Reshape", [dense(x, hidden, hidden), split_heads])], perm=[0, 2, 1, 3])
        scores = g.op("Add", [g.op("Div", [g.op("MatMul", [q, k]), scale]), m])
        ctx = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v])
        ctx = g.op("Reshape", [g.op("Transpose", [ctx], perm=[0, 2, 1, 3]), merge_heads])
        x = ln(g.op("Add", [dense(ctx, hidden, hidden), x]))
        h = dense(x, hidden, ffn)          # GELU as exporters write it: 0.5 * h * (1 + erf(h / sqrt 2))
        erf = g.op("Erf", [g.op("Div", [h, g.const(np.float32(math.sqrt(2.0)))])])
        h = g.op("Mul", [g.op("Mul", [h, g.op("Add", [erf, g.const(np.float32(1.0))])]), g.const(np.float32(0.5))])
        x = ln(g.op("Add", [dense(h, ffn, hidden), x]))
    g.nodes[-1].output[0] = "last_hidden_state"
    model = g.model("bert_encoder",
                    [helper.make_tensor_value_info(ids, I64, ["batch", seq]),
                     helper.make_tensor_value_info(mask_in, I64, ["batch", seq])],
                    [helper.make_tensor_value_info("last_hidden_state", F, ["batch", seq, hidden])])
    rng = np.random.default_rng(seed + 1)
    lengths = rng.integers(seq // 2, seq + 1, size=batch)
    mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int64)
    feeds = {ids: rng.integers(0, vocab, size=(batch, seq), dtype=np.int64), mask_in: mask}
    return model, feeds


# -- GRU / LSTM -----------------------------------------------------------------------------------

def _rnn(kind: str, seq: int, batch: int, input_size: int, hidden: int, classes: int, seed: int):
    g = _Graph(seed)
    gates = {"GRU": 3, "LSTM": 4}[kind]
    w = g.weight((1, gates * hidden, input_size), fan_in=hidden, prefix="W")
    r = g.weight((1, gates * hidden, hidden), fan_in=hidden, prefix="R")
    b = g.const((g.rng.standard_normal((1, 2 * gates * hidden)) * 0.1).astype(np.float32), "B")
    attrs = {"hidden_size": hidden}
    if kind == "GRU":
        attrs["linear_before_reset"] = 1          # the PyTorch form
    outs = g.op(kind, ["x", w, r, b], n_out=2 if kind == "GRU" else 3, **attrs)
    y, y_h = outs[0], outs[1]
    last = g.op("Squeeze", [y_h, g.const(np.array([0], np.int64))])         # [batch, hidden]
    logits = g.op("Gemm", [last, g.weight((hidden, classes)), g.const(np.zeros(classes, np.float32))])
    # Also use every step's output (mean over time), so no runtime can drop Y.
    pooled = g.op("ReduceMean", [y, g.const(np.array([0, 1], np.int64))], keepdims=0)  # [batch, hidden]
    g.nodes.append(helper.make_node("Identity", [logits], ["logits"]))
    g.nodes.append(helper.make_node("Identity", [pooled], ["pooled"]))
    model = g.model(kind.lower(), [helper.make_tensor_value_info("x", F, [seq, "batch", input_size])],
                    [helper.make_tensor_value_info("logits", F, ["batch", classes]),
                     helper.make_tensor_value_info("pooled", F, ["batch", hidden])])
    x = np.random.default_rng(seed + 1).standard_normal((seq, batch, input_size)).astype(np.float32)
    return model, {"x": x}


def gru(seq: int = 100, batch: int = 16, input_size: int = 128, hidden: int = 256, classes: int = 10, seed: int = 0):
    return _rnn("GRU", seq, batch, input_size, hidden, classes, seed)


def lstm(seq: int = 100, batch: int = 16, input_size: int = 128, hidden: int = 256, classes: int = 10,
         seed: int = 0):
    return _rnn("LSTM", seq, batch, input_size, hidden, classes, seed)


# -- MobileNet-like depthwise-separable CNN -------------------------------------------------------

def _conv_bn(g: _Graph, x: str, c_in: int, c_out: int, k: int, stride: int, group: int = 1, act: str = "relu6"):
    w = g.weight((c_out, c_in // group, k, k), fan_in=c_in // group * k * k, prefix="conv_w")
    y = g.op("Conv", [x, w], kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4, group=group)
    scale = (1 + 0.1 * g.rng.standard_normal(c_out)).astype(np.float32)
    bias = (0.1 * g.rng.standard_normal(c_out)).astype(np.float32)
    mean = (0.1 * g.rng.standard_normal(c_out)).astype(np.float32)
    var = (1 + 0.1 * np.abs(g.rng.standard_normal(c_out))).astype(np.float32)
    y = g.op("BatchNormalization", [y, g.const(scale), g.const(bias), g.const(mean), g.const(var)], epsilon=1e-5)
    if act == "relu6":
        return g.op("Clip", [y, g.const(np.float32(0.0)), g.const(np.float32(6.0))])
    return g.op("Relu", [y])


def mobilenet(size: int = 224, width: float = 1.0, classes: int = 1000, seed: int = 0):
    g = _Graph(seed)
    ch = lambda c: max(8, int(c * width))  # noqa: E731
    x = _conv_bn(g, "image", 3, ch(32), 3, 2)
    c = ch(32)
    # (output channels, stride) of MobileNet v1's 13 depthwise-separable blocks
    for c_out, s in [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1), (512, 1), (512, 1),
                     (512, 1), (512, 1), (1024, 2), (1024, 1)]:
        x = _conv_bn(g, x, c, c, 3, s, group=c)        # depthwise
        x = _conv_bn(g, x, c, ch(c_out), 1, 1)         # pointwise
        c = ch(c_out)
    x = g.op("Flatten", [g.op("GlobalAveragePool", [x])], axis=1)
    x = g.op("Gemm", [x, g.weight((classes, c), fan_in=c), g.const(np.zeros(classes, np.float32))], transB=1)
    g.nodes.append(helper.make_node("Softmax", [x], ["probs"], axis=-1))
    model = g.model("mobilenet_like", [helper.make_tensor_value_info("image", F, ["batch", 3, size, size])],
                    [helper.make_tensor_value_info("probs", F, ["batch", classes])])
    img = np.random.default_rng(seed + 1).standard_normal((1, 3, size, size)).astype(np.float32)
    return model, {"image": img}


# -- small U-Net ----------------------------------------------------------------------------------

def unet(size: int = 128, base: int = 16, seed: int = 0):
    g = _Graph(seed)

    def block(x, c_in, c_out):
        x = _conv_bn(g, x, c_in, c_out, 3, 1, act="relu")
        return _conv_bn(g, x, c_out, c_out, 3, 1, act="relu")

    def pool(x):
        return g.op("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])

    c1, c2, c3, c4 = base, base * 2, base * 4, base * 8
    e1 = block("image", 3, c1)                      # [1, c1, S, S]
    e2 = block(pool(e1), c1, c2)                    # S/2
    e3 = block(pool(e2), c2, c3)                    # S/4
    bott = block(pool(e3), c3, c4)                  # S/8
    # up 1: ConvTranspose 2x2 stride 2 (learned upsampling)
    up = g.op("ConvTranspose", [bott, g.weight((c4, c3, 2, 2), fan_in=c4 * 4), g.const(np.zeros(c3, np.float32))],
              kernel_shape=[2, 2], strides=[2, 2])
    d3 = block(g.op("Concat", [up, e3], axis=1), c3 * 2, c3)
    # up 2: Resize nearest x2, then 1x1 conv
    empty = g.const(np.zeros(0, np.float32), "no_roi")
    scales = g.const(np.array([1, 1, 2, 2], np.float32), "scales")
    up = g.op("Resize", [d3, empty, scales], mode="nearest")
    up = g.op("Conv", [up, g.weight((c2, c3, 1, 1), fan_in=c3)], kernel_shape=[1, 1])
    d2 = block(g.op("Concat", [up, e2], axis=1), c2 * 2, c2)
    # up 3: Resize linear x2 (half_pixel), then 1x1 conv
    up = g.op("Resize", [d2, empty, scales], mode="linear", coordinate_transformation_mode="half_pixel")
    up = g.op("Conv", [up, g.weight((c1, c2, 1, 1), fan_in=c2)], kernel_shape=[1, 1])
    d1 = block(g.op("Concat", [up, e1], axis=1), c1 * 2, c1)
    out = g.op("Conv", [d1, g.weight((1, c1, 1, 1), fan_in=c1), g.const(np.zeros(1, np.float32))],
               kernel_shape=[1, 1])
    g.nodes.append(helper.make_node("Sigmoid", [out], ["mask"]))
    model = g.model("small_unet", [helper.make_tensor_value_info("image", F, ["batch", 3, size, size])],
                    [helper.make_tensor_value_info("mask", F, ["batch", 1, size, size])])
    img = np.random.default_rng(seed + 1).standard_normal((1, 3, size, size)).astype(np.float32)
    return model, {"image": img}


# -- 500-tree ensemble ----------------------------------------------------------------------------

def trees_own(n_trees: int = 500, depth: int = 6, n_features: int = 32, rows: int = 1000, seed: int = 0):
    """TreeEnsembleRegressor (ai.onnx.ml 3): n_trees complete binary trees of the given depth, BRANCH_LEQ."""
    rng = np.random.default_rng(seed)
    inner = 2 ** depth - 1                         # per tree: inner nodes 0..inner-1, leaves inner..2*inner
    per_tree = 2 * inner + 1
    node_ids = np.tile(np.arange(per_tree), n_trees)
    tree_ids = np.repeat(np.arange(n_trees), per_tree)
    local = np.arange(per_tree)
    is_leaf = local >= inner
    modes = np.where(np.tile(is_leaf, n_trees), "LEAF", "BRANCH_LEQ")
    true_ids = np.tile(np.where(is_leaf, 0, 2 * local + 1), n_trees)       # heap layout: left = 2i + 1
    false_ids = np.tile(np.where(is_leaf, 0, 2 * local + 2), n_trees)
    feat = np.where(np.tile(is_leaf, n_trees), 0, rng.integers(0, n_features, size=n_trees * per_tree))
    thr = np.where(np.tile(is_leaf, n_trees), 0.0, rng.standard_normal(n_trees * per_tree) * 0.8).astype(np.float32)
    leaf_mask = np.tile(is_leaf, n_trees)
    node = helper.make_node(
        "TreeEnsembleRegressor", ["X"], ["Y"], domain="ai.onnx.ml", n_targets=1, aggregate_function="SUM",
        nodes_treeids=tree_ids.tolist(), nodes_nodeids=node_ids.tolist(), nodes_modes=modes.tolist(),
        nodes_featureids=feat.tolist(), nodes_values=thr.tolist(), nodes_truenodeids=true_ids.tolist(),
        nodes_falsenodeids=false_ids.tolist(), nodes_hitrates=[1.0] * len(node_ids),
        nodes_missing_value_tracks_true=[0] * len(node_ids),
        target_treeids=tree_ids[leaf_mask].tolist(), target_nodeids=node_ids[leaf_mask].tolist(),
        target_ids=[0] * int(leaf_mask.sum()),
        target_weights=(rng.standard_normal(int(leaf_mask.sum())) * 0.1).astype(np.float32).tolist(),
        base_values=[0.5])
    graph = helper.make_graph([node], "tree_ensemble", [helper.make_tensor_value_info("X", F, ["N", n_features])],
                              [helper.make_tensor_value_info("Y", F, ["N", 1])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                helper.make_opsetid("ai.onnx.ml", ML_OPSET)],
                          producer_name="onnx_mini-benchmarks")
    m.ir_version = IR_VERSION
    onnx.checker.check_model(m)
    x = np.random.default_rng(seed + 1).standard_normal((rows, n_features)).astype(np.float32)
    return m, {"X": x}


TREE_ROWS = 1000


def trees_builder() -> tuple[Callable, str]:
    """The 500-tree builder: bench_trees.py's forest when that file is there (another helper's; its
    Forest(N_TREES, DEPTH, N_FEATURES).regressor_ml3(), fed TREE_ROWS standard-normal rows, seed 1),
    else trees_own. Nothing is built here (a forest is large: keep imports cheap)."""
    try:
        sys.path.insert(0, str(Path(__file__).parent))
        import bench_trees  # noqa: PLC0415
    except Exception:
        return trees_own, "models.trees_own"
    forest_cls = getattr(bench_trees, "Forest", None)
    if forest_cls is not None and hasattr(forest_cls, "regressor_ml3"):
        def from_forest():
            n_features = bench_trees.N_FEATURES
            model = forest_cls(bench_trees.N_TREES, bench_trees.DEPTH, n_features).regressor_ml3()
            x = np.random.default_rng(1).standard_normal((TREE_ROWS, n_features)).astype(np.float32)
            return model, {model.graph.input[0].name: x}
        return from_forest, "bench_trees.Forest.regressor_ml3"
    return trees_own, "models.trees_own"


def trees():
    fn, _ = trees_builder()
    return fn()


BUILDERS: dict[str, Callable[[], tuple[onnx.ModelProto, dict]]] = {
    "bert": bert, "gru": gru, "lstm": lstm, "mobilenet": mobilenet, "unet": unet, "trees": trees,
}
DESCRIPTIONS = {
    "bert": "BERT-style encoder, 2 layers, hidden 256, 4 heads, batch 2 x seq 128",
    "gru": "GRU hidden 256, seq 100, batch 16, input 128",
    "lstm": "LSTM hidden 256, seq 100, batch 16, input 128",
    "mobilenet": "MobileNet-v1-like depthwise-separable CNN, [1,3,224,224]",
    "unet": "small U-Net (ConvTranspose + Resize), [1,3,128,128]",
    "trees": "500-tree ensemble (TreeEnsembleRegressor; depth 6, 32 features), 1000 rows",
}
if trees_builder()[1].startswith("bench_trees.Forest"):
    DESCRIPTIONS["trees"] = (f"500-tree ensemble (bench_trees.py's forest: TreeEnsembleRegressor, depth "
                             f"{__import__('bench_trees').DEPTH}), {TREE_ROWS} rows")


def compare(a: list, b: list, rtol: float = 1e-3) -> float:
    """Largest |a - b| over the outputs, relative to each output's max |b| (0 = equal)."""
    worst = 0.0
    for x, y in zip(a, b):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        if x.shape != y.shape:
            return math.inf
        scale = max(float(np.abs(y).max()) if y.size else 0.0, 1e-6)
        worst = max(worst, float(np.abs(x - y).max()) / scale if y.size else 0.0)
    return worst


def main() -> int:
    import onnx_mini
    import onnxruntime as ort
    bad = 0
    for name, build in BUILDERS.items():
        model, feeds = build()
        mini = list(onnx_mini.prepare(model).run(feeds))
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        base = sess.run(None, feeds)
        err = compare(mini, base)
        ok = err <= 1e-3
        bad += not ok
        shapes = ", ".join(str(tuple(np.shape(o))) for o in base)
        print(f"{name:10s} nodes {len(model.graph.node):4d}  outputs {shapes:28s} max rel err {err:.1e}  "
              f"{'ok' if ok else 'DIFFERS'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
