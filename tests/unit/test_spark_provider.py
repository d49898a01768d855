"""The Spark provider's members the process task relies on (``airflow/spark_provider.py``), checked
on the installed ``apache-airflow-providers-apache-spark``: a provider release that renames or
reshapes one fails here, naming it."""

from __future__ import annotations

import subprocess
import sys
from collections import deque
from typing import Any

import pytest

from airflow_transactional.airflow import spark_provider

pytestmark = pytest.mark.unit


@pytest.fixture
def hook(monkeypatch: pytest.MonkeyPatch) -> Any:
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_PROBE", '{"conn_type": "spark", "host": "spark://127.0.0.1", "port": 7077, '
                                                   '"extra": {"deploy-mode": "client"}}')
    return SparkSubmitHook(conn_id="spark_probe")


def test_every_member_it_names_exists_on_the_hook_and_the_operator(hook: Any) -> None:
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    assert [m for m in spark_provider.MEMBERS if not hasattr(hook, m)] == []
    operator = SparkSubmitOperator(task_id="probe", application="job.py", conn_id="spark_probe", deploy_mode="client")
    assert [m for m in spark_provider.OPERATOR_MEMBERS if not hasattr(operator, m)] == []
    assert spark_provider.deploy_mode_argument(operator) == "client"
    assert spark_provider.master_and_deploy_mode(operator._get_hook()) == ("spark://127.0.0.1:7077", "client")


def test_the_connection_gives_its_master_and_deploy_mode(hook: Any) -> None:
    assert spark_provider.master_and_deploy_mode(hook) == ("spark://127.0.0.1:7077", "client")


def test_the_last_lines_kept_for_an_error_are_the_hooks(hook: Any) -> None:
    assert isinstance(hook._last_submit_log_lines, deque)
    spark_provider.keep_for_error(hook, "  WARN NativeCodeLoader: no native library\n")
    assert list(hook._last_submit_log_lines)[-1] == "WARN NativeCodeLoader: no native library"


def test_the_submit_process_is_killed_only_while_it_runs(hook: Any) -> None:
    assert hook._submit_sp is None
    spark_provider.kill_submit(hook)  # nothing runs yet: nothing to do
    hook._submit_sp = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    spark_provider.kill_submit(hook)
    assert hook._submit_sp.wait(10) != 0
    spark_provider.kill_submit(hook)  # ended: nothing to do


def test_the_output_reader_sees_the_lines_the_hook_would_log(hook: Any) -> None:
    """The hook's own reader still runs (it follows the driver's state from the lines it gets),
    on the lines the replacement lets through."""
    seen: list[str] = []

    def reader(log: Any, lines: Any) -> None:
        log(line for line in lines if "noise" not in line)
        seen.append("done")

    spark_provider.read_log_with(hook, reader)
    hook._process_spark_submit_log(iter(["a noise line\n", "Submitted application app-1\n"]))
    assert seen == ["done"] and list(hook._last_submit_log_lines)[-1:] == ["Submitted application app-1"]
