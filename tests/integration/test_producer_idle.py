"""A producer that appends to a log and leaves its transaction open holds the log's partition
locks -- the ones a topology's commit takes to append its output events there. Its transaction
is ended once idle for the door's bound, so the commit waits seconds, not for as long as the
producer likes: tried as the producer role on a real PostgreSQL."""

from __future__ import annotations

import json
import time

import psycopg2
import pytest

from airflow_transactional.coordinator import Coordinator
from airflow_transactional.processing import process_batch
from airflow_transactional.sources import EventLog
from tests.helpers import click, query
from tests.integration.test_privileges import Roles, _feed, roles  # noqa: F401 (the fixture)

pytestmark = pytest.mark.integration


def test_a_producer_idle_in_its_transaction_cannot_hold_an_output_logs_commit(roles: Roles) -> None:  # noqa: F811
    """Regression: a producer of the ledger that appended and left its transaction open made every
    commit appending to the ledger wait its whole lock wait, then fail -- again at every retry."""
    EventLog(roles.dsn_of("producer"), "clicks").append([click(i, user="ann", amount=i) for i in range(3)])
    runtime = Coordinator(roles.dsn_of("runtime"))
    txn = runtime.plan("clicks", "r1")
    process_batch(runtime, "clicks", txn.txid, _feed)
    holder = psycopg2.connect(roles.dsn_of("producer"))  # autocommit off: a transaction opens and stays open
    with holder.cursor() as cur:
        cur.execute("SELECT appended FROM airflow_txn.append_events('feed', ARRAY[0, 1], ARRAY['dep-1', 'dep-2'], "
                    "ARRAY['{}', '{}'])")
        assert cur.fetchone() == (2,)
    try:
        started = time.monotonic()
        assert runtime.commit("clicks", txn.txid).committed  # not LogLocked after the commit's lock wait
        waited = time.monotonic() - started
        with pytest.raises(psycopg2.OperationalError), holder.cursor() as cur:
            cur.execute("SELECT 1")  # the idle transaction was ended, and with it the session
    finally:
        holder.close()
        runtime.close()
    assert waited < 15, waited
    events = dict(query(roles.dsn_of("owner"), "SELECT event_id, payload FROM airflow_txn.log_events "
                                               "WHERE log_name = 'feed'"))
    assert "dep-1" not in events and "dep-2" not in events  # never committed: rolled back, not half-kept
    assert {json.loads(p)["user"] for i, p in events.items() if i.startswith("clicks:")} == {"ann"}


def test_a_producer_that_commits_at_once_is_not_cut_short(roles: Roles) -> None:  # noqa: F811
    """The bound ends idle transactions only: a producer's session survives its appends and the
    pauses between its transactions."""
    conn = psycopg2.connect(roles.dsn_of("producer"))
    try:
        for i in range(2):
            with conn, conn.cursor() as cur:
                cur.execute("SELECT appended FROM airflow_txn.append_events('feed', ARRAY[0], ARRAY[%s], "
                            "ARRAY['{}'])", (f"dep-{i}",))
                assert cur.fetchone() == (1,)
            time.sleep(6)  # idle outside a transaction: no bound
        with conn.cursor() as cur:
            cur.execute("SHOW idle_in_transaction_session_timeout")
            assert cur.fetchone() == ("0",)  # the session's own setting, untouched between transactions
    finally:
        conn.close()
