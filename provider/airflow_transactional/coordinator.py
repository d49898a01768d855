"""The coordinator: the one front of the transaction core (plan, attempts, commit, status).

The life of a transaction (Storm's design 3), and where each step lives in ``core/``:

1. ``plan(topology, run_key)`` gives the run the next txid and fixes its batch as exact source
   offsets starting where the previous txid's batch ended -- once: the same run key always gets
   the same txid and the same stored batch (``core/planning.py``).
2. ``begin_attempt`` / ``stage`` / ``finish_attempt``: a processing attempt (any number may run,
   for many txids at once) writes partial results to staging tables keyed by (txid, attempt),
   never to the state tables (``core/attempts.py``).
3. ``commit(topology, txid)``: ONE database transaction that locks the topology row, checks
   ``txid == committed_txid + 1``, verifies the staged output of the latest complete attempt,
   applies it to every state table under the value rules, advances the checkpoint, writes the
   audit row and drops the staged rows (``core/commit.py``, to be read top to bottom).
4. ``recover``: discards staged output that can never be committed (KIP-844's recover), and
   ``status`` says where a topology stands (``core/status.py``); ``blocker`` says which failed
   txid stops it (``core/liveness.py``).

Every method here is one call into ``core``; the Airflow operators, the Spark helper, the CLI
and users call these, never ``core`` directly.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

from .connections import Connections
from .core import (
    attempts,
    commit,
    commit_external,
    liveness,
    planning,
    publish,
    rebuild,
    registration,
    status,
    views,
)
from .core.context import StateStore
from .core.lag import PATIENT as PATIENT_LAG_WAIT
from .core.publish import Publication
from .model import (
    DEFAULT_SCHEMA,
    Attempt,
    CommitResult,
    PlannedRun,
    RecoverResult,
    TopologyStatus,
    Transaction,
)
from .sources.base import Record
from .spec import TopologySpec
from .store import catalog
from .store.attempts import Finished
from .store.connection import Database

__all__ = ["PATIENT_LAG_WAIT", "Coordinator"]


class Coordinator:
    """Plans, attempts, commits and status of the topologies kept in one state store.

    ``dsn`` is the store's database; ``external_dsns`` maps the ``database`` names used by
    states kept elsewhere to their DSNs (never stored, never logged).
    """

    def __init__(self, dsn: str, *, schema: str = DEFAULT_SCHEMA, external_dsns: Mapping[str, str] | None = None,
                 worker: str | None = None, connections: Connections | None = None) -> None:
        self.store = StateStore(dsn, schema=schema, external_dsns=external_dsns, worker=worker,
                                connections=connections)

    @property
    def db(self) -> Database:
        """The store's connection: for the core's own callers (tests, the benchmarks); the CLI, the
        operators and the Spark job use the methods below."""
        return self.store.db

    @property
    def dsn(self) -> str:
        """The state store's DSN, for a process this one starts (a Spark driver): never logged."""
        return self.store.db.dsn

    def ping(self) -> str:
        """The server's version string (a connection test)."""
        with self.store.db.transaction() as cur:
            return catalog.server_version(cur)

    @property
    def schema(self) -> str:
        return self.store.schema

    @property
    def worker(self) -> str:
        return self.store.worker

    def close(self) -> None:
        self.store.close()

    def migrate(self) -> list[int]:
        return registration.migrate(self.store)

    def register(self, spec: TopologySpec) -> None:
        """Create or update a topology, its state and staging tables (idempotent)."""
        return registration.register(self.store, spec)

    def reset(self, topology_id: str) -> registration.Reset:
        """Forget a topology's progress and drop the tables its registration made."""
        return registration.reset(self.store, topology_id)

    def grant(self, *, runtime_role: str, producer_role: str | None = None, logs: Sequence[str] = (),
              apply: bool = True) -> list[str]:
        """Grant the run-time role (and a producer of ``logs``) what they need and no more; the SQL."""
        return registration.grant(self.store, runtime_role=runtime_role, producer_role=producer_role, logs=logs,
                                  apply=apply)

    def topologies(self) -> list[TopologySpec]:
        """Every topology registered in this store, by id."""
        return registration.topologies(self.store)

    def spec(self, topology_id: str) -> TopologySpec:
        return registration.spec(self.store, topology_id)

    def plan(self, topology_id: str, run_key: str) -> Transaction:
        """The transaction of ``run_key``: planned now if new, else the stored one, unchanged."""
        return planning.plan(self.store, topology_id, run_key)

    def transaction(self, topology_id: str, txid: int) -> Transaction:
        return planning.transaction(self.store, topology_id, txid)

    def transaction_for_run(self, topology_id: str, run_key: str) -> Transaction | None:
        return planning.transaction_for_run(self.store, topology_id, run_key)

    def replan(self, topology_id: str, from_txid: int, reason: str) -> list[int]:
        """Re-plan ``from_txid`` and every later uncommitted txid from the committed checkpoint."""
        return planning.replan(self.store, topology_id, from_txid, reason)

    def begin_attempt(self, topology_id: str, txid: int) -> tuple[Attempt, Transaction]:
        return attempts.begin_attempt(self.store, topology_id, txid)

    def processing(self, topology_id: str, txid: int) -> AbstractContextManager[attempts.AttemptRun]:
        """One processing attempt of ``txid``: ``with coordinator.processing(t, txid) as run: ...
        run.finish(counts, records_read=n)``; an exception fails the attempt."""
        return attempts.processing(self.store, topology_id, txid)

    def check_still_readable(self, topology_id: str, txn: Transaction) -> None:
        """Raise BatchUnavailable if retention removed part of ``txn``'s batch."""
        return attempts.check_still_readable(self.store, topology_id, txn)

    def read_batch(self, txn: Transaction) -> Iterator[Record]:
        """Read a transaction's batch from its source, in source order."""
        return attempts.read_batch(self.store, txn)

    def stage(self, attempt: Attempt, state_name: str, rows: Iterable[Sequence[Any]]) -> int:
        """COPY partial results ``(key..., value)`` of one state into staging; returns the count."""
        return attempts.stage(self.store, attempt, state_name, rows)

    def stage_events(self, attempt: Attempt, events: Iterable[attempts.StagedEvent]) -> dict[str, int]:
        """COPY output events of an attempt into staging; the count by output."""
        return attempts.stage_events(self.store, attempt, events)

    def stage_requests(self, attempt: Attempt, decision: str,
                       rows: Iterable[tuple[tuple[Any, ...], int, str, Any]]) -> int:
        """COPY requests ``(key, seq, request id, amount)`` of one decision into staging; the count."""
        return attempts.stage_requests(self.store, attempt, decision, rows)

    def output_staging(self, topology_id: str) -> attempts.OutputStaging:
        """The COPY statements (CSV) that stage output events and requests, and each output's partitions."""
        return attempts.output_staging(self.store, topology_id)

    def verdicts(self, topology_id: str, decision: str, request_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """The verdicts of ``decision`` on ``request_ids``, by request id (absent: not decided yet)."""
        return status.verdicts(self.store, topology_id, decision, request_ids)

    def quarantine(self, attempt: Attempt, records: Iterable[tuple[str, str | None, str, str | None]]) -> int:
        """See :func:`core.attempts.quarantine`."""
        return attempts.quarantine(self.store, attempt, records)

    def quarantine_copy(self) -> str:
        """The COPY statement that streams an attempt's bad records into the quarantine."""
        return attempts.quarantine_copy(self.store)

    def staging_copies(self, topology_id: str) -> dict[str, str]:
        """The COPY statement that stages each state's partials, by state name."""
        return attempts.staging_copies(self.store, topology_id)

    def audit_tables(self, topology_id: str) -> tuple[int, dict[str, str]]:
        """Fresh tables for an audit's recomputation: (topology number, COPY statement by state)."""
        return status.audit_tables(self.store, topology_id)

    def finish_attempt(self, attempt: Attempt, row_counts: Mapping[str, int], *,
                   records_read: int, quarantined: int = 0) -> None:
        """Mark an attempt complete with what it staged; refused if it was discarded meanwhile."""
        return attempts.finish_attempt(self.store, attempt, row_counts, records_read=records_read,
                                       quarantined=quarantined)

    def fail_attempt(self, attempt: Attempt, error: str) -> None:
        return attempts.fail_attempt(self.store, attempt, error)

    def latest_complete_attempt(self, topology_id: str, txid: int) -> Finished | None:
        """(attempt, finished_at) of the latest complete attempt of the current plan, if any."""
        return attempts.latest_complete_attempt(self.store, topology_id, txid)

    def retrying(self, topology_id: str, txid: int) -> None:
        return liveness.retrying(self.store, topology_id, txid)

    def planned_runs(self, topology_id: str) -> list[PlannedRun]:
        """(txid, run key) of every planned, uncommitted txid, lowest first."""
        return liveness.planned_runs(self.store, topology_id)

    def first_pending(self, topology_id: str, before_txid: int) -> PlannedRun | None:
        return liveness.first_pending(self.store, topology_id, before_txid)

    def adopt(self, topology_id: str, txid: int, old_run_key: str, new_run_key: str) -> Transaction | None:
        return planning.adopt(self.store, topology_id, txid, old_run_key, new_run_key)

    def mark_failed(self, topology_id: str, txid: int, reason: str) -> None:
        """Record that ``txid`` failed for good (no retries left), so later commits fail fast."""
        return liveness.mark_failed(self.store, topology_id, txid, reason)

    def note_failed_try(self, topology_id: str, txid: int, reason: str) -> None:
        """A try of ``txid``'s processing failed (Airflow may retry it); ``reason`` in one line."""
        return liveness.note_failed_try(self.store, topology_id, txid, reason)

    def last_error(self, topology_id: str, txid: int) -> str | None:
        """How the latest attempt of ``txid`` failed, in one line (None: it did not)."""
        return liveness.last_error(self.store, topology_id, txid)

    def blocker(self, topology_id: str, txid: int) -> str | None:
        """Why the commit of ``txid`` can never happen as things stand, or None."""
        return liveness.blocker(self.store, topology_id, txid)

    def commit(self, topology_id: str, txid: int, attempt: int | None = None) -> CommitResult:
        """Commit ``txid`` exactly once, strictly after ``txid - 1`` (``core/commit.py``)."""
        if any(state.database is not None for state in self.spec(topology_id).states):
            return commit_external.commit_external(self.store, topology_id, txid, attempt)
        return commit.commit(self.store, topology_id, txid, attempt)

    def publish(self, topology_id: str, through_txid: int | None = None) -> list[Publication]:
        """Publish the committed txids (through ``through_txid``) of the topology's outputs declared
        with a Kafka topic that are not published yet, each in one Kafka transaction (``core/publish.py``)."""
        return publish.publish(self.store, topology_id, through_txid)

    def mark_published(self, topology_id: str, output: str, txid: int) -> int:
        """Record an output's txids through ``txid`` as published to Kafka, publishing nothing."""
        return publish.mark_published(self.store, topology_id, output, txid)

    def recover(self, topology_id: str) -> RecoverResult:
        """Discard staged output that can never be committed; safe to run at any time."""
        return status.recover(self.store, topology_id)

    def ask_lags(self, topology_ids: Sequence[str]) -> None:
        """Begin asking every remote source's lag at once, before the statuses of many topologies."""
        status.ask_lags(self.store, topology_ids)

    def status(self, topology_id: str, *, lag_wait: float | None = None) -> TopologyStatus:
        """Where ``topology_id`` stands. A Kafka source's lag is waited for ``lag_wait`` seconds at
        most (default: a view's few, :data:`.core.lag.WAIT`; a check that can afford it:
        :data:`PATIENT_LAG_WAIT`), else it is unknown, with why."""
        return status.status(self.store, topology_id, lag_wait=lag_wait)

    def committed_batch(self, topology_id: str, through_txid: int | None = None
                    ) -> tuple[dict[str, Any], str | None]:
        return status.committed_batch(self.store, topology_id, through_txid=through_txid)

    def diff_audit(self, topology_id: str, num: int, committed_txid: int, samples: int = 10
               ) -> dict[str, Any] | None:
        """Diff the recomputed states against the state tables, holding commits off meanwhile."""
        return status.diff_audit(self.store, topology_id, num, committed_txid, samples=samples)

    def commits(self, topology_id: str, txid: int | None = None) -> list[dict[str, Any]]:
        """The audit log of a topology, in txid order (only ``txid``'s entry, if given)."""
        return status.commits(self.store, topology_id, txid)

    # -- rebuilding the states from the source while the topology commits (core/rebuild.py) ----

    def begin_rebuild(self, topology_id: str) -> rebuild.Rebuild:
        """Mark a rebuild's starting point (T0, the committed txid) and take its liveness lock."""
        return rebuild.begin(self.store, topology_id)

    def rebuild_copies(self, topology_id: str) -> dict[str, str]:
        """The COPY statement that loads each state's recomputation, by state name."""
        return rebuild.load_copies(self.store, topology_id)

    def swap_rebuild(self, started: rebuild.Rebuild) -> dict[str, Any]:
        """Replay the journal onto the recomputed states and swap them in, in one transaction."""
        return rebuild.swap(self.store, started)

    def abort_rebuild(self, topology_id: str, *, started: rebuild.Rebuild | None = None,
                      force: bool = False) -> bool:
        """Forget a rebuild that did not finish (a live one only with ``force``); False: none to abort."""
        return rebuild.abort(self.store, topology_id, rebuild=started, force=force)

    # -- what the Transactions pages of the Airflow UI show (JSON-ready; core/views.py) ------

    def summary(self, topology_id: str, *, dag_id: str, now: datetime) -> dict[str, Any]:
        """Where a topology stands: txids in flight and their phase, lag, commit rate, blocker."""
        return views.summary(self.store, topology_id, dag_id=dag_id, now=now)

    def timeline(self, topology_id: str, limit: int = 30) -> list[dict[str, Any]]:
        """The latest txids, latest first, each with its plan, attempts and commit."""
        return views.timeline(self.store, topology_id, limit)

    def run_view(self, topology_id: str, run_key: str) -> dict[str, Any] | None:
        """One run's transaction with its attempts, commit and quarantine reasons (None: no txid)."""
        return views.run(self.store, topology_id, run_key)

    def quarantined(self, topology_id: str, txid: int, *, reason: str | None = None, limit: int = 100,
                    offset: int = 0) -> list[dict[str, Any]]:
        """The bad records the attempts of ``txid`` found, optionally of one reason."""
        return views.quarantined(self.store, topology_id, txid, reason=reason, limit=limit, offset=offset)
