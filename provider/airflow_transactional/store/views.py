"""Read-only queries of what the Transactions pages of the Airflow UI show: recent transactions
with their attempts and commits, the commit rate, and the quarantine of one txid."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

from psycopg2 import sql

from ..sources.base import Offsets
from .rows import Cursor, every, scalar, table


class TxnRow(NamedTuple):
    """A transaction with its commit, if any."""

    txid: int
    run_key: str
    status: str
    planned_at: datetime
    planned_records: int
    start_offsets: Offsets
    end_offsets: Offsets
    batch: dict[str, Any]
    failure: str | None
    committed_at: datetime | None
    commit_started_at: datetime | None
    committed_attempt: int | None
    records_read: int | None
    row_counts: dict[str, int] | None
    quarantined: int | None


class AttemptRow(NamedTuple):
    txid: int
    attempt: int
    plan_version: int
    status: str
    started_at: datetime
    finished_at: datetime | None
    records_read: int | None
    row_counts: dict[str, int] | None
    quarantined: int
    worker: str | None
    error: str | None


class QuarantinedRow(NamedTuple):
    id: int
    txid: int
    attempt: int
    source_offset: str
    event_id: str | None
    reason: str
    record: str | None
    committed: bool


class ReasonCount(NamedTuple):
    reason: str
    records: int


_TXN = ("SELECT t.txid, t.run_key, t.status, t.planned_at, t.planned_records, t.start_offsets, t.end_offsets, "
        "t.batch, t.failure, t.committed_at, c.commit_started_at, c.attempt AS committed_attempt, c.records_read, "
        "c.row_counts, c.quarantined FROM {t} t LEFT JOIN {c} c ON c.topology_id = t.topology_id AND c.txid = t.txid "
        "WHERE t.topology_id = %s")


def recent(cur: Cursor, schema: str, topology_id: str, limit: int) -> list[TxnRow]:
    """The ``limit`` latest transactions, latest first."""
    cur.execute(sql.SQL(_TXN + " ORDER BY t.txid DESC LIMIT %s").format(
        t=table(schema, "transactions"), c=table(schema, "commits")), (topology_id, limit))
    return every(cur, TxnRow)


def of_run(cur: Cursor, schema: str, topology_id: str, run_key: str) -> TxnRow | None:
    cur.execute(sql.SQL(_TXN + " AND t.run_key = %s").format(
        t=table(schema, "transactions"), c=table(schema, "commits")), (topology_id, run_key))
    rows = every(cur, TxnRow)
    return rows[0] if rows else None


def attempts(cur: Cursor, schema: str, topology_id: str, txids: Sequence[int]) -> list[AttemptRow]:
    """Every attempt of these txids, by txid then attempt."""
    cur.execute(sql.SQL("SELECT txid, attempt, plan_version, status, started_at, finished_at, records_read, "
                        "row_counts, quarantined, worker, error FROM {} WHERE topology_id = %s AND txid = ANY(%s) "
                        "ORDER BY txid, attempt").format(table(schema, "attempts")), (topology_id, list(txids)))
    return every(cur, AttemptRow)


def commits_since(cur: Cursor, schema: str, topology_id: str, minutes: int) -> int:
    cur.execute(sql.SQL("SELECT count(*) FROM {} WHERE topology_id = %s AND committed_at > "
                        "clock_timestamp() - make_interval(mins => %s)").format(table(schema, "commits")),
                (topology_id, minutes))
    return int(scalar(cur))


def quarantined(cur: Cursor, schema: str, topology_id: str, txid: int, *, reason: str | None = None,
                limit: int = 100, offset: int = 0) -> list[QuarantinedRow]:
    """Bad records found by the attempts of ``txid`` (optionally of one reason), in source order."""
    cur.execute(sql.SQL("SELECT id, txid, attempt, source_offset, event_id, reason, record, committed FROM {} "
                        "WHERE topology_id = %s AND txid = %s AND (%s::text IS NULL OR reason = %s) "
                        "ORDER BY attempt DESC, id LIMIT %s OFFSET %s").format(table(schema, "quarantine")),
                (topology_id, txid, reason, reason, limit, offset))
    return every(cur, QuarantinedRow)


def quarantine_reasons(cur: Cursor, schema: str, topology_id: str, txid: int) -> list[ReasonCount]:
    cur.execute(sql.SQL("SELECT reason, count(*) AS records FROM {} WHERE topology_id = %s AND txid = %s "
                        "GROUP BY reason ORDER BY count(*) DESC, reason").format(table(schema, "quarantine")),
                (topology_id, txid))
    return every(cur, ReasonCount)
