"""Check the values given to run() against the graph's declared inputs and place them in slots,
and hand the graph's outputs back to the caller.

Values that are not tensors: a sequence is a Python list of values (a tuple is accepted), an optional
is None (empty) or its value, a map is a dict. Tensors must have the declared element type and rank,
and the declared fixed dimensions; sequences and optionals are checked element by element against
their declared element type, maps key by key and value by value (stored as a fresh MapValue).
Inputs are stored as read-only views so that no kernel can ever write into a caller's array.
"""
from __future__ import annotations

import operator
from typing import Any

import numpy as np

from . import dtypes
from .errors import InputError
from .graph import TypeInfo
from .plan import InputSpec, Plan


def bind_inputs(plan: Plan, feeds) -> list[Any]:
    """A fresh slot list for one run, holding the validated inputs."""
    binder = plan.binder
    if binder is None or binder.inputs is not plan.inputs:
        binder = plan.binder = _Binder(plan)     # two threads may both make it: equal, either kept
    slots = plan.template.copy()
    # the usual call, checked at a few hundred ns: a dict naming exactly the required inputs, or one
    # positional value per required input, every tensor already of its declared dtype and shape
    # (a bare array is one positional value); a value failing its check is checked again below, so
    # that a call with several faults reports the one the general matching reports first
    try:
        if feeds.__class__ is dict:
            if len(feeds) == len(binder.required):
                checks = binder.by_name
                for name, value in feeds.items():
                    check = checks.get(name)
                    if check is None:
                        break
                    slots[check[0]] = check[1](value)
                else:
                    return slots
        elif feeds.__class__ is list or feeds.__class__ is tuple or feeds.__class__ is np.ndarray:
            if feeds.__class__ is np.ndarray:
                feeds = [feeds]
            if len(feeds) == len(binder.required):     # _match's targets are then the required inputs
                for (slot, check), value in zip(binder.required, feeds):
                    slots[slot] = check(value)
                return slots
    except InputError:
        pass
    # anything else (unknown or missing names, optional inputs left out, initializer overrides):
    # the general matching, with its errors
    slots = plan.template.copy()
    for spec, value in _match(plan, feeds):
        slots[spec.slot] = check_value(spec.name, spec.type, value)
    return slots


class _Binder:
    """A plan's inputs prepared for bind_inputs's usual call: (slot, check(value)) per required input,
    in graph order and by name. A check accepts what check_value accepts and returns the same value."""
    __slots__ = ("inputs", "required", "by_name")

    def __init__(self, plan: Plan):
        self.inputs = plan.inputs
        self.required = [(spec.slot, _checker(spec)) for spec in plan.required_inputs]
        self.by_name = {spec.name: entry for spec, entry in zip(plan.required_inputs, self.required)}


def _checker(spec: InputSpec):
    """check(value) for one input: a tensor of the declared dtype and fixed dims passes in a few
    attribute reads; any other value goes through check_value (conversions, errors)."""
    name, t = spec.name, spec.type
    if t is None or t.kind != "tensor" or not t.elem_type or t.shape is None:
        return lambda value: check_value(name, t, value)
    want = dtypes.NP_DTYPE.get(t.elem_type)
    if want is None:
        return lambda value: check_value(name, t, value)
    rank = len(t.shape)
    fixed = [(axis, d) for axis, d in enumerate(t.shape) if isinstance(d, int)]
    # itemgetter of one axis gives the dim itself, of several a tuple
    dims_of = operator.itemgetter(*(a for a, _ in fixed)) if fixed else None
    dims = (fixed[0][1] if len(fixed) == 1 else tuple(d for _, d in fixed)) if fixed else None
    strings = want == object

    if len(fixed) == rank and not strings:
        # every dim fixed (a state, a scalar): one tuple comparison checks rank and dims (~0.15 us less)
        shape = tuple(t.shape)

        def check(value):
            if value.__class__ is np.ndarray and value.dtype == want and value.shape == shape:
                v = value.view()
                v.setflags(False)          # positional: ~0.1 us less than write=False (numpy 2.4)
                return v
            return _check_tensor(name, t, value)
        return check

    # (a single text, a text classifier's usual input, is read by item(): ~0.2 us less than the set)
    def check(value):
        if (value.__class__ is np.ndarray and value.dtype == want and value.ndim == rank
                and (dims_of is None or dims_of(value.shape) == dims)
                and (not strings or (value.item().__class__ is str if value.size == 1
                                     else set(map(type, value.flat)) <= _STR))):
            v = value.view()
            v.setflags(False)
            return v
        return _check_tensor(name, t, value)
    return check


_STR = {str}


def _match(plan: Plan, feeds) -> list[tuple[InputSpec, Any]]:
    if isinstance(feeds, dict):
        by_name = plan.input_by_name
        unknown = [k for k in feeds if k not in by_name]
        if unknown:
            raise InputError(f"unknown input name(s) {', '.join(map(repr, unknown))}; the model's inputs are "
                             f"{', '.join(repr(i.name) for i in plan.inputs) or 'none'}")
        # an optional-typed input left out of the dict is an empty optional (its slot already holds None)
        missing = [i.name for i in plan.required_inputs
                   if i.name not in feeds and (i.type is None or i.type.kind != "optional")]
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
        hint = ""
        if any(i.type is not None and i.type.kind in ("sequence", "optional") for i in required):
            hint = ("; a sequence input is one list inside the list of inputs (run([[t1, t2], ...])) "
                    "or a dict entry (run({name: [t1, t2]}))")
        raise InputError(f"expected {len(required)} positional input(s) "
                         f"({', '.join(repr(i.name) for i in required) or 'none'}), got {len(feeds)}{hint}")
    return list(zip(targets, feeds))


def check_value(name: str, t: TypeInfo | None, value: Any) -> Any:
    """The value run() stores for input `name` of declared type t (None: undeclared, taken as given)."""
    if t is None:
        if isinstance(value, np.ndarray):
            return _readonly(value)
        if isinstance(value, (list, tuple)):
            # undeclared (run_node): a list holding arrays, or an empty one, is a sequence; nested lists
            # of numbers are a tensor
            if not value or any(isinstance(v, np.ndarray) for v in value):
                return [check_value(f"{name}[{i}]", None, v) for i, v in enumerate(value)]
            return _readonly(np.asarray(value))
        return value
    if t.kind == "tensor":
        return _check_tensor(name, t, value)
    if t.kind == "sequence":
        if not isinstance(value, (list, tuple)):
            raise InputError(f"input {name!r}: expected a sequence ({type_string(t)}) given as a list, "
                             f"got {_kind_of(value)}")
        return [check_value(f"{name}[{i}]", t.inner, v) for i, v in enumerate(value)]
    if t.kind == "optional":
        return None if value is None else check_value(name, t.inner, value)
    if t.kind == "map":
        return _check_map(name, t, value)
    return value


class MapValue(dict):
    """A map input after its check: a fresh dict whose keys are Python ints or strs and whose values
    are Python scalars of the declared value type (or checked values of a non-tensor value type).
    key_dtype / value_dtype are the declared element types (numpy dtypes; value_dtype None when the
    values are not tensors), so that a kernel knows them even for an empty map."""
    __slots__ = ("key_dtype", "value_dtype")


def _check_map(name: str, t: TypeInfo, value: Any) -> MapValue:
    if not isinstance(value, dict):
        raise InputError(f"input {name!r}: expected a map ({type_string(t)}) given as a dict, "
                         f"got {_kind_of(value)}")
    inner = t.inner
    scalar_values = inner is None or inner.kind == "tensor"
    out = MapValue()
    out.key_dtype = dtypes.NP_DTYPE.get(t.key_type)
    out.value_dtype = dtypes.NP_DTYPE.get(inner.elem_type) if scalar_values and inner is not None else None
    for k, v in value.items():
        key = _map_scalar(name, t, "key", t.key_type, k)
        out[key] = (_map_scalar(name, t, f"value of key {key!r}", inner.elem_type if inner else 0, v)
                    if scalar_values else check_value(f"{name}[{key!r}]", inner, v))
    return out


def _map_scalar(name: str, t: TypeInfo, what: str, elem: int, x: Any):
    """A map key or value as a Python scalar of element type `elem` (0: unknown, taken as given)."""
    dt = dtypes.NP_DTYPE.get(elem)
    if dt is None:
        return x
    if isinstance(x, np.ndarray) and x.ndim == 0:
        x = x[()]
    ok = False
    if dt == object:
        ok = isinstance(x, str)
        x = str(x) if ok else x
    elif isinstance(x, (bool, np.bool_)) or dt == np.bool_:
        ok = dt == np.bool_ and isinstance(x, (bool, np.bool_))
    elif dt.kind in "iu":
        if isinstance(x, (int, np.integer)):
            info = np.iinfo(dt)
            if not info.min <= x <= info.max:
                raise InputError(f"input {name!r}: map {what} {int(x)} is out of the range of "
                                 f"{dtypes.type_name(elem)} (declared {type_string(t)})")
            ok, x = True, int(x)
    elif dt.kind == "c":
        ok = isinstance(x, (int, float, complex, np.number))
        x = complex(x) if ok else x
    else:                      # float, double and the ml_dtypes floats
        ok = isinstance(x, (int, float, np.integer, np.floating))
        x = float(x) if ok else x
    if not ok:
        raise InputError(f"input {name!r}: map {what} {x!r} ({type(x).__name__}) is not a "
                         f"{dtypes.type_name(elem)} (declared {type_string(t)})")
    return x


def _check_tensor(name: str, t: TypeInfo, value: Any) -> np.ndarray:
    want = dtypes.NP_DTYPE.get(t.elem_type) if t.elem_type else None
    if value is None:
        raise InputError(f"input {name!r}: expected a tensor ({type_string(t)}), got None "
                         "(only an optional-typed input may be None)")
    if isinstance(value, dict) or (isinstance(value, (list, tuple)) and
                                   any(isinstance(v, np.ndarray) for v in value)):
        # nested Python lists of numbers are a tensor; a list of arrays is a sequence
        raise InputError(f"input {name!r}: expected a tensor ({type_string(t)}), got {_kind_of(value)}")
    if not isinstance(value, np.ndarray):
        try:
            value = np.asarray(value, dtype=want)
        except (TypeError, ValueError) as e:
            raise InputError(f"input {name!r}: cannot make a {dtypes.type_name(t.elem_type)} tensor "
                             f"from {type(value).__name__}: {e}") from None
    if want is not None and value.dtype != want:
        if want == object and value.dtype.kind in "US":
            value = _as_strings(value)
        else:
            raise InputError(f"input {name!r}: expected element type {dtypes.type_name(t.elem_type)} "
                             f"({want}), got {value.dtype}")
    elif want == object and not set(map(type, value.flat)) <= {str}:   # map/set: one C-level pass
        value = _as_strings(value)
    if t.shape is not None:
        if value.ndim != len(t.shape):
            raise InputError(f"input {name!r}: expected rank {len(t.shape)} (shape {_shape(t.shape)}), "
                             f"got shape {list(value.shape)}")
        for axis, (d, n) in enumerate(zip(t.shape, value.shape)):
            if isinstance(d, int) and d != n:
                raise InputError(f"input {name!r}: dimension {axis} must be {d} (shape {_shape(t.shape)}), "
                                 f"got shape {list(value.shape)}")
    return _readonly(value)


def _string(x: Any):
    """One element of a string tensor as onnxruntime takes it: str(x) (nan -> 'nan', 5 -> '5', None ->
    'None'); bytes are decoded as ONNX strings are (UTF-8; kept as bytes when not), where onnxruntime
    would store "b'...'", a string no model compares against."""
    if x.__class__ is str:
        return x
    if isinstance(x, (bytes, np.bytes_)):
        return dtypes.decode_text(bytes(x))
    return str(x)


_strings = np.frompyfunc(_string, 1, 1)


def _as_strings(value: np.ndarray) -> np.ndarray:
    """A new object array of `value`'s elements as strings (the caller's array is left as it is)."""
    return np.asarray(_strings(value), dtype=object).reshape(value.shape)


def _kind_of(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"a tensor {value.dtype}{list(value.shape)}"
    if isinstance(value, (list, tuple)):
        return f"a sequence ({type(value).__name__} of {len(value)} value(s))"
    if isinstance(value, dict):
        return "a map (dict)"
    if value is None:
        return "None"
    return type(value).__name__


def type_string(t: TypeInfo | None) -> str:
    """A declared type as onnxruntime spells it: tensor(float), seq(tensor(int64)), optional(...)."""
    if t is None:
        return "unknown"
    if t.kind in ("tensor", "sparse_tensor"):
        return f"{t.kind}({dtypes.type_name(t.elem_type)})"
    if t.kind == "map":
        return f"map({dtypes.type_name(t.key_type)},{type_string(t.inner)})"
    if t.kind == "sequence":
        return f"seq({type_string(t.inner)})"
    return f"{t.kind}({type_string(t.inner)})"


def export_outputs(values: list) -> list:
    """Outputs as the caller receives them: tensors as they are (read-only when shared), sequences as
    fresh lists and maps as fresh plain dicts (either may be a constant of the plan, shared by every
    run; a sequence of maps such as ZipMap's is a list of dicts), optionals as None or their value."""
    for v in values:
        if v.__class__ is not np.ndarray:
            break
    else:           # tensors only (the usual run): `values` as it is, a fresh list (~0.3 us less)
        return values
    return [_export(v) if v.__class__ is list else dict(v) if isinstance(v, dict) else v for v in values]


def _export(v: list) -> list:
    return [_export(x) if x.__class__ is list else dict(x) if isinstance(x, dict) else x for x in v]


def _readonly(a: np.ndarray) -> np.ndarray:
    v = a.view()
    v.setflags(False)     # write=False by position: ~0.4 us less than through v.flags, 0.1 than by keyword
    return v


def _shape(shape: tuple) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
