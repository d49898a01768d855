"""What the Transactions pages of the Airflow UI show, read from the store as JSON-ready dicts:
a topology's summary (phase of each txid in flight, lag, commit rate, what blocks it), its
timeline (recent txids with their plan, attempts and commit), one run's transaction, and the
bad records one txid quarantined."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ..model import FileBatch, planned_batch
from ..spec import TopologySpec
from ..store import verifications, views
from . import status as status_
from .context import StateStore

#: How far back "commits per minute" looks.
RATE_MINUTES = 10


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def phase(in_flight_phase: str, txid: int, committed_txid: int, blocked_by: str | None = None) -> str:
    """An in-flight txid's phase in words: planned, processing, failed, or -- processed -- its commit
    failed for good (it is what blocks the topology: a batch over its quarantine limit), next to
    commit, or waiting for the txid before it."""
    if in_flight_phase != "processed":
        return in_flight_phase
    if blocked_by and blocked_by.startswith(f"blocked by failed txid {txid} "):
        return "staged, its commit failed for good"
    nxt = committed_txid + 1
    return "staged, next to commit" if txid == nxt else f"staged, waiting for txid {nxt}"


def summary(store: StateStore, topology_id: str, *, dag_id: str, now: datetime) -> dict[str, Any]:
    """Where a topology stands: txids in flight and their phase, lag, commit rate, blocker."""
    st = status_.status(store, topology_id)
    with store.db.transaction() as cur:
        rate = views.commit_rate(cur, store.schema, topology_id, RATE_MINUTES)
        checked = verifications.mark(cur, store.schema, topology_id).verified_through
        failed = [c.txid for c in verifications.failures(cur, store.schema, topology_id, 10)]
        verifying = bool(checked or failed) or verifications.any_check(cur, store.schema, topology_id)
    return {
        "topology_id": topology_id,
        "dag_id": dag_id,
        "committed_txid": st.committed_txid,
        "in_flight": [{"txid": f.txid, "run_id": f.run_key, "attempts": f.attempts, "error": f.error,
                       "failed_tries": f.failed_tries, "since": _iso(f.since),
                       "for_seconds": (now - f.since).total_seconds() if f.since else None,
                       "phase": phase(f.phase, f.txid, st.committed_txid, st.blocked_by)} for f in st.in_flight],
        "lag_records": st.lag,
        "lag_unit": st.lag_unit,
        "lag_bytes": st.lag_bytes,
        "lag_seconds": st.lag_seconds,
        "source_error": st.source_error,
        "last_commit_at": _iso(st.last_commit_at),
        "last_commit_age_seconds": (now - st.last_commit_at).total_seconds() if st.last_commit_at else None,
        "commits_per_minute": rate,
        "quarantined": st.quarantined,
        "quarantined_pending": st.quarantined_pending,
        "quarantine_warning": st.quarantine_warning,
        "evolving": st.evolving,  # a state its DAG file adds, redefines or retires; how far its build is
        "lost_records": st.lost_records,
        "offsets_skipped": st.offsets_skipped,
        "blocked_by": st.blocked_by,
        "stalled": st.stalled,
        # The shadow audit's mark and its failed checks (None: no round ever ran).
        "verified_through": checked if verifying else None,
        "verification_failures": failed,
    }


def _attempt(a: views.AttemptRow) -> dict[str, Any]:
    return {"attempt": a.attempt, "plan_version": a.plan_version, "status": a.status,
            "started_at": _iso(a.started_at), "finished_at": _iso(a.finished_at), "records_read": a.records_read,
            "row_counts": a.row_counts or {}, "quarantined": a.quarantined, "worker": a.worker, "error": a.error}


class _Committed:
    """What the commits of some txids did beyond their staged rows: the events each appended per
    output, the requests each granted and declined per decision (staged counts say neither: a
    decision's output stages an event for each verdict a request could get)."""

    def __init__(self, cur: Any, store: StateStore, topology_id: str, txids: list[int]) -> None:
        self.appended = views.appended(cur, store.schema, topology_id, txids)
        self.decided = views.verdict_counts(cur, store.schema, topology_id, txids)

    def of(self, t: views.TxnRow, states: list[str], outputs: list[str],
           decisions: list[str]) -> dict[str, Any] | None:
        if t.committed_at is None:
            return None
        staged = t.row_counts or {}
        appended, decided = self.appended.get(t.txid, {}), self.decided.get(t.txid, {})
        return {"rows": {s: int(staged.get(s, 0)) for s in states},
                "appended": {o: appended.get(o, 0) for o in outputs},
                "decided": {d: dict(zip(("granted", "declined"), decided.get(d, (0, 0)), strict=True))
                            for d in decisions}}


def _files(stored: Any) -> tuple[Any, ...]:
    """The files a stored batch planned (a landing directory's; none for another source)."""
    batch = planned_batch(stored if isinstance(stored, dict) else None)
    return batch.files if isinstance(batch, FileBatch) else ()


def _transaction(t: views.TxnRow, attempts: list[views.AttemptRow],
                 committed: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"txid": t.txid, "run_id": t.run_key, "status": t.status, "planned_at": _iso(t.planned_at),
            "planned_records": t.planned_records, "start_offsets": t.start_offsets, "end_offsets": t.end_offsets,
            "files": [f.get("path") for f in _files(t.batch)], "corrects": t.corrects,
            "failure": t.failure, "failed_tries": t.failed_tries, "last_try_failure": t.last_try_failure,
            "attempts": [_attempt(a) for a in attempts if a.txid == t.txid],
            "commit": None if t.committed_at is None else {
                "attempt": t.committed_attempt, "started_at": _iso(t.commit_started_at),
                "committed_at": _iso(t.committed_at), "records_read": t.records_read,
                "row_counts": t.row_counts or {}, "quarantined": t.quarantined, "code": t.code or {},
                "digests": t.digests or {}, **(committed or {}),
                "check": {"status": t.check_status or "pending", "detail": t.check_detail or {}}}}


def timeline(store: StateStore, topology_id: str, limit: int = 30) -> list[dict[str, Any]]:
    """The ``limit`` latest txids, latest first, each with its attempts and commit."""
    with store.db.transaction() as cur:
        spec = store.load(cur, topology_id).spec  # an unknown topology says so
        txns = views.recent(cur, store.schema, topology_id, limit)
        attempts = views.attempts(cur, store.schema, topology_id, [t.txid for t in txns])
        committed = _Committed(cur, store, topology_id, [t.txid for t in txns if t.committed_at is not None])
    names = _names(spec)
    return [_transaction(t, attempts, committed.of(t, *names)) for t in txns]


def _names(spec: TopologySpec) -> tuple[list[str], list[str], list[str]]:
    """(states a commit writes rows of, outputs, decisions) of a declaration: a state only a decision
    updates stages no rows -- its commits are told by the decision's grants, never as '0 rows'."""
    return ([s.name for s in spec.states if s.name not in spec.decided_states], [o.name for o in spec.outputs],
            [d.name for d in spec.decisions])


def run(store: StateStore, topology_id: str, run_key: str) -> dict[str, Any] | None:
    """The transaction of one run (None: the run has no txid), with the reasons its records were
    quarantined for, and how many of each."""
    with store.db.transaction() as cur:
        t = views.of_run(cur, store.schema, topology_id, run_key)
        if t is None:
            return None
        spec = store.load(cur, topology_id).spec
        attempts = views.attempts(cur, store.schema, topology_id, [t.txid])
        reasons = views.quarantine_reasons(cur, store.schema, topology_id, t.txid)
        verifying = verifications.any_check(cur, store.schema, topology_id)
        committed = _Committed(cur, store, topology_id, [t.txid] if t.committed_at is not None else [])
    out = _transaction(t, attempts, committed.of(t, *_names(spec)))
    out["quarantine_reasons"] = [{"reason": r.reason, "records": r.records} for r in reasons]
    out["verifying"] = verifying  # the shadow audit ran: its check of this txid is worth showing
    return out


def quarantined(store: StateStore, topology_id: str, txid: int, *, reason: str | None = None, limit: int = 100,
                offset: int = 0) -> list[dict[str, Any]]:
    """The bad records the attempts of ``txid`` found, optionally of one reason."""
    with store.db.transaction() as cur:
        rows = views.quarantined(cur, store.schema, topology_id, txid, reason=reason, limit=limit, offset=offset)
    return [r._asdict() for r in rows]
