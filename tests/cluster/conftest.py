"""The cluster tier: the example topologies on Airflow's CeleryExecutor (Redis, two Celery
workers) and a Spark standalone cluster (a master, two one-core workers, and a Spark Connect server
on it when a test starts one), all started here by ``dev.cluster.ClusterStack`` and removed
afterwards."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.chaos.faults import wait_for
from dev.cluster import ClusterStack
from dev.localstack import quiet_daily_schedule
from dev.restclient import RestClient

REPO = Path(__file__).resolve().parents[2]
SPARK_SCRATCH = "spark-*"  # what a driver or an executor names its scratch directory


@pytest.fixture(scope="package")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterStack]:
    base = tmp_path_factory.mktemp("cluster")
    dags = base / "dags"
    dags.mkdir()
    (dags / "words.py").symlink_to(REPO / "dags" / "words.py")
    (dags / "connect_words.py").symlink_to(REPO / "tests" / "cluster" / "dags" / "connect_words.py")
    env = {"AIRFLOW_TXN_EXAMPLE_SCHEDULE": quiet_daily_schedule(), "AIRFLOW_TXN_EXAMPLE_BATCH": "400",
           # Tests arm faults in running tasks and drivers by writing this file (see dev/faults.py).
           "AIRFLOW_TXN_FAULTS_FILE": str(base / "faults.txt")}
    # One task at a time per Celery worker: the two batches held at their faults run in different
    # workers, so losing the one running txid 2's batch leaves txid 3's (a worker running both, as
    # CI once saw with three slots each, loses both: each is retried, and the test's try numbers
    # would be another scenario's).
    # The Spark Connect server (spark_connect_default) runs on the cluster when a test starts it.
    st = ClusterStack(base, dags, env=env, worker_concurrency=1, spark_connect=True, warm_connect=False)
    system_temp = Path(tempfile.gettempdir())
    before = set(system_temp.glob(SPARK_SCRATCH))
    try:
        st.start()
        yield st
    finally:
        st.stop(remove=True)
    # Drivers, executors and killed workers kept their scratch files in the stack's directory.
    assert not set(system_temp.glob(SPARK_SCRATCH)) - before


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call" and report.failed:
        item.stash[FAILED] = True
    return report


FAILED = pytest.StashKey[bool]()


@pytest.fixture(autouse=True)
def _no_run_left_stuck(request: pytest.FixtureRequest, cluster: ClusterStack) -> Iterator[None]:
    """The tier shares one stack: a test that failed with a run of it stuck deletes that run (the
    next plan takes its batch over), so the next tests see their own failures, not this one's."""
    yield
    if not request.node.stash.get(FAILED, False):
        return
    client = cluster.client()
    for dag_id in ("words", "connect_words"):
        for run in client.runs(dag_id):
            if run["state"] not in ("success", "failed"):
                client.delete_run(dag_id, run["dag_run_id"])


def until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    """What ``check`` returns once it is truthy; fails the test saying ``what`` after ``timeout`` s."""
    found = wait_for(check, timeout)
    assert found, f"{what} after {timeout:.0f}s"
    return found


def task_instance(client: RestClient, dag_id: str, run_id: str, task: str) -> dict[str, Any]:
    return next(ti for ti in client.task_instances(dag_id, run_id) if ti["task_id"] == task)
