"""The ``attempts`` table: every processing attempt of a transaction -- running, complete (with
what it staged), failed, discarded, or the one committed."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, NamedTuple

from psycopg2 import sql
from psycopg2.extras import Json

from .rows import Cursor, one, scalar, table


class Outcome(NamedTuple):
    """What a complete attempt staged and read."""

    attempt: int
    row_counts: dict[str, Any] | None
    records_read: int | None
    quarantined: int | None


class Finished(NamedTuple):
    attempt: int
    finished_at: datetime


def next_number(cur: Cursor, schema: str, topology_id: str, txid: int) -> int:
    cur.execute(sql.SQL("SELECT coalesce(max(attempt), 0) + 1 FROM {} WHERE topology_id = %s AND txid = %s")
                .format(table(schema, "attempts")), (topology_id, txid))
    return int(scalar(cur))


def insert(cur: Cursor, schema: str, topology_id: str, txid: int, attempt: int, plan_version: int,
           worker: str) -> None:
    cur.execute(sql.SQL("INSERT INTO {} (topology_id, txid, attempt, plan_version, status, worker) "
                        "VALUES (%s, %s, %s, %s, 'running', %s)").format(table(schema, "attempts")),
                (topology_id, txid, attempt, plan_version, worker))


def complete(cur: Cursor, schema: str, topology_id: str, txid: int, attempt: int, row_counts: Mapping[str, int],
             records_read: int, quarantined: int) -> bool:
    """Mark a running attempt of the txid's current, uncommitted plan complete; False when it is not one."""
    cur.execute(sql.SQL(
        "UPDATE {} a SET status = 'complete', finished_at = clock_timestamp(), row_counts = %s, "
        "records_read = %s, quarantined = %s FROM {} t WHERE a.topology_id = %s AND a.txid = %s "
        "AND a.attempt = %s AND a.status = 'running' AND t.topology_id = a.topology_id "
        "AND t.txid = a.txid AND t.plan_version = a.plan_version AND t.status = 'planned'")
        .format(table(schema, "attempts"), table(schema, "transactions")),
        (Json(dict(row_counts)), records_read, quarantined, topology_id, txid, attempt))
    return cur.rowcount == 1


def fail(cur: Cursor, schema: str, topology_id: str, txid: int, attempt: int, error: str) -> None:
    cur.execute(sql.SQL("UPDATE {} SET status = 'failed', finished_at = clock_timestamp(), error = %s "
                        "WHERE topology_id = %s AND txid = %s AND attempt = %s AND status = 'running'")
                .format(table(schema, "attempts")), (error[:2000], topology_id, txid, attempt))


def latest_finished(cur: Cursor, schema: str, topology_id: str, txid: int) -> Finished | None:
    """The latest complete attempt of the current plan of an uncommitted txid."""
    cur.execute(sql.SQL("SELECT a.attempt, a.finished_at FROM {} a JOIN {} t USING (topology_id, txid) "
                        "WHERE a.topology_id = %s AND a.txid = %s AND a.status = 'complete' "
                        "AND a.plan_version = t.plan_version AND t.status = 'planned' "
                        "ORDER BY a.attempt DESC LIMIT 1")
                .format(table(schema, "attempts"), table(schema, "transactions")), (topology_id, txid))
    return one(cur, Finished)


def outcome(cur: Cursor, schema: str, topology_id: str, txid: int, attempt: int) -> Outcome | None:
    cur.execute(sql.SQL("SELECT attempt, row_counts, records_read, quarantined FROM {} "
                        "WHERE topology_id = %s AND txid = %s AND attempt = %s")
                .format(table(schema, "attempts")), (topology_id, txid, attempt))
    return one(cur, Outcome)


def latest_outcome(cur: Cursor, schema: str, topology_id: str, txid: int, plan_version: int) -> Outcome | None:
    """The latest complete attempt of plan ``plan_version``."""
    cur.execute(sql.SQL("SELECT attempt, row_counts, records_read, quarantined FROM {} "
                        "WHERE topology_id = %s AND txid = %s AND status = 'complete' AND plan_version = %s "
                        "ORDER BY attempt DESC LIMIT 1")
                .format(table(schema, "attempts")), (topology_id, txid, plan_version))
    return one(cur, Outcome)


def settle(cur: Cursor, schema: str, topology_id: str, txid: int, committed: int | None) -> None:
    """At the commit: ``committed`` is the attempt committed, every other unfailed one is discarded."""
    cur.execute(sql.SQL("UPDATE {} SET status = CASE WHEN attempt = %s THEN 'committed' ELSE 'discarded' END, "
                        "finished_at = coalesce(finished_at, clock_timestamp()) "
                        "WHERE topology_id = %s AND txid = %s AND status <> 'failed'")
                .format(table(schema, "attempts")), (committed, topology_id, txid))


def discard_replanned(cur: Cursor, schema: str, topology_id: str, txid: int, reason: str) -> None:
    """A re-plan voids the running and complete attempts of the old plan."""
    cur.execute(sql.SQL("UPDATE {} SET status = 'discarded', finished_at = coalesce(finished_at, "
                        "clock_timestamp()), error = %s WHERE topology_id = %s AND txid = %s "
                        "AND status IN ('running', 'complete')").format(table(schema, "attempts")),
                (f"re-planned: {reason}", topology_id, txid))


def discard_superseded(cur: Cursor, schema: str, topology_id: str) -> int:
    """Discard complete attempts that can never commit: of a committed txid (not the one committed),
    of an older plan, or older than the latest complete attempt of the plan. Returns how many."""
    a, t = table(schema, "attempts"), table(schema, "transactions")
    cur.execute(sql.SQL(
        "UPDATE {a} x SET status = 'discarded', finished_at = coalesce(x.finished_at, clock_timestamp()), "
        "error = coalesce(x.error, 'superseded or outdated') FROM {t} WHERE x.topology_id = %s "
        "AND {t}.topology_id = x.topology_id AND {t}.txid = x.txid AND x.status = 'complete' AND "
        "x.attempt IS DISTINCT FROM {t}.pinned_attempt AND ({t}.status = 'committed' OR "
        "x.plan_version <> {t}.plan_version OR x.attempt < (SELECT max(y.attempt) FROM {a} y "
        "WHERE y.topology_id = x.topology_id AND y.txid = x.txid AND y.status = 'complete' "
        "AND y.plan_version = {t}.plan_version))").format(a=a, t=t), (topology_id,))
    return int(cur.rowcount)


def delete_unusable_staged(cur: Cursor, schema: str, staging: sql.Composed, topology_id: str) -> int:
    """Delete staged rows that can never be committed. Kept: rows of running attempts and of the
    latest complete attempt of each uncommitted txid's current plan (and a pinned attempt), and
    the committed attempts after a running rebuild's txid (its journal). Returns how many went."""
    a, t = table(schema, "attempts"), table(schema, "transactions")
    keep = sql.SQL(
        "EXISTS (SELECT 1 FROM {a} x JOIN {t} USING (topology_id, txid) WHERE x.topology_id = %s "
        "AND x.txid = s.txid AND x.attempt = s.attempt AND (({t}.status = 'planned' AND "
        "(x.attempt = {t}.pinned_attempt OR (x.plan_version = {t}.plan_version AND "
        "x.status IN ('running', 'complete')))) OR (x.status = 'committed' AND x.txid > "
        "(SELECT coalesce(rebuild_from_txid, 9223372036854775807) FROM {topo} WHERE topology_id = %s))))"
    ).format(a=a, t=t, topo=table(schema, "topologies"))
    cur.execute(sql.SQL("DELETE FROM {} s WHERE NOT {}").format(staging, keep), (topology_id, topology_id))
    return int(cur.rowcount)


def delete_committed_staged(cur: Cursor, schema: str, staging: sql.Composed, topology_id: str) -> None:
    """Delete the staged rows of every committed txid (a finished rebuild's journal)."""
    cur.execute(sql.SQL("DELETE FROM {} s USING {} t WHERE t.topology_id = %s AND t.txid = s.txid "
                        "AND t.status = 'committed'").format(staging, table(schema, "transactions")),
                (topology_id,))
