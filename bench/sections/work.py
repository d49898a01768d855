"""The ``work`` section of ``bench.perf``: what processing one batch costs, outside Airflow.

The same ``spark-submit`` a processing task runs (``spark_jobs/words.py``, the benchmark DAGs'
Spark settings), timed on its own so that start-up and work can be told apart:

- CPU-seconds of the whole process tree (driver JVM, executors, Python workers) on a batch of
  N events minus the same job on an empty batch, vs the peer (``bench/sss_peer.py``) on the same
  file minus the peer on an empty directory: the work per event, start-up left out on both sides,
  every run with the JIT the process task picks for the batch (one cold batch each, the same JVM).
- The Postgres event-log source vs the landing directory: the same N events, the same job.
- The same states as plain DataFrames (``bench/words_plain.py``: a job per state over the cached
  batch) instead of ``per_record`` (one pass): what folding in one pass buys.
- The same job as a client of a warm Spark Connect server: CPU-seconds of the server and the
  client per batch (the server warmed by one batch first), vs the peer's work.
- Where the time goes: the job's own per-phase profile (wall and CPU-seconds of the process
  tree, see ``airflow_transactional.spark.profile.Phases``), printed as a note.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import shutil
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import psycopg2

from airflow_transactional.coordinator import Coordinator
from airflow_transactional.model import PlannedBatch
from airflow_transactional.sources import EventLog, LandingDirectory, PostgresLogSource
from airflow_transactional.spark import cds
from airflow_transactional.spark.job import REMOTE_ENV
from airflow_transactional.spark.profile import tree_cpu
from airflow_transactional.spark.submit import (
    provider_zip,
    spark_submit_argv,
    with_jit_for_batch,
    with_quiet_driver_logs,
)
from airflow_transactional.spec import StateSpec, TopologySpec
from bench.measure import (
    PEER_JOB,
    WORDS_JOB,
    WORDS_PLAIN_JOB,
    Report,
    Row,
    Sizes,
    median,
    run_measured,
    settle_log,
)
from dev.embedded import free_port
from dev.sparkconnect import ConnectServer

log = logging.getLogger("bench.perf")

LOG_PARTITIONS = 4


@contextmanager
def connect_server(base: Path, jars: list[str] | None = None) -> Iterator[tuple[str, psutil.Process]]:
    """A Spark Connect server as the benchmark stack runs it (with its token, and ``jars`` on its
    classpath): (its URL, its process)."""
    server = ConnectServer(free_port(), base / "spark-connect.log", jars=jars).start()
    try:
        server.wait()
        assert server.proc is not None
        yield server.url, psutil.Process(server.proc.pid)
    finally:
        server.stop()


def words_topology(name: str, source: Any, batch: int) -> TopologySpec:
    return TopologySpec(name, source, [
        StateSpec("url_counts", keys={"url": "text"}, combiner="count", table=f"{name}_url_counts"),
        StateSpec("domain_counts", keys={"domain": "text"}, combiner="count", table=f"{name}_domain_counts")],
        max_batch_size=batch)


def fill_log_from_file(dsn: str, schema: str, name: str, path: Path, *, first: int = 0, total: int | None = None,
                       settle: bool = True) -> int:
    """The file's events, one per line, into the event log ``name`` as its events ``first``.. (up to
    ``total`` events in all; setup, not measured); the number of the next event. ``settle``: the log
    made ready to read (:func:`settle_log`) -- once, after the last file of several."""
    events = EventLog(dsn, name)
    events.create(LOG_PARTITIONS)
    events.close()
    buf, n = io.StringIO(), first
    out = csv.writer(buf)
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip() and (total is None or n < total):
                out.writerow([name, n % LOG_PARTITIONS, n // LOG_PARTITIONS + 1, f"w{n}", line.rstrip("\n")])
                n += 1
    buf.seek(0)
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.copy_expert(f"COPY {schema}.log_events (log_name, partition, lsn, event_id, payload) "
                        "FROM STDIN WITH (FORMAT csv)", buf)
    conn.close()
    if settle:
        settle_log(dsn, schema, name)
    return n


class Work:
    """One batch file of ``size`` events and the three topologies that process it."""

    def __init__(self, dsn: str, schema: str, base: Path, events_file: Path, size: int, conf: dict[str, str]) -> None:
        self._prepare(dsn, schema, base, events_file, size, conf)
        (base / "empty").mkdir(parents=True, exist_ok=True)
        coord = Coordinator(dsn, schema=schema)
        try:
            for name, source in (
                    ("bench_work_landing", LandingDirectory(str(base / "landing"), max_files=1, settle_seconds=0)),
                    ("bench_work_empty", LandingDirectory(str(base / "empty"), max_files=1, settle_seconds=0)),
                    ("bench_work_log", PostgresLogSource("bench_work_log"))):
                if name == "bench_work_log":
                    n = fill_log_from_file(dsn, schema, name, events_file)
                    assert n == size, (n, size)
                coord.register(words_topology(name, source, size if name == "bench_work_log" else 1))
                txn = coord.plan(name, "bench-work")
                assert txn.empty == (name == "bench_work_empty"), (name, txn)
                self.txids[name] = txn.txid
                self.batches[name] = (txn.batch, txn.planned_records)
        finally:
            coord.close()

    def _prepare(self, dsn: str, schema: str, base: Path, events_file: Path, size: int,
                 conf: dict[str, str]) -> None:
        """What every batch of the section shares: the Spark settings and environment of its jobs,
        and the events file in ``base/landing``."""
        self.dsn, self.schema, self.base, self.size = dsn, schema, base, size
        startup = cds.current()
        self.conf = cds.with_archive(with_quiet_driver_logs(conf), startup)
        self.env = {**os.environ, "AIRFLOW_TXN_DSN": dsn, "PYSPARK_PYTHON": sys.executable,
                    "SPARK_LOCAL_IP": "127.0.0.1", **cds.env_of(startup)}
        (base / "landing").mkdir(parents=True, exist_ok=True)
        landing_file = base / "landing" / events_file.name
        if not landing_file.exists():  # a copy: the landing directory refuses hard-linked files
            shutil.copyfile(events_file, landing_file)
        self.txids: dict[str, int] = {}
        self.batches: dict[str, tuple[PlannedBatch, int]] = {}

    def ours(self, topology: str, job: Path = WORDS_JOB, jit_of: str | None = None,
             jars: Sequence[str] = ()) -> tuple[float, float, dict[str, Any]]:
        """(CPU-s, wall s, the job's result) of processing the planned batch of ``topology`` with ``job``,
        its driver's JIT chosen as the process task chooses it for the batch of ``jit_of`` (default: its own)."""
        result_file = self.base / f"{topology}.result.json"
        conf = with_jit_for_batch(self.conf, *self.batches[jit_of or topology])
        argv = [*spark_submit_argv("local[2]", conf, "--name", f"work-{topology}"),
                *(["--jars", ",".join(jars)] if jars else []), "--py-files", provider_zip(),
                str(job), "--topology", topology, "--txid", str(self.txids[topology]), "--schema", self.schema,
                "--result-file", str(result_file)]
        cpu, wall = run_measured(argv, self.env, f"work: the words job on {topology}")
        result: dict[str, Any] = json.loads(result_file.read_text())
        if topology != "bench_work_empty" and result.get("records_read") != self.size:
            raise RuntimeError(f"work: {topology} read {result.get('records_read')} events, not {self.size}")
        return cpu, wall, result

    def ours_connect(self, topology: str, url: str, server: psutil.Process) -> tuple[float, float, dict[str, Any]]:
        """(CPU-s of the server and the client, wall s, the job's result): the job as a Connect client."""
        result_file = self.base / f"{topology}.connect.result.json"
        argv = [sys.executable, str(WORDS_JOB), "--topology", topology, "--txid", str(self.txids[topology]),
                "--schema", self.schema, "--result-file", str(result_file)]
        before = tree_cpu(server)
        client_cpu, wall = run_measured(argv, {**self.env, REMOTE_ENV: url},
                                        f"work: the words job on {topology} (Connect)")
        after = tree_cpu(server)
        assert before is not None and after is not None, "the Spark Connect server is gone"
        result: dict[str, Any] = json.loads(result_file.read_text())
        return after - before + client_cpu, wall, result

    def peer(self, folder: str, trial: int) -> tuple[float, float, dict[str, Any]]:
        """(CPU-s, wall s, its result) of the Structured Streaming peer over ``folder``'s files, its
        driver's JIT the one ours gets for the landing batch: one cold batch each, the same JVM."""
        tag = f"{folder}_{trial}"
        result_file, checkpoint = self.base / f"peer-{tag}.json", self.base / f"peer-checkpoint-{tag}"
        conf = with_jit_for_batch(self.conf, *self.batches["bench_work_landing"])
        argv = [*spark_submit_argv("local[2]", conf, "--name", f"work-peer-{tag}"),
                str(PEER_JOB), str(self.base / folder), str(checkpoint), f"bench_work_peer_{tag}", str(result_file)]
        cpu, wall = run_measured(argv, self.env, f"work: the peer on {folder}")
        return cpu, wall, json.loads(result_file.read_text())


def profile_note(result: dict[str, Any]) -> str:
    """``phase wall s / CPU-s, ...`` from a job's result."""
    prof = result.get("profile", {})
    cpu = prof.get("cpu_seconds", {})
    return ", ".join(f"{phase} {secs:.1f} s / {cpu.get(phase, float('nan')):.1f} CPU-s"
                     for phase, secs in prof.get("seconds", {}).items())


def threads_note(result: dict[str, Any]) -> str:
    """``compiling (JIT) 6.2, ... CPU-s``: what the driver JVM's threads cost, by what they do, from a
    job's result (ours keeps it in its profile, the peer beside its batches)."""
    threads = result.get("profile", {}).get("jvm_threads") or result.get("jvm_threads")
    return ", ".join(f"{kind} {cpu:.1f}" for kind, cpu in threads.items()) + " CPU-s" if threads else "n/a"


def _trials(work: Work, trials: int) -> tuple[dict[str, float], dict[str, float], dict[str, dict[str, Any]]]:
    """Each run of the section, ``trials`` times in turn: median CPU-seconds and wall seconds by
    run, and each run's last result."""
    took: dict[str, list[tuple[float, float]]] = {}
    last: dict[str, dict[str, Any]] = {}
    for trial in range(trials):
        for what in ("bench_work_empty", "empty, its JIT", "bench_work_landing", "bench_work_log", "peer:empty",
                     "peer:landing", "plain:bench_work_landing"):
            if what == "empty, its JIT":  # the start-up to leave out of the 1M-event batch's: at its JIT
                cpu, wall, last[what] = work.ours("bench_work_empty", jit_of="bench_work_landing")
            elif what.startswith("peer:"):
                cpu, wall, last[what] = work.peer(what.split(":")[1], trial)
            elif what.startswith("plain:"):
                cpu, wall, last[what] = work.ours(what.split(":")[1], WORDS_PLAIN_JOB)
            else:
                cpu, wall, last[what] = work.ours(what)
            took.setdefault(what, []).append((cpu, wall))
            log.info("work: %s, trial %d: %.1f CPU-s, %.1f s wall", what, trial, cpu, wall)
    cpu_of = {k: median([c for c, _ in v]) for k, v in took.items()}
    wall_of = {k: median([w for _, w in v]) for k, v in took.items()}
    return cpu_of, wall_of, last


def _connect_trials(work: Work, base: Path, trials: int) -> tuple[float, float, dict[str, Any]]:
    """The landing batch as a client of a warm Spark Connect server: median CPU-s, wall s, the last result."""
    connect: list[tuple[float, float]] = []
    last: dict[str, Any] = {}
    with connect_server(base) as (url, server):
        for trial in range(1 + trials):  # the first warms the server's JIT
            c, w, last = work.ours_connect("bench_work_landing", url, server)
            log.info("work: Spark Connect, %s batch: %.1f CPU-s, %.1f s wall", "warm-up" if not trial else "a", c, w)
            if trial:
                connect.append((c, w))
    return median([c for c, _ in connect]), median([w for _, w in connect]), last


def run(dsn: str, schema: str, base: Path, events_file: Path, sizes: Sizes, report: Report,
               conf: dict[str, str]) -> None:
    size = sizes.work_batch
    work = Work(dsn, schema, base, events_file, size, conf)
    cpu_of, wall_of, last = _trials(work, sizes.work_trials)
    # Start-up is left out on both sides at the JIT of the measured batch: the peer's empty run has its
    # full run's JVM; ours as the process task would run it gets C1 only (a small batch), whose cheaper
    # start-up would leave the full JIT's start-up inside the "work" (reported in the note).
    ours_work = cpu_of["bench_work_landing"] - cpu_of["empty, its JIT"]
    c1_empty_work = cpu_of["bench_work_landing"] - cpu_of["bench_work_empty"]
    peer_work = cpu_of["peer:landing"] - cpu_of["peer:empty"]
    ratio = ours_work / peer_work
    report.add(Row("work", f"CPU-seconds of one {size:,}-event batch, spark-submit of words minus an empty batch at "
                           "its JIT, vs the peer minus an empty directory",
                   f"{ours_work:.1f} CPU-s", f"{peer_work:.1f} CPU-s", ratio, "<= 0.85x", ratio <= 0.85,
                   f"whole runs: ours {cpu_of['bench_work_landing']:.1f} CPU-s "
                   f"({wall_of['bench_work_landing']:.0f} s), empty {cpu_of['empty, its JIT']:.1f} CPU-s "
                   f"({wall_of['empty, its JIT']:.0f} s) at the batch's JIT, "
                   f"{cpu_of['bench_work_empty']:.1f} CPU-s as the process task runs an empty batch, C1 only "
                   f"(minus that: {c1_empty_work:.1f} CPU-s, "
                   f"{c1_empty_work / peer_work:.2f}x); peer "
                   f"{cpu_of['peer:landing']:.1f} CPU-s ({wall_of['peer:landing']:.0f} s), empty "
                   f"{cpu_of['peer:empty']:.1f} CPU-s ({wall_of['peer:empty']:.0f} s); median of {sizes.work_trials}. "
                   f"Our phases: {profile_note(last['bench_work_landing'])}. The driver JVM's threads, whole run "
                   f"(last trial): ours {threads_note(last['bench_work_landing'])}; the peer "
                   f"{threads_note(last['peer:landing'])}; on an empty batch ours "
                   f"{threads_note(last['empty, its JIT'])}, the peer {threads_note(last['peer:empty'])}"))
    plain_work = cpu_of["plain:bench_work_landing"] - cpu_of["empty, its JIT"]
    report.add(Row("work", f"CPU-seconds of one {size:,}-event batch, spark-submit of words minus an empty batch: its "
                           "states per record (one pass) vs as plain DataFrames (a job per state, the batch cached)",
                   f"{ours_work:.1f} CPU-s", f"{plain_work:.1f} CPU-s", ours_work / plain_work, "", None,
                   f"wall {wall_of['bench_work_landing']:.1f} s vs {wall_of['plain:bench_work_landing']:.1f} s; plain "
                   f"DataFrames' phases: {profile_note(last['plain:bench_work_landing'])}"))
    c_cpu, c_wall, last["connect"] = _connect_trials(work, base, sizes.work_trials)
    report.add(Row("work", f"CPU-seconds of one {size:,}-event batch, words as a client of a warm Spark Connect "
                           "server (server + client), vs the peer minus an empty directory",
                   f"{c_cpu:.1f} CPU-s", f"{peer_work:.1f} CPU-s", c_cpu / peer_work, "", None,
                   f"{c_wall:.1f} s wall per batch; phases (wall): "
                   + ", ".join(f"{k} {v:.1f} s" for k, v in last["connect"].get("profile", {})
                               .get("seconds", {}).items())))
    rate = {k: size / wall_of[k] for k in ("bench_work_landing", "bench_work_log")}
    log_ratio = rate["bench_work_log"] / rate["bench_work_landing"]
    report.add(Row("work", f"events/s of one {size:,}-event batch, Postgres event-log source vs landing directory "
                           "(spark-submit of words)",
                   f"{rate['bench_work_log']:,.0f} ev/s", f"{rate['bench_work_landing']:,.0f} ev/s", log_ratio,
                   ">= 0.8x", log_ratio >= 0.8,
                   f"log: {cpu_of['bench_work_log']:.1f} CPU-s; phases: {profile_note(last['bench_work_log'])}"))
