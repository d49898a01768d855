"""What a Spark standalone master accepts from the process task: client deploy mode (the driver in
the Celery worker that runs the task: ``test_lost_nodes.py``); cluster deploy mode of a Python
application Spark refuses, and the task refuses it first, naming the fix."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from airflow_transactional.exceptions import ConfigError
from dev.cluster import ClusterStack
from tests.spark.test_spark_job import WORDS

pytestmark = pytest.mark.cluster


def test_cluster_mode_is_refused_before_spark_refuses_it(cluster: ClusterStack,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Spark refuses a Python application in cluster mode on a standalone master (after a JVM
    start); the process task refuses it first, naming the fix. Should Spark one day accept it, the
    first half fails and the refusal can go."""
    from airflow_transactional.airflow.operators import TransactionalSparkSubmitOperator

    master = cluster.spark.url
    res = subprocess.run(["spark-submit", "--master", master, "--deploy-mode", "cluster", WORDS], text=True,
                         capture_output=True, timeout=120, env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"})
    assert res.returncode != 0
    assert "Cluster deploy mode is currently not supported for python applications on standalone clusters" in (
        res.stdout + res.stderr)
    host, port = master.rsplit(":", 1)
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CLUSTER", json.dumps(
        {"conn_type": "spark", "host": host, "port": int(port), "extra": {"deploy-mode": "cluster"}}))
    task = TransactionalSparkSubmitOperator(task_id="process", topology={"topology_id": "words"}, application=WORDS,
                                            conn_id="spark_cluster", name="txn-words")
    with pytest.raises(ConfigError, match=f"standalone master \\({master}\\) runs Python applications in client "
                       "mode only: set deploy-mode to client in the Spark connection"):
        task.prepare_submit(1, "airflow_txn", "dbname=x")
