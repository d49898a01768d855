"""The ``publications`` table: how far each output published to Kafka is."""

from __future__ import annotations

from collections.abc import Sequence
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


def record_retractions(cur: Cursor, schema: str, topology_id: str, topic: str, identity: tuple[str, str],
                       txid: int, placed: Sequence[tuple[int, int, str]]) -> None:
    """Record where txid's retractions went in ``topic`` (``identity``: its cluster and topic ids):
    (partition, offset, the event it takes back)."""
    if placed:
        cur.execute(query("publication_retractions_record", schema),
                    {"topic": topic, "cluster": identity[0], "topic_id": identity[1], "topology": topology_id,
                     "txid": txid, "parts": [p for p, _o, _r in placed],
                     "offs": [o for _p, o, _r in placed], "origins": [r for _p, _o, r in placed]})


def retractions_in(cur: Cursor, schema: str, identity: tuple[str, str],
                   ranges: Sequence[tuple[int, int, int]]) -> dict[str, str]:
    """The retractions a publisher of this store put among ``ranges`` ((partition, from, to):
    offsets from through to, exclusive) of the topic of ``identity`` (its cluster and topic ids): by
    offset (``partition:offset``), the event it takes back."""
    cur.execute(query("publication_retractions_in", schema),
                {"cluster": identity[0], "topic_id": identity[1], "parts": [r[0] for r in ranges],
                 "los": [r[1] for r in ranges], "his": [r[2] for r in ranges]})
    return {f"{p}:{o}": str(origin) for p, o, origin in cur.fetchall()}


def unpublished_in_log(cur: Cursor, schema: str, log: str, partition: int) -> list[tuple[str, str, int]]:
    """(topology, output, LSN published through) of the outputs published to Kafka whose events in
    ``partition`` of ``log`` are not all published yet."""
    cur.execute(query("publication_unpublished_in_log", schema), {"log": log, "p": partition})
    return [(str(t), str(o), int(lsn)) for t, o, lsn in cur.fetchall()]


def appended_count(cur: Cursor, schema: str, topology_id: str, txid: int, output: str) -> int:
    """How many events the commit of ``txid`` appended to ``output``."""
    cur.execute(query("publication_range_size", schema), {"topology": topology_id, "txid": txid, "output": output})
    return int(scalar(cur) or 0)
