"""Liveness: which earlier txid blocks a commit for good, so waiting tasks fail fast and free their
``max_active_runs`` slots (docs/design.md, trap 2) instead of waiting for ever."""

from __future__ import annotations

import logging

import psycopg2.errors
import psycopg2.extensions
from psycopg2 import sql

from .context import StateStore

log = logging.getLogger("airflow_transactional.coordinator")


def lift_failed(store: StateStore, cur: psycopg2.extensions.cursor, topology_id: str, txid: int) -> None:
    cur.execute(sql.SQL("UPDATE {} SET failed_at = NULL, failure = NULL WHERE topology_id = %s "
                        "AND txid = %s AND failed_at IS NOT NULL").format(store.t("transactions")),
                (topology_id, txid))


def retrying(store: StateStore, topology_id: str, txid: int) -> None:
    """A task of ``txid``'s run runs again (a retry, a clear, a backfill): it no longer failed
    for good, so later commits wait for it again instead of failing fast."""
    with store.db.transaction() as cur:
        lift_failed(store, cur, topology_id, txid)


def planned_runs(store: StateStore, topology_id: str) -> list[tuple[int, str]]:
    """(txid, run key) of every planned, uncommitted txid, lowest first."""
    with store.db.transaction() as cur:
        cur.execute(sql.SQL("SELECT txid, run_key FROM {} WHERE topology_id = %s AND status = 'planned' "
                            "ORDER BY txid").format(store.t("transactions")), (topology_id,))
        return [(int(txid), str(key)) for txid, key in cur.fetchall()]


def first_pending(store: StateStore, topology_id: str, before_txid: int) -> tuple[int, str] | None:
    """(txid, run key) of the lowest uncommitted txid below ``before_txid``: the one that
    every later commit waits for."""
    return next(((t, k) for t, k in planned_runs(store, topology_id) if t < before_txid), None)


def mark_failed(store: StateStore, topology_id: str, txid: int, reason: str) -> None:
    """Record that ``txid`` failed for good (no retries left), so later commits fail fast."""
    with store.db.transaction() as cur:
        cur.execute(sql.SQL("UPDATE {} SET failed_at = clock_timestamp(), failure = %s "
                            "WHERE topology_id = %s AND txid = %s AND status = 'planned'")
                    .format(store.t("transactions")), (reason[:2000], topology_id, txid))


def blocker(store: StateStore, topology_id: str, txid: int) -> str | None:
    """Why the commit of ``txid`` can never happen as things stand, or None.

    The lowest uncommitted earlier txid that failed for good blocks every later commit until
    it is cleared or backfilled (docs/design.md, trap 2: a waiting commit must not hold its slot).
    """
    with store.db.transaction() as cur:
        cur.execute(sql.SQL("SELECT txid, run_key, failure FROM {} WHERE topology_id = %s "
                            "AND txid < %s AND status = 'planned' AND failed_at IS NOT NULL "
                            "ORDER BY txid LIMIT 1").format(store.t("transactions")), (topology_id, txid))
        row = cur.fetchone()
    if row is None:
        return None
    return (f"blocked by failed txid {row[0]} (run {row[1]}): {row[2]}. Clear that run's tasks "
            "or backfill it with 'reprocess failed' (a deleted run: the next run of the DAG takes its "
            "batch over); this run can then be cleared too")
