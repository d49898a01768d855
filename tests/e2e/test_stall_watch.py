"""The stall watch (dags/stall_watch.py, deployed as a user deploys it) on the test stack: a
topology whose process task waits for a slot of a pool that has none is found stalled, with what
Airflow says its next txid waits for; ``on_stall`` is called once for that stall, however many
checks see it, and the gauges reach StatsD; once the pool has a slot again, the txid commits and
the next check says the topology is no longer stalled."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from dev.localstack import LocalStack, RestClient
from tests.e2e.conftest import StatsdListener, task_log, wait_for_runs
from tests.e2e.operating import start_topology

pytestmark = pytest.mark.e2e

DAG = "ops_stalled"
WATCH = "transactional_stall_watch"
POOL = "starved"


def _check(stack: LocalStack, client: RestClient, k: int) -> str:
    """One check of the watch, triggered as the UI's Trigger button does; its run id."""
    run_id = f"check-{k}"
    client.trigger(WATCH, (datetime.now(UTC) - timedelta(hours=1) + timedelta(minutes=k)).isoformat(), run_id)
    wait_for_runs(stack, WATCH, [run_id], timeout=300)
    return run_id


def _slots(client: RestClient, slots: int) -> None:
    client.patch(f"/api/v2/pools/{POOL}", {"pool": POOL, "slots": slots, "include_deferred": False})


def _alerts(stack: LocalStack) -> list[dict[str, Any]]:
    path = Path(stack.extra_env["AIRFLOW_TXN_STALL_ALERTS_FILE"])
    lines = path.read_text().splitlines() if path.exists() else []
    return [a for a in map(json.loads, lines) if a["topology_id"] == DAG]


def test_the_stall_watch_alerts_once_when_a_pool_starves_a_topology_and_sees_it_recover(
        stack: LocalStack, client: RestClient, statsd: StatsdListener) -> None:
    client.post("/api/v2/pools", {"name": POOL, "slots": 1, "include_deferred": False})
    client.wait_for_dag(WATCH)
    client.unpause(WATCH)  # Airflow runs one check at once: it must find nothing of ours stalled
    deadline = time.monotonic() + 120
    while not (first := client.runs(WATCH)):
        assert time.monotonic() < deadline, "Airflow scheduled no check after the watch was unpaused"
        time.sleep(2)
    wait_for_runs(stack, WATCH, [r["dag_run_id"] for r in first])
    log, coord = start_topology(stack, client, DAG, "stl", 1)  # txid 1: empty, committed
    try:
        _slots(client, 0)
        log.append([(f"stl{i}", json.dumps({"url": f"https://example.com/{i}"})) for i in range(30)])
        run = client.trigger(DAG, datetime(2025, 3, 2, tzinfo=UTC).isoformat(), "starved-2")["dag_run_id"]
        deadline = time.monotonic() + 180
        while not (st := coord.status(DAG)).stalled:
            assert time.monotonic() < deadline, f"{DAG} never counted as stalled: {st}"
            time.sleep(1)
        assert not _alerts(stack)
        _check(stack, client, 1)
        [alert] = _alerts(stack)
        assert alert["run_id"] == "check-1" and alert["stalled_seconds"] >= 10
        assert alert["reason"].startswith("stalled: no commit for "), alert
        assert "txid 2 planned" in alert["reason"], alert
        assert alert["reason"].endswith("Airflow: its process task is scheduled: waiting for a slot of its pool "
                                        "or the scheduler's limits"), alert
        assert statsd.values(DAG, "stalled")[-1] == (1.0, "g")
        assert statsd.values(DAG, "stall_seconds")[-1][0] >= 10
        _check(stack, client, 2)  # still stalled: the gauges again, no second alert
        assert len(_alerts(stack)) == 1 and statsd.values(DAG, "stalled")[-1] == (1.0, "g")

        _slots(client, 1)
        assert wait_for_runs(stack, DAG, [run]) == {run: "success"}
        assert coord.status(DAG).committed_txid == 2
        recovered = _check(stack, client, 3)
        assert statsd.values(DAG, "stalled")[-1] == (0.0, "g")
        assert f"topology {DAG}: no longer stalled (committed txid 2)" in task_log(stack, WATCH, recovered, "check")
        assert len(_alerts(stack)) == 1
    finally:
        _slots(client, 1)  # the package's other tests may find the pool as they expect it
        coord.close()
