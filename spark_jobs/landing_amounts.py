"""Per-user totals from JSON-lines files dropped into a landing directory."""

from __future__ import annotations

from pyspark.sql import DataFrame

from airflow_transactional.spark_job import per_record, run


def transform(orders: DataFrame) -> dict[str, DataFrame]:
    return {
        "order_totals": per_record(orders, {"user": "user"}, value="amount"),
        "order_counts": per_record(orders, {"user": "user"}),
    }


if __name__ == "__main__":
    raise SystemExit(run(transform, schema="user string, amount bigint", required=["user", "amount"]))
