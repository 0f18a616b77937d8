"""The operator facts the @kernel decorators declare (foldable, heavy, in_place, views), read from the
registered table, and the factories serving several versions through `_version`: each version still
accepts exactly its own attributes."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as T

from onnx_mini import catalog
from onnx_mini.errors import InvalidNodeError

from helpers import NODE, run_node

SPECS = catalog.registered()
F32 = np.float32


def specs_of(op: str, domain: str = "") -> dict:
    """{version: KernelSpec} of every registered version of (domain, op)."""
    return {v: s for (d, o, v), s in SPECS.items() if d == domain and o == op}


# -- foldable ------------------------------------------------------------------------------------

NOT_FOLDABLE = ("RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                "Bernoulli", "Dropout")


@pytest.mark.parametrize("op", NOT_FOLDABLE)
def test_random_ops_are_not_foldable(op):
    specs = specs_of(op)
    assert specs
    assert all(not s.foldable for s in specs.values()), sorted(specs)


def test_everything_else_is_foldable():
    assert sorted({o for (_, o, _), s in SPECS.items() if not s.foldable}) == sorted(NOT_FOLDABLE)


# -- heavy ---------------------------------------------------------------------------------------

HEAVY = {"Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "DeformConv", "MatMul", "Gemm", "MatMulInteger",
         "QLinearMatMul", "MaxPool", "AveragePool", "LpPool", "LSTM", "GRU", "RNN", "Attention", "MultiHeadAttention",
         "Einsum", "Resize", "NhwcConv", "FusedConv", "FusedMatMul", "Col2Im"}
# in files other people were editing when these facts were declared (conv, fused, quantized kernels)
HEAVY_ELSEWHERE = {"ops.nn.conv", "ops.fused", "ops.contrib.qlinear", "ops.contrib.quantized_matmul",
                   "ops.nn.conv_quantized"}


def _declared_here(spec) -> bool:
    module = spec.factory.__module__
    return not any(module == f"onnx_mini.{m}" or module.startswith(f"onnx_mini.{m}.") for m in HEAVY_ELSEWHERE)


def test_heavy_ops_in_every_domain():
    missing = sorted(k for k, s in SPECS.items() if k[1] in HEAVY and _declared_here(s) and not s.heavy)
    assert not missing


@pytest.mark.parametrize("key", [("", "LSTM", 22), ("", "LSTM", 1), ("", "MatMul", 13), ("", "Gemm", 6),
                                 ("", "Attention", 24), ("com.microsoft", "Attention", 1),
                                 ("com.microsoft", "MultiHeadAttention", 1), ("com.microsoft", "FusedMatMul", 1),
                                 ("", "ConvTranspose", 1), ("", "Resize", 19), ("", "Col2Im", 18)])
def test_heavy_examples(key):
    assert SPECS[key].heavy


@pytest.mark.parametrize("op", ["Add", "Relu", "Reshape", "Softmax", "Concat"])
def test_light_examples(op):
    assert not any(s.heavy for s in specs_of(op).values())


# -- in_place ------------------------------------------------------------------------------------

IN_PLACE_BINARY = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}
IN_PLACE_UNARY = {"Neg": np.negative, "Tanh": np.tanh, "Exp": np.exp, "Abs": np.abs, "Sqrt": np.sqrt}
IN_PLACE_VERSIONS = {**{op: (7, 13, 14) for op in IN_PLACE_BINARY}, "Relu": (6, 13, 14),
                     **{op: (6, 13) for op in IN_PLACE_UNARY}}


def test_in_place_exactly_at_the_listed_versions():
    declared = {(o, v) for (d, o, v), s in SPECS.items() if s.in_place is not None}
    assert all(d == "" for (d, _, _), s in SPECS.items() if s.in_place is not None)
    assert declared == {(op, v) for op, versions in IN_PLACE_VERSIONS.items() for v in versions}


@pytest.mark.parametrize("op,ufunc", [*IN_PLACE_BINARY.items(), *IN_PLACE_UNARY.items()])
def test_in_place_ufuncs(op, ufunc):
    for v in IN_PLACE_VERSIONS[op]:
        assert SPECS[("", op, v)].in_place is ufunc


def test_no_in_place_on_legacy_versions():
    assert SPECS[("", "Add", 6)].in_place is None
    assert SPECS[("", "Add", 1)].in_place is None
    assert SPECS[("", "Relu", 1)].in_place is None
    assert SPECS[("", "Neg", 1)].in_place is None


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("op", sorted(IN_PLACE_VERSIONS))
def test_in_place_computes_the_kernel_result(op, dtype):
    # f(*inputs, out=buffer) writes exactly what the kernel returns, broadcasting included
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 2048)).astype(dtype)     # large enough for with_scalar's fast path
    a[0, :4] = [np.nan, -0.0, np.inf, -np.inf]
    b = rng.standard_normal((2048,)).astype(dtype)
    inputs = [a, b] if op in IN_PLACE_BINARY else [np.abs(a) if op == "Sqrt" else a]
    version = IN_PLACE_VERSIONS[op][-1]
    expected = run_node(op, version, inputs)
    buffer = inputs[0].copy()
    got = SPECS[("", op, version)].in_place(*[buffer, *inputs[1:]], out=buffer)
    assert got is buffer
    np.testing.assert_array_equal(buffer, expected)
    assert buffer.dtype == expected.dtype


# -- views ---------------------------------------------------------------------------------------

VIEWS = ("Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Transpose", "Slice", "Expand", "Optional",
         "OptionalGetElement", "Dropout", "Split", "Tile", "Pad", "CenterCropPad", "Cast", "CastLike", "BitCast",
         "Clip", "Max", "Min", "Sum", "Mean", "Einsum", "MaxPool", "Resize", "StringNormalizer")


@pytest.mark.parametrize("op", VIEWS)
def test_view_ops(op):
    specs = specs_of(op)
    assert specs and all(s.views for s in specs.values()), sorted(v for v, s in specs.items() if not s.views)


@pytest.mark.parametrize("op", ["Add", "Relu", "MatMul", "Concat", "Shape", "AveragePool", "ReduceL2"])
def test_not_view_ops(op):
    assert not any(s.views for s in specs_of(op).values())


def test_no_op_reductions_are_views_only_with_axes_as_input():
    # noop_with_empty_axes (axes as an input) returns the input itself for the reductions without a
    # per-element step
    assert SPECS[("", "ReduceSum", 13)].views and not SPECS[("", "ReduceSum", 11)].views
    assert SPECS[("", "ReduceMax", 20)].views and not SPECS[("", "ReduceL1", 18)].views


@pytest.mark.parametrize("op,version,inputs,attrs", [
    ("Reshape", 21, [np.ones((2, 3), F32), np.array([3, 2], np.int64)], {}),
    ("Transpose", 21, [np.ones((2, 3), F32)], {}),
    ("Slice", 13, [np.ones((4,), F32), np.array([1], np.int64), np.array([3], np.int64)], {}),
    ("Split", 18, [np.ones((4,), F32)], dict(num_outputs=2)),
    ("Cast", 21, [np.ones(2, F32)], dict(to=T.FLOAT)),
    ("Clip", 13, [np.ones(2, F32)], {}),
    ("Sum", 13, [np.ones(2, F32)], {}),
    ("ReduceSum", 13, [np.ones(2, F32), np.array([], np.int64)], dict(noop_with_empty_axes=1)),
    ("Pad", 21, [np.ones(4, F32), np.array([-1, -1], np.int64)], {}),
    ("MaxPool", 22, [np.ones((1, 1, 4, 4), F32)], dict(kernel_shape=[1, 1], strides=[2, 2])),
])
def test_view_ops_do_return_views(op, version, inputs, attrs):
    # runs whose result shares the input's memory: the kernel serving them declares views
    assert SPECS[("", op, max(v for v in specs_of(op) if v <= version))].views
    n = attrs.get("num_outputs", 1)
    out = run_node(op, version, inputs, n_outputs=n, **attrs)
    assert np.shares_memory(out[0] if n > 1 else out, inputs[0])


# -- one factory for several versions (_version) -------------------------------------------------

@pytest.mark.parametrize("op,versions", [
    ("RandomNormal", (1, 22)), ("RandomUniformLike", (1, 22)), ("Multinomial", (7, 22)), ("Bernoulli", (15, 22)),
    ("ConstantOfShape", (9, 20, 21, 23, 24, 25)), ("EyeLike", (9, 22)), ("Cast", (1, 6, 9, 13)),
    ("Cast", (19, 21, 23)), ("Cast", (24, 25, 28)), ("CastLike", (19, 21, 23)), ("Attention", (23, 24)),
    ("QuantizeLinear", (23, 24, 25, 28)), ("DequantizeLinear", (13, 19)), ("DequantizeLinear", (23, 24, 25, 28)),
    ("Mod", (10, 13, 28)), ("OneHot", (9, 11, 28)), ("Pad", (18, 19, 21)), ("ScatterElements", (16, 18)),
    ("ScatterND", (16, 18)), ("Dropout", (7, 10)), ("ConvTranspose", (1, 11, 22)), ("Split", (1, 2, 11)),
])
def test_merged_factories(op, versions):
    specs = [SPECS[("", op, v)] for v in versions]
    assert len({s.factory for s in specs}) == 1
    assert len({s.attributes for s in specs}) == 1


@pytest.mark.parametrize("op", ["RandomNormal", "ConstantOfShape", "EyeLike", "Cast", "CastLike", "Attention",
                                "QuantizeLinear", "DequantizeLinear", "Mod", "OneHot", "BitCast",
                                "MelWeightMatrix"])
def test_version_is_injected(op):
    assert all("_version" in s.injected for s in specs_of(op).values())



@pytest.mark.parametrize("op,version,inputs,attrs", [
    # an attribute a later version of the op defines, given at an earlier opset
    ("Cast", 13, [np.ones(2, F32)], dict(to=T.FLOAT16, saturate=1)),
    ("Cast", 23, [np.ones(2, F32)], dict(to=T.FLOAT16, round_mode="up")),
    ("CastLike", 15, [np.ones(2, F32), np.ones(1, np.float16)], dict(saturate=1)),
    ("CastLike", 23, [np.ones(2, F32), np.ones(1, np.float16)], dict(round_mode="up")),
    ("DequantizeLinear", 19, [np.ones(2, np.uint8), np.array(2, F32)], dict(block_size=0)),
    ("DequantizeLinear", 21, [np.ones(2, np.uint8), np.array(2, F32)], dict(output_dtype=T.FLOAT)),
    ("QuantizeLinear", 21, [np.ones(2, F32), np.array(2, F32)], dict(precision=T.FLOAT)),
    ("Attention", 24, [np.ones((1, 2, 3, 4), F32)] * 3, dict(left_window_size=1)),
    ("EyeLike", 9, [np.ones((2, 2), F32)], dict(seed=1.0)),
    ("Pad", 18, [np.ones(2, F32), np.array([1, 1], np.int64)], dict(value=0.0)),
])
def test_merged_factories_reject_later_attributes(op, version, inputs, attrs):
    with pytest.raises(InvalidNodeError, match=f"{NODE}.*{next(iter(attrs))}"):
        run_node(op, version, inputs, **attrs)


@pytest.mark.parametrize("version,expected", [(10, "fmod"), (28, None)])
def test_mod_float_needs_fmod_before_28(version, expected):
    a, b = np.array([5.0, -5.0], F32), np.array([3.0, 3.0], F32)
    if expected:
        with pytest.raises(Exception, match="fmod"):
            run_node("Mod", version, [a, b])
    else:
        np.testing.assert_array_equal(run_node("Mod", version, [a, b]), np.array([2.0, 1.0], F32))


@pytest.mark.parametrize("version,expected", [(9, [0, 0, 0]), (11, [0, 0, 1])])
def test_one_hot_negative_indices_from_11(version, expected):
    out = run_node("OneHot", version, [np.array([-1], np.int64), np.array(3, np.int64), np.array([0, 1], F32)])
    np.testing.assert_array_equal(out, np.array([expected], F32))


@pytest.mark.parametrize("version,ok", [(18, False), (19, True)])
def test_pad_wrap_from_19(version, ok):
    inputs = [np.arange(3, dtype=F32), np.array([1, 1], np.int64)]
    if ok:
        np.testing.assert_array_equal(run_node("Pad", version, inputs, mode="wrap"), np.array([2, 0, 1, 2, 0], F32))
    else:
        with pytest.raises(InvalidNodeError, match="wrap"):
            run_node("Pad", version, inputs, mode="wrap")


@pytest.mark.parametrize("version,ok", [(16, False), (18, True)])
def test_scatter_max_from_18(version, ok):
    inputs = [np.zeros(3, F32), np.array([1], np.int64), np.array([5.0], F32)]
    if ok:
        np.testing.assert_array_equal(run_node("ScatterElements", version, inputs, reduction="max"),
                                      np.array([0, 5, 0], F32))
    else:
        with pytest.raises(InvalidNodeError, match="reduction"):
            run_node("ScatterElements", version, inputs, reduction="max")


@pytest.mark.parametrize("version,mask_type", [(7, np.float32), (10, np.bool_)])
def test_dropout_mask_type(version, mask_type):
    x = np.ones(3, F32)
    y, mask = run_node("Dropout", version, [x], n_outputs=2)
    np.testing.assert_array_equal(y, x)
    assert mask.dtype == mask_type and mask.all()


# -- rank: what the optimiser may assume of an output's rank (optimize/_context.Context.rank) --------

RANK_FIRST = {"Relu", "LeakyRelu", "Sigmoid", "Tanh", "Clip", "HardSigmoid", "HardSwish", "Elu", "Selu", "Dropout",
              "Identity", "Cast", "BatchNormalization", "InstanceNormalization", "LRN", "MaxPool", "AveragePool",
              "LpPool", "GlobalAveragePool", "GlobalMaxPool", "Concat", "Softmax", "LayerNormalization", "Swish",
              "Gelu", "Neg", "Exp", "Sqrt", "Abs", "Erf", "PRelu", "Slice", "Transpose"}
RANK_BROADCAST = {"Add", "Sub", "Mul", "Div", "Sum", "Max", "Min"}
RANK_AXES = {"Squeeze": "squeeze", "Unsqueeze": "unsqueeze"}


def test_rank_facts_of_the_default_domain():
    """Every version of each listed op declares its rule; no other default-domain op declares one."""
    declared = {(op, v): spec.rank for (d, op, v), spec in SPECS.items() if d == ""}
    for (op, v), rank in declared.items():
        want = "first" if op in RANK_FIRST else "broadcast" if op in RANK_BROADCAST else RANK_AXES.get(op)
        assert rank == want, (op, v, rank)
    assert {op for op, _ in declared} >= RANK_FIRST | RANK_BROADCAST | set(RANK_AXES)


def test_rank_fact_drives_the_optimiser():
    """Context.rank follows a rank-keeping chain (Relu, Add) from a declared input, and stops at an op
    without the fact (Mean: its output rank is not assumed)."""
    from onnx import helper

    from onnx_mini.loader import load
    from onnx_mini.optimize._context import Context
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "x"], ["a"]),
             helper.make_node("Mean", ["a"], ["m"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [2, 3, 4])],
                          [helper.make_tensor_value_info("m", T.FLOAT, None)])
    m = load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10))
    ctx = Context(m.graph, m.opsets)
    assert (ctx.rank("r"), ctx.rank("a"), ctx.rank("m")) == (3, 3, None)


@pytest.mark.parametrize("version", [11, 13])
def test_rank_facts_of_squeeze_and_unsqueeze(version):
    """Squeeze / Unsqueeze: the input's rank less / plus the number of axes (the attribute before opset
    13, a constant input from 13 on); Squeeze without axes: unknown (it drops every axis of size 1)."""
    from onnx import helper, numpy_helper

    from onnx_mini.loader import load
    from onnx_mini.optimize._context import Context

    def axes_of(op, values, out):
        if version < 13:
            return helper.make_node(op, ["x"], [out], axes=values)
        return helper.make_node(op, ["x", out + "_axes"], [out])
    nodes = [axes_of("Squeeze", [1], "s"), axes_of("Unsqueeze", [0, 4], "u"), helper.make_node("Squeeze", ["x"], ["n"])]
    inits = [] if version < 13 else [numpy_helper.from_array(np.array(v, np.int64), n)
                                     for v, n in (([1], "s_axes"), ([0, 4], "u_axes"))]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [2, 1, 4])],
                          [helper.make_tensor_value_info(o, T.FLOAT, None) for o in ("s", "u", "n")], inits)
    m = load(helper.make_model(g, opset_imports=[helper.make_opsetid("", version)], ir_version=7))
    ctx = Context(m.graph, m.opsets)
    assert (ctx.rank("s"), ctx.rank("u"), ctx.rank("n")) == (2, 5, None)
