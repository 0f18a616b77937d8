"""Conv: spec semantics apart from the speed work.

- spec.py: the operator as its spec page states it (the kernel, the attribute and shape checks);
- run.py: `Convolution`, one Conv's computation (per-shape plans, a constant W's transforms made
  once), and `convolve` for kernels convolving as a step of their own;
- select.py: which algorithm computes a Conv (a pure function; the names `conv_algorithm` takes);
- thresholds.py: the tuned thresholds, one table;
- the algorithms: pointwise.py, im2col.py, shifted.py, strips.py, winograd.py, depthwise.py (with
  its layouts depthwise_flat.py and depthwise_channels_last.py), banded.py, dft.py (a windowed real DFT
  basis W by the real FFT); grouped.py (the grouped products
  pointwise and im2col share with ConvTranspose and DeformConv).
"""
from .grouped import grouped_matmul
from .run import Convolution, convolve
from .select import ALGORITHMS, select
from .spec import conv_1

__all__ = ["ALGORITHMS", "Convolution", "conv_1", "convolve", "grouped_matmul", "select"]
