"""Decisions in commit order (``DecisionSpec``): the requests a processing attempt staged are
decided inside the commit, per key in source order, on the committed balance -- set-based
around one loop per key (``guarded_run``), so a batch costs a few statements whatever its size.

What the commit does per decision, all in its one transaction:

1. take the attempt's requests whose id this decision has not decided before;
2. per key, run them in (seq, id) order from the committed balance (plus the headroom);
3. record each verdict (``verdicts``), add the granted amounts to the decision's state under
   the transactional value rule, and leave the verdicts in ``txn_verdicts`` for the output
   append, which keeps only the events emitted for the verdict each request got.
"""

from __future__ import annotations

from typing import Any

from psycopg2 import sql

from ..exceptions import ConfigError
from ..spec import DecisionSpec, StateSpec
from . import catalog
from . import sql as q
from .rows import Cursor, table

#: The temporary table of this commit's verdicts, read by the output append.
VERDICTS = sql.Identifier("txn_verdicts")


def staging_table(schema: str, topology_num: int, decision: DecisionSpec) -> sql.Composed:
    """The requests staged for one decision of topology number ``topology_num``."""
    return sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(f"dec_{topology_num}_{decision.name}"))


def columns(state: StateSpec) -> list[str]:
    """A decision's staging columns, in COPY order."""
    return ["txid", "attempt", *state.key_columns, "seq", "request", "amount"]


def create_staging_table(staging: sql.Composed, state: StateSpec) -> sql.Composed:
    # The key refuses one attempt deciding a request id twice (processors keep the first).
    return sql.SQL("CREATE TABLE IF NOT EXISTS {} (txid bigint NOT NULL, attempt integer NOT NULL, {keys}, "
                   "seq bigint, request text NOT NULL, amount {vt} NOT NULL, "
                   "PRIMARY KEY (txid, attempt, request))").format(
        staging, keys=q.key_defs(state), vt=sql.SQL(state.value_type))


def check_headroom(cur: Cursor, decision: DecisionSpec, state: StateSpec) -> None:
    """Refuse a decision whose headroom relation does not exist (checked at registration and commit)."""
    if decision.headroom_table is not None and not catalog.exists(cur, sql.SQL("{}.{}").format(
            *map(sql.Identifier, decision.headroom_table))):
        raise ConfigError(f"decision {decision.name!r}: its headroom {'.'.join(decision.headroom_table)!r} does not "
                          f"exist: create it (a table or view with columns {', '.join(state.key_columns)} and value), "
                          "or register the topology whose state table it is first")


def decide(cur: Cursor, schema: str, topology_id: str, decision: DecisionSpec, state: StateSpec,
           staging: sql.Composed, txid: int, attempt: int) -> tuple[int, int]:
    """Decide the requests ``attempt`` of ``txid`` staged for ``decision`` (see the module
    docstring); returns (granted, declined)."""
    cur.execute(sql.SQL("CREATE TEMP TABLE IF NOT EXISTS {} (decision text, request text, granted boolean) "
                        "ON COMMIT DELETE ROWS").format(VERDICTS))
    decided = sql.Identifier(f"txn_decided_{decision.name}")
    cur.execute(sql.SQL("CREATE TEMP TABLE {} ({keys}, request text, seq bigint, amount {vt}, granted boolean, "
                        "balance numeric) ON COMMIT DROP").format(
        decided, keys=q.key_defs(state), vt=sql.SQL(state.value_type)))
    headroom: sql.Composable = sql.SQL("0")
    if decision.headroom_table is not None:
        headroom = sql.SQL("coalesce((SELECT sum(h.value) FROM {}.{} h WHERE {}), 0)").format(
            *map(sql.Identifier, decision.headroom_table), q.same_keys(state, "h", "r"))
    params: dict[str, Any] = {"t": topology_id, "d": decision.name, "txid": txid, "attempt": attempt,
                              "floor": decision.floor}
    check_headroom(cur, decision, state)
    cur.execute(sql.SQL(
        "INSERT INTO {decided} "
        "WITH fresh AS (SELECT * FROM {stg} r WHERE r.txid = %(txid)s AND r.attempt = %(attempt)s "
        "  AND NOT EXISTS (SELECT 1 FROM {verdicts} v WHERE v.topology_id = %(t)s AND v.decision = %(d)s "
        "  AND v.request_id = r.request OFFSET 0)), "
        "runs AS (SELECT {keys}, array_agg(request ORDER BY seq, request) AS requests, "
        "  array_agg(seq ORDER BY seq, request) AS seqs, array_agg(amount ORDER BY seq, request) AS amounts "
        "  FROM fresh GROUP BY {keys}) "
        "SELECT {r_keys}, u.request, u.seq, u.amount, u.granted, u.balance FROM runs r "
        "LEFT JOIN {state} s ON {s_is_r}, "
        "LATERAL {schema}.guarded_run(coalesce(s.value, 0) + {headroom}, %(floor)s, r.amounts::numeric[]) g, "
        "LATERAL unnest(r.requests, r.seqs, r.amounts, g.grants, g.balances) "
        "  AS u(request, seq, amount, granted, balance)").format(
        decided=decided, stg=staging, verdicts=table(schema, "verdicts"), keys=q.key_list(state),
        r_keys=q.key_list(state, "r"), state=q.state_table(state), s_is_r=q.same_keys(state, "s", "r"),
        schema=sql.Identifier(schema), headroom=headroom), params)
    # In the index's order: each request appends to the pages it needs, instead of random inserts.
    cur.execute(sql.SQL(
        "INSERT INTO {verdicts} (topology_id, decision, request_id, txid, seq, key, amount, granted, balance_after) "
        "SELECT %(t)s, %(d)s, request, %(txid)s, seq, jsonb_build_array({keys}), amount, granted, balance "
        "FROM {decided} ORDER BY request").format(verdicts=table(schema, "verdicts"), keys=q.key_list(state),
                                                  decided=decided), params)
    cur.execute(sql.SQL("INSERT INTO {} SELECT %(d)s, request, granted FROM {}").format(VERDICTS, decided), params)
    delta = sql.SQL("SELECT {keys}, sum(amount) AS value FROM {decided} WHERE granted GROUP BY {keys}").format(
        keys=q.key_list(state), decided=decided)
    cur.execute(q.upsert(state, q.state_table(state), delta), params)
    cur.execute(sql.SQL("SELECT count(*) FILTER (WHERE granted), count(*) FILTER (WHERE NOT granted) FROM {}")
                .format(decided))
    granted, declined = cur.fetchone()
    return int(granted), int(declined)


def delete_verdicts(cur: Cursor, schema: str, topology_id: str) -> None:
    cur.execute(sql.SQL("DELETE FROM {} WHERE topology_id = %s").format(table(schema, "verdicts")), (topology_id,))


def verdicts(cur: Cursor, schema: str, topology_id: str, decision: str,
             request_ids: list[str]) -> dict[str, dict[str, Any]]:
    """The verdicts on ``request_ids`` (absent: not decided yet), by request id."""
    cur.execute(sql.SQL("SELECT request_id, txid, granted, amount, balance_after, key FROM {} "
                        "WHERE topology_id = %s AND decision = %s AND request_id = ANY(%s)")
                .format(table(schema, "verdicts")), (topology_id, decision, request_ids))
    return {r: {"txid": t, "granted": g, "amount": a, "balance_after": b, "key": k}
            for r, t, g, a, b, k in cur.fetchall()}

