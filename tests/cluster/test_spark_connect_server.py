"""The Spark Connect server lost under a batch, survived exactly once: ``connect_words`` runs its
batches on a Spark Connect server that is an application of the standalone cluster (its driver on
this host, its executor on a Spark worker), from a client in a Celery worker. The server is
SIGKILLed while it runs a query of txid 2's batch -- a task of it running on the executor -- and
started again, as a supervisor would. The batch's try fails; Airflow's retry runs a new attempt on
the new server; txid 2 commits once, and the counts equal the log's."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from airflow_transactional import EventLog
from airflow_transactional.coordinator import Coordinator
from dev.cluster import ClusterStack
from tests.cluster.conftest import task_instance, until
from tests.e2e.conftest import wait_for_runs
from tests.helpers import query

pytestmark = pytest.mark.cluster

DAG = "connect_words"  # tests/cluster/dags/connect_words.py
TWEETS = [(f"c{i}", json.dumps({"url": f"https://{['apache.org', 'Example.com'][i % 2]}/c/{i % 17}", "user": "u"}))
          for i in range(400)]  # one batch: txid 2


def _hold_txid_2(cluster: ClusterStack) -> tuple[Path, Path]:
    """A fault that holds txid 2's batch once its attempt is open, before its first query: the file
    that releases it, and the marker the fault leaves when it fires."""
    holds = cluster.base_dir / "connect-holds"
    holds.mkdir()
    release, fired = holds / "release", holds / "fired"
    Path(cluster.extra_env["AIRFLOW_TXN_FAULTS_FILE"]).write_text(
        f"spark.begin:{DAG}:2=waitfor:{release}@once:{fired}\n")
    return release, fired


def test_a_batch_survives_the_spark_connect_server_lost_under_it(cluster: ClusterStack) -> None:
    client, dsn = cluster.client(), cluster.state_dsn
    cluster.start_spark_connect()
    release, fired = _hold_txid_2(cluster)
    log = EventLog(dsn, "ctweets")
    log.create(2)
    coord = Coordinator(dsn)
    try:
        client.wait_for_dag(DAG)
        client.unpause(DAG)  # Airflow's scheduled run plans txid 1, empty: no Spark job
        scheduled = until(lambda: client.runs(DAG), 180, "Airflow scheduled no run")
        wait_for_runs(cluster, DAG, [r["dag_run_id"] for r in scheduled], timeout=300)
        log.append(TWEETS)
        run = client.trigger(DAG, (datetime.now(UTC) - timedelta(hours=3)).isoformat())["dag_run_id"]
        until(fired.exists, 300, "txid 2's batch did not reach its fault")
        # The batch runs on the cluster: the server's executor is on a Spark worker.
        assert sum(cluster.spark.executors().values()) == 1, cluster.spark.executors()
        started = cluster.spark.tasks_started()
        release.touch()
        until(lambda: cluster.spark.tasks_started() > started, 120, "no task of txid 2's batch started")
        cluster.kill_spark_connect()
        lost = datetime.now(UTC)
        cluster.start_spark_connect()
        wait_for_runs(cluster, DAG, [run], timeout=300)
        commits = coord.commits(DAG)
        attempts = query(dsn, "SELECT attempt, status FROM airflow_txn.attempts WHERE topology_id = %s AND txid = 2 "
                              "ORDER BY attempt", (DAG,))
    finally:
        coord.close()
        log.close()
        cluster.stop_component("spark-connect")
    assert [c["txid"] for c in commits] == [1, 2]
    assert dict(query(dsn, "SELECT url, value FROM connect_url_counts")) == Counter(
        json.loads(p)["url"] for _e, p in TWEETS)
    # What Airflow did: the try whose server was lost failed (the client: "INVALID_HANDLE.SESSION_NOT_FOUND
    # on the server but responses were already received from it"), and its retry committed.
    assert task_instance(client, DAG, run, "process")["try_number"] == 2
    # What the topology did: the lost attempt never finished; a new one was committed.
    assert len(attempts) == 2 and attempts[0][1] != "committed" and attempts[1][1] == "committed", attempts
    print(f"txid 2: lost the Spark Connect server under its batch; committed "
          f"{(commits[-1]['committed_at'] - lost).total_seconds():.0f} s later (a server restart, a retry)")
