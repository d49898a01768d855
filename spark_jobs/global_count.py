"""Storm's TransactionalGlobalCount: how many events the topology has seen, exactly once."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from airflow_transactional.spark_job import run


def transform(events: DataFrame) -> dict[str, DataFrame]:
    return {"global_count": events.select(F.lit("all").alias("id"), F.lit(1).alias("value"))}


if __name__ == "__main__":
    raise SystemExit(run(transform, schema="url string, user string", required=["url"]))
