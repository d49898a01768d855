"""The benchmark's topologies: the words example (its Spark job, two count states) once per
configuration ``bench.perf`` measures -- serial or pipelined, on the event log or on a landing
directory, through spark-submit or Spark Connect, waits deferred or sleeping. ``bench.perf``
deploys this file (a symlink) with ``bench_words.json`` beside it, one entry per DAG."""

import json
from datetime import timedelta
from pathlib import Path

from airflow.sdk import DAG

from airflow_transactional import LOCAL_SPARK_CONF, LandingDirectory, PostgresLogSource, StateSpec, transactional_dag

HERE = Path(__file__)
REPO = HERE.resolve().parents[2]  # the symlink's target: bench/dags/ of the repository
# A whole landing file per batch: no JIT setting of our own (LOCAL_SPARK_CONF's C1-only driver is
# for small batches), so the process task picks it by the file's size -- C1 only up to
# submit.SHORT_JIT_MAX_BYTES, the full JIT above, which bench.perf gives the long-lived peer.
BIG_BATCH_CONF = {**LOCAL_SPARK_CONF, "spark.driver.extraJavaOptions": "-XX:+UseSerialGC"}


def words_dag(name: str, *, landing: str | None, max_in_flight: int, batch: int, connect: bool,
              deferrable: bool = True, pool: str | None = "spark") -> DAG:
    return transactional_dag(
        name,
        source=(LandingDirectory(landing, max_files=1, settle_seconds=0) if landing
                else PostgresLogSource(name)),
        states=[StateSpec("url_counts", keys={"url": "text"}, combiner="count", table=f"{name}_url_counts"),
                StateSpec("domain_counts", keys={"domain": "text"}, combiner="count", table=f"{name}_domain_counts")],
        application=str(REPO / "spark_jobs" / "words.py"),
        schedule="@daily",
        max_in_flight=max_in_flight,
        max_batch_size=batch,
        retries=1,
        retry_delay=timedelta(seconds=5),
        spark_conf=None if connect else BIG_BATCH_CONF if landing else LOCAL_SPARK_CONF,
        spark_pool=pool,
        spark_connect_conn_id="spark_connect_default" if connect else None,
        deferrable=deferrable,
    )


for entry in json.loads(HERE.with_suffix(".json").read_text()):
    globals()[entry["name"]] = words_dag(**entry)
