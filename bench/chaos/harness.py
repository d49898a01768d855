"""One chaos run on a real stack: the producers append, a driver keeps runs triggered over REST
(the UI's API) and plays the operator (a failed run is cleared), the fault lanes strike, the
supervisor restarts what died; then the log is drained and the checks run. In payments mode the
driver triggers stage 1 (``payments``); stage 2 (``settlement``) follows its commits' asset
events, and both are operated, struck and drained alike. In kafka mode the producers send to a
Kafka topic in transactions, and the broker is struck too; in s3 mode they upload files to an S3
bucket, and the store is struck."""

from __future__ import annotations

import logging
import random
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from airflow_transactional import EventLog
from airflow_transactional.connections import CONNECTION_ERRORS
from airflow_transactional.coordinator import Coordinator
from airflow_transactional.core.lag import PATIENT
from dev import faults as engine
from dev.cluster import ClusterStack
from dev.localstack import AirflowStackError, LocalStack, RestClient
from dev.s3 import S3Server

from . import checker, kafka, objects, payments
from .config import LEDGER, LOG, ChaosConfig, ChaosReport, dag_env, write_dag
from .faults import Faults
from .supervisor import Supervisor, rest, riding_out
from .workload import Ledger, Producer

#: The drain's whole length, in windows of ``drain_timeout``: a pipeline that keeps moving but never
#: catches up is reported after this many.
DRAIN_CAP = 4


class Chaos:
    def __init__(self, stack: LocalStack, cfg: ChaosConfig) -> None:
        self.stack, self.cfg = stack, cfg
        self.client: RestClient = stack.client()
        self.report = ChaosReport(cfg.seed, mode=cfg.mode, stack=cfg.stack, backend=cfg.backend)
        self.ledger = Ledger(stack.base_dir / LEDGER)
        self.driven = cfg.topologies[0]
        self.runs: list[str] = []  # the runs of the driven topology triggered so far
        self.extra_runs = 0        # runs of the others triggered while draining
        self.day0 = datetime.now(UTC).replace(microsecond=0) - timedelta(days=2)
        self.supervisor = Supervisor(stack, self.report)
        # kafka: a producer transaction and a broker kill never overlap; s3: an upload and a server kill
        self.gate = threading.Lock()
        broker = (kafka.BrokerFaults(kafka.broker_of(stack), stack.state_dsn, self.supervisor.components, self.ledger,
                                     self.gate, random.Random(cfg.seed + 1), kafka.partitions_cap(cfg))
                  if cfg.mode == "kafka" else None)
        store = (objects.StoreFaults(objects.server_of(stack), stack.state_dsn, self.supervisor.components,
                                     self.ledger, self.gate, random.Random(cfg.seed + 2))
                 if cfg.mode == "s3" else None)
        self.faults = Faults(stack, cfg, self.report, self.supervisor, self.runs, self.states, broker, store,
                             self.ledger)

    # -- the operator --------------------------------------------------------------------------

    def lag(self, topology: str) -> int:
        """Events in the topology's source not yet committed (-1: a Kafka cluster did not say, even
        given the stall watch's patience -- not drained); rides out a Postgres restart."""
        def once() -> int:
            coord = Coordinator(self.stack.state_dsn)
            try:
                st = coord.status(topology, lag_wait=PATIENT)
                return st.lag if st.source_error is None else -1
            finally:
                coord.close()
        return int(riding_out(once, CONNECTION_ERRORS))

    def states(self) -> dict[tuple[str, str], str]:
        """(topology, run id) -> state, of every run of every topology under test."""
        return {(t, r["dag_run_id"]): r["state"] for t in self.cfg.topologies for r in rest(self.client.runs, t)}

    def operate(self) -> dict[tuple[str, str], str]:
        """One round of the operator's duties (clear failed runs); returns the runs' states."""
        states = self.states()
        for (dag_id, run_id), state in states.items():
            if state == "failed":
                logging.info("operator: run %s of %s failed; clearing its failed tasks", run_id, dag_id)
                rest(self.client.clear, dag_id, run_id, only_failed=True)
                self.report.operator_clears += 1
        return states

    def trigger(self, dag_id: str | None = None) -> None:
        """A run of the driven topology (a run of ``dag_id``, without a logical date, if given)."""
        if dag_id is None or dag_id == self.driven:
            dag_id, k = self.driven, len(self.runs)
            run_id, logical_date = f"chaos-{self.cfg.seed}-{k:04d}", (self.day0 + timedelta(minutes=k)).isoformat()
        else:
            self.extra_runs += 1
            run_id, logical_date = f"chaos-{self.cfg.seed}-{dag_id}-{self.extra_runs:04d}", None
        try:
            rest(self.client.trigger, dag_id, logical_date, run_id)
        except AirflowStackError as exc:
            # An api-server killed after it created the run but before it answered: the retried
            # POST finds the run already there. Anything else is a real error.
            if " -> 409" not in str(exc) or not rest(self.client.run, dag_id, run_id):
                raise
        if dag_id == self.driven:
            self.runs.append(run_id)

    # -- the run -------------------------------------------------------------------------------

    def run(self) -> ChaosReport:
        started = time.monotonic()
        stop = threading.Event()
        producers = self.set_up(stop)
        for p in producers:
            p.start()
        lanes = [threading.Thread(target=self.faults.lane, args=(kinds,), name=f"faults-{name}", daemon=True)
                 for name, kinds in self.faults.plan().items() if kinds]
        driver = threading.Thread(target=self.drive, args=(lanes,), name="driver", daemon=True)
        supervisor = threading.Thread(target=self.supervisor.loop, name="supervisor", daemon=True)
        try:
            supervisor.start()
            time.sleep(3)
            driver.start()
            for lane in lanes:
                lane.start()
            driver.join()  # it stops once every transaction is triggered and every fault injected
            self.faults.driving.set()
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
            self.faults.driving.set()
            self.faults.aborted.set()
            stop.set()
            self.faults.disarm()
            self.supervisor.supervise()
            self.supervisor.finished.set()
            supervisor.join(60)
        self.check()
        self.report.wall_seconds = time.monotonic() - started
        return self.report

    def set_up(self, stop: threading.Event) -> list[Producer] | list[kafka.TweetTransactions] | list[objects.Uploads]:
        """The mode's source and first runs; its producers (not started), which stop at ``stop``."""
        cfg, dsn = self.cfg, self.stack.state_dsn
        if isinstance(self.stack, ClusterStack) and cfg.backend == "connect":
            self.stack.start_spark_connect()  # on the cluster, an application of it, started on demand
        if cfg.mode == "s3":
            objects.setup(self.stack, self.client)
            s3 = objects.server_of(self.stack)
            return [objects.Uploads(s3, i, cfg, self.ledger, stop, self.gate) for i in range(cfg.producers)]
        if cfg.mode == "kafka":
            kafka.setup(self.stack, self.client)
            broker = kafka.broker_of(self.stack)
            return [kafka.TweetTransactions(broker, i, cfg, self.ledger, stop, self.gate) for i in range(cfg.producers)]
        if cfg.mode == "payments":
            payments.setup(self.stack, self.client, self.ledger)
            kind: type[Producer] = payments.PaymentsProducer
        else:
            EventLog(dsn, LOG).create(4)
            rest(self.client.wait_for_dag, self.driven)
            rest(self.client.unpause, self.driven)
            kind = Producer
        return [kind(dsn, i, cfg, self.ledger, stop) for i in range(cfg.producers)]

    def drive(self, lanes: list[threading.Thread]) -> None:
        """Keep the pipeline full while faults strike: trigger runs, clear failed runs.

        Runs are triggered past the planned count while faults are still to come: a fault needs a
        batch in flight or a commit under way to strike."""
        try:
            while True:
                faults_pending = any(lane.is_alive() for lane in lanes)
                if len(self.runs) >= self.cfg.transactions and not faults_pending:
                    return
                states = self.operate()
                active = sum(1 for (t, _), s in states.items() if t == self.driven and s in ("queued", "running"))
                if active <= self.cfg.max_in_flight:
                    self.trigger()
                time.sleep(2)  # every look lists all runs: the api-server's CPU is the system's too
        except Exception as exc:  # reported; the lanes wind down and the main thread drains
            logging.exception("driver failed")
            self.report.problems.append(f"driver failed: {exc!r}")
            self.faults.aborted.set()

    def drain(self) -> None:
        """Trigger runs until every appended event is committed by every topology and every run
        finished.

        The producers have stopped: one more run, triggered now, plans the whole rest of the log
        as soon as an in-flight slot frees up, so the tail is not a series of one-at-a-time runs.
        A downstream topology gets a run of its own only when it has none going and lags.

        A run is stuck when nothing moves, not when the machine is slow: the drain gives up after
        ``drain_timeout`` seconds in which no run changed state and no topology's lag changed, or
        after :data:`DRAIN_CAP` of those windows in all.
        """
        self.trigger()
        started = last_moved = time.monotonic()
        seen: tuple[dict[tuple[str, str], str], dict[str, int]] | None = None
        while (now := time.monotonic()) - last_moved < self.cfg.drain_timeout \
                and now - started < DRAIN_CAP * self.cfg.drain_timeout:
            states = self.operate()
            lags = {t: self.lag(t) for t in self.cfg.topologies}
            if (states, lags) != seen:
                seen, last_moved = (states, lags), now
            busy = {t for (t, _), s in states.items() if s != "success"}  # failed ones were just cleared
            if not busy:
                lagging = [t for t in self.cfg.topologies if lags[t]]
                if not lagging:
                    break
                self.trigger(lagging[0])
            time.sleep(2)
        states = self.states()
        self.report.stuck_runs = sum(1 for s in states.values() if s != "success")
        for topology in self.cfg.topologies:
            lag = self.lag(topology)
            if lag:
                self.report.problems.append(f"{lag} events never committed by {topology}" if lag > 0
                                            else f"the lag of {topology} is unknown at the end: its source did not say")
        self.report.transactions_triggered = sum(1 for t, _ in states if t == self.driven)

    def check(self) -> None:
        if self.stack.s3 is not None and self.stack.s3.link is not None:
            self.report.slow_gets = self.stack.s3.link.held
        checker.check(self.stack.state_dsn, self.cfg, self.report, self.ledger, self.stack.dags_folder,
                      self.stack.kafka)


def chaos_stack(base: Path, cfg: ChaosConfig) -> LocalStack:
    """The stack of a run in ``base``: the chaos topology deployed, the fault engine in every process."""
    dags = base / "dags"
    dags.mkdir(parents=True, exist_ok=True)
    write_dag(dags, cfg)
    env = engine.child_env(dag_env(cfg), faults_file=str(base / "faults.txt"))
    s3 = S3Server(base / "s3", link=True) if cfg.mode == "s3" else False  # the store's faults need its link
    if cfg.stack == "cluster":  # two Celery workers of three slots, a master and two one-core Spark workers
        return ClusterStack(base, dags, env=env, kafka=cfg.mode == "kafka", spark_connect=cfg.backend == "connect",
                            s3=s3)
    return LocalStack(base, dags, env=env, kafka=cfg.mode == "kafka", spark_connect=cfg.backend == "connect", s3=s3)


def recheck(base: Path, cfg: ChaosConfig) -> ChaosReport:
    """The checks of a finished (or abandoned) run, on its Postgres and its ledger alone."""
    stack = chaos_stack(base, cfg)
    stack.pg.start()
    try:
        report = ChaosReport(cfg.seed, post_mortem=True)
        checker.check(stack.state_dsn, cfg, report, Ledger.load(base / LEDGER), stack.dags_folder)
        return report
    finally:
        stack.pg.stop()
