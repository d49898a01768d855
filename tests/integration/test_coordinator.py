"""Plan, attempts, ordered commit, recover and status on a real PostgreSQL."""

from __future__ import annotations

import json

import pytest

from airflow_transactional.coordinator import Coordinator
from airflow_transactional.core import attempts
from airflow_transactional.exceptions import (
    ConfigError,
    NotProcessed,
    StagedOutputIncomplete,
    StaleAttempt,
    TooManyInFlight,
    UnknownTopology,
    WaitingForPredecessor,
)
from airflow_transactional.processing import process_batch
from tests.helpers import click, click_fn, counting_topology, make_log, query, run_one, table

pytestmark = pytest.mark.integration


@pytest.fixture
def topo(coordinator: Coordinator, dsn: str):  # type: ignore[no-untyped-def]
    log = make_log(dsn)
    coordinator.register(counting_topology())
    yield log
    log.close()


def test_plan_is_idempotent_per_run_key_and_batches_are_contiguous(coordinator: Coordinator, topo) -> None:  # type: ignore[no-untyped-def]
    topo.append([click(i) for i in range(120)])
    t1 = coordinator.plan("clicks", "run-a")
    t2 = coordinator.plan("clicks", "run-b")
    again = coordinator.plan("clicks", "run-a")
    assert (t1.txid, t2.txid) == (1, 2)
    assert again == t1  # same txid, same stored batch
    assert t1.planned_records == 50 and t2.planned_records == 50  # max_batch_size caps a batch
    assert t1.start_offsets == {"0": 0, "1": 0, "2": 0}
    assert t2.start_offsets == t1.end_offsets


def test_plan_refuses_more_than_max_in_flight_and_names_the_blocker(coordinator: Coordinator, topo) -> None:  # type: ignore[no-untyped-def]
    for k in range(3):
        coordinator.plan("clicks", f"r{k}")
    with pytest.raises(TooManyInFlight, match=r"txids 1, 2, 3; max_in_flight=3\): wait for txid 1"):
        coordinator.plan("clicks", "r3")
    assert coordinator.plan("clicks", "r1").txid == 2  # an existing run still gets its plan


def test_commits_are_strictly_in_txid_order(coordinator: Coordinator, topo) -> None:  # type: ignore[no-untyped-def]
    topo.append([click(i) for i in range(100)])
    t1, t2 = coordinator.plan("clicks", "a"), coordinator.plan("clicks", "b")
    process_batch(coordinator, "clicks", t2.txid, click_fn)
    process_batch(coordinator, "clicks", t1.txid, click_fn)
    with pytest.raises(WaitingForPredecessor, match="cannot commit txid 2 yet, waiting for txid 1"):
        coordinator.commit("clicks", 2)
    assert coordinator.commit("clicks", 1).committed
    assert coordinator.commit("clicks", 2).committed
    replay = coordinator.commit("clicks", 1)
    assert not replay.committed
    assert replay.message.startswith("txid 1 already committed at ") and replay.message.endswith("nothing to do")
    assert [c["txid"] for c in coordinator.commits("clicks")] == [1, 2]


def test_state_equals_the_source_after_commits(coordinator: Coordinator, topo, dsn: str) -> None:  # type: ignore[no-untyped-def]
    events = [click(i) for i in range(137)]
    topo.append(events)
    for k in range(3):
        run_one(coordinator, "clicks", f"r{k}")
    expected_count: dict[str, int] = {}
    expected_amount: dict[str, int] = {}
    for _eid, payload in events:
        rec = json.loads(payload)
        expected_count[rec["user"]] = expected_count.get(rec["user"], 0) + 1
        expected_amount[rec["user"]] = expected_amount.get(rec["user"], 0) + rec["amount"]
    assert table(dsn, "clicks_count") == expected_count
    assert table(dsn, "clicks_amount") == expected_amount
    assert query(dsn, "SELECT DISTINCT txid FROM clicks_count ORDER BY 1")[-1] == (3,)


def test_a_deleted_runs_txid_is_handed_over_whole_and_only_once(coordinator: Coordinator, topo,  # type: ignore[no-untyped-def]
                                                                dsn: str) -> None:
    topo.append([click(i, user="u", amount=1) for i in range(100)])
    t1, t2 = coordinator.plan("clicks", "gone"), coordinator.plan("clicks", "b")
    process_batch(coordinator, "clicks", t1.txid, click_fn)  # staged before its run was deleted
    coordinator.mark_failed("clicks", t1.txid, "its Airflow run was deleted")
    assert coordinator.adopt("clicks", t1.txid, "gone", "b") is None  # run b has a txid of its own
    taken = coordinator.adopt("clicks", t1.txid, "gone", "new")
    assert taken is not None and taken.txid == 1 and taken.run_key == "new"
    assert (taken.start_offsets, taken.end_offsets) == (t1.start_offsets, t1.end_offsets)
    assert coordinator.adopt("clicks", t1.txid, "gone", "newer") is None  # taken already
    assert coordinator.blocker("clicks", t2.txid) is None  # the new run is its retry
    assert coordinator.plan("clicks", "new") == taken and coordinator.transaction_for_run("clicks", "gone") is None
    assert coordinator.commit("clicks", 1).attempt == 1  # the deleted run's staged output, not redone
    assert coordinator.adopt("clicks", 1, "new", "later") is None  # committed: nothing to hand over
    process_batch(coordinator, "clicks", t2.txid, click_fn)
    assert coordinator.commit("clicks", 2).committed
    assert [(c["txid"], c["run_key"]) for c in coordinator.commits("clicks")] == [(1, "new"), (2, "b")]
    assert table(dsn, "clicks_count") == {"u": 100}


def test_only_the_latest_complete_attempt_commits_and_only_its_staging_is_kept(
        coordinator: Coordinator, topo, dsn: str) -> None:  # type: ignore[no-untyped-def]
    topo.append([click(i, user="u", amount=1) for i in range(10)])
    txn = coordinator.plan("clicks", "r")
    # attempt 1 sees a (wrong) doubled batch; attempt 2 is correct and later: only 2 may commit
    process_batch(coordinator, "clicks", txn.txid, lambda r: [("clicks_count", ("u",), 2),
                                                                ("clicks_amount", ("u",), 2)])
    r2 = process_batch(coordinator, "clicks", txn.txid, click_fn)
    with pytest.raises(StaleAttempt, match="only the latest can be committed"):
        coordinator.commit("clicks", txn.txid, attempt=1)
    res = coordinator.commit("clicks", txn.txid)
    assert res.attempt == r2.attempt == 2
    assert table(dsn, "clicks_count") == {"u": 10}
    # The committed attempt's rows stay, as the txid's deltas (the delta history); the other's go.
    assert query(dsn, "SELECT attempt, user_id, value FROM airflow_txn.stg_1_clicks_count") == [(2, "u", 10)]
    statuses = query(dsn, "SELECT attempt, status FROM airflow_txn.attempts ORDER BY attempt")
    assert statuses == [(1, "discarded"), (2, "committed")]


def test_commit_refuses_unprocessed_and_damaged_output(coordinator: Coordinator, topo, dsn: str) -> None:  # type: ignore[no-untyped-def]
    topo.append([click(i) for i in range(10)])
    txn = coordinator.plan("clicks", "r")
    with pytest.raises(NotProcessed, match="run its processing task"):
        coordinator.commit("clicks", txn.txid)
    process_batch(coordinator, "clicks", txn.txid, click_fn)
    query(dsn, "DELETE FROM airflow_txn.stg_1_clicks_amount WHERE ctid IN "
               "(SELECT ctid FROM airflow_txn.stg_1_clicks_amount LIMIT 1)")
    with pytest.raises(StagedOutputIncomplete, match="process the txid again"):
        coordinator.commit("clicks", txn.txid)
    assert table(dsn, "clicks_count") == {}  # nothing applied: the commit is all or nothing
    process_batch(coordinator, "clicks", txn.txid, click_fn)
    assert coordinator.commit("clicks", txn.txid).committed


def test_a_failed_attempt_is_never_committed(coordinator: Coordinator, topo, dsn: str) -> None:  # type: ignore[no-untyped-def]
    topo.append([click(i) for i in range(10)])
    txn = coordinator.plan("clicks", "r")

    def boom(rec):  # type: ignore[no-untyped-def]
        raise RuntimeError("executor lost")

    with pytest.raises(RuntimeError):
        process_batch(coordinator, "clicks", txn.txid, boom)
    with pytest.raises(NotProcessed):
        coordinator.commit("clicks", txn.txid)
    st = coordinator.status("clicks")
    assert st.in_flight[0].phase == "failed"
    assert st.blocked_by is not None and st.blocked_by.startswith("blocked by failed txid 1 (run r)")
    # Airflow gave up on the run, and the waiters only learnt that it failed: the blocker still
    # names what the attempt recorded, not a guess (regression: "SIGKILL, out of memory?").
    coordinator.mark_failed("clicks", txn.txid, "its Airflow run failed without recording why (SIGKILL?)")
    blocked = coordinator.blocker("clicks", txn.txid + 1)
    assert blocked is not None and "attempt 1 failed: RuntimeError: executor lost" in blocked, blocked
    assert "without recording why" not in blocked
    assert coordinator.last_error("clicks", txn.txid) == "attempt 1 failed: RuntimeError: executor lost"
    process_batch(coordinator, "clicks", txn.txid, click_fn)
    assert coordinator.commit("clicks", txn.txid).committed
    assert coordinator.status("clicks").blocked_by is None


def test_empty_batches_commit_without_processing(coordinator: Coordinator, topo) -> None:  # type: ignore[no-untyped-def]
    txn = coordinator.plan("clicks", "idle")
    assert txn.empty
    assert process_batch(coordinator, "clicks", txn.txid, click_fn).attempt is None
    assert coordinator.commit("clicks", txn.txid).committed
    assert coordinator.status("clicks").committed_txid == 1


def test_bad_records_are_quarantined_with_txid_offset_reason(coordinator: Coordinator, topo, dsn: str) -> None:  # type: ignore[no-untyped-def]
    topo.append([click(1), ("bad-json", "{not json"), ("bad-field", json.dumps({"user": "x"})), click(2)],
                partition=0)
    txn = coordinator.plan("clicks", "r")
    res = process_batch(coordinator, "clicks", txn.txid, click_fn)
    assert res.quarantined == 2 and res.records_read == 4
    assert coordinator.status("clicks").quarantined_pending == 2
    coordinator.commit("clicks", txn.txid)
    rows = query(dsn, "SELECT txid, source_offset, event_id, reason, committed FROM airflow_txn.quarantine "
                      "ORDER BY source_offset")
    assert [(r[0], r[1], r[2], r[4]) for r in rows] == [(1, "0:2", "bad-json", True), (1, "0:3", "bad-field", True)]
    assert rows[0][3].startswith("JSONDecodeError") and rows[1][3] == "KeyError: 'amount'"
    st = coordinator.status("clicks")
    assert (st.quarantined, st.quarantined_pending) == (2, 0)
    assert table(dsn, "clicks_count") == {"u1": 1, "u2": 1}


def test_quarantine_of_replayed_attempts_is_counted_once(coordinator: Coordinator, topo, dsn: str) -> None:  # type: ignore[no-untyped-def]
    topo.append([click(1), ("bad", "oops")], partition=0)
    txn = coordinator.plan("clicks", "r")
    for _ in range(3):
        process_batch(coordinator, "clicks", txn.txid, click_fn)
    coordinator.commit("clicks", txn.txid)
    assert query(dsn, "SELECT count(*) FROM airflow_txn.quarantine") == [(1,)]


def test_a_quarantine_slice_two_spark_tasks_copied_is_committed_once(coordinator: Coordinator, topo,  # type: ignore[no-untyped-def]
                                                                     dsn: str) -> None:
    """A Spark task run again after its COPY committed (its executor lost with the task's result, a
    Spark Connect query re-executed) copies its slice of bad records again: the commit keeps one
    writer's rows per slice -- and keeps two rows of one writer even when their text is equal."""
    import io

    from airflow_transactional.store.connection import connect

    topo.append([click(1), ("bad", "oops")], partition=0)
    txn = coordinator.plan("clicks", "r")
    attempt = process_batch(coordinator, "clicks", txn.txid, click_fn).attempt
    rows = [("1:0", 7, "0:9", "same reason"), ("1:0", 7, "0:9", "same reason"),  # two records, equal text
            ("1:1", 8, "0:10", "other"),
            ("1:0", 9, "0:9", "same reason"), ("1:0", 9, "0:9", "same reason")]  # task 7's slice, run again
    csv = "".join(f"clicks,{txn.txid},{attempt},{part},{writer},{offset},,{why},x,1\n"
                  for part, writer, offset, why in rows)
    with connect(dsn) as conn, conn.cursor() as cur:
        cur.copy_expert(coordinator.quarantine_copy(), io.StringIO(csv))
    coordinator.commit("clicks", txn.txid)
    kept = query(dsn, "SELECT slice, writer, source_offset FROM airflow_txn.quarantine WHERE committed")
    assert sorted(kept, key=str) == sorted([("1:0", 7, "0:9"), ("1:0", 7, "0:9"), ("1:1", 8, "0:10"),
                                            (None, None, "0:2")], key=str), kept
    assert coordinator.status("clicks").quarantined == 4


def test_fail_fast_topologies_fail_the_attempt(coordinator: Coordinator, dsn: str) -> None:
    log = make_log(dsn, "strict")
    coordinator.register(counting_topology("strict", log="strict", on_bad_record="fail"))
    log.append([("bad", "oops")])
    txn = coordinator.plan("strict", "r")
    with pytest.raises(Exception, match="on_bad_record='fail'"):
        process_batch(coordinator, "strict", txn.txid, click_fn)
    assert coordinator.status("strict").in_flight[0].phase == "failed"


def test_recover_discards_only_what_can_never_commit(coordinator: Coordinator, topo, dsn: str) -> None:  # type: ignore[no-untyped-def]
    topo.append([click(i) for i in range(30)])
    t1 = coordinator.plan("clicks", "a")
    process_batch(coordinator, "clicks", t1.txid, click_fn)  # attempt 1: superseded below
    process_batch(coordinator, "clicks", t1.txid, click_fn)  # attempt 2: the one to keep
    a3, _ = attempts.begin_attempt(coordinator.store, "clicks", t1.txid)      # attempt 3: still running, keep
    coordinator.stage(a3, "clicks_count", [("u0", 1)])
    a4, _ = attempts.begin_attempt(coordinator.store, "clicks", t1.txid)      # attempt 4: crashed -> failed
    coordinator.stage(a4, "clicks_count", [("u0", 1)])
    attempts.fail_attempt(coordinator.store, a4, "killed")
    query(dsn, "INSERT INTO airflow_txn.stg_1_clicks_count VALUES (99, 1, 'orphan', 1)")
    before = query(dsn, "SELECT attempt, count(*) FROM airflow_txn.stg_1_clicks_count GROUP BY 1 ORDER BY 1")
    res = coordinator.recover("clicks")
    after = query(dsn, "SELECT attempt, count(*) FROM airflow_txn.stg_1_clicks_count GROUP BY 1 ORDER BY 1")
    kept = {a for a, _ in after}
    assert kept == {2, 3} and {a for a, _ in before} == {1, 2, 3, 4}
    assert res.attempts_discarded == 1
    assert coordinator.recover("clicks").staged_rows_deleted == 0  # idempotent
    assert coordinator.commit("clicks", t1.txid).attempt == 2


def test_unknown_topology_names_the_fix(coordinator: Coordinator) -> None:
    with pytest.raises(UnknownTopology, match=r"call Coordinator.register\(spec\)"):
        coordinator.plan("nope", "r")


def test_status_reports_phases_lag_and_last_commit(coordinator: Coordinator, topo) -> None:  # type: ignore[no-untyped-def]
    topo.append([click(i) for i in range(160)])
    run_one(coordinator, "clicks", "a")
    t2 = coordinator.plan("clicks", "b")
    t3 = coordinator.plan("clicks", "c")
    process_batch(coordinator, "clicks", t2.txid, click_fn)
    attempts.begin_attempt(coordinator.store, "clicks", t3.txid)
    st = coordinator.status("clicks")
    assert st.committed_txid == 1 and st.last_commit_at is not None
    assert [(f.txid, f.phase) for f in st.in_flight] == [(2, "processed"), (3, "processing")]
    assert st.lag == 110
    assert st.to_dict()["in_flight"][0]["run_key"] == "b"


def test_tries_whose_driver_died_before_registering_an_attempt_show_as_failed(  # type: ignore[no-untyped-def]
        coordinator: Coordinator, topo) -> None:
    """A driver killed before it registered an attempt leaves no attempt row: the process task's
    failed tries say what happened, until an attempt begins after them."""
    topo.append([click(i) for i in range(30)])
    t1 = coordinator.plan("clicks", "a")
    killed = "process: spark-submit exited with code -9 (killed by SIGKILL: out of memory (the OOM killer), ...)"
    coordinator.note_failed_try("clicks", t1.txid, "process: spark-submit exited with code 1")
    coordinator.note_failed_try("clicks", t1.txid, killed)
    [f] = coordinator.status("clicks").in_flight
    assert (f.phase, f.attempts, f.failed_tries, f.error) == ("failed", 0, 2, killed)
    [shown] = coordinator.timeline("clicks", 5)
    assert (shown["failed_tries"], shown["last_try_failure"]) == (2, killed)
    assert coordinator.last_error("clicks", t1.txid) == killed  # what a waiting commit reports as the blocker
    # The next try registers an attempt: it is what the status shows now, the count stays.
    attempts.begin_attempt(coordinator.store, "clicks", t1.txid)
    [f] = coordinator.status("clicks").in_flight
    assert (f.phase, f.attempts, f.failed_tries, f.error) == ("processing", 1, 2, None)
    # A task that fails after its attempt completed leaves the batch processed: the commit can use it.
    process_batch(coordinator, "clicks", t1.txid, click_fn)
    coordinator.note_failed_try("clicks", t1.txid, "process: the task was killed after its job finished")
    assert coordinator.status("clicks").in_flight[0].phase == "processed"
    assert coordinator.commit("clicks", t1.txid).committed
    coordinator.note_failed_try("clicks", t1.txid, "late")  # a committed txid keeps its record
    assert coordinator.timeline("clicks", 5)[0]["failed_tries"] == 3


@pytest.mark.parametrize("run_key", ["a\0b", "", "r" * 251, None])
def test_a_run_key_postgres_cannot_store_is_refused_naming_the_rule(coordinator: Coordinator, topo,  # type: ignore[no-untyped-def]
                                                                     run_key: object) -> None:
    """Regression: a NUL in a run key reached psycopg2 and came back as a raw ValueError."""
    with pytest.raises(ConfigError, match="run key must be non-empty text of at most 250 characters without NUL"):
        coordinator.plan("clicks", run_key)  # type: ignore[arg-type]


def test_a_topology_that_does_not_commit_while_records_wait_is_stalled_and_says_on_what(  # type: ignore[no-untyped-def]
        coordinator: Coordinator, topo) -> None:
    """The stall rule: no commit for the declared stall_after while the source holds records is
    the blocker, with what the next txid is doing and for how long; a commit ends it, a failed
    txid's blocker comes first, and a topology declared without the rule never stalls."""
    import dataclasses
    import time

    coordinator.register(dataclasses.replace(counting_topology(), stall_after_seconds=1))
    topo.append([click(i) for i in range(120)])
    t1 = coordinator.plan("clicks", "a")
    assert not coordinator.status("clicks").stalled  # planned a moment ago
    time.sleep(1.2)
    st = coordinator.status("clicks")
    [f, *_] = st.in_flight
    assert f.since is not None and f.phase == "planned"
    assert st.stalled and st.blocked_by is not None
    assert st.blocked_by.startswith("stalled: no commit since txid 1 was planned 1 s ago (stall_after 1 s) while "
                                    "the source holds 120 records; txid 1 planned for 1 s, its process task not "
                                    "started (waiting for a pool slot, a worker or the scheduler)")
    process_batch(coordinator, "clicks", t1.txid, click_fn)
    assert coordinator.commit("clicks", t1.txid).committed
    assert coordinator.status("clicks").blocked_by is None  # just committed
    time.sleep(1.2)  # 70 records wait and nothing planned them
    assert coordinator.status("clicks").blocked_by == (
        "stalled: no commit for 1 s (stall_after 1 s) while the source holds 70 records; no run has planned txid 2: "
        "is the DAG paused, or are its runs queued behind max_active_runs?")
    t2 = coordinator.plan("clicks", "b")
    attempts.begin_attempt(coordinator.store, "clicks", t2.txid)
    assert "; txid 2 processing for" in str(coordinator.status("clicks").blocked_by)
    coordinator.mark_failed("clicks", t2.txid, "process: spark-submit exited with code 1")
    assert str(coordinator.status("clicks").blocked_by).startswith("blocked by failed txid 2")
    coordinator.register(counting_topology())  # declared without the rule
    assert coordinator.status("clicks").stalled is False
