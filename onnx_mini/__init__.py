"""onnx_mini: a pure-Python ONNX runtime on numpy and ml_dtypes.

    import onnx_mini
    outputs = onnx_mini.prepare("model.onnx").run({"x": x})
"""
from . import errors
from .backend import Backend
from .coverage import supported_ops
from .custom_ops import CustomOps
from .custom_ops import user_kernel as kernel
from .engine import PreparedModel, is_compatible, prepare, run_model, run_node, supports_device
from .graph import ModelMetadata
from .compare import CompareResult, Divergence, compare
from .dtypes import get_limits, set_limits
from .loader import MissingOpsetWarning, load
from .memory import tune_malloc
from .profile import Profile, profile
from .ort_api import IOBinding, OrtValue
from .ort_api import module_getattr as __getattr__   # onnxruntime names onnx_mini lacks: what to use instead
from .session import (ExecutionMode, ExecutionOrder, GraphOptimizationLevel, IgnoredOptionWarning, InferenceSession,
                      NodeArg, RunOptions, SessionOptions, get_all_providers, get_available_providers, get_device,
                      set_default_logger_severity, set_default_logger_verbosity)

__version__ = "0.1.0"
__all__ = ["Backend", "PreparedModel", "InferenceSession", "prepare", "run_model", "run_node",
           "supports_device", "is_compatible", "load", "supported_ops", "errors", "compare", "CompareResult",
           "Divergence", "profile", "Profile", "SessionOptions", "RunOptions", "NodeArg", "GraphOptimizationLevel",
           "ExecutionMode", "ExecutionOrder", "IgnoredOptionWarning", "get_available_providers", "get_all_providers",
           "get_device", "kernel", "CustomOps", "set_limits", "get_limits", "tune_malloc", "OrtValue", "IOBinding",
           "ModelMetadata", "set_default_logger_severity", "set_default_logger_verbosity", "MissingOpsetWarning"]
