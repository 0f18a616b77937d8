"""The `onnx-mini` command (run as a user runs it: a subprocess), the examples, and the docs."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_mini.cli import main, operator_table

from helpers import REPO

ROOT = REPO
EXAMPLES = ROOT / "examples"
RESNET = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / "light_resnet50.onnx"

try:
    import onnxruntime  # noqa: F401
    HAVE_ORT = True
except ImportError:
    HAVE_ORT = False


def cli(*args, progress: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "ONNX_MINI_PROGRESS": "1" if progress else "0"}
    return subprocess.run([sys.executable, "-m", "onnx_mini.cli", *map(str, args)], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=300)


def example(name: str) -> str:
    return subprocess.run([sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, check=True,
                          cwd=ROOT, timeout=300).stdout


def no_traceback(r: subprocess.CompletedProcess) -> bool:
    return "Traceback" not in r.stderr and "Traceback" not in r.stdout


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The demo's sales model, and a model with an operator onnx_mini does not have (with metadata)."""
    d = tmp_path_factory.mktemp("models")
    sys.path.insert(0, str(EXAMPLES))
    try:
        import demo
    finally:
        sys.path.remove(str(EXAMPLES))
    sales = d / "sales.onnx"
    onnx.save(demo.build_model(), sales)
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]),
         helper.make_node("Frobnicate", ["r"], ["y"], domain="com.example", name="mystery")],
        "custom", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.example", 1)],
                              ir_version=10, producer_name="unit-test", producer_version="7.1",
                              doc_string="a model with an operator nobody implements")
    helper.set_model_props(model, {"author": "the tests", "licence": "none"})
    custom = d / "custom.onnx"
    onnx.save(model, custom)
    # free dimensions: 'batch' shared by a and b, a's axis 1 unnamed
    graph = helper.make_graph(
        [helper.make_node("Identity", ["a"], ["ya"]), helper.make_node("Identity", ["b"], ["yb"])], "dims",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["batch", None]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, ["batch", 2])],
        [helper.make_tensor_value_info("ya", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("yb", TensorProto.FLOAT, None)])
    dims = d / "dims.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10), dims)
    # runs only when n is even: the default n=1 fails
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "pairs"], ["y"], name="to_pairs")], "pairs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 2])],
        [numpy_helper.from_array(np.array([-1, 2], np.int64), "pairs")])
    pairs = d / "pairs.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10), pairs)
    return {"sales": sales, "custom": custom, "dims": dims, "pairs": pairs, "dir": d}


# -- docs ------------------------------------------------------------------------------------------------

def test_readme_operator_table_is_generated_from_registry():
    readme = (ROOT / "README.md").read_text()
    table = re.search(r"<!-- operator-table:start -->\n(.*?)\n<!-- operator-table:end -->", readme, re.S)
    assert table is not None, "README lost its operator-table markers"
    assert table.group(1) == operator_table(), "README operator table is stale: paste `onnx-mini ops`"


def test_readme_opens_with_the_set_up_commands_and_documents_the_api():
    readme = (ROOT / "README.md").read_text()
    first_block = re.search(r"```sh\n(.*?)```", readme, re.S).group(1)
    assert [line.split()[:2] for line in first_block.splitlines()[:2]] == [["make", "test"], ["make", "demo"]]
    for needle in ("onnx_mini.prepare(", "InferenceSession(", "onnx_mini.compare(", "onnx_mini.profile(",
                   "onnx-mini info", "onnx-mini run", "onnx-mini bench", "onnx-mini profile", "onnx-mini compare",
                   "onnx-mini ops", "docs/ARCHITECTURE.md", "examples/sequence_model.py", "examples/ml_pipeline.py"):
        assert needle in readme, needle
    assert "shared design notes" not in readme          # the design guide lives in the project now
    arch = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    for needle in ("SubPlan", "ops/_common.py", "optimize/", "expected_failures.txt", "missing_ops.txt",
                   "profile.py", "compare.py"):
        assert needle in arch, needle


def test_readme_python_examples_run(tmp_path, monkeypatch):
    """The README's API blocks, run in order on the model.onnx they describe."""
    w = np.array([[1, 0, -1, 2], [0, 1, 1, -1], [1, 1, 0, 0]], np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["hidden"]), helper.make_node("Relu", ["hidden"], ["y"])],
        "readme", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])], [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10),
              tmp_path / "model.onnx")
    monkeypatch.chdir(tmp_path)
    readme = (ROOT / "README.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "@kernel" not in b]
    assert len(blocks) == 4          # prepare, InferenceSession, onnxruntime drop-in (IOBinding), compare+profile
    ns: dict = {}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), ns)
    x = np.array([[1.0, -2.0, 3.0]], np.float32)
    np.testing.assert_array_equal(ns["hidden"], x @ w)
    np.testing.assert_array_equal(ns["y"], np.maximum(x @ w, 0))
    assert ns["result"].ok and "<svg" in (tmp_path / "profile.html").read_text()
    assert json.loads((tmp_path / "trace.json").read_text())["traceEvents"]


# -- examples --------------------------------------------------------------------------------------------

def test_demo_runs_and_checks_itself():
    out = example("demo.py")
    assert "stores in the table: 3" in out and "identical" in out


def test_sequence_model_example_loop_and_if():
    out = example("sequence_model.py")
    assert "checked against numpy" in out
    # data-dependent trip count: the loop stops after <end>, padding leaves the state unchanged
    assert "'the film was not good at all <end> <pad> <pad>': 10 words, 8 read" in out
    assert "'really <pad> boring <end> the film was great': 8 words, 4 read" in out


def test_ml_pipeline_example():
    out = example("ml_pipeline.py")
    assert "Imputer -> Scaler -> OneHotEncoder -> Flatten -> Concat -> LinearClassifier -> ZipMap" in out
    assert "checked against numpy: labels and probabilities agree" in out
    assert re.search(r"\[60, 4, 0\.8\]\s+purple\s+-> plum", out)
    if HAVE_ORT:
        assert re.search(r"same labels and probabilities as onnxruntime \S+: True", out)


# -- info --------------------------------------------------------------------------------------------------

def test_info_describes_the_light_resnet50():
    r = cli("info", RESNET)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "IR version 3; opsets: ai.onnx=9" in out and "producer: onnx-caffe2" in out
    assert "gpu_0/data_0: tensor(float) [1, 3, 224, 224]" in out
    assert "gpu_0/softmax_1: tensor(float) [1, 1000]" in out
    assert re.search(r"Conv\s+53\s+v1\s+kernel", out) and re.search(r"Relu\s+49\s+v6\s+kernel", out)
    assert "onnx_mini supports every operator of this model" in out


def test_info_works_on_a_model_onnx_mini_cannot_run(models):
    r = cli("info", models["custom"])
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "producer: unit-test 7.1" in out and "description: a model with an operator nobody implements" in out
    assert "author: the tests" in out and "licence: none" in out
    assert "opsets: ai.onnx=21, com.example=1" in out
    assert "x: tensor(float) ['batch', 3]" in out and "y: tensor(float) (shape unknown)" in out
    assert re.search(r"Relu\s+1\s+v14\s+kernel", out)
    assert re.search(r"com\.example::Frobnicate\s+1\s+v-\s+missing: unknown operator Frobnicate", out)
    assert "onnx_mini cannot run this model: 1 operator(s) missing (com.example::Frobnicate)" in out


def test_info_counts_subgraph_nodes_and_shortens_long_metadata(tmp_path):
    then = helper.make_graph([helper.make_node("Neg", ["x"], ["t"]), helper.make_node("Abs", ["t"], ["o"])],
                             "then", [], [helper.make_tensor_value_info("o", TensorProto.FLOAT, [2])])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["o2"])], "else", [],
                              [helper.make_tensor_value_info("o2", TensorProto.FLOAT, [2])])
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0), helper.make_node("Greater", ["s", "zero"], ["c"]),
         helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)], "branches",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [numpy_helper.from_array(np.array(0, np.float32), "zero")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    vocabulary = "\n".join(f"word{i}" for i in range(5000))
    helper.set_model_props(model, {"vocabulary": vocabulary, "note": "short"})
    onnx.save(model, tmp_path / "branches.onnx")
    r = cli("info", tmp_path / "branches.onnx")
    assert r.returncode == 0, r.stderr
    assert "nodes: 3 (+3 in subgraphs); initializers: 1" in r.stdout
    assert re.search(r"\n  Neg\s+1\s+v13\s+kernel", r.stdout) and re.search(r"\n  Abs\s+1\s+v13", r.stdout)
    assert f"  vocabulary: word0\n    word1\n    word2 … ({len(vocabulary):,} chars, --full shows all)\n" in r.stdout
    assert "  note: short\n" in r.stdout and len(r.stdout.splitlines()) < 30
    r = cli("info", tmp_path / "branches.onnx", "--full")
    assert r.returncode == 0 and "\n    word4999\n" in r.stdout and "--full shows all" not in r.stdout
    assert len(r.stdout.splitlines()) > 5000


def test_a_directory_or_an_empty_file_as_the_model(models, tmp_path):
    (tmp_path / "empty.onnx").write_bytes(b"")
    for command in ("info", "run", "compare"):
        r = cli(command, tmp_path)
        assert r.returncode == 1 and f"{tmp_path} is a directory, not a model file" in r.stderr and no_traceback(r)
        r = cli(command, tmp_path / "empty.onnx")
        assert r.returncode == 1 and "empty.onnx is empty (0 bytes): not an ONNX model" in r.stderr, r.stderr
    r = cli("info", models["dir"])
    assert r.returncode == 1 and "(it holds custom.onnx, dims.onnx, pairs.onnx, sales.onnx)" in r.stderr


def test_output_cut_short_by_its_reader_is_quiet(models):
    # stdout is a pipe whose reader is gone (`onnx-mini ... | head` once head has exited)
    read, write = os.pipe()
    os.close(read)
    try:
        r = subprocess.run([sys.executable, "-m", "onnx_mini.cli", "info", str(RESNET)], stdout=write,
                           stderr=subprocess.PIPE, text=True, cwd=ROOT, timeout=300)
    finally:
        os.close(write)
    assert r.returncode == 141 and r.stderr == ""


# -- run ---------------------------------------------------------------------------------------------------

def test_run_without_inputs_makes_random_ones_and_says_so(models, tmp_path):
    r = cli("run", models["sales"], "--dim", "stores=3", "--seed", "5", "--save", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    assert "no inputs given: random inputs (seed 5):" in r.stderr
    assert "sales: float32[3, 12]" in r.stderr and "order: int64[3, 12]" in r.stderr
    assert r.stdout.startswith("dims: stores=3\nby_quarter: float32[3, 4, 3]") and "n_stores: int64[1]\n[3]" in r.stdout
    inputs = np.load(tmp_path / "out" / "inputs.npz")
    sales, order = inputs["sales"], inputs["order"]
    assert sales.shape == (3, 12) and order.shape == (3, 12) and 0 <= order.min() and order.max() < 12
    expected = (np.take_along_axis(sales, order, axis=1) + 0.5).reshape(3, 4, 3)
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "by_quarter.npy"), expected)
    # the saved inputs feed a second run, which then makes nothing up; the same seed gives the same inputs
    again = cli("run", models["sales"], "-i", tmp_path / "out" / "inputs.npz", "--save", tmp_path / "again")
    assert again.returncode == 0 and "random" not in again.stderr, again.stderr
    assert again.stdout.startswith("dims: stores=3\n")                  # read from the inputs given
    np.testing.assert_array_equal(np.load(tmp_path / "again" / "by_quarter.npy"), expected)


def test_run_with_npy_and_pb_inputs_and_an_intermediate_output(models, tmp_path):
    sales = np.arange(24, dtype=np.float32).reshape(2, 12)
    np.save(tmp_path / "sales.npy", sales)
    order = np.tile(np.arange(12)[::-1], (2, 1)).astype(np.int64)
    (tmp_path / "order.pb").write_bytes(numpy_helper.from_array(order, "order").SerializeToString())
    r = cli("run", models["sales"], "-i", f"sales={tmp_path / 'sales.npy'}", "-i", f"order={tmp_path / 'order.pb'}",
            "-o", "ranked", "-o", "n_stores")
    assert r.returncode == 0, r.stderr
    assert "random" not in r.stderr
    assert "ranked: float32[2, 12]" in r.stdout and "[11. 10.  9." in r.stdout and "n_stores: int64[1]\n[2]" in r.stdout


def test_run_sequences_and_maps_random_or_from_pb(tmp_path, capsys):
    F, S = TensorProto.FLOAT, TensorProto.STRING
    seq_t = helper.make_sequence_type_proto(helper.make_tensor_type_proto(F, ["k"]))
    map_t = helper.make_map_type_proto(S, helper.make_tensor_type_proto(F, []))
    graph = helper.make_graph(
        [helper.make_node("SequenceLength", ["seq"], ["n"]),
         helper.make_node("DictVectorizer", ["m"], ["v"], domain="ai.onnx.ml", string_vocabulary=["a", "b", "z"])],
        "kinds", [helper.make_value_info("seq", seq_t), helper.make_value_info("m", map_t)],
        [helper.make_tensor_value_info("n", TensorProto.INT64, []), helper.make_tensor_value_info("v", F, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("ai.onnx.ml", 3)])
    onnx.save(model, tmp_path / "kinds.onnx")
    assert main(["run", str(tmp_path / "kinds.onnx"), "--dim", "k=4"]) == 0
    out, err = capsys.readouterr()
    assert "seq: sequence[2] of float32" in err and "m: dict" in err
    assert "n: int64[]\n2" in out and "v: float32[3]" in out
    v = out.split("v: float32[3]\n")[1].split("\n")[0]
    assert v.strip("[]").split()[2] == "0."              # no 'z' key in the random map: a zero there
    seq = [np.ones(2, np.float32), np.zeros(2, np.float32), np.ones(2, np.float32)]
    (tmp_path / "seq.pb").write_bytes(numpy_helper.from_list(seq, "seq").SerializeToString())
    assert main(["run", str(tmp_path / "kinds.onnx"), "-i", f"seq={tmp_path / 'seq.pb'}", "-o", "n"]) == 0
    out, err = capsys.readouterr()
    assert "n: int64[]\n3" in out and "inputs not given: random inputs (seed 0):\n  m: dict" in err


def test_run_errors_exit_1_with_a_message_and_no_traceback(models, tmp_path):
    r = cli("run", models["dir"] / "missing.onnx")
    assert r.returncode == 1 and "cannot read model file" in r.stderr and no_traceback(r)
    r = cli("run", models["custom"])
    assert r.returncode == 1 and "Frobnicate" in r.stderr and no_traceback(r)
    np.save(tmp_path / "wrong.npy", np.zeros((2, 5), np.float32))
    r = cli("run", models["sales"], "-i", f"sales={tmp_path / 'wrong.npy'}")
    assert r.returncode == 1 and "'sales'" in r.stderr and "dimension 1 must be 12" in r.stderr and no_traceback(r)
    r = cli("run", models["sales"], "-i", f"sales={tmp_path / 'absent.npy'}")
    assert r.returncode == 1 and "absent.npy" in r.stderr and no_traceback(r)


def test_dims_by_name_or_by_input_and_axis(models, capsys):
    assert main(["run", str(models["dims"]), "--runs", "0"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("dims: batch=1 (default), a:1=1 (default)\nya: float32[1, 1]")
    assert main(["run", str(models["dims"]), "--dim", "batch=3", "--dim", "a:1=5", "--runs", "0"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("dims: batch=3, a:1=5\nya: float32[3, 5]") and "yb: float32[3, 2]" in out
    # an axis of a named dimension sets the name (b's axis 0 is 'batch'); a negative axis counts from the end
    assert main(["run", str(models["dims"]), "--dim", "b:0=4", "--dim", "a:-1=2", "--runs", "0"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("dims: batch=4, a:1=2\n") and "ya: float32[4, 2]" in out and "yb: float32[4, 2]" in out


def test_a_dim_no_input_has_is_a_usage_error(models, capsys):
    assert main(["run", str(models["dims"]), "--dim", "batchsize=4"]) == 2
    err = capsys.readouterr().err
    assert ("--dim batchsize: no input has a dimension named 'batchsize'; the inputs' free dimensions: batch, a:1 "
            "(an unnamed one is set as INPUT:AXIS=N, e.g. --dim a:0=4)") in err
    assert main(["run", str(models["dims"]), "--dim", "b:1=4"]) == 2
    assert "--dim b:1: dimension 1 of input 'b' is fixed at 2" in capsys.readouterr().err
    assert main(["run", str(models["dims"]), "--dim", "a:2=4"]) == 2
    assert "--dim a:2: input 'a' has rank 2" in capsys.readouterr().err
    assert main(["run", str(models["sales"]), "--dim", "batch=4"]) == 2
    assert "the inputs' free dimensions: stores (" in capsys.readouterr().err


def test_an_error_under_default_dims_suggests_dim_or_inputs(models, capsys):
    assert main(["run", str(models["pairs"])]) == 1
    err = capsys.readouterr().err
    assert "to_pairs" in err and err.rstrip().endswith(
        "onnx-mini: hint: the inputs were random with n=1 by default: set dimensions with --dim NAME=N or "
        "--dim INPUT:AXIS=N, or give the inputs with -i NAME=FILE")
    assert main(["run", str(models["pairs"]), "--dim", "n=4", "--runs", "0"]) == 0
    assert "y: float32[2, 2]" in capsys.readouterr().out


def test_run_times_the_first_run_and_the_steady_state(models):
    r = cli("run", models["sales"])
    assert r.returncode == 0, r.stderr
    last = r.stdout.splitlines()[-1]
    # a quick model: up to 10 more runs (within half a second)
    assert re.fullmatch(r"first run \d+\.\d+ ms \(load and prepare \d+(\.\d+)? ms\), "
                        r"then \d+\.\d+ ms median over ([1-9]|10) run\(s\)", last), last
    r = cli("run", models["sales"], "--runs", "3")
    assert r.returncode == 0 and r.stdout.rstrip().endswith("median over 3 run(s)")
    r = cli("run", models["sales"], "--runs", "0")
    assert r.returncode == 0 and re.search(r"\nfirst run \d+\.\d+ ms \(load and prepare [\d.]+ ms\)\n$", r.stdout)


def test_timing_commands_let_the_blas_mode_settle_first(models, tmp_path, monkeypatch, capsys):
    # bench, profile (onnx_mini.profile itself) and run's later runs of a model whose runs manage BLAS time
    # the mode a long-running process settles in (blas.settle), not a fresh process's first half second
    # in "split"; run's first run is timed as it comes, and a model without products reads nothing
    from onnx_mini import blas
    calls = []
    monkeypatch.setattr(blas, "settle", lambda timeout=1.0: calls.append(timeout) or False)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "product",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
                              [numpy_helper.from_array(np.ones((3, 4), np.float32), "w")])
    product = str(tmp_path / "product.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10), product)
    assert main(["bench", product, "--runs", "1", "--warmup", "0"]) == 0 and len(calls) == 1
    assert main(["profile", product, "--runs", "1"]) == 0 and len(calls) == 2
    assert main(["run", product, "--runs", "2"]) == 0 and len(calls) == 3
    assert main(["run", product, "--runs", "0"]) == 0 and len(calls) == 3
    sales = str(models["sales"])                    # lookups and arithmetic: no product, no BLAS
    for command in (["bench", sales, "--runs", "1", "--warmup", "0"], ["profile", sales, "--runs", "1"],
                    ["run", sales, "--runs", "2"]):
        assert main(command) == 0 and len(calls) == 3, command


def test_no_optimize_runs_the_graph_as_written(models, tmp_path, monkeypatch, capsys):
    session_module = sys.modules["onnx_mini.session"]
    made = []

    class Spy(session_module.InferenceSession):
        def __init__(self, *args, optimize=None, **kwargs):
            made.append(optimize)
            super().__init__(*args, optimize=optimize, **kwargs)

    monkeypatch.setattr(session_module, "InferenceSession", Spy)
    sales = str(models["sales"])
    for command in (["run", sales, "--runs", "0"], ["bench", sales, "--runs", "1", "--warmup", "0"]):
        made.clear()
        assert main(command) == 0 and made == [True], command
        assert main([*command, "--no-optimize"]) == 0 and made == [True, False], command
    made.clear()
    assert main(["compare", sales, "--vs", "reference", "--no-optimize"]) == 0 and made == [False]
    # profile: the optimised plan knows count_stores' Shape as a constant; as written, it runs
    assert main(["profile", sales, "--runs", "1", "--json", str(tmp_path / "o.json")]) == 0
    assert main(["profile", sales, "--runs", "1", "--json", str(tmp_path / "w.json"), "--no-optimize"]) == 0
    ops = {name: {o["op"] for o in json.loads((tmp_path / f"{name}.json").read_text())["op_types"]}
           for name in ("o", "w")}
    assert "Shape" not in ops["o"] and "Shape" in ops["w"]


def test_usage_errors_exit_2():
    for args in ([], ["frobnicate"], ["run"], ["run", "m.onnx", "--dim", "batch"], ["bench", "m.onnx", "--runs", "x"],
                 ["compare", "m.onnx", "--vs", "tensorflow"]):
        assert main(args) == 2, args


def test_usage_errors_exit_2_from_the_command(models):
    r = cli("run", models["sales"], "--dim", "stores=three")
    assert r.returncode == 2 and "--dim: expects NAME=VALUE or INPUT:AXIS=VALUE" in r.stderr
    assert "usage: onnx-mini run" in r.stderr
    r = cli("run", models["sales"], "-i", "sales=data.txt")
    assert r.returncode == 2 and "with a .npy, .npz or .pb file" in r.stderr and no_traceback(r)
    r = cli("run", models["sales"], "-i", f"{models['dir'] / 'x.npy'}")     # no NAME=, two inputs
    assert r.returncode == 2 and "say which input it is" in r.stderr and no_traceback(r)


# -- bench, profile, compare ----------------------------------------------------------------------------------

def test_bench_percentiles_with_a_progress_bar(models):
    r = cli("bench", models["sales"], "--runs", "5", "--warmup", "1", "--dim", "stores=4", "--vs", "onnxruntime",
            progress=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("dims: stores=4\n") and "5 run(s) after 1 warm-up run(s)" in r.stdout
    assert re.search(r"onnx_mini\s+p50\s+\d+\.\d+ ms\s+p90\s+\d+\.\d+ ms\s+p99\s+\d+\.\d+ ms", r.stdout)
    assert re.search(r"onnx_mini\s+\[#+\] 6/6", r.stderr)                   # the progress bar, finished
    if HAVE_ORT:
        assert re.search(r"onnx_mini / onnxruntime \(p50\): \d+\.\d+x", r.stdout)
    else:
        assert "onnxruntime is not installed" in r.stdout


def test_profile_writes_json_trace_and_html(models, tmp_path):
    j, t, h = tmp_path / "p.json", tmp_path / "p.trace.json", tmp_path / "p.html"
    r = cli("profile", models["sales"], "--runs", "3", "--dim", "stores=2", "--json", j, "--trace", t, "--html", h)
    assert r.returncode == 0, r.stderr
    # the plan that runs: specialised to stores=2, where count_stores (Shape) is a constant
    assert r.stdout.startswith("dims: stores=2\nsales_report: 3 run(s)")
    assert "GatherElements" in r.stdout and "slowest 3 node(s)" in r.stdout
    data = json.loads(j.read_text())
    assert data["runs"] == 3 and {o["op"] for o in data["op_types"]} == {"GatherElements", "Add", "Reshape"}
    assert all(n["calls"] == 3 for n in data["nodes"]) and data["peak_live_bytes"] >= 2 * 12 * (4 + 8)
    events = json.loads(t.read_text())["traceEvents"]
    assert sum(e["ph"] == "X" and e.get("cat") == "GatherElements" for e in events) == 3
    assert any(e["ph"] == "C" for e in events)
    page = h.read_text()
    assert "<svg" in page and "GatherElements" in page and "<script src" not in page and "src=" not in page


def test_compare_against_the_reference_and_onnxruntime(models):
    r = cli("compare", models["sales"], "--vs", "reference", "--dim", "stores=2")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("dims: stores=2\nonnx_mini vs reference: the outputs agree (2 output(s) within "
                               "tolerance)\n4 value(s) of 4 node(s) compared; all agree\n")
    r = cli("compare", models["sales"], "--rtol", "0", "--atol", "0")
    if HAVE_ORT:
        assert r.returncode == 0 and "onnx_mini vs onnxruntime: the outputs agree" in r.stdout, r.stderr
        assert "tolerance: float32 rtol=0 atol=0; integers, booleans, strings exact" in r.stdout
    else:
        assert r.returncode == 1 and "onnxruntime" in r.stderr and no_traceback(r)


def test_compare_exits_1_when_an_output_differs(models, monkeypatch, capsys):
    compare_module = sys.modules["onnx_mini.compare"]    # onnx_mini.compare is the function

    class Result:
        ok = False                       # an intermediate value differs in both cases

        def __init__(self, outputs_agree):
            self.outputs_agree = outputs_agree

        def __str__(self):
            return f"outputs agree: {self.outputs_agree}"

    seen = {}

    def fake_compare(model, feeds, against, rtol, atol):
        seen.update(model=model, feeds=feeds, against=against, rtol=rtol, atol=atol)
        return Result(seen["agree"])

    monkeypatch.setattr(compare_module, "compare", fake_compare)
    seen["agree"] = False
    assert main(["compare", str(models["sales"]), "--vs", "reference", "--rtol", "0.5", "--atol", "0.25"]) == 1
    assert "outputs agree: False" in capsys.readouterr().out
    assert seen["against"] == "reference" and seen["rtol"] == 0.5 and seen["atol"] == 0.25
    assert set(seen["feeds"]) == {"sales", "order"}
    seen["agree"] = True
    assert main(["compare", str(models["sales"]), "--vs", "reference"]) == 0
    assert seen["rtol"] is None and seen["atol"] is None          # compare's defaults by element type


# -- ops ---------------------------------------------------------------------------------------------------

def test_ops_table_missing_and_one_models_needs(models):
    r = cli("ops")
    assert r.returncode == 0 and r.stdout == operator_table() + "\n"
    assert re.search(r"\d+ of the \d+ \(domain, op, version\) schemas of onnx", r.stderr)
    r = cli("ops", "--missing")
    assert r.returncode == 0 and re.search(r"\d+ of the \d+ \(domain, op, version\) schemas .* cannot run", r.stderr)
    from onnx_mini.coverage import uncovered
    assert len([x for x in r.stdout.splitlines() if x and not x.startswith("nothing")]) == len(uncovered())
    r = cli("ops", "--model", RESNET)
    assert r.returncode == 0 and "Conv-1: kernel" in r.stdout and "all 10 operator(s) of the model run" in r.stdout
    r = cli("ops", "--model", models["custom"], "--missing")
    assert r.returncode == 1 and r.stdout.splitlines() == [
        "com.example::Frobnicate: missing (unknown operator Frobnicate in domain 'com.example')"]
    assert "1 of the model's 2 operator(s) cannot run" in r.stderr


def test_console_script_is_installed():
    script = Path(sys.executable).parent / "onnx-mini"
    if not script.exists():
        pytest.skip("onnx-mini is not installed next to this Python (pip install -e .)")
    r = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0
    for command in ("info", "run", "bench", "profile", "compare", "ops"):
        assert command in r.stdout
