"""The store's side of corrections (``core/corrections.py``): the transactions a correction reads
again, the corrections planned, and the statements of a correction's commit
(``store/queries/corrections.sql``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from psycopg2 import sql

from ..model import Transaction
from . import state as q
from .rows import Cursor, every, scalar
from .statements import query
from .transactions import COLUMNS

if TYPE_CHECKING:
    from ..spec import StateSpec


def committed_txns(cur: Cursor, schema: str, topology_id: str, first: int, last: int) -> list[Transaction]:
    """The committed transactions ``first``..``last``, in order."""
    cur.execute(query("correction_committed_txns", schema, columns=COLUMNS),
                {"topology": topology_id, "first": first, "last": last})
    return every(cur, Transaction)


def corrections_in(cur: Cursor, schema: str, topology_id: str, through: int | None
                   ) -> list[tuple[int, tuple[int, int]]]:
    """Every correction planned (through txid ``through``, if given): (txid, (first, last))."""
    cur.execute(query("correction_ranges", schema), {"topology": topology_id, "through": through})
    return [(int(txid), (int(lo), int(hi))) for txid, lo, hi in cur.fetchall()]


def differences(cur: Cursor, schema: str, topology_id: str, state: StateSpec, staging: sql.Composed, txid: int,
                attempt: int, old: list[int]) -> int:
    """Make ``(txid, attempt)``'s staged rows the differences from what the ``old`` txids applied; how many."""
    cur.execute(query("correction_differences", schema, table=staging, keys=q.key_list(state)),
                {"topology": topology_id, "txid": txid, "attempt": attempt, "old": old})
    cur.execute(q.count_staged(staging), (txid, attempt))
    return int(scalar(cur))


def settle_quarantine(cur: Cursor, schema: str, topology_id: str, txid: int, attempt: int, old: list[int]) -> int:
    """Mark what the correction counted of the ``old`` txids' bad records; how many bad records it keeps."""
    cur.execute(query("correction_settle_quarantine", schema),
                {"topology": topology_id, "txid": txid, "attempt": attempt, "old": old})
    return int(scalar(cur))
