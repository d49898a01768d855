"""``python -m bench.demo_soak``: ``make demo`` left running with Spark drivers killed now and then,
as an operator would meet it in its first week; then Ctrl-C.

It starts the demo (``dev/demo.py``) in a directory of its own, SIGKILLs a running
``spark-submit`` driver of a random topology every ``--kill-every`` seconds, samples every
topology's lag and committed txid every ``--sample-every`` seconds, stops the demo with SIGINT
(Ctrl-C) at the end, and reports: per topology the commits, the drivers killed, the lag over each
third of the run -- *bounded* unless every sample of the last third is above the largest of the
first two --, the seconds between two of its commits (their median and largest, over the run:
what a new user watching the demo waits), and whatever Spark left in the system temp directory
(nothing, if the stack keeps its scratch space to itself). ``--spark-connect`` runs the demo's
batches on its Spark Connect server (``make demo SPARK_CONNECT=1``) and kills a batch's Spark
Connect client instead of a driver; ``--kill-server-at M`` kills the server itself once, M minutes
in (the demo starts it again; the batches it was serving are retried and the later ones wait for
it); ``--kill-every 0`` kills nothing. The report is
printed as a table and written as JSON (``--json``).
Run it where ``make demo`` has run once (the virtualenv, the jars and the start-up archive).
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from airflow_transactional.connections import Connections, dsn_and_connections, read_dsn_file
from airflow_transactional.coordinator import Coordinator
from airflow_transactional.exceptions import TransactionalError
from airflow_transactional.spark.connect_server import SPARK_CONNECT_SERVER
from bench.measure import dirty_result, git_commit
from dev.demo import DAGS
from dev.embedded import free_port

REPO = Path(__file__).resolve().parents[1]
#: What Spark leaves in a temp directory it is given (and the provider's zip inside them).
SPARK_SCRATCH = ("spark-", "blockmgr-", "artifacts-", "spark_connect_")


def spark_scratch() -> set[str]:
    """Spark's entries in the system temp directory."""
    return {p.name for p in Path(tempfile.gettempdir()).iterdir() if p.name.startswith(SPARK_SCRATCH)}


def drivers(root: psutil.Process) -> dict[int, str]:
    """pid -> topology of every batch's own process under ``root``: its spark-submit driver JVM, or
    its job run as a client of the Spark Connect server (a Python process of the process task)."""
    found = {}
    for proc in root.children(recursive=True):
        try:
            argv = proc.cmdline()
            if SPARK_CONNECT_SERVER in argv:
                continue  # the demo's Spark Connect server: not a batch's (--kill-server-at kills it)
            if argv and argv[0].endswith("java") and "org.apache.spark.deploy.SparkSubmit" in argv:
                found[proc.pid] = next((a[len("txn-"):] for a in argv if a.startswith("txn-")), "?")
            elif "--topology" in argv[:-1] and "--txid" in argv and not any(
                    "org.apache.spark.deploy.SparkSubmit" in p.cmdline() for p in proc.parents()):
                found[proc.pid] = argv[argv.index("--topology") + 1]  # not a spark-submit driver's own Python
        except psutil.Error:
            continue
    return found


def judge(samples: list[int]) -> str:
    """Bounded, unless every sample of the last third is above the largest of the first two."""
    if len(samples) < 3:
        return "too short"
    cut = len(samples) * 2 // 3
    return "grows" if min(samples[cut:]) > max(samples[:cut]) else "bounded"


def commit_gaps(coord: Coordinator, topology_id: str, since: datetime) -> dict[str, float] | None:
    """The median and the largest number of seconds between two commits of ``topology_id`` after
    ``since`` (None: fewer than two)."""
    try:
        at = sorted(c["committed_at"] for c in coord.commits(topology_id) if c["committed_at"] >= since)
    except TransactionalError:
        return None
    gaps = sorted((b - a).total_seconds() for a, b in itertools.pairwise(at))
    return {"p50": round(gaps[len(gaps) // 2], 1), "max": round(gaps[-1], 1)} if gaps else None


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.base = Path(args.dir).resolve()
        self.rng = random.Random(args.seed)
        self.lags: dict[str, list[int]] = {t: [] for t in DAGS}
        self.committed: dict[str, list[int]] = {t: [] for t in DAGS}
        self.killed: dict[str, int] = {t: 0 for t in DAGS}
        self.gaps: dict[str, dict[str, float] | None] = {}
        self.server_killed: list[float] = []  # minutes into the run
        # txids seen with their last try failed (a kill does that; Airflow retries them)
        self.failed: dict[str, list[int]] = {}

    def start(self) -> subprocess.Popen[bytes]:
        self.base.mkdir(parents=True, exist_ok=True)
        log = open(self.base / "demo.out", "ab")
        connect = ["--spark-connect"] if self.args.spark_connect else ["--spark-submit"]
        demo = subprocess.Popen([sys.executable, "-m", "dev.demo", "--dir", str(self.base), "--port", str(free_port()),
                                 "--rate", str(self.args.rate), *connect], cwd=REPO, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 600
        while "Ctrl-C stops everything" not in (self.base / "demo.out").read_text(errors="replace"):
            if demo.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the demo did not start; see {self.base / 'demo.out'}")
            time.sleep(2)
        return demo

    def sample(self, coord: Coordinator) -> None:
        for t in DAGS:
            try:
                st = coord.status(t)
            except TransactionalError as exc:
                if t in {s.topology_id for s in coord.topologies()}:
                    raise  # registered, yet its status cannot be read: the report would be empty
                logging.debug("%s: not registered yet (%s)", t, exc)
                continue
            self.lags[t].append(st.lag)
            self.committed[t].append(st.committed_txid)
            self.failed[t] = sorted({*self.failed.get(t, []), *(f.txid for f in st.in_flight if f.phase == "failed")})

    def kill_one(self, demo: subprocess.Popen[bytes], wait: float = 90) -> None:
        """SIGKILL a random batch's process, waiting up to ``wait`` s for one to run: a batch on
        Spark Connect runs for seconds a minute, so a single look would mostly find none."""
        deadline = time.monotonic() + wait
        while not (running := drivers(psutil.Process(demo.pid))) and time.monotonic() < deadline:
            time.sleep(0.5)
        if not running:
            logging.info("no batch processed for %.0f s: nothing to kill this time", wait)
            return
        pid = self.rng.choice(sorted(running))
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        self.killed[running[pid]] = self.killed.get(running[pid], 0) + 1
        logging.info("killed the %s of %s (pid %d)", "Spark Connect client" if self.args.spark_connect
                     else "spark-submit driver", running[pid], pid)

    def kill_server(self, demo: subprocess.Popen[bytes], minute: float) -> None:
        """SIGKILL the demo's Spark Connect server (the JVM, as a lost machine would lose it)."""
        for proc in psutil.Process(demo.pid).children(recursive=True):
            try:
                if SPARK_CONNECT_SERVER in proc.cmdline() and proc.name() == "java":
                    proc.kill()
                    self.server_killed.append(round(minute, 1))
                    logging.info("killed the Spark Connect server (pid %d)", proc.pid)
            except psutil.Error:
                continue

    def run(self) -> dict[str, Any]:
        before = spark_scratch()
        started = time.monotonic()
        demo = self.start()
        # kafka_words' lag is read from the demo's broker (its port in kafka/kafka.json)
        port = json.loads((self.base / "kafka" / "kafka.json").read_text())["port"]
        os.environ["AIRFLOW_CONN_KAFKA_DEFAULT"] = json.dumps(
            {"conn_type": "kafka", "extra": {"bootstrap.servers": f"127.0.0.1:{port}"}})
        # The demo's DSN file, as `airflow-txn` reads it: the DSN, and the S3 connection (a secret) kept with it.
        dsn, known = dsn_and_connections(read_dsn_file(str(self.base / "state.dsn")))
        coord = Coordinator(dsn, connections=Connections(known=known))
        end = time.monotonic() + self.args.minutes * 60
        next_kill = time.monotonic() + self.args.kill_every if self.args.kill_every else float("inf")
        since = datetime.now(UTC)
        kill_server_at = time.monotonic() + self.args.kill_server_at * 60 if self.args.kill_server_at else float("inf")
        try:
            while time.monotonic() < end:
                if demo.poll() is not None:
                    raise RuntimeError(f"the demo exited ({demo.returncode}); see {self.base / 'demo.out'}")
                self.sample(coord)
                if time.monotonic() >= next_kill:
                    self.kill_one(demo)
                    next_kill += self.args.kill_every
                if time.monotonic() >= kill_server_at:
                    self.kill_server(demo, self.args.minutes - (end - time.monotonic()) / 60)
                    kill_server_at = float("inf")
                time.sleep(self.args.sample_every)
            self.gaps = {t: commit_gaps(coord, t, since) for t in DAGS}
        finally:
            coord.close()
            os.killpg(demo.pid, signal.SIGINT)  # Ctrl-C, as a person stops it
            try:
                demo.wait(300)
            except subprocess.TimeoutExpired:
                os.killpg(demo.pid, signal.SIGKILL)
                demo.wait(30)
        left = sorted(spark_scratch() - before)
        return self.report(time.monotonic() - started, demo.returncode, left)

    def report(self, wall: float, exit_code: int, left: list[str]) -> dict[str, Any]:
        topologies = {}
        for t in DAGS:
            lags, txids = self.lags[t], self.committed[t]
            third = max(1, len(lags) // 3)
            topologies[t] = {
                "commits": (txids[-1] - txids[0]) if txids else 0,
                "drivers_killed": self.killed.get(t, 0),
                "max_lag_by_third": [max(lags[i * third:(i + 1) * third] or [0]) for i in range(3)],
                "final_lag": lags[-1] if lags else None,
                "lag": judge(lags),
                "commit_gap_s": self.gaps.get(t),
                "failed_tries": self.failed.get(t, []),
                # failed and still not committed at the last sample: a jammed topology
                "failed_uncommitted": [x for x in self.failed.get(t, []) if not txids or x > txids[-1]],
            }
        return {"date": datetime.now(UTC).isoformat(timespec="seconds"), "commit": git_commit(),
                "machine": f"{platform.node()} {os.cpu_count()} cores", "minutes": self.args.minutes,
                "backend": "spark-connect" if self.args.spark_connect else "spark-submit",
                "kill_every_s": self.args.kill_every, "connect_server_killed_at_min": self.server_killed,
                "rate": self.args.rate, "wall_s": round(wall),
                "demo_exit_code": exit_code, "left_in_temp": left, "topologies": topologies}


def table(report: dict[str, Any]) -> str:
    rows = [f"{'topology':<16} {'commits':>7} {'killed':>6}  {'max lag by third':<24} {'final':>7}  {'lag':<9}"
            "seconds between commits (median / largest)"]
    for t, r in report["topologies"].items():
        thirds = " / ".join(f"{v:,}" for v in r["max_lag_by_third"])
        gap = r.get("commit_gap_s")
        rows.append(f"{t:<16} {r['commits']:>7} {r['drivers_killed']:>6}  {thirds:<24} "
                    f"{r['final_lag'] if r['final_lag'] is not None else '-':>7}  {r['lag']:<9}"
                    + (f"{gap['p50']} / {gap['max']}" if gap else "-"))
    what = "Spark Connect client" if report.get("backend") == "spark-connect" else "driver"
    killed = f"a batch's {what} killed every {report['kill_every_s']} s" if report["kill_every_s"] else "nothing killed"
    if report.get("connect_server_killed_at_min"):
        killed += f", the Spark Connect server killed at minute {report['connect_server_killed_at_min'][0]}"
    jammed = {t: r["failed_uncommitted"] for t, r in report["topologies"].items() if r.get("failed_uncommitted")}
    retried = {t: r["failed_tries"] for t, r in report["topologies"].items() if r.get("failed_tries")}
    rows.append(f"txids whose try failed: {retried or 'none'}; of them not committed at the end: {jammed or 'none'}")
    rows.append(f"{report['minutes']} min on {report.get('backend', 'spark-submit')}, {killed}; demo exit code "
                f"{report['demo_exit_code']} after Ctrl-C; left in the system temp directory: "
                f"{', '.join(report['left_in_temp']) or 'nothing'}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.demo_soak", description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--kill-every", type=float, default=180, help="seconds between two driver kills (0: none)")
    parser.add_argument("--spark-connect", action="store_true", help="the demo's batches on its Spark Connect server")
    parser.add_argument("--kill-server-at", type=float, default=0,
                        help="with --spark-connect: kill the demo's Spark Connect server once, this many minutes in")
    parser.add_argument("--sample-every", type=float, default=15, help="seconds between two lag samples")
    parser.add_argument("--rate", type=int, default=50, help="the demo's tweets per second")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--dir", default="var/demo-soak", help="the demo's directory (a fresh one is best)")
    parser.add_argument("--json", help="also write the report here")
    args = parser.parse_args(argv)
    if dirty := dirty_result(args.json):
        parser.error(dirty)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    report = Soak(args).run()
    print(table(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    bad = report["left_in_temp"] or any(r["lag"] == "grows" for r in report["topologies"].values())
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
