"""The chaos harness's S3 topology: the words example reading JSON-lines files landed under
``s3a://chaos-landing/tweets`` (the stack's S3 server, ``aws_default``), opaque, so a planned file
overwritten or deleted before its txid committed is skipped and reported rather than blocking it
(its new version is planned later). ``bench.chaos --mode s3`` deploys this file into the stack's
DAGs folder (a symlink) with ``chaos_s3.json`` beside it: the run's ``max_in_flight``, files a batch
and backend (with ``connect``, batches run on the stack's Spark Connect server, s3a on its
classpath)."""

import json
import os
from datetime import timedelta
from pathlib import Path

from airflow_transactional import LOCAL_SPARK_CONF, LandingDirectory, StateSpec, transactional_dag

# The test stack sets a daily schedule that does not fire while the suite runs.
SCHEDULE = os.environ.get("AIRFLOW_TXN_EXAMPLE_SCHEDULE") or "@daily"

HERE = Path(__file__)
PARAMS = json.loads(HERE.with_suffix(".json").read_text())
REPO = HERE.resolve().parents[2]  # the symlink's target: bench/dags/ of the repository
TOPOLOGY = HERE.stem

dag = transactional_dag(
    TOPOLOGY,
    source=LandingDirectory("s3a://chaos-landing/tweets", format="json", pattern="*.json",
                            max_files=PARAMS["files"], conn_id="aws_default"),
    states=[
        StateSpec("url_counts", keys={"url": "text"}, combiner="count", kind="opaque",
                  table=f"{TOPOLOGY}_url_counts"),
        StateSpec("domain_counts", keys={"domain": "text"}, combiner="count", kind="opaque",
                  table=f"{TOPOLOGY}_domain_counts"),
    ],
    opaque=True,
    application=str(REPO / "spark_jobs" / "words.py"),
    schedule=SCHEDULE,
    max_in_flight=PARAMS["max_in_flight"],
    retries=3,
    retry_delay=timedelta(seconds=2),
    spark_conf=None if PARAMS.get("connect") else LOCAL_SPARK_CONF,
    spark_pool="spark",
    spark_connect_conn_id="spark_connect_default" if PARAMS.get("connect") else None,
)
