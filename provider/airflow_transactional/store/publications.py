"""The ``publications`` table: how far each output published to Kafka is."""

from __future__ import annotations

from typing import NamedTuple

from psycopg2.extras import Json

from .queries import query
from .rows import Cursor, Offsets, one, scalar


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


def try_lock(cur: Cursor, key: str) -> bool:
    cur.execute(query("publication_lock"), {"key": key})
    return bool(scalar(cur))


def unlock(cur: Cursor, key: str) -> None:
    cur.execute(query("publication_unlock"), {"key": key})
