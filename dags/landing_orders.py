"""Per-user order totals from JSON-lines files landing in a directory, in arrival order."""

from __future__ import annotations

import os

from airflow_transactional import LandingDirectory, StateSpec, spark_backend, transactional_dag

LANDING_DIR = os.path.abspath(os.environ.get("AIRFLOW_TXN_LANDING_DIR")
                              or os.path.join(os.path.dirname(__file__), "..", "var", "landing"))
# The batch-emit interval (the end-to-end tests set a daily one and trigger runs over REST).
# Every minute on the minute (cron): a run's logical date is a whole minute, so Airflow's Backfill
# dialog over a failed minute finds that very run (a timedelta would start from the unpause time).
SCHEDULE = os.environ.get("AIRFLOW_TXN_EXAMPLE_SCHEDULE") or "* * * * *"

dag = transactional_dag(
    "landing_orders",
    source=LandingDirectory(LANDING_DIR, format="json", pattern="*.json", max_files=20),
    states=[
        StateSpec("order_totals", keys={"user": "text"}, combiner="sum"),
        StateSpec("order_counts", keys={"user": "text"}, combiner="count"),
    ],
    application="../spark_jobs/landing_amounts.py",
    schedule=SCHEDULE,
    max_in_flight=2,
    **spark_backend(),  # local Spark per batch; a Spark Connect server with $AIRFLOW_TXN_SPARK_CONNECT_CONN_ID
    spark_pool=os.environ.get("AIRFLOW_TXN_SPARK_POOL"),  # the demo caps concurrent Spark jobs
)
