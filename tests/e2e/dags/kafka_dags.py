"""A Kafka-to-Kafka topology for the end-to-end tests: records of topic relay-in counted per url,
and relayed -- once each, per committed txid in one Kafka transaction -- to topic relay-out. Its
batches run on the stack's Spark Connect server, whose ``spark.jars`` hold Spark's Kafka connector
(the ``kafka_words`` example reads the same way through ``spark-submit``)."""

from __future__ import annotations

import os

from airflow_transactional import KafkaSource, OutputSpec, StateSpec, transactional_dag

# The test stack sets a daily schedule that does not fire while the suite runs.
SCHEDULE = os.environ.get("AIRFLOW_TXN_EXAMPLE_SCHEDULE") or "@daily"

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
