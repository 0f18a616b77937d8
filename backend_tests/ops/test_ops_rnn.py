"""Spec tests for the recurrent operators RNN, GRU, LSTM (every version, every type).

Expected values come from a deliberately slow reference written here from the spec's equations:
one batch element, one direction, one time step at a time, on 1-D numpy vectors in float64.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import helper

import onnx_mini
from onnx_mini.errors import InvalidNodeError, KernelError, OnnxMiniError
from onnx_mini.ops.rnn import driver, fast

from helpers import NODE, elem_type, np_type, run_node, type_params, versions

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
DEFAULT_ACTS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}
ALL_VERSIONS = {op: versions(op) for op in GATES}


# -- the reference -------------------------------------------------------------------------------

def _act(name, alpha, beta):
    """One activation of the spec's list, on a 1-D float64 vector."""
    return {
        "Relu": lambda x: np.maximum(0.0, x),
        "Tanh": lambda x: (1 - np.exp(-2 * x)) / (1 + np.exp(-2 * x)),
        "Sigmoid": lambda x: 1 / (1 + np.exp(-x)),
        "Affine": lambda x: alpha * x + beta,
        "LeakyRelu": lambda x: np.array([v if v >= 0 else alpha * v for v in x]),
        "ThresholdedRelu": lambda x: np.array([v if v >= alpha else 0.0 for v in x]),
        "ScaledTanh": lambda x: alpha * np.tanh(beta * x),
        "HardSigmoid": lambda x: np.minimum(np.maximum(alpha * x + beta, 0), 1),
        "Elu": lambda x: np.array([v if v >= 0 else alpha * (np.exp(v) - 1) for v in x]),
        "Softsign": lambda x: x / (1 + np.abs(x)),
        "Softplus": lambda x: np.log(1 + np.exp(x)),
    }[name]


# the defaults of the corresponding ONNX operators (alpha, beta); None: not used
PARAM_DEFAULTS = {"Affine": (1.0, 0.0), "LeakyRelu": (0.01, None), "ThresholdedRelu": (1.0, None),
                  "ScaledTanh": (1.0, 1.0), "HardSigmoid": (0.2, 0.5), "Elu": (1.0, None)}


def _activations(op, names, alphas, betas, nd):
    n = len(DEFAULT_ACTS[op])
    names = list(names or DEFAULT_ACTS[op])
    if nd == 2 and len(names) == n:
        names = names * 2
    alphas, betas = list(alphas or []), list(betas or [])
    out = []
    for name in names[:n * nd]:
        da, db = PARAM_DEFAULTS.get(name, (None, None))
        a = (alphas.pop(0) if alphas else da) if da is not None else None
        b = (betas.pop(0) if betas else db) if db is not None else None
        out.append(_act(name, a, b))
    return [out[d * n:(d + 1) * n] for d in range(nd)]


def reference(op, X, W, R, B=None, lens=None, h0=None, c0=None, P=None, *, direction="forward", layout=0,
              activations=None, alpha=None, beta=None, clip=None, linear_before_reset=0, input_forget=0):
    """Y, Y_h, Y_c in float64 from the spec's equations, one batch element and one step at a time."""
    X, W, R = (np.asarray(v, np.float64) for v in (X, W, R))
    if layout == 1:
        X = X.transpose(1, 0, 2)
        h0 = None if h0 is None else np.asarray(h0).transpose(1, 0, 2)
        c0 = None if c0 is None else np.asarray(c0).transpose(1, 0, 2)
    T, nb, _ = X.shape
    nd, H = W.shape[0], R.shape[-1]
    G = GATES[op]
    B = np.zeros((nd, 2 * G * H)) if B is None else np.asarray(B, np.float64)
    P = np.zeros((nd, 3 * H)) if P is None else np.asarray(P, np.float64)
    h0 = np.zeros((nd, nb, H)) if h0 is None else np.asarray(h0, np.float64)
    c0 = np.zeros((nd, nb, H)) if c0 is None else np.asarray(c0, np.float64)
    lens = [T] * nb if lens is None else list(lens)
    acts = _activations(op, activations, alpha, beta, nd)
    cl = (lambda v: np.clip(v, -clip, clip)) if clip is not None else (lambda v: v)
    Y, Yh, Yc = np.zeros((T, nd, nb, H)), np.zeros((nd, nb, H)), np.zeros((nd, nb, H))
    for d in range(nd):
        rev = direction == "reverse" or d == 1
        w, r, wb, rb, p = W[d], R[d], B[d, :G * H], B[d, G * H:], P[d]
        gate = lambda m, k: m[k * H:(k + 1) * H]  # noqa: E731  (rows/entries of gate k)
        for b in range(nb):
            h, c = h0[d, b].copy(), c0[d, b].copy()
            steps = range(lens[b] - 1, -1, -1) if rev else range(lens[b])
            for t in steps:
                x = X[t, b]
                if op == "RNN":
                    (f,) = acts[d]
                    h = f(cl(w @ x + r @ h + wb + rb))
                elif op == "GRU":
                    f, g = acts[d]
                    z = f(cl(gate(w, 0) @ x + gate(r, 0) @ h + gate(wb, 0) + gate(rb, 0)))
                    rr = f(cl(gate(w, 1) @ x + gate(r, 1) @ h + gate(wb, 1) + gate(rb, 1)))
                    if linear_before_reset:
                        hh = g(cl(gate(w, 2) @ x + rr * (gate(r, 2) @ h + gate(rb, 2)) + gate(wb, 2)))
                    else:
                        hh = g(cl(gate(w, 2) @ x + gate(r, 2) @ (rr * h) + gate(rb, 2) + gate(wb, 2)))
                    h = (1 - z) * hh + z * h
                else:  # LSTM, gates i o f c, peepholes i o f
                    f, g, hf = acts[d]
                    pre = [gate(w, k) @ x + gate(r, k) @ h + gate(wb, k) + gate(rb, k) for k in range(4)]
                    i = f(cl(pre[0] + gate(p, 0) * c))
                    ff = 1 - i if input_forget else f(cl(pre[2] + gate(p, 2) * c))
                    c = ff * c + i * g(cl(pre[3]))
                    o = f(cl(pre[1] + gate(p, 1) * c))
                    h = o * hf(c)
                Y[t, d, b] = h
            Yh[d, b], Yc[d, b] = h, c
    if layout == 1:
        return Y.transpose(2, 0, 1, 3), Yh.transpose(1, 0, 2), Yc.transpose(1, 0, 2)
    return Y, Yh, Yc


# -- inputs and comparison -----------------------------------------------------------------------

def make_inputs(op, *, T=4, nb=3, I=2, H=3, nd=1, layout=0, seed=0, bias=True, lens=None, init=False,
                peep=False, dtype=np.float32):
    """[X, W, R, B, sequence_lens, initial_h, (initial_c, P)] with None for what is left out."""
    rng = np.random.default_rng(seed)
    G = GATES[op]
    u = lambda *s: rng.uniform(-1, 1, s).astype(dtype)  # noqa: E731
    X = u(T, nb, I) if layout == 0 else u(nb, T, I)
    state = (nd, nb, H) if layout == 0 else (nb, nd, H)
    ins = [X, u(nd, G * H, I), u(nd, G * H, H), u(nd, 2 * G * H) if bias else None,
           None if lens is None else np.array(lens, np.int32), u(*state) if init else None]
    if op == "LSTM":
        ins += [u(*state) if init else None, u(nd, 3 * H) if peep else None]
    return ins


def tolerance(dtype):
    return {np.dtype(np.float16): 5e-3, np.dtype(ml_dtypes.bfloat16): 4e-2,
            np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-12}[np.dtype(dtype)]


def check(op, version, ins, n_outputs=None, **attrs):
    n_outputs = n_outputs or (3 if op == "LSTM" else 2)
    got = run_node(op, version, ins, n_outputs=n_outputs, **attrs)
    ref_attrs = {{"activation_alpha": "alpha", "activation_beta": "beta"}.get(k, k): v for k, v in attrs.items()
                 if k not in ("hidden_size", "output_sequence")}
    exp = reference(op, *ins, **ref_attrs)[:n_outputs]
    dt = ins[0].dtype
    tol = tolerance(dt)
    for g, e in zip(got, exp):
        assert type(g) is np.ndarray and g.dtype == dt and g.shape == e.shape, (g.dtype, g.shape, e.shape)
        np.testing.assert_allclose(g.astype(np.float64), e, rtol=tol, atol=tol)
    return got


# -- every version and type ----------------------------------------------------------------------

@pytest.mark.parametrize("op", list(GATES))
def test_versions_are_all_listed(op):
    assert ALL_VERSIONS[op] == {"RNN": [1, 7, 14, 22], "GRU": [1, 3, 7, 14, 22], "LSTM": [1, 7, 14, 22]}[op]


@pytest.mark.parametrize("op,version,tname", [(op, *p.values) for op in GATES
                                              for p in type_params(op, ALL_VERSIONS[op])])
def test_every_version_and_type(op, version, tname):
    dt = np_type(tname)
    ins = make_inputs(op, nd=2, init=True, peep=True, lens=[4, 2, 3], dtype=np.float64)
    ins = [None if v is None else v if v.dtype.kind == "i" else v.astype(dt) for v in ins]
    check(op, version, ins, direction="bidirectional")


@pytest.mark.parametrize("op", list(GATES))
def test_sequence_lens_type_is_int32(op):
    for v in ALL_VERSIONS[op]:
        (t1,) = [t for t in onnx.defs.get_schema(op, v).type_constraints if t.type_param_str == "T1"]
        assert list(t1.allowed_type_strs) == ["tensor(int32)"]


# -- semantics -----------------------------------------------------------------------------------

CASES = [  # (direction, lens, init)
    ("forward", None, False), ("reverse", None, False), ("bidirectional", None, False),
    ("forward", [4, 1, 3], True), ("reverse", [2, 4, 0], True), ("bidirectional", [3, 1, 4], True),
    ("bidirectional", [4, 4, 4], False), ("reverse", None, True),
]


@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("direction,lens,init", CASES)
@pytest.mark.parametrize("op", list(GATES))
def test_directions_layouts_lengths(op, direction, lens, init, layout):
    nd = 2 if direction == "bidirectional" else 1
    ins = make_inputs(op, nd=nd, layout=layout, lens=lens, init=init, peep=init, seed=len(str(lens)))
    attrs = {"direction": direction}
    if layout:
        attrs["layout"] = 1
    Y, *_ = check(op, 22 if layout else 7, ins, **attrs)
    if lens is not None:  # beyond each sequence's length Y is zero
        Yt = Y if layout == 0 else Y.transpose(1, 2, 0, 3)
        for b, n in enumerate(lens):
            assert not Yt[n:, :, b].any()


@pytest.mark.parametrize("version", [7, 14])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_gru_linear_before_reset(version, direction):
    nd = 2 if direction == "bidirectional" else 1
    for lbr in (0, 1):
        check("GRU", version, make_inputs("GRU", nd=nd, init=True, lens=[3, 4, 1]), direction=direction,
              linear_before_reset=lbr, hidden_size=3)


def test_gru_linear_before_reset_changes_the_result():
    ins = make_inputs("GRU", seed=3)
    a = run_node("GRU", 7, ins, n_outputs=2, linear_before_reset=0)[1]
    b = run_node("GRU", 7, ins, n_outputs=2, linear_before_reset=1)[1]
    assert np.abs(a - b).max() > 1e-3


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_lstm_peepholes_and_input_forget(direction):
    nd = 2 if direction == "bidirectional" else 1
    for input_forget in (0, 1):
        for peep in (False, True):
            ins = make_inputs("LSTM", nd=nd, init=True, peep=peep, lens=[2, 4, 3], seed=7)
            check("LSTM", 14, ins, direction=direction, input_forget=input_forget)


@pytest.mark.parametrize("op", list(GATES))
def test_clip(op):
    ins = make_inputs(op, init=True, seed=4)
    ins[0] = ins[0] * 8
    clipped = check(op, 14, ins, clip=0.25)
    unclipped = run_node(op, 14, ins, n_outputs=2)
    assert np.abs(clipped[1] - unclipped[1]).max() > 1e-2


def _gate_tail_inputs(op, T, nb, pre, H=64):
    """Inputs whose gates all see the pre-activation `pre` and whose candidate sees 0 (W, R zero, the bias
    alone): LSTM's c = f * c0 (its candidate is tanh(0) = 0), GRU's h = z * h0 (ht = tanh(0) = 0)."""
    G, rng = GATES[op], np.random.default_rng(3)
    wb = np.full((1, G * H), pre, np.float32)
    wb[0, (3 if op == "LSTM" else 2) * H:(4 if op == "LSTM" else 3) * H] = 0     # the candidate's rows
    ins = [rng.uniform(-1, 1, (T, nb, 5)).astype(np.float32), np.zeros((1, G * H, 5), np.float32),
           np.zeros((1, G * H, H), np.float32), np.concatenate([wb, np.zeros_like(wb)], axis=1), None,
           rng.uniform(0.5, 1, (1, nb, H)).astype(np.float32)]
    return ins + [rng.uniform(0.5, 1, (1, nb, H)).astype(np.float32), None] if op == "LSTM" else ins


@pytest.mark.parametrize("pre", [-20.0, -100.0, 100.0])
@pytest.mark.parametrize("T,nb", [(1, 1), (3, 1), (3, 4)])      # one step, the row form's loop, the column form
@pytest.mark.parametrize("op,spec_form", [("GRU", False), ("LSTM", False), ("LSTM", True)])
def test_saturated_sigmoid_gates(op, spec_form, T, nb, pre):
    """A sigmoid gate far into its tail keeps its relative precision (sigmoid(-20) = 2.06e-9: a form
    through tanh(x / 2) rounds it to 0), and exp(-x)'s overflow below -88.7 gives 0 without a warning;
    in the tuned form and in the spec's (zero peepholes take it)."""
    import warnings

    ins = _gate_tail_inputs(op, T, nb, pre)
    if spec_form:
        ins[7] = np.zeros((1, 3 * 64), np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = run_node(op, 14, ins, n_outputs=3 if op == "LSTM" else 2, hidden_size=64)
    s = 1 / (1 + np.exp(-pre))                      # float64; exp(100) is finite there
    if op == "LSTM":       # c_t = s^t c0, h_t = s tanh(c_t)
        c = ins[6][0].astype(np.float64) * s ** np.arange(1, T + 1)[:, None, None]
        want_h, want_c = s * np.tanh(c[-1]), c[-1]
        np.testing.assert_allclose(got[2][0], want_c, rtol=1e-5, atol=1e-40)
    else:                  # h_t = s^t h0
        want_h = ins[5][0].astype(np.float64) * s ** T
    np.testing.assert_allclose(got[1][0], want_h, rtol=1e-5, atol=1e-40)
    if pre == -20.0 and T == 1:
        assert (got[1] > 0).all()


ACTS = ["Relu", "Tanh", "Sigmoid", "Affine", "LeakyRelu", "ThresholdedRelu", "ScaledTanh", "HardSigmoid",
        "Elu", "Softsign", "Softplus"]


@pytest.mark.parametrize("given", [False, True])
@pytest.mark.parametrize("act", ACTS)
def test_rnn_every_activation(act, given):
    attrs = {"activations": [act]}
    if given:
        attrs.update(activation_alpha=[0.7], activation_beta=[0.3])
    ins = make_inputs("RNN", init=True, seed=11)
    ins[0] = ins[0] * 3
    check("RNN", 14, ins, **attrs)


def test_activations_per_direction_and_parameter_order():
    # alpha/beta are consumed in order by the functions that take them, forward then reverse
    acts = ["HardSigmoid", "LeakyRelu", "Affine", "Sigmoid", "Elu", "ScaledTanh"]
    ins = make_inputs("LSTM", nd=2, init=True, peep=True, lens=[4, 3, 2], seed=5)
    check("LSTM", 22, ins, direction="bidirectional", activations=acts,
          activation_alpha=[0.3, 0.2, 1.5, 0.9, 0.8], activation_beta=[0.4, -0.25, 2.0])
    check("GRU", 22, make_inputs("GRU", nd=2, seed=6), direction="bidirectional",
          activations=["Softsign", "Relu", "Sigmoid", "Softplus"])
    # a bidirectional node given one direction's list uses it for both
    check("GRU", 22, make_inputs("GRU", nd=2, seed=6), direction="bidirectional",
          activations=["HardSigmoid", "Softsign"], activation_alpha=[0.25])


def test_rnn_schema_default_activation_list():
    # RNN's schema default is [Tanh, Tanh]; a forward node spelling it out uses the first one
    check("RNN", 7, make_inputs("RNN", seed=2), activations=["Tanh", "Tanh"])


def test_rnn_hand_computed():
    # H = I = 1, W = 2, R = 0.5, Wb = 1, Relu: Ht = relu(2 x + 0.5 Ht-1 + 1)
    X = np.array([1, -1, 3], np.float32).reshape(3, 1, 1)
    W, R, B = (np.array(v, np.float32).reshape(s) for v, s in (([2], (1, 1, 1)), ([0.5], (1, 1, 1)),
                                                                  ([1, 0], (1, 2))))
    Y, Yh = run_node("RNN", 14, [X, W, R, B], n_outputs=2, activations=["Relu"])
    np.testing.assert_array_equal(Y.ravel(), [3, 0.5, 7.25])
    np.testing.assert_array_equal(Yh.ravel(), [7.25])
    # reverse with sequence length 2: steps t=1 then t=0; t=2 is padding
    Y, Yh = run_node("RNN", 14, [X, W, R, B, np.array([2], np.int32)], n_outputs=2, activations=["Relu"],
                     direction="reverse")
    np.testing.assert_array_equal(Y.ravel(), [3, 0, 0])
    np.testing.assert_array_equal(Yh.ravel(), [3])


def test_zero_length_sequence_keeps_the_initial_state():
    ins = make_inputs("LSTM", init=True, lens=[0, 4, 2], nd=2)
    Y, Yh, Yc = check("LSTM", 7, ins, direction="bidirectional")
    np.testing.assert_array_equal(Yh[:, 0], ins[5][:, 0])
    np.testing.assert_array_equal(Yc[:, 0], ins[6][:, 0])
    assert not Y[:, :, 0].any()


@pytest.mark.parametrize("op", list(GATES))
def test_old_versions(op):
    """Version 1 forms: output_sequence (and GRU-1's "foward" default direction)."""
    ins = make_inputs(op, init=True, lens=[4, 2, 3])
    check(op, 1, ins, output_sequence=1)
    check(op, 1, ins)
    check(op, 1, make_inputs(op, nd=2, seed=9), direction="bidirectional")
    if op == "GRU":
        check("GRU", 3, ins, linear_before_reset=1, output_sequence=1)


@pytest.mark.parametrize("op", list(GATES))
def test_optional_inputs_omitted_in_the_middle(op):
    ins = make_inputs(op, init=True, peep=True, bias=False)           # B and sequence_lens omitted
    check(op, 22, ins)
    if op == "LSTM":
        ins = make_inputs(op, init=True, peep=True)
        ins[5] = None                                                  # initial_h omitted, c and P given
        check(op, 22, ins)


@pytest.mark.parametrize("outputs", [["Y"], ["", "Y_h"], ["Y", ""], ["", "", "Y_c"], ["", "Y_h", ""]])
@pytest.mark.parametrize("op", list(GATES))
def test_optional_outputs_omitted(op, outputs):
    if op != "LSTM" and len(outputs) == 3:
        return
    ins = make_inputs(op, init=True, lens=[3, 4, 2])
    names = ["X", "W", "R", "B", "L", "h0"] + (["c0"] if op == "LSTM" else [])
    node = helper.make_node(op, names, outputs, name=NODE)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, elem_type(v.dtype), v.shape) for n, v in zip(names, ins)],
        [helper.make_empty_tensor_value_info(o) for o in outputs if o])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)], ir_version=10)
    got = onnx_mini.prepare(model).run(ins[:len(names)])
    exp = dict(zip(["Y", "Y_h", "Y_c"], reference(op, *ins)))
    for g, o in zip(got, [o for o in outputs if o]):
        np.testing.assert_allclose(g, exp[o], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", list(GATES))
def test_empty_sequence_and_batch(op):
    nout = 3 if op == "LSTM" else 2
    ins = make_inputs(op, T=0, init=True)
    Y, Yh, *rest = run_node(op, 14, ins, n_outputs=nout)
    assert Y.shape == (0, 1, 3, 3)
    np.testing.assert_array_equal(Yh, ins[5])
    ins = make_inputs(op, nb=0, init=True, lens=[], layout=1)
    Y, Yh, *rest = run_node(op, 14, ins, n_outputs=nout, layout=1)
    assert Y.shape == (0, 4, 1, 3) and Yh.shape == (0, 1, 3)


@pytest.mark.parametrize("op", list(GATES))
def test_hidden_size_attribute(op):
    check(op, 7, make_inputs(op, H=5, I=4, seed=8), hidden_size=5)


# -- errors --------------------------------------------------------------------------------------

@pytest.mark.parametrize("op", list(GATES))
@pytest.mark.parametrize("bad,pattern", [
    (lambda ins: [ins[0], ins[1][:, :-1], *ins[2:]], "W has shape"),
    (lambda ins: [ins[0], ins[1], ins[2][..., :-1], *ins[3:]], "expected"),
    (lambda ins: [*ins[:3], ins[3][:, 1:], *ins[4:]], "B has shape"),
    (lambda ins: [*ins[:4], np.array([5, 1, 1], np.int32), *ins[5:]], "sequence_lens"),
    (lambda ins: [*ins[:5], ins[5][:, :2], *ins[6:]], "initial_h has shape"),
    (lambda ins: [ins[0][0], *ins[1:]], "rank 3"),
])
def test_bad_inputs_name_the_node(op, bad, pattern):
    ins = bad(make_inputs(op, init=True, lens=[4, 4, 4]))
    with pytest.raises(KernelError, match=pattern) as e:
        run_node(op, 22, ins, n_outputs=2)
    assert NODE in str(e.value)


@pytest.mark.parametrize("op,version,attrs", [
    ("RNN", 22, {"direction": "sideways"}),
    ("GRU", 22, {"layout": 2}),
    ("LSTM", 22, {"activations": ["Sigmoid", "Tanh"]}),
    ("LSTM", 22, {"activations": ["Sigmoid", "Tanh", "Gelu"]}),
    ("RNN", 7, {"layout": 1}),                  # layout exists from version 14
    ("RNN", 7, {"output_sequence": 1}),         # output_sequence only in version 1
    ("GRU", 1, {"linear_before_reset": 1}),     # linear_before_reset from version 3
    ("GRU", 7, {"output_sequence": 1}),
    ("LSTM", 14, {"output_sequence": 1}),
    ("RNN", 14, {"clip": -1.0}),
])
def test_bad_attributes_name_the_node(op, version, attrs):
    with pytest.raises(InvalidNodeError) as e:
        run_node(op, version, make_inputs(op), n_outputs=2, **attrs)
    assert NODE in str(e.value)


def test_mixed_types_are_an_error():
    ins = make_inputs("GRU")
    ins[2] = ins[2].astype(np.float64)
    with pytest.raises(OnnxMiniError):
        run_node("GRU", 22, ins, n_outputs=2)


def test_large_batch_matches_reference():
    """Bigger sizes through the vectorised path, bidirectional with ragged lengths and layout 1."""
    lens = [7, 1, 5, 0, 7, 3]
    ins = make_inputs("LSTM", T=7, nb=6, I=5, H=8, nd=2, layout=1, lens=lens, init=True, peep=True, seed=13)
    check("LSTM", 22, ins, direction="bidirectional", layout=1, input_forget=1, clip=0.9)


# -- the tuned forms (ops/rnn/fast.py, column form, direction threads; weights packed once) --------

CELLS = [("RNN", {}), ("GRU", {}), ("GRU", {"linear_before_reset": 1}), ("LSTM", {})]


@pytest.mark.parametrize("column", [False, True])
@pytest.mark.parametrize("op,attrs", CELLS)
def test_row_and_column_forms(op, attrs, column, monkeypatch):
    """The step's state product as h @ R^T (row form) or R @ h^T (column form, chosen for a few rows of a
    wide state): every cell, both directions, ragged lengths, clip, layout 1 and B omitted, against the
    reference."""
    monkeypatch.setattr(fast, "column_form", lambda batch, hidden: column)
    ins = make_inputs(op, T=3, nb=5, I=4, H=16, nd=2, layout=1, lens=[3, 1, 2, 3, 0], init=True, seed=21)
    check(op, 22, ins, direction="bidirectional", layout=1, **attrs)
    ins[0] = ins[0] * 4
    check(op, 22, ins, direction="bidirectional", layout=1, clip=0.5, **attrs)
    ins[3] = None           # B omitted: the reordering copies add no bias
    check(op, 22, ins, direction="bidirectional", layout=1, **attrs)
    check(op, 14, make_inputs(op, T=5, nb=4, I=3, H=8, init=True, seed=22), direction="reverse", **attrs)


@pytest.mark.parametrize("lens", [None, [3, 1, 0, 3, 2]])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("direction", ["forward", "reverse"])
@pytest.mark.parametrize("op,attrs", CELLS)
def test_column_form_one_direction(op, attrs, direction, layout, bias, lens, monkeypatch):
    """One direction in the column form: the projection is one product W|b times [X | 1]^T read in place by
    the steps (no reordering copy, the bias inside the product); every layout, with and without B, full
    and ragged sequences, against the reference. W's packed transpose and the bias are views of that one
    packed array."""
    monkeypatch.setattr(fast, "column_form", lambda batch, hidden: True)
    ins = make_inputs(op, T=3, nb=5, I=4, H=6, layout=layout, bias=bias, lens=lens, init=True, seed=24)
    check(op, 22, ins, direction=direction, layout=layout, **attrs)
    empty = [ins[0][:0] if layout == 0 else ins[0][:, :0]] + ins[1:4] + [None if lens is None else 0 * ins[4]]
    check(op, 22, empty + ins[5:], direction=direction, layout=layout, **attrs)      # seq_length 0
    G = GATES[op]
    w = driver.pack(ins[1], ins[2], ins[3], None, D=1, G=G, hidden_size=None, order=tuple(range(G)),
                    scale=(1,) * G, products=((0, G),), apart=None)
    assert w.WTb.shape == (4 + bias, G * 6) and np.shares_memory(w.WT, w.WTb)
    np.testing.assert_array_equal(w.WT, ins[1][0].T)
    if bias:
        assert np.shares_memory(w.bias, w.WTb)
        np.testing.assert_array_equal(w.bias[0], ins[3][0, :G * 6] + ins[3][0, G * 6:])


@pytest.mark.parametrize("op,attrs", CELLS)
def test_directions_on_their_own_threads(op, attrs, monkeypatch):
    """Bidirectional steps run per direction (on two threads for large products): same values."""
    ins = make_inputs(op, T=4, nb=3, I=3, H=6, nd=2, layout=1, lens=[4, 0, 2], init=True, seed=23)
    together = check(op, 22, ins, direction="bidirectional", layout=1, **attrs)
    monkeypatch.setattr(fast, "split_directions", lambda *a: True)
    apart = check(op, 22, ins, direction="bidirectional", layout=1, **attrs)
    for x, y in zip(together, apart):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("op,attrs", CELLS)
def test_batch_halves_on_two_threads(op, attrs, layout, monkeypatch):
    """One direction's full sequences as two runs on the batch's halves, each on its own thread (fast.split_batch,
    forced here for a small batch): an odd batch, initial states, layout 1, every output and Y alone; the
    reference's values and the same values as one run on the whole batch. Not where the run may use one
    thread, nor with sequence_lens."""
    n_outputs = 3 if op == "LSTM" else 2
    ins = make_inputs(op, T=5, nb=7, I=3, H=6, layout=layout, init=True, seed=29)
    whole = check(op, 22, ins, n_outputs, layout=layout, **attrs)
    halves = []
    split = fast.split_batch
    monkeypatch.setattr(fast, "SPLIT_BATCH_MIN", 2)
    monkeypatch.setattr(fast, "SPLIT_BATCH_MIN_HIDDEN", 1)
    monkeypatch.setattr(fast, "split_batch", lambda *a: halves.append(split(*a)) or halves[-1])
    apart = check(op, 22, ins, n_outputs, layout=layout, **attrs)
    assert halves[0] is True and halves[1:] == [False, False]      # the halves (3 and 4 sequences) split no further
    for x, y in zip(whole, apart):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6)
    y_alone = run_node(op, 22, ins, n_outputs=1, layout=layout, **attrs)
    np.testing.assert_allclose(y_alone, whole[0], rtol=1e-6, atol=1e-6)
    del halves[:]
    ins[4] = np.array([5, 2, 5, 5, 1, 5, 5], np.int32)                 # sequence_lens: one run
    check(op, 22, ins, n_outputs, layout=layout, **attrs)
    assert halves == []
    monkeypatch.setattr(fast.parallel, "threads", lambda: 1)           # one thread: one run
    assert not split(8, 8)


def weights_model(op, ins, constant, shapes=None, **attrs):
    """A one-node model whose inputs listed in `constant` (indices) are initializers, the others fed
    (declared with their shapes, or shapes[name]); -> (prepared model, feeds)."""
    names = ["X", "W", "R", "B", "L", "h0", "c0", "P"][:len(ins)]
    names = ["" if v is None else n for n, v in zip(names, ins)]
    outs = ["Y", "Y_h", "Y_c"] if op == "LSTM" else ["Y", "Y_h"]
    node = helper.make_node(op, names, outs, name=NODE, **attrs)
    inits = [onnx.numpy_helper.from_array(v, n) for k, (n, v) in enumerate(zip(names, ins)) if n and k in constant]
    fed = [(n, v) for k, (n, v) in enumerate(zip(names, ins)) if n and k not in constant]
    declared = [helper.make_tensor_value_info(n, elem_type(v.dtype), (shapes or {}).get(n, v.shape)) for n, v in fed]
    graph = helper.make_graph([node], "g", declared, [helper.make_empty_tensor_value_info(o) for o in outs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)], ir_version=10)
    return onnx_mini.prepare(model), dict(fed)


@pytest.mark.parametrize("op,attrs", CELLS + [("LSTM", {"input_forget": 1})])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_constant_and_fed_weights_agree(op, attrs, direction, monkeypatch):
    """Constant W, R, B (and P) are packed once, when the model is prepared; fed ones on every run. Both
    give the same values, bit for bit, and the reference's."""
    nd = 2 if direction == "bidirectional" else 1
    packed = []
    original = driver.pack
    monkeypatch.setattr(driver, "pack", lambda *a, **k: packed.append(1) or original(*a, **k))
    for peep in (False, True) if op == "LSTM" else (False,):
        ins = make_inputs(op, T=4, nb=2, I=3, H=5, nd=nd, lens=[4, 2], init=True, peep=peep, seed=31)
        exp = reference(op, *ins, direction=direction, **attrs)
        results = {}
        for constant in ((), (1, 2, 3, 7)):
            prepared, feeds = weights_model(op, ins, constant, direction=direction, **attrs)
            del packed[:]
            runs = [prepared.run(feeds) for _ in range(3)]
            assert len(packed) == (0 if constant else 3)          # constant weights: never packed again
            for got in runs[1:]:
                for g, r in zip(got, runs[0]):
                    np.testing.assert_array_equal(g, r)
            results[constant] = runs[0]
        for fed, const, e in zip(results[()], results[(1, 2, 3, 7)], exp):
            np.testing.assert_array_equal(fed, const)
            np.testing.assert_allclose(fed, e, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op,attrs", CELLS)
def test_streaming_one_step_at_a_time(op, attrs):
    """A streaming model (a VAD's LSTM) runs T=1 per call with its state carried from call to call: the
    same values as one run over the whole sequence."""
    ins = make_inputs(op, T=12, nb=1, I=6, H=4, init=True, seed=41)
    whole = reference(op, *ins, **attrs)
    names = ["X", "h0"] + (["c0"] if op == "LSTM" else [])
    state = [ins[5]] + ([ins[6]] if op == "LSTM" else [])
    prepared, feeds = weights_model(op, [ins[0][:1], *ins[1:4], None, *state], (1, 2, 3), **attrs)
    assert sorted(feeds) == sorted(names)                                    # X and the states fed
    ys = []
    for t in range(12):
        out = prepared.run({"X": ins[0][t:t + 1], **dict(zip(names[1:], state))})
        ys.append(out[0])
        state = list(out[1:])
    np.testing.assert_allclose(np.concatenate(ys), whole[0], rtol=1e-5, atol=1e-5)
    for s_, e in zip(state, whole[1:]):
        np.testing.assert_allclose(s_, e, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("T", [1, 3])
@pytest.mark.parametrize("nb", [1, 2])
@pytest.mark.parametrize("tname", ["float", "float16", "double"])
@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("direction", ["forward", "reverse"])
@pytest.mark.parametrize("op,attrs", CELLS)
def test_one_direction_full_sequences(op, attrs, direction, layout, tname, nb, T):
    """One direction, every sequence full, the row form (the steps write Y in place, the states are read
    where the caller has them; T=1, a decoder's step, without the loop): the reference's values in every
    layout and type; the last states are arrays of their own (no view of Y nor of the given states) and a
    later run of the same prepared model (the steps an earlier run made, reused) leaves the earlier run's
    outputs alone."""
    dt = np_type(tname)
    ins = make_inputs(op, T=T, nb=nb, I=3, H=4, layout=layout, init=True, seed=71, dtype=np.float64)
    ins = [None if v is None else v.astype(dt) for v in ins]
    attrs = dict(attrs, direction=direction, layout=layout)
    got = check(op, 22, ins, **attrs)
    for state, given in zip(got[1:], ins[5:7]):
        assert not np.shares_memory(state, got[0]) and not np.shares_memory(state, given)
    prepared, _ = weights_model(op, ins[:4] + [None] + ins[5:7], (1, 2, 3), **attrs)
    feeds = {"X": ins[0], "h0": ins[5], **({"c0": ins[6]} if op == "LSTM" else {})}
    first = prepared.run(feeds)
    kept = [v.copy() for v in first]
    second = prepared.run({**feeds, "X": -ins[0]})
    for v, k in zip(first, kept):
        np.testing.assert_array_equal(v, k)
    exp = reference(op, -ins[0], *ins[1:4], None, *ins[5:7], **attrs)
    for g, e in zip(second, exp):
        np.testing.assert_allclose(g.astype(np.float64), e, rtol=tolerance(dt), atol=tolerance(dt))


@pytest.mark.parametrize("init", [False, True])
@pytest.mark.parametrize("nb", [1, 50])
@pytest.mark.parametrize("op,attrs", CELLS)
def test_single_steps_with_and_without_states(op, attrs, nb, init):
    """T=1 (a decoder's step): one batch element and a batch past the column form's (B=50, H=64: the row
    form), the initial states given or zeros, Y alone or with the last states: the reference's values."""
    ins = make_inputs(op, T=1, nb=nb, I=5, H=64, init=init, seed=nb + init)
    got = check(op, 22, ins, **attrs)
    only_y = run_node(op, 22, ins, n_outputs=1, **attrs)
    np.testing.assert_array_equal(only_y, got[0])


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
@pytest.mark.parametrize("op,attrs", CELLS)
def test_runs_of_changing_shapes(op, attrs, direction):
    """One prepared model (constant weights: a run reuses the steps an earlier run of its shape made)
    run on batches and lengths that change from run to run, each against the reference."""
    nd = 2 if direction == "bidirectional" else 1
    base = make_inputs(op, T=1, nb=1, I=3, H=70, nd=nd, seed=81)          # H=70: the column form for 1 < B
    prepared, _ = weights_model(op, base[:4], (1, 2, 3), {"X": ["T", "B", 3]}, direction=direction, **attrs)
    for k, (T, nb) in enumerate([(1, 1), (3, 2), (1, 1), (2, 5), (3, 2), (1, 1)]):
        ins = make_inputs(op, T=T, nb=nb, I=3, H=70, nd=nd, seed=90 + k)
        ins[1:4] = base[1:4]
        got = prepared.run({"X": ins[0]})
        for g, e in zip(got, reference(op, *ins[:4], direction=direction, **attrs)):
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("op,attrs", CELLS)
def test_every_sequence_empty(op, attrs, layout):
    """sequence_lens all zero: Y is zeros, the last states are the initial ones (copies)."""
    ins = make_inputs(op, T=3, nb=2, nd=2, layout=layout, lens=[0, 0], init=True, seed=51)
    got = check(op, 22, ins, direction="bidirectional", layout=layout, **attrs)
    assert not got[0].any()
    for g, given in zip(got[1:], ins[5:7]):
        np.testing.assert_array_equal(g, given)
        assert not np.shares_memory(g, given)


@pytest.mark.parametrize("tname", ["float16", "bfloat16", "double"])
@pytest.mark.parametrize("column", [False, True])
@pytest.mark.parametrize("op,attrs", CELLS)
def test_fast_form_types(op, attrs, column, tname, monkeypatch):
    """The default activations' form in every type (float16/bfloat16 computed in float32)."""
    monkeypatch.setattr(fast, "column_form", lambda batch, hidden: column)
    dt = np_type(tname)
    ins = make_inputs(op, nd=2, init=True, lens=[4, 1, 3], dtype=np.float64)
    ins = [None if v is None else v if v.dtype.kind == "i" else v.astype(dt) for v in ins]
    check(op, 22, ins, direction="bidirectional", **attrs)


@pytest.mark.parametrize("lead", [(), (2,)])
@pytest.mark.parametrize("column", [False, True])
def test_form_rows_and_vectors(column, lead):
    """Form.rows picks a step's gate rows as the Ellipsis index it replaces; Form.vector repeats a [D, H]
    vector to the state's shape as its own contiguous array (GRU's Rb of the h gate)."""
    H, Bn = 3, 4
    form = fast.Form(H, np.dtype(np.float32), column, lead)
    xt = np.arange(np.prod(lead + (5 * H, Bn))).reshape(lead + ((5 * H, Bn) if column else (Bn, 5 * H)))
    expected = xt[..., 2 * H:4 * H, :] if column else xt[..., 2 * H:4 * H]
    np.testing.assert_array_equal(xt[form.rows(2 * H, 4 * H)], expected)
    v = np.array([[1, 2, 3], [4, 5, 6]], np.float32)[:(lead or (1,))[0]]
    got = form.vector(v, Bn)
    per_d = [np.array([[1, 2, 3]] * Bn), np.array([[4, 5, 6]] * Bn)]
    want = np.stack(per_d[:len(v)]) if lead else per_d[0]
    np.testing.assert_array_equal(got, want.transpose(0, 2, 1) if column and lead else want.T if column else want)
    assert got.flags.c_contiguous and not np.shares_memory(got, v)


def test_fast_and_spec_forms_agree():
    """LSTM with all-zero peepholes takes the spec's form; without them, the tuned one: same values."""
    ins = make_inputs("LSTM", T=6, nb=3, I=4, H=7, nd=2, init=True, lens=[6, 3, 5], seed=61)
    tuned = run_node("LSTM", 22, ins[:7], n_outputs=3, direction="bidirectional",
                     activations=["sigmoid", "TANH", "tanh"])
    ins[7] = np.zeros((2, 21), np.float32)
    spec = run_node("LSTM", 22, ins, n_outputs=3, direction="bidirectional")
    for f, s_ in zip(tuned, spec):
        np.testing.assert_allclose(f, s_, rtol=1e-6, atol=1e-6)


def test_concurrent_runs_share_nothing(monkeypatch):
    """Runs of one prepared model from several threads (each with its own buffers, the directions on
    the pool's threads): every run gives the single run's values."""
    import threading

    monkeypatch.setattr(fast, "split_directions", lambda *a: True)
    ins = make_inputs("LSTM", T=6, nb=3, I=4, H=8, nd=2, lens=[6, 2, 4], init=True, seed=71)
    prepared, feeds = weights_model("LSTM", ins, (1, 2, 3), direction="bidirectional")
    expected = prepared.run(feeds)
    results, errors = [], []

    def worker():
        try:
            for _ in range(20):
                results.append(prepared.run(feeds))
        except Exception as e:          # reported below, with the thread's traceback lost otherwise
            errors.append(e)
    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 80
    for got in results:
        for g, e in zip(got, expected):
            np.testing.assert_array_equal(g, e)


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("op,attrs", CELLS)
def test_column_form_against_onnxruntime(op, attrs, direction):
    """A batch of a few rows of a wide state (the column form chosen on its own), constant weights as a
    model holds them: onnxruntime's values."""
    ort = pytest.importorskip("onnxruntime")
    nd = 2 if direction == "bidirectional" else 1
    ins = make_inputs(op, T=5, nb=6, I=12, H=64, nd=nd, init=True, seed=101)
    assert fast.column_form(6, 64)
    ins[0] = ins[0] * 2
    if op == "LSTM":
        ins = ins[:7]
    names = ["" if v is None else n for n, v in zip(["X", "W", "R", "B", "L", "h0", "c0"], ins)]
    feeds = {n: v for k, (n, v) in enumerate(zip(names, ins)) if n and k not in (1, 2, 3)}
    outs = ["Y", "Y_h", "Y_c"] if op == "LSTM" else ["Y", "Y_h"]
    node = helper.make_node(op, names, outs, direction=direction, hidden_size=64, **attrs)
    inits = [onnx.numpy_helper.from_array(v, n) for k, (n, v) in enumerate(zip(names, ins)) if n and k in (1, 2, 3)]
    declared = [helper.make_tensor_value_info(n, elem_type(v.dtype), v.shape) for n, v in feeds.items()]
    results = [helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, None) for o in outs]
    model = helper.make_model(helper.make_graph([node], "g", declared, results, inits),
                              opset_imports=[helper.make_opsetid("", 22)], ir_version=10)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, e in zip(onnx_mini.prepare(model).run(feeds), expected):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)
