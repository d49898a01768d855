"""A source's position (:data:`Offsets`) and a planned batch, typed by the source that reads it:
an event log's ranges, a Kafka topic's, a landing directory's files, a replay's records."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

#: A position in a source: offset by partition (``{"0": 120, "1": 98}``), or a file sequence.
Offsets = dict[str, int]


class Range(NamedTuple):
    """Where a batch reads in one partition: offsets (a topic's) or LSNs (a log's) from ``start``
    up to ``end``, exclusive."""

    partition: int
    start: int
    end: int


@dataclass(frozen=True, kw_only=True, eq=False)
class PlannedBatch(Mapping[str, Any]):
    """A transaction's batch as planned -- one kind per source: :class:`LogBatch`,
    :class:`TopicBatch`, :class:`FileBatch`; this base alone is no batch (an audit's of nothing).
    Stored as JSON (:meth:`to_json`, read back by :func:`planned_batch`), and a read-only mapping
    of that JSON for whoever reads the stored form. ``lost``: what retention removed from it
    before it was read (an opaque topology's re-plan): records, detail, ranges."""

    lost: Mapping[str, Any] | None = None

    def _fields(self) -> dict[str, Any]:
        return {}

    def to_json(self) -> dict[str, Any]:
        return {**self._fields(), **({"lost": dict(self.lost)} if self.lost else {})}

    def __getitem__(self, key: str) -> Any:
        return self.to_json()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_json())

    def __len__(self) -> int:
        return len(self.to_json())

    def __eq__(self, other: object) -> bool:  # as its JSON: a stored batch read back equals the planned one
        if isinstance(other, PlannedBatch) and type(other) is not type(self):
            return False
        return isinstance(other, Mapping) and self.to_json() == dict(other)

    __hash__ = None  # type: ignore[assignment]  # a mapping: not hashable

    @property
    def lost_records(self) -> int:
        return int((self.lost or {}).get("records", 0))


@dataclass(frozen=True, kw_only=True, eq=False)
class LogBatch(PlannedBatch):
    """A Postgres event log's batch: LSN ranges of ``log``."""

    log: str
    ranges: tuple[Range, ...] = ()

    def _fields(self) -> dict[str, Any]:
        return {"log": self.log, "ranges": [list(r) for r in self.ranges]}


@dataclass(frozen=True, kw_only=True, eq=False)
class TopicBatch(PlannedBatch):
    """A Kafka topic's batch: offset ranges of ``topic``, on the cluster and topic ids planned."""

    topic: str
    topic_id: str | None = None
    cluster_id: str | None = None
    ranges: tuple[Range, ...] = ()

    def _fields(self) -> dict[str, Any]:
        return {"topic": self.topic, "topic_id": self.topic_id, "cluster_id": self.cluster_id,
                "ranges": [list(r) for r in self.ranges]}


@dataclass(frozen=True, kw_only=True, eq=False)
class FileBatch(PlannedBatch):
    """A landing directory's batch: its files, each pinned as planned (path, identity, size,
    digest, and whether Spark's reader may read it as it is: ``plain``)."""

    directory: str | None = None
    format: str = "json"
    files: tuple[Mapping[str, Any], ...] = ()

    def _fields(self) -> dict[str, Any]:
        return {"directory": self.directory, "format": self.format, "files": [dict(f) for f in self.files]}


@dataclass(frozen=True, kw_only=True, eq=False)
class ReplayBatch(PlannedBatch):
    """A replay's batch: quarantined records, by their ids in the quarantine (read from the state
    store, each as edited if it was; ``core/corrections.py``)."""

    replay: tuple[int, ...] = ()

    def _fields(self) -> dict[str, Any]:
        return {"replay": list(self.replay)}


def planned_batch(stored: Mapping[str, Any] | None, kind: str | None = None) -> PlannedBatch:
    """The typed batch of its stored JSON (a typed one as it is); ``kind``: the source's, when the
    JSON does not say (``postgres_log``, ``kafka``, ``landing``)."""
    if isinstance(stored, PlannedBatch):
        return stored
    raw = dict(stored or {})
    lost = raw.get("lost")
    if "replay" in raw:
        return ReplayBatch(replay=tuple(int(i) for i in raw["replay"]))
    ranges = tuple(Range(int(p), int(a), int(b)) for p, a, b in raw.get("ranges", ()))
    if "log" in raw or kind == "postgres_log":
        return LogBatch(log=str(raw.get("log") or ""), ranges=ranges, lost=lost)
    if "topic" in raw or kind == "kafka":
        return TopicBatch(topic=str(raw.get("topic") or ""), topic_id=raw.get("topic_id"),
                          cluster_id=raw.get("cluster_id"), ranges=ranges, lost=lost)
    if "files" in raw or "directory" in raw or kind == "landing":
        return FileBatch(directory=raw.get("directory"), format=str(raw.get("format") or "json"),
                         files=tuple(dict(f) for f in raw.get("files", ())), lost=lost)
    return PlannedBatch(lost=lost)
