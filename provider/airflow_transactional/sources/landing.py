"""A landing directory of files (JSON lines, Parquet, CSV) as a source.

Arrival order is the order in which the planner first *sees* a file: at each plan, files not
yet registered are given the next sequence numbers (by modification time, then name). A file
that lands late, with an old mtime, is simply registered later: it is never skipped. A batch is
the files with sequence numbers in ``(start, end]``, recorded in the plan with their sizes.
Writers must move complete files into the directory (write elsewhere or under a hidden name,
then rename): names starting with ``.`` or ``_`` and ``*.tmp`` / ``*.inprogress`` are ignored.
"""

from __future__ import annotations

import fnmatch
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import psycopg2.extensions
from psycopg2 import sql

from ..exceptions import BatchUnavailable, ConfigError
from .base import BatchPlan, Offsets, Record, Source

FORMATS = ("json", "parquet", "csv")
_IGNORED_SUFFIXES = (".tmp", ".inprogress", ".crc", ".partial")


class LandingDirectory(Source):
    """Batches of files from one directory, at most ``max_files`` files per batch."""

    kind: ClassVar[str] = "landing"

    def __init__(self, path: str, *, format: str = "json", pattern: str = "*",
                 max_files: int = 100) -> None:
        if not isinstance(path, str) or not os.path.isabs(path):
            raise ConfigError(f"landing directory must be an absolute path, got {path!r}")
        if format not in FORMATS:
            raise ConfigError(f"landing format {format!r} is not supported: use one of {', '.join(FORMATS)}")
        if not isinstance(max_files, int) or max_files < 1:
            raise ConfigError(f"max_files must be a positive integer, got {max_files!r}")
        self.path = path
        self.format = format
        self.pattern = pattern
        self.max_files = max_files

    def to_config(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": self.path, "format": self.format,
                "pattern": self.pattern, "max_files": self.max_files}

    def _listing(self) -> list[tuple[float, str, int]]:
        try:
            entries = list(os.scandir(self.path))
        except FileNotFoundError:
            raise ConfigError(f"landing directory {self.path} does not exist: create it or fix the path") from None
        out = []
        for e in entries:
            if e.name.startswith((".", "_")) or e.name.endswith(_IGNORED_SUFFIXES):
                continue
            if not fnmatch.fnmatch(e.name, self.pattern) or not e.is_file():
                continue
            st = e.stat()
            out.append((st.st_mtime, e.path, st.st_size))
        return sorted(out)

    def _register_new(self, cur: psycopg2.extensions.cursor, s: sql.Identifier, topology_id: str) -> None:
        cur.execute(sql.SQL("SELECT path FROM {}.landing_files WHERE topology_id = %s").format(s), (topology_id,))
        known = {r[0] for r in cur.fetchall()}
        new = [f for f in self._listing() if f[1] not in known]
        if not new:
            return
        cur.execute(sql.SQL("SELECT coalesce(max(seq), 0) FROM {}.landing_files WHERE topology_id = %s")
                    .format(s), (topology_id,))
        seq = int(cur.fetchone()[0])
        for mtime, path, size in new:
            seq += 1
            cur.execute(sql.SQL("INSERT INTO {}.landing_files (topology_id, seq, path, size, mtime) "
                                "VALUES (%s, %s, %s, %s, %s)").format(s), (topology_id, seq, path, size, mtime))

    def plan(self, cur: psycopg2.extensions.cursor, schema: str, topology_id: str, start: Offsets,
             max_records: int, *, skip_unavailable: bool, until: Offsets | None = None) -> BatchPlan:
        s = sql.Identifier(schema)
        self._register_new(cur, s, topology_id)
        begin = int(start.get("seq", 0))
        cur.execute(sql.SQL("SELECT seq, path, size FROM {}.landing_files WHERE topology_id = %s "
                            "AND seq > %s ORDER BY seq").format(s), (topology_id, begin))
        files: list[dict[str, Any]] = []
        lost: list[str] = []
        end = begin
        last = int(until["seq"]) if until is not None and "seq" in until else None
        for seq, path, size in cur:
            if len(files) >= self.max_files or (last is not None and seq > last):
                break
            if _changed(path, size):
                if not skip_unavailable:
                    raise BatchUnavailable(
                        f"landing file {path} (seq {seq}) is gone or changed before topology "
                        f"{topology_id!r} committed it; restore it, or declare the topology "
                        "opaque=True to skip what is gone (the loss is recorded)")
                lost.append(path)
                end = int(seq)
                continue
            files.append({"seq": int(seq), "path": path, "size": int(size)})
            end = int(seq)
        return BatchPlan(start={"seq": begin}, end={"seq": end},
                         batch={"directory": self.path, "format": self.format, "files": files},
                         planned_records=len(files), lost_records=len(lost), lost_detail=lost,
                         lost_ranges=list(lost))

    def unavailable(self, cur: psycopg2.extensions.cursor, schema: str, topology_id: str,
                    batch: Mapping[str, Any]) -> str | None:
        gone = [f["path"] for f in batch.get("files", []) if _changed(f["path"], f["size"])]
        return f"landing files gone or changed: {', '.join(gone)}" if gone else None

    def read(self, cur: psycopg2.extensions.cursor, schema: str, topology_id: str,
             batch: Mapping[str, Any]) -> Iterator[Record]:
        if batch.get("format", "json") != "json":
            raise ConfigError("the pure-Python reader handles JSON-lines files; "
                              "Parquet and CSV batches are read by the Spark helper")
        for f in batch.get("files", []):
            with open(f["path"], encoding="utf-8", errors="replace") as fh:
                for n, line in enumerate(fh, start=1):
                    if line.strip():
                        yield Record(f"{f['seq']}:{n}", None, line.rstrip("\n"))

    def committed_batch(self, cur: psycopg2.extensions.cursor, schema: str, topology_id: str,
                        committed: Offsets, lost: list[Any]) -> tuple[dict[str, Any], str | None]:
        cur.execute(sql.SQL("SELECT seq, path, size FROM {}.landing_files WHERE topology_id = %s "
                            "AND seq <= %s ORDER BY seq").format(sql.Identifier(schema)),
                    (topology_id, int(committed.get("seq", 0))))
        skipped = set(lost)
        files = [{"seq": int(seq), "path": path, "size": int(size)} for seq, path, size in cur.fetchall()
                 if path not in skipped]
        gone = [f["path"] for f in files if _changed(f["path"], f["size"])]
        if gone:
            return {}, f"landing files gone or changed since they committed: {', '.join(gone[:5])}"
        return {"directory": self.path, "format": self.format, "files": files}, None

    def lag(self, cur: psycopg2.extensions.cursor, schema: str, topology_id: str, committed: Offsets) -> int:
        cur.execute(sql.SQL("SELECT path FROM {}.landing_files WHERE topology_id = %s AND seq <= %s")
                    .format(sql.Identifier(schema)), (topology_id, int(committed.get("seq", 0))))
        done = {r[0] for r in cur.fetchall()}
        return sum(1 for f in self._listing() if f[1] not in done)


def _changed(path: str, size: int) -> bool:
    try:
        return Path(path).stat().st_size != size
    except FileNotFoundError:
        return True


def write_json_lines(directory: str, name: str, records: Iterable[Mapping[str, Any]]) -> str:
    """Land a file atomically (write a hidden temporary file, then rename): a helper for producers."""
    tmp = os.path.join(directory, f".{name}.tmp")
    final = os.path.join(directory, name)
    with open(tmp, "w", encoding="utf-8") as fh:
        for r in records:
            fh.write(json.dumps(r) + "\n")
    os.replace(tmp, final)
    return final
