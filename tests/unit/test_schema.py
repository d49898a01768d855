"""The provider's schema is one file until the first release (store/schema/): a change before it
edits that file, so a new store is made by one file and the schema reads in one place. The rule
ends with the first release, which the changelog's first heading names: from then on each change
is a new file (store/migrations.py applies them in order)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from airflow_transactional.store.migrations import MIGRATIONS, SCHEMA_DIR

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def test_the_schema_is_one_file_until_the_first_release() -> None:
    first = next(line for line in (REPO / "docs" / "changelog.md").read_text().splitlines() if line.startswith("## "))
    files = sorted(p.name for p in (REPO / "provider" / "airflow_transactional" / "store" / SCHEMA_DIR).glob("*.sql"))
    if "unreleased" in first and re.match(r"## 0\.1\.0\b", first):
        assert files == ["0001_first_release.sql"], (
            f"{files}: before the first release a change to the schema edits 0001_first_release.sql (a "
            "store made by an earlier development version is refused, naming the fix); a new file is for "
            "a change after a release")
    assert [v for v, _, _ in MIGRATIONS] == list(range(1, len(files) + 1))
