"""Output logs: the events a topology's transform emits, staged per (txid, attempt) like state
deltas, and appended to their event logs by the commit -- in its one transaction, so an event
is in the log exactly when the txid that emitted it is committed.

Appending takes the log's partition locks in (log, partition) order, as every producer of the
log does (:mod:`..sources.eventlog`), so LSNs of a partition still become visible strictly in
order and a reader's planning still sees only safe points. A commit waits at most
:data:`LOCK_WAIT` for a partition's lock: another transaction holding it longer (an appender
that left its transaction open) fails the commit with :class:`LogLocked`, to be retried, instead
of holding the topology's commits -- and the triggerer's thread -- for as long as it likes.
Event ids are unique per log: an event whose id the log already holds (or held, before
retention) is not appended again.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import psycopg2.errors
from psycopg2 import sql

from ..exceptions import IdCollision, LogLocked
from ..model import RETRACTED
from .history import DIGEST_MODULUS
from .rows import Cursor, every
from .statements import query

#: The longest a commit waits for an output log's partition lock (a PostgreSQL interval).
LOCK_WAIT = "20s"

#: Columns of a topology's output staging table, in COPY order. An event with a ``request`` is
#: appended only if that request of ``decision`` got the verdict ``granted`` (true or false);
#: ``retraction`` is set in a batch that read a correction's events (:func:`resolve`).
COLUMNS = ("txid", "attempt", "output", "partition", "seq", "event_id", "payload", "decision", "request", "granted",
           "retraction")


class Target(NamedTuple):
    """One declared output: the name the transform uses, the log it appends to."""

    output: str
    log: str


def staging_table(schema: str, topology_num: int) -> sql.Composed:
    """Staged output events of every output of topology number ``topology_num``."""
    return sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(f"out_{topology_num}"))


def verify_table(schema: str, topology_num: int) -> sql.Composed:
    """Where a round of the shadow audit stages the output events it recomputed (as the states'
    :func:`.state.verify_table`)."""
    return sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(f"vfy_out_{topology_num}"))


def preview_table(schema: str, topology_num: int) -> sql.Composed:
    """Where a correction's preview stages the events it recomputed (every output's); dropped after."""
    return sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(f"preview_out_{topology_num}"))


def create_staging_table(staging: sql.Composed) -> sql.Composed:
    return query("output_staging_create", staging=staging)


#: The key of an output's digest among a commit's digests (beside the states', by name).
DIGEST_PREFIX = "out:"


def staged_counts(cur: Cursor, staging: sql.Composed, txid: int, attempt: int) -> dict[str, tuple[int, str]]:
    """Per output: how many events ``(txid, attempt)`` staged, and their digest (``events:hash``,
    the same for the same events in any order; recorded with the commit as ``out:<output>``)."""
    cur.execute(query("output_staged_counts", staging=staging), {"txid": txid, "attempt": attempt})
    return {str(o): (int(n), f"{int(n)}:{int(total) % DIGEST_MODULUS:016x}") for o, n, total in cur.fetchall()}


def append(cur: Cursor, schema: str, staging: sql.Composed, targets: Iterable[Target], txid: int,
           attempt: int, *, only: sql.Composable | None = None, topology_id: str | None = None) -> dict[str, int]:
    """Append the events staged by ``attempt`` of ``txid`` to their logs; events appended, by output.

    Per partition they go in ``seq`` order (then id order), after every event already there.
    An event for a request goes only if ``only`` (a condition on the staged event ``o``, see
    ``decisions.output_filter``) says the request got the verdict the event was emitted for;
    without it, no event for a request goes. Raises LookupError for a staged partition its log
    does not have, and :class:`IdCollision` for an event whose id the log holds with another
    payload (not this event appended before: someone else's, or a transform that changed).
    """
    only_verdicts: sql.Composable = only if only is not None else sql.SQL("o.request IS NULL")
    log_of = {t.output: t.log for t in targets}
    cur.execute(query("output_staged_partitions", staging=staging), {"txid": txid, "attempt": attempt})
    staged = sorted((log_of[output], int(p), output) for output, p in cur.fetchall() if output in log_of)
    appended = dict.fromkeys(log_of, 0)
    cur.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(LOCK_WAIT)))
    for log, p, output in staged:  # (log, partition) order: every appender locks in this order
        where = {"log": log, "p": p}
        try:
            cur.execute(query("output_append", schema, staging=staging, only_verdicts=only_verdicts),
                        {**where, "txid": txid, "attempt": attempt, "output": output})
        except psycopg2.errors.LockNotAvailable:
            raise LogLocked(f"txid {txid}: partition {p} of output log {log!r} stayed locked by another transaction "
                            f"for more than {LOCK_WAIT} (an appender that left its transaction open?); nothing is "
                            "committed and the commit is retried. pg_stat_activity shows who holds it: a producer "
                            "must commit or roll back right after append_events") from None
        first, handed_out, inserted, clash = cur.fetchone()
        if first is None:
            raise LookupError(f"log {log!r} has no partition {p}")
        if clash is not None:
            raise IdCollision(log, str(clash))
        appended[output] += int(inserted)
        if topology_id is not None and handed_out:  # where this txid's events are, for a publisher
            cur.execute(query("output_range_record", schema), {**where, "topology": topology_id, "txid": txid,
                                                               "output": output, "first": int(first),
                                                               "last": int(first) + int(handed_out) - 1})
    cur.execute("SET LOCAL lock_timeout TO DEFAULT")
    return appended


def resolve(cur: Cursor, schema: str, staging: sql.Composed, targets: Iterable[Target], topology_id: str,
            txid: int, attempt: int) -> None:
    """Make the events staged by an attempt that read a correction's events upstream what the log
    takes -- retractions of its live events, new versions of retracted ones -- before :func:`append`;
    nothing for another attempt (one query)."""
    where = {"txid": txid, "attempt": attempt}
    cur.execute(query("output_marked", staging=staging), where)
    row = cur.fetchone()
    if row is None or not row[0]:
        return
    logs = {t.output: t.log for t in targets}
    cur.execute(query("output_resolve", schema, staging=staging),
                {**where, "topology": topology_id, "suffix": f"{RETRACTED}{txid}", "outputs": list(logs),
                 "logs": list(logs.values())})


class Event(NamedTuple):
    partition: int
    lsn: int
    event_id: str
    payload: str
    retracts: str | None = None  # a correction's retraction: the id of the event it takes back


def events_of_txid(cur: Cursor, schema: str, topology_id: str, txid: int, output: str) -> list[Event]:
    """The events the commit of ``txid`` appended to ``output``, partition by partition, in order."""
    cur.execute(query("output_events_of_txid", schema), {"topology": topology_id, "txid": txid, "output": output})
    return every(cur, Event)
