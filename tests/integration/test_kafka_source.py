"""The Kafka source on a real broker and a real Postgres: plans at exact offsets below the last
stable offset, producer transactions, partitions that appear, records deleted under a plan, a
topic deleted and created again, a broker that restarts or is gone."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from typing import Any

import pytest

from airflow_transactional import KafkaSource, StateSpec, TopologySpec, faults
from airflow_transactional.cli import main as cli
from airflow_transactional.coordinator import Coordinator
from airflow_transactional.core import lag
from airflow_transactional.exceptions import BatchUnavailable, ConfigError, SourceChanged, SourceUnreachable
from airflow_transactional.processing import process_batch
from dev.kafka import KafkaBroker
from tests.helpers import query, table
from tests.kafka_helpers import (
    TransactionalProducer,
    add_partitions,
    create_topic,
    delete_records,
    delete_topic,
    produce,
)

pytestmark = pytest.mark.integration


def spend(topic: str, *, topology_id: str = "spend", opaque: bool = False, max_batch_size: int = 1000) -> TopologySpec:
    return TopologySpec(topology_id, KafkaSource(topic), [StateSpec(f"{topology_id}_total", {"user_id": "text"})],
                        opaque=opaque, max_batch_size=max_batch_size, max_in_flight=5)


def spend_fn(topology_id: str = "spend") -> Any:
    def fn(rec: dict[str, Any]) -> list[tuple[str, tuple[Any, ...], Any]]:
        return [(f"{topology_id}_total", (rec["user"],), int(rec["amount"]))]
    return fn


def payments(n: int, start: int = 0) -> list[tuple[str, dict[str, Any]]]:
    return [(f"u{i % 5}", {"user": f"u{i % 5}", "amount": i}) for i in range(start, start + n)]


def totals(records: list[tuple[str, dict[str, Any]]]) -> dict[str, int]:
    out: Counter[str] = Counter()
    for _key, value in records:
        out[value["user"]] += value["amount"]
    return dict(out)


def drain(coord: Coordinator, topology_id: str = "spend", prefix: str = "r") -> list[int]:
    """Plan, process and commit until nothing is left; the txids committed."""
    done = []
    while True:
        txn = coord.plan(topology_id, f"{prefix}{len(done)}")
        process_batch(coord, topology_id, txn.txid, spend_fn(topology_id))
        coord.commit(topology_id, txn.txid)
        done.append(txn.txid)
        if txn.empty:
            return done


def test_aborted_records_are_never_counted_and_an_open_transaction_stops_the_plan(
        dsn: str, kafka: KafkaBroker) -> None:
    topic = create_topic(kafka, 2)
    coord = Coordinator(dsn)
    coord.register(spend(topic))
    kept, dropped = payments(40), payments(25, start=100)
    producer = TransactionalProducer(kafka)
    producer.send(topic, kept[:20])
    producer.commit()
    producer.send(topic, dropped)
    producer.abort()
    producer.send(topic, kept[20:])
    producer.commit()
    drain(coord)
    assert table(dsn, "spend_total") == totals(kept)
    read = sum(c["records_read"] for c in coord.commits("spend"))
    assert read == len(kept)  # the aborted records used offsets, never counted
    st = coord.status("spend")  # and the offsets they and the three markers (at least) took, counted
    assert st.offsets_skipped == sum(int(v) for v in st.committed_offsets.values()) - len(kept)
    assert st.offsets_skipped >= len(dropped) + 3
    # A transaction still open: the plan stops at its first offset (the last stable offset), so a
    # replay can never see records that were undecided when it was planned.
    before = coord.status("spend").lag
    late = TransactionalProducer(kafka)
    late.send(topic, payments(10, start=500), partition=0)
    produce(kafka, topic, payments(5, start=900), partition=1)  # decided records behind it
    txn = coord.plan("spend", "while-open")
    assert {p: hi - lo for p, lo, hi in txn.batch["ranges"]} == {1: 5}
    process_batch(coord, "spend", txn.txid, spend_fn())
    coord.commit("spend", txn.txid)
    source = KafkaSource(topic)
    held = source.snapshot().stable[0]  # the open transaction's first offset
    late.commit()
    # The commit's markers reach the partition a moment after commit_transaction returns: the last
    # stable offset moves past the late records only then (a plan before it finds nothing new).
    deadline = time.monotonic() + 30
    while source.snapshot().stable[0] <= held and time.monotonic() < deadline:
        time.sleep(0.1)
    drain(coord, prefix="after")
    assert table(dsn, "spend_total") == totals(kept + payments(10, start=500) + payments(5, start=900))
    assert before == 0
    coord.close()


def test_a_batch_of_only_markers_and_aborted_records_commits_empty(dsn: str, kafka: KafkaBroker) -> None:
    topic = create_topic(kafka, 1)
    coord = Coordinator(dsn)
    coord.register(spend(topic))
    producer = TransactionalProducer(kafka)
    producer.send(topic, payments(7))
    producer.abort()
    txn = coord.plan("spend", "r0")
    assert txn.planned_records == 8  # seven aborted records and the abort marker: offsets, not records
    result = process_batch(coord, "spend", txn.txid, spend_fn())
    assert result.records_read == 0
    assert coord.commit("spend", txn.txid).committed
    assert table(dsn, "spend_total") == {}
    assert coord.status("spend").lag == 0
    assert coord.status("spend").offsets_skipped == 8
    coord.close()


def test_a_partition_added_between_plans_is_read_from_its_start(dsn: str, kafka: KafkaBroker) -> None:
    topic = create_topic(kafka, 2)
    coord = Coordinator(dsn)
    coord.register(spend(topic))
    first = payments(30)
    produce(kafka, topic, first)
    planned = coord.plan("spend", "r0")  # before the partition exists
    add_partitions(kafka, topic, 3)
    third = payments(12, start=300)
    produce(kafka, topic, third, partition=2)
    process_batch(coord, "spend", planned.txid, spend_fn())  # reads exactly its plan: two partitions
    coord.commit("spend", planned.txid)
    assert sorted(p for p, _lo, _hi in planned.batch["ranges"]) == [0, 1]
    assert table(dsn, "spend_total") == totals(first)
    nxt = coord.plan("spend", "r1")
    assert [(p, lo, hi) for p, lo, hi in nxt.batch["ranges"]] == [(2, 0, 12)]
    process_batch(coord, "spend", nxt.txid, spend_fn())
    coord.commit("spend", nxt.txid)
    drain(coord, prefix="rest")
    assert table(dsn, "spend_total") == totals(first + third)
    coord.close()


def test_records_deleted_under_a_plan_fail_a_transactional_topology_naming_the_way_out(
        dsn: str, kafka: KafkaBroker) -> None:
    topic = create_topic(kafka, 1)
    coord = Coordinator(dsn)
    coord.register(spend(topic))
    produce(kafka, topic, payments(20))
    txn = coord.plan("spend", "r0")
    delete_records(kafka, topic, {0: 5})
    with pytest.raises(BatchUnavailable, match=r"partition 0 offsets 0\.\.4.*opaque=True"):
        process_batch(coord, "spend", txn.txid, spend_fn())
    assert coord.status("spend").committed_txid == 0
    with pytest.raises(BatchUnavailable, match=f"txid {txn.txid}"):  # every retry, until someone decides
        process_batch(coord, "spend", txn.txid, spend_fn())
    coord.close()


def test_an_opaque_topology_skips_deleted_records_records_the_loss_and_keeps_the_planned_end(
        dsn: str, kafka: KafkaBroker) -> None:
    topic = create_topic(kafka, 2)
    coord = Coordinator(dsn)
    coord.register(spend(topic, opaque=True))
    records = payments(40)
    produce(kafka, topic, records)
    txn = coord.plan("spend", "r0")
    end = dict(txn.end_offsets)
    delete_records(kafka, topic, {0: 3})
    process_batch(coord, "spend", txn.txid, spend_fn())  # re-planned without what is gone
    coord.commit("spend", txn.txid)
    status = coord.status("spend")
    assert status.lost_records == 3
    assert coord.transaction("spend", txn.txid).end_offsets == end  # the checkpoint: the planned end
    got = table(dsn, "spend_total")
    assert sum(got.values()) < sum(totals(records).values())
    assert status.lag == 0
    batch, why_not = coord.committed_batch("spend")  # what the audit recomputes: what is left
    assert why_not is None and {r[0] for r in batch["ranges"]} == {0, 1}, (batch, why_not)
    # Committed records deleted from both partitions: the audit's refusal names each of them.
    delete_records(kafka, topic, {0: 6, 1: 2})
    batch, why_not = coord.committed_batch("spend")
    assert batch == {} and why_not is not None
    assert "partition 0 offsets 3..5, partition 1 offsets 0..1" in why_not, why_not
    coord.close()


def test_a_topic_deleted_and_created_again_is_refused_naming_the_reset(dsn: str, kafka: KafkaBroker) -> None:
    topic = create_topic(kafka, 1)
    coord = Coordinator(dsn)
    coord.register(spend(topic))
    produce(kafka, topic, payments(5))
    drain(coord)
    delete_topic(kafka, topic)
    create_topic(kafka, 1, name=topic)
    produce(kafka, topic, payments(3))
    with pytest.raises(ConfigError, match=r"deleted and created again.*airflow-txn reset spend --yes"):
        coord.plan("spend", "again")
    coord.close()


def test_a_broker_killed_inside_a_commit_and_back_loses_and_repeats_nothing(dsn: str, kafka: KafkaBroker) -> None:
    """The broker SIGKILLed inside a commit's transaction (the chaos harness's ``kafka_kill_commit``):
    the commit commits; the next plan, the broker back with its data, starts where it ended."""
    topic = create_topic(kafka, 2)
    coord = Coordinator(dsn)
    coord.register(spend(topic, max_batch_size=10))
    first = payments(30)
    produce(kafka, topic, first)
    txn = coord.plan("spend", "r0")
    process_batch(coord, "spend", txn.txid, spend_fn())
    struck: list[str] = []

    def engine(name: str, _cur: Any, _scope: tuple[str, ...]) -> None:
        if name == "commit.after_apply" and not struck:
            struck.append(name)
            kafka.kill()

    faults.install(engine)
    try:
        assert coord.commit("spend", txn.txid).committed
    finally:
        faults.install(None)
        kafka.start()
    assert struck == ["commit.after_apply"]
    more = payments(15, start=100)
    produce(kafka, topic, more)
    drain(coord, prefix="after")
    assert table(dsn, "spend_total") == totals(first + more)
    coord.close()


def test_an_unreachable_broker_and_a_missing_topic_are_clear_errors(dsn: str, kafka: KafkaBroker,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    coord = Coordinator(dsn)
    coord.register(spend("no-such-topic"))
    with pytest.raises(ConfigError, match="has no topic 'no-such-topic': create it"):
        coord.plan("spend", "r0")
    topic = create_topic(kafka, 1)
    coord.register(spend(topic, topology_id="elsewhere"))
    monkeypatch.setattr("airflow_transactional.sources.kafka.TIMEOUT", 3.0)
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", json.dumps({"extra": {"bootstrap.servers": "127.0.0.1:9"}}))
    with pytest.raises(SourceUnreachable, match=r"127\.0\.0\.1:9 .*did not answer"):
        coord.plan("elsewhere", "r0")
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", json.dumps({"extra": {"group.id": "x"}}))
    with pytest.raises(ConfigError, match=r"names no broker: set bootstrap\.servers"):
        coord.plan("elsewhere", "r0")
    monkeypatch.delenv("AIRFLOW_CONN_KAFKA_DEFAULT")
    with pytest.raises(ConfigError, match="no connection 'kafka_default'"):
        coord.plan("elsewhere", "r0")
    assert query(dsn, "SELECT count(*) FROM airflow_txn.transactions") == [(0,)]
    coord.close()


def test_records_that_are_no_text_are_quarantined_not_dropped(dsn: str, kafka: KafkaBroker) -> None:
    topic = create_topic(kafka, 1)
    coord = Coordinator(dsn)
    coord.register(spend(topic))
    produce(kafka, topic, [("a", {"user": "a", "amount": 1}), ("b", b"\xff\xfe not utf-8"), ("c", None),
                           ("d", {"user": "d", "amount": 2})])
    drain(coord)
    assert table(dsn, "spend_total") == {"a": 1, "d": 2}
    bad = query(dsn, "SELECT source_offset, event_id FROM airflow_txn.quarantine ORDER BY 1")
    assert bad == [("0:1", f"{topic}:0:1"), ("0:2", f"{topic}:0:2")]
    coord.close()


@pytest.mark.parametrize("opaque", [False, True])
def test_an_attempt_that_read_other_records_than_its_plan_first_did_cannot_complete(
        dsn: str, kafka: KafkaBroker, opaque: bool) -> None:
    """A source changed under a plan (a compacted topic keeps its offsets but drops records): the
    second attempt's digest of what it read differs from the first's. Transactional: refused at
    completion, naming the fix; opaque: taken."""
    topic = create_topic(kafka, 1)
    coord = Coordinator(dsn)
    coord.register(spend(topic, opaque=opaque))
    produce(kafka, topic, payments(10))
    txn = coord.plan("spend", "r0")
    first = process_batch(coord, "spend", txn.txid, spend_fn())
    assert query(dsn, "SELECT read_digest FROM airflow_txn.attempts WHERE attempt = 1")[0][0].startswith("10:")
    with coord.processing("spend", txn.txid) as run:  # as if two records were compacted away meanwhile
        staged = coord.stage(run.attempt, "spend_total", [(("u0",), 5)])
        finish = lambda: run.finish({"spend_total": staged}, records_read=8, read_digest="8:12345")  # noqa: E731
        if opaque:
            finish()
        else:
            with pytest.raises(SourceChanged, match=r"read other records .*opaque=True"):
                finish()
    result = coord.commit("spend", txn.txid)
    assert result.committed and result.attempt == (2 if opaque else first.attempt)
    coord.close()


def test_the_status_of_a_topology_whose_broker_is_gone_says_so_and_keeps_the_rest(
        dsn: str, kafka: KafkaBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    topic = create_topic(kafka, 1)
    coord = Coordinator(dsn)
    coord.register(spend(topic))
    produce(kafka, topic, payments(5))
    drain(coord)
    monkeypatch.setattr("airflow_transactional.sources.kafka.TIMEOUT", 2.0)
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", json.dumps({"extra": {"bootstrap.servers": "127.0.0.1:9"}}))
    lag.forget()
    status = coord.status("spend", lag_wait=lag.PATIENT)
    assert status.committed_txid >= 1 and status.source_error and "127.0.0.1:9" in status.source_error
    coord.close()


@pytest.mark.parametrize("extra", [{"bootstrap.servers": "127.0.0.1:9"}, {"no.such.property": "1"}],
                         ids=["out of reach", "a bad setting"])
def test_a_broken_kafka_topology_costs_a_view_seconds_once_and_holds_no_transaction(
        dsn: str, kafka: KafkaBroker, monkeypatch: pytest.MonkeyPatch, extra: dict[str, str]) -> None:
    """Regression: an unreachable broker made every view of a Kafka topology (the UI's overview
    and pages, the commit's metrics, the stall watch) wait 30 s, in sequence per topology, with a
    database transaction open across the broker calls; a bad setting broke the status with a
    KafkaException (a 500 for the whole overview, a traceback from the command line). The lag is
    asked outside any transaction, waited for a few seconds, and kept: unknown, with why."""
    topic = create_topic(kafka, 1)
    coord = Coordinator(dsn)
    coord.register(spend(topic))
    produce(kafka, topic, payments(5))
    drain(coord)
    lag.forget()
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", json.dumps({"extra": {"bootstrap.servers": kafka.bootstrap,
                                                                           **extra}}))
    held: list[str] = []
    watching = threading.Event()

    def watch() -> None:  # what the store sees while the status asks: a transaction held across the wait
        while not watching.is_set():  # (not one caught between two quick statements on a loaded machine)
            held.extend(s for (s,) in query(dsn, "SELECT state FROM pg_stat_activity WHERE application_name LIKE "
                                                 "'airflow_transactional%' AND state = 'idle in transaction' "
                                                 "AND clock_timestamp() - xact_start > interval '1 second'"))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    began = time.monotonic()
    status = coord.status("spend")
    took = time.monotonic() - began
    watching.set()
    watcher.join()
    assert status.committed_txid >= 1 and status.source_error and status.lag == 0
    assert took < lag.WAIT + 2 and held == []
    began = time.monotonic()
    again = coord.status("spend")  # kept: no second wait
    assert time.monotonic() - began < 1 and again.source_error
    assert cli(["--dsn", dsn, "status", "spend"]) == 0
    coord.close()


def test_the_lags_of_many_kafka_topologies_are_asked_at_once(dsn: str, kafka: KafkaBroker,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The overview and the stall watch read many statuses in turn: asked one by one, N clusters
    out of reach cost N waits; asked ahead all at once (ask_lags), about one."""
    topic = create_topic(kafka, 1)
    coord = Coordinator(dsn)
    for name in ("spend", "elsewhere"):
        coord.register(spend(topic, topology_id=name))
    lag.forget()
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", json.dumps({"extra": {"bootstrap.servers": "127.0.0.1:9"}}))
    began = time.monotonic()
    coord.ask_lags(["spend", "elsewhere"])
    statuses = [coord.status(name, lag_wait=4) for name in ("spend", "elsewhere")]
    assert time.monotonic() - began < 6
    assert all(st.source_error and "not answered for" in st.source_error for st in statuses)
    coord.close()


def test_a_correction_reads_the_planned_offsets_of_its_txids_again_once(dsn: str, kafka: KafkaBroker) -> None:
    """A topic's merged batch is its txids' offset ranges per partition: a correction under a fixed
    transform re-reads exactly them (no record of a later txid, none twice) and commits the difference."""
    topic = create_topic(kafka, partitions=2)
    records = payments(60)
    produce(kafka, topic, records)
    with Coordinator(dsn) as coord:
        coord.register(spend(topic, max_batch_size=20))
        double = spend_fn()
        for run in ("a", "b", "c"):
            txn = coord.plan("spend", run)
            process_batch(coord, "spend", txn.txid, lambda r: [(s, k, 2 * v) for s, k, v in double(r)])
            coord.commit("spend", txn.txid)
        fix = coord.plan_correction("spend", "fix", 1, 2)  # 40 of the 60 records
        assert fix.planned_records == 40
        process_batch(coord, "spend", fix.txid, spend_fn())
        coord.commit("spend", fix.txid)
        third = {k: v // 2 for k, v in coord.changes("spend", 3)["spend_total"]}  # txid 3, still doubled
        assert table(dsn, "spend_total") == {u: totals(records)[u] + third.get(u, 0) for u in totals(records)}
        assert coord.status("spend").offsets_skipped == 0  # a correction reads no new offsets
