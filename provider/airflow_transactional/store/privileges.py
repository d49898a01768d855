"""Least privilege: the grants that let three roles share one state store safely.

* the **owner** owns the provider's schema: it migrates it, registers topologies (creating their
  state and staging tables), creates logs, applies retention, audits and rebuilds;
* the **run-time** role (what Airflow's tasks connect as) plans, processes and commits: DML on
  the provider's tables and on the state tables, nothing else -- it cannot create, alter or
  drop anything;
* a **producer** role appends to the event logs it is given, and to no other: it can read no
  state, and row-level security keeps it out of other logs' rows.

:func:`grant_statements` returns the statements; the owner runs them (``airflow-txn grant``)
after registering its topologies, and again after adding one.
"""

from __future__ import annotations

from collections.abc import Sequence

from psycopg2 import sql

from .. import identifiers
from ..spec import TopologySpec

# The tables of the provider's schema a producer touches, and how.
_PRODUCER = {"logs": "SELECT", "log_partitions": "SELECT, UPDATE", "log_events": "SELECT, INSERT",
             "log_retired_ids": "SELECT"}
_LOG_TABLES = ("logs", "log_partitions", "log_events", "log_retired_ids")


def grant_statements(schema: str, specs: Sequence[TopologySpec], *, runtime_role: str,
                     producer_role: str | None = None, logs: Sequence[str] = ()) -> list[sql.Composed]:
    """Everything the run-time role (and a producer of ``logs``) needs, and no more."""
    s = sql.Identifier(identifiers.name("schema name", schema))
    runtime = sql.Identifier(identifiers.name("role name", runtime_role))
    out = [sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(s, runtime),
           sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {} TO {}").format(s, runtime),
           sql.SQL("GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {} TO {}").format(s, runtime)]
    for spec in specs:
        for state in spec.states:
            if state.database is not None:
                continue
            state_schema, table = state.schema_and_table
            out += [sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(state_schema), runtime),
                    sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON {}.{} TO {}").format(
                        sql.Identifier(state_schema), sql.Identifier(table), runtime)]
    # Row-level security on the logs: the run-time role sees every log, a producer only its own.
    for table in _LOG_TABLES:
        t = sql.SQL("{}.{}").format(s, sql.Identifier(table))
        out += [sql.SQL("ALTER TABLE {} ENABLE ROW LEVEL SECURITY").format(t),
                sql.SQL("DROP POLICY IF EXISTS {} ON {}").format(sql.Identifier(f"txn_{runtime_role}"), t),
                sql.SQL("CREATE POLICY {} ON {} TO {} USING (true) WITH CHECK (true)").format(
                    sql.Identifier(f"txn_{runtime_role}"), t, runtime)]
    if producer_role is None:
        return out
    producer = sql.Identifier(identifiers.name("role name", producer_role))
    own = [identifiers.name("log name", log) for log in logs]
    out.append(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(s, producer))
    for table, rights in _PRODUCER.items():
        out.append(sql.SQL("GRANT " + rights + " ON {}.{} TO {}").format(s, sql.Identifier(table), producer))
    for table in _LOG_TABLES:
        policy = sql.Identifier(f"txn_{producer_role}")
        t = sql.SQL("{}.{}").format(s, sql.Identifier(table))
        out += [sql.SQL("DROP POLICY IF EXISTS {} ON {}").format(policy, t),
                sql.SQL("CREATE POLICY {} ON {} TO {} USING (log_name = ANY({})) WITH CHECK (log_name = ANY({}))")
                .format(policy, t, producer, sql.Literal(own), sql.Literal(own))]
    return out
