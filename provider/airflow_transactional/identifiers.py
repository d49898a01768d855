"""Validation of every name that ends up in SQL: topology ids, states, tables, columns, types.

Names are validated here and then always quoted with ``psycopg2.sql.Identifier``; no SQL text is
ever built from an unvalidated string.
"""

from __future__ import annotations

import re

from .exceptions import ConfigError

# Lower-case, starts with a letter, matched whole (``fullmatch``: a trailing newline is not
# let through as ``$`` would). SQL reserved words (``user``, ``order``) are allowed: every name
# reaches SQL through ``sql.Identifier``, which always quotes it -- keep it that way. (In psql a
# user types such a column as ``"user"``.)
_NAME = re.compile(r"[a-z][a-z0-9_]*")
_MAX_TOPOLOGY = 40
_MAX_NAME = 50

RESERVED_COLUMNS = frozenset({"value", "prev_value", "txid", "attempt"})

# The SQL types a key or value column may have, mapped to their canonical spelling.
SQL_TYPES = {
    "text": "text",
    "bigint": "bigint",
    "int8": "bigint",
    "integer": "integer",
    "int": "integer",
    "int4": "integer",
    "numeric": "numeric",
    "double precision": "double precision",
    "float8": "double precision",
    "date": "date",
    "timestamptz": "timestamp with time zone",
    "timestamp with time zone": "timestamp with time zone",
    "boolean": "boolean",
    "bool": "boolean",
}


def _check(kind: str, name: object, max_len: int) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name) or len(name) > max_len:
        raise ConfigError(
            f"invalid {kind} {name!r}: use 1-{max_len} characters of lower-case letters, digits "
            "and '_', starting with a letter (e.g. 'url_counts')"
        )
    return name


def topology_id(name: object) -> str:
    """Validate a topology id."""
    return _check("topology id", name, _MAX_TOPOLOGY)


def name(kind: str, value: object) -> str:
    """Validate a state, source, log, column or schema name."""
    checked = _check(kind, value, _MAX_NAME)
    if kind == "schema name" and (checked.startswith("pg_") or checked == "information_schema"):
        raise ConfigError(f"schema {checked!r} belongs to PostgreSQL itself: name a schema of your own "
                          "(e.g. 'public' or 'analytics')")
    return checked


def column(value: object) -> str:
    """Validate a user column name (key column); the provider's own column names are reserved."""
    col = _check("column name", value, _MAX_NAME)
    if col in RESERVED_COLUMNS:
        raise ConfigError(
            f"column name {col!r} is reserved for the provider ({', '.join(sorted(RESERVED_COLUMNS))}): "
            "rename the key column"
        )
    return col


def qualified_table(value: object, default_schema: str) -> tuple[str, str]:
    """Split ``schema.table`` (or ``table``) into validated (schema, table)."""
    if not isinstance(value, str):
        raise ConfigError(f"invalid table name {value!r}: give 'table' or 'schema.table'")
    parts = value.split(".")
    if len(parts) == 1:
        return name("schema name", default_schema), name("table name", parts[0])
    if len(parts) == 2:
        return name("schema name", parts[0]), name("table name", parts[1])
    raise ConfigError(f"invalid table name {value!r}: give 'table' or 'schema.table'")


def sql_type(value: object) -> str:
    """Canonical spelling of an allowed SQL column type."""
    key = value.strip().lower() if isinstance(value, str) else value
    if key not in SQL_TYPES:
        raise ConfigError(
            f"unsupported column type {value!r}: use one of {', '.join(sorted(set(SQL_TYPES.values())))}"
        )
    return SQL_TYPES[key]
