"""How executors reach the state store: the DSN as a file Spark hands them, never inside a task.

A Python task's closure travels from the driver to the executors as a broadcast block, kept in
the driver's block manager, on its executors' disks and in the Spark Connect server's. The staging
COPY's closure carried the DSN, and another local user fetched it from an unauthenticated block
manager (:mod:`.auth` shuts that door). So a closure carries no secret at all: the driver writes
the DSN to a private file (mode 600, in a fresh mode-700 directory) and registers it with Spark
-- ``SparkContext.addFile`` on a classic session, ``addArtifacts(file=True)`` on a Spark Connect
one -- and the task carries only the file's name (:class:`StoreFile`). Each executor reads its own
copy (``SparkFiles.get``), fetched over Spark's authenticated file server into the application's
scratch directory (mode 700).
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..exceptions import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Per Spark session: the DSN's digest -> the file registered for it (a session takes each once).
_registered: weakref.WeakKeyDictionary[Any, dict[str, StoreFile]] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class StoreFile:
    """The state store as a task carries it: the name of a file Spark hands each executor."""

    name: str

    def dsn(self) -> str:
        """Executor side: the DSN, read from this executor's copy of the file."""
        from pyspark import SparkFiles

        path = SparkFiles.get(self.name)
        try:
            return Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"the executor cannot read the state store's DSN file {path} ({exc.strerror}): Spark "
                              "hands it to every executor of the application; was it started by another session?"
                              ) from None


def is_remote(spark: SparkSession) -> bool:
    """Whether ``spark`` is a Spark Connect session."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def store_file(spark: SparkSession, dsn: str) -> StoreFile:
    """The :class:`StoreFile` of ``dsn`` in ``spark``: registered with the session on first use."""
    digest = hashlib.sha256(dsn.encode()).hexdigest()
    known = _registered.setdefault(spark, {})
    if digest not in known:
        known[digest] = _register(spark, dsn, f"airflow-txn-dsn-{digest[:12]}-{os.urandom(4).hex()}")
    return known[digest]


def _register(spark: SparkSession, dsn: str, name: str) -> StoreFile:
    home = Path(tempfile.mkdtemp(prefix="airflow-txn-"))  # 0700, a name nobody could guess
    path = home / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(dsn)
    if is_remote(spark):
        try:
            spark.addArtifacts(str(path), file=True)  # uploaded over the session's gRPC channel
        finally:
            shutil.rmtree(home, ignore_errors=True)
    else:
        # The driver's file server reads it whenever an executor first asks: kept while the driver lives.
        spark.sparkContext.addFile(str(path))
        atexit.register(shutil.rmtree, home, True)
    return StoreFile(name)
