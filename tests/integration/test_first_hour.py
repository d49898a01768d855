"""What a new user meets in the first hour, on the real embedded Postgres: the demo's producer
restarted on the same store carries on, one clock per commit, reserved state locations."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_transactional.coordinator import Coordinator
from airflow_transactional.sources import EventLog, PostgresLogSource
from airflow_transactional.spec import StateSpec, TopologySpec
from dev.demo import KafkaTweets, Producer, status_line
from dev.kafka import KafkaBroker, read_topic
from tests.helpers import click, counting_topology, make_log, query, run_one
from tests.kafka_helpers import create_topic

pytestmark = pytest.mark.integration


def url_fn(rec: dict[str, object]) -> list[tuple[str, tuple[object, ...], int]]:
    return [("urls", (rec["url"],), 1)]


def _produce(producer: Producer, at_least: int) -> None:
    producer.start()
    deadline = time.monotonic() + 60
    while producer.appended < at_least and time.monotonic() < deadline:
        time.sleep(0.05)
    producer.stop_event.set()
    producer.join(30)


def test_a_restarted_demo_producer_carries_on_and_new_events_commit(coordinator: Coordinator, dsn: str,
                                                                      tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    EventLog(dsn, "tweets").create(4)
    coordinator.register(TopologySpec("words", PostgresLogSource("tweets"),
                                      [StateSpec("urls", {"url": "text"}, combiner="count")], max_batch_size=10**6,
                                      on_bad_record="quarantine"))
    first = Producer(dsn, tmp_path, rate=500, interval=0.05)
    _produce(first, 100)
    run_one(coordinator, "words", "before-restart", url_fn)

    again = Producer(dsn, tmp_path, rate=500, interval=0.05)  # `make demo` run again on the same var/demo
    _produce(again, 100)
    assert again.appended >= 100
    txid = run_one(coordinator, "words", "after-restart", url_fn)
    assert coordinator.transaction("words", txid).planned_records >= 100  # new events, committed

    replay = Producer(dsn, tmp_path, rate=5, interval=0.05)
    replay.run_id = first.run_id  # a producer that re-sends what the log holds says so
    with caplog.at_level(logging.WARNING):
        replay.start()
        time.sleep(0.5)
        replay.stop_event.set()
        replay.join(30)
    assert replay.appended == 0
    assert "were duplicates of events the log already holds: nothing new was appended" in caplog.text


def test_a_commit_has_one_time_wherever_it_is_recorded(coordinator: Coordinator, dsn: str) -> None:
    make_log(dsn).append([click(i) for i in range(10)])
    coordinator.register(counting_topology())
    txid = run_one(coordinator, "clicks", "r1")
    [(planned, audited, topology)] = query(
        dsn, "SELECT t.committed_at, c.committed_at, p.last_commit_at FROM airflow_txn.transactions t "
             "JOIN airflow_txn.commits c USING (topology_id, txid) JOIN airflow_txn.topologies p USING (topology_id) "
             "WHERE t.txid = %s", (txid,))
    assert planned == audited == topology
    again = coordinator.commit("clicks", txid)
    assert not again.committed and again.committed_at == planned and planned.isoformat() in again.message


def test_a_state_can_name_its_schema(coordinator: Coordinator, dsn: str) -> None:
    make_log(dsn).append([click(i) for i in range(5)])
    spec = TopologySpec("clicks", PostgresLogSource("clicks"),
                        [StateSpec("clicks_count", {"user_id": "text"}, combiner="count", schema="analytics"),
                         StateSpec("clicks_amount", {"user_id": "text"}, combiner="sum")])
    coordinator.register(spec)
    run_one(coordinator, "clicks", "r1")
    assert query(dsn, "SELECT sum(value) FROM analytics.clicks_count") == [(5,)]
    assert query(dsn, "SELECT to_regclass('public.clicks_count')") == [(None,)]
    assert json.dumps(coordinator.spec("clicks").to_config()).count('"schema": "analytics"') == 1


def test_the_kafka_demo_aborts_records_a_committed_reader_never_sees(kafka: KafkaBroker) -> None:
    """Regression: the demo's producer aborted right after produce(), so librdkafka purged the
    records it had not sent: the topic held abort markers and no aborted record, and the
    read_committed filtering the docs advertise was never exercised. Sent first, then aborted."""
    topic = create_topic(kafka, 1)
    tweets = KafkaTweets(kafka, rate=20, interval=0.1, topic=topic)
    tweets.rng.random = iter([0.05, 0.5] * 50).__next__  # type: ignore[method-assign]  # every other one aborted
    tweets.start()
    while tweets.aborted < 4 or tweets.committed < 4:
        time.sleep(0.1)
    tweets.stop_event.set()
    tweets.join(60)
    every = read_topic(kafka, topic, committed_only=False)
    committed = read_topic(kafka, topic)
    assert len(committed) == tweets.committed and len(every) == tweets.committed + tweets.aborted


def test_the_demos_console_line_says_what_blocks_a_topology_and_what_its_lag_counts(
        coordinator: Coordinator, dsn: str, tmp_path: Path) -> None:
    """Regression: the demo's console line never said "blocked", and its lag read as records for a
    landing directory (files) and a Kafka topic (offsets)."""
    from airflow_transactional.sources import LandingDirectory

    coordinator.register(TopologySpec("files", LandingDirectory(str(tmp_path), settle_seconds=0),
                                      [StateSpec("file_counts", {"user_id": "text"}, combiner="count")]))
    for name in ("a.json", "b.json"):
        (tmp_path / name).write_text('{"user_id": "u"}\n')
    txn = coordinator.plan("files", "r1")
    with pytest.raises(RuntimeError), coordinator.processing("files", txn.txid):  # its attempt fails
        raise RuntimeError("spark-submit exited with code 1")
    line = status_line("files", coordinator.status("files"))
    assert ", lag 2 files," in line  # a landing directory counts files past the committed ones
    assert line.endswith("BLOCKED (airflow-txn status files says why)"), line


def test_a_restarted_demo_broker_keeps_its_port(tmp_path: Path) -> None:
    """Regression: the demo's Kafka port changed on every start, so an AIRFLOW_CONN_KAFKA_DEFAULT
    a user exported from one banner was stale after a restart. The broker takes its last ports
    again when they are free (a new one when they are not)."""
    first = KafkaBroker(tmp_path / "kafka").start()
    port = first.port
    from confluent_kafka.admin import AdminClient

    held = AdminClient(first.client_config())  # a client still connected when the broker stops: the broker
    held.list_topics(timeout=30)  # closes the connection, which lingers in TIME-WAIT on its port -- the
    first.stop()  # quick restart's case, where the kept port was refused and a new one taken
    again = KafkaBroker(tmp_path / "kafka").start()
    try:
        assert again.port == port
        assert again.create_topic("tweets", 1) is None  # a working broker on it
    finally:
        again.stop(remove=True)


def test_the_demos_s3_producer_rewrites_only_keys_whose_every_version_committed(
        coordinator: Coordinator, dsn: str, s3_server: Any, tmp_path: Path) -> None:
    """Regression: the demo's S3 producer uploaded a committed key again while that key's newer
    version was planned and not yet processed; S3Proxy keeps no versions, so the planned one could
    no longer be read and two txids failed for good."""
    from airflow_transactional import LandingDirectory, StateSpec, TopologySpec
    from airflow_transactional.processing import process_batch
    from dev.s3 import S3_BUCKET, S3_PREFIX, S3Orders

    landing = tmp_path / S3_BUCKET / S3_PREFIX  # the producer's keys are the paths after the bucket
    landing.mkdir(parents=True)
    for name in ("a.json", "b.json"):
        (landing / name).write_text(json.dumps({"user": "u"}) + "\n")
    coordinator.register(TopologySpec("s3_orders", LandingDirectory(str(landing), settle_seconds=0, max_files=1),
                                      [StateSpec("orders_seen", {"user": "text"}, combiner="count")]))
    first = coordinator.plan("s3_orders", "r1").txid
    process_batch(coordinator, "s3_orders", first, lambda r: [("orders_seen", (r["user"],), 1)])
    assert coordinator.commit("s3_orders", first).committed
    producer = S3Orders(s3_server, dsn)
    assert producer.committed_key() == f"{S3_PREFIX}/a.json"  # never b.json, not committed yet
    assert producer.committed_key() is None  # a.json was rewritten once: never a third version
    (landing / "a.json").write_text(json.dumps({"user": "v"}) + "\n" * 2)  # that rewrite: a new version
    coordinator.plan("s3_orders", "r2")  # registers it, beside b.json's
    assert S3Orders(s3_server, dsn).committed_key() is None  # a.json's newest version is not committed
