"""Versioned, idempotent migrations of the provider's own schema (never ``public``).

Each migration runs once, in order, in the transaction that records it, under an advisory lock
so concurrent workers starting at once do not race. Migrating needs only ownership of the
schema (or CREATE on the database to create it), no superuser; once the schema is up to date
nothing here runs DDL, so a run-time role with DML rights alone works (docs/guides/security.md).
"""

from __future__ import annotations

import logging
import zlib
from importlib import resources

from psycopg2 import sql

from .. import identifiers
from ..exceptions import ConfigError
from ..model import DEFAULT_SCHEMA
from . import catalog
from .connection import Database
from .rows import table
from .statements import query

log = logging.getLogger(__name__)

#: Where the versions of the schema live: ``NNNN_what_it_does.sql``, applied in order.
SCHEMA_DIR = "schema"


def _load() -> list[tuple[int, str, str]]:
    """(version, name, statements) of every file in :data:`SCHEMA_DIR`, in version order."""
    found = []
    for entry in resources.files(__package__).joinpath(SCHEMA_DIR).iterdir():
        stem, _, ext = entry.name.partition(".")
        number, _, name = stem.partition("_")
        if ext == "sql" and number.isdigit():
            found.append((int(number), name.replace("_", " "), entry.read_text(encoding="utf-8")))
    return sorted(found)


# (version, name, statements). Never edit a released version: add a file.
MIGRATIONS: list[tuple[int, str, str]] = _load()


def _lock_key(schema: str) -> int:
    return zlib.crc32(f"airflow_transactional:{schema}".encode()) & 0x7FFFFFFF


def current_version(db: Database, schema: str = DEFAULT_SCHEMA) -> int:
    """The highest applied migration, 0 for an empty database. A schema whose versions are not
    this release's (a development version's, never published) is refused, naming the fix."""
    with db.transaction() as cur:
        if not catalog.exists(cur, table(schema, "schema_migrations")):
            return 0
        cur.execute(query("migration_applied", schema))
        applied = [(int(v), str(n)) for v, n in cur.fetchall()]
    known = {v: n for v, n, _ in MIGRATIONS}
    strange = [f"{v} ({n})" for v, n in applied if known.get(v) != n]
    if strange:
        raise ConfigError(f"schema {schema!r} was created by an unreleased version of the provider (its migrations "
                          f"{', '.join(strange)} are not this release's): recreate it -- drop the schema, "
                          f"or point the provider at a new one with the connection's extra state_schema")
    return max((v for v, _ in applied), default=0)


def migrate(db: Database, schema: str = DEFAULT_SCHEMA) -> list[int]:
    """Bring the schema to the latest version; return the versions applied now (often none)."""
    identifiers.name("schema name", schema)
    s = sql.Identifier(schema)
    applied: list[int] = []
    if current_version(db, schema) >= MIGRATIONS[-1][0]:
        return applied  # up to date: no DDL, so a run-time role without CREATE rights gets here
    with db.transaction() as cur:
        cur.execute(query("migration_lock"), {"key": _lock_key(schema)})
        if not catalog.schema_exists(cur, schema):  # owning the schema is enough; creating it needs CREATE
            cur.execute(query("migration_create_schema", schema))
        cur.execute(query("migration_create_table", schema))
        cur.execute(query("migration_applied", schema))
        done = {row[0] for row in cur.fetchall()}
        for version, name, statements in MIGRATIONS:
            if version in done:
                continue
            cur.execute(sql.SQL(statements).format(s=s))
            cur.execute(query("migration_record", schema), {"version": version, "name": name})
            applied.append(version)
            log.info("applied migration %d (%s) to schema %s", version, name, schema)
    return applied
