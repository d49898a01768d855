"""The commit protocol, top to bottom. One function, one Postgres transaction:

1. lock the topology row, and check ``txid == committed_txid + 1`` (a txid already committed is
   a no-op that says so; a later one waits for its predecessor);
2. check the plan starts at the committed checkpoint;
3. choose the latest complete attempt of the current plan and verify its staged row counts;
4. apply its staged rows to every state table under the value rules (``core/apply.py``: a replay
   behind a stored txid is an error, never applied; a key whose sum would leave its type is set
   aside), decide its requests (``store/decisions.py``), and append its output events to their logs;
5. keep the attempt's staged rows as the txid's deltas (the delta history, ``core/history.py``) and
   digest them per state; advance the checkpoint (committed txid and offsets), mark the transaction
   and its attempts, settle the quarantine, write the audit row (with what produced the attempt and
   the digests) -- all with one commit time;
6. drop the staged output events and every other attempt's staged rows.

A crash anywhere leaves all of it or none of it. States kept in another database cannot share
that transaction: their commit first pins the attempt, applies it there under the per-value txid
rule (idempotent), then runs the steps above (``core/commit_external.py``)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime
from typing import NamedTuple

import psycopg2.errors
import psycopg2.extensions

from .. import faults, provenance
from ..exceptions import (
    NotProcessed,
    SourceChanged,
    StagedOutputIncomplete,
    StaleAttempt,
    WaitingForPredecessor,
)
from ..model import CommitResult, Transaction, same_offsets
from ..spec import TopologySpec
from ..store import attempts, catalog, commits, decisions, outputs, topologies, transactions
from ..store import state as q
from ..store.history import EMPTY_DIGEST
from ..store.rows import scalar
from . import apply, corrections, effects, history, replays
from .context import StateStore

log = logging.getLogger(__name__)


class Chosen(NamedTuple):
    """The attempt a commit applies (None: an empty batch), what it staged and read, and its code."""

    attempt: int | None
    row_counts: dict[str, int]
    records_read: int
    quarantined: int
    code: dict[str, str] | None = None


def commit(store: StateStore, topology_id: str, txid: int, attempt: int | None = None) -> CommitResult:
    """Commit ``txid`` exactly once, strictly after ``txid - 1`` (see the module docstring)."""
    scope = (topology_id, str(txid))  # faults may target one topology or one txid
    with store.db.transaction() as cur:
        faults.point("commit.begin", cur, scope=scope)
        num, spec, committed, offsets = store.load(cur, topology_id, lock=True)
        started = datetime.now().astimezone()
        faults.point("commit.after_lock", cur, scope=scope)
        done = check_order(store, cur, topology_id, txid, committed)
        if done is not None:
            return done
        txn = store.txn(cur, topology_id, txid, lock=True)
        if not same_offsets(txn.start_offsets, offsets):
            raise StaleAttempt(
                f"topology {topology_id!r}: the plan of txid {txid} starts at {txn.start_offsets} "
                f"but the committed checkpoint is {offsets}; re-plan it (opaque topologies do "
                "this when processing it again)")
        chosen, row_counts, records_read, quarantined, code = choose_attempt(store, cur, spec, txn, attempt)
        apply.quarantine_limit(store, cur, spec, txn, chosen, records_read, quarantined)
        out_digests = verify_staged(store, cur, num, spec, txn, chosen, row_counts)
        faults.point("commit.after_verify", cur, scope=scope)
        # A correction applies the differences from what its txids applied: they replace its staged rows.
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
        digests = {**history.settle(store, cur, num, spec, txid, chosen), **out_digests}  # rows stay: the history
        lost = txn.batch.lost_records
        # A Kafka plan spans offsets, an upper bound of its records: what its commit read fewer
        # were offsets a read_committed reader skips (aborted records, transaction markers).
        fewer = spec.source.reads_fewer_than_planned and chosen and not txn.corrects
        skipped = max(0, txn.planned_records - records_read) if fewer else 0
        committed_at = catalog.now(cur)  # one time for the commit, wherever it is recorded
        topologies.advance(cur, store.schema, topology_id, txid, txn.end_offsets, committed_at, lost, skipped)
        transactions.mark_committed(cur, store.schema, topology_id, txid, committed_at)
        attempts.settle(cur, store.schema, topology_id, txid, chosen)
        for decision in spec.decisions:
            decisions.forget_other_attempts(cur, store.schema, topology_id, decision, txid, chosen)
        commits.settle_quarantine(cur, store.schema, topology_id, txid, chosen)
        if corrected is not None and chosen is not None:
            quarantined = corrections.settle_quarantine(store, cur, topology_id, txn, chosen, corrected)
        elif corrections.kind(txn) == "replay" and chosen is not None:
            quarantined = replays.settle(store, cur, topology_id, txn, chosen)
        commits.record(cur, store.schema, topology_id, commits.CommitRecord(
            txid=txid, attempt=chosen or 0, plan_version=txn.plan_version, run_key=txn.run_key,
            start_offsets=txn.start_offsets, end_offsets=txn.end_offsets, records_read=records_read,
            row_counts=row_counts, quarantined=quarantined, committer=store.worker,
            commit_started_at=started, committed_at=committed_at, code=code, digests=digests,
            corrects=dict(txn.corrects) if txn.corrects else None))
        faults.point("commit.after_checkpoint", cur, scope=scope)
        if spec.outputs:  # a rebuild recomputes states only: appended events stay appended
            cur.execute(q.delete_staged_txid(store.out_staging(num)), (txid,))
        faults.point("commit.before_commit", cur, scope=scope)
    faults.point("commit.after_commit", scope=scope)
    return CommitResult(topology_id, txid, True, chosen, committed_at, said(spec, txid, chosen, decided, appended))


def said(spec: TopologySpec, txid: int, chosen: int | None, decided: Mapping[str, tuple[int, int]],
         appended: Mapping[str, int]) -> str:
    """What a commit did, in one line."""
    what = f"attempt {chosen}" if chosen is not None else "empty batch"
    events = "".join(f"; {d}: {g} granted, {n} declined" for d, (g, n) in decided.items())
    events += "".join(f"; appended {n} events to log {spec.output(o).log_name}" for o, n in appended.items())
    return f"committed txid {txid} ({what}) of topology {spec.topology_id}{events}"


def check_order(store: StateStore, cur: psycopg2.extensions.cursor, topology_id: str, txid: int,
                 committed: int) -> CommitResult | None:
    """A no-op result when ``txid`` is already committed; an error when it must wait."""
    if txid <= committed:
        row = commits.get(cur, store.schema, topology_id, txid)
        at, attempt = (row.committed_at, row.attempt) if row else (None, None)
        msg = (f"txid {txid} already committed at {at.isoformat() if at else 'an earlier time'}"
               f"{f' (attempt {attempt})' if attempt is not None else ''}; nothing to do")
        return CommitResult(topology_id, txid, False, attempt, at, msg)
    if txid > committed + 1:
        raise WaitingForPredecessor(topology_id, txid, committed)
    return None


def choose_attempt(store: StateStore, cur: psycopg2.extensions.cursor, spec: TopologySpec, txn: Transaction,
                   requested: int | None) -> Chosen:
    """The attempt to commit and what it staged, or NotProcessed (an empty batch: its committer's code)."""
    if txn.pinned_attempt is not None:
        # A commit that began applying states elsewhere must finish with the same attempt.
        row = attempts.outcome(cur, store.schema, txn.topology_id, txn.txid, txn.pinned_attempt)
    else:
        row = attempts.latest_outcome(cur, store.schema, txn.topology_id, txn.txid, txn.plan_version)
        if row is None:
            if txn.empty and requested is None:
                return Chosen(None, {}, 0, 0, provenance.code(spec.to_config()))
            raise NotProcessed(
                f"topology {txn.topology_id!r} txid {txn.txid} has no complete processing attempt of "
                f"its current plan (version {txn.plan_version}): run its processing task, then commit")
        if requested is not None and requested != row.attempt:
            raise StaleAttempt(
                f"txid {txn.txid}: attempt {requested} is not the latest complete attempt of the "
                f"current plan (that is attempt {row.attempt}); only the latest can be committed")
    assert row is not None, txn
    return Chosen(int(row.attempt), dict(row.row_counts or {}), int(row.records_read or 0),
                  int(row.quarantined or 0), row.code)


def verify_staged(store: StateStore, cur: psycopg2.extensions.cursor, num: int, spec: TopologySpec,
                   txn: Transaction, attempt: int | None, row_counts: Mapping[str, int]) -> dict[str, str]:
    """Refuse a commit whose staged rows are not what the attempt reported staging, or whose
    attempt read other records than its plan's first (a transactional topology's batch is fixed);
    the digest of each output's staged events (before the commit resolves and appends them)."""
    if attempt is None:
        return {}
    differs = None if spec.opaque else attempts.digest_differs(cur, store.schema, txn.topology_id, txn.txid, attempt)
    if differs is not None:
        raise SourceChanged(f"topology {txn.topology_id!r} txid {txn.txid}: attempt {attempt} read other records "
                            f"({differs.attempt_digest}) than its plan's first attempt ({differs.plan_digest}); the "
                            "source changed under the plan: process the txid again, or declare the topology opaque")
    found: dict[str, tuple[str, int]] = {}
    for state in spec.states:
        cur.execute(q.count_staged(store.staging(num, state)), (txn.txid, attempt))
        found[state.name] = (f"state {state.name!r} has {{}} staged rows", int(scalar(cur)))
    for d in spec.decisions:
        n = decisions.staged_count(cur, store.schema, txn.topology_id, d, store.decision_staging(num, d), txn.txid,
                                   attempt)
        found[d.name] = (f"decision {d.name!r} has {{}} staged requests", n)
    events = outputs.staged_counts(cur, store.out_staging(num), txn.txid, attempt) if spec.outputs else {}
    found.update({o.name: (f"output {o.name!r} has {{}} staged events", events.get(o.name, (0, ""))[0])
                  for o in spec.outputs})
    for name, (what, n) in found.items():
        expected = int(row_counts.get(name, 0))
        if n != expected:
            raise StagedOutputIncomplete(
                f"topology {txn.topology_id!r} txid {txn.txid} attempt {attempt}: {what.format(n)}, the "
                f"attempt reported {expected}; the staged output is damaged: process the txid again (a new "
                "attempt), then commit")
    return {outputs.DIGEST_PREFIX + o.name: events.get(o.name, (0, EMPTY_DIGEST))[1] for o in spec.outputs}
