"""Operator benchmarks: single heavy kernels, onnx_mini vs onnxruntime vs onnx.reference, same process.

    .venv/bin/python benchmarks/bench_ops.py            # full run
    .venv/bin/python benchmarks/bench_ops.py --quick    # fewer repetitions

Cases (see benchmarks/README.md):
  4. MatMul float32 [1024,1024] x [1024,1024], and the same in float16 (onnx_mini computes in float32).
  5. Gemm float32 [1024,1024] x [1024,1024]^T + bias[1024] (transB=1, alpha=1, beta=1), the layout
     of a fully connected layer.

Outputs are cross-checked against onnxruntime with a tolerance (BLAS libraries sum in different
orders, so results are not bit-identical) before anything is timed. The timing, the runners and the
table come from bench_core.py.
"""
from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).parent))
import bench_core as core  # noqa: E402  (shared timing, runners and table)

REPEATS = {"matmul": (30, 5)}


def matmul_model(n: int, elem: int):
    x = helper.make_tensor_value_info("a", elem, [n, n])
    y = helper.make_tensor_value_info("b", elem, [n, n])
    out = helper.make_tensor_value_info("y", elem, [n, n])
    return core.make_model([helper.make_node("MatMul", ["a", "b"], ["y"])], [x, y], [out], [], "matmul")


def gemm_model(n: int, bias: np.ndarray):
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, [n, n])
    w = helper.make_tensor_value_info("w", TensorProto.FLOAT, [n, n])
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, n])
    node = helper.make_node("Gemm", ["a", "w", "c"], ["y"], transB=1)
    return core.make_model([node], [a, w], [out], [numpy_helper.from_array(bias, "c")], "gemm")


def cross_check(runners, outs, expected: np.ndarray, rtol: float, label: str, notes: list[str]) -> None:
    """Every runtime's output must match the float64 numpy result within rtol (relative to its scale)."""
    scale = float(np.abs(expected).max()) or 1.0
    for name, out in outs.items():
        if out is None:
            continue
        err = float(np.abs(out[0].astype(np.float64) - expected).max()) / scale
        if err > rtol:
            runners[name].error = f"output differs from float64 numpy (max rel err {err:.2e}) - not timed"
            notes.append(f"{label}: {name} output DIFFERS from numpy (max rel err {err:.2e})")


def run_case(table: core.Table, label: str, model, feeds: dict, expected: np.ndarray, rtol: float,
             quick: bool) -> None:
    reps, min_sample = REPEATS["matmul"][quick], core.MIN_SAMPLE[quick]
    runners = core.make_runners(model)
    outs = {name: r.try_run(feeds) for name, r in runners.items()}
    cross_check(runners, outs, expected, rtol, label, table.notes)
    times = {name: r.time(feeds, reps, min_sample) for name, r in runners.items()}
    table.add(label, times)
    core.runner_notes(table, label, runners)
    if core.ort is not None and runners["onnxruntime"].ok and times["onnxruntime"] is not None:
        one = core.Runner("onnxruntime", model, intra_op_num_threads=1)
        t1 = one.time(feeds, reps, min_sample) if one.try_run(feeds) is not None else None
        msg = (f"{label}: onnxruntime with intra_op_num_threads=1: {core.fmt_time(t1)}"
               + (f" (onnx_mini/ort = {core.fmt_ratio(times['onnx_mini'], t1)})" if t1 else ""))
        print("  " + msg)
        table.notes.append(msg)
    del runners, outs
    gc.collect()


def case_matmul(table: core.Table, quick: bool, n: int = 1024) -> None:
    print(f"\n[4. MatMul] [{n},{n}] x [{n},{n}]", flush=True)
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((2, n, n)).astype(np.float32)
    expected = a.astype(np.float64) @ b.astype(np.float64)
    run_case(table, f"4. MatMul {n}x{n} float32", matmul_model(n, TensorProto.FLOAT),
             {"a": a, "b": b}, expected, 1e-5, quick)
    a16, b16 = a.astype(np.float16), b.astype(np.float16)
    expected16 = a16.astype(np.float64) @ b16.astype(np.float64)
    run_case(table, f"4. MatMul {n}x{n} float16", matmul_model(n, TensorProto.FLOAT16),
             {"a": a16, "b": b16}, expected16, 5e-3, quick)


def case_gemm(table: core.Table, quick: bool, n: int = 1024) -> None:
    print(f"\n[5. Gemm] [{n},{n}] x [{n},{n}]^T + bias", flush=True)
    rng = np.random.default_rng(5)
    a, w = rng.standard_normal((2, n, n)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    expected = a.astype(np.float64) @ w.astype(np.float64).T + bias
    run_case(table, f"5. Gemm {n}x{n} transB + bias", gemm_model(n, bias), {"a": a, "w": w}, expected,
             1e-5, quick)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = p.parse_args(argv)
    start = time.perf_counter()
    print("machine:", core.machine_info())
    table = core.Table()
    for case in (case_matmul, case_gemm):
        try:
            case(table, args.quick)
        except Exception as e:   # one broken case must not hide the others
            table.notes.append(f"{case.__name__} aborted: {core.short(e, 300)}")
            print(f"  {case.__name__} aborted: {core.short(e, 300)}", flush=True)
        gc.collect()
    core.report(table, args.quick, start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
