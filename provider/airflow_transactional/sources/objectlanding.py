"""A landing directory on S3 (``s3a://bucket/prefix``) or HDFS (``hdfs://namenode:port/path``).

It plans like a local landing directory (:mod:`.landing`): files are numbered in the order the
planner first sees them, a batch is a range of those numbers, and a file replaced under its name
after it was planned is a new version with a number of its own. What differs is how a file is
known: by the version its store gives it (:mod:`.objects`: an S3 object's ETag, an HDFS file's id,
length and modification time), listed and looked up through the store's API with the settings of
the connection ``conn_id`` (an ``aws`` connection for S3, a ``webhdfs`` one for HDFS), and read --
by the pure-Python processor here, by Spark's executors with s3a or HDFS's client -- as exactly the
pinned version or not at all.

A store that keeps versions (an S3 bucket with versioning enabled) lists every version a name ever
held: each is a file of its own, numbered in upload order -- a version overwritten before any plan
ran is counted too, and a replay reads each planned version by its id, whatever the name holds now.
"""

from __future__ import annotations

import fnmatch
import io
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import psycopg2.extensions

from .. import limits
from ..connections import Connections
from ..exceptions import BatchUnavailable, ConfigError
from ..model import Offsets
from ..store import landing
from . import landed
from .base import BatchPlan, Record
from .landed import LandedFile
from .landing import _IGNORED_SUFFIXES, LandingDirectory
from .objects import ObjectStore, StoredFile, parquet_problem, split_url
from .s3 import S3Store
from .webhdfs import WebHdfsStore

__all__ = ["ObjectLanding", "object_store"]

#: The connection a landing URL uses when the declaration names none (HDFS: none, simple
#: authentication as the process's user, WebHDFS on the NameNode's host, port 9870).
DEFAULT_CONN = {"s3a": "aws_default", "hdfs": None}
#: How a plan finds new files: ``full`` lists the whole directory each time (a plan's cost grows
#: with all its files); ``incremental`` only the names after the last one registered -- for names
#: that arrive in byte order (timestamped ones) -- with a full listing every ``full_listing_seconds``
#: for the stragglers and overwrites (a plan's cost grows with the new files).
LISTINGS = ("full", "incremental")
#: New files a plan reads at once (to know them: their digest, and whether Spark's JSON reader may read them).
SCANS = 8
#: (path, version) of the versions this process handed Spark's reader by name (:meth:`ObjectLanding.by_version`):
#: the check after the read asks the name to hold each still, as on a store without versions.
READ_BY_NAME: set[tuple[str, str]] = set()


def object_store(url: str, settings: Mapping[str, Any], conn_id: str | None = None) -> ObjectStore:
    """The store of a landing URL, with the settings of its connection ``conn_id``."""
    store = S3Store if split_url(url)[0] == "s3a" else WebHdfsStore
    return store(url, settings, conn_id)


class ObjectLanding(LandingDirectory):
    """Batches of files from a prefix of an S3 bucket or an HDFS directory (its files, not its
    sub-directories'), at most ``max_files`` a batch."""

    def __init__(self, path: str, *, format: str = "json", pattern: str = "*", max_files: int = 100,
                 settle_seconds: float = 2.0, conn_id: str | None = None, listing: str = "full",
                 full_listing_seconds: float = 3600.0, max_batch_bytes: int | None = None,
                 connections: Connections | None = None) -> None:
        super().__init__(path, format=format, pattern=pattern, max_files=max_files, settle_seconds=settle_seconds,
                         max_batch_bytes=max_batch_bytes)
        if listing not in LISTINGS:
            raise ConfigError(f"listing must be one of {', '.join(LISTINGS)}, got {listing!r}")
        if not isinstance(full_listing_seconds, (int, float)) or isinstance(full_listing_seconds, bool) \
                or not 0 <= full_listing_seconds <= 7 * 86_400:
            raise ConfigError(f"full_listing_seconds must be a number of seconds from 0 to 604800 (a week), got "
                              f"{full_listing_seconds!r}")
        self.listing, self.full_listing_seconds = listing, full_listing_seconds
        scheme = split_url(path)[0]
        self.path = path.rstrip("/")
        conn_id = DEFAULT_CONN[scheme] if conn_id is None else conn_id
        if conn_id is not None and (not isinstance(conn_id, str) or not conn_id.strip() or len(conn_id) > 250):
            raise ConfigError(f"conn_id must name an Airflow connection, got {conn_id!r}")
        self.conn_id = conn_id
        #: Where the connection's settings come from (not part of the declaration).
        self.connections = connections or Connections()
        self._store: ObjectStore | None = None
        self._fresh: dict[str, LandedFile] | None = None  # the listing of the plan under way
        self._listed: set[tuple[str, str | None]] = set()  # its versions, where the store keeps them
        self._after: str | None = None  # what that listing starts after (None: the whole directory)

    @staticmethod
    def _check_path(path: str) -> None:
        split_url(path)

    def with_connections(self, connections: Connections) -> ObjectLanding:
        cfg = self.to_config()
        cfg.pop("kind")
        return ObjectLanding(**cfg, connections=connections)

    def to_config(self) -> dict[str, Any]:
        config = {**super().to_config(), "conn_id": self.conn_id}
        if self.listing != "full":  # a declaration that does not say it keeps its stored form
            config.update(listing=self.listing, full_listing_seconds=self.full_listing_seconds)
        return config

    @property
    def store(self) -> ObjectStore:
        if self._store is None:
            settings = self.connections.settings(self.conn_id) if self.conn_id else {}
            self._store = object_store(self.path, settings, self.conn_id)
        return self._store

    def connection_settings(self) -> dict[str, dict[str, Any]]:
        return {self.conn_id: self.connections.settings(self.conn_id)} if self.conn_id else {}

    def spark_connectors(self) -> tuple[str, ...]:
        return ("s3a",) if self.path.startswith("s3a://") else ()  # HDFS: Spark's own client

    def dataset(self, database: str, store_schema: str) -> tuple[str, str]:
        """OpenLineage names an S3 store ``s3://bucket`` and HDFS ``hdfs://namenode:port``."""
        scheme, _, rest = self.path.partition("://")
        authority, _, path = rest.partition("/")
        return (f"s3://{authority}", path or "/") if scheme == "s3a" else (f"hdfs://{authority}", f"/{path}")

    def spark_options(self) -> dict[str, str]:
        """Hadoop settings Spark's reader takes for this store (secrets among them)."""
        return self.store.spark_options()

    def way_back(self) -> str:
        if self.keeps_versions:
            return "a version deleted from the bucket's history cannot be restored"
        if self.path.startswith("s3a://"):
            return ("upload the planned bytes again under its name (the bucket keeps no versions: one with "
                    "versioning enabled keeps every planned version readable)")
        return "HDFS keeps no versions: a file's planned content cannot be restored"

    @property
    def keeps_versions(self) -> bool:
        return self.store.keeps_versions()

    def by_version(self, files: Sequence[Mapping[str, Any]]) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
        """The planned files Spark's reader may read by name (the name holds the planned version now:
        checked again after the read), and those read here by their version's id (a store that keeps
        versions: the name holds a later one)."""
        if not self.keeps_versions:
            return list(files), []
        by_name, by_id = [], []
        for f in files:
            now = self.store.stat(str(f["path"]))
            if now is not None and now.version == f.get("version"):
                READ_BY_NAME.add((now.path, now.version))
                by_name.append(f)
            else:
                by_id.append(f)
        return by_name, by_id

    def version_lines(self, f: Mapping[str, Any]) -> Iterator[str]:
        """The lines of the planned version of ``f``, read by its id."""
        raw = _Blocks(self.store.blocks(_stored(LandedFile.from_plan(f))))
        for line in landed.text_lines(raw, limits.MAX_RECORD_BYTES):
            if line.strip():
                yield line.rstrip("\n")

    def _listing(self, *, settled_only: bool = True) -> list[LandedFile]:
        newest = time.time_ns() - int(self.settle_seconds * 1e9)
        out = []
        for f in self.store.listing(self._after):
            name = f.path.rsplit("/", 1)[1]
            hidden = name.startswith((".", "_")) or name.endswith(_IGNORED_SUFFIXES)
            if hidden or not fnmatch.fnmatch(name, self.pattern):
                continue
            if not settled_only or f.mtime_ns <= newest:
                out.append(_landed(f))
        if self.keeps_versions:  # no name's latest here: a listing shows every version a name held
            self._listed.update((f.path, f.version) for f in out)
        elif self._fresh is not None:
            self._fresh.update((f.path, f) for f in out)
        return sorted(out, key=lambda f: (f.mtime_ns or 0, f.path))

    def plan(self, cur: psycopg2.extensions.cursor, schema: str, topology_id: str, start: Offsets,
             max_records: int, *, skip_unavailable: bool, until: Offsets | None = None) -> BatchPlan:
        self._fresh = {}  # one listing tells this plan what each name holds: no look-up per planned file
        full = self.listing == "full" or landing.full_listing_due(cur, schema, topology_id, self.full_listing_seconds)
        self._after = None if full else landing.last_path(cur, schema, topology_id)
        try:
            plan = super().plan(cur, schema, topology_id, start, max_records, skip_unavailable=skip_unavailable,
                                until=until)
        finally:
            self._fresh, self._after = None, None
            self._listed.clear()
        if full and self.listing != "full":
            landing.listed_fully(cur, schema, topology_id)
        return plan

    def _latest(self, cur: psycopg2.extensions.cursor, s: str, topology_id: str,
                listed: list[LandedFile]) -> list[landing.FileRow]:
        return landing.latest_of(cur, s, topology_id, [f.path for f in listed])

    def _unregistered(self, cur: psycopg2.extensions.cursor, s: str, topology_id: str,
                      listed: list[LandedFile]) -> tuple[dict[str, LandedFile], list[LandedFile]]:
        """Where the store keeps versions, every listed version no entry holds: each is a file of its
        own (no entry follows a later version, none is replaced by one)."""
        if not self.keeps_versions:
            return super()._unregistered(cur, s, topology_id, listed)
        known = landing.registered(cur, s, topology_id, sorted({f.path for f in listed}))
        return {}, [f for f in listed if (f.path, f.version) not in known]

    def lag(self, cur: psycopg2.extensions.cursor, schema: str, topology_id: str, committed: Offsets) -> int:
        """Files registered past the committed ones and still current (each version, where the store
        keeps them), and files the store holds that no plan registered yet (an incremental listing
        looks only after the last name registered)."""
        return self.waiting(cur, schema, topology_id, committed)[0]

    def waiting(self, cur: psycopg2.extensions.cursor, schema: str, topology_id: str,
                committed: Offsets) -> tuple[int, int | None]:
        """(files, bytes) waiting: see :meth:`lag`."""
        files, size = landing.waiting(cur, schema, topology_id, int(committed.get("seq", 0)),
                                      every_version=self.keeps_versions)
        after = landing.last_path(cur, schema, topology_id) if self.listing == "incremental" else None
        self._after = after
        try:
            listed = self._listing(settled_only=False)
        finally:
            self._after = None
            self._listed.clear()
        new = self._unregistered(cur, schema, topology_id, listed)[1]
        return files + len(new), size + sum(f.size for f in new)

    def _identify_all(self, listed: list[LandedFile]) -> list[LandedFile | None]:
        if len(listed) < 2:
            return [self._identify(f) for f in listed]
        with ThreadPoolExecutor(min(SCANS, len(listed))) as pool:  # reads of many small files overlap
            return list(pool.map(self._identify, listed))

    def _identify(self, listed: LandedFile) -> LandedFile | None:
        """The listed version, read once through (JSON files up to
        :data:`~airflow_transactional.limits.SCAN_MAX_BYTES`): its digest, and whether Spark's JSON
        reader may read it as it is (:class:`.landed.Scan`, as for a local file) -- else it is read as
        text and judged line by line. None when the name holds another version by now."""
        if self.format != "json" or not listed.size:
            return replace(listed, plain=self.format == "json")
        if listed.size > limits.SCAN_MAX_BYTES:
            return listed  # plain None: read as text, each line judged
        try:
            scan = landed.scan_blocks(self.store.blocks(_stored(listed)), limits.MAX_RECORD_BYTES)
        except BatchUnavailable:
            return None  # replaced or gone since the listing: the next plan sees what it holds
        return replace(listed, sha256=scan.sha256, plain=scan.plain)

    def _same_content(self, old: LandedFile, new: LandedFile) -> bool:
        return old.version is not None and self.store.same_content(_stored(old), _stored(new))

    def _matches(self, known: LandedFile, listed: LandedFile) -> bool:
        return self._same_content(known, listed)

    def _now(self, path: str) -> LandedFile | None:
        if self._fresh is not None and path in self._fresh:
            return self._fresh[path]
        found = self.store.stat(path)
        return None if found is None else _landed(found)

    def _changed(self, f: LandedFile, *, deep: bool = False) -> bool:
        """Whether the planned version ``f`` can no longer be read as planned: its name holds another
        -- or, where the store keeps versions, the version is gone from its history (unless Spark's
        reader read it by name in this process)."""
        if self.keeps_versions and (f.path, f.version) not in READ_BY_NAME:
            return (f.path, f.version) not in self._listed and not self.store.kept(_stored(f))
        now = self._now(f.path)
        return now is None or not self._same_content(f, now)

    def _register_rewritten(self, cur: psycopg2.extensions.cursor, s: str, topology_id: str,
                            gone: LandedFile) -> None:
        if not self.keeps_versions:  # where it does, the listing registers each version
            super()._register_rewritten(cur, s, topology_id, gone)

    def _lines(self, f: Mapping[str, Any]) -> Iterator[Record]:
        planned = _stored(LandedFile.from_plan(f))
        raw = _Blocks(self.store.blocks(planned))
        for n, line in enumerate(landed.text_lines(raw, limits.MAX_RECORD_BYTES), start=1):
            if line.strip():
                yield Record(f"{f['seq']}:{n}", None, line.rstrip("\n"))

    def unreadable_files(self, files: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
        """(path, why) of the planned Parquet files whose footer does not read (each from three
        ranged reads of its planned version): quarantined by name, as a local one is."""
        if self.format != "parquet":
            return []
        found = ((f["path"], parquet_problem(self.store, _stored(LandedFile.from_plan(f)))) for f in files)
        return [(path, why) for path, why in found if why is not None]


def _landed(f: StoredFile) -> LandedFile:
    return LandedFile(f.path, f.size, f.mtime_ns, None, version=f.version)


def _stored(f: LandedFile) -> StoredFile:
    return StoredFile(f.path, f.size, str(f.version), int(f.mtime_ns or 0))


class _Blocks(io.RawIOBase):
    """An iterator of byte blocks as a raw stream."""

    def __init__(self, blocks: Iterator[bytes]) -> None:
        self.blocks, self.pending = blocks, b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self.pending:
            block = next(self.blocks, None)
            if block is None:
                return 0
            self.pending = block
        n = min(len(buffer), len(self.pending))
        buffer[:n] = self.pending[:n]
        self.pending = self.pending[n:]
        return n


LandingDirectory.on_a_store = ObjectLanding
