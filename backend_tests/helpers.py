"""Small builders shared by our own tests: models, the type matrices of the schemas, exact samples,
the one-node runners (run_op, run_node) and the checks and references several test files use.
Test files import from here only, never from each other."""
from __future__ import annotations

import copy
import math
import re
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx.defs
import pytest
from onnx import AttributeProto, TensorProto, helper, numpy_helper

import onnx_mini
from onnx_mini.errors import KernelError

TESTS = Path(__file__).resolve().parent      # backend_tests/, where the strict lists live
REPO = TESTS.parent                          # the repository: README, examples, benchmarks


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

def init(name: str, value) -> TensorProto:
    """An initializer named `name` holding `value` (any array-like)."""
    return numpy_helper.from_array(np.asarray(value), name)


def steps(prepared) -> list[tuple[str, str]]:
    """(domain, op_type) of each step of a prepared model's plan, in order."""
    return [(i.domain, i.op_type) for i in prepared.plan.infos]

def conv2d_direct(x, w, b=None, strides=(1, 1), pads=(0, 0, 0, 0), group=1, dtype=np.float64) -> np.ndarray:
    """A 2-D Conv (NCHW) by its definition, in `dtype` (float64, or int64 for integer sums): X zero
    padded by pads (top, left, bottom, right), then per output channel and tap a sum over the group's
    input channels, plus B."""
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    xp = np.zeros((n, c, h + pads[0] + pads[2], wd + pads[1] + pads[3]), dtype)
    xp[:, :, pads[0]:pads[0] + h, pads[1]:pads[1] + wd] = x
    oh = (xp.shape[2] - kh) // strides[0] + 1
    ow = (xp.shape[3] - kw) // strides[1] + 1
    y = np.zeros((n, m, oh, ow), dtype)
    per = m // group
    with np.errstate(invalid="ignore", over="ignore"):
        for o in range(m):
            g = o // per
            for i in range(kh):
                for j in range(kw):
                    patch = xp[:, g * cg:(g + 1) * cg, i:i + (oh - 1) * strides[0] + 1:strides[0],
                               j:j + (ow - 1) * strides[1] + 1:strides[1]]
                    y[:, o] += np.einsum("nchw,c->nhw", patch, w[o, :, i, j].astype(dtype))
    if b is not None:
        y += b.astype(dtype).reshape(1, m, 1, 1)
    return y


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


def attribute(name: str, value) -> AttributeProto:
    """An attribute from a Python value: an np.ndarray is a TENSOR, an empty list INTS."""
    if isinstance(value, np.ndarray):
        return helper.make_attribute(name, numpy_helper.from_array(value))
    empty_ints = isinstance(value, list) and not value
    return helper.make_attribute(name, value, attr_type=AttributeProto.INTS if empty_ints else None)


def run_op(op: str, version: int, inputs: list, **attrs):
    """Build a one-node model at opset `version`, run it on `inputs`, return its single output.
    Also checks that the caller's inputs are left untouched."""
    names = [f"in{k}" for k in range(len(inputs))]
    node = helper.make_node(op, names, ["out"])
    node.attribute.extend(attribute(k, v) for k, v in attrs.items())
    declared = [helper.make_tensor_sequence_value_info(n, elem_type(x[0].dtype), None) if isinstance(x, list)
                else helper.make_tensor_value_info(n, elem_type(x.dtype), x.shape) for n, x in zip(names, inputs)]
    graph = helper.make_graph([node], "g", declared, [helper.make_empty_tensor_value_info("out")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", version)], ir_version=10)
    before = copy.deepcopy(inputs)
    (out,) = onnx_mini.prepare(model).run(list(inputs))
    assert_same(inputs, before)
    return out


NODE = "the_node"


def run_node(op: str, version: int, inputs: list, n_outputs: int = 1, domain: str = "", *,
             keep_empty_tail: bool = False, const: tuple = (), **attrs):
    """Run one node named NODE (= "the_node") at opset `version` of its domain and return its output
    (a tuple when n_outputs > 1). An input given as None is an omitted optional input: an empty name
    in the middle, left out of the node at the end (kept there as empty names with keep_empty_tail).
    A Python list of arrays is a sequence; an np.ndarray attribute is a TENSOR attribute. const:
    indices of inputs given as initializers (constants the kernel's factory sees), the rest are fed.
    Also checks, bit for bit, that the caller's arrays are left untouched."""
    names = ["" if x is None else f"in{k}" for k, x in enumerate(inputs)]
    while names and not names[-1] and not keep_empty_tail:
        names.pop()
    node = helper.make_node(op, names, [f"out{k}" for k in range(n_outputs)], name=NODE, domain=domain)
    node.attribute.extend(attribute(k, v) for k, v in attrs.items())
    declared = [helper.make_tensor_sequence_value_info(n, elem_type(x[0].dtype) if x else TensorProto.FLOAT, None)
                if isinstance(x, list) else helper.make_tensor_value_info(n, elem_type(x.dtype), x.shape)
                for k, (n, x) in enumerate(zip(names, inputs)) if x is not None and k not in const]
    initializers = [numpy_helper.from_array(inputs[k], names[k]) for k in const if inputs[k] is not None]
    outs = [helper.make_empty_tensor_value_info(f"out{k}") for k in range(n_outputs)]
    graph = helper.make_graph([node], "g", declared, outs, initializers)
    opsets = [helper.make_opsetid(domain, version)] + ([helper.make_opsetid("", 21)] if domain else [])
    model = helper.make_model(graph, opset_imports=opsets, ir_version=10)
    given = [x for k, x in enumerate(inputs) if x is not None and k not in const]
    before = copy.deepcopy(given)
    result = onnx_mini.prepare(model).run(list(given))
    for x, b in zip(given, before):
        for xa, ba in (zip(x, b) if isinstance(x, list) else [(x, b)]):
            assert xa.dtype == ba.dtype and xa.shape == ba.shape
            assert xa.tolist() == ba.tolist() if xa.dtype == object else xa.tobytes() == ba.tobytes()
    return tuple(result) if n_outputs > 1 else result[0]


def type_names(op: str, version: int, param: str = "T", domain: str = "") -> list[str]:
    """The tensor type names ('float', 'int4', ...) of the type constraint named `param` of the
    schema (domain, op) introduced at exactly `version`."""
    schema = onnx.defs.get_schema(op, version, domain)
    assert schema.since_version == version
    (tc,) = [t for t in schema.type_constraints if t.type_param_str == param]
    return [t[len("tensor("):-1] for t in tc.allowed_type_strs if t.startswith("tensor(")]


def type_params(op: str, versions, param: str = "T", domain: str = "") -> list:
    """(version, type name) for every tensor type of the type constraint named `param`, per version."""
    return [pytest.param(v, t, id=f"v{v}-{t}") for v in versions for t in type_names(op, v, param, domain)]


def op_type_matrix(table: dict) -> list:
    """(op, version, type name) for every op of `table` (op -> (versions, ...)) and every type of its versions."""
    return [pytest.param(op, *p.values, id=f"{op}-{p.id}") for op in table for p in type_matrix(op, table[op][0])]


def versions(op: str, domain: str = "") -> list[int]:
    """Every since_version of (domain, op) in the installed onnx."""
    return sorted(s.since_version for s in onnx.defs.get_all_schemas_with_history()
                  if s.name == op and s.domain == domain)


# -- values ----------------------------------------------------------------------------------------

def i64(values) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def arr(values, dtype) -> np.ndarray:
    """values (exact in `dtype`) as an array of `dtype`; floats go through float64."""
    dt = np.dtype(dtype)
    if dt == object:
        return np.array(values, dtype=object)
    return np.array(values).astype(dt) if dt.kind in "iub" else np.array(values, np.float64).astype(dt)


def arange(shape, dtype=np.float32) -> np.ndarray:
    return np.arange(math.prod(shape)).astype(dtype).reshape(shape)


def small(tname: str, shape, seed: int = 0) -> np.ndarray:
    """Small deterministic values exact in the type (incl. unsigned: 0..6)."""
    rng = np.random.default_rng(seed)
    v = rng.integers(0, 7, size=shape)
    if not tname.startswith("uint"):
        v = v - 3
    return np.asarray(v).astype(np_type(tname))


# -- checks and references ---------------------------------------------------------------------------

def is_readonly_view(out: np.ndarray, of: np.ndarray) -> bool:
    return np.shares_memory(out, of) and not out.flags.writeable


def raises_naming_node(kind, pattern: str):
    """pytest.raises for an error of `kind` whose message names the node and matches pattern."""
    return pytest.raises(kind, match=re.compile(f"(?s){NODE}.*({pattern})", re.I))


def expect_kernel_error(op, version, inputs, *fragments, **attrs):
    """The node fails at run time with a KernelError naming the node and every fragment."""
    with pytest.raises(KernelError) as info:
        run_node(op, version, inputs, **attrs)
    message = str(info.value)
    assert NODE in message, message
    for fragment in fragments:
        assert re.search(fragment, message, re.I), (fragment, message)


def legacy_ref(fn, a, b, axis, dtype=None):
    """Opsets 1-6 broadcast=1: B matches A's dims from `axis` (default: suffix), size-1 dims of B repeat.
    out[pos] = fn(a[pos], b[...]) computed on Python values, stored as `dtype` (default: A's type)."""
    start = a.ndim - b.ndim if axis is None else axis
    out = np.empty(a.shape, dtype=object)
    for pos in np.ndindex(*a.shape):
        out[pos] = fn(a[pos].item(), b[tuple(0 if d == 1 else pos[start + k] for k, d in enumerate(b.shape))].item())
    return out.astype(np.float64).astype(a.dtype) if dtype is None else out.astype(dtype)


# -- control flow, for hooks and the profile -----------------------------------------------------------

def control_flow_model():
    """x float[4], c bool[], xs float[3, 2], s0 float[2] -> acc, y, s, ys, with every kind of body:

    - Loop_0 (unnamed), 3 iterations carrying acc = x; its body: Identity_0 (cond), Add_1 (a = acc + x,
      x captured), Mod_2 and Equal_3 (i even?), If_4 whose then_branch is Mul_0 (a * a), else_branch
      Neg_0 (-a): iterations 0 and 2 take then_branch, 1 else_branch;
    - `choose`, an If on c: then_branch `twice` (acc + acc), else_branch Sub_0 (acc - x);
    - `scan`, a Scan over the 3 rows of xs: its body `accumulate` (s + row) and Neg_1 (ys rows -s).
    Unnamed nodes get `<OpType>_<step index>` in hook paths and the profile."""
    def vi(name, t=F, shape=None):
        return helper.make_tensor_value_info(name, t, shape)
    mul = helper.make_graph([helper.make_node("Mul", ["a", "a"], ["t"])], "mul", [], [vi("t")])
    neg = helper.make_graph([helper.make_node("Neg", ["a"], ["e"])], "neg", [], [vi("e")])
    loop_body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Add", ["acc_in", "x"], ["a"]),
         helper.make_node("Mod", ["i", "two"], ["r"]),
         helper.make_node("Equal", ["r", "zero"], ["even"]),
         helper.make_node("If", ["even"], ["b"], then_branch=mul, else_branch=neg)],
        "loop_body", [vi("i", I64, []), vi("cond_in", TensorProto.BOOL, []), vi("acc_in")],
        [vi("cond_out", TensorProto.BOOL, []), vi("b")],
        [numpy_helper.from_array(np.array(2, np.int64), "two"), numpy_helper.from_array(np.array(0, np.int64), "zero")])
    twice = helper.make_graph([helper.make_node("Add", ["acc", "acc"], ["d"], name="twice")], "twice", [], [vi("d")])
    minus = helper.make_graph([helper.make_node("Sub", ["acc", "x"], ["m"])], "minus", [], [vi("m")])
    scan_body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "row"], ["s_out"], name="accumulate"),
         helper.make_node("Neg", ["s_out"], ["y_row"])],
        "scan_body", [vi("s_in", F, [2]), vi("row", F, [2])], [vi("s_out", F, [2]), vi("y_row", F, [2])])
    nodes = [helper.make_node("Loop", ["M", "", "x"], ["acc"], body=loop_body),
             helper.make_node("If", ["c"], ["y"], name="choose", then_branch=twice, else_branch=minus),
             helper.make_node("Scan", ["s0", "xs"], ["s", "ys"], name="scan", body=scan_body, num_scan_inputs=1)]
    return model(nodes, [("x", F, [4]), ("c", TensorProto.BOOL, []), ("xs", F, [3, 2]), ("s0", F, [2])],
                 [("acc", F, None), ("y", F, None), ("s", F, None), ("ys", F, None)],
                 [numpy_helper.from_array(np.array(3, np.int64), "M")], opset=17)


def control_flow_feeds(c: bool = True) -> dict:
    return {"x": np.array([1, -2, 3, -4], np.float32), "c": np.array(c), "xs": arange((3, 2)),
            "s0": np.array([10, 20], np.float32)}


def one_node_model(op, inputs, const=(), n_outputs=1, domain="", version=None, **attrs):
    """A one-node model (the node named NODE): inputs[k] an initializer for k in const, a graph input
    otherwise (None: omitted). Opsets: ai.onnx at `version` for a default-domain op (else 21), and
    `domain` at `version` (else 1). -> (model, indices of the graph inputs in feed order)."""
    names = ["" if x is None else f"in{k}" for k, x in enumerate(inputs)]
    while names and not names[-1]:
        names.pop()
    node = helper.make_node(op, names, [f"out{k}" for k in range(n_outputs)], name=NODE, domain=domain, **attrs)
    fed = [k for k, x in enumerate(inputs) if x is not None and k not in const]
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(names[k], helper.np_dtype_to_tensor_dtype(inputs[k].dtype), None) for k in fed],
        [helper.make_empty_tensor_value_info(f"out{k}") for k in range(n_outputs)],
        [numpy_helper.from_array(inputs[k], names[k]) for k in sorted(const) if inputs[k] is not None])
    opsets = [helper.make_opsetid("", version if not domain and version else 21)]
    if domain:
        opsets.append(helper.make_opsetid(domain, version or 1))
    return helper.make_model(graph, opset_imports=opsets, ir_version=10), fed
