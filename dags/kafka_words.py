"""The words topology fed by a Kafka topic: tweeted URLs counted per URL and per domain, read at
exact offsets below the last stable offset, so records of aborted producer transactions are never
counted (docs/guides/kafka.md)."""

from __future__ import annotations

import os

# --8<-- [start:imports]
from airflow_transactional import KafkaSource, StateSpec, spark_backend, transactional_dag

# --8<-- [end:imports]

# The batch-emit interval (the end-to-end tests set a daily one and trigger runs over REST).
# Every minute on the minute (cron): a run's logical date is a whole minute, so Airflow's Backfill
# dialog over a failed minute finds that very run (a timedelta would start from the unpause time).
SCHEDULE = os.environ.get("AIRFLOW_TXN_EXAMPLE_SCHEDULE") or "* * * * *"

# --8<-- [start:dag]
dag = transactional_dag(
    "kafka_words",
    source=KafkaSource("tweets", kafka_conn_id="kafka_default"),  # a connection of type kafka
    states=[
        StateSpec("url_counts", keys={"url": "text"}, combiner="count", table="kafka_url_counts"),
        StateSpec("domain_counts", keys={"domain": "text"}, combiner="count", kind="opaque",
                  table="kafka_domain_counts"),
    ],
    application="../spark_jobs/words.py",
    schedule=SCHEDULE,
    max_in_flight=3,
    max_batch_size=int(os.environ.get("AIRFLOW_TXN_EXAMPLE_BATCH", "20000")),  # offsets per batch
    **spark_backend(),  # local Spark per batch; a Spark Connect server with $AIRFLOW_TXN_SPARK_CONNECT_CONN_ID
    spark_pool=os.environ.get("AIRFLOW_TXN_SPARK_POOL"),  # the demo caps concurrent Spark jobs
)
# --8<-- [end:dag]
