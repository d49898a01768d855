"""A driver whose Spark standalone master is gone for good, failed instead of left waiting.

A standalone master restarted without a recovery mode forgets its applications: a driver running
at the restart logs "Disconnected from Spark cluster! Waiting for reconnection..." and waits for
executors for ever. A master with one (or a standby taking over) tells the driver "Master has
changed" within seconds. :class:`MasterWatch` reads the driver's output: when no master has taken
the driver back ``timeout`` seconds after it lost one, it kills spark-submit, so the task fails
and its retry starts a new driver, which registers with whatever master now runs."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

DISCONNECTED = "Disconnected from Spark cluster! Waiting for reconnection"
RECONNECTED = "Master has changed, new master is at"
#: How long a driver may wait for a master to take it back (``[transactional] master_lost_timeout``,
#: seconds): a restarted master with recovery, or a ZooKeeper standby, does so in seconds to a minute.
TIMEOUT = 120.0


class TaskLog(Protocol):
    """What the watch says through: a task's logger."""

    def info(self, msg: Any, /, *args: Any) -> Any: ...
    def warning(self, msg: Any, /, *args: Any) -> Any: ...
    def error(self, msg: Any, /, *args: Any) -> Any: ...


class MasterWatch:
    """Feed it every line of a driver's output (:meth:`see`); :meth:`stop` when the driver ends."""

    def __init__(self, kill: Callable[[], None], log: TaskLog, timeout: float = TIMEOUT) -> None:
        self.kill, self.log, self.timeout = kill, log, timeout
        self.gave_up = False
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()

    def see(self, line: str) -> None:
        with self._lock:
            if DISCONNECTED in line and self._timer is None:
                self.log.warning("the driver lost its Spark master; waiting up to %.0f s for a master to take it "
                                 "back", self.timeout)
                self._timer = threading.Timer(self.timeout, self._give_up)
                self._timer.daemon = True
                self._timer.start()
            elif RECONNECTED in line and self._timer is not None:
                self._timer.cancel()
                self._timer = None
                self.log.info("a Spark master took the driver back (it recovered the application); the batch goes on")

    def stop(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

    def _give_up(self) -> None:
        with self._lock:
            if self._timer is None:  # taken back meanwhile
                return
            self._timer = None
            self.gave_up = True
        self.log.error("no Spark master took the driver back within %.0f s of losing its own: killing spark-submit, "
                       "so that this try fails and the retry starts a new driver. A master restarted without a "
                       "recovery mode forgets its applications: run it with spark.deploy.recoveryMode (FILESYSTEM "
                       "or ZOOKEEPER)", self.timeout)
        self.kill()
