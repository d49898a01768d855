"""The chaos harness's topology: the words example (its Spark job, its two states) under a name
and tables of its own. ``bench.chaos`` deploys this file into the stack's DAGs folder (a symlink)
with ``chaos_words.json`` beside it: the run's ``max_in_flight``, batch size and backend (with
``connect``, batches run on the stack's Spark Connect server), and whether each run ends with a
round of the shadow audit (``verify``)."""

import json
import os
from datetime import timedelta
from pathlib import Path

from airflow_transactional import LOCAL_SPARK_CONF, PostgresLogSource, StateSpec, transactional_dag

# The test stack sets a daily schedule that does not fire while the suite runs.
SCHEDULE = os.environ.get("AIRFLOW_TXN_EXAMPLE_SCHEDULE") or "@daily"

HERE = Path(__file__)
PARAMS = json.loads(HERE.with_suffix(".json").read_text())
REPO = HERE.resolve().parents[2]  # the symlink's target: bench/dags/ of the repository
TOPOLOGY = HERE.stem

dag = transactional_dag(
    TOPOLOGY,
    source=PostgresLogSource("chaos_tweets"),
    states=[
        StateSpec("url_counts", keys={"url": "text"}, combiner="count", table=f"{TOPOLOGY}_url_counts"),
        StateSpec("domain_counts", keys={"domain": "text"}, combiner="count", kind="opaque",
                  table=f"{TOPOLOGY}_domain_counts"),
    ],
    application=str(REPO / "spark_jobs" / "words.py"),
    schedule=SCHEDULE,
    max_in_flight=PARAMS["max_in_flight"],
    max_batch_size=PARAMS["batch"],
    retries=3,
    retry_delay=timedelta(seconds=2),
    spark_conf=None if PARAMS.get("connect") else LOCAL_SPARK_CONF,
    spark_pool="spark",
    spark_connect_conn_id="spark_connect_default" if PARAMS.get("connect") else None,
    verify="10" if PARAMS.get("verify") else None,
)
