"""Waits that hold no worker slot: six topologies with three transactions in flight each, on a
LocalExecutor with four worker slots. The first transaction of each fails its processing once and
is retried 40 s later; meanwhile the commits of the two after it wait for it (deferring after 2 s). Sleeping in
workers, twelve waiting commits would hold all four slots and the retries could never run (until
the commit timeout, an hour). Deferred, they wait in the triggerer, and every topology commits
in txid order."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from airflow_transactional import EventLog
from airflow_transactional.coordinator import Coordinator
from dev.localstack import LocalStack, RestClient
from tests.e2e.conftest import StatsdListener, task_log, wait_for_runs
from tests.e2e.dags.slots_dags import SLOTS

pytestmark = pytest.mark.e2e


def _busy(client: RestClient) -> tuple[int, int]:
    """(task instances of the six DAGs running now, commits deferred now)."""
    listed = client.post("/api/v2/dags/~/dagRuns/~/taskInstances/list",
                         {"dag_ids": SLOTS, "state": ["running", "deferred"], "page_limit": 100})
    tis = listed["task_instances"]
    return (sum(ti["state"] == "running" for ti in tis),
            sum(ti["state"] == "deferred" and ti["task_id"] == "commit" for ti in tis))


def _start_each(stack: LocalStack, client: RestClient) -> list[EventLog]:
    """Each topology's empty log, and the DAG unpaused: Airflow's first, scheduled run is the empty txid 1."""
    logs = []
    for dag in SLOTS:
        logs.append(EventLog(stack.state_dsn, dag.replace("_", "")))
        logs[-1].create(1)
        client.wait_for_dag(dag)
        client.unpause(dag)
    for dag in SLOTS:
        deadline = time.monotonic() + 180
        while not (scheduled := client.runs(dag)):
            assert time.monotonic() < deadline, f"Airflow scheduled no run of {dag} after unpausing it"
            time.sleep(2)
        wait_for_runs(stack, dag, [str(r["dag_run_id"]) for r in scheduled])

    return logs


def _watch_slots(client: RestClient, runs: dict[str, list[str]]) -> tuple[int, int]:
    """Until every run finished: the most task instances seen running, and deferred, at once."""
    most_deferred, most_running = 0, 0
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        running, deferred = _busy(client)
        most_deferred, most_running = max(most_deferred, deferred), max(most_running, running)
        states = [client.run(dag, r)["state"] for dag in SLOTS for r in runs[dag]]
        if all(s in ("success", "failed") for s in states):
            break
        time.sleep(1)
    return most_running, most_deferred


def test_waiting_commits_hold_no_worker_slot_and_commit_in_order(stack: LocalStack, client: RestClient,
                                                                  statsd: StatsdListener) -> None:
    logs = _start_each(stack, client)
    # txid 2's processing fails once in every topology; its retry comes 40 s later.
    once = stack.base_dir / "slots-once"
    once.mkdir()
    Path(stack.extra_env["AIRFLOW_TXN_FAULTS_FILE"]).write_text(
        "".join(f"process.begin:{dag}:2=raise@once:{once / dag}\n" for dag in SLOTS))
    day0 = datetime(2025, 8, 1, tzinfo=UTC)
    runs = {dag: [client.trigger(dag, (day0 + timedelta(days=k)).isoformat())["dag_run_id"] for k in range(3)]
            for dag in SLOTS}

    most_running, most_deferred = _watch_slots(client, runs)
    Path(stack.extra_env["AIRFLOW_TXN_FAULTS_FILE"]).write_text("")
    for dag in SLOTS:
        assert set(wait_for_runs(stack, dag, runs[dag], timeout=60).values()) == {"success"}

    coord = Coordinator(stack.state_dsn)
    waited, by_trigger = [], []
    try:
        for dag in SLOTS:
            commits = coord.commits(dag)
            assert [c["txid"] for c in commits] == [1, 2, 3, 4], dag
            times = [c["committed_at"] for c in commits]
            assert times == sorted(times), dag
            assert (once / dag).exists()  # the fault fired
            tis = {ti["task_id"]: ti for ti in client.task_instances(dag, coord.transaction(dag, 2).run_key)}
            assert tis["process"]["try_number"] == 2, tis["process"]  # failed once, retried
            if "waiting for txid 2" in task_log(stack, dag, coord.transaction(dag, 3).run_key, "commit"):
                waited.append(dag)
            by_trigger += [(dag, txid) for txid in (3, 4) if "committed in the triggerer" in task_log(
                stack, dag, coord.transaction(dag, txid).run_key, "commit")]
            # Each commit's metrics went out once, whether its task or its trigger committed it.
            deadline = time.monotonic() + 30
            while len(statsd.values(dag, "committed_txid")) < 4 and time.monotonic() < deadline:
                time.sleep(1)
            assert sorted(v for v, _ in statsd.values(dag, "committed_txid")) == [1, 2, 3, 4], dag
    finally:
        coord.close()
    # The waits happened in the triggerer: commits were seen deferred, several at once, while
    # never more than the four worker slots ran.
    assert most_deferred >= 4, (most_deferred, most_running)
    assert most_running <= 4
    assert waited, "no commit of txid 3 logged that it waited for txid 2"
    # A deferred commit was committed by its trigger the moment its turn came, the task resuming after.
    assert by_trigger, "no commit of txid 3 or 4 was committed in the triggerer"
    # slots_0's runs missed its 5 s commit deadline: Airflow ran the late-commit callback in the
    # triggerer, which counted them; the topologies without a deadline sent nothing of the kind.
    deadline = time.monotonic() + 60
    while not statsd.values("slots_0", "late_commits") and time.monotonic() < deadline:
        time.sleep(2)
    late = statsd.values("slots_0", "late_commits")
    assert late and all(v == 1 and k == "c" for v, k in late), late
    assert not any(statsd.values(dag, "late_commits") for dag in SLOTS[1:])
    for log in logs:
        log.close()
