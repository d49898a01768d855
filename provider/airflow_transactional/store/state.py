"""The SQL of the state store that depends on a topology's declaration: state tables, staging
tables, and the commit's set-based upsert with the transactional / opaque value rules. The
statements are named queries (``store/queries/state.sql``); this module composes in what one
state declares: its tables, its key columns, its value type and combiner.

Identifiers are validated by :mod:`airflow_transactional.identifiers` when the spec is built and
quoted here with ``sql.Identifier``; values are always parameters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from psycopg2 import sql

from ..values import Combiner, ValueKind
from .statements import query

if TYPE_CHECKING:  # the store takes declarations, it does not depend on them
    from ..spec import StateSpec


def _own(schema: str, prefix: str, topology_num: int, name: str) -> sql.Composed:
    return sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(f"{prefix}_{topology_num}_{name}"))


def staging_table(schema: str, topology_num: int, state: StateSpec) -> sql.Composed:
    """Staged partials of one state, keyed by (txid, attempt, key)."""
    return _own(schema, "stg", topology_num, state.name)


def verify_table(schema: str, topology_num: int, state: StateSpec) -> sql.Composed:
    """Where a round of the shadow audit stages what it recomputed of a state (the staging table's
    shape, attempt -1): apart from the staging table, so that with an auditor role the role that
    stages attempts cannot write what the auditor's round judges."""
    return _own(schema, "vfy", topology_num, state.name)


def history_view(schema: str, topology_num: int, state: StateSpec) -> sql.Composed:
    """A state's delta history as a view: (txid, key..., delta) of every committed txid."""
    return _own(schema, "dlt", topology_num, state.name)


def rename_own(schema: str, topology_num: int, state: StateSpec, name: str) -> list[sql.Composed]:
    """Statements that give a state's staging and verification tables and its history view the
    names of state ``name``'s (the history view follows its staging table: it refers to it)."""
    return [query("catalog_rename_view" if prefix == "dlt" else "catalog_rename_table",
                  table=_own(schema, prefix, topology_num, state.name),
                  name=sql.Identifier(f"{prefix}_{topology_num}_{name}")) for prefix in ("stg", "vfy", "dlt")]


def create_history_view(view: sql.Composed, staging: sql.Composed, state: StateSpec, schema: str,
                        topology_id: str) -> sql.Composed:
    return query("state_history_view", schema, view=view, table=staging, keys=key_list(state, "s"),
                 topology=sql.Literal(topology_id))


def drop_history_view(view: sql.Composed) -> sql.Composed:
    return query("drop_view_if_exists", view=view)


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


def _shape(state: StateSpec) -> dict[str, sql.Composable]:
    """What a statement of ``store/queries/state.sql`` takes from the state's declaration."""
    return {"key_defs": key_defs(state), "keys": key_list(state), "value_type": sql.SQL(state.value_type)}


def _opaque(state: StateSpec) -> bool:
    return ValueKind(state.kind) is ValueKind.OPAQUE


def create_state_table(state: StateSpec) -> list[sql.Composed]:
    schema, _ = state.schema_and_table
    prev = sql.SQL("prev_value {}, ").format(sql.SQL(state.value_type)) if _opaque(state) else sql.SQL("")
    return [query("state_create_schema", schema=sql.Identifier(schema)),
            query("state_create", table=state_table(state), prev=prev, **_shape(state))]


def expected_columns(state: StateSpec) -> dict[str, str]:
    """Column name -> type (as ``format_type`` spells it) a state table must have."""
    cols = dict(state.keys)
    cols["value"] = state.value_type
    if _opaque(state):
        cols["prev_value"] = state.value_type
    cols["txid"] = "bigint"
    return cols


def create_staging_table(table: sql.Composed, state: StateSpec) -> sql.Composed:
    return query("state_staging_create", table=table, **_shape(state))


def create_delta_table(table: sql.Identifier, state: StateSpec) -> sql.Composed:
    """A temporary table for one attempt's delta (keys, value), dropped at commit."""
    return query("state_delta_create", table=table, **{**_shape(state), "key_defs": key_defs(state, null=True)})


def staging_columns(state: StateSpec) -> list[str]:
    return ["txid", "attempt", *state.key_columns, "value"]


def count_staged(table: sql.Composed) -> sql.Composed:
    return query("state_staged_count", table=table)


def delete_staged_txid(table: sql.Composed) -> sql.Composed:
    return query("state_staged_delete", table=table)


def staged_delta(table: sql.Composed, state: StateSpec) -> sql.Composed:
    """The delta of one attempt: ``SELECT keys, value`` (parameters ``txid``, ``attempt``)."""
    return query("state_staged_delta", table=table, keys=key_list(state))


def upsert(state: StateSpec, target: sql.Composed, delta: sql.Composable) -> sql.Composed:
    """Apply ``delta`` (a SELECT of keys, value) as batch ``%(txid)s`` under the value rule
    (``state_upsert_transactional`` / ``state_upsert_opaque``). Rows whose stored txid is *later*
    are not touched; :func:`rows_ahead` finds them so the commit can refuse."""
    combiner = Combiner(state.combiner)
    new = sql.SQL("EXCLUDED.value")
    parts = {"target": target, "keys": key_list(state), "delta": delta}
    if not _opaque(state):
        return query("state_upsert_transactional", combined=combine_sql(combiner, sql.SQL("t.value"), new), **parts)
    return query("state_upsert_opaque", from_prev=combine_sql(combiner, sql.SQL("t.prev_value"), new),
                 from_value=combine_sql(combiner, sql.SQL("t.value"), new), **parts)


def can_overflow(state: StateSpec) -> bool:
    """Whether adding a delta to a stored value can leave the state's type (a sum of integers or
    doubles; ``numeric`` holds any sum)."""
    return Combiner(state.combiner).numeric and state.value_type in ("bigint", "integer", "double precision")


def find_overflows(state: StateSpec, delta: sql.Composable) -> sql.Composed:
    """The delta rows (key as JSON, committed value, delta) whose sum with the value they fold into
    leaves ``%(low)s .. %(high)s``; they are kept in ``txn_overflow`` for :func:`without_overflows`.
    The value folded into is the value rule's: ``prev_value`` for an opaque value this txid wrote."""
    base = sql.SQL("CASE WHEN t.txid = %(txid)s THEN t.prev_value ELSE t.value END" if _opaque(state) else "t.value")
    return query("state_find_overflows", d_keys=key_list(state, "d"), base=base, delta=delta,
                 target=state_table(state), t_is_d=same_keys(state, "t", "d"), keys=key_list(state))


def without_overflows(state: StateSpec, delta: sql.Composable) -> sql.Composed:
    """``delta`` without the rows :func:`find_overflows` set aside."""
    return query("state_without_overflows", delta=delta, o_is_d=same_keys(state, "o", "d"))


def combine_sql(combiner: Combiner, old: sql.Composable, new: sql.Composable) -> sql.Composed:
    """The SQL expression of :func:`..values.combine` (``old`` may be NULL)."""
    if combiner in (Combiner.SUM, Combiner.COUNT):
        return sql.SQL("CASE WHEN {o} IS NULL THEN {n} ELSE {o} + {n} END").format(o=old, n=new)
    if combiner is Combiner.MIN:
        return sql.SQL("LEAST({o}, {n})").format(o=old, n=new)  # LEAST ignores NULL
    if combiner is Combiner.MAX:
        return sql.SQL("GREATEST({o}, {n})").format(o=old, n=new)
    return sql.SQL("{n}").format(n=new)


def same_keys(state: StateSpec, a: str, b: str) -> sql.Composed:
    """``a.k1 = b.k1 AND ...`` over the state's key columns."""
    return sql.SQL(" AND ").join(sql.SQL("{} = {}").format(sql.Identifier(a, c), sql.Identifier(b, c))
                                 for c in state.key_columns)


def rows_ahead(state: StateSpec, target: sql.Composed, delta: sql.Composable) -> sql.Composed:
    """Count delta keys whose stored value already carries a txid later than ``%(txid)s``."""
    return query("state_rows_ahead", delta=delta, target=target, t_is_d=same_keys(state, "t", "d"))


def copy_into(table: sql.Composable, columns: list[str], *, csv: bool = False) -> sql.Composed:
    """``COPY table (columns) FROM STDIN``, in COPY's text format or (``csv``) as CSV."""
    return query("copy_into_csv" if csv else "copy_into", table=table,
                 columns=sql.SQL(", ").join(map(sql.Identifier, columns)))


def audit_table(schema: str, topology_num: int, state: StateSpec, purpose: str = "audit") -> sql.Composed:
    """Where an audit (or a rebuild) loads the state it recomputed from the source; dropped after."""
    return sql.SQL("{}.{}").format(sql.Identifier(schema),
                                   sql.Identifier(f"{purpose}_{topology_num}_{state.name}"))


def create_audit_table(table: sql.Composed, state: StateSpec) -> list[sql.Composed]:
    return [query("state_audit_create", table=table, **_shape(state))]


def audit_diff(state: StateSpec, recomputed: sql.Composed) -> sql.Composed:
    """Keys whose stored value differs from the recomputed one: (key as text, stored, recomputed)."""
    key_text = sql.SQL(" || ',' || ").join(
        sql.SQL("coalesce(a.{c}, s.{c})::text").format(c=sql.Identifier(c)) for c in state.key_columns)
    additive = Combiner(state.combiner) in (Combiner.SUM, Combiner.COUNT)
    return query("state_audit_diff", key_text=key_text, recomputed=recomputed, target=state_table(state),
                 a_is_s=same_keys(state, "a", "s"), zero=sql.SQL("0" if additive else "NULL"))


def fold_recomputed(state: StateSpec, target: sql.Composed, extra: sql.Composed) -> sql.Composed:
    """Fold ``extra``'s rows into the recomputation ``target``, each key's values combined by the state's rule."""
    return query("state_fold_recomputed", target=target, extra=extra, keys=key_list(state),
                 combined=combine_sql(Combiner(state.combiner), sql.SQL("t.value"), sql.SQL("EXCLUDED.value")))


def rebuild_shadow(state: StateSpec, shadow: sql.Identifier, recomputed: sql.Composed) -> list[sql.Composed]:
    """A temporary copy of the state table, filled with the recomputed values as of ``%(txid)s``."""
    opaque = _opaque(state)
    return [query("state_shadow_create", shadow=shadow, target=state_table(state)),
            query("state_shadow_fill", shadow=shadow, recomputed=recomputed, keys=key_list(state),
                  prev=sql.SQL("prev_value, " if opaque else ""), null=sql.SQL("NULL, " if opaque else ""))]


def replace_contents(state: StateSpec, shadow: sql.Identifier) -> list[sql.Composed]:
    """Make the state table hold the shadow's rows, in place, writing only what differs."""
    target = state_table(state)
    values = [c for c in expected_columns(state) if c not in state.keys]
    return [query("state_replace_delete", target=target, shadow=shadow, s_is_t=same_keys(state, "s", "t")),
            query("state_replace_write", target=target, shadow=shadow, keys=key_list(state),
                  columns=sql.SQL(", ").join(map(sql.Identifier, expected_columns(state))),
                  new=sql.SQL(", ").join(sql.SQL("{} = EXCLUDED.{}").format(sql.Identifier(c), sql.Identifier(c))
                                         for c in values),
                  old=sql.SQL(", ").join(sql.Identifier("t", c) for c in values),
                  excluded=sql.SQL(", ").join(sql.Identifier("excluded", c) for c in values))]
