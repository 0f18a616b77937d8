"""Spec tests for Gather (1, 11, 13) and GatherND (11, 12, 13).

Expected values come from plain loops written from the spec text (gather_ref, gather_nd_ref) or by hand.
"""
from __future__ import annotations

import numpy as np
import pytest

from onnx_mini.errors import InvalidNodeError, OnnxMiniError

from helpers import (NODE, assert_same, expect_kernel_error, i64, np_type, run_node, run_op as run, sample,
                     type_matrix)

# -- Gather --------------------------------------------------------------------------------------

GATHER_VERSIONS = [1, 11, 13]


def gather_ref(data: np.ndarray, idx: np.ndarray, axis: int) -> np.ndarray:
    """output[i_0..i_{axis-1}, j.., k..] = data[i_0.., idx[j..] (+n if negative), k..]."""
    axis %= data.ndim
    n = data.shape[axis]
    shape = data.shape[:axis] + idx.shape + data.shape[axis + 1:]
    out = np.empty(shape, dtype=data.dtype)
    for pos in np.ndindex(*shape):
        j = pos[axis:axis + idx.ndim]
        k = int(idx[j])
        assert -n <= k < n
        out[pos] = data[pos[:axis] + (k + n if k < 0 else k,) + pos[axis + idx.ndim:]]
    return out


@pytest.mark.parametrize("version,tname", type_matrix("Gather", GATHER_VERSIONS))
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_every_type(version, tname, axis):
    data = sample(tname, (3, 4))
    idx = i64([[2, 0], [-1, 1]]) if axis == 0 else i64([[3, -4, 0], [1, 2, -1]])
    assert_same(run("Gather", version, [data, idx], axis=axis), gather_ref(data, idx, axis))


@pytest.mark.parametrize("version", GATHER_VERSIONS)
@pytest.mark.parametrize("ind_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("rank,axis", [(r, a) for r in (1, 2, 3) for a in range(-r, r)])
@pytest.mark.parametrize("ishape", [(), (4,), (2, 3)])
def test_gather_ranks_axes_and_index_shapes(version, ind_dtype, rank, axis, ishape):
    rng = np.random.default_rng(10 * rank + axis)
    dshape = (3, 4, 2)[:rank]
    n = dshape[axis]
    data = rng.integers(-100, 100, size=dshape).astype(np.float32)
    idx = np.asarray(rng.integers(-n, n, size=ishape)).astype(ind_dtype)
    out = run("Gather", version, [data, idx], axis=axis)
    assert_same(out, gather_ref(data, idx, axis))
    assert out.ndim == rank - 1 + len(ishape)  # a scalar index drops the axis


@pytest.mark.parametrize("version", GATHER_VERSIONS)
def test_gather_spec_examples(version):
    data = np.array([[1.0, 1.2], [2.3, 3.4], [4.5, 5.7]], np.float32)
    out = run("Gather", version, [data, i64([[0, 1], [1, 2]])])
    assert_same(out, np.array([[[1.0, 1.2], [2.3, 3.4]], [[2.3, 3.4], [4.5, 5.7]]], np.float32))
    data = np.array([[1.0, 1.2, 1.9], [2.3, 3.4, 3.9], [4.5, 5.7, 5.9]], np.float32)
    out = run("Gather", version, [data, i64([[0, 2]])], axis=1)
    assert_same(out, np.array([[[1.0, 1.9]], [[2.3, 3.9]], [[4.5, 5.9]]], np.float32))


@pytest.mark.parametrize("version", GATHER_VERSIONS)
def test_gather_scalar_index_of_vector_is_0d_array(version):
    out = run("Gather", version, [np.array([5, 6, 7], np.int16), np.array(-1, np.int32)])
    assert_same(out, np.array(7, np.int16))
    out = run("Gather", version, [np.array(["a", "b"], dtype=object), np.array(0, np.int64)])
    assert_same(out, np.array("a", dtype=object))


@pytest.mark.parametrize("version", GATHER_VERSIONS)
@pytest.mark.parametrize("tname", ["float", "string", "bool"])
@pytest.mark.parametrize("dshape,ishape,axis,oshape", [
    ((3, 4), (0,), 0, (0, 4)), ((3, 4), (2, 0), 1, (3, 2, 0)), ((0, 4), (0, 2), 0, (0, 2, 4)),
    ((3, 0), (2,), 0, (2, 0)), ((0, 4), (3,), 1, (0, 3)),
])
def test_gather_zero_size(version, tname, dshape, ishape, axis, oshape):
    idx = np.full(ishape, 1, np.int64)
    out = run("Gather", version, [sample(tname, dshape), idx], axis=axis)
    assert type(out) is np.ndarray and out.dtype == np_type(tname) and out.shape == oshape


@pytest.mark.parametrize("version", GATHER_VERSIONS)
@pytest.mark.parametrize("ind_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("axis,bad", [(0, 3), (0, -4), (1, 4), (1, -5), (-1, 1000)])
def test_gather_out_of_range(version, ind_dtype, axis, bad):
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    idx = np.array([[0, 1], [bad, 2]], dtype=ind_dtype)
    expect_kernel_error("Gather", version, [data, idx], rf"index {bad}\b", "out of bounds", axis=axis)


@pytest.mark.parametrize("version", GATHER_VERSIONS)
def test_gather_out_of_range_on_empty_axis(version):
    expect_kernel_error("Gather", version, [np.zeros((0, 2), np.float32), i64([0])], r"index 0\b")


@pytest.mark.parametrize("version", GATHER_VERSIONS)
@pytest.mark.parametrize("axis", [2, -3])
def test_gather_axis_out_of_range(version, axis):
    expect_kernel_error("Gather", version, [np.zeros((2, 3), np.float32), i64([0])], "axis", axis=axis)


@pytest.mark.parametrize("version", GATHER_VERSIONS)
def test_gather_rejects_scalar_data_and_float_indices(version):
    expect_kernel_error("Gather", version, [np.array(1.0, np.float32), i64(0)], "rank")
    expect_kernel_error("Gather", version, [np.zeros(3, np.float32), np.array([0.0], np.float32)], "int32|int64")


# -- GatherND ------------------------------------------------------------------------------------

GATHERND_VERSIONS = [11, 12, 13]


def gather_nd_ref(data: np.ndarray, idx: np.ndarray, b: int = 0) -> np.ndarray:
    """output[batch.., middle.., rest..] = data[batch.., *idx[batch.., middle..] (+dim if < 0), rest..]."""
    k = idx.shape[-1]
    rest = data.shape[b + k:]
    shape = idx.shape[:-1] + rest
    out = np.empty(shape, dtype=data.dtype)
    for pos in np.ndindex(*shape):
        lead, tail = pos[:idx.ndim - 1], pos[idx.ndim - 1:]
        tup = []
        for j, v in enumerate(idx[lead]):
            n = data.shape[b + j]
            assert -n <= v < n
            tup.append(int(v) + n if v < 0 else int(v))
        out[pos] = data[lead[:b] + tuple(tup) + tail]
    return out


@pytest.mark.parametrize("version,tname", type_matrix("GatherND", GATHERND_VERSIONS))
def test_gather_nd_every_type(version, tname):
    data = sample(tname, (2, 3, 4))
    idx = i64([[[1, -1], [0, 2]], [[-2, 0], [1, 1]]])  # k = 2 < r: slices of shape (4,)
    assert_same(run("GatherND", version, [data, idx]), gather_nd_ref(data, idx))
    idx = i64([[1, 2, -1], [0, -3, 0]])                 # k = r: scalars
    assert_same(run("GatherND", version, [data, idx]), gather_nd_ref(data, idx))


@pytest.mark.parametrize("version,tname", type_matrix("GatherND", GATHERND_VERSIONS[1:]))
def test_gather_nd_batch_dims_every_type(version, tname):
    data = sample(tname, (2, 3, 4))
    idx = i64([[[2], [-1]], [[0], [1]]])
    assert_same(run("GatherND", version, [data, idx], batch_dims=1), gather_nd_ref(data, idx, 1))


GATHERND_EXAMPLES = [   # the spec's examples 1-5, and negative indices
    ([[0, 1], [2, 3]], [[0, 0], [1, 1]], 0, [0, 3]),
    ([[0, 1], [2, 3]], [[1], [0]], 0, [[2, 3], [0, 1]]),
    ([[[0, 1], [2, 3]], [[4, 5], [6, 7]]], [[0, 1], [1, 0]], 0, [[2, 3], [4, 5]]),
    ([[[0, 1], [2, 3]], [[4, 5], [6, 7]]], [[[0, 1]], [[1, 0]]], 0, [[[2, 3]], [[4, 5]]]),
    ([[[0, 1], [2, 3]], [[4, 5], [6, 7]]], [[1], [0]], 1, [[2, 3], [4, 5]]),
    ([[0, 1], [2, 3]], [[-1, -2], [-2, -1]], 0, [2, 1]),
]


@pytest.mark.parametrize("version,data,idx,batch_dims,expected",   # batch_dims appears in GatherND-12
                         [(v, *c) for v in GATHERND_VERSIONS for c in GATHERND_EXAMPLES if v >= 12 or not c[2]])
def test_gather_nd_spec_examples(version, data, idx, batch_dims, expected):
    attrs = {"batch_dims": batch_dims} if version >= 12 else {}
    out = run("GatherND", version, [np.array(data, np.int32), i64(idx)], **attrs)
    assert_same(out, np.array(expected, np.int32))


@pytest.mark.parametrize("version", GATHERND_VERSIONS[1:])
@pytest.mark.parametrize("dshape,ishape,b", [
    ((2, 3, 4, 5), (2, 6, 2), 1), ((2, 3, 4, 5), (2, 3, 2), 2), ((2, 3, 4, 5), (2, 3, 7, 1), 2),
    ((2, 3, 4), (2, 3, 1), 2), ((2, 3, 4), (2, 1), 1), ((2, 3, 4, 5), (2, 3, 4, 2, 1), 3),
    ((3, 4), (2, 5, 2), 0), ((3, 4), (1,), 0), ((3, 4), (2,), 0),
])
def test_gather_nd_random(version, dshape, ishape, b):
    rng = np.random.default_rng(sum(dshape) + 7 * b)
    data = rng.standard_normal(dshape).astype(np.float32)
    k = ishape[-1]
    cols = [rng.integers(-dshape[b + j], dshape[b + j], size=ishape[:-1]) for j in range(k)]
    idx = np.stack(cols, axis=-1).astype(np.int64)
    out = run("GatherND", version, [data, idx], batch_dims=b)
    assert_same(out, gather_nd_ref(data, idx, b))


@pytest.mark.parametrize("version", GATHERND_VERSIONS)
@pytest.mark.parametrize("dshape,ishape,oshape", [
    ((3, 4), (0, 2), (0,)), ((3, 4), (0, 1), (0, 4)), ((3, 0), (2, 1), (2, 0)), ((0, 3), (0, 1), (0, 3)),
])
def test_gather_nd_zero_size(version, dshape, ishape, oshape):
    out = run("GatherND", version, [np.zeros(dshape, np.float64), np.zeros(ishape, np.int64)])
    assert_same(out, np.zeros(oshape, np.float64))


@pytest.mark.parametrize("version", GATHERND_VERSIONS)
@pytest.mark.parametrize("idx,bad", [([[0, 1], [2, 0]], 2), ([[0, 3], [1, 0]], 3), ([[-3, 0]], -3),
                                     ([[1, -4]], -4), ([[0, 100]], 100)])
def test_gather_nd_out_of_range(version, idx, bad):
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    expect_kernel_error("GatherND", version, [data, i64(idx)], rf"index {bad}\b", "out of bounds")


@pytest.mark.parametrize("version", GATHERND_VERSIONS[1:])
def test_gather_nd_batch_dims_errors(version):
    data = np.zeros((2, 3, 4), np.float32)
    expect_kernel_error("GatherND", version, [data, np.zeros((3, 1), np.int64)], "batch", batch_dims=1)
    expect_kernel_error("GatherND", version, [data, np.zeros((2, 3), np.int64)], "batch_dims", batch_dims=2)
    expect_kernel_error("GatherND", version, [data, np.zeros((2, 3, 3), np.int64)], r"shape\[-1\]",
                        batch_dims=1)
    expect_kernel_error("GatherND", version, [data, np.array([[2, 0]], np.int64)], r"index 2\b", batch_dims=0)
    with pytest.raises(InvalidNodeError, match=NODE):
        run_node("GatherND", version, [data, np.zeros((2, 1), np.int64)], batch_dims=-1)


@pytest.mark.parametrize("version", GATHERND_VERSIONS)
def test_gather_nd_index_tuple_too_long_and_int32(version):
    data = np.zeros((2, 3), np.float32)
    expect_kernel_error("GatherND", version, [data, np.zeros((1, 3), np.int64)], r"shape\[-1\]")
    expect_kernel_error("GatherND", version, [data, np.zeros((1, 2), np.int32)], "int64")


def test_gather_nd_11_has_no_batch_dims():
    with pytest.raises(OnnxMiniError, match="batch_dims"):
        run_node("GatherND", 11, [np.zeros((2, 3), np.float32), np.zeros((2, 1), np.int64)], batch_dims=1)


def test_gather_large_matches_take():
    rng = np.random.default_rng(3)
    data = rng.standard_normal((300, 200)).astype(np.float32)
    idx = rng.integers(-200, 200, size=(50, 40))
    # spec: output[p, i, j] = data[p, idx[i, j] (+200 when negative)]
    expected = data[:, np.where(idx < 0, idx + 200, idx)]
    assert_same(run("Gather", 13, [data, idx], axis=1), expected)
    idx2 = np.stack([rng.integers(0, 300, 1000), rng.integers(-200, 200, 1000)], axis=-1)
    expected = data[idx2[:, 0], np.where(idx2[:, 1] < 0, idx2[:, 1] + 200, idx2[:, 1])]
    assert_same(run("GatherND", 13, [data, idx2]), expected)
