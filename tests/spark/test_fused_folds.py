"""States declared per record, under real ``spark-submit`` (local[2]): folded in one pass, they
stage exactly what folding each state on its own stages -- every combiner, value type, multi-column
and null keys, conditions that are false or null -- from the driver and from the executors alike,
and exactly an oracle computed here. Through ``run``, a landing batch with bad records takes the
one pass (no cache), counts and quarantines its bad records, and commits what the oracle says;
a transform of plain DataFrames still takes the cached path to the same result."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from collections import defaultdict
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from airflow_transactional import LandingDirectory, StateSpec, TopologySpec
from airflow_transactional.coordinator import Coordinator
from airflow_transactional.spark.submit import provider_zip
from tests.helpers import local_conf, query, startup_env

pytestmark = pytest.mark.spark

# Records: (k, a, b, n, x); k, a, n and x may be null.
FOLD_EVERY_WAY = """
import json, sys
from decimal import Decimal
from pyspark.sql import SparkSession, functions as F
from airflow_transactional.spark.fused import fuse, per_record
from airflow_transactional.model import Staging
from airflow_transactional.spark.stage import fold, stage_fold
from airflow_transactional.spec import StateSpec

dsn, rows_file, out = sys.argv[1:4]
spark = SparkSession.builder.getOrCreate()
rows = [tuple(r) for r in json.load(open(rows_file))]
records = spark.createDataFrame(rows, "k string, a string, b long, n long, x double")
states = [StateSpec("counted", {"k": "text"}, combiner="count"),
          StateSpec("summed", {"a": "text", "b": "bigint"}, combiner="sum", value_type="numeric"),
          StateSpec("lowest", {"k": "text"}, combiner="min"),
          StateSpec("highest", {"b": "bigint"}, combiner="max", value_type="double precision")]
frames = {
    "counted": per_record(records, {"k": "k"}, where="n > 2"),  # n null: the condition is null, not met
    "summed": per_record(records, {"a": F.col("a"), "b": F.col("b")}, value=F.col("x") * 1.5),
    "lowest": per_record(records, {"k": F.upper("k")}, value="n", where=F.col("b") % 2 == 0),
    "highest": per_record(records, {"b": F.col("b") % 7}, value=F.col("x")),
}
copies = {s.name: f"COPY {s.name} (way, {', '.join(s.key_columns)}, value) FROM STDIN WITH (FORMAT csv)"
          for s in states}
for s in states:  # way 1: a job per state, as a transform of plain DataFrames gets
    stage_fold(fold(s, frames[s.name]), dsn, Staging(copies[s.name], (1,)))
result = {}
for way, driver_rows in ((2, 100_000), (3, 0)):  # from the driver, then from the executors
    folds = fuse(states, frames, records)
    kept = folds.run(driver_rows)
    result[way] = folds.stage(dsn, copies, (way,))
    kept.unpersist()
# Not fused: a frame that is not declared per record, one over other records, an extra frame.
plain = {**frames, "counted": records.select("k", F.lit(1).alias("value"))}
other = {**frames, "lowest": per_record(records.where("b > 0"), {"k": "k"})}
result["not fused"] = [fuse(states, plain, records) is None, fuse(states, other, records) is None,
                       fuse(states[:3], frames, records) is None]
errors = []
for bad in (lambda: per_record(records, {}), lambda: per_record(records, ["k"]),
            lambda: per_record(records, {"value": "k"}), lambda: per_record(records, {"k": "k"}, value=[1]),
            lambda: per_record(records, {"k": "k"}, where=3),
            lambda: fuse([StateSpec("s", {"url": "text"})], {"s": per_record(records, {"k": "k"})}, records)):
    try:
        bad()
        errors.append(None)
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
result["errors"] = errors
result["decimal"] = str(per_record(records, {"k": "k"}, value=Decimal("2.5")).agg(F.sum("value")).first()[0])
json.dump(result, open(out, "w"))
spark.stop()
"""


def _records(n: int) -> list[list[Any]]:
    rng = random.Random(7)
    out = []
    for _ in range(n):
        out.append([rng.choice(["p", "q", "r", "s", None]), rng.choice(["a", "b", "", None]), rng.randrange(-5, 40),
                    rng.choice([None, *range(6)]), rng.choice([None, 0.25, 1.5, -2.0, 3.75])])
    return [*out, ["z", None, 4, None, None]]  # "lowest" of key "Z": every value null


def _fold(rows: list[tuple[tuple[Any, ...] | None, Any]], combine: Any) -> dict[tuple[Any, ...], Any]:
    """SQL's fold: rows with a null key are dropped, null values ignored; a key whose values are all
    null contributes nothing (staged as a null it would wipe a stored sum)."""
    values: dict[tuple[Any, ...], list[Any]] = defaultdict(list)
    for key, value in rows:
        if key is not None and None not in key:
            values[key].append(value)
    return {key: combine([v for v in vs if v is not None]) for key, vs in values.items()
            if any(v is not None for v in vs)}


def _oracle(rows: list[list[Any]]) -> dict[str, dict[tuple[Any, ...], Any]]:
    """What each state of FOLD_EVERY_WAY folds to, computed here from the same records."""
    return {
        "counted": _fold([((k,), 1) for k, _a, _b, n, _x in rows if n is not None and n > 2], sum),
        "summed": _fold([((a, b), None if x is None else Decimal(str(x)) * Decimal("1.5"))
                         for _k, a, b, _n, x in rows], sum),
        "lowest": _fold([((None if k is None else k.upper(),), n) for k, _a, b, n, _x in rows if b % 2 == 0], min),
        "highest": _fold([((math.fmod(b, 7),), x) for _k, _a, b, _n, x in rows], max),  # SQL's % keeps the sign
    }


def test_states_declared_per_record_fold_in_one_pass_exactly_as_state_by_state(dsn: str, tmp_path: Path) -> None:
    query(dsn, "CREATE TABLE counted (way int, k text, value bigint)")
    query(dsn, "CREATE TABLE summed (way int, a text, b bigint, value numeric)")
    query(dsn, "CREATE TABLE lowest (way int, k text, value bigint)")
    query(dsn, "CREATE TABLE highest (way int, b bigint, value double precision)")
    rows = _records(3000)
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    job, out = tmp_path / "fold_every_way.py", tmp_path / "out.json"
    job.write_text(FOLD_EVERY_WAY)
    argv = ["spark-submit", "--master", "local[2]", *local_conf({"spark.sql.shuffle.partitions": "3"}),
            "--py-files", provider_zip(), str(job), dsn,
            str(tmp_path / "rows.json"), str(out)]
    res = subprocess.run(argv, env={**os.environ, "PYSPARK_PYTHON": sys.executable, **startup_env()},
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, "\n".join(line for line in res.stderr.splitlines() if " INFO " not in line)[-5000:]
    got = json.loads(out.read_text())
    oracle = _oracle(rows)
    for state, keys in (("counted", "k"), ("summed", "a, b"), ("lowest", "k"), ("highest", "b")):
        staged = {way: {tuple(r[:-1]): r[-1] for r in query(dsn, f"SELECT {keys}, value FROM {state} WHERE way = %s",
                                                            (way,))} for way in (1, 2, 3)}
        assert staged[1] == oracle[state], state
        assert staged[2] == staged[1] and staged[3] == staged[1], state
        assert got["2"][state] == got["3"][state] == len(oracle[state])
    assert got["not fused"] == [True, True, True]
    assert Decimal(got["decimal"]) == Decimal("2.5") * len(rows)  # a Decimal is a number too
    errors = got["errors"]
    assert "keys maps each key column's name to its Column" in errors[0]
    assert "keys maps each key column's name" in errors[1]
    assert "'value' names the value column" in errors[2]
    assert "value must be a Column, a column name or a number" in errors[3]
    assert "where must be a Column or a Spark SQL condition" in errors[4]
    assert "ConfigError: the transform's DataFrame for state 's' lacks columns ['url']" in errors[5]


ORDERS_JOB = """
from pyspark.sql import functions as F
from airflow_transactional.spark_job import per_record, run

def transform(orders):
    {body}

if __name__ == "__main__":
    raise SystemExit(run(transform, schema="user string, amount bigint", required=["user", "amount"],
                         checks={{"amount must be positive": "amount > 0"}}))
"""
FUSED = """return {"totals": per_record(orders, {"user": "user"}, value="amount"),
            "big": per_record(orders, {"user": F.upper("user")}, where=F.col("amount") >= 10)}"""
PLAIN = """return {"totals": orders.select("user", F.col("amount").alias("value")),
            "big": orders.where("amount >= 10").select(F.upper("user").alias("user"), F.lit(1).alias("value"))}"""


@pytest.mark.parametrize("body", [FUSED, PLAIN], ids=["per record", "plain DataFrames"])
def test_a_batch_with_bad_records_commits_the_same_either_way(dsn: str, tmp_path: Path, body: str) -> None:
    landing = tmp_path / "in"
    landing.mkdir()
    rng = random.Random(3)
    good = [{"user": rng.choice("abcde"), "amount": rng.randrange(1, 30)} for _ in range(500)]
    bad = ['{"user": "a", "amount": ', '{"user": "b"}', '{"user": "c", "amount": -4}', "[1]"]
    lines = [json.dumps(r) for r in good[:250]] + bad + [json.dumps(r) for r in good[250:]]
    (landing / "orders.json").write_text("\n".join(lines) + "\n")
    coord = Coordinator(dsn)
    coord.register(TopologySpec("orders", LandingDirectory(str(landing), settle_seconds=0), [
        StateSpec("totals", {"user": "text"}, combiner="sum"), StateSpec("big", {"user": "text"}, combiner="count")]))
    txid = coord.plan("orders", "r1").txid
    job, result = tmp_path / "orders.py", tmp_path / "result.json"
    job.write_text(ORDERS_JOB.format(body=body))
    argv = ["spark-submit", "--master", "local[2]", *local_conf({"spark.sql.shuffle.partitions": "2"}),
            "--py-files", provider_zip(), str(job), "--topology", "orders",
            "--txid", str(txid), "--result-file", str(result)]
    env = {**os.environ, "AIRFLOW_TXN_DSN": dsn, "PYSPARK_PYTHON": sys.executable, **startup_env()}
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    profile = json.loads(result.read_text())["profile"]
    phases = profile["seconds"]
    assert ("read, parse, validate, fold" in phases) == (body == FUSED)  # one pass, no cache
    threads = profile["jvm_threads"]  # what the driver JVM's threads cost, by what they do
    assert list(threads) == ["compiling (JIT)", "garbage collection", "running tasks", "other"]
    assert threads["compiling (JIT)"] > 0 and threads["running tasks"] > 0 and threads["other"] > 0
    assert sum(threads.values()) <= sum(profile["cpu_seconds"].values()) + 0.5  # a part of the job's CPU
    assert ("read, parse, validate, cache" in phases) == (body == PLAIN)
    assert coord.commit("orders", txid).committed
    totals: dict[str, int] = defaultdict(int)
    big: dict[str, int] = defaultdict(int)
    for r in good:
        totals[r["user"]] += r["amount"]
        if r["amount"] >= 10:
            big[r["user"].upper()] += 1
    assert dict(query(dsn, 'SELECT "user", value FROM totals')) == totals
    assert dict(query(dsn, 'SELECT "user", value FROM big')) == big
    assert sorted(query(dsn, "SELECT reason FROM airflow_txn.quarantine WHERE committed")) == sorted(
        [("malformed record: not a JSON object of the schema",), ("missing required field 'amount'",),
         ("amount must be positive",), ("malformed record: not a JSON object of the schema",)])
    [commit] = coord.commits("orders")
    assert (commit["records_read"], commit["quarantined"]) == (len(good) + len(bad), len(bad))
    coord.close()
