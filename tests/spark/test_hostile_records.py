"""No record can stop a topology (the Spark helper): whatever a producer appends, the batch
commits, every bad record is quarantined with its reason, and the states hold what the oracle
computes from the good records alone (tests/hostile.py) -- the per-record fold of ``words``-like
states, in a Spark session that stays up across the generated batches."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings

from airflow_transactional import limits
from airflow_transactional.coordinator import Coordinator
from airflow_transactional.sources import EventLog
from airflow_transactional.spark import job
from airflow_transactional.spark_job import per_record
from dev.embedded import EmbeddedPostgres
from tests.helpers import query
from tests.hostile import BATCHES, EXAMPLES, oracle
from tests.integration.test_hostile_records import LANDED_SUMS, _topology, land_past_the_limits, landed_topology

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[2]").appName("hostile").config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def transform(records: Any) -> dict[str, Any]:
    return {"hostile_count": per_record(records, {"user_id": "user"}),
            "hostile_amount": per_record(records, {"user_id": "user"}, value="amount")}


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=BATCHES)
@example(batch=EXAMPLES[0])
@example(batch=EXAMPLES[1])
@example(batch=EXAMPLES[2])
@example(batch=EXAMPLES[3])
@example(batch=EXAMPLES[4])
@example(batch=EXAMPLES[5])

def test_any_batch_commits_with_its_bad_records_quarantined(pg: EmbeddedPostgres, spark: Any,
                                                            batch: list[str]) -> None:
    name = f"h_{uuid.uuid4().hex[:10]}"
    dsn = pg.create_database(name)
    log = EventLog(dsn, "hostile")
    coord = Coordinator(dsn)
    try:
        log.create(1)
        log.append([(f"e{n}", text) for n, text in enumerate(batch)])
        coord.register(_topology("hostile"))
        txn = coord.plan("hostile", "r1")
        result = job.process(spark, coord, "hostile", txn.txid, transform, schema="user string, amount bigint",
                             required=["user", "amount"])
        assert coord.commit("hostile", txn.txid).committed
        counts, sums, bad = oracle(batch, spark=True)
        assert dict(query(dsn, "SELECT user_id, value FROM hostile_count")) == counts
        assert dict(query(dsn, "SELECT user_id, value FROM hostile_amount")) == sums
        quarantined = query(dsn, "SELECT event_id, source_offset, reason FROM airflow_txn.quarantine WHERE committed")
        assert sorted(int(e[1:]) for e, _o, _r in quarantined if e is not None) == bad
        set_aside = sorted(r for e, o, r in quarantined if e is None)
        assert len(set_aside) == len(set(counts) - set(sums)), quarantined  # a user whose sum left the bigint
        assert all("leaves bigint" in r for r in set_aside)
        assert result["quarantined"] == len(quarantined) and result["records_read"] == len(batch)
    finally:
        coord.close()
        log.close()
        pg.drop_database(name)


def plain(records: Any) -> dict[str, Any]:
    """The same states as plain DataFrames (a groupBy): no record can be told apart any more."""
    from pyspark.sql import functions as F

    per_user = records.groupBy("user").agg(F.count("*").alias("n"), F.sum("amount").alias("total"))
    return {"hostile_count": per_user.select(F.col("user").alias("user_id"), F.col("n").alias("value")),
            "hostile_amount": records.select(F.col("user").alias("user_id"), F.col("amount").alias("value"))}


def test_rows_of_plain_dataframes_that_cannot_be_staged_are_set_aside_by_key(pg: EmbeddedPostgres, spark: Any) -> None:
    """A transform of plain DataFrames: a key too long or holding a NUL, a sum past a bigint --
    the key's row of the batch is set aside in the quarantine with the reason, the rest commits."""

    dsn = pg.create_database(f"h_{uuid.uuid4().hex[:10]}")
    log, coord = EventLog(dsn, "hostile"), Coordinator(dsn)
    log.create(1)
    batch = [{"user": "ann", "amount": 2**62}, {"user": "ann", "amount": 2**62}, {"user": "bob", "amount": 1},
             {"user": "x" * 2000, "amount": 1}, {"user": "k\u0000ey", "amount": 1}, {"user": "bob", "amount": 2}]
    log.append([(f"e{n}", json.dumps(r)) for n, r in enumerate(batch)])
    coord.register(_topology("hostile"))
    txn = coord.plan("hostile", "r1")
    result = job.process(spark, coord, "hostile", txn.txid, plain, schema="user string, amount bigint",
                         required=["user", "amount"])
    assert coord.commit("hostile", txn.txid).committed
    assert dict(query(dsn, "SELECT user_id, value FROM hostile_amount")) == {"bob": 3}
    assert dict(query(dsn, "SELECT user_id, value FROM hostile_count")) == {"ann": 2, "bob": 2}
    reasons = query(dsn, "SELECT source_offset, reason FROM airflow_txn.quarantine ORDER BY source_offset, reason")
    assert [o for o, _ in reasons] == ["fold:hostile_amount"] * 3 + ["fold:hostile_count"] * 2
    text = " | ".join(r for _, r in reasons)
    assert text.count("more than the 1,024 bytes") == 2 and text.count("NUL byte") == 2
    assert "the batch's sum for this key leaves bigint" in text
    assert result["quarantined"] == 5
    coord.close()
    log.close()


def test_no_payment_request_can_stop_the_payments_pipeline(pg: EmbeddedPostgres, spark: Any) -> None:
    """Regression: in the live pipeline ``amount: 9223372036854775805`` failed every attempt with
    ARITHMETIC_OVERFLOW (the job adds a fee to it) and a 6 KB request id hit the index row limit;
    both stopped payments. The example now bounds amounts before any arithmetic, and a request or
    event id past the limit is set aside; the rest of the batch is decided and committed."""
    import importlib.util
    from pathlib import Path

    from dev import payments
    from tests.spark.test_payments_job import example_specs

    path = Path(__file__).resolve().parents[2] / "spark_jobs" / "payments.py"
    loaded = importlib.util.spec_from_file_location("payments_job", path)
    assert loaded is not None and loaded.loader is not None
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    dsn = pg.create_database(f"h_{uuid.uuid4().hex[:10]}")
    coord = Coordinator(dsn)
    specs = example_specs()
    requests, ledger = payments.create_logs(dsn)
    coord.register(specs["settlement"])
    coord.register(specs["payments"])
    payments.deposit(ledger, {a: 500 for a in payments.ACCOUNTS})
    a, b = payments.ACCOUNTS[:2]
    sent = [{"id": "ok-1", "from": a, "to": b, "amount": 10},
            {"id": "huge", "from": a, "to": b, "amount": 9223372036854775805},
            {"id": "r" * 6000, "from": a, "to": b, "amount": 5},
            {"id": "ok-2", "from": a, "to": b, "amount": 20}]
    requests.append([(r["id"][:60], json.dumps(r)) for r in sent], partition=0)
    txn = coord.plan("payments", "r1")
    result = job.process(spark, coord, "payments", txn.txid, module.transform, schema=module.SCHEMA,
                         required=module.REQUIRED, checks=module.CHECKS)
    assert coord.commit("payments", txn.txid).committed
    verdicts = dict(query(dsn, "SELECT request_id, granted FROM airflow_txn.verdicts"))
    assert verdicts == {"ok-1": True, "ok-2": True}
    rows = query(dsn, "SELECT source_offset, reason FROM airflow_txn.quarantine ORDER BY id")
    assert any("amount must be at most 1,000,000,000" in r for _, r in rows)
    assert any(o == "request:pay" and "more than the 512 bytes" in r for o, r in rows)
    assert any(o == "output:ledger" and "more than the 512 bytes" in r for o, r in rows)
    assert result["quarantined"] == len(rows)
    coord.close()
    requests.close()
    ledger.close()


def test_landed_lines_past_the_limits_are_quarantined_as_the_python_processor_does(
        dsn: str, spark: Any, tmp_path: Path) -> None:
    """Regression: Spark's JSON reader stored an escaped lone surrogate as '?' (the pure-Python
    processor quarantined the record: the two disagreed) and parsed a line of any length. A file
    whose registration found either is read as text and judged line by line, with the same
    reasons, before anything is parsed; a batch of plain files is read by the JSON reader."""
    from pyspark.sql import functions as F

    land_past_the_limits(tmp_path)
    coord = Coordinator(dsn)
    coord.register(landed_topology(tmp_path, max_files=2))
    txn = coord.plan("landed", "r1")
    result = job.process(spark, coord, "landed", txn.txid,
                         lambda records: {"hostile_amount": records.select(F.col("user").alias("user_id"),
                                                                           F.col("amount").alias("value"))},
                         schema="user string, amount bigint", required=["user", "amount"])
    assert coord.commit("landed", txn.txid).committed
    assert dict(query(dsn, "SELECT user_id, value FROM landed_amount")) == LANDED_SUMS
    rows = query(dsn, "SELECT reason, record_length FROM airflow_txn.quarantine ORDER BY record_length DESC")
    assert [r[0] for r in rows] == [limits.RECORD_TOO_LARGE, limits.LONE_SURROGATE]
    assert rows[0][1] > limits.MAX_RECORD_BYTES and result["quarantined"] == 2
    coord.close()


@pytest.mark.parametrize("fused", [True, False], ids=["per_record", "plain"])
def test_landed_values_that_are_not_text_in_a_string_field_are_quarantined_as_the_python_processor_does(
        dsn: str, spark: Any, tmp_path: Path, fused: bool) -> None:
    """Regression: Spark's JSON reader made any JSON value text in a field the record schema declares
    string (``1.0E308``, ``NaN``, ``true``, ``[1,2]``) where the pure-Python processor quarantines
    such a key. A plain file, read by the JSON reader, that may hold one is read again as text,
    where each record's own text tells a number from text that reads like one (``"1.5"``)."""
    from pyspark.sql import functions as F

    lines = EXAMPLES[5]
    (tmp_path / "a.json").write_text("\n".join(lines) + "\n")
    coord = Coordinator(dsn)
    coord.register(landed_topology(tmp_path, max_files=1))
    txn = coord.plan("landed", "r1")

    def amounts(records: Any) -> dict[str, Any]:
        if fused:
            return {"hostile_amount": per_record(records, {"user_id": "user"}, value="amount")}
        return {"hostile_amount": records.select(F.col("user").alias("user_id"), F.col("amount").alias("value"))}

    result = job.process(spark, coord, "landed", txn.txid, amounts, schema="user string, amount bigint",
                         required=["user", "amount"])
    assert coord.commit("landed", txn.txid).committed
    _counts, sums, bad = oracle(lines, spark=True)
    assert dict(query(dsn, "SELECT user_id, value FROM landed_amount")) == sums
    reasons = [r for (r,) in query(dsn, "SELECT reason FROM airflow_txn.quarantine WHERE committed")]
    assert len(reasons) == len(bad) == result["quarantined"] and all("must be text" in r for r in reasons), reasons
    assert query(dsn, "SELECT plain FROM airflow_txn.landing_files") == [(True,)]  # read by the JSON reader first
    coord.close()


def test_an_output_event_past_the_record_limit_is_set_aside_as_the_python_processor_does(
        dsn: str, spark: Any) -> None:
    """An output event is a record of its log: past the limit or escaping a lone surrogate, the
    pure-Python processor quarantines the record that emitted it (OutputEvent) and the Spark
    helper sets the event aside -- the log never holds a record its readers would refuse."""
    from pyspark.sql import functions as F

    from airflow_transactional import OutputSpec, PostgresLogSource, StateSpec, TopologySpec

    log = EventLog(dsn, "notes")
    log.create(1)
    log.append([("n1", json.dumps({"user": "ann", "size": 10})),
                ("n2", json.dumps({"user": "bob", "size": limits.MAX_RECORD_BYTES + 1})),
                ("n3", json.dumps({"user": "cy", "size": -1}))])
    coord = Coordinator(dsn)
    coord.register(TopologySpec("notes", PostgresLogSource("notes"), [
        StateSpec("note_count", {"user_id": "text"}, combiner="count")], outputs=[OutputSpec("echo")]))
    txn = coord.plan("notes", "r1")

    def transform(records: Any) -> dict[str, Any]:
        return {"note_count": records.select(F.col("user").alias("user_id"), F.lit(1).alias("value")),
                "echo": records.select(F.col("_event_id").alias("id"), F.when(
                    F.col("size") < 0, F.lit('{"n": "\\ud800"}')).otherwise(F.repeat(F.lit("x"), F.col("size")))
                    .alias("payload"))}

    result = job.process(spark, coord, "notes", txn.txid, transform, schema="user string, size int",
                         required=["user"])
    assert coord.commit("notes", txn.txid).committed
    assert query(dsn, "SELECT event_id FROM airflow_txn.log_events WHERE log_name = 'echo'") == [("notes:n1",)]
    assert sorted(r for (r,) in query(dsn, "SELECT reason FROM airflow_txn.quarantine")) == [
        f"output event for 'echo': {limits.LONE_SURROGATE}", f"output event for 'echo': {limits.RECORD_TOO_LARGE}"]
    assert result["quarantined"] == 2
    coord.close()
    log.close()
