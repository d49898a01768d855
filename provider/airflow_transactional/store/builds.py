"""A state build's chunks (``core/building.py``): which txids each folds, how many records they
planned, when it started and was done -- one small table per topology being built."""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

from psycopg2 import sql

from .rows import Cursor, every
from .statements import query


class Chunk(NamedTuple):
    """Txids ``first_txid``..``last_txid`` of a build's history (0..0: the committed replays' records)."""

    first_txid: int
    last_txid: int
    records: int
    started_at: datetime | None = None
    done_at: datetime | None = None


def table(schema: str, topology_num: int) -> sql.Composed:
    return sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(f"bchunks_{topology_num}"))


def create(cur: Cursor, chunks: sql.Composed) -> None:
    cur.execute(query("build_chunks_create", table=chunks))


def add(cur: Cursor, chunks: sql.Composed, planned: list[Chunk]) -> None:
    for c in planned:
        cur.execute(query("build_chunks_add", table=chunks),
                    {"first": c.first_txid, "last": c.last_txid, "records": c.records})


def read(cur: Cursor, chunks: sql.Composed) -> list[Chunk]:
    cur.execute(query("build_chunks_read", table=chunks))
    return every(cur, Chunk)


def started(cur: Cursor, chunks: sql.Composed, last_txid: int) -> None:
    cur.execute(query("build_chunk_started", table=chunks), {"last": last_txid})


def done(cur: Cursor, chunks: sql.Composed, last_txid: int) -> None:
    cur.execute(query("build_chunk_done", table=chunks), {"last": last_txid})


def planned_records(cur: Cursor, schema: str, topology_id: str, through_txid: int) -> list[tuple[int, int]]:
    """(txid, records it planned from the source) of each committed txid 1..``through_txid``."""
    cur.execute(query("build_planned_records", schema), {"topology": topology_id, "through": through_txid})
    return [(int(t), int(n)) for t, n in cur.fetchall()]
