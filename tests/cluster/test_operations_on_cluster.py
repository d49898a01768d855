"""What an operator does, on the cluster stack: a backfill over three dates made by Airflow over
REST (its runs on the Celery workers, their batches on the Spark cluster, three in flight), a
committed run cleared and run again. Every txid commits once, in txid order; the cleared run's
commit finds its txid committed and changes nothing; the counts grow by exactly the events
appended."""

from __future__ import annotations

import json
import time
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from airflow_transactional import EventLog
from airflow_transactional.coordinator import Coordinator
from dev.cluster import ClusterStack
from dev.localstack import on_schedule
from tests.cluster.conftest import until
from tests.e2e.conftest import task_log, wait_for_runs
from tests.helpers import query

pytestmark = pytest.mark.cluster

DAG = "words"
DAY0 = datetime(2025, 3, 1, tzinfo=UTC)


def test_a_backfill_and_a_clear_on_the_cluster_commit_each_txid_once_in_order(cluster: ClusterStack) -> None:
    client, dsn = cluster.client(), cluster.state_dsn
    events = [(f"bf{i}", json.dumps({"url": f"https://example.com/b/{i % 11}", "user": "b"})) for i in range(1000)]
    log = EventLog(dsn, "tweets")
    log.create(4)
    client.wait_for_dag(DAG)
    client.unpause(DAG)
    coord = Coordinator(dsn)
    try:
        wait_for_runs(cluster, DAG, [r["dag_run_id"] for r in until(lambda: client.runs(DAG), 180, "no run")],
                      timeout=600)  # the scheduled run unpausing made (it registers the topology)
        before = coord.status(DAG).committed_txid
        counts = dict(query(dsn, "SELECT url, value FROM url_counts"))
        log.append(events)
        day = on_schedule(DAY0, cluster.extra_env["AIRFLOW_TXN_EXAMPLE_SCHEDULE"])
        backfill = client.post("/api/v2/backfills", {"dag_id": DAG, "from_date": day.isoformat(),
                                                     "to_date": (day + timedelta(days=2)).isoformat(),
                                                     "max_active_runs": 3, "reprocess_behavior": "none"})
        assert backfill["dag_id"] == DAG
        deadline = time.monotonic() + 300
        while len(made := [r for r in client.runs(DAG) if r["run_type"] == "backfill"]) < 3:
            assert time.monotonic() < deadline, f"the backfill made {len(made)} runs of 3"
            time.sleep(2)
        wait_for_runs(cluster, DAG, [r["dag_run_id"] for r in made], timeout=600)
        while coord.status(DAG).lag:  # what the backfill's three batches of 400 left
            wait_for_runs(cluster, DAG, [client.trigger(DAG, None)["dag_run_id"]], timeout=300)
        commits = [c for c in coord.commits(DAG) if c["txid"] > before]
        # A committed run of the backfill cleared: its tasks run again, and its commit is a no-op.
        first = commits[0]["run_key"]
        client.clear(DAG, first)
        wait_for_runs(cluster, DAG, [first], timeout=300)
        after = coord.commits(DAG)
    finally:
        coord.close()
        log.close()
    assert [c["txid"] for c in commits] == list(range(before + 1, before + 1 + len(commits)))
    assert [c["committed_at"] for c in commits] == sorted(c["committed_at"] for c in commits)
    assert {c["run_key"] for c in commits[:3]} == {r["dag_run_id"] for r in made}  # the backfill's, first
    assert [c["txid"] for c in after] == list(range(1, before + 1 + len(commits)))  # the clear added none
    assert "already committed" in task_log(cluster, DAG, first, "commit")
    grew = Counter({url: n - counts.get(url, 0) for url, n in query(dsn, "SELECT url, value FROM url_counts")})
    assert +grew == Counter(json.loads(p)["url"] for _e, p in events)
    assert sum(c["records_read"] for c in commits) == len(events)
