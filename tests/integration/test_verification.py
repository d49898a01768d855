"""core/verify.py on a real Postgres, with the pure-Python verifier: committed txids recomputed from
their source by the same code and checked against their commits' digests; the mark
verified_through moves over contiguous passing txids only. A state row changed by hand and an
event changed in the log after its commit are caught, named by txid, state and key; retention
after a check keeps the mark, retention before it is reported as unverifiable; a round killed
halfway resumes without skipping a txid; corrections are checked as their commit computed them."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from airflow_transactional import OutputSpec
from airflow_transactional.airflow.ui import pages
from airflow_transactional.coordinator import Coordinator
from airflow_transactional.processing import OutputEvent, process_batch, verify
from airflow_transactional.sources import EventLog
from dev import faults
from tests.helpers import click, click_fn, counting_topology, make_log, query, run_one
from tests.integration.test_corrections import _truncate_all, buggy, fixed

pytestmark = pytest.mark.integration


def _statuses(coord: Coordinator) -> dict[int, str]:
    return {c["txid"]: c["status"] for c in coord.verify_status("clicks")["checks"]}


def _committed(dsn: str, batches: int, fn: Any = click_fn, per: int = 10, kind: str = "transactional"
               ) -> Coordinator:
    make_log(dsn).append([click(i) for i in range(batches * per)])
    coord = Coordinator(dsn)
    coord.register(counting_topology(max_batch_size=per, kind=kind))
    for n in range(batches):
        run_one(coord, "clicks", f"r{n}", fn)
    return coord


def test_each_txid_is_verified_in_order_and_the_mark_follows_the_commits(dsn: str) -> None:
    coord = _committed(dsn, 5)
    found = verify(coord, "clicks", click_fn, budget=3)
    assert [c["txid"] for c in found["checked"]] == [1, 2, 3] and found["verified_through"] == 3
    assert all(c["status"] == "verified" for c in found["checked"])
    assert verify(coord, "clicks", click_fn, budget=3)["verified_through"] == 5
    assert _statuses(coord) == dict.fromkeys(range(1, 6), "verified")
    # Nothing of the recomputations stays behind: only the committed attempts' rows (the history).
    assert query(dsn, "SELECT count(*) FROM airflow_txn.vfy_1_clicks_count WHERE attempt < 0") == [(0,)]
    run_one(coord, "clicks", "r-late", click_fn)  # nothing new in the log: an empty txid, verified as such
    assert verify(coord, "clicks", click_fn)["settled"] == {6: "verified"}
    assert coord.verify_status("clicks")["verified_through"] == 6
    coord.close()


@pytest.mark.parametrize("kind", ["transactional", "opaque"])
def test_a_state_row_changed_by_hand_is_caught_within_one_round_naming_state_and_key(dsn: str, kind: str) -> None:
    coord = _committed(dsn, 3, kind=kind)
    verify(coord, "clicks", click_fn, budget=2)
    query(dsn, "UPDATE clicks_amount SET value = value + 1 WHERE user_id = 'u3'")
    found = verify(coord, "clicks", click_fn)
    assert found["settled"] == {3: "failed"} and found["checked"] == []  # the txid the states are at
    [check] = [c for c in coord.verify_status("clicks")["checks"] if c["txid"] == 3]
    assert list(check["detail"]["states"]) == ["clicks_amount"]
    [sample] = check["detail"]["states"]["clicks_amount"]["samples"]
    assert sample["key"] == "u3" and int(sample["stored"]) == int(sample["history"]) + 1
    assert coord.verify_status("clicks")["verified_through"] == 2  # held before it
    coord.close()


def test_a_hand_made_update_hidden_in_the_delta_history_is_caught_and_steps_the_mark_back(dsn: str) -> None:
    """Regression: the run-time role changed a state row and rewrote the txid's history row to
    match; the state added up to the history, the next round verified everything, and ``state
    --as-of`` agreed with the forgery. The history is checked against the commit's digest."""
    coord = _committed(dsn, 3)
    assert verify(coord, "clicks", click_fn)["verified_through"] == 3
    query(dsn, "UPDATE clicks_amount SET value = value + 1 WHERE user_id = 'u3'")
    query(dsn, "UPDATE airflow_txn.stg_1_clicks_amount SET value = value + 1 WHERE user_id = 'u3' AND txid = 2")
    found = verify(coord, "clicks", click_fn)
    assert found["settled"] == {2: "failed"}, found
    assert coord.verify_status("clicks")["verified_through"] == 1  # stepped back before the forged txid
    [check] = [c for c in coord.verify_status("clicks")["checks"] if c["txid"] == 2]
    assert "its delta history is no longer what its commit applied" in check["detail"]["reason"]
    assert list(check["detail"]["states"]) == ["clicks_amount"]
    # Put back as committed and checked again: verified, the mark moves on.
    query(dsn, "UPDATE clicks_amount SET value = value - 1 WHERE user_id = 'u3'")
    query(dsn, "UPDATE airflow_txn.stg_1_clicks_amount SET value = value - 1 WHERE user_id = 'u3' AND txid = 2")
    coord.verify_recheck("clicks", 2, 2)
    assert verify(coord, "clicks", click_fn)["verified_through"] == 3
    coord.close()


def test_an_event_changed_in_the_log_after_its_commit_fails_its_txid_naming_the_keys(dsn: str) -> None:
    coord = _committed(dsn, 3)
    query(dsn, "UPDATE airflow_txn.log_events SET payload = %s WHERE event_id = 'ev-14'",
          ('{"user": "u4", "amount": 99}',))
    found = verify(coord, "clicks", click_fn)
    failed = [c for c in found["checked"] if c["status"] == "failed"]
    assert len(failed) == 1 and len(found["checked"]) == 3
    differences = failed[0]["differences"]
    assert sorted(s["key"] for s in differences["clicks_amount"]["samples"]) == ["u0", "u4"]
    assert sorted(s["key"] for s in differences["clicks_count"]["samples"]) == ["u0", "u4"]
    assert found["verified_through"] == failed[0]["txid"] - 1
    # Checked again, it fails again (the log still holds the changed event): the mark holds.
    assert coord.verify_recheck("clicks", failed[0]["txid"], failed[0]["txid"]) == failed[0]["txid"] - 1
    assert [c["status"] for c in verify(coord, "clicks", click_fn)["checked"]] == ["failed"]
    coord.close()


def test_retention_after_a_check_keeps_it_and_before_a_check_says_unverifiable(dsn: str) -> None:
    coord = _committed(dsn, 4)
    verify(coord, "clicks", click_fn, budget=2)
    _truncate_all(dsn, EventLog(dsn, "clicks"))
    found = verify(coord, "clicks", click_fn)
    assert found["checked"] == [] and found["settled"] == {3: "unverifiable", 4: "unverifiable"}
    assert _statuses(coord) == {1: "verified", 2: "verified", 3: "unverifiable", 4: "unverifiable"}
    [check] = [c for c in coord.verify_status("clicks")["checks"] if c["txid"] == 3]
    assert "its input is gone before it was checked" in check["detail"]["reason"]
    assert coord.verify_status("clicks")["verified_through"] == 2
    coord.close()


def test_a_round_killed_halfway_resumes_without_skipping_or_counting_twice(dsn: str) -> None:
    coord = _committed(dsn, 4)
    code = ("from airflow_transactional.coordinator import Coordinator; from airflow_transactional.processing "
            "import verify; from tests.helpers import click_fn; "
            f"verify(Coordinator({dsn!r}), 'clicks', click_fn, budget=4)")
    child = subprocess.run([sys.executable, "-c", code], env=faults.child_env(faults="verify.judge:clicks:3=exit"),
                           capture_output=True, text=True, timeout=120)
    assert child.returncode != 0, child.stdout + child.stderr  # it died judging txid 3
    assert _statuses(coord) == {1: "verified", 2: "verified", 3: "pending", 4: "pending"}
    assert query(dsn, "SELECT count(*) FROM airflow_txn.vfy_1_clicks_count WHERE attempt < 0")[0][0] > 0
    found = verify(coord, "clicks", click_fn, budget=4)
    assert [(c["txid"], c["status"]) for c in found["checked"]] == [(3, "verified"), (4, "verified")]
    assert found["verified_through"] == 4
    coord.close()


def test_sampling_checks_one_in_k_and_always_a_retried_txid(dsn: str) -> None:
    make_log(dsn).append([click(i) for i in range(60)])
    coord = Coordinator(dsn)
    coord.register(counting_topology(max_batch_size=10))
    for n in range(6):
        txn = coord.plan("clicks", f"r{n}")
        process_batch(coord, "clicks", txn.txid, click_fn)
        if txn.txid == 4:  # a cleared task: processed again before its commit
            process_batch(coord, "clicks", txn.txid, click_fn)
        coord.commit("clicks", txn.txid)
    found = verify(coord, "clicks", click_fn, every=3)
    assert [c["txid"] for c in found["checked"]] == [3, 4, 6]
    assert _statuses(coord) == {1: "skipped", 2: "skipped", 3: "verified", 4: "verified", 5: "skipped",
                                6: "verified"}
    assert found["verified_through"] == 6
    coord.close()


def test_txids_of_code_no_longer_deployed_wait_for_their_correction_which_is_checked(dsn: str) -> None:
    coord = _committed(dsn, 4, fn=buggy)
    verify(coord, "clicks", buggy, budget=2)  # the buggy code checks what it committed: the same
    found = verify(coord, "clicks", fixed)  # the fix deployed: 3 and 4 cannot be checked by it
    assert found["settled"] == {3: "unverifiable", 4: "unverifiable"} and found["verified_through"] == 2
    [check] = [c for c in coord.verify_status("clicks")["checks"] if c["txid"] == 3]
    assert check["detail"]["reason"] == "committed under other code than the code checking it"
    fix = coord.plan_correction("clicks", "fix", 3, 4)
    process_batch(coord, "clicks", fix.txid, fixed)
    coord.commit("clicks", fix.txid)
    found = verify(coord, "clicks", fixed)
    assert found["settled"] == {3: "superseded", 4: "superseded"}
    assert [(c["txid"], c["kind"], c["status"]) for c in found["checked"]] == [(5, "range", "verified")]
    assert found["verified_through"] == 5
    coord.close()


def test_the_transactions_pages_show_each_check_the_mark_and_what_differs(dsn: str) -> None:
    coord = _committed(dsn, 3)
    now = datetime.now(UTC)
    summary = coord.summary("clicks", dag_id="clicks", now=now)
    assert summary["verified_through"] is None  # no round ever ran: nothing said
    assert "Verified through" not in pages.topology("", summary, coord.timeline("clicks"), now)
    query(dsn, "UPDATE airflow_txn.log_events SET payload = %s WHERE event_id = 'ev-25'",
          ('{"user": "u9", "amount": 1}',))
    [bad] = [c["txid"] for c in verify(coord, "clicks", click_fn)["checked"] if c["status"] == "failed"]
    summary = coord.summary("clicks", dag_id="clicks", now=now)
    assert summary["verified_through"] == bad - 1 and summary["verification_failures"] == [bad]
    html = pages.topology("", summary, coord.timeline("clicks"), now)
    assert f"Verified through txid <b>{bad - 1}</b> of 3 committed" in html
    assert f"1 committed txid failed the check: {bad}" in html
    assert html.count("<td>verified</td>") == 2 and "<span class=blocked>failed</span>" in html
    page = pages.run("", "clicks", f"r{bad - 1}", coord.run_view("clicks", f"r{bad - 1}"), [], None)
    assert "Check: <b>failed</b>: recomputed from its source, other deltas." in page
    assert "<td>clicks_amount</td><td>u4</td>" in page and "<td>clicks_count</td><td>u9</td>" in page
    good = next(t for t in (1, 2, 3) if t != bad)
    assert "Check: <b>verified</b>" in pages.run("", "clicks", f"r{good - 1}",
                                                 coord.run_view("clicks", f"r{good - 1}"), [], None)
    coord.close()


def test_the_verify_task_fails_while_a_check_has_failed_naming_txid_state_and_keys(
        dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_transactional.airflow import metrics
    from airflow_transactional.airflow.hooks import TransactionalHook
    from airflow_transactional.airflow.operators import VerifyOperator

    coord = _committed(dsn, 2)
    query(dsn, "UPDATE clicks_count SET value = value + 5 WHERE user_id = 'u1'")
    verify(coord, "clicks", click_fn)  # txid 1 verified; the hand-made UPDATE fails txid 2
    monkeypatch.setattr(TransactionalHook, "get_dsn", lambda self: dsn)
    monkeypatch.setattr(TransactionalHook, "state_schema", lambda self: coord.schema)
    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(metrics, "verified", lambda t, *, verified_through, failures: sent.append(
        (verified_through, failures)))
    task = VerifyOperator(task_id="verify", topology=counting_topology(max_batch_size=10).to_config(),
                          transactional_conn_id="store", application="unused.py")
    with pytest.raises(AirflowFailException) as failed:
        task.execute({"run_id": "r1", "ti": None})  # nothing left to check: no job is started
    assert str(failed.value).splitlines()[:2] == [
        "topology 'clicks': 1 committed txid(s) failed their check",
        "  txid 2: a state does not add up to what the commits applied (written outside them) (clicks_count: u1)"]
    assert "airflow-txn verify clicks --status" in str(failed.value) and sent == [(1, 1)]
    coord.close()


def test_the_verify_task_starts_a_job_only_for_txids_to_recompute_its_jit_sized_by_them(
        dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    from airflow_transactional.airflow.hooks import TransactionalHook
    from airflow_transactional.airflow.operators import VerifyOperator
    from airflow_transactional.spark.submit import SHORT_JIT

    coord = _committed(dsn, 2)
    monkeypatch.setattr(TransactionalHook, "get_dsn", lambda self: dsn)
    monkeypatch.setattr(TransactionalHook, "state_schema", lambda self: coord.schema)
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_TEST", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    jobs: list[tuple[list[str], str]] = []
    monkeypatch.setattr(SparkSubmitOperator, "execute", lambda self, context: jobs.append(
        (list(self.application_args), self.conf.get("spark.driver.extraJavaOptions", ""),
         json.loads(Path(self.application_args[self.application_args.index("--recompute") + 1]).read_text()))))
    task = VerifyOperator(task_id="verify", topology=counting_topology(max_batch_size=10).to_config(),
                          transactional_conn_id="store", application="unused.py", conn_id="spark_test",
                          verify_round="10:3")
    task.execute({"run_id": "r1", "ti": None})  # txids 1 and 2 are not sampled: settled, no job
    assert jobs == [] and _statuses(coord) == {1: "skipped", 2: "skipped"}
    assert coord.verify_status("clicks")["verified_through"] == 2
    make_log(dsn).append([click(i) for i in range(20, 30)])
    run_one(coord, "clicks", "r2", click_fn)  # txid 3 is sampled: the job recomputes it, on the small JIT
    task.execute({"run_id": "r2", "ti": None})
    [(args, java, asked)] = jobs
    # The job's request, typed: a verify round of 10 txids, 1 in 3 -- its file removed after the job.
    assert asked == {"kind": "verify", "topology_id": "clicks", "budget": 10, "every": 3} and java.startswith(SHORT_JIT)
    assert not Path(args[args.index("--recompute") + 1]).exists()
    assert _statuses(coord)[3] == "pending"  # (the job was not run here: it would check txid 3)
    # With verify_lag=1 a txid to recompute may wait for the next run's round: two are recomputed together.
    lagging = VerifyOperator(task_id="verify", topology=counting_topology(max_batch_size=10).to_config(),
                             transactional_conn_id="store", application="unused.py", conn_id="spark_test",
                             verify_round="10", verify_lag=1)
    verify(coord, "clicks", click_fn)
    make_log(dsn).append([click(i) for i in range(30, 50)])
    for n in (3, 4):
        run_one(coord, "clicks", f"r{n}", click_fn)
        lagging.execute({"run_id": f"r{n}", "ti": None})
        assert len(jobs) == n - 2  # txid 4 alone waits; with txid 5, one job recomputes both
    assert _statuses(coord)[4] == _statuses(coord)[5] == "pending"
    coord.close()


def _noted(rec: dict[str, Any]) -> list[Any]:
    return [("clicks_count", (rec["user"],), 1), ("clicks_amount", (rec["user"],), rec["amount"]),
            OutputEvent("seen", {"user": rec["user"], "note": rec.get("note")},
                        id=f"seen-{rec['amount']}-{rec['user']}")]


def test_an_output_log_s_events_are_checked_by_the_digest_its_commit_recorded(dsn: str) -> None:
    make_log(dsn).append([click(i) for i in range(30)])
    coord = Coordinator(dsn)
    coord.register(replace(counting_topology(max_batch_size=10), outputs=(OutputSpec("seen", partitions=2),)))
    for n in range(3):
        run_one(coord, "clicks", f"r{n}", _noted)
    digests = [c["digests"]["out:seen"] for c in coord.commits("clicks")]
    assert all(int(d.split(":")[0]) > 0 for d in digests)  # each commit's events, counted and hashed
    # Only the events change (a field no state reads): the states' digests agree, the output's does not.
    query(dsn, "UPDATE airflow_txn.log_events SET payload = %s WHERE event_id = 'ev-4'",
          (json.dumps({"user": "u4", "amount": 4, "note": "changed"}),))
    found = verify(coord, "clicks", _noted)
    [failed] = [c for c in found["checked"] if c["status"] == "failed"]
    assert list(failed["differences"]) == ["output seen"] and found["verified_through"] == failed["txid"] - 1
    assert query(dsn, "SELECT count(*) FROM airflow_txn.out_1 WHERE attempt < 0") == [(0,)]
    coord.close()
