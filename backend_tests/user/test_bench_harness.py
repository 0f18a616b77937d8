"""The benchmark harness's own steps that run without onnxruntime or downloads: bench_apps.measure_case
settles onnx_mini's BLAS mode on the feeds of one run of the case, an App's own feeds or, for
bench_real's cases (a run(call) and no feeds), the first run's feeds of one call (a stream's first
chunk). bench_real called it without them and failed on its first case once."""
from __future__ import annotations

import importlib
import os

import numpy as np

from helpers import REPO


def load_bench_apps(monkeypatch):
    # bench_core sets ONNX_MINI_MALLOC=tuned for the benchmarks: kept to this test
    monkeypatch.setenv("ONNX_MINI_MALLOC", os.environ.get("ONNX_MINI_MALLOC", "recycle"))
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    return importlib.import_module("bench_apps")


class Runner:
    def __init__(self):
        self.settled = []

    def call(self, feeds):
        return [feeds["x"] * 2]

    def settle(self, feeds):
        self.settled.append(feeds)


class Stream:
    """bench_real's Case: one call runs the model on two chunks."""

    def run(self, call):
        return [call({"x": np.ones(3)})[0], call({"x": np.zeros(3)})[0]]


class App(Stream):
    feeds = {"x": np.full(3, 7.0)}


def test_measure_case_settles_on_one_run_of_the_case(monkeypatch):
    apps = load_bench_apps(monkeypatch)
    monkeypatch.setattr(apps, "PAUSE", 0.0)
    for case, want in ((Stream(), np.ones(3)), (App(), np.full(3, 7.0))):
        runner = Runner()
        stats = apps.measure_case(case, {"onnx_mini": runner}, True)
        assert len(runner.settled) == 1 and np.array_equal(runner.settled[0]["x"], want)
        assert stats["onnx_mini"]["calls"] >= apps.MIN_CALLS * apps.BLOCKS[True]
