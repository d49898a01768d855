"""The ``commits`` table (the audit log: one row per committed txid, in order) and the
``quarantine`` (bad records of attempts, kept with the attempt that found them)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from psycopg2 import sql
from psycopg2.extras import Json

from ..sources.base import Offsets
from .rows import Cursor, column_list, every, insert_into, one, only, table

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


class JournalEntry(NamedTuple):
    txid: int
    attempt: int


class QuarantineCounts(NamedTuple):
    committed: int
    pending: int


def record(cur: Cursor, schema: str, topology_id: str, entry: CommitRecord) -> None:
    cur.execute(insert_into(schema, "commits", ["topology_id", *CommitRecord._fields]),
                (topology_id, *(Json(v) if isinstance(v, dict) else v for v in entry)))


def get(cur: Cursor, schema: str, topology_id: str, txid: int) -> Committed | None:
    cur.execute(sql.SQL("SELECT committed_at, attempt FROM {} WHERE topology_id = %s AND txid = %s")
                .format(table(schema, "commits")), (topology_id, txid))
    return one(cur, Committed)


def log(cur: Cursor, schema: str, topology_id: str, txid: int | None = None) -> list[CommitRecord]:
    """The audit log of a topology, in txid order (only ``txid``'s entry, if given)."""
    cur.execute(sql.SQL("SELECT {} FROM {} WHERE topology_id = %s AND txid = coalesce(%s, txid) ORDER BY txid")
                .format(column_list(CommitRecord._fields), table(schema, "commits")), (topology_id, txid))
    return every(cur, CommitRecord)


def end_offsets(cur: Cursor, schema: str, topology_id: str, txid: int) -> Offsets | None:
    cur.execute(sql.SQL("SELECT end_offsets FROM {} WHERE topology_id = %s AND txid = %s")
                .format(table(schema, "commits")), (topology_id, txid))
    row = cur.fetchone()
    return None if row is None else dict(row[0])


def journal(cur: Cursor, schema: str, topology_id: str, after_txid: int) -> list[JournalEntry]:
    """The txids committed after ``after_txid`` and their attempts (0: an empty batch), in order."""
    cur.execute(sql.SQL("SELECT txid, attempt FROM {} WHERE topology_id = %s AND txid > %s ORDER BY txid")
                .format(table(schema, "commits")), (topology_id, after_txid))
    return every(cur, JournalEntry)


def insert_quarantined(cur: Cursor, schema: str, rows: Iterable[Sequence[Any]]) -> None:
    """Bad records, each a row of :data:`QUARANTINE_COLUMNS`."""
    cur.executemany(insert_into(schema, "quarantine", QUARANTINE_COLUMNS), list(rows))


def settle_quarantine(cur: Cursor, schema: str, topology_id: str, txid: int, committed: int | None) -> None:
    """At the commit: keep the committed attempt's bad records (marked committed), drop the others'."""
    cur.execute(sql.SQL("DELETE FROM {} WHERE topology_id = %s AND txid = %s AND attempt IS DISTINCT FROM %s")
                .format(table(schema, "quarantine")), (topology_id, txid, committed))
    cur.execute(sql.SQL("UPDATE {} SET committed = true WHERE topology_id = %s AND txid = %s")
                .format(table(schema, "quarantine")), (topology_id, txid))


def quarantine_counts(cur: Cursor, schema: str, topology_id: str) -> QuarantineCounts:
    cur.execute(sql.SQL("SELECT count(*) FILTER (WHERE committed) AS committed, "
                        "count(*) FILTER (WHERE NOT committed) AS pending FROM {} WHERE topology_id = %s")
                .format(table(schema, "quarantine")), (topology_id,))
    return only(cur, QuarantineCounts)


def delete_orphan_quarantine(cur: Cursor, schema: str, topology_id: str) -> int:
    """Delete uncommitted bad records of attempts that are neither running nor complete."""
    cur.execute(sql.SQL("DELETE FROM {q} s WHERE s.topology_id = %s AND NOT s.committed AND NOT "
                        "EXISTS (SELECT 1 FROM {a} x WHERE x.topology_id = s.topology_id AND "
                        "x.txid = s.txid AND x.attempt = s.attempt AND x.status IN ('running', 'complete'))")
                .format(q=table(schema, "quarantine"), a=table(schema, "attempts")), (topology_id,))
    return int(cur.rowcount)


def delete_quarantine(cur: Cursor, schema: str, topology_id: str) -> None:
    cur.execute(sql.SQL("DELETE FROM {} WHERE topology_id = %s").format(table(schema, "quarantine")),
                (topology_id,))
