"""What each commit changed, kept: the delta history (``store/history.py``) and the digests of it.

At the commit (:func:`settle`) each state's staged rows of the committed attempt stay, as the txid's
per-key deltas, and the commit records a digest of them per state (``rows:hash``). From the history
the store answers what txid N changed (:func:`changes`) and what a state held as of txid N
(:func:`as_of`) -- the deltas through N folded per key by the state's combiner, starting at a
snapshot (:func:`snapshot`: the state tables at the committed txid; a rebuild takes one of what it
recomputed). :func:`compact` folds old txids into the snapshot: the history's retention.
"""

from __future__ import annotations

from typing import Any

import psycopg2.extensions

from ..exceptions import ConfigError
from ..spec import StateSpec, TopologySpec
from ..store import commits
from ..store import history as h
from ..store import state as q
from . import redefinition
from .context import StateStore

#: A state's history as a query answers it: (keys..., value) rows in key order.
Rows = list[tuple[Any, ...]]


def committed_attempt(cur: psycopg2.extensions.cursor, schema: str, topology_id: str, txid: int) -> int:
    """The attempt ``txid`` committed (0: an empty batch, or txid 0: nothing committed)."""
    row = commits.get(cur, schema, topology_id, txid)
    return 0 if row is None else int(row.attempt)


def kept_states(spec: TopologySpec) -> tuple[StateSpec, ...]:
    """The states whose commits apply staged rows (not those only a decision writes)."""
    return spec.recomputable_states


def settle(store: StateStore, cur: psycopg2.extensions.cursor, num: int, spec: TopologySpec, txid: int,
           attempt: int | None) -> dict[str, str]:
    """In the commit: keep ``attempt``'s staged rows as ``txid``'s deltas (drop other attempts');
    return each state's digest of them (none for an empty batch)."""
    digests = {}
    for state in spec.states:
        staging = store.staging(num, state)
        h.keep(cur, state, staging, txid, attempt)
        if attempt is not None and state in kept_states(spec):
            digests[state.name] = h.digest(cur, state, staging, txid, attempt)
    return digests


def _check_txid(store: StateStore, cur: psycopg2.extensions.cursor, topology_id: str, txid: int,
                committed: int, *, base: bool) -> h.Mark:
    """The history's mark, once ``txid`` is known to be in it (``base``: with the snapshot below it)."""
    mark = h.mark(cur, store.schema, topology_id)
    if not 0 <= txid <= committed:
        raise ConfigError(f"topology {topology_id!r} has committed through txid {committed}; txid {txid} is not "
                          "committed: give a txid from 0 to the committed one")
    # The rows at history_from_txid are a snapshot (or nothing), not that txid's deltas.
    if txid < mark.history_from_txid or (txid == mark.history_from_txid and not base and txid > 0):
        raise ConfigError(f"topology {topology_id!r}: the delta history starts after txid {mark.history_from_txid} "
                          f"(txids through it were folded into a snapshot, or committed before the history was kept); "
                          f"txid {txid} is no longer there")
    if base and not mark.history_base:
        raise ConfigError(f"topology {topology_id!r}: the delta history has no snapshot to start from (it began at "
                          f"txid {mark.history_from_txid}, with commits before it): take one with 'airflow-txn "
                          f"history {topology_id} --snapshot', then ask for txids from it on")
    return mark


def changes(store: StateStore, topology_id: str, txid: int) -> dict[str, Rows]:
    """What committed ``txid`` applied to each state: its (keys..., delta) rows, by state."""
    with store.db.transaction() as cur:
        num, spec, committed, _o = store.load(cur, topology_id)
        _check_txid(store, cur, topology_id, txid, committed, base=False)
        # A redefined state's archived version answers for the txids it was live.
        versions = {s.name: spec.version_at(s.name, txid) for s in kept_states(spec)}
        return {name: h.deltas(cur, store.schema, topology_id, v, store.staging(num, v), txid)
                for name, v in versions.items()}


def as_of(store: StateStore, topology_id: str, state_name: str, txid: int | None = None) -> Rows:
    """The (keys..., value) rows ``state_name`` held just after txid ``txid`` committed (None: the
    committed txid)."""
    with store.db.transaction() as cur:
        num, spec, committed, _o = store.load(cur, topology_id)
        txid = committed if txid is None else txid
        state = spec.state(state_name)
        if state not in kept_states(spec):
            raise ConfigError(f"state {state_name!r} is kept by a decision: its values were decided in commit order "
                              "and have no delta history")
        archive = redefinition.archive_at(spec, state_name, txid)
        if archive is not None:  # redefined since: the version live at txid answers, from its own history
            if not archive.base:
                raise ConfigError(f"state {state_name!r} as of txid {txid}: version {archive.state.version}, live "
                                  f"then, has a delta history from txid {archive.history_from} with no snapshot there")
            return h.as_of(cur, store.schema, topology_id, archive.state, store.staging(num, archive.state), txid,
                           archive.history_from)
        if txid < spec.built.get(state_name, 0):
            raise ConfigError(f"state {state_name!r} was added to topology {topology_id!r} (or redefined) and built "
                              f"from the source as of txid {spec.built[state_name]}: its history starts there; ask for "
                              "a txid from it on")
        mark = _check_txid(store, cur, topology_id, txid, committed, base=True)
        return h.as_of(cur, store.schema, topology_id, state, store.staging(num, state), txid, mark.history_from_txid)


def snapshot(store: StateStore, topology_id: str) -> int:
    """Make the state tables, as of the committed txid, the snapshot the history starts at (for a
    topology that committed before its history was kept); returns that txid."""
    with store.db.transaction() as cur:
        num, spec, committed, _o = store.load(cur, topology_id, lock=True)
        external = [s.name for s in kept_states(spec) if s.database is not None]
        if external:
            raise ConfigError(f"topology {topology_id!r}: states {external} are kept in another database; their "
                              "history starts with the commits after it was kept")
        attempt = committed_attempt(cur, store.schema, topology_id, committed)
        for state in kept_states(spec):
            h.snapshot_of(cur, store.schema, topology_id, state, store.staging(num, state), q.state_table(state),
                          committed, attempt)
        h.set_mark(cur, store.schema, topology_id, committed, True)
    return committed


def rebased(store: StateStore, cur: psycopg2.extensions.cursor, topology_id: str, num: int, spec: TopologySpec,
            through_txid: int, recomputed: dict[str, Any]) -> None:
    """In a rebuild's swap: its recomputation as of ``through_txid`` (a table per state) becomes the
    snapshot the history starts at -- the deltas before it were not what produced the new state."""
    attempt = committed_attempt(cur, store.schema, topology_id, through_txid)
    for state in kept_states(spec):
        h.snapshot_of(cur, store.schema, topology_id, state, store.staging(num, state), recomputed[state.name],
                      through_txid, attempt)
    h.set_mark(cur, store.schema, topology_id, through_txid, True)


def compact(store: StateStore, topology_id: str, keep_txids: int) -> int | None:
    """Fold the history of txids older than the last ``keep_txids`` committed into the snapshot
    (history retention); returns the txid the history now starts at (None: nothing to fold)."""
    if keep_txids < 0:
        raise ConfigError(f"keep_txids must be 0 or more, got {keep_txids}")
    with store.db.transaction() as cur:
        num, spec, committed, _o = store.load(cur, topology_id, lock=True)
        mark = h.mark(cur, store.schema, topology_id)
        upto = committed - keep_txids
        if upto <= mark.history_from_txid:
            return None
        attempt = committed_attempt(cur, store.schema, topology_id, upto)
        for state in kept_states(spec):
            h.fold_into_snapshot(cur, store.schema, topology_id, state, store.staging(num, state), upto, attempt,
                                 mark.history_from_txid)
        h.set_mark(cur, store.schema, topology_id, upto, mark.history_base)
    return upto


def sizes(store: StateStore, topology_id: str) -> dict[str, h.Size]:
    """How many deltas each state's history holds, and the bytes of its staging table."""
    with store.db.transaction() as cur:
        num, spec, _c, _o = store.load(cur, topology_id)
        return {s.name: h.size(cur, store.schema, topology_id, store.staging(num, s)) for s in kept_states(spec)}


def views(store: StateStore, topology_id: str) -> dict[str, str]:
    """The view of each state's delta history (``dlt_<num>_<state>``: txid, keys, delta)."""
    with store.db.transaction() as cur:
        num, spec, _c, _o = store.load(cur, topology_id)
        return {s.name: q.history_view(store.schema, num, s).as_string(cur) for s in kept_states(spec)}
