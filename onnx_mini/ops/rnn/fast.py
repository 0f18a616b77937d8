"""The tuned form of the recurrent cells with their default activations (Sigmoid, Tanh), with or
without clip: the same values as spec.py's equations, computed in place on buffers made per run,
before the loop; and the per-run choices of algorithm, each with what was measured.

- sigmoid(x) = 1 / (1 + exp(-x)), the negation folded into the packed weights and biases of the
  sigmoid gates (exact): exp, add, reciprocal (activations.sigmoid_of_negated). numpy's float32 exp
  is SIMD and its tanh is not here (16384 values: exp 21, tanh 58 us; the sigmoid of 12288: 22
  against 36 us for (tanh(x/2) + 1) / 2, which also loses the tail: 0 at x = -20, thousands of ulp
  below x ~ -9; this form stays within 3 ulp). exp(-x) overflows to inf for x < -88.7 and gives 0,
  as it should: the loops run with overflow ignored (`quiet`);
- LSTM's gates are packed as [c i f o]: one tanh for c, the sigmoid of the three last side by side;
- for a few rows of a wide state the product runs as R @ h^T (OpenBLAS is faster that way) and the
  whole step in that column form ([D, G*H, B] buffers), turned back once after the loop;
- one direction steps on 2-D arrays (np.dot: the cheapest product call); two directions step together
  (batched products), or each in its own loop on its own thread when the products are large.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ... import blas, parallel
from .._common import fp_errors_ignored
from ..math.activations import sigmoid_of_negated


class Form(NamedTuple):
    """How a run lays out its arrays: row form [D, B, n] (the state product h @ R^T) or column form
    [D, n, B] (R @ h), without the D axis for one direction (2-D products are the cheapest numpy call)."""

    H: int
    ct: np.dtype
    col: bool
    lead: tuple        # (D,), or () for one direction

    def buffer(self, n, Bn):
        return np.empty(self.lead + ((n, Bn) if self.col else (Bn, n)), self.ct)

    def gates(self, a, k, end):
        """Packed gates k..end-1 of a buffer (a view)."""
        H = self.H
        return a[..., k * H:end * H, :] if self.col else a[..., k * H:end * H]

    def rows(self, a, b):
        """The index of a projection step's rows a..b-1 (its gate axis), without an Ellipsis (a plain slice
        indexes ~0.2 us faster: two per GRU step)."""
        index = (slice(None),) * (len(self.lead) + (not self.col)) + (slice(a, b),)
        return index[0] if len(index) == 1 else index

    def vector(self, v, Bn):
        """A per-direction vector [D, H] repeated to the state's shape, contiguous: a same-shape add costs
        less than a broadcasting one (H=256 B=16 float32: 3.3-4.6 -> 1.0-1.5 us column form, where the
        broadcast runs one inner loop per row of B; 2.0-2.3 -> 1.4 us row form)."""
        v = v if self.lead else v[0]
        v = v[..., None] if self.col else v[..., None, :]
        return np.ascontiguousarray(np.broadcast_to(v, self.lead + ((self.H, Bn) if self.col else (Bn, self.H))))

    def product(self, pair, Bn):
        """(matmul, a, b) of the state product with one of driver.Weights.R's pairs: a @ h into out in column
        form (a = R), h @ b in row form (b = R^T); the step branches on `col` (cheaper than a lambda)."""
        RT, R = pair if self.lead else (pair[0][0], pair[1][0])
        mm = matmul_for(RT.size * Bn)
        if mm is np.matmul and not self.lead:
            mm = np.dot         # 2-D: ~0.6 us less than np.matmul a call (measured H=64, gates 4H)
        return mm, R, RT


def quiet(fn):
    """fn run with numpy's overflow warning off: a sigmoid gate's exp(-x) is inf for x < -88.7 (float32),
    and 1 / (1 + inf) = 0 is its value (one state change a loop, ~0.4 us, not one a step)."""
    return fp_errors_ignored(over="ignore")(fn)


def rnn_step(w, form, Bn, clip):
    mm, R, RT = form.product(w.R[0], Bn)
    col = form.col
    add, tanh = np.add, np.tanh          # closure cells (lstm_step)

    def step(xt, h, hout, c, cout):
        if col:
            mm(R, h, hout)
        else:
            mm(h, RT, hout)
        add(hout, xt, hout)
        if clip is not None:
            clip_into(hout, clip)
        tanh(hout, hout)
    return step


def gru_step(w, form, Bn, clip, linear_before_reset):
    """Packed gates z r h, z and r negated (sigmoid through exp)."""
    H = w.H
    col = form.col
    mm, R, RT = form.product(w.R[0], Bn)       # linear_before_reset: the three gates; else z and r
    if linear_before_reset:
        buf = form.buffer(3 * H, Bn)
        zr, hh = form.gates(buf, 0, 2), form.gates(buf, 2, 3)
    else:                                       # h's product waits for r
        buf = zr = form.buffer(2 * H, Bn)
        hh, rh = form.buffer(H, Bn), form.buffer(H, Bn)
        mm_h, R_h, RT_h = form.product(w.R[1], Bn)
    z, r = form.gates(zr, 0, 1), form.gates(zr, 1, 2)
    x_zr, x_h = form.rows(0, 2 * H), form.rows(2 * H, 3 * H)
    rbh = None if w.rbh is None else form.vector(w.rbh, Bn)
    add, mul, sub, tanh, sigmoid = np.add, np.multiply, np.subtract, np.tanh, sigmoid_of_negated

    def step(xt, h, hout, c, cout):
        if col:
            mm(R, h, buf)
        else:
            mm(h, RT, buf)
        add(zr, xt[x_zr], zr)
        if clip is not None:
            clip_into(zr, clip)
        sigmoid(zr)                          # z, r
        if linear_before_reset:
            if rbh is not None:
                add(hh, rbh, hh)
            mul(hh, r, hh)
        else:
            mul(r, h, rh)
            if col:
                mm_h(R_h, rh, hh)
            else:
                mm_h(rh, RT_h, hh)
        add(hh, xt[x_h], hh)
        if clip is not None:
            clip_into(hh, clip)
        tanh(hh, hh)                         # ht
        sub(h, hh, hout)                     # (1 - z) * ht + z * h = ht + z * (h - ht)
        mul(hout, z, hout)
        add(hout, hh, hout)
    return step


def lstm_step(w, form, Bn, clip, input_forget=0):
    """Packed gates c i f o, i f o negated (sigmoid through exp; no input_forget, no peepholes: those
    take the spec's form)."""
    buf = form.buffer(4 * w.H, Bn)
    g, i, f, o, ifo = [form.gates(buf, k, end) for k, end in ((0, 1), (1, 2), (2, 3), (3, 4), (1, 4))]
    mm, R, RT = form.product(w.R[0], Bn)
    col = form.col
    # the ufuncs as closure cells, not np.<name> looked up per call: a step of ~10 small calls ~0.1 us a
    # call faster (whole kernel, T=200 B=1 H=64: LSTM 0.91x, GRU 0.91x; wake word's LSTM T=12 0.93x)
    add, mul, tanh, sigmoid = np.add, np.multiply, np.tanh, sigmoid_of_negated

    def step(xt, h, hout, c, cout):
        if col:
            mm(R, h, buf)
        else:
            mm(h, RT, buf)
        add(buf, xt, buf)
        if clip is not None:
            clip_into(buf, clip)
        tanh(g, g)
        sigmoid(ifo)                         # i, f, o
        mul(f, c, cout)
        mul(i, g, i)
        add(cout, i, cout)                   # c = f * c + i * g
        tanh(cout, hout)
        mul(hout, o, hout)
    return step


def matmul_for(macs):
    """blas.matmul for a product it may split over threads, else np.matmul: blas.matmul splits nothing
    below 2 * MIN_PART_MACS, and its checks cost ~2 us a call (a step of a VAD's LSTM, H=64: ~10 us)."""
    return blas.matmul if macs >= 2 * blas.MIN_PART_MACS else np.matmul


def project(macs):
    """matmul_for, as np.dot below the split size: the input projection is a 2-D product (np.dot ~0.6 us
    less a call than np.matmul, as Form.product measured)."""
    mm = matmul_for(macs)
    return np.dot if mm is np.matmul else mm


def clip_into(x, bound):
    """x bounded to [-bound, bound] in place (two ufuncs: np.clip's Python wrapper costs more per step)."""
    np.minimum(x, bound, out=x)
    np.maximum(x, -bound, out=x)


def column_form(Bn, H):
    """Whether the step runs in the column form: R @ h^T beats h @ R^T on OpenBLAS for a few rows of a
    wide state (products alone, H = 256, gates 4H: B=4 81 vs 39 us, B=16 121 vs 79 us, B=48 211 vs 196 us;
    B=1 and B >= 64 lose; whole LSTM/GRU runs, T=30, column / row time: H=256 B=2..48 0.83-0.96, B=64
    1.27; H=128 B=4/16 0.71-1.08; H=64 B=4/16 0.85-0.90)."""
    return 1 < Bn <= 48 and H >= 64


def split_directions(Bn, H, G):
    """Whether the two directions run on two threads, each its own loop (one hand-off a run): only where
    a step's product dwarfs its gate math, whose numpy calls hold the GIL (measured: two threads / one,
    bidirectional LSTM T=50, per-direction product of 2M multiply-adds (B=8, H=256): 0.57-0.88; 1M
    (B=4/16, H=256/128/512): 0.86-1.07; 49K-524K: 0.79-1.55). From 2 * MIN_PART_MACS for the two
    directions blas.matmul splits each step's product itself."""
    macs = Bn * H * G * H
    return parallel.threads() > 1 and SPLIT_DIRECTIONS_MACS <= macs < blas.MIN_PART_MACS


SPLIT_DIRECTIONS_MACS = 2 ** 21


def split_batch(Bn, H) -> bool:
    """Whether one direction's full sequences run as two batch halves, each its own loop on its own thread
    with one OpenBLAS thread (driver's in_halves: one hand-off a run; each sequence's recurrence is its own)."""
    return parallel.threads() > 1 and Bn >= SPLIT_BATCH_MIN and H >= SPLIT_BATCH_MIN_HIDDEN


# From this batch and hidden size (T=100, the whole kernel, the old and new package alternating in one
# process, new / old): LSTM H=256 B=48 0.77, B=64 0.70, B=128 0.84; GRU H=256 B=64 0.83; LSTM H=128 B=64
# 0.68, H=64 B=64 0.89; a tie at H=256 B=32 (LSTM 0.99, GRU 0.97) and GRU H=64 B=256 (1.02); LSTM H=32
# B=64 1.61 (steps too small: the two loops' Python contends for the GIL).
SPLIT_BATCH_MIN = 48
SPLIT_BATCH_MIN_HIDDEN = 64
