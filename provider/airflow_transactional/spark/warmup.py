"""The job ``airflow-txn spark-cds`` runs to record which classes a driver loads (``spark_cds``):
what the provider's jobs make a driver do, on a small file -- the helper's own ``validate`` and
``fold`` over JSON lines (whole-stage codegen, the JSON parser, regex and case mapping as in the
words example), partitions sent to Python as rows and as Arrow batches, and Parquet both ways.

Run by path as an application of ``spark-submit`` (``spark-submit warmup.py WORK_DIR``), never
imported by the provider.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Iterator
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from airflow_transactional.spark_job import EVENT_ID_COL, OFFSET_COL, fold, validate
from airflow_transactional.spec import StateSpec


def _batch_sizes(batches: Iterable[Any]) -> Iterator[Any]:
    import pyarrow as pa

    for batch in batches:
        yield pa.RecordBatch.from_pydict({"n": [batch.num_rows]})


def _drain(rows: Iterator[Any]) -> None:
    for _ in rows:
        pass


def main(work: str) -> None:
    spark = SparkSession.builder.appName("airflow-txn-spark-cds").getOrCreate()
    with open(os.path.join(work, "events.json"), "w") as fh:
        fh.write("\n".join(json.dumps({"url": f"https://WWW.Example.org/{i % 7}", "n": i}) if i % 9 else "not json"
                           for i in range(300)))
    text = spark.read.text(os.path.join(work, "events.json")).where(F.trim("value") != "")
    raw = text.select(F.input_file_name().alias(OFFSET_COL), F.lit(None).cast("string").alias(EVENT_ID_COL),
                      F.col("value").alias("payload"))
    checked = validate(raw, True, "url string, n long", ["url"])
    good = checked.good
    host = F.regexp_replace(F.lower(F.regexp_extract("url", r"^[a-zA-Z]+://([^/:?#]+)", 1)), r"^www\.", "")
    per_domain = fold(StateSpec("c", {"domain": "text"}, combiner="count"),
                      good.select(host.alias("domain"), F.lit(1).alias("value")))
    per_url = fold(StateSpec("s", {"url": "text"}, combiner="sum"), good.select("url", F.col("n").alias("value")))
    good_records = checked.records - checked.bad_records
    assert per_domain.collect()[0]["value"] == good_records == checked.records - checked.bad.count()
    per_url.foreachPartition(_drain)
    assert per_url.mapInArrow(_batch_sizes, "n long").agg(F.sum("n")).collect()[0][0] == 7
    good.write.parquet(os.path.join(work, "good.parquet"))
    assert spark.read.parquet(os.path.join(work, "good.parquet")).count() == good_records
    checked.cached.unpersist()
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1])
