"""The strict coverage list: every (domain, op, version) onnx defines that onnx_mini cannot run yet.

missing_ops.txt holds one entry a line, `<domain> <op> <version> | <reason>`. The test fails when a
listed pair has become runnable (remove the line) or an unlisted pair cannot run (a regression), so
the list can only shrink. update_expected_failures.py rewrites it.
"""
from __future__ import annotations

from pathlib import Path

from onnx_mini.coverage import uncovered

MISSING_OPS = Path(__file__).with_name("missing_ops.txt")
HEADER = """\
# Strict coverage list: (domain, op, since_version) pairs of the installed onnx with neither a kernel
# nor a function body whose nodes all run. Format: <domain> <op> <version> | <reason>
# A listed pair that runs fails the test, an unlisted pair that does not run fails it too.
# Regenerate with backend_tests/update_expected_failures.py, then review the diff: it may only shrink.
"""


def current() -> dict[tuple[str, str, int], str]:
    return {(d or "ai.onnx", op, v): why for d, op, v, why in uncovered()}


def read_listed(path: Path = MISSING_OPS) -> dict[tuple[str, str, int], str]:
    listed = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, _, why = (x.strip() for x in line.partition("|"))
        domain, op, version = key.split()
        listed[(domain, op, int(version))] = why
    return listed


def write(path: Path = MISSING_OPS) -> int:
    entries = current()
    path.write_text(HEADER + "".join(f"{d} {op} {v} | {why}\n" for (d, op, v), why in sorted(entries.items())))
    return len(entries)
