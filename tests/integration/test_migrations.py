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


def test_attempts_recorded_before_decision_conflicts_have_their_window_made_conflicts(
        dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Version 6 checked a pipelined attempt's requests again at its commit, against the txids
    # committed after it completed; version 7 finds those when attempts complete. An attempt
    # recorded by version 6 and not yet committed keeps its check through the migration.
    db = Database(dsn)
    try:
        monkeypatch.setattr("airflow_transactional.store.migrations.MIGRATIONS", MIGRATIONS[:6])
        assert migrate(db, "older")[-1] == 6
        query(dsn, "INSERT INTO older.topologies (topology_id, spec, committed_txid) VALUES ('t', '{}', 2)")
        # Committed txid 2 decided r1; txid 3 was recorded with txid 2 committed; txid 4 with
        # txid 1 committed, so its commit must still leave out r1 and settle r3 against txid 3.
        for txid, checked, ids in ((2, 1, ["r1", "r2"]), (3, 2, ["r3"]), (4, 1, ["r1", "r3", "r4"])):
            query(dsn, "INSERT INTO older.decision_checks VALUES ('t', 'pay', %s, 1, %s, %s)",
                  (txid, checked, len(ids)))
            for r in ids:
                query(dsn, "INSERT INTO older.decision_requests VALUES ('t', 'pay', %s, %s, 1, 0, '[\"a\"]', -1, -1)",
                      (r, txid))
        monkeypatch.undo()
        assert migrate(db, "older") == [7]
        assert query(dsn, "SELECT txid, request_id FROM older.decision_conflicts ORDER BY 1, 2") == \
            [(4, "r1"), (4, "r3")]
    finally:
        db.close()
