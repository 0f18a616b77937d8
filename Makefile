# `make test` and `make demo` are all a newcomer needs: each creates .venv if missing and installs into it.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test demo bench ops clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest backend_tests

# Identifies some of the repo's files with Google's Magika model; the script fetches its wheel
# once with pip (magika==1.0.3, sha256 pinned) into .venv/demo-cache.
demo: $(STAMP)
	$(PY) examples/identify_files.py

bench: $(STAMP)
	$(PY) -m pip install -q -e ".[bench]"
	$(PY) benchmarks/bench_core.py
	$(PY) benchmarks/bench_ops.py
	$(PY) benchmarks/bench_trees.py
	$(PY) benchmarks/bench_suite.py
	$(PY) benchmarks/bench_apps.py
	$(PY) benchmarks/bench_floors.py

ops: $(STAMP)
	$(PY) -m onnx_mini.cli ops

clean:
	rm -rf $(VENV) build *.egg-info
