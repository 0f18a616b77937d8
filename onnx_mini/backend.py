"""onnx.backend.base's interface (what onnx.backend.test and other backend users call), as a thin
adapter over the engine: the prepared model it returns is the engine's PreparedModel."""
from __future__ import annotations

from typing import Any

from onnx.backend.base import Backend as _OnnxBackend

from . import engine


class Backend(_OnnxBackend):
    """The onnx_mini backend for onnx.backend.test and other backend users (CPU only)."""

    @classmethod
    def is_compatible(cls, model, device: str = "CPU", **kwargs: Any) -> bool:
        return engine.is_compatible(model, device, **kwargs)

    @classmethod
    def prepare(cls, model, device: str = "CPU", **kwargs: Any) -> engine.PreparedModel:
        return engine.prepare(model, device, **kwargs)

    @classmethod
    def run_model(cls, model, inputs: Any, device: str = "CPU", **kwargs: Any):
        return engine.run_model(model, inputs, device, **kwargs)

    @classmethod
    def run_node(cls, node, inputs: Any, device: str = "CPU", outputs_info=None, **kwargs: Any):
        return engine.run_node(node, inputs, device, outputs_info, **kwargs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return engine.supports_device(device)
