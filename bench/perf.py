"""Benchmarks against what users would pick instead, measured side by side in one run.

    python -m bench.perf [--quick] [--dir DIR] [--json FILE] [--plot FILE] [--only SECTION,...]

Everything runs on this machine in this one invocation -- one embedded Postgres, one Airflow
(api-server, scheduler, dag-processor, triggerer; LocalExecutor), real ``spark-submit`` --
and every result is a ratio against a baseline measured in the same run:

- ``commit``: committing D staged deltas vs a hand-written bulk ``INSERT ... ON CONFLICT`` of
  rows of the same shape into the same table; and commit time on a large vs a small state.
- ``decisions``: a commit that decides N requests per key in source order vs a plain commit of
  their per-key deltas (``bench/decide.py``).
- ``plan``: planning a batch on a large vs a small event log.
- ``peer``: events/s of the provider (Airflow runs of a landing topology) vs Spark Structured
  Streaming with an exactly-once ``foreachBatch`` sink (``bench/sss_peer.py``), the same files,
  the same batch size, the same aggregates; both results are compared row by row.
- ``work``: CPU-seconds of the processing job on one batch minus an empty batch, vs the peer
  minus an empty directory; the event-log source vs the landing directory; the job's per-phase
  profile (``bench/work.py``).
- ``overhead``: an empty transaction (run start to committed) vs a no-op 3-task DAG run.
- ``pipelining``: N transactions of ``words`` with ``max_in_flight=3`` vs a serial run.
- ``waits``: commits waiting for txid-1 deferred to the triggerer vs sleeping in workers: worker
  slots they hold, and commit latency after the predecessor commits (``bench/waits.py``).
- ``latency``: the payments pipeline end to end -- a request's append to its outcome in stage
  2's state, p50 / p99 at a steady rate, on an Airflow of its own (``bench/latency.py``).
- peak memory (RSS of the spark-submit process tree) of processing tasks and of the peer.

It prints the table and writes a PNG plot of the ratios against their targets.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import logging
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psutil
import psycopg2

from airflow_transactional import spark_cds
from airflow_transactional.coordinator import Coordinator
from airflow_transactional.dag import LOCAL_SPARK_CONF
from airflow_transactional.identifiers import qualified_table
from airflow_transactional.sources import EventLog, PostgresLogSource
from airflow_transactional.spark_job import provider_zip, with_quiet_driver_logs
from airflow_transactional.spec import DEFAULT_STATE_SCHEMA, StateSpec, TopologySpec
from airflow_transactional.store.migrations import DEFAULT_SCHEMA
from airflow_transactional.submit import SPARK_CONNECT_SERVER, spark_submit_argv
from bench import waits
from bench.decide import bench_decisions
from bench.latency import bench_latency
from bench.work import PEER_JOB, REPO, WORDS_JOB, bench_work, run_measured, settle_log
from dev.localstack import LocalStack, RestClient

log = logging.getLogger("bench.perf")

DAG_FILES = sorted((REPO / "bench" / "dags").glob("bench_*.py"))
SCHEMA = DEFAULT_SCHEMA
DOMAINS = ("example.com", "apache.org", "postgresql.org", "spark.apache.org", "kleppmann.com")
SECTIONS = ("commit", "decisions", "plan", "startup", "work", "peer", "overhead", "pipelining", "waits", "latency")
# How the provider runs its Spark jobs: one spark-submit per batch, or a long-lived Spark Connect
# server (the DAG suffix of each).
BACKENDS = {"spark-submit": "", "Spark Connect": "_sc"}
#: The goals against Structured Streaming, by (backend, events a batch): events/s ours / the peer's.
PEER_TARGETS = {("spark-submit", 1_000_000): 0.8, ("spark-submit", 5_000_000): 1.0, ("Spark Connect", 1_000_000): 1.2}
# Batches that keep Spark busy for tens of seconds want the full JIT (LOCAL_SPARK_CONF's C1-only
# driver is for small batches): the peer and the Spark Connect server get it; our big-batch jobs
# get no JIT setting, so the process task picks one by the batch's size (submit.with_jit_for_batch).
BIG_BATCH_CONF = {**LOCAL_SPARK_CONF, "spark.driver.extraJavaOptions": "-XX:+UseSerialGC"}


@dataclass
class Sizes:
    """What one run measures; ``quick`` keeps the whole run near ten minutes (about 12 here)."""

    commit_delta: int = 100_000
    commit_small_state: int = 100_000
    commit_large_state: int = 10_000_000
    commit_trials: int = 7
    plan_small_log: int = 200_000
    plan_large_log: int = 20_000_000
    plan_trials: int = 15
    peer_batches: tuple[int, ...] = (100_000, 1_000_000, 5_000_000)
    peer_batch_count: int = 3
    peer_backends: tuple[str, ...] = ("spark-submit", "Spark Connect")
    distinct_urls: int = 20_000
    overhead_runs: int = 5
    pipeline_transactions: int = 8
    pipeline_batch: int = 5_000
    max_in_flight: int = 3
    startup_batch: int = 2_000
    startup_trials: int = 4
    work_batch: int = 1_000_000
    work_trials: int = 3
    decision_requests: int = 100_000
    decision_accounts: int = 20_000
    decision_trials: int = 5
    latency_transactions: int = 30

    @classmethod
    def quick(cls) -> Sizes:
        return cls(commit_large_state=1_000_000, commit_trials=2, plan_large_log=2_000_000, plan_trials=9,
                   peer_batches=(1_000_000,), peer_batch_count=2, peer_backends=("Spark Connect",),
                   overhead_runs=2, pipeline_transactions=3, pipeline_batch=2_000, startup_trials=2,
                   work_trials=2, decision_trials=2, latency_transactions=8)


@dataclass
class Row:
    """One line of the table: ``ratio`` is what the target is stated on."""

    section: str
    measure: str
    ours: str
    baseline: str
    ratio: float | None
    target: str = ""
    met: bool | None = None
    note: str = ""


@dataclass
class Report:
    started: str
    machine: str
    quick: bool
    pg_settings: dict[str, str] = field(default_factory=dict)
    rows: list[Row] = field(default_factory=list)
    wall_seconds: float = 0.0

    def add(self, row: Row) -> None:
        self.rows.append(row)
        log.info("%s | %s | ours %s | baseline %s | ratio %s %s", row.section, row.measure, row.ours, row.baseline,
                 _fmt_ratio(row.ratio), row.target)

    def table(self) -> str:
        head = ("what", "ours", "baseline", "ratio", "target", "met")
        lines = [(f"{r.section}: {r.measure}", r.ours, r.baseline, _fmt_ratio(r.ratio), r.target,
                  "" if r.met is None else ("yes" if r.met else "NO")) for r in self.rows]
        widths = [max(len(str(x)) for x in col) for col in zip(head, *lines, strict=True)]
        out = ["| " + " | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)) + " |",
               "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
        out += ["| " + " | ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)) + " |"
                for line in lines]
        notes = [f"- {r.section}: {r.note}" for r in self.rows if r.note]
        return "\n".join(out + (["", *notes] if notes else []))


def _fmt_ratio(ratio: float | None) -> str:
    return "" if ratio is None else f"{ratio:.2f}x"


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def machine() -> str:
    mem = psutil.virtual_memory().total / 2**30
    return f"{os.cpu_count()} cores, {mem:.0f} GiB, Python {sys.version.split()[0]}"


# -- peak memory of spark-submit process trees ---------------------------------------------------

class MemorySampler(threading.Thread):
    """Peak RSS of any one spark-submit process tree (driver JVM + its Python workers).

    Labels ending in ``_sc`` measure the Spark Connect server (shared by all batches); the
    others leave it out.
    """

    def __init__(self, interval: float = 0.25) -> None:
        super().__init__(name="memory", daemon=True)
        self.interval = interval
        self.peaks: dict[str, int] = {}
        self.label: str | None = None
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            label = self.label
            if label is None:
                continue
            for proc in psutil.process_iter(["cmdline"]):
                try:
                    cmd = proc.info["cmdline"] or []
                    if "org.apache.spark.deploy.SparkSubmit" not in cmd:
                        continue
                    if (SPARK_CONNECT_SERVER in cmd) != label.endswith("_sc"):
                        continue
                    rss = proc.memory_info().rss + sum(c.memory_info().rss for c in proc.children(recursive=True))
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                self.peaks[label] = max(self.peaks.get(label, 0), rss)

    @contextmanager
    def measuring(self, label: str) -> Iterator[None]:
        self.label = label
        try:
            yield
        finally:
            self.label = None


class CpuMeter:
    """How busy the machine's cores were between enter and exit (the profile of a section)."""

    busy: float = 0.0

    def __enter__(self) -> CpuMeter:
        self._start = psutil.cpu_times()
        return self

    def __exit__(self, *exc: object) -> None:
        end = psutil.cpu_times()
        total = sum(end) - sum(self._start)
        idle = (end.idle + end.iowait) - (self._start.idle + self._start.iowait)
        self.busy = 1 - idle / total if total > 0 else 0.0


# -- data ------------------------------------------------------------------------------------------

def md5(text: str) -> str:
    return hashlib.md5(text.encode(), usedforsecurity=False).hexdigest()


def event_payload(rng: random.Random, distinct_urls: int) -> str:
    n = rng.randrange(distinct_urls)
    return json.dumps({"url": f"https://www.{DOMAINS[n % len(DOMAINS)]}/p/{n}", "user": f"u{rng.randrange(1000)}",
                       "ts": "2026-11-22T00:00:00Z"})


def write_events_file(path: Path, n: int, seed: int, distinct_urls: int) -> None:
    rng = random.Random(seed)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        buf = []
        for i in range(n):
            buf.append(event_payload(rng, distinct_urls))
            if len(buf) == 10_000 or i == n - 1:
                fh.write("\n".join(buf) + "\n")
                buf = []
    tmp.rename(path)


def execute(dsn: str, *statements: str | tuple[str, Any], autocommit: bool = False) -> list[tuple[Any, ...]]:
    conn = psycopg2.connect(dsn)
    conn.autocommit = autocommit
    try:
        with conn.cursor() as cur:
            rows: list[tuple[Any, ...]] = []
            for st in statements:
                text, params = st if isinstance(st, tuple) else (st, None)
                cur.execute(text, params)
                rows = cur.fetchall() if cur.description else []
        conn.commit()
        return rows
    finally:
        conn.close()


# -- 3. the commit phase ---------------------------------------------------------------------------

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
        attempt, txn = coord.begin_attempt(topo, txn.txid)
        n = coord.stage(attempt, "counts", commit_rows(n_state, f"o{trial}", sizes.commit_delta, rng))
        coord.finish_attempt(attempt, {"counts": n}, records_read=1)
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


# -- 5. planning vs log size -----------------------------------------------------------------------

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
    archive = spark_cds.build()  # found at once when `airflow-txn spark-cds` built it
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
            conf = spark_cds.with_archive(with_quiet_driver_logs(LOCAL_SPARK_CONF), archive if with_archive else None)
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


# -- the Airflow side -----------------------------------------------------------------------------

def parse_ts(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


class Bench:
    def __init__(self, base: Path, sizes: Sizes, report: Report, sections: tuple[str, ...],
                 pg_settings: dict[str, str] | None = None) -> None:
        self.base, self.sizes, self.report, self.sections = base, sizes, report, sections
        self.dags = base / "dags"
        self.data = base / "data"
        self.memory = MemorySampler()
        self.stack = LocalStack(base, self.dags, spark_connect=True)
        self.stack.pg.settings.update(pg_settings or {})
        self.day0 = datetime(2026, 6, 1, tzinfo=UTC)
        self.triggered = 0
        self._client: RestClient | None = None

    @property
    def client(self) -> RestClient:
        if self._client is None:
            self._client = self.stack.client()
        return self._client

    def write_dags(self) -> None:
        """Deploy the benchmark's DAG files (``bench/dags/``) and the configurations they build."""
        self.dags.mkdir(parents=True, exist_ok=True)
        for dag_file in DAG_FILES:
            (self.dags / dag_file.name).symlink_to(dag_file)
        s, words = self.sizes, []
        for suffix in BACKENDS.values():
            for name, mif in ((f"bench_serial{suffix}", 1), (f"bench_pipelined{suffix}", s.max_in_flight)):
                words.append({"name": name, "landing": None, "max_in_flight": mif, "batch": s.pipeline_batch,
                              "connect": bool(suffix)})
            for size in s.peer_batches:
                name = f"bench_landing_{size}{suffix}"
                landing = self.base / "landing" / name
                landing.mkdir(parents=True, exist_ok=True)
                words.append({"name": name, "landing": str(landing), "max_in_flight": s.max_in_flight, "batch": 1,
                              "connect": bool(suffix)})
        words += waits.dags()
        (self.dags / "bench_words.json").write_text(json.dumps(words, indent=1))

    def dag_ids(self) -> list[str]:
        """The DAGs :meth:`write_dags` deployed: one per file, and bench_words.py's from its JSON."""
        words = json.loads((self.dags / "bench_words.json").read_text())
        return sorted({d.stem for d in self.dags.glob("*.py")} - {"bench_words"} | {w["name"] for w in words})

    # -- runs over REST --------------------------------------------------------------------

    def trigger(self, dag_id: str) -> str:
        self.triggered += 1
        when = (self.day0 + timedelta(minutes=self.triggered)).isoformat()
        return str(self.client.trigger(dag_id, when, f"bench-{self.triggered:04d}")["dag_run_id"])

    def wait_runs(self, dag_id: str, run_ids: list[str], timeout: float) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            runs = [self.client.run(dag_id, r) for r in run_ids]
            if all(r["state"] in ("success", "failed") for r in runs):
                failed = [r["dag_run_id"] for r in runs if r["state"] != "success"]
                if failed:
                    raise RuntimeError(f"{dag_id}: runs {failed} failed; see {self.base / 'logs'}")
                return runs
            time.sleep(1)
        raise TimeoutError(f"{dag_id}: runs {run_ids} unfinished after {timeout:.0f} s")

    def settle(self, dag_ids: list[str]) -> None:
        """Unpause and let the one scheduled run each DAG gets on unpause finish (it is empty)."""
        for d in dag_ids:
            self.client.wait_for_dag(d)
            self.client.unpause(d)
        deadline = time.monotonic() + 300
        for d in dag_ids:
            while time.monotonic() < deadline:
                runs = self.client.runs(d)
                if runs and all(r["state"] in ("success", "failed") for r in runs):
                    break
                time.sleep(1)

    def commits(self, topology: str, run_ids: list[str]) -> list[dict[str, Any]]:
        coord = Coordinator(self.stack.state_dsn)
        try:
            return [c for c in coord.commits(topology) if c["run_key"] in run_ids]
        finally:
            coord.close()

    def throughput(self, dag_id: str, run_ids: list[str], timeout: float) -> tuple[float, int, float]:
        """(events/s, events, seconds): first run's start to the last commit of these runs."""
        runs = self.wait_runs(dag_id, run_ids, timeout)
        commits = self.commits(dag_id, run_ids)
        assert len(commits) == len(run_ids), (dag_id, len(commits), len(run_ids))
        txids = [c["txid"] for c in sorted(commits, key=lambda c: c["committed_at"])]
        assert txids == sorted(txids), f"{dag_id}: commits out of txid order: {txids}"
        start = min(parse_ts(r["start_date"]) for r in runs)
        end = max(c["committed_at"] for c in commits)
        events = sum(int(c["records_read"] or 0) for c in commits)
        seconds = (end - start).total_seconds()
        return events / seconds, events, seconds

    # -- 1. pipelining -----------------------------------------------------------------------

    def bench_pipelining(self, backend: str) -> None:
        s, suffix = self.sizes, BACKENDS[backend]
        n = s.pipeline_transactions * s.pipeline_batch
        rng = random.Random(11)
        events = [(f"p{i}", event_payload(rng, s.distinct_urls)) for i in range(n)]
        results, cpu = {}, {}
        serial_id, piped_id = f"bench_serial{suffix}", f"bench_pipelined{suffix}"
        for dag_id in (serial_id, piped_id):
            el = EventLog(self.stack.state_dsn, dag_id)
            el.append(events)
            el.close()
            with self.memory.measuring(dag_id), CpuMeter() as cpu[dag_id]:
                runs = [self.trigger(dag_id) for _ in range(s.pipeline_transactions)]
                results[dag_id] = self.throughput(dag_id, runs, timeout=120 + 90 * s.pipeline_transactions)
        (serial, _, t_serial), (piped, _, t_piped) = results[serial_id], results[piped_id]
        self.report.add(Row("pipelining", f"{backend}: {s.pipeline_transactions} txns x {s.pipeline_batch:,} "
                                          f"events of words, max_in_flight={s.max_in_flight} vs serial",
                            f"{piped:,.0f} ev/s ({t_piped:.0f} s)", f"{serial:,.0f} ev/s ({t_serial:.0f} s)",
                            piped / serial, ">= 1.8x", piped / serial >= 1.8,
                            f"{backend}: cores busy {cpu[serial_id].busy:.0%} serial, "
                            f"{cpu[piped_id].busy:.0%} pipelined"))

    # -- 4. per-transaction overhead ---------------------------------------------------------

    def bench_overhead(self) -> None:
        ours, noop = [], []
        for _ in range(self.sizes.overhead_runs):
            run = self.trigger("bench_empty")
            r = self.wait_runs("bench_empty", [run], 300)[0]
            c = self.commits("bench_empty", [run])[0]
            ours.append((c["committed_at"] - parse_ts(r["start_date"])).total_seconds())
            run = self.trigger("bench_noop")
            r = self.wait_runs("bench_noop", [run], 300)[0]
            noop.append((parse_ts(r["end_date"]) - parse_ts(r["start_date"])).total_seconds())
        o, b = median(ours), median(noop)
        self.report.add(Row("overhead", "empty transaction, run start -> committed, vs no-op 3-task DAG run",
                            f"{o:.1f} s", f"{b:.1f} s", o / b, "<= 2x", o / b <= 2))

    # -- 2. against Spark Structured Streaming ------------------------------------------------

    def batch_files(self, size: int) -> list[Path]:
        folder = self.data / str(size)
        folder.mkdir(parents=True, exist_ok=True)
        files = []
        for i in range(self.sizes.peer_batch_count):
            path = folder / f"events-{i:03d}.json"
            if not path.exists():
                log.info("peer: writing %s (%d events)", path, size)
                write_events_file(path, size, seed=size + i, distinct_urls=self.sizes.distinct_urls)
            files.append(path)
        return files

    def run_peer(self, size: int) -> dict[str, Any]:
        result_file = self.base / f"peer-{size}.json"
        checkpoint = self.base / f"peer-checkpoint-{size}"
        shutil.rmtree(checkpoint, ignore_errors=True)
        conf = with_quiet_driver_logs(BIG_BATCH_CONF)
        argv = spark_submit_argv("local[2]", conf, "--name", f"sss-peer-{size}")
        argv += [str(PEER_JOB), str(self.data / str(size)), str(checkpoint), f"bench_peer_{size}", str(result_file)]
        env = {**os.environ, "AIRFLOW_TXN_DSN": self.stack.state_dsn, "PYSPARK_PYTHON": sys.executable,
               "SPARK_LOCAL_IP": "127.0.0.1"}
        t0 = time.monotonic()
        with self.memory.measuring(f"peer-{size}"), CpuMeter() as cpu:
            with open(self.base / f"peer-{size}.log", "w") as err:
                subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, stderr=err)
        result: dict[str, Any] = json.loads(result_file.read_text())
        result["wall_seconds"] = time.monotonic() - t0
        result["cpu_busy"] = cpu.busy
        return result

    def bench_peer_alone(self) -> dict[int, dict[str, Any]]:
        """The peer runs before Airflow starts: it has the machine to itself."""
        out = {}
        for size in self.sizes.peer_batches:
            self.batch_files(size)
            out[size] = self.run_peer(size)
            log.info("peer %d: %s", size, {k: v for k, v in out[size].items() if k != "batches"})
        return out

    def bench_peer_ours(self, peer: dict[int, dict[str, Any]], backend: str) -> None:
        for size in self.sizes.peer_batches:
            dag_id = f"bench_landing_{size}{BACKENDS[backend]}"
            landing = self.base / "landing" / dag_id
            for path in self.batch_files(size):
                os.link(path, landing / path.name)
            with self.memory.measuring(dag_id), CpuMeter() as cpu:
                runs = [self.trigger(dag_id) for _ in range(self.sizes.peer_batch_count)]
                ours, events, seconds = self.throughput(dag_id, runs, timeout=600 + size / 2000)
            p = peer[size]
            peer_rate = p["events"] / p["query_seconds"]
            same = self.same_results(dag_id, f"bench_peer_{size}")
            target = PEER_TARGETS.get((backend, size))
            self.report.add(Row(
                "vs Structured Streaming", f"{backend}: {self.sizes.peer_batch_count} batches x {size:,} events",
                f"{ours:,.0f} ev/s ({seconds:.0f} s)", f"{peer_rate:,.0f} ev/s ({p['query_seconds']:.0f} s)",
                ours / peer_rate, f">= {target}x at {size // 1_000_000}M" if target else "",
                (ours / peer_rate >= target) if target else None,
                f"{backend}, {size:,}/batch: cores busy {cpu.busy:.0%} ours, {p['cpu_busy']:.0%} the peer"
                + ("; both states identical to the peer's" if same else "; RESULTS DIFFER from the peer's")))
            if events != p["events"]:
                self.report.rows[-1].note += f" ours read {events} events, the peer {p['events']}"

    def same_results(self, ours_prefix: str, peer_prefix: str) -> bool:
        differ = 0
        for key in ("url", "domain"):
            ours_t = ".".join(f'"{p}"' for p in qualified_table(f"{ours_prefix}_{key}_counts", DEFAULT_STATE_SCHEMA))
            peer_t = f"{peer_prefix}_{key}_counts"
            differ += execute(self.stack.state_dsn, f"SELECT count(*) FROM {ours_t} o FULL JOIN {peer_t} p "
                                                   f"ON o.{key} = p.{key} WHERE o.value IS DISTINCT FROM p.value")[0][0]
        return differ == 0

    def memory_rows(self) -> None:
        for label, peak in sorted(self.memory.peaks.items()):
            what = ("Structured Streaming peer (its driver + Python workers)" if label.startswith("peer-")
                    else "Spark Connect server, all batches (JVM + Python workers)" if label.endswith("_sc")
                    else "processing task (spark-submit driver + Python workers)")
            self.report.add(Row("peak memory", f"{what}: {label}", f"{peak / 2**20:,.0f} MiB", "", None))

    # -- the whole run -------------------------------------------------------------------------

    def run(self) -> Report:
        started = time.monotonic()
        self.memory.start()
        self.write_dags()
        self.stack.base_dir.mkdir(parents=True, exist_ok=True)
        self.stack.pg.start()
        dsn = self.stack.pg.create_database("airflow_txn")
        logs = ["bench_empty", *(f"bench_{kind}{suffix}" for suffix in BACKENDS.values()
                                 for kind in ("serial", "pipelined")), *(w["name"] for w in waits.dags())]
        for name in logs:  # the DAGs' logs exist from the start
            el = EventLog(dsn, name)
            el.create(4)
            el.close()
        try:
            if "commit" in self.sections:
                bench_commit(dsn, self.sizes, self.report)
            if "decisions" in self.sections:
                bench_decisions(dsn, self.sizes, self.report)
            if "plan" in self.sections:
                bench_plan(dsn, self.sizes, self.report)
            if "startup" in self.sections:
                bench_startup(dsn, self.sizes, self.report)
            if "work" in self.sections:
                bench_work(dsn, SCHEMA, self.base / "work", self.batch_files(self.sizes.work_batch)[0], self.sizes,
                           self.report, BIG_BATCH_CONF)
            peer = self.bench_peer_alone() if "peer" in self.sections else {}
            if {"peer", "overhead", "pipelining", "waits"} & set(self.sections):
                self.stack.start()
                self.settle(self.dag_ids())
                if "overhead" in self.sections:
                    self.bench_overhead()
                for backend in BACKENDS:
                    if "pipelining" in self.sections:
                        self.bench_pipelining(backend)
                    if "peer" in self.sections and backend in self.sizes.peer_backends:
                        self.bench_peer_ours(peer, backend)
                if "waits" in self.sections:
                    waits.bench_waits(self)
            self.memory_rows()
        finally:
            self.memory.stopped.set()
            self.stack.stop()
        if "latency" in self.sections:  # a stack of its own (the payments example), after the other's end
            bench_latency(self.base / "latency", self.sizes, self.report)
        self.report.wall_seconds = time.monotonic() - started
        return self.report


def plot(report: Report, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report.rows if r.ratio is not None]
    fig, ax = plt.subplots(figsize=(10, 0.55 * len(rows) + 1.5))
    labels = [f"{r.section}: {r.measure}"[:80] for r in rows]
    colours = ["#4c9a2a" if r.met else "#c0392b" if r.met is False else "#7f8c8d" for r in rows]
    ax.barh(range(len(rows)), [r.ratio or 0 for r in rows], color=colours)
    for i, r in enumerate(rows):
        ax.text((r.ratio or 0) + 0.02, i, f"{r.ratio:.2f}x  (target {r.target or '-'})", va="center", fontsize=8)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ratio (see the table for which way each is stated)")
    ax.set_title(f"airflow-provider-transactional benchmarks, {report.started[:10]} ({report.machine})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.perf", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes; the whole run takes about 12 minutes")
    parser.add_argument("--only", help=f"comma-separated sections (default all of {', '.join(SECTIONS)})")
    parser.add_argument("--backends", help=f"comma-separated backends the peer section runs ours on (default: "
                        f"{', '.join(Sizes().peer_backends)}; quick: {', '.join(Sizes.quick().peer_backends)})")
    parser.add_argument("--dir", help="where to keep Postgres, Airflow, data and logs (default: a temp dir)")
    parser.add_argument("--json", help="also write the report here")
    parser.add_argument("--pg-setting", action="append", default=[], metavar="NAME=VALUE",
                        help="a setting of the embedded Postgres (repeatable), e.g. shared_buffers=4GB")
    parser.add_argument("--plot", default="docs/benchmarks.png", help="the PNG plot (default docs/benchmarks.png)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sections = tuple(args.only.split(",")) if args.only else SECTIONS
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}: choose from {', '.join(SECTIONS)}")
    bad = [x for x in args.pg_setting if "=" not in x]
    if bad:
        parser.error(f"--pg-setting takes NAME=VALUE, got {bad[0]!r} (e.g. --pg-setting shared_buffers=4GB)")
    pg_settings = dict(x.split("=", 1) for x in args.pg_setting)
    sizes = Sizes.quick() if args.quick else Sizes()
    if args.backends:
        sizes.peer_backends = tuple(b.strip() for b in args.backends.split(","))
        if set(sizes.peer_backends) - set(BACKENDS):
            parser.error(f"unknown backends in {args.backends!r}: choose from {', '.join(BACKENDS)}")
    report = Report(started=datetime.now(UTC).isoformat(timespec="seconds"), machine=machine(),
                    quick=args.quick, pg_settings=pg_settings)
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="txn-bench-"))
    Bench(base.resolve(), sizes, report, sections, pg_settings).run()
    tuned = "".join(f" --pg-setting {k}={v}" for k, v in pg_settings.items())
    print(f"\nbenchmarks, {report.started} ({report.machine}){' --quick' if args.quick else ''}{tuned}, "
          f"{report.wall_seconds / 60:.1f} min\n")
    print(report.table())
    if args.json:
        Path(args.json).write_text(json.dumps(asdict(report), indent=2, default=str))
    if args.plot:
        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        plot(report, Path(args.plot))
        print(f"\nplot: {args.plot}")
    if not args.dir:
        shutil.rmtree(base, ignore_errors=True)
    return 1 if any("RESULTS DIFFER" in r.note for r in report.rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())

