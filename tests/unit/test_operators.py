"""When a waiting task gives up its slot: the txid it waits for failed for good, by Postgres's
record or by Airflow's view of that txid's run (a task killed on its last try records nothing)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from airflow_transactional.operators import CommitOperator

pytestmark = pytest.mark.unit


class FakeCoordinator:
    def __init__(self, pending: tuple[int, str] | None, recorded: str | None = None) -> None:
        self.pending, self.recorded = pending, recorded
        self.marked: list[tuple[int, str]] = []

    def blocker(self, topology_id: str, txid: int) -> str | None:
        return self.recorded

    def first_pending(self, topology_id: str, before_txid: int) -> tuple[int, str] | None:
        return self.pending

    def mark_failed(self, topology_id: str, txid: int, reason: str) -> None:
        self.marked.append((txid, reason))


class FakeTI:
    dag_id = "words"

    def __init__(self, *states: str | Exception) -> None:
        self.states, self.asked = list(states), []

    def get_dagrun_state(self, dag_id: str, run_id: str) -> str:
        self.asked.append((dag_id, run_id))
        state = self.states.pop(0)
        if isinstance(state, Exception):
            raise state
        return state


def commit(grace: float = 0.0) -> CommitOperator:
    op = CommitOperator(task_id="commit", topology={"topology_id": "words"}, blocked_grace=timedelta(seconds=grace))
    op.airflow_check_interval = 0.0
    return op


def test_a_predecessor_killed_on_its_last_try_blocks_and_is_recorded() -> None:
    coord, ti = FakeCoordinator(pending=(7, "run-7")), FakeTI("failed")
    blocked = commit().still_blocked(coord, 9, [], {"ti": ti})  # type: ignore[arg-type]
    assert blocked is not None and blocked.startswith("blocked by txid 7 (run run-7): its Airflow run failed")
    assert "Clear that run's tasks" in blocked
    assert ti.asked == [("words", "run-7")]
    assert [t for t, _ in coord.marked] == [7]  # airflow-txn status names it too


def test_a_running_predecessor_is_waited_for() -> None:
    coord = FakeCoordinator(pending=(7, "run-7"))
    assert commit().still_blocked(coord, 9, [], {"ti": FakeTI("running")}) is None  # type: ignore[arg-type]
    assert coord.marked == []


def test_a_queued_predecessor_gets_the_slot_after_the_grace() -> None:
    # Cleared, then queued behind the max_active_runs slots its waiters hold: they must let go.
    op, coord, since = commit(grace=3600), FakeCoordinator(pending=(7, "run-7")), []
    ti = FakeTI("queued", "running", "queued")
    assert op.still_blocked(coord, 9, since, {"ti": ti}) is None and since  # within the grace
    assert op.still_blocked(coord, 9, since, {"ti": ti}) is None and not since  # it started: waiting again
    op.blocked_grace = timedelta(0)
    blocked = op.still_blocked(coord, 9, since, {"ti": ti})
    assert blocked is not None and "queued and cannot start" in blocked
    assert coord.marked == []  # a queued run is about to be retried: not failed


def test_a_predecessor_marked_success_without_committing_blocks() -> None:
    coord = FakeCoordinator(pending=(7, "run-7"))
    blocked = commit().still_blocked(coord, 9, [], {"ti": FakeTI("success")})  # type: ignore[arg-type]
    assert blocked is not None and "finished without committing txid 7" in blocked
    assert [t for t, _ in coord.marked] == [7]


def test_no_airflow_answer_and_no_record_means_waiting() -> None:
    # A run key that is no run of this DAG (planned by a tool), or the API away for a moment.
    coord = FakeCoordinator(pending=(7, "by-hand"))
    assert commit().still_blocked(coord, 9, [], {"ti": FakeTI(RuntimeError("404"))}) is None  # type: ignore[arg-type]
    assert commit().still_blocked(FakeCoordinator(pending=None), 9, [], {"ti": FakeTI()}) is None  # type: ignore[arg-type]


def test_the_record_in_postgres_needs_no_question_to_airflow() -> None:
    ti = FakeTI()
    coord = FakeCoordinator(pending=(7, "run-7"), recorded="blocked by failed txid 7 (run run-7): boom")
    assert commit().still_blocked(coord, 9, [], {"ti": ti}) == coord.recorded  # type: ignore[arg-type]
    assert ti.asked == []


def test_airflow_is_asked_at_most_every_interval() -> None:
    op, coord = commit(grace=3600), FakeCoordinator(pending=(7, "run-7"))
    op.airflow_check_interval = 3600.0
    ti = FakeTI("running", "failed")
    context: dict[str, Any] = {"ti": ti}
    for _ in range(5):
        assert op.still_blocked(coord, 9, [], context) is None  # type: ignore[arg-type]
    assert len(ti.asked) == 1
