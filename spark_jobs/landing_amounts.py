"""Per-user totals from JSON-lines files dropped into a landing directory."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from airflow_transactional.spark_job import run


def transform(orders: DataFrame) -> dict[str, DataFrame]:
    return {
        "order_totals": orders.select("user", F.col("amount").alias("value")),
        "order_counts": orders.select("user", F.lit(1).alias("value")),
    }


if __name__ == "__main__":
    raise SystemExit(run(transform, schema="user string, amount bigint", required=["user", "amount"]))
