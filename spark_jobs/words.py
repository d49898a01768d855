"""Storm's TransactionalWords idea: tweeted URLs counted per URL and per domain.

Both counts are states of one topology, so they commit together in one Postgres transaction.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from airflow_transactional.spark_job import run


def domain(url: F.Column) -> F.Column:
    """``https://www.example.com/a?b`` -> ``example.com`` (lower-case, without ``www.``)."""
    host = F.lower(F.regexp_extract(url, r"^[a-zA-Z][a-zA-Z0-9+.-]*://([^/:?#]+)", 1))
    return F.regexp_replace(host, r"^www\.", "")


def transform(tweets: DataFrame) -> dict[str, DataFrame]:
    urls = tweets.select(F.col("url"), domain(F.col("url")).alias("domain"), F.lit(1).alias("value"))
    return {
        "url_counts": urls.select("url", "value"),
        "domain_counts": urls.where(F.col("domain") != "").select("domain", "value"),
    }


if __name__ == "__main__":
    raise SystemExit(run(transform, schema="url string, user string, ts string", required=["url"]))
