"""The transaction core is plain Python over Postgres: importing it loads neither Airflow nor Spark
(the house rule that keeps it testable, and cheap for producers that only append to a log)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

CORE = ["airflow_transactional", "airflow_transactional.coordinator", "airflow_transactional.spec",
        "airflow_transactional.values", "airflow_transactional.sources", "airflow_transactional.store.state",
        "airflow_transactional.store.migrations", "airflow_transactional.store.privileges",
        "airflow_transactional.processing", "airflow_transactional.files",
        "airflow_transactional.spark.submit", "airflow_transactional.identifiers", "airflow_transactional.exceptions"]


def test_importing_the_core_loads_neither_airflow_nor_pyspark() -> None:
    probe = ("import importlib, json, sys\n"
             f"for m in {CORE!r}: importlib.import_module(m)\n"
             "print(json.dumps(sorted({n.split('.')[0] for n in sys.modules} & {'airflow', 'pyspark'})))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    assert json.loads(out.stdout) == []


def test_the_probe_would_see_airflow_if_the_dag_api_were_imported() -> None:
    probe = "import sys, airflow_transactional.airflow.dag; print('airflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=300)
    assert out.stdout.strip().endswith("True")
