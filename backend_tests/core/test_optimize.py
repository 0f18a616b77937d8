"""Prepare-time graph optimisation (onnx_mini/optimize): each pass on small hand-built graphs, checked
on the optimised plan's steps and against the graph run as written (optimize=False); and the cases
where a pass must not fire."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_mini
from onnx_mini.optimize import FUSED_DOMAIN, PASSES
from helpers import F, conv2d_direct, init, model, steps

FUSED = FUSED_DOMAIN
pytestmark = pytest.mark.filterwarnings("error::onnx_mini.optimize.OptimizationWarning")
RNG = np.random.default_rng(7)


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def check(m, feeds, expected_steps, rtol=1e-5, atol=1e-5):
    """The optimised plan has `expected_steps` ((domain, op) pairs, or op names of the default domain)
    and gives the results of the unoptimised one; returns the optimised prepared model."""
    opt, raw = onnx_mini.prepare(m), onnx_mini.prepare(m, optimize=False)
    want = [s if isinstance(s, tuple) else ("", s) for s in expected_steps]
    assert steps(opt) == want
    got, ref = opt.run(feeds), raw.run(feeds)
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype and g.shape == r.shape
        np.testing.assert_allclose(g.astype(np.float64), r.astype(np.float64), rtol=rtol, atol=atol)
    return opt


def bn_inits(prefix, c, seed=0):
    r = np.random.default_rng(seed)
    return [init(f"{prefix}_s", r.uniform(0.5, 2, c).astype(np.float32)),
            init(f"{prefix}_b", r.standard_normal(c).astype(np.float32)),
            init(f"{prefix}_m", r.standard_normal(c).astype(np.float32)),
            init(f"{prefix}_v", r.uniform(0.5, 2, c).astype(np.float32))]


def bn(x, y, prefix="bn", **attrs):
    return helper.make_node("BatchNormalization", [x, f"{prefix}_s", f"{prefix}_b", f"{prefix}_m", f"{prefix}_v"],
                            [y], epsilon=1e-3, **attrs)


# -- dead nodes ----------------------------------------------------------------------------------------

def test_dead_nodes_and_unused_random_ops_are_removed():
    nodes = [helper.make_node("Relu", ["x"], ["y"]),
             helper.make_node("Exp", ["x"], ["unused"]),
             helper.make_node("Neg", ["unused"], ["unused2"]),
             helper.make_node("RandomNormalLike", ["x"], ["noise"])]
    check(model(nodes, [("x", F, [3])], [("y", F, [3])]), [rand(3)], ["Relu"])


def test_dead_node_kept_when_its_output_is_a_graph_output():
    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Exp", ["x"], ["e"])]
    check(model(nodes, [("x", F, [3])], [("y", F, [3]), ("e", F, [3])]), [rand(3)], ["Relu", "Exp"])


# -- BatchNormalization folding ------------------------------------------------------------------

def test_conv_batchnorm_relu_becomes_one_step():
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), bn("c", "n"),
             helper.make_node("Relu", ["n"], ["y"])]
    inits = [init("w", rand(4, 3, 3, 3)), init("b", rand(4))] + bn_inits("bn", 4)
    rep = check(model(nodes, [("x", F, [1, 3, 5, 5])], [("y", F, None)], inits), [rand(1, 3, 5, 5)],
                [(FUSED, "Conv")])
    assert rep.plan.infos[0].name.startswith("") and len(rep.plan.steps) == 1


def test_conv_without_bias_and_batchnorm_opset_9():
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], strides=[2, 2]), bn("c", "y")]
    inits = [init("w", rand(4, 2, 3, 3))] + bn_inits("bn", 4)
    check(model(nodes, [("x", F, [2, 2, 7, 7])], [("y", F, None)], inits, opset=9), [rand(2, 2, 7, 7)], ["Conv"])


def test_batchnorm_opset_6_test_mode_folds_training_mode_does_not():
    inits = [init("w", rand(4, 2, 1, 1))] + bn_inits("bn", 4)
    for is_test, want in ((1, ["Conv"]), (0, ["Conv", "BatchNormalization"])):
        nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), bn("c", "y", is_test=is_test)]
        check(model(nodes, [("x", F, [2, 2, 3, 3])], [("y", F, None)], inits, opset=6, ir_version=3),
              {"x": rand(2, 2, 3, 3)}, want)


def test_conv_transpose_with_groups_and_batchnorm():
    nodes = [helper.make_node("ConvTranspose", ["x", "w", "b"], ["c"], group=2, strides=[2, 2]), bn("c", "y")]
    inits = [init("w", rand(4, 3, 3, 3)), init("b", rand(6))] + bn_inits("bn", 6)
    check(model(nodes, [("x", F, [1, 4, 4, 4])], [("y", F, None)], inits), [rand(1, 4, 4, 4)], ["ConvTranspose"])


@pytest.mark.parametrize("group", [1, 2])
def test_conv_transpose_bias_as_an_add_and_a_scale_fold_then_its_batchnorm(group):
    # PP-OCR det's head: ConvTranspose (no B) -> Add of a (1, M, 1, 1) bias -> BatchNormalization -> Relu;
    # here a Mul by a per-channel scale before the Add too: all fold into the ConvTranspose's W and B
    nodes = [helper.make_node("ConvTranspose", ["x", "w"], ["c"], group=group, strides=[2, 2]),
             helper.make_node("Mul", ["c", "s"], ["cs"]), helper.make_node("Add", ["cs", "d"], ["cb"]),
             bn("cb", "n"), helper.make_node("Relu", ["n"], ["y"])]
    inits = [init("w", rand(4, 6 // group, 2, 2)), init("s", rand(1, 6, 1, 1)), init("d", rand(1, 6, 1, 1))]
    m = model(nodes, [("x", F, [1, 4, 5, 5])], [("y", F, None)], inits + bn_inits("bn", 6))
    check(m, [rand(1, 4, 5, 5)], ["ConvTranspose", "Relu"])


@pytest.mark.parametrize("trans_b", [0, 1])
def test_gemm_batchnorm(trans_b):
    w = rand(5, 6) if trans_b else rand(6, 5)
    nodes = [helper.make_node("Gemm", ["x", "w", "c"], ["g"], transB=trans_b, alpha=0.5, beta=2.0), bn("g", "y")]
    inits = [init("w", w), init("c", rand(5))] + bn_inits("bn", 5)
    check(model(nodes, [("x", F, [3, 6])], [("y", F, None)], inits), [rand(3, 6)], ["Gemm"])


def test_matmul_batchnorm_when_the_product_is_2d():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["g"]), bn("g", "y")]
    inits = [init("w", rand(6, 5))] + bn_inits("bn", 5)
    check(model(nodes, [("x", F, [3, 6])], [("y", F, None)], inits), [rand(3, 6)], [(FUSED, "MatMul")])
    # rank unknown: BN's channel axis may not be MatMul's last, so nothing folds
    check(model(nodes, [("x", F, None)], [("y", F, None)], inits), [rand(3, 6)], ["MatMul", "BatchNormalization"])


def test_batchnorm_on_constant_of_shape_weights_folds():
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["w"],
                              value=numpy_helper.from_array(np.array([0.25], np.float32))),
             helper.make_node("Conv", ["x", "w"], ["c"]), bn("c", "y")]
    inits = [init("shape", np.array([4, 2, 1, 1], np.int64))] + bn_inits("bn", 4)
    check(model(nodes, [("x", F, [1, 2, 3, 3])], [("y", F, None)], inits), [rand(1, 2, 3, 3)], ["Conv"])


def test_batchnorm_folded_weights_are_computed_in_float64_and_rounded_once():
    """W' = W * scale / sqrt(var + eps) per output channel, every product in float64, one rounding to
    float32 (a float32 product of a rounded scale would differ in the last bit for some weights)."""
    from onnx_mini import loader
    from onnx_mini.optimize import optimize_graph
    w = rand(8, 3, 3, 3)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), bn("c", "y")]
    inits = [init("w", w)] + bn_inits("bn", 8, seed=3)
    loaded = loader.load(model(nodes, [("x", F, [1, 3, 5, 5])], [("y", F, None)], inits))
    graph = optimize_graph(loaded.graph, loaded.opsets)
    (conv,) = graph.nodes
    got = graph.initializers[conv.inputs[1]]
    s, b, m, v = (numpy_helper.to_array(t).astype(np.float64) for t in inits[1:])
    a = s / np.sqrt(v + 1e-3)
    want = (w.astype(np.float64) * a[:, None, None, None]).astype(np.float32)
    assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), want.view(np.uint32))
    np.testing.assert_array_equal(graph.initializers[conv.inputs[2]], (b - m * a).astype(np.float32))
    assert not got.flags.writeable


def test_batchnorm_not_folded_when_its_input_is_a_graph_output():
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), bn("c", "y")]
    inits = [init("w", rand(4, 2, 1, 1))] + bn_inits("bn", 4)
    check(model(nodes, [("x", F, [1, 2, 3, 3])], [("y", F, None), ("c", F, None)], inits), [rand(1, 2, 3, 3)],
          ["Conv", "BatchNormalization"])


def test_batchnorm_not_folded_with_non_constant_weights():
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), bn("c", "y")]
    m = model(nodes, [("x", F, [1, 2, 3, 3]), ("w", F, [4, 2, 1, 1])], [("y", F, None)], bn_inits("bn", 4))
    check(m, [rand(1, 2, 3, 3), rand(4, 2, 1, 1)], ["Conv", "BatchNormalization"])


def test_batchnorm_fed_override_of_an_initializer_backed_input_uses_the_graph_as_written():
    """IR 3: the weights are inputs with initializer defaults; a run that feeds them must see them."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), bn("c", "y")]
    w = rand(4, 2, 1, 1)
    inits = [init("w", w)] + bn_inits("bn", 4)
    m = model(nodes, [("x", F, [1, 2, 3, 3]), ("w", F, [4, 2, 1, 1])], [("y", F, None)], inits, opset=9,
              ir_version=3)
    x, w2 = rand(1, 2, 3, 3), rand(4, 2, 1, 1)
    opt, raw = onnx_mini.prepare(m), onnx_mini.prepare(m, optimize=False)
    assert steps(opt) == [("", "Conv")]
    np.testing.assert_allclose(opt.run({"x": x, "w": w2})[0], raw.run({"x": x, "w": w2})[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(opt.run({"x": x})[0], raw.run({"x": x})[0], rtol=1e-5, atol=1e-6)


# -- activation fusion ---------------------------------------------------------------------------------

ACTIVATIONS = [
    ("Relu", [], {}), ("LeakyRelu", [], {"alpha": 0.2}), ("LeakyRelu", [], {"alpha": 3.0}),
    ("Sigmoid", [], {}), ("Tanh", [], {}), ("HardSigmoid", [], {"alpha": 0.3, "beta": 0.4}),
    ("HardSwish", [], {}), ("Clip", ["lo", "hi"], {}), ("Clip", ["", "hi"], {}),
]


@pytest.mark.parametrize("act, extra, attrs", ACTIVATIONS)
@pytest.mark.parametrize("producer", ["Conv", "Gemm", "MatMul"])
def test_product_plus_activation_is_one_step(producer, act, extra, attrs):
    if producer == "Conv":
        prod = helper.make_node("Conv", ["x", "w", "b"], ["p"], pads=[1, 1, 1, 1])
        w, b, shape = rand(4, 3, 3, 3), rand(4), [1, 3, 6, 6]
    else:
        prod = helper.make_node(producer, ["x", "w", "b"] if producer == "Gemm" else ["x", "w"], ["p"])
        w, b, shape = rand(5, 4), rand(4), [3, 5]
    nodes = [prod, helper.make_node(act, ["p", *extra], ["y"], **attrs)]
    inits = [init("w", 3 * w), init("b", b), init("lo", np.float32(-0.5)), init("hi", np.float32(0.7))]
    check(model(nodes, [("x", F, shape)], [("y", F, None)], inits), [rand(*shape)], [(FUSED, producer)])


@pytest.mark.parametrize("act, attrs", [("HardSigmoid", {"alpha": 0.3, "beta": 0.4}), ("HardSwish", {})])
@pytest.mark.parametrize("one_pass", [True, False])
def test_fused_hard_activations_clip_in_one_pass_or_two(monkeypatch, act, attrs, one_pass):
    """The fused HardSigmoid / HardSwish clip alpha * x + beta to [0, 1] with one np.clip pass from
    fused.CLIP_ONE_PASS_MIN values on, with a minimum and a maximum below: either way the unfused nodes'
    bits, on a Conv output of 6 x 48 x 48 values (large) holding values on both sides of the bounds, NaN
    and infinities."""
    from onnx_mini.ops import fused
    monkeypatch.setattr(fused, "CLIP_ONE_PASS_MIN", 0 if one_pass else 1 << 40)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["p"], pads=[1, 1, 1, 1]),
             helper.make_node(act, ["p"], ["y"], **attrs)]
    m = model(nodes, [("x", F, [1, 3, 48, 48])], [("y", F, None)], [init("w", 3 * rand(6, 3, 3, 3)), init("b", rand(6))])
    x = 4 * rand(1, 3, 48, 48)
    x[0, 0, 5, 5:8] = [np.nan, np.inf, -np.inf]
    opt, raw = onnx_mini.prepare(m), onnx_mini.prepare(m, optimize=False)
    assert steps(opt) == [(FUSED, "Conv")]
    with np.errstate(invalid="ignore"):
        got, want = opt.run([x])[0], raw.run([x])[0]
    assert np.isnan(got).any() and (got == 0).any() and (got > 1).any() == (act == "HardSwish")
    np.testing.assert_array_equal(got, want)


def test_matmul_add_relu_is_one_step_and_matmul_add_alone_too():
    inits = [init("w", rand(2, 5, 4)), init("b", rand(4))]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Add", ["b", "p"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"])]
    check(model(nodes, [("x", F, None)], [("y", F, None)], inits), [rand(2, 3, 5)], [(FUSED, "MatMul")])
    check(model(nodes[:2], [("x", F, None)], [("s", F, None)], inits), [rand(3, 5)], [(FUSED, "MatMul")])
    # a bias that broadcasts the product to a larger shape still gives the Add's result
    big = [init("w", rand(5, 4)), init("b", rand(2, 1, 4))]
    check(model(nodes, [("x", F, None)], [("y", F, None)], big), [rand(3, 5)], [(FUSED, "MatMul")])


@pytest.mark.parametrize("act", ["Relu", "Tanh", "Sigmoid"])
@pytest.mark.parametrize("bias", ["constant", "constant_row", "fed", "fed_row"])
def test_matmul_add_activation_on_a_row(act, bias):
    """[1, 64] x [64, 32] + bias, then the activation, as a decoder step runs it: the fused step gives the
    three nodes' values (Relu and Tanh bit for bit; the fused Sigmoid is 1 / (1 + exp(-y)), within
    rounding of the Sigmoid kernel's form); the fed inputs are left untouched."""
    b = rand(1, 32) if bias.endswith("row") else rand(32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Add", ["p", "b"], ["s"]),
             helper.make_node(act, ["s"], ["y"])]
    fed = bias.startswith("fed")
    ins = [("x", F, [1, 64])] + ([("b", F, list(b.shape))] if fed else [])
    m = model(nodes, ins, [("y", F, None)], [init("w", rand(64, 32))] + ([] if fed else [init("b", b)]))
    feeds = [rand(1, 64) * 4] + ([b] if fed else [])
    kept = [f.copy() for f in feeds]
    opt = check(m, feeds, [(FUSED, "MatMul")], rtol=1e-6, atol=1e-7)
    got, want = opt.run(feeds)[0], onnx_mini.prepare(m, optimize=False).run(feeds)[0]
    if act != "Sigmoid":
        np.testing.assert_array_equal(got, want)
    for f, k in zip(feeds, kept):
        np.testing.assert_array_equal(f, k)


def test_fused_step_writes_only_its_own_buffers():
    """The fused kernels' ownership test: a fresh product is written in place, a read-only array, an input
    itself or a view of one is not (the result is a copy)."""
    from onnx_mini.ops import fused
    x = rand(3, 4)
    fresh = x @ rand(4, 4)
    assert fused._own(fresh, (x,))
    assert fused._own(fresh[1:], (x,))                 # a view of a fresh buffer no input shares
    assert not fused._own(x, (x,))                     # the input itself
    assert not fused._own(x[1:], (x,))                 # a view of an input
    ro = fresh.copy()
    ro.flags.writeable = False
    assert not fused._own(ro, ())
    finish = fused._finisher("Relu", ())
    y = finish(x, (x,))
    assert y is not x and np.array_equal(y, np.maximum(x, 0)) and (x < 0).any()
    z = fused._add_into(x, np.ones(4, np.float32), (x,))        # an input: the sum is a new array
    assert z is not x and np.array_equal(z, x + 1)
    assert fused._fits((4,), (3, 4)) and fused._fits((1, 4), (3, 4)) and fused._fits((), (3, 4))
    assert fused._fits((3, 1), (3, 4)) and not fused._fits((2, 4), (3, 4)) and not fused._fits((1, 3, 4), (3, 4))


# -- the fused kernels' short paths for small products (a Scan RNN step, a decoder step) -----------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("act", ["", "Tanh", "Relu"])
def test_fused_matmul_small_float_products_are_matmul_then_add(dtype, act, monkeypatch):
    """2-D float operands and a bias of their type: numpy's product, the bias added in place, the activation:
    the same values bit for bit as the three steps, below and above blas's split size, inputs untouched."""
    from onnx_mini import blas
    from onnx_mini.ops import fused
    x, w = rand(1, 64, dtype=dtype), rand(64, 128, dtype=dtype)
    fed, const = rand(1, 128, dtype=dtype), rand(128, dtype=dtype)
    apply = {"": lambda y: y, "Tanh": np.tanh, "Relu": lambda y: np.maximum(y, 0)}[act]
    kept = [a.copy() for a in (x, w, fed, const)]
    for split in (blas.MIN_PART_MACS, 64):         # 64: the product takes blas.matmul's path
        monkeypatch.setattr(blas, "MIN_PART_MACS", split)
        run = fused.fused_matmul(activation=act, _constants={2: const})
        for bias in (fed, const, rand(3, 1, 128, dtype=dtype)):    # the last one broadcasts the sum larger
            got = run(x, w, bias)
            want = apply(np.matmul(x, w) + bias)
            assert got.dtype == dtype and got.shape == want.shape and np.array_equal(got, want)
            assert not np.shares_memory(got, bias)
    for a, k in zip((x, w, fed, const), kept):
        assert np.array_equal(a, k)


def test_fused_matmul_small_product_errors_name_what_is_wrong():
    from onnx_mini.errors import InvalidValueError
    from onnx_mini.ops import fused
    run = fused.fused_matmul(activation="Tanh", _constants={})
    with pytest.raises(InvalidValueError, match=r"shapes \[1, 63\] and \[64, 8\] cannot be multiplied"):
        run(rand(1, 63), rand(64, 8), rand(1, 8))
    with pytest.raises(InvalidValueError, match=r"the added input \(float64\) must have the product's type \(float32\)"):
        run(rand(1, 64), rand(64, 8), rand(1, 8, dtype=np.float64))
    with pytest.raises(ValueError, match="broadcast"):          # numpy's word, as the unfused Add's
        run(rand(1, 64), rand(64, 8), rand(1, 5))


@pytest.mark.parametrize("trans_b", [0, 1])
def test_fused_gemm_constant_c_added_as_a_row(trans_b):
    """A constant 1-D C is added as [1, N]: the same sums as Gemm then the activation; a C that does not fit
    is reported with its shape as given."""
    from onnx_mini.errors import InvalidValueError
    from onnx_mini.ops import fused
    from onnx_mini.ops.math.matmul import gemm_11
    a, c = rand(2, 16), rand(8)
    b = rand(8, 16) if trans_b else rand(16, 8)
    run = fused.fused_gemm(alpha=0.5, beta=2.0, transB=trans_b, activation="Tanh", _constants={2: c})
    want = np.tanh(gemm_11(alpha=0.5, beta=2.0, transB=trans_b)(a, b, c))
    assert np.array_equal(run(a, b, c), want)
    assert np.array_equal(run(a, b, c.copy()), want)          # C fed at run time: Gemm as written
    plain = fused.fused_gemm(_constants={2: c})
    assert np.array_equal(plain(a, b if not trans_b else b.T, c), gemm_11()(a, b if not trans_b else b.T, c))
    wrong = rand(3)
    with pytest.raises(InvalidValueError, match=r"C of shape \[3\] is not unidirectionally broadcastable"):
        fused.fused_gemm(activation="Relu", _constants={2: wrong})(rand(2, 16), rand(16, 8), wrong)


def attention_ref(q, k, v, mask, c):
    """softmax(q k * c + mask) v in float64, each row shifted by its maximum (a row of -inf gives NaN)."""
    s = np.matmul(q.astype(np.float64), k.astype(np.float64)) * c
    if mask is not None:
        s = s + mask
    with np.errstate(invalid="ignore"):
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        return np.matmul(e / e.sum(axis=-1, keepdims=True), v.astype(np.float64))


@pytest.mark.parametrize("case", ["plain", "overflow", "far_below", "masked", "vector_v", "float64"])
def test_fused_attention_of_one_query_row(case, monkeypatch):
    """A decoder step's attention, [1, d] x [d, n] scores: its one row sum is checked as a Python float (an
    overflow or a row far below exp's range takes the shifted path, a masked row gives NaN), the division
    by it comes after the product with V."""
    from onnx_mini.ops import fused
    dt = np.float64 if case == "float64" else np.float32
    r = np.random.default_rng(11)
    q, k, v = (r.standard_normal(shape).astype(dt) for shape in ((1, 16), (16, 10), (10, 16)))
    mask = None
    if case == "overflow":
        q *= 500
    elif case == "far_below":
        mask = np.full((1, 10), -200, dt)
    elif case == "masked":
        mask = np.full((1, 10), -np.inf, dt)
    elif case == "vector_v":
        v = v[:, 0].copy()
    with warnings.catch_warnings():
        warnings.simplefilter("error" if case != "masked" else "ignore")
        got = fused.fused_attention(scale=0.25)(q, k, v, mask)
    want = attention_ref(q, k, v, mask, 0.25)
    assert got.dtype == dt and got.shape == want.shape
    if case == "masked":
        assert np.isnan(got).all()
    else:
        tol = 1e-12 if dt == np.float64 else 1e-5        # float32: scores, exp and sums each rounded
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    from onnx_mini import blas
    monkeypatch.setattr(blas, "MIN_PART_MACS", 1)      # every product through blas.matmul: the same values
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        again = fused.fused_attention(scale=0.25)(q, k, v, mask)
    assert np.array_equal(again, got, equal_nan=True)
    for total, safe in ((1.0, True), (2.0 ** -61, False), (np.inf, False), (np.nan, False), (3e38, True)):
        assert fused._softmax_sums_safe(np.array([[total]], np.float32)) is safe
    assert fused._softmax_sums_safe(np.array([[1.0], [2.0 ** -61]], np.float32)) is False


@pytest.mark.parametrize("act", ["Sigmoid", "Swish"])
def test_fused_sigmoid_overflow_gives_zero_without_a_warning_and_leaves_numpy_settings(act):
    from onnx_mini.ops import fused
    y = np.array([[-100.0, -1.0, 0.0, 3.0, 100.0]], np.float32)
    before = np.geterr()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = fused.fused_matmul(activation=act, _constants={})(y, np.eye(5, dtype=np.float32), np.zeros((1, 5), np.float32))
    with np.errstate(over="ignore"):
        sig = 1 / (1 + np.exp(-y.astype(np.float64)))
    np.testing.assert_allclose(got, sig if act == "Sigmoid" else y * sig, rtol=1e-6, atol=1e-37)
    assert got[0, 0] == 0 and np.geterr() == before       # exp(100) overflows float32: 1 / inf


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_attention_block_in_other_float_types(dtype):
    """float64 runs the in-place path, float16 the Softmax kernel's path (computed in float32)."""
    et = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    nodes = [helper.make_node("MatMul", ["q", "k"], ["s0"]), helper.make_node("Mul", ["s0", "c"], ["s1"]),
             helper.make_node("Softmax", ["s1"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["y"])]
    inits = [init("c", np.array(0.25, dtype))]
    feeds = [rand(2, 5, 8, dtype=dtype), rand(2, 8, 7, dtype=dtype), rand(2, 7, 4, dtype=dtype)]
    tol = 1e-3 if dtype == np.float16 else 1e-12
    check(model(nodes, [("q", et, None), ("k", et, None), ("v", et, None)], [("y", et, None)], inits, opset=13), feeds,
          [(FUSED, "Attention")], rtol=tol, atol=tol)


def test_float16_and_float64_conv_relu():
    for dt, et in ((np.float16, TensorProto.FLOAT16), (np.float64, TensorProto.DOUBLE)):
        nodes = [helper.make_node("Conv", ["x", "w"], ["p"]), helper.make_node("Sigmoid", ["p"], ["y"])]
        check(model(nodes, [("x", et, [1, 2, 4, 4])], [("y", et, None)], [init("w", rand(3, 2, 3, 3, dtype=dt))]),
              [rand(1, 2, 4, 4, dtype=dt)], [(FUSED, "Conv")], rtol=1e-3, atol=1e-3)


def test_activation_not_fused_when_its_input_has_two_consumers():
    nodes = [helper.make_node("Conv", ["x", "w"], ["p"]), helper.make_node("Relu", ["p"], ["y"]),
             helper.make_node("Exp", ["p"], ["z"])]
    check(model(nodes, [("x", F, [1, 2, 4, 4])], [("y", F, None), ("z", F, None)], [init("w", rand(3, 2, 3, 3))]),
          [rand(1, 2, 4, 4)], ["Conv", "Relu", "Exp"])


def test_activation_not_fused_when_its_input_is_a_graph_output_or_captured_by_a_subgraph():
    nodes = [helper.make_node("Conv", ["x", "w"], ["p"]), helper.make_node("Relu", ["p"], ["y"])]
    inits = [init("w", rand(3, 2, 3, 3))]
    check(model(nodes, [("x", F, [1, 2, 4, 4])], [("y", F, None), ("p", F, None)], inits), [rand(1, 2, 4, 4)],
          ["Conv", "Relu"])
    branch = helper.make_graph([helper.make_node("Neg", ["p"], ["q"])], "b", [],
                               [helper.make_tensor_value_info("q", F, None)])
    cond = init("cond", np.array(True))
    nodes2 = nodes + [helper.make_node("If", ["cond"], ["z"], then_branch=branch, else_branch=branch)]
    check(model(nodes2, [("x", F, [1, 2, 4, 4])], [("y", F, None), ("z", F, None)], inits + [cond]),
          [rand(1, 2, 4, 4)], ["Conv", "Relu", "If"])


def test_clip_with_non_constant_bounds_and_old_opsets_do_not_fuse():
    nodes = [helper.make_node("Conv", ["x", "w"], ["p"]), helper.make_node("Clip", ["p", "lo"], ["y"])]
    m = model(nodes, [("x", F, [1, 2, 4, 4]), ("lo", F, [])], [("y", F, None)], [init("w", rand(3, 2, 3, 3))])
    check(m, [rand(1, 2, 4, 4), np.float32(0.1)], ["Conv", "Clip"])
    # Gemm-6 (legacy broadcast) and Add-6 (legacy broadcast) are left alone
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["p"], broadcast=1), helper.make_node("Relu", ["p"], ["y"])]
    m = model(nodes, [("x", F, [3, 5])], [("y", F, None)], [init("w", rand(5, 4)), init("b", rand(4))], opset=6)
    check(m, [rand(3, 5)], ["Gemm", "Relu"])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Add", ["p", "b"], ["y"], broadcast=1)]
    m = model(nodes, [("x", F, [3, 5])], [("y", F, None)], [init("w", rand(5, 4)), init("b", rand(4))], opset=6)
    check(m, [rand(3, 5)], ["MatMul", "Add"])


# -- patterns -----------------------------------------------------------------------------------

def const(name, v):
    return init(name, np.array(v, np.float32))


def test_silu_alone_and_after_a_conv():
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["s", "x"], ["y"])]
    check(model(nodes, [("x", F, None)], [("y", F, None)]), [rand(2, 7) * 10], [(FUSED, "Swish")])
    nodes = [helper.make_node("Conv", ["i", "w"], ["x"])] + nodes
    check(model(nodes, [("i", F, [1, 2, 4, 4])], [("y", F, None)], [init("w", rand(3, 2, 1, 1))]),
          [rand(1, 2, 4, 4)], [(FUSED, "Conv")])


def _clip_swish_nodes(x="x", y="y", three="three", lo="zero", hi="six", last=("Div", "six"), clip_opset=11,
                      swap=False):
    """x * Clip(x + 3, 0, 6) / 6 as PaddlePaddle writes HardSwish (Add, Clip, Mul, Div)."""
    clip = (helper.make_node("Clip", ["a", lo, hi], ["c"]) if clip_opset >= 11
            else helper.make_node("Clip", ["a"], ["c"], min=0.0, max=6.0))
    return [helper.make_node("Add", [three, x] if swap else [x, three], ["a"]), clip,
            helper.make_node("Mul", ["c", x] if swap else [x, "c"], ["m"]),
            helper.make_node(last[0], ["m", last[1]], [y])]


def _clip_swish_inits(dtype=np.float32, sixth=np.float32(1 / 6)):
    return [init("three", np.array(3, dtype)), init("zero", np.array(0, dtype)), init("six", np.array(6, dtype)),
            init("sixth", np.array(sixth, dtype))]


def _bit_for_bit(m, feeds, expected_steps):
    """check() with the results equal to the unoptimised plan's, element for element."""
    opt = check(m, feeds, expected_steps, rtol=0, atol=0)
    for g, r in zip(opt.run(feeds), onnx_mini.prepare(m, optimize=False).run(feeds)):
        np.testing.assert_array_equal(g, r)
    return opt


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("form", ["div", "mul", "swapped", "clip-6"])
def test_written_hard_swish_is_one_step_bit_for_bit(dtype, form):
    """x * Clip(x + 3, 0, 6) / 6 (or * 1/6; operands either way round; Clip with attributes before opset 11)
    becomes one ClipSwish step doing those four operations, alone or in a Conv's epilogue: the same values,
    element for element, on inputs across the clip's corners (x < -3, -3..3, > 3, and exactly -3 and 3)."""
    ft = F if dtype == np.float32 else TensorProto.DOUBLE
    nodes = _clip_swish_nodes(last=("Mul", "sixth") if form == "mul" else ("Div", "six"), swap=form == "swapped",
                              clip_opset=6 if form == "clip-6" else 11)
    opset = 10 if form == "clip-6" else 21
    x = (np.random.default_rng(5).uniform(-6, 6, (2, 3, 5, 7)).astype(dtype))
    x.flat[:4] = [-3, 3, 0, -0.0]
    alone = model(nodes, [("x", ft, None)], [("y", ft, None)], _clip_swish_inits(dtype), opset=opset)
    _bit_for_bit(alone, [x], [(FUSED, "ClipSwish")])
    conv = [helper.make_node("Conv", ["i", "w"], ["x"])] + nodes
    after_conv = model(conv, [("i", ft, [2, 2, 5, 7])], [("y", ft, None)],
                       [init("w", rand(3, 2, 1, 1, dtype=dtype))] + _clip_swish_inits(dtype), opset=opset)
    opt = _bit_for_bit(after_conv, [rand(2, 2, 5, 7, dtype=dtype) * 4], [(FUSED, "Conv")])
    assert [n.split("@")[0] for n in opt.plan.infos[0].fused_from] == ["Conv", "Add", "Clip", "Mul",
                                                                       "Mul" if form == "mul" else "Div"]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("steps_after, shapes", [
    (("Mul", "Add"), ((1,), ())),                    # PP-LCNetV3's learnable affine: scale then bias
    (("Mul",), ((1, 1, 1, 1),)),                    # a scale alone (rank 4: the output keeps its shape)
    (("Add",), ((),)),                              # a shift alone
    (("Mul", "Add", "swapped"), ((), (1,))),        # constants first
])
def test_affine_after_an_activation_joins_the_conv_bit_for_bit(dtype, steps_after, shapes):
    """Conv -> HardSwish -> Mul by a one-element constant -> Add of one: one fused Conv step whose
    activation then applies the Mul and the Add in place, the same float operations in the same order
    (element for element the graph as written; inside a channels-last region: test_channels_last)."""
    ft = F if dtype == np.float32 else TensorProto.DOUBLE
    swapped = "swapped" in steps_after
    ops = [o for o in steps_after if o != "swapped"]
    vals = {"Mul": dtype(0.7311), "Add": dtype(-0.2917)}
    nodes, inits, x = [helper.make_node("Conv", ["i", "w", "b"], ["c"]), helper.make_node("HardSwish", ["c"], ["a0"])], [], "a0"
    for k, (op, shape) in enumerate(zip(ops, shapes)):
        inits.append(init(f"k{k}", np.full(shape, vals[op], dtype)))
        nodes.append(helper.make_node(op, [f"k{k}", x] if swapped else [x, f"k{k}"], [f"a{k + 1}"]))
        x = f"a{k + 1}"
    nodes[-1].output[0] = "y"
    m = model(nodes, [("i", ft, [2, 3, 5, 7])], [("y", ft, None)],
              [init("w", rand(4, 3, 1, 1, dtype=dtype)), init("b", rand(4, dtype=dtype))] + inits)
    opt = _bit_for_bit(m, [rand(2, 3, 5, 7, dtype=dtype) * 4], [(FUSED, "Conv")])
    assert [n.split("@")[0] for n in opt.plan.infos[0].fused_from] == ["Conv", "HardSwish", *ops]


def test_affine_left_alone_when_read_elsewhere_or_of_another_shape():
    # the activation's output also read by another node; a Mul by a per-channel constant (not one element)
    base = [helper.make_node("Conv", ["i", "w"], ["c"]), helper.make_node("Relu", ["c"], ["r"])]
    inits = [init("w", rand(4, 3, 1, 1)), init("s", np.full((1,), 0.5, np.float32)),
             init("v", rand(1, 4, 1, 1))]
    shared = model(base + [helper.make_node("Mul", ["r", "s"], ["y"])], [("i", F, [1, 3, 4, 4])],
                   [("y", F, None), ("r", F, None)], inits)
    check(shared, [rand(1, 3, 4, 4)], [(FUSED, "Conv"), "Mul"])
    channel = model(base + [helper.make_node("Mul", ["r", "v"], ["y"])], [("i", F, [1, 3, 4, 4])],
                    [("y", F, None)], inits)
    check(channel, [rand(1, 3, 4, 4)], [(FUSED, "Conv"), "Mul"])


def test_written_hard_swish_after_constant_node_operands():
    """PaddlePaddle's exporter writes its constants as Constant nodes of shape (1,): a learnable scale
    (Mul) after the Conv, and the Add's 3. Their rank is known without running them (the optimiser's
    Context.static_shape reads a Constant node's value), so x's rank is, and the HardSwish pattern fires:
    one Conv step (the scale folded into W, the ClipSwish in its epilogue)."""
    def constant(name, v):
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(v, np.float32)))
    nodes = [constant("s", [0.5]), constant("three1", [3.0]), helper.make_node("Conv", ["i", "w"], ["cv"]),
             helper.make_node("Mul", ["s", "cv"], ["x"]), *_clip_swish_nodes(three="three1")]
    m = model(nodes, [("i", F, [2, 2, 5, 7])], [("y", F, None)], [init("w", rand(3, 2, 1, 1))] + _clip_swish_inits())
    opt = check(m, [rand(2, 2, 5, 7) * 4], [(FUSED, "Conv")])
    assert [n.split("@")[0] for n in opt.plan.infos[0].fused_from][-4:] == ["Add", "Clip", "Mul", "Div"]


@pytest.mark.parametrize("case", ["three-off", "six-off", "divisor-5", "other-x", "intermediate-read",
                                  "types-differ"])
def test_written_hard_swish_left_alone(case):
    """Constants not exactly 3, 0 .. 6 and 6 (a Mul by any constant is fine), a product with another
    value, an intermediate read elsewhere or constants of different types: the nodes stay as written."""
    nodes = _clip_swish_nodes(three="three" if case != "three-off" else "three_off",
                              hi="six" if case != "six-off" else "six_off",
                              last=("Div", "five") if case == "divisor-5" else ("Div", "six"))
    inits = _clip_swish_inits() + [init("three_off", np.float32(3.0001)), init("six_off", np.float32(6.5)),
                                   init("five", np.float32(5))]
    outputs = [("y", F, None)]
    if case == "other-x":
        nodes[2] = helper.make_node("Mul", ["x2", "c"], ["m"])
    if case == "intermediate-read":
        outputs.append(("c", F, None))
    if case == "types-differ":
        inits[0] = init("three", np.float64(3))
        nodes[0] = helper.make_node("Add", ["x64", "three"], ["a64"])
        nodes.insert(1, helper.make_node("Cast", ["a64"], ["a"], to=F))
    m = model(nodes, [("x", F, None), ("x2", F, None), ("x64", TensorProto.DOUBLE, None)], outputs, inits)
    opt = onnx_mini.prepare(m)
    assert (FUSED, "ClipSwish") not in steps(opt)


@pytest.mark.parametrize("grouping", ["x_then_half", "half_then_x", "half_x_first"])
@pytest.mark.parametrize("scale", ["div", "mul"])
def test_gelu_erf_forms(grouping, scale):
    pre = (helper.make_node("Div", ["x", "sqrt2"], ["t"]) if scale == "div"
           else helper.make_node("Mul", ["inv_sqrt2", "x"], ["t"]))
    nodes = [pre, helper.make_node("Erf", ["t"], ["e"]), helper.make_node("Add", ["e", "one"], ["a"])]
    if grouping == "x_then_half":
        nodes += [helper.make_node("Mul", ["x", "a"], ["m"]), helper.make_node("Mul", ["m", "half"], ["y"])]
    elif grouping == "half_then_x":
        nodes += [helper.make_node("Mul", ["a", "half"], ["m"]), helper.make_node("Mul", ["m", "x"], ["y"])]
    else:
        nodes += [helper.make_node("Mul", ["x", "half"], ["h"]), helper.make_node("Mul", ["h", "a"], ["y"])]
    inits = [const("sqrt2", math.sqrt(2)), const("inv_sqrt2", 1 / math.sqrt(2)), const("one", 1.0),
             const("half", 0.5)]
    x = rand(3, 8) * 3
    check(model(nodes, [("x", F, None)], [("y", F, None)], inits, opset=13), [x], [(FUSED, "Gelu")])
    # hand-written formula
    y = onnx_mini.prepare(model(nodes, [("x", F, None)], [("y", F, None)], inits, opset=13)).run([x])[0]
    erf = np.vectorize(math.erf)
    np.testing.assert_allclose(y, 0.5 * x * (1 + erf(x.astype(np.float64) / math.sqrt(2))), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cube", ["pow", "mul"])
def test_gelu_tanh_form(cube):
    if cube == "pow":
        c = [helper.make_node("Pow", ["x", "three"], ["c"])]
    else:
        c = [helper.make_node("Mul", ["x", "x"], ["xx"]), helper.make_node("Mul", ["xx", "x"], ["c"])]
    nodes = c + [helper.make_node("Mul", ["c", "k1"], ["q"]), helper.make_node("Add", ["x", "q"], ["i"]),
                 helper.make_node("Mul", ["i", "k2"], ["u"]), helper.make_node("Tanh", ["u"], ["t"]),
                 helper.make_node("Add", ["t", "one"], ["a"]), helper.make_node("Mul", ["x", "a"], ["m"]),
                 helper.make_node("Mul", ["m", "half"], ["y"])]
    inits = [const("three", 3.0), const("k1", 0.044715), const("k2", math.sqrt(2 / math.pi)), const("one", 1.0),
             const("half", 0.5)]
    check(model(nodes, [("x", F, None)], [("y", F, None)], inits, opset=13), [rand(4, 5) * 3], [(FUSED, "Gelu")])


def _gelu_tanh_tail(x, inner, one="one"):
    """sqrt(2/pi) * inner, Tanh, + one, * 0.5, * x, as jax2tf writes them (constants first)."""
    return [helper.make_node("Mul", ["k2", inner], ["u"]), helper.make_node("Tanh", ["u"], ["t"]),
            helper.make_node("Add", [one, "t"], ["a"]), helper.make_node("Mul", ["half", "a"], ["h"]),
            helper.make_node("Mul", [x, "h"], ["y"])]


GELU_INITS = [const("k1", 0.044715), const("k2", math.sqrt(2 / math.pi)), const("one", 1.0), const("half", 0.5)]


@pytest.mark.parametrize("grouping", ["jax2tf", "constant_second", "constant_last"])
def test_gelu_tanh_cube_in_any_grouping(grouping):
    """0.044715 * x^3 as three products of x, x, x and the constant in any order (jax2tf, as in Google's
    Magika model: x * (x * (0.044715 * x))): one Gelu, the values of the nodes as written."""
    products = {"jax2tf": [("k1", "x", "p1"), ("x", "p1", "p2"), ("x", "p2", "q")],
                "constant_second": [("x", "x", "p1"), ("p1", "k1", "p2"), ("p2", "x", "q")],
                "constant_last": [("x", "x", "p1"), ("x", "p1", "p2"), ("p2", "k1", "q")]}[grouping]
    nodes = [helper.make_node("Mul", [a, b], [o]) for a, b, o in products]
    nodes += [helper.make_node("Add", ["x", "q"], ["i"]), *_gelu_tanh_tail("x", "i")]
    m = model(nodes, [("x", F, None)], [("y", F, None)], GELU_INITS, opset=13)
    x = rand(4, 5) * 3
    opt = check(m, [x], [(FUSED, "Gelu")])
    u = math.sqrt(2 / math.pi) * (x.astype(np.float64) + 0.044715 * x.astype(np.float64) ** 3)
    np.testing.assert_allclose(opt.run([x])[0], 0.5 * x * (1 + np.tanh(u)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", ["square", "fourth_power", "other_value", "product_read_elsewhere"])
def test_gelu_tanh_other_products_left_alone(case):
    """x^2 * c, x^4 * c, a product with another value, or a partial product read by another node: no
    Gelu (the nodes stay as written)."""
    products = [("k1", "x", "p1"), ("x", "p1", "p2"), ("x", "p2", "q")]
    outputs = [("y", F, None)]
    if case == "square":
        products = [("k1", "x", "p1"), ("x", "p1", "q")]
    elif case == "fourth_power":
        products = [("k1", "x", "p1"), ("x", "p1", "p2"), ("x", "p2", "p3"), ("x", "p3", "q")]
    elif case == "other_value":
        products[1] = ("x2", "p1", "p2")
    else:
        outputs.append(("p2", F, None))
    nodes = [helper.make_node("Mul", [a, b], [o]) for a, b, o in products]
    nodes += [helper.make_node("Add", ["x", "q"], ["i"]), *_gelu_tanh_tail("x", "i")]
    m = model(nodes, [("x", F, None), ("x2", F, None)], outputs, GELU_INITS, opset=13)
    opt = onnx_mini.prepare(m)
    assert (FUSED, "Gelu") not in steps(opt)
    x, x2 = rand(4, 5), rand(4, 5)
    for g, r in zip(opt.run([x, x2]), onnx_mini.prepare(m, optimize=False).run([x, x2])):
        np.testing.assert_array_equal(g, r)


@pytest.mark.parametrize("through", ["Slice", "Squeeze", "Unsqueeze", "Transpose", "Squeeze-no-axes"])
def test_gelu_tanh_with_a_constant_of_the_input_rank(through):
    """A [1, 1, 1] constant may only join a Gelu when x's rank is known to be 3: the ranks of Slice and
    Transpose (their input's), Squeeze and Unsqueeze (less / plus their constant axes) are carried from
    a declared rank-4 (or 2) input; Squeeze without axes says nothing of the rank, so the nodes stay."""
    one3 = init("one3", np.ones((1, 1, 1), np.float32))
    shape = [2, 3, 4, 1] if through != "Unsqueeze" else [2, 3]
    pre = {"Slice": [helper.make_node("Slice", ["v", "s0", "s1", "ax"], ["x4"]),
                     helper.make_node("Squeeze", ["x4", "ax"], ["x"])],
           "Squeeze": [helper.make_node("Squeeze", ["v", "ax"], ["x"])],
           "Unsqueeze": [helper.make_node("Unsqueeze", ["v", "ax0"], ["x"])],
           "Transpose": [helper.make_node("Transpose", ["v"], ["x4"], perm=[0, 2, 1, 3]),
                         helper.make_node("Squeeze", ["x4", "ax"], ["x"])],
           "Squeeze-no-axes": [helper.make_node("Squeeze", ["v"], ["x"])]}[through]
    products = [("k1", "x", "p1"), ("x", "p1", "p2"), ("x", "p2", "q")]
    nodes = pre + [helper.make_node("Mul", [a, b], [o]) for a, b, o in products]
    nodes += [helper.make_node("Add", ["x", "q"], ["i"]), *_gelu_tanh_tail("x", "i", one="one3")]
    inits = GELU_INITS + [one3, init("s0", np.array([0], np.int64)), init("s1", np.array([1], np.int64)),
                          init("ax", np.array([3], np.int64)), init("ax0", np.array([0], np.int64))]
    m = model(nodes, [("v", F, shape)], [("y", F, None)], inits, opset=13)
    v = rand(*shape) * 3
    opt = onnx_mini.prepare(m)
    assert ((FUSED, "Gelu") in steps(opt)) == (through != "Squeeze-no-axes")
    got, want = opt.run([v])[0], onnx_mini.prepare(m, optimize=False).run([v])[0]
    assert got.shape == want.shape == {"Unsqueeze": (1, 2, 3), "Transpose": (2, 4, 3)}.get(through, (2, 3, 4))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_gelu_with_wrong_constant_is_not_fused():
    nodes = [helper.make_node("Div", ["x", "c"], ["t"]), helper.make_node("Erf", ["t"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["a"]), helper.make_node("Mul", ["x", "a"], ["m"]),
             helper.make_node("Mul", ["m", "half"], ["y"])]
    inits = [const("c", 1.5), const("one", 1.0), const("half", 0.5)]
    check(model(nodes, [("x", F, None)], [("y", F, None)], inits, opset=13), [rand(3)],
          ["Div", "Erf", "Add", "Mul", "Mul"])


def layer_norm_nodes(opset, square="pow"):
    if opset >= 18:
        rm = [helper.make_node("ReduceMean", ["x", "axes"], ["mu"]),
              helper.make_node("ReduceMean", ["sq", "axes"], ["var"])]
    else:
        rm = [helper.make_node("ReduceMean", ["x"], ["mu"], axes=[-1]),
              helper.make_node("ReduceMean", ["sq"], ["var"], axes=[-1])]
    sq = (helper.make_node("Pow", ["d", "two"], ["sq"]) if square == "pow"
          else helper.make_node("Mul", ["d", "d"], ["sq"]))
    return [rm[0], helper.make_node("Sub", ["x", "mu"], ["d"]), sq, rm[1],
            helper.make_node("Add", ["var", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["std"]),
            helper.make_node("Div", ["d", "std"], ["n"]), helper.make_node("Mul", ["n", "gamma"], ["g"]),
            helper.make_node("Add", ["g", "beta"], ["y"])]


LN_INITS = [const("two", 2.0), const("eps", 1e-5), init("gamma", rand(6)), init("beta", rand(6)),
            init("axes", np.array([-1], np.int64))]


@pytest.mark.parametrize("opset, square", [(13, "pow"), (18, "pow"), (17, "mul")])
def test_layer_norm_pattern(opset, square):
    m = model(layer_norm_nodes(opset, square), [("x", F, None)], [("y", F, None)], LN_INITS, opset=opset)
    check(m, [rand(2, 3, 6) * 4 + 1], [(FUSED, "LayerNormalization")])
    m = model(layer_norm_nodes(opset, square), [("x", TensorProto.DOUBLE, None)], [("y", TensorProto.DOUBLE, None)],
              [numpy_helper.from_array(numpy_helper.to_array(i).astype(np.float64), i.name) if i.data_type == 1
               else i for i in LN_INITS], opset=opset)
    check(m, [rand(2, 6, dtype=np.float64)], [(FUSED, "LayerNormalization")], rtol=1e-12, atol=1e-12)


def test_layer_norm_pattern_not_fused_when_an_intermediate_is_an_output():
    m = model(layer_norm_nodes(13), [("x", F, None)], [("y", F, None), ("std", F, None)], LN_INITS, opset=13)
    check(m, [rand(2, 6)], ["ReduceMean", "Sub", "Pow", "ReduceMean", "Add", "Sqrt", "Div", "Mul", "Add"])


@pytest.mark.parametrize("mask, scale_op", [(True, "Div"), (False, "Mul"), (True, None)])
def test_attention_block(mask, scale_op):
    d = 8
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s0"])]
    cur = "s0"
    if scale_op:
        nodes.append(helper.make_node(scale_op, [cur, "c"], ["s1"]))
        cur = "s1"
    if mask:
        nodes.append(helper.make_node("Add", ["m", cur], ["s2"]))
        cur = "s2"
    nodes += [helper.make_node("Softmax", [cur], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["y"])]
    c = math.sqrt(d) if scale_op == "Div" else 1 / math.sqrt(d)
    inits = [const("c", c)]
    ins = [("q", F, None), ("k", F, None), ("v", F, None)] + ([("m", F, None)] if mask else [])
    feeds = [rand(2, 3, 5, d), rand(2, 3, 7, d), rand(2, 3, 7, 4)]
    if mask:
        m = np.zeros((1, 1, 5, 7), np.float32)
        m[..., 5:] = -np.inf
        feeds.append(m)
    check(model(nodes, ins, [("y", F, None)], inits, opset=13), feeds, [(FUSED, "Attention")])


def test_softmax_over_another_axis_is_not_attention():
    nodes = [helper.make_node("MatMul", ["q", "k"], ["s"]), helper.make_node("Softmax", ["s"], ["p"], axis=1),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    check(model(nodes, [("q", F, None), ("k", F, None), ("v", F, None)], [("y", F, None)], opset=13),
          [rand(2, 4, 3), rand(2, 3, 4), rand(2, 4, 5)], ["MatMul", "Softmax", "MatMul"])


# -- static shape chains -----------------------------------------------------------------------------

def shape_chain_model(dims):
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2]),
             helper.make_node("Shape", ["xt"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Unsqueeze", ["n", "zero1"], ["n1"]),
             helper.make_node("Concat", ["n1", "minus1"], ["shape"], axis=0),
             helper.make_node("Reshape", ["xt", "shape"], ["y"])]
    inits = [init("zero", np.array(0, np.int64)), init("zero1", np.array([0], np.int64)),
             init("minus1", np.array([-1], np.int64))]
    return model(nodes, [("x", F, dims)], [("y", F, None)], inits, opset=13)


def test_shape_chain_folds_when_the_input_shape_is_static():
    check(shape_chain_model([2, 3, 4]), [rand(2, 3, 4)], ["Transpose", "Reshape"])
    with pytest.raises(onnx_mini.errors.InputError):      # the declared shape is enforced at run
        onnx_mini.prepare(shape_chain_model([2, 3, 4])).run([rand(3, 3, 4)])


def test_shape_chain_stays_with_a_symbolic_dim():
    check(shape_chain_model(["N", 3, 4]), [rand(5, 3, 4)], ["Transpose", "Shape", "Gather", "Unsqueeze", "Concat",
                                                             "Reshape"])


# -- modes -----------------------------------------------------------------------------------------

def test_optimize_false_runs_the_graph_as_written():
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), bn("c", "n"), helper.make_node("Relu", ["n"], ["y"]),
             helper.make_node("Exp", ["x"], ["unused"])]
    inits = [init("w", rand(4, 2, 1, 1))] + bn_inits("bn", 4)
    raw = onnx_mini.prepare(model(nodes, [("x", F, [1, 2, 3, 3])], [("y", F, None)], inits), optimize=False)
    assert [i.op_type for i in raw.plan.infos] == ["Conv", "BatchNormalization", "Relu", "Exp"]


# -- per-channel scale and shift after a BatchNormalization, BN + activation ------------------------

def affine_nodes(c_shape=(4, 1, 1)):
    return [bn("x", "n"), helper.make_node("Mul", ["n", "c"], ["m"]), helper.make_node("Add", ["d", "m"], ["a"]),
            helper.make_node("Relu", ["a"], ["y"])], [init("c", rand(*c_shape)), init("d", rand(*c_shape))]


def test_batchnorm_mul_add_relu_becomes_one_channel_affine_step():
    nodes, extra = affine_nodes()
    check(model(nodes, [("x", F, [2, 4, 3, 3])], [("y", F, None)], bn_inits("bn", 4) + extra), [rand(2, 4, 3, 3)],
          [(FUSED, "ChannelAffine")])


def test_conv_batchnorm_mul_add_relu_becomes_one_conv_step():
    nodes, extra = affine_nodes()
    nodes = [helper.make_node("Conv", ["i", "w"], ["x"])] + nodes
    inits = [init("w", rand(4, 2, 3, 3))] + bn_inits("bn", 4) + extra
    check(model(nodes, [("i", F, None)], [("y", F, None)], inits), [rand(1, 2, 5, 5)], [(FUSED, "Conv")])


@pytest.mark.parametrize("shapes", [((1,), (1,)), ((4, 1, 1), (1, 4, 1, 1)), ((), None), (None, (4, 1, 1))])
def test_conv_mul_add_folds_into_the_conv(shapes):
    """Conv -> Mul(c) -> Add(d) with one-element or per-channel constants (PP-LCNetV3's learnable affine):
    W * c and B * c + d, one Conv step; the values within float32 rounding of the graph as written, and
    by hand: y = (conv(x) + b) * c + d from the float64 definition."""
    c_shape, d_shape = shapes
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["p"], pads=[1, 1, 1, 1])]
    inits = [init("w", rand(4, 2, 3, 3)), init("b", rand(4))]
    last = "p"
    if c_shape is not None:
        nodes.append(helper.make_node("Mul", ["c", last], ["m"]))
        inits.append(init("c", rand(*c_shape)))
        last = "m"
    if d_shape is not None:
        nodes.append(helper.make_node("Add", [last, "d"], ["y"]))
        inits.append(init("d", rand(*d_shape)))
    else:
        nodes[-1] = helper.make_node("Mul", ["c", "p"], ["y"])
    x = rand(1, 2, 5, 5)
    rep = check(model(nodes, [("x", F, [1, 2, 5, 5])], [("y", F, None)], inits), [x], ["Conv"])
    vals = {i.name: numpy_helper.to_array(i).astype(np.float64) for i in inits}
    want = conv2d_direct(x.astype(np.float64), vals["w"], vals["b"], pads=(1, 1, 1, 1))
    if c_shape is not None:
        want = want * vals["c"].reshape(-1, 1, 1) if vals["c"].size > 1 else want * float(vals["c"].reshape(-1)[0])
    if d_shape is not None:
        want = want + vals["d"].reshape(-1, 1, 1) if vals["d"].size > 1 else want + float(vals["d"].reshape(-1)[0])
    np.testing.assert_allclose(rep.run([x])[0], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["spatial-constant", "product-read-elsewhere", "other-type", "fed-constant"])
def test_conv_mul_add_left_alone(case):
    """A constant varying along a spatial axis, a Conv output read by another node too, a constant of
    another type or one fed at run time: the Mul stays."""
    c = (rand(1, 1, 5) if case == "spatial-constant"
         else np.array([1.5], np.float64 if case == "other-type" else np.float32))
    nodes = [helper.make_node("Conv", ["x", "w"], ["p"], pads=[1, 1, 1, 1]), helper.make_node("Mul", ["p", "c"], ["y"])]
    outputs = [("y", F if case != "other-type" else TensorProto.DOUBLE, None)]
    if case == "product-read-elsewhere":
        outputs.append(("p", F, None))
    inputs = [("x", F, [1, 2, 5, 5])] + ([("c", F, [1])] if case == "fed-constant" else [])
    inits = [init("w", rand(4, 2, 3, 3))] + ([] if case == "fed-constant" else [init("c", c)])
    rep = onnx_mini.prepare(model(nodes, inputs, outputs, inits))
    assert ("", "Mul") in steps(rep)


def _conv_layout_affine(layout, op="Add", const_shape=(1, 4, 1)):
    """Conv (4 channels, no B) -> layout steps -> op(constant): jax2tf's Conv, Slice, Squeeze, then its bias."""
    nodes, inits = [helper.make_node("Conv", ["x", "w"], ["p"], kernel_shape=[3, 1])], [init("w", rand(4, 2, 3, 1))]
    last = "p"
    for k, (kind, args) in enumerate(layout):
        out = f"l{k}"
        if kind == "Slice":
            starts, ends, axes = args
            names = [f"s{k}", f"e{k}", f"a{k}"]
            inits += [init(n, np.array(v, np.int64)) for n, v in zip(names, (starts, ends, axes))]
            nodes.append(helper.make_node("Slice", [last, *names], [out]))
        elif kind in ("Squeeze", "Unsqueeze"):
            inits.append(init(f"q{k}", np.array(args, np.int64)))
            nodes.append(helper.make_node(kind, [last, f"q{k}"], [out]))
        else:
            nodes.append(helper.make_node(kind, [last], [out]))
        last = out
    nodes.append(helper.make_node(op, [last, "d"], ["y"]))
    inits.append(init("d", rand(*const_shape)))
    return nodes, inits


BIG = 2 ** 31 - 1


@pytest.mark.parametrize("layout, op, const_shape", [
    ([("Slice", ([0, 0, 0, 0], [BIG, BIG, BIG, 1], [0, 1, 2, 3])), ("Squeeze", [3])], "Add", (1, 4, 1)),
    ([("Squeeze", [-1]), ("Identity", None)], "Mul", (4, 1)),
    ([("Slice", ([1, 0], [6, 4], [2, 1])), ("Unsqueeze", [2, 5])], "Add", (1, 4, 1, 1, 1, 1)),
], ids=["magika-slice-squeeze", "squeeze-identity-mul", "spatial-slice-unsqueeze"])
def test_conv_affine_folds_through_layout_steps(layout, op, const_shape):
    """A per-channel Mul / Add after Slice / Squeeze / Unsqueeze / Identity steps that keep axis 1 (every
    channel, in order) folds into the Conv before them: the steps then read the Conv's output with its
    bias; values within float32 rounding of the graph as written, and by hand from Conv's definition."""
    nodes, inits = _conv_layout_affine(layout, op, const_shape)
    x = rand(2, 2, 7, 1)
    rep = check(model(nodes, [("x", F, [2, 2, 7, 1])], [("y", F, None)], inits), [x],
                ["Conv", *(kind for kind, _ in layout if kind != "Identity")])     # (identities.py drops those)
    vals = {i.name: numpy_helper.to_array(i).astype(np.float64) for i in inits}
    y = conv2d_direct(x.astype(np.float64), vals["w"])             # (2, 4, 5, 1)
    for kind, args in layout:
        if kind == "Slice":
            index = [slice(None)] * y.ndim
            for s, e, a in zip(*args):
                index[a] = slice(s, e)
            y = y[tuple(index)]
        elif kind == "Squeeze":
            y = np.squeeze(y, tuple(args))
        elif kind == "Unsqueeze":
            y = np.expand_dims(y, tuple(args))
    want = y + vals["d"] if op == "Add" else y * vals["d"]
    np.testing.assert_allclose(rep.run([x])[0], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["channel-slice", "channel-squeeze", "squeeze-without-axes", "step-read-elsewhere"])
def test_conv_affine_not_folded_through_other_layout_steps(case):
    """A Slice leaving some channels out, a Squeeze of the channel axis (one channel) or of unknown axes, a
    step whose output is read elsewhere too: the Add stays."""
    if case == "channel-slice":
        nodes, inits = _conv_layout_affine([("Slice", ([0], [3], [1]))], "Add", (1, 3, 1, 1))
    elif case == "channel-squeeze":
        nodes, inits = _conv_layout_affine([("Squeeze", [1])], "Add", (1, 1))
        nodes[0] = helper.make_node("Conv", ["x", "w"], ["p"], kernel_shape=[3, 1])
        inits[0] = init("w", rand(1, 2, 3, 1))
    else:
        nodes, inits = _conv_layout_affine([("Squeeze", [3])], "Add", (1, 4, 1))
        if case == "squeeze-without-axes":
            nodes[1] = helper.make_node("Squeeze", ["p"], ["l0"])
    outputs = [("y", F, None)] + ([("l0", F, None)] if case == "step-read-elsewhere" else [])
    rep = check(model(nodes, [("x", F, [2, 2, 7, 1])], outputs, inits), [rand(2, 2, 7, 1)],
                ["Conv", "Slice" if case == "channel-slice" else "Squeeze", "Add"])
    assert ("", "Add") in steps(rep)


def test_batchnorm_scale_shift_not_folded_without_rank_or_per_channel_shape():
    nodes, extra = affine_nodes()
    check(model(nodes, [("x", F, None)], [("y", F, None)], bn_inits("bn", 4) + extra), [rand(2, 4, 3, 3)],
          ["BatchNormalization", "Mul", "Add", "Relu"])
    nodes, extra = affine_nodes((1, 1, 3))
    check(model(nodes, [("x", F, [2, 4, 3, 3])], [("y", F, None)], bn_inits("bn", 4) + extra), [rand(2, 4, 3, 3)],
          ["BatchNormalization", "Mul", "Add", "Relu"])


def test_batchnorm_float16_with_activation():
    h = TensorProto.FLOAT16
    nodes = [bn("x", "n"), helper.make_node("Sigmoid", ["n"], ["y"])]
    inits = [numpy_helper.from_array(numpy_helper.to_array(i).astype(np.float16), i.name) for i in bn_inits("bn", 3)]
    check(model(nodes, [("x", h, [2, 3, 4])], [("y", h, None)], inits), [rand(2, 3, 4, dtype=np.float16)],
          [(FUSED, "ChannelAffine")], rtol=2e-3, atol=2e-3)


# -- Conv + residual ---------------------------------------------------------------------------------

@pytest.mark.parametrize("op, opset", [("Add", 13), ("Sum", 13), ("Sum", 6)])
def test_conv_bn_plus_residual_plus_relu_is_one_step(op, opset):
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             bn("c", "n", **({"is_test": 1} if opset < 7 else {})),
             helper.make_node(op, ["x", "n"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    inits = [init("w", rand(3, 3, 3, 3))] + bn_inits("bn", 3)
    check(model(nodes, [("x", F, [1, 3, 5, 5])], [("y", F, None)], inits, opset=opset, ir_version=3 if opset < 7
                else 10), {"x": rand(1, 3, 5, 5)}, [(FUSED, "Conv")])


def test_conv_plus_residual_that_broadcasts_larger_and_not_when_the_conv_output_is_needed():
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Add", ["c", "z"], ["y"])]
    inits = [init("w", rand(3, 2, 1, 1))]
    check(model(nodes, [("x", F, [1, 2, 4, 4]), ("z", F, None)], [("y", F, None)], inits),
          [rand(1, 2, 4, 4), rand(2, 3, 4, 4)], [(FUSED, "Conv")])
    check(model(nodes, [("x", F, [1, 2, 4, 4]), ("z", F, None)], [("y", F, None), ("c", F, None)], inits),
          [rand(1, 2, 4, 4), rand(1, 3, 4, 4)], ["Conv", "Add"])


@pytest.mark.parametrize("kernel, pads, z_shape", [
    (1, [0, 0, 0, 0], (4, 3, 6, 6)),     # pointwise, residual per image
    (3, [1, 1, 1, 1], (1, 3, 6, 6)),     # im2col, residual shared by the images
    (3, [1, 1, 1, 1], (3, 1, 1)),        # a per-channel residual of lower rank: the general path
    (1, [0, 0, 0, 0], (4, 3, 1, 6)),     # broadcast along a spatial axis
    (3, [1, 1, 1, 1], (2, 4, 3, 6, 6)),  # larger than the conv output: the general path
])
def test_batched_conv_with_residual_and_activation_image_by_image(kernel, pads, z_shape):
    """A batch of 4: bias, residual and activation are applied image by image inside the convolution."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=pads), helper.make_node("Add", ["c", "z"], ["s"]),
             helper.make_node("LeakyRelu", ["s"], ["y"], alpha=0.1)]
    inits = [init("w", rand(3, 2, kernel, kernel)), init("b", rand(3))]
    m = model(nodes, [("x", F, [4, 2, 6, 6]), ("z", F, None)], [("y", F, None)], inits)
    check(m, [rand(4, 2, 6, 6), rand(*z_shape)], [(FUSED, "Conv")])
    one = onnx_mini.prepare(m, threads=1).run([np.ones((4, 2, 6, 6), np.float32), np.ones(z_shape, np.float32)])[0]
    two = onnx_mini.prepare(m).run([np.ones((4, 2, 6, 6), np.float32), np.ones(z_shape, np.float32)])[0]
    np.testing.assert_array_equal(one, two)


def test_a_failing_pass_leaves_the_graph_as_written(monkeypatch):
    import onnx_mini.optimize as opt  # noqa: PLC0415

    def broken(ctx):
        raise KeyError("boom")
    monkeypatch.setattr(opt, "fuse_activations", broken)
    nodes = [helper.make_node("Conv", ["x", "w"], ["p"]), helper.make_node("Relu", ["p"], ["y"])]
    m = model(nodes, [("x", F, [1, 2, 4, 4])], [("y", F, None)], [init("w", rand(3, 2, 3, 3))])
    with pytest.warns(opt.OptimizationWarning, match="boom"):
        check(m, [rand(1, 2, 4, 4)], ["Conv", "Relu"])


def test_subgraph_bodies_are_optimised_with_outer_values_left_variable():
    """An If branch holding MatMul + Add + Relu over an outer value: fused inside the branch, and the
    outer value (not a constant of the branch) is read at run time."""
    body_nodes = [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Add", ["p", "b"], ["s"]),
                  helper.make_node("Relu", ["s"], ["out"])]
    then = helper.make_graph(body_nodes, "then", [], [helper.make_tensor_value_info("out", F, None)],
                             [init("w", rand(5, 4)), init("b", rand(4))])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["out2"])], "else", [],
                              [helper.make_tensor_value_info("out2", F, None)])
    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    m = model(nodes, [("c", TensorProto.BOOL, []), ("x", F, [3, 5])], [("y", F, None)])
    opt = check(m, [np.array(True), rand(3, 5)], ["If"])
    from onnx_mini import loader  # noqa: PLC0415
    from onnx_mini.prepare import prepare_plan  # noqa: PLC0415
    loaded = loader.load(m)
    branch = loaded.graph.nodes[0].attrs["then_branch"]
    plan = prepare_plan(branch, loaded.opsets, outer_scope=("x",))
    assert [(i.domain, i.op_type) for i in plan.infos] == [(FUSED, "MatMul")]
    np.testing.assert_allclose(opt.run([np.array(False), np.ones((3, 5), np.float32)])[0], -np.ones((3, 5)))


# -- channel shuffle -----------------------------------------------------------------------------------

def shuffle_model(g=2, k=3, n=1, hw=(4, 5), act="Relu", dtype=F, split=None, join=None, conv_attrs=None,
                  residual=False, wg=None, extra_outputs=()):
    """Conv (g groups, 1x1, bias) -> [act] -> Reshape (n, g, k, h, w) -> Transpose (0, 2, 1, 3, 4) ->
    Reshape (n, g*k, h, w) -> Neg (something after the shuffle to read its channels)."""
    c, (h, w) = g * k, hw
    np_type = {F: np.float32, TensorProto.DOUBLE: np.float64, TensorProto.FLOAT16: np.float16}[dtype]
    ci = 2 * g
    nodes = [helper.make_node("Conv", ["x", "w", "b"] + (["", "z"] if False else []), ["c"], group=wg or g,
                              **(conv_attrs or {}))]
    last = "c"
    if residual:
        nodes.append(helper.make_node("Add", ["c", "z"], ["cz"]))
        last = "cz"
    if act:
        nodes.append(helper.make_node(act, [last], ["a"]))
        last = "a"
    nodes += [helper.make_node("Reshape", [last, "s5"], ["r5"]),
              helper.make_node("Transpose", ["r5"], ["t5"], perm=[0, 2, 1, 3, 4]),
              helper.make_node("Reshape", ["t5", "s4"], ["r4"]), helper.make_node("Neg", ["r4"], ["y"])]
    inits = [init("w", rand(c, ci // (wg or g), 1, 1, dtype=np_type)), init("b", rand(c, dtype=np_type)),
             init("s5", np.array(split or [n, g, k, h, w], np.int64)),
             init("s4", np.array(join or [n, c, h, w], np.int64))]
    inputs = [("x", dtype, [n, ci, h, w])] + ([("z", dtype, [n, c, h, w])] if residual else [])
    return model(nodes, inputs, [("y", dtype, None), *((o, dtype, None) for o in extra_outputs)], inits)


@pytest.mark.parametrize("g, k, n, act", [(2, 3, 1, "Relu"), (4, 5, 3, None), (3, 1, 2, "Sigmoid")])
def test_channel_shuffle_is_written_by_the_grouped_pointwise_conv(g, k, n, act):
    """The shuffle's three nodes go: the fused Conv writes group a's j-th channel to channel j*g + a,
    bias alike: bit for bit what the graph as written gives (images one by one for a batch), and the
    sums of a numpy formula in that order."""
    m = shuffle_model(g, k, n, act=act)
    x = rand(n, 2 * g, 4, 5)
    exact = 0 if act != "Sigmoid" else 1e-6       # the fused Sigmoid is computed in place, its own way
    rep = check(m, [x], [(FUSED, "Conv"), "Neg"], rtol=exact, atol=exact)
    assert rep.plan.infos[0].outputs == ("r4",)          # the Conv writes the shuffled tensor itself
    w = numpy_helper.to_array(m.graph.initializer[0]).reshape(g, k, 2)
    b = numpy_helper.to_array(m.graph.initializer[1]).reshape(g, k)
    prod = np.einsum("akc,nacp->nakp", w, x.reshape(n, g, 2, 20)) + b[None, :, :, None]   # (n, group, k, pixels)
    if act == "Relu":
        prod = np.maximum(prod, 0)
    elif act == "Sigmoid":
        prod = 1 / (1 + np.exp(-prod))
    want = -prod.transpose(0, 2, 1, 3).reshape(n, g * k, 4, 5)   # channel j*g + a holds group a's j-th
    np.testing.assert_allclose(rep.run([x])[0], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n, constant_bias", [(1, True), (2, True), (1, False)])
def test_channel_shuffle_of_an_expanding_conv_sums_its_bias_in_the_product(n, constant_bias):
    """2g -> 6g channels: the bias goes into the product as a column of W in each group's row order
    (ops/nn/conv._bias_column), the output still in shuffle order."""
    g, k = 2, 6
    m = shuffle_model(g, k, n)
    if not constant_bias:      # the bias a graph input: not cached with W
        m.graph.initializer.pop(1)
        m.graph.input.append(helper.make_tensor_value_info("b", F, [g * k]))
    x, b = rand(n, 2 * g, 4, 5), rand(g * k)
    feeds = [x] if constant_bias else [x, b]
    if constant_bias:
        b = numpy_helper.to_array(m.graph.initializer[1])
    rep = check(m, feeds, [(FUSED, "Conv"), "Neg"])
    w = numpy_helper.to_array(m.graph.initializer[0]).reshape(g, k, 2)
    prod = np.einsum("akc,nacp->nakp", w, x.reshape(n, g, 2, 20)) + b.reshape(g, k)[None, :, :, None]
    want = -np.maximum(prod, 0).transpose(0, 2, 1, 3).reshape(n, g * k, 4, 5)
    np.testing.assert_allclose(rep.run(feeds)[0], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [TensorProto.DOUBLE, TensorProto.FLOAT16])
def test_channel_shuffle_in_float64_and_float16(dtype):
    np_type = np.float64 if dtype == TensorProto.DOUBLE else np.float16
    check(shuffle_model(2, 3, dtype=dtype), [rand(1, 4, 4, 5, dtype=np_type)], [(FUSED, "Conv"), "Neg"],
          rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("case", ["other_groups", "minus_one", "zero", "strided", "padded", "residual",
                                  "conv_output_read", "split_mismatch"])
def test_channel_shuffle_stays_as_written(case):
    kw = {"other_groups": dict(wg=1), "minus_one": dict(split=[1, 2, -1, 4, 5]), "zero": dict(join=[0, 6, 4, 5]),
          "strided": dict(conv_attrs=dict(strides=[1, 1], pads=[0, 0, 1, 0]), join=[1, 6, 5, 5],
                          split=[1, 2, 3, 5, 5]),
          "padded": dict(conv_attrs=dict(pads=[1, 1, 1, 1]), split=[1, 2, 3, 6, 7], join=[1, 6, 6, 7]),
          "residual": dict(residual=True, act=None), "conv_output_read": dict(extra_outputs=("a",)),
          "split_mismatch": dict(join=[1, 6, 5, 4])}[case]
    m = shuffle_model(2, 3, **kw)
    feeds = [rand(1, 4, 4, 5)] + ([rand(1, 6, 4, 5)] if case == "residual" else [])
    opt = onnx_mini.prepare(m)
    assert ("", "Transpose") in steps(opt)
    for got, want in zip(opt.run(feeds), onnx_mini.prepare(m, optimize=False).run(feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_channel_shuffle_with_other_input_sizes_runs_the_three_ops_as_written():
    """Shapes the Reshapes did not expect: the same numbers the graph as written gives when the sizes
    agree (a 5x4 image where 4x5 was declared), the same kind of error when they do not."""
    m = shuffle_model(2, 3, hw=(4, 5))
    m.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "h"
    m.graph.input[0].type.tensor_type.shape.dim[3].dim_param = "w"
    opt, raw = onnx_mini.prepare(m), onnx_mini.prepare(m, optimize=False)
    assert ("", "Transpose") not in steps(opt)
    x = rand(1, 4, 5, 4)
    np.testing.assert_array_equal(opt.run([x])[0], raw.run([x])[0])
    bad = rand(1, 4, 3, 3)
    with pytest.raises(onnx_mini.errors.OnnxMiniError):
        raw.run([bad])
    with pytest.raises(onnx_mini.errors.OnnxMiniError, match="channel shuffle"):
        opt.run([bad])


# -- a bias carried through a pointwise Conv -----------------------------------------------------------

def bias_chain(second_kernel=1, second_attrs=None, second_bias=True, groups=2, extra_outputs=(), dtype=np.float32):
    """Conv A (depthwise 3x3, bias) -> Conv B (groups, second_kernel, [bias]) -> Neg."""
    ft = F if dtype == np.float32 else TensorProto.DOUBLE
    nodes = [helper.make_node("Conv", ["x", "wa", "ba"], ["a"], group=4, pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["a", "wb"] + (["bb"] if second_bias else []), ["b"], group=groups,
                              **(second_attrs or {})),
             helper.make_node("Neg", ["b"], ["y"])]
    inits = [init("wa", rand(4, 1, 3, 3, dtype=dtype)), init("ba", rand(4, dtype=dtype)),
             init("wb", rand(6, 4 // groups, second_kernel, second_kernel, dtype=dtype))]
    inits += [init("bb", rand(6, dtype=dtype))] if second_bias else []
    return model(nodes, [("x", ft, [2, 4, 6, 5])], [("y", ft, None), *((o, ft, None) for o in extra_outputs)], inits)


@pytest.mark.parametrize("groups, second_bias, attrs, dtype", [
    (2, True, None, np.float32), (1, False, None, np.float32), (2, True, dict(strides=[2, 2]), np.float32),
    (2, True, dict(auto_pad="VALID"), np.float64)])
def test_conv_bias_carried_into_the_pointwise_conv_after_it(groups, second_bias, attrs, dtype, monkeypatch):
    """A's bias b moves into B's (c + V b, per group): A runs without one, the results stay those of
    the graph as written, and B's new bias is that formula."""
    # the NCHW Convs this test reads (depthwise + pointwise would otherwise run channels-last)
    monkeypatch.setattr("onnx_mini.optimize.PASSES", tuple(p for p in PASSES if p != "channels_last"))
    m = bias_chain(groups=groups, second_bias=second_bias, second_attrs=attrs, dtype=dtype)
    rep = check(m, [rand(2, 4, 6, 5, dtype=dtype)], ["Conv", "Conv", "Neg"])
    first, second = rep.plan.infos[:2]
    assert len(first.inputs) == 2 and len(second.inputs) == 3
    v = numpy_helper.to_array(m.graph.initializer[2]).astype(np.float64).reshape(groups, 6 // groups, 4 // groups)
    b = numpy_helper.to_array(m.graph.initializer[1]).astype(np.float64).reshape(groups, 4 // groups)
    c = numpy_helper.to_array(m.graph.initializer[3]).astype(np.float64) if second_bias else np.zeros(6)
    want = c + np.concatenate([v[g] @ b[g] for g in range(groups)])
    plan = rep.plan
    got = plan.template[plan.slot_names.index(second.inputs[2])]
    assert got.dtype == dtype
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("case", ["padded", "3x3", "read_twice", "graph_output"])
def test_conv_bias_stays_where_the_next_conv_would_see_padding_or_others_read_it(case, monkeypatch):
    # the NCHW Convs this test reads (depthwise + grouped pointwise would otherwise run channels-last)
    monkeypatch.setattr("onnx_mini.optimize.PASSES", tuple(p for p in PASSES if p != "channels_last"))
    kw = {"padded": dict(second_attrs=dict(pads=[1, 1, 1, 1])), "3x3": dict(second_kernel=3),
          "read_twice": dict(), "graph_output": dict(extra_outputs=("a",))}[case]
    m = bias_chain(**kw)
    if case == "read_twice":
        m.graph.node.append(helper.make_node("Relu", ["a"], ["r"]))
        m.graph.output.append(helper.make_tensor_value_info("r", F, None))
    x = rand(2, 4, 6, 5)
    opt = onnx_mini.prepare(m)
    assert len(opt.plan.infos[0].inputs) == 3          # A keeps its bias
    for got, want in zip(opt.run([x]), onnx_mini.prepare(m, optimize=False).run([x])):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# -- Relu through Concat ---------------------------------------------------------------------------

def unit_model(pool="AveragePool", pool_attrs=None, extra_outputs=(), concat_first="conv", conv_pads=1):
    """ShuffleNet's stride-2 unit: Relu'd input, a strided Conv branch and a pooled branch, Concat, Relu."""
    pool_attrs = pool_attrs if pool_attrs is not None else dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    branches = ["c", "p"] if concat_first == "conv" else ["p", "c"]
    k = 3 if conv_pads == 1 else 1
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Conv", ["r", "w", "b"], ["c"], strides=[2, 2], pads=[conv_pads] * 4),
             helper.make_node(pool, ["r"], ["p"], **pool_attrs),
             helper.make_node("Concat", branches, ["cat"], axis=1),
             helper.make_node("Relu", ["cat"], ["y"])]
    outputs = [("y", F, None)] + [(o, F, None) for o in extra_outputs]
    return model(nodes, [("x", F, [1, 3, 8, 8])], outputs, [init("w", rand(4, 3, k, k)), init("b", rand(4))])


def unit_input():
    x = rand(1, 3, 8, 8)
    x[0, 0, 0, :3] = [np.nan, -np.inf, np.inf]
    return [x]


@pytest.mark.parametrize("pool, attrs", [
    ("AveragePool", None), ("MaxPool", None), ("MaxPool", dict(kernel_shape=[2, 2], strides=[2, 2])),
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER")),
    ("AveragePool", dict(kernel_shape=[2, 2], strides=[2, 2], pads=[2, 2, 2, 2], count_include_pad=0)),
])
@pytest.mark.parametrize("first", ["conv", "pool"])
def test_relu_after_concat_runs_on_the_branches_that_can_be_negative(pool, attrs, first):
    """The Relu goes onto the convolution's branch (fused into it); the pooled branch pools a Relu's
    output: values >= 0, or NaN (an average over padding only), which Relu keeps."""
    wide = bool(attrs) and attrs.get("pads") == [2, 2, 2, 2]       # a 1x1 conv padded 2 matches its 6x6
    m = unit_model(pool, attrs, concat_first=first, conv_pads=2 if wide else 1)
    check(m, unit_input(), ["Relu", pool, (FUSED, "Conv"), "Concat"])


def test_relu_after_concat_stays_where_no_branch_is_known_non_negative():
    # a MaxPool whose padding covers a whole window reads -inf there: not non-negative
    m = unit_model("MaxPool", dict(kernel_shape=[1, 1], strides=[2, 2], pads=[2, 2, 2, 2]), conv_pads=2)
    check(m, unit_input(), ["Relu", "Conv", "MaxPool", "Concat", "Relu"])
    # the Concat's output is needed as it is
    check(unit_model(extra_outputs=["cat"]), unit_input(), ["Relu", "Conv", "AveragePool", "Concat", "Relu"])
    # nothing known: Relu(x) is a graph input's, the pooled branch pools x itself
    nodes = [helper.make_node("AveragePool", ["x"], ["p"], kernel_shape=[2, 2]),
             helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[2, 2]),
             helper.make_node("Concat", ["c", "p"], ["cat"], axis=1), helper.make_node("Relu", ["cat"], ["y"])]
    check(model(nodes, [("x", F, [1, 3, 6, 6])], [("y", F, None)], [init("w", rand(2, 3, 2, 2))]),
          [rand(1, 3, 6, 6)], ["AveragePool", "Conv", "Concat", "Relu"])


def test_relu_after_nested_concats_and_global_pools():
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("GlobalMaxPool", ["r"], ["g1"]), helper.make_node("GlobalAveragePool", ["r"], ["g2"]),
             helper.make_node("Concat", ["g1", "g2"], ["inner"], axis=1),
             helper.make_node("Neg", ["x"], ["n"]), helper.make_node("GlobalAveragePool", ["n"], ["g3"]),
             helper.make_node("Concat", ["inner", "g3", "g3"], ["cat"], axis=1),
             helper.make_node("Relu", ["cat"], ["y"])]
    opt = check(model(nodes, [("x", F, [2, 3, 4, 4])], [("y", F, None)]), [rand(2, 3, 4, 4)],
                ["Relu", "GlobalMaxPool", "GlobalAveragePool", "Concat", "Neg", "GlobalAveragePool", "Relu",
                 "Concat"])
    assert opt.run([rand(2, 3, 4, 4)])[0].shape == (2, 12, 1, 1)


# -- MatMul -> Add -> Add -> activation: one step (an RNN cell's x W + h R + b, then Tanh) ----------------

def two_adds_model(first, second, bias, act, et=F, extra_reader=None, outputs=None):
    """MatMul(x, w) -> Add with a fed `c` (operands in `first` order: 'pc' or 'cp') -> Add with `b`
    (`second` order: 'sb' or 'bs'; `bias`: 'const' or 'fed', its shape in b's feed) -> `act` (or none)."""
    p_c = ["p", "c"] if first == "pc" else ["c", "p"]
    s_b = ["s", "b"] if second == "sb" else ["b", "s"]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Add", p_c, ["s"]),
             helper.make_node("Add", s_b, ["t"])]
    if act:
        nodes.append(helper.make_node(act, ["t"], ["y"]))
    if extra_reader:
        nodes.append(helper.make_node("Neg", [extra_reader], ["other"]))
    outs = outputs or (["y" if act else "t"] + (["other"] if extra_reader else []))
    return nodes, outs


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("order", ["pc-sb", "cp-bs", "pc-bs", "cp-sb"])
@pytest.mark.parametrize("bias", ["const", "const_row", "fed", "fed_row"])
@pytest.mark.parametrize("act", ["", "Tanh", "Relu"])
def test_matmul_add_add_activation_is_one_step_bit_for_bit(dtype, order, bias, act):
    """((x w + c) + b), then the activation, in one fused step: the values of the nodes as written bit for
    bit (the graph's association kept: x w + (c + b) differs in the last bits), inputs untouched."""
    et = TensorProto.FLOAT if dtype == np.float32 else TensorProto.DOUBLE
    r = np.random.default_rng(22)        # its own numbers: the last check needs sums that round apart
    b = r.standard_normal((1, 128) if bias.endswith("row") else 128).astype(dtype)
    w, x, c = (r.standard_normal(shape).astype(dtype) for shape in ((64, 128), (3, 64), (3, 128)))
    x *= 0.1            # pre-activations of order 1: Tanh is not saturated
    c *= 1e-3
    fed = bias.startswith("fed")
    nodes, outs = two_adds_model(*order.split("-"), bias, act)
    ins = [("x", et, [3, 64]), ("c", et, [3, 128])] + ([("b", et, list(b.shape))] if fed else [])
    m = model(nodes, ins, [(o, et, None) for o in outs], [init("w", w)] + ([] if fed else [init("b", b)]))
    feeds = [x, c] + ([b] if fed else [])
    kept = [f.copy() for f in feeds]
    opt, raw = onnx_mini.prepare(m), onnx_mini.prepare(m, optimize=False)
    assert steps(opt) == [(FUSED, "MatMul")]
    assert len(opt.plan.infos[0].fused_from) == (4 if act else 3)
    got, want = opt.run(feeds)[0], raw.run(feeds)[0]
    assert got.dtype == dtype and got.shape == want.shape == (3, 128)
    np.testing.assert_array_equal(got, want)
    for f, k in zip(feeds, kept):
        np.testing.assert_array_equal(f, k)
    # the test tells the associations apart: x w + (c + b) differs in some values
    apply = {"": lambda y: y, "Tanh": np.tanh, "Relu": lambda y: np.maximum(y, 0)}[act]
    assert not np.array_equal(apply(np.matmul(x, w) + (c + b)), want)


def test_matmul_add_add_broadcasting_past_the_product_and_sigmoid():
    """Addends that make the sum larger than the product ([3, 1, 8] after a [2, 8] product), and a 3-D
    product: the Adds' results; Sigmoid within rounding of its kernel's form (as the one-Add fusion)."""
    nodes, outs = two_adds_model("pc", "sb", "fed", "Sigmoid")
    m = model(nodes, [("x", F, None), ("c", F, None), ("b", F, None)], [("y", F, None)],
              [init("w", rand(5, 8))])
    check(m, [rand(2, 5), rand(3, 1, 8), rand(8)], [(FUSED, "MatMul")], rtol=1e-6, atol=1e-7)
    check(m, [rand(2, 5), rand(8), rand(4, 1, 1, 8)], [(FUSED, "MatMul")], rtol=1e-6, atol=1e-7)
    check(m, [rand(4, 2, 5), rand(2, 8), rand(8)], [(FUSED, "MatMul")], rtol=1e-6, atol=1e-7)
    nodes, outs = two_adds_model("pc", "sb", "fed", "Tanh")
    m = model(nodes, [("x", F, None), ("c", F, None), ("b", F, None)], [("y", F, None)], [init("w", rand(5, 8))])
    feeds = [rand(4, 2, 5), rand(3, 1, 1, 8), rand(1, 8)]
    opt = check(m, feeds, [(FUSED, "MatMul")])
    np.testing.assert_array_equal(opt.run(feeds)[0], onnx_mini.prepare(m, optimize=False).run(feeds)[0])


@pytest.mark.parametrize("dtype, act", [(np.float16, ""), (np.float16, "Relu"), (np.float16, "Tanh"),
                                        (np.int32, ""), (np.int32, "Relu")])
def test_matmul_add_add_of_other_types_bit_for_bit(dtype, act):
    """float16 (the activation in float32, rounded back once, as the Tanh kernel does) and int32 products
    take the kernel's general path: the nodes' values, bit for bit."""
    r = np.random.default_rng(5)
    et = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    make = (lambda *s: (r.standard_normal(s) * 0.5).astype(dtype)) if dtype == np.float16 else (
        lambda *s: r.integers(-50, 50, s).astype(dtype))
    nodes, outs = two_adds_model("cp", "bs", "const", act)
    m = model(nodes, [("x", et, None), ("c", et, None)], [(outs[0], et, None)],
              [init("w", make(16, 8)), init("b", make(8))])
    feeds = [make(3, 16), make(3, 8)]
    opt = check(m, feeds, [(FUSED, "MatMul")], rtol=0, atol=0)
    np.testing.assert_array_equal(opt.run(feeds)[0], onnx_mini.prepare(m, optimize=False).run(feeds)[0])


def test_matmul_add_add_not_fused_past_an_intermediate_read_elsewhere():
    """The first sum read by another node or a graph output stays visible: the second Add stays a step
    (and so does the activation after it); likewise the second sum read elsewhere keeps the activation
    apart; an Add after an activation is not moved before it."""
    ins = [("x", F, [3, 64]), ("c", F, [3, 128]), ("b", F, [128])]
    feeds = [rand(3, 64), rand(3, 128), rand(128)]
    w = [init("w", rand(64, 128))]
    nodes, outs = two_adds_model("pc", "sb", "fed", "Tanh", extra_reader="s")
    check(model(nodes, ins, [(o, F, None) for o in outs], w), feeds, [(FUSED, "MatMul"), "Add", "Tanh", "Neg"])
    nodes, _ = two_adds_model("pc", "sb", "fed", "Tanh")
    check(model(nodes, ins, [("y", F, None), ("s", F, None)], w), feeds, [(FUSED, "MatMul"), "Add", "Tanh"])
    nodes, outs = two_adds_model("pc", "sb", "fed", "Tanh", extra_reader="t")
    check(model(nodes, ins, [(o, F, None) for o in outs], w), feeds, [(FUSED, "MatMul"), "Tanh", "Neg"])
    check(model(nodes[:3], ins, [("t", F, None), ("s", F, None)], w), feeds, [(FUSED, "MatMul"), "Add"])
    relu_first = [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Add", ["p", "c"], ["s"]),
                  helper.make_node("Relu", ["s"], ["r"]), helper.make_node("Add", ["r", "b"], ["y"])]
    check(model(relu_first, ins, [("y", F, None)], w), feeds, [(FUSED, "MatMul"), "Add"])


def test_scan_rnn_cell_is_matmul_and_one_fused_step():
    """A Scan RNN (h = Tanh(x Wx + h Wh + b), as benchmarks/app_models.py's scan_rnn): in the body, MatMul,
    Add, Add and Tanh become one fused step reading the outer-scope weights and bias (planned alone,
    below); in the model, x Wx is hoisted out of the loop first (scan_hoist.py, test_scan_hoist.py):
    the states and outputs of every step are those of the graph as written, to rounding."""
    hidden, n_in, steps_ = 16, 8, 7
    r = np.random.default_rng(44)      # its own numbers: with the module's, which depend on the tests run
    # before, a state could saturate to exactly 1.0 in float32 (the check below wants Tanh'ed states < 1)

    def rand(*shape):
        return r.standard_normal(shape).astype(np.float32)
    body_nodes = [helper.make_node("MatMul", ["cell_x", "wx"], ["xw"]),
                  helper.make_node("MatMul", ["cell_h", "wh"], ["hw"]),
                  helper.make_node("Add", ["xw", "hw"], ["pre0"]), helper.make_node("Add", ["pre0", "b"], ["pre"]),
                  helper.make_node("Tanh", ["pre"], ["cell_h_out"]),
                  helper.make_node("Identity", ["cell_h_out"], ["cell_y"])]
    body = helper.make_graph(body_nodes, "rnn_cell",
                             [helper.make_tensor_value_info("cell_h", F, [1, hidden]),
                              helper.make_tensor_value_info("cell_x", F, [1, n_in])],
                             [helper.make_tensor_value_info("cell_h_out", F, [1, hidden]),
                              helper.make_tensor_value_info("cell_y", F, [1, hidden])])
    nodes = [helper.make_node("Scan", ["h0", "x"], ["h_last", "y"], body=body, num_scan_inputs=1)]
    m = model(nodes, [("h0", F, [1, hidden]), ("x", F, [steps_, 1, n_in])],
              [("h_last", F, [1, hidden]), ("y", F, [steps_, 1, hidden])],
              [init("wx", rand(n_in, hidden)), init("wh", rand(hidden, hidden) * 0.3), init("b", rand(hidden))])
    feeds = [rand(1, hidden), rand(steps_, 1, n_in)]
    opt = check(m, feeds, ["MatMul", "Scan"])
    got = opt.run(feeds)
    assert np.abs(got[1]).max() < 1 and np.ptp(got[1][-1]) > 0.1       # Tanh'ed states that vary
    from onnx_mini import loader  # noqa: PLC0415
    from onnx_mini.prepare import prepare_plan  # noqa: PLC0415
    loaded = loader.load(m)
    plan = prepare_plan(loaded.graph.nodes[0].attrs["body"], loaded.opsets, outer_scope=("wx", "wh", "b"))
    assert [(i.domain, i.op_type) for i in plan.infos] == [("", "MatMul"), (FUSED, "MatMul"), ("", "Identity")]
    fused = plan.infos[1]
    assert fused.inputs == ("cell_x", "wx", "hw", "b") and fused.outputs == ("cell_h_out",)
    assert len(fused.fused_from) == 4


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fused_matmul_second_addend_on_the_short_path(dtype, monkeypatch):
    """The kernel itself: product + bias, then + addend (constant or fed, [N], [1, N] or broadcasting the
    sum larger), below and above blas's split size: numpy's sums in that order; an addend of another type
    or shape is refused as the unfused Add would."""
    from onnx_mini import blas
    from onnx_mini.errors import InvalidValueError
    from onnx_mini.ops import fused
    r = np.random.default_rng(3)
    x, w, bias = (r.standard_normal(s).astype(dtype) for s in ((1, 64), (64, 128), (1, 128)))
    const = r.standard_normal(128).astype(dtype)
    kept = [a.copy() for a in (x, w, bias, const)]
    for split in (blas.MIN_PART_MACS, 64):
        monkeypatch.setattr(blas, "MIN_PART_MACS", split)
        run = fused.fused_matmul(activation="Tanh", _constants={3: const})
        for addend in (const, const.copy(), const.reshape(1, -1), r.standard_normal((2, 1, 128)).astype(dtype)):
            got = run(x, w, bias, addend)
            want = np.tanh((np.matmul(x, w) + bias) + addend)
            assert got.dtype == dtype and got.shape == want.shape and np.array_equal(got, want)
            assert not np.shares_memory(got, addend) and not np.shares_memory(got, bias)
        # the bias 1-D, fed: a row view of it gives the same sums
        assert np.array_equal(run(x, w, const.copy(), bias), np.tanh((np.matmul(x, w) + const) + bias))
    for a, k in zip((x, w, bias, const), kept):
        assert np.array_equal(a, k)
    other = np.float32 if dtype == np.float64 else np.float64
    with pytest.raises(InvalidValueError, match=r"the added input \(float.*\) must have the product's type"):
        run(x, w, bias, const.astype(other))
    with pytest.raises(ValueError, match=r"broadcast.*\(5,\)"):       # numpy's words, the addend as given
        run(x, w, bias, np.ones(5, dtype))
    # an omitted bias before the addend: the product plus the addend alone
    got = fused.fused_matmul(activation="Relu", _constants={})(x, w, None, bias)
    assert np.array_equal(got, np.maximum(np.matmul(x, w) + bias, 0))


def test_loop_body_matmul_add_add_tanh_is_one_step():
    """In a Loop body, h = Tanh(b + (h W + c)) with W, b, c from the outer scope (c fed): one fused step;
    the final state is the graph's as written, bit for bit."""
    body_nodes = [helper.make_node("MatMul", ["h", "w"], ["p"]), helper.make_node("Add", ["p", "c"], ["s"]),
                  helper.make_node("Add", ["b", "s"], ["t"]), helper.make_node("Tanh", ["t"], ["h_out"]),
                  helper.make_node("Identity", ["cond"], ["cond_out"])]
    body = helper.make_graph(body_nodes, "body",
                             [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                              helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
                              helper.make_tensor_value_info("h", F, [1, 8])],
                             [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
                              helper.make_tensor_value_info("h_out", F, [1, 8])])
    nodes = [helper.make_node("Loop", ["n", "", "h0"], ["h_last"], body=body)]
    m = model(nodes, [("n", TensorProto.INT64, []), ("h0", F, [1, 8]), ("c", F, [1, 8])], [("h_last", F, [1, 8])],
              [init("w", rand(8, 8) * 0.5), init("b", rand(8))])
    feeds = [np.array(5, np.int64), rand(1, 8), rand(1, 8)]
    opt = check(m, feeds, ["Loop"])
    np.testing.assert_array_equal(opt.run(feeds)[0], onnx_mini.prepare(m, optimize=False).run(feeds)[0])
    from onnx_mini import loader  # noqa: PLC0415
    from onnx_mini.prepare import prepare_plan  # noqa: PLC0415
    loaded = loader.load(m)
    plan = prepare_plan(loaded.graph.nodes[0].attrs["body"], loaded.opsets, outer_scope=("w", "b", "c"))
    assert [(i.domain, i.op_type) for i in plan.infos] == [(FUSED, "MatMul"), ("", "Identity")]
    assert plan.infos[0].inputs == ("h", "w", "c", "b")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fused_matmul_np_dot_path_is_np_matmul_bit_for_bit(dtype):
    """The fused MatMul's short path takes np.dot for C-contiguous 2-D operands: np.dot and np.matmul give
    the same bits there (both BLAS; the kernel's premise, checked on this numpy); strided operands, where
    np.dot copies and np.matmul loops, stay np.matmul's, and the kernel's results are np.matmul's."""
    from onnx_mini.ops import fused
    r = np.random.default_rng(7)
    for m, k, n in [(m, k, n) for m in (1, 2, 5, 16) for k in (1, 2, 9, 33, 128) for n in (1, 3, 17, 64, 129)]:
        a, b = r.standard_normal((m, k)).astype(dtype), r.standard_normal((k, n)).astype(dtype)
        a[a > 1.2] = -0.0
        assert np.dot(a, b).tobytes() == np.matmul(a, b).tobytes(), (m, k, n)
        run = fused.fused_matmul(activation="", _constants={})
        bias = r.standard_normal((1, n)).astype(dtype)
        for x, w in ((a, b), (np.repeat(a, 2, axis=1)[:, ::2], b), (a, np.repeat(b, 2, axis=1)[:, ::2]),
                     (np.asfortranarray(a), b)):
            got = run(x, w, bias)
            assert got.tobytes() == (np.matmul(x, w) + bias).tobytes(), (m, k, n)


def test_rank_through_residual_adds_is_walked_once_per_value(monkeypatch):
    """Context.rank through broadcasting ops visits both inputs: over a chain of residual blocks
    (a = Add(Neg(a), a), 16 deep, ranks not declared) the walk was exponential (2^16 visits here; a
    transformer's residual network took minutes at the first run's re-plan). Each value's rank is kept
    until the graph changes: one visit per value."""
    from onnx_mini import loader
    from onnx_mini.optimize import _context
    nodes, prev = [], "x"
    for k in range(16):
        nodes += [helper.make_node("Neg", [prev], [f"n{k}"]), helper.make_node("Add", [f"n{k}", prev], [f"a{k}"])]
        prev = f"a{k}"
    nodes.append(helper.make_node("Relu", [prev], ["y"]))
    g = loader.load(model(nodes, [("x", F, [2, 3])], [("y", F, None)])).graph
    ctx = _context.Context(g, {"": 21})
    calls = []
    real = _context.Context._rank_rule
    monkeypatch.setattr(_context.Context, "_rank_rule", lambda self, *a: calls.append(1) or real(self, *a))
    assert ctx.rank(prev) == 2
    assert len(calls) <= 2 * len(nodes) + 1
    calls.clear()
    assert ctx.rank(prev) == 2 and not calls          # kept


def test_rank_through_a_chain_deeper_than_pythons_recursion_limit():
    """The rank walk keeps its own stack: a chain of 3000 elementwise ops (recursing, ~400 ran out of
    Python's stack and the whole optimisation was dropped with a warning) then a written-out HardSwish,
    which fires (its constants must not broadcast x to a larger rank: x's rank is needed)."""
    nodes, x = [], "x"
    for k in range(3000):
        nodes.append(helper.make_node("Add", [x, "one"], [f"a{k}"]))
        x = f"a{k}"
    nodes += _clip_swish_nodes(x=x)
    m = model(nodes, [("x", F, [2, 3])], [("y", F, None)], [const("one", [1.0])] + _clip_swish_inits())
    opt = onnx_mini.prepare(m)          # (the module's filter turns an OptimizationWarning into an error)
    assert steps(opt)[-1] == (FUSED, "ClipSwish") and len(steps(opt)) == 3001


# -- one-hot product: MatMul(Cast(Equal(A, C)), E) -> OneHotMatMul -----------------------------------

def _one_hot_model(c, e, a_shape, cast_to=F, extra_output=None, a_type=TensorProto.INT32, bias=None):
    nodes = [helper.make_node("Equal", ["a", "c"], ["eq"]), helper.make_node("Cast", ["eq"], ["h"], to=cast_to),
             helper.make_node("MatMul", ["h", "e"], ["p" if bias is not None else "y"])]
    inits = [init("c", c), init("e", e)]
    if bias is not None:            # a Dense layer's bias after the product (jax2tf's AddV2)
        nodes.append(helper.make_node("Add", ["p", "b"], ["y"]))
        inits.append(init("b", bias))
    outputs = [("y", F if cast_to == F else cast_to, None)] + ([(extra_output, TensorProto.BOOL, None)]
                                                             if extra_output else [])
    return model(nodes, [("a", a_type, a_shape)], outputs, inits, opset=13)


def _one_hot_table(e):
    """E with a few signed zeros, as the product (accumulated from +0) gives them: +0."""
    e = e.copy()
    e[0, 0], e[1, 2] = -0.0, 0.0
    return e


@pytest.mark.parametrize("values", ["arange", "scattered"])
def test_one_hot_product_gathers_rows(values):
    """jax2tf's one_hot + Dense (Magika): A [N, L, 1] against C [1, 1, K]; rows of E where A matches,
    zeros where it does not (values outside C); bit for bit the written ops' result (signed zeros too)."""
    k, d = 7, 5
    c = (np.arange(k) if values == "arange" else np.array([5, 3, 9, -2, 40, 0, 11])).astype(np.int32).reshape(1, 1, k)
    e = _one_hot_table(rand(k, d))
    a = np.array([[-3, 0, 1, 6, 7, 40], [11, 9, -2, 2, 100, 5]], np.int32).reshape(2, 6, 1)
    m = _one_hot_model(c, e, [2, 6, 1])
    opt = onnx_mini.prepare(m)
    assert steps(opt) == [(FUSED, "OneHotMatMul")]
    got, want = opt.run([a])[0], onnx_mini.prepare(m, optimize=False).run([a])[0]
    assert got.shape == want.shape == (2, 6, d) and got.dtype == want.dtype == np.float32
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    flat = c.reshape(-1).tolist()      # by hand: E's row where a value is in C, else zeros
    expect = np.array([e[flat.index(v)] + 0.0 if v in flat else np.zeros(d, np.float32) for v in a.reshape(-1)])
    np.testing.assert_array_equal(got.reshape(-1, d), expect)


@pytest.mark.parametrize("bias_shape", [(1, 1, 5), (5,), (1, 1)])
def test_one_hot_product_takes_the_bias_add_after_it(bias_shape):
    """Magika's Dense bias: Add(product, B) with B varying along the last axis alone joins the step (rows
    gathered from E + B; the misses B itself), bit for bit the written ops, with an infinity and a -0.0
    in B too; by hand: E's row + B where a value is in C, else 0 + B."""
    k, d = 7, 5
    c = np.array([5, 3, 9, -2, 40, 0, 11], np.int32).reshape(1, 1, k)
    e = _one_hot_table(rand(k, d))
    b = rand(*bias_shape)
    b.reshape(-1)[0] = -0.0
    if b.size > 1:
        b.reshape(-1)[1] = np.inf
    a = np.array([[-3, 0, 1, 6, 7, 40], [11, 9, -2, 2, 100, 5]], np.int32).reshape(2, 6, 1)
    m = _one_hot_model(c, e, [2, 6, 1], bias=b)
    opt = onnx_mini.prepare(m)
    assert steps(opt) == [(FUSED, "OneHotMatMul")]
    got, want = opt.run([a])[0], onnx_mini.prepare(m, optimize=False).run([a])[0]
    assert got.shape == want.shape == (2, 6, d)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    flat, row = c.reshape(-1).tolist(), np.broadcast_to(b.reshape(-1), (d,))
    expect = np.array([(e[flat.index(v)] + 0.0 if v in flat else np.zeros(d, np.float32)) + row
                       for v in a.reshape(-1)])
    np.testing.assert_array_equal(got.reshape(-1, d), expect)


@pytest.mark.parametrize("bias_shape", [(2, 1, 5), (1, 1, 1, 5)])
def test_one_hot_product_leaves_other_adds(bias_shape):
    """A B varying along another axis stays an Add; a B of a higher rank than the product joins but takes
    the written ops at run time (the Add raises the rank): the written ops' values and shapes either way."""
    k, d = 4, 5
    c = np.arange(k, dtype=np.int32).reshape(1, 1, k)
    e = rand(k, d)
    m = _one_hot_model(c, e, [2, 3, 1], bias=rand(*bias_shape))
    opt, raw = onnx_mini.prepare(m), onnx_mini.prepare(m, optimize=False)
    assert (("", "Add") in steps(opt)) == (bias_shape[0] == 2)
    a = np.array([[0, 3, 9], [1, 2, 2]], np.int32).reshape(2, 3, 1)
    got, want = opt.run([a])[0], raw.run([a])[0]
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_one_hot_product_other_shapes_take_the_written_ops():
    """A whose last axis is not 1 (an elementwise Equal, no one-hot) and A of lower rank than C: the
    written ops' values and shapes."""
    k, d = 4, 3
    c = np.arange(k, dtype=np.int64).reshape(1, 1, k)
    e = rand(k, d, dtype=np.float64)
    m = _one_hot_model(c, e, None, cast_to=TensorProto.DOUBLE, a_type=TensorProto.INT64)
    opt, raw = onnx_mini.prepare(m), onnx_mini.prepare(m, optimize=False)
    assert steps(opt) == [(FUSED, "OneHotMatMul")]
    for a in (np.array([[0, 3, 2, 9], [1, 1, 0, 2]], np.int64),      # [2, 4]: compared element by element
              np.array([[2], [0], [5]], np.int64),                      # [3, 1]: one-hot, the product [1, 3, 3]
              np.array([3], np.int64)):
        got, want = opt.run([a])[0], raw.run([a])[0]
        assert got.shape == want.shape and got.dtype == want.dtype == np.float64
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("case", ["infinite_weight", "repeated_value", "cast_to_int", "one_hot_read_elsewhere",
                                  "float_values"])
def test_one_hot_product_left_alone(case):
    """E not finite (0 * inf is NaN in the product), C with a repeated value (two ones in a row), a Cast
    to another type than E's, the one-hot read by another node, or C of floats: the nodes stay."""
    k, d = 4, 3
    c = np.arange(k, dtype=np.int32).reshape(1, k)
    e = rand(k, d)
    kw = {}
    if case == "infinite_weight":
        e[2, 1] = np.inf
    elif case == "repeated_value":
        c = np.array([[0, 1, 1, 3]], np.int32)
    elif case == "cast_to_int":
        kw["cast_to"] = TensorProto.INT32
        e = np.arange(k * d, dtype=np.int32).reshape(k, d)
    elif case == "one_hot_read_elsewhere":
        kw["extra_output"] = "eq"
    else:
        c = c.astype(np.float32)
        kw["a_type"] = F
    m = _one_hot_model(c, e, [5, 1], **kw)
    opt = onnx_mini.prepare(m)
    assert (FUSED, "OneHotMatMul") not in steps(opt)
    a = np.array([[0], [3], [1], [7], [2]], c.dtype)
    for g, r in zip(opt.run([a]), onnx_mini.prepare(m, optimize=False).run([a])):
        np.testing.assert_array_equal(g, r)
