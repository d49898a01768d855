"""store/topologies.py, transactions.py, attempts.py, commits.py and catalog.py on a real Postgres:
each row type names columns the table has, and every field of a row read through them holds the
value of the column of its name (checked against an independent ``SELECT *``)."""

from __future__ import annotations

import dataclasses
from typing import Any

import psycopg2
import psycopg2.extras
import pytest

from airflow_transactional.coordinator import Coordinator
from airflow_transactional.core import attempts as core_attempts
from airflow_transactional.model import DEFAULT_SCHEMA as S
from airflow_transactional.processing import process_batch
from airflow_transactional.store import attempts, catalog, commits, topologies, transactions
from tests.helpers import click, counting_topology, make_log, run_one

pytestmark = pytest.mark.integration

TXN_FIELDS = [f.name for f in dataclasses.fields(transactions.Transaction)]


def rows(dsn: str, statement: str, params: Any = None) -> list[dict[str, Any]]:
    with psycopg2.connect(dsn) as conn, conn.cursor(cursor_factory=psycopg2.extras.RealDictCursor) as cur:
        cur.execute(statement, params)
        found = [dict(r) for r in cur.fetchall()]
    conn.close()
    return found


@pytest.fixture
def two_txids(coordinator: Coordinator, dsn: str) -> Coordinator:
    """clicks: txid 1 committed, txid 2 planned with a failed and a complete attempt."""
    make_log(dsn).append([click(i) for i in range(80)])
    coordinator.register(counting_topology())
    run_one(coordinator, "clicks", "r1")
    txid = coordinator.plan("clicks", "r2").txid
    attempt, _ = core_attempts.begin_attempt(coordinator.store, "clicks", txid)
    core_attempts.fail_attempt(coordinator.store, attempt, "boom")
    process_batch(coordinator, "clicks", txid, lambda r: [("clicks_count", (r["user"],), 1)])
    return coordinator


def test_every_row_type_names_columns_of_its_table(two_txids: Coordinator) -> None:
    with two_txids.store.db.transaction() as cur:
        for names, table in [(topologies.TopologyRow._fields, "topologies"), (TXN_FIELDS, "transactions"),
                             (commits.CommitRecord._fields, "commits"), (attempts.Outcome._fields, "attempts"),
                             (attempts.Finished._fields, "attempts")]:
            have = catalog.columns(cur, S, table)
            assert len(have) > 5
            assert set(names) <= set(have), (table, set(names) - set(have))
        assert set(commits.QUARANTINE_COLUMNS) <= set(catalog.columns(cur, S, "quarantine"))


def test_rows_read_through_the_store_equal_the_columns_of_their_names(two_txids: Coordinator, dsn: str) -> None:
    [topology] = rows(dsn, f"SELECT * FROM {S}.topologies")
    by_txid = {r["txid"]: r for r in rows(dsn, f"SELECT * FROM {S}.transactions")}
    [logged] = rows(dsn, f"SELECT * FROM {S}.commits")
    with two_txids.store.db.transaction() as cur:
        got = topologies.get(cur, S, "clicks")
        assert got is not None and got._asdict() == {f: topology[f] for f in topologies.TopologyRow._fields}
        for txid in (1, 2):
            txn = transactions.get(cur, S, "clicks", txid)
            want = {f: by_txid[txid][f] for f in TXN_FIELDS}
            assert txn is not None and {f: getattr(txn, f) for f in TXN_FIELDS} == want  # batch: as its JSON
        assert transactions.get(cur, S, "clicks", 3) is None
        [entry] = commits.log(cur, S, "clicks")
        assert entry._asdict() == {f: logged[f] for f in commits.CommitRecord._fields}
        assert commits.get(cur, S, "clicks", 1) == (logged["committed_at"], logged["attempt"])
        assert transactions.planned(cur, S, "clicks") == [(2, "r2")]
        assert transactions.last(cur, S, "clicks") == (2, by_txid[2]["end_offsets"])
        [flight] = transactions.in_flight(cur, S, "clicks")
        assert (flight.txid, flight.attempts, flight.latest_status, flight.latest_error) == (2, 2, "complete", None)
        outcome = attempts.latest_outcome(cur, S, "clicks", 2, plan_version=1)
        assert outcome is not None and outcome.attempt == 2 and outcome.records_read == 30
        finished = attempts.latest_finished(cur, S, "clicks", 2)
        assert finished is not None and finished.attempt == 2
        assert topologies.rebuild_mark(cur, S, "clicks") == (None, None)
        assert topologies.progress(cur, S, "clicks").last_commit_at == logged["committed_at"]
        assert commits.quarantine_counts(cur, S, "clicks") == (0, 0)


def test_a_failed_txid_is_found_and_lifted(two_txids: Coordinator) -> None:
    with two_txids.store.db.transaction() as cur:
        assert transactions.first_failed_before(cur, S, "clicks", 3) is None
        transactions.mark_failed(cur, S, "clicks", 2, "x" * 5000)
        failed = transactions.first_failed_before(cur, S, "clicks", 3)
        assert failed is not None and (failed.txid, failed.run_key, len(failed.failure or "")) == (2, "r2", 2000)
        assert transactions.first_failed_before(cur, S, "clicks", 2) is None  # only earlier txids block
        transactions.lift_failed(cur, S, "clicks", 2)
        assert transactions.first_failed_before(cur, S, "clicks", 3) is None
