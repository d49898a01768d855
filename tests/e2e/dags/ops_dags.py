"""The operations tests' own topologies, each on its own log: no scheduled runs in the way (the
first, scheduled run is empty), one retry, a short retry delay. ``global_count.py``'s state, kept
in a table of each topology's own. Deployed into the test stack's DAGs folder as a symlink.

Their batches run on the stack's Spark Connect server (``spark_connect_default``): what these
tests operate is Airflow's side, and a warm server spares each batch a driver JVM's start-up.
The examples, the chaos runs and the spark tier keep ``spark-submit``."""

import os
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, PartitionedAssetTimetable, task

from airflow_transactional import PostgresLogSource, StateSpec, state_asset, transactional_dag

# The test stack sets a daily schedule that does not fire while the suite runs.
SCHEDULE = os.environ.get("AIRFLOW_TXN_EXAMPLE_SCHEDULE") or "@daily"

REPO = Path(__file__).resolve().parents[3]  # the symlink's target: tests/e2e/dags/ of the repository

# topology -> (its log, opaque)
# (ops_quarantine: test_quarantine_limit.py's, a batch nearly all bad that its commit refuses)
OPS = {"ops_count": ("ops", False), "ops_opaque": ("opq", True), "ops_killed": ("kil", False),
       "ops_deleted": ("dlt", False), "ops_quarantine": ("qlm", False)}

for name, (log, opaque) in OPS.items():
    globals()[name] = transactional_dag(
        name,
        source=PostgresLogSource(log),
        states=[StateSpec("global_count", keys={"id": "text"}, combiner="count",
                          kind="opaque" if opaque else "transactional", table=name)],
        opaque=opaque,
        application=str(REPO / "spark_jobs" / "global_count.py"),
        schedule=SCHEDULE,
        max_in_flight=3,
        max_batch_size=400,
        retries=1,
        retry_delay=timedelta(seconds=3),
        spark_connect_conn_id="spark_connect_default",
        spark_pool="spark",
    )

# The corrections test's topology (test_corrections.py): per-user sums by a job the test stack
# writes beside this file (with a bug) and the test then fixes.
FIX_JOB = Path(__file__).parent / "fix_job.py"
ops_fix = None if not FIX_JOB.exists() else transactional_dag(
    "ops_fix",
    source=PostgresLogSource("fix"),
    states=[StateSpec("amounts", keys={"name": "text"}, combiner="sum", table="ops_fix")],
    application=str(FIX_JOB),
    schedule=SCHEDULE,
    max_in_flight=3,
    max_batch_size=20,
    retries=1,
    retry_delay=timedelta(seconds=3),
    spark_connect_conn_id="spark_connect_default",
    spark_pool="spark",
    verify="5",  # each run ends with a round of the shadow audit (test_corrections.py checks the mark)
)

# Downstream of ops_count: one run per txid ops_count commits (the asset event's partition key),
# whatever the clears, retries and backfills of ops_count (test_operations.py checks it).
with DAG("ops_count_report", schedule=PartitionedAssetTimetable(assets=state_asset("ops_count", "ops_count")),
         start_date=datetime(2025, 1, 1), catchup=False, tags=["test"]):

    @task
    def report(**context: Any) -> dict[str, Any]:
        [event] = [e for events in context["triggering_asset_events"].values() for e in events]
        return {"partition_key": context["dag_run"].partition_key, "txid": event.extra["txid"],
                "records_read": event.extra["records_read"]}

    report()

# The stall watch's test (test_stall_watch.py): its process task waits in a pool the test empties.
ops_stalled = transactional_dag(
    "ops_stalled",
    source=PostgresLogSource("stl"),
    states=[StateSpec("global_count", keys={"id": "text"}, combiner="count", table="ops_stalled")],
    application=str(REPO / "spark_jobs" / "global_count.py"),
    schedule=SCHEDULE,
    max_batch_size=400,
    spark_connect_conn_id="spark_connect_default",
    spark_pool="starved",
    stall_after=timedelta(seconds=10),
)
