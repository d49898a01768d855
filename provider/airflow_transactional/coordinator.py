"""The coordinator: the one door into the transaction core (plan, attempts, commit, status).

The life of a transaction (Storm's design 3), and where each step lives in ``core/``:

1. ``plan(topology, run_key)`` gives the run the next txid and fixes its batch as exact source
   offsets starting where the previous txid's batch ended -- once: the same run key always gets
   the same txid and the same stored batch (``core/planning.py``).
2. ``processing(topology, txid)``: a processing attempt (any number may run, for many txids at
   once) writes partial results to staging tables keyed by (txid, attempt), never to the state
   tables (``core/attempts.py``).
3. ``commit(topology, txid)``: ONE database transaction that locks the topology row, checks
   ``txid == committed_txid + 1``, verifies the staged output of the latest complete attempt,
   applies it to every state table under the value rules, advances the checkpoint, writes the
   audit row and drops the staged rows (``core/commit.py``, to be read top to bottom).
4. ``recover``: discards staged output that can never be committed (KIP-844's recover), and
   ``status`` says where a topology stands (``core/status.py``); ``blocker`` says which failed
   txid stops it (``core/liveness.py``).

Each operation is one step of ``core`` run on the coordinator's store, documented once, there
(:class:`Operation`). The Airflow operators, the Spark helper, the CLI and users call these,
never ``core`` directly; a test that needs a step no caller takes (an attempt left running) calls
the core with ``coordinator.store``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from .connections import Connections
from .core import (
    attempts,
    commit_external,
    corrections,
    history,
    liveness,
    planning,
    rebuild,
    registration,
    replays,
    verify,
    views,
)
from .core import commit as commit_
from .core import evolution as evolution_
from .core import publish as publish_
from .core import recompute as recompute_
from .core import status as status_
from .core.context import StateStore
from .core.lag import PATIENT as PATIENT_LAG_WAIT
from .core.recompute import (
    Audit,
    CorrectionPreview,
    Fold,
    Folded,
    Kind,
    Rebuild,
    StateBuild,
    Target,
    VerificationRound,
    from_request,
    request,
)
from .model import DEFAULT_SCHEMA, CommitResult
from .store import catalog

__all__ = ["PATIENT_LAG_WAIT", "Audit", "Coordinator", "CorrectionPreview", "Fold", "Folded", "Kind", "Operation",
           "Rebuild", "StateBuild", "Target", "VerificationRound", "from_request", "request"]

P = ParamSpec("P")
R = TypeVar("R")


class Operation(Generic[P, R]):
    """A step of the core, ``step(store, ...)``, as a method of the coordinator: called without the
    store, documented by the step's own docstring."""

    def __init__(self, step: Callable[Concatenate[StateStore, P], R]) -> None:
        self.step = step
        self.__doc__ = step.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, coordinator: None, owner: type | None = None) -> Operation[P, R]: ...

    @overload
    def __get__(self, coordinator: Coordinator, owner: type | None = None) -> Callable[P, R]: ...

    def __get__(self, coordinator: Coordinator | None, owner: type | None = None) -> Any:
        if coordinator is None:
            return self
        step, store = self.step, coordinator.store

        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            return step(store, *args, **kwargs)

        run.__name__ = run.__qualname__ = self.name
        run.__doc__ = self.__doc__
        return run


class Coordinator:
    """Plans, attempts, commits and status of the topologies kept in one state store.

    ``dsn`` is the store's database; ``external_dsns`` maps the ``database`` names used by
    states kept elsewhere to their DSNs (never stored, never logged); ``connections`` is where the
    settings of a Kafka source's or output's connection come from (default: the environment). A
    context manager: ``with TransactionalHook(conn_id).coordinator() as c: ...`` closes it.
    """

    def __init__(self, dsn: str, *, schema: str = DEFAULT_SCHEMA, external_dsns: Mapping[str, str] | None = None,
                 worker: str | None = None, connections: Connections | None = None) -> None:
        self.store = StateStore(dsn, schema=schema, external_dsns=external_dsns, worker=worker,
                                connections=connections)

    def __enter__(self) -> Coordinator:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self.store.close()

    @property
    def dsn(self) -> str:
        """The state store's DSN, for a process this one starts (a Spark driver): never logged."""
        return self.store.db.dsn

    @property
    def schema(self) -> str:
        return self.store.schema

    @property
    def worker(self) -> str:
        return self.store.worker

    def ping(self) -> str:
        """The server's version string (a connection test)."""
        with self.store.db.transaction() as cur:
            return catalog.server_version(cur)

    def commit(self, topology_id: str, txid: int, attempt: int | None = None) -> CommitResult:
        """Commit ``txid`` exactly once, strictly after ``txid - 1`` (``core/commit.py``; a topology
        with states in other databases: ``core/commit_external.py``)."""
        if any(state.database is not None for state in self.spec(topology_id).states):
            return commit_external.commit_external(self.store, topology_id, txid, attempt)
        return commit_.commit(self.store, topology_id, txid, attempt)

    # -- declaring (core/registration.py) ------------------------------------------------------
    register = Operation(registration.register)
    reset = Operation(registration.reset)
    grant = Operation(registration.grant)
    topologies = Operation(registration.topologies)
    spec = Operation(registration.spec)

    # -- planning (core/planning.py) -----------------------------------------------------------
    plan = Operation(planning.plan)
    transaction = Operation(planning.transaction)
    transaction_for_run = Operation(planning.transaction_for_run)
    replan = Operation(planning.replan)
    plan_correction = Operation(corrections.plan_correction)
    correction_batch = Operation(corrections.range_batch)
    withdraw_correction = Operation(corrections.withdraw)
    correction_summary = Operation(corrections.summary)
    plan_replay = Operation(replays.plan_replay)
    edit_quarantined = Operation(replays.edit)
    quarantined_records = Operation(replays.quarantined)
    replay_records = Operation(replays.records)
    adopt = Operation(planning.adopt)

    # -- processing attempts (core/attempts.py) ------------------------------------------------
    processing = Operation(attempts.processing)
    read_batch = Operation(attempts.read_batch)
    versions = Operation(attempts.versions)
    stage = Operation(attempts.stage)
    stage_events = Operation(attempts.stage_events)
    stage_requests = Operation(attempts.stage_requests)
    copy_rows = Operation(attempts.copy_rows)
    output_staging = Operation(attempts.output_staging)
    quarantine_copy = Operation(attempts.quarantine_copy)
    staging_copies = Operation(attempts.staging_copies)
    latest_complete_attempt = Operation(attempts.latest_complete_attempt)

    # -- what blocks a commit (core/liveness.py) -----------------------------------------------
    lift_failed = Operation(liveness.lift_failed)
    planned_runs = Operation(liveness.planned_runs)
    first_pending = Operation(liveness.first_pending)
    mark_failed = Operation(liveness.mark_failed)
    note_failed_try = Operation(liveness.note_failed_try)
    last_error = Operation(liveness.last_error)
    blocker = Operation(liveness.blocker)

    # -- committed output to Kafka (core/publish.py) -------------------------------------------
    publish = Operation(publish_.publish)
    mark_published = Operation(publish_.mark_published)

    # -- status, recover, audit (core/status.py) -----------------------------------------------
    recover = Operation(status_.recover)
    ask_lags = Operation(status_.ask_lags)
    status = Operation(status_.status)
    verdicts = Operation(status_.verdicts)
    committed_batch = Operation(status_.committed_batch)
    commits = Operation(status_.commits)

    # -- recomputing committed txids with the topology's code: audit, rebuild, preview, verify ---
    # (core/recompute.py: one engine, a kind and a processor's fold handed in)
    recompute = Operation(recompute_.recompute)

    # -- the shadow audit: committed txids checked as they come (core/verify.py) ----------------
    verifying = Operation(verify.verifying)
    verify_triage = Operation(verify.triage)
    verify_status = Operation(verify.status)
    verify_recheck = Operation(verify.recheck)

    # -- what each commit changed (core/history.py) ---------------------------------------------
    changes = Operation(history.changes)
    state_as_of = Operation(history.as_of)
    history_snapshot = Operation(history.snapshot)
    compact_history = Operation(history.compact)
    history_sizes = Operation(history.sizes)
    history_views = Operation(history.views)

    # -- a state added to a running topology (core/evolution.py; built through recompute) --------
    evolution = Operation(evolution_.status)
    cancel_build = Operation(evolution_.cancel)
    retire_states = Operation(evolution_.retire)
    drop_retired = Operation(evolution_.drop)

    # -- a rebuild (core/rebuild.py; run through recompute) left half done, ended by hand -------
    abort_rebuild = Operation(rebuild.abort)

    # -- what the Transactions pages of the Airflow UI show (JSON-ready; core/views.py) --------
    summary = Operation(views.summary)
    timeline = Operation(views.timeline)
    run_view = Operation(views.run)
    quarantined = Operation(views.quarantined)
