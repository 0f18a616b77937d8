"""Coverage: which (domain, op, version) pairs run (a kernel, or a function body whose every node
runs). One implementation for the tests, the README's table and `onnx-mini ops`."""
from __future__ import annotations

import onnx.defs

from .catalog import load_all_ops, registered
from .graph import normalize_domain
from .ops.fused import FUSED_DOMAIN
from .resolve import _resolve, resolve


def supported_ops() -> list[tuple[str, str, int]]:
    """Every registered (domain, op_type, since_version), sorted."""
    return sorted(registered())


def public_ops() -> list[tuple[str, str, int]]:
    """Registered (domain, op, since) of the operator domains a model may use: not the optimiser's
    private fused kernels."""
    return [k for k in supported_ops() if k[0] != FUSED_DOMAIN]


def support(domain: str, op_type: str, opset: int | None, *, user_kernels: bool = True,
            depth: int = 0) -> tuple[int | None, str, str]:
    """(schema version, status, problem) of (domain, op_type) at the opset: status "kernel",
    "function body" (its nodes all run), "typed function body" (built for the input types at
    prepare or run time) or "missing" (problem says why). user_kernels: count onnx_mini.kernel and
    the active CustomOps (a model's view); False: the built-in kernels only (the coverage list)."""
    r = resolve(domain, op_type, opset) if user_kernels else _resolve(normalize_domain(domain), op_type, opset)
    if r.kernel is not None:
        return r.version, "kernel", ""
    if r.typed_function:
        return r.version, "typed function body", ""
    if r.function is None:
        return r.version, "missing", r.problem
    if depth > 8:
        return r.version, "missing", "function body nests too deeply"
    for n in r.function.nodes:
        _, status, problem = support(n.domain, n.op_type, r.function.opsets.get(n.domain, opset),
                                     user_kernels=user_kernels, depth=depth + 1)
        if status == "missing":
            return r.version, "missing", f"its function body needs {n.op_type}: {problem}"
    return r.version, "function body", ""


def uncovered() -> list[tuple[str, str, int, str]]:
    """Every (domain, op, since_version) onnx defines that cannot run: no kernel, and no function body
    whose every node resolves (recursively) to a kernel (a body built for input types counts as none:
    it may not exist for the types a model has). -> [(domain, op, version, reason)], sorted."""
    load_all_ops()
    out = []
    for s in onnx.defs.get_all_schemas_with_history():
        domain = normalize_domain(s.domain)
        _, status, problem = support(domain, s.name, s.since_version, user_kernels=False)
        if status == "typed function body":
            out.append((domain, s.name, s.since_version, "no kernel, and its function body depends on input types"))
        elif status == "missing":
            out.append((domain, s.name, s.since_version, problem))
    return sorted(out)
