"""Small builders shared by our own tests: models, the type matrices of the schemas, exact samples."""
from __future__ import annotations

import copy
import math

import ml_dtypes
import numpy as np
import onnx.defs
import pytest
from onnx import AttributeProto, TensorProto, helper

import onnx_mini


def model(nodes, inputs, outputs, initializers=(), opset=21, ir_version=10, **kw):
    """inputs/outputs: [(name, elem_type, shape)]; shape None means unknown."""
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        list(initializers))
    opsets = opset if isinstance(opset, list) else [helper.make_opsetid("", opset)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=ir_version, **kw)


F, I64 = TensorProto.FLOAT, TensorProto.INT64


def type_matrix(op: str, versions) -> list:
    """(version, type name such as 'float' or 'int4') for each tensor type of the first type constraint."""
    params = []
    for v in versions:
        schema = onnx.defs.get_schema(op, v)
        assert schema.since_version == v
        names = [t[len("tensor("):-1] for t in schema.type_constraints[0].allowed_type_strs if t.startswith("tensor(")]
        params += [pytest.param(v, t, id=f"v{v}-{t}") for t in names]
    return params


def np_type(name: str) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(getattr(TensorProto, name.upper())))


def elem_type(dtype) -> int:
    return TensorProto.STRING if np.dtype(dtype) == object else helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


FP4 = [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.5, -1, -1.5, -2, -3, -4, -6]  # exact in every float type but e8m0


def sample(tname: str, shape) -> np.ndarray:
    """Deterministic values of the given ONNX type, all exactly representable in it."""
    i = np.arange(math.prod(shape))
    dt = np_type(tname)
    if tname == "string":
        a = np.array([f"s{k}" for k in i], dtype=object)
    elif tname == "bool":
        a = i % 3 == 1
    elif tname.startswith("complex"):
        a = i + 1j * (i % 3)
    elif tname.startswith(("int", "uint")):
        info = ml_dtypes.iinfo(dt)
        a = int(info.min) + i % min(int(info.max) - int(info.min) + 1, 251)
    elif tname == "float8e8m0":  # powers of two only (no zero, no sign)
        a = 2.0 ** (i % 7 - 3)
    else:
        a = np.array(FP4)[i % len(FP4)]
    return np.asarray(a).astype(dt).reshape(shape)


def assert_same(got, exp) -> None:
    """Same container, dtype, shape and values (a list for sequences)."""
    if isinstance(exp, list):
        assert isinstance(got, list) and len(got) == len(exp)
        return [assert_same(g, e) for g, e in zip(got, exp)]
    assert type(got) is np.ndarray, f"expected an np.ndarray, got {type(got).__name__}"
    assert got.dtype == exp.dtype, (got.dtype, exp.dtype)
    assert got.shape == exp.shape, (got.shape, exp.shape)
    if exp.dtype == object:
        assert got.tolist() == exp.tolist()
    elif exp.dtype.kind in "biufc" and exp.dtype.type.__module__ == "numpy":
        np.testing.assert_array_equal(got, exp)
    else:  # ml_dtypes types (some report kind 'f'): compare values as float64, NaN equal to NaN
        np.testing.assert_array_equal(got.astype(np.float64), exp.astype(np.float64))


def run_op(op: str, version: int, inputs: list, **attrs):
    """Build a one-node model at opset `version`, run it on `inputs`, return its single output.
    Also checks that the caller's inputs are left untouched."""
    names = [f"in{k}" for k in range(len(inputs))]
    node = helper.make_node(op, names, ["out"])
    for k, v in attrs.items():
        empty_ints = isinstance(v, list) and not v
        node.attribute.append(helper.make_attribute(k, v, attr_type=AttributeProto.INTS if empty_ints else None))
    declared = [helper.make_tensor_sequence_value_info(n, elem_type(x[0].dtype), None) if isinstance(x, list)
                else helper.make_tensor_value_info(n, elem_type(x.dtype), x.shape) for n, x in zip(names, inputs)]
    graph = helper.make_graph([node], "g", declared, [helper.make_empty_tensor_value_info("out")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", version)], ir_version=10)
    before = copy.deepcopy(inputs)
    (out,) = onnx_mini.prepare(model).run(list(inputs))
    assert_same(inputs, before)
    return out


NODE = "the_node"


def run_node(op: str, version: int, inputs: list, n_outputs: int = 1, domain: str = "", **attrs):
    """Run one node named NODE (= "the_node") at opset `version` of its domain and return its output
    (a tuple when n_outputs > 1). An input given as None is an omitted optional input; a Python list
    of arrays is a sequence. Also checks, bit for bit, that the caller's arrays are left untouched."""
    names = ["" if x is None else f"in{k}" for k, x in enumerate(inputs)]
    while names and not names[-1]:
        names.pop()
    node = helper.make_node(op, names, [f"out{k}" for k in range(n_outputs)], name=NODE, domain=domain)
    for k, v in attrs.items():
        empty_ints = isinstance(v, list) and not v
        node.attribute.append(helper.make_attribute(k, v, attr_type=AttributeProto.INTS if empty_ints else None))
    declared = [helper.make_tensor_sequence_value_info(n, elem_type(x[0].dtype) if x else TensorProto.FLOAT, None)
                if isinstance(x, list) else helper.make_tensor_value_info(n, elem_type(x.dtype), x.shape)
                for n, x in zip(names, inputs) if x is not None]
    outs = [helper.make_empty_tensor_value_info(f"out{k}") for k in range(n_outputs)]
    graph = helper.make_graph([node], "g", declared, outs)
    opsets = [helper.make_opsetid(domain, version)] + ([helper.make_opsetid("", 21)] if domain else [])
    model = helper.make_model(graph, opset_imports=opsets, ir_version=10)
    given = [x for x in inputs if x is not None]
    before = copy.deepcopy(given)
    result = onnx_mini.prepare(model).run(list(given))
    for x, b in zip(given, before):
        for xa, ba in (zip(x, b) if isinstance(x, list) else [(x, b)]):
            assert xa.dtype == ba.dtype and xa.shape == ba.shape
            assert xa.tolist() == ba.tolist() if xa.dtype == object else xa.tobytes() == ba.tobytes()
    return tuple(result) if n_outputs > 1 else result[0]


def type_params(op: str, versions, param: str = "T", domain: str = "") -> list:
    """(version, type name) for every tensor type of the type constraint named `param`, per version."""
    out = []
    for v in versions:
        schema = onnx.defs.get_schema(op, v, domain)
        assert schema.since_version == v
        (tc,) = [t for t in schema.type_constraints if t.type_param_str == param]
        out += [pytest.param(v, t[7:-1], id=f"v{v}-{t[7:-1]}") for t in tc.allowed_type_strs
                if t.startswith("tensor(")]
    return out


def versions(op: str, domain: str = "") -> list[int]:
    """Every since_version of (domain, op) in the installed onnx."""
    return sorted(s.since_version for s in onnx.defs.get_all_schemas_with_history()
                  if s.name == op and s.domain == domain)
