"""Storm's TransactionalWords idea: tweeted URLs counted per URL and per domain.

Both counts are states of one topology, so they commit together in one Postgres transaction.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from airflow_transactional.spark_job import per_record, run


def domain(url: F.Column) -> F.Column:
    """``https://www.example.com/a?b`` -> ``example.com`` (lower-case, without ``www.``)."""
    host = F.lower(F.regexp_extract(url, r"^[a-zA-Z][a-zA-Z0-9+.-]*://([^/:?#]+)", 1))
    return F.regexp_replace(host, r"^www\.", "")


def transform(tweets: DataFrame) -> dict[str, DataFrame]:
    # Both states per record: the helper folds them in one pass over the batch (see per_record).
    url = F.col("url")
    host = domain(url)
    return {
        "url_counts": per_record(tweets, {"url": url}),
        "domain_counts": per_record(tweets, {"domain": host}, where=host != ""),
    }


if __name__ == "__main__":
    raise SystemExit(run(transform, schema="url string, user string, ts string", required=["url"]))
