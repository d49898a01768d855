"""store/migrations.py: the provider's schema is brought to the latest version once, in order,
under a lock (concurrent workers starting at once do not race), and an up-to-date schema runs no
DDL at all."""

from __future__ import annotations

import threading
import uuid

import psycopg2
import pytest
from psycopg2.extensions import make_dsn, parse_dsn

from airflow_transactional.exceptions import ConfigError
from airflow_transactional.store.connection import Database
from airflow_transactional.store.migrations import MIGRATIONS, current_version, migrate
from dev.embedded import EmbeddedPostgres
from tests.helpers import query

pytestmark = pytest.mark.integration


def test_a_fresh_schema_gets_every_migration_in_order_then_none(dsn: str) -> None:
    db = Database(dsn)
    try:
        assert current_version(db, "fresh") == 0
        assert migrate(db, "fresh") == [v for v, _, _ in MIGRATIONS] == list(range(1, len(MIGRATIONS) + 1))
        assert current_version(db, "fresh") == MIGRATIONS[-1][0]
        assert migrate(db, "fresh") == []
        assert query(dsn, "SELECT version, name FROM fresh.schema_migrations ORDER BY version") == \
            [(v, n) for v, n, _ in MIGRATIONS]
    finally:
        db.close()


def test_workers_starting_at_once_apply_each_migration_once(dsn: str) -> None:
    applied: list[list[int]] = []
    errors: list[BaseException] = []

    def start() -> None:
        db = Database(dsn)
        try:
            applied.append(migrate(db, "racing"))
        except BaseException as exc:
            errors.append(exc)
        finally:
            db.close()

    workers = [threading.Thread(target=start) for _ in range(6)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    assert errors == []
    assert sorted(v for versions in applied for v in versions) == [v for v, _, _ in MIGRATIONS]


def test_an_up_to_date_schema_runs_no_ddl(pg: EmbeddedPostgres, dsn: str) -> None:
    # A role that may only read the migrations table: any DDL (even CREATE ... IF NOT EXISTS)
    # would be refused.
    db = Database(dsn)
    role = f"reader_{uuid.uuid4().hex[:6]}"
    try:
        migrate(db, "quiet")
        conn = psycopg2.connect(pg.admin_dsn(parse_dsn(dsn)["dbname"]))
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'pw'")
            cur.execute(f"GRANT USAGE ON SCHEMA quiet TO {role}")
            cur.execute(f"GRANT SELECT ON quiet.schema_migrations TO {role}")
        conn.close()
        reader = Database(make_dsn(dsn, user=role, password="pw"))
        try:
            assert migrate(reader, "quiet") == []
        finally:
            reader.close()
    finally:
        db.close()


def test_a_bad_schema_name_is_refused_before_any_sql(dsn: str) -> None:
    db = Database(dsn)
    try:
        with pytest.raises(ConfigError, match="schema name"):
            migrate(db, "Bad; DROP")
    finally:
        db.close()


def test_a_next_version_applies_once_on_top_of_the_baseline(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner stays for the releases to come: a new file is one more version, applied once."""
    db = Database(dsn)
    try:
        assert migrate(db, "grown") == [v for v, _, _ in MIGRATIONS]
        following = MIGRATIONS[-1][0] + 1
        monkeypatch.setattr("airflow_transactional.store.migrations.MIGRATIONS",
                            [*MIGRATIONS, (following, "a note per topology",
                                           "ALTER TABLE {s}.topologies ADD COLUMN note text")])
        assert migrate(db, "grown") == [following] and migrate(db, "grown") == []
        assert query(dsn, "SELECT count(*) FROM information_schema.columns WHERE table_schema = 'grown' "
                          "AND table_name = 'topologies' AND column_name = 'note'") == [(1,)]
    finally:
        db.close()


@pytest.mark.parametrize("versions", [
    [(1, "transaction core"), (7, "decision conflicts found when attempts complete")],
    [(1, "baseline"), (2, "read digests and publications"), (7, "offsets skipped")],
    [(1, "baseline")],
], ids=["first-line", "second-line", "second-line-first-version"])
def test_a_schema_of_an_unreleased_development_version_is_refused_naming_the_fix(
        dsn: str, versions: list[tuple[int, str]]) -> None:
    """Two development lines before the first release were each squashed into one file (versions
    1-7 twice): a schema either made would look up to date, or be upgraded from the wrong place,
    and lack what the first release has."""
    query(dsn, "CREATE SCHEMA old; CREATE TABLE old.schema_migrations (version integer PRIMARY KEY, name text, "
               "applied_at timestamptz DEFAULT now())")
    for version, name in versions:
        query(dsn, "INSERT INTO old.schema_migrations (version, name) VALUES (%s, %s)", (version, name))
    db = Database(dsn)
    try:
        with pytest.raises(ConfigError, match=rf"unreleased version.*1 \({versions[0][1]}\).*recreate it"):
            migrate(db, "old")
    finally:
        db.close()


def test_a_schema_made_by_the_migration_files_folded_since_is_refused_naming_the_fix(dsn: str) -> None:
    """Versions 2-9 were folded into the first file before the first release: a store they made
    has every table, but not the checks the folded file adds (verified_through within the commits)."""
    query(dsn, "CREATE SCHEMA old; CREATE TABLE old.schema_migrations (version integer PRIMARY KEY, name text, "
               "applied_at timestamptz DEFAULT now())")
    query(dsn, "INSERT INTO old.schema_migrations (version, name) VALUES (1, 'first release'), (9, 'verification')")
    db = Database(dsn)
    try:
        with pytest.raises(ConfigError, match=r"unreleased version.*migrations 9 \(verification\).*recreate it"):
            migrate(db, "old")
    finally:
        db.close()
