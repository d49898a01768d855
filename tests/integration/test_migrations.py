"""store/migrations.py: the provider's schema is brought to the latest version once, in order,
under a lock (concurrent workers starting at once do not race), and an up-to-date schema runs no
DDL at all."""

from __future__ import annotations

import json
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


def test_a_schema_of_an_unreleased_development_version_is_refused_naming_the_fix(dsn: str) -> None:
    """Versions 1-7 of the unreleased development line were squashed into one baseline: a schema
    they made would look up to date and lack what the baseline has."""
    query(dsn, "CREATE SCHEMA old; CREATE TABLE old.schema_migrations (version integer PRIMARY KEY, name text, "
               "applied_at timestamptz DEFAULT now()); INSERT INTO old.schema_migrations (version, name) "
               "VALUES (1, 'transaction core'), (7, 'decision conflicts found when attempts complete')")
    db = Database(dsn)
    try:
        with pytest.raises(ConfigError, match=r"unreleased version.*1 \(transaction core\).*recreate it"):
            migrate(db, "old")
    finally:
        db.close()


def test_an_upgrade_hands_an_old_runtime_role_the_commits_door_and_takes_its_log_rights(
        pg: EmbeddedPostgres, dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run-time role granted before migration 6 had UPDATE on a log's counter and INSERT on its
    events (for the commit's output events); after the upgrade its commits need append_outputs.
    The migration carries it over: the door granted, the old rights revoked -- at once, not at
    the owner's next grant."""
    role = f"old_runtime_{uuid.uuid4().hex[:6]}"
    admin = psycopg2.connect(pg.admin_dsn(parse_dsn(dsn)["dbname"]))
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f"CREATE ROLE {role} LOGIN")
    db = Database(dsn)
    try:
        monkeypatch.setattr("airflow_transactional.store.migrations.MIGRATIONS", MIGRATIONS[:5])
        assert migrate(db, "upgraded") == [1, 2, 3, 4, 5]
        query(dsn, f"GRANT USAGE ON SCHEMA upgraded TO {role}; "
                   f"GRANT UPDATE (next_lsn) ON upgraded.log_partitions TO {role}; "
                   f"GRANT INSERT ON upgraded.log_events TO {role}; "
                   f"GRANT UPDATE (sha256) ON upgraded.landing_files TO {role}")  # as grant did before
        monkeypatch.setattr("airflow_transactional.store.migrations.MIGRATIONS", MIGRATIONS)
        assert migrate(db, "upgraded")[0] == 6
        rights = query(dsn, f"SELECT has_column_privilege('{role}', 'upgraded.log_partitions', 'next_lsn', 'UPDATE'), "
                            f"has_table_privilege('{role}', 'upgraded.log_events', 'INSERT'), "
                            f"has_function_privilege('{role}', "
                            "'upgraded.append_outputs(text, integer, text[], text[])', 'EXECUTE'), "
                            f"has_column_privilege('{role}', 'upgraded.landing_files', 'plain', 'UPDATE')")
        assert rights == [(False, False, True, True)]
    finally:
        db.close()
        with admin.cursor() as cur:
            cur.execute("DROP SCHEMA upgraded CASCADE")
            cur.execute(f"DROP ROLE {role}")
        admin.close()


def test_an_upgrade_counts_what_the_kafka_commits_before_it_skipped(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Migration 7 adds the offsets a Kafka topology's commits skipped (planned offsets less the
    records read): for the commits made before it too, and only for Kafka topologies."""
    db = Database(dsn)
    try:
        monkeypatch.setattr("airflow_transactional.store.migrations.MIGRATIONS", MIGRATIONS[:6])
        migrate(db, "skips")
        commits = {("k", "kafka"): [(1, 10, 7), (2, 5, 5), (3, 0, 0)], ("l", "postgres_log"): [(1, 9, 4)]}
        for (topology, kind), rows in commits.items():
            query(dsn, "INSERT INTO skips.topologies (topology_id, spec) VALUES (%s, %s)",
                  (topology, json.dumps({"source": {"kind": kind}})))
            for txid, planned, read in rows:
                query(dsn, "INSERT INTO skips.transactions (topology_id, txid, run_key, start_offsets, end_offsets, "
                           "batch, planned_records, status) VALUES (%s, %s, %s, '{}', '{}', '{}', %s, 'committed')",
                      (topology, txid, f"r{txid}", planned))
                query(dsn, "INSERT INTO skips.commits (topology_id, txid, attempt, plan_version, run_key, "
                           "start_offsets, end_offsets, records_read, row_counts, quarantined, commit_started_at) "
                           "VALUES (%s, %s, %s, 1, %s, '{}', '{}', %s, '{}', 0, now())",
                      (topology, txid, 1 if planned else 0, f"r{txid}", read))
        monkeypatch.setattr("airflow_transactional.store.migrations.MIGRATIONS", MIGRATIONS)
        assert 7 in migrate(db, "skips")
        assert dict(query(dsn, "SELECT topology_id, offsets_skipped FROM skips.topologies")) == {"k": 3, "l": 0}
    finally:
        db.close()
        query(dsn, "DROP SCHEMA skips CASCADE")
