"""Storm's TransactionalGlobalCount: how many events the topology has seen, exactly once."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from airflow_transactional.spark_job import per_record, run


def transform(events: DataFrame) -> dict[str, DataFrame]:
    return {"global_count": per_record(events, {"id": F.lit("all")})}


if __name__ == "__main__":
    raise SystemExit(run(transform, schema="url string, user string", required=["url"]))
