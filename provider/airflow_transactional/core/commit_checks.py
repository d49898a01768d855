"""What a commit checks before it applies anything (``core/commit.py``, steps 1 to 3): that the
txid's turn has come, which attempt it commits, and that the attempt's staged rows are what it
reported staging. The commit in another database (``core/commit_external.py``) checks the same."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import psycopg2.extensions

from .. import provenance
from ..exceptions import NotProcessed, SourceChanged, StagedOutputIncomplete, StaleAttempt, WaitingForPredecessor
from ..model import CommitResult, Transaction
from ..spec import TopologySpec, version_name
from ..store import attempts, commits, decisions, outputs
from ..store import state as q
from ..store.history import EMPTY_DIGEST
from ..store.rows import scalar
from .context import StateStore


class Chosen(NamedTuple):
    """The attempt a commit applies (None: an empty batch), what it staged and read, and its code."""

    attempt: int | None
    row_counts: dict[str, int]
    records_read: int
    quarantined: int
    code: dict[str, str] | None = None


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
    unstaged = [name for name in spec.built if name not in row_counts]
    # An attempt that staged a new version beside the live one began before it was switched in: under
    # the state's name it staged the version since archived.
    unstaged += [s.name for s in spec.states if s.version > 1 and version_name(s.name, s.version) in row_counts]
    if unstaged:  # an attempt that began before these states were switched in: it never folded them
        raise StaleAttempt(f"topology {txn.topology_id!r} txid {txn.txid}: attempt {attempt} did not stage states "
                           f"{unstaged}, switched in after it began; process the txid again (a new attempt), "
                           "then commit")
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
