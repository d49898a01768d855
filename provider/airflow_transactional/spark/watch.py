"""A driver left without executors while its work waits, failed instead of left waiting.

On a Spark standalone cluster a driver can lose every executor and get none back: a master
restarted in recovery mode that turned the application's executor away ("state transfer from
RUNNING to RUNNING is illegal" in its log), workers gone for good, or executors asked for more
than any worker has. Spark then waits for executors for ever -- and the process task with it,
and every txid behind it. :class:`ExecutorWatch` looks every few seconds: once the driver has had
no executor for ``patience`` seconds while a job of its runs, it cancels its jobs, so the job file
fails with the reason, the task fails, and Airflow's retry starts a new driver. (A master lost
outright is the process task's watch: ``airflow/operators/masterwatch.py``.)

It watches drivers of ``spark://`` masters (YARN and Kubernetes queue applications for capacity,
which is no fault); ``AIRFLOW_TXN_NO_EXECUTOR_TIMEOUT`` sets the patience in seconds (0: no watch).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from ..exceptions import ConfigError, TransactionalError
from .handoff import is_remote

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["PATIENCE", "PATIENCE_ENV", "ExecutorWatch", "NoExecutors", "watched"]

log = logging.getLogger(__name__)

PATIENCE_ENV = "AIRFLOW_TXN_NO_EXECUTOR_TIMEOUT"
#: How long a driver may run a job with no executor (seconds): longer than a worker's restart
#: and an executor's launch take, far shorter than waiting for ever.
PATIENCE = 600.0
INTERVAL = 5.0


class NoExecutors(TransactionalError):
    """The driver had no executor for the watch's patience while a job of its ran."""


def patience_from_env() -> float:
    raw = os.environ.get(PATIENCE_ENV, "").strip()
    if not raw:
        return PATIENCE
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:  # not a number, negative, or NaN
        raise ConfigError(f"{PATIENCE_ENV} is seconds (0 turns the watch off), got {raw!r}")
    return value


class ExecutorWatch:
    """Watches one classic session's driver (:meth:`start`, :meth:`stop`); :attr:`gave_up` says why
    it cancelled the jobs, once it has."""

    def __init__(self, spark: SparkSession, patience: float, interval: float = INTERVAL) -> None:
        self.sc = spark.sparkContext
        self.patience, self.interval = patience, interval
        self.gave_up: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="airflow-txn-executor-watch", daemon=True)

    @staticmethod
    def applies(spark: SparkSession) -> bool:
        """Whether ``spark`` is a classic session on a standalone master."""
        return not is_remote(spark) and str(spark.sparkContext.master or "").startswith("spark://")

    def start(self) -> ExecutorWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self.interval + 5)

    def executors(self) -> int:
        """The executors the driver has now (the driver is not one)."""
        return max(0, int(self.sc._jsc.sc().getExecutorMemoryStatus().size()) - 1)

    def _run(self) -> None:
        since: float | None = None
        while not self._stop.wait(self.interval):
            try:
                waiting = bool(self.sc.statusTracker().getActiveJobsIds()) and self.executors() == 0
            except Exception as exc:  # the context stopping under it: nothing left to watch
                log.debug("executor watch: %s", exc)
                return
            now = time.monotonic()
            since = (since or now) if waiting else None
            if since is not None and now - since >= self.patience:
                self.gave_up = (f"the driver had no executor for {now - since:.0f} s while its job ran (master "
                                f"{self.sc.master}): the cluster lost its executors and gave none back (a restarted "
                                "master, workers gone, or executors asked for more than a worker has) -- its jobs "
                                "are cancelled so that a retry starts a new driver; see the master's log "
                                f"({PATIENCE_ENV} sets the patience in seconds)")
                log.error("%s", self.gave_up)
                self.sc.cancelAllJobs()
                return


@contextmanager
def watched(spark: SparkSession, patience: float | None = None) -> Iterator[ExecutorWatch | None]:
    """Run the block with ``spark``'s driver watched (a standalone master's; patience from
    :data:`PATIENCE_ENV` unless given): the block's failure after the watch cancelled its jobs is
    :class:`NoExecutors`, with the reason."""
    patience = patience_from_env() if patience is None else patience
    watch = ExecutorWatch(spark, patience).start() if patience > 0 and ExecutorWatch.applies(spark) else None
    try:
        yield watch
    except Exception as exc:
        if watch is not None and watch.gave_up:
            raise NoExecutors(watch.gave_up) from exc
        raise
    finally:
        if watch is not None:
            watch.stop()
