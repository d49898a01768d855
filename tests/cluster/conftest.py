"""The cluster tier: the example topologies on Airflow's CeleryExecutor (Redis, two Celery
workers) and a Spark standalone cluster (a master, two one-core workers), all started here by
``dev.cluster.ClusterStack`` and removed afterwards."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from dev.cluster import ClusterStack
from dev.localstack import quiet_daily_schedule

REPO = Path(__file__).resolve().parents[2]
SPARK_SCRATCH = "spark-*"  # what a driver or an executor names its scratch directory


@pytest.fixture(scope="package")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterStack]:
    base = tmp_path_factory.mktemp("cluster")
    dags = base / "dags"
    dags.mkdir()
    (dags / "words.py").symlink_to(REPO / "dags" / "words.py")
    env = {"AIRFLOW_TXN_EXAMPLE_SCHEDULE": quiet_daily_schedule(), "AIRFLOW_TXN_EXAMPLE_BATCH": "400",
           # Tests arm faults in running tasks and drivers by writing this file (see dev/faults.py).
           "AIRFLOW_TXN_FAULTS_FILE": str(base / "faults.txt")}
    # One task at a time per Celery worker: the two batches held at their faults run in different
    # workers, so losing the one running txid 2's batch leaves txid 3's (a worker running both, as
    # CI once saw with three slots each, loses both: each is retried, and the test's try numbers
    # would be another scenario's).
    st = ClusterStack(base, dags, env=env, worker_concurrency=1)
    system_temp = Path(tempfile.gettempdir())
    before = set(system_temp.glob(SPARK_SCRATCH))
    try:
        st.start()
        yield st
    finally:
        st.stop(remove=True)
    # Drivers, executors and killed workers kept their scratch files in the stack's directory.
    assert not set(system_temp.glob(SPARK_SCRATCH)) - before
