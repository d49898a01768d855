"""Committed output published to a real Kafka topic: each txid's events in one Kafka transaction,
in txid order, exactly once for read_committed consumers -- also when the publisher dies before
or after the Kafka commit, and when a second publisher starts beside a stale one; a correction's
retractions published with a header, and taken back by a topology of the store reading the topic."""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from airflow_transactional import OutputEvent, OutputSpec, StateSpec, TopologySpec
from airflow_transactional.cli import main as cli
from airflow_transactional.coordinator import Coordinator
from airflow_transactional.exceptions import ConfigError, TransactionalError
from airflow_transactional.processing import process_batch
from airflow_transactional.sinks.kafka import HEADERS, RETRACTS, KafkaPublisher, PublishedEvent
from airflow_transactional.sources import EventLog, PostgresLogSource
from airflow_transactional.sources.kafka import KafkaSource, client_config
from dev import faults
from dev.kafka import KafkaBroker
from tests.helpers import click, make_log, query, table
from tests.integration.test_output_logs import drain
from tests.kafka_helpers import create_topic, read_topic

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def topology(topic: str) -> TopologySpec:
    return TopologySpec("big", PostgresLogSource("clicks"), [StateSpec("big_count", {"user_id": "text"})],
                        outputs=[OutputSpec("big", partitions=2, kafka_topic=topic)], max_batch_size=10)


def big_fn(rec: dict[str, Any]) -> list[Any]:
    out: list[Any] = [("big_count", (rec["user"],), 1)]
    if int(rec["amount"]) >= 5:
        out.append(OutputEvent("big", {"user": rec["user"], "amount": int(rec["amount"])}, key=rec["user"]))
    return out


def smaller(rec: dict[str, Any]) -> list[Any]:
    """A fix of big_fn: only amounts of 7 and more are big."""
    return [e for e in big_fn(rec) if not isinstance(e, OutputEvent) or e.payload["amount"] >= 7]


def totals(fn: Any, clicks: int) -> dict[str, int]:
    """The amounts per user of the events ``fn`` passes on."""
    found: Counter[str] = Counter()
    for _eid, payload in [click(i) for i in range(clicks)]:
        for e in fn(json.loads(payload)):
            if isinstance(e, OutputEvent):
                found[e.payload["user"]] += e.payload["amount"]
    return dict(found)


def commit_all(coord: Coordinator, prefix: str) -> list[int]:
    txids = []
    while True:
        txn = coord.plan("big", f"{prefix}{len(txids)}")
        process_batch(coord, "big", txn.txid, big_fn)
        coord.commit("big", txn.txid)
        if txn.empty:
            return txids
        txids.append(txn.txid)


def published(kafka: KafkaBroker, topic: str) -> list[tuple[int, int, str]]:
    """(txid, seq, event id) of every record a read_committed consumer sees, in (txid, seq) order."""
    out = []
    for msg in read_topic(kafka, topic):
        if msg.key() == b"forged":  # written by the tests as someone else
            continue
        headers = dict(msg.headers() or [])
        assert headers[HEADERS[0]] == b"big" and headers[HEADERS[1]] == b"big"
        out.append((int(headers[HEADERS[2]]), int(headers[HEADERS[3]]), msg.key().decode()))
    return sorted(out)


def committed(dsn: str, kafka: KafkaBroker, *, partitions: int, clicks: int) -> tuple[Coordinator, str, list[int]]:
    """The ``big`` topology over ``clicks`` clicks, every batch committed; its output's topic of
    ``partitions`` partitions (nothing published yet), and the txids with events."""
    topic = create_topic(kafka, partitions)
    make_log(dsn).append([click(i) for i in range(clicks)])
    coord = Coordinator(dsn)
    coord.register(topology(topic))
    return coord, topic, commit_all(coord, "r")


def expected(dsn: str) -> list[str]:
    return [e for (e,) in query(dsn, "SELECT event_id FROM airflow_txn.log_events WHERE log_name = 'big' "
                                     "ORDER BY event_id")]


def test_each_committed_txid_is_published_once_in_one_kafka_transaction_in_txid_order(
        dsn: str, kafka: KafkaBroker) -> None:
    coord, topic, txids = committed(dsn, kafka, partitions=3, clicks=60)
    [first] = coord.publish("big", through_txid=2)
    assert first.txids == [1, 2]
    [rest] = coord.publish("big")
    assert rest.txids == list(range(3, txids[-1] + 2)) and coord.publish("big")[0].txids == []
    seen = published(kafka, topic)
    assert sorted(e for _t, _s, e in seen) == expected(dsn)
    assert len({e for _t, _s, e in seen}) == len(seen)  # none twice
    # Every txid's records are one Kafka transaction: its seq numbers run 0..n-1 without a gap.
    by_txid = Counter(t for t, _s, _e in seen)
    assert all(sorted(s for t2, s, _e in seen if t2 == t) == list(range(n)) for t, n in by_txid.items())
    assert query(dsn, "SELECT published_txid FROM airflow_txn.publications") == [(txids[-1] + 1,)]
    coord.close()


@pytest.mark.parametrize("point", ["publish.before_kafka_commit", "publish.after_kafka_commit"])
def test_a_publisher_killed_around_the_kafka_commit_publishes_nothing_twice_and_skips_nothing(
        dsn: str, kafka: KafkaBroker, point: str) -> None:
    coord, topic, _txids = committed(dsn, kafka, partitions=2, clicks=40)
    # A publisher process dies at the point, on txid 2: its Kafka transaction is open (before) or
    # committed but not recorded in Postgres (after).
    script = ("import sys; from airflow_transactional.coordinator import Coordinator; "
              "Coordinator(sys.argv[1]).publish('big')")
    died = subprocess.run([sys.executable, "-c", script, dsn], env=faults.child_env(faults=f"{point}:big:2=exit"),
                          capture_output=True, text=True, timeout=300)
    assert died.returncode != 0 and "Traceback" not in died.stderr, died.stderr[-2000:]
    recorded = query(dsn, "SELECT published_txid FROM airflow_txn.publications")
    assert recorded == [(1,)]
    [again] = coord.publish("big")  # a new publisher fences the dead one and carries on
    assert again.published_through == (2 if point == "publish.after_kafka_commit" else 1)
    seen = published(kafka, topic)
    assert sorted(e for _t, _s, e in seen) == expected(dsn)
    assert len({e for _t, _s, e in seen}) == len(seen)
    coord.close()


def test_a_second_publisher_fences_a_stale_one(dsn: str, kafka: KafkaBroker) -> None:
    coord, topic, _txids = committed(dsn, kafka, partitions=1, clicks=20)
    config = client_config("kafka_default")
    stale = KafkaPublisher(config, topic=topic, topology_id="big", output="big",
                           transactional_id="airflow-txn.airflow_txn.big.big", registration=1)
    coord.publish("big")  # starts a publisher with the same transactional id: the stale one is fenced
    with pytest.raises(Exception, match=r"(?i)fenc"):
        stale.publish(99, [PublishedEvent(0, "zombie", json.dumps({"late": True}))])
    assert "zombie" not in {e for _t, _s, e in published(kafka, topic)}
    coord.close()


def test_an_output_published_to_a_missing_topic_is_a_clear_error(dsn: str, kafka: KafkaBroker) -> None:
    make_log(dsn).append([click(i) for i in range(10)])
    coord = Coordinator(dsn)
    coord.register(topology("no-such-topic"))
    commit_all(coord, "r")
    with pytest.raises(ConfigError, match="no topic 'no-such-topic' to publish output 'big' to: create it"):
        coord.publish("big")
    coord.close()


def test_retention_waits_for_the_publisher_and_forced_retention_stops_it_with_the_way_out(
        dsn: str, kafka: KafkaBroker, capsys: pytest.CaptureFixture[str]) -> None:
    coord, topic, txids = committed(dsn, kafka, partitions=2, clicks=40)
    coord.publish("big", through_txid=1)
    out = EventLog(dsn, "big")
    [(head,)] = query(dsn, "SELECT next_lsn - 1 FROM airflow_txn.log_partitions WHERE log_name = 'big' "
                           "AND partition = 0")
    with pytest.raises(ConfigError, match="output 'big' has published to Kafka only through LSN"):
        out.truncate(0, head)  # no consumer reads the output log, but the publisher has not sent it all
    assert out.truncate(0, head, force=True) > 0
    with pytest.raises(TransactionalError, match=r"removed .*`airflow-txn publish big --mark-published 2`"):
        coord.publish("big")
    assert query(dsn, "SELECT published_txid FROM airflow_txn.publications") == [(1,)]  # nothing half-sent
    # The operator's way out: mark what retention took as published, and publishing goes on.
    assert cli(["--dsn", dsn, "publish", "big", "--mark-published", str(txids[-1] + 1)]) == 0
    assert "marked published through txid" in capsys.readouterr().out
    make_log(dsn).append([click(i) for i in range(40, 60)])
    later = commit_all(coord, "s")
    assert cli(["--dsn", dsn, "publish", "big"]) == 0
    assert f"published txids {later[0]}..{later[-1] + 1}" in capsys.readouterr().out
    assert {t for t, _s, _e in published(kafka, topic)} == {1, *later}
    coord.close()


def _forge(kafka: KafkaBroker, topic: str, txid: bytes, registration: bytes, key: str = "forged") -> None:
    """One record from another producer, with this output's headers (anyone who may write the topic)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    producer.produce(topic, key=key, value="{}", partition=0, headers=[
        (HEADERS[0], b"big"), (HEADERS[1], b"big"), (HEADERS[2], txid), (HEADERS[3], b"0"), (HEADERS[4], registration)])
    assert producer.flush(30) == 0


@pytest.mark.parametrize("claim", [b"1000000000", b"not-a-number", b"2"])
def test_a_record_someone_else_wrote_with_this_outputs_headers_skips_nothing(
        dsn: str, kafka: KafkaBroker, claim: bytes, caplog: pytest.LogCaptureFixture) -> None:
    """Regression: one record claiming txid 1000000000 stopped every later txid from being
    published; a txid header that is not a number made every publish fail for good; a claim of the
    next txid made it skipped. A claim now counts only for the txid after the last recorded one,
    and only when its records are exactly that txid's events; the rest are reported."""
    coord, topic, txids = committed(dsn, kafka, partitions=1, clicks=40)
    [first] = coord.publish("big", through_txid=1)
    assert first.txids == [1]
    [(num,)] = query(dsn, "SELECT num FROM airflow_txn.topologies WHERE topology_id = 'big'")
    _forge(kafka, topic, claim, str(num).encode())
    with caplog.at_level("WARNING"):
        [rest] = coord.publish("big")
    assert rest.txids == list(range(2, txids[-1] + 2)) and rest.ignored == 1
    assert "were not believed" in caplog.text
    seen = published(kafka, topic)
    assert sorted(e for _t, _s, e in seen) == expected(dsn)
    assert query(dsn, "SELECT published_txid FROM airflow_txn.publications") == [(txids[-1] + 1,)]
    coord.close()


def test_after_a_reset_the_old_runs_records_publish_nothing_in_the_new_ones_place(dsn: str, kafka: KafkaBroker) -> None:
    """Regression: after ``airflow-txn reset`` the old run's headers in the topic made the new
    run's txids "already published", and they never were."""
    coord, topic, old = committed(dsn, kafka, partitions=2, clicks=30)
    [before] = coord.publish("big")
    assert before.txids == [*old, old[-1] + 1]
    coord.reset("big")
    coord.register(topology(topic))
    make_log(dsn).append([click(i) for i in range(30, 50)])  # new events: the output log keeps the old ones' ids
    new = commit_all(coord, "n")
    [after] = coord.publish("big")
    assert after.txids == [*new, new[-1] + 1] and after.ignored > 0  # the old run's records, not believed
    assert sorted(e for _t, _s, e in published(kafka, topic)) == expected(dsn)
    coord.close()


def test_publish_refuses_a_topology_without_a_kafka_output_and_a_txid_below_one(
        dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    make_log(dsn).append([click(i) for i in range(5)])
    coord = Coordinator(dsn)
    coord.register(TopologySpec("quiet", PostgresLogSource("clicks"), [StateSpec("quiet_count", {"user_id": "text"})]))
    assert cli(["--dsn", dsn, "publish", "quiet"]) == 2
    assert "publishes nothing to Kafka: none of its outputs is declared with kafka_topic" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli(["--dsn", dsn, "publish", "quiet", "--through", "-5"])
    assert "a txid is a whole number from 1, got '-5'" in capsys.readouterr().err
    coord.close()


def test_a_publisher_says_at_once_when_the_broker_is_not_there(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: a closed broker made ``airflow-txn publish`` wait 61 s before its error."""
    import time

    from airflow_transactional.exceptions import SourceUnreachable
    from dev.embedded import free_port

    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_CLOSED", json.dumps(
        {"conn_type": "kafka", "extra": {"bootstrap.servers": f"127.0.0.1:{free_port()}"}}))
    started = time.monotonic()
    with pytest.raises(SourceUnreachable, match="is not reachable to publish output 'big'"):
        KafkaPublisher(client_config("kafka_closed"), topic="t", topology_id="big", output="big",
                       transactional_id="airflow-txn.x.big.big", registration=1)
    assert time.monotonic() - started < 30


def test_a_correction_publishes_its_retractions_with_the_id_they_take_back(dsn: str, kafka: KafkaBroker) -> None:
    coord, topic, txids = committed(dsn, kafka, partitions=2, clicks=20)
    coord.publish("big")
    fix = coord.plan_correction("big", "fix", 1, txids[-1])
    process_batch(coord, "big", fix.txid, smaller)
    coord.commit("big", fix.txid)
    [done] = coord.publish("big")
    assert done.txids == [fix.txid]
    taken_back = {msg.key().decode(): (dict(msg.headers())[RETRACTS].decode(), json.loads(msg.value()))
                  for msg in read_topic(kafka, topic) if dict(msg.headers() or []).get(RETRACTS)}
    retracted = {origin: json.loads(payload) for origin, payload in query(
        dsn, "SELECT v.origin, e.payload FROM airflow_txn.log_versions v JOIN airflow_txn.log_events e "
             "USING (log_name, event_id) WHERE v.retraction")}
    assert retracted and {k: v for k, v in taken_back.values()} == retracted
    assert all(key == f"{origin}~retracted@{fix.txid}" for key, (origin, _p) in taken_back.items())
    assert all(p["amount"] in (5, 6) for p in retracted.values())
    # The docs' consumer of the topic ends with the fixed code's totals.
    consumer = runpy.run_path(str(REPO / "docs" / "examples" / "consumers" / "kafka_totals.py"))
    assert consumer["totals"](read_topic(kafka, topic)) == totals(smaller, 20)
    coord.close()


def _amount(rec: dict[str, Any]) -> list[Any]:
    return [("k_amount", (rec["user"],), rec["amount"])]


def test_a_kafka_reader_of_the_same_store_takes_published_retractions_back(dsn: str, kafka: KafkaBroker) -> None:
    """A topology reading the published topic: its state follows the correction upstream -- each
    retraction the publisher put there (recorded with its publication) taken back, negated."""
    coord, topic, txids = committed(dsn, kafka, partitions=2, clicks=30)
    coord.register(TopologySpec("kreader", KafkaSource(topic), [StateSpec("k_amount", {"user_id": "text"})],
                                max_batch_size=7))
    coord.publish("big")
    drain(coord, "kreader", _amount, "a")
    assert {k: v for k, v in table(dsn, "k_amount").items() if v} == totals(big_fn, 30)
    fix = coord.plan_correction("big", "fix", 1, txids[-1])
    process_batch(coord, "big", fix.txid, smaller)
    coord.commit("big", fix.txid)
    coord.publish("big")
    assert query(dsn, "SELECT count(*) FROM airflow_txn.published_retractions")[0][0] > 0
    drain(coord, "kreader", _amount, "b")
    assert {k: v for k, v in table(dsn, "k_amount").items() if v} == totals(smaller, 30)
    assert query(dsn, "SELECT count(*) FROM airflow_txn.quarantine WHERE topology_id = 'kreader'") == [(0,)]
    # Recorded for the topic's cluster and topic ids: a topic of that name elsewhere is not it -- its
    # retractions are set aside, never applied.
    retractions = query(dsn, "UPDATE airflow_txn.published_retractions SET cluster_id = 'another' RETURNING 1")
    coord.register(TopologySpec("kother", KafkaSource(topic),
                                [StateSpec("k_amount", {"user_id": "text"}, table="o_amount")]))
    drain(coord, "kother", _amount, "c")
    refused = query(dsn, "SELECT reason FROM airflow_txn.quarantine WHERE topology_id = 'kother'")
    assert len(refused) == len(retractions) and all("published by a topology of another" in r for (r,) in refused)
    # One with an output log of its own could not retract its events in turn: the correction says so.
    coord.register(TopologySpec("krelay", KafkaSource(topic), [StateSpec("r_amount", {"user_id": "text"})],
                                outputs=[OutputSpec("relay")]))
    with pytest.raises(ConfigError, match=r"topology 'krelay' reads its output events .* from Kafka and appends"):
        coord.plan_correction("big", "again", 1, txids[-1])
    coord.close()
