"""Operating a topology from the UI (through the same REST API): a killed Spark driver retried, a
txid that fails for good, the fail-fast cascade that frees max_active_runs slots, both recovery
paths (clear; backfill with "reprocess failed"), a scheduler killed mid-flight, clears of
committed runs, a rebuild while runs commit, retention during processing with a pause and an
api-server restart, a deleted run's batch taken over by the next run -- each ending with the
audit clean and every txid committed once, in order."""

from __future__ import annotations

import json
import re
import signal
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest.mock import ANY

import pytest

from airflow_transactional.cli import main as cli
from dev.localstack import VIEWER, LocalStack, RestClient, on_schedule
from tests.e2e.browsing import frame_text, shot, signed_in
from tests.e2e.conftest import ON_CONNECT, OPS_DAGS, StatsdListener, task_log, wait_for_runs
from tests.e2e.operating import browser, cli_with_env, plugin_post, runs_by_txid, set_faults, start_topology
from tests.helpers import query

pytestmark = pytest.mark.e2e

DAG = "ops_count"
#: The first run's day: runs a day apart at the schedule's time, so a backfill over the range finds them.
DAY0 = datetime(2025, 3, 1, tzinfo=UTC)


REPORT = "ops_count_report"


def _downstream_ran_once_per_txid(stack: LocalStack, client: RestClient, records: dict[int, int]) -> None:
    deadline = time.monotonic() + 180
    while len(runs := client.runs(REPORT)) < len(records) and time.monotonic() < deadline:
        time.sleep(3)
    wait_for_runs(stack, REPORT, [r["dag_run_id"] for r in runs])
    time.sleep(10)  # a duplicate event would queue a run within a scheduler loop or two
    runs = client.runs(REPORT)
    assert sorted(int(r["partition_key"]) for r in runs) == sorted(records), [r["partition_key"] for r in runs]
    for r in runs:
        told = client.get(f"/api/v2/dags/{REPORT}/dagRuns/{urllib.parse.quote(r['dag_run_id'], safe='')}"
                          "/taskInstances/report/xcomEntries/return_value")["value"]
        told = json.loads(told) if isinstance(told, str) else told
        assert told == {"partition_key": r["partition_key"], "txid": int(r["partition_key"]),
                        "records_read": records[int(r["partition_key"])]}, told


def _clear_from_the_page(stack: LocalStack, client: RestClient, run_id: str, txid: int, later: list[int]) -> None:
    page_path = f"/transactional/dags/{DAG}/runs/{urllib.parse.quote(run_id, safe='')}"
    code, page, _ = browser(stack, "GET", page_path, client.token())
    assert code == 200 and "Clear this run's failed tasks" in page and f"{page_path}/clear" in page
    code, preview, _ = browser(stack, "GET", f"{page_path}/clear", client.token())
    assert code == 200 and f"txid {txid} processes the same batch again" in preview, preview
    failed = {t["task_id"] for t in client.task_instances(DAG, run_id) if t["state"] in ("failed", "upstream_failed")}
    assert failed and all(f"<td>{task}</td>" in preview for task in failed), preview
    assert f"txids {', '.join(map(str, later))}" in preview  # the failed runs after it, and what to do
    token = re.search(r"name=token value='([0-9a-f]{64})'", preview)
    assert token, preview
    # A post riding on the cookie without the preview's token (a forged form) changes nothing;
    # a Viewer's preview is refused by Airflow itself.
    assert browser(stack, "POST", f"{page_path}/clear", client.token(), {"token": "0" * 64})[0] == 403
    assert browser(stack, "GET", f"{page_path}/clear", stack.client(VIEWER).token())[0] == 403
    assert client.run(DAG, run_id)["state"] == "failed"
    code, _, location = browser(stack, "POST", f"{page_path}/clear", client.token(), {"token": token.group(1)})
    assert code == 303 and location == f"{page_path}?cleared={len(failed)}", (code, location)
    assert "Cleared" in browser(stack, "GET", location, client.token())[1]


@dataclass
class _Cascade:
    """What the phases of the cascade share: the stack, the topology's log, and its runs."""

    stack: LocalStack
    client: RestClient
    coord: Any
    log: Any
    runs: list[str]
    events: int
    by_txid: dict[int, str] = field(default_factory=dict)
    blocked: list[int] = field(default_factory=list)
    unplanned: list[str] = field(default_factory=list)


def test_failure_cascade_recovery_restart_and_clears_stay_exactly_once(stack: LocalStack, client: RestClient,
                                                                       statsd: StatsdListener, chrome: object) -> None:
    client.wait_for_dag(REPORT)
    client.unpause(REPORT)  # runs once per txid ops_count commits, on its asset events
    log, coord = start_topology(stack, client, DAG, "ops", partitions=4)
    log.append([(f"ops{i}", json.dumps({"url": f"https://example.com/{i}"})) for i in range(2000)])
    # txid 2's driver is killed once after staging (a transient failure); txid 3's dies on every
    # try before it registers an attempt (a permanent one, that only the process task can tell).
    set_faults(stack, f"spark.after_stage:{DAG}:2=exit@once:{stack.base_dir / 'kill-2.once'}",
               f"spark.start:{DAG}:3=exit")
    # Logical dates on the DAG's daily schedule, so a backfill over the range finds these very runs.
    day0 = on_schedule(DAY0, stack.extra_env["AIRFLOW_TXN_EXAMPLE_SCHEDULE"])
    runs = [client.trigger(DAG, (day0 + timedelta(days=k)).isoformat())["dag_run_id"] for k in range(5)]
    cascade = _Cascade(stack, client, coord, log, runs, events=2000)
    _a_failed_txid_blocks_the_later_ones(cascade, statsd)
    _a_person_sees_the_blocked_topology_and_why(cascade, chrome)
    _clearing_the_failed_run_recovers_through_a_scheduler_kill(cascade)
    _reprocessing_the_failed_runs_reuses_their_staged_output(cascade)
    _clearing_committed_runs_changes_nothing(cascade)
    _a_rebuild_repairs_the_table_while_airflow_commits(cascade)

    # Every txid committed once, in txid order; the audit recomputes the same state.
    commits = coord.commits(DAG)
    assert [c["txid"] for c in commits] == [1, 2, 3, 4, 5, 6, 7]
    # ... and was reported once, whatever the clears and backfills; the topology is unblocked.
    assert sorted(v for v, _ in statsd.values(DAG, "committed_txid")) == [1, 2, 3, 4, 5, 6, 7]
    assert statsd.values(DAG, "blocked")[-1] == (0.0, "g")
    # The downstream DAG ran once per committed txid -- not again for the clears of committed
    # runs -- each run on one asset event whose partition key and extra name its txid.
    _downstream_ran_once_per_txid(stack, client, {c["txid"]: c["records_read"] for c in commits})
    assert [c["committed_at"] for c in commits] == sorted(c["committed_at"] for c in commits)
    assert coord.status(DAG).lag == 0
    assert cli(["--dsn", stack.state_dsn, "audit", DAG, "--dag-file", str(OPS_DAGS), *ON_CONNECT]) == 0
    coord.close()
    log.close()


def _a_failed_txid_blocks_the_later_ones(c: _Cascade, statsd: StatsdListener) -> None:
    """Every run finishes (no deadlock): txid 2 on its retry, txid 3 failed, the later ones
    failed fast naming it, and the runs past max_in_flight never planned."""
    stack, coord = c.stack, c.coord
    states = wait_for_runs(stack, DAG, c.runs, allow_failed=True)
    planned = [r for r in c.runs if coord.transaction_for_run(DAG, r) is not None]
    c.by_txid = runs_by_txid(coord, planned, DAG)
    c.blocked = sorted(t for t in c.by_txid if t > 3)
    assert sorted(c.by_txid)[:2] == [2, 3] and c.blocked == list(range(4, 4 + len(c.blocked))) and c.blocked
    assert states[c.by_txid[2]] == "success"
    # The killed attempt's staged rows were never committed: Airflow's retry made attempt 2.
    assert query(stack.state_dsn, "SELECT attempt, status = 'committed' FROM airflow_txn.attempts "
                                  "WHERE topology_id = %s AND txid = 2 ORDER BY attempt", (DAG,)) == [(1, False),
                                                                                                      (2, True)]
    assert {states[c.by_txid[t]] for t in (3, *c.blocked)} == {"failed"}
    killed = "process: the Spark Connect job exited with code 137 (killed by SIGKILL"
    assert killed in task_log(stack, DAG, c.by_txid[3], "process")  # the log's last word, in one line
    for t in c.blocked:  # they failed fast, naming the txid that blocks them and what to do
        text = task_log(stack, DAG, c.by_txid[t], "commit")
        assert "blocked by failed txid 3" in text and "Clear that run's tasks" in text, text[-3000:]
    # Runs started once max_in_flight=3 txids were uncommitted could not even be planned: the
    # oldest failed for good, so their plan tasks failed fast too instead of waiting.
    c.unplanned = [r for r in c.runs if r not in planned]
    assert c.unplanned
    for r in c.unplanned:
        assert states[r] == "failed"
        assert "blocked by failed txid 3" in task_log(stack, DAG, r, "plan")
    status = coord.status(DAG)
    assert status.committed_txid == 2
    assert status.blocked_by and "blocked by failed txid 3" in status.blocked_by
    # No attempt was ever registered, yet txid 3 shows as failed, both tries counted, what happened
    # said in one line -- in the status the CLI prints and on the run's Transaction page.
    [failed] = [f for f in status.in_flight if f.txid == 3]
    assert (failed.phase, failed.attempts, failed.failed_tries) == ("failed", 0, 2), failed
    assert failed.error and failed.error.startswith(killed) and "\n" not in failed.error, failed.error
    page = browser(stack, "GET", f"/transactional/dags/{DAG}/runs/{urllib.parse.quote(c.by_txid[3], safe='')}",
                   c.client.token())[1]
    assert f"Failed for good after 2 failed tries: {killed}" in page, page
    # The monitoring heard it: a commit that failed fast set the topology's blocked gauge.
    assert (1.0, "g") in statsd.values(DAG, "blocked")


def _a_person_sees_the_blocked_topology_and_why(c: _Cascade, chrome: object) -> None:
    """In a real browser, signed in: the overview says what blocks the topology; the DAG's
    Transactions tab shows the failed txid as failed; the failed run's Transaction tab says in one
    line how it failed, and links to the whole log (docs/guides/ui.md shows them)."""
    driver = signed_in(chrome, c.stack)
    driver.get(f"{c.stack.url}/plugin/transactions")  # type: ignore[attr-defined]
    text = frame_text(driver, f"blocked by failed txid 3 (run {c.by_txid[3]})")
    assert "txid 3: failed for " in text and "process: the Spark Connect job exited with code 137" in text, text
    shot(driver, "ui-blocked.png", c.stack.base_dir)
    # The DAG's Transactions tab: txid 3 failed for good in the table, its killed tries a bar of the timeline.
    driver.get(f"{c.stack.url}/dags/{DAG}/plugin/transactions-dag")  # type: ignore[attr-defined]
    text = frame_text(driver, "failed for good")
    assert "blocked by failed txid 3" in text, text
    bars = driver.execute_script(  # type: ignore[attr-defined]  # in the plugin's frame, as frame_text left it
        "return [...document.querySelectorAll('rect.bar-failed title')].map(t => t.textContent)")
    assert any(b.startswith("txid 3") for b in bars), bars
    shot(driver, "ui-topology-failed.png", c.stack.base_dir)
    run = urllib.parse.quote(c.by_txid[3], safe="")
    driver.get(f"{c.stack.url}/dags/{DAG}/runs/{run}/plugin/transactions-run")  # type: ignore[attr-defined]
    text = frame_text(driver, "Failed for good after 2 failed tries: process: the Spark Connect job exited with "
                      "code 137 (killed by SIGKILL")
    assert "The process task's log in Airflow" in text, text
    shot(driver, "ui-failed-run.png", c.stack.base_dir)


def _clearing_the_failed_run_recovers_through_a_scheduler_kill(c: _Cascade) -> None:
    """The fault is fixed; the failed run of txid 3 is cleared from its Transactions page, as a
    person does: the preview (Airflow's dry run), then the button. A scheduler killed mid-flight
    and restarted does not change the outcome."""
    set_faults(c.stack)
    _clear_from_the_page(c.stack, c.client, c.by_txid[3], 3, later=c.blocked)
    c.stack.stop_component("scheduler", signal.SIGKILL)
    c.stack.start_component("scheduler")
    wait_for_runs(c.stack, DAG, [c.by_txid[3]])
    assert c.coord.status(DAG).committed_txid == 3


def _reprocessing_the_failed_runs_reuses_their_staged_output(c: _Cascade) -> None:
    """A backfill over the range with "reprocess failed" clears the failed runs in place (same run
    ids): the blocked txids reuse the output their processing staged, and the runs that were never
    planned get the next txids. Started through the plugin's API: the range is the one of the
    failed runs, and the preview names each run and its txid."""
    stack, client, blocked, unplanned = c.stack, c.client, c.blocked, c.unplanned
    topology_page = browser(stack, "GET", f"/transactional/dags/{DAG}", client.token())[1]
    assert "Reprocess the failed runs" in topology_page and f"/transactional/dags/{DAG}/reprocess" in topology_page
    shown = browser(stack, "GET", f"/transactional/dags/{DAG}/reprocess", client.token())[1]
    assert f"Start the backfill ({len(blocked) + len(unplanned)} runs)" in shown, shown
    preview = plugin_post(stack, f"/transactional/api/dags/{DAG}/reprocess", client.token(), {"dry_run": True})[1]
    assert sorted(r["run_id"] for r in preview["runs"]) == sorted([c.by_txid[t] for t in blocked] + unplanned)
    assert sorted(r["txid"] for r in preview["runs"] if r["txid"] is not None) == blocked
    assert preview["unreachable"] == [] and preview["problem"] is None
    # A Viewer may look at it all but start nothing: Airflow's own permission check says no.
    viewer = stack.client(VIEWER).token()
    code, refused = plugin_post(stack, f"/transactional/api/dags/{DAG}/reprocess", viewer, {"dry_run": False})
    assert code == 403 and "may not" in refused["detail"], refused
    assert client.get(f"/api/v2/backfills?dag_id={DAG}")["total_entries"] == 0
    code, done = plugin_post(stack, f"/transactional/api/dags/{DAG}/reprocess", client.token(), {"dry_run": False})
    assert code == 200 and done["backfill"]["reprocess_behavior"] == "failed", done
    wait_for_runs(stack, DAG, [c.by_txid[t] for t in blocked] + unplanned)
    assert c.coord.status(DAG).committed_txid == 6
    assert sorted(c.coord.transaction_for_run(DAG, r).txid for r in unplanned) == list(range(blocked[-1] + 1, 7))
    assert "reusing its staged output" in task_log(stack, DAG, c.by_txid[4], "process")
    c.by_txid = runs_by_txid(c.coord, c.runs, DAG)


def _clearing_committed_runs_changes_nothing(c: _Cascade) -> None:
    """Clearing committed runs -- one task, or a whole run -- is a logged no-op."""
    dsn = c.stack.state_dsn
    assert query(dsn, "SELECT id, value FROM ops_count") == [("all", c.events)]
    c.client.clear(DAG, c.by_txid[2], ["commit"])
    c.client.clear(DAG, c.by_txid[4])
    wait_for_runs(c.stack, DAG, [c.by_txid[2], c.by_txid[4]])
    assert "txid 2 already committed at" in task_log(c.stack, DAG, c.by_txid[2], "commit")
    assert "txid 4 already committed at" in task_log(c.stack, DAG, c.by_txid[4], "process")
    assert query(dsn, "SELECT id, value FROM ops_count") == [("all", c.events)]


def _a_rebuild_repairs_the_table_while_airflow_commits(c: _Cascade) -> None:
    """Rebuild the derived view from the log while Airflow keeps committing: a damaged table is
    repaired, and a run that commits mid-rebuild is part of the swapped-in state."""
    dsn = c.stack.state_dsn
    query(dsn, "UPDATE ops_count SET value = value + 1000")
    assert cli(["--dsn", dsn, "audit", DAG, "--dag-file", str(OPS_DAGS), *ON_CONNECT]) == 1
    release = c.stack.base_dir / "rebuild.release"
    outcome: list[int] = []
    env = {"AIRFLOW_TXN_FAULTS": f"rebuild.loaded:{DAG}=waitfor:{release}"}
    rebuild = ["--dsn", dsn, "rebuild", DAG, "--dag-file", str(OPS_DAGS), *ON_CONNECT]
    worker = threading.Thread(target=lambda: outcome.append(cli_with_env(env, rebuild)))
    worker.start()
    deadline = time.monotonic() + 120
    while query(dsn, "SELECT rebuild_from_txid FROM airflow_txn.topologies WHERE topology_id = %s", (DAG,)) != [(6,)]:
        assert time.monotonic() < deadline, "the rebuild never began"
        time.sleep(1)
    late = [(f"late{i}", json.dumps({"url": f"https://example.com/late/{i}"})) for i in range(300)]
    c.log.append(late)
    late_run = c.client.trigger(DAG, (DAY0 + timedelta(days=10)).isoformat())["dag_run_id"]
    wait_for_runs(c.stack, DAG, [late_run])
    release.touch()
    worker.join(300)
    assert outcome == [0]
    c.events += len(late)
    assert query(dsn, "SELECT id, value FROM ops_count") == [("all", c.events)]


def test_a_commit_killed_on_its_last_try_does_not_hold_the_later_runs(stack: LocalStack,
                                                                      client: RestClient) -> None:
    # Found by the chaos soak: a commit task killed on every try (SIGKILL, the OOM killer) records
    # nothing in Postgres, so the runs waiting for it kept waiting -- holding every max_active_runs
    # slot, and the run cleared to retry it could never start (docs/design.md, trap 2).
    dag = "ops_killed"
    log, coord = start_topology(stack, client, dag, "kil", partitions=2)
    events = [(f"kil{i}", json.dumps({"url": f"https://example.com/k/{i}"})) for i in range(300)]
    log.append(events)  # all of it txid 2's batch: txids 3 and 4 are empty (no spark-submit)
    set_faults(stack, f"commit.before_commit:{dag}:2=exit")  # every try of txid 2's commit dies on the spot
    day0 = datetime(2025, 5, 1, tzinfo=UTC)
    runs = [client.trigger(dag, (day0 + timedelta(days=k)).isoformat())["dag_run_id"] for k in range(3)]
    states = wait_for_runs(stack, dag, runs, allow_failed=True, timeout=600)  # they all finish: no deadlock
    by_txid = runs_by_txid(coord, runs, dag)
    assert sorted(by_txid) == [2, 3, 4] and set(states.values()) == {"failed"}
    assert "blocked by" not in task_log(stack, dag, by_txid[2], "commit")  # it died: no word from it
    for t in (3, 4):  # the waiters asked Airflow, gave their slots up, and said which run to clear
        text = task_log(stack, dag, by_txid[t], "commit")
        assert f"blocked by txid 2 (run {by_txid[2]}): its Airflow run failed" in text or (
            f"blocked by failed txid 2 (run {by_txid[2]}): its Airflow run failed" in text), text[-3000:]
    status = coord.status(dag)
    assert status.committed_txid == 1 and status.blocked_by and "txid 2" in status.blocked_by

    # Recovery as docs/guides/operating.md says: the cause gone, clear the killed run, then the blocked ones.
    set_faults(stack)
    client.clear(dag, by_txid[2], only_failed=True)
    wait_for_runs(stack, dag, [by_txid[2]])
    for t in (3, 4):
        client.clear(dag, by_txid[t], only_failed=True)
    wait_for_runs(stack, dag, runs)
    assert [c["txid"] for c in coord.commits(dag)] == [1, 2, 3, 4]
    assert query(stack.state_dsn, "SELECT id, value FROM ops_killed") == [("all", len(events))]
    assert coord.status(dag).lag == 0 and coord.status(dag).blocked_by is None
    coord.close()
    log.close()


def test_a_deleted_run_s_batch_is_taken_over_by_the_next_run(stack: LocalStack, client: RestClient) -> None:
    # Deleting a failed run in the UI is a common clean-up. Its txid stays planned and every later
    # commit waits for it: with no run left to commit it, the topology would stop for good.
    dag = "ops_deleted"
    log, coord = start_topology(stack, client, dag, "dlt", partitions=2)
    events = [(f"dlt{i}", json.dumps({"url": f"https://example.com/d/{i}"})) for i in range(300)]
    log.append(events)  # all of it txid 2's batch; txid 3 is empty and only waits for it
    set_faults(stack, f"commit.before_commit:{dag}:2=exit")
    day0 = datetime(2025, 7, 1, tzinfo=UTC)
    first = [client.trigger(dag, (day0 + timedelta(days=k)).isoformat())["dag_run_id"] for k in range(2)]
    assert set(wait_for_runs(stack, dag, first, allow_failed=True, timeout=600).values()) == {"failed"}
    by_txid = runs_by_txid(coord, first, dag)
    assert sorted(by_txid) == [2, 3]
    set_faults(stack)

    client.delete_run(dag, by_txid[2])
    taker = client.trigger(dag, (day0 + timedelta(days=2)).isoformat())["dag_run_id"]
    wait_for_runs(stack, dag, [taker])
    assert f"was deleted: run {taker} takes its batch over" in task_log(stack, dag, taker, "plan")
    assert coord.transaction_for_run(dag, taker).txid == 2  # type: ignore[union-attr]
    client.clear(dag, by_txid[3], only_failed=True)  # the waiter, as the message said
    wait_for_runs(stack, dag, [by_txid[3]])
    assert [(c["txid"], c["run_key"]) for c in coord.commits(dag)] == [(1, ANY), (2, taker), (3, by_txid[3])]
    assert query(stack.state_dsn, f"SELECT id, value FROM {dag}") == [("all", len(events))]
    status = coord.status(dag)
    assert status.lag == 0 and status.blocked_by is None and not status.in_flight
    coord.close()
    log.close()


def test_retention_pause_and_api_server_restart_during_processing(stack: LocalStack, client: RestClient) -> None:
    dag = "ops_opaque"
    dsn = stack.state_dsn
    log, coord = start_topology(stack, client, dag, "opq", partitions=1)
    events = [(f"opq{i}", json.dumps({"url": f"https://example.org/{i}"})) for i in range(1200)]
    log.append(events)
    # txid 2's first attempt stalls after staging its output -- long enough for retention to run.
    once = stack.base_dir / "opq-pause.once"
    set_faults(stack, f"spark.after_stage:{dag}:2=pause:45@once:{once}")
    day0 = datetime(2025, 6, 1, tzinfo=UTC)
    runs = [client.trigger(dag, (day0 + timedelta(days=k)).isoformat())["dag_run_id"] for k in range(3)]
    deadline = time.monotonic() + 300
    while not once.exists():
        assert time.monotonic() < deadline, "txid 2 never reached its processing"
        time.sleep(1)
    assert log.truncate(0, 100, force=True) == 100  # retention removes LSN 1..100 of txid 2's planned batch
    # Meanwhile the DAG is paused and the api-server (the tasks' only way to the metadata DB) is
    # restarted; after unpausing, the topology resumes where it stopped.
    client.patch(f"/api/v2/dags/{dag}", {"is_paused": True})
    stack.stop_component("api-server")
    stack.start_component("api-server")
    stack.wait_healthy()
    client.unpause(dag)
    wait_for_runs(stack, dag, runs)
    set_faults(stack)

    by_txid = runs_by_txid(coord, runs, dag)
    assert sorted(by_txid) == [2, 3, 4]
    attempts = query(dsn, "SELECT txid, attempt, plan_version, status, coalesce(error, '') FROM airflow_txn.attempts "
                          "WHERE topology_id = %s ORDER BY txid, attempt", (dag,))
    # txid 2: the stalled attempt never committed. It found its batch short and voided itself --
    # or, on a loaded machine, Airflow's retry of its task (its heartbeat lost while the api-server
    # restarted) re-planned the txid first, discarding it with the loss as its reason. The retry
    # re-planned within the old bounds. txids 3 and 4 kept their plans and their first attempts.
    first, retry = [a for a in attempts if a[0] == 2]
    assert first[:3] == (2, 1, 1) and retry[:4] == (2, 2, 2, "committed")
    assert (first[3], "lost records while it was processed" in first[4]) in (("failed", True), ("discarded", False))
    assert first[4], "the stalled attempt records why it was voided"
    assert [a[:4] for a in attempts if a[0] > 2] == [(3, 1, 1, "committed"), (4, 1, 1, "committed")]
    status = coord.status(dag)
    assert status.committed_txid == 4 and status.lost_records == 100 and status.lag == 0
    surviving = {e for (e,) in query(dsn, "SELECT event_id FROM airflow_txn.log_events WHERE log_name = 'opq'")}
    assert len(surviving) == 1100
    assert query(dsn, "SELECT value FROM ops_opaque") == [(len(surviving),)]
    assert [c["txid"] for c in coord.commits(dag)] == [1, 2, 3, 4]
    # recomputed from what survives: the same
    assert cli(["--dsn", dsn, "audit", dag, "--dag-file", str(OPS_DAGS), *ON_CONNECT]) == 0
    coord.close()
    log.close()
