"""A landing directory of files (JSON lines, Parquet, CSV) as a source.

Arrival order is the order in which the planner first *sees* a file: at each plan, files not
yet registered are given the next sequence numbers (by modification time, then name). A file
that lands late, with an old mtime, is simply registered later: it is never skipped. A batch is
the files with sequence numbers in ``(start, end]``.

A file is known by its content, not its name. Each is registered with its size, modification
time (ns), inode and SHA-256, and checked against them before it is planned, before it is
processed and after: a file whose content changed after it was planned is *unavailable* (a
transactional topology stops and names it; an opaque one re-plans without it), and the content
now under that name is a new version with a sequence number of its own -- replaced files are
never ignored, and never half-counted. Touching a file (same bytes) changes nothing.

Writers should move complete files into the directory (write elsewhere or under a hidden name,
then rename): names starting with ``.`` or ``_`` and ``*.tmp`` / ``*.inprogress`` / ``*.partial``
are ignored. As a second guard a file is planned only once it has not changed for
``settle_seconds`` (default 2). Symbolic links, hard links and files on another device (a mount
inside it) are ignored, with a warning: each could make a file from elsewhere be processed. A file
is opened once for each look, by descriptor and never through a link (:mod:`.landed`): what is
identified and digested is what is read, and the reader checks it is the planned file (inode and
digest) -- a name swapped for another file under the plan fails the attempt instead.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import stat
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, ClassVar

import psycopg2.extensions

from .. import limits
from ..exceptions import BatchUnavailable, ConfigError
from ..model import FileBatch, Offsets, PlannedBatch, planned_batch
from ..store import landing, transactions
from . import landed
from .base import BatchPlan, Record, Source
from .landed import LandedFile

log = logging.getLogger(__name__)

FORMATS = ("json", "parquet", "csv")
_IGNORED_SUFFIXES = (".tmp", ".inprogress", ".crc", ".partial")


def _stat(path: str) -> LandedFile | None:
    """The name's own stat (a link is not followed: a link is not a landed file)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return LandedFile(path, st.st_size, st.st_mtime_ns, st.st_ino)


def _identified(path: str) -> LandedFile | None:
    """The file named ``path`` with its digest, all from one descriptor (None: no such file); a
    file over :data:`~airflow_transactional.limits.SCAN_MAX_BYTES` with its stat alone, unread."""
    found = landed.identify(path, limits.MAX_RECORD_BYTES, limits.SCAN_MAX_BYTES)
    if found is None:
        return None
    ident, scan = found
    if scan is None:
        return LandedFile(path, ident.size, ident.mtime_ns, ident.inode)
    return LandedFile(path, ident.size, ident.mtime_ns, ident.inode, scan.sha256, plain=scan.plain)


def _foreign(path: str, device: int) -> str | None:
    """Why the file at ``path`` may be the content of a file outside the directory (None: it is not).

    A hard link (a second name of a file that may live elsewhere) or a file on another device (a
    mount under the directory) would let whoever may write into the directory have another
    file -- one they may not read -- processed; a writer moves its files in instead."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if st.st_nlink > 1:
        return f"a file with {st.st_nlink} hard links (move files into the directory, do not link them)"
    if st.st_dev != device:
        return "a file on another device than the directory (a mount inside it)"
    return None


def changed(f: LandedFile, *, deep: bool = False) -> bool:
    """Whether the file at ``f.path`` no longer holds the content ``f`` was registered with.

    An unchanged stat (size, mtime, inode) says it does, unless ``deep``: then its digest is
    compared too -- an in-place rewrite of the same size that restores the mtime (``rsync
    --inplace``, ``cp -p``) keeps the stat. Processing checks deep, before and after it reads."""
    now = _stat(f.path)
    if now is None:
        return True
    if f.matches(now) and not (deep and f.sha256 is not None):
        return False
    if f.mtime_ns is None:
        return True
    again = _identified(f.path)  # touched, copied back, restored from a backup: the same bytes are the same file
    return again is None or again.size != f.size or f.sha256 is None or again.sha256 != f.sha256


#: The largest ``max_batch_bytes`` a landing directory takes (1 PiB).
MAX_BATCH_BYTES = 1 << 50


class LandingDirectory(Source):
    """Batches of files from one directory, at most ``max_files`` files per batch (and, with
    ``max_batch_bytes``, at most that many bytes -- a file is never split: one larger than that is
    a batch of its own): a local absolute path, or an ``s3a://`` or ``hdfs://`` URL (then an
    :class:`.objectlanding.ObjectLanding`, whose ``conn_id`` names the connection to the store)."""

    kind: ClassVar[str] = "landing"
    lag_unit: ClassVar[str] = "files"
    spark_reader: ClassVar[str] = "airflow_transactional.spark.read.read_landing"
    #: The class of a landing directory named by a URL (:class:`.objectlanding.ObjectLanding`,
    #: which sets it: the package imports it with this module).
    on_a_store: ClassVar[type[LandingDirectory] | None] = None

    def __new__(cls, path: str = "", **_: Any) -> LandingDirectory:
        if cls is LandingDirectory and isinstance(path, str) and "://" in path and cls.on_a_store is not None:
            return super().__new__(cls.on_a_store)
        return super().__new__(cls)

    def __init__(self, path: str, *, format: str = "json", pattern: str = "*", max_files: int = 100,
                 settle_seconds: float = 2.0, conn_id: str | None = None, listing: str = "full",
                 full_listing_seconds: float = 3600.0, max_batch_bytes: int | None = None) -> None:
        """``conn_id``, ``listing`` and ``full_listing_seconds`` are for a directory on S3 or HDFS
        (:class:`.objectlanding.ObjectLanding`)."""
        if type(self) is LandingDirectory and (conn_id is not None or listing != "full"):
            raise ConfigError(f"conn_id and listing are for a landing directory on S3 or HDFS (an s3a:// or hdfs:// "
                              f"URL); {path!r} is a local directory: leave them out")
        self._check_path(path)
        if format not in FORMATS:
            raise ConfigError(f"landing format {format!r} is not supported: use one of {', '.join(FORMATS)}")
        if not isinstance(pattern, str) or not pattern or "/" in pattern:
            raise ConfigError(f"landing pattern must be a file-name pattern such as '*.json' (no '/'), got {pattern!r}")
        if not isinstance(max_files, int) or isinstance(max_files, bool) or not 1 <= max_files <= 100_000:
            raise ConfigError(f"max_files must be an integer from 1 to 100,000, got {max_files!r}")
        if not isinstance(settle_seconds, (int, float)) or isinstance(settle_seconds, bool) \
                or not 0 <= settle_seconds <= 86_400:
            raise ConfigError(f"settle_seconds must be a number of seconds from 0 to 86400, got {settle_seconds!r}")
        if max_batch_bytes is not None and (not isinstance(max_batch_bytes, int) or isinstance(max_batch_bytes, bool)
                                            or not 1 <= max_batch_bytes <= MAX_BATCH_BYTES):
            raise ConfigError(f"max_batch_bytes must be a number of bytes from 1 to {MAX_BATCH_BYTES:,} (1 PiB), or "
                              f"None for no cap, got {max_batch_bytes!r}")
        self.path = path
        self.format = format
        self.pattern = pattern
        self.max_files = max_files
        self.settle_seconds = settle_seconds
        self.max_batch_bytes = max_batch_bytes

    @staticmethod
    def _check_path(path: str) -> None:
        if not isinstance(path, str) or not os.path.isabs(path) or "\x00" in path:
            raise ConfigError(f"landing directory must be an absolute path (without NUL bytes), got {path!r}")

    def to_config(self) -> dict[str, Any]:
        config = {"kind": self.kind, "path": self.path, "format": self.format,
                  "pattern": self.pattern, "max_files": self.max_files, "settle_seconds": self.settle_seconds}
        if self.max_batch_bytes is not None:  # a declaration that does not say it keeps its stored form
            config["max_batch_bytes"] = self.max_batch_bytes
        return config

    def records_are_text(self) -> bool:
        return self.format == "json"

    def spark_options(self) -> dict[str, str]:
        """Hadoop settings Spark's reader takes for this directory: none on a local disk."""
        return {}

    def dataset(self, database: str, store_schema: str) -> tuple[str, str]:
        return "file", self.path

    def _listing(self, *, settled_only: bool = True) -> list[LandedFile]:
        """The files of the directory that are candidates, oldest first (by mtime, then name)."""
        try:
            entries = list(os.scandir(self.path))
        except FileNotFoundError:
            raise ConfigError(f"landing directory {self.path} does not exist: create it or fix the path") from None
        home = os.path.realpath(self.path)
        device = os.stat(home).st_dev
        newest = time.time_ns() - int(self.settle_seconds * 1e9)
        out = []
        for e in entries:
            if e.name.startswith((".", "_")) or e.name.endswith(_IGNORED_SUFFIXES):
                continue
            if not fnmatch.fnmatch(e.name, self.pattern) or not e.is_file():
                continue
            if e.is_symlink():
                log.warning("landing directory %s: ignoring %s, a symbolic link (move files into the directory, do "
                            "not link them)", self.path, e.name)
                continue
            why = _foreign(e.path, device)
            if why is not None:
                log.warning("landing directory %s: ignoring %s, %s", self.path, e.name, why)
                continue
            f = _stat(e.path)
            if f is not None and (not settled_only or f.mtime_ns is None or f.mtime_ns <= newest):
                out.append(f)
        return sorted(out, key=lambda f: (f.mtime_ns or 0, f.path))

    def _register_new(self, cur: psycopg2.extensions.cursor, s: str, topology_id: str) -> tuple[set[int], list[str]]:
        """Give new files -- and new contents under known names -- the next sequence numbers; the
        sequence numbers whose content was read (digested) now, and the names whose registered
        content was replaced before any plan read it (lost: reported by the plan)."""
        latest, fresh = self._unregistered(cur, s, topology_id, self._listing())
        planned_through = transactions.planned_through(cur, s, topology_id)
        seq = landing.last_seq(cur, s, topology_id)
        digested: set[int] = set()
        overwritten: list[str] = []
        for f, found in zip(fresh, self._identify_all(fresh), strict=True):
            old = latest.get(f.path)
            if found is None:
                continue
            f = found
            if old is not None and (self._same_content(old, f) or old.seq > planned_through):
                # Touched (same bytes), or rewritten before any plan took it: the entry follows it.
                if not self._same_content(old, f):
                    overwritten.append(f"{f.path} (overwritten before a plan read it)")
                self._record(cur, s, topology_id, old.seq, f)
                digested.add(old.seq)
                continue
            seq += 1  # a new file, or new content under a name a plan already took
            self._insert(cur, s, topology_id, seq, f)
            digested.add(seq)
        return digested, overwritten

    def _unregistered(self, cur: psycopg2.extensions.cursor, s: str, topology_id: str,
                      listed: list[LandedFile]) -> tuple[dict[str, LandedFile], list[LandedFile]]:
        """The latest entry of each listed name, and the listed files no entry holds yet."""
        latest = {f.path: f for f in map(LandedFile.from_row, self._latest(cur, s, topology_id, listed))}
        return latest, [f for f in listed if f.path not in latest or not self._matches(latest[f.path], f)]

    def _latest(self, cur: psycopg2.extensions.cursor, s: str, topology_id: str,
                listed: list[LandedFile]) -> list[landing.FileRow]:
        """The latest registered version of each path (at least of each ``listed`` one)."""
        return landing.latest_versions(cur, s, topology_id)

    def _identify_all(self, listed: list[LandedFile]) -> list[LandedFile | None]:
        """:meth:`_identify` of each listed file, in order."""
        return [self._identify(f) for f in listed]

    def _identify(self, listed: LandedFile) -> LandedFile | None:
        """A listed file with what identifies its content: its stat and digest from one descriptor
        (one file, whatever the name does); None when it is gone."""
        return _identified(listed.path)

    def _same_content(self, old: LandedFile, new: LandedFile) -> bool:
        return old.sha256 is not None and old.sha256 == new.sha256  # no digest (a file over the scan cap): unknown

    def _matches(self, known: LandedFile, listed: LandedFile) -> bool:
        """Whether a listed file is the version ``known`` without reading it (its stat)."""
        return known.matches(listed)

    def _now(self, path: str) -> LandedFile | None:
        """What ``path`` holds now, identified (None: nothing)."""
        return _identified(path)

    def _changed(self, f: LandedFile, *, deep: bool = False) -> bool:
        return changed(f, deep=deep)

    def _lines(self, f: Mapping[str, Any]) -> Iterator[Record]:
        """The records of the planned file ``f``, exactly its planned content."""
        return landed.planned_lines(f, limits.MAX_RECORD_BYTES)

    @staticmethod
    def _insert(cur: psycopg2.extensions.cursor, s: str, topology_id: str, seq: int, f: LandedFile) -> None:
        landing.insert(cur, s, topology_id, f.row(seq))

    def _register_rewritten(self, cur: psycopg2.extensions.cursor, s: str, topology_id: str,
                            gone: LandedFile) -> None:
        """A planned file whose content changed in place (its stat kept): what it holds now is a new
        version, with the next sequence number (its stat alone would never tell the listing) --
        unless the listing registered that content already."""
        now = self._now(gone.path)
        if now is None:
            return
        latest = landing.latest(cur, s, topology_id, gone.path)
        if latest is None or not self._same_content(LandedFile.from_row(latest), now):
            self._insert(cur, s, topology_id, landing.last_seq(cur, s, topology_id) + 1, now)

    @staticmethod
    def _record(cur: psycopg2.extensions.cursor, s: str, topology_id: str, seq: int, f: LandedFile) -> None:
        landing.update(cur, s, topology_id, f.row(seq))

    def plan(self, cur: psycopg2.extensions.cursor, schema: str, topology_id: str, start: Offsets,
             max_records: int, *, skip_unavailable: bool, until: Offsets | None = None) -> BatchPlan:
        s = schema
        digested, overwritten = self._register_new(cur, s, topology_id)
        begin = int(start.get("seq", 0))
        cap = min(self.max_files, max_records)  # a batch is counted in files here
        files: list[dict[str, Any]] = []
        lost: list[LandedFile] = []
        size = 0  # the bytes of ``files``
        end = begin
        last = int(until["seq"]) if until is not None and "seq" in until else None
        for f in map(LandedFile.from_row, landing.after(cur, s, topology_id, begin)):
            if len(files) >= cap or (last is not None and f.seq > last) or self._over_bytes(files, size, f):
                break
            # What was not digested just now is digested again: a rewrite may have kept the stat.
            if self._changed(f, deep=f.seq not in digested):
                if not skip_unavailable:
                    raise BatchUnavailable(
                        f"landing file {f.path} (seq {f.seq}) is gone or its content changed before topology "
                        f"{topology_id!r} committed it; restore it, or declare the topology opaque=True to skip "
                        "what is gone (the loss is recorded; new content under that name is a new file)")
                lost.append(f)
                end = f.seq
                self._register_rewritten(cur, s, topology_id, f)
                continue
            files.append(f.to_plan())
            size += f.size
            end = f.seq
        return BatchPlan(start={"seq": begin}, end={"seq": end},
                         batch=FileBatch(directory=self.path, format=self.format, files=tuple(files)),
                         planned_records=len(files), lost_records=len(lost) + len(overwritten),
                         lost_detail=[f.path for f in lost] + overwritten,
                         lost_ranges=[f.seq for f in lost])  # a version: its name may hold a later one

    def _over_bytes(self, files: list[dict[str, Any]], size: int, f: LandedFile) -> bool:
        """Whether ``f`` would take a batch of ``files`` (``size`` bytes) past ``max_batch_bytes``; a
        file larger than that on its own is planned alone, and said."""
        if self.max_batch_bytes is None or size + f.size <= self.max_batch_bytes:
            return False
        if not files:
            log.warning("landing directory %s: %s is %s bytes, more than max_batch_bytes (%s): it is planned in a "
                        "batch of its own (a file is never split); raise max_batch_bytes if its batch's processing "
                        "needs more room, or land smaller files", self.path, f.path, f"{f.size:,}",
                        f"{self.max_batch_bytes:,}")
            return False
        return True

    def unavailable(self, cur: psycopg2.extensions.cursor, schema: str, topology_id: str,
                    batch: Mapping[str, Any]) -> str | None:
        batch = planned_batch(batch, self.kind)
        files = batch.files if isinstance(batch, FileBatch) else ()
        foreign = self._foreign([f["path"] for f in files])
        if foreign:
            return foreign
        gone = [f["path"] for f in files if self._changed(LandedFile.from_plan(f), deep=True)]
        return f"landing files gone or their content changed since planned: {', '.join(gone)}" if gone else None

    def _foreign(self, paths: Iterable[str]) -> str | None:
        """Why a stored batch names a file this directory does not hold (None: it names none) -- a
        plan is stored where other roles write, and a file is read only from the declared directory."""
        outside = [p for p in paths if os.path.dirname(p) != self.path.rstrip("/")]
        return f"files outside the landing directory {self.path} in the stored batch: {', '.join(outside[:3])}" \
            if outside else None

    def read(self, cur: psycopg2.extensions.cursor, schema: str, topology_id: str,
             batch: Mapping[str, Any]) -> Iterator[Record]:
        batch = planned_batch(batch, self.kind)
        if not isinstance(batch, FileBatch):
            return
        if batch.format != "json":
            raise ConfigError("the pure-Python reader handles JSON-lines files; "
                              "Parquet and CSV batches are read by the Spark helper")
        for f in batch.files:
            yield from self._lines(f)

    def committed_batch(self, cur: psycopg2.extensions.cursor, schema: str, topology_id: str,
                        committed: Offsets, lost: list[Any]) -> tuple[PlannedBatch, str | None]:
        skipped = set(lost)  # the sequence numbers of the versions lost (a name: all of its, as once stored)
        files = [f for f in map(LandedFile.from_row, landing.through(cur, schema, topology_id,
                                                                     int(committed.get("seq", 0))))
                 if f.seq not in skipped and f.path not in skipped]
        foreign = self._foreign(f.path for f in files)
        if foreign:
            return PlannedBatch(), foreign
        gone = [f.path for f in files if self._changed(f, deep=True)]
        if gone:
            return PlannedBatch(), f"landing files gone or changed since they committed: {', '.join(gone[:5])}"
        return FileBatch(directory=self.path, format=self.format, files=tuple(f.to_plan() for f in files)), None

    def lag(self, cur: psycopg2.extensions.cursor, schema: str, topology_id: str, committed: Offsets) -> int:
        """Files in the directory whose current content no committed batch held."""
        done: dict[str, list[LandedFile]] = {}
        for f in map(LandedFile.from_row, landing.through(cur, schema, topology_id, int(committed.get("seq", 0)))):
            done.setdefault(f.path, []).append(f)
        return sum(1 for f in self._listing(settled_only=False)
                   if not any(self._matches(d, f) for d in done.get(f.path, [])))
