"""onnx_mini.compare: the outputs' verdict, then every intermediate value against onnxruntime or
onnx.reference and the first node that diverges (found here by planting a wrong kernel); the default
tolerances by element type; `onnx-mini compare`'s exit code follows the verdict."""
from __future__ import annotations

import importlib.util
import inspect
import sys
from dataclasses import replace

import ml_dtypes

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_mini
from helpers import F, I64, control_flow_feeds, control_flow_model, model
from onnx_mini import registry
from onnx_mini import resolve as resolve_module
from onnx_mini.cli import main
from onnx_mini.compare import _difference, default_tolerance
from onnx_mini.errors import InputError, OnnxMiniError

HAS_ORT = importlib.util.find_spec("onnxruntime") is not None
AGAINST = ["reference", pytest.param("onnxruntime", marks=pytest.mark.skipif(not HAS_ORT, reason="no onnxruntime"))]


def chain():
    """x -> Relu -> Add(b) -> Exp -> ReduceSum; Shape of x on the side (an int64 value)."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Add", ["r", "b"], ["s"], name="add"),
             helper.make_node("Exp", ["s"], ["e"], name="exp"),
             helper.make_node("ReduceSum", ["e"], ["y"], keepdims=0, name="sum"),
             helper.make_node("Shape", ["x"], ["shape"], name="shape")]
    return model(nodes, [("x", F, ["N", 3])], [("y", F, []), ("shape", I64, [2])],
                 [numpy_helper.from_array(np.array([0.5, -1, 2], np.float32), "b")])


X = np.array([[1, -2, 0.25], [-1, 3, 0.5]], np.float32)


@pytest.fixture
def planted(monkeypatch):
    """plant(op, version, fn_factory): onnx_mini's kernel for (op, version) replaced for this test."""
    def plant(op, version, factory):
        spec = registry._KERNELS[("", op, version)]
        # the planted factory is given only the injected names it asks for (not the real kernel's)
        injected = frozenset(inspect.signature(factory).parameters) & frozenset(registry.INJECTED)
        monkeypatch.setitem(registry._KERNELS, ("", op, version), replace(spec, factory=factory, injected=injected))
        resolve_module._resolve.cache_clear()
    yield plant
    monkeypatch.undo()
    resolve_module._resolve.cache_clear()


@pytest.mark.parametrize("against", AGAINST)
def test_agreeing_model(against):
    result = onnx_mini.compare(chain(), {"x": X}, against=against)
    assert result.ok and result.divergence is None
    assert (result.against, result.compared, result.steps, result.not_compared) == (against, 5, 5, ())
    assert result.outputs_agree and result.outputs == ("y", "shape") and result.float_types == ("float32",)
    assert str(result).splitlines() == [
        f"onnx_mini vs {against}: the outputs agree (2 output(s) within tolerance)",
        "5 value(s) of 5 node(s) compared; all agree",
        "tolerance: float32 rtol=0.0001 atol=1e-05*max|value|; integers, booleans, strings exact"]


@pytest.mark.parametrize("against", AGAINST)
def test_planted_divergence_is_the_first_diverging_node(against, planted):
    # Add is off by 0.01: Add, Exp and ReduceSum all diverge; the report names Add (the first)
    planted("Add", 14, lambda: lambda a, b: np.add(a, b) + np.float32(0.01))
    result = onnx_mini.compare(chain(), {"x": X}, against=against, rtol=1e-4, atol=1e-5)
    d = result.divergence
    assert not result.ok and not result.outputs_agree and result.diverging == 3     # s, e and y
    assert [o.output for o in result.output_divergences] == ["y"]                 # 'shape' agrees
    assert (d.index, d.node, d.op_type, d.version, d.output) == (1, "add", "Add", 14, "s")
    assert d.inputs == (("r", "float32[2, 3]"), ("b", "float32[3]"))
    assert d.ours == d.theirs == "float32[2, 3]"
    assert d.max_abs_error == pytest.approx(0.01, rel=1e-3)
    s = np.maximum(X, 0) + np.array([0.5, -1, 2], np.float32)
    assert d.max_rel_error == pytest.approx((0.01 / np.abs(s)).max(), rel=1e-3)
    assert d.reason.startswith("6 of 6 value(s) beyond tolerance, largest at ")
    text = str(result)
    assert text.startswith(f"onnx_mini vs {against}: the outputs DIFFER (1 of 2 output(s) beyond tolerance)\n"
                           "  output 'y': 1 of 1 value(s) beyond tolerance")
    assert "first divergence at step 1: node 'add' (Add-14), output 's'" in text
    assert "3 beyond tolerance\ntolerance: float32 rtol=0.0001 atol=1e-05;" in text
    assert "inputs: r: float32[2, 3], b: float32[3]" in text and f"{against}: float32[2, 3]" in text


def test_tolerance_decides(planted):
    planted("Relu", 14, lambda: lambda x: np.maximum(x, 0) * np.float32(1 + 1e-3))
    assert onnx_mini.compare(chain(), {"x": X}, against="reference", rtol=1e-2).ok
    d = onnx_mini.compare(chain(), {"x": X}, against="reference", rtol=1e-4).divergence
    assert d.node == "relu" and d.index == 0 and d.inputs == (("x", "float32[2, 3]"),)


def test_shape_and_dtype_divergences(planted):
    planted("Shape", 21, lambda **kw: lambda x: np.array(x.shape, np.int32))
    d = onnx_mini.compare(chain(), {"x": X}, against="reference").divergence
    assert (d.node, d.reason, d.max_abs_error) == ("shape", "element types differ (int32 vs int64)", float("inf"))
    planted("Exp", 13, lambda: lambda x: np.exp(x)[:1])
    d = onnx_mini.compare(chain(), {"x": X}, against="reference").divergence
    assert (d.node, d.reason) == ("exp", "shapes differ ([1, 3] vs [2, 3])")


def test_sequences_and_python_feeds():
    nodes = [helper.make_node("SplitToSequence", ["x"], ["seq"], axis=0, name="split"),
             helper.make_node("SequenceAt", ["seq", "i"], ["row"], name="at"),
             helper.make_node("Neg", ["row"], ["y"], name="neg")]
    m = model(nodes, [("x", F, [2, 3]), ("i", I64, [])], [("y", F, [3])])
    result = onnx_mini.compare(m, {"x": X.tolist(), "i": 1}, against="reference")
    assert result.ok and result.compared == 3


def test_model_with_external_data(tmp_path):
    onnx.save(chain(), tmp_path / "m.onnx", save_as_external_data=True, location="w.bin", size_threshold=0)
    assert onnx_mini.compare(str(tmp_path / "m.onnx"), {"x": X}, against="reference").ok


@pytest.mark.parametrize("against", AGAINST)
def test_the_steps_of_bodies_are_not_the_models_values(against):
    # Loop, If and Scan run their bodies hooked too; compare counts and compares the model's 3 nodes only
    result = onnx_mini.compare(control_flow_model(), control_flow_feeds(), against=against)
    assert (result.steps, result.compared, result.outputs) == (3, 4, ("acc", "y", "s", "ys"))
    if against == "onnxruntime":     # onnx.reference 1.23 returns acc = x here (onnxruntime agrees with us)
        assert result.ok


def test_errors(monkeypatch):
    with pytest.raises(OnnxMiniError, match="choose one of 'onnxruntime', 'reference'"):
        onnx_mini.compare(chain(), {"x": X}, against="tensorflow")
    with pytest.raises(InputError, match="missing input"):
        onnx_mini.compare(chain(), {}, against="reference")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)       # as if it were not installed
    with pytest.raises(OnnxMiniError, match=r"needs onnxruntime \(pip install onnxruntime\).*against='reference'"):
        onnx_mini.compare(chain(), {"x": X}, against="onnxruntime")
    monkeypatch.setitem(sys.modules, "onnx.reference", None)
    with pytest.raises(OnnxMiniError, match="needs onnx.reference"):
        onnx_mini.compare(chain(), {"x": X}, against="reference")


@pytest.mark.skipif(not HAS_ORT, reason="no onnxruntime")
def test_onnxruntime_refusal_is_an_onnx_mini_error():
    # Relu-14 allows int16; onnxruntime (1.32 at least) has no int16 Relu kernel and refuses the model
    m = model([helper.make_node("Relu", ["x"], ["y"])], [("x", TensorProto.INT16, [2])],
              [("y", TensorProto.INT16, [2])], opset=14)
    with pytest.raises(OnnxMiniError, match="^onnxruntime cannot run the model: "):
        onnx_mini.compare(m, {"x": np.array([-1, 2], np.int16)}, against="onnxruntime")


def test_difference_rules():
    f = np.float32
    nan, inf = np.nan, np.inf
    assert _difference(np.array([1, nan, inf, -inf], f), np.array([1, nan, inf, -inf], f), 0, 0) is None
    reason, a, r = _difference(np.array([1, nan], f), np.array([1, 2], f), 0, 0)
    assert a == inf and reason.startswith("1 of 2 value(s) beyond tolerance, largest at [1]: nan vs 2.0")
    reason, a, r = _difference(np.array([1, 2, 4], f), np.array([1, 2.5, 2], f), 0, 1.0)
    assert (a, r) == (2.0, 1.0) and reason.startswith("1 of 3")          # 0.5 within atol, 2 is not
    assert _difference(np.array([], f), np.array([], f), 0, 0) is None
    assert _difference(np.array(["a", "b"], object), np.array(["a", "c"], object), 0, 0)[0] == \
        "1 of 2 value(s) differ, first at [1]: 'b' vs 'c'"
    assert _difference(np.array([True]), np.array([False]), 1, 1) is not None     # exact, whatever the tolerance
    assert _difference(np.array([3]), np.array([4]), 1, 1)[0] == "1 of 1 value(s) differ, first at [0]: 3 vs 4"
    assert _difference([np.ones(2, f)], [np.ones(2, f), np.ones(2, f)], 0, 0)[0] == "sequence lengths differ (1 vs 2)"
    assert _difference([np.ones(2, f)], [np.zeros(2, f)], 0, 0)[0].startswith("sequence item 0: 2 of 2")
    assert _difference({1: 0.5}, {1: 0.5}, 0, 0) is None
    assert _difference({1: 0.5}, {2: 0.5}, 0, 0)[0] == "map keys differ"
    assert _difference(None, None, 0, 0) is None and _difference(None, np.ones(1), 0, 0)[1] == inf
    assert _difference(np.ones(1, np.int64), np.ones(1, np.int64) * 2, 0, 0)[1:] == (1.0, 0.5)


def test_divergence_inside_a_model_local_function(planted):
    body = helper.make_function("custom", "Twice", ["a"], ["b"], [helper.make_node("Add", ["a", "a"], ["b"])],
                                [helper.make_opsetid("", 21)])
    graph = helper.make_graph([helper.make_node("Twice", ["x"], ["y"], domain="custom", name="tw"),
                               helper.make_node("Neg", ["y"], ["z"], name="neg")], "g",
                              [helper.make_tensor_value_info("x", F, [2])],
                              [helper.make_tensor_value_info("z", F, [2])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("custom", 1)],
                          functions=[body], ir_version=10)
    assert onnx_mini.compare(m, {"x": np.ones(2, np.float32)}, against="reference").ok
    planted("Add", 14, lambda: lambda a, b: a + b + 1)
    d = onnx_mini.compare(m, {"x": np.ones(2, np.float32)}, against="reference").divergence
    assert (d.op_type, d.output, d.max_abs_error) == ("Add", "y", 1.0)
    assert d.reason.endswith("(computed for the model's node 'tw' (custom::Twice))")


# -- the verdict: outputs first ----------------------------------------------------------------------

def masked():
    """x -> Relu -> Sign: a wrong Relu scale changes r, never y."""
    return model([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                  helper.make_node("Sign", ["r"], ["y"], name="sign")], [("x", F, ["N", 3])], [("y", F, ["N", 3])])


def test_an_intermediate_divergence_that_does_not_reach_the_outputs_is_a_note(planted):
    planted("Relu", 14, lambda: lambda x: np.maximum(x, 0) * np.float32(1.01))
    result = onnx_mini.compare(masked(), {"x": X}, against="reference")
    assert result.outputs_agree and not result.ok and result.output_divergences == ()
    assert (result.divergence.node, result.divergence.output, result.diverging) == ("relu", "r", 1)
    lines = str(result).splitlines()
    assert lines[0] == "onnx_mini vs reference: the outputs agree (1 output(s) within tolerance)"
    assert lines[1].startswith("note: 1 intermediate value(s) differ beyond tolerance without changing the "
                               "outputs; the first, at step 0: node 'relu' (Relu-14), output 'r': 4 of 6")
    assert lines[-2] == "2 value(s) of 2 node(s) compared; 1 beyond tolerance"


def test_a_graph_output_computed_by_no_node(monkeypatch):
    # the output is the input itself: only the other runtime can make it differ (planted there)
    compare_module = sys.modules["onnx_mini.compare"]
    honest = compare_module._run_reference

    def wrong(proto, node_outputs, feeds):
        return {**honest(proto, node_outputs, feeds), "x": feeds["x"] + 1}

    monkeypatch.setattr(compare_module, "_run_reference", wrong)
    m = model([helper.make_node("Neg", ["x"], ["y"], name="neg")], [("x", F, [2, 3])],
              [("y", F, [2, 3]), ("x", F, [2, 3])])
    result = onnx_mini.compare(m, {"x": X}, against="reference")
    (d,) = result.output_divergences
    assert (d.index, d.output, d.max_abs_error, result.divergence) == (-1, "x", 1.0, None)
    assert "  output 'x': 6 of 6 value(s) beyond tolerance" in str(result)
    assert str(d).startswith("graph output 'x' (a graph input or a constant, computed by no node): 6 of 6")


def test_cli_exit_code_follows_the_outputs(planted, tmp_path, capsys):
    onnx.save(masked(), tmp_path / "masked.onnx")
    onnx.save(chain(), tmp_path / "chain.onnx")
    planted("Add", 14, lambda: lambda a, b: np.add(a, b) + np.float32(0.01))
    assert main(["compare", str(tmp_path / "chain.onnx"), "--vs", "reference"]) == 1
    out = capsys.readouterr().out
    assert "onnx_mini vs reference: the outputs DIFFER (1 of 2 output(s) beyond tolerance)" in out
    assert "first divergence at step 1: node 'add'" in out
    planted("Relu", 14, lambda: lambda x: np.maximum(x, 0) * np.float32(1.01))      # Sign hides it
    assert main(["compare", str(tmp_path / "masked.onnx"), "--vs", "reference", "--dim", "N=4"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("dims: N=4\nonnx_mini vs reference: the outputs agree") and "\nnote: 1 intermediate" in out


# -- default tolerances ----------------------------------------------------------------------------

def next_up(a: np.ndarray) -> np.ndarray:
    """Each (positive, finite) value one unit in the last place up, for any float type."""
    bits = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    return (a.view(bits) + bits(1)).view(a.dtype)


def test_default_tolerance_rules():
    assert default_tolerance(np.float32) == (1e-4, 1e-5) and default_tolerance(np.complex64) == (1e-4, 1e-5)
    assert default_tolerance(np.float64) == (1e-7, 1e-8) == default_tolerance(np.complex128)
    assert default_tolerance(np.float16) == (8 * 2.0 ** -10, 2.0 ** -10)
    assert default_tolerance(ml_dtypes.bfloat16) == (8 * 2.0 ** -7, 2.0 ** -7)
    assert default_tolerance(ml_dtypes.float8_e4m3fn) == (2.0 ** -3, 2.0 ** -3)
    for exact in (np.int64, np.uint8, np.bool_, object, ml_dtypes.int4):
        assert default_tolerance(exact) is None


def test_accumulation_noise_agrees_and_real_errors_do_not():
    # a convolution output: values of magnitude ~10, and a few that nearly cancel off by 1.9e-5
    theirs = (np.random.default_rng(0).standard_normal((1, 64, 32, 32)) * 10).astype(np.float32)
    theirs.flat[:4] = [1e-3, -2e-3, 0.0, 5e-4]
    ours = theirs.copy()
    ours.flat[:4] += np.float32(1.9e-5)
    assert _difference(ours, theirs) is None
    assert _difference(ours, theirs, 1e-4, 1e-5)[0].startswith("4 of 65536")   # the former fixed tolerances
    reason, max_abs, max_rel = _difference(theirs * np.float32(1.01), theirs)   # a 1e-2 relative error
    assert int(reason.split()[0]) > 60000 and max_rel == pytest.approx(1e-2, rel=1e-3)
    # the same noise scaled to values of ~1e-3: atol scales with them, so still agrees; at 100x, not
    assert _difference(ours * np.float32(1e-4), theirs * np.float32(1e-4)) is None
    assert _difference(ours * np.float32(1e-4) + np.float32(1e-5), theirs * np.float32(1e-4)) is not None


def test_tolerance_by_element_type():
    pos = np.linspace(0.5, 60, 50)
    for dtype in (np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn):
        theirs = pos.astype(dtype)
        assert _difference(next_up(theirs), theirs) is None, dtype            # one ulp: rounding noise
        assert _difference(next_up(theirs), theirs, 0, 0) is not None, dtype   # explicit tolerances win
        assert _difference((pos * 1.3).astype(dtype), theirs) is not None, dtype
    f16 = pos.astype(np.float16)
    assert _difference((pos * 1.03).astype(np.float16), f16) is not None       # 3%: beyond fp16's 8 ulps
    f32, f64 = pos.astype(np.float32), pos.astype(np.float64)
    assert _difference(f32 * np.float32(1 + 1e-5), f32) is None                # float32 takes 1e-5 ...
    assert _difference(f64 * (1 + 1e-5), f64) is not None                      # ... float64 does not
    assert _difference(f64 * (1 + 1e-9), f64) is None
    c64 = (pos + 1j * pos).astype(np.complex64)
    assert _difference(c64 * np.complex64(1 + 1e-6), c64) is None
    assert _difference(c64 * np.complex64(1 + 1e-3), c64) is not None
    for dtype in (np.int64, np.uint8, ml_dtypes.int4):
        a = np.array([1, 2, 3], dtype)
        assert _difference(a, a) is None
        assert _difference(np.array([1, 3, 3], dtype), a)[0] == "1 of 3 value(s) differ, first at [1]: 3 vs 2"


# -- descending into the bodies of If, Loop and Scan ------------------------------------------------

def counting_loop(trips: int = 3) -> onnx.ModelProto:
    """acc starts at x; each iteration: a = acc + x ('add'), acc = a * 2 ('double')."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"], name="keep_going"),
         helper.make_node("Add", ["acc_in", "x"], ["a"], name="add"),
         helper.make_node("Mul", ["a", "two"], ["acc_out"], name="double")],
        "body", [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("acc_in", F, [2])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), helper.make_tensor_value_info("acc_out", F, [2])],
        [numpy_helper.from_array(np.array(2, np.float32), "two")])
    nodes = [helper.make_node("Loop", ["M", "go", "x"], ["acc"], name="loop", body=body),
             helper.make_node("Neg", ["acc"], ["y"], name="neg")]
    return model(nodes, [("M", I64, []), ("go", TensorProto.BOOL, []), ("x", F, [2])], [("y", F, [2])], opset=17)


LOOP_FEEDS = {"M": np.array(3, np.int64), "go": np.array(True), "x": np.array([1, 2], np.float32)}


@pytest.mark.parametrize("against", AGAINST)
def test_a_divergence_inside_a_loop_body_is_found_call_by_call(against, planted):
    # Mul goes wrong only on values above 10: acc runs [1,2] -> [4,8] -> [10,20] -> [22,44], so the
    # body's third call (Add gives [11, 22]) is the first whose Mul differs
    planted("Mul", 14, lambda: lambda a, b: np.multiply(a, b) + np.float32(0.5) * (a > 10))
    result = onnx_mini.compare(counting_loop(), LOOP_FEEDS, against=against)
    d = result.divergence
    assert not result.outputs_agree and (d.node, d.op_type, d.output) == ("loop", "Loop", "acc")
    assert (d.call, d.calls) == (2, 3)
    inner = d.inside
    assert (inner.node, inner.op_type, inner.output, inner.scope) == ("double", "Mul", "acc_out",
                                                                       ("loop", "body", "double"))
    assert d.path == "loop/body/double" and inner.max_abs_error == pytest.approx(0.5)
    assert inner.inputs == (("a", "float32[2]"), ("two", "float32[]"))
    text = str(result)
    assert "first divergence at step 0: node 'loop' (Loop-16), output 'acc'" in text
    assert "inside it, call 3 of 3 of its body: step 2: node 'loop/body/double' (Mul-14), output 'acc_out'" in text


def test_a_loop_whose_body_agrees_on_every_call_says_so(planted):
    # a Loop kernel that forgets the last iteration: every body call agrees, the Loop does not
    spec = registry._KERNELS[("", "Loop", 16)]
    original = spec.factory

    def short_loop(**kw):
        run = original(**kw)
        return lambda m, *rest: run(np.asarray(m - 1), *rest)
    short_loop.__signature__ = __import__("inspect").signature(original)
    planted("Loop", 16, short_loop)
    d = onnx_mini.compare(counting_loop(), LOOP_FEEDS, against="reference").divergence
    assert d.op_type == "Loop" and d.inside is None and d.path == "loop"
    assert d.body_note == ("its body agrees on the 2 call(s) compared (of 2): the difference is in what the "
                           "Loop itself does with them")


@pytest.mark.skipif(not HAS_ORT, reason="no onnxruntime (onnx.reference 1.23 runs this model's Loop wrong)")
def test_a_divergence_in_an_if_inside_a_loop_is_named_by_its_path(planted):
    # Neg runs in the Loop's If else_branch (the body's second call) and in the Scan's body
    planted("Neg", 13, lambda: lambda x: np.negative(x) + np.float32(1))
    d = onnx_mini.compare(control_flow_model(), control_flow_feeds(), against="onnxruntime").divergence
    assert (d.op_type, d.call, d.calls) == ("Loop", 1, 3)
    assert d.path == "Loop_0/body/If_4/else_branch/Neg_0"
    assert (d.inside.op_type, d.inside.call, d.inside.calls, d.inside.inside.op_type) == ("If", 0, 1, "Neg")
