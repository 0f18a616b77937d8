"""The official ONNX backend test suite of the installed onnx, run on CPU against onnx_mini.

Tests listed in expected_failures.txt are strict xfails (see conftest.py): a listed test that passes
fails the run, so the list can only shrink as operators land.
"""
import onnx.backend.test

import onnx_mini.backend

backend_test = onnx.backend.test.BackendTest(onnx_mini.backend.Backend, __name__)
globals().update(backend_test.test_cases)
