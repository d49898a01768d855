"""Wake-ups for waiting tasks: a ``NOTIFY`` sent inside the transaction that commits a txid or
records that one failed for good. Postgres delivers it when (and only if) that transaction
commits, so a listener hears of a change exactly when it can see it."""

from __future__ import annotations

import json
from typing import NamedTuple

from psycopg2 import sql

from .rows import Cursor
from .statements import query

#: The one channel of every state store on a server; a notice names its schema and topology.
CHANNEL = "airflow_transactional"


class Notice(NamedTuple):
    schema: str
    topology_id: str
    txid: int
    event: str  # "committed" | "failed"


def send(cur: Cursor, schema: str, topology_id: str, txid: int, event: str) -> None:
    payload = json.dumps({"schema": schema, "topology": topology_id, "txid": txid, "event": event})
    cur.execute(query("notice_send"), {"channel": CHANNEL, "payload": payload})


def listen(cur: Cursor) -> None:
    cur.execute(query("notice_listen", channel=sql.Identifier(CHANNEL)))


def parse(payload: str) -> Notice | None:
    """The notice a payload carries; None for anything else sent on the channel."""
    try:
        data = json.loads(payload)
        return Notice(str(data["schema"]), str(data["topology"]), int(data["txid"]), str(data["event"]))
    except (ValueError, KeyError, TypeError):
        return None
