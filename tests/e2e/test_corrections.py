"""A correction on a real Airflow: committed txids counted by a buggy job, the job fixed, and a run
triggered over the REST API with the conf ``{"correct": "A..B"}`` -- it commits the difference as the
next txid, the state then equals the fixed code's oracle, every commit records the code that
produced it (the application's digest changed with the fix; the DAG version of the try), and a
clear of the correction changes nothing."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from airflow_transactional import provenance
from airflow_transactional.cli import main as cli
from dev.localstack import LocalStack, RestClient
from tests.e2e.browsing import WAIT, frame_text, shot, signed_in
from tests.e2e.conftest import FIX_BUG, FIX_JOB, ON_CONNECT, task_log, wait_for_runs
from tests.e2e.operating import browser, http_get, runs_by_txid, start_topology
from tests.helpers import query

pytestmark = pytest.mark.e2e

def _oracle(events: list[tuple[str, str]], *, bug: bool) -> dict[str, int]:
    sums: Counter[str] = Counter()
    for _e, payload in events:
        rec = json.loads(payload)
        sums[rec["user"]] += int(rec["amount"]) * (2 if bug and rec["user"] == "u3" else 1)
    return dict(sums)


def _correct_in_the_browser(stack: LocalStack, chrome: object, dag: str, txids: str, tmp_path: Path) -> str:
    """The correction of ``txids`` asked for from the topology's Transactions tab: its preview shows
    what they applied and what the last preview found would change; its button triggers the run.
    The run's id."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver: Any = signed_in(chrome, stack)
    driver.get(f"{stack.url}/dags/{dag}/plugin/transactions-dag")
    frame_text(driver, "Correct committed txids")
    field = driver.find_element(By.CSS_SELECTOR, "form.correct input[name=txids]")
    field.send_keys(txids)
    field.submit()
    text = frame_text(driver, f"What txids {txids} applied")
    assert "amounts" in text and "What it would change (previewed" in text, text
    preview = next(line for line in text.splitlines() if line.startswith("amounts") and "->" in line)
    assert preview.split()[1] == "1" and "u3:" in preview, preview  # one key moves: the bug's
    shot(driver, "ui-correct.png", tmp_path)
    driver.switch_to.frame(driver.find_element(By.CSS_SELECTOR, "iframe"))
    driver.find_element(By.CSS_SELECTOR, "button.confirm").click()
    def run_page(d: Any) -> str | None:  # the frame's own address, once it is the run's page
        url = str(d.execute_script("return window.location.href"))
        return url if "/runs/correct__" in url else None

    here = WebDriverWait(driver, WAIT).until(run_page)
    return unquote(here.rsplit("/runs/", 1)[1].split("?")[0])


def _all_verified(stack: LocalStack, coord: Any, dag: str, last_run: str, chrome: object, tmp_path: Path) -> None:
    """The correction and the replay were checked by their runs' verify tasks under the fixed job;
    the topology's page says so (the screenshot docs/guides/verification.md shows)."""
    checks = coord.verify_status(dag)
    assert checks["verified_through"] == 6 and checks["counts"] == {"verified": 6}, checks
    assert [c["detail"].get("kind") for c in checks["checks"][-2:]] == ["range", "batch"]
    assert "verified through txid 6 of 6 committed" in task_log(stack, dag, last_run, "verify")
    driver: Any = signed_in(chrome, stack)
    driver.get(f"{stack.url}/dags/{dag}/plugin/transactions-dag")
    text = frame_text(driver, "Verified through txid")
    assert "Verified through txid 6 of 6 committed" in text and "failed the check" not in text, text
    shot(driver, "ui-verified.png", tmp_path)


def _replay_the_lost(stack: LocalStack, client: RestClient, coord: Any, dag: str, day: datetime,
                     events: list[tuple[str, str]]) -> str:
    """The two records without an amount were quarantined (and again by the correction, which left
    them with their txid): fixed by hand, then replayed by a run of their own. Its run id."""
    lost = [r["id"] for r in coord.quarantined_records(dag) if r["event_id"].startswith("lost")]
    assert len(lost) == 2
    for record_id in lost:
        assert cli(["--dsn", stack.state_dsn, "quarantine", dag, "--edit", str(record_id),
                    "--record", json.dumps({"user": "u9", "amount": "5"})]) == 0
    replay = client.trigger(dag, day.isoformat(), run_id="replay-lost",
                            conf={"replay": {"ids": lost}})["dag_run_id"]
    wait_for_runs(stack, dag, [replay])
    assert dict(query(stack.state_dsn, f"SELECT name, value FROM {dag}")) == {**_oracle(events, bug=False), "u9": 10}
    assert coord.commits(dag, 6)[0]["corrects"] == {"replay": lost, "of_txids": sorted(
        {r["txid"] for r in coord.quarantined_records(dag) if r["id"] in lost})}
    assert [r["corrected_by"] for r in coord.quarantined_records(dag) if r["id"] in lost] == [6, 6]
    return replay


def test_a_fixed_job_corrects_committed_txids_in_a_run_of_their_own(stack: LocalStack, client: RestClient,
                                                                    chrome: object, tmp_path: Path) -> None:
    dag = "ops_fix"
    job = stack.dags_folder / "fix_job.py"  # the stack wrote it with the bug: the code deployed
    assert FIX_BUG in job.read_text()
    log, coord = start_topology(stack, client, dag, "fix", partitions=2)
    events = [(f"fx{i}", json.dumps({"user": f"u{i % 5}", "amount": str(i % 7)})) for i in range(58)]
    log.append(events[:30] + [(f"lost{i}", json.dumps({"user": "u9"})) for i in range(2)] + events[30:])  # 3 x 20
    day0 = datetime(2025, 8, 1, tzinfo=UTC)
    runs = [client.trigger(dag, (day0 + timedelta(days=k)).isoformat())["dag_run_id"] for k in range(3)]
    wait_for_runs(stack, dag, runs)
    by_txid = runs_by_txid(coord, runs, dag)
    assert sorted(by_txid) == [2, 3, 4]
    assert dict(query(stack.state_dsn, f"SELECT name, value FROM {dag}")) == _oracle(events, bug=True)
    assert coord.verify_status(dag)["verified_through"] == 4  # each run's verify task: the buggy job, the same

    job.write_text(FIX_JOB.format(version="fixed", bug=""))  # the fix, deployed
    # Previewed by the topology's own job, then asked for from the Transactions view: a run of its own.
    assert cli(["--dsn", stack.state_dsn, "correct", dag, "2..4", "--dag-file",
                str(stack.dags_folder / "ops_dags.py"), *ON_CONNECT]) == 0
    fix = _correct_in_the_browser(stack, chrome, dag, "2..4", tmp_path)
    wait_for_runs(stack, dag, [fix])
    assert f"run {fix} is txid 5" in task_log(stack, dag, fix, "plan")
    assert dict(query(stack.state_dsn, f"SELECT name, value FROM {dag}")) == _oracle(events, bug=False)
    commits = {c["txid"]: c for c in coord.commits(dag)}
    assert commits[5]["corrects"] == {"txids": [2, 4]} and commits[5]["run_key"] == fix
    assert [u for u, _d in coord.changes(dag, 5)["amounts"]] == ["u3"]  # the bug touched u3 alone
    assert commits[5]["code"]["application"] == provenance.file_digest(job) != commits[2]["code"]["application"]
    assert commits[5]["code"]["dag_version"] and commits[2]["code"]["dag_version"]
    assert commits[5]["code"]["provider"] == provenance.provider_digest()

    # The Transactions view shows the run as a correction, with its code and its deltas' digest.
    page = http_get(stack, f"/transactional/dags/{dag}/runs/{fix}", client.token())[1]
    assert "a correction of txids 2..4" in page and commits[5]["digests"]["amounts"] in page
    assert f"application <code>{commits[5]['code']['application'][:16]}</code>" in page
    assert "(corrects 2..4)" in http_get(stack, f"/transactional/dags/{dag}", client.token())[1]

    client.clear(dag, fix)  # replaying the correction changes nothing
    wait_for_runs(stack, dag, [fix])
    assert "already committed" in task_log(stack, dag, fix, "process")
    assert dict(query(stack.state_dsn, f"SELECT name, value FROM {dag}")) == _oracle(events, bug=False)
    assert [c["txid"] for c in coord.commits(dag)] == [1, 2, 3, 4, 5]

    replay = _replay_the_lost(stack, client, coord, dag, day0 + timedelta(days=4), events)
    # A correction of 2..4 now would re-read the source and undo those edits: the view refuses it,
    # naming why, and offers no button.
    status, page, _loc = browser(stack, "GET", f"/transactional/dags/{dag}/correct?txids=2..4", client.token())
    assert status == 200 and "edited by hand" in page and "class=confirm" not in page, page
    _all_verified(stack, coord, dag, replay, chrome, tmp_path)
    coord.close()
    log.close()
