"""Decisions in commit order (``DecisionSpec``): the requests a processing attempt staged are
decided inside the commit, per key in source order, on the committed balance.

The work is split where it is cheapest. When the attempt completes (:func:`prepare`, in the
processing task, in parallel with other txids) its requests are recorded once each and summed
per key: the run's total, its lowest running balance relative to the start, its requests and
amounts in order. Completions of one decision take turns, so each finds every other txid that
claims one of its requests: a committed txid decided it (left out), an earlier uncommitted one
claims it (left out for now), a later one claims it (a conflict of that one). The commit
(:func:`decide`, serial) then works per key, not per request:

1. the conflicts of its attempt (usually none), settled now that every earlier txid is
   committed: a request one of them decided is taken out, one none of them decided is put back,
   and the key's run is rebuilt to be decided request by request;
2. a key whose run never goes below the floor from its committed balance (plus the headroom)
   has every request granted, in one comparison; one whose every debit would take it below the
   floor even after the credits before it has every debit declined and every credit granted, in
   another; only the other keys run the loop (``guarded_run``), request by request;
3. one row per key records the balance the run started from, with its verdicts only when the
   loop decided them (``decision_runs``); the view ``verdicts`` has every request's verdict and the
   balance after it; the granted sums go to the decision's state under the transactional value
   rule, and ``txn_declined`` holds the declines for the output append (when there are
   outputs), which keeps only the events emitted for the verdict each request got.
"""

from __future__ import annotations

from typing import Any

from psycopg2 import sql

from .. import limits
from ..exceptions import ConfigError
from ..spec import DecisionSpec, StateSpec
from . import catalog
from . import sql as q
from .rows import Cursor, table

#: The class of the advisory locks completions of one decision take turns with (its other key: the decision).
LOCK_CLASS = 0x7478_6E64

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
    # the start balance plus ``low`` is at or above the floor. ``high``: the highest sum of a debit
    # and the credits before it; every debit is declined (every credit granted) when the start
    # balance plus ``high`` is below the floor. ``credits``, ``debits``: their sum and count.
    return sql.SQL("CREATE TABLE IF NOT EXISTS {} (txid bigint NOT NULL, attempt integer NOT NULL, {keys}, "
                   "requests text[] NOT NULL, amounts numeric[] NOT NULL, total numeric NOT NULL, low numeric, "
                   "high numeric, credits numeric, debits integer, "
                   "PRIMARY KEY (txid, attempt, {key_list}))").format(
        runs, keys=q.key_defs(state), key_list=q.key_list(state))


def ensure_runs_table(cur: Cursor, runs: sql.Composed, state: StateSpec) -> None:
    """Create the runs table when missing (at registration: no DDL once it exists)."""
    if not catalog.exists(cur, runs):
        cur.execute(create_runs_table(runs, state))


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
    topology's committed txid now): each request no earlier txid claims, with its place in its
    key's run, and each key's run; the conflicts with other uncommitted txids; the staged rows
    are then removed."""
    s = sql.Identifier(schema)
    params: dict[str, Any] = {"t": topology_id, "d": decision.name, "txid": txid, "attempt": attempt,
                              "c": committed}
    # Completions of one decision take turns, so each one sees every request recorded before it.
    cur.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))",
                (LOCK_CLASS, f"{schema}.{topology_id}.{decision.name}"))
    fresh = sql.Identifier(f"txn_fresh_{decision.name}")
    cur.execute(sql.SQL("CREATE TEMP TABLE {} ({keys}, request text, seq bigint, amount numeric, prefix numeric, "
                        "cprefix numeric, keep boolean, earlier boolean, later boolean) ON COMMIT DROP")
                .format(fresh, keys=q.key_defs(state)))
    # Per request, one probe of each table finds every other txid that claims it: recorded by a
    # committed txid (decided: left out), claimed by an earlier uncommitted one (left out for now,
    # a conflict the commit settles), or by a later one (a conflict of that txid).
    cur.execute(sql.SQL(
        "INSERT INTO {fresh} SELECT {keys}, request, seq, amount, "
        "sum(amount) FILTER (WHERE keep) OVER w, sum(amount) FILTER (WHERE keep AND amount >= 0) OVER w, keep, "
        "earlier AND NOT decided, later AND NOT decided "
        "FROM (SELECT y.*, NOT decided AND NOT earlier AS keep FROM (SELECT r.*, coalesce(c.decided, false) "
        "  AS decided, coalesce(c.earlier, false) AS earlier, coalesce(c.later, false) AS later "
        "  FROM {stg} r, LATERAL (SELECT bool_or(o.recorded AND o.txid <= %(c)s) AS decided, "
        "  bool_or(o.txid > %(c)s AND o.txid < %(txid)s) AS earlier, bool_or(o.txid > %(txid)s) AS later "
        "  FROM ({claims}) o) c WHERE r.txid = %(txid)s AND r.attempt = %(attempt)s) y) x "
        "WINDOW w AS (PARTITION BY {keys} ORDER BY seq, request)").format(
        fresh=fresh, keys=q.key_list(state), stg=staging, s=s,
        claims=_claims(s, sql.SQL("r.request"), sql.SQL("<> %(txid)s"))), params)
    cur.execute(sql.SQL(
        "INSERT INTO {s}.decision_requests "
        "(topology_id, decision, request_id, txid, attempt, seq, key, amount, prefix, cprefix) "
        "SELECT %(t)s, %(d)s, request, %(txid)s, %(attempt)s, seq, jsonb_build_array({keys}), amount, prefix, "
        "cprefix FROM {fresh} WHERE keep ORDER BY request").format(s=s, keys=q.key_list(state), fresh=fresh), params)
    cur.execute(sql.SQL(
        "INSERT INTO {runs} (txid, attempt, {keys}, requests, amounts, total, low, high, credits, debits) "
        "SELECT %(txid)s, %(attempt)s, {keys}, array_agg(request ORDER BY seq, request), "
        "array_agg(amount ORDER BY seq, request), sum(amount), min(prefix) FILTER (WHERE amount < 0), "
        "max(coalesce(cprefix, 0) + amount) FILTER (WHERE amount < 0), "
        "coalesce(sum(amount) FILTER (WHERE amount >= 0), 0), count(*) FILTER (WHERE amount < 0) "
        "FROM {fresh} WHERE keep GROUP BY {keys}").format(runs=runs, keys=q.key_list(state), fresh=fresh), params)
    # Conflicts (usually none): this attempt's requests an earlier txid claims, and the claims of
    # later txids on requests this one claims.
    cur.execute(sql.SQL(
        "INSERT INTO {s}.decision_conflicts (topology_id, decision, request_id, txid, attempt, seq, key, amount) "
        "SELECT %(t)s, %(d)s, request, %(txid)s, %(attempt)s, seq, jsonb_build_array({keys}), amount "
        "FROM {fresh} WHERE earlier UNION ALL "
        "SELECT %(t)s, %(d)s, o.request_id, o.txid, o.attempt, o.seq, o.key, o.amount FROM {fresh} f, "
        "LATERAL ({claims}) o WHERE f.later ON CONFLICT DO NOTHING").format(
        s=s, keys=q.key_list(state), fresh=fresh,
        claims=_claims(s, sql.SQL("f.request"), sql.SQL("> %(txid)s"))), params)
    cur.execute(sql.SQL("WITH gone AS (DELETE FROM {} WHERE txid = %(txid)s AND attempt = %(attempt)s RETURNING 1) "
                        "INSERT INTO {}.decision_checks "
                        "(topology_id, decision, txid, attempt, checked_through, staged) "
                        "SELECT %(t)s, %(d)s, %(txid)s, %(attempt)s, %(c)s, count(*) FROM gone").format(staging, s),
                params)
    # What committed txids left behind (runs, requests of attempts that never completed) is no
    # longer read: the next attempt to complete clears it, off the commit's path.
    for left in (runs, staging):
        cur.execute(sql.SQL("DELETE FROM {} WHERE txid <= %(c)s").format(left), params)
    for name in ("decision_checks", "decision_conflicts"):
        cur.execute(sql.SQL("DELETE FROM {} WHERE topology_id = %(t)s AND decision = %(d)s AND txid <= %(c)s")
                    .format(table(schema, name)), params)
    cur.execute(sql.SQL("DROP TABLE {}").format(fresh))


def _claims(s: sql.Identifier, request: sql.Composable, txids: sql.Composable) -> sql.Composed:
    """Every attempt that claims ``request`` with a txid matching ``txids``: it recorded the
    request, or left it out only for a conflict its commit settles (parameters ``t``, ``d``)."""
    return sql.SQL(
        "SELECT o.request_id, o.txid, o.attempt, o.seq, o.key, o.amount, true AS recorded "
        "FROM {s}.decision_requests o WHERE o.topology_id = %(t)s AND o.decision = %(d)s "
        "AND o.request_id = {request} AND o.txid {txids} UNION ALL "
        "SELECT o.request_id, o.txid, o.attempt, o.seq, o.key, o.amount, false "
        "FROM {s}.decision_conflicts o WHERE o.topology_id = %(t)s AND o.decision = %(d)s "
        "AND o.request_id = {request} AND o.txid {txids} AND o.txid > %(c)s").format(
        s=s, request=request, txids=txids)


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
           staging: sql.Composed, runs: sql.Composed, txid: int, attempt: int, *,
           declines: bool = True) -> tuple[int, int]:
    """Decide the requests ``attempt`` of ``txid`` staged for ``decision`` (see the module
    docstring); returns (granted, declined). ``declines``: list the declined requests for the
    output append (a topology without outputs has no use for them)."""
    s = sql.Identifier(schema)
    low, high = limits.value_range(state.value_type)  # the balance the state's type holds
    params: dict[str, Any] = {"t": topology_id, "d": decision.name, "txid": txid, "attempt": attempt,
                              "floor": decision.floor, "declines": declines, "low": low, "high": high}
    check_headroom(cur, decision, state)
    cur.execute(sql.SQL("SELECT 1 FROM {}.decision_checks WHERE topology_id = %(t)s "
                        "AND decision = %(d)s AND txid = %(txid)s AND attempt = %(attempt)s").format(s), params)
    if cur.fetchone() is None:  # completed before completion recorded the requests: record them now
        prepare(cur, schema, topology_id, decision, state, staging, runs, txid, attempt, txid - 1)
    mine = sql.SQL("k.txid = %(txid)s AND k.attempt = %(attempt)s")
    source = sql.SQL("SELECT {k_keys}, k.requests, k.amounts, k.total, k.low, k.high, k.credits, k.debits, "
                     "false AS must_loop FROM {runs} k WHERE {mine}").format(
        k_keys=q.key_list(state, "k"), runs=runs, mine=mine)
    # The conflicts found when attempts completed (usually none), settled now that every earlier
    # txid is committed: a request one of them decided is taken out, one none of them decided is
    # put back; either way its key's run is rebuilt and decided request by request.
    fix = sql.Identifier(f"txn_fix_{decision.name}")
    cur.execute(sql.SQL(
        "CREATE TEMP TABLE {fix} ON COMMIT DROP AS SELECT request_id::text AS request, key, seq, amount, recorded "
        "FROM (SELECT c.*, EXISTS (SELECT 1 FROM {s}.decision_requests m WHERE m.topology_id = %(t)s "
        "  AND m.decision = %(d)s AND m.request_id = c.request_id AND m.txid = %(txid)s "
        "  AND m.attempt = %(attempt)s OFFSET 0) AS recorded, "
        "  EXISTS (SELECT 1 FROM {s}.decision_requests o WHERE o.topology_id = %(t)s AND o.decision = %(d)s "
        "  AND o.request_id = c.request_id AND o.txid < %(txid)s OFFSET 0) AS decided "
        "  FROM {s}.decision_conflicts c WHERE c.topology_id = %(t)s AND c.decision = %(d)s "
        "  AND c.txid = %(txid)s AND c.attempt = %(attempt)s) x WHERE recorded = decided").format(fix=fix, s=s),
        params)
    if cur.rowcount:
        cur.execute(sql.SQL("DELETE FROM {s}.decision_requests r USING {fix} f WHERE r.topology_id = %(t)s "
                            "AND r.decision = %(d)s AND r.request_id = f.request AND r.txid = %(txid)s "
                            "AND r.attempt = %(attempt)s AND f.recorded").format(s=s, fix=fix), params)
        cur.execute(sql.SQL("INSERT INTO {s}.decision_requests "
                            "(topology_id, decision, request_id, txid, attempt, seq, key, amount, prefix) "
                            "SELECT %(t)s, %(d)s, request, %(txid)s, %(attempt)s, seq, key, amount, 0 "
                            "FROM {fix} WHERE NOT recorded").format(s=s, fix=fix), params)
        in_fix = sql.SQL("jsonb_build_array({}) IN (SELECT key FROM {})").format(q.key_list(state, "k"), fix)
        source = sql.SQL(
            "{source} AND NOT {in_fix} UNION ALL "
            "SELECT {typed}, array_agg(m.request ORDER BY m.seq, m.request COLLATE \"default\"), "
            "array_agg(m.amount ORDER BY m.seq, m.request COLLATE \"default\"), sum(m.amount), NULL, NULL, NULL, "
            "NULL, true FROM ("
            "  SELECT jsonb_build_array({k_keys}) AS key, u.request, u.amount, r.seq FROM {runs} k, "
            "  unnest(k.requests, k.amounts) AS u(request, amount), {s}.decision_requests r "
            "  WHERE {mine} AND {in_fix} AND r.topology_id = %(t)s AND r.decision = %(d)s "
            "  AND r.request_id = u.request AND r.txid = %(txid)s AND r.attempt = %(attempt)s "
            "  UNION ALL SELECT key, request, amount, seq FROM {fix} WHERE NOT recorded) m GROUP BY m.key").format(
            source=source, in_fix=in_fix, typed=_keys_of(state, sql.Identifier("m", "key")),
            k_keys=q.key_list(state, "k"), runs=runs, s=s, mine=mine, fix=fix)
    headroom: sql.Composable = sql.SQL("0")
    if decision.headroom_table is not None:
        headroom = sql.SQL("coalesce((SELECT sum(h.value) FROM {}.{} h WHERE {}), 0)").format(
            *map(sql.Identifier, decision.headroom_table), q.same_keys(state, "h", "r"))
    decided = sql.Identifier(f"txn_decided_{decision.name}")
    cur.execute(sql.SQL("CREATE TEMP TABLE {} ({keys}, start numeric, requests text[], grants boolean[], "
                        "balances numeric[], delta numeric, granted integer, declined integer, "
                        "debits_declined boolean, amounts numeric[]) ON COMMIT DROP")
                .format(decided, keys=q.key_defs(state)))
    # Per key: its run granted whole, every debit declined, or else the loop, which alone has a
    # call (a gating condition). A balance stays at or above the floor, and within what the
    # state's type holds: a credit that would carry it past the top is declined (``hi``), so no
    # request can make the commit's arithmetic fail; the fast ways are taken only when even every
    # credit granted stays below it.
    cur.execute(sql.SQL(
        "INSERT INTO {decided} "
        "SELECT {r_keys}, r.start, CASE WHEN r.kind = 'loop' OR %(declines)s AND r.kind = 'none' THEN r.requests END, "
        "  g.grants, g.balances, "
        "  CASE r.kind WHEN 'whole' THEN r.total WHEN 'none' THEN r.credits "
        "  ELSE g.balances[cardinality(r.amounts)] - r.start END, "
        "  cardinality(r.amounts) - n.declined, n.declined, "
        "  r.kind = 'none', CASE WHEN %(declines)s AND r.kind = 'none' THEN r.amounts END "
        "FROM (SELECT x.*, CASE WHEN x.must_loop OR x.start + x.credits > x.hi THEN 'loop' "
        "  WHEN x.low IS NULL OR x.start + x.low >= x.lo THEN 'whole' "
        "  WHEN x.start + x.high < x.lo THEN 'none' ELSE 'loop' END AS kind "
        "  FROM (SELECT y.*, y.held + y.head AS start, greatest(%(floor)s, %(low)s + y.head) AS lo, "
        "  %(high)s + y.head AS hi FROM (SELECT r.*, coalesce(s.value, 0) AS held, {headroom} AS head "
        "  FROM ({source}) r LEFT JOIN {state} s ON {s_is_r}) y) x OFFSET 0) r "
        "LEFT JOIN LATERAL (SELECT f.grants, f.balances, cardinality(array_positions(f.grants, false)) AS declined "
        "  FROM {s}.guarded_run(r.start, r.lo, r.amounts, r.hi) f WHERE r.kind = 'loop' OFFSET 0) g ON true, "
        "LATERAL (SELECT CASE r.kind WHEN 'whole' THEN 0 WHEN 'none' THEN r.debits ELSE g.declined END AS declined) n "
        "WHERE cardinality(r.amounts) > 0").format(
        decided=decided, headroom=headroom, source=source, state=q.state_table(state),
        s_is_r=q.same_keys(state, "s", "r"), r_keys=q.key_list(state, "r"), s=s), params)
    cur.execute(sql.SQL(
        "INSERT INTO {s}.decision_runs "
        "(topology_id, decision, txid, attempt, key, start, requests, grants, balances, debits_declined) "
        "SELECT %(t)s, %(d)s, %(txid)s, %(attempt)s, jsonb_build_array({keys}), start, "
        "CASE WHEN grants IS NOT NULL THEN requests END, grants, balances, debits_declined "
        "FROM {decided}").format(s=s, keys=q.key_list(state), decided=decided), params)
    if declines:
        cur.execute(sql.SQL("CREATE TEMP TABLE IF NOT EXISTS {} (decision text, request text) ON COMMIT DELETE ROWS")
                    .format(DECLINED))
        cur.execute(sql.SQL("INSERT INTO {} SELECT %(d)s, u.request FROM {} r, unnest(r.requests, r.grants, r.amounts) "
                            "AS u(request, granted, amount) WHERE r.declined > 0 "
                            "AND (NOT u.granted OR (r.debits_declined AND u.amount < 0))").format(DECLINED, decided),
                    params)
    delta = sql.SQL("SELECT {keys}, delta AS value FROM {decided} WHERE granted > 0").format(
        keys=q.key_list(state), decided=decided)
    cur.execute(q.upsert(state, q.state_table(state), delta), params)
    cur.execute(sql.SQL("SELECT coalesce(sum(granted), 0), coalesce(sum(declined), 0) FROM {}").format(decided))
    granted, declined = cur.fetchone()
    cur.execute(sql.SQL("DROP TABLE {}").format(decided))
    return int(granted), int(declined)


def _keys_of(state: StateSpec, key: sql.Composable) -> sql.Composed:
    """The state's key columns, typed, from ``key``: the JSON array of their values."""
    return sql.SQL(", ").join(sql.SQL("({} ->> {})::{} AS {}").format(key, sql.Literal(i), sql.SQL(t),
                                                                      sql.Identifier(c))
                              for i, (c, t) in enumerate(state.keys.items()))


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
    for name in ("decision_requests", "decision_runs", "decision_checks", "decision_conflicts"):
        cur.execute(sql.SQL("DELETE FROM {} WHERE topology_id = %s").format(table(schema, name)), (topology_id,))


def verdicts(cur: Cursor, schema: str, topology_id: str, decision: str,
             request_ids: list[str]) -> dict[str, dict[str, Any]]:
    """The verdicts on ``request_ids`` (absent: not decided yet), by request id."""
    cur.execute(sql.SQL("SELECT request_id, txid, granted, amount, balance_after, key FROM {} "
                        "WHERE topology_id = %s AND decision = %s AND request_id = ANY(%s)")
                .format(table(schema, "verdicts")), (topology_id, decision, request_ids))
    return {r: {"txid": t, "granted": g, "amount": a, "balance_after": b, "key": k}
            for r, t, g, a, b, k in cur.fetchall()}

