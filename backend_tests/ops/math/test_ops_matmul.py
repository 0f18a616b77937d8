"""Spec tests for Gemm, MatMul, MatMulInteger, QLinearMatMul, Einsum and Det (every version).

Expected values are hand-written or come from sums of products written out from the spec (not from
np.matmul), in float64 or int64, then converted to the tested type.
"""
from __future__ import annotations

import itertools
import re

import ml_dtypes
import numpy as np
import pytest

from onnx_mini.errors import InvalidNodeError, InvalidValueError, KernelError
from onnx_mini.ops.math.matmul import gemm_7, gemm_11

from helpers import NODE, assert_same, np_type, run_node, run_op as run, small, type_matrix


def mm_ref(a, b):
    """numpy.matmul semantics spelled out: 1-D operands get a dim added and removed, batch dims
    broadcast, out[..., i, j] = sum_k a[..., i, k] * b[..., k, j]; computed in float64/int64."""
    wide = np.int64 if a.dtype.kind in "iu" else np.float64
    a2 = a.astype(wide)[None, :] if a.ndim == 1 else a.astype(wide)
    b2 = b.astype(wide)[:, None] if b.ndim == 1 else b.astype(wide)
    y = (a2[..., :, :, None] * b2[..., None, :, :]).sum(axis=-2)
    if a.ndim == 1:
        y = y[..., 0, :]
    if b.ndim == 1:
        y = y[..., 0]
    return y


# -- MatMul --------------------------------------------------------------------------------------

@pytest.mark.parametrize("version,tname", type_matrix("MatMul", [1, 9, 13]))
def test_matmul_every_type(version, tname):
    a, b = small(tname, (2, 3), 1), small(tname, (3, 4), 2)
    assert_same(run("MatMul", version, [a, b]), mm_ref(a, b).astype(a.dtype))


MATMUL_SHAPES = [((3,), (3,)), ((3,), (2, 3, 4)), ((2, 1, 3, 4), (4,)), ((2, 3), (3, 4)),
                 ((2, 1, 3, 4), (5, 4, 2)), ((1, 3, 4), (2, 4, 2)), ((2, 0), (0, 3)), ((0, 3), (3, 2)),
                 ((2, 3, 0, 4), (4, 5))]


@pytest.mark.parametrize("sa,sb", MATMUL_SHAPES)
@pytest.mark.parametrize("tname", ["float", "double", "float16", "int64"])
def test_matmul_shapes(sa, sb, tname):
    a, b = small(tname, sa, 3), small(tname, sb, 4)
    assert_same(run("MatMul", 13, [a, b]), mm_ref(a, b).astype(a.dtype))


@pytest.mark.parametrize("sa,n", [((100, 1, 64), 128), ((2, 3, 4, 64), 64), ((8, 16, 64), 96)])
@pytest.mark.parametrize("tname", ["float", "double"])
@pytest.mark.parametrize("contiguous", [True, False])
def test_matmul_stack_of_rows_times_a_matrix(sa, n, tname, contiguous):
    """A stack of matrices times one matrix (a Scan RNN's inputs projected at once: [100, 1, 64] x [64, 128]),
    large enough to run as one 2-D product when A is contiguous, else per matrix: the sums of products in
    the stack's shape either way."""
    dt = np_type(tname)
    r = np.random.default_rng(len(sa) * n)
    a = r.standard_normal(sa).astype(dt)
    if not contiguous:      # the same values, a strided view
        a = np.ascontiguousarray(a.swapaxes(-1, -2)).swapaxes(-1, -2)
    b = r.standard_normal((sa[-1], n)).astype(dt)
    y = run("MatMul", 13, [a, b])
    assert y.shape == sa[:-1] + (n,) and y.dtype == dt
    tol = 1e-5 if dt == np.float32 else 1e-12
    np.testing.assert_allclose(y, mm_ref(a, b), rtol=tol, atol=tol)


def test_matmul_low_precision_rounds_once():
    # 2048 + 1 + 1: float32 accumulation gives 2050 (exact in float16); float16 steps would give 2048
    a = np.array([[2048, 1, 1]], dtype=np.float16)
    b = np.ones((3, 1), dtype=np.float16)
    assert_same(run("MatMul", 13, [a, b]), np.array([[2050]], np.float16))
    ab = a.astype(ml_dtypes.bfloat16)  # bfloat16: 2050 rounds to 2048 (8-bit mantissa), once
    assert_same(run("MatMul", 13, [ab, b.astype(ml_dtypes.bfloat16)]), np.array([[2048]], ml_dtypes.bfloat16))


def test_matmul_integers_wrap():
    a = np.array([[2**31 - 1, 1]], dtype=np.int32)
    b = np.array([[1], [1]], dtype=np.int32)
    assert_same(run("MatMul", 13, [a, b]), np.array([[-2**31]], np.int32))


@pytest.mark.parametrize("sa,sb", [((2, 3), (4, 5)), ((3,), (4,)), ((2, 2, 3), (3, 3, 2)), ((), (3,))])
def test_matmul_shapes_that_do_not_multiply(sa, sb):
    with pytest.raises(KernelError, match=re.compile(rf"'{NODE}'.*MatMul.*cannot be multiplied|'{NODE}'.*rank", re.S)):
        run_node("MatMul", 13, [np.ones(sa, np.float32), np.ones(sb, np.float32)])


# -- Gemm ----------------------------------------------------------------------------------------

GEMM_VERSIONS = [1, 6, 7, 9, 11, 13]


def gemm_ref(a, b, c, alpha=1.0, beta=1.0, transA=0, transB=0):
    y = alpha * mm_ref(a.T if transA else a, b.T if transB else b).astype(np.float64)
    if c is not None:
        y = y + beta * c.astype(np.float64)
    return y.astype(a.dtype)


@pytest.mark.parametrize("version,tname", type_matrix("Gemm", GEMM_VERSIONS))
def test_gemm_every_type(version, tname):
    a, b, c = small(tname, (2, 3), 5), small(tname, (3, 4), 6), small(tname, (2, 4), 7)
    assert_same(run("Gemm", version, [a, b, c]), gemm_ref(a, b, c))


@pytest.mark.parametrize("version", GEMM_VERSIONS)
@pytest.mark.parametrize("tname", ["float", "double", "float16"])
@pytest.mark.parametrize("alpha,beta,transA,transB", [(0.5, 1.0, 0, 0), (1.0, -2.0, 1, 0), (2.0, 0.25, 0, 1),
                                                      (-1.5, 3.0, 1, 1), (0.5, 0.0, 0, 0)])
def test_gemm_attributes(version, tname, alpha, beta, transA, transB):
    a = small(tname, (3, 2) if transA else (2, 3), 8)
    b = small(tname, (4, 3) if transB else (3, 4), 9)
    c = small(tname, (2, 4), 10)
    got = run("Gemm", version, [a, b, c], alpha=alpha, beta=beta, transA=transA, transB=transB)
    assert_same(got, gemm_ref(a, b, c, alpha, beta, transA, transB))


def test_gemm_alpha_on_the_larger_operand_too():
    a = small("float", (5, 3), 11)   # A larger than B: alpha scales B
    b = small("float", (3, 2), 12)
    c = small("float", (2,), 13)
    assert_same(run("Gemm", 13, [a, b, c], alpha=0.5, beta=2.0), gemm_ref(a, b, c, 0.5, 2.0))


@pytest.mark.parametrize("version", [7, 9, 11, 13])
@pytest.mark.parametrize("cshape", [(), (1,), (4,), (1, 4), (2, 1), (1, 1), (2, 4)])
def test_gemm_unidirectional_broadcast_of_c(version, cshape):
    a, b = small("float", (2, 3), 14), small("float", (3, 4), 15)
    c = small("float", cshape, 16)
    assert_same(run("Gemm", version, [a, b, c], beta=0.5), gemm_ref(a, b, c, beta=0.5))


@pytest.mark.parametrize("version", [7, 11, 13])
@pytest.mark.parametrize("cshape", [(3,), (2, 2), (3, 4), (1, 2, 4)])
def test_gemm_c_that_does_not_broadcast(version, cshape):
    a, b = np.ones((2, 3), np.float32), np.ones((3, 4), np.float32)
    with pytest.raises(KernelError, match=re.compile(rf"'{NODE}'.*C of shape", re.S)):
        run_node("Gemm", version, [a, b, np.ones(cshape, np.float32)])


@pytest.mark.parametrize("version", [1, 6])
def test_gemm_legacy_broadcast_attribute(version):
    a, b = small("float", (2, 3), 17), small("float", (3, 4), 18)
    vec = small("float", (4,), 19)
    assert_same(run("Gemm", version, [a, b, vec], broadcast=1), gemm_ref(a, b, vec))
    full = small("float", (2, 4), 20)
    assert_same(run("Gemm", version, [a, b, full]), gemm_ref(a, b, full))          # broadcast=0, same shape
    with pytest.raises(KernelError, match="broadcast=0"):
        run("Gemm", version, [a, b, vec])                                            # broadcast=0, needs (2, 4)


@pytest.mark.parametrize("version", [11, 13])
def test_gemm_without_c(version):
    a, b = small("float", (3, 2), 21), small("float", (4, 3), 22)
    assert_same(run("Gemm", version, [a, b], transA=1, transB=1, alpha=2.0),
                gemm_ref(a, b, None, 2.0, 1.0, 1, 1))
    assert_same(run_node("Gemm", version, [a, b, None], keep_empty_tail=True, transA=1, transB=1),
                gemm_ref(a, b, None, 1.0, 1.0, 1, 1))


@pytest.mark.parametrize("version", [1, 6, 7, 9])
def test_gemm_c_required_before_11(version):
    with pytest.raises(InvalidNodeError, match=re.compile(rf"'{NODE}'.*requires the input C", re.S)):
        run_node("Gemm", version, [np.ones((2, 3), np.float32), np.ones((3, 4), np.float32)])


def test_gemm_shape_errors():
    with pytest.raises(KernelError, match=re.compile(rf"'{NODE}'.*cannot be multiplied", re.S)):
        run_node("Gemm", 13, [np.ones((2, 3), np.float32), np.ones((4, 3), np.float32)])
    with pytest.raises(KernelError, match="2-D"):
        run("Gemm", 13, [np.ones((2, 3, 1), np.float32), np.ones((1, 3), np.float32)])


@pytest.mark.parametrize("version", [7, 13])
def test_gemm_checks_each_new_c_shape_on_one_kernel(version):
    """One kernel called again and again (a model's runs): the shape of C is checked for every new pair
    of C and product shapes, a shape it accepted before changes nothing for the next one."""
    fn = gemm_11() if version == 13 else gemm_7(_n_inputs=3)
    a, b = small("float", (2, 3), 23), small("float", (3, 4), 24)
    for cshape in [(4,), (4,), (2, 1), (4,)]:
        c = small("float", cshape, 25)
        assert_same(fn(a, b, c), gemm_ref(a, b, c))
    with pytest.raises(InvalidValueError, match="C of shape"):
        fn(a, b, np.ones((3,), np.float32))
    a1 = small("float", (1, 3), 26)           # the accepted (4,) C against another product shape
    assert_same(fn(a1, b, small("float", (4,), 25)), gemm_ref(a1, b, small("float", (4,), 25)))
    with pytest.raises(InvalidValueError, match="C of shape"):
        fn(a1, b, np.ones((2, 4), np.float32))


@pytest.mark.parametrize("tname", ["float", "double"])
@pytest.mark.parametrize("transB", [0, 1])
@pytest.mark.parametrize("m", [1, 3])
def test_gemm_with_a_constant_bias_row(tname, transB, m):
    """A dense layer (constant 1-D C, alpha = beta = 1: a decoder's [1, 256] x [256, 1000] step) gives the
    bits of the same Gemm with C fed, near the spec's sums; another C, a broadcast one or one of another
    shape than the product's columns still take C as given."""
    dt = np_type(tname)
    r = np.random.default_rng(m + 2 * transB)
    a, b = r.standard_normal((m, 40)).astype(dt), r.standard_normal((40, 7)).astype(dt)
    bb = np.ascontiguousarray(b.T) if transB else b
    c = r.standard_normal(7).astype(dt)
    fn = gemm_11(transB=transB, _constants={2: c})
    y = fn(a, bb, c)
    np.testing.assert_array_equal(y, gemm_11(transB=transB)(a, bb, c.copy()))
    tol = 1e-5 if dt == np.float32 else 1e-12
    np.testing.assert_allclose(y, gemm_ref(a, b, c), rtol=tol, atol=tol)
    c2 = r.standard_normal(7).astype(dt)
    np.testing.assert_allclose(fn(a, bb, c2), gemm_ref(a, b, c2), rtol=tol, atol=tol)
    one = np.array([2.0], dt)
    np.testing.assert_allclose(gemm_11(transB=transB, _constants={2: one})(a, bb, one), gemm_ref(a, b, one),
                               rtol=tol, atol=tol)
    with pytest.raises(InvalidValueError, match="cannot be multiplied"):
        fn(a[:, :39], bb, c)
    wide = r.standard_normal((40, 9)).astype(dt)
    with pytest.raises(InvalidValueError, match="C of shape"):
        fn(a, np.ascontiguousarray(wide.T) if transB else wide, c)


def test_gemm_empty():
    a, b = np.zeros((2, 0), np.float32), np.zeros((0, 3), np.float32)
    c = np.array([1, 2, 3], np.float32)
    assert_same(run("Gemm", 13, [a, b, c]), np.array([[1, 2, 3], [1, 2, 3]], np.float32))


# -- MatMulInteger -------------------------------------------------------------------------------

def int8_values(tname, shape, seed):
    info = np.iinfo(np_type(tname))
    return np.random.default_rng(seed).integers(info.min, info.max + 1, size=shape).astype(np_type(tname))


def mmi_ref(a, b, a_zp, b_zp):
    """(a - a_zp) @ (b - b_zp) in int64 with the spec's per-row / per-column zero points."""
    a64, b64 = a.astype(np.int64), b.astype(np.int64)
    if a_zp is not None:
        a64 = a64 - (a_zp.astype(np.int64).reshape(-1, 1) if a_zp.ndim == 1 and a_zp.size > 1 else a_zp.astype(np.int64))
    if b_zp is not None:
        b64 = b64 - b_zp.astype(np.int64)
    return mm_ref(a64, b64).astype(np.int32)


@pytest.mark.parametrize("ta,tb", itertools.product(["int8", "uint8"], repeat=2))
@pytest.mark.parametrize("zp", ["none", "scalar", "vector", "per_axis_nd"])
def test_matmul_integer_types_and_zero_points(ta, tb, zp):
    a, b = int8_values(ta, (2, 3, 4), 30), int8_values(tb, (2, 4, 5), 31)
    if zp == "none":
        azp = bzp = None
    elif zp == "scalar":
        azp, bzp = int8_values(ta, (), 32), int8_values(tb, (1,), 33)
    elif zp == "vector":  # per row of A (M = 3), per column of B (N = 5)
        azp, bzp = int8_values(ta, (3,), 34), int8_values(tb, (5,), 35)
    else:
        azp, bzp = int8_values(ta, (2, 3, 1), 36), int8_values(tb, (2, 1, 5), 37)
    inputs = [a, b] + ([] if azp is None else [azp, bzp])
    assert_same(run("MatMulInteger", 10, inputs), mmi_ref(a, b, azp, bzp))


def test_matmul_integer_only_b_zero_point():
    a, b = int8_values("uint8", (3, 4), 40), int8_values("int8", (4, 2), 41)
    bzp = np.array([-7, 100], np.int8)
    assert_same(run_node("MatMulInteger", 10, [a, b, None, bzp]), mmi_ref(a, b, None, bzp))


def test_matmul_integer_zero_points_of_lower_rank():
    a, b = int8_values("int8", (2, 3, 4), 42), int8_values("uint8", (2, 4, 5), 43)
    azp, bzp = int8_values("int8", (3, 1), 44), int8_values("uint8", (1, 5), 45)   # [M, 1] and [1, N]
    exp = mm_ref(a.astype(np.int64) - azp.astype(np.int64), b.astype(np.int64) - bzp.astype(np.int64))
    assert_same(run("MatMulInteger", 10, [a, b, azp, bzp]), exp.astype(np.int32))


@pytest.mark.parametrize("k", [256, 257, 5000])
def test_matmul_integer_large_sums_are_exact(k):
    # |(a - zp) * (b - zp)| = 255 * 255 for every term: sums of k of them stay exact
    a = np.full((2, k), 255, np.uint8)
    b = np.full((k, 2), -128, np.int8)
    azp, bzp = np.array(0, np.uint8), np.array(127, np.int8)
    assert_same(run("MatMulInteger", 10, [a, b, azp, bzp]), np.full((2, 2), -255 * 255 * k, np.int32))
    b2 = b.copy()
    b2[-1, :] = 126  # one term changes by 255 * 254: an off-by-one in float32 would show
    assert_same(run("MatMulInteger", 10, [a, b2, azp, bzp]), np.full((2, 2), -255 * 255 * (k - 1) - 255, np.int32))


def test_matmul_integer_spec_example():
    a = np.array([[11, 7, 3], [10, 6, 2], [9, 5, 1], [8, 4, 0]], np.uint8)
    b = np.array([[1, 4], [2, 5], [3, 6]], np.uint8)
    y = run("MatMulInteger", 10, [a, b, np.array(12, np.uint8), np.array(0, np.uint8)])
    assert_same(y, np.array([[-38, -83], [-44, -98], [-50, -113], [-56, -128]], np.int32))


def test_matmul_integer_bad_zero_point():
    a, b = np.ones((3, 4), np.uint8), np.ones((4, 2), np.uint8)
    with pytest.raises(KernelError, match=re.compile(rf"'{NODE}'.*a_zero_point of shape \[4\]", re.S)):
        run_node("MatMulInteger", 10, [a, b, np.ones(4, np.uint8)])
    with pytest.raises(KernelError, match="cannot be multiplied"):
        run("MatMulInteger", 10, [a, np.ones((3, 2), np.uint8)])


# -- QLinearMatMul -------------------------------------------------------------------------------

def qlinear_ref(a, sa, za, b, sb, zb, sy, zy):
    """saturate(round_half_even(((a - za) @ (b - zb)) * sa * sb / sy) + zy), in float64."""
    row = lambda p: p.astype(np.float64).reshape(-1, 1) if p.ndim == 1 and p.size > 1 else p.astype(np.float64)
    acc = mm_ref(a.astype(np.float64) - row(za), b.astype(np.float64) - zb.astype(np.float64))
    y = np.rint(acc * row(sa) * sb.astype(np.float64) / sy.astype(np.float64)) + zy.astype(np.float64)
    info = np.iinfo(zy.dtype)
    return np.clip(y, info.min, info.max).astype(zy.dtype)


QL_TYPES = list(itertools.product(["int8", "uint8"], repeat=3))


@pytest.mark.parametrize("version", [10, 21])
@pytest.mark.parametrize("ta,tb,ty", QL_TYPES)
def test_qlinear_matmul_integer_types(version, ta, tb, ty):
    a, b = int8_values(ta, (2, 3, 4), 50), int8_values(tb, (4, 5), 51)
    # power-of-two scales: the multiplier 1/8 is exact, so ties (x.5) really test half-to-even
    sa, sb, sy = np.array(0.5, np.float32), np.array([0.25], np.float32), np.array(1.0, np.float32)
    za, zb, zy = int8_values(ta, (), 52), int8_values(tb, (), 53), int8_values(ty, (), 54)
    ins = [a, sa, za, b, sb, zb, sy, zy]
    assert_same(run("QLinearMatMul", version, ins), qlinear_ref(*ins))


def test_qlinear_matmul_rounds_half_to_even():
    a = np.array([[1, 3, 5, 7]], np.uint8).T  # (4, 1) @ (1, 1): acc = 1, 3, 5, 7; times 0.5
    b = np.array([[1]], np.uint8)
    one, zero = np.array(1.0, np.float32), np.array(0, np.uint8)
    y = run("QLinearMatMul", 10, [a, np.array(0.5, np.float32), zero, b, one, zero, one, zero])
    assert_same(y, np.array([[0], [2], [2], [4]], np.uint8))  # 0.5, 1.5, 2.5, 3.5


@pytest.mark.parametrize("version", [10, 21])
def test_qlinear_matmul_per_row_and_per_column(version):
    a, b = int8_values("uint8", (3, 4), 55), int8_values("int8", (4, 2), 56)
    sa = np.array([0.5, 0.25, 0.125], np.float32)
    za = np.array([128, 120, 3], np.uint8)
    sb = np.array([0.25, 0.5], np.float32)
    zb = np.array([0, -5], np.int8)
    sy, zy = np.array(4.0, np.float32), np.array(100, np.uint8)
    ins = [a, sa, za, b, sb, zb, sy, zy]
    assert_same(run("QLinearMatMul", version, ins), qlinear_ref(*ins))


def test_qlinear_matmul_nd_per_row_and_per_column():
    a, b = int8_values("int8", (2, 3, 4), 59), int8_values("int8", (2, 4, 2), 60)
    sa = np.array([0.5, 0.25, 1.0, 2.0, 0.125, 0.5], np.float32).reshape(2, 3, 1)
    za = int8_values("int8", (2, 3, 1), 61)
    sb = np.array([0.25, 0.5, 1.0, 0.125], np.float32).reshape(2, 1, 2)
    zb = int8_values("int8", (2, 1, 2), 62)
    sy, zy = np.array(8.0, np.float32), np.array(-3, np.int8)
    ins = [a, sa, za, b, sb, zb, sy, zy]
    assert_same(run("QLinearMatMul", 21, ins), qlinear_ref(*ins))


def test_qlinear_matmul_saturates():
    a = np.full((1, 4), 255, np.uint8)
    b = np.full((4, 2), 127, np.int8)
    b[:, 1] = -128
    one, zu, zi = np.array(1.0, np.float32), np.array(0, np.uint8), np.array(0, np.int8)
    assert_same(run("QLinearMatMul", 10, [a, one, zu, b, one, zi, one, zi]), np.array([[127, -128]], np.int8))


@pytest.mark.parametrize("stype", [np.float16, ml_dtypes.bfloat16])
def test_qlinear_matmul_21_low_precision_scales(stype):
    a, b = int8_values("int8", (2, 4), 57), int8_values("uint8", (4, 3), 58)
    sa, sb, sy = np.array(0.5, stype), np.array(0.25, stype), np.array(2.0, stype)
    za, zb, zy = np.array(-3, np.int8), np.array(130, np.uint8), np.array(10, np.int8)
    ins = [a, sa, za, b, sb, zb, sy, zy]
    assert_same(run("QLinearMatMul", 21, ins), qlinear_ref(*ins))


FLOAT8 = ["float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz"]


@pytest.mark.parametrize("ta,ty", [(t, t) for t in FLOAT8] + [("float8e4m3fn", "float8e5m2"), ("int8", "float8e4m3fn")])
def test_qlinear_matmul_21_float8(ta, ty):
    fa = np.array([[1, 2, -0.5], [4, 0, 1.5]])
    a = fa.astype(np_type(ta))
    b = np.array([[1, 0], [0.5, 1], [2, -1]]).astype(np_type(ta))
    zero_a = np.zeros((), np_type(ta))
    sa, sb, sy = np.array(1.0, np.float32), np.array(1.0, np.float32), np.array(0.5, np.float32)
    zy = np.zeros((), np_type(ty))
    exact = mm_ref(a.astype(np.float64), b.astype(np.float64)) / 0.5   # [[4, 3], [14, -1]]
    y = run("QLinearMatMul", 21, [a, sa, zero_a, b, sb, zero_a, sy, zy])
    assert_same(y, exact.astype(np_type(ty)))


def test_qlinear_matmul_21_float8_saturates():
    a = np.array([[448, 448]], dtype=ml_dtypes.float8_e4m3fn)
    b = np.array([[1], [1]], dtype=ml_dtypes.float8_e4m3fn)
    z = np.zeros((), ml_dtypes.float8_e4m3fn)
    one = np.array(1.0, np.float32)
    y = run("QLinearMatMul", 21, [a, one, z, b, one, z, one, z])   # 896 -> the largest finite value, 448
    assert_same(y, np.array([[448]], ml_dtypes.float8_e4m3fn))


def test_qlinear_matmul_bad_parameters():
    a, b = np.ones((2, 3), np.uint8), np.ones((3, 2), np.uint8)
    one, z = np.array(1.0, np.float32), np.array(0, np.uint8)
    with pytest.raises(KernelError, match=re.compile(rf"'{NODE}'.*a_scale of shape \[3\]", re.S)):
        run_node("QLinearMatMul", 10, [a, np.ones(3, np.float32), z, b, one, z, one, z])
    with pytest.raises(KernelError, match="y_scale"):
        run("QLinearMatMul", 10, [a, one, z, b, one, z, np.ones(2, np.float32), z])
    with pytest.raises(KernelError, match="cannot be multiplied"):
        run("QLinearMatMul", 10, [a, one, z, np.ones((2, 2), np.uint8), one, z, one, z])


# -- Einsum --------------------------------------------------------------------------------------

@pytest.mark.parametrize("version,tname", type_matrix("Einsum", [12, 28]))
def test_einsum_every_type(version, tname):
    a, b = small(tname, (2, 3), 60), small(tname, (3, 4), 61)
    assert_same(run("Einsum", version, [a, b], equation="ij,jk->ik"), mm_ref(a, b).astype(a.dtype))


def loops(shape):
    return np.ndindex(*shape)


EINSUM_CASES = [
    # (equation, input shapes, expected as a function of the inputs, written with loops / plain ops)
    ("ij->ji", [(2, 3)], lambda x: np.array([[x[i, j] for i in range(2)] for j in range(3)])),
    ("ij", [(2, 3)], lambda x: x),                                        # implicit: ij stays ij
    ("ba", [(2, 3)], lambda x: x.T),                                      # implicit: sorted -> ab
    ("aB", [(2, 3)], lambda x: x.T),                                      # upper case sorts first: Ba
    ("ii->i", [(3, 3)], lambda x: np.array([x[i, i] for i in range(3)])),
    ("ii", [(3, 3)], lambda x: np.array(sum(x[i, i] for i in range(3)))),
    ("ij->", [(2, 3)], lambda x: np.array(x.sum())),
    ("i,i", [(4,), (4,)], lambda x, y: np.array(sum(x[i] * y[i] for i in range(4)))),
    ("i,j->ij", [(2,), (3,)], lambda x, y: np.array([[x[i] * y[j] for j in range(3)] for i in range(2)])),
    ("bij,bjk->bik", [(2, 2, 3), (2, 3, 2)], lambda x, y: mm_ref(x, y)),
    ("...ij,...jk->...ik", [(2, 1, 2, 3), (4, 3, 2)], lambda x, y: mm_ref(x, y)),
    ("...ii->...i", [(2, 3, 3)], lambda x: np.array([[x[b, i, i] for i in range(3)] for b in range(2)])),
    ("i...->...", [(3, 2, 2)], lambda x: x.sum(axis=0)),
    ("...j,j", [(2, 3), (3,)], lambda x, y: mm_ref(x, y)),                # implicit: ellipsis first
    (" ij , jk -> ik ", [(2, 3), (3, 2)], lambda x, y: mm_ref(x, y)),       # spaces allowed
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)], lambda x, y, z: mm_ref(mm_ref(x, y), z)),
    ("ij,ij->ij", [(2, 3), (2, 3)], lambda x, y: x * y),
    ("i,i->", [(0,), (0,)], lambda x, y: np.array(0.0)),
]


@pytest.mark.parametrize("equation,shapes,ref", EINSUM_CASES, ids=[c[0] for c in EINSUM_CASES])
@pytest.mark.parametrize("tname", ["float", "int32", "float16"])
def test_einsum_equations(equation, shapes, ref, tname):
    ops = [small(tname, s, 70 + k) for k, s in enumerate(shapes)]
    wide = np.int64 if tname == "int32" else np.float64
    exp = np.asarray(ref(*[o.astype(wide) for o in ops])).astype(np_type(tname))
    assert_same(run("Einsum", 12, ops, equation=equation), exp)


def test_einsum_large_operands_use_the_optimized_path():
    a, b = small("float", (40, 50), 80), small("float", (50, 30), 81)
    got = run("Einsum", 28, [a, b], equation="ij,jk->ik")
    np.testing.assert_allclose(got, mm_ref(a, b), rtol=1e-6)
    assert got.dtype == np.float32


@pytest.mark.parametrize("equation", ["ij,jk->iz", "ij->ii", "i1->i", "ij->...i", "i->i->i", "i.j->ij"])
def test_einsum_bad_equation(equation):
    with pytest.raises(InvalidNodeError, match=re.compile(rf"'{NODE}'.*Einsum equation", re.S)):
        run_node("Einsum", 12, [np.ones((2, 2), np.float32)], equation=equation)


def test_einsum_operands_that_do_not_fit():
    with pytest.raises(KernelError, match=re.compile(rf"'{NODE}'.*2 input terms but the node has 1", re.S)):
        run_node("Einsum", 12, [np.ones((2, 2), np.float32)], equation="ij,jk->ik")
    with pytest.raises(KernelError, match="term 'ijk'"):
        run("Einsum", 12, [np.ones((2, 2), np.float32)], equation="ijk->i")
    with pytest.raises(KernelError, match="einsum"):
        run("Einsum", 12, [np.ones((2, 3), np.float32), np.ones((4, 2), np.float32)], equation="ij,jk->ik")


# -- Det -----------------------------------------------------------------------------------------

def det_ref(m):
    """Laplace expansion along the first row (float64)."""
    n = m.shape[0]
    if n == 0:
        return 1.0
    if n == 1:
        return float(m[0, 0])
    return sum((-1) ** j * float(m[0, j]) * det_ref(np.delete(m[1:], j, axis=1)) for j in range(n))


@pytest.mark.parametrize("version,tname", type_matrix("Det", [11, 22]))
def test_det_every_type(version, tname):
    x = np.array([[1, 2], [3, 4]], dtype=np_type(tname))
    got = run("Det", version, [x])  # LU-based: within a few ulps of -2
    assert type(got) is np.ndarray and got.dtype == x.dtype and got.shape == ()
    np.testing.assert_allclose(got.astype(np.float64), -2.0, rtol=1e-6)


@pytest.mark.parametrize("version", [11, 22])
def test_det_batched(version):
    x = (np.arange(2 * 3 * 3 * 3) % 7 - 3).reshape(2, 3, 3, 3).astype(np.float64) + np.eye(3)
    exp = np.array([[det_ref(x[i, j]) for j in range(3)] for i in range(2)])
    got = run("Det", version, [x])
    assert got.dtype == np.float64 and got.shape == (2, 3)
    np.testing.assert_allclose(got, exp, rtol=1e-12, atol=1e-12)


def test_det_empty_batch_and_singular():
    assert_same(run("Det", 22, [np.zeros((0, 2, 2), np.float32)]), np.zeros((0,), np.float32))
    assert_same(run("Det", 22, [np.array([[1, 2], [2, 4]], np.float32)]), np.array(0, np.float32))


@pytest.mark.parametrize("shape", [(2, 3), (3,), (2, 2, 3)])
def test_det_needs_square_matrices(shape):
    with pytest.raises(KernelError, match=re.compile(rf"'{NODE}'.*square", re.S)):
        run_node("Det", 22, [np.ones(shape, np.float32)])
