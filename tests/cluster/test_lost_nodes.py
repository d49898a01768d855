"""Nodes of a cluster lost mid-batch, each survived exactly once: the words example on Airflow's
CeleryExecutor and a Spark standalone cluster, while the test kills -- SIGKILL to a whole process
tree, as a host that is gone -- the Celery worker running txid 2's batch (its Spark driver with
it), the Spark worker running txid 3's executor, and the node running txid 4's commit inside its
Postgres transaction (the Celery worker, or the triggerer when the commit waited long enough to be
committed by its trigger). Every txid commits once, in txid order, the counts equal the
log's, and each failure's time to recover is printed."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import redis

from airflow_transactional import EventLog
from airflow_transactional.coordinator import Coordinator
from dev.cluster import ClusterStack, descendants
from dev.restclient import RestClient
from tests.cluster.conftest import task_instance, until
from tests.e2e.conftest import task_log, wait_for_runs
from tests.helpers import query

pytestmark = pytest.mark.cluster

DAG = "words"
TWEETS = [(f"tw{i}", json.dumps({"url": f"https://{['apache.org', 'Example.com'][i % 2]}/p/{i % 13}", "user": "u"}))
          for i in range(1200)]  # three full batches of 400: txids 2, 3 and 4


def _ti(client: RestClient, run_id: str, task: str) -> dict[str, Any]:
    return task_instance(client, DAG, run_id, task)


def _lose_the_celery_worker_running(cluster: ClusterStack, client: RestClient, run_id: str, task: str) -> str:
    """Kill the Celery worker whose process tree runs ``task`` of ``run_id`` (held at a fault), and
    start a replacement; the worker's name."""
    pid = until(lambda: _ti(client, run_id, task).get("pid"), 60, f"no pid for {task} of {run_id}")
    worker = cluster.worker_of(pid)
    assert worker is not None, f"{task} of {run_id} (pid {pid}) runs in no Celery worker"
    cluster.kill_worker(worker)
    cluster.start_component(worker)
    cluster.wait_worker(worker)
    return worker


def _lose_the_node_committing(cluster: ClusterStack, holder: int) -> str:
    """Kill what holds a commit inside its transaction (``holder``: the pid its fault wrote) and
    start a replacement: the Celery worker running the commit task or -- when the commit waited
    for its turn long enough to defer, its trigger committing it -- the triggerer. What was lost."""
    worker = cluster.worker_of(holder)
    if worker is None:
        triggerer = cluster.procs["triggerer"].pid
        assert holder in descendants(triggerer), f"the commit's process {holder} is in no worker nor the triggerer"
        worker = "triggerer"
    cluster.kill_worker(worker)
    cluster.start_component(worker)
    if worker != "triggerer":
        cluster.wait_worker(worker)
        return f"Celery {worker} inside the commit's transaction"
    return "the triggerer inside the commit's transaction (its trigger committing)"


def _lose_the_spark_worker_running_an_executor(cluster: ClusterStack, release: Path) -> int:
    """Once exactly one executor runs (txid 3's: txid 2's left with its driver), kill the Spark
    worker running it, let txid 3's driver go on, and start a replacement worker."""
    executors = until(lambda: (e := cluster.spark.executors()) and sum(e.values()) == 1 and e, 120,
                      "not exactly one Spark executor running")
    [worker] = [k for k, n in executors.items() if n]
    cluster.spark.kill_worker(worker)
    release.touch()
    cluster.spark.start_worker(worker)
    return worker


def _arm(cluster: ClusterStack) -> tuple[Path, dict[int, Path]]:
    """Faults that hold txid 2's and 3's drivers at the start of their batch, and txid 4's commit
    inside its transaction, once each (a retry passes): the holds directory and the marker each
    fault leaves when it fires."""
    holds = cluster.base_dir / "holds"
    holds.mkdir()
    armed = {2: ("spark.begin", "never"), 3: ("spark.begin", "release-3"), 4: ("commit.after_apply", "never")}
    Path(cluster.extra_env["AIRFLOW_TXN_FAULTS_FILE"]).write_text("".join(
        f"{point}:{DAG}:{txid}=waitfor:{holds / release}@once:{holds / f'fired-{txid}'}\n"
        for txid, (point, release) in armed.items()))
    return holds, {txid: holds / f"fired-{txid}" for txid in armed}


def test_a_topology_on_celery_and_a_spark_cluster_survives_lost_nodes_exactly_once(cluster: ClusterStack) -> None:
    client = cluster.client()
    holds, fired = _arm(cluster)
    log = EventLog(cluster.state_dsn, "tweets")
    log.create(4)
    client.wait_for_dag(DAG)
    client.unpause(DAG)  # Airflow's scheduled run plans txid 1, empty: no Spark job
    coord = Coordinator(cluster.state_dsn)
    lost: dict[int, tuple[str, datetime]] = {}
    try:
        until(lambda: query(cluster.state_dsn, "SELECT count(*) FROM airflow_txn.transactions WHERE topology_id = %s",
                            (DAG,))[0][0], 180, "the scheduled run planned no txid")
        log.append(TWEETS)
        start = datetime.now(UTC) - timedelta(hours=2)
        runs = [client.trigger(DAG, (start + timedelta(minutes=k)).isoformat())["dag_run_id"] for k in range(3)]
        until(fired[2].exists, 300, "txid 2's driver did not reach its fault")
        worker = _lose_the_celery_worker_running(cluster, client, coord.transaction(DAG, 2).run_key, "process")
        lost[2] = (f"Celery {worker} running the batch and its driver", datetime.now(UTC))
        until(fired[3].exists, 300, "txid 3's driver did not reach its fault")
        spark_worker = _lose_the_spark_worker_running_an_executor(cluster, holds / "release-3")
        lost[3] = (f"Spark worker {spark_worker} running the batch's executor", datetime.now(UTC))
        until(fired[4].exists, 600, "txid 4's commit did not reach its fault")
        lost[4] = (_lose_the_node_committing(cluster, int(fired[4].read_text())), datetime.now(UTC))
        scheduled = [r["dag_run_id"] for r in client.runs(DAG) if r["dag_run_id"] not in runs]
        wait_for_runs(cluster, DAG, scheduled + runs, timeout=600)

        commits = coord.commits(DAG)
        assert [c["txid"] for c in commits] == [1, 2, 3, 4]
        assert [c["committed_at"] for c in commits] == sorted(c["committed_at"] for c in commits)
        assert dict(query(cluster.state_dsn, "SELECT url, value FROM url_counts")) == Counter(
            json.loads(p)["url"] for _e, p in TWEETS)
        status = coord.status(DAG)
        assert status.lag == 0 and not status.in_flight and status.quarantined == 0
        run_of = {txid: coord.transaction(DAG, txid).run_key for txid in (2, 3, 4)}
    finally:
        coord.close()
        log.close()
    # What Airflow did: the lost tasks failed on their heartbeat and ran again; the batch that lost
    # its executor went on in the same try, Spark running its tasks on the other worker.
    assert _ti(client, run_of[2], "process")["try_number"] == 2
    assert _ti(client, run_of[3], "process")["try_number"] == 1
    # A commit task lost with its worker ran again; a trigger lost with its triggerer ran again
    # in the replacement, the task resuming after it in its first try.
    by_trigger = lost[4][0].startswith("the triggerer")
    assert _ti(client, run_of[4], "commit")["try_number"] == (1 if by_trigger else 2)
    if by_trigger:
        assert "committed in the triggerer" in task_log(cluster, DAG, run_of[4], "commit")
    # What the topology did: txid 2's lost attempt never finished; a new one was committed.
    attempts = query(cluster.state_dsn, "SELECT attempt, status FROM airflow_txn.attempts "
                                        "WHERE topology_id = %s AND txid = 2 ORDER BY attempt", (DAG,))
    assert len(attempts) == 2 and attempts[0][1] != "committed" and attempts[1][1] == "committed", attempts
    at = {c["txid"]: c["committed_at"] for c in commits}
    for txid, (what, when) in lost.items():
        print(f"txid {txid}: lost {what}; committed {(at[txid] - when).total_seconds():.0f} s later")


def test_a_queued_task_survives_a_broker_restart_and_batches_a_master_restart(cluster: ClusterStack) -> None:
    """Between batches the Spark master restarts (it recovers its workers). With every Celery
    worker down, a new run's first task waits in Redis, and Redis restarts: the message survives
    (its append-only file), and the workers, back, run it in the same try; the txid commits once."""
    client, dsn = cluster.client(), cluster.state_dsn
    more = [(f"more{i}", json.dumps({"url": f"https://apache.org/q/{i % 7}", "user": "v"})) for i in range(400)]
    log = EventLog(dsn, "tweets")
    log.create(4)
    client.wait_for_dag(DAG)
    client.unpause(DAG)
    coord = Coordinator(dsn)
    try:
        wait_for_runs(cluster, DAG, [r["dag_run_id"] for r in until(lambda: client.runs(DAG), 180, "no run")],
                      timeout=600)
        before = coord.status(DAG).committed_txid
        counts = dict(query(dsn, "SELECT url, value FROM url_counts"))
        cluster.spark.restart_master()
        for worker in cluster.celery_workers:
            cluster.stop_component(worker)
        log.append(more)
        run = client.trigger(DAG, (datetime.now(UTC) - timedelta(hours=1)).isoformat())["dag_run_id"]
        until(lambda: _ti(client, run, "plan")["state"] == "queued", 120, "the plan task was not queued")
        broker = redis.Redis.from_url(cluster.redis.url(0))
        until(lambda: broker.llen("default"), 60, "no message in the Celery queue")  # the plan task's
        broker.close()
        cluster.redis.restart()
        back = datetime.now(UTC)
        for worker in cluster.celery_workers:
            cluster.start_component(worker)
        wait_for_runs(cluster, DAG, [run], timeout=300)
        txn = coord.transaction_for_run(DAG, run)
        assert txn is not None and txn.txid == before + 1 and coord.status(DAG).committed_txid == before + 1
        committed = coord.commits(DAG)[-1]["committed_at"]
    finally:
        coord.close()
        log.close()
    assert _ti(client, run, "plan")["try_number"] == 1  # the queued message itself ran, not a retry
    grew = Counter({url: n - counts.get(url, 0) for url, n in query(dsn, "SELECT url, value FROM url_counts")})
    assert +grew == Counter(json.loads(p)["url"] for _e, p in more)
    print(f"txid {before + 1}: queued in Redis across its restart; committed "
          f"{(committed - back).total_seconds():.0f} s after the Celery workers came back")


class Restarted(NamedTuple):
    """A txid whose batch ran under a master restart: its run, the counts before, the events it
    read, when the master restarted and when the txid committed."""

    txid: int
    run: str
    counts: dict[str, int]
    events: list[tuple[str, str]]
    restarted: datetime
    committed: datetime


def _a_batch_under_a_master_restart(cluster: ClusterStack, tag: str, *, forget: bool) -> Restarted:
    """Hold the next txid's driver at the start of its batch (its executor granted), restart the
    master (``forget``: its recovery state gone), release the driver, and wait for the run."""
    client, dsn = cluster.client(), cluster.state_dsn
    events = [(f"{tag}{i}", json.dumps({"url": f"https://apache.org/{tag}/{i % 5}", "user": tag})) for i in range(400)]
    log = EventLog(dsn, "tweets")
    log.create(4)
    client.wait_for_dag(DAG)
    client.unpause(DAG)
    coord = Coordinator(dsn)
    holds = cluster.base_dir / f"{tag}-holds"
    holds.mkdir()
    try:
        wait_for_runs(cluster, DAG, [r["dag_run_id"] for r in until(lambda: client.runs(DAG), 180, "no run")],
                      timeout=600)
        txid = coord.status(DAG).committed_txid + 1
        counts = dict(query(dsn, "SELECT url, value FROM url_counts"))
        Path(cluster.extra_env["AIRFLOW_TXN_FAULTS_FILE"]).write_text(
            f"spark.begin:{DAG}:{txid}=waitfor:{holds / 'release'}@once:{holds / 'fired'}\n")
        log.append(events)
        when = datetime.now(UTC) - timedelta(minutes=20 if forget else 30)  # a logical date of its own
        run = client.trigger(DAG, when.isoformat())["dag_run_id"]
        until((holds / "fired").exists, 300, f"txid {txid}'s driver did not reach its batch")
        until(lambda: sum(cluster.spark.executors().values()), 120, "the held batch has no executor")
        cluster.spark.restart_master(forget=forget)
        restarted = datetime.now(UTC)
        (holds / "release").touch()
        wait_for_runs(cluster, DAG, [run], timeout=420)
        txn = coord.transaction_for_run(DAG, run)
        assert txn is not None and txn.txid == txid and coord.status(DAG).committed_txid == txid
        committed = coord.commits(DAG)[-1]["committed_at"]
    finally:
        Path(cluster.extra_env["AIRFLOW_TXN_FAULTS_FILE"]).write_text("")
        coord.close()
        log.close()
    return Restarted(txid, run, counts, events, restarted, committed)


def _grew_by(dsn: str, counts: dict[str, int], events: list[tuple[str, str]]) -> bool:
    grew = Counter({url: n - counts.get(url, 0) for url, n in query(dsn, "SELECT url, value FROM url_counts")})
    return +grew == Counter(json.loads(p)["url"] for _e, p in events)


def test_a_batch_under_way_survives_a_master_restart_in_the_same_try(cluster: ClusterStack) -> None:
    """The Spark master restarts while a batch's driver runs (held at the start of its batch, its
    executor granted). The master recovers its workers and applications (its recovery directory,
    as in production): the driver goes on in the same task try and the same attempt, and the
    txid commits once. (Without recovery, that driver would wait for executors for ever.)"""
    r = _a_batch_under_a_master_restart(cluster, "mr", forget=False)
    dsn = cluster.state_dsn
    assert _ti(cluster.client(), r.run, "process")["try_number"] == 1  # the driver went on: no retry
    attempts = query(dsn, "SELECT status FROM airflow_txn.attempts WHERE topology_id = %s AND txid = %s",
                     (DAG, r.txid))
    assert attempts == [("committed",)], attempts  # one attempt, committed
    assert _grew_by(dsn, r.counts, r.events)
    print(f"txid {r.txid}: the master restarted under its batch; committed "
          f"{(r.committed - r.restarted).total_seconds():.0f} s after the restart")


def test_a_batch_its_master_forgot_is_retried_and_commits_once(cluster: ClusterStack) -> None:
    """The master restarts knowing nothing (its recovery state lost, as a master without a
    recovery mode) while a batch's driver runs: no master takes the driver back, and it would wait
    for executors for ever. The process task's watch kills it after ``[transactional]
    master_lost_timeout`` (the stack: 30 s); the retry's new driver registers with the new master,
    and the txid commits once."""
    r = _a_batch_under_a_master_restart(cluster, "mf", forget=True)
    dsn = cluster.state_dsn
    assert _ti(cluster.client(), r.run, "process")["try_number"] == 2  # the stranded driver's try failed, the retry ran
    assert "no Spark master took the driver back within 30 s" in task_log(cluster, DAG, r.run, "process")
    attempts = query(dsn, "SELECT status FROM airflow_txn.attempts WHERE topology_id = %s AND txid = %s "
                          "ORDER BY attempt", (DAG, r.txid))
    assert len(attempts) == 2 and attempts[0][0] != "committed" and attempts[1][0] == "committed", attempts
    assert _grew_by(dsn, r.counts, r.events)
    print(f"txid {r.txid}: its driver stranded by a master that forgot it; committed "
          f"{(r.committed - r.restarted).total_seconds():.0f} s after the restart")
