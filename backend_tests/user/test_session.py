"""InferenceSession as a drop-in for onnxruntime's: description, options and their warnings, runs
(any intermediate value, Python feeds, many threads), the verbose trace, and pickling."""
from __future__ import annotations

import importlib.util
import io
import multiprocessing
import operator
import pickle
import re
import subprocess
import sys
import threading
import warnings
from pathlib import Path

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
from onnx_mini.errors import InputError, KernelError

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
    ("execution_mode", onnx_mini.ExecutionMode.ORT_PARALLEL), ("enable_profiling", True),
    ("optimized_model_filepath", "opt.onnx"), ("log_verbosity_level", 1), ("logid", "mine"),
    ("enable_cpu_mem_arena", False), ("enable_mem_pattern", False), ("enable_mem_reuse", False),
    ("use_per_session_threads", False), ("profile_file_prefix", "p"),
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
