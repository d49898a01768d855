"""The ``startup`` section of ``bench.perf``: one ``spark-submit`` of ``words`` on a small batch,
its driver JVM started from the class-data-sharing archive vs without."""

from __future__ import annotations

import logging
import os
import random
import sys

from airflow_transactional.coordinator import Coordinator
from airflow_transactional.sources import EventLog, PostgresLogSource
from airflow_transactional.spark import cds
from airflow_transactional.spark.submit import LOCAL_SPARK_CONF, provider_zip, spark_submit_argv, with_quiet_driver_logs
from airflow_transactional.spec import StateSpec, TopologySpec
from bench.measure import SCHEMA, WORDS_JOB, Report, Row, Sizes, event_payload, median, run_measured

log = logging.getLogger("bench.perf")


def run(dsn: str, sizes: Sizes, report: Report) -> None:
    """One ``spark-submit`` of the words job on a small planned batch, its driver JVM started from
    the class-data-sharing archive vs without (``LOCAL_SPARK_CONF`` both ways). Measured in
    CPU-seconds of the whole process tree (driver JVM, job Python, workers) and wall time; the
    trials alternate which goes first."""
    startup = cds.build()  # found at once when `airflow-txn spark-cds` built it
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
            conf = cds.with_archive(with_quiet_driver_logs(LOCAL_SPARK_CONF), startup if with_archive else None)
            argv = [*spark_submit_argv("local[2]", conf), "--py-files", provider_zip(), str(WORDS_JOB),
                    "--topology", name, "--txid", str(txid), "--schema", SCHEMA]
            # Both from the same Spark home: the row compares the archive, not where the jars lie.
            cpu, wall = run_measured(argv, {**env, **startup.env()}, "startup: the words job")
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
