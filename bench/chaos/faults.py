"""The faults: seeded and balanced across kinds, split into lanes that strike side by side, each
fault at a moment worth breaking (a Spark batch in the middle, a commit about to COMMIT).

Commit faults are armed in the running tasks through the fault engine's file
(``dev/faults.py``); the others are done from here: a SIGKILL, a Postgres restart, a component
killed and restarted, a clear over REST -- in kafka mode the broker's (``kafka.py``), in s3 mode the
store's (``objects.py``)."""

from __future__ import annotations

import logging
import random
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from dev import faults as engine
from dev.cluster import ClusterStack, kill_tree
from dev.localstack import SPARK_CONNECT, AirflowStackError, LocalStack, RestClient, listening

from .config import (
    CLUSTER_KINDS,
    CONNECT_KINDS,
    CORRECTION_KINDS,
    KAFKA_KINDS,
    KINDS,
    LANES,
    OBJECT_KINDS,
    TASKS,
    ChaosConfig,
    ChaosReport,
)
from .kafka import BrokerFaults
from .objects import StoreFaults
from .operator import Operator
from .processes import connect_client, python_workers, spark_driver
from .supervisor import Supervisor, rest
from .workload import Ledger


class Faults:
    """The fault lanes of one run. ``runs`` is the list of runs triggered so far (it grows);
    ``states`` answers the states of every topology's runs. A fault strikes any of the run's
    topologies (in payments mode either stage)."""

    def __init__(self, stack: LocalStack, cfg: ChaosConfig, report: ChaosReport, supervisor: Supervisor,
                 runs: list[str], states: Callable[[], dict[tuple[str, str], str]],
                 broker: BrokerFaults | None = None, store: StoreFaults | None = None,
                 ledger: Ledger | None = None) -> None:
        self.stack, self.cfg, self.report, self.supervisor = stack, cfg, report, supervisor
        self.broker = broker  # kafka mode: the broker's faults
        self.store = store    # s3 mode: the store's
        self.runs, self.states = runs, states
        self.rng = random.Random(cfg.seed)
        self.operator = Operator(stack, cfg, stack.client(), ledger, random.Random(cfg.seed + 3))
        self.client: RestClient = stack.client()
        self.file = Path(stack.extra_env[engine.FILE_ENV])
        self.markers = stack.base_dir / "chaos-markers"
        self.markers.mkdir(exist_ok=True)
        self.counting = threading.Lock()
        self.armed: dict[str, str] = {}  # lane -> the fault point it has armed (lanes arm side by side)
        self.driving = threading.Event()  # set when the run winds down: lanes stop waiting for their turn
        self.aborted = threading.Event()  # set when the driver died: lanes strike no more faults

    def plan(self) -> dict[str, list[str]]:
        """The faults, balanced across kinds (each kind within one of the others), split into lanes.

        Faults in different lanes strike concurrently -- a Spark batch killed while another run's
        commit dies and the scheduler restarts -- as they would in production; the faults of one
        lane strike one after another.
        """
        cfg, kinds = self.cfg, list(self.cfg.kinds)
        if not kinds or not cfg.faults:  # a run without faults (the latency benchmark)
            return {}
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
            try:
                struck = self.inject(kind)
            except Exception as exc:  # reported, and the lane goes on: a silent dead lane strikes nothing
                logging.exception("fault %s failed", kind)
                with self.counting:
                    self.report.problems.append(f"fault {kind} failed: {exc!r}")
                continue
            if struck:
                with self.counting:
                    self.report.faults[kind] = self.report.faults.get(kind, 0) + 1
                continue
            with self.counting:
                self.report.faults_missed[kind] = self.report.faults_missed.get(kind, 0) + 1
            if retried < len(faults):
                retried += 1
                queue.append(kind)

    def inject(self, kind: str) -> bool:
        """Inject one fault of ``kind``; False if its moment never came (counted as missed)."""
        logging.info("fault: %s", kind)
        if kind in ("spark_kill", "pg_restart_processing"):
            return self._spark(kind)
        if kind in ("commit_kill_before", "commit_kill_after", "pg_restart_commit", "kafka_kill_commit"):
            return self._commit(kind)
        if kind in KAFKA_KINDS:
            return self._kafka(kind)
        if kind in OBJECT_KINDS:
            return self._objects(kind)
        if kind in CLUSTER_KINDS:
            return self._cluster(kind)
        if kind == "spark_connect_kill":
            return self._lose_spark_connect()
        if kind in ("scheduler_restart", "api_restart"):
            name = "scheduler" if kind == "scheduler_restart" else "api-server"
            with self.supervisor.components:
                self.stack.stop_component(name, signal.SIGKILL)
                time.sleep(self.rng.uniform(1, 5))
                self.stack.start_component(name)
            return True
        if kind == "clear":
            return self._clear()
        if kind == "correct":
            return self.operator.correct()
        if kind == "replay":
            return self.operator.replay()
        every = KINDS + KAFKA_KINDS + OBJECT_KINDS + CLUSTER_KINDS + CONNECT_KINDS + CORRECTION_KINDS
        raise ValueError(f"unknown fault kind {kind!r}: one of {', '.join(every)}")

    def batch(self) -> psutil.Process | None:
        """The process of a batch under way, if one is: its spark-submit driver JVM, or with
        ``--backend connect`` the job's Spark Connect client."""
        return (connect_client if self.cfg.backend == "connect" else spark_driver)(self.cfg.topologies)

    def arm(self, line: str | None, lane: str = "commit") -> None:
        """Arm one fault point in every running task for ``lane`` (None: disarm the lane's; the
        other lanes' stay armed)."""
        with self.counting:
            if line:
                self.armed[lane] = line
            else:
                self.armed.pop(lane, None)
            self.file.write_text("".join(f"{armed}\n" for armed in self.armed.values()))

    def disarm(self) -> None:
        """Every lane's fault point disarmed (the run is over)."""
        with self.counting:
            self.armed.clear()
            self.file.write_text("")

    # -- the kinds -----------------------------------------------------------------------------

    def _spark(self, kind: str) -> bool:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:  # until a batch is caught in the middle
            driver = wait_for(self.batch, deadline - time.monotonic())
            if driver is None:
                return False
            time.sleep(self.rng.uniform(1, 5))
            if not driver.is_running():
                continue
            if kind == "spark_kill":
                what = self._kill_spark(driver)
                if what is None:
                    continue
                with self.counting:
                    self.report.spark_kill_targets[what] = self.report.spark_kill_targets.get(what, 0) + 1
            else:
                with self.supervisor.components:
                    self.stack.pg.restart("fast")
            return True
        return False

    def _kill_spark(self, driver: psutil.Process) -> str | None:
        """SIGKILL the driver JVM (driver and executors: local mode runs both in it) or, half the
        time when there is one, a Python worker of the executors. Returns what was killed."""
        workers = python_workers(driver) if self.rng.random() < 0.5 else []
        batch = "Spark Connect client" if self.cfg.backend == "connect" else "driver JVM"
        target, what = (self.rng.choice(workers), "python worker") if workers else (driver, batch)
        try:
            target.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            return None
        logging.info("fault: spark_kill: SIGKILLed the %s (pid %d)", what, target.pid)
        return what

    def _commit(self, kind: str) -> bool:
        marker = self.markers / f"{kind}-{time.monotonic_ns()}"
        point, action = {"commit_kill_before": ("commit.before_commit", "exit"),
                         "commit_kill_after": ("commit.after_commit", "exit"),
                         "pg_restart_commit": ("commit.after_apply", "pause:6"),
                         "kafka_kill_commit": ("commit.after_apply", "pause:6")}[kind]
        topology = self.rng.choice(self.cfg.topologies)
        self.arm(f"{point}:{topology}={action}@once:{marker}")
        try:
            if not wait_for(marker.exists, 180):
                return False
        finally:
            self.arm(None)
        if kind == "pg_restart_commit":
            time.sleep(1)  # the commit holds its transaction open for six seconds
            with self.supervisor.components:
                self.stack.pg.restart("fast")
        elif kind == "kafka_kill_commit":
            time.sleep(1)
            self._broker().kill_and_restart()
        return True

    def _broker(self) -> BrokerFaults:
        if self.broker is None:
            raise ValueError("the kafka fault kinds need --mode kafka (a topology that reads the broker)")
        return self.broker

    def _kafka(self, kind: str) -> bool:
        """The broker killed while a batch is processed; records deleted under a plan; a partition added."""
        broker = self._broker()
        if kind == "kafka_kill_processing":
            if wait_for(self.batch, 240) is None:
                return False
            time.sleep(self.rng.uniform(1, 4))  # the batch's reading under way
            broker.kill_and_restart()
            return True
        if kind == "delete_records":
            return broker.delete_under_a_plan()
        return broker.add_partition()

    def _objects(self, kind: str) -> bool:
        """The S3 server killed while a batch is processed; a planned file overwritten or deleted;
        object reads slowed down, from a moment a batch runs."""
        if self.store is None:
            raise ValueError("the store's fault kinds need --mode s3 (a topology that reads the S3 server)")
        if kind in ("object_overwrite", "object_delete"):
            return self.store.mutate(kind.removeprefix("object_"))
        if wait_for(self.batch, 240) is None:
            return False
        if kind == "slow_get":
            self.store.slow()
            return True
        time.sleep(self.rng.uniform(1, 4))  # the batch's reading under way
        self.store.kill_and_restart()
        return True

    def _cluster(self, kind: str) -> bool:
        """A cluster's own faults (``--stack cluster``): a Celery worker lost with the batch or the
        commit it runs, a Spark worker lost with an executor, the Spark master restarted under a
        batch, Redis restarted whatever is queued."""
        cluster = self.stack
        if not isinstance(cluster, ClusterStack):
            raise ValueError(f"fault kind {kind} needs a cluster: --stack cluster")
        if kind == "celery_kill_processing":
            driver = wait_for(self.batch, 240)
            if driver is None:
                return False
            time.sleep(self.rng.uniform(1, 4))  # the batch under way
            return driver.is_running() and self._lose_celery_worker(cluster, driver.pid)
        if kind == "celery_kill_commit":
            held = self._hold_a_commit()
            return held is not None and self._lose_celery_worker(cluster, held)
        if kind == "spark_worker_kill":
            busy = wait_for(lambda: [k for k, n in cluster.spark.executors().items() if n], 240)
            if not busy:
                return False
            worker = self.rng.choice(busy)
            cluster.spark.kill_worker(worker)
            time.sleep(self.rng.uniform(1, 5))
            cluster.spark.start_worker(worker)
            logging.info("fault: spark_worker_kill: Spark worker %d lost with its executor, started again", worker)
            return True
        if kind == "spark_master_restart":
            return self._restart_master(cluster)
        with self.supervisor.components:
            cluster.redis.restart()
        return True

    def _restart_master(self, cluster: ClusterStack) -> bool:
        """The Spark master restarted while a batch's driver runs: it recovers its workers and
        applications (its recovery directory), and the driver goes on."""
        if wait_for(self.batch, 240) is None:
            return False
        time.sleep(self.rng.uniform(1, 4))  # the batch under way
        with self.supervisor.components:
            cluster.spark.restart_master()
        logging.info("fault: spark_master_restart: the master restarted under a batch, and recovered")
        return True

    def _lose_spark_connect(self) -> bool:
        """The Spark Connect server's host lost under a batch (its JVM, the driver of every
        session, SIGKILLed), and the server started again a few seconds later."""
        if wait_for(self.batch, 240) is None:
            return False
        time.sleep(self.rng.uniform(1, 5))  # the batch's queries under way
        with self.supervisor.components:
            proc = self.stack.procs.pop(SPARK_CONNECT)
            kill_tree(proc.pid)
            proc.wait(10)
            time.sleep(self.rng.uniform(1, 4))
            self.stack.start_component(SPARK_CONNECT)
            if not wait_for(lambda: listening(self.stack.spark_connect_port or 0), 180):
                raise AirflowStackError("the Spark Connect server did not serve again within 180 s")
        logging.info("fault: spark_connect_kill: the Spark Connect server lost under a batch, started again")
        return True

    def _hold_a_commit(self) -> int | None:
        """Hold a commit inside its Postgres transaction; the pid of the task process holding it."""
        marker = self.markers / f"celery-commit-{time.monotonic_ns()}"
        topology = self.rng.choice(self.cfg.topologies)
        self.arm(f"commit.after_apply:{topology}=pause:8@once:{marker}")
        try:
            pid = wait_for(lambda: marker.exists() and marker.read_text().strip(), 180)
        finally:
            self.arm(None)
        return int(pid) if pid else None

    def _lose_celery_worker(self, cluster: ClusterStack, pid: int) -> bool:
        """The Celery worker whose process tree holds ``pid`` lost with its host (the worker, its
        tasks and the Spark drivers they started, SIGKILLed at once), and a replacement started."""
        worker = cluster.worker_of(pid)
        if worker is None:
            return False
        with self.supervisor.components:
            cluster.kill_worker(worker)
            time.sleep(self.rng.uniform(1, 5))
            cluster.start_component(worker)
            cluster.wait_worker(worker)
        logging.info("fault: lost Celery %s (pid %d in its tree), started again", worker, pid)
        return True

    def _clear(self) -> bool:
        states = self.states()
        if not states:
            return False
        dag_id, run_id = self.rng.choice(sorted(states))
        tasks = self.rng.sample(TASKS, self.rng.randint(1, 3))
        flags = {"include_downstream": self.rng.random() < 0.5, "include_upstream": self.rng.random() < 0.3}
        logging.info("fault: clear %s of %s of %s (was %s) %s", tasks, run_id, dag_id, states[dag_id, run_id], flags)
        rest(self.client.clear, dag_id, run_id, tasks, **flags)
        return True


def wait_for(predicate: Callable[[], Any], timeout: float) -> Any:
    """What ``predicate`` returns once it is truthy, or None after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.3)
    return None
