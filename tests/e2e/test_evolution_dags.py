"""A state added to a running topology on the real stack (``core/evolution.py``): the DAG file grows
a state while Airflow runs the topology -- its plan task keeps it declared and its job's rows for it
dropped -- then ``airflow-txn evolve --approve`` builds it from the log's history while a run
commits, and every run after keeps it: the new table equals a count straight from the events."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

from dev.localstack import LocalStack, RestClient
from tests.e2e.conftest import ON_CONNECT, task_log, wait_for_runs
from tests.e2e.operating import cli_with_env, start_topology
from tests.helpers import query

REPO = Path(__file__).resolve().parents[2]
DAG = "ops_grow"
#: The topology's DAG file as the test deploys it: ``{extra}`` the state it grows, ``{job}`` its job.
GROW_DAG = """
import os
from datetime import timedelta
from airflow_transactional import PostgresLogSource, StateSpec, transactional_dag

ops_grow = transactional_dag(
    "ops_grow", source=PostgresLogSource("grw"),
    states=[StateSpec("global_count", keys={{"id": "text"}}, combiner="count", table="ops_grow"){extra}],
    application={job!r}, schedule=os.environ.get("AIRFLOW_TXN_EXAMPLE_SCHEDULE") or "@daily",
    max_in_flight=3, max_batch_size=200, retries=1, retry_delay=timedelta(seconds=3),
    spark_connect_conn_id="spark_connect_default", spark_pool="spark")
"""
USERS = ',\n            StateSpec("users", keys={"user": "text"}, combiner="count", table="ops_grow_users")'
#: global_count's job once the DAG file adds ``users``: the same count, and each event's user.
GROWN_JOB = f"""
import sys
sys.path.insert(0, {str(REPO / "spark_jobs")!r})
from pyspark.sql import functions as F
from airflow_transactional.spark_job import per_record, run
from global_count import transform as counted

def transform(events):
    return {{**counted(events), "users": per_record(events, {{"user": F.col("user")}})}}

if __name__ == "__main__":
    raise SystemExit(run(transform, schema="url string, user string", required=["url"]))
"""


def _events(first: int, n: int) -> list[tuple[str, str]]:
    return [(f"gr{i}", json.dumps({"url": f"https://example.com/{i}", "user": f"u{i % 6}"})) for i in range(first, n)]


def _deploy(stack: LocalStack, client: RestClient, text: str) -> None:
    deploy(stack, client, DAG, stack.dags_folder / "grow_dags.py", text)


def deploy(stack: LocalStack, client: RestClient, dag: str, path: Path, text: str) -> None:
    """Write DAG file ``path`` and wait until the dag-processor has parsed this version of it."""
    written = datetime.now(UTC)
    path.write_text(text)
    client.wait_for_dag(dag)
    deadline = time.monotonic() + 180
    while True:
        parsed = client.get(f"/api/v2/dags/{dag}/details").get("last_parsed_time")
        if parsed and datetime.fromisoformat(parsed) > written:
            return
        assert time.monotonic() < deadline, "the dag-processor never parsed the new DAG file"
        time.sleep(2)


def test_a_state_added_to_the_dag_file_is_built_from_history_and_kept_by_every_run_after(
        stack: LocalStack, client: RestClient) -> None:
    grown_job = stack.dags_folder / "grow_job.py"
    grown_job.write_text(GROWN_JOB)
    _deploy(stack, client, GROW_DAG.format(extra="", job=str(REPO / "spark_jobs" / "global_count.py")))
    log, coord = start_topology(stack, client, DAG, "grw", partitions=2)
    day0 = datetime(2025, 9, 1, tzinfo=UTC)
    log.append(_events(0, 400))
    wait_for_runs(stack, DAG, [client.trigger(DAG, (day0 + timedelta(days=k)).isoformat())["dag_run_id"]
                               for k in range(2)])
    # The DAG file grows the state: the next run's plan task keeps it declared; its rows are dropped.
    _deploy(stack, client, GROW_DAG.format(extra=USERS, job=str(grown_job)))
    log.append(_events(400, 500))
    declared = client.trigger(DAG, (day0 + timedelta(days=2)).isoformat())["dag_run_id"]
    wait_for_runs(stack, DAG, [declared])
    assert "declares state(s) users that its commits do not keep yet" in task_log(stack, DAG, declared, "plan")
    assert coord.evolution(DAG)["declared"] == ["users"]
    assert query(stack.state_dsn, "SELECT to_regclass('public.ops_grow_users')") == [(None,)]

    # Approved from the shell while Airflow goes on: the build holds after folding until released.
    release = stack.base_dir / "grow.release"
    outcome: list[int] = []
    approve = ["--dsn", stack.state_dsn, "evolve", DAG, "--approve", "--dag-file",
               str(stack.dags_folder / "grow_dags.py"), *ON_CONNECT]
    env = {"AIRFLOW_TXN_FAULTS": f"build.loaded:{DAG}=waitfor:{release}"}
    worker = threading.Thread(target=lambda: outcome.append(cli_with_env(env, approve)))
    worker.start()
    deadline = time.monotonic() + 180
    while coord.evolution(DAG)["building_through_txid"] is None:
        assert time.monotonic() < deadline, "the build never began"
        time.sleep(1)
    log.append(_events(500, 650))
    during = client.trigger(DAG, (day0 + timedelta(days=3)).isoformat())["dag_run_id"]
    wait_for_runs(stack, DAG, [during])
    assert query(stack.state_dsn, "SELECT to_regclass('public.ops_grow_users')") == [(None,)]
    release.touch()
    worker.join(600)
    assert outcome == [0]

    def users() -> dict[str, int]:
        return {u: int(n) for u, n in query(stack.state_dsn, 'SELECT "user", value FROM ops_grow_users')}

    assert users() == Counter(json.loads(p)["user"] for _e, p in _events(0, 650))  # every event, once
    log.append(_events(650, 700))
    after = client.trigger(DAG, (day0 + timedelta(days=4)).isoformat())["dag_run_id"]
    wait_for_runs(stack, DAG, [after])
    assert users() == Counter(json.loads(p)["user"] for _e, p in _events(0, 700))
    assert query(stack.state_dsn, "SELECT value FROM ops_grow") == [(700,)]
    assert cli_with_env({}, ["--dsn", stack.state_dsn, "audit", DAG, "--dag-file",
                             str(stack.dags_folder / "grow_dags.py"), *ON_CONNECT]) == 0
    coord.close()
    log.close()
