"""Stage 2 of the payments pipeline: the receiving side. It reads the ledger -- the events the
payment executor's commits appended, and the deposits the bank appends -- and keeps each
account's credits (the payer's headroom in stage 1) and its statement: one line per (request,
kind of event), signed."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from airflow_transactional.spark_job import run


def transform(events: DataFrame) -> dict[str, DataFrame]:
    sign = F.when(F.col("type") == "outgoing", F.lit(-1)).when(F.col("type") == "declined", F.lit(0)).otherwise(1)
    credited = events.where(F.col("type").isin("incoming", "fee", "deposit"))
    return {
        "credits": credited.select("account", F.col("amount").alias("value")),
        "statements": events.select("account", "request", "type", (sign * F.col("amount")).alias("value")),
    }


if __name__ == "__main__":
    raise SystemExit(run(transform, schema="type string, request string, account string, amount bigint",
                         required=["type", "request", "account", "amount"]))
