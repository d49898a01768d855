"""Publishing a txid's committed output events to a Kafka topic in one Kafka transaction.

One publisher per topology and output, with a fixed ``transactional.id``: starting one fences any
other (a zombie's open transaction is aborted), so at most one publishes at a time. Each record
carries headers naming its topology, output, registration (the topology's number in the state
store, new after a reset), txid and place in the txid, which is how a publisher that restarts
finds, in the topic itself, the txid it published but could not record in Postgres before it
died (:meth:`KafkaPublisher.scan`). Anyone who may write to the topic can write such headers too,
so they are evidence, not proof: :mod:`..core.publish` believes them for that one txid only, and
only when the records are exactly its events.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from ..exceptions import ConfigError, SourceUnreachable
from ..model import RETRACTS_HEADER

__all__ = ["HEADERS", "RETRACTS", "KafkaPublisher", "Published", "PublishedEvent", "Scan"]

log = logging.getLogger(__name__)

#: The headers every published record carries.
HEADERS = ("airflow-txn-topology", "airflow-txn-output", "airflow-txn-txid", "airflow-txn-seq",
           "airflow-txn-registration")
#: The header of a correction's retraction: the id (the record key) of the event it takes back.
#: Its value is that event's payload; a consumer applies it negated (docs/guides/corrections.md).
RETRACTS = RETRACTS_HEADER
TIMEOUT = 60.0
#: How long the publisher waits for the broker to answer at all before it says it is not there.
REACH_TIMEOUT = 10.0


class PublishedEvent(NamedTuple):
    partition: int  # of the output log: the record goes to this partition modulo the topic's
    event_id: str
    payload: str
    retracts: str | None = None  # a correction's retraction: the id of the event it takes back


#: Where a retraction went: (partition, offset, the id of the event it takes back).
Placed = tuple[int, int, str]


class Scan(NamedTuple):
    """What the topic holds past the offsets a publisher last recorded, claiming to be its output."""

    claims: dict[int, list[tuple[str, str]]]  # txid -> its records' (key, value), of this registration
    strangers: list[str]  # the other claims: another registration's, or headers that do not parse
    retractions: dict[int, list[Placed]]  # txid -> where its claimed retractions are


class Published(NamedTuple):
    """A txid published: the topic's end offsets after it (by partition written), and where its
    retractions went (a reader of the topic in the same store takes them back by these)."""

    offsets: dict[str, int]
    retractions: list[Placed]


class KafkaPublisher:
    """A transactional producer for one topology's output (see the module docstring)."""

    def __init__(self, config: Mapping[str, Any], *, topic: str, topology_id: str, output: str,
                 transactional_id: str, registration: int) -> None:
        from confluent_kafka import Producer

        self.config, self.topic, self.topology_id, self.output = dict(config), topic, topology_id, output
        self.registration = int(registration)
        self.producer = Producer({**self.config, "transactional.id": transactional_id, "enable.idempotence": True,
                                  "transaction.timeout.ms": 300_000},
                                 logger=logging.getLogger(f"{__name__}.librdkafka"))
        try:  # a broker that is not there says so in seconds, not after the transactions' minute
            self.producer.list_topics(topic, timeout=REACH_TIMEOUT)
        except Exception as exc:
            raise SourceUnreachable(f"Kafka at {self.config.get('bootstrap.servers')} is not reachable to publish "
                                    f"output {output!r} ({exc}): check the broker and the connection") from None
        try:
            self.producer.init_transactions(TIMEOUT)  # fences an older publisher, aborts what it left open
        except Exception as exc:
            raise SourceUnreachable(f"Kafka at {self.config.get('bootstrap.servers')} did not start the publisher of "
                                    f"output {output!r} ({exc}): check the broker and the connection") from None
        metadata = self.producer.list_topics(topic, timeout=TIMEOUT).topics.get(topic)
        if metadata is None or metadata.error is not None or not metadata.partitions:
            raise ConfigError(f"Kafka has no topic {topic!r} to publish output {output!r} to: create it (its "
                              "partitions are the consumers' parallelism), or fix the output's kafka_topic")
        self.partitions = len(metadata.partitions)
        self._identity: tuple[str, str] | None = None

    def identity(self) -> tuple[str, str]:
        """The topic's (cluster id, topic id): where a retraction is recorded to have gone, which a
        reader's batch names too (another cluster's or a recreated topic of that name is not it)."""
        if self._identity is None:
            from confluent_kafka import TopicCollection
            from confluent_kafka.admin import AdminClient

            admin = AdminClient(dict(self.config), logger=logging.getLogger(f"{__name__}.librdkafka"))
            try:
                topic = admin.describe_topics(TopicCollection([self.topic]), request_timeout=TIMEOUT)[self.topic]
                cluster = admin.describe_cluster(request_timeout=TIMEOUT)
                self._identity = (str(cluster.result(timeout=TIMEOUT + 5).cluster_id),
                                  str(topic.result(timeout=TIMEOUT + 5).topic_id))
            except Exception as exc:
                raise SourceUnreachable(f"Kafka at {self.config.get('bootstrap.servers')} did not describe topic "
                                        f"{self.topic!r} ({exc}): check the broker and the connection") from None
        return self._identity

    def scan(self, since: Mapping[str, int]) -> Scan:
        """The records past the offsets ``since`` (by partition; from each partition's start when
        missing) whose headers name this topology and output, read at read_committed: those of this
        registration that name one txid, and the rest as :attr:`Scan.strangers` -- never trusted,
        never a reason to fail (a record whose txid header is not a number is one of them)."""
        from confluent_kafka import Consumer

        consumer = Consumer({**self.config, "group.id": "airflow-transactional-publisher", "enable.auto.commit": False,
                             "isolation.level": "read_committed", "enable.partition.eof": True},
                            logger=logging.getLogger(f"{__name__}.librdkafka"))
        claims: dict[int, list[tuple[str, str]]] = {}
        strangers: list[str] = []
        retractions: dict[int, list[Placed]] = {}
        mine = (self.topology_id.encode(), self.output.encode())
        try:
            for msg in self._tail(consumer, since):
                headers = dict(msg.headers() or [])
                if (headers.get(HEADERS[0]), headers.get(HEADERS[1])) != mine:
                    continue
                where = f"partition {msg.partition()} offset {msg.offset()}"
                txid = _number(headers.get(HEADERS[2]))
                if txid is None or _number(headers.get(HEADERS[4])) != self.registration:
                    strangers.append(f"{where}: txid {_shown(headers.get(HEADERS[2]))}, registration "
                                     f"{_shown(headers.get(HEADERS[4]))}")
                    continue
                claims.setdefault(txid, []).append((_text(msg.key()), _text(msg.value())))
                if headers.get(RETRACTS) is not None:
                    retractions.setdefault(txid, []).append((int(msg.partition() or 0), int(msg.offset() or 0),
                                                             _text(headers[RETRACTS])))
        finally:
            consumer.close()
        return Scan(claims, strangers, retractions)

    def _tail(self, consumer: Any, since: Mapping[str, int]) -> Any:
        from confluent_kafka import TopicPartition

        ends = {}
        for p in range(self.partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=TIMEOUT)
            start = max(int(since.get(str(p), low)), low)
            if start < high:
                ends[p] = (start, high)
        consumer.assign([TopicPartition(self.topic, p, start) for p, (start, _high) in ends.items()])
        open_partitions = set(ends)
        while open_partitions:
            msg = consumer.poll(TIMEOUT)
            if msg is None:
                raise SourceUnreachable(f"Kafka topic {self.topic!r}: no record within {TIMEOUT:.0f} s while "
                                        "looking for what this publisher published")
            error, partition, offset = msg.error(), int(msg.partition() or 0), int(msg.offset() or 0)
            if error is not None:
                if error.name() == "_PARTITION_EOF":
                    open_partitions.discard(partition)
                    continue
                raise SourceUnreachable(f"Kafka topic {self.topic!r}: {error}")
            yield msg
            if offset + 1 >= ends[partition][1]:
                open_partitions.discard(partition)

    def publish(self, txid: int, events: Iterable[PublishedEvent], *, before_commit: Any = None) -> Published:
        """Publish ``events`` of ``txid`` in one Kafka transaction. ``before_commit`` is called
        between producing and committing."""
        written: dict[str, int] = {}
        failures: list[str] = []
        placed: list[Placed] = []
        retracting: dict[str, str] = {}  # a retraction's event id -> the id it takes back

        def delivered(err: Any, msg: Any) -> None:
            if err is not None:
                failures.append(str(err))
            else:
                key = str(msg.partition())
                written[key] = max(written.get(key, 0), msg.offset() + 1)
                origin = retracting.get(_text(msg.key())) if retracting else None
                if origin is not None:
                    placed.append((int(msg.partition()), int(msg.offset()), origin))

        self.producer.begin_transaction()
        try:
            for seq, event in enumerate(events):
                headers: list[tuple[str, str | bytes | None]] = [
                    (HEADERS[0], self.topology_id), (HEADERS[1], self.output), (HEADERS[2], str(txid)),
                    (HEADERS[3], str(seq)), (HEADERS[4], str(self.registration))]
                if event.retracts is not None:
                    headers.append((RETRACTS, event.retracts))
                    retracting[event.event_id] = event.retracts
                self.producer.produce(self.topic, key=event.event_id, value=event.payload, headers=headers,
                                      partition=event.partition % self.partitions, on_delivery=delivered)
                self.producer.poll(0)
            self.producer.flush(TIMEOUT)
            if failures:
                raise SourceUnreachable(f"Kafka refused records of txid {txid}: {failures[0]}")
            if before_commit is not None:
                before_commit()
            self.producer.commit_transaction(TIMEOUT)
        except BaseException:
            try:
                self.producer.abort_transaction(TIMEOUT)
            except Exception as exc:  # fenced, or the broker gone: the transaction dies with the producer
                log.warning("could not abort the Kafka transaction of txid %d: %s", txid, exc)
            raise
        return Published(written, placed)


def _number(raw: Any) -> int | None:
    """A header's positive whole number, or None (absent, not ASCII digits, absurdly long)."""
    if not isinstance(raw, bytes) or not raw.isdigit() or len(raw) > 18:
        return None
    return int(raw) or None


def _shown(raw: Any) -> str:
    return "none" if raw is None else repr(raw[:40])


def _text(raw: Any) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else "" if raw is None else str(raw)
