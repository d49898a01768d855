"""core/registration.py: a re-declared topology. A declaration that would change what committed
progress means is refused (``reset`` starts over); one DAG runs a topology."""

from __future__ import annotations

import pytest

from airflow_transactional.cli import main as cli
from airflow_transactional.coordinator import Coordinator
from airflow_transactional.exceptions import ConfigError, DeclarationChanged, TopologyOfAnotherDag
from airflow_transactional.sources import PostgresLogSource
from airflow_transactional.spec import DecisionSpec, StateSpec, TopologySpec
from tests.helpers import click, make_log, query, run_one, table

pytestmark = pytest.mark.integration


def words(source: PostgresLogSource, *, keys: dict[str, str] | None = None, dag_id: str | None = None,
          batch: int = 50) -> TopologySpec:
    return TopologySpec("drift", source, [StateSpec("drift_count", keys or {"user_id": "text"}, combiner="count")],
                        max_batch_size=batch, dag_id=dag_id)


def count_fn(rec: dict[str, object]) -> list[tuple[str, tuple[object, ...], int]]:
    return [("drift_count", (rec["user"],), 1)]


def test_a_changed_source_is_refused_once_batches_were_planned_and_reset_starts_over(coordinator: Coordinator,
                                                                                       dsn: str) -> None:
    old_log, new_log = make_log(dsn, "old_log"), make_log(dsn, "new_log")
    old_log.append([click(i) for i in range(10)])
    new_log.append([click(i + 100) for i in range(7)])
    coordinator.register(words(PostgresLogSource("old_log")))
    run_one(coordinator, "drift", "r1", count_fn)
    with pytest.raises(DeclarationChanged, match=r"old_log.*new_log.*airflow-txn reset drift --yes"):
        coordinator.register(words(PostgresLogSource("new_log")))
    with pytest.raises(DeclarationChanged, match="keys"):
        coordinator.register(words(PostgresLogSource("old_log"), keys={"user_id": "bigint"}))
    coordinator.register(words(PostgresLogSource("old_log"), batch=500))  # a batch cap may change
    assert coordinator.status("drift").committed_txid == 1

    assert cli(["--dsn", dsn, "reset", "drift"]) == 1  # without --yes: refused
    assert cli(["--dsn", dsn, "reset", "drift", "--yes"]) == 0
    coordinator.register(words(PostgresLogSource("new_log")))
    run_one(coordinator, "drift", "r1", count_fn)
    assert sum(table(dsn, "drift_count").values()) == 7  # all of the new log, none of the old one
    assert coordinator.status("drift").lag == 0


def test_a_declaration_may_change_freely_before_anything_was_planned(coordinator: Coordinator, dsn: str) -> None:
    make_log(dsn, "a_log")
    make_log(dsn, "b_log")
    coordinator.register(words(PostgresLogSource("a_log")))
    coordinator.register(words(PostgresLogSource("b_log")))
    assert coordinator.spec("drift").source == PostgresLogSource("b_log")


def test_two_dags_cannot_run_one_topology(coordinator: Coordinator, dsn: str) -> None:
    make_log(dsn, "shared").append([click(1)])
    coordinator.register(words(PostgresLogSource("shared"), dag_id="drift"))
    # Refused from the first registration, planned or not: the second DAG's runs would claim the
    # first one's txids (their run ids, e.g. scheduled__2024-01-01, match).
    with pytest.raises(TopologyOfAnotherDag, match="run by DAG 'drift', and DAG 'drift_copy' declares it too"):
        coordinator.register(words(PostgresLogSource("shared"), dag_id="drift_copy"))
    run_one(coordinator, "drift", "scheduled__1", count_fn)
    with pytest.raises(TopologyOfAnotherDag, match="airflow-txn reset drift --yes"):
        coordinator.register(words(PostgresLogSource("shared"), dag_id="drift_copy"))
    coordinator.register(words(PostgresLogSource("shared"), dag_id="drift"))  # its own DAG: fine


def test_a_store_nothing_was_registered_in_yet_lists_no_topologies(dsn: str) -> None:
    # The stall watch and the Transactions overview list the topologies before any DAG ran a plan.
    fresh = Coordinator(dsn, schema="txn_not_created_yet")
    try:
        assert fresh.topologies() == []
    finally:
        fresh.close()


@pytest.mark.parametrize(("state_table", "headroom", "where"), [
    ("airflow_txn.topologies", None, "the provider's schema 'airflow_txn'"),
    ("public.counts", "airflow_txn.turns", "the provider's schema 'airflow_txn'"),
    ("public.counts", "public.headroom", None),
], ids=["state in the provider's schema", "headroom in it", "the control"])
def test_a_state_table_or_headroom_in_the_providers_schema_is_refused(
        coordinator: Coordinator, dsn: str, state_table: str, headroom: str | None, where: str | None) -> None:
    """Regression: a state table named airflow_txn.topologies (the run-time role is granted INSERT
    and UPDATE on a state's table: the declarations) or a headroom on one of the provider's
    tables was registered and granted without a word."""
    spec = TopologySpec("inside", PostgresLogSource("clicks"), [
        StateSpec("counts", {"user_id": "text"}, combiner="sum", table=state_table)],
        decisions=[DecisionSpec("pay", state="counts", headroom=headroom)])
    if where is None:
        make_log(dsn)
        query(dsn, "CREATE TABLE public.headroom (user_id text PRIMARY KEY, value bigint)")
        coordinator.register(spec)
        return
    with pytest.raises(ConfigError, match=f"in {where}: put it in a schema of its own"):
        coordinator.register(spec)
    assert query(dsn, "SELECT count(*) FROM airflow_txn.topologies WHERE topology_id = 'inside'") == [(0,)]


def test_a_states_key_order_survives_the_store_so_a_record_functions_key_tuples_land_in_their_columns(
        dsn: str) -> None:
    """The store keeps a declaration as jsonb, which orders an object's keys its own way (shorter
    first): a process that reads the declaration back must still take ``(user, size)`` as declared."""
    keys = {"user_id": "text", "size": "text"}  # jsonb would keep "size" first

    def sized(rec: dict[str, object]) -> list[tuple[str, tuple[object, ...], int]]:
        return [("drift_count", (rec["user"], "big" if int(str(rec["amount"])) >= 5 else "small"), 1)]

    make_log(dsn).append([click(i) for i in range(20)])
    owner = Coordinator(dsn)
    owner.register(words(PostgresLogSource("clicks"), keys=keys))
    owner.close()
    fresh = Coordinator(dsn)  # reads the declaration from the store
    try:
        assert fresh.spec("drift").state("drift_count").key_columns == ["user_id", "size"]
        run_one(fresh, "drift", "r1", sized)
        assert {u for u, _s, _v in query(dsn, "SELECT user_id, size, value FROM drift_count")} == \
            {f"u{i}" for i in range(7)}
    finally:
        fresh.close()
