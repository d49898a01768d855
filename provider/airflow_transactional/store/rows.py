"""Named rows: every query of the provider's own tables returns a row type whose fields are
matched to the result's column names, never unpacked by position."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from psycopg2 import sql
from psycopg2.extensions import cursor as Cursor

R = TypeVar("R")


__all__ = ["Cursor", "column_list", "every", "one", "only", "scalar", "table"]


def table(schema: str, name: str) -> sql.Composed:
    """A table of the provider's schema."""
    return sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(name))


def column_list(names: Iterable[str]) -> sql.Composed:
    """``a, b, c``: quoted column names."""
    return sql.SQL(", ").join(map(sql.Identifier, names))


def _named(cur: Cursor, row: tuple[Any, ...], row_type: Callable[..., R]) -> R:
    return row_type(**{col.name: value for col, value in zip(cur.description, row, strict=True)})


def one(cur: Cursor, row_type: Callable[..., R]) -> R | None:
    """The next row of ``cur`` as ``row_type`` (fields by column name), or None."""
    row = cur.fetchone()
    return None if row is None else _named(cur, row, row_type)


def only(cur: Cursor, row_type: Callable[..., R]) -> R:
    """The one row a query always returns (an aggregate, a row locked by its key), as ``row_type``."""
    found = one(cur, row_type)
    if found is None:
        raise ValueError(f"expected a row for {row_type.__name__}, got none")
    return found


def every(cur: Cursor, row_type: Callable[..., R]) -> list[R]:
    """The remaining rows of ``cur`` as ``row_type`` (fields by column name)."""
    return [_named(cur, row, row_type) for row in cur.fetchall()]


def scalar(cur: Cursor) -> Any:
    """The single value of a one-row, one-column result."""
    row = cur.fetchone()
    if row is None or len(row) != 1:
        raise ValueError(f"expected one value, got {row!r}")
    return row[0]
