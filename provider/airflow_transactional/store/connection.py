"""Connections to PostgreSQL, and keeping credentials out of every log line."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg2
import psycopg2.extensions
import psycopg2.extras

log = logging.getLogger(__name__)

_URI_PASSWORD = re.compile(r"(://[^:/@]+:)([^@]*)(@)")
_KV_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)

# Errors after which a connection is unusable and must be replaced.
CONNECTION_ERRORS = (psycopg2.OperationalError, psycopg2.InterfaceError)


def redact(text: str) -> str:
    """Replace any password in a connection URI or key=value DSN with ``***``."""
    return _KV_PASSWORD.sub(r"\1***", _URI_PASSWORD.sub(r"\1***\3", text))


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
            try:
                self._conn = psycopg2.connect(self._dsn, application_name=self._application_name)
            except psycopg2.OperationalError as exc:
                # libpq messages can echo the DSN; never let a password through.
                raise psycopg2.OperationalError(redact(str(exc))) from None
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


def json_adapt(value: Any) -> psycopg2.extras.Json:
    return psycopg2.extras.Json(value)
