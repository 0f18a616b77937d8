"""The caller's arrays are never modified: every official node test's model runs with onnx_mini on its
own inputs (writeable arrays), which must be bit-for-bit unchanged afterwards, as must the ModelProto.
The tests listed in expected_failures.txt are skipped (onnx_mini is expected to fail them)."""
import copy
import os
import re

import numpy as np
import onnx
import onnx.backend.test.case.node as node_cases
import pytest
from onnx import numpy_helper

import onnx_mini
from helpers import TESTS

_HERE = str(TESTS)


def _expected_failures() -> list[re.Pattern]:
    with open(os.path.join(_HERE, "expected_failures.txt"), encoding="utf-8") as f:
        lines = [ln.split("|")[0].strip() for ln in f if ln.strip() and not ln.startswith("#")]
    return [re.compile(p) for p in lines]


def _snapshot(value):
    """A deep, comparable copy of an input (tensor, sequence, optional, map)."""
    if isinstance(value, np.ndarray):
        return (value.dtype, value.shape, value.tobytes() if value.dtype != object else value.tolist())
    if isinstance(value, (list, tuple)):
        return [_snapshot(v) for v in value]
    if isinstance(value, dict):
        return {k: _snapshot(v) for k, v in value.items()}
    return copy.deepcopy(value)


def _value(x):
    """An input as the runtime takes it: protos (some cases store their inputs so) to numpy values."""
    if isinstance(x, onnx.TensorProto):
        return numpy_helper.to_array(x)
    if isinstance(x, onnx.SequenceProto):
        return numpy_helper.to_list(x)
    if isinstance(x, onnx.OptionalProto):
        return numpy_helper.to_optional(x)
    if isinstance(x, np.ndarray) and not x.flags.writeable:
        return np.array(x)
    return x


def _cases():
    skip = _expected_failures()
    cases = node_cases.collect_testcases()
    return [c for c in cases if not any(p.fullmatch(c.name + "_cpu") for p in skip)]


def test_official_node_models_leave_their_inputs_unchanged():
    cases = _cases()
    assert len(cases) > 1000                       # every node test, not a handful
    changed, checked = [], 0
    for case in cases:
        proto = case.model.SerializeToString()
        rep = onnx_mini.prepare(case.model)
        for inputs, _ in case.data_sets:
            inputs = [_value(x) for x in inputs]
            before = [_snapshot(x) for x in inputs]
            rep.run(inputs)
            checked += 1
            if [_snapshot(x) for x in inputs] != before:
                changed.append(case.name)
        if case.model.SerializeToString() != proto:
            changed.append(case.name + " (ModelProto)")
    assert checked > 1000
    assert not changed, f"inputs modified by: {changed}"


def test_snapshot_sees_a_modified_array():
    # the check above would pass trivially if the snapshot could not see a change
    x = np.arange(4, dtype=np.float32)
    before = _snapshot(x)
    x[1] = np.nextafter(x[1], 2)
    assert _snapshot(x) != before
    s = np.array(["a", "b"], dtype=object)
    before = _snapshot([s])
    s[0] = "c"
    assert _snapshot([s]) != before


if __name__ == "__main__":
    pytest.main([__file__, "-q"])
