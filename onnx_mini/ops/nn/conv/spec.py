"""Conv (opsets 1, 11, 22): the operator as its spec page states it; how it is computed fast is the
rest of this package (run.py, select.py and the algorithm modules).

    Y = Conv(X, W, B)

- X: (N, C, D1, ..., Dn); W: (M, C/group, k1, ..., kn); B (optional): (M,). Y: (N, M, O1, ..., On),
  of X's type (float16, bfloat16, float32, float64; float16/bfloat16 computed in float32 and
  rounded back once).
- Y[n, m, o] = B[m] + sum over the C/group input channels c of m's group and the kernel taps t of
  X[n, g*C/group + c, o*strides - pads_begin + t*dilations] * W[m, c, t], padding being zeros.
- kernel_shape: W's spatial shape (inferred from W when absent; when given, must equal it).
- strides, dilations: per spatial axis, default 1 each; pads: [begin..., end...], default 0.
- auto_pad: NOTSET (use pads), VALID (no padding), SAME_UPPER / SAME_LOWER (O = ceil(D / stride),
  the odd unit of padding at the end / at the beginning).
- group: C and M are split into `group` groups; M must be a multiple of group and C = group * W's
  second dimension.
"""
from __future__ import annotations

from ....registry import kernel
from .run import Convolution


@kernel("Conv", since=(1, 11, 22), heavy=True)
def conv_1(*, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None,
           _constants=None, _options=None):
    """_constants: W (input 1) and B (input 2) when known at prepare time: their transforms are made
    once; _options["conv_algorithm"]: the algorithm to take where it applies (select.ALGORITHMS; an
    unknown name is a ValueError). The returned function's `algorithms` maps each X shape seen to
    the algorithm that ran."""
    convolution = Convolution(auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape,
                              pads=pads, strides=strides, constants=_constants,
                              algorithm=(_options or {}).get("conv_algorithm"))

    def conv(x, w, b=None):
        return convolution(x, w, b)
    conv.algorithms = convolution.algorithms
    return conv
