"""Check the values given to run() against the graph's declared inputs and place them in slots.

Tensors must have the declared element type and rank, and the declared fixed dimensions. Inputs are
stored as read-only views so that no kernel can ever write into a caller's array.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from . import dtypes
from .errors import InputError
from .graph import TypeInfo
from .plan import InputSpec, Plan


def bind_inputs(plan: Plan, feeds) -> list[Any]:
    """A fresh slot list for one run, holding the validated inputs."""
    slots = plan.template.copy()
    for spec, value in _match(plan, feeds):
        slots[spec.slot] = check_value(spec.name, spec.type, value)
    return slots


def _match(plan: Plan, feeds) -> list[tuple[InputSpec, Any]]:
    if isinstance(feeds, dict):
        by_name = {i.name: i for i in plan.inputs}
        unknown = [k for k in feeds if k not in by_name]
        if unknown:
            raise InputError(f"unknown input name(s) {', '.join(map(repr, unknown))}; the model's inputs are "
                             f"{', '.join(repr(i.name) for i in plan.inputs) or 'none'}")
        missing = [i.name for i in plan.required_inputs if i.name not in feeds]
        if missing:
            raise InputError(f"missing input(s) {', '.join(map(repr, missing))}")
        return [(by_name[k], v) for k, v in feeds.items()]
    if isinstance(feeds, np.ndarray):
        feeds = [feeds]
    if not isinstance(feeds, (list, tuple)):
        raise InputError(f"inputs must be a list, a tuple or a dict of name -> value, not {type(feeds).__name__}")
    required = plan.required_inputs
    # Positional values fill the inputs without an initializer; exactly one value per graph input
    # (initializer-backed ones included) is also accepted, in graph order.
    targets = plan.inputs if len(feeds) == len(plan.inputs) and len(feeds) > len(required) else required
    if len(feeds) != len(targets):
        raise InputError(f"expected {len(required)} positional input(s) "
                         f"({', '.join(repr(i.name) for i in required) or 'none'}), got {len(feeds)}")
    return list(zip(targets, feeds))


def check_value(name: str, t: TypeInfo | None, value: Any) -> Any:
    if t is None:
        return _readonly(value) if isinstance(value, np.ndarray) else value
    if t.kind == "tensor":
        return _check_tensor(name, t, value)
    if t.kind == "sequence":
        if not isinstance(value, (list, tuple)):
            raise InputError(f"input {name!r}: expected a sequence (list), got {type(value).__name__}")
        return [check_value(f"{name}[{i}]", t.inner, v) for i, v in enumerate(value)]
    if t.kind == "optional":
        return None if value is None else check_value(name, t.inner, value)
    if t.kind == "map":
        if not isinstance(value, dict):
            raise InputError(f"input {name!r}: expected a map (dict), got {type(value).__name__}")
        return value
    return value


def _check_tensor(name: str, t: TypeInfo, value: Any) -> np.ndarray:
    want = dtypes.NP_DTYPE.get(t.elem_type) if t.elem_type else None
    if not isinstance(value, np.ndarray):
        try:
            value = np.asarray(value, dtype=want)
        except (TypeError, ValueError) as e:
            raise InputError(f"input {name!r}: cannot make a {dtypes.type_name(t.elem_type)} tensor "
                             f"from {type(value).__name__}: {e}") from None
    if want is not None and value.dtype != want:
        if want == object and value.dtype.kind in "US":
            value = value.astype(object)
        else:
            raise InputError(f"input {name!r}: expected element type {dtypes.type_name(t.elem_type)} "
                             f"({want}), got {value.dtype}")
    if t.shape is not None:
        if value.ndim != len(t.shape):
            raise InputError(f"input {name!r}: expected rank {len(t.shape)} (shape {_shape(t.shape)}), "
                             f"got shape {list(value.shape)}")
        for axis, (d, n) in enumerate(zip(t.shape, value.shape)):
            if isinstance(d, int) and d != n:
                raise InputError(f"input {name!r}: dimension {axis} must be {d} (shape {_shape(t.shape)}), "
                                 f"got shape {list(value.shape)}")
    return _readonly(value)


def _readonly(a: np.ndarray) -> np.ndarray:
    v = a.view()
    v.flags.writeable = False
    return v


def _shape(shape: tuple) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
