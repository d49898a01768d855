"""One copy of a Spark install's jars per content, so every install of them shares one start-up archive.

A JVM maps a class-data-sharing archive only for the classpath it was built on, checked jar by
jar -- path, size and modification time -- so two virtualenvs holding the same pyspark would each
need an archive of their own (about 180 MB; three checkouts kept 550 MB of them). :func:`mirror`
hard-links the install's ``jars/`` and ``bin/`` into ``<cache>/spark-homes/<content digest>/``:
no byte is copied, every install of the same jars (and the same launch scripts) finds the same
directory, and a driver started with ``SPARK_HOME`` there runs the very same bytes from paths
that never change -- so one archive built there serves them all (``spark/cds.py``).

Where a link cannot be made (the cache on another file system, another owner's files under
``fs.protected_hardlinks``) there is no mirror, and the install gets an archive of its own.
A mirror outlives the install it was linked from (its links keep the bytes), so it is removed
when no install of this machine points at it any more (:func:`cds.prune`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

#: The parts of a Spark install a driver's launch reads: the launch scripts and the classpath.
PARTS = ("bin", "jars")


def homes_dir(cache: Path) -> Path:
    return cache / "spark-homes"


def _files(home: Path) -> Iterator[tuple[str, Path]]:
    """(part, file) for every file of ``home``'s :data:`PARTS`, in a fixed order."""
    for part in PARTS:
        for path in sorted((home / part).iterdir()) if (home / part).is_dir() else ():
            if path.is_file():
                yield part, path


def content_key(home: Path) -> str:
    """A digest of what a driver started from ``home`` runs: every file of its ``bin/`` and ``jars/``
    by name and bytes (read once per ``airflow-txn spark-cds``, never per task)."""
    digest = hashlib.sha256()
    for part, path in _files(home):
        file_digest = hashlib.sha256()
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                file_digest.update(chunk)
        digest.update(f"{part}/{path.name}:{os.stat(path).st_mode & 0o111:o}:{file_digest.hexdigest()}\n".encode())
    return digest.hexdigest()[:16]


def mirror(home: Path, cache: Path, key: str) -> Path | None:
    """The shared Spark home holding ``home``'s launch scripts and jars (made if missing), ``key``
    its :func:`content_key`; None where hard links cannot be made here."""
    homes = homes_dir(cache)
    homes.mkdir(mode=0o700, exist_ok=True)
    target = homes / key
    if target.is_dir():
        return target
    staged = homes / f".{target.name}.{os.getpid()}.tmp"
    try:
        for part in PARTS:
            (staged / part).mkdir(parents=True, mode=0o700)
        for part, path in _files(home):
            os.link(path.resolve(), staged / part / path.name)
        os.rename(staged, target)
    except OSError:
        shutil.rmtree(staged, ignore_errors=True)
        return target if target.is_dir() else None  # another install made it first, or no links here
    return target


def unchanged(home: Path, recorded: dict[str, list[int]]) -> bool:
    """Whether ``home``'s jars are still those ``recorded`` (:func:`jar_stats`) when its archive was
    built: a JVM refuses an archive once one of them was touched."""
    try:
        return jar_stats(home) == recorded
    except OSError:
        return False


def jar_stats(home: Path) -> dict[str, list[int]]:
    """name -> [size, mtime in seconds] of each jar under ``home``: what a JVM checks of each."""
    return {p.name: [st.st_size, int(st.st_mtime)]
            for p in sorted((home / "jars").glob("*.jar")) for st in (p.stat(),)}
