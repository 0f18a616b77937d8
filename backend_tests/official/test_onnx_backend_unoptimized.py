"""The official real-model, pytorch-converted and pytorch-operator tests of onnx's backend suite, run
with prepare(model, optimize=False): the graph exactly as written (no folding, no fusion), so that both
optimize modes are checked on the same models (test_onnx_backend.py runs them optimised)."""
import onnx.backend.test

import onnx_mini.backend

KINDS = ("OnnxBackendRealModelTest", "OnnxBackendPyTorchConvertedModelTest", "OnnxBackendPyTorchOperatorModelTest")


class UnoptimizedBackend(onnx_mini.backend.Backend):
    @classmethod
    def prepare(cls, model, device: str = "CPU", **kwargs):
        kwargs["optimize"] = False
        return super().prepare(model, device, **kwargs)


backend_test = onnx.backend.test.BackendTest(UnoptimizedBackend, __name__)
backend_test.exclude(r".*_cuda$")        # CPU only
globals().update({name: case for name, case in backend_test.test_cases.items() if name in KINDS})
