"""The `onnx-mini` command line.

    onnx-mini info MODEL                      describe a model (works on any loadable model)
    onnx-mini run MODEL [-i NAME=FILE] ...    run once, print (and --save) the outputs
    onnx-mini bench MODEL [--vs onnxruntime]  latency percentiles
    onnx-mini profile MODEL [--html F] ...    time and memory by node and by operator type
    onnx-mini compare MODEL [--vs ...]        the first node where onnx_mini and another runtime differ
    onnx-mini ops [--missing] [--model M]     what onnx_mini can run
    --plugin FILE.py (any command)            import user kernels (onnx_mini.kernel) first

Exit codes: 0 ok (compare: the runtimes agree), 1 a model, input or run error (compare: they
differ), 2 a usage error. Expected errors print one message on stderr, never a traceback.
Each command imports what it needs when it runs (its functions' imports): `info` on a model, say,
never loads the kernels, so it answers fast. None of them dodges an import cycle (the CLI is the
last layer: backend_tests/core/test_architecture.py).
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from . import dtypes
from .errors import OnnxMiniError
from .graph import TypeInfo, normalize_domain
from .inputs import type_string


class UsageError(Exception):
    """A command line that cannot be acted on (exit code 2)."""


# -- progress -----------------------------------------------------------------------------------------

class Progress:
    """A one-line progress bar on stderr, drawn when stderr is a terminal (or ONNX_MINI_PROGRESS=1)."""

    def __init__(self, label: str, total: int, enabled: bool | None = None, width: int = 30):
        if enabled is None:
            enabled = os.environ.get("ONNX_MINI_PROGRESS") == "1" or (
                os.environ.get("ONNX_MINI_PROGRESS") != "0" and sys.stderr.isatty())
        self.label, self.total, self.enabled, self.width = label, total, enabled, width
        self.start = self.drawn = time.perf_counter()

    def __call__(self, done: int, total: int | None = None) -> None:
        if not self.enabled:
            return
        total = total or self.total
        now = time.perf_counter()
        if done < total and now - self.drawn < 0.1:
            return
        self.drawn = now
        filled = self.width * done // max(total, 1)
        sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (self.width - filled)}] {done}/{total} "
                         f"{now - self.start:5.1f} s")
        if done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()


# -- model description (no prepare: works on models onnx_mini cannot run) ---------------------------

def operator_table() -> str:
    """Markdown table of every registered kernel, by domain and operator (generated, never hand-written)."""
    from .coverage import public_ops
    versions: dict[tuple[str, str], list[int]] = defaultdict(list)
    for domain, op, since in public_ops():
        versions[(domain, op)].append(since)
    lines = ["| domain | operator | versions (since) |", "|---|---|---|"]
    for (domain, op), vs in sorted(versions.items()):
        lines.append(f"| {domain or 'ai.onnx'} | {op} | {', '.join(map(str, sorted(vs)))} |")
    return "\n".join(lines)


def _read(path: str):
    from .loader import read_proto
    proto, _ = read_proto(path)
    return proto


def _opsets(imports) -> dict[str, int]:
    return {normalize_domain(o.domain): o.version for o in imports}


def _walk_nodes(nodes, opsets: dict[str, int]):
    """Every node of a graph and of its subgraphs (If/Loop/Scan bodies): (node, opsets in force)."""
    import onnx
    for n in nodes:
        yield n, opsets
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _walk_nodes(a.g.node, opsets)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    yield from _walk_nodes(g.node, opsets)


def model_needs(proto) -> list[dict]:
    """Each distinct (domain, op) the model uses, with the schema version its opset selects and
    whether onnx_mini runs it: [{domain, op, count, version, status, problem}], sorted."""
    opsets = _opsets(proto.opset_import)
    local = {(normalize_domain(f.domain), f.name): f for f in proto.functions}
    counts: Counter = Counter()
    where: dict[tuple, dict[str, int]] = {}
    for n, ops in _walk_nodes(proto.graph.node, opsets):
        key = (normalize_domain(n.domain), n.op_type)
        counts[key] += 1
        where[key] = ops
    for f in proto.functions:                  # the bodies of the model's own functions
        for n, ops in _walk_nodes(f.node, {**opsets, **_opsets(f.opset_import)}):
            key = (normalize_domain(n.domain), n.op_type)
            counts.setdefault(key, 0)
            where.setdefault(key, ops)
    from .coverage import support
    rows = []
    for (domain, op), count in sorted(counts.items()):
        if (domain, op) in local:
            rows.append(dict(domain=domain, op=op, count=count, version=None, status="model function", problem=""))
            continue
        version, status, problem = support(domain, op, where[(domain, op)].get(domain))
        status = "function body" if status == "typed function body" else status
        rows.append(dict(domain=domain, op=op, count=count, version=version, status=status, problem=problem))
    return rows


def _type_of(v) -> tuple[str, Any]:
    from .loader import type_info
    t = type_info(v.type) if v.HasField("type") else None
    shape = None if t is None or t.shape is None else list(t.shape)
    return type_string(t), shape


def _info(args) -> int:
    import onnx
    proto = _read(args.model)
    g = proto.graph
    print(f"model: {args.model}")
    print(f"IR version {proto.ir_version}; opsets: "
          + (", ".join(f"{d or 'ai.onnx'}={v}" for d, v in _opsets(proto.opset_import).items()) or "none"))
    producer = " ".join(x for x in (proto.producer_name, proto.producer_version) if x)
    print(f"producer: {producer or '-'}; graph: {g.name or '-'}; domain: {proto.domain or '-'}; "
          f"model version: {proto.model_version}")
    if proto.doc_string:
        print(f"description: {proto.doc_string.strip()[:300]}")
    if proto.metadata_props:
        print("metadata:")
        for p in proto.metadata_props:
            print(f"  {p.key}: {p.value}")
    inits = {t.name for t in g.initializer} | {s.values.name for s in g.sparse_initializer}
    weights = sum(int(np.prod(t.dims, dtype=np.int64)) for t in g.initializer)
    print(f"nodes: {len(g.node)}; initializers: {len(inits)} ({weights:,} elements); "
          f"model functions: {len(proto.functions)}")
    for title, values in (("inputs", [v for v in g.input if v.name not in inits]), ("outputs", g.output)):
        print(f"{title}:")
        for v in values:
            t, shape = _type_of(v)
            print(f"  {v.name}: {t} {shape if shape is not None else '(shape unknown)'}")
    defaults = [v.name for v in g.input if v.name in inits]
    if defaults:
        print(f"inputs with an initializer default: {len(defaults)}")
    rows = model_needs(proto)
    print("operators (count, schema version, how onnx_mini runs it):")
    width = max((len(_op_label(r)) for r in rows), default=0)
    for r in rows:
        version = "-" if r["version"] is None else str(r["version"])
        line = f"  {_op_label(r):<{width}}  {r['count']:5d}  v{version:<3} {r['status']}"
        print(line + (f": {r['problem']}" if r["problem"] else ""))
    missing = [r for r in rows if r["status"] == "missing"]
    if missing:
        print(f"onnx_mini cannot run this model: {len(missing)} operator(s) missing "
              f"({', '.join(_op_label(r) for r in missing)})")
    else:
        print(f"onnx_mini supports every operator of this model (onnx {onnx.__version__} schemas)")
    return 0


def _op_label(r: dict) -> str:
    return f"{r['domain']}::{r['op']}" if r["domain"] else r["op"]


# -- inputs: files or random values -------------------------------------------------------------------

def _session(path: str):
    from .session import InferenceSession
    return InferenceSession(path)


def _session_and_feeds(args) -> tuple[Any, dict[str, Any]]:
    """The model's session, and the feeds: from -i files, random for the inputs not given."""
    sess = _session(args.model)
    return sess, make_feeds(args, list(sess.prepared.plan.required_inputs))


def _dim_arg(item: str) -> tuple[str, int]:
    """--dim NAME=VALUE (checked by argparse: a bad one is a usage error)."""
    name, eq, value = item.partition("=")
    if not eq or not name.strip() or not re.fullmatch(r"\s*\d+\s*", value):
        raise argparse.ArgumentTypeError(f"expects NAME=VALUE with a non-negative integer VALUE, got {item!r}")
    return name.strip(), int(value)


def _input_arg(item: str) -> str:
    """-i NAME=FILE or FILE.npz (checked by argparse)."""
    path = item.partition("=")[2] if "=" in item else item
    if os.path.splitext(path)[1].lower() not in (".npy", ".npz", ".pb"):
        raise argparse.ArgumentTypeError(f"expects NAME=FILE with a .npy, .npz or .pb file, or FILE.npz; got {item!r}")
    return item


def _load_given(items: list[str], specs: list) -> dict[str, Any]:
    """Values from -i NAME=FILE (.npy, .npz, .pb) or -i FILE.npz (every array, by name)."""
    try:
        return _load_files(items, specs)
    except ValueError as e:          # numpy: not a .npy/.npz file, or one holding Python objects
        raise OnnxMiniError(f"cannot read an input file: {e}") from None


def _load_files(items: list[str], specs: list) -> dict[str, Any]:
    by_name = {s.name: s for s in specs}
    feeds: dict[str, Any] = {}
    for item in items:
        name, eq, path = item.partition("=")
        if not eq:
            name, path = "", item
        if not path:
            raise UsageError(f"-i expects NAME=FILE or FILE.npz, got {item!r}")
        ext = os.path.splitext(path)[1].lower()
        if ext == ".npz":
            with np.load(path, allow_pickle=False) as z:
                if not name:
                    feeds.update({k: z[k] for k in z.files})
                elif name in z.files:
                    feeds[name] = z[name]
                elif len(z.files) == 1:
                    feeds[name] = z[z.files[0]]
                else:
                    raise UsageError(f"{path} holds {', '.join(z.files)}: none is named {name!r}")
            continue
        if not name:
            if len(specs) != 1:
                raise UsageError(f"-i {item}: say which input it is (NAME=FILE); the model's inputs are "
                                 f"{', '.join(s.name for s in specs)}")
            name = specs[0].name
        if ext == ".npy":
            feeds[name] = np.load(path, allow_pickle=False)
        elif ext == ".pb":
            spec = by_name.get(name)
            feeds[name] = _read_pb(path, spec.type if spec is not None else None)
        else:
            raise UsageError(f"-i {item}: expected a .npy, .npz or .pb file")   # _input_arg checked it
    return feeds


def _read_pb(path: str, t: TypeInfo | None) -> Any:
    """A serialized TensorProto (or SequenceProto / MapProto / OptionalProto, by the declared type)."""
    import onnx
    from onnx import numpy_helper
    data = Path(path).read_bytes()
    kind = t.kind if t is not None else "tensor"
    proto = {"sequence": onnx.SequenceProto, "map": onnx.MapProto, "optional": onnx.OptionalProto}.get(
        kind, onnx.TensorProto)()
    try:
        proto.ParseFromString(data)
    except Exception as e:
        raise OnnxMiniError(f"{path} is not a serialized {type(proto).__name__}: {e}") from None
    if isinstance(proto, onnx.TensorProto):
        return dtypes.tensor_to_array(proto)
    if isinstance(proto, onnx.SequenceProto):
        return [dtypes.tensor_to_array(x) for x in proto.tensor_values] or numpy_helper.to_list(proto)
    if isinstance(proto, onnx.MapProto):
        return numpy_helper.to_dict(proto)
    return numpy_helper.to_optional(proto)


def random_value(t: TypeInfo | None, rng: np.random.Generator, dims: dict[str, int], notes: list[str]) -> Any:
    """A random value of a declared type: floats ~ N(0, 1), integers in [0, 5), random booleans and
    words; symbolic dimensions from `dims` (else 1), unknown ones 1. What was assumed goes to notes."""
    import onnx
    if t is None:
        notes.append("type unknown: a float32 scalar")
        return np.array(rng.standard_normal(), np.float32)
    if t.kind == "sequence":
        return [random_value(t.inner, rng, dims, notes) for _ in range(2)]
    if t.kind == "optional":
        return random_value(t.inner, rng, dims, notes)
    if t.kind == "map":
        keys = ["a", "b", "c"] if t.key_type == onnx.TensorProto.STRING else [0, 1, 2]
        elem = t.inner.elem_type if t.inner is not None and t.inner.kind == "tensor" else 1
        return {k: _random_array(elem, (), rng).item() for k in keys}
    if t.kind != "tensor":
        raise OnnxMiniError(f"cannot make a random {type_string(t)}: give this input with -i")
    if t.shape is None:
        notes.append("rank unknown: a scalar")
        shape: tuple = ()
    else:
        shape = tuple(_dim(d, dims, notes) for d in t.shape)
    return _random_array(t.elem_type, shape, rng)


def _dim(d, dims: dict[str, int], notes: list[str]) -> int:
    if isinstance(d, int):
        return d
    if isinstance(d, str) and d in dims:
        return dims[d]
    note = f"dim {d!r} = 1, set with --dim {d}=N" if isinstance(d, str) else "an unnamed dim = 1"
    if note not in notes:
        notes.append(note)
    return 1


def _random_array(elem: int, shape: tuple, rng: np.random.Generator) -> np.ndarray:
    dt = dtypes.np_dtype(elem) if elem else np.dtype(np.float32)
    if dt == object:
        words = np.array(["alpha", "beta", "gamma", "delta", "epsilon"], dtype=object)
        return words[rng.integers(0, len(words), size=shape)]
    if dt == np.bool_:
        return rng.random(shape) < 0.5
    if dt.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt)
    if dt.kind in "iu":
        return rng.integers(0, 5, size=shape).astype(dt)
    if dt.name in ("int4", "uint4", "int2", "uint2"):
        return rng.integers(0, 2, size=shape).astype(np.float32).astype(dt)
    if "e8m0" in dt.name:
        return rng.uniform(0.5, 2.0, size=shape).astype(np.float32).astype(dt)
    return rng.standard_normal(shape).astype(np.float32).astype(dt)


def make_feeds(args, specs: list) -> dict[str, Any]:
    """The given inputs, plus random ones for those not given; says on stderr what it made up."""
    feeds = _load_given(args.input, specs)
    dims = dict(args.dim)
    rng = np.random.default_rng(args.seed)
    made = []
    for s in specs:
        if s.name not in feeds:
            notes: list[str] = []
            feeds[s.name] = random_value(s.type, rng, dims, notes)
            made.append((s.name, feeds[s.name], notes))
    if made:
        print(f"{'no inputs given' if not args.input else 'inputs not given'}: random inputs "
              f"(seed {args.seed}):", file=sys.stderr)
        for name, value, notes in made:
            print(f"  {name}: {_describe(value)}" + (f"  ({'; '.join(notes)})" if notes else ""), file=sys.stderr)
    return feeds


def _describe(value: Any) -> str:
    from .plan import describe_value
    return describe_value(value)


# -- run ----------------------------------------------------------------------------------------------

def _run(args) -> int:
    sess, feeds = _session_and_feeds(args)
    names = args.output or [o.name for o in sess.get_outputs()]
    start = time.perf_counter()
    outputs = sess.run(names, feeds)
    elapsed = time.perf_counter() - start
    np.set_printoptions(threshold=args.threshold, edgeitems=3)
    for name, value in zip(names, outputs):
        print(f"{name}: {_describe(value)}\n{value}")
    print(f"ran in {elapsed * 1e3:.2f} ms")
    if args.save:
        _save(Path(args.save), names, outputs, feeds)
    return 0


def _filename(name: str) -> str:
    return re.sub(r"[^\w.-]", "_", name) or "_"


def _save(folder: Path, names: list[str], outputs: list, feeds: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, value in zip(names, outputs):
        if isinstance(value, np.ndarray) and value.dtype != object:
            np.save(folder / f"{_filename(name)}.npy", value)
            written.append(f"{_filename(name)}.npy")
        elif isinstance(value, list) and all(isinstance(v, np.ndarray) and v.dtype != object for v in value):
            np.savez(folder / f"{_filename(name)}.npz", *value)
            written.append(f"{_filename(name)}.npz (arr_0, arr_1, ...)")
        else:
            print(f"not saved: {name} ({_describe(value)}) has no .npy form", file=sys.stderr)
    arrays = {k: v for k, v in feeds.items() if isinstance(v, np.ndarray) and v.dtype != object}
    if arrays:
        np.savez(folder / "inputs.npz", **arrays)
        written.append("inputs.npz (run again with -i inputs.npz)")
    print(f"saved to {folder}: {', '.join(written) or 'nothing'}")


# -- bench --------------------------------------------------------------------------------------------

def _timed(fn, runs: int, warmup: int, label: str) -> list[float]:
    progress = Progress(label, warmup + runs)
    times = []
    for i in range(warmup + runs):
        t0 = time.perf_counter()
        fn()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
        progress(i + 1)
    return times


def _stats(times: list[float]) -> str:
    p50, p90, p99 = np.percentile(np.array(times) * 1e3, [50, 90, 99])
    return (f"p50 {p50:9.3f} ms  p90 {p90:9.3f} ms  p99 {p99:9.3f} ms  "
            f"mean {np.mean(times) * 1e3:9.3f} ms  min {min(times) * 1e3:9.3f} ms")


def _bench(args) -> int:
    if args.runs < 1 or args.warmup < 0:
        raise UsageError("--runs must be at least 1 and --warmup at least 0")
    sess, feeds = _session_and_feeds(args)
    names = [o.name for o in sess.get_outputs()]
    ours = _timed(lambda: sess.run(names, feeds), args.runs, args.warmup, "onnx_mini  ")
    print(f"{args.model}: {args.runs} run(s) after {args.warmup} warm-up run(s)")
    print(f"onnx_mini    {_stats(ours)}")
    if args.vs:
        try:
            import onnxruntime as ort
        except ImportError:
            print("onnxruntime is not installed: no comparison (pip install onnxruntime)")
            return 0
        options = ort.SessionOptions()
        options.log_severity_level = 3
        try:
            other = ort.InferenceSession(args.model, options, providers=["CPUExecutionProvider"])
            ort_feeds = {k: v for k, v in feeds.items() if isinstance(v, np.ndarray)}
            theirs = _timed(lambda: other.run(None, ort_feeds), args.runs, args.warmup, "onnxruntime")
        except Exception as e:   # onnxruntime's own errors: the model or an input it does not take
            print(f"onnxruntime cannot run this model: {' '.join(str(e).split())[:300]}")
            return 0
        print(f"onnxruntime  {_stats(theirs)}  (onnxruntime {ort.__version__})")
        ratio = np.median(ours) / np.median(theirs)
        print(f"onnx_mini / onnxruntime (p50): {ratio:.2f}x")
    return 0


# -- profile ------------------------------------------------------------------------------------------

def _profile(args) -> int:
    from .profile import profile
    if args.runs < 1 or args.warmup < 0:
        raise UsageError("--runs must be at least 1 and --warmup at least 0")
    sess, feeds = _session_and_feeds(args)
    prof = profile(sess.prepared, feeds, runs=args.runs, warmup=args.warmup,
                   progress=Progress("profile", args.runs + args.warmup))
    print(prof.table(top=args.top))
    for path, write in ((args.json, prof.to_json), (args.trace, prof.to_chrome_trace), (args.html, prof.to_html)):
        if path:
            write(path)
            print(f"wrote {path}")
    return 0


# -- compare ------------------------------------------------------------------------------------------

def _compare(args) -> int:
    from .compare import compare
    sess, feeds = _session_and_feeds(args)
    result = compare(args.model, feeds, against=args.vs, rtol=args.rtol, atol=args.atol)
    print(result)
    return 0 if result.ok else 1


# -- ops ----------------------------------------------------------------------------------------------

def _ops(args) -> int:
    import onnx
    if args.model:
        rows = model_needs(_read(args.model))
        missing = [r for r in rows if r["status"] == "missing"]
        for r in (missing if args.missing else rows):
            label = _op_label(r) + ("" if r["version"] is None else f"-{r['version']}")
            print(f"{label}: {r['status']}" + (f" ({r['problem']})" if r["problem"] else ""))
        if missing:
            print(f"onnx-mini: {len(missing)} of the model's {len(rows)} operator(s) cannot run",
                  file=sys.stderr)
            return 1
        print(f"all {len(rows)} operator(s) of the model run")
        return 0
    from .coverage import public_ops, uncovered
    defined = sum(1 for _ in onnx.defs.get_all_schemas_with_history())
    gaps = uncovered()
    if args.missing:
        for domain, op, version, reason in gaps:
            print(f"{domain or 'ai.onnx'} {op}-{version}: {reason}")
        if not gaps:
            print(f"nothing: every (domain, op, version) of onnx {onnx.__version__} runs")
        print(f"{len(gaps)} of the {defined} (domain, op, version) schemas of onnx {onnx.__version__} "
              "cannot run", file=sys.stderr)
        return 0
    print(operator_table())
    print(f"{len(public_ops())} kernels; {defined - len(gaps)} of the {defined} (domain, op, version) "
          f"schemas of onnx {onnx.__version__} run (`onnx-mini ops --missing` lists the others)", file=sys.stderr)
    return 0


# -- main ---------------------------------------------------------------------------------------------

def _model_command(sub, name: str, help: str, func, *, inputs: bool = True) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help)
    p.add_argument("model", help="an .onnx file")
    if inputs:
        p.add_argument("-i", "--input", action="append", default=[], metavar="NAME=FILE", type=_input_arg,
                       help="an input from a .npy, .npz or .pb (TensorProto) file; FILE.npz alone gives every "
                            "array it holds, by name. Inputs not given are random")
        p.add_argument("--dim", action="append", default=[], metavar="NAME=VALUE", type=_dim_arg,
                       help="the value of a symbolic dimension for random inputs (default 1)")
        p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.set_defaults(func=func)
    return p


def _repeat_options(p: argparse.ArgumentParser, runs: int, warmup: int, what: str) -> None:
    p.add_argument("--runs", type=int, metavar="N", default=runs, help=f"{what} runs (default {runs})")
    p.add_argument("--warmup", type=int, metavar="N", default=warmup,
                   help=f"runs not {what} first (default {warmup})")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="onnx-mini", description="A pure-Python ONNX runtime.",
                                     epilog="exit codes: 0 ok, 1 model or run error, 2 usage error")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _model_command(sub, "info", "describe a model: opsets, producer, inputs, outputs, operators", _info,
                   inputs=False)

    p = _model_command(sub, "run", "run a model once and print its outputs", _run)
    p.add_argument("-o", "--output", action="append", default=[], metavar="NAME",
                   help="a value to print (any intermediate value may be named); default: the outputs")
    p.add_argument("--save", metavar="DIR", help="write the outputs as NAME.npy and the inputs as inputs.npz")
    p.add_argument("--threshold", type=int, default=200, help="numpy print threshold")

    p = _model_command(sub, "bench", "latency percentiles, optionally against onnxruntime", _bench)
    _repeat_options(p, 20, 2, "timed")
    p.add_argument("--vs", choices=["onnxruntime"], help="also time onnxruntime on the same inputs")

    p = _model_command(sub, "profile", "time and live memory per node and per operator type", _profile)
    _repeat_options(p, 5, 1, "profiled")
    p.add_argument("--top", type=int, metavar="N", default=15, help="slowest nodes to list (default 15)")
    p.add_argument("--json", metavar="FILE", help="write the profile as JSON")
    p.add_argument("--trace", metavar="FILE", help="write a Chrome trace (ui.perfetto.dev, chrome://tracing)")
    p.add_argument("--html", metavar="FILE", help="write a self-contained HTML report")

    p = _model_command(sub, "compare", "the first node where onnx_mini and another runtime differ", _compare)
    p.add_argument("--vs", choices=["onnxruntime", "reference"], default="onnxruntime",
                   help="the other runtime (default onnxruntime; reference = onnx.reference)")
    p.add_argument("--rtol", type=float, default=1e-4, help="relative tolerance (default 1e-4)")
    p.add_argument("--atol", type=float, default=1e-5, help="absolute tolerance (default 1e-5)")

    p = sub.add_parser("ops", help="the operator table; --missing: what cannot run; --model: one model's needs")
    p.add_argument("--missing", action="store_true", help="list what cannot run instead")
    p.add_argument("--model", metavar="MODEL", help="check the operators one model needs")
    p.set_defaults(func=_ops)
    for p in sub.choices.values():
        p.add_argument("--plugin", action="append", default=[], metavar="FILE.py|MODULE",
                       help="a Python file or module to import first: its onnx_mini.kernel registrations "
                            "(user kernels, global) are what the command sees; repeatable")
        p.set_defaults(parser=p)
    return parser


def load_plugins(plugins: list[str]) -> None:
    """Import each plugin (a .py file path or a module name) so that its global kernels register."""
    import importlib
    import importlib.util
    for i, plugin in enumerate(plugins):
        if plugin.endswith(".py") or os.sep in plugin:
            path = Path(plugin)
            if not path.is_file():
                raise UsageError(f"--plugin {plugin}: no such file")
            spec = importlib.util.spec_from_file_location(f"onnx_mini_plugin_{i}_{path.stem}", path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
        else:
            importlib.import_module(plugin)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:          # argparse: --help (0) or a usage error (2)
        return int(e.code or 0)
    try:
        load_plugins(args.plugin)
        return args.func(args)
    except UsageError as e:
        args.parser.print_usage(sys.stderr)
        print(f"onnx-mini {args.command}: error: {e}", file=sys.stderr)
        return 2
    except OnnxMiniError as e:
        print(f"onnx-mini: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:             # files: -i, --save, --json, ...
        print(f"onnx-mini: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("onnx-mini: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
