"""Spec tests for Optional, OptionalHasElement and OptionalGetElement (every version and type).

An optional value is None (empty) or its element (a tensor, or a sequence given as a list).
"""
from __future__ import annotations

import re

import numpy as np
import onnx.defs
import pytest
from onnx import TensorProto, helper

import onnx_mini
from onnx_mini.errors import InvalidNodeError, KernelError

from helpers import assert_same, elem_type, sample


def element_types(op: str, version: int, constraint: str) -> list[tuple[str, str]]:
    """(kind, type name) of the tensors/sequences a type constraint lists, optional(...) unwrapped."""
    schema = onnx.defs.get_schema(op, version)
    assert schema.since_version == version
    tc = next(t for t in schema.type_constraints if t.type_param_str == constraint)
    out = set()
    for t in tc.allowed_type_strs:
        m = re.fullmatch(r"(?:optional\()?(seq\()?tensor\((\w+)\)\)?\)?", t)
        out.add(("sequence" if m.group(1) else "tensor", m.group(2)))
    return sorted(out)


def matrix(op, versions, constraint):
    return [pytest.param(v, k, t, id=f"v{v}-{k}-{t}") for v in versions for k, t in element_types(op, v, constraint)]


def value_of(kind: str, tname: str):
    if kind == "tensor":
        return sample(tname, (2, 3))
    return [sample(tname, (2,)), sample(tname, (1, 3))]


def type_proto(kind: str, tname: str, optional: bool = False):
    elem = getattr(TensorProto, tname.upper())
    tp = helper.make_tensor_type_proto(elem, None)
    if kind == "sequence":
        tp = helper.make_sequence_type_proto(tp)
    return helper.make_optional_type_proto(tp) if optional else tp


def run_model(nodes, inputs, outputs, feeds, opset):
    """inputs/outputs: [(name, TypeProto or None)]."""
    vi = [helper.make_value_info(n, t) if t is not None else helper.make_empty_tensor_value_info(n) for n, t in inputs]
    vo = [helper.make_value_info(n, t) if t is not None else helper.make_empty_tensor_value_info(n) for n, t in outputs]
    m = helper.make_model(helper.make_graph(nodes, "g", vi, vo), opset_imports=[helper.make_opsetid("", opset)],
                          ir_version=10)
    return list(onnx_mini.prepare(m).run(feeds))


TRUE, FALSE = np.array(True), np.array(False)


# -- Optional --------------------------------------------------------------------------------------

@pytest.mark.parametrize("version,kind,tname", matrix("Optional", (15, 28), "V"))
def test_optional_wraps_its_input_every_type(version, kind, tname):
    nodes = [helper.make_node("Optional", ["x"], ["opt"]), helper.make_node("OptionalHasElement", ["opt"], ["has"]),
             helper.make_node("OptionalGetElement", ["opt"], ["back"])]
    opt, has, back = run_model(nodes, [("x", type_proto(kind, tname))],
                               [("opt", type_proto(kind, tname, True)), ("has", None), ("back", None)],
                               [value_of(kind, tname)], version)
    assert_same(opt, value_of(kind, tname))
    assert_same(back, value_of(kind, tname))
    assert_same(has, TRUE)


@pytest.mark.parametrize("version,kind,tname", matrix("Optional", (15, 28), "V"))
def test_optional_without_input_is_empty_of_the_given_type(version, kind, tname):
    nodes = [helper.make_node("Optional", [], ["opt"], type=type_proto(kind, tname)),
             helper.make_node("OptionalHasElement", ["opt"], ["has"])]
    opt, has = run_model(nodes, [], [("opt", type_proto(kind, tname, True)), ("has", None)], [], version)
    assert opt is None
    assert_same(has, FALSE)


def test_optional_type_attribute_must_be_a_tensor_or_sequence():
    map_type = helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, None))
    with pytest.raises(InvalidNodeError, match="opt_node.*an optional holds a tensor or a sequence, not a map"):
        run_model([helper.make_node("Optional", [], ["o"], name="opt_node", type=map_type)], [], [("o", None)], [],
                  18)


# -- OptionalHasElement ----------------------------------------------------------------------------

@pytest.mark.parametrize("version,kind,tname", matrix("OptionalHasElement", (15, 18, 28), "O"))
def test_optional_has_element_every_type(version, kind, tname):
    node = helper.make_node("OptionalHasElement", ["o"], ["has"])
    inputs = [("o", type_proto(kind, tname, True))]
    assert_same(run_model([node], inputs, [("has", None)], [value_of(kind, tname)], version)[0], TRUE)
    assert_same(run_model([node], inputs, [("has", None)], [None], version)[0], FALSE)
    assert_same(run_model([node], inputs, [("has", None)], {"o": None}, version)[0], FALSE)


@pytest.mark.parametrize("version", [18, 28])
@pytest.mark.parametrize("kind", ["tensor", "sequence"])
def test_optional_has_element_on_plain_values_from_18(version, kind):
    # 18+: a tensor or sequence input (not optional-typed) always has an element
    node = helper.make_node("OptionalHasElement", ["x"], ["has"])
    out = run_model([node], [("x", type_proto(kind, "float"))], [("has", None)], [value_of(kind, "float")], version)
    assert_same(out[0], TRUE)


@pytest.mark.parametrize("version", [18, 28])
@pytest.mark.parametrize("inputs", [[], [""]])
def test_optional_has_element_without_input_is_false(version, inputs):
    node = helper.make_node("OptionalHasElement", inputs, ["has"])
    assert_same(run_model([node], [], [("has", None)], [], version)[0], FALSE)


def test_optional_has_element_result_is_a_read_only_bool_scalar():
    node = helper.make_node("OptionalHasElement", ["o"], ["has"])
    out = run_model([node], [("o", type_proto("tensor", "float", True))], [("has", None)], [None], 18)[0]
    assert out.dtype == np.bool_ and out.shape == () and not out.flags.writeable


# -- OptionalGetElement ----------------------------------------------------------------------------

@pytest.mark.parametrize("version,kind,tname", matrix("OptionalGetElement", (15, 18, 28), "O"))
def test_optional_get_element_every_type(version, kind, tname):
    node = helper.make_node("OptionalGetElement", ["o"], ["v"])
    out = run_model([node], [("o", type_proto(kind, tname, True))], [("v", None)], [value_of(kind, tname)], version)
    assert_same(out[0], value_of(kind, tname))


@pytest.mark.parametrize("version", [18, 28])
@pytest.mark.parametrize("kind", ["tensor", "sequence"])
def test_optional_get_element_on_plain_values_from_18(version, kind):
    node = helper.make_node("OptionalGetElement", ["x"], ["v"])
    out = run_model([node], [("x", type_proto(kind, "int8"))], [("v", None)], [value_of(kind, "int8")], version)
    assert_same(out[0], value_of(kind, "int8"))


@pytest.mark.parametrize("version", [15, 18, 28])
def test_optional_get_element_of_empty_is_a_clear_error(version):
    node = helper.make_node("OptionalGetElement", ["o"], ["v"], name="getter")
    with pytest.raises(KernelError, match="getter.*OptionalGetElement.*optional input is empty"):
        run_model([node], [("o", type_proto("tensor", "float", True))], [("v", None)], [None], version)
    empty = [helper.make_node("Optional", [], ["o"], type=type_proto("sequence", "float")), node]
    with pytest.raises(KernelError, match="getter.*optional input is empty"):
        run_model(empty, [], [("v", None)], [], version)


def test_optional_of_a_sequence_passes_through_identity_and_back():
    seq_opt = type_proto("sequence", "string", True)
    nodes = [helper.make_node("Identity", ["o"], ["i"]), helper.make_node("OptionalGetElement", ["i"], ["v"]),
             helper.make_node("SequenceLength", ["v"], ["n"])]
    seq = [np.array(["é", "b"], dtype=object), np.array([], dtype=object)]
    i, v, n = run_model(nodes, [("o", seq_opt)], [("i", seq_opt), ("v", None), ("n", None)], [seq], 18)
    assert_same(i, seq)
    assert_same(v, seq)
    assert_same(n, np.array(2, np.int64))
