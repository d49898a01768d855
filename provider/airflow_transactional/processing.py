"""Run one processing attempt in plain Python: read the batch, map records, stage partials.

This is the processing phase without Spark -- used by the core demo, the tests, and small
topologies. The Spark helper in ``spark_jobs/`` does the same with DataFrames. The function
may also yield :class:`OutputEvent` s for the topology's output logs. A record whose
payload does not parse, or for which the user function raises ``ValueError``, ``KeyError``,
``TypeError`` or :class:`BadRecord`, is quarantined with its offset and the reason (or fails the
attempt when the topology says ``on_bad_record="fail"``). Any other exception fails the attempt;
its staged rows are never committed.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .coordinator import Coordinator
from .exceptions import BadRecord, ConfigError
from .sources.base import Record
from .sources.eventlog import partition_of, payload_refusal
from .spec import TopologySpec
from .store.outputs import event_id
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
        why = payload_refusal(text)
        if why is not None:
            raise BadRecord(f"output event for {self.output!r}: {why}")
        return text


# A user function maps one parsed record to (state name, key tuple, value) triples, and
# output events.
Emit = tuple[str, tuple[Any, ...], Any]
RecordFn = Callable[[Any], Iterable[Emit | OutputEvent]]

_BAD = (ValueError, KeyError, TypeError, BadRecord)


@dataclass(frozen=True)
class ProcessResult:
    txid: int
    attempt: int | None  # None: the batch was empty, nothing to process
    records_read: int
    row_counts: dict[str, int]  # by state, and output events by output
    quarantined: int


def _check_emit(spec: TopologySpec, emit: Any) -> tuple[str, tuple[Any, ...], Any]:
    try:
        state_name, key, value = emit
    except (TypeError, ValueError):
        raise ConfigError(f"the record function must yield (state, key_tuple, value), got {emit!r}") from None
    state = spec.state(state_name)
    key = key if isinstance(key, tuple) else (key,)
    if len(key) != len(state.keys):
        raise ConfigError(f"state {state_name!r} has key ({', '.join(state.key_columns)}), got {key!r}")
    if any(k is None for k in key):
        raise BadRecord(f"null key for state {state_name!r}")
    return state_name, key, value


def _check_event(spec: TopologySpec, topology_id: str, rec: Record, n: int,
                 event: OutputEvent) -> tuple[str, str | None, str, str]:
    """(output, key, event id, payload) of an output event, or BadRecord."""
    spec.output(event.output)  # an unknown output is a ConfigError: the code is wrong, not the record
    origin = event.id if event.id is not None else f"{rec.event_id or rec.offset}:{n}"
    if not isinstance(origin, str) or not origin or "\x00" in origin:
        raise BadRecord(f"output event for {event.output!r}: id must be non-empty text, got {event.id!r}")
    if event.key is not None and not isinstance(event.key, str):
        raise BadRecord(f"output event for {event.output!r}: key must be text, got {event.key!r}")
    return event.output, event.key, event_id(topology_id, origin), event.text()


def process_batch(coordinator: Coordinator, topology_id: str, txid: int, fn: RecordFn, *,
                  parse: Callable[[str], Any] = json.loads) -> ProcessResult:
    """Process ``txid`` once as a new attempt and mark it complete (or failed)."""
    txn = coordinator.transaction(topology_id, txid)
    if txn.empty:
        return ProcessResult(txid, None, 0, {}, 0)
    spec = coordinator.spec(topology_id)
    with coordinator.processing(topology_id, txid) as run:
        partials: dict[str, dict[tuple[Any, ...], Any]] = {s.name: {} for s in spec.states}
        combiners = {s.name: Combiner(s.combiner) for s in spec.states}
        out = coordinator.output_staging(topology_id) if spec.outputs else None
        events: list[tuple[str, int, int | None, str, str]] = []
        event_ids: set[tuple[str, str]] = set()
        bad: list[tuple[str, str | None, str, str | None]] = []
        read = 0
        for rec in coordinator.read_batch(run.txn):
            read += 1
            try:
                emitted = list(fn(parse(rec.payload)))
                emits = [_check_emit(spec, e) for e in emitted if not isinstance(e, OutputEvent)]
                mine = [_check_event(spec, topology_id, rec, n, e)
                        for n, e in enumerate(e for e in emitted if isinstance(e, OutputEvent))]
            except ConfigError:  # the code is wrong, not the record: every record would fail alike
                raise
            except _BAD as exc:
                reason = f"{type(exc).__name__}: {exc}"
                if spec.on_bad_record == "fail":
                    raise BadRecord(f"txid {txid} record at offset {rec.offset}: {reason} "
                                    "(on_bad_record='fail'; use 'quarantine' to set it aside)") from exc
                bad.append((rec.offset, rec.event_id, reason[:1000], rec.payload))
                continue
            for state_name, key, value in emits:
                acc = partials[state_name]
                acc[key] = combine(combiners[state_name], acc.get(key), value)
            for output, by, eid, payload in mine:
                if (output, eid) in event_ids:  # the first delivery wins, as in the log itself
                    continue
                event_ids.add((output, eid))
                assert out is not None
                events.append((output, partition_of(by or eid, out.partitions[output]), len(events), eid, payload))
        counts = {name: coordinator.stage(run.attempt, name, ((*k, v) for k, v in rows.items()))
                  for name, rows in partials.items()}
        if spec.outputs:
            counts.update(coordinator.stage_events(run.attempt, events))
        run.finish(counts, records_read=read, bad=bad)
    if bad:
        log.warning("topology %s txid %d: %d bad records quarantined", topology_id, txid, len(bad))
    return ProcessResult(txid, run.attempt.attempt, read, counts, len(bad))
