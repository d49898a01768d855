"""``python -m dev.lanes [pytest arguments]``: the whole suite in three lanes side by side on a
machine of two cores -- the Airflow end-to-end tier (the README's own example among it) and two
Spark stories (:data:`E2E_LANE_SPARK`); the cluster tier with a share of the Spark stories
(:data:`CLUSTER_LANE_SPARK`); every other test (integration, spark, unit). Measured: a lane keeps
the CPU far from busy when it runs alone (its waits are Airflow's heartbeats, retries and scheduler
loops, a lost node's timeouts), so side by side the lanes finish in about the time of the longest.

The chaos mixes are not tests: each of their faults is asserted one at a time by a test of its own
in the tiers, and the mixes themselves are ``python -m bench.chaos`` (``--mode payments``,
``--mode kafka``, ``--mode s3``, ``--stack cluster``: docs/chaos.md); the e2e tier runs the
harness's payments run without faults.

Each lane is its own pytest session with its own temporary directory (``TMPDIR``, so the lanes'
Spark scratch and pytest's ``tmp_path`` never meet), its output streamed with the lane's name in
front of each line and kept in ``var/lanes/<lane>.log`` (its JUnit XML beside it: at the end each
lane's slowest files are listed with their minutes). The exit code is 0 only if every lane's
is (pytest's 5, no test collected, is a failure too); Ctrl-C stops every lane.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO
from xml.etree import ElementTree

REPO = Path(__file__).resolve().parents[1]
#: Spark-tier modules run after the cluster tier in its lane, and after the e2e tier in its, to even
#: the lanes out (clean-clone CI, three lanes: 49, 40 and 45 minutes with the chaos mixes in the
#: e2e tier; without them the e2e tier alone took 27). The recompute stories are clients of the
#: spark tier's Spark Connect server, which each lane starts once for its share of them; the Kafka
#: job's story reads the broker the e2e stack already has.
CLUSTER_LANE_SPARK = ("tests/spark/test_verify_job.py", "tests/spark/test_payments_job.py",
                      "tests/spark/test_correction_preview.py", "tests/spark/test_recompute_with_replays.py",
                      "tests/spark/test_spark_job.py", "tests/spark/test_retractions_job.py",
                      "tests/spark/test_evolution_job.py")
E2E_LANE_SPARK = ("tests/spark/test_spark_connect.py", "tests/spark/test_kafka_job.py")
#: lane -> its pytest selection (paths in the order they run, and a marker expression)
LANES = {"e2e": ("tests/e2e", *E2E_LANE_SPARK, "-m", "e2e or spark"),
         "cluster": ("tests/cluster", *CLUSTER_LANE_SPARK, "-m", "cluster or spark"),
         "others": ("tests", *(f"--ignore={m}" for m in (*CLUSTER_LANE_SPARK, *E2E_LANE_SPARK)),
                    "-m", "not e2e and not cluster")}


def lane_argv(name: str, args: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", *LANES[name], *args]


def _pump(name: str, stream: IO[str], log: IO[str], lock: threading.Lock) -> None:
    """Copy a lane's output to its log and, each line named, to this process's output."""
    with log:
        for line in stream:
            log.write(line)
            log.flush()
            with lock:
                sys.stdout.write(f"[{name}] {line}")
                sys.stdout.flush()


def failure_summary(log: Path, most: int = 40) -> list[str]:
    """The failed lane's pytest summary (its ``FAILED`` and ``ERROR`` lines), to repeat after both
    lanes end: a lane that finished first would otherwise have its verdict far above the end of
    the output, where a CI log's tail does not reach."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return []
    found = [line for line in lines if line.startswith(("FAILED ", "ERROR "))]
    return found[:most] + ([f"... and {len(found) - most} more"] if len(found) > most else [])


def slowest_files(junit: Path, most: int = 12) -> list[tuple[str, float]]:
    """The lane's test files that took longest, each with its tests' seconds in all (set-up and
    tear-down included), from the lane's JUnit XML: where a lane's minutes go, file by file."""
    try:
        cases = ElementTree.parse(junit).getroot().iter("testcase")
    except (OSError, ElementTree.ParseError):
        return []
    spent: dict[str, float] = {}
    for case in cases:
        parts = case.get("classname", "").split(".")
        while len(parts) > 1 and parts[-1][:1].isupper():  # a test class's name, after its module's
            parts.pop()
        path = "/".join(parts) + ".py"
        spent[path] = spent.get(path, 0.0) + float(case.get("time") or 0)
    return sorted(spent.items(), key=lambda kv: -kv[1])[:most]


def run(args: Sequence[str], base: Path = REPO / "var" / "lanes") -> int:
    base.mkdir(parents=True, exist_ok=True)
    lock = threading.Lock()
    procs: dict[str, subprocess.Popen[str]] = {}
    pumps = []
    started = time.monotonic()
    for name in LANES:
        tmp = base / f"{name}-tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        log = open(base / f"{name}.log", "w")  # closed by its pump
        argv = lane_argv(name, [*args, f"--junitxml={base / f'{name}.xml'}"])  # for slowest_files
        proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, text=True, start_new_session=True,
                                env={**os.environ, "TMPDIR": str(tmp)})
        assert proc.stdout is not None
        procs[name] = proc
        pump = threading.Thread(target=_pump, args=(name, proc.stdout, log, lock), daemon=True)
        pump.start()
        pumps.append(pump)

    def stop(signum: int, _frame: object) -> None:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        codes = {name: proc.wait() for name, proc in procs.items()}
        for pump in pumps:
            pump.join(60)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    minutes = (time.monotonic() - started) / 60
    for name, code in codes.items():
        for path, seconds in slowest_files(base / f"{name}.xml"):
            print(f"[{name}] {seconds / 60:5.1f} min  {path}")
        if code != 0:
            for line in failure_summary(base / f"{name}.log"):
                print(f"[{name}] {line}")
        print(f"lane {name} ({' '.join(LANES[name])}): pytest exit code {code}; its log: {base / f'{name}.log'}")
    print(f"the lanes took {minutes:.1f} min")
    return 0 if all(code == 0 for code in codes.values()) else 1


if __name__ == "__main__":
    raise SystemExit(run(sys.argv[1:]))
