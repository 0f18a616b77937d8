"""Small builders shared by our own tests."""
from __future__ import annotations

from onnx import TensorProto, helper


def model(nodes, inputs, outputs, initializers=(), opset=21, ir_version=10, **kw):
    """inputs/outputs: [(name, elem_type, shape)]; shape None means unknown."""
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        list(initializers))
    opsets = opset if isinstance(opset, list) else [helper.make_opsetid("", opset)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=ir_version, **kw)


F, I64 = TensorProto.FLOAT, TensorProto.INT64
