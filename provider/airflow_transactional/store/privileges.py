"""Least privilege: the grants that let three roles share one state store, none able to become another.

* the **owner** owns the provider's schema: it migrates it, registers topologies (their
  declarations and tables), creates logs, applies retention, audits, rebuilds and resets;
* the **run-time** role (what Airflow's tasks connect as) plans, processes and commits: it may
  move a topology's progress (checkpoint, transactions, attempts, staged rows, the audit log,
  the quarantine, output events) and nothing else -- never a declaration (what the owner's
  commands would run or drop), never a log's retention, never a table's shape;
* a **producer** role appends to the logs it is given through one door, ``append_events`` (a
  function that runs with the owner's rights, checks who calls it, and refuses ids in a
  topology's id space), and can do nothing else: read no state, move no counter, touch no
  other log;
* an optional **auditor** role (what the verify tasks connect as, ``verify_conn_id``) runs the
  shadow audit: it alone then writes its verdicts (``verifications``), moves the mark
  ``verified_through`` and stages what a round recomputes (the ``vfy_*`` tables), so a role that
  commits cannot also say that what it committed was checked. Without one, the run-time role
  does that too.

:func:`grant_statements` returns the statements; the owner runs them (``airflow-txn grant``)
after registering its topologies, and again after adding one. They begin by revoking what the
role had in the schema, so running them again narrows a role granted more by an older release.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from psycopg2 import sql

from .. import identifiers
from ..exceptions import ConfigError
from . import decisions, outputs
from . import state as q
from .rows import Cursor

if TYPE_CHECKING:  # the store takes declarations, it does not depend on them
    from ..spec import TopologySpec

#: What the run-time role may change in the provider's own tables, beyond reading them all:
#: (table, privileges). A column list limits an UPDATE to those columns.
RUNTIME_WRITES: tuple[tuple[str, str], ...] = (
    ("topologies", "UPDATE (committed_txid, committed_offsets, last_commit_at, lost_records, offsets_skipped)"),
    ("transactions", "INSERT, UPDATE"),
    ("attempts", "INSERT, UPDATE"),
    ("commits", "INSERT"),
    ("quarantine", "INSERT, DELETE, UPDATE (committed)"),
    ("landing_files", "INSERT, UPDATE (size, mtime, mtime_ns, inode, sha256, plain, version)"),
    ("landing_listings", "INSERT, UPDATE (full_at)"),
    ("decision_requests", "INSERT, DELETE"),
    ("decision_checks", "INSERT, DELETE"),
    ("decision_conflicts", "INSERT, DELETE"),
    ("decision_runs", "INSERT"),
    ("output_ranges", "INSERT"),  # the commit records where it appended
    ("log_versions", "INSERT"),  # a correction's commit records its retractions and new versions
    ("publications", "INSERT, UPDATE"),  # the publish task records how far it published
    ("published_retractions", "INSERT"),  # ... and where a correction's retractions went
    ("turns", "INSERT, UPDATE"),  # decisions, publishers and verifiers take turns by its rows' locks
)
#: What a round of the shadow audit writes -- the auditor role's, or the run-time role's without one
#: (besides each topology's ``vfy_*`` tables, where it stages what it recomputed). A correction's
#: preview creates tables: the owner's alone, and so are the previews it records.
AUDIT_WRITES: tuple[tuple[str, str], ...] = (
    ("topologies", "UPDATE (verified_through)"),  # never past the committed txid (a CHECK)
    ("verifications", "INSERT, UPDATE, DELETE"),
    ("turns", "INSERT, UPDATE"),  # one round at a time per topology
)
APPEND_FUNCTION = "append_events(text, integer[], text[], text[])"
#: The commit's door into a log (output events): the run-time role writes no log table itself.
OUTPUTS_FUNCTION = "append_outputs(text, integer, text[], text[])"
#: Row-level security on the logs: who sees which log's row (every other log table is out of a
#: producer's reach altogether).
WRITERS_POLICY = "txn_log_writers"
#: Row-level security on ``log_writers``: a role sees the rows that name it (or a role it is in).
OWN_ROWS_POLICY = "txn_own_rows"


def grant_statements(schema: str, topologies: Sequence[tuple[int, TopologySpec]], *, runtime_role: str,
                     producer_role: str | None = None, logs: Sequence[str] = (),
                     readable: Sequence[str] = (), auditor_role: str | None = None) -> list[sql.Composed]:
    """Everything the run-time role (and a producer of ``logs``, and an auditor) needs, and no more,
    for the registered ``topologies`` (number, declaration). A table the run-time role may read
    that is no state of theirs -- a decision's headroom -- must be among ``readable``
    ("schema.table"): a declaration alone must not open any table of the database to it."""
    unnamed = sorted({f"{h[0]}.{h[1]}" for _num, spec in topologies for d in spec.decisions
                      if (h := d.headroom_table) is not None} - {_qualified(t) for t in readable})
    if unnamed:
        raise ConfigError(f"the declarations registered make the run-time role read {', '.join(unnamed)} (a "
                          "decision's headroom), which is no state of theirs: grant it only if it is meant to be "
                          "read -- add " + " ".join(f"--readable {t}" for t in unnamed))
    s = sql.Identifier(identifiers.name("schema name", schema))
    runtime = sql.Identifier(identifiers.name("role name", runtime_role))
    out = [*_revoke_all(s, runtime),
           sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(s, runtime),
           sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA {} TO {}").format(s, runtime),
           sql.SQL("GRANT USAGE ON SEQUENCE {}.quarantine_id_seq TO {}").format(s, runtime),
           sql.SQL("GRANT EXECUTE ON FUNCTION {}." + OUTPUTS_FUNCTION + " TO {}").format(s, runtime)]
    auditor = runtime if auditor_role is None else sql.Identifier(identifiers.name("role name", auditor_role))
    if auditor_role is not None:
        out += [*_revoke_all(s, auditor),
                sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(s, auditor),
                sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA {} TO {}").format(s, auditor)]
    out += [sql.SQL("GRANT " + rights + " ON {}.{} TO {}").format(s, sql.Identifier(table), role)
            for writes, role in ((RUNTIME_WRITES, runtime), (AUDIT_WRITES, auditor)) for table, rights in writes]
    for num, spec in topologies:
        out += _topology_grants(schema, num, spec, runtime, auditor)
    logs_table = sql.SQL("{}.logs").format(s)
    writers_table = sql.SQL("{}.log_writers").format(s)
    out.append(sql.SQL("ALTER TABLE {} ENABLE ROW LEVEL SECURITY").format(logs_table))
    for name, role in {runtime_role: runtime, auditor_role or runtime_role: auditor}.items():  # both read every log
        policy = sql.Identifier(f"txn_{name}")
        out += [sql.SQL("DROP POLICY IF EXISTS {} ON {}").format(policy, logs_table),
                sql.SQL("CREATE POLICY {} ON {} TO {} USING (true)").format(policy, logs_table, role)]
    # Which roles write which logs: a producer sees its own rows only (it listed every producer role
    # and the logs each may write).
    policy = sql.Identifier(f"txn_{runtime_role}")
    out += [sql.SQL("ALTER TABLE {} ENABLE ROW LEVEL SECURITY").format(writers_table),
            sql.SQL("DROP POLICY IF EXISTS {} ON {}").format(policy, writers_table),
            sql.SQL("CREATE POLICY {} ON {} TO {} USING (true)").format(policy, writers_table, runtime),
            sql.SQL("DROP POLICY IF EXISTS {} ON {}").format(sql.Identifier(OWN_ROWS_POLICY), writers_table),
            sql.SQL("CREATE POLICY {} ON {} USING (EXISTS (SELECT 1 FROM pg_catalog.pg_roles r "
                    "WHERE r.rolname = role_name AND pg_has_role(current_user, r.oid, 'MEMBER')))")
            .format(sql.Identifier(OWN_ROWS_POLICY), writers_table)]
    if producer_role is None:
        return out
    producer = sql.Identifier(identifiers.name("role name", producer_role))
    out += [*_revoke_all(s, producer),
            sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(s, producer),
            sql.SQL("GRANT SELECT ON {}.logs, {}.log_writers TO {}").format(s, s, producer),
            sql.SQL("GRANT EXECUTE ON FUNCTION {}." + APPEND_FUNCTION + " TO {}").format(s, producer),
            sql.SQL("DELETE FROM {}.log_writers WHERE role_name = {}").format(s, sql.Literal(producer_role))]
    out += [sql.SQL("INSERT INTO {}.log_writers (log_name, role_name) VALUES ({}, {})").format(
        s, sql.Literal(identifiers.name("log name", log)), sql.Literal(producer_role)) for log in logs]
    writers = sql.Identifier(WRITERS_POLICY)
    out += [sql.SQL("DROP POLICY IF EXISTS {} ON {}").format(writers, logs_table),
            sql.SQL("CREATE POLICY {} ON {} USING (EXISTS (SELECT 1 FROM {}.log_writers w "
                    "WHERE w.log_name = logs.log_name AND pg_has_role(current_user, w.role_name, 'MEMBER')))")
            .format(writers, logs_table, s)]
    return out


def _revoke_all(s: sql.Identifier, role: sql.Identifier) -> list[sql.Composed]:
    return [sql.SQL("REVOKE ALL ON ALL TABLES IN SCHEMA {} FROM {}").format(s, role),
            sql.SQL("REVOKE ALL ON ALL SEQUENCES IN SCHEMA {} FROM {}").format(s, role),
            sql.SQL("REVOKE ALL ON ALL FUNCTIONS IN SCHEMA {} FROM {}").format(s, role)]


def _qualified(table: str) -> str:
    found = identifiers.qualified_table(table, "public")
    return f"{found[0]}.{found[1]}"


def _topology_grants(schema: str, num: int, spec: TopologySpec, runtime: sql.Identifier,
                     auditor: sql.Identifier) -> list[sql.Composed]:
    """The run-time role on one topology's tables: its staging (write, delete), its state tables
    (read, insert, update: the commit's upsert) and the headroom its decisions read; the auditor
    (who may be the run-time role) on the tables a round stages in (made here for a topology
    registered before them), and its states (read: a round adds them up against their history)."""
    staging = [q.staging_table(schema, num, st) for st in (*spec.states, *spec.building)]
    staging += [decisions.staging_table(schema, num, d) for d in spec.decisions]
    staging += [decisions.runs_table(schema, num, d) for d in spec.decisions]
    verified = [q.verify_table(schema, num, st) for st in spec.states]
    out = [q.create_staging_table(t, st) for t, st in zip(verified, spec.states, strict=True)]
    if spec.outputs:
        staging.append(outputs.staging_table(schema, num))
        verified.append(outputs.verify_table(schema, num))
        out.append(outputs.create_staging_table(verified[-1]))  # IF NOT EXISTS, as the states'
    out += [sql.SQL("GRANT SELECT, INSERT, DELETE ON {} TO {}").format(t, runtime) for t in staging]
    out += [sql.SQL("GRANT SELECT, INSERT, DELETE ON {} TO {}").format(t, auditor) for t in verified]
    for state in spec.states:
        if state.database is not None:
            continue
        state_schema, _table = state.schema_and_table
        out += [sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(state_schema), runtime),
                sql.SQL("GRANT SELECT, INSERT, UPDATE ON {} TO {}").format(q.state_table(state), runtime)]
        if auditor != runtime:
            out += [sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(state_schema), auditor),
                    sql.SQL("GRANT SELECT ON {} TO {}").format(q.state_table(state), auditor)]
    for d in spec.decisions:
        if d.headroom_table is not None:
            h_schema, h_table = d.headroom_table
            out += [sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(h_schema), runtime),
                    sql.SQL("GRANT SELECT ON {}.{} TO {}").format(sql.Identifier(h_schema),
                                                                  sql.Identifier(h_table), runtime)]
    return out


#: What :func:`grant_like` copies: the privileges this module grants on the provider's tables.
_COPIED = frozenset({"SELECT", "INSERT", "UPDATE", "DELETE"})


def grant_like(cur: Cursor, model: sql.Composed, table: sql.Composed) -> None:
    """Give ``table`` the grants ``model`` has to other roles: a table made for a running topology
    (a state added to it) is reached by the roles that reach its others, without a new ``grant``."""
    cur.execute("SELECT grantee, privilege_type FROM information_schema.role_table_grants WHERE grantee NOT IN "
                "(current_user, 'PUBLIC') AND format('%%I.%%I', table_schema, table_name)::regclass = %s::regclass",
                (model.as_string(cur),))
    for grantee, privilege in cur.fetchall():
        if privilege in _COPIED:
            cur.execute(sql.SQL("GRANT {} ON {} TO {}").format(sql.SQL(privilege), table, sql.Identifier(grantee)))
