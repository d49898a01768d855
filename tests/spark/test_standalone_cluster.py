"""The same job on a real Spark standalone cluster (a master and a worker started from the pinned
pyspark install): the provider reaches the executors through ``--py-files`` and the state equals
the oracle."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_transactional import EventLog
from airflow_transactional.coordinator import Coordinator
from dev.embedded import free_port
from tests.helpers import query
from tests.spark.test_spark_job import WORDS, _spec, _tweets

pytestmark = pytest.mark.spark


def _wait_port(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise AssertionError(f"nothing listens on {port}")


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    port = free_port()
    logs = tmp_path_factory.mktemp("spark-cluster")
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
           "SPARK_WORKER_DIR": str(logs / "work")}
    master = subprocess.Popen(["spark-class", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                               "--port", str(port), "--webui-port", str(free_port())],
                              env=env, stdout=open(logs / "master.log", "wb"), stderr=subprocess.STDOUT)
    _wait_port(port)
    url = f"spark://127.0.0.1:{port}"
    worker = subprocess.Popen(["spark-class", "org.apache.spark.deploy.worker.Worker", url, "--cores", "2",
                               "--memory", "2g", "--host", "127.0.0.1", "--webui-port", str(free_port())],
                              env=env, stdout=open(logs / "worker.log", "wb"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while "Successfully registered with master" not in (logs / "worker.log").read_text(errors="replace"):
            assert time.monotonic() < deadline, (logs / "worker.log").read_text()[-2000:]
            time.sleep(0.5)
        yield url, logs / "work"
    finally:
        for p in (worker, master):
            p.terminate()
            p.wait(30)


def test_words_job_on_a_standalone_cluster(dsn: str, spark_cluster: tuple[str, Path]) -> None:
    from airflow_transactional.spark.submit import provider_zip

    master, work_dir = spark_cluster
    log = EventLog(dsn, "tweets")
    log.create(2)
    good = _tweets(900)
    log.append(good)
    coord = Coordinator(dsn)
    coord.register(_spec(max_batch_size=1000))
    t = coord.plan("words", "r1").txid
    res = subprocess.run(
        ["spark-submit", "--master", master, "--conf", "spark.ui.enabled=false",
         "--conf", "spark.sql.shuffle.partitions=4", "--conf", "spark.executor.memory=1g",
         "--py-files", provider_zip(), WORDS, "--topology", "words", "--txid", str(t)],
        env={**os.environ, "AIRFLOW_TXN_DSN": dsn, "PYSPARK_PYTHON": sys.executable,
             "SPARK_LOCAL_IP": "127.0.0.1"}, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    coord.commit("words", t)
    urls = Counter(json.loads(p)["url"] for _e, p in good)
    assert dict(query(dsn, "SELECT url, value FROM url_counts")) == urls
    # The work ran in an executor the worker launched, which got the provider through --py-files.
    executors = list(work_dir.glob("app-*/*/stderr"))
    assert executors, "no executor ran on the worker"
    assert any("airflow_transactional" in p.parent.joinpath("stderr").read_text(errors="replace")
               or list(p.parent.glob("airflow_transactional-*.zip")) for p in executors)
    coord.close()
    log.close()
