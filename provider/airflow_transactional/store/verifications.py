"""The ``verifications`` table and the ``verified_through`` mark: what the shadow audit found of
each committed txid (``core/verify.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple

from psycopg2 import sql
from psycopg2.extras import Json

from ..exceptions import ConfigError
from ..model import VERIFY_ATTEMPT
from . import history as h
from . import state as q
from .rows import Cursor, every, one, scalar
from .statements import query

if TYPE_CHECKING:  # the store takes declarations, it does not depend on them
    from ..spec import StateSpec

#: The attempt a recomputation is staged under in the state's staging table.
ATTEMPT = VERIFY_ATTEMPT
#: The statuses that let the mark pass a txid (``superseded`` too, once its correction is verified).
PASSING = ("verified", "skipped")


class Mark(NamedTuple):
    verified_through: int
    committed_txid: int


class Candidate(NamedTuple):
    """A committed txid not checked yet, with what committed it."""

    txid: int
    attempt: int
    code: dict[str, Any] | None
    digests: dict[str, str] | None
    records_read: int
    quarantined: int
    corrects: dict[str, Any] | None
    batch: dict[str, Any]
    planned_records: int
    read_digest: str | None
    attempts: int


class Check(NamedTuple):
    txid: int
    status: str | None  # None: pending
    detail: dict[str, Any] | None
    checked_at: datetime | None


def mark(cur: Cursor, schema: str, topology_id: str) -> Mark:
    cur.execute(query("verify_mark", schema), {"topology": topology_id})
    return one(cur, Mark) or Mark(0, 0)


def candidates(cur: Cursor, schema: str, topology_id: str, after: int, limit: int) -> list[Candidate]:
    cur.execute(query("verify_candidates", schema), {"topology": topology_id, "after": after, "limit": limit})
    return every(cur, Candidate)


def candidate(cur: Cursor, schema: str, topology_id: str, txid: int) -> Candidate:
    cur.execute(query("verify_candidate", schema), {"topology": topology_id, "txid": txid})
    found = one(cur, Candidate)
    if found is None:
        raise ConfigError(f"topology {topology_id!r} has no committed txid {txid}")
    return found


def record(cur: Cursor, schema: str, topology_id: str, txid: int, status: str, detail: Mapping[str, Any]) -> None:
    cur.execute(query("verify_record", schema), {"topology": topology_id, "txid": txid, "status": status,
                                                 "detail": Json(dict(detail))})


def advance(cur: Cursor, schema: str, topology_id: str, at: int) -> int:
    """Move the mark over the passing txids after ``at`` (the mark as read); the mark now."""
    cur.execute(query("verify_advance", schema), {"topology": topology_id, "mark": at})
    return int(scalar(cur) or 0)


def forget(cur: Cursor, schema: str, topology_id: str, first: int, last: int) -> int:
    """Drop the checks of txids first..last (to run them again); the mark now."""
    cur.execute(query("verify_forget", schema), {"topology": topology_id, "first": first, "last": last})
    return int(scalar(cur) or 0)


def checks(cur: Cursor, schema: str, topology_id: str, first: int, last: int) -> list[Check]:
    cur.execute(query("verify_statuses", schema), {"topology": topology_id, "first": first, "last": last})
    return every(cur, Check)


def failures(cur: Cursor, schema: str, topology_id: str, limit: int) -> list[Check]:
    """The first ``limit`` failed checks, in txid order."""
    cur.execute(query("verify_failures", schema), {"topology": topology_id, "limit": limit})
    return every(cur, Check)


def any_check(cur: Cursor, schema: str, topology_id: str) -> bool:
    """Whether a round ever checked a txid of the topology."""
    cur.execute(query("verify_any", schema), {"topology": topology_id})
    return bool(scalar(cur))


def counts(cur: Cursor, schema: str, topology_id: str) -> dict[str, int]:
    """How many committed txids (from txid 1) are in each status, ``pending`` those unchecked."""
    cur.execute(query("verify_counts", schema), {"topology": topology_id})
    return {str(status): int(n) for status, n in cur.fetchall()}


def covering(cur: Cursor, schema: str, topology_id: str, txid: int) -> int | None:
    """The first committed correction of a range holding ``txid``, if any."""
    cur.execute(query("verify_covering", schema), {"topology": topology_id, "txid": txid})
    found = scalar(cur)
    return None if found is None else int(found)


def clear(cur: Cursor, staging: sql.Composed, txid: int) -> None:
    """Delete a recomputation's staged rows of ``txid`` (from a round's own table)."""
    cur.execute(query("verify_clear", table=staging), {"txid": txid, "attempt": ATTEMPT})


def digest(cur: Cursor, state: StateSpec, staging: sql.Composed, txid: int) -> str:
    """The recomputation's ``rows:hash`` (in a round's own table), made as the commit made the
    committed attempt's."""
    return h.digest(cur, state, staging, txid, ATTEMPT)


def diff(cur: Cursor, state: StateSpec, staging: sql.Composed, recomputed: sql.Composed, txid: int, committed: int,
         samples: int) -> list[tuple[str, str | None, str | None]]:
    """Keys whose recomputed delta (in ``recomputed``) differs from the committed one (in
    ``staging``): (key, committed, recomputed)."""
    cur.execute(query("verify_diff", table=staging, recomputed=recomputed, keys=q.key_list(state)),
                {"txid": txid, "attempt": ATTEMPT, "committed": committed, "samples": samples})
    return [(str(k), c, r) for k, c, r in cur.fetchall()]


def drift(cur: Cursor, schema: str, topology_id: str, state: StateSpec, staging: sql.Composed, from_txid: int,
          samples: int) -> list[tuple[str, str | None, str | None, int | None]]:
    """Keys whose stored value is not what the history folds to: (key, stored, from the history,
    the last txid that changed it)."""
    key_text = sql.SQL(" || ',' || ").join(
        sql.SQL("coalesce(h.{c}, t.{c})::text").format(c=sql.Identifier(c)) for c in state.key_columns)
    cur.execute(query("verify_drift", schema, table=staging, keys=q.key_list(state), fold=h.fold(state),
                      key_text=key_text, target=q.state_table(state), h_is_t=q.same_keys(state, "h", "t")),
                {"topology": topology_id, "from_txid": from_txid, "samples": samples})
    return [(str(k), s, f, None if t is None else int(t)) for k, s, f, t in cur.fetchall()]


def rewritten(cur: Cursor, schema: str, topology_id: str, state: StateSpec, staging: sql.Composed, from_txid: int,
              ) -> list[tuple[int, str, str]]:
    """The committed txids after ``from_txid`` whose kept history rows of ``state`` no longer digest
    to what their commit recorded: (txid, recorded, now), in txid order."""
    cur.execute(query("verify_rewritten", schema, table=staging, keys=q.key_list(state)),
                {"topology": topology_id, "state": state.name, "from_txid": from_txid})
    found = []
    for txid, recorded, rows, total in cur.fetchall():
        now = h.as_digest(rows, total)
        if now != recorded:
            found.append((int(txid), str(recorded), now))
    return found


def quarantined_through(cur: Cursor, schema: str, topology_id: str, txid: int) -> int:
    """The records txids through ``txid`` set aside, and no replay or correction took since."""
    cur.execute(query("verify_quarantined_through", schema), {"topology": topology_id, "txid": txid})
    return int(scalar(cur) or 0)


def add_base(cur: Cursor, schema: str, topology_id: str, state: StateSpec, staging: sql.Composed,
             audit: sql.Composed, from_txid: int, txid: int) -> None:
    """Add each key's sum through ``txid`` (its delta history from ``from_txid``) into ``audit``, an
    audit's recomputation of the txids after it."""
    cur.execute(query("verify_audit_base", schema, table=staging, audit=audit, keys=q.key_list(state)),
                {"topology": topology_id, "from_txid": from_txid, "txid": txid})
