"""Spec tests for Scatter (9, 11), ScatterElements (11, 13, 16, 18), ScatterND (11, 13, 16, 18) and
TensorScatter (24).

Expected values come from plain loops transcribed from the spec's pseudocode (the reductions apply
every update in order, duplicates included) or are written by hand.
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from onnx_mini.errors import InvalidNodeError

from helpers import NODE, assert_same, expect_kernel_error, i64, np_type, run_node, run_op as run, sample, type_matrix

REDUCE = {"add": lambda a, b: a + b, "mul": lambda a, b: a * b, "max": max, "min": min}


def scatter_elements_ref(data, idx, updates, axis, reduction="none"):
    """output[.., idx[pos] (+n if < 0), ..] = f(output[...], updates[pos]) for every pos of updates."""
    axis %= data.ndim
    n = data.shape[axis]
    out = data.copy()
    for pos in np.ndindex(*idx.shape):
        k = int(idx[pos])
        assert -n <= k < n
        target = pos[:axis] + (k + n if k < 0 else k,) + pos[axis + 1:]
        out[target] = updates[pos] if reduction == "none" else REDUCE[reduction](out[target], updates[pos])
    return out


def scatter_nd_ref(data, idx, updates, reduction="none"):
    """The spec's loop: output[indices[i]] = f(output[indices[i]], updates[i]) over i in indices.shape[:-1]."""
    out = data.copy()
    for i in np.ndindex(*idx.shape[:-1]):
        target = tuple(int(v) + data.shape[j] if v < 0 else int(v) for j, v in enumerate(idx[i]))
        if reduction == "none":
            out[target] = updates[i]
        else:
            cur = np.array(out[target])  # a slice or an element
            for p in np.ndindex(*cur.shape):
                cur[p] = REDUCE[reduction](cur[p], np.asarray(updates[i])[p])
            out[target] = cur
    return out


# -- Scatter / ScatterElements -------------------------------------------------------------------

ELEMENTS = [("Scatter", v) for v in (9, 11)] + [("ScatterElements", v) for v in (11, 13, 16, 18)]


def elements_matrix():
    return [pytest.param(op, p.values[0], p.values[1], id=f"{op}-{p.id}")
            for op in ("Scatter", "ScatterElements")
            for p in type_matrix(op, [v for o, v in ELEMENTS if o == op])]


@pytest.mark.parametrize("op,version,tname", elements_matrix())
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_scatter_elements_every_type(op, version, tname, axis):
    data = sample(tname, (3, 4))
    updates = sample(tname, (2, 3))[:, ::-1].copy()
    # no duplicate targets: along axis 0 columns differ; along axis 1 rows differ
    idx = i64([[2, 0, -1], [1, -3, 0]]) if axis == 0 else i64([[3, -4, 1], [0, 2, -1]])
    assert_same(run(op, version, [data, idx, updates], axis=axis), scatter_elements_ref(data, idx, updates, axis))


@pytest.mark.parametrize("op,version", ELEMENTS)
def test_scatter_elements_spec_examples(op, version):
    data = np.zeros((3, 3), np.float32)
    idx = i64([[1, 0, 2], [0, 2, 1]])
    updates = np.array([[1.0, 1.1, 1.2], [2.0, 2.1, 2.2]], np.float32)
    assert_same(run(op, version, [data, idx, updates]),
                np.array([[2.0, 1.1, 0.0], [1.0, 0.0, 2.2], [0.0, 2.1, 1.2]], np.float32))
    data = np.array([[1.0, 2.0, 3.0, 4.0, 5.0]], np.float32)
    for idx in ([[1, 3]], [[1, -2]], [[-4, 3]]):
        out = run(op, version, [data, np.array(idx, np.int32), np.array([[1.1, 2.1]], np.float32)], axis=1)
        assert_same(out, np.array([[1.0, 1.1, 3.0, 2.1, 5.0]], np.float32))


@pytest.mark.parametrize("op,version", ELEMENTS)
@pytest.mark.parametrize("ind_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("rank,axis", [(r, a) for r in (1, 2, 3) for a in range(-r, r)])
def test_scatter_elements_ranks_axes(op, version, ind_dtype, rank, axis):
    rng = np.random.default_rng(10 * rank + axis)
    dshape = (4, 5, 3)[:rank]
    a = axis % rank
    # indices smaller than data on every dim; distinct targets along the axis (a permutation prefix)
    ishape = tuple(max(1, d - 1) for d in dshape)
    n = dshape[a]
    perm = np.argsort(rng.random(ishape[:a] + (n,) + ishape[a + 1:]), axis=a)
    idx = np.take(perm, np.arange(ishape[a]), axis=a) - rng.integers(0, 2, size=ishape) * n
    data = rng.integers(-50, 50, size=dshape).astype(np.int64)
    updates = rng.integers(100, 200, size=ishape).astype(np.int64)
    out = run(op, version, [data, idx.astype(ind_dtype), updates], axis=axis)
    assert_same(out, scatter_elements_ref(data, idx, updates, axis))


@pytest.mark.parametrize("version,reduction", [(v, r) for v in (16, 18) for r in ("add", "mul")]
                         + [(18, "max"), (18, "min")])
@pytest.mark.parametrize("tname", ["float", "double", "float16", "bfloat16", "int32", "int64", "uint8", "int8"])
@pytest.mark.parametrize("axis", [0, 1])
def test_scatter_elements_reductions_with_duplicates(version, reduction, tname, axis):
    dt = np_type(tname)
    data = np.array([[1, 2, 3], [4, 5, 6], [7, 3, 2]]).astype(dt)
    if axis == 0:  # column 0 hits row 1 three times (once as -2), column 2 hits row 2 three times
        idx = i64([[1, 0, 2], [1, 2, 2], [-2, 0, 2]])
        updates = np.array([[2, 3, 1], [3, 1, 2], [5, 2, 2]]).astype(dt)
    else:
        idx = i64([[1, 1, -2], [0, 2, 0]])
        updates = np.array([[2, 3, 1], [3, 1, 2]]).astype(dt)
    expected = scatter_elements_ref(data, idx, updates, axis, reduction)
    assert_same(run("ScatterElements", version, [data, idx, updates], axis=axis, reduction=reduction), expected)


def test_scatter_elements_float16_add_rounds_once():
    # 2048 + 1 + 1 in float16 step by step stays 2048 (ties to even); in float32 it is 2050.
    data = np.array([2048.0], np.float16)
    out = run("ScatterElements", 16, [data, i64([0, 0]), np.array([1.0, 1.0], np.float16)], reduction="add")
    assert_same(out, np.array([2050.0], np.float16))


@pytest.mark.parametrize("version", [16, 18])
def test_scatter_elements_reduction_bool_and_complex(version):
    data = np.array([True, False, False])
    out = run("ScatterElements", version, [data, i64([1, 1, 0]), np.array([False, True, False])], reduction="add")
    assert_same(out, np.array([True, True, False]))  # + on bool is "or"
    data = np.array([1 + 1j, 2], np.complex64)
    out = run("ScatterElements", version, [data, i64([0, 0]), np.array([1j, 2], np.complex64)], reduction="mul")
    assert_same(out, np.array([(1 + 1j) * 1j * 2, 2], np.complex64))


@pytest.mark.parametrize("version", [16, 18])
def test_scatter_elements_string_reduction_is_an_error(version):
    data = np.array(["a", "b"], dtype=object)
    expect_kernel_error("ScatterElements", version, [data, i64([0]), np.array(["c"], dtype=object)], "string",
                        reduction="add")


@pytest.mark.parametrize("version,reduction", [(11, "add"), (13, "add"), (16, "max"), (16, "min"), (18, "sum"),
                                               (18, "none ")])
def test_scatter_elements_reduction_not_in_version(version, reduction):
    with pytest.raises((InvalidNodeError,)) as info:
        run_node("ScatterElements", version, [np.zeros(3, np.float32), i64([0]), np.ones(1, np.float32)],
                  reduction=reduction)
    assert NODE in str(info.value) and "reduction" in str(info.value)


@pytest.mark.parametrize("op,version", ELEMENTS)
@pytest.mark.parametrize("tname", ["float", "string", "int8"])
@pytest.mark.parametrize("ishape,axis", [((0, 3), 0), ((2, 0), 1), ((0, 0), -1)])
def test_scatter_elements_empty_indices(op, version, tname, ishape, axis):
    data = sample(tname, (2, 3))
    out = run(op, version, [data, np.zeros(ishape, np.int64), sample(tname, ishape)], axis=axis)
    assert_same(out, sample(tname, (2, 3)))


@pytest.mark.parametrize("op,version", ELEMENTS)
@pytest.mark.parametrize("ind_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("axis,bad", [(0, 2), (0, -3), (1, 3), (1, -4), (-1, 77)])
def test_scatter_elements_out_of_range(op, version, ind_dtype, axis, bad):
    data = np.zeros((2, 3), np.float32)
    idx = np.array([[0, bad]], dtype=ind_dtype)
    expect_kernel_error(op, version, [data, idx, np.ones((1, 2), np.float32)], rf"index {bad}\b", "out of bounds",
                        axis=axis)


@pytest.mark.parametrize("op,version", ELEMENTS)
def test_scatter_elements_shape_errors(op, version):
    data = np.zeros((2, 3), np.float32)
    expect_kernel_error(op, version, [data, i64([[0, 1]]), np.ones((1, 3), np.float32)], "same shape")
    expect_kernel_error(op, version, [data, i64([0, 1]), np.ones(2, np.float32)], "rank")
    expect_kernel_error(op, version, [data, np.zeros((3, 1), np.int64), np.ones((3, 1), np.float32)], "larger",
                        axis=1)
    expect_kernel_error(op, version, [data, i64([[0]]), np.ones((1, 1), np.float32)], "axis", axis=2)


# -- ScatterND -----------------------------------------------------------------------------------

ND_VERSIONS = [11, 13, 16, 18]


@pytest.mark.parametrize("version,tname", type_matrix("ScatterND", ND_VERSIONS))
def test_scatter_nd_every_type(version, tname):
    data = sample(tname, (2, 3, 4))
    idx = i64([[1, -1], [0, 0], [-2, 1]])                  # k = 2: rows of 4
    updates = sample(tname, (3, 4))[::-1].copy()
    assert_same(run("ScatterND", version, [data, idx, updates]), scatter_nd_ref(data, idx, updates))
    idx = i64([[[1, 2, 3]], [[0, -3, -4]]])               # k = r: elements
    updates = sample(tname, (2, 1))
    assert_same(run("ScatterND", version, [data, idx, updates]), scatter_nd_ref(data, idx, updates))


@pytest.mark.parametrize("version", ND_VERSIONS)
def test_scatter_nd_spec_examples(version):
    data = i64([1, 2, 3, 4, 5, 6, 7, 8])
    out = run("ScatterND", version, [data, i64([[4], [3], [1], [7]]), i64([9, 10, 11, 12])])
    assert_same(out, i64([1, 11, 3, 10, 9, 6, 7, 12]))
    block = [[1, 2, 3, 4], [5, 6, 7, 8], [8, 7, 6, 5], [4, 3, 2, 1]]
    other = [[8, 7, 6, 5], [4, 3, 2, 1], [1, 2, 3, 4], [5, 6, 7, 8]]
    data = np.array([block, block, other, other], np.float32)
    ups = np.array([[[5] * 4, [6] * 4, [7] * 4, [8] * 4], [[1] * 4, [2] * 4, [3] * 4, [4] * 4]], np.float32)
    out = run("ScatterND", version, [data, i64([[0], [2]]), ups])
    assert_same(out, np.array([ups[0], block, ups[1], other], np.float32))


@pytest.mark.parametrize("version,reduction", [(v, r) for v in (16, 18) for r in ("add", "mul")]
                         + [(18, "max"), (18, "min")])
@pytest.mark.parametrize("tname", ["float", "float16", "bfloat16", "int32", "int64", "uint16", "double"])
def test_scatter_nd_reductions_with_duplicates(version, reduction, tname):
    dt = np_type(tname)
    data = np.array([[1, 2, 3], [4, 5, 6], [2, 1, 3]]).astype(dt)
    idx = i64([[0], [2], [0], [-3]])                        # row 0 three times (once as -3)
    updates = np.array([[2, 1, 3], [3, 3, 1], [1, 4, 2], [2, 0, 1]]).astype(dt)
    out = run("ScatterND", version, [data, idx, updates], reduction=reduction)
    assert_same(out, scatter_nd_ref(data, idx, updates, reduction))
    idx = i64([[1, 1], [1, 1], [0, 2], [-2, -2]])           # element (1, 1) three times
    updates = np.array([3, 2, 1, 2]).astype(dt)
    out = run("ScatterND", version, [data, idx, updates], reduction=reduction)
    assert_same(out, scatter_nd_ref(data, idx, updates, reduction))


@pytest.mark.parametrize("version", ND_VERSIONS)
@pytest.mark.parametrize("dshape,ishape", [((4, 5, 6), (3, 1)), ((4, 5, 6), (2, 2, 2)), ((4, 5, 6), (7, 3)),
                                           ((6,), (1,)), ((4, 5), (2, 2, 1))])
def test_scatter_nd_random_distinct(version, dshape, ishape):
    rng = np.random.default_rng(sum(dshape) + sum(ishape))
    k = ishape[-1]
    m = math.prod(ishape[:-1])
    flat = rng.choice(math.prod(dshape[:k]), size=m, replace=False)
    idx = np.stack(np.unravel_index(flat, dshape[:k]), axis=-1).reshape(ishape).astype(np.int64)
    idx = idx - rng.integers(0, 2, size=ishape) * np.array(dshape[:k])  # some negatives
    data = rng.standard_normal(dshape)
    updates = rng.standard_normal(ishape[:-1] + dshape[k:])
    assert_same(run("ScatterND", version, [data, idx, updates]), scatter_nd_ref(data, idx, updates))


@pytest.mark.parametrize("version", ND_VERSIONS)
@pytest.mark.parametrize("tname", ["float", "string"])
def test_scatter_nd_empty(version, tname):
    data = sample(tname, (2, 3))
    assert_same(run("ScatterND", version, [data, np.zeros((0, 1), np.int64), sample(tname, (0, 3))]), data)
    assert_same(run("ScatterND", version, [data, np.zeros((0, 2), np.int64), sample(tname, (0,))]), data)
    empty = sample(tname, (0, 3))
    assert_same(run("ScatterND", version, [empty, np.zeros((0, 1), np.int64), sample(tname, (0, 3))]), empty)


@pytest.mark.parametrize("version", ND_VERSIONS)
@pytest.mark.parametrize("idx,bad", [([[0, 3]], 3), ([[2, 0]], 2), ([[-3, 0]], -3), ([[1, -4]], -4)])
def test_scatter_nd_out_of_range(version, idx, bad):
    data = np.zeros((2, 3), np.float32)
    expect_kernel_error("ScatterND", version, [data, i64(idx), np.ones(1, np.float32)], rf"index {bad}\b",
                        "out of bounds")


@pytest.mark.parametrize("version", ND_VERSIONS)
def test_scatter_nd_shape_errors(version):
    data = np.zeros((2, 3), np.float32)
    expect_kernel_error("ScatterND", version, [data, i64([[0]]), np.ones((1, 2), np.float32)], "updates")
    expect_kernel_error("ScatterND", version, [data, i64([[0, 0, 0]]), np.ones(1, np.float32)], r"shape\[-1\]")
    expect_kernel_error("ScatterND", version, [data, np.array([[0]], np.int32), np.ones((1, 3), np.float32)],
                        "int64")


@pytest.mark.parametrize("version,reduction", [(11, "add"), (16, "max"), (18, "prod")])
def test_scatter_nd_reduction_not_in_version(version, reduction):
    with pytest.raises(InvalidNodeError, match=NODE):
        run_node("ScatterND", version, [np.zeros(3, np.float32), i64([[0]]), np.ones(1, np.float32)],
                  reduction=reduction)


# -- TensorScatter -------------------------------------------------------------------------------

def tensor_scatter_ref(past, update, write_indices, axis, mode):
    """The spec's pseudocode."""
    axis %= past.ndim
    out = past.copy()
    max_len, seq_len = past.shape[axis], update.shape[axis]
    for prefix in np.ndindex(*past.shape[:axis]):
        for s in range(seq_len):
            c = (0 if write_indices is None else int(write_indices[prefix[0]])) + s
            if mode == "circular":
                c %= max_len
            out[prefix + (c,)] = update[prefix + (s,)]
    return out


@pytest.mark.parametrize("version,tname", type_matrix("TensorScatter", [24]))
@pytest.mark.parametrize("mode", ["linear", "circular"])
def test_tensor_scatter_every_type(version, tname, mode):
    past = sample(tname, (2, 3, 5, 2))
    update = sample(tname, (2, 3, 2, 2))[::-1].copy()
    starts = i64([3, 0]) if mode == "linear" else i64([4, 1])
    out = run("TensorScatter", version, [past, update, starts], mode=mode)
    assert_same(out, tensor_scatter_ref(past, update, starts, -2, mode))


@pytest.mark.parametrize("mode", ["linear", "circular"])
@pytest.mark.parametrize("pshape,ushape,axis", [
    ((2, 4, 5), (2, 2, 5), -2), ((2, 4, 5), (2, 4, 1), 2), ((2, 4, 5), (2, 4, 5), -1), ((3, 6), (3, 2), 1),
    ((2, 3, 6, 2), (2, 3, 4, 2), 2), ((2, 5, 3, 2), (2, 1, 3, 2), 1), ((2, 4, 3), (2, 0, 3), 1),
])
def test_tensor_scatter_axes(mode, pshape, ushape, axis):
    rng = np.random.default_rng(sum(pshape) + axis)
    past = rng.standard_normal(pshape).astype(np.float32)
    update = rng.standard_normal(ushape).astype(np.float32)
    max_len, seq_len = pshape[axis], ushape[axis]
    starts = rng.integers(0, max_len - seq_len + 1, size=pshape[0]) if mode == "linear" else \
        rng.integers(0, max_len, size=pshape[0])
    out = run("TensorScatter", 24, [past, update, starts], mode=mode, axis=axis)
    assert_same(out, tensor_scatter_ref(past, update, starts, axis, mode))


def test_tensor_scatter_spec_examples():
    row = [[1, 2, 3, 4, 5], [5, 6, 7, 8, 9], [8, 7, 6, 5, 4], [4, 3, 2, 1, 0]]
    past = np.array([[row], [row]], np.float32)
    update = np.array([[[[5] * 5]], [[[1] * 5]]], np.float32)
    out = run("TensorScatter", 24, [past, update, i64([1, 2])], mode="linear")
    assert_same(out, np.array([[[row[0], [5] * 5, row[2], row[3]]], [[row[0], row[1], [1] * 5, row[3]]]],
                              np.float32))
    update = np.array([[[[5] * 5, [6] * 5]], [[[1] * 5, [2] * 5]]], np.float32)
    out = run("TensorScatter", 24, [past, update, i64([1, 3])], mode="circular")
    assert_same(out, np.array([[[row[0], [5] * 5, [6] * 5, row[3]]], [[[2] * 5, row[1], row[2], [1] * 5]]],
                              np.float32))


@pytest.mark.parametrize("mode", ["linear", "circular"])
def test_tensor_scatter_without_write_indices(mode):
    past = np.zeros((2, 4, 3), ml_dtypes.bfloat16)
    update = np.ones((2, 2, 3), ml_dtypes.bfloat16)
    expected = tensor_scatter_ref(past, update, None, -2, mode)
    assert_same(run_node("TensorScatter", 24, [past, update], mode=mode), expected)
    assert_same(run_node("TensorScatter", 24, [past, update, None], keep_empty_tail=True, mode=mode), expected)


def test_tensor_scatter_errors():
    past, update = np.zeros((2, 4, 3), np.float32), np.ones((2, 2, 3), np.float32)
    expect_kernel_error("TensorScatter", 24, [past, update, i64([3, 0])], r"\b3\b", "linear")
    expect_kernel_error("TensorScatter", 24, [past, update, i64([0, -1])], r"-1\b")
    expect_kernel_error("TensorScatter", 24, [past, update, i64([0, 0])], "axis", axis=0)
    expect_kernel_error("TensorScatter", 24, [past, np.ones((2, 5, 3), np.float32)], "sequence length")
    expect_kernel_error("TensorScatter", 24, [past, np.ones((2, 2, 2), np.float32)], "match")
    expect_kernel_error("TensorScatter", 24, [past, update, i64([0])], "write_indices")
    with pytest.raises(InvalidNodeError, match=NODE):
        run_node("TensorScatter", 24, [past, update], mode="ring")


def test_scatter_large_inputs():
    rng = np.random.default_rng(5)
    data = rng.standard_normal((400, 300)).astype(np.float32)
    idx = rng.integers(-400, 400, size=(300, 300))
    updates = rng.standard_normal((300, 300)).astype(np.float32)
    out = run("ScatterElements", 18, [data, idx, updates], axis=0, reduction="add")
    expected = data.astype(np.float64)
    cols = np.broadcast_to(np.arange(300), idx.shape)
    np.add.at(expected, (np.where(idx < 0, idx + 400, idx), cols), updates.astype(np.float64))
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    assert out.dtype == np.float32


@pytest.mark.parametrize("version,reduction", [(16, "add"), (16, "mul"), (18, "max"), (18, "min")])
@pytest.mark.parametrize("rows", [[3, 0, 4], [3, 0, 3, -2, 1]])   # distinct / with duplicates
@pytest.mark.parametrize("tname", ["float", "float16", "int32"])
def test_scatter_nd_reductions_on_wide_rows(version, reduction, rows, tname):
    rng = np.random.default_rng(len(rows))
    dt = np_type(tname)
    data = rng.integers(-3, 4, size=(5, 2, 6)).astype(dt)
    idx = i64([[r] for r in rows])
    updates = rng.integers(-3, 4, size=(len(rows), 2, 6)).astype(dt)
    out = run("ScatterND", version, [data, idx, updates], reduction=reduction)
    assert_same(out, scatter_nd_ref(data, idx, updates, reduction))
