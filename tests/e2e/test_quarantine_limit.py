"""A producer whose records the job no longer takes, on the test stack: the batch is quarantined
nearly whole, and instead of a commit that counts nothing the run's commit fails for good with
the top reason and the fix; the overview, ``airflow-txn status`` and the run's page say the
topology is blocked by it (``docs/guides/ui.md`` shows the overview)."""

from __future__ import annotations

import json
import urllib.parse
from datetime import UTC, datetime
from pathlib import Path

import pytest

from airflow_transactional.cli import main as cli
from dev.localstack import LocalStack, RestClient
from tests.e2e.browsing import frame_text, shot, signed_in
from tests.e2e.conftest import task_log, wait_for_runs
from tests.e2e.operating import browser, start_topology
from tests.helpers import query

pytestmark = pytest.mark.e2e

DAG = "ops_quarantine"
LIMIT = "over its max_quarantined of 50%: not committed"


def test_a_batch_quarantined_over_its_limit_blocks_the_topology_with_the_reason_and_the_fix(
        stack: LocalStack, client: RestClient, chrome: object, tmp_path: Path) -> None:
    log, coord = start_topology(stack, client, DAG, "qlm", 1)  # txid 1: empty, committed
    try:
        # An upstream change: the producer renamed the field the job requires.
        log.append([(f"q{i}", json.dumps({"link": f"https://example.com/{i}"})) for i in range(36)]
                   + [(f"ok{i}", json.dumps({"url": f"https://example.com/{i}"})) for i in range(4)])
        run = client.trigger(DAG, datetime(2025, 3, 2, tzinfo=UTC).isoformat(), "renamed-field")["dag_run_id"]
        assert wait_for_runs(stack, DAG, [run], allow_failed=True) == {run: "failed"}
        said = task_log(stack, DAG, run, "commit")
        assert f"txid 2 attempt 1 quarantined 36 of its 40 records (90%), {LIMIT}" in said, said[-3000:]
        assert "Top reasons: 36 x missing required field 'url'" in said
        assert "then clear the run's process task to process txid 2 again" in said
        status = coord.status(DAG)
        assert status.committed_txid == 1 and status.blocked_by and LIMIT in status.blocked_by
        assert query(stack.state_dsn, "SELECT count(*) FROM ops_quarantine") == [(0,)]  # nothing counted
        assert cli(["--dsn", stack.state_dsn, "status", DAG]) == 2  # blocked

        page = browser(stack, "GET", f"/transactional/dags/{DAG}/runs/{urllib.parse.quote(run, safe='')}",
                       client.token())[1]
        assert "missing required field &#x27;url&#x27; (36)" in page or "missing required field 'url' (36)" in page
        driver = signed_in(chrome, stack)
        driver.get(f"{stack.url}/plugin/transactions")  # type: ignore[attr-defined]
        text = frame_text(driver, LIMIT)
        assert "blocked by failed txid 2" in text and "txid 2: staged, its commit failed for good" in text, text
        shot(driver, "ui-quarantine-limit.png", tmp_path)
    finally:
        coord.close()
        log.close()
