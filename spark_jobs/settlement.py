"""Stage 2 of the payments pipeline: the receiving side. It reads the ledger -- the events the
payment executor's commits appended, and the deposits the bank appends -- and keeps each
account's credits (the payer's headroom in stage 1) and its statement: one line per (request,
kind of event), signed."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from airflow_transactional.spark_job import per_record, run


def transform(events: DataFrame) -> dict[str, DataFrame]:
    sign = F.when(F.col("type") == "outgoing", F.lit(-1)).when(F.col("type") == "declined", F.lit(0)).otherwise(1)
    return {
        "credits": per_record(events, {"account": "account"}, value="amount",
                              where=F.col("type").isin("incoming", "fee", "deposit")),
        "statements": per_record(events, {"account": "account", "request": "request", "type": "type"},
                                 value=sign * F.col("amount")),
    }


if __name__ == "__main__":
    raise SystemExit(run(transform, schema="type string, request string, account string, amount bigint",
                         required=["type", "request", "account", "amount"]))
