"""Recurrent operators (onnx/defs/rnn): RNN, GRU, LSTM, every version.

One driver serves the three cells; they differ only in their gate math (`_rnn_cell`, `_gru_cell`,
`_lstm_cell`). The driver:

- projects the inputs of every time step and every direction with ONE matmul
  (X[T*B, I] @ W^T[I, D*G*H] + Wb (+ the parts of Rb that sit outside any gate product)),
- lays that projection out in *step order* per direction ([T, D, B, G*H]): forward steps run
  t = 0..len-1; reverse steps run t = len-1..0 from each sequence's own last valid step (a gather
  with the per-batch index len-1-s, or a plain flip when every sequence has the full length),
- loops over the steps doing only the recurrent matmul (batched over directions, [D,B,H] @ [D,H,G*H])
  and the gate math, on every batch element and direction at once,
- with sequence_lens, keeps the state of a sequence whose steps are over (np.where) so Y_h/Y_c hold
  the state at its last valid step, and writes zeros in Y beyond each sequence's length,
- maps the step-ordered outputs back to time positions (the same gather: s <-> len-1-s is an
  involution) and applies `layout`.

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
- float16/bfloat16 compute in float32 and round back once.
"""
from __future__ import annotations

import numpy as np

from .. import blas
from ..errors import InvalidValueError
from ..registry import kernel
from ._common import UPCAST


# -- activations -----------------------------------------------------------------------------------

def _sigmoid(x):
    t = np.tanh(x * 0.5)          # 1/(1+e^-x) without overflow for large |x|
    t *= 0.5
    t += 0.5
    return t


def _elu(x, alpha):
    return np.where(x >= 0, x, alpha * np.expm1(np.minimum(x, 0)))


#: lower-case name -> (function of (x, alpha, beta), default alpha or None if unused, default beta or None)
_ACTIVATIONS = {
    "relu": (lambda x, a, b: np.maximum(x, 0), None, None),
    "tanh": (lambda x, a, b: np.tanh(x), None, None),
    "sigmoid": (lambda x, a, b: _sigmoid(x), None, None),
    "affine": (lambda x, a, b: x * a + b, 1.0, 0.0),
    "leakyrelu": (lambda x, a, b: np.where(x >= 0, x, x * a), 0.01, None),
    "thresholdedrelu": (lambda x, a, b: np.where(x >= a, x, 0).astype(x.dtype, copy=False), 1.0, None),
    "scaledtanh": (lambda x, a, b: np.tanh(x * b) * a, 1.0, 1.0),
    "hardsigmoid": (lambda x, a, b: np.clip(x * a + b, 0, 1), 0.2, 0.5),
    "elu": (lambda x, a, b: _elu(x, a), 1.0, None),
    "softsign": (lambda x, a, b: x / (1 + np.abs(x)), None, None),
    "softplus": (lambda x, a, b: np.logaddexp(0, x), None, None),
}


def _activation_functions(op, names, defaults, alphas, betas, num_directions):
    """-> one callable per activation slot of the cell, each applying every direction's own function
    to a [D, B, H] array."""
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
    return slots


def _per_direction(per_dir):
    def apply(x):
        out = np.empty_like(x)
        for d, (fn, a, b, _) in enumerate(per_dir):
            out[d] = fn(x[d], a, b)
        return out
    return apply


def _clipper(clip):
    if clip is None:
        return lambda x: x
    if not clip > 0:
        raise ValueError(f"clip must be positive, got {clip}")
    return lambda x: np.clip(x, -clip, clip)


def _state_product(h, R, RT):
    """h @ R^T -> [D, B, G*H] for the state h [D, B, H], with R [D, G*H, H] and RT its contiguous
    transpose. For a batch of a few rows OpenBLAS runs the product transposed, (R @ h^T)^T, about 1.5x
    faster (a [D, B, G*H] view; measured here with H = 256, gates 4H: B=4 81 vs 39 us, B=16 121 vs
    79 us, B=48 211 vs 196 us; B=1 and B >= 64 lose)."""
    if 1 < h.shape[1] <= 48 and h.shape[2] >= 128:
        return blas.matmul(R, h.transpose(0, 2, 1)).transpose(0, 2, 1)
    return blas.matmul(h, RT)


# -- cells: bind(W-independent weights) -> (projection bias, step) ---------------------------------
# A cell's bind(R, B, P, H) receives R [D, G*H, H], B [D, 2*G*H] or None, P [D, 3*H] or None in the
# compute type and returns (bias added to the input projection [D, G*H] or None,
# step(xp [D,B,G*H], h [D,B,H], c) -> (h, c)).

def _rnn_cell(acts, pre):
    (f,) = acts

    def bind(R, B, P, H):
        R = np.ascontiguousarray(R)
        RT = np.ascontiguousarray(R.transpose(0, 2, 1))
        bias = None if B is None else B[:, :H] + B[:, H:]

        def step(xp, h, c):
            return f(pre(xp + _state_product(h, R, RT))), None
        return bias, step
    return bind


def _gru_cell(acts, pre, linear_before_reset):
    f, g = acts

    def bind(R, B, P, H):
        R = np.ascontiguousarray(R)
        RT = R.transpose(0, 2, 1)                       # [D, H, 3H], gates z r h
        if B is None:
            bias, rbh = None, None
        else:
            wb, rb = B[:, :3 * H], B[:, 3 * H:]
            bias = wb.copy()
            bias[:, :2 * H] += rb[:, :2 * H]
            if linear_before_reset:
                rbh = rb[:, None, 2 * H:]               # stays inside the reset product
            else:
                bias[:, 2 * H:] += rb[:, 2 * H:]
                rbh = None

        if linear_before_reset:
            RT_all = np.ascontiguousarray(RT)

            def step(xp, h, c):
                hr = _state_product(h, R, RT_all)
                z = f(pre(xp[..., :H] + hr[..., :H]))
                r = f(pre(xp[..., H:2 * H] + hr[..., H:2 * H]))
                hh = hr[..., 2 * H:]
                if rbh is not None:
                    hh = hh + rbh
                ht = g(pre(xp[..., 2 * H:] + r * hh))
                return ht + z * (h - ht), None
        else:
            R_zr, R_h = R[:, :2 * H], R[:, 2 * H:]
            RT_zr = np.ascontiguousarray(RT[:, :, :2 * H])
            RT_h = np.ascontiguousarray(RT[:, :, 2 * H:])

            def step(xp, h, c):
                zr = xp[..., :2 * H] + _state_product(h, R_zr, RT_zr)
                z = f(pre(zr[..., :H]))
                r = f(pre(zr[..., H:]))
                ht = g(pre(xp[..., 2 * H:] + _state_product(r * h, R_h, RT_h)))
                return ht + z * (h - ht), None
        return bias, step
    return bind


def _lstm_cell(acts, pre, input_forget):
    f, g, hf = acts

    def bind(R, B, P, H):
        R = np.ascontiguousarray(R)
        RT = np.ascontiguousarray(R.transpose(0, 2, 1))    # [D, H, 4H], gates i o f c
        bias = None if B is None else B[:, :4 * H] + B[:, 4 * H:]
        if P is None:
            pi = po = pf = None
        else:
            pi, po, pf = (P[:, None, k * H:(k + 1) * H] for k in range(3))

        def step(xp, h, c):
            gates = xp + _state_product(h, R, RT)
            if pi is None and not input_forget:      # i, o, f share f and lie side by side: one call
                iof = f(pre(gates[..., :3 * H]))
                cn = iof[..., 2 * H:] * c
                cn += iof[..., :H] * g(pre(gates[..., 3 * H:]))
                return iof[..., H:2 * H] * hf(cn), cn
            i_in, o_in = gates[..., :H], gates[..., H:2 * H]
            f_in, c_in = gates[..., 2 * H:3 * H], gates[..., 3 * H:]
            if pi is not None:
                i_in = i_in + pi * c
                f_in = f_in + pf * c
            i = f(pre(i_in))
            fg = 1 - i if input_forget else f(pre(f_in))
            cn = fg * c + i * g(pre(c_in))
            if po is not None:
                o_in = o_in + po * cn
            o = f(pre(o_in))
            return o * hf(cn), cn
        return bias, step
    return bind


# -- the shared driver -----------------------------------------------------------------------------

_DIRECTIONS = {"forward": (False,), "reverse": (True,), "bidirectional": (False, True)}


def _recurrent(op, bind_factory, *, gates, default_acts, direction, layout, hidden_size, activations,
               activation_alpha, activation_beta, clip, n_outputs, has_cell, **cell_attrs):
    """Parse what every cell shares and return the kernel function."""
    if direction not in _DIRECTIONS:
        raise ValueError(f"direction must be forward, reverse or bidirectional, got {direction!r}")
    if layout not in (0, 1):
        raise ValueError(f"layout must be 0 or 1, got {layout}")
    if hidden_size is not None and hidden_size <= 0:
        raise ValueError(f"hidden_size must be positive, got {hidden_size}")
    reverse = _DIRECTIONS[direction]
    D = len(reverse)
    acts = _activation_functions(op, activations, default_acts, activation_alpha, activation_beta, D)
    bind = bind_factory(acts, _clipper(clip), **cell_attrs)
    G = gates

    def run(X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None):
        dtype = X.dtype
        if X.ndim != 3:
            raise InvalidValueError(f"X must have rank 3, got shape {list(X.shape)}")
        for name, v in (("W", W), ("R", R), ("B", B), ("initial_h", initial_h), ("initial_c", initial_c),
                        ("P", P)):
            if v is not None and v.dtype != dtype:
                raise InvalidValueError(f"{name} has type {v.dtype}, X has {dtype}: they must match")
        if R.ndim != 3:
            raise InvalidValueError(f"R must have rank 3, got shape {list(R.shape)}")
        H = R.shape[-1] if hidden_size is None else hidden_size
        T, Bn, I = (X.shape[0], X.shape[1], X.shape[2]) if layout == 0 else (X.shape[1], X.shape[0], X.shape[2])
        _check_shape("W", W, (D, G * H, I))
        _check_shape("R", R, (D, G * H, H))
        _check_shape("B", B, (D, 2 * G * H))
        _check_shape("P", P, (D, 3 * H))
        state_shape = (D, Bn, H) if layout == 0 else (Bn, D, H)
        _check_shape("initial_h", initial_h, state_shape)
        _check_shape("initial_c", initial_c, state_shape)
        lens = _lengths(sequence_lens, T, Bn)

        ct = np.dtype(np.float32) if dtype in UPCAST else dtype
        X, W, R, B, P, h0, c0 = (None if v is None else v.astype(ct, copy=False)
                                 for v in (X, W, R, B, P, initial_h, initial_c))
        bias, step = bind(R, B, P, H)

        # the input projection of every step and direction, one matmul: -> [T, D, B, G*H] (a view)
        xp = blas.matmul(X.reshape(-1, I), W.reshape(D * G * H, I).T)
        if bias is not None:
            xp += bias.reshape(-1)
        xp = (xp.reshape(T, Bn, D, G * H).transpose(0, 2, 1, 3) if layout == 0
              else xp.reshape(Bn, T, D, G * H).transpose(1, 2, 0, 3))

        # step order: reverse directions run from each sequence's last valid step back to 0
        if lens is None:
            order = None
            if reverse == (True,):
                xp = xp[::-1]
            elif D == 2:
                xin = np.empty((T, D, Bn, G * H), ct)
                xin[:, 0] = xp[:, 0]
                xin[:, 1] = xp[::-1, 1]
                xp = xin
        else:
            s = np.arange(T)[:, None]
            valid = s < lens                                                # [T, B]
            order = (np.where(valid, lens - 1 - s, s), np.arange(Bn))       # s <-> len-1-s
            if reverse == (True,):
                xp = xp[order[0], 0, order[1]][:, None]
            elif D == 2:
                xin = np.empty((T, D, Bn, G * H), ct)
                xin[:, 0] = xp[:, 0]
                xin[:, 1] = xp[order[0], 1, order[1]]
                xp = xin

        h = np.zeros((D, Bn, H), ct) if h0 is None else (h0 if layout == 0 else h0.transpose(1, 0, 2))
        c = None
        if has_cell:
            c = np.zeros((D, Bn, H), ct) if c0 is None else (c0 if layout == 0 else c0.transpose(1, 0, 2))
        ys = np.empty((T, D, Bn, H), ct)
        if lens is None:
            for t in range(T):
                h, c = step(xp[t], h, c)
                ys[t] = h
        else:
            full = valid.all(axis=1)
            keep = ~valid[:, None, :, None]                                 # [T, 1, B, 1]
            for t in range(T):
                hn, cn = step(xp[t], h, c)
                if not full[t]:
                    hn = np.where(keep[t], h, hn)
                    if has_cell:
                        cn = np.where(keep[t], c, cn)
                h, c = hn, cn
                ys[t] = h

        if T == 0:
            h = h.copy()        # never hand back the caller's initial state itself
            c = None if c is None else c.copy()

        # back to time positions
        if True in reverse:
            if order is None:
                if D == 1:
                    ys = ys[::-1]
                else:
                    ys[:, 1] = ys[::-1, 1].copy()
            elif D == 1:
                ys = ys[order[0], 0, order[1]][:, None]
            else:
                ys[:, 1] = ys[order[0], 1, order[1]]
        if order is not None and not valid.all():
            ys = np.where(keep, 0, ys)

        outs = [ys, h, c][:n_outputs]
        if ct != dtype:
            outs = [None if v is None else v.astype(dtype) for v in outs]
        if layout == 1:
            trans = [(2, 0, 1, 3), (1, 0, 2), (1, 0, 2)]
            outs = [None if v is None else v.transpose(p) for v, p in zip(outs, trans)]
        return tuple(outs)
    return run


def _check_shape(name, v, expected):
    if v is not None and v.shape != expected:
        raise InvalidValueError(f"{name} has shape {list(v.shape)}, expected {list(expected)}")


def _lengths(sequence_lens, T, Bn):
    """Per-batch lengths as int64 [B], or None when every sequence has the full length T."""
    if sequence_lens is None:
        return None
    if sequence_lens.dtype.kind not in "iu":
        raise InvalidValueError(f"sequence_lens must be integers, got {sequence_lens.dtype}")
    if sequence_lens.shape != (Bn,):
        raise InvalidValueError(f"sequence_lens has shape {list(sequence_lens.shape)}, expected [{Bn}]")
    lens = sequence_lens.astype(np.int64)
    if Bn and (lens.min() < 0 or lens.max() > T):
        raise InvalidValueError(f"sequence_lens {lens.tolist()} must lie in [0, seq_length={T}]")
    return None if (lens == T).all() else lens


# -- RNN -------------------------------------------------------------------------------------------

def _rnn(*, _n_outputs, layout=0, **attrs):
    return _recurrent("RNN", _rnn_cell, gates=1, default_acts=("Tanh",), layout=layout,
                      n_outputs=_n_outputs, has_cell=False, **attrs)


@kernel("RNN", since=1, heavy=True)
def rnn_1(*, activation_alpha=None, activation_beta=None, activations=None, clip=None, direction="forward",
          hidden_size=None, output_sequence=0, _n_outputs):
    return _rnn(activation_alpha=activation_alpha, activation_beta=activation_beta, activations=activations,
                clip=clip, direction=direction, hidden_size=hidden_size, _n_outputs=_n_outputs)


@kernel("RNN", since=7, heavy=True)
def rnn_7(*, activation_alpha=None, activation_beta=None, activations=None, clip=None, direction="forward",
          hidden_size=None, _n_outputs):
    return _rnn(activation_alpha=activation_alpha, activation_beta=activation_beta, activations=activations,
                clip=clip, direction=direction, hidden_size=hidden_size, _n_outputs=_n_outputs)


@kernel("RNN", since=(14, 22), heavy=True)
def rnn_14(*, activation_alpha=None, activation_beta=None, activations=None, clip=None, direction="forward",
           hidden_size=None, layout=0, _n_outputs):
    return _rnn(activation_alpha=activation_alpha, activation_beta=activation_beta, activations=activations,
                clip=clip, direction=direction, hidden_size=hidden_size, layout=layout, _n_outputs=_n_outputs)


# -- GRU -------------------------------------------------------------------------------------------

def _gru(*, _n_outputs, layout=0, linear_before_reset=0, **attrs):
    return _recurrent("GRU", _gru_cell, gates=3, default_acts=("Sigmoid", "Tanh"), layout=layout,
                      n_outputs=_n_outputs, has_cell=False, linear_before_reset=linear_before_reset, **attrs)


@kernel("GRU", since=1, heavy=True)
def gru_1(*, activation_alpha=None, activation_beta=None, activations=None, clip=None, direction="foward",
          hidden_size=None, output_sequence=0, _n_outputs):
    # the schema's default is spelled "foward": it means forward
    return _gru(activation_alpha=activation_alpha, activation_beta=activation_beta, activations=activations,
                clip=clip, direction="forward" if direction == "foward" else direction,
                hidden_size=hidden_size, _n_outputs=_n_outputs)


@kernel("GRU", since=3, heavy=True)
def gru_3(*, activation_alpha=None, activation_beta=None, activations=None, clip=None, direction="forward",
          hidden_size=None, linear_before_reset=0, output_sequence=0, _n_outputs):
    return _gru(activation_alpha=activation_alpha, activation_beta=activation_beta, activations=activations,
                clip=clip, direction=direction, hidden_size=hidden_size,
                linear_before_reset=linear_before_reset, _n_outputs=_n_outputs)


@kernel("GRU", since=7, heavy=True)
def gru_7(*, activation_alpha=None, activation_beta=None, activations=None, clip=None, direction="forward",
          hidden_size=None, linear_before_reset=0, _n_outputs):
    return _gru(activation_alpha=activation_alpha, activation_beta=activation_beta, activations=activations,
                clip=clip, direction=direction, hidden_size=hidden_size,
                linear_before_reset=linear_before_reset, _n_outputs=_n_outputs)


@kernel("GRU", since=(14, 22), heavy=True)
def gru_14(*, activation_alpha=None, activation_beta=None, activations=None, clip=None, direction="forward",
           hidden_size=None, layout=0, linear_before_reset=0, _n_outputs):
    return _gru(activation_alpha=activation_alpha, activation_beta=activation_beta, activations=activations,
                clip=clip, direction=direction, hidden_size=hidden_size, layout=layout,
                linear_before_reset=linear_before_reset, _n_outputs=_n_outputs)


# -- LSTM ------------------------------------------------------------------------------------------

def _lstm(*, _n_outputs, layout=0, input_forget=0, **attrs):
    return _recurrent("LSTM", _lstm_cell, gates=4, default_acts=("Sigmoid", "Tanh", "Tanh"), layout=layout,
                      n_outputs=_n_outputs, has_cell=True, input_forget=input_forget, **attrs)


@kernel("LSTM", since=1, heavy=True)
def lstm_1(*, activation_alpha=None, activation_beta=None, activations=None, clip=None, direction="forward",
           hidden_size=None, input_forget=0, output_sequence=0, _n_outputs):
    return _lstm(activation_alpha=activation_alpha, activation_beta=activation_beta, activations=activations,
                 clip=clip, direction=direction, hidden_size=hidden_size, input_forget=input_forget,
                 _n_outputs=_n_outputs)


@kernel("LSTM", since=7, heavy=True)
def lstm_7(*, activation_alpha=None, activation_beta=None, activations=None, clip=None, direction="forward",
           hidden_size=None, input_forget=0, _n_outputs):
    return _lstm(activation_alpha=activation_alpha, activation_beta=activation_beta, activations=activations,
                 clip=clip, direction=direction, hidden_size=hidden_size, input_forget=input_forget,
                 _n_outputs=_n_outputs)


@kernel("LSTM", since=(14, 22), heavy=True)
def lstm_14(*, activation_alpha=None, activation_beta=None, activations=None, clip=None, direction="forward",
            hidden_size=None, input_forget=0, layout=0, _n_outputs):
    return _lstm(activation_alpha=activation_alpha, activation_beta=activation_beta, activations=activations,
                 clip=clip, direction=direction, hidden_size=hidden_size, input_forget=input_forget,
                 layout=layout, _n_outputs=_n_outputs)
