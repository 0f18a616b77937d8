"""com.microsoft transformer / fused operators (onnx_mini/ops/contrib/{transformer,fused,misc}.py).

Expected values are computed here from onnxruntime's ContribOperators documentation with numpy
(float64 references); when onnxruntime is installed, the same nodes (and a BERT layer as the
transformer optimizer writes it) are also cross-checked against it."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper

import onnx_mini
from onnx_mini.errors import InvalidNodeError, KernelError

from helpers import raises_naming_node, run_node

MS = "com.microsoft"
BF16 = np.dtype(ml_dtypes.bfloat16)
FLOATS = {"float": np.float32, "float16": np.float16, "bfloat16": BF16, "double": np.float64}
TOL = {np.dtype(np.float32): 2e-5, np.dtype(np.float16): 4e-3, BF16: 3e-2, np.dtype(np.float64): 1e-10}


def ms(op, inputs, n_outputs=1, **attrs):
    return run_node(op, 1, inputs, n_outputs, domain=MS, **attrs)


def rnd(shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def close(got, exp, dtype=np.float32, tol=None):
    """got has exactly `dtype` and matches the float64 reference exp (relative to its magnitude)."""
    dtype = np.dtype(dtype)
    assert type(got) is np.ndarray and got.dtype == dtype, (type(got), got.dtype, dtype)
    assert got.shape == np.shape(exp), (got.shape, np.shape(exp))
    t = TOL[dtype] if tol is None else tol
    np.testing.assert_allclose(got.astype(np.float64), np.asarray(exp, np.float64), rtol=t, atol=t)


def as_type(x, name):
    """x rounded to the type, and that rounded value back in float64 (the reference's input)."""
    y = np.asarray(x).astype(FLOATS[name])
    return y, y.astype(np.float64)


_erf = np.vectorize(math.erf)


def gelu(x):
    return 0.5 * x * (1 + _erf(x / math.sqrt(2)))


def fast_gelu(x):
    return 0.5 * x * (1 + np.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))


def softmax(s):
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# -- onnxruntime cross-check ---------------------------------------------------------------------

try:
    import onnxruntime as ORT
except ImportError:          # the cross-checks are optional: without onnxruntime they do nothing
    ORT = None               # (and test_onnxruntime_cross_checks_ran reports the skip)


def test_onnxruntime_cross_checks_ran():
    """The tests below compare with onnxruntime only when it is installed; this test says whether."""
    ort = pytest.importorskip("onnxruntime")
    assert ort.get_available_providers()


def ort_node(op, inputs, n_outputs=1, **attrs):
    """The same one-node com.microsoft model run by onnxruntime's CPU provider (None without it)."""
    if ORT is None:
        return None
    ort = ORT
    names = ["" if x is None else f"in{k}" for k, x in enumerate(inputs)]
    while names and not names[-1]:
        names.pop()
    node = helper.make_node(op, names, [f"out{k}" for k in range(n_outputs)], domain=MS, **attrs)
    vi = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
          for n, x in zip(names, inputs) if x is not None]
    outs = [helper.make_empty_tensor_value_info(f"out{k}") for k in range(n_outputs)]
    graph = helper.make_graph([node], "g", vi, outs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)],
                              ir_version=9)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {n: x for n, x in zip(names, inputs) if x is not None})


def agree(got, op, inputs, n_outputs=1, tol=1e-5, **attrs):
    """got (one array, or a tuple of n_outputs) equals onnxruntime's outputs (nothing without it)."""
    exp = ort_node(op, inputs, n_outputs, **attrs)
    if exp is None:
        return
    for a, b in zip(got if n_outputs > 1 else (got,), exp):
        assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
        np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=tol, atol=tol)


# -- Gelu family, BiasAdd, BiasSplitGelu -----------------------------------------------------------

@pytest.mark.parametrize("tname", ["float", "double", "float16", "bfloat16"])
def test_gelu_bias_gelu_fast_gelu_quick_gelu(tname):
    x, xf = as_type(np.linspace(-4, 4, 24).reshape(2, 3, 4), tname)
    b, bf = as_type([0.5, -1.0, 0.25, 2.0], tname)
    dt = x.dtype
    close(ms("Gelu", [x]), gelu(xf), dt)
    close(ms("BiasGelu", [x, b]), gelu(xf + bf), dt)
    close(ms("FastGelu", [x]), fast_gelu(xf), dt)
    close(ms("FastGelu", [x, b]), fast_gelu(xf + bf), dt)
    close(ms("QuickGelu", [x]), xf / (1 + np.exp(-np.float32(1.702) * xf)), dt)
    close(ms("QuickGelu", [x], alpha=-0.5), xf / (1 + np.exp(0.5 * xf)), dt)


def test_fast_gelu_is_the_documented_tanh_formula():
    x = np.array([-3, -1, -0.5, 0, 0.5, 1, 3], np.float32)
    doc = 0.5 * x * (1 + np.tanh(0.797885 * x + 0.035677 * x * x * x))
    np.testing.assert_allclose(ms("FastGelu", [x]), doc, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("tname", ["float", "float16"])
def test_bias_add_and_bias_split_gelu(tname):
    x, xf = as_type(rnd((2, 3, 4)), tname)
    skip, sf = as_type(rnd((2, 3, 4), 1), tname)
    b, bf = as_type(rnd(4, 2), tname)
    close(ms("BiasAdd", [x, b, skip]), xf + bf + sf, x.dtype)
    t = xf + bf
    close(ms("BiasSplitGelu", [x, b]), t[..., :2] * gelu(t[..., 2:]), x.dtype)


def test_gelu_family_errors_name_the_node():
    x = rnd((2, 4))
    with raises_naming_node(KernelError, "bias"):
        ms("BiasGelu", [x, rnd(3)])
    with raises_naming_node(KernelError, "even"):
        ms("BiasSplitGelu", [rnd((1, 2, 3)), rnd(3)])
    with raises_naming_node(KernelError, "same element type"):
        ms("FastGelu", [x, rnd(4).astype(np.float16)])


# -- FusedMatMul, FusedGemm, FusedConv, NhwcConv ---------------------------------------------------

@pytest.mark.parametrize("tname", ["float", "double", "float16", "bfloat16"])
def test_fused_matmul_types(tname):
    a, af = as_type(rnd((2, 3, 4)), tname)
    b, bf = as_type(rnd((2, 4, 5), 1), tname)
    close(ms("FusedMatMul", [a, b], alpha=0.5), 0.5 * af @ bf, a.dtype)


@pytest.mark.parametrize("ta,tb,tba,tbb", [(0, 0, 0, 0), (1, 0, 0, 0), (0, 1, 0, 0), (1, 1, 0, 0),
                                           (0, 0, 1, 0), (0, 0, 0, 1), (1, 1, 1, 1)])
def test_fused_matmul_transposes(ta, tb, tba, tbb):
    a = rnd((2, 3, 4, 5))        # logical A (batch 2, 3; M=4, K=5) and B (K=5, N=6)
    b = rnd((2, 3, 5, 6), 1)
    stored_a = a.swapaxes(-1, -2) if ta else a           # what transX undoes
    stored_a = stored_a.transpose(2, 0, 1, 3) if tba else stored_a   # (d0, batch..., last)
    stored_b = b.swapaxes(-1, -2) if tb else b
    stored_b = stored_b.transpose(2, 0, 1, 3) if tbb else stored_b
    attrs = dict(transA=ta, transB=tb, transBatchA=tba, transBatchB=tbb, alpha=2.0)
    got = ms("FusedMatMul", [np.ascontiguousarray(stored_a), np.ascontiguousarray(stored_b)], **attrs)
    close(got, 2.0 * (a.astype(np.float64) @ b.astype(np.float64)))
    agree(got, "FusedMatMul", [np.ascontiguousarray(stored_a), np.ascontiguousarray(stored_b)], **attrs)


def _act(name, x, *p):
    return {"": lambda: x, "Relu": lambda: np.maximum(x, 0), "Tanh": lambda: np.tanh(x),
            "Sigmoid": lambda: 1 / (1 + np.exp(-x)), "LeakyRelu": lambda: np.where(x >= 0, x, p[0] * x),
            "HardSigmoid": lambda: np.clip(p[0] * x + p[1], 0, 1), "Clip": lambda: np.clip(x, p[0], p[1]),
            "Elu": lambda: np.where(x >= 0, x, p[0] * np.expm1(np.minimum(x, 0)))}[name]()


@pytest.mark.parametrize("act,params", [("", ()), ("Relu", ()), ("Tanh", ()), ("Sigmoid", ()),
                                        ("LeakyRelu", (0.3,)), ("HardSigmoid", (0.3, 0.4)), ("Elu", (0.7,))])
def test_fused_gemm_activations(act, params):
    a, b, c = rnd((3, 4)), rnd((5, 4), 1), rnd(5, 2)
    attrs = dict(alpha=0.5, beta=2.0, transB=1)
    if act:
        attrs["activation"] = act
    for name, v in zip(("activation_alpha", "activation_beta"), params):
        attrs[name] = v
    got = ms("FusedGemm", [a, b, c], **attrs)
    ref = 0.5 * a.astype(np.float64) @ b.T.astype(np.float64) + 2.0 * c
    close(got, _act(act, ref, *params))
    if not act:                                       # onnxruntime refuses FusedGemm without an activation
        return
    agree(got, "FusedGemm", [a, b, c], **attrs)


@pytest.mark.parametrize("tname", ["float16", "double", "int32", "int64", "uint32", "uint64"])
def test_fused_gemm_types(tname):
    dt = np.dtype(tname if tname != "float16" else np.float16)
    a = (np.arange(6).reshape(2, 3) % 4).astype(dt)
    b = (np.arange(12).reshape(3, 4) % 3).astype(dt)
    c = np.arange(4).astype(dt)
    got = ms("FusedGemm", [a, b, c], activation="Relu")
    exp = np.maximum(a.astype(np.float64) @ b.astype(np.float64) + c, 0)
    assert got.dtype == dt
    np.testing.assert_array_equal(got.astype(np.float64), exp)


def conv_ref(x, w, b=None, stride=1, pad=0):
    """Direct 2-D convolution (N, C, H, W) * (M, C, kh, kw), group 1, in float64."""
    x = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    n, c, h, wd = x.shape
    m, _, kh, kw = w.shape
    oh, ow = (h - kh) // stride + 1, (wd - kw) // stride + 1
    y = np.zeros((n, m, oh, ow))
    for i in range(kh):
        for j in range(kw):
            patch = x[:, :, i:i + stride * oh:stride, j:j + stride * ow:stride]
            y += np.einsum("nchw,mc->nmhw", patch, w[:, :, i, j].astype(np.float64))
    return y if b is None else y + b.reshape(1, -1, 1, 1)


@pytest.mark.parametrize("act,params", [("Relu", []), ("LeakyRelu", [0.2]), ("Clip", [-0.5, 0.5]),
                                        ("HardSigmoid", [0.2, 0.5]), ("Sigmoid", [])])
def test_fused_conv(act, params):
    x, w, b, z = rnd((1, 2, 5, 5)), rnd((3, 2, 3, 3), 1), rnd(3, 2), rnd((1, 3, 3, 3), 3)
    attrs = dict(activation=act, strides=[2, 2], pads=[1, 1, 1, 1])
    if params:
        attrs["activation_params"] = params
    got = ms("FusedConv", [x, w, b, z], **attrs)
    close(got, _act(act, conv_ref(x, w, b, 2, 1) + z, *params))
    agree(got, "FusedConv", [x, w, b, z], **attrs)


def test_fused_conv_without_z_and_float16():
    x, w = rnd((1, 2, 4, 4)), rnd((2, 2, 3, 3), 1)
    close(ms("FusedConv", [x, w], activation="Relu"), np.maximum(conv_ref(x, w), 0))
    x16, w16 = x.astype(np.float16), w.astype(np.float16)
    close(ms("FusedConv", [x16, w16]), conv_ref(x16, w16), np.float16, 5e-3)


@pytest.mark.parametrize("tname", ["float", "float16", "double"])
def test_nhwc_conv(tname):
    x, xf = as_type(rnd((2, 5, 5, 3)), tname)      # channels last
    w, wf = as_type(rnd((4, 3, 3, 3), 1), tname)
    b, bf = as_type(rnd(4, 2), tname)
    got = ms("NhwcConv", [x, w, b], pads=[1, 1, 1, 1])
    exp = conv_ref(xf.transpose(0, 3, 1, 2), wf, bf, 1, 1).transpose(0, 2, 3, 1)
    close(got, exp, x.dtype, 2e-2 if tname == "float16" else None)


def test_fused_errors_name_the_node():
    with raises_naming_node(InvalidNodeError, "unknown activation"):
        ms("FusedConv", [rnd((1, 1, 3, 3)), rnd((1, 1, 1, 1))], activation="Nope")
    with raises_naming_node(KernelError, "Z must have"):
        ms("FusedConv", [rnd((1, 1, 3, 3)), rnd((1, 1, 1, 1)), None, rnd((1, 1, 2, 2))])
    with raises_naming_node(KernelError, "cannot be multiplied"):
        ms("FusedMatMul", [rnd((2, 3)), rnd((2, 3))])


# -- Inverse, Trilu, GridSample, Range -------------------------------------------------------------

@pytest.mark.parametrize("tname", ["float", "float16", "double"])
def test_inverse(tname):
    m = np.array([[[2, 1], [1, 1]], [[4, 0], [0, 0.5]]])
    x = m.astype(FLOATS[tname])
    close(ms("Inverse", [x]), [[[1, -1], [-1, 2]], [[0.25, 0], [0, 2]]], x.dtype)
    with raises_naming_node(KernelError, "singular"):
        ms("Inverse", [np.zeros((2, 2), x.dtype)])


@pytest.mark.parametrize("tname", ["float", "float16", "double", "bfloat16", "uint8", "int64", "bool"])
def test_trilu(tname):
    dt = FLOATS.get(tname, tname)
    x = (np.arange(1, 13).reshape(3, 4) % 2 == 1) if tname == "bool" else np.arange(1, 13).reshape(3, 4).astype(dt)
    i, j = np.indices((3, 4))
    np.testing.assert_array_equal(ms("Trilu", [x]), np.where(j >= i, x, 0).astype(x.dtype))
    np.testing.assert_array_equal(ms("Trilu", [x, np.array(-1, np.int64)], upper=0),
                                  np.where(j - i <= -1, x, 0).astype(x.dtype))


def test_grid_sample():
    x = np.arange(4, dtype=np.float32).reshape(1, 1, 2, 2)          # [[0, 1], [2, 3]]
    grid = np.array([[[[-1, -1], [1, 1]], [[0, 0], [1, -1]]]], np.float32)
    close(ms("GridSample", [x, grid], align_corners=1), [[[[0, 3], [1.5, 1]]]])
    # align_corners=0: (0, 0) is the image centre; -1 is the outer edge (half a pixel of zeros around)
    close(ms("GridSample", [x, grid]), [[[[0, 0.75], [1.5, 0.25]]]])
    close(ms("GridSample", [x, grid], mode="nearest", padding_mode="border", align_corners=1), [[[[0, 3], [0, 1]]]])
    # (0, 0) is pixel (0.5, 0.5): nearest rounds half to even, to pixel (0, 0)


@pytest.mark.parametrize("tname", ["float", "double", "int16", "int32", "int64"])
def test_range(tname):
    dt = np.dtype(FLOATS.get(tname, tname))
    s, lim = np.array(2, dt), np.array(9, dt)
    np.testing.assert_array_equal(ms("Range", [s, lim]), np.arange(2, 9).astype(dt))
    got = ms("Range", [s, lim, np.array(3, dt)])
    assert got.dtype == dt
    np.testing.assert_array_equal(got, np.array([2, 5, 8], dt))
    np.testing.assert_array_equal(ms("Range", [lim, s, np.array(-4, dt)]), np.array([9, 5], dt))


# -- SkipLayerNormalization, SkipSimplifiedLayerNormalization, EmbedLayerNormalization -------------

def layer_norm(s, gamma, beta=None, eps=1e-12):
    mean = s.mean(-1, keepdims=True)
    var = ((s - mean) ** 2).mean(-1, keepdims=True)
    inv = 1 / np.sqrt(var + eps)
    y = (s - mean) * inv * gamma
    return (y if beta is None else y + beta), mean, inv


@pytest.mark.parametrize("tname", ["float", "float16", "bfloat16"])
def test_skip_layer_normalization(tname):
    x, xf = as_type(rnd((2, 3, 8)), tname)
    skip, sf = as_type(rnd((2, 3, 8), 1), tname)
    g, gf = as_type(rnd(8, 2), tname)
    be, bef = as_type(rnd(8, 3), tname)
    bias, biasf = as_type(rnd(8, 4), tname)
    y, mean, inv, s = ms("SkipLayerNormalization", [x, skip, g, be, bias], 4, epsilon=1e-5)
    s_ref = xf + sf + biasf
    ry, rmean, rinv = layer_norm(s_ref, gf, bef, 1e-5)
    close(y, ry, x.dtype, 5e-2 if tname == "bfloat16" else 1e-2 if tname == "float16" else None)
    close(mean, rmean, np.float32, 1e-2 if tname != "float" else None)
    close(inv, rinv, np.float32, 1e-2 if tname != "float" else None)
    close(s, s_ref, x.dtype)


def test_skip_layer_normalization_forms_and_ort():
    x, g = rnd((2, 3, 8)), rnd(8, 2)
    for skip in (rnd((2, 3, 8), 1), rnd((1, 3, 8), 1), rnd((3, 8), 1)):
        got = ms("SkipLayerNormalization", [x, skip, g])               # no beta, no bias, default epsilon
        close(got, layer_norm(x.astype(np.float64) + skip, g)[0], tol=1e-4)
        agree(got, "SkipLayerNormalization", [x, skip, g])
    bias = rnd(8, 3)
    got = ms("SkipLayerNormalization", [x, x, g, None, bias], 4)
    s = 2 * x.astype(np.float64) + bias
    y, mean, inv = layer_norm(s, g)
    for a, r in zip(got, (y, mean, inv, s)):
        close(a, r, tol=1e-4)
    agree(got, "SkipLayerNormalization", [x, x, g, None, bias], 4)
    with raises_naming_node(KernelError, "gamma"):
        ms("SkipLayerNormalization", [x, x, rnd(7)])
    with raises_naming_node(KernelError, "skip"):
        ms("SkipLayerNormalization", [x, rnd((2, 8)), g])


@pytest.mark.parametrize("tname", ["float", "float16", "bfloat16"])
def test_skip_simplified_layer_normalization(tname):
    x, xf = as_type(rnd((6, 8)), tname)            # 2-D (token_count, hidden) form
    skip, sf = as_type(rnd((6, 8), 1), tname)
    g, gf = as_type(rnd(8, 2), tname)
    bias, biasf = as_type(rnd(8, 4), tname)
    y, mean, inv, s = ms("SkipSimplifiedLayerNormalization", [x, skip, g, bias], 4, epsilon=1e-6)
    s_ref = xf + sf + biasf
    rinv = 1 / np.sqrt((s_ref ** 2).mean(-1, keepdims=True) + 1e-6)
    close(y, s_ref * rinv * gf, x.dtype, 5e-2 if tname == "bfloat16" else 1e-2 if tname == "float16" else None)
    close(inv, rinv, np.float32, 1e-2 if tname != "float" else None)
    close(s, s_ref, x.dtype)
    assert mean.dtype == np.float32 and mean.shape == (6, 1)
    if tname == "float":
        agree((y, mean, inv, s), "SkipSimplifiedLayerNormalization", [x, skip, g, bias], 4, epsilon=1e-6)


def test_rms_inverse_of_one_row_has_numpys_bits():
    """rms_inverse's one-row path (Python floats rounded to the type per step) gives the bits of numpy's
    steps 1 / sqrt(sum / count + eps) in float32 and float64: random sums, subnormal and huge ones, counts
    float32 rounds (above 2^24), epsilons of every size; and numpy's own results where a step is 1 / 0,
    NaN or infinite."""
    from onnx_mini.ops.contrib.layer_norm import rms_inverse
    rng = np.random.default_rng(5)
    for dt in (np.float32, np.float64):
        info = np.finfo(dt)
        sums = [0.0, info.smallest_subnormal, info.tiny, 1.0, 3.0, info.max, info.max / 3, np.inf, np.nan]
        sums += list(rng.uniform(0, 1, 300) * 10.0 ** rng.integers(-45, 39, 300))
        for total in np.array(sums, dt):
            for count in (1, 3, 896, 4864, 2 ** 24 + 1, 2 ** 25 + 3):
                for eps in (0.0, 1e-12, 9.999999974752427e-07, 1e-5, 0.1, 3.0, 1e30):
                    sq = np.array([[[total]]], dt)
                    with np.errstate(all="ignore"):
                        want = 1 / np.sqrt(np.add.reduce(sq, axis=-1, keepdims=True) / count + dt(eps))
                        got = rms_inverse(sq, -1, count, eps)
                    assert got.dtype == dt and got.shape == (1, 1, 1)
                    assert got.tobytes() == want.tobytes(), (dt, total, count, eps, got, want)
    x = rnd((1, 1, 896))                          # and through the kernel: one token, as a decode step
    inv = ms("SkipSimplifiedLayerNormalization", [x, x, rnd(896, 2)], 3, epsilon=1e-6)[2]
    s = x + x
    want = 1 / np.sqrt(np.add.reduce(s * s, axis=-1, keepdims=True) / 896 + np.float32(1e-6))
    assert inv.tobytes() == want.tobytes()


def _embed_inputs(dt=np.float32):
    ids = np.array([[1, 2, 3], [4, 5, 0]], np.int32)
    seg = np.array([[0, 0, 1], [0, 1, 1]], np.int32)
    we, pe, se = rnd((6, 8)).astype(dt), rnd((5, 8), 1).astype(dt), rnd((2, 8), 2).astype(dt)
    g, b = rnd(8, 3).astype(dt), rnd(8, 4).astype(dt)
    return ids, seg, we, pe, se, g, b


@pytest.mark.parametrize("tname", ["float", "float16"])
def test_embed_layer_normalization(tname):
    ids, seg, we, pe, se, g, b = _embed_inputs(FLOATS[tname])
    mask = np.array([[1, 1, 0], [1, 0, 1]], np.int32)
    out, mask_index, esum = ms("EmbedLayerNormalization", [ids, seg, we, pe, se, g, b, mask], 3, epsilon=1e-5)
    f64 = [a.astype(np.float64) for a in (we, pe, se, g, b)]
    e = f64[0][ids] + f64[1][np.arange(3)] + f64[2][seg]
    tol = 1e-2 if tname == "float16" else None
    close(esum, e, we.dtype, tol)
    close(out, layer_norm(e, f64[3], f64[4], 1e-5)[0], we.dtype, tol)
    assert mask_index.dtype == np.int32 and mask_index.tolist() == [2, 2]      # non-zero count per row


def test_embed_layer_normalization_options_and_ort():
    ids, seg, we, pe, se, g, b = _embed_inputs()
    pos = np.array([[2, 1, 0]], np.int32)
    out, mask_index, esum = ms("EmbedLayerNormalization", [ids, None, we, pe, None, g, b, None, pos], 3)
    e = we.astype(np.float64)[ids] + pe[[2, 1, 0]]
    close(esum, e)
    close(out, layer_norm(e, g, b)[0], tol=1e-4)
    assert mask_index.tolist() == [0, 0]
    for inputs in ([ids, seg, we, pe, se, g, b, np.array([[1, 0, 0], [1, 1, 1]], np.int32)],
                   [ids, None, we, pe, None, g, b, None, pos]):
        got = ms("EmbedLayerNormalization", inputs, 3)
        agree(got, "EmbedLayerNormalization", inputs, 3)
    with raises_naming_node(KernelError, r"word_embedding ids must be in \[0, 5\]"):
        ms("EmbedLayerNormalization", [ids + 3, seg, we, pe, se, g, b])


# -- the attention family: a numpy reference ------------------------------------------------------

def heads(x, n):
    b, s, h = x.shape
    return x.reshape(b, s, n, h // n).transpose(0, 2, 1, 3)


def merge(y):
    b, n, s, d = y.shape
    return y.transpose(0, 2, 1, 3).reshape(b, s, n * d)


def attend(q, k, v, add=0.0, scale=None):
    """softmax(Q K^T * scale + add) V with K/V heads repeated for grouped queries (float64)."""
    g = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    s = q @ k.swapaxes(-1, -2) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale) + add
    return softmax(s) @ v, s


def causal(s, t, past, fill=-10000.0):
    return np.where(np.arange(t)[None, :] > np.arange(s)[:, None] + past, fill, 0.0)


def rotate(x, cos, sin, interleaved=False):
    """RoPE on the first 2 * cos.shape[-1] features of x (..., seq, size); cos/sin (..., seq, half)."""
    half = cos.shape[-1]
    x = x.astype(np.float64).copy()
    if interleaved:
        a, b = x[..., 0:2 * half:2].copy(), x[..., 1:2 * half:2].copy()
        x[..., 0:2 * half:2], x[..., 1:2 * half:2] = a * cos - b * sin, a * sin + b * cos
    else:
        a, b = x[..., :half].copy(), x[..., half:2 * half].copy()
        x[..., :half], x[..., half:2 * half] = a * cos - b * sin, a * sin + b * cos
    return x


B, S, D, N = 2, 3, 8, 2
HS = D // N


def attention_ref(x, w, bias, add=0.0, past=None, scale=None, uni=False, sizes=None):
    qkv = x.astype(np.float64) @ w + (0 if bias is None else bias)
    hq, hk, _ = sizes or (w.shape[1] // 3,) * 3
    q, k, v = heads(qkv[..., :hq], N), heads(qkv[..., hq:hq + hk], N), heads(qkv[..., hq + hk:], N)
    p = 0
    if past is not None:
        p = past.shape[3]
        k, v = np.concatenate([past[0], k], 2), np.concatenate([past[1], v], 2)
    if uni:
        add = add + causal(x.shape[1], k.shape[2], p)
    return merge(attend(q, k, v, add, scale)[0]), (np.stack([k, v]) if k.shape == v.shape else None)


def _attention_inputs(dt=np.float32):
    return rnd((B, S, D)).astype(dt), rnd((D, 3 * D), 1, 0.5).astype(dt), rnd(3 * D, 2).astype(dt)


def mask_add(masked, fill=-10000.0):
    return np.where(masked, fill, 0.0)


@pytest.mark.parametrize("form", ["none", "lengths", "ends_starts", "2d", "3d", "4d"])
def test_attention_masks(form):
    x, w, bias = _attention_inputs()
    j = np.arange(S)
    if form == "none":
        mask, add = None, 0.0
    elif form == "lengths":
        mask = np.array([2, 3], np.int32)
        add = mask_add(j[None, :] >= mask[:, None], -5.0).reshape(B, 1, 1, S)
    elif form == "ends_starts":
        mask = np.array([3, 2, 1, 0], np.int32)
        add = mask_add((j[None, :] >= mask[:2, None]) | (j[None, :] < mask[2:, None]), -5.0).reshape(B, 1, 1, S)
    elif form == "2d":
        mask = np.array([[1, 1, 0], [1, 0, 1]], np.int32)
        add = mask_add(mask == 0, -5.0).reshape(B, 1, 1, S)
    elif form == "3d":
        mask = np.array([[[1, 0, 1], [1, 1, 0], [0, 1, 1]], [[1, 1, 1], [0, 0, 1], [1, 0, 0]]], np.int32)
        add = mask_add(mask == 0, -5.0).reshape(B, 1, S, S)
    else:
        mask = (np.random.default_rng(3).random((B, 1, 5, 5)) > 0.3).astype(np.int32)
        add = mask_add(mask[:, :, :S, :S] == 0, -5.0)
    got = ms("Attention", [x, w, bias, mask], num_heads=N, mask_filter_value=-5.0)
    close(got, attention_ref(x, w, bias, add)[0], tol=1e-5)
    if form != "4d":                          # onnxruntime's CPU kernel has no 4-D mask
        agree(got, "Attention", [x, w, bias, mask], num_heads=N, mask_filter_value=-5.0)


def test_attention_unidirectional_past_present_and_bias():
    x, w, bias = _attention_inputs()
    past = rnd((2, B, N, 4, HS), 5)
    ab = rnd((1, N, S, 4 + S), 6)
    mask = np.array([[1] * 7, [1, 1, 0, 1, 1, 1, 1]], np.int32)
    inputs = [x, w, bias, mask, past, ab]
    y, present = ms("Attention", inputs, 2, num_heads=N, unidirectional=1, scale=0.3)
    ry, rpresent = attention_ref(x, w, bias, ab + mask_add(mask == 0).reshape(B, 1, 1, 7), past, 0.3, uni=True)
    close(y, ry, tol=1e-5)
    close(present, rpresent, tol=1e-5)
    inputs[5] = None                         # onnxruntime refuses past together with attention_bias
    y, present = ms("Attention", inputs, 2, num_heads=N, unidirectional=1, scale=0.3)
    agree((y, present), "Attention", inputs, 2, num_heads=N, unidirectional=1, scale=0.3)


def test_attention_unidirectional_ignores_mask_filter_value():
    x, w, bias = _attention_inputs()
    got = ms("Attention", [x, w, bias], num_heads=N, unidirectional=1, mask_filter_value=-5.0)
    close(got, attention_ref(x, w, bias, uni=True)[0], tol=1e-5)      # the causal part adds -10000
    agree(got, "Attention", [x, w, bias], num_heads=N, unidirectional=1, mask_filter_value=-5.0)


def test_attention_qkv_hidden_sizes_and_no_bias():
    x = rnd((B, S, D))
    w = rnd((D, D + D + 4), 1, 0.5)
    got = ms("Attention", [x, w], num_heads=N, qkv_hidden_sizes=[D, D, 4])
    assert got.shape == (B, S, 4)
    close(got, attention_ref(x, w, None, sizes=(D, D, 4))[0], tol=1e-5)
    agree(got, "Attention", [x, w, np.zeros(2 * D + 4, np.float32)], num_heads=N, qkv_hidden_sizes=[D, D, 4])


def test_attention_share_buffer():
    x, w, bias = _attention_inputs()
    buf = rnd((2, B, N, 6, HS), 5)
    y, present = ms("Attention", [x, w, bias, None, buf, None, np.array([2], np.int32)], 2, num_heads=N,
                    past_present_share_buffer=1)
    ry, rpresent = attention_ref(x, w, bias, past=buf[:, :, :, :2])
    close(y, ry, tol=1e-5)
    assert present.shape == buf.shape
    close(present[:, :, :, :5], rpresent, tol=1e-5)
    np.testing.assert_array_equal(present[:, :, :, 5:], buf[:, :, :, 5:])


def test_attention_do_rotary():
    x, w, bias = _attention_inputs()
    past = rnd((2, B, N, 2, HS), 5)
    y, present = ms("Attention", [x, w, bias, None, past], 2, num_heads=N, do_rotary=1)
    qkv = x.astype(np.float64) @ w + bias
    q, k, v = (heads(qkv[..., i * D:(i + 1) * D], N) for i in range(3))
    ang = np.arange(2, 2 + S)[:, None] * 10000.0 ** (-np.arange(0, HS, 2) / HS)
    q, k = rotate(q, np.cos(ang), np.sin(ang)), rotate(k, np.cos(ang), np.sin(ang))
    k, v = np.concatenate([past[0], k], 2), np.concatenate([past[1], v], 2)
    close(y, merge(attend(q, k, v)[0]), tol=1e-5)
    close(present, np.stack([k, v]), tol=1e-5)


@pytest.mark.parametrize("tname", ["float16", "bfloat16"])
def test_attention_low_precision(tname):
    x, w, bias = _attention_inputs(FLOATS[tname])
    got = ms("Attention", [x, w, bias], num_heads=N)
    close(got, attention_ref(x.astype(np.float64), w.astype(np.float64), bias.astype(np.float64))[0],
          x.dtype, 2e-2 if tname == "bfloat16" else 3e-3)


def test_attention_errors_name_the_node():
    x, w, bias = _attention_inputs()
    with raises_naming_node(KernelError, "3 \\* batch \\+ 2"):
        ms("Attention", [x, w, bias, np.zeros(3 * B + 2, np.int32)], num_heads=N)
    with raises_naming_node(KernelError, "mask_index 2-D"):
        ms("Attention", [x, w, bias, np.ones((B, S + 1), np.int32)], num_heads=N)
    with raises_naming_node(InvalidNodeError, "num_heads"):
        ms("Attention", [x, w, bias], num_heads=0)
    with raises_naming_node(InvalidNodeError, "num_heads"):
        ms("Attention", [x, w, bias])                 # required attribute missing


# -- MultiHeadAttention ----------------------------------------------------------------------------

def _mha_inputs():
    return rnd((B, S, D)), rnd((B, 4, D), 1), rnd((B, 4, D), 2), rnd(3 * D, 3)


@pytest.mark.parametrize("case", ["cross", "bias", "lengths", "2d", "3d", "abias_qk", "scale"])
def test_multi_head_attention(case):
    q, k, v, bias = _mha_inputs()
    L = 4
    inputs, attrs, add, n_out = [q, k, v], dict(num_heads=N), 0.0, 3
    qq, kk, vv = q.astype(np.float64), k.astype(np.float64), v.astype(np.float64)
    if case == "bias":
        inputs.append(bias)
        qq, kk, vv = qq + bias[:D], kk + bias[D:2 * D], vv + bias[2 * D:]
    elif case == "lengths":
        m = np.array([2, 4], np.int32)
        inputs += [None, m]
        add = mask_add(np.arange(L)[None] >= m[:, None]).reshape(B, 1, 1, L)
    elif case == "2d":
        m = np.array([[1, 1, 0, 1], [1, 0, 1, 1]], np.int32)
        inputs += [None, m]
        add = mask_add(m == 0).reshape(B, 1, 1, L)
    elif case == "3d":
        m = (np.random.default_rng(4).random((B, S, L)) > 0.3).astype(np.int32)
        inputs += [None, m]
        attrs["mask_filter_value"] = -3.0
        add = mask_add(m == 0, -3.0).reshape(B, 1, S, L)
    elif case == "abias_qk":
        ab = rnd((B, 1, S, L), 7)
        inputs += [None, None, ab]
        add = ab.astype(np.float64)
        n_out = 4
    else:
        attrs["scale"] = 0.3
    got = ms("MultiHeadAttention", inputs, n_out, **attrs)
    ry, rs = attend(heads(qq, N), heads(kk, N), heads(vv, N), add, attrs.get("scale"))
    close(got[0], merge(ry), tol=1e-5)
    close(got[1], heads(kk, N), tol=1e-6)
    close(got[2], heads(vv, N), tol=1e-6)
    if n_out == 4:
        close(got[3], rs, tol=1e-5)                   # the scores fed to softmax
    if n_out == 3:
        agree(got, "MultiHeadAttention", inputs, 3, **attrs)


def test_multi_head_attention_past_bnsh_and_packed():
    q, k, v, bias = _mha_inputs()
    kk, vv = rnd((B, S, D), 4), rnd((B, S, D), 5)
    pk, pv = rnd((B, N, 5, HS), 6), rnd((B, N, 5, HS), 7)
    inputs = [q, kk, vv, None, None, None, pk, pv]
    got = ms("MultiHeadAttention", inputs, 3, num_heads=N, unidirectional=1)
    K, V = np.concatenate([pk, heads(kk, N)], 2), np.concatenate([pv, heads(vv, N)], 2)
    close(got[0], merge(attend(heads(q, N), K, V, causal(S, 8, 5))[0]), tol=1e-5)
    close(got[1], K, tol=0)
    agree(got, "MultiHeadAttention", inputs, 3, num_heads=N, unidirectional=1)
    # key/value already (batch, heads, kv_seq, size): the bias goes to the query only
    k4, v4 = rnd((B, N, 4, HS), 8), rnd((B, N, 4, HS), 9)
    got = ms("MultiHeadAttention", [q, k4, v4, bias], num_heads=N)
    close(got, merge(attend(heads(q.astype(np.float64) + bias[:D], N), k4, v4)[0]), tol=1e-5)
    agree(got, "MultiHeadAttention", [q, k4, v4, bias], num_heads=N)
    # packed QKV (batch, seq, heads, 3, size) and packed KV (batch, kv_seq, heads, 2, size)
    qkv = rnd((B, S, N, 3, HS), 10)
    parts = [qkv[:, :, :, i].transpose(0, 2, 1, 3).astype(np.float64) for i in range(3)]
    close(ms("MultiHeadAttention", [qkv], num_heads=N), merge(attend(*parts)[0]), tol=1e-5)
    kv = rnd((B, 4, N, 2, HS), 11)
    close(ms("MultiHeadAttention", [q, kv], num_heads=N),
          merge(attend(heads(q, N), kv[:, :, :, 0].transpose(0, 2, 1, 3), kv[:, :, :, 1].transpose(0, 2, 1, 3))[0]),
          tol=1e-5)
    with raises_naming_node(KernelError, "cache_indirection"):
        ms("MultiHeadAttention", [q, kk, vv, None, None, None, pk, pv, np.array([5], np.int32),
                                  np.zeros((B, 1, 8), np.int32)], num_heads=N)


# -- GroupQueryAttention ---------------------------------------------------------------------------

GN, GK, GH = 4, 2, 16                # query heads, kv heads, head size (onnxruntime: a multiple of 16)


def gqa_ref(q, k, v, pk, pv, lens, s, first_prompt, window=-1, scale=None, softcap=0.0, sink=None,
            cos=None, sin=None, interleaved=False, bias=None):
    """Per batch: positions past_b + i, keys [0, lens[b] + 1), causal and local window; present rows."""
    b = q.shape[0]
    Q, K, V = heads(q.astype(np.float64), GN), heads(k.astype(np.float64), GK), heads(v.astype(np.float64), GK)
    total = int(max(lens)) + 1 if not first_prompt else s
    rows = max(pk.shape[2], total)
    pres_k, pres_v, out = np.zeros((b, GK, rows, GH)), np.zeros((b, GK, rows, GH)), []
    for i in range(b):
        tot = lens[i] + 1
        past = 0 if first_prompt else tot - s
        pos = past + np.arange(s)
        qi, ki = Q[i], K[i]
        if cos is not None:
            qi = rotate(qi, cos[pos], sin[pos], interleaved)
            ki = rotate(ki, cos[pos], sin[pos], interleaved)
        pres_k[i, :, :past], pres_v[i, :, :past] = pk[i, :, :past], pv[i, :, :past]
        pres_k[i, :, past:past + s], pres_v[i, :, past:past + s] = ki, V[i]
        kk, vv = np.repeat(pres_k[i], GN // GK, 0), np.repeat(pres_v[i], GN // GK, 0)
        sc = qi @ kk.swapaxes(-1, -2) * (1 / math.sqrt(GH) if scale is None else scale)
        if softcap:
            sc = softcap * np.tanh(sc / softcap)
        if bias is not None:                       # attention_bias: columns are absolute key positions
            w = min(rows, bias.shape[-1])
            sc[..., :w] = sc[..., :w] + bias[min(i, bias.shape[0] - 1)][..., :w]
        j = np.arange(rows)[None, :]
        ok = (j < tot) & (j <= pos[:, None])
        if window > 0:
            ok &= j > pos[:, None] - window
        sc = np.where(ok, sc, -np.inf)
        if sink is not None:
            m = np.maximum(sc.max(-1, keepdims=True), sink.reshape(-1, 1, 1))
            e = np.exp(sc - m)
            p = e / (e.sum(-1, keepdims=True) + np.exp(sink.reshape(-1, 1, 1) - m))
        else:
            p = softmax(sc)
        out.append(p @ vv)
    return merge(np.stack(out)), pres_k, pres_v


def _gqa(s, past_len, lens, seed=0, **attrs):
    q, k, v = rnd((B, s, GN * GH), seed), rnd((B, s, GK * GH), seed + 1), rnd((B, s, GK * GH), seed + 2)
    pk, pv = rnd((B, GK, past_len, GH), seed + 3), rnd((B, GK, past_len, GH), seed + 4)
    lens = np.array(lens, np.int32)
    total = np.array(s if past_len == 0 else int(lens.max()) + 1, np.int32)
    return [q, k, v, pk, pv, lens, total]


@pytest.mark.parametrize("case", ["prompt", "prompt_padded", "prompt_in_buffer", "decode", "window", "softcap_scale",
                                  "packed", "decode_uniform", "decode_in_larger_buffer", "prompt_in_buffer_uniform"])
def test_group_query_attention(case):
    attrs = dict(num_heads=GN, kv_num_heads=GK)
    if case in ("prompt", "prompt_padded"):
        inputs = _gqa(3, 0, [2, 2] if case == "prompt" else [2, 1])
    elif case.startswith("prompt_in_buffer"):     # total_sequence_length == sequence_length: a first prompt
        inputs = _gqa(3, 4, [2, 2] if case.endswith("uniform") else [2, 1])
        inputs[6] = np.array(3, np.int32)
    elif case == "decode_uniform":                # every batch at one position: the cache copied by slices
        inputs = _gqa(1, 5, [5, 5])
    elif case == "decode_in_larger_buffer":       # 8 cache rows, 6 used: rows 6 and 7 stay zero and unread
        inputs = _gqa(1, 8, [5, 5])
    else:
        inputs = _gqa(1, 5, [5, 3])
    if case == "window":
        attrs["local_window_size"] = 3
    if case == "softcap_scale":
        attrs.update(softcap=2.0, scale=0.7)
    q, k, v, pk, pv, lens, total = inputs
    s = q.shape[1]
    ref = gqa_ref(q, k, v, pk, pv, lens, s, int(total) == s, window=attrs.get("local_window_size", -1),
                  scale=attrs.get("scale"), softcap=attrs.get("softcap", 0.0))
    if case == "packed":
        inputs = [np.concatenate([q, k, v], -1), None, None] + inputs[3:]
    got = ms("GroupQueryAttention", inputs, 3, **attrs)
    for a, r in zip(got, ref):
        close(a, r, tol=1e-5)
    agree(got, "GroupQueryAttention", inputs, 3, **attrs)


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("packed", [0, 1])
def test_group_query_attention_rotary(interleaved, packed):
    inputs = _gqa(2, 4, [5, 4], seed=20)
    ang = np.arange(16)[:, None] * 10000.0 ** (-np.arange(0, GH, 2) / GH)
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    q, k, v, pk, pv, lens, total = inputs
    attrs = dict(num_heads=GN, kv_num_heads=GK, do_rotary=1, rotary_interleaved=interleaved)
    fed = [np.concatenate([q, k, v], -1), None, None] + inputs[3:] if packed else inputs   # packed: one rotation
    got = ms("GroupQueryAttention", fed + [cos, sin], 3, **attrs)
    ref = gqa_ref(q, k, v, pk, pv, lens, 2, False, cos=cos.astype(np.float64), sin=sin.astype(np.float64),
                  interleaved=bool(interleaved))
    for a, r in zip(got, ref):
        close(a, r, tol=1e-5)
    if packed:
        return
    one = [x[:1] for x in inputs[:6]] + [inputs[6], cos, sin]   # onnxruntime: batch 1 when seq > 1 with past
    got = ms("GroupQueryAttention", one, 3, **attrs)
    agree(got, "GroupQueryAttention", one, 3, **attrs)


def test_group_query_attention_sinks_and_qk_output():
    inputs = _gqa(1, 5, [5, 3], seed=30)
    q, k, v, pk, pv, lens, total = inputs
    sink = rnd(GN, 40)
    got = ms("GroupQueryAttention", inputs + [None] * 4 + [sink], 1, num_heads=GN, kv_num_heads=GK)
    close(got, gqa_ref(q, k, v, pk, pv, lens, 1, False, sink=sink.astype(np.float64))[0], tol=1e-5)
    got = ms("GroupQueryAttention", inputs, 1, num_heads=GN, kv_num_heads=GK, smooth_softmax=1)
    close(got, gqa_ref(q, k, v, pk, pv, lens, 1, False, sink=np.zeros(GN))[0], tol=1e-5)
    y, _, _, probs = ms("GroupQueryAttention", inputs, 4, num_heads=GN, kv_num_heads=GK, qk_output=2)
    assert probs.shape == (B, GN, 1, 6)
    np.testing.assert_allclose(probs.sum(-1), 1, rtol=1e-6)
    assert (probs[1, :, :, 4:] == 0).all()            # batch 1 has 4 positions only
    y, _, _, scores = ms("GroupQueryAttention", inputs, 4, num_heads=GN, kv_num_heads=GK, qk_output=1)
    kk = np.repeat(gqa_ref(q, k, v, pk, pv, lens, 1, False)[1], GN // GK, axis=1)
    exp = heads(q.astype(np.float64), GN) @ kk.swapaxes(-1, -2) / math.sqrt(GH)
    exp[1, :, :, 4:] = 0                               # keys batch 1 cannot see: 0 (unspecified in onnxruntime)
    close(scores, exp, tol=1e-5)
    exp = ort_node("GroupQueryAttention", inputs, 4, num_heads=GN, kv_num_heads=GK, qk_output=1)
    if exp is not None:
        np.testing.assert_allclose(scores[0], exp[3][0], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(scores[1, ..., :4], exp[3][1, ..., :4], rtol=1e-5, atol=1e-5)
    with raises_naming_node(KernelError, "quantized k cache must be int8"):
        ms("GroupQueryAttention", inputs, 1, num_heads=GN, kv_num_heads=GK, k_quant_type="PER_TENSOR")
    with raises_naming_node(InvalidNodeError, "k_quant_type must be one of"):
        ms("GroupQueryAttention", inputs, 1, num_heads=GN, kv_num_heads=GK, k_quant_type="PER_ROW")
    with raises_naming_node(KernelError, "seqlens_k"):
        ms("GroupQueryAttention", inputs[:5] + [np.array([9, 3], np.int32), total], 1, num_heads=GN, kv_num_heads=GK)


# -- RotaryEmbedding -------------------------------------------------------------------------------

@pytest.mark.parametrize("layout,interleaved,pids", [("3d", 0, "scalar"), ("3d", 1, "2d"), ("4d", 0, "2d"),
                                                      ("4d", 1, "scalar")])
def test_rotary_embedding(layout, interleaved, pids):
    x4 = rnd((B, N, S, HS))
    ang = np.arange(10)[:, None] * 10000.0 ** (-np.arange(0, HS, 2) / HS)
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    pos = np.array([[1, 2, 3], [4, 0, 2]], np.int64) if pids == "2d" else np.full((B, S), 3) + np.arange(S)
    p_in = pos if pids == "2d" else np.array([3], np.int64)
    ref = rotate(x4, cos[pos][:, None], sin[pos][:, None], bool(interleaved))
    x = merge(x4) if layout == "3d" else x4
    got = ms("RotaryEmbedding", [x, p_in, cos, sin], interleaved=interleaved)
    close(got, merge(ref) if layout == "3d" else ref, tol=1e-6)
    np.testing.assert_array_equal(ms("RotaryEmbedding", [x, p_in, cos, sin], interleaved=interleaved, scale=2.0,
                                     is_packed_batching=1), got)
    agree(got, "RotaryEmbedding", [x, p_in, cos, sin], tol=1e-6, interleaved=interleaved)


def test_rotary_embedding_partial_and_float16():
    x4 = rnd((B, N, S, HS))
    cos, sin = np.cos(np.arange(6)[:, None] * [[1.0]]), np.sin(np.arange(6)[:, None] * [[1.0]])
    pos = np.array([[0, 1, 2], [3, 4, 5]], np.int64)
    got = ms("RotaryEmbedding", [merge(x4), pos, cos.astype(np.float32), sin.astype(np.float32)],
             num_heads=N, rotary_embedding_dim=2)
    close(got, merge(rotate(x4, cos[pos][:, None], sin[pos][:, None])), tol=1e-6)
    x16 = x4.astype(np.float16)
    got = ms("RotaryEmbedding", [x16, pos, cos.astype(np.float16), sin.astype(np.float16)], num_heads=N,
             rotary_embedding_dim=2)
    close(got, rotate(x16, cos.astype(np.float16)[pos][:, None].astype(np.float64),
                      sin.astype(np.float16)[pos][:, None].astype(np.float64)), np.float16)


# -- a BERT layer as onnxruntime's transformer optimizer writes it ----------------------------------

def bert_model(dt=TensorProto.FLOAT, fast=True):
    """EmbedLayerNormalization -> Attention -> SkipLayerNormalization -> MatMul -> FastGelu (or
    BiasGelu) -> MatMul -> SkipLayerNormalization, weights as initializers, ai.onnx opset 14."""
    h = helper
    rng = np.random.default_rng(7)
    hidden, inter, vocab = 8, 16, 11
    w = {n: (rng.standard_normal(s) * sc).astype(np.float32) for n, s, sc in (
        ("word", (vocab, hidden), 1), ("pos", (6, hidden), 1), ("seg", (2, hidden), 1), ("g0", (hidden,), 1),
        ("b0", (hidden,), 0.1), ("qkv_w", (hidden, 3 * hidden), 0.3), ("qkv_b", (3 * hidden,), 0.1),
        ("o_w", (hidden, hidden), 0.3), ("o_b", (hidden,), 0.1), ("g1", (hidden,), 1), ("b1", (hidden,), 0.1),
        ("i_w", (hidden, inter), 0.3), ("i_b", (inter,), 0.1), ("f_w", (inter, hidden), 0.3),
        ("f_b", (hidden,), 0.1), ("g2", (hidden,), 1), ("b2", (hidden,), 0.1))}
    nodes = [
        h.make_node("EmbedLayerNormalization", ["ids", "segs", "word", "pos", "seg", "g0", "b0", "mask"],
                    ["emb", "mask_index"], domain=MS, epsilon=1e-12, name="embed"),
        h.make_node("Attention", ["emb", "qkv_w", "qkv_b", "mask_index"], ["att"], domain=MS, num_heads=2,
                    name="attention"),
        h.make_node("MatMul", ["att", "o_w"], ["att_o"], name="att_out"),
        h.make_node("SkipLayerNormalization", ["att_o", "emb", "g1", "b1", "o_b"], ["ln1"], domain=MS,
                    epsilon=1e-12, name="skip_ln1"),
        h.make_node("MatMul", ["ln1", "i_w"], ["inter_mm"], name="intermediate"),
        h.make_node("FastGelu" if fast else "BiasGelu", ["inter_mm", "i_b"], ["inter"], domain=MS, name="gelu"),
        h.make_node("MatMul", ["inter", "f_w"], ["ffn"], name="output"),
        h.make_node("SkipLayerNormalization", ["ffn", "ln1", "g2", "b2", "f_b"], ["out"], domain=MS,
                    epsilon=1e-12, name="skip_ln2"),
    ]
    graph = h.make_graph(nodes, "bert_layer",
                         [h.make_tensor_value_info(n, TensorProto.INT32, ["batch", "seq"]) for n in ("ids", "segs",
                                                                                                     "mask")],
                         [h.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", "seq", hidden])],
                         [h.make_tensor(n, TensorProto.FLOAT, a.shape, a.ravel()) for n, a in w.items()])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 14), h.make_opsetid(MS, 1)], ir_version=8)
    return model, w


def bert_ref(w, ids, segs, mask, fast=True):
    f = {k: v.astype(np.float64) for k, v in w.items()}
    e = f["word"][ids] + f["pos"][np.arange(ids.shape[1])] + f["seg"][segs]
    emb = layer_norm(e, f["g0"], f["b0"])[0]
    qkv = emb @ f["qkv_w"] + f["qkv_b"]
    q, k, v = (heads(qkv[..., i * 8:(i + 1) * 8], 2) for i in range(3))
    lengths = mask.sum(1)                                             # EmbedLayerNormalization's mask_index
    add = mask_add(np.arange(ids.shape[1])[None, :] >= lengths[:, None]).reshape(len(ids), 1, 1, -1)
    att = merge(attend(q, k, v, add)[0])
    ln1 = layer_norm(att @ f["o_w"] + emb + f["o_b"], f["g1"], f["b1"])[0]
    t = ln1 @ f["i_w"] + f["i_b"]
    inter = fast_gelu(t) if fast else gelu(t)
    return layer_norm(inter @ f["f_w"] + ln1 + f["f_b"], f["g2"], f["b2"])[0]


@pytest.mark.parametrize("fast", [True, False])
def test_bert_layer_end_to_end(fast):
    model, w = bert_model(fast=fast)
    ids = np.array([[1, 5, 9, 2, 0], [3, 3, 7, 0, 0]], np.int32)
    segs = np.array([[0, 0, 1, 1, 1], [0, 1, 1, 1, 1]], np.int32)
    mask = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]], np.int32)
    feeds = {"ids": ids, "segs": segs, "mask": mask}
    (got,) = onnx_mini.prepare(model).run(feeds)
    close(got, bert_ref(w, ids, segs, mask, fast), tol=1e-4)
    (sess_out,) = onnx_mini.InferenceSession(model.SerializeToString()).run(None, feeds)
    np.testing.assert_array_equal(sess_out, got)
    if ORT is not None:
        sess = ORT.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        (exp,) = sess.run(None, feeds)
        np.testing.assert_allclose(got, exp, rtol=1e-4, atol=1e-4)


def test_errors_name_the_node_in_a_model():
    model, _ = bert_model()
    bad = {"ids": np.array([[1, 50]], np.int32), "segs": np.zeros((1, 2), np.int32),
           "mask": np.ones((1, 2), np.int32)}
    with pytest.raises(KernelError, match="(?s)embed.*EmbedLayerNormalization.*word_embedding ids"):
        onnx_mini.prepare(model).run(bad)


# -- more types -----------------------------------------------------------------------------------

@pytest.mark.parametrize("tname", ["float16", "bfloat16"])
def test_multi_head_and_group_query_attention_low_precision(tname):
    dt = FLOATS[tname]
    tol = 3e-2 if tname == "bfloat16" else 4e-3
    q, k, v, bias = (a.astype(dt) for a in _mha_inputs())
    f = [a.astype(np.float64) for a in (q, k, v, bias)]
    y, pk, pv = ms("MultiHeadAttention", [q, k, v, bias], 3, num_heads=N)
    close(y, merge(attend(heads(f[0] + f[3][:D], N), heads(f[1] + f[3][D:2 * D], N),
                          heads(f[2] + f[3][2 * D:], N))[0]), dt, tol)
    close(pk, heads(f[1] + f[3][D:2 * D], N), dt, tol)
    inputs = [a.astype(dt) if a.dtype == np.float32 else a for a in _gqa(1, 5, [5, 3])]
    got = ms("GroupQueryAttention", inputs, 3, num_heads=GN, kv_num_heads=GK)
    ref = gqa_ref(*[a.astype(np.float64) for a in inputs[:5]], inputs[5], 1, False)
    for a, r in zip(got, ref):
        close(a, r, dt, tol)


def test_rotary_embedding_bfloat16():
    x4 = rnd((B, N, S, HS)).astype(BF16)
    ang = np.arange(4)[:, None] * np.array([[1.0, 0.01]])
    cos, sin = np.cos(ang).astype(BF16), np.sin(ang).astype(BF16)
    got = ms("RotaryEmbedding", [x4, np.array([1], np.int64), cos, sin])
    pos = np.broadcast_to(1 + np.arange(S), (B, S))
    exp = rotate(x4, cos.astype(np.float64)[pos][:, None], sin.astype(np.float64)[pos][:, None])
    close(got, exp, BF16)


@pytest.mark.parametrize("tname", ["float16", "float", "double", "bfloat16", "uint8", "uint16", "uint32", "uint64",
                                   "int8", "int16", "int32", "int64", "bool"])
def test_trilu_every_type(tname):
    dt = np.dtype(FLOATS.get(tname, tname))
    x = np.arange(2, 26).reshape(2, 3, 4).astype(dt)
    i, j = np.indices((3, 4))
    got = ms("Trilu", [x, np.array(1, np.int64)])
    assert got.dtype == dt
    np.testing.assert_array_equal(got, np.where(j - i >= 1, x, np.zeros((), dt)))


@pytest.mark.parametrize("tname", ["float16", "double"])
def test_grid_sample_and_fused_conv_other_floats(tname):
    dt = FLOATS[tname]
    x = np.arange(4).reshape(1, 1, 2, 2).astype(dt)
    grid = np.array([[[[-1, -1], [1, 1]], [[0, 0], [1, -1]]]], dt)
    close(ms("GridSample", [x, grid], align_corners=1), [[[[0, 3], [1.5, 1]]]], dt)
    xc, w = rnd((1, 2, 4, 4)).astype(dt), rnd((2, 2, 3, 3), 1).astype(dt)
    close(ms("FusedConv", [xc, w], activation="Relu"), np.maximum(conv_ref(xc, w), 0), dt,
          5e-3 if tname == "float16" else None)


# -- more onnxruntime agreement (skipped without it) ----------------------------------------------

def _ort_cases():
    x, w, bias = _attention_inputs()
    past = rnd((2, B, N, 4, HS), 5)
    q, k, v = rnd((B, S, D)), rnd((B, S, D), 1), rnd((B, S, D), 2)
    pk, pv = rnd((B, N, 5, HS), 3), rnd((B, N, 5, HS), 4)
    g = _gqa(1, 5, [5, 3], seed=30)
    gemm = [rnd((2, 3)), rnd((3, 4), 1)]
    return {
        "attention_lengths_past": ("Attention", [x, w, bias, np.array([5, 7], np.int32), past], 2, dict(num_heads=N)),
        "attention_ends_starts_past": ("Attention", [x, w, bias, np.array([7, 5, 1, 0], np.int32), past], 2,
                                       dict(num_heads=N)),
        "attention_all_masked_row": ("Attention", [x, w, bias, np.array([[0, 0, 0], [1, 1, 0]], np.int32)], 1,
                                     dict(num_heads=N)),
        "attention_float16": ("Attention", [x.astype(np.float16), w.astype(np.float16), bias.astype(np.float16),
                                            np.array([2, 3], np.int32)], 1, dict(num_heads=N)),
        "mha_mask_past": ("MultiHeadAttention", [q, k, v, None, np.array([[1, 0, 1, 1, 1, 1, 0, 1]] * B, np.int32),
                                                 None, pk, pv], 3, dict(num_heads=N)),
        "mha_bias_attention_bias_past": ("MultiHeadAttention", [q, k, v, rnd(3 * D, 6), None, rnd((B, N, S, 8), 7),
                                                                pk, pv], 3, dict(num_heads=N)),
        "gqa_attention_bias": ("GroupQueryAttention", g + [None] * 3 + [rnd((B, GN, 1, 6), 9)], 3,
                               dict(num_heads=GN, kv_num_heads=GK)),
        "gqa_head_sink": ("GroupQueryAttention", g + [None] * 4 + [rnd(GN, 40)], 3,
                          dict(num_heads=GN, kv_num_heads=GK)),
        "gqa_smooth_softmax": ("GroupQueryAttention", g, 3, dict(num_heads=GN, kv_num_heads=GK, smooth_softmax=1)),
        "gqa_non_causal_padded_prompt": ("GroupQueryAttention", _gqa(3, 0, [2, 1]), 3,
                                         dict(num_heads=GN, kv_num_heads=GK, causal=0)),
        "gqa_larger_cache": ("GroupQueryAttention", _gqa(1, 8, [5, 3]), 3, dict(num_heads=GN, kv_num_heads=GK)),
        "gqa_window_prompt": ("GroupQueryAttention", _gqa(3, 0, [2, 2]), 3,
                              dict(num_heads=GN, kv_num_heads=GK, local_window_size=2)),
        "gqa_float16": ("GroupQueryAttention", [a.astype(np.float16) if a.dtype == np.float32 else a for a in g], 3,
                        dict(num_heads=GN, kv_num_heads=GK)),
        "gemm_softplus": ("FusedGemm", gemm, 1, dict(activation="Softplus")),
        "gemm_thresholded_relu": ("FusedGemm", gemm, 1, dict(activation="ThresholdedRelu", activation_alpha=0.5)),
        "gemm_scaled_tanh": ("FusedGemm", gemm, 1, dict(activation="ScaledTanh", activation_alpha=0.5,
                                                        activation_beta=2.0)),
        "gemm_parametric_softplus": ("FusedGemm", gemm, 1, dict(activation="ParametricSoftplus",
                                                                activation_alpha=0.5, activation_beta=2.0)),
        "matmul_vector": ("FusedMatMul", [rnd(3), rnd((2, 3, 4), 1)], 1, dict(transA=1)),
        "grid_bicubic_reflection": ("GridSample", [rnd((1, 2, 4, 4)), np.clip(rnd((1, 3, 3, 2), 1), -1.2, 1.2)], 1,
                                    dict(mode="bicubic", padding_mode="reflection")),
        "range_float": ("Range", [np.array(1.5, np.float32), np.array(7, np.float32), np.array(0.7, np.float32)], 1,
                        {}),
        "inverse": ("Inverse", [rnd((2, 3, 3))], 1, {}),
    }


@pytest.mark.parametrize("case", sorted(_ort_cases()))
def test_agrees_with_onnxruntime(case):
    pytest.importorskip("onnxruntime")
    op, inputs, n, attrs = _ort_cases()[case]
    agree(ms(op, inputs, n, **attrs), op, inputs, n, tol=2e-5, **attrs)


def test_empty_tensors():
    e = np.zeros((2, 0, 4), np.float32)
    for op, inputs in (("Gelu", [e]), ("FastGelu", [e, rnd(4)]), ("BiasGelu", [e, rnd(4)]), ("QuickGelu", [e]),
                       ("BiasAdd", [e, rnd(4), e]), ("SkipLayerNormalization", [e, e, rnd(4)]),
                       ("SkipSimplifiedLayerNormalization", [e, e, rnd(4)])):
        got = ms(op, inputs)
        assert got.shape == e.shape and got.dtype == np.float32, op
    assert ms("BiasSplitGelu", [e, rnd(4)]).shape == (2, 0, 2)
    assert ms("Range", [np.array(3, np.int32), np.array(3, np.int32)]).shape == (0,)


def test_skip_layer_normalization_with_omitted_middle_outputs():
    """The transformer optimizer writes SkipLayerNormalization(..) -> [output, "", "", input_skip_bias_sum]."""
    x, skip, g = rnd((1, 2, 4)), rnd((1, 2, 4), 1), rnd(4, 2)
    node = helper.make_node("SkipLayerNormalization", ["x", "skip", "g"], ["y", "", "", "s"], domain=MS)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 2, 4])
                                            for n in ("x", "skip")],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "s")],
                              [helper.make_tensor("g", TensorProto.FLOAT, [4], g)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14), helper.make_opsetid(MS, 1)])
    y, s = onnx_mini.prepare(model).run({"x": x, "skip": skip})
    close(s, x.astype(np.float64) + skip)
    close(y, layer_norm(x.astype(np.float64) + skip, g)[0], tol=1e-4)


def test_multi_head_attention_share_buffer():
    q, kk, vv = rnd((B, S, D)), rnd((B, S, D), 1), rnd((B, S, D), 2)
    pk, pv = rnd((B, N, 7, HS), 3), rnd((B, N, 7, HS), 4)
    y, k_out, v_out = ms("MultiHeadAttention", [q, kk, vv, None, None, None, pk, pv, np.array([2], np.int32)], 3,
                         num_heads=N, unidirectional=1)
    K = np.concatenate([pk[:, :, :2], heads(kk, N)], 2)
    V = np.concatenate([pv[:, :, :2], heads(vv, N)], 2)
    close(y, merge(attend(heads(q, N), K, V, causal(S, 5, 2))[0]), tol=1e-5)
    assert k_out.shape == pk.shape
    close(k_out[:, :, :5], K, tol=0)
    np.testing.assert_array_equal(v_out[:, :, 5:], pv[:, :, 5:])


def test_group_query_attention_qk_norm():
    inputs = _gqa(1, 5, [5, 3], seed=50)
    q, k, v, pk, pv, lens, total = inputs
    wq, wk = rnd(GH, 60), rnd(GH, 61)
    got = ms("GroupQueryAttention", inputs + [None] * 7 + [wq, wk], 3, num_heads=GN, kv_num_heads=GK,
             qk_norm_epsilon=1e-3)

    def rms(x, n, w):
        h = heads(x.astype(np.float64), n)
        return merge(h / np.sqrt((h ** 2).mean(-1, keepdims=True) + 1e-3) * w)
    ref = gqa_ref(rms(q, GN, wq), rms(k, GK, wk), v, pk, pv, lens, 1, False)
    for a, r in zip(got, ref):
        close(a, r, tol=1e-5)


def test_group_query_attention_prompt_position_ids_first_element_only():
    """"When processing the first prompt the kernel uses only the first element" of position_ids."""
    inputs = _gqa(3, 0, [2, 2], seed=70)
    ang = np.arange(16)[:, None] * 10000.0 ** (-np.arange(0, GH, 2) / GH)
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    attrs = dict(num_heads=GN, kv_num_heads=GK, do_rotary=1)
    pids = np.array([[5, 9, 2], [0, 4, 1]], np.int64)
    got = ms("GroupQueryAttention", inputs + [cos, sin, pids], 3, **attrs)
    q, k, v, pk, pv, lens, total = inputs
    shifted = np.concatenate([cos[5:], cos[:5]]), np.concatenate([sin[5:], sin[:5]])   # positions 5 + i
    ref = gqa_ref(q, k, v, pk, pv, lens, 3, True, cos=shifted[0].astype(np.float64),
                  sin=shifted[1].astype(np.float64))
    for a, r in zip(got, ref):
        close(a, r, tol=1e-5)
    agree(got, "GroupQueryAttention", inputs + [cos, sin, pids], 3, **attrs)


@pytest.mark.parametrize("n_outputs", [3, 4])
def test_group_query_attention_bias_with_a_larger_cache(n_outputs):
    """attention_bias (columns: absolute key positions, total_sequence_length of them) with a cache of 8
    rows of which at most 6 are used: the attention reads the first columns; with output_qk every row."""
    inputs = _gqa(1, 8, [5, 3], seed=40)
    q, k, v, pk, pv, lens, total = inputs
    bias = rnd((B, GN, 1, int(total)), 41)
    attrs = dict(num_heads=GN, kv_num_heads=GK, qk_output=1 if n_outputs == 4 else 0)
    got = ms("GroupQueryAttention", inputs + [None] * 3 + [bias], n_outputs, **attrs)
    ref = gqa_ref(q, k, v, pk, pv, lens, 1, False, bias=bias.astype(np.float64))
    for a, r in zip(got, ref):
        close(a, r, tol=1e-5)
    if n_outputs == 4:
        assert got[3].shape == (B, GN, 1, 8)


def test_group_query_attention_rotary_positions_past_the_cache():
    """New tokens at positions 5 and 6 (or position_ids 9) against a cos/sin cache of 6 rows: a clear error."""
    inputs = _gqa(2, 5, [6, 5], seed=20)
    ang = np.arange(6)[:, None] * 10000.0 ** (-np.arange(0, GH, 2) / GH)
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    attrs = dict(num_heads=GN, kv_num_heads=GK, do_rotary=1)
    with raises_naming_node(KernelError, "positions up to 6 exceed the 6 rows of cos_cache"):
        ms("GroupQueryAttention", inputs + [cos, sin], 3, **attrs)
    pids = np.array([[2, 3], [9, 1]], np.int64)
    with raises_naming_node(KernelError, "positions up to 9 exceed the 6 rows of cos_cache"):
        ms("GroupQueryAttention", inputs + [cos, sin, pids], 3, **attrs)


def test_group_query_attention_constant_caches_across_threads():
    """cos/sin caches as initializers: the rotation is made once at prepare (here a partial one, rotary dim
    GH / 2) and a prepared model runs from several threads at once; each result equals the one-node run
    with the caches fed (the rotation made per call)."""
    from concurrent.futures import ThreadPoolExecutor
    ang = np.arange(16)[:, None] * 10000.0 ** (-np.arange(0, GH // 2, 2) / (GH // 2))
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    node = helper.make_node("GroupQueryAttention", ["qkv", "", "", "pk", "pv", "lens", "total", "cos", "sin"],
                            ["y", "k_out", "v_out"], domain=MS, num_heads=GN, kv_num_heads=GK, do_rotary=1)
    F, I = TensorProto.FLOAT, TensorProto.INT32
    graph = helper.make_graph(
        [node], "gqa", [helper.make_tensor_value_info("qkv", F, [B, 1, (GN + 2 * GK) * GH]),
                        helper.make_tensor_value_info("pk", F, [B, GK, 5, GH]),
                        helper.make_tensor_value_info("pv", F, [B, GK, 5, GH]),
                        helper.make_tensor_value_info("lens", I, [B]), helper.make_tensor_value_info("total", I, [])],
        [helper.make_tensor_value_info(n, F, None) for n in ("y", "k_out", "v_out")],
        [helper.make_tensor("cos", F, cos.shape, cos.ravel()), helper.make_tensor("sin", F, sin.shape, sin.ravel())])
    model = onnx_mini.prepare(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                                      helper.make_opsetid(MS, 1)], ir_version=9))
    cases = []
    for seed, lens in enumerate(([5, 5], [5, 3], [4, 2], [3, 5])):
        q, k, v, pk, pv, ln, total = _gqa(1, 5, lens, seed=30 + 5 * seed)
        feeds = {"qkv": np.concatenate([q, k, v], -1), "pk": pk, "pv": pv, "lens": ln, "total": total}
        want = ms("GroupQueryAttention", [feeds["qkv"], None, None, pk, pv, ln, total, cos, sin], 3,
                  num_heads=GN, kv_num_heads=GK, do_rotary=1)
        cases.append((feeds, want))
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda c: [model.run(c[0]) for _ in range(20)], cases))
    for (_, want), runs in zip(cases, results):
        for got in runs:
            for a, w in zip(got, want):
                np.testing.assert_array_equal(a, w)


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("s", [1, 2])
def test_group_query_attention_constant_full_width_rotation(interleaved, s):
    """cos/sin caches as initializers of the full head width (a decoder's usual case: the rotation is made
    from tables prepared once): bit for bit the result with the caches fed (RotaryEmbedding's rotation),
    and the reference; a position past the cache is still a clear error."""
    ang = np.arange(12)[:, None] * 10000.0 ** (-np.arange(0, GH, 2) / GH)
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    attrs = dict(num_heads=GN, kv_num_heads=GK, do_rotary=1, rotary_interleaved=interleaved)
    node = helper.make_node("GroupQueryAttention", ["qkv", "", "", "pk", "pv", "lens", "total", "cos", "sin"],
                            ["y", "k_out", "v_out"], name="the_node", domain=MS, **attrs)
    F, I = TensorProto.FLOAT, TensorProto.INT32
    graph = helper.make_graph(
        [node], "gqa", [helper.make_tensor_value_info("qkv", F, None), helper.make_tensor_value_info("pk", F, None),
                        helper.make_tensor_value_info("pv", F, None), helper.make_tensor_value_info("lens", I, None),
                        helper.make_tensor_value_info("total", I, [])],
        [helper.make_tensor_value_info(n, F, None) for n in ("y", "k_out", "v_out")],
        [helper.make_tensor("cos", F, cos.shape, cos.ravel()), helper.make_tensor("sin", F, sin.shape, sin.ravel())])
    model = onnx_mini.prepare(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                                      helper.make_opsetid(MS, 1)], ir_version=9))
    for lens, batch in (([6, 6], B), ([6, 4], B), ([6, 6], 1)):    # batch 1: one position when s is 1
        q, k, v, pk, pv, ln, total = (x[:batch] if x.ndim else x for x in _gqa(s, 6, lens, seed=50))
        qkv = np.concatenate([q, k, v], -1)
        got = model.run({"qkv": qkv, "pk": pk, "pv": pv, "lens": ln, "total": total})
        fed = ms("GroupQueryAttention", [qkv, None, None, pk, pv, ln, total, cos, sin], 3, **attrs)
        for a, w in zip(got, fed):
            np.testing.assert_array_equal(a, w)
        ref = gqa_ref(q, k, v, pk, pv, ln, s, False, cos=cos.astype(np.float64), sin=sin.astype(np.float64),
                      interleaved=bool(interleaved))
        for a, r in zip(got, ref):
            close(a, r, tol=1e-5)
    for batch in (B, 1):
        q, k, v, pk, pv, ln, total = (x[:batch] if x.ndim else x for x in _gqa(s, 12, [12, 11], seed=50))
        with raises_naming_node(KernelError, "positions up to 12 exceed the 12 rows of cos_cache"):
            model.run({"qkv": np.concatenate([q, k, v], -1), "pk": pk, "pv": pv, "lens": ln, "total": total})


def test_decoder_layer_end_to_end():
    """A decoder layer as onnxruntime's model builder writes it (float weights): SkipSimplifiedLayerNorm ->
    MatMul (packed QKV) -> GroupQueryAttention with rotary and a KV cache -> MatMul ->
    SkipSimplifiedLayerNorm -> MatMul -> FastGelu -> MatMul -> Add."""
    h = helper
    hidden, inter, past_len, s = GN * GH, 32, 3, 2
    rng = np.random.default_rng(11)
    w = {n: (rng.standard_normal(shape) * sc).astype(np.float32) for n, shape, sc in (
        ("ln1", (hidden,), 1), ("qkv_w", (hidden, (GN + 2 * GK) * GH), 0.2), ("o_w", (hidden, hidden), 0.2),
        ("ln2", (hidden,), 1), ("up_w", (hidden, inter), 0.2), ("down_w", (inter, hidden), 0.2))}
    ang = np.arange(16)[:, None] * 10000.0 ** (-np.arange(0, GH, 2) / GH)
    w["cos"], w["sin"] = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    nodes = [
        h.make_node("SkipSimplifiedLayerNormalization", ["x", "residual", "ln1"], ["n1", "", "", "r1"], domain=MS,
                    epsilon=1e-6, name="ln1"),
        h.make_node("MatMul", ["n1", "qkv_w"], ["qkv"], name="qkv_proj"),
        h.make_node("GroupQueryAttention", ["qkv", "", "", "past_k", "past_v", "seqlens_k", "total_len", "cos",
                                            "sin"], ["attn", "present_k", "present_v"], domain=MS, num_heads=GN,
                    kv_num_heads=GK, do_rotary=1, name="gqa"),
        h.make_node("MatMul", ["attn", "o_w"], ["o"], name="o_proj"),
        h.make_node("SkipSimplifiedLayerNormalization", ["o", "r1", "ln2"], ["n2", "", "", "r2"], domain=MS,
                    epsilon=1e-6, name="ln2"),
        h.make_node("MatMul", ["n2", "up_w"], ["up"], name="up_proj"),
        h.make_node("FastGelu", ["up"], ["act"], domain=MS, name="act"),
        h.make_node("MatMul", ["act", "down_w"], ["down"], name="down_proj"),
        h.make_node("Add", ["down", "r2"], ["y"], name="residual_add"),
    ]
    F = TensorProto.FLOAT
    inputs = [h.make_tensor_value_info("x", F, [1, s, hidden]), h.make_tensor_value_info("residual", F, [1, s, hidden]),
              h.make_tensor_value_info("past_k", F, [1, GK, past_len, GH]),
              h.make_tensor_value_info("past_v", F, [1, GK, past_len, GH]),
              h.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
              h.make_tensor_value_info("total_len", TensorProto.INT32, [])]
    outputs = [h.make_tensor_value_info(n, F, None) for n in ("y", "present_k", "present_v")]
    graph = h.make_graph(nodes, "decoder_layer", inputs, outputs,
                         [h.make_tensor(n, F, a.shape, a.ravel()) for n, a in w.items()])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17), h.make_opsetid(MS, 1)], ir_version=9)
    feeds = {"x": rnd((1, s, hidden), 1), "residual": rnd((1, s, hidden), 2),
             "past_k": rnd((1, GK, past_len, GH), 3), "past_v": rnd((1, GK, past_len, GH), 4),
             "seqlens_k": np.array([past_len + s - 1], np.int32), "total_len": np.array(past_len + s, np.int32)}
    y, pk, pv = onnx_mini.prepare(model).run(feeds)

    f = {k: v.astype(np.float64) for k, v in {**w, **feeds}.items() if v.dtype == np.float32}

    def rms(x, g):
        return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + 1e-6) * g
    r1 = f["x"] + f["residual"]
    qkv = rms(r1, f["ln1"]) @ f["qkv_w"]
    q, k, v = qkv[..., :GN * GH], qkv[..., GN * GH:(GN + GK) * GH], qkv[..., (GN + GK) * GH:]
    attn, rk, rv = gqa_ref(q, k, v, f["past_k"], f["past_v"], feeds["seqlens_k"], s, False, cos=f["cos"],
                           sin=f["sin"])
    r2 = attn @ f["o_w"] + r1
    ref = fast_gelu(rms(r2, f["ln2"]) @ f["up_w"]) @ f["down_w"] + r2
    close(y, ref, tol=1e-4)
    close(pk, rk, tol=1e-5)
    close(pv, rv, tol=1e-5)
    if ORT is not None:
        sess = ORT.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        for a, b in zip((y, pk, pv), sess.run(None, feeds)):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", ["int8_tensor", "int8_channel", "4bit_tensor", "4bit_channel", "float8"])
def test_group_query_attention_quantized_cache(kind):
    """The new keys/values are quantized into the cache and attention reads the dequantized cache."""
    rng = np.random.default_rng(80)
    inputs = _gqa(1, 5, [5, 3], seed=81)
    q, k, v, _, _, lens, total = inputs
    channel = kind.endswith("channel")
    scale = (rng.random((1, GK, 1, GH)) * 0.03 + 0.01 if channel else np.array([0.02])).astype(np.float32)
    sc = scale.astype(np.float64).reshape((1,) * 4 if scale.size == 1 else scale.shape)
    if kind.startswith("int8"):
        past = rng.integers(-100, 100, (B, GK, 5, GH)).astype(np.int8)
        deq = past * sc
        attrs = dict(kv_cache_bit_width=8)
    elif kind.startswith("4bit"):
        nib = rng.integers(-8, 8, (B, GK, 5, GH))
        past = ((nib[..., 0::2] + 8) | ((nib[..., 1::2] + 8) << 4)).astype(np.uint8)
        deq = nib * sc
        attrs = dict(kv_cache_bit_width=4)
    else:
        past = rng.standard_normal((B, GK, 5, GH)).astype(ml_dtypes.float8_e4m3fn)
        deq = past.astype(np.float64) * sc
        attrs = {}
    qt = "PER_CHANNEL" if channel else "PER_TENSOR"
    attrs.update(num_heads=GN, kv_num_heads=GK, k_quant_type=qt, v_quant_type=qt)
    full = [q, k, v, past, past.copy(), lens, total] + [None] * 5 + [scale, scale]
    y, pk, pv = ms("GroupQueryAttention", full, 3, **attrs)
    assert pk.dtype == past.dtype and pk.shape[:3] == (B, GK, 6)

    def quant_dequant(x):                           # the new rows as stored and read back
        t = x / sc
        if kind.startswith("int8"):
            return np.clip(np.rint(t), -128, 127) * sc
        if kind.startswith("4bit"):
            return np.clip(np.rint(t), -8, 7) * sc
        return t.astype(ml_dtypes.float8_e4m3fn).astype(np.float64) * sc
    kn, vn = quant_dequant(heads(k.astype(np.float64), GK)), quant_dequant(heads(v.astype(np.float64), GK))
    ref_y, ref_k, _ = gqa_ref(q, merge(kn), merge(vn), deq, deq, lens, 1, False)
    close(y, ref_y, tol=1e-5)
    dequantized = {"int8": lambda c: c * sc, "float8": lambda c: c.astype(np.float64) * sc,
                   "4bit": lambda c: (np.stack([c & 15, c >> 4], -1).reshape(B, GK, 6, GH) - 8.0) * sc}
    valid = (np.arange(6)[None, :] < lens[:, None] + 1)[:, None, :, None]   # the rows past them are zero bytes
    close(np.where(valid, dequantized[kind.split("_")[0]](pk), 0), ref_k, np.float64, 1e-6)
    if kind != "float8":                            # onnxruntime's CPU kernel has no float8 cache
        agree((y, pk, pv), "GroupQueryAttention", full, 3, **attrs)


def resident(t, capacity, window):
    """The documented L(T) of sliding_window_cache."""
    g = capacity - window + 1
    return t if t <= capacity else t - g * math.ceil((t - capacity) / g)


@pytest.mark.parametrize("starts,s,capacity,window", [([6], 1, 4, 3), ([4, 9], 1, 5, 3), ([2, 6], 1, 3, 3),
                                                       ([8], 3, 4, 3), ([4], 6, 4, 3), ([0], 5, 4, 3)])
def test_group_query_attention_sliding_window_cache(starts, s, capacity, window):
    """Past rows [0, L(start)) hold the newest positions of each batch's history; queries see the
    `window` newest keys up to themselves; present keeps the L(start + s) newest positions in order."""
    b = len(starts)
    rng = np.random.default_rng(90)
    hist_k = rng.standard_normal((b, GK, max(starts) + s, GH)).astype(np.float32)   # every position's K / V
    hist_v = rng.standard_normal((b, GK, max(starts) + s, GH)).astype(np.float32)
    q = rnd((b, s, GN * GH), 91)
    past_k = np.zeros((b, GK, capacity, GH), np.float32)
    past_v = np.zeros_like(past_k)
    for i, t in enumerate(starts):
        held = resident(t, capacity, window)
        past_k[i, :, :held], past_v[i, :, :held] = hist_k[i, :, t - held:t], hist_v[i, :, t - held:t]
    new_k = np.stack([merge(hist_k[i:i + 1, :, t:t + s])[0] for i, t in enumerate(starts)])
    new_v = np.stack([merge(hist_v[i:i + 1, :, t:t + s])[0] for i, t in enumerate(starts)])
    lens = np.array([t + s - 1 for t in starts], np.int32)
    total = np.array(max(starts) + s, np.int32)
    inputs = [q, new_k, new_v, past_k, past_v, lens, total]
    attrs = dict(num_heads=GN, kv_num_heads=GK, local_window_size=window, sliding_window_cache=1)
    y, pk, pv = ms("GroupQueryAttention", inputs, 3, **attrs)
    out = []
    for i, t in enumerate(starts):
        qi = heads(q[i:i + 1].astype(np.float64), GN)[0]
        kk = np.repeat(hist_k[i].astype(np.float64), GN // GK, 0)
        vv = np.repeat(hist_v[i].astype(np.float64), GN // GK, 0)
        pos, j = t + np.arange(s)[:, None], np.arange(kk.shape[1])[None, :]
        sc = np.where((j <= pos) & (j > pos - window), qi @ kk.swapaxes(-1, -2) / math.sqrt(GH), -np.inf)
        out.append(softmax(sc) @ vv)
        keep = resident(t + s, capacity, window)
        close(pk[i, :, :keep], hist_k[i, :, t + s - keep:t + s], tol=0)
        close(pv[i, :, :keep], hist_v[i, :, t + s - keep:t + s], tol=0)
        assert (pk[i, :, keep:] == 0).all()
    close(y, merge(np.stack(out)), tol=1e-5)
    exp = ort_node("GroupQueryAttention", inputs, 3, **attrs)
    if exp is not None and (b == 1 or s == 1):     # onnxruntime: batch 1 when seq > 1 with past
        np.testing.assert_allclose(y, exp[0], rtol=1e-5, atol=1e-5)
        for i, t in enumerate(starts):              # rows past L(T) are unspecified there
            keep = resident(t + s, capacity, window)
            np.testing.assert_array_equal(pk[i, :, :keep], exp[1][i, :, :keep])
    with raises_naming_node(KernelError, "capacity"):
        ms("GroupQueryAttention", inputs, 3, **{**attrs, "local_window_size": capacity + 1})


def _count_decode_steps(monkeypatch) -> list:
    """From now on, GroupQueryAttention kernels record each call of their decode step in the list
    returned: True when it computed the result, False when it left it to the general path."""
    from onnx_mini.ops.contrib import transformer
    made, taken = transformer._one_token_step, []

    def counting(*args):
        step = made(*args)

        def counted(*inputs):
            out = step(*inputs)
            taken.append(out is not None)
            return out
        return counted
    monkeypatch.setattr(transformer, "_one_token_step", counting)
    return taken


def _gqa_decode_kernels(monkeypatch, **attrs):
    """The GroupQueryAttention kernel built with the caches as constants, as the planner builds it, with
    the decode step's calls counted (_count_decode_steps), and the same kernel without the decode step."""
    from onnx_mini.ops.contrib import transformer
    made = transformer._one_token_step
    taken = _count_decode_steps(monkeypatch)
    fast = transformer.group_query_attention_1(**attrs)
    monkeypatch.setattr(transformer, "_one_token_step", lambda *args: None)
    general = transformer.group_query_attention_1(**attrs)
    monkeypatch.setattr(transformer, "_one_token_step", made)
    return fast, general, taken


@pytest.mark.parametrize("rotary", ["none", "half", "interleaved"])
@pytest.mark.parametrize("packed", [0, 1])
@pytest.mark.parametrize("past_len,length,scale", [(6, 6, None), (9, 4, 0.3), (0, 0, None), (5, 0, 0.5)])
def test_group_query_attention_decode_step(monkeypatch, rotary, packed, past_len, length, scale):
    """One token of one sequence (past given, no mask, bias or position_ids): the decode step is taken
    and gives the general path's result to float32 rounding (the same steps: bit for bit here) and the
    float64 reference; positions 0 (an empty past, or a first token written at row 0 of a larger
    buffer: total_sequence_length 1) to 6, in caches of 0 to 9 rows (present rows past the token: 0)."""
    ang = np.arange(12)[:, None] * 10000.0 ** (-np.arange(0, GH, 2) / GH)
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    attrs = dict(num_heads=GN, kv_num_heads=GK, scale=scale, _n_outputs=3)
    if rotary != "none":
        attrs.update(do_rotary=1, rotary_interleaved=int(rotary == "interleaved"), _constants={7: cos, 8: sin})
    fast, general, taken = _gqa_decode_kernels(monkeypatch, **attrs)
    q, k, v, pk, pv, lens, total = (x[:1] if x.ndim else x for x in _gqa(1, past_len, [length, 0], seed=60))
    if length == 0:
        total = np.array(1, np.int32)
    inputs = ([np.concatenate([q, k, v], -1), None, None] if packed else [q, k, v]) + [pk, pv, lens, total]
    inputs += [cos, sin] if rotary != "none" else []
    got = fast(*inputs)
    assert taken == [True]
    want = general(*inputs)
    assert taken == [True]
    rot = dict(cos=cos.astype(np.float64), sin=sin.astype(np.float64)) if rotary != "none" else {}
    ref = gqa_ref(q, k, v, pk, pv, lens[:1], 1, length == 0, scale=scale, interleaved=rotary == "interleaved", **rot)
    for a, w, r in zip(got, want, ref):
        assert a.dtype == np.float32 and a.shape == w.shape
        np.testing.assert_allclose(a, w, rtol=1e-6, atol=1e-7)
        close(a, r, tol=1e-5)
    assert got[1].shape[2] == max(past_len, length + 1) and not got[1][0, :, length + 1:].any()


def test_group_query_attention_decode_step_leaves_the_rest_to_the_general_path(monkeypatch):
    """Two sequences, position_ids, a float64 query or a position past the cos cache: the decode step
    declines (before computing anything) and the general path answers, errors included."""
    ang = np.arange(8)[:, None] * 10000.0 ** (-np.arange(0, GH, 2) / GH)
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    fast, general, taken = _gqa_decode_kernels(monkeypatch, num_heads=GN, kv_num_heads=GK, do_rotary=1,
                                               _n_outputs=3, _constants={7: cos, 8: sin})
    inputs = _gqa(1, 9, [6, 4], seed=70) + [cos, sin]
    for a, w in zip(fast(*inputs), general(*inputs)):                       # batch 2
        np.testing.assert_array_equal(a, w)
    one = [x[:1] if x.ndim else x for x in inputs[:7]] + [cos, sin]
    pids = np.array([[3]], np.int64)
    for a, w in zip(fast(*one, pids), general(*one, pids)):                 # position_ids
        np.testing.assert_array_equal(a, w)
    one64 = [x.astype(np.float64) for x in one[:5]] + one[5:]
    close(fast(*one64)[0], general(*one)[0], np.float64, tol=1e-6)        # float64
    assert taken == [False, False]           # (batch 2 and float64 declined by the step, position_ids before it)
    with pytest.raises(onnx_mini.errors.InvalidValueError, match="positions up to 8 exceed the 8 rows of cos_cache"):
        fast(*one[:5], np.array([8], np.int32), np.array(9, np.int32), cos, sin)
    with pytest.raises(onnx_mini.errors.InvalidValueError, match="seqlens_k .* do not fit"):
        fast(*one[:5], np.array([9], np.int32), np.array(9, np.int32), cos, sin)
    assert taken == [False] * 4
    y = fast(*one)                                                          # the step itself
    assert taken == [False] * 4 + [True]
    np.testing.assert_array_equal(y[0], general(*one)[0])


def test_group_query_attention_decode_step_in_a_prepared_model(monkeypatch):
    """A prepared model with the cos/sin caches as initializers (the planner hands them to the factory):
    a one-token step of one sequence takes the decode step, a step of two sequences does not; both give
    the one-node run with the caches fed (the general path) bit for bit."""
    taken = _count_decode_steps(monkeypatch)
    ang = np.arange(12)[:, None] * 10000.0 ** (-np.arange(0, GH, 2) / GH)
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    node = helper.make_node("GroupQueryAttention", ["qkv", "", "", "pk", "pv", "lens", "total", "cos", "sin"],
                            ["y", "k_out", "v_out"], domain=MS, num_heads=GN, kv_num_heads=GK, do_rotary=1)
    F, I = TensorProto.FLOAT, TensorProto.INT32
    graph = helper.make_graph(
        [node], "gqa", [helper.make_tensor_value_info(n, F, None) for n in ("qkv", "pk", "pv")]
        + [helper.make_tensor_value_info("lens", I, None), helper.make_tensor_value_info("total", I, [])],
        [helper.make_tensor_value_info(n, F, None) for n in ("y", "k_out", "v_out")],
        [helper.make_tensor("cos", F, cos.shape, cos.ravel()), helper.make_tensor("sin", F, sin.shape, sin.ravel())])
    model = onnx_mini.prepare(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                                      helper.make_opsetid(MS, 1)], ir_version=9))
    for batch, want_taken in ((1, [True]), (B, [False])):
        q, k, v, pk, pv, ln, total = (x[:batch] if x.ndim else x for x in _gqa(1, 7, [7, 5], seed=80))
        qkv = np.concatenate([q, k, v], -1)
        taken.clear()
        got = model.run({"qkv": qkv, "pk": pk, "pv": pv, "lens": ln, "total": total})
        assert taken == want_taken
        fed = ms("GroupQueryAttention", [qkv, None, None, pk, pv, ln, total, cos, sin], 3, num_heads=GN,
                 kv_num_heads=GK, do_rotary=1)
        for a, w in zip(got, fed):
            np.testing.assert_array_equal(a, w)
