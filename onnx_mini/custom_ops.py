"""User kernels: CustomOps sets (per model), the global ones (onnx_mini.kernel), and the set planning
consults while a model with custom ops is prepared."""
from __future__ import annotations

import contextlib
import contextvars
from typing import Callable

from .catalog import builtin_kind
from .graph import normalize_domain
from .registry import KernelSpec, _specs, _versions


class CustomOps:
    """A set of user kernels, registered with the same factory decorator as the built-in ones:

        ops = onnx_mini.CustomOps()

        @ops.kernel("MyOp", since=1, domain="my.domain")
        def my_op(*, alpha=1.0):
            return lambda x: (x * alpha).astype(x.dtype)

        onnx_mini.prepare(model, custom_ops=ops)      # or InferenceSession(model, custom_ops=ops)

    A node resolves to the newest version registered here not above the model's opset for its
    domain; the set is consulted before the global user kernels (onnx_mini.kernel) and the built-in
    ones. A kernel for an operator onnx_mini already runs (ai.onnx, ai.onnx.ml, com.microsoft, ...)
    replaces it only with override=True (ValueError otherwise). A kernel whose operator has several
    outputs returns a tuple and is registered with multi_output=True (for a standard operator the
    default follows its schema).
    """

    def __init__(self, *sets: "CustomOps"):
        self._specs: dict[tuple[str, str, int], KernelSpec] = {}
        for other in sets:
            self._specs.update(other._specs)

    def kernel(self, op_type: str, since, domain: str = "", *, multi_output: bool | None = None,
               override: bool = False):
        versions = _versions(since)
        domain = normalize_domain(domain)

        def register(factory: Callable) -> Callable:
            specs = _specs(factory, op_type, domain, versions, multi_output)
            if not override:
                builtin = builtin_kind(domain, op_type)
                if builtin:
                    raise ValueError(f"{domain or 'ai.onnx'} {op_type} is {builtin}: a user kernel replaces it "
                                     f"only when registered with override=True")
                twice = [s.since for s in specs if (domain, op_type, s.since) in self._specs]
                if twice:
                    raise ValueError(f"a kernel for {domain or 'ai.onnx'} {op_type} version(s) {twice} is already "
                                     "registered here (override=True replaces it)")
            for spec in specs:
                self._specs[(domain, op_type, spec.since)] = spec
            return factory

        return register

    def find(self, domain: str, op_type: str, opset: int | None) -> KernelSpec | None:
        """The newest kernel registered here for (domain, op_type) not above opset, or None."""
        if opset is None or not self._specs:
            return None
        versions = [v for (d, o, v) in self._specs if d == domain and o == op_type and v <= opset]
        return self._specs[(domain, op_type, max(versions))] if versions else None

    def ops(self) -> list[tuple[str, str, int]]:
        """Every registered (domain, op_type, version), sorted."""
        return sorted(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    def __repr__(self) -> str:
        shown = ", ".join(f"{d or 'ai.onnx'}:{o}-{v}" for d, o, v in self.ops())
        return f"CustomOps({shown})"


_USER = CustomOps()                      # global user kernels (onnx_mini.kernel)


def user_kernel(op_type: str, since, domain: str = "", *, multi_output: bool | None = None,
                override: bool = False):
    """onnx_mini.kernel: register a user kernel factory globally (every model prepared afterwards sees
    it). Same rules as CustomOps.kernel; the built-in kernels themselves are never modified."""
    return _USER.kernel(op_type, since, domain, multi_output=multi_output, override=override)


def global_custom_ops() -> CustomOps:
    return _USER


def overrides_builtin(custom_ops: CustomOps | None) -> bool:
    """Whether a user kernel in force (custom_ops or the global ones) replaces a built-in operator
    (the graph optimiser rewrites built-in operators by their known semantics, so it must not run)."""
    return any(builtin_kind(d, o) for user in (custom_ops, _USER) if user is not None for d, o, _ in user.ops())


def as_custom_ops(custom_ops) -> CustomOps | None:
    """custom_ops as given to prepare/InferenceSession (None, a CustomOps, or a list of them) -> one set."""
    if custom_ops is None:
        return None
    if isinstance(custom_ops, CustomOps):
        return custom_ops
    if isinstance(custom_ops, (list, tuple)) and all(isinstance(c, CustomOps) for c in custom_ops):
        return CustomOps(*custom_ops)
    raise TypeError(f"custom_ops must be a CustomOps or a list of them, got {type(custom_ops).__name__}")


_active: contextvars.ContextVar[CustomOps | None] = contextvars.ContextVar("onnx_mini_custom_ops", default=None)


def active_custom_ops() -> CustomOps | None:
    """The per-model kernel set planning runs with (None outside a custom_ops model)."""
    return _active.get()


@contextlib.contextmanager
def using_custom_ops(custom_ops: CustomOps | None):
    """Resolution inside the block consults custom_ops first (per-model kernels while planning)."""
    token = _active.set(custom_ops)
    try:
        yield
    finally:
        _active.reset(token)
