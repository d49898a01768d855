"""The Spark job of kafka_relay: urls counted, and every record relayed as an output event."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from airflow_transactional.spark_job import run


def transform(records: DataFrame) -> dict[str, DataFrame]:
    return {
        "url_counts": records.select("url", F.lit(1).alias("value")),
        "relayed": records.select(F.col("_event_id").alias("id"), F.col("user").alias("key"),
                                  F.to_json(F.struct("url", "user")).alias("payload")),
    }


if __name__ == "__main__":
    raise SystemExit(run(transform, schema="url string, user string", required=["url"]))
