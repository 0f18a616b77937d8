"""Recurrent operators (onnx/defs/rnn): RNN, GRU, LSTM, every version.

One driver serves the three cells. Per model (the factory, from `_constants`, as onnxruntime's
PrePack; per run when the weights are fed) `driver.pack` makes W, R and B ready once: every gate and
direction of W transposed side by side, W's and R's biases summed where no product separates them,
R in the forms the step multiplies. Per run the driver:

- projects the inputs of every time step and every direction with ONE matmul
  (X[T*B, I] @ W^T[I, D*G*H] + Wb (+ the parts of Rb that sit outside any gate product)); in the
  column form (fast.column_form) as [W^T | bias]^T @ [X | 1]^T, [D*G*H, T*B], which the steps read
  in place as [T, D, G*H, B] with the bias already in,
- lays that projection out in *step order* per direction ([T, D, B, G*H]): forward steps run
  t = 0..len-1; reverse steps run t = len-1..0 from each sequence's own last valid step (a gather
  with the per-batch index len-1-s, or a plain flip when every sequence has the full length),
- loops over the steps doing only the recurrent product (one matmul for every batch element, and for
  both directions unless each runs on its own thread) and the gate math; the state of step t is
  written straight into Y's step t,
- with sequence_lens, keeps the state of a sequence whose steps are over (copyto where) so Y_h/Y_c
  hold the state at its last valid step, and writes zeros in Y beyond each sequence's length,
- maps the step-ordered outputs back to time positions (the same gather: s <-> len-1-s is an
  involution) and applies `layout`.

One direction in the row form with every sequence full (a stream's chunk of steps, a greedy decoder's
single step) skips the reordering: its steps read the projection and the initial states where they lie
and write Y's slots in place (reverse: walked backwards); a single step (T=1) is sent there before the
choices the other cases need (driver.one_step).

Its modules: spec.py (the attributes, each cell's equations for any activations), fast.py (the tuned
form of the default activations, the per-run algorithm choices and their thresholds), driver.py (the
rest: packing, projection, step order, loop, outputs).

float16/bfloat16 compute in float32 and round back once.
"""
from __future__ import annotations

from ...registry import kernel
from .driver import GRU, LSTM, RNN, recurrent


# -- RNN -------------------------------------------------------------------------------------------

def _rnn(*, _n_outputs, _constants, layout=0, **attrs):
    return recurrent("RNN", RNN, layout=layout, n_outputs=_n_outputs, constants=_constants or {}, **attrs)


@kernel("RNN", since=1, heavy=True)
def rnn_1(*, activation_alpha=None, activation_beta=None, activations=None, clip=None, direction="forward",
          hidden_size=None, output_sequence=0, _n_outputs, _constants=None):
    return _rnn(activation_alpha=activation_alpha, activation_beta=activation_beta, activations=activations,
                clip=clip, direction=direction, hidden_size=hidden_size, _n_outputs=_n_outputs, _constants=_constants)


@kernel("RNN", since=7, heavy=True)
def rnn_7(*, activation_alpha=None, activation_beta=None, activations=None, clip=None, direction="forward",
          hidden_size=None, _n_outputs, _constants=None):
    return _rnn(activation_alpha=activation_alpha, activation_beta=activation_beta, activations=activations,
                clip=clip, direction=direction, hidden_size=hidden_size, _n_outputs=_n_outputs, _constants=_constants)


@kernel("RNN", since=(14, 22), heavy=True)
def rnn_14(*, activation_alpha=None, activation_beta=None, activations=None, clip=None, direction="forward",
           hidden_size=None, layout=0, _n_outputs, _constants=None):
    return _rnn(activation_alpha=activation_alpha, activation_beta=activation_beta, activations=activations,
                clip=clip, direction=direction, hidden_size=hidden_size, layout=layout, _n_outputs=_n_outputs,
                _constants=_constants)


# -- GRU -------------------------------------------------------------------------------------------

def _gru(*, _n_outputs, _constants, layout=0, linear_before_reset=0, **attrs):
    return recurrent("GRU", GRU, layout=layout, n_outputs=_n_outputs, constants=_constants or {},
                      linear_before_reset=linear_before_reset, **attrs)


@kernel("GRU", since=1, heavy=True)
def gru_1(*, activation_alpha=None, activation_beta=None, activations=None, clip=None, direction="foward",
          hidden_size=None, output_sequence=0, _n_outputs, _constants=None):
    # the schema's default is spelled "foward": it means forward
    return _gru(activation_alpha=activation_alpha, activation_beta=activation_beta, activations=activations,
                clip=clip, direction="forward" if direction == "foward" else direction,
                hidden_size=hidden_size, _n_outputs=_n_outputs, _constants=_constants)


@kernel("GRU", since=3, heavy=True)
def gru_3(*, activation_alpha=None, activation_beta=None, activations=None, clip=None, direction="forward",
          hidden_size=None, linear_before_reset=0, output_sequence=0, _n_outputs, _constants=None):
    return _gru(activation_alpha=activation_alpha, activation_beta=activation_beta, activations=activations,
                clip=clip, direction=direction, hidden_size=hidden_size,
                linear_before_reset=linear_before_reset, _n_outputs=_n_outputs, _constants=_constants)


@kernel("GRU", since=7, heavy=True)
def gru_7(*, activation_alpha=None, activation_beta=None, activations=None, clip=None, direction="forward",
          hidden_size=None, linear_before_reset=0, _n_outputs, _constants=None):
    return _gru(activation_alpha=activation_alpha, activation_beta=activation_beta, activations=activations,
                clip=clip, direction=direction, hidden_size=hidden_size,
                linear_before_reset=linear_before_reset, _n_outputs=_n_outputs, _constants=_constants)


@kernel("GRU", since=(14, 22), heavy=True)
def gru_14(*, activation_alpha=None, activation_beta=None, activations=None, clip=None, direction="forward",
           hidden_size=None, layout=0, linear_before_reset=0, _n_outputs, _constants=None):
    return _gru(activation_alpha=activation_alpha, activation_beta=activation_beta, activations=activations,
                clip=clip, direction=direction, hidden_size=hidden_size, layout=layout,
                linear_before_reset=linear_before_reset, _n_outputs=_n_outputs, _constants=_constants)


# -- LSTM ------------------------------------------------------------------------------------------

def _lstm(*, _n_outputs, _constants, layout=0, input_forget=0, **attrs):
    return recurrent("LSTM", LSTM, layout=layout, n_outputs=_n_outputs, constants=_constants or {},
                      input_forget=input_forget, **attrs)


@kernel("LSTM", since=1, heavy=True)
def lstm_1(*, activation_alpha=None, activation_beta=None, activations=None, clip=None, direction="forward",
           hidden_size=None, input_forget=0, output_sequence=0, _n_outputs, _constants=None):
    return _lstm(activation_alpha=activation_alpha, activation_beta=activation_beta, activations=activations,
                 clip=clip, direction=direction, hidden_size=hidden_size, input_forget=input_forget,
                 _n_outputs=_n_outputs, _constants=_constants)


@kernel("LSTM", since=7, heavy=True)
def lstm_7(*, activation_alpha=None, activation_beta=None, activations=None, clip=None, direction="forward",
           hidden_size=None, input_forget=0, _n_outputs, _constants=None):
    return _lstm(activation_alpha=activation_alpha, activation_beta=activation_beta, activations=activations,
                 clip=clip, direction=direction, hidden_size=hidden_size, input_forget=input_forget,
                 _n_outputs=_n_outputs, _constants=_constants)


@kernel("LSTM", since=(14, 22), heavy=True)
def lstm_14(*, activation_alpha=None, activation_beta=None, activations=None, clip=None, direction="forward",
            hidden_size=None, input_forget=0, layout=0, _n_outputs, _constants=None):
    return _lstm(activation_alpha=activation_alpha, activation_beta=activation_beta, activations=activations,
                 clip=clip, direction=direction, hidden_size=hidden_size, input_forget=input_forget,
                 layout=layout, _n_outputs=_n_outputs, _constants=_constants)
