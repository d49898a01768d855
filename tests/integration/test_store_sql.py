"""The commit's SQL upsert follows the same value rules as the Python reference, key by key."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg2 import sql

from airflow_transactional.coordinator import Coordinator
from airflow_transactional.exceptions import ReplayBehindState
from airflow_transactional.sources import PostgresLogSource
from airflow_transactional.spec import StateSpec, TopologySpec
from airflow_transactional.store import state as q
from airflow_transactional.store.connection import Database
from airflow_transactional.values import (
    Combiner,
    OpaqueValue,
    TransactionalValue,
    ValueKind,
    apply_opaque,
    apply_transactional,
)
from tests.helpers import click, counting_topology, make_log, query, run_one, table

pytestmark = pytest.mark.integration

KEYS = ["a", "b", "c"]
# A sequence of (txid, {key: delta}) applications; txids never go backwards, and may repeat.
applications = st.lists(
    st.tuples(st.integers(0, 2), st.dictionaries(st.sampled_from(KEYS), st.integers(-50, 50), min_size=1)),
    min_size=1, max_size=8)


@pytest.mark.parametrize("kind", [ValueKind.TRANSACTIONAL, ValueKind.OPAQUE])
@pytest.mark.parametrize("combiner", list(Combiner))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=applications)
def test_sql_rule_equals_python_rule(dsn: str, kind: ValueKind, combiner: Combiner, steps) -> None:  # type: ignore[no-untyped-def]
    state = StateSpec("v", {"k": "text"}, combiner=combiner, kind=kind)
    db = Database(dsn)
    ref: dict[str, TransactionalValue | OpaqueValue] = {}
    rule = apply_transactional if kind is ValueKind.TRANSACTIONAL else apply_opaque
    try:
        with db.transaction() as cur:
            cur.execute("DROP TABLE IF EXISTS public.v")
            for stmt in q.create_state_table(state):
                cur.execute(stmt)
        txid = 1
        for bump, deltas in steps:
            txid += bump
            with db.transaction() as cur:
                cur.execute("CREATE TEMP TABLE d (k text, value bigint) ON COMMIT DROP")
                cur.executemany("INSERT INTO d VALUES (%s, %s)", list(deltas.items()))
                cur.execute(q.upsert(state, q.state_table(state), sql.SQL("SELECT * FROM d")), {"txid": txid})
            for k, delta in deltas.items():
                ref[k] = rule(ref.get(k), delta, txid, combiner)  # type: ignore[arg-type]
        with db.transaction() as cur:
            cur.execute("SELECT * FROM public.v")
            rows = cur.fetchall()
        if kind is ValueKind.TRANSACTIONAL:
            got = {k: TransactionalValue(v, t) for k, v, t in rows}
        else:
            got = {k: OpaqueValue(v, p, t) for k, v, p, t in rows}
        assert got == ref
    finally:
        db.close()


def test_a_replay_behind_the_state_is_refused_not_applied(dsn: str) -> None:
    from airflow_transactional.coordinator import Coordinator
    from tests.helpers import click, make_log, run_one

    coord = Coordinator(dsn)
    log = make_log(dsn)
    coord.register(counting_topology())
    log.append([click(i) for i in range(5)])
    run_one(coord, "clicks", "a")
    log.append([click(i) for i in range(5, 10)])
    txn = coord.plan("clicks", "b")
    from airflow_transactional.processing import process_batch
    from tests.helpers import click_fn

    process_batch(coord, "clicks", txn.txid, click_fn)
    # Someone restored the state table from a later backup: values carry txid 9.
    query(dsn, "UPDATE clicks_count SET txid = 9")
    before = query(dsn, "SELECT * FROM clicks_count ORDER BY 1")
    with pytest.raises(ReplayBehindState, match="rebuild it from the source"):
        coord.commit("clicks", txn.txid)
    assert query(dsn, "SELECT * FROM clicks_count ORDER BY 1") == before
    assert coord.status("clicks").committed_txid == 1
    coord.close()


def test_a_commit_that_applied_every_staged_key_does_not_look_for_keys_ahead(
        dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: the upsert of a sum runs under a savepoint, whose RELEASE reset the cursor's
    rowcount, so every commit of a count or sum state joined its delta with the state again to look
    for keys ahead of it -- a third of the commit's time."""
    from airflow_transactional.coordinator import Coordinator
    from airflow_transactional.core import apply
    from airflow_transactional.store import state as q
    from tests.helpers import click, make_log, run_one

    looked = []
    monkeypatch.setattr(apply.q, "rows_ahead", lambda *a: looked.append(a) or q.rows_ahead(*a))
    coord = Coordinator(dsn)
    log = make_log(dsn)
    spec = counting_topology()
    assert q.can_overflow(spec.states[0])  # the savepoint's path
    coord.register(spec)
    log.append([click(i) for i in range(5)])
    run_one(coord, "clicks", "a")
    log.append([click(i) for i in range(3, 9)])  # updates and new keys
    run_one(coord, "clicks", "b")
    assert looked == [] and coord.status("clicks").committed_txid == 2
    coord.close()


@pytest.mark.parametrize("kind", ["transactional", "opaque"])
def test_reserved_words_as_names_commit_because_every_name_is_quoted(coordinator: Coordinator, dsn: str,
                                                                     kind: str) -> None:
    make_log(dsn, "select").append([click(i) for i in range(20)])
    spec = TopologySpec("order", PostgresLogSource("select"),
                        [StateSpec("user", {"user": "text"}, combiner="sum", kind=kind, table="group")])
    coordinator.register(spec)

    def fn(rec: dict[str, object]) -> list[tuple[str, tuple[object, ...], object]]:
        return [("user", (rec["user"],), rec["amount"])]

    run_one(coordinator, "order", "r1", fn)
    assert sum(table(dsn, '"group"').values()) == sum(i % 11 for i in range(20))
