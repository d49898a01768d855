"""What the Transactions pages show, read from a real PostgreSQL: the phase of each txid in
flight, the timeline (plan, attempts, commit), one run's transaction and its quarantine -- and
the pages themselves, with every untrusted string escaped."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

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


def test_a_txid_whose_tries_failed_looks_failed_in_the_table_and_the_timeline() -> None:
    """Regression: a txid whose tries were all killed before they began an attempt showed
    "planned" in the topology's table and no bar of its failure in the timeline; the attempts
    column said "1 failed tries"."""
    now = datetime.now(UTC)

    def txn(txid: int, *, attempts: list[str] = (), failed_tries: int = 0,  # type: ignore[assignment]
            failure: str | None = None, committed: bool = False) -> dict[str, object]:
        at = (now - timedelta(minutes=10 - txid)).isoformat()
        return {"txid": txid, "run_id": f"r{txid}", "status": "committed" if committed else "planned",
                "planned_at": at, "planned_records": 5, "failed_tries": failed_tries, "failure": failure,
                "last_try_failure": "process: spark-submit exited with code 1 (spark-class: bad array subscript)"
                if failed_tries else None,
                "attempts": [{"attempt": n + 1, "status": st, "started_at": at, "finished_at": at}
                             for n, st in enumerate(attempts)],
                "commit": {"attempt": 1, "started_at": at, "committed_at": at, "rows": {}, "quarantined": 0}
                if committed else None}

    txns = [txn(1, attempts=["complete"], committed=True), txn(2, failed_tries=1), txn(3, failed_tries=3,
            failure="process: failed for good"), txn(4, attempts=["failed"], failed_tries=1),
            txn(5, attempts=["running"]), txn(6, attempts=["complete"]), txn(7)]
    summary = {"topology_id": "t", "dag_id": "d", "committed_txid": 1, "in_flight": [], "lag_records": 0,
               "lag_seconds": None, "source_error": None, "last_commit_age_seconds": 5.0, "commits_per_minute": 1.0,
               "quarantined": 0, "blocked_by": None, "stalled": False}
    html = pages.topology("/transactional", summary, txns, now)
    cells = re.findall(r"<td>(committed|failed for good|failed|processing|processed|planned)</td>", html)
    assert cells == ["committed", "failed", "failed for good", "failed", "processing", "processed", "planned"]
    assert "1 (1 failed try)" in html and "0 (3 failed tries)" in html and "failed tries)" in html
    assert "txid 2: 1 try failed before processing began: process: spark-submit exited with code 1" in html
    assert "txid 4: planned" in html  # its failed try began an attempt: the attempt's bar tells it
    assert html.count("class=bar-failed") == 3  # txids 2 and 3 before any attempt, txid 4's attempt


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
    # debits moves by the decision's grants alone: never shown as "debits: 0" beside them
    assert all(set(c["rows"]) == {"requests_seen"} for c in done)
    log.close()


def test_the_run_page_groups_reasons_by_kind_and_pages_through_the_records(coordinator: Coordinator,
                                                                           dsn: str) -> None:
    """Regression: the reason filter listed one reason per record (each embeds the value it refused),
    and a run page with thousands of quarantined records showed them all in one page."""
    log = make_log(dsn, partitions=1)
    coordinator.register(counting_topology(max_batch_size=1000, max_quarantined=None))  # expected here
    priced = [(f"eur-{i}", json.dumps({"user": "u", "amount": f"{i} EUR"})) for i in range(250)]
    log.append([*priced, ("no-user", json.dumps({"amount": 1})), click(1)])
    assert run_one(coordinator, "clicks", "run-1") == 1
    run = coordinator.run_view("clicks", "run-1")
    assert run is not None
    kinds = {r["reason"]: r["records"] for r in run["quarantine_reasons"]}
    assert kinds == {"ValueError: invalid literal for int() with base 10: …": 250, "KeyError: 'user'": 1}
    of_kind = coordinator.quarantined("clicks", 1, reason="ValueError: invalid literal for int() with base 10: …",
                                      limit=1000)
    assert len(of_kind) == 250 and {r["reason"] for r in of_kind} == {
        f"ValueError: invalid literal for int() with base 10: '{i} EUR'" for i in range(250)}

    first = pages.run("/t", "d", "run-1", run, of_kind[:pages.QUARANTINE_PAGE], None, at_page=0)
    assert "records 1&#8211;200 of 251" in first and "page=1'>next &#8594;</a>" in first and "previous" not in first
    assert first.count("<option") == 3  # all, and the two kinds: not one per record
    second = pages.run("/t", "d", "run-1", run, of_kind[pages.QUARANTINE_PAGE:], "ValueError: invalid literal for "
                       "int() with base 10: …", at_page=1)
    assert "records 201&#8211;250 of 250" in second and "page=0'>&#8592; previous</a>" in second
    assert "next" not in second
    log.close()


def test_a_landing_topology_counts_its_txids_in_records_read_and_its_plans_in_files(
        coordinator: Coordinator, tmp_path: Path) -> None:
    # A landing directory plans files: the table's records column said "2" for two files of 30
    # records, and the run page "Batch: 2 records, files: ...".
    from airflow_transactional.sources import LandingDirectory
    from airflow_transactional.sources.landed import write_json_lines
    from airflow_transactional.spec import StateSpec, TopologySpec

    coordinator.register(TopologySpec("files", LandingDirectory(str(tmp_path), max_files=2, settle_seconds=0),
                                      [StateSpec("file_counts", {"user_id": "text"}, combiner="count")]))
    for name in ("a.json", "b.json", "c.json"):
        write_json_lines(str(tmp_path), name, [{"user": f"u{i}"} for i in range(15)])
    t1, t2 = coordinator.plan("files", "r1"), coordinator.plan("files", "r2")
    process_batch(coordinator, "files", t1.txid, lambda r: [("file_counts", (r["user"],), 1)])
    coordinator.commit("files", t1.txid)
    now = datetime.now(UTC)
    html = pages.topology("/transactional", coordinator.summary("files", dag_id="files", now=now),
                          coordinator.timeline("files"), now)
    cells = re.findall(r"<td class=n>([^<]*)</td>", html)
    assert "30" in cells and "1 file" in cells and "2" not in cells, cells  # txid 1 read 30, txid 2 plans 1 file
    run = coordinator.run_view("files", t1.run_key)
    page = pages.run("/transactional", "files", t1.run_key, run, [], None)
    assert "Batch: 2 files: " in page and "records, files" not in page
    assert t2.txid == 2


def test_an_outputs_digest_is_told_as_what_was_staged_not_appended() -> None:
    # The payments run page showed `out:ledger 94` beside "ledger: 46 events appended", under "what it applied".
    c = {"rows": {}, "appended": {"ledger": 46}, "digests": {"out:ledger": "94:5f2a", "balances": "46:9c1d"}}
    html = pages.committed(c) + pages.provenance(c)
    assert "ledger: 46 events appended" in html and "out:ledger <code>94:5f2a</code>" in html
    assert "the events its attempt staged for an output" in html and "may pass the events appended" in html
