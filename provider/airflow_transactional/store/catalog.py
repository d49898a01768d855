"""What the database itself knows: whether a table or schema exists, a table's columns, the
clock, and the few statements that act on a whole table."""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

from psycopg2 import sql

from .rows import Cursor, one, scalar
from .statements import query


def exists(cur: Cursor, table: sql.Composed) -> bool:
    """Whether ``table`` exists. Checked before each CREATE: ``CREATE ... IF NOT EXISTS`` needs
    the CREATE privilege even when there is nothing to create, and a run-time role has none."""
    cur.execute(query("catalog_exists"), {"name": table.as_string(cur)})
    return bool(scalar(cur))


def comment(cur: Cursor, table: sql.Composed) -> str | None:
    """The comment on ``table`` (None: none)."""
    cur.execute(query("catalog_comment"), {"name": table.as_string(cur)})
    return scalar(cur)


def owned(cur: Cursor, table: sql.Composed) -> bool:
    """Whether the current user owns ``table`` (or is a member of its owner): may alter or comment on it."""
    cur.execute(query("catalog_owned"), {"name": table.as_string(cur)})
    return bool(scalar(cur))


def schema_exists(cur: Cursor, schema: str) -> bool:
    cur.execute(query("catalog_schema_exists"), {"name": sql.Identifier(schema).as_string(cur)})
    return bool(scalar(cur))


def columns(cur: Cursor, schema: str, table: str) -> dict[str, str]:
    """Column name -> type (as ``format_type`` spells it) of ``schema.table``, in column order."""
    cur.execute(query("catalog_columns"), {"name": sql.Identifier(schema, table).as_string(cur)})
    return {str(name): str(type_) for name, type_ in cur.fetchall()}


class Role(NamedTuple):
    """What the server says of a role, as seen by the current user."""

    superuser: bool
    bypasses_rls: bool
    is_me: bool  # the current user, or a member of it: it has (or may take) the current user's rights


def role(cur: Cursor, name: str) -> Role | None:
    """The role ``name`` (None: there is no such role)."""
    cur.execute(query("catalog_role"), {"name": name})
    return one(cur, Role)


def shares_rights(cur: Cursor, a: str, b: str) -> bool:
    """Whether role ``a`` is a member of role ``b`` or ``b`` of ``a`` (or they are one role)."""
    cur.execute(query("catalog_shares_rights"), {"a": a, "b": b})
    return bool(scalar(cur))


def now(cur: Cursor) -> datetime:
    """The database's clock: one time for everything a step records."""
    cur.execute(query("catalog_now"))
    return scalar(cur)


def server_version(cur: Cursor) -> str:
    cur.execute(query("catalog_version"))
    return str(scalar(cur))


def set_comment(cur: Cursor, table: sql.Composed, text: str) -> None:
    cur.execute(query("catalog_set_comment", table=table, comment=sql.Literal(text)))


def rename(cur: Cursor, table: sql.Composed, name: str) -> None:
    """Rename ``table`` to ``name`` in its schema: what refers to it (views, grants) follows."""
    cur.execute(query("catalog_rename_table", table=table, name=sql.Identifier(name)))


class savepoint:
    """Run statements that may fail under a savepoint: :meth:`rollback` undoes them and keeps the
    transaction usable; leaving the block releases it."""

    def __init__(self, cur: Cursor, name: str) -> None:
        self.cur, self.name = cur, sql.Identifier(name)

    def __enter__(self) -> savepoint:
        self.cur.execute(query("savepoint", savepoint=self.name))
        return self

    def rollback(self) -> None:
        self.cur.execute(query("savepoint_rollback", savepoint=self.name))

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.cur.execute(query("savepoint_release", savepoint=self.name))


def drop(cur: Cursor, table: sql.Composed, *, if_exists: bool = False) -> None:
    cur.execute(query("drop_table_if_exists" if if_exists else "drop_table", table=table))


def count(cur: Cursor, table: sql.Composed) -> int:
    cur.execute(query("catalog_count", table=table))
    return int(scalar(cur))
