"""The paths Spark reads a landing batch's files by: the very files planned.

A local file is opened once by the driver and handed to Spark by descriptor (``/proc/<pid>/fd/<n>``);
a file on S3 or HDFS by its URL, written so that Spark's reader takes it literally, its versions
checked before and after the read (:mod:`..sources.objectlanding`).
"""

from __future__ import annotations

import atexit
import os
import unicodedata
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..exceptions import BatchUnavailable
from ..sources import landed
from .handoff import is_remote

if TYPE_CHECKING:
    from pyspark.sql import Column, SparkSession

__all__ = ["executors_here", "glob_escaped", "pinned_files", "spellings", "uri_text"]


def executors_here(spark: SparkSession) -> bool:
    """Whether ``spark``'s executors run in this driver's process, on this host, as its user (a
    classic session on a ``local`` master): then they can read what the driver can."""
    return not is_remote(spark) and str(spark.sparkContext.master or "").startswith("local")


#: Descriptors of the landed files a driver reads through ``/proc/self/fd`` (:func:`pinned_files`),
#: open while it lives: Spark reads a file lazily, whenever an action first needs it.
_pinned: list[int] = []


def pinned_files(spark: SparkSession, planned: Sequence[Mapping[str, Any]]) -> tuple[list[str], Column]:
    """The paths Spark reads a landing batch's files by, and the column naming each record's file
    as Spark names the planned file (``input_file_name()``).

    Opened by name, a file can be another file than the one planned: whoever may write into the
    directory may swap the name for a link to a file they may not read while Spark reads. A
    driver whose executors share its process (a classic session on ``local[N]``) opens each
    planned file itself, once, never through a link (:mod:`..sources.landed`), checks it is the
    planned inode, and hands Spark ``/proc/<pid>/fd/<n>``: that very file, whatever the name does
    after. Executors elsewhere (a cluster, Spark Connect) open the names, each escaped so Spark
    takes it literally; keep who may write the landing directory to writers you trust there (docs:
    Security).
    """
    from pyspark.sql import functions as F

    paths = [str(f["path"]) for f in planned]
    if any("://" in p for p in paths) or not executors_here(spark):
        # A store's files (their versions are checked before and after), or local names opened by
        # executors elsewhere: each name escaped, so that Spark reads it and nothing else -- its reader
        # expands {}[]*? in any path, and the txid that planned "[ab].json" would read a.json and b.json.
        names = [F.lit(x) for p in paths for spelled in spellings(p) for x in (spelled, recorded(p))]
        spelled = F.try_element_at(F.create_map(*names), F.input_file_name()) if names else F.lit(None)
        return [glob_escaped(p) for p in paths], F.coalesce(spelled, F.input_file_name())
    jvm: Any = spark._jvm  # classic sessions only: py4j
    conf: Any = spark._jsc
    fs = jvm.org.apache.hadoop.fs.Path("/").getFileSystem(conf.hadoopConfiguration())

    def uri(path: str) -> str:  # as input_file_name() spells a local file
        return str(fs.makeQualified(jvm.org.apache.hadoop.fs.Path(path)).toUri().toString())

    pinned, names = [], []
    for f, path in zip(planned, paths, strict=True):
        try:
            fd = landed.open_landed(path)
        except landed.NotLanded as exc:
            raise BatchUnavailable(f"landing file {path} (seq {f.get('seq')}) planned, now: {exc}") from None
        _pinned.append(fd)
        why = landed.not_planned(fd, f)
        if why is not None:
            raise BatchUnavailable(why)
        by_fd = f"/proc/{os.getpid()}/fd/{fd}"
        pinned.append(by_fd)
        names += [F.lit(uri(by_fd)), F.lit(uri(path))]
    return pinned, F.coalesce(F.try_element_at(F.create_map(*names), F.input_file_name()), F.input_file_name())


def recorded(path: str) -> str:
    """The name a record of the planned file ``path`` carries (its offset, part of the attempt's read
    digest): a URL as planned; a local name as a driver on ``local[N]`` has always recorded it,
    ``file:///...`` (Hadoop's URL of it) -- so that the same batch reads alike on every master and on
    Spark Connect, and a txid committed by one is verified, or processed again, by another."""
    return path if "://" in path else spellings(path)[0]


def glob_escaped(path: str) -> str:
    """``path`` as Spark's reader takes it literally: it expands a path holding ``{}[]*?`` as a glob."""
    return "".join(f"\\{c}" if c in "{}[]*?\\" else c for c in path)


def spellings(path: str) -> tuple[str, ...]:
    """How ``input_file_name()`` may spell the file ``path`` names: a URL as Hadoop writes it; a
    local name as ``file:///...`` or ``file:/...``."""
    if "://" in path:
        return (uri_text(path),)
    url = uri_text("file://" + path)
    return url, "file:" + url[len("file://"):]


_URI_KEPT = frozenset("_-!.~'()*,;:$&+=/@")


def uri_text(path: str) -> str:
    """How Hadoop spells a file URL as text (``Path.toUri().toString()``, what ``input_file_name()``
    says): a character a URI may not hold -- a space, ``%``, ``[``, ``#`` ... -- as ``%XX`` of its
    UTF-8 bytes; letters of other scripts as they are."""
    scheme, sep, rest = path.partition("://")
    authority, slash, tail = rest.partition("/")
    out = []
    for c in tail:
        kept = (c.isascii() and (c.isalnum() or c in _URI_KEPT)) or \
            (not c.isascii() and unicodedata.category(c) not in ("Zs", "Zl", "Zp", "Cc"))
        out.append(c if kept else "".join(f"%{b:02X}" for b in c.encode()))
    return f"{scheme}{sep}{authority}{slash}{''.join(out)}"


@atexit.register
def _unpin() -> None:
    while _pinned:
        os.close(_pinned.pop())


