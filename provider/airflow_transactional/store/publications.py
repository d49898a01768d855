"""The ``publications`` table: how far each output published to Kafka is."""

from __future__ import annotations

from typing import NamedTuple

from psycopg2.extras import Json

from ..model import Offsets
from .rows import Cursor, one, scalar
from .statements import query


class Published(NamedTuple):
    published_txid: int
    topic_offsets: Offsets


def get(cur: Cursor, schema: str, topology_id: str, output: str) -> Published:
    cur.execute(query("publication_get", schema), {"topology": topology_id, "output": output})
    return one(cur, Published) or Published(0, {})


def record(cur: Cursor, schema: str, topology_id: str, output: str, topic: str, txid: int,
           offsets: Offsets) -> None:
    cur.execute(query("publication_record", schema), {"topology": topology_id, "output": output, "topic": topic,
                                                      "txid": txid, "offsets": Json(dict(offsets))})


def unpublished_in_log(cur: Cursor, schema: str, log: str, partition: int) -> list[tuple[str, str, int]]:
    """(topology, output, LSN published through) of the outputs published to Kafka whose events in
    ``partition`` of ``log`` are not all published yet."""
    cur.execute(query("publication_unpublished_in_log", schema), {"log": log, "p": partition})
    return [(str(t), str(o), int(lsn)) for t, o, lsn in cur.fetchall()]


def appended_count(cur: Cursor, schema: str, topology_id: str, txid: int, output: str) -> int:
    """How many events the commit of ``txid`` appended to ``output``."""
    cur.execute(query("publication_range_size", schema), {"topology": topology_id, "txid": txid, "output": output})
    return int(scalar(cur) or 0)
