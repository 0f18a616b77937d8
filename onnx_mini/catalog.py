"""The built-in kernels: every module of onnx_mini.ops imported once (their @kernel decorators fill
registry's table), and what that table holds."""
from __future__ import annotations

import importlib
import pkgutil

import onnx.defs

from . import ops
from .registry import kernels, KernelSpec

STANDARD_DOMAINS = ("", "ai.onnx.ml", "ai.onnx.preview.training")

_loaded = False


def load_all_ops() -> None:
    """Import every module of onnx_mini.ops so that their @kernel decorators run."""
    global _loaded
    if _loaded:
        return
    for info in pkgutil.walk_packages(ops.__path__, ops.__name__ + "."):
        importlib.import_module(info.name)
    _loaded = True


def registered() -> dict[tuple[str, str, int], KernelSpec]:
    load_all_ops()
    return dict(kernels())


def builtin_kind(domain: str, op_type: str) -> str:
    """What already runs (domain, op_type) ('' if nothing): onnx's schema or a built-in kernel."""
    load_all_ops()
    if domain in STANDARD_DOMAINS and onnx.defs.has(op_type, domain):
        return "a standard operator"
    if any(d == domain and o == op_type for (d, o, _) in kernels()):
        return "a built-in operator"
    return ""
