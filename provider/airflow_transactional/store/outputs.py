"""Output logs: the events a topology's transform emits, staged per (txid, attempt) like state
deltas, and appended to their event logs by the commit -- in its one transaction, so an event
is in the log exactly when the txid that emitted it is committed.

Appending takes the log's partition locks in (log, partition) order, as every producer of the
log does (:mod:`..sources.eventlog`), so LSNs of a partition still become visible strictly in
order and a reader's planning still sees only safe points. Event ids are unique per log: an
event whose id the log already holds (or held, before retention) is not appended again.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from psycopg2 import sql

from .rows import Cursor, table

#: Columns of a topology's output staging table, in COPY order. An event with a ``request`` is
#: appended only if that request of ``decision`` got the verdict ``granted`` (true or false).
COLUMNS = ("txid", "attempt", "output", "partition", "seq", "event_id", "payload", "decision", "request", "granted")


class IdCollision(LookupError):
    """An event the commit would append is in the log already with another payload."""

    def __init__(self, log: str, event_id: str) -> None:
        self.log, self.event_id = log, event_id
        super().__init__(f"{event_id!r} is already in log {log!r} with another payload")


class Target(NamedTuple):
    """One declared output: the name the transform uses, the log it appends to."""

    output: str
    log: str


def event_id(topology_id: str, origin: str) -> str:
    """The log's id of an event a topology emits: its topology, then its origin (deterministic,
    so an event emitted again is known and never appended twice)."""
    return f"{topology_id}:{origin}"


def staging_table(schema: str, topology_num: int) -> sql.Composed:
    """Staged output events of every output of topology number ``topology_num``."""
    return sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(f"out_{topology_num}"))


def create_staging_table(staging: sql.Composed) -> sql.Composed:
    # The key refuses an attempt that emits one event id twice: a transform bug, never a
    # silent pick of one of them.
    return sql.SQL("CREATE TABLE IF NOT EXISTS {} (txid bigint NOT NULL, attempt integer NOT NULL, "
                   "output text NOT NULL, partition integer NOT NULL, seq bigint, event_id text NOT NULL, "
                   "payload text NOT NULL, decision text, request text, granted boolean, "
                   "PRIMARY KEY (txid, attempt, output, event_id))").format(staging)


def ensure_log(cur: Cursor, schema: str, log: str, partitions: int) -> None:
    """Create the log with ``partitions`` (idempotent; an existing log only ever gains partitions)."""
    s = sql.Identifier(schema)
    cur.execute(sql.SQL(
        "INSERT INTO {}.logs (log_name, partitions) VALUES (%s, %s) ON CONFLICT (log_name) "
        "DO UPDATE SET partitions = greatest(logs.partitions, EXCLUDED.partitions)").format(s), (log, partitions))
    cur.execute(sql.SQL(
        "INSERT INTO {}.log_partitions (log_name, partition) SELECT %s, p "
        "FROM generate_series(0, %s - 1) p ON CONFLICT DO NOTHING").format(s), (log, partitions))


def partitions(cur: Cursor, schema: str, logs: Iterable[str]) -> dict[str, int]:
    """How many partitions each of ``logs`` has now."""
    cur.execute(sql.SQL("SELECT log_name, partitions FROM {} WHERE log_name = ANY(%s)").format(
        table(schema, "logs")), (list(logs),))
    return {str(name): int(n) for name, n in cur.fetchall()}


def staged_counts(cur: Cursor, staging: sql.Composed, txid: int, attempt: int) -> dict[str, int]:
    cur.execute(sql.SQL("SELECT output, count(*) FROM {} WHERE txid = %s AND attempt = %s GROUP BY output")
                .format(staging), (txid, attempt))
    return {str(o): int(n) for o, n in cur.fetchall()}


def append(cur: Cursor, schema: str, staging: sql.Composed, targets: Iterable[Target], txid: int,
           attempt: int, *, only: sql.Composable | None = None) -> dict[str, int]:
    """Append the events staged by ``attempt`` of ``txid`` to their logs; events appended, by output.

    Per partition they go in ``seq`` order (then id order), after every event already there.
    An event for a request goes only if ``only`` (a condition on the staged event ``o``, see
    ``decisions.output_filter``) says the request got the verdict the event was emitted for;
    without it, no event for a request goes. Raises LookupError for a staged partition its log
    does not have, and :class:`IdCollision` for an event whose id the log holds with another
    payload (not this event appended before: someone else's, or a transform that changed).
    """
    only_verdicts: sql.Composable = only if only is not None else sql.SQL("o.request IS NULL")
    s = sql.Identifier(schema)
    log_of = {t.output: t.log for t in targets}
    cur.execute(sql.SQL("SELECT DISTINCT output, partition FROM {} WHERE txid = %s AND attempt = %s")
                .format(staging), (txid, attempt))
    staged = sorted((log_of[output], int(p), output) for output, p in cur.fetchall() if output in log_of)
    appended = dict.fromkeys(log_of, 0)
    for log, p, output in staged:  # (log, partition) order: every appender locks in this order
        cur.execute(sql.SQL("SELECT next_lsn FROM {}.log_partitions WHERE log_name = %s AND partition = %s "
                            "FOR UPDATE").format(s), (log, p))
        row = cur.fetchone()
        if row is None:
            raise LookupError(f"log {log!r} has no partition {p}")
        # Ids the log holds (or held before retention) are left out before numbering: no LSN gap.
        # One held with another payload is not this event appended before: it is reported.
        # OFFSET 0 keeps each probe one index lookup per event (a join, on a log grown since its
        # statistics, nests a scan of the log under each event).
        cur.execute(sql.SQL(
            "WITH staged AS (SELECT o.seq, o.event_id, o.payload, "
            "(SELECT k.payload FROM {s}.log_events k WHERE k.log_name = %(log)s AND k.event_id = o.event_id "
            "OFFSET 0) AS held, EXISTS (SELECT 1 FROM {s}.log_retired_ids k WHERE k.log_name = %(log)s "
            "AND k.event_id = o.event_id OFFSET 0) AS retired FROM {stg} o WHERE o.txid = %(txid)s "
            "AND o.attempt = %(attempt)s AND o.output = %(output)s AND o.partition = %(p)s AND {only_verdicts}), "
            "numbered AS (SELECT %(base)s + row_number() OVER (ORDER BY seq, event_id) - 1 AS lsn, event_id, payload "
            "FROM staged WHERE held IS NULL AND NOT retired), "
            "ins AS (INSERT INTO {s}.log_events (log_name, partition, lsn, event_id, payload) "
            "SELECT %(log)s, %(p)s, lsn, event_id, payload FROM numbered "
            "ON CONFLICT (log_name, event_id) DO NOTHING RETURNING 1) "
            "SELECT (SELECT count(*) FROM numbered), (SELECT count(*) FROM ins), "
            "(SELECT event_id FROM staged WHERE held <> payload ORDER BY event_id LIMIT 1)").format(
                stg=staging, s=s, only_verdicts=only_verdicts),
            {"base": int(row[0]), "txid": txid, "attempt": attempt, "output": output, "p": p, "log": log})
        handed_out, inserted, clash = cur.fetchone()
        if clash is not None:
            raise IdCollision(log, str(clash))
        # A concurrent producer's id can still win the unique index: its LSN stays a harmless gap.
        cur.execute(sql.SQL("UPDATE {}.log_partitions SET next_lsn = next_lsn + %s "
                            "WHERE log_name = %s AND partition = %s").format(s), (int(handed_out), log, p))
        appended[output] += int(inserted)
    return appended

