"""User kernels (onnx_mini.kernel, CustomOps, custom_ops=), the CLI's --plugin, and the two contrib
schemas onnxruntime registers in the ai.onnx domain (SimplifiedLayerNormalization, LayerNormalization
below opset 17)."""
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnx_mini
from onnx_mini import catalog
from onnx_mini import custom_ops
from onnx_mini import registry
from onnx_mini import resolve as resolve_module
from onnx_mini.errors import KernelError, UnsupportedOperatorError

from helpers import NODE, REPO, model, run_node

ROOT = REPO
F = TensorProto.FLOAT
DOM = "test.ext"


@pytest.fixture
def fresh_globals(monkeypatch):
    """Global user kernels registered inside a test vanish after it."""
    monkeypatch.setattr(custom_ops, "_USER", custom_ops.CustomOps())


def custom_model(op="Scale", domain=DOM, opset=1, n_out=1, ai_onnx=21, **attrs):
    node = helper.make_node(op, ["x"], [f"y{k}" for k in range(n_out)], name=NODE, domain=domain, **attrs)
    opsets = [helper.make_opsetid("", ai_onnx), helper.make_opsetid(domain, opset)]
    return model([node], [("x", F, [None])], [(f"y{k}", F, [None]) for k in range(n_out)], opset=opsets)


X = np.array([-2.0, 0.5, 3.0], np.float32)


def scale_ops(factor_default: float) -> onnx_mini.CustomOps:
    ops = onnx_mini.CustomOps()

    @ops.kernel("Scale", since=1, domain=DOM)
    def scale(*, factor=factor_default):
        return lambda x: (x * np.float32(factor)).astype(x.dtype)

    return ops


# -- per-model kernels ------------------------------------------------------------------------------

def test_custom_domain_kernel_runs_through_prepare_and_session_with_attributes():
    ops = scale_ops(2.0)
    (y,) = onnx_mini.prepare(custom_model(), custom_ops=ops).run({"x": X})
    np.testing.assert_array_equal(y, X * 2)
    (y,) = onnx_mini.prepare(custom_model(factor=-0.5), custom_ops=[ops]).run({"x": X})
    np.testing.assert_array_equal(y, X * -0.5)
    sess = onnx_mini.InferenceSession(custom_model(factor=3.0).SerializeToString(), custom_ops=ops)
    np.testing.assert_array_equal(sess.run(None, {"x": X})[0], X * 3)


def test_two_sessions_with_different_custom_ops_differ_and_globals_stay_untouched():
    m = custom_model().SerializeToString()
    a = onnx_mini.InferenceSession(m, custom_ops=scale_ops(2.0))
    b = onnx_mini.InferenceSession(m, custom_ops=scale_ops(10.0))
    np.testing.assert_array_equal(a.run(None, {"x": X})[0], X * 2)
    np.testing.assert_array_equal(b.run(None, {"x": X})[0], X * 10)
    assert not any(d == DOM for d, _, _ in catalog.registered())
    with pytest.raises(UnsupportedOperatorError, match=r"unknown operator Scale in domain 'test\.ext'"):
        onnx_mini.prepare(custom_model())           # no custom_ops: nothing registered globally


def test_custom_kernel_resolves_newest_version_not_above_the_opset():
    ops = onnx_mini.CustomOps()

    @ops.kernel("Scale", since=1, domain=DOM)
    def v1():
        return lambda x: x + np.float32(1)

    @ops.kernel("Scale", since=(3, 5), domain=DOM)
    def v3():
        return lambda x: x + np.float32(3)

    for opset, add in ((1, 1), (2, 1), (3, 3), (4, 3), (7, 3)):
        (y,) = onnx_mini.prepare(custom_model(opset=opset), custom_ops=ops).run({"x": X})
        np.testing.assert_array_equal(y, X + add)
    assert ops.ops() == [(DOM, "Scale", 1), (DOM, "Scale", 3), (DOM, "Scale", 5)]


def _split2_factory():     # module level: a prepared model pickles its per-model kernels
    return _two_outputs


def _two_outputs(x):
    return x * np.float32(2), -x


def test_multi_output_custom_kernel_and_pickled_prepared_model():
    ops = onnx_mini.CustomOps()
    ops.kernel("Split2", since=1, domain=DOM, multi_output=True)(_split2_factory)
    prepared = onnx_mini.prepare(custom_model("Split2", n_out=2), custom_ops=ops)
    y0, y1 = prepared.run({"x": X})
    np.testing.assert_array_equal(y0, X * 2)
    np.testing.assert_array_equal(y1, -X)
    again = pickle.loads(pickle.dumps(prepared))   # the per-model kernels travel with the model
    np.testing.assert_array_equal(again.run({"x": X})[1], -X)


def _scale_factory(*, factor=1.0):     # module level: picklable
    return lambda x: (x * np.float32(factor)).astype(x.dtype)


def test_registration_errors_are_clear():
    ops = onnx_mini.CustomOps()
    with pytest.raises(TypeError, match="keyword-only"):
        ops.kernel("Bad", since=1, domain=DOM)(lambda alpha=1.0: None)
    with pytest.raises(ValueError, match="since"):
        ops.kernel("Bad", since=0, domain=DOM)
    ops.kernel("Twice", since=1, domain=DOM)(_scale_factory)
    with pytest.raises(ValueError, match="already registered.*override=True"):
        ops.kernel("Twice", since=1, domain=DOM)(_scale_factory)
    ops.kernel("Twice", since=1, domain=DOM, override=True)(_scale_factory)
    with pytest.raises(TypeError, match="custom_ops must be a CustomOps"):
        onnx_mini.prepare(custom_model(), custom_ops={"Scale": _scale_factory})
    ops.kernel("Missing", since=1, domain=DOM)(lambda *, factor: (lambda x: x))
    with pytest.raises(onnx_mini.errors.InvalidNodeError, match=f"{NODE}.*required attribute.*'factor'"):
        onnx_mini.prepare(custom_model("Missing"), custom_ops=ops)


# -- overriding built-in operators ------------------------------------------------------------------

def relu_model(opset=14):
    node = helper.make_node("Relu", ["x"], ["y"], name=NODE)
    return model([node], [("x", F, [None])], [("y", F, [None])], opset=opset)


@pytest.mark.parametrize("domain, op", [("", "Relu"), ("ai.onnx.ml", "Binarizer"), ("com.microsoft", "FastGelu")])
def test_override_of_a_builtin_is_refused_without_override(domain, op):
    ops = onnx_mini.CustomOps()
    with pytest.raises(ValueError, match=f"{op} is a (standard|built-in) operator.*override=True"):
        ops.kernel(op, since=1, domain=domain)(_scale_factory)
    assert len(ops) == 0


def test_override_accepted_per_model_and_builtin_unaffected_for_other_sessions():
    ops = onnx_mini.CustomOps()

    @ops.kernel("Relu", since=(6, 13, 14), override=True)
    def leaky():
        return lambda x: np.where(x > 0, x, x * np.float32(0.1)).astype(x.dtype)

    m = relu_model().SerializeToString()
    mine = onnx_mini.InferenceSession(m, custom_ops=ops)
    plain = onnx_mini.InferenceSession(m)
    np.testing.assert_allclose(mine.run(None, {"x": X})[0], np.where(X > 0, X, X * 0.1), rtol=1e-6)
    np.testing.assert_array_equal(plain.run(None, {"x": X})[0], np.maximum(X, 0))
    np.testing.assert_array_equal(onnx_mini.prepare(relu_model()).run({"x": X})[0], np.maximum(X, 0))


def test_override_is_not_bypassed_by_graph_rewrites():
    """MatMul + Add with an initializer bias is fused by the optimiser: an overridden Add must still run."""
    from onnx import numpy_helper
    w, b = np.eye(3, dtype=np.float32) * 2, np.ones(3, np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"], name=NODE)]
    m = model(nodes, [("x", F, [2, 3])], [("y", F, [2, 3])],
              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")], opset=17)
    ops = onnx_mini.CustomOps()

    @ops.kernel("Add", since=(7, 13, 14), override=True)
    def subtract():
        return lambda a, b: a - b

    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(onnx_mini.prepare(m, custom_ops=ops).run({"x": x})[0], x @ w - b)
    np.testing.assert_array_equal(onnx_mini.prepare(m).run({"x": x})[0], x @ w + b)


def test_global_kernel_and_global_override(fresh_globals):
    @onnx_mini.kernel("Scale", since=1, domain=DOM)
    def scale(*, factor=4.0):
        return lambda x: (x * np.float32(factor)).astype(x.dtype)

    np.testing.assert_array_equal(onnx_mini.prepare(custom_model()).run({"x": X})[0], X * 4)
    # a per-model set wins over the global user kernels
    np.testing.assert_array_equal(onnx_mini.prepare(custom_model(), custom_ops=scale_ops(2.0)).run({"x": X})[0],
                                  X * 2)
    with pytest.raises(ValueError, match="override=True"):
        onnx_mini.kernel("Relu", since=14)(_scale_factory)

    @onnx_mini.kernel("Relu", since=14, override=True)
    def negate():
        return lambda x: -x

    np.testing.assert_array_equal(onnx_mini.prepare(relu_model(14)).run({"x": X})[0], -X)
    # the built-in registry itself is untouched
    assert catalog.registered()[("", "Relu", 14)].factory is not negate


def test_global_kernels_are_gone_after_the_fixture():
    with pytest.raises(UnsupportedOperatorError):
        onnx_mini.prepare(custom_model())
    np.testing.assert_array_equal(onnx_mini.prepare(relu_model(14)).run({"x": X})[0], np.maximum(X, 0))


# -- errors inside user kernels -----------------------------------------------------------------------

def test_error_in_user_kernel_is_a_kernel_error_naming_node_op_domain():
    ops = onnx_mini.CustomOps()

    @ops.kernel("Boom", since=1, domain=DOM)
    def boom():
        def run(x):
            raise RuntimeError("the user kernel failed")
        return run

    @ops.kernel("Strict", since=1, domain=DOM)
    def strict(*, mode="a"):
        if mode not in ("a", "b"):
            raise ValueError(f"mode must be 'a' or 'b', got {mode!r}")
        return lambda x: x

    with pytest.raises(KernelError) as info:
        onnx_mini.prepare(custom_model("Boom"), custom_ops=ops).run({"x": X})
    message = str(info.value)
    for fragment in (NODE, "Boom", DOM, "RuntimeError: the user kernel failed"):
        assert fragment in message, (fragment, message)
    with pytest.raises(onnx_mini.errors.InvalidNodeError, match=f"(?s){NODE}.*Strict.*mode must be"):
        onnx_mini.prepare(custom_model("Strict", mode="c"), custom_ops=ops)


# -- the command line ---------------------------------------------------------------------------------

PLUGIN = f'''
import numpy as np
import onnx_mini

@onnx_mini.kernel("Scale", since=1, domain="{DOM}")
def scale(*, factor=1.0):
    return lambda x: (x * np.float32(factor)).astype(x.dtype)
'''


def _cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "onnx_mini.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=120, env={**os.environ, "ONNX_MINI_PROGRESS": "0"})


def test_cli_run_and_ops_with_a_plugin(tmp_path):
    onnx.save(custom_model(factor=5.0), tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", X)
    (tmp_path / "my_ops.py").write_text(PLUGIN)
    r = _cli("run", tmp_path / "m.onnx", "-i", f"x={tmp_path / 'x.npy'}", "--plugin", tmp_path / "my_ops.py",
             "--save", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "y0.npy"), X * 5)
    r = _cli("run", tmp_path / "m.onnx", "-i", f"x={tmp_path / 'x.npy'}")      # without it: a clear error
    assert r.returncode == 1 and "unknown operator Scale" in r.stderr and "Traceback" not in r.stderr
    r = _cli("ops", "--model", tmp_path / "m.onnx", "--plugin", "my_ops", cwd=tmp_path)   # a module name
    assert r.returncode == 0, r.stderr
    assert re.search(rf"{re.escape(DOM)}.*Scale-1: kernel", r.stdout), r.stdout
    r = _cli("ops", "--model", tmp_path / "m.onnx", "--plugin", tmp_path / "nope.py")
    assert r.returncode == 2 and "no such file" in r.stderr


def test_cli_ops_model_says_which_contrib_ops_run(tmp_path):
    nodes = [helper.make_node("FastGelu", ["x"], ["a"], domain="com.microsoft"),
             helper.make_node("SimplifiedLayerNormalization", ["a", "s"], ["b"], epsilon=1e-6),
             helper.make_node("LayerNormalization", ["b", "s"], ["c"]),
             helper.make_node("NotAnOp", ["c"], ["y"], domain="com.microsoft")]
    m = model(nodes, [("x", F, [2, 4]), ("s", F, [4])], [("y", F, None)],
              opset=[helper.make_opsetid("", 14), helper.make_opsetid("com.microsoft", 1)])
    onnx.save(m, tmp_path / "contrib.onnx")
    r = _cli("ops", "--model", tmp_path / "contrib.onnx")
    assert r.returncode == 1
    out = r.stdout
    assert re.search(r"com\.microsoft.*FastGelu-1: kernel", out), out
    assert re.search(r"SimplifiedLayerNormalization-1: kernel", out), out
    assert re.search(r"LayerNormalization-1: kernel", out), out
    assert re.search(r"NotAnOp: missing \(unknown operator NotAnOp in domain 'com\.microsoft'\)", out), out
    assert "1 of the model's 4 operator(s) cannot run" in r.stderr


def test_readme_extension_example_runs(fresh_globals):
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### Extending onnx_mini", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert "@kernel" in block and "custom_ops=ops" in block
    ns: dict = {}
    exec(compile(block, "README.md", "exec"), ns)
    x = ns["x"]
    np.testing.assert_allclose(ns["y"], x / (1 + np.exp(-2 * x)), rtol=1e-6)
    np.testing.assert_allclose(ns["hard"], x * np.clip(x + 3, 0, 6) / 6, rtol=1e-6)


# -- the ai.onnx contrib schemas ------------------------------------------------------------------------

def rms_reference(x, scale, axis, epsilon):
    axes = tuple(range(axis % x.ndim, x.ndim))
    xd = x.astype(np.float64)
    inv = 1 / np.sqrt((xd * xd).mean(axis=axes, keepdims=True) + epsilon)
    return xd * inv * scale.astype(np.float64), inv


@pytest.mark.parametrize("opset", [12, 17, 21])
@pytest.mark.parametrize("axis", [-1, 1])
def test_simplified_layer_normalization(opset, axis):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    scale = rng.standard_normal(x.shape[axis % 3:]).astype(np.float32)
    y, inv = run_node("SimplifiedLayerNormalization", opset, [x, scale], n_outputs=2, axis=axis, epsilon=1e-3)
    ry, rinv = rms_reference(x, scale, axis, 1e-3)
    assert y.dtype == np.float32 and inv.dtype == np.float32
    assert inv.shape == x.shape[:axis % 3] + (1,) * (3 - axis % 3)
    np.testing.assert_allclose(y, ry, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(inv, rinv, rtol=1e-5)


@pytest.mark.parametrize("dtype, rtol", [(np.float16, 2e-3), (np.float64, 1e-12), ("bfloat16", 2e-2)])
def test_simplified_layer_normalization_types(dtype, rtol):
    import ml_dtypes
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    x = np.array([[1.0, -2.0, 3.0, 0.5], [0.0, 0.25, -1.0, 4.0]]).astype(dt)
    scale = np.array([1.0, 0.5, 2.0, -1.0]).astype(dt)
    y = run_node("SimplifiedLayerNormalization", 14, [x, scale])
    assert y.dtype == dt
    ry, _ = rms_reference(x.astype(np.float64), scale.astype(np.float64), -1, 1e-5)
    np.testing.assert_allclose(y.astype(np.float64), ry, rtol=rtol, atol=rtol)


def test_simplified_layer_normalization_stash_double_and_bad_stash():
    x = np.array([[3.0, 4.0]], np.float32)
    y, inv = run_node("SimplifiedLayerNormalization", 13, [x, np.ones(2, np.float32)], n_outputs=2, stash_type=11,
                      epsilon=0.0)
    assert inv.dtype == np.float64
    np.testing.assert_allclose(inv, [[1 / np.sqrt(12.5)]])
    np.testing.assert_allclose(y, x / np.sqrt(12.5), rtol=1e-6)
    with pytest.raises(onnx_mini.errors.InvalidNodeError, match=f"{NODE}.*stash_type"):
        run_node("SimplifiedLayerNormalization", 13, [x, np.ones(2, np.float32)], stash_type=7)


def test_simplified_layer_normalization_empty_and_bad_axis():
    y, inv = run_node("SimplifiedLayerNormalization", 14, [np.zeros((0, 4), np.float32), np.ones(4, np.float32)],
                      n_outputs=2)
    assert y.shape == (0, 4) and inv.shape == (0, 1)
    with pytest.raises(onnx_mini.errors.OnnxMiniError, match=f"(?s){NODE}.*axis"):
        run_node("SimplifiedLayerNormalization", 14, [X, np.ones(3, np.float32)], axis=3)


@pytest.mark.parametrize("opset", [12, 16])
def test_layer_normalization_below_opset_17_runs_like_version_17(opset):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 5)).astype(np.float32)
    scale, bias = rng.standard_normal(5).astype(np.float32), rng.standard_normal(5).astype(np.float32)
    y, mean, inv = run_node("LayerNormalization", opset, [x, scale, bias], n_outputs=3, epsilon=1e-4)
    m = x.astype(np.float64).mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    np.testing.assert_allclose(y, (x - m) / np.sqrt(v + 1e-4) * scale + bias, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(mean, m, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(inv, 1 / np.sqrt(v + 1e-4), rtol=1e-5)
    y17 = run_node("LayerNormalization", 17, [x, scale, bias], epsilon=1e-4)
    np.testing.assert_array_equal(run_node("LayerNormalization", opset, [x, scale, bias], epsilon=1e-4), y17)


def test_resolution_reaches_contrib_schemas_only_where_onnx_has_none():
    assert resolve_module.resolve("", "LayerNormalization", 16).version == 1
    assert resolve_module.resolve("", "LayerNormalization", 17).version == 17
    assert resolve_module.resolve("", "SimplifiedLayerNormalization", 7).version == 1


def test_truly_unknown_ai_onnx_ops_still_raise_a_clear_error():
    with pytest.raises(UnsupportedOperatorError, match=f"(?s){NODE}.*unknown operator NoSuchNorm in domain 'ai.onnx'"):
        run_node("NoSuchNorm", 14, [X])
    # an onnx op used below its first version, with no contrib kernel, stays an error
    with pytest.raises(UnsupportedOperatorError, match="GroupNormalization does not exist in opset 17"):
        run_node("GroupNormalization", 17, [X.reshape(1, 3, 1), X, X], num_groups=1)


def test_run_node_takes_custom_ops():
    ops = onnx_mini.CustomOps()

    @ops.kernel("Scale", since=(1, 2), domain="test.run_node")
    def scale(*, k=2.0):
        return lambda x: x * k
    node = helper.make_node("Scale", ["x"], ["y"], domain="test.run_node", k=3.0)
    x = np.array([1.0, -2.0], np.float32)
    np.testing.assert_array_equal(onnx_mini.run_node(node, [x], custom_ops=ops)[0], x * 3)
    np.testing.assert_array_equal(onnx_mini.run_node(node, [x], custom_ops=ops, opset_version=1)[0], x * 3)
    with pytest.raises(onnx_mini.errors.UnsupportedOperatorError):
        onnx_mini.run_node(node, [x])
