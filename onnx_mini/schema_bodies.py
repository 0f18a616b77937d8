"""Schema function bodies: onnx's FunctionProto of an operator parsed once into a Function, and the
bodies onnx builds for given input types (type-dependent bodies). This is the one place after the
loader that speaks protobuf: onnx's builder takes a NodeProto and TypeProtos."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
import onnx.defs

from . import dtypes
from .graph import AttrRef, Function, Graph, Node, TypeInfo, normalize_domain
from .loader import parse_attribute, parse_function
from .registry import _schema


def parsed_body(schema, body: bytes) -> Function:
    fn = parse_function(onnx.FunctionProto.FromString(body))
    # A caller that leaves an attribute out gets the schema's default, which the body's
    # FunctionProto does not carry (e.g. MeanVarianceNormalization's axes [0, 2, 3]).
    defaults = {name: parse_attribute(a.default_value) for name, a in schema.attributes.items()
                if a.default_value.type}
    return replace(fn, attributes={**fn.attributes, **{k: v for k, v in defaults.items()
                                                       if fn.attributes.get(k) is None}})


def typed_body_opset(schema, opset: int) -> int | None:
    """The newest opset (not above the model's) for which the schema builds a type-dependent body."""
    versions = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
    return max(versions) if versions else None


def typed_function_body(node: Node, opset: int, input_types: list[TypeInfo | None]) -> Function:
    """The schema function body onnx builds for this node and these input types (None for an omitted
    input), as a Function. Only for a Resolution with typed_function=True. ValueError if onnx cannot
    build one (e.g. an input type it does not accept)."""
    domain = normalize_domain(node.domain)
    schema = _schema(node.op_type, domain, opset)
    proto = onnx.NodeProto(name=node.name, op_type=node.op_type, domain=node.domain, input=node.inputs,
                           output=node.outputs)
    proto.attribute.extend(_attribute_proto(k, v) for k, v in node.attrs.items())
    types = [(_type_proto(t) if t is not None else onnx.TypeProto()).SerializeToString() for t in input_types]
    body = schema.get_context_dependent_function_with_opset_version(typed_body_opset(schema, opset),
                                                                      proto.SerializeToString(), types)
    if not body or not onnx.FunctionProto.FromString(body).node:
        shown = ", ".join(_type_text(t) for t in input_types)
        raise ValueError(f"onnx builds no function body of {node.op_type} for input types ({shown})")
    return parsed_body(schema, body)


# -- back to protobuf, only to ask onnx for a type-dependent function body -------------------------

def _type_text(t: TypeInfo | None) -> str:
    if t is None:
        return "omitted"
    if t.kind in ("tensor", "sparse_tensor"):
        return f"{t.kind}({dtypes.type_name(t.elem_type) if t.elem_type else '?'})"
    return f"{t.kind}({_type_text(t.inner)})"


def _type_proto(t: TypeInfo) -> onnx.TypeProto:
    h = onnx.helper
    if t.kind in ("tensor", "sparse_tensor"):
        make = h.make_tensor_type_proto if t.kind == "tensor" else h.make_sparse_tensor_type_proto
        return make(t.elem_type, None if t.shape is None else list(t.shape))
    inner = _type_proto(t.inner) if t.inner is not None else onnx.TypeProto()
    if t.kind == "sequence":
        return h.make_sequence_type_proto(inner)
    if t.kind == "optional":
        return h.make_optional_type_proto(inner)
    return h.make_map_type_proto(t.key_type, inner)


def _attribute_proto(name: str, v) -> onnx.AttributeProto:
    A, h = onnx.AttributeProto, onnx.helper
    if isinstance(v, AttrRef):
        raise ValueError(f"attribute {name!r} still refers to the calling function's {v.name!r}")
    if isinstance(v, Graph):
        return h.make_attribute(name, _graph_proto(v))
    if isinstance(v, TypeInfo):
        return h.make_attribute(name, _type_proto(v))
    if isinstance(v, np.ndarray):
        return h.make_attribute(name, dtypes.array_to_tensor(v))
    if isinstance(v, list):
        if not v:
            return h.make_attribute(name, [], attr_type=A.INTS)
        if isinstance(v[0], Graph):
            return h.make_attribute(name, [_graph_proto(g) for g in v])
        if isinstance(v[0], TypeInfo):
            return h.make_attribute(name, [_type_proto(t) for t in v])
        if isinstance(v[0], np.ndarray):
            return h.make_attribute(name, [dtypes.array_to_tensor(x) for x in v])
    return h.make_attribute(name, v)


def _graph_proto(g: Graph) -> onnx.GraphProto:
    def vi(v):
        p = onnx.ValueInfoProto(name=v.name)
        if v.type is not None:
            p.type.CopyFrom(_type_proto(v.type))
        return p

    nodes = []
    for n in g.nodes:
        p = onnx.NodeProto(name=n.name, op_type=n.op_type, domain=n.domain, input=n.inputs, output=n.outputs)
        p.attribute.extend(_attribute_proto(k, v) for k, v in n.attrs.items())
        nodes.append(p)
    return onnx.GraphProto(name=g.name, node=nodes, input=[vi(v) for v in g.inputs],
                           output=[vi(v) for v in g.outputs], value_info=[vi(v) for v in g.value_info.values()],
                           initializer=[dtypes.array_to_tensor(a, k) for k, a in g.initializers.items()])
