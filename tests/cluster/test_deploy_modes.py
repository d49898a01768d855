"""What a Spark standalone master accepts from the process task: client deploy mode (the driver in
the Celery worker that runs the task: ``test_lost_nodes.py``); cluster deploy mode of a Python
application Spark refuses, and the task refuses it first, naming the fix. And what it accepts from
another local user: nothing."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from airflow_transactional.exceptions import ConfigError
from dev.cluster import ClusterStack
from tests.helpers import NOBODY_PYTHON
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


FOREIGN_APP = """
import os
from pyspark.sql import SparkSession
spark = SparkSession.builder.appName("foreign-{nonce}").getOrCreate()
print("RAN as uid", spark.sparkContext.parallelize([1], 1).map(lambda _: os.getuid()).collect(), flush=True)
"""


def test_the_master_runs_no_application_of_another_local_user(cluster: ClusterStack, tmp_path: Path) -> None:
    """Regression: the stack's master accepted an application from ``nobody``, whose executor ran
    as root (and read /etc/shadow); it also took applications over its REST port. Now the cluster
    shares a secret that only the stack's own processes can read."""
    import pyspark

    nonce = secrets.token_hex(4)
    scratch = Path(tempfile.mkdtemp(prefix="foreign-", dir="/tmp"))  # nobody's own: its app and its driver's files
    app = scratch / "app.py"
    app.write_text(FOREIGN_APP.format(nonce=nonce))
    shutil.chown(app, "nobody")
    shutil.chown(scratch, "nobody")
    home = os.path.dirname(pyspark.__file__)
    env = ["SPARK_LOCAL_IP=127.0.0.1", f"SPARK_HOME={home}", f"PYSPARK_PYTHON={NOBODY_PYTHON}", "HOME=/tmp",
           f"TMPDIR={scratch}", f"SPARK_LOCAL_DIRS={scratch}", f"SPARK_SUBMIT_OPTS=-Djava.io.tmpdir={scratch}"]
    submit = subprocess.Popen(["runuser", "-u", "nobody", "--", "env", *env, f"{home}/bin/spark-submit", "--master",
                               cluster.spark.url, "--conf", "spark.ui.enabled=false", str(app)], cwd=scratch,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    seen: list[str] = []
    try:
        assert submit.stdout is not None
        deadline = time.monotonic() + 90
        for line in submit.stdout:  # until it ran, or was turned away, or gave up
            seen.append(line.rstrip())
            if "RAN as uid" in line or "Failed to connect to master" in line or time.monotonic() > deadline:
                break
    finally:
        os.killpg(submit.pid, signal.SIGKILL)
        submit.wait(30)
        shutil.rmtree(scratch)
    assert not [line for line in seen if "RAN as uid" in line], "nobody's application ran on the cluster"
    assert any("Failed to connect to master" in line for line in seen), "\n".join(seen[-20:])
    master_log = (cluster.spark.base_dir / "master.log").read_text(errors="replace")
    assert f"foreign-{nonce}" not in master_log
    assert "Started REST server" not in master_log  # no REST submission port beside the RPC
    defaults = cluster.spark.conf_dir / "spark-defaults.conf"
    assert stat.S_IMODE(defaults.stat().st_mode) == 0o600
    assert stat.S_IMODE(cluster.spark.conf_dir.stat().st_mode) == 0o700


def test_a_landing_file_named_as_a_glob_is_read_literally_by_the_clusters_executors(
        cluster: ClusterStack, tmp_path: Path) -> None:
    """Regression: executors on the standalone cluster opened the planned landing names as Spark
    globs, and the txid that planned ``[ab].json`` read ``a.json`` and ``b.json`` instead."""
    from airflow_transactional.spark.submit import provider_zip
    from tests.spark.test_spark_connect import landing_glob_names

    landing = tmp_path / "landing"
    landing.mkdir()
    landing_glob_names(cluster.state_dsn, "globs_cluster", landing, lambda t: subprocess.run(
        ["spark-submit", "--master", cluster.spark.url, "--conf", "spark.ui.enabled=false", "--py-files",
         provider_zip(), WORDS, "--topology", "globs_cluster", "--txid", str(t)],
        env={**cluster.spark.env(), "AIRFLOW_TXN_DSN": cluster.state_dsn}, capture_output=True, text=True,
        timeout=300, cwd=tmp_path))
