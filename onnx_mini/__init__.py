"""onnx_mini: a pure-Python ONNX runtime on numpy and ml_dtypes.

    import onnx_mini
    outputs = onnx_mini.prepare("model.onnx").run({"x": x})
"""
from . import errors
from .backend import Backend, PreparedModel, is_compatible, prepare, run_model, run_node, supports_device
from .loader import load
from .registry import supported_ops
from .session import InferenceSession

__version__ = "0.1.0"
__all__ = ["Backend", "PreparedModel", "InferenceSession", "prepare", "run_model", "run_node",
           "supports_device", "is_compatible", "load", "supported_ops", "errors"]
