"""Where a section's CPU went, by process role: Airflow's scheduler, its task processes, the
triggerer, the dag-processor, the api-server, PostgreSQL, Spark (JVMs), this benchmark, the rest.

Two snapshots of every process's own and reaped children's CPU time. A process alive at both
counts its difference; one that started in between counts whole; one that ended in between
was reaped by its parent, whose children's time then holds its whole life, so the part it had
used before the first snapshot is taken back from the parent's children's time -- never below
nothing: a child reaped without accounting (SIGCHLD ignored) or by another reaper after its
parent died must not eat its parent's own time, nor a whole role's (the other lanes of the
suite run beside this on one machine). A task process is a fork of a LocalExecutor worker,
which reaps it: tasks are the workers' role.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import psutil

#: The roles, in the order a report lists them.
ROLES = ("scheduler", "tasks", "triggerer", "dag-processor", "api-server", "postgres", "spark", "benchmark", "other")


def role(proc: psutil.Process) -> str:
    """The role of one process, by its command line (Airflow names its forks by role)."""
    try:
        cmd = " ".join(proc.cmdline()) or proc.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return "other"
    if proc.pid == os.getpid():
        return "benchmark"
    if "airflow worker" in cmd:
        return "tasks"
    for name, key in (("scheduler", "airflow scheduler"), ("triggerer", "airflow triggerer"),
                      ("dag-processor", "airflow dag-processor"), ("api-server", "api_server"),
                      ("api-server", "api-server")):
        if key in cmd:
            return name
    if cmd.startswith("postgres") or "/bin/postgres " in cmd:
        return "postgres"
    if "java" in proc.name():
        return "spark"
    return "other"


@dataclass
class _Seen:
    role: str
    ppid: int
    own: float  # CPU-seconds
    children: float  # of its reaped children, CPU-seconds

    @property
    def cpu(self) -> float:
        return self.own + self.children


def _read(proc: psutil.Process, seen: dict[tuple[int, float], _Seen]) -> None:
    try:
        with proc.oneshot():
            t = proc.cpu_times()
            seen[(proc.pid, proc.create_time())] = _Seen(role(proc), proc.ppid(), t.user + t.system,
                                                         t.children_user + t.children_system)
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        pass


def snapshot(self_first: bool) -> dict[tuple[int, float], _Seen]:
    """Every process now, by (pid, start time): its role, parent and CPU-seconds so far.

    This process is read last in the opening snapshot and first in the closing one, so the
    time spent walking every other process (a large share on a busy machine) is not the
    benchmark's.
    """
    seen: dict[tuple[int, float], _Seen] = {}
    me = psutil.Process()
    if self_first:
        _read(me, seen)
    for proc in psutil.process_iter():
        if proc.pid != me.pid:
            _read(proc, seen)
    if not self_first:
        _read(me, seen)
    return seen


@dataclass
class RoleCpu:
    """CPU-seconds by role between enter and exit: ``with RoleCpu() as cpu: ...; cpu.by_role``."""

    by_role: dict[str, float] = field(default_factory=dict)

    def __enter__(self) -> RoleCpu:
        self._start = snapshot(self_first=False)
        return self

    def __exit__(self, *exc: object) -> None:
        end = snapshot(self_first=True)
        gone_by_parent: dict[int, float] = {}  # the life so far of each parent's children that ended
        for key, gone in self._start.items():
            if key not in end:
                gone_by_parent[gone.ppid] = gone_by_parent.get(gone.ppid, 0.0) + gone.cpu
        by_role = dict.fromkeys(ROLES, 0.0)
        for key, now in end.items():
            was = self._start.get(key)
            own, children = (now.own - was.own, now.children - was.children) if was else (now.own, now.children)
            by_role[now.role] += max(own, 0.0) + max(children - gone_by_parent.get(key[0], 0.0), 0.0)
        self.by_role = by_role

    @property
    def total(self) -> float:
        return sum(self.by_role.values())

    def text(self, per: int = 1) -> str:
        """The roles that used any CPU, largest first, each divided by ``per``."""
        parts = sorted(((v / per, r) for r, v in self.by_role.items() if v / per >= 0.05), reverse=True)
        return ", ".join(f"{r} {v:.2f}" for v, r in parts)
