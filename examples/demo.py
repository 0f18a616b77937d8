"""End-to-end demo: a small ONNX model that reorders, reshapes and summarises a sales table.

The model (built here with onnx.helper, saved to examples/sales_report.onnx, then loaded back from
disk by onnx_mini) takes monthly sales of several stores and, for each store, the order in which
its months should be listed (best month first). It
  1. reorders each store's months with GatherElements (axis 1),
  2. adds a fixed bonus to every figure with Add,
  3. reads the table's shape with Shape and regroups the months into quarters with Reshape.
"""
from __future__ import annotations

import os

import numpy as np
from onnx import TensorProto, helper, numpy_helper, save

import onnx_mini

HERE = os.path.dirname(os.path.abspath(__file__))
MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
STORES = ["Lyon", "Oslo", "Kyoto"]


def build_model():
    F, I64 = TensorProto.FLOAT, TensorProto.INT64
    nodes = [
        helper.make_node("GatherElements", ["sales", "order"], ["ranked"], axis=1, name="rank_months"),
        helper.make_node("Add", ["ranked", "bonus"], ["with_bonus"], name="add_bonus"),
        helper.make_node("Shape", ["sales"], ["n_stores"], end=1, name="count_stores"),
        helper.make_node("Reshape", ["with_bonus", "quarters_shape"], ["by_quarter"], name="to_quarters"),
    ]
    graph = helper.make_graph(
        nodes, "sales_report",
        [helper.make_tensor_value_info("sales", F, ["stores", 12]),
         helper.make_tensor_value_info("order", I64, ["stores", 12])],
        [helper.make_tensor_value_info("by_quarter", F, ["stores", 4, 3]),
         helper.make_tensor_value_info("n_stores", I64, [1])],
        [numpy_helper.from_array(np.array(0.5, np.float32), "bonus"),
         numpy_helper.from_array(np.array([0, 4, 3], np.int64), "quarters_shape")])  # 0 = keep stores
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def main():
    path = os.path.join(HERE, "sales_report.onnx")
    save(build_model(), path)
    rng = np.random.default_rng(7)
    sales = rng.integers(20, 100, size=(len(STORES), 12)).astype(np.float32)
    order = np.argsort(-sales, axis=1, kind="stable")            # best month first
    order[:, -1] -= 12                                            # negative indices count from the end
    model = onnx_mini.prepare(path)
    out = model.run({"sales": sales, "order": order})
    print(f"onnx_mini {onnx_mini.__version__}: ran {path} ({len(model.plan.steps)} steps)")
    print(f"stores in the table: {int(out['n_stores'][0])}")
    for s, store in enumerate(STORES):
        ranked = [MONTHS[i] for i in (order[s] % 12)]
        print(f"\n{store}: months from best to worst, sales + 0.5 bonus, in groups of three")
        for q, group in enumerate(out["by_quarter"][s]):
            names = ranked[3 * q: 3 * q + 3]
            print("   " + "   ".join(f"{m} {v:6.1f}" for m, v in zip(names, group)))
    expected = np.take_along_axis(sales, order % 12, axis=1) + 0.5
    assert np.array_equal(out["by_quarter"].reshape(len(STORES), 12), expected)
    print("\nchecked against numpy: identical")


if __name__ == "__main__":
    main()
