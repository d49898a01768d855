"""Read-only queries of what the Transactions pages of the Airflow UI show: recent transactions
with their attempts and commits, the commit rate, and the quarantine of one txid."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

from ..model import Offsets
from .commits import reason_kind
from .rows import Cursor, every
from .statements import query


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
    failed_tries: int
    last_try_failure: str | None
    committed_at: datetime | None
    commit_started_at: datetime | None
    committed_attempt: int | None
    records_read: int | None
    row_counts: dict[str, int] | None
    quarantined: int | None
    corrects: dict[str, Any] | None
    code: dict[str, str] | None
    digests: dict[str, str] | None
    check_status: str | None  # the shadow audit's (store/verifications.py)
    check_detail: dict[str, Any] | None


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


def recent(cur: Cursor, schema: str, topology_id: str, limit: int) -> list[TxnRow]:
    """The ``limit`` latest transactions, latest first."""
    cur.execute(query("view_transactions", schema), {"topology": topology_id, "run_key": None, "limit": limit})
    return every(cur, TxnRow)


def of_run(cur: Cursor, schema: str, topology_id: str, run_key: str) -> TxnRow | None:
    cur.execute(query("view_transactions", schema), {"topology": topology_id, "run_key": run_key, "limit": 1})
    rows = every(cur, TxnRow)
    return rows[0] if rows else None


def attempts(cur: Cursor, schema: str, topology_id: str, txids: Sequence[int]) -> list[AttemptRow]:
    """Every attempt of these txids, by txid then attempt."""
    cur.execute(query("view_attempts", schema), {"topology": topology_id, "txids": list(txids)})
    return every(cur, AttemptRow)


def appended(cur: Cursor, schema: str, topology_id: str, txids: Sequence[int]) -> dict[int, dict[str, int]]:
    """txid -> output -> events its commit appended."""
    cur.execute(query("view_appended", schema), {"topology": topology_id, "txids": list(txids)})
    out: dict[int, dict[str, int]] = {}
    for txid, output, events in cur.fetchall():
        out.setdefault(int(txid), {})[str(output)] = int(events)
    return out


def verdict_counts(cur: Cursor, schema: str, topology_id: str,
                   txids: Sequence[int]) -> dict[int, dict[str, tuple[int, int]]]:
    """txid -> decision -> (granted, declined) by its commit."""
    cur.execute(query("view_verdict_counts", schema), {"topology": topology_id, "txids": list(txids)})
    out: dict[int, dict[str, tuple[int, int]]] = {}
    for txid, decision, granted, declined in cur.fetchall():
        out.setdefault(int(txid), {})[str(decision)] = (int(granted), int(declined))
    return out


def commit_rate(cur: Cursor, schema: str, topology_id: str, minutes: int) -> float:
    """Commits per minute over the last ``minutes`` -- or over the time since the first commit,
    when that is shorter (at least a minute: one commit just now is one per minute, not sixty)."""
    cur.execute(query("view_commit_rate", schema), {"topology": topology_id, "minutes": minutes})
    commits, span = cur.fetchone()
    return int(commits) / max(1.0, float(span or 0))


def quarantined(cur: Cursor, schema: str, topology_id: str, txid: int, *, reason: str | None = None,
                limit: int = 100, offset: int = 0) -> list[QuarantinedRow]:
    """Bad records found by the attempts of ``txid`` (optionally of one kind of reason: a reason
    without the value it refused, as :func:`quarantine_reasons` lists them), in source order."""
    cur.execute(query("view_quarantined", schema, kind=reason_kind()),
                {"topology": topology_id, "txid": txid, "reason": reason, "limit": limit, "offset": offset})
    return every(cur, QuarantinedRow)


def quarantine_reasons(cur: Cursor, schema: str, topology_id: str, txid: int) -> list[ReasonCount]:
    """The kinds of reason the attempts of ``txid`` set records aside for, with how many each."""
    cur.execute(query("view_quarantine_reasons", schema, kind=reason_kind()),
                {"topology": topology_id, "txid": txid})
    return every(cur, ReasonCount)
