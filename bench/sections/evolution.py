"""The ``evolution`` section of ``bench.perf``, on the state store and ``spark-submit``: building a
state added to a running topology from its history (``core/evolution.py``, the engine's
``StateBuild``: one spark-submit of the topology's own job folding every committed txid, in chunks,
then the switch) vs rebuilding the whole topology from the same history (``Rebuild``: the same job
over the same txids, every state, then the swap) -- the words topology, its history committed as
txids of 1M events by the words job."""

from __future__ import annotations

import logging
import os
import resource
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from airflow_transactional.coordinator import Coordinator, Rebuild, StateBuild
from airflow_transactional.sources import PostgresLogSource
from airflow_transactional.spark import cds
from airflow_transactional.spark.recompute import recompute
from airflow_transactional.spark.submit import provider_zip, spark_submit_argv, with_quiet_driver_logs
from airflow_transactional.spec import SparkJob, StateSpec
from bench.measure import WORDS_JOB, Report, Row, Sizes, median, run_measured, settle_log
from bench.sections.work import fill_log_from_file, words_topology

log = logging.getLogger("bench.perf")

NAME = "bench_evolve"
USERS = StateSpec("user_counts", keys={"user": "text"}, combiner="count", table=f"{NAME}_user_counts")
USER_DOMAINS = StateSpec("user_domains", keys={"user": "text", "domain": "text"}, combiner="count",
                         table=f"{NAME}_user_domains")
#: The words job once its DAG file adds states: the same transform, and ``{extra}`` (name: keys).
GROWN_JOB = """
import sys
sys.path.insert(0, {jobs!r})
from pyspark.sql import functions as F
from airflow_transactional.spark_job import per_record, run
from words import domain, transform as words

def transform(tweets):
    return {{**words(tweets), {extra}}}

if __name__ == "__main__":
    raise SystemExit(run(transform, schema="url string, user string, ts string", required=["url"]))
"""
GROWN = {"user_counts": 'per_record(tweets, {"user": F.col("user")})',
         "user_domains": 'per_record(tweets, {"user": F.col("user"), "domain": domain(F.col("url"))})'}
#: The live topology's batches while a state is built, and without: how many at most, of how many events.
LIVE_BATCHES, LIVE_BATCH = 6, 200_000


def _grown(base: Path, states: list[str]) -> str:
    path = base / f"grown_{len(states)}.py"
    path.write_text(GROWN_JOB.format(jobs=str(WORDS_JOB.parent),
                                     extra=", ".join(f"{n!r}: {GROWN[n]}" for n in states)))
    return str(path)


def _fill(dsn: str, schema: str, files: list[Path], first: int, total: int) -> None:
    """Events ``first``..``total - 1`` into the log, the files' lines taken in turn."""
    n = first
    while n < total:
        for path in files:
            n = fill_log_from_file(dsn, schema, NAME, path, first=n, total=total, settle=False)
            if n >= total:
                break
    settle_log(dsn, schema, NAME)


def _batch(coord: Coordinator, dsn: str, run_key: str) -> tuple[float, float]:
    """Plan, process (the words job under spark-submit) and commit the next txid; (its seconds, the commit's)."""
    startup = cds.current()
    conf = cds.with_archive(with_quiet_driver_logs({"spark.ui.enabled": "false"}), startup)
    env = {**os.environ, "AIRFLOW_TXN_DSN": dsn, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1",
           **cds.env_of(startup)}
    t0 = time.perf_counter()
    txid = coord.plan(NAME, run_key).txid
    argv = [*spark_submit_argv("local[2]", conf, "--name", f"evolution-{txid}"), "--py-files", provider_zip(),
            str(coord.spec(NAME).job.application), "--topology", NAME, "--txid", str(txid),  # type: ignore[union-attr]
            "--schema", coord.schema]
    run_measured(argv, env, f"evolution: the words job on txid {txid}")
    t1 = time.perf_counter()
    assert coord.commit(NAME, txid).committed
    return time.perf_counter() - t0, time.perf_counter() - t1


def _live(coord: Coordinator, dsn: str, schema: str, files: list[Path], first: int, label: str,
          going: Callable[[], bool]) -> tuple[float, list[float], int]:
    """The live topology's batches of LIVE_BATCH new events while ``going()``, LIVE_BATCHES at most:
    (events/s, each commit's seconds, the events it appended)."""
    seconds, commits, n = 0.0, [], first
    for i in range(LIVE_BATCHES):
        if not going():
            break
        _fill(dsn, schema, files, n, n + LIVE_BATCH)
        took, commit = _batch(coord, dsn, f"{label}-{i}")
        seconds, n = seconds + took, n + LIVE_BATCH
        commits.append(commit)
    return (n - first) / seconds if seconds else 0.0, commits, n


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
    _fill(dsn, schema, files, 0, total)
    coord = Coordinator(dsn, schema=schema)
    try:
        spec = replace(words_topology(NAME, PostgresLogSource(NAME), per_txid), job=SparkJob(str(WORDS_JOB)))
        coord.register(spec)
        for i in range(-(-total // per_txid)):
            _batch(coord, dsn, f"h{i}")
        rebuild_cpu, rebuild_wall, rebuilt = _measured(coord, dsn, Rebuild(NAME), total)
        coord.register(replace(spec, states=[*spec.states, USERS], job=SparkJob(_grown(base, ["user_counts"]))))
        build_cpu, build_wall, built = _measured(coord, dsn, StateBuild(NAME), total)
        counted = _sum(coord, USERS)
        # The live topology without a build, then while a second state is built.
        alone, alone_commits, n = _live(coord, dsn, schema, files, total, "alone", lambda: True)
        coord.register(replace(spec, states=[*spec.states, USERS, USER_DOMAINS],
                               job=SparkJob(_grown(base, ["user_counts", "user_domains"]))))
        failed: list[BaseException] = []
        building = threading.Thread(target=_build_beside, args=(dsn, schema, n, failed))
        building.start()
        while building.is_alive() and coord.evolution(NAME)["building_through_txid"] is None:
            time.sleep(0.2)  # the build has begun (M fixed) before the first live batch
        during, during_commits, n = _live(coord, dsn, schema, files, n, "during", building.is_alive)
        building.join()
        if failed:
            raise failed[0]
        if not during_commits:
            raise RuntimeError("the build ended before a batch of the live topology ran beside it: a larger history")
        assert _sum(coord, USER_DOMAINS) == n, "the second build did not count every event once"
    finally:
        coord.close()
    assert counted == total, f"the built state counted {counted} events of {total}"
    report.add(Row("evolution", f"building a state added to the words topology from {total:,} events of history "
                                f"({rebuilt['rebuilt_at_txid']} txids) vs rebuilding the topology (wall s; CPU-s)",
                   f"{build_wall:.1f} s ({build_cpu:.1f} CPU-s)", f"{rebuild_wall:.1f} s ({rebuild_cpu:.1f} CPU-s)",
                   build_wall / rebuild_wall, "<= 1.0x", build_wall / rebuild_wall <= 1.0,
                   note=f"one new state folded in {built['built_at_txid']} txids' chunks and switched in vs every "
                        "state recomputed and swapped in; each one spark-submit local[2]"))
    report.add(Row("evolution", f"the live topology's events/s while a state is built vs without "
                                f"({len(during_commits)} and {len(alone_commits)} batches of {LIVE_BATCH:,}, "
                                "spark-submit each)",
                   f"{during:,.0f} ev/s", f"{alone:,.0f} ev/s", during / alone, ">= 0.8x", during / alone >= 0.8,
                   note="the build's spark-submit and the batches' share the machine's cores; each batch also "
                        "folds and stages the state being built"))
    p50_during, p50_alone = median(during_commits), median(alone_commits)
    report.add(Row("evolution", "the live topology's p50 commit latency while a state is built vs without",
                   f"{p50_during * 1000:.0f} ms", f"{p50_alone * 1000:.0f} ms", p50_during / p50_alone, "<= 1.2x",
                   p50_during / p50_alone <= 1.2))


def _build_beside(dsn: str, schema: str, records: int, failed: list[BaseException]) -> None:
    """The second build, in a thread of its own (what failed in it kept for the run to raise)."""
    coord = Coordinator(dsn, schema=schema)
    try:
        _measured(coord, dsn, StateBuild(NAME), records)
    except BaseException as exc:
        failed.append(exc)
    finally:
        coord.close()


def _sum(coord: Coordinator, state: StateSpec) -> int:
    with coord.store.db.transaction() as cur:
        cur.execute(f'SELECT coalesce(sum(value), 0) FROM "{state.table}"')
        return int(cur.fetchone()[0])
