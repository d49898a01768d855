"""Run one processing attempt in plain Python: read the batch, map records, stage partials.

This is the processing phase without Spark -- used by the core demo, the tests, and small
topologies. The Spark helper in ``spark_jobs/`` does the same with DataFrames. A record whose
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
from .spec import TopologySpec
from .values import Combiner, combine

log = logging.getLogger(__name__)

# A user function maps one parsed record to (state name, key tuple, value) triples.
Emit = tuple[str, tuple[Any, ...], Any]
RecordFn = Callable[[Any], Iterable[Emit]]

_BAD = (ValueError, KeyError, TypeError, BadRecord)


@dataclass(frozen=True)
class ProcessResult:
    txid: int
    attempt: int | None  # None: the batch was empty, nothing to process
    records_read: int
    row_counts: dict[str, int]
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
        bad: list[tuple[str, str | None, str, str | None]] = []
        read = 0
        for rec in coordinator.read_batch(run.txn):
            read += 1
            try:
                emits = [_check_emit(spec, e) for e in fn(parse(rec.payload))]
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
        counts = {name: coordinator.stage(run.attempt, name, ((*k, v) for k, v in rows.items()))
                  for name, rows in partials.items()}
        run.finish(counts, records_read=read, bad=bad)
    if bad:
        log.warning("topology %s txid %d: %d bad records quarantined", topology_id, txid, len(bad))
    return ProcessResult(txid, run.attempt.attempt, read, counts, len(bad))
