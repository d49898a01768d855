"""Run one processing attempt in plain Python: read the batch, map records, stage partials.

This is the processing phase without Spark -- used by the core demo, the tests, and small
topologies. The Spark helper (:mod:`.spark`) does the same with DataFrames. The function may
also yield :class:`OutputEvent` s for the topology's output logs and :class:`Request` s for its
decisions.

A record is quarantined with its offset and the reason (or fails the attempt when the topology
says ``on_bad_record="fail"``) when its payload does not parse or nests too deep, when the user
function raises ``ValueError``, ``LookupError``, ``TypeError``, ``ArithmeticError`` or
:class:`BadRecord` for it, or when anything it emits breaks :mod:`.limits` -- a key or id too
long or holding a NUL, a value its column cannot hold, a sum its key can no longer hold: nothing
one record carries can fail the staging or the commit. Any other exception fails the attempt;
its staged rows are never committed.
"""

from __future__ import annotations

import json
import logging
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from . import limits, provenance
from .coordinator import (
    Audit,
    Coordinator,
    CorrectionPreview,
    Fold,
    Folded,
    Rebuild,
    StateBuild,
    Target,
    VerificationRound,
)
from .exceptions import BadRecord, ConfigError
from .model import RETRACTED, Attempt, PlannedBatch, StagedEvent, Transaction, event_id, read_digest
from .sources.base import Record, Versions
from .sources.eventlog import partition_of, payload_refusal
from .sources.kafka import RETRACTION_REFUSED
from .spec import StateSpec, TopologySpec
from .values import Combiner, combine

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OutputEvent:
    """An event for one of the topology's output logs (``OutputSpec``), appended by the commit.

    ``payload`` is text, or a JSON value (written with sorted keys). ``id`` names the event
    by its origin, e.g. ``f"{request_id}:granted"``: the log's event id is
    ``"<topology>:<id>"``, so an event emitted again (a replay, a reset) is never appended twice.
    Without ``id`` it is the source event's id (else its offset) and the event's number among
    the record's output events. ``key`` picks the partition (default: the event id), so the
    events of one key stay in order.
    """

    output: str
    payload: Any
    key: str | None = None
    id: str | None = None

    def text(self) -> str:
        text = self.payload if isinstance(self.payload, str) else json.dumps(self.payload, sort_keys=True)
        # what the log's readers would refuse (payload_refusal has checked the size)
        why = payload_refusal(text) or (limits.LONE_SURROGATE if limits.escapes_lone_surrogate(text) else None)
        if why is not None:
            raise BadRecord(f"output event for {self.output!r}: {why}")
        return text


@dataclass(frozen=True)
class Request:
    """A request for a decision of the topology (``DecisionSpec``), decided by the commit.

    ``key`` is the key of the decision's state (a value or a tuple), ``amount`` what a grant adds
    to its balance, ``id`` the request's id (decided once, ever). ``granted`` and ``declined``
    are the output events appended when the request gets that verdict (and only then).
    """

    decision: str
    key: Any
    amount: Any
    id: str
    granted: Sequence[OutputEvent] = ()
    declined: Sequence[OutputEvent] = ()


# A user function maps one parsed record to (state name, key tuple, value) triples, output
# events and requests.
Emit = tuple[str, tuple[Any, ...], Any]
RecordFn = Callable[[Any], Iterable[Emit | OutputEvent | Request]]

_BAD = (ValueError, LookupError, TypeError, ArithmeticError, RecursionError, BadRecord)


@dataclass(frozen=True)
class ProcessResult:
    txid: int
    attempt: int | None  # None: the batch was empty, nothing to process
    records_read: int
    row_counts: dict[str, int]  # rows by state, events by output, requests by decision
    quarantined: int


def _admitted_key(state: StateSpec, key: tuple[Any, ...]) -> tuple[Any, ...]:
    """``key`` as staged, or BadRecord naming the limit it breaks (:mod:`.limits`)."""
    types = list(state.keys.values())
    why = limits.key_refusal(state.name, types, key)
    if why is not None:
        raise BadRecord(why)
    return tuple(limits.as_stored(t, k) for t, k in zip(types, key, strict=True))


def _check_emit(spec: TopologySpec, emit: Any) -> tuple[str, tuple[Any, ...], Any]:
    try:
        state_name, key, value = emit
    except (TypeError, ValueError):
        raise ConfigError(f"the record function must yield (state, key_tuple, value), got {emit!r}") from None
    state = spec.state(state_name)
    key = key if isinstance(key, tuple) else (key,)
    if len(key) != len(state.keys):
        raise ConfigError(f"state {state_name!r} has key ({', '.join(state.key_columns)}), got {key!r}")
    why = limits.value_refusal(state_name, state.value_type, value)
    if why is not None:
        raise BadRecord(why)
    return state_name, _admitted_key(state, key), limits.as_stored(state.value_type, value)


def _check_event(spec: TopologySpec, topology_id: str, rec: Record, n: int,
                 event: OutputEvent) -> tuple[str, str | None, str, str]:
    """(output, key, event id, payload) of an output event, or BadRecord."""
    if not isinstance(event, OutputEvent):
        raise ConfigError(f"a request's granted and declined events must be OutputEvent(...), got {event!r}")
    spec.output(event.output)  # an unknown output is a ConfigError: the code is wrong, not the record
    origin = event.id if event.id is not None else f"{rec.event_id or rec.offset}:{n}"  # a version's: its origin's
    if not isinstance(origin, str) or not origin:
        raise BadRecord(f"output event for {event.output!r}: id must be non-empty text, got {event.id!r}")
    eid = event_id(topology_id, origin)
    why = limits.id_refusal(f"the id of an output event for {event.output!r}", eid)
    if why is None and event.key is not None:
        why = (limits.field_refusal(f"the key of an output event for {event.output!r}", "text", event.key)
               if isinstance(event.key, str) else f"output event for {event.output!r}: key must be text")
    if why is not None:
        raise BadRecord(why)
    return event.output, event.key, eid, event.text()


def _check_request(spec: TopologySpec, req: Request) -> tuple[str, tuple[Any, ...], str, Any]:
    """(decision, key, request id, amount) of a request, or BadRecord."""
    state = spec.state(spec.decision(req.decision).state)
    key = req.key if isinstance(req.key, tuple) else (req.key,)
    if len(key) != len(state.keys):
        raise ConfigError(f"decision {req.decision!r} keys requests by ({', '.join(state.key_columns)}), got {key!r}")
    why = limits.id_refusal(f"the id of a request for {req.decision!r}", req.id)
    if why is None and (isinstance(req.amount, bool) or not isinstance(req.amount, (int, float, Decimal))):
        why = f"request {req.id!r}: amount must be a number, got {req.amount!r}"
    why = why or limits.field_refusal(f"the amount of request {req.id!r}", state.value_type, req.amount)
    if why is not None:
        raise BadRecord(why)
    return req.decision, _admitted_key(state, key), req.id, limits.as_stored(state.value_type, req.amount)


class _Batch:
    """What one attempt stages, gathered record by record in source order."""

    def __init__(self, coordinator: Coordinator, spec: TopologySpec, txid: int, versions: Versions) -> None:
        self.spec, self.txid = spec, txid
        # In a batch that read a correction's events every staged event says whether it retracts.
        self.marked: bool | None = False if versions else None
        kept = (*spec.states, *spec.building)  # a state being built is staged too
        self.partials: dict[str, dict[tuple[Any, ...], Any]] = {s.name: {} for s in kept}
        self.combiners = {s.name: Combiner(s.combiner) for s in kept}
        self._routes = spec.job_routes  # added by the DAG file and not approved yet, retired, or redefined
        self.partitions = coordinator.output_staging(spec.topology_id).partitions if spec.outputs else {}
        self.events: list[StagedEvent] = []
        self.requests: dict[str, list[tuple[tuple[Any, ...], int, str, Any]]] = {d.name: [] for d in spec.decisions}
        self._seen: set[tuple[str, str]] = set()  # (output or decision, id): the first one wins

    def add(self, rec: Record, emitted: list[Any], *, retraction: bool = False) -> None:
        """Check everything a record emitted, then keep it (BadRecord: keep none of it); a
        ``retraction`` (of an event an upstream correction took back) counts negated, and its
        output events are staged as retractions of those events (resolved by the commit)."""
        spec, topology_id = self.spec, self.spec.topology_id
        emits: list[Emit] = []
        events: list[tuple[tuple[str, str | None, str, str], str | None, str | None, bool | None]] = []
        requests = []
        n = 0
        for e in emitted:
            if isinstance(e, Request):
                requests.append(_check_request(spec, e))
                for granted, when in ((True, e.granted), (False, e.declined)):
                    for ev in when:
                        events.append((_check_event(spec, topology_id, rec, n, ev), e.decision, e.id, granted))
                        n += 1
            elif isinstance(e, OutputEvent):
                events.append((_check_event(spec, topology_id, rec, n, e), None, None, None))
                n += 1
            elif (routed := self._routed(e)) is not None:
                state_name, key, value = _check_emit(spec, routed)
                emits.append((state_name, key, -value if retraction else value))
        folded: dict[tuple[str, tuple[Any, ...]], Any] = {}
        for state_name, key, value in emits:  # the record's effect, checked whole before any of it is kept
            if state_name in spec.decided_states:
                raise ConfigError(f"state {state_name!r} is updated by a decision only: emit a Request for it")
            before = folded.get((state_name, key), self.partials[state_name].get(key))
            after = combine(self.combiners[state_name], before, value)
            if limits.field_refusal("", spec.state(state_name).value_type, after) is not None:
                raise BadRecord(f"with this record the batch's {self.combiners[state_name].value} for key {key!r} of "
                                f"state {state_name!r} would leave {spec.state(state_name).value_type}: declare "
                                "value_type='numeric' for sums that large")
            folded[(state_name, key)] = after
        for (state_name, key), value in folded.items():
            self.partials[state_name][key] = value
        for name, key, req_id, amount in requests:
            if (name, req_id) not in self._seen:
                self._seen.add((name, req_id))
                self.requests[name].append((key, len(self._seen), req_id, amount))  # _seen only grows: order
        for (output, by, eid, payload), decision, request, verdict in events:
            partition = partition_of(by or eid, self.partitions[output])  # a retraction's: its event's
            eid = f"{eid}{RETRACTED}{self.txid}" if retraction else eid
            if (output, eid) not in self._seen:
                self._seen.add((output, eid))
                self.events.append((output, partition, len(self.events), eid, payload, decision, request, verdict,
                                    retraction or self.marked))

    def _routed(self, emit: Any) -> Any:
        """``emit`` with the state the declaration routes its rows to (``spec.job_routes``); None:
        nothing keeps them."""
        if isinstance(emit, (tuple, list)) and emit and isinstance(emit[0], str) and emit[0] in self._routes:
            to = self._routes[emit[0]]
            return None if to is None else (to, *emit[1:])
        return emit

    def stage(self, coordinator: Coordinator, attempt: Attempt) -> dict[str, int]:
        counts = {name: coordinator.stage(attempt, name, ((*k, v) for k, v in rows.items()))
                  for name, rows in self.partials.items() if name not in self.spec.decided_states}
        counts.update({d: coordinator.stage_requests(attempt, d, rows) for d, rows in self.requests.items()})
        if self.spec.outputs:
            counts.update(coordinator.stage_events(attempt, self.events))
        return counts


def process_batch(coordinator: Coordinator, topology_id: str, txid: int, fn: RecordFn, *,
                  parse: Callable[[str], Any] = json.loads) -> ProcessResult:
    """Process ``txid`` once as a new attempt and mark it complete (or failed)."""
    txn = coordinator.transaction(topology_id, txid)
    if txn.empty:
        return ProcessResult(txid, None, 0, {}, 0)
    spec = coordinator.spec(topology_id)
    with coordinator.processing(topology_id, txid, application=provenance.function_digest(fn)) as run:
        batch, bad, read, crcs = _fold(coordinator, spec, run.txn, fn, parse)
        counts = batch.stage(coordinator, run.attempt)
        run.finish(counts, records_read=read, bad=bad, read_digest=read_digest(read, crcs))
    if bad:
        log.warning("topology %s txid %d: %d bad records quarantined", topology_id, txid, len(bad))
    return ProcessResult(txid, run.attempt.attempt, read, counts, len(bad))


def _fold(coordinator: Coordinator, spec: TopologySpec, txn: Transaction, fn: RecordFn, parse: Callable[[str], Any]
          ) -> tuple[_Batch, list[tuple[str, str | None, str, str | None]], int, int]:
    """Read ``txn``'s batch and keep what each record emits: (what to stage, the bad records, how
    many records were read, the sum of their offsets' CRC-32s)."""
    versions = coordinator.versions(spec.topology_id, txn.batch) if spec.source.may_retract else Versions()
    batch = _Batch(coordinator, spec, txn.txid, versions)
    bad: list[tuple[str, str | None, str, str | None]] = []
    read = crcs = 0
    for rec in coordinator.read_batch(txn):
        read += 1
        crcs += zlib.crc32(rec.offset.encode())
        if rec.offset in versions.cancelled:
            continue
        try:
            why = limits.record_refusal(rec.payload) or (
                limits.nesting_refusal(rec.payload) if parse is json.loads else None)
            if why is not None:
                raise BadRecord(why)
            if rec.retracts is not None and rec.offset not in versions.retractions:
                raise BadRecord(RETRACTION_REFUSED.format(rec.retracts))
            origin = versions.origin(rec.offset) if versions else None
            batch.add(rec if origin is None else replace(rec, event_id=origin), list(fn(parse(rec.payload))),
                      retraction=rec.offset in versions.retractions)
        except ConfigError:  # the code is wrong, not the record: every record would fail alike
            raise
        except _BAD as exc:
            reason = f"{type(exc).__name__}: {exc}"
            if spec.on_bad_record == "fail":
                raise BadRecord(f"txid {txn.txid} record at offset {rec.offset}: {reason} "
                                "(on_bad_record='fail'; use 'quarantine' to set it aside)") from exc
            bad.append((rec.offset, rec.event_id, reason[:1000], rec.payload))
    return batch, bad, read, crcs


def python_fold(coordinator: Coordinator, spec: TopologySpec, fn: RecordFn,
                parse: Callable[[str], Any] = json.loads) -> Fold:
    """The recompute engine's fold in plain Python: the batch read and folded by ``fn`` as
    :func:`process_batch` would, its states -- and its output events, when the target asks for them
    -- staged through the target's COPY statements."""
    def fold(batch: PlannedBatch, target: Target) -> Folded:
        key = target.events.prefix if target.events is not None else target.prefix
        txn = Transaction(spec.topology_id, int(key[0]) if key else 0, "", 0, {}, {}, batch, 0, "committed",
                          datetime.now(UTC), None, None)
        # As it is now: a state build's begins after this fold was made.
        folded, bad, read, crcs = _fold(coordinator, coordinator.spec(spec.topology_id), txn, fn, parse)
        for name, copy in target.states.items():  # a recomputation's target may take some of the states
            coordinator.copy_rows(copy, ((*target.prefix, *k, v) for k, v in folded.partials[name].items()))
        if target.events is not None:
            coordinator.copy_rows(target.events.copy, ((*target.events.prefix, *e) for e in folded.events))
        return Folded(len(bad), read_digest(read, crcs))

    return fold


def audit(coordinator: Coordinator, topology_id: str, fn: RecordFn, *,
          parse: Callable[[str], Any] = json.loads) -> dict[str, Any]:
    """Every state recomputed with ``fn`` from the source over the committed offsets (and the
    committed replays' records) and diffed against the tables (``core/recompute.py``'s Audit)."""
    return coordinator.recompute(Audit(topology_id), python_fold(coordinator, coordinator.spec(topology_id), fn, parse))


def rebuild(coordinator: Coordinator, topology_id: str, fn: RecordFn, *,
            parse: Callable[[str], Any] = json.loads) -> dict[str, Any]:
    """Every state recomputed with ``fn`` and swapped in while the topology keeps committing."""
    return coordinator.recompute(Rebuild(topology_id), python_fold(coordinator, coordinator.spec(topology_id), fn,
                                                                   parse))


def build(coordinator: Coordinator, topology_id: str, fn: RecordFn, *,
          parse: Callable[[str], Any] = json.loads) -> dict[str, Any]:
    """The states the DAG file added, approved: built with ``fn`` from the source's history and
    switched in at one txid while the topology keeps committing (``core/evolution.py``)."""
    return coordinator.recompute(StateBuild(topology_id), python_fold(coordinator, coordinator.spec(topology_id), fn,
                                                                      parse))


def preview(coordinator: Coordinator, topology_id: str, fn: RecordFn, first: int, last: int, *,
            parse: Callable[[str], Any] = json.loads) -> dict[str, Any]:
    """What a correction of committed txids first..last with ``fn`` would change; nothing committed."""
    spec = coordinator.spec(topology_id)
    code = provenance.code(spec.to_config(), application=provenance.function_digest(fn))
    return coordinator.recompute(CorrectionPreview(topology_id, first, last, code), python_fold(coordinator, spec, fn,
                                                                                               parse))


def verify(coordinator: Coordinator, topology_id: str, fn: RecordFn, *, budget: int = 10, every: int = 1,
           parse: Callable[[str], Any] = json.loads) -> dict[str, Any]:
    """A round of the shadow audit (``core/verify.py``) with ``fn``: each committed txid it takes
    recomputed as :func:`process_batch` would, staged under the verification attempt and judged
    against its commit. What the round found: the mark, the txids settled, each check's verdict."""
    spec = coordinator.spec(topology_id)
    code = provenance.code(spec.to_config(), application=provenance.function_digest(fn))
    return coordinator.recompute(VerificationRound(topology_id, budget, every, code),
                                 python_fold(coordinator, spec, fn, parse))
