"""One engine for recomputing committed txids with the topology's own code, whichever processor.

A recomputation reads committed batches again, folds them with the code deployed now, stages what
that computes somewhere and then acts on it. What differs between its kinds is only *which*
batches, *where* they are staged and *what is done* with the staged result; what differs between
processors is only how a batch is folded. So each kind is a small rule class here, the store
handed in (Storm Trident's shape), and a processor hands in one operation, :data:`Fold` -- fold
this planned batch into this :class:`Target` -- the Spark job's (``spark/recompute.py``: its
``read_batch`` and staging) or plain Python's (``processing.py``):

* :class:`Audit` -- every state over the committed offsets, plus what the committed replays took
  (each as edited), into fresh tables; diffed against the state tables (where retention took early
  input, from the verified-through mark: ``core/audit_base.py``);
* :class:`Rebuild` -- the same, swapped in while the topology keeps committing (``core/rebuild.py``);
* :class:`StateBuild` -- the states a DAG file added, built from the source's history beside the
  live ones and switched in at one txid while the topology keeps committing (``core/evolution.py``);
* :class:`CorrectionPreview` -- txids A..B under this code: what a correction of them would change,
  nothing committed (``core/corrections.py``);
* :class:`VerificationRound` -- a round of the shadow audit: each txid it takes, staged under the
  verification attempt in the round's own tables and judged against its commit (``core/verify.py``).

``recompute(store, kind, fold)`` runs one; the coordinator's ``recompute`` is the door to it. A
kind is also a request (:func:`request`, :func:`from_request`): what ``airflow-txn`` and the
verify task hand the Spark job, in a file, as JSON -- one typed value, checked once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

from .. import faults
from ..exceptions import ConfigError, TransactionalError
from ..model import VERIFY_ATTEMPT, PlannedBatch, Staging
from ..ranges import Round
from . import attempts, audit_base, building, corrections, evolution, rebuild, registration, replayed, status, verify
from .context import StateStore

__all__ = ["Audit", "CorrectionPreview", "Fold", "Folded", "Kind", "Rebuild", "StateBuild", "Target",
           "VerificationRound", "from_request", "recompute", "request"]


class Target(NamedTuple):
    """Where a fold stages what it computed: each recomputable state's rows through its COPY (CSV:
    ``prefix``, then the key columns and the value), and -- unless ``events`` is None, when only the
    states are computed -- the output events, as a commit's are staged (``events.prefix``: txid,
    attempt)."""

    states: Mapping[str, str]
    prefix: tuple[Any, ...] = ()
    events: Staging | None = None


class Folded(NamedTuple):
    """What a fold saw: the records it set aside (bad, unreadable, unstageable) and the digest of
    what it read (records, their offsets' CRC-32s), as a processing attempt records it."""

    bad: int
    read_digest: str | None = None


#: The one operation a processor hands in: fold a planned batch into a target.
Fold = Callable[[PlannedBatch, Target], Folded]
#: Told the name of each phase as it ends (a profile's lap), or nothing.
Lap = Callable[[str], None]


def _no_lap(_phase: str) -> None:
    return None


def recompute(store: StateStore, kind: Kind, fold: Fold, lap: Lap | None = None) -> dict[str, Any]:
    """Run the recomputation ``kind`` with ``fold``; what it found (JSON-ready)."""
    return kind.run(store, fold, lap or _no_lap)


def _with_replays(store: StateStore, topology_id: str, purpose: str, after: int, through: int, fold: Fold,
                  states: Sequence[str] | None = None) -> int:
    """Fold into the recomputation of ``purpose`` (of ``states``, else every recomputable one) what
    the replays committed after txid ``after`` through ``through`` counted -- the records they took,
    each as edited (``core/replayed.py``) -- and return the bad records that adds: those still bad,
    less the records the replays took."""
    batch = replayed.committed(store, topology_id, after + 1, through)
    if batch is None:
        return 0
    folded = fold(batch, Target(replayed.copies(store, topology_id, purpose, states)))
    replayed.fold_in(store, topology_id, purpose, states)
    return folded.bad - len(batch.replay)


@dataclass(frozen=True)
class Audit:
    """Every state recomputed from the source over the committed offsets (and the committed
    replays' records), diffed against the tables. Where the source no longer holds what committed
    txids read: the states as of the verified-through mark from their delta history, and the txids
    after it recomputed (``core/audit_base.py``)."""

    name: ClassVar[str] = "audit"

    topology_id: str
    tries: int = 3  # a commit landing during the diff: recompute against the new checkpoint

    def run(self, store: StateStore, fold: Fold, lap: Lap) -> dict[str, Any]:
        topology_id = self.topology_id
        for _ in range(self.tries):
            st = status.status(store, topology_id)
            batch, why_not = status.committed_batch(store, topology_id)
            base = audit_base.audit_base(store, topology_id) if why_not else {}
            if "refused" in base:
                return {"topology": topology_id, "auditable": False, "reason": f"{why_not}; {base['refused']}",
                        "differences": None}
            num, copies = status.audit_tables(store, topology_id)
            bad = fold(base.get("batch", batch), Target(copies)).bad if not base or base["records"] else 0
            bad += _with_replays(store, topology_id, "audit", base.get("txid", 0), st.committed_txid, fold)
            if base:
                audit_base.add_audit_base(store, topology_id, num, base["txid"])
                bad += base["quarantined"]
            result = status.diff_audit(store, topology_id, num, st.committed_txid)
            if result is None:
                continue
            if base:
                result["from_verified_txid"] = base["txid"]
            result["quarantined_recomputed"], result["quarantined_committed"] = bad, st.quarantined
            if bad != st.quarantined:
                result["differences"] += abs(bad - st.quarantined)
                result["samples"].append(f"quarantine: {st.quarantined} committed, {bad} recomputed")
            return result
        raise TransactionalError(f"topology {topology_id!r} kept committing during the audit: pause it and rerun")


@dataclass(frozen=True)
class Rebuild:
    """Every state recomputed from the source (and the committed replays' records) and swapped in
    while the topology keeps committing."""

    name: ClassVar[str] = "rebuild"

    topology_id: str

    def run(self, store: StateStore, fold: Fold, lap: Lap) -> dict[str, Any]:
        topology_id = self.topology_id
        started = rebuild.begin(store, topology_id)
        try:
            batch, why_not = status.committed_batch(store, topology_id, through_txid=started.through_txid)
            if why_not:
                raise TransactionalError(f"topology {topology_id!r} cannot be rebuilt from its source: {why_not}")
            fold(batch, Target(rebuild.load_copies(store, topology_id)))
            _with_replays(store, topology_id, "rebuild", 0, started.through_txid, fold)
            faults.point("rebuild.loaded", scope=(topology_id,))
            return rebuild.swap(store, started)
        except BaseException:
            rebuild.abort(store, topology_id, started=started)
            raise


@dataclass(frozen=True)
class StateBuild:
    """The states the DAG file added, approved: each built from the source's history (and the
    committed replays' records) while the topology keeps committing, and switched in at one txid
    (``core/evolution.py``). A build whose process died is taken up again by the next."""

    name: ClassVar[str] = "build"

    topology_id: str

    def run(self, store: StateStore, fold: Fold, lap: Lap) -> dict[str, Any]:
        topology_id = self.topology_id
        started = evolution.begin(store, topology_id)
        try:
            evolution.wait_for_plans(store, started)
            lap("wait for the txids planned before the build")
            for chunk in building.pending(store, started):  # those a build taken up has not folded yet
                copies, batch = building.begin_chunk(store, started, chunk)
                if chunk.last_txid == 0:  # the committed replays' records, each as edited
                    _with_replays(store, topology_id, "build_part", 0, started.through_txid, fold, started.states)
                elif batch is not None:
                    fold(batch, Target(copies))
                building.end_chunk(store, started, chunk)
                faults.point("build.chunk", scope=(topology_id,))
            lap("fold the history")
            faults.point("build.loaded", scope=(topology_id,))
            return evolution.switch(store, started)
        finally:
            rebuild.release(store, topology_id)  # a build that failed stays: approving again takes it up


@dataclass(frozen=True)
class CorrectionPreview:
    """Committed txids first..last recomputed under this code (``code``: its record): what a
    correction of them would apply per state and append to each output, and whether the same code
    computed something else (its non-determinism). Nothing is committed."""

    name: ClassVar[str] = "preview"

    topology_id: str
    first: int
    last: int
    code: Mapping[str, Any] | None = None

    def run(self, store: StateStore, fold: Fold, lap: Lap) -> dict[str, Any]:
        spec = registration.spec(store, self.topology_id)
        batch = corrections.range_batch(store, self.topology_id, self.first, self.last)
        num, copies = status.audit_tables(store, self.topology_id, outputs=True)
        events = Staging(copies.pop(""), (0, 0)) if spec.outputs else None  # as a commit's would be
        fold(batch, Target(copies, events=events))
        return corrections.preview(store, self.topology_id, num, self.first, self.last, self.code)


@dataclass(frozen=True)
class VerificationRound:
    """A round of the shadow audit: each txid it takes read again as its batch was planned, folded
    by this code (``code``: its record), staged under the verification attempt in the round's own
    tables and judged against its commit."""

    name: ClassVar[str] = "verify"

    topology_id: str
    budget: int = 10
    every: int = 1
    code: Mapping[str, Any] | None = None

    def run(self, store: StateStore, fold: Fold, lap: Lap) -> dict[str, Any]:
        topology_id = self.topology_id
        spec = registration.spec(store, topology_id)
        copies = attempts.staging_copies(store, topology_id, verify=True)
        events = attempts.output_staging(store, topology_id, verify=True).copy if spec.outputs else ""
        checked = []
        with verify.verifying(store, topology_id, budget=self.budget, every=self.every, code=self.code) as rnd:
            lap("plan the round")
            for task in rnd.tasks:
                key = (task.txid, VERIFY_ATTEMPT)
                # A correction's events are its compensation: not checked.
                staged = Staging(events, key) if spec.outputs and task.kind == "batch" else None
                folded = fold(task.batch, Target(copies, key, staged))  # it tells its own phases
                checked.append(verify.judge(store, topology_id, task, quarantined=folded.bad,
                                            read_digest=folded.read_digest))
                lap("judge")
        mark = checked[-1]["verified_through"] if checked else verify.status(store, topology_id)["verified_through"]
        return {"topology": topology_id, "busy": rnd.busy, "settled": rnd.settled, "checked": checked,
                "verified_through": mark}


Kind = Audit | Rebuild | StateBuild | CorrectionPreview | VerificationRound
#: Each kind by the name its requests give.
KINDS: dict[str, type[Kind]] = {k.name: k for k in (Audit, Rebuild, StateBuild, CorrectionPreview, VerificationRound)}


def request(kind: Kind) -> dict[str, Any]:
    """``kind`` as a request (JSON-ready): its name and its fields, less the code record, which the
    job that runs it makes of its own code."""
    return {"kind": kind.name, **{f.name: getattr(kind, f.name) for f in dataclasses.fields(kind) if f.name != "code"}}


def from_request(given: Any) -> Kind:
    """The kind a request (see :func:`request`) asks for, every field checked, else a ConfigError
    that names what was wrong."""
    cls = KINDS.get(str(given.get("kind"))) if isinstance(given, Mapping) else None
    if cls is None:
        raise ConfigError(f"a recompute request is a JSON object whose kind is one of {sorted(KINDS)}, got "
                          f"{str(given)[:200]}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "code"}
    unknown = sorted(set(given) - set(fields) - {"kind"})
    if unknown or not isinstance(given.get("topology_id"), str):
        raise ConfigError(f"a request to {cls.name} takes {sorted(fields)} (topology_id a string), got {dict(given)}")
    values = {k: v for k, v in given.items() if k in fields}
    bad = [k for k, v in values.items() if k != "topology_id" and (type(v) is not int or v < 1)]
    if bad:
        raise ConfigError(f"a request to {cls.name}: {', '.join(bad)} must be whole numbers from 1, got {dict(given)}")
    kind = cls(**values)
    if isinstance(kind, CorrectionPreview) and kind.first > kind.last:
        raise ConfigError(f"a request to preview: its first txid is after its last: {kind.first}..{kind.last}")
    if isinstance(kind, VerificationRound):
        Round.parse(str(Round(kind.budget, kind.every)), "a request to verify: its round")
    return kind
