"""Planning (Storm's coordinator): give a run its txid and fix its batch as exact source offsets,
once; re-plan an opaque topology's batches when retention removed records; hand a deleted run's
txid to the next run."""

from __future__ import annotations

import logging
from dataclasses import replace

from ..exceptions import (
    ConfigError,
    TooManyInFlight,
)
from ..model import PlannedBatch, Transaction, same_offsets
from ..sources.base import BatchPlan
from ..store import attempts, transactions
from .context import StateStore

log = logging.getLogger(__name__)

#: The longest run key (an Airflow run id: Airflow's own column holds 250 characters).
MAX_RUN_KEY = 250


def plan(store: StateStore, topology_id: str, run_key: str) -> Transaction:
    """The transaction of ``run_key``: planned now if new, else the stored one, unchanged."""
    if not isinstance(run_key, str) or not run_key or "\x00" in run_key or len(run_key) > MAX_RUN_KEY:
        raise ConfigError(f"run key must be non-empty text of at most {MAX_RUN_KEY} characters without NUL bytes "
                          f"(an Airflow run id), got {run_key[:80] if isinstance(run_key, str) else run_key!r}")
    with store.db.transaction() as cur:
        _num, spec, committed, offsets = store.load(cur, topology_id, lock=True)
        known = transactions.txid_of_run(cur, store.schema, topology_id, run_key)
        if known is not None:
            # Planning a run again (a clear, a backfill) means someone is retrying it.
            transactions.lift_failed(cur, store.schema, topology_id, known)
            return store.txn(cur, topology_id, known)
        in_flight = [p.txid for p in transactions.planned(cur, store.schema, topology_id)]
        if len(in_flight) >= spec.max_in_flight:
            raise TooManyInFlight(topology_id, in_flight, spec.max_in_flight)
        last = transactions.last(cur, store.schema, topology_id)
        txid, start = (last.txid + 1, dict(last.end_offsets)) if last else (committed + 1, offsets)
        bp = spec.source.plan(cur, store.schema, topology_id, start, spec.max_batch_size,
                              skip_unavailable=spec.opaque)
        batch = _stored_batch(bp)
        if bp.lost_records:
            log.warning("topology %s txid %d: %d records the source lost before they were read were skipped (%s)",
                        topology_id, txid, bp.lost_records, "; ".join(bp.lost_detail))
        transactions.insert(cur, store.schema, topology_id, txid, run_key, bp.start, bp.end, batch,
                            bp.planned_records)
        log.info("topology %s: planned txid %d for run %s (%d records)", topology_id, txid,
                 run_key, bp.planned_records)
        return store.txn(cur, topology_id, txid)


def transaction(store: StateStore, topology_id: str, txid: int) -> Transaction:
    """The transaction ``txid`` of a topology."""
    with store.db.transaction() as cur:
        return store.txn(cur, topology_id, txid)


def transaction_for_run(store: StateStore, topology_id: str, run_key: str) -> Transaction | None:
    """The transaction a run planned (by its run key), or None."""
    with store.db.transaction() as cur:
        txid = transactions.txid_of_run(cur, store.schema, topology_id, run_key)
        return None if txid is None else store.txn(cur, topology_id, txid)


def replan(store: StateStore, topology_id: str, from_txid: int, reason: str) -> list[int]:
    """Re-plan ``from_txid`` and every later uncommitted txid from the committed checkpoint.

    Storm's rule for opaque sources: when a batch changes, every later batch in flight is
    re-planned too, or records could be skipped or counted twice. Each re-plan is bounded by
    the txid's old end, so it only drops what retention removed; a txid whose batch comes out
    the same keeps its plan version (its staged output stays usable), and only txids the loss
    reaches must be processed again. Returns the txids whose plan changed.
    """
    changed: list[int] = []
    with store.db.transaction() as cur:
        _num, spec, committed, offsets = store.load(cur, topology_id, lock=True)
        if from_txid <= committed:
            return []
        txns = transactions.uncommitted_from(cur, store.schema, topology_id, committed + 1)
        prev_end = offsets
        for t in txns:
            if t.txid < from_txid or t.pinned_attempt is not None or t.corrects:  # a correction reads no new records
                prev_end = t.end_offsets
                continue
            # Bounded by the old end: a re-plan drops what is gone and keeps the boundary, so
            # later txids (and their staged output) stay valid unless the loss reaches them.
            bp = spec.source.plan(cur, store.schema, topology_id, prev_end, spec.max_batch_size,
                                  skip_unavailable=True, until=t.end_offsets)
            batch = _stored_batch(bp)
            if same_offsets(bp.start, t.start_offsets) and same_offsets(bp.end, t.end_offsets) \
                    and batch == t.batch:
                prev_end = t.end_offsets
                continue
            transactions.replace_plan(cur, store.schema, topology_id, t.txid, bp.start, bp.end, batch,
                                      bp.planned_records, reason)
            attempts.discard_replanned(cur, store.schema, topology_id, t.txid, reason)
            changed.append(t.txid)
            prev_end = bp.end
    if changed:
        log.warning("topology %s: re-planned txids %s (%s)", topology_id, changed, reason)
    return changed


def adopt(store: StateStore, topology_id: str, txid: int, old_run_key: str, new_run_key: str) -> Transaction | None:
    """Hand the planned, uncommitted ``txid`` of ``old_run_key`` (a run that no longer exists)
    to ``new_run_key``: same place in the order, same batch, plan and staged attempts.

    None when another run took it first or ``new_run_key`` already has a txid. Lifts the
    failed mark: the new run is its retry.
    """
    with store.db.transaction() as cur:
        store.load(cur, topology_id, lock=True)  # one at a time with plan()
        if transactions.txid_of_run(cur, store.schema, topology_id, new_run_key) is not None:
            return None
        if not transactions.hand_over(cur, store.schema, topology_id, txid, old_run_key, new_run_key):
            return None
        log.warning("topology %s: txid %d of run %s (gone) handed to run %s", topology_id, txid,
                    old_run_key, new_run_key)
        return store.txn(cur, topology_id, txid)


def _stored_batch(bp: BatchPlan) -> PlannedBatch:
    """The batch as stored in the plan, with what retention removed from it, if anything."""
    if not bp.lost_records:
        return bp.batch
    return replace(bp.batch, lost={"records": bp.lost_records, "detail": bp.lost_detail, "ranges": bp.lost_ranges})
