"""The commit protocol, top to bottom. One function, one Postgres transaction, whatever the kind of
txid -- a **batch** of new records, an **empty** one (a run with nothing new, a withdrawn
correction), a **correction** of committed txids under new code, a **replay** of quarantined
records (each as edited):

1. lock the topology row, and check ``txid == committed_txid + 1`` (a txid already committed is
   a no-op that says so; a later one waits for its predecessor);
2. check the plan starts at the committed checkpoint;
3. choose the latest complete attempt of the current plan (none for an empty txid), verify its
   staged row counts, and refuse a batch quarantined past its limit;
4. apply to every state table under the value rules (``core/apply.py``: a replay behind a stored
   txid is an error, never applied; a key whose sum would leave its type is set aside) what the
   txid staged -- for a correction, the differences from what its txids applied
   (``core/corrections.py``) -- decide its requests (``store/decisions.py``), and append its
   output events to their logs (a correction's retractions and new versions among them);
5. keep the attempt's staged rows as the txid's deltas (the delta history, ``core/history.py``) and
   digest them per state; advance the checkpoint (committed txid and offsets; a Kafka batch's
   unread offsets counted as skipped), mark the transaction and its attempts, settle the
   quarantine -- a batch's bad records; a correction's, moved from the txids it corrected; a
   replay's records, counted by it -- and write the audit row (with what produced the attempt
   and the digests), all with one commit time;
6. drop the staged output events and every other attempt's staged rows.

A crash anywhere leaves all of it or none of it. States kept in another database cannot share
that transaction: their commit first pins the attempt, applies it there under the per-value txid
rule (idempotent), then runs the steps above (``core/commit_external.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

import psycopg2.extensions

from .. import faults
from ..exceptions import StaleAttempt
from ..model import CommitResult, Transaction, same_offsets
from ..spec import TopologySpec
from ..store import attempts, catalog, commits, decisions, topologies, transactions
from ..store import state as q
from . import apply, corrections, effects, history, replays
from .commit_checks import Chosen, check_order, choose_attempt, verify_staged
from .context import StateStore


def commit(store: StateStore, topology_id: str, txid: int, attempt: int | None = None) -> CommitResult:
    """Commit ``txid`` exactly once, strictly after ``txid - 1`` (see the module docstring)."""
    scope = (topology_id, str(txid))  # faults may target one topology or one txid
    with store.db.transaction() as cur:
        faults.point("commit.begin", cur, scope=scope)
        num, spec, committed, offsets = store.load(cur, topology_id, lock=True)
        started = datetime.now().astimezone()
        faults.point("commit.after_lock", cur, scope=scope)
        done = check_order(store, cur, topology_id, txid, committed)  # 1.
        if done is not None:
            return done
        txn = store.txn(cur, topology_id, txid, lock=True)
        if not same_offsets(txn.start_offsets, offsets):  # 2.
            raise StaleAttempt(
                f"topology {topology_id!r}: the plan of txid {txid} starts at {txn.start_offsets} "
                f"but the committed checkpoint is {offsets}; re-plan it (opaque topologies do "
                "this when processing it again)")
        chosen, row_counts, records_read, quarantined, code = choose_attempt(store, cur, spec, txn, attempt)  # 3.
        apply.quarantine_limit(store, cur, spec, txn, chosen, records_read, quarantined)
        out_digests = verify_staged(store, cur, num, spec, txn, chosen, row_counts)
        faults.point("commit.after_verify", cur, scope=scope)
        # 4. A correction applies the differences from what its txids applied, in place of its staged rows.
        corrected = corrections.differences(store, cur, num, spec, txn, chosen, code) if chosen else None
        row_counts = {**row_counts, **(corrected.row_counts if corrected else {})}
        for state in spec.states:
            if state.database is None and chosen is not None and state.name not in spec.decided_states:
                quarantined += apply.state_delta(store, cur, topology_id, state, store.staging(num, state), txid,
                                                 chosen, int(row_counts.get(state.name, 0)))
                faults.point("commit.after_apply", cur, scope=scope)
        decided = effects.decide(store, cur, num, spec, txid, chosen)
        appended = effects.append_outputs(store, cur, num, spec, txid, chosen)
        faults.point("commit.after_append", cur, scope=scope)
        digests = {**history.settle(store, cur, num, spec, txid, chosen), **out_digests}  # 5. the rows stay
        committed_at = catalog.now(cur)  # one time for the commit, wherever it is recorded
        quarantined = _checkpoint(store, cur, spec, txn, Chosen(chosen, row_counts, records_read, quarantined),
                                  corrected, committed_at)
        commits.record(cur, store.schema, topology_id, commits.CommitRecord(
            txid=txid, attempt=chosen or 0, plan_version=txn.plan_version, run_key=txn.run_key,
            start_offsets=txn.start_offsets, end_offsets=txn.end_offsets, records_read=records_read,
            row_counts=row_counts, quarantined=quarantined, committer=store.worker,
            commit_started_at=started, committed_at=committed_at, code=code, digests=digests,
            corrects=dict(txn.corrects) if txn.corrects else None))
        faults.point("commit.after_checkpoint", cur, scope=scope)
        if spec.outputs:  # 6. (a rebuild recomputes states only: appended events stay appended)
            cur.execute(q.delete_staged_txid(store.out_staging(num)), (txid,))
        faults.point("commit.before_commit", cur, scope=scope)
    faults.point("commit.after_commit", scope=scope)
    return CommitResult(topology_id, txid, True, chosen, committed_at, said(spec, txid, chosen, decided, appended))


def _checkpoint(store: StateStore, cur: psycopg2.extensions.cursor, spec: TopologySpec, txn: Transaction,
                chosen: Chosen, corrected: corrections.Corrected | None, committed_at: datetime) -> int:
    """Step 5 but the audit row: advance the checkpoint, mark the txid and its attempts, settle the
    quarantine by the kind of txid; the bad records the txid keeps."""
    topology_id, txid, attempt = txn.topology_id, txn.txid, chosen.attempt
    # A Kafka plan spans offsets, an upper bound of its records: what its commit read fewer were
    # offsets a read_committed reader skips (aborted records, transaction markers).
    fewer = spec.source.reads_fewer_than_planned and attempt and not txn.corrects
    skipped = max(0, txn.planned_records - chosen.records_read) if fewer else 0
    topologies.advance(cur, store.schema, topology_id, txid, txn.end_offsets, committed_at, txn.batch.lost_records,
                       skipped)
    transactions.mark_committed(cur, store.schema, topology_id, txid, committed_at)
    attempts.settle(cur, store.schema, topology_id, txid, attempt)
    for decision in spec.decisions:
        decisions.forget_other_attempts(cur, store.schema, topology_id, decision, txid, attempt)
    commits.settle_quarantine(cur, store.schema, topology_id, txid, attempt)  # a batch's bad records
    if corrected is not None and attempt is not None:  # a correction's: moved from the txids it corrected
        return corrections.settle_quarantine(store, cur, topology_id, txn, attempt, corrected)
    if corrections.kind(txn) == "replay" and attempt is not None:  # a replay's: the records it counted
        return replays.settle(store, cur, topology_id, txn, attempt)
    return chosen.quarantined


def said(spec: TopologySpec, txid: int, chosen: int | None, decided: Mapping[str, tuple[int, int]],
         appended: Mapping[str, int]) -> str:
    """What a commit did, in one line."""
    what = f"attempt {chosen}" if chosen is not None else "empty batch"
    events = "".join(f"; {d}: {g} granted, {n} declined" for d, (g, n) in decided.items())
    events += "".join(f"; appended {n} events to log {spec.output(o).log_name}" for o, n in appended.items())
    return f"committed txid {txid} ({what}) of topology {spec.topology_id}{events}"
