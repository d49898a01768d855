"""House rules on how the package's modules import each other: no cycle among module-level
imports, and no import of the package's own modules from inside a function (the way a cycle is
usually hidden). Imports inside functions are kept for what is heavy or optional -- Airflow,
Spark, pyarrow -- so the core loads neither (``test_core_imports.py``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[2] / "provider" / "airflow_transactional"
# The Airflow layer, imported lazily by the modules the core and the CLI share.
LAZY_OK = {"airflow_transactional.dag", "airflow_transactional.hooks", "airflow_transactional.assets"}


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ["airflow_transactional", *path.relative_to(PACKAGE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, bool]]:
    """(module of the package imported, whether at module level) of every import in ``path``."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    top_level = {id(node) for node in tree.body}
    top_level |= {id(n) for node in tree.body if isinstance(node, ast.If) for n in node.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            names = [f"{target}.{a.name}" for a in node.names]
            targets = [n for n in names if n in modules] or ([target] if target in modules else [])
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names if a.name in modules]
        else:
            continue
        out += [(t, id(node) in top_level) for t in targets]
    return out


def test_no_import_cycle_among_the_package_modules() -> None:
    modules = _modules()
    graph = {m: {t for t, top in _imports(m, p, modules) if top and t != m} for m, p in modules.items()}
    assert len(graph) > 40 and sum(map(len, graph.values())) > 100  # the probe sees the package

    state: dict[str, int] = {}  # 1: on the path, 2: done
    cycles = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                cycles.append([*path[path.index(t):], t] if t in path else [m, t])
            elif t not in state:
                visit(t, [*path, t])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert cycles == []


def test_no_function_imports_the_package_own_modules_but_the_airflow_layer() -> None:
    modules = _modules()
    lazy = sorted((m, t) for m, p in modules.items() for t, top in _imports(m, p, modules)
                  if not top and t not in LAZY_OK)
    assert lazy == []
