"""InferenceSession as a drop-in for onnxruntime's: description, options and their warnings, runs
(any intermediate value, Python feeds, many threads), the verbose trace, and pickling."""
from __future__ import annotations

import importlib.util
import io
import json
import multiprocessing
import os
import operator
import pickle
import re
import subprocess
import sys
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_mini
import onnx_mini.backend
import onnx_mini.session
from helpers import F, I64, REPO, model
from onnx_mini import IgnoredOptionWarning, InferenceSession, RunOptions, SessionOptions
from onnx_mini.errors import ArgumentError, InputError, KernelError

ROOT = REPO
HAS_ORT = importlib.util.find_spec("onnxruntime") is not None


@pytest.fixture(autouse=True)
def fresh_warnings():
    """Each test sees the once-per-process warnings afresh."""
    onnx_mini.session._warned.clear()
    yield
    onnx_mini.session._warned.clear()


def mlp():
    """y = relu(x @ w + b) * 2 with x: [N, 3]; w comes from a foldable Transpose of an initializer."""
    nodes = [helper.make_node("Transpose", ["wt"], ["w"], name="transpose_w"),
             helper.make_node("MatMul", ["x", "w"], ["xw"], name="matmul"),
             helper.make_node("Add", ["xw", "b"], ["pre"], name="add_bias"),
             helper.make_node("Relu", ["pre"], ["act"], name="relu"),
             helper.make_node("Mul", ["act", "two"], ["y"], name="double")]
    wt = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5
    inits = [numpy_helper.from_array(wt, "wt"), numpy_helper.from_array(np.array([0.5, -1], np.float32), "b"),
             numpy_helper.from_array(np.array(2, np.float32), "two")]
    m = model(nodes, [("x", F, ["N", 3])], [("y", F, ["N", 2])], inits, producer_name="unit-test",
              producer_version="1.2", domain="org.example", model_version=7, doc_string="an mlp")
    m.graph.doc_string = "the graph"
    helper.set_model_props(m, {"author": "me", "task": "test"})
    return m


def mlp_expected(x):
    wt = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5
    pre = x @ wt.T + np.array([0.5, -1], np.float32)
    return pre, np.maximum(pre, 0) * 2


X = np.array([[1, 2, 3], [-1, 0, 4]], np.float32)


def kinds_model():
    """Inputs of every kind: tensor with symbolic/unknown dims, sequence, map, optional; an
    initializer-backed input (overridable)."""
    seq = helper.make_tensor_sequence_value_info("s", I64, None)
    mp = onnx.ValueInfoProto(name="m")
    mp.type.map_type.key_type = I64
    mp.type.map_type.value_type.CopyFrom(helper.make_tensor_type_proto(F, None))
    opt = helper.make_value_info("o", helper.make_optional_type_proto(helper.make_tensor_type_proto(F, [2])))
    nodes = [helper.make_node("SequenceLength", ["s"], ["n"]), helper.make_node("Add", ["x", "k"], ["y"])]
    graph = helper.make_graph(
        nodes, "kinds",
        [helper.make_tensor_value_info("x", F, ["N", None, 2]), seq, mp, opt,
         helper.make_tensor_value_info("k", F, [2]), helper.make_tensor_value_info("u", F, None)],
        [helper.make_tensor_value_info("n", I64, []), helper.make_tensor_value_info("y", F, None)],
        [numpy_helper.from_array(np.array([10, 20], np.float32), "k")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("ai.onnx.ml", 3)],
                             ir_version=10)


# -- description ------------------------------------------------------------------------------------

def test_inputs_outputs_and_overridable_initializers():
    sess = InferenceSession(kinds_model().SerializeToString())
    got = [(a.name, a.type, a.shape) for a in sess.get_inputs()]
    assert got == [("x", "tensor(float)", ["N", None, 2]), ("s", "seq(tensor(int64))", []),
                   ("m", "map(int64,tensor(float))", []), ("o", "optional(tensor(float))", []),
                   ("u", "tensor(float)", [])]
    assert [(a.name, a.type, a.shape) for a in sess.get_outputs()] == [("n", "tensor(int64)", []),
                                                                       ("y", "tensor(float)", [])]
    assert [(a.name, a.type, a.shape) for a in sess.get_overridable_initializers()] == [("k", "tensor(float)", [2])]


@pytest.mark.skipif(not HAS_ORT, reason="onnxruntime is not installed")
def test_descriptions_match_onnxruntime():
    import onnxruntime
    m = mlp()
    theirs = onnxruntime.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    ours = InferenceSession(m)
    for f in ("get_inputs", "get_outputs", "get_overridable_initializers"):
        assert [(a.name, a.type, a.shape) for a in getattr(ours, f)()] == \
               [(a.name, a.type, a.shape) for a in getattr(theirs, f)()]
    fields = ("producer_name", "graph_name", "graph_description", "domain", "description", "version",
              "custom_metadata_map")
    assert {k: getattr(ours.get_modelmeta(), k) for k in fields} == \
           {k: getattr(theirs.get_modelmeta(), k) for k in fields}


def test_modelmeta():
    meta = InferenceSession(mlp()).get_modelmeta()
    assert (meta.producer_name, meta.producer_version, meta.graph_name, meta.graph_description, meta.domain,
            meta.description, meta.version) == ("unit-test", "1.2", "g", "the graph", "org.example", "an mlp", 7)
    assert meta.custom_metadata_map == {"author": "me", "task": "test"}
    assert onnx_mini.load(mlp()).metadata == meta      # the loader keeps them on Model


def test_providers_and_device():
    sess = InferenceSession(mlp(), providers=["CPUExecutionProvider"])
    assert sess.get_providers() == ["CPUExecutionProvider"]
    assert sess.get_provider_options() == {"CPUExecutionProvider": {}}
    assert onnx_mini.get_available_providers() == ["CPUExecutionProvider"]
    assert onnx_mini.get_device() == "CPU"


def test_session_over_a_prepared_model():
    prepared = onnx_mini.prepare(mlp())
    sess = InferenceSession.from_prepared(prepared)
    assert sess.prepared is prepared and sess.end_profiling() == ""
    np.testing.assert_allclose(sess.run(["pre"], {"x": X})[0], mlp_expected(X)[0], rtol=1e-6)


def test_model_sources(tmp_path):
    path = tmp_path / "mlp.onnx"
    onnx.save(mlp(), path)
    exp = mlp_expected(X)[1]
    for source in (str(path), path, path.read_bytes(), mlp(), open(path, "rb")):
        np.testing.assert_array_equal(InferenceSession(source).run(None, {"x": X})[0], exp)


# -- running ----------------------------------------------------------------------------------------

def test_run_all_outputs_one_output_and_intermediates():
    sess = InferenceSession(mlp())
    pre, y = mlp_expected(X)
    for names in (None, [], ["y"]):
        (got,) = sess.run(names, {"x": X})
        np.testing.assert_allclose(got, y, rtol=1e-6)
    got_pre, got_w, got_y, got_x = sess.run(["pre", "w", "y", "x"], {"x": X})
    np.testing.assert_allclose(got_pre, pre, rtol=1e-6)
    np.testing.assert_array_equal(got_w, (np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5).T)
    np.testing.assert_allclose(got_y, y, rtol=1e-6)
    np.testing.assert_array_equal(got_x, X)


def test_run_unknown_output_name():
    with pytest.raises(InputError, match=r"unknown output name\(s\) 'nope'.*'y'"):
        InferenceSession(mlp()).run(["y", "nope"], {"x": X})


def test_run_python_feeds():
    sess = InferenceSession(mlp())
    (got,) = sess.run(None, {"x": X.tolist()})             # nested lists take the declared float type
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, mlp_expected(X)[1], rtol=1e-6)
    m = model([helper.make_node("Cast", ["a"], ["af"], to=F), helper.make_node("Mul", ["af", "b"], ["c"])],
              [("a", I64, []), ("b", F, [2])], [("c", F, [2])])
    (c,) = InferenceSession(m).run(None, {"a": 3, "b": [0.5, 1.5]})   # Python scalar and list
    np.testing.assert_array_equal(c, np.array([1.5, 4.5], np.float32))
    with pytest.raises(InputError, match="expected element type float"):
        InferenceSession(m).run(None, {"a": 3, "b": np.array([1, 2], np.int32)})


def test_run_sequence_and_map_kinds():
    sess = InferenceSession(kinds_model())
    n, y = sess.run(None, {"x": np.zeros((1, 3, 2), np.float32), "s": [np.array([1]), np.array([2, 3])],
                           "m": {1: 0.5}, "u": np.zeros(1, np.float32)})
    assert n == 2 and n.dtype == np.int64
    np.testing.assert_array_equal(y, np.tile(np.array([10, 20], np.float32), (1, 3, 1)))


def test_overridable_initializer_fed():
    sess = InferenceSession(kinds_model())
    feeds = {"x": np.ones((1, 1, 2), np.float32), "s": [], "m": {}, "u": np.zeros(1, np.float32)}
    np.testing.assert_array_equal(sess.run(["y"], feeds)[0], [[[11, 21]]])
    np.testing.assert_array_equal(sess.run(["y"], {**feeds, "k": np.array([1, 2], np.float32)})[0], [[[2, 3]]])


def test_kernel_error_names_the_node():
    m = model([helper.make_node("Reshape", ["x", "shape"], ["y"], name="bad_reshape")],
              [("x", F, [2, 3]), ("shape", I64, [1])], [("y", F, None)])
    with pytest.raises(KernelError, match="bad_reshape"):
        InferenceSession(m).run(None, {"x": np.zeros((2, 3), np.float32), "shape": np.array([5])})


def test_threads_share_one_session():
    """32 concurrent runs over 8 threads, each with its own inputs and output set (plans built
    concurrently on first need), all equal to the single-threaded answer."""
    sess = InferenceSession(mlp())
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((int(rng.integers(1, 50)), 3)).astype(np.float32) for _ in range(32)]
    outputs = [["y"], ["pre", "y"], ["act"], None]
    expected = []
    for i, x in enumerate(xs):
        pre, y = mlp_expected(x)
        expected.append({0: [y], 1: [pre, y], 2: [np.maximum(pre, 0)], 3: [y]}[i % 4])
    barrier = threading.Barrier(8)
    results: dict[int, list] = {}
    errors = []

    def work(t):
        barrier.wait()
        try:
            for i in range(t, len(xs), 8):
                for _ in range(5):
                    got = sess.run(outputs[i % 4], {"x": xs[i]})
                    assert all(np.allclose(g, e, rtol=1e-5, atol=1e-6) for g, e in zip(got, expected[i]))
                results[i] = got
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert sorted(results) == list(range(32))


# -- options and their warnings -----------------------------------------------------------------------

def test_optimization_level_maps_to_optimize():
    assert InferenceSession(mlp()).prepared.optimize is True
    so = SessionOptions()
    so.graph_optimization_level = onnx_mini.GraphOptimizationLevel.ORT_DISABLE_ALL
    with warnings.catch_warnings():
        warnings.simplefilter("error")           # an honoured field does not warn
        sess = InferenceSession(mlp(), so)
    assert sess.prepared.optimize is False
    assert "Transpose" in [i.op_type for i in sess.prepared.plan.infos]          # not folded
    assert "Transpose" not in [i.op_type for i in InferenceSession(mlp()).prepared.plan.infos]
    np.testing.assert_allclose(sess.run(None, {"x": X})[0], mlp_expected(X)[1], rtol=1e-6)
    so.graph_optimization_level = onnx_mini.GraphOptimizationLevel.ORT_ENABLE_BASIC
    assert InferenceSession(mlp(), so).prepared.optimize is True
    assert InferenceSession(mlp(), so, optimize=False).prepared.optimize is False   # explicit wins


def test_options_fields_and_defaults():
    so = SessionOptions(intra_op_num_threads=0)
    assert so.graph_optimization_level == onnx_mini.GraphOptimizationLevel.ORT_ENABLE_ALL
    assert so.execution_mode == onnx_mini.ExecutionMode.ORT_SEQUENTIAL and so.intra_op_num_threads == 0
    with pytest.raises(AttributeError, match="no field 'intra_op_threads'"):
        so.intra_op_threads = 2
    with pytest.raises(AttributeError):
        RunOptions().nope
    ro = RunOptions(logid="x")
    assert ro.logid == "x" and ro.terminate is False
    so.add_session_config_entry("session.x", "1")
    assert so.get_session_config_entry("session.x") == "1"
    with pytest.warns(IgnoredOptionWarning, match="'session.x'"):
        sess = InferenceSession(mlp(), so)
    assert sess.get_session_options() is so


@pytest.mark.parametrize("field,value", [
    ("inter_op_num_threads", 2),
    ("execution_mode", onnx_mini.ExecutionMode.ORT_PARALLEL),
    ("optimized_model_filepath", "opt.onnx"), ("log_verbosity_level", 1), ("logid", "mine"),
    ("enable_cpu_mem_arena", False), ("enable_mem_pattern", False), ("enable_mem_reuse", False),
    ("use_per_session_threads", False),
    ("execution_order", onnx_mini.ExecutionOrder.PRIORITY_BASED)])
def test_ignored_session_option_warns_once(field, value):
    so = SessionOptions()
    setattr(so, field, value)
    with pytest.warns(IgnoredOptionWarning, match=rf"SessionOptions\.{field} \(set to") as record:
        InferenceSession(mlp(), so)
    assert len(record) == 1 and record[0].filename == __file__      # points at the caller's line
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        InferenceSession(mlp(), so)                                 # once per process


def test_intra_op_num_threads_caps_onnx_mini_kernel_threads(monkeypatch):
    # A 2048x2048 GatherElements splits its blocks over the thread pool; with intra_op_num_threads=1
    # the session's runs must not touch the pool, and other sessions keep using it.
    from onnx_mini import parallel
    if parallel.THREADS < 2:
        pytest.skip("this machine (or ONNX_MINI_THREADS) gives onnx_mini a single thread")
    node = helper.make_node("GatherElements", ["x", "i"], ["y"], axis=1)
    m = helper.make_model(helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2048, 2048]),
                      helper.make_tensor_value_info("i", TensorProto.INT64, [2048, 2048])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2048, 2048])]),
        opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((2048, 2048)).astype(np.float32),
             "i": rng.integers(0, 2048, (2048, 2048))}
    expected = np.take_along_axis(feeds["x"], feeds["i"], axis=1)
    used = []
    real = parallel._get_pool
    monkeypatch.setattr(parallel, "_get_pool", lambda: used.append(1) or real())
    one = SessionOptions()
    one.intra_op_num_threads = 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")                # honoured: no "ignored" warning
        (y,) = InferenceSession(m, one).run(None, feeds)
    np.testing.assert_array_equal(y, expected)
    assert used == []
    (y,) = InferenceSession(m).run(None, feeds)
    np.testing.assert_array_equal(y, expected)
    assert used


def test_default_or_honoured_options_do_not_warn():
    so = SessionOptions()
    so.intra_op_num_threads = 0                  # the default: nothing is being ignored
    so.execution_mode = onnx_mini.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    so.use_deterministic_compute = True
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sess = InferenceSession(mlp(), so, providers=["CPUExecutionProvider"])
        sess.run(None, {"x": X}, RunOptions(log_severity_level=2, only_execute_path_to_fetches=True))


@pytest.mark.parametrize("field,value", [("terminate", True), ("logid", "r"), ("log_verbosity_level", 2)])
def test_ignored_run_option_warns_once(field, value):
    sess = InferenceSession(mlp())
    ro = RunOptions()
    setattr(ro, field, value)
    with pytest.warns(IgnoredOptionWarning, match=rf"RunOptions\.{field}"):
        sess.run(None, {"x": X}, ro)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sess.run(None, {"x": X}, ro)


def test_config_entries_warn():
    so = SessionOptions()
    so.add_session_config_entry("session.disable_prepacking", "1")
    with pytest.warns(IgnoredOptionWarning, match="'session.disable_prepacking'"):
        sess = InferenceSession(mlp(), so)
    ro = RunOptions()
    ro.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    with pytest.warns(IgnoredOptionWarning, match="RunOptions config entry"):
        sess.run(None, {"x": X}, ro)
    with pytest.warns(IgnoredOptionWarning, match="free dimension overrides"):
        so.add_free_dimension_override_by_name("N", 2)


def test_unknown_providers_options_and_arguments_warn():
    with pytest.warns(IgnoredOptionWarning, match="no CUDAExecutionProvider"):
        sess = InferenceSession(mlp(), providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert sess.get_providers() == ["CPUExecutionProvider"]
    with pytest.warns(IgnoredOptionWarning, match="options of CPUExecutionProvider"):
        InferenceSession(mlp(), providers=[("CPUExecutionProvider", {"arena_extend_strategy": "x"})])
    with pytest.warns(IgnoredOptionWarning, match="provider_options"):
        InferenceSession(mlp(), providers=["CPUExecutionProvider"], provider_options=[{"a": "b"}])
    with pytest.warns(IgnoredOptionWarning, match="argument 'disabled_optimizers'"):
        InferenceSession(mlp(), disabled_optimizers=["ConstantFolding"])
    with pytest.warns(IgnoredOptionWarning, match="no TensorrtExecutionProvider"):
        sess.set_providers(["TensorrtExecutionProvider"])


@pytest.mark.skipif(not HAS_ORT, reason="onnxruntime is not installed")
def test_onnxruntime_options_objects_are_accepted():
    import onnxruntime
    so = onnxruntime.SessionOptions()
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.inter_op_num_threads = 3
    with pytest.warns(IgnoredOptionWarning, match="inter_op_num_threads"):
        sess = InferenceSession(mlp(), so)
    assert sess.prepared.optimize is False
    np.testing.assert_allclose(sess.run(None, {"x": X}, onnxruntime.RunOptions())[0], mlp_expected(X)[1], rtol=1e-6)


# -- the verbose trace -----------------------------------------------------------------------------

LINE = re.compile(r"\[\s*(\d+)\] (\S+) (\S+)-(\d+)  (.*) -> (.*)  (\d+\.\d+) ms$")


def test_verbose_session_traces_every_node(capsys):
    sess = InferenceSession(mlp(), verbose=True, optimize=False)
    sess.run(None, {"x": X})
    lines = capsys.readouterr().err.strip().splitlines()
    parsed = [LINE.match(line).groups() for line in lines]
    assert [(p[0], p[1], p[2], p[3]) for p in parsed] == [
        ("0", "transpose_w", "Transpose", "21"), ("1", "matmul", "MatMul", "13"), ("2", "add_bias", "Add", "14"),
        ("3", "relu", "Relu", "14"), ("4", "double", "Mul", "14")]
    assert parsed[1][4] == "x: float32[2, 3], w: float32[3, 2]" and parsed[1][5] == "xw: float32[2, 2]"
    assert parsed[4][4] == "act: float32[2, 2], two: float32[]"


def test_verbose_prepare_to_a_stream_and_log_severity():
    out = io.StringIO()
    prepared = onnx_mini.prepare(mlp(), verbose=out)
    prepared.run({"x": X})
    ops = [f"{i.domain}::{i.op_type}" if i.domain else i.op_type for i in prepared.plan.infos]
    assert [LINE.match(line).group(3) for line in out.getvalue().splitlines()] == ops and ops
    n = len(ops)
    so = SessionOptions(log_severity_level=0)
    err = io.StringIO()
    sys_err, sys.stderr = sys.stderr, err
    try:
        InferenceSession(mlp(), so).run(None, {"x": X})
        quiet = InferenceSession(mlp())
        quiet.run(None, {"x": X})
        n_before = len(err.getvalue().splitlines())
        quiet.run(None, {"x": X}, RunOptions(log_severity_level=0))     # this run only
        quiet.run(None, {"x": X})
    finally:
        sys.stderr = sys_err
    lines = err.getvalue().splitlines()
    assert n_before == n and len(lines) == 2 * n and all(LINE.match(line) for line in lines)


def test_trace_off_uses_the_plain_loop(monkeypatch):
    hooks = []
    real = onnx_mini.engine.execute
    monkeypatch.setattr(onnx_mini.engine, "execute", lambda plan, slots, hook=None: hooks.append(hook) or
                        real(plan, slots, hook))
    onnx_mini.prepare(mlp()).run({"x": X})
    onnx_mini.prepare(mlp(), verbose=io.StringIO()).run({"x": X})
    assert hooks[0] is None and callable(hooks[1])


# -- pickling --------------------------------------------------------------------------------------

def test_pickle_prepared_model_and_session():
    prepared = onnx_mini.prepare(mlp())
    again = pickle.loads(pickle.dumps(prepared))
    assert isinstance(again, onnx_mini.PreparedModel) and again.optimize and again.input_names == ["x"]
    np.testing.assert_array_equal(again.run({"x": X}).y, prepared.run({"x": X}).y)
    assert not again.model.graph.initializers["wt"].flags.writeable       # read-only again
    sess = InferenceSession(mlp(), SessionOptions(graph_optimization_level=0))
    sess2 = pickle.loads(pickle.dumps(sess))
    assert sess2.prepared.optimize is False and sess2.get_modelmeta() == sess.get_modelmeta()
    assert [(a.name, a.shape) for a in sess2.get_inputs()] == [("x", ["N", 3])]
    got = sess2.run(["pre", "y"], {"x": X})
    for g, e in zip(got, mlp_expected(X)):
        np.testing.assert_allclose(g, e, rtol=1e-6)


def test_pickle_keeps_external_data_and_reads_no_file(tmp_path):
    m = mlp()
    folder = tmp_path / "model"
    folder.mkdir()
    onnx.save(m, folder / "m.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
              location="weights.bin", size_threshold=0)
    sess = InferenceSession(str(folder / "m.onnx"))
    data = pickle.dumps(sess)
    (folder / "weights.bin").unlink()
    (folder / "m.onnx").unlink()
    folder.rmdir()
    np.testing.assert_allclose(pickle.loads(data).run(None, {"x": X})[0], mlp_expected(X)[1], rtol=1e-6)


def test_pickle_subgraphs_low_precision_and_verbose_stream():
    then = helper.make_graph([helper.make_node("Add", ["x", "c"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.BFLOAT16, [2])],
                             [numpy_helper.from_array(np.array([1, 2], ml_dtypes.bfloat16), "c")])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.BFLOAT16, [2])])
    m = model([helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)],
              [("cond", TensorProto.BOOL, []), ("x", TensorProto.BFLOAT16, [2])],
              [("y", TensorProto.BFLOAT16, [2])])
    prepared = onnx_mini.prepare(m, verbose=io.StringIO())
    again = pickle.loads(pickle.dumps(prepared))
    assert again.verbose is True                      # a stream does not travel: the copy traces to stderr
    again.verbose = False
    x = np.array([0.5, 1], ml_dtypes.bfloat16)
    np.testing.assert_array_equal(again.run([np.array(True), x]).y, np.array([1.5, 3], ml_dtypes.bfloat16))
    body = again.model.graph.nodes[0].attrs["then_branch"]
    assert not body.initializers["c"].flags.writeable


def test_session_runs_in_a_spawned_process():
    sess = InferenceSession(mlp())
    # get(timeout=...): a worker that never answers fails the test instead of hanging the suite.
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        got = pool.apply_async(operator.methodcaller("run", ["pre", "y"], {"x": X}), (sess,)).get(timeout=120)
        prepared_got = pool.apply_async(operator.methodcaller("run", {"x": X}), (sess.prepared,)).get(timeout=120)
    for g, e in zip(got, mlp_expected(X)):
        np.testing.assert_allclose(g, e, rtol=1e-6)
    np.testing.assert_allclose(prepared_got.y, mlp_expected(X)[1], rtol=1e-6)


# -- the onnxruntime-swap example ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def example_runs(tmp_path_factory):
    """Run examples/ort_swap.py once per runtime (memoised), as a user would."""
    done = {}

    def run(*flags):
        if flags not in done:
            out = tmp_path_factory.mktemp("swap") / "out.npz"
            proc = subprocess.run([sys.executable, str(ROOT / "examples" / "ort_swap.py"), "--save", str(out),
                                   *flags], capture_output=True, text=True, timeout=120)
            assert proc.returncode == 0, proc.stderr
            assert "IgnoredOptionWarning" not in proc.stderr
            done[flags] = proc.stdout, np.load(out)
        return done[flags]
    return run


def test_ort_swap_example_onnx_mini(example_runs):
    stdout, got = example_runs()
    assert "runtime: onnx_mini; providers: ['CPUExecutionProvider']" in stdout
    assert "input  features: tensor(float) ['batch', 8]" in stdout
    assert got["label"].shape == (5,) and got["probabilities"].shape == (5, 4)
    np.testing.assert_allclose(got["probabilities"].sum(axis=1), 1, rtol=1e-6)


def test_ort_swap_example_same_with_onnxruntime(example_runs):
    if not HAS_ORT:
        pytest.skip("onnxruntime is not installed")
    out_mini, mini = example_runs()
    out_ort, ort = example_runs("--onnxruntime")
    assert "runtime: onnxruntime" in out_ort
    assert out_mini.splitlines()[1:] == out_ort.splitlines()[1:]       # same description and labels
    np.testing.assert_array_equal(mini["label"], ort["label"])
    np.testing.assert_allclose(mini["probabilities"], ort["probabilities"], rtol=1e-5, atol=1e-6)


# -- module functions: logger, providers, device -----------------------------------------------------

@pytest.fixture
def default_logger():
    yield
    onnx_mini.set_default_logger_severity(2)


def test_logger_severity_is_validated_and_acts(default_logger, capsys):
    for bad in (-1, 5, 100):
        with pytest.raises(ArgumentError, match=rf"{bad} is not in 0\.\.4 \(0: verbose") as e:
            onnx_mini.set_default_logger_severity(bad)
        assert isinstance(e.value, ValueError)
    for bad in (1.5, "1", None):
        with pytest.raises(ArgumentError, match="set_default_logger_severity expects an int"):
            onnx_mini.set_default_logger_severity(bad)
    for ok in (-1, 0, 7, 1000, np.int64(3)):                 # onnxruntime takes any int: no effect in release builds
        onnx_mini.set_default_logger_verbosity(ok)
    with pytest.raises(ArgumentError, match="set_default_logger_verbosity expects an int"):
        onnx_mini.set_default_logger_verbosity(0.5)
    # 3 and 4 (errors only) silence IgnoredOptionWarning; back at 2 it is given (it was not spent)
    onnx_mini.set_default_logger_severity(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        InferenceSession(mlp(), providers=["CUDAExecutionProvider"])
    onnx_mini.set_default_logger_severity(2)
    with pytest.warns(IgnoredOptionWarning, match="no CUDAExecutionProvider"):
        InferenceSession(mlp(), providers=["CUDAExecutionProvider"])
    # 0 (verbose) traces the sessions created afterwards that keep log_severity_level at -1
    onnx_mini.set_default_logger_severity(0)
    InferenceSession(mlp(), optimize=False).run(None, {"x": X})
    InferenceSession(mlp(), SessionOptions(log_severity_level=3), optimize=False).run(None, {"x": X})
    onnx_mini.set_default_logger_severity(2)
    InferenceSession(mlp(), optimize=False).run(None, {"x": X})
    lines = capsys.readouterr().err.splitlines()
    assert [LINE.match(line).group(2) for line in lines] == ["transpose_w", "matmul", "add_bias", "relu", "double"]


@pytest.mark.skipif(not HAS_ORT, reason="onnxruntime is not installed")
def test_module_functions_match_onnxruntime():
    import onnxruntime
    assert onnx_mini.get_device() == onnxruntime.get_device() == "CPU"
    assert "CPUExecutionProvider" in onnxruntime.get_available_providers()   # (its build adds Azure's)
    for f in ("set_default_logger_severity", "set_default_logger_verbosity"):
        for module in (onnx_mini, onnxruntime):
            getattr(module, f)(3)
            getattr(module, f)(2)
    with pytest.raises(Exception):
        onnxruntime.set_default_logger_severity(5)


def test_input_errors_are_value_errors():
    sess = InferenceSession(mlp())
    for feeds, message in (({}, r"missing input\(s\) 'x'"), ({"x": X, "q": X}, r"unknown input name\(s\) 'q'")):
        with pytest.raises(ValueError, match=message) as e:
            sess.run(None, feeds)
        assert isinstance(e.value, InputError)
    with pytest.raises(ValueError, match="unknown output"):
        sess.run(["nope"], {"x": X})


# -- OrtValue ----------------------------------------------------------------------------------------------

def test_ortvalue_from_numpy_shares_memory_and_describes_itself():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    v = onnx_mini.OrtValue.ortvalue_from_numpy(a)
    assert (v.shape(), v.data_type(), v.element_type(), v.device_name()) == ([2, 3], "tensor(float)", 1, "cpu")
    assert v.is_tensor() and v.has_value() and not v.is_tensor_sequence() and not v.is_sparse_tensor()
    assert v.tensor_size_in_bytes() == 24 and v.data_ptr() == a.ctypes.data
    a[1, 2] = 50
    assert v.numpy()[1, 2] == 50                      # same memory, both ways (as onnxruntime's CPU values)
    v.numpy()[0, 0] = -7
    assert a[0, 0] == -7
    assert repr(v) == "<onnx_mini.OrtValue tensor(float) [2, 3]>"
    scalar = onnx_mini.OrtValue.ortvalue_from_numpy(np.array(2.5))
    assert scalar.shape() == [] and scalar.data_type() == "tensor(double)" and scalar.numpy() == 2.5
    strided = np.arange(12, dtype=np.int32).reshape(3, 4)[:, ::2]
    c = onnx_mini.OrtValue.ortvalue_from_numpy(strided, "cpu", 0)   # not contiguous: a contiguous copy
    np.testing.assert_array_equal(c.numpy(), [[0, 2], [4, 6], [8, 10]])
    assert not np.shares_memory(c.numpy(), strided) and c.numpy().flags.c_contiguous


@pytest.mark.parametrize("dtype,type_string,elem", [
    (np.float64, "tensor(double)", 11), (np.int64, "tensor(int64)", 7), (np.int32, "tensor(int32)", 6),
    (np.bool_, "tensor(bool)", 9), (np.float16, "tensor(float16)", 10), (np.uint8, "tensor(uint8)", 2),
    (np.int8, "tensor(int8)", 3), (np.uint16, "tensor(uint16)", 4), (np.uint64, "tensor(uint64)", 13),
    (ml_dtypes.bfloat16, "tensor(bfloat16)", 16), (ml_dtypes.float8_e4m3fn, "tensor(float8e4m3fn)", 17),
    (np.str_, "tensor(string)", 8), (object, "tensor(string)", 8), (np.complex64, "tensor(complex64)", 14)])
def test_ortvalue_element_types(dtype, type_string, elem):
    a = np.array(["a", "b"], dtype) if dtype in (np.str_, object) else np.array([1, 0], dtype)
    v = onnx_mini.OrtValue.ortvalue_from_numpy(a)
    assert (v.data_type(), v.element_type()) == (type_string, elem)
    blank = onnx_mini.OrtValue.ortvalue_from_shape_and_type([2], elem)
    assert blank.data_type() == type_string and blank.numpy().tolist() == ([""] * 2 if elem == 8 else [0, 0])


def test_ortvalue_factories_and_their_errors():
    from onnx_mini.errors import UnsupportedDeviceError
    OrtValue = onnx_mini.OrtValue
    blank = OrtValue.ortvalue_from_shape_and_type((3, 2), np.float32)
    assert blank.shape() == [3, 2] and blank.numpy().dtype == np.float32 and not blank.numpy().any()
    bits = np.array([0x3F80, 0x4000, 0xC040], np.uint16)                  # 1, 2, -3 as bfloat16
    bf = OrtValue.ortvalue_from_numpy_with_onnx_type(bits, TensorProto.BFLOAT16)
    assert bf.data_type() == "tensor(bfloat16)" and bf.numpy().astype(np.float32).tolist() == [1, 2, -3]
    with pytest.raises(ArgumentError, match="cannot hold bfloat16"):
        OrtValue.ortvalue_from_numpy_with_onnx_type(np.zeros(2, np.float32), TensorProto.BFLOAT16)
    with pytest.raises(ArgumentError, match="expects a numpy array, got list"):
        OrtValue.ortvalue_from_numpy([1.0, 2.0])
    for device in ("cuda", "gpu", "dml"):
        with pytest.raises(UnsupportedDeviceError, match=f"device_type '{device}': onnx_mini runs on the CPU") as e:
            OrtValue.ortvalue_from_numpy(X, device, 0)
        assert isinstance(e.value, RuntimeError)
        with pytest.raises(UnsupportedDeviceError):
            OrtValue.ortvalue_from_shape_and_type([2], np.float32, device)
    with pytest.raises(UnsupportedDeviceError, match="vendor_id 4318"):
        OrtValue.ortvalue_from_numpy(X, "cpu", 0, 4318)
    with pytest.raises(UnsupportedDeviceError, match="memory_info"):
        OrtValue.ortvalue_from_shape_and_type([2], np.float32, memory_info=object())
    with pytest.raises(ArgumentError, match="negative dimension"):
        OrtValue.ortvalue_from_shape_and_type([2, -1], np.float32)
    with pytest.raises(ArgumentError, match="over the limit"):
        OrtValue.ortvalue_from_shape_and_type([2**40], np.float32)
    with pytest.raises(ArgumentError, match="element_type must be a numpy type"):
        OrtValue.ortvalue_from_shape_and_type([2], "nope")
    with pytest.raises(ArgumentError, match="element type 999"):
        OrtValue.ortvalue_from_shape_and_type([2], 999)


def test_ortvalue_update_inplace():
    a = np.zeros((2, 2), np.float32)
    v = onnx_mini.OrtValue.ortvalue_from_numpy(a)
    v.update_inplace(np.array([1, 2, 3, 4], np.float32))        # same element count: reshaped into place
    np.testing.assert_array_equal(a, [[1, 2], [3, 4]])
    with pytest.raises(ArgumentError, match="expects 4 elements of float32, got float32\\[3\\]"):
        v.update_inplace(np.zeros(3, np.float32))
    with pytest.raises(ArgumentError, match="got float64"):
        v.update_inplace(np.zeros(4))


def seq_model():
    """x -> (SequenceConstruct(x, x), Identity(x))."""
    graph = helper.make_graph(
        [helper.make_node("SequenceConstruct", ["x", "x"], ["s"]), helper.make_node("Identity", ["x"], ["i"])],
        "g", [helper.make_tensor_value_info("x", F, [2])],
        [helper.make_tensor_sequence_value_info("s", F, None), helper.make_tensor_value_info("i", F, [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_run_with_ort_values():
    sess = InferenceSession(mlp())
    pre, y = mlp_expected(X)
    xv = onnx_mini.OrtValue.ortvalue_from_numpy(X)
    for names, expected in ((None, [y]), (["y"], [y]), (["pre", "y"], [pre, y])):
        outs = sess.run_with_ort_values(names, {"x": xv})
        assert all(isinstance(o, onnx_mini.OrtValue) for o in outs)
        for o, e in zip(outs, expected):
            np.testing.assert_allclose(o.numpy(), e, rtol=1e-6)
    (plain,) = sess.run_with_ort_values(None, {"x": X})          # numpy arrays are accepted too
    np.testing.assert_allclose(plain.numpy(), y, rtol=1e-6)
    np.testing.assert_allclose(sess.run(None, {"x": xv})[0], y, rtol=1e-6)   # run() takes OrtValues
    with pytest.raises(InputError, match="unknown output"):
        sess.run_with_ort_values(["nope"], {"x": xv})


def test_ort_value_outputs_own_writable_memory_and_carry_non_tensors():
    sess = InferenceSession(seq_model())
    x = np.array([1, 2], np.float32)
    s, i = sess.run_with_ort_values(None, {"x": onnx_mini.OrtValue.ortvalue_from_numpy(x)})
    # Identity's result is the caller's array in run(); an OrtValue output owns a writable copy
    assert not np.shares_memory(i.numpy(), x) and i.numpy().flags.writeable
    i.numpy()[0] = 9
    assert x[0] == 1
    assert not s.is_tensor() and s.is_tensor_sequence() and s.has_value()
    assert (s.data_type(), s.element_type(), s.device_name()) == ("seq(tensor(float))", 1, "cpu")
    with pytest.raises(ArgumentError, match=r"holds a seq\(tensor\(float\)\), not a tensor.*run\(\) returns sequences"):
        s.numpy()
    with pytest.raises(ArgumentError, match="not a tensor"):
        s.shape()


# -- IOBinding --------------------------------------------------------------------------------------------

def test_io_binding_runs_and_reads_outputs():
    sess = InferenceSession(mlp())
    pre, y = mlp_expected(X)
    b = sess.io_binding()
    assert b.get_outputs() == [] and b.copy_outputs_to_cpu() == []
    x = X.copy()
    b.bind_cpu_input("x", x)
    x[0, 0] = 10                                           # bound by reference: the run sees the change
    b.bind_output("y")
    b.bind_output("pre", "cpu", 0)                         # any value of the graph, as run()
    b.synchronize_inputs()
    assert sess.run_with_iobinding(b) is None
    b.synchronize_outputs()
    pre10, y10 = mlp_expected(x)
    assert [o.shape() for o in b.get_outputs()] == [[2, 2], [2, 2]]
    np.testing.assert_allclose(b.get_outputs()[0].numpy(), y10, rtol=1e-6)
    copies = b.copy_outputs_to_cpu()
    np.testing.assert_allclose(copies[1], pre10, rtol=1e-6)
    assert not np.shares_memory(copies[0], b.get_outputs()[0].numpy())
    b.clear_binding_inputs()
    with pytest.raises(InputError, match=r"missing input\(s\) 'x'"):
        sess.run_with_iobinding(b)
    b.bind_ortvalue_input("x", onnx_mini.OrtValue.ortvalue_from_numpy(X))
    b.clear_binding_outputs()
    with pytest.raises(InputError, match="no output is bound"):
        sess.run_with_iobinding(b)
    b.bind_output("pre")
    sess.run_with_iobinding(b, RunOptions())
    np.testing.assert_allclose(b.copy_outputs_to_cpu()[0], pre, rtol=1e-6)
    with pytest.raises(ArgumentError, match="an IOBinding from this session"):
        InferenceSession(mlp()).run_with_iobinding(b)


def test_io_binding_outputs_are_reused_while_their_shape_holds():
    """As onnxruntime: a binding's next runs write into the outputs it allocated (same shape and type)
    until the output is bound again; a new shape gets a new output (onnxruntime fails there)."""
    sess = InferenceSession(mlp())
    b = sess.io_binding()
    b.bind_output("y")
    b.bind_cpu_input("x", X)
    sess.run_with_iobinding(b)
    first = b.get_outputs()[0]
    view = first.numpy()
    b.bind_cpu_input("x", X + 1)
    sess.run_with_iobinding(b)
    assert b.get_outputs()[0] is first
    np.testing.assert_allclose(view, mlp_expected(X + 1)[1], rtol=1e-6)
    b.bind_cpu_input("x", X[:1])
    sess.run_with_iobinding(b)
    assert b.get_outputs()[0].shape() == [1, 2]
    np.testing.assert_allclose(view, mlp_expected(X + 1)[1], rtol=1e-6)     # the old one keeps its values
    b.bind_output("y")                                                       # bound again: a fresh output
    kept = b.get_outputs()[0].numpy()
    sess.run_with_iobinding(b)
    b.bind_cpu_input("x", X[1:])
    sess.run_with_iobinding(b)
    np.testing.assert_allclose(kept, mlp_expected(X[:1])[1], rtol=1e-6)
    np.testing.assert_allclose(b.get_outputs()[0].numpy(), mlp_expected(X[1:])[1], rtol=1e-6)


def test_io_binding_preallocated_outputs_and_pointers():
    OrtValue = onnx_mini.OrtValue
    sess = InferenceSession(mlp())
    pre, y = mlp_expected(X)
    out = OrtValue.ortvalue_from_shape_and_type([2, 2], np.float32)
    b = sess.io_binding()
    b.bind_cpu_input("x", X)
    b.bind_ortvalue_output("y", out)
    sess.run_with_iobinding(b)
    assert b.get_outputs()[0] is out
    np.testing.assert_allclose(out.numpy(), y, rtol=1e-6)
    # the pointer forms take OrtValue.data_ptr(): here a 6-float buffer seen as [3, 1] and a [2, 2] prefix
    xv = OrtValue.ortvalue_from_numpy(np.concatenate([X.ravel(), [0, 0, 0]]).astype(np.float32))
    big = np.full(6, -1, np.float32)
    bv = OrtValue.ortvalue_from_numpy(big)
    p = sess.io_binding()
    p.bind_input("x", "cpu", 0, np.float32, [2, 3], xv.data_ptr())
    p.bind_output("y", "cpu", 0, TensorProto.FLOAT, [2, 2], bv.data_ptr())
    sess.run_with_iobinding(p)
    np.testing.assert_allclose(big[:4], y.ravel(), rtol=1e-6)
    assert big[4:].tolist() == [-1, -1]
    # what cannot be honoured fails clearly
    with pytest.raises(ArgumentError, match=r"cannot read memory at 0x[0-9a-f]+.*bind_cpu_input\(name, array\)"):
        p.bind_input("x", "cpu", 0, np.float32, [2, 3], X.ctypes.data)        # a plain array's address
    with pytest.raises(ArgumentError, match="element type float64 does not match"):
        p.bind_input("x", "cpu", 0, np.float64, [2, 3], xv.data_ptr())
    with pytest.raises(ArgumentError, match=r"needs 12 elements, the OrtValue .* holds 9"):
        p.bind_input("x", "cpu", 0, np.float32, [4, 3], xv.data_ptr())
    with pytest.raises(ArgumentError, match="element_type and shape are required"):
        p.bind_output("y", "cpu", 0, None, None, bv.data_ptr())
    wrong = OrtValue.ortvalue_from_shape_and_type([3, 2], np.float32)
    p.bind_ortvalue_output("y", wrong)
    with pytest.raises(InputError, match=r"'y' is bound to a preallocated float32\[3, 2\] but the run computed "
                                         r"float32\[2, 2\]"):
        sess.run_with_iobinding(p)


def test_io_binding_bad_names_devices_and_values():
    from onnx_mini.errors import UnsupportedDeviceError
    b = InferenceSession(mlp()).io_binding()
    with pytest.raises(InputError, match="'nope' is not an input of the model \\(its inputs are 'x'\\)") as e:
        b.bind_cpu_input("nope", X)
    assert isinstance(e.value, ValueError)
    with pytest.raises(InputError, match="'nope' is not a value of the graph"):
        b.bind_output("nope")
    with pytest.raises(UnsupportedDeviceError, match="'cuda'"):
        b.bind_output("y", "cuda")
    with pytest.raises(UnsupportedDeviceError, match="'cuda'"):
        b.bind_input("x", "cuda", 0, np.float32, [2, 3], 12345)
    with pytest.raises(ArgumentError, match="expects an onnx_mini.OrtValue, got ndarray"):
        b.bind_ortvalue_input("x", X)
    with pytest.raises(ArgumentError, match="holding a tensor"):
        b.bind_ortvalue_output("y", X)


# -- profiling ----------------------------------------------------------------------------------------

PROFILE_NAME = re.compile(r"(.*)_(\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d)_(\d{3})\.json")


def profiled(tmp_path, **kw) -> InferenceSession:
    so = SessionOptions(enable_profiling=True, profile_file_prefix=str(tmp_path / "prof"))
    return InferenceSession(mlp(), so, optimize=False, **kw)


def read_profile(name: str) -> tuple[list, list, list]:
    with open(name) as f:
        events = json.load(f)
    return (events, [e for e in events if e["cat"] == "Node"],
            [e for e in events if e["cat"] == "Session" and e["name"] == "model_run"])


def test_profiling_off_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sess = InferenceSession(mlp())
    sess.run(None, {"x": X})
    assert sess.end_profiling() == "" and sess.get_profiling_start_time_ns() == 0
    assert list(tmp_path.iterdir()) == []


def test_profiling_writes_onnxruntime_trace(tmp_path):
    before = time.time_ns()
    sess = profiled(tmp_path)
    start = sess.get_profiling_start_time_ns()
    assert before <= start <= time.time_ns()
    for x in (X, X[:1]):
        sess.run(None, {"x": x})
    name = sess.end_profiling()
    assert sess.end_profiling() == "" and sess.get_profiling_start_time_ns() == start
    sess.run(None, {"x": X})                                   # profiling has ended: nothing recorded
    prefix, date, ms = PROFILE_NAME.fullmatch(name).groups()
    assert prefix == str(tmp_path / "prof")
    assert f"{date}_{ms}" == time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(start // 10**9)) + \
        f"_{start // 10**6 % 1000:03d}"
    events, nodes, runs = read_profile(name)
    assert [e["name"] for e in events if e["cat"] == "Session" and e["name"] != "model_run"] == [
        "model_loading_array", "session_initialization"]        # a ModelProto: loaded as bytes
    assert len(runs) == 2
    assert all(e["ph"] == "X" and e["pid"] == os.getpid() and e["tid"] == threading.get_native_id() for e in events)
    names = ["transpose_w", "matmul", "add_bias", "relu", "double"]
    assert [e["name"] for e in nodes] == [f"{n}_kernel_time" for n in names] * 2
    assert [e["args"]["op_name"] for e in nodes[:5]] == ["Transpose", "MatMul", "Add", "Relu", "Mul"]
    assert {e["args"]["provider"] for e in nodes} == {"CPUExecutionProvider"}
    assert [e["args"]["node_index"] for e in nodes] == ["0", "1", "2", "3", "4"] * 2
    matmul = nodes[6]["args"]                                   # second run, batch 1: x [1, 3], w [3, 2]
    assert (matmul["input_type_shape"], matmul["output_type_shape"]) == (
        [{"float": [1, 3]}, {"float": [3, 2]}], [{"float": [1, 2]}])
    assert (matmul["activation_size"], matmul["parameter_size"], matmul["output_size"]) == ("36", "0", "8")
    transpose = nodes[0]["args"]                                # its input is the initializer wt [2, 3]
    assert (transpose["activation_size"], transpose["parameter_size"]) == ("0", "24")
    for run, its_nodes in zip(runs, (nodes[:5], nodes[5:])):
        assert all(isinstance(e["ts"], int) and isinstance(e["dur"], int) for e in its_nodes)
        last = its_nodes[-1]
        assert run["ts"] <= its_nodes[0]["ts"] and last["ts"] + last["dur"] <= run["ts"] + run["dur"] + 1
        assert [e["ts"] for e in its_nodes] == sorted(e["ts"] for e in its_nodes)
        assert sum(e["dur"] for e in its_nodes) <= run["dur"]


def test_profiling_default_prefix_unnamed_nodes_and_the_trace(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    m = model([helper.make_node("Neg", ["x"], ["n"]), helper.make_node("Abs", ["n"], ["y"], name="abs")],
              [("x", F, [2])], [("y", F, [2])])
    path = tmp_path / "m.onnx"
    onnx.save(m, path)
    sess = InferenceSession(str(path), SessionOptions(enable_profiling=True), verbose=True)
    np.testing.assert_array_equal(sess.run(None, {"x": np.array([1, -2], np.float32)})[0], [1, 2])
    name = sess.end_profiling()
    assert name.startswith("onnxruntime_profile__") and (tmp_path / name).is_file()
    events, nodes, _ = read_profile(name)
    assert events[0]["name"] == "model_loading_uri"
    assert [e["name"] for e in nodes] == ["Neg_0_kernel_time", "abs_kernel_time"]
    assert [LINE.match(line).group(2) for line in capsys.readouterr().err.splitlines()] == ["Neg_0", "abs"]


def test_profiling_concurrent_runs_and_extra_hook_calls(tmp_path, monkeypatch):
    """Runs from several threads each file their own events; every hook call is an event (the
    executor may also report the nodes of control-flow bodies)."""
    from onnx_mini.plan import StepInfo
    sess = profiled(tmp_path)
    barrier = threading.Barrier(4)

    def work(_):
        barrier.wait()
        for _ in range(5):
            sess.run(None, {"x": X})
        return threading.get_native_id()
    with ThreadPoolExecutor(4) as pool:
        tids = set(pool.map(work, range(4)))
    real = onnx_mini.engine.execute
    body = StepInfo("loop/body_add", "Add", "", 14, 21, ("a", "b"), ("c",))

    def execute(plan, slots, hook=None):
        out = real(plan, slots, hook)
        hook(body, (np.zeros(2, np.float32), np.ones(2, np.float32)), (np.ones(2, np.float32),))
        return out
    monkeypatch.setattr(onnx_mini.engine, "execute", execute)
    sess.run(None, {"x": X})
    _, nodes, runs = read_profile(sess.end_profiling())
    assert len(runs) == 21 and len(nodes) == 20 * 5 + 6
    assert {e["tid"] for e in runs[:20]} == tids
    assert [e["name"] for e in nodes[-2:]] == ["double_kernel_time", "loop/body_add_kernel_time"]
    assert nodes[-1]["args"]["node_index"] == "5" and nodes[-1]["args"]["input_type_shape"] == [{"float": [2]}] * 2


def if_model():
    """z = |If(c, then: -(x + x), else: x)|."""
    then = helper.make_graph([helper.make_node("Add", ["x", "x"], ["t"], name="twice"),
                              helper.make_node("Neg", ["t"], ["t2"])], "then", [],
                             [helper.make_tensor_value_info("t2", F, [2])])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["e"], name="same")], "else", [],
                              [helper.make_tensor_value_info("e", F, [2])])
    return model([helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="branch"),
                  helper.make_node("Abs", ["y"], ["z"], name="abs")],
                 [("c", TensorProto.BOOL, []), ("x", F, [2])], [("z", F, [2])], opset=17, ir_version=8)


def test_profiling_control_flow_bodies(tmp_path):
    """A body's nodes are events of their own, before their parent's, which spans them; names and
    node_index within their own graph, as onnxruntime's."""
    feeds = {"c": np.array(True), "x": np.array([1, -2], np.float32)}
    so = SessionOptions(enable_profiling=True, profile_file_prefix=str(tmp_path / "if"))
    sess = InferenceSession(if_model(), so, optimize=False)
    np.testing.assert_array_equal(sess.run(None, feeds)[0], [2, 4])
    _, nodes, _ = read_profile(sess.end_profiling())
    got = [(e["name"], e["args"]["op_name"], e["args"]["node_index"]) for e in nodes]
    assert got == [("twice_kernel_time", "Add", "0"), ("Neg_1_kernel_time", "Neg", "1"),
                   ("branch_kernel_time", "If", "0"), ("abs_kernel_time", "Abs", "1")]
    assert [e["args"].get("path") for e in nodes] == ["branch/then_branch/twice", "branch/then_branch/Neg_1",
                                                      None, None]
    body, parent = nodes[:2], nodes[2]          # the If's time includes its body's (without the bookkeeping)
    assert parent["ts"] <= body[0]["ts"] <= body[1]["ts"] and parent["dur"] >= body[0]["dur"] + body[1]["dur"]
    if HAS_ORT:
        import onnxruntime
        theirs = onnxruntime.SessionOptions()
        theirs.enable_profiling = True
        theirs.profile_file_prefix = str(tmp_path / "if_ort")
        theirs.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
        ort_sess = onnxruntime.InferenceSession(if_model().SerializeToString(), theirs,
                                                providers=["CPUExecutionProvider"])
        ort_sess.run(None, feeds)
        _, ort_nodes, _ = read_profile(ort_sess.end_profiling())
        assert [(e["name"], e["args"]["op_name"], e["args"]["node_index"]) for e in ort_nodes] == got


@pytest.mark.skipif(not HAS_ORT, reason="onnxruntime is not installed")
def test_profiling_through_onnxruntime_options(tmp_path):
    import onnxruntime
    so = onnxruntime.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "theirs")
    sess = InferenceSession(mlp(), so)
    sess.run(None, {"x": X})
    name = sess.end_profiling()
    assert PROFILE_NAME.fullmatch(name).group(1) == str(tmp_path / "theirs")
    assert len(read_profile(name)[2]) == 1


# -- onnxruntime names onnx_mini lacks --------------------------------------------------------------------

def test_missing_onnxruntime_names_say_what_to_use():
    sess = InferenceSession(mlp())
    cases = [
        (lambda: onnx_mini.set_seed, r"onnx_mini\.set_seed \(onnxruntime\) is not available in onnx_mini: .*`seed`"),
        (lambda: onnx_mini.OrtDevice, "runs on the CPU only"),
        (lambda: onnx_mini.capi, "no C extension"),
        (lambda: sess.run_async, r"InferenceSession\.run_async .*use run\(\).*thread-safe"),
        (lambda: sess.get_input_memory_infos, "runs on the CPU only"),
        (lambda: SessionOptions().register_custom_ops_library,
         r"SessionOptions\.register_custom_ops_library \(onnxruntime\) is not available in onnx_mini: .*custom_ops="),
        (lambda: SessionOptions().add_provider, "single execution provider, CPUExecutionProvider"),
        (lambda: RunOptions().add_active_adapter, "LoRA"),
        (lambda: onnx_mini.OrtValue.ortvalue_from_numpy(X).from_dlpack, r"numpy\.from_dlpack"),
        (lambda: sess.io_binding().get_outputs_as_ortvaluevector, r"use get_outputs\(\)"),
    ]
    for get, message in cases:
        with pytest.raises(AttributeError, match=message):
            get()
    readme = r"the onnxruntime API onnx_mini provides: README\.md, section 'Drop-in for onnxruntime'"
    for get, message in [
            (lambda: onnx_mini.no_such_name, rf"module 'onnx_mini' has no attribute 'no_such_name' \({readme}"),
            (lambda: sess.no_such_method, rf"'InferenceSession' has no attribute 'no_such_method' \({readme}"),
            (lambda: SessionOptions().no_such_field, rf"SessionOptions has no field 'no_such_field' \({readme}")]:
        with pytest.raises(AttributeError, match=message):
            get()
    assert not hasattr(onnx_mini, "__wrapped__") and not hasattr(sess, "__array__")
    with pytest.raises(AttributeError) as e:
        onnx_mini.__nope__
    assert "README" not in str(e.value)                      # Python's own probes get the plain message
    sess.enable_fallback()                                   # one provider: nothing to fall back from
    sess.disable_fallback()
    assert pickle.loads(pickle.dumps(sess)).run(None, {"x": X})[0].shape == (2, 2)


def test_unsupported_table_names_nothing_onnx_mini_has():
    from onnx_mini.ort_api import UNSUPPORTED
    ours = {"onnx_mini": onnx_mini, "InferenceSession": InferenceSession(mlp()), "SessionOptions": SessionOptions(),
            "RunOptions": RunOptions(), "OrtValue": onnx_mini.OrtValue.ortvalue_from_numpy(X),
            "IOBinding": InferenceSession(mlp()).io_binding()}
    assert sorted(UNSUPPORTED) == sorted(ours)
    for owner, names in UNSUPPORTED.items():
        for name in names:
            with pytest.raises(AttributeError, match=r"\(onnxruntime\) is not available in onnx_mini: "):
                getattr(ours[owner], name)


@pytest.mark.skipif(not HAS_ORT, reason="onnxruntime is not installed")
def test_unsupported_table_names_onnxruntime_api():
    import onnxruntime
    from onnx_mini.ort_api import UNSUPPORTED
    theirs = {"onnx_mini": onnxruntime, "InferenceSession": onnxruntime.InferenceSession,
              "SessionOptions": onnxruntime.SessionOptions(), "RunOptions": onnxruntime.RunOptions(),
              "OrtValue": onnxruntime.OrtValue, "IOBinding": onnxruntime.IOBinding}
    invented = [f"{o}.{n}" for o, names in UNSUPPORTED.items() for n in names if not hasattr(theirs[o], n)]
    assert not invented
