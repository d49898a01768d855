"""Add a state to a running topology, redefine one (``core/redefinition.py``) or retire one: built from
the source's history while the topology keeps committing, switched in at one txid, exactly once
(OLEP: a new derived view of a kept log).

A state the DAG file adds is kept as *declared* at registration (``core/redeclaration.py``): the
job's rows for it are dropped and nothing else changes. The owner approves it -- ``airflow-txn
evolve TOPOLOGY --approve``, the recompute engine's :class:`~.recompute.StateBuild` -- and then:

1. :func:`begin` (under the topology's lock): the state is *building* -- every processing attempt
   from now on folds and stages it beside the live states; no commit applies it. M is the last
   txid planned so far: an attempt of a txid after M began after this, so it staged the state.
   The build holds the rebuild's turn (a rebuild and a build never run together), and its mark is
   the rebuild's, ``(M, "build:<id>")``.
2. :func:`wait_for_plans`: the txids through M commit as they would (their attempts may predate
   the build; those are what step 3 computes).
3. The topology's own code folds every source record of txids 1..M (and what committed replays
   through M took, each as edited) into a load table, chunk by chunk (``core/building.py``): the
   state as of M.
4. :func:`switch` (ONE database transaction, under the lock, commits wait): the state's table
   holds the load plus the staged rows of txids M+1..now (the journal, each the committed
   attempt's), the history starts at M with the load as its snapshot, the state joins the live
   ones (``built``: M; a redefined state replaces its live version, archived: ``built``: C). From
   the next commit on, every commit applies it.

A live state the DAG file no longer declares is *retiring* -- still kept, its job must still
return its rows -- until the owner approves; :func:`retire` then stops it at the committed txid,
its table kept as it was (archived), until :func:`drop`.

So the state equals, at the switch, the fold of txids 1..C (C the committed txid) under the code
in force -- what the audit recomputes. A build whose process dies leaves the state building (the
attempts keep staging it): approving again goes on from the first chunk not folded;
:func:`cancel` forgets it.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from .. import faults
from ..exceptions import ConfigError, RebuildInProgress, TransactionalError
from ..spec import StateSpec, TopologySpec
from ..store import builds, catalog, commits, privileges, topologies, transactions
from ..store import history as h
from ..store import state as q
from ..store.topologies import BUILD_MARK, RebuildMark
from . import history, rebuild, redefinition, registration
from .building import load_table, part_table, progress
from .context import StateStore

__all__ = ["Build", "begin", "cancel", "drop", "load_table", "retire", "status", "switch", "wait_for_plans"]

@dataclass(frozen=True)
class Build:
    """A state build that has begun: its topology, the states it builds, the txid its fold covers
    (M), its id."""

    topology_id: str
    states: tuple[str, ...]
    through_txid: int
    build_id: str


def _refusal(spec: TopologySpec, states: list[StateSpec]) -> str | None:
    """Why ``states`` cannot be built exactly from the source (None: they can)."""
    external = [s.name for s in states if s.database is not None or (s.replaces and spec.state(s.replaces).database)]
    if external:
        return (f"states {external} are kept in another database, outside the commit's transaction: the switch "
                "could not be one commit; keep them in the state store, or give the topology a new id")
    decided = [s.name for s in states if {s.name, s.replaces} & spec.decided_states]
    if decided:
        return (f"states {decided} are kept by decisions, whose verdicts were taken in commit order: a "
                "recomputation from the source cannot take them again; give the topology a new id")
    return None


def begin(store: StateStore, topology_id: str) -> Build:
    """Approve the declared states: make them building (or take up a build whose process died)."""
    if not rebuild.hold(store, topology_id):
        raise RebuildInProgress(f"topology {topology_id!r} has a rebuild or a state build running (its process "
                                "holds the lock): wait for it to finish")
    try:
        with store.db.transaction() as cur:
            num, spec, committed, _o = store.load(cur, topology_id, lock=True)
            mark = topologies.rebuild_mark(cur, store.schema, topology_id)
            if mark.rebuild_id is not None and not mark.state_build:
                raise RebuildInProgress(f"topology {topology_id!r} has an unfinished rebuild {mark.rebuild_id}: "
                                        f"run 'airflow-txn rebuild --abort {topology_id}', then approve again")
            states = [*spec.building, *spec.declared]
            if not states:
                raise ConfigError(f"topology {topology_id!r} has no state to build: add a StateSpec to its DAG "
                                  "file (and its rows to the job's transform), let a run register it, then approve")
            why = _refusal(spec, states)
            if why:
                raise ConfigError(f"topology {topology_id!r}: {why}")
            taken_up = bool(spec.building and mark.rebuild_id is not None and not spec.declared)
            if taken_up:  # its fold goes on from the first chunk not done (core/building.py)
                build = Build(topology_id, tuple(s.name for s in states), int(mark.rebuild_from_txid or 0),
                              str(mark.rebuild_id))
            else:
                last = transactions.last(cur, store.schema, topology_id)
                build = Build(topology_id, tuple(s.name for s in states), max(committed, last.txid if last else 0),
                              BUILD_MARK + uuid.uuid4().hex)
                catalog.drop(cur, builds.table(store.schema, num), if_exists=True)
            config = {**spec.to_config(), "building": [s.to_config() for s in states]}
            config.pop("declared", None)
            topologies.upsert(cur, store.schema, topology_id, config)
            topologies.set_rebuild_mark(cur, store.schema, topology_id, RebuildMark(build.through_txid,
                                                                                    build.build_id))
            for state in states:
                if state.replaces:
                    redefinition.check(cur, spec, state)
                _tables(store, cur, num, topology_id, state, like=spec.states[0], fresh=not taken_up)
    except BaseException:
        rebuild.release(store, topology_id)
        raise
    return build


def _tables(store: StateStore, cur: Any, num: int, topology_id: str, state: StateSpec, *, like: StateSpec,
            fresh: bool) -> None:
    """A building state's staging table (and its history view, its verification's) -- reached by
    the roles that reach the live state ``like``'s: the run-time role's attempts stage it -- and its
    load table (``fresh``: empty; else the one a build taken up has folded into so far)."""
    if not catalog.exists(cur, store.staging(num, state)):
        cur.execute(q.create_staging_table(store.staging(num, state), state))
        cur.execute(q.create_history_view(q.history_view(store.schema, num, state), store.staging(num, state),
                                          state, store.schema, topology_id))
    cur.execute(q.create_staging_table(store.verify_staging(num, state), state))  # if not there
    privileges.grant_like(cur, store.staging(num, like), store.staging(num, state))
    privileges.grant_like(cur, store.verify_staging(num, like), store.verify_staging(num, state))
    if fresh:
        catalog.drop(cur, load_table(store, num, state), if_exists=True)
    if not catalog.exists(cur, load_table(store, num, state)):
        for stmt in q.create_audit_table(load_table(store, num, state), state):
            cur.execute(stmt)


def wait_for_plans(store: StateStore, build: Build, *, timeout: float = 3600.0, poll: float = 1.0) -> None:
    """Wait until the txids planned before the build (through M) have committed."""
    deadline = time.monotonic() + timeout
    while True:
        with store.db.transaction() as cur:
            committed = store.load(cur, build.topology_id).committed_txid
        if committed >= build.through_txid:
            return
        if time.monotonic() > deadline:
            raise TransactionalError(
                f"topology {build.topology_id!r}: the state build waits for txids {committed + 1}..."
                f"{build.through_txid}, planned before it began, to commit, and they did not within "
                f"{timeout:.0f}s: let them commit (or fail them for good), then approve again")
        time.sleep(poll)


def switch(store: StateStore, build: Build) -> dict[str, Any]:
    """Switch the built states in, in one transaction under the topology's lock (the module's step 4)."""
    topology_id, through = build.topology_id, build.through_txid
    with store.db.transaction() as cur:
        num, spec, committed, _o = store.load(cur, topology_id, lock=True)
        if topologies.rebuild_mark(cur, store.schema, topology_id) != (through, build.build_id):
            raise TransactionalError(f"topology {topology_id!r}: state build {build.build_id} was cancelled or "
                                     "replaced; nothing was switched in")
        journal = commits.log(cur, store.schema, topology_id, after=through)
        result: dict[str, Any] = {"topology": topology_id, "built_at_txid": through, "switched_at_txid": committed,
                                  "journal_txids": len(journal), "states": {}}
        config = spec.to_config()
        switched = _Switched(store, cur, num, spec, through, committed)
        for name in build.states:
            _check_journal(topology_id, name, journal)
            result["states"][name] = switched.state(spec.state(name), [(e.txid, e.attempt) for e in journal])
        config["states"] = [switched.live.pop(s["name"], s) for s in config["states"]] + list(switched.live.values())
        config["built"] = {**dict(config.get("built") or {}), **switched.built}
        config["retired"] = {**dict(config.get("retired") or {}), **switched.archived}
        config["building"] = [s for s in config.get("building", ()) if s["name"] not in build.states]
        for key in ("building", "retired"):
            if not config[key]:
                del config[key]
        topologies.upsert(cur, store.schema, topology_id, config)
        topologies.set_rebuild_mark(cur, store.schema, topology_id, rebuild.NO_REBUILD)
        catalog.drop(cur, builds.table(store.schema, num), if_exists=True)
        faults.point("build.switch", cur, scope=(topology_id,))  # lost here: nothing switched, approve again
    rebuild.release(store, topology_id)
    return result


class _Switched:
    """What a switch did, state by state: each built state's table loaded and caught up, its history
    started at M -- a redefined one's in place of the version it replaces, archived
    (``core/redefinition.py``) -- and the declarations that changed."""

    def __init__(self, store: StateStore, cur: Any, num: int, spec: TopologySpec, through: int,
                 committed: int) -> None:
        self.store, self.cur, self.num, self.spec = store, cur, num, spec
        self.through, self.committed = through, committed
        self.like = next((s for s in spec.states if s.database is None), None)  # whose grants the new table gets
        self.snapshot_attempt = history.committed_attempt(cur, store.schema, spec.topology_id, through)
        self.mark = h.mark(cur, store.schema, spec.topology_id)
        self.live: dict[str, dict[str, Any]] = {}  # the declarations of the states switched in, by name
        self.built: dict[str, int] = {}
        self.archived: dict[str, dict[str, Any]] = {}

    def state(self, built: StateSpec, journal: list[tuple[int, int]]) -> int:
        """Switch one built state in; its keys."""
        store, cur, num, spec, topology_id = self.store, self.cur, self.num, self.spec, self.spec.topology_id
        load, state, grants_from = load_table(store, num, built), built, self.like
        if built.replaces:  # a new version: the live one is archived, this one takes its names (and grants)
            state, gone = redefinition.swap(store, cur, num, topology_id, spec, built)
            start = max(self.mark.history_from_txid, spec.built.get(state.name, 0))
            base = self.mark.history_base or state.name in spec.built  # a built state's history starts at its load
            self.archived[gone.name] = redefinition.record(gone, state.name, self.committed, start, base)
            grants_from = gone
        registration.ensure_state_table(store, cur, topology_id, state)
        if grants_from is not None:
            privileges.grant_like(cur, q.state_table(grants_from), q.state_table(state))
        keys = rebuild.caught_up(store, cur, state, load, self.through, journal, store.staging(num, state))
        # The history of the state starts at M: the load is its snapshot (earlier staged rows of
        # txids through M, an attempt's that began after the build, were folded from the source).
        h.snapshot_of(cur, store.schema, topology_id, state, store.staging(num, state), load, self.through,
                      self.snapshot_attempt)
        catalog.drop(cur, load)
        self.live[state.name] = state.to_config()
        # A new version is what readers see from the switch on (before it, the archived one answers).
        self.built[state.name] = self.committed if built.replaces else self.through
        return keys


def _check_journal(topology_id: str, name: str, journal: list[commits.CommitRecord]) -> None:
    """Every txid after M staged the state (its attempt began after the build), and none corrects:
    a correction applies differences from what its txids applied, which the state never had."""
    for entry in journal:
        if entry.corrects:
            raise TransactionalError(f"topology {topology_id!r}: txid {entry.txid} corrected txids while state "
                                     f"{name!r} was building; approve the build again (it starts over)")
        if entry.attempt and name not in (entry.row_counts or {}):
            raise TransactionalError(f"topology {topology_id!r}: txid {entry.txid} committed an attempt that did "
                                     f"not stage state {name!r}; approve the build again (it starts over)")


def cancel(store: StateStore, topology_id: str) -> list[str]:
    """Forget the states being built (they are declared again: a run's registration keeps them so
    while the DAG file declares them) and the build's tables; the states cancelled."""
    if not rebuild.hold(store, topology_id):
        raise RebuildInProgress(f"the state build of {topology_id!r} is still running (its process holds the lock): "
                                "stop it first")
    try:
        with store.db.transaction() as cur:
            num, spec, _c, _o = store.load(cur, topology_id, lock=True)
            names = [s.name for s in spec.building]
            if not names:
                return []
            config = {**spec.to_config(), "declared": [*(s.to_config() for s in spec.building),
                                                       *(s.to_config() for s in spec.declared)]}
            config.pop("building")
            topologies.upsert(cur, store.schema, topology_id, config)
            mark = topologies.rebuild_mark(cur, store.schema, topology_id)
            if mark.state_build:
                topologies.set_rebuild_mark(cur, store.schema, topology_id, rebuild.NO_REBUILD)
            for state in spec.building:
                cur.execute(q.drop_history_view(q.history_view(store.schema, num, state)))
                tables = (store.staging(num, state), store.verify_staging(num, state), load_table(store, num, state),
                          part_table(store, num, state))
                for table in tables:
                    catalog.drop(cur, table, if_exists=True)
            catalog.drop(cur, builds.table(store.schema, num), if_exists=True)
    finally:
        rebuild.release(store, topology_id)
    return names


def retire(store: StateStore, topology_id: str) -> dict[str, int]:
    """Retire the states the DAG file no longer declares, at the committed txid, in one transaction
    under the topology's lock: no commit after it applies them; each table is kept as it was then
    (and its delta history), until :func:`drop`. The states retired, by the txid they stopped at."""
    with store.db.transaction() as cur:
        _num, spec, committed, _o = store.load(cur, topology_id, lock=True)
        if not spec.retiring:
            return {}
        if len(spec.retiring) == len(spec.states):
            raise ConfigError(f"topology {topology_id!r} would keep no state: declare one before retiring "
                              f"{list(spec.retiring)}, or reset the topology")
        config = spec.to_config()
        retired = dict(config.get("retired") or {})
        for name in spec.retiring:
            retired[name] = {"txid": committed, "state": spec.state(name).to_config()}
        config["states"] = [s for s in config["states"] if s["name"] not in spec.retiring]
        config["built"] = {k: v for k, v in dict(config.get("built") or {}).items() if k not in spec.retiring}
        config["retired"] = retired
        for key in ("retiring", "built"):
            if not config.get(key):
                config.pop(key, None)
        topologies.upsert(cur, store.schema, topology_id, config)
    return dict.fromkeys(spec.retiring, committed)


def drop(store: StateStore, topology_id: str, name: str) -> list[str]:
    """Drop a retired state's tables -- its table only if the topology's registration made it (its
    mark): another's is kept and named -- and forget it; the tables dropped."""
    with store.db.transaction() as cur:
        num, spec, _c, _o = store.load(cur, topology_id, lock=True)
        if name not in spec.retired:
            raise ConfigError(f"topology {topology_id!r} has no retired state {name!r} (retired: "
                              f"{', '.join(spec.retired) or 'none'}): only a retired state is dropped")
        state = spec.retired_states[name]
        tables = [store.staging(num, state), store.verify_staging(num, state)]
        if catalog.exists(cur, q.state_table(state)) and (catalog.comment(cur, q.state_table(state))
                                                          == q.state_marker(topology_id, state)):
            tables.append(q.state_table(state))
        cur.execute(q.drop_history_view(q.history_view(store.schema, num, state)))
        dropped = []
        for table in tables:
            if catalog.exists(cur, table):
                catalog.drop(cur, table)
                dropped.append(table.as_string(cur))
        config = spec.to_config()
        config["retired"] = {k: v for k, v in config["retired"].items() if k != name}
        if not config["retired"]:
            del config["retired"]
        topologies.upsert(cur, store.schema, topology_id, config)
    return dropped


def status(store: StateStore, topology_id: str) -> dict[str, Any]:
    """What is declared, building (from which txid) and built (since which txid)."""
    with store.db.transaction() as cur:
        num, spec, committed, _o = store.load(cur, topology_id)
        mark = topologies.rebuild_mark(cur, store.schema, topology_id)
        building = mark.rebuild_from_txid if mark.state_build else None
        built = None if building is None else progress(cur, store.schema, num, int(building), catalog.now(cur))
    labels = {s.name: f"{s.shown} (redefines version {spec.state(s.replaces).version})"
              for s in (*spec.building, *spec.declared) if s.replaces}
    labels.update({name: f"{name} (version {gone.version} of {spec.retired[name]['of']}, table "
                         f"{'.'.join(gone.schema_and_table)})"
                   for name, gone in spec.retired_states.items() if spec.retired[name].get("of")})
    return {"topology": topology_id, "committed_txid": committed, "labels": labels,
            "declared": [s.name for s in spec.declared], "building": [s.name for s in spec.building],
            "building_through_txid": building, "progress": built._asdict() if built else None,
            "built": dict(spec.built), "retiring": list(spec.retiring),
            "retired": {name: int(r["txid"]) for name, r in spec.retired.items()}}
