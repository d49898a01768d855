"""Corrections: committed txids re-processed under the code deployed now, their difference
committed as a transaction of its own -- the next txid, in order, exactly once.

A correction of txids A..B is planned like any batch (:func:`plan_correction`): it gets the next
txid, and its batch is the committed batches of A..B merged (the same records, read again), with
the checkpoint where it is (a correction reads no new records). Its processing attempt is the
topology's own job, run on that batch. Its commit (``core/commit.py``) turns the attempt's staged
rows into differences (:func:`differences`): per key, the new value of A..B less what the delta
history says A..B applied -- the txids themselves and the corrections of ranges inside A..B
committed before it -- and applies them as that txid's deltas under the value rules, so it can
never apply twice. Records A..B quarantined that the new code counts are marked as counted by it;
records it quarantines that A..B counted are subtracted (:func:`settle_quarantine`). Output logs
get compensating events instead of edits: a retraction of each event A..B appended that the new
code no longer emits as it was, a new version of each it emits otherwise (the next stage takes a
retraction back, negated: :func:`retraction_refusal` says which readers cannot).

What a correction cannot do is refused when it is planned, naming why: a decision's verdicts are
never re-decided; a min, max or replace state has no difference to add; a range the delta history
no longer holds, or whose records the source's retention removed, cannot be read again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import psycopg2.extensions

from ..exceptions import ConfigError, NonDeterministic, TooManyInFlight
from ..model import Offsets, PlannedBatch, Transaction
from ..ranges import txid_range
from ..sources.eventlog import SOURCE_KIND
from ..spec import TopologySpec
from ..store import attempts, catalog, outputs, transactions
from ..store import corrections as cq
from ..store import history as h
from ..store import state as q
from ..values import Combiner
from . import reread
from .context import StateStore

#: What makes two commits' code the same for the determinism check (:mod:`..provenance`).
SAME_CODE = ("application", "provider", "declaration")


class Corrected(NamedTuple):
    """What a correction's commit applies instead of its staged rows: the differences, counted per
    state, and the txids whose deltas (and quarantined records) it corrects."""

    row_counts: dict[str, int]
    old_txids: list[int]


def refusal(spec: TopologySpec, *, replay: bool = False) -> str | None:
    """Why the topology's commits cannot be corrected (None: they can); ``replay``: why its
    quarantined records cannot be replayed (a replay only adds: any combiner takes it)."""
    if spec.decisions:
        return ("its decisions granted and declined requests in commit order against the balances then; a "
                "correction never re-decides them (fix a balance with a request of its own)")
    inexact = _inexact(spec)
    if inexact and not replay:
        return (f"states {', '.join(inexact)} keep a min, max or latest value: a difference cannot be added to "
                "them (only sum and count states can be corrected)")
    return None


def _inexact(spec: TopologySpec) -> list[str]:
    """The states keeping a min, max or latest value, as ``name (combiner)``: no difference adds to them."""
    return [f"{s.name} ({Combiner(s.combiner).value})" for s in spec.states if not Combiner(s.combiner).numeric]


def retraction_refusal(spec: TopologySpec) -> str | None:
    """Why a topology reading an output log cannot apply a correction's retractions to what it
    committed (None: it applies each negated, as a record it reads)."""
    if spec.decisions:
        return "its decisions are never re-decided"
    if spec.source.kind != SOURCE_KIND and spec.outputs:
        return ("it reads the events from Kafka and appends output events of its own: retracting those in turn is "
                "built for a reader of the log")
    inexact = _inexact(spec)
    if inexact:
        return f"states {', '.join(inexact)} keep a min, max or latest value, from which nothing can be taken back"
    return None


def _readers_refusal(store: StateStore, cur: psycopg2.extensions.cursor, spec: TopologySpec,
                     seen: frozenset[str] = frozenset()) -> str | None:
    """Why a correction's compensating events would not be applied right by the topologies this
    store knows to read the outputs (their logs, their Kafka topics), or by the readers of theirs:
    a reader with output logs retracts and versions its own events in turn."""
    logs = [o.log_name for o in spec.outputs]
    topics = [o.kafka_topic for o in spec.outputs if o.kafka_topic]
    seen = seen | {spec.topology_id}
    for reader, declared in cq.log_readers(cur, store.schema, logs, topics):
        read = TopologySpec.from_config(declared)
        why = retraction_refusal(read)
        if why:
            return (f"topology {reader!r} reads its output events and could not take a correction's retractions "
                    f"back: {why}")
        why = _readers_refusal(store, cur, read, seen) if read.outputs and reader not in seen else None
        if why:
            return f"{why} (it reads the events of {reader!r}, which reads these)"
    return None


def kind(txn: Transaction) -> str | None:
    """``"range"`` for a correction of committed txids, ``"replay"`` for a replay of quarantined
    records, None for a batch of new records."""
    if not txn.corrects:
        return None
    return "replay" if "replay" in txn.corrects else "range"


def plan_correction(store: StateStore, topology_id: str, run_key: str, first: int, last: int) -> Transaction:
    """The correction of committed txids ``first``..``last`` that run ``run_key`` is: planned now
    (the next txid) if new, else the stored one."""
    with store.db.transaction() as cur:
        _num, spec, committed, offsets = store.load(cur, topology_id, lock=True)
        known = transactions.txid_of_run(cur, store.schema, topology_id, run_key)
        if known is not None:
            txn = store.txn(cur, topology_id, known)
            if txn.corrects != {"txids": [first, last]}:
                raise ConfigError(f"run {run_key!r} is txid {known} of topology {topology_id!r}, "
                                  f"{'a correction of ' + str(txn.corrects) if txn.corrects else 'a batch'}: "
                                  f"not a correction of txids {first}..{last}")
            return txn
        batch, records = _range_batch(store, cur, spec, first, last, committed)
        txid, at = next_slot(store, cur, spec, committed, offsets)
        transactions.insert(cur, store.schema, topology_id, txid, run_key, at, at, batch, records,
                            corrects={"txids": [first, last]})
        return store.txn(cur, topology_id, txid)


def next_slot(store: StateStore, cur: psycopg2.extensions.cursor, spec: TopologySpec, committed: int,
              offsets: Offsets) -> tuple[int, Offsets]:
    """The txid a correction or a replay planned now gets (TooManyInFlight when none is free), and
    the offsets it starts and ends at: where the last planned batch ends (it reads no new records)."""
    in_flight = [p.txid for p in transactions.planned(cur, store.schema, spec.topology_id)]
    if len(in_flight) >= spec.max_in_flight:
        raise TooManyInFlight(spec.topology_id, in_flight, spec.max_in_flight)
    latest = transactions.last(cur, store.schema, spec.topology_id)
    return (latest.txid + 1, dict(latest.end_offsets)) if latest else (committed + 1, dict(offsets))


def _range_batch(store: StateStore, cur: psycopg2.extensions.cursor, spec: TopologySpec, first: int, last: int,
                 committed: int) -> tuple[PlannedBatch, int]:
    """The batch a correction of first..last reads (their batches merged) and its planned records,
    or a ConfigError naming why it cannot be corrected."""
    topology_id = spec.topology_id
    _check_range(store, cur, spec, first, last, committed)
    again = reread.committed_range(cur, store.schema, topology_id, first, last)
    if again is None:
        raise ConfigError(f"topology {topology_id!r}: txids {first}..{last} are corrections and replays, which "
                          "read no records of the source: correct the txids they corrected")
    batch, planned_records = again
    missing = spec.source.unavailable(cur, store.schema, topology_id, batch)
    if missing:
        raise ConfigError(f"topology {topology_id!r}: txids {first}..{last} cannot be read again ({missing}); "
                          "the source's retention removed what they read. A correction needs their records")
    return batch, planned_records


def range_batch(store: StateStore, topology_id: str, first: int, last: int) -> PlannedBatch:
    """The batch a correction of committed txids first..last would read (a preview reads it)."""
    with store.db.transaction() as cur:
        _num, spec, committed, _o = store.load(cur, topology_id)
        return _range_batch(store, cur, spec, first, last, committed)[0]


def _check_range(store: StateStore, cur: psycopg2.extensions.cursor, spec: TopologySpec, first: int, last: int,
                 committed: int) -> None:
    topology_id = spec.topology_id
    why = refusal(spec)
    if why:
        raise ConfigError(f"topology {topology_id!r} cannot be corrected: {why}")
    if not 1 <= first <= last <= committed:
        raise ConfigError(f"topology {topology_id!r} has committed txids 1..{committed}: a correction names a range "
                          f"of them, got {first}..{last}")
    if spec.outputs:
        why = _readers_refusal(store, cur, spec)
        originals, corrected = old_txids(cur, store.schema, topology_id, first, last)
        gone = cq.outputs_gone(cur, store.schema, topology_id, sorted(originals + corrected))
        if why or gone:
            raise ConfigError(f"topology {topology_id!r} cannot be corrected: " + (why or (
                "retention removed output events its txids appended, which a correction must retract or keep "
                f"({'; '.join(gone)})")))
    if spec.building:
        raise ConfigError(f"topology {topology_id!r}: states {[s.name for s in spec.building]} are being built "
                          "from its history, which a correction would change under the build: let the build switch "
                          f"them in ('airflow-txn evolve {topology_id} --approve') or cancel it, then correct")
    built = {name: txid for name, txid in spec.built.items() if first <= txid}
    if built:
        raise ConfigError(f"topology {topology_id!r}: states {sorted(built)} were built from the source as of "
                          f"txids {sorted(set(built.values()))}, so what txids through those applied to them is one "
                          "snapshot, not per txid; correct txids after them, or rebuild the states")
    mark = h.mark(cur, store.schema, topology_id)
    if first <= mark.history_from_txid:
        raise ConfigError(f"topology {topology_id!r}: the delta history starts after txid {mark.history_from_txid}, "
                          f"so what txids {first}..{last} applied is no longer known; correct txids after it, or "
                          "rebuild the states")
    # A correction (or a replay) that changed deltas of txids partly inside this range did so in
    # deltas the history cannot tell apart: this range must hold all of its txids, or none.
    for planned in cq.corrections_in(cur, store.schema, topology_id, None):
        inside, what = _inside(planned, first, last)
        if inside is None:
            raise ConfigError(f"topology {topology_id!r}: txid {planned.txid} {what}, which overlaps {first}..{last} "
                              "without lying inside it; correct a range that holds all of them or none")
        if inside and planned.edited:
            raise ConfigError(f"topology {topology_id!r}: txid {planned.txid} {what}, {planned.edited} of them edited "
                              "by hand; a correction reads the source again and would undo the edits: correct a "
                              "range without them")


def _inside(planned: cq.Planned, first: int, last: int) -> tuple[bool | None, str]:
    """Whether what ``planned`` covers lies inside first..last (True), outside it (False), or in part
    (None); and what it covers, in words."""
    covers = planned.covers
    if isinstance(covers, tuple):
        lo, hi = covers
        what = f"corrects txids {lo}..{hi}"
        inside = first <= lo and hi <= last
        return (True if inside else False if hi < first or last < lo else None), what
    what = f"replays records of txids {', '.join(map(str, sorted(covers)))}"
    held = {t for t in covers if first <= t <= last}
    return (True if held == covers else False if not held else None), what


def old_txids(cur: psycopg2.extensions.cursor, schema: str, topology_id: str, first: int, last: int,
              before: int | None = None) -> tuple[list[int], list[int]]:
    """The txids whose deltas a correction of first..last replaces: (those of the range that read
    records, the corrections and replays of records inside it planned before txid ``before``)."""
    originals = [t.txid for t in cq.committed_txns(cur, schema, topology_id, first, last) if not t.corrects]
    through = None if before is None else before - 1
    corrected = [p.txid for p in cq.corrections_in(cur, schema, topology_id, through) if _inside(p, first, last)[0]]
    return originals, corrected


def differences(store: StateStore, cur: psycopg2.extensions.cursor, num: int, spec: TopologySpec,
                txn: Transaction, attempt: int, code: Mapping[str, Any] | None = None, *,
                external: bool = False) -> Corrected | None:
    """In the commit of a correction: replace its attempt's staged rows (the new values of its
    range) by the differences from what the range applied; how many there are per state (None:
    the txid is no correction of a range). Differences under the very code the range was committed
    with (``code``, the attempt's) are the job's non-determinism: refused, naming the keys.
    ``external``: of the states kept in other databases only, once, when the attempt is pinned
    (core/commit_external.py: before they are applied there); else of the others and the outputs."""
    if kind(txn) != "range":
        return None
    originals, corrected = old_txids(cur, store.schema, spec.topology_id, *txid_range(txn.corrects), txn.txid)
    old = sorted(originals + corrected)
    counts = {}
    for state in spec.states:
        if (state.database is not None) == external:
            counts[state.name] = cq.differences(cur, store.schema, spec.topology_id, state,
                                                store.staging(num, state), txn.txid, attempt, old)
    if spec.outputs and not external:
        counts.update(cq.compensate(cur, store.schema, spec.topology_id, store.out_staging(num), txn.txid, attempt,
                                    old, {o.name: o.log_name for o in spec.outputs}))
    if any(counts.values()) and not corrected and same_code(cur, store.schema, spec.topology_id, originals, code):
        changed = [f"state {s.name}: keys {cq.keys_of(cur, store.staging(num, s), s, txn.txid, attempt)}"
                   for s in spec.states if counts.get(s.name)]
        changed += [f"output {o.name}: {counts[o.name]} events retracted or changed" for o in spec.outputs
                    if counts.get(o.name)]
        first, last = txid_range(txn.corrects)
        raise NonDeterministic(f"topology {spec.topology_id!r}: correction txid {txn.txid} re-processed txids "
                               f"{first}..{last} under the code they were committed with and got other deltas "
                               f"({'; '.join(changed)}): the job is "
                               "not deterministic. Nothing was committed; find the cause, then withdraw this "
                               f"correction ('airflow-txn correct {spec.topology_id} --withdraw {txn.txid}')")
    return Corrected(counts, old)


def same_code(cur: psycopg2.extensions.cursor, schema: str, topology_id: str, txids: list[int],
              code: Mapping[str, Any] | None) -> bool:
    """Whether every one of ``txids`` was committed by ``code`` (its application, provider and
    declaration; not the DAG version, which any clear changes)."""
    if not code or not txids:
        return False
    wanted = {k: code.get(k) for k in SAME_CODE}
    return all(wanted == {k: (c or {}).get(k) for k in SAME_CODE} for c in cq.codes_of(cur, schema, topology_id, txids))


def settle_quarantine(store: StateStore, cur: psycopg2.extensions.cursor, topology_id: str, txn: Transaction,
                      attempt: int, corrected: Corrected) -> int:
    """After the commit settled the correction's bad records: those its range had quarantined and it
    counted are marked as counted by it; those it found again stay with their txid. How many it keeps."""
    return cq.settle_quarantine(cur, store.schema, topology_id, txn.txid, attempt, corrected.old_txids)


def withdraw(store: StateStore, topology_id: str, txid: int, reason: str = "withdrawn by an operator") -> Transaction:
    """Make the planned, uncommitted correction or replay ``txid`` an empty batch that commits
    nothing (its place in the order stays; a replay's records can be replayed again)."""
    with store.db.transaction() as cur:
        store.load(cur, topology_id, lock=True)
        txn = store.txn(cur, topology_id, txid, lock=True)
        if txn.committed:
            raise ConfigError(f"topology {topology_id!r} txid {txid} is committed: correct it instead")
        if not txn.corrects:
            raise ConfigError(f"topology {topology_id!r} txid {txid} is a batch of new records, not a correction or "
                              "a replay: it cannot be withdrawn (records are never skipped)")
        transactions.replace_plan(cur, store.schema, topology_id, txid, txn.start_offsets, txn.end_offsets,
                                  PlannedBatch(), 0, reason)
        attempts.discard_replanned(cur, store.schema, topology_id, txid, reason)
        cq.withdraw(cur, store.schema, topology_id, txid, reason)
        return store.txn(cur, topology_id, txid)


def preview(store: StateStore, topology_id: str, num: int, first: int, last: int, code: Mapping[str, Any] | None,
            samples: int = 10) -> dict[str, Any]:
    """What a correction of first..last would apply: each state's recomputation of them (loaded into
    its audit table by the job's preview request, dropped here) against what they applied. Under the
    code they were committed with, any difference is the job's non-determinism."""
    with store.db.transaction() as cur:
        spec = store.load(cur, topology_id).spec
        originals, corrected = old_txids(cur, store.schema, topology_id, first, last)
        old = sorted(originals + corrected)
        states = {}
        for state in spec.recomputable_states:
            table = q.audit_table(store.schema, num, state)
            states[state.name] = cq.preview(cur, store.schema, topology_id, state, store.staging(num, state), table,
                                            old, samples)._asdict()
            catalog.drop(cur, table)
        events: dict[str, dict[str, int]] = {}
        if spec.outputs:  # what its commit would append: the events recomputed, against what the range appended
            table = outputs.preview_table(store.schema, num)
            events = cq.compensation_counts(cur, store.schema, topology_id, table, 0, 0, old,
                                            {o.name: o.log_name for o in spec.outputs})
            catalog.drop(cur, table)
        same = not corrected and same_code(cur, store.schema, topology_id, originals, code)
    changed = sum(int(s["changed"]) for s in states.values())
    appended = sum(n for counts in events.values() for n in counts.values())
    result = {"topology": topology_id, "txids": [first, last], "states": states, "changed": changed,
              "outputs": events, "same_code": same, "nondeterministic": same and changed + appended > 0}
    with store.db.transaction() as cur:  # what the Transactions view's correction page shows
        cq.record_preview(cur, store.schema, topology_id, first, last, {**result, "code": dict(code or {})})
    return result


def summary(store: StateStore, topology_id: str, first: int, last: int) -> dict[str, Any]:
    """What a correction of committed txids first..last would do, without running anything: why it
    is refused (None: it is not), the txids and records it re-reads, what they applied to each state
    (keys, total), and the last preview of it (``airflow-txn correct``), if any."""
    with store.db.transaction() as cur:
        num, spec, committed, _o = store.load(cur, topology_id)
        refused = None
        try:
            _range_batch(store, cur, spec, first, last, committed)
        except ConfigError as exc:
            refused = str(exc)
        originals: list[int] = []
        corrected: list[int] = []
        records = 0
        states = {}
        if 1 <= first <= last <= committed:
            originals, corrected = old_txids(cur, store.schema, topology_id, first, last)
            records = sum(t.planned_records for t in cq.committed_txns(cur, store.schema, topology_id, first, last)
                          if not t.corrects)
            for state in spec.recomputable_states:
                keys, total = cq.applied(cur, store.schema, topology_id, state, store.staging(num, state),
                                         originals + corrected)
                states[state.name] = {"keys": keys, "total": total}
        preview_ = cq.last_preview(cur, store.schema, topology_id, first, last)
    return {"topology": topology_id, "txids": [first, last], "refused": refused, "committed_txid": committed,
            "originals": originals, "corrections": corrected, "records": records, "states": states,
            "outputs": [o.name for o in spec.outputs], "preview": preview_}

