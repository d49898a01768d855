"""All SQL of the state store that depends on a topology's declaration: state tables, staging
tables, and the commit's set-based upsert with the transactional / opaque value rules.

Identifiers are validated by :mod:`airflow_transactional.identifiers` when the spec is built and
quoted here with ``sql.Identifier``; values are always ``%s`` parameters.
"""

from __future__ import annotations

from psycopg2 import sql

from ..spec import StateSpec
from ..values import Combiner, ValueKind, combine_sql


def staging_table(schema: str, topology_num: int, state: StateSpec) -> sql.Composed:
    """Staged partials of one state, keyed by (txid, attempt, key)."""
    return sql.SQL("{}.{}").format(sql.Identifier(schema),
                                   sql.Identifier(f"stg_{topology_num}_{state.name}"))


def state_table(state: StateSpec) -> sql.Composed:
    schema, table = state.schema_and_table
    return sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(table))


def state_marker(topology_id: str, state: StateSpec) -> str:
    """The comment that marks a state table as made (or taken) by a topology's registration."""
    return f"airflow_transactional: state {state.name} of topology {topology_id}"


def key_defs(state: StateSpec, *, null: bool = False) -> sql.Composed:
    """The state's key columns with their types (NOT NULL unless ``null``), for a CREATE TABLE."""
    constraint = sql.SQL("" if null else " NOT NULL")
    return sql.SQL(", ").join(
        sql.SQL("{} {}{}").format(sql.Identifier(c), sql.SQL(t), constraint) for c, t in state.keys.items())


def key_list(state: StateSpec, prefix: str | None = None) -> sql.Composed:
    """The state's key columns, quoted, comma-separated (each qualified by ``prefix``, if given)."""
    if prefix:
        return sql.SQL(", ").join(sql.Identifier(prefix, c) for c in state.key_columns)
    return sql.SQL(", ").join(map(sql.Identifier, state.key_columns))


def create_state_table(state: StateSpec) -> list[sql.Composed]:
    schema, _ = state.schema_and_table
    opaque = ValueKind(state.kind) is ValueKind.OPAQUE
    cols = sql.SQL("{keys}, value {vt}, {prev}txid bigint NOT NULL, PRIMARY KEY ({pk})").format(
        keys=key_defs(state), vt=sql.SQL(state.value_type),
        prev=sql.SQL("prev_value {}, ").format(sql.SQL(state.value_type)) if opaque else sql.SQL(""),
        pk=key_list(state))
    return [
        sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)),
        sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(state_table(state), cols),
    ]


def expected_columns(state: StateSpec) -> dict[str, str]:
    """Column name -> type (as ``format_type`` spells it) a state table must have."""
    cols = dict(state.keys)
    cols["value"] = state.value_type
    if ValueKind(state.kind) is ValueKind.OPAQUE:
        cols["prev_value"] = state.value_type
    cols["txid"] = "bigint"
    return cols


def create_staging_table(table: sql.Composed, state: StateSpec) -> sql.Composed:
    return sql.SQL("CREATE TABLE IF NOT EXISTS {} (txid bigint NOT NULL, attempt integer NOT NULL, "
                   "{keys}, value {vt}, PRIMARY KEY (txid, attempt, {pk}))").format(
        table, keys=key_defs(state), vt=sql.SQL(state.value_type), pk=key_list(state))


def create_delta_table(table: sql.Identifier, state: StateSpec) -> sql.Composed:
    """A temporary table for one attempt's delta (keys, value), dropped at commit."""
    return sql.SQL("CREATE TEMP TABLE {} ({keys}, value {vt}) ON COMMIT DROP").format(
        table, keys=key_defs(state, null=True), vt=sql.SQL(state.value_type))


def staging_columns(state: StateSpec) -> list[str]:
    return ["txid", "attempt", *state.key_columns, "value"]


def count_staged(table: sql.Composed) -> sql.Composed:
    return sql.SQL("SELECT count(*) FROM {} WHERE txid = %s AND attempt = %s").format(table)


def delete_staged_txid(table: sql.Composed) -> sql.Composed:
    return sql.SQL("DELETE FROM {} WHERE txid = %s").format(table)


def staged_delta(table: sql.Composed, state: StateSpec) -> sql.Composed:
    """The delta of one attempt: ``SELECT keys, value`` (parameters ``txid``, ``attempt``)."""
    return sql.SQL("SELECT {keys}, value FROM {t} WHERE txid = %(txid)s AND attempt = %(attempt)s").format(
        keys=key_list(state), t=table)


def upsert(state: StateSpec, target: sql.Composed, delta: sql.Composable) -> sql.Composed:
    """Apply ``delta`` (a SELECT of keys, value) as batch ``%(txid)s`` under the value rule.

    Transactional: skip keys whose stored txid is already this batch's (``WHERE t.txid <
    EXCLUDED.txid``). Opaque: recompute from ``prev_value`` when the stored txid is this
    batch's, else shift ``value`` into ``prev_value``. Rows whose stored txid is *later* are not
    touched here; :func:`rows_ahead` finds them so the commit can refuse.
    """
    combiner = Combiner(state.combiner)
    t_val = sql.SQL("t.value")
    new = sql.SQL("EXCLUDED.value")
    keys = key_list(state)
    if ValueKind(state.kind) is ValueKind.TRANSACTIONAL:
        return sql.SQL(
            "INSERT INTO {target} AS t ({keys}, value, txid) "
            "SELECT {keys}, value, %(txid)s FROM ({delta}) d "
            "ON CONFLICT ({keys}) DO UPDATE SET value = {combined}, txid = EXCLUDED.txid "
            "WHERE t.txid < EXCLUDED.txid").format(
            target=target, keys=keys, delta=delta, combined=combine_sql(combiner, t_val, new))
    return sql.SQL(
        "INSERT INTO {target} AS t ({keys}, value, prev_value, txid) "
        "SELECT {keys}, value, NULL, %(txid)s FROM ({delta}) d "
        "ON CONFLICT ({keys}) DO UPDATE SET "
        "value = CASE WHEN t.txid = EXCLUDED.txid THEN {from_prev} ELSE {from_value} END, "
        "prev_value = CASE WHEN t.txid = EXCLUDED.txid THEN t.prev_value ELSE t.value END, "
        "txid = EXCLUDED.txid "
        "WHERE t.txid <= EXCLUDED.txid").format(
        target=target, keys=keys, delta=delta,
        from_prev=combine_sql(combiner, sql.SQL("t.prev_value"), new),
        from_value=combine_sql(combiner, t_val, new))


def can_overflow(state: StateSpec) -> bool:
    """Whether adding a delta to a stored value can leave the state's type (a sum of integers or
    doubles; ``numeric`` holds any sum)."""
    return Combiner(state.combiner).numeric and state.value_type in ("bigint", "integer", "double precision")


def find_overflows(state: StateSpec, delta: sql.Composable) -> sql.Composed:
    """The delta rows (key as JSON, committed value, delta) whose sum with the value they fold into
    leaves ``%(low)s .. %(high)s``; they are kept in ``txn_overflow`` for :func:`without_overflows`.
    The value folded into is the value rule's: ``prev_value`` for an opaque value this txid wrote."""
    base = (sql.SQL("CASE WHEN t.txid = %(txid)s THEN t.prev_value ELSE t.value END")
            if ValueKind(state.kind) is ValueKind.OPAQUE else sql.SQL("t.value"))
    return sql.SQL(
        "CREATE TEMP TABLE txn_overflow ON COMMIT DROP AS SELECT {d_keys}, {base} AS committed, d.value AS added "
        "FROM ({delta}) d JOIN {target} t ON {on} WHERE t.txid <= %(txid)s AND NOT "
        "coalesce({base}, 0)::numeric + d.value::numeric BETWEEN %(low)s AND %(high)s; "
        "SELECT jsonb_build_array({keys}), committed, added FROM txn_overflow").format(
        d_keys=key_list(state, "d"), base=base, delta=delta, target=state_table(state), on=same_keys(state, "t", "d"),
        keys=key_list(state))


def without_overflows(state: StateSpec, delta: sql.Composable) -> sql.Composed:
    """``delta`` without the rows :func:`find_overflows` set aside."""
    return sql.SQL("SELECT * FROM ({}) d WHERE NOT EXISTS (SELECT 1 FROM txn_overflow o WHERE {})").format(
        delta, same_keys(state, "o", "d"))


def same_keys(state: StateSpec, a: str, b: str) -> sql.Composed:
    """``a.k1 = b.k1 AND ...`` over the state's key columns."""
    return sql.SQL(" AND ").join(sql.SQL("{} = {}").format(sql.Identifier(a, c), sql.Identifier(b, c))
                                 for c in state.key_columns)


def rows_ahead(state: StateSpec, target: sql.Composed, delta: sql.Composable) -> sql.Composed:
    """Count delta keys whose stored value already carries a txid later than ``%(txid)s``."""
    on = same_keys(state, "t", "d")
    return sql.SQL("SELECT count(*) FROM ({delta}) d JOIN {target} t ON {on} WHERE t.txid > %(txid)s"
                   ).format(delta=delta, target=target, on=on)


def copy_into(table: sql.Composable, columns: list[str], *, csv: bool = False) -> sql.Composed:
    """``COPY table (columns) FROM STDIN``, in COPY's text format or (``csv``) as CSV."""
    return sql.SQL("COPY {} ({}) FROM STDIN{}").format(table, sql.SQL(", ").join(map(sql.Identifier, columns)),
                                                      sql.SQL(" WITH (FORMAT csv)" if csv else ""))


def audit_table(schema: str, topology_num: int, state: StateSpec, purpose: str = "audit") -> sql.Composed:
    """Where an audit (or a rebuild) loads the state it recomputed from the source; dropped after."""
    return sql.SQL("{}.{}").format(sql.Identifier(schema),
                                   sql.Identifier(f"{purpose}_{topology_num}_{state.name}"))


def create_audit_table(table: sql.Composed, state: StateSpec) -> list[sql.Composed]:
    return [sql.SQL("DROP TABLE IF EXISTS {}").format(table),
            sql.SQL("CREATE UNLOGGED TABLE {} ({keys}, value {vt}, PRIMARY KEY ({pk}))").format(
                table, keys=key_defs(state), vt=sql.SQL(state.value_type), pk=key_list(state))]


def audit_diff(state: StateSpec, recomputed: sql.Composed) -> sql.Composed:
    """Keys whose stored value differs from the recomputed one: (key as text, stored, recomputed)."""
    key_text = sql.SQL(" || ',' || ").join(
        sql.SQL("coalesce(a.{c}, s.{c})::text").format(c=sql.Identifier(c)) for c in state.key_columns)
    on = sql.SQL(" AND ").join(sql.SQL("a.{c} = s.{c}").format(c=sql.Identifier(c)) for c in state.key_columns)
    return sql.SQL("SELECT {kt}, s.value::text, a.value::text FROM {rec} a FULL JOIN {target} s ON {on} "
                   "WHERE a.value IS DISTINCT FROM s.value ORDER BY 1").format(
        kt=key_text, rec=recomputed, target=state_table(state), on=on)


def rebuild_shadow(state: StateSpec, shadow: sql.Identifier, recomputed: sql.Composed) -> list[sql.Composed]:
    """A temporary copy of the state table, filled with the recomputed values as of ``%(txid)s``."""
    opaque = ValueKind(state.kind) is ValueKind.OPAQUE
    return [
        sql.SQL("CREATE TEMP TABLE {} (LIKE {} INCLUDING ALL) ON COMMIT DROP").format(shadow, state_table(state)),
        sql.SQL("INSERT INTO {} ({keys}, value, {prev}txid) SELECT {keys}, value, {null}%(txid)s FROM {}").format(
            shadow, recomputed, keys=key_list(state), prev=sql.SQL("prev_value, " if opaque else ""),
            null=sql.SQL("NULL, " if opaque else "")),
    ]


def replace_contents(state: StateSpec, shadow: sql.Identifier) -> list[sql.Composed]:
    """Make the state table hold the shadow's rows, in place (grants and views stay valid): delete
    the keys the shadow lacks, write those that differ. Plain DML, so a reader whose snapshot
    predates the swap still sees the old rows (TRUNCATE would show it an empty table), and a
    rebuild that changed little writes little."""
    target, keys = state_table(state), key_list(state)
    values = [c for c in expected_columns(state) if c not in state.keys]
    cols = sql.SQL(", ").join(map(sql.Identifier, expected_columns(state)))
    new = sql.SQL(", ").join(sql.SQL("{} = EXCLUDED.{}").format(sql.Identifier(c), sql.Identifier(c)) for c in values)
    old = sql.SQL(", ").join(sql.Identifier("t", c) for c in values)
    excluded = sql.SQL(", ").join(sql.Identifier("excluded", c) for c in values)
    return [sql.SQL("DELETE FROM {} t WHERE NOT EXISTS (SELECT 1 FROM {} s WHERE {})").format(
                target, shadow, same_keys(state, "s", "t")),
            sql.SQL("INSERT INTO {} AS t ({c}) SELECT {c} FROM {} ON CONFLICT ({keys}) DO UPDATE SET {new} "
                    "WHERE ({old}) IS DISTINCT FROM ({excluded})").format(
                target, shadow, c=cols, keys=keys, new=new, old=old, excluded=excluded)]
