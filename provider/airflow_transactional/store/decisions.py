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

from typing import TYPE_CHECKING, Any

from psycopg2 import sql

from .. import limits
from ..exceptions import ConfigError
from . import catalog, turns
from . import state as q
from .rows import Cursor
from .statements import query

if TYPE_CHECKING:  # the store takes declarations, it does not depend on them
    from ..spec import DecisionSpec, StateSpec



def staging_table(schema: str, topology_num: int, decision: DecisionSpec) -> sql.Composed:
    """The requests staged for one decision of topology number ``topology_num``."""
    return sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(f"requests_{topology_num}_{decision.name}"))


def runs_table(schema: str, topology_num: int, decision: DecisionSpec) -> sql.Composed:
    """Per completed attempt and key, its run of requests (see :func:`prepare`)."""
    name = f"request_runs_{topology_num}_{decision.name}"
    return sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(name))


def columns(state: StateSpec) -> list[str]:
    """A decision's staging columns, in COPY order."""
    return ["txid", "attempt", *state.key_columns, "seq", "request", "amount"]


def create_staging_table(staging: sql.Composed, state: StateSpec) -> sql.Composed:
    return query("decision_staging_create", staging=staging, key_defs=q.key_defs(state),
                 value_type=sql.SQL(state.value_type))


def create_runs_table(runs: sql.Composed, state: StateSpec) -> sql.Composed:
    return query("decision_runs_create", runs=runs, key_defs=q.key_defs(state), keys=q.key_list(state))


def ensure_runs_table(cur: Cursor, runs: sql.Composed, state: StateSpec) -> None:
    """Create the runs table when missing (at registration: no DDL once it exists)."""
    if not catalog.exists(cur, runs):
        cur.execute(create_runs_table(runs, state))


def check_headroom(cur: Cursor, decision: DecisionSpec, state: StateSpec) -> None:
    """Refuse a decision whose headroom relation does not exist (checked at registration and commit)."""
    if decision.headroom_table is not None and not catalog.exists(cur, _headroom_table(decision)):
        raise ConfigError(f"decision {decision.name!r}: its headroom {'.'.join(decision.headroom_table)!r} does not "
                          f"exist: create it (a table or view with columns {', '.join(state.key_columns)} and value), "
                          "or register the topology whose state table it is first")


def _headroom_table(decision: DecisionSpec) -> sql.Composed:
    assert decision.headroom_table is not None
    return sql.SQL("{}.{}").format(*map(sql.Identifier, decision.headroom_table))


def _params(topology_id: str, decision: DecisionSpec, txid: int, attempt: int | None, **more: Any) -> dict[str, Any]:
    return {"t": topology_id, "d": decision.name, "txid": txid, "attempt": attempt, **more}


def prepare(cur: Cursor, schema: str, topology_id: str, decision: DecisionSpec, state: StateSpec,
            staging: sql.Composed, runs: sql.Composed, txid: int, attempt: int, committed: int) -> None:
    """Record the requests ``attempt`` of ``txid`` staged, when it completes (``committed``: the
    topology's committed txid now): each request no earlier txid claims, with its place in its
    key's run, and each key's run; the conflicts with other uncommitted txids; the staged rows
    are then removed."""
    params = _params(topology_id, decision, txid, attempt, c=committed)
    fresh = sql.Identifier(f"txn_fresh_{decision.name}")
    parts = {"staging": staging, "runs": runs, "fresh": fresh, "keys": q.key_list(state)}
    turns.take(cur, schema, f"decision:{topology_id}:{decision.name}")  # each completion sees every one before
    cur.execute(query("decision_prepare_fresh_create", fresh=fresh, key_defs=q.key_defs(state)))
    cur.execute(query("decision_prepare_fresh", schema, **parts,
                      claims=_claims(schema, sql.SQL("r.request"), sql.SQL("<> %(txid)s"))), params)
    cur.execute(query("decision_prepare_record", schema, **parts), params)
    cur.execute(query("decision_prepare_runs", schema, **parts), params)
    cur.execute(query("decision_prepare_conflicts", schema, **parts,
                      claims=_claims(schema, sql.SQL("f.request"), sql.SQL("> %(txid)s"))), params)
    cur.execute(query("decision_prepare_checked", schema, **parts), params)
    cur.execute(query("decision_prepare_forget_committed", schema, **parts), params)
    cur.execute(query("drop_table", table=fresh))


def _claims(schema: str, request: sql.Composable, txids: sql.Composable) -> sql.Composed:
    return query("decision_claims", schema, request=request, txids=txids)


def staged_count(cur: Cursor, schema: str, topology_id: str, decision: DecisionSpec, staging: sql.Composed,
                 txid: int, attempt: int) -> int:
    """How many requests ``attempt`` of ``txid`` staged (recorded at completion, or still staged)."""
    params = _params(topology_id, decision, txid, attempt)
    cur.execute(query("decision_checked_count", schema), params)
    row = cur.fetchone()
    if row is None:
        cur.execute(query("decision_staged_count", staging=staging), params)
        row = cur.fetchone()
    return int(row[0])


def decide(cur: Cursor, schema: str, topology_id: str, decision: DecisionSpec, state: StateSpec,
           staging: sql.Composed, runs: sql.Composed, txid: int, attempt: int, *,
           declines: bool = True) -> tuple[int, int]:
    """Decide the requests ``attempt`` of ``txid`` staged for ``decision`` (see the module
    docstring); returns (granted, declined). ``declines``: list the declined requests for the
    output append (a topology without outputs has no use for them)."""
    low, high = limits.value_range(state.value_type)  # the balance the state's type holds
    params = _params(topology_id, decision, txid, attempt, floor=decision.floor, declines=declines, low=low,
                     high=high)
    check_headroom(cur, decision, state)
    cur.execute(query("decision_checked_count", schema), params)
    if cur.fetchone() is None:  # completed before completion recorded the requests: record them now
        prepare(cur, schema, topology_id, decision, state, staging, runs, txid, attempt, txid - 1)
    source = _runs_to_decide(cur, schema, state, runs, params, fix=sql.Identifier(f"txn_fix_{decision.name}"))
    headroom: sql.Composable = sql.SQL("0")
    if decision.headroom_table is not None:
        headroom = query("decision_headroom", headroom=_headroom_table(decision), h_is_r=q.same_keys(state, "h", "r"))
    decided = sql.Identifier(f"txn_decided_{decision.name}")
    cur.execute(query("decision_decide_create", decided=decided, key_defs=q.key_defs(state)))
    cur.execute(query("decision_decide", schema, decided=decided, headroom=headroom, source=source,
                      state=q.state_table(state), s_is_r=q.same_keys(state, "s", "r"),
                      r_keys=q.key_list(state, "r")), params)
    cur.execute(query("decision_decide_runs", schema, decided=decided, keys=q.key_list(state)), params)
    if declines:
        cur.execute(query("decision_declined_create"))
        cur.execute(query("decision_declined", decided=decided), params)
    cur.execute(q.upsert(state, q.state_table(state),
                         query("decision_granted_delta", keys=q.key_list(state), decided=decided)), params)
    cur.execute(query("decision_decided_counts", decided=decided))
    granted, declined = cur.fetchone()
    cur.execute(query("drop_table", table=decided))
    return int(granted), int(declined)


def _runs_to_decide(cur: Cursor, schema: str, state: StateSpec, runs: sql.Composed, params: dict[str, Any],
                    fix: sql.Identifier) -> sql.Composed:
    """The runs of the attempt to decide: as prepared, except the keys of a conflict settled now
    (usually none), rebuilt to be decided request by request."""
    k_keys = q.key_list(state, "k")
    source = query("decision_runs_of_attempt", runs=runs, k_keys=k_keys)
    cur.execute(query("decision_decide_fix_create", schema, fix=fix), params)
    if not cur.rowcount:
        return source
    cur.execute(query("decision_decide_fix_requests", schema, fix=fix), params)
    return query("decision_runs_with_fixes", schema, runs_of_attempt=source, k_keys=k_keys, runs=runs, fix=fix,
                 typed_keys=_keys_of(state, sql.Identifier("m", "key")))


def _keys_of(state: StateSpec, key: sql.Composable) -> sql.Composed:
    """The state's key columns, typed, from ``key``: the JSON array of their values."""
    return sql.SQL(", ").join(sql.SQL("({} ->> {})::{} AS {}").format(key, sql.Literal(i), sql.SQL(t),
                                                                      sql.Identifier(c))
                              for i, (c, t) in enumerate(state.keys.items()))


def forget_other_attempts(cur: Cursor, schema: str, topology_id: str, decision: DecisionSpec, txid: int,
                          attempt: int | None) -> None:
    """At the commit of ``txid``, after its attempts are settled (so none can complete any more):
    only the committed attempt's requests stay recorded."""
    params = _params(topology_id, decision, txid, attempt)
    cur.execute(query("decision_other_attempts", schema), params)
    others = [int(a) for (a,) in cur.fetchall()]
    if others:  # usually none: one attempt per txid
        cur.execute(query("decision_forget_attempts", schema), {**params, "attempts": others})


def output_filter(schema: str, topology_id: str) -> sql.Composable:
    """The condition (on staged output event ``o``; parameters ``txid``, ``attempt``) that keeps
    an event emitted for a request only if this commit decided the request its way."""
    return query("decision_output_filter", schema, t=sql.Literal(topology_id))


def delete_verdicts(cur: Cursor, schema: str, topology_id: str) -> None:
    cur.execute(query("decision_forget_topology", schema), {"t": topology_id})


def verdicts(cur: Cursor, schema: str, topology_id: str, decision: str,
             request_ids: list[str]) -> dict[str, dict[str, Any]]:
    """The verdicts on ``request_ids`` (absent: not decided yet), by request id."""
    cur.execute(query("decision_verdicts", schema), {"t": topology_id, "d": decision, "requests": request_ids})
    return {r: {"txid": t, "granted": g, "amount": a, "balance_after": b, "key": k}
            for r, t, g, a, b, k in cur.fetchall()}
