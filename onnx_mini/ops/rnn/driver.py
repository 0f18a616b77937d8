"""The driver of the recurrent operators: the weights made ready once (`pack`), the input
projection, each direction's step order, the loop (its steps kept for later runs of the same shape:
`_Made`), sequence_lens and layout (the package's doc)."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ... import blas, parallel
from ...errors import InvalidValueError
from .._common import UPCAST, prepack
from . import fast, spec


# -- the weights, made ready once per model --------------------------------------------------------

class Weights(NamedTuple):
    dtype: np.dtype          # the weights' type (X must have it)
    ct: np.dtype             # the compute type
    I: int
    H: int
    WT: np.ndarray           # [I, D*G*H]: every gate and direction of W, transposed side by side
    bias: np.ndarray | None  # [1, D*G*H]: added to the input projection (2-D: a one-row projection of
                             # 768 float32 adds it in 1.2 us against 2.1 us for a 1-D bias)
    R: tuple                 # per product of the step: (R^T [D, H, n], R [D, n, H]) for its n gate rows
    rbh: np.ndarray | None   # [D, H]: GRU's Rb of the h gate when linear_before_reset keeps it in the product
    P: np.ndarray | None     # [D, 3, H]: LSTM peepholes i, o, f
    WTb: np.ndarray          # [I + 1, D*G*H]: WT over bias (both are views of it), or WT without a bias


def pack(W, R, B, P, *, D, G, hidden_size, order, scale, products, apart):
    """W, R, B, P (each direction's gates in the spec's order) -> Weights with the gates in `order`
    (spec gate indices), the rows of packed gate k multiplied by scale[k] (exact: -1 or powers of two),
    R split into `products` (ranges of packed gates) and the spec gate `apart` (or None) left out of
    the projection's bias (its Rb stays inside the reset product: rbh)."""
    dtype = W.dtype
    for name, v in (("R", R), ("B", B), ("P", P)):
        if v is not None and v.dtype != dtype:
            raise InvalidValueError(f"{name} has type {v.dtype}, W has {dtype}: they must match")
    if W.ndim != 3:
        raise InvalidValueError(f"W must have rank 3, got shape {list(W.shape)}")
    if R.ndim != 3:
        raise InvalidValueError(f"R must have rank 3, got shape {list(R.shape)}")
    H = R.shape[-1] if hidden_size is None else hidden_size
    I = W.shape[2]
    _check_shape("W", W, (D, G * H, I))
    _check_shape("R", R, (D, G * H, H))
    _check_shape("B", B, (D, 2 * G * H))
    _check_shape("P", P, (D, 3 * H))
    ct = np.dtype(np.float32) if dtype in UPCAST else dtype
    rows = np.concatenate([np.arange(k * H, (k + 1) * H) for k in order])
    factor = np.repeat(np.asarray(scale, ct), H)[:, None]

    def gatewise(v):          # [D, G*H, ...] -> a copy in the packed gate order, scaled
        v = v.astype(ct, copy=False)[:, rows]
        return v if (factor == 1).all() else v * factor.reshape((G * H,) + (1,) * (v.ndim - 2))

    WT = gatewise(W).reshape(D * G * H, I).T
    Rp = gatewise(R)
    Rs = tuple((np.ascontiguousarray(Rp[:, a * H:b * H].transpose(0, 2, 1)), np.ascontiguousarray(Rp[:, a * H:b * H]))
               for a, b in products)
    bias = rbh = None
    if B is not None:
        wb, rb = gatewise(B[:, :G * H, None])[..., 0], gatewise(B[:, G * H:, None])[..., 0]
        bias = wb + rb
        if apart is not None:
            k = order.index(apart)
            bias[:, k * H:(k + 1) * H] = wb[:, k * H:(k + 1) * H]
            rbh = rb[:, k * H:(k + 1) * H]
    # WT and the bias as one array: the column form's projection multiplies it whole with a column of ones
    # beside X, the bias added inside the product (_column_projection)
    WTb = np.empty((I + (bias is not None), D * G * H), ct)
    WTb[:I] = WT
    if bias is not None:
        WTb[I] = bias.reshape(-1)
        bias = WTb[I:]
    Pp = None if P is None else P.astype(ct).reshape(D, 3, H)
    return Weights(dtype, ct, I, H, WTb[:I], bias, Rs, rbh, Pp, WTb)


class Cell(NamedTuple):
    gates: int
    default_acts: tuple
    has_cell: bool
    fast: object             # fast(w, form, Bn, clip, **attrs) -> step, for the default activations
    general: object          # general(w, acts, clipper, **attrs) -> step
    fast_order: tuple        # the packed gate order of the fast form (spec gate indices)
    fast_scale: tuple        # per packed gate: -1 for a sigmoid gate (computed as 1 / (1 + exp(-x)))


RNN = Cell(1, ("Tanh",), False, fast.rnn_step, spec.rnn_step, (0,), (1,))
GRU = Cell(3, ("Sigmoid", "Tanh"), False, fast.gru_step, spec.gru_step, (0, 1, 2), (-1, -1, 1))
LSTM = Cell(4, ("Sigmoid", "Tanh", "Tanh"), True, fast.lstm_step, spec.lstm_step, (3, 0, 2, 1), (1, -1, -1, -1))


# -- the shared driver -----------------------------------------------------------------------------

_DIRECTIONS = {"forward": (False,), "reverse": (True,), "bidirectional": (False, True)}


def recurrent(op, cell, *, direction, layout, hidden_size, activations, activation_alpha, activation_beta,
              clip, n_outputs, constants, **cell_attrs):
    """Parse what every cell shares and return the kernel function."""
    if direction not in _DIRECTIONS:
        raise ValueError(f"direction must be forward, reverse or bidirectional, got {direction!r}")
    if layout not in (0, 1):
        raise ValueError(f"layout must be 0 or 1, got {layout}")
    if hidden_size is not None and hidden_size <= 0:
        raise ValueError(f"hidden_size must be positive, got {hidden_size}")
    reverse = _DIRECTIONS[direction]
    D, G = len(reverse), cell.gates
    acts, names = spec.activation_functions(op, activations, cell.default_acts, activation_alpha, activation_beta, D)
    clip = spec.check_clip(clip)
    # the tuned form (fast.py): default activations, and none of the LSTM options only the spec's form
    # has (peepholes fed at run time also take the spec's form)
    tuned = (names == [n.lower() for n in cell.default_acts] * D and not cell_attrs.get("input_forget")
            and constants.get(7) is None)
    apart = 2 if op == "GRU" and cell_attrs.get("linear_before_reset") else None
    products = ((0, 2), (2, 3)) if op == "GRU" and apart is None else ((0, G),)

    def packer(order, scale):
        return lambda W, R, B, P: pack(W, R, B, P, D=D, G=G, hidden_size=hidden_size, order=order, scale=scale,
                                       products=products, apart=apart)
    spec_weights = packer(tuple(range(G)), (1,) * G)
    tuned_weights = steps = None
    if tuned:
        tuned_weights = prepack(packer(cell.fast_order, cell.fast_scale), constants, (1, 2, 3, 7), required=2)

        def make(w, Bn, col, d):    # a tuned step for direction d, or for every direction when d is None
            if d is None:
                return cell.fast(w, fast.Form(w.H, w.ct, col, (D,)), Bn, clip, **cell_attrs)
            if D > 1:
                w = w._replace(R=tuple((RT[d:d + 1], R_[d:d + 1]) for RT, R_ in w.R),
                               rbh=None if w.rbh is None else w.rbh[d:d + 1])
            return cell.fast(w, fast.Form(w.H, w.ct, col, ()), Bn, clip, **cell_attrs)
        # constant weights: keep the steps runs made for later runs of the same shape
        steps = _Made(make) if 1 in constants and 2 in constants else _Made(make, keep=False)
    else:
        spec_weights = prepack(spec_weights, constants, (1, 2, 3, 7), required=2)

    def run(X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None):
        if X.ndim != 3:
            raise InvalidValueError(f"X must have rank 3, got shape {list(X.shape)}")
        dtype = X.dtype
        if W.dtype != dtype:
            raise InvalidValueError(f"W has type {W.dtype}, X has {dtype}: they must match")
        on_tuned = tuned and P is None
        w = tuned_weights(W, R, B, P) if on_tuned else spec_weights(W, R, B, P)
        H, I, ct = w.H, w.I, w.ct
        T, Bn = (X.shape[0], X.shape[1]) if layout == 0 else (X.shape[1], X.shape[0])
        if X.shape[2] != I:
            raise InvalidValueError(f"W has shape {list(W.shape)}, expected {[D, G * H, X.shape[2]]}")
        state_shape = (D, Bn, H) if layout == 0 else (Bn, D, H)
        if initial_h is not None and (initial_h.shape != state_shape or initial_h.dtype != dtype):
            _check_state("initial_h", initial_h, dtype, state_shape)
        if initial_c is not None and (initial_c.shape != state_shape or initial_c.dtype != dtype):
            _check_state("initial_c", initial_c, dtype, state_shape)
        lens = None if sequence_lens is None else _lengths(sequence_lens, T, Bn)
        if on_tuned and D == 1 and T > 1 and lens is None and fast.split_batch(Bn, H):
            return in_halves(X, W, R, B, initial_h, initial_c, Bn)
        if T == 1 and D == 1 and on_tuned and lens is None and (Bn == 1 or not fast.column_form(Bn, H)):
            return one_step(X, Bn, w, initial_h, initial_c)
        col = on_tuned and fast.column_form(Bn, H)

        # the input projection of every step and direction, one matmul
        if col:             # [T, D, G*H, B], the bias included
            xp, bias = _column_projection(X, w, T, Bn, D, layout), None
        else:               # [T*B, D*G*H] (row order: layout's)
            xp = fast.project(T * Bn * w.WT.size)(X.reshape(-1, I).astype(ct, copy=False), w.WT)
            if on_tuned and D == 1 and lens is None and T:
                if w.bias is not None:
                    np.add(xp, w.bias, xp)
                return one_direction(xp, T, Bn, w, initial_h, initial_c)
            xp = (xp.reshape(T, Bn, D, G * H).transpose(0, 2, 1, 3) if layout == 0
                  else xp.reshape(Bn, T, D, G * H).transpose(1, 2, 0, 3))
            bias = w.bias
        order = valid = None
        if lens is not None:
            s = np.arange(T)[:, None]
            valid = s < lens                                                # [T, B]
            order = (np.where(valid, lens - 1 - s, s), np.arange(Bn))       # s <-> len-1-s
        xp = _in_step_order(xp, bias, reverse, order, col)

        step_shape = (D, H, Bn) if col else (D, Bn, H)

        def state(v):       # an initial state as the step reads it
            if v is None:
                return np.zeros(step_shape, ct)
            v = v.astype(ct, copy=False)
            v = v.transpose(1, 0, 2) if layout == 1 else v
            return v.transpose(0, 2, 1) if col else v
        h = state(initial_h)
        c = cn = spare = None
        if cell.has_cell:
            c = state(initial_c)
            pair = np.empty((2, *step_shape), ct)
            cn, spare = pair[0], pair[1]        # (indexing: unpacking iterates, ~1 us more)
        ys = np.empty((T, *step_shape), ct)
        keep = full = None
        if lens is not None:
            full = valid.all(axis=1)
            keep = ~valid[:, None, None, :] if col else ~valid[:, None, :, None]     # [T, 1, B, 1]
        cs = None if c is None else (c, cn, spare)

        def direction(d):   # the steps of direction d alone, on 2-D arrays: -> its last (h, c)
            step = steps.take(w, Bn, col, d)
            last = _loop(step, xp[:, d], ys[:, d], h[d], cs and (cs[0][d], cs[1][d], cs[2][d]),
                         None if keep is None else keep[:, 0], full)
            steps.give(w, Bn, col, d, step)
            return last

        if not on_tuned:
            h, c = _loop(cell.general(w, acts, spec.clipper(clip), **cell_attrs), xp, ys, h, cs, keep, full)
        elif D == 1:
            h, c = direction(0)
            h, c = h[None], None if c is None else c[None]
        elif fast.split_directions(Bn, H, G):
            last = [None, None]

            def work(start, stop):
                for d in range(start, stop):
                    last[d] = direction(d)
            with blas.own_threads():
                parallel.split(work, 2, 1)
            h = np.stack([last[0][0], last[1][0]])
            c = None if c is None else np.stack([last[0][1], last[1][1]])
        else:
            step = steps.take(w, Bn, col, None)
            h, c = _loop(step, xp, ys, h, cs, keep, full)
            steps.give(w, Bn, col, None, step)

        # the last states, never views of Y nor the caller's initial state
        if col:
            h, c, ys = h.transpose(0, 2, 1), None if c is None else c.transpose(0, 2, 1), ys.transpose(0, 1, 3, 2)
        h = h.copy()
        if c is not None and T == 0:
            c = c.copy()
        ys = _in_time_order(ys, reverse, order)
        if valid is not None:           # some sequences end early: zeros beyond them
            np.copyto(ys, 0, where=~valid[:, None, :, None])

        outs = [ys, h, c][:n_outputs]
        if ct != dtype:
            outs = [None if v is None else v.astype(dtype) for v in outs]
        if layout == 1:
            trans = [(2, 0, 1, 3), (1, 0, 2), (1, 0, 2)]
            outs = [None if v is None else v.transpose(p) for v, p in zip(outs, trans)]
        return tuple(outs)

    def in_halves(X, W, R, B, initial_h, initial_c, Bn):
        """run of one direction, every sequence full, as two runs on the batch's halves (the recurrence of
        each sequence is its own), each on its own thread with one OpenBLAS thread (fast.split_batch);
        the outputs joined along the batch axis."""
        axis = 1 if layout == 0 else 0                  # the batch axis of X and of the states
        edges = (0, Bn // 2, Bn)
        parts = [None, None]

        def rows(v, k):
            return None if v is None else v[(slice(None),) * axis + (slice(edges[k], edges[k + 1]),)]

        def work(lo, hi):
            for k in range(lo, hi):
                parts[k] = run(rows(X, k), W, R, B, None, rows(initial_h, k), rows(initial_c, k))
        with blas.own_threads():
            parallel.split(work, 2, 1)
        y_axis = 2 if layout == 0 else 0                # Y: [T, D, B, H] or [B, T, D, H]
        return tuple(None if a is None else np.concatenate((a, b), axis=y_axis if i == 0 else axis)
                     for i, (a, b) in enumerate(zip(*parts)))

    def one_step(X, Bn, w, initial_h, initial_c):
        """run for T=1, one direction, row form, every sequence full (a greedy decoder's or a stream's call):
        X's [B, I] rows (either layout) projected, the states read where the caller has them, the step writing
        Y's one slot, none of the general path's choices made (kernel alone, old and new called in turn, same
        packed weights, medians under load: GRU H=256 I=128 B=1 48.6 -> 46.8 us, LSTM H=64 I=128 B=1 26.0 ->
        25.5)."""
        H, ct = w.H, w.ct
        x = X.reshape(Bn, w.I)          # [1, B, I] (layout 0) and [B, 1, I] (layout 1): the same rows
        xp = fast.project(Bn * w.WT.size)(x if x.dtype == ct else x.astype(ct), w.WT)
        if w.bias is not None:
            np.add(xp, w.bias, xp)
        Y = np.empty((1, 1, Bn, H), ct)
        h, c = initial_states(Bn, H, ct, initial_h, initial_c)
        cn = None if c is None else np.empty((Bn, H), ct)
        step = steps.take(w, Bn, False, 0)
        _step_once(step, xp, h, Y[0, 0], c, cn)
        steps.give(w, Bn, False, 0, step)
        return last_outputs(Y, Y[0, 0], cn, w)

    def one_direction(xp, T, Bn, w, initial_h, initial_c):
        """run's steps from the projection xp [T*B, G*H] for one direction in the row form, every sequence
        full (a stream's chunk of steps; a single step takes one_step): none of the general path's reordering
        and copies, the steps write Y in place (reverse: its slots walked backwards), the states are read where
        the caller has them (measured, kernel alone, thread CPU time: GRU T=1 B=1 H=256 63 -> 56 us, LSTM H=64
        T=1 32 -> 27, T=12 209 -> 189, with the 2-D bias and the 0-d halves)."""
        H, ct = w.H, w.ct
        Y = np.empty((T, 1, Bn, H), ct)
        h, c = initial_states(Bn, H, ct, initial_h, initial_c)
        step = steps.take(w, Bn, False, 0)
        GH = xp.shape[1]
        xs = xp.reshape(T, Bn, GH) if layout == 0 else xp.reshape(Bn, T, GH).transpose(1, 0, 2)
        ys = Y[:, 0]
        if reverse[0]:
            xs, ys = xs[::-1], ys[::-1]
        cs = None
        if c is not None:
            pair = np.empty((2, Bn, H), ct)
            cs = (c, pair[0], pair[1])
        h, c = _loop(step, xs, ys, h, cs, None, None)
        steps.give(w, Bn, False, 0, step)
        return last_outputs(Y, h, c, w)

    def initial_states(Bn, H, ct, initial_h, initial_c):
        """The one direction's h (and c for LSTM, else None) [B, H] to start from, in the compute type."""
        h = np.zeros((Bn, H), ct) if initial_h is None else _first(initial_h, layout, ct)
        c = None
        if cell.has_cell:
            c = np.zeros((Bn, H), ct) if initial_c is None else _first(initial_c, layout, ct)
        return h, c

    def last_outputs(Y, h, c, w):
        """Y [T, 1, B, H], and the last step's h (a slot of Y: copied) and c (the run's own buffer) as
        Y_h and Y_c, in `layout` and the model's type."""
        if layout == 0:
            outs = (Y, h[None].copy(), None if c is None else c[None])
        else:
            outs = (Y.transpose(2, 0, 1, 3), h[:, None].copy(), None if c is None else c[:, None])
        outs = outs[:n_outputs]
        if w.ct != w.dtype:
            outs = tuple(None if v is None else v.astype(w.dtype) for v in outs)
        return outs
    return run


def _first(state, layout, ct):
    """The one direction's [B, H] of an initial state in the compute type (a view when it has it)."""
    v = state[0] if layout == 0 else state[:, 0]
    return v if v.dtype == ct else v.astype(ct)


class _Made:
    """Tuned steps (with their scratch buffers) that no run is using, by run shape: a later run of the
    same shape takes one instead of making it (a VAD's T=1 call: ~5 of ~25 us). Per model; concurrent
    runs never share one (list.pop and list.append are atomic). keep=False: make every time (weights
    fed at run time: no packed copies kept alive)."""

    def __init__(self, make, keep=True):
        self.make, self.keep, self.free = make, keep, {}

    def take(self, w, Bn, col, d):
        entry = self.free.get((id(w), Bn, col, d))
        if entry is not None and entry[0] is w and entry[1]:
            try:
                return entry[1].pop()
            except IndexError:          # another run took the last one meanwhile
                pass
        return self.make(w, Bn, col, d)

    def give(self, w, Bn, col, d, step):
        if not self.keep:
            return
        key = (id(w), Bn, col, d)
        entry = self.free.get(key)
        if entry is None or entry[0] is not w:
            if len(self.free) >= 8:     # run shapes keep changing: start over
                self.free.clear()
            entry = self.free[key] = (w, [])
        entry[1].append(step)


@fast.quiet
def _step_once(step, *args):
    step(*args)


@fast.quiet
def _loop(step, xs, ys, h, cs, keep, full):
    """Run the steps over xs, the state of step t into ys[t]; cs: (c, and two buffers for the next c's)
    or None; keep [T, ...] (True where the sequence is over) or None. -> the last (h, c)."""
    c, cn, spare = cs or (None, None, None)
    if keep is None:
        for xt, hout in zip(xs, ys):
            step(xt, h, hout, c, cn)
            h = hout
            c, cn, spare = cn, spare, cn
    else:
        for t, (xt, hout) in enumerate(zip(xs, ys)):
            step(xt, h, hout, c, cn)
            if not full[t]:
                np.copyto(hout, h, where=keep[t])
                if c is not None:
                    np.copyto(cn, c, where=keep[t])
            h = hout
            c, cn, spare = cn, spare, cn
    return h, c


def _in_step_order(xp, bias, reverse, order, col):
    """The projection in time order, [T, D, B, G*H] (row form) or [T, D, G*H, B] (column form), bias
    [1, D*G*H] or None not yet added -> with the bias, in each direction's step order, in the same
    layout (a view when no direction needs moving). Where the order needs a copy the bias is added while
    copying (one pass fewer: LSTM H=256 B=16 T=100 I=128, kernel on one BLAS thread, thread CPU time
    33-35 -> 30-32 ms, measured under load)."""
    T, D = xp.shape[:2]
    GH = xp.shape[2] if col else xp.shape[3]
    per_d = None if bias is None else bias.reshape(D, GH, 1) if col else bias.reshape(D, 1, GH)
    if True not in reverse or (D == 1 and order is None):
        if per_d is not None:
            np.add(xp, per_d, xp)       # xp is the run's own projection
        return xp if True not in reverse else xp[::-1]
    out = np.empty(xp.shape, xp.dtype)
    for d, rev in enumerate(reverse):
        src = xp[:, d]
        if rev and order is None:
            src = src[::-1]
        elif rev:                       # gather the (step, batch) pairs: batch is the last axis in column form
            src = src.transpose(0, 2, 1)[order[0], order[1]].transpose(0, 2, 1) if col else src[order[0], order[1]]
        if per_d is None:
            out[:, d] = src
        else:
            np.add(src, per_d[d], out=out[:, d])
    return out


def _column_projection(X, w, T, Bn, D, layout):
    """The input projection of the column form, [T, D, G*H, B], the bias included: a view of one product
    [D*G*H, T*B] = WTb^T @ [X | 1]^T, with no transposing copy ([T*B, G*H] -> [T, G*H, B]) and no pass
    adding the bias. The steps then read rows of B values T*B apart, which costs them more (measured
    under load, T=100 B=16 I=128 H=256, one BLAS thread, thread CPU: LSTM projection 15.5 -> 6.4 ms,
    loop 23.2 -> 26.3; GRU 10.8 -> 5.0 and 18.2 -> 21.0; whole kernel on one thread 0.97x, bench_suite's
    lstm/gru models on two 0.72x/0.80x, median of alternating blocks)."""
    I = w.I
    if w.bias is None and layout == 0:
        xa = X.reshape(-1, I).astype(w.ct, copy=False)
    else:               # X in step order beside a column of ones (the bias's row of WTb)
        xa = np.empty((T, Bn, w.WTb.shape[0]), w.ct)
        xa[..., :I] = X if layout == 0 else X.transpose(1, 0, 2)
        xa[..., I:] = 1
        xa = xa.reshape(T * Bn, xa.shape[-1])
    xp = fast.project(T * Bn * w.WTb.size)(w.WTb.T, xa.T)
    return xp.reshape(D, xp.shape[0] // D, T, Bn).transpose(2, 0, 1, 3)


def _in_time_order(ys, reverse, order):
    """Step-ordered states [T, D, B, H] -> time order (the same gather: s <-> len-1-s is an involution)."""
    if True not in reverse:
        return ys
    if order is None:
        if len(reverse) == 1:
            return ys[::-1]
        ys[:, 1] = ys[::-1, 1].copy()
    elif len(reverse) == 1:
        return ys[order[0], 0, order[1]][:, None]
    else:
        ys[:, 1] = ys[order[0], 1, order[1]]
    return ys


def _check_state(name, v, dtype, expected):
    """Raise for an initial state whose type or shape is not the expected one (the run tests it inline)."""
    if v.dtype != dtype:
        raise InvalidValueError(f"{name} has type {v.dtype}, X has {dtype}: they must match")
    _check_shape(name, v, expected)


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
