"""Regenerate the strict lists (a developer tool, not a test): expected_failures.txt from a run of
the official suite, missing_ops.txt (coverage_list.py) and README's operator table from the registry.

    .venv/bin/python backend_tests/update_expected_failures.py

Runs test_onnx_backend.py with the list ignored and writes one entry per failing test, with the
reason taken from the failure (the missing kernel, or the error raised), or the entry's old
reason when it starts with "known:" (written by hand). Review the diff: the list
must only shrink as operators land.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
HEADER = """\
# Strict expected failures of the official ONNX backend suite (test_onnx_backend.py).
# Format: <test name or regex, matched against the whole name> | <reason>
# Strict: a listed test that passes fails the run; an entry matching no test fails the run too.
# Except a reason starting "random:": the outcome is a matter of chance (the test compares random
# draws with one particular stream), so a pass is allowed and the entry survives regeneration.
# Regenerate with backend_tests/update_expected_failures.py, then review the diff.
"""


class _Collect:
    def __init__(self):
        self.failures: dict[str, str] = {}

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        rep = outcome.get_result()
        if rep.when == "call" and rep.failed and call.excinfo is not None:
            self.failures[item.name] = reason_for(call.excinfo.value)


def reason_for(exc: BaseException) -> str:
    from onnx_mini.errors import UnsupportedOperatorError
    if isinstance(exc, UnsupportedOperatorError):
        return f"not implemented yet: {exc.reason}"
    text = " ".join(str(exc).split())
    if isinstance(exc, AssertionError):
        return f"wrong result: {text[:160]}"
    return f"{type(exc).__name__}: {text[:160]}"


def write_readme_table() -> None:
    import re
    from onnx_mini.cli import operator_table
    readme = HERE.parent / "README.md"
    text = re.sub(r"(<!-- operator-table:start -->\n).*?(\n<!-- operator-table:end -->)",
                  lambda m: m.group(1) + operator_table() + m.group(2), readme.read_text(), flags=re.S)
    readme.write_text(text)


def main() -> int:
    os.environ["ONNX_MINI_IGNORE_EXPECTED_FAILURES"] = "1"
    collect = _Collect()
    pytest.main([str(HERE / "official" / "test_onnx_backend.py"), "-q", "-p", "no:cacheprovider", "-W", "ignore",
                 "--tb=no", "-o", "addopts="], plugins=[collect])
    # A reason written by hand ("known: ...", for a failure that is not onnx_mini's) survives regeneration;
    # a "random: ..." entry stays even when chance made its test pass in this run.
    known = {}
    for line in (HERE / "expected_failures.txt").read_text().splitlines():
        name, _, reason = (x.strip() for x in line.partition("|"))
        if reason.startswith(("known:", "random:")):
            known[name] = reason
    failures = dict(collect.failures)
    failures.update({n: r for n, r in known.items() if r.startswith("random:")})
    lines = [f"{name} | {known.get(name, reason)}" for name, reason in sorted(failures.items())]
    (HERE / "expected_failures.txt").write_text(HEADER + "\n".join(lines) + "\n")
    print(f"wrote {len(lines)} entries to expected_failures.txt", file=sys.stderr)
    sys.path.insert(0, str(HERE))
    import coverage_list
    print(f"wrote {coverage_list.write()} entries to missing_ops.txt", file=sys.stderr)
    write_readme_table()
    return 0


if __name__ == "__main__":
    sys.exit(main())
