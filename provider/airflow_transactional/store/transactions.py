"""The ``transactions`` table: one row per planned transaction (one DAG run) -- its txid, its
run, its batch as exact source offsets, the plan's version, and whether it failed for good."""

from __future__ import annotations

from dataclasses import fields
from datetime import datetime
from typing import Any, NamedTuple

from psycopg2.extras import Json

from ..model import Offsets, PlannedBatch, PlannedRun, Transaction, planned_batch
from . import notices
from .rows import Cursor, column_list, every, one, scalar
from .statements import query
from .topologies import FOR_UPDATE


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
    failed_tries: int
    try_failure: str | None  # the last failed try's reason, when it came after the latest attempt began
    since: datetime  # when what it is doing now began


COLUMNS = column_list(f.name for f in fields(Transaction))


def get(cur: Cursor, schema: str, topology_id: str, txid: int, *, lock: bool = False) -> Transaction | None:
    cur.execute(query("transaction_get", schema, columns=COLUMNS, lock=FOR_UPDATE[lock]),
                {"topology": topology_id, "txid": txid})
    return one(cur, Transaction)


def uncommitted_from(cur: Cursor, schema: str, topology_id: str, txid: int) -> list[Transaction]:
    """Every transaction from ``txid`` on, lowest first, row locked."""
    cur.execute(query("transaction_uncommitted_from", schema, columns=COLUMNS), {"topology": topology_id, "txid": txid})
    return every(cur, Transaction)


def txid_of_run(cur: Cursor, schema: str, topology_id: str, run_key: str) -> int | None:
    cur.execute(query("transaction_of_run", schema), {"topology": topology_id, "run_key": run_key})
    row = cur.fetchone()
    return None if row is None else int(row[0])


def planned(cur: Cursor, schema: str, topology_id: str) -> list[PlannedRun]:
    """Every planned, uncommitted txid with its run, lowest first."""
    cur.execute(query("transaction_planned", schema), {"topology": topology_id})
    return every(cur, PlannedRun)


def last(cur: Cursor, schema: str, topology_id: str) -> LastPlan | None:
    """The highest txid planned and where its batch ends."""
    cur.execute(query("transaction_last", schema), {"topology": topology_id})
    return one(cur, LastPlan)


def insert(cur: Cursor, schema: str, topology_id: str, txid: int, run_key: str, start: Offsets, end: Offsets,
           batch: PlannedBatch, planned_records: int, corrects: dict[str, Any] | None = None) -> None:
    cur.execute(query("transaction_insert", schema), {
        "topology": topology_id, "txid": txid, "run_key": run_key, "start": Json(start), "end": Json(end),
        "batch": Json(batch.to_json()), "planned_records": planned_records,
        "corrects": Json(corrects) if corrects else None})


def replace_plan(cur: Cursor, schema: str, topology_id: str, txid: int, start: Offsets, end: Offsets,
                 batch: PlannedBatch, planned_records: int, reason: str) -> None:
    """A new version of the txid's plan (its earlier attempts can no longer be committed)."""
    cur.execute(query("transaction_replace_plan", schema), {
        "topology": topology_id, "txid": txid, "start": Json(start), "end": Json(end), "batch": Json(batch.to_json()),
        "planned_records": planned_records, "reason": reason})


def hand_over(cur: Cursor, schema: str, topology_id: str, txid: int, old_run_key: str, new_run_key: str) -> bool:
    """Give the planned ``txid`` of ``old_run_key`` to ``new_run_key``; False when it is not there to take."""
    cur.execute(query("transaction_hand_over", schema), {"topology": topology_id, "txid": txid,
                                                         "old_run_key": old_run_key, "new_run_key": new_run_key})
    return cur.rowcount == 1


def lift_failed(cur: Cursor, schema: str, topology_id: str, txid: int) -> None:
    cur.execute(query("transaction_lift_failed", schema), {"topology": topology_id, "txid": txid})


def mark_failed(cur: Cursor, schema: str, topology_id: str, txid: int, reason: str) -> None:
    cur.execute(query("transaction_mark_failed", schema), {"topology": topology_id, "txid": txid,
                                                           "reason": reason[:2000]})
    notices.send(cur, schema, topology_id, txid, "failed")


def note_failed_try(cur: Cursor, schema: str, topology_id: str, txid: int, reason: str) -> None:
    cur.execute(query("transaction_note_failed_try", schema), {"topology": topology_id, "txid": txid,
                                                               "reason": reason[:2000]})


def first_failed_before(cur: Cursor, schema: str, topology_id: str, txid: int) -> Failed | None:
    """The lowest uncommitted txid below ``txid`` that failed for good."""
    cur.execute(query("transaction_first_failed_before", schema), {"topology": topology_id, "txid": txid})
    return one(cur, Failed)


def last_attempt_error(cur: Cursor, schema: str, topology_id: str, txid: int) -> tuple[int, str] | None:
    """(attempt, error) of the txid's latest attempt, when that one failed with an error."""
    cur.execute(query("transaction_last_attempt_error", schema), {"topology": topology_id, "txid": txid})
    row = cur.fetchone()
    return None if row is None or row[1] is None else (int(row[0]), str(row[1]))


def last_try_failure(cur: Cursor, schema: str, topology_id: str, txid: int) -> str | None:
    cur.execute(query("transaction_last_try_failure", schema), {"topology": topology_id, "txid": txid})
    row = cur.fetchone()
    return None if row is None else str(row[0])


def in_flight(cur: Cursor, schema: str, topology_id: str) -> list[InFlightRow]:
    """Every planned txid, lowest first, with its attempts and the latest one of its current plan."""
    cur.execute(query("transaction_in_flight", schema), {"topology": topology_id})
    return every(cur, InFlightRow)


def mark_committed(cur: Cursor, schema: str, topology_id: str, txid: int, at: datetime) -> None:
    cur.execute(query("transaction_mark_committed", schema), {"topology": topology_id, "txid": txid, "at": at})


def pin(cur: Cursor, schema: str, topology_id: str, txid: int, attempt: int) -> None:
    """Fix the attempt a commit applies (no re-plan or newer attempt can change it any more)."""
    cur.execute(query("transaction_pin", schema), {"topology": topology_id, "txid": txid, "attempt": attempt})


def lost_ranges(cur: Cursor, schema: str, topology_id: str, through_txid: int) -> list[Any]:
    """The source ranges retention removed from the batches committed through ``through_txid``."""
    cur.execute(query("transaction_lost_ranges", schema), {"topology": topology_id, "txid": through_txid})
    return [r for (ranges,) in cur.fetchall() for r in (ranges or [])]


def planned_through(cur: Cursor, schema: str, topology_id: str) -> int:
    """The highest file sequence number a plan of a landing topology took (0: none)."""
    cur.execute(query("transaction_planned_through", schema), {"topology": topology_id})
    return int(scalar(cur))


def last_batch(cur: Cursor, schema: str, topology_id: str) -> PlannedBatch | None:
    """The batch of the latest plan (None: nothing planned yet)."""
    cur.execute(query("transaction_last_batch", schema), {"topology": topology_id})
    row = cur.fetchone()
    return None if row is None else planned_batch(row[0])


def range_origins(cur: Cursor, schema: str, topology_id: str) -> dict[str, int]:
    """Where the topology began reading each partition: the lowest start of its plans' batch ranges."""
    cur.execute(query("transaction_range_origins", schema), {"topology": topology_id})
    return {str(p): int(o) for p, o in cur.fetchall()}


def fix_digest(cur: Cursor, schema: str, topology_id: str, txid: int, plan_version: int, digest: str) -> str | None:
    """Fix what plan ``plan_version`` of ``txid`` reads, if nothing did yet; the plan's digest now
    (None: the txid has another plan now)."""
    cur.execute(query("transaction_fix_digest", schema), {"topology": topology_id, "txid": txid,
                                                          "plan_version": plan_version, "digest": digest})
    row = cur.fetchone()
    return None if row is None else str(row[0])


def take_digest(cur: Cursor, schema: str, topology_id: str, txid: int, plan_version: int, digest: str) -> None:
    cur.execute(query("transaction_take_digest", schema), {"topology": topology_id, "txid": txid,
                                                           "plan_version": plan_version, "digest": digest})
