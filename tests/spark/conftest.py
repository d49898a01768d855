"""The spark tier's one Spark Connect server (local[2]), shared by the tests that run a job as its
client -- those about Spark Connect, and the story tests whose subject is not ``spark-submit``: a
client batch pays no JVM start-up."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from dev.embedded import free_port
from dev.sparkconnect import ConnectServer

MODEL_CACHE = "spark_connect_model_cache"  # what a Connect server makes in its JVM's temp dir


@pytest.fixture(scope="package")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    cache = Path("/tmp") / MODEL_CACHE  # the JVM's default temp dir, whatever $TMPDIR says
    before = cache.exists()
    server = ConnectServer(free_port(), tmp_path_factory.mktemp("spark-connect") / "server.log").start()
    try:
        yield server.wait(120)
    finally:
        server.stop()
    # The server kept its scratch (Spark's local dirs, its model cache) beside its log.
    assert before or not cache.exists(), f"the Spark Connect server left {cache}"


@pytest.fixture(scope="package")
def spark_remote(connect_server: ConnectServer) -> str:
    """The server's ``sc://`` URL, its token in it."""
    return connect_server.url


@pytest.fixture
def spark_connect_conn(connect_server: ConnectServer, monkeypatch: pytest.MonkeyPatch) -> str:
    """An Airflow connection (``spark_connect_test``, from the environment) to the server: what
    ``airflow-txn ... --spark-connect`` takes."""
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CONNECT_TEST", json.dumps(connect_server.connection()))
    return "spark_connect_test"
