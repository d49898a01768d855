"""The shared vocabulary: the types and small helpers every layer speaks -- a source's position
(:data:`Offsets`), a transaction (:class:`Transaction`), an attempt, a commit's result, a topology's
status, the planned runs -- and how they read as text. Plain frozen dataclasses and pure functions,
no I/O: the store maps its rows into these types, the core works on them, and the Airflow and Spark
layers read them without reaching into either."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

__all__ = [
    "DEFAULT_SCHEMA",
    "Attempt",
    "CommitResult",
    "FileBatch",
    "InFlight",
    "LogBatch",
    "Offsets",
    "OutputStaging",
    "PlannedBatch",
    "PlannedRun",
    "Range",
    "RecoverResult",
    "StagedEvent",
    "Staging",
    "TopicBatch",
    "TopologyStatus",
    "Transaction",
    "duration",
    "event_id",
    "offsets_moved",
    "one_line",
    "planned_batch",
    "read_digest",
    "same_offsets",
    "span_text",
]

#: The provider's schema in the state store when none is named.
DEFAULT_SCHEMA = "airflow_txn"

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


@dataclass(frozen=True)
class Transaction:
    """One planned transaction (one DAG run): a row of the ``transactions`` table."""

    topology_id: str
    txid: int
    run_key: str
    plan_version: int
    start_offsets: Offsets
    end_offsets: Offsets
    batch: PlannedBatch
    planned_records: int
    status: str
    planned_at: datetime
    committed_at: datetime | None
    pinned_attempt: int | None
    corrects: Mapping[str, Any] | None = None  # a correction's: the txids it corrects (``core/corrections.py``)

    def __post_init__(self) -> None:
        object.__setattr__(self, "batch", planned_batch(self.batch))  # the store's row holds its JSON

    @property
    def empty(self) -> bool:
        return self.planned_records == 0

    @property
    def committed(self) -> bool:
        return self.status == "committed"


class PlannedRun(NamedTuple):
    txid: int
    run_key: str


#: The attempt number the shadow audit stages a recomputed txid under, beside its committed rows
#: (core/verify.py): never a real attempt's (those count from 1), never history (no commit names it).
VERIFY_ATTEMPT = -1


@dataclass(frozen=True)
class Attempt:
    """One processing attempt of a transaction."""

    topology_id: str
    txid: int
    attempt: int
    plan_version: int


@dataclass(frozen=True)
class CommitResult:
    topology_id: str
    txid: int
    committed: bool  # False: the txid was committed before; nothing was done
    attempt: int | None
    committed_at: datetime | None
    message: str


@dataclass(frozen=True)
class InFlight:
    txid: int
    run_key: str
    phase: str  # planned | processing | processed | failed
    plan_version: int
    attempts: int
    error: str | None = None
    failed_tries: int = 0  # tries of its process task that failed (attempts registered or not)
    since: datetime | None = None  # when its phase began (planned, attempt started or ended, try failed)


@dataclass(frozen=True)
class TopologyStatus:
    topology_id: str
    committed_txid: int
    committed_offsets: Offsets
    last_commit_at: datetime | None
    in_flight: list[InFlight]
    lag: int
    blocked_by: str | None
    quarantined: int
    quarantined_pending: int
    lost_records: int
    lag_seconds: float | None = None  # the oldest waiting record's age; None: the source cannot tell
    source_error: str | None = None  # why the source could not say its lag now (a Kafka cluster out of reach)
    stalled: bool = False  # no commit for the declared stall_after while the source holds records
    lag_unit: str = "records"  # what ``lag`` counts: records, files (a landing directory), offsets (Kafka)
    offsets_skipped: int = 0  # committed Kafka offsets that held no committed record (aborted, markers)
    lag_bytes: int | None = None  # what the waiting files hold (a landing directory on S3 or HDFS)
    quarantine_warning: str | None = None  # the latest txids set aside half their max_quarantined or more

    def to_dict(self) -> dict[str, Any]:
        return {
            "topology_id": self.topology_id,
            "committed_txid": self.committed_txid,
            "committed_offsets": self.committed_offsets,
            "last_commit_at": self.last_commit_at.isoformat() if self.last_commit_at else None,
            "in_flight": [{**vars(f), "since": f.since.isoformat() if f.since else None} for f in self.in_flight],
            "lag": self.lag,
            "blocked_by": self.blocked_by,
            "quarantined": self.quarantined,
            "quarantined_pending": self.quarantined_pending,
            "lost_records": self.lost_records,
            "lag_seconds": self.lag_seconds,
            "source_error": self.source_error,
            "stalled": self.stalled,
            "lag_unit": self.lag_unit,
            "offsets_skipped": self.offsets_skipped,
            "lag_bytes": self.lag_bytes,
            "quarantine_warning": self.quarantine_warning,
        }


@dataclass
class RecoverResult:
    staged_rows_deleted: int = 0
    attempts_discarded: int = 0
    quarantine_rows_deleted: int = 0
    details: list[str] = field(default_factory=list)


def same_offsets(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Offsets are equal when every position is; a missing position counts as 0."""
    return all(int(a.get(k, 0)) == int(b.get(k, 0)) for k in set(a) | set(b))


def offsets_moved(start: Mapping[str, Any], end: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(where, from, to) of each offset a batch moved, partitions in number order (a landing
    directory's single ``seq`` after them): what a person reads as a batch's span."""
    def order(key: str) -> tuple[int, str]:
        return (int(key), "") if str(key).isdigit() else (1 << 62, str(key))

    return [(k, start.get(k, "-"), end.get(k, "-")) for k in sorted(set(start) | set(end), key=order)
            if start.get(k) != end.get(k)]


def span_text(start: Mapping[str, Any], end: Mapping[str, Any]) -> str:
    """A batch's offsets as text: ``partition 0: 10 -> 25, partition 3: 4 -> 9`` (``seq: 3 -> 5``)."""
    return ", ".join(f"{'partition ' if str(k).isdigit() else ''}{k}: {a} -> {b}"
                     for k, a, b in offsets_moved(start, end)) or "nothing new"


def one_line(error: str, limit: int = 300) -> str:
    """The first line of an error that says something (a traceback's header and Spark's empty
    lines skipped), at most ``limit`` characters."""
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    line = next((x for x in lines if not x.startswith(("Traceback", "File "))), lines[0] if lines else "")
    return line if len(line) <= limit else f"{line[:limit - 3]}..."


def failure_text(exc: BaseException) -> str:
    """What a failed attempt records of its exception: its type and text -- and for an error of
    Spark's JVM (a Py4J error, whose text is the top of a Java stack), the root of its chain of
    causes first (``java.net.ConnectException: Connection refused``), which says what failed."""
    text = f"{type(exc).__name__}: {exc}"
    cause = getattr(exc, "java_exception", None)
    if cause is None:
        return text
    try:
        for _ in range(32):  # a chain of causes, not a cycle
            deeper = cause.getCause()
            if deeper is None:
                break
            cause = deeper
        root = str(cause.toString())
    except Exception:  # the JVM is gone: what the exception says is all there is
        return text
    return f"{type(exc).__name__}, caused by {one_line(root, 500)}\n{text}"


def duration(seconds: float) -> str:
    """A wait in words: "40 s", "12 min", "3.5 h"."""
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min" if seconds < 5400 \
        else f"{seconds / 3600:.1f} h"


#: An output event as a processor stages it: output, partition, seq, event id, payload, the
#: verdict it waits for -- (decision, request id, granted) -- or three Nones, and whether it is a
#: retraction (None in a batch that read no correction's events: store/outputs.py).
StagedEvent = tuple[str, int, "int | None", str, str, "str | None", "str | None", "bool | None", "bool | None"]


class OutputStaging(NamedTuple):
    """Where a processor stages output events and requests: the COPY (CSV) of event rows
    (:data:`airflow_transactional.store.outputs.COLUMNS`), each output's partitions now, and the
    COPY (CSV) of each decision's request rows (:func:`airflow_transactional.store.decisions.columns`)."""

    copy: str
    partitions: dict[str, int]
    requests: dict[str, str]


class Staging(NamedTuple):
    """Where a processor's rows go: a ``COPY ... FROM STDIN WITH (FORMAT csv)`` into a staging
    table (or the quarantine), with ``prefix`` as its leading constant columns (topology, txid,
    attempt, ...). No DSN: it travels to the executors, which read theirs from a file. An empty
    ``copy`` is nowhere (an audit counts what it would set aside)."""

    copy: str
    prefix: tuple[Any, ...] = ()


#: The Kafka header of a correction's retraction (its value: the id of the event it takes back).
RETRACTS_HEADER = "airflow-txn-retracts"
#: A retraction's event id: ``<the id of the event it takes back>~retracted@<txid>``.
RETRACTED = "~retracted@"


def event_id(topology_id: str, origin: str) -> str:
    """The log's id of an event a topology emits: its topology, then its origin (deterministic,
    so an event emitted again is known and never appended twice)."""
    return f"{topology_id}:{origin}"


def read_digest(records: int, offset_crcs: int) -> str:
    """Which records an attempt read: how many, and the sum of the CRC-32s of their offsets (the same
    in the Spark helper and the pure-Python processor)."""
    return f"{records}:{offset_crcs}"
