"""What the database itself knows: whether a table or schema exists, a table's columns, the
clock, session advisory locks, and the few statements that act on a whole table."""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

from psycopg2 import sql

from .rows import Cursor, scalar


def exists(cur: Cursor, table: sql.Composed) -> bool:
    """Whether ``table`` exists. Checked before each CREATE: ``CREATE ... IF NOT EXISTS`` needs
    the CREATE privilege even when there is nothing to create, and a run-time role has none."""
    cur.execute("SELECT to_regclass(%s) IS NOT NULL", (table.as_string(cur),))
    return bool(scalar(cur))


def comment(cur: Cursor, table: sql.Composed) -> str | None:
    """The comment on ``table`` (None: none)."""
    cur.execute("SELECT obj_description(to_regclass(%s), 'pg_class')", (table.as_string(cur),))
    return scalar(cur)


def owned(cur: Cursor, table: sql.Composed) -> bool:
    """Whether the current user owns ``table`` (or is a member of its owner): may alter or comment on it."""
    cur.execute("SELECT pg_has_role(relowner, 'USAGE') FROM pg_class WHERE oid = to_regclass(%s)",
                (table.as_string(cur),))
    return bool(scalar(cur))


def schema_exists(cur: Cursor, schema: str) -> bool:
    cur.execute("SELECT to_regnamespace(%s) IS NOT NULL", (sql.Identifier(schema).as_string(cur),))
    return bool(scalar(cur))


def columns(cur: Cursor, schema: str, table: str) -> dict[str, str]:
    """Column name -> type (as ``format_type`` spells it) of ``schema.table``, in column order."""
    cur.execute("SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
                "WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped "
                "ORDER BY a.attnum", (sql.Identifier(schema, table).as_string(cur),))
    return {str(name): str(type_) for name, type_ in cur.fetchall()}


class Role(NamedTuple):
    """What the server says of a role, as seen by the current user."""

    superuser: bool
    bypasses_rls: bool
    is_me: bool  # the current user, or a member of it: it has (or may take) the current user's rights


def role(cur: Cursor, name: str) -> Role | None:
    """The role ``name`` (None: there is no such role)."""
    cur.execute("SELECT rolsuper AS superuser, rolbypassrls AS bypasses_rls, "
                "pg_has_role(rolname, current_user, 'MEMBER') AS is_me FROM pg_roles WHERE rolname = %s", (name,))
    row = cur.fetchone()
    return None if row is None else Role(*map(bool, row))


def now(cur: Cursor) -> datetime:
    """The database's clock (``clock_timestamp()``): one time for everything a step records."""
    cur.execute("SELECT clock_timestamp()")
    return scalar(cur)


def try_lock(cur: Cursor, key: int) -> bool:
    """Take a session advisory lock; False when another session holds it."""
    cur.execute("SELECT pg_try_advisory_lock(%s)", (key,))
    return bool(scalar(cur))


def unlock(cur: Cursor, key: int) -> None:
    cur.execute("SELECT pg_advisory_unlock(%s)", (key,))


def drop(cur: Cursor, table: sql.Composed, *, if_exists: bool = False) -> None:
    cur.execute(sql.SQL("DROP TABLE {}{}").format(sql.SQL("IF EXISTS " if if_exists else ""), table))


def count(cur: Cursor, table: sql.Composed) -> int:
    cur.execute(sql.SQL("SELECT count(*) FROM {}").format(table))
    return int(scalar(cur))
