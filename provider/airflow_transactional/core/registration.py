"""Registration: create or check a topology's tables and refuse a declaration that would change
what its committed progress means; reset a topology to start over."""

from __future__ import annotations

import logging

import psycopg2.errors
import psycopg2.extensions
from psycopg2 import sql
from psycopg2.extras import Json

from ..exceptions import (
    ConfigError,
    DeclarationChanged,
    SchemaMismatch,
    TopologyOfAnotherDag,
)
from ..spec import StateSpec, TopologySpec, incompatible_changes, other_owner
from ..store import sql as q
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
        cur.execute(sql.SQL("SELECT spec, committed_txid, EXISTS (SELECT 1 FROM {} t WHERE t.topology_id = %s) "
                            "FROM {} WHERE topology_id = %s FOR UPDATE")
                    .format(store.t("transactions"), store.t("topologies")), (spec.topology_id, spec.topology_id))
        row = cur.fetchone()
        owner = other_owner(row[0], config) if row is not None else None
        if owner is not None:
            raise TopologyOfAnotherDag(spec.topology_id, owner, str(config["extra"]["dag_id"]))
        if row is not None and (row[1] or row[2]):  # planned at least once: offsets mean something
            changes = incompatible_changes(row[0], config)
            if changes:
                raise DeclarationChanged(spec.topology_id, changes, int(row[1]))
        cur.execute(sql.SQL(
            "INSERT INTO {} (topology_id, spec) VALUES (%s, %s) ON CONFLICT (topology_id) "
            "DO UPDATE SET spec = EXCLUDED.spec, updated_at = now() RETURNING num")
            .format(store.t("topologies")), (spec.topology_id, Json(config)))
        num = int(cur.fetchone()[0])
        spec.source.register(cur, store.schema, spec.topology_id)
        for state in spec.states:
            if state.database is None:
                ensure_state_table(store, cur, state)
            if not store.exists(cur, store.staging(num, state)):
                cur.execute(q.create_staging_table(store.staging(num, state), state))
    store.specs[spec.topology_id] = (num, spec)


def reset(store: StateStore, topology_id: str) -> list[str]:
    """Forget a topology's progress -- plans, attempts, commits, quarantine, staged output --
    and drop its state tables in this store, so its next run starts over from the beginning of
    its source under its current declaration. Returns the tables dropped.

    States kept in another database are not reachable from here: drop those there.
    """
    dropped = []
    with store.db.transaction() as cur:
        num, spec, _c, _o = store.load(cur, topology_id, lock=True)
        for state in spec.states:
            tables = [store.staging(num, state), q.audit_table(store.schema, num, state, purpose="rebuild")]
            if state.database is None:
                tables.append(q.state_table(state))
            for table in tables:
                if store.exists(cur, table):
                    cur.execute(sql.SQL("DROP TABLE {}").format(table))
                    dropped.append(table.as_string(cur))
        cur.execute(sql.SQL("DELETE FROM {} WHERE topology_id = %s").format(store.t("quarantine")), (topology_id,))
        cur.execute(sql.SQL("DELETE FROM {} WHERE topology_id = %s").format(store.t("topologies")), (topology_id,))
    store.specs.pop(topology_id, None)
    log.warning("topology %s reset: progress forgotten, dropped %s", topology_id, ", ".join(dropped) or "nothing")
    return dropped


def ensure_state_table(store: StateStore, cur: psycopg2.extensions.cursor, state: StateSpec) -> None:
    schema, table = state.schema_and_table
    if not store.exists(cur, q.state_table(state)):
        create_schema, create_table = q.create_state_table(state)
        cur.execute("SELECT to_regnamespace(%s) IS NULL", (sql.Identifier(schema).as_string(cur),))
        if cur.fetchone()[0]:  # owning the schema is enough: CREATE SCHEMA needs CREATE on the database
            cur.execute(create_schema)
        cur.execute(create_table)
    cur.execute(q.TABLE_COLUMNS, (f'"{schema}"."{table}"',))
    have = dict(cur.fetchall())
    want = q.expected_columns(state)
    if have != want:
        raise SchemaMismatch(
            f"table {schema}.{table} exists with columns {have}, but state {state.name!r} needs "
            f"{want}: point the state at another table (table='...'), or migrate/drop the old one")


def topologies(store: StateStore) -> list[TopologySpec]:
    """Every topology registered in this store, by id."""
    with store.db.transaction() as cur:
        cur.execute(sql.SQL("SELECT spec FROM {} ORDER BY topology_id").format(store.t("topologies")))
        return [TopologySpec.from_config(config) for (config,) in cur.fetchall()]


def spec(store: StateStore, topology_id: str) -> TopologySpec:
    with store.db.transaction() as cur:
        return store.load(cur, topology_id)[1]
