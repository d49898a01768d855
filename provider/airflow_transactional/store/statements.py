"""Named queries: every statement of the state store, in ``store/queries/*.sql`` (one file per
table or concern), found by name with one grep.

A file holds queries, each under a ``-- name: NAME`` line, its comment lines first (say why, not
what). Values are always parameters (``%(name)s``); identifiers -- the provider's schema ``{s}``,
a topology's tables, a state's key columns -- are composed in with ``psycopg2.sql`` (validated
names, quoted by :class:`~psycopg2.sql.Identifier`). Files are read once, when first needed.
"""

from __future__ import annotations

import functools
import re
from importlib import resources

from psycopg2 import sql

__all__ = ["query"]

_NAME = re.compile(r"^-- name: ([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)


@functools.cache
def _queries() -> dict[str, str]:
    found: dict[str, str] = {}
    for entry in sorted(resources.files(__package__).joinpath("queries").iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        parts = _NAME.split(entry.read_text(encoding="utf-8"))
        for name, body in zip(parts[1::2], parts[2::2], strict=True):
            if name in found:
                raise ValueError(f"query {name!r} is defined twice (store/queries/{entry.name})")
            # The comment lines before the statement are for readers; a fragment is composed into
            # another statement mid-line, where a comment would swallow the rest of that line.
            lines = body.strip().splitlines()
            while lines and lines[0].startswith("--"):
                lines.pop(0)
            found[name] = "\n".join(lines)
    return found


def query(name: str, schema: str | None = None, /, **parts: sql.Composable) -> sql.Composed:
    """The query ``name``, with the provider's ``schema`` as ``{s}`` and ``parts`` (identifiers,
    composed fragments) in its other placeholders."""
    text = _queries()[name]
    return sql.SQL(text).format(**({"s": sql.Identifier(schema)} if schema is not None else {}), **parts)
