"""The words topology with its batches on the cluster's Spark Connect server (test_spark_connect_server.py):
the job file runs as a client in the Celery worker, the batch on the server's executor. One short
retry: a batch whose server was lost fails, and its next try is a new attempt."""

import os
from datetime import timedelta
from pathlib import Path

from airflow_transactional import PostgresLogSource, StateSpec, transactional_dag

REPO = Path(__file__).resolve().parents[3]  # the symlink's target: tests/cluster/dags/ of the repository

connect_words = transactional_dag(
    "connect_words",
    source=PostgresLogSource("ctweets"),
    states=[
        StateSpec("url_counts", keys={"url": "text"}, combiner="count", table="connect_url_counts"),
        StateSpec("domain_counts", keys={"domain": "text"}, combiner="count", kind="opaque",
                  table="connect_domain_counts"),
    ],
    application=str(REPO / "spark_jobs" / "words.py"),
    schedule=os.environ.get("AIRFLOW_TXN_EXAMPLE_SCHEDULE") or "@daily",
    max_batch_size=400,
    retries=1,
    retry_delay=timedelta(seconds=3),
    spark_connect_conn_id="spark_connect_default",
)
