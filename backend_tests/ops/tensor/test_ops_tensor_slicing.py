"""Spec tests for Concat, Split, Slice, Tile, Pad and CenterCropPad.

Expected values are hand-written or computed from the spec's definitions: Slice's clamping rules,
Pad's "add or remove (if negative)" pads (np.pad for the added part, slicing for the removed part),
CenterCropPad's rounding (window start rounded down, odd extra padding on the right).
"""
from __future__ import annotations

import numpy as np
import pytest

import onnx_mini
from onnx_mini.errors import InvalidNodeError, KernelError
from onnx_mini.ops.tensor.slicing import pad_18, slice_10, split_13

from helpers import (arange, assert_same, i64, is_readonly_view, one_node_model, raises_naming_node, run_node, sample,
                     type_matrix)

INT64_MAX, INT64_MIN = 2 ** 63 - 1, -2 ** 63


# -- Concat --------------------------------------------------------------------------------------

CONCAT_VERSIONS = [1, 4, 11, 13]


@pytest.mark.parametrize("version,tname", type_matrix("Concat", CONCAT_VERSIONS))
def test_concat_every_type(version, tname):
    a, b = sample(tname, (2, 2)), sample(tname, (2, 3))
    expected = np.array([[a[0, 0], a[0, 1], b[0, 0], b[0, 1], b[0, 2]],
                         [a[1, 0], a[1, 1], b[1, 0], b[1, 1], b[1, 2]]], dtype=a.dtype)
    # Concat-1's axis defaults to 1; from version 4 it is required.
    assert_same(run_node("Concat", version, [a, b], **({} if version == 1 else {"axis": 1})), expected)


@pytest.mark.parametrize("version", CONCAT_VERSIONS)
@pytest.mark.parametrize("shapes,axis,expected_shape", [
    ([(2, 3), (1, 3)], 0, (3, 3)), ([(2, 3), (2, 1), (2, 2)], 1, (2, 6)), ([(3,), (4,)], 0, (7,)),
    ([(2, 0), (2, 3)], 1, (2, 3)), ([(0, 3), (0, 3)], 0, (0, 3)), ([(2, 0), (2, 0)], 1, (2, 0)),
    ([(2, 3)], 0, (2, 3)), ([(0, 2, 1), (0, 2, 3)], 2, (0, 2, 4)),
    ([(2, 3), (1, 3)], -2, (3, 3)), ([(2, 3), (2, 1)], -1, (2, 4)),   # negative axes (11+)
])
def test_concat_shapes(version, shapes, axis, expected_shape):
    if axis < 0 and version < 11:
        pytest.skip("negative axes from version 11")
    inputs = [arange(s) + 100 * k for k, s in enumerate(shapes)]
    out = run_node("Concat", version, inputs, axis=axis)
    # Element by element: the output along the axis is input 0, then input 1, ...
    a = axis % len(expected_shape)
    expected = np.empty(expected_shape, np.float32)
    offset = 0
    for x in inputs:
        for idx in np.ndindex(*x.shape):
            expected[idx[:a] + (idx[a] + offset,) + idx[a + 1:]] = x[idx]
        offset += x.shape[a]
    assert_same(out, expected)


@pytest.mark.parametrize("version", [4, 11, 13])
@pytest.mark.parametrize("inputs,axis,pattern", [
    ([np.zeros((2, 3), np.float32), np.zeros((3, 3), np.float32)], 1, "does not match"),
    ([np.zeros((2, 3), np.float32), np.zeros((2, 3, 1), np.float32)], 0, "does not match"),
    ([np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float32)], 2, "out of range"),
    ([np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float32)], -3, "out of range"),
    ([np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float64)], 0, "type"),
    ([np.zeros((), np.float32)], 0, "out of range"),
])
def test_concat_errors(version, inputs, axis, pattern):
    with raises_naming_node(KernelError, pattern):
        run_node("Concat", version, inputs, axis=axis)


@pytest.mark.parametrize("version", [4, 11, 13])
def test_concat_axis_is_required(version):
    with raises_naming_node(InvalidNodeError, "axis"):
        run_node("Concat", version, [np.zeros((2,), np.float32)])


def test_concat_names_the_first_input_that_does_not_fit():
    a, wide, f64 = np.zeros((2, 3), np.float32), np.zeros((3, 3), np.float32), np.zeros((2, 3), np.float64)
    with raises_naming_node(KernelError, "input 1 of shape \\[3, 3\\] does not match"):
        run_node("Concat", 13, [a, wide, f64], axis=1)
    with raises_naming_node(KernelError, "input 1 has type float64, input 0 has float32"):
        run_node("Concat", 13, [a, f64, wide], axis=1)


# -- Split ---------------------------------------------------------------------------------------

SPLIT_VERSIONS = [1, 2, 11, 13, 18]


def split(version, x, n, sizes=None, axis=None, as_input=None, const=False):
    """sizes go to the attribute (1, 2, 11) or the input (1 when as_input, 13, 18), an initializer
    with const."""
    attrs = {} if axis is None else {"axis": axis}
    inputs = [x]
    if sizes is not None:
        if version >= 13 or as_input:
            inputs.append(i64(sizes))
        else:
            attrs["split"] = list(sizes)
    out = run_node("Split", version, inputs, n_outputs=n, const=(1,) if const and len(inputs) > 1 else (), **attrs)
    return out if n > 1 else (out,)


@pytest.mark.parametrize("version,tname", type_matrix("Split", SPLIT_VERSIONS))
def test_split_every_type(version, tname):
    x = sample(tname, (2, 6))
    parts = split(version, x, 3, axis=1)
    for k, part in enumerate(parts):
        assert_same(part, np.array([[x[i, 2 * k + j] for j in range(2)] for i in range(2)], dtype=x.dtype))
        assert is_readonly_view(part, x)
    parts = split(version, x, 3, sizes=[1, 2, 3], axis=1)
    assert [p.shape for p in parts] == [(2, 1), (2, 2), (2, 3)]
    assert_same(parts[2], np.array([[x[i, j] for j in range(3, 6)] for i in range(2)], dtype=x.dtype))


@pytest.mark.parametrize("version", SPLIT_VERSIONS)
@pytest.mark.parametrize("shape,n,sizes,axis,starts", [  # starts: where each part begins on the axis
    ((6,), 2, None, None, [0, 3]), ((6,), 3, [2, 0, 4], 0, [0, 2, 2]), ((3, 4), 2, [1, 2], 0, [0, 1]),
    ((3, 4), 1, None, 1, [0]), ((3, 0), 2, None, 1, [0, 0]), ((0, 4), 2, None, 0, [0, 0]),
    ((3, 4), 2, [4, 0], 1, [0, 4]), ((3, 4), 4, None, -1, [0, 1, 2, 3]), ((3, 4), 3, [1, 1, 1], -2, [0, 1, 2]),
])
@pytest.mark.parametrize("const", [False, True])
def test_split_cases(version, shape, n, sizes, axis, starts, const):
    if axis is not None and axis < 0 and version < 11:
        pytest.skip("negative axes from version 11")
    x = arange(shape)
    a = 0 if axis is None else axis % len(shape)
    bounds = starts + [shape[a]]
    parts = split(version, x, n, sizes, axis, const=const)
    assert len(parts) == n
    for k, part in enumerate(parts):
        expected = np.take(x, np.arange(bounds[k], bounds[k + 1]), axis=a)
        assert_same(part, expected)


def test_split_1_takes_its_sizes_from_the_second_input():
    parts = split(1, arange((5,)), 2, sizes=[3, 2], as_input=True)
    assert_same(parts[0], np.array([0, 1, 2], np.float32))
    assert_same(parts[1], np.array([3, 4], np.float32))


@pytest.mark.parametrize("n,num_outputs,sizes", [
    (7, 3, [3, 3, 1]), (7, 4, [2, 2, 2, 1]), (6, 3, [2, 2, 2]), (4, 3, [2, 2, 0]), (1, 1, [1]), (0, 2, [0, 0]),
])
def test_split_18_num_outputs(n, num_outputs, sizes):
    # Parts of ceil(n / num_outputs) elements; the last one takes what is left.
    x = arange((2, n))
    parts = run_node("Split", 18, [x], n_outputs=num_outputs, num_outputs=num_outputs, axis=1)
    parts = parts if num_outputs > 1 else (parts,)
    start = 0
    for part, s in zip(parts, sizes):
        assert_same(part, x[:, start:start + s])
        start += s


def test_constant_split_serves_every_input_shape():
    """A constant split input: the parts made once per input shape (more shapes than the kernel keeps,
    each twice); a shape the sizes do not fit fails at each of its runs."""
    model, _ = one_node_model("Split", [arange((2, 3)), i64([1, 2])], const=(1,), n_outputs=2, axis=-1)
    prepared = onnx_mini.prepare(model)
    for n in list(range(70)) * 2:
        x = arange((n, 3))
        first, second = prepared.run([x])
        assert_same(first, x[:, :1])
        assert_same(second, x[:, 1:])
    for _ in range(2):
        with raises_naming_node(KernelError, "sums to"):
            prepared.run([arange((2, 4))])


@pytest.mark.parametrize("version,n,sizes,pattern", [
    (13, 2, [2, 2], "sums to"), (13, 2, [1, 2, 3], "entries"), (18, 2, [7, -1], "negative"),
    (13, 4, None, "equal parts"), (11, 4, None, "equal parts"), (2, 2, [1, 1], "sums to"),
])
@pytest.mark.parametrize("const", [False, True])
def test_split_errors(version, n, sizes, pattern, const):
    with raises_naming_node(KernelError, pattern):
        split(version, arange((6,)), n, sizes, const=const)


def test_split_18_errors():
    with raises_naming_node(InvalidNodeError, "num_outputs"):
        run_node("Split", 18, [arange((6,))], n_outputs=2, num_outputs=3)
    with raises_naming_node(KernelError, "cannot be split"):
        run_node("Split", 18, [arange((5,))], n_outputs=4, num_outputs=4)
    with raises_naming_node(KernelError, "not both"):
        run_node("Split", 18, [arange((6,)), i64([3, 3])], n_outputs=2, num_outputs=2)


# -- Slice ---------------------------------------------------------------------------------------

SLICE_VERSIONS = [1, 10, 11, 13]


def slice_op(version, data, starts, ends, axes=None, steps=None, ind=np.int64, const=False):
    """const: starts/ends/axes/steps as initializers (the kernel checks them once per input shape)."""
    if version == 1:
        assert steps is None
        return run_node("Slice", 1, [data], starts=list(starts), ends=list(ends),
                        **({} if axes is None else {"axes": list(axes)}))
    inputs = [data, np.array(starts, ind), np.array(ends, ind)]
    inputs += [None if axes is None else np.array(axes, ind)] if axes is not None or steps is not None else []
    inputs += [np.array(steps, ind)] if steps is not None else []
    return run_node("Slice", version, inputs, const=tuple(range(1, len(inputs))) if const else ())


@pytest.mark.parametrize("version,tname", type_matrix("Slice", SLICE_VERSIONS))
def test_slice_every_type(version, tname):
    x = sample(tname, (3, 4))
    out = slice_op(version, x, [1, 0], [2, 3])  # doc example 1 without steps
    assert_same(out, np.array([[x[1, 0], x[1, 1], x[1, 2]]], dtype=x.dtype))
    assert is_readonly_view(out, x)
    if version >= 10:
        out = slice_op(version, x, [-1], [INT64_MIN], axes=[1], steps=[-2])
        assert_same(out, np.array([[x[i, 3], x[i, 1]] for i in range(3)], dtype=x.dtype))
        assert is_readonly_view(out, x)


# One axis of size 5 holding [0, 1, 2, 3, 4]: (start, end, step, expected), worked out from the spec:
# negatives get 5 added, then start is clamped to [0, 5] / [0, 4] and end to [0, 5] / [-1, 4] for
# positive / negative steps.
SLICE_1D = [
    (0, 5, 1, [0, 1, 2, 3, 4]), (1, 3, 1, [1, 2]), (-2, 5, 1, [3, 4]), (-2, -1, 1, [3]), (0, -1, 1, [0, 1, 2, 3]),
    (3, 1, 1, []), (5, 10, 1, []), (10, 20, 1, []), (-100, 2, 1, [0, 1]), (-100, -100, 1, []),
    (0, INT64_MAX, 1, [0, 1, 2, 3, 4]), (INT64_MIN, INT64_MAX, 1, [0, 1, 2, 3, 4]), (2, INT64_MIN, 1, []),
    (0, 5, 2, [0, 2, 4]), (1, 5, 3, [1, 4]), (0, 5, 7, [0]), (4, 5, INT64_MAX, [4]),
    (4, 0, -1, [4, 3, 2, 1]), (-1, INT64_MIN, -1, [4, 3, 2, 1, 0]), (INT64_MAX, INT64_MIN, -1, [4, 3, 2, 1, 0]),
    (10, 2, -1, [4, 3]), (-1, -3, -1, [4, 3]), (3, -100, -2, [3, 1]), (2, 3, -1, []), (4, 4, -1, []),
    # start -100 becomes -95, clamped to 0 for a negative step; end -6 becomes -1: one element.
    (-100, -6, -1, [0]), (-100, INT64_MIN, -1, [0]), (0, -1, -1, []), (0, -6, -1, [0]),
    (INT64_MAX, INT64_MIN, INT64_MIN, [4]), (4, INT64_MIN, -3, [4, 1]),
]


@pytest.mark.parametrize("version", SLICE_VERSIONS[1:])
@pytest.mark.parametrize("ind", [np.int32, np.int64])
@pytest.mark.parametrize("start,end,step,expected", SLICE_1D)
def test_slice_clamping(version, ind, start, end, step, expected):
    if ind == np.int32 and max(abs(start), abs(end), abs(step)) > 2 ** 31:
        start, end, step = (max(min(v, 2 ** 31 - 1), -2 ** 31) for v in (start, end, step))
    x = np.arange(5, dtype=np.float32)
    out = slice_op(version, x, [start], [end], axes=[0], steps=[step], ind=ind)
    assert_same(out, np.array(expected, np.float32))


@pytest.mark.parametrize("start,end,expected", [(s, e, x) for s, e, st, x in SLICE_1D if st == 1])
def test_slice_1_clamping(start, end, expected):
    assert_same(slice_op(1, np.arange(5, dtype=np.float32), [start], [end]), np.array(expected, np.float32))


@pytest.mark.parametrize("version", SLICE_VERSIONS)
@pytest.mark.parametrize("starts,ends,axes,steps,expected", [
    ([1, 0], [2, 3], [0, 1], None, [[4, 5, 6]]),            # doc example 1 (no steps)
    ([0, 1], [-1, 1000], None, None, [[1, 2, 3], [5, 6, 7]]),  # doc example 2 on 3 rows
    ([1], [3], [1], None, [[1, 2], [5, 6], [9, 10]]),
    ([1], [3], [-1], None, [[1, 2], [5, 6], [9, 10]]),
    ([0, 1], [2, 3], [-2, -1], None, [[1, 2], [5, 6]]),
    ([1, 0], [INT64_MAX, INT64_MAX], [1, 0], None, [[1, 2, 3], [5, 6, 7], [9, 10, 11]]),
    ([], [], None, None, [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]),
    ([1, 0], [2, 3], [0, 1], [1, 2], [[4, 6]]),             # doc example 1 with steps (10+)
    ([-1, -1], [INT64_MIN, INT64_MIN], [0, 1], [-1, -2], [[11, 9], [7, 5], [3, 1]]),
    ([2, 0], [0, 4], None, [-2, 3], [[8, 11]]),
    ([5], [6], [0], None, np.zeros((0, 4))),
])
@pytest.mark.parametrize("const", [False, True])
def test_slice_cases(version, starts, ends, axes, steps, expected, const):
    if version == 1 and (steps is not None or (axes and min(axes) < 0)):
        pytest.skip("steps and negative axes from version 10")
    if const and version == 1:
        pytest.skip("Slice-1 has no inputs to make constant")
    x = arange((3, 4))
    out = slice_op(version, x, starts, ends, axes, steps, const=const)
    assert_same(out, np.array(expected, np.float32).reshape(np.shape(expected)))
    assert is_readonly_view(out, x) or out.size == 0


@pytest.mark.parametrize("version", SLICE_VERSIONS[1:])
def test_slice_of_empty_axes(version):
    x = np.zeros((0, 3), np.float32)
    assert_same(slice_op(version, x, [0, -1], [10, INT64_MIN], steps=[-1, -1]), np.zeros((0, 3), np.float32))
    assert_same(slice_op(version, x, [-5], [5], axes=[0]), np.zeros((0, 3), np.float32))


@pytest.mark.parametrize("version", SLICE_VERSIONS[1:])
@pytest.mark.parametrize("starts,ends,axes,steps,pattern", [
    ([0], [2], [0], [0], "contain 0"), ([0, 0], [1, 1], [1, 1], None, "repeat"),
    ([0, 0], [1, 1], [1, -1], None, "repeat"), ([0], [1], [2], None, "out of range"),
    ([0], [1], [-3], None, "out of range"), ([0, 1], [1], None, None, "same length"),
    ([0], [1], [0], [1, 1], "same length"), ([0, 0, 0], [1, 1, 1], None, None, "out of range"),
])
@pytest.mark.parametrize("const", [False, True])
def test_slice_errors(version, starts, ends, axes, steps, pattern, const):
    with raises_naming_node(KernelError, pattern):
        slice_op(version, arange((3, 4)), starts, ends, axes, steps, const=const)


def test_slice_1_requires_starts_and_ends():
    with raises_naming_node(InvalidNodeError, "ends"):
        run_node("Slice", 1, [arange((3,))], starts=[0])


def test_constant_slice_inputs_serve_every_input_shape():
    """Constant starts/ends/axes/steps are read once and checked once per input shape (more shapes
    than the kernel keeps, each twice); a rank the axes do not fit fails at each of its runs."""
    model, _ = one_node_model("Slice", [arange((3, 4)), i64([1, -1]), i64([INT64_MAX, 0]), i64([0, -1]),
                                        i64([1, -2])], const=(1, 2, 3, 4))
    prepared = onnx_mini.prepare(model)
    for n in list(range(1, 70)) * 2:
        x = arange((2, n))
        (out,) = prepared.run([x])
        assert_same(out, x[1:, n - 1:0:-2])
        assert is_readonly_view(out, x) or out.size == 0
    for _ in range(2):
        with raises_naming_node(KernelError, "out of range"):
            prepared.run([arange(())])


def test_kernels_given_other_arrays_than_their_constants_use_those():
    """A kernel made for constant inputs still computes from the arrays it is given (the planner passes
    the constants themselves, a direct caller may not)."""
    x = arange((3, 4))
    sliced = slice_10(_constants={1: i64([1]), 2: i64([3]), 3: i64([1])})
    assert_same(sliced(x, i64([0]), i64([2]), i64([0])), x[:2])
    assert_same(sliced(x, i64([1]), i64([3])), x[1:3])
    padded = pad_18(mode="constant", _version=21, _constants={1: i64([1, 1])})
    assert_same(padded(x[0], i64([0, 2]), np.array(5.0, np.float32)), np.array([0, 1, 2, 3, 5, 5], np.float32))
    parts = split_13(axis=1, _n_outputs=2, _constants={1: i64([1, 3])})
    assert [p.shape for p in parts(x, i64([2, 2]))] == [(3, 2), (3, 2)]
    assert [p.shape for p in parts(x)] == [(3, 2), (3, 2)]


def test_constant_slice_inputs_of_a_wrong_type_fail_at_run_time():
    with raises_naming_node(KernelError, "starts must be an integer tensor"):
        run_node("Slice", 13, [arange((3,)), np.array([0.0], np.float32), i64([2])], const=(1, 2))


# -- Tile ----------------------------------------------------------------------------------------

def tile_reference(x, repeats):
    """out[i0, i1, ...] = x[i0 % d0, i1 % d1, ...]."""
    out_shape = [r * d for r, d in zip(repeats, x.shape)]
    out = np.empty(out_shape, dtype=x.dtype)
    for idx in np.ndindex(*out_shape):
        out[idx] = x[tuple(i % d for i, d in zip(idx, x.shape))]
    return out


@pytest.mark.parametrize("version,tname", type_matrix("Tile", [1, 6, 13]))
def test_tile_every_type(version, tname):
    x = sample(tname, (2, 3))
    if version == 1:  # Tile-1: `tiles` copies along one `axis`
        out = run_node("Tile", 1, [x, i64(3), i64(1)])
        assert_same(out, tile_reference(x, [1, 3]))
    else:
        assert_same(run_node("Tile", version, [x, i64([2, 3])]), tile_reference(x, [2, 3]))


@pytest.mark.parametrize("version", [6, 13])
@pytest.mark.parametrize("shape,repeats", [
    ((3,), [1]), ((3,), [4]), ((2, 3), [1, 1]), ((2, 3), [3, 1]), ((2, 1, 3), [1, 2, 2]), ((), []),
    ((2, 3), [0, 2]), ((0, 3), [2, 2]), ((2, 3), [2, 0]),
])
def test_tile_cases(version, shape, repeats):
    x = np.asarray(arange(shape) - 2.5)
    assert_same(run_node("Tile", version, [x, i64(repeats)]), tile_reference(x, repeats))


@pytest.mark.parametrize("tiles,axis", [(1, 0), (2, 0), (2, -1), (0, 1), (3, 1)])
def test_tile_1_cases(tiles, axis):
    x = arange((2, 3))
    reps = [1, 1]
    reps[axis] = tiles
    assert_same(run_node("Tile", 1, [x, i64([tiles]), i64([axis])]), tile_reference(x, reps))


@pytest.mark.parametrize("version", [6, 13])
@pytest.mark.parametrize("repeats,pattern", [([2], "one entry per"), ([2, 2, 2], "one entry per"), ([2, -1], ">= 0")])
def test_tile_errors(version, repeats, pattern):
    with raises_naming_node(KernelError, pattern):
        run_node("Tile", version, [arange((2, 3)), i64(repeats)])


def test_tile_repeats_must_be_integers():
    with raises_naming_node(KernelError, "integer"):
        run_node("Tile", 13, [arange((2, 3)), np.array([2.0, 1.0], np.float32)])


# -- Pad -----------------------------------------------------------------------------------------

PAD_VERSIONS = [1, 2, 11, 13, 18, 19, 21, 23, 24, 25]


def pad_op(version, x, pads, mode=None, value=None, axes=None, const=False):
    """value: a float attribute (1, 2) or a 0-d array of x's type (11+). const: the inputs after x as
    initializers (11+)."""
    attrs = {} if mode is None else {"mode": mode}
    if version <= 2:
        attrs["paddings" if version == 1 else "pads"] = list(pads)
        if value is not None:
            attrs["value"] = float(value)
        return run_node("Pad", version, [x], **attrs)
    inputs = [x, i64(pads)]
    if value is not None or axes is not None:
        inputs.append(None if value is None else value)
    if axes is not None:
        inputs.append(i64(axes))
    return run_node("Pad", version, inputs, const=tuple(range(1, len(inputs))) if const else (), **attrs)


def pad_reference(x, pads, mode, value=None, axes=None):
    """The spec's pads: begin/end counts per axis, negative ones remove elements. The removal is a
    slice; the addition np.pad of the sliced tensor (for constant mode, the order does not matter)."""
    r = x.ndim
    axes = list(range(r)) if axes is None else [a % r for a in axes]
    begin, end = [0] * r, [0] * r
    for i, a in enumerate(axes):
        begin[a], end[a] = pads[i], pads[i + len(axes)]
    cropped = x[tuple(slice(max(-b, 0), d - max(-e, 0)) for b, e, d in zip(begin, end, x.shape))]
    widths = [(max(b, 0), max(e, 0)) for b, e in zip(begin, end)]
    if mode == "constant":
        fill = value if value is not None else ("" if x.dtype == object else np.zeros((), x.dtype))
        return np.pad(cropped, widths, mode="constant", constant_values=np.array(fill, dtype=x.dtype))
    return np.pad(cropped, widths, mode=mode)


@pytest.mark.parametrize("version,tname", type_matrix("Pad", PAD_VERSIONS))
def test_pad_every_type(version, tname):
    x = sample(tname, (2, 3))
    pads = [1, 0, 0, 2]  # one row before, two columns after
    # Pad-1/2: a float attribute (float types only); 11+: a 0-d constant_value of the data's type.
    value = 1.5 if version <= 2 else sample(tname, (2,))[1:].reshape(())
    expected = np.empty((3, 5), dtype=x.dtype)
    expected[...] = np.asarray(value).astype(x.dtype)
    expected[1:, :3] = x
    assert_same(pad_op(version, x, pads, value=value), expected)
    # the default value: 0, False or the empty string (float8e8m0 has no zero: the all-zero bits, 2^-127)
    expected[...] = np.array("", dtype=object) if x.dtype == object else np.zeros((), x.dtype)
    expected[1:, :3] = x
    assert_same(pad_op(version, x, pads), expected)
    for mode in ("edge", "reflect") + (("wrap",) if version >= 19 else ()):
        assert_same(pad_op(version, x, [1, 0, 1, 2], mode=mode), pad_reference(x, [1, 0, 1, 2], mode))


def test_pad_doc_examples():
    data = np.array([[1.0, 1.2], [2.3, 3.4], [4.5, 5.7]], np.float32)
    assert_same(pad_op(11, data, [0, 2, 0, 0]),
                np.array([[0, 0, 1.0, 1.2], [0, 0, 2.3, 3.4], [0, 0, 4.5, 5.7]], np.float32))
    assert_same(pad_op(11, data, [0, 2, 0, 0], mode="reflect"),
                np.array([[1.0, 1.2, 1.0, 1.2], [2.3, 3.4, 2.3, 3.4], [4.5, 5.7, 4.5, 5.7]], np.float32))
    assert_same(pad_op(11, data, [0, 2, 0, 0], mode="edge"),
                np.array([[1.0, 1.0, 1.0, 1.2], [2.3, 2.3, 2.3, 3.4], [4.5, 4.5, 4.5, 5.7]], np.float32))
    assert_same(pad_op(19, data, [2, 1, 1, 1], mode="wrap"),
                np.array([[3.4, 2.3, 3.4, 2.3], [5.7, 4.5, 5.7, 4.5], [1.2, 1.0, 1.2, 1.0],
                          [3.4, 2.3, 3.4, 2.3], [5.7, 4.5, 5.7, 4.5], [1.2, 1.0, 1.2, 1.0]], np.float32))
    # Pad-2's doc example, with the value attribute.
    assert_same(pad_op(2, data, [0, 2, 0, 0], value=-1.0),
                np.array([[-1, -1, 1.0, 1.2], [-1, -1, 2.3, 3.4], [-1, -1, 4.5, 5.7]], np.float32))


PAD_CASES = [  # (shape, pads): negative pads remove elements
    ((4,), [2, 1]), ((4,), [-1, 2]), ((4,), [2, -1]), ((4,), [-1, -2]), ((4,), [-4, 0]), ((4,), [3, 3]),
    ((3, 4), [1, -1, -2, 2]), ((3, 4), [-1, 2, 1, -3]), ((3, 4), [0, 0, 0, 0]), ((3, 4), [-3, 0, 0, 1]),
    ((2, 3, 4), [1, 0, -1, 0, 2, 1]), ((2, 3, 4), [-1, 1, 1, 1, -1, -2]),
]


@pytest.mark.parametrize("version,mode", [(v, m) for v in (2, 11, 13, 18, 19, 25)
                                          for m in ("constant", "edge", "reflect", "wrap") if m != "wrap" or v >= 19])
@pytest.mark.parametrize("shape,pads", PAD_CASES)
def test_pad_modes_with_negative_pads(version, mode, shape, pads):
    x = arange(shape) * 0.5 - 1
    assert_same(pad_op(version, x, pads, mode=mode), pad_reference(x, pads, mode))


@pytest.mark.parametrize("version", [2, 11, 19])
def test_pad_reflect_mirrors_again_when_pads_exceed_the_axis(version):
    # numpy.pad's reflect, which the doc's own example relies on (pads of 2 on an axis of 2)
    x = np.array([1, 2, 3], np.float32)
    assert_same(pad_op(version, x, [0, 4], mode="reflect"), np.array([1, 2, 3, 2, 1, 2, 3], np.float32))
    assert_same(pad_op(version, x, [-2, 2], mode="reflect"), np.array([3, 3, 3], np.float32))


def test_pad_corners_extend_the_padded_ends_by_hand():
    # [[1 2 3], [4 5 6]], one row before and after, two columns before, one after: the corners come
    # from the rows already padded (each axis padded in turn).
    x = np.array([[1, 2, 3], [4, 5, 6]], np.float32)
    pads = [1, 2, 1, 1]
    assert_same(pad_op(11, x, pads, mode="reflect"), np.array([
        [6, 5, 4, 5, 6, 5], [3, 2, 1, 2, 3, 2], [6, 5, 4, 5, 6, 5], [3, 2, 1, 2, 3, 2]], np.float32))
    assert_same(pad_op(11, x, pads, mode="edge"), np.array([
        [1, 1, 1, 2, 3, 3], [1, 1, 1, 2, 3, 3], [4, 4, 4, 5, 6, 6], [4, 4, 4, 5, 6, 6]], np.float32))
    assert_same(pad_op(19, x, pads, mode="wrap"), np.array([
        [5, 6, 4, 5, 6, 4], [2, 3, 1, 2, 3, 1], [5, 6, 4, 5, 6, 4], [2, 3, 1, 2, 3, 1]], np.float32))


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad_kernel_keeps_each_shapes_plan_apart(mode):
    """One Pad kernel (its plans kept per shape and pads) called with several shapes and pads, more
    than it keeps, in turn: each call pads as its own shape and pads ask."""
    run = pad_18(mode=mode, _version=19)
    calls = [((1, 1, 8), [0, 0, 2, 0, 0, 3]), ((1, 1, 9), [0, 0, 2, 0, 0, 3]), ((1, 1, 8), [0, 0, 3, 0, 0, 1]),
             ((2, 4), [1, -1, 2, 2])] * 2 + [((3, k), [0, 1, 1, 1]) for k in range(2, 22)] + [((1, 1, 8), [0, 0, 2, 0, 0, 3])]
    for shape, pads in calls:
        x = arange(shape)
        assert_same(run(x, i64(pads)), pad_reference(x, pads, mode))


def test_pad_wrap_crop_happens_before_padding():
    # [0, 1, 2, 3] with pads (1, -1): remove the last element -> [0, 1, 2], then wrap-pad one in front.
    x = np.arange(4, dtype=np.float32)
    assert_same(pad_op(19, x, [1, -1], mode="wrap"), np.array([2, 0, 1, 2], np.float32))
    assert_same(pad_op(19, x, [-1, 3], mode="wrap"), np.array([1, 2, 3, 1, 2, 3], np.float32))


@pytest.mark.parametrize("version", [18, 19, 21, 25])
@pytest.mark.parametrize("shape,pads,axes", [
    ((1, 3, 4, 5), [0, 3, 0, 4], [1, 3]), ((1, 3, 4, 5), [0, 3, 0, 4], [-3, -1]), ((3, 4), [2, -1], [1]),
    ((3, 4), [1, 2], [-2]), ((3, 4), [], []), ((2, 3, 4), [1, 1, 0, 1], [2, 0]),
])
@pytest.mark.parametrize("mode", ["constant", "edge"])
@pytest.mark.parametrize("const", [False, True])
def test_pad_axes(version, shape, pads, axes, mode, const):
    x = arange(shape)
    value = np.array(2.5, np.float32) if mode == "constant" else None
    assert_same(pad_op(version, x, pads, mode=mode, value=value, axes=axes, const=const),
                pad_reference(x, pads, mode, value=value, axes=axes))


@pytest.mark.parametrize("version", [18, 25])
def test_pad_axes_with_omitted_constant_value(version):
    x = arange((2, 2))
    assert_same(pad_op(version, x, [1, 0], axes=[1]), np.array([[0, 0, 1], [0, 2, 3]], np.float32))


@pytest.mark.parametrize("version", [13, 18, 19, 21])
def test_pad_strings_and_bools(version):
    s = np.array([["a", "b"]], dtype=object)
    assert_same(pad_op(version, s, [0, 1, 1, 0], value=np.array("z", dtype=object)),
                np.array([["z", "a", "b"], ["z", "z", "z"]], dtype=object))
    assert_same(pad_op(version, s, [0, 1, 0, 0]), np.array([["", "a", "b"]], dtype=object))
    assert_same(pad_op(version, s, [0, 2, 0, 1], mode="edge"), np.array([["a", "a", "a", "b", "b"]], dtype=object))
    b = np.array([True, False])
    assert_same(pad_op(version, b, [1, 1]), np.array([False, True, False, False]))


@pytest.mark.parametrize("version", [2, 11, 19])
def test_pad_zero_size(version):
    x = np.zeros((0, 2), np.float32)
    assert_same(pad_op(version, x, [1, 0, 0, 1]), np.zeros((1, 3), np.float32))
    assert_same(pad_op(version, x, [0, 1, 0, 1], mode="edge"), np.zeros((0, 4), np.float32))
    with raises_naming_node(KernelError, "no elements"):
        pad_op(version, x, [1, 0, 0, 0], mode="edge")


@pytest.mark.parametrize("version", [11, 19])
def test_pad_without_padding_returns_a_view(version):
    x = arange((3, 4))
    out = pad_op(version, x, [0, -1, -1, 0], mode="reflect")
    assert_same(out, x[:2, 1:])
    assert is_readonly_view(out, x)


@pytest.mark.parametrize("version,x,pads,mode,pattern", [
    (11, arange((3, 4)), [1, 1], None, "2 \\* 2 entries"),
    (2, arange((3, 4)), [1, 1, 1], None, "2 \\* 2 entries"),
    (13, arange((3, 4)), [-2, 0, -2, 0], None, "remove more"),
    (19, arange((3, 4)), [-3, 0, 1, 0], "reflect", "no elements"),
    (11, arange((3,)), [-2, -2], "edge", "remove more"),
])
@pytest.mark.parametrize("const", [False, True])
def test_pad_errors(version, x, pads, mode, pattern, const):
    with raises_naming_node(KernelError, pattern):
        pad_op(version, x, pads, mode=mode, const=const and version >= 11)


@pytest.mark.parametrize("const", [False, True])
def test_pad_bad_inputs(const):
    with raises_naming_node(KernelError, "scalar"):
        pad_op(13, arange((2,)), [1, 1], value=np.array([1, 2], np.float32), const=const)
    with raises_naming_node(KernelError, "type"):
        pad_op(13, arange((2,)), [1, 1], value=np.array(1, np.float64), const=const)
    with raises_naming_node(KernelError, "repeat"):
        pad_op(18, arange((2, 2)), [1, 1, 1, 1], axes=[0, -2], const=const)
    with raises_naming_node(KernelError, "out of range"):
        pad_op(18, arange((2, 2)), [1, 1], axes=[2], const=const)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_constant_pads_serve_every_input_shape(mode):
    """Constant pads/constant_value/axes: the geometry made once per input shape (more shapes than the
    kernel keeps, each twice); a shape the pads remove too much of fails at each of its runs."""
    value = np.array(7.0, np.float32) if mode == "constant" else None
    model, _ = one_node_model("Pad", [arange((1, 3)), i64([2, -1, 1, 3]), value, i64([0, -1])], const=(1, 2, 3),
                              mode=mode)
    prepared = onnx_mini.prepare(model)
    for n in list(range(2, 70)) * 2:
        x = arange((3, n))
        (out,) = prepared.run([x])
        assert_same(out, pad_reference(x, [2, -1, 1, 3], mode, value=value))
    for _ in range(2):
        with raises_naming_node(KernelError, "remove more"):
            prepared.run([arange((3, 0))])
    if mode == "constant":      # the constant_value's type is checked against each data type
        wrong, _ = one_node_model("Pad", [arange((1, 3)), i64([1, 1]), np.array(7.0)], const=(1, 2))
        with raises_naming_node(KernelError, "constant_value has type float64"):
            onnx_mini.prepare(wrong).run([arange((3,))])


@pytest.mark.parametrize("version,mode", [(1, "wrap"), (11, "wrap"), (18, "wrap"), (19, "symmetric"), (25, "")])
def test_pad_unknown_mode_is_rejected_at_prepare(version, mode):
    with raises_naming_node(InvalidNodeError, "mode"):
        pad_op(version, arange((2,)), [1, 1], mode=mode)


# -- CenterCropPad -------------------------------------------------------------------------------

def crop_pad_reference(x, shape, axes=None):
    """Per axis: crop the window starting at floor((d - t) / 2), or pad floor((t - d) / 2) zeros
    before and the rest after."""
    axes = list(range(x.ndim)) if axes is None else [a % x.ndim for a in axes]
    out = x
    for a, t in zip(axes, shape):
        d = out.shape[a]
        if d >= t:
            s = (d - t) // 2
            out = np.take(out, np.arange(s, s + t), axis=a)
        else:
            widths = [(0, 0)] * x.ndim
            widths[a] = ((t - d) // 2, t - d - (t - d) // 2)
            zero = np.array("" if x.dtype == object else 0).astype(x.dtype)
            out = np.pad(out, widths, mode="constant", constant_values=zero)
    return out


@pytest.mark.parametrize("version,tname", type_matrix("CenterCropPad", [18]))
def test_center_crop_pad_every_type(version, tname):
    x = sample(tname, (5, 2))
    out = run_node("CenterCropPad", version, [x, i64([2, 5])])
    zero = np.array("" if x.dtype == object else 0).astype(x.dtype)
    expected = np.full((2, 5), zero, dtype=x.dtype)
    expected[:, 1:3] = x[1:3]   # rows: window start (5 - 2) // 2 = 1; columns: 1 before, 2 after
    assert_same(out, expected)
    assert_same(run_node("CenterCropPad", version, [x, np.array([3], np.int32)], axes=[0]), x[1:4])


@pytest.mark.parametrize("shape,target,axes", [
    ((20, 10, 3), [10, 7, 3], None), ((10, 7, 3), [20, 10, 3], None), ((20, 8, 3), [10, 10, 3], None),
    ((3, 20, 8), [10, 9], [1, 2]), ((20, 8, 3), [10, 9], [-3, -2]), ((4, 5), [4, 5], None),
    ((4, 5), [0, 6], None), ((0, 3), [2, 1], None), ((5,), [2], [-1]), ((6, 6), [3], [1]), ((2, 3), [], []),
])
def test_center_crop_pad_cases(shape, target, axes):
    x = arange(shape) + 1
    out = run_node("CenterCropPad", 18, [x, i64(target)], **({} if axes is None else {"axes": axes}))
    assert_same(out, crop_pad_reference(x, target, axes))


def test_center_crop_pad_hand_example():
    x = np.arange(1, 6, dtype=np.float32)   # [1, 2, 3, 4, 5]
    assert_same(run_node("CenterCropPad", 18, [x, i64([2])]), np.array([2, 3], np.float32))
    assert_same(run_node("CenterCropPad", 18, [x, i64([8])]), np.array([0, 1, 2, 3, 4, 5, 0, 0], np.float32))


def test_center_crop_is_a_view():
    x = arange((6, 6))
    out = run_node("CenterCropPad", 18, [x, i64([3, 4])])
    assert_same(out, x[1:4, 1:5])
    assert is_readonly_view(out, x)


@pytest.mark.parametrize("target,axes,pattern", [
    ([2, 2, 2], None, "one entry per"), ([2], None, "one entry per"), ([-1, 2], None, "negative"),
    ([2, 2], [0, 0], "repeat"), ([2], [2], "out of range"),
])
def test_center_crop_pad_errors(target, axes, pattern):
    with raises_naming_node(KernelError, pattern):
        run_node("CenterCropPad", 18, [arange((3, 4)), i64(target)], **({} if axes is None else {"axes": axes}))
