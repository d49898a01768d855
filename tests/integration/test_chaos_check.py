"""The chaos harness's post-mortem (``--check``) on a real Postgres: a run that never drained is
judged on what it committed -- the ledger's events at or below the committed checkpoint -- and a
damaged state is caught."""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_transactional.coordinator import Coordinator
from airflow_transactional.processing import process_batch
from airflow_transactional.sources import EventLog, PostgresLogSource
from airflow_transactional.sources.eventlog import partition_of
from airflow_transactional.spec import StateSpec, TopologySpec
from bench.chaos import LEDGER, LOG, TOPOLOGY, ChaosConfig, ChaosReport, Ledger, domain_of
from bench.chaos.checker import check as check_run
from bench.chaos.config import KAFKA_TOPIC
from bench.chaos.operator import Operator
from dev.kafka import KafkaBroker
from tests.helpers import query
from tests.kafka_helpers import read_topic

pytestmark = pytest.mark.integration


def words(rec: dict[str, Any]) -> list[tuple[str, tuple[Any, ...], Any]]:
    url = rec["url"]
    return [("url_counts", (url,), 1), ("domain_counts", (domain_of(url),), 1)]


def test_check_judges_what_was_committed_and_catches_a_damaged_state(dsn: str, tmp_path: Path) -> None:
    log = EventLog(dsn, LOG)
    log.create(2)
    ledger = Ledger(tmp_path / LEDGER)
    fresh = [(f"p0-{i}", json.dumps({"url": f"https://www.a.org/{i % 3}"}), f"https://www.a.org/{i % 3}")
             for i in range(30)] + [("p0-bad", "not json", None)]
    log.append([(e, p) for e, p, _ in fresh])
    with ledger.lock:
        ledger.record(fresh, 0)
    coord = Coordinator(dsn)
    coord.register(TopologySpec(TOPOLOGY, PostgresLogSource(LOG), [
        StateSpec("url_counts", {"url": "text"}, combiner="count", table=f"{TOPOLOGY}_url_counts"),
        StateSpec("domain_counts", {"domain": "text"}, combiner="count", kind="opaque",
                  table=f"{TOPOLOGY}_domain_counts")], max_batch_size=20))
    for run in ("r1", "r2"):  # 20 + 11 events committed
        txid = coord.plan(TOPOLOGY, run).txid
        process_batch(coord, TOPOLOGY, txid, words)
        coord.commit(TOPOLOGY, txid)
    later = [(f"p1-{i}", json.dumps({"url": "https://b.org/x"}), "https://b.org/x") for i in range(7)]
    log.append([(e, p) for e, p, _ in later])  # appended, never planned: the run died first
    with ledger.lock:
        ledger.record(later, 0)
    ledger.close()

    def check() -> ChaosReport:
        report = ChaosReport(seed=1, post_mortem=True)
        check_run(dsn, ChaosConfig(audit=False), report, Ledger.load(tmp_path / LEDGER))
        return report

    report = check()
    assert (report.transactions_committed, report.events_appended, report.events_pending) == (2, 38, 7)
    assert report.violations == 0, report.table()
    assert "events not yet committed (beyond the checkpoint)  | 7" in report.table()

    query(dsn, f"UPDATE {TOPOLOGY}_url_counts SET value = value - 1 WHERE url = 'https://www.a.org/0'")
    query(dsn, "DELETE FROM airflow_txn.quarantine WHERE event_id = 'p0-bad'")
    damaged = check()
    assert (damaged.events_lost, damaged.events_duplicated, damaged.quarantine_mismatches) == (1, 0, 1)
    coord.close()
    log.close()


def test_payments_producers_route_by_payer_and_a_broken_invariant_is_reported(dsn: str, tmp_path: Path) -> None:
    from bench.chaos import payments as mode
    from dev import payments

    requests, ledger_log = payments.create_logs(dsn)
    ledger = Ledger(tmp_path / LEDGER)
    ledger.record_deposits({a: 300 for a in payments.ACCOUNTS})
    cfg = ChaosConfig(mode="payments", rate=40, malformed_rate=0.2, duplicate_rate=0.2, audit=False)
    stop = threading.Event()
    producer = mode.PaymentsProducer(dsn, 0, cfg, ledger, stop)
    producer.start()
    time.sleep(2)
    stop.set()
    producer.join(30)
    ledger.close()
    assert producer.error is None
    stored = query(dsn, "SELECT partition, event_id, payload FROM airflow_txn.log_events "
                        "WHERE log_name = 'payment_requests'")
    assert len(stored) == len(ledger.valid) + len(ledger.malformed) > 20  # duplicates dropped by the log
    for partition, event_id, payload in stored:
        key = ledger.valid[event_id]["from"] if event_id in ledger.valid else event_id
        assert partition == partition_of(key, payments.REQUEST_PARTITIONS), (event_id, payload)
    assert ledger.malformed and ledger.duplicates

    def check() -> ChaosReport:
        report = ChaosReport(seed=1, post_mortem=True)
        check_run(dsn, cfg, report, Ledger.load(tmp_path / LEDGER))
        return report

    report = check()  # nothing decided yet: nothing is wrong
    assert report.violations == 0 and report.events_appended == report.events_pending == len(stored), report.table()
    assert report.malformed_injected >= len(ledger.malformed) > 0
    query(dsn, "INSERT INTO airflow_txn.decision_requests (topology_id, decision, request_id, txid, attempt, seq, key, "
               "amount, prefix) VALUES ('payments', 'pay', 'pay-nobody-sent', 1, 1, 0, '[\"acct00\"]', -10, -10)")
    query(dsn, "INSERT INTO airflow_txn.decision_runs (topology_id, decision, txid, attempt, key, start) "
               "VALUES ('payments', 'pay', 1, 1, '[\"acct00\"]', 10)")
    damaged = check()
    assert damaged.violations == 1 and "decided that nobody sent" in damaged.table(), damaged.table()
    requests.close()
    ledger_log.close()


def _fresh_topic(kafka: KafkaBroker, name: str, partitions: int) -> None:
    """``name`` with no records (an earlier test's chaos run may have left it on the session's broker)."""
    from tests.kafka_helpers import admin, delete_topic

    if name in admin(kafka).list_topics(timeout=30).topics:
        delete_topic(kafka, name)
        deadline = time.monotonic() + 60
        while name in admin(kafka).list_topics(timeout=30).topics:
            assert time.monotonic() < deadline, f"topic {name} was not deleted within a minute"
            time.sleep(0.5)
    deadline = time.monotonic() + 60
    while True:  # a name being deleted is refused for a moment
        try:
            kafka.create_topic(name, partitions)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def test_kafka_check_holds_the_committed_records_less_only_what_a_deletion_skipped(
        dsn: str, kafka: KafkaBroker, tmp_path: Path) -> None:
    from airflow_transactional.sources import KafkaSource
    from bench.chaos import kafka as mode

    _fresh_topic(kafka, KAFKA_TOPIC, 2)
    cfg = ChaosConfig(mode="kafka", rate=20, aborted_rate=0.3, malformed_rate=0.03, audit=False)
    ledger = Ledger(tmp_path / LEDGER)
    stop, gate = threading.Event(), threading.Lock()
    producer = mode.TweetTransactions(kafka, 0, cfg, ledger, stop, gate)
    producer.start()
    time.sleep(5)
    stop.set()
    producer.join(60)
    assert producer.error is None
    assert ledger.aborted and ledger.malformed and len(ledger.valid) > 20, (ledger.aborted, len(ledger.valid))
    committed = {m.value() for m in read_topic(kafka, KAFKA_TOPIC)}  # what a read_committed consumer sees
    assert len(committed - {None}) <= len(ledger.valid) + len(ledger.malformed)

    coord = Coordinator(dsn)
    coord.register(TopologySpec(mode.TOPOLOGY, KafkaSource(KAFKA_TOPIC), [
        StateSpec("url_counts", {"url": "text"}, combiner="count", kind="opaque", table=f"{mode.TOPOLOGY}_url_counts"),
        StateSpec("domain_counts", {"domain": "text"}, combiner="count", kind="opaque",
                  table=f"{mode.TOPOLOGY}_domain_counts")], opaque=True, max_batch_size=30, max_in_flight=5))
    first = coord.plan(mode.TOPOLOGY, "r0").txid
    process_batch(coord, mode.TOPOLOGY, first, words)
    coord.commit(mode.TOPOLOGY, first)
    second = coord.plan(mode.TOPOLOGY, "r1").txid
    faults = mode.BrokerFaults(kafka, dsn, threading.Lock(), ledger, gate, random.Random(3))
    assert faults.delete_under_a_plan(timeout=10)  # half of one of txid 2's ranges
    process_batch(coord, mode.TOPOLOGY, second, words)  # re-planned without what is gone
    coord.commit(mode.TOPOLOGY, second)
    for k in range(2, 40):
        txn = coord.plan(mode.TOPOLOGY, f"r{k}")
        process_batch(coord, mode.TOPOLOGY, txn.txid, words)
        coord.commit(mode.TOPOLOGY, txn.txid)
        if txn.empty:
            break
    ledger.close()

    def check() -> ChaosReport:
        report = ChaosReport(seed=1)
        check_run(dsn, cfg, report, Ledger.load(tmp_path / LEDGER))
        return report

    report = check()
    assert report.violations == 0, report.table()
    assert report.skipped_records > 0 and report.aborted_records == ledger.aborted, report.table()
    # The topology counts offsets lost (transaction markers and aborted records among them).
    assert 0 < report.skipped_records <= coord.status(mode.TOPOLOGY).lost_records
    # A skip nobody caused (a range claimed lost beyond the deletion) and a count off by one are caught.
    # (A committed plan is frozen by a trigger: the damage is made past it, as only its owner can.)
    query(dsn, "ALTER TABLE airflow_txn.transactions DISABLE TRIGGER committed_plan_guard; "
               "UPDATE airflow_txn.transactions SET batch = jsonb_set(batch, '{lost,ranges}', "
               "jsonb_build_array(jsonb_build_array(0, 0, 100000))) WHERE topology_id = %s AND txid = %s; "
               "ALTER TABLE airflow_txn.transactions ENABLE TRIGGER committed_plan_guard", (mode.TOPOLOGY, second))
    query(dsn, f"UPDATE {mode.TOPOLOGY}_url_counts SET value = value + 1 "
               f"WHERE url = (SELECT min(url) FROM {mode.TOPOLOGY}_url_counts)")
    damaged = check()
    assert any("skipped partition 0 offsets 0..99999" in p for p in damaged.problems), damaged.table()
    coord.close()


def test_an_operator_fault_before_the_topology_is_registered_waits_for_its_moment(dsn: str) -> None:
    """Regression: the first fault of a run can strike before the first plan task registered the
    topology; a correction or a replay then has no moment yet (re-queued), not a failed fault."""
    stack = SimpleNamespace(state_dsn=dsn)
    operator = Operator(stack, ChaosConfig.quick(seed=3), None, Ledger(), random.Random(3))  # type: ignore[arg-type]
    assert operator.correct() is False and operator.replay() is False and operator.runs == 0
