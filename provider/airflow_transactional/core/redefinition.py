"""Redefine a live state: the new version, built beside it from the source's history like an added
state (``core/evolution.py``), takes its place at the switch, and the old version is archived.

A DAG file that declares a live state at a higher ``version`` (its transform, keys, combiner or
value type changed) registers the new version as ``<name>__v<version>``, ``replaces`` naming the
live state (``core/redeclaration.py``). Until the switch the job returns the live version's rows as
``name@<live version>`` (its transform as it was) and the new version's under the state's name.

At the switch, in its one transaction under the topology's lock (:func:`swap`): the live version's
staging table (its delta history), verification table and history view take the archive's name,
``<name>__v<old version>``, and so does its state table when the new version takes the same table
(as ``<table>_v<old version>``; a new version in a table of its own leaves the old one where it is).
Then the new version's tables take the state's own names, and from the next commit on it is the
state. The archived version is a retired state (``retired``: the txid it stopped at, its
declaration, ``of`` the state it was a version of, ``from`` where its history starts) -- kept, and
dropped only on the owner's command -- and ``state --as-of`` answers from it for the txids it was
live (:func:`archive_at`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, NamedTuple

from ..exceptions import ConfigError
from ..spec import StateSpec, TopologySpec, version_name
from ..store import catalog
from ..store import state as q
from .context import StateStore

__all__ = ["Archive", "archive_at", "archived", "check", "record", "swap"]


def archived(old: StateSpec, new: StateSpec) -> StateSpec:
    """The declaration the live version ``old`` is kept under once ``new`` replaces it."""
    schema, table = old.schema_and_table
    if new.schema_and_table == (schema, table):
        table = f"{table}_v{old.version}"
    return replace(old, name=version_name(old.name, old.version), table=table, schema=schema, replaces=None)


def check(cur: Any, spec: TopologySpec, new: StateSpec) -> None:
    """Refuse what the switch could not do: the archive's name or table already taken."""
    old = spec.state(str(new.replaces))
    gone = archived(old, new)
    if gone.name in spec.retired:
        raise ConfigError(f"version {old.version} of state {old.name!r} is archived already (retired as "
                          f"{gone.name!r}): drop it first ('airflow-txn evolve {spec.topology_id} --drop {gone.name}')")
    if gone.schema_and_table != old.schema_and_table and catalog.exists(cur, q.state_table(gone)):
        raise ConfigError(f"table {'.'.join(gone.schema_and_table)} is there: the live version of state {old.name!r} "
                          "is archived under that name at the switch; rename or drop that table, then approve again")


def swap(store: StateStore, cur: Any, num: int, topology_id: str, spec: TopologySpec,
         new: StateSpec) -> tuple[StateSpec, StateSpec]:
    """Archive the live version ``new`` replaces and give ``new``'s tables the state's names (the
    module's switch); the new version as the live state, and the archived one."""
    check(cur, spec, new)
    old = spec.state(str(new.replaces))
    gone, live = archived(old, new), replace(new, name=old.name, replaces=None)
    for stmt in q.rename_own(store.schema, num, old, gone.name):
        cur.execute(stmt)
    if gone.schema_and_table != old.schema_and_table:
        catalog.rename(cur, q.state_table(old), gone.schema_and_table[1])
        if catalog.owned(cur, q.state_table(gone)):
            catalog.set_comment(cur, q.state_table(gone), q.state_marker(topology_id, gone))
    for stmt in q.rename_own(store.schema, num, new, live.name):
        cur.execute(stmt)
    return live, gone


def record(gone: StateSpec, of: str, txid: int, history_from: int, base: bool) -> dict[str, Any]:
    """What ``retired`` keeps of an archived version: live through ``txid``, its history from
    ``history_from`` (``base``: with a snapshot there)."""
    return {"txid": txid, "state": gone.to_config(), "of": of, "from": history_from, "base": base}


class Archive(NamedTuple):
    """An archived version of a state: its declaration, where its history starts (and whether with
    a snapshot), the txid it was live through."""

    state: StateSpec
    history_from: int
    base: bool
    through: int


def archive_at(spec: TopologySpec, name: str, txid: int) -> Archive | None:
    """The archived version of state ``name`` that was live at ``txid``, or None: the live version answers."""
    kept = spec.archived_at(name, txid)
    if kept is None:
        return None
    return Archive(StateSpec.from_config(kept["state"]), int(kept["from"]), bool(kept["base"]), int(kept["txid"]))
