"""Where a landing directory's files live when they are not on a local disk: an S3 bucket
(``s3a://bucket/prefix``, :mod:`.s3`) or an HDFS directory (``hdfs://namenode:port/path``,
:mod:`.webhdfs`), behind one small interface the landing source plans and checks with.

A file there is known by its version, never by its name alone: an S3 object by its ETag (the
store gives a new one to each upload of other bytes), an HDFS file by its file id (a new one for
each file created under a name), length and modification time (an append changes both). A plan
pins each file's version; a check before and after every read compares what the name holds now
with the pinned version, and a read itself is conditional on it where the store allows (S3's
``If-Match``), so a file replaced under a plan is never read as if it were the planned one.
"""

from __future__ import annotations

import io
import re
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar, NamedTuple
from urllib.parse import urlsplit

from ..exceptions import ConfigError

__all__ = ["SCHEMES", "ObjectStore", "StoredFile", "checked_endpoint", "checked_host", "checked_port", "parent",
           "parquet_problem", "said", "split_url"]

#: The URL schemes of a landing directory not on a local disk, as Spark reads them.
SCHEMES = ("s3a", "hdfs")


class StoredFile(NamedTuple):
    """One version of a file in a store: its URL, size, version identity and modification time."""

    path: str
    size: int
    version: str
    mtime_ns: int


def split_url(url: str) -> tuple[str, str, str]:
    """``(scheme, authority, path)`` of a landing URL, refused naming the fix when it is not one."""
    if not isinstance(url, str) or "\x00" in url or any(c.isspace() for c in url):
        raise ConfigError(f"landing directory {url!r}: a URL without spaces or NUL bytes, e.g. s3a://bucket/prefix")
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        raise ConfigError(f"landing directory {url!r}: use a local absolute path, s3a://bucket/prefix or "
                          "hdfs://namenode:port/path")
    if not parts.netloc or parts.query or parts.fragment or "@" in parts.netloc:
        raise ConfigError(f"landing directory {url!r}: name the {'bucket' if parts.scheme == 's3a' else 'NameNode'} "
                          "after the scheme, with no user, query or fragment (credentials come from the connection)")
    path = parts.path.rstrip("/")
    if "//" in path or "/./" in f"{path}/" or "/../" in f"{path}/":
        raise ConfigError(f"landing directory {url!r}: a path without empty, '.' or '..' parts")
    if parts.scheme == "hdfs" and not path:
        raise ConfigError(f"landing directory {url!r}: name a directory of the file system (hdfs://host:port/path)")
    return parts.scheme, parts.netloc, path


_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_HOST = re.compile(rf"{_LABEL}(?:\.{_LABEL})*\.?|\[[0-9A-Fa-f:.]+\]")


def checked_host(host: Any, conn_id: str | None, field: str = "host") -> str:
    """A connection's ``host``: a host name or an IP address, nothing else (no path, port, user,
    query: a host field that carries ``/internal/error?x=`` would have the provider fetch any URL)."""
    if not isinstance(host, str) or not _HOST.fullmatch(host):
        raise ConfigError(f"connection {conn_id!r}: its {field} {str(host)[:80]!r} is not a host name or IP address; "
                          "set the host alone (the port in its own field, no path)")
    return host


def checked_port(port: Any, conn_id: str | None) -> int:
    """A connection's ``port``: a whole number from 1 to 65535."""
    if isinstance(port, bool) or not isinstance(port, (int, str)) or not str(port).isdigit() \
            or not 0 < int(port) < 65536:
        raise ConfigError(f"connection {conn_id!r}: its port {str(port)[:20]!r} is not a port number (1 to 65535)")
    return int(port)


def checked_endpoint(url: Any, conn_id: str | None) -> str:
    """A connection's ``endpoint_url``: ``http(s)://host[:port]``, nothing else -- no path, query, user
    or fragment (credentials are sent to it: it names a server, not a URL on one)."""
    parts = urlsplit(url) if isinstance(url, str) and url.isprintable() and " " not in url else None
    try:
        port = parts.port if parts is not None else None
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/") \
            or parts.query or parts.fragment or "@" in parts.netloc or not _HOST.fullmatch(parts.netloc.rsplit(
                ":", 1)[0] if port is not None else parts.netloc):
        raise ConfigError(f"connection {conn_id!r}: its endpoint_url {str(url)[:80]!r} is not http(s)://host[:port]; "
                          "name the S3 server alone (no path, query or user)")
    return url.rstrip("/")


_JAVA_NAME = re.compile(r"[A-Za-z_$][\w$]*(?:\.[A-Za-z_$][\w$]*)*")


def said(name: Any) -> str:
    """What a store's error may show of its answer: the error's kind when it is a plain name (a
    Java exception's, an S3 error code), never its text -- an answer is not echoed to whoever reads
    the error (the overview shows it to every viewer)."""
    return name if isinstance(name, str) and len(name) <= 120 and _JAVA_NAME.fullmatch(name) else "an error"


def parent(path: str) -> str:
    """The directory a file URL sits in (``s3a://b/in/f.json`` -> ``s3a://b/in``)."""
    return path.rsplit("/", 1)[0]


class ObjectStore(ABC):
    """The files directly under one landing URL: list them, look one up, read one version."""

    scheme: ClassVar[str]

    def __init__(self, root: str, settings: Mapping[str, Any], conn_id: str | None = None) -> None:
        self.root = root.rstrip("/")
        self.settings = dict(settings)
        self.conn_id = conn_id  # for messages: which connection to fix

    def __repr__(self) -> str:  # never the settings: they hold secrets
        return f"{type(self).__name__}({self.root!r})"

    @abstractmethod
    def listing(self, after: str | None = None) -> Iterator[StoredFile]:
        """The files directly under the root (not in sub-directories), in byte order of their
        names; ``after``: only those whose URL sorts after it (the store skips the rest itself)."""

    @abstractmethod
    def stat(self, path: str) -> StoredFile | None:
        """What ``path`` holds now (None: nothing)."""

    @abstractmethod
    def blocks(self, planned: StoredFile) -> Iterator[bytes]:
        """The bytes of exactly the ``planned`` version, a block at a time; BatchUnavailable when
        the name holds another version (or none) before or while it is read."""

    @abstractmethod
    def piece(self, planned: StoredFile, offset: int, length: int) -> bytes:
        """``length`` bytes from ``offset`` of exactly the ``planned`` version (BatchUnavailable
        as for :meth:`blocks`)."""

    def keeps_versions(self) -> bool:
        """Whether the store keeps every version of a file, each readable by its id after its name
        holds another (an S3 bucket with versioning enabled). HDFS keeps none."""
        return False

    def kept(self, planned: StoredFile) -> bool:
        """Whether the ``planned`` version can still be read: where no versions are kept, whether its
        name holds it now."""
        now = self.stat(planned.path)
        return now is not None and self.same_content(planned, now)

    def same_content(self, a: StoredFile, b: StoredFile) -> bool:
        """Whether two versions hold the same bytes, as far as the store tells."""
        return (a.version, a.size) == (b.version, b.size)

    def spark_options(self) -> dict[str, str]:
        """Hadoop settings a Spark reader of this store takes as options (some are secrets: never
        logged, never on a command line)."""
        return {}

    def close(self) -> None:  # noqa: B027 -- most stores hold nothing
        """Let go of connections."""


_MAGIC = b"PAR1"


def parquet_problem(store: ObjectStore, planned: StoredFile) -> str | None:
    """Why the ``planned`` version is not a readable Parquet file (None: its footer reads), from
    three ranged reads -- its first four bytes, its last eight, its footer -- never the whole file.
    A corrupt file is quarantined by name instead of failing every attempt of its txid."""
    import pyarrow.parquet as pq

    if planned.size < 12:
        return f"unreadable Parquet file: {planned.size} bytes, too short for one"
    if store.piece(planned, 0, 4) != _MAGIC:
        return "unreadable Parquet file: it does not begin with PAR1 (not a Parquet file)"
    tail = store.piece(planned, planned.size - 8, 8)
    footer_len = int.from_bytes(tail[:4], "little")
    if tail[4:] != _MAGIC or not 0 < footer_len <= planned.size - 12:
        return "unreadable Parquet file: no footer at its end (a partial upload, or not a Parquet file)"
    footer = store.piece(planned, planned.size - 8 - footer_len, footer_len + 8)
    try:
        pq.read_metadata(_Tail(planned.size, footer))
    except Exception as exc:
        return f"unreadable Parquet file: {type(exc).__name__}: {exc}"[:1000]
    return None


class _Tail(io.RawIOBase):
    """A file of ``size`` bytes of which only the last ``len(tail)`` are known (the rest read as
    zeros): what a Parquet reader needs to read a footer."""

    def __init__(self, size: int, tail: bytes) -> None:
        self.size, self.tail, self.at = size, tail, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self.at = {io.SEEK_SET: 0, io.SEEK_CUR: self.at, io.SEEK_END: self.size}[whence] + offset
        return self.at

    def tell(self) -> int:
        return self.at

    def readinto(self, buffer: Any) -> int:
        n = max(0, min(len(buffer), self.size - self.at))
        start = self.size - len(self.tail)
        data = bytes(max(0, min(n, start - self.at))) + self.tail[max(0, self.at - start):][:n]
        buffer[:len(data)] = data
        self.at += len(data)
        return len(data)

