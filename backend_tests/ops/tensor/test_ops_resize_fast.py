"""Resize's integer-factor fast paths (plain repeats, periodic taps) and its per-node geometry memo.

The fast paths must give the bits of the general path (one weighted gather per tap, summed in tap
order: resize.FAST = False forces it), on random data with NaN and inf, every mode and coordinate
mode, factors 2/3/4, odd and tiny sizes, axes subsets and several types; and hand-computed values
from the spec's formulas for tiny cases.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from onnx_mini.errors import InvalidValueError
from onnx_mini.ops.tensor import resize

NEAREST = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]
COORDS = ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric"]


@pytest.fixture(autouse=True)
def fast_paths_at_every_size(monkeypatch):
    """Small arrays keep the gathers (thresholds in resize.py): these tests take the fast paths anyway."""
    monkeypatch.setattr(resize, "FAST_MIN_LAST", 0)
    monkeypatch.setattr(resize, "FAST_MIN_OUTER", 0)


def kernel(version=19, **attrs):
    """The Resize kernel function of one node (a fresh memo)."""
    return (resize.resize_11 if version < 18 else resize.resize_18)(**attrs)


def memo(fn) -> dict:
    """The geometry memo of one kernel function (its _Resizer's)."""
    return fn.__closure__[0].cell_contents.memo


def bits(a: np.ndarray) -> np.ndarray:
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def data(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    v = rng.standard_normal(shape) * 50
    if np.dtype(dtype).kind == "f" or dtype == ml_dtypes.bfloat16:
        flat = v.reshape(-1)
        flat[rng.integers(0, flat.size, 3)] = [np.nan, np.inf, -np.inf]
        return v.astype(dtype)
    if dtype == np.bool_:
        return v > 0
    info = np.iinfo(dtype)
    return np.clip(v, info.min, info.max).astype(dtype)


def both(fn, x, scales, monkeypatch, roi=None):
    """(fast result, general result, the fast paths taken) of one kernel on x."""
    taken = []
    periodic, repeat = resize._apply_periodic, resize._repeat
    monkeypatch.setattr(resize, "_apply_periodic", lambda *a: taken.append(("periodic", a[1], a[2].f)) or periodic(*a))
    monkeypatch.setattr(resize, "_repeat", lambda *a: taken.append(("repeat", a[1], a[2])) or repeat(*a))
    sc = np.array(scales, np.float32)
    with np.errstate(invalid="ignore", over="ignore"):     # inf and NaN in the data
        fast = fn(x, roi, sc)
        monkeypatch.setattr(resize, "FAST", False)
        general = fn(x, roi, sc)
    monkeypatch.setattr(resize, "FAST", True)
    return fast, general, taken


def assert_bits(fast, general, what):
    """The same bits; a NaN made by inf - inf or 0 * inf may differ in sign (x86 gives the first
    operand's NaN, and numpy's vector and scalar loops order the operands of a commutative add
    differently): NaN where NaN, every other value bit for bit. Copies (nearest) keep even NaN bits."""
    assert fast.dtype == general.dtype and fast.shape == general.shape, what
    if fast.dtype.kind == "f" or fast.dtype == ml_dtypes.bfloat16:
        nan = np.isnan(general)
        np.testing.assert_array_equal(np.isnan(fast), nan, err_msg=str(what))
        fast, general = np.where(nan, 0, fast), np.where(nan, 0, general)
    np.testing.assert_array_equal(bits(fast), bits(general), err_msg=str(what))


@pytest.mark.parametrize("coord", COORDS)
@pytest.mark.parametrize("f", [2, 3, 4])
@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_fast_paths_give_the_bits_of_the_gathers(mode, f, coord, monkeypatch):
    taken_any = []
    for nearest in (NEAREST if mode == "nearest" else [None]):
        attrs = {"mode": mode, "coordinate_transformation_mode": coord}
        if nearest:
            attrs["nearest_mode"] = nearest
        for shape, scales, seed in [((2, 3, 5, 7), [1, 1, f, f], 0), ((1, 2, 1, 2), [1, 1, f, f], 1),
                                    ((3, 4, 6), [1, f, f], 2), ((2, 9), [f, 1], 3), ((5, 3, 4), [f, 2, 1], 4)]:
            for dtype in ([np.float32, np.float16, np.int32, np.uint8, np.int64, np.bool_, ml_dtypes.bfloat16]
                          if mode == "nearest" else [np.float32, np.float16, np.float64, np.int32, np.uint8]):
                x = data(shape, dtype, seed)
                fast, general, taken = both(kernel(**attrs), x, scales, monkeypatch)
                assert_bits(fast, general, (attrs, shape, scales, np.dtype(dtype).name))
                if mode == "nearest":
                    np.testing.assert_array_equal(bits(fast), bits(general))
                taken_any += taken
    if coord in ("half_pixel", "asymmetric", "pytorch_half_pixel"):
        assert any(t[0] == ("repeat" if mode == "nearest" else "periodic") and t[2] == f for t in taken_any)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_axes_subsets_odd_sizes_and_other_layouts(mode, monkeypatch):
    for axes, scales in [([1], [3]), ([0, 2], [2, 4]), ([2, 0], [4, 2]), ([-1, 1], [2, 3])]:
        fn = kernel(mode=mode, axes=axes)
        x = data((3, 5, 7), np.float32, len(axes))
        fast, general, taken = both(fn, x, scales, monkeypatch)
        assert_bits(fast, general, (mode, axes))
        assert taken or (mode != "linear" and 2 not in [a % 3 for a in axes])   # (last axis only but linear)
    # a last axis that is not contiguous (a transposed input), tf_half_pixel_for_nn (Resize-11)
    x = data((4, 6, 5), np.float32, 9).transpose(0, 2, 1)
    for fn in (kernel(mode=mode), kernel(11, mode=mode, coordinate_transformation_mode="tf_half_pixel_for_nn")):
        fast, general, _ = both(fn, x, [1, 2, 3], monkeypatch, roi=np.array([], np.float32))
        assert_bits(fast, general, mode)


def test_exclude_outside_antialias_and_extrapolation_keep_their_bits(monkeypatch):
    x = data((2, 3, 6, 5), np.float32, 5)
    for attrs in [{"mode": "cubic", "exclude_outside": 1}, {"mode": "linear", "antialias": 1},
                  {"mode": "cubic", "antialias": 1, "cubic_coeff_a": -0.5}]:
        fast, general, _ = both(kernel(**attrs), x, [1, 1, 2, 3], monkeypatch)
        assert_bits(fast, general, attrs)
    roi = np.array([0, 0, 0.1, -0.2, 1, 1, 0.9, 1.1], np.float32)
    for mode in ("nearest", "linear"):
        fn = kernel(mode=mode, coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=-3.0)
        fast, general, _ = both(fn, x, [1, 1, 2, 2], monkeypatch, roi=roi)
        assert_bits(fast, general, mode)
        assert (fast == -3).any()


# -- hand-computed from the spec's formulas ----------------------------------------------------------

def test_linear_2x_half_pixel_by_hand():
    """x_original = (i + 0.5) / 2 - 0.5: even outputs 0.25 x[m-1] + 0.75 x[m], odd ones
    0.75 x[m] + 0.25 x[m+1], indices clamped to the edges (all values exact in binary)."""
    row = kernel(mode="linear")(np.array([[1, 2, 4]], np.float32), None, np.array([1, 2], np.float32))
    np.testing.assert_array_equal(row, [[1, 1.25, 1.75, 2.5, 3.5, 4]])
    x = np.array([[[[1, 2], [3, 5]]]], np.float32)
    got = kernel(mode="linear")(x, None, np.array([1, 1, 2, 2], np.float32))
    # rows first resized: [1, 1.25, 1.75, 2] and [3, 3.5, 4.5, 5]; then the same rule between them
    np.testing.assert_array_equal(got[0, 0], [[1, 1.25, 1.75, 2], [1.5, 1.8125, 2.4375, 2.75],
                                              [2.5, 2.9375, 3.8125, 4.25], [3, 3.5, 4.5, 5]])


def test_nearest_by_hand():
    """half_pixel, round_prefer_floor at 2x and 3x: output i reads input i // f (x_original =
    (i + 0.5) / f - 0.5 rounds there, ties down); asymmetric, round_prefer_ceil at 2x: x_original
    = i / 2 and 0.5 rounds up, so 1, 3, ... read the next input (clamped at the end)."""
    x = np.array([[1, 2], [3, 4]], np.int32)
    fn = kernel(mode="nearest")
    np.testing.assert_array_equal(fn(x, None, np.array([2, 2], np.float32)),
                                  [[1, 1, 2, 2], [1, 1, 2, 2], [3, 3, 4, 4], [3, 3, 4, 4]])
    np.testing.assert_array_equal(fn(x, None, np.array([1, 3], np.float32)), [[1, 1, 1, 2, 2, 2], [3, 3, 3, 4, 4, 4]])
    words = fn(np.array([["a", "bc"], ["d", "e"]], dtype=object), None, np.array([1, 2], np.float32))
    assert words.dtype == object and words.tolist() == [["a", "a", "bc", "bc"], ["d", "d", "e", "e"]]
    fn = kernel(mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="round_prefer_ceil")
    np.testing.assert_array_equal(fn(np.array([1, 2, 3], np.float32), None, np.array([2], np.float32)),
                                  [1, 2, 2, 3, 3, 3])


@pytest.mark.parametrize("mode, shape, steps", [
    ("nearest", (1, 64, 32, 32), [(3, "repeat"), (2, None)]),          # bench_suite U-Net's Resize_126
    ("linear", (1, 32, 64, 64), [(3, "periodic"), (2, "periodic")]),   # ... and Resize_155
    ("linear", (1, 32, 16, 16), [(3, "periodic"), (2, None)]),         # the outer axis: 16384 values
    ("linear", (1, 2, 8, 8), [(3, None), (2, None)]),                  # small: the gathers
    ("nearest", (1, 2, 8, 8), [(3, None), (2, None)])])
def test_the_paths_taken_at_the_real_thresholds(mode, shape, steps, monkeypatch):
    monkeypatch.undo()          # the real thresholds, not the fixture's
    fn = kernel(mode=mode, coordinate_transformation_mode="half_pixel")
    x = data(shape, np.float32, 0)
    with np.errstate(invalid="ignore"):
        y = fn(x, None, np.array([1, 1, 2, 2], np.float32))
    (geo,) = memo(fn).values()
    assert [(s.axis, s.fast) for s in geo.steps] == steps
    assert all(s.period.f == 2 for s in geo.steps)
    if mode == "nearest":
        np.testing.assert_array_equal(bits(y), bits(x.repeat(2, axis=2).repeat(2, axis=3)))


# -- the geometry memo --------------------------------------------------------------------------------

def test_geometry_is_worked_out_once_per_input_key_per_node(monkeypatch):
    calls = []
    geometry = resize._geometry
    monkeypatch.setattr(resize, "_geometry", lambda *a: calls.append(a[1]) or geometry(*a))
    fn, other = kernel(mode="linear"), kernel(mode="linear")
    sc = np.array([1, 2], np.float32)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    first = fn(x, None, sc)
    assert np.array_equal(fn(x + 0, None, sc.copy()), first) and calls == [(2, 3)]
    fn(x, None, np.array([1, 3], np.float32))          # other scales: another key
    fn(x.astype(np.float64), None, sc)                  # another type
    other(x, None, sc)                                  # another node: its own memo
    assert calls == [(2, 3)] * 4
    for k in range(resize.GEOMETRIES + 3):              # bounded
        fn(np.zeros((1, k + 1), np.float32), None, sc)
    assert 0 < len(memo(fn)) <= resize.GEOMETRIES


def test_bad_input_is_not_remembered():
    fn = kernel(mode="nearest")
    x = np.zeros((2, 3), np.float32)
    for _ in range(2):
        with pytest.raises(InvalidValueError, match="scales has 3 values"):
            fn(x, None, np.array([1, 2, 2], np.float32))
    assert not memo(fn)
