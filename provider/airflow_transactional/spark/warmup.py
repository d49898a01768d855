"""The job ``airflow-txn spark-cds`` runs to record which classes a driver loads (``spark_cds``):
what the provider's jobs make a driver do, on a small file -- the helper's own reader, ``validate``
and ``fold`` over JSON lines, and states declared per record folded in one pass (Spark's JSON
reader and ``from_json``, whole-stage codegen, regex and case mapping as in the words example),
partitions sent to Python as rows and as Arrow batches, a result collected as Arrow, and Parquet
both ways.

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

from airflow_transactional.model import FileBatch
from airflow_transactional.sources import LandingDirectory
from airflow_transactional.spark.fused import fuse, per_record
from airflow_transactional.spark.pinned import glob_escaped
from airflow_transactional.spark.read import EVENT_ID_COL, OFFSET_COL, TEXT, Records, read_landing
from airflow_transactional.spark.stage import fold
from airflow_transactional.spark.validate import prepare, validate
from airflow_transactional.spec import StateSpec

SCHEMA = "url string, n long"


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
    text = spark.read.text(glob_escaped(os.path.join(work, "events.json"))).where(F.trim("value") != "")
    raw = text.select(F.input_file_name().alias(OFFSET_COL), F.lit(None).cast("string").alias(EVENT_ID_COL),
                      F.col("value").alias("payload"))
    from_text = validate(Records(raw, TEXT), SCHEMA, ["url"])  # as an event log's payloads are parsed
    landing = LandingDirectory(os.path.abspath(work))
    events = FileBatch(directory=landing.path, files=({"path": os.path.join(landing.path, "events.json")},))
    checked = validate(read_landing(spark, landing, events, record_schema=SCHEMA), SCHEMA, ["url"])
    assert (from_text.records, from_text.bad_records) == (checked.records, checked.bad_records)
    from_text.cached.unpersist()
    good = checked.good
    # States declared per record, folded in one pass over the batch (what the example jobs do).
    prepared = prepare(read_landing(spark, landing, events, record_schema=SCHEMA), SCHEMA, ["url"])
    url = F.col("url")
    states = [StateSpec("u", {"url": "text"}, combiner="count"), StateSpec("n", {"host": "text"}, combiner="sum")]
    folds = fuse(states, {"u": per_record(prepared.good, {"url": url}),
                          "n": per_record(prepared.good, {"host": F.lower(url)}, value="n", where=url != "")},
                 prepared.good)
    assert folds is not None
    folds.run().unpersist()
    assert prepared.totals() == (checked.records, checked.bad_records)
    host = F.regexp_replace(F.lower(F.regexp_extract("url", r"^[a-zA-Z]+://([^/:?#]+)", 1)), r"^www\.", "")
    per_domain = fold(StateSpec("c", {"domain": "text"}, combiner="count"),
                      good.select(host.alias("domain"), F.lit(1).alias("value")))
    per_url = fold(StateSpec("s", {"url": "text"}, combiner="sum"), good.select("url", F.col("n").alias("value")))
    good_records = checked.records - checked.bad_records
    assert per_domain.collect()[0]["value"] == good_records == checked.records - checked.bad.count()
    per_url.foreachPartition(_drain)
    assert per_url.limit(100).toArrow().num_rows == 7
    assert per_url.mapInArrow(_batch_sizes, "n long").agg(F.sum("n")).collect()[0][0] == 7
    good.write.parquet(os.path.join(work, "good.parquet"))
    assert spark.read.parquet(glob_escaped(os.path.join(work, "good.parquet"))).count() == good_records
    checked.cached.unpersist()
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1])
