"""Rebuild a topology's states from its source while it keeps committing, then swap atomically.

OLEP's promise: a derived view can always be recomputed from the log (after a bug fix in the
job, or a damaged table). The steps:

1. :func:`begin` records ``rebuild_from_txid = T0`` (the committed txid). Every commit keeps its
   staged rows (the delta history, ``core/history.py``): the journal of the deltas applied after T0.
2. The topology's own Spark job recomputes every state over the batches committed through T0
   and loads the result into load tables (``spark_job.rebuild``), as long as it takes.
3. :func:`swap`, ONE database transaction: lock the topology (commits wait), build each state as
   the recomputed values of T0 plus the journaled deltas of T0+1..now under the same value rules,
   replace the state table's contents (plain DML: a reader's older snapshot keeps the old rows),
   make the recomputed values of T0 the snapshot the delta history starts at, clear the mark.
   Readers see the old state or the new one, never a half-built view.

:func:`abort` undoes step 1 (a failed rebuild); the journal stays, as the delta history.

Each rebuild has an id, recorded at :func:`begin` and checked at :func:`swap`: a rebuild that was
aborted (or replaced by another) can never swap its half-loaded tables in. While it runs, the
rebuild holds its turn in Postgres (:mod:`..store.turns`, a row lock no producer can take): that
is how ``airflow-txn rebuild --abort`` tells a live rebuild (refused without ``--force``) from one
whose process died.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from psycopg2 import sql

from ..exceptions import ConfigError, RebuildInProgress, TransactionalError
from ..spec import StateSpec
from ..store import catalog, commits, topologies, turns
from ..store import state as q
from ..store.topologies import RebuildMark
from . import history, status
from .context import StateStore

__all__ = ["Rebuild", "RebuildInProgress", "abort", "begin", "caught_up", "hold", "load_copies", "load_table",
           "release", "swap"]

NO_REBUILD = RebuildMark(None, None)


@dataclass(frozen=True)
class Rebuild:
    """A rebuild that has begun: its topology, the txid it recomputes through, its id."""

    topology_id: str
    through_txid: int
    rebuild_id: str


def hold(store: StateStore, topology_id: str) -> bool:
    """Take the rebuild's turn for this store (kept in ``store.held``); False if another holds it.
    Taken again by the store that holds it, it is still its own."""
    name = f"rebuild:{topology_id}"
    if name in store.held:
        return True
    held = turns.hold(store.db.dsn, store.schema, name)
    if held is None:
        return False
    store.held[name] = held
    return True


def release(store: StateStore, topology_id: str) -> None:
    held = store.held.pop(f"rebuild:{topology_id}", None)
    if held is not None:
        held.release()


def load_table(store: StateStore, num: int, state: StateSpec) -> sql.Composed:
    return q.audit_table(store.schema, num, state, purpose="rebuild")


def begin(store: StateStore, topology_id: str) -> Rebuild:
    """Mark the rebuild's starting point; T0 (``through_txid``) is the txid the recomputation covers."""
    if not hold(store, topology_id):
        raise RebuildInProgress(f"topology {topology_id!r} has a rebuild running (its process holds the rebuild "
                                "lock): wait for it to finish")
    try:
        with store.db.transaction() as cur:
            num, spec, committed, _o = store.load(cur, topology_id, lock=True)
            if any(s.database is not None for s in spec.states):
                raise ConfigError(f"topology {topology_id!r} keeps states in another database: rebuild them there "
                                  "by replaying the log into a fresh table")
            if spec.decisions:
                raise ConfigError(f"topology {topology_id!r} has decisions: their states hold verdicts taken in "
                                  "commit order, which a parallel recomputation cannot take again; audit it "
                                  "instead (its other states), or reset it to start over")
            running = topologies.rebuild_mark(cur, store.schema, topology_id)
            if running.state_build or spec.building:
                raise RebuildInProgress(f"topology {topology_id!r} is building states "
                                        f"{[s.name for s in spec.building]}: let the build switch them in "
                                        f"('airflow-txn evolve {topology_id} --approve') or cancel it, then rebuild")
            if running.rebuild_from_txid is not None:
                raise RebuildInProgress(f"topology {topology_id!r} has an unfinished rebuild {running.rebuild_id} "
                                        f"from txid {running.rebuild_from_txid} whose process is gone: run "
                                        f"'airflow-txn rebuild --abort "
                                        f"{topology_id}', then rebuild again")
            rebuild = Rebuild(topology_id, committed, uuid.uuid4().hex)
            topologies.set_rebuild_mark(cur, store.schema, topology_id, RebuildMark(committed, rebuild.rebuild_id))
            for state in spec.states:
                for stmt in q.create_audit_table(load_table(store, num, state), state):
                    cur.execute(stmt)
    except BaseException:
        release(store, topology_id)
        raise
    return rebuild


def swap(store: StateStore, rebuild: Rebuild) -> dict[str, Any]:
    """Replay the journal onto the recomputed states and swap them in (see the module docstring)."""
    topology_id, through_txid = rebuild.topology_id, rebuild.through_txid
    with store.db.transaction() as cur:
        num, spec, committed, _o = store.load(cur, topology_id, lock=True)
        if topologies.rebuild_mark(cur, store.schema, topology_id) != (through_txid, rebuild.rebuild_id):
            raise TransactionalError(f"topology {topology_id!r}: rebuild {rebuild.rebuild_id} (from txid "
                                     f"{through_txid}) was aborted or replaced; nothing was swapped")
        journal = commits.journal(cur, store.schema, topology_id, through_txid)
        result: dict[str, Any] = {"topology": topology_id, "rebuilt_at_txid": through_txid,
                                  "caught_up_to_txid": committed, "journal_txids": len(journal), "states": {}}
        history.rebased(store, cur, topology_id, num, spec, through_txid,
                        {s.name: load_table(store, num, s) for s in spec.states})
        for state in spec.states:
            result["states"][state.name] = caught_up(store, cur, state, load_table(store, num, state), through_txid,
                                                     [(e.txid, e.attempt) for e in journal], store.staging(num, state))
            catalog.drop(cur, load_table(store, num, state))
        topologies.set_rebuild_mark(cur, store.schema, topology_id, NO_REBUILD)
    release(store, topology_id)
    return result


def caught_up(store: StateStore, cur: Any, state: StateSpec, recomputed: sql.Composed, through_txid: int,
              journal: list[tuple[int, int]], staging: sql.Composed) -> int:
    """In a swap: make ``state``'s table hold ``recomputed`` (its values as of ``through_txid``)
    plus the staged rows of each journal (txid, attempt) after it, under the state's value rules --
    in place, writing only what differs (a reader's older snapshot keeps the old rows); its keys."""
    shadow = sql.Identifier(f"txn_swap_{state.name}")
    for stmt in q.rebuild_shadow(state, shadow, recomputed):
        cur.execute(stmt, {"txid": through_txid})
    for txid, attempt in journal:
        if attempt:  # 0: an empty batch, nothing staged
            cur.execute(q.upsert(state, shadow, q.staged_delta(staging, state)), {"txid": txid, "attempt": attempt})
    for stmt in q.replace_contents(state, shadow):
        cur.execute(stmt)
    return catalog.count(cur, shadow)


def abort(store: StateStore, topology_id: str, *, started: Rebuild | None = None, force: bool = False) -> bool:
    """Forget a rebuild that did not finish (its journal stays: the delta history). False: none to abort.

    Given ``started`` (the rebuild's own clean-up), only that rebuild is forgotten. Otherwise (an
    operator) a rebuild whose process is still alive is refused unless ``force``: it would
    otherwise load on, and its swap would then fail.
    """
    if started is None and not force and not hold(store, topology_id):
        raise RebuildInProgress(f"the rebuild of {topology_id!r} is still running (its process holds the rebuild "
                                "lock): let it finish, stop it, or pass --force to abort it anyway")
    try:
        with store.db.transaction() as cur:
            num, spec, _c, _o = store.load(cur, topology_id, lock=True)
            running = topologies.rebuild_mark(cur, store.schema, topology_id)
            if running.rebuild_from_txid is None or (started is not None and started.rebuild_id != running.rebuild_id):
                return False
            topologies.set_rebuild_mark(cur, store.schema, topology_id, NO_REBUILD)
            for state in spec.states:
                catalog.drop(cur, load_table(store, num, state), if_exists=True)
    finally:
        release(store, topology_id)
    status.recover(store, topology_id)
    return True


def load_copies(store: StateStore, topology_id: str) -> dict[str, str]:
    """The COPY statement that loads each state's recomputation into its load table."""
    with store.db.transaction() as cur:
        num, spec, _c, _o = store.load(cur, topology_id)
        return {s.name: q.copy_into(load_table(store, num, s), [*s.key_columns, "value"], csv=True).as_string(cur)
                for s in spec.states}
