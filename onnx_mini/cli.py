"""The `onnx-mini` command line: info, run, ops."""
from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict

import numpy as np

from . import dtypes
from .errors import OnnxMiniError


def operator_table() -> str:
    """Markdown table of every registered kernel, by domain and operator (generated, never hand-written)."""
    from .registry import supported_ops
    versions: dict[tuple[str, str], list[int]] = defaultdict(list)
    for domain, op, since in supported_ops():
        versions[(domain, op)].append(since)
    lines = ["| domain | operator | versions (since) |", "|---|---|---|"]
    for (domain, op), vs in sorted(versions.items()):
        lines.append(f"| {domain or 'ai.onnx'} | {op} | {', '.join(map(str, sorted(vs)))} |")
    return "\n".join(lines)


def _info(args) -> int:
    from .session import InferenceSession
    sess = InferenceSession(args.model)
    m = sess.prepared.model
    print(f"IR version {m.ir_version}; opsets: " + ", ".join(f"{d or 'ai.onnx'}={v}" for d, v in m.opsets.items()))
    print(f"nodes: {len(m.graph.nodes)}; planned steps: {len(sess.prepared.plan.steps)}")
    for title, args_ in (("inputs", sess.get_inputs()), ("outputs", sess.get_outputs())):
        print(f"{title}:")
        for a in args_:
            print(f"  {a.name}: {a.type} {a.shape}")
    return 0


def _feeds(sess, given: list[str]) -> dict:
    """Inputs from NAME=file.npy arguments; any input not given is filled with zeros (symbolic dims = 1)."""
    feeds = {}
    for item in given:
        name, _, path = item.partition("=")
        feeds[name] = np.load(path, allow_pickle=False)
    for spec in sess.prepared.plan.required_inputs:
        if spec.name not in feeds and spec.type is not None and spec.type.kind == "tensor":
            shape = [d if isinstance(d, int) else 1 for d in (spec.type.shape or ())]
            feeds[spec.name] = np.zeros(shape, dtype=dtypes.np_dtype(spec.type.elem_type))
    return feeds


def _run(args) -> int:
    from .session import InferenceSession
    sess = InferenceSession(args.model)
    feeds = _feeds(sess, args.input)
    start = time.perf_counter()
    outputs = sess.run(args.output or None, feeds)
    elapsed = time.perf_counter() - start
    names = args.output or [o.name for o in sess.get_outputs()]
    np.set_printoptions(threshold=args.threshold, edgeitems=3)
    for name, value in zip(names, outputs):
        desc = f"{value.dtype}{list(value.shape)}" if isinstance(value, np.ndarray) else type(value).__name__
        print(f"{name}: {desc}\n{value}")
    print(f"ran in {elapsed * 1e3:.2f} ms")
    return 0


def _ops(args) -> int:
    print(operator_table())
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="onnx-mini", description="A pure-Python ONNX runtime.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("info", help="show a model's opsets, inputs and outputs")
    p.add_argument("model")
    p.set_defaults(func=_info)
    p = sub.add_parser("run", help="run a model once and print its outputs")
    p.add_argument("model")
    p.add_argument("-i", "--input", action="append", default=[], metavar="NAME=FILE.npy",
                   help="an input from a .npy file (inputs not given are zeros)")
    p.add_argument("-o", "--output", action="append", default=[], metavar="NAME",
                   help="a value to print (any intermediate value may be named); default: the outputs")
    p.add_argument("--threshold", type=int, default=200, help="numpy print threshold")
    p.set_defaults(func=_run)
    p = sub.add_parser("ops", help="print the table of supported operators (markdown)")
    p.set_defaults(func=_ops)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except OnnxMiniError as e:
        print(f"onnx-mini: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
