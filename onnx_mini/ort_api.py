"""onnxruntime's value types over numpy: OrtValue and IOBinding, and the table of onnxruntime names
onnx_mini knows but does not provide (each with what to use instead).

An OrtValue holds a numpy array (or, as a run's output, a sequence, map or optional as run() returns
it); everything lives in CPU memory, so an OrtValue made from an array shares that array's memory as
onnxruntime's CPU build does, and the device is always 'cpu'. An IOBinding collects inputs and output
requests for InferenceSession.run_with_iobinding (session.py runs it). Raw pointers (bind_input's
buffer_ptr) are accepted only when they come from `OrtValue.data_ptr()` of a live OrtValue: onnx_mini
reads memory only through numpy objects it holds, never at an arbitrary address.
"""
from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from . import dtypes
from .errors import ArgumentError, InputError, UnsupportedDeviceError
from .graph import TypeInfo
from .inputs import type_string

README_SECTION = "README.md, section 'Drop-in for onnxruntime'"

# Names of onnxruntime's Python API that onnx_mini does not provide, and what to do instead; read by
# the __getattr__ of the module, InferenceSession, SessionOptions, RunOptions, OrtValue and IOBinding.
_CPU_ONLY = "onnx_mini runs on the CPU only, in memory numpy allocates: there is no device to choose"
_NO_EP = ("onnx_mini has a single execution provider, CPUExecutionProvider; pass providers=None or "
          "['CPUExecutionProvider']")
UNSUPPORTED: dict[str, dict[str, str]] = {
    "onnx_mini": {
        "set_default_logger_callback": "onnx_mini has no logger: its warnings are Python warnings "
                                       "(IgnoredOptionWarning) and its per-node trace goes to stderr or to "
                                       "InferenceSession(..., verbose=stream)",
        "set_seed": "the random operators take their `seed` attribute",
        **dict.fromkeys(("get_build_info", "get_version_string", "print_debug_info", "version", "package_name"),
                        "use onnx_mini.__version__ (onnx_mini's own version; the package is onnx-mini)"),
        "capi": "onnx_mini has no C extension: its API is the package's top level (onnx_mini.InferenceSession, "
                "onnx_mini.OrtValue, onnx_mini.errors for the exceptions)",
        "has_collective_ops": "onnx_mini has no collective (multi-device) operators",
        "OrtSparseFormat": "sparse tensors are not supported: pass dense numpy arrays",
        "OrtExternalInitializerInfo": "onnx_mini reads external initializers from the files next to the model",
        **dict.fromkeys(("ModelPackage", "ModelPackageComponentContext", "ModelPackageContext",
                         "ModelPackageOptions", "ModelPackageWriteMode"),
                        "model packages are not supported: give InferenceSession the .onnx file"),
        "set_global_thread_pool_sizes": "cap a session's threads with SessionOptions.intra_op_num_threads, "
                                        "or the process's with ONNX_MINI_THREADS",
        "SparseTensor": "sparse tensors are not supported: pass dense numpy arrays",
        "LoraAdapter": "LoRA adapters are not supported: merge the adapter into the model's weights",
        "AdapterFormat": "LoRA adapters are not supported: merge the adapter into the model's weights",
        "SessionIOBinding": "use InferenceSession.io_binding()",
        "copy_tensors": "onnx_mini's values are numpy arrays: use numpy.copyto",
        "preload_dlls": "onnx_mini loads no native libraries: remove the call",
        "enable_telemetry_events": "onnx_mini sends no telemetry: remove the call",
        "disable_telemetry_events": "onnx_mini sends no telemetry: remove the call",
        **dict.fromkeys(("ModelCompiler", "OrtCompileApiFlags"),
                        "onnx_mini compiles nothing ahead of time: InferenceSession prepares the model once"),
        **dict.fromkeys(("OrtDevice", "OrtMemoryInfo", "OrtArenaCfg", "OrtAllocatorType", "OrtMemType",
                         "OrtSyncStream", "OrtDeviceMemoryType", "OrtMemoryInfoDeviceType",
                         "create_and_register_allocator", "create_and_register_allocator_v2",
                         "OrtDeviceVendorId", "cuda_version"), _CPU_ONLY),
        **dict.fromkeys(("get_ep_devices", "OrtEpDevice", "OrtHardwareDevice", "OrtHardwareDeviceType",
                         "OrtExecutionProviderDevicePolicy", "register_execution_provider_library",
                         "unregister_execution_provider_library", "OrtEpContextData",
                         "OrtEpContextDataBuffer", "OrtEpAssignedNode", "OrtEpAssignedSubgraph"), _NO_EP),
    },
    "InferenceSession": {
        "run_async": "use run(); to overlap runs, call run() from several threads: a session is thread-safe",
        "run_with_ortvaluevector": "use run_with_ort_values()",
        "create_ortvalue_from_shape_and_type": "use OrtValue.ortvalue_from_shape_and_type()",
        "get_tuning_results": "onnx_mini has no tunable kernels (TunableOp is a GPU feature)",
        "set_tuning_results": "onnx_mini has no tunable kernels (TunableOp is a GPU feature)",
        "release_captured_graph": "onnx_mini captures no CUDA graphs",
        "set_ep_dynamic_options": _NO_EP,
        "get_provider_graph_assignment_info": "every node runs on CPUExecutionProvider",
        **dict.fromkeys(("get_input_memory_infos", "get_output_memory_infos", "get_input_epdevices"), _CPU_ONLY),
    },
    "SessionOptions": {
        "register_custom_ops_library": "onnx_mini cannot load native custom-op libraries: write the kernel in "
                                       "Python (onnx_mini.kernel / onnx_mini.CustomOps) and pass "
                                       "InferenceSession(..., custom_ops=...)",
        **dict.fromkeys(("add_initializer", "add_external_initializers",
                         "add_external_initializers_from_files_in_memory"),
                        "onnx_mini reads initializers from the model and its external data files; feed an "
                        "overridable initializer as an input instead (get_overridable_initializers())"),
        **dict.fromkeys(("add_provider", "add_provider_for_devices", "set_provider_selection_policy",
                         "set_provider_selection_policy_delegate", "has_providers",
                         "set_ep_context_data_read_func", "clear_ep_context_data_read_func"), _NO_EP),
        "set_load_cancellation_flag": "loading a model cannot be cancelled",
    },
    "RunOptions": {
        "add_active_adapter": "LoRA adapters are not supported: merge the adapter into the model's weights",
    },
    "OrtValue": {
        "from_dlpack": "use OrtValue.ortvalue_from_numpy(numpy.from_dlpack(x))",
        "as_sparse_tensor": "sparse tensors are not supported: OrtValues hold dense numpy arrays",
        "ort_value_from_sparse_tensor": "sparse tensors are not supported: OrtValues hold dense numpy arrays",
    },
    "IOBinding": {
        "get_outputs_as_ortvaluevector": "use get_outputs() (a list of OrtValue)",
    },
}


def missing_attribute(owner: str, name: str, kind: str = "object", missing: str = "") -> AttributeError:
    """The AttributeError for `owner.name`: what to use instead when it is a known onnxruntime name,
    else the usual message (or `missing`) with a pointer to the README."""
    alternative = UNSUPPORTED.get(owner, {}).get(name)
    if alternative is not None:
        return AttributeError(f"{owner}.{name} (onnxruntime) is not available in onnx_mini: {alternative}")
    missing = missing or f"{kind} {owner!r} has no attribute {name!r}"
    if name.startswith("__") and name.endswith("__"):      # Python's own probes (copy, pickle, ...): plain
        return AttributeError(missing)
    return AttributeError(f"{missing} (the onnxruntime API onnx_mini provides: {README_SECTION})")


def module_getattr(name: str):
    """onnx_mini's module __getattr__ (PEP 562): called only for names the package does not define."""
    raise missing_attribute("onnx_mini", name, "module")


def check_device(device_type: Any, where: str, vendor_id: int = -1) -> None:
    if not isinstance(device_type, str) or device_type.lower() != "cpu" or vendor_id != -1:
        asked = f"device_type {device_type!r}" + (f", vendor_id {vendor_id}" if vendor_id != -1 else "")
        raise UnsupportedDeviceError(f"{where}: {asked}: onnx_mini runs on the CPU only (device_type='cpu')")


def element_dtype(element_type: Any, where: str) -> np.dtype:
    """A numpy type (np.float32) or an ONNX element type number (TensorProto.BFLOAT16) as a dtype."""
    if isinstance(element_type, (int, np.integer)) and not isinstance(element_type, bool):
        dt = dtypes.NP_DTYPE.get(int(element_type))
        if dt is None:
            raise ArgumentError(f"{where}: element type {int(element_type)} ({dtypes.type_name(int(element_type))}) "
                                "has no numpy dtype here")
        return dt
    try:
        dt = np.dtype(element_type)
    except TypeError:
        raise ArgumentError(f"{where}: element_type must be a numpy type (numpy.float32) or an ONNX element "
                            f"type number (onnx.TensorProto.FLOAT), got {element_type!r}") from None
    if dt.kind in "US":
        dt = np.dtype(object)
    if dt not in dtypes.ELEM_TYPE:
        raise ArgumentError(f"{where}: numpy dtype {dt} has no ONNX element type")
    return dt


def value_type(value: Any) -> str:
    """onnxruntime's type string of a run-time value: 'tensor(float)', 'seq(tensor(int64))', ..."""
    if isinstance(value, np.ndarray):
        return f"tensor({dtypes.type_name(dtypes.ELEM_TYPE.get(value.dtype, 0))})"
    if isinstance(value, list):
        return f"seq({value_type(value[0]) if value else 'tensor(undefined)'})"
    if isinstance(value, dict):
        k, v = next(iter(value.items()), (None, None))
        key = dtypes.type_name(dtypes.elem_type(type(k))) if k is not None else "undefined"
        return f"map({key},{value_type(np.asarray(v)) if v is not None else 'tensor(undefined)'})"
    return "optional(tensor(undefined))" if value is None else "unknown"


# Live OrtValues whose data_ptr() was handed out, by address: the only pointers bind_input accepts.
_BY_ADDRESS: "weakref.WeakValueDictionary[int, OrtValue]" = weakref.WeakValueDictionary()


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def buffer_at(ptr: int, dtype: np.dtype, shape, where: str) -> np.ndarray:
    """The array at `ptr` (from OrtValue.data_ptr()) seen as `dtype` and `shape`."""
    is_int = isinstance(ptr, (int, np.integer)) and not isinstance(ptr, bool)
    owner = _BY_ADDRESS.get(int(ptr)) if is_int else None
    if owner is None:
        at = f"{int(ptr):#x}" if is_int else repr(ptr)
        raise ArgumentError(
            f"{where}: onnx_mini cannot read memory at {at}: it reads memory only through numpy arrays it "
            "holds. Pass buffer_ptr=ortvalue.data_ptr() of a live onnx_mini.OrtValue, or bind the array itself: "
            "bind_cpu_input(name, array), bind_ortvalue_input(name, OrtValue.ortvalue_from_numpy(array)), "
            "bind_ortvalue_output(name, ortvalue)")
    arr = owner._value
    shape = tuple(int(d) for d in shape)
    count = dtypes.check_size(shape, dtype, f"{where}: shape", error=ArgumentError)
    if dtype != arr.dtype:
        raise ArgumentError(f"{where}: element type {dtype} does not match the OrtValue at {ptr:#x} ({arr.dtype})")
    if count > arr.size:
        raise ArgumentError(f"{where}: shape {list(shape)} needs {count} elements, the OrtValue at {ptr:#x} "
                            f"holds {arr.size} ({value_type(arr)} {list(arr.shape)})")
    return arr.reshape(-1)[:count].reshape(shape)


class OrtValue:
    """onnxruntime.OrtValue over a numpy array in CPU memory (or a run's non-tensor output)."""
    __slots__ = ("_value", "_type", "__weakref__")

    def __init__(self, value: Any, type_str: str | None = None):
        """Internal: use the factories (ortvalue_from_numpy, ortvalue_from_shape_and_type)."""
        self._value = value
        self._type = type_str

    # -- factories -----------------------------------------------------------------------------------
    @classmethod
    def ortvalue_from_numpy(cls, numpy_obj: np.ndarray, device_type: str = "cpu", device_id: int = 0,
                            vendor_id: int = -1) -> "OrtValue":
        """An OrtValue sharing the array's memory (a C-contiguous copy when the array is not contiguous,
        as onnxruntime). Strings and the ml_dtypes types (bfloat16, float8, int4...) are accepted too."""
        where = "OrtValue.ortvalue_from_numpy"
        check_device(device_type, where, vendor_id)
        if not isinstance(numpy_obj, np.ndarray):
            raise ArgumentError(f"{where} expects a numpy array, got {type(numpy_obj).__name__}: "
                                "convert it with numpy.asarray(value, dtype=...) first")
        arr = numpy_obj
        if arr.dtype.kind in "US":
            arr = arr.astype(object)
        element_dtype(arr.dtype, where)                       # an ONNX element type exists for it
        if not arr.flags.c_contiguous:
            arr = arr.copy(order="C")
        return cls(arr)

    @classmethod
    def ortvalue_from_numpy_with_onnx_type(cls, data: np.ndarray, onnx_element_type: int) -> "OrtValue":
        """The array's bits seen as an ONNX element type numpy lacks (bfloat16 given as uint16, ...)."""
        where = "OrtValue.ortvalue_from_numpy_with_onnx_type"
        value = cls.ortvalue_from_numpy(data)._value
        dt = element_dtype(onnx_element_type, where)
        if value.dtype == dt:
            return cls(value)
        if value.dtype == object or dt == object or value.dtype.itemsize != dt.itemsize or \
                int(onnx_element_type) in dtypes.PACKED_BITS:
            raise ArgumentError(f"{where}: a {value.dtype} array cannot hold "
                                f"{dtypes.type_name(int(onnx_element_type))} elements (one element of "
                                f"{dt.itemsize} byte(s) per array element is needed)")
        return cls(value.view(dt))

    @classmethod
    def ortvalue_from_shape_and_type(cls, shape, element_type, device_type: str = "cpu", device_id: int = 0,
                                     vendor_id: int = -1, memory_info: Any = None) -> "OrtValue":
        """A new tensor of `shape` and `element_type` (numpy type or ONNX element type number), zero-filled."""
        where = "OrtValue.ortvalue_from_shape_and_type"
        check_device(device_type, where, vendor_id)
        if memory_info is not None:
            raise UnsupportedDeviceError(f"{where}: memory_info: {_CPU_ONLY}")
        dt = element_dtype(element_type, where)
        try:
            shape = tuple(int(d) for d in shape)
        except (TypeError, ValueError):
            raise ArgumentError(f"{where}: shape must be a sequence of ints, got {shape!r}") from None
        dtypes.check_size(shape, dt, f"{where}: shape", error=ArgumentError)
        return cls(np.full(shape, "", dtype=object) if dt == object else np.zeros(shape, dt))

    @classmethod
    def from_output(cls, value: Any, t: TypeInfo | None = None) -> "OrtValue":
        """A run's output as an OrtValue owning writable memory, as onnxruntime's outputs (a read-only
        result is shared with the model or the caller: copied)."""
        if isinstance(value, np.ndarray) and not value.flags.writeable:
            value = value.copy()
        declared = t is not None and (value is None or t.kind in ("sequence", "map"))   # exact when empty
        return cls(value, type_string(t) if declared else None)

    # -- what it holds ---------------------------------------------------------------------------------
    def _tensor(self, what: str) -> np.ndarray:
        if not isinstance(self._value, np.ndarray):
            raise ArgumentError(f"OrtValue.{what}(): this OrtValue holds a {self.data_type()}, not a tensor; "
                                "InferenceSession.run() returns sequences, maps and optionals as Python values")
        return self._value

    def numpy(self) -> np.ndarray:
        """The tensor as a numpy array sharing the OrtValue's memory."""
        return self._tensor("numpy").view()

    def shape(self) -> list[int]:
        return list(self._tensor("shape").shape)

    def data_type(self) -> str:
        return self._type or value_type(self._value)

    def element_type(self) -> int:
        """The ONNX element type number of the tensor (of a sequence's tensors; 0 when unknown)."""
        v = self._value
        while isinstance(v, list) and v:
            v = v[0]
        return dtypes.ELEM_TYPE.get(v.dtype, 0) if isinstance(v, np.ndarray) else 0

    def device_name(self) -> str:
        return "cpu"

    def is_tensor(self) -> bool:
        return isinstance(self._value, np.ndarray)

    def is_tensor_sequence(self) -> bool:
        return isinstance(self._value, list)

    def is_sparse_tensor(self) -> bool:
        return False

    def has_value(self) -> bool:
        return self._value is not None

    def tensor_size_in_bytes(self) -> int:
        return self._tensor("tensor_size_in_bytes").nbytes

    def data_ptr(self) -> int:
        """The tensor's address, for IOBinding.bind_input / bind_output(buffer_ptr=...) of this session's
        process; valid while this OrtValue lives."""
        arr = self._tensor("data_ptr")
        if arr.dtype == object:
            raise ArgumentError("OrtValue.data_ptr(): a string tensor has no raw buffer")
        ptr = _address(arr)
        _BY_ADDRESS[ptr] = self
        return ptr

    def update_inplace(self, np_arr: np.ndarray) -> None:
        """Copy `np_arr` (same element type and element count) into this OrtValue's memory."""
        arr = self._tensor("update_inplace")
        src = np.asarray(np_arr)
        if src.dtype != arr.dtype or src.size != arr.size:
            raise ArgumentError(f"OrtValue.update_inplace: expects {arr.size} elements of {arr.dtype}, "
                                f"got {src.dtype}{list(src.shape)}")
        if not arr.flags.writeable:
            raise ArgumentError("OrtValue.update_inplace: this OrtValue's array is read-only")
        np.copyto(arr, src.reshape(arr.shape))

    def __getattr__(self, name: str):
        raise missing_attribute("OrtValue", name)

    def __repr__(self) -> str:
        shape = f" {list(self._value.shape)}" if isinstance(self._value, np.ndarray) else ""
        return f"<onnx_mini.OrtValue {self.data_type()}{shape}>"


class IOBinding:
    """onnxruntime.IOBinding: inputs and requested outputs bound by name, then
    `session.run_with_iobinding(binding)`; the outputs are read with get_outputs() (OrtValues) or
    copy_outputs_to_cpu() (numpy arrays). Everything is in CPU memory: synchronize_* do nothing.
    An output bound to a preallocated OrtValue (bind_ortvalue_output, or bind_output with a buffer_ptr
    from OrtValue.data_ptr()) receives the result in its memory; its shape and element type must match.
    As in onnxruntime, an output the run allocated is written again in place by the binding's next runs
    while its shape and element type stay the same (an OrtValue or array read from it then shows the
    latest run: copy it, or use copy_outputs_to_cpu(), to keep it), until it is bound again or cleared;
    where onnxruntime then fails on a new shape, onnx_mini allocates a new output."""

    def __init__(self, session: Any, input_names: frozenset, value_names: frozenset):
        """Internal: use InferenceSession.io_binding()."""
        self._session = session
        self._input_names = input_names      # graph inputs (overridable initializers included)
        self._value_names = value_names      # any value of the graph may be an output
        self._inputs: dict[str, Any] = {}
        self._outputs: dict[str, OrtValue | None] = {}     # name -> preallocated OrtValue or None
        self._allocated: dict[str, OrtValue] = {}          # outputs a run allocated, written again in place
        self._results: list[OrtValue] = []

    def _input(self, name: str, where: str) -> str:
        if name not in self._input_names:
            raise InputError(f"IOBinding.{where}: {name!r} is not an input of the model (its inputs are "
                             f"{', '.join(map(repr, sorted(self._input_names))) or 'none'})")
        return name

    def _output(self, name: str, where: str) -> str:
        if name not in self._value_names:
            raise InputError(f"IOBinding.{where}: {name!r} is not a value of the graph")
        return name

    # -- inputs -----------------------------------------------------------------------------------------
    def bind_cpu_input(self, name: str, arr_on_cpu) -> None:
        """Bind a numpy array (kept by reference, as onnxruntime: a change before the run is seen)."""
        value = arr_on_cpu._value if isinstance(arr_on_cpu, OrtValue) else arr_on_cpu
        self._inputs[self._input(name, "bind_cpu_input")] = value

    def bind_ortvalue_input(self, name: str, ortvalue: OrtValue) -> None:
        if not isinstance(ortvalue, OrtValue):
            raise ArgumentError(f"IOBinding.bind_ortvalue_input({name!r}): expects an onnx_mini.OrtValue, got "
                                f"{type(ortvalue).__name__} (bind_cpu_input takes numpy arrays)")
        self._inputs[self._input(name, "bind_ortvalue_input")] = ortvalue._value

    def bind_input(self, name: str, device_type, device_id, element_type, shape, buffer_ptr) -> None:
        """The pointer form: buffer_ptr must come from OrtValue.data_ptr() of a live OrtValue."""
        where = f"IOBinding.bind_input({name!r})"
        self._input(name, "bind_input")
        check_device(device_type, where)
        self._inputs[name] = buffer_at(buffer_ptr, element_dtype(element_type, where), shape, where)

    def clear_binding_inputs(self) -> None:
        self._inputs.clear()

    def synchronize_inputs(self) -> None:
        """Nothing to wait for: inputs are in CPU memory."""

    # -- outputs ----------------------------------------------------------------------------------------
    def bind_output(self, name: str, device_type: str = "cpu", device_id: int = 0, element_type=None,
                    shape=None, buffer_ptr=None) -> None:
        """Request output `name` (any value of the graph). Without buffer_ptr the run allocates it
        (element_type and shape are then unused, as in onnxruntime); with one, the result is written
        there (a pointer from OrtValue.data_ptr(); element_type and shape required)."""
        where = f"IOBinding.bind_output({name!r})"
        self._output(name, "bind_output")
        check_device(device_type, where)
        target = None
        if buffer_ptr is not None:
            if element_type is None or shape is None:
                raise ArgumentError(f"{where}: element_type and shape are required with a buffer_ptr")
            target = OrtValue(buffer_at(buffer_ptr, element_dtype(element_type, where), shape, where))
        self._outputs[name] = target
        self._allocated.pop(name, None)

    def bind_ortvalue_output(self, name: str, ortvalue: OrtValue) -> None:
        """The result of the run is written into this OrtValue's memory."""
        if not isinstance(ortvalue, OrtValue) or not ortvalue.is_tensor():
            raise ArgumentError(f"IOBinding.bind_ortvalue_output({name!r}): expects an onnx_mini.OrtValue holding "
                                f"a tensor, got {ortvalue!r}")
        self._outputs[self._output(name, "bind_ortvalue_output")] = ortvalue
        self._allocated.pop(name, None)

    def clear_binding_outputs(self) -> None:
        self._outputs.clear()
        self._allocated.clear()

    def synchronize_outputs(self) -> None:
        """Nothing to wait for: outputs are in CPU memory."""

    def get_outputs(self) -> list[OrtValue]:
        """The OrtValues of the last run, in the order the outputs were bound."""
        return list(self._results)

    def copy_outputs_to_cpu(self) -> list:
        """The last run's outputs as fresh numpy arrays (non-tensors as run() returns them)."""
        return [v._value.copy() if isinstance(v._value, np.ndarray) else v._value for v in self._results]

    def _store(self, names: tuple[str, ...], values: list, types: dict) -> None:
        """Keep one run's results: into the preallocated OrtValues or those earlier runs allocated,
        else as new ones."""
        results = []
        for name, value in zip(names, values):
            target = self._outputs.get(name)
            if target is None:
                target = self._allocated.get(name)
                if target is None or not _fits(target._value, value):
                    self._allocated[name] = target = OrtValue.from_output(value, types.get(name))
                    results.append(target)
                    continue
            dest = target._value
            if not _fits(dest, value):
                got = f"{value.dtype}{list(value.shape)}" if isinstance(value, np.ndarray) else value_type(value)
                raise InputError(f"output {name!r} is bound to a preallocated {dest.dtype}{list(dest.shape)} "
                                 f"but the run computed {got}: bind_output({name!r}) lets the run allocate it")
            if not dest.flags.writeable:
                raise InputError(f"output {name!r} is bound to a read-only array")
            np.copyto(dest, value)
            results.append(target)
        self._results = results

    def __getattr__(self, name: str):
        raise missing_attribute("IOBinding", name)


def _fits(dest: Any, value: Any) -> bool:
    """Whether a run's `value` can be written into the tensor `dest`."""
    return (isinstance(dest, np.ndarray) and isinstance(value, np.ndarray) and value.shape == dest.shape
            and value.dtype == dest.dtype)
