"""The shared vocabulary: the types and small helpers every layer speaks -- a source's position
(:data:`Offsets`), a transaction (:class:`Transaction`), an attempt, a commit's result, a topology's
status, the planned runs -- and how they read as text. Plain frozen dataclasses and pure functions,
no I/O: the store maps its rows into these types, the core works on them, and the Airflow and Spark
layers read them without reaching into either."""

from __future__ import annotations

from .batches import FileBatch, LogBatch, Offsets, PlannedBatch, Range, ReplayBatch, TopicBatch, planned_batch
from .staging import RETRACTED, RETRACTS_HEADER, OutputStaging, StagedEvent, Staging, event_id, read_digest
from .text import duration, failure_text, offsets_moved, one_line, same_offsets, span_text
from .transactions import (
    VERIFY_ATTEMPT,
    Attempt,
    BuildProgress,
    CommitResult,
    InFlight,
    PlannedRun,
    RecoverResult,
    TopologyStatus,
    Transaction,
)

__all__ = [
    "DEFAULT_SCHEMA",
    "RETRACTED",
    "RETRACTS_HEADER",
    "VERIFY_ATTEMPT",
    "Attempt",
    "BuildProgress",
    "CommitResult",
    "FileBatch",
    "InFlight",
    "LogBatch",
    "Offsets",
    "OutputStaging",
    "PlannedBatch",
    "PlannedRun",
    "Range",
    "RecoverResult",
    "ReplayBatch",
    "StagedEvent",
    "Staging",
    "TopicBatch",
    "TopologyStatus",
    "Transaction",
    "duration",
    "event_id",
    "failure_text",
    "offsets_moved",
    "one_line",
    "planned_batch",
    "read_digest",
    "same_offsets",
    "span_text",
]

#: The provider's schema in the state store when none is named.
DEFAULT_SCHEMA = "airflow_txn"
