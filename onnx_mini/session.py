"""An onnxruntime-style InferenceSession over a prepared model.

Any value of the main graph may be requested as an output, not only the declared outputs: a plan
with those outputs is built once per distinct request and cached.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from . import loader
from .backend import PreparedModel
from .executor import execute
from .graph import ValueInfo
from .inputs import bind_inputs, export_outputs, type_string


@dataclass(frozen=True)
class NodeArg:
    """Like onnxruntime.NodeArg: name, type string ('tensor(float)'), shape (ints, str or None)."""
    name: str
    type: str
    shape: list | None


def _arg(v: ValueInfo) -> NodeArg:
    shape = list(v.type.shape) if v.type is not None and v.type.shape is not None else None
    return NodeArg(v.name, type_string(v.type), shape)


class InferenceSession:
    """InferenceSession(model) with model a path, bytes, file object or ModelProto."""

    def __init__(self, model, *, optimize: bool = True, base_dir: str | None = None, **_ignored: Any):
        self._prepared = PreparedModel(loader.load(model, base_dir), optimize=optimize)

    @property
    def prepared(self) -> PreparedModel:
        return self._prepared

    def get_inputs(self) -> list[NodeArg]:
        g = self._prepared.model.graph
        return [_arg(v) for v in g.inputs if v.name not in g.initializers]

    def get_outputs(self) -> list[NodeArg]:
        return [_arg(v) for v in self._prepared.model.graph.outputs]

    def run(self, output_names: Sequence[str] | None, input_feed: dict, run_options: Any = None) -> list:
        names = tuple(output_names) if output_names else tuple(self._prepared.plan.output_names)
        plan = self._prepared.plan_for(names, input_feed)
        return export_outputs(execute(plan, bind_inputs(plan, input_feed)))
