"""What every section of ``bench.perf`` measures with: its sizes, the rows of the report, the
machine's CPU and memory as a section runs, the benchmark's events, and a SQL helper."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import resource
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
import psycopg2

from airflow_transactional.model import DEFAULT_SCHEMA
from airflow_transactional.spark.connect_server import SPARK_CONNECT_SERVER
from airflow_transactional.spark.submit import LOCAL_SPARK_CONF

log = logging.getLogger("bench.perf")

SCHEMA = DEFAULT_SCHEMA
REPO = Path(__file__).resolve().parents[1]
WORDS_JOB = REPO / "spark_jobs" / "words.py"
WORDS_PLAIN_JOB = REPO / "bench" / "words_plain.py"  # the same states as plain DataFrames: a job per state
PEER_JOB = REPO / "bench" / "sss_peer.py"
DOMAINS = ("example.com", "apache.org", "postgresql.org", "spark.apache.org", "kleppmann.com")
# How the provider runs its Spark jobs: one spark-submit per batch, or a long-lived Spark Connect
# server (the DAG suffix of each).
BACKENDS = {"spark-submit": "", "Spark Connect": "_sc"}
# Batches that keep Spark busy for tens of seconds want the full JIT (LOCAL_SPARK_CONF's C1-only
# driver is for small batches): the peer and the Spark Connect server get it; our big-batch jobs
# get no JIT setting, so the process task picks one by the batch's size (submit.with_jit_for_batch).
BIG_BATCH_CONF = {**LOCAL_SPARK_CONF, "spark.driver.extraJavaOptions": "-XX:+UseSerialGC"}


#: The topologies ``bench/dags/bench_scale.py`` declares (the most one run of ``scale`` measures at
#: once), and its plain DAG of three no-op tasks.
SCALE_TOPOLOGIES = 4
SCALE_NOOP = "bench_scale_noop"
#: The topology the ``cluster`` section runs on this Airflow and then on the cluster stack (words,
#: ``Sizes.cluster_batch`` events a batch, max_in_flight transactions in flight).
CLUSTER_DAG = "bench_cluster"


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
    # Batches per vs-SSS row: enough that neither side's first (cold) batch dominates; the largest
    # batches warm up within the first and get fewer (``batches_of``).
    peer_batch_count: int = 6
    peer_large_batch_count: int = 3
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
    evolution_events: int = 10_000_000  # the history a state is built from (committed in work_batch txids)
    decision_requests: int = 100_000
    decision_accounts: int = 20_000
    decision_trials: int = 5
    latency_transactions: int = 30
    publish_events: int = 200_000
    scale_runs: int = 12
    scale_topologies: tuple[int, ...] = (2, 4)
    cluster_transactions: int = 6
    cluster_batch: int = 100_000
    objects_small: int = 1_000
    objects_large: int = 100_000
    objects_new: int = 10
    objects_trials: int = 5

    @classmethod
    def quick(cls) -> Sizes:
        return cls(commit_large_state=1_000_000, commit_trials=2, plan_large_log=2_000_000, plan_trials=9,
                   peer_batches=(1_000_000,), peer_batch_count=2, peer_large_batch_count=2,
                   peer_backends=("Spark Connect",),
                   overhead_runs=2, pipeline_transactions=3, pipeline_batch=2_000, startup_trials=2,
                   work_trials=2, decision_trials=2, latency_transactions=8, publish_events=50_000,
                   scale_runs=6, scale_topologies=(2,),
                   cluster_transactions=3, cluster_batch=20_000, objects_large=10_000, objects_trials=3,
                   evolution_events=2_000_000)

    def batches_of(self, size: int) -> int:
        """How many batches of ``size`` events a vs-SSS row runs (on each side)."""
        return self.peer_large_batch_count if size >= 5_000_000 else self.peer_batch_count


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


def git_commit() -> str:
    """The short id of the code being measured, ``+changes`` when tracked files differ from it
    (``?`` outside a git checkout)."""
    repo = Path(__file__).resolve().parents[1]
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True,
                         check=False)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                           capture_output=True, text=True, check=False)
    return (out.stdout.strip() or "?") + ("+changes" if dirty.stdout.strip() else "")


#: Where the committed results live: each names the commit it measured, so it must be a clean one.
RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"


def is_clean(commit: str | None) -> bool:
    """Whether a result names a commit it can be reproduced from (no ``+changes``, not unknown)."""
    return bool(commit) and commit != "?" and "+" not in str(commit)


def dirty_result(path: str | None) -> str | None:
    """Why a results file may not be written to ``path`` from this tree (a committed result measured
    on uncommitted changes, which no one can reproduce), or None."""
    if not path or RESULTS not in Path(path).resolve().parents or is_clean(git_commit()):
        return None
    return (f"{path} is a committed result: measure a clean commit (commit or stash your changes), or write "
            "the report elsewhere (--json /tmp/report.json)")


@dataclass
class Report:
    started: str
    machine: str
    quick: bool
    pg_settings: dict[str, str] = field(default_factory=dict)
    rows: list[Row] = field(default_factory=list)
    wall_seconds: float = 0.0
    commit: str = ""  # the code measured (git's short id)
    command: str = ""  # the command line that measured it

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
    seconds: float = 0.0  # wall time between enter and exit

    def __enter__(self) -> CpuMeter:
        self._start = psutil.cpu_times()
        self._t0 = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.monotonic() - self._t0
        end = psutil.cpu_times()
        total = sum(end) - sum(self._start)
        idle = (end.idle + end.iowait) - (self._start.idle + self._start.iowait)
        self.busy = 1 - idle / total if total > 0 else 0.0


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


def parse_ts(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def run_measured(argv: list[str], env: dict[str, str], what: str) -> tuple[float, float]:
    """(CPU-seconds of the whole process tree, wall seconds) of one command, which must succeed."""
    before, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    res = subprocess.run(argv, env=env, capture_output=True, text=True, check=False, timeout=1800)
    wall, after = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    if res.returncode != 0:
        raise RuntimeError(f"{what} failed ({res.returncode}):\n{res.stderr[-3000:]}\n{res.stdout[-3000:]}")
    return (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime), wall


def settle_log(dsn: str, schema: str, name: str) -> None:
    """After events were put into log ``name`` directly: its counters past them, and the table
    vacuumed and analyzed as autovacuum keeps a log in steady state -- so that no measurement
    runs beside autovacuum's pass over millions of fresh rows, or reads them before it."""
    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(f"UPDATE {schema}.log_partitions SET next_lsn = (SELECT coalesce(max(lsn), 0) + 1 "
                        f"FROM {schema}.log_events e WHERE e.log_name = %s "
                        "AND e.partition = log_partitions.partition) WHERE log_name = %s", (name, name))
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f"VACUUM (ANALYZE) {schema}.log_events")
    finally:
        conn.close()
