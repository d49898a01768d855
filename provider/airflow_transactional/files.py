"""Files the provider writes for itself: private from the first byte, verified before reuse.

Anything the provider hands to a Spark driver (the ``--py-files`` zip of this package, the
driver's log4j config) or keeps secrets in (passwords, DSNs) is written here, never at a
predictable name in a shared temp directory: another local user who planted a file there would
get their code run with the state store's DSN in the environment. The rules:

* files live in a directory owned by the current user with mode 0700 (:func:`private_dir`);
* they are created 0600 and written atomically -- a temporary file in the same directory, then
  ``os.replace`` -- so nobody ever sees a half-written or world-readable one (:func:`write_private`);
* a file reused by name is checked first: owned by us, private, same content digest
  (:func:`artifact`).
"""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from pathlib import Path

from .exceptions import ConfigError

#: Where the provider keeps its per-user files (the class-data-sharing archive, the artifacts).
DIR_ENV = "AIRFLOW_TXN_CACHE_DIR"
_LEGACY_DIR_ENV = "AIRFLOW_TXN_SPARK_CDS_DIR"  # its older name, still honoured


def cache_dir() -> Path:
    """``$AIRFLOW_TXN_CACHE_DIR``, else ``$XDG_CACHE_HOME/airflow_transactional`` (``~/.cache``)."""
    configured = os.environ.get(DIR_ENV) or os.environ.get(_LEGACY_DIR_ENV)
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "airflow_transactional"


def _check_chain(path: Path) -> None:
    """Refuse a path another user could redirect: every directory on the way to ``path`` must be
    owned by this user or root and writable by nobody else (a sticky one such as ``/tmp``
    excepted: nobody else may rename what is in it), and every symbolic link on the way owned by
    this user or root (then its target's way is checked too). Components not made yet pass."""
    me = os.geteuid()
    current = Path(path.anchor or "/")
    for part in path.absolute().parts[1:]:
        current = current / part
        try:
            st = os.lstat(current)
        except FileNotFoundError:
            return  # made below by us, 0700
        why = None
        if st.st_uid not in (0, me):
            why = f"belongs to another user (uid {st.st_uid})"
        elif stat.S_ISLNK(st.st_mode):
            current = Path(os.path.realpath(current))
            _check_chain(current)
            continue
        elif stat.S_ISDIR(st.st_mode) and st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            why = "others may write in it (group or other write, no sticky bit)"
        if why is not None:
            raise ConfigError(f"the provider's private directory {path} is reached through {current}, which {why}: "
                              f"another user could swap what lies below it. Set {DIR_ENV} to a directory whose every "
                              "parent only you or root can write")


def private_dir(path: str | os.PathLike[str]) -> Path:
    """``path`` as a directory only the current user can enter (created 0700 if missing).

    Every directory and link on the way to it must be ours or root's, and writable by nobody
    else (:func:`_check_chain`): a shared parent (a shared ``XDG_CACHE_HOME``) would let another
    user swap the directory for one of theirs. An existing directory owned by someone else is
    refused: its owner could swap files in it. One of ours that others can reach is tightened to
    0700.
    """
    p = Path(path).absolute()
    _check_chain(p.parent)
    try:
        p.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create the provider's private directory {p} ({exc.strerror}): set {DIR_ENV} "
                          "to a directory this user can write") from None
    st = os.lstat(p)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{p} must be a directory, not a link or a file: remove it, or set {DIR_ENV} "
                          "to a directory of your own")
    if st.st_uid != os.geteuid():
        raise ConfigError(f"{p} belongs to another user (uid {st.st_uid}): the provider keeps its files only "
                          f"in a directory of its own user; set {DIR_ENV} to one")
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(p, 0o700)
    return p


def write_private(path: str | os.PathLike[str], data: bytes | str) -> Path:
    """Write ``data`` to ``path`` atomically, readable by its owner only (0600 from creation)."""
    target = Path(path)
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)  # 0600
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def open_private_log(path: str | os.PathLike[str]) -> int:
    """A file descriptor appending to ``path``, created 0600 (a component's log may hold secrets)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.fchmod(fd, 0o600)  # an older file may have been created with looser rights
    return fd


def _trusted(path: Path, digest: str) -> bool:
    """Whether ``path`` is a regular file of ours, private, with exactly the content of ``digest``."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077:
        return False
    return hashlib.sha256(path.read_bytes()).hexdigest() == digest


def artifact(stem: str, suffix: str, content: bytes, directory: Path | None = None) -> Path:
    """A private file holding ``content``, named by its digest: reused when verified, else
    (re)written. Call it right before each use: the directory's whole way and the file's digest are
    checked every time (a path remembered from an earlier call proves nothing now)."""
    digest = hashlib.sha256(content).hexdigest()
    home = private_dir((directory or cache_dir()) / "artifacts")
    target = home / f"{stem}-{digest[:16]}{suffix}"
    if not _trusted(target, digest):
        write_private(target, content)
    return target
