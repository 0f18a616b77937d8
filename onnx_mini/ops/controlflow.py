"""Control flow (onnx/defs/controlflow): If, Loop, Scan.

Each body graph arrives as a SubPlan, planned once at prepare time with the outer-scope names it reads
as extra inputs (plan.SubPlan). The step's arguments are the node's own inputs (`_n_inputs` of them,
omitted ones as None) followed by the captured outer values: If hands them to `SubPlan.run`, Loop and
Scan to `SubPlan.runner` once per call, whose function then runs one iteration with no planning,
binding or lookup (the captured values and the hook are placed once); a Scan whose body is one step
that every body output names (a fused RNN cell) calls that step itself (`SubPlan.single_step`).

Values that are not tensors pass through untouched: a branch or a loop-carried value may be a
sequence (a list) or an optional (None or its element). Loop/Scan scan outputs are tensors stacked
along a new axis; with zero iterations their element type and trailing dims come from the body's
declared output type (unknown or symbolic dims count as 0; an undeclared type gives float32[0]).

Per iteration: a scan output's rows go into a buffer allocated at the first one when the number of
rows is known (Scan; a Loop with a trip count), else into a list stacked at the end (_Rows); a carried
value is held by the body's slots alone while the body runs, so that an elementwise step whose input
it is writes the next value into its buffer (inplace.py) instead of allocating one per iteration.
"""
from __future__ import annotations

import math

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
    if value.__class__ is np.ndarray and value.dtype.kind == "b" and value.size == 1:
        return value.item()       # (a Loop's condition, an If's: once per iteration)
    if not isinstance(value, np.ndarray) or value.dtype.kind != "b":
        raise InvalidValueError(f"{what} must be a bool tensor, got "
                                f"{value.dtype if isinstance(value, np.ndarray) else type(value).__name__}")
    if value.size != 1:
        raise InvalidValueError(f"{what} must hold exactly one element, got shape {list(value.shape)}")
    return value.item()


def _count(value, what: str) -> int:
    """An integer tensor holding exactly one element, as a Python int."""
    if not isinstance(value, np.ndarray) or value.dtype.kind not in "iu":
        raise InvalidValueError(f"{what} must be an int64 tensor, got "
                                f"{value.dtype if isinstance(value, np.ndarray) else type(value).__name__}")
    if value.size != 1:
        raise InvalidValueError(f"{what} must hold exactly one element, got shape {list(value.shape)}")
    return int(value.item())


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


def _changed(k: int, value, first_shape, first_dtype) -> InvalidValueError:
    """The error for a scan output whose value for one iteration is not a tensor of the first one's
    type and shape."""
    if not isinstance(value, np.ndarray):
        return InvalidValueError(f"scan output {k} must be a tensor, got {type(value).__name__}")
    return InvalidValueError(f"scan output {k} changes from {first_dtype}{list(first_shape)} to "
                             f"{value.dtype}{list(value.shape)} across iterations")


def _elements(v: np.ndarray):
    """A scan input's elements along axis 0, one view at a time (for a 1-D input 0-d arrays, where
    iterating or v[t] would give numpy scalars)."""
    return iter(v) if v.ndim > 1 else (v[t, ...] for t in range(len(v)))


def _or_declared(stacked: np.ndarray | None, declared: TypeInfo | None, lead: tuple[int, ...]) -> np.ndarray:
    """A scan output: the rows stacked, or the declared empty one when the body never ran."""
    return stacked if stacked is not None else _declared_empty(declared, lead)


class _Rows:
    """One scan output, a row per iteration, every row a tensor of the first row's type and shape.

    With `lead` (the grid of rows: (trip count,) or (batch, length)) known, the rows are written into
    a buffer of shape [*lead, *row] allocated at the first row (`pad`: zero-filled, for rows never
    written); without it (trip count unknown, or the buffer over max_bytes) they are kept in a list
    and stacked at the end, their bytes counted against `max_bytes` (None: not counted)."""
    __slots__ = ("k", "lead", "pad", "max_bytes", "buf", "shape", "dtype", "fast", "rows", "nbytes")

    def __init__(self, k: int, lead: tuple[int, ...] | None, pad: bool = False, max_bytes: int | None = None):
        self.k, self.lead, self.pad, self.max_bytes = k, lead, pad, max_bytes
        self.buf = self.shape = self.dtype = self.fast = None
        self.rows: list = []
        self.nbytes = 0

    def put(self, index, value) -> None:
        # per iteration: a row of the first one's kind goes straight into the buffer
        if value.__class__ is np.ndarray and value.dtype is self.fast and value.shape == self.shape:
            self.buf[index] = value
        else:
            self._put(index, value)

    def _put(self, index, value) -> None:
        if self.shape is None:        # the first row
            if not isinstance(value, np.ndarray):
                raise _changed(self.k, value, None, None)
            self.shape, self.dtype = value.shape, value.dtype
            if self.lead is not None:
                self.buf = self._buffer(value)
            # buf[i] = a 0-d object array would store the array itself, not its element
            if self.buf is not None and (value.ndim or value.dtype != object):
                self.fast = value.dtype
        elif not isinstance(value, np.ndarray) or value.shape != self.shape or value.dtype != self.dtype:
            raise _changed(self.k, value, self.shape, self.dtype)
        if self.buf is not None:
            self.buf[index] = value if value.ndim else value[()]
            return
        self.rows.append(value)
        self.nbytes += value.nbytes
        if self.max_bytes is not None and self.nbytes > self.max_bytes:
            raise ResourceLimitError(
                f"scan output #{self.k} of the loop holds {self.nbytes:,} bytes after {len(self.rows):,} "
                f"iterations, over the limit of {self.max_bytes:,} bytes "
                "(onnx_mini.dtypes.set_limits(max_tensor_bytes=...) raises it)")

    def _buffer(self, first: np.ndarray) -> np.ndarray | None:
        """[*lead, *row] of the first row's type; None (the list) when the whole buffer would pass
        max_bytes (a loop its condition stops need not fill it) or the memory cannot be had."""
        shape = (*self.lead, *first.shape)
        if self.max_bytes is not None and math.prod(shape) * first.itemsize > self.max_bytes:
            return None
        try:
            if self.pad:
                return np.full(shape, zero_of(first.dtype), first.dtype)
            return np.empty(shape, first.dtype)
        except MemoryError:       # a trip count far beyond what the loop runs, on a host that does not overcommit
            return None

    def result(self, done: int) -> np.ndarray | None:
        """The stacked rows after `done` iterations, None if there were none. A Loop its condition
        stopped before its trip count filled part of the buffer: those rows are copied out rather than
        returned as a view pinning all of it."""
        if self.buf is not None:
            return self.buf if self.pad or done == len(self.buf) else self.buf[:done].copy()
        return np.stack(self.rows) if self.rows else None


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
    first_scan = 1 + n_carried            # the body's outputs: cond, the carried values, the scan outputs
    counts = body.reads(0)                # a body ignoring the iteration number gets None for it

    def run(*args):
        own, captured = args[:_n_inputs], args[_n_inputs:]
        trip = own[0] if _n_inputs > 0 else None
        cond = own[1] if _n_inputs > 1 else None
        limit = None if trip is None else _count(trip, "M (max trip count)")
        keep_going = True if cond is None else _flag(cond, "cond")
        cap = dtypes.max_loop_iterations()
        end = cap if limit is None else max(min(limit, cap), 0)
        max_bytes = dtypes.get_limits()["max_tensor_bytes"]
        # A trip count the loop may run sizes the scan outputs' buffers (checked against the limit as a
        # whole at the first iteration); without one, or past the iteration cap (M = INT64_MAX: a
        # while loop as exporters write it), they are lists, counted as they grow.
        grid = (end,) if limit is not None and limit <= cap else None
        scans = [_Rows(k, grid, max_bytes=max_bytes) for k in range(n_scan)]
        puts = [(rows.put, first_scan + k) for k, rows in enumerate(scans)]
        call = body.runner(captured)
        true = np.array(True)
        true.flags.writeable = False
        # The body's inputs: the iteration number, the condition (true, or the loop has ended) and the
        # carried values. The list the body's outputs come back in becomes the next inputs, so that
        # no reference to a carried value outlives its body run but the body's own (SubPlan.runner).
        values = [None, true, *own[2:]]
        out = None
        i = 0
        while keep_going and i < end:
            if counts:
                values[0] = np.array(i, np.int64)
            out = call(values)
            c = out[0]
            keep_going = c is true or _flag(c, "the condition the body returns")
            for put, at in puts:
                put(i, out[at])
            i += 1
            if keep_going:
                del out[first_scan:]
                out[0] = true
                out.insert(0, None)
                values, out = out, None
        if keep_going and i == cap and (limit is None or limit > cap):
            raise ResourceLimitError(
                f"the loop is still running after {cap:,} iterations (M = "
                f"{'none' if limit is None else format(limit, ',')}, the condition still true): over the "
                "limit onnx_mini.dtypes.set_limits(max_loop_iterations=...) sets")
        carried = values[2:] if out is None else out[1:first_scan]
        if i == 0:
            return (*carried, *[_declared_empty(t, (0,)) for t in scan_types])
        return (*carried, *[rows.result(i) for rows in scans])
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
        call = body.runner(captured)
        scans = [_Rows(k, (batch, max_len), pad=True) for k in range(k_out)]
        for b in range(batch):
            length = lens[b]
            # each input's rows for this batch entry, in the order the body reads them
            seqs = [_elements(x[b, :length][::-1] if d else x[b, :length]) for x, d in zip(xs, dirs)]
            values = [s[b, ...] for s in states]     # (a 0-d array, not a numpy scalar, for a 1-D state)
            for t, elems in enumerate(zip(*seqs)):
                values += elems
                out = call(values)
                for k, rows in enumerate(scans):
                    rows.put((b, t), out[n + k])
                del out[n:]
                values = out          # the states, the next inputs
            for i, v in enumerate(values):
                finals[i].append(v)
        state_out = [np.stack(f) if batch else s for f, s in zip(finals, states)]
        scan_out = [_or_declared(rows.result(max_len), t, lead=(batch, max_len))
                    for rows, t in zip(scans, scan_types)]
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
            seqs.append(_elements(v))
        scans = [_Rows(k, (length,)) for k in range(k_out)]
        # per scan output: where its rows go (its put), its place among the body's outputs, reversed
        puts = [(rows.put, n + k, out_dirs[k]) for k, rows in enumerate(scans)]
        last = length - 1
        fast = body.single_step(captured) if length else None
        if fast is not None:
            values = _single_step_iterations(fast, states, seqs, puts, n, last)
        else:
            call = body.runner(captured)
            values = list(states)
            for t, elems in enumerate(zip(*seqs)):
                values += elems
                out = call(values)
                for put, at, reverse in puts:
                    put(last - t if reverse else t, out[at])
                del out[n:]
                values = out              # the states, the next inputs
        results = []
        for k, (rows, t) in enumerate(zip(scans, scan_types)):
            o = rows.result(length)
            if o is None:
                o = _declared_empty(t, (length,))
                if not -o.ndim <= out_axes[k] < o.ndim:
                    results.append(o)   # nothing ran and the body's output rank is undeclared: scan axis first
                    continue
            a = normalize_axis(out_axes[k], o.ndim, f"scan_output_axes[{k}]")
            results.append(np.moveaxis(o, 0, a) if a else o)
        return (*values, *results)
    return run


def _single_step_iterations(fast, states, seqs, puts, n: int, last: int) -> list:
    """Scan's iterations over a body of one step whose result is every new state and every scan output
    row (SubPlan.single_step: a fused RNN cell), that step called directly on an argument list kept
    across iterations: scan_rnn's 100 steps ~0.9 us each faster than through the body's runner (its
    slot list, input and output lists: 0.88-0.90x a run). -> the final states."""
    fn, args, at, error = fast
    for j, v in enumerate(states):
        for p in at[j]:
            args[p] = v
    state_at = [p for j in range(n) for p in at[j]]
    elem_at = [(p, j) for j in range(len(seqs)) for p in at[n + j]]
    y = None
    if len(state_at) == 1 and len(elem_at) == 1 and len(puts) == 1:
        # an RNN cell (h, x_t -> h and y_t) without the three inner loops: scan_rnn 0.96x a run (in-process
        # A/B against the general loop below, three runs)
        (s, ((e, j),), (put, _, reverse)) = state_at[0], elem_at, puts[0]
        for t, x in enumerate(seqs[j]):
            args[e] = x
            try:
                y = fn(*args)
            except Exception as exc:
                raise error(args, exc) from exc
            put(last - t if reverse else t, y)
            args[s] = y
        return [y] * n
    for t, elems in enumerate(zip(*seqs)):
        for p, j in elem_at:
            args[p] = elems[j]
        try:
            y = fn(*args)
        except Exception as e:
            raise error(args, e) from e
        for put, _, reverse in puts:
            put(last - t if reverse else t, y)
        for p in state_at:
            args[p] = y
    return [y] * n                      # (at least one iteration: single_step is not asked for none)


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
