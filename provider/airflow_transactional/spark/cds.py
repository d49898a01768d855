"""A class-data-sharing archive for the driver JVM: a small batch costs about a fifth less CPU.

A ``spark-submit`` of a small batch spends most of its CPU before the job's first line, loading
and verifying Spark's classes in a fresh driver JVM. Java's application class-data sharing
(AppCDS, JDK 13+) maps those classes from an archive instead. An archive belongs to one JVM and
one set of Spark jars at fixed paths, so it is built once per machine -- ``airflow-txn spark-cds``
(``make demo`` and ``make test`` run it) -- and the process task passes it to the driver only when
it was verified and has not changed since:

* every install of the same Spark jars shares one archive: it is built in the install's shared
  home (``spark/sharedhome.py``: the jars hard-linked once per content), and a driver that is given
  it starts with ``SPARK_HOME`` there (:meth:`Startup.env`); where links cannot be made, the
  install gets an archive of its own;
* the build writes to a temporary file, checks it with a real ``spark-submit`` under
  ``-Xshare:on`` (which refuses an unusable archive), then renames it into place and records its
  size, inode and mtime in a sidecar; each install records which archive it uses in a pointer file;
* a JVM given a stale archive (another JDK, another classpath) ignores it with one warning line;
  a truncated one would crash it, so an archive whose sidecar does not match is never passed on.

``AIRFLOW_TXN_SPARK_CDS=off`` turns it off; ``AIRFLOW_TXN_CACHE_DIR`` moves the cache
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
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import files
from ..exceptions import TransactionalError
from . import sharedhome
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


@dataclass(frozen=True)
class Startup:
    """A verified archive, and the Spark home a driver starts from to map it."""

    archive: Path
    #: The shared home of the install's jars (None: the archive is the install's own).
    spark_home: Path | None = None
    #: The install's own ``conf/``, which a driver started from the shared home still reads.
    conf_dir: Path | None = None

    def env(self) -> dict[str, str]:
        """What the ``spark-submit`` process's environment needs for its driver to map the archive."""
        if self.spark_home is None:
            return {}
        keep_conf = self.conf_dir is not None and "SPARK_CONF_DIR" not in os.environ
        return {"SPARK_HOME": str(self.spark_home), **({"SPARK_CONF_DIR": str(self.conf_dir)} if keep_conf else {})}


def _java_parts() -> list[Path]:
    java = java_binary()
    real = Path(java).resolve() if java else None
    return [] if real is None else [p for p in (real, real.parent.parent / "lib" / "server" / "libjvm.so")
                                    if p.exists()]


def _jvm_digest() -> hashlib._Hash:
    """This JVM, and what the warm-up job makes a driver load (a provider whose jobs load other
    classes records its own archive)."""
    digest = hashlib.sha256()
    for part in _java_parts():
        st = part.stat()
        digest.update(f"{part}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    digest.update(hashlib.sha256(WARMUP_JOB.read_bytes()).digest())
    return digest


def fingerprint() -> str | None:
    """Names this install's pointer (and own archive): this JVM and this Spark install (None if
    either is missing). Stats only: computed at every task's start."""
    java, home = java_binary(), spark_home()
    if java is None or home is None or not (home / "jars").is_dir():
        return None
    digest = _jvm_digest()
    # The archive records the driver's classpath jar by jar -- path, size and modification time --
    # and a JVM refuses it if any differs: another install of the same jars (a second checkout,
    # another virtualenv, the same one re-created) points at its archive anew.
    digest.update(f"{home.resolve()}\n".encode())
    for jar in sorted((home / "jars").glob("*.jar")):
        st = jar.stat()
        digest.update(f"{jar.name}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def archive_path(directory: Path | None = None) -> Path | None:
    """The archive of this install's own, for where its jars cannot be shared."""
    key = fingerprint()
    return None if key is None else (directory or cache_dir()) / f"spark-cds-{key}.jsa"


def pointer_path(directory: Path | None = None) -> Path | None:
    """Which archive this install's drivers are given (written by :func:`build`)."""
    key = fingerprint()
    return None if key is None else (directory or cache_dir()) / f"install-{key}.json"


def shared_archive(shared_home: Path) -> Path:
    """The archive of this JVM in a shared home."""
    return shared_home / f"cds-{_jvm_digest().hexdigest()[:16]}.jsa"


def _identity(path: Path) -> dict[str, int]:
    st = path.stat()
    return {"size": st.st_size, "inode": st.st_ino, "mtime_ns": st.st_mtime_ns}


def _verified(archive: Path) -> bool:
    """``archive`` is one build() checked, unchanged since, in directories only we can write."""
    try:
        sidecar = archive.with_suffix(".json")
        # A JVM maps the archive into the driver: only one of ours, that nobody else can write.
        if not all(_ours(p) for p in (archive.parent, archive, sidecar)):
            return False
        return bool(json.loads(sidecar.read_text()).get("identity") == _identity(archive))
    except (OSError, ValueError, AttributeError):
        return False


def current(directory: Path | None = None) -> Startup | None:
    """The verified archive for this JVM and Spark install, if one was built and is unchanged since."""
    if not enabled():
        return None
    pointer = pointer_path(directory)
    if pointer is None:
        return None
    try:
        if not _ours(pointer):
            return None
        recorded = json.loads(pointer.read_text())
        archive = Path(recorded["archive"])
        shared = Path(recorded["spark_home"]) if recorded.get("spark_home") else None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not _verified(archive):
        return None
    if shared is not None and not sharedhome.unchanged(shared, recorded.get("jars") or {}):
        return None
    return _startup(archive, shared, Path(recorded.get("install") or ""))


def _startup(archive: Path, shared: Path | None, install: Path) -> Startup:
    """A driver's start from ``archive``: from the ``shared`` home, keeping ``install``'s own conf/."""
    conf = install / "conf"
    return Startup(archive, shared, conf if shared is not None and conf.is_dir() else None)


def _ours(path: Path) -> bool:
    st = path.stat()
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022


def env_of(startup: Startup | None) -> dict[str, str]:
    """:meth:`Startup.env`, or nothing without an archive."""
    return {} if startup is None else startup.env()


def with_archive(conf: Mapping[str, Any], startup: Startup | None) -> dict[str, Any]:
    """``conf`` with the driver JVM started from ``startup``'s archive (unless the user chose CDS
    options); the ``spark-submit`` process also needs ``startup.env()``."""
    out = dict(conf)
    java_opts = str(out.get(JAVA_OPTIONS) or "")
    if startup is not None and "SharedArchiveFile" not in java_opts and "-Xshare" not in java_opts:
        out[JAVA_OPTIONS] = " ".join(filter(None, [java_opts, f"-XX:SharedArchiveFile={startup.archive}"]))
    return out


def _spark_submit(java_options: str, job: Path, env_extra: Mapping[str, str],
                  timeout: float) -> subprocess.CompletedProcess[str]:
    conf = with_quiet_driver_logs({"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2",
                                   JAVA_OPTIONS: java_options})
    argv = spark_submit_argv("local[1]", conf, "--name", "airflow-txn-spark-cds")
    env = {**os.environ, "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
           **({} if "SPARK_LOCAL_IP" in os.environ else {"SPARK_LOCAL_IP": "127.0.0.1"}), **env_extra}
    work = tempfile.mkdtemp(prefix="run-", dir=job.parent)
    try:
        return subprocess.run([*argv, "--py-files", provider_zip(), str(job), work], env=env, capture_output=True,
                              text=True, check=False, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise TransactionalError(f"the class-data-sharing warm-up job took over {timeout:.0f} s; Spark jobs run "
                                 "without the archive") from None


@contextmanager
def _locked(path: Path, *, shared: bool = False) -> Iterator[None]:
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield


def build(directory: Path | None = None, *, force: bool = False, timeout: float = 900) -> Startup:
    """Build (or find) the archive for this JVM and Spark install, shared with every install of
    the same jars where it can be; returns what a driver starts from.

    Two builds at once do the work once (lock files); a build that fails leaves nothing behind
    that a driver would be given.
    """
    home, pointer, own = spark_home(), pointer_path(directory), archive_path(directory)
    if home is None or pointer is None or own is None:
        raise TransactionalError("no class-data-sharing archive without Java and Spark: put a JDK 17+ on PATH "
                                 "(or set JAVA_HOME) and install pyspark (or set SPARK_HOME)")
    cache = files.private_dir(pointer.parent)
    with _locked(pointer.with_suffix(".lock")):
        found = None if force else current(directory)
        if found is None:
            key = sharedhome.content_key(home)
            files.private_dir(sharedhome.homes_dir(cache))
            # Held while this install points at the shared home: prune() removes none that is.
            with _locked(sharedhome.homes_dir(cache) / f"{key}.lock", shared=True):
                shared = sharedhome.mirror(home, cache, key)
                archive = own if shared is None else shared_archive(shared)
                startup = _startup(archive, shared, home)
                with _locked(archive.with_suffix(".lock")):
                    if force or not _verified(archive):
                        _build_archive(archive, startup.env(), timeout)
                    _point(pointer, startup, home)
            found = current(directory)
            if found is None:
                raise TransactionalError(f"the class-data-sharing archive {archive} was built but does not verify: "
                                         f"remove {cache} and run `airflow-txn spark-cds` again")
    prune(found, directory)
    return found


def _point(pointer: Path, startup: Startup, install: Path) -> None:
    """Record which archive (and shared home) this install's drivers are given."""
    staged = pointer.with_suffix(".json.tmp")
    staged.write_text(json.dumps({
        "archive": str(startup.archive), "spark_home": str(startup.spark_home) if startup.spark_home else None,
        "jars": sharedhome.jar_stats(startup.spark_home) if startup.spark_home else None,
        "install": str(install.resolve()), "java": java_binary()}))
    os.replace(staged, pointer)


def _build_archive(path: Path, env: Mapping[str, str], timeout: float) -> None:
    with tempfile.TemporaryDirectory(prefix="airflow-txn-cds-") as tmp:
        job, staged = Path(tmp) / "warmup.py", path.with_name(f"{path.name}.{os.getpid()}.tmp")
        job.write_text(WARMUP_JOB.read_text())
        try:
            started = time.monotonic()
            dumped = _spark_submit(f"{BUILD_JAVA_OPTIONS} -XX:ArchiveClassesAtExit={staged}", job, env, timeout)
            if dumped.returncode != 0 or not staged.exists():
                raise TransactionalError(
                    f"building the class-data-sharing archive failed ({dumped.returncode}); the JVM said:\n"
                    f"{dumped.stderr[-3000:]}\nSpark jobs run without it (set {SWITCH_ENV}=off to stop trying)")
            # -Xshare:on refuses to start with an archive it cannot use: the check is the real thing.
            checked = _spark_submit(f"{BUILD_JAVA_OPTIONS} -Xshare:on -XX:SharedArchiveFile={staged}", job, env,
                                    timeout)
            if checked.returncode != 0:
                raise TransactionalError(
                    "the class-data-sharing archive did not verify (a JVM under -Xshare:on refused it):\n"
                    f"{checked.stderr[-3000:]}\nSpark jobs run without it")
            os.replace(staged, path)
        finally:
            staged.unlink(missing_ok=True)
    sidecar = path.with_suffix(".json.tmp")
    sidecar.write_text(json.dumps({"identity": _identity(path), "java": java_binary(),
                                   "built_in_seconds": round(time.monotonic() - started, 1)}))
    os.replace(sidecar, path.with_suffix(".json"))
    log.info("built the class-data-sharing archive %s", path)


def prune(keep: Startup, directory: Path | None = None) -> list[Path]:
    """Remove what no JVM of this machine can be given any more (an archive is about 180 MB; a
    shared home keeps a deleted install's jars alive, about 450 MB).

    That is an install's pointer whose Java or Spark install is gone (a deleted checkout or
    virtualenv) or which this install's newer pointer superseded (Java or the jars changed); then
    every archive and shared home no remaining pointer names. One being built or pointed at (its
    lock held) is left alone; a JVM that mapped a removed archive keeps its pages. Returns what
    was removed.
    """
    cache = directory or cache_dir()
    here, mine = spark_home(), pointer_path(directory)
    live: set[Path] = set()
    removed: list[Path] = []
    for pointer in sorted(cache.glob("install-*.json")):
        recorded = _read_json(pointer)
        java, install = recorded.get("java"), Path(recorded.get("install") or "/nonexistent")
        gone = not (java and os.path.exists(java)) or not (install / "jars").is_dir()
        superseded = pointer != mine and here is not None and install == here.resolve()
        if (gone or superseded) and _remove_unlocked(pointer.with_suffix(".lock"), pointer):
            removed.append(pointer)
            continue
        live.update(Path(p) for p in (recorded.get("archive"), recorded.get("spark_home")) if p)
    live.update(p for p in (keep.archive, keep.spark_home) if p)
    for archive in sorted([*cache.glob("spark-cds-*.jsa"), *sharedhome.homes_dir(cache).glob("*/cds-*.jsa")]):
        if archive not in live:
            if _remove_unlocked(archive.with_suffix(".lock"), archive, archive.with_suffix(".json")):
                removed.append(archive)
    homes = sharedhome.homes_dir(cache)
    for shared in sorted(homes.iterdir()) if homes.is_dir() else ():
        if shared.is_dir() and not shared.name.startswith(".") and shared not in live:
            if _remove_unlocked(homes / f"{shared.name}.lock", shared):
                removed.append(shared)
    for path in removed:
        log.info("removed %s (no install of this machine can use it any more)", path)
    return removed


def _remove_unlocked(lock_path: Path, *paths: Path) -> bool:
    """Remove ``paths`` (then their lock file) unless someone holds ``lock_path``."""
    with open(lock_path, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        for path in paths:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        lock_path.unlink(missing_ok=True)
    return True


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return {}
