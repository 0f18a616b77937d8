"""Internal kernels of the private domain "onnx_mini.fused": what the optimiser's rewrites run
(optimize/ writes the nodes; the kernels are found like every other family's).

Conv, Gemm, MatMul: the existing kernel code (imported, never copied), then the extra work in place
on the buffer that code just allocated: a residual / bias added (Conv Z, MatMul bias) and the
activation (Relu, Clip, LeakyRelu, Sigmoid, HardSigmoid, HardSwish, Tanh, Swish); MatMul also takes
a second addend after its bias (two Adds folded in, summed in the graph's order). Float32/float64
results are changed in place; float16/bfloat16 go through float32 and round back once (as the
activation kernels do); integer results (MatMul) take Relu/Clip in place. A result that is not our
own buffer (read-only, or sharing memory with an input) is copied first.
QuantizeDequantize: a QuantizeLinear read back by its DequantizeLinear (optimize/qdq_pair.py).
ChannelAffine: inference BatchNormalization with its factor and shift computed at prepare time.
Swish, Gelu, LayerNormalization: the standard kernels, for models whose opset predates the op.
Attention: softmax(Q K' / c + mask) V with the scores worked on in place.
OneHotMatMul: a one-hot (Equal with a constant row, Cast) times a constant matrix, as a gather of its rows.
ConvNHWC, QLinearConvNHWC: Conv and QLinearConv on channels-last data (optimize/channels_last.py).
Conv and ConvNHWC with `requantize`: the QuantizeDequantize / LookupTable step after them run in place
in their epilogue (optimize/requantize.py).
"""
from __future__ import annotations

from operator import is_

import numpy as np

from .. import blas, memory
from ..errors import InvalidValueError
from ..registry import kernel
from ._common import (UPCAST, as_array, broadcasts_to, clip_ufunc as _clip, fp_errors_ignored, prepack,
                      with_scalar)
from .math.activations import ONES, gelu_20, sigmoid_of_negated, swish_24
from .math.matmul import gemm_11, matmul, matmul_1
from .math.softmax import SOFTMAX_VIA_F32, along_axis, softmax
from .nn.conv import Convolution
from .nn.conv.channels_last import ConvNHWC, through_nchw
from .nn.conv.pointwise import shuffled
from .nn.conv_quantized import qlinear_conv_channels_last
from .nn.normalization import last_axis_sums, layer_normalization_17
from .nn.pool import average_pool_function, max_pool_function
from .quantization import quantize_dequantize, quantized_lookup

FUSED_DOMAIN = "onnx_mini.fused"

_INPLACE = (np.dtype(np.float32), np.dtype(np.float64))
# Clip with both bounds as one np.clip pass from this many values, a maximum and a minimum pass below
# (float32, under load: 65536 values 12.7 against 19.7 us, 4096 5.9 / 5.4, 1024 3.5 / 5.1, 64 3.3 / 2.5;
# 3.2 MB 0.12 against 0.23 ms)
CLIP_ONE_PASS_MIN = 16384


def _clip_between(y, lo, hi) -> None:
    """y = min(max(y, lo), hi) in place (float32/float64 y, scalar bounds): one clip pass from
    CLIP_ONE_PASS_MIN values on, a maximum and a minimum pass below. NaN propagates either way and lo > hi
    gives hi; only a zero's sign may differ (np.clip keeps a -0.0 that max(-0.0, 0.0) turns to 0.0), as it
    does against the unfused HardSigmoid / HardSwish, which clip in one pass: equal values."""
    if y.size >= CLIP_ONE_PASS_MIN:
        _clip(y, lo, hi, out=y)
    else:
        with_scalar(np.maximum, y, lo, out=y)
        with_scalar(np.minimum, y, hi, out=y)


def _activation(name: str, params, affine=()):
    """The function applying activation `name` in place on a float32/float64 (or, Relu/Clip, integer) array,
    then, with affine = (scale, shift) (either None), the Mul by scale and Add of shift that followed it
    (one-element constants of the output's type: optimize/fuse.py), as two more in-place steps."""
    act = _plain_activation(name, params) if name else None
    if not affine:
        return act
    scale, shift = affine

    def then_affine(y):
        if act is not None:
            act(y)
        if scale is not None:
            np.multiply(y, y.dtype.type(scale), out=y)
        if shift is not None:
            np.add(y, y.dtype.type(shift), out=y)
    return then_affine


def _plain_activation(name: str, params):
    p = tuple(params)
    if name == "Relu":
        return lambda y: with_scalar(np.maximum, y, 0, out=y)
    if name == "Clip":
        lo, hi = p
        bounds = {}     # float dtype -> (lo, hi) of that type

        def clip(y):
            if lo is not None and hi is not None and y.dtype in _INPLACE:
                lh = bounds.get(y.dtype)
                if lh is None:
                    with np.errstate(over="ignore"):     # a bound past float32's range: +-inf
                        lh = bounds[y.dtype] = (y.dtype.type(lo), y.dtype.type(hi))
                _clip_between(y, *lh)
                return
            if lo is not None:
                with_scalar(np.maximum, y, lo, out=y)
            if hi is not None:
                with_scalar(np.minimum, y, hi, out=y)
        return clip
    if name == "LeakyRelu":
        (alpha,) = p
        pick = np.maximum if alpha <= 1 else np.minimum
        return lambda y: pick(y, np.multiply(y, alpha), out=y)
    if name == "Sigmoid":
        return _sigmoid_inplace
    if name == "Tanh":
        return lambda y: np.tanh(y, out=y)
    if name in ("HardSigmoid", "HardSwish"):
        alpha, beta = p if name == "HardSigmoid" else (1.0 / 6.0, 0.5)

        def hard(y):
            t = np.multiply(y, alpha) if name == "HardSwish" else np.multiply(y, alpha, out=y)
            t += beta
            _clip_between(t, 0, 1)
            if name == "HardSwish":
                y *= t
        return hard
    if name == "ClipSwish":  # x * Clip(x + 3, 0, 6) / 6 as written (see fused_clip_swish)
        divide, scale = p
        return lambda y: _clip_swish(y, divide, scale, y)
    if name == "Swish":      # x * sigmoid(x): SiLU recognised by the optimiser
        def swish(y):
            t = np.negative(y)
            _sigmoid_of_negated(t)
            y *= t
        return swish
    raise ValueError(f"unknown fused activation {name!r}")


def _sigmoid_inplace(y):
    if y.size == 1:     # (a [1, 64] x [64, 1] Gemm's output)
        _sigmoid_one(y)
        return
    np.negative(y, out=y)
    _sigmoid_of_negated(y)


# exp(t) is inf for t > 88.7 (float32): 1 / (1 + inf) = 0, without a warning. The ignored overflow is
# the one per-call cost kept (fp_errors_ignored: ~0.4 us, np.errstate's decorator ~1.4): the
# warning-free forms measured slower on 64 values (the Sigmoid kernel's exp(-|y|) form and its masks:
# 5.2 against 3.8 us) or change results (t clamped to 88.7: 3e-39 instead of 0 for y below -88.7;
# 0.5 + 0.5 tanh(y / 2): the tail). ([1, 64]: the whole activation 4.4 -> 3.3 us with the 1 a 0-d
# array, measured under load.)
_sigmoid_of_negated = fp_errors_ignored(over="ignore")(sigmoid_of_negated)


# numpy's in-place ufunc on a one-element array costs ~0.9 us more than writing another array (its
# overlap handling; [1, 1] float32 np.negative: 1.75 against 0.83 us, [1, 2]: no difference): one element
# goes back and forth between y and a scratch element, the same operations (whole activation ~8.5 ->
# ~4.4 us, measured under load)
@fp_errors_ignored(over="ignore")
def _sigmoid_one(y):
    t = np.negative(y)
    np.exp(t, out=y)
    np.add(y, ONES[y.dtype], out=t)
    np.reciprocal(t, out=y)


def _finisher(activation: str, params, affine=()):
    """-> finish(y, inputs): y with the activation (and affine: _activation) applied, in place when y is
    our own buffer (checked against the step's inputs; inputs None: y is known to be a fresh buffer)."""
    if not activation and not affine:
        return None
    act = _activation(activation, params, affine)
    ints_ok = activation in ("Relu", "Clip") and not affine

    def finish(y, inputs):
        dt = y.dtype
        if dt in UPCAST:
            t = y.astype(np.float32)
            act(t)
            return t.astype(dt)
        if dt not in _INPLACE and not (ints_ok and dt.kind in "iu"):
            raise ValueError(f"activation {activation} is not defined for {dt}")
        if inputs is not None and not _own(y, inputs):
            y = y.copy()
        act(y)
        return y
    return finish


def _own(y: np.ndarray, inputs) -> bool:
    """Whether y is a buffer the step may write: writeable and no input's memory. A fresh product
    owns its memory (base None): only the identity with an input is left to rule out, which costs
    nothing next to np.may_share_memory (~0.3 us an input)."""
    if not y.flags.writeable:
        return False
    if y.base is None:
        for i in inputs:
            if i is y:
                return False
        return True
    for i in inputs:
        if isinstance(i, np.ndarray) and np.may_share_memory(y, i):
            return False
    return True


def _fits(shape: tuple, target: tuple) -> bool:
    """broadcasts_to with the cases every call meets first decided without np.broadcast_shapes
    (~3.4 us here): the same shape, or the target's trailing dimensions (a bias)."""
    return shape == target[len(target) - len(shape):] or broadcasts_to(shape, target)


def _with(fn, finish):
    """fn, then finish on its result; fixed arities (2 to 4 inputs) keep CPython's fast call path."""
    if finish is None:
        return fn

    def run(a, b, c=None, d=None):
        if d is not None:
            return finish(fn(a, b, c, d), (a, b, c, d))
        if c is not None:
            return finish(fn(a, b, c), (a, b, c))
        return finish(fn(a, b), (a, b))
    return run


@kernel("Conv", since=1, domain=FUSED_DOMAIN, multi_output=False, heavy=True)
def fused_conv(*, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None,
               activation="", activation_params=(), affine=(), shuffle=0, shuffle_dims=(), requantize="", q_version=0,
               dq_version=0, codes="uint8", _constants=None, _options=None):
    """Conv, plus a residual Z (an Add / Sum folded in: in place when it keeps the output's shape), then
    the activation in place (and affine: a Mul / Add of one-element constants after it, _activation); with
    shuffle = g, the channel shuffle Reshape (N, g, C/g, H, W) ->
    Transpose (0, 2, 1, 3, 4) -> Reshape `shuffle_dims` that followed (optimize/channel_shuffle.py).
    Inputs X, W, B, Z: a constant W and B are prepared once (nn.conv.Convolution), B in shuffle order.
    With requantize (QuantizeDequantize / LookupTable, with their attributes q_version, dq_version,
    codes), that step of the output follows (optimize/requantize.py), its inputs after X, W, B, Z."""
    if requantize:
        if shuffle:
            raise ValueError("a Conv writing a channel shuffle takes no requantization step")
        return _requantized(fused_conv, requantize, q_version, dq_version, codes, _constants,
                            dict(auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape,
                                 pads=pads, strides=strides, activation=activation,
                                 activation_params=activation_params, affine=affine, _options=_options))
    constants = dict(_constants or {})
    b_const = b_shuffled = constants.get(2)
    if shuffle and b_const is not None:         # the shuffled product takes B in shuffle order
        constants[2] = b_shuffled = _shuffled_bias(b_const, shuffle)
    convolution = Convolution(auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape,
                              pads=pads, strides=strides, constants=constants,
                              algorithm=(_options or {}).get("conv_algorithm"), shuffle=bool(shuffle))
    act = _activation(activation, activation_params, affine)

    def run(x, w, b=None, z=None):
        y = convolution(x, w, b)
        if z is not None:
            y = _add_into(y, z, (x, w, b, z))
        return y
    general = _with(run, _finisher(activation, activation_params, affine))

    def activate(y, i0, i1):
        act(y)
    activate.elementwise = True     # any part of the output: the Convolution may finish it by blocks

    def per_image(x, w, b=None, z=None, then=None):
        # float32/64 with the residual of the output's shape (or broadcasting along the images): the
        # residual and activation go image by image inside the convolution, while cache-hot; then: a
        # requantization in place after them (float32 x, W, Z: _requantized checked it)
        if (x.dtype not in _INPLACE or w.dtype != x.dtype or (z is not None and (z.dtype != x.dtype
                                                                                or z.ndim != x.ndim))):
            return general(x, w, b, z)
        if z is None and act is not None and then is None:     # the activation alone (no closure made per call)
            return convolution(x, w, b, epilogue=activate)
        whole = z is not None and z.shape[0] == x.shape[0]

        def epilogue(y, i0, i1):
            if z is not None:
                part = z[i0:i1] if whole else z
                if part.shape != y.shape and (part.shape[0] not in (1, y.shape[0])
                                              or not _fits(part.shape, y.shape)):
                    raise _Elsewhere      # the sum is larger than the convolution's output
                y += part
            if act is not None:
                act(y)
            if then is not None and y.size:
                then(y)
        epilogue.elementwise = z is None    # the activation and requantization alone: by blocks too
        try:
            return convolution(x, w, b, epilogue=epilogue)
        except (_Elsewhere, ValueError):   # not broadcastable here: the general path says how
            y = general(x, w, b, z)         # a fresh buffer of our own
            if then is not None and y.size:
                then(y)
            return y
    per_image.algorithms = convolution.algorithms
    if not shuffle:
        return per_image
    dims = tuple(int(d) for d in shuffle_dims)
    split = (dims[0], shuffle, dims[1] // shuffle, *dims[2:])

    def shuffled(x, w, b=None):
        # The product's shape is the one the Reshapes expect (batch, spatial sizes and channels as
        # declared; the optimiser checked the 1x1 geometry): each group's rows written in shuffle
        # order, the bias permuted alike. Anything else: the three ops as written (numpy's reshape
        # is Reshape's for dimensions that are all given).
        if (x.dtype in _INPLACE and w.dtype == x.dtype and x.ndim == 4 and w.ndim == 4
                and (x.shape[0], w.shape[0], *x.shape[2:]) == dims):
            bs = None if b is None else b_shuffled if b is b_const else _shuffled_bias(b, shuffle)
            return convolution(x, w, bs, epilogue=None if act is None else lambda y, i0, i1: act(y), shuffle=True)
        y = general(x, w, b)
        try:
            return np.ascontiguousarray(y.reshape(split).transpose(0, 2, 1, 3, 4).reshape(dims))
        except ValueError:
            raise InvalidValueError(f"the channel shuffle after this Conv reshapes its output {y.shape} to "
                                    f"{split}: the sizes differ") from None
    shuffled.algorithms = convolution.algorithms
    return shuffled


def _requantized(factory, step, q_version, dq_version, codes, constants, attrs):
    """factory's Conv (inputs X, W, B, Z) followed by `step` (QuantizeDequantize or LookupTable, whose
    inputs 1.. are the node's 4..). With float32 X and W and the step's constant parameters, the step
    runs in place inside the Conv's epilogue, on each part the Conv finishes (ops/quantization.py's
    `into`: the step's own operations, in the same order), else after it as its own kernel."""
    constants = constants or {}
    conv = factory(**attrs, _constants={i: v for i, v in constants.items() if i < 4})
    own = {i - 3: v for i, v in constants.items() if i >= 4}
    if step == "QuantizeDequantize":
        req = fused_quantize_dequantize(q_version=q_version, dq_version=dq_version, _constants=own)
        n = 2
    elif step == "LookupTable":
        req = fused_lookup_table(codes=codes, q_version=q_version, dq_version=dq_version, _constants=own)
        n = 5
    else:
        raise ValueError(f"unknown requantization step {step!r}")
    into = getattr(req, "into", None)
    given = tuple(own.get(i) for i in range(1, n + 1))
    f32 = np.dtype(np.float32)

    def run(x, w, b=None, z=None, *params):
        # (map(is_): 0.2 against 0.6 us for a generator over the five parameters)
        if (into is None or x.dtype != f32 or w.dtype != f32 or (z is not None and z.dtype != f32)
                or len(params) != n or not all(map(is_, params, given))):
            return req(conv(x, w, b, z), *params)
        return conv(x, w, b, z, into)
    run.algorithms = conv.algorithms
    return run


def _shuffled_bias(b, g):
    """B in channel-shuffle order (a constant's made once, read-only like it)."""
    bs = shuffled(b, g)
    bs.flags.writeable = b.flags.writeable
    return bs


class _Elsewhere(Exception):
    """The fused epilogue cannot run image by image: run the general path instead."""


def _add_into(y, z, inputs):
    """y + z, written into y when y is our own buffer of the result's shape and type (inputs: the
    step's inputs, z among them). The result is always a buffer of the step's own."""
    if z.dtype != y.dtype:
        raise InvalidValueError(f"the added input ({z.dtype}) must have the product's type ({y.dtype})")
    if _fits(z.shape, y.shape) and _own(y, inputs):
        np.add(y, z, out=y)
        return y
    return np.asarray(y + z)


@kernel("Gemm", since=1, domain=FUSED_DOMAIN, multi_output=False, heavy=True)
def fused_gemm(*, alpha=1.0, beta=1.0, transA=0, transB=0, activation="", activation_params=(), _constants=None):
    """Gemm (opset 7+ semantics), then the activation in place."""
    gemm = gemm_11(alpha=alpha, beta=beta, transA=transA, transB=transB, _constants=_constants)
    finish = _finisher(activation, activation_params)
    act = _activation(activation, activation_params) if activation else None
    if finish is None:
        return gemm

    def run(a, b, c=None):
        y = gemm(a, b, c)              # Gemm's result is always a fresh buffer of its own
        if y.dtype in _INPLACE:
            act(y)
            return y
        return finish(y, None)
    return run


# np.dot and np.matmul on C-contiguous 2-D float32/float64 matrices both call BLAS (sdot/sgemv/sgemm,
# the same arguments): the same bits (4104 shapes checked, 1..256 per dim; test_optimize asserts
# it), and np.dot costs ~0.7 us less a call ([1, 128] x [128, 128]: 2.6 against 3.3 us, under load).
# Strided operands differ (np.dot copies them, np.matmul loops): those stay with np.matmul.


@kernel("MatMul", since=1, domain=FUSED_DOMAIN, multi_output=False, heavy=True)
def fused_matmul(*, activation="", activation_params=(), _constants=None):
    """MatMul, plus a bias and then a second addend (one or two Adds folded in, summed in the graph's
    order: (product + bias) + addend; numpy broadcasting, in place when the sum keeps the product's
    shape), then the activation in place."""
    mm = matmul_1()
    finish = _finisher(activation, activation_params)
    act = _activation(activation, activation_params) if activation else None
    constants = _constants or {}
    bias_c, addend_c = constants.get(2), constants.get(3)
    # a constant 1-D bias / addend as a row: adding it to a 2-D product skips numpy's broadcasting
    # set-up (np.add [1, 64] + [64]: 1.24 us, + [1, 64]: 0.48 us here)
    row = bias_c.reshape(1, -1) if bias_c is not None and bias_c.ndim == 1 else None
    addend_row = addend_c.reshape(1, -1) if addend_c is not None and addend_c.ndim == 1 else None

    def general(a, b, bias, addend):
        y = mm(a, b)
        if bias is None:
            if addend is None:
                return y if finish is None else finish(y, (a, b))
            bias, addend = addend, None     # an omitted bias (not the optimiser's form): the addend alone
        inputs = (a, b, bias, addend)
        y = _add_into(y, row if bias is bias_c and row is not None and y.ndim == 2 else bias, inputs)
        if addend is not None:          # y is now our own buffer
            y = _add_into(y, addend_row if addend is addend_c and addend_row is not None and y.ndim == 2
                          else addend, inputs)
        return y if finish is None else finish(y, None)

    def run(a, b, bias=None, addend=None):
        dt = a.dtype
        if (bias is None or bias.dtype is not dt or b.dtype is not dt or dt not in _INPLACE or a.ndim != 2
                or b.ndim != 2 or (addend is not None and addend.dtype is not dt)):
            return general(a, b, bias, addend)
        # float32/64 matrices and addends of their type: MatMul's product (numpy's below blas's split
        # size, as MatMul's kernel does) is a fresh buffer of our own, which the general path's checks
        # need not ask (a Scan RNN step's [1, 64] x [64, 128] + [1, 128]: 2.75 against 3.7 us, under load)
        try:
            if a.size * b.shape[1] >= 2 * blas.MIN_PART_MACS:
                y = blas.matmul(a, b)
            elif a.flags.c_contiguous and b.flags.c_contiguous:
                y = np.dot(a, b)    # the bits of np.matmul here (above), its ufunc set-up spared
            else:
                y = np.matmul(a, b)
        except ValueError:
            return mm(a, b)         # fails again, with MatMul's message
        # a fed or captured 1-D operand as a row view alike (a Scan body's outer-scope bias: 0.6 against
        # 1.07 us a [1, 128] add here; the constant's row made once: 0.42)
        z = row if bias is bias_c and row is not None else bias[None] if bias.ndim == 1 else bias
        try:
            np.add(y, z, out=y)
        except ValueError:          # the sum is larger than the product (checked before any write)
            y = np.asarray(y + bias)    # (an error names the operand as given)
        if addend is not None:
            z = (addend_row if addend is addend_c and addend_row is not None
                 else addend[None] if addend.ndim == 1 else addend)
            try:
                np.add(y, z, out=y)
            except ValueError:
                y = np.asarray(y + addend)
        if act is not None:
            act(y)
        return y
    return run


@kernel("Swish", since=1, domain=FUSED_DOMAIN, multi_output=False, rank="first")
def fused_silu():
    """x * Sigmoid(x) written as two nodes."""
    return swish_24(alpha=1.0)


def _clip_swish(x, divide, scale, out=None):
    """x * Clip(x + 3, 0, 6), then / scale (divide) or * scale: the four nodes' operations in their order
    on one temporary, written to out (x itself allowed: each element is read before it is written)."""
    dt = x.dtype.type
    t = np.add(x, dt(3))
    _clip(t, dt(0), dt(6), out=t)
    y = np.multiply(t, x, out=t if out is None else out)
    return (np.divide if divide else np.multiply)(y, dt(scale), out=y)


@kernel("ClipSwish", since=1, domain=FUSED_DOMAIN, multi_output=False, rank="first")
def fused_clip_swish(*, scale_op="Div", scale=6.0):
    """Div(Mul(x, Clip(Add(x, 3), 0, 6)), 6) (or the last step Mul(., scale)), MobileNetV3's HardSwish as
    PaddlePaddle exports it (optimize/patterns.py): the same four float32 / float64 operations in that order,
    so the same values (a zero's sign aside, as Clip's), on one buffer (PaddleOCR's det model: 94 chains,
    4 passes and 3 new arrays each)."""
    if scale_op not in ("Div", "Mul"):
        raise ValueError(f"scale_op must be 'Div' or 'Mul', got {scale_op!r}")
    divide = scale_op == "Div"

    def run(x):
        if x.dtype not in _INPLACE:
            raise InvalidValueError(f"ClipSwish takes float32 or float64, got {x.dtype}")
        return as_array(_clip_swish(x, divide, scale))
    return run


@kernel("Gelu", since=1, domain=FUSED_DOMAIN, multi_output=False, rank="first")
def fused_gelu(*, approximate="none"):
    """Gelu written with Erf (approximate='none') or Tanh ('tanh') as elementary nodes."""
    return gelu_20(approximate=approximate)


def one_hot_bias(b, e) -> bool:
    """Whether b, added after a product with E (K, D), varies along the last axis alone in E's type: a
    Dense layer's bias [1, ..., 1, D] (or [..., 1]), which OneHotMatMul folds into its table."""
    return (isinstance(b, np.ndarray) and b.dtype == e.dtype and b.ndim >= 1 and b.shape[-1] in (1, e.shape[1])
            and all(d == 1 for d in b.shape[:-1]))


@kernel("OneHotMatMul", since=1, domain=FUSED_DOMAIN, multi_output=False)
def fused_one_hot_matmul(*, _constants=None):
    """MatMul(Cast(Equal(A, C)), E) with C a constant integer row of K distinct values and E a constant
    finite (K, D) float matrix (optimize/patterns.py), as jax2tf writes one_hot followed by a Dense
    layer (Google's Magika). Where A's last axis is 1, each row of the product is E's row j for the j
    with A = C[j], zeros when there is none: exactly the product's value (one term 1 * E[j], the others
    0 * E[i] = +-0; a zero sum +0, as the BLAS accumulates from +0: the table holds E + 0.0). Gathered
    from that table (its row K the zeros) rather than multiplied. With B, the Add of a constant varying
    along the last axis alone that followed the product: the table holds (E + 0.0) + B and its last row
    0.0 + B, each row the value the Add gives that row of the product (any B, inf or NaN too). Any other
    A (its last axis not 1, another type), or a B that would raise the product's rank, takes the ops as
    written."""
    constants = _constants or {}
    c, e, b = constants.get(1), constants.get(2), constants.get(3)
    mm = matmul_1()
    table = None
    if (c is not None and e is not None and (c.dtype.kind == "i" or (c.dtype.kind == "u" and c.dtype.itemsize < 8))
            and e.ndim == 2 and e.dtype in _INPLACE):          # (C's values exact in int64)
        values = c.reshape(-1).astype(np.int64)
        if values.size == e.shape[0] and values.size == np.unique(values).size and np.isfinite(e).all():
            table = np.concatenate([e + e.dtype.type(0), np.zeros((1, e.shape[1]), e.dtype)])
            if b is not None:
                if one_hot_bias(b, e):
                    table += b.reshape(1, -1)
                else:
                    table = None
            k, lo = values.size, int(values[0])
            dense = bool(np.array_equal(values, np.arange(lo, lo + k)))       # C = lo, lo + 1, ...
            order = np.argsort(values)
            ordered = values[order]

    def row_of(v):
        """The table's row for each value of v (int64): j with C[j] = v, else K."""
        if dense:
            j = v - lo
            j[(j < 0) | (j >= k)] = k
            return j
        at = np.minimum(np.searchsorted(ordered, v), k - 1)
        return np.where(ordered[at] == v, order[at], k)

    def run(a, c_, e_, b_=None):
        if (table is None or c_ is not c or e_ is not e or b_ is not b or a.dtype != c.dtype or a.ndim == 0
                or a.shape[-1] != 1 or (b is not None and b.ndim > max(a.ndim, c.ndim))):
            y = mm(np.equal(a, c_).astype(e_.dtype), e_)
            return y if b_ is None else np.add(y, b_)
        rows = row_of(a.reshape(-1).astype(np.int64))
        # C of a higher rank than A: the one-hot (and the product) gain its leading axes
        return table[rows].reshape((1,) * (c.ndim - a.ndim) + a.shape[:-1] + table.shape[1:])
    return run


@kernel("LayerNormalization", since=1, domain=FUSED_DOMAIN, multi_output=False, rank="first")
def fused_layer_norm(*, axis=-1, epsilon=1e-5):
    """LayerNormalization written as ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div/Mul/Add (the stash type
    is the input's own when it is float64, float32 otherwise)."""
    f32 = layer_normalization_17(axis=axis, epsilon=epsilon, stash_type=1, _n_outputs=1)

    def run(x, scale, bias):
        if x.dtype == np.float64:
            return _layer_norm_f64(x, scale, bias, axis, epsilon)
        return f32(x, scale, bias)[0]
    return run


def _layer_norm_f64(x, scale, bias, axis, epsilon):
    """float64 all the way, as the elementary nodes compute it (LayerNormalization-17 stashes in float32)."""
    axes = tuple(range(axis % x.ndim, x.ndim))
    d = x - x.mean(axis=axes, keepdims=True)
    var = np.mean(d * d, axis=axes, keepdims=True)
    d /= np.sqrt(var + epsilon)
    d *= scale
    d += bias
    return d


@kernel("Attention", since=1, domain=FUSED_DOMAIN, multi_output=False, heavy=True)
def fused_attention(*, scale=1.0, divide=0, transpose_k=0):
    """softmax(Q @ K' / scale + mask) @ V (or * scale), softmax over the last axis, K' = K (already
    transposed) or, with transpose_k, K with its last two axes swapped. float32/float64 scores are one
    buffer worked on in place; other types run the Softmax-13 kernel on the scores as the nodes would."""
    c = float(scale)
    # the scale in the scores' type, made once, as 0-d arrays: a numpy scalar operand costs ~0.5 us a
    # call more (converted to an array by each ufunc call), the values and loops are the same
    factors = {dt: np.array(c, dt) for dt in _INPLACE}
    other_softmax = along_axis(softmax, -1, SOFTMAX_VIA_F32)      # Softmax-13's kernel
    mm = matmul_1()

    def run(q, k, v, mask=None):
        if transpose_k:
            k = k.swapaxes(-1, -2)
        dt = q.dtype
        checked = dt in _INPLACE and k.dtype == dt and v.dtype == dt and q.ndim > 1 and k.ndim > 1
        # checked: MatMul's products without its kernel's per-call type checks
        product = _attention_product if checked else mm
        scores = product(q, k)
        dt = scores.dtype
        if dt not in _INPLACE:
            scores = scores / dt.type(c) if divide else scores * dt.type(c)
            if mask is not None:
                scores = scores + mask
            return mm(other_softmax(np.asarray(scores, dtype=dt)), v)
        scores = _scaled_masked(scores, dt, divide, c, factors[dt], mask)
        if scores.size:
            total, y = _exp_sum_product(scores, v, product)
            # checked with V of rank >= 2: the sums [.., n, 1] broadcast to the result [.., n, d]
            if _softmax_sums_safe(total) and ((checked and v.ndim > 1)
                                              or y.shape == np.broadcast_shapes(y.shape, total.shape)):
                y /= total.reshape(()) if total.size == 1 else total    # one row: a 0-d divisor, ~1 us less
                return y
            scores = _scaled_masked(product(q, k), dt, divide, c, factors[dt], mask)    # rare: again, shifted
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(axis=-1, keepdims=True)
        return product(scores, v)
    return run


def _attention_product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """matmul(a, b, "Attention"); a product below blas's split size goes to numpy at once, as
    blas.matmul would after its checks (~1 us a call of the decoder's [1, 256] x [256, 50]); two
    matrices by np.dot, the same product without matmul's ufunc machinery (1.6 against 3.2 us there)."""
    if b.ndim and a.size * b.shape[-1] < 2 * blas.MIN_PART_MACS:
        try:
            return np.dot(a, b) if a.ndim == 2 and b.ndim == 2 else np.matmul(a, b)
        except ValueError:
            pass                        # matmul says why
    return matmul(a, b, "Attention")


# fp_errors_ignored: np.errstate's state (a per-thread context variable) at ~0.4 us a call, against
# ~1.4 for its decorator and ~1.1 for a `with` block.
@fp_errors_ignored(over="ignore", invalid="ignore")     # an overflow takes the shifted path
def _exp_sum_product(scores: np.ndarray, v: np.ndarray, product):
    """exp(scores) in place, -> (its row sums, its product with v)."""
    np.exp(scores, out=scores)
    return last_axis_sums(scores), product(scores, v)


def _scaled_masked(scores: np.ndarray, dt: np.dtype, divide: int, c: float, factor, mask) -> np.ndarray:
    """scores / c (or * c) + mask, in place on the scores (float32/float64, our own buffer); factor: c
    in the scores' type."""
    if divide:
        scores /= factor
    elif c != 1.0:
        scores *= factor
    if mask is not None:
        if mask.dtype == dt and _fits(mask.shape, scores.shape):
            scores += mask
        else:
            scores = np.asarray(scores + mask)
    return scores


# Softmax's shift by the row maximum only guards exp against overflow and underflow: exp(s) / sum
# equals exp(s - max) / sum' to rounding. Without it (two passes fewer), and with the division moved
# after the product with V (a result of [.., n, d] instead of the [.., n, n] scores: half a pass for
# BERT's n = 128, d = 64), [1, 4, 128, 64] heads take ~0.85x the time (the softmax alone: 120 against
# 210 us; one BLAS thread to tame the noise, measured under load). Any row sum out of [2^-60, the
# type's max] means a term overflowed, or that a row's largest terms may be subnormal (its maximum
# below ~-41): then the whole softmax is computed again, shifted.
_SUM_LO = 2.0 ** -60
_SUM_HI = {dt: float(np.finfo(dt).max) for dt in _INPLACE}


def _softmax_sums_safe(total: np.ndarray) -> bool:
    hi = _SUM_HI[total.dtype]
    if total.size == 1:             # one row (a decoder step): a Python float, no reductions (~2.5 us)
        return _SUM_LO <= total.item() <= hi      # NaN fails, as it fails min/max
    return bool(total.min() >= _SUM_LO and total.max() <= hi)


@kernel("ChannelAffine", since=1, domain=FUSED_DOMAIN, multi_output=False)
def fused_channel_affine(*, activation="", activation_params=()):
    """x * a + b per channel (axis 1): an inference BatchNormalization with its per-channel factor and
    shift computed once at prepare time, then the activation in place. Computed in x's type (float32
    for float16/bfloat16, rounded back once), as BatchNormalization does."""
    finish = _finisher(activation, activation_params)

    def run(x, a, b):
        if x.ndim < 2 or x.shape[1] != a.shape[0]:
            raise InvalidValueError(f"X of shape {list(x.shape)} does not have {a.shape[0]} channels on axis 1")
        shape = (-1,) + (1,) * (x.ndim - 2)
        if x.dtype is a.dtype and x.dtype not in UPCAST and a.ndim == 1:
            y = np.multiply(x, a.reshape(shape), out=memory.empty_like(x))     # large: recycled
        else:
            y = np.multiply(x.astype(np.float32) if x.dtype in UPCAST else x, a.reshape(shape))
        y += b.reshape(shape)
        y = y.astype(x.dtype, copy=False)
        return y if finish is None else finish(y, None)      # y is a fresh buffer
    return run


@kernel("LookupTable", since=1, domain=FUSED_DOMAIN, multi_output=False, rank="first")
def fused_lookup_table(*, codes="uint8", q_version=0, dq_version=0, _constants=None):
    """y = table[x] on 8-bit codes: optimize/qdq_lut.py's DequantizeLinear -> elementwise ops ->
    QuantizeLinear, the table (256 output codes, indexed by the input code's bits as uint8) made at
    prepare by those nodes' kernels. The lookup is bytes.translate on the codes' bytes (a byte table
    in C): measured with the caches cleared between calls, as between a model's convolutions, 175 us
    at 200704 codes against 201 for np.take two codes at a time (a 65536-entry table of code pairs)
    and 277 one by one; 15 against 24 / 33 us at 28224.
    With q_version, the QuantizeLinear making the codes (inputs 2, 3: its scale and zero point) is
    part of the step, and with dq_version the DequantizeLinear reading the result (inputs 4, 5):
    ops/quantization.py's quantized_lookup."""
    dt = np.dtype(codes)
    table_bytes = prepack(_table_bytes, _constants, (1,))

    def run(x, table):
        if x.dtype != dt:
            raise InvalidValueError(f"x is {x.dtype}, the DequantizeLinear's zero point is {dt}")
        data = bytearray(np.ascontiguousarray(x).tobytes() if x.ndim == 0 else np.ascontiguousarray(x).data)
        return np.frombuffer(data.translate(table_bytes(table)), table.dtype).reshape(x.shape)
    if q_version or dq_version:
        return quantized_lookup(run, int(q_version), int(dq_version), dt, _constants)
    return run


def _table_bytes(table: np.ndarray) -> bytes:
    """The 256 output codes as the byte string bytes.translate takes (entry i for the byte i)."""
    if table.shape != (256,) or table.dtype.itemsize != 1:
        raise InvalidValueError(f"the table must hold 256 8-bit codes, got {table.dtype} {list(table.shape)}")
    return table.tobytes()


@kernel("QuantizeDequantize", since=1, domain=FUSED_DOMAIN, multi_output=False, rank="first")
def fused_quantize_dequantize(*, q_version, dq_version, _constants=None):
    """DequantizeLinear(QuantizeLinear(x, scale, zero_point), scale, zero_point), the two nodes'
    versions given: optimize/qdq_pair.py's pair, the float32 result made without the codes
    (ops/quantization.py's quantize_dequantize)."""
    return quantize_dequantize(int(q_version), int(dq_version), _constants)


@kernel("ConvNHWC", since=1, domain=FUSED_DOMAIN, multi_output=False, heavy=True, rank="first")
def fused_conv_nhwc(*, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None,
                    activation="", activation_params=(), affine=(), shuffle=0, shuffle_dims=(), requantize="",
                    q_version=0, dq_version=0, codes="uint8", _constants=None, _options=None):
    """Conv on channels-last data (optimize/channels_last.py): X (N, H, W, C) and Y (N, Ho, Wo, M),
    W and B as Conv has them (a constant W prepared once in its layout: nn/conv/channels_last.py),
    then a residual Z (channels-last, as Y) and the activation, in place, as the fused Conv does. A
    forced conv_algorithm runs that NCHW algorithm on X transposed. requantize: as the fused Conv's
    (a depthwise Conv requantizes each part's rows on that part's thread). shuffle, shuffle_dims: the
    fused Conv's channel shuffle (NCHW dims), here an order of Y's last axis (_shuffled_nhwc)."""
    geometry = dict(auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape, pads=pads,
                    strides=strides)
    if shuffle:
        if requantize:
            raise ValueError("a Conv writing a channel shuffle takes no requantization step")
        return _shuffled_nhwc(geometry, (activation, activation_params, affine), int(shuffle),
                              tuple(int(d) for d in shuffle_dims), _constants, _options)
    if requantize:
        return _requantized(fused_conv_nhwc, requantize, q_version, dq_version, codes, _constants,
                            dict(geometry, activation=activation, activation_params=activation_params,
                                 affine=affine, _options=_options))
    conv = ConvNHWC(**geometry, constants=_constants, algorithm=(_options or {}).get("conv_algorithm"))
    act = _activation(activation, activation_params, affine)
    finish = _finisher(activation, activation_params, affine)

    def activate(rows, i, j):
        act(rows)

    finishers = {}      # then -> the epilogue applying the activation, then `then` (made once)

    def _rows_finisher(then):
        def finish_rows(rows, i, j):
            if act is not None:
                act(rows)
            if rows.size:
                then(rows)
        if not finishers:
            finishers[then] = finish_rows
        return finish_rows

    def run(x, w, b=None, z=None, then=None):
        # float32/64: the residual and activation inside the convolution (a depthwise one applies them
        # to each part's rows right after its einsum, on that part's thread; the other paths whole);
        # then: a requantization in place after them (float32 x, W, Z: _requantized checked it)
        if x.dtype in _INPLACE and w.dtype == x.dtype:
            if z is None and then is None:
                return conv(x, w, b, epilogue=None if act is None else activate)
            if z is None:
                return conv(x, w, b, epilogue=finishers.get(then) or _rows_finisher(then))
            if z.dtype == x.dtype and z.shape == conv.output_shape(x, w):
                zr = z.reshape(-1, z.shape[-1])

                def epilogue(rows, i, j):
                    rows += zr[i:j]
                    if act is not None:
                        act(rows)
                    if then is not None and rows.size:
                        then(rows)
                return conv(x, w, b, epilogue=epilogue)
        y = conv(x, w, b)           # a fresh buffer of our own
        if z is not None:
            y = _add_into(y, z, (x, w, b, z))
        if act is not None:
            if y.dtype in _INPLACE:
                act(y)
            else:
                y = finish(y, None)
        if then is not None and y.size:
            then(y)
        return y
    run.algorithms = conv.algorithms
    return run


def _shuffled_nhwc(geometry, activation, shuffle, dims, constants, options):
    """The channels-last fused Conv writing a channel shuffle: a grouped 1x1 Conv's one product with its
    columns (and B) in shuffle order (ConvNHWC(shuffle=...)), Y (N, H, W, C) being the NCHW dims'
    channels-last order; any other shape, type or plan: the NCHW fused Conv, which runs the shuffle as
    written, on X transposed, its result transposed back. activation: (name, params, affine)."""
    name, params, affine = activation
    written = fused_conv(**geometry, activation=name, activation_params=params, affine=affine, shuffle=shuffle,
                         shuffle_dims=dims, _constants=constants, _options=options)
    constants = dict(constants or {})
    b_const = b_shuffled = constants.get(2)
    if b_const is not None:
        constants[2] = b_shuffled = _shuffled_bias(b_const, shuffle)
    conv = ConvNHWC(**geometry, constants=constants, algorithm=(options or {}).get("conv_algorithm"),
                    shuffle=shuffle)
    act = _activation(name, params, affine)
    want = (dims[0], *dims[2:], dims[1]) if len(dims) == 4 else None

    def activate(rows, i, j):
        act(rows)

    def run(x, w, b=None):
        if (x.dtype in _INPLACE and w.dtype == x.dtype and conv.output_shape(x, w) == want
                and (b is None or (b.dtype == x.dtype and b.shape == (w.shape[0],)))):
            bs = None if b is None else b_shuffled if b is b_const else _shuffled_bias(b, shuffle)
            return conv(x, w, bs, epilogue=None if act is None else activate)
        return through_nchw(written, x, w, b)
    run.algorithms = conv.algorithms
    return run


@kernel("PoolNHWC", since=1, domain=FUSED_DOMAIN, multi_output=False, heavy=True, views=True, rank="first")
def fused_pool_nhwc(*, op, kernel_shape, auto_pad="NOTSET", pads=None, strides=None, dilations=None, ceil_mode=0,
                    count_include_pad=0):
    """A 2-D AveragePool or MaxPool (`op`, its attributes, one output) on channels-last X (N, H, W, C)
    (optimize/channels_last.py): the pool over (H, W, C) with a kernel of 1 along C, X seen as
    (N, 1, H, W, C). Each window holds the 2-D pool's cells of one channel in the same order, so the
    values are the NCHW pool's bit for bit (but an average over one window covering the whole map, which
    the NCHW kernel sums by one reduction: another order), and numpy's passes run along rows of W*C
    values (3x3 /2, alone, under load: AveragePool 136x28x28 197 us, 171 NCHW, 316 for the NCHW pool on
    a region's transposed view; MaxPool 272x14x14 69 / 130 / 169)."""
    if len(kernel_shape) != 2:
        raise ValueError(f"the channels-last pool is 2-D, got kernel_shape {list(kernel_shape)}")
    extend = (lambda v: None if v is None else [*v, 1])
    geometry = dict(kernel_shape=extend(kernel_shape), strides=extend(strides), dilations=extend(dilations),
                    pads=None if pads is None else [*pads[:2], 0, *pads[2:], 0], auto_pad=auto_pad,
                    ceil_mode=ceil_mode)
    if op == "AveragePool":
        pool = average_pool_function(**geometry, count_include_pad=count_include_pad)
    elif op == "MaxPool":
        pool = max_pool_function(**geometry)
    else:
        raise ValueError(f"op must be AveragePool or MaxPool, got {op!r}")

    def run(x):
        if x.ndim != 4:
            raise InvalidValueError(f"the channels-last pool takes a 4-D X, got {list(x.shape)}")
        return pool(x[:, None])[:, 0]
    return run


@kernel("QLinearConvNHWC", since=1, domain=FUSED_DOMAIN, multi_output=False, heavy=True, rank="first")
def fused_qlinear_conv_nhwc(*, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None,
                            strides=None, _constants=None):
    """QLinearConv on channels-last codes (optimize/channels_last.py): X (N, H, W, C) and Y (N, Ho, Wo, M),
    the other inputs as QLinearConv has them (nn/conv_quantized.py's qlinear_conv_channels_last)."""
    return qlinear_conv_channels_last(dict(auto_pad=auto_pad, dilations=dilations, group=group,
                                           kernel_shape=kernel_shape, pads=pads, strides=strides), _constants)
