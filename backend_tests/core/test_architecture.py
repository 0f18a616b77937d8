"""The import graph of onnx_mini, read from the source with ast: no cycle anywhere, no import hidden
inside a function to dodge one, and every module importing only its own or earlier layers, in the
order docs/ARCHITECTURE.md draws (load -> graph -> optimise -> resolve -> plan -> execute)."""
from __future__ import annotations

import ast
from pathlib import Path

import onnx_mini

PACKAGE = Path(onnx_mini.__file__).resolve().parent

# Earlier layers first. A module may import modules of its own layer or earlier ones.
LAYERS = [
    ("leaves", ["errors", "dtypes", "graph", "plan"]),
    ("load", ["loader"]),
    ("runtime services", ["parallel", "blas", "memory", "run_scope"]),
    ("kernels", ["registry", "ops", "ops.*"]),
    ("resolve and bind", ["catalog", "custom_ops", "schema_bodies", "resolve", "inline", "binding", "coverage"]),
    ("optimise", ["optimize", "optimize.*", "weight_layout"]),
    ("plan", ["planner"]),
    ("after planning", ["inplace", "schedule"]),
    ("execute", ["executor", "inputs"]),
    ("prepare", ["prepare", "specialize"]),
    ("faces", ["engine", "backend", "ort_api", "session", "compare", "profile", "cli", "__init__"]),
]


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> list[tuple[str, bool]]:
    """(imported onnx_mini module, inside a function?) for each import in the module."""
    tree = ast.parse(path.read_text())
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    if name == "__init__":
        package = []
    found = []

    def visit(node, in_function: bool):
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package[:len(package) - (child.level - 1)]
                elif (child.module or "").startswith("onnx_mini"):
                    base = []
                    child_module = child.module.split(".")[1:]
                    for alias in child.names:
                        found.append((_target(child_module, alias.name), inner))
                    continue
                else:
                    continue
                mod = base + (child.module.split(".") if child.module else [])
                for alias in child.names:
                    found.append((_target(mod, alias.name), inner))
            elif isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name.startswith("onnx_mini."):
                        found.append((alias.name[len("onnx_mini."):], inner))
            visit(child, inner)
    visit(tree, False)
    return [(t, f) for t, f in found if t in MODULES]


def _target(mod: list[str], name: str) -> str:
    full = ".".join(mod + [name])
    return full if full in MODULES else ".".join(mod) or "__init__"


def _layer(module: str) -> int:
    for i, (_, members) in enumerate(LAYERS):
        for m in members:
            if m == module or (m.endswith(".*") and module.startswith(m[:-1])):
                return i
    raise AssertionError(f"module onnx_mini.{module} belongs to no layer: add it to LAYERS and to ARCHITECTURE.md")


def test_every_module_has_a_layer():
    for module in MODULES:
        _layer(module)


def test_no_module_imports_a_later_layer():
    wrong = []
    for module, path in MODULES.items():
        for target, _ in _imports(module, path):
            if _layer(target) > _layer(module):
                wrong.append(f"{module} ({LAYERS[_layer(module)][0]}) imports {target} ({LAYERS[_layer(target)][0]})")
    assert not wrong, "\n".join(wrong)


def test_no_import_cycle():
    graph = {m: {t for t, _ in _imports(m, p) if t != m} for m, p in MODULES.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str):
        state[m] = 1
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(t):] + [t]))
            if t not in state:
                visit(t)
        stack.pop()
        state[m] = 2
    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_function_level_imports_go_only_to_earlier_or_optional_modules():
    """A function-level import may defer an optional or slow import (the CLI's commands), never an
    import of a later layer (that would be a hidden cycle)."""
    wrong = [f"{m} imports {t} inside a function" for m, p in MODULES.items() for t, inner in _imports(m, p)
             if inner and _layer(t) > _layer(m)]
    assert not wrong, "\n".join(wrong)


def test_the_checks_see_imports():
    """The reader finds the imports it should (so that the tests above cannot pass by seeing none)."""
    planner = dict(_imports("planner", MODULES["planner"]))
    assert {"binding", "inline", "plan", "registry"} <= set(planner)
    assert ("ops", False) in _imports("catalog", MODULES["catalog"]) or \
        any(t == "ops" for t, _ in _imports("catalog", MODULES["catalog"]))
    assert any(t == "executor" for t, _ in _imports("prepare", MODULES["prepare"]))
