"""A landed file opened once, by descriptor: what is checked is what is read.

Whoever may write into a landing directory may also swap a name for a symbolic link between two
looks at it. A plan that stats a name, digests it, and reads it later by name again can be shown
three different files -- one of them a file the writer may not read, whose lines would then go to
the quarantine for every viewer of the DAG. So a landed file is opened exactly once, never through
a symbolic link (``O_NOFOLLOW``) and never as anything but a regular file; its identity (device,
inode, size, mtime) comes from that descriptor, and its digest from the very bytes read through it.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import stat
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..exceptions import BatchUnavailable
from ..store import landing
from .base import Record


class NotLanded(OSError):
    """The name is gone, a symbolic link, or not a regular file."""


class Identity(NamedTuple):
    """What a descriptor says of the file it reads."""

    device: int
    inode: int
    size: int
    mtime_ns: int


def open_landed(path: str) -> int:
    """A read-only descriptor of the regular file named ``path`` itself: a symbolic link is refused
    (``O_NOFOLLOW``), a FIFO never blocks the open (``O_NONBLOCK``), anything but a regular file
    is refused. Raises :class:`NotLanded`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise NotLanded(f"{path} is gone") from None
    except OSError as exc:  # ELOOP: a symbolic link
        raise NotLanded(f"{path} cannot be opened as a file of its own ({exc.strerror}: a symbolic link?)") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotLanded(f"{path} is not a regular file")
    os.set_blocking(fd, True)
    return fd


def identity(fd: int) -> Identity:
    st = os.fstat(fd)
    return Identity(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class Scan(NamedTuple):
    """What reading a whole file tells: its digest, and whether it is ``plain`` -- every line at
    most the record limit and no surrogate's escape in it, so Spark's JSON reader may read it as
    it is (otherwise its lines are read as text and checked one by one, as the pure-Python
    processor reads every line)."""

    sha256: str
    plain: bool


class _Lines:
    """Whether the bytes seen so far are plain (:class:`Scan`), a block at a time: a few
    searches per megabyte, whatever the length of the lines."""

    def __init__(self, longest: int) -> None:
        self.longest, self.run, self.tail, self.plain = longest, 0, b"", True

    def update(self, block: bytes) -> None:
        if not self.plain:
            return
        if b"\\u" in self.tail + block[:8] or b"\\u" in block:  # rare: look closer (a pair counts too)
            self.plain = _SURROGATE_ESCAPE.search(self.tail + block) is None
        self.tail = block[-8:]
        start = 0
        while self.plain:
            room = self.longest - self.run  # bytes the current line may still take
            nl = block.rfind(b"\n", start, start + room + 1)
            if nl < 0:
                self.run += len(block) - start
                self.plain = self.run <= self.longest
                return
            self.run, start = 0, nl + 1


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def digest(fd: int) -> str:
    """The SHA-256 of everything ``fd`` reads from its start."""
    return scan(fd, 0).sha256


def scan(fd: int, longest: int) -> Scan:
    """The digest of everything ``fd`` reads from its start, and whether every line is at most
    ``longest`` bytes and escapes no surrogate (``longest`` 0: not looked at)."""
    os.lseek(fd, 0, os.SEEK_SET)
    return scan_blocks(iter(lambda: os.read(fd, 1 << 20), b""), longest)


def scan_blocks(blocks: Iterable[bytes], longest: int) -> Scan:
    """:func:`scan` of the bytes ``blocks`` yield (a file read elsewhere: an object in a store)."""
    sha, lines = hashlib.sha256(), _Lines(longest)
    for block in blocks:
        sha.update(block)
        if longest:
            lines.update(block)
    return Scan(sha.hexdigest(), bool(longest) and lines.plain)


def not_planned(fd: int, planned: Mapping[str, Any]) -> str | None:
    """Why the file ``fd`` reads is not the planned file ``planned`` (None: it is): another inode
    whose bytes are not the planned ones. The same bytes under a new inode (a file copied back,
    restored from a backup) are the same file, as the plan's checks hold."""
    if planned.get("inode") is None or identity(fd).inode == int(planned["inode"]):
        return None
    if planned.get("sha256") and digest(fd) == planned["sha256"]:
        os.lseek(fd, 0, os.SEEK_SET)
        return None
    return (f"landing file {planned['path']} (seq {planned.get('seq')}) is another file than the one planned (a new "
            "inode, other bytes, under its name): it is a new version, read by a later txid")


def identify(path: str, longest: int, most: int) -> tuple[Identity, Scan | None] | None:
    """The identity and :func:`scan` of the regular file named ``path``, from one descriptor (no
    scan of a file of more than ``most`` bytes: it is not read); None when there is no such file
    (gone, a link, not regular)."""
    try:
        fd = open_landed(path)
    except NotLanded:
        return None
    try:
        ident = identity(fd)
        return ident, (scan(fd, longest) if ident.size <= most else None)
    finally:
        os.close(fd)


class _Digesting(io.RawIOBase):
    """The bytes of a raw file, each added to a digest as it is read."""

    def __init__(self, raw: Any, sha: Any) -> None:
        self.raw, self.sha = raw, sha

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = self.raw.readinto(buffer)
        if n:
            self.sha.update(memoryview(buffer)[:n])
        return n or 0


def lines(fd: int, sha: Any, longest: int) -> Iterator[str]:
    """The text lines ``fd`` reads (:func:`text_lines`), every byte added to ``sha`` as it goes;
    the descriptor is closed after."""
    return text_lines(_Digesting(os.fdopen(fd, "rb", buffering=0), sha), longest)


def text_lines(raw: io.RawIOBase, longest: int) -> Iterator[str]:
    """The text lines of a raw stream (UTF-8, a bad byte replaced; universal newlines, as text files
    are read); the stream is closed after.

    A line of more than ``longest`` characters is its first ``longest + 1`` only (the rest is read
    and digested, never held): a record that long is refused whatever it holds, and one huge line
    must not take the worker's memory."""
    with io.TextIOWrapper(io.BufferedReader(raw), encoding="utf-8", errors="replace") as text:
        while line := text.readline(longest + 1):
            if len(line) > longest and not line.endswith("\n"):
                while (rest := text.readline(1 << 20)) and not rest.endswith("\n"):
                    pass
            yield line


def planned_lines(f: Mapping[str, Any], longest: int) -> Iterator[Record]:
    """The records of the planned file ``f``, read through one descriptor of the very file planned
    (its inode) and checked, once read, against the planned digest: BatchUnavailable otherwise."""
    path = str(f["path"])
    try:
        fd = open_landed(path)
    except NotLanded as exc:
        raise BatchUnavailable(f"landing file {path} (seq {f['seq']}) planned, now: {exc}") from None
    why = not_planned(fd, f)
    if why is not None:
        os.close(fd)
        raise BatchUnavailable(why)
    sha = hashlib.sha256()
    for n, line in enumerate(lines(fd, sha, longest), start=1):
        if line.strip():
            yield Record(f"{f['seq']}:{n}", None, line.rstrip("\n"))
    if f.get("sha256") and sha.hexdigest() != f["sha256"]:
        raise BatchUnavailable(f"landing file {path} (seq {f['seq']}) changed while it was read: this attempt is "
                               "void, and its content now is a new version")


@dataclass(frozen=True)
class LandedFile:
    """One version of a file: where it is and what identifies its content."""

    path: str
    size: int
    mtime_ns: int | None
    inode: int | None
    sha256: str | None = None
    seq: int = 0
    plain: bool | None = None  # see landed.Scan (None: registered before it was looked at)
    version: str | None = None  # the store's version of a file on S3 or HDFS (:mod:`.objects`)

    @classmethod
    def from_row(cls, row: Iterable[Any]) -> LandedFile:
        seq, path, size, mtime_ns, inode, sha256, plain, version = row
        return cls(path, int(size), mtime_ns, inode, sha256, int(seq), plain, version)

    @classmethod
    def from_plan(cls, f: Mapping[str, Any]) -> LandedFile:
        return cls(f["path"], int(f["size"]), f.get("mtime_ns"), f.get("inode"), f.get("sha256"), int(f["seq"]),
                   f.get("plain"), f.get("version"))

    def row(self, seq: int) -> landing.FileRow:
        """This version as the store keeps it, with sequence number ``seq``."""
        return landing.FileRow(seq, self.path, self.size, self.mtime_ns, self.inode, self.sha256, self.plain,
                               self.version)

    def to_plan(self) -> dict[str, Any]:
        plan = {"seq": self.seq, "path": self.path, "size": self.size, "mtime_ns": self.mtime_ns,
                "inode": self.inode, "sha256": self.sha256, "plain": self.plain}
        return plan if self.version is None else {**plan, "version": self.version}

    def same_stat(self, other: LandedFile) -> bool:
        return (self.size, self.mtime_ns, self.inode, self.version) == \
            (other.size, other.mtime_ns, other.inode, other.version)

    def matches(self, now: LandedFile) -> bool:
        """Whether ``now`` (a fresh stat) shows this version unchanged, without reading it; a
        version registered before contents were recorded has only its size to go by."""
        return self.same_stat(now) or (self.mtime_ns is None and self.size == now.size)


def write_json_lines(directory: str, name: str, records: Iterable[Mapping[str, Any]]) -> str:
    """Land a file atomically (write a hidden temporary file, then rename): a helper for producers."""
    tmp = os.path.join(directory, f".{name}.tmp")
    final = os.path.join(directory, name)
    with open(tmp, "w", encoding="utf-8") as fh:
        for r in records:
            fh.write(json.dumps(r) + "\n")
    os.replace(tmp, final)
    return final
