"""The recurrent operators as the spec writes them: attributes (activations, clip) and each cell's
equations for any activations, peepholes and input_forget (driver.py runs them; fast.py holds the
tuned form of the default activations).

Attribute semantics chosen where the spec is terse:
- `activations` lists the cell's functions per direction (bidirectional: forward's then reverse's);
  a bidirectional node given only one direction's list uses it for both, a unidirectional node given
  more than it needs uses the first ones (RNN's schema default is [Tanh, Tanh] even for forward).
  Names are matched case-insensitively.
- `activation_alpha` / `activation_beta` are consumed in order by the functions that take them
  (Affine, LeakyRelu, ThresholdedRelu, ScaledTanh, HardSigmoid, Elu); when a list runs out the
  default of the corresponding ONNX operator applies: LeakyRelu 0.01, ThresholdedRelu 1, Elu 1,
  HardSigmoid 0.2/0.5, Affine 1/0, ScaledTanh 1/1.
- `clip` bounds the input of each gate activation (f, g) to [-clip, clip]; the cell state itself
  (LSTM's Ct, the input of h) is not clipped.
- LSTM `input_forget=1` couples the gates: ft = 1 - it.
- `output_sequence` (version 1) is accepted and has no effect: Y is produced whenever asked for.
"""
from __future__ import annotations

import numpy as np

from ... import blas
from ..math.activations import sigmoid     # the Sigmoid operator's: exp(-|x|), no overflow


# -- activations -----------------------------------------------------------------------------------

def _elu(x, alpha):
    return np.where(x >= 0, x, alpha * np.expm1(np.minimum(x, 0)))


#: lower-case name -> (function of (x, alpha, beta), default alpha or None if unused, default beta or None)
_ACTIVATIONS = {
    "relu": (lambda x, a, b: np.maximum(x, 0), None, None),
    "tanh": (lambda x, a, b: np.tanh(x), None, None),
    "sigmoid": (lambda x, a, b: sigmoid(x), None, None),
    "affine": (lambda x, a, b: x * a + b, 1.0, 0.0),
    "leakyrelu": (lambda x, a, b: np.where(x >= 0, x, x * a), 0.01, None),
    "thresholdedrelu": (lambda x, a, b: np.where(x >= a, x, 0).astype(x.dtype, copy=False), 1.0, None),
    "scaledtanh": (lambda x, a, b: np.tanh(x * b) * a, 1.0, 1.0),
    "hardsigmoid": (lambda x, a, b: np.clip(x * a + b, 0, 1), 0.2, 0.5),
    "elu": (lambda x, a, b: _elu(x, a), 1.0, None),
    "softsign": (lambda x, a, b: x / (1 + np.abs(x)), None, None),
    "softplus": (lambda x, a, b: np.logaddexp(0, x), None, None),
}


def activation_functions(op, names, defaults, alphas, betas, num_directions):
    """-> (one callable per activation slot of the cell, each applying every direction's own function
    to a [D, B, H] array; the lower-case names, one per slot and direction)."""
    n = len(defaults)
    names = list(defaults) if names is None else list(names)
    if num_directions == 2 and len(names) == n:
        names = names * 2
    elif num_directions == 1 and len(names) > n:
        names = names[:n]
    if len(names) != n * num_directions:
        raise ValueError(f"{op} expects {n * num_directions} activations for {num_directions} direction(s), "
                         f"got {len(names)}: {names}")
    alphas, betas = list(alphas or []), list(betas or [])
    bound = []
    for name in names:
        entry = _ACTIVATIONS.get(str(name).lower())
        if entry is None:
            raise ValueError(f"unknown activation {name!r} (accepted: Relu, Tanh, Sigmoid, Affine, LeakyRelu, "
                             "ThresholdedRelu, ScaledTanh, HardSigmoid, Elu, Softsign, Softplus)")
        fn, da, db = entry
        a = (alphas.pop(0) if alphas else da) if da is not None else None
        b = (betas.pop(0) if betas else db) if db is not None else None
        bound.append((fn, a, b, (str(name).lower(), a, b)))
    slots = []
    for k in range(n):
        per_dir = [bound[d * n + k] for d in range(num_directions)]
        if all(p[3] == per_dir[0][3] for p in per_dir):
            fn, a, b, _ = per_dir[0]
            slots.append(lambda x, fn=fn, a=a, b=b: fn(x, a, b))
        else:
            slots.append(_per_direction(per_dir))
    return slots, [p[3][0] for p in bound]


def _per_direction(per_dir):
    def apply(x):
        out = np.empty_like(x)
        for d, (fn, a, b, _) in enumerate(per_dir):
            out[d] = fn(x[d], a, b)
        return out
    return apply


def check_clip(clip):
    if clip is not None and not clip > 0:
        raise ValueError(f"clip must be positive, got {clip}")
    return clip


def clipper(clip):
    if clip is None:
        return lambda x: x
    return lambda x: np.clip(x, -clip, clip)


# -- the cells' equations -------------------------------------------------------------------------
# Each makes, per run, step(xt, h, hout, c, cout) (see driver.py) from the weights packed in the
# spec's gate order (driver.Weights), the activations and the clipper.

def rnn_step(w, acts, clip):
    (f,) = acts
    ((RT, _),) = w.R

    def step(xt, h, hout, c, cout):
        hout[...] = f(clip(xt + blas.matmul(h, RT)))
    return step


def gru_step(w, acts, clip, linear_before_reset):
    f, g = acts
    H, rbh = w.H, w.rbh

    if linear_before_reset:
        ((RT, _),) = w.R

        def step(xt, h, hout, c, cout):
            hr = blas.matmul(h, RT)
            z = f(clip(xt[..., :H] + hr[..., :H]))
            r = f(clip(xt[..., H:2 * H] + hr[..., H:2 * H]))
            hh = hr[..., 2 * H:] if rbh is None else hr[..., 2 * H:] + rbh[:, None]
            ht = g(clip(xt[..., 2 * H:] + r * hh))
            hout[...] = (1 - z) * ht + z * h
    else:
        (RT_zr, _), (RT_h, _) = w.R

        def step(xt, h, hout, c, cout):
            zr = xt[..., :2 * H] + blas.matmul(h, RT_zr)
            z = f(clip(zr[..., :H]))
            r = f(clip(zr[..., H:]))
            ht = g(clip(xt[..., 2 * H:] + blas.matmul(r * h, RT_h)))
            hout[...] = (1 - z) * ht + z * h
    return step


def lstm_step(w, acts, clip, input_forget):
    f, g, hf = acts
    H = w.H
    ((RT, _),) = w.R
    pi = po = pf = None
    if w.P is not None:
        pi, po, pf = (w.P[:, None, k] for k in range(3))

    def step(xt, h, hout, c, cout):
        gates = xt + blas.matmul(h, RT)             # i o f c
        i_in, o_in = gates[..., :H], gates[..., H:2 * H]
        f_in, c_in = gates[..., 2 * H:3 * H], gates[..., 3 * H:]
        if pi is not None:
            i_in = i_in + pi * c
            f_in = f_in + pf * c
        i = f(clip(i_in))
        fg = 1 - i if input_forget else f(clip(f_in))
        cout[...] = fg * c + i * g(clip(c_in))
        if po is not None:
            o_in = o_in + po * cout
        hout[...] = f(clip(o_in)) * hf(cout)
    return step
