"""Every error onnx_mini raises on purpose is an OnnxMiniError.

Errors about one node carry where it failed (node name, op, domain, opset/version) as attributes and
in the message, so a user of a 2000-node model sees which node broke and why.
"""
from __future__ import annotations


class OnnxMiniError(Exception):
    """Base class of all onnx_mini errors."""


class ModelLoadError(OnnxMiniError):
    """The model file or proto cannot be read (bad bytes, unsupported IR version, bad tensor)."""


class ExternalDataError(ModelLoadError):
    """External data is missing, malformed, or points outside the model's folder."""


class GraphError(OnnxMiniError):
    """The graph is not executable: a cycle, or a value that nothing produces."""


class InputError(OnnxMiniError, ValueError):
    """The inputs given to run() do not match the graph's declared inputs (or an output asked for is
    not a value of the graph). Also a ValueError, as onnxruntime's error for a missing input."""


class ArgumentError(OnnxMiniError, ValueError):
    """An argument of onnx_mini's API is out of range or of the wrong kind (not a model or input)."""


class UnsupportedDeviceError(OnnxMiniError, RuntimeError):
    """A device other than the CPU was asked for (a RuntimeError, as onnxruntime's CPU build raises)."""


class ResourceLimitError(OnnxMiniError, ValueError):
    """A tensor would exceed the configured size limit (dtypes.set_limits(max_tensor_bytes=...))."""


class InvalidValueError(OnnxMiniError, ValueError):
    """Raised by a kernel for an input value the spec forbids; the executor adds which node it was."""


class NodeError(OnnxMiniError):
    """An error tied to one node; the message starts with the node's identity."""

    def __init__(self, message: str, *, node: str = "", op_type: str = "", domain: str = "",
                 version: int | None = None, opset: int | None = None):
        self.node = node
        self.op_type = op_type
        self.domain = domain
        self.version = version
        self.opset = opset
        self.reason = message
        super().__init__(f"{describe_node(node, op_type, domain, version, opset)}: {message}")


class UnsupportedOperatorError(NodeError):
    """No kernel and no function body exist for this (domain, op, opset)."""


class InvalidNodeError(NodeError):
    """A node's attributes or arity are invalid for its operator version (found at prepare time)."""


class KernelError(NodeError):
    """A kernel failed while running; the message names the node and its input shapes and dtypes."""


def describe_node(node: str, op_type: str, domain: str = "", version: int | None = None,
                  opset: int | None = None) -> str:
    where = f"{domain}::{op_type}" if domain not in ("", "ai.onnx") else op_type
    if version is not None:
        where += f"-{version}"
    if opset is not None:
        where += f" (opset {opset})"
    return f"node {node!r} ({where})" if node else f"unnamed node ({where})"
