"""The cluster tier: the example topologies on Airflow's CeleryExecutor (Redis, two Celery
workers) and a Spark standalone cluster (a master, two one-core workers), all started here by
``dev.cluster.ClusterStack`` and removed afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dev.cluster import ClusterStack
from dev.localstack import quiet_daily_schedule

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="package")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterStack]:
    base = tmp_path_factory.mktemp("cluster")
    dags = base / "dags"
    dags.mkdir()
    (dags / "words.py").symlink_to(REPO / "dags" / "words.py")
    env = {"AIRFLOW_TXN_EXAMPLE_SCHEDULE": quiet_daily_schedule(), "AIRFLOW_TXN_EXAMPLE_BATCH": "400",
           # Tests arm faults in running tasks and drivers by writing this file (see dev/faults.py).
           "AIRFLOW_TXN_FAULTS_FILE": str(base / "faults.txt")}
    st = ClusterStack(base, dags, env=env)
    try:
        st.start()
        yield st
    finally:
        st.stop(remove=True)
