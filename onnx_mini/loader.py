"""Parse a model once into plain Python objects (graph.py); nothing after this touches protobuf.

Accepts a ModelProto, a path, bytes or a binary file object. External data is read only from regular
files inside the model's folder (the path's folder, or base_dir=): absolute locations, `..` escapes,
symlinks leading out, hard-linked files, FIFOs and devices are rejected, and offset/length are checked
against the file and the tensor's size before reading; large tensors are memory-mapped read-only
(initializers are read-only views of the bytes protobuf hands out, never of the caller's ModelProto).
Every failure is a ModelLoadError (ExternalDataError for external data). The caller's ModelProto is
only read, never modified.
"""
from __future__ import annotations

import io
import mmap
import os
import stat
import sys
import warnings
from typing import Any

import numpy as np
import onnx
from onnx import AttributeProto, ModelProto, TensorProto

from . import dtypes
from .errors import ExternalDataError, ModelLoadError, OnnxMiniError
from .graph import (AttrRef, Function, Graph, Model, ModelMetadata, Node, TypeInfo, ValueInfo, free_names,
                    normalize_domain)

MIN_IR_VERSION, MAX_IR_VERSION = 3, 14


def load(model, base_dir: str | None = None) -> Model:
    """Load `model` (ModelProto | path | bytes | binary file) into a Model.

    base_dir: the folder external data is read from; required when a model given as bytes, a
    ModelProto or an unnamed file object has external data (a path gives its own folder)."""
    proto, found_dir = read_proto(model)
    return from_proto(proto, base_dir if base_dir is not None else found_dir)


def read_proto(model) -> tuple[ModelProto, str | None]:
    """The ModelProto and the folder external data is relative to (None if unknown)."""
    if isinstance(model, ModelProto):
        return model, None
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        try:  # O_NONBLOCK: opening a FIFO must not wait for a writer
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
            with open(fd, "rb") as f:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise ModelLoadError(f"model file {path!r} is not a regular file")
                # read, not mapped: a map saved ~12 ms on a 15 MB BERT but a file truncated while
                # protobuf parses it would end the process with SIGBUS
                data = f.read()
        except (OSError, ValueError) as e:  # ValueError: a NUL in the path
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


def _parse(data, where: str) -> ModelProto:
    proto = ModelProto()
    try:
        proto.ParseFromString(data)
    except Exception as e:  # protobuf raises its own DecodeError types
        raise ModelLoadError(f"{where} is not a valid ONNX model: {e}") from e
    return proto


def from_proto(proto: ModelProto, base_dir: str | None = None) -> Model:
    """The Model of a parsed ModelProto (only read, never modified)."""
    try:
        return _from_proto(proto, base_dir)
    except OnnxMiniError:
        raise
    except RecursionError:
        raise ModelLoadError("the model nests subgraphs too deeply to load") from None
    except Exception as e:  # a malformed proto this loader did not foresee: still a load error
        raise ModelLoadError(f"malformed model: {type(e).__name__}: {e}") from e


def _from_proto(proto: ModelProto, base_dir: str | None) -> Model:
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
    graph = ctx.graph(proto.graph)
    local = set(functions)      # a function's own opset imports cover its body
    used = _domains(graph.nodes, local).union(*(_domains(f.nodes, local) - set(f.opsets) for f in functions.values()))
    return Model(graph=graph, opsets=_with_implied(opsets, used), ir_version=ir, functions=functions,
                 metadata=metadata(proto))


class MissingOpsetWarning(UserWarning):
    """A model uses a domain it imports no opset for, and onnx_mini assumed one (as onnxruntime does)."""


def implied_opsets() -> dict[str, int]:
    """{domain: version} a model's node may use without importing the domain: the domains onnxruntime
    imports by itself at their newest version (its model.cc adds the schema registry's latest opsets)
    that onnx_mini runs. Not ai.onnx: a model imports it, or is the lenient opset-1 case of _opsets."""
    return {"ai.onnx.ml": onnx.defs.onnx_ml_opset_version(), "ai.onnx.preview.training": 1, "com.microsoft": 1}


def _with_implied(opsets: dict[str, int], used: set[str]) -> dict[str, int]:
    """`opsets` plus the implied version of each used domain the model does not import, with a
    MissingOpsetWarning per domain (once per load, so once per prepare)."""
    implied = implied_opsets()
    missing = sorted(d for d in used if d not in opsets and d in implied)
    if not missing:
        return opsets
    opsets = dict(opsets)
    for d in missing:
        opsets[d] = implied[d]
        warnings.warn(f"the model uses domain {d!r} but imports no opset for it: running it at {d} opset "
                      f"{implied[d]}, the newest, as onnxruntime does (add an opset_import to be explicit)",
                      MissingOpsetWarning, stacklevel=_outside_stacklevel())
    return opsets


def _domains(nodes: list[Node], local: set[tuple[str, str]]) -> set[str]:
    """The operator domains of nodes and of the nodes of their subgraphs (not calls of the model's
    local functions `local`: (domain, name) keys)."""
    out: set[str] = set()
    for n in nodes:
        if (n.domain, n.op_type) not in local:
            out.add(n.domain)
        for v in n.attrs.values():
            for g in _graphs(v):
                out |= _domains(g.nodes, local)
    return out


def _graphs(value) -> list:
    """The graphs an attribute value holds. A list attribute holds items of one type, so its first item
    says whether it is a list of graphs (no walk over the thousands of numbers of a tree ensemble)."""
    if isinstance(value, list):
        return value if value and isinstance(value[0], Graph) else []
    return [value] if isinstance(value, Graph) else []


def _outside_stacklevel() -> int:
    """The warnings stacklevel of the caller's first frame outside onnx_mini (the user's line)."""
    here = os.path.dirname(os.path.abspath(__file__)) + os.sep
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(here):
        frame, level = frame.f_back, level + 1
    return level


def metadata(proto: ModelProto) -> ModelMetadata:
    """The descriptive fields of a ModelProto (producer, domain, doc strings, metadata_props)."""
    return ModelMetadata(
        producer_name=proto.producer_name, producer_version=proto.producer_version, domain=proto.domain,
        description=proto.doc_string, graph_name=proto.graph.name, graph_description=proto.graph.doc_string,
        version=proto.model_version, custom_metadata_map={p.key: p.value for p in proto.metadata_props})


def _opsets(imports) -> dict[str, int]:
    opsets: dict[str, int] = {}
    for o in imports:
        if not 1 <= o.version < 2**31:
            raise ModelLoadError(f"opset import {o.domain or 'ai.onnx'!r} has version {o.version}, not a valid opset")
        opsets[normalize_domain(_text(o.domain, "opset domain"))] = o.version
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
        name=_text(fp.name, "function name"), domain=normalize_domain(_text(fp.domain, "function domain")),
        inputs=_texts(fp.input, "function input"), outputs=_texts(fp.output, "function output"),
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
            inits[_text(t.name, "initializer name")] = self.tensor(t, view=True)
        for st in g.sparse_initializer:
            inits[_text(st.values.name, "initializer name")] = self.sparse(st)
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
                attrs[_text(a.name, "attribute name")] = self.attr(a)
            except ModelLoadError as e:
                raise ModelLoadError(f"node {n.name!r} ({n.op_type}): attribute {a.name!r}: {e}") from e
        captures: dict[str, None] = {}
        for v in attrs.values():
            for g in _graphs(v):
                captures.update(dict.fromkeys(free_names(g)))
        return Node(name=_text(n.name, "node name"), op_type=_text(n.op_type, "op_type"),
                    domain=normalize_domain(_text(n.domain, "domain")), inputs=_texts(n.input, "input name"),
                    outputs=_texts(n.output, "output name"), attrs=attrs, index=index, captures=tuple(captures))

    def attr(self, a: AttributeProto) -> Any:
        if a.ref_attr_name:
            return AttrRef(_text(a.ref_attr_name, "attribute reference"))
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
            try:        # UTF-8 (bytes.decode's default) without a Python call per string: a tree
                return list(map(bytes.decode, a.strings))   # ensemble's thousands of node modes
            except UnicodeDecodeError:
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
    def tensor(self, t: TensorProto, view: bool = False) -> np.ndarray:
        """view: an initializer (read-only from here on) may be a view over its raw_data, a bytes
        object protobuf made for us alone, instead of a second copy of the weights."""
        if t.data_location == TensorProto.EXTERNAL:
            return dtypes.tensor_to_array(t, self.external_data(t), copy=False)
        return dtypes.tensor_to_array(t, copy=not view)

    def sparse(self, st: onnx.SparseTensorProto) -> np.ndarray:
        values = self.tensor(st.values)
        indices = self.tensor(st.indices)
        shape = tuple(st.dims)
        where = f"sparse tensor {st.values.name!r}"
        dtypes.check_size(shape, values.dtype, where, ModelLoadError)
        if indices.dtype.kind not in "iu":
            raise ModelLoadError(f"{where}: indices must be integers, got {indices.dtype}")
        indices = indices.astype(np.int64)
        dense = np.zeros(shape, dtype=values.dtype)
        if values.dtype == object:
            dense[...] = ""
        n = values.size
        if indices.ndim == 1 and indices.shape[0] == n:          # linearized indices
            bound = np.array([dense.size])
        elif indices.ndim == 2 and indices.shape == (n, len(shape)):
            bound = np.array(shape, dtype=np.int64)
        else:
            raise ModelLoadError(f"{where}: indices of shape {list(indices.shape)} do not fit {n} values "
                                 f"in dense shape {list(shape)}")
        if values.ndim != 1:
            raise ModelLoadError(f"{where}: values must be 1-D, got shape {list(values.shape)}")
        if n and ((indices < 0).any() or (indices >= bound).any()):
            raise ModelLoadError(f"{where}: an index is out of range for dense shape {list(shape)}")
        if n:
            if indices.ndim == 1:
                dense.reshape(-1)[indices] = values
            else:
                dense[tuple(indices.T)] = values
        return dense

    def external_data(self, t: TensorProto):
        """The bytes of an external tensor: a read-only mmap view for large ones, bytes otherwise.

        Only a regular file inside the model's folder is read (see safe_external_path), opened
        without following a last-moment symlink and without blocking on a FIFO; offset and length
        are checked against the file's size and the tensor's byte size before anything is read."""
        info = {_text(e.key, "external data key"): _text(e.value, "external data value") for e in t.external_data}
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
        if t.data_type == TensorProto.STRING:
            raise ExternalDataError(f"string tensor {t.name!r} cannot use external data")
        if any(d < 0 for d in t.dims):
            raise ExternalDataError(f"tensor {t.name!r} has negative dimensions {list(t.dims)}")
        dtypes.check_size(t.dims, dtypes.np_dtype(t.data_type), f"tensor {t.name!r}", ExternalDataError)
        need = dtypes.stored_nbytes(t.data_type, t.dims)
        if length is not None and length != need:
            raise ExternalDataError(f"tensor {t.name!r}: external data length {length} does not match its "
                                    f"shape {list(t.dims)} of {dtypes.type_name(t.data_type)} ({need} bytes)")
        fd = _open_regular(path, location, t.name)
        try:
            size = os.fstat(fd).st_size
            if offset + need > size:
                raise ExternalDataError(f"tensor {t.name!r}: external file {location!r} holds {size} bytes, "
                                        f"{need} needed at offset {offset}")
            if need >= MMAP_THRESHOLD and offset < size:
                start = offset - offset % mmap.ALLOCATIONGRANULARITY
                mm = mmap.mmap(fd, offset - start + need, access=mmap.ACCESS_READ, offset=start)
                return memoryview(mm)[offset - start:]
            data = os.pread(fd, need, offset) if need else b""
        except OSError as e:
            raise ExternalDataError(f"tensor {t.name!r}: cannot read external data {location!r}: {e}") from e
        finally:
            os.close(fd)
        if len(data) != need:
            raise ExternalDataError(f"tensor {t.name!r}: external file {location!r} holds {len(data)} bytes "
                                    f"at offset {offset}, {need} expected")
        return data


#: external tensors of at least this many bytes are memory-mapped (read-only) rather than copied.
MMAP_THRESHOLD = 1 << 20
_O_FLAGS = (os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
            | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))


def _open_regular(path: str, location: str, name: str) -> int:
    """A read-only descriptor on `path`, which must be a regular file with a single name (a hard
    link may be another name of a file outside the folder); no device, FIFO, socket or directory."""
    try:
        fd = os.open(path, _O_FLAGS)
    except OSError as e:
        raise ExternalDataError(f"tensor {name!r}: cannot open external data {location!r}: {e}") from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ExternalDataError(f"tensor {name!r}: external data {location!r} is not a regular file")
        if st.st_nlink > 1:
            raise ExternalDataError(f"tensor {name!r}: external data {location!r} has {st.st_nlink} hard links; "
                                    "a hard-linked file may lie outside the model's folder and is refused")
    except BaseException:
        os.close(fd)
        raise
    return fd


def safe_external_path(base_dir: str | None, location: str, name: str = "") -> str:
    """The real path of an external data file, guaranteed to be inside base_dir."""
    if base_dir is None:
        raise ExternalDataError(f"tensor {name!r} uses external data {location!r} but the model's folder is "
                                "unknown (the model was given as bytes, a ModelProto or an unnamed file): "
                                "load it from its path, or pass base_dir= the folder holding its data")
    if "\0" in location:
        raise ExternalDataError(f"tensor {name!r}: external data location {location!r} holds a NUL character")
    if os.path.isabs(location) or location.startswith(("/", "\\")) or ":" in location.split("/")[0]:
        raise ExternalDataError(f"tensor {name!r}: external data location {location!r} is absolute; "
                                "only paths inside the model's folder are allowed")
    parts = location.replace("\\", "/").split("/")
    if ".." in parts:
        raise ExternalDataError(f"tensor {name!r}: external data location {location!r} leaves the model's folder")
    root = os.path.realpath(base_dir)
    path = os.path.realpath(os.path.join(root, *parts))
    if os.path.commonpath([root, path]) != root or path == root:  # a symlink that points outside
        raise ExternalDataError(f"tensor {name!r}: external data location {location!r} resolves outside "
                                "the model's folder")
    return path


# -- types --------------------------------------------------------------------------------------

def _text(value, what: str) -> str:
    """A name read from the proto: protobuf hands back bytes when they are not valid UTF-8."""
    if value.__class__ is not str:
        raise ModelLoadError(f"{what} {value!r} is not valid UTF-8")
    return value


def _texts(values, what: str) -> tuple[str, ...]:
    out = tuple(values)
    for v in out:
        _text(v, what)
    return out


def value_info(v: onnx.ValueInfoProto) -> ValueInfo:
    return ValueInfo(_text(v.name, "value name"), type_info(v.type) if v.HasField("type") else None)


def type_info(tp: onnx.TypeProto) -> TypeInfo | None:
    which = tp.WhichOneof("value")
    if which in ("tensor_type", "sparse_tensor_type"):
        tt = getattr(tp, which)
        shape = None
        if tt.HasField("shape"):
            shape = tuple(_dim(d) for d in tt.shape.dim)
        return TypeInfo("tensor" if which == "tensor_type" else "sparse_tensor", tt.elem_type, shape)
    if which == "sequence_type":
        return TypeInfo("sequence", inner=type_info(tp.sequence_type.elem_type))
    if which == "optional_type":
        return TypeInfo("optional", inner=type_info(tp.optional_type.elem_type))
    if which == "map_type":
        return TypeInfo("map", key_type=tp.map_type.key_type, inner=type_info(tp.map_type.value_type))
    return None


def _dim(d: onnx.TensorShapeProto.Dimension) -> int | str | None:
    """A declared dimension: its size, its symbolic name, or None when unknown. Paddle, WinMLTools and
    OnnxMLTools write dim_value -1 for "unknown"; onnxruntime reads every negative value so (its
    get_inputs() shows None), and so does onnx_mini: no later stage ever sees a negative size."""
    if d.HasField("dim_value"):
        return d.dim_value if d.dim_value >= 0 else None
    return d.dim_param or None


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
