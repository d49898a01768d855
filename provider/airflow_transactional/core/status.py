"""Status, recovery and audit: what a topology has committed and has in flight, discarding staged
output that can never commit (KIP-844's recover), and the pieces of a recomputation's diff."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import psycopg2.errors
import psycopg2.extensions
from psycopg2 import sql

from .. import quarantine
from ..exceptions import SourceUnreachable
from ..model import BuildProgress, InFlight, Offsets, PlannedBatch, RecoverResult, TopologyStatus, duration
from ..sources.base import Source
from ..spec import StateSpec, TopologySpec
from ..store import attempts, catalog, decisions, topologies, transactions
from ..store import commits as commit_log
from ..store import outputs as out_q
from ..store import state as q
from . import building, liveness
from . import lag as lag_
from .context import StateStore

log = logging.getLogger(__name__)

#: An in-flight txid's phase, from the status of the latest attempt of its current plan.
PHASES = {"running": "processing", "complete": "processed", "failed": "failed"}


def status(store: StateStore, topology_id: str, *, lag_wait: float | None = None) -> TopologyStatus:
    """Where ``topology_id`` stands. A Kafka source's lag is waited for ``lag_wait`` seconds at
    most (default: a view's few, :data:`.lag.WAIT`; a check that can afford it: :data:`.lag.PATIENT`),
    else it is unknown, with why."""
    with store.db.transaction() as cur:
        num, spec, committed, offsets = store.load(cur, topology_id)
        progress = topologies.progress(cur, store.schema, topology_id)
        in_flight = []
        for row in transactions.in_flight(cur, store.schema, topology_id):
            phase = PHASES.get(row.latest_status or "", "planned")
            error = row.latest_error if phase == "failed" else None
            if row.try_failure is not None and phase != "processed":  # the task failed after the attempt began
                phase, error = "failed", row.try_failure
            in_flight.append(InFlight(int(row.txid), row.run_key, phase, int(row.plan_version), int(row.attempts),
                                      error, int(row.failed_tries), row.since))
        quarantined = commit_log.quarantine_counts(cur, store.schema, topology_id)
        warning = quarantine.rising(*commit_log.recent_quarantine(cur, store.schema, topology_id, quarantine.RECENT),
                                    spec.max_quarantined)
        mark = topologies.rebuild_mark(cur, store.schema, topology_id)
        built = (building.progress(cur, store.schema, num, int(mark.rebuild_from_txid or 0), catalog.now(cur))
                 if mark.state_build else None)
        if not spec.source.remote:
            lag, lag_seconds, source_error, lag_bytes = _local_lag(spec.source, cur, store.schema, topology_id,
                                                                   offsets)
    if spec.source.remote:  # asked of another server: outside the transaction, briefly, kept a while
        lag, lag_seconds, source_error, lag_bytes = lag_.remote(spec.source, topology_id, offsets, wait=lag_wait)
    blocked = liveness.blocker(store, topology_id, committed + 2)
    nxt = next((f for f in in_flight if f.txid == committed + 1), None)
    if blocked is None and nxt is not None and nxt.phase == "failed":
        blocked = (f"blocked by failed txid {nxt.txid} (run {nxt.run_key}): {nxt.error}; clear or "
                   "backfill that run to process it again (Airflow retries it first if retries are left)")
    st = TopologyStatus(topology_id, committed, offsets, progress.last_commit_at, in_flight, int(lag),
                        blocked, int(quarantined.committed), int(quarantined.pending), int(progress.lost_records),
                        lag_seconds, source_error, lag_unit=spec.source.lag_unit,
                        offsets_skipped=int(progress.offsets_skipped), lag_bytes=lag_bytes,
                        quarantine_warning=warning, evolving=_evolving(spec, mark, built), build_progress=built)
    stall = None if blocked else liveness.stalled(st, spec.stall_after_seconds, datetime.now(UTC))
    return replace(st, blocked_by=stall, stalled=True) if stall else st  # nothing failed, and nothing moves


def _evolving(spec: TopologySpec, mark: topologies.RebuildMark, built: BuildProgress | None) -> str | None:
    """States the DAG file added or redefined, in a line: being built (from which history), declared
    (waiting), retiring."""
    parts = []
    if spec.building:
        names = ", ".join(s.shown for s in spec.building)
        parts.append(f"building {names} (" + (f"{building_text(mark.rebuild_from_txid, built)}; the commits stage "
                                               "it meanwhile)" if mark.state_build else
                                               f"its build stopped: 'airflow-txn evolve {spec.topology_id} "
                                               "--approve' takes it up)"))
    if spec.retiring:
        parts.append(f"retiring {', '.join(spec.retiring)} (kept until approved: 'airflow-txn evolve "
                     f"{spec.topology_id} --approve')")
    if spec.declared:
        parts.append(f"declared {', '.join(s.shown for s in spec.declared)} (not kept until approved: "
                     f"'airflow-txn evolve {spec.topology_id} --approve')")
    return "; ".join(parts) or None


def building_text(through: int | None, built: BuildProgress | None) -> str:
    """``folding txids 1..M``, and how far: ``txid k of M, ETA``."""
    text = f"folding txids 1..{through} of the source's history"
    if built is not None:
        text += (f": through txid {built.through_txid} of {built.of_txid}, {built.records:,} of "
                 f"{built.of_records:,} records")
        if built.eta_seconds is not None:
            text += f", ETA {duration(built.eta_seconds)}"
    return text


def ask_lags(store: StateStore, topology_ids: Sequence[str]) -> None:
    """Begin asking the lag of each of ``topology_ids`` whose source is remote, all at once and
    without waiting: a view of many topologies then waits about as long as the slowest, not the
    sum (:func:`status` takes each answer, or waits for what is left of its time)."""
    try:
        with store.db.transaction() as cur:
            asks = [(spec.source, t, offsets) for t in topology_ids
                    for _num, spec, _committed, offsets in [store.load(cur, t)] if spec.source.remote]
    except Exception as exc:  # only a head start: each status asks, and says what fails, itself
        log.warning("the lags of %s could not be asked ahead: %s", ", ".join(topology_ids), exc)
        return
    for source, topology_id, offsets in asks:
        lag_.remote(source, topology_id, offsets, wait=0)


def _local_lag(source: Source, cur: psycopg2.extensions.cursor, schema: str, topology_id: str,
               offsets: Offsets) -> lag_.Lag:
    """The lag of a source the state store holds (a log, a directory's files)."""
    try:
        lag, size = source.waiting(cur, schema, topology_id, offsets)
        return lag_.Lag(lag, source.lag_seconds(cur, schema, topology_id, offsets) if lag else 0.0, bytes=size)
    except SourceUnreachable as exc:  # the rest of the status still stands; the lag is unknown
        return lag_.Lag(0, None, str(exc))


def recover(store: StateStore, topology_id: str) -> RecoverResult:
    """Discard staged output that can never be committed; safe to run at any time.

    Kept: rows of running attempts and of the latest complete attempt of each uncommitted
    txid's current plan (and a pinned attempt). Everything else -- failed, discarded,
    superseded, outdated-plan, committed-txid and orphaned rows -- is deleted.
    """
    result = RecoverResult()
    with store.db.transaction() as cur:
        num, spec, _committed, _o = store.load(cur, topology_id, lock=True)
        result.attempts_discarded = attempts.discard_superseded(cur, store.schema, topology_id)
        staged = [(s.name, store.staging(num, s)) for s in spec.states]
        staged += [(f"requests of {d.name}", store.decision_staging(num, d)) for d in spec.decisions]
        staged += [(f"request runs of {d.name}", store.decision_runs(num, d)) for d in spec.decisions]
        if spec.outputs:
            staged.append(("output events", store.out_staging(num)))
        for name, staging in staged:
            deleted = attempts.delete_unusable_staged(cur, store.schema, staging, topology_id)
            if deleted:
                result.details.append(f"{name}: {deleted} staged rows")
            result.staged_rows_deleted += deleted
        result.quarantine_rows_deleted = commit_log.delete_orphan_quarantine(cur, store.schema, topology_id)
    if result.staged_rows_deleted or result.attempts_discarded:
        log.info("topology %s: recover discarded %d attempts and %d staged rows", topology_id,
                 result.attempts_discarded, result.staged_rows_deleted)
    return result


def verdicts(store: StateStore, topology_id: str, decision: str,
             request_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The verdicts of ``decision`` on ``request_ids``, by request id (absent: not decided yet)."""
    with store.db.transaction() as cur:
        store.load(cur, topology_id)[1].decision(decision)  # names the decisions for a wrong name
        return decisions.verdicts(cur, store.schema, topology_id, decision, list(request_ids))


def commits(store: StateStore, topology_id: str, txid: int | None = None) -> list[dict[str, Any]]:
    """The audit log of a topology, in txid order (only ``txid``'s entry, if given)."""
    with store.db.transaction() as cur:
        store.load(cur, topology_id)  # UnknownTopology, not an empty log, for a wrong name
        return [entry._asdict() for entry in commit_log.log(cur, store.schema, topology_id, txid)]


def topology_num(store: StateStore, cur: psycopg2.extensions.cursor, topology_id: str) -> int:
    return store.load(cur, topology_id)[0]


def committed_batch(store: StateStore, topology_id: str, through_txid: int | None = None
                    ) -> tuple[PlannedBatch, str | None]:
    """A batch covering everything committed (through ``through_txid``), or why it cannot be
    recomputed from the source."""
    with store.db.transaction() as cur:
        _num, spec, committed, offsets = store.load(cur, topology_id)
        if through_txid is not None and through_txid != committed:
            offsets = commit_log.end_offsets(cur, store.schema, topology_id, through_txid) or {}
        lost = transactions.lost_ranges(cur, store.schema, topology_id,
                                        committed if through_txid is None else through_txid)
        return spec.source.committed_batch(cur, store.schema, topology_id, offsets, lost)


def audit_tables(store: StateStore, topology_id: str, *, outputs: bool = False) -> tuple[int, dict[str, str]]:
    """Create a fresh table per state for an audit's recomputation; (topology number, the COPY
    statement that loads each, by state) -- the number is what :func:`diff_audit` takes. With
    ``outputs`` (a correction's preview) one more for the output events, its COPY under the key
    ``""`` (rows of :data:`~..store.outputs.COLUMNS`)."""
    with store.db.transaction() as cur:
        num, spec, _c, _o = store.load(cur, topology_id)
        if outputs and spec.outputs:
            table = out_q.preview_table(store.schema, num)
            catalog.drop(cur, table, if_exists=True)
            cur.execute(out_q.create_staging_table(table))
            copies = {"": q.copy_into(table, list(out_q.COLUMNS), csv=True).as_string(cur)}
        else:
            copies = {}
    for state in spec.recomputable_states:
        table = create_audit_table(store, num, state)
        with store.db.transaction() as cur:
            copies[state.name] = q.copy_into(table, [*state.key_columns, "value"], csv=True).as_string(cur)
    return num, copies


def create_audit_table(store: StateStore, num: int, state: StateSpec) -> sql.Composed:
    table = q.audit_table(store.schema, num, state)
    with store.db.transaction() as cur:
        for stmt in q.create_audit_table(table, state):
            cur.execute(stmt)
    return table


def diff_audit(store: StateStore, topology_id: str, num: int, committed_txid: int, samples: int = 10
               ) -> dict[str, Any] | None:
    """Diff the recomputed states against the state tables, holding commits off meanwhile.

    Returns None when a commit landed since ``committed_txid`` (recompute and try again).
    """
    with store.db.transaction() as cur:
        if topologies.committed_txid_shared(cur, store.schema, topology_id) != committed_txid:
            return None
        spec = store.load(cur, topology_id)[1]
        result: dict[str, Any] = {"topology": topology_id, "auditable": True,
                                  "committed_txid": committed_txid, "differences": 0,
                                  "states": {}, "samples": []}
        for state in spec.recomputable_states:
            table = q.audit_table(store.schema, num, state)
            cur.execute(q.audit_diff(state, table))
            rows = cur.fetchall()
            result["states"][state.name] = {"keys": catalog.count(cur, table), "differences": len(rows)}
            result["differences"] += len(rows)
            result["samples"] += [f"{state.name}[{k}]: stored {s}, recomputed {r}" for k, s, r in rows[:samples]]
            catalog.drop(cur, table)
    return result
