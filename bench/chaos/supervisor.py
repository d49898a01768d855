"""What systemd or Kubernetes does for a deployment, in a thread of its own: look every two
seconds, restart what died (Postgres, an Airflow component). And the harness's way of calling a
component that may be down meanwhile: try again until the supervisor has brought it back."""

from __future__ import annotations

import http.client
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from dev.localstack import COMPONENTS, SPARK_CONNECT, AirflowStackError, LocalStack

from .config import ChaosReport


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


def rest(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """A REST call that rides out an api-server restart (the supervisor brings it back); an answer
    of 4xx is final."""
    return riding_out(lambda: fn(*args, **kwargs), (OSError, http.client.HTTPException, AirflowStackError),
                      final=lambda exc: isinstance(exc, AirflowStackError) and " -> 4" in str(exc))


class Supervisor:
    def __init__(self, stack: LocalStack, report: ChaosReport) -> None:
        self.stack, self.report = stack, report
        self.components = threading.Lock()  # held by a fault restarting a component: never both at once
        self.finished = threading.Event()  # set at the very end: the loop stops

    def supervise(self) -> None:
        """Restart what died: Postgres, or an Airflow component (a Postgres restart can take the
        scheduler down), or a Celery worker."""
        with self.components:
            if not self.stack.pg.is_running():
                logging.info("supervisor: Postgres is down; starting it")
                self.stack.pg.start()
                self.report.component_restarts += 1
            # Airflow's components, on a cluster its Celery workers, and the Spark Connect server the
            # run started (a server it did not start is not the supervisor's).
            ours = [c for c in self.stack.components if c in COMPONENTS or c.startswith("worker-")
                    or (c == SPARK_CONNECT and c in self.stack.procs)]
            for name in ours:
                proc = self.stack.procs.get(name)
                if proc is None or proc.poll() is not None:
                    logging.info("supervisor: %s is down; restarting it", name)
                    self.stack.procs.pop(name, None)
                    self.stack.start_component(name)
                    self.report.component_restarts += 1

    def loop(self) -> None:
        """Look every two seconds until :attr:`finished`. Runs in a thread of its own, never in one
        that may be waiting for the very component it would restart."""
        while not self.finished.wait(2):
            try:
                self.supervise()
            except Exception:  # a restart that failed is tried again at the next look
                logging.exception("supervisor: a restart failed; trying again")
