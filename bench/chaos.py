"""Exactly-once under faults: run ``words`` on the real stack, break things, check an oracle.

Jepsen-style: producers append tweets to an event log (with duplicate deliveries and malformed
records), the harness triggers transactions over the REST API the UI uses, and injects faults at
random -- seeded, so a run can be replayed:

  spark_kill              SIGKILL of a running spark-submit driver JVM (driver and executors)
  commit_kill_before      the commit task's process dies just before the Postgres COMMIT
  commit_kill_after       ... right after COMMIT returned, before Airflow records success
  pg_restart_processing   Postgres restarted (fast shutdown) while a Spark batch runs
  pg_restart_commit       Postgres restarted while a commit transaction is open
  scheduler_restart       the scheduler (and the LocalExecutor workers it owns) SIGKILLed, restarted
  api_restart             the api-server SIGKILLed and restarted
  clear                   a random task of a random run cleared (committed runs included)

It plays the operator too, as documented in README ("Operating a topology"): a component that
died is restarted (what systemd or Kubernetes would do) and a failed run is cleared. At the end
it drains the log and checks, independently of the provider's code paths:

* the state tables equal an oracle computed from what the producers appended, by event id;
* the audit log (``commits``) holds txids 1..N, each once, committed in increasing order;
* the quarantine holds exactly the malformed records injected, each once;
* no run is left unfinished.

``python -m bench.chaos --quick`` is the size CI runs; ``python -m bench.chaos`` the soak.
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import logging
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil
import psycopg2
from psycopg2 import sql

from airflow_transactional import EventLog
from airflow_transactional.coordinator import Coordinator
from airflow_transactional.store.connection import CONNECTION_ERRORS
from dev import faults
from dev.localstack import COMPONENTS, AirflowStackError, LocalStack, RestClient

REPO = Path(__file__).resolve().parents[1]
TOPOLOGY = "chaos_words"
LOG = "chaos_tweets"
KINDS = ("spark_kill", "commit_kill_before", "commit_kill_after", "pg_restart_processing",
         "pg_restart_commit", "scheduler_restart", "api_restart", "clear")
# Faults of one lane strike one at a time; the lanes run side by side.
LANES = {"spark": ("spark_kill", "pg_restart_processing"),
         "commit": ("commit_kill_before", "commit_kill_after", "pg_restart_commit"),
         "control": ("scheduler_restart", "api_restart", "clear")}
DOMAINS = ("example.com", "apache.org", "postgresql.org", "spark.apache.org", "kleppmann.com")
TASKS = ("plan", "process", "commit")
LEDGER = "ledger.jsonl"  # under the run's directory: what the producers appended

# The words example (its Spark job, its two states), under a name and tables of its own.
CHAOS_DAG = """
from datetime import timedelta
from airflow_transactional import PostgresLogSource, StateSpec, transactional_dag
from airflow_transactional.dag import LOCAL_SPARK_CONF

dag = transactional_dag(
    "{topology}",
    source=PostgresLogSource("{log}"),
    states=[
        StateSpec("url_counts", keys={{"url": "text"}}, combiner="count", table="{topology}_url_counts"),
        StateSpec("domain_counts", keys={{"domain": "text"}}, combiner="count", kind="opaque",
                  table="{topology}_domain_counts"),
    ],
    application="{application}",
    schedule="@daily",
    max_in_flight={max_in_flight},
    max_batch_size={batch},
    retries=3,
    retry_delay=timedelta(seconds=2),
    spark_conf=LOCAL_SPARK_CONF,
    spark_pool="spark",
)
"""


@dataclass
class ChaosConfig:
    seed: int = 1
    transactions: int = 200
    faults: int = 400              # balanced: 50 of each of the eight kinds
    kinds: tuple[str, ...] = KINDS
    producers: int = 3
    rate: int = 8                  # events per second per producer (well below what commits absorb)
    duplicate_rate: float = 0.02   # chance an append also re-sends an earlier event id
    malformed_rate: float = 0.004  # chance an event is malformed
    max_in_flight: int = 3
    batch: int = 2000              # a backlog after a stall is caught up in a few transactions
    audit: bool = True             # also run `airflow-txn audit` (one more Spark pass)
    drain_timeout: float = 900

    @classmethod
    def quick(cls, seed: int = 1) -> ChaosConfig:
        """The size CI runs inside ``make test``: 20 transactions, 10 faults, in five minutes.

        Without the final ``airflow-txn audit`` (a Spark pass over every event, a minute here):
        the oracle is the independent check, and the audit has tests of its own."""
        return cls(seed=seed, transactions=20, faults=10, producers=2, rate=6, drain_timeout=420, audit=False,
                   kinds=("spark_kill", "commit_kill_before", "commit_kill_after", "api_restart", "clear"))


@dataclass
class ChaosReport:
    seed: int
    transactions_triggered: int = 0
    transactions_committed: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    faults_missed: dict[str, int] = field(default_factory=dict)
    spark_kill_targets: dict[str, int] = field(default_factory=dict)
    component_restarts: int = 0
    operator_clears: int = 0
    events_appended: int = 0
    duplicate_deliveries: int = 0
    malformed_injected: int = 0
    events_lost: int = 0
    events_duplicated: int = 0
    domain_mismatches: int = 0
    order_violations: int = 0
    quarantine_mismatches: int = 0
    stuck_runs: int = 0
    audit_clean: bool | None = None
    wall_seconds: float = 0.0
    problems: list[str] = field(default_factory=list)
    post_mortem: bool = False  # from --check: the state against the ledger, nothing about the run itself
    events_pending: int = 0     # --check: appended, but beyond the committed checkpoint (not yet due)

    @property
    def violations(self) -> int:
        return (self.events_lost + self.events_duplicated + self.domain_mismatches + self.order_violations
                + self.quarantine_mismatches + self.stuck_runs + (self.audit_clean is False) + len(self.problems))

    def table(self) -> str:
        audit = ("airflow-txn audit", {None: "not run", True: "clean", False: "DIFFERENCES"}[self.audit_clean])
        if self.post_mortem:
            return self._table([("transactions committed", self.transactions_committed),
                                ("duplicate deliveries / malformed records injected",
                                 f"{self.duplicate_deliveries} / {self.malformed_injected}"),
                                *self._outcome(),
                                ("events not yet committed (beyond the checkpoint)", self.events_pending),
                                audit])
        rows: list[tuple[str, object]] = [("seed", self.seed),
                ("transactions committed", self.transactions_committed),
                ("transactions triggered", self.transactions_triggered)]
        rows += [(f"fault: {k}", v) for k, v in sorted(self.faults.items())]
        rows += [(f"fault: {k} (moment never came)", v) for k, v in sorted(self.faults_missed.items())]
        rows += [(f"spark_kill of a {k}", v) for k, v in sorted(self.spark_kill_targets.items())]
        rows += [("fault: duplicate_delivery", self.duplicate_deliveries),
                 ("fault: malformed_record", self.malformed_injected),
                 ("faults total", sum(self.faults.values()) + self.duplicate_deliveries + self.malformed_injected),
                 ("component restarts (supervisor)", self.component_restarts),
                 ("failed runs cleared (operator)", self.operator_clears),
                 *self._outcome(),
                 ("stuck runs", self.stuck_runs),
                 audit,
                 ("wall time", f"{self.wall_seconds:.0f} s")]
        return self._table(rows)

    def _outcome(self) -> list[tuple[str, object]]:
        """What the checks against the ledger found (known after the fact too)."""
        return [("events appended (unique)", self.events_appended),
                ("events lost", self.events_lost),
                ("events duplicated", self.events_duplicated),
                ("domain counts wrong", self.domain_mismatches),
                ("order violations", self.order_violations),
                ("quarantine mismatches", self.quarantine_mismatches)]

    def _table(self, rows: list[tuple[str, object]]) -> str:
        width = max(len(k) for k, _ in rows)
        lines = [f"| {'check':<{width}} | result |", f"|{'-' * (width + 2)}|--------|"]
        lines += [f"| {k:<{width}} | {v} |" for k, v in rows]
        lines += [f"- {p}" for p in self.problems]
        return "\n".join(lines)


def write_dag(dags_dir: Path, cfg: ChaosConfig) -> None:
    (dags_dir / f"{TOPOLOGY}.py").write_text(CHAOS_DAG.format(
        topology=TOPOLOGY, log=LOG, application=REPO / "spark_jobs" / "words.py",
        max_in_flight=cfg.max_in_flight, batch=cfg.batch))


def domain_of(url: str) -> str:
    host = (urlsplit(url).hostname or "").lower()
    return host[4:] if host.startswith("www.") else host


def riding_out(fn: Callable[[], Any], errors: tuple[type[BaseException], ...], *, seconds: float = 300,
               final: Callable[[BaseException], bool] = lambda exc: False) -> Any:
    """``fn()``, tried again every two seconds while it fails with ``errors`` (a component being
    restarted), for up to ``seconds``; an error that ``final`` accepts is raised at once."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return fn()
        except errors as exc:
            if final(exc) or time.monotonic() > deadline:
                raise
            time.sleep(2)


class Ledger:
    """What the producers appended, by event id: the oracle's only input.

    Every acknowledged append is also written to ``path`` (JSON lines, flushed), so the oracle of
    a run whose harness died can still be computed: ``python -m bench.chaos --check DIR``.
    """

    def __init__(self, path: Path | None = None) -> None:
        self.lock = threading.Lock()
        self.valid: dict[str, str] = {}      # event id -> url
        self.malformed: set[str] = set()
        self.sent: list[tuple[str, str]] = []
        self.duplicates = 0
        self._file = open(path, "a", encoding="utf-8") if path else None  # closed by close()

    def record(self, fresh: list[tuple[str, str, str | None]], duplicates: int) -> None:
        """An append was acknowledged: ``fresh`` (id, payload, url or None if malformed), and
        ``duplicates`` earlier events sent again. Call with ``lock`` held."""
        for eid, payload, url in fresh:
            self.sent.append((eid, payload))
            if url is None:
                self.malformed.add(eid)
            else:
                self.valid[eid] = url
        self.duplicates += duplicates
        if self._file is not None:
            lines = [json.dumps({"id": eid, "url": url}) for eid, _, url in fresh]
            lines += [json.dumps({"duplicate": True})] * duplicates
            self._file.write("".join(f"{line}\n" for line in lines))
            self._file.flush()

    @classmethod
    def load(cls, path: Path) -> Ledger:
        ledger = cls()
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                entry = json.loads(line)
                if entry.get("duplicate"):
                    ledger.duplicates += 1
                elif entry["url"] is None:
                    ledger.malformed.add(entry["id"])
                else:
                    ledger.valid[entry["id"]] = entry["url"]
        return ledger

    def close(self) -> None:
        if self._file is not None:
            self._file.close()

    def url_counts(self) -> Counter[str]:
        return Counter(self.valid.values())

    def domain_counts(self) -> Counter[str]:
        return Counter(domain_of(u) for u in self.valid.values())

    def restricted_to(self, ids: set[str]) -> Ledger:
        """The same ledger, with only the events in ``ids``."""
        part = Ledger()
        part.valid = {e: u for e, u in self.valid.items() if e in ids}
        part.malformed = self.malformed & ids
        part.duplicates = self.duplicates
        return part


class Producer(threading.Thread):
    """Appends tweets until stopped; an append interrupted by a fault is retried with the same ids."""

    def __init__(self, dsn: str, index: int, cfg: ChaosConfig, ledger: Ledger, stop: threading.Event) -> None:
        super().__init__(name=f"producer-{index}", daemon=True)
        self.log = EventLog(dsn, LOG, retry_for=120)
        self.index, self.cfg, self.ledger, self.stop_event = index, cfg, ledger, stop
        self.rng = random.Random(cfg.seed * 1000 + index)
        self.n = 0
        self.error: BaseException | None = None

    def _event(self) -> tuple[str, str, str | None]:
        self.n += 1
        eid = f"p{self.index}-{self.n}"
        if self.rng.random() < self.cfg.malformed_rate:
            bad = self.rng.choice(['{"url": truncated', '{"user": "u1"}', "not json at all"])
            return eid, bad, None
        prefix, host = self.rng.choice(["", "www.", "WWW."]), self.rng.choice(DOMAINS)
        url = f"https://{prefix}{host}/post/{self.rng.randint(1, 60)}"
        return eid, json.dumps({"url": url, "user": f"u{self.rng.randint(1, 99)}"}), url

    def run(self) -> None:
        try:
            while not self.stop_event.wait(0.5):
                fresh = [self._event() for _ in range(max(1, self.cfg.rate // 2))]
                batch = [(e, p) for e, p, _ in fresh]
                dup = 0
                with self.ledger.lock:
                    if self.ledger.sent and self.rng.random() < self.cfg.duplicate_rate * len(fresh):
                        batch.append(self.rng.choice(self.ledger.sent))  # the very same delivery again
                        dup = 1
                while True:
                    try:
                        self.log.append(batch)
                        break
                    except Exception as exc:  # the producer API already retried for two minutes
                        logging.warning("%s: append failed (%s); retrying the same event ids", self.name, exc)
                        time.sleep(1)
                with self.ledger.lock:
                    self.ledger.record(fresh, dup)
        except BaseException as exc:  # reported at the end
            self.error = exc
        finally:
            self.log.close()


class Chaos:
    def __init__(self, stack: LocalStack, cfg: ChaosConfig) -> None:
        self.stack, self.cfg = stack, cfg
        self.rng = random.Random(cfg.seed)
        self.client: RestClient = stack.client()
        self.report = ChaosReport(cfg.seed)
        self.ledger = Ledger(stack.base_dir / LEDGER)
        self.runs: list[str] = []
        self.day0 = datetime.now(UTC).replace(microsecond=0) - timedelta(days=2)
        self.faults_file = Path(stack.extra_env["AIRFLOW_TXN_FAULTS_FILE"])
        self.markers = stack.base_dir / "chaos-markers"
        self.markers.mkdir(exist_ok=True)
        self.components = threading.Lock()  # the supervisor never restarts what a fault is restarting
        self.counting = threading.Lock()
        self.driving = threading.Event()  # set when the run winds down: lanes stop waiting for their turn
        self.aborted = threading.Event()  # set when the driver died: lanes strike no more faults
        self.finished = threading.Event()  # set at the very end: the supervisor stops

    # -- plumbing ------------------------------------------------------------------------------

    def rest(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """A REST call that rides out an api-server restart (the supervisor thread brings it back);
        an answer of 4xx is final."""
        return riding_out(lambda: fn(*args, **kwargs), (OSError, http.client.HTTPException, AirflowStackError),
                          final=lambda exc: isinstance(exc, AirflowStackError) and " -> 4" in str(exc))

    def supervise(self) -> None:
        """Restart what died: Postgres, or an Airflow component (a Postgres restart can take the
        scheduler down)."""
        with self.components:
            if not self.stack.pg.is_running():
                logging.info("supervisor: Postgres is down; starting it")
                self.stack.pg.start()
                self.report.component_restarts += 1
            for name in COMPONENTS:
                proc = self.stack.procs.get(name)
                if proc is None or proc.poll() is not None:
                    logging.info("supervisor: %s is down; restarting it", name)
                    self.stack.procs.pop(name, None)
                    self.stack.start_component(name)
                    self.report.component_restarts += 1

    def supervisor(self) -> None:
        """What systemd or Kubernetes does, in a thread of its own: look every two seconds, restart
        what died. Never from a thread that may be waiting for the very component it would restart."""
        while not self.finished.wait(2):
            try:
                self.supervise()
            except Exception:  # a restart that failed is tried again at the next look
                logging.exception("supervisor: a restart failed; trying again")

    def lag(self) -> int:
        """Events in the log not yet committed; rides out a Postgres restart."""
        def once() -> int:
            coord = Coordinator(self.stack.state_dsn)
            try:
                return coord.status(TOPOLOGY).lag
            finally:
                coord.close()
        return int(riding_out(once, CONNECTION_ERRORS))

    def states(self) -> dict[str, str]:
        return {r["dag_run_id"]: r["state"] for r in self.rest(self.client.runs, TOPOLOGY)}

    def operate(self) -> dict[str, str]:
        """One round of the operator's duties (clear failed runs); returns the runs' states."""
        states = self.states()
        for run_id, state in states.items():
            if state == "failed":
                logging.info("operator: run %s failed; clearing its failed tasks", run_id)
                self.rest(self.client.clear, TOPOLOGY, run_id, only_failed=True)
                self.report.operator_clears += 1
        return states

    def trigger(self) -> None:
        k = len(self.runs)
        run_id = f"chaos-{self.cfg.seed}-{k:04d}"
        try:
            self.rest(self.client.trigger, TOPOLOGY, (self.day0 + timedelta(minutes=k)).isoformat(), run_id)
        except AirflowStackError as exc:
            # An api-server killed after it created the run but before it answered: the retried
            # POST finds the run already there. Anything else is a real error.
            if " -> 409" not in str(exc) or not self.rest(self.client.run, TOPOLOGY, run_id):
                raise
        self.runs.append(run_id)

    def arm(self, line: str | None) -> None:
        self.faults_file.write_text(f"{line}\n" if line else "")

    def wait_for(self, predicate: Any, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = predicate()
            if found:
                return found
            time.sleep(0.3)
        return None

    def spark_driver(self) -> psutil.Process | None:
        for proc in psutil.process_iter(["cmdline"]):
            cmd = proc.info["cmdline"] or []
            if "org.apache.spark.deploy.SparkSubmit" in cmd and f"txn-{TOPOLOGY}" in cmd:
                return proc
        return None

    @staticmethod
    def python_workers(driver: psutil.Process) -> list[psutil.Process]:
        """The batch's Python workers (``pyspark.daemon`` and its forks): where the executors run
        the job's Python -- parsing, folding, the COPY into staging."""
        found = []
        try:
            for child in driver.children(recursive=True):
                try:
                    if "pyspark.daemon" in child.cmdline():
                        found.append(child)
                except psutil.Error:
                    continue
        except psutil.Error:
            return []
        return found

    def kill_spark(self, driver: psutil.Process) -> str | None:
        """SIGKILL the driver JVM (driver and executors: local mode runs both in it) or, half the
        time when there is one, a Python worker of the executors. Returns what was killed."""
        workers = self.python_workers(driver) if self.rng.random() < 0.5 else []
        target, what = (self.rng.choice(workers), "python worker") if workers else (driver, "driver JVM")
        try:
            target.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            return None
        logging.info("fault: spark_kill: SIGKILLed the %s (pid %d)", what, target.pid)
        return what

    # -- the faults ----------------------------------------------------------------------------

    def inject(self, kind: str) -> bool:
        """Inject one fault of ``kind``; False if its moment never came (counted as missed)."""
        logging.info("fault: %s", kind)
        if kind in ("spark_kill", "pg_restart_processing"):
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline:  # until a batch is caught in the middle
                driver = self.wait_for(self.spark_driver, deadline - time.monotonic())
                if driver is None:
                    return False
                time.sleep(self.rng.uniform(1, 5))
                if not driver.is_running():
                    continue
                if kind == "spark_kill":
                    what = self.kill_spark(driver)
                    if what is None:
                        continue
                    with self.counting:
                        self.report.spark_kill_targets[what] = self.report.spark_kill_targets.get(what, 0) + 1
                else:
                    with self.components:
                        self.stack.pg.restart("fast")
                return True
            return False
        if kind in ("commit_kill_before", "commit_kill_after", "pg_restart_commit"):
            marker = self.markers / f"{kind}-{time.monotonic_ns()}"
            point, action = {"commit_kill_before": ("commit.before_commit", "exit"),
                             "commit_kill_after": ("commit.after_commit", "exit"),
                             "pg_restart_commit": ("commit.after_apply", "pause:6")}[kind]
            self.arm(f"{point}:{TOPOLOGY}={action}@once:{marker}")
            try:
                if not self.wait_for(marker.exists, 180):
                    return False
            finally:
                self.arm(None)
            if kind == "pg_restart_commit":
                time.sleep(1)  # the commit holds its transaction open for six seconds
                with self.components:
                    self.stack.pg.restart("fast")
            return True
        if kind in ("scheduler_restart", "api_restart"):
            name = "scheduler" if kind == "scheduler_restart" else "api-server"
            with self.components:
                self.stack.stop_component(name, signal.SIGKILL)
                time.sleep(self.rng.uniform(1, 5))
                self.stack.start_component(name)
            return True
        if kind == "clear":
            states = self.states()
            if not states:
                return False
            run_id = self.rng.choice(sorted(states))
            tasks = self.rng.sample(TASKS, self.rng.randint(1, 3))
            flags = {"include_downstream": self.rng.random() < 0.5, "include_upstream": self.rng.random() < 0.3}
            logging.info("fault: clear %s of %s (was %s) %s", tasks, run_id, states[run_id], flags)
            self.rest(self.client.clear, TOPOLOGY, run_id, tasks, **flags)
            return True
        raise ValueError(f"unknown fault kind {kind!r}: one of {', '.join(KINDS)}")

    # -- the run -------------------------------------------------------------------------------

    def plan(self) -> dict[str, list[str]]:
        """The faults, balanced across kinds (each kind within one of the others), split into lanes.

        Faults in different lanes strike concurrently -- a Spark batch killed while another run's
        commit dies and the scheduler restarts -- as they would in production; the faults of one
        lane strike one after another.
        """
        cfg, kinds = self.cfg, list(self.cfg.kinds)
        plan = kinds * (cfg.faults // len(kinds)) + self.rng.sample(kinds, cfg.faults % len(kinds))
        self.rng.shuffle(plan)
        return {lane: [k for k in plan if k in members] for lane, members in LANES.items()}

    def lane(self, faults: list[str]) -> None:
        """Inject ``faults`` in order, spread over the run; a fault whose moment never came is queued
        again at the end (at most as many re-queues as the lane has faults), so a soak reaches the
        count of every kind it asks for."""
        queue, retried = list(faults), 0
        for j, kind in enumerate(queue):  # the queue grows as misses are re-queued
            at = ((j + 1) * self.cfg.transactions) // (len(faults) + 1)
            while len(self.runs) < at and not self.driving.is_set():
                time.sleep(0.5)
            if self.aborted.is_set():
                return
            if self.inject(kind):
                with self.counting:
                    self.report.faults[kind] = self.report.faults.get(kind, 0) + 1
                continue
            with self.counting:
                self.report.faults_missed[kind] = self.report.faults_missed.get(kind, 0) + 1
            if retried < len(faults):
                retried += 1
                queue.append(kind)

    def run(self) -> ChaosReport:
        cfg, started = self.cfg, time.monotonic()
        EventLog(self.stack.state_dsn, LOG).create(4)
        self.rest(self.client.wait_for_dag, TOPOLOGY)
        self.rest(self.client.unpause, TOPOLOGY)
        stop = threading.Event()
        producers = [Producer(self.stack.state_dsn, i, cfg, self.ledger, stop) for i in range(cfg.producers)]
        for p in producers:
            p.start()
        lanes = [threading.Thread(target=self.lane, args=(faults,), name=f"faults-{name}", daemon=True)
                 for name, faults in self.plan().items() if faults]
        driver = threading.Thread(target=self.drive, args=(lanes,), name="driver", daemon=True)
        supervisor = threading.Thread(target=self.supervisor, name="supervisor", daemon=True)
        try:
            supervisor.start()
            time.sleep(3)
            driver.start()
            for lane in lanes:
                lane.start()
            driver.join()  # it stops once every transaction is triggered and every fault injected
            self.driving.set()
            for lane in lanes:
                lane.join(600)
                if lane.is_alive():
                    self.report.problems.append(f"{lane.name} still injecting faults after ten minutes")
            stop.set()
            for p in producers:
                p.join(180)
                if p.error is not None:
                    self.report.problems.append(f"{p.name} failed: {p.error!r}")
            self.ledger.close()
            try:
                self.drain()
            except Exception as exc:  # the checks below still say what the state is
                logging.exception("drain failed")
                self.report.problems.append(f"drain failed: {exc!r}")
        finally:
            self.driving.set()
            self.aborted.set()
            stop.set()
            self.arm(None)
            self.supervise()
            self.finished.set()
            supervisor.join(60)
        self.check()
        self.report.wall_seconds = time.monotonic() - started
        return self.report

    def drive(self, lanes: list[threading.Thread]) -> None:
        """Keep the pipeline full while faults strike: trigger runs, supervise, clear failed runs.

        Runs are triggered past the planned count while faults are still to come: a fault needs a
        batch in flight or a commit under way to strike."""
        try:
            while True:
                faults_pending = any(lane.is_alive() for lane in lanes)
                if len(self.runs) >= self.cfg.transactions and not faults_pending:
                    return
                states = self.operate()
                active = sum(1 for s in states.values() if s in ("queued", "running"))
                if active <= self.cfg.max_in_flight:
                    self.trigger()
                time.sleep(2)  # every look lists all runs: the api-server's CPU is the system's too
        except Exception as exc:  # reported; the lanes wind down and the main thread drains
            logging.exception("driver failed")
            self.report.problems.append(f"driver failed: {exc!r}")
            self.aborted.set()

    def drain(self) -> None:
        """Trigger runs until every appended event is committed and every run finished.

        The producers have stopped: one more run, triggered now, plans the whole rest of the log
        as soon as an in-flight slot frees up, so the tail is not a series of one-at-a-time runs.
        """
        self.trigger()
        deadline = time.monotonic() + self.cfg.drain_timeout
        while time.monotonic() < deadline:
            states = self.operate()
            unfinished = [r for r, s in states.items() if s not in ("success", "failed")]
            failed = [r for r, s in states.items() if s == "failed"]
            if not unfinished and not failed:
                if self.lag() == 0:
                    break
                self.trigger()
            time.sleep(2)
        states = self.states()
        self.report.stuck_runs = sum(1 for s in states.values() if s != "success")
        lag = self.lag()
        if lag:
            self.report.problems.append(f"{lag} events never committed")
        self.report.transactions_triggered = len(states)

    # -- the checks ----------------------------------------------------------------------------

    def check(self) -> None:
        r, ledger = self.report, self.ledger
        r.events_appended = len(ledger.valid) + len(ledger.malformed)
        r.duplicate_deliveries, r.malformed_injected = ledger.duplicates, len(ledger.malformed)
        if r.post_mortem:
            # A run that never drained is checked on what it committed: the ledger's events that
            # the log put at or below the committed checkpoint (its own LSNs, not our processing).
            due = self.committed_event_ids()
            r.events_pending = r.events_appended - len(due & (set(ledger.valid) | ledger.malformed))
            ledger = ledger.restricted_to(due)
        with psycopg2.connect(self.stack.state_dsn) as conn, conn.cursor() as cur:
            cur.execute(sql.SQL("SELECT url, value FROM {}").format(sql.Identifier(f"{TOPOLOGY}_url_counts")))
            urls = {u: int(v) for u, v in cur.fetchall()}
            cur.execute(sql.SQL("SELECT domain, value FROM {}").format(sql.Identifier(f"{TOPOLOGY}_domain_counts")))
            domains = {d: int(v) for d, v in cur.fetchall()}
            cur.execute("SELECT txid FROM airflow_txn.commits WHERE topology_id = %s "
                        "ORDER BY committed_at, txid", (TOPOLOGY,))
            commit_order = [int(t) for (t,) in cur.fetchall()]
            cur.execute("SELECT event_id FROM airflow_txn.quarantine WHERE topology_id = %s AND committed",
                        (TOPOLOGY,))
            quarantined = Counter(e for (e,) in cur.fetchall())
        conn.close()
        want = ledger.url_counts()
        for url in set(want) | set(urls):
            diff = urls.get(url, 0) - want.get(url, 0)
            r.events_lost += max(0, -diff)
            r.events_duplicated += max(0, diff)
        want_domains = ledger.domain_counts()
        r.domain_mismatches = sum(1 for d in set(want_domains) | set(domains)
                                  if domains.get(d, 0) != want_domains.get(d, 0))
        r.transactions_committed = len(commit_order)
        r.order_violations = sum(1 for a, b in itertools.pairwise(commit_order) if b != a + 1)
        if commit_order and commit_order[0] != 1:
            r.order_violations += 1
        r.quarantine_mismatches = (sum(abs(quarantined[e] - 1) for e in ledger.malformed)
                                   + sum(n for e, n in quarantined.items() if e not in ledger.malformed))
        if self.cfg.audit:
            env = {**os.environ, "AIRFLOW_TXN_DSN": self.stack.state_dsn}
            res = subprocess.run([str(Path(sys.executable).with_name("airflow-txn")), "audit", TOPOLOGY],
                                 env=env, capture_output=True, text=True, check=False, timeout=900)
            r.audit_clean = res.returncode == 0
            if not r.audit_clean:
                r.problems.append("audit: " + (res.stdout + res.stderr)[-2000:])

    def committed_event_ids(self) -> set[str]:
        """The ids of the events at or below the topology's committed offsets, per partition."""
        with psycopg2.connect(self.stack.state_dsn) as conn, conn.cursor() as cur:
            cur.execute("SELECT committed_offsets FROM airflow_txn.topologies WHERE topology_id = %s", (TOPOLOGY,))
            row = cur.fetchone()
            offsets = {int(p): int(lsn) for p, lsn in (row[0] if row else {}).items()}
            cur.execute("SELECT partition, lsn, event_id FROM airflow_txn.log_events WHERE log_name = %s", (LOG,))
            due = {e for p, lsn, e in cur.fetchall() if lsn <= offsets.get(p, 0)}
        conn.close()
        return due


def recheck(base: Path, cfg: ChaosConfig) -> ChaosReport:
    """The checks of a finished (or abandoned) run, on its Postgres and its ledger alone."""
    stack = chaos_stack(base, cfg)
    stack.pg.start()
    try:
        chaos = Chaos(stack, cfg)
        chaos.ledger = Ledger.load(base / LEDGER)
        chaos.report.post_mortem = True
        chaos.check()
        return chaos.report
    finally:
        stack.pg.stop()


def chaos_stack(base: Path, cfg: ChaosConfig) -> LocalStack:
    dags = base / "dags"
    dags.mkdir(parents=True, exist_ok=True)
    write_dag(dags, cfg)
    return LocalStack(base, dags, env=faults.child_env({}, faults_file=str(base / "faults.txt")))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Exactly-once under faults: the chaos harness.")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="the size CI runs: 20 transactions, 10 faults")
    parser.add_argument("--transactions", type=int, help="transactions to trigger (default 200; quick 20)")
    parser.add_argument("--faults", type=int, help="faults to inject, balanced across kinds (default 400; quick 10)")
    parser.add_argument("--kinds", help=f"comma-separated fault kinds (default: all of {', '.join(KINDS)}; "
                        "quick: the ones that cost no restart)")
    parser.add_argument("--audit", action=argparse.BooleanOptionalAction, default=None,
                        help="run `airflow-txn audit` at the end (default: yes for the soak, no with --quick)")
    parser.add_argument("--dir", help="where to keep Postgres, Airflow, logs and the producers' ledger "
                        "(a new directory; default: a temp dir)")
    parser.add_argument("--check", metavar="DIR", help="only check the state a run left in DIR (its --dir) "
                        "against its ledger: for a run whose harness died")
    parser.add_argument("--json", help="also write the report here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    cfg = ChaosConfig.quick(args.seed) if args.quick else ChaosConfig(seed=args.seed)
    if args.audit is not None:
        cfg.audit = args.audit
    if args.kinds:
        cfg.kinds = tuple(k for k in args.kinds.split(",") if k)
    cfg.transactions = args.transactions or cfg.transactions
    cfg.faults = args.faults if args.faults is not None else cfg.faults
    unknown = set(cfg.kinds) - set(KINDS)
    if unknown:
        parser.error(f"unknown fault kinds {sorted(unknown)}: choose from {', '.join(KINDS)}")
    if args.check:
        base = Path(args.check).resolve()
        if not (base / LEDGER).exists():
            parser.error(f"{base} holds no {LEDGER}: --check takes the --dir of an earlier run")
        report = recheck(base, cfg)
        print(f"\nchaos --check {base}: the state and the audit log against the ledger "
              "(faults and stuck runs are not known after the fact)\n")
        print(report.table())
        return 1 if report.violations else 0
    base = Path(args.dir or tempfile.mkdtemp(prefix="chaos-")).resolve()
    if base.exists() and any(base.iterdir()):
        parser.error(f"{base} is not empty: give --dir a new directory (or --check {base} to check "
                     "the run it holds)")
    stack = chaos_stack(base, cfg)
    logging.info("chaos: Postgres, Airflow, logs and the producers' ledger in %s (--check %s re-checks it)",
                 base, base)
    try:
        stack.start()
        report = Chaos(stack, cfg).run()
    finally:
        stack.stop()
    print(f"\nchaos: seed {cfg.seed}, {cfg.transactions} transactions, {cfg.faults} faults "
          f"({', '.join(cfg.kinds)}); logs and ledger in {base}\n")
    print(report.table())
    if args.json:
        Path(args.json).write_text(json.dumps({**asdict(report), "violations": report.violations}, indent=2))
    return 1 if report.violations else 0


if __name__ == "__main__":
    raise SystemExit(main())
