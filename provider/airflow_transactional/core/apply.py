"""Applying one state's staged delta in the commit, under the value rules (``store/state.py``'s
upsert): a replay behind the stored txid is refused, never applied; a key whose committed value
plus the delta would leave the state's type is set aside in the quarantine, with the reason,
instead of failing the commit on every try (:mod:`..limits`). Before any of it, an attempt that set
aside more of its records than the topology allows is refused (:func:`quarantine_limit`)."""

from __future__ import annotations

import json
import logging

import psycopg2.errors
import psycopg2.extensions
from psycopg2 import sql

from .. import limits, quarantine
from ..exceptions import ReplayBehindState
from ..limits import QUARANTINE_RECORD_CHARS
from ..model import Transaction
from ..spec import StateSpec, TopologySpec
from ..store import catalog, commits, history
from ..store import state as q
from ..store.rows import scalar
from .context import StateStore

log = logging.getLogger(__name__)


def state_delta(store: StateStore, cur: psycopg2.extensions.cursor, topology_id: str, state: StateSpec,
           staging: sql.Composed, txid: int, attempt: int, expected: int) -> int:
    """Apply the attempt's staged rows of ``state``; returns how many keys were set aside because
    their committed value plus this txid's delta would leave the state's type (quarantined)."""
    delta = q.staged_delta(staging, state)
    params = {"txid": txid, "attempt": attempt}
    set_aside = 0
    if not q.can_overflow(state):
        cur.execute(q.upsert(state, q.state_table(state), delta), params)
        applied = cur.rowcount
    else:
        # A sum that a batch cannot break alone can still leave the type once added to what is
        # committed: that key's delta is set aside (quarantined), never a commit that fails for ever.
        with catalog.savepoint(cur, "txn_apply") as attempt_whole:
            try:
                cur.execute(q.upsert(state, q.state_table(state), delta), params)
            except psycopg2.errors.NumericValueOutOfRange:
                attempt_whole.rollback()
                set_aside = set_aside_overflows(store, cur, topology_id, state, delta, txid, attempt)
                history.drop_set_aside(cur, state, staging, txid, attempt)  # not applied: not its history
                delta = q.without_overflows(state, delta)
                cur.execute(q.upsert(state, q.state_table(state), delta), params)
            applied = cur.rowcount  # before the savepoint's RELEASE, which sets the cursor's rowcount
    # Every staged key applied: none can be ahead (the join below costs a third of a commit).
    if applied < expected - set_aside:
        cur.execute(q.rows_ahead(state, q.state_table(state), delta), params)
        ahead = int(scalar(cur))
        if ahead:
            raise ReplayBehindState(
                f"state {state.name!r}: {ahead} keys already hold a txid later than {txid}; a replay "
                "behind the state is never applied. The state table was changed outside this "
                "topology (or restored from a later backup): rebuild it from the source")
    return set_aside


def set_aside_overflows(store: StateStore, cur: psycopg2.extensions.cursor, topology_id: str, state: StateSpec,
                         delta: sql.Composed, txid: int, attempt: int) -> int:
    """Quarantine the keys whose committed value plus the delta leaves the state's type; how many."""
    low, high = limits.value_range(state.value_type)
    cur.execute(q.find_overflows(state, delta), {"txid": txid, "attempt": attempt, "low": low, "high": high})
    found = cur.fetchall()
    reason = (f"state {state.name!r}: the committed value plus txid {txid}'s delta for this key leaves "
              f"{state.value_type} ({low:g} to {high:g}); the delta is set aside here, the rest of the txid "
              "commits. Declare value_type='numeric' for sums that large")
    rows = []
    for key, committed, added in found:
        raw = limits.printable(json.dumps({"key": key, "committed": str(committed), "delta": str(added)}))
        rows.append((topology_id, txid, attempt, f"commit:{state.name}", None, reason, raw[:QUARANTINE_RECORD_CHARS],
                     len(raw)))
    commits.insert_quarantined(cur, store.schema, rows)
    log.warning("state %s txid %d: %d keys set aside, their sums would leave %s", state.name, txid, len(rows),
                state.value_type)
    return len(rows)


def quarantine_limit(store: StateStore, cur: psycopg2.extensions.cursor, spec: TopologySpec, txn: Transaction,
                     attempt: int | None, records_read: int, quarantined: int) -> None:
    """Refuse to commit an attempt that set aside more of its records than ``spec.max_quarantined``
    (:mod:`..quarantine`), with its top reasons and the fix. Not judged: an empty batch, a correction or
    a replay (their batches are chosen records), and an attempt a commit already pinned (applied elsewhere)."""
    if attempt is None or txn.corrects or txn.pinned_attempt is not None or \
            not quarantine.over(records_read, quarantined, spec.max_quarantined):
        return
    assert spec.max_quarantined is not None
    reasons = commits.top_reasons(cur, store.schema, txn.topology_id, txn.txid, attempt)
    raise quarantine.refusal(txn.topology_id, txn.txid, attempt, records_read, quarantined, spec.max_quarantined,
                             reasons)
