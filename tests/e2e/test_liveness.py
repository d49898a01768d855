"""Liveness under contention: the second stage of a pipeline is not starved by other topologies'
scheduled runs. Three topologies keep the stack's two-slot ``spark`` pool saturated with dated
runs; each commit of ``busy_0`` starts runs of two second stages (asset-triggered: no logical
date). Airflow orders waiting tasks by priority weight, then logical date, and puts undated runs
last; the provider's weight rule lifts them above every scheduled run, and ``busy_after_fifo``,
the same topology on Airflow's own rule, shows what happens without it (tests/e2e/dags/busy_dags.py).
"""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from airflow_transactional import EventLog
from airflow_transactional.airflow.priority import ASSET_TRIGGERED_BOOST
from airflow_transactional.coordinator import Coordinator
from dev.localstack import LocalStack, RestClient
from tests.e2e.conftest import StatsdListener, wait_for_runs
from tests.e2e.dags.busy_dags import FIRST, SECOND
from tests.e2e.operating import set_faults
from tests.helpers import query

pytestmark = pytest.mark.e2e

DAY0 = datetime(2025, 5, 1, tzinfo=UTC)


def _when(ti: dict[str, Any], field: str) -> datetime | None:
    value = ti.get(field)
    return datetime.fromisoformat(value) if value else None


def _process_tis(client: RestClient, dags: list[str]) -> list[dict[str, Any]]:
    listed = client.post("/api/v2/dags/~/dagRuns/~/taskInstances/list",
                         {"dag_ids": dags, "task_ids": ["process"], "page_limit": 100})
    return list(listed["task_instances"])


def _overtaken(mine: dict[str, Any], others: list[dict[str, Any]]) -> int:
    """How many process tasks that were already waiting for the pool when ``mine`` started to
    wait got a slot before it."""
    waits_from, got_slot = _when(mine, "scheduled_when"), _when(mine, "queued_when")
    assert waits_from and got_slot, mine
    return sum(1 for o in others
               if (s := _when(o, "scheduled_when")) and (q := _when(o, "queued_when"))
               and s <= waits_from < q < got_slot)


class Overview(threading.Thread):
    """What the Transactions overview says the in-flight runs wait for, looked at every 2 s as a
    person watching it would: {(dag, phase, what Airflow holds the run for)}."""

    def __init__(self, stack: LocalStack) -> None:
        super().__init__(daemon=True)
        self.client, self.said, self.stop = stack.client(), set[tuple[str, str, str]](), threading.Event()
        self.blocked: dict[str, str] = {}  # the first blocker seen of each topology

    def run(self) -> None:
        while not self.stop.wait(2):
            for t in self.client.get("/transactional/api/topologies"):
                self.said.update((t["dag_id"], f["phase"], f["waiting"]) for f in t["in_flight"] if f.get("waiting"))
                if t["blocked_by"]:
                    self.blocked.setdefault(t["dag_id"], t["blocked_by"])


def _wait_for_second_stages(stack: LocalStack, client: RestClient) -> dict[str, list[dict[str, Any]]]:
    """Every second stage's asset-triggered runs, once busy_0's commits (all made by now) have
    started them all and they have finished."""
    deadline = time.monotonic() + 300
    while True:
        runs = {dag: [r for r in client.runs(dag) if r["run_type"] == "asset_triggered"] for dag in SECOND}
        if all(runs.values()):
            break
        assert time.monotonic() < deadline, f"busy_0's commits started no runs of {SECOND}: {runs}"
        time.sleep(3)
    seen: set[str] = set()
    while True:  # until a look finds no run it had not waited for
        time.sleep(5)  # the scheduler queues the runs of a last event within a loop or two
        now = {r["dag_run_id"]: dag for dag in SECOND for r in client.runs(dag)}
        if set(now) == seen:
            break
        for dag in SECOND:
            wait_for_runs(stack, dag, [r for r, d in now.items() if d == dag], timeout=600)
        seen = set(now)
    return {dag: [r for r in client.runs(dag) if r["run_type"] == "asset_triggered"] for dag in SECOND}


def _how_the_second_stages_waited(client: RestClient, triggered: dict[str, list[dict[str, Any]]]
                                  ) -> dict[str, list[tuple[int, int, float]]]:
    """(weight, first-stage tasks that overtook it, seconds it waited for a slot) of the process
    task of each asset-triggered run, by DAG."""
    waiting = [ti for ti in _process_tis(client, FIRST) if ti["state"] in ("success", "skipped")]
    seen: dict[str, list[tuple[int, int, float]]] = {}
    for dag in SECOND:
        for run in triggered[dag]:
            [ti] = [t for t in client.task_instances(dag, run["dag_run_id"]) if t["task_id"] == "process"]
            assert ti["state"] in ("success", "skipped"), ti  # skipped: an empty batch
            if ti["queued_when"] is None:  # skipped by the plan that committed its empty batch: it never waited
                assert ti["state"] == "skipped", ti
                continue
            waited = (_when(ti, "queued_when") - _when(ti, "scheduled_when")).total_seconds()  # type: ignore[operator]
            seen.setdefault(dag, []).append((int(ti["priority_weight"]), _overtaken(ti, waiting), waited))
    print("weight, overtaken by, waited s:", seen)
    return seen


def _the_overview_said_what_they_waited_for(overview: Overview, statsd: StatsdListener) -> None:
    """While the runs waited, the overview said on what: the pool, how full, for how long -- not
    "planned". The starved stage stalled: the overview said so as its blocker, and its run's missed
    commit deadline made Airflow's triggerer call back, which counted it and raised the stalled gauge."""
    overview.join(10)
    pooled = [(dag, w) for dag, phase, w in overview.said if phase == "planned"
              and w.startswith("process waits for a slot of pool spark for ") and " queued of 2; " in w]
    print("the overview said:", sorted(overview.said), overview.blocked)
    assert {dag for dag, _ in pooled} & {"busy_1", "busy_2", "busy_after_fifo"}, overview.said
    assert overview.blocked.get("busy_after_fifo", "").startswith("stalled: no commit since txid 1 was planned "), (
        overview.blocked)
    assert "busy_after" not in overview.blocked, overview.blocked  # it took the next free slot
    deadline = time.monotonic() + 60
    while (1.0, "g") not in statsd.values("busy_after_fifo", "stalled") and time.monotonic() < deadline:
        time.sleep(2)
    assert (1.0, "g") in statsd.values("busy_after_fifo", "stalled"), statsd.values("busy_after_fifo", "late_commits")
    assert statsd.values("busy_after_fifo", "late_commits") and not statsd.values("busy_after", "late_commits")


def test_an_asset_triggered_stage_is_not_starved_by_other_topologies_scheduled_runs(
        stack: LocalStack, client: RestClient, statsd: StatsdListener) -> None:
    logs = []
    for dag in FIRST + SECOND:
        logs.append(EventLog(stack.state_dsn, dag.replace("_", "")))
        logs[-1].create(1)
        # A batch of ten for each dated run of the first stages (the run Airflow schedules on
        # unpausing, dated today, plans last: an empty batch), one for each second-stage run.
        size = {"busy_0": 10}.get(dag, 30)
        logs[-1].append([(f"{dag}{i}", json.dumps({"url": f"https://example.com/{i}"})) for i in range(size)])
        client.wait_for_dag(dag)
    # busy_0's one dated run is the oldest and goes first; by the time it commits (its batch holds
    # the slot 8 s more), busy_1's and busy_2's runs (three dated, one scheduled each, four in
    # flight) have planned and wait for the pool. Their batches hold a slot 3 s more each.
    set_faults(stack, *(f"process.begin:{dag}=pause:{8 if dag == 'busy_0' else 3}" for dag in FIRST))
    first = {dag: [client.trigger(dag, (DAY0 + timedelta(days=k)).isoformat())["dag_run_id"]
                   for k in range(1 if dag == "busy_0" else 3)] for dag in FIRST}
    overview = Overview(stack)
    overview.start()
    for dag in SECOND + FIRST:
        client.unpause(dag)
    try:
        for dag in FIRST:  # the dated runs, and the one Airflow scheduled on unpausing
            wait_for_runs(stack, dag, first[dag], timeout=600)
            assert set(wait_for_runs(stack, dag, [r["dag_run_id"] for r in client.runs(dag)]).values()) == {"success"}
        triggered = _wait_for_second_stages(stack, client)
    finally:
        overview.stop.set()
        set_faults(stack)
        for dag in FIRST + SECOND:
            client.patch(f"/api/v2/dags/{dag}", {"is_paused": True})

    seen = _how_the_second_stages_waited(client, triggered)
    ours, fifo = seen["busy_after"], seen["busy_after_fifo"]
    assert all(weight == 2 + ASSET_TRIGGERED_BOOST for weight, _, _ in ours), seen
    assert all(weight == 2 for weight, _, _ in fifo), seen
    # Without the provider's rule, the second stage waited behind dated runs that came after it ...
    assert max(n for _, n, _ in fifo) >= 3, seen
    # ... with it, it takes the next free slot: nothing waiting overtakes it.
    assert max(n for _, n, _ in ours) <= 1, seen

    _the_overview_said_what_they_waited_for(overview, statsd)

    # And through the contention, each topology committed in txid order, every record once.
    coord = Coordinator(stack.state_dsn)
    try:
        for dag in FIRST + SECOND:
            commits = coord.commits(dag)
            assert [c["txid"] for c in commits] == list(range(1, len(commits) + 1)), dag
            read = sum(int(c["records_read"]) for c in commits)
            assert query(stack.state_dsn, f"SELECT id, value FROM {dag}") == ([("all", read)] if read else []), dag
        assert [sum(int(c["records_read"]) for c in coord.commits(dag)) for dag in FIRST] == [10, 30, 30]
    finally:
        coord.close()
        for log in logs:
            log.close()
