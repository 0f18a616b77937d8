"""Hostile models: one named regression test per bug the fuzzer (test_fuzz.py) found, and the resource
guards on tensors whose size comes from data. Every failure must be an OnnxMiniError with a message."""
import pickle

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_mini
from onnx_mini import dtypes, loader
from onnx_mini.errors import (GraphError, InvalidNodeError, KernelError, ModelLoadError, OnnxMiniError,
                              ResourceLimitError)

from helpers import F, I64, REPO, model


@pytest.fixture
def small_limit():
    """A 1 MiB cap on any tensor a model makes onnx_mini allocate, restored afterwards."""
    previous = dtypes.set_limits(max_tensor_bytes=1 << 20)
    yield 1 << 20
    dtypes.set_limits(**previous)


def _one_node(op, inputs, *, initializers=(), opset=21, **attrs):
    node = helper.make_node(op, [n for n, _, _ in inputs] + [t.name for t in initializers], ["y"], name="guarded",
                            **attrs)
    return model([node], inputs, [("y", F, None)], initializers, opset=opset)


def _declared(name, dims):
    t = TensorProto()
    t.name, t.data_type = name, TensorProto.FLOAT
    t.dims.extend(dims)
    return t


def _rename_bytes(m: onnx.ModelProto, name: str, bad: bytes) -> bytes:
    data = m.SerializeToString()
    assert data.count(name.encode()) >= 1 and len(bad) == len(name.encode())
    return data.replace(name.encode(), bad)


# -- found by the fuzzer ----------------------------------------------------------------------------

def test_non_utf8_op_type_is_a_load_error():
    # fuzz case 158: protobuf hands back bytes for a non-UTF-8 string; onnx.defs then raised TypeError
    m = model([helper.make_node("Relu", ["x"], ["y"])], [("x", F, [2])], [("y", F, [2])])
    with pytest.raises(ModelLoadError, match="op_type b'\\\\xff\\\\xfe\\\\x80\\\\x80' is not valid UTF-8"):
        onnx_mini.prepare(_rename_bytes(m, "Relu", b"\xff\xfe\x80\x80"))


@pytest.mark.parametrize("name", ["xname", "yname"])
def test_non_utf8_value_names_are_load_errors(name):
    m = model([helper.make_node("Relu", ["xname"], ["yname"])], [("xname", F, [2])], [("yname", F, [2])])
    with pytest.raises(ModelLoadError, match="is not valid UTF-8"):
        onnx_mini.prepare(_rename_bytes(m, name, b"\xff" * 5))


@pytest.mark.parametrize("version", [0, -5, 2**40, 2**62])
def test_opset_version_out_of_range_is_a_load_error(version):
    # fuzz case 446: an opset of 2**62 overflowed onnx.defs.get_schema's C int (TypeError)
    m = model([helper.make_node("Relu", ["x"], ["y"])], [("x", F, [2])], [("y", F, [2])])
    m.opset_import[0].version = version
    with pytest.raises(ModelLoadError, match=f"version {version}, not a valid opset"):
        onnx_mini.prepare(m)


def test_tile_with_absurd_repeats_fails_fast(small_limit):
    # fuzz cases 1750, 9798, 18862: Tile/Expand/ConstantOfShape with 2**20.. sizes ran for minutes
    m = _one_node("Tile", [("x", F, [2, 3]), ("reps", I64, [2])])
    with pytest.raises(KernelError, match="'guarded'.*over the limit of 1,048,576 bytes"):
        onnx_mini.prepare(m).run([np.ones((2, 3), np.float32), np.array([1 << 20, 1 << 20], np.int64)])


@pytest.mark.parametrize("inputs,message", [
    ([("x", F, [2])], "1 input\\(s\\) given, the operator takes 2"),             # MatMul missing B
    ([("x", F, [2]), ("x", F, [2]), ("x", F, [2])], "3 input\\(s\\) given"),      # one too many
])
def test_wrong_input_count_is_an_invalid_node(inputs, message):
    # fuzz: dropped/extra node inputs reached the kernel as a TypeError (missing positional argument)
    node = helper.make_node("Add", [n for n, _, _ in inputs], ["y"], name="arity")
    m = model([node], inputs[:1], [("y", F, None)])
    with pytest.raises(InvalidNodeError, match=f"'arity'.*{message}"):
        onnx_mini.prepare(m, optimize=False)


def test_required_input_left_empty_is_an_invalid_node():
    # fuzz: an input renamed to "" arrived as None (AttributeError: 'NoneType' has no attribute 'dtype')
    m = model([helper.make_node("Gather", ["", "i"], ["y"], name="empty")], [("i", I64, [1])], [("y", F, None)])
    with pytest.raises(InvalidNodeError, match="'empty'.*required input\\(s\\) #0 left empty"):
        onnx_mini.prepare(m, optimize=False)


def test_too_many_outputs_is_an_invalid_node():
    m = model([helper.make_node("Relu", ["x"], ["y", "z"], name="two")], [("x", F, [2])], [("y", F, [2])])
    with pytest.raises(InvalidNodeError, match="'two'.*2 output\\(s\\) given, the operator has 1"):
        onnx_mini.prepare(m, optimize=False)


def test_sparse_initializer_with_out_of_range_indices():
    for idx in ([1, 6], [-1, 0]):   # past the end, and negative (numpy would wrap it silently)
        m = model([helper.make_node("Identity", ["s"], ["y"])], [], [("y", F, [2, 3])])
        m.graph.sparse_initializer.append(helper.make_sparse_tensor(
            numpy_helper.from_array(np.array([5, 7], np.float32), "s"),
            numpy_helper.from_array(np.array(idx, np.int64)), [2, 3]))
        with pytest.raises(ModelLoadError, match="index is out of range"):
            onnx_mini.prepare(m)


def test_sparse_initializer_with_mismatched_indices():
    m = model([helper.make_node("Identity", ["s"], ["y"])], [], [("y", F, [2, 3])])
    m.graph.sparse_initializer.append(helper.make_sparse_tensor(
        numpy_helper.from_array(np.array([5, 7], np.float32), "s"),
        numpy_helper.from_array(np.array([1, 2, 3], np.int64)), [2, 3]))
    with pytest.raises(ModelLoadError, match="do not fit 2 values"):
        onnx_mini.prepare(m)


def test_huge_declared_initializer_is_refused_before_allocation(small_limit):
    t = _declared("w", [1 << 20, 1 << 20])          # 4 TiB declared, nothing stored
    m = model([helper.make_node("Identity", ["w"], ["y"])], [], [("y", F, None)], [t])
    with pytest.raises(ModelLoadError, match="over the limit"):
        onnx_mini.prepare(m)
    m.graph.ClearField("initializer")
    m.graph.sparse_initializer.append(helper.make_sparse_tensor(    # a sparse one's dense shape too
        numpy_helper.from_array(np.array([1], np.float32), "w"), numpy_helper.from_array(np.array([0], np.int64)),
        [1 << 30, 1 << 30]))
    with pytest.raises(ModelLoadError, match="over the limit"):
        onnx_mini.prepare(m)


def test_negative_dims_are_a_load_error():
    t = _declared("w", [2, -1])
    m = model([helper.make_node("Identity", ["w"], ["y"])], [], [("y", F, None)], [t])
    with pytest.raises(ModelLoadError, match="negative dimensions"):
        onnx_mini.prepare(m)


def test_bool_raw_data_other_than_0_1_reads_as_true():
    t = helper.make_tensor("b", TensorProto.BOOL, [3], b"\x00\x01\x07", raw=True)
    np.testing.assert_array_equal(dtypes.tensor_to_array(t).view(np.uint8), [0, 1, 1])


def test_self_referencing_function_is_an_invalid_node():
    fn = helper.make_function("rec", "Rec", ["a"], ["b"], [helper.make_node("Rec", ["a"], ["b"], domain="rec")],
                              [helper.make_opsetid("", 21), helper.make_opsetid("rec", 1)])
    m = model([helper.make_node("Rec", ["x"], ["y"], domain="rec")], [("x", F, [2])], [("y", F, [2])],
              opset=[helper.make_opsetid("", 21), helper.make_opsetid("rec", 1)], functions=[fn])
    with pytest.raises(InvalidNodeError, match="nest too deeply"):
        onnx_mini.prepare(m)


def test_subgraph_reading_an_undefined_value_is_a_graph_error():
    branch = helper.make_graph([helper.make_node("Identity", ["nowhere"], ["o"])], "b", [],
                               [helper.make_tensor_value_info("o", F, None)])
    m = model([helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch, name="if")],
              [("c", TensorProto.BOOL, [])], [("y", F, None)])
    with pytest.raises(GraphError, match="nowhere"):
        onnx_mini.prepare(m)


def test_cycle_is_a_graph_error():
    m = model([helper.make_node("Relu", ["b"], ["a"], name="n1"), helper.make_node("Relu", ["a"], ["b"], name="n2")],
              [], [("b", F, None)])
    with pytest.raises(GraphError, match="cycle"):
        onnx_mini.prepare(m)


@pytest.mark.parametrize("data", [b"\x08" + b"\xff" * 10, b"\x12\xff\xff\xff\xff\x0f", b"", b"\x00"])
def test_truncated_and_garbage_bytes(data):
    with pytest.raises(ModelLoadError):
        onnx_mini.prepare(data)


@pytest.mark.parametrize("ir", [0, 2**40, 2**63 - 1])
def test_absurd_ir_versions(ir):
    m = model([helper.make_node("Relu", ["x"], ["y"])], [("x", F, [2])], [("y", F, [2])])
    m.ir_version = ir
    with pytest.raises(ModelLoadError, match="IR version"):
        onnx_mini.prepare(m)


# -- resource guards: sizes computed from data ------------------------------------------------------

HUGE = np.array([1 << 20, 1 << 20], np.int64)


@pytest.mark.parametrize("op,inputs,feeds,attrs", [
    ("ConstantOfShape", [("s", I64, [2])], [HUGE], {}),
    ("Expand", [("x", F, [1, 1]), ("s", I64, [2])], [np.ones((1, 1), np.float32), HUGE], {}),
    ("Tile", [("x", F, [1, 1]), ("s", I64, [2])], [np.ones((1, 1), np.float32), HUGE], {}),
    ("Range", [("a", F, []), ("b", F, []), ("d", F, [])],
     [np.array(0, np.float32), np.array(1e12, np.float32), np.array(1, np.float32)], {}),
    ("Range", [("a", I64, []), ("b", I64, []), ("d", I64, [])],
     [np.array(0), np.array(1 << 40), np.array(1)], {}),
    ("Pad", [("x", F, [1, 1]), ("p", I64, [4])], [np.ones((1, 1), np.float32), np.array([0, 0, 1 << 20, 1 << 20])],
     {}),
    ("Pad", [("x", F, [1, 1]), ("p", I64, [4])], [np.ones((1, 1), np.float32), np.array([0, 0, 1 << 20, 1 << 20])],
     {"mode": "edge"}),
    ("OneHot", [("i", I64, [2]), ("d", I64, []), ("v", F, [2])],
     [np.array([0, 1]), np.array(1 << 40), np.array([0, 1], np.float32)], {}),
    ("Resize", [("x", F, [1, 1]), ("r", F, [0]), ("sc", F, [2])],
     [np.ones((1, 1), np.float32), np.zeros(0, np.float32), np.array([1e6, 1e6], np.float32)], {}),
    ("CenterCropPad", [("x", F, [1, 1]), ("s", I64, [2])], [np.ones((1, 1), np.float32), HUGE], {}),
    ("Col2Im", [("x", F, [1, 1, 1]), ("i", I64, [2]), ("b", I64, [2])],
     [np.ones((1, 1, 1), np.float32), HUGE, np.array([1, 1])], {"strides": [1 << 20, 1 << 20]}),
])
def test_allocation_from_data_is_limited(small_limit, op, inputs, feeds, attrs):
    m = _one_node(op, inputs, **attrs)
    rep = onnx_mini.prepare(m)
    with pytest.raises(KernelError, match=f"'guarded' \\({op}.*over the limit of 1,048,576 bytes") as info:
        rep.run(feeds)
    assert isinstance(info.value.__cause__, ResourceLimitError)


def test_eye_like_is_limited(small_limit):
    # EyeLike allocates its input's (2-D) shape: an Expand view of 2**20 x 2**20 costs nothing, the eye 8 TiB
    m = model([helper.make_node("ConstantOfShape", ["s"], ["z"]), helper.make_node("EyeLike", ["z"], ["y"], name="eye")],
              [("s", I64, [2])], [("y", F, None)])
    with pytest.raises(KernelError, match="over the limit"):
        onnx_mini.prepare(m).run([np.array([2000, 2000])])


@pytest.mark.parametrize("op", ["RandomNormal", "RandomUniform"])
def test_random_shape_attribute_is_limited_at_prepare(small_limit, op):
    m = model([helper.make_node(op, [], ["y"], shape=[1 << 20, 1 << 20], name="rnd")], [], [("y", F, None)])
    with pytest.raises(InvalidNodeError, match="'rnd'.*over the limit"):
        onnx_mini.prepare(m)


def test_sizes_under_the_limit_still_work(small_limit):
    m = _one_node("ConstantOfShape", [("s", I64, [2])])
    (y,) = onnx_mini.prepare(m).run([np.array([256, 256])])      # 256 KiB of float32
    assert y.shape == (256, 256) and not y.any()


def test_set_limits_returns_previous_and_zero_restores_default():
    before = dtypes.get_limits()
    previous = dtypes.set_limits(max_tensor_bytes=123)
    assert previous == before and dtypes.get_limits()["max_tensor_bytes"] == 123
    dtypes.set_limits(max_tensor_bytes=0)
    assert dtypes.get_limits()["max_tensor_bytes"] == dtypes.DEFAULT_MAX_TENSOR_BYTES
    dtypes.set_limits(**previous)
    assert dtypes.get_limits() == before
    assert 1 << 30 <= dtypes.DEFAULT_MAX_TENSOR_BYTES <= 16 << 30
    with pytest.raises(ValueError):
        dtypes.set_limits(max_tensor_bytes=-1)


def test_every_error_here_is_an_onnx_mini_error():
    assert issubclass(ResourceLimitError, OnnxMiniError) and issubclass(ModelLoadError, OnnxMiniError)
    assert loader.MMAP_THRESHOLD >= 1 << 16


def test_security_md_example_runs():
    import pathlib
    import re
    text = (REPO / "SECURITY.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks
    before = dtypes.get_limits()
    for block in blocks:
        exec(compile(block, "SECURITY.md", "exec"), {})
    assert dtypes.get_limits() == before


@pytest.mark.parametrize("value", [[1, 2], 1.5, "1", numpy_helper.from_array(np.zeros(1, np.float32))])
def test_attribute_of_the_wrong_type_is_an_invalid_node(value):
    # fuzz cases 715, 3788, 11748: Concat/GatherElements/Shape got a list or float for an INT attribute
    # and failed inside the kernel (TypeError: slice indices must be integers...)
    m = model([helper.make_node("Concat", ["x", "x"], ["y"], name="cat", axis=value)], [("x", F, [2])],
              [("y", F, None)])
    with pytest.raises(InvalidNodeError, match="'cat'.*attribute 'axis' must be of type INT"):
        onnx_mini.prepare(m)


def test_int_for_a_float_attribute_is_accepted():
    m = model([helper.make_node("LeakyRelu", ["x"], ["y"], alpha=1)], [("x", F, [2])], [("y", F, [2])])
    np.testing.assert_array_equal(onnx_mini.prepare(m).run([np.array([-1, 2], np.float32)])[0], [-1, 2])


def test_variadic_input_left_empty_is_an_invalid_node():
    # fuzz case 16851: Concat(x, "") passed None to the kernel (AttributeError)
    m = model([helper.make_node("Concat", ["x", ""], ["y"], name="cat", axis=0)], [("x", F, [2])], [("y", F, None)])
    with pytest.raises(InvalidNodeError, match="'cat'.*required input\\(s\\) #1 left empty \\(inputs\\)"):
        onnx_mini.prepare(m)


# -- Loop iteration cap ----------------------------------------------------------------------------

@pytest.fixture
def loop_cap():
    previous = dtypes.set_limits(max_loop_iterations=1000)
    yield 1000
    dtypes.set_limits(**previous)


def _forever_loop(with_trip_count: bool):
    """A Loop whose body passes its condition through (always true) and counts in a carried value."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["c_out"]), helper.make_node("Add", ["n", "one"], ["n_out"])],
        "body", [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("n", I64, [])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []), helper.make_tensor_value_info("n_out", I64, [])])
    inits = [numpy_helper.from_array(np.array(True), "t"), numpy_helper.from_array(np.array(1, np.int64), "one"),
             numpy_helper.from_array(np.array(0, np.int64), "zero")]
    if with_trip_count:
        inputs = [("m", I64, [])]
        loop_inputs = ["m", "t", "zero"]
    else:
        inputs = []
        loop_inputs = ["", "t", "zero"]
    node = helper.make_node("Loop", loop_inputs, ["count"], body=body, name="forever")
    return model([node], inputs, [("count", I64, [])], inits)


@pytest.mark.parametrize("with_trip_count", [False, True])
def test_unbounded_loop_stops_at_the_iteration_cap(loop_cap, with_trip_count):
    rep = onnx_mini.prepare(_forever_loop(with_trip_count))
    feeds = [np.array(np.iinfo(np.int64).max)] if with_trip_count else []
    with pytest.raises(KernelError, match="'forever'.*after 1,000 iterations.*max_loop_iterations") as info:
        rep.run(feeds)
    assert isinstance(info.value.__cause__, ResourceLimitError)


def test_loop_under_the_cap_runs_to_its_trip_count(loop_cap):
    (count,) = onnx_mini.prepare(_forever_loop(True)).run([np.array(1000)])   # exactly the cap: allowed
    assert count == 1000


def test_loop_cap_default_and_restore():
    assert dtypes.get_limits()["max_loop_iterations"] == dtypes.DEFAULT_MAX_LOOP_ITERATIONS == 10**7
    previous = dtypes.set_limits(max_loop_iterations=5)
    assert dtypes.max_loop_iterations() == 5
    dtypes.set_limits(max_loop_iterations=0)
    assert dtypes.max_loop_iterations() == dtypes.DEFAULT_MAX_LOOP_ITERATIONS
    dtypes.set_limits(**previous)
    with pytest.raises(ValueError):
        dtypes.set_limits(max_loop_iterations=-1)


# -- RegexFullMatch: no catastrophic backtracking ---------------------------------------------------

def _regex(pattern):
    S = TensorProto.STRING
    return model([helper.make_node("RegexFullMatch", ["x"], ["y"], name="rx", pattern=pattern)],
                 [("x", S, [None])], [("y", TensorProto.BOOL, None)], opset=20)


@pytest.mark.parametrize("pattern", [r"(a+)+b", r"(a*)*", r"(x{1,5}){2,}", r"((ab)+c)*", r"(\w+\s?)+$", r"(a|b+)*c"])
def test_nested_quantifiers_are_refused_at_prepare(pattern):
    with pytest.raises(InvalidNodeError, match="'rx'.*nested quantifiers"):
        onnx_mini.prepare(_regex(pattern))


@pytest.mark.parametrize("pattern,message", [("a" * 4097, "longer than onnx_mini accepts"),
                                             ("(" * 80 + ")" * 80, "nested deeper than 64"),
                                             ("(" * 2000 + ")" * 2000, "nested deeper than 64")])
def test_huge_or_deep_patterns_are_refused(pattern, message):
    with pytest.raises(InvalidNodeError, match=f"'rx'.*{message}"):
        onnx_mini.prepare(_regex(pattern))


@pytest.mark.parametrize("pattern,text,expected", [(r"(ab|cd)*", "abcdab", True), (r"(a{3})+", "aaaaaa", True),
                                                   (r"(a{3})+", "aaaa", False), (r"a+b*", "aab", True),
                                                   (r"(\W|^)[\w.\-]{0,25}@(yahoo|gmail)\.com(\W|$)",
                                                    "x@gmail.com", True)])
def test_safe_patterns_still_match(pattern, text, expected):
    (y,) = onnx_mini.prepare(_regex(pattern)).run([np.array([text], dtype=object)])
    assert y.tolist() == [expected]


# -- sizes from data: NonZero, Unique, Where, string ops ------------------------------------------------

def test_nonzero_output_is_limited(small_limit):
    # 2**18 true bools (256 KiB) give a (2, 2**18) int64 output: 4 MiB
    m = model([helper.make_node("NonZero", ["x"], ["y"], name="nz")], [("x", TensorProto.BOOL, [None, None])],
              [("y", I64, None)])
    with pytest.raises(KernelError, match="'nz'.*NonZero output.*over the limit"):
        onnx_mini.prepare(m).run([np.ones((512, 512), bool)])
    (y,) = onnx_mini.prepare(m).run([np.eye(3, dtype=bool)])
    assert y.tolist() == [[0, 1, 2], [0, 1, 2]]


def test_unique_index_outputs_are_limited(small_limit):
    # 2**18 int8 values (256 KiB) need int64 indices of 2 MiB each
    m = model([helper.make_node("Unique", ["x"], ["y", "i", "inv", "c"], name="uq")], [("x", TensorProto.INT8, [None])],
              [("y", TensorProto.INT8, None), ("i", I64, None), ("inv", I64, None), ("c", I64, None)])
    with pytest.raises(KernelError, match="'uq'.*Unique index outputs.*over the limit"):
        onnx_mini.prepare(m).run([np.zeros(1 << 18, np.int8)])
    y, i, inv, c = onnx_mini.prepare(m).run([np.array([3, 1, 3], np.int8)])
    assert y.tolist() == [1, 3] and i.tolist() == [1, 0] and inv.tolist() == [1, 0, 1] and c.tolist() == [1, 2]


def test_where_broadcast_output_is_limited(small_limit):
    B = TensorProto.BOOL
    m = model([helper.make_node("Where", ["c", "x", "y"], ["z"], name="wh")],
              [("c", B, [None, 1, 1]), ("x", F, [1, None, 1]), ("y", F, [1, 1, None])], [("z", F, None)])
    n = 128       # three 128-element inputs broadcast to 128**3 float32: 8 MiB
    with pytest.raises(KernelError, match="'wh'.*Where output.*over the limit"):
        onnx_mini.prepare(m).run([np.ones((n, 1, 1), bool), np.ones((1, n, 1), np.float32),
                                  np.ones((1, 1, n), np.float32)])


def test_string_concat_broadcast_is_limited(small_limit):
    S = TensorProto.STRING
    m = model([helper.make_node("StringConcat", ["x", "y"], ["z"], name="cat")], [("x", S, None), ("y", S, None)],
              [("z", S, None)], opset=20)
    rep = onnx_mini.prepare(m)
    # 64 x 64 output strings of 1000 characters each: 4 MB of text from 128 KB of input
    long = np.array(["a" * 1000] * 64, dtype=object)
    with pytest.raises(KernelError, match="'cat'.*StringConcat output.*characters.*over the limit"):
        rep.run([long.reshape(64, 1), long.reshape(1, 64)])
    # object pointers alone: (2**10, 2**8) output of 8-byte references is 2 MiB
    with pytest.raises(KernelError, match="'cat'.*StringConcat output.*over the limit"):
        rep.run([np.full((1 << 10, 1), "", dtype=object), np.full((1, 1 << 8), "", dtype=object)])
    (z,) = rep.run([np.array([["a"], ["b"]], dtype=object), np.array([["x", "y"]], dtype=object)])
    assert z.tolist() == [["ax", "ay"], ["bx", "by"]]


def test_string_split_width_is_limited(small_limit):
    S = TensorProto.STRING
    m = model([helper.make_node("StringSplit", ["x"], ["y", "n"], name="split", delimiter=",")], [("x", S, [None])],
              [("y", S, None), ("n", I64, None)], opset=20)
    # one string with 2**12 parts and 2**8 empty ones: a (257, 4096) object output, 8 MiB
    x = np.array(["," * 4095] + [""] * 256, dtype=object)
    with pytest.raises(KernelError, match="'split'.*StringSplit output.*over the limit"):
        onnx_mini.prepare(m).run([x])


# -- numpy errors from kernels as clear InvalidValueErrors -------------------------------------------

@pytest.mark.parametrize("op,opset,attrs", [("Add", 14, {}), ("Mul", 14, {}), ("Div", 14, {}), ("Pow", 15, {}),
                                            ("Add", 6, {"broadcast": 1}), ("Equal", 19, {}),
                                            ("Greater", 13, {}), ("BitwiseAnd", 18, {}), ("And", 7, {})])
def test_shapes_that_do_not_broadcast_name_both_shapes(op, opset, attrs):
    t = TensorProto.BOOL if op == "And" else I64 if op == "BitwiseAnd" else F
    m = model([helper.make_node(op, ["a", "b"], ["y"], name="bin", **attrs)], [("a", t, None), ("b", t, None)],
              [("y", t, None)], opset=opset)
    dt = bool if op == "And" else np.int64 if op == "BitwiseAnd" else np.float32
    message = (r"'bin'.*(shapes \[2, 3\] and \[4\] do not broadcast"
               r"|B of shape \[1, 4\] does not match A \[2, 3\])")       # opset 6: legacy_broadcast's message
    with pytest.raises(KernelError, match=message) as info:
        onnx_mini.prepare(m).run([np.ones((2, 3), dt), np.ones((1, 4) if opset == 6 else (4,), dt)])
    assert type(info.value.__cause__).__name__ == "InvalidValueError"


@pytest.mark.parametrize("op", ["Relu", "Sigmoid", "Exp", "Neg", "Tanh", "Erf", "LeakyRelu", "Elu", "Softplus",
                                "HardSigmoid", "Gelu"])
def test_float_ops_on_strings_are_invalid_values(op):
    S = TensorProto.STRING
    m = model([helper.make_node(op, ["x"], ["y"], name="num")], [("x", S, None)], [("y", S, None)], opset=20)
    with pytest.raises(KernelError, match="'num'.*computes on numbers, got a string tensor") as info:
        onnx_mini.prepare(m).run([np.array(["a", "b"], dtype=object)])
    assert type(info.value.__cause__).__name__ == "InvalidValueError"


def test_loop_scan_outputs_are_limited(small_limit):
    # each iteration emits a 64 KiB row: the stacked scan output passes 1 MiB after 17 iterations
    body = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["c_out"]), helper.make_node("Identity", ["row"], ["scan"])],
        "body", [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []), helper.make_tensor_value_info("scan", F, None)])
    node = helper.make_node("Loop", ["m", ""], ["rows"], body=body, name="scanner")
    m = model([node], [("m", I64, []), ("row", F, [None])], [("rows", F, None)])
    rep = onnx_mini.prepare(m)
    row = np.ones(1 << 14, np.float32)
    with pytest.raises(KernelError, match="'scanner'.*scan output #0.*after 17 iterations.*over the limit"):
        rep.run([np.array(1000), row])
    (rows,) = rep.run([np.array(16), row])
    assert rows.shape == (16, 1 << 14)


def test_a_prepared_model_can_have_its_own_size_limit():
    # ConstantOfShape of 2**20 float32 = 4 MiB: refused under a 1 MiB model limit, fine elsewhere.
    node = helper.make_node("ConstantOfShape", ["shape"], ["y"], name="big")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("shape", TensorProto.INT64, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    shape = np.array([1 << 20], np.int64)
    small = onnx_mini.prepare(m, max_tensor_bytes=1 << 20)
    with pytest.raises(KernelError, match="big"):
        small.run([shape])
    assert onnx_mini.prepare(m).run([shape])[0].shape == (1 << 20,)          # other models unaffected
    assert small.run([np.array([1000], np.int64)])[0].shape == (1000,)        # under the limit: fine
    sess = onnx_mini.InferenceSession(m, max_tensor_bytes=1 << 20)
    with pytest.raises(KernelError, match="big"):
        sess.run(None, {"shape": shape})
    again = pickle.loads(pickle.dumps(small))
    with pytest.raises(KernelError, match="big"):
        again.run([shape])
    init = helper.make_model(helper.make_graph(
        [helper.make_node("Identity", ["w"], ["y"])], "g", [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.zeros(1 << 19, np.float32), "w")]),     # a 2 MiB initializer
        opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    with pytest.raises(OnnxMiniError, match="2097152|limit|exceed"):
        onnx_mini.prepare(init, max_tensor_bytes=1 << 20)
    assert onnx_mini.prepare(init).run([])[0].shape == (1 << 19,)
