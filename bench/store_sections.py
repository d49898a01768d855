"""The sections of ``bench.perf`` measured on the state store and one ``spark-submit``, no Airflow:
``commit`` (our commit vs a hand-written bulk upsert; a large state vs a small one), ``plan`` (a
large log vs a small one) and ``startup`` (the driver JVM from the class-data-sharing archive vs
without)."""

from __future__ import annotations

import io
import logging
import os
import random
import sys
import time

import psycopg2

from airflow_transactional.coordinator import Coordinator
from airflow_transactional.core import attempts
from airflow_transactional.sources import EventLog, PostgresLogSource
from airflow_transactional.spark import cds
from airflow_transactional.spark.submit import LOCAL_SPARK_CONF, provider_zip, spark_submit_argv, with_quiet_driver_logs
from airflow_transactional.spec import StateSpec, TopologySpec
from bench.measure import SCHEMA, Report, Row, Sizes, event_payload, execute, md5, median
from bench.work import WORDS_JOB, run_measured, settle_log

log = logging.getLogger("bench.perf")


def commit_rows(existing: int, prefix: str, n: int, rng: random.Random) -> list[tuple[str, int]]:
    """``n`` delta rows: half update keys already in the state, half are new keys."""
    updates = [(md5(f"s{i}"), 1) for i in rng.sample(range(1, existing + 1), min(existing, n // 2))]
    return updates + [(md5(f"{prefix}-{j}"), 1) for j in range(n - len(updates))]


def commit_trials(coord: Coordinator, dsn: str, topo: str, target: str, n_state: int, sizes: Sizes,
                  rng: random.Random) -> tuple[list[float], list[float]]:
    """Seconds per commit of ours and of the hand-written upsert, trial by trial."""
    ours: list[float] = []
    base: list[float] = []
    committed = [0]

    def ours_once(trial: int) -> float:
        txn = coord.plan(topo, f"trial-{trial}")
        attempt, txn = attempts.begin_attempt(coord.store, topo, txn.txid)
        n = coord.stage(attempt, "counts", commit_rows(n_state, f"o{trial}", sizes.commit_delta, rng))
        attempts.finish_attempt(coord.store, attempt, {"counts": n}, records_read=1)
        t0 = time.perf_counter()
        coord.commit(topo, txn.txid)
        took = time.perf_counter() - t0
        committed.append(txn.txid)
        return took

    def baseline_once(trial: int) -> float:
        """The physical limit: as many rows, of the same shape, already in Postgres, upserted
        into the same table by one hand-written statement (stamped with a committed txid)."""
        buf = io.StringIO("".join(f"{k}\t{v}\n" for k, v in
                                  commit_rows(n_state, f"b{trial}", sizes.commit_delta, rng)))
        conn = psycopg2.connect(dsn)
        try:
            with conn, conn.cursor() as cur:
                cur.execute("DROP TABLE IF EXISTS bench_delta")
                cur.execute("CREATE TABLE bench_delta (k text, value bigint)")
                cur.copy_expert("COPY bench_delta FROM STDIN", buf)
                cur.execute("ANALYZE bench_delta")
            t0 = time.perf_counter()
            with conn, conn.cursor() as cur:
                cur.execute(f"INSERT INTO {target} AS t (k, value, txid) SELECT k, value, %s FROM bench_delta "
                            "ON CONFLICT (k) DO UPDATE SET value = t.value + EXCLUDED.value, "
                            "txid = EXCLUDED.txid", (committed[-1],))
            return time.perf_counter() - t0
        finally:
            conn.close()

    # Trial 0 warms the caches for both and is not counted; the order alternates.
    for trial in range(sizes.commit_trials + 1):
        first, second = (ours_once, baseline_once) if trial % 2 == 0 else (baseline_once, ours_once)
        a, b = first(trial), second(trial)
        if trial:
            ours.append(a if first is ours_once else b)
            base.append(b if first is ours_once else a)
    return ours, base


def bench_commit(dsn: str, sizes: Sizes, report: Report) -> None:
    coord = Coordinator(dsn)
    events = EventLog(dsn, "bench_commit")
    events.create(1)
    events.append([(f"c{i}", "{}") for i in range(4 * sizes.commit_trials)])
    rng = random.Random(3)
    medians: dict[str, tuple[float, float]] = {}
    try:
        for label, n_state in (("small", sizes.commit_small_state), ("large", sizes.commit_large_state)):
            topo = f"bench_commit_{label}"
            state = StateSpec("counts", keys={"k": "text"}, combiner="count", table=topo)
            coord.register(TopologySpec(topo, PostgresLogSource("bench_commit"), [state],
                                        max_in_flight=1000, max_batch_size=1))
            target = ".".join(f'"{part}"' for part in state.schema_and_table)
            log.info("commit: filling %s with %d rows", target, n_state)
            execute(dsn, f"TRUNCATE {target}",
                    f"INSERT INTO {target} (k, value, txid) SELECT md5('s' || i), 1, 0 "
                    f"FROM generate_series(1, {n_state}) i")
            execute(dsn, f"VACUUM ANALYZE {target}", autocommit=True)
            ours, base = commit_trials(coord, dsn, topo, target, n_state, sizes, rng)
            medians[label] = (median(ours), median(base))
            o, b = medians[label]
            report.add(Row("commit", f"{sizes.commit_delta:,} deltas into a {n_state:,}-row state vs bulk upsert",
                           f"{o:.3f} s", f"{b:.3f} s", b / o, ">= 0.8x", b / o >= 0.8))
        small, large = medians["small"][0], medians["large"][0]
        report.add(Row("commit", f"commit time, state {sizes.commit_large_state:,} vs "
                                 f"{sizes.commit_small_state:,} rows",
                       f"{large:.3f} s", f"{small:.3f} s", large / small, "<= 1.3", large / small <= 1.3))
    finally:
        coord.close()
        events.close()


def fill_log(dsn: str, name: str, n: int, partitions: int = 4) -> None:
    """Put ``n`` events into a log directly (setup, not what is measured), in chunks."""
    EventLog(dsn, name).create(partitions)
    chunk = 2_000_000
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        execute(dsn, f"INSERT INTO {SCHEMA}.log_events (log_name, partition, lsn, event_id, payload) "
                     f"SELECT '{name}', i % {partitions}, i / {partitions} + 1, 'e' || i, "
                     "'{\"url\": \"https://example.com/p/' || (i % 1000) || '\"}' "
                     f"FROM generate_series({lo}, {hi - 1}) i")
    settle_log(dsn, SCHEMA, name)


def bench_plan(dsn: str, sizes: Sizes, report: Report) -> None:
    coord = Coordinator(dsn)
    times: dict[int, float] = {}
    try:
        for n in (sizes.plan_small_log, sizes.plan_large_log):
            name = f"bench_plan_{n}"
            log.info("plan: filling log %s with %d events", name, n)
            fill_log(dsn, name, n)
            topo = f"bench_plan_{n}"
            coord.register(TopologySpec(topo, PostgresLogSource(name),
                                        [StateSpec("c", keys={"k": "text"}, combiner="count", table=topo)],
                                        max_in_flight=10_000, max_batch_size=10_000))
            took = []
            for i in range(sizes.plan_trials):
                t0 = time.perf_counter()
                txn = coord.plan(topo, f"run-{i}")
                took.append(time.perf_counter() - t0)
                assert txn.planned_records == 10_000, txn
            times[n] = median(took)
            log.info("plan: %s-event log: %s ms", f"{n:,}", " ".join(f"{t * 1000:.1f}" for t in took))
        small, large = times[sizes.plan_small_log], times[sizes.plan_large_log]
        report.add(Row("plan", f"plan a 10k batch, log of {sizes.plan_large_log:,} vs {sizes.plan_small_log:,} events",
                       f"{large * 1000:.1f} ms", f"{small * 1000:.1f} ms", large / small, "<= 1.5",
                       large / small <= 1.5))
    finally:
        coord.close()


def bench_startup(dsn: str, sizes: Sizes, report: Report) -> None:
    """One ``spark-submit`` of the words job on a small planned batch, its driver JVM started from
    the class-data-sharing archive vs without (``LOCAL_SPARK_CONF`` both ways). Measured in
    CPU-seconds of the whole process tree (driver JVM, job Python, workers) and wall time; the
    trials alternate which goes first."""
    archive = cds.build()  # found at once when `airflow-txn spark-cds` built it
    name = "bench_startup"
    events = EventLog(dsn, name)
    events.create(4)
    rng = random.Random(5)
    events.append([(f"s{i}", event_payload(rng, sizes.distinct_urls)) for i in range(sizes.startup_batch)])
    events.close()
    coord = Coordinator(dsn)
    try:
        coord.register(TopologySpec(name, PostgresLogSource(name), [
            StateSpec("url_counts", keys={"url": "text"}, combiner="count", table=f"{name}_url_counts"),
            StateSpec("domain_counts", keys={"domain": "text"}, combiner="count", table=f"{name}_domain_counts")],
            max_batch_size=sizes.startup_batch))
        txid = coord.plan(name, "run-1").txid
    finally:
        coord.close()
    env = {**os.environ, "AIRFLOW_TXN_DSN": dsn, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    took: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    for trial in range(sizes.startup_trials):
        for with_archive in ((True, False) if trial % 2 else (False, True)):
            conf = cds.with_archive(with_quiet_driver_logs(LOCAL_SPARK_CONF), archive if with_archive else None)
            argv = [*spark_submit_argv("local[2]", conf), "--py-files", provider_zip(), str(WORDS_JOB),
                    "--topology", name, "--txid", str(txid), "--schema", SCHEMA]
            cpu, wall = run_measured(argv, env, "startup: the words job")
            took[with_archive].append((cpu, wall))
            log.info("startup: %s the archive: %.1f CPU-s, %.1f s wall", "with" if with_archive else "without",
                     cpu, wall)
    (cpu_on, wall_on), (cpu_off, wall_off) = ((median([c for c, _ in took[k]]), median([w for _, w in took[k]]))
                                              for k in (True, False))
    report.add(Row("startup", f"spark-submit of words, {sizes.startup_batch:,}-event batch: driver JVM from the "
                              "class-data-sharing archive vs without (CPU-seconds)",
                   f"{cpu_on:.1f} CPU-s", f"{cpu_off:.1f} CPU-s", cpu_on / cpu_off,
                   note=f"wall {wall_on:.1f} s with the archive, {wall_off:.1f} s without "
                        f"({wall_on / wall_off:.2f}x); {sizes.startup_trials} trials each, alternating"))
