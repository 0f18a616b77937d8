"""Spec tests for Squeeze, Unsqueeze, Transpose, DepthToSpace, SpaceToDepth and Size.

Expected values are hand-written or computed by formulas transcribed from the ONNX spec text
(DepthToSpace's reshape/transpose recipe is quoted in its doc).
"""
from __future__ import annotations

import numpy as np
import pytest

import onnx_mini
from onnx_mini.errors import InvalidNodeError, KernelError
from onnx_mini.ops.tensor.reshape import reshape_14, squeeze_13, unsqueeze_13

from helpers import (arange, assert_same, i64, is_readonly_view, one_node_model, raises_naming_node, run_node, sample,
                     type_matrix)

# -- Squeeze -------------------------------------------------------------------------------------

SQUEEZE_VERSIONS = [1, 11, 13, 21, 23, 24, 25]


def squeeze(version, data, axes=None, const=False):
    """const: the axes input (13+) as an initializer."""
    if version < 13:
        return run_node("Squeeze", version, [data], **({} if axes is None else {"axes": list(axes)}))
    return run_node("Squeeze", version, [data] + ([] if axes is None else [i64(axes)]),
                    const=(1,) if const and axes is not None else ())


@pytest.mark.parametrize("version,tname", type_matrix("Squeeze", SQUEEZE_VERSIONS))
def test_squeeze_every_type(version, tname):
    data = sample(tname, (1, 3, 1, 2))
    out = squeeze(version, data, [0, 2])
    assert_same(out, data.reshape(3, 2))
    assert is_readonly_view(out, data)


SQUEEZE_CASES = [  # (shape, axes or None, expected shape)
    ((1, 3, 1, 2), None, (3, 2)), ((1, 3, 1, 2), [2], (1, 3, 2)), ((1, 3, 1, 2), [2, 0], (3, 2)),
    ((1, 1), None, ()), ((1,), [0], ()), ((3,), None, (3,)), ((), None, ()),
    ((0, 1, 3), [1], (0, 3)), ((1, 0, 1), None, (0,)),
    ((1, 3, 1), [], (1, 3, 1)),  # axes given but empty: nothing to squeeze (only omitted axes mean all)
    # negative axes (11+)
    ((1, 3, 1, 2), [-2], (1, 3, 2)), ((1, 3, 1, 2), [-4, -2], (3, 2)), ((2, 1), [-1], (2,)),
]


@pytest.mark.parametrize("version,shape,axes,out_shape",
                         [(v, *c) for v in SQUEEZE_VERSIONS for c in SQUEEZE_CASES
                          if v >= 11 or c[1] is None or min(c[1], default=0) >= 0])
@pytest.mark.parametrize("const", [False, True])
def test_squeeze_cases(version, shape, axes, out_shape, const):
    data = arange(shape)
    out = squeeze(version, data, axes, const)
    assert_same(out, arange(out_shape))
    assert is_readonly_view(out, data) or data.size == 0


@pytest.mark.parametrize("version", SQUEEZE_VERSIONS)
@pytest.mark.parametrize("const", [False, True])
def test_squeeze_of_a_strided_view_is_still_a_view(version, const):
    # Transpose then Squeeze in one model: the squeeze of a non-contiguous array is still a view.
    data = arange((3, 1, 2))
    out = squeeze(version, data[:, :, ::-1], [1], const)
    assert_same(out, np.array([[1, 0], [3, 2], [5, 4]], np.float32))


@pytest.mark.parametrize("version", SQUEEZE_VERSIONS)
@pytest.mark.parametrize("shape,axes,pattern", [
    ((1, 3), [1], "size is not 1"), ((1, 3), [2], "out of range"), ((1, 3), [-3], "out of range"),
    ((1, 1), [0, 0], "repeat"), ((1, 1), [0, -2], "repeat"),
])
@pytest.mark.parametrize("const", [False, True])
def test_squeeze_errors(version, shape, axes, pattern, const):
    with raises_naming_node(KernelError, pattern):
        squeeze(version, np.zeros(shape, np.float32), axes, const)


# -- Unsqueeze -----------------------------------------------------------------------------------

UNSQUEEZE_VERSIONS = [1, 11, 13, 21, 23, 24, 25]


def unsqueeze(version, data, axes, const=False):
    """const: the axes input (13+) as an initializer."""
    if version < 13:
        return run_node("Unsqueeze", version, [data], axes=list(axes))
    return run_node("Unsqueeze", version, [data, i64(axes)], const=(1,) if const else ())


@pytest.mark.parametrize("version,tname", type_matrix("Unsqueeze", UNSQUEEZE_VERSIONS))
def test_unsqueeze_every_type(version, tname):
    data = sample(tname, (3, 2))
    out = unsqueeze(version, data, [0, 3])
    assert_same(out, data.reshape(1, 3, 2, 1))
    assert is_readonly_view(out, data)


UNSQUEEZE_CASES = [  # (shape, axes, expected shape): axes are positions in the output
    ((3, 4, 5), [0, 4], (1, 3, 4, 5, 1)), ((3, 4, 5), [4, 0], (1, 3, 4, 5, 1)), ((3, 4), [1], (3, 1, 4)),
    ((3, 4), [2], (3, 4, 1)), ((3, 4), [1, 2, 3], (3, 1, 1, 1, 4)), ((3, 4), [4, 2, 1], (3, 1, 1, 4, 1)),
    ((), [0], (1,)), ((), [1, 0], (1, 1)), ((0, 2), [1], (0, 1, 2)), ((2,), [], (2,)),
    # negative axes count in the output rank (11+)
    ((3, 4), [-1], (3, 4, 1)), ((3, 4), [-3], (1, 3, 4)), ((3, 4), [0, -1], (1, 3, 4, 1)),
    ((3, 4), [-2, -1], (3, 4, 1, 1)), ((), [-1], (1,)),
]


@pytest.mark.parametrize("version,shape,axes,out_shape",
                         [(v, *c) for v in UNSQUEEZE_VERSIONS for c in UNSQUEEZE_CASES
                          if v >= 11 or min(c[1], default=0) >= 0])
@pytest.mark.parametrize("const", [False, True])
def test_unsqueeze_cases(version, shape, axes, out_shape, const):
    data = arange(shape)
    out = unsqueeze(version, data, axes, const)
    assert_same(out, arange(out_shape))
    assert is_readonly_view(out, data) or data.size == 0


@pytest.mark.parametrize("version", UNSQUEEZE_VERSIONS)
@pytest.mark.parametrize("shape,axes,pattern", [
    ((3, 4), [3], "out of range"), ((3, 4), [-4], "out of range"), ((3, 4), [1, 1], "repeat"),
    ((3, 4), [0, -4], "repeat"), ((), [1], "out of range"),
])
@pytest.mark.parametrize("const", [False, True])
def test_unsqueeze_errors(version, shape, axes, pattern, const):
    with raises_naming_node(KernelError, pattern):
        unsqueeze(version, np.zeros(shape, np.float32), axes, const)


@pytest.mark.parametrize("op,axes,out_shape", [("Squeeze", [0, -1], lambda n: (n,)),
                                               ("Unsqueeze", [0, 3], lambda n: (1, 1, n, 1, 1))])
def test_constant_axes_serve_every_input_shape(op, axes, out_shape):
    """Constant axes: the output shape made once per input shape (more shapes than the kernel keeps,
    each twice); a shape the axes do not fit fails at each of its runs."""
    model, _ = one_node_model(op, [arange((1, 2, 1)), i64(axes)], const=(1,))
    prepared = onnx_mini.prepare(model)
    for n in list(range(0, 70)) * 2:
        x = arange((1, n, 1))
        (out,) = prepared.run([x])
        assert_same(out, arange(out_shape(n)))
        assert is_readonly_view(out, x) or x.size == 0
    bad = (arange((2, 3, 1)), "size is not 1") if op == "Squeeze" else (arange(()), "out of range")
    for _ in range(2):
        with raises_naming_node(KernelError, bad[1]):
            prepared.run([bad[0]])


# -- Reshape -------------------------------------------------------------------------------------

@pytest.mark.parametrize("const", [False, True])
@pytest.mark.parametrize("in_shape,shape,allowzero,expected", [
    ((2, 3, 4), [4, -1], 0, (4, 6)), ((2, 3, 4), [0, -1], 0, (2, 12)), ((2, 3, 4), [0, 0, 4], 0, (2, 3, 4)),
    ((2, 3, 4), [-1], 0, (24,)), ((0, 3), [3, 0], 1, (3, 0)), ((0, 3), [0, 3], 0, (0, 3)), ((), [1, 1], 0, (1, 1)),
    ((1,), [], 0, ()),
    ((2, 3), [5], 0, "cannot reshape"), ((2, 3), [-1, -1], 0, "more than one -1"),
    ((2, 3), [1, 6, 0], 0, "copies an input dimension"), ((2, 3), [0, -1], 1, "both 0 and -1"),
    ((0, 3), [0, -1], 0, "cannot infer"), ((2, 3), [-2, 3], 0, "invalid dimension"),
])
def test_reshape_cases(in_shape, shape, allowzero, expected, const):
    data = arange(in_shape)
    run = lambda: run_node("Reshape", 21, [data, i64(shape)], allowzero=allowzero, const=(1,) if const else ())
    if isinstance(expected, str):
        with raises_naming_node(KernelError, expected):
            run()
    else:
        out = run()
        assert_same(out, arange(expected))
        assert is_readonly_view(out, data) or data.size == 0


def test_constant_reshape_shape_serves_every_input_shape():
    model, _ = one_node_model("Reshape", [arange((2, 3)), i64([0, -1, 2])], const=(1,))
    prepared = onnx_mini.prepare(model)
    for n in list(range(1, 70)) * 2:
        (out,) = prepared.run([arange((n, 4))])
        assert_same(out, arange((n, 2, 2)))
    for _ in range(2):
        with raises_naming_node(KernelError, "cannot reshape"):
            prepared.run([arange((2, 3))])


def test_kernels_given_other_arrays_than_their_constants_use_those():
    """A kernel made for a constant axes / shape input still computes from the array it is given."""
    x = arange((1, 2, 1))
    assert squeeze_13(_constants={1: i64([0])})(x, i64([2])).shape == (1, 2)
    assert squeeze_13(_constants={1: i64([0])})(x).shape == (2,)
    assert unsqueeze_13(_constants={1: i64([0])})(x, i64([3])).shape == (1, 2, 1, 1)
    assert reshape_14(_constants={1: i64([2])})(x, i64([2, 1])).shape == (2, 1)


# -- Transpose -----------------------------------------------------------------------------------

TRANSPOSE_VERSIONS = [1, 13, 21, 23, 24, 25]


@pytest.mark.parametrize("version,tname", type_matrix("Transpose", TRANSPOSE_VERSIONS))
def test_transpose_every_type(version, tname):
    data = sample(tname, (2, 3))
    out = run_node("Transpose", version, [data])
    # out[j, i] = data[i, j]
    expected = np.array([[data[i, j] for i in range(2)] for j in range(3)], dtype=data.dtype)
    assert_same(out, expected)
    assert is_readonly_view(out, data)
    out = run_node("Transpose", version, [data], perm=[0, 1])
    assert_same(out, data)


@pytest.mark.parametrize("version", TRANSPOSE_VERSIONS)
@pytest.mark.parametrize("shape,perm", [
    ((2, 3, 4), None), ((2, 3, 4), [1, 0, 2]), ((2, 3, 4), [2, 0, 1]), ((2, 3, 4), [1, 2, 0]),
    ((2, 3, 4), [0, 1, 2]), ((1, 2, 3, 4), [3, 1, 0, 2]), ((0, 3), None), ((3,), None), ((3,), [0]), ((), None),
])
def test_transpose_cases(version, shape, perm):
    data = arange(shape)
    out = run_node("Transpose", version, [data], **({} if perm is None else {"perm": perm}))
    p = list(range(len(shape)))[::-1] if perm is None else perm
    # Axis k of the output is axis perm[k] of the input: out[idx] = data[idx permuted back].
    expected = np.empty([shape[a] for a in p], np.float32)
    for idx in np.ndindex(*expected.shape):
        src = [0] * len(shape)
        for k, a in enumerate(p):
            src[a] = idx[k]
        expected[idx] = data[tuple(src)]
    assert_same(out, expected)
    assert is_readonly_view(out, data) or data.size == 0


@pytest.mark.parametrize("version", TRANSPOSE_VERSIONS)
@pytest.mark.parametrize("perm", [[0, 0, 1], [1, 2, 3], [0, -1, 1]])
def test_transpose_bad_perm_is_rejected_at_prepare(version, perm):
    with raises_naming_node(InvalidNodeError, "permutation"):
        run_node("Transpose", version, [np.zeros((2, 3, 4), np.float32)], perm=perm)


@pytest.mark.parametrize("version", TRANSPOSE_VERSIONS)
def test_transpose_perm_of_the_wrong_length(version):
    with raises_naming_node(KernelError, "rank"):
        run_node("Transpose", version, [np.zeros((2, 3, 4), np.float32)], perm=[1, 0])


# -- DepthToSpace / SpaceToDepth -----------------------------------------------------------------

def d2s_reference(x, bs, mode):
    """The recipe quoted in DepthToSpace's doc."""
    b, c, h, w = x.shape
    if mode == "DCR":
        tmp = np.transpose(np.reshape(x, [b, bs, bs, c // bs ** 2, h, w]), [0, 3, 4, 1, 5, 2])
    else:
        tmp = np.transpose(np.reshape(x, [b, c // bs ** 2, bs, bs, h, w]), [0, 1, 4, 2, 5, 3])
    return np.reshape(tmp, [b, c // bs ** 2, h * bs, w * bs])


D2S_VERSIONS = [1, 11, 13, 28]


@pytest.mark.parametrize("version,tname", type_matrix("DepthToSpace", D2S_VERSIONS))
def test_depth_to_space_every_type(version, tname):
    x = sample(tname, (1, 8, 2, 3))
    assert_same(run_node("DepthToSpace", version, [x], blocksize=2), d2s_reference(x, 2, "DCR"))
    if version >= 11:
        assert_same(run_node("DepthToSpace", version, [x], blocksize=2, mode="CRD"), d2s_reference(x, 2, "CRD"))


@pytest.mark.parametrize("version", D2S_VERSIONS)
@pytest.mark.parametrize("shape,bs", [((2, 8, 3, 2), 2), ((1, 9, 2, 2), 3), ((1, 3, 2, 2), 1), ((0, 4, 2, 2), 2),
                                      ((1, 4, 0, 3), 2), ((2, 18, 1, 1), 3)])
@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space_shapes(version, shape, bs, mode):
    if version == 1 and mode == "CRD":
        pytest.skip("mode exists from version 11")
    x = arange(shape)
    out = run_node("DepthToSpace", version, [x], blocksize=bs, **({} if version == 1 else {"mode": mode}))
    assert_same(out, d2s_reference(x, bs, mode))


def test_depth_to_space_hand_example_dcr():
    # Channel (r * bs + c) * C_out + d holds the pixel at block row r, column c of depth d.
    x = np.array([[[[0]], [[1]], [[2]], [[3]], [[4]], [[5]], [[6]], [[7]]]], np.float32)  # (1, 8, 1, 1)
    out = run_node("DepthToSpace", 13, [x], blocksize=2)
    assert_same(out, np.array([[[[0, 2], [4, 6]], [[1, 3], [5, 7]]]], np.float32))
    out = run_node("DepthToSpace", 13, [x], blocksize=2, mode="CRD")  # channel (d * bs + r) * bs + c
    assert_same(out, np.array([[[[0, 1], [2, 3]], [[4, 5], [6, 7]]]], np.float32))


S2D_VERSIONS = [1, 13, 28]


@pytest.mark.parametrize("version,tname", type_matrix("SpaceToDepth", S2D_VERSIONS))
def test_space_to_depth_every_type(version, tname):
    # SpaceToDepth is the inverse of DepthToSpace in the same mode.
    x = sample(tname, (1, 8, 2, 3))
    assert_same(run_node("SpaceToDepth", version, [d2s_reference(x, 2, "DCR")], blocksize=2), x)
    if version >= 28:
        assert_same(run_node("SpaceToDepth", version, [d2s_reference(x, 2, "CRD")], blocksize=2, mode="CRD"), x)


def test_space_to_depth_hand_example():
    # From the SpaceToDepth doc example: a (1, 1, 4, 6) input, blocksize 2.
    x = np.array([[[[0, 6, 1, 7, 2, 8], [12, 18, 13, 19, 14, 20],
                    [3, 9, 4, 10, 5, 11], [15, 21, 16, 22, 17, 23]]]], np.float32)
    expected = np.arange(24, dtype=np.float32).reshape(1, 4, 2, 3)
    for version in S2D_VERSIONS:
        assert_same(run_node("SpaceToDepth", version, [x], blocksize=2), expected)
    # With one channel, CRD and DCR agree.
    assert_same(run_node("SpaceToDepth", 28, [x], blocksize=2, mode="CRD"), expected)


@pytest.mark.parametrize("version", S2D_VERSIONS)
@pytest.mark.parametrize("shape,bs", [((2, 2, 4, 6), 2), ((1, 3, 3, 6), 3), ((0, 2, 2, 2), 2), ((1, 2, 0, 2), 2)])
def test_space_to_depth_round_trip(version, shape, bs):
    x = arange(shape)
    y = run_node("SpaceToDepth", version, [x], blocksize=bs)
    assert y.shape == (shape[0], shape[1] * bs * bs, shape[2] // bs, shape[3] // bs)
    assert_same(run_node("DepthToSpace", 13, [y], blocksize=bs), x)


@pytest.mark.parametrize("op,version,shape,pattern", [
    ("DepthToSpace", 13, (1, 6, 2, 2), "multiple"), ("DepthToSpace", 28, (1, 6, 2, 2), "multiple"),
    ("DepthToSpace", 13, (1, 4, 2), "4-D"), ("SpaceToDepth", 13, (1, 4, 2), "4-D"),
    ("SpaceToDepth", 13, (1, 4, 3, 2), "multiple"), ("SpaceToDepth", 28, (1, 4, 2, 3), "multiple"),
])
def test_depth_space_errors(op, version, shape, pattern):
    with raises_naming_node(KernelError, pattern):
        run_node(op, version, [np.zeros(shape, np.float32)], blocksize=2)


@pytest.mark.parametrize("op,version", [("DepthToSpace", 11), ("SpaceToDepth", 28)])
@pytest.mark.parametrize("attrs,pattern", [({"blocksize": 0}, "blocksize"), ({"blocksize": 2, "mode": "XYZ"}, "mode")])
def test_depth_space_bad_attributes(op, version, attrs, pattern):
    with raises_naming_node(InvalidNodeError, pattern):
        run_node(op, version, [np.zeros((1, 4, 2, 2), np.float32)], **attrs)


def test_mode_is_not_an_attribute_of_old_versions():
    with raises_naming_node(InvalidNodeError, "mode"):
        run_node("SpaceToDepth", 13, [np.zeros((1, 1, 2, 2), np.float32)], blocksize=2, mode="CRD")
    with raises_naming_node(InvalidNodeError, "mode"):
        run_node("DepthToSpace", 1, [np.zeros((1, 4, 1, 1), np.float32)], blocksize=2, mode="CRD")


# -- Size ----------------------------------------------------------------------------------------

SIZE_VERSIONS = [1, 13, 19, 21, 23, 24, 25]


@pytest.mark.parametrize("version,tname", type_matrix("Size", SIZE_VERSIONS))
def test_size_every_type(version, tname):
    assert_same(run_node("Size", version, [sample(tname, (2, 3, 4))]), np.array(24, np.int64))


@pytest.mark.parametrize("version", SIZE_VERSIONS)
@pytest.mark.parametrize("shape,n", [((), 1), ((0, 3), 0), ((7,), 7), ((2, 1, 5), 10)])
def test_size_cases(version, shape, n):
    data = sample("string", shape) if n == 10 else np.zeros(shape, np.float32)
    assert_same(run_node("Size", version, [data]), np.array(n, np.int64))
