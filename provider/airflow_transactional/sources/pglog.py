"""A partitioned, append-only event log in PostgreSQL (the OLEP log): its source (the producer
side, :class:`EventLog`, is in :mod:`.eventlog`).

Ordering and visibility. Every partition has a counter row (``log_partitions.next_lsn``). An
append locks the counter rows of its partitions (always in ascending partition order, so two
producers never deadlock), inserts its events with the next LSNs, advances the counters and
commits. A second producer of the same partition waits for that lock, so LSNs of a partition
become visible strictly in LSN order and a rolled-back append gives its LSNs back. A committed
counter value is therefore a *safe point*: every event below it is visible and final. Planning
reads only the counters -- never ``max(lsn)`` of a sequence, where LSN 11 can become visible
after 12 has been read (docs/design.md, trap 6) -- and costs O(partitions), whatever the log's size.

Idempotence. ``event_id`` is unique per log: a duplicate delivery (a producer retrying after a
lost acknowledgement, a resent message) is dropped at append time and counted once -- also after
retention removed the original (the ids of removed events are kept in ``log_retired_ids``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import psycopg2
import psycopg2.extensions

from .. import identifiers
from ..exceptions import BatchUnavailable, ConfigError
from ..model import LogBatch, Offsets, PlannedBatch, Range, planned_batch
from ..store import logs
from .base import BatchPlan, Record, Source, Versions, fair_shares
from .eventlog import SOURCE_KIND, AppendResult, EventLog, partition_of

# The producer side is re-exported where it was first published.
__all__ = ["AppendResult", "EventLog", "PostgresLogSource", "partition_of"]

log = logging.getLogger(__name__)


class PostgresLogSource(Source):
    """Batches of a Postgres event log: per partition, the LSN range ``(start, end]``."""

    kind: ClassVar[str] = SOURCE_KIND
    may_retract: ClassVar[bool] = True
    spark_reader: ClassVar[str] = "airflow_transactional.spark.read.read_log"

    def __init__(self, log: str, *, schema: str | None = None) -> None:
        self.log = identifiers.name("log name", log)
        # The log lives in the store's schema unless named otherwise.
        self.schema = identifiers.name("schema name", schema) if schema else None

    def to_config(self) -> dict[str, Any]:
        return {"kind": self.kind, "log": self.log, "schema": self.schema}

    def dataset(self, database: str, store_schema: str) -> tuple[str, str]:
        return "postgres", f"{database}.{self.schema or store_schema}.log.{self.log}"

    def _partitions(self, cur: psycopg2.extensions.cursor, schema: str) -> list[logs.Partition]:
        rows = logs.partitions(cur, self.schema or schema, self.log)
        if not rows:
            raise ConfigError(f"event log {self.log!r} does not exist: create it with "
                              f"EventLog(dsn, {self.log!r}).create(partitions=N)")
        return rows

    def register(self, cur: psycopg2.extensions.cursor, schema: str, topology_id: str) -> None:
        self._partitions(cur, schema)

    def plan(self, cur: psycopg2.extensions.cursor, schema: str, topology_id: str, start: Offsets,
             max_records: int, *, skip_unavailable: bool, until: Offsets | None = None) -> BatchPlan:
        parts = self._partitions(cur, schema)
        lo: dict[int, int] = {}
        avail: dict[int, int] = {}
        lost = 0
        lost_detail: list[str] = []
        lost_ranges: list[Any] = []
        for p, head, truncated in parts:
            begin = int(start.get(str(p), 0))
            if truncated > begin:
                detail = f"partition {p} LSN {begin + 1}..{truncated}"
                if not skip_unavailable:
                    raise BatchUnavailable(
                        f"log {self.log!r}: events {detail} were removed by retention before "
                        f"topology {topology_id!r} committed them; restore them, or declare the "
                        "topology opaque=True to skip what is gone (the loss is recorded)")
                lost += truncated - begin
                lost_detail.append(detail)
                lost_ranges.append([p, begin + 1, truncated])
                begin = truncated
            if until is not None:
                head = min(head, max(begin, int(until.get(str(p), 0))))
            lo[p] = begin
            avail[p] = max(0, head - begin)
        take = fair_shares(avail, max_records)
        end = {str(p): lo[p] + take[p] for p in lo}
        ranges = tuple(Range(p, lo[p], lo[p] + take[p]) for p in sorted(lo) if take[p] > 0)
        return BatchPlan(
            start={str(p): int(start.get(str(p), 0)) for p in lo},
            end=end,
            batch=LogBatch(log=self.log, ranges=ranges),
            planned_records=sum(take.values()),
            lost_records=lost,
            lost_detail=lost_detail,
            lost_ranges=lost_ranges,
        )

    def unavailable(self, cur: psycopg2.extensions.cursor, schema: str, topology_id: str,
                    batch: Mapping[str, Any]) -> str | None:
        batch = planned_batch(batch, self.kind)
        if not isinstance(batch, LogBatch) or not batch.ranges:
            return None
        truncated = {p: t for p, _h, t in self._partitions(cur, schema)}
        gone = [f"partition {p} LSN {lo + 1}..{min(hi, truncated.get(p, 0))}"
                for p, lo, hi in batch.ranges if truncated.get(p, 0) > lo]
        if gone:
            return f"log {self.log!r}: events removed by retention: {', '.join(gone)}"
        return None

    def read(self, cur: psycopg2.extensions.cursor, schema: str, topology_id: str,
             batch: Mapping[str, Any]) -> Iterator[Record]:
        batch = planned_batch(batch, self.kind)
        for p, lo, hi in batch.ranges if isinstance(batch, LogBatch) else ():
            for lsn, event_id, payload in logs.read(cur, self.schema or schema, self.log, p, lo, hi):
                yield Record(f"{p}:{lsn}", event_id, payload)

    def versions(self, cur: psycopg2.extensions.cursor, schema: str, batch: Mapping[str, Any]) -> Versions:
        batch = planned_batch(batch, self.kind)
        if not isinstance(batch, LogBatch) or not batch.ranges:
            return Versions()
        return Versions.of(logs.versions(cur, self.schema or schema, self.log, batch.ranges))

    def copy_csv(self, cur: psycopg2.extensions.cursor, schema: str, partition: int, lo: int, hi: int,
                 out: Any) -> None:
        """Write the events of one LSN range to ``out`` as CSV rows ``offset,event_id,payload`` --
        the same records as :meth:`read`, built by the server in bulk (a NULL event id is an
        empty field, an empty one ``""``)."""
        logs.copy_csv(cur, self.schema or schema, self.log, partition, lo, hi, out)

    def committed_batch(self, cur: psycopg2.extensions.cursor, schema: str, topology_id: str,
                        committed: Offsets, lost: list[Any]) -> tuple[PlannedBatch, str | None]:
        ranges, gone = [], []
        for p, _head, truncated in self._partitions(cur, schema):
            end = int(committed.get(str(p), 0))
            removed = min(truncated, end)  # LSN 1..removed of what committed is gone from the log
            covered = 0
            for _p, a, b in sorted(r for r in lost if r[0] == p):
                if a <= covered + 1:
                    covered = max(covered, b)
            if covered < removed:  # every partition named, not only the first
                gone.append(f"partition {p} LSN {covered + 1}..{removed}")
            elif end > removed:
                ranges.append(Range(p, removed, end))
        if gone:
            return PlannedBatch(), (f"log {self.log!r}: retention removed committed events ({', '.join(gone)}); "
                                    "they can no longer be recomputed")
        return LogBatch(log=self.log, ranges=tuple(ranges)), None

    def lag(self, cur: psycopg2.extensions.cursor, schema: str, topology_id: str, committed: Offsets) -> int:
        return sum(max(0, head - max(int(committed.get(str(p), 0)), t))
                   for p, head, t in self._partitions(cur, schema))

    def lag_seconds(self, cur: psycopg2.extensions.cursor, schema: str, topology_id: str,
                    committed: Offsets) -> float | None:
        """The age of the oldest uncommitted event: the first one past the committed offset of each
        partition (one index probe each), by the database's clock."""
        oldest = 0.0
        for p, head, truncated in self._partitions(cur, schema):
            after = max(int(committed.get(str(p), 0)), truncated)
            if head <= after:
                continue
            age = logs.oldest_after(cur, self.schema or schema, self.log, p, after)
            if age is not None:
                oldest = max(oldest, age)
        return oldest
