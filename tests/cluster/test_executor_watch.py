"""A driver on the standalone cluster that has no executor while its job runs -- here, executors
asked for more memory than any worker has, as after a master restart that turned the
application's executors away -- is failed by its watch with the reason, instead of waiting for
ever (and holding its txid, and every txid behind it)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from airflow_transactional.spark.watch import PATIENCE_ENV
from dev.cluster import ClusterStack

pytestmark = pytest.mark.cluster

STARVED_APP = """
from pyspark.sql import SparkSession
from airflow_transactional.spark.watch import watched
spark = SparkSession.builder.appName("starved").getOrCreate()
with watched(spark):
    print("COUNTED", spark.range(1000, numPartitions=2).count(), flush=True)
"""


def test_a_driver_left_without_executors_fails_naming_why(cluster: ClusterStack, tmp_path: Path) -> None:
    app = tmp_path / "starved.py"
    app.write_text(STARVED_APP)
    res = subprocess.run(["spark-submit", "--master", cluster.spark.url, "--conf", "spark.ui.enabled=false",
                          "--conf", "spark.executor.memory=64g", str(app)],  # no worker has that much
                         env={**cluster.spark.env(), PATIENCE_ENV: "10"}, capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)  # without the watch: waits for ever (killed here)
    assert res.returncode != 0
    assert not [line for line in res.stdout.splitlines() if line.startswith("COUNTED ")]  # the job never ran
    said = res.stdout + res.stderr  # the traceback goes where spark-submit sends the driver's
    assert "NoExecutors: the driver had no executor for 1" in said, said[-3000:]
    assert "its jobs are cancelled so that a retry starts a new driver" in said
