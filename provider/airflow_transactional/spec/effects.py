"""What a commit does beyond folding states: the output logs it appends to, and the decisions it
applies to requests one by one. Plain data, validated when built."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .. import identifiers
from ..exceptions import ConfigError
from ..sources import KafkaSource
from .states import DEFAULT_STATE_SCHEMA

#: The most partitions an output log may be declared with.
MAX_OUTPUT_PARTITIONS = 1024


@dataclass(frozen=True)
class OutputSpec:
    """An event log the commit appends to: the topology's output, a next topology's source.

    The transform emits events for it by ``name``; they are staged per (txid, attempt) like
    state deltas and appended by the commit, in its one Postgres transaction, in txid order.
    ``log`` is the :class:`~airflow_transactional.EventLog` (default: ``name``), kept in the state
    store's schema; it is created with ``partitions`` when missing (an existing log keeps its
    own). An event goes to the partition of its key (``partition_of``), or of its id.

    ``kafka_topic``: the committed events are also published to that Kafka topic (through the
    ``kafka_conn_id`` connection), each txid's in one Kafka transaction, in txid order, after its
    commit (docs/guides/kafka.md, "Publishing to Kafka").
    """

    name: str
    log: str | None = None
    partitions: int = 1
    kafka_topic: str | None = None
    kafka_conn_id: str = "kafka_default"

    def __post_init__(self) -> None:
        identifiers.name("output name", self.name)
        object.__setattr__(self, "log", identifiers.name("log name", self.log or self.name))
        if (not isinstance(self.partitions, int) or isinstance(self.partitions, bool)
                or not 1 <= self.partitions <= MAX_OUTPUT_PARTITIONS):
            raise ConfigError(f"output {self.name!r}: partitions must be an integer from 1 to "
                              f"{MAX_OUTPUT_PARTITIONS}, got {self.partitions!r}")
        if self.kafka_topic is not None:  # a topic's and a connection's names, checked as a source's
            KafkaSource(self.kafka_topic, kafka_conn_id=self.kafka_conn_id)

    @property
    def log_name(self) -> str:
        return self.log or self.name

    def to_config(self) -> dict[str, Any]:
        published = {"kafka_topic": self.kafka_topic, "kafka_conn_id": self.kafka_conn_id} if self.kafka_topic else {}
        return {"name": self.name, "log": self.log_name, "partitions": self.partitions, **published}

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> OutputSpec:
        return cls(**config)


@dataclass(frozen=True)
class DecisionSpec:
    """A rule the commit applies to requests one by one -- per key, in source order, on the
    committed state -- where parallel processing cannot: may this account pay?

    ``state`` is a ``sum`` state of the topology that only this rule updates: each key's balance.
    A request's ``amount`` is added to it when the request is granted: always when the amount is
    not negative, else only if the balance stays at or above ``floor``. ``headroom`` may name a
    table or view (``"schema.table"``) with the state's key columns and a ``value`` column that
    is added to the balance -- e.g. an opening balance plus an overdraft limit plus the credits
    another topology committed. Outside this commit it may only ever grow, or a grant could
    break the floor. A request id is decided once: a request sent again is not decided again.
    The verdicts are kept (``Coordinator.verdicts``); events the transform emits for a request
    ``when`` it is granted (or declined) are appended with the commit's other output events.
    """

    name: str
    state: str
    floor: int | float = 0
    headroom: str | None = None

    def __post_init__(self) -> None:
        identifiers.name("decision name", self.name)
        identifiers.name("state name", self.state)
        if (not isinstance(self.floor, (int, float)) or isinstance(self.floor, bool)
                or not math.isfinite(self.floor)):
            raise ConfigError(f"decision {self.name!r}: floor must be a finite number, got {self.floor!r}")
        if self.headroom is not None:
            identifiers.qualified_table(self.headroom, DEFAULT_STATE_SCHEMA)

    @property
    def headroom_table(self) -> tuple[str, str] | None:
        return None if self.headroom is None else identifiers.qualified_table(self.headroom, DEFAULT_STATE_SCHEMA)

    def to_config(self) -> dict[str, Any]:
        return {"name": self.name, "state": self.state, "floor": self.floor, "headroom": self.headroom}

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> DecisionSpec:
        return cls(**config)
