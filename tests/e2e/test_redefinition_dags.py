"""A state redefined on the real stack (``core/redefinition.py``): the DAG file declares a live state
at version 2 (a global count becomes a count per user) while Airflow runs the topology; the build
is killed after its first chunk, a run commits, its switch is killed inside its transaction, and
the next approval goes on from where it stopped -- then the state's table holds the new version,
equal to a count straight from the events, the old one is archived as it was, and every run after
keeps the new one."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta

from dev.localstack import LocalStack, RestClient
from tests.e2e.conftest import ON_CONNECT, task_log, wait_for_runs
from tests.e2e.operating import cli_with_env, start_topology
from tests.e2e.test_evolution_dags import REPO, _events, deploy
from tests.helpers import query

DAG = "ops_redefine"
#: The topology's DAG file: global_count at ``{version}`` (2: a count per user, in the same table), ``{job}`` its job.
REDEFINE_DAG = """
import os
from datetime import timedelta
from airflow_transactional import PostgresLogSource, StateSpec, transactional_dag

ops_redefine = transactional_dag(
    "ops_redefine", source=PostgresLogSource("rdf"),
    states=[StateSpec("global_count", keys={keys}, combiner="count", table="ops_redefine", version={version})],
    application={job!r}, schedule=os.environ.get("AIRFLOW_TXN_EXAMPLE_SCHEDULE") or "@daily",
    max_in_flight=3, max_batch_size=200, retries=1, retry_delay=timedelta(seconds=3),
    spark_connect_conn_id="spark_connect_default", spark_pool="spark")
"""
#: Its job: the new count under the state's name, the old one as ``global_count@1`` until the switch.
REDEFINED_JOB = f"""
import sys
sys.path.insert(0, {str(REPO / "spark_jobs")!r})
from pyspark.sql import functions as F
from airflow_transactional.spark_job import per_record, run
from global_count import transform as counted

def transform(events):
    return {{"global_count@1": counted(events)["global_count"],
            "global_count": per_record(events, {{"user": F.col("user")}})}}

if __name__ == "__main__":
    raise SystemExit(run(transform, schema="url string, user string", required=["url"]))
"""


def test_a_redefinition_killed_mid_fold_and_in_its_switch_goes_on_and_switches_in_at_one_txid(
        stack: LocalStack, client: RestClient) -> None:
    job = stack.dags_folder / "redefined_job.py"
    job.write_text(REDEFINED_JOB)
    dag_file = stack.dags_folder / "redefine_dags.py"
    deploy(stack, client, DAG, dag_file, REDEFINE_DAG.format(keys={"id": "text"}, version=1,
                                                             job=str(REPO / "spark_jobs" / "global_count.py")))
    log, coord = start_topology(stack, client, DAG, "rdf", partitions=2)
    day0 = datetime(2025, 10, 1, tzinfo=UTC)

    def run(day: int) -> str:
        run_id = client.trigger(DAG, (day0 + timedelta(days=day)).isoformat())["dag_run_id"]
        wait_for_runs(stack, DAG, [run_id])
        return run_id

    log.append(_events(0, 400))
    run(0), run(1)
    deploy(stack, client, DAG, dag_file, REDEFINE_DAG.format(keys={"user": "text"}, version=2, job=str(job)))
    log.append(_events(400, 500))
    declared = run(2)
    assert "declares state(s) global_count__v2" in task_log(stack, DAG, declared, "plan")
    assert query(stack.state_dsn, "SELECT value FROM ops_redefine") == [(500,)]  # kept from global_count@1

    approve = ["--dsn", stack.state_dsn, "evolve", DAG, "--approve", "--dag-file", str(dag_file), *ON_CONNECT]
    # Killed after its first chunk: building, and how far it got is kept.
    assert cli_with_env({"AIRFLOW_TXN_FAULTS": f"build.chunk:{DAG}=exit@1"}, approve) != 0
    folded = coord.status(DAG).build_progress
    assert folded is not None and 0 < folded.through_txid < folded.of_txid
    log.append(_events(500, 650))
    run(3)  # commits go on, the new version staged beside the live one
    # Killed inside the switch's transaction: nothing switched.
    assert cli_with_env({"AIRFLOW_TXN_FAULTS": f"build.switch:{DAG}=exit@1"}, approve) != 0
    assert query(stack.state_dsn, "SELECT value FROM ops_redefine") == [(650,)]
    assert coord.evolution(DAG)["building"] == ["global_count__v2"]
    assert cli_with_env({}, approve) == 0

    def per_user(table: str) -> dict[str, int]:
        return {u: int(n) for u, n in query(stack.state_dsn, f'SELECT "user", value FROM {table}')}

    assert per_user("ops_redefine") == Counter(json.loads(p)["user"] for _e, p in _events(0, 650))
    assert query(stack.state_dsn, "SELECT value FROM ops_redefine_v1") == [(650,)]  # archived as it was
    log.append(_events(650, 700))
    run(4)
    assert per_user("ops_redefine") == Counter(json.loads(p)["user"] for _e, p in _events(0, 700))
    assert query(stack.state_dsn, "SELECT value FROM ops_redefine_v1") == [(650,)]
    assert cli_with_env({}, ["--dsn", stack.state_dsn, "audit", DAG, "--dag-file", str(dag_file), *ON_CONNECT]) == 0
    coord.close()
    log.close()
