"""House rules on how modules import each other, in the package, ``bench/`` and ``dev/``: no cycle
among module-level imports; no import of one's own modules from inside a function (the way a
cycle is usually hidden; imports inside functions are kept for what is heavy or optional --
Airflow, Spark, pyarrow -- so the core loads neither, ``test_core_imports.py``); and the layers:

* the bottom -- ``exceptions``, ``identifiers``, ``values``, ``limits``, ``files``, ``faults``, the
  shared vocabulary (``model``) and where connections come from (``connections``) -- imports
  nothing of the package above it;
* ``store`` imports only the bottom and itself (a declaration it takes is a type, not an import);
* ``sources`` and the declaration (``spec``) import the store and the bottom; ``sinks`` (where
  committed output goes beyond the store) only the bottom;
* ``core`` and ``coordinator`` import neither the Airflow layer (``airflow/``) nor the Spark layer
  (``spark/``), which sit on top with the CLI and the pure-Python processor;
* those on top reach the core through its one door (``coordinator``), the declarations and the
  bottom -- never ``core`` or ``store`` -- but for the processes that open their own connection to
  the store (:data:`OWN_CONNECTION`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "provider" / "airflow_transactional"
P = "airflow_transactional"
# The Airflow layer, imported lazily where the CLI and the package's public surface reach it.
LAZY_OK = {f"{P}.airflow.dag", f"{P}.airflow.hooks", f"{P}.airflow.assets", f"{P}.airflow.stalls"}
BOTTOM = {f"{P}.{m}" for m in ("exceptions", "identifiers", "values", "limits", "quarantine", "ranges", "files",
                                "faults", "model", "connections", "provenance")}
DECLARATIONS = {f"{P}.spec", f"{P}.sources", f"{P}.sinks"}
TOP = {f"{P}.{m}" for m in ("airflow", "spark", "processing", "cli", "spark_job")}
# What each layer may import at run time, besides itself (a prefix matches a module and its children).
ALLOWED = {
    "bottom": BOTTOM,
    f"{P}.store": BOTTOM,
    f"{P}.sources": BOTTOM | {f"{P}.store", f"{P}.spec"},
    f"{P}.spec": BOTTOM | {f"{P}.store", f"{P}.sources"},
    f"{P}.sinks": BOTTOM,
    f"{P}.core": BOTTOM | {f"{P}.store", f"{P}.sources", f"{P}.sinks", f"{P}.spec"},
    f"{P}.coordinator": BOTTOM | {f"{P}.store", f"{P}.sources", f"{P}.sinks", f"{P}.spec", f"{P}.core"},
    **{top: BOTTOM | DECLARATIONS | TOP | {f"{P}.coordinator"} for top in TOP},
}
#: What opens its own connection to the store, and the store modules it may use for it: the
#: triggerer's LISTEN for a commit's notice, the executors' COPY of staged rows and their reads.
OWN_CONNECTION = {
    f"{P}.airflow.triggers": {f"{P}.store.connection", f"{P}.store.notices"},
    f"{P}.spark.read": {f"{P}.store.connection"},
    f"{P}.spark.stage": {f"{P}.store.connection"},
}


def _modules(root: Path, prefix: str) -> dict[str, Path]:
    found = {}
    for path in root.rglob("*.py"):
        parts = [prefix, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = {**_modules(PACKAGE, P), **_modules(REPO / "bench", "bench"), **_modules(REPO / "dev", "dev")}


def _imports(name: str, path: Path) -> list[tuple[str, str]]:
    """(module imported, where: "top", "typing" (under ``if TYPE_CHECKING``) or "function") of
    every import in ``path`` of a module of ``MODULES``."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    where: dict[int, str] = {id(node): "top" for node in tree.body}
    for node in tree.body:
        if isinstance(node, ast.If):
            typing = "TYPE_CHECKING" in ast.unparse(node.test)
            where.update({id(n): "typing" if typing else "top" for n in node.body})
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            names = [f"{target}.{a.name}" for a in node.names]
            targets = [n for n in names if n in MODULES] or ([target] if target in MODULES else [])
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names if a.name in MODULES]
        else:
            continue
        out += [(t, where.get(id(node), "function")) for t in targets]
    return out


def _layer(module: str) -> str | None:
    if module in BOTTOM or module.rsplit(".", 1)[0] in BOTTOM:  # a bottom module, or a part of a bottom package
        return "bottom"
    return next((layer for layer in ALLOWED if layer != "bottom" and (module == layer
                                                                        or module.startswith(layer + "."))), None)


def test_no_import_cycle_in_the_package_bench_or_dev() -> None:
    graph = {m: {t for t, at in _imports(m, p) if at == "top" and t != m} for m, p in MODULES.items()}
    assert len(graph) > 80 and sum(map(len, graph.values())) > 150  # the probe sees the whole tree
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


def test_no_function_imports_its_own_tree_but_the_airflow_layer() -> None:
    lazy = sorted((m, t) for m, p in MODULES.items() for t, at in _imports(m, p)
                  if at == "function" and t not in LAZY_OK and t.split(".")[0] == m.split(".")[0])
    assert lazy == []


def test_each_layer_imports_only_the_layers_below_it() -> None:
    """store reaches nothing above it; core and the coordinator never reach Airflow or Spark; Airflow,
    Spark, the processor and the CLI reach the core through the door."""
    broken = []
    for m, p in MODULES.items():
        layer = _layer(m)
        if layer is None:
            continue
        for target, at in _imports(m, p):
            if at == "typing" or _layer(target) == layer or target == P:  # P: the provider's info
                continue
            allowed = ALLOWED[layer] | OWN_CONNECTION.get(m, set())
            if not any(target == ok or target.startswith(ok + ".") for ok in allowed):
                broken.append((m, target))
    assert sorted(broken) == []
    probe = {t for t, _ in _imports(f"{P}.core.commit", PACKAGE / "core" / "commit.py")}
    assert f"{P}.store.state" in probe  # the rule sees the imports it judges
    assert _layer(f"{P}.airflow.operators.commit") == f"{P}.airflow" and _layer(f"{P}.cli") == f"{P}.cli"
