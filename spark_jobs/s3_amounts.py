"""Per-user totals from JSON-lines files landing in an S3 bucket (the s3_orders example DAG)."""

from __future__ import annotations

from pyspark.sql import DataFrame

from airflow_transactional.spark_job import per_record, run


def transform(orders: DataFrame) -> dict[str, DataFrame]:
    return {
        "s3_order_totals": per_record(orders, {"user": "user"}, value="amount"),
        "s3_order_counts": per_record(orders, {"user": "user"}),
    }


if __name__ == "__main__":
    raise SystemExit(run(transform, schema="user string, amount bigint", required=["user", "amount"]))
