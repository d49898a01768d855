"""When a waiting task gives up its slot: the txid it waits for failed for good, by Postgres's
record or by Airflow's view of that txid's run (a task killed on its last try records nothing)."""

from __future__ import annotations

import pytest
from airflow.sdk.exceptions import AirflowRuntimeError, ErrorType
from airflow.sdk.execution_time.comms import ErrorResponse

from airflow_transactional.airflow.operators import PlanOperator
from airflow_transactional.airflow.watch import Watch

pytestmark = pytest.mark.unit


class FakeCoordinator:
    def __init__(self, pending: tuple[int, str] | None, recorded: str | None = None,
                 planned: list[tuple[int, str]] | None = None, own: int | None = None,
                 attempt_error: str | None = None) -> None:
        self.pending, self.recorded, self.own, self.attempt_error = pending, recorded, own, attempt_error
        self.planned = list(planned or ([pending] if pending else []))
        self.marked: list[tuple[int, str]] = []
        self.adopted: list[tuple[int, str, str]] = []

    def blocker(self, topology_id: str, txid: int) -> str | None:
        return self.recorded

    def last_error(self, topology_id: str, txid: int) -> str | None:
        return self.attempt_error

    def first_pending(self, topology_id: str, before_txid: int) -> tuple[int, str] | None:
        return self.pending

    def mark_failed(self, topology_id: str, txid: int, reason: str) -> None:
        self.marked.append((txid, reason))

    def transaction_for_run(self, topology_id: str, run_key: str) -> object | None:
        return self.own

    def planned_runs(self, topology_id: str) -> list[tuple[int, str]]:
        return self.planned

    def adopt(self, topology_id: str, txid: int, old_run_key: str, new_run_key: str) -> object | None:
        self.adopted.append((txid, old_run_key, new_run_key))
        return txid


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


def api_error(status: int) -> AirflowRuntimeError:
    """What a Task SDK call raises when the api-server answers ``status`` (as the supervisor relays it)."""
    return AirflowRuntimeError(ErrorResponse(error=ErrorType.API_SERVER_ERROR,
                                             detail={"status_code": status, "message": "from the api-server"}))


def plan() -> PlanOperator:
    op = PlanOperator(task_id="plan", topology={"topology_id": "words"})
    op.airflow_check_interval = 0.0
    return op


def watch(ti: FakeTI, grace: float = 0.0, interval: float = 0.0) -> Watch:
    """A waiting task's fail-fast rules (the commit's and the plan's, in a worker or the
    triggerer), asking Airflow through ``ti`` as the operators do."""
    return Watch(
        "words", lambda run_id: plan().airflow_run_state({"ti": ti}, run_id), blocked_grace=grace,
        check_interval=interval, log=plan().log)


def test_a_predecessor_killed_on_its_last_try_blocks_and_is_recorded() -> None:
    coord, ti = FakeCoordinator(pending=(7, "run-7")), FakeTI("failed")
    blocked = watch(ti).still_blocked(coord, 9)
    assert blocked is not None and blocked.startswith("blocked by txid 7 (run run-7): its Airflow run failed")
    assert "Clear that run's tasks" in blocked
    assert ti.asked == [("words", "run-7")]
    assert [t for t, _ in coord.marked] == [7]  # airflow-txn status names it too


def test_a_running_predecessor_is_waited_for() -> None:
    coord = FakeCoordinator(pending=(7, "run-7"))
    assert watch(FakeTI("running")).still_blocked(coord, 9) is None
    assert coord.marked == []


def test_a_queued_predecessor_gets_the_slot_after_the_grace() -> None:
    # Cleared, then queued behind the max_active_runs slots its waiters hold: they must let go.
    coord, ti = FakeCoordinator(pending=(7, "run-7")), FakeTI("queued", "running", "queued")
    w = watch(ti, grace=3600)
    assert w.still_blocked(coord, 9) is None and w.since is not None  # within the grace
    assert w.still_blocked(coord, 9) is None and w.since is None  # it started: waiting again
    w.blocked_grace = 0.0
    blocked = w.still_blocked(coord, 9)
    assert blocked is not None and "queued and cannot start" in blocked
    assert coord.marked == []  # a queued run is about to be retried: not failed


def test_a_failed_run_whose_attempt_recorded_its_error_is_blamed_on_that_error() -> None:
    """Regression: after three ARITHMETIC_OVERFLOW attempts, the blocker said the run "failed without
    recording why (SIGKILL, out of memory?)"."""
    coord = FakeCoordinator(pending=(7, "run-7"), attempt_error="attempt 3 failed: ArithmeticException: "
                                                                 "[ARITHMETIC_OVERFLOW] overflow")
    blocked = watch(FakeTI("failed")).still_blocked(coord, 9)
    assert blocked is not None and "attempt 3 failed: ArithmeticException: [ARITHMETIC_OVERFLOW]" in blocked
    assert "without recording why" not in blocked and "SIGKILL" not in blocked
    assert coord.marked == [(7, "attempt 3 failed: ArithmeticException: [ARITHMETIC_OVERFLOW] overflow")]


def test_a_predecessor_marked_success_without_committing_blocks() -> None:
    coord = FakeCoordinator(pending=(7, "run-7"))
    blocked = watch(FakeTI("success")).still_blocked(coord, 9)
    assert blocked is not None and "finished without committing txid 7" in blocked
    assert [t for t, _ in coord.marked] == [7]


def test_no_airflow_answer_and_no_record_means_waiting() -> None:
    # The API away for a moment, a server error, or no run pending at all: no verdict.
    coord = FakeCoordinator(pending=(7, "run-7"))
    assert watch(FakeTI(RuntimeError("timeout"))).still_blocked(coord, 9) is None
    assert watch(FakeTI(api_error(500))).still_blocked(coord, 9) is None
    assert watch(FakeTI()).still_blocked(FakeCoordinator(pending=None), 9) is None
    assert coord.marked == []


def test_the_record_in_postgres_blocks_when_airflow_cannot_answer() -> None:
    coord = FakeCoordinator(pending=(7, "run-7"), recorded="blocked by failed txid 7 (run run-7): boom")
    ti = FakeTI(RuntimeError("timeout"))
    assert watch(ti).still_blocked(coord, 9) == coord.recorded


def test_a_deleted_predecessor_run_blocks_with_the_fix_that_still_applies() -> None:
    # Deleted in the UI (a failed or queued run): "clear that run" cannot be done any more.
    coord = FakeCoordinator(pending=(7, "run-7"), recorded="blocked by failed txid 7 (run run-7): boom. Clear it")
    blocked = watch(FakeTI(api_error(404))).still_blocked(coord, 9)
    assert blocked is not None and blocked.startswith("blocked by txid 7 (run run-7): its Airflow run was deleted")
    assert "The next run of this DAG takes its batch over" in blocked and "Clear that run" not in blocked
    assert [t for t, _ in coord.marked] == [7]


def test_the_next_new_run_takes_over_the_batch_of_a_deleted_run() -> None:
    coord = FakeCoordinator(pending=None, planned=[(7, "run-7"), (8, "run-8")])
    ti = FakeTI("running", api_error(404))  # txid 7's run is alive, txid 8's was deleted
    assert plan().adopt_orphan(coord, {"ti": ti, "run_id": "run-new"}) == 8
    assert coord.adopted == [(8, "run-8", "run-new")]
    assert ti.asked == [("words", "run-7"), ("words", "run-8")]


def test_only_a_404_hands_a_batch_over() -> None:
    for answer in ("failed", "success", "queued", api_error(500), RuntimeError("timeout")):
        coord = FakeCoordinator(pending=None, planned=[(7, "run-7")])
        assert plan().adopt_orphan(coord, {"ti": FakeTI(answer), "run_id": "run-new"}) is None
        assert coord.adopted == [], answer


def test_a_run_with_a_txid_of_its_own_takes_nothing_over() -> None:
    coord, ti = FakeCoordinator(pending=None, planned=[(7, "run-7")], own=9), FakeTI(api_error(404))
    assert plan().adopt_orphan(coord, {"ti": ti, "run_id": "run-9"}) is None
    assert coord.adopted == [] and ti.asked == []


def test_airflow_is_asked_at_most_every_interval() -> None:
    coord, ti = FakeCoordinator(pending=(7, "run-7")), FakeTI("running", "failed")
    w = watch(ti, grace=3600, interval=3600)
    for _ in range(5):
        assert w.still_blocked(coord, 9) is None
    assert len(ti.asked) == 1


@pytest.mark.parametrize(("script", "reason"), [
    # The driver killed (the OOM killer's signal): the exit code by name, not the command line.
    ('echo "24/01/01 INFO SparkContext: Running Spark version"; kill -9 $$',
     "spark-submit exited with code -9 (killed by SIGKILL: out of memory (the OOM killer), or killed by someone)"),
    # The job raised: the line of spark-submit's output that names the cause.
    ('echo "Traceback (most recent call last):"; echo "  File \\"job.py\\", line 3"; '
     'echo "pyspark.errors.exceptions.captured.ArithmeticException: [ARITHMETIC_OVERFLOW] long overflow"; '
     'echo "26/11/26 INFO ShutdownHookManager: Shutdown hook called"; exit 1',
     "spark-submit exited with code 1: pyspark.errors.exceptions.captured.ArithmeticException: "
     "[ARITHMETIC_OVERFLOW] long overflow"),
    # The job said why in its own words (regression: its ERROR line matched no cause -- the pattern
    # wanted "Error" -- and only the exit code was told, with a clear that fails again).
    ('echo "2026-12-05 10:00:00,000 ERROR airflow_transactional.spark.job: topology \x27s3_orders\x27 txid 5: '
     'landing file s3a://b/in/a.json can no longer be read: restore the data, or declare the topology '
     'opaque=True"; echo "Traceback (most recent call last):"; '
     'echo "airflow_transactional.exceptions.BatchUnavailable: landing file s3a://b/in/a.json"; '
     'echo "26/12/05 INFO ShutdownHookManager: Shutdown hook called"; exit 1',
     "spark-submit exited with code 1: topology 's3_orders' txid 5: landing file s3a://b/in/a.json can no longer "
     "be read: restore the data, or declare the topology opaque=True"),
    # The launcher killed under it: bash's own line says why (regression: only the exit code was told).
    ('echo "/opt/spark/bin/spark-class: line 97: CMD: bad array subscript"; exit 1',
     "spark-submit exited with code 1: /opt/spark/bin/spark-class: line 97: CMD: bad array subscript"),
])
def test_a_failed_spark_submit_is_told_in_one_line(tmp_path: object, monkeypatch: pytest.MonkeyPatch,
                                                   script: str, reason: str) -> None:
    """The Spark provider's own hook runs a stand-in ``spark-submit`` and raises its message (the
    whole command line first); what the task records and logs is the one line that matters."""
    import os
    from pathlib import Path

    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    from airflow_transactional.airflow.operators.base import failure_reason

    bin_dir = Path(str(tmp_path))
    (bin_dir / "spark-submit").write_text(f"#!/bin/sh\n{script}\n")
    (bin_dir / "spark-submit").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_LOCAL", '{"conn_type": "spark", "host": "local[1]"}')
    hook = SparkSubmitHook(conn_id="spark_local", name="txn-words", conf={"spark.driver.extraJavaOptions": "-Xss4m"},
                           application_args=["--dsn-file", "/tmp/x/dsn", "--txid", "7"])
    with pytest.raises(Exception) as raised:
        hook.submit("/opt/jobs/words.py")
    assert "Cannot execute: spark-submit" in str(raised.value)  # the provider's message, as it comes
    assert failure_reason("spark-submit", raised.value) == reason
    assert failure_reason("the commit", ValueError("boom\nmore")) == "the commit failed: boom"
    # A Spark Connect client (operators/process.py says how it ended) reads the same way.
    connect = Exception("the Spark Connect job words.py exited with 137:\nreading txid 7\nValueError: bad row")
    assert failure_reason("the Spark Connect job", connect) == (
        "the Spark Connect job exited with code 137 (killed by SIGKILL: out of memory (the OOM killer), or killed "
        "by someone): ValueError: bad row")


class RecordingCoordinator(FakeCoordinator):
    """What a failed try leaves in the store: each try noted, the failure for good marked."""

    class Txn:
        txid, committed = 4, False

    def __init__(self) -> None:
        super().__init__(None, own=4)
        self.noted: list[tuple[int, str]] = []

    def transaction_for_run(self, topology_id: str, run_key: str) -> object | None:
        return self.Txn

    def note_failed_try(self, topology_id: str, txid: int, reason: str) -> None:
        self.noted.append((txid, reason))


class TryTI(FakeTI):
    try_number = 1


def test_a_configuration_it_cannot_run_with_fails_for_good_at_once_and_a_crash_is_retried() -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_transactional.exceptions import ConfigError

    task = PlanOperator(task_id="process", topology={"topology_id": "words"}, retries=3)
    coord = RecordingCoordinator()
    context = {"ti": TryTI(), "run_id": "r"}
    with pytest.raises(AirflowFailException, match=r"^process: spark-submit failed: runs in client mode only$"):
        with task.failing_for_good(coord, context, "spark-submit"):  # type: ignore[arg-type]
            raise ConfigError("runs in client mode only")
    assert coord.noted == coord.marked == [(4, "process: spark-submit failed: runs in client mode only")]
    # A crash on try 1 of 4 is noted, not the failure for good: Airflow retries it.
    coord = RecordingCoordinator()
    with pytest.raises(RuntimeError):
        with task.failing_for_good(coord, context, "spark-submit"):  # type: ignore[arg-type]
            raise RuntimeError("driver lost")
    assert coord.noted == [(4, "process: spark-submit failed: driver lost")] and coord.marked == []


def test_each_try_of_the_process_task_is_a_new_attempt_never_a_re_attach() -> None:
    """Airflow 3.3's resumable jobs would re-attach a retry to the driver of an earlier try where
    the Spark provider tracks it (a driver in cluster deploy mode); the process task does not."""
    from airflow_transactional.airflow.operators import TransactionalSparkSubmitOperator

    task = TransactionalSparkSubmitOperator(task_id="process", application="job.py",
                                            topology={"topology_id": "words"})
    assert task.durable is False


def test_the_commit_task_keeps_the_delta_history_to_its_retention(monkeypatch: pytest.MonkeyPatch) -> None:
    """[transactional] delta_history_txids: every tenth of that many commits the older txids are
    folded into the snapshot; 0 (the default) keeps every txid."""
    from types import SimpleNamespace

    from airflow_transactional.airflow.operators import CommitOperator

    folded: list[tuple[str, int]] = []
    coordinator = SimpleNamespace(compact_history=lambda t, keep: folded.append((t, keep)) or None)
    op = SimpleNamespace(topology_id="words", log=SimpleNamespace(info=lambda *a: None))
    for txid in range(1, 41):
        CommitOperator.keep_history(op, coordinator, txid)  # type: ignore[arg-type]
    assert folded == []
    monkeypatch.setenv("AIRFLOW__TRANSACTIONAL__DELTA_HISTORY_TXIDS", "20")
    for txid in range(1, 41):
        CommitOperator.keep_history(op, coordinator, txid)  # type: ignore[arg-type]
    assert folded == [("words", 20)] * 20  # every second commit: a tenth of 20


def test_a_refused_replay_or_correction_fails_the_plan_task_at_once() -> None:
    # A retry would be refused the same way: no retries spent, no minutes lost before the run fails.
    from types import SimpleNamespace

    from airflow.sdk.exceptions import AirflowFailException

    from airflow_transactional.exceptions import ConfigError

    def refused(*args: object) -> None:
        raise ConfigError("topology 'words' has no quarantined record left to replay")

    coord = SimpleNamespace(plan_replay=refused, plan_correction=refused, plan=lambda *a: "planned")
    for conf in ({"replay": {"ids": [3]}}, {"correct": "1..2"}, {"correct": "2..1"}):
        with pytest.raises(AirflowFailException, match="plan: "):
            plan().plan_run(coord, {"run_id": "r", "dag_run": SimpleNamespace(conf=conf)})  # type: ignore[arg-type]
    assert plan().plan_run(coord, {"run_id": "r", "dag_run": SimpleNamespace(conf={})}) == "planned"  # type: ignore[arg-type]


class CommittingCoordinator(FakeCoordinator):
    """Its predecessor commits (and its run finishes) while Airflow is asked about that run."""

    def __init__(self) -> None:
        super().__init__(pending=(7, "run-7"))
        self.looks = 0

    def first_pending(self, topology_id: str, before_txid: int) -> tuple[int, str] | None:
        self.looks += 1
        return self.pending if self.looks == 1 else None


def test_a_predecessor_that_committed_while_airflow_was_asked_is_no_blocker() -> None:
    """Regression: txid 7 was seen pending, then committed and its run finished before Airflow
    answered "success": the waiting commit logged "finished without committing txid 7 (marked
    success by hand?)" -- and, with no grace, failed."""
    coord = CommittingCoordinator()
    assert watch(FakeTI("success")).still_blocked(coord, 9) is None
    assert coord.marked == []


def test_airflow_asked_on_an_executor_leaves_the_look_at_once() -> None:
    """In the triggerer a question to Airflow can take seconds: the look goes on without it, and
    the answer counts at the first look after it arrived."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    asked, answer = threading.Event(), threading.Event()

    def slow(run_id: str) -> str:
        asked.set()
        answer.wait(10)
        return "failed"

    coord = FakeCoordinator(pending=(7, "run-7"))
    with ThreadPoolExecutor(1) as pool:
        w = Watch("words", slow, blocked_grace=0.0, check_interval=0.0, log=plan().log, asks_on=pool)
        assert w.still_blocked(coord, 9) is None  # asked, not answered: the look goes on
        assert asked.wait(5) and w.still_blocked(coord, 9) is None
        answer.set()
        pool.shutdown(wait=True)
        blocked = w.still_blocked(coord, 9)
    assert blocked is not None and blocked.startswith("blocked by txid 7 (run run-7): its Airflow run failed")
    assert [t for t, _ in coord.marked] == [7]
