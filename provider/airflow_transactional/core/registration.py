"""Registration: create or check a topology's tables and refuse a declaration that would change
what its committed progress means; reset a topology to start over."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import NamedTuple

import psycopg2.errors
import psycopg2.extensions
from psycopg2 import sql

from .. import identifiers
from ..exceptions import (
    ConfigError,
    DeclarationChanged,
    SchemaMismatch,
    TopologyOfAnotherDag,
)
from ..spec import StateSpec, TopologySpec
from ..store import catalog, commits, decisions, outputs, privileges
from ..store import logs as event_logs
from ..store import state as q
from ..store import topologies as topology_rows
from ..store.migrations import migrate as migrate_schema
from .context import StateStore
from .redeclaration import evolved, other_owner

log = logging.getLogger(__name__)


def migrate(store: StateStore) -> list[int]:
    """Bring the provider's schema up to date; the versions applied now."""
    return migrate_schema(store.db, store.schema)


def register(store: StateStore, spec: TopologySpec) -> None:
    """Create or update a topology, its state and staging tables (idempotent).

    Once a topology is registered, registering it again unchanged runs no DDL: a run-time
    role with DML rights only (``store.privileges``) can call this on every run.
    """
    try:
        _register(store, spec)
    except psycopg2.errors.InsufficientPrivilege as exc:
        raise ConfigError(
            f"topology {spec.topology_id!r} cannot be registered by this role "
            f"({str(exc).splitlines()[0]}): registering creates tables, which only the schema's owner may do. "
            f"Register it as the owner ('airflow-txn --dsn-file OWNER_DSN register DAG_FILE', then "
            f"'airflow-txn grant --runtime-role ROLE'), or give this role ownership of schema {store.schema!r}"
        ) from None


def _register(store: StateStore, spec: TopologySpec) -> None:
    check_tables_outside(store.schema, spec)
    migrate(store)
    for state in spec.states:
        if state.database is not None:
            with store.external_db(state.database).transaction() as ecur:
                ensure_state_table(store, ecur, spec.topology_id, state)
    config = spec.to_config()
    with store.db.transaction() as cur:
        known = topology_rows.for_registration(cur, store.schema, spec.topology_id)
        owner = other_owner(known.spec, config) if known is not None else None
        if owner is not None:
            raise TopologyOfAnotherDag(spec.topology_id, owner, spec.dag)
        if known is not None and (known.committed_txid or known.planned):  # its offsets mean something
            config, changes = evolved(known.spec, config)
            if changes:
                raise DeclarationChanged(spec.topology_id, changes, int(known.committed_txid))
            if config.get("declared"):
                log.warning("topology %s declares state(s) %s that its commits do not keep yet: their rows are "
                            "dropped until the owner builds them from the source's history and switches them in "
                            "('airflow-txn evolve %s --approve --dag-file DAG_FILE')", spec.topology_id,
                            ", ".join(s["name"] for s in config["declared"]), spec.topology_id)
            if config.get("retiring"):
                log.warning("topology %s no longer declares state(s) %s: its commits keep them (its job must still "
                            "return their rows) until the owner retires them ('airflow-txn evolve %s --approve')",
                            spec.topology_id, ", ".join(config["retiring"]), spec.topology_id)
            spec = TopologySpec.from_config(config, store.connections)  # what is kept: no table of a declared state
        if known is not None and known.spec == config and _tables_exist(store, cur, known.num, spec):
            # Unchanged: nothing to write (a run-time role may not write declarations or tables).
            for d in spec.decisions:
                decisions.check_headroom(cur, d, spec.state(d.state))
            store.specs[spec.topology_id] = (known.num, TopologySpec.from_config(config, store.connections))
            return
        num = topology_rows.upsert(cur, store.schema, spec.topology_id, config)
        spec.source.register(cur, store.schema, spec.topology_id)
        for state in spec.states:
            if state.database is None:
                ensure_state_table(store, cur, spec.topology_id, state)
            if not catalog.exists(cur, store.staging(num, state)):
                cur.execute(q.create_staging_table(store.staging(num, state), state))
                cur.execute(q.create_history_view(q.history_view(store.schema, num, state), store.staging(num, state),
                                                  state, store.schema, spec.topology_id))
            cur.execute(q.create_staging_table(store.verify_staging(num, state), state))  # if not there
        if spec.outputs:
            known_logs = event_logs.partition_counts(cur, store.schema, [o.log_name for o in spec.outputs])
            for o in spec.outputs:
                if known_logs.get(o.log_name, 0) < o.partitions:
                    event_logs.ensure(cur, store.schema, o.log_name, o.partitions)
            for table in (store.out_staging(num), store.out_verify(num)):
                if not catalog.exists(cur, table):
                    cur.execute(outputs.create_staging_table(table))
        for d in spec.decisions:
            decisions.check_headroom(cur, d, spec.state(d.state))
            if not catalog.exists(cur, store.decision_staging(num, d)):
                cur.execute(decisions.create_staging_table(store.decision_staging(num, d), spec.state(d.state)))
            decisions.ensure_runs_table(cur, store.decision_runs(num, d), spec.state(d.state))
    # As a load finds it: its source resolves connections as this store's owner does, not the caller's way.
    store.specs[spec.topology_id] = (num, TopologySpec.from_config(config, store.connections))


def _tables_exist(store: StateStore, cur: psycopg2.extensions.cursor, num: int, spec: TopologySpec) -> bool:
    """Whether every table of the registered ``spec`` (number ``num``) is there."""
    return all(catalog.exists(cur, t) for t in _tables(store, num, spec))


def _tables(store: StateStore, num: int, spec: TopologySpec) -> list[sql.Composed]:
    """The provider's tables of topology number ``num`` (its states' tables in this database too)."""
    tables = [t for s in spec.states for t in (store.staging(num, s), store.verify_staging(num, s))]
    tables += [q.state_table(s) for s in spec.states if s.database is None]
    tables += [t for d in spec.decisions for t in (store.decision_staging(num, d), store.decision_runs(num, d))]
    tables += [store.out_staging(num), store.out_verify(num)] if spec.outputs else []
    return tables


def reset(store: StateStore, topology_id: str) -> Reset:
    """Forget a topology's progress -- plans, attempts, commits, quarantine, staged output --
    and drop its state tables in this store, so its next run starts over from the beginning of
    its source under its current declaration.

    A state table is dropped only if it carries the mark its registration gave it (a comment
    only the table's owner can write): a declaration pointing a state at any other table --
    whoever wrote it -- never makes a reset drop that table; it is kept, and named. States kept in
    another database are not reachable from here: drop those there. Its output logs keep what it
    appended; their ids are kept too, so what it emits again is not appended twice.
    """
    dropped, kept = [], []
    with store.db.transaction() as cur:
        num, spec, _c, _o = store.load(cur, topology_id, lock=True)
        tables = [store.out_staging(num), store.out_verify(num),
                  *(store.decision_staging(num, d) for d in spec.decisions),
                  *(store.decision_runs(num, d) for d in spec.decisions)]
        retired = list(spec.retired_states.values())
        states = [*spec.states, *spec.building, *retired]
        for state in states:
            tables += [store.staging(num, state), store.verify_staging(num, state),
                       *(q.audit_table(store.schema, num, state, purpose=p) for p in ("rebuild", "build"))]
        for state in [*spec.states, *retired]:
            if state.database is None and catalog.exists(cur, q.state_table(state)):
                if catalog.comment(cur, q.state_table(state)) == q.state_marker(topology_id, state):
                    tables.append(q.state_table(state))
                else:
                    kept.append(q.state_table(state).as_string(cur))
        for state in states:  # the views on the staging tables go first
            cur.execute(q.drop_history_view(q.history_view(store.schema, num, state)))
        for table in tables:
            if catalog.exists(cur, table):
                catalog.drop(cur, table)
                dropped.append(table.as_string(cur))
        commits.delete_quarantine(cur, store.schema, topology_id)
        decisions.delete_verdicts(cur, store.schema, topology_id)
        topology_rows.delete(cur, store.schema, topology_id)
    store.specs.pop(topology_id, None)
    log.warning("topology %s reset: progress forgotten, dropped %s%s", topology_id, ", ".join(dropped) or "nothing",
                f"; kept {', '.join(kept)} (not made by its registration)" if kept else "")
    return Reset(dropped, kept)


class Reset(NamedTuple):
    """What a reset dropped, and the state tables it kept because its registration did not make them."""

    dropped: list[str]
    kept: list[str]


def check_tables_outside(schema: str, spec: TopologySpec) -> None:
    """Refuse a state table or a decision's headroom in the provider's own schema or a system one:
    the run-time role is granted INSERT and UPDATE on a state's table and SELECT on a headroom,
    so either would hand it the provider's own tables (a state table named ``topologies``: the
    declarations) or the catalog's."""
    tables = [(f"state {st.name!r}", st.schema_and_table) for st in spec.states if st.database is None]
    tables += [(f"the headroom of decision {d.name!r}", d.headroom_table) for d in spec.decisions
               if d.headroom_table is not None]
    for what, (in_schema, table) in tables:
        if in_schema == schema or in_schema.startswith("pg_") or in_schema == "information_schema":
            raise ConfigError(f"topology {spec.topology_id!r}: {what} is the table {in_schema}.{table}, in "
                              f"{'the provider' if in_schema == schema else 'a system'}'s schema {in_schema!r}: "
                              "put it in a schema of its own (e.g. 'public.my_table')")


def ensure_state_table(store: StateStore, cur: psycopg2.extensions.cursor, topology_id: str,
                       state: StateSpec) -> None:
    """Create the state's table, or check the one there has its columns; mark it as the
    topology's (a comment, when this role owns the table: what lets a reset drop it)."""
    schema, table = state.schema_and_table
    if not catalog.exists(cur, q.state_table(state)):
        create_schema, create_table = q.create_state_table(state)
        if not catalog.schema_exists(cur, schema):  # owning the schema is enough: CREATE SCHEMA needs CREATE
            cur.execute(create_schema)
        cur.execute(create_table)
    have = catalog.columns(cur, schema, table)
    want = q.expected_columns(state)
    if have != want:
        raise SchemaMismatch(
            f"table {schema}.{table} exists with columns {have}, but state {state.name!r} needs "
            f"{want}: point the state at another table (table='...'), or migrate/drop the old one")
    marker = q.state_marker(topology_id, state)
    if catalog.owned(cur, q.state_table(state)) and catalog.comment(cur, q.state_table(state)) != marker:
        catalog.set_comment(cur, q.state_table(state), marker)


def grant(store: StateStore, *, runtime_role: str, producer_role: str | None = None, logs: Sequence[str] = (),
          readable: Sequence[str] = (), auditor_role: str | None = None, apply: bool = True) -> list[str]:
    """Grant the run-time role (and a producer of ``logs``, and an auditor) what they need and no
    more (:mod:`..store.privileges`); returns the statements (run unless ``apply`` is False).
    ``readable``: the tables besides their states the declarations may read (decisions' headroom).

    Run as the schema's owner, after registering. A role that does not exist, a superuser or one
    that bypasses row-level security, the owner itself, or a role the owner is part of is refused:
    a role with any of those rights would be the owner in all but name. So is one role for two
    parts: an auditor that commits, or appends, checks itself.
    """
    with store.db.transaction() as cur:
        named = (("--runtime-role", runtime_role), ("--producer-role", producer_role), ("--auditor-role", auditor_role))
        for kind, name in named:
            if name is not None:
                _check_role(cur, kind, name)
        for kind, other in (("run-time", runtime_role), ("producer", producer_role)):
            if auditor_role is not None and other is not None and catalog.shares_rights(cur, auditor_role, other):
                raise ConfigError(f"--auditor-role {auditor_role!r} is the {kind} role, or a member of it or it of "
                                  "the auditor: an auditor checks what the run-time role committed from what the "
                                  "producers appended, so it must be a role of its own, in neither (CREATE ROLE "
                                  "txn_auditor LOGIN PASSWORD '...')")
        if producer_role is not None:
            if producer_role == runtime_role:
                raise ConfigError("the producer role and the run-time role must be two roles: a producer appends "
                                  "only, the run-time role commits")
            if not logs:
                raise ConfigError("--producer-role needs the logs it may append to: add --log NAME (once per log)")
            known = event_logs.partition_counts(cur, store.schema, logs)
            missing = [log for log in logs if log not in known]
            if missing:
                raise ConfigError(f"no log {', '.join(map(repr, missing))} in schema {store.schema!r}: create it first "
                                  "(EventLog(dsn, name).create(partitions), as the owner), or fix the name")
        registered = [(num, TopologySpec.from_config(config))
                      for num, config in topology_rows.numbered(cur, store.schema)]
        for _num, spec in registered:  # registered before this check existed
            check_tables_outside(store.schema, spec)
        statements = privileges.grant_statements(store.schema, registered, runtime_role=runtime_role,
                                                 producer_role=producer_role, logs=logs, readable=readable,
                                                 auditor_role=auditor_role)
        if apply:
            for stmt in statements:
                cur.execute(stmt)
        return [stmt.as_string(cur) for stmt in statements]


def _check_role(cur: psycopg2.extensions.cursor, kind: str, name: str) -> None:
    identifiers.name("role name", name)
    found = catalog.role(cur, name)
    if found is None:
        raise ConfigError(f"{kind} {name!r}: no such role; create it first (CREATE ROLE {name} LOGIN PASSWORD '...')")
    if found.superuser or found.bypasses_rls:
        raise ConfigError(f"{kind} {name!r} is a superuser or bypasses row-level security: it can do anything "
                          f"whatever is granted; create a plain role (CREATE ROLE txn_runtime LOGIN PASSWORD '...')")
    if found.is_me:
        raise ConfigError(f"{kind} {name!r} is the schema's owner or a member of it (it may take the owner's "
                          "rights): give the run-time and producer roles roles of their own")


def topologies(store: StateStore) -> list[TopologySpec]:
    """Every topology registered in this store, by id; none before the first one created the
    provider's schema (a watch or a page that lists them works on a fresh store)."""
    try:
        with store.db.transaction() as cur:
            return [TopologySpec.from_config(config, store.connections)
                    for config in topology_rows.specs(cur, store.schema)]
    except psycopg2.errors.UndefinedTable:
        return []


def spec(store: StateStore, topology_id: str) -> TopologySpec:
    """The declaration ``topology_id`` was registered with."""
    with store.db.transaction() as cur:
        return store.load(cur, topology_id)[1]
