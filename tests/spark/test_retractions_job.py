"""A correction's retractions through the Spark job: a second stage processed by ``spark-submit``
reads the corrected first stage's log -- retractions and new versions among its events -- and takes
each retraction back (its transform's values negated), ending equal to the fixed code's oracle, in
the per-record (one pass) form and in the plain one."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_transactional import PostgresLogSource, SparkJob, StateSpec, TopologySpec
from airflow_transactional.coordinator import Coordinator
from airflow_transactional.processing import process_batch
from tests.helpers import declared, make_log, query, spark_submit, table
from tests.integration.test_compensation import buggy, fixed, oracle
from tests.integration.test_output_logs import clicks, drain, stage1

pytestmark = pytest.mark.spark

JOB = '''
from pyspark.sql import functions as F
from airflow_transactional.spark_job import per_record, run

def transform(big):
    if PER_RECORD:
        return {{"s2_amount": per_record(big, {{"user_id": F.col("user")}}, value=F.col("amount"))}}
    return {{"s2_amount": big.select(F.col("user").alias("user_id"), F.col("amount").alias("value"))}}

PER_RECORD = {per_record}
if __name__ == "__main__":
    raise SystemExit(run(transform, schema="user string, amount long, i long", required=["user", "amount"]))
'''


def _spark_drain(dsn: str, coord: Coordinator, job: Path, runs: str) -> None:
    for n in range(20):
        txn = coord.plan("stage2", f"{runs}{n}")
        if txn.empty:
            coord.commit("stage2", txn.txid)
            return
        done = spark_submit(dsn, str(job), "--topology", "stage2", "--txid", str(txn.txid))
        assert done.returncode == 0, done.stderr[-3000:]
        coord.commit("stage2", txn.txid)
    raise AssertionError("the log never ran dry")


@pytest.mark.parametrize("per_record", [True, False])
def test_the_spark_job_takes_a_corrections_retractions_back(dsn: str, tmp_path: Path, per_record: bool) -> None:
    job = tmp_path / "stage2.py"
    job.write_text(JOB.format(per_record=per_record))
    make_log(dsn, "clicks").append(clicks(0, 60))
    spec, _dag = declared(tmp_path, TopologySpec("stage2", PostgresLogSource("big"),
                                                 [StateSpec("s2_amount", {"user_id": "text"})], max_batch_size=40,
                                                 job=SparkJob(str(job))))
    with Coordinator(dsn) as coord:
        coord.register(stage1(max_batch_size=30))
        coord.register(spec)
        drain(coord, "stage1", buggy, "a")
        _spark_drain(dsn, coord, job, "b")
        assert {k: v for k, v in table(dsn, "s2_amount").items() if v} == oracle(buggy, 60)
        fix = coord.plan_correction("stage1", "fix", 1, 2)
        process_batch(coord, "stage1", fix.txid, fixed)
        coord.commit("stage1", fix.txid)
        retractions = query(dsn, "SELECT count(*) FROM airflow_txn.log_versions WHERE retraction")[0][0]
        assert retractions > 0
        _spark_drain(dsn, coord, job, "c")
        assert {k: v for k, v in table(dsn, "s2_amount").items() if v} == oracle(fixed, 60)
