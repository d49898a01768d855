"""The producer side of the event log: :class:`EventLog` creates a log, appends events to it
(idempotently, by event id) and truncates what every reader has committed. How appends keep LSNs
in order and duplicates out is told in :mod:`.pglog`, the log's source.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import psycopg2
import psycopg2.extensions

from .. import faults, identifiers, limits
from ..connections import CONNECTION_ERRORS, redact
from ..exceptions import ConfigError
from ..limits import id_refusal
from ..model import DEFAULT_SCHEMA
from ..store import logs, publications, topologies
from ..store.connection import Database, lost_connection
from ..store.migrations import migrate

log = logging.getLogger(__name__)

#: The ``kind`` of a topology's source that reads an event log (:class:`.pglog.PostgresLogSource`).
SOURCE_KIND = "postgres_log"


#: Why the log refuses an id (``append_events``): the id space of a topology appending to it.
RESERVED_ID = ("the id is in the id space of a topology that appends to this log (its events' ids are "
               "'<topology>:<origin>'): give producer events ids of their own")


def partition_of(event_id: str, partitions: int) -> int:
    """The partition an event id maps to when the producer names none (stable across runs)."""
    return zlib.crc32(event_id.encode()) % partitions


@dataclass(frozen=True)
class AppendResult:
    """What one append did: events stored, duplicates dropped (ids already in the log or given
    twice), and records refused one by one as ``(event_id, reason)`` (the rest were appended)."""

    appended: int
    duplicates: int
    retries: int = 0
    rejected: tuple[tuple[str, str], ...] = ()


def payload_refusal(payload: str) -> str | None:
    """Why a log cannot hold ``payload`` (None: it can): text PostgreSQL cannot store, or a
    record over :data:`..limits.MAX_RECORD_BYTES` (the log's ``append_events`` refuses one too)."""
    if "\x00" in payload:
        return "payload holds a NUL byte (\\x00), which PostgreSQL text cannot store"
    try:
        size = len(payload.encode("utf-8"))
    except UnicodeEncodeError as exc:
        return f"payload is not valid UTF-8 text ({exc.reason} at character {exc.start})"
    return limits.too_large(size) if size > limits.MAX_RECORD_BYTES else None


class Repair(NamedTuple):
    """What :meth:`EventLog.repair` did: the partition's next LSN before and after, and the
    topologies whose plans kept it from going lower (reset them to let it)."""

    before: int
    after: int
    held_by: tuple[str, ...]


class EventLog:
    """Producer-side API of a log: create it, append events, apply retention."""

    def __init__(self, dsn: str, name: str, *, schema: str = DEFAULT_SCHEMA,
                 retry_for: float = 60.0) -> None:
        self.name = identifiers.name("log name", name)
        self.schema = identifiers.name("schema name", schema)
        self.db = Database(dsn, application_name=f"airflow_transactional:log:{name}")
        self.retry_for = retry_for
        self._partitions: int | None = None

    def close(self) -> None:
        self.db.close()

    def create(self, partitions: int) -> None:
        """Create the log (idempotent); partitions can be added later, never removed."""
        if not isinstance(partitions, int) or partitions < 1:
            raise ConfigError(f"log {self.name!r}: partitions must be a positive integer, got {partitions!r}")
        migrate(self.db, self.schema)
        with self.db.transaction() as cur:
            logs.ensure(cur, self.schema, self.name, partitions)
        self._partitions = None

    def partitions(self) -> int:
        if self._partitions is None:
            with self.db.transaction() as cur:
                n = logs.count(cur, self.schema, self.name)
            if n is None:
                raise ConfigError(f"log {self.name!r} does not exist: call EventLog.create(partitions) first")
            self._partitions = n
        return self._partitions

    def append(self, events: Iterable[tuple[str, str]], *, partition: int | None = None) -> AppendResult:
        """Append ``(event_id, payload)`` pairs atomically; duplicates of stored ids are dropped.

        Without ``partition`` each event goes to ``partition_of(event_id)``. A lost connection
        (Postgres restart, network) is retried for up to ``retry_for`` seconds: the append is
        all-or-nothing and ids are unique, so a retry after an unknown outcome cannot duplicate.
        """
        n_parts = self.partitions()
        if isinstance(events, (str, bytes)) or not isinstance(events, Iterable):
            raise ConfigError(f"append takes an iterable of (event_id, payload) pairs, got {type(events).__name__}")
        if partition is not None and (not isinstance(partition, int) or isinstance(partition, bool)
                                      or not 0 <= partition < n_parts):
            raise ConfigError(f"log {self.name!r} has partitions 0..{n_parts - 1}, not {partition!r}")
        rows: list[tuple[int, str, str]] = []
        rejected: list[tuple[str, str]] = []
        for n, pair in enumerate(events):
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise ConfigError(f"event {n} of the append is {pair!r}: give (event_id, payload) pairs")
            event_id, payload = pair
            if not isinstance(event_id, str) or not event_id.strip():
                raise ConfigError(f"event {n}: the event id must be a non-empty string, got {event_id!r}; nothing "
                                  "was appended")
            if not isinstance(payload, str):
                raise ConfigError(f"event {event_id[:80]!r}: the payload must be a str (e.g. json.dumps(record)), "
                                  f"got {type(payload).__name__}; nothing was appended")
            why = id_refusal("the event id", event_id) or payload_refusal(payload)
            if why is not None:  # refused alone: the rest of the append goes in
                rejected.append((event_id, why))
                continue
            p = partition if partition is not None else partition_of(event_id, n_parts)
            rows.append((p, event_id, payload))
        for event_id, why in rejected:
            log.warning("log %s: event %r refused: %s", self.name, event_id[:80], why)
        if not rows:
            return AppendResult(0, 0, rejected=tuple(rejected))
        deadline = time.monotonic() + self.retry_for
        retries = 0
        while True:
            try:
                appended, refused = self._append_once(rows)
                for event_id in refused:  # refused by the log itself (another door checks nothing)
                    log.warning("log %s: event %r refused: %s", self.name, event_id[:80], RESERVED_ID)
                rejected += [(event_id, RESERVED_ID) for event_id in refused]
                return AppendResult(appended, len(rows) - appended - len(refused), retries, tuple(rejected))
            except CONNECTION_ERRORS as exc:
                self.db.close()
                if not lost_connection(exc) or time.monotonic() > deadline:
                    raise
                retries += 1
                log.warning("append to log %s lost its connection (%s); retrying", self.name,
                            redact(str(exc)).strip())
                time.sleep(min(0.2 * retries, 2.0))

    def _append_once(self, rows: Sequence[tuple[int, str, str]]) -> tuple[int, list[str]]:
        """One call of the log's door, ``append_events`` (store/schema: under each partition's lock,
        in partition order, dropping ids the log holds or held); (appended, ids it refused)."""
        with self.db.transaction() as cur:
            appended, refused = logs.append(cur, self.schema, self.name, rows)
            faults.point("append.before_commit", cur)
        faults.point("append.after_commit")
        return appended, refused

    def truncate(self, partition: int, through_lsn: int, *, force: bool = False) -> int:
        """Retention: delete the events of ``partition`` with LSN <= ``through_lsn``; the count.

        Never past the partition's head, and never past what every topology reading this log
        has committed -- unless ``force``: then the topologies that had not read those events lose
        them (opaque ones skip and report them; transactional ones stop with BatchUnavailable), and
        this is logged as a warning naming them. Ids are kept, so a late duplicate delivery is
        still recognised and dropped.
        """
        for name, value in (("partition", partition), ("through_lsn", through_lsn)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"truncate: {name} must be a non-negative integer, got {value!r}")
        with self.db.transaction() as cur:
            held = logs.bounds(cur, self.schema, self.name, partition)
            if held is None:
                raise ConfigError(f"log {self.name!r} has no partition {partition}")
            if through_lsn <= held.truncated_through:
                return 0
            if through_lsn > held.head:
                raise ConfigError(f"log {self.name!r} partition {partition} holds LSNs up to {held.head}: cannot "
                                  f"truncate through {through_lsn} (events appended later would be lost unread)")
            behind = self._readers_behind(cur, partition, through_lsn)
            if behind and not force:
                raise ConfigError(
                    f"log {self.name!r} partition {partition}: "
                    + ", ".join(f"{who} through LSN {c}" for who, c in behind)
                    + f"; truncating through {through_lsn} would remove events not yet read or published. Truncate "
                    f"through {min(c for _w, c in behind)} at most, or pass force=True (they then lose those events)")
            if behind:
                log.warning("log %s partition %d truncated through LSN %d by force: %s lose the events past "
                            "that", self.name, partition, through_lsn,
                            ", ".join(f"{who} through {c}" for who, c in behind))
            return logs.truncate(cur, self.schema, self.name, partition, through_lsn)

    def repair(self, partition: int) -> Repair:
        """The schema owner's repair of ``partition``'s counter when it was set too far (by mistake,
        or by a role that could write it before 0006): moved back to just past the last event the
        partition holds, what retention removed, and what every topology of this store reading the
        log planned -- never lower, so no LSN a reader may have passed is handed out again."""
        if not isinstance(partition, int) or isinstance(partition, bool) or partition < 0:
            raise ConfigError(f"repair: partition must be a non-negative integer, got {partition!r}")
        with self.db.transaction() as cur:
            held = logs.bounds(cur, self.schema, self.name, partition)  # locked against appends
            if held is None:
                raise ConfigError(f"log {self.name!r} has no partition {partition}")
            planned = topologies.planned_in_log(cur, self.schema, self.name, partition, SOURCE_KIND)
            floor = max([held.truncated_through, logs.last_lsn(cur, self.schema, self.name, partition),
                         *(c for _t, c in planned)])
            holding = tuple(t for t, c in planned if c == floor and c > held.truncated_through)
            before = held.head + 1
            if floor + 1 < before:
                logs.rewind(cur, self.schema, self.name, partition, floor + 1)
            return Repair(before, min(before, floor + 1), holding)

    def _readers_behind(self, cur: psycopg2.extensions.cursor, partition: int, lsn: int) -> list[tuple[str, int]]:
        """(who, LSN) of the topologies of this store reading this log that have not committed
        ``partition`` through ``lsn``, and of the outputs appending to it that have not published
        to Kafka what they appended there through ``lsn``."""
        readers = [(f"topology {t!r} has committed only", c)
                   for t, c in topologies.readers_of_log(cur, self.schema, self.name, partition, SOURCE_KIND)]
        publishers = [(f"topology {t!r} output {o!r} has published to Kafka only", c)
                      for t, o, c in publications.unpublished_in_log(cur, self.schema, self.name, partition)]
        return [(who, c) for who, c in readers + publishers if c < lsn]
