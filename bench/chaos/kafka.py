"""The kafka mode: the words topology read from a Kafka topic (``bench/dags/chaos_kafka.py``,
opaque) under the usual faults and the broker's own.

Producers send tweets to ``chaos-tweets`` in Kafka transactions, aborting some; the ledger keeps
what each committed transaction delivered, by its record id (``topic:partition:offset``), and how
many records were aborted. The broker's faults: SIGKILL while a batch is processed
(``kafka_kill_processing``) or while a commit is open (``kafka_kill_commit``), each followed by a
restart on the same ports and data, records deleted under a plan (``delete_records``: up to the
middle of the oldest uncommitted txid's range) and a partition added (``add_partition``). A broker
kill waits for the producers' open transaction to end (``gate``): the producers are the oracle,
whose outcome must be known, not the system under test.

The checks: the state equals the ledger's committed records, less those the topology reported
skipped (``batch.lost.ranges`` of its committed txids) -- and every skipped range must lie below
a deletion the harness made, so nothing is skipped that was not deleted. What the topology
published to ``chaos-relayed`` (read back by a plain read_committed consumer) is each of those
records once, by its id, each txid's records numbered 0..n-1 in one Kafka transaction. (A
post-mortem ``--check`` starts no broker: it checks the state only.)
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import threading
import time
from collections import Counter
from typing import Any

import psycopg2
import psycopg2.errors

from dev.kafka import QUIET, KafkaBroker, add_partitions, admin, delete_records, read_topic
from dev.localstack import LocalStack, RestClient

from .config import KAFKA_TOPIC, MODES, ChaosConfig, ChaosReport
from .supervisor import rest
from .workload import DOMAINS, Ledger

TOPOLOGY = MODES["kafka"][0]
PUBLISHED = "chaos-relayed"  # the topic its committed records are published to
PARTITIONS = 3       # at the start; add_partition grows the topic
MAX_PARTITIONS = 8    # add_partition's cap, unless the run plans more of them (partitions_cap)
#: Malformed values: broken JSON, a required field missing, not JSON, not UTF-8, a tombstone.
MALFORMED: tuple[bytes | None, ...] = (b'{"url": truncated', b'{"user": "u1"}', b"not json at all",
                                       b"\xff\xfe not utf-8", None)


def record_id(partition: int, offset: int) -> str:
    return f"{KAFKA_TOPIC}:{partition}:{offset}"


def position(rid: str) -> tuple[int, int]:
    """(partition, offset) of a record id."""
    _, p, o = rid.rsplit(":", 2)
    return int(p), int(o)


def setup(stack: LocalStack, client: RestClient) -> None:
    """The topic, and the topology unpaused (its first, scheduled run plans an empty batch). The
    harness's own look at the topology's lag reads ``kafka_default`` as Airflow's tasks do: from
    the environment, set here unless the caller did."""
    broker = broker_of(stack)
    os.environ.setdefault("AIRFLOW_CONN_KAFKA_DEFAULT",
                          json.dumps({"conn_type": "kafka", "extra": broker.client_config()}))
    broker.create_topic(KAFKA_TOPIC, PARTITIONS)
    broker.create_topic(PUBLISHED, 2)
    rest(client.wait_for_dag, TOPOLOGY)
    rest(client.unpause, TOPOLOGY)


def broker_of(stack: LocalStack) -> KafkaBroker:
    if stack.kafka is None:
        raise RuntimeError("--mode kafka needs a stack with a Kafka broker (LocalStack(kafka=...))")
    return stack.kafka


class TweetTransactions(threading.Thread):
    """Sends tweets in Kafka transactions until stopped; a transaction is aborted at
    ``cfg.aborted_rate``. Holds ``gate`` for the length of each transaction."""

    def __init__(self, broker: KafkaBroker, index: int, cfg: ChaosConfig, ledger: Ledger, stop: threading.Event,
                 gate: threading.Lock) -> None:
        super().__init__(name=f"kafka-producer-{index}", daemon=True)
        self.broker, self.index, self.cfg, self.ledger = broker, index, cfg, ledger
        self.stop_event, self.gate = stop, gate
        self.rng = random.Random(cfg.seed * 1000 + index)
        self.error: BaseException | None = None

    def _value(self) -> tuple[bytes | None, str | None]:
        """(the record's value, its url -- None for a malformed record)."""
        if self.rng.random() < self.cfg.malformed_rate * 5:  # five kinds, each as likely as in words mode
            return self.rng.choice(MALFORMED), None
        prefix, host = self.rng.choice(["", "www.", "WWW."]), self.rng.choice(DOMAINS)
        url = f"https://{prefix}{host}/post/{self.rng.randint(1, 60)}"
        return json.dumps({"url": url, "user": f"u{self.rng.randint(1, 99)}"}).encode(), url

    def run(self) -> None:
        from confluent_kafka import Producer

        producer = None
        try:
            producer = Producer({**self.broker.client_config(),
                                 "transactional.id": f"chaos-{self.cfg.seed}-{self.index}",
                                 "transaction.timeout.ms": 60_000, "topic.metadata.refresh.interval.ms": 3000},
                                logger=QUIET)
            producer.init_transactions(120)
            while not self.stop_event.wait(0.5):
                values = [self._value() for _ in range(max(1, self.cfg.rate // 2))]
                abort = self.rng.random() < self.cfg.aborted_rate
                with self.gate:
                    delivered = self._transaction(producer, values, abort)
                with self.ledger.lock:
                    if delivered is None:
                        self.ledger.record_aborted(len(values))
                    else:
                        self.ledger.record([(rid, "", url) for rid, url in delivered], 0)
        except BaseException as exc:  # reported at the end
            self.error = exc
        finally:
            del producer  # its threads end now, not when the broker is long gone

    def _transaction(self, producer: Any, values: list[tuple[bytes | None, str | None]],
                     abort: bool) -> list[tuple[str, str | None]] | None:
        """Send ``values`` in one transaction; the (record id, url) delivered if it committed,
        None if it was aborted (asked to, or because the broker refused part of it)."""
        from confluent_kafka import KafkaException

        delivered: list[tuple[str, str | None]] = []
        failed: list[Any] = []

        def report(err: Any, msg: Any, url: str | None) -> None:
            if err is not None:
                failed.append(err)
            else:
                delivered.append((record_id(msg.partition(), msg.offset()), url))

        producer.begin_transaction()
        for value, url in values:
            producer.produce(KAFKA_TOPIC, key=f"u{self.rng.randint(1, 99)}", value=value,
                             on_delivery=lambda err, msg, url=url: report(err, msg, url))
        producer.flush(60)
        if abort or failed or len(delivered) != len(values):
            producer.abort_transaction(60)
            return None
        while True:
            try:
                producer.commit_transaction(60)
                return delivered
            except KafkaException as exc:
                error = exc.args[0]
                if error.retriable():
                    time.sleep(1)
                    continue
                if error.txn_requires_abort():
                    producer.abort_transaction(60)
                    return None
                raise


#: How ``airflow-txn audit`` refuses a topic whose committed records are gone: every partition's
#: range is named, "(partition P offsets A..B, partition Q offsets C..D)".
REMOVED = re.compile(r"retention removed committed records \(([^)]*)\)")
RANGE = re.compile(r"partition (\d+) offsets (\d+)\.\.(\d+)")


def audit_refused(output: str, ledger: Ledger) -> str:
    """Why the audit refused, when it refused only for committed records the harness deleted
    (``delete_records`` deletes every record below an offset, committed ones too); else ""."""
    found = REMOVED.search(output)
    ranges = [tuple(int(g) for g in r.groups()) for r in RANGE.finditer(found.group(1))] if found else []
    if not ranges or any(hi >= ledger.deleted.get(p, 0) for p, _lo, hi in ranges):
        return ""  # no refusal, or a range gone that the harness did not delete
    return "; ".join(f"partition {p}'s committed offsets {lo}..{hi} are gone, below offset {ledger.deleted[p]} that "
                     "delete_records deleted" for p, lo, hi in ranges)


def partitions_cap(cfg: ChaosConfig) -> int:
    """How far ``add_partition`` may grow the topic: room for every one the run plans (a soak
    plans dozens: capped at MAX_PARTITIONS, all but five of them missed), and MAX_PARTITIONS at least."""
    planned = -(-cfg.faults // max(1, len(cfg.kinds)))  # the most of one kind a plan holds
    return max(MAX_PARTITIONS, PARTITIONS + planned)


class BrokerFaults:
    """The kafka kinds of :class:`.faults.Faults`, which it calls with its own helpers."""

    def __init__(self, broker: KafkaBroker, dsn: str, components: threading.Lock, ledger: Ledger,
                 gate: threading.Lock, rng: random.Random, max_partitions: int = MAX_PARTITIONS) -> None:
        # ``components``: the supervisor's lock, held while a fault restarts a component
        self.broker, self.dsn, self.components = broker, dsn, components
        self.ledger, self.gate, self.rng, self.max_partitions = ledger, gate, rng, max_partitions

    def kill_and_restart(self) -> None:
        """SIGKILL the broker, wait a moment, start it again (same ports, same data)."""
        with self.gate, self.components:
            self.broker.kill()
            logging.info("fault: the Kafka broker SIGKILLed")
            time.sleep(self.rng.uniform(1, 5))
            self.broker.start()

    def delete_under_a_plan(self, timeout: float = 180) -> bool:
        """Delete the records of one partition up to the middle of the oldest uncommitted txid's
        range there; False if no plan with records came in ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            target = self._planned_range()
            if target is not None:
                p, lo, hi = target
                before = lo + max(1, (hi - lo) // 2)
                self._delete(p, before)
                return True
            time.sleep(1)
        return False

    def _planned_range(self) -> tuple[int, int, int] | None:
        try:
            with psycopg2.connect(self.dsn) as conn, conn.cursor() as cur:
                cur.execute("SELECT batch FROM airflow_txn.transactions WHERE topology_id = %s "
                            "AND status = 'planned' ORDER BY txid", (TOPOLOGY,))
                plans = [b for (b,) in cur.fetchall()]
            conn.close()
        except (psycopg2.errors.UndefinedTable, psycopg2.OperationalError):  # no plan yet; Postgres restarting
            return None
        for batch in plans:
            ranges = [(int(p), int(lo), int(hi)) for p, lo, hi in (batch or {}).get("ranges", []) if hi - lo >= 2]
            if ranges:
                return self.rng.choice(ranges)
        return None

    def _delete(self, partition: int, before: int) -> None:
        delete_records(self.broker, KAFKA_TOPIC, {partition: before})
        with self.ledger.lock:
            self.ledger.record_deleted(partition, before)
        logging.info("fault: records of partition %d below offset %d deleted", partition, before)

    def add_partition(self) -> bool:
        count = len(admin(self.broker).list_topics(KAFKA_TOPIC, timeout=30).topics[KAFKA_TOPIC].partitions)
        if count >= self.max_partitions:
            return False
        add_partitions(self.broker, KAFKA_TOPIC, count + 1)
        logging.info("fault: partition %d added to %s", count, KAFKA_TOPIC)
        return True


def expected(dsn: str, report: ChaosReport, ledger: Ledger) -> Ledger:
    """The ledger's committed records the state must hold: all of them, less those the topology
    reported skipped (each skipped range checked against the deletions the harness made); in a
    post-mortem, only those below the committed checkpoint."""
    r = report
    r.aborted_records, r.malformed_injected = ledger.aborted, len(ledger.malformed)
    r.events_appended = len(ledger.valid) + len(ledger.malformed)
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT txid, batch->'lost'->'ranges' FROM airflow_txn.transactions "
                    "WHERE topology_id = %s AND status = 'committed' AND batch ? 'lost'", (TOPOLOGY,))
        lost = [(txid, int(p), int(a), int(b)) for txid, ranges in cur.fetchall() for p, a, b in ranges]
        cur.execute("SELECT committed_offsets FROM airflow_txn.topologies WHERE topology_id = %s", (TOPOLOGY,))
        row = cur.fetchone()
        committed = {int(p): int(o) for p, o in (row[0] if row else {}).items()}
    conn.close()
    for txid, p, a, b in lost:
        if b > ledger.deleted.get(p, 0):
            r.problems.append(f"txid {txid} skipped partition {p} offsets {a}..{b - 1}, but records were deleted "
                              f"only below offset {ledger.deleted.get(p, 0)} there")

    def skipped(rid: str) -> bool:
        p, o = position(rid)
        return any(p == lp and a <= o < b for _, lp, a, b in lost)

    every = set(ledger.valid) | ledger.malformed
    gone = {rid for rid in every if skipped(rid)}
    r.skipped_records = len(gone)
    kept = every - gone
    if r.post_mortem:  # only what lies below the committed checkpoint is due
        due = {rid for rid in kept if position(rid)[1] < committed.get(position(rid)[0], 0)}
        r.events_pending = len(kept - due)
        kept = due
    return ledger.restricted_to(kept)


def check_published(broker: KafkaBroker, report: ChaosReport, expected: Ledger) -> None:
    """What a read_committed consumer reads of :data:`PUBLISHED`: each expected record once (its
    id is the record's key), and within each txid the sequence numbers 0..n-1."""
    keys: Counter[str] = Counter()
    seqs: dict[int, list[int]] = {}
    for msg in read_topic(broker, PUBLISHED):
        headers = dict(msg.headers() or [])
        key = msg.key()  # the output event's id: the topology, then the source record's id
        keys[(key.decode() if isinstance(key, bytes) else str(key)).removeprefix(f"{TOPOLOGY}:")] += 1
        seqs.setdefault(int(headers["airflow-txn-txid"] or 0), []).append(int(headers["airflow-txn-seq"] or -1))
    want = set(expected.valid)
    report.published_records = sum(keys.values())
    report.publish_lost = len(want - set(keys))
    report.publish_duplicated = sum(n - 1 for n in keys.values()) + len(set(keys) - want)
    for txid, numbers in sorted(seqs.items()):
        if sorted(numbers) != list(range(len(numbers))):
            report.problems.append(f"{PUBLISHED}: txid {txid} published sequence numbers {sorted(numbers)[:10]}...")
