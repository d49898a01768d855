"""Liveness: which earlier txid blocks a commit for good, so waiting tasks fail fast and free their
``max_active_runs`` slots (docs/design.md, trap 2) instead of waiting for ever."""

from __future__ import annotations

import logging
from datetime import datetime

from ..model import PlannedRun, TopologyStatus, duration, one_line
from ..store import transactions
from .context import StateStore

log = logging.getLogger(__name__)


def lift_failed(store: StateStore, topology_id: str, txid: int) -> None:
    """A task of ``txid``'s run runs again (a retry, a clear, a backfill): it no longer failed
    for good, so later commits wait for it again instead of failing fast."""
    with store.db.transaction() as cur:
        transactions.lift_failed(cur, store.schema, topology_id, txid)


def planned_runs(store: StateStore, topology_id: str) -> list[PlannedRun]:
    """(txid, run key) of every planned, uncommitted txid, lowest first."""
    with store.db.transaction() as cur:
        return transactions.planned(cur, store.schema, topology_id)


def first_pending(store: StateStore, topology_id: str, before_txid: int) -> PlannedRun | None:
    """(txid, run key) of the lowest uncommitted txid below ``before_txid``: the one that
    every later commit waits for."""
    return next((p for p in planned_runs(store, topology_id) if p.txid < before_txid), None)


def mark_failed(store: StateStore, topology_id: str, txid: int, reason: str) -> None:
    """Record that ``txid`` failed for good (no retries left), so later commits fail fast."""
    with store.db.transaction() as cur:
        transactions.mark_failed(cur, store.schema, topology_id, txid, reason)


def note_failed_try(store: StateStore, topology_id: str, txid: int, reason: str) -> None:
    """A try of ``txid``'s processing failed (Airflow may retry it): counted, with its reason, so
    the status says "failed" even when the driver died before registering an attempt."""
    with store.db.transaction() as cur:
        transactions.note_failed_try(cur, store.schema, topology_id, txid, reason)


def blocker(store: StateStore, topology_id: str, txid: int) -> str | None:
    """Why the commit of ``txid`` can never happen as things stand, or None.

    The lowest uncommitted earlier txid that failed for good blocks every later commit until
    it is cleared or backfilled (docs/design.md, trap 2: a waiting commit must not hold its slot).
    """
    with store.db.transaction() as cur:
        failed = transactions.first_failed_before(cur, store.schema, topology_id, txid)
    if failed is None:
        return None
    # What the attempt itself recorded says more than what the task saw of it (a task killed after
    # its job failed, an Airflow run failed "without recording why").
    why = (f"attempt {failed.attempt} failed: {one_line(failed.attempt_error)}" if failed.attempt_error
           else failed.failure)
    return (f"blocked by failed txid {failed.txid} (run {failed.run_key}): {why}. Clear that run's tasks "
            "or backfill it with 'reprocess failed' (a deleted run: the next run of the DAG takes its "
            "batch over); this run can then be cleared too")


def last_error(store: StateStore, topology_id: str, txid: int) -> str | None:
    """How the latest attempt of ``txid`` failed, in one line -- else how its process task's last
    failed try did (a driver killed before registering an attempt); None: nothing recorded."""
    with store.db.transaction() as cur:
        found = transactions.last_attempt_error(cur, store.schema, topology_id, txid)
        tried = None if found is not None else transactions.last_try_failure(cur, store.schema, topology_id, txid)
    if found is not None:
        return f"attempt {found[0]} failed: {one_line(found[1])}"
    return None if tried is None else one_line(tried)


def stalled(status: TopologyStatus, stall_after: float | None, now: datetime) -> str | None:
    """The stall rule: no commit for ``stall_after`` seconds while the source holds records (or
    cannot say whether it does), said with what the next txid is doing (or that no run planned it);
    None when not stalled."""
    nxt = next((f for f in status.in_flight if f.txid == status.committed_txid + 1), None)
    since = status.last_commit_at or (nxt.since if nxt else None)
    unknown = status.source_error is not None  # a source out of reach may hold anything: it counts
    if not stall_after or (status.lag <= 0 and not unknown) or since is None or \
            (now - since).total_seconds() < stall_after:
        return None
    waited = duration((now - since).total_seconds())
    quiet = (f"no commit for {waited}" if status.last_commit_at
             else f"no commit since txid {status.committed_txid + 1} was planned {waited} ago")
    holds = (f"the source's lag is unknown ({status.source_error})" if unknown
             else f"the source holds {status.lag:,} records")
    head = f"stalled: {quiet} (stall_after {duration(stall_after)}) while {holds}"
    if nxt is None:
        return (f"{head}; no run has planned txid {status.committed_txid + 1}: is the DAG paused, or are its "
                "runs queued behind max_active_runs?")
    for_ = f" for {duration((now - nxt.since).total_seconds())}" if nxt.since else ""
    if nxt.phase == "planned":
        return (f"{head}; txid {nxt.txid} planned{for_}, its process task not started (waiting for a pool slot, "
                "a worker or the scheduler)")
    return f"{head}; txid {nxt.txid} {nxt.phase}{for_}"
