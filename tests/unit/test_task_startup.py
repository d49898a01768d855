"""What a task process pays before it runs: the DAG file's parse, and the calls to Airflow's API.
A LocalExecutor task is a fork of a worker the scheduler forked after loading the plugins, and it
parses its DAG file again; the orchestration tax per transaction (``bench.perf``, section
``scale``) was mostly these. The figures live in the benchmark; these tests hold the mechanisms."""

from __future__ import annotations

import inspect
import subprocess
import sys
from datetime import timedelta
from typing import Any

import pytest

from airflow_transactional import PostgresLogSource, StateSpec, transactional_dag
from airflow_transactional.airflow.hooks import TransactionalHook

pytestmark = pytest.mark.unit


def test_loading_the_plugin_imports_the_operators_so_forked_task_processes_start_with_them() -> None:
    probe = ("import sys, airflow_transactional.airflow.ui.plugin\n"
             "print('airflow_transactional.airflow.operators.process' in sys.modules,"
             " 'airflow.providers.apache.spark.operators.spark_submit' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=300)
    assert out.stdout.split()[-2:] == ["True", "True"]


def test_declaring_a_topology_reads_no_source_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: the DAG file's directory came from ``inspect.stack()``, which reads the source
    of every frame's module -- a tenth of a CPU-second per DAG in every task process."""
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("inspect.stack() at DAG-parse time")

    monkeypatch.setattr(inspect, "stack", refuse)
    dag = transactional_dag("t_startup", source=PostgresLogSource("tweets"),
                            states=[StateSpec("c", {"k": "text"}, combiner="count")],
                            application="../../spark_jobs/words.py", schedule=timedelta(minutes=5))
    # relative to this file (tests/unit/), as the application of a DAG file is
    assert dag.get_task("process").application.endswith("/spark_jobs/words.py")


def test_a_hook_asks_airflow_for_its_connection_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk import Connection

    asked: list[str] = []

    def get_connection(conn_id: str) -> Connection:
        asked.append(conn_id)
        return Connection(conn_id=conn_id, conn_type="transactional", host="db", port=5433, login="app",
                          password="pw", schema="analytics", extra='{"state_schema": "txn"}')

    monkeypatch.setattr(TransactionalHook, "get_connection", staticmethod(get_connection))
    hook = TransactionalHook("store")
    assert "host=db" in hook.get_dsn() and hook.state_schema() == "txn" and "port=5433" in hook.get_dsn()
    assert asked == ["store"]
