"""The ``landing_files`` table: every version of every file a landing directory's topology has
seen, numbered in the order it was found (its source is :mod:`..sources.landing`)."""

from __future__ import annotations

from typing import NamedTuple

from .rows import Cursor, every, scalar
from .statements import query


class FileRow(NamedTuple):
    seq: int
    path: str
    size: int
    mtime_ns: int | None
    inode: int | None
    sha256: str | None
    plain: bool | None = None  # every line within the record limit, no surrogate escaped (None: not known)
    version: str | None = None  # an S3 object's ETag, an HDFS file's id (None: a local file)


def latest_versions(cur: Cursor, schema: str, topology_id: str) -> list[FileRow]:
    """The latest version of each path."""
    cur.execute(query("landing_latest_versions", schema), {"topology": topology_id})
    return every(cur, FileRow)


def last_seq(cur: Cursor, schema: str, topology_id: str) -> int:
    cur.execute(query("landing_last_seq", schema), {"topology": topology_id})
    return int(scalar(cur))


def latest(cur: Cursor, schema: str, topology_id: str, path: str) -> FileRow | None:
    """The latest version registered under ``path`` (None: none)."""
    cur.execute(query("landing_latest", schema), {"topology": topology_id, "path": path})
    row = cur.fetchone()
    return None if row is None else FileRow(*row)


def _params(topology_id: str, f: FileRow) -> dict[str, object]:
    return {"topology": topology_id, **f._asdict(), "mtime": (f.mtime_ns or 0) / 1e9}


def insert(cur: Cursor, schema: str, topology_id: str, f: FileRow) -> None:
    cur.execute(query("landing_insert", schema), _params(topology_id, f))


def update(cur: Cursor, schema: str, topology_id: str, f: FileRow) -> None:
    """Make version ``f.seq`` hold what ``f`` says (a touched file, or one rewritten before any plan took it)."""
    cur.execute(query("landing_update", schema), _params(topology_id, f))


def after(cur: Cursor, schema: str, topology_id: str, seq: int) -> list[FileRow]:
    """The versions past ``seq``, in order."""
    cur.execute(query("landing_after", schema), {"topology": topology_id, "seq": seq})
    return every(cur, FileRow)


def through(cur: Cursor, schema: str, topology_id: str, seq: int) -> list[FileRow]:
    """The versions up to ``seq``, in order."""
    cur.execute(query("landing_through", schema), {"topology": topology_id, "seq": seq})
    return every(cur, FileRow)
