"""The ``evolution`` section of ``bench.perf``, on the state store and ``spark-submit``: building a
state added to a running topology from its history (``core/evolution.py``, the engine's
``StateBuild``: one spark-submit of the topology's own job folding every committed txid, in chunks,
then the switch) vs rebuilding the whole topology from the same history (``Rebuild``: the same job
over the same txids, every state, then the swap) -- the words topology, its history committed as
txids of 1M events by the words job."""

from __future__ import annotations

import csv
import io
import logging
import os
import resource
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg2

from airflow_transactional.coordinator import Coordinator, Rebuild, StateBuild
from airflow_transactional.sources import EventLog, PostgresLogSource
from airflow_transactional.spark import cds
from airflow_transactional.spark.recompute import recompute
from airflow_transactional.spark.submit import provider_zip, spark_submit_argv, with_quiet_driver_logs
from airflow_transactional.spec import SparkJob, StateSpec
from bench.measure import WORDS_JOB, Report, Row, Sizes, run_measured, settle_log
from bench.sections.work import LOG_PARTITIONS, words_topology

log = logging.getLogger("bench.perf")

NAME = "bench_evolve"
USERS = StateSpec("user_counts", keys={"user": "text"}, combiner="count", table=f"{NAME}_user_counts")
#: The words job once its DAG file adds ``user_counts``: the same transform, and each event's user.
GROWN_JOB = f"""
import sys
sys.path.insert(0, {str(WORDS_JOB.parent)!r})
from pyspark.sql import functions as F
from airflow_transactional.spark_job import per_record, run
from words import transform as words

def transform(tweets):
    return {{**words(tweets), "user_counts": per_record(tweets, {{"user": F.col("user")}})}}

if __name__ == "__main__":
    raise SystemExit(run(transform, schema="url string, user string, ts string", required=["url"]))
"""


def _fill(dsn: str, schema: str, files: list[Path], total: int) -> None:
    """``total`` events into the log, the files' lines taken in turn (each with an id of its own)."""
    events = EventLog(dsn, NAME)
    events.create(LOG_PARTITIONS)
    events.close()
    n = 0
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        while n < total:
            for path in files:
                buf = io.StringIO()
                out = csv.writer(buf)
                with open(path, encoding="utf-8") as fh:
                    for line in fh:
                        if line.strip() and n < total:
                            out.writerow([NAME, n % LOG_PARTITIONS, n // LOG_PARTITIONS + 1, f"v{n}", line.rstrip()])
                            n += 1
                buf.seek(0)
                cur.copy_expert(f"COPY {schema}.log_events (log_name, partition, lsn, event_id, payload) "
                                "FROM STDIN WITH (FORMAT csv)", buf)
                if n >= total:
                    break
    conn.close()
    settle_log(dsn, schema, NAME)


def _commit_history(coord: Coordinator, dsn: str, txids: int) -> None:
    """The history: ``txids`` txids of the words job under spark-submit, each committed."""
    startup = cds.current()
    conf = cds.with_archive(with_quiet_driver_logs({"spark.ui.enabled": "false"}), startup)
    env = {**os.environ, "AIRFLOW_TXN_DSN": dsn, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1",
           **cds.env_of(startup)}
    for i in range(txids):
        txid = coord.plan(NAME, f"h{i}").txid
        argv = [*spark_submit_argv("local[2]", conf, "--name", f"evolution-{txid}"), "--py-files", provider_zip(),
                str(WORDS_JOB), "--topology", NAME, "--txid", str(txid), "--schema", coord.schema]
        run_measured(argv, env, f"evolution: the words job on txid {txid}")
        assert coord.commit(NAME, txid).committed


def _measured(coord: Coordinator, dsn: str, kind: Any, records: int) -> tuple[float, float, dict[str, Any]]:
    """(CPU-s of its spark-submit, wall s, its summary) of one recompute of the topology."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    before, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    result = recompute(dsn, coord.schema, coord.spec(NAME), kind, master="local[2]", conf=[], records=records)
    wall, after = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime), wall, result


def run(dsn: str, schema: str, base: Path, files: list[Path], sizes: Sizes, report: Report) -> None:
    total, per_txid = sizes.evolution_events, sizes.work_batch
    base.mkdir(parents=True, exist_ok=True)
    log.info("evolution: %d events of history in txids of %d", total, per_txid)
    _fill(dsn, schema, files, total)
    coord = Coordinator(dsn, schema=schema)
    try:
        spec = replace(words_topology(NAME, PostgresLogSource(NAME), per_txid), job=SparkJob(str(WORDS_JOB)))
        coord.register(spec)
        _commit_history(coord, dsn, -(-total // per_txid))
        rebuild_cpu, rebuild_wall, rebuilt = _measured(coord, dsn, Rebuild(NAME), total)
        grown = base / "grown_words.py"
        grown.write_text(GROWN_JOB)
        coord.register(replace(spec, states=[*spec.states, USERS], job=SparkJob(str(grown))))
        build_cpu, build_wall, built = _measured(coord, dsn, StateBuild(NAME), total)
        with coord.store.db.transaction() as cur:  # every event counted once by the new state
            cur.execute(f'SELECT coalesce(sum(value), 0) FROM "{USERS.table}"')
            counted = int(cur.fetchone()[0])
    finally:
        coord.close()
    assert counted == total, f"the built state counted {counted} events of {total}"
    report.add(Row("evolution", f"building a state added to the words topology from {total:,} events of history "
                                f"({rebuilt['rebuilt_at_txid']} txids) vs rebuilding the topology (wall s; CPU-s)",
                   f"{build_wall:.1f} s ({build_cpu:.1f} CPU-s)", f"{rebuild_wall:.1f} s ({rebuild_cpu:.1f} CPU-s)",
                   build_wall / rebuild_wall, "<= 1.0x", build_wall / rebuild_wall <= 1.0,
                   note=f"one new state folded in {built['built_at_txid']} txids' chunks and switched in vs every "
                        "state recomputed and swapped in; each one spark-submit local[2]"))
