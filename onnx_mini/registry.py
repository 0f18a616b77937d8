"""The @kernel decorator and the table of built-in kernels by (domain, op_type, since_version).

A kernel is a factory: it takes the node's attributes as keyword-only arguments carrying the spec's
defaults and returns the function that runs on numpy values. One factory lists every schema version
it implements:

    @kernel("Shape", since=(1, 13))
    def shape_1():
        return lambda data: np.array(data.shape, dtype=np.int64)

Factory parameters whose names start with "_" are not attributes but facts the planner injects:
- `_version`: the schema version this binding serves (one of `since`);
- `_constants`: {input index: value} for the node's inputs known when the model is prepared
  (initializers that no feed can replace, folded constants). The factory may return a function
  specialised to them (weights transformed once, as onnxruntime's PrePack); the function still
  receives every input at run time, and a constant input arrives as that same value;
- `_options`: the model's kernel options, as given to prepare (e.g. {"conv_algorithm": "im2col"});
- `_n_inputs`/`_n_outputs`: how many the node has, counting omitted optional ones;
- `_graph`/`_opsets`/`_plan`: the graph holding the node, its opset imports, and a function that
  plans a Graph into a SubPlan (for ops about their own graph: Gradient);
- `_input_producers`: per input, (op_type, attributes) of the default-domain node computing it in
  the graph as written, or None (a graph input, a constant, another domain): how the model states
  an input's intended precision (Softmax after an explicit Cast to float16).

Facts about an operator that the planner reads are arguments of @kernel, never name lists elsewhere:
- `foldable` (default True): computed once at prepare time when every input is constant (False for
  the random generators);
- `heavy`: a step worth a thread hand-off when independent branches run at the same time;
- `in_place`: f(*inputs, out=array) computing exactly the kernel's result for float32/float64
  arrays with numpy broadcasting, which the planner may point at an input's buffer when that input
  dies at the step;
- `views`: the result may be a view of the first input (Reshape, Squeeze, Identity, ...);
- `rank`: what the optimiser may assume of the output's rank: "first" (the first input's),
  "broadcast" (the largest of the inputs'), or "squeeze" / "unsqueeze" (the first input's less / plus
  the number of `axes`, the attribute or a constant second input; unknown without them);
- `until`: the first opset of the domain in which the operator no longer exists (an operator onnx
  removed, which therefore has no schema saying so: ImageScaler).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

import numpy as np
import onnx.defs

from .graph import normalize_domain

INJECTED = ("_n_inputs", "_n_outputs", "_graph", "_opsets", "_plan", "_version", "_constants", "_options",
            "_input_producers")


@dataclass(frozen=True)
class KernelSpec:
    factory: Callable
    op_type: str
    domain: str
    since: int
    attributes: frozenset[str]     # attribute names the factory accepts
    required: frozenset[str]       # attributes without a default
    injected: frozenset[str]       # names from INJECTED the factory asks for
    multi_output: bool             # the kernel's function returns a tuple (one item per output)
    foldable: bool = True          # computed at prepare time when every input is constant
    heavy: bool = False            # worth a thread hand-off (schedule.py)
    in_place: Callable | None = None   # f(*inputs, out=) for float32/64 (inplace.py)
    views: bool = False            # the result may be a view of the first input
    rank: str | None = None        # "first", "broadcast", "squeeze", "unsqueeze": see the module doc
    until: int | None = None       # first opset without the operator (removed from the spec), None: still there


_KERNELS: dict[tuple[str, str, int], KernelSpec] = {}


def kernels() -> dict[tuple[str, str, int], KernelSpec]:
    """The live table of built-in kernels (filled as the ops modules are imported: catalog.py)."""
    return _KERNELS


def _specs(factory: Callable, op_type: str, domain: str, versions: tuple[int, ...],
           multi_output: bool | None, **facts) -> list[KernelSpec]:
    """The KernelSpec of a factory for each version (TypeError if its parameters are not keyword-only)."""
    if not callable(factory):
        raise TypeError(f"kernel {op_type}: the decorated object must be a factory function")
    params = inspect.signature(factory).parameters.values()
    bad = [p.name for p in params if p.kind is not p.KEYWORD_ONLY]
    if bad:
        raise TypeError(f"kernel factory {factory.__name__}: parameters {bad} must be keyword-only")
    attrs = frozenset(p.name for p in params if p.name not in INJECTED)
    required = frozenset(p.name for p in params if p.default is p.empty and p.name not in INJECTED)
    injected = frozenset(p.name for p in params if p.name in INJECTED)
    out = []
    for v in versions:
        multi = multi_output
        if multi is None:
            schema = _schema(op_type, domain, v)
            multi = schema is not None and schema.max_output > 1
        out.append(KernelSpec(factory, op_type, domain, v, attrs, required, injected, multi, **facts))
    return out


def _versions(since) -> tuple[int, ...]:
    versions = (since,) if isinstance(since, (int, np.integer)) else tuple(since)
    if not versions or not all(isinstance(v, (int, np.integer)) and v >= 1 for v in versions):
        raise ValueError(f"since must be a version (int >= 1) or a sequence of them, got {since!r}")
    return tuple(int(v) for v in versions)


def kernel(op_type: str, since, domain: str = "", multi_output: bool | None = None, *, foldable: bool = True,
           heavy: bool = False, in_place: Callable | None = None, views: bool = False, rank: str | None = None,
           until: int | None = None):
    """Register a built-in kernel factory for each listed schema version of (domain, op_type).

    multi_output defaults to what the schema says (more than one output possible); a kernel
    whose op can have several outputs returns a tuple, otherwise the single value. foldable, heavy,
    in_place, views, rank and until are the operator's facts (see the module's doc).
    (Users register theirs with onnx_mini.kernel or a CustomOps set: see CustomOps.)
    """
    versions = _versions(since)
    domain = normalize_domain(domain)
    if rank not in (None, "first", "broadcast", "squeeze", "unsqueeze"):
        raise ValueError(f"rank must be None, 'first', 'broadcast', 'squeeze' or 'unsqueeze', got {rank!r}")
    facts = dict(foldable=foldable, heavy=heavy, in_place=in_place, views=views, rank=rank, until=until)

    def register(factory: Callable) -> Callable:
        for spec in _specs(factory, op_type, domain, versions, multi_output, **facts):
            key = (domain, op_type, spec.since)
            if key in _KERNELS:
                raise ValueError(f"kernel {key} registered twice")
            _KERNELS[key] = spec
        return factory

    return register


def _schema(op_type: str, domain: str, opset: int):
    try:
        return onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return None
