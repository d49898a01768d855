"""The ``topologies`` table: one row per topology -- its declaration, its checkpoint (committed
txid and offsets), and the mark of a running rebuild. Its row lock serialises a topology's plans
and commits."""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

from psycopg2 import sql
from psycopg2.extras import Json

from ..sources.base import Offsets
from . import notices
from .rows import Cursor, one, only, scalar, table

FOR_UPDATE = {True: sql.SQL(" FOR UPDATE"), False: sql.SQL("")}


class TopologyRow(NamedTuple):
    num: int
    spec: dict[str, Any]
    committed_txid: int
    committed_offsets: Offsets


class Registered(NamedTuple):
    """A registered topology as a new registration of it sees it."""

    num: int
    spec: dict[str, Any]
    committed_txid: int
    planned: bool  # planned at least once: its offsets mean something


class Progress(NamedTuple):
    last_commit_at: datetime | None
    lost_records: int


class RebuildMark(NamedTuple):
    rebuild_from_txid: int | None
    rebuild_id: str | None


def get(cur: Cursor, schema: str, topology_id: str, *, lock: bool = False) -> TopologyRow | None:
    """The topology's row (``lock``: its row lock)."""
    cur.execute(sql.SQL("SELECT num, spec, committed_txid, committed_offsets FROM {} WHERE topology_id = %s{}")
                .format(table(schema, "topologies"), FOR_UPDATE[lock]), (topology_id,))
    return one(cur, TopologyRow)


def for_registration(cur: Cursor, schema: str, topology_id: str) -> Registered | None:
    """The registered declaration and progress, row locked; None when new."""
    cur.execute(sql.SQL("SELECT num, spec, committed_txid, EXISTS (SELECT 1 FROM {} t WHERE t.topology_id = %s) "
                        "AS planned FROM {} WHERE topology_id = %s FOR UPDATE")
                .format(table(schema, "transactions"), table(schema, "topologies")), (topology_id, topology_id))
    return one(cur, Registered)


def upsert(cur: Cursor, schema: str, topology_id: str, config: dict[str, Any]) -> int:
    """Record the declaration; returns the topology's number (names its staging tables)."""
    cur.execute(sql.SQL("INSERT INTO {} (topology_id, spec) VALUES (%s, %s) ON CONFLICT (topology_id) "
                        "DO UPDATE SET spec = EXCLUDED.spec, updated_at = now() RETURNING num")
                .format(table(schema, "topologies")), (topology_id, Json(config)))
    return int(scalar(cur))


def numbered(cur: Cursor, schema: str) -> list[tuple[int, dict[str, Any]]]:
    """(number, declaration) of every registered topology, by topology id."""
    cur.execute(sql.SQL("SELECT num, spec FROM {} ORDER BY topology_id").format(table(schema, "topologies")))
    return [(int(num), dict(config)) for num, config in cur.fetchall()]


def specs(cur: Cursor, schema: str) -> list[dict[str, Any]]:
    """Every registered declaration, by topology id."""
    cur.execute(sql.SQL("SELECT spec FROM {} ORDER BY topology_id").format(table(schema, "topologies")))
    return [dict(config) for (config,) in cur.fetchall()]


def delete(cur: Cursor, schema: str, topology_id: str) -> None:
    """Forget the topology; its transactions, attempts and commits go with it (ON DELETE CASCADE)."""
    cur.execute(sql.SQL("DELETE FROM {} WHERE topology_id = %s").format(table(schema, "topologies")),
                (topology_id,))


def advance(cur: Cursor, schema: str, topology_id: str, txid: int, offsets: Offsets, at: datetime,
            lost_records: int) -> None:
    """Move the checkpoint to ``txid`` ending at ``offsets``."""
    cur.execute(sql.SQL("UPDATE {} SET committed_txid = %s, committed_offsets = %s, last_commit_at = %s, "
                        "lost_records = lost_records + %s WHERE topology_id = %s")
                .format(table(schema, "topologies")), (txid, Json(offsets), at, lost_records, topology_id))
    notices.send(cur, schema, topology_id, txid, "committed")


def progress(cur: Cursor, schema: str, topology_id: str) -> Progress:
    cur.execute(sql.SQL("SELECT last_commit_at, lost_records FROM {} WHERE topology_id = %s")
                .format(table(schema, "topologies")), (topology_id,))
    return only(cur, Progress)


def committed_txid_shared(cur: Cursor, schema: str, topology_id: str) -> int:
    """The committed txid, holding commits off (FOR SHARE) until this transaction ends."""
    cur.execute(sql.SQL("SELECT committed_txid FROM {} WHERE topology_id = %s FOR SHARE")
                .format(table(schema, "topologies")), (topology_id,))
    return int(scalar(cur))


def rebuild_mark(cur: Cursor, schema: str, topology_id: str) -> RebuildMark:
    """Where a running rebuild started, and its id (both None when none runs)."""
    cur.execute(sql.SQL("SELECT rebuild_from_txid, rebuild_id FROM {} WHERE topology_id = %s")
                .format(table(schema, "topologies")), (topology_id,))
    return only(cur, RebuildMark)


def set_rebuild_mark(cur: Cursor, schema: str, topology_id: str, mark: RebuildMark) -> None:
    cur.execute(sql.SQL("UPDATE {} SET rebuild_from_txid = %s, rebuild_id = %s WHERE topology_id = %s")
                .format(table(schema, "topologies")), (*mark, topology_id))

