"""What the Transactions pages show, read from a real PostgreSQL: the phase of each txid in
flight, the timeline (plan, attempts, commit), one run's transaction and its quarantine -- and
the pages themselves, with every untrusted string escaped."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from airflow_transactional.airflow.ui import pages
from airflow_transactional.coordinator import Coordinator
from airflow_transactional.processing import process_batch
from tests.helpers import click, click_fn, counting_topology, make_log, query, run_one

pytestmark = pytest.mark.integration

MARKUP = "<img src=x onerror=alert(1)>"


def test_views_follow_a_topology_through_its_phases(coordinator: Coordinator, dsn: str) -> None:
    log = make_log(dsn)
    coordinator.register(counting_topology())
    log.append([click(i) for i in range(40)], partition=0)
    assert run_one(coordinator, "clicks", "run-1") == 1
    log.append([("bad-markup", MARKUP), ("bad-field", json.dumps({"user": "x"}))]
               + [click(i) for i in range(100, 160)], partition=1)  # txid 2: 50 records, txid 3: the rest
    t2, t3 = coordinator.plan("clicks", "run-2"), coordinator.plan("clicks", "run-3")
    process_batch(coordinator, "clicks", t3.txid, click_fn)  # txid 3 staged before txid 2 even started
    now = datetime.now(UTC)

    summary = coordinator.summary("clicks", dag_id="clicks_dag", now=now)
    assert summary["committed_txid"] == 1 and summary["dag_id"] == "clicks_dag"
    assert [(f["txid"], f["phase"]) for f in summary["in_flight"]] == [(2, "planned"),
                                                                         (3, "staged, waiting for txid 2")]
    # One commit, just now: one per minute (not one per ten-minute window, 0.1, a minute in).
    assert summary["commits_per_minute"] == pytest.approx(1.0)
    # How long the oldest uncommitted event has waited: the first one past the committed offset
    # of each partition, by the time the log stamped on it.
    assert summary["lag_records"] == 62 and 0 <= summary["lag_seconds"] < 60
    query(dsn, "UPDATE airflow_txn.log_events SET appended_at = now() - interval '1 hour' "
               "WHERE log_name = 'clicks' AND partition = 1 AND lsn = 1")
    waited = coordinator.status("clicks").lag_seconds
    assert waited is not None and 3600 <= waited < 3660
    assert summary["last_commit_age_seconds"] is not None and summary["last_commit_age_seconds"] < 60

    process_batch(coordinator, "clicks", t2.txid, click_fn)
    phases = [f["phase"] for f in coordinator.summary("clicks", dag_id="clicks_dag", now=now)["in_flight"]]
    assert phases == ["staged, next to commit", "staged, waiting for txid 2"]
    coordinator.commit("clicks", 2)
    coordinator.commit("clicks", 3)

    # Three commits since the first, four minutes ago: 0.75 per minute.
    query(dsn, "UPDATE airflow_txn.commits SET committed_at = now() - interval '4 minutes' WHERE txid = 1")
    rate = coordinator.summary("clicks", dag_id="clicks_dag", now=now)["commits_per_minute"]
    assert rate == pytest.approx(0.75, abs=0.01)

    timeline = coordinator.timeline("clicks", limit=2)
    assert [t["txid"] for t in timeline] == [3, 2]
    assert all(t["commit"] and t["commit"]["attempt"] == 1 and len(t["attempts"]) == 1 for t in timeline)
    run = coordinator.run_view("clicks", t2.run_key)
    assert run is not None and run["txid"] == 2 and run["commit"]["quarantined"] == 2
    assert sorted(r["records"] for r in run["quarantine_reasons"]) == [1, 1]
    assert coordinator.run_view("clicks", "no-such-run") is None
    bad = coordinator.quarantined("clicks", 2)
    assert {r["event_id"] for r in bad} == {"bad-markup", "bad-field"}
    one_reason = run["quarantine_reasons"][0]["reason"]
    assert [r["reason"] for r in coordinator.quarantined("clicks", 2, reason=one_reason)] == [one_reason]

    # The pages: numbers as read, untrusted text escaped (a record, a reason, a run id).
    html = pages.run("/transactional", "clicks_dag", t2.run_key, run, bad, None)
    assert MARKUP not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "txid 2" in html and "Download CSV" in html
    assert "offsets partition 1: 0 &#8594; 50" in html  # txid 2's batch: 50 records of partition 1
    html = pages.topology("/transactional", coordinator.summary("clicks", dag_id="clicks_dag", now=now),
                          coordinator.timeline("clicks"), now)
    assert html.count("<rect") == 3 * 3 and "<script" not in html  # plan, attempt, commit per txid
    overview = pages.transactions("/transactional", [coordinator.summary("clicks", dag_id="<b>dag", now=now)])
    assert "<b>dag" not in overview and "%3Cb%3Edag" in overview
    log.close()


def test_a_long_record_is_shown_truncated() -> None:
    record = {"id": 1, "txid": 4, "attempt": 1, "source_offset": "0:9", "event_id": "e", "reason": "r",
              "record": "x" * 5000, "committed": False}
    txn = {"txid": 4, "run_id": "r", "status": "planned", "planned_at": None, "planned_records": 1,
           "start_offsets": {}, "end_offsets": {}, "files": [], "failure": None, "attempts": [], "commit": None,
           "quarantine_reasons": [{"reason": "r", "records": 1}]}
    html = pages.run("/transactional", "d", "r", txn, [record], None)
    assert "x" * pages.RECORD_CHARS + "&#8230;" in html and "x" * (pages.RECORD_CHARS + 1) not in html


def test_tries_that_failed_before_an_attempt_are_told_on_the_run_page() -> None:
    txn = {"txid": 4, "run_id": "r", "status": "planned", "planned_at": None, "planned_records": 1,
           "start_offsets": {}, "end_offsets": {}, "files": [], "failure": None, "attempts": [], "commit": None,
           "quarantine_reasons": [], "failed_tries": 2,
           "last_try_failure": "process: spark-submit exited with code -9 (killed by SIGKILL: <oom>)"}
    html = pages.run("/transactional", "d", "r", txn, [], None)
    assert "Processing failed 2 time(s), the last: process: spark-submit exited with code -9 (killed by " \
           "SIGKILL: &lt;oom&gt;)" in html
    # The whole story -- command line, output, every try -- is the failed task's log in Airflow's UI.
    assert "<a href='/dags/d/runs/r/tasks/process'>The process task's log in Airflow</a>" in html
    html = pages.run("/airflow/transactional", "d", "r", {**txn, "failure": "commit: boom"}, [], None)
    assert "Failed for good after 2 failed tries: commit: boom" in html and "Processing failed" not in html
    assert "<a href='/airflow/dags/d/runs/r/tasks/commit'>The commit task's log in Airflow</a>" in html


def test_a_commit_is_counted_by_what_it_did_not_by_what_it_staged(dsn: str) -> None:
    """The payments topology of test_decisions.py: per commit, the events it appended to its
    output and the requests it granted and declined -- not its staged rows (a decision's output
    stages an event for each verdict a request could get)."""
    from tests.integration.test_decisions import drain, pay_fn, requests, send, setup

    coord, log = setup(dsn)
    send(log, requests(60, seed=3))
    drain(coord, "payments", pay_fn, "p")
    done = [t["commit"] for t in coord.timeline("payments", 50) if t["commit"]]
    granted, declined = (sum(c["decided"]["pay"][v] for c in done) for v in ("granted", "declined"))
    assert granted > 0 and declined > 0 and granted + declined == 60
    assert query(dsn, "SELECT granted, count(*) FROM airflow_txn.verdicts GROUP BY 1 ORDER BY 1") == \
        [(False, declined), (True, granted)]
    ledger = query(dsn, "SELECT count(*) FROM airflow_txn.log_events WHERE log_name = 'ledger'")[0][0]
    assert sum(c["appended"]["ledger"] for c in done) == ledger > 0
    assert all(set(c["rows"]) == {"debits", "requests_seen"} for c in done)
    log.close()
