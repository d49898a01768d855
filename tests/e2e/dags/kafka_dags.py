"""The Kafka topologies of the end-to-end tests (test_kafka_dags.py). Their batches run on the
stack's Spark Connect server, whose ``spark.jars`` hold Spark's Kafka connector: what these tests
operate is Airflow's side (retries, clears, backfills, the publish task), and a warm server spares
each batch a driver JVM's start-up. ``spark-submit`` reading Kafka is the chaos and spark tiers'.

- ``kafka_counts``: the ``kafka_words`` example (``dags/kafka_words.py``) on the Connect server,
  with one short retry: tweeted URLs of topic tweets counted per URL and per domain.
- ``kafka_relay``: records of topic relay-in counted per url, and relayed -- once each, per
  committed txid in one Kafka transaction -- to topic relay-out."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

from airflow_transactional import KafkaSource, OutputSpec, StateSpec, transactional_dag

# The test stack sets a daily schedule that does not fire while the suite runs.
SCHEDULE = os.environ.get("AIRFLOW_TXN_EXAMPLE_SCHEDULE") or "@daily"

REPO = Path(__file__).resolve().parents[3]  # the symlink's target: tests/e2e/dags/ of the repository

counts = transactional_dag(
    "kafka_counts",
    source=KafkaSource("tweets", kafka_conn_id="kafka_default"),
    states=[
        StateSpec("url_counts", keys={"url": "text"}, combiner="count", table="counts_url"),
        StateSpec("domain_counts", keys={"domain": "text"}, combiner="count", kind="opaque", table="counts_domain"),
    ],
    application=str(REPO / "spark_jobs" / "words.py"),
    schedule=SCHEDULE,
    max_in_flight=3,
    max_batch_size=400,
    retries=1,
    retry_delay=timedelta(seconds=3),
    spark_connect_conn_id="spark_connect_default",
    spark_pool=os.environ.get("AIRFLOW_TXN_SPARK_POOL"),
)

relay = transactional_dag(
    "kafka_relay",
    source=KafkaSource("relay-in"),
    states=[StateSpec("url_counts", keys={"url": "text"}, combiner="count", table="relay_url_counts")],
    outputs=[OutputSpec("relayed", partitions=2, kafka_topic="relay-out")],
    application="relay_job.py",
    schedule=SCHEDULE,
    max_in_flight=3,
    max_batch_size=300,
    spark_connect_conn_id="spark_connect_default",
    spark_pool=os.environ.get("AIRFLOW_TXN_SPARK_POOL"),
)
