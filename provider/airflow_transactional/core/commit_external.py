"""The commit of a topology whose states live partly in other databases.

Those states cannot share the commit's Postgres transaction. Their commit first *pins* the
attempt (so no re-plan or newer attempt can change what is applied) -- a correction's, with its
staged rows of those states made the differences from what its range applied, in the same
transaction -- then applies its staged rows there under the per-value txid rule -- idempotent,
so a crash and rerun re-applies the same rows harmlessly -- and then runs
:func:`core.commit.commit`, which moves the checkpoint.
"""

from __future__ import annotations

import io

from psycopg2 import sql

from .. import faults
from ..exceptions import ReplayBehindState
from ..model import CommitResult
from ..store import attempts, transactions
from ..store import state as q
from ..store.rows import scalar
from ..store.statements import query
from . import apply, commit, commit_checks, corrections, registration
from .context import StateStore


def commit_external(store: StateStore, topology_id: str, txid: int, attempt: int | None = None) -> CommitResult:
    """Commit ``txid`` of a topology with states in other databases: pin the attempt, apply it
    there, then run the commit protocol (which applies the states of the store itself)."""
    done = apply_external(store, topology_id, txid, attempt)
    return done if done is not None else commit.commit(store, topology_id, txid, attempt)


def apply_external(store: StateStore, topology_id: str, txid: int, attempt: int | None) -> CommitResult | None:
    """Apply states kept in other databases; the attempt is pinned first so a crash and rerun
    re-applies exactly the same staged rows (idempotent under the per-value txid rule). A result
    when the txid was committed before."""
    with store.db.transaction() as cur:
        num, spec, committed, _o = store.load(cur, topology_id, lock=True)
        done = commit_checks.check_order(store, cur, topology_id, txid, committed)
        if done is not None:
            return done
        txn = store.txn(cur, topology_id, txid, lock=True)
        picked = commit_checks.choose_attempt(store, cur, spec, txn, attempt)
        apply.quarantine_limit(store, cur, spec, txn, picked.attempt, picked.records_read, picked.quarantined)
        commit_checks.verify_staged(store, cur, num, spec, txn, picked.attempt, picked.row_counts)
        chosen = picked.attempt
        if chosen is None:
            return None
        if txn.pinned_attempt is None:  # a correction's differences, once: a rerun finds them staged
            corrected = corrections.differences(store, cur, num, spec, txn, chosen, picked.code, external=True)
            if corrected is not None:
                attempts.recount(cur, store.schema, topology_id, txid, chosen, corrected.row_counts)
        transactions.pin(cur, store.schema, topology_id, txid, chosen)
    faults.point("commit.after_pin")
    for state in spec.states:
        if state.database is None:
            continue
        buf = io.StringIO()
        with store.db.transaction() as cur:
            copy = query("copy_out", select=q.staged_delta(store.staging(num, state), state))
            cur.copy_expert(cur.mogrify(copy, {"txid": txid, "attempt": chosen}).decode(), buf)
        buf.seek(0)
        with store.external_db(state.database).transaction() as ecur:
            registration.ensure_state_table(store, ecur, topology_id, state)
            delta_table = sql.Identifier("txn_delta")
            ecur.execute(q.create_delta_table(delta_table, state))
            ecur.copy_expert(q.copy_into(delta_table, [*state.key_columns, "value"]).as_string(ecur), buf)
            delta = query("select_all", table=delta_table)
            ecur.execute(q.upsert(state, q.state_table(state), delta), {"txid": txid})
            ecur.execute(q.rows_ahead(state, q.state_table(state), delta), {"txid": txid})
            if int(scalar(ecur)):
                raise ReplayBehindState(
                    f"state {state.name!r} in database {state.database!r} holds txids later than "
                    f"{txid}: it was changed outside this topology; rebuild it from the source")
        faults.point("commit.after_external")
    return None
