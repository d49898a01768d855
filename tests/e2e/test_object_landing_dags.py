"""The ``s3_orders`` example on a real Airflow, a real S3 server (S3Proxy) and real Spark
(spark-submit with s3a): runs triggered over REST, a processing killed once and retried, a file
overwritten after its txid committed, a committed run cleared and a backfill over new dates -- the
totals are those of every version the producer uploaded (its own ledger), each counted once."""

from __future__ import annotations

import json
import time
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from airflow_transactional.cli import main as cli
from airflow_transactional.coordinator import Coordinator
from dev.localstack import LocalStack, RestClient, on_schedule
from tests.e2e.conftest import ON_CONNECT, REPO, task_log, wait_for_runs
from tests.e2e.operating import set_faults
from tests.helpers import query

pytestmark = pytest.mark.e2e

DAG = "s3_orders"  # dags/s3_orders.py: s3a://demo-landing/orders
DAY0 = datetime(2025, 10, 1, tzinfo=UTC)


class Uploads:
    """The producer: order files put in the bucket, and its ledger of every version it uploaded."""

    def __init__(self, stack: LocalStack) -> None:
        assert stack.s3 is not None
        stack.s3.create_bucket("demo-landing")
        self.client = stack.s3.client()
        self.totals: Counter[str] = Counter()
        self.bad = 0

    def put(self, name: str, seed: int, *, bad_line: bool = False) -> None:
        rows = [{"user": f"u{(seed * 7 + i) % 6}", "amount": seed * 10 + i} for i in range(30)]
        lines = [json.dumps(r) for r in rows] + (['{"user": "u1", "amount": "lots"}'] if bad_line else [])
        self.client.put_object(Bucket="demo-landing", Key=f"orders/{name}", Body="\n".join(lines).encode() + b"\n")
        for r in rows:
            self.totals[str(r["user"])] += int(r["amount"])
        self.bad += bad_line


def test_an_s3_topology_counts_every_uploaded_version_once_through_retries_clears_and_backfills(
        stack: LocalStack, client: RestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    assert stack.s3 is not None
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", stack.s3.airflow_connection())  # for the status and the audit
    dsn = stack.state_dsn
    uploads = Uploads(stack)
    client.wait_for_dag(DAG)
    client.unpause(DAG)  # Airflow schedules one run at once: on the empty bucket, txid 1, empty
    deadline = time.monotonic() + 120
    while not (scheduled := client.runs(DAG)):
        assert time.monotonic() < deadline, f"Airflow scheduled no run of {DAG} after unpausing it"
        time.sleep(2)
    wait_for_runs(stack, DAG, [str(r["dag_run_id"]) for r in scheduled])
    for k in range(4):
        uploads.put(f"a{k}.json", k, bad_line=k == 2)
    time.sleep(3)  # the DAG plans a file once it has not changed for 2 s (settle_seconds)
    once = stack.base_dir / "s3-once"
    set_faults(stack, f"spark.after_stage:{DAG}:2=exit@once:{once}")  # txid 2's driver dies once, staged
    day0 = on_schedule(DAY0, stack.extra_env["AIRFLOW_TXN_EXAMPLE_SCHEDULE"])
    runs = [client.trigger(DAG, (day0 + timedelta(days=k)).isoformat())["dag_run_id"] for k in range(2)]
    wait_for_runs(stack, DAG, runs)
    set_faults(stack)
    assert once.exists()
    coord = Coordinator(dsn)
    killed = coord.transaction(DAG, 2).run_key
    assert {t["task_id"]: t["try_number"] for t in client.task_instances(DAG, killed)}["process"] == 2
    dag_file = str(REPO / "dags" / "s3_orders.py")
    assert cli(["--dsn", dsn, "audit", DAG, "--dag-file", dag_file, *ON_CONNECT]) == 0  # recomputed from the bucket

    # A committed file uploaded again with other bytes: a new version, counted once more, later.
    uploads.put("a1.json", 100)
    uploads.put("b0.json", 200)
    time.sleep(3)
    client.clear(DAG, runs[0])  # a committed run cleared: nothing changes
    day10 = on_schedule(DAY0 + timedelta(days=10), stack.extra_env["AIRFLOW_TXN_EXAMPLE_SCHEDULE"])
    client.backfill(DAG, day10.isoformat(), (day10 + timedelta(days=1)).isoformat(), reprocess="none")
    deadline = time.monotonic() + 300
    while len(client.runs(DAG)) < len(scheduled) + len(runs) + 2:
        assert time.monotonic() < deadline, "the backfill made no runs"
        time.sleep(2)
    wait_for_runs(stack, DAG, [r["dag_run_id"] for r in client.runs(DAG)])
    while coord.status(DAG).lag:  # whatever the runs so far left
        wait_for_runs(stack, DAG, [client.trigger(DAG, None)["dag_run_id"]])

    assert "already committed" in task_log(stack, DAG, runs[0], "commit")
    commits = coord.commits(DAG)
    assert [c["txid"] for c in commits] == list(range(1, len(commits) + 1))
    got = {u: int(v) for u, v in query(dsn, 'SELECT "user", value FROM s3_order_totals')}
    assert got == uploads.totals
    assert coord.status(DAG).quarantined == uploads.bad == 1
    versions = query(dsn, "SELECT path, count(*) FROM airflow_txn.landing_files WHERE topology_id = %s "
                          "GROUP BY 1 ORDER BY 1", (DAG,))
    assert versions == [(f"s3a://demo-landing/orders/{n}", 2 if n == "a1.json" else 1)
                        for n in ("a0.json", "a1.json", "a2.json", "a3.json", "b0.json")]
    coord.close()
