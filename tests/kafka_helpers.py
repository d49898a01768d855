"""What the Kafka tests do to a real broker: make topics, produce -- plainly or in producer
transactions that commit, abort or stay open -- delete records, add partitions, read a topic back."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from typing import Any

from confluent_kafka import KafkaException, Producer, TopicCollection

from dev.kafka import QUIET, KafkaBroker, add_partitions, admin, delete_records, read_topic

__all__ = ["TransactionalProducer", "add_partitions", "admin", "create_topic", "delete_records", "delete_topic",
           "produce", "read_topic", "topic_id"]


def create_topic(broker: KafkaBroker, partitions: int = 3, name: str | None = None, **config: str) -> str:
    """A new topic (a fresh name unless given), ready for producers."""
    topic = name or f"t-{uuid.uuid4().hex[:10]}"
    broker.create_topic(topic, partitions, **config)
    return topic


def delete_topic(broker: KafkaBroker, topic: str) -> None:
    client = admin(broker)
    client.delete_topics([topic], operation_timeout=30)[topic].result(timeout=60)


def topic_id(broker: KafkaBroker, topic: str) -> str:
    client = admin(broker)
    described = client.describe_topics(TopicCollection([topic]), request_timeout=30)
    return str(described[topic].result(timeout=60).topic_id)


def produce(broker: KafkaBroker, topic: str, records: Iterable[tuple[str | None, Any]], *,
            partition: int | None = None, headers: list[tuple[str, str]] | None = None) -> int:
    """Produce (key, value) records, a value given as an object sent as JSON, each with ``headers``;
    flushed. Returns how many."""
    producer = Producer({**broker.client_config(), "enable.idempotence": True}, logger=QUIET)
    n = 0
    for key, value in records:
        raw = value if isinstance(value, (bytes, type(None))) else (value if isinstance(value, str)
                                                                    else json.dumps(value))
        kwargs: dict[str, Any] = {} if partition is None else {"partition": partition}
        if headers:
            kwargs["headers"] = headers
        producer.produce(topic, key=key, value=raw, **kwargs)
        n += 1
    if producer.flush(60):
        raise KafkaException("records were not delivered within 60 s")
    return n


class TransactionalProducer:
    """A producer using Kafka transactions: ``send`` records, then ``commit`` or ``abort`` them --
    or leave the transaction open (the last stable offset then stays below it)."""

    def __init__(self, broker: KafkaBroker, transactional_id: str | None = None) -> None:
        self.producer = Producer({**broker.client_config(), "transactional.id": transactional_id or uuid.uuid4().hex,
                                  "transaction.timeout.ms": 60_000}, logger=QUIET)
        self.producer.init_transactions(60)
        self.open = False

    def send(self, topic: str, records: Iterable[tuple[str | None, Any]], *, partition: int | None = None) -> None:
        if not self.open:
            self.producer.begin_transaction()
            self.open = True
        for key, value in records:
            kwargs: dict[str, Any] = {} if partition is None else {"partition": partition}
            self.producer.produce(topic, key=key, value=value if isinstance(value, (bytes, str)) else json.dumps(value),
                                  **kwargs)
        self.producer.flush(60)

    def commit(self) -> None:
        self.producer.commit_transaction(60)
        self.open = False

    def abort(self) -> None:
        self.producer.abort_transaction(60)
        self.open = False
