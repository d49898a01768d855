"""The store's side of corrections (``core/corrections.py``): the transactions a correction reads
again, the corrections planned, and the statements of a correction's commit
(``store/queries/corrections.sql``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from psycopg2 import sql
from psycopg2.extras import Json

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


def committed_replay_ids(cur: Cursor, schema: str, topology_id: str, first: int, last: int) -> list[int]:
    """The quarantined records the replays committed as txids ``first``..``last`` took."""
    cur.execute(query("committed_replay_ids", schema), {"topology": topology_id, "first": first, "last": last})
    return [int(i) for (i,) in cur.fetchall()]


class Planned(NamedTuple):
    """A correction or a replay planned: its txid, what it corrects, how many of its records were edited."""

    txid: int
    corrects: dict[str, Any]
    edited: int

    @property
    def covers(self) -> set[int] | tuple[int, int]:
        """The txids whose deltas it changed: a range correction's (first, last), a replay's set."""
        if "replay" in self.corrects:
            return {int(t) for t in self.corrects.get("of_txids", ())}
        first, last = self.corrects["txids"]
        return int(first), int(last)


def corrections_in(cur: Cursor, schema: str, topology_id: str, through: int | None) -> list[Planned]:
    """Every correction and replay planned (through txid ``through``, if given), in txid order."""
    cur.execute(query("correction_ranges", schema), {"topology": topology_id, "through": through})
    return every(cur, Planned)


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


class Taken(NamedTuple):
    """A quarantined record a replay took: its id, the txid that quarantined it, and whether its
    whole text is there to replay (an edit, or a record not cut to the quarantine's prefix)."""

    id: int
    txid: int
    whole: bool


class Quarantined(NamedTuple):
    id: int
    txid: int
    source_offset: str
    event_id: str | None
    reason: str
    record: str | None
    record_length: int | None
    edited_record: str | None
    corrected_by: int | None
    replayed_by: int | None


def take_for_replay(cur: Cursor, schema: str, topology_id: str, txid: int, *, ids: list[int] | None,
                    txids: tuple[int, int] | None, reason: str | None) -> list[Taken]:
    """Mark the records a replay selects (by id, or by the txids that quarantined them and a reason)
    as taken by replay ``txid``; the records taken."""
    first, last = txids or (None, None)
    cur.execute(query("replay_take", schema), {"topology": topology_id, "txid": txid, "ids": ids, "first": first,
                                               "last": last, "reason": reason})
    return every(cur, Taken)


def why_not_replayable(cur: Cursor, schema: str, topology_id: str, ids: list[int]) -> list[tuple[int, str]]:
    """(id, why) of the given records that cannot be replayed."""
    cur.execute(query("replay_why_not", schema), {"topology": topology_id, "ids": ids})
    return [(int(i), str(why)) for i, why in cur.fetchall()]


def replay_versions(cur: Cursor, schema: str, topology_id: str, ids: list[int]) -> list[tuple[str, str, bool, int]]:
    """Of the records a replay took, the retractions and versions of an upstream correction, as the
    rows of :meth:`~airflow_transactional.sources.base.Versions.of`."""
    cur.execute(query("replay_versions", schema), {"topology": topology_id, "ids": ids})
    return [(str(o), str(origin), bool(r), int(t)) for o, origin, r, t in cur.fetchall()]


def replay_records(cur: Cursor, schema: str, topology_id: str, ids: list[int]) -> list[tuple[str, str | None, str]]:
    """(source offset, event id, text) of the records a replay took, each as edited if it was."""
    cur.execute(query("replay_records", schema), {"topology": topology_id, "ids": ids})
    return [(str(o), e, str(p)) for o, e, p in cur.fetchall()]


def settle_replay(cur: Cursor, schema: str, topology_id: str, txid: int, attempt: int) -> int:
    """Mark the records replay ``txid`` counted; how many bad records it keeps."""
    cur.execute(query("replay_settle", schema), {"topology": topology_id, "txid": txid, "attempt": attempt})
    return int(scalar(cur))


def edit(cur: Cursor, schema: str, topology_id: str, record_id: int, text: str) -> bool:
    """Keep ``text`` as the record to replay in place of quarantined record ``record_id`` (False: no
    such record not yet replayed)."""
    cur.execute(query("quarantine_edit", schema), {"topology": topology_id, "id": record_id, "record": text})
    return cur.fetchone() is not None


def listed(cur: Cursor, schema: str, topology_id: str, *, txid: int | None, reason: str | None,
           limit: int) -> list[Quarantined]:
    cur.execute(query("quarantine_list", schema), {"topology": topology_id, "txid": txid, "reason": reason,
                                                   "limit": limit})
    return every(cur, Quarantined)


class Preview(NamedTuple):
    """What a correction would apply to one state: how many keys change, the totals before and
    after, and the keys that change most as [key, old, new]."""

    changed: int
    old_total: Any
    new_total: Any
    samples: list[list[Any]]


def preview(cur: Cursor, schema: str, topology_id: str, state: StateSpec, staging: sql.Composed,
            recomputed: sql.Composed, old: list[int], samples: int = 10) -> Preview:
    """``recomputed`` (keys, value) against what the ``old`` txids applied to ``state``."""
    cur.execute(query("correction_preview", schema, table=staging, recomputed=recomputed, keys=q.key_list(state)),
                {"topology": topology_id, "old": old, "samples": samples})
    row = cur.fetchone()
    return Preview(int(row[0]), _number(row[1]), _number(row[2]), list(row[3]))


def _number(value: Any) -> int | float:
    """A sum as Postgres gives it (numeric for integers) as a plain number."""
    if value is None:
        return 0
    return int(value) if value == int(value) else float(value)



def codes_of(cur: Cursor, schema: str, topology_id: str, txids: list[int]) -> list[dict[str, Any] | None]:
    """The code record each of ``txids`` was committed with (None: committed before codes were recorded)."""
    cur.execute(query("correction_codes", schema), {"topology": topology_id, "txids": txids})
    return [row[0] for row in cur.fetchall()]


def keys_of(cur: Cursor, staging: sql.Composed, state: StateSpec, txid: int, attempt: int) -> list[str]:
    """Up to ten keys of ``(txid, attempt)``'s staged rows, as text."""
    cur.execute(query("correction_keys", table=staging, keys=q.key_list(state)), {"txid": txid, "attempt": attempt})
    return [str(row[0]) for row in cur.fetchall()]


def withdraw(cur: Cursor, schema: str, topology_id: str, txid: int, reason: str) -> None:
    """Record why correction (or replay) ``txid`` was withdrawn; free a replay's records."""
    cur.execute(query("correction_withdraw", schema), {"topology": topology_id, "txid": txid, "reason": reason})


def compensate(cur: Cursor, schema: str, topology_id: str, staging: sql.Composed, txid: int, attempt: int,
               old: list[int], logs: dict[str, str]) -> dict[str, int]:
    """Make ``(txid, attempt)``'s staged events the compensation of what the ``old`` txids appended
    to the outputs' logs (``logs``: output -> log): retractions and new versions; how many, by output."""
    _compensation(cur, schema, topology_id, staging, txid, attempt, old, logs)
    cur.execute(query("correction_compensate", schema, staging=staging),
                {"topology": topology_id, "txid": txid, "attempt": attempt})
    counts = {str(o): int(n) for o, n in cur.fetchall()}
    return {o: counts.get(o, 0) for o in logs}


def compensation_counts(cur: Cursor, schema: str, topology_id: str, staging: sql.Composed, txid: int, attempt: int,
                        old: list[int], logs: dict[str, str]) -> dict[str, dict[str, int]]:
    """What :func:`compensate` would append for the events staged at ``(txid, attempt)`` (a preview's),
    changing nothing: by output, the retractions, new versions and events under their own id."""
    _compensation(cur, schema, topology_id, staging, txid, attempt, old, logs)
    cur.execute(query("correction_compensation_counts", schema))
    found = {str(o): {"retracted": int(r), "versions": int(v), "new": int(n)} for o, r, v, n in cur.fetchall()}
    cur.execute(query("correction_compensation_drop", schema))
    return {o: found.get(o, {"retracted": 0, "versions": 0, "new": 0}) for o in logs}


def _compensation(cur: Cursor, schema: str, topology_id: str, staging: sql.Composed, txid: int, attempt: int,
                  old: list[int], logs: dict[str, str]) -> None:
    cur.execute(query("correction_compensation", schema, staging=staging),
                {"topology": topology_id, "txid": txid, "attempt": attempt, "old": old,
                 "outputs": list(logs), "logs": list(logs.values())})


def outputs_gone(cur: Cursor, schema: str, topology_id: str, old: list[int]) -> list[str]:
    """What retention removed of the events the ``old`` txids appended, in words."""
    cur.execute(query("correction_outputs_gone", schema), {"topology": topology_id, "old": old})
    return [f"txid {t}: log {log!r} partition {p} LSN {lo}..{hi}" for t, log, p, lo, hi in cur.fetchall()]


def log_readers(cur: Cursor, schema: str, logs: list[str], topics: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """(topology, declaration) of every registered topology reading one of ``logs`` (in ``schema``)
    or of the Kafka ``topics``."""
    cur.execute(query("correction_log_readers", schema), {"logs": logs, "topics": topics, "schema": schema})
    return [(str(t), dict(s)) for t, s in cur.fetchall()]


def applied(cur: Cursor, schema: str, topology_id: str, state: StateSpec, staging: sql.Composed,
            old: list[int]) -> tuple[int, int | float]:
    """How many keys the ``old`` txids changed in ``state``, and the sum of their deltas."""
    cur.execute(query("correction_applied", schema, table=staging, keys=q.key_list(state)),
                {"topology": topology_id, "old": old})
    keys, total = cur.fetchone()
    return int(keys), _number(total)


def record_preview(cur: Cursor, schema: str, topology_id: str, first: int, last: int, result: dict[str, Any]) -> None:
    """Keep ``result`` as the last preview of a correction of first..last."""
    cur.execute(query("correction_preview_record", schema), {"topology": topology_id, "first": first, "last": last,
                                                             "result": Json(result)})


def last_preview(cur: Cursor, schema: str, topology_id: str, first: int, last: int) -> dict[str, Any] | None:
    """The last preview of a correction of first..last, with when it ran (None: never previewed)."""
    cur.execute(query("correction_preview_last", schema), {"topology": topology_id, "first": first, "last": last})
    row = cur.fetchone()
    return None if row is None else {**row[0], "previewed_at": row[1].isoformat()}
