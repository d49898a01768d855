"""The fault engine of the crash-point tests and the chaos harness (never installed with the
provider).

The provider calls ``faults.point("commit.after_apply", cur)`` at each step worth breaking
(:mod:`airflow_transactional.faults`); those points do nothing unless this engine is installed:
in-process by :func:`inject`, or when a process starts, by ``AIRFLOW_TXN_FAULT_ENGINE=dev.faults``
(:func:`child_env` gives a child process what it needs). Faults are armed in-process
(:func:`inject`) or for a child process via ``AIRFLOW_TXN_FAULTS="commit.after_apply=exit"``
(several separated by commas). Actions:

* ``exit``      -- the process dies on the spot (``os._exit``), like a SIGKILL -- except in Airflow's
  triggerer, which runs every DAG's triggers: there it raises (the chaos harness loses a
  triggerer by killing it, as a host that is gone);
* ``terminate`` -- the server drops this connection (``pg_terminate_backend``);
* ``raise``     -- an InjectedFault exception;
* ``pause:S``   -- sleep S seconds (to hold a transaction open while others run);
* ``waitfor:PATH`` -- wait until PATH exists (at most ten minutes): a test releases it (and knows
  the process is waiting once ``PATH.waiting`` exists).

``name=action@N`` fires only the first N times in this process; ``name=action@once:PATH`` fires
once across all processes (the first to create PATH fires, and writes its pid there: the chaos
harness finds the host of a held commit by it).

A point may be *scoped*: ``point("spark.begin", scope=("words", "7"))`` also answers to
``spark.begin:words`` and ``spark.begin:words:7``. Faults can be armed while processes run by
writing them, one per line, to the file named by ``AIRFLOW_TXN_FAULTS_FILE`` (re-read when it
changes) -- how the end-to-end tests break one txid of a running Airflow.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from airflow_transactional import faults as points

ENV = "AIRFLOW_TXN_FAULTS"
FILE_ENV = "AIRFLOW_TXN_FAULTS_FILE"
#: What a process needs of its environment to run this engine (a Spark Connect server keeps them).
KEEP = (points.ENGINE_ENV, ENV, FILE_ENV)
ROOT = Path(__file__).resolve().parent.parent  # where ``dev`` is importable from

_armed: dict[str, list[Any]] = {}  # name -> [action, remaining: int | "once:PATH" | None]
_from_file: dict[str, list[Any]] = {}
_file_stamp: tuple[float, int] | None = None
_env_loaded = False


class InjectedFault(RuntimeError):
    """Raised by a ``raise`` fault."""


def _load_env() -> None:
    global _env_loaded
    _env_loaded = True
    for item in filter(None, (os.environ.get(ENV) or "").split(",")):
        name, _, action = item.strip().partition("=")
        _arm(name, action or "exit")


def _parse(action: str) -> list[Any]:
    action, _, count = action.partition("@")
    if count.startswith("once:"):
        return [action, count]
    return [action, int(count) if count else None]


def _arm(name: str, action: str) -> None:
    _armed[name] = _parse(action)


def _refresh_file() -> None:
    global _file_stamp
    path = os.environ.get(FILE_ENV)
    if not path:
        return
    try:
        st = os.stat(path)
        stamp = (st.st_mtime, st.st_size)
    except FileNotFoundError:
        stamp = None
    if stamp == _file_stamp:
        return
    _file_stamp = stamp
    _from_file.clear()
    if stamp is None:
        return
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.split("#", 1)[0].strip()
            if line:
                name, _, action = line.partition("=")
                _from_file[name.strip()] = _parse(action.strip() or "exit")


def _should_fire(entry: list[Any]) -> bool:
    remaining = entry[1]
    if remaining is None:
        return True
    if isinstance(remaining, str):  # once:PATH -- the process that creates PATH fires, and writes its pid there
        try:
            fd = os.open(remaining[len("once:"):], os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        try:
            os.write(fd, str(os.getpid()).encode())
        finally:
            os.close(fd)
        return True
    if remaining <= 0:
        return False
    entry[1] = remaining - 1
    return True


def point(name: str, cur: Any = None, scope: tuple[str, ...] = ()) -> None:
    """The engine: fire the fault armed for ``name`` (or ``name:scope...``), if any."""
    if not _env_loaded:
        _load_env()
    _refresh_file()
    if not _armed and not _from_file:
        return
    names = [name, *(":".join([name, *scope[: i + 1]]) for i in range(len(scope)))]
    entry = next((e for n in names for e in (_armed.get(n), _from_file.get(n)) if e is not None), None)
    if entry is None or not _should_fire(entry):
        return
    action = entry[0]
    if action == "exit" and in_triggerer():
        # The triggerer runs every DAG's triggers: a commit's crash there would take them all. The
        # commit fails instead, and its task commits (and may crash) in its own process.
        raise InjectedFault(f"fault point {name}: exit, in the triggerer (raised instead)")
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
    if action.startswith("waitfor:"):
        deadline = time.monotonic() + 600
        release = action.split(":", 1)[1]
        try:
            Path(f"{release}.waiting").touch()
        except OSError:
            pass  # a release file somewhere this process may not write: nobody is told
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.5)
        return
    if action.startswith("pause:"):
        time.sleep(float(action.split(":", 1)[1]))
        return
    raise ValueError(f"unknown fault action {action!r} at {name}: use exit, terminate, raise, pause:S or waitfor:PATH")


@contextmanager
def inject(name: str, action: str) -> Iterator[None]:
    """Arm a fault in this process for the duration of a block."""
    if not _env_loaded:
        _load_env()
    points.install(point)
    _arm(name, action)
    try:
        yield
    finally:
        _armed.pop(name, None)


def in_triggerer() -> bool:
    """Whether this process is Airflow's triggerer (``airflow triggerer``: its supervisor, or the
    trigger runner it forks)."""
    return "triggerer" in sys.argv[1:3]


def child_env(env: dict[str, str] | None = None, **armed: str) -> dict[str, str]:
    """The environment of a child process with this engine installed at its start-up: ``env``
    (default: this process's) plus the engine's module on ``PYTHONPATH``; ``armed`` may set
    ``faults`` (:data:`ENV`) and ``faults_file`` (:data:`FILE_ENV`)."""
    out = dict(os.environ if env is None else env)
    out[points.ENGINE_ENV] = __name__
    path = out.get("PYTHONPATH", os.environ.get("PYTHONPATH"))
    if str(ROOT) not in (path or "").split(os.pathsep):
        out["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), path]))
    if "faults" in armed:
        out[ENV] = armed["faults"]
    if "faults_file" in armed:
        out[FILE_ENV] = armed["faults_file"]
    return out
