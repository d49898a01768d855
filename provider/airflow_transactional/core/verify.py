"""The shadow audit: committed txids checked continuously, and the mark ``verified_through``.

A round (:func:`verifying`) takes the committed txids after the mark that were not checked yet, in
order, and settles at once those it need not recompute: an empty batch (verified), one not sampled
(``every``: 1 in k, but never a txid that was retried, cleared, corrected or is a correction or a
replay -- those are always checked), one whose input the source no longer holds or whose code is
no longer the code deployed (unverifiable, saying which -- looked at again each round, until a
correction of its range is committed, which supersedes it: it passes once that correction is
verified -- or its code is deployed again). The others, up to ``budget``, the caller recomputes
with the topology's own code -- the Spark job's ``--verify`` or the pure-Python
``processing.verify`` -- staging each under attempt :data:`~..store.verifications.ATTEMPT` in the
round's own tables (``vfy_*``: with an auditor role, only it writes them, its verdicts and the mark),
and :func:`judge` compares: the recomputed deltas' digest per state and events'
digest per output against the commit's (a correction: its range's states recomputed against what
the range and its corrections applied, as its commit computed them), its bad records against the
commit's, what it read against what the txid read. A round also checks that every state still
adds up to its delta history (a state row written outside the commits is found then, named by
state and key).

The mark moves over the contiguous run of passing txids (verified, skipped, superseded by a verified
correction) and stops at the first pending, failed or unverifiable one: a failure holds it until the
txid is checked again (``airflow-txn verify --recheck``). A txid once verified stays so when the
source's retention removes its input later; a whole-history audit then starts from the mark
(:func:`.audit_base.audit_base`). One round at a time per topology (a turn); a round killed halfway leaves its
txids pending, and the next clears what it had staged.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, NamedTuple

import psycopg2.extensions
from psycopg2 import sql

from .. import faults
from ..exceptions import ConfigError
from ..model import PlannedBatch, planned_batch
from ..spec import TopologySpec
from ..store import corrections as cq
from ..store import history as h
from ..store import outputs as out_q
from ..store import state as q
from ..store import turns
from ..store import verifications as v
from . import reread
from .context import StateStore
from .corrections import SAME_CODE, old_txids

#: How many differing keys a failed check names per state.
SAMPLES = 10
#: How many unchecked txids one round looks at, at most (those it settles without recomputing too).
SCAN = 1000
#: How long a round waits for the round of the topology running before it (seconds).
TURN_WAIT = 600.0


class Task(NamedTuple):
    """A committed txid to recompute: its batch (a correction's: the range it corrects, merged)."""

    txid: int
    kind: str  # "batch" (new records, or a replay's), "range" (a correction of txids first..last)
    batch: PlannedBatch
    attempt: int  # the attempt it committed
    first: int = 0
    last: int = 0
    records: int = 0  # the records it read (the range's, a correction's)


class Round(NamedTuple):
    """What a round recomputes, what it settled at once (txid -> status; the committed txid
    ``failed`` when a state did not add up to its history), and the mark when it began."""

    topology_id: str
    tasks: list[Task]
    settled: dict[int, str]
    mark: int
    busy: bool = False  # another round of the topology was running: this one does nothing


@contextmanager
def verifying(store: StateStore, topology_id: str, *, budget: int = 10, every: int = 1,
              code: Mapping[str, Any] | None = None, drift: bool = True, wait: float = TURN_WAIT) -> Iterator[Round]:
    """A round of the shadow audit (see the module docstring), holding the topology's verification
    turn until it ends -- after the round running, if one is (``wait`` seconds at most: then a
    round that does nothing, ``busy``). ``code``: the code record of what will recompute
    (:mod:`..provenance`)."""
    if budget < 1 or every < 1:
        raise ConfigError(f"a verification round recomputes at least one txid, 1 in at least 1: got budget "
                          f"{budget}, every {every}")
    turn = _take_turn(store, topology_id, wait)
    if turn is None:
        yield Round(topology_id, [], {}, mark(store, topology_id), busy=True)
        return
    try:
        yield _plan(store, topology_id, budget, every, code, drift)
    finally:
        turn.release()


def triage(store: StateStore, topology_id: str, *, budget: int = 10, every: int = 1, lag: int = 0,
           wait: float = TURN_WAIT) -> dict[str, Any]:
    """A round's first half, before any job starts: the txids it need not recompute settled (empty,
    not sampled, input gone), and what is left to recompute -- ``{"busy": bool, "recompute": [txid,
    ...], "records": their planned records, "batch": their batches merged (what sizes the job),
    "waiting": how many are left for a later round}`` -- none to recompute while no more than
    ``lag`` wait. None: the add-up check of the states is made here, and no job is needed. (A txid
    committed under other code than the deployed is left to the job: only the job knows its code.)"""
    if not 0 <= lag < budget:
        raise ConfigError(f"a round may leave 0 to {budget - 1} txids to recompute to a later one (below its "
                          f"{budget}), got {lag}")
    with verifying(store, topology_id, budget=budget, every=every, drift=False, wait=wait) as rnd:
        tasks = rnd.tasks if len(rnd.tasks) > lag else []
        if not tasks and not rnd.busy:
            with store.db.transaction() as cur:
                num, spec, committed, _o = store.load(cur, topology_id)
                _drifted(store, cur, num, spec, committed)
    batches = [t.batch for t in tasks]
    return {"busy": rnd.busy, "recompute": [t.txid for t in tasks], "records": sum(t.records for t in tasks),
            "batch": reread.merged_batch(batches) if batches and all(type(b) is type(batches[0]) for b in batches)
            else PlannedBatch(), "waiting": len(rnd.tasks) - len(tasks)}


def _take_turn(store: StateStore, topology_id: str, wait: float) -> turns.Held | None:
    deadline = time.monotonic() + wait
    while True:
        held = turns.hold(store.db.dsn, store.schema, f"verify:{topology_id}")
        if held is not None or time.monotonic() >= deadline:
            return held
        time.sleep(1.0)


def mark(store: StateStore, topology_id: str) -> int:
    with store.db.transaction() as cur:
        return v.mark(cur, store.schema, topology_id).verified_through


def _plan(store: StateStore, topology_id: str, budget: int, every: int, code: Mapping[str, Any] | None,
          drift: bool) -> Round:
    tasks: list[Task] = []
    settled: dict[int, str] = {}
    with store.db.transaction() as cur:
        num, spec, committed, _o = store.load(cur, topology_id)
        if drift:  # first: a rewritten history steps the mark back
            settled.update(dict.fromkeys(_drifted(store, cur, num, spec, committed), "failed"))
        at = v.mark(cur, store.schema, topology_id).verified_through
        for c in v.candidates(cur, store.schema, topology_id, at, SCAN):
            if len(tasks) >= budget:
                break
            task, status, detail = _triage(store, cur, spec, c, every, code)
            if task is not None:
                for table in [store.verify_staging(num, s) for s in spec.recomputable_states] + (
                        [store.out_verify(num)] if spec.outputs else []):  # what a round killed halfway staged
                    v.clear(cur, table, c.txid)
                tasks.append(task)
            else:
                v.record(cur, store.schema, topology_id, c.txid, status, detail)
                settled[c.txid] = status
        v.advance(cur, store.schema, topology_id, at)
    return Round(topology_id, tasks, settled, at)


def _triage(store: StateStore, cur: psycopg2.extensions.cursor, spec: TopologySpec, c: v.Candidate, every: int,
            code: Mapping[str, Any] | None) -> tuple[Task | None, str, dict[str, Any]]:
    """A txid to recompute, or its status and detail settled without recomputing it."""
    topology_id = spec.topology_id
    if c.attempt == 0 or c.planned_records == 0:
        return None, "verified", {"empty": True}
    if not spec.recomputable_states:
        return None, "unverifiable", {"reason": "its states are all decided at commit: nothing to recompute"}
    def covered() -> int | None:  # a query: asked only when sampling or another code needs it
        return v.covering(cur, store.schema, topology_id, c.txid)

    if every > 1 and c.txid % every and not (c.attempts > 1 or c.corrects or covered() is not None):
        return None, "skipped", {"every": every}
    if c.digests is None:
        return None, "unverifiable", {"reason": "committed before digests were recorded"}
    if code is not None and _code(c.code) != _code(code):
        detail = {"reason": "committed under other code than the code checking it", "committed": c.code,
                  "now": dict(code)}
        by = covered()
        if by is not None and by != c.txid:
            return None, "superseded", {**detail, "by": by}
        return None, "unverifiable", {**detail, "waiting": "a correction of it, or its code deployed again"}
    corrects = c.corrects or {}
    if "txids" in corrects:
        first, last = (int(t) for t in corrects["txids"])
        batch, records = reread.committed_range(cur, store.schema, topology_id, first, last) or (PlannedBatch(), 0)
        task = Task(c.txid, "range", batch, c.attempt, first, last, records)
    else:
        task = Task(c.txid, "batch", planned_batch(c.batch, spec.source.kind), c.attempt, records=c.planned_records)
    missing = None if "replay" in corrects else spec.source.unavailable(cur, store.schema, topology_id, task.batch)
    if missing:
        return None, "unverifiable", {"reason": f"its input is gone before it was checked: {missing}"}
    return task, "", {}


def _code(record: Mapping[str, Any] | None) -> dict[str, Any]:
    return {k: (record or {}).get(k) for k in SAME_CODE}


def _drifted(store: StateStore, cur: psycopg2.extensions.cursor, num: int, spec: TopologySpec,
             committed: int) -> list[int]:
    """Fail the committed txid when a state no longer adds up to its delta history, and the first
    txid whose history is no longer what its commit applied (a history row rewritten to match a
    state written outside the commits: the history agrees with the state then, not with the
    commit's digest); the txids failed. A failure stays until the txid is checked again."""
    history = h.mark(cur, store.schema, spec.topology_id)
    if committed == 0:
        return []
    found: dict[str, Any] = {}
    rewritten: dict[int, dict[str, Any]] = {}
    for state in spec.recomputable_states:
        if state.database is not None:
            continue  # kept in another database: not reachable from here
        staging = store.staging(num, state)
        for txid, recorded, now in v.rewritten(cur, store.schema, spec.topology_id, state, staging,
                                               history.history_from_txid):
            rewritten.setdefault(txid, {})[state.name] = {"committed": recorded, "history": now}
        if not history.history_base:
            continue  # no history from a snapshot to add up
        rows = v.drift(cur, store.schema, spec.topology_id, state, staging, history.history_from_txid, SAMPLES)
        if rows:
            found[state.name] = {"samples": [{"key": k, "stored": s, "history": f, "last_txid": t}
                                             for k, s, f, t in rows]}
    if rewritten:
        first = min(rewritten)
        v.forget(cur, store.schema, spec.topology_id, first, first)  # the mark steps back before it
        v.record(cur, store.schema, spec.topology_id, first, "failed",
                 {"reason": "its delta history is no longer what its commit applied (rewritten outside the "
                            f"commits; {len(rewritten)} txid(s) in all: {sorted(rewritten)[:SAMPLES]})",
                  "states": rewritten[first]})
    if found:
        v.record(cur, store.schema, spec.topology_id, committed, "failed",
                 {"reason": "a state does not add up to what the commits applied (written outside them)",
                  "states": found})
    return sorted({*([min(rewritten)] if rewritten else []), *([committed] if found else [])})


def judge(store: StateStore, topology_id: str, task: Task, *, quarantined: int | None = None,
          read_digest: str | None = None) -> dict[str, Any]:
    """Compare a recomputed txid (staged under the verification attempt) with its commit; record
    the verdict, clear the staged rows, move the mark. The verdict, with what differs."""
    with store.db.transaction() as cur:
        num, spec, _c, _o = store.load(cur, topology_id)
        candidate = v.candidate(cur, store.schema, topology_id, task.txid)
        problems: dict[str, Any] = {}
        for state in spec.recomputable_states:
            staging, recomputed = store.staging(num, state), store.verify_staging(num, state)
            if task.txid <= spec.built.get(state.name, 0):  # built from the source as of a later txid
                v.clear(cur, recomputed, task.txid)
                continue
            found = (_range_check(store, cur, topology_id, state, staging, recomputed, task) if task.kind == "range"
                     else _batch_check(cur, state, staging, recomputed, task, candidate))
            if found:
                problems[state.name] = found
            v.clear(cur, recomputed, task.txid)
        if task.kind == "batch":
            problems.update(_events_check(cur, store.out_verify(num), spec, task, candidate))
            if quarantined is not None and quarantined != candidate.quarantined:
                problems["quarantine"] = {"committed": candidate.quarantined, "recomputed": quarantined}
            if read_digest and candidate.read_digest and read_digest != candidate.read_digest:
                problems["input"] = {"committed": candidate.read_digest, "recomputed": read_digest}
        status = "failed" if problems else "verified"
        detail = {"kind": task.kind, **({"differences": problems} if problems else {})}
        v.record(cur, store.schema, topology_id, task.txid, status, detail)
        faults.point("verify.judge", cur, scope=(topology_id, str(task.txid)))
        at = v.mark(cur, store.schema, topology_id).verified_through
        now = v.advance(cur, store.schema, topology_id, at)
    return {"txid": task.txid, "status": status, **detail, "verified_through": now}


def _events_check(cur: psycopg2.extensions.cursor, staging: sql.Composed, spec: TopologySpec, task: Task,
                  committed: v.Candidate) -> dict[str, Any]:
    """Each output's recomputed events against the digest its commit recorded (none recorded: a
    commit from before output digests, not checked); the staged events cleared."""
    if not spec.outputs:
        return {}
    staged = out_q.staged_counts(cur, staging, task.txid, v.ATTEMPT)
    v.clear(cur, staging, task.txid)
    found = {}
    for o in spec.outputs:
        want = (committed.digests or {}).get(out_q.DIGEST_PREFIX + o.name)
        got = staged.get(o.name, (0, h.EMPTY_DIGEST))[1]
        if want is not None and got != want:
            found[f"output {o.name}"] = {"committed": want, "recomputed": got}
    return found


def _batch_check(cur: psycopg2.extensions.cursor, state: Any, staging: sql.Composed, recomputed: sql.Composed,
                 task: Task, committed: v.Candidate) -> dict[str, Any] | None:
    got = v.digest(cur, state, recomputed, task.txid)
    want = (committed.digests or {}).get(state.name, h.EMPTY_DIGEST)
    if got == want:
        return None
    return {"committed": want, "recomputed": got,
            "samples": [{"key": k, "committed": c, "recomputed": r}
                        for k, c, r in v.diff(cur, state, staging, recomputed, task.txid, task.attempt, SAMPLES)]}


def _range_check(store: StateStore, cur: psycopg2.extensions.cursor, topology_id: str, state: Any,
                 staging: sql.Composed, recomputed: sql.Composed, task: Task) -> dict[str, Any] | None:
    """A correction: its range recomputed (in ``recomputed``) against what the range's txids and its
    corrections through this one applied (the sum its commit made the state's values add up to)."""
    originals, corrected = old_txids(cur, store.schema, topology_id, task.first, task.last, task.txid + 1)
    rows = sql.SQL("(SELECT {keys}, value FROM {table} WHERE txid = {txid} AND attempt = {attempt})").format(
        keys=q.key_list(state), table=recomputed, txid=sql.Literal(task.txid), attempt=sql.Literal(v.ATTEMPT))
    found = cq.preview(cur, store.schema, topology_id, state, staging, rows,
                       sorted(originals + corrected), SAMPLES)
    if not found.changed:
        return None
    return {"keys": found.changed, "samples": [{"key": k, "committed": o, "recomputed": n}
                                               for k, o, n in found.samples]}


def status(store: StateStore, topology_id: str, first: int | None = None, last: int | None = None,
           ) -> dict[str, Any]:
    """The mark, how many committed txids are in each status, whether a round has a txid to check,
    the first failed checks, and the checks of txids first..last (default: the last 50 committed),
    JSON-ready."""
    with store.db.transaction() as cur:
        store.load(cur, topology_id)
        at = v.mark(cur, store.schema, topology_id)
        last = at.committed_txid if last is None else last
        first = max(1, last - 49) if first is None else first
        checks = v.checks(cur, store.schema, topology_id, first, last)
        counts = v.counts(cur, store.schema, topology_id)
        failures = v.failures(cur, store.schema, topology_id, SAMPLES)
        to_check = bool(v.candidates(cur, store.schema, topology_id, at.verified_through, 1))
    return {"topology": topology_id, "verified_through": at.verified_through, "committed_txid": at.committed_txid,
            "counts": counts, "to_check": to_check,
            "failures": [{"txid": c.txid, "detail": c.detail or {}} for c in failures],
            "checks": [{"txid": c.txid, "status": c.status or "pending", "detail": c.detail or {},
                        "checked_at": None if c.checked_at is None else c.checked_at.isoformat()} for c in checks]}


def recheck(store: StateStore, topology_id: str, first: int, last: int) -> int:
    """Forget the checks of txids first..last, to run them again (after a failure was understood
    and mended, or the code that committed them deployed again); the mark now (before ``first``)."""
    with store.db.transaction() as cur:
        committed = store.load(cur, topology_id).committed_txid
        if not 1 <= first <= last <= committed:
            raise ConfigError(f"topology {topology_id!r} has committed txids 1..{committed}: name a range of them "
                              f"to check again, got {first}..{last}")
        return v.forget(cur, store.schema, topology_id, first, last)
