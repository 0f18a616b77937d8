"""Helpers shared by kernels of several families (one place each)."""
from __future__ import annotations

import numpy as np

from ..errors import InvalidValueError


def normalize_axis(axis: int, rank: int, what: str = "axis") -> int:
    """Map an axis in [-rank, rank-1] to [0, rank-1]; InvalidValueError outside that range."""
    if not -rank <= axis < rank:
        raise InvalidValueError(f"{what} {axis} is out of range for a tensor of rank {rank} "
                                f"(accepted: [{-rank}, {rank - 1}])")
    return axis + rank if axis < 0 else axis


def as_array(x):
    """numpy ufuncs return scalars for 0-d inputs; kernels always hand back ndarrays."""
    return x if x.__class__ is np.ndarray else np.asarray(x)
