"""Spec tests for the normalization operators: BatchNormalization, InstanceNormalization,
LayerNormalization, GroupNormalization, RMSNormalization, LRN, LpNormalization and
MeanVarianceNormalization, every version and every type of each version's type constraints.

Expected values come from formulas transcribed from the spec text, evaluated in float64 on the exact
input values and compared with a tolerance fitting the output type (the kernels compute low-precision
types in float32 and round once).
"""
from __future__ import annotations

import re
import warnings

import ml_dtypes
import numpy as np
import pytest

from onnx_mini.errors import InvalidNodeError, KernelError

from helpers import NODE, np_type, run_node, type_params

TOL = {"float16": 4e-3, "bfloat16": 3e-2, "float": 3e-6, "double": 1e-12}


def data(tname: str, shape, seed: int = 0, positive: bool = False) -> np.ndarray:
    """Deterministic pseudo-random values of the type (exactly the values the kernel sees)."""
    a = np.random.default_rng(seed).standard_normal(shape)
    if positive:
        a = np.abs(a) + 0.25
    return a.astype(np_type(tname))


def f64(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float64)


def f32(v: float) -> float:
    """A float attribute's value as the model stores it (float32)."""
    return float(np.float32(v))


def close(got, exp, tname: str, tol: float | None = None) -> None:
    """Same ndarray type, dtype and shape; values within the type's tolerance of the float64 formula."""
    assert type(got) is np.ndarray
    assert got.dtype == np_type(tname), (got.dtype, tname)
    assert got.shape == np.shape(exp), (got.shape, np.shape(exp))
    t = TOL[tname] if tol is None else tol
    np.testing.assert_allclose(f64(got), exp, rtol=t, atol=2 * t)


def versions_of(op: str) -> list[int]:
    from helpers import versions
    return versions(op)


def node_error(kind, pattern: str):
    return pytest.raises(kind, match=re.compile(f"{NODE}.*{pattern}", re.S))


def chan(p: np.ndarray, ndim: int) -> np.ndarray:
    """A (C,) vector shaped to broadcast on axis 1 of a rank-ndim tensor."""
    return p.reshape((-1,) + (1,) * (ndim - 2))


# -- BatchNormalization --------------------------------------------------------------------------

BN_VERSIONS = [1, 6, 7, 9, 14, 15]


def bn_inputs(tname: str, shape=(2, 3, 2, 2), ptypes=None):
    ptypes = ptypes or (tname, tname)
    c = shape[1]
    return [data(tname, shape, 1), data(ptypes[0], (c,), 2), data(ptypes[0], (c,), 3),
            data(ptypes[1], (c,), 4), data(ptypes[1], (c,), 5, positive=True)]


def bn_inference(x, s, b, mean, var, eps=1e-5):
    """Y = (X - mean) / sqrt(var + epsilon) * scale + B, parameters on axis 1."""
    n, eps = x.ndim, f32(eps)
    return (f64(x) - chan(f64(mean), n)) / np.sqrt(chan(f64(var), n) + eps) * chan(f64(s), n) + chan(f64(b), n)


def bn_training(x, s, b, mean, var, eps=1e-5, momentum=0.9):
    """Spec (14+): batch mean and population variance over all axes but 1; running stats with momentum."""
    axes, momentum = (0, *range(2, x.ndim)), f32(momentum)
    cur_mean = f64(x).mean(axis=axes)
    cur_var = ((f64(x) - chan(cur_mean, x.ndim)) ** 2).mean(axis=axes)
    y = bn_inference(x, s, b, cur_mean, cur_var, eps)
    return y, f64(mean) * momentum + cur_mean * (1 - momentum), f64(var) * momentum + cur_var * (1 - momentum), \
        cur_mean, cur_var


def bn_attrs(version: int) -> dict:
    return {"is_test": 1} if version < 7 else {}


@pytest.mark.parametrize("version,tname", type_params("BatchNormalization", BN_VERSIONS))
def test_batchnorm_inference_every_type(version, tname):
    ins = bn_inputs(tname)       # 15: T1 and T2 equal to T here; mixed types below
    close(run_node("BatchNormalization", version, ins, **bn_attrs(version)), bn_inference(*ins), tname)


@pytest.mark.parametrize("param", ["T1", "T2"])
@pytest.mark.parametrize("version,ptype", type_params("BatchNormalization", [15], "T1"))
def test_batchnorm_15_parameter_types(version, ptype, param):
    ptypes = (ptype, "float") if param == "T1" else ("float", ptype)
    ins = bn_inputs("float", ptypes=ptypes)
    got = run_node("BatchNormalization", 15, ins)
    close(got, bn_inference(*ins), "float", TOL[ptype] if ptype in ("float16", "bfloat16") else None)


@pytest.mark.parametrize("version,tname", type_params("BatchNormalization", [14], "U"))
def test_batchnorm_14_statistics_type(version, tname):
    ins = bn_inputs("float", ptypes=("float", tname))
    close(run_node("BatchNormalization", 14, ins), bn_inference(*ins), "float", TOL.get(tname) if tname != "double" else None)


@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 5), (2, 3, 2, 2, 2), (1, 1, 1, 1)])
def test_batchnorm_ranks_and_epsilon(shape):
    ins = bn_inputs("double", shape)
    for version in (9, 15):
        got = run_node("BatchNormalization", version, ins, epsilon=0.5)
        close(got, bn_inference(*ins, eps=0.5), "double")


@pytest.mark.parametrize("version,tname", type_params("BatchNormalization", [14, 15]))
def test_batchnorm_training_mode(version, tname):
    ins = bn_inputs(tname, (3, 2, 2, 3))
    y, rm, rv = run_node("BatchNormalization", version, ins, 3, training_mode=1, momentum=0.8, epsilon=1e-3)
    ey, erm, erv, _, _ = bn_training(*ins, eps=1e-3, momentum=0.8)
    close(y, ey, tname)
    close(rm, erm, tname)
    close(rv, erv, tname)
    # Y alone in training mode still uses the batch statistics
    close(run_node("BatchNormalization", version, ins, training_mode=1, epsilon=1e-3), ey, tname)


def test_batchnorm_training_mixed_types():
    """15: X float16, scale/B double, mean/var float; running stats keep their own type (T2)."""
    ins = [data("float16", (4, 2, 3), 1), data("double", (2,), 2), data("double", (2,), 3),
           data("float", (2,), 4), data("float", (2,), 5, positive=True)]
    y, rm, rv = run_node("BatchNormalization", 15, ins, 3, training_mode=1)
    ey, erm, erv, _, _ = bn_training(*ins)
    close(y, ey, "float16")
    close(rm, erm, "float")
    close(rv, erv, "float")


def test_batchnorm_training_hand_values():
    # one channel, values 1..4: batch mean 2.5, population variance 1.25 (not 5/3)
    x = np.array([[[1.0, 2.0]], [[3.0, 4.0]]], np.float32)          # (N=2, C=1, 2)
    ins = [x, np.array([2.0], np.float32), np.array([1.0], np.float32),
           np.array([0.5], np.float32), np.array([2.0], np.float32)]
    y, rm, rv = run_node("BatchNormalization", 15, ins, 3, training_mode=1, epsilon=0.0, momentum=0.75)
    close(y, 2 * (f64(x) - 2.5) / np.sqrt(1.25) + 1, "float")
    close(rm, np.array([0.5 * 0.75 + 2.5 * 0.25]), "float")
    close(rv, np.array([2.0 * 0.75 + 1.25 * 0.25]), "float")


@pytest.mark.parametrize("version", [6, 7, 9])
def test_batchnorm_legacy_training_outputs(version):
    """Before 14: Y, running mean, running var, saved (batch) mean, saved (batch) variance."""
    ins = bn_inputs("float", (3, 2, 4))
    attrs = {"is_test": 0} if version < 7 else {}
    outs = run_node("BatchNormalization", version, ins, 5, momentum=0.5, **attrs)
    for got, exp in zip(outs, bn_training(*ins, momentum=0.5)):
        close(got, exp, "float")


def test_batchnorm_1_consumed_inputs_and_training_flag():
    ins = bn_inputs("float")
    close(run_node("BatchNormalization", 1, ins, is_test=1, consumed_inputs=[0, 0, 0, 1, 1]), bn_inference(*ins), "float")
    # is_test=0 (the default) is training mode: Y uses the batch statistics
    close(run_node("BatchNormalization", 1, ins), bn_training(*ins)[0], "float")


@pytest.mark.parametrize("version", [1, 6, 7])
def test_batchnorm_non_spatial(version):
    """spatial=0: per-activation parameters of shape (C, D1, ...)."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 2, 4))
    s, b, m = (rng.standard_normal((2, 4)) for _ in range(3))
    v = np.abs(rng.standard_normal((2, 4))) + 0.5
    attrs = {"is_test": 1} if version < 7 else {}
    got = run_node("BatchNormalization", version, [x, s, b, m, v], spatial=0, **attrs)
    close(got, (x - m) / np.sqrt(v + f32(1e-5)) * s + b, "double")
    # training: statistics over the batch axis only
    attrs = {"is_test": 0} if version < 7 else {}
    y, rm, rv, sm, sv = run_node("BatchNormalization", version, [x, s, b, m, v], 5, spatial=0, **attrs)
    cm, cv = x.mean(axis=0), x.var(axis=0)
    close(y, (x - cm) / np.sqrt(cv + f32(1e-5)) * s + b, "double")
    close(rm, m * 0.9 + cm * 0.1, "double")      # the default momentum
    close(rv, v * 0.9 + cv * 0.1, "double")
    close(sm, cm, "double")
    close(sv, cv, "double")


def test_batchnorm_empty_and_nan():
    ins = bn_inputs("float", (0, 3, 2))
    got = run_node("BatchNormalization", 15, ins)
    assert got.shape == (0, 3, 2) and got.dtype == np.float32
    ins = bn_inputs("float", (1, 3, 2))
    ins[0][0, 1, 0] = np.nan
    got = run_node("BatchNormalization", 15, ins)
    assert np.isnan(got[0, 1, 0]) and np.isfinite(np.delete(got.reshape(-1), 2)).all()


def test_batchnorm_errors():
    ins = bn_inputs("float")
    bad = [ins[0], np.ones(4, np.float32), *ins[2:]]
    for version in BN_VERSIONS:
        with node_error(KernelError, "scale.*shape"):
            run_node("BatchNormalization", version, bad, **bn_attrs(version))
    with node_error(KernelError, "rank"):
        run_node("BatchNormalization", 15, [np.ones(3, np.float32), *ins[1:]])
    with node_error(InvalidNodeError, "training_mode=0"):
        run_node("BatchNormalization", 15, ins, 3)
    with node_error(InvalidNodeError, "spatial"):
        run_node("BatchNormalization", 9, ins, spatial=0)
    # spatial=0 training needs per-activation statistics
    with node_error(KernelError, "spatial=0"):
        run_node("BatchNormalization", 7, ins, 5, spatial=0)


# -- InstanceNormalization -----------------------------------------------------------------------

def instance_norm(x, s, b, eps=1e-5):
    eps = f32(eps)
    axes = tuple(range(2, x.ndim))
    x = f64(x)
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * chan(f64(s), x.ndim) + chan(f64(b), x.ndim)


@pytest.mark.parametrize("version,tname", type_params("InstanceNormalization", [1, 6, 22]))
def test_instancenorm_every_type(version, tname):
    ins = [data(tname, (2, 3, 4, 2), 1), data(tname, (3,), 2), data(tname, (3,), 3)]
    close(run_node("InstanceNormalization", version, ins), instance_norm(*ins), tname)


@pytest.mark.parametrize("shape", [(2, 3, 5), (1, 2, 2, 2, 3), (2, 1, 1)])
def test_instancenorm_shapes_and_epsilon(shape):
    ins = [data("double", shape, 1), data("double", shape[1:2], 2), data("double", shape[1:2], 3)]
    close(run_node("InstanceNormalization", 22, ins, epsilon=0.1), instance_norm(*ins, eps=0.1), "double")


def test_instancenorm_hand_values_and_errors():
    x = np.array([[[-1.0, 0.0, 1.0], [2.0, 3.0, 4.0]]], np.float32)   # (1, 2, 3): variance 2/3 each
    s, b = np.array([1.0, 1.5], np.float32), np.array([0.0, 1.0], np.float32)
    z = np.array([-1.0, 0.0, 1.0]) / np.sqrt(2 / 3 + 1e-5)
    close(run_node("InstanceNormalization", 6, [x, s, b]), np.array([[z, 1.5 * z + 1]]), "float")
    with node_error(KernelError, "B.*shape"):
        run_node("InstanceNormalization", 22, [x, s, np.ones(3, np.float32)])


# -- LayerNormalization --------------------------------------------------------------------------

def layer_norm(x, w, b, axis=-1, eps=1e-5):
    axis, eps = axis % x.ndim, f32(eps)
    axes = tuple(range(axis, x.ndim))
    x = f64(x)
    mean = x.mean(axis=axes, keepdims=True)
    inv = 1 / np.sqrt(((x - mean) ** 2).mean(axis=axes, keepdims=True) + eps)
    y = (x - mean) * inv * f64(w)
    return (y if b is None else y + f64(b)), mean, inv


@pytest.mark.parametrize("version,tname", type_params("LayerNormalization", [17]))
def test_layernorm_every_type(version, tname):
    x, w, b = data(tname, (2, 3, 4), 1), data(tname, (4,), 2), data(tname, (4,), 3)
    y, mean, inv = run_node("LayerNormalization", 17, [x, w, b], 3)
    ey, em, ei = layer_norm(x, w, b)
    close(y, ey, tname, max(TOL[tname], 1e-6))       # stash_type 1: the first stage runs in float32
    close(mean, em, "float")
    close(inv, ei, "float")


@pytest.mark.parametrize("axis", [0, 1, 2, 3, -1, -2, -3, -4])
def test_layernorm_axis(axis):
    x = data("float", (2, 3, 2, 3), 1)
    w, b = data("float", x.shape[axis:], 2), data("float", x.shape[axis:], 3)
    y, mean, inv = run_node("LayerNormalization", 17, [x, w, b], 3, axis=axis)
    ey, em, ei = layer_norm(x, w, b, axis)
    a = axis % 4
    assert mean.shape == inv.shape == x.shape[:a] + (1,) * (4 - a)
    close(y, ey, "float")
    close(mean, em, "float")
    close(inv, ei, "float")


@pytest.mark.parametrize("stash,utype", [(1, "float"), (16, "bfloat16")])
def test_layernorm_stash_type(stash, utype):
    """stash_type is the type of Mean/InvStdDev and the precision of the first stage."""
    x, w = data("double", (3, 8), 1), data("double", (8,), 2)
    y, mean, inv = run_node("LayerNormalization", 17, [x, w], 3, stash_type=stash)
    ey, em, ei = layer_norm(x, w, None)
    assert y.dtype == np.float64
    close(y, ey, "double", TOL[utype] * 4)      # the first stage ran in the stash type
    close(mean, em, utype)
    close(inv, ei, utype)
    if stash == 1:     # float32 computing: not exactly the float64 result
        assert not np.array_equal(y, ey)


def test_layernorm_optional_bias_broadcast_and_single_output():
    x = data("float", (2, 3, 4), 1)
    w = data("float", (1, 4), 2)        # unidirectionally broadcastable to the normalized shape
    y = run_node("LayerNormalization", 17, [x, w], axis=1, epsilon=0.5)
    close(y, layer_norm(x, w, None, 1, 0.5)[0], "float")
    y, mean = run_node("LayerNormalization", 17, [x, w, None], 2, axis=-2)
    close(mean, layer_norm(x, w, None, -2)[1], "float")


@pytest.mark.parametrize("shape", [(1, 128, 256), (3, 5, 7), (20, 1), (2, 40, 64)])
def test_layernorm_float32_rows_many_and_few(shape):
    """float32 over the last axis, the row sums taken by a product with ones from 16 rows on, by sums
    below: both against float64, rows offset far from 0 (the mean must come out to float32 accuracy
    for the deviations to), a strided input, and a NaN or inf row leaving the others alone."""
    rng = np.random.default_rng(len(shape) + shape[-1])
    x = (rng.standard_normal(shape) * 0.5 + rng.uniform(-300, 300, shape[:-1] + (1,))).astype(np.float32)
    w, b = rng.standard_normal(shape[-1:]).astype(np.float32), rng.standard_normal(shape[-1:]).astype(np.float32)
    y, mean, inv = run_node("LayerNormalization", 17, [x, w, b], 3)
    ey, em, ei = layer_norm(x, w, b)
    np.testing.assert_allclose(mean, em, rtol=2e-7)
    np.testing.assert_allclose(inv, ei, rtol=1e-3)       # deviations of ~0.5 on values up to 300 in float32
    np.testing.assert_allclose(y, ey, rtol=1e-3, atol=1e-3 * np.abs(ey).max())
    xt = np.ascontiguousarray(np.swapaxes(x, 0, -1)).swapaxes(0, -1)     # x's values, strided
    np.testing.assert_allclose(run_node("LayerNormalization", 17, [xt, w, b]), ey, rtol=1e-3, atol=1e-3 * np.abs(ey).max())
    if x.size // x.shape[-1] > 1:
        bad = x.copy()
        bad.reshape(-1, shape[-1])[0, 0] = np.nan
        bad.reshape(-1, shape[-1])[-1, -1] = np.inf
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)        # inf - inf
            got = run_node("LayerNormalization", 17, [bad, w, b]).reshape(-1, shape[-1])
        assert np.isnan(got[0]).all() and np.isnan(got[-1]).all()
        np.testing.assert_allclose(got[1:-1], ey.reshape(-1, shape[-1])[1:-1], rtol=1e-3, atol=1e-3 * np.abs(ey).max())


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("shape", [(1, 4, 128, 128), (15, 9), (16, 9), (3, 1), (5, 0), (7,)])
def test_last_axis_sums_by_product_and_by_reduce(dtype, shape):
    """normalization.last_axis_sums (LayerNormalization's means, the attention kernels' softmax sums):
    a product with ones from 16 rows on (float32/float64), numpy's sums otherwise; both to the type's
    accuracy against float64 sums, an axis of 1 kept, inf and NaN staying in their rows."""
    from onnx_mini.ops.nn.normalization import last_axis_sums
    x = np.random.default_rng(shape[-1]).random(shape).astype(dtype)
    got = last_axis_sums(x)
    assert got.dtype == dtype and got.shape == shape[:-1] + (1,)
    want = x.astype(np.float64).sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(got, want, rtol=4 * np.finfo(dtype).eps * max(shape[-1], 1) ** 0.5, atol=0)
    if x.ndim > 1 and x.size:
        x2 = x.reshape(-1, shape[-1]).copy()
        x2[0, -1], x2[-1, 0] = np.inf, np.nan
        got2 = last_axis_sums(x2)
        assert got2[0, 0] == np.inf and np.isnan(got2[-1, 0])
        np.testing.assert_allclose(got2[1:-1], want.reshape(-1, 1)[1:-1], rtol=4 * np.finfo(dtype).eps * shape[-1] ** 0.5)


def test_layernorm_errors():
    x = data("float", (2, 3), 1)
    with node_error(KernelError, "out of range"):
        run_node("LayerNormalization", 17, [x, np.ones(3, np.float32)], axis=2)
    with node_error(KernelError, "Scale.*broadcastable"):
        run_node("LayerNormalization", 17, [x, np.ones(4, np.float32)])
    with node_error(KernelError, "B.*broadcastable"):
        run_node("LayerNormalization", 17, [x, np.ones(3, np.float32), np.ones((3, 3), np.float32)])
    with node_error(InvalidNodeError, "stash_type"):
        run_node("LayerNormalization", 17, [x, np.ones(3, np.float32)], stash_type=7)


# -- GroupNormalization --------------------------------------------------------------------------

def group_norm(x, scale, bias, groups, eps=1e-5, per_channel=True):
    n, c = x.shape[:2]
    eps = f32(eps)
    g = f64(x).reshape(n, groups, -1)
    mean = g.mean(axis=2, keepdims=True)
    norm = ((g - mean) / np.sqrt(((g - mean) ** 2).mean(axis=2, keepdims=True) + eps))
    if per_channel:
        return norm.reshape(n, c, -1) * f64(scale)[:, None] + f64(bias)[:, None]
    return (norm * f64(scale)[:, None] + f64(bias)[:, None]).reshape(x.shape)


@pytest.mark.parametrize("version,tname", type_params("GroupNormalization", [18, 21]))
def test_groupnorm_every_type(version, tname):
    x = data(tname, (2, 4, 3), 1)
    p = 4 if version == 21 else 2          # 21: per channel; 18: per group
    s, b = data(tname, (p,), 2), data(tname, (p,), 3)
    got = run_node("GroupNormalization", version, [x, s, b], num_groups=2)
    tol = max(TOL[tname], 1e-6) if version == 21 else None     # 21: stage one in float32 (stash_type 1)
    close(got, group_norm(x, s, b, 2, per_channel=version == 21).reshape(x.shape), tname, tol)


def test_groupnorm_18_scale_is_per_group():
    x = np.arange(8, dtype=np.float32).reshape(1, 4, 2)           # groups: [0..3], [4..7]
    s, b = np.array([1.0, 2.0], np.float32), np.array([0.0, 10.0], np.float32)
    z = (np.arange(4) - 1.5) / np.sqrt(1.25 + 1e-5)
    exp = np.concatenate([z, 2 * z + 10]).reshape(1, 4, 2)
    close(run_node("GroupNormalization", 18, [x, s, b], num_groups=2), exp, "float")


@pytest.mark.parametrize("groups", [1, 2, 6])
@pytest.mark.parametrize("stash", [1, 11, 16])
def test_groupnorm_21_groups_and_stash(groups, stash):
    x = data("double", (2, 6, 2, 2), 1)
    s, b = data("double", (6,), 2), data("double", (6,), 3)
    got = run_node("GroupNormalization", 21, [x, s, b], num_groups=groups, epsilon=1e-2, stash_type=stash)
    exp = group_norm(x, s, b, groups, 1e-2).reshape(x.shape)
    close(got, exp, "double", {1: 1e-5, 11: 1e-12, 16: 0.1}[stash])


def test_groupnorm_errors():
    x = data("float", (1, 6, 2), 1)
    with node_error(KernelError, "divisible"):
        run_node("GroupNormalization", 21, [x, np.ones(6, np.float32), np.ones(6, np.float32)], num_groups=4)
    with node_error(KernelError, "scale.*shape"):
        run_node("GroupNormalization", 21, [x, np.ones(3, np.float32), np.ones(6, np.float32)], num_groups=3)
    with node_error(KernelError, "bias.*shape"):
        run_node("GroupNormalization", 18, [x, np.ones(3, np.float32), np.ones(6, np.float32)], num_groups=3)
    with node_error(InvalidNodeError, "num_groups"):
        run_node("GroupNormalization", 21, [x, np.ones(6, np.float32), np.ones(6, np.float32)], num_groups=0)
    with node_error(InvalidNodeError, "num_groups"):
        run_node("GroupNormalization", 18, [x, np.ones(6, np.float32), np.ones(6, np.float32)])


# -- RMSNormalization ----------------------------------------------------------------------------

def rms_norm(x, w, axis=-1, eps=1e-5):
    axes = tuple(range(axis % x.ndim, x.ndim))
    x = f64(x)
    return x / np.sqrt((x * x).mean(axis=axes, keepdims=True) + f32(eps)) * f64(w)


@pytest.mark.parametrize("param", ["T", "V"])
@pytest.mark.parametrize("version,tname", type_params("RMSNormalization", [23]))
def test_rmsnorm_every_type(version, tname, param):
    other = "float"
    xt, vt = (tname, other) if param == "T" else (other, tname)
    x, w = data(xt, (2, 3, 4), 1), data(vt, (4,), 2)
    got = run_node("RMSNormalization", 23, [x, w])
    lowest = max(TOL[xt], TOL[vt])
    close(got, rms_norm(x, w), vt, lowest)          # Y has the scale's type (V)


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -2, -3])
def test_rmsnorm_axis_epsilon(axis):
    x = data("double", (2, 3, 4), 1)
    w = data("double", x.shape[axis:], 2)
    close(run_node("RMSNormalization", 23, [x, w], axis=axis, epsilon=0.1, stash_type=11),
          rms_norm(x, w, axis, 0.1), "double")


@pytest.mark.parametrize("stash,tol", [(1, 1e-6), (10, 4e-3), (16, 3e-2)])
def test_rmsnorm_stash_type(stash, tol):
    x, w = data("double", (3, 5), 1), data("double", (5,), 2)
    got = run_node("RMSNormalization", 23, [x, w], stash_type=stash)
    close(got, rms_norm(x, w), "double", tol)
    assert not np.array_equal(got, rms_norm(x, w))     # computed in the stash type, not float64


def test_rmsnorm_hand_values_and_errors():
    x = np.array([[3.0, 4.0]], np.float32)                  # rms = sqrt(12.5)
    got = run_node("RMSNormalization", 23, [x, np.array([1.0, 2.0], np.float32)], epsilon=0.0)
    close(got, np.array([[3.0, 8.0]]) / np.sqrt(12.5), "float")
    with node_error(KernelError, "scale.*broadcastable"):
        run_node("RMSNormalization", 23, [x, np.ones(3, np.float32)])
    with node_error(InvalidNodeError, "stash_type"):
        run_node("RMSNormalization", 23, [x, np.ones(2, np.float32)], stash_type=6)


# -- LRN -----------------------------------------------------------------------------------------

def lrn(x, size, alpha=1e-4, beta=0.75, bias=1.0):
    """The spec's window [c - floor((size-1)/2), c + ceil((size-1)/2)], clipped, summed one channel at a time."""
    x, alpha, beta, bias = f64(x), f32(alpha), f32(beta), f32(bias)
    c = x.shape[1]
    square_sum = np.zeros_like(x)
    for ch in range(c):
        lo, hi = max(0, ch - (size - 1) // 2), min(c - 1, ch + -(-(size - 1) // 2))
        square_sum[:, ch] = (x[:, lo:hi + 1] ** 2).sum(axis=1)
    return x / (bias + alpha / size * square_sum) ** beta


@pytest.mark.parametrize("version,tname", type_params("LRN", [1, 13]))
def test_lrn_every_type(version, tname):
    x = data(tname, (2, 5, 3, 2), 1)
    got = run_node("LRN", version, [x], size=3, alpha=0.5, beta=0.6, bias=1.5)
    close(got, lrn(x, 3, 0.5, 0.6, 1.5), tname)


@pytest.mark.parametrize("size", [1, 2, 4, 5, 9])
@pytest.mark.parametrize("shape", [(1, 4, 3), (2, 6), (1, 3, 2, 2, 2)])
def test_lrn_sizes_and_ranks(size, shape):
    x = data("double", shape, 1)
    close(run_node("LRN", 13, [x], size=size, alpha=0.3), lrn(x, size, alpha=0.3), "double")


def test_lrn_errors_and_empty():
    assert run_node("LRN", 13, [np.zeros((0, 3, 2), np.float32)], size=3).shape == (0, 3, 2)
    with node_error(InvalidNodeError, "size"):
        run_node("LRN", 13, [np.ones((1, 3), np.float32)], size=0)
    with node_error(InvalidNodeError, "size"):
        run_node("LRN", 13, [np.ones((1, 3), np.float32)])
    with node_error(KernelError, "rank"):
        run_node("LRN", 13, [np.ones(3, np.float32)], size=1)


# -- LpNormalization -----------------------------------------------------------------------------

@pytest.mark.parametrize("version,tname", type_params("LpNormalization", [1, 22]))
def test_lpnorm_every_type(version, tname):
    x = data(tname, (3, 4), 1)
    xd = f64(x)
    close(run_node("LpNormalization", version, [x]), xd / np.sqrt((xd * xd).sum(-1, keepdims=True)), tname)
    close(run_node("LpNormalization", version, [x], p=1, axis=0), xd / np.abs(xd).sum(0, keepdims=True), tname)


def test_lpnorm_hand_values_zero_norm_and_axes():
    x = np.array([[[3.0, 0.0], [4.0, 0.0]], [[1.0, -2.0], [0.0, 2.0]]], np.float32)  # (2, 2, 2)
    got = run_node("LpNormalization", 22, [x], axis=1)
    exp = np.array([[[0.6, 0.0], [0.8, 0.0]], [[1.0, -2 / np.sqrt(8)], [0.0, 2 / np.sqrt(8)]]])
    close(got, exp, "float")                 # the all-zero column gives 0, not NaN
    got = run_node("LpNormalization", 22, [x], axis=-3, p=1)
    close(got, np.array([[[0.75, 0.0], [1.0, 0.0]], [[0.25, -1.0], [0.0, 1.0]]]), "float")
    with node_error(InvalidNodeError, "p must be"):
        run_node("LpNormalization", 22, [x], p=3)
    with node_error(KernelError, "out of range"):
        run_node("LpNormalization", 22, [x], axis=3)


# -- MeanVarianceNormalization -------------------------------------------------------------------

def mvn(x, axes=(0, 2, 3)):
    x = f64(x)
    mean = x.mean(axis=tuple(axes), keepdims=True)
    return (x - mean) / (np.sqrt(((x - mean) ** 2).mean(axis=tuple(axes), keepdims=True)) + 1e-9)


@pytest.mark.parametrize("version,tname", type_params("MeanVarianceNormalization", [9, 13]))
def test_mvn_every_type(version, tname):
    x = data(tname, (2, 3, 2, 2), 1)
    close(run_node("MeanVarianceNormalization", version, [x]), mvn(x), tname)


@pytest.mark.parametrize("axes", [[1], [-1], [0, 1], [1, 2]])
def test_mvn_axes(axes):
    x = data("double", (3, 2, 4), 1)
    close(run_node("MeanVarianceNormalization", 13, [x], axes=axes), mvn(x, [a % 3 for a in axes]), "double")


def test_mvn_constant_input_and_errors():
    # zero variance: (x - mean) = 0 divided by 1e-9 gives 0
    got = run_node("MeanVarianceNormalization", 13, [np.full((1, 2, 1, 2), 3.0, np.float32)])
    close(got, np.zeros((1, 2, 1, 2)), "float")
    with node_error(KernelError, "out of range"):
        run_node("MeanVarianceNormalization", 13, [np.ones((2, 3), np.float32)])
