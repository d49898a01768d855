"""A correction's retractions through the Spark job (a client of the tier's Spark Connect server:
the job's code is the subject, not its driver): a second stage reads the corrected first stage's
log -- retractions and new versions among its events -- and takes each retraction back (its
transform's values negated), ending equal to the fixed code's oracle, in the per-record (one pass)
form and in the plain one; and a second stage with an output log of its own retracts and versions
its events in turn, for a third stage to follow -- and a preview of a correction of that stage
names the events its commit would append."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_transactional import OutputSpec, PostgresLogSource, SparkJob, StateSpec, TopologySpec
from airflow_transactional.cli import main as cli
from airflow_transactional.coordinator import Coordinator
from airflow_transactional.processing import process_batch
from tests.helpers import connect_job, declared, make_log, query, table
from tests.integration.test_cascading_corrections import _agree, _correct, fixed_again, last_fn
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


MID_JOB = '''
from pyspark.sql import functions as F
from airflow_transactional.spark_job import run

def transform(big):
    relay = big.select(F.concat("_event_id", F.lit(":0")).alias("id"), F.col("user").alias("key"),
                       F.to_json(F.struct("user", (F.col("amount") * 10).alias("amount"))).alias("payload"))
    explicit = big.select(F.concat(F.lit("x"), F.col("i").cast("string")).alias("id"),
                          F.to_json(F.struct("user", "amount", F.lit(True).alias("x"))).alias("payload"))
    return {"m_amount": big.select(F.col("user").alias("user_id"), F.col("amount").alias("value")),
            "relay": relay.unionByName(explicit, allowMissingColumns=True)}

if __name__ == "__main__":
    raise SystemExit(run(transform, schema="user string, amount long, i long", required=["user", "amount"]))
'''


def _spark_drain(dsn: str, remote: str, coord: Coordinator, job: Path, runs: str, topology: str = "stage2") -> None:
    for n in range(20):
        txn = coord.plan(topology, f"{runs}{n}")
        if txn.empty:
            coord.commit(topology, txn.txid)
            return
        done = connect_job(dsn, remote, str(job), "--topology", topology, "--txid", str(txn.txid))
        assert done.returncode == 0, done.stderr[-3000:]
        coord.commit(topology, txn.txid)
    raise AssertionError("the log never ran dry")


@pytest.mark.parametrize("per_record", [True, False])
def test_the_spark_job_takes_a_corrections_retractions_back(dsn: str, tmp_path: Path, per_record: bool,
                                                            spark_remote: str) -> None:
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
        _spark_drain(dsn, spark_remote, coord, job, "b")
        assert {k: v for k, v in table(dsn, "s2_amount").items() if v} == oracle(buggy, 60)
        fix = coord.plan_correction("stage1", "fix", 1, 2)
        process_batch(coord, "stage1", fix.txid, fixed)
        coord.commit("stage1", fix.txid)
        retractions = query(dsn, "SELECT count(*) FROM airflow_txn.log_versions WHERE retraction")[0][0]
        assert retractions > 0
        _spark_drain(dsn, spark_remote, coord, job, "c")
        assert {k: v for k, v in table(dsn, "s2_amount").items() if v} == oracle(fixed, 60)


def test_the_spark_job_retracts_and_versions_its_own_events_in_turn(dsn: str, tmp_path: Path, capsys: Any,
                                                                   spark_remote: str, spark_connect_conn: str) -> None:
    """As tests/integration/test_cascading_corrections.py, ``mid`` processed by the Spark job: first
    lagging behind a correction (originals and their retractions in one batch), then behind three."""
    job = tmp_path / "mid.py"
    job.write_text(MID_JOB)
    make_log(dsn, "clicks").append(clicks(0, 60))
    spec, dag_file = declared(tmp_path, TopologySpec("mid", PostgresLogSource("big"),
                                                 [StateSpec("m_amount", {"user_id": "text"})],
                                                 outputs=[OutputSpec("relay", partitions=2)], max_batch_size=1000,
                                                 job=SparkJob(str(job))))
    with Coordinator(dsn) as coord:
        coord.register(stage1(max_batch_size=30))
        coord.register(spec)
        coord.register(TopologySpec("last", PostgresLogSource("relay"), [StateSpec("l_amount", {"user_id": "text"})],
                                    max_batch_size=7))
        drain(coord, "stage1", buggy, "a")
        _correct(coord, "fix-2", 2, 2, fixed)
        _spark_drain(dsn, spark_remote, coord, job, "b", "mid")
        drain(coord, "last", last_fn, "c")
        _agree(dsn)
        for n, fn in enumerate((fixed_again, fixed, fixed_again)):
            _correct(coord, f"again-{n}", 1, 2, fn)
        _spark_drain(dsn, spark_remote, coord, job, "d", "mid")
        drain(coord, "last", last_fn, "e")
        relay = _agree(dsn)
        assert query(dsn, "SELECT count(*) FROM airflow_txn.log_versions WHERE log_name = 'relay'")[0][0] > 0
        # A preview of a correction of mid's own txids under a changed job: each live event the change
        # moves would be retracted and versioned; the explicit ones stay as they are.
        job.write_text(MID_JOB.replace('* 10', '* 20'))
        code = cli(["--dsn", dsn, "correct", "mid", f"1..{coord.status('mid').committed_txid}", "--dag-file",
                    dag_file, "--spark-connect", spark_connect_conn, "--json"])
        out, err = capsys.readouterr()
        assert "{\n" in out, err[-3000:]
        preview = json.loads(out[out.index("{\n"):])
        moved = sum(1 for e in relay.values() if "x" not in e)
        assert code == 0 and preview["outputs"] == {"relay": {"retracted": moved, "versions": moved, "new": 0}}
