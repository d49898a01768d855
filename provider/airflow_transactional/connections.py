"""Where the provider's connections come from, and keeping their secrets out of every log line:
the state store's DSN (a mode-600 file or the environment), the redaction of a DSN's password,
the errors after which a connection must be replaced, and where other connections' settings
come from (:class:`Connections`: a Kafka connection's librdkafka settings, an S3 or HDFS one's)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import psycopg2
import psycopg2.extensions

from .exceptions import ConfigError

__all__ = ["CONNECTION_ERRORS", "DSN_ENV", "DSN_FILE_ENV", "Connections", "dsn_and_connections", "from_environment",
           "read_dsn_file", "redact", "safe_error", "settings_of", "store_dsn"]

#: Where the state store's DSN comes from when no one passes it: a file (mode 600) named by the
#: first, else the second itself (what ``airflow-txn``, a driver run by hand and :func:`store_dsn` read).
DSN_FILE_ENV = "AIRFLOW_TXN_DSN_FILE"
DSN_ENV = "AIRFLOW_TXN_DSN"

# The password of a URI runs to the last ``@`` of its authority: an unencoded ``@`` in it must not
# leave its tail in sight.
_URI_PASSWORD = re.compile(r"(://[^:/@\s]+:)([^/\s]*)(@[^@/\s]*)")
_KV_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)

# Errors after which a connection is unusable and must be replaced.
CONNECTION_ERRORS = (psycopg2.OperationalError, psycopg2.InterfaceError)


def redact(text: str) -> str:
    """Replace any password in a connection URI or key=value DSN with ``***``."""
    return _KV_PASSWORD.sub(r"\1***", _URI_PASSWORD.sub(r"\1***\3", text))


_QUOTED = re.compile(r'"[^"]*"')


def _secrets(dsn: str) -> list[str]:
    """The password of ``dsn`` and the pieces libpq may show of it, longest first: in a URI whose
    password holds an unencoded ``@``, libpq takes what follows the first ``@`` for the host
    ("could not translate host name ...")."""
    found: list[str] = []
    match = _URI_PASSWORD.search(dsn)
    if match:
        password = match.group(2)
        tails = [password.split("@", i)[-1] for i in range(1, password.count("@") + 1)]
        found += [password, *tails]
        # what libpq took for the host begins with the tail: mask it with its "@", however short
        return sorted({f for f in found if len(f) >= 3} | {f"{t}@" for t in tails}, key=len, reverse=True)
    else:
        try:
            found.append(psycopg2.extensions.parse_dsn(dsn).get("password") or "")
        except psycopg2.Error:
            found += [m.group(2).strip("'") for m in _KV_PASSWORD.finditer(dsn)]
    return sorted({f for f in found if len(f) >= 3}, key=len, reverse=True)


def safe_error(message: str, dsn: str = "") -> str:
    """A connection error without secrets: any piece of the DSN's password is masked, and a parse
    error's quoted piece of the DSN is dropped."""
    text = message
    for secret in _secrets(dsn):
        text = text.replace(secret, "***")
    text = redact(text).strip()
    return _QUOTED.sub('"***"', text) if text.startswith("invalid") else text


def read_dsn_file(path: str, *, owner_only: bool = True, unreadable_hint: str = "") -> str:
    """The DSN kept in ``path``. ``owner_only``: refuse a file others may read (like ``~/.pgpass``)
    -- not in a driver, where the cluster manager decides the mode of a shipped file."""
    try:
        mode = os.stat(path).st_mode
        dsn = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(f"cannot read the DSN file {path}: {exc.strerror}{unreadable_hint}") from None
    if owner_only and mode & 0o077:
        raise ConfigError(f"the DSN file {path} can be read by other users: chmod 600 {path}")
    if not dsn:
        raise ConfigError(f"the DSN file {path} is empty: write the state store's DSN or URI in it")
    return dsn


def store_dsn() -> str:
    """The state store's DSN from the environment, as ``airflow-txn`` finds it: the file named by
    ``$AIRFLOW_TXN_DSN_FILE`` (mode 600: what the demo's banner exports), else ``$AIRFLOW_TXN_DSN``.
    For a producer's script: ``EventLog(store_dsn(), "clicks")`` -- no password on a command line."""
    if os.environ.get(DSN_FILE_ENV):
        return read_dsn_file(os.environ[DSN_FILE_ENV])
    if os.environ.get(DSN_ENV):
        return os.environ[DSN_ENV]
    raise ConfigError(f"no state store in the environment: export {DSN_FILE_ENV}=FILE (a mode-600 file holding the "
                      f"DSN, as the demo's banner does) or {DSN_ENV}=postgresql://user:password@host:5432/db")


#: Resolves a connection id to its settings (a Kafka connection's ``extra``).
Resolver = Callable[[str], dict[str, Any]]


def settings_of(conn_type: str | None, *, host: str | None = None, port: int | None = None,
                login: str | None = None, password: str | None = None,
                extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What a source reads of an Airflow connection, by its type: a ``kafka`` connection's extra (the
    librdkafka settings); an ``aws`` connection's extra with its login and password as the access key
    and secret (the Amazon provider's fields); a ``webhdfs`` one's extra with its host, port and login."""
    settings = dict(extra or {})
    if conn_type == "aws" and login:
        settings.update(aws_access_key_id=login, aws_secret_access_key=password or "")
    elif conn_type in ("webhdfs", "hdfs"):
        settings.update({k: v for k, v in (("host", host), ("port", port), ("login", login)) if v})
    return settings


def dsn_and_connections(text: str) -> tuple[str, dict[str, dict[str, Any]]]:
    """A DSN file's text as the DSN and the source connections' settings kept with it: a DSN alone,
    or JSON ``{"dsn": ..., "connections": {id: settings}}`` (what a driver is handed, and what a
    shell keeps to read the status of a topology whose source holds a secret)."""
    if not text.lstrip().startswith("{"):
        return text, {}
    try:
        held = json.loads(text)
        return str(held["dsn"]), {str(k): dict(v) for k, v in (held.get("connections") or {}).items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ConfigError('the DSN file holds JSON that is not {"dsn": ..., "connections": {...}}') from None


def from_environment(conn_id: str) -> dict[str, Any]:
    """A connection as Airflow reads it from the environment: ``AIRFLOW_CONN_<ID>`` in JSON
    (:func:`settings_of`)."""
    name = f"AIRFLOW_CONN_{conn_id.upper()}"
    raw = os.environ.get(name)
    if not raw:
        raise ConfigError(f"no connection {conn_id!r}: define it in Airflow (of the type its source reads: kafka, "
                          f"aws or webhdfs), set {name} to it in JSON (e.g. '{{\"conn_type\": \"kafka\", \"extra\": "
                          "{\"bootstrap.servers\": \"host:9092\"}}'), or -- for one holding a secret -- keep it in the "
                          f"mode-600 DSN file: {DSN_FILE_ENV}=FILE holding {{\"dsn\": ..., \"connections\": "
                          f"{{\"{conn_id}\": {{...}}}}}}")
    try:
        conn = json.loads(raw)
        extra = conn.get("extra") or {}
        extra = json.loads(extra) if isinstance(extra, str) else extra
    except (ValueError, AttributeError):
        raise ConfigError(f"{name} is not a connection in JSON ({{\"conn_type\": \"kafka\", \"extra\": {{...}}}})") \
            from None
    if not isinstance(extra, dict):
        raise ConfigError(f"the extra of connection {conn_id!r} must be an object")
    port = conn.get("port")
    return settings_of(conn.get("conn_type"), host=conn.get("host"), port=int(port) if port else None,
                       login=conn.get("login"), password=conn.get("password"), extra=extra)


class Connections:
    """Where connections' settings come from, handed to whoever resolves one -- never a process-wide
    setting: ``resolve`` (conn id -> settings; default :func:`from_environment`, ``AIRFLOW_CONN_<ID>``
    as Airflow spells it) after the ``known`` settings. In a task the hook hands one that reads
    Airflow's connections and secrets backends to its coordinator; a Spark driver's holds the
    settings shipped with its DSN, never read from the environment of a process ``ps`` shows."""

    def __init__(self, resolve: Resolver | None = None, *,
                 known: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        self._resolve = resolve or from_environment
        self._known = {str(k): dict(v) for k, v in (known or {}).items()}

    def __repr__(self) -> str:  # names, never settings
        return f"Connections(known={sorted(self._known)}, resolve={getattr(self._resolve, '__name__', '?')})"

    def settings(self, conn_id: str) -> dict[str, Any]:
        """The settings of connection ``conn_id`` (a copy: the caller may change it)."""
        return dict(self._known[conn_id]) if conn_id in self._known else dict(self._resolve(conn_id))
