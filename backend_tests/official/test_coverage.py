"""Coverage is strict: missing_ops.txt lists exactly the (domain, op, version) pairs that cannot run."""
import onnx.defs

import coverage_list as cov


def test_missing_ops_list_is_exact(capsys):
    now, listed = cov.current(), cov.read_listed()
    total = len(onnx.defs.get_all_schemas_with_history())
    with capsys.disabled():
        print(f"\ncoverage: {total - len(now)}/{total} (domain, op, version) pairs run "
              f"(kernel or function body); {len(now)} listed in missing_ops.txt")
    fixed = sorted(set(listed) - set(now))
    broken = sorted(set(now) - set(listed))
    assert not fixed, f"these run now, remove them from missing_ops.txt: {fixed}"
    assert not broken, f"these cannot run and are not listed (a regression?): {[(k, now[k]) for k in broken]}"


def test_every_entry_has_a_reason():
    assert all(why for why in cov.read_listed().values())
