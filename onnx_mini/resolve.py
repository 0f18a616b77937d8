"""Resolution, done once per node at prepare time: (domain, op_type, the model's opset) -> the kernel
of the schema version in force, or the schema's function body to inline; and the checks of a node's
inputs, outputs and attribute types against that schema version."""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import onnx.defs

from .catalog import load_all_ops
from .custom_ops import active_custom_ops, global_custom_ops
from .graph import AttrRef, Function, Graph, Node, TypeInfo, normalize_domain
from .registry import kernels, KernelSpec, _schema
from .schema_bodies import parsed_body, typed_body_opset


@dataclass(frozen=True)
class Resolution:
    """What runs a node: a kernel, or a function body to inline. version is the schema's since_version."""
    version: int | None
    kernel: KernelSpec | None = None
    function: Function | None = None
    problem: str = ""              # why neither exists (empty when resolved)
    typed_function: bool = False   # no kernel, but the schema builds a body for given input types
                                   # (typed_function_body); `problem` says so for when they are unknown


@functools.lru_cache(maxsize=None)
def _arity(op_type: str, domain: str, version: int):
    """(min inputs, max inputs, indices of required inputs (a trailing variadic one stands for all the
    positions from there on), min outputs, max outputs, formal input names), or None."""
    schema = _schema(op_type, domain, version)
    if schema is None or schema.since_version != version:
        return None
    option = onnx.defs.OpSchema.FormalParameterOption
    required = tuple(i for i, p in enumerate(schema.inputs) if p.option == option.Single)
    if schema.inputs and schema.inputs[-1].option == option.Variadic:   # every variadic input is required
        required += (len(schema.inputs) - 1,)
    names = tuple(p.name for p in schema.inputs)
    return schema.min_input, schema.max_input, required, schema.min_output, schema.max_output, names


def _attribute_kinds():
    A = onnx.defs.OpSchema.AttrType
    number, text = (int, float, np.integer, np.floating), (str, bytes)
    return {A.INT: (False, (int, np.integer)), A.FLOAT: (False, number), A.STRING: (False, text),
            A.TENSOR: (False, (np.ndarray,)), A.SPARSE_TENSOR: (False, (np.ndarray,)), A.GRAPH: (False, (Graph,)),
            A.TYPE_PROTO: (False, (TypeInfo, type(None))), A.INTS: (True, (int, np.integer)), A.FLOATS: (True, number),
            A.STRINGS: (True, text), A.TENSORS: (True, (np.ndarray,)), A.SPARSE_TENSORS: (True, (np.ndarray,)),
            A.GRAPHS: (True, (Graph,)), A.TYPE_PROTOS: (True, (TypeInfo, type(None)))}


@functools.lru_cache(maxsize=None)
def _attribute_types(op_type: str, domain: str, version: int) -> dict:
    schema = _schema(op_type, domain, version)
    if schema is None or schema.since_version != version:
        return {}
    kinds = _attribute_kinds()
    return {name: (a.type.name, *kinds[a.type]) for name, a in schema.attributes.items() if a.type in kinds}


def attribute_problem(node: Node, spec: KernelSpec) -> str:
    """Which of the node's attributes has a value of another type than its schema says, or ''."""
    types = _attribute_types(spec.op_type, spec.domain, spec.since)
    for name, value in node.attrs.items():
        if name not in types or isinstance(value, AttrRef):
            continue
        type_name, is_list, kinds = types[name]
        # a list is checked by its distinct element types: tree ensembles hold lists of thousands
        ok = (isinstance(value, list) and all(issubclass(t, kinds) for t in set(map(type, value)))
              if is_list else not isinstance(value, list) and isinstance(value, kinds))
        if not ok:
            shown = repr(value) if len(repr(value)) < 60 else type(value).__name__
            return f"attribute {name!r} must be of type {type_name}, got {shown}"
    return ""


def arity_problem(node: Node, spec: KernelSpec) -> str:
    """Why the node's inputs/outputs do not fit its schema (counts, a required input left empty), or ''."""
    arity = _arity(spec.op_type, spec.domain, spec.since)
    if arity is None:
        return ""
    lo, hi, required, out_lo, out_hi, names = arity
    n_in, n_out = len(node.inputs), len(node.outputs)
    if not lo <= n_in <= hi:
        absent = names[n_in:lo]
        return (f"{n_in} input(s) given, the operator takes {lo}" + (f" to {hi}" if hi != lo else "")
                + (f": it requires the input{'s' if len(absent) > 1 else ''} {', '.join(absent)}" if absent else ""))
    last = len(names) - 1
    missing = [i for i in range(n_in) if not node.inputs[i] and min(i, last) in required]
    if missing:
        return (f"required input(s) #{', #'.join(map(str, missing))} left empty "
                f"({', '.join(names[min(i, last)] for i in missing)})")
    if not out_lo <= n_out <= out_hi:
        return f"{n_out} output(s) given, the operator has {out_lo}" + (f" to {out_hi}" if out_hi != out_lo else "")
    return ""


def resolve(domain: str, op_type: str, opset: int | None) -> Resolution:
    """Resolve (domain, op_type) at the model's opset for that domain."""
    load_all_ops()
    domain = normalize_domain(domain)
    for user in (active_custom_ops(), global_custom_ops()):      # per-model kernels, then global user kernels
        spec = user.find(domain, op_type, opset) if user is not None else None
        if spec is not None:
            return Resolution(spec.since, kernel=spec)
    return _resolve(domain, op_type, opset)


@functools.lru_cache(maxsize=None)
def _resolve(domain: str, op_type: str, opset: int | None) -> Resolution:
    if opset is None:
        return Resolution(None, problem=f"the model imports no opset for domain {domain or 'ai.onnx'!r}")
    if onnx.defs.has(op_type, domain):
        schema = _schema(op_type, domain, opset)
        if schema is None:
            # onnxruntime's contrib schemas in the ai.onnx domain (LayerNormalization below opset 17):
            # a kernel registered for a version before onnx's first one
            return _registered(domain, op_type, opset) or Resolution(
                None, problem=f"{op_type} does not exist in opset {opset} of domain {domain or 'ai.onnx'!r}")
        version = schema.since_version
        spec = kernels().get((domain, op_type, version))
        if spec is not None:
            return Resolution(version, kernel=spec)
        if schema.has_function:
            body = schema.get_function_with_opset_version(opset)
            if body:
                return Resolution(version, function=parsed_body(schema, body))
        if schema.has_context_dependent_function and typed_body_opset(schema, opset) is not None:
            return Resolution(version, problem=f"no kernel for {op_type}-{version} (its function body depends on "
                                               "input types, which are not known here)", typed_function=True)
        return Resolution(version, problem=f"no kernel for {op_type}-{version}")
    # A domain onnx does not know (custom ops), or an operator onnx removed (ImageScaler)
    return _registered(domain, op_type, opset) or Resolution(
        None, problem=f"unknown operator {op_type} in domain {domain or 'ai.onnx'!r}")


def _registered(domain: str, op_type: str, opset: int) -> Resolution | None:
    """The newest built-in version not above the opset; None if there is none. An operator removed
    from the spec (its kernel's `until`) no longer exists from that opset on, as in onnxruntime."""
    table = kernels()
    versions = [v for (d, o, v) in table if d == domain and o == op_type and v <= opset]
    if not versions:
        return None
    spec = table[(domain, op_type, max(versions))]
    if spec.until is not None and opset >= spec.until:
        return Resolution(None, problem=f"{op_type} was removed from domain {domain or 'ai.onnx'!r} in opset "
                                        f"{spec.until}; the model imports opset {opset}")
    return Resolution(spec.since, kernel=spec)
