"""Parse a model once into plain Python objects (graph.py); nothing after this touches protobuf.

Accepts a ModelProto, a path, bytes or a binary file object. External data is read only from files
inside the model's folder: absolute locations, `..` escapes and symlinks leading out are rejected.
The caller's ModelProto is only read, never modified.
"""
from __future__ import annotations

import io
import os
from typing import Any

import numpy as np
import onnx
from onnx import AttributeProto, ModelProto, TensorProto

from . import dtypes
from .errors import ExternalDataError, ModelLoadError
from .graph import AttrRef, Function, Graph, Model, Node, TypeInfo, ValueInfo, free_names, normalize_domain

MIN_IR_VERSION, MAX_IR_VERSION = 3, 14


def load(model, base_dir: str | None = None) -> Model:
    """Load `model` (ModelProto | path | bytes | binary file) into a Model."""
    proto, found_dir = read_proto(model)
    return from_proto(proto, base_dir if base_dir is not None else found_dir)


def read_proto(model) -> tuple[ModelProto, str | None]:
    """The ModelProto and the folder external data is relative to (None if unknown)."""
    if isinstance(model, ModelProto):
        return model, None
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise ModelLoadError(f"cannot read model file {path!r}: {e}") from e
        return _parse(data, path), os.path.dirname(os.path.abspath(path))
    if isinstance(model, (bytes, bytearray, memoryview)):
        return _parse(bytes(model), "<bytes>"), None
    if isinstance(model, io.IOBase) or hasattr(model, "read"):
        name = getattr(model, "name", None)
        data = model.read()
        base = os.path.dirname(os.path.abspath(name)) if isinstance(name, str) and os.path.exists(name) else None
        return _parse(data, name or "<file>"), base
    raise ModelLoadError(f"cannot load a model from {type(model).__name__}; "
                         "give a ModelProto, a path, bytes or a binary file object")


def _parse(data: bytes, where: str) -> ModelProto:
    proto = ModelProto()
    try:
        proto.ParseFromString(data)
    except Exception as e:  # protobuf raises its own DecodeError types
        raise ModelLoadError(f"{where} is not a valid ONNX model: {e}") from e
    return proto


def from_proto(proto: ModelProto, base_dir: str | None = None) -> Model:
    ir = proto.ir_version
    if not MIN_IR_VERSION <= ir <= MAX_IR_VERSION:
        raise ModelLoadError(f"IR version {ir} is not supported (supported: {MIN_IR_VERSION}..{MAX_IR_VERSION})")
    if not proto.HasField("graph"):
        raise ModelLoadError("the model has no graph")
    opsets = _opsets(proto.opset_import)
    ctx = _Context(base_dir)
    functions = {}
    for fp in proto.functions:
        f = parse_function(fp, ctx)
        functions[(f.domain, f.name)] = f
    return Model(graph=ctx.graph(proto.graph), opsets=opsets, ir_version=ir, functions=functions)


def _opsets(imports) -> dict[str, int]:
    opsets: dict[str, int] = {}
    for o in imports:
        opsets[normalize_domain(o.domain)] = o.version
    # IR 3 models always carry opset_import; be lenient with hand-made ones that forgot it.
    if not opsets:
        opsets[""] = 1
    return opsets


def parse_node(node: onnx.NodeProto, base_dir: str | None = None) -> Node:
    """One NodeProto as a Node (used by run_node)."""
    return _Context(base_dir).node(node, 0)


def parse_attribute(a: AttributeProto) -> Any:
    """One AttributeProto's value (e.g. a schema's default_value)."""
    return _Context(None).attr(a)


def parse_function(fp: onnx.FunctionProto, ctx: "_Context | None" = None) -> Function:
    ctx = ctx or _Context(None)
    attributes: dict[str, Any] = {a: None for a in fp.attribute}
    for a in fp.attribute_proto:
        attributes[a.name] = ctx.attr(a)
    return Function(
        name=fp.name, domain=normalize_domain(fp.domain), inputs=tuple(fp.input), outputs=tuple(fp.output),
        attributes=attributes, nodes=[ctx.node(n, i) for i, n in enumerate(fp.node)],
        opsets=_opsets(fp.opset_import))


class _Context:
    """Parsing state shared by a model and its subgraphs: the external data folder."""

    def __init__(self, base_dir: str | None):
        self.base_dir = base_dir

    # -- graphs and nodes ---------------------------------------------------------------------
    def graph(self, g: onnx.GraphProto) -> Graph:
        inits: dict[str, np.ndarray] = {}
        for t in g.initializer:
            inits[t.name] = self.tensor(t)
        for st in g.sparse_initializer:
            inits[st.values.name] = self.sparse(st)
        for arr in inits.values():
            arr.flags.writeable = False  # shared by every run: kernels must never write into them
        return Graph(
            name=g.name,
            nodes=[self.node(n, i) for i, n in enumerate(g.node)],
            inputs=[value_info(v) for v in g.input],
            outputs=[value_info(v) for v in g.output],
            initializers=inits,
            value_info={v.name: value_info(v) for v in g.value_info},
        )

    def node(self, n: onnx.NodeProto, index: int) -> Node:
        attrs = {}
        for a in n.attribute:
            try:
                attrs[a.name] = self.attr(a)
            except ModelLoadError as e:
                raise ModelLoadError(f"node {n.name!r} ({n.op_type}): attribute {a.name!r}: {e}") from e
        captures: dict[str, None] = {}
        for v in attrs.values():
            for g in (v if isinstance(v, list) else [v]):
                if isinstance(g, Graph):
                    captures.update(dict.fromkeys(free_names(g)))
        return Node(name=n.name, op_type=n.op_type, domain=normalize_domain(n.domain), inputs=tuple(n.input),
                    outputs=tuple(n.output), attrs=attrs, index=index, captures=tuple(captures))

    def attr(self, a: AttributeProto) -> Any:
        if a.ref_attr_name:
            return AttrRef(a.ref_attr_name)
        t = a.type or _guess_attr_type(a)
        A = AttributeProto
        if t == A.FLOAT:
            return a.f
        if t == A.INT:
            return a.i
        if t == A.STRING:
            return dtypes.decode_text(a.s)
        if t == A.TENSOR:
            return self.tensor(a.t)
        if t == A.GRAPH:
            return self.graph(a.g)
        if t == A.SPARSE_TENSOR:
            return self.sparse(a.sparse_tensor)
        if t == A.TYPE_PROTO:
            return type_info(a.tp)
        if t == A.FLOATS:
            return list(a.floats)
        if t == A.INTS:
            return list(a.ints)
        if t == A.STRINGS:
            return [dtypes.decode_text(s) for s in a.strings]
        if t == A.TENSORS:
            return [self.tensor(x) for x in a.tensors]
        if t == A.GRAPHS:
            return [self.graph(x) for x in a.graphs]
        if t == A.SPARSE_TENSORS:
            return [self.sparse(x) for x in a.sparse_tensors]
        if t == A.TYPE_PROTOS:
            return [type_info(x) for x in a.type_protos]
        raise ModelLoadError(f"unknown attribute type {t}")

    # -- tensors ------------------------------------------------------------------------------
    def tensor(self, t: TensorProto) -> np.ndarray:
        raw = self.external_bytes(t) if t.data_location == TensorProto.EXTERNAL else None
        return dtypes.tensor_to_array(t, raw)

    def sparse(self, st: onnx.SparseTensorProto) -> np.ndarray:
        values = self.tensor(st.values)
        indices = self.tensor(st.indices).astype(np.int64)
        shape = tuple(st.dims)
        dense = np.zeros(shape, dtype=values.dtype)
        if values.dtype == object:
            dense[...] = ""
        if values.size:
            if indices.ndim == 1:  # linearized indices
                dense.reshape(-1)[indices] = values.reshape(-1)
            elif indices.ndim == 2 and indices.shape[1] == len(shape):
                dense[tuple(indices.T)] = values.reshape(-1)
            else:
                raise ModelLoadError(f"sparse tensor {st.values.name!r}: indices of shape {indices.shape} "
                                     f"do not fit dense shape {list(shape)}")
        return dense

    def external_bytes(self, t: TensorProto) -> bytes:
        info = {e.key: e.value for e in t.external_data}
        location = info.get("location")
        if not location:
            raise ExternalDataError(f"tensor {t.name!r}: external data without a location")
        path = safe_external_path(self.base_dir, location, t.name)
        try:
            offset = int(info.get("offset", 0))
            length = int(info["length"]) if "length" in info else None
        except ValueError:
            raise ExternalDataError(f"tensor {t.name!r}: bad offset/length {info}") from None
        if offset < 0 or (length is not None and length < 0):
            raise ExternalDataError(f"tensor {t.name!r}: negative offset/length {info}")
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read() if length is None else f.read(length)
        except OSError as e:
            raise ExternalDataError(f"tensor {t.name!r}: cannot read external data {location!r}: {e}") from e
        if length is not None and len(data) != length:
            raise ExternalDataError(f"tensor {t.name!r}: external file {location!r} holds {len(data)} bytes "
                                    f"at offset {offset}, {length} expected")
        return data


def safe_external_path(base_dir: str | None, location: str, name: str = "") -> str:
    """The real path of an external data file, guaranteed to be inside base_dir."""
    if base_dir is None:
        raise ExternalDataError(f"tensor {name!r} uses external data {location!r} but the model's folder is "
                                "unknown: load it from a path or pass base_dir")
    if os.path.isabs(location) or location.startswith(("/", "\\")) or ":" in location.split("/")[0]:
        raise ExternalDataError(f"tensor {name!r}: external data location {location!r} is absolute; "
                                "only paths inside the model's folder are allowed")
    parts = location.replace("\\", "/").split("/")
    if ".." in parts:
        raise ExternalDataError(f"tensor {name!r}: external data location {location!r} leaves the model's folder")
    root = os.path.realpath(base_dir)
    path = os.path.realpath(os.path.join(root, *parts))
    if os.path.commonpath([root, path]) != root:  # a symlink that points outside
        raise ExternalDataError(f"tensor {name!r}: external data location {location!r} resolves outside "
                                "the model's folder")
    return path


# -- types --------------------------------------------------------------------------------------

def value_info(v: onnx.ValueInfoProto) -> ValueInfo:
    return ValueInfo(v.name, type_info(v.type) if v.HasField("type") else None)


def type_info(tp: onnx.TypeProto) -> TypeInfo | None:
    which = tp.WhichOneof("value")
    if which in ("tensor_type", "sparse_tensor_type"):
        tt = getattr(tp, which)
        shape = None
        if tt.HasField("shape"):
            shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim)
        return TypeInfo("tensor" if which == "tensor_type" else "sparse_tensor", tt.elem_type, shape)
    if which == "sequence_type":
        return TypeInfo("sequence", inner=type_info(tp.sequence_type.elem_type))
    if which == "optional_type":
        return TypeInfo("optional", inner=type_info(tp.optional_type.elem_type))
    if which == "map_type":
        return TypeInfo("map", key_type=tp.map_type.key_type, inner=type_info(tp.map_type.value_type))
    return None


def _guess_attr_type(a: AttributeProto) -> int:
    """Very old models leave AttributeProto.type unset; infer it from the field that is filled."""
    A = AttributeProto
    for fld, t in (("floats", A.FLOATS), ("ints", A.INTS), ("strings", A.STRINGS), ("tensors", A.TENSORS),
                   ("graphs", A.GRAPHS)):
        if len(getattr(a, fld)):
            return t
    for fld, t in (("f", A.FLOAT), ("i", A.INT), ("s", A.STRING), ("t", A.TENSOR), ("g", A.GRAPH)):
        if a.HasField(fld):
            return t
    raise ModelLoadError(f"attribute {a.name!r} has no type and no value")
