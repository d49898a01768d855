"""Event logs (the OLEP log): logs, their partitions' counters, their events, and the ids of
removed events. The source that reads a log is :mod:`..sources.pglog`; the producer side,
:mod:`..sources.eventlog`; the commit's append of output events, :mod:`.outputs`.

Every partition has a counter row (``log_partitions.next_lsn``). An appender locks the counter
rows of its partitions in (log, partition) order, numbers its events from them, advances them and
commits, so LSNs of a partition become visible strictly in order and a committed counter is a
safe point: every event below it is visible and final.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import IO, Any, NamedTuple

from psycopg2 import sql

from .rows import Cursor, every, one, scalar
from .statements import query

__all__ = ["Bounds", "Partition", "append", "bounds", "copy_csv", "count", "ensure", "oldest_after", "partition_counts",
           "partitions", "read", "truncate"]


class Partition(NamedTuple):
    partition: int
    head: int  # the last LSN appended (0: none)
    truncated_through: int  # the last LSN retention removed (0: none)


class Bounds(NamedTuple):
    truncated_through: int
    head: int


def ensure(cur: Cursor, schema: str, log: str, partitions: int) -> None:
    """Create the log with ``partitions`` (idempotent; an existing log only ever gains partitions)."""
    cur.execute(query("log_ensure", schema), {"log": log, "partitions": partitions})


def partition_counts(cur: Cursor, schema: str, logs: Iterable[str]) -> dict[str, int]:
    """How many partitions each of ``logs`` has now (a log that does not exist is left out)."""
    cur.execute(query("log_partition_counts", schema), {"logs": list(logs)})
    return {str(name): int(n) for name, n in cur.fetchall()}


def count(cur: Cursor, schema: str, log: str) -> int | None:
    """How many partitions ``log`` has (None: there is no such log)."""
    return partition_counts(cur, schema, [log]).get(log)


def partitions(cur: Cursor, log_schema: str, log: str) -> list[Partition]:
    """The counters of every partition of ``log`` (in the schema it lives in), in order."""
    cur.execute(query("log_partitions", log_schema=sql.Identifier(log_schema)), {"log": log})
    return every(cur, Partition)


def read(cur: Cursor, log_schema: str, log: str, partition: int, lo: int, hi: int) -> Iterator[tuple[int, str, str]]:
    """The events of ``partition`` with LSN in ``(lo, hi]``, in order: (lsn, event id, payload),
    streamed through a server-side cursor (a batch of millions of events is not loaded)."""
    with cur.connection.cursor(name=f"txn_read_{partition}") as rc:
        rc.itersize = 10_000
        rc.execute(query("log_read", log_schema=sql.Identifier(log_schema)),
                   {"log": log, "p": partition, "lo": lo, "hi": hi})
        yield from rc


def versions(cur: Cursor, log_schema: str, log: str,
             ranges: Sequence[tuple[int, int, int]]) -> list[tuple[str, str, bool, int]]:
    """The retractions and versions among the events of ``ranges`` ((partition, lo, hi]: LSNs after
    lo through hi), and the originals they retract among them too, as the rows of
    :meth:`~airflow_transactional.sources.base.Versions.of`."""
    cur.execute(query("log_versions_in", log_schema=sql.Identifier(log_schema)),
                {"log": log, "parts": [r[0] for r in ranges], "los": [r[1] for r in ranges],
                 "his": [r[2] for r in ranges]})
    return [(str(o), str(origin), bool(r), int(t)) for o, origin, r, t in cur.fetchall()]


def copy_csv(cur: Cursor, log_schema: str, log: str, partition: int, lo: int, hi: int, out: IO[Any]) -> None:
    """Write what :func:`read` returns to ``out`` as CSV rows ``offset,event_id,payload`` (a NULL
    event id is an empty field, an empty one ``""``), built by the server in bulk."""
    statement = query("log_copy_csv", log_schema=sql.Identifier(log_schema))
    cur.copy_expert(cur.mogrify(statement, {"log": log, "p": partition, "lo": lo, "hi": hi}).decode(), out)


def oldest_after(cur: Cursor, log_schema: str, log: str, partition: int, lsn: int) -> float | None:
    """The age in seconds of the first event of ``partition`` past ``lsn`` (None: there is none)."""
    cur.execute(query("log_oldest_after", log_schema=sql.Identifier(log_schema)),
                {"log": log, "p": partition, "lsn": lsn})
    row = cur.fetchone()
    return None if row is None else float(row[0])


def append(cur: Cursor, schema: str, log: str, rows: Sequence[tuple[int, str, str]]) -> tuple[int, list[str]]:
    """Append ``(partition, event id, payload)`` rows through the log's door; (appended, the ids it
    refused). Ids the log holds or held are dropped, not counted."""
    cur.execute(query("log_append", schema), {"log": log, "partitions": [p for p, _i, _x in rows],
                                              "ids": [i for _p, i, _x in rows],
                                              "payloads": [x for _p, _i, x in rows]})
    appended, refused = cur.fetchone()
    return int(appended), list(refused or [])


def bounds(cur: Cursor, schema: str, log: str, partition: int) -> Bounds | None:
    """What ``partition`` removed and holds, locked against appends until the transaction ends."""
    cur.execute(query("log_partition_bounds", schema), {"log": log, "p": partition})
    return one(cur, Bounds)


def truncate(cur: Cursor, schema: str, log: str, partition: int, through_lsn: int) -> int:
    """Remove the events of ``partition`` through ``through_lsn``, keeping their ids; how many went."""
    params = {"log": log, "p": partition, "lsn": through_lsn}
    cur.execute(query("log_truncate", schema), params)
    removed = cur.rowcount
    cur.execute(query("log_truncated_through", schema), params)
    return int(removed)


def last_lsn(cur: Cursor, schema: str, log: str, partition: int) -> int:
    """The highest LSN ``partition`` holds (0: none)."""
    cur.execute(query("log_last_lsn", schema), {"log": log, "p": partition})
    return int(scalar(cur))


def rewind(cur: Cursor, schema: str, log: str, partition: int, next_lsn: int) -> None:
    """Set ``partition``'s next LSN back to ``next_lsn`` (the schema's owner only: the guard refuses
    anyone else, and any move past what the partition removed)."""
    cur.execute(query("log_rewind", schema), {"log": log, "p": partition, "lsn": next_lsn})
