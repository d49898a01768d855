"""The named queries: every statement of the state store is in store/queries/*.sql under a
name no other query has, used by the code, and found by name with one grep."""

from __future__ import annotations

import pathlib
import re

import pytest

from airflow_transactional.store import statements as queries

PACKAGE = pathlib.Path(queries.__file__).parent.parent
FILES = sorted((PACKAGE / "store" / "queries").glob("*.sql"))


def test_every_query_file_opens_with_what_it_holds() -> None:
    assert FILES
    for path in FILES:
        assert path.read_text().startswith("-- "), f"{path.name} has no opening comment"


def test_names_are_unique_across_files() -> None:
    seen: dict[str, str] = {}
    for path in FILES:
        for name in re.findall(r"^-- name: (\S+)$", path.read_text(), re.MULTILINE):
            assert name not in seen, f"{name} is in {seen[name]} and {path.name}"
            seen[name] = path.name
    assert seen.keys() == queries._queries().keys()


def test_every_query_is_used_by_name() -> None:
    code = "\n".join(p.read_text() for p in PACKAGE.rglob("*.py"))
    unused = [n for n in queries._queries() if f'"{n}"' not in code]
    assert not unused, f"queries no code runs: {unused}"


def test_an_unknown_name_is_an_error_naming_it() -> None:
    with pytest.raises(KeyError, match="no_such_query"):
        queries.query("no_such_query", "s")


def test_the_schema_and_parts_are_quoted_identifiers() -> None:

    q = queries.query("migration_record", "my schema")
    assert [type(p).__name__ for p in q.seq][:3] == ["SQL", "Identifier", "SQL"]
    assert q.seq[1].strings == ("my schema",)
