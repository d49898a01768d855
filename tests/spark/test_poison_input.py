"""Poison input under real ``spark-submit``: a huge garbage record and a corrupt Parquet file are
quarantined (a capped prefix and the length; the file by name), streamed from the executors, and
the rest of the batch commits -- no crash loop, no driver holding the garbage."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_transactional import LandingDirectory, StateSpec, TopologySpec
from airflow_transactional.coordinator import QUARANTINE_RECORD_CHARS, Coordinator
from airflow_transactional.sources.landing import write_json_lines
from airflow_transactional.spark_job import provider_zip
from tests.helpers import query

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]

PARQUET_JOB = """
from pyspark.sql import functions as F
from airflow_transactional.spark_job import run

def transform(orders):
    return {"amounts": orders.select("user", F.col("amount").alias("value"))}

if __name__ == "__main__":
    raise SystemExit(run(transform, required=["user", "amount"]))
"""


def _submit(dsn: str, job: str, topology: str, txid: int) -> subprocess.CompletedProcess[str]:
    argv = ["spark-submit", "--master", "local[2]", "--conf", "spark.ui.enabled=false", "--conf",
            "spark.sql.shuffle.partitions=2", "--py-files", provider_zip(), job, "--topology", topology,
            "--txid", str(txid)]
    return subprocess.run(argv, env={**os.environ, "AIRFLOW_TXN_DSN": dsn, "PYSPARK_PYTHON": sys.executable},
                          capture_output=True, text=True, timeout=300)


def test_a_huge_garbage_record_is_quarantined_as_a_prefix_and_the_batch_commits(dsn: str, tmp_path: Path) -> None:
    landing = tmp_path / "in"
    landing.mkdir()
    write_json_lines(str(landing), "good.json", [{"user": "a", "amount": 3}, {"user": "b", "amount": 4}])
    garbage = "x" * 300_000
    (landing / "garbage.json").write_text(f"{garbage}\n" + '{"user": "a", "amount": 5}\n')
    coord = Coordinator(dsn)
    coord.register(TopologySpec("orders", LandingDirectory(str(landing), settle_seconds=0), [
        StateSpec("order_totals", {"user": "text"}, combiner="sum"),
        StateSpec("order_counts", {"user": "text"}, combiner="count")]))
    t = coord.plan("orders", "r1").txid
    res = _submit(dsn, str(REPO / "spark_jobs" / "landing_amounts.py"), "orders", t)
    assert res.returncode == 0, res.stderr[-3000:]
    coord.commit("orders", t)
    assert dict(query(dsn, "SELECT \"user\", value FROM order_totals")) == {"a": 8, "b": 4}
    [(record, length, reason)] = query(dsn, "SELECT record, record_length, reason FROM airflow_txn.quarantine")
    assert record == garbage[:QUARANTINE_RECORD_CHARS] and length == len(garbage) and "malformed" in reason
    coord.close()


def test_a_corrupt_parquet_file_is_quarantined_by_name_not_retried_for_ever(dsn: str, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    landing = tmp_path / "in"
    landing.mkdir()
    pq.write_table(pa.table({"user": ["a", "b"], "amount": [1, 2]}), landing / "good.parquet")
    (landing / "corrupt.parquet").write_bytes(b"PAR1 this is not a parquet file at all")
    job = tmp_path / "parquet_job.py"
    job.write_text(PARQUET_JOB)
    coord = Coordinator(dsn)
    coord.register(TopologySpec("pq", LandingDirectory(str(landing), format="parquet", settle_seconds=0),
                                [StateSpec("amounts", {"user": "text"}, combiner="sum")]))
    t = coord.plan("pq", "r1").txid
    res = _submit(dsn, str(job), "pq", t)
    assert res.returncode == 0, res.stderr[-3000:]
    coord.commit("pq", t)
    assert dict(query(dsn, "SELECT \"user\", value FROM amounts")) == {"a": 1, "b": 2}
    [(offset, reason)] = query(dsn, "SELECT source_offset, reason FROM airflow_txn.quarantine WHERE committed")
    assert offset == str(landing / "corrupt.parquet") and "unreadable Parquet file" in reason
    coord.close()
