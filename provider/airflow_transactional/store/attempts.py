"""The ``attempts`` table: every processing attempt of a transaction -- running, complete (with
what it staged), failed, discarded, or the one committed."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, NamedTuple

from psycopg2 import sql
from psycopg2.extras import Json

from .rows import Cursor, one, scalar
from .statements import query


class Outcome(NamedTuple):
    """What a complete attempt staged and read."""

    attempt: int
    row_counts: dict[str, Any] | None
    records_read: int | None
    quarantined: int | None
    code: dict[str, Any] | None


class Finished(NamedTuple):
    attempt: int
    finished_at: datetime


def next_number(cur: Cursor, schema: str, topology_id: str, txid: int) -> int:
    cur.execute(query("attempt_next_number", schema), {"topology": topology_id, "txid": txid})
    return int(scalar(cur))


def insert(cur: Cursor, schema: str, topology_id: str, txid: int, attempt: int, plan_version: int,
           worker: str, code: Mapping[str, str] | None = None) -> None:
    """A running attempt; ``code``: what it runs (:mod:`..provenance`)."""
    cur.execute(query("attempt_insert", schema), {"topology": topology_id, "txid": txid, "attempt": attempt,
                                                  "plan_version": plan_version, "worker": worker,
                                                  "code": Json(dict(code)) if code else None})


def complete(cur: Cursor, schema: str, topology_id: str, txid: int, attempt: int, row_counts: Mapping[str, int],
             records_read: int, quarantined: int, read_digest: str | None = None) -> bool:
    """Mark a running attempt of the txid's current, uncommitted plan complete; False when it is not one."""
    cur.execute(query("attempt_complete", schema), {
        "topology": topology_id, "txid": txid, "attempt": attempt, "row_counts": Json(dict(row_counts)),
        "records_read": records_read, "quarantined": quarantined, "read_digest": read_digest})
    return cur.rowcount == 1


def recount(cur: Cursor, schema: str, topology_id: str, txid: int, attempt: int, row_counts: Mapping[str, int]) -> None:
    """Replace the attempt's counts of some states (their staged rows changed: a correction's differences)."""
    cur.execute(query("attempt_recount", schema), {"topology": topology_id, "txid": txid, "attempt": attempt,
                                                   "row_counts": Json(dict(row_counts))})


def fail(cur: Cursor, schema: str, topology_id: str, txid: int, attempt: int, error: str) -> None:
    cur.execute(query("attempt_fail", schema), {"topology": topology_id, "txid": txid, "attempt": attempt,
                                                "error": error[:2000]})


def latest_finished(cur: Cursor, schema: str, topology_id: str, txid: int) -> Finished | None:
    """The latest complete attempt of the current plan of an uncommitted txid."""
    cur.execute(query("attempt_latest_finished", schema), {"topology": topology_id, "txid": txid})
    return one(cur, Finished)


def outcome(cur: Cursor, schema: str, topology_id: str, txid: int, attempt: int) -> Outcome | None:
    cur.execute(query("attempt_outcome", schema), {"topology": topology_id, "txid": txid, "attempt": attempt})
    return one(cur, Outcome)


def latest_outcome(cur: Cursor, schema: str, topology_id: str, txid: int, plan_version: int) -> Outcome | None:
    """The latest complete attempt of plan ``plan_version``."""
    cur.execute(query("attempt_latest_outcome", schema), {"topology": topology_id, "txid": txid,
                                                          "plan_version": plan_version})
    return one(cur, Outcome)


def settle(cur: Cursor, schema: str, topology_id: str, txid: int, committed: int | None) -> None:
    """At the commit: ``committed`` is the attempt committed, every other unfailed one is discarded."""
    cur.execute(query("attempt_settle", schema), {"topology": topology_id, "txid": txid, "committed": committed})


def discard_replanned(cur: Cursor, schema: str, topology_id: str, txid: int, reason: str) -> None:
    """A re-plan voids the running and complete attempts of the old plan."""
    cur.execute(query("attempt_discard_replanned", schema), {"topology": topology_id, "txid": txid,
                                                             "error": f"re-planned: {reason}"})


def discard_superseded(cur: Cursor, schema: str, topology_id: str) -> int:
    """Discard complete attempts that can never commit: of a committed txid (not the one committed),
    of an older plan, or older than the latest complete attempt of the plan. Returns how many."""
    cur.execute(query("attempt_discard_superseded", schema), {"topology": topology_id})
    return int(cur.rowcount)


def delete_unusable_staged(cur: Cursor, schema: str, staging: sql.Composed, topology_id: str) -> int:
    """Delete staged rows that can never be committed (see the query); returns how many went."""
    cur.execute(query("attempt_delete_unusable_staged", schema, staging=staging), {"topology": topology_id})
    return int(cur.rowcount)


class DigestPair(NamedTuple):
    attempt_digest: str
    plan_digest: str


def digest_differs(cur: Cursor, schema: str, topology_id: str, txid: int, attempt: int) -> DigestPair | None:
    """The attempt's digest and its plan's, when they differ (None: the same, or one unknown)."""
    cur.execute(query("attempt_digest_differs", schema), {"topology": topology_id, "txid": txid, "attempt": attempt})
    return one(cur, DigestPair)
