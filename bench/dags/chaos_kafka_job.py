"""The Spark job of ``chaos_kafka``: the words example's two counts, and every record relayed as
an output event (keyed by its source record id) that the commit publishes to a Kafka topic."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from words import transform as words  # spark_jobs/words.py, the DAG's py_files

from airflow_transactional.spark_job import run


def transform(tweets: DataFrame) -> dict[str, DataFrame]:
    return {**words(tweets),
            "chaos_relayed": tweets.select(F.col("_event_id").alias("id"), F.col("user").alias("key"),
                                           F.to_json(F.struct("url", "user")).alias("payload"))}


if __name__ == "__main__":
    raise SystemExit(run(transform, schema="url string, user string, ts string", required=["url"]))
