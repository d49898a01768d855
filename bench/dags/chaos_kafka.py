"""The chaos harness's Kafka topology: the words example read from the topic ``chaos-tweets``,
opaque, so records deleted under a plan are skipped and reported rather than blocking it; every
record it commits is published to the topic ``chaos-relayed``, each txid in one Kafka transaction.
``bench.chaos --mode kafka`` deploys this file into the stack's DAGs folder (a symlink) with
``chaos_kafka.json`` beside it: the run's ``max_in_flight``, batch size (in offsets) and backend
(with ``connect``, batches run on the stack's Spark Connect server, the Kafka connector on its
classpath)."""

import json
import os
from datetime import timedelta
from pathlib import Path

from airflow_transactional import LOCAL_SPARK_CONF, KafkaSource, OutputSpec, StateSpec, transactional_dag

# The test stack sets a daily schedule that does not fire while the suite runs.
SCHEDULE = os.environ.get("AIRFLOW_TXN_EXAMPLE_SCHEDULE") or "@daily"

HERE = Path(__file__)
PARAMS = json.loads(HERE.with_suffix(".json").read_text())
REPO = HERE.resolve().parents[2]  # the symlink's target: bench/dags/ of the repository
TOPOLOGY = HERE.stem

dag = transactional_dag(
    TOPOLOGY,
    source=KafkaSource("chaos-tweets", kafka_conn_id="kafka_default"),
    states=[
        StateSpec("url_counts", keys={"url": "text"}, combiner="count", kind="opaque",
                  table=f"{TOPOLOGY}_url_counts"),
        StateSpec("domain_counts", keys={"domain": "text"}, combiner="count", kind="opaque",
                  table=f"{TOPOLOGY}_domain_counts"),
    ],
    outputs=[OutputSpec("chaos_relayed", partitions=2, kafka_topic="chaos-relayed")],
    opaque=True,
    application=str(REPO / "bench" / "dags" / "chaos_kafka_job.py"),
    py_files=str(REPO / "spark_jobs" / "words.py"),  # the words example's transform, which the job extends
    schedule=SCHEDULE,
    max_in_flight=PARAMS["max_in_flight"],
    max_batch_size=PARAMS["batch"],
    retries=3,
    retry_delay=timedelta(seconds=2),
    spark_conf=None if PARAMS.get("connect") else LOCAL_SPARK_CONF,
    spark_pool="spark",
    spark_connect_conn_id="spark_connect_default" if PARAMS.get("connect") else None,
)
