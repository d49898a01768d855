"""The data model of the transaction core: what a transaction, an attempt, a commit and a
topology's status are. Plain frozen dataclasses, no I/O (a transaction is the row of its table,
:class:`store.transactions.Transaction`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..sources.base import Offsets
from ..store.transactions import Transaction

__all__ = ["QUARANTINE_RECORD_CHARS", "Attempt", "CommitResult", "InFlight", "RecoverResult", "TopologyStatus",
           "Transaction", "same_offsets"]

#: How much of a bad record's raw text the quarantine keeps (its full length is kept beside it).
QUARANTINE_RECORD_CHARS = 4096


@dataclass(frozen=True)
class Attempt:
    """One processing attempt of a transaction."""

    topology_id: str
    txid: int
    attempt: int
    plan_version: int


@dataclass(frozen=True)
class CommitResult:
    topology_id: str
    txid: int
    committed: bool  # False: the txid was committed before; nothing was done
    attempt: int | None
    committed_at: datetime | None
    message: str


@dataclass(frozen=True)
class InFlight:
    txid: int
    run_key: str
    phase: str  # planned | processing | processed | failed
    plan_version: int
    attempts: int
    error: str | None = None
    failed_tries: int = 0  # tries of its process task that failed (attempts registered or not)
    since: datetime | None = None  # when its phase began (planned, attempt started or ended, try failed)


@dataclass(frozen=True)
class TopologyStatus:
    topology_id: str
    committed_txid: int
    committed_offsets: Offsets
    last_commit_at: datetime | None
    in_flight: list[InFlight]
    lag: int
    blocked_by: str | None
    quarantined: int
    quarantined_pending: int
    lost_records: int
    lag_seconds: float | None = None  # the oldest waiting record's age; None: the source cannot tell
    source_error: str | None = None  # why the source could not say its lag now (a Kafka cluster out of reach)
    stalled: bool = False  # no commit for the declared stall_after while the source holds records
    lag_unit: str = "records"  # what ``lag`` counts: records, files (a landing directory), offsets (Kafka)
    offsets_skipped: int = 0  # committed Kafka offsets that held no committed record (aborted, markers)

    def to_dict(self) -> dict[str, Any]:
        return {
            "topology_id": self.topology_id,
            "committed_txid": self.committed_txid,
            "committed_offsets": self.committed_offsets,
            "last_commit_at": self.last_commit_at.isoformat() if self.last_commit_at else None,
            "in_flight": [{**vars(f), "since": f.since.isoformat() if f.since else None} for f in self.in_flight],
            "lag": self.lag,
            "blocked_by": self.blocked_by,
            "quarantined": self.quarantined,
            "quarantined_pending": self.quarantined_pending,
            "lost_records": self.lost_records,
            "lag_seconds": self.lag_seconds,
            "source_error": self.source_error,
            "stalled": self.stalled,
            "lag_unit": self.lag_unit,
            "offsets_skipped": self.offsets_skipped,
        }


@dataclass
class RecoverResult:
    staged_rows_deleted: int = 0
    attempts_discarded: int = 0
    quarantine_rows_deleted: int = 0
    details: list[str] = field(default_factory=list)


def same_offsets(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Offsets are equal when every position is; a missing position counts as 0."""
    return all(int(a.get(k, 0)) == int(b.get(k, 0)) for k in set(a) | set(b))


def offsets_moved(start: Mapping[str, Any], end: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(where, from, to) of each offset a batch moved, partitions in number order (a landing
    directory's single ``seq`` after them): what a person reads as a batch's span."""
    def order(key: str) -> tuple[int, str]:
        return (int(key), "") if str(key).isdigit() else (1 << 62, str(key))

    return [(k, start.get(k, "-"), end.get(k, "-")) for k in sorted(set(start) | set(end), key=order)
            if start.get(k) != end.get(k)]


def span_text(start: Mapping[str, Any], end: Mapping[str, Any]) -> str:
    """A batch's offsets as text: ``partition 0: 10 -> 25, partition 3: 4 -> 9`` (``seq: 3 -> 5``)."""
    return ", ".join(f"{'partition ' if str(k).isdigit() else ''}{k}: {a} -> {b}"
                     for k, a, b in offsets_moved(start, end)) or "nothing new"
