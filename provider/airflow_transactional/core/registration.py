"""Registration: create or check a topology's tables and refuse a declaration that would change
what its committed progress means; reset a topology to start over."""

from __future__ import annotations

import logging

import psycopg2.errors
import psycopg2.extensions

from ..exceptions import (
    ConfigError,
    DeclarationChanged,
    SchemaMismatch,
    TopologyOfAnotherDag,
)
from ..spec import StateSpec, TopologySpec, incompatible_changes, other_owner
from ..store import catalog, commits, decisions, outputs
from ..store import sql as q
from ..store import topologies as topology_rows
from ..store.migrations import migrate as migrate_schema
from .context import StateStore

log = logging.getLogger("airflow_transactional.coordinator")


def migrate(store: StateStore) -> list[int]:
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
    migrate(store)
    for state in spec.states:
        if state.database is not None:
            with store.ext_db(state.database).transaction() as ecur:
                ensure_state_table(store, ecur, state)
    config = spec.to_config()
    with store.db.transaction() as cur:
        known = topology_rows.for_registration(cur, store.schema, spec.topology_id)
        owner = other_owner(known.spec, config) if known is not None else None
        if owner is not None:
            raise TopologyOfAnotherDag(spec.topology_id, owner, str(config["extra"]["dag_id"]))
        if known is not None and (known.committed_txid or known.planned):  # its offsets mean something
            changes = incompatible_changes(known.spec, config)
            if changes:
                raise DeclarationChanged(spec.topology_id, changes, int(known.committed_txid))
        num = topology_rows.upsert(cur, store.schema, spec.topology_id, config)
        spec.source.register(cur, store.schema, spec.topology_id)
        for state in spec.states:
            if state.database is None:
                ensure_state_table(store, cur, state)
            if not catalog.exists(cur, store.staging(num, state)):
                cur.execute(q.create_staging_table(store.staging(num, state), state))
        if spec.outputs:
            known_logs = outputs.partitions(cur, store.schema, [o.log_name for o in spec.outputs])
            for o in spec.outputs:
                if known_logs.get(o.log_name, 0) < o.partitions:
                    outputs.ensure_log(cur, store.schema, o.log_name, o.partitions)
            if not catalog.exists(cur, store.out_staging(num)):
                cur.execute(outputs.create_staging_table(store.out_staging(num)))
        for d in spec.decisions:
            decisions.check_headroom(cur, d, spec.state(d.state))
            if not catalog.exists(cur, store.dec_staging(num, d)):
                cur.execute(decisions.create_staging_table(store.dec_staging(num, d), spec.state(d.state)))
            decisions.ensure_runs_table(cur, store.dec_runs(num, d), spec.state(d.state))
    store.specs[spec.topology_id] = (num, spec)


def reset(store: StateStore, topology_id: str) -> list[str]:
    """Forget a topology's progress -- plans, attempts, commits, quarantine, staged output --
    and drop its state tables in this store, so its next run starts over from the beginning of
    its source under its current declaration. Returns the tables dropped.

    States kept in another database are not reachable from here: drop those there. Its output
    logs keep what it appended; their ids are kept too, so what it emits again is not appended twice.
    """
    dropped = []
    with store.db.transaction() as cur:
        num, spec, _c, _o = store.load(cur, topology_id, lock=True)
        tables = [store.out_staging(num), *(store.dec_staging(num, d) for d in spec.decisions),
                  *(store.dec_runs(num, d) for d in spec.decisions)]
        for state in spec.states:
            tables += [store.staging(num, state), q.audit_table(store.schema, num, state, purpose="rebuild")]
            if state.database is None:
                tables.append(q.state_table(state))
        for table in tables:
            if catalog.exists(cur, table):
                catalog.drop(cur, table)
                dropped.append(table.as_string(cur))
        commits.delete_quarantine(cur, store.schema, topology_id)
        decisions.delete_verdicts(cur, store.schema, topology_id)
        topology_rows.delete(cur, store.schema, topology_id)
    store.specs.pop(topology_id, None)
    log.warning("topology %s reset: progress forgotten, dropped %s", topology_id, ", ".join(dropped) or "nothing")
    return dropped


def ensure_state_table(store: StateStore, cur: psycopg2.extensions.cursor, state: StateSpec) -> None:
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


def topologies(store: StateStore) -> list[TopologySpec]:
    """Every topology registered in this store, by id."""
    with store.db.transaction() as cur:
        return [TopologySpec.from_config(config) for config in topology_rows.specs(cur, store.schema)]


def spec(store: StateStore, topology_id: str) -> TopologySpec:
    with store.db.transaction() as cur:
        return store.load(cur, topology_id)[1]
