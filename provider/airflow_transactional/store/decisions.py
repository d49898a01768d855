"""Decisions in commit order (``DecisionSpec``): the requests a processing attempt staged are
decided inside the commit, per key in source order, on the committed balance.

The work is split where it is cheapest. When the attempt completes (:func:`prepare`, in the
processing task, in parallel with other txids) its requests are recorded once each -- those a
txid committed by then already decided are left out -- and summed per key: the run's total, its
lowest running balance relative to the start, its requests and amounts in order. The commit
(:func:`decide`, serial) then works per key, not per request:

1. requests a txid committed since the attempt completed decided already are taken out (only
   when txids were committed in between: pipelined processing);
2. a key whose run never goes below the floor from its committed balance (plus the headroom)
   has every request granted, in one comparison; only the other keys run the loop
   (``guarded_run``), request by request;
3. one row per key records the balance the run started from, with its verdicts only when one
   is a decline (``decision_runs``); the view ``verdicts`` has every request's verdict and the
   balance after it; the granted sums go to the decision's state under the transactional value
   rule, and ``txn_declined`` holds the declines for the output append, which keeps only the
   events emitted for the verdict each request got.
"""

from __future__ import annotations

from typing import Any

from psycopg2 import sql

from ..exceptions import ConfigError
from ..spec import DecisionSpec, StateSpec
from . import catalog
from . import sql as q
from .rows import Cursor, table

#: The temporary table of this commit's declined requests (decision, request), read by the output append.
DECLINED = sql.Identifier("txn_declined")


def staging_table(schema: str, topology_num: int, decision: DecisionSpec) -> sql.Composed:
    """The requests staged for one decision of topology number ``topology_num``."""
    return sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(f"dec_{topology_num}_{decision.name}"))


def runs_table(schema: str, topology_num: int, decision: DecisionSpec) -> sql.Composed:
    """Per completed attempt and key, its run of requests (see :func:`prepare`)."""
    return sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(f"dek_{topology_num}_{decision.name}"))


def columns(state: StateSpec) -> list[str]:
    """A decision's staging columns, in COPY order."""
    return ["txid", "attempt", *state.key_columns, "seq", "request", "amount"]


def create_staging_table(staging: sql.Composed, state: StateSpec) -> sql.Composed:
    # The key refuses one attempt deciding a request id twice (processors keep the first).
    return sql.SQL("CREATE TABLE IF NOT EXISTS {} (txid bigint NOT NULL, attempt integer NOT NULL, {keys}, "
                   "seq bigint, request text NOT NULL, amount {vt} NOT NULL, "
                   "PRIMARY KEY (txid, attempt, request))").format(
        staging, keys=q.key_defs(state), vt=sql.SQL(state.value_type))


def create_runs_table(runs: sql.Composed, state: StateSpec) -> sql.Composed:
    # ``low``: the run's lowest sum after a debit (NULL: no debit); every request is granted when
    # the start balance plus ``low`` is at or above the floor.
    return sql.SQL("CREATE TABLE IF NOT EXISTS {} (txid bigint NOT NULL, attempt integer NOT NULL, {keys}, "
                   "requests text[] NOT NULL, amounts numeric[] NOT NULL, total numeric NOT NULL, low numeric, "
                   "PRIMARY KEY (txid, attempt, {key_list}))").format(
        runs, keys=q.key_defs(state), key_list=q.key_list(state))


def check_headroom(cur: Cursor, decision: DecisionSpec, state: StateSpec) -> None:
    """Refuse a decision whose headroom relation does not exist (checked at registration and commit)."""
    if decision.headroom_table is not None and not catalog.exists(cur, sql.SQL("{}.{}").format(
            *map(sql.Identifier, decision.headroom_table))):
        raise ConfigError(f"decision {decision.name!r}: its headroom {'.'.join(decision.headroom_table)!r} does not "
                          f"exist: create it (a table or view with columns {', '.join(state.key_columns)} and value), "
                          "or register the topology whose state table it is first")


def prepare(cur: Cursor, schema: str, topology_id: str, decision: DecisionSpec, state: StateSpec,
            staging: sql.Composed, runs: sql.Composed, txid: int, attempt: int, committed: int) -> None:
    """Record the requests ``attempt`` of ``txid`` staged, when it completes (``committed``: the
    topology's committed txid now): each request not decided by then, with its place in its
    key's run, and each key's run; the staged rows are then removed."""
    s = sql.Identifier(schema)
    params: dict[str, Any] = {"t": topology_id, "d": decision.name, "txid": txid, "attempt": attempt,
                              "c": committed}
    if not catalog.exists(cur, runs):  # a topology registered before there were runs tables
        cur.execute(create_runs_table(runs, state))
    fresh = sql.Identifier(f"txn_fresh_{decision.name}")
    cur.execute(sql.SQL("CREATE TEMP TABLE {} ({keys}, request text, seq bigint, amount numeric, prefix numeric) "
                        "ON COMMIT DROP").format(fresh, keys=q.key_defs(state)))
    # OFFSET 0 keeps each NOT EXISTS one index probe per request.
    cur.execute(sql.SQL(
        "INSERT INTO {fresh} SELECT {keys}, request, seq, amount, "
        "sum(amount) OVER (PARTITION BY {keys} ORDER BY seq, request) FROM {stg} r "
        "WHERE r.txid = %(txid)s AND r.attempt = %(attempt)s "
        "AND NOT EXISTS (SELECT 1 FROM {s}.decision_requests o WHERE o.topology_id = %(t)s AND o.decision = %(d)s "
        "  AND o.request_id = r.request AND o.txid <= %(c)s OFFSET 0) "
        "AND NOT EXISTS (SELECT 1 FROM {s}.verdicts_v5 v WHERE v.topology_id = %(t)s AND v.decision = %(d)s "
        "  AND v.request_id = r.request OFFSET 0)").format(
        fresh=fresh, keys=q.key_list(state), stg=staging, s=s), params)
    cur.execute(sql.SQL(
        "INSERT INTO {s}.decision_requests "
        "(topology_id, decision, request_id, txid, attempt, seq, key, amount, prefix) "
        "SELECT %(t)s, %(d)s, request, %(txid)s, %(attempt)s, seq, jsonb_build_array({keys}), amount, prefix "
        "FROM {fresh} ORDER BY request").format(s=s, keys=q.key_list(state), fresh=fresh), params)
    cur.execute(sql.SQL(
        "INSERT INTO {runs} (txid, attempt, {keys}, requests, amounts, total, low) "
        "SELECT %(txid)s, %(attempt)s, {keys}, array_agg(request ORDER BY seq, request), "
        "array_agg(amount ORDER BY seq, request), sum(amount), min(prefix) FILTER (WHERE amount < 0) "
        "FROM {fresh} GROUP BY {keys}").format(runs=runs, keys=q.key_list(state), fresh=fresh), params)
    cur.execute(sql.SQL("WITH gone AS (DELETE FROM {} WHERE txid = %(txid)s AND attempt = %(attempt)s RETURNING 1) "
                        "INSERT INTO {}.decision_checks "
                        "(topology_id, decision, txid, attempt, checked_through, staged) "
                        "SELECT %(t)s, %(d)s, %(txid)s, %(attempt)s, %(c)s, count(*) FROM gone").format(staging, s),
                params)
    # What committed txids left behind is no longer read: the next attempt to complete clears it.
    cur.execute(sql.SQL("DELETE FROM {} WHERE txid <= %(c)s").format(runs), params)
    cur.execute(sql.SQL("DELETE FROM {}.decision_checks WHERE topology_id = %(t)s AND decision = %(d)s "
                        "AND txid <= %(c)s").format(s), params)
    cur.execute(sql.SQL("DROP TABLE {}").format(fresh))


def staged_count(cur: Cursor, schema: str, topology_id: str, decision: DecisionSpec, staging: sql.Composed,
                 txid: int, attempt: int) -> int:
    """How many requests ``attempt`` of ``txid`` staged (recorded at completion, or still staged)."""
    cur.execute(sql.SQL("SELECT staged FROM {}.decision_checks WHERE topology_id = %s AND decision = %s "
                        "AND txid = %s AND attempt = %s").format(sql.Identifier(schema)),
                (topology_id, decision.name, txid, attempt))
    row = cur.fetchone()
    if row is not None:
        return int(row[0])
    cur.execute(q.count_staged(staging), (txid, attempt))
    return int(cur.fetchone()[0])


def decide(cur: Cursor, schema: str, topology_id: str, decision: DecisionSpec, state: StateSpec,
           staging: sql.Composed, runs: sql.Composed, txid: int, attempt: int) -> tuple[int, int]:
    """Decide the requests ``attempt`` of ``txid`` staged for ``decision`` (see the module
    docstring); returns (granted, declined)."""
    s = sql.Identifier(schema)
    params: dict[str, Any] = {"t": topology_id, "d": decision.name, "txid": txid, "attempt": attempt,
                              "floor": decision.floor}
    check_headroom(cur, decision, state)
    cur.execute(sql.SQL("SELECT checked_through FROM {}.decision_checks WHERE topology_id = %(t)s "
                        "AND decision = %(d)s AND txid = %(txid)s AND attempt = %(attempt)s").format(s), params)
    row = cur.fetchone()
    if row is None:  # completed before completion recorded the requests: record them now
        prepare(cur, schema, topology_id, decision, state, staging, runs, txid, attempt, txid - 1)
        params["c"] = txid - 1
    else:
        params["c"] = int(row[0])
    mine = sql.SQL("k.txid = %(txid)s AND k.attempt = %(attempt)s")
    source = sql.SQL("SELECT {k_keys}, k.requests, k.amounts, k.total, k.low, false AS must_loop FROM {runs} k "
                     "WHERE {mine}").format(k_keys=q.key_list(state, "k"), runs=runs, mine=mine)
    taken = sql.Identifier(f"txn_taken_{decision.name}")
    if params["c"] < txid - 1:
        # Requests txids committed since the attempt completed decided already are not decided
        # again; their keys' runs are rebuilt without them and decided one by one.
        cur.execute(sql.SQL(
            "CREATE TEMP TABLE {taken} ON COMMIT DROP AS "
            "WITH gone AS (DELETE FROM {s}.decision_requests r WHERE r.topology_id = %(t)s AND r.decision = %(d)s "
            "AND r.txid = %(txid)s AND r.attempt = %(attempt)s AND EXISTS (SELECT 1 FROM {s}.decision_requests o "
            "WHERE o.topology_id = %(t)s AND o.decision = %(d)s AND o.request_id = r.request_id "
            "AND o.txid > %(c)s AND o.txid < %(txid)s OFFSET 0) RETURNING r.request_id, r.key) "
            "SELECT request_id::text AS request, key FROM gone").format(s=s, taken=taken), params)
        if cur.rowcount:
            lost = sql.SQL("EXISTS (SELECT 1 FROM {} x WHERE x.key = jsonb_build_array({}))").format(
                taken, q.key_list(state, "k"))
            source = sql.SQL(
                "{source} AND NOT {lost} UNION ALL "
                "SELECT {k_keys}, array_agg(u.request ORDER BY u.i), array_agg(u.amount ORDER BY u.i), "
                "sum(u.amount), NULL, true FROM {runs} k, "
                "unnest(k.requests, k.amounts) WITH ORDINALITY AS u(request, amount, i) "
                "WHERE {mine} AND {lost} AND u.request NOT IN (SELECT request FROM {taken}) GROUP BY {k_keys}").format(
                source=source, lost=lost, k_keys=q.key_list(state, "k"), runs=runs, mine=mine, taken=taken)
    headroom: sql.Composable = sql.SQL("0")
    if decision.headroom_table is not None:
        headroom = sql.SQL("coalesce((SELECT sum(h.value) FROM {}.{} h WHERE {}), 0)").format(
            *map(sql.Identifier, decision.headroom_table), q.same_keys(state, "h", "r"))
    decided = sql.Identifier(f"txn_decided_{decision.name}")
    cur.execute(sql.SQL("CREATE TEMP TABLE {} ({keys}, start numeric, requests text[], grants boolean[], "
                        "balances numeric[], delta numeric, granted integer, declined integer) ON COMMIT DROP")
                .format(decided, keys=q.key_defs(state)))
    cur.execute(sql.SQL(
        "INSERT INTO {decided} "
        "WITH r AS (SELECT r.*, coalesce(s.value, 0) + {headroom} AS start FROM ({source}) r "
        "  LEFT JOIN {state} s ON {s_is_r}) "
        "SELECT {keys}, start, NULL::text[], NULL::boolean[], NULL::numeric[], total, cardinality(amounts), 0 "
        "FROM r WHERE NOT must_loop AND (low IS NULL OR start + low >= %(floor)s) "
        "UNION ALL "
        "SELECT {keys}, start, requests, g.grants, g.balances, g.balances[cardinality(amounts)] - start, "
        "  (SELECT count(*) FILTER (WHERE x) FROM unnest(g.grants) x), "
        "  (SELECT count(*) FILTER (WHERE NOT x) FROM unnest(g.grants) x) "
        "FROM r, LATERAL {s}.guarded_run(start, %(floor)s, amounts) g "
        "WHERE cardinality(amounts) > 0 AND (must_loop OR start + low < %(floor)s)").format(
        decided=decided, headroom=headroom, source=source, state=q.state_table(state),
        s_is_r=q.same_keys(state, "s", "r"), keys=q.key_list(state), s=s), params)
    cur.execute(sql.SQL(
        "INSERT INTO {s}.decision_runs (topology_id, decision, txid, attempt, key, start, requests, grants, balances) "
        "SELECT %(t)s, %(d)s, %(txid)s, %(attempt)s, jsonb_build_array({keys}), start, requests, grants, balances "
        "FROM {decided}").format(s=s, keys=q.key_list(state), decided=decided), params)
    cur.execute(sql.SQL("CREATE TEMP TABLE IF NOT EXISTS {} (decision text, request text) ON COMMIT DELETE ROWS")
                .format(DECLINED))
    cur.execute(sql.SQL("INSERT INTO {} SELECT %(d)s, u.request FROM {} r, unnest(r.requests, r.grants) "
                        "AS u(request, granted) WHERE r.declined > 0 AND NOT u.granted").format(DECLINED, decided),
                params)
    delta = sql.SQL("SELECT {keys}, delta AS value FROM {decided} WHERE granted > 0").format(
        keys=q.key_list(state), decided=decided)
    cur.execute(q.upsert(state, q.state_table(state), delta), params)
    cur.execute(sql.SQL("SELECT coalesce(sum(granted), 0), coalesce(sum(declined), 0) FROM {}").format(decided))
    granted, declined = cur.fetchone()
    cur.execute(sql.SQL("DROP TABLE {}").format(decided))
    return int(granted), int(declined)


def forget_other_attempts(cur: Cursor, schema: str, topology_id: str, decision: DecisionSpec, txid: int,
                          attempt: int | None) -> None:
    """At the commit of ``txid``, after its attempts are settled (so none can complete any more):
    only the committed attempt's requests stay recorded."""
    s = sql.Identifier(schema)
    cur.execute(sql.SQL("SELECT attempt FROM {}.decision_checks WHERE topology_id = %s AND decision = %s "
                        "AND txid = %s AND attempt IS DISTINCT FROM %s").format(s),
                (topology_id, decision.name, txid, attempt))
    others = [int(a) for (a,) in cur.fetchall()]
    if others:  # usually none: one attempt per txid
        cur.execute(sql.SQL("DELETE FROM {}.decision_requests WHERE topology_id = %s AND decision = %s "
                            "AND txid = %s AND attempt = ANY(%s)").format(s),
                    (topology_id, decision.name, txid, others))


def output_filter(schema: str, topology_id: str) -> sql.Composable:
    """The condition (on staged output event ``o``; parameters ``txid``, ``attempt``) that keeps
    an event emitted for a request only if this commit decided the request its way."""
    return sql.SQL(
        "(o.request IS NULL OR (EXISTS (SELECT 1 FROM {s}.decision_requests r WHERE r.topology_id = {t} "
        "AND r.decision = o.decision AND r.request_id = o.request AND r.txid = %(txid)s "
        "AND r.attempt = %(attempt)s) AND o.granted = NOT EXISTS (SELECT 1 FROM {declined} v "
        "WHERE v.decision = o.decision AND v.request = o.request)))").format(
        s=sql.Identifier(schema), t=sql.Literal(topology_id), declined=DECLINED)


def delete_verdicts(cur: Cursor, schema: str, topology_id: str) -> None:
    for name in ("decision_requests", "decision_runs", "decision_checks", "verdicts_v5"):
        cur.execute(sql.SQL("DELETE FROM {} WHERE topology_id = %s").format(table(schema, name)), (topology_id,))


def verdicts(cur: Cursor, schema: str, topology_id: str, decision: str,
             request_ids: list[str]) -> dict[str, dict[str, Any]]:
    """The verdicts on ``request_ids`` (absent: not decided yet), by request id."""
    cur.execute(sql.SQL("SELECT request_id, txid, granted, amount, balance_after, key FROM {} "
                        "WHERE topology_id = %s AND decision = %s AND request_id = ANY(%s)")
                .format(table(schema, "verdicts")), (topology_id, decision, request_ids))
    return {r: {"txid": t, "granted": g, "amount": a, "balance_after": b, "key": k}
            for r, t, g, a, b, k in cur.fetchall()}

