"""The delta history: what each commit applied to each state, key by key.

A commit keeps its attempt's staged rows -- the per-key deltas it applied -- in the state's staging
table instead of deleting them; the rows of a (txid, attempt) that the ``commits`` table names are
the history (``store/queries/history.sql``). From them the store answers "what did txid N change"
(:func:`deltas`) and "the state as of txid N" (:func:`as_of`): the deltas through N folded per key
by the state's combiner, from the snapshot the history starts at (:class:`Mark`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from psycopg2 import sql

from ..values import Combiner
from . import state as q
from .rows import Cursor, only
from .statements import query

if TYPE_CHECKING:
    from ..spec import StateSpec

#: A digest sums 64-bit hashes; it is kept modulo this.
DIGEST_MODULUS = 2**64
#: The digest of nothing staged: no row, no hash.
EMPTY_DIGEST = "0:0000000000000000"


class Mark(NamedTuple):
    """Where a topology's history starts: every txid after ``from_txid`` is there; ``base``: the
    rows at ``from_txid`` are a snapshot of each state as of it (txid 0: the empty state)."""

    history_from_txid: int
    history_base: bool


class Size(NamedTuple):
    deltas: int
    bytes: int


def _parts(state: StateSpec, table: sql.Composable) -> dict[str, sql.Composable]:
    return {"table": table, "keys": q.key_list(state)}


def fold(state: StateSpec) -> sql.Composed:
    """The aggregate that folds a key's deltas, in txid order, into its value (the combiner's)."""
    combiner = Combiner(state.combiner)
    if combiner in (Combiner.SUM, Combiner.COUNT):
        return sql.SQL("sum(value)::{}").format(sql.SQL(state.value_type))
    if combiner is Combiner.REPLACE:
        return sql.SQL("(array_agg(value ORDER BY s.txid DESC))[1]")
    return sql.SQL("min(value)" if combiner is Combiner.MIN else "max(value)")


def keep(cur: Cursor, state: StateSpec, staging: sql.Composed, txid: int, attempt: int | None) -> None:
    """At the commit: keep ``attempt``'s staged rows as ``txid``'s deltas, drop the others' (all of
    them for an empty batch, ``attempt`` None)."""
    cur.execute(query("history_keep", table=staging), {"txid": txid, "attempt": attempt})


def drop_set_aside(cur: Cursor, state: StateSpec, staging: sql.Composed, txid: int, attempt: int) -> None:
    """Drop from the history the keys the commit set aside (left in ``txn_overflow``)."""
    cur.execute(query("history_drop_set_aside", table=staging, o_is_s=q.same_keys(state, "o", "s")),
                {"txid": txid, "attempt": attempt})


def digest(cur: Cursor, state: StateSpec, staging: sql.Composed, txid: int, attempt: int) -> str:
    """``rows:hash`` of what ``(txid, attempt)`` staged: equal for equal deltas, in any order."""
    cur.execute(query("history_digest", **_parts(state, staging)), {"txid": txid, "attempt": attempt})
    rows, total = cur.fetchone()
    return as_digest(rows, total)


def as_digest(rows: Any, total: Any) -> str:
    """``rows:hash`` from a row count and the sum of the rows' hashes (as ``history_digest`` sums them)."""
    return f"{int(rows)}:{int(total) % DIGEST_MODULUS:016x}"


def deltas(cur: Cursor, schema: str, topology_id: str, state: StateSpec, staging: sql.Composed,
           txid: int) -> list[tuple[Any, ...]]:
    """The (keys..., delta) rows committed ``txid`` applied to ``state``, in key order."""
    cur.execute(query("history_deltas", schema, **_parts(state, staging)), {"topology": topology_id, "txid": txid})
    return list(cur.fetchall())


def as_of(cur: Cursor, schema: str, topology_id: str, state: StateSpec, staging: sql.Composed, txid: int,
          from_txid: int) -> list[tuple[Any, ...]]:
    """The (keys..., value) rows of ``state`` as of committed ``txid``, from the history after ``from_txid``
    (and its snapshot at ``from_txid``), in key order."""
    cur.execute(query("history_as_of", schema, fold=fold(state), **_parts(state, staging)),
                {"topology": topology_id, "txid": txid, "from_txid": from_txid})
    return list(cur.fetchall())


def fold_into_snapshot(cur: Cursor, schema: str, topology_id: str, state: StateSpec, staging: sql.Composed,
                       txid: int, attempt: int, from_txid: int) -> None:
    """Fold the history from ``from_txid`` through ``txid`` into one snapshot row per key at ``txid``."""
    cur.execute(query("history_fold_into", schema, fold=fold(state), **_parts(state, staging)),
                {"topology": topology_id, "txid": txid, "attempt": attempt, "from_txid": from_txid})


def snapshot_of(cur: Cursor, schema: str, topology_id: str, state: StateSpec, staging: sql.Composed,
                source: sql.Composable, txid: int, attempt: int) -> None:
    """Make ``source`` (keys, value) the snapshot as of ``txid``: the history through it goes."""
    cur.execute(query("history_snapshot_of", schema, source=source, **_parts(state, staging)),
                {"topology": topology_id, "txid": txid, "attempt": attempt})


def mark(cur: Cursor, schema: str, topology_id: str) -> Mark:
    cur.execute(query("history_mark", schema), {"topology": topology_id})
    return only(cur, Mark)


def set_mark(cur: Cursor, schema: str, topology_id: str, from_txid: int, base: bool) -> None:
    cur.execute(query("history_set_mark", schema), {"topology": topology_id, "from_txid": from_txid, "base": base})


def size(cur: Cursor, schema: str, topology_id: str, staging: sql.Composed) -> Size:
    cur.execute(query("history_size", schema, table=staging),
                {"topology": topology_id, "table": staging.as_string(cur)})
    return only(cur, Size)


__all__ = ["Mark", "Size", "as_of", "deltas", "digest", "drop_set_aside", "fold",
           "fold_into_snapshot", "keep", "mark", "set_mark", "size", "snapshot_of"]
