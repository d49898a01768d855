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
import os
import stat
from collections.abc import Iterator
from typing import NamedTuple


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


def digest(fd: int) -> str:
    """The SHA-256 of everything ``fd`` reads from its start."""
    sha = hashlib.sha256()
    os.lseek(fd, 0, os.SEEK_SET)
    while block := os.read(fd, 1 << 20):
        sha.update(block)
    return sha.hexdigest()


def identify(path: str) -> tuple[Identity, str] | None:
    """The identity and digest of the regular file named ``path``, from one descriptor; None when
    there is no such file (gone, a link, not regular)."""
    try:
        fd = open_landed(path)
    except NotLanded:
        return None
    try:
        return identity(fd), digest(fd)
    finally:
        os.close(fd)


def lines(fd: int, sha: hashlib._Hash) -> Iterator[bytes]:
    """The lines ``fd`` reads, each added to ``sha`` as it goes (the descriptor is closed after)."""
    with os.fdopen(fd, "rb") as fh:
        for line in fh:
            sha.update(line)
            yield line
