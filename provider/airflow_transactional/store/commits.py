"""The ``commits`` table (the audit log: one row per committed txid, in order) and the
``quarantine`` (bad records of attempts, kept with the attempt that found them)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from psycopg2 import sql
from psycopg2.extras import Json

from ..model import Offsets
from .rows import Cursor, column_list, every, one, only
from .statements import query

#: The columns of a quarantined record, in the order ``insert_quarantined`` and the COPY take them.
QUARANTINE_COLUMNS = ("topology_id", "txid", "attempt", "source_offset", "event_id", "reason", "record",
                      "record_length")


class Committed(NamedTuple):
    committed_at: datetime
    attempt: int


class CommitRecord(NamedTuple):
    """One row of the audit log."""

    txid: int
    attempt: int
    plan_version: int
    run_key: str
    start_offsets: Offsets
    end_offsets: Offsets
    records_read: int
    row_counts: dict[str, int]
    quarantined: int
    committer: str
    commit_started_at: datetime
    committed_at: datetime
    code: dict[str, str] | None = None  # what produced it (:mod:`..provenance`)
    digests: dict[str, str] | None = None  # per state: "rows:hash" of the deltas it applied
    corrects: dict[str, Any] | None = None  # a correction's: what it corrects


class JournalEntry(NamedTuple):
    txid: int
    attempt: int


class QuarantineCounts(NamedTuple):
    committed: int
    pending: int


def record(cur: Cursor, schema: str, topology_id: str, entry: CommitRecord) -> None:
    cur.execute(query("commit_record", schema), {"topology": topology_id, **{
        k: Json(v) if isinstance(v, dict) else v for k, v in entry._asdict().items()}})


def get(cur: Cursor, schema: str, topology_id: str, txid: int) -> Committed | None:
    cur.execute(query("commit_get", schema), {"topology": topology_id, "txid": txid})
    return one(cur, Committed)


def log(cur: Cursor, schema: str, topology_id: str, txid: int | None = None, *, after: int = 0) -> list[CommitRecord]:
    """The audit log of a topology, in txid order (only ``txid``'s entry, if given; only the txids
    after ``after``)."""
    cur.execute(query("commit_log", schema, columns=column_list(CommitRecord._fields)),
                {"topology": topology_id, "txid": txid, "after": after})
    return every(cur, CommitRecord)


def end_offsets(cur: Cursor, schema: str, topology_id: str, txid: int) -> Offsets | None:
    cur.execute(query("commit_end_offsets", schema), {"topology": topology_id, "txid": txid})
    row = cur.fetchone()
    return None if row is None else dict(row[0])


def journal(cur: Cursor, schema: str, topology_id: str, after_txid: int) -> list[JournalEntry]:
    """The txids committed after ``after_txid`` and their attempts (0: an empty batch), in order."""
    cur.execute(query("commit_journal", schema), {"topology": topology_id, "txid": after_txid})
    return every(cur, JournalEntry)


def insert_quarantined(cur: Cursor, schema: str, rows: Iterable[Sequence[Any]]) -> None:
    """Bad records, each a row of :data:`QUARANTINE_COLUMNS`."""
    cur.executemany(query("quarantine_insert", schema), list(rows))


def quarantine_copy(cur: Cursor, schema: str) -> str:
    """The COPY statement (CSV) of bad records: rows of :data:`QUARANTINE_COLUMNS`."""
    return query("quarantine_copy", schema).as_string(cur)


def settle_quarantine(cur: Cursor, schema: str, topology_id: str, txid: int, committed: int | None) -> None:
    """At the commit: keep the committed attempt's bad records (marked committed), drop the others'."""
    cur.execute(query("quarantine_settle", schema), {"topology": topology_id, "txid": txid, "attempt": committed})


def quarantine_counts(cur: Cursor, schema: str, topology_id: str) -> QuarantineCounts:
    cur.execute(query("quarantine_counts", schema), {"topology": topology_id})
    return only(cur, QuarantineCounts)


def recent_quarantine(cur: Cursor, schema: str, topology_id: str, txids: int) -> tuple[int, int]:
    """(records read, records set aside) by the latest ``txids`` committed txids, corrections aside."""
    cur.execute(query("recent_quarantine", schema), {"topology": topology_id, "txids": txids})
    records, quarantined = cur.fetchone()
    return int(records), int(quarantined)


def top_reasons(cur: Cursor, schema: str, topology_id: str, txid: int, attempt: int,
                limit: int = 3) -> list[tuple[str, int]]:
    """The most common kinds of reason an attempt's bad records were set aside for, with their counts."""
    cur.execute(query("quarantine_top_reasons", schema, kind=reason_kind()),
                {"topology": topology_id, "txid": txid, "attempt": attempt, "limit": limit})
    return [(str(why), int(n)) for why, n in cur.fetchall()]


def reason_kind() -> sql.Composed:
    """The SQL of a quarantined record's reason without the value it refused (a fragment on ``reason``)."""
    return query("quarantine_reason_kind")


def delete_orphan_quarantine(cur: Cursor, schema: str, topology_id: str) -> int:
    """Delete uncommitted bad records of attempts that are neither running nor complete."""
    cur.execute(query("quarantine_delete_orphans", schema), {"topology": topology_id})
    return int(cur.rowcount)


def delete_quarantine(cur: Cursor, schema: str, topology_id: str) -> None:
    cur.execute(query("quarantine_delete", schema), {"topology": topology_id})
