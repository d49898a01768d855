"""Committed txids read again: their batches merged into one -- what a correction and its preview,
a round of the shadow audit, an audit from the verified-through mark and a state build's chunk
read. Corrections and replays read nothing of the source: only the txids that did are merged."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import psycopg2.extensions

from ..model import FileBatch, LogBatch, PlannedBatch, Range, TopicBatch
from ..store import corrections as cq

__all__ = ["committed_range", "merged_batch"]


def merged_batch(batches: Sequence[PlannedBatch]) -> PlannedBatch:
    """One batch reading every record of ``batches`` (consecutive, of one source), without what
    retention had removed from them (those records were never counted)."""
    first = batches[0]
    if isinstance(first, FileBatch):
        return FileBatch(directory=first.directory, format=first.format,
                         files=tuple(f for b in batches for f in getattr(b, "files", ())))
    if isinstance(first, (LogBatch, TopicBatch)):
        ranges: list[Range] = []
        for r in sorted((r for b in batches for r in getattr(b, "ranges", ())), key=lambda r: (r.partition, r.start)):
            if ranges and ranges[-1].partition == r.partition and ranges[-1].end == r.start:
                ranges[-1] = Range(r.partition, ranges[-1].start, r.end)  # contiguous: one range
            else:
                ranges.append(r)
        return replace(first, ranges=tuple(ranges), lost=None)
    return PlannedBatch()


def committed_range(cur: psycopg2.extensions.cursor, schema: str, topology_id: str, first: int,
                    last: int) -> tuple[PlannedBatch, int] | None:
    """The batches of committed txids first..last merged, and the records they planned (None: the
    range holds only corrections and replays)."""
    originals = [t for t in cq.committed_txns(cur, schema, topology_id, first, last) if not t.corrects]
    if not originals:
        return None
    return merged_batch([t.batch for t in originals]), sum(t.planned_records for t in originals)
