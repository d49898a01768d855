"""The plan task on a real PostgreSQL: an empty batch whose predecessor has committed is committed
by the plan task itself (its metrics sent once, from there), and the commit task then only finds
it committed; an empty batch that must wait, or whose commit fails, is left to the commit task."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_transactional.airflow import metrics
from airflow_transactional.airflow.hooks import TransactionalHook
from airflow_transactional.airflow.operators import CommitOperator, PlanOperator
from airflow_transactional.coordinator import Coordinator
from airflow_transactional.processing import process_batch
from dev import faults
from tests.helpers import click, click_fn, counting_topology, make_log

pytestmark = pytest.mark.integration


@pytest.fixture
def store(coordinator: Coordinator, dsn: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Coordinator]:
    """The clicks topology on an empty log; the tasks' connection points at this database."""
    monkeypatch.setattr(TransactionalHook, "get_dsn", lambda self: dsn)
    monkeypatch.setattr(TransactionalHook, "state_schema", lambda self: coordinator.schema)
    log = make_log(dsn)
    coordinator.register(counting_topology())
    yield coordinator
    log.close()


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The txids whose commit metrics were sent."""
    txids: list[int] = []
    monkeypatch.setattr(metrics, "committed", lambda topology_id, *, txid, **_: txids.append(txid))
    return txids


def context(run_id: str) -> dict[str, Any]:
    started = datetime.now().astimezone() - timedelta(seconds=5)
    return {"run_id": run_id, "dag_run": SimpleNamespace(start_date=started), "outlet_events": {}}


def plan(run_id: str) -> dict[str, Any]:
    op = PlanOperator(task_id="plan", topology=counting_topology().to_config(), transactional_conn_id="store")
    return op.take_turn(context(run_id), deadline=0.0, fresh=True, may_wait=False)


def commit(run_id: str) -> dict[str, Any]:
    op = CommitOperator(task_id="commit", topology=counting_topology().to_config(), transactional_conn_id="store")
    return op.take_turn(context(run_id), deadline=0.0, fresh=True, may_wait=False)


def test_an_empty_batch_whose_turn_has_come_is_committed_by_its_plan_task(store: Coordinator,
                                                                          sent: list[int]) -> None:
    planned = plan("run-1")
    assert planned == {"txid": 1, "records": 0, "status": "committed"}
    assert store.status("clicks").committed_txid == 1
    [entry] = store.commits("clicks")
    assert entry["txid"] == 1 and entry["records_read"] == 0
    assert sent == [1]
    # The commit task finds it committed: nothing to do, no metrics a second time.
    assert commit("run-1")["committed"] is False
    assert sent == [1]
    assert plan("run-1") == planned  # a retry of the plan task replays its plan


def test_an_empty_batch_behind_an_uncommitted_one_is_left_to_its_commit_task(store: Coordinator, dsn: str,
                                                                            sent: list[int]) -> None:
    log = make_log(dsn, "clicks")  # the same log, another handle
    log.append([click(i) for i in range(20)])
    first = plan("run-1")
    assert first["records"] == 20 and first["status"] == "planned"
    assert plan("run-2") == {"txid": 2, "records": 0, "status": "planned"}  # txid 1 is not committed
    process_batch(store, "clicks", 1, click_fn)
    assert commit("run-1")["committed"] is True
    assert commit("run-2")["committed"] is True
    assert [c["txid"] for c in store.commits("clicks")] == [1, 2]
    assert sent == [1, 2]
    log.close()


def test_an_empty_batch_the_plan_task_cannot_commit_is_left_to_its_commit_task(store: Coordinator,
                                                                              sent: list[int]) -> None:
    with faults.inject("commit.after_append:clicks:1", "raise"):
        assert plan("run-1")["status"] == "planned"  # planned all the same: the plan task did its job
    assert store.status("clicks").committed_txid == 0 and sent == []
    assert commit("run-1")["committed"] is True
    assert sent == [1]
