"""One chaos run on a real stack: the producers append, a driver keeps runs triggered over REST
(the UI's API) and plays the operator (a failed run is cleared), the fault lanes strike, the
supervisor restarts what died; then the log is drained and the checks run."""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from airflow_transactional import EventLog
from airflow_transactional.coordinator import Coordinator
from airflow_transactional.store.connection import CONNECTION_ERRORS
from dev import faults as engine
from dev.localstack import AirflowStackError, LocalStack, RestClient

from . import checker
from .config import LEDGER, LOG, TOPOLOGY, ChaosConfig, ChaosReport, write_dag
from .faults import Faults
from .supervisor import Supervisor, rest, riding_out
from .workload import Ledger, Producer


class Chaos:
    def __init__(self, stack: LocalStack, cfg: ChaosConfig) -> None:
        self.stack, self.cfg = stack, cfg
        self.client: RestClient = stack.client()
        self.report = ChaosReport(cfg.seed)
        self.ledger = Ledger(stack.base_dir / LEDGER)
        self.runs: list[str] = []
        self.day0 = datetime.now(UTC).replace(microsecond=0) - timedelta(days=2)
        self.supervisor = Supervisor(stack, self.report)
        self.faults = Faults(stack, cfg, self.report, self.supervisor, self.runs, self.states)

    # -- the operator --------------------------------------------------------------------------

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
        return {r["dag_run_id"]: r["state"] for r in rest(self.client.runs, TOPOLOGY)}

    def operate(self) -> dict[str, str]:
        """One round of the operator's duties (clear failed runs); returns the runs' states."""
        states = self.states()
        for run_id, state in states.items():
            if state == "failed":
                logging.info("operator: run %s failed; clearing its failed tasks", run_id)
                rest(self.client.clear, TOPOLOGY, run_id, only_failed=True)
                self.report.operator_clears += 1
        return states

    def trigger(self) -> None:
        k = len(self.runs)
        run_id = f"chaos-{self.cfg.seed}-{k:04d}"
        try:
            rest(self.client.trigger, TOPOLOGY, (self.day0 + timedelta(minutes=k)).isoformat(), run_id)
        except AirflowStackError as exc:
            # An api-server killed after it created the run but before it answered: the retried
            # POST finds the run already there. Anything else is a real error.
            if " -> 409" not in str(exc) or not rest(self.client.run, TOPOLOGY, run_id):
                raise
        self.runs.append(run_id)

    # -- the run -------------------------------------------------------------------------------

    def run(self) -> ChaosReport:
        cfg, started = self.cfg, time.monotonic()
        EventLog(self.stack.state_dsn, LOG).create(4)
        rest(self.client.wait_for_dag, TOPOLOGY)
        rest(self.client.unpause, TOPOLOGY)
        stop = threading.Event()
        producers = [Producer(self.stack.state_dsn, i, cfg, self.ledger, stop) for i in range(cfg.producers)]
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
            self.faults.arm(None)
            self.supervisor.supervise()
            self.supervisor.finished.set()
            supervisor.join(60)
        self.check()
        self.report.wall_seconds = time.monotonic() - started
        return self.report

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
                active = sum(1 for s in states.values() if s in ("queued", "running"))
                if active <= self.cfg.max_in_flight:
                    self.trigger()
                time.sleep(2)  # every look lists all runs: the api-server's CPU is the system's too
        except Exception as exc:  # reported; the lanes wind down and the main thread drains
            logging.exception("driver failed")
            self.report.problems.append(f"driver failed: {exc!r}")
            self.faults.aborted.set()

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

    def check(self) -> None:
        checker.check(self.stack.state_dsn, self.cfg, self.report, self.ledger)


def chaos_stack(base: Path, cfg: ChaosConfig) -> LocalStack:
    """The stack of a run in ``base``: the chaos topology deployed, the fault engine in every process."""
    dags = base / "dags"
    dags.mkdir(parents=True, exist_ok=True)
    write_dag(dags, cfg)
    return LocalStack(base, dags, env=engine.child_env({}, faults_file=str(base / "faults.txt")))


def recheck(base: Path, cfg: ChaosConfig) -> ChaosReport:
    """The checks of a finished (or abandoned) run, on its Postgres and its ledger alone."""
    stack = chaos_stack(base, cfg)
    stack.pg.start()
    try:
        report = ChaosReport(cfg.seed, post_mortem=True)
        checker.check(stack.state_dsn, cfg, report, Ledger.load(base / LEDGER))
        return report
    finally:
        stack.pg.stop()
