"""Storm's TransactionalGlobalCount: count every tweet exactly once."""

from __future__ import annotations

import os

from airflow_transactional import PostgresLogSource, StateSpec, spark_backend, transactional_dag

# The batch-emit interval (the end-to-end tests set a daily one and trigger runs over REST).
# Every minute on the minute (cron): a run's logical date is a whole minute, so Airflow's Backfill
# dialog over a failed minute finds that very run (a timedelta would start from the unpause time).
SCHEDULE = os.environ.get("AIRFLOW_TXN_EXAMPLE_SCHEDULE") or "* * * * *"

dag = transactional_dag(
    "global_count",
    source=PostgresLogSource("tweets"),
    states=[StateSpec("global_count", keys={"id": "text"}, combiner="count")],
    application="../spark_jobs/global_count.py",
    schedule=SCHEDULE,
    max_in_flight=3,
    max_batch_size=int(os.environ.get("AIRFLOW_TXN_EXAMPLE_BATCH", "50000")),
    **spark_backend(),  # local Spark per batch; a Spark Connect server with $AIRFLOW_TXN_SPARK_CONNECT_CONN_ID
    spark_pool=os.environ.get("AIRFLOW_TXN_SPARK_POOL"),  # the demo caps concurrent Spark jobs
)
