"""Connections to PostgreSQL whose errors never carry the DSN's secrets."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg2
import psycopg2.extensions

from ..connections import CONNECTION_ERRORS, redact, safe_error
from ..exceptions import ConfigError

log = logging.getLogger(__name__)

# SQLSTATEs of a server going away (admin_shutdown, crash_shutdown, cannot_connect_now); class 08
# is a connection exception.
_SERVER_LEAVING = frozenset({"57P01", "57P02", "57P03"})


def lost_connection(exc: BaseException) -> bool:
    """Whether ``exc`` says the connection or the server went away (worth a retry on a new one),
    not that the statement failed: ``ProgramLimitExceeded`` and its kin are OperationalErrors too,
    and retrying them only repeats the failure."""
    if isinstance(exc, psycopg2.InterfaceError):
        return True
    if not isinstance(exc, psycopg2.OperationalError):
        return False
    code = getattr(exc, "pgcode", None)
    return code is None or code.startswith("08") or code in _SERVER_LEAVING


def connect(dsn: str, **kwargs: Any) -> psycopg2.extensions.connection:
    """``psycopg2.connect`` whose errors never carry the DSN's secrets.

    libpq quotes the offending piece of a DSN it cannot parse -- which may be the password
    (``invalid percent-encoded token: "s3cr%zz"``). A DSN that does not parse is a
    :class:`ConfigError` naming the fix; a server that cannot be reached stays an
    ``OperationalError`` (callers retry those), with any password redacted.
    """
    try:
        return psycopg2.connect(dsn, **kwargs)
    except psycopg2.OperationalError as exc:
        raise psycopg2.OperationalError(safe_error(str(exc), dsn)) from None
    except psycopg2.Error as exc:
        why = safe_error(str(exc), dsn)
        raise ConfigError(f"the PostgreSQL DSN is malformed ({why}): give key=value pairs "
                          "(host=... dbname=... user=...) or a URI postgresql://user:password@host:port/db; "
                          "in a URI, percent-encode special characters of the password") from None


class Database:
    """One lazily opened connection to a Postgres database, reopened after it is lost.

    Every unit of work runs in :meth:`transaction`: one database transaction, committed on
    success and rolled back on any exception.
    """

    def __init__(self, dsn: str, *, application_name: str = "airflow_transactional") -> None:
        self._dsn = dsn
        self._application_name = application_name
        self._conn: psycopg2.extensions.connection | None = None

    def __repr__(self) -> str:
        return f"Database({redact(self._dsn)!r})"

    @property
    def dsn(self) -> str:
        return self._dsn

    def connection(self) -> psycopg2.extensions.connection:
        if self._conn is None or self._conn.closed:
            self._conn = connect(self._dsn, application_name=self._application_name)
        return self._conn

    @contextmanager
    def transaction(self) -> Iterator[psycopg2.extensions.cursor]:
        """Run a block in one database transaction and yield its cursor."""
        conn = self.connection()
        try:
            with conn, conn.cursor() as cur:
                yield cur
        except CONNECTION_ERRORS:
            self.close()
            raise

    def backend_pid(self) -> int:
        return int(self.connection().get_backend_pid())

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:  # already broken; nothing else to release
                log.debug("closing a broken connection failed", exc_info=True)
            self._conn = None
