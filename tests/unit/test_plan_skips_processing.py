"""The plan task of an empty batch it committed skips the processing task there and then, so that
task never waits for a slot of the Spark pool only to skip (the demo's two cores queued empty
batches behind real ones for a minute)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import DownstreamTasksSkipped

from airflow_transactional import PostgresLogSource, StateSpec
from airflow_transactional.airflow.dag import transactional_dag
from airflow_transactional.airflow.operators import PlanOperator
from airflow_transactional.model import PlannedBatch, Transaction

pytestmark = pytest.mark.unit

WORDS_JOB = str(Path(__file__).resolve().parents[2] / "spark_jobs" / "words.py")


class FakeStore:
    def __enter__(self) -> FakeStore:
        return self

    def __exit__(self, *_exc: object) -> None:
        return None

    def register(self, _spec: object) -> None:
        return None


class FakeTI:
    map_index = -1

    def __init__(self) -> None:
        self.pushed: list[tuple[str, Any]] = []

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed.append((key, value))


def _plan(monkeypatch: pytest.MonkeyPatch, records: int, status: str) -> PlanOperator:
    dag = transactional_dag("t_words", source=PostgresLogSource("tweets"),
                            states=[StateSpec("url_counts", {"url": "text"}, combiner="count")],
                            application=WORDS_JOB, schedule=timedelta(minutes=5))
    txn = Transaction("t_words", 3, "run-3", 1, {}, {}, PlannedBatch(), records, status, datetime.now(UTC),
                      datetime.now(UTC) if status == "committed" else None, None)
    monkeypatch.setattr(PlanOperator, "coordinator", lambda self: FakeStore())
    monkeypatch.setattr(PlanOperator, "wait_turn", lambda self, *_a, **_k: txn)
    plan = dag.get_task("plan")
    assert isinstance(plan, PlanOperator)
    return plan


def test_an_empty_batch_it_committed_skips_the_processing_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    plan, ti = _plan(monkeypatch, 0, "committed"), FakeTI()
    with pytest.raises(DownstreamTasksSkipped) as skipped:
        plan.take_turn({"ti": ti, "run_id": "run-3"}, deadline=0.0, fresh=True)
    assert skipped.value.tasks == ["process"]
    assert ("return_value", {"txid": 3, "records": 0, "status": "committed"}) in ti.pushed  # as returning it would
    assert any(key == "skipmixin_key" for key, _ in ti.pushed)  # a clear of the process task skips it again


@pytest.mark.parametrize(("records", "status"), [(5, "planned"), (0, "planned")])
def test_a_batch_to_process_or_not_yet_committed_leaves_the_processing_be(
        monkeypatch: pytest.MonkeyPatch, records: int, status: str) -> None:
    plan, ti = _plan(monkeypatch, records, status), FakeTI()
    plan.commit_empty = False  # an empty batch whose predecessor has not committed: its own tasks decide
    assert plan.take_turn({"ti": ti, "run_id": "run-3"}, deadline=0.0, fresh=True) == {
        "txid": 3, "records": records, "status": status}
    assert ti.pushed == []
