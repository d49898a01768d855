"""core/rebuild.py: each rebuild has an id and a liveness lock; an aborted one can never swap,
a live one is not aborted by accident."""

from __future__ import annotations

import time

import pytest

from airflow_transactional.coordinator import Coordinator
from airflow_transactional.core import rebuild
from airflow_transactional.exceptions import RebuildInProgress
from tests.helpers import click, counting_topology, make_log, run_one

pytestmark = pytest.mark.integration


def _abort_once_the_session_is_gone(coordinator: Coordinator, timeout: float = 10.0) -> bool:
    """``abort`` without force; the server ends a closed session's backend (and frees its lock)
    a moment after the client hung up -- under load, after the next call may have come."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return coordinator.abort_rebuild("clicks")
        except RebuildInProgress:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_an_aborted_rebuild_can_never_swap_and_a_live_one_is_not_aborted_by_accident(dsn: str) -> None:
    make_log(dsn).append([click(i) for i in range(30)])
    owner, operator = Coordinator(dsn), Coordinator(dsn)
    try:
        owner.register(counting_topology())
        run_one(owner, "clicks", "r1")
        mine = rebuild.begin(owner.store, "clicks")
        with pytest.raises(RebuildInProgress, match=r"still running.*--force"):
            operator.abort_rebuild("clicks")
        with pytest.raises(RebuildInProgress, match="has a rebuild running"):
            rebuild.begin(operator.store, "clicks")
        assert operator.abort_rebuild("clicks", force=True)
        with pytest.raises(Exception, match=f"rebuild {mine.rebuild_id} .* was aborted or replaced"):
            rebuild.swap(owner.store, mine)
        assert not owner.abort_rebuild("clicks", started=mine)  # its own clean-up touches nothing else
        theirs = rebuild.begin(operator.store, "clicks")  # the lock is free again
        assert theirs.rebuild_id != mine.rebuild_id
        operator.close()  # its process died: the lock goes with the session
        assert _abort_once_the_session_is_gone(owner)  # no --force needed for a dead rebuild
    finally:
        owner.close()
        operator.close()


def test_a_reader_whose_snapshot_predates_the_swap_still_sees_the_old_state(dsn: str) -> None:
    """Regression: the swap emptied the state table with TRUNCATE, which is not MVCC-safe: a reader
    holding a snapshot taken before it saw an empty table, not the old state."""
    import psycopg2

    from tests.helpers import query

    make_log(dsn).append([click(i) for i in range(30)])
    owner = Coordinator(dsn)
    reader = psycopg2.connect(dsn)
    try:
        owner.register(counting_topology())
        run_one(owner, "clicks", "r1")
        before = query(dsn, "SELECT user_id, value FROM clicks_count ORDER BY 1")
        mine = rebuild.begin(owner.store, "clicks")
        # The recomputation (here: the same values, one of them changed, one key gone).
        load = "airflow_txn.rebuild_1_clicks_count"
        query(dsn, f"INSERT INTO {load} SELECT user_id, value FROM clicks_count")
        query(dsn, f"UPDATE {load} SET value = value + 100 WHERE user_id = 'u1'")
        query(dsn, f"DELETE FROM {load} WHERE user_id = 'u2'")
        query(dsn, "INSERT INTO airflow_txn.rebuild_1_clicks_amount SELECT user_id, value FROM clicks_amount")
        reader.set_session(isolation_level="REPEATABLE READ")
        with reader.cursor() as cur:
            cur.execute("SELECT 1")  # the snapshot is taken; the state table not touched yet
            rebuild.swap(owner.store, mine)
            cur.execute("SELECT user_id, value FROM clicks_count ORDER BY 1")
            assert cur.fetchall() == before
        reader.rollback()
        after = dict(query(dsn, "SELECT user_id, value FROM clicks_count"))
        assert after == {u: v + (100 if u == "u1" else 0) for u, v in before if u != "u2"}
    finally:
        reader.close()
        owner.close()
