"""Tweeted URLs counted per URL and per domain; both states commit in one transaction."""

from __future__ import annotations

import os

from airflow_transactional import PostgresLogSource, StateSpec, spark_backend, transactional_dag

# The batch-emit interval (the end-to-end tests set a daily one and trigger runs over REST).
# Every minute on the minute (cron): a run's logical date is a whole minute, so Airflow's Backfill
# dialog over a failed minute finds that very run (a timedelta would start from the unpause time).
SCHEDULE = os.environ.get("AIRFLOW_TXN_EXAMPLE_SCHEDULE") or "* * * * *"

dag = transactional_dag(
    "words",
    source=PostgresLogSource("tweets"),
    states=[
        StateSpec("url_counts", keys={"url": "text"}, combiner="count"),
        StateSpec("domain_counts", keys={"domain": "text"}, combiner="count", kind="opaque"),
    ],
    application="../spark_jobs/words.py",
    schedule=SCHEDULE,
    max_in_flight=3,
    max_batch_size=int(os.environ.get("AIRFLOW_TXN_EXAMPLE_BATCH", "20000")),
    **spark_backend(),  # local Spark per batch; a Spark Connect server with $AIRFLOW_TXN_SPARK_CONNECT_CONN_ID
    spark_pool=os.environ.get("AIRFLOW_TXN_SPARK_POOL"),  # the demo caps concurrent Spark jobs
)
