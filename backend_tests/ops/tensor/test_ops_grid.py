"""GridSample and AffineGrid against slow per-element implementations written from the spec text
(and torch.nn.functional.grid_sample / affine_grid, which the spec cites). No shared code with
onnx_mini/ops/tensor/grid.py: the reference reflects with a loop of mirror steps, unnormalises per
point and sums the stencil in plain Python."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnx_mini
from onnx_mini.errors import InvalidNodeError, KernelError

from helpers import np_type, sample, type_matrix


def unnorm(g, size, align):
    return (g + 1) / 2 * (size - 1) if align else ((g + 1) * size - 1) / 2


def reflect(x, lo, hi):
    if hi <= lo:
        return 0.0
    while not lo <= x <= hi:
        x = 2 * lo - x if x < lo else 2 * hi - x
    return x


def pad(x, size, align, padding):
    if padding == "border":
        return min(max(x, 0), size - 1)
    if padding == "reflection":
        x = reflect(x, 0, size - 1) if align else reflect(x, -0.5, size - 0.5)
        return min(max(x, 0), size - 1)
    return x


def keys(d, a=-0.75):
    d = abs(d)
    if d <= 1:
        return (a + 2) * d ** 3 - (a + 3) * d ** 2 + 1
    if d < 2:
        return a * d ** 3 - 5 * a * d ** 2 + 8 * a * d - 4 * a
    return 0.0


def ref_grid_sample(x, grid, mode, padding, align):
    n, c, sizes = x.shape[0], x.shape[1], x.shape[2:]
    r = len(sizes)
    out = np.zeros((n, c) + grid.shape[1:-1])
    for b in range(n):
        for o in itertools.product(*[range(s) for s in grid.shape[1:-1]]):
            coords = [unnorm(float(grid[(b,) + o + (r - 1 - d,)]), sizes[d], align) for d in range(r)]
            if mode == "nearest":
                p = [round(pad(cd, s, align, padding)) for cd, s in zip(coords, sizes)]   # Python rounds half to even
                taps = [[(pi, 1.0)] for pi in p]
            elif mode == "linear":
                p = [pad(cd, s, align, padding) for cd, s in zip(coords, sizes)]
                taps = [[(math.floor(pi), 1 - (pi - math.floor(pi))), (math.floor(pi) + 1, pi - math.floor(pi))]
                        for pi in p]
            else:
                taps = []
                for cd, s in zip(coords, sizes):
                    f = math.floor(cd)
                    axis_taps = []
                    for k in range(-1, 3):
                        i = f + k
                        if padding == "border":
                            i = min(max(i, 0), s - 1)
                        elif padding == "reflection":
                            i = math.floor(pad(i, s, align, padding) + 0.5)
                        axis_taps.append((i, keys(cd - (f + k))))
                    taps.append(axis_taps)
            for ch in range(c):
                total = 0.0
                for combo in itertools.product(*taps):
                    if all(0 <= i < s for (i, _), s in zip(combo, sizes)):
                        total += math.prod(w for _, w in combo) * float(x[(b, ch) + tuple(i for i, _ in combo)])
                out[(b, ch) + o] = total
    return out


def run(op, version, inputs, **attrs):
    names = [f"i{k}" for k in range(len(inputs))]
    node = helper.make_node(op, names, ["y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(
        nm, helper.np_dtype_to_tensor_dtype(v.dtype) if v.dtype != object else TensorProto.STRING, None)
        for nm, v in zip(names, inputs)], [helper.make_empty_tensor_value_info("y")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", version)], ir_version=10)
    return onnx_mini.prepare(m).run(inputs)[0]


RNG = np.random.default_rng(0)
X2 = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
G2 = (RNG.uniform(-1.4, 1.4, (2, 3, 6, 2))).astype(np.float32)
G2[0, 0, 0] = [0.25, -0.5]     # exact half-way points for the nearest rounding
X3 = RNG.standard_normal((1, 2, 3, 4, 3)).astype(np.float32)
G3 = RNG.uniform(-1.3, 1.3, (1, 2, 3, 2, 3)).astype(np.float32)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_grid_sample_2d_and_3d_against_the_slow_reference(mode, padding, align):
    got = run("GridSample", 20, [X2, G2], mode=mode, padding_mode=padding, align_corners=align)
    np.testing.assert_allclose(got, ref_grid_sample(X2, G2, mode, padding, align), rtol=1e-5, atol=1e-5)
    old = {"linear": "bilinear", "cubic": "bicubic", "nearest": "nearest"}[mode]
    got16 = run("GridSample", 16, [X2, G2], mode=old, padding_mode=padding, align_corners=align)
    np.testing.assert_array_equal(got16, got)
    got3 = run("GridSample", 22, [X3, G3], mode=mode, padding_mode=padding, align_corners=align)
    np.testing.assert_allclose(got3, ref_grid_sample(X3, G3, mode, padding, align), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("version, tname", type_matrix("GridSample", [16, 20, 22]))
def test_grid_sample_nearest_keeps_every_type(version, tname):
    x = sample(tname, (1, 2, 3, 3))
    grid = np.array([[[[-1, -1], [1, 1], [0, 0]]]], dtype=np.float32)   # corners and centre, align_corners=1
    got = run("GridSample", version, [x, grid], mode="nearest", align_corners=1)
    exp = x[:, :, [0, 2, 1], [0, 2, 1]].reshape(1, 2, 1, 3)
    assert got.dtype == x.dtype and got.shape == (1, 2, 1, 3)
    assert got.astype(object).tolist() == exp.astype(object).tolist()


@pytest.mark.parametrize("tname", ["float16", "bfloat16", "double"])
def test_grid_sample_linear_low_and_high_precision(tname):
    x, g = X2.astype(np_type(tname)), G2.astype(np.float32 if tname == "bfloat16" else np_type(tname))
    got = run("GridSample", 22, [x, g.astype(np_type(tname))])
    exp = ref_grid_sample(x.astype(np.float64), g.astype(np_type(tname)).astype(np.float64), "linear", "zeros", 0)
    assert got.dtype == x.dtype
    np.testing.assert_allclose(got.astype(np.float64), exp, rtol=3e-2, atol=3e-2)


def ref_affine_grid(theta, size, align):
    n, r = theta.shape[0], len(size) - 2
    spatial = size[2:]

    def pos(i, s):
        if s == 1:
            return 0.0
        return -1 + 2 * i / (s - 1) if align else (2 * i + 1) / s - 1
    out = np.zeros((n, *spatial, r))
    for b in range(n):
        for idx in itertools.product(*[range(s) for s in spatial]):
            homog = [pos(i, s) for i, s in reversed(list(zip(idx, spatial)))] + [1.0]
            out[(b,) + idx] = theta[b].astype(np.float64) @ np.array(homog)
    return out


@pytest.mark.parametrize("align", [0, 1])
@pytest.mark.parametrize("size", [[2, 3, 4, 5], [1, 1, 3, 2, 4], [1, 1, 1, 3]])
@pytest.mark.parametrize("tname", ["float", "double", "float16", "bfloat16"])
def test_affine_grid(align, size, tname):
    r = len(size) - 2
    theta = RNG.uniform(-1, 1, (size[0], r, r + 1)).astype(np_type(tname))
    got = run("AffineGrid", 20, [theta, np.array(size, np.int64)], align_corners=align)
    assert got.dtype == theta.dtype and got.shape == (size[0], *size[2:], r)
    tol = 1e-2 if tname in ("float16", "bfloat16") else 1e-6
    np.testing.assert_allclose(got.astype(np.float64), ref_affine_grid(theta, size, align), rtol=tol, atol=tol)


def test_errors_name_the_node():
    with pytest.raises(KernelError, match="grid must have shape"):
        run("GridSample", 20, [X2, G2[..., :1]])
    with pytest.raises(KernelError, match="rank 4"):
        run("GridSample", 16, [X3, G3])
    with pytest.raises(InvalidNodeError, match="unknown mode"):
        run("GridSample", 20, [X2, G2], mode="bilinear")
    with pytest.raises(KernelError, match="theta must have shape"):
        run("AffineGrid", 20, [np.zeros((1, 2, 3), np.float32), np.array([1, 1, 2, 2, 2])])
