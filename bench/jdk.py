"""``python -m bench.jdk``: which JVM, and which start-up cache, one ``spark-submit`` batch pays least on.

A processing task's driver JVM starts cold for every batch. This measures the ``work`` section's
job (``spark_jobs/words.py`` on one planned batch of N events, and on an empty batch: start-up
alone) on each JVM this machine has, in turns, CPU-seconds of the whole process tree:

- ``java17-cds``: Java 17 with the provider's class-data-sharing archive (what the process task
  runs today, :mod:`airflow_transactional.spark.cds`);
- ``java25``: Java 25 with its own default CDS only;
- ``java25-aot``: Java 25 with an ahead-of-time cache (JEP 483 classes loaded and linked, JEP 515
  method profiles) trained by one run of this very batch (``-XX:AOTCacheOutput``, JEP 514), then
  used by the measured runs (``-XX:AOTCache``) -- the most a trained cache can give this job.

Each row is a variant against ``java17-cds``, the same batch, trial by trial in turn; a variant
pays when it saves more than this box's noise (:data:`PAYS`).

    python -m bench.jdk [--events N] [--trials K] [--json docs/results/bench-jdk.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

from bench.measure import (
    BIG_BATCH_CONF,
    SCHEMA,
    Report,
    Row,
    Sizes,
    dirty_result,
    git_commit,
    machine,
    median,
    write_events_file,
)
from bench.sections.work import Work
from dev.embedded import EmbeddedPostgres

log = logging.getLogger("bench.jdk")
JAVA_OPTIONS = "spark.driver.extraJavaOptions"
#: A variant pays when it saves more than this box's noise between two runs (about a tenth).
PAYS = 0.9
#: Where a Java 25 is found when JAVA25_HOME is not set (Temurin's Debian package).
JAVA25 = Path(os.environ.get("JAVA25_HOME", "/usr/lib/jvm/temurin-25-jdk-amd64"))


def _without_cds(options: str) -> str:
    return " ".join(x for x in options.split() if "SharedArchiveFile" not in x and "-Xshare" not in x)


def variants(work: Work, aot: Path) -> dict[str, Callable[[], tuple[dict[str, str], dict[str, str]]]]:
    """Each variant's (Spark settings, environment) of its driver, by name."""
    j25_env = {**work.env, "JAVA_HOME": str(JAVA25), "PATH": f"{JAVA25 / 'bin'}:{work.env['PATH']}"}
    plain = {**work.conf, JAVA_OPTIONS: _without_cds(work.conf.get(JAVA_OPTIONS, ""))}

    def with_aot() -> tuple[dict[str, str], dict[str, str]]:
        if not aot.exists():  # trained once, on the batch the rows measure
            work.conf, work.env = {**plain, JAVA_OPTIONS: f"{plain[JAVA_OPTIONS]} -XX:AOTCacheOutput={aot}"}, j25_env
            work.ours("bench_work_landing")
            log.info("the AOT cache: %.0f MB", aot.stat().st_size / 1e6)
        return {**plain, JAVA_OPTIONS: f"{plain[JAVA_OPTIONS]} -XX:AOTCache={aot}"}, j25_env

    base = (dict(work.conf), dict(work.env))
    return {"java17-cds": lambda: base, "java25": lambda: (plain, j25_env), "java25-aot": with_aot}


def measure(work: Work, chosen: dict[str, Callable[[], tuple[dict[str, str], dict[str, str]]]],
            trials: int) -> dict[str, dict[str, float]]:
    """Median CPU-seconds per variant of the batch (``batch``) and of the empty batch (``empty``)."""
    took: dict[str, dict[str, list[float]]] = {name: {"batch": [], "empty": []} for name in chosen}
    for trial in range(trials):
        for name, setting in chosen.items():
            work.conf, work.env = setting()
            for what, topology in (("batch", "bench_work_landing"), ("empty", "bench_work_empty")):
                cpu, wall, _ = work.ours(topology)
                took[name][what].append(cpu)
                log.info("%s, %s, trial %d: %.1f CPU-s, %.1f s wall", name, what, trial, cpu, wall)
    return {name: {what: median(v) for what, v in by.items()} for name, by in took.items()}


def rows(cpu: dict[str, dict[str, float]], events: int) -> list[Row]:
    base = cpu["java17-cds"]
    out = []
    for name, mine in cpu.items():
        if name == "java17-cds":
            continue
        out.append(Row("jdk", f"CPU-seconds of one {events:,}-event batch, spark-submit of words, {name} vs "
                       "java17-cds", f"{mine['batch']:.1f} CPU-s", f"{base['batch']:.1f} CPU-s",
                       mine["batch"] / base["batch"], "<= 0.9x", mine["batch"] <= PAYS * base["batch"]))
        out.append(Row("jdk", f"CPU-seconds of an empty batch (start-up), {name} vs java17-cds",
                       f"{mine['empty']:.1f} CPU-s", f"{base['empty']:.1f} CPU-s", mine["empty"] / base["empty"],
                       "<= 0.9x", mine["empty"] <= PAYS * base["empty"]))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.jdk", description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000, help="the batch's events (default 1,000,000)")
    parser.add_argument("--trials", type=int, default=3, help="runs of each variant, in turns (default 3)")
    parser.add_argument("--json", help="also write the report here")
    args = parser.parse_args(argv)
    if dirty := dirty_result(args.json):
        parser.error(dirty)
    if not (JAVA25 / "bin" / "java").exists():
        parser.error(f"no Java 25 at {JAVA25}: install one (Temurin 25.0.3 or later) and set JAVA25_HOME")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    report = Report(started=datetime.now(UTC).isoformat(timespec="seconds"), machine=machine(), quick=False,
                    commit=git_commit(),
                    command=shlex.join(["python", "-m", "bench.jdk", *(sys.argv[1:] if argv is None else argv)]))
    began = time.monotonic()
    base = Path(tempfile.mkdtemp(prefix="txn-bench-jdk-"))
    pg = EmbeddedPostgres(base / "pg").start()
    try:
        events = base / "events.jsonl"
        write_events_file(events, args.events, seed=args.events, distinct_urls=Sizes().distinct_urls)
        work = Work(pg.create_database("bench_jdk"), SCHEMA, base / "work", events, args.events,
                    dict(BIG_BATCH_CONF))
        cpu = measure(work, variants(work, base / "words.aot"), args.trials)
    finally:
        pg.stop()
        shutil.rmtree(base, ignore_errors=True)
    for row in rows(cpu, args.events):
        report.add(row)
    report.rows[0].note = (f"median of {args.trials}; the AOT cache trained by one run of the same batch; "
                           f"Java 25 at {JAVA25}")
    report.wall_seconds = time.monotonic() - began
    print(report.table())
    if args.json:
        Path(args.json).write_text(json.dumps(asdict(report), indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
