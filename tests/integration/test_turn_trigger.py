"""The trigger a deferred plan or commit waits on, run on a real PostgreSQL: it wakes on the
commit's NOTIFY (not on its polling), says "blocked" for a failed predecessor, "timeout" at the
deadline, survives a lost listener, and keeps no secret in what Airflow stores of it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_transactional.airflow import triggers
from airflow_transactional.airflow.hooks import TransactionalHook
from airflow_transactional.airflow.triggers import COMMIT, SLOT, TurnTrigger
from airflow_transactional.coordinator import Coordinator
from airflow_transactional.processing import process_batch
from dev import faults
from tests.helpers import click, click_fn, counting_topology, make_log, query

pytestmark = pytest.mark.integration

#: Longer than any test waits: an event before it can only come from a NOTIFY.
SLOW_POLL = 60.0


@pytest.fixture
def store(coordinator: Coordinator, dsn: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Coordinator]:
    """A topology with two planned txids; the hook of conn id ``store`` points at this database."""
    monkeypatch.setattr(TransactionalHook, "get_dsn", lambda self: dsn if self.transactional_conn_id == "store"
                        else pytest.fail(f"unexpected connection {self.transactional_conn_id}"))
    monkeypatch.setattr(TransactionalHook, "state_schema", lambda self: coordinator.schema)
    log = make_log(dsn)
    coordinator.register(counting_topology())
    log.append([click(i) for i in range(60)])
    for run in ("run-1", "run-2"):
        txn = coordinator.plan("clicks", run)
        process_batch(coordinator, "clicks", txn.txid, click_fn)
    yield coordinator
    log.close()


def trigger(**kwargs: Any) -> TurnTrigger:
    args: dict[str, Any] = {"conn_id": "store", "topology_id": "clicks", "dag_id": "clicks", "waiting_for": COMMIT,
                            "txid": 2, "deadline": time.time() + 600, "blocked_grace": 0.0,
                            "check_interval": SLOW_POLL}
    return TurnTrigger(**{**args, **kwargs})


async def first_event(t: TurnTrigger, *, after: Any = None, within: float = 20.0) -> tuple[dict[str, Any], float]:
    """The trigger's first event and how long after ``after()`` (run once it waits) it came."""
    events = t.run()
    task = asyncio.ensure_future(events.__anext__())
    await asyncio.sleep(1.0)  # it has looked once and waits
    assert not task.done(), f"fired before anything happened: {task.result().payload}"
    started = time.monotonic()
    if after is not None:
        await asyncio.to_thread(after)
    event = await asyncio.wait_for(task, timeout=within)
    await events.aclose()
    return event.payload, time.monotonic() - started


def test_a_waiting_commit_wakes_on_its_predecessors_commit(store: Coordinator) -> None:
    payload, waited = asyncio.run(first_event(trigger(), after=lambda: store.commit("clicks", 1)))
    assert payload == {"status": "turn"}
    assert waited < 5.0  # the NOTIFY, not the 60 s poll
    assert triggers._LISTENERS == {}  # the listener went with its last trigger


def test_a_commit_trigger_commits_its_txid_the_moment_its_turn_comes(store: Coordinator) -> None:
    payload, waited = asyncio.run(first_event(trigger(commit=True), after=lambda: store.commit("clicks", 1)))
    assert payload["status"] == "committed" and payload["txid"] == 2 and payload["committed"] is True
    assert waited < 5.0 and payload["took"] < waited
    assert store.status("clicks").committed_txid == 2
    first, second = store.commits("clicks")
    assert (second["commit_started_at"] - first["committed_at"]).total_seconds() < 5.0
    # Once committed, a commit of it again (the resumed task's) changes nothing and says so.
    again = store.commit("clicks", 2)
    assert not again.committed and again.txid == 2


def test_a_commit_the_trigger_cannot_make_is_left_to_the_task(store: Coordinator) -> None:
    with faults.inject("commit.after_apply:clicks:2", "raise"):
        payload, _ = asyncio.run(first_event(trigger(commit=True), after=lambda: store.commit("clicks", 1)))
    assert payload == {"status": "turn"}  # the task resumes and commits, recording a failure as a task does
    assert store.status("clicks").committed_txid == 1
    assert store.commit("clicks", 2).committed


def test_a_commit_of_another_topology_does_not_wake_it(store: Coordinator, dsn: str) -> None:
    log = make_log(dsn, "other")
    store.register(counting_topology("other", log="other"))
    txn = store.plan("other", "o-1")
    process_batch(store, "other", txn.txid, click_fn)

    async def scenario() -> None:
        events = trigger().run()
        task = asyncio.ensure_future(events.__anext__())
        await asyncio.sleep(1.0)
        await asyncio.to_thread(store.commit, "other", 1)
        await asyncio.sleep(1.5)
        assert not task.done()
        await asyncio.to_thread(store.commit, "clicks", 1)
        assert (await asyncio.wait_for(task, 10)).payload == {"status": "turn"}
        await events.aclose()

    asyncio.run(scenario())
    log.close()


def test_a_predecessor_that_failed_for_good_blocks_at_once(store: Coordinator) -> None:
    payload, waited = asyncio.run(first_event(
        trigger(), after=lambda: store.mark_failed("clicks", 1, "process: spark-submit failed: boom")))
    assert payload["status"] == "blocked" and waited < 5.0
    assert payload["reason"].startswith("blocked by failed txid 1 (run run-1): process: spark-submit failed: boom")


def test_a_plan_waiting_for_a_slot_wakes_when_one_frees(store: Coordinator) -> None:
    t = trigger(waiting_for=SLOT, txid=0, in_flight=[1, 2])
    payload, waited = asyncio.run(first_event(t, after=lambda: store.commit("clicks", 1)))
    assert payload == {"status": "turn"} and waited < 5.0


def test_it_says_timeout_at_the_deadline(store: Coordinator) -> None:
    async def scenario() -> dict[str, Any]:
        events = trigger(deadline=time.time() + 1.5, check_interval=0.5).run()
        event = await asyncio.wait_for(events.__anext__(), 10)
        await events.aclose()
        return event.payload

    assert asyncio.run(scenario()) == {"status": "timeout"}


def test_a_lost_listener_costs_latency_not_the_wake_up(store: Coordinator, dsn: str) -> None:
    async def scenario() -> dict[str, Any]:
        events = trigger(check_interval=1.0).run()
        task = asyncio.ensure_future(events.__anext__())
        await asyncio.sleep(1.0)
        # An administrator (or a failover) ends the listening session; the commit's NOTIFY is lost.
        killed = await asyncio.to_thread(query, dsn, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                         "WHERE application_name = 'airflow_transactional listener'")
        assert killed == [(1,)]
        await asyncio.to_thread(store.commit, "clicks", 1)
        event = await asyncio.wait_for(task, 10)
        await events.aclose()
        return event.payload

    assert asyncio.run(scenario()) == {"status": "turn"}


def test_a_lost_state_store_connection_is_waited_out_not_fatal(store: Coordinator, dsn: str) -> None:
    async def scenario() -> dict[str, Any]:
        events = trigger(check_interval=0.5).run()
        task = asyncio.ensure_future(events.__anext__())
        await asyncio.sleep(1.0)
        # The trigger's sessions end (a restart, a failover); the test's own committer is spared.
        mine = store.store.db.connection().get_backend_pid()
        killed = await asyncio.to_thread(query, dsn, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                         "WHERE datname = current_database() AND pid NOT IN (pg_backend_pid(), %s)",
                                         (mine,))
        assert killed[0][0] >= 2  # the trigger's look and its listener
        await asyncio.sleep(1.5)
        assert not task.done(), f"the trigger gave up: {task.exception() or task.result().payload}"
        await asyncio.to_thread(store.commit, "clicks", 1)
        event = await asyncio.wait_for(task, 10)
        await events.aclose()
        return event.payload

    assert asyncio.run(scenario()) == {"status": "turn"}


def test_what_airflow_stores_of_the_trigger_names_no_secret(store: Coordinator, dsn: str) -> None:
    path, kwargs = trigger().serialize()
    assert path == "airflow_transactional.airflow.triggers.TurnTrigger"
    assert TurnTrigger(**kwargs).serialize() == (path, kwargs)
    text = repr(kwargs)
    assert "password" not in text and dsn not in text and "host=" not in text


def test_a_commit_held_by_an_open_append_waits_a_bounded_time_on_threads_of_its_own(
        coordinator: Coordinator, dsn: str, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    """Regression: an appender that left its transaction open on a topology's output log held six
    commit triggers in the commit with no end (past their deadline), on all six threads of the event
    loop's default executor: every other trigger's thread work in that triggerer stalled too."""
    import psycopg2

    from airflow_transactional.store import outputs
    from tests.integration.test_output_logs import stage1, stage1_fn

    monkeypatch.setattr(TransactionalHook, "get_dsn", lambda self: dsn)
    monkeypatch.setattr(TransactionalHook, "state_schema", lambda self: coordinator.schema)
    monkeypatch.setattr(outputs, "LOCK_WAIT", "2s")
    log = make_log(dsn)
    coordinator.register(stage1())
    log.append([click(i, amount=9) for i in range(20)])
    for run in ("run-1", "run-2"):
        txn = coordinator.plan("stage1", run)
        process_batch(coordinator, "stage1", txn.txid, stage1_fn)
    assert coordinator.commit("stage1", 1).committed
    holder = psycopg2.connect(dsn)  # the appender: it locked the output log's partitions and stays open
    holder.cursor().execute("SELECT 1 FROM airflow_txn.log_partitions WHERE log_name = 'big' FOR UPDATE")

    async def scenario() -> tuple[list[dict[str, Any]], float, float]:
        started = time.monotonic()
        waits = [asyncio.ensure_future(trigger(topology_id="stage1", dag_id="stage1", commit=True).run().__anext__())
                 for _ in range(6)]
        await asyncio.sleep(0.5)  # each is in its commit, waiting for the lock
        canary = time.monotonic()
        await asyncio.wait_for(asyncio.to_thread(lambda: None), 5)  # the loop's own threads are free
        canary_took = time.monotonic() - canary
        events = [e.payload for e in await asyncio.wait_for(asyncio.gather(*waits), 30)]
        return events, canary_took, time.monotonic() - started

    try:
        events, canary_took, took = asyncio.run(scenario())
    finally:
        holder.close()
    assert canary_took < 1.0
    assert events == [{"status": "turn"}] * 6, events  # left to the task, which retries
    assert took < 20, took  # each waited its 2 s for the lock in turn (the topology's commits queue)
    said = "".join(capsys.readouterr())
    assert "partition 0 of output log 'big' stayed locked by another transaction for more than 2s" in said
    assert coordinator.commit("stage1", 2).committed  # the appender gone, the commit goes through
    log.close()


def test_a_trigger_of_another_dags_topology_is_blocked_and_commits_nothing(store: Coordinator) -> None:
    """Regression: a trigger names its topology, and a task of any DAG (another team's) could park a
    commit trigger on a topology it does not run -- and have the triggerer commit it."""
    store.commit("clicks", 1)

    async def scenario() -> dict[str, Any]:
        events = trigger(dag_id="someone_elses", commit=True).run()
        event = await asyncio.wait_for(events.__anext__(), 10)
        await events.aclose()
        return event.payload

    payload = asyncio.run(scenario())
    assert payload["status"] == "blocked" and "is run by DAG 'clicks', not by DAG 'someone_elses'" in payload["reason"]
    assert store.status("clicks").committed_txid == 1


def test_a_slow_answer_from_airflow_does_not_hold_a_commit_whose_turn_came(
        store: Coordinator, monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: the look asked Airflow about the predecessor's run inside itself; the triggerer
    relays that question through its supervisor (seconds, under load), and the commit whose turn
    came meanwhile waited for the answer."""
    def slow(self: TurnTrigger, run_id: str) -> str:
        time.sleep(4.0)
        return "running"

    monkeypatch.setattr(TurnTrigger, "_run_state", slow)
    payload, waited = asyncio.run(first_event(trigger(commit=True), after=lambda: store.commit("clicks", 1)))
    assert payload["status"] == "committed" and payload["txid"] == 2
    assert waited < 1.5, waited  # the NOTIFY's look, not the answer 3 s later


def test_a_predecessor_that_commits_while_airflow_is_asked_is_no_false_alarm(
        store: Coordinator, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Regression: the look saw txid 1 pending, txid 1 committed and its run ended, then Airflow
    answered "success": "blocked by txid 1: its Airflow run finished without committing txid 1
    (marked success by hand?)" in every waiting commit's log -- and with no grace, a failed task."""
    def committed_then_success(self: TurnTrigger, run_id: str) -> str:
        store.commit("clicks", 1)  # the run's commit task, then the run's end
        return "success"

    monkeypatch.setattr(TurnTrigger, "_run_state", committed_then_success)

    async def scenario() -> dict[str, Any]:
        events = trigger(commit=True, check_interval=0.2).run()
        event = await asyncio.wait_for(events.__anext__(), 20)
        await events.aclose()
        return event.payload

    payload = asyncio.run(scenario())
    assert payload["status"] == "committed" and payload["txid"] == 2, payload
    assert "without committing" not in caplog.text
    assert store.status("clicks").committed_txid == 2


def test_a_commit_during_the_first_look_wakes_the_trigger(store: Coordinator, monkeypatch: pytest.MonkeyPatch) -> None:
    """The trigger listens before it first looks, and clears its wake-up before each look: a
    predecessor committed just after a look read the store wakes it (not its 60-s poll)."""
    looked = TurnTrigger.look

    def look_then_commit(self: TurnTrigger, coordinator: Coordinator, watch: Any) -> dict[str, Any] | None:
        event = looked(self, coordinator, watch)
        if event is None and store.status("clicks").committed_txid == 0:
            store.commit("clicks", 1)
        return event

    monkeypatch.setattr(TurnTrigger, "look", look_then_commit)

    async def scenario() -> tuple[dict[str, Any], float]:
        started = time.monotonic()
        events = trigger().run()
        event = await asyncio.wait_for(events.__anext__(), 20)
        await events.aclose()
        return event.payload, time.monotonic() - started

    payload, took = asyncio.run(scenario())
    assert payload == {"status": "turn"} and took < 5.0
