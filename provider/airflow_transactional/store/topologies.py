"""The ``topologies`` table: one row per topology -- its declaration, its checkpoint (committed
txid and offsets), and the mark of a running rebuild. Its row lock serialises a topology's plans
and commits."""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

from psycopg2 import sql
from psycopg2.extras import Json

from ..model import Offsets
from . import notices
from .rows import Cursor, one, only, scalar
from .statements import query

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
    offsets_skipped: int


class RebuildMark(NamedTuple):
    """Where a running rebuild -- or a state build (``core/evolution.py``), its id starting with
    :data:`BUILD_MARK` -- started, and its id."""

    rebuild_from_txid: int | None
    rebuild_id: str | None

    @property
    def state_build(self) -> bool:
        return (self.rebuild_id or "").startswith(BUILD_MARK)


#: A state build's mark's id starts so; a rebuild's is a bare id.
BUILD_MARK = "build:"


def get(cur: Cursor, schema: str, topology_id: str, *, lock: bool = False) -> TopologyRow | None:
    """The topology's row (``lock``: its row lock)."""
    cur.execute(query("topology_get", schema, lock=FOR_UPDATE[lock]), {"topology": topology_id})
    return one(cur, TopologyRow)


def for_registration(cur: Cursor, schema: str, topology_id: str) -> Registered | None:
    """The registered declaration and progress, row locked; None when new."""
    cur.execute(query("topology_for_registration", schema), {"topology": topology_id})
    return one(cur, Registered)


def upsert(cur: Cursor, schema: str, topology_id: str, config: dict[str, Any]) -> int:
    """Record the declaration; returns the topology's number (names its staging tables)."""
    cur.execute(query("topology_upsert", schema), {"topology": topology_id, "spec": Json(config)})
    return int(scalar(cur))


def numbered(cur: Cursor, schema: str) -> list[tuple[int, dict[str, Any]]]:
    """(number, declaration) of every registered topology, by topology id."""
    cur.execute(query("topology_numbered", schema))
    return [(int(num), dict(config)) for num, config in cur.fetchall()]


def specs(cur: Cursor, schema: str) -> list[dict[str, Any]]:
    """Every registered declaration, by topology id."""
    cur.execute(query("topology_specs", schema))
    return [dict(config) for (config,) in cur.fetchall()]


def delete(cur: Cursor, schema: str, topology_id: str) -> None:
    """Forget the topology; its transactions, attempts and commits go with it (ON DELETE CASCADE)."""
    cur.execute(query("topology_delete", schema), {"topology": topology_id})


def advance(cur: Cursor, schema: str, topology_id: str, txid: int, offsets: Offsets, at: datetime,
            lost_records: int, offsets_skipped: int = 0) -> None:
    """Move the checkpoint to ``txid`` ending at ``offsets``; add what its batch lost to retention
    and the offsets it skipped (a Kafka batch's offsets that held no committed record)."""
    cur.execute(query("topology_advance", schema), {"topology": topology_id, "txid": txid, "offsets": Json(offsets),
                                                    "at": at, "lost": lost_records, "skipped": offsets_skipped})
    notices.send(cur, schema, topology_id, txid, "committed")


def progress(cur: Cursor, schema: str, topology_id: str) -> Progress:
    cur.execute(query("topology_progress", schema), {"topology": topology_id})
    return only(cur, Progress)


def committed_txid_shared(cur: Cursor, schema: str, topology_id: str) -> int:
    """The committed txid, holding commits off (FOR SHARE) until this transaction ends."""
    cur.execute(query("topology_committed_shared", schema), {"topology": topology_id})
    return int(scalar(cur))


def rebuild_mark(cur: Cursor, schema: str, topology_id: str) -> RebuildMark:
    """Where a running rebuild started, and its id (both None when none runs)."""
    cur.execute(query("topology_rebuild_mark", schema), {"topology": topology_id})
    return only(cur, RebuildMark)


def set_rebuild_mark(cur: Cursor, schema: str, topology_id: str, mark: RebuildMark) -> None:
    cur.execute(query("topology_set_rebuild_mark", schema),
                {"topology": topology_id, "from_txid": mark.rebuild_from_txid, "rebuild_id": mark.rebuild_id})


def readers_of_log(cur: Cursor, schema: str, log: str, partition: int, kind: str) -> list[tuple[str, int]]:
    """(topology, LSN committed through in ``partition``) of the topologies of this store reading ``log``."""
    cur.execute(query("topology_readers_of_log", schema), {"partition": str(partition), "kind": kind, "log": log,
                                                           "schema": schema})
    return [(str(t), int(c)) for t, c in cur.fetchall()]


def planned_in_log(cur: Cursor, schema: str, log: str, partition: int, kind: str) -> list[tuple[str, int]]:
    """(topology, LSN planned through in ``partition``, committed or not) of the topologies of this
    store reading ``log`` that planned any transaction."""
    cur.execute(query("topology_planned_in_log", schema), {"partition": str(partition), "kind": kind, "log": log,
                                                           "schema": schema})
    return [(str(t), int(c)) for t, c in cur.fetchall()]
