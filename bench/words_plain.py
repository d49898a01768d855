"""``spark_jobs/words.py`` with its states as plain DataFrames instead of ``per_record``: the same
folds, by the path any transform gets -- the validated batch cached, a job per state over it.
``bench.perf``'s ``work`` section runs both to show what folding in one pass buys."""

from __future__ import annotations

import os
import sys

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from airflow_transactional.spark_job import run

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "spark_jobs"))
from words import domain  # the example's own expression, shared by both jobs


def transform(tweets: DataFrame) -> dict[str, DataFrame]:
    urls = tweets.select(F.col("url"), domain(F.col("url")).alias("domain"), F.lit(1).alias("value"))
    return {
        "url_counts": urls.select("url", "value"),
        "domain_counts": urls.where(F.col("domain") != "").select("domain", "value"),
    }


if __name__ == "__main__":
    raise SystemExit(run(transform, schema="url string, user string, ts string", required=["url"]))
