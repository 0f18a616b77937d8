"""Control flow (onnx/defs/controlflow): If, Loop, Scan.

Each body graph arrives as a SubPlan, planned once at prepare time with the outer-scope names it reads
as extra inputs (plan.SubPlan). The step's arguments are the node's own inputs (`_n_inputs` of them,
omitted ones as None) followed by the captured outer values, handed unchanged to `SubPlan.run`.

Values that are not tensors pass through untouched: a branch or a loop-carried value may be a
sequence (a list) or an optional (None or its element). Loop/Scan scan outputs are tensors stacked
along a new axis; with zero iterations their element type and trailing dims come from the body's
declared output type (unknown or symbolic dims count as 0; an undeclared type gives float32[0]).
"""
from __future__ import annotations

import numpy as np

from .. import dtypes
from ..errors import InvalidValueError, ResourceLimitError
from ..graph import TypeInfo
from ..registry import kernel
from ._common import normalize_axis, zero_of

ALL_VERSIONS = (1, 11, 13, 16, 19, 21, 23, 24, 25)


# -- shared helpers --------------------------------------------------------------------------------

def _flag(value, what: str) -> bool:
    """A bool tensor holding exactly one element, as a Python bool."""
    if not isinstance(value, np.ndarray) or value.dtype != np.bool_:
        raise InvalidValueError(f"{what} must be a bool tensor, got "
                                f"{value.dtype if isinstance(value, np.ndarray) else type(value).__name__}")
    if value.size != 1:
        raise InvalidValueError(f"{what} must hold exactly one element, got shape {list(value.shape)}")
    return bool(value.reshape(()))


def _count(value, what: str) -> int:
    """An integer tensor holding exactly one element, as a Python int."""
    if not isinstance(value, np.ndarray) or value.dtype.kind not in "iu":
        raise InvalidValueError(f"{what} must be an int64 tensor, got "
                                f"{value.dtype if isinstance(value, np.ndarray) else type(value).__name__}")
    if value.size != 1:
        raise InvalidValueError(f"{what} must hold exactly one element, got shape {list(value.shape)}")
    return int(value.reshape(()))


def _check_arity(body, n_inputs: int, n_outputs: int, what: str) -> None:
    """Factory-time check of a body's signature (ValueError -> InvalidNodeError naming the node)."""
    if len(body.input_names) != n_inputs:
        raise ValueError(f"{what} takes {len(body.input_names)} input(s), {n_inputs} expected")
    if len(body.output_names) != n_outputs:
        raise ValueError(f"{what} has {len(body.output_names)} output(s), {n_outputs} expected")


def _declared_empty(t: TypeInfo | None, lead: tuple[int, ...]) -> np.ndarray:
    """An empty scan output when the body never ran: `lead` dims, then the declared dims of the body
    output (unknown/symbolic dims as 0), of its declared element type. Undeclared type: float32 of
    shape `lead`; undeclared shape: the declared type with shape `lead`."""
    if t is None or t.kind != "tensor" or not t.elem_type:
        return np.zeros(lead, np.float32)
    dt = dtypes.np_dtype(t.elem_type)
    dims = () if t.shape is None else tuple(d if isinstance(d, int) else 0 for d in t.shape)
    return np.zeros((*lead, *dims), dt) if dt != object else np.full((*lead, *dims), "", object)


def _check_element(k: int, value, first: np.ndarray | None) -> None:
    """A scan output's value for one iteration: a tensor, of the same type and shape as the first one."""
    if not isinstance(value, np.ndarray):
        raise InvalidValueError(f"scan output {k} must be a tensor, got {type(value).__name__}")
    if first is not None and (value.shape != first.shape or value.dtype != first.dtype):
        raise InvalidValueError(f"scan output {k} changes from {first.dtype}{list(first.shape)} to "
                                f"{value.dtype}{list(value.shape)} across iterations")


def _stacked(values: list, k: int) -> np.ndarray:
    """The k-th scan output of a Loop: one tensor per iteration, stacked along a new axis 0."""
    for v in values:
        _check_element(k, v, values[0])
    return np.stack(values)


class _Accumulator:
    """A Scan output written in place, iteration by iteration, into a buffer allocated at the first."""
    __slots__ = ("buf", "first", "k")

    def __init__(self, k: int):
        self.buf = self.first = None
        self.k = k

    def put(self, index, value, lead: tuple[int, ...], pad: bool) -> None:
        _check_element(self.k, value, self.first)
        if self.buf is None:
            self.first = value
            shape = (*lead, *value.shape)
            self.buf = np.full(shape, zero_of(value.dtype), value.dtype) if pad else np.empty(shape, value.dtype)
        self.buf[index] = value


# -- If ----------------------------------------------------------------------------------------------

@kernel("If", since=ALL_VERSIONS)
def if_1(*, then_branch, else_branch, _n_outputs):
    # 1 and 11+ run alike (11 lets the branches' output shapes differ; 13 adds sequences, 16 optionals)
    _check_arity(then_branch, 0, _n_outputs, "then_branch")
    _check_arity(else_branch, 0, _n_outputs, "else_branch")

    def run(cond, *captured):
        branch = then_branch if _flag(cond, "cond") else else_branch
        return tuple(branch.run((), captured))
    return run


# -- Loop --------------------------------------------------------------------------------------------

@kernel("Loop", since=ALL_VERSIONS)
def loop_1(*, body, _n_inputs, _n_outputs):
    # Loop-1 and 11+ have the same semantics (11 only rewrote the doc's example with separate _in/_out
    # names); 13 adds sequences as carried values, 16 optionals.
    n_carried = max(_n_inputs - 2, 0)
    n_scan = _n_outputs - n_carried
    if n_scan < 0:
        raise ValueError(f"the node has {n_carried} loop-carried input(s) but only {_n_outputs} output(s)")
    _check_arity(body, 2 + n_carried, 1 + n_carried + n_scan, "the body")
    scan_types = body.output_types[1 + n_carried:]

    def run(*args):
        own, captured = args[:_n_inputs], args[_n_inputs:]
        trip = own[0] if _n_inputs > 0 else None
        cond = own[1] if _n_inputs > 1 else None
        limit = None if trip is None else _count(trip, "M (max trip count)")
        keep_going = True if cond is None else _flag(cond, "cond")
        carried = list(own[2:])
        scans: list[list] = [[] for _ in range(n_scan)]
        i = 0
        cap = dtypes.max_loop_iterations()
        max_bytes = dtypes.get_limits()["max_tensor_bytes"]
        collected = [0] * n_scan
        while keep_going and (limit is None or i < limit):
            if i == cap:
                raise ResourceLimitError(
                    f"the loop is still running after {cap:,} iterations (M = "
                    f"{'none' if limit is None else format(limit, ',')}, the condition still true): over the "
                    "limit onnx_mini.dtypes.set_limits(max_loop_iterations=...) sets")
            out = body.run([np.array(i, np.int64), np.array(keep_going), *carried], captured)
            keep_going = _flag(out[0], "the condition the body returns")
            carried = out[1:1 + n_carried]
            if n_scan:
                for k in range(n_scan):
                    v = out[1 + n_carried + k]
                    scans[k].append(v)
                    collected[k] += getattr(v, "nbytes", 0)
                if max(collected) > max_bytes:     # the stacked output would pass max_tensor_bytes
                    k = collected.index(max(collected))
                    raise ResourceLimitError(
                        f"scan output #{k} of the loop holds {collected[k]:,} bytes after {i + 1:,} iterations, "
                        f"over the limit of {max_bytes:,} bytes "
                        "(onnx_mini.dtypes.set_limits(max_tensor_bytes=...) raises it)")
            i += 1
        if i == 0:
            stacked = [_declared_empty(t, (0,)) for t in scan_types]
        else:
            stacked = [_stacked(s, k) for k, s in enumerate(scans)]
        return (*carried, *stacked)
    return run


# -- Scan --------------------------------------------------------------------------------------------

def _flags(values, n: int, name: str) -> list[int]:
    values = [0] * n if values is None else list(values)
    if len(values) != n:
        raise ValueError(f"{name} has {len(values)} value(s), {n} expected")
    if any(v not in (0, 1) for v in values):
        raise ValueError(f"{name} values must be 0 (forward) or 1 (reverse), got {values}")
    return values


def _axes(values, n: int, name: str, negative_ok: bool) -> list[int]:
    values = [0] * n if values is None else list(values)
    if len(values) != n:
        raise ValueError(f"{name} has {len(values)} value(s), {n} expected")
    if not negative_ok and any(v < 0 for v in values):
        raise ValueError(f"{name} must be non-negative before opset 11, got {values}")
    return values


@kernel("Scan", since=8)
def scan_8(*, body, num_scan_inputs, directions=None, _n_inputs, _n_outputs):
    m = num_scan_inputs
    n = _n_inputs - 1 - m           # inputs: sequence_lens, the N initial states, the M scan inputs
    if m < 1 or n < 0:
        raise ValueError(f"num_scan_inputs={m} does not fit a node with {_n_inputs} input(s)")
    k_out = _n_outputs - n
    if k_out < 0:
        raise ValueError(f"the node has {n} state variable(s) but only {_n_outputs} output(s)")
    _check_arity(body, n + m, n + k_out, "the body")
    dirs = _flags(directions, m, "directions")
    scan_types = body.output_types[n:]

    def run(*args):
        seq_lens, states, xs = args[0], args[1:1 + n], args[1 + n:_n_inputs]
        captured = args[_n_inputs:]
        for j, x in enumerate(xs):
            if not isinstance(x, np.ndarray) or x.ndim < 2:
                raise InvalidValueError(f"scan input {j} must be a tensor of rank >= 2 (batch, sequence, ...)")
        batch, max_len = xs[0].shape[:2]
        for j, x in enumerate(xs):
            if x.shape[:2] != (batch, max_len):
                raise InvalidValueError(f"scan input {j} has batch/sequence dims {list(x.shape[:2])}, "
                                        f"scan input 0 has {[batch, max_len]}")
        for i, s in enumerate(states):
            if not isinstance(s, np.ndarray) or s.ndim < 1 or s.shape[0] != batch:
                raise InvalidValueError(f"initial state {i} must be a tensor with batch dim {batch}")
        if seq_lens is None:
            lens = [max_len] * batch
        else:
            if not isinstance(seq_lens, np.ndarray) or seq_lens.dtype.kind not in "iu" or \
                    seq_lens.shape != (batch,):
                raise InvalidValueError(f"sequence_lens must be an int64 tensor of shape [{batch}], got "
                                        f"{seq_lens.dtype}{list(seq_lens.shape)}")
            lens = seq_lens.tolist()
            bad = [v for v in lens if not 0 <= v <= max_len]
            if bad:
                raise InvalidValueError(f"sequence_lens values must be in [0, {max_len}], got {lens}")
        finals: list[list] = [[] for _ in range(n)]
        accs = [_Accumulator(k) for k in range(k_out)]
        lead = (batch, max_len)
        for b in range(batch):
            st = [s[b] for s in states]
            length = lens[b]
            for t in range(length):
                elems = [x[b, length - 1 - t if d else t] for x, d in zip(xs, dirs)]
                out = body.run([*st, *elems], captured)
                st = out[:n]
                for k, acc in enumerate(accs):
                    acc.put((b, t), out[n + k], lead, pad=True)
            for i, v in enumerate(st):
                finals[i].append(v)
        state_out = [np.stack(f) if batch else s for f, s in zip(finals, states)]
        scan_out = [acc.buf if acc.buf is not None else _declared_empty(t, lead)
                    for acc, t in zip(accs, scan_types)]
        return (*state_out, *scan_out)
    return run


def _scan_9_factory(body, m, in_axes, in_dirs, out_axes, out_dirs, n_inputs, n_outputs, negative_ok):
    n = n_inputs - m               # inputs: the N initial states, the M scan inputs
    if m < 1 or n < 0:
        raise ValueError(f"num_scan_inputs={m} does not fit a node with {n_inputs} input(s)")
    k_out = n_outputs - n
    if k_out < 0:
        raise ValueError(f"the node has {n} state variable(s) but only {n_outputs} output(s)")
    _check_arity(body, n + m, n + k_out, "the body")
    in_axes = _axes(in_axes, m, "scan_input_axes", negative_ok)
    out_axes = _axes(out_axes, k_out, "scan_output_axes", negative_ok)
    in_dirs = _flags(in_dirs, m, "scan_input_directions")
    out_dirs = _flags(out_dirs, k_out, "scan_output_directions")
    scan_types = body.output_types[n:]

    def run(*args):
        states, xs, captured = args[:n], args[n:n_inputs], args[n_inputs:]
        seqs = []
        length = None
        for j, (x, ax, d) in enumerate(zip(xs, in_axes, in_dirs)):
            if not isinstance(x, np.ndarray) or x.ndim < 1:
                raise InvalidValueError(f"scan input {j} must be a tensor of rank >= 1")
            a = normalize_axis(ax, x.ndim, f"scan_input_axes[{j}]")
            v = np.moveaxis(x, a, 0) if a else x
            if d:
                v = v[::-1]
            if length is None:
                length = v.shape[0]
            elif v.shape[0] != length:
                raise InvalidValueError(f"scan input {j} has {v.shape[0]} element(s) along its scan axis, "
                                        f"scan input 0 has {length}")
            seqs.append(v)
        accs = [_Accumulator(k) for k in range(k_out)]
        lead = (length,)
        st = list(states)
        for t in range(length):
            out = body.run([*st, *(v[t] for v in seqs)], captured)
            st = out[:n]
            for k, acc in enumerate(accs):
                acc.put(length - 1 - t if out_dirs[k] else t, out[n + k], lead, pad=False)
        results = []
        for k, (acc, t) in enumerate(zip(accs, scan_types)):
            o = acc.buf if acc.buf is not None else _declared_empty(t, lead)
            if acc.buf is None and not -o.ndim <= out_axes[k] < o.ndim:
                a = 0  # nothing ran and the body's output rank is undeclared: keep the scan axis first
            else:
                a = normalize_axis(out_axes[k], o.ndim, f"scan_output_axes[{k}]")
            results.append(np.moveaxis(o, 0, a) if a else o)
        return (*st, *results)
    return run


@kernel("Scan", since=9)
def scan_9(*, body, num_scan_inputs, scan_input_axes=None, scan_input_directions=None, scan_output_axes=None,
           scan_output_directions=None, _n_inputs, _n_outputs):
    return _scan_9_factory(body, num_scan_inputs, scan_input_axes, scan_input_directions, scan_output_axes,
                           scan_output_directions, _n_inputs, _n_outputs, negative_ok=False)


@kernel("Scan", since=(11, 16, 19, 21, 23, 24, 25))
def scan_11(*, body, num_scan_inputs, scan_input_axes=None, scan_input_directions=None, scan_output_axes=None,
            scan_output_directions=None, _n_inputs, _n_outputs):
    # 11 accepts negative axes; 16+ only widen the type constraint
    return _scan_9_factory(body, num_scan_inputs, scan_input_axes, scan_input_directions, scan_output_axes,
                           scan_output_directions, _n_inputs, _n_outputs, negative_ok=True)
