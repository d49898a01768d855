"""Processing attempts: begin one (re-planning an opaque batch that became unreadable), stage
partial results and bad records under (txid, attempt), finish or fail it. Staged output never
touches the state tables: only the commit does (KIP-844's uncommitted writes kept apart)."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from .. import provenance
from ..exceptions import (
    BatchUnavailable,
    ConfigError,
    SourceChanged,
    StaleAttempt,
)
from ..limits import QUARANTINE_RECORD_CHARS, printable
from ..model import (
    VERIFY_ATTEMPT,
    Attempt,
    OutputStaging,
    PlannedBatch,
    ReplayBatch,
    StagedEvent,
    Transaction,
    failure_text,
)
from ..sources.base import Record, Versions
from ..store import attempts, commits, decisions, outputs, transactions
from ..store import corrections as cq
from ..store import logs as event_logs
from ..store import state as q
from ..store.attempts import Finished
from ..store.connection import Database
from ..store.copy import copy_line, csv_line
from ..store.rows import Cursor
from . import corrections, planning, replays
from .context import StateStore

log = logging.getLogger(__name__)


def begin_attempt(store: StateStore, topology_id: str, txid: int, *, application: str | None = None,
                  dag_version: str | None = None) -> tuple[Attempt, Transaction]:
    """Start a processing attempt of ``txid``; re-plans first if its batch became unreadable
    and the topology is opaque. Raises UnknownTransaction, BatchUnavailable, and
    StaleAttempt when the txid is already committed (nothing to process). ``application`` (its
    file's digest) and ``dag_version`` go into the attempt's code record (:mod:`..provenance`)."""
    with store.db.transaction() as cur:
        _num, spec, _c, _o = store.load(cur, topology_id)
        txn = store.txn(cur, topology_id, txid)
        if txn.committed:
            raise StaleAttempt(f"txid {txid} of topology {topology_id!r} is already committed "
                               f"(at {txn.committed_at}); nothing to process")
        reason = None if txn.pinned_attempt or isinstance(txn.batch, ReplayBatch) else spec.source.unavailable(
            cur, store.schema, topology_id, txn.batch)
    if reason:
        if txn.corrects:
            raise BatchUnavailable(f"topology {topology_id!r} txid {txid} corrects txids {txn.corrects['txids']}, "
                                   f"whose records can no longer be read ({reason}): restore them, or withdraw the "
                                   f"correction ('airflow-txn correct {topology_id} --withdraw {txid}')")
        if not spec.opaque:
            raise BatchUnavailable(
                f"topology {topology_id!r} txid {txid}: the planned batch can no longer be read "
                f"({reason}). The source is transactional: {spec.source.way_back()}, or declare the "
                "topology opaque=True so the batch is re-planned from the committed checkpoint")
        planning.replan(store, topology_id, txid, reason)
    with store.db.transaction() as cur:
        txn = store.txn(cur, topology_id, txid, lock=True)
        number = attempts.next_number(cur, store.schema, topology_id, txid)
        transactions.lift_failed(cur, store.schema, topology_id, txid)
        code = provenance.code(spec.to_config(), application=application, dag_version=dag_version)
        attempts.insert(cur, store.schema, topology_id, txid, number, txn.plan_version, store.worker, code)
    return Attempt(topology_id, txid, number, txn.plan_version), txn


class AttemptRun:
    """A processing attempt under way (see :func:`processing`)."""

    def __init__(self, store: StateStore, attempt: Attempt, txn: Transaction) -> None:
        self.store, self.attempt, self.txn = store, attempt, txn

    def finish(self, row_counts: Mapping[str, int], *, records_read: int,
               bad: Iterable[tuple[str, str | None, str, str | None]] = (), quarantined: int | None = None,
               read_digest: str | None = None) -> None:
        """End the attempt well: check its batch is still whole, quarantine ``bad`` records
        ``(offset, event_id, reason, raw)``, and mark it complete with what it staged.
        ``quarantined`` counts bad records set aside otherwise too (a Spark job streams them);
        ``read_digest`` says which records it read (:func:`..model.read_digest`)."""
        check_still_readable(self.store, self.attempt.topology_id, self.txn)
        n_bad = quarantine(self.store, self.attempt, bad)
        finish_attempt(self.store, self.attempt, row_counts, records_read=records_read,
                       quarantined=n_bad if quarantined is None else quarantined, read_digest=read_digest)


@contextmanager
def processing(store: StateStore, topology_id: str, txid: int, *, application: str | None = None,
               dag_version: str | None = None) -> Iterator[AttemptRun]:
    """The life of one processing attempt, for every processor (the Spark helper, the pure-Python one):
    begun here; the body stages its output and calls :meth:`AttemptRun.finish`; any exception
    fails the attempt -- its staged rows can then never be committed -- and goes on up."""
    attempt, txn = begin_attempt(store, topology_id, txid, application=application, dag_version=dag_version)
    try:
        yield AttemptRun(store, attempt, txn)
    except BaseException as exc:
        fail_attempt(store, attempt, failure_text(exc))
        raise


def check_still_readable(store: StateStore, topology_id: str, txn: Transaction) -> None:
    """Raise BatchUnavailable if retention removed part of ``txn``'s batch.

    Called after an attempt has read its whole batch: retention only ever moves forward, so
    a batch still whole now was whole while it was read -- no silently short attempt.
    """
    if isinstance(txn.batch, ReplayBatch):
        return  # its records are in the quarantine, taken by it: no retention reaches them
    with store.db.transaction() as cur:
        spec = store.load(cur, topology_id)[1]
        reason = spec.source.unavailable(cur, store.schema, topology_id, txn.batch)
    if reason:
        raise BatchUnavailable(f"topology {topology_id!r} txid {txn.txid}: the batch lost records while "
                               f"it was processed ({reason}); this attempt is void -- processing it again "
                               "re-plans it (opaque topologies) or fails naming the loss")


def read_batch(store: StateStore, txn: Transaction) -> Iterator[Record]:
    """Read a transaction's batch from its source, in source order (a replay's from the quarantine)."""
    if isinstance(txn.batch, ReplayBatch):
        yield from replays.read(store, txn)
        return
    with store.db.transaction() as cur:
        _num, spec, _c, _o = store.load(cur, txn.topology_id)
    reader = Database(store.db.dsn, application_name="airflow_transactional:read")
    try:
        with reader.transaction() as cur:
            yield from spec.source.read(cur, store.schema, txn.topology_id, txn.batch)
    finally:
        reader.close()


def versions(store: StateStore, topology_id: str, batch: PlannedBatch) -> Versions:
    """The retractions and versions of an upstream correction among ``batch``'s records (of a
    replay, among those it took): the processing applies them (:class:`~..sources.base.Versions`).
    ConfigError naming why when the topology cannot (its upstream's correction refuses that case;
    a redeclaration since can)."""
    with store.db.transaction() as cur:
        spec = store.load(cur, topology_id).spec
        found = (Versions.of(cq.replay_versions(cur, store.schema, topology_id, list(batch.replay)))
                 if isinstance(batch, ReplayBatch) else spec.source.versions(cur, store.schema, batch))
    why = corrections.retraction_refusal(spec) if found else None
    if why:
        raise ConfigError(f"topology {topology_id!r}: its batch holds {len(found.retractions)} retractions of upstream "
                          f"events (an upstream topology's correction), which it cannot apply: {why}. A topology "
                          "reading a corrected log keeps sum and count states, without decisions "
                          "(docs/guides/corrections.md)")
    return found


def stage(store: StateStore, attempt: Attempt, state_name: str, rows: Iterable[Sequence[Any]]) -> int:
    """COPY partial results ``(key..., value)`` of one state into staging; returns the count."""
    with store.db.transaction() as cur:
        num, spec, _c, _o = store.load(cur, attempt.topology_id)
        state = spec.state(state_name)
        width = len(state.keys) + 1
        buf = io.StringIO()
        n = 0
        prefix = f"{attempt.txid}\t{attempt.attempt}\t"
        for row in rows:
            if len(row) != width:
                raise ConfigError(f"state {state_name!r} rows have {width} fields "
                                  f"({', '.join(state.key_columns)}, value), got {len(row)}: {row!r}")
            buf.write(prefix + copy_line(row))
            n += 1
        buf.seek(0)
        table = store.staging_of(num, state, attempt.attempt)
        cur.copy_expert(q.copy_into(table, q.staging_columns(state)).as_string(cur), buf)
    return n


def copy_rows(store: StateStore, copy: str, rows: Iterable[Sequence[Any]]) -> int:
    """COPY ``rows`` through ``copy`` -- a ``COPY ... FROM STDIN WITH (FORMAT csv)`` this store made
    for a recomputation's target, as Spark's executors are handed -- in one transaction; the count."""
    if not copy.startswith("COPY ") or "FORMAT csv" not in copy:
        raise ConfigError(f"not a COPY of a recomputation's target: {copy[:80]!r}")
    buf = io.StringIO()
    n = 0
    for row in rows:
        buf.write(csv_line(row))
        n += 1
    if n:
        buf.seek(0)
        with store.db.transaction() as cur:
            cur.copy_expert(copy, buf)
    return n


def quarantine(store: StateStore, attempt: Attempt, records: Iterable[tuple[str, str | None, str, str | None]]) -> int:
    """Record bad records ``(offset, event_id, reason, raw)`` of an attempt; the raw text is kept
    up to :data:`QUARANTINE_RECORD_CHARS` characters, with its full length."""
    rows = [(attempt.topology_id, attempt.txid, attempt.attempt, printable(offset),
             None if event_id is None else printable(event_id), printable(reason[:2000]),
             None if raw is None else printable(raw[:QUARANTINE_RECORD_CHARS]), None if raw is None else len(raw))
            for offset, event_id, reason, raw in records]
    if not rows:
        return 0
    with store.db.transaction() as cur:
        commits.insert_quarantined(cur, store.schema, rows)
    return len(rows)


def quarantine_copy(store: StateStore) -> str:
    """The COPY statement (CSV) that streams bad records of an attempt into the quarantine: columns
    topology_id, txid, attempt, source_offset, event_id, reason, record, record_length."""
    with store.db.transaction() as cur:
        return commits.quarantine_copy(cur, store.schema)


def staging_copies(store: StateStore, topology_id: str, *, verify: bool = False) -> dict[str, str]:
    """The COPY statement (CSV) that stages each state's partials (txid, attempt, keys..., value), by
    state; with ``verify``, a round of the shadow audit's (into its own tables)."""
    attempt = VERIFY_ATTEMPT if verify else 0
    with store.db.transaction() as cur:
        num, spec, _c, _o = store.load(cur, topology_id)
        states = spec.states if verify else (*spec.states, *spec.building)  # a state being built is staged too
        return {s.name: q.copy_into(store.staging_of(num, s, attempt), q.staging_columns(s), csv=True).as_string(cur)
                for s in states}


def output_staging(store: StateStore, topology_id: str, *, verify: bool = False) -> OutputStaging:
    """The COPY statements (CSV) that stage output events and requests, and each output's partitions;
    with ``verify``, the events' COPY is a round of the shadow audit's (into its own table)."""
    with store.db.transaction() as cur:
        num, spec, _c, _o = store.load(cur, topology_id)
        requests = {d.name: q.copy_into(store.decision_staging(num, d), decisions.columns(spec.state(d.state)),
                                        csv=True).as_string(cur) for d in spec.decisions}
        if not spec.outputs:
            return OutputStaging("", {}, requests)
        logs = event_logs.partition_counts(cur, store.schema, [o.log_name for o in spec.outputs])
        table = store.out_staging_of(num, VERIFY_ATTEMPT if verify else 0)
        return OutputStaging(q.copy_into(table, list(outputs.COLUMNS), csv=True).as_string(cur),
                             {o.name: logs[o.log_name] for o in spec.outputs}, requests)


def stage_events(store: StateStore, attempt: Attempt, events: Iterable[StagedEvent]) -> dict[str, int]:
    """COPY output events of an attempt into staging; the count by output (every declared
    output, 0 when it got none)."""
    with store.db.transaction() as cur:
        num, spec, _c, _o = store.load(cur, attempt.topology_id)
        counts = dict.fromkeys((o.name for o in spec.outputs), 0)
        buf = io.StringIO()
        for event in events:
            if event[0] not in counts:
                spec.output(event[0])  # names the declared outputs
            buf.write(copy_line((attempt.txid, attempt.attempt, *event)))
            counts[event[0]] += 1
        if any(counts.values()):
            buf.seek(0)
            table = store.out_staging_of(num, attempt.attempt)
            cur.copy_expert(q.copy_into(table, list(outputs.COLUMNS)).as_string(cur), buf)
    return counts


def stage_requests(store: StateStore, attempt: Attempt, decision: str,
                   rows: Iterable[tuple[tuple[Any, ...], int, str, Any]]) -> int:
    """COPY requests ``(key, seq, request id, amount)`` of one decision into staging; the count."""
    with store.db.transaction() as cur:
        num, spec, _c, _o = store.load(cur, attempt.topology_id)
        d = spec.decision(decision)
        buf = io.StringIO()
        n = 0
        for key, seq, request, amount in rows:
            buf.write(copy_line((attempt.txid, attempt.attempt, *key, seq, request, amount)))
            n += 1
        buf.seek(0)
        staging = q.copy_into(store.decision_staging(num, d), decisions.columns(spec.state(d.state)))
        cur.copy_expert(staging.as_string(cur), buf)
    return n


def finish_attempt(store: StateStore, attempt: Attempt, row_counts: Mapping[str, int], *,
                   records_read: int, quarantined: int = 0, read_digest: str | None = None) -> None:
    """Mark an attempt complete with what it staged; refused if it was discarded meanwhile, or if
    it read other records than the first complete attempt of its plan (a transactional topology)."""
    with store.db.transaction() as cur:
        if not attempts.complete(cur, store.schema, attempt.topology_id, attempt.txid, attempt.attempt,
                                 row_counts, records_read, quarantined, read_digest):
            raise StaleAttempt(
                f"attempt {attempt.attempt} of txid {attempt.txid} ({attempt.topology_id}) can no "
                "longer complete: the txid was re-planned, committed, or the attempt was discarded; "
                "its output will not be committed (process the txid again if it is uncommitted)")
        num, spec, committed, _o = store.load(cur, attempt.topology_id)
        if read_digest is not None:
            _same_records(store, cur, attempt, read_digest, opaque=spec.opaque)
        for d in spec.decisions:  # recorded now, in parallel with other txids, so the commit is per key
            decisions.prepare(cur, store.schema, attempt.topology_id, d, spec.state(d.state),
                              store.decision_staging(num, d), store.decision_runs(num, d), attempt.txid,
                              attempt.attempt, int(committed))


def _same_records(store: StateStore, cur: Cursor, attempt: Attempt, digest: str, *, opaque: bool) -> None:
    """Refuse an attempt that read other records than the first complete attempt of its plan (a
    transactional topology's batch is fixed); an opaque one takes the batch as it is now."""
    fixed = transactions.fix_digest(cur, store.schema, attempt.topology_id, attempt.txid, attempt.plan_version,
                                    digest)
    if fixed is None or fixed == digest:
        return
    if opaque:
        log.warning("topology %s txid %d: attempt %d read other records than an earlier attempt of the same plan "
                    "(%s, was %s): the source changed under the plan; an opaque topology takes the batch as it is "
                    "now", attempt.topology_id, attempt.txid, attempt.attempt, digest, fixed)
        transactions.take_digest(cur, store.schema, attempt.topology_id, attempt.txid, attempt.plan_version, digest)
        return
    raise SourceChanged(
        f"topology {attempt.topology_id!r} txid {attempt.txid}: attempt {attempt.attempt} read other records than "
        f"an earlier attempt of the same plan (records:offset-CRC sum {digest}, was {fixed}): the source changed "
        "under the plan (a compacted or truncated topic). A transactional topology commits only a batch that reads "
        "the same every time: stop compaction on its source, or declare it opaque=True")


def fail_attempt(store: StateStore, attempt: Attempt, error: str) -> None:
    """Mark an attempt failed, with ``error`` (one line) as why."""
    with store.db.transaction() as cur:
        attempts.fail(cur, store.schema, attempt.topology_id, attempt.txid, attempt.attempt, error)


def latest_complete_attempt(store: StateStore, topology_id: str, txid: int) -> Finished | None:
    """(attempt, finished_at) of the latest complete attempt of the current plan, if any."""
    with store.db.transaction() as cur:
        return attempts.latest_finished(cur, store.schema, topology_id, txid)
