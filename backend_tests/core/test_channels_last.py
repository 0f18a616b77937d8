"""optimize/channels_last.py: regions of 2-D Convs (two at least, one depthwise) joined by elementwise
steps run channels-last (fused ConvNHWC), with Transposes only where values enter or leave the
region; where it fires, where it must not, and the values against the graph run as written."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_mini
from onnx_mini.optimize import FUSED_DOMAIN, PASSES
from helpers import F, init, model, steps

pytestmark = pytest.mark.filterwarnings("error::onnx_mini.optimize.OptimizationWarning")
RNG = np.random.default_rng(11)
NHWC = (FUSED_DOMAIN, "ConvNHWC")
T = ("", "Transpose")


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def check(m, feeds, rtol=1e-4, atol=1e-5):
    """-> (the optimised model, its steps); its results are those of the graph as written (rtol 1e-4:
    float32 sums of up to four chained Convs in another order; 1.7e-5 was seen at 1e-5 with other draws)."""
    opt, raw = onnx_mini.prepare(m), onnx_mini.prepare(m, optimize=False)
    got, ref = opt.run(feeds), raw.run(feeds)
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype and g.shape == r.shape
        np.testing.assert_allclose(g, r, rtol=rtol, atol=atol)
    return opt, steps(opt)


def block(c=16, m=24, extra_nodes=(), outputs=("y",), x_shape=(2, 16, 12, 10), dtype=np.float32, dw_attrs=None,
          pw_w=None):
    """x -> depthwise 3x3 (Clip 0..6) -> pointwise (c -> m) -> Relu -> y, weights constants."""
    ft = F if dtype == np.float32 else TensorProto.DOUBLE
    nodes = [helper.make_node("Conv", ["x", "wd", "bd"], ["d"], group=c, pads=[1, 1, 1, 1], **(dw_attrs or {})),
             helper.make_node("Clip", ["d", "lo", "hi"], ["dc"]),
             helper.make_node("Conv", ["dc", "wp"], ["p"]),
             helper.make_node("Relu", ["p"], ["y"]), *extra_nodes]
    inits = [init("wd", rand(c, 1, 3, 3, dtype=dtype)), init("bd", rand(c, dtype=dtype)),
             init("lo", np.array(0, dtype)), init("hi", np.array(6, dtype)),
             init("wp", rand(m, c, 1, 1, dtype=dtype) if pw_w is None else pw_w)]
    return model(nodes, [("x", ft, list(x_shape))], [(o, ft, None) for o in outputs], inits)


def test_depthwise_pointwise_block_runs_channels_last():
    x = rand(2, 16, 12, 10)
    rep, s = check(block(), [x])
    assert s == [T, NHWC, NHWC, T]          # Clip and Relu fused into the Convs, one Transpose each way
    info = rep.plan.infos[1]
    assert info.fused_from and "Conv" in info.fused_from[0]


@pytest.mark.parametrize("algorithm", ["im2col", "depthwise-flat"])
def test_forced_conv_algorithm_is_honoured_inside_a_region(algorithm):
    # prepare(model, conv_algorithm=...) forces that NCHW algorithm for every Conv where it applies: the
    # region's Convs run it on X transposed (the depthwise one: im2col or depthwise-flat; the pointwise
    # one: im2col, or its own pointwise where depthwise-flat does not apply)
    x = rand(2, 16, 12, 10)
    m = block()
    rep = onnx_mini.prepare(m, conv_algorithm=algorithm)
    got = rep.run([x])[0]
    np.testing.assert_allclose(got, onnx_mini.prepare(m, optimize=False).run([x])[0], rtol=1e-5, atol=1e-5)
    dw, pw = [i.kernel for i in rep.plan.infos if i.op_type == "ConvNHWC"]
    assert set(dw.algorithms.values()) == {algorithm}
    assert set(pw.algorithms.values()) == {"im2col" if algorithm == "im2col" else "pointwise"}
    # not forced: the channels-last paths, as the profiler names them
    plain = onnx_mini.prepare(m)
    plain.run([x])
    dw, pw = [i.kernel for i in plain.plan.infos if i.op_type == "ConvNHWC"]
    assert set(dw.algorithms.values()) == {"nhwc-depthwise"} and set(pw.algorithms.values()) == {"nhwc-pointwise"}


def test_values_match_onnxruntime_and_callers_arrays_untouched():
    x = rand(1, 16, 9, 13)
    keep = x.copy()
    x.flags.writeable = False
    m = block(x_shape=(1, 16, 9, 13))
    y = onnx_mini.prepare(m).run([x])[0]
    np.testing.assert_array_equal(x, keep)
    ort = pytest.importorskip("onnxruntime")
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": keep})[0]
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["pointwise_only", "one_depthwise", "dilated", "fed_weights", "float16",
                                  "grouped", "optimize_off"])
def test_does_not_fire(case):
    x = rand(2, 16, 12, 10)
    if case == "pointwise_only":
        m = block(extra_nodes=[helper.make_node("Conv", ["y", "wq"], ["z"])], outputs=("z",))
        del m.graph.node[0].attribute[:]                          # group 1, 1x1: no depthwise
        m.graph.initializer[0].CopyFrom(init("wd", rand(16, 16, 1, 1)))
        m.graph.initializer.append(init("wq", rand(8, 24, 1, 1)))
    elif case == "one_depthwise":
        m = block()
        del m.graph.node[2:]
        m.graph.node.append(helper.make_node("Relu", ["dc"], ["y"]))
    elif case == "dilated":
        m = block(dw_attrs=dict(dilations=[2, 2]))
    elif case == "fed_weights":
        m = block()
        m.graph.input.append(helper.make_tensor_value_info("wp", F, [24, 16, 1, 1]))
        del m.graph.initializer[4]
    elif case == "float16":
        m = block()
        for i, name in ((0, "wd"), (1, "bd"), (2, "lo"), (3, "hi"), (4, "wp")):
            half = numpy_helper.to_array(m.graph.initializer[i]).astype(np.float16)
            m.graph.initializer[i].CopyFrom(init(name, half))
        m.graph.input[0].type.tensor_type.elem_type = TensorProto.FLOAT16
        m.graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT16
        x = x.astype(np.float16)
    elif case == "grouped":                 # group 4 of 16 channels: neither 1 nor depthwise
        m = block()
        m.graph.node[0].attribute[0].i = 4
        m.graph.initializer[0].CopyFrom(init("wd", rand(16, 4, 3, 3)))
    else:
        m = block()
    feeds = [x]
    if case == "fed_weights":
        feeds.append(rand(24, 16, 1, 1))
    if case == "optimize_off":
        assert all(d == "" for d, _ in steps(onnx_mini.prepare(m, optimize=False)))
        return
    rep, s = check(m, feeds, rtol=1e-2 if case == "float16" else 1e-5, atol=1e-2 if case == "float16" else 1e-5)
    assert NHWC not in s and T not in s


def test_pass_can_be_left_out(monkeypatch):
    monkeypatch.setattr("onnx_mini.optimize.PASSES", tuple(p for p in PASSES if p != "channels_last"))
    assert NHWC not in steps(onnx_mini.prepare(block()))


def test_graph_output_and_outside_reader_inside_a_region():
    # dc is a graph output and read by a Softmax over the channels (not layout-agnostic): both read the
    # NCHW value from one Transpose back, while the region goes on channels-last to y
    extra = [helper.make_node("Softmax", ["dc"], ["s"], axis=1)]
    m = block(extra_nodes=extra, outputs=("y", "dc", "s"))
    rep, s = check(m, [rand(2, 16, 12, 10)])
    assert s.count(NHWC) == 2 and s.count(T) == 3       # x in; dc and y out
    assert ("", "Softmax") in s


def test_residual_add_of_two_region_values_stays_inside():
    # depthwise -> pointwise p; p + depthwise(p) (a residual) -> Mul by a one-element constant -> pointwise
    c = 16
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], group=c, pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["a", "w2", "b2"], ["p"]),
             helper.make_node("Conv", ["p", "w3"], ["q"], group=c, pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["p", "q"], ["r"]),
             helper.make_node("Mul", ["r", "half"], ["h"]),
             helper.make_node("Conv", ["h", "w4"], ["y"])]
    inits = [init("w1", rand(c, 1, 3, 3)), init("w2", rand(c, c, 1, 1)), init("b2", rand(c)),
             init("w3", rand(c, 1, 3, 3)), init("half", np.array([[[[0.5]]]], np.float32)),
             init("w4", rand(8, c, 1, 1))]
    m = model(nodes, [("x", F, [1, c, 7, 9])], [("y", F, None)], inits)
    rep, s = check(m, [rand(1, c, 7, 9)])
    assert s.count(T) == 2 and s.count(NHWC) == 4       # the Add was folded as Conv q's residual
    assert all(op in ("Transpose", "ConvNHWC", "Mul", "Add") for _, op in s)


def test_residual_from_outside_enters_through_a_transpose():
    c = 16
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], group=c, pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["a", "w2"], ["p"]),
             helper.make_node("Add", ["p", "x"], ["y"])]
    inits = [init("w1", rand(c, 1, 3, 3)), init("w2", rand(c, c, 1, 1))]
    m = model(nodes, [("x", F, [2, c, 5, 6])], [("y", F, None)], inits)
    rep, s = check(m, [rand(2, c, 5, 6)])
    assert s.count(T) == 2 and s.count(NHWC) == 2       # x transposed once, read by both as NHWC


def test_stem_with_few_channels_stays_nchw():
    nodes = [helper.make_node("Conv", ["x", "w0"], ["s"], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["s"], ["x1"])]
    m = block(x_shape=(1, 3, 24, 20))
    m.graph.node[0].input[0] = "x1"
    for n in reversed(nodes):
        m.graph.node.insert(0, n)
    m.graph.initializer.append(init("w0", rand(16, 3, 3, 3)))
    rep, s = check(m, [rand(1, 3, 24, 20)])
    assert s[0] == (FUSED_DOMAIN, "Conv") and s[1:] == [T, NHWC, NHWC, T]


def qdq(x, y, scale, zp, prefix):
    return [helper.make_node("QuantizeLinear", [x, f"{prefix}_s", f"{prefix}_z"], [f"{prefix}_q"]),
            helper.make_node("DequantizeLinear", [f"{prefix}_q", f"{prefix}_s", f"{prefix}_z"], [y])]


def test_qdq_chain_runs_channels_last():
    c = 16
    nodes = [*qdq("x", "xd", 0.05, 128, "in"),
             helper.make_node("Conv", ["xd", "w1", "b1"], ["a"], group=c, pads=[1, 1, 1, 1]),
             *qdq("a", "ad", 0.1, 128, "a"),
             helper.make_node("HardSwish", ["ad"], ["hs"]),
             *qdq("hs", "hd", 0.1, 128, "h"),
             helper.make_node("Conv", ["hd", "w2", "b2"], ["p"]),
             *qdq("p", "y", 0.2, 128, "p")]
    inits = [init("w1", rand(c, 1, 3, 3)), init("b1", rand(c)), init("w2", rand(24, c, 1, 1)), init("b2", rand(24))]
    for prefix, s in (("in", 0.05), ("a", 0.1), ("h", 0.1), ("p", 0.2)):
        inits += [init(f"{prefix}_s", np.array(s, np.float32)), init(f"{prefix}_z", np.array(128, np.uint8))]
    m = model(nodes, [("x", F, [1, c, 10, 11])], [("y", F, None)], inits)
    x = rand(1, c, 10, 11)
    opt, raw = onnx_mini.prepare(m), onnx_mini.prepare(m, optimize=False)
    s = steps(opt)
    qd = (FUSED_DOMAIN, "QuantizeDequantize")
    # the QDQ steps between and after the Convs: NHWC, each run in its Conv's epilogue (optimize/requantize.py:
    # X, W, B, Z, then the LookupTable's / the pair's inputs)
    assert s == [qd, T, NHWC, NHWC, T]
    assert [len(i.inputs) for i in opt.plan.infos if i.op_type == "ConvNHWC"] == [9, 6]
    got, ref = opt.run([x])[0], raw.run([x])[0]
    # a code may differ by one where a float lands on a rounding tie (sums in another order)
    assert np.abs(got - ref).max() <= 0.2 + 1e-6
    assert np.mean(got != ref) < 0.01


def test_if_branch_capturing_a_region_value_reads_nchw():
    then = helper.make_graph([helper.make_node("Softmax", ["dc"], ["t"], axis=1)], "then", [],
                             [helper.make_tensor_value_info("t", F, None)])
    other = helper.make_graph([helper.make_node("Identity", ["dc"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", F, None)])
    extra = [helper.make_node("If", ["cond"], ["z"], then_branch=then, else_branch=other)]
    m = block(extra_nodes=extra, outputs=("y", "z"))
    m.graph.input.append(helper.make_tensor_value_info("cond", TensorProto.BOOL, []))
    for cond in (True, False):
        rep, s = check(m, [rand(2, 16, 12, 10), np.array(cond)])
        assert s.count(NHWC) == 2 and s.count(T) == 3


@pytest.mark.parametrize("c, fires", [(16, False), (48, True)])
def test_strided_depthwise_of_few_channels_stays_nchw(c, fires):
    # 3x3 /2 depthwise with <= 32 channels: NCHW's im2col is faster (ops/nn/conv/channels_last.worthwhile)
    m = block(c=c, x_shape=(1, c, 12, 10), dw_attrs=dict(strides=[2, 2]))
    rep, s = check(m, [rand(1, c, 12, 10)])
    assert (s == [T, NHWC, NHWC, T]) if fires else (NHWC not in s)


def test_strided_depthwise_of_few_channels_joins_the_region_it_reads():
    """Between two regions (a MobileNet's 16-channel block, then a 3x3 /2 depthwise of 16 channels and a
    pointwise Conv) the strided depthwise Conv that alone stays NCHW joins the region whose value it reads:
    one region, one Transpose each way, instead of leaving and entering between them."""
    c = 16
    nodes = [helper.make_node("Conv", ["x", "wd", "bd"], ["d"], group=c, pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["d"], ["dr"]),
             helper.make_node("Conv", ["dr", "wp"], ["p"]),
             helper.make_node("Conv", ["p", "ws"], ["s"], group=c, pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Conv", ["s", "wq"], ["y"])]
    inits = [init("wd", rand(c, 1, 3, 3)), init("bd", rand(c)), init("wp", rand(c, c, 1, 1)),
             init("ws", rand(c, 1, 3, 3)), init("wq", rand(24, c, 1, 1))]
    m = model(nodes, [("x", F, [1, c, 12, 10])], [("y", F, None)], inits)
    rep, s = check(m, [rand(1, c, 12, 10)])
    assert s == [T, NHWC, NHWC, NHWC, NHWC, T]
    # where its input comes from outside a region it stays NCHW (test_strided_depthwise_of_few_channels_stays_nchw)


# -- steps whose axes are renamed: Resize, Concat, GlobalAveragePool ------------------------------------

def pyramid(resize, opset=13, axis=1, extra_inits=()):
    """A feature pyramid's merge: x -> depthwise -> pointwise p (16x12) -> depthwise /2 -> pointwise q (8x6)
    -> `resize` (the Resize / Upsample node taking q to u, 16x12) -> Add(p, u) -> Concat([s, p], axis)
    -> pointwise -> y."""
    c = 16
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], group=c, pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["a", "w2", "b2"], ["p"]),
             helper.make_node("Conv", ["p", "w3"], ["d"], group=c, pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Conv", ["d", "w4"], ["q"]),
             resize,
             helper.make_node("Add", ["p", "u"], ["s"]),
             helper.make_node("Concat", ["s", "p"], ["cat"], axis=axis),
             helper.make_node("Conv", ["cat", "w5"], ["y"])]
    # weights scaled to keep the sums near 1 (float32 rounding in another order stays within check's atol)
    inits = [init("w1", rand(c, 1, 3, 3) / 3), init("w2", rand(c, c, 1, 1) / 4), init("b2", rand(c)),
             init("w3", rand(c, 1, 3, 3) / 3), init("w4", rand(c, c, 1, 1) / 4), init("w5", rand(8, 2 * c, 1, 1) / 6),
             *extra_inits]
    return model(nodes, [("x", F, [1, c, 16, 12])], [("y", F, None)], inits, opset=opset)


RESIZES = {   # name: (the node, its constants, opset)
    "scales": (helper.make_node("Resize", ["q", "", "sc"], ["u"], mode="nearest"),
               [init("sc", np.array([1, 1, 2, 2], np.float32))], 13),
    "sizes": (helper.make_node("Resize", ["q", "", "", "sz"], ["u"], mode="linear"),
              [init("sz", np.array([1, 16, 16, 12], np.int64))], 13),
    "resize10": (helper.make_node("Resize", ["q", "sc"], ["u"]), [init("sc", np.array([1, 1, 2, 2], np.float32))], 10),
    "axes": (helper.make_node("Resize", ["q", "", "sc"], ["u"], axes=[-1, 2], mode="cubic"),
             [init("sc", np.array([2, 2], np.float32))], 18),
    # roi differs along H and W: tf_crop_and_resize reads it per axis, permuted alike
    "crop": (helper.make_node("Resize", ["q", "roi", "", "sz"], ["u"], mode="linear",
                              coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=0.5),
             [init("roi", np.array([0, 0, 0.1, -0.2, 1, 1, 0.8, 1.1], np.float32)),
              init("sz", np.array([1, 16, 16, 12], np.int64))], 13),
}


@pytest.mark.parametrize("case", sorted(RESIZES))
@pytest.mark.parametrize("axis", [1, -3])
def test_pyramid_resize_add_concat_stay_channels_last(case, axis):
    node, inits, opset = RESIZES[case]
    rep, s = check(pyramid(node, opset, axis, inits), [rand(1, 16, 16, 12)])
    # one Transpose in, one out: the Resize, the Add and the Concat run on NHWC values between the Convs
    assert s.count(T) == 2 and s.count(NHWC) == 5
    assert [op for _, op in s if op not in ("Transpose", "ConvNHWC")] == ["Resize", "Add", "Concat"]


def test_resize_with_fed_scales_leaves_the_region():
    node = helper.make_node("Resize", ["q", "", "sc"], ["u"])
    m = pyramid(node)
    m.graph.input.append(helper.make_tensor_value_info("sc", F, [4]))
    rep, s = check(m, [rand(1, 16, 16, 12), np.array([1, 1, 2, 2], np.float32)])
    assert ("", "Resize") in s and s.count(T) > 2        # q leaves NCHW for it, u enters again


def test_concat_with_an_outside_input_leaves_the_region():
    # Concat([s, x]): x is not a region value, so the Concat runs NCHW on s's view
    node, inits, opset = RESIZES["scales"]
    m = pyramid(node, opset, 1, inits)
    m.graph.node[6].input[1] = "x"
    rep, s = check(m, [rand(1, 16, 16, 12)])
    i = s.index(("", "Concat"))
    assert s[i - 1] == T and NHWC not in s[i:]     # s leaves the region; the last Conv, alone, runs NCHW


def test_affine_after_activation_rides_along_into_the_region():
    # depthwise -> HardSwish -> Mul / Add of one-element constants (PP-LCNetV3) -> pointwise: the affine
    # joins the depthwise Conv (optimize/fuse.py), which keeps it as a ConvNHWC
    c = 16
    nodes = [helper.make_node("Conv", ["x", "wd", "bd"], ["d"], group=c, pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["d"], ["h"]), helper.make_node("Mul", ["h", "s"], ["hs"]),
             helper.make_node("Add", ["hs", "t"], ["a"]), helper.make_node("Conv", ["a", "wp"], ["y"])]
    inits = [init("wd", rand(c, 1, 3, 3)), init("bd", rand(c)), init("wp", rand(8, c, 1, 1)),
             init("s", np.array([0.75], np.float32)), init("t", np.array([-0.5], np.float32))]
    m = model(nodes, [("x", F, [2, c, 12, 10])], [("y", F, None)], inits)
    rep, s = check(m, [rand(2, c, 12, 10)])
    assert s == [T, NHWC, NHWC, T]
    assert [n.split("@")[0] for n in rep.plan.infos[1].fused_from] == ["Conv", "HardSwish", "Mul", "Add"]


def test_squeeze_excitation_pools_channels_last():
    """depthwise -> GlobalAveragePool -> 1x1 Conv, Relu -> 1x1 Conv, HardSigmoid -> Mul with the depthwise
    output -> pointwise: the pooling is the mean over H and W of the NHWC value (ReduceMean), the whole
    block one region."""
    c = 16
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["d"], group=c, pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["d"], ["g"]),
             helper.make_node("Conv", ["g", "w2", "b2"], ["r0"]),
             helper.make_node("Relu", ["r0"], ["r"]),
             helper.make_node("Conv", ["r", "w3", "b3"], ["h0"]),
             helper.make_node("HardSigmoid", ["h0"], ["h"]),
             helper.make_node("Mul", ["d", "h"], ["e"]),
             helper.make_node("Conv", ["e", "w4"], ["y"])]
    inits = [init("w1", rand(c, 1, 3, 3)), init("b1", rand(c)), init("w2", rand(4, c, 1, 1)), init("b2", rand(4)),
             init("w3", rand(c, 4, 1, 1)), init("b3", rand(c)), init("w4", rand(8, c, 1, 1))]
    m = model(nodes, [("x", F, [2, c, 9, 7])], [("y", F, None), ("g", F, None)], inits)
    rep, s = check(m, [rand(2, c, 9, 7)])
    assert ("", "GlobalAveragePool") not in s and ("", "ReduceMean") in s
    assert s.count(NHWC) == 4 and s.count(T) == 3        # x in; y and the pooled g (a graph output) out


# -- QLinearConv (the QOperator form): QLinearConvNHWC, bit for bit the NCHW kernel's codes --------------

QNHWC = (FUSED_DOMAIN, "QLinearConvNHWC")
U8, I8 = TensorProto.UINT8, TensorProto.INT8


def qconv(x, y, prefix, w, group=1, pads=(1, 1, 1, 1), strides=(1, 1), w_scale=None, bias=True):
    """A QLinearConv node x -> y (scales/zero points named after prefix) and its initializers."""
    m = w.shape[0]
    inits = [init(f"{prefix}_w", w), init(f"{prefix}_ws", w_scale if w_scale is not None else np.float32(0.02)),
             init(f"{prefix}_wz", np.int8(0)), init(f"{prefix}_ys", np.float32(0.3)),
             init(f"{prefix}_yz", np.uint8(128))]
    ins = [x, "xs", "xz", f"{prefix}_w", f"{prefix}_ws", f"{prefix}_wz", f"{prefix}_ys", f"{prefix}_yz"]
    if bias:
        inits.append(init(f"{prefix}_b", RNG.integers(-3000, 3000, m).astype(np.int32)))
        ins.append(f"{prefix}_b")
    attrs = dict(group=group, pads=list(pads), strides=list(strides)) if w.shape[2] > 1 else dict(group=group)
    return helper.make_node("QLinearConv", ins, [y], **attrs), inits


def qweights(*shape, extreme=False):
    if extreme:
        return RNG.choice(np.array([-128, 127], np.int8), size=shape)
    return RNG.integers(-128, 128, size=shape).astype(np.int8)


def qblock(c=16, m=24, x_shape=(2, 16, 9, 10), outputs=("y",), dw_attrs=None, extra_nodes=(), extreme=False,
           per_channel=False, xz=128):
    """uint8 x -> depthwise QLinearConv -> DQ, HardSwish, Q (a LookupTable) -> pointwise QLinearConv -> y,
    every input but x constant; the second conv reads the table's codes with scale 0.3, zero point 128."""
    dw, i1 = qconv("x", "d", "dw", qweights(c, 1, 3, 3, extreme=extreme), group=c, **(dw_attrs or {}))
    pw, i2 = qconv("h", "p", "pw", qweights(m, c, 1, 1, extreme=extreme),
                   w_scale=RNG.uniform(0.001, 0.01, m).astype(np.float32) if per_channel else None)
    pw.input[1], pw.input[2] = "dw_ys", "dw_yz"
    nodes = [dw, helper.make_node("DequantizeLinear", ["d", "dw_ys", "dw_yz"], ["df"]),
             helper.make_node("HardSwish", ["df"], ["hf"]),
             helper.make_node("QuantizeLinear", ["hf", "dw_ys", "dw_yz"], ["h"]),
             pw, helper.make_node("Identity", ["p"], ["y"]), *extra_nodes]
    inits = i1 + i2 + [init("xs", np.float32(0.05)), init("xz", np.uint8(xz))]
    return model(nodes, [("x", U8, list(x_shape))], [(o, U8, None) for o in outputs], inits)


def qcheck(m, feeds, monkeypatch):
    """-> steps of the optimised model, whose codes equal those with the pass left out, bit for bit."""
    opt = onnx_mini.prepare(m)
    with monkeypatch.context() as p:
        p.setattr("onnx_mini.optimize.PASSES", tuple(x for x in PASSES if x != "channels_last"))
        off = onnx_mini.prepare(m)
    for g, r in zip(opt.run(feeds), off.run(feeds)):
        assert g.dtype == r.dtype and g.shape == r.shape
        np.testing.assert_array_equal(g, r)
    return steps(opt)


def qx(*shape, extreme=False):
    if extreme:
        return RNG.choice(np.array([0, 255], np.uint8), size=shape)
    return RNG.integers(0, 256, size=shape).astype(np.uint8)


@pytest.mark.parametrize("extreme", [False, True])
@pytest.mark.parametrize("xz", [0, 128, 255])
def test_qlinear_conv_block_runs_channels_last_bit_for_bit(monkeypatch, extreme, xz):
    m = qblock(extreme=extreme, xz=xz, per_channel=extreme)
    s = qcheck(m, [qx(2, 16, 9, 10, extreme=extreme)], monkeypatch)
    assert s == [T, QNHWC, (FUSED_DOMAIN, "LookupTable"), QNHWC, T, ("", "Identity")]


@pytest.mark.parametrize("strides, c, fires", [((2, 2), 48, True), ((2, 2), 16, False), ((1, 1), 16, True)])
def test_qlinear_strided_depthwise(monkeypatch, strides, c, fires):
    m = qblock(c=c, x_shape=(1, c, 13, 36), dw_attrs=dict(strides=strides))
    s = qcheck(m, [qx(1, c, 13, 36)], monkeypatch)
    assert (s.count(QNHWC) == 2) if fires else (QNHWC not in s and T not in s)


@pytest.mark.parametrize("case", ["fed_weights", "fed_scale", "grouped", "one_d", "bound"])
def test_qlinear_conv_does_not_fire(monkeypatch, case):
    x_shape, feeds = (1, 16, 9, 10), []
    m = qblock(x_shape=x_shape)
    if case == "fed_weights":
        m.graph.input.append(helper.make_tensor_value_info("pw_w", I8, [24, 16, 1, 1]))
        m.graph.initializer.remove(next(i for i in m.graph.initializer if i.name == "pw_w"))
        feeds = [qweights(24, 16, 1, 1)]            # the depthwise one left alone in its region
    elif case == "fed_scale":                       # x's scale a graph input: not a constant
        m.graph.initializer.remove(next(i for i in m.graph.initializer if i.name == "xs"))
        m.graph.input.append(helper.make_tensor_value_info("xs", F, []))
        feeds = [np.array(0.05, np.float32)]
    elif case == "grouped":                         # group 4 of 16 channels: neither 1 nor depthwise
        m.graph.node[0].attribute[0].i = 4
        w = next(i for i in m.graph.initializer if i.name == "dw_w")
        w.CopyFrom(init("dw_w", qweights(16, 4, 3, 3)))
    elif case == "one_d":
        x_shape = (1, 16, 9)
        m = qblock(x_shape=x_shape)
        for n in (m.graph.node[0], m.graph.node[4]):
            for a in n.attribute:
                if a.name == "pads":
                    a.ints[:] = [1, 1]
                if a.name == "strides":
                    a.ints[:] = [1]
        for name, shape in (("dw_w", (16, 1, 3)), ("pw_w", (24, 16, 1))):
            w = next(i for i in m.graph.initializer if i.name == name)
            w.CopyFrom(init(name, qweights(*shape)))
    else:                   # 520 channels of codes - 128 against w - w_zp = -255: |acc| may pass 2^24
        m = qblock(c=520, m=4, x_shape=(1, 520, 3, 3))
        w = next(i for i in m.graph.initializer if i.name == "pw_w")
        w.CopyFrom(init("pw_w", np.full((4, 520, 1, 1), -128, np.int8)))
        wz = next(i for i in m.graph.initializer if i.name == "pw_wz")      # |w - w_zp| = 255
        wz.CopyFrom(init("pw_wz", np.int8(127)))
        x_shape = (1, 520, 3, 3)
    s = qcheck(m, [qx(*x_shape), *feeds], monkeypatch)
    assert QNHWC not in s and T not in s


def test_qlinear_region_with_graph_output_and_qlinear_add(monkeypatch):
    # the LookupTable's codes h are a graph output (read back NCHW); QLinearAdd(p, h) joins the region
    extra = [helper.make_node("QLinearAdd", ["p", "pw_ys", "pw_yz", "h", "dw_ys", "dw_yz", "as", "az"], ["r"],
                              domain="com.microsoft"),
             helper.make_node("QLinearMul", ["r", "as", "az", "two", "as", "az", "as", "az"], ["r2"],
                              domain="com.microsoft"),
             helper.make_node("QLinearConv", ["r2", "as", "az", "pw_w", "pw_ws", "pw_wz", "pw_ys", "pw_yz"], ["z"])]
    m = qblock(m=16, extra_nodes=extra, outputs=("z", "h"))
    m.graph.initializer.extend([init("as", np.float32(0.4)), init("az", np.uint8(120)), init("two", np.uint8(125))])
    m.graph.initializer.remove(next(i for i in m.graph.initializer if i.name == "pw_w"))
    m.graph.initializer.append(init("pw_w", qweights(16, 16, 1, 1)))
    m.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    s = qcheck(m, [qx(2, 16, 9, 10)], monkeypatch)
    assert s.count(QNHWC) == 3 and s.count(T) == 3      # x in; h and z out
    assert (("com.microsoft", "QLinearAdd") in s) and ("com.microsoft", "QLinearMul") in s


# -- ShuffleNet: grouped 1x1 Convs, the channel shuffle, the shortcut pools -----------------------------

def shufflenet_units():
    """ShuffleNet's two units: x -> grouped 1x1 (4 groups) + Relu -> channel shuffle (Reshape, Transpose,
    Reshape) -> depthwise 3x3 -> grouped 1x1 -> Add x -> Relu -> u; then u's shortcut AveragePool 3x3 /2 and
    its branch (grouped 1x1, depthwise 3x3 /2) joined by Concat, and a MaxPool 2x2 -> y."""
    c, g = 16, 4
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["a"], group=g),
             helper.make_node("Relu", ["a"], ["ar"]),
             helper.make_node("Reshape", ["ar", "split"], ["a5"]),
             helper.make_node("Transpose", ["a5"], ["t5"], perm=[0, 2, 1, 3, 4]),
             helper.make_node("Reshape", ["t5", "join"], ["s"]),
             helper.make_node("Conv", ["s", "wd"], ["d"], group=c, pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["d", "w2", "b2"], ["e"], group=g),
             helper.make_node("Add", ["e", "x"], ["r"]),
             helper.make_node("Relu", ["r"], ["u"]),
             helper.make_node("AveragePool", ["u"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["u", "w3"], ["f"], group=g),
             helper.make_node("Conv", ["f", "wq"], ["q"], group=c, pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Concat", ["q", "p"], ["cat"], axis=1),
             helper.make_node("MaxPool", ["cat"], ["y"], kernel_shape=[2, 2], strides=[2, 2])]
    inits = [init("w1", rand(c, c // g, 1, 1) / 2), init("b1", rand(c)), init("wd", rand(c, 1, 3, 3) / 3),
             init("w2", rand(c, c // g, 1, 1) / 2), init("b2", rand(c)), init("w3", rand(c, c // g, 1, 1) / 2),
             init("wq", rand(c, 1, 3, 3) / 3),
             init("split", np.array([1, g, c // g, 8, 8], np.int64)), init("join", np.array([1, c, 8, 8], np.int64))]
    return model(nodes, [("x", F, [1, c, 8, 8])], [("y", F, None)], inits, opset=13)


def test_shufflenet_units_run_channels_last():
    rep, s = check(shufflenet_units(), [rand(1, 16, 8, 8)])
    # x enters once (the first Conv and the residual read the same copy), y leaves once; the shuffle is
    # the first Conv's column order, the residual Add and Relu the second grouped Conv's epilogue, the pools
    # and the Concat run on NHWC values
    assert s.count(T) == 2 and s.count(NHWC) == 5
    assert [op for _, op in s if op not in ("Transpose", "ConvNHWC")] == ["PoolNHWC", "Concat", "PoolNHWC"]
    shuffled = [i for i in rep.plan.infos if i.op_type == "ConvNHWC"][0]
    assert [n.split("@")[0] for n in shuffled.fused_from] == ["Conv", "Relu", "Reshape", "Transpose", "Reshape"]
    grouped = [set(i.kernel.algorithms.values()) for i in rep.plan.infos if i.op_type == "ConvNHWC"]
    assert grouped[0] == grouped[2] == grouped[3] == {"nhwc-grouped"}


def test_grouped_conv_of_a_larger_kernel_stays_out():
    m = shufflenet_units()
    m.graph.node[6].attribute.append(helper.make_attribute("pads", [1, 1, 1, 1]))
    m.graph.initializer[3].CopyFrom(init("w2", rand(16, 4, 3, 3) / 6))
    rep, s = check(m, [rand(1, 16, 8, 8)])
    assert (FUSED_DOMAIN, "Conv") in s      # the grouped 3x3 Conv (its residual and Relu fused) runs NCHW
