"""Tree-ensemble benchmark: onnx_mini vs onnxruntime vs onnx.reference on a large forest.

    .venv/bin/python benchmarks/bench_trees.py            # full run (under ~3 minutes)
    .venv/bin/python benchmarks/bench_trees.py --quick    # fewer repetitions, fewer reference rows

Case (see benchmarks/README.md, "Tree ensembles"):
  6. a regression forest of 500 complete trees of depth 8 (255 splits and 256 leaves per tree, 127 500
     BRANCH_LEQ splits in all) on 10 000 rows x 20 float32 features, built deterministically with
     onnx.helper in two encodings:
       - TreeEnsembleRegressor, ai.onnx.ml opset 3 (nodes_* / target_* attributes, SUM, base_values);
       - TreeEnsemble, ai.onnx.ml opset 5 (interior nodes and leaves apart, tensor attributes) followed
         by an Add of the same base value.
     onnx.reference walks the trees in Python and is far too slow for 10 000 rows: it is timed, with
     the two other runtimes, on the first REF_ROWS rows (a separate table row), never on the full batch.

Outputs are cross-checked before anything is timed: every runtime against a float64 numpy walk of the
forest written in this script (float32 sums of 500 leaves differ in the last bits, hence a tolerance).
The runners, the table and the formatting come from bench_core.py. The timing is bench_core's median
of repeats after warm-up, but the runtimes take turns call by call (time_round_robin): one call here
lasts 0.1 s to seconds, and on a shared machine block-wise samples measured one runtime in a quiet
minute and the next in a busy one.
"""
from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).parent))
import bench_core as core  # noqa: E402  (shared timing, runners and table)

ML = "ai.onnx.ml"
N_TREES, DEPTH, N_ROWS, N_FEATURES = 500, 8, 10_000, 20
BASE = 0.5
REF_ROWS = {False: 100, True: 20}          # rows onnx.reference is timed on (full, quick)
REPEATS = {False: 9, True: 3}               # calls per runtime on the full batch
SUB_REPEATS = {False: 41, True: 9}          # calls per runtime on the first REF_ROWS rows
REF_REPEATS = {False: 3, True: 1}           # ... except onnx.reference (seconds per call)
RTOL = 1e-5                                 # relative to the largest |output|


# -- the forest -----------------------------------------------------------------------------------

class Forest:
    """N_TREES complete binary trees of depth DEPTH in breadth-first order: node k of a tree has
    children 2k+1 (true branch, x <= threshold) and 2k+2; nodes 0..2^DEPTH-2 split, the 2^DEPTH
    others are leaves. Thresholds are drawn around 0 (the features are standard normal) so that
    every path is taken."""

    def __init__(self, n_trees: int, depth: int, n_features: int, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.n_trees, self.depth = n_trees, depth
        self.n_splits, self.n_leaves = 2 ** depth - 1, 2 ** depth
        self.feature = rng.integers(0, n_features, size=(n_trees, self.n_splits))
        self.threshold = (0.8 * rng.standard_normal((n_trees, self.n_splits))).astype(np.float32)
        self.leaf = (0.01 * rng.standard_normal((n_trees, self.n_leaves))).astype(np.float32)

    def predict(self, x: np.ndarray) -> np.ndarray:
        """float64 [N, 1]: BASE + the sum over trees of the leaf each row reaches (numpy, level by level)."""
        total = np.full(len(x), BASE, np.float64)
        rows = np.arange(len(x))
        for t in range(self.n_trees):
            node = np.zeros(len(x), np.int64)
            for _ in range(self.depth):
                go_false = x[rows, self.feature[t, node]] > self.threshold[t, node]
                node = 2 * node + 1 + go_false
            total += self.leaf[t, node - self.n_splits]
        return total[:, None]

    def regressor_ml3(self) -> onnx.ModelProto:
        n_nodes = self.n_splits + self.n_leaves
        k = np.arange(n_nodes)
        split = k < self.n_splits
        attrs = dict(
            nodes_treeids=np.repeat(np.arange(self.n_trees), n_nodes).tolist(),
            nodes_nodeids=np.tile(k, self.n_trees).tolist(),
            nodes_featureids=np.concatenate([np.concatenate([f, np.zeros(self.n_leaves, np.int64)])
                                             for f in self.feature]).tolist(),
            nodes_values=np.concatenate([np.concatenate([th, np.zeros(self.n_leaves, np.float32)])
                                         for th in self.threshold]).tolist(),
            nodes_modes=np.tile(np.where(split, "BRANCH_LEQ", "LEAF"), self.n_trees).tolist(),
            nodes_truenodeids=np.tile(np.where(split, 2 * k + 1, 0), self.n_trees).tolist(),
            nodes_falsenodeids=np.tile(np.where(split, 2 * k + 2, 0), self.n_trees).tolist(),
            target_treeids=np.repeat(np.arange(self.n_trees), self.n_leaves).tolist(),
            target_nodeids=np.tile(k[~split], self.n_trees).tolist(),
            target_ids=[0] * (self.n_trees * self.n_leaves),
            target_weights=self.leaf.ravel().tolist(),
        )
        node = helper.make_node("TreeEnsembleRegressor", ["X"], ["Y"], domain=ML, n_targets=1,
                                aggregate_function="SUM", base_values=[BASE], post_transform="NONE", **attrs)
        return _model([node], [], 3)

    def ensemble_ml5(self) -> onnx.ModelProto:
        # interior node k of tree t is nodes_* entry t*n_splits + k; leaf j of tree t is leaf_* entry t*n_leaves + j
        k = np.arange(self.n_splits)
        true_child, false_child = 2 * k + 1, 2 * k + 2
        t_leaf, f_leaf = true_child >= self.n_splits, false_child >= self.n_splits
        t_off = np.arange(self.n_trees)[:, None]

        def target(child, is_leaf):
            return np.where(is_leaf, t_off * self.n_leaves + child - self.n_splits, t_off * self.n_splits + child)
        attrs = dict(
            nodes_featureids=self.feature.ravel().tolist(),
            nodes_splits=numpy_helper.from_array(self.threshold.ravel()),
            nodes_modes=numpy_helper.from_array(np.zeros(self.n_trees * self.n_splits, np.uint8)),
            nodes_truenodeids=target(true_child, t_leaf).ravel().tolist(),
            nodes_falsenodeids=target(false_child, f_leaf).ravel().tolist(),
            nodes_trueleafs=np.tile(t_leaf.astype(np.int64), self.n_trees).tolist(),
            nodes_falseleafs=np.tile(f_leaf.astype(np.int64), self.n_trees).tolist(),
            tree_roots=(np.arange(self.n_trees) * self.n_splits).tolist(),
            leaf_targetids=[0] * (self.n_trees * self.n_leaves),
            leaf_weights=numpy_helper.from_array(self.leaf.ravel()),
        )
        nodes = [helper.make_node("TreeEnsemble", ["X"], ["raw"], domain=ML, n_targets=1, aggregate_function=1,
                                  post_transform=0, **attrs),
                 helper.make_node("Add", ["raw", "base"], ["Y"])]
        return _model(nodes, [numpy_helper.from_array(np.array([BASE], np.float32), "base")], 5)


def _model(nodes, initializers, ml_opset: int) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, f"forest_ml{ml_opset}",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", N_FEATURES])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 1])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", core.OPSET),
                                                    helper.make_opsetid(ML, ml_opset)], producer_name="bench_trees")
    model.ir_version = core.IR_VERSION
    onnx.checker.check_model(model)
    return model


# -- the case -------------------------------------------------------------------------------------

def cross_check(runners, outs, expected: np.ndarray, label: str, notes: list[str]) -> None:
    """Every runtime's output must match the float64 numpy walk within RTOL of the output scale."""
    scale = float(np.abs(expected).max()) or 1.0
    for name, out in outs.items():
        if out is None:
            continue
        got = np.asarray(out[0])
        if got.shape != expected.shape:
            runners[name].error = f"output shape {list(got.shape)} != {list(expected.shape)} - not timed"
            notes.append(f"{label}: {name} output has shape {list(got.shape)}, expected {list(expected.shape)}")
            continue
        err = float(np.abs(got.astype(np.float64) - expected).max()) / scale
        if not err <= RTOL:
            runners[name].error = f"output differs from the numpy walk (max rel err {err:.2e}) - not timed"
            notes.append(f"{label}: {name} output DIFFERS from the numpy walk (max rel err {err:.2e})")


def time_round_robin(runners: dict[str, core.Runner], feeds: dict, repeats: dict[str, int]) -> dict:
    """Median seconds per call of each runner, the runners taking turns call by call (the machine is
    shared: load that comes and goes then hits every runtime alike instead of one block of samples).
    No warm-up here: the cross-check run just before was the warm-up. A runner that fails is dropped
    (None) with its error kept, as in Runner.time."""
    samples: dict[str, list[float]] = {name: [] for name, r in runners.items() if r.ok}
    gc_was = gc.isenabled()
    gc.disable()
    try:
        for k in range(max(repeats.values())):
            for name in list(samples):
                if len(samples[name]) >= repeats[name]:
                    continue
                t0 = time.perf_counter()
                try:
                    runners[name].call(feeds)
                except Exception as e:
                    runners[name].error = f"timing failed: {core.short(e)}"
                    del samples[name]
                    continue
                samples[name].append(time.perf_counter() - t0)
    finally:
        if gc_was:
            gc.enable()
    return {name: statistics.median(samples[name]) if samples.get(name) else None for name in runners}


def run_case(table: core.Table, label: str, model: onnx.ModelProto, x: np.ndarray, forest: Forest,
             quick: bool) -> None:
    ref_rows = REF_ROWS[quick]
    print(f"\n[{label}]", flush=True)
    runners = core.make_runners(model)
    setup = f"{label}: setup (prepare / session / evaluator): " + ", ".join(
        f"{n} {core.fmt_time(r.setup_time)}" for n, r in runners.items())
    print("  " + setup, flush=True)
    table.notes.append(setup)

    # full batch: onnx_mini and onnxruntime (onnx.reference is not run on 10 000 rows)
    full, expected = {"X": x}, forest.predict(x)
    reference = runners.pop("onnx.reference")
    outs = {name: r.try_run(full) for name, r in runners.items()}
    cross_check(runners, outs, expected, f"{label}, {len(x)} rows", table.notes)
    times = time_round_robin(runners, full, {name: REPEATS[quick] for name in runners})
    times["onnx.reference"] = None
    table.add(f"{label}, {len(x)} rows", times)

    # subset: all three runtimes
    runners["onnx.reference"] = reference
    sub = {"X": x[:ref_rows]}
    outs = {name: r.try_run(sub) for name, r in runners.items()}
    cross_check(runners, outs, expected[:ref_rows], f"{label}, {ref_rows} rows", table.notes)
    sub_times = time_round_robin(runners, sub, {name: REF_REPEATS[quick] if name == "onnx.reference"
                                                else SUB_REPEATS[quick] for name in runners})
    table.add(f"{label}, first {ref_rows} rows", sub_times)
    core.runner_notes(table, label, runners)

    if core.ort is not None and runners["onnxruntime"].ok and times["onnxruntime"] is not None:
        # onnx_mini runs the forest on one thread: time it again against single-threaded onnxruntime
        pair = {"onnx_mini": runners["onnx_mini"],
                "onnxruntime": core.Runner("onnxruntime", model, intra_op_num_threads=1)}
        ok = pair["onnxruntime"].try_run(full) is not None
        t1 = time_round_robin(pair, full, {n: REPEATS[quick] for n in pair}) if ok else {}
        t1, t_mini = t1.get("onnxruntime"), t1.get("onnx_mini")
        msg = (f"{label}, {len(x)} rows: onnxruntime with intra_op_num_threads=1: {core.fmt_time(t1)}, "
               f"onnx_mini in the same rounds: {core.fmt_time(t_mini)} (onnx_mini/ort = {core.fmt_ratio(t_mini, t1)})")
        print("  " + msg)
        table.notes.append(msg)
    del runners, outs
    gc.collect()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer repetitions, fewer rows for onnx.reference")
    args = p.parse_args(argv)
    start = time.perf_counter()
    print("machine:", core.machine_info())
    forest = Forest(N_TREES, DEPTH, N_FEATURES)
    x = np.random.default_rng(1).standard_normal((N_ROWS, N_FEATURES)).astype(np.float32)
    table = core.Table()
    shape = f"{N_TREES} trees depth {DEPTH}"
    cases = [(f"6a. TreeEnsembleRegressor ml3 {shape}", forest.regressor_ml3),
             (f"6b. TreeEnsemble ml5 {shape}", forest.ensemble_ml5)]
    for label, build in cases:
        try:
            run_case(table, label, build(), x, forest, args.quick)
        except Exception as e:   # one broken case must not hide the other
            table.notes.append(f"{label} aborted: {core.short(e, 300)}")
            print(f"  {label} aborted: {core.short(e, 300)}", flush=True)
        gc.collect()
    core.report(table, args.quick, start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
