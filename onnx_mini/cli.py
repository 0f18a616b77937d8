"""The `onnx-mini` command line.

    onnx-mini info MODEL [--full]             describe a model (works on any loadable model)
    onnx-mini run MODEL [-i NAME=FILE] ...    run, print (and --save) the outputs, time first and later runs
    onnx-mini bench MODEL [--vs onnxruntime]  latency percentiles
    onnx-mini profile MODEL [--html F] ...    time and memory by node and by operator type
    onnx-mini compare MODEL [--vs ...]        do the outputs agree with another runtime? where values part
    onnx-mini ops [--missing] [--model M]     what onnx_mini can run
    --plugin FILE.py (any command)            import user kernels (onnx_mini.kernel) first
    --no-optimize (run, bench, profile, compare)  run the graph as written

Exit codes: 0 ok (compare: the outputs agree), 1 a model, input or run error (compare: an output
differs), 2 a usage error. Expected errors print one message on stderr, never a traceback; output
cut short by its reader (`| head`) ends quietly.
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
    from .loader import implied_opsets
    rows = []
    for (domain, op), count in sorted(counts.items()):
        if (domain, op) in local:
            rows.append(dict(domain=domain, op=op, count=count, version=None, status="model function", problem=""))
            continue
        # a domain the model does not import runs at its implied version, as at load (loader.implied_opsets)
        version, status, problem = support(domain, op, where[(domain, op)].get(domain, implied_opsets().get(domain)))
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
        print(f"description: {_shorten(proto.doc_string.strip(), args.full)}")
    if proto.metadata_props:
        print("metadata:")
        props = proto.metadata_props if args.full else proto.metadata_props[:_MAX_PROPS]
        for p in props:
            print(f"  {p.key}: {_shorten(p.value, args.full)}")
        if len(props) < len(proto.metadata_props):
            print(f"  ... {len(proto.metadata_props) - len(props)} more (--full shows all)")
    inits = {t.name for t in g.initializer} | {s.values.name for s in g.sparse_initializer}
    weights = sum(int(np.prod(t.dims, dtype=np.int64)) for t in g.initializer)
    inner = sum(1 for _ in _walk_nodes(g.node, {})) - len(g.node)
    print(f"nodes: {len(g.node)}" + (f" (+{inner} in subgraphs)" if inner else "")
          + f"; initializers: {len(inits)} ({weights:,} elements); model functions: {len(proto.functions)}")
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


# A model's metadata may hold whole files (a vocabulary, a config): info shows the start of each value.
_MAX_CHARS, _MAX_LINES, _MAX_PROPS = 200, 3, 50


def _shorten(text: str, full: bool) -> str:
    """text, or its first lines and characters with how much was cut; later lines indented."""
    lines = text.splitlines() or [""]
    cut = "\n".join(lines[:_MAX_LINES])[:_MAX_CHARS]
    if not full and cut != text:
        text = f"{cut} … ({len(text):,} chars, --full shows all)"
    return text.replace("\n", "\n    ")


# -- inputs: files or random values -------------------------------------------------------------------

def _session(path: str, optimize: bool = True):
    from .session import InferenceSession
    return InferenceSession(path, optimize=optimize)


def _session_and_feeds(args, optimize: bool | None = None) -> tuple[Any, dict[str, Any]]:
    """The model's session, and the feeds: from -i files, random for the inputs not given."""
    sess = _session(args.model, not args.no_optimize if optimize is None else optimize)
    return sess, make_feeds(args, list(sess.prepared.plan.required_inputs))


def _dim_arg(item: str) -> tuple[str, int]:
    """--dim NAME=VALUE or INPUT:AXIS=VALUE (the form checked by argparse: a bad one is a usage error;
    the names against the model by _resolve_dims)."""
    name, eq, value = item.rpartition("=")
    if not eq or not name.strip() or not re.fullmatch(r"\s*\d+\s*", value):
        raise argparse.ArgumentTypeError(f"expects NAME=VALUE or INPUT:AXIS=VALUE with a non-negative integer "
                                         f"VALUE, got {item!r}")
    return name.strip(), int(value)


def _tensor_type(t: TypeInfo | None) -> TypeInfo | None:
    """The tensor type whose dims a random value of type t follows (a sequence's or optional's element)."""
    while t is not None and t.kind in ("sequence", "optional"):
        t = t.inner
    return t if t is not None and t.kind == "tensor" else None


def _free_dims(specs: list) -> dict[str, list[tuple[str, int]]]:
    """Every dimension the inputs leave free, by its --dim key ('batch', or 'x:1' for an unnamed one):
    [(input, axis), ...] where it occurs."""
    free: dict[str, list[tuple[str, int]]] = {}
    for s in specs:
        t = _tensor_type(s.type)
        for axis, d in enumerate(() if t is None or t.shape is None else t.shape):
            if not isinstance(d, int):
                free.setdefault(d if isinstance(d, str) else f"{s.name}:{axis}", []).append((s.name, axis))
    return free


def _resolve_dims(items: list[tuple[str, int]], specs: list) -> dict[str, int]:
    """--dim values by free-dimension key; a name no input has, or an axis that is not free, is a usage
    error listing what can be set. INPUT:AXIS of a named dimension sets the name."""
    free = _free_dims(specs)
    by_input = {s.name: _tensor_type(s.type) for s in specs}
    dims: dict[str, int] = {}
    for key, value in items:
        if key not in free:
            name, _, axis = key.rpartition(":")
            t = by_input.get(name)
            if name in by_input and re.fullmatch(r"-?\d+", axis) and t is not None and t.shape is not None:
                rank, a = len(t.shape), int(axis)
                if not -rank <= a < rank:
                    raise UsageError(f"--dim {key}: input {name!r} has rank {rank}")
                d = t.shape[a % rank]
                if isinstance(d, int):
                    raise UsageError(f"--dim {key}: dimension {a % rank} of input {name!r} is fixed at {d}")
                key = d if isinstance(d, str) else f"{name}:{a % rank}"
            else:
                known = ("the inputs' free dimensions: " + ", ".join(free) if free else
                         "the inputs have no free dimension")
                example = f"{specs[0].name}:0" if specs else "x:0"
                raise UsageError(f"--dim {key}: no input has a dimension named {key!r}; {known} "
                                 f"(an unnamed one is set as INPUT:AXIS=N, e.g. --dim {example}=4)")
        dims[key] = value
    return dims


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


def random_value(t: TypeInfo | None, rng: np.random.Generator, size, notes: list[str]) -> Any:
    """A random value of a declared type: floats ~ N(0, 1), integers in [0, 5), random booleans and
    words; size(axis, dim) gives each dimension that is not a number. What was assumed goes to notes."""
    import onnx
    if t is None:
        notes.append("type unknown: a float32 scalar")
        return np.array(rng.standard_normal(), np.float32)
    if t.kind == "sequence":
        return [random_value(t.inner, rng, size, notes) for _ in range(2)]
    if t.kind == "optional":
        return random_value(t.inner, rng, size, notes)
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
        shape = tuple(d if isinstance(d, int) else size(axis, d) for axis, d in enumerate(t.shape))
    return _random_array(t.elem_type, shape, rng)


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
    """The given inputs, plus random ones for those not given; says on stderr what it made up and on
    stdout the value of every free dimension. Sets args.hint, the advice an error while running gets."""
    feeds = _load_given(args.input, specs)
    dims = _resolve_dims(args.dim, specs)
    rng = np.random.default_rng(args.seed)
    made, defaulted = [], {}
    for s in specs:
        if s.name not in feeds:
            def size(axis: int, d, name=s.name) -> int:
                key = d if isinstance(d, str) else f"{name}:{axis}"
                if key not in dims:
                    defaulted[key] = 1
                return dims.get(key, 1)
            notes: list[str] = []
            feeds[s.name] = random_value(s.type, rng, size, notes)
            made.append((s.name, feeds[s.name], notes))
    if made:
        print(f"{'no inputs given' if not args.input else 'inputs not given'}: random inputs "
              f"(seed {args.seed}):", file=sys.stderr)
        for name, value, notes in made:
            print(f"  {name}: {_describe(value)}" + (f"  ({'; '.join(notes)})" if notes else ""), file=sys.stderr)
    chosen = _chosen_dims(specs, feeds)
    if chosen:
        print("dims: " + ", ".join(f"{k}={v}" + (" (default)" if k in defaulted else "") for k, v in chosen.items()))
    if defaulted:
        args.hint = (f"the inputs were random with {', '.join(f'{k}=1' for k in defaulted)} by default: set "
                     "dimensions with --dim NAME=N or --dim INPUT:AXIS=N, or give the inputs with -i NAME=FILE")
    elif made:
        args.hint = "the inputs were random: give real ones with -i NAME=FILE"
    return feeds


def _chosen_dims(specs: list, feeds: dict) -> dict[str, int]:
    """The size each free dimension has in the feeds (random or given), by --dim key."""
    chosen: dict[str, int] = {}
    for key, where in _free_dims(specs).items():
        for name, axis in where:
            value = feeds.get(name)
            while isinstance(value, list) and value:        # a sequence: its first element's dims
                value = value[0]
            if isinstance(value, np.ndarray) and axis < value.ndim:
                chosen.setdefault(key, value.shape[axis])
    return chosen


def _describe(value: Any) -> str:
    from .plan import describe_value
    return describe_value(value)


# -- run ----------------------------------------------------------------------------------------------

# Without --runs, `run` times a few more runs when the first is quick, within about half a second;
# a slow model runs once, so that `run` stays as quick as one run can be.
_AUTO_RUNS, _AUTO_FIRST, _AUTO_BUDGET = 10, 0.2, 0.5


def _run(args) -> int:
    if args.runs is not None and args.runs < 0:
        raise UsageError("--runs must be at least 0")
    from .catalog import load_all_ops
    load_all_ops()                   # once per process, not the model's cost: kept out of the timing
    start = time.perf_counter()
    sess = _session(args.model, not args.no_optimize)
    prepared = time.perf_counter() - start
    feeds = make_feeds(args, list(sess.prepared.plan.required_inputs))
    names = args.output or [o.name for o in sess.get_outputs()]
    start = time.perf_counter()
    outputs = sess.run(names, feeds)
    first = time.perf_counter() - start
    np.set_printoptions(threshold=args.threshold, edgeitems=3)
    for name, value in zip(names, outputs):
        print(f"{name}: {_describe(value)}\n{value}")
    sys.stdout.flush()
    times: list[float] = []
    runs = args.runs if args.runs is not None else _AUTO_RUNS if first < _AUTO_FIRST else 0
    if runs:             # the steady state: the BLAS mode runs settle in (as bench)
        sess.prepared.settle(feeds)
    while len(times) < runs and (args.runs is not None or sum(times) < _AUTO_BUDGET):
        start = time.perf_counter()
        sess.run(names, feeds)
        times.append(time.perf_counter() - start)
    line = f"first run {_ms(first)} (load and prepare {_ms(prepared)})"
    if times:
        line += f", then {_ms(float(np.median(times)))} median over {len(times)} run(s)"
    elif args.runs is None:
        line += "; --runs N times N more runs"
    print(line)
    if args.save:
        _save(Path(args.save), names, outputs, feeds)
    return 0


def _ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.0f} ms" if ms >= 100 else f"{ms:.1f} ms" if ms >= 10 else f"{ms:.2f} ms"


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
    sess.prepared.settle(feeds)          # not a new process's first runs, nor the model's mode trials
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
    # compare runs onnx_mini unoptimised (every node of the model runs, so every value compares): the
    # session here only lists the inputs, no need to optimise it either
    sess, feeds = _session_and_feeds(args, optimize=False)
    result = compare(args.model, feeds, against=args.vs, rtol=args.rtol, atol=args.atol)
    print(result)
    return 0 if result.outputs_agree else 1


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
        p.add_argument("--dim", action="append", default=[], metavar="NAME=N|INPUT:AXIS=N", type=_dim_arg,
                       help="the size of a free dimension of the random inputs, by name (batch=4) or by input "
                            "and axis (x:0=4); default 1")
        p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
        p.add_argument("--no-optimize", action="store_true",
                       help="run the graph as written, without onnx_mini's graph rewrites"
                            + (" (compare always does: every node's output is compared)" if name == "compare"
                               else ""))
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

    p = _model_command(sub, "info", "describe a model: opsets, producer, inputs, outputs, operators", _info,
                       inputs=False)
    p.add_argument("--full", action="store_true", help="show long metadata values and descriptions whole")

    p = _model_command(sub, "run", "run a model, print its outputs and how long the first and later runs took",
                       _run)
    p.add_argument("-o", "--output", action="append", default=[], metavar="NAME",
                   help="a value to print (any intermediate value may be named); default: the outputs")
    p.add_argument("--save", metavar="DIR", help="write the outputs as NAME.npy and the inputs as inputs.npz")
    p.add_argument("--threshold", type=int, default=200, help="numpy print threshold")
    p.add_argument("--runs", type=int, metavar="N", default=None,
                   help="timed runs after the first (default: up to 10 when the first takes under 0.2 s)")

    p = _model_command(sub, "bench", "latency percentiles, optionally against onnxruntime", _bench)
    _repeat_options(p, 20, 2, "timed")
    p.add_argument("--vs", choices=["onnxruntime"], help="also time onnxruntime on the same inputs")

    p = _model_command(sub, "profile", "time and live memory per node and per operator type", _profile)
    _repeat_options(p, 5, 1, "profiled")
    p.add_argument("--top", type=int, metavar="N", default=15, help="slowest nodes to list (default 15)")
    p.add_argument("--json", metavar="FILE", help="write the profile as JSON")
    p.add_argument("--trace", metavar="FILE", help="write a Chrome trace (ui.perfetto.dev, chrome://tracing)")
    p.add_argument("--html", metavar="FILE", help="write a self-contained HTML report")

    p = _model_command(sub, "compare", "do the outputs agree with another runtime's? and the first node where "
                       "values differ", _compare)
    p.add_argument("--vs", choices=["onnxruntime", "reference"], default="onnxruntime",
                   help="the other runtime (default onnxruntime; reference = onnx.reference)")
    p.add_argument("--rtol", type=float, default=None,
                   help="relative tolerance for every float type (default by type: float32 1e-4)")
    p.add_argument("--atol", type=float, default=None,
                   help="absolute tolerance for every float type (default by type, relative to each tensor's "
                        "largest value: float32 1e-5 * max|value|)")

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


def _check_model_file(path: str) -> None:
    """A directory or an empty file named as the model: say so (the loader's messages are about protobuf)."""
    if os.path.isdir(path):
        inside = sorted(f for f in os.listdir(path) if f.endswith(".onnx"))[:5]
        raise OnnxMiniError(f"{path} is a directory, not a model file"
                            + (f" (it holds {', '.join(inside)})" if inside else ""))
    if os.path.isfile(path) and os.path.getsize(path) == 0:
        raise OnnxMiniError(f"{path} is empty (0 bytes): not an ONNX model")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:          # argparse: --help (0) or a usage error (2)
        return int(e.code or 0)
    try:
        load_plugins(args.plugin)
        if getattr(args, "model", None):
            _check_model_file(args.model)
        code = args.func(args)
        sys.stdout.flush()           # a reader gone (| head) shows here, not at interpreter exit
        return code
    except BrokenPipeError:
        # the reader closed the pipe: stop quietly, as a killed Unix filter does (128 + SIGPIPE);
        # stdout goes to devnull so that the interpreter's final flush does not complain again
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 141
    except UsageError as e:
        args.parser.print_usage(sys.stderr)
        print(f"onnx-mini {args.command}: error: {e}", file=sys.stderr)
        return 2
    except OnnxMiniError as e:
        print(f"onnx-mini: error: {e}", file=sys.stderr)
        if getattr(args, "hint", None):
            print(f"onnx-mini: hint: {args.hint}", file=sys.stderr)
        return 1
    except OSError as e:             # files: -i, --save, --json, ...
        print(f"onnx-mini: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("onnx-mini: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
