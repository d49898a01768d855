"""Where a processor's rows go (:class:`Staging`, :class:`OutputStaging`), an output event as it
is staged, and the ids an event and an attempt's read carry."""

from __future__ import annotations

from typing import Any, NamedTuple

#: An output event as a processor stages it: output, partition, seq, event id, payload, the
#: verdict it waits for -- (decision, request id, granted) -- or three Nones, and whether it is a
#: retraction (None in a batch that read no correction's events: store/outputs.py).
StagedEvent = tuple[str, int, "int | None", str, str, "str | None", "str | None", "bool | None", "bool | None"]


class OutputStaging(NamedTuple):
    """Where a processor stages output events and requests: the COPY (CSV) of event rows
    (:data:`airflow_transactional.store.outputs.COLUMNS`), each output's partitions now, and the
    COPY (CSV) of each decision's request rows (:func:`airflow_transactional.store.decisions.columns`)."""

    copy: str
    partitions: dict[str, int]
    requests: dict[str, str]


class Staging(NamedTuple):
    """Where a processor's rows go: a ``COPY ... FROM STDIN WITH (FORMAT csv)`` into a staging
    table (or the quarantine), with ``prefix`` as its leading constant columns (topology, txid,
    attempt, ...). No DSN: it travels to the executors, which read theirs from a file. An empty
    ``copy`` is nowhere (an audit counts what it would set aside)."""

    copy: str
    prefix: tuple[Any, ...] = ()


#: The Kafka header of a correction's retraction (its value: the id of the event it takes back).
RETRACTS_HEADER = "airflow-txn-retracts"
#: A retraction's event id: ``<the id of the event it takes back>~retracted@<txid>``.
RETRACTED = "~retracted@"


def event_id(topology_id: str, origin: str) -> str:
    """The log's id of an event a topology emits: its topology, then its origin (deterministic,
    so an event emitted again is known and never appended twice)."""
    return f"{topology_id}:{origin}"


def read_digest(records: int, offset_crcs: int) -> str:
    """Which records an attempt read: how many, and the sum of the CRC-32s of their offsets (the same
    in the Spark helper and the pure-Python processor)."""
    return f"{records}:{offset_crcs}"
