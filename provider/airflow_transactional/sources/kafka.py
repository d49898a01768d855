"""A Kafka topic as a source: Storm's transactional and opaque Kafka spouts, with the plan kept in
Postgres.

A plan fixes, per partition, the offsets ``[start, end)``: ``start`` is where the txid before it
ended (a partition first seen starts at its log start), ``end`` at most the last stable offset --
the first offset of a still-open producer transaction, below which every record is decided, so a
``read_committed`` reader sees the same records every time -- and within ``max_batch_size``
offsets. Offsets are not records: transaction markers and aborted records use offsets too, so a
batch is counted by the records read, never by offset arithmetic (``planned_records`` is the
offset span, an upper bound). The plan also keeps the cluster id and the topic id: a topic deleted
and created again under its name holds other records at the same offsets, and is refused.

Retention (or ``deleteRecords``) that removed planned offsets before they committed fails a
transactional topology, naming the partitions and the way out; an opaque one skips what is gone
(re-planned, counted, reported, left out of audits).

The broker's address and credentials come from a ``kafka`` connection (the Apache Kafka
provider's: librdkafka settings in its ``extra``), resolved where the plan runs: in Airflow from
its connections (the :class:`~airflow_transactional.connections.Connections` a coordinator is handed),
elsewhere from ``AIRFLOW_CONN_<ID>`` as Airflow spells it.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar, NamedTuple

import psycopg2.extensions

from ..connections import Connections
from ..exceptions import BatchUnavailable, ConfigError, SourceUnreachable, TransactionalError
from ..model import RETRACTS_HEADER, Offsets, PlannedBatch, Range, TopicBatch, planned_batch
from ..store import publications, transactions
from .base import BatchPlan, Record, Source, Versions, fair_shares
from .kafka_settings import checked_settings

__all__ = ["KafkaSource", "client_config"]

log = logging.getLogger(__name__)

#: How long one request to the cluster may take before the plan fails (and is retried by Airflow).
TIMEOUT = 30.0

def client_config(conn_id: str, connections: Connections | None = None) -> dict[str, Any]:
    """The librdkafka settings of connection ``conn_id`` as ``connections`` resolve it (default: the
    environment), checked: a broker to reach, no group, and only settings on the allow-list
    (:mod:`.kafka_settings`)."""
    extra = (connections or Connections()).settings(conn_id)
    if not isinstance(extra.get("bootstrap.servers"), str) or not extra["bootstrap.servers"].strip():
        raise ConfigError(f"Kafka connection {conn_id!r} names no broker: set bootstrap.servers in its extra "
                          "(e.g. {\"bootstrap.servers\": \"broker1:9092,broker2:9092\"})")
    return checked_settings(conn_id, extra)


class Snapshot(NamedTuple):
    """What the cluster says of the topic now."""

    cluster_id: str
    topic_id: str
    earliest: dict[int, int]  # the log start offset of each partition
    stable: dict[int, int]  # the last stable offset of each partition (read_committed end)


_admins: dict[str, Any] = {}
_admins_lock = threading.Lock()


def _admin(config: Mapping[str, Any]) -> Any:
    """One admin client per connection settings, kept for the process (a plan makes three requests)."""
    try:
        from confluent_kafka.admin import AdminClient
    except ImportError:
        raise ConfigError("a Kafka source needs confluent-kafka: pip install 'airflow-provider-transactional[kafka]'") \
            from None
    key = json.dumps(config, sort_keys=True, default=str)
    with _admins_lock:
        if key not in _admins:
            _admins[key] = AdminClient(dict(config), logger=logging.getLogger(f"{__name__}.librdkafka"))
        return _admins[key]


class KafkaSource(Source):
    """Batches of a Kafka topic: per partition, the offsets ``[start, end)`` (see the module docstring)."""

    kind: ClassVar[str] = "kafka"
    may_retract: ClassVar[bool] = True
    spark_reader: ClassVar[str] = "airflow_transactional.spark.kafka.read_kafka"
    reads_fewer_than_planned: ClassVar[bool] = True

    def __init__(self, topic: str, *, kafka_conn_id: str = "kafka_default",
                 connections: Connections | None = None) -> None:
        if not isinstance(topic, str) or not topic or len(topic) > 249 or \
                not all(c.isascii() and (c.isalnum() or c in "._-") for c in topic):
            raise ConfigError(f"Kafka topic {topic!r}: a topic name is 1 to 249 ASCII letters, digits, '.', '_' or '-'")
        self.topic = topic
        self.kafka_conn_id = _conn_id(kafka_conn_id)
        #: Where the connection's settings come from (not part of the declaration).
        self.connections = connections or Connections()

    def with_connections(self, connections: Connections) -> KafkaSource:
        return KafkaSource(self.topic, kafka_conn_id=self.kafka_conn_id, connections=connections)

    def to_config(self) -> dict[str, Any]:
        return {"kind": self.kind, "topic": self.topic, "kafka_conn_id": self.kafka_conn_id}

    def connection_settings(self) -> dict[str, dict[str, Any]]:
        return {self.kafka_conn_id: self.connections.settings(self.kafka_conn_id)}

    def spark_connectors(self) -> tuple[str, ...]:
        return ("kafka",)

    def dataset(self, database: str, store_schema: str) -> tuple[str, str]:
        """``kafka://<first bootstrap server>`` of the connection (``unknown`` when it cannot say)."""
        try:
            servers = str(self.config()["bootstrap.servers"]).split(",")[0].strip()
        except TransactionalError:
            servers = "unknown"
        return "kafka://" + servers.removeprefix("PLAINTEXT://").removeprefix("SSL://"), self.topic

    # -- what the cluster says ------------------------------------------------------------------

    def config(self) -> dict[str, Any]:
        return client_config(self.kafka_conn_id, self.connections)

    def snapshot(self) -> Snapshot:
        """The cluster id, the topic id, and each partition's log start and last stable offsets."""
        from confluent_kafka import IsolationLevel, KafkaException, TopicCollection, TopicPartition
        from confluent_kafka.admin import OffsetSpec

        config = self.config()
        admin = _admin(config)
        where = f"Kafka at {config['bootstrap.servers']} (connection {self.kafka_conn_id!r})"
        try:
            described = admin.describe_topics(TopicCollection([self.topic]), request_timeout=TIMEOUT)
            topic = described[self.topic].result(timeout=TIMEOUT + 5)
            cluster = admin.describe_cluster(request_timeout=TIMEOUT).result(timeout=TIMEOUT + 5)
            partitions = sorted(p.id for p in topic.partitions)
            offsets = {}
            for name, spec in (("earliest", OffsetSpec.earliest()), ("stable", OffsetSpec.latest())):
                found = admin.list_offsets({TopicPartition(self.topic, p): spec for p in partitions},
                                           isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=TIMEOUT)
                offsets[name] = {tp.partition: int(f.result(timeout=TIMEOUT + 5).offset) for tp, f in found.items()}
        except KafkaException as exc:
            error = exc.args[0] if exc.args else exc
            if getattr(error, "name", lambda: "")() == "UNKNOWN_TOPIC_OR_PART":
                raise ConfigError(f"{where} has no topic {self.topic!r}: create it, or fix the topic's name") from None
            raise SourceUnreachable(f"{where} did not answer: {error}; check the broker is up and the connection's "
                                    "settings (bootstrap.servers, security)") from None
        except TimeoutError:
            raise SourceUnreachable(f"{where} did not answer within {TIMEOUT:.0f} s: check the broker is up and "
                                    "reachable from here, and the connection's bootstrap.servers") from None
        return Snapshot(str(cluster.cluster_id), str(topic.topic_id), offsets["earliest"], offsets["stable"])

    # -- the source interface ---------------------------------------------------------------

    def plan(self, cur: psycopg2.extensions.cursor, schema: str, topology_id: str, start: Offsets,
             max_records: int, *, skip_unavailable: bool, until: Offsets | None = None) -> BatchPlan:
        now = self.snapshot()
        self._same_topic(now, transactions.last_batch(cur, schema, topology_id), topology_id)
        origin = transactions.range_origins(cur, schema, topology_id)
        lo: dict[int, int] = {}
        avail: dict[int, int] = {}
        lost = 0
        lost_detail: list[str] = []
        lost_ranges: list[Any] = []
        for p in sorted(now.stable):
            # A partition no plan took records of yet starts at its log start; one a plan did (a
            # re-plan of the txid that first read it) where that plan began.
            begin = int(start[str(p)]) if str(p) in start else origin.get(str(p), now.earliest[p])
            if now.earliest[p] > begin:
                detail = f"partition {p} offsets {begin}..{now.earliest[p] - 1}"
                if not skip_unavailable:
                    raise BatchUnavailable(
                        f"topic {self.topic!r}: {detail} were removed (retention or deleteRecords) before topology "
                        f"{topology_id!r} committed them; restore them, or declare the topology opaque=True to skip "
                        "what is gone (the loss is recorded), or reset it to start over")
                lost += now.earliest[p] - begin
                lost_detail.append(detail)
                lost_ranges.append([p, begin, now.earliest[p]])
                begin = now.earliest[p]
            head = now.stable[p]
            if until is not None:
                head = min(head, max(begin, int(until.get(str(p), begin))))
            lo[p] = begin
            avail[p] = max(0, head - begin)
        take = fair_shares(avail, max_records)
        ranges = [[p, lo[p], lo[p] + take[p]] for p in sorted(lo) if take[p] > 0]
        return BatchPlan(
            start=dict(start),  # the committed checkpoint it continues (a new partition is in the ranges)
            end={str(p): lo[p] + take[p] for p in lo},
            batch=TopicBatch(topic=self.topic, topic_id=now.topic_id, cluster_id=now.cluster_id,
                             ranges=tuple(Range(*r) for r in ranges)),
            planned_records=sum(take.values()),
            lost_records=lost, lost_detail=lost_detail, lost_ranges=lost_ranges)

    def _same_topic(self, now: Snapshot, before: PlannedBatch | None, topology_id: str) -> None:
        """Refuse a topic that is not the one earlier plans read (another cluster, or the topic
        deleted and created again): its offsets mean other records now."""
        if not isinstance(before, TopicBatch) or before.topic_id is None:
            return
        if before.cluster_id != now.cluster_id:
            raise ConfigError(f"topology {topology_id!r} read topic {self.topic!r} of Kafka cluster "
                              f"{before.cluster_id}, and connection {self.kafka_conn_id!r} now reaches cluster "
                              f"{now.cluster_id}: point the connection back, or reset the topology "
                              f"(airflow-txn reset {topology_id} --yes) to read the new cluster from its start")
        if before.topic_id != now.topic_id:
            raise ConfigError(f"topic {self.topic!r} was deleted and created again since topology {topology_id!r} "
                              f"planned its last batch (topic id {before.topic_id} is now {now.topic_id}): its "
                              f"offsets hold other records. Reset the topology (airflow-txn reset {topology_id} "
                              "--yes) to read the new topic from its start")

    def unavailable(self, cur: psycopg2.extensions.cursor, schema: str, topology_id: str,
                    batch: Mapping[str, Any]) -> str | None:
        batch = planned_batch(batch, self.kind)
        if not isinstance(batch, TopicBatch) or not batch.ranges:
            return None
        now = self.snapshot()
        if batch.topic_id not in (None, now.topic_id):
            return f"topic {self.topic!r} was deleted and created again (topic id {batch.topic_id} is now " \
                   f"{now.topic_id})"
        gone = [f"partition {p} offsets {lo}..{min(hi, now.earliest.get(p, 0)) - 1}"
                for p, lo, hi in batch.ranges if now.earliest.get(p, 0) > lo]
        if gone:
            return f"topic {self.topic!r}: records removed by retention or deleteRecords: {', '.join(gone)}"
        return None

    def versions(self, cur: psycopg2.extensions.cursor, schema: str, batch: Mapping[str, Any]) -> Versions:
        """The retractions a publisher of this store put among the batch's records (recorded with
        their publication: store/publications.py)."""
        batch = planned_batch(batch, self.kind)
        if not isinstance(batch, TopicBatch) or not batch.ranges or not batch.cluster_id or not batch.topic_id:
            return Versions()  # (a batch planned before its ids were recorded: its retractions are set aside)
        return Versions(retractions=publications.retractions_in(cur, schema, (batch.cluster_id, batch.topic_id),
                                                                 batch.ranges))

    def read(self, cur: psycopg2.extensions.cursor, schema: str, topology_id: str,
             batch: Mapping[str, Any]) -> Iterator[Record]:
        """The batch's committed records in partition order (for the pure-Python processor)."""
        from confluent_kafka import Consumer, TopicPartition

        batch = planned_batch(batch, self.kind)
        ranges = batch.ranges if isinstance(batch, TopicBatch) else ()
        if not ranges:
            return
        consumer = Consumer({**self.config(), "group.id": "airflow-transactional-reader", "enable.auto.commit": False,
                             "isolation.level": "read_committed", "enable.partition.eof": True,
                             "logger": logging.getLogger(f"{__name__}.librdkafka")})
        try:
            for p, lo, hi in ranges:
                consumer.assign([TopicPartition(self.topic, p, lo)])
                yield from _partition_records(consumer, self.topic, p, hi)
        finally:
            consumer.close()

    def committed_batch(self, cur: psycopg2.extensions.cursor, schema: str, topology_id: str,
                        committed: Offsets, lost: list[Any]) -> tuple[PlannedBatch, str | None]:
        now = self.snapshot()
        last = transactions.last_batch(cur, schema, topology_id)
        if isinstance(last, TopicBatch) and last.topic_id not in (None, now.topic_id):
            return PlannedBatch(), f"topic {self.topic!r} was deleted and created again: the committed records are gone"
        origin = transactions.range_origins(cur, schema, topology_id)  # where the topology began, per partition
        ranges, gone = [], []
        for p, end in sorted((int(p_text), int(end)) for p_text, end in committed.items()):
            removed = now.earliest.get(p, 0)  # offsets below are gone from the topic
            covered = origin.get(str(p), 0)
            for _p, a, b in sorted(r for r in lost if r[0] == p):
                if a <= covered:
                    covered = max(covered, b)
            if covered < min(removed, end):  # every partition named, not only the first
                gone.append(f"partition {p} offsets {covered}..{min(removed, end) - 1}")
            elif end > max(removed, covered):
                ranges.append(Range(p, max(removed, covered), end))
        if gone:
            return PlannedBatch(), (f"topic {self.topic!r}: retention removed committed records "
                                    f"({', '.join(gone)}); they can no longer be recomputed")
        return TopicBatch(topic=self.topic, topic_id=now.topic_id, cluster_id=now.cluster_id,
                          ranges=tuple(ranges)), None

    remote = True
    lag_unit = "offsets"

    def lag(self, cur: psycopg2.extensions.cursor, schema: str, topology_id: str, committed: Offsets) -> int:
        """Offsets (records, and the markers of producer transactions) past the committed ones."""
        return self._lag(self.snapshot(), committed)

    @staticmethod
    def _lag(now: Snapshot, committed: Offsets) -> int:
        return sum(max(0, now.stable[p] - max(int(committed.get(str(p), now.earliest[p])), now.earliest[p]))
                   for p in now.stable)

    def lag_seconds(self, cur: psycopg2.extensions.cursor, schema: str, topology_id: str,
                    committed: Offsets) -> float | None:
        """The age of the oldest record past the committed offsets, by its timestamp."""
        return self._lag_seconds(self.snapshot(), committed)

    def remote_lag(self, committed: Offsets) -> tuple[int, float | None]:
        now = self.snapshot()
        lag = self._lag(now, committed)
        return lag, self._lag_seconds(now, committed) if lag else 0.0

    def _lag_seconds(self, now: Snapshot, committed: Offsets) -> float | None:
        import time

        from confluent_kafka import Consumer, TopicPartition

        waiting = {p: max(int(committed.get(str(p), now.earliest[p])), now.earliest[p]) for p in now.stable}
        waiting = {p: o for p, o in waiting.items() if o < now.stable[p]}
        if not waiting:
            return 0.0
        consumer = Consumer({**self.config(), "group.id": "airflow-transactional-lag", "enable.auto.commit": False,
                             "isolation.level": "read_committed",
                             "logger": logging.getLogger(f"{__name__}.librdkafka")})
        oldest: float | None = None
        try:
            consumer.assign([TopicPartition(self.topic, p, o) for p, o in waiting.items()])
            seen: set[int] = set()
            deadline = time.monotonic() + 10
            while len(seen) < len(waiting) and time.monotonic() < deadline:
                msg = consumer.poll(1.0)
                partition = None if msg is None or msg.error() else msg.partition()
                if msg is None or partition is None or partition in seen:
                    continue
                seen.add(partition)
                kind, stamp = msg.timestamp()
                if kind and stamp > 0:
                    age = max(0.0, time.time() - stamp / 1000)
                    oldest = age if oldest is None else max(oldest, age)
        finally:
            consumer.close()
        return oldest


def _partition_records(consumer: Any, topic: str, partition: int, end: int) -> Iterator[Record]:
    """The records of one assigned partition below ``end`` (a read_committed consumer skips
    aborted records and markers; the partition's end of file ends it early)."""
    while True:
        msg = consumer.poll(TIMEOUT)
        if msg is None:
            raise SourceUnreachable(f"topic {topic!r} partition {partition}: no record and no end of partition "
                                    f"within {TIMEOUT:.0f} s while reading up to offset {end}")
        error = msg.error()
        if error is not None:
            if error.name() == "_PARTITION_EOF":
                return
            raise SourceUnreachable(f"topic {topic!r} partition {partition}: {error}")
        if msg.offset() >= end:
            return
        retracts = dict(msg.headers() or []).get(RETRACTS_HEADER)
        yield Record(f"{partition}:{msg.offset()}", record_id(topic, partition, msg.offset()), _text(msg.value()),
                     None if retracts is None else retracts.decode("utf-8", "replace"))
        if msg.offset() + 1 >= end:
            return


def record_id(topic: str, partition: int, offset: int) -> str:
    """A Kafka record's identity, for dedupe and the quarantine: (topic, partition, offset)."""
    return f"{topic}:{partition}:{offset}"


#: Why a Kafka reader quarantines a correction's retraction its state store has no record of (the
#: publisher is another store's): it cannot tell it took that event in.
RETRACTION_REFUSED = ("a correction's retraction of event {}, published by a topology of another state store: this "
                      "topology cannot take it back (read that topology's output log, or register this topology in "
                      "its state store; docs/guides/corrections.md)")


def _text(value: bytes | None) -> str:
    """A record's value as text; bytes that are not UTF-8 make a payload that is no JSON, so the
    record is quarantined (its bytes shown escaped) rather than read with a replaced character."""
    if value is None:
        return ""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"(not UTF-8 text: {exc.reason} at byte {exc.start}) {value[:200]!r}"


def _conn_id(value: Any) -> str:
    """An Airflow connection id: letters, digits, '_', '-' and '.'."""
    if not isinstance(value, str) or not value or len(value) > 250 or \
            not all(c.isascii() and (c.isalnum() or c in "_-.") for c in value):
        raise ConfigError(f"Kafka connection id {value!r}: use letters, digits, '_', '-' or '.'")
    return value
