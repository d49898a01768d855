"""What the Transactions pages say a run waits for, from Airflow's task instances, run and pools
(the rows as the plugin reads them from Airflow's tables; tests/e2e/test_liveness.py reads them
from a real scheduler's), and how a stalled topology is shown."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_transactional.airflow.ui import pages
from airflow_transactional.airflow.ui.waits import describe

pytestmark = pytest.mark.unit

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
FULL = {"spark": {"total": 2, "running": 2, "queued": 0, "open": 0, "deferred": 0, "scheduled": 7}}


def ti(task_id: str, state: str | None, **times: Any) -> SimpleNamespace:
    fields = {"scheduled_dttm": None, "queued_dttm": None, "start_date": None, "end_date": None, "try_number": 1,
              "pool": "spark" if task_id == "process" else "default_pool", **times}
    return SimpleNamespace(task_id=task_id, state=state, **fields)


def run(state: str = "running", queued_at: datetime | None = None) -> SimpleNamespace:
    return SimpleNamespace(state=state, queued_at=queued_at)


def tis(*rows: SimpleNamespace) -> dict[str, SimpleNamespace]:
    return {r.task_id: r for r in rows}


def test_a_process_task_waiting_for_a_full_pool_says_so_with_the_pools_use() -> None:
    waiting = tis(ti("plan", "success"), ti("process", "scheduled", scheduled_dttm=NOW - timedelta(minutes=12)),
                  ti("commit", None))
    assert describe(waiting, run(), FULL, NOW) == (
        "process waits for a slot of pool spark for 12 min (2 running, 0 queued of 2; 7 waiting)")
    # Its use (every DAG's tasks in it) is told only to whom may read the pool, as Airflow's pool pages are.
    assert describe(waiting, run(), FULL, NOW, shown=set()) == "process waits for a slot of pool spark for 12 min"
    # A pool with room: something else holds it (the DAG's or the scheduler's limits).
    room = {"spark": {**FULL["spark"], "open": 1}}
    assert describe(waiting, run(), room, NOW) == (
        "process is scheduled for 12 min, not queued yet (the scheduler's limits)")


@pytest.mark.parametrize(("rows", "dag_run", "said"), [
    ((ti("plan", "success"), ti("process", "queued", queued_dttm=NOW - timedelta(seconds=40))), run(),
     "process is queued for 40 s, waiting for a worker to start it"),
    ((ti("plan", "success"), ti("process", "success"), ti("commit", "deferred", start_date=NOW - timedelta(hours=2))),
     run(), "commit waits in the triggerer for its turn for 2.0 h"),
    ((ti("plan", "success"), ti("process", "up_for_retry", try_number=2, end_date=NOW - timedelta(seconds=5))), run(),
     "process failed try 2 5 s ago: Airflow retries it after its retry_delay"),
    ((), run("queued", NOW - timedelta(minutes=3)),
     "the run is queued for 3 min (the DAG's max_active_runs are all running)"),
    ((ti("plan", "success"), ti("process", "running")), run(), None),  # the store says what it does
    ((ti("plan", "success"), ti("process", "skipped"), ti("commit", "success")), run("success"), None),
])
def test_what_else_a_run_can_wait_for(rows: tuple[SimpleNamespace, ...], dag_run: SimpleNamespace,
                                      said: str | None) -> None:
    assert describe(tis(*rows), dag_run, FULL, NOW) == said


def summary(**changes: Any) -> dict[str, Any]:
    base = {"topology_id": "t", "dag_id": "t", "committed_txid": 13, "last_commit_age_seconds": 900.0,
            "commits_per_minute": 0.0, "lag_records": 2084, "lag_seconds": None, "quarantined": 0,
            "quarantined_pending": 0, "last_commit_at": None, "stalled": False, "blocked_by": None,
            "in_flight": [{"txid": 14, "run_id": "r14", "phase": "planned", "for_seconds": 720.0,
                           "waiting": "process waits for a slot of pool <spark>"}]}
    return {**base, **changes}


def test_a_stalled_topology_is_shown_as_stalled_with_what_its_next_txid_waits_for() -> None:
    stalled = summary(stalled=True, blocked_by="stalled: no commit for 15 min (stall_after 10 min) ...")
    for html in (pages.topology("/transactional", stalled, [], NOW), pages.transactions("/transactional", [stalled])):
        assert "txid 14: planned for 12.0 min" in html
        assert "process waits for a slot of pool &lt;spark&gt;" in html and "<spark>" not in html
    html = pages.topology("/transactional", stalled, [], NOW)
    assert "Stalled: no commit for 15 min (stall_after 10 min) ..." in html
    assert "Reprocess the failed runs" not in html  # nothing failed: nothing to reprocess
    failed = pages.topology("/transactional", summary(blocked_by="blocked by failed txid 14 ..."), [], NOW)
    assert "Blocked: blocked by failed txid 14" in failed and "Reprocess the failed runs" in failed


def test_the_pools_use_is_told_to_whom_may_read_the_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_transactional.airflow.ui import waits

    rows = tis(ti("plan", "success"), ti("process", "scheduled", scheduled_dttm=NOW - timedelta(minutes=2)))
    monkeypatch.setattr(waits, "_read", lambda dag_id, run_ids: ({"r1": rows}, {"r1": run()}, FULL, {"spark": "ops"}))
    asked: list[tuple[str, str | None]] = []

    def nobody(name: str, team: str | None) -> bool:
        asked.append((name, team))
        return False

    assert waits.waiting("d", ["r1"], NOW, nobody) == {"r1": "process waits for a slot of pool spark for 2 min"}
    assert asked == [("spark", "ops")]  # the pool's team, as Airflow's own check takes it
    assert waits.waiting("d", ["r1"], NOW, lambda name, team: True)["r1"].endswith("(2 running, 0 queued of 2; "
                                                                                 "7 waiting)")


def test_a_batchs_offsets_read_as_text_not_as_a_python_dict() -> None:
    """Regression: the plan task's log printed a batch's offsets as two Python dicts."""
    from airflow_transactional.model import span_text

    assert span_text({"0": 10, "1": 5, "10": 0}, {"0": 25, "1": 5, "10": 3}) == \
        "partition 0: 10 -> 25, partition 10: 0 -> 3"
    assert span_text({"seq": 3}, {"seq": 5}) == "seq: 3 -> 5"
    assert span_text({"0": 4}, {"0": 4}) == "nothing new"
