"""A class-data-sharing archive for the driver JVM: a small batch costs about a fifth less CPU.

A ``spark-submit`` of a small batch spends most of its CPU before the job's first line, loading
and verifying Spark's classes in a fresh driver JVM. Java's application class-data sharing
(AppCDS, JDK 13+) maps those classes from an archive instead. An archive belongs to one JVM and
one Spark install, so it is built once per machine -- ``airflow-txn spark-cds`` (``make demo``
and ``make test`` run it) -- and the process task passes it to the driver only when it was
verified and has not changed since:

* the build writes to a temporary file, checks it with a real ``spark-submit`` under
  ``-Xshare:on`` (which refuses an unusable archive), then renames it into place and records its
  size, inode and mtime in a sidecar;
* a JVM given a stale archive (another JDK, another classpath) ignores it with one warning line;
  a truncated one would crash it, so an archive whose sidecar does not match is never passed on.

``AIRFLOW_TXN_SPARK_CDS=off`` turns it off; ``AIRFLOW_TXN_SPARK_CDS_DIR`` moves the cache
(default ``$XDG_CACHE_HOME/airflow_transactional`` or ``~/.cache/airflow_transactional``).
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .. import files
from ..exceptions import TransactionalError
from .submit import provider_zip, spark_submit_argv, with_quiet_driver_logs

log = logging.getLogger(__name__)

SWITCH_ENV = "AIRFLOW_TXN_SPARK_CDS"
DIR_ENV = files.DIR_ENV
JAVA_OPTIONS = "spark.driver.extraJavaOptions"
# The driver options the archive is built with: those of LOCAL_SPARK_CONF (a short-lived JVM).
BUILD_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

# What the provider's jobs make the driver load (``spark/warmup.py``, a job of its own: run by path,
# never imported here, so this module loads no Spark).
WARMUP_JOB = Path(__file__).resolve().with_name("warmup.py")


def enabled() -> bool:
    return os.environ.get(SWITCH_ENV, "on").strip().lower() not in ("off", "0", "false", "no")


def cache_dir() -> Path:
    return files.cache_dir()


def java_binary() -> str | None:
    """The ``java`` spark-submit starts: ``$JAVA_HOME/bin/java``, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "java"), os.X_OK):
        return os.path.join(home, "bin", "java")
    return shutil.which("java")


def spark_home() -> Path | None:
    """``$SPARK_HOME``, else the pyspark install (without importing it)."""
    if os.environ.get("SPARK_HOME"):
        return Path(os.environ["SPARK_HOME"])
    spec = importlib.util.find_spec("pyspark")
    return Path(spec.origin).parent if spec and spec.origin else None


def fingerprint() -> str | None:
    """Names the archive for this JVM and this Spark install (None if either is missing)."""
    java, home = java_binary(), spark_home()
    if java is None or home is None or not (home / "jars").is_dir():
        return None
    digest = hashlib.sha256()
    real = Path(java).resolve()
    for part in (real, real.parent.parent / "lib" / "server" / "libjvm.so"):
        if part.exists():
            st = part.stat()
            digest.update(f"{part}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    # The archive records the driver's classpath jar by jar -- path, size and modification time --
    # and a JVM refuses it if any differs: another install of the same jars (a second checkout,
    # another virtualenv, the same one re-created) needs an archive of its own.
    digest.update(f"{home.resolve()}\n".encode())
    # What the archive records is what the warm-up job makes a driver load: a provider whose jobs
    # load other classes (a new warm-up) records its own.
    digest.update(hashlib.sha256(WARMUP_JOB.read_bytes()).digest())
    for jar in sorted((home / "jars").glob("*.jar")):
        st = jar.stat()
        digest.update(f"{jar.name}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def archive_path(directory: Path | None = None) -> Path | None:
    key = fingerprint()
    return None if key is None else (directory or cache_dir()) / f"spark-cds-{key}.jsa"


def _identity(path: Path) -> dict[str, int]:
    st = path.stat()
    return {"size": st.st_size, "inode": st.st_ino, "mtime_ns": st.st_mtime_ns}


def current(directory: Path | None = None) -> Path | None:
    """The verified archive for this JVM and Spark, if one was built and is unchanged since."""
    if not enabled():
        return None
    path = archive_path(directory)
    if path is None:
        return None
    try:
        sidecar = path.with_suffix(".json")
        # A JVM maps the archive into the driver: only one of ours, that nobody else can write.
        if not all(_ours(p) for p in (path.parent, path, sidecar)):
            return None
        recorded = json.loads(sidecar.read_text())
        return path if recorded.get("identity") == _identity(path) else None
    except (OSError, ValueError):
        return None


def _ours(path: Path) -> bool:
    st = path.stat()
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022


def with_archive(conf: Mapping[str, Any], archive: Path | None) -> dict[str, Any]:
    """``conf`` with the driver JVM started from ``archive`` (unless the user chose CDS options)."""
    out = dict(conf)
    java_opts = str(out.get(JAVA_OPTIONS) or "")
    if archive is not None and "SharedArchiveFile" not in java_opts and "-Xshare" not in java_opts:
        out[JAVA_OPTIONS] = " ".join(filter(None, [java_opts, f"-XX:SharedArchiveFile={archive}"]))
    return out


def _spark_submit(java_options: str, job: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    conf = with_quiet_driver_logs({"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2",
                                   JAVA_OPTIONS: java_options})
    argv = spark_submit_argv("local[1]", conf, "--name", "airflow-txn-spark-cds")
    env = {**os.environ, "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
           **({} if "SPARK_LOCAL_IP" in os.environ else {"SPARK_LOCAL_IP": "127.0.0.1"})}
    work = tempfile.mkdtemp(prefix="run-", dir=job.parent)
    try:
        return subprocess.run([*argv, "--py-files", provider_zip(), str(job), work], env=env, capture_output=True,
                              text=True, check=False, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise TransactionalError(f"the class-data-sharing warm-up job took over {timeout:.0f} s; Spark jobs run "
                                 "without the archive") from None


def build(directory: Path | None = None, *, force: bool = False, timeout: float = 900) -> Path:
    """Build (or find) the archive for this JVM and Spark; returns its path.

    Two builds at once do the work once (a lock file); a build that fails leaves nothing behind
    that a driver would be given.
    """
    path = archive_path(directory)
    if path is None:
        raise TransactionalError("no class-data-sharing archive without Java and Spark: put a JDK 17+ on PATH "
                                 "(or set JAVA_HOME) and install pyspark (or set SPARK_HOME)")
    files.private_dir(path.parent)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force and current(directory) is not None:
            prune(path)
            return path
        with tempfile.TemporaryDirectory(prefix="airflow-txn-cds-") as tmp:
            job, staged = Path(tmp) / "warmup.py", path.with_name(f"{path.name}.{os.getpid()}.tmp")
            job.write_text(WARMUP_JOB.read_text())
            try:
                started = time.monotonic()
                dumped = _spark_submit(f"{BUILD_JAVA_OPTIONS} -XX:ArchiveClassesAtExit={staged}", job, timeout)
                if dumped.returncode != 0 or not staged.exists():
                    raise TransactionalError(
                        f"building the class-data-sharing archive failed ({dumped.returncode}); the JVM said:\n"
                        f"{dumped.stderr[-3000:]}\nSpark jobs run without it (set {SWITCH_ENV}=off to stop trying)")
                # -Xshare:on refuses to start with an archive it cannot use: the check is the real thing.
                checked = _spark_submit(f"{BUILD_JAVA_OPTIONS} -Xshare:on -XX:SharedArchiveFile={staged}", job, timeout)
                if checked.returncode != 0:
                    raise TransactionalError(
                        "the class-data-sharing archive did not verify (a JVM under -Xshare:on refused it):\n"
                        f"{checked.stderr[-3000:]}\nSpark jobs run without it")
                os.replace(staged, path)
            finally:
                staged.unlink(missing_ok=True)
        sidecar = path.with_suffix(".json.tmp")
        sidecar.write_text(json.dumps({"identity": _identity(path), "java": java_binary(),
                                       "spark_home": str(spark_home()), "built_in_seconds":
                                       round(time.monotonic() - started, 1)}))
        os.replace(sidecar, path.with_suffix(".json"))
        log.info("built the class-data-sharing archive %s", path)
    prune(path)
    return path


def prune(keep: Path) -> list[Path]:
    """Remove the archives beside ``keep`` that no JVM can be given any more (about 180 MB each).

    That is one whose Java or Spark install is gone (a deleted checkout or virtualenv), or one
    for ``keep``'s own Spark install superseded by ``keep`` (Java or the jars changed since). An
    archive being built (its lock held) is left alone; a JVM that mapped a removed archive keeps
    its pages. Returns the archives removed.
    """
    here = _recorded_home(_read_sidecar(keep.with_suffix(".json")) or {})
    removed = []
    for sidecar in sorted(keep.parent.glob("spark-cds-*.json")):
        archive = sidecar.with_suffix(".jsa")
        recorded = None if archive == keep else _read_sidecar(sidecar)
        if recorded is None:
            continue
        java, home = recorded.get("java"), _recorded_home(recorded)
        gone = not (java and os.path.exists(java)) or home is None or not (home / "jars").is_dir()
        if not (gone or (here is not None and home == here)):
            continue
        with open(archive.with_suffix(".lock"), "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            archive.unlink(missing_ok=True)
            sidecar.unlink(missing_ok=True)
            archive.with_suffix(".lock").unlink(missing_ok=True)
        removed.append(archive)
        log.info("removed the class-data-sharing archive %s (%s)", archive,
                 "its Java or Spark is gone" if gone else "superseded")
    return removed


def _read_sidecar(sidecar: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads(sidecar.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _recorded_home(recorded: Mapping[str, Any]) -> Path | None:
    home = recorded.get("spark_home")
    return Path(home).resolve() if home else None
