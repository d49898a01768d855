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


def latest_of(cur: Cursor, schema: str, topology_id: str, paths: list[str]) -> list[FileRow]:
    """The latest version of each of ``paths`` that has one."""
    cur.execute(query("landing_latest_of", schema), {"topology": topology_id, "paths": paths})
    return every(cur, FileRow)


def registered(cur: Cursor, schema: str, topology_id: str, paths: list[str]) -> set[tuple[str, str]]:
    """(path, version) of every version of ``paths`` registered (a store that keeps versions)."""
    cur.execute(query("landing_registered", schema), {"topology": topology_id, "paths": paths})
    return {(str(path), str(version)) for path, version in cur.fetchall()}


def last_path(cur: Cursor, schema: str, topology_id: str) -> str | None:
    """The greatest path registered, in byte order (None: none)."""
    cur.execute(query("landing_last_path", schema), {"topology": topology_id})
    row = cur.fetchone()
    return None if row is None else row[0]


def waiting(cur: Cursor, schema: str, topology_id: str, seq: int, *, every_version: bool = False) -> tuple[int, int]:
    """(files, bytes) registered past ``seq`` that are still the latest version of their path (with
    ``every_version``, all of them: a store that keeps versions reads each)."""
    cur.execute(query("landing_waiting", schema), {"topology": topology_id, "seq": seq, "every": every_version})
    files, size = cur.fetchone() or (0, 0)
    return int(files), int(size)


def full_listing_due(cur: Cursor, schema: str, topology_id: str, seconds: float) -> bool:
    """Whether the topology's last full listing is older than ``seconds`` (or there was none)."""
    cur.execute(query("landing_full_listing_due", schema), {"topology": topology_id, "seconds": seconds})
    return bool(scalar(cur))


def listed_fully(cur: Cursor, schema: str, topology_id: str) -> None:
    cur.execute(query("landing_listed_fully", schema), {"topology": topology_id})
