"""Poison input under real ``spark-submit``: a huge garbage record and a corrupt Parquet file are
quarantined (a capped prefix and the length; the file by name), streamed from the executors, and
the rest of the batch commits -- no crash loop, no driver holding the garbage."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from airflow_transactional import LandingDirectory, StateSpec, TopologySpec
from airflow_transactional.coordinator import Coordinator
from airflow_transactional.limits import QUARANTINE_RECORD_CHARS
from airflow_transactional.sources.landed import write_json_lines
from airflow_transactional.spark.submit import provider_zip
from tests.helpers import local_conf, query, startup_env

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
    argv = ["spark-submit", "--master", "local[2]", *local_conf({"spark.sql.shuffle.partitions": "2"}),
            "--py-files", provider_zip(), job, "--topology", topology,
            "--txid", str(txid)]
    env = {**os.environ, "AIRFLOW_TXN_DSN": dsn, "PYSPARK_PYTHON": sys.executable, **startup_env()}
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)


def _orders_committed(dsn: str, landing: Path) -> Coordinator:
    """``spark_jobs/landing_amounts.py`` run on one batch of ``landing``, committed."""
    coord = Coordinator(dsn)
    coord.register(TopologySpec("orders", LandingDirectory(str(landing), settle_seconds=0), [
        StateSpec("order_totals", {"user": "text"}, combiner="sum"),
        StateSpec("order_counts", {"user": "text"}, combiner="count")]))
    t = coord.plan("orders", "r1").txid
    res = _submit(dsn, str(REPO / "spark_jobs" / "landing_amounts.py"), "orders", t)
    assert res.returncode == 0, res.stderr[-3000:]
    coord.commit("orders", t)
    return coord


def test_a_huge_garbage_record_is_quarantined_as_a_prefix_and_the_batch_commits(dsn: str, tmp_path: Path) -> None:
    landing = tmp_path / "in"
    landing.mkdir()
    write_json_lines(str(landing), "good.json", [{"user": "a", "amount": 3}, {"user": "b", "amount": 4}])
    garbage = "x" * 300_000
    (landing / "garbage.json").write_text(f"{garbage}\n" + '{"user": "a", "amount": 5}\n')
    coord = _orders_committed(dsn, landing)
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


def test_json_lines_are_read_by_sparks_json_reader_and_every_bad_one_is_quarantined(dsn: str, tmp_path: Path) -> None:
    """Blank lines are not records; a line holding an array of objects is those records; a
    malformed line keeps its raw text; a parsed record lacking a required field keeps its fields."""
    landing = tmp_path / "in"
    landing.mkdir()
    lines = ['{"user": "a", "amount": 3}', "", "   ", '[{"user": "a", "amount": 1}, {"user": "b", "amount": 2}]',
             '{"user": "b", "amount": ', '{"user": "c", "AMOUNT": 5}', "42", '{"user": "b", "amount": 10}']
    (landing / "mixed.json").write_text("\n".join(lines) + "\n")
    coord = _orders_committed(dsn, landing)
    assert dict(query(dsn, "SELECT \"user\", value FROM order_totals")) == {"a": 4, "b": 12}
    assert dict(query(dsn, "SELECT \"user\", value FROM order_counts")) == {"a": 2, "b": 2}
    quarantined = query(dsn, "SELECT record, reason FROM airflow_txn.quarantine WHERE committed ORDER BY record")
    assert quarantined == [("42", "malformed record: not a JSON object of the schema"),
                           ('{"user": "b", "amount": ', "malformed record: not a JSON object of the schema"),
                           ('{"user":"c"}', "missing required field 'amount'")]
    [commit] = coord.commits("orders")
    assert (commit["records_read"], commit["quarantined"]) == (7, 3)
    coord.close()


STAGE_BOTH_WAYS = """
import sys
from pyspark.sql import SparkSession
from airflow_transactional.model import Staging
from airflow_transactional.spark.stage import fold, stage_fold
from airflow_transactional.spec import StateSpec

dsn, copy_sql = sys.argv[1], sys.argv[2]
spark = SparkSession.builder.getOrCreate()
rows = [(f"k{i % 50}", i) for i in range(1000)] + [(None, 7)]
delta = fold(StateSpec("s", {"k": "text"}, combiner="sum"), spark.createDataFrame(rows, "k string, value long"))
assert stage_fold(delta, dsn, Staging(copy_sql, (1,))) == 50  # from the driver
assert stage_fold(delta, dsn, Staging(copy_sql, (2,)), driver_rows=10) == 50  # too many for the driver: the executors
spark.stop()
"""


def test_a_fold_is_staged_the_same_from_the_driver_and_from_the_executors(dsn: str, tmp_path: Path) -> None:
    query(dsn, "CREATE TABLE staged (way integer NOT NULL, k text NOT NULL, value bigint NOT NULL)")
    job = tmp_path / "stage_both_ways.py"
    job.write_text(STAGE_BOTH_WAYS)
    argv = ["spark-submit", "--master", "local[2]", *local_conf({"spark.sql.shuffle.partitions": "3"}),
            "--py-files", provider_zip(), str(job), dsn,
            "COPY staged (way, k, value) FROM STDIN WITH (FORMAT csv)"]
    res = subprocess.run(argv, env={**os.environ, "PYSPARK_PYTHON": sys.executable, **startup_env()},
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    expected = {(f"k{k}", sum(i for i in range(1000) if i % 50 == k)) for k in range(50)}
    for way in (1, 2):
        assert set(query(dsn, f"SELECT k, value FROM staged WHERE way = {way}")) == expected


def test_bad_records_a_spark_task_copied_twice_are_committed_once(dsn: str, tmp_path: Path) -> None:
    """A task that fails after its quarantine COPY committed is run again by Spark (here: the fault
    point after the COPY, once, and ``local[2,2]`` for a second try; on a cluster: its executor
    lost with the task's result) and copies its slice again: the commit keeps one copy of each."""
    from dev import faults

    landing = tmp_path / "in"
    landing.mkdir()
    for name, user in (("a.json", "a"), ("b.json", "b")):
        (landing / name).write_text(f'{{"user": "{user}", "amount": 2}}\nnot json {user}\nnot json {user}\n')
    coord = Coordinator(dsn)
    coord.register(TopologySpec("orders", LandingDirectory(str(landing), settle_seconds=0), [
        StateSpec("order_totals", {"user": "text"}, combiner="sum"),
        StateSpec("order_counts", {"user": "text"}, combiner="count")]))
    t = coord.plan("orders", "r1").txid
    fired = tmp_path / "fired"
    argv = ["spark-submit", "--master", "local[2,2]", *local_conf({"spark.sql.shuffle.partitions": "2"}),
            "--py-files", provider_zip(), str(REPO / "spark_jobs" / "landing_amounts.py"), "--topology", "orders",
            "--txid", str(t)]
    env = faults.child_env({**os.environ, "AIRFLOW_TXN_DSN": dsn, "PYSPARK_PYTHON": sys.executable, **startup_env()},
                           faults=f"quarantine.after_copy=raise@once:{fired}")
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert fired.exists(), "the fault point after the quarantine COPY never fired"
    [(slices, writers, copied)] = query(dsn, "SELECT count(DISTINCT slice), count(DISTINCT writer), count(*) "
                                             "FROM airflow_txn.quarantine")
    assert writers > slices and copied > 4, (slices, writers, copied)  # a slice was copied by a second task
    coord.commit("orders", t)
    kept = query(dsn, "SELECT record FROM airflow_txn.quarantine WHERE committed")
    assert sorted(r for (r,) in kept) == ["not json a", "not json a", "not json b", "not json b"]
    assert dict(query(dsn, "SELECT \"user\", value FROM order_totals")) == {"a": 2, "b": 2}
    coord.close()


def _wait_for(path: Path, proc: subprocess.Popen[str], timeout: float = 180) -> bool:
    """Until ``path`` exists (True) or ``proc`` ended (False)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_a_name_swapped_for_a_link_while_spark_reads_reads_nothing_through_it(dsn: str, tmp_path: Path) -> None:
    """Regression: the Spark reader opened planned files by name, after the check, for longer than
    the pure-Python one. A writer of the landing directory swaps the name for a link to a file it
    may not read right after the check, and back before the check after the read: the driver
    reads the planned file itself (by descriptor) or fails the attempt -- the other file's lines
    never reach the quarantine."""
    from dev import faults

    landing, secret = tmp_path / "in", tmp_path / "secret.txt"
    landing.mkdir()
    secret.write_text("SECRET-LINE not json\n")
    secret.chmod(0o600)
    write_json_lines(str(landing), "f.json", [{"user": "a", "amount": 2}])
    os.utime(landing / "f.json", (time.time() - 10, time.time() - 10))
    coord = Coordinator(dsn)
    coord.register(TopologySpec("orders", LandingDirectory(str(landing), settle_seconds=0), [
        StateSpec("order_totals", {"user": "text"}, combiner="sum"),
        StateSpec("order_counts", {"user": "text"}, combiner="count")]))
    t = coord.plan("orders", "r1").txid
    checked, read = tmp_path / "checked", tmp_path / "read"
    argv = ["spark-submit", "--master", "local[2]", *local_conf({"spark.sql.shuffle.partitions": "2"}),
            "--py-files", provider_zip(), str(REPO / "spark_jobs" / "landing_amounts.py"), "--topology", "orders",
            "--txid", str(t)]
    env = faults.child_env({**os.environ, "AIRFLOW_TXN_DSN": dsn, "PYSPARK_PYTHON": sys.executable, **startup_env()},
                           faults=f"spark.begin=waitfor:{checked},spark.after_stage=waitfor:{read}")
    name, kept = landing / "f.json", landing / ".kept"
    job = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert _wait_for(Path(f"{checked}.waiting"), job), "the driver never passed its check"
        name.rename(kept)  # the writer's move, right after the check
        name.symlink_to(secret)
        checked.touch()
        if _wait_for(Path(f"{read}.waiting"), job):  # it read what it read: the writer puts the file back
            name.unlink()
            kept.rename(name)
            read.touch()
        out, _ = job.communicate(timeout=300)
    finally:
        job.kill()
    assert job.returncode != 0 and "cannot be opened as a file of its own" in out, out[-3000:]
    assert not [r for (r,) in query(dsn, "SELECT record FROM airflow_txn.quarantine") if "SECRET" in (r or "")]
    coord.close()
