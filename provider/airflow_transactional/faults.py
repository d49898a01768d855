"""Named fault-injection points, used by the crash-point tests and the chaos harness.

Code calls ``faults.point("commit.after_apply", cur)`` at each step worth breaking. Nothing
happens unless a fault is armed, either in-process (:func:`inject`) or for a child process via
``AIRFLOW_TXN_FAULTS="commit.after_apply=exit"`` (several separated by commas). Actions:

* ``exit``      -- the process dies on the spot (``os._exit``), like a SIGKILL;
* ``terminate`` -- the server drops this connection (``pg_terminate_backend``);
* ``raise``     -- an InjectedFault exception;
* ``pause:S``   -- sleep S seconds (to hold a transaction open while others run).

``name=action@N`` fires only the first N times in this process.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

ENV = "AIRFLOW_TXN_FAULTS"

_armed: dict[str, list[Any]] = {}  # name -> [action, remaining or None]
_env_loaded = False


class InjectedFault(RuntimeError):
    """Raised by a ``raise`` fault."""


def _load_env() -> None:
    global _env_loaded
    _env_loaded = True
    for item in filter(None, (os.environ.get(ENV) or "").split(",")):
        name, _, action = item.strip().partition("=")
        _arm(name, action or "exit")


def _arm(name: str, action: str) -> None:
    action, _, count = action.partition("@")
    _armed[name] = [action, int(count) if count else None]


def point(name: str, cur: Any = None) -> None:
    """A place where a fault may be injected."""
    if not _env_loaded:
        _load_env()
    entry = _armed.get(name)
    if entry is None:
        return
    action, remaining = entry
    if remaining is not None:
        if remaining <= 0:
            return
        entry[1] = remaining - 1
    if action == "exit":
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(137)
    if action == "terminate":
        if cur is None:
            raise InjectedFault(f"fault point {name} has no connection to terminate")
        cur.execute("SELECT pg_terminate_backend(pg_backend_pid())")
        return
    if action == "raise":
        raise InjectedFault(name)
    if action.startswith("pause:"):
        time.sleep(float(action.split(":", 1)[1]))
        return
    raise ValueError(f"unknown fault action {action!r} at {name}: use exit, terminate, raise or pause:S")


@contextmanager
def inject(name: str, action: str) -> Iterator[None]:
    """Arm a fault in this process for the duration of a block."""
    if not _env_loaded:
        _load_env()
    _arm(name, action)
    try:
        yield
    finally:
        _armed.pop(name, None)
