"""Fuzzing: mutated models (bytes and protos) must either work or fail with an OnnxMiniError.

Never another exception, a hang (each case has a time limit), a crash, or a read of a file outside the
model's folder. The corpus is fixed (two light models of the onnx package, the project's examples and
small models built here) and case i always uses the seed SEED + i, so a failure reproduces:

    ONNX_MINI_FUZZ_CASE=123 .venv/bin/python -m pytest backend_tests/test_fuzz.py      # one case
    ONNX_MINI_FUZZ_ITERATIONS=20000 .venv/bin/python -m pytest backend_tests/test_fuzz.py

By default 8000 cases run, bounded to ~60 s of wall time. Every bug found here becomes a named
regression test in test_hostile.py.
"""
from __future__ import annotations

import copy
import importlib.util
import os
import random
import signal
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import AttributeProto, TensorProto, helper, numpy_helper

import onnx_mini
from onnx_mini import dtypes
from onnx_mini.errors import KernelError, OnnxMiniError

SEED = 20261121
ITERATIONS = int(os.environ.get("ONNX_MINI_FUZZ_ITERATIONS", "8000"))
ONLY_CASE = os.environ.get("ONNX_MINI_FUZZ_CASE")
BUDGET_S = float(os.environ.get("ONNX_MINI_FUZZ_SECONDS", "60" if "ONNX_MINI_FUZZ_ITERATIONS" not in os.environ
                                else "1e9"))
CASE_TIME_LIMIT_S = 20.0
MAX_TENSOR_BYTES = 64 << 20      # the fuzzed models get a tight allocation limit

ROOT = Path(onnx_mini.__file__).resolve().parents[1]
LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
F, I64, B, S = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL, TensorProto.STRING


# -- the corpus ----------------------------------------------------------------------------------

def _example(name: str):
    spec = importlib.util.spec_from_file_location(f"_fuzz_example_{name}", ROOT / "examples" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.build_model()


def _vi(name, t, shape):
    return helper.make_tensor_value_info(name, t, shape)


def _built_models() -> dict[str, onnx.ModelProto]:
    op = [helper.make_opsetid("", 21)]
    models = {}
    # shapes computed from data: the resource guards' territory
    models["shapes_from_data"] = helper.make_model(helper.make_graph(
        [helper.make_node("ConstantOfShape", ["shape"], ["z"], value=numpy_helper.from_array(np.array([1.5], np.float32))),
         helper.make_node("Expand", ["x", "shape"], ["e"]),
         helper.make_node("Tile", ["x", "reps"], ["t"]),
         helper.make_node("Range", ["start", "limit", "delta"], ["r"]),
         helper.make_node("Pad", ["x", "pads"], ["p"]),
         helper.make_node("OneHot", ["idx", "depth", "onoff"], ["o"])],
        "data_shapes",
        [_vi("x", F, [2, 3]), _vi("shape", I64, [2]), _vi("reps", I64, [2])],
        [_vi("z", F, None), _vi("e", F, None), _vi("t", F, None), _vi("r", F, None), _vi("p", F, None),
         _vi("o", F, None)],
        [numpy_helper.from_array(np.array(0, np.float32), "start"),
         numpy_helper.from_array(np.array(5, np.float32), "limit"),
         numpy_helper.from_array(np.array(1, np.float32), "delta"),
         numpy_helper.from_array(np.array([0, 1, 0, 1], np.int64), "pads"),
         numpy_helper.from_array(np.array([0, 2], np.int64), "idx"),
         numpy_helper.from_array(np.array(3, np.int64), "depth"),
         numpy_helper.from_array(np.array([0, 1], np.float32), "onoff")]),
        opset_imports=op, ir_version=10)
    # a model-local function, an If with subgraphs, a Constant, a sparse initializer
    fn = helper.make_function("local", "Twice", ["a"], ["b"],
                              [helper.make_node("Add", ["a", "a"], ["b"])], [helper.make_opsetid("", 21)])
    then_g = helper.make_graph([helper.make_node("Mul", ["x", "k"], ["y_then"])], "then", [],
                               [_vi("y_then", F, [2, 3])])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["y_else"])], "else", [], [_vi("y_else", F, [2, 3])])
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.array(2.0, np.float32))),
         helper.make_node("Twice", ["x"], ["x2"], domain="local", name="call"),
         helper.make_node("If", ["flag"], ["yi"], then_branch=then_g, else_branch=else_g, name="branch"),
         helper.make_node("Add", ["x2", "yi"], ["y0"]),
         helper.make_node("Add", ["y0", "s"], ["y"])],
        "functions_and_branches", [_vi("x", F, [2, 3]), _vi("flag", B, [])], [_vi("y", F, [2, 3])])
    graph.sparse_initializer.append(helper.make_sparse_tensor(
        numpy_helper.from_array(np.array([5, 7], np.float32), "s"),
        numpy_helper.from_array(np.array([1, 4], np.int64)), [2, 3]))
    models["functions_and_branches"] = helper.make_model(
        graph, opset_imports=[*op, helper.make_opsetid("local", 1)], functions=[fn], ir_version=10)
    # typed-field tensors of several element types, strings and a Cast chain
    models["types"] = helper.make_model(helper.make_graph(
        [helper.make_node("Cast", ["h"], ["hf"], to=F),
         helper.make_node("Add", ["hf", "x"], ["y"]),
         helper.make_node("Identity", ["words"], ["w"]),
         helper.make_node("Cast", ["q"], ["qf"], to=F)],
        "types", [_vi("x", F, [3])], [_vi("y", F, [3]), _vi("w", S, [2]), _vi("qf", F, [3])],
        [helper.make_tensor("h", TensorProto.FLOAT16, [3], [1.0, 2.0, 3.0]),
         helper.make_tensor("words", S, [2], [b"ab", "\u00e9".encode()]),
         helper.make_tensor("q", TensorProto.INT4, [3], [-1, 2, 7])]),
        opset_imports=op, ir_version=10)
    return models


def corpus() -> dict[str, tuple[onnx.ModelProto, bool]]:
    """name -> (model, runnable): the light models are only loaded and prepared (running them is slow)."""
    models = {name: (m, True) for name, m in _built_models().items()}
    models["sales_report"] = (_example("demo"), True)      # examples/demo.py's model (its file is made by demo)
    for name in ("sequence_model", "ml_pipeline"):
        models[name] = (_example(name), True)
    for name in ("light_squeezenet", "light_inception_v1"):
        models[name] = (onnx.load(str(LIGHT / f"{name}.onnx")), False)
    return models


# -- mutations -------------------------------------------------------------------------------------

def _graphs(g: onnx.GraphProto):
    """g and every subgraph in it, depth first."""
    yield g
    for n in g.node:
        for a in n.attribute:
            if a.HasField("g"):
                yield from _graphs(a.g)
            for sg in a.graphs:
                yield from _graphs(sg)


def _nodes(m: onnx.ModelProto):
    return [n for g in _graphs(m.graph) for n in g.node] + [n for f in m.functions for n in f.node]


def _tensors(m: onnx.ModelProto):
    ts = [t for g in _graphs(m.graph) for t in g.initializer]
    ts += [a.t for n in _nodes(m) for a in n.attribute if a.HasField("t")]
    ts += [st.values for g in _graphs(m.graph) for st in g.sparse_initializer]
    return ts


def _names(m: onnx.ModelProto) -> list[str]:
    names = {x for n in _nodes(m) for x in (*n.input, *n.output) if x}
    return sorted(names | {v.name for g in _graphs(m.graph) for v in (*g.input, *g.output)})


def _pick(rng, seq):
    return seq[rng.randrange(len(seq))] if len(seq) else None


HUGE = [2**31, 2**40, 2**62, 2**63 - 1, -1, -(2**40), 0]


def m_drop_input(rng, m):
    g = _pick(rng, list(_graphs(m.graph)))
    if g.input:
        del g.input[rng.randrange(len(g.input))]


def m_rename_value(rng, m):
    n = _pick(rng, _nodes(m))
    if n is not None and n.input:
        n.input[rng.randrange(len(n.input))] = rng.choice(["undefined_value", "", n.output[0] if n.output else "q"])


def m_drop_node_input(rng, m):
    n = _pick(rng, _nodes(m))
    if n is not None and n.input:
        del n.input[rng.randrange(len(n.input))]


def m_extra_node_io(rng, m):
    n = _pick(rng, _nodes(m))
    if n is not None:
        (n.input if rng.random() < 0.5 else n.output).append(rng.choice(_names(m) + ["fresh"]))


def m_attribute_type(rng, m):
    nodes = [n for n in _nodes(m) if n.attribute]
    n = _pick(rng, nodes)
    if n is None:
        return
    a = _pick(rng, n.attribute)
    choice = rng.randrange(4)
    if choice == 0:     # the declared type no longer matches the field that is set
        a.type = rng.choice([t for t in AttributeProto.AttributeType.values() if t])
    elif choice == 1:   # a value of another type
        name = a.name
        n.attribute.remove(a)
        n.attribute.append(helper.make_attribute(name, rng.choice(
            [1, -7, 2**62, 1.5, "text", [1, 2], [0.5], ["a"], numpy_helper.from_array(np.zeros(2, np.float32))])))
    elif choice == 2:   # absurd integer values
        if a.type == AttributeProto.INT:
            a.i = rng.choice(HUGE)
        elif a.type == AttributeProto.INTS:
            a.ints[:] = [rng.choice(HUGE) for _ in range(rng.randrange(4))]
        else:
            a.ref_attr_name = "nonexistent"
    else:               # unknown attribute name
        a.name = rng.choice(["bogus", "", a.name + "_x"])


def m_rank(rng, m):
    vs = [v for g in _graphs(m.graph) for v in (*g.input, *g.output, *g.value_info)
          if v.type.HasField("tensor_type")]
    v = _pick(rng, vs)
    if v is None:
        return
    shape = v.type.tensor_type.shape
    if rng.random() < 0.5 and shape.dim:
        del shape.dim[rng.randrange(len(shape.dim))]
    else:
        shape.dim.add().dim_value = rng.choice([1, 3, 2**40])
    if rng.random() < 0.3:
        v.type.tensor_type.elem_type = rng.choice([0, 1, 7, 8, 16, 23, 99, -3])


def m_raw_data(rng, m):
    ts = [t for t in _tensors(m) if t.HasField("raw_data")]
    t = _pick(rng, ts)
    if t is None:
        t = _pick(rng, _tensors(m))
        if t is None:
            return
    raw = t.raw_data
    c = rng.randrange(3)
    if c == 0:
        t.raw_data = raw[: rng.randrange(len(raw) + 1)] if raw else b"\x01"
    elif c == 1:
        t.raw_data = raw + bytes(rng.randrange(1, 64))
    else:
        t.raw_data = bytes(rng.randrange(256) for _ in range(min(len(raw), 64))) + raw[64:]
        t.data_type = rng.choice([1, 2, 3, 5, 6, 7, 8, 9, 10, 11, 16, 17, 21, 22, 23, 25, 26, 40, 0])


def m_dims(rng, m):
    t = _pick(rng, _tensors(m))
    if t is not None:
        if t.dims and rng.random() < 0.7:
            t.dims[rng.randrange(len(t.dims))] = rng.choice(HUGE)
        else:
            t.dims.append(rng.choice(HUGE))
    for st in (x for g in _graphs(m.graph) for x in g.sparse_initializer):
        if rng.random() < 0.5:
            st.dims.append(rng.choice(HUGE))
        if rng.random() < 0.5 and st.indices.HasField("raw_data"):
            st.indices.raw_data = np.array([rng.choice(HUGE)], np.int64).tobytes() * (len(st.indices.raw_data) // 8)


def m_cycle(rng, m):
    g = _pick(rng, list(_graphs(m.graph)))
    if len(g.node) >= 2:
        i, j = sorted(rng.sample(range(len(g.node)), 2))
        if g.node[j].output and g.node[i].input:
            g.node[i].input[rng.randrange(len(g.node[i].input))] = g.node[j].output[0]
    elif g.node and g.node[0].input and g.node[0].output:   # a node reading its own output
        g.node[0].input[0] = g.node[0].output[0]


def m_self_function(rng, m):
    # a function calling itself (directly, or from a subgraph in its body)
    if rng.random() < 0.5:
        body = [helper.make_node("Rec", ["a"], ["b"], domain="rec")]
    else:
        sub = helper.make_graph([helper.make_node("Rec", ["a"], ["c"], domain="rec")], "inner", [],
                                [_vi("c", F, None)])
        body = [helper.make_node("If", ["a"], ["b"], then_branch=sub, else_branch=sub)]
    fn = helper.make_function("rec", "Rec", ["a"], ["b"], body, [helper.make_opsetid("", 21),
                                                                 helper.make_opsetid("rec", 1)])
    m.functions.append(fn)
    m.opset_import.append(helper.make_opsetid("rec", 1))
    n = _pick(rng, list(m.graph.node))
    if n is not None and n.input:
        m.graph.node.append(helper.make_node("Rec", [n.input[0]], ["rec_out"], domain="rec"))
        m.graph.output.append(_vi("rec_out", F, None))


def m_subgraph_undefined(rng, m):
    subs = [g for g in _graphs(m.graph)][1:]
    g = _pick(rng, subs)
    if g is None:   # add an If whose branch reads a value nothing defines
        sub = helper.make_graph([helper.make_node("Identity", ["nowhere"], ["o"])], "b", [], [_vi("o", F, None)])
        flag = numpy_helper.from_array(np.array(True), "fuzz_flag")
        m.graph.initializer.append(flag)
        m.graph.node.append(helper.make_node("If", ["fuzz_flag"], ["fz"], then_branch=sub, else_branch=sub))
        m.graph.output.append(_vi("fz", F, None))
        return
    n = _pick(rng, list(g.node))
    if n is not None and n.input:
        n.input[0] = "nowhere"
    elif g.output:
        g.output[0].name = "nowhere"


def m_opset(rng, m):
    c = rng.randrange(3)
    if c == 0 and m.opset_import:
        m.opset_import[rng.randrange(len(m.opset_import))].version = rng.choice([0, 1, 5, 999, -5, 2**62])
    elif c == 1 and m.opset_import:
        del m.opset_import[rng.randrange(len(m.opset_import))]
    else:
        m.opset_import.add(domain=rng.choice(["", "ai.onnx", "com.evil", "ai.onnx.ml"]), version=rng.choice([1, 30]))


def m_ir_version(rng, m):
    m.ir_version = rng.choice([0, 1, 2, 3, 15, 2**40, 2**63 - 1])


def m_op_type(rng, m):
    n = _pick(rng, _nodes(m))
    if n is not None:
        c = rng.randrange(3)
        if c == 0:
            n.op_type = rng.choice(["Bogus", "", "Loop", "If", "Scan", "ConstantOfShape", "Reshape", "Concat"])
        elif c == 1:
            n.domain = rng.choice(["com.evil", "ai.onnx.ml", "ai.onnx.preview.training", "local"])
        else:
            n.op_type, n.domain = rng.choice([("Relu", ""), ("Gather", ""), ("TreeEnsemble", "ai.onnx.ml"),
                                              ("Split", ""), ("Resize", ""), ("Transpose", "")])


SECRET = Path("/nonexistent/secret.bin")   # set by the test to the file next to the model's folder


def m_external(rng, m):
    t = _pick(rng, [t for t in m.graph.initializer])
    if t is None:
        return
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    del t.external_data[:]
    location = rng.choice(["../secret.bin", str(SECRET), "/etc/passwd", "link_out.bin", "sub/../../secret.bin", "weights.bin",
                           "weights.bin", "fifo", "hardlink.bin", ".", "", "weights.bin\0x", "..\\secret.bin",
                           "C:/secret.bin"])
    for k, v in (("location", location), ("offset", str(rng.choice([0, 0, 4, -1, 2**62]))),
                 ("length", str(rng.choice([0, 4, 16, 2**62, -3])))):
        if rng.random() < 0.85:
            e = t.external_data.add()
            e.key, e.value = k, v


PROTO_MUTATIONS = [m_drop_input, m_rename_value, m_drop_node_input, m_extra_node_io, m_attribute_type, m_rank,
                   m_raw_data, m_dims, m_cycle, m_self_function, m_subgraph_undefined, m_opset, m_ir_version,
                   m_op_type, m_external]


def mutate_bytes(rng, data: bytes, names: list[str]) -> bytes:
    data = bytearray(data)
    c = rng.randrange(5)
    if c == 0:      # flip a few bytes
        for _ in range(rng.randrange(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
    elif c == 1:    # truncate
        del data[rng.randrange(len(data)):]
    elif c == 2:    # duplicate or insert a chunk
        i = rng.randrange(len(data))
        data[i:i] = data[i: i + rng.randrange(1, 64)] if rng.random() < 0.5 else os.urandom(rng.randrange(1, 16))
    elif c == 3:    # a name made non-UTF-8 (same length: the framing stays valid)
        for name in rng.sample(names, min(len(names), 3)):
            enc = name.encode()
            bad = bytes([0xFF, 0xFE] + [0x80] * (len(enc) - 2))[: len(enc)]
            data = bytearray(bytes(data).replace(enc, bad, 1))
    else:           # varint lengths blown up
        for _ in range(rng.randrange(1, 4)):
            i = rng.randrange(len(data))
            data[i:i + 1] = b"\xff\xff\xff\xff\x0f"
    return bytes(data)


# -- inputs for a run ------------------------------------------------------------------------------

def feeds_for(m: onnx.ModelProto, rng) -> dict:
    inits = {t.name for t in m.graph.initializer}
    feeds = {}
    for v in m.graph.input:
        if v.name in inits:
            continue
        tt = v.type.tensor_type
        if not v.type.HasField("tensor_type") or tt.elem_type not in dtypes.NP_DTYPE:
            continue
        dims = [d.dim_value if d.HasField("dim_value") and 0 < d.dim_value <= 16 else 2 for d in tt.shape.dim]
        if rng.random() < 0.1:     # wrong rank
            dims = dims[1:] if dims and rng.random() < 0.5 else dims + [2]
        dt = dtypes.NP_DTYPE[tt.elem_type]
        if tt.elem_type == S:
            arr = np.array(["red", "green"] * 8, dtype=object)[: int(np.prod(dims))].reshape(dims)
        elif dt.kind == "b":
            arr = np.ones(dims, bool)
        elif v.name in ("shape", "reps"):      # the shape-driven model: sometimes absurd sizes
            arr = np.array([2, 3][: int(np.prod(dims))] + [1] * max(0, int(np.prod(dims)) - 2), np.int64)
            if rng.random() < 0.5:
                arr[rng.randrange(arr.size)] = rng.choice([1 << 20, 1 << 31, 1 << 40, 2**63 - 1, -1, -(2**40), 0])
            arr = arr.reshape(dims)
        elif dt.kind in "iu":
            arr = np.array(rng.choices([0, 1, 2, 3, 1, 0, -1, 2**40], k=int(np.prod(dims))),
                           dtype=np.int64).astype(dt).reshape(dims)
        else:
            arr = np.linspace(-1, 1, int(np.prod(dims))).astype(np.float32).astype(dt).reshape(dims)
        feeds[v.name] = arr
    return feeds


#: kernels that failed with a bare Python/numpy exception (wrapped into a KernelError by the executor,
#: so the contract holds, but the kernel should have raised InvalidValueError): shown with -s.
KERNEL_BUGS: dict[str, str] = {}


# -- the harness -----------------------------------------------------------------------------------

class CaseTimeout(BaseException):
    """Raised by the alarm: a BaseException, so no `except Exception` on the way can swallow it."""


def _alarm(signum, frame):
    raise CaseTimeout()


class ReadWatch:
    """An audit hook recording every file opened while a case runs (hooks cannot be removed: one per
    process, switched on and off)."""
    active = False
    opened: list[str] = []
    installed = False

    @classmethod
    def install(cls):
        if not cls.installed:
            def hook(event, args):
                if cls.active and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
                    cls.opened.append(os.fsdecode(args[0]))
            sys.addaudithook(hook)
            cls.installed = True


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The model's folder (with data files, a FIFO, a symlink and a hard link out) and a secret next to it."""
    base = tmp_path_factory.mktemp("fuzz")
    model_dir = base / "model"
    model_dir.mkdir()
    (model_dir / "sub").mkdir()
    secret = base / "secret.bin"
    secret.write_bytes(bytes(range(256)) * 4)
    (model_dir / "weights.bin").write_bytes(np.arange(256, dtype=np.float32).tobytes())
    os.symlink(secret, model_dir / "link_out.bin")
    os.link(secret, model_dir / "hardlink.bin")
    os.mkfifo(model_dir / "fifo")
    return model_dir, secret


# Files onnx_mini reads whatever the model: the machine's CPU counters (blas.py picks its threading by
# how busy the other cores are). Exact paths, fixed in the code, never derived from a model.
SYSTEM_READS = frozenset({"/proc/stat"})


def _allowed_read(path: str, model_dir: Path) -> bool:
    """Inside the model's folder, code Python may import lazily (the environment, the project), or
    one of SYSTEM_READS."""
    if path in SYSTEM_READS:
        return True
    real = os.path.realpath(path)
    roots = {os.path.realpath(r) for r in (model_dir, sys.prefix, sys.base_prefix, sys.exec_prefix, ROOT)}
    return any(os.path.commonpath([r, real]) == r for r in roots)


def run_case(i: int, models: dict, model_dir: Path) -> str | None:
    """Case i: None when it behaved (worked or raised an OnnxMiniError with a message), else what went wrong."""
    rng = random.Random(SEED + i)
    names = sorted(models)
    name = names[i % len(names)]
    base, runnable = models[name]
    m = copy.deepcopy(base)
    applied = []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        mut = rng.choice(PROTO_MUTATIONS)
        applied.append(mut.__name__)
        mut(rng, m)
    try:
        data = m.SerializeToString()
    except Exception:   # the mutation made a proto protobuf itself refuses to write
        return None
    if rng.random() < 0.2:
        data = mutate_bytes(rng, data, _names(m) or ["x"])
        applied.append("bytes")
    what = f"case {i} ({name}: {', '.join(applied)})"
    signal.setitimer(signal.ITIMER_REAL, CASE_TIME_LIMIT_S)
    ReadWatch.opened.clear()
    ReadWatch.active = True
    try:
        rep = onnx_mini.prepare(data, base_dir=str(model_dir))
        if runnable:
            rep.run(feeds_for(m, rng))
    except CaseTimeout:
        return f"{what}: took more than {CASE_TIME_LIMIT_S} s"
    except OnnxMiniError as e:
        if not str(e).strip():
            return f"{what}: {type(e).__name__} without a message"
        cause = e.__cause__
        if isinstance(e, KernelError) and cause is not None and not isinstance(cause, OnnxMiniError):
            KERNEL_BUGS.setdefault(f"{e.op_type}: {type(cause).__name__}", what)
    except BaseException as e:   # noqa: BLE001 - anything else is the bug we are looking for
        return f"{what}: {type(e).__name__}: {e}"[:600]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        ReadWatch.active = False
    outside = [p for p in ReadWatch.opened if not _allowed_read(p, model_dir)]
    if outside:
        return f"{what}: opened {outside} outside the model's folder"
    return None


def test_fuzz_mutated_models_fail_cleanly(folder):
    global SECRET
    model_dir, SECRET = folder
    models = corpus()
    ReadWatch.install()
    previous_handler = signal.signal(signal.SIGALRM, _alarm)
    previous_limits = dtypes.set_limits(max_tensor_bytes=MAX_TENSOR_BYTES)
    failures, done, start = [], 0, time.monotonic()
    try:
        cases = [int(ONLY_CASE)] if ONLY_CASE else range(ITERATIONS)
        for i in cases:
            if time.monotonic() - start > BUDGET_S:
                break
            problem = run_case(i, models, model_dir)
            done += 1
            if problem:
                failures.append(problem)
    finally:
        dtypes.set_limits(**previous_limits)
        signal.signal(signal.SIGALRM, previous_handler)
    if KERNEL_BUGS:
        print("\nkernels failing with a bare exception (wrapped in KernelError):")
        for k, v in sorted(KERNEL_BUGS.items()):
            print(f"  {k}  <- {v}")
    assert done >= min(50, len(cases)), "the fuzz budget ran out before 50 cases"
    assert not failures, f"{len(failures)} of {done} cases misbehaved:\n" + "\n".join(failures[:30])


def test_the_read_watch_sees_a_read_outside_the_folder(folder):
    """The harness itself: a read of the secret next to the folder is seen and flagged."""
    model_dir, secret = folder
    ReadWatch.install()
    ReadWatch.opened.clear()
    ReadWatch.active = True
    try:
        secret.read_bytes()
        (model_dir / "weights.bin").read_bytes()
    finally:
        ReadWatch.active = False
    flagged = [p for p in ReadWatch.opened if not _allowed_read(p, model_dir)]
    assert [os.path.realpath(p) for p in flagged] == [os.path.realpath(secret)]
    assert not _allowed_read("/etc/passwd", model_dir) and _allowed_read(onnx.__file__, model_dir)
