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

A Spark Connect server keeps its own copy of each uploaded file, under
``<java.io.tmpdir>/artifacts-<uuid>/<session>/files/``, made with the server's umask: a server run
under umask 022 in the default temp directory leaves the DSN readable by every local user. So
before the DSN goes up, a harmless probe file does, and a one-row job on the server's executors
looks at every copy of it they can find (:func:`exposure`): a server whose copy another user could
read is refused, naming the fix, and the DSN never reaches it.
"""

from __future__ import annotations

import atexit
import functools
import glob
import hashlib
import json
import logging
import os
import shutil
import tempfile
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..exceptions import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

#: Where PySpark's client finds its Spark Connect server (a URL, which may hold a token).
REMOTE_ENV = "SPARK_REMOTE"

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


#: Reader options whose value is a secret: a store's credentials, a Kafka SASL login.
SECRET_OPTIONS = frozenset({"fs.s3a.access.key", "fs.s3a.secret.key", "fs.s3a.session.token",
                            "fs.s3a.encryption.key", "kafka.sasl.jaas.config"})


def reader_options(spark: SparkSession, options: Mapping[str, str]) -> dict[str, str]:
    """``options`` as a read in ``spark`` may take them. A classic session keeps them in the driver's
    process (its plans show them redacted by name). A Spark Connect server posts each operation's
    plan, options and all, to its UI and event log, masking no value: there a read carries none of
    :data:`SECRET_OPTIONS`, and the server reads with credentials of its own (its environment's
    ``AWS_*``, its ``spark.hadoop.fs.s3a.*``, a JAAS file: ``docs/guides/security.md``)."""
    if not is_remote(spark):
        return dict(options)
    kept = {k: v for k, v in options.items() if k not in SECRET_OPTIONS}
    held = sorted(set(options) - set(kept))
    if "fs.s3a.session.token" in held:  # the provider of those temporary credentials has nothing to give
        kept.pop("fs.s3a.aws.credentials.provider", None)
    if held:
        log.info("on Spark Connect a read does not carry %s: the server uses the credentials it holds",
                 ", ".join(held))
    return kept


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
            _refuse_an_exposing_server(spark, home)
            spark.addArtifacts(str(path), file=True)  # uploaded over the session's gRPC channel
        finally:
            shutil.rmtree(home, ignore_errors=True)
    else:
        # The driver's file server reads it whenever an executor first asks: kept while the driver lives.
        spark.sparkContext.addFile(str(path))
        atexit.register(shutil.rmtree, home, True)
    return StoreFile(name)


def _refuse_an_exposing_server(spark: SparkSession, home: Path) -> None:
    """Upload a probe file and have an executor look at the server's copies of it: a ConfigError
    naming the fix when another local user could read one; a warning when none can be seen (the
    executors run on other hosts than the server)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    probe = home / f"airflow-txn-probe-{os.urandom(6).hex()}"
    os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    spark.addArtifacts(str(probe), file=True)
    look = F.udf(functools.partial(exposure, probe.name), StringType())
    [(found,)] = spark.range(1).select(look()).collect()
    seen = json.loads(found)
    if seen["exposed"]:
        raise ConfigError(
            "the Spark Connect server keeps the files a session uploads where other local users can read them "
            f"({seen['exposed'][0]}, mode {seen['modes'][0]}): it would keep the state store's DSN there too, so it "
            "was not sent. Start the server under umask 077 with a private java.io.tmpdir (a mode-700 directory: "
            "SPARK_SUBMIT_OPTS=-Djava.io.tmpdir=DIR), as docs/guides/security.md shows")
    if not seen["copies"]:
        log.warning("the Spark Connect server's copy of an uploaded file could not be checked from its executors "
                    "(they run on another host?): make sure its java.io.tmpdir is private (docs/guides/security.md)")


def exposure(name: str) -> str:
    """Executor side: the copies of the uploaded file ``name`` on this host (the executor's, the
    server's under each temp directory its JVM may use), and those another user could read, as JSON."""
    from pyspark import SparkFiles

    roots, own = {tempfile.gettempdir(), "/tmp", *_jvm_tmpdirs()}, SparkFiles.get(name)
    copies = {own} if os.path.exists(own) else set()
    for root in roots:
        copies.update(glob.glob(os.path.join(glob.escape(root), "artifacts-*", "*", "files", glob.escape(name))))
    exposed = sorted(p for p in copies if _readable_by_others(p))
    return json.dumps({"copies": sorted(copies), "exposed": exposed,
                       "modes": [oct(os.stat(p).st_mode & 0o777) for p in exposed]})


def _jvm_tmpdirs() -> list[str]:
    """The ``java.io.tmpdir`` of this Python worker's JVM ancestors (a server's is on its command line)."""
    found, pid = [], os.getppid()
    for _ in range(8):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        found += [a.split(b"=", 1)[1].decode(errors="replace") for a in argv if a.startswith(b"-Djava.io.tmpdir=")]
        pid = int(stat.rsplit(")", 1)[1].split()[1])
        if pid <= 1:
            break
    return found


def _readable_by_others(path: str) -> bool:
    """Whether a user other than the file's owner could read it: read for group or others on the file,
    and search on every directory above it for the same class."""
    mode = os.stat(path).st_mode
    parents = [os.stat(str(p)).st_mode for p in Path(path).parents]
    return any(mode & read and all(m & search for m in parents) for read, search in ((0o004, 0o001), (0o040, 0o010)))
