"""The source (spout) interface: plan a batch at exact offsets, check it is still readable, read it.

A source must be *transactional*: reading a stored plan again yields the identical batch. When
retention makes that impossible the topology may be declared opaque: the batch is re-planned
from the committed checkpoint, skipping what is gone, and the loss is recorded and reported.
A Kafka topic fits the same interface (offsets per partition, like the Postgres log).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import psycopg2.extensions

from ..connections import Connections
from ..model import Offsets, PlannedBatch

__all__ = ["BatchPlan", "Offsets", "Record", "Source", "Versions", "connections_for", "fair_shares"]


@dataclass(frozen=True)
class BatchPlan:
    """The exact extent of one batch: where it starts and ends, and how to read it."""

    start: Offsets
    end: Offsets
    batch: PlannedBatch
    planned_records: int
    lost_records: int = 0  # skipped because retention removed them (opaque re-plan only)
    lost_detail: list[str] = field(default_factory=list)
    lost_ranges: list[Any] = field(default_factory=list)  # machine-readable: what audits skip


@dataclass(frozen=True)
class Record:
    """One source record: where it sits (``offset``), its id for dedupe, its raw text; ``retracts``:
    the event it retracts, when its Kafka headers say it is a correction's retraction."""

    offset: str
    event_id: str | None
    payload: str
    retracts: str | None = None


@dataclass(frozen=True)
class Versions:
    """What corrections upstream appended among a batch's records (an event log's compensating
    events, core/corrections.py), by offset: the origin -- the id of the event taken back or
    versioned -- of each retraction and of each new version. A reader applies a retraction negated
    and reads both under their origin's id, so the events it emits follow: a retraction's are
    retracted, a version's versioned (store/outputs.py). ``cancelled``: records that cancel out
    within the batch -- a version (or the original event) and the retraction of it that follows
    -- read and counted, never applied."""

    retractions: Mapping[str, str] = field(default_factory=dict)
    versions: Mapping[str, str] = field(default_factory=dict)
    cancelled: frozenset[str] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.retractions or self.versions or self.cancelled)

    def origin(self, offset: str) -> str | None:
        return self.retractions.get(offset) or self.versions.get(offset)

    @classmethod
    def of(cls, rows: Iterable[tuple[str, str, bool, int]]) -> Versions:
        """From ``(offset, origin, retraction, txid)`` rows: each retraction and version among the
        records, ``txid`` the correction's that appended it, and the original event of each origin
        a retraction among them takes back, when it is among them too (txid 0). An origin's events
        alternate -- each retraction takes back the version (or original) live before it -- and
        a correction appends its retraction before its version."""
        chains: dict[str, list[tuple[int, bool, str]]] = {}
        for offset, origin, retraction, txid in rows:
            chains.setdefault(origin, []).append((txid, not retraction, offset))
        retractions: dict[str, str] = {}
        versions: dict[str, str] = {}
        cancelled: set[str] = set()
        for origin, chain in chains.items():
            live: str | None = None  # the version (or original) of the batch nothing retracted yet
            for txid, version, offset in sorted(chain):
                if version:
                    live = offset
                    if txid:
                        versions[offset] = origin
                elif live is not None:
                    cancelled |= {live, offset}
                    versions.pop(live, None)
                    live = None
                else:
                    retractions[offset] = origin
        return cls(retractions, versions, frozenset(cancelled))


class Source(ABC):
    """A source of batches. Methods get a cursor inside the caller's transaction.

    A source kind is one class: defining it (with a ``kind`` of its own) registers it, and what the
    rest of the provider asks of a kind it asks here -- by a flag or a method, never by its name:
    how a stored declaration is rebuilt (:meth:`from_config`), its Spark reader
    (:attr:`spark_reader`), the jars a job needs for it (:meth:`spark_connectors`), its lineage
    dataset (:meth:`dataset`), whether its records are text to replay (:meth:`records_are_text`),
    whether a batch may read fewer records than it planned."""

    kind: ClassVar[str]
    #: Every source kind, by ``kind``: filled as each class with a kind of its own is defined.
    kinds: ClassVar[dict[str, type[Source]]] = {}
    #: The Spark reader of its batches, as ``package.module.function``
    #: (``fn(spark, source, batch, *, dsn, schema, topology_id, record_schema, retractions) -> Records``),
    #: imported when a job first reads one.
    spark_reader: ClassVar[str] = ""
    #: Whether a batch may read fewer records than it planned -- a Kafka plan counts offsets, and
    #: its transactions' markers and records deleted under the plan take offsets too: a commit
    #: records the difference as skipped.
    reads_fewer_than_planned: ClassVar[bool] = False
    #: Whether a batch may hold a correction's retractions and versions (:meth:`versions`): an
    #: event log's and a Kafka topic's may.
    may_retract: ClassVar[bool] = False
    #: Whether the lag is asked of a server other than the state store (a Kafka cluster): a status
    #: then asks :meth:`remote_lag` outside its transaction, waits a few seconds at most and keeps
    #: the answer a while (:mod:`..core.lag`), instead of :meth:`lag` and :meth:`lag_seconds`.
    remote: ClassVar[bool] = False
    #: What :meth:`lag` counts, as the views say it: records, or a landing directory's files, or a
    #: Kafka topic's offsets (its transactions' markers take offsets too).
    lag_unit: ClassVar[str] = "records"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "kind" in cls.__dict__:
            Source.kinds[cls.kind] = cls

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Source:
        """The source a stored description (less its ``kind``) declares."""
        return cls(**config)

    @abstractmethod
    def to_config(self) -> dict[str, Any]:
        """JSON-able description, stored with the topology (never credentials)."""

    def records_are_text(self) -> bool:
        """Whether its records are text a person can edit and replay (a Parquet or CSV file's are not)."""
        return True

    def spark_connectors(self) -> tuple[str, ...]:
        """The connectors beyond Spark's own a job reading it needs (``kafka``, ``s3a``): names
        ``spark/jars.py`` fetches the jars of."""
        return ()

    def dataset(self, database: str, store_schema: str) -> tuple[str, str] | None:
        """Its OpenLineage dataset, (namespace, name) -- the namespace ``postgres`` meaning the state
        store's -- or None when it has none."""
        return None

    def with_connections(self, connections: Connections) -> Source:
        """This source resolving its connections' settings with ``connections`` (a source in
        Postgres or on a disk has none: itself)."""
        return self

    def connection_settings(self) -> dict[str, dict[str, Any]]:
        """The settings of the connections this source reads with, by connection id, for a job that
        runs elsewhere (none for a source in Postgres or on a local disk)."""
        return {}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Source) and self.to_config() == other.to_config()

    def __hash__(self) -> int:
        return hash(repr(sorted(self.to_config().items())))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.to_config()!r})"

    def register(self, cur: psycopg2.extensions.cursor, schema: str, topology_id: str) -> None:  # noqa: B027
        """Create or check what the source needs in the store (default: nothing)."""

    @abstractmethod
    def plan(self, cur: psycopg2.extensions.cursor, schema: str, topology_id: str, start: Offsets,
             max_records: int, *, skip_unavailable: bool, until: Offsets | None = None) -> BatchPlan:
        """Fix the next batch beginning exactly at ``start`` (and ending at ``until`` at most).

        With ``skip_unavailable`` (opaque topologies) records removed by retention are skipped
        and counted in ``lost_records``; without it their absence raises BatchUnavailable.
        ``until`` bounds a re-plan by the old end, so later transactions keep their plans.
        """

    @abstractmethod
    def unavailable(self, cur: psycopg2.extensions.cursor, schema: str, topology_id: str,
                    batch: PlannedBatch) -> str | None:
        """Why the planned ``batch`` can no longer be read in full, or None when it can."""

    def way_back(self) -> str:
        """What brings back a batch that :meth:`unavailable` says can no longer be read, if anything
        can (the failure names it beside ``opaque=True``)."""
        return "restore the data"

    @abstractmethod
    def read(self, cur: psycopg2.extensions.cursor, schema: str, topology_id: str,
             batch: PlannedBatch) -> Iterator[Record]:
        """Yield the batch's records in source order."""

    def versions(self, cur: psycopg2.extensions.cursor, schema: str, batch: PlannedBatch) -> Versions:
        """The retractions and versions among the batch's records (a correction's compensating
        events in an output log, or published from one to a Kafka topic)."""
        return Versions()

    @abstractmethod
    def lag(self, cur: psycopg2.extensions.cursor, schema: str, topology_id: str,
            committed: Offsets) -> int:
        """How many records (files for a directory) the source holds beyond ``committed``."""

    def waiting(self, cur: psycopg2.extensions.cursor, schema: str, topology_id: str,
                committed: Offsets) -> tuple[int, int | None]:
        """(:meth:`lag`, the bytes it holds, or None when the source does not say)."""
        return self.lag(cur, schema, topology_id, committed), None

    def lag_seconds(self, cur: psycopg2.extensions.cursor, schema: str, topology_id: str,
                    committed: Offsets) -> float | None:
        """How long the oldest record beyond ``committed`` has waited (0.0 when none waits), or
        None when the source does not know when its records arrived."""
        return None

    def remote_lag(self, committed: Offsets) -> tuple[int, float | None]:
        """(:meth:`lag`, :meth:`lag_seconds`) of a :attr:`remote` source, from its server alone."""
        raise NotImplementedError(f"a {self.kind} source keeps its lag in the state store")

    @abstractmethod
    def committed_batch(self, cur: psycopg2.extensions.cursor, schema: str, topology_id: str,
                        committed: Offsets, lost: list[Any]) -> tuple[PlannedBatch, str | None]:
        """A batch of everything committed so far (for audits and rebuilds), or an empty batch and
        why it cannot be recomputed. ``lost`` are the ``lost_ranges`` of committed batches: records
        retention removed before they committed, which the state never counted."""


def connections_for(source: Source) -> dict[str, dict[str, Any]]:
    """The settings of the connections ``source`` reads with, for a job that runs elsewhere."""
    return source.connection_settings()


def fair_shares(avail: Mapping[int, int], cap: int) -> dict[int, int]:
    """Split ``cap`` over partitions holding ``avail``: equal shares, leftovers to those with more."""
    take = dict.fromkeys(avail, 0)
    remaining = cap
    open_parts = [p for p in sorted(avail) if avail[p] > 0]
    while remaining > 0 and open_parts:
        share = max(1, remaining // len(open_parts))
        for p in list(open_parts):
            n = min(share, avail[p] - take[p], remaining)
            take[p] += n
            remaining -= n
            if take[p] >= avail[p]:
                open_parts.remove(p)
            if remaining == 0:
                break
    return take
