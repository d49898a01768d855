"""Where the provider's connections come from, and keeping their secrets out of every log line:
the state store's DSN (a mode-600 file or the environment), the redaction of a DSN's password,
and the errors after which a connection must be replaced."""

from __future__ import annotations

import os
import re
from pathlib import Path

import psycopg2
import psycopg2.extensions

from .exceptions import ConfigError

__all__ = ["CONNECTION_ERRORS", "DSN_ENV", "DSN_FILE_ENV", "read_dsn_file", "redact", "safe_error", "store_dsn"]

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
