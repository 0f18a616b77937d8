"""The command line, the demo, and the README's generated operator table."""
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx

from onnx_mini.cli import main, operator_table

ROOT = Path(__file__).resolve().parent.parent


def test_readme_operator_table_is_generated_from_registry():
    readme = (ROOT / "README.md").read_text()
    table = re.search(r"<!-- operator-table:start -->\n(.*?)\n<!-- operator-table:end -->", readme, re.S)
    assert table is not None, "README lost its operator-table markers"
    assert table.group(1) == operator_table(), "README operator table is stale: paste `onnx-mini ops`"


def test_demo_runs_and_checks_itself():
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "demo.py")], capture_output=True, text=True,
                         check=True).stdout
    assert "stores in the table: 3" in out and "identical" in out


def test_make_demo_classifies_with_the_light_resnet50():
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "classify.py")], capture_output=True, text=True,
                         check=True).stdout
    assert "light ResNet-50" in out and "top-5" in out and re.search(r"run \d+\.\d ms", out)
    assert "same top-5 as onnxruntime: True" in out or "onnxruntime is not installed" in out


def test_cli_info_run_ops(tmp_path, capsys):
    sys.path.insert(0, str(ROOT / "examples"))
    import demo
    path = tmp_path / "m.onnx"
    onnx.save(demo.build_model(), path)
    sales = np.arange(24, dtype=np.float32).reshape(2, 12)
    np.save(tmp_path / "sales.npy", sales)
    np.save(tmp_path / "order.npy", np.tile(np.arange(12)[::-1], (2, 1)))
    assert main(["info", str(path)]) == 0
    assert "sales: tensor(float) ['stores', 12]" in capsys.readouterr().out
    assert main(["run", str(path), "-i", f"sales={tmp_path / 'sales.npy'}", "-i",
                 f"order={tmp_path / 'order.npy'}", "-o", "ranked"]) == 0
    out = capsys.readouterr().out
    assert "ranked: float32[2, 12]" in out and "[11. 10.  9." in out
    assert main(["ops"]) == 0 and "| ai.onnx | Reshape |" in capsys.readouterr().out
    assert main(["info", str(tmp_path / "missing.onnx")]) == 1
    assert "cannot read model file" in capsys.readouterr().err
