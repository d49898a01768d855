"""A transaction (one DAG run), its attempts, a commit's result, a topology's status and the
planned runs: the rows of the store as the layers above read them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from .batches import Offsets, PlannedBatch, planned_batch


@dataclass(frozen=True)
class Transaction:
    """One planned transaction (one DAG run): a row of the ``transactions`` table."""

    topology_id: str
    txid: int
    run_key: str
    plan_version: int
    start_offsets: Offsets
    end_offsets: Offsets
    batch: PlannedBatch
    planned_records: int
    status: str
    planned_at: datetime
    committed_at: datetime | None
    pinned_attempt: int | None
    corrects: Mapping[str, Any] | None = None  # a correction's: the txids it corrects (``core/corrections.py``)

    def __post_init__(self) -> None:
        object.__setattr__(self, "batch", planned_batch(self.batch))  # the store's row holds its JSON

    @property
    def empty(self) -> bool:
        return self.planned_records == 0

    @property
    def committed(self) -> bool:
        return self.status == "committed"


class PlannedRun(NamedTuple):
    txid: int
    run_key: str


#: The attempt number the shadow audit stages a recomputed txid under, beside its committed rows
#: (core/verify.py): never a real attempt's (those count from 1), never history (no commit names it).
VERIFY_ATTEMPT = -1


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


class BuildProgress(NamedTuple):
    """How far a state build's fold is (``core/building.py``): the last txid of the chunks folded
    (0: none yet) of M, the records they planned of all, and the seconds left at the rate of the
    chunks done (None: not known yet)."""

    through_txid: int
    of_txid: int
    records: int
    of_records: int
    eta_seconds: float | None


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
    lag_bytes: int | None = None  # what the waiting files hold (a landing directory on S3 or HDFS)
    quarantine_warning: str | None = None  # the latest txids set aside half their max_quarantined or more
    evolving: str | None = None  # states its DAG file added, declared or being built (core/evolution.py)
    build_progress: BuildProgress | None = None  # how far a state build's fold is

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
            "lag_bytes": self.lag_bytes,
            "quarantine_warning": self.quarantine_warning,
            "evolving": self.evolving,
            "build_progress": self.build_progress._asdict() if self.build_progress else None,
        }


@dataclass
class RecoverResult:
    staged_rows_deleted: int = 0
    attempts_discarded: int = 0
    quarantine_rows_deleted: int = 0
    details: list[str] = field(default_factory=list)
