"""The ``transactions`` table: one row per planned transaction (one DAG run) -- its txid, its
run, its batch as exact source offsets, the plan's version, and whether it failed for good."""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, NamedTuple

from psycopg2 import sql
from psycopg2.extras import Json

from ..sources.base import Offsets
from . import notices
from .rows import Cursor, column_list, every, one, table
from .topologies import FOR_UPDATE


@dataclass(frozen=True)
class Transaction:
    """One planned transaction (one DAG run): a row of the table."""

    topology_id: str
    txid: int
    run_key: str
    plan_version: int
    start_offsets: Offsets
    end_offsets: Offsets
    batch: dict[str, Any]
    planned_records: int
    status: str
    planned_at: datetime
    committed_at: datetime | None
    pinned_attempt: int | None

    @property
    def empty(self) -> bool:
        return self.planned_records == 0

    @property
    def committed(self) -> bool:
        return self.status == "committed"


class PlannedRun(NamedTuple):
    txid: int
    run_key: str


class LastPlan(NamedTuple):
    txid: int
    end_offsets: Offsets


class Failed(NamedTuple):
    txid: int
    run_key: str
    failure: str | None
    attempt: int | None  # the latest attempt of the txid, when it failed
    attempt_error: str | None


class InFlightRow(NamedTuple):
    """A planned txid with its number of attempts and the latest attempt of its current plan."""

    txid: int
    run_key: str
    plan_version: int
    attempts: int
    latest_status: str | None
    latest_error: str | None


COLUMNS = column_list(f.name for f in fields(Transaction))


def get(cur: Cursor, schema: str, topology_id: str, txid: int, *, lock: bool = False) -> Transaction | None:
    cur.execute(sql.SQL("SELECT {} FROM {} WHERE topology_id = %s AND txid = %s{}")
                .format(COLUMNS, table(schema, "transactions"), FOR_UPDATE[lock]), (topology_id, txid))
    return one(cur, Transaction)


def uncommitted_from(cur: Cursor, schema: str, topology_id: str, txid: int) -> list[Transaction]:
    """Every transaction from ``txid`` on, lowest first, row locked."""
    cur.execute(sql.SQL("SELECT {} FROM {} WHERE topology_id = %s AND txid >= %s ORDER BY txid FOR UPDATE")
                .format(COLUMNS, table(schema, "transactions")), (topology_id, txid))
    return every(cur, Transaction)


def txid_of_run(cur: Cursor, schema: str, topology_id: str, run_key: str) -> int | None:
    cur.execute(sql.SQL("SELECT txid FROM {} WHERE topology_id = %s AND run_key = %s")
                .format(table(schema, "transactions")), (topology_id, run_key))
    row = cur.fetchone()
    return None if row is None else int(row[0])


def planned(cur: Cursor, schema: str, topology_id: str) -> list[PlannedRun]:
    """Every planned, uncommitted txid with its run, lowest first."""
    cur.execute(sql.SQL("SELECT txid, run_key FROM {} WHERE topology_id = %s AND status = 'planned' "
                        "ORDER BY txid").format(table(schema, "transactions")), (topology_id,))
    return every(cur, PlannedRun)


def last(cur: Cursor, schema: str, topology_id: str) -> LastPlan | None:
    """The highest txid planned and where its batch ends."""
    cur.execute(sql.SQL("SELECT txid, end_offsets FROM {} WHERE topology_id = %s ORDER BY txid DESC LIMIT 1")
                .format(table(schema, "transactions")), (topology_id,))
    return one(cur, LastPlan)


def insert(cur: Cursor, schema: str, topology_id: str, txid: int, run_key: str, start: Offsets, end: Offsets,
           batch: dict[str, Any], planned_records: int) -> None:
    cur.execute(sql.SQL("INSERT INTO {} (topology_id, txid, run_key, start_offsets, end_offsets, batch, "
                        "planned_records) VALUES (%s, %s, %s, %s, %s, %s, %s)").format(table(schema, "transactions")),
                (topology_id, txid, run_key, Json(start), Json(end), Json(batch), planned_records))


def replace_plan(cur: Cursor, schema: str, topology_id: str, txid: int, start: Offsets, end: Offsets,
                 batch: dict[str, Any], planned_records: int, reason: str) -> None:
    """A new version of the txid's plan (its earlier attempts can no longer be committed)."""
    cur.execute(sql.SQL("UPDATE {} SET plan_version = plan_version + 1, start_offsets = %s, end_offsets = %s, "
                        "batch = %s, planned_records = %s, replanned_at = clock_timestamp(), replan_reason = %s "
                        "WHERE topology_id = %s AND txid = %s").format(table(schema, "transactions")),
                (Json(start), Json(end), Json(batch), planned_records, reason, topology_id, txid))


def hand_over(cur: Cursor, schema: str, topology_id: str, txid: int, old_run_key: str, new_run_key: str) -> bool:
    """Give the planned ``txid`` of ``old_run_key`` to ``new_run_key``; False when it is not there to take."""
    cur.execute(sql.SQL("UPDATE {} SET run_key = %s, failed_at = NULL, failure = NULL WHERE topology_id = %s "
                        "AND txid = %s AND run_key = %s AND status = 'planned'")
                .format(table(schema, "transactions")), (new_run_key, topology_id, txid, old_run_key))
    return cur.rowcount == 1


def lift_failed(cur: Cursor, schema: str, topology_id: str, txid: int) -> None:
    cur.execute(sql.SQL("UPDATE {} SET failed_at = NULL, failure = NULL WHERE topology_id = %s "
                        "AND txid = %s AND failed_at IS NOT NULL").format(table(schema, "transactions")),
                (topology_id, txid))


def mark_failed(cur: Cursor, schema: str, topology_id: str, txid: int, reason: str) -> None:
    cur.execute(sql.SQL("UPDATE {} SET failed_at = clock_timestamp(), failure = %s "
                        "WHERE topology_id = %s AND txid = %s AND status = 'planned'")
                .format(table(schema, "transactions")), (reason[:2000], topology_id, txid))
    notices.send(cur, schema, topology_id, txid, "failed")


def first_failed_before(cur: Cursor, schema: str, topology_id: str, txid: int) -> Failed | None:
    """The lowest uncommitted txid below ``txid`` that failed for good."""
    cur.execute(sql.SQL("SELECT t.txid, t.run_key, t.failure, a.attempt, a.error AS attempt_error FROM {t} t "
                        "LEFT JOIN LATERAL (SELECT x.attempt, x.error FROM {a} x WHERE x.topology_id = t.topology_id "
                        "AND x.txid = t.txid ORDER BY x.attempt DESC LIMIT 1) a ON a.error IS NOT NULL "
                        "WHERE t.topology_id = %s AND t.txid < %s AND t.status = 'planned' "
                        "AND t.failed_at IS NOT NULL ORDER BY t.txid LIMIT 1")
                .format(t=table(schema, "transactions"), a=table(schema, "attempts")), (topology_id, txid))
    return one(cur, Failed)


def last_attempt_error(cur: Cursor, schema: str, topology_id: str, txid: int) -> tuple[int, str] | None:
    """(attempt, error) of the txid's latest attempt, when that one failed with an error."""
    cur.execute(sql.SQL("SELECT attempt, error FROM {} WHERE topology_id = %s AND txid = %s "
                        "ORDER BY attempt DESC LIMIT 1").format(table(schema, "attempts")), (topology_id, txid))
    row = cur.fetchone()
    return None if row is None or row[1] is None else (int(row[0]), str(row[1]))


def in_flight(cur: Cursor, schema: str, topology_id: str) -> list[InFlightRow]:
    """Every planned txid, lowest first, with its attempts and the latest one of its current plan."""
    cur.execute(sql.SQL(
        "SELECT t.txid, t.run_key, t.plan_version, "
        "(SELECT count(*) FROM {a} x WHERE x.topology_id = t.topology_id AND x.txid = t.txid) AS attempts, "
        "l.status AS latest_status, l.error AS latest_error FROM {t} t LEFT JOIN LATERAL ("
        "SELECT x.status, x.error FROM {a} x WHERE x.topology_id = t.topology_id AND x.txid = t.txid "
        "AND x.plan_version = t.plan_version ORDER BY x.attempt DESC LIMIT 1) l ON true "
        "WHERE t.topology_id = %s AND t.status = 'planned' ORDER BY t.txid")
        .format(a=table(schema, "attempts"), t=table(schema, "transactions")), (topology_id,))
    return every(cur, InFlightRow)


def mark_committed(cur: Cursor, schema: str, topology_id: str, txid: int, at: datetime) -> None:
    cur.execute(sql.SQL("UPDATE {} SET status = 'committed', committed_at = %s WHERE topology_id = %s AND txid = %s")
                .format(table(schema, "transactions")), (at, topology_id, txid))


def pin(cur: Cursor, schema: str, topology_id: str, txid: int, attempt: int) -> None:
    """Fix the attempt a commit applies (no re-plan or newer attempt can change it any more)."""
    cur.execute(sql.SQL("UPDATE {} SET pinned_attempt = %s WHERE topology_id = %s AND txid = %s")
                .format(table(schema, "transactions")), (attempt, topology_id, txid))


def lost_ranges(cur: Cursor, schema: str, topology_id: str, through_txid: int) -> list[Any]:
    """The source ranges retention removed from the batches committed through ``through_txid``."""
    cur.execute(sql.SQL("SELECT batch->'lost'->'ranges' FROM {} WHERE topology_id = %s AND txid <= %s "
                        "AND status = 'committed' AND batch ? 'lost'").format(table(schema, "transactions")),
                (topology_id, through_txid))
    return [r for (ranges,) in cur.fetchall() for r in (ranges or [])]
