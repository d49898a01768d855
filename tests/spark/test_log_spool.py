"""An event-log batch under real ``spark-submit`` (local[2]): spooled by the driver as CSV files
that the JVM reads, it gives exactly the source's own records -- every awkward payload intact --
the same as the executors' streaming reader; where the spool cannot be written the batch is
streamed instead, and the spool is gone when the job ends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_transactional.sources import PostgresLogSource
from airflow_transactional.spark.submit import provider_zip
from airflow_transactional.store.connection import connect
from tests.helpers import AWKWARD_PAYLOADS, local_conf, make_log, startup_env

pytestmark = pytest.mark.spark

READ_EVERY_WAY = """
import json, logging, sys
from pyspark.sql import SparkSession
from airflow_transactional.sources import PostgresLogSource
from airflow_transactional.spark import read

dsn, out, unwritable = sys.argv[1:4]
logging.basicConfig(level=logging.INFO)  # as run() does
spark = SparkSession.builder.getOrCreate()
source = PostgresLogSource("clicks")
batch = {"ranges": [[0, 0, 100], [1, 2, 100]]}
chunks = read._log_chunks(batch, size=4)

def rows(df):
    return sorted(list(r) for r in df.collect())

def read_log():
    records = read.read_log(spark, source, batch, dsn=dsn, schema="airflow_txn", topology_id="t")
    return {"form": records.form, "files": len(records.df.inputFiles()), "rows": rows(records.df)}

result = {"root": read.spool_root(spark), "chosen": read_log(),
          "spooled": rows(read.read_spooled(spark, read.spool_log(source, chunks, read.spool_root(spark), dsn=dsn,
                                                                  schema="airflow_txn"))),
          "streamed": rows(read.stream_log(spark, source, chunks, dsn=dsn, schema="airflow_txn")),
          "spool_unwritable": read.spool_log(source, chunks, unwritable, dsn=dsn, schema="airflow_txn")}
spark.conf.set(read.SPOOL_CONF, unwritable)
result["fallback"] = read_log()
with open(out, "w") as fh:
    json.dump(result, fh)
spark.stop()
"""


def test_a_log_batch_spooled_for_the_jvm_reads_the_sources_own_records(dsn: str, tmp_path: Path) -> None:
    make_log(dsn, "clicks", partitions=2).append([(f"e{i}", p) for i, p in enumerate(AWKWARD_PAYLOADS * 3)])
    batch = {"ranges": [[0, 0, 100], [1, 2, 100]]}
    conn = connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            expected = sorted([r.offset, r.event_id, r.payload]
                              for r in PostgresLogSource("clicks").read(cur, "airflow_txn", "t", batch))
    finally:
        conn.close()
    assert len(expected) == 3 * len(AWKWARD_PAYLOADS) - 2
    job, out, scratch = tmp_path / "read_every_way.py", tmp_path / "out.json", tmp_path / "scratch"
    job.write_text(READ_EVERY_WAY)
    (tmp_path / "a_file").write_text("")
    argv = ["spark-submit", "--master", "local[2]", *local_conf({"spark.local.dir": str(scratch)}),
            "--py-files", provider_zip(), str(job), dsn, str(out),
            str(tmp_path / "a_file" / "spool")]
    res = subprocess.run(argv, env={**os.environ, "PYSPARK_PYTHON": sys.executable, **startup_env()},
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got["root"] == str(scratch)  # a local master spools into Spark's scratch directory
    assert got["chosen"] == {"form": "text", "files": 2, "rows": expected}  # a file per partition's chunk
    assert got["spooled"] == expected
    assert got["streamed"] == expected
    assert got["spool_unwritable"] is None
    assert got["fallback"] == {"form": "text", "files": 0, "rows": expected}  # streamed, nothing lost
    logged = res.stdout + res.stderr
    assert "spooled the log batch for the executors: 2 files" in logged
    assert "reading it through the executors" in logged
    assert not list(scratch.glob("txn-log-*"))  # the spool is removed when the driver exits
